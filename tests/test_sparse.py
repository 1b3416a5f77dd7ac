"""Sparse feature rows and solver="lsmr" against the dense features and solvers."""

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
import sklearn
from sklearn.exceptions import ConvergenceWarning

from reference import ref_features, ref_prefix_features
from sklearn_linattn import LinearAttentionRegressor, certify_identifiability
from sklearn_linattn._features import (
    attention_features,
    n_attention_features,
    prefix_features,
    sparse_feature_rows,
)
from solving import solve_arrays
from sklearn_linattn.datasets import make_dfa_execution


def _one_hot(rng, n_samples, n_tokens, blocks):
    """Tokens that concatenate one-hot blocks of the given sizes."""
    return np.concatenate(
        [np.eye(b)[rng.integers(0, b, size=(n_samples, n_tokens))] for b in blocks], axis=2
    )


def _dense_rows(X, lengths, readout):
    """The dense feature rows the sparse ones must equal: one per sequence or per real token."""
    if readout == "last":
        return attention_features(X, lengths)
    return prefix_features(X, lengths)[np.arange(X.shape[1])[None, :] < lengths[:, None]]


def _nan_pad(X, lengths):
    Xp = X.copy()
    Xp[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = np.nan
    return Xp


def _rel(a, b):
    return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)


# --------------------------------------------------------------------------
# Sparse rows = dense features
# --------------------------------------------------------------------------


