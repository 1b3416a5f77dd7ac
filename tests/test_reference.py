"""The vectorised math against the slow loop references of tests/reference.py.

Inputs come from the package's own hypothesis strategies (sklearn_linattn.
testing) over shapes, NaN-padded lengths, dtypes, scales and head counts.

Tolerances.  Every comparison is relative to the *magnitude* of the quantity:
the same reference evaluated on absolute values (|X|, |V|, |Q|), i.e. the sum
of the absolute values of all the products that are added up.  A correct
floating-point evaluation differs from the exact value by at most a few
(number of terms) x eps of that magnitude; a wrong index, order or factor of
two differs by O(1) of it.  This works at every scale: the features are cubic
in X (scale c gives c**3) and the outputs are also quadratic in the weights.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, assume
from hypothesis import strategies as st

from reference import (
    ref_coefficients,
    ref_feature_names,
    ref_features,
    ref_fold,
    ref_forward,
    ref_generate,
    ref_kernel,
    ref_lengths,
    ref_linear_readout,
    ref_n_features,
    ref_prefix_features,
    ref_unfold,
)
from sklearn_linattn import LinearAttentionFeatures
from sklearn_linattn._features import (
    attention_features,
    attention_kernel,
    padded_kernel,
    feature_names,
    n_attention_features,
    pair_indices,
    prefix_features,
)
from sklearn_linattn._attention import (
    attention_coefficients,
    mhla_forward,
    mhla_generate,
    same_function,
)
from sklearn_linattn._features import fold_coefficients, unfold_coefficients
from sklearn_linattn._heads import heads_from_coefficients
from sklearn_linattn._validation import check_sequences
from sklearn_linattn.testing import mhla_parameters, sequence_batches

DTYPES = st.sampled_from([np.float64, np.float32])
# Log-uniform scales from 1e-3 to 1e3.
SCALES = st.floats(min_value=-3.0, max_value=3.0).map(lambda e: 10.0**e)
READOUTS = st.sampled_from(["last", "all"])
SEEDS = st.integers(0, 2**32 - 1)


def rtol_for(dtype):
    """Relative tolerance (w.r.t. the magnitude) for results computed in dtype."""
    return 1e-12 if np.dtype(dtype) == np.float64 else 2e-5


def assert_close(actual, expected, magnitude, rtol):
    """|actual - expected| <= rtol * magnitude elementwise; NaN where expected is NaN."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    err = np.abs(actual - expected)[~nan]
    bound = rtol * np.asarray(magnitude, dtype=np.float64)[~nan] + np.finfo(float).tiny
    worst = np.max(err / bound, initial=0.0)
    assert worst <= 1.0, f"error {worst:.3g} x the tolerance {rtol:g} x magnitude"


def zero_filled(X):
    """The package's numerical functions take zero-filled padding."""
    return np.where(np.isnan(X), 0, X).astype(X.dtype)


@st.composite
def batch_and_heads(draw, readout=READOUTS, padded=True):
    """Sequences and heads with the same d."""
    d = draw(st.integers(1, 4))
    X = draw(sequence_batches(d=d, dtype=DTYPES, scale=SCALES, max_samples=5,
                              max_length=5, padded=padded))
    V, Q = draw(mhla_parameters(d=d, scale=SCALES))
    return X, V, Q, draw(readout)


# --------------------------------------------------------------------------
# Reference sanity: the references themselves agree with the definitions.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("d", range(1, 7))
def test_reference_pair_order_is_numpy_triu(d):
    j, k = np.triu_indices(d)
    from reference import ref_pairs

    assert list(zip(j.tolist(), k.tolist())) == ref_pairs(d)
    assert ref_n_features(d) == d * d * (d + 1) // 2 == n_attention_features(d)
    assert [tuple(p) for p in zip(*pair_indices(d))] == ref_pairs(d)


