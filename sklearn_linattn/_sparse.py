"""Sparse feature rows and the sparse least-squares solver ``"lsmr"``.

One-hot data (tokens that concatenate one-hot attribute blocks, as in the
compiled programs of DESIGN.md section 7) makes the cubic feature rows very
sparse: a row ``kron(S_row, x_row)`` has ``nnz(S_row) * nnz(x_row)``
non-zeros out of psi = d**2 (d + 1) / 2, and whole columns are zero in every
row.  This module builds the rows as a :mod:`scipy.sparse` CSR matrix (memory
follows the non-zeros) and solves the least squares on the *active* columns
only (those non-zero in some row of positive weight) with LSMR; the inactive
columns get coefficient 0, as in the minimum-norm solution.

The feature order and the folding are those of :mod:`._features`: the rows
are built from :func:`~._features.row_factors`, the same factors the dense
:func:`~._features.attention_features` and
:func:`~._features.prefix_features` multiply out.
"""

import warnings

import numpy as np
import scipy.linalg
import scipy.sparse
from scipy.sparse.linalg import lsmr, svds
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from ._features import iter_sample_chunks, n_attention_features, row_factors
from ._solvers import (
    SpectralSolution,
    _start_vectors,
    default_memory_budget,
    eigenvalue_tolerance,
)
from ._standardize import TokenStandardizer
from ._validation import check_lengths_array, check_readout

__all__ = ["solve_lsmr", "sparse_feature_rows"]

# LSMR stops when ||A^T r|| <= _LSMR_ATOL ||A|| ||r|| (or ||r|| <= _LSMR_BTOL
# ||b|| for a consistent system): near rounding, so that the coefficients
# agree with the direct solvers to about 1e-8 relative on well-posed problems.
_LSMR_ATOL = 1e-14
_LSMR_BTOL = 1e-14
# Dense m x m arrays held by the certificate's eigen-decomposition (the Gram
# matrix, its eigenvectors, LAPACK work space).
_GRAM_ARRAYS = 3.25


def _row_values(d, n_tokens, readout):
    """Float64 values one sequence occupies in the dense work arrays of a chunk."""
    P = d * (d + 1) // 2
    moments = d * d if readout == "last" else 2 * n_tokens * P
    return 2 * n_tokens * d + moments


def _kron_rows(S, x):
    """CSR rows ``kron(S_r, x_r)`` of dense factors, only their non-zero products.

    Parameters
    ----------
    S : ndarray of shape (n_rows, P)
    x : ndarray of shape (n_rows, d)

    Returns
    -------
    indptr, indices, data : ndarrays of one CSR matrix of shape (n_rows, P * d)
        Column indices sorted within each row (``p * d + l`` increases with p,
        then l).
    """
    n_rows, d = x.shape
    sr, sp = np.nonzero(S)  # row-major: sorted by row, then by pair p
    xr, xl = np.nonzero(x)
    x_count = np.bincount(xr, minlength=n_rows)
    x_ptr = np.concatenate([[0], np.cumsum(x_count)])
    rep = x_count[sr]  # each non-zero S_rp pairs with every non-zero x_rl
    total = int(rep.sum())
    entry = np.repeat(np.arange(sr.size), rep)
    offset = np.arange(total) - np.repeat(np.cumsum(rep) - rep, rep)
    xi = x_ptr[sr[entry]] + offset
    indices = sp[entry] * d + xl[xi]
    data = S[sr[entry], sp[entry]] * x[xr[xi], xl[xi]]
    row_nnz = np.bincount(sr, weights=rep, minlength=n_rows).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(row_nnz)])
    return indptr, indices, data


