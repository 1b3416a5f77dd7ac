"""Head compression: compress_heads recovers the head count of exact generators.

A generator is drawn as in ``benchmarks/compression_failures.py``:
``rng = np.random.default_rng(seed)``, then V of shape (H, d_out, d) and Q of
shape (H, d, d) with standard normal entries, in that order.  Its exact
coefficients have an H-head decomposition with zero residual, so a residual
above the tolerance is always the search's fault.

Outputs are checked with the loop reference of tests/reference.py, never with
the package's own forward pass.
"""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from reference import ref_coefficients, ref_forward
from sklearn_linattn import (
    LinearAttentionRegressor,
    attention_coefficients,
    compress_heads,
    heads_from_coefficients,
    mhla_forward,
    same_function,
)
from sklearn_linattn.datasets import make_random_mhla

TOL = 1e-10


def generator(seed, d, n_heads, d_out):
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((n_heads, d_out, d))
    Q = rng.standard_normal((n_heads, d, d))
    return V, Q


def relative_residual(V, Q, coef):
    """||p(V, Q) - coef|| / ||coef|| with the reference coefficient map."""
    return np.linalg.norm(ref_coefficients(V, Q) - coef) / np.linalg.norm(coef)


def assert_recovers(seed, d, n_heads, d_out):
    V, Q = generator(seed, d, n_heads, d_out)
    coef = attention_coefficients(V, Q)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        V2, Q2, residual = compress_heads(coef, d, n_heads, random_state=0)
    assert V2.shape == (n_heads, d_out, d) and Q2.shape == (n_heads, d, d)
    # The returned residual is the true one, and it is at rounding level.
    true = relative_residual(V2, Q2, coef)
    assert residual <= TOL and true <= TOL, (seed, residual, true)
    assert abs(true - residual) <= 1e-12
    assert same_function(V, Q, V2, Q2, rtol=1e-9)
    return V, Q, V2, Q2


# --------------------------------------------------------------------------
# Exact generators
# --------------------------------------------------------------------------

# compress_heads(coef, 4, 3, random_state=0) on these d_out = 1 generators
# stopped at a residual from 4.5e-9 (seed 27) to 0.014 (seed 24) with
# alternating least squares (7 of seeds 0..29).
FAILING_D4_H3 = [1, 4, 8, 14, 18, 24, 27]
# More misses of alternating least squares (random_state=0), as
# (seed, d, n_heads, d_out): benchmarks/compression_failures.py found them.
FAILING_OTHERS = [
    (125, 3, 1, 1),  # even one head: residual 0.042
    (29, 3, 2, 1), (51, 3, 2, 1),
    (256, 3, 2, 3), (430, 3, 2, 3),  # residual 0.26
    (3, 3, 3, 3), (16, 3, 3, 3),
    (11, 4, 2, 1),
    (4, 4, 4, 4), (171, 4, 4, 4),
    (13, 5, 2, 1),
    (45, 5, 3, 1),
    (93, 6, 3, 1), (49, 6, 4, 1), (77, 7, 3, 1),
]


@pytest.mark.parametrize("seed", FAILING_D4_H3)
def test_known_failing_seeds_d4_h3(seed):
    V, Q, V2, Q2 = assert_recovers(seed, 4, 3, 1)
    # Same outputs as the generator on longer, larger sequences than any
    # training data would have.
    X = np.random.default_rng(seed).normal(size=(20, 40, 4)) * 3.0
    lengths = [40] * 20
    y = ref_forward(X, lengths, V, Q)
    y2 = ref_forward(X, lengths, V2, Q2)
    assert np.max(np.abs(y2 - y)) <= 1e-9 * np.max(np.abs(y))


@pytest.mark.parametrize("seed, d, n_heads, d_out", FAILING_OTHERS)
def test_other_known_failing_seeds(seed, d, n_heads, d_out):
    assert_recovers(seed, d, n_heads, d_out)


# The hardest generators found for random starts (seed 424 at d = d_out =
# n_heads = 3: 2 of 64 random starts reach the global minimum) and for the
# one-output search ((5, 4, 1) lost half of its seeds to local minima).
@pytest.mark.parametrize(
    "seed, d, n_heads, d_out",
    [(424, 3, 3, 3), (32, 3, 3, 3), (59, 4, 4, 4), (0, 5, 4, 1), (1, 5, 4, 1), (3, 5, 4, 1)],
)
def test_hard_generators(seed, d, n_heads, d_out):
    assert_recovers(seed, d, n_heads, d_out)