def test_reference_forward_by_hand():
    # One head, d = 2: y = V sum_t x_t (x_t^T Q x_last) computed by hand.
    X = np.array([[[1.0, 0.0], [0.0, 2.0], [np.nan, np.nan]]])
    V = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    Q = np.array([[[0.0, 1.0], [1.0, 0.0]]])
    # x_last = (0, 2); scores: x_1^T Q x_last = 2, x_2^T Q x_last = 0.
    np.testing.assert_array_equal(ref_forward(X, [2], V, Q), [[2.0, 0.0]])
    H = ref_features(X, [2])  # S = diag(1, 4), x_last = (0, 2)
    np.testing.assert_array_equal(H, [[0.0, 2.0, 0.0, 0.0, 0.0, 8.0]])


# --------------------------------------------------------------------------
# Padding: lengths and zero filling.
# --------------------------------------------------------------------------


@given(X=sequence_batches(dtype=DTYPES, scale=SCALES))
def test_check_sequences_lengths_and_fill(X):
    Xf, lengths = check_sequences(X)
    assert lengths.tolist() == ref_lengths(X)
    assert Xf.dtype == X.dtype and Xf.shape == X.shape
    real = ~np.isnan(X).all(axis=2)
    np.testing.assert_array_equal(Xf[real], X[real])
    assert np.all(Xf[~real] == 0)
    Xn, lengths_n = check_sequences(X, fill_value=None)
    np.testing.assert_array_equal(Xn, X)  # NaN compare equal here
    np.testing.assert_array_equal(lengths_n, lengths)


# --------------------------------------------------------------------------
# Feature map, prefix features, kernel, names.
# --------------------------------------------------------------------------


@given(X=sequence_batches(dtype=DTYPES, scale=SCALES))
def test_attention_features_match_reference(X):
    lengths = ref_lengths(X)
    H = attention_features(zero_filled(X), np.array(lengths))
    d = X.shape[2]
    assert H.shape == (X.shape[0], d * d * (d + 1) // 2)
    assert_close(H, ref_features(X, lengths), ref_features(np.abs(X), lengths),
                 rtol_for(H.dtype))


@given(X=sequence_batches(dtype=DTYPES, scale=SCALES))
def test_linear_attention_features_transform_matches_reference(X):
    # The public transformer on NaN-padded input and on the same data as a list.
    lengths = ref_lengths(X)
    expected = ref_features(X, lengths)
    magnitude = ref_features(np.abs(X), lengths)
    H = LinearAttentionFeatures().fit(X).transform(X)
    assert H.dtype == np.float64
    assert_close(H, expected, magnitude, 1e-12)
    as_list = [X[i, : lengths[i]] for i in range(X.shape[0])]
    assert_close(LinearAttentionFeatures().fit_transform(as_list), expected, magnitude, 1e-12)


@given(X=sequence_batches(dtype=DTYPES, scale=SCALES))
def test_prefix_features_match_reference(X):
    lengths = ref_lengths(X)
    H = prefix_features(zero_filled(X), np.array(lengths))
    n_samples, n_tokens, d = X.shape
    assert H.shape == (n_samples, n_tokens, ref_n_features(d))
    assert_close(H, ref_prefix_features(X, lengths),
                 ref_prefix_features(np.abs(X), lengths), rtol_for(H.dtype))
    # The last real prefix is the whole sequence.
    last = H[np.arange(n_samples), np.array(lengths) - 1]
    assert_close(last, ref_features(X, lengths), ref_features(np.abs(X), lengths),
                 rtol_for(H.dtype))


@st.composite
def two_batches(draw):
    d = draw(st.integers(1, 4))
    dtype = draw(DTYPES)
    scale = draw(SCALES)
    X = draw(sequence_batches(d=d, dtype=dtype, scale=scale))
    Y = draw(sequence_batches(d=d, dtype=dtype, scale=scale))
    return X, Y


@given(batches=two_batches())
def test_attention_kernel_matches_reference(batches):
    X, Y = batches
    lx, ly = ref_lengths(X), ref_lengths(Y)
    K = padded_kernel(zero_filled(X), np.array(lx), zero_filled(Y), np.array(ly))
    assert K.shape == (X.shape[0], Y.shape[0])
    assert_close(K, ref_kernel(X, lx, Y, ly), ref_kernel(np.abs(X), lx, np.abs(Y), ly),
                 rtol_for(K.dtype))
    # The Gram matrix of one batch (the ``Y is X`` shortcut) is symmetric.
    Xf = zero_filled(X)
    G = padded_kernel(Xf, np.array(lx), Xf, np.array(lx))
    assert_close(G, ref_kernel(X, lx, X, lx), ref_kernel(np.abs(X), lx, np.abs(X), lx),
                 rtol_for(G.dtype))
    np.testing.assert_array_equal(G, G.T)


@pytest.mark.parametrize("d", range(1, 6))
@pytest.mark.parametrize("named", [False, True])
def test_feature_names_match_reference(d, named):
    names = [f"c{chr(97 + i)}" for i in range(d)] if named else None
    got = feature_names(d, names)
    assert list(got) == ref_feature_names(d, names)
    assert len(set(got)) == ref_n_features(d)
    model = LinearAttentionFeatures().fit(np.ones((1, 2, d)))
    assert list(model.get_feature_names_out(names)) == ref_feature_names(d, names)


# --------------------------------------------------------------------------
# Forward pass and the coefficient map.
# --------------------------------------------------------------------------


@given(data=batch_and_heads())
def test_mhla_forward_matches_reference(data):
    X, V, Q, readout = data
    lengths = ref_lengths(X)
    y = mhla_forward(zero_filled(X), V, Q, np.array(lengths), readout=readout)
    expected = ref_forward(X, lengths, V, Q, readout)
    magnitude = ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout)
    assert_close(y, expected, magnitude, 1e-12)  # NaN exactly at padded positions


