"""Least squares in feature space: sufficient statistics and solvers.

Every solver minimises ``sum_rows w_row ||y_row - c H_row||^2 + alpha ||c||^2``
over the folded coefficients c, where the feature rows ``H_row`` are the
row-wise Kronecker products ``kron(S_row, x_row)`` of a folded second moment
and a token (:func:`~._features.row_factors`).  The rows are never needed as
a matrix except by ``"svd"``:

- ``"eigh"`` and ``"cholesky"`` work from :class:`SufficientStatistics`, the
  Gram matrix ``G = Phi^T W Phi`` and the moment ``Phi^T W Y`` accumulated
  over chunks of sequences (memory O(chunk + psi^2); ``merge`` adds
  statistics of disjoint data, which is how streaming and distributed fits
  work).  :func:`solve_statistics` finishes a fit from statistics.
- ``"svd"`` factorises the (weighted) design matrix itself.
- ``"dual"`` works with the kernel matrix ``Phi W Phi^T`` (N x N), for
  designs with fewer rows than features.
- ``"cg"`` is matrix-free: preconditioned conjugate gradients on the normal
  equations with products ``G V`` computed from the row factors, cached
  (float64, or float32 checked by exact float64 products) when they fit in
  the memory budget, else recomputed from the sequences chunk by
  chunk; memory O(N n d + psi + P^2) plus the cache, O(n_rows (P + d)), with
  P = d (d + 1) / 2.

Each solver returns a :class:`SpectralSolution`: the coefficients together
with what the identifiability certificate needs about the spectrum of G.
One rule, :func:`eigenvalue_tolerance`, decides which eigenvalues count as
zero, for the pseudo-inverse and for the certificate alike.
"""

import os
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from scipy.linalg.blas import get_blas_funcs
from scipy.linalg.lapack import get_lapack_funcs
from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigsh, lobpcg
from sklearn.exceptions import ConvergenceWarning

from ._features import (
    _outer_features,
    attention_features,
    features_matvec,
    features_rmatvec,
    iter_sample_chunks,
    n_attention_features,
    pair_index_matrix,
    pair_indices,
    prefix_features,
    row_factors,
)
from ._standardize import TokenStandardizer, _exponent, feature_map, standardizer_for
from ._validation import check_lengths_array, check_readout

__all__ = [
    "SOLVERS",
    "STATISTICS_SOLVERS",
    "SpectralSolution",
    "SufficientStatistics",
    "check_solver_memory",
    "choose_solver",
    "default_memory_budget",
    "eigenvalue_tolerance",
    "feature_rows",
    "solve",
    "solve_statistics",
    "solver_memory",
]

SOLVERS = ("auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr")
# Solvers that only need the psi x psi statistics (streaming, partial_fit, merge).
STATISTICS_SOLVERS = ("eigh", "cholesky")

# Up to this many features, a dense eigen-decomposition costs less than a
# millisecond: "auto" uses "eigh" and "cholesky" takes the whole spectrum.
_SMALL_PSI = 64
# "cholesky" hands over to "eigh" when lambda_min is within this factor of the
# zero-eigenvalue tolerance (then rank and null space must be resolved).
_CHOLESKY_MARGIN = 100.0
# Relative accuracy asked of Lanczos (ARPACK) for the extreme eigenvalues of
# the dense Gram matrix ("cholesky") and for lambda_max of the implicit one.
_LANCZOS_RTOL = 1e-10
_IMPLICIT_LMAX_RTOL = 1e-8
# On float32 products, Lanczos only locates the eigenvector; the exact
# Rayleigh quotient of its Ritz vector is then accurate to the square of this.
_IMPLICIT_LMAX_RTOL_FLOAT32 = 1e-4
# "cg" certificate: LOBPCG block size and the relative residual it stops at.
_LOBPCG_BLOCK = 4
_LOBPCG_RTOL = 1e-4
_LOBPCG_FIRST_ROUND = 30
_LOBPCG_ROUND = 30
_LOBPCG_MAX_ITER = 300
# "cg" certificate, first stage: preconditioned CG from a random right-hand
# side (Lanczos on the pencil (G, M), M the Kronecker preconditioner), a check
# for a null direction every _PENCIL_CHECK steps, at most _PENCIL_MAX_ITER
# steps (fewer when the float32 Lanczos vectors would take more than
# _PENCIL_MEMORY_FRACTION of the memory budget).
_PENCIL_CHECK = 10
# Its randomized lower bound holds except with probability _RANDOM_DELTA * sqrt(2 / pi).
_RANDOM_DELTA = 1e-3
_PENCIL_MAX_ITER = 600
_PENCIL_MEMORY_FRACTION = 1 / 16
# Default iteration cap of "cg".
_CG_MAX_ITER = 1000
# "cg" caches the row factors (folded moments, last tokens, weights) in
# float64 when they fit in this fraction of the memory budget, else in
# float32 (then every result is checked with exact float64 products streamed
# from X) when they fit in that fraction.
_CG_CACHE_FRACTION = {np.dtype(np.float64): 1 / 8, np.dtype(np.float32): 1 / 4}
# With a float32 cache, CG replaces its recursive residual by the exact one
# whenever it has dropped by this factor since the last replacement.
_CG_REPLACE = 1e-2
# Pair products of the moments formed at a time while accumulating the Gram
# matrix (2**20 float64 values, 8 MiB: they stay in cache for the GEMM).
_GRAM_BLOCK_VALUES = 2**20
# Bytes of dense psi x psi work arrays the normal-equation solvers hold at once
# (the accumulated statistics, the Gram matrix, its factor or eigenvectors).
_DENSE_ARRAYS = 3.25


def default_memory_budget():
    """Bytes that ``solver="auto"`` lets dense arrays use: half the physical memory.

    Read with ``os.sysconf``; 8 GiB where the platform does not report it.

    Returns
    -------
    budget : int

    Examples
    --------
    >>> from sklearn_linattn._solvers import default_memory_budget
    >>> default_memory_budget() > 0
    True
    """
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 2**33
    if pages <= 0 or page_size <= 0:
        return 2**33
    return int(pages) * int(page_size) // 2


def eigenvalue_tolerance(lambda_max, n_features, dtype=np.float64):
    """The one rule for when an eigenvalue of the feature Gram matrix is zero.

    An eigenvalue counts as zero when it is at most
    ``lambda_max * n_features * max(eps64, eps_in**2)``, with ``eps_in`` the
    machine epsilon of the input dtype.

    - ``n_features * eps64 * lambda_max`` bounds the rounding error of a
      symmetric eigen-solver on the Gram matrix, so nothing smaller can be
      told apart from zero.
    - Input rounded to float32 moves an exactly rank-deficient design's zero
      singular values to about ``eps32 * sigma_max``, i.e. its zero
      eigenvalues to about ``eps32**2 * lambda_max``; float32 data therefore
      uses ``n_features * eps32**2`` (about 1.4e-14 per feature).
    - The rule is relative to ``lambda_max``, so multiplying X by any c > 0
      (which multiplies every eigenvalue by c**6) does not change the verdict.

    Parameters
    ----------
    lambda_max : float
        Largest eigenvalue of the (unnormalised or normalised) Gram matrix.
    n_features : int
        Number of features psi.
    dtype : dtype, default=float64
        The least precise floating dtype of the input sequences.

    Returns
    -------
    tol : float

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._solvers import eigenvalue_tolerance
    >>> eigenvalue_tolerance(1.0, 10) == 10 * float(np.finfo(np.float64).eps)
    True
    """
    # Python floats throughout: a float32 epsilon would make the product
    # float32, which rounds the threshold and overflows for lambda_max > 3e38.
    eps_in = float(np.finfo(np.dtype(dtype)).eps) if np.dtype(dtype).kind == "f" else 0.0
    rel = max(float(np.finfo(np.float64).eps), eps_in**2)
    return float(lambda_max) * n_features * rel


def feature_rows(X, lengths, Y=None, *, readout="last"):
    """Feature rows (and their targets) the least squares is solved over.

    For ``"last"`` one row per sequence; for ``"all"`` one row per real token
    (the features of the prefix ending there).  Padded positions are dropped.

    Returns
    -------
    Phi : ndarray of shape (n_rows, psi)
    Y_rows : ndarray of shape (n_rows, d_out) or None
    """
    if readout == "last":
        return attention_features(X, lengths), Y
    H = prefix_features(X, lengths)
    real = np.arange(X.shape[1])[None, :] < lengths[:, None]
    return H[real], None if Y is None else Y[real]


# --------------------------------------------------------------------------
# Chunks of sequences
# --------------------------------------------------------------------------


def _load_chunk(X, lengths, sl, standardizer=None):
    """Float64 chunk ``X[sl]``, zeros at positions ``>= lengths`` (NaN allowed there), standardized."""
    Xc = np.asarray(X[sl], dtype=np.float64)
    lc = lengths[sl]
    if lc.size and lc.min() < Xc.shape[1]:
        pad = np.arange(Xc.shape[1])[None, :] >= lc[:, None]
        Xc = np.where(pad[:, :, None], 0.0, Xc)
    if standardizer is not None:
        Xc = standardizer.transform(Xc)
    return Xc, lc


def _row_values(d, n_tokens, readout, per_row):
    """Float64 values one sequence occupies in a chunk's work arrays."""
    P = d * (d + 1) // 2
    rows = 1 if readout == "last" else n_tokens
    moments = d * d if readout == "last" else n_tokens * P
    return n_tokens * d + moments + rows * per_row


def _chunk_rows(X, lengths, sl, readout, Y=None, sample_weight=None, standardizer=None):
    """Row factors of one chunk with their targets and weights; zero-weight rows dropped.

    Everything is returned in the standardizer's units (tokens, targets and
    weights); which rows are kept depends on the weights as given.
    """
    Xc, lc = _load_chunk(X, lengths, sl, standardizer)
    S, x, sample = row_factors(Xc, lc, readout)
    if standardizer is not None:
        S = standardizer.scale_moments(S)
    Yr = None
    if Y is not None:
        Yc = np.asarray(Y[sl], dtype=np.float64)
        if readout == "last":
            Yr = Yc
        elif lc.size == 0 or lc.min() == Yc.shape[1]:
            Yr = Yc.reshape(-1, Yc.shape[2])
        else:
            Yr = Yc[np.arange(Xc.shape[1])[None, :] < lc[:, None]]
        if standardizer is not None:
            Yr = standardizer.transform_targets(Yr)
    w = None
    if sample_weight is not None:
        raw = sample_weight[sl][sample]
        keep = raw > 0
        w = raw if standardizer is None else standardizer.transform_weights(raw)
        if not keep.all():
            S, x, w = S[keep], x[keep], w[keep]
            Yr = None if Yr is None else Yr[keep]
    return S, x, w, Yr


def _check_batch(X, lengths, Y, sample_weight, d, d_out, readout):
    """Shapes of an internal batch (zero-padded arrays, as the package's validation returns)."""
    X = np.asarray(X)
    if X.ndim != 3 or X.shape[2] != d:
        raise ValueError(
            f"X must be a zero-padded array of shape (n_samples, n_tokens, {d}); got shape "
            f"{X.shape}."
        )
    lengths = check_lengths_array(lengths, X.shape[0], X.shape[1])
    if (Y is None) != (d_out is None):
        raise ValueError(
            "Y must be given exactly when the statistics have targets: these statistics "
            f"have d_out={d_out}, got Y={'None' if Y is None else 'an array'}."
        )
    if Y is not None:
        Y = np.asarray(Y)
        expected = (X.shape[0], d_out) if readout == "last" else (*X.shape[:2], d_out)
        if Y.shape != expected:
            raise ValueError(
                f"Y must have shape {expected} for readout={readout!r}; got shape {Y.shape}."
            )
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
        if sample_weight.shape != (X.shape[0],):
            raise ValueError(
                f"sample_weight must have shape ({X.shape[0]},); got shape "
                f"{sample_weight.shape}."
            )
        if not np.all(np.isfinite(sample_weight)) or np.any(sample_weight < 0):
            raise ValueError("sample_weight must hold finite non-negative numbers.")
    return X, lengths.astype(np.int64, copy=False), Y, sample_weight


