"""Streaming: partial_fit, chunked fit, statistics from elsewhere, bounded memory.

Nothing here measures time.  Memory is measured with tracemalloc (NumPy
reports its allocations to it) on small arrays with small chunk budgets, so
that the bound "O(chunk + psi^2), independent of the number of sequences"
is checked quickly.
"""

import tracemalloc
import warnings

import numpy as np
import pytest
import sklearn

import sklearn_linattn._source as training_module
from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn._solvers import SufficientStatistics
from sklearn_linattn._source import standardizer_of
from sklearn_linattn._validation import check_sequences, check_targets


def _data(rng, n_samples, n_tokens, d, *, readout="last", d_out=1):
    X = rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(2, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    V = rng.normal(size=(2, d_out, d)) / d
    Q = rng.normal(size=(2, d, d)) / d
    y = mhla_forward(np.nan_to_num(X), V, Q, lengths, readout=readout)
    y = y + 0.01 * rng.normal(size=y.shape)
    return X, lengths, y


def _same_model(a, b, rtol=1e-9):
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=rtol, atol=rtol * np.abs(b.coef_).max())
    ca, cb = a.certificate_, b.certificate_
    assert (bool(ca), ca.rank, ca.n_rows, ca.n_samples) == (bool(cb), cb.rank, cb.n_rows,
                                                              cb.n_samples)
    assert ca.min_eigenvalue == pytest.approx(cb.min_eigenvalue, rel=1e-7, abs=cb.tol)
    assert a.feature_rank_ == b.feature_rank_


@pytest.mark.parametrize("solver", ["auto", "eigh", "cholesky"])
@pytest.mark.parametrize("readout", ["last", "all"])
def test_partial_fit_over_chunks_equals_fit(solver, readout):
    rng = np.random.default_rng(0)
    d = 5 if solver != "eigh" else 3
    X, lengths, y = _data(rng, 240, 6, d, readout=readout, d_out=2)
    w = rng.uniform(0.0, 2.0, size=240)
    whole = LinearAttentionRegressor(readout=readout, solver=solver).fit(X, y, sample_weight=w)
    stream = LinearAttentionRegressor(readout=readout, solver=solver)
    for batch in np.array_split(np.arange(240), 5):
        # Each batch as a list of its sequences, padded to its own length.
        seqs = [X[i, : lengths[i]] for i in batch]
        ys = y[batch] if readout == "last" else [y[i, : lengths[i]] for i in batch]
        stream.partial_fit(seqs, ys, sample_weight=w[batch])
    _same_model(stream, whole)
    assert stream.solver_ == whole.solver_
    Z = rng.normal(size=(4, 11, d))
    np.testing.assert_allclose(stream.predict(Z), whole.predict(Z), rtol=1e-8,
                               atol=1e-8 * np.abs(whole.predict(Z)).max())


# Noisy targets: two heads do not reproduce the unconstrained optimum exactly.
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_partial_fit_refreshes_the_model_after_every_call():
    rng = np.random.default_rng(1)
    X, _, y = _data(rng, 90, 5, 3)
    model = LinearAttentionRegressor(n_heads=2, random_state=0)
    for k in (30, 60, 90):
        model.partial_fit(X[k - 30 : k], y[k - 30 : k])
        reference = LinearAttentionRegressor(n_heads=2, random_state=0).fit(X[:k], y[:k])
        _same_model(model, reference)
        assert model.n_heads_ == 2 and model.certificate_.n_samples == k
        assert model.compression_residual_ == pytest.approx(
            reference.compression_residual_, rel=1e-3, abs=1e-12)


def test_fit_resets_and_partial_fit_continues_a_statistics_fit():
    rng = np.random.default_rng(2)
    X, _, y = _data(rng, 120, 5, 3)
    model = LinearAttentionRegressor(solver="eigh").fit(X[:60], y[:60])
    model.partial_fit(X[60:], y[60:])
    _same_model(model, LinearAttentionRegressor(solver="eigh").fit(X, y))
    model.fit(X[60:], y[60:])  # fit starts afresh
    _same_model(model, LinearAttentionRegressor(solver="eigh").fit(X[60:], y[60:]))


