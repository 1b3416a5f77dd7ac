"""Fixed per-head decays (retention) in mhla_forward and mhla_generate.

Head h with decay gamma_h reads S_r = sum_(t <= r) gamma_h**(r - t) x_t x_t^T at
the readout position r, i.e. S_r = gamma_h S_(r-1) + x_r x_r^T.  The reference
below runs that recurrence with Python loops over samples, positions, heads and
tokens.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_linattn import mhla_forward, mhla_generate


def loop_forward(X, lengths, V, Q, decays, readout="last"):
    """Outputs and the size of their terms, by the recurrence S <- gamma S + x x^T.

    The size replaces every factor by its absolute value: a bound on the
    magnitude of the terms that the output sums.
    """
    X = np.asarray(X, dtype=np.float64)
    n_samples, n_tokens, d = X.shape
    n_heads, d_out = V.shape[:2]
    decays = np.broadcast_to(np.asarray(decays, dtype=np.float64), (n_heads,))

    def at(i, r):
        y, size = np.zeros(d_out), np.zeros(d_out)
        for h in range(n_heads):
            S, S_abs = np.zeros((d, d)), np.zeros((d, d))
            for t in range(r + 1):
                x = X[i, t]
                S = decays[h] * S + np.outer(x, x)
                S_abs = decays[h] * S_abs + np.abs(np.outer(x, x))
            y += V[h] @ S @ Q[h] @ X[i, r]
            size += np.abs(V[h]) @ S_abs @ np.abs(Q[h]) @ np.abs(X[i, r])
        return y, size

    if readout == "last":
        pairs = [at(i, int(lengths[i]) - 1) for i in range(n_samples)]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    y = np.full((n_samples, n_tokens, d_out), np.nan)
    size = np.full((n_samples, n_tokens, d_out), np.nan)
    for i in range(n_samples):
        for r in range(int(lengths[i])):
            y[i, r], size[i, r] = at(i, r)
    return y, size


def assert_close_to_terms(y, ref, size, rtol=1e-12, atol=0.0):
    """``|y - ref| <= rtol * size + atol`` elementwise, NaN exactly where ref is NaN."""
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    real = ~np.isnan(ref)
    err = np.abs(y[real] - ref[real])
    bound = rtol * size[real] + atol
    assert np.all(err <= bound), f"worst error / bound: {np.max(err / bound)}"


def random_problem(rng, n_samples, n_tokens, d, n_heads, d_out):
    X = rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(1, n_tokens + 1, size=n_samples)
    V = rng.normal(size=(n_heads, d_out, d))
    Q = rng.normal(size=(n_heads, d, d))
    return X, lengths, V, Q


def nan_padded(X, lengths):
    X = X.copy()
    X[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = np.nan
    return X


decay_values = st.one_of(st.sampled_from([1.0, 1e-3, 0.5, 0.999]),
                         st.floats(1e-3, 1.0, allow_nan=False))


@st.composite
def problems(draw):
    n_heads = draw(st.integers(1, 4))
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 4)))
    d_out = draw(st.integers(1, 3))
    if draw(st.booleans()):
        decays = draw(decay_values)
    else:
        decays = draw(st.lists(decay_values, min_size=n_heads, max_size=n_heads))
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, n_heads, d_out, decays, seed


@settings(max_examples=40)
@given(problem=problems(), readout=st.sampled_from(["last", "all"]),
       dtype=st.sampled_from([np.float64, np.float32]), explicit=st.booleans(),
       power=st.integers(-100, 100))
def test_forward_matches_loop_reference(problem, readout, dtype, explicit, power):
    (n_samples, n_tokens, d), n_heads, d_out, decays, seed = problem
    rng = np.random.default_rng(seed)
    X0, lengths, V, Q = random_problem(rng, n_samples, n_tokens, d, n_heads, d_out)
    # Some exact zeros: zero tokens and zero coordinates are still steps.
    X0[rng.random(X0.shape) < 0.1] = 0.0
    X0 = X0.astype(dtype)
    # float32 holds 10**+-30 (and its cube is a float64): scale by a power of
    # ten there, and check the float32 input's own outputs.
    power = power if dtype == np.float64 else power % 61 - 30
    X = (X0 * 10.0**power).astype(dtype)
    ref, size = loop_forward(X0, lengths, V, Q, decays, readout)
    if explicit:
        # Padded positions hold anything finite; lengths say they are padding.
        garbage = np.where(np.isnan(nan_padded(X, lengths)), 1e30, X).astype(dtype)
        y = mhla_forward(garbage, V, Q, lengths, readout=readout, decays=decays)
    else:
        y = mhla_forward(nan_padded(X, lengths), V, Q, readout=readout, decays=decays)
    # Back to the scale of X0; float32 entries scaled by 10**power are exact
    # only to float32 rounding, hence the looser tolerance there.
    cube = np.float64(10.0**power) ** 3
    if dtype == np.float32:
        ref, size = loop_forward(X.astype(np.float64) / 10.0**power, lengths, V, Q,
                                 decays, readout)
    with np.errstate(under="ignore"):
        atol = 8 * 2.0**-1074 / cube  # outputs that are subnormal floats
    assert_close_to_terms(y / cube, ref, size, rtol=1e-11, atol=atol)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("n_heads, d", [(3, 2), (1, 4)])  # running moments; masked scores
def test_forward_both_paths_with_padding(readout, n_heads, d):
    rng = np.random.default_rng(0)
    X, _, V, Q = random_problem(rng, 5, 6, d, n_heads, 2)
    lengths = np.array([6, 1, 3, 6, 2])
    decays = np.linspace(0.3, 1.0, n_heads)
    ref, size = loop_forward(X, lengths, V, Q, decays, readout)
    for y in (mhla_forward(nan_padded(X, lengths), V, Q, readout=readout, decays=decays),
              mhla_forward(X, V, Q, lengths, readout=readout, decays=decays)):
        assert_close_to_terms(y, ref, size)
    # The decays change the outputs (a check that they are read at all).
    plain = mhla_forward(X, V, Q, lengths, readout=readout)
    assert not np.allclose(plain[~np.isnan(plain)], y[~np.isnan(y)])


def test_forward_coordinates_in_very_different_units():
    # Coordinate scales 2**+-200 apart: the path that rescales each coordinate
    # and the heads in those units.
    rng = np.random.default_rng(1)
    X0, lengths, V, Q = random_problem(rng, 4, 5, 2, 3, 2)
    decays = [0.2, 1.0, 0.7]
    units = np.array([2.0**200, 2.0**-200])
    X = X0 * units
    # The same function of X0 with the units moved into the heads.
    V_u, Q_u = V * units, units[:, None] * Q * units[None, :]
    for readout in ("last", "all"):
        ref, size = loop_forward(X0, lengths, V_u, Q_u, decays, readout)
        y = mhla_forward(X, V, Q, lengths, readout=readout, decays=decays)
        assert_close_to_terms(y, ref, size)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("n_heads, d", [(3, 2), (1, 4)])
def test_no_decay_is_todays_forward_exactly(readout, n_heads, d):
    rng = np.random.default_rng(2)
    X, lengths, V, Q = random_problem(rng, 6, 5, d, n_heads, 2)
    X = nan_padded(X, lengths)
    today = mhla_forward(X, V, Q, readout=readout)
    for decays in (None, 1.0, 1, np.ones(n_heads), [1.0] * n_heads):
        np.testing.assert_array_equal(mhla_forward(X, V, Q, readout=readout, decays=decays),
                                      today)


def test_tiny_decays_underflow_to_zero_without_nan():
    # gamma**k below every float64: the far past counts as zero, no NaN.
    rng = np.random.default_rng(3)
    X, _, V, Q = random_problem(rng, 2, 400, 2, 2, 1)
    lengths = np.array([400, 250])
    for readout in ("last", "all"):
        y = mhla_forward(X, V, Q, lengths, readout=readout, decays=[1e-3, 1e-300])
        real = ~np.isnan(y)
        assert np.all(np.isfinite(y[real]))
        if readout == "all":
            np.testing.assert_array_equal(real[..., 0], np.arange(400) < lengths[:, None])
    # Only the last few tokens matter for such decays.
    y = mhla_forward(X, V, Q, lengths, decays=[1e-3, 1e-300])
    tail = [X[0, 380:400], X[1, 230:250]]
    np.testing.assert_allclose(y, mhla_forward(tail, V, Q, decays=[1e-3, 1e-300]),
                               rtol=1e-13)


@settings(max_examples=25)
@given(problem=problems(), explicit=st.booleans())
def test_single_decay_is_plain_forward_on_rescaled_tokens(problem, explicit):
    (n_samples, n_tokens, d), n_heads, d_out, decays, seed = problem
    gamma = float(np.atleast_1d(decays)[0])
    rng = np.random.default_rng(seed)
    X, lengths, V, Q = random_problem(rng, n_samples, n_tokens, d, n_heads, d_out)
    # Token t weighs gamma**((n - 1 - t) / 2) in each of the two factors of
    # x_t x_t^T; the last token keeps weight 1.
    lags = np.maximum(lengths[:, None] - 1 - np.arange(n_tokens)[None, :], 0)
    rescaled = X * gamma ** (lags / 2.0)[:, :, None]
    plain = mhla_forward(rescaled, V, Q, lengths)
    args = (X, V, Q, lengths) if explicit else (nan_padded(X, lengths), V, Q)
    y = mhla_forward(*args, decays=gamma)
    _, size = loop_forward(X, lengths, V, Q, gamma)
    np.testing.assert_array_less(np.abs(y - plain), 1e-12 * size + 1e-300)


def generate_by_forward(prompts, V, Q, n_steps, decays, rounding=None, intercept=0.0,
                        skip=None):
    """Each step: mhla_forward of the sequence so far, then append (one prompt at a time)."""
    out = []
    for seq in prompts:
        seq = [row for row in seq]
        for _ in range(n_steps):
            y = mhla_forward(np.array(seq)[None], V, Q, decays=decays)[0] + intercept
            if skip is not None:
                y = y + skip @ seq[-1]
            if rounding is not None:
                y = rounding[np.argmin(((rounding - y) ** 2).sum(axis=1))]
            seq.append(y)
        out.append(np.array(seq))
    return out


def generated(seqs, lengths, n_steps):
    return [s[: lengths[i] + n_steps] for i, s in enumerate(seqs)]


@pytest.mark.parametrize("decays", [0.6, [0.3, 1.0, 0.9]])
def test_generate_equals_repeated_forward(decays):
    rng = np.random.default_rng(4)
    d, n_heads, n_steps = 3, 3, 4
    V = 0.3 * rng.normal(size=(n_heads, d, d))
    Q = 0.3 * rng.normal(size=(n_heads, d, d))
    X = rng.normal(size=(3, 5, d))
    lengths = np.array([5, 2, 1])
    prompts = [X[i, : lengths[i]] for i in range(3)]
    intercept, skip = rng.normal(size=d), 0.1 * rng.normal(size=(d, d))
    out = mhla_generate(nan_padded(X, lengths), V, Q, n_steps, decays=decays,
                        intercept=intercept, skip_coef=skip)
    expected = generate_by_forward(prompts, V, Q, n_steps, decays, intercept=intercept,
                                   skip=skip)
    for got, want in zip(generated(out, lengths, n_steps), expected):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert np.all(np.isnan(out[1, lengths[1] + n_steps:]))
    # Explicit lengths read the same prompts.
    np.testing.assert_array_equal(
        mhla_generate(X, V, Q, n_steps, lengths=lengths, decays=decays, intercept=intercept,
                      skip_coef=skip), out)


def test_generate_with_rounding_equals_repeated_forward():
    rng = np.random.default_rng(5)
    d, n_heads, n_steps = 3, 2, 6
    table = rng.normal(size=(7, d))
    V = rng.normal(size=(n_heads, d, d))
    Q = rng.normal(size=(n_heads, d, d))
    prompts = table[rng.integers(0, 7, size=(4, 3))]
    lengths = np.array([3, 3, 1, 2])
    decays = [0.5, 0.9]
    out = mhla_generate(nan_padded(prompts, lengths), V, Q, n_steps, rounding=table,
                        decays=decays)
    expected = generate_by_forward([prompts[i, : lengths[i]] for i in range(4)], V, Q,
                                   n_steps, decays, rounding=table)
    for got, want in zip(generated(out, lengths, n_steps), expected):
        np.testing.assert_array_equal(got, want)  # rows of the table, exactly
    # A callable rounding is applied to the decayed outputs as well.
    snap = lambda Y: table[np.argmin(((Y[:, None] - table[None]) ** 2).sum(axis=2), axis=1)]
    np.testing.assert_array_equal(
        mhla_generate(nan_padded(prompts, lengths), V, Q, n_steps, rounding=snap,
                      decays=decays), out)


def test_generate_without_decay_is_todays_exactly():
    rng = np.random.default_rng(6)
    d, n_heads = 3, 2
    V = 0.3 * rng.normal(size=(n_heads, d, d))
    Q = 0.3 * rng.normal(size=(n_heads, d, d))
    X = nan_padded(rng.normal(size=(3, 4, d)), np.array([4, 2, 3]))
    today = mhla_generate(X, V, Q, 3)
    for decays in (None, 1.0, [1.0, 1.0]):
        np.testing.assert_array_equal(mhla_generate(X, V, Q, 3, decays=decays), today)


BAD_DECAYS = [
    ([0.5, 0.5, 0.5], ValueError, "shape"),
    ([[0.5, 0.5]], ValueError, "shape"),
    (0.0, ValueError, r"\(0"),
    ([0.5, 0.0], ValueError, r"\(0"),
    (1.5, ValueError, r"\(0"),
    ([1.0, 1.0 + 1e-12], ValueError, r"\(0"),
    (-0.5, ValueError, r"\(0"),
    (np.nan, ValueError, r"\(0"),
    ([np.nan, 0.5], ValueError, r"\(0"),
    ("0.5", TypeError, "real number"),
    (["a", "b"], TypeError, "real number"),
]


@pytest.mark.parametrize("decays, error, what", BAD_DECAYS)
def test_bad_decays_are_refused(decays, error, what):
    V, Q = np.ones((2, 2, 2)), np.ones((2, 2, 2))
    X = np.ones((1, 3, 2))
    calls = [lambda: mhla_forward(X, V, Q, decays=decays),
             lambda: mhla_forward(X, V, Q, readout="all", decays=decays),
             lambda: mhla_generate(X, V, Q, 1, decays=decays)]
    for call in calls:
        with pytest.raises(error, match="decays") as info:
            call()
        assert info.match(what)