# --------------------------------------------------------------------------
# Sufficient statistics
# --------------------------------------------------------------------------


def _pair_offsets(P):
    """Start of each row block p (pairs (p, q), q >= p) in triu order."""
    return np.concatenate([[0], np.cumsum(P - np.arange(P))])


class SufficientStatistics:
    """Running ``Phi^T W Phi``, ``Phi^T W Y`` and target moments over feature rows.

    The Gram matrix ``G[(p, l), (q, m)] = sum_r w_r S_rp S_rq x_rl x_rm`` is
    symmetric in ``(p, q)`` and in ``(l, m)`` separately, so only about a
    quarter of its psi**2 entries differ.  They are stored compactly and
    accumulated by one GEMM per chunk of rows (pair products of the folded
    moments times pair products of the tokens), which takes about half the
    arithmetic of ``Phi.T @ Phi``; :attr:`gram` expands them.

    Parameters
    ----------
    d : int
        Token dimension.
    d_out : int or None, default=None
        Number of outputs; None accumulates the Gram matrix only (for the
        certificate).
    gram : bool, default=True
        False keeps only counts and target moments (solvers that work on the
        data directly).
    standardizer : TokenStandardizer or None, default=None
        Standardized coordinates the rows are accumulated in (see
        :mod:`._standardize`): every statistic is that of the standardized
        tokens, targets and weights.  None accumulates the data as given.

    Attributes
    ----------
    readout : {"last", "all"} or None
        Readout of the accumulated rows; fixed by the first :meth:`update`.
    moment : ndarray of shape (psi, d_out) or None
        ``Phi^T W Y``.
    y_sum, y_sq : ndarray of shape (d_out,) or None
        Weighted sum and sum of squares of the targets.
    n_rows : int
        Number of feature rows with positive weight.
    n_samples : int
        Number of sequences with positive weight.
    weight_sum : float
        Sum of the row weights (``n_rows`` without weights).
    min_weight : float
        Smallest positive row weight (inf before any row).
    dtype : numpy dtype
        The least precise floating dtype seen in the inputs.
    n_tokens : int
        Longest padded length seen.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features
    >>> from sklearn_linattn._solvers import SufficientStatistics
    >>> X = np.random.default_rng(0).normal(size=(30, 4, 2))
    >>> lengths = np.full(30, 4)
    >>> a = SufficientStatistics(2).update(X[:10], lengths[:10])
    >>> b = SufficientStatistics(2).update(X[10:], lengths[10:])
    >>> H = attention_features(X, lengths)
    >>> bool(np.allclose(a.merge(b).gram, H.T @ H)), a.n_rows
    (True, 30)
    """

    def __init__(self, d, d_out=None, *, gram=True, standardizer=None):
        self.d = int(d)
        if self.d < 1:
            raise ValueError(f"d must be a positive integer; got {d!r}.")
        if d_out is not None and int(d_out) < 1:
            raise ValueError(f"d_out must be None or a positive integer; got {d_out!r}.")
        self.d_out = None if d_out is None else int(d_out)
        if standardizer is None:
            standardizer = TokenStandardizer.identity(self.d, self.d_out)
        if standardizer.d != self.d:
            raise ValueError(
                f"the standardizer is for d={standardizer.d}, but these statistics have "
                f"d={self.d}."
            )
        self.standardizer = standardizer
        P = self.d * (self.d + 1) // 2
        psi = n_attention_features(self.d)
        self.readout = None
        self._compact = np.zeros((P * (P + 1) // 2, P)) if gram else None
        # Without the Gram matrix the moment is not accumulated either.
        self.moment = None if self.d_out is None or not gram else np.zeros((psi, self.d_out))
        self.y_sum = None if self.d_out is None else np.zeros(self.d_out)
        self.y_sq = None if self.d_out is None else np.zeros(self.d_out)
        self.n_rows = 0
        self.n_samples = 0
        self.weight_sum = 0.0
        self.min_weight = np.inf
        self.dtype = np.dtype(np.float64)
        self.n_tokens = 0

    def __repr__(self):
        return (
            f"SufficientStatistics(d={self.d}, d_out={self.d_out}, readout={self.readout!r}, "
            f"n_samples={self.n_samples}, n_rows={self.n_rows}, gram={self.has_gram})"
        )

    @property
    def n_features(self):
        """Number of features psi."""
        return n_attention_features(self.d)

    @property
    def has_gram(self):
        """Whether the Gram matrix is accumulated."""
        return self._compact is not None

    @property
    def gram(self):
        """The full Gram matrix ``Phi^T W Phi``, shape (psi, psi).

        Reading it expands the compact storage into a new array; assigning a
        psi x psi matrix with the same symmetries (e.g. ``a.gram += b.gram``)
        stores its distinct entries.
        """
        if self._compact is None:
            raise ValueError(
                "these statistics were accumulated without the Gram matrix (gram=False)."
            )
        P = self.d * (self.d + 1) // 2
        ip, idd = pair_index_matrix(P), pair_index_matrix(self.d)
        G = self._compact[ip[:, None, :, None], idd[None, :, None, :]]
        return G.reshape(self.n_features, self.n_features)

    @gram.setter
    def gram(self, value):
        psi, P = self.n_features, self.d * (self.d + 1) // 2
        value = np.asarray(value, dtype=np.float64)
        if value.shape != (psi, psi):
            raise ValueError(f"gram must have shape ({psi}, {psi}); got {value.shape}.")
        jp, kp = pair_indices(P)
        jd, kd = pair_indices(self.d)
        G4 = value.reshape(P, self.d, P, self.d)
        self._compact = np.ascontiguousarray(
            G4[jp[:, None], jd[None, :], kp[:, None], kd[None, :]]
        )

    @property
    def trace(self):
        """Trace of the Gram matrix (sum of its eigenvalues)."""
        P = self.d * (self.d + 1) // 2
        diag_p = pair_index_matrix(P)[np.arange(P), np.arange(P)]
        diag_l = pair_index_matrix(self.d)[np.arange(self.d), np.arange(self.d)]
        return float(self._compact[np.ix_(diag_p, diag_l)].sum())

    def update(self, X, lengths, Y=None, *, readout="last", sample_weight=None):
        """Add the feature rows of a batch of sequences (processed in chunks).

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_tokens, d)
            Padded sequences (float32 or float64); values at positions
            ``>= lengths`` are ignored (zero or NaN).
        lengths : ndarray of int, shape (n_samples,)
            Number of real tokens of each sequence.
        Y : ndarray or None
            Targets as :func:`~._validation.check_targets` returns them:
            shape (n_samples, d_out) for ``"last"``, (n_samples, n_tokens,
            d_out) for ``"all"``; given exactly when ``d_out`` is not None.
        readout : {"last", "all"}, default="last"
            Must be the same in every call.
        sample_weight : ndarray of shape (n_samples,) or None
            Non-negative weight of each sequence (of each of its positions for
            ``"all"``); rows of weight zero are skipped.

        Returns
        -------
        self : SufficientStatistics
        """
        check_readout(readout)
        if self.readout is not None and readout != self.readout:
            raise ValueError(
                f"readout must stay {self.readout!r} for these statistics; got {readout!r}."
            )
        X, lengths, Y, w = _check_batch(
            X, lengths, Y, sample_weight, self.d, self.d_out, readout
        )
        self.readout = readout
        n_samples, n_tokens = X.shape[:2]
        if np.dtype(X.dtype).kind == "f" and np.dtype(X.dtype).itemsize < self.dtype.itemsize:
            self.dtype = np.dtype(X.dtype)
        self.n_tokens = max(self.n_tokens, int(n_tokens))
        self.n_samples += n_samples if w is None else int(np.count_nonzero(w > 0))
        if self._compact is None:
            self._count(lengths, None if Y is None else self.standardizer.transform_targets(Y),
                        self.standardizer.transform_weights(w), readout, n_tokens)
            return self
        P = self.d * (self.d + 1) // 2
        per_row = 3 * P + 2 * self.d + (self.d_out or 0) * (self.d + 2)
        per_sample = _row_values(self.d, n_tokens, readout, per_row)
        for sl in iter_sample_chunks(n_samples, per_sample):
            S, x, wr, Yr = _chunk_rows(X, lengths, sl, readout, Y, w, self.standardizer)
            self._accumulate(S, x, wr, Yr)
        return self

    def _count(self, lengths, Y, w, readout, n_tokens):
        """Counts and target moments without the Gram matrix."""
        rows = np.ones_like(lengths) if readout == "last" else lengths
        ws = np.ones(lengths.shape[0]) if w is None else w
        pos = ws > 0
        self.n_rows += int(rows[pos].sum())
        self.weight_sum += float((ws * rows).sum())
        if pos.any():
            self.min_weight = min(self.min_weight, float(ws[pos].min()))
        if Y is not None:
            Yf = np.asarray(Y, dtype=np.float64)
            if readout == "all":
                real = np.arange(n_tokens)[None, :] < lengths[:, None]
                Yf = Yf * real[:, :, None]
                wy = ws[:, None, None]
                self.y_sum += (wy * Yf).sum(axis=(0, 1))
                self.y_sq += (wy * Yf * Yf).sum(axis=(0, 1))
            else:
                self.y_sum += (ws[:, None] * Yf).sum(axis=0)
                self.y_sq += (ws[:, None] * Yf * Yf).sum(axis=0)

    def _accumulate(self, S, x, w, Yr):
        """Add the rows ``kron(S_r, x_r)`` with weights w (None: ones) and targets Yr."""
        m, P = S.shape
        if m == 0:
            return
        if self.n_features <= _SMALL_PSI:
            # The moment and y_sq come out of the same SYRK.
            self._accumulate_rows(S, x, w, Yr)
        else:
            self._accumulate_pairs(S, x, w)
        if Yr is not None:
            Yw = Yr if w is None else Yr * w[:, None]
            if self.n_features > _SMALL_PSI:
                self.moment += features_rmatvec(S, x, Yw).T
                self.y_sq += np.einsum("ra,ra->a", Yw, Yr)
            self.y_sum += Yw.sum(axis=0)
        self.n_rows += m
        self.weight_sum += float(m if w is None else w.sum())
        self.min_weight = min(self.min_weight, 1.0 if w is None else float(w.min()))

    def _accumulate_rows(self, S, x, w, Yr):
        """Small psi: transposed feature rows (and targets) and one SYRK per block of rows.

        At psi <= 64 the pair products of :meth:`_accumulate_pairs` save
        little arithmetic and cost more memory traffic than the rows
        themselves, built here with long inner loops (rows along the last
        axis) a cache-sized block at a time.  The targets ride along as
        extra rows, so the same product gives ``Phi^T W Y`` and the weighted
        sums of squares of the targets.
        """
        m, P = S.shape
        d, psi = self.d, self.n_features
        d_out = 0 if Yr is None else Yr.shape[1]
        St, xt = np.ascontiguousarray(S.T), np.ascontiguousarray(x.T)
        Yt = None if Yr is None else np.ascontiguousarray(Yr.T)
        sw = None if w is None else np.sqrt(w)
        step = max(1, _GRAM_BLOCK_VALUES // (psi + d_out))
        buffer = np.empty((psi + d_out, min(step, m)))
        G = np.zeros((psi + d_out, psi + d_out))
        for start in range(0, m, step):
            stop = min(start + step, m)
            H = buffer[:, : stop - start]
            np.multiply(St[:, None, start:stop], xt[None, :, start:stop],
                        out=H[:psi].reshape(P, d, stop - start))
            if Yt is not None:
                H[psi:] = Yt[:, start:stop]
            if sw is not None:
                H *= sw[start:stop]
            G += H @ H.T
        jp, kp = pair_indices(P)
        jd, kd = pair_indices(d)
        index = (jp[:, None] * d + jd[None, :]) * (psi + d_out) + (kp[:, None] * d + kd[None, :])
        self._compact += G.reshape(-1)[index]
        if Yt is not None:
            self.moment += G[:psi, psi:]
            self.y_sq += np.diagonal(G[psi:, psi:])

    def _accumulate_pairs(self, S, x, w):
        """Distinct Gram entries from pair products of the moments and of the tokens."""
        m, P = S.shape
        # Pair products of the moments (rows (p, q), q >= p, in triu order)
        # times pair products of the tokens: a GEMM gives every distinct Gram
        # entry of this chunk.  The pair products are formed a block of rows
        # at a time, small enough to stay in cache until the GEMM reads them.
        St = np.ascontiguousarray(S.T)
        offsets = _pair_offsets(P)
        jd, kd = pair_indices(self.d)
        B = x[:, jd] * x[:, kd]
        if w is not None:
            B *= w[:, None]
        block = max(1, _GRAM_BLOCK_VALUES // m)
        buffer = np.empty(min(offsets[-1], max(block, P)) * m)
        p = 0
        while p < P:
            stop = p + 1  # rows offsets[p]:offsets[stop] of the compact Gram
            while stop < P and offsets[stop + 1] - offsets[p] <= block:
                stop += 1
            start = offsets[p]
            A = buffer[: (offsets[stop] - start) * m].reshape(-1, m)
            for q in range(p, stop):
                np.multiply(St[q:], St[q], out=A[offsets[q] - start : offsets[q + 1] - start])
            self._compact[start : offsets[stop]] += A @ B
            p = stop

    def restandardized(self, standardizer):
        """The same statistics in other standardized coordinates (a new object).

        The feature rows of the two coordinates differ by a Kronecker map
        (:func:`~._standardize.feature_map`) and the weights and targets by
        powers of two, so the Gram matrix and the moment are transformed
        exactly (to rounding) instead of being accumulated again.
        """
        old = self.standardizer
        out = SufficientStatistics(self.d, self.d_out, gram=self.has_gram,
                                   standardizer=standardizer)
        out.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                             for k, v in self.__dict__.items() if k != "standardizer"})
        if standardizer == old:
            return out
        A, B = feature_map(old, standardizer)
        wf = float(np.ldexp(1.0, old.weight_exponent - standardizer.weight_exponent))
        P, d = A.shape[0], self.d
        if self.has_gram:
            G = self.gram.reshape(P, d, P, d)
            G = np.tensordot(A, G, axes=([1], [0]))               # (p', l, q, m)
            G = np.tensordot(B, G, axes=([1], [1])).swapaxes(0, 1)  # (p', l', q, m)
            G = np.tensordot(G, A, axes=([2], [1]))               # (p', l', m, q')
            G = np.tensordot(G, B, axes=([2], [1]))               # (p', l', q', m')
            out.gram = G.reshape(P * d, P * d) * wf
        if self.d_out is not None:
            ey_old = old.y_exponents if old.y_exponents is not None else np.zeros(self.d_out, int)
            ey_new = (standardizer.y_exponents if standardizer.y_exponents is not None
                      else np.zeros(self.d_out, int))
            yf = np.ldexp(wf, ey_old - ey_new)
            if self.moment is not None:
                b = self.moment.reshape(P, d, self.d_out)
                b = np.einsum("ip,jl,pla->ija", A, B, b).reshape(P * d, self.d_out)
                out.moment = b * yf
            out.y_sum = self.y_sum * yf
            out.y_sq = self.y_sq * yf * np.ldexp(1.0, ey_old - ey_new)
        out.weight_sum = self.weight_sum * wf
        out.min_weight = self.min_weight * wf
        return out

    def merge(self, other):
        """Add the statistics of other (disjoint) data, in place.

        Parameters
        ----------
        other : SufficientStatistics
            Same ``d``, ``d_out``, readout and Gram setting.

        Returns
        -------
        self : SufficientStatistics

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn._solvers import SufficientStatistics
        >>> X = np.random.default_rng(0).normal(size=(8, 3, 2))
        >>> Y = X[:, -1, :1]
        >>> whole = SufficientStatistics(2, 1).update(X, np.full(8, 3), Y)
        >>> parts = [SufficientStatistics(2, 1).update(X[i::2], np.full(4, 3), Y[i::2])
        ...          for i in range(2)]
        >>> merged = parts[0].merge(parts[1])
        >>> bool(np.allclose(merged.gram, whole.gram)), merged.n_samples
        (True, 8)
        """
        if not isinstance(other, SufficientStatistics):
            raise TypeError(
                f"other must be a SufficientStatistics; got {type(other).__name__}."
            )
        if (other.d, other.d_out) != (self.d, self.d_out):
            raise ValueError(
                f"cannot merge statistics of d={other.d}, d_out={other.d_out} into "
                f"statistics of d={self.d}, d_out={self.d_out}."
            )
        if other.has_gram != self.has_gram:
            raise ValueError(
                "cannot merge statistics with and without the Gram matrix (gram=True/False)."
            )
        if other.standardizer != self.standardizer:
            raise ValueError(
                "cannot merge statistics accumulated in different standardized coordinates: "
                "create both with the same standardizer."
            )
        if self.readout is not None and other.readout is not None and (
            self.readout != other.readout
        ):
            raise ValueError(
                f"cannot merge statistics of readout={other.readout!r} into statistics of "
                f"readout={self.readout!r}."
            )
        self.readout = self.readout if self.readout is not None else other.readout
        if self.has_gram:
            self._compact += other._compact
        if self.moment is not None:
            self.moment += other.moment
        if self.y_sum is not None:
            self.y_sum += other.y_sum
            self.y_sq += other.y_sq
        self.n_rows += other.n_rows
        self.n_samples += other.n_samples
        self.weight_sum += other.weight_sum
        self.min_weight = min(self.min_weight, other.min_weight)
        if other.dtype.itemsize < self.dtype.itemsize:
            self.dtype = other.dtype
        self.n_tokens = max(self.n_tokens, other.n_tokens)
        return self


# --------------------------------------------------------------------------
# Solutions
# --------------------------------------------------------------------------


@dataclass
class SpectralSolution:
    """Coefficients with what the certificate needs about the Gram spectrum.

    Everything but ``coef`` is about the standardized problem (see
    :mod:`._standardize`): the spectrum, eigenvectors and factor are those of
    ``G = Phi^T W Phi`` for the standardized tokens and weights.

    Attributes
    ----------
    coef : ndarray of shape (d_out, psi) or None
        Coefficients on the data as given (``y = H(X) @ coef.T``).
    standardized_coef : ndarray of shape (d_out, psi) or None
        The same model for the standardized tokens and targets.
    standardizer : TokenStandardizer or None
        The standardized coordinates (None: the data as given).
    tol : float
        Eigenvalues of ``G = Phi^T W Phi`` ``<= tol`` count as zero
        (:func:`eigenvalue_tolerance`).
    lambda_max, lambda_min : float
        Largest and smallest eigenvalue of G (clipped at 0).
    n_features : int
        psi.
    method : str
        The solver that produced it.
    eigenvalues : ndarray of shape (psi,) or None
        All eigenvalues of G in decreasing order (clipped at 0), when the
        solver computed them.
    eigenvectors : ndarray of shape (psi, k) or None
        Orthonormal eigenvectors of the first k eigenvalues (k >= rank; the
        others span the null space).
    factor : ndarray of shape (psi, psi) or None
        Lower Cholesky factor L of G (``"cholesky"``; G is then positive
        definite).
    min_eigenvector : ndarray of shape (psi,) or None
        Unit eigenvector of lambda_min (``"cg"``).
    lambda_min_error : float
        Bound on ``|lambda_min - computed|`` from the iterative eigensolver's
        residual (0 for direct solvers, whose error is rounding).
    trace : float
        Trace of G.
    rank : int
        Number of eigenvalues above tol (``"cg"``: psi if lambda_min is above
        tol, else an upper bound, see ``rank_is_bound``).
    rank_is_bound : bool
        Whether ``rank`` is only an upper bound.
    n_iter : int
        Iterations of an iterative solver (0 for direct ones).
    active_columns : ndarray of int, shape (m,) or None
        ``"lsmr"``: the columns non-zero in some training row; the others are
        null directions of G, and ``eigenvectors`` has shape (m, k) in the
        coordinates of these columns.  None: eigenvectors in all psi
        coordinates.
    """

    coef: np.ndarray | None
    tol: float
    lambda_max: float
    lambda_min: float
    n_features: int
    method: str
    eigenvalues: np.ndarray | None = None
    eigenvectors: np.ndarray | None = None
    factor: np.ndarray | None = None
    min_eigenvector: np.ndarray | None = None
    lambda_min_error: float = 0.0
    trace: float = 0.0
    rank: int = 0
    rank_is_bound: bool = False
    n_iter: int = 0
    active_columns: np.ndarray | None = None
    standardized_coef: np.ndarray | None = None
    standardizer: TokenStandardizer | None = None

    def __post_init__(self):
        # Solvers set the standardized coefficients; the data's own follow.
        if self.standardized_coef is None and self.coef is not None and (
            self.standardizer is None or self.standardizer.is_identity
        ):
            self.standardized_coef = self.coef
        elif self.standardized_coef is not None and self.coef is None:
            self.coef = (self.standardized_coef if self.standardizer is None
                         else self.standardizer.coef_to_user(self.standardized_coef))


def _coef_from_spectrum(w, U, moment, alpha, tol):
    """Ridge / minimum-norm coefficients from (part of) an eigen-decomposition of G.

    ``U`` holds the eigenvectors of the first ``U.shape[1]`` eigenvalues; the
    moment lies in their span (the row space of the design), so the missing
    ones do not matter.  ``alpha`` is a multiple of the identity.
    """
    if moment is None:
        return None
    wk = w[: U.shape[1]]
    proj = U.T @ moment  # (k, d_out)
    denom = wk + alpha
    keep = wk > tol if alpha == 0 else denom > 0
    inv = np.zeros_like(wk)
    inv[keep] = 1.0 / denom[keep]
    return (U @ (inv[:, None] * proj)).T


def _penalized_solve(G, moment, alpha, standardizer):
    """Ridge coefficients ``(G + alpha K K^T)^{-1} moment`` in standardized coordinates.

    ``alpha ||c||**2`` on the user's coefficients is the penalty
    ``alpha K K^T`` on the standardized ones (:meth:`TokenStandardizer.penalty_factors`).
    The system is scaled by a power of two and equilibrated by its diagonal
    (exact for units per coordinate) before a Cholesky factorisation.
    """
    A, B, shift = standardizer.penalty_factors()
    scale = max(float(np.abs(G).max(initial=0.0)), np.finfo(np.float64).tiny)
    m = int(_exponent(scale))
    lp = shift + int(_exponent(alpha))
    top = max(m, lp)
    Ms = np.ldexp(G, -top)
    Ms += np.ldexp(np.kron(A, B), shift - top) * alpha
    b = np.ldexp(moment, -top)
    diag = np.sqrt(np.clip(np.diagonal(Ms), np.finfo(np.float64).tiny, None))
    Ms /= diag[:, None]  # in place: one psi x psi array beside G
    Ms /= diag[None, :]
    try:
        c, low = scipy.linalg.cho_factor(Ms, lower=True, check_finite=False)
        z = scipy.linalg.cho_solve((c, low), b / diag[:, None], check_finite=False)
    except np.linalg.LinAlgError:
        w, U = scipy.linalg.eigh(Ms, check_finite=False)
        keep = w > eigenvalue_tolerance(w.max(), w.size)
        z = (U[:, keep] / w[keep]) @ (U[:, keep].T @ (b / diag[:, None]))
    return (z / diag[:, None]).T


def _ridge_coef(w, U, moment, alpha, tol, standardizer, gram=None):
    """Coefficients for eigenvalues w and eigenvectors U of G (standardized).

    ``alpha`` penalises the user's coefficients; it is a multiple of the
    identity in standardized coordinates only for a pure power-of-two
    scaling, otherwise ``gram`` (or ``U diag(w) U^T``) is solved with the
    penalty by :func:`_penalized_solve`.
    """
    if moment is None:
        return None
    if alpha == 0:
        return _coef_from_spectrum(w, U, moment, 0.0, tol)
    alpha_s = standardizer.alpha(alpha)
    scalar = standardizer.penalty_scalar()
    if scalar is not None:
        return _coef_from_spectrum(w, U, moment, float(np.ldexp(alpha_s, scalar)), tol)
    if gram is None:
        k = U.shape[1]
        gram = (U * w[:k]) @ U.T
    return _penalized_solve(gram, moment, alpha_s, standardizer)


def _dense_solution(w, U, moment, alpha, dtype, method, standardizer, gram=None):
    """SpectralSolution from eigenvalues w (length psi, decreasing) and eigenvectors U."""
    psi = w.shape[0]
    tol = eigenvalue_tolerance(w[0] if psi else 0.0, psi, dtype)
    return SpectralSolution(
        coef=None,
        standardized_coef=_ridge_coef(w, U, moment, alpha, tol, standardizer, gram),
        standardizer=standardizer,
        tol=tol,
        lambda_max=float(w[0]),
        lambda_min=float(w[-1]),
        n_features=psi,
        method=method,
        eigenvalues=w,
        eigenvectors=U,
        trace=float(w.sum()),
        rank=int(np.count_nonzero(w > tol)),
    )


def _check_statistics_finite(stats):
    """Refuse statistics that overflowed (batches of wildly different scales)."""
    if not np.all(np.isfinite(stats._compact)) or (
        stats.moment is not None and not np.all(np.isfinite(stats.moment))
    ):
        raise ValueError(
            "the sufficient statistics overflowed float64: later batches are many orders "
            "of magnitude larger than the first ones (the standardized coordinates are "
            "fixed by the first batch); rescale the data or fit all batches at once."
        )


def solve_eigh(stats, alpha=0.0):
    """Solve the normal equations through ``eigh(Phi^T W Phi)`` (full spectrum)."""
    _check_statistics_finite(stats)
    G = stats.gram
    keep = G.copy() if alpha and stats.moment is not None and (
        stats.standardizer.penalty_scalar() is None) else None
    w, U = scipy.linalg.eigh(G, driver="evr", overwrite_a=True, check_finite=False)
    w, U = np.clip(w[::-1], 0.0, None), U[:, ::-1]
    return _dense_solution(w, U, stats.moment, alpha, stats.dtype, "eigh",
                           stats.standardizer, gram=keep)


def _start_vectors(n, k=1):
    """Deterministic start vectors for the iterative eigensolvers."""
    return np.random.default_rng(0).standard_normal((n, k))


def _cholesky(G):
    """Lower Cholesky factor (Fortran order, computed in place); None if not positive definite."""
    potrf = get_lapack_funcs("potrf", (G,))
    # G is symmetric: its transpose is a Fortran-ordered view of the same matrix.
    L, info = potrf(G.T, lower=1, overwrite_a=1, clean=1)
    return L if info == 0 else None


def _largest_eigenvalue(G):
    """lambda_max of a dense symmetric matrix by Lanczos (relative accuracy _LANCZOS_RTOL)."""
    v0 = _start_vectors(G.shape[0])[:, 0]
    return float(eigsh(G, k=1, which="LA", tol=_LANCZOS_RTOL, v0=v0,
                       return_eigenvectors=False)[0])


def _smallest_eigenvalue(L):
    """lambda_min of ``L L^T`` by Lanczos on its inverse (two triangular solves per step).

    Returns ``(lambda_min, error_bound)`` or None when Lanczos fails.
    """
    psi = L.shape[0]
    trsv = get_blas_funcs("trsv", (L,))

    def inverse(v):
        return trsv(L, trsv(L, v, lower=1), lower=1, trans=1)

    op = LinearOperator((psi, psi), matvec=inverse, dtype=np.float64)
    try:
        mu = float(eigsh(op, k=1, which="LA", tol=_LANCZOS_RTOL,
                         v0=_start_vectors(psi)[:, 0], return_eigenvectors=False)[0])
    except (ArpackNoConvergence, ArpackError):
        return None
    if not np.isfinite(mu) or mu <= 0:
        return None
    return 1.0 / mu, _LANCZOS_RTOL / mu


def solve_cholesky(stats, alpha=0.0):
    """Solve the normal equations through a Cholesky factor of ``Phi^T W Phi``.

    The certificate's extreme eigenvalues come from Lanczos: on G for
    lambda_max, on ``G^{-1} = L^{-T} L^{-1}`` for lambda_min (relative
    accuracy 1e-10, plus the rounding of the factorisation, about
    ``psi * eps * lambda_max`` as for eigh).  The full spectrum is not
    computed.  When G is not positive definite, or lambda_min is within a
    factor 100 of the zero-eigenvalue tolerance, rank and null space matter and
    the solve hands over to :func:`solve_eigh`, so the result is always that
    of the eigh rule.
    """
    psi = stats.n_features
    if stats.n_rows == 0:
        return solve_eigh(stats, alpha)
    _check_statistics_finite(stats)
    G = stats.gram
    if psi <= _SMALL_PSI:
        w = np.clip(scipy.linalg.eigvalsh(G)[::-1], 0.0, None)
        lam_max, lam_min, error = float(w[0]), float(w[-1]), 0.0
    else:
        w = None
        lam_max = _largest_eigenvalue(G)
    tol = eigenvalue_tolerance(lam_max, psi, stats.dtype)
    trace = float(np.trace(G))
    scalar = stats.standardizer.penalty_scalar()
    penalized = alpha > 0 and stats.moment is not None
    G_alpha = None
    if penalized:
        alpha_s = stats.standardizer.alpha(alpha)
        G_alpha = G.copy()
        if scalar is not None:
            G_alpha[np.diag_indices(psi)] += float(np.ldexp(alpha_s, scalar))
    L = _cholesky(G)  # overwrites G
    if L is None:
        return solve_eigh(stats, alpha)
    if w is None:
        found = _smallest_eigenvalue(L)
        if found is None:
            return solve_eigh(stats, alpha)
        lam_min, error = found
    if not lam_min > _CHOLESKY_MARGIN * tol:
        return solve_eigh(stats, alpha)
    coef = None
    if stats.moment is not None:
        if not penalized:
            coef = scipy.linalg.cho_solve((L, True), stats.moment, check_finite=False).T
        elif scalar is not None:
            coef = scipy.linalg.cho_solve((_cholesky(G_alpha), True), stats.moment,
                                          check_finite=False).T
        else:
            coef = _penalized_solve(G_alpha, stats.moment, alpha_s, stats.standardizer)
    return SpectralSolution(
        coef=None,
        standardized_coef=coef,
        standardizer=stats.standardizer,
        tol=tol,
        lambda_max=lam_max,
        lambda_min=lam_min,
        n_features=psi,
        method="cholesky",
        eigenvalues=w,
        factor=L,
        lambda_min_error=error,
        trace=trace,
        rank=psi,
    )


def solve_statistics(stats, alpha=0.0, solver="eigh"):
    """Finish a fit from sufficient statistics: the entry point for external statistics.

    Statistics accumulated anywhere (chunks of a stream, blocks of a
    distributed array combined with :meth:`SufficientStatistics.merge`) give
    the same coefficients and spectrum as a fit on all the data at once.

    Parameters
    ----------
    stats : SufficientStatistics
        With the Gram matrix (``gram=True``) and at least one row.
    alpha : float, default=0.0
        Ridge penalty; 0 gives the minimum-norm least-squares solution.
    solver : {"eigh", "cholesky", "auto"}, default="eigh"
        ``"auto"`` picks by shape as :func:`choose_solver` does.

    Returns
    -------
    solution : SpectralSolution

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._solvers import SufficientStatistics, solve_statistics
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(40, 4, 2))
    >>> y = (X[:, :, 0] ** 2).sum(axis=1) * X[:, -1, 1]  # a linear-attention output
    >>> stats = SufficientStatistics(2, 1).update(X, np.full(40, 4), y[:, None])
    >>> solution = solve_statistics(stats)
    >>> solution.rank, np.round(solution.coef, 8) + 0.0
    (6, array([[0., 1., 0., 0., 0., 0.]]))
    """
    if not isinstance(stats, SufficientStatistics):
        raise TypeError(f"stats must be a SufficientStatistics; got {type(stats).__name__}.")
    if solver == "auto":
        solver = choose_solver("auto", stats.n_rows, stats.n_features, statistics=True)
    if solver not in STATISTICS_SOLVERS:
        raise ValueError(
            f"solver must be one of {('auto',) + STATISTICS_SOLVERS} to solve from sufficient "
            f"statistics; got {solver!r} (it needs the sequences themselves)."
        )
    if not stats.has_gram:
        raise ValueError("stats must hold the Gram matrix (created with gram=True).")
    if stats.n_rows == 0:
        raise ValueError(
            "stats hold no feature row: every sequence so far had zero weight, or none "
            "was added; there is nothing to fit."
        )
    if solver == "cholesky":
        return solve_cholesky(stats, alpha)
    return solve_eigh(stats, alpha)


# --------------------------------------------------------------------------
# Solvers on the data: SVD of the design, dual (kernel) form
# --------------------------------------------------------------------------


def _all_rows(X, lengths, readout, Y=None, sample_weight=None, standardizer=None):
    """Row factors of every row with positive weight, with targets and weights."""
    n_samples, n_tokens, d = X.shape
    P = d * (d + 1) // 2
    per_sample = _row_values(d, n_tokens, readout, 2 * P + 2 * d)
    parts = [
        _chunk_rows(X, lengths, sl, readout, Y, sample_weight, standardizer)
        for sl in iter_sample_chunks(n_samples, per_sample)
    ]
    S = np.concatenate([p[0] for p in parts])
    x = np.concatenate([p[1] for p in parts])
    w = None if sample_weight is None else np.concatenate([p[2] for p in parts])
    Yr = None if Y is None else np.concatenate([p[3] for p in parts])
    return S, x, w, Yr


def solve_svd(X, lengths, Y, *, readout="last", alpha=0.0, sample_weight=None,
              dtype=np.float64, standardizer=None):
    """Solve on the design matrix itself through its SVD (more accurate).

    Conditioning is that of ``W^{1/2} Phi`` rather than of ``Phi^T W Phi``;
    eigenvalues of the Gram matrix are the squared singular values.  Memory
    O(n_rows * psi).
    """
    psi = n_attention_features(X.shape[2])
    standardizer = standardizer or TokenStandardizer.identity(X.shape[2])
    S, x, w, Yr = _all_rows(X, lengths, readout, Y, sample_weight, standardizer)
    Phi = _outer_features(S, x)
    if w is not None:
        sw = np.sqrt(w)
        Phi *= sw[:, None]
        Yr = None if Yr is None else Yr * sw[:, None]
    _, s, Vt = scipy.linalg.svd(Phi, full_matrices=False, lapack_driver="gesdd",
                                check_finite=False)
    eig = np.zeros(psi)
    eig[: s.size] = s**2
    moment = None if Yr is None else Phi.T @ Yr
    return _dense_solution(eig, Vt.T, moment, alpha, dtype, "svd", standardizer)


def solve_dual(X, lengths, Y, *, readout="last", alpha=0.0, sample_weight=None,
               dtype=np.float64, standardizer=None):
    """Solve in the dual (kernel) form, for designs with fewer rows than features.

    ``K = W^{1/2} Phi Phi^T W^{1/2}`` costs O(N^2 d^2) from the kernel
    ``<H_r, H_s> = <S_r, S_s> <x_r, x_s>`` (also between prefixes, so both
    readouts are supported).  With ``K = U diag(mu) U^T``, the nonzero
    eigenvalues of the Gram matrix are mu, its eigenvectors
    ``Phi^T W^{1/2} U mu^{-1/2}``, and the coefficients
    ``Phi^T W^{1/2} (K + alpha I)^+ W^{1/2} y`` (the pseudo-inverse keeps mu
    above the zero-eigenvalue tolerance, giving the minimum-norm solution).
    Memory O(N^2 + N psi); accuracy that of eigh on the Gram matrix.

    With ``alpha > 0`` the penalty is on the user's coefficients, i.e.
    ``alpha K K^T`` on the standardized ones; unless that is a multiple of
    the identity the ridge solution uses the kernel of the user's metric,
    ``Phi (K K^T)^{-1} Phi^T``, which factorises like K (:func:`_dual_ridge`).
    """
    psi = n_attention_features(X.shape[2])
    standardizer = standardizer or TokenStandardizer.identity(X.shape[2])
    S, x, w, Yr = _all_rows(X, lengths, readout, Y, sample_weight, standardizer)
    K = (S @ S.T) * (x @ x.T)
    sw = None if w is None else np.sqrt(w)
    if sw is not None:
        K *= sw[:, None] * sw[None, :]
    mu, U = scipy.linalg.eigh(K, driver="evr", overwrite_a=True, check_finite=False)
    mu, U = np.clip(mu[::-1], 0.0, None), U[:, ::-1]
    m = mu.size
    eig = np.zeros(psi)
    eig[: min(m, psi)] = mu[: min(m, psi)]
    tol = eigenvalue_tolerance(eig[0] if psi else 0.0, psi, dtype)
    # At most psi eigenvalues of K are not zero (K = Phi Phi^T has rank <= psi);
    # with more rows than features the others are rounding of size ~ m eps.
    k = min(m, psi)
    r = int(np.count_nonzero(eig > tol))
    Ur = U[:, :r] if sw is None else U[:, :r] * sw[:, None]
    V = features_rmatvec(S, x, Ur).T / np.sqrt(mu[:r])  # (psi, r) eigenvectors
    coef = None
    scalar = standardizer.penalty_scalar()
    alpha = standardizer.alpha(alpha)
    if Yr is not None and alpha > 0 and scalar is None:
        coef = _dual_ridge(S, x, sw, Yr, alpha, standardizer, tol)
    elif Yr is not None:
        if alpha > 0:
            alpha = float(np.ldexp(alpha, scalar))
        Yw = Yr if sw is None else Yr * sw[:, None]
        proj = U.T @ Yw
        # Pseudo-inverse as in the primal solvers: eigenvalues above tol for
        # alpha = 0, all of them for alpha > 0 (the null space of K maps to
        # zero coefficients either way, so it is left out).
        inv = np.zeros_like(mu)
        n_kept = r if alpha == 0 else k
        inv[:n_kept] = 1.0 / (mu[:n_kept] + alpha)
        a = U @ (inv[:, None] * proj)  # dual coefficients, (m, d_out)
        coef = features_rmatvec(S, x, a if sw is None else a * sw[:, None])
    return SpectralSolution(
        coef=None,
        standardized_coef=coef,
        standardizer=standardizer,
        tol=tol,
        lambda_max=float(eig[0]),
        lambda_min=float(eig[-1]),
        n_features=psi,
        method="dual",
        eigenvalues=eig,
        eigenvectors=V,
        trace=float(eig.sum()),
        rank=r,
    )


def _dual_ridge(S, x, sw, Yr, alpha, standardizer, tol):
    """Ridge coefficients (standardized) from the kernel of the user's metric.

    With ``K K^T = 2**shift (A kron B)`` (:meth:`TokenStandardizer.penalty_factors`)
    and Cholesky factors ``A = La La^T``, ``B = Lb Lb^T``, the rows
    ``kron(La^{-1} S_r, Lb^{-1} x_r)`` have the user's inner products (up to
    ``2**-shift``); ridge on them with ``alpha 2**shift`` and the map back
    ``c = (A^{-1} kron B^{-1}) Phi^T a`` give ``(G + alpha K K^T)^{-1} Phi^T y``.
    """
    A, B, shift = standardizer.penalty_factors()
    La = scipy.linalg.cholesky(A, lower=True, check_finite=False)
    Lb = scipy.linalg.cholesky(B, lower=True, check_finite=False)
    St = scipy.linalg.solve_triangular(La, S.T, lower=True, check_finite=False).T
    xt = scipy.linalg.solve_triangular(Lb, x.T, lower=True, check_finite=False).T
    K = (St @ St.T) * (xt @ xt.T)
    if sw is not None:
        K *= sw[:, None] * sw[None, :]
    mu, U = scipy.linalg.eigh(K, driver="evr", overwrite_a=True, check_finite=False)
    mu = np.clip(mu, 0.0, None)
    a_shift = float(np.ldexp(alpha, shift))
    denom = mu + a_shift
    keep = denom > (eigenvalue_tolerance(mu.max(initial=0.0), mu.size) if a_shift == 0 else 0)
    Yw = Yr if sw is None else Yr * sw[:, None]
    inv = np.zeros_like(mu)
    inv[keep] = 1.0 / denom[keep]
    a = U @ (inv[:, None] * (U.T @ Yw))
    if sw is not None:
        a = a * sw[:, None]
    # (A^{-1} kron B^{-1}) Phi^T a, with rows kron(A^{-1} S_r, B^{-1} x_r).
    SA = scipy.linalg.solve_triangular(La, St.T, lower=True, trans=1, check_finite=False).T
    xB = scipy.linalg.solve_triangular(Lb, xt.T, lower=True, trans=1, check_finite=False).T
    return features_rmatvec(SA, xB, a)


# --------------------------------------------------------------------------
# Matrix-free: preconditioned conjugate gradients and LOBPCG
# --------------------------------------------------------------------------


class _ImplicitGram:
    """``G = Phi^T W Phi`` as products over the row factors; never formed.

    Without a cache, one product ``G V`` (V of shape (psi, k)) recomputes the
    row factors of every chunk of sequences (O(N n d^2)) and does two GEMMs
    with them (O(N d^3 k)).  With ``cache_dtype``, :meth:`setup` keeps the
    folded moments, last tokens and weights of every row (``n_rows * (P + d +
    1)`` values) and :meth:`matmat` is just the two GEMMs, in that dtype.
    A float32 cache makes :meth:`matmat` inexact (relative error about 1e-7):
    :meth:`matmat_exact` then streams float64 products from X, and
    :attr:`exact` is False.
    """

    def __init__(self, X, lengths, readout, sample_weight=None, cache_dtype=None,
                 standardizer=None):
        self.X, self.lengths, self.readout = X, lengths, readout
        self.sample_weight = sample_weight
        self.standardizer = standardizer
        self.n_samples, self.n_tokens, self.d = X.shape
        self.P = self.d * (self.d + 1) // 2
        self.psi = n_attention_features(self.d)
        self.cache_dtype = None if cache_dtype is None else np.dtype(cache_dtype)
        self._cache = None
        self.n_products = 0
        self.n_exact_products = 0

    @property
    def exact(self):
        """Whether :meth:`matmat` is a float64 product."""
        return self._cache is None or self._cache[0].dtype == np.float64

    def _chunks(self, k, Y=None):
        per_row = self.P * (k + 2) + self.d * (k + 2)
        per_sample = _row_values(self.d, self.n_tokens, self.readout, per_row)
        for sl in iter_sample_chunks(self.n_samples, per_sample):
            yield _chunk_rows(self.X, self.lengths, sl, self.readout, Y, self.sample_weight,
                              self.standardizer)

    def matmat(self, V):
        """``G @ V`` for V of shape (psi, k), from the cache when there is one."""
        V = np.asarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat(V[:, None])[:, 0]
        if self._cache is None:
            return self.matmat_exact(V)
        S_all, x_all, w_all = self._cache
        k = V.shape[1]
        out = np.zeros((k, self.psi))
        Vt = np.ascontiguousarray(V.T, dtype=S_all.dtype)
        for sl in iter_sample_chunks(S_all.shape[0], 3 * self.d * k + k):
            S, x = S_all[sl], x_all[sl]
            U = features_matvec(S, x, Vt)
            if w_all is not None:
                U *= w_all[sl, None]
            out += features_rmatvec(S, x, U)
        self.n_products += 1
        return out.T

    def matmat_exact(self, V):
        """``G @ V`` in float64 (streamed from X unless the cache is float64)."""
        V = np.asarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat_exact(V[:, None])[:, 0]
        if self.exact and self._cache is not None:
            return self.matmat(V)
        k = V.shape[1]
        out = np.zeros((k, self.psi))
        Vt = np.ascontiguousarray(V.T)
        for S, x, w, _ in self._chunks(k):
            U = features_matvec(S, x, Vt)
            if w is not None:
                U *= w[:, None]
            out += features_rmatvec(S, x, U)
        self.n_exact_products += 1
        if self._cache is None:
            self.n_products += 1
        return out.T

    def setup(self, Y=None):
        """One pass: ``Phi^T W Y``, the Kronecker factors, the trace and the counts."""
        A = np.zeros((self.P, self.P))
        B = np.zeros((self.d, self.d))
        d_out = None if Y is None else Y.shape[-1]
        b = None if Y is None else np.zeros((d_out, self.psi))
        y_sum = None if Y is None else np.zeros(d_out)
        y_sq = None if Y is None else np.zeros(d_out)
        trace, n_rows, weight_sum, min_weight = 0.0, 0, 0.0, np.inf
        if self.cache_dtype is not None:
            total = _n_rows(self.lengths, self.readout, self.sample_weight)
            cache = (np.empty((total, self.P), dtype=self.cache_dtype),
                     np.empty((total, self.d), dtype=self.cache_dtype),
                     None if self.sample_weight is None
                     else np.empty(total, dtype=self.cache_dtype))
        for S, x, w, Yr in self._chunks(max(1, d_out or 1), Y):
            m = S.shape[0]
            if m == 0:
                continue
            if self.cache_dtype is not None:
                cache[0][n_rows : n_rows + m] = S
                cache[1][n_rows : n_rows + m] = x
                if w is not None:
                    cache[2][n_rows : n_rows + m] = w
            if w is None:
                Sw, xw, rw = S, x, np.ones(m)
            else:
                sw = np.sqrt(w)[:, None]
                Sw, xw, rw = S * sw, x * sw, w
            A += Sw.T @ Sw
            B += xw.T @ xw
            trace += float(rw @ (np.einsum("rp,rp->r", S, S) * np.einsum("rl,rl->r", x, x)))
            n_rows += m
            weight_sum += float(rw.sum())
            min_weight = min(min_weight, float(rw.min()))
            if Yr is not None:
                Yw = Yr * rw[:, None]
                b += features_rmatvec(S, x, Yw)
                y_sum += Yw.sum(axis=0)
                y_sq += np.einsum("ra,ra->a", Yw, Yr)
        if self.cache_dtype is not None:
            self._cache = cache
        return dict(A=A, B=B, b=b, y_sum=y_sum, y_sq=y_sq, trace=trace, n_rows=n_rows,
                    weight_sum=weight_sum, min_weight=min_weight)


class _KroneckerPreconditioner:
    """Inverse of ``(A kron B) / W + alpha (A_P kron B_P)``, an approximation of ``G + alpha P``.

    ``A = S^T W S`` (P x P) and ``B = x^T W x`` (d x d) are the second
    moments of the two factors of the rows ``kron(S_r, x_r)``; if they were
    independent, ``E[h h^T] = E[S S^T] kron E[x x^T]``.  The ridge penalty
    ``alpha P`` is ``alpha I`` (``penalty=None``) or the Kronecker product
    ``2**shift (A_P kron B_P)`` of :meth:`TokenStandardizer.penalty_factors`;
    either way the generalized eigenvectors of ``(A, A_P)`` and ``(B, B_P)``
    diagonalise both terms, so applying the inverse costs O(P^2 d + P d^2)
    per vector.  ``range(G)`` lies in ``range(A) kron range(B)``: the
    positive-semidefinite version (``definite=False``, alpha = 0) inverts
    there and is zero elsewhere, so that iterates never leave the span of
    the data.
    """

    def __init__(self, A, B, weight_sum, alpha, dtype, penalty=None):
        self.P, self.d = A.shape[0], B.shape[0]
        self.orthogonal = penalty is None
        if penalty is None:
            wa, self.Ua = scipy.linalg.eigh(A, check_finite=False)
            wb, self.Ub = scipy.linalg.eigh(B, check_finite=False)
        else:
            PA, PB, shift = penalty
            wa, self.Ua = scipy.linalg.eigh(A, PA, check_finite=False)
            wb, self.Ub = scipy.linalg.eigh(B, PB, check_finite=False)
            alpha = float(np.ldexp(alpha, shift))
        wa, wb = np.clip(wa, 0.0, None), np.clip(wb, 0.0, None)
        keep = (wa > eigenvalue_tolerance(wa.max(), self.P, dtype))[:, None] & (
            wb > eigenvalue_tolerance(wb.max(), self.d, dtype)
        )[None, :]
        D = np.outer(wa, wb) / max(weight_sum, np.finfo(np.float64).tiny)
        D = D + min(alpha, np.finfo(np.float64).max / 4)
        self.inv = np.zeros_like(D)
        if alpha > 0:
            self.inv = 1.0 / np.maximum(D, np.finfo(np.float64).tiny)
        else:
            self.inv[keep] = 1.0 / D[keep]
        floor = eigenvalue_tolerance(D.max(), self.P * self.d, dtype)
        self.inv_definite = 1.0 / np.maximum(D, max(floor, np.finfo(np.float64).tiny))
        # Extreme eigenvalues of the definite M (the inverse of inv_definite).
        self.min_eigenvalue = float(1.0 / self.inv_definite.max())
        self.max_eigenvalue = float(1.0 / self.inv_definite.min())

    def apply(self, R, definite=False):
        return self._diagonal_product(R, self.inv_definite if definite else self.inv)

    def multiply(self, R):
        """``M R`` for the definite M whose inverse is ``apply(R, definite=True)``."""
        if not self.orthogonal:
            raise ValueError("multiply needs the preconditioner of G alone (penalty=None).")
        return self._diagonal_product(R, 1.0 / self.inv_definite)

    def _diagonal_product(self, R, diagonal):
        R = np.asarray(R, dtype=np.float64)
        if R.ndim == 1:
            return self._diagonal_product(R[:, None], diagonal)[:, 0]
        k = R.shape[1]
        R3 = R.T.reshape(k, self.P, self.d)
        Z = self.Ua.T @ R3 @ self.Ub
        Z *= diagonal
        return (self.Ua @ Z @ self.Ub.T).reshape(k, -1).T


def _kronecker_product(factors, alpha):
    """``alpha 2**shift (A kron B) V`` for V of shape (psi, k), factors ``(A, B, shift)``."""
    A, B, shift = factors
    P, d = A.shape[0], B.shape[0]

    def product(V):
        k = V.shape[1]
        V3 = V.T.reshape(k, P, d)
        return np.ldexp(A @ V3 @ B, shift).reshape(k, -1).T * alpha
    return product


def _pcg(matmat, Bm, precond, penalty, rtol, max_iter, exact=None, record=None, stop=None):
    """Preconditioned CG on ``(G + penalty) X = Bm``, one independent recurrence per column.

    ``penalty`` is None or a function returning the ridge term's product
    ``alpha P V`` for a block V.

    Columns stop when ``||residual|| <= rtol * ||b||``; the products of the
    still-active columns share one pass over the data.

    ``exact``, when given, is an accurate product and ``matmat`` a cheaper,
    inexact one (the float32 cache).  The recursive residual is then
    replaced by the exact ``Bm - (G + penalty) X`` (residual replacement,
    van der Vorst and Ye 2000) whenever it has fallen by ``_CG_REPLACE``
    since the last replacement, and before a column stops: only exact
    residuals stop a column, so ``rtol`` holds for the exact system.

    ``record`` (a :class:`_LanczosRecord`) keeps the Lanczos vectors and
    coefficients of the first column; ``stop(n_iter)``, checked before every
    iteration, ends all columns when it returns True.
    """
    psi, k = Bm.shape
    X = np.zeros_like(Bm)
    R = Bm.copy()
    bnorm = np.linalg.norm(Bm, axis=0)
    Z = precond(R)
    D = Z.copy()
    rz = np.einsum("ik,ik->k", R, Z)
    if record is not None:
        record.add(Z[:, 0], rz[0])
    active = (bnorm > 0) & (rz > 0)
    rel = np.where(bnorm > 0, 1.0, 0.0)
    replaced = rel.copy()  # relative residual at the last replacement
    n_iter = 0
    while True:
        rel[active] = np.linalg.norm(R[:, active], axis=0) / bnorm[active]
        if exact is not None:
            check = active & ((rel <= rtol) | (rel <= _CG_REPLACE * replaced))
            if check.any():
                idx = np.flatnonzero(check)
                Q = exact(X[:, idx])
                if penalty is not None:
                    Q += penalty(X[:, idx])
                R[:, idx] = Bm[:, idx] - Q
                rel[idx] = np.linalg.norm(R[:, idx], axis=0) / bnorm[idx]
                replaced[idx] = rel[idx]
                rz[idx] = np.einsum("ik,ik->k", R[:, idx], precond(R[:, idx]))
        active &= rel > rtol
        if not active.any() or n_iter >= max_iter or (stop is not None and stop(n_iter)):
            break
        idx = np.flatnonzero(active)
        Da = D[:, idx]
        Q = matmat(Da)
        if penalty is not None:
            Q += penalty(Da)
        dq = np.einsum("ik,ik->k", Da, Q)
        ok = dq > 0
        step = np.where(ok, rz[idx] / np.where(ok, dq, 1.0), 0.0)
        X[:, idx] += step * Da
        R[:, idx] -= step * Q
        Za = precond(R[:, idx])
        rz_new = np.einsum("ik,ik->k", R[:, idx], Za)
        beta = np.where(rz[idx] > 0, rz_new / np.where(rz[idx] > 0, rz[idx], 1.0), 0.0)
        D[:, idx] = Za + beta * Da
        rz[idx] = rz_new
        if record is not None and idx[0] == 0:
            if ok[0]:
                record.add(Za[:, 0], rz_new[0], step[0], beta[0])
            else:
                record.null_direction = Da[:, 0].copy()  # G d = 0 to rounding
        active[idx[~ok | (rz_new <= 0)]] = False  # exact solution or breakdown
        n_iter += 1
    nonzero = bnorm > 0
    if exact is not None and nonzero.any():
        # Report exact residuals (a column may have stopped on a breakdown or at max_iter).
        stale = np.flatnonzero(nonzero & (replaced != rel))
        if stale.size:
            Q = exact(X[:, stale])
            if penalty is not None:
                Q += penalty(X[:, stale])
            R[:, stale] = Bm[:, stale] - Q
    rel[nonzero] = np.linalg.norm(R[:, nonzero], axis=0) / bnorm[nonzero]
    return X, n_iter, rel


class _LanczosRecord:
    """Lanczos vectors and coefficients of the first column of preconditioned CG.

    Preconditioned CG on ``G x = b`` (preconditioner ``M^{-1}``) is Lanczos on
    the pencil ``(G, M)``: the vectors ``(-1)^k z_k / sqrt(r_k^T z_k)`` (z_k
    the preconditioned residuals) are M-orthonormal, and the step lengths
    alpha_k and ratios beta_k give their tridiagonal matrix,
    ``T_kk = 1/alpha_k + beta_{k-1}/alpha_{k-1}``, ``T_{k,k+1} =
    sqrt(beta_k)/alpha_k``.  Vectors are kept in float32 (for Ritz vectors
    that are then checked with exact products).
    """

    def __init__(self, psi, max_steps):
        self.vectors = np.empty((max_steps, psi), dtype=np.float32)
        self.alphas, self.betas = np.empty(max_steps), np.empty(max_steps)
        self.k = 0  # completed steps (alpha_k, beta_k known)
        self.null_direction = None

    def add(self, z, rz, alpha=None, beta=None):
        """Record the step just taken (alpha, beta), then the new residual's vector."""
        if alpha is not None:
            self.alphas[self.k], self.betas[self.k] = alpha, beta
            self.k += 1
        if self.k < self.vectors.shape[0] and rz > 0:
            self.vectors[self.k] = z * ((-1.0) ** self.k / np.sqrt(rz))

    @property
    def full(self):
        return self.k >= self.vectors.shape[0]

    def ritz(self, n):
        """The n smallest Ritz values of the pencil and their coefficient vectors."""
        k, a, b = self.k, self.alphas, self.betas
        diag = 1.0 / a[:k]
        diag[1:] += b[: k - 1] / a[: k - 1]
        if k == 1:
            return diag, np.ones((1, 1))
        return scipy.linalg.eigh_tridiagonal(diag, np.sqrt(b[: k - 1]) / a[: k - 1],
                                             select="i", select_range=(0, min(n, k) - 1))

    def ritz_vectors(self, Y):
        return (self.vectors[: self.k].T @ Y.astype(np.float32)).astype(np.float64)


def _pencil_lanczos(op, precond, tol, block, memory_budget=None):
    """Bounds on lambda_min of the implicit G: a randomized lower one, a Rayleigh quotient above.

    Preconditioned CG (:func:`_pcg`, M^{-1} the definite Kronecker
    preconditioner) solves ``G x = b`` for a standard normal b.  For a unit
    eigenvector u of lambda_min, ``u^T r = u^T b - lambda_min u^T x`` with
    ``r = b - G x``, so ``lambda_min >= (|u^T b| - ||r||) / ||x||``; u does
    not depend on b, so ``u^T b`` is standard normal and ``|u^T b| >= delta``
    except with probability ``<= delta sqrt(2 / pi)``.  Hence

        lower = (delta - ||r||) / ||x||,  delta = 1e-3,

    is a lower bound on lambda_min except with probability 8e-4 over b,
    whatever the data, with ``r`` the exact (float64) residual.  CG stops
    when ``||r|| <= delta / 2`` (then lower is within a factor 2 of what the
    bound can give), when its first column's Lanczos matrix (CG is Lanczos
    on the pencil ``(G, M)``, :class:`_LanczosRecord`) has a Ritz value
    theta_1 with ``theta_1 lambda_max(M) <= tol`` (a null direction: no
    solution to converge to), or after ``_PENCIL_MAX_ITER`` steps (fewer when
    the float32 Lanczos vectors would take more than 1/16 of the memory
    budget).  The Ritz vectors of the ``block`` smallest Ritz values then get
    an exact Rayleigh-Ritz step of the pencil; ``upper`` is the smallest
    Rayleigh quotient of G among them (a lambda_min ``<= upper`` for sure).

    Returns
    -------
    dict with lower, upper, vector (of upper), vectors (all, for LOBPCG),
    values (the Rayleigh quotients of G, increasing), n_iter.
    """
    psi = op.psi
    budget = default_memory_budget() if memory_budget is None else memory_budget
    max_iter = int(min(_PENCIL_MAX_ITER, max(2 * _PENCIL_CHECK,
                                             _PENCIL_MEMORY_FRACTION * budget // (4 * psi))))
    record = _LanczosRecord(psi, max_iter)
    m_max = precond.max_eigenvalue
    b = _start_vectors(psi, 2)[:, 1:]

    def stop(n_iter):
        if record.full:
            return True
        if n_iter == 0 or n_iter % _PENCIL_CHECK:
            return False
        return bool(record.ritz(1)[0][0] * m_max <= tol)

    def inverse(R):
        return precond.apply(R, True)

    b_norm = np.linalg.norm(b)
    exact = None if op.exact else op.matmat_exact
    x, n_iter, rel = _pcg(op.matmat, b, inverse, None, 0.5 * _RANDOM_DELTA / b_norm, max_iter,
                          exact=exact, record=record, stop=stop)
    # With ``exact``, _pcg reports exact residuals; otherwise its residual is
    # the recursive one, and matmat is itself the exact product.
    residual = rel[0] * b_norm if exact is not None else np.linalg.norm(b - op.matmat(x))
    x = x[:, 0]
    x_norm = np.linalg.norm(x)
    lower = (_RANDOM_DELTA - residual) / x_norm if x_norm > 0 else -np.inf

    vectors = []
    if record.k > 0:
        vectors.append(record.ritz_vectors(record.ritz(block)[1]))
    if record.null_direction is not None:
        vectors.append(record.null_direction[:, None])
    if not vectors:
        vectors.append(b)
    W = np.linalg.qr(np.hstack(vectors))[0]
    # Exact Rayleigh-Ritz of the pencil on span(W).
    GW, MW = op.matmat_exact(W), precond.multiply(W)
    _, C = scipy.linalg.eigh((W.T @ GW + GW.T @ W) / 2, (W.T @ MW + MW.T @ W) / 2)
    W, GW = W @ C, GW @ C
    rho = np.einsum("ik,ik->k", W, GW) / np.einsum("ik,ik->k", W, W)
    order = np.argsort(rho)
    best = order[0]
    return dict(lower=float(lower), upper=max(float(rho[best]), 0.0),
                vector=W[:, best] / np.linalg.norm(W[:, best]), vectors=W[:, order],
                values=np.clip(rho[order], 0.0, None), n_iter=n_iter)


def _implicit_extremes(op, precond, dtype, block=_LOBPCG_BLOCK, memory_budget=None):
    """lambda_max, lambda_min (with eigenvector and error bound) of the implicit G.

    lambda_max by Lanczos (ARPACK, relative accuracy 1e-8; on a float32
    cache, Lanczos to 1e-4 and then the exact float64 Rayleigh quotient of
    its Ritz vector, a lower bound with error of order 1e-8 relative).

    lambda_min in two stages.  First preconditioned CG from a random
    right-hand side (:func:`_pencil_lanczos`) gives an interval ``[lower,
    upper]`` that contains lambda_min: upper is a Rayleigh quotient of G,
    lower a randomized bound (it fails with probability at most 8e-4).  When
    the interval is on one side of the zero threshold tol, the verdict is
    decided and lambda_min is reported as upper with error ``upper -
    max(lower, 0)``.  Otherwise LOBPCG takes over, on G itself with the Kronecker preconditioner and a block of
    ``block`` vectors started from the pencil's Ritz vectors, run in rounds
    of 30 iterations (each round restarts from the previous Ritz vectors).
    After each round the two smallest Ritz vectors get an exact (float64)
    Rayleigh-Ritz step and residuals: theta, a Rayleigh quotient, is
    ``>= lambda_min``, and the error bound of :func:`_ritz_error` is the
    residual ``||G v - theta v||`` or, once the second Ritz value is
    separated from the first, the Kato-Temple bound ``r**2 / gap``.  LOBPCG
    stops when that bound is at most ``max(1e-4 * theta, tol / 2)``, after
    300 iterations, or as soon as continuing cannot pay off: a round did not
    reduce the bound, or its rate of decrease, extrapolated to 300
    iterations, reaches neither that target nor (while the verdict is
    undecided) ``theta - tol``.  The two stages' intervals are intersected;
    whatever the error then, it is reported, and a warning says when it
    leaves the verdict undecided.

    LOBPCG's bound assumes, as every Ritz-value bound must, that its smallest
    Ritz value approximates the smallest eigenvalue (not one above it).

    Returns
    -------
    dict with lambda_max, lambda_min, error, vector, tol, values (Rayleigh
    quotients of the Ritz vectors, increasing), n_iter (pencil Lanczos
    steps plus LOBPCG iterations).
    """
    psi = op.psi
    if psi < 5 * block:
        # Too small for LOBPCG (scipy would form the matrix anyway).
        G = op.matmat_exact(np.eye(psi))
        w, U = scipy.linalg.eigh((G + G.T) / 2)
        w = np.clip(w, 0.0, None)
        tol = eigenvalue_tolerance(w[-1], psi, dtype)
        return dict(lambda_max=float(w[-1]), lambda_min=float(w[0]), error=0.0,
                    vector=U[:, 0], tol=tol, values=w[:block], n_iter=0)
    gop = LinearOperator((psi, psi), matvec=op.matmat, matmat=op.matmat, dtype=np.float64)
    rtol_max = _IMPLICIT_LMAX_RTOL if op.exact else _IMPLICIT_LMAX_RTOL_FLOAT32
    lam_max, v_max = eigsh(gop, k=1, which="LA", tol=rtol_max, v0=_start_vectors(psi)[:, 0])
    lam_max = float(lam_max[0])
    if not op.exact:
        v_max = v_max[:, 0] / np.linalg.norm(v_max[:, 0])
        lam_max = float(v_max @ op.matmat_exact(v_max))
    lam_max = max(lam_max, 0.0)
    tol = eigenvalue_tolerance(lam_max, psi, dtype)

    pencil = _pencil_lanczos(op, precond, tol, block, memory_budget)
    lower, upper = pencil["lower"], pencil["upper"]
    if lower > tol or upper <= tol:
        return dict(lambda_max=lam_max, lambda_min=upper, error=upper - max(lower, 0.0),
                    vector=pencil["vector"], tol=tol, values=pencil["values"],
                    n_iter=pencil["n_iter"])

    mop = LinearOperator((psi, psi), matvec=lambda r: precond.apply(r, True),
                         matmat=lambda r: precond.apply(r, True), dtype=np.float64)
    V = pencil["vectors"][:, :block]
    if V.shape[1] < block:
        V = np.hstack([V, _start_vectors(psi, block)[:, V.shape[1]:]])
    target = _LOBPCG_RTOL * lam_max
    steps = _LOBPCG_FIRST_ROUND
    n_iter, error = 0, np.inf
    while True:
        steps = min(steps, _LOBPCG_MAX_ITER - n_iter)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values, V = lobpcg(gop, V, M=mop, largest=False, tol=target, maxiter=steps)
        n_iter += steps
        order = np.argsort(values)
        values, V = values[order], V[:, order]
        # Exact Rayleigh-Ritz on the two smallest Ritz vectors.
        W = np.linalg.qr(V[:, :2])[0]
        GW = op.matmat_exact(W)
        theta, Yr = np.linalg.eigh((W.T @ GW + GW.T @ W) / 2)
        W, GW = W @ Yr, GW @ Yr
        resid = np.linalg.norm(GW - W * theta, axis=0)
        previous, error = error, _ritz_error(theta, resid)
        target = max(_LOBPCG_RTOL * max(theta[0], 0.0), 0.5 * tol)
        if error <= target or n_iter >= _LOBPCG_MAX_ITER:
            break
        if np.isfinite(previous):
            if not error < previous:
                break
            # Where this round's rate of decrease would take the bound by the
            # iteration cap: stop if that reaches neither the accuracy target
            # nor, while the verdict is undecided, a decided verdict.
            undecided = theta[0] - error <= tol < theta[0]
            goal = max(target, theta[0] - tol) if undecided else target
            rate = (error / previous) ** (1.0 / steps)
            if error * rate ** (_LOBPCG_MAX_ITER - n_iter) > goal:
                break
        steps = _LOBPCG_ROUND
    values = np.concatenate([theta, values[2:]])
    # Intersect the two intervals [theta - error, theta] and [lower, upper].
    vector = W[:, 0]
    lower = max(lower, float(theta[0]) - error)
    if upper < theta[0]:
        vector = pencil["vector"]
    else:
        upper = max(float(theta[0]), 0.0)
    error = upper - max(lower, 0.0)
    if lower <= tol < upper:
        warnings.warn(
            f"The certificate resolved lambda_min = {upper:.3g} of the unnormalised Gram "
            f"matrix Phi^T W Phi only to +-{error:.3g} after {pencil['n_iter']} CG steps "
            f"and {n_iter} LOBPCG iterations, which cannot tell it from the zero threshold "
            f"{tol:.3g} (same units; the certificate reports all three divided by the sum of "
            "the row weights): it says 'not identifiable' for lack of accuracy.",
            ConvergenceWarning,
        )
    return dict(lambda_max=lam_max, lambda_min=upper, error=error, vector=vector, tol=tol,
                values=values, n_iter=pencil["n_iter"] + n_iter)


def _ritz_error(theta, resid):
    """Error bound of the smallest Ritz value theta[0] from the two smallest Ritz pairs.

    ``theta[0] >= lambda_1`` (a Rayleigh quotient), and some eigenvalue lies
    within ``resid[0]`` of it.  If the second Ritz pair approximates lambda_2,
    then ``lambda_2 >= mu = theta[1] - resid[1]`` and the Kato-Temple
    inequality gives ``theta[0] - lambda_1 <= resid[0]**2 / (mu - theta[0])``
    when ``mu > theta[0]``, which is much smaller once the residual is small.
    """
    r = float(resid[0])
    mu = float(theta[1] - resid[1])
    if mu > theta[0]:
        return min(r, r * r / (mu - float(theta[0])))
    return r


def _cg_cache_dtype(n_rows, d, memory_budget=None):
    """Dtype of the row-factor cache of "cg": float64 or float32 if it fits, else None.

    The cache holds ``n_rows * (P + d + 1)`` values: float64 when they fit in
    1/8 of ``memory_budget`` (None: :func:`default_memory_budget`), else
    float32 when they fit in 1/4 of it.  (d = 64, N = 150 000: 2.6 GB in
    float64, 1.3 GB in float32; with 24 GB of memory the budget is 12 GB and
    the cache float32.)
    """
    budget = default_memory_budget() if memory_budget is None else memory_budget
    values = n_rows * (d * (d + 1) // 2 + d + 1)
    for dtype, fraction in _CG_CACHE_FRACTION.items():
        if values * dtype.itemsize <= fraction * budget:
            return dtype
    return None


def solve_cg(X, lengths, Y, *, readout="last", alpha=0.0, sample_weight=None,
             dtype=np.float64, tol=1e-8, max_iter=None, memory_budget=None,
             cache_dtype="auto", standardizer=None):
    """Matrix-free fit: preconditioned CG on the normal equations and LOBPCG.

    Never forms ``Phi`` nor ``G = Phi^T W Phi`` (see :class:`_ImplicitGram`).
    The row factors (folded moments and last tokens, ``n_rows * (P + d)``
    values) are cached when they fit in the memory budget (float64 in 1/8 of
    it, else float32 in 1/4; :func:`_cg_cache_dtype`), so a product ``G V``
    is two GEMMs; otherwise every product streams over the sequences, with
    memory O(N n d) for X plus O(psi + P^2) and one chunk.  A float32 cache
    halves memory and arithmetic again; everything computed with it is
    checked with exact float64 products streamed from X, so the results keep
    the float64 guarantees: CG replaces its residual by the exact one every
    two digits and stops on exact residuals only; lambda_max and the Ritz
    pairs of lambda_min are exact Rayleigh quotients and residuals of the
    vectors found.  (Without these checks, float32 products would stall CG
    at a true relative residual near 1e-7.)

    - Coefficients: CG on ``(G + alpha I) c = Phi^T W y`` preconditioned by
      the Kronecker approximation of :class:`_KroneckerPreconditioner`, until
      the residual is below ``tol`` times the right-hand side.  With alpha = 0
      on a rank-deficient design the iterates stay in the span of the
      preconditioner's range, so the result is the least-squares solution of
      minimal ``||M^{1/2} c||`` (M the preconditioner), not the Euclidean
      minimum-norm one of eigh/svd: it fits the training data the same way and
      agrees with them on every input their certificate ``covers``.
    - Certificate: lambda_max by Lanczos, lambda_min by LOBPCG (see
      :func:`_implicit_extremes`); the eigenvector of lambda_min is kept.

    ``cache_dtype`` ("auto", None, "float32" or "float64") overrides the
    cache rule (for tests).

    Returns
    -------
    solution : SpectralSolution
    setup : dict
        Counts, weights and target moments of the rows (for the statistics).
    """
    if isinstance(cache_dtype, str) and cache_dtype == "auto":
        cache_dtype = _cg_cache_dtype(_n_rows(lengths, readout, sample_weight), X.shape[2],
                                      memory_budget)
    standardizer = standardizer or TokenStandardizer.identity(X.shape[2])
    op = _ImplicitGram(X, lengths, readout, sample_weight, cache_dtype=cache_dtype,
                       standardizer=standardizer)
    setup = op.setup(Y)
    if not setup["trace"] > 0:
        return _zero_design_solution(op.psi, None if Y is None else Y.shape[-1], standardizer,
                                     "cg"), setup
    precond = _KroneckerPreconditioner(setup["A"], setup["B"], setup["weight_sum"],
                                       0.0, dtype)
    coef, n_iter = None, 0
    if Y is not None:
        max_iter = _CG_MAX_ITER if max_iter is None else int(max_iter)
        fit_precond, penalty = precond, None
        alpha_s = standardizer.alpha(alpha)
        if alpha_s > 0:
            scalar = standardizer.penalty_scalar()
            if scalar is not None:
                a = float(np.ldexp(alpha_s, scalar))
                fit_precond = _KroneckerPreconditioner(setup["A"], setup["B"],
                                                       setup["weight_sum"], a, dtype)
                penalty = lambda V: a * V  # noqa: E731
            else:
                factors = standardizer.penalty_factors()
                fit_precond = _KroneckerPreconditioner(setup["A"], setup["B"],
                                                       setup["weight_sum"], alpha_s, dtype,
                                                       penalty=factors)
                penalty = _kronecker_product(factors, alpha_s)
        C, n_iter, rel = _pcg(op.matmat, setup["b"].T, fit_precond.apply, penalty, tol,
                              max_iter, exact=None if op.exact else op.matmat_exact)
        if np.any(rel > tol):
            warnings.warn(
                f"solver='cg' stopped after {n_iter} iterations with a relative residual of "
                f"{rel.max():.3g} > tol={tol:g}; increase max_iter or tol.",
                ConvergenceWarning,
            )
        coef = C.T
    ext = _implicit_extremes(op, precond, dtype, memory_budget=memory_budget)
    identifiable = ext["lambda_min"] - ext["error"] > ext["tol"]
    if identifiable:
        rank = op.psi
    else:
        rank = op.psi - max(1, int(np.count_nonzero(ext["values"] <= ext["tol"])))
    solution = SpectralSolution(
        coef=None,
        standardized_coef=coef,
        standardizer=standardizer,
        tol=ext["tol"],
        lambda_max=ext["lambda_max"],
        lambda_min=ext["lambda_min"],
        n_features=op.psi,
        method="cg",
        min_eigenvector=ext["vector"],
        lambda_min_error=ext["error"],
        trace=setup["trace"],
        rank=rank,
        rank_is_bound=not identifiable,
        n_iter=n_iter,
    )
    return solution, setup


def _zero_design_solution(psi, d_out, standardizer, method):
    """Every feature row is zero: nothing is determined, the fit is the zero model."""
    null = np.zeros(psi)
    null[0] = 1.0
    return SpectralSolution(
        coef=None,
        standardized_coef=None if d_out is None else np.zeros((d_out, psi)),
        standardizer=standardizer,
        tol=0.0,
        lambda_max=0.0,
        lambda_min=0.0,
        n_features=psi,
        method=method,
        min_eigenvector=null,
        trace=0.0,
        rank=0,
    )


# --------------------------------------------------------------------------
# Choosing a solver, and the one-call entry point
# --------------------------------------------------------------------------


def choose_solver(solver, n_rows, psi, *, memory_budget=None, statistics=False):
    """Resolve ``"auto"`` from the shape of the design and the memory budget.

    - Dense psi x psi arrays (about ``3.25 * 8 * psi**2`` bytes: statistics,
      Gram matrix, factor) above ``memory_budget`` -> ``"cg"`` (matrix-free).
    - Fewer rows than features (wide) -> ``"dual"`` when the kernel matrix
      and the row basis (``8 * (2 * n_rows**2 + n_rows * psi)`` bytes) fit,
      else ``"cg"``.  ``"svd"`` gives the same minimum-norm solution with
      singular values instead of eigenvalues of the kernel, but LAPACK's SVD
      of a wide N x psi matrix measured 10 to 50 times slower than forming
      and eigen-decomposing the N x N kernel (e.g. 320 x 43560: 47 s vs
      3.2 s on the 2-core test machine), so "auto" leaves it to users who
      want its accuracy on ill-conditioned designs.
    - Otherwise (tall) -> ``"eigh"`` when psi <= 64 (its cost is negligible and
      it gives the whole spectrum), else ``"cholesky"``: the Gram matrix is
      accumulated in one pass either way, and at d = 16 (psi = 2176) an
      eigen-decomposition costs about 5 times forming ``Phi^T Phi`` while a
      Cholesky factor with Lanczos for the certificate costs a few tenths;
      ``"cholesky"`` itself falls back to ``"eigh"`` on (nearly) singular
      Gram matrices.

    Parameters
    ----------
    solver : str
        Returned unchanged unless ``"auto"``.
    n_rows : int
        Number of feature rows (an upper bound is fine).
    psi : int
        Number of features.
    memory_budget : int or None, default=None
        Bytes; None uses :func:`default_memory_budget`.
    statistics : bool, default=False
        Only the statistics solvers ("eigh", "cholesky") are possible.

    Returns
    -------
    solver : str

    Examples
    --------
    >>> from sklearn_linattn._solvers import choose_solver
    >>> choose_solver("auto", 20000, 2176, memory_budget=2**33)
    'cholesky'
    >>> choose_solver("auto", 150000, 133120, memory_budget=2**32)
    'cg'
    >>> choose_solver("auto", 100, 2176, memory_budget=2**33)
    'dual'
    """
    if solver != "auto":
        return solver
    tall_choice = "eigh" if psi <= _SMALL_PSI else "cholesky"
    if statistics:
        return tall_choice
    budget = default_memory_budget() if memory_budget is None else memory_budget
    if n_rows < psi:
        if solver_memory("dual", n_rows, psi) <= budget:
            return "dual"
        return "cg"
    if solver_memory(tall_choice, n_rows, psi) > budget:
        return "cg"
    return tall_choice


def solver_memory(solver, n_rows, psi):
    """Bytes of the dense arrays a solver allocates for a design of n_rows x psi.

    The memory model, in one place: ``"eigh"`` and ``"cholesky"`` hold about
    3.25 psi x psi float64 arrays (statistics, Gram matrix, eigenvectors or
    factor); ``"svd"`` the design matrix, its copy for LAPACK and the
    factors (``3 n_rows psi + psi**2 + 4 k**2`` values, k = min(n_rows,
    psi)); ``"dual"`` the n_rows x n_rows kernel, its eigenvectors and
    LAPACK's work space, and the row basis (``3 n_rows**2 + n_rows psi``
    values).  ``"cg"`` sizes its cache and Lanczos vectors to the budget
    (:func:`_cg_cache_dtype`) and ``"lsmr"`` checks its sparse rows while it
    builds them, so both count 0 here.

    Examples
    --------
    >>> from sklearn_linattn._solvers import solver_memory
    >>> round(solver_memory("dual", 1000, 936) / 2**20, 1)  # MiB
    30.0
    """
    n_rows, psi = int(n_rows), int(psi)
    if solver in STATISTICS_SOLVERS:
        return _DENSE_ARRAYS * 8 * psi * psi
    if solver == "svd":
        k = min(n_rows, psi)
        return 8.0 * (3 * n_rows * psi + psi * psi + 4 * k * k)
    if solver == "dual":
        return 8.0 * (3 * n_rows * n_rows + n_rows * psi)
    return 0.0


def check_solver_memory(solver, n_rows, psi, memory_budget=None):
    """Raise a ValueError before a solver allocates more than the memory budget.

    The message gives the estimate (:func:`solver_memory`), the budget and
    the solvers whose arrays would fit.
    """
    budget = default_memory_budget() if memory_budget is None else memory_budget
    need = solver_memory(solver, n_rows, psi)
    if need <= budget:
        return
    fits = [s for s in SOLVERS[1:] if s != "lsmr" and solver_memory(s, n_rows, psi) <= budget]
    what = {
        "dual": f"the {n_rows} x {n_rows} kernel matrix of N = {n_rows} feature rows",
        "svd": f"the {n_rows} x {psi} design matrix and its SVD",
    }.get(solver, f"{psi} x {psi} dense matrices (psi = {psi} features)")
    raise ValueError(
        f"solver={solver!r} needs about {need / 2**30:.3g} GiB for {what}, more than the "
        f"memory budget of {budget / 2**30:.3g} GiB (half the physical memory); solvers "
        f"whose arrays fit: {fits}."
    )


def _n_rows(lengths, readout, sample_weight):
    rows = np.ones_like(lengths) if readout == "last" else lengths
    if sample_weight is not None:
        rows = rows[sample_weight > 0]
    return int(rows.sum())


def solve(X, lengths, Y, *, readout="last", alpha=0.0, solver="auto", sample_weight=None,
          tol=1e-8, max_iter=None, memory_budget=None, standardizer=None):
    """Fit coefficients and the Gram spectrum in one call.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Padded sequences (float32 or float64); values at positions
        ``>= lengths`` are ignored.
    lengths : ndarray of shape (n_samples,)
    Y : ndarray or None
        Targets as returned by ``check_targets``; None computes the spectrum
        only (for the certificate).
    readout : {"last", "all"}
    alpha : float
        Ridge penalty on the coefficients (in the units of X and Y); 0 gives
        the least-squares solution of minimum norm in standardized
        coordinates (see :mod:`._standardize`; for ``"cg"`` see
        :func:`solve_cg`).
    solver : {"auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr"}
        ``"lsmr"`` (sparse rows, for one-hot data) is never chosen by
        ``"auto"``; see :func:`~._sparse.solve_lsmr`.
    sample_weight : ndarray of shape (n_samples,) or None
        Non-negative weight of each sequence (of all its rows for ``"all"``).
    tol, max_iter : float, int or None
        Stopping rule of ``"cg"``; ``max_iter`` also caps ``"lsmr"``.
    memory_budget : int or None
        For ``"auto"`` (:func:`choose_solver`), the memory check of an
        explicit solver (:func:`check_solver_memory`) and the certificate of
        ``"lsmr"``.
    standardizer : TokenStandardizer or None
        The standardized coordinates; None computes them from X (whitened,
        except for ``"lsmr"``, which keeps rows sparse).

    Returns
    -------
    solution : SpectralSolution
    stats : SufficientStatistics
        With the Gram matrix for "eigh" and "cholesky"; counts, weights and
        target moments only for the other solvers.

    Raises
    ------
    ValueError
        When the solver's dense arrays would not fit the memory budget (the
        message says which solvers would), or every row has zero weight.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._solvers import solve
    >>> X = np.random.default_rng(0).normal(size=(30, 4, 2))
    >>> Y = X[:, -1, :1] * (X[:, :, :1] ** 2).sum(axis=1)
    >>> coefs = [solve(X, np.full(30, 4), Y, solver=s)[0].coef
    ...          for s in ("eigh", "cholesky", "svd", "dual", "cg")]
    >>> all(np.allclose(c, coefs[0], atol=1e-7) for c in coefs)
    True
    """
    check_readout(readout)
    d = X.shape[2]
    psi = n_attention_features(d)
    d_out = None if Y is None else Y.shape[-1]
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
    n_rows = _n_rows(lengths, readout, sample_weight)
    solver = choose_solver(solver, n_rows, psi, memory_budget=memory_budget)
    if solver not in SOLVERS[1:]:
        raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}.")
    check_solver_memory(solver, n_rows, psi, memory_budget)
    if standardizer is None:
        standardizer = standardizer_for(X, lengths, Y, sample_weight)
    if solver in STATISTICS_SOLVERS:
        stats = SufficientStatistics(d, d_out, standardizer=standardizer)
        stats.update(X, lengths, Y, readout=readout, sample_weight=sample_weight)
        if stats.n_rows == 0:
            raise ValueError("every sequence has zero sample weight: there is nothing to fit.")
        return solve_statistics(stats, alpha, solver), stats
    stats = SufficientStatistics(d, d_out, gram=False, standardizer=standardizer)
    stats.update(X, lengths, Y, readout=readout, sample_weight=sample_weight)
    if stats.n_rows == 0:
        raise ValueError("every sequence has zero sample weight: there is nothing to fit.")
    kwargs = dict(readout=readout, alpha=alpha, sample_weight=sample_weight, dtype=stats.dtype,
                  standardizer=standardizer)
    if solver == "svd":
        solution = solve_svd(X, lengths, Y, **kwargs)
    elif solver == "dual":
        solution = solve_dual(X, lengths, Y, **kwargs)
    elif solver == "lsmr":
        from ._sparse import solve_lsmr

        solution = solve_lsmr(X, lengths, Y, max_iter=max_iter, memory_budget=memory_budget,
                              **kwargs)
    else:
        solution, setup = solve_cg(X, lengths, Y, tol=tol, max_iter=max_iter,
                                   memory_budget=memory_budget, **kwargs)
    return solution, stats