def test_partial_fit_errors():
    rng = np.random.default_rng(3)
    X, _, y = _data(rng, 40, 5, 3, d_out=2)
    model = LinearAttentionRegressor().partial_fit(X, y)
    coef = model.coef_.copy()
    with pytest.raises(ValueError, match=r"X has tokens of dimension d=4, but d=3 was expected"):
        model.partial_fit(rng.normal(size=(5, 4, 4)), rng.normal(size=(5, 2)))
    with pytest.raises(ValueError, match=r"y has 1 output\(s\), but partial_fit was started "
                                         r"with d_out=2"):
        model.partial_fit(X, y[:, 0])
    bad = X.copy()
    bad[-1, 0] = np.nan  # a NaN token followed by real ones: invalid, after valid rows
    with pytest.raises(ValueError, match="all-NaN token followed by real tokens"):
        model.partial_fit(bad, y)
    np.testing.assert_array_equal(model.coef_, coef)  # the failed calls changed nothing
    assert model.certificate_.n_samples == 40
    model.set_params(readout="all")
    with pytest.raises(ValueError, match="readout must stay 'last' between calls"):
        model.partial_fit(X, y)
    for solver in ("svd", "dual", "cg"):
        with pytest.raises(ValueError, match=f"partial_fit needs solver in .*got "
                                             f"solver='{solver}'"):
            LinearAttentionRegressor(solver=solver).partial_fit(X, y)
    svd = LinearAttentionRegressor(solver="svd").fit(X, y).set_params(solver="auto")
    with pytest.raises(ValueError, match="cannot continue a fit made with solver='svd'"):
        svd.partial_fit(X, y)
    with pytest.raises(ValueError, match="zero sample weight"):
        LinearAttentionRegressor().partial_fit(X, y, sample_weight=np.zeros(40))