CELLS = [
    (d, n_heads, d_out)
    for d in range(3, 9)
    for n_heads in range(1, min(d, 4) + 1)
    for d_out in sorted({1, d})
]


@pytest.mark.parametrize("d, n_heads, d_out", CELLS)
def test_random_generators(d, n_heads, d_out):
    """Every (d, H, d_out) cell of the benchmark grid, on seeds it does not use
    (benchmarks/compression_failures.py draws seeds 0..499)."""
    seeds = range(1000, 1150) if d <= 5 else range(1000, 1030)
    missed = {}
    for seed in seeds:
        V, Q = generator(seed, d, n_heads, d_out)
        coef = attention_coefficients(V, Q)
        V2, Q2, residual = compress_heads(coef, d, n_heads, random_state=seed, warn=False)
        if residual > TOL or relative_residual(V2, Q2, coef) > TOL:
            missed[seed] = residual
    assert not missed, f"residual above {TOL} for seeds {missed}"


@pytest.mark.parametrize("random_state", [0, 1, None])
def test_estimator_recovers_three_head_generator(random_state):
    """The reproducer: n_heads=3 on noise-free data of a 3-head generator.

    With alternating least squares and random_state=0 the model stopped at a
    compression residual of 2e-3, an out-of-distribution error of 5e-3.
    """
    X, y, params = make_random_mhla(
        n_samples=400, n_tokens=10, d=4, n_heads=3, random_state=8, return_params=True
    )
    model = LinearAttentionRegressor(n_heads=3, random_state=random_state).fit(X, y)
    assert model.n_heads_ == 3
    assert model.compression_residual_ <= TOL
    rng = np.random.default_rng(5)
    # Longer sequences and larger tokens than in training (N(0, 1/10) there).
    for n_tokens, scale in [(30, 1 / np.sqrt(10)), (60, 1.0), (10, 10.0)]:
        Xo = rng.normal(size=(50, n_tokens, 4)) * scale
        expected = ref_forward(Xo, [n_tokens] * 50, params["V"], params["Q"])[:, 0]
        error = np.linalg.norm(model.predict(Xo) - expected) / np.linalg.norm(expected)
        assert error <= 1e-9, (n_tokens, scale, error)


def test_exact_at_extreme_scales():
    """The search works at unit scale: coefficients of size 1e-250 or 1e250
    (a power of two or not) are compressed as well as unit ones."""
    V, Q = generator(24, 4, 3, 1)
    coef = attention_coefficients(V, Q)
    for c in (1e-250, 2.0**-700, 1e250):
        V2, Q2, residual = compress_heads(coef * c, 4, 3, random_state=0)
        assert residual <= TOL
        assert np.all(np.isfinite(V2)) and np.all(np.isfinite(Q2))
        # Rescale the heads before comparing: their products are about c.
        k = np.sqrt(c)
        assert relative_residual(V2 / k, Q2 / k, coef) <= TOL


def test_enough_heads_returns_the_svd_heads_padded_with_zeros():
    V, Q = generator(0, 3, 1, 1)  # comes back as 3 heads from the SVD
    coef = attention_coefficients(V, Q)
    assert heads_from_coefficients(coef, 3)[0].shape[0] == 3
    V2, Q2, residual = compress_heads(coef, 3, 5)
    assert V2.shape == (5, 1, 3) and Q2.shape == (5, 3, 3)
    assert residual <= 1e-14
    assert not np.any(V2[3:]) and not np.any(Q2[3:])


def test_zero_coefficients():
    V, Q, residual = compress_heads(np.zeros((2, 18)), 3, 2)
    assert V.shape == (2, 2, 3) and Q.shape == (2, 3, 3)
    assert residual == 0.0 and not np.any(V) and not np.any(Q)


def test_same_random_state_same_result():
    V, Q = generator(3, 3, 3, 3)
    coef = attention_coefficients(V, Q) + 1e-3 * np.random.default_rng(0).normal(size=(3, 18))
    a = compress_heads(coef, 3, 3, random_state=7, n_init=20, warn=False)
    b = compress_heads(coef, 3, 3, random_state=7, n_init=20, warn=False)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]


# --------------------------------------------------------------------------
# Noisy coefficients: the best approximation, the early stop at tol
# --------------------------------------------------------------------------


def _noisy(seed=0, d=4, n_heads=2, d_out=1, noise=1e-3):
    V, Q = generator(seed, d, n_heads, d_out)
    coef = attention_coefficients(V, Q)
    rng = np.random.default_rng(seed + 1)
    E = rng.normal(size=coef.shape)
    return coef + noise * np.linalg.norm(coef) * E / np.linalg.norm(E), coef