@given(data=batch_and_heads(), seed=SEEDS)
def test_mhla_forward_nan_padding_and_explicit_lengths(data, seed):
    """Without lengths, NaN padding is read by the padding rule; with lengths,
    whatever the padded positions hold is ignored."""
    X, V, Q, readout = data
    lengths = ref_lengths(X)
    expected = ref_forward(X, lengths, V, Q, readout)
    magnitude = ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout)
    assert_close(mhla_forward(X, V, Q, readout=readout), expected, magnitude, 1e-12)
    garbage = np.random.default_rng(seed).standard_normal(X.shape) * 1e6
    X_garbage = np.where(np.isnan(X), garbage, X).astype(X.dtype)
    y = mhla_forward(X_garbage, V, Q, np.array(lengths), readout=readout)
    assert_close(y, expected, magnitude, 1e-12)


@given(data=batch_and_heads(readout=st.just("last"), padded=False))
def test_mhla_forward_without_lengths(data):
    X, V, Q, _ = data
    assert not np.isnan(X).any()
    lengths = [X.shape[1]] * X.shape[0]
    for readout in ("last", "all"):
        assert_close(
            mhla_forward(X, V, Q, readout=readout),
            ref_forward(X, lengths, V, Q, readout),
            ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout),
            1e-12,
        )


@given(params=mhla_parameters(d=st.integers(1, 5), d_out=st.integers(1, 4),
                              n_heads=st.integers(1, 5), scale=SCALES))
def test_attention_coefficients_match_reference(params):
    V, Q = params
    coef = attention_coefficients(V, Q)
    assert coef.shape == (V.shape[1], ref_n_features(V.shape[2]))
    assert_close(coef, ref_coefficients(V, Q), ref_coefficients(np.abs(V), np.abs(Q)), 1e-13)


@given(d=st.integers(1, 4), d_out=st.integers(1, 3), seed=SEEDS, scale=SCALES)
def test_fold_and_unfold_match_reference(d, d_out, seed, scale):
    rng = np.random.default_rng(seed)
    C = rng.standard_normal((d_out, d, d, d)) * scale
    assert_close(fold_coefficients(C), ref_fold(C), ref_fold(np.abs(C)), 1e-15)
    coef = rng.standard_normal((d_out, ref_n_features(d))) * scale
    C_sym = unfold_coefficients(coef, d)
    np.testing.assert_allclose(C_sym, ref_unfold(coef, d), rtol=1e-15, atol=0)
    np.testing.assert_allclose(fold_coefficients(C_sym), coef, rtol=1e-15, atol=0)
    # fold is what the heads' full tensor reduces to.
    V = rng.standard_normal((2, d_out, d))
    Q = rng.standard_normal((2, d, d))
    C_heads = np.zeros((d_out, d, d, d))
    for h in range(2):
        for a in range(d_out):
            for j in range(d):
                for k in range(d):
                    for l in range(d):
                        C_heads[a, j, k, l] += V[h, a, j] * Q[h, k, l]
    assert_close(fold_coefficients(C_heads), ref_coefficients(V, Q),
                 ref_coefficients(np.abs(V), np.abs(Q)), 1e-14)


