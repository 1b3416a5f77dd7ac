"""The strategies of sklearn_linattn.testing generate what they promise."""

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from reference import ref_features, ref_forward, ref_lengths, ref_prefix_features
from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn._validation import check_sequences
from sklearn_linattn.testing import (
    mhla_parameters,
    rank_deficient_datasets,
    realizable_datasets,
    sequence_batches,
)

FIND_SETTINGS = settings(database=None, derandomize=True, max_examples=500)


def psi(d):
    return d * d * (d + 1) // 2


def assert_padding_rule(X, min_length, max_length):
    """Real tokens (no NaN) first, then all-NaN tokens; returns the lengths."""
    n_samples, n_tokens, _ = X.shape
    assert min_length <= n_tokens <= max_length
    isnan = np.isnan(X)
    lengths = []
    for i in range(n_samples):
        token_is_pad = isnan[i].all(axis=1)
        assert np.array_equal(isnan[i].any(axis=1), token_is_pad)  # no partly-NaN token
        n_real = int((~token_is_pad).sum())
        assert min_length <= n_real and n_real >= 1
        assert not token_is_pad[:n_real].any() and token_is_pad[n_real:].all()
        lengths.append(n_real)
    assert np.isfinite(X[~isnan]).all()
    return lengths


# --------------------------------------------------------------------------
# sequence_batches
# --------------------------------------------------------------------------


@given(
    X=sequence_batches(d=3, min_samples=2, max_samples=5, min_length=2, max_length=7,
                       dtype=np.float32, scale=1e3)
)
def test_sequence_batches_shapes_dtype_padding(X):
    assert isinstance(X, np.ndarray) and X.dtype == np.float32
    assert X.ndim == 3 and 2 <= X.shape[0] <= 5 and X.shape[2] == 3
    lengths = assert_padding_rule(X, 2, 7)
    # Entries are N(0, scale**2): of the order of the scale, never huge.
    real = X[~np.isnan(X)]
    assert np.abs(real).max() <= 10 * 1e3
    # The package reads the same lengths and accepts the batch.
    _, checked = check_sequences(X)
    assert checked.tolist() == lengths == ref_lengths(X)


@given(X=sequence_batches(d=st.integers(1, 2), dtype=st.sampled_from([np.float32, np.float64]),
                          padded=False, min_length=3, max_length=3))
def test_sequence_batches_unpadded(X):
    assert not np.isnan(X).any()
    assert X.shape[1] == 3 and X.shape[2] in (1, 2)
    assert X.dtype in (np.float32, np.float64)


def test_sequence_batches_explores_padding_and_dtypes():
    # Variable lengths, all-padded trailing columns, both dtypes all occur.
    find(sequence_batches(), lambda X: len(set(ref_lengths(X))) > 1, settings=FIND_SETTINGS)
    find(sequence_batches(min_samples=2),
         lambda X: max(ref_lengths(X)) < X.shape[1], settings=FIND_SETTINGS)
    dtypes = st.sampled_from([np.float32, np.float64])
    find(sequence_batches(dtype=dtypes), lambda X: X.dtype == np.float32, settings=FIND_SETTINGS)
    find(sequence_batches(dtype=dtypes), lambda X: X.dtype == np.float64, settings=FIND_SETTINGS)


