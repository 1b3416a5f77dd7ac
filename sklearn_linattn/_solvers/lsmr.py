"""The sparse solver ``"lsmr"``: least squares on the active columns of sparse feature rows."""

import warnings

import numpy as np
import scipy.linalg
import scipy.sparse
from scipy.sparse.linalg import lsmr
from sklearn.exceptions import ConvergenceWarning

from .._features import (
    last_tokens,
    sparse_feature_rows,
    sparse_target_rows,
)
from .._memory import (
    DENSE_ARRAYS,
    default_memory_budget,
    resolve_budget,
    single_blas_thread,
    zero_padding,
)
from .._moments import with_terms
from .._spectrum import descending_eigh, eigenvalue_tolerance, sparse_largest_eigenvalue
from ._solution import SpectralSolution, ridge_penalty

__all__ = ["solve_lsmr"]

# LSMR stops when ||A^T r|| <= _LSMR_ATOL ||A|| ||r|| (or ||r|| <= _LSMR_BTOL
# ||b|| for a consistent system): near rounding, so that the coefficients
# agree with the direct solvers to about 1e-8 relative on well-posed problems.
_LSMR_ATOL = 1e-14
_LSMR_BTOL = 1e-14


def gram_fits(m, memory_budget=None):
    """Whether a dense m x m Gram matrix and its eigh fit the budget (bytes)."""
    budget = resolve_budget(memory_budget)
    return DENSE_ARRAYS * 8.0 * m * m <= budget