@st.composite
def _padded_batches(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n, t, d = draw(st.integers(1, 5)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    # Values with many exact zeros, so that rows are sparse.
    values = st.one_of(st.just(0.0), st.floats(-1e3, 1e3, width=32))
    X = draw(arrays(dtype, (n, t, d), elements=values))
    lengths = np.array(draw(st.lists(st.integers(1, t), min_size=n, max_size=n)))
    return X, lengths, draw(st.sampled_from(["last", "all"]))


@given(_padded_batches())
def test_sparse_rows_equal_dense_features(batch):
    X, lengths, readout = batch
    Xz = X.copy()
    Xz[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = 0
    H, sample = sparse_feature_rows(_nan_pad(X, lengths), lengths, readout)
    dense = _dense_rows(Xz, lengths, readout)
    assert H.format == "csr" and H.dtype == dense.dtype
    assert H.has_sorted_indices
    np.testing.assert_array_equal(H.toarray(), dense)
    expected = np.arange(X.shape[0]) if readout == "last" else np.repeat(
        np.arange(X.shape[0]), lengths)
    np.testing.assert_array_equal(sample, expected)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_sparse_rows_one_hot_against_loop_reference(readout):
    rng = np.random.default_rng(0)
    X = _one_hot(rng, 7, 5, [3, 2])
    lengths = rng.integers(1, 6, size=7)
    H, _ = sparse_feature_rows(_nan_pad(X, lengths), lengths, readout)
    if readout == "last":
        ref = ref_features(X, lengths)
    else:
        ref = ref_prefix_features(X, lengths)[np.arange(5)[None, :] < lengths[:, None]]
    np.testing.assert_array_equal(H.toarray(), ref)
    # Memory follows the non-zeros: a one-hot row has at most
    # (t * blocks**2) * blocks products.
    assert H.nnz <= H.shape[0] * 5 * 4 * 2
    # Zero-weight sequences are dropped.
    w = np.ones(7)
    w[[1, 4]] = 0
    Hw, sample = sparse_feature_rows(X, lengths, readout, sample_weight=w)
    keep = np.isin(np.arange(7), [1, 4], invert=True)
    np.testing.assert_array_equal(np.unique(sample), np.flatnonzero(keep))
    row_sample = np.arange(7) if readout == "last" else np.repeat(np.arange(7), lengths)
    np.testing.assert_array_equal(Hw.toarray(), H.toarray()[keep[row_sample]])


def test_sparse_rows_are_chunked(monkeypatch):
    rng = np.random.default_rng(1)
    X = _one_hot(rng, 9, 4, [3, 3])
    lengths = np.full(9, 4)
    whole, _ = sparse_feature_rows(X, lengths, "all")
    with sklearn.config_context(working_memory=1e-9):  # one sequence per chunk
        chunked, _ = sparse_feature_rows(X, lengths, "all")
    assert (whole != chunked).nnz == 0


# --------------------------------------------------------------------------
# lsmr coefficients = the dense solvers'
# --------------------------------------------------------------------------


def _dfa(n_samples, random_state=0, **kwargs):
    X, y = make_dfa_execution(n_samples, n_states=3, alphabet_size=2, word_length=3,
                              random_state=random_state, **kwargs)
    return X, np.full(X.shape[0], X.shape[1]), y


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("alpha", [0.0, 1e-2, 3.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_lsmr_equals_dense_solvers_on_one_hot(readout, alpha, weighted):
    X, lengths, y = _dfa(40 if readout == "last" else 8)  # 40 or 344 rows, psi = 288
    Y = y if readout == "all" else y[:, -1]
    w = np.random.default_rng(2).integers(0, 3, size=X.shape[0]).astype(float) if (
        weighted) else None
    kwargs = dict(readout=readout, alpha=alpha, sample_weight=w)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        sparse = solve_arrays(X, lengths, Y, solver="lsmr", **kwargs)
    psi = n_attention_features(X.shape[2])
    assert sparse.method == "lsmr" and sparse.coef.shape == (Y.shape[-1], psi)
    assert sparse.rank < psi  # rank-deficient one-hot data
    inactive = np.setdiff1d(np.arange(psi), sparse.active_columns)
    assert inactive.size and not sparse.coef[:, inactive].any()
    for solver in ("eigh", "svd", "dual"):
        dense = solve_arrays(X, lengths, Y, solver=solver, **kwargs)
        # eigh on the Gram matrix is the least accurate of the references
        # (its small eigenvalues carry rounding of psi * eps * lambda_max).
        assert _rel(sparse.coef, dense.coef) < (1e-7 if solver == "eigh" else 1e-8), solver
        assert sparse.rank == dense.rank
        np.testing.assert_allclose(sparse.eigenvalues, dense.eigenvalues,
                                   atol=1e-10 * dense.lambda_max)
        assert sparse.trace == pytest.approx(dense.trace, rel=1e-12)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_lsmr_equals_dense_on_continuous_data(readout):
    # Not only one-hot: a dense, full-rank design (every column active).
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 4, 3))
    lengths = rng.integers(2, 5, size=60)
    Xp = _nan_pad(X, lengths)
    Y = rng.normal(size=(60, 2)) if readout == "last" else rng.normal(size=(60, 4, 2))
    sparse = solve_arrays(Xp, lengths, Y, readout=readout, solver="lsmr")
    dense = solve_arrays(Xp, lengths, Y, readout=readout, solver="svd")
    assert sparse.active_columns.size == 18 and sparse.rank == dense.rank == 18
    assert _rel(sparse.coef, dense.coef) < 1e-8


def test_lsmr_skips_zero_targets_and_warns_when_stopped_early():
    X, lengths, y = _dfa(30)
    Y = y[:, -1].copy()
    Y[:, 0] = 0.0
    solution = solve_arrays(X, lengths, Y, solver="lsmr")
    assert not solution.coef[0].any()
    with pytest.warns(ConvergenceWarning, match="solver='lsmr' stopped after max_iter=2"):
        solve_arrays(X, lengths, Y, solver="lsmr", max_iter=2)


def test_regressor_with_lsmr():
    X, _, y = _dfa(40)
    eigh = LinearAttentionRegressor(readout="all", solver="eigh").fit(X, y)
    lsmr = LinearAttentionRegressor(readout="all", solver="lsmr").fit(X, y)
    assert lsmr.solver_ == "lsmr" and lsmr.feature_rank_ == eigh.feature_rank_
    assert _rel(lsmr.coef_, eigh.coef_) < 1e-7
    X_new, _, _ = _dfa(10, random_state=1)
    np.testing.assert_allclose(lsmr.predict(X_new), eigh.predict(X_new), atol=1e-8)
    assert not lsmr.certificate_
    assert lsmr.certificate_.covers(X_new).tolist() == eigh.certificate_.covers(X_new).tolist()


# --------------------------------------------------------------------------
# Certificate
# --------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
def test_lsmr_certificate_equals_eigh(readout):
    X, _, _ = _dfa(40 if readout == "last" else 10)
    X_new, _, _ = _dfa(15, random_state=1)
    rng = np.random.default_rng(4)
    candidates = np.concatenate([X_new, rng.normal(size=(3,) + X_new.shape[1:]),
                                 _one_hot(rng, 3, X.shape[1], [X.shape[2]])])
    dense = certify_identifiability(X, readout=readout, solver="eigh")
    sparse = certify_identifiability(X, readout=readout, solver="lsmr")
    assert not sparse and not dense
    assert sparse.method == "lsmr" and not sparse.rank_is_bound
    assert sparse.rank == dense.rank
    assert sparse.tol == pytest.approx(dense.tol, rel=1e-10)
    assert sparse.max_eigenvalue == pytest.approx(dense.max_eigenvalue, rel=1e-10)
    np.testing.assert_allclose(sparse.eigenvalues, dense.eigenvalues,
                               atol=1e-10 * dense.max_eigenvalue)
    covered = sparse.covers(candidates)
    np.testing.assert_array_equal(covered, dense.covers(candidates))
    assert covered[: len(X_new)].all() and not covered[len(X_new):].any()
    assert sparse.covers(X).all()
    np.testing.assert_allclose(sparse.error_bound(candidates, 1e-4),
                               dense.error_bound(candidates, 1e-4), rtol=1e-6)
    # Eigenvectors are kept in active coordinates only.
    assert sparse._row_space.eigenvectors.shape[1] == sparse.rank
    assert sparse._row_space.eigenvectors.shape[0] < sparse.n_features
    # The witness: a null vector of the training rows, its input not covered.
    w = sparse.witness(random_state=0)
    H, _ = sparse_feature_rows(X, np.full(len(X), X.shape[1]), readout)
    assert np.abs(H @ w.null_vector).max() <= 1e-8 * np.abs(H).max()
    assert np.linalg.norm(w.null_vector) == pytest.approx(1.0)
    assert not dense.covers(w.input[None])[0] and not sparse.covers(w.input[None])[0]


def test_lsmr_certificate_with_weights_and_scale():
    X, _, _ = _dfa(30)
    w = np.random.default_rng(5).integers(0, 3, size=len(X)).astype(float)
    for scale in (1e-3, 1.0, 1e3):
        dense = certify_identifiability(X * scale, sample_weight=w, solver="eigh")
        sparse = certify_identifiability(X * scale, sample_weight=w, solver="lsmr")
        assert sparse.rank == dense.rank and bool(sparse) == bool(dense)
        np.testing.assert_array_equal(sparse.covers(X * scale), dense.covers(X * scale))


def test_lsmr_certificate_without_spectrum():
    # A memory budget too small for the Gram matrix: a null vector but no null space.
    X, lengths, y = _dfa(20)
    solution = solve_arrays(X, lengths, None, solver="lsmr", memory_budget=1)
    stats = solution.counts
    assert solution.eigenvectors is None and solution.rank_is_bound
    dense = solve_arrays(X, lengths, None, solver="eigh")
    assert solution.lambda_max == pytest.approx(dense.lambda_max, rel=1e-8)
    from sklearn_linattn._certificate import IdentifiabilityCertificate

    cert = IdentifiabilityCertificate._from_solution(solution, stats, readout="last")
    assert not cert and cert.rank_is_bound and cert.rank == solution.active_columns.size
    with pytest.raises(ValueError, match="solver='lsmr' does not compute"):
        cert.covers(X)
    w = cert.witness(random_state=0)
    assert np.count_nonzero(w.null_vector) == 1  # an inactive column
    H = attention_features(X, lengths)
    assert not (H @ w.null_vector).any()


def test_lsmr_at_d42_where_dense_is_impossible():
    # d = 42: psi = 37926, a dense Gram matrix would take 11.5 GB; the sparse
    # rows of 120 one-hot sequences take a few hundred kB.
    rng = np.random.default_rng(6)
    blocks = [14, 14, 14]
    X = _one_hot(rng, 120, 6, blocks)
    lengths = np.full(120, 6)
    psi = n_attention_features(42)
    assert psi == 37926
    # Targets of a one-head lookup: value block 2 of the tokens whose block 1
    # matches the last token's block 0.
    Q = np.zeros((42, 42))
    Q[14:28, :14] = np.eye(14)
    V = np.zeros((14, 42))
    V[:, 28:] = np.eye(14)
    S = np.einsum("ntj,ntk->njk", X, X)
    Y = np.einsum("aj,njk,kl,nl->na", V, S, Q, X[:, -1], optimize=True)
    solution = solve_arrays(X, lengths, Y, solver="lsmr")
    m = solution.active_columns.size
    assert m < psi and solution.rank <= 120
    assert solution.eigenvectors.shape == (m, solution.rank)
    H, _ = sparse_feature_rows(X, lengths)
    coef = solution.standardizer.coef_to_user(solution.coef)
    np.testing.assert_allclose(H @ coef.T, Y, atol=1e-9)
    cert = certify_identifiability(X, solver="lsmr")
    assert not cert and cert.rank == solution.rank
    # Reordering the tokens before the last one keeps S and x_last: covered.
    # Fresh random one-hot sequences leave the training span.
    perm = X[:, [3, 1, 0, 4, 2, 5]]
    fresh = _one_hot(rng, 5, 6, blocks)
    covered = cert.covers(np.concatenate([perm[:5], fresh]))
    assert covered.tolist() == [True] * 5 + [False] * 5
    w = cert.witness(random_state=0)
    assert np.abs(H @ w.null_vector).max() <= 1e-10