def sparse_feature_rows(X, lengths, readout="last", *, sample_weight=None, standardizer=None,
                        memory_budget=None):
    """The feature rows H as a scipy.sparse CSR matrix.

    Same rows, same order and same feature order as the dense
    :func:`~._features.attention_features` (``"last"``) and the real rows of
    :func:`~._features.prefix_features` (``"all"``), and the same values
    (the products of the same factors), for any float input; only the
    non-zero products are formed, chunk by chunk of sequences.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Padded sequences; values at positions ``>= lengths`` are ignored
        (zero or NaN).
    lengths : ndarray of int, shape (n_samples,)
        Number of real tokens of each sequence.
    readout : {"last", "all"}, default="last"
        ``"last"``: one row per sequence.  ``"all"``: one row per real token
        (the features of the prefix ending there), sample-major.
    sample_weight : ndarray of shape (n_samples,) or None, default=None
        When given, rows of sequences with weight 0 are dropped (the other
        rows are not scaled).
    standardizer : TokenStandardizer or None, default=None
        Build the rows of the standardized tokens (float64); a power-of-two
        scaling per coordinate keeps them as sparse as the tokens.
    memory_budget : int or None, default=None
        Bytes the rows may take (None: no limit); a ValueError is raised as
        soon as the non-zeros built so far exceed it, before any more is
        allocated.

    Returns
    -------
    H : scipy.sparse.csr_matrix of shape (n_rows, psi)
        dtype float64, or float32 for float32 X (as the dense features).
    sample : ndarray of int, shape (n_rows,)
        Index of the sequence each row comes from.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features
    >>> from sklearn_linattn._sparse import sparse_feature_rows
    >>> X = np.eye(4)[np.random.default_rng(0).integers(0, 4, size=(5, 3))]  # one-hot
    >>> H, sample = sparse_feature_rows(X, np.full(5, 3))
    >>> H.shape, int(H.nnz) <= 5 * 6
    ((5, 40), True)
    >>> bool(np.array_equal(H.toarray(), attention_features(X, np.full(5, 3))))
    True
    """
    check_readout(readout)
    X = np.asarray(X)
    if X.ndim != 3:
        raise ValueError(f"X must be an array of shape (n_samples, n_tokens, d); got {X.shape}.")
    n_samples, n_tokens, d = X.shape
    lengths = check_lengths_array(lengths, n_samples, n_tokens).astype(np.int64, copy=False)
    dtype = np.float32 if X.dtype == np.float32 and standardizer is None else np.float64
    keep = None
    if sample_weight is not None:
        keep = np.asarray(sample_weight) > 0
    psi = n_attention_features(d)
    indptrs, indices, data, samples = [], [], [], []
    n_rows, nnz = 0, 0
    for sl in iter_sample_chunks(n_samples, _row_values(d, n_tokens, readout)):
        Xc, lc = X[sl].astype(dtype, copy=False), lengths[sl]
        if keep is not None and not keep[sl].all():
            Xc, lc = Xc[keep[sl]], lc[keep[sl]]
            base = np.flatnonzero(keep[sl]) + sl.start
        else:
            base = np.arange(sl.start, sl.stop)
        if Xc.shape[0] == 0:
            continue
        pad = np.arange(n_tokens)[None, :] >= lc[:, None]
        if pad.any():
            Xc = np.where(pad[:, :, None], dtype(0), Xc)
        if standardizer is not None:
            Xc = standardizer.transform(Xc)
        S, x, sample = row_factors(Xc, lc, readout)
        if standardizer is not None:
            S = standardizer.scale_moments(S)
        ptr, ind, val = _kron_rows(S, x)
        if memory_budget is not None and (nnz + int(ptr[-1])) * 16 > memory_budget:
            raise ValueError(
                f"the sparse feature rows need more than the memory budget of "
                f"{memory_budget / 2**30:.3g} GiB (half the physical memory): "
                f"{nnz + int(ptr[-1])} non-zeros after {sl.stop} of {n_samples} sequences, "
                "so the data are not sparse enough for solver='lsmr'; use solver='cg'."
            )
        indptrs.append(ptr[1:] + nnz)
        indices.append(ind)
        data.append(val.astype(dtype, copy=False))
        samples.append(base[sample])
        n_rows += S.shape[0]
        nnz += int(ptr[-1])
    index_dtype = np.int32 if max(nnz, psi) < 2**31 else np.int64
    indptr = np.concatenate([[0]] + indptrs).astype(index_dtype)
    indices = np.concatenate([np.zeros(0, np.int64)] + indices).astype(index_dtype)
    data = np.concatenate([np.zeros(0, dtype)] + data)
    sample = np.concatenate([np.zeros(0, np.int64)] + samples)
    H = scipy.sparse.csr_matrix((data, indices, indptr), shape=(n_rows, psi))
    return H, sample