def test_noisy_coefficients_residual_is_at_most_the_noise():
    coef, exact = _noisy()
    V2, Q2, residual = compress_heads(coef, 4, 2, random_state=0, warn=False)
    assert residual == pytest.approx(relative_residual(V2, Q2, coef), rel=1e-9)
    # The generator itself is a 2-head model at the noise level (1e-3): the
    # optimum is no worse, and it removes the noise outside the model's
    # tangent space, so it is closer to the generator than the data is.
    assert residual <= 1e-3
    assert np.linalg.norm(ref_coefficients(V2, Q2) - exact) < np.linalg.norm(coef - exact)


def test_tol_stops_the_search_early():
    coef, _ = _noisy(seed=3, d=3, n_heads=3, d_out=3)
    _, _, best = compress_heads(coef, 3, 3, random_state=0, n_init=40, warn=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        _, _, residual = compress_heads(coef, 3, 3, random_state=0, tol=2 * best)
    assert residual <= 2 * best


# --------------------------------------------------------------------------
# The warning
# --------------------------------------------------------------------------


def _two_head_coef():
    V, Q = generator(0, 4, 2, 1)
    return attention_coefficients(V, Q)


def test_warning_when_the_residual_stays_above_tol():
    with pytest.warns(ConvergenceWarning) as record:
        _, _, residual = compress_heads(_two_head_coef(), 4, 1, random_state=0)
    assert residual > 0.1
    message = str(record[0].message)
    assert "n_heads=1" in message and f"{residual:.3g}" in message
    # Singular for one head: never "1 heads".
    assert "1 head may not be enough" in message
    assert "1 heads" not in message


def test_warning_grammar_plural():
    V, Q = generator(0, 4, 3, 1)
    with pytest.warns(ConvergenceWarning, match="2 heads may not be enough"):
        compress_heads(attention_coefficients(V, Q), 4, 2, random_state=0, n_init=3)


def test_warn_false_suppresses_the_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, _, residual = compress_heads(_two_head_coef(), 4, 1, random_state=0, warn=False)
    assert residual > 0.1


# --------------------------------------------------------------------------
# Validation: ValueError / TypeError naming the argument
# --------------------------------------------------------------------------

COEF = _two_head_coef()


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        ({"n_heads": 0}, ValueError, r"n_heads must be an integer >= 1; got 0"),
        ({"n_heads": -1}, ValueError, r"n_heads must be an integer >= 1; got -1"),
        ({"n_heads": 1.5}, TypeError, r"n_heads must be an integer >= 1; got 1.5 of type float"),
        ({"n_heads": "2"}, TypeError, r"n_heads must be an integer >= 1; got '2' of type str"),
        ({"n_heads": True}, TypeError, r"n_heads must be an integer"),
        ({"d": 3}, ValueError,
         r"coef and d do not match: d=3 needs psi = d\*d\*\(d\+1\)/2 = 18 columns, but coef "
         r"has shape \(1, 40\) \(coef fits d=4\)"),
        ({"d": 0}, ValueError, r"d must be an integer >= 1; got 0"),
        ({"d": 4.0}, TypeError, r"d must be an integer"),
        ({"tol": -1.0}, ValueError, r"tol must be a real number >= 0.0; got -1.0"),
        ({"tol": np.nan}, ValueError, r"tol must be a real number >= 0.0; got nan"),
        ({"tol": "small"}, TypeError, r"tol must be a real number"),
        ({"max_iter": 0}, ValueError, r"max_iter must be an integer >= 1; got 0"),
        ({"n_init": 0}, ValueError, r"n_init must be an integer >= 1; got 0"),
        ({"n_init": "many"}, ValueError, r"n_init must be 'auto' or a positive integer; got 'many'"),
        ({"n_init": 2.5}, TypeError, r"n_init must be an integer"),
        ({"random_state": "abc"}, TypeError, r"random_state must be None, an int in "
                                             r"\[0, 2\*\*32 - 1\].* got 'abc' of type str"),
        ({"warn": "yes"}, TypeError, r"warn must be True or False; got 'yes' of type str"),
    ],
)
def test_invalid_arguments(kwargs, exc, pattern):
    args = {"coef": COEF, "d": 4, "n_heads": 1}
    args.update(kwargs)
    coef, d, n_heads = args.pop("coef"), args.pop("d"), args.pop("n_heads")
    with pytest.raises(exc, match=pattern):
        compress_heads(coef, d, n_heads, **args)