def solve_lsmr(rows, alpha=0.0, options=None):
    """Sparse least squares by LSMR on the active columns of sparse feature rows (one-hot data).

    Inactive columns (zero in every row of positive weight) get coefficient
    0; with ``alpha=0`` the result is the minimum-norm solution.  The
    spectrum is that of the active Gram matrix when it fits ``memory_budget``
    (eigenvectors in active coordinates, ``active_columns`` set), else
    lambda_max and an inactive column as null vector; an all-active design
    too large for that raises a ValueError.  ``options``: ``max_iter``
    (default 10 times the active columns), ``memory_budget``.
    """
    options = {} if options is None else options
    max_iter, memory_budget = options.get("max_iter"), options.get("memory_budget")
    X, lengths, Y, sample_weight = rows.arrays
    readout, standardizer, dtype = rows.readout, rows.standardizer, rows.dtype
    psi = standardizer.n_features
    # The rows themselves may use the whole budget; ``memory_budget`` decides
    # only whether the certificate's dense eigen-decomposition fits.
    H, sample = sparse_feature_rows(X, lengths, readout, sample_weight=sample_weight,
                                    standardizer=standardizer,
                                    memory_budget=default_memory_budget())
    H = H.astype(np.float64, copy=False)
    Yr = None if Y is None else standardizer.transform_targets(
        sparse_target_rows(Y, lengths, readout, sample))
    if rows.terms:
        # The term columns [1, x] of the standardized row tokens.
        tokens = zero_padding(np.asarray(X, dtype=np.float64), lengths)
        if readout == "last":
            tokens = last_tokens(tokens, lengths)
        x = standardizer.transform(sparse_target_rows(tokens, lengths, readout, sample))
        Yr = with_terms(Yr, x, rows.terms)
    if sample_weight is not None:
        w = standardizer.transform_weights(np.asarray(sample_weight, dtype=np.float64))
        sw = np.sqrt(w[sample])
        H = scipy.sparse.diags(sw) @ H
        H = H.tocsr()
        Yr = None if Yr is None else Yr * sw[:, None]
    H.eliminate_zeros()
    active = np.unique(H.indices).astype(np.intp)
    m = active.size
    remap = np.full(psi, -1, dtype=H.indices.dtype)
    remap[active] = np.arange(m, dtype=H.indices.dtype)
    A = scipy.sparse.csr_matrix((H.data, remap[H.indices], H.indptr), shape=(H.shape[0], m))
    del H
    trace = float(A.data @ A.data)

    coef, n_iter = None, 0
    if Yr is not None:
        max_iter = 10 * max(m, 1) if max_iter is None else int(max_iter)
        coef = np.zeros((Yr.shape[1], psi))
        damp = float(np.sqrt(ridge_penalty(alpha, trace, psi)))
        worst = None
        for a in range(Yr.shape[1]):
            b = Yr[:, a]
            if m == 0 or not np.any(b):
                continue
            # LSMR's vector operations are level-1 BLAS: threads only add
            # synchronisation (on a busy machine, spinning threads made the
            # iterations 3-4 times slower).
            with single_blas_thread():
                out = lsmr(A, b, damp=damp, atol=_LSMR_ATOL, btol=_LSMR_BTOL, conlim=0.0,
                           maxiter=max_iter)
            c, istop, itn, normr, normar, normA = out[:6]
            coef[a, active] = c
            n_iter = max(n_iter, int(itn))
            if istop == 7:
                rel = normar / max(normA * normr, np.finfo(np.float64).tiny)
                worst = rel if worst is None else max(worst, rel)
        if worst is not None:
            warnings.warn(
                f"solver='lsmr' stopped after max_iter={max_iter} iterations with a relative "
                f"normal-equation residual ||A^T r|| / (||A|| ||r||) of {worst:.3g} > "
                f"{_LSMR_ATOL:g}; increase max_iter.",
                ConvergenceWarning,
            )

    eigenvalues = eigenvectors = min_vector = None
    rank_is_bound = False
    n_rows = A.shape[0]
    if m == 0:
        # No active column: every feature row is zero, the spectrum is all zeros.
        eigenvalues, eigenvectors, tol = np.zeros(psi), np.zeros((0, 0)), 0.0
        rank, lam_max, lam_min = 0, 0.0, 0.0
    elif gram_fits(min(m, n_rows), memory_budget):
        eigenvalues, eigenvectors, tol = _active_spectrum(A, psi, dtype)
        rank = eigenvectors.shape[1]
        lam_max, lam_min = float(eigenvalues[0]), float(eigenvalues[-1])
    else:
        if m == psi:
            raise ValueError(
                f"solver='lsmr' cannot certify this design: all psi = {psi} features are "
                f"active and their {m} x {m} Gram matrix does not fit the memory budget; "
                "the data are not sparse, use solver='cg'."
            )
        lam_max = sparse_largest_eigenvalue(A) if m else 0.0
        lam_min = 0.0
        tol = eigenvalue_tolerance(lam_max, psi, dtype)
        rank, rank_is_bound = m, True
        inactive = np.ones(psi, dtype=bool)
        inactive[active] = False
        min_vector = np.zeros(psi)
        min_vector[np.flatnonzero(inactive)[0]] = 1.0
    return SpectralSolution(
        coef=coef,
        standardizer=standardizer,
        tol=tol,
        lambda_max=lam_max,
        lambda_min=lam_min,
        n_features=psi,
        method="lsmr",
        eigenvalues=eigenvalues,
        eigenvectors=eigenvectors,
        min_eigenvector=min_vector,
        trace=trace,
        rank=rank,
        rank_is_bound=rank_is_bound,
        n_iter=n_iter,
        active_columns=active,
    )


def _active_spectrum(A, psi, dtype):
    """Eigenvalues of ``A^T A`` padded to psi, eigenvectors above tol, and tol.

    Dense eigh of the smaller of ``A^T A`` (m x m) and ``A A^T`` (rows x
    rows), both sparse products; from the latter the eigenvectors are
    ``A^T u / sqrt(mu)`` as in the dual solver.
    """
    n_rows, m = A.shape
    dual = n_rows < m
    K = (A @ A.T) if dual else (A.T @ A)
    w, U = descending_eigh(K.toarray(), overwrite_a=True)
    k = min(w.size, m)
    eigenvalues = np.zeros(psi)
    eigenvalues[:k] = w[:k]
    tol = eigenvalue_tolerance(eigenvalues[0], psi, dtype)
    rank = int(np.count_nonzero(eigenvalues > tol))
    if dual:
        V = np.asarray(A.T @ U[:, :rank]) / np.sqrt(w[:rank])
    else:
        V = np.ascontiguousarray(U[:, :rank])
    return eigenvalues, V, tol