@pytest.mark.parametrize("scale", [1e-3, 1e3])
@settings(max_examples=10)
@given(data=st.data())
def test_sequence_batches_scale(scale, data):
    X = data.draw(sequence_batches(scale=scale, min_samples=3, min_length=3))
    real = np.abs(X[~np.isnan(X)])
    # At least 9 N(0, scale**2) entries: their largest is of the order of the scale.
    assert 1e-2 * scale < real.max() <= 10 * scale


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"d": 0}, r"d must be an integer >= 1; got 0"),
        ({"d": 1.5}, r"d must be an integer >= 1 or a strategy.*got 1\.5"),
        ({"min_samples": 0}, r"min_samples must be an integer >= 1; got 0"),
        ({"min_samples": 4, "max_samples": 3}, r"max_samples must be >= min_samples"),
        ({"min_length": 0}, r"min_length must be an integer >= 1; got 0"),
        ({"min_length": 5, "max_length": 2}, r"max_length must be >= min_length"),
        ({"dtype": np.int64}, r"dtype must be np\.float32 or np\.float64.*got int64"),
        ({"dtype": "complex128"}, r"dtype must be .*got complex128"),
        ({"scale": 0.0}, r"scale must be a positive finite number; got 0\.0"),
        ({"scale": float("inf")}, r"scale must be a positive finite number; got inf"),
        ({"padded": "yes"}, r"padded must be True or False; got 'yes'"),
    ],
)
def test_sequence_batches_invalid_arguments(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        sequence_batches(**kwargs)


def test_invalid_values_drawn_from_strategies_are_reported():
    with pytest.raises(InvalidArgument, match=r"d must be an integer >= 1; got 0"):
        find(sequence_batches(d=st.just(0)), lambda X: True, settings=FIND_SETTINGS)
    with pytest.raises(InvalidArgument, match=r"n_heads must be an integer >= 1; got -1"):
        find(mhla_parameters(n_heads=st.just(-1)), lambda p: True, settings=FIND_SETTINGS)
    with pytest.raises(InvalidArgument, match=r"readout must be 'last' or 'all'.*'first'"):
        find(realizable_datasets(readout=st.just("first")), lambda p: True,
             settings=FIND_SETTINGS)


# --------------------------------------------------------------------------
# mhla_parameters
# --------------------------------------------------------------------------


@given(
    params=mhla_parameters(d=st.integers(1, 5), d_out=2, n_heads=st.sampled_from([1, 4]),
                           scale=st.sampled_from([1e-3, 1.0, 1e3]))
)
def test_mhla_parameters_shapes_and_scale(params):
    V, Q = params
    n_heads, d_out, d = V.shape
    assert d_out == 2 and n_heads in (1, 4) and 1 <= d <= 5
    assert Q.shape == (n_heads, d, d)
    assert V.dtype == Q.dtype == np.float64
    assert np.isfinite(V).all() and np.isfinite(Q).all()
    assert np.all(V != 0) and np.all(Q != 0)  # generic: no exact zeros
    # Entries have standard deviation scale / sqrt(d), for the scale drawn.
    std = np.abs(np.concatenate([V.ravel(), Q.ravel()])).max() * np.sqrt(d)
    assert any(0.01 * s < std <= 8 * s for s in (1e-3, 1.0, 1e3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"d": 0}, r"d must be an integer >= 1; got 0"),
        ({"d_out": True}, r"d_out must be an integer .*got True of type bool"),
        ({"n_heads": "2"}, r"n_heads must be an integer .*got '2'"),
        ({"scale": -1.0}, r"scale must be a positive finite number; got -1\.0"),
    ],
)
def test_mhla_parameters_invalid_arguments(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        mhla_parameters(**kwargs)


# --------------------------------------------------------------------------
# realizable_datasets
# --------------------------------------------------------------------------


@given(
    data=realizable_datasets(readout=st.sampled_from(["last", "all"]),
                             dtype=st.sampled_from([np.float32, np.float64]),
                             scale=st.sampled_from([1e-2, 1.0, 1e2]), max_samples=4,
                             max_length=4)
)
def test_realizable_datasets_labels_are_the_exact_output(data):
    X, y, V, Q = data
    n_samples, n_tokens, d = X.shape
    n_heads, d_out = V.shape[:2]
    assert Q.shape == (n_heads, d, d) and V.shape[2] == d
    lengths = assert_padding_rule(X, 1, 4)
    readout = "last" if y.ndim == 2 else "all"
    assert y.dtype == np.float64
    assert y.shape == ((n_samples, d_out) if readout == "last" else (n_samples, n_tokens, d_out))
    # y is the reference loop forward pass on the stored values of X.
    expected = ref_forward(X, lengths, V, Q, readout)
    magnitude = ref_forward(np.abs(X), lengths, np.abs(V), np.abs(Q), readout)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    real = ~np.isnan(expected)
    assert np.all(np.abs(y[real] - expected[real]) <= 1e-12 * magnitude[real])


@settings(max_examples=10)
@given(data=realizable_datasets(d=2, d_out=2, readout="all", min_samples=6, max_samples=8,
                                min_length=2, max_length=5))
def test_realizable_datasets_are_fitted_exactly(data):
    # 6+ sequences of 2+ tokens give 12+ prefix rows >= psi(2) = 6 features.
    X, y, V, Q = data
    model = LinearAttentionRegressor(readout="all").fit(X, y)
    pred = model.predict(X)
    real = ~np.isnan(y)
    np.testing.assert_array_equal(np.isnan(pred), ~real)
    np.testing.assert_allclose(pred[real], y[real], rtol=1e-7, atol=1e-9 * np.abs(y[real]).max())


# --------------------------------------------------------------------------
# rank_deficient_datasets
# --------------------------------------------------------------------------


def _singular_values(H):
    return np.linalg.svd(H, compute_uv=False)


@given(
    data=rank_deficient_datasets(d=st.integers(2, 5),
                                 dtype=st.sampled_from([np.float32, np.float64]),
                                 scale=st.sampled_from([1e-3, 1.0, 1e3]))
)
def test_rank_deficient_datasets_have_the_claimed_rank(data):
    X, rank, basis = data
    n_samples, n_tokens, d = X.shape
    r = basis.shape[1]
    assert basis.shape == (d, r) and 1 <= r < d
    assert rank == r * r * (r + 1) // 2 < psi(d)
    assert n_samples >= 2 * rank
    lengths = assert_padding_rule(X, 2, 6)
    # Every real token lies in the column span of the basis.
    tokens = X[~np.isnan(X).all(axis=2)].astype(np.float64)
    coords, *_ = np.linalg.lstsq(basis, tokens.T, rcond=None)
    np.testing.assert_allclose(basis @ coords, tokens.T, rtol=0,
                               atol=1e-12 * np.abs(tokens).max())
    # The feature rows of both readouts have rank exactly `rank`: a clear gap
    # between the rank-th singular value and the next, which is rounding.
    last = ref_features(X, lengths)
    prefixes = ref_prefix_features(X, lengths)
    prefixes = prefixes[np.arange(n_tokens)[None, :] < np.array(lengths)[:, None]]
    for H in (last, prefixes):
        assert H.shape[1] == psi(d)
        s = _singular_values(H)
        assert s[rank - 1] > 1e-6 * s[0], "rank lower than claimed"
        assert s[rank] < 1e-12 * s[0], "rank higher than claimed"
    # The null space of the Gram matrix has dimension psi(d) - rank.
    w = np.linalg.eigvalsh(last.T @ last)
    assert np.count_nonzero(w <= 1e-12 * w.max()) == psi(d) - rank


@given(data=rank_deficient_datasets(d=3, subspace_dim=2, dtype=np.float32, scale=1e3))
def test_rank_deficient_datasets_float32_is_exact(data):
    # Stored float32 values lie exactly (not just to float32 rounding) in the
    # subspace: the float64 features are rank deficient to float64 rounding.
    X, rank, basis = data
    assert X.dtype == np.float32 and rank == 6
    assert 2.0**9 <= np.nanmax(np.abs(X)) <= 2 * 2.0**10  # scale 1e3 -> 2**10
    lengths = ref_lengths(X)
    s = _singular_values(ref_features(X, lengths))
    assert s[rank] < 1e-13 * s[0]


@given(data=rank_deficient_datasets(d=st.integers(2, 4)))
def test_fitted_feature_rank_matches_rank_deficient_datasets(data):
    # The package's numerical rank agrees with the construction.
    X, rank, _ = data
    model = LinearAttentionRegressor().fit(X, np.zeros(X.shape[0]))
    assert model.feature_rank_ == rank


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"d": 1}, r"d must be an integer >= 2; got 1"),
        ({"d": 3, "subspace_dim": 3}, r"subspace_dim must be smaller than d=3; got subspace_dim=3"),
        ({"d": 3, "subspace_dim": 0}, r"subspace_dim must be an integer >= 1; got 0"),
        ({"min_length": 1}, r"min_length must be an integer >= 2; got 1"),
    ],
)
def test_rank_deficient_datasets_invalid_arguments(kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        find(rank_deficient_datasets(**kwargs), lambda data: True, settings=FIND_SETTINGS)