@given(data=batch_and_heads())
def test_output_is_inner_product_of_coefficients_and_features(data):
    """MHLA_Theta(X)_a == <p_a(Theta), H(X)> for every length and readout."""
    X, V, Q, readout = data
    lengths = ref_lengths(X)
    feats = ref_features if readout == "last" else ref_prefix_features
    magnitude = ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout)
    expected = ref_forward(X, lengths, V, Q, readout)
    # 1. The identity itself, on the references alone (doc/theory.rst).
    via_features = ref_linear_readout(ref_coefficients(V, Q), feats(X, lengths))
    if readout == "all":
        via_features[np.isnan(expected).any(axis=-1)] = np.nan
    assert_close(via_features, expected, magnitude, 1e-12)
    # 2. The same identity for the vectorised functions.
    Xf = zero_filled(X).astype(np.float64)
    coef = attention_coefficients(V, Q)
    if readout == "last":
        lin = attention_features(Xf, np.array(lengths)) @ coef.T
    else:
        lin = prefix_features(Xf, np.array(lengths)) @ coef.T
        lin[np.isnan(expected).any(axis=-1)] = np.nan
    assert_close(lin, expected, magnitude, 1e-12)
    assert_close(mhla_forward(Xf, V, Q, np.array(lengths), readout=readout), lin,
                 magnitude, 1e-12)


# --------------------------------------------------------------------------
# Heads from coefficients, and the equivalence test.
# --------------------------------------------------------------------------


def _output_bound(coef, X, lengths, readout, rtol):
    """rtol * ||coef_a|| * ||H(row)||: the error of y from a coefficient error."""
    feats = ref_features if readout == "last" else ref_prefix_features
    H = feats(X, lengths)
    norms = np.linalg.norm(H, axis=-1)[..., None] * np.linalg.norm(coef, axis=1)
    return rtol * norms


@given(data=batch_and_heads())
def test_heads_from_coefficients_compute_the_same_function(data):
    X, V, Q, readout = data
    d_out, d = V.shape[1], V.shape[2]
    coef = attention_coefficients(V, Q)
    V2, Q2 = heads_from_coefficients(coef, d)
    assert V2.ndim == 3 and V2.shape[1:] == (d_out, d) and Q2.shape[1:] == (d, d)
    assert 1 <= V2.shape[0] == Q2.shape[0] <= min(d_out * d, d * d)
    np.testing.assert_allclose(
        np.linalg.norm(ref_coefficients(V2, Q2) - coef), 0,
        atol=1e-12 * np.linalg.norm(coef),
    )
    assert same_function(V, Q, V2, Q2)
    lengths = ref_lengths(X)
    y = ref_forward(X, lengths, V, Q, readout)
    y2 = ref_forward(X, lengths, V2, Q2, readout)
    assert_close(y2, y, _output_bound(coef, X, lengths, readout, 1e-10), 1.0)


@st.composite
def two_models(draw):
    d = draw(st.integers(1, 4))
    d_out = draw(st.integers(1, 3))
    scale = draw(SCALES)
    A = draw(mhla_parameters(d=d, d_out=d_out, scale=scale))
    B = draw(mhla_parameters(d=d, d_out=d_out, scale=scale))
    X = draw(sequence_batches(d=d, min_samples=3, max_length=4))
    return A, B, X