def _target_rows(Y, lengths, readout, sample):
    """Targets of the rows of :func:`sparse_feature_rows` (same order), float64."""
    Y = np.asarray(Y, dtype=np.float64)
    if readout == "last":
        return Y[sample]
    real = np.arange(Y.shape[1])[None, :] < lengths[:, None]
    rows = Y[real]
    # ``sample`` lists the kept rows in sample-major order; map them back.
    all_sample = np.nonzero(real)[0]
    if all_sample.size == sample.size:
        return rows
    return rows[np.isin(all_sample, np.unique(sample))]


def gram_fits(m, memory_budget=None):
    """Whether a dense m x m Gram matrix and its eigh fit the budget (bytes)."""
    budget = default_memory_budget() if memory_budget is None else memory_budget
    return _GRAM_ARRAYS * 8.0 * m * m <= budget


def solve_lsmr(X, lengths, Y, *, readout="last", alpha=0.0, sample_weight=None,
               dtype=np.float64, max_iter=None, memory_budget=None, standardizer=None):
    """Sparse least squares on the active columns by LSMR, for one-hot data.

    - Rows: :func:`sparse_feature_rows`, scaled by ``sqrt(w)``; memory
      follows their non-zeros.
    - Active columns: those non-zero in some row of positive weight.  The
      others are in the null space of ``Phi^T W Phi`` and get coefficient 0.
    - Coefficients: LSMR per output column (all-zero target columns give
      zero coefficients without iterating) on the active columns, with
      ``damp = sqrt(alpha)`` (the objective ``||W^{1/2}(y - Phi c)||^2 +
      alpha ||c||^2`` of the other solvers), started at zero: with
      ``alpha = 0`` its iterates stay in the row space, so it converges to the
      minimum-norm least-squares solution.  It stops when
      ``||A^T r|| <= 1e-14 ||A|| ||r||`` (or ``||r|| <= 1e-14 ||b||``);
      a :class:`~sklearn.exceptions.ConvergenceWarning` says when
      ``max_iter`` (default ``10 * m``) stops it first.
    - Spectrum: with ``k = min(m, n_rows)``, when ``3.25 * 8 * k**2`` bytes
      fit ``memory_budget``, the k x k Gram matrix of the active columns
      ``A^T A`` (or the row kernel ``A A^T`` when there are fewer rows, as in
      ``"dual"``), a sparse product, and its dense eigen-decomposition:
      eigenvalues (zeros for the inactive columns) and the eigenvectors above
      the zero tolerance (:func:`~._solvers.eigenvalue_tolerance` with psi
      features, as for ``"eigh"``), in active coordinates.  Otherwise only
      lambda_max (Lanczos on the sparse rows)
      and, when some column is inactive, lambda_min = 0 with an inactive
      column as null vector; a design with every column active and a Gram
      matrix too large raises a ValueError (use ``solver="cg"``).

    Returns
    -------
    solution : SpectralSolution
        ``active_columns`` holds the m active columns; ``eigenvectors`` has
        shape (m, rank) in their coordinates.
    """
    psi = n_attention_features(X.shape[2])
    if standardizer is None:
        standardizer = TokenStandardizer.identity(X.shape[2])
    # The rows themselves may use the whole budget; ``memory_budget`` decides
    # only whether the certificate's dense eigen-decomposition fits.
    H, sample = sparse_feature_rows(X, lengths, readout, sample_weight=sample_weight,
                                    standardizer=standardizer,
                                    memory_budget=default_memory_budget())
    H = H.astype(np.float64, copy=False)
    Yr = None if Y is None else standardizer.transform_targets(
        _target_rows(Y, lengths, readout, sample))
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
        A, damp = _penalized_rows(A, active, standardizer, standardizer.alpha(alpha))
        worst = None
        for a in range(Yr.shape[1]):
            b = Yr[:, a]
            if m == 0 or not np.any(b):
                continue
            if A.shape[0] > Yr.shape[0]:
                b = np.concatenate([b, np.zeros(A.shape[0] - Yr.shape[0])])
            # LSMR's vector operations are level-1 BLAS: threads only add
            # synchronisation (on a busy machine, spinning threads made the
            # iterations 3-4 times slower).
            with threadpool_limits(limits=1, user_api="blas"):
                out = lsmr(A, b, damp=damp, atol=_LSMR_ATOL, btol=_LSMR_BTOL, conlim=0.0,
                           maxiter=max_iter)
            c, istop, itn, normr, normar, normA = out[:6]
            coef[a, active] = c
            n_iter = max(n_iter, int(itn))
            if istop == 7:
                rel = normar / max(normA * normr, np.finfo(np.float64).tiny)
                worst = rel if worst is None else max(worst, rel)
        A = A[: Yr.shape[0]]
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
        lam_max = _largest_eigenvalue(A) if m else 0.0
        lam_min = 0.0
        tol = eigenvalue_tolerance(lam_max, psi, dtype)
        rank, rank_is_bound = m, True
        inactive = np.ones(psi, dtype=bool)
        inactive[active] = False
        min_vector = np.zeros(psi)
        min_vector[np.flatnonzero(inactive)[0]] = 1.0
    return SpectralSolution(
        coef=None,
        standardized_coef=coef,
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


def _penalized_rows(A, active, standardizer, alpha):
    """Rows and LSMR damping for the ridge penalty ``alpha ||c||**2`` on the user's coefficients.

    A multiple of the identity in standardized coordinates is LSMR's own
    ``damp``; a diagonal penalty (power-of-two scales per coordinate) is
    appended as the rows ``sqrt(alpha p_j) e_j`` of the active columns.
    """
    if alpha <= 0:
        return A, 0.0
    scalar = standardizer.penalty_scalar()
    if scalar is not None:
        return A, float(np.sqrt(np.ldexp(alpha, scalar)))
    if standardizer.whitened:
        # Dense data (whitened): the penalty rows are a dense block.
        F = standardizer.penalty_rows(alpha)[:, active]
        extra = scipy.sparse.csr_matrix(F)
    else:
        PA, PB, shift = standardizer.penalty_factors()
        p = np.ldexp(np.kron(np.diagonal(PA), np.diagonal(PB)), shift)[active] * alpha
        extra = scipy.sparse.diags(np.sqrt(p), shape=(active.size, active.size), format="csr")
    return scipy.sparse.vstack([A, extra], format="csr"), 0.0


def _active_spectrum(A, psi, dtype):
    """Eigenvalues of ``A^T A`` padded to psi, eigenvectors above tol, and tol.

    Dense eigh of the smaller of ``A^T A`` (m x m) and ``A A^T`` (rows x
    rows), both sparse products; from the latter the eigenvectors are
    ``A^T u / sqrt(mu)`` as in the dual solver.
    """
    n_rows, m = A.shape
    dual = n_rows < m
    K = (A @ A.T) if dual else (A.T @ A)
    w, U = scipy.linalg.eigh(K.toarray(), driver="evr", overwrite_a=True, check_finite=False)
    w, U = np.clip(w[::-1], 0.0, None), U[:, ::-1]
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


def _largest_eigenvalue(A):
    """Largest eigenvalue of ``A^T A`` by Lanczos on the sparse rows."""
    if min(A.shape) == 1:
        return float(scipy.sparse.linalg.norm(A) ** 2)
    s = svds(A, k=1, which="LM", tol=1e-10, v0=_start_vectors(min(A.shape))[:, 0],
             return_singular_vectors=False)
    return float(s[0]) ** 2