@pytest.mark.parametrize(
    "coef, exc, pattern",
    [
        (np.full((1, 40), np.nan), ValueError, r"coef must be finite; got nan at coef\[0, 0\]"),
        (np.where(np.arange(40) == 7, np.inf, COEF), ValueError,
         r"coef must be finite; got inf at coef\[0, 7\]"),
        (COEF + 1j, ValueError, r"Complex data not supported: coef must hold real numbers"),
        (COEF.astype(str), TypeError, r"coef must hold real numbers \(a numeric dtype\)"),
        (COEF[0], ValueError, r"coef must be a 2-D array of shape \(d_out, psi\).*got shape \(40,\)"),
        (COEF[None], ValueError, r"coef must be a 2-D array.*got shape \(1, 1, 40\)"),
        (np.zeros((0, 40)), ValueError, r"coef must be a 2-D array.*d_out >= 1.*got shape \(0, 40\)"),
        (np.ones((1, 17)), ValueError, r"coef and d do not match: d=4 needs psi = .* = 40 columns, "
                                       r"but coef has shape \(1, 17\)\."),
    ],
)
def test_invalid_coefficients(coef, exc, pattern):
    with pytest.raises(exc, match=pattern):
        compress_heads(coef, 4, 1)


def test_heads_from_coefficients_validates_like_compress_heads():
    with pytest.raises(ValueError, match=r"coef must be finite"):
        heads_from_coefficients(np.full((1, 40), np.nan), 4)
    with pytest.raises(ValueError, match=r"coef and d do not match"):
        heads_from_coefficients(COEF, 3)
    with pytest.raises(ValueError, match=r"Complex data not supported: coef"):
        heads_from_coefficients(COEF * 1j, 4)
    with pytest.raises(ValueError, match=r"rtol must be None or a real number >= 0.0; got -1"):
        heads_from_coefficients(COEF, 4, rtol=-1.0)


def test_compressed_model_predicts_like_the_generator_at_any_length():
    """The compressed heads are used for prediction with mhla_forward."""
    V, Q, V2, Q2 = assert_recovers(14, 4, 3, 1)
    X = np.random.default_rng(0).normal(size=(10, 100, 4))
    expected = ref_forward(X, [100] * 10, V, Q)
    got = mhla_forward(X, V2, Q2)
    assert np.max(np.abs(got - expected)) <= 1e-9 * np.max(np.abs(expected))


@pytest.mark.parametrize("readout", ["last", "all"])
def test_cg_compression_is_judged_by_the_fit_it_changes(readout):
    """Regression: with solver="cg" (no quadratic form of Lambda_D) the judge took a lower
    bound of the explained energy, so the training risk it allowed was the whole target
    energy: the compression stopped at a relative residual of 0.11 and its two heads were
    off by 35 out of distribution, with no warning.  Exact products with the Gram matrix
    now judge it like every other solver."""
    rng = np.random.default_rng(0)
    V, Q = rng.normal(size=(2, 1, 4)), rng.normal(size=(2, 4, 4))
    X = rng.normal(size=(500, 10, 4))
    y = mhla_forward(X, V, Q, readout=readout)[..., 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = LinearAttentionRegressor(readout, solver="cg", n_heads=2,
                                         random_state=0).fit(X, y)
    assert model.certificate_ and model.compression_residual_ < 1e-6
    X_far = 2 * rng.normal(size=(5, 30, 4))
    truth = mhla_forward(X_far, V, Q, readout=readout)[..., 0]
    np.testing.assert_allclose(model.predict(X_far), truth, atol=1e-5 * np.abs(truth).max())


@pytest.mark.parametrize("terms", [dict(fit_intercept=True), dict(fit_intercept=True,
                                                                  fit_skip=True)])
def test_compression_with_terms_is_judged_by_the_fit_residual(terms):
    """Regression: with an intercept the judge took the targets' whole energy less the
    attention's as the fit's residual risk, so everything the terms explain counted as
    noise: one head of a noise-free two-head teacher raised the training error from 1e-28
    to 0.07 (13% of the targets' variance) without a warning.  The residual of the
    joint fit judges it now, as without terms."""
    X, y, params = make_random_mhla(n_samples=81, n_tokens=10, d=4, n_heads=2,
                                    random_state=5, return_params=True)
    w = np.array([0.5, -1.0, 2.0, 0.25])
    y = y + 3.0 + (X[:, -1] @ w if terms.get("fit_skip") else 0.0)
    with pytest.warns(ConvergenceWarning, match=r"n_heads=1 head raises the training error"):
        LinearAttentionRegressor(n_heads=1, random_state=0, **terms).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = LinearAttentionRegressor(n_heads=2, random_state=0, **terms).fit(X, y)
    assert model.compression_residual_ <= TOL