@given(models=two_models())
def test_same_function_is_false_for_different_models(models):
    (V, Q), (V2, Q2), X = models
    lengths = ref_lengths(X)
    ya = ref_forward(X, lengths, V, Q)
    yb = ref_forward(X, lengths, V2, Q2)
    # The reference shows that the two models differ on X ...
    assume(np.max(np.abs(ya - yb)) > 1e-6 * max(np.max(np.abs(ya)), np.max(np.abs(yb))))
    # ... so they are not the same function.
    assert not same_function(V, Q, V2, Q2)
    assert not same_function(V2, Q2, V, Q)


@given(params=mhla_parameters(d=st.integers(1, 4), scale=SCALES), seed=SEEDS)
def test_same_function_detects_small_perturbations(params, seed):
    V, Q = params
    rng = np.random.default_rng(seed)
    Q2 = Q + 1e-6 * np.abs(Q).max() * rng.standard_normal(Q.shape)
    p, p2 = ref_coefficients(V, Q), ref_coefficients(V, Q2)
    assume(np.linalg.norm(p - p2) > 1e-8 * np.linalg.norm(p))
    assert not same_function(V, Q, V, Q2)
    # A model with another output dimension is never the same function.
    assert not same_function(V, Q, np.concatenate([V, V], axis=1), Q)


@given(params=mhla_parameters(d=st.integers(2, 4), scale=SCALES), seed=SEEDS,
       X=sequence_batches(d=4, max_samples=3, max_length=4))
def test_same_function_is_true_for_reparametrisations(params, seed, X):
    """Rescaled, permuted and split heads, and heads whose folded
    coefficients cancel (antisymmetric in j, k), change Theta but not p(Theta)."""
    V, Q = params
    n_heads, d_out, d = V.shape
    rng = np.random.default_rng(seed)
    c = np.exp(rng.uniform(-2, 2, size=n_heads))
    perm = rng.permutation(n_heads)
    V2 = np.concatenate([(V * c[:, None, None])[perm], V[:1] / 2])
    Q2 = np.concatenate([(Q / c[:, None, None])[perm], Q[:1]])
    V2[np.flatnonzero(perm == 0)[0]] /= 2  # head 0 now appears twice, halved
    j, k = rng.choice(d, size=2, replace=False)
    u = rng.standard_normal(d_out) * np.abs(V).max()
    w = rng.standard_normal(d) * np.abs(Q).max()
    Va, Vb = np.zeros((1, d_out, d)), np.zeros((1, d_out, d))
    Qa, Qb = np.zeros((1, d, d)), np.zeros((1, d, d))
    Va[0, :, j], Qa[0, k, :] = u, w  # C[a, j, k, l] = u_a w_l
    Vb[0, :, k], Qb[0, j, :] = -u, w  # C[a, k, j, l] = -u_a w_l
    V2 = np.concatenate([V2, Va, Vb])
    Q2 = np.concatenate([Q2, Qa, Qb])
    assert V2.shape[0] == n_heads + 3
    assert same_function(V, Q, V2, Q2)
    # Check with the reference that the functions really agree.
    Xd = X[:, :, :d]
    lengths = ref_lengths(Xd)
    for readout in ("last", "all"):
        magnitude = ref_forward(np.abs(Xd), lengths, np.abs(V2), np.abs(Q2), readout)
        assert_close(ref_forward(Xd, lengths, V2, Q2, readout),
                     ref_forward(Xd, lengths, V, Q, readout), magnitude, 1e-12)


def test_mhla_forward_rejects_unknown_readout():
    X = np.ones((1, 2, 2))
    with pytest.raises(ValueError, match=r"readout must be one of .*got 'first'"):
        mhla_forward(X, np.ones((1, 1, 2)), np.eye(2)[None], readout="first")


@given(batches=two_batches())
def test_public_attention_kernel_reads_nan_padding(batches):
    X, Y = batches
    lx, ly = ref_lengths(X), ref_lengths(Y)
    K = attention_kernel(X, Y)
    assert K.dtype == np.float64 and K.shape == (X.shape[0], Y.shape[0])
    assert_close(K, ref_kernel(X, lx, Y, ly), ref_kernel(np.abs(X), lx, np.abs(Y), ly),
                 rtol_for(X.dtype))
    G = attention_kernel(X)
    np.testing.assert_allclose(G, attention_kernel(X, X), rtol=1e-12,
                               atol=1e-12 * np.abs(G).max())