def test_statistics_of_merged_blocks_equal_the_whole():
    rng = np.random.default_rng(4)
    X, lengths, y = _data(rng, 150, 6, 4, readout="all")
    Xv, lengths = check_sequences(X)
    Y, _ = check_targets(y[..., 0], lengths, Xv.shape[1], readout="all")
    # Blocks accumulated in the standardized coordinates of the whole data sum
    # to the statistics of the whole (a block of one sequence included).
    standardizer = standardizer_of(Xv, lengths, Y)
    blocks = [
        SufficientStatistics(4, 1, standardizer=standardizer).update(
            Xv[sl], lengths[sl], Y[sl], readout="all")
        for sl in (slice(0, 40), slice(40, 41), slice(41, 150))
    ]
    stats = blocks[0].merge(blocks[1]).merge(blocks[2])
    whole = SufficientStatistics(4, 1, standardizer=standardizer).update(
        Xv, lengths, Y, readout="all")
    np.testing.assert_allclose(stats.gram, whole.gram, rtol=1e-12, atol=1e-12 * whole.gram.max())
    np.testing.assert_allclose(stats.moment, whole.moment, rtol=1e-12, atol=1e-12)
    assert (stats.n_rows, stats.weight_sum) == (whole.n_rows, whole.weight_sum)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunk budgets of 2**14 values, so that small arrays span many chunks."""
    monkeypatch.setattr(training_module, "_VALIDATION_CHUNK", 2**14)
    with sklearn.config_context(working_memory=2**17 / 2**20):  # 2**14 float64 values
        yield


@pytest.mark.parametrize("solver", ["auto", "svd", "cg"])
@pytest.mark.parametrize("readout", ["last", "all"])
def test_chunked_fit_equals_whole_fit(small_chunks, solver, readout):
    rng = np.random.default_rng(5)
    X, lengths, y = _data(rng, 1500, 12, 3, readout=readout)
    X = X.astype(np.float32)
    assert X.size > training_module._VALIDATION_CHUNK
    kwargs = dict(tol=1e-13, max_iter=5000) if solver == "cg" else {}
    chunked = LinearAttentionRegressor(readout=readout, solver=solver, **kwargs).fit(X, y)
    as_list = [X[i, : lengths[i]] for i in range(len(X))]
    whole = LinearAttentionRegressor(readout=readout, solver=solver, **kwargs).fit(as_list, y)
    _same_model(chunked, whole, rtol=1e-8)
    assert chunked.certificate_.dtype == np.float32


@pytest.mark.parametrize("route", ["map", "second pass"])
@pytest.mark.parametrize("drift", [1.0, 1e3])
def test_statistics_of_many_chunks_equal_those_of_all_the_data(small_chunks, monkeypatch,
                                                               route, drift):
    """Statistics accumulated in the first chunk's coordinates and mapped into those of all the
    data, or accumulated again in a second pass (large psi, or a first chunk unlike the rest:
    here its second coordinate 1000 times larger), give the fit on all the data at once."""
    from sklearn_linattn import _problem

    if route == "second pass":
        monkeypatch.setattr(_problem, "_map_is_cheaper", lambda source: False)
    rng = np.random.default_rng(9)
    X, lengths, y = _data(rng, 1500, 12, 3)
    X[:300, :, 1] *= drift  # the first chunks' second coordinate
    assert X.size > training_module._VALIDATION_CHUNK
    chunked = LinearAttentionRegressor(solver="eigh").fit(X, y)
    whole = LinearAttentionRegressor(solver="eigh").fit([X[i, : lengths[i]] for i in
                                                         range(len(X))], y)
    _same_model(chunked, whole, rtol=1e-8)


def test_chunk_errors_name_the_chunk(small_chunks):
    rng = np.random.default_rng(6)
    X = rng.normal(size=(3000, 8, 2))
    X[2000, 3, 0] = np.nan
    with pytest.raises(ValueError, match=r"X\[1024:2048\]\[976, 3\] is partly NaN"):
        LinearAttentionRegressor().fit(X, rng.normal(size=3000))
    with pytest.raises(ValueError, match=r"y must have one entry per sequence of X"):
        LinearAttentionRegressor().fit(rng.normal(size=(3000, 8, 2)), rng.normal(size=2999))


def _peak_bytes(fit):
    tracemalloc.start()
    try:
        fit()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streaming_memory_does_not_grow_with_the_data(small_chunks):
    rng = np.random.default_rng(7)
    peaks = {}
    for n_samples in (8000, 32000):
        X = rng.normal(size=(n_samples, 16, 4))
        y = rng.normal(size=n_samples)
        peaks[n_samples] = _peak_bytes(lambda: LinearAttentionRegressor().fit(X, y))
        model = LinearAttentionRegressor()
        batches = [slice(k * n_samples // 8, (k + 1) * n_samples // 8) for k in range(8)]
        stream = _peak_bytes(lambda: [model.partial_fit(X[b], y[b]) for b in batches])
        assert stream < X.nbytes / 4
    # O(chunk + psi^2): four times the sequences, not four times the memory.
    assert peaks[32000] < 1.5 * peaks[8000]
    assert peaks[32000] < X.nbytes / 10


def test_cg_reads_float32_sequences_in_place(small_chunks):
    rng = np.random.default_rng(8)
    X = rng.normal(size=(8000, 32, 3)).astype(np.float32)
    y = rng.normal(size=8000)
    peak = _peak_bytes(lambda: LinearAttentionRegressor(solver="cg").fit(X, y))
    # No copy of X (3 MB), only lengths, targets, chunks and the cache of the
    # row factors (8000 rows of P + d = 9 float64 values, 0.6 MB).
    cache = 8000 * 9 * 8
    assert peak < X.nbytes / 4 + cache


def _two_batches(seed, n, n_tokens=1):
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-3, 3, size=3)
    X, y = rng.normal(size=(n, n_tokens, 3)) * scales, rng.normal(size=n)
    X_new = rng.normal(size=(20, 6, 3)) * scales * 3  # longer and larger than the training data
    return X, y, X_new


def test_partial_fit_on_rank_deficient_data_equals_fit():
    """Reproducer: 3 one-token sequences (rank 3 of psi = 18), the first batch of one.

    The first batch's statistics, mapped into the coordinates of all three,
    came back with 3 more eigenvalues above the tolerance than a fit of all
    three (rank 6 from 3 rows), and new inputs got answers up to 2.6 times
    the fit's apart, silently (seed 47 among them).
    """
    for seed in range(60):
        X, y, X_new = _two_batches(seed, 3)
        whole = LinearAttentionRegressor().fit(X, y)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = LinearAttentionRegressor().partial_fit(X[:1], y[:1]).partial_fit(X[1:], y[1:])
        assert model.feature_rank_ == whole.feature_rank_ == 3, seed
        expected = whole.predict(X_new)
        # The same minimum-norm point, to the rounding of the map.
        assert np.max(np.abs(model.predict(X_new) - expected)) <= 1e-6 * np.max(np.abs(expected)), seed


@pytest.mark.parametrize("seed", range(6))
def test_partial_fit_of_identified_data_equals_fit_out_of_distribution(seed):
    X, y, X_new = _two_batches(seed, 40, n_tokens=2)
    whole = LinearAttentionRegressor().fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = LinearAttentionRegressor().partial_fit(X[:1], y[:1]).partial_fit(X[1:], y[1:])
    assert whole.certificate_ and model.certificate_
    expected = whole.predict(X_new)
    np.testing.assert_allclose(model.predict(X_new), expected, rtol=0,
                               atol=1e-9 * np.max(np.abs(expected)))


def test_cholesky_never_certifies_fewer_rows_than_features():
    """Mapped statistics of 3 rows can round to a positive definite 18 x 18 Gram matrix."""
    X, y, _ = _two_batches(71, 3)
    model = LinearAttentionRegressor(solver="cholesky").partial_fit(X[:1], y[:1])
    model.partial_fit(X[1:], y[1:])
    assert model.feature_rank_ <= 3 and not model.certificate_