def test_public_attention_kernel_rejects_mismatched_d():
    with pytest.raises(ValueError, match="Y has tokens of dimension d=3"):
        attention_kernel(np.ones((2, 3, 2)), np.ones((2, 3, 3)))


# --------------------------------------------------------------------------
# Scale robustness of the forward pass (exact power-of-two rescaling).
# --------------------------------------------------------------------------


@given(data=batch_and_heads(), k=st.integers(-300, 300))
def test_mhla_forward_scales_exactly_by_powers_of_two(data, k):
    """y(2**k X) == 2**(3k) y(X) bit for bit: the forward pass rescales each
    sequence by a power of two before computing, so the scale cannot matter."""
    X, V, Q, readout = data
    X = X.astype(np.float64)  # 2**300 X does not fit in float32
    y = mhla_forward(X, V, Q, readout=readout)
    scaled = mhla_forward(np.ldexp(X, k), V, Q, readout=readout)
    np.testing.assert_array_equal(scaled, np.ldexp(y, 3 * k))


def _log10_max(a):
    a = np.abs(np.asarray(a, dtype=np.float64))
    a = a[np.isfinite(a) & (a > 0)]
    return np.log10(a.max()) if a.size else 0.0


@given(data=batch_and_heads(),
       log_c=st.one_of(st.floats(-100.0, 100.0), st.sampled_from([-80.0, 80.0])),
       seed=SEEDS)
def test_mhla_forward_extreme_scales_match_reference(data, log_c, seed):
    """X scaled by c in 1e-100..1e100 and heads rescaled by up to 1e+-150 per
    head (V_h * s, Q_h / s is the same head): y(cX) = c**3 y(X), checked
    against the loop reference at unit scale wherever c**3 y is representable."""
    X, V, Q, readout = data
    X = X.astype(np.float64)
    lengths = ref_lengths(X)
    expected = ref_forward(X, lengths, V, Q, readout)
    magnitude = ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout)
    top = _log10_max(magnitude) + 3 * log_c
    assume(-250 < top < 250 and _log10_max(magnitude) - 3 * abs(log_c) > -300)
    c = 10.0**log_c
    # Per-head scales, half of them at the extremes.
    rng = np.random.default_rng(seed)
    s = 10.0 ** np.where(rng.random(V.shape[0]) < 0.5, rng.choice([-150.0, 150.0], V.shape[0]),
                         rng.uniform(-150, 150, size=V.shape[0]))
    got = mhla_forward(X * c, V * s[:, None, None], Q / s[:, None, None], readout=readout)
    # Divide c out one factor at a time: c**3 alone may over- or underflow.
    assert_close(got / c / c / c, expected, magnitude, 1e-12)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize(
    "c, v, q",
    [
        (1e105, [1e-200], [1.0]),    # x^T Q x and its sum reach 1e315: overflowed to inf
        (1e-110, [1e300], [1.0]),    # products of 1e-110 entries underflowed to 0
        (1e-60, [1e300], [1e-150]),  # Q x_last ~ 1e-210, its weighted sum ~ 1e-330
        (1e-80, [1e150, 1e-150], [1e-150, 1e150]),  # one head underflowed
        (1e80, [1e-150, 1e-290], [1e-150, 1e-10]),  # V x ~ 1e-210, times 1e240 of X
        (1.0, [1e150, 1e-150], [1e-150, 1e150]),    # extreme heads, outputs of size 1
    ],
)
def test_mhla_forward_representable_outputs_of_extreme_inputs(readout, c, v, q):
    """Each head h is rescaled by v_h q_h = p (the same for every head), so
    the outputs are c**3 p times those at unit scale."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 6, 3))
    V, Q = rng.normal(size=(2, 2, 3)), rng.normal(size=(2, 3, 3))
    v = np.resize(v, 2)[:, None, None]
    q = np.resize(q, 2)[:, None, None]
    p = float(v[0, 0, 0] * q[0, 0, 0])
    lengths = [6] * 4
    expected = ref_forward(X, lengths, V, Q, readout)
    magnitude = ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout)
    got = mhla_forward(X * c, V * v, Q * q, readout=readout)
    assert np.all(np.isfinite(got))
    assert_close(got / c / c / c / p, expected, magnitude, 1e-12)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_mhla_forward_overflowing_outputs_raise_naming_the_sample(readout):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 5, 2))
    X[2] *= 1e120  # outputs about 1e360
    V, Q = rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 2, 2))
    with pytest.raises(ValueError, match=r"the outputs for X\[2\] exceed the float64 range: "
                                         r"their largest magnitude is about 1e3[56]\d"):
        mhla_forward(X, V, Q, readout=readout)
    # The same sample alone, through explicit lengths and chunk offsets.
    with pytest.raises(ValueError, match=r"X\[0\] exceed the float64 range"):
        mhla_forward(X[2:3], V, Q, np.array([5]), readout=readout)


# --------------------------------------------------------------------------
# Refused heads: NaN, infinity, complex and non-numeric V or Q.
# --------------------------------------------------------------------------


def _calls():
    X = np.random.default_rng(0).normal(size=(3, 4, 2))
    return {
        "mhla_forward": lambda V, Q: mhla_forward(X, V, Q),
        "mhla_forward_all": lambda V, Q: mhla_forward(X, V, Q, readout="all"),
        "mhla_generate": lambda V, Q: mhla_generate(X, V, Q, 2),
        "attention_coefficients": attention_coefficients,
        "same_function": lambda V, Q: same_function(V, Q, np.ones((1, 2, 2)), np.eye(2)[None]),
        "same_function_second": lambda V, Q: same_function(np.ones((1, 2, 2)), np.eye(2)[None],
                                                           V, Q),
    }


def _set(index, value):
    def fn(A):
        A = A.astype(np.result_type(A, np.asarray(value)))
        A[index] = value
        return A
    return fn


BAD_HEADS = [
    # which, change, exception, message
    ("V", _set((0, 1, 0), np.nan), ValueError, r"V must be finite; got nan at V\[0, 1, 0\]"),
    ("V", _set((0, 0, 1), -np.inf), ValueError, r"V must be finite; got -inf at V\[0, 0, 1\]"),
    ("Q", _set((0, 1, 1), np.nan), ValueError, r"Q must be finite; got nan at Q\[0, 1, 1\]"),
    ("Q", _set((0, 0, 0), np.inf), ValueError, r"Q must be finite; got inf at Q\[0, 0, 0\]"),
    ("V", lambda A: A + 1j, ValueError,
     r"Complex data not supported: V must hold real numbers; got complex values"),
    ("Q", lambda A: A * (1 + 1j), ValueError,
     r"Complex data not supported: Q must hold real numbers; got complex values"),
    ("V", lambda A: A.astype(str), TypeError, r"V must hold real numbers \(a numeric dtype\)"),
    ("Q", lambda A: A.astype(object), TypeError, r"Q must hold real numbers \(a numeric dtype\)"),
]


@pytest.mark.parametrize("call", list(_calls()))
@pytest.mark.parametrize("which, change, exc, pattern", BAD_HEADS)
def test_bad_heads_are_refused_by_name(call, which, change, exc, pattern):
    V, Q = np.ones((1, 2, 2)), np.eye(2)[None]
    if which == "V":
        V = change(V)
    else:
        Q = change(Q)
    with warnings.catch_warnings():
        # The complex parts used to be dropped with only a ComplexWarning.
        warnings.simplefilter("error")
        with pytest.raises(exc, match=pattern):
            _calls()[call](V, Q)


@pytest.mark.parametrize(
    "coef, exc, pattern",
    [
        (np.where(np.arange(6) == 3, np.nan, 1.0)[None], ValueError,
         r"coef must be finite; got nan at coef\[0, 3\]"),
        (np.ones((1, 6)) * 1j, ValueError, r"Complex data not supported: coef must hold real"),
        (np.ones((1, 6)).astype(str), TypeError, r"coef must hold real numbers"),
    ],
)
def test_heads_from_coefficients_refuses_bad_coefficients(coef, exc, pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(exc, match=pattern):
            heads_from_coefficients(coef, 2)


def test_attention_coefficients_refuses_overflowing_coefficients():
    V, Q = np.full((1, 1, 2), 1e200), np.full((1, 2, 2), 1e200)
    with pytest.raises(ValueError, match=r"coefficients of these heads exceed the float64 range"):
        attention_coefficients(V, Q)


# --------------------------------------------------------------------------
# mhla_generate: memory estimate, overflow, moderate scales.
# --------------------------------------------------------------------------


def test_mhla_generate_refuses_an_output_larger_than_memory():
    X = np.ones((3, 4, 2))
    V, Q = np.eye(2)[None], np.eye(2)[None]
    with pytest.raises(ValueError, match=r"n_steps=1000000000000000 would need an output of shape "
                                         r"\(3, 1000000000000004, 2\), .* GiB of float64, more than "
                                         r"the memory budget of .* GiB .*; at most n_steps=\d+ fits"):
        mhla_generate(X, V, Q, 10**15)


def test_mhla_generate_overflow_raises_naming_the_step():
    X = np.ones((2, 3, 2))
    X[1] *= 0.5
    V, Q = np.eye(2)[None], np.eye(2)[None]
    # Each output is cubic in the tokens: the sequences explode within a few steps.
    with pytest.raises(ValueError, match=r"mhla_generate: at step \d+ of n_steps=40, the output "
                                         r"for X\[0\] is not finite .* exceed the float64 range"):
        mhla_generate(X, V, Q, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning on the way to the error
        with pytest.raises(ValueError, match="exceed the float64 range"):
            mhla_generate(X, V, Q, 40)
    # A rounding that returns non-finite tokens is caught the same way.
    with pytest.raises(ValueError, match=r"at step 1 of n_steps=2, the rounded token for X\[0\]"):
        mhla_generate(X, V, Q, 2, rounding=lambda Y: Y * np.inf)


@given(data=batch_and_heads(readout=st.just("last")), log_c=st.floats(-30.0, 30.0))
def test_mhla_generate_matches_reference_at_moderate_scales(data, log_c):
    X, V, Q, _ = data
    d = X.shape[2]
    V = np.concatenate([V] * d, axis=1)[:, :d]  # d_out = d
    X = X.astype(np.float64) * 10.0**log_c
    # Scale the heads so that the outputs stay of the size of the tokens
    # (y ~ |V| |Q| |x|**3): then a few steps stay finite.
    size = np.nanmax(np.abs(X)) if np.any(np.isfinite(X)) else 1.0
    V = V / size**2 / max(1.0, np.abs(V).max() * np.abs(Q).max() * 4 * X.shape[1] * d**2)
    lengths = ref_lengths(X)
    got = mhla_generate(X, V, Q, 3)
    want = ref_generate(X, lengths, V, Q, 3)
    scale = np.nanmax(np.abs(want))
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * scale)


def test_zero_heads_compute_zero():
    """A model with no heads (e.g. fitted to all-zero data) outputs zeros."""
    X = np.random.default_rng(0).normal(size=(3, 4, 2))
    X[1, 3] = np.nan
    V, Q = np.zeros((0, 2, 2)), np.zeros((0, 2, 2))
    np.testing.assert_array_equal(mhla_forward(X, V, Q), np.zeros((3, 2)))
    y_all = mhla_forward(X, V, Q, readout="all")
    np.testing.assert_array_equal(np.isnan(y_all), np.isnan(X))
    assert not np.any(np.nan_to_num(y_all))
    out = mhla_generate(X, V, Q, 2)
    np.testing.assert_array_equal(out[0], np.vstack([X[0], np.zeros((2, 2))]))
    np.testing.assert_array_equal(out[1, :5], np.vstack([X[1, :3], np.zeros((2, 2))]))
    assert np.isnan(out[1, 5:]).all()
    np.testing.assert_array_equal(attention_coefficients(V, Q), np.zeros((2, 6)))
