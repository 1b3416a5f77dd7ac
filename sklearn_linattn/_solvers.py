"""Least squares in feature space: sufficient statistics and solvers.

The fit never needs more than the Gram matrix ``G = Phi^T Phi`` and the
moment ``B = Phi^T Y`` of the feature rows ``Phi``, accumulated over chunks of
sequences so that memory stays O(chunk + psi^2).  The same eigen-decomposition
of G gives the coefficients and the identifiability certificate, and one rule,
:func:`eigenvalue_tolerance`, decides which eigenvalues count as zero.
"""

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg

from ._features import (
    attention_features,
    iter_sample_chunks,
    n_attention_features,
    prefix_features,
)

__all__ = [
    "SOLVERS",
    "SpectralSolution",
    "SufficientStatistics",
    "eigenvalue_tolerance",
    "feature_rows",
    "solve",
]

SOLVERS = ("auto", "eigh", "svd")

# "auto" keeps the design matrix for the SVD solver up to this many floats.
_SVD_MAX_VALUES = 2**24


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


@dataclass
class SufficientStatistics:
    """Running ``Phi^T Phi``, ``Phi^T Y`` and target moments over feature rows.

    Attributes
    ----------
    gram : ndarray of shape (psi, psi)
    moment : ndarray of shape (psi, d_out) or None
    y_sum, y_sq : ndarray of shape (d_out,) or None
        Sum and sum of squares of the targets (for residuals and R^2).
    n_rows : int
        Number of feature rows accumulated.
    n_samples : int
        Number of sequences accumulated.
    dtype : numpy dtype
        The least precise floating dtype seen in the inputs.
    """

    d: int
    d_out: int | None = None
    gram: np.ndarray = field(init=False)
    moment: np.ndarray | None = field(init=False, default=None)
    y_sum: np.ndarray | None = field(init=False, default=None)
    y_sq: np.ndarray | None = field(init=False, default=None)
    n_rows: int = field(init=False, default=0)
    n_samples: int = field(init=False, default=0)
    dtype: np.dtype = field(init=False, default=np.dtype(np.float64))

    def __post_init__(self):
        psi = n_attention_features(self.d)
        self.gram = np.zeros((psi, psi))
        if self.d_out is not None:
            self.moment = np.zeros((psi, self.d_out))
            self.y_sum = np.zeros(self.d_out)
            self.y_sq = np.zeros(self.d_out)

    @property
    def n_features(self):
        return self.gram.shape[0]

    def update(self, X, lengths, Y=None, *, readout="last"):
        """Add the feature rows of a batch of sequences (processed in chunks)."""
        if np.dtype(X.dtype).itemsize < self.dtype.itemsize:
            self.dtype = np.dtype(X.dtype)
        rows_per_sample = 1 if readout == "last" else X.shape[1]
        for sl in iter_sample_chunks(X.shape[0], rows_per_sample * self.n_features):
            Xc = np.asarray(X[sl], dtype=np.float64)
            Yc = None if Y is None else Y[sl]
            Phi, Yr = feature_rows(Xc, lengths[sl], Yc, readout=readout)
            self.gram += Phi.T @ Phi
            if self.moment is not None:
                self.moment += Phi.T @ Yr
                self.y_sum += Yr.sum(axis=0)
                self.y_sq += np.einsum("ra,ra->a", Yr, Yr)
            self.n_rows += Phi.shape[0]
        self.n_samples += X.shape[0]
        return self


@dataclass
class SpectralSolution:
    """Coefficients with the spectrum of the Gram matrix they came from.

    Attributes
    ----------
    coef : ndarray of shape (d_out, psi) or None
    eigenvalues : ndarray of shape (psi,)
        Eigenvalues of ``Phi^T Phi`` in decreasing order (clipped at 0).
    eigenvectors : ndarray of shape (psi, psi)
        Matching orthonormal eigenvectors as columns.
    tol : float
        Eigenvalues ``<= tol`` count as zero (:func:`eigenvalue_tolerance`).
    """

    coef: np.ndarray | None
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    tol: float

    @property
    def rank(self):
        return int(np.count_nonzero(self.eigenvalues > self.tol))


def _coef_from_spectrum(w, U, moment, alpha, tol):
    """Ridge / minimum-norm coefficients from an eigen-decomposition of G."""
    if moment is None:
        return None
    proj = U.T @ moment  # (psi, d_out)
    denom = w + alpha
    keep = w > tol if alpha == 0 else denom > 0
    inv = np.zeros_like(w)
    inv[keep] = 1.0 / denom[keep]
    return (U @ (inv[:, None] * proj)).T


def solve_eigh(stats, alpha=0.0):
    """Solve the normal equations through ``eigh(Phi^T Phi)``."""
    w, U = scipy.linalg.eigh(stats.gram, driver="evr")
    w, U = np.clip(w[::-1], 0.0, None), U[:, ::-1]
    tol = eigenvalue_tolerance(w[0] if w.size else 0.0, stats.n_features, stats.dtype)
    return SpectralSolution(_coef_from_spectrum(w, U, stats.moment, alpha, tol), w, U, tol)


def solve_svd(Phi, Y_rows, alpha=0.0, dtype=np.float64):
    """Solve on the design matrix itself through its SVD (more accurate).

    Conditioning is that of ``Phi`` rather than of ``Phi^T Phi``; eigenvalues
    of the Gram matrix are the squared singular values.
    """
    psi = Phi.shape[1]
    _, s, Vt = scipy.linalg.svd(Phi, full_matrices=False, lapack_driver="gesdd")
    w = np.zeros(psi)
    w[: s.size] = s**2
    U = Vt.T
    if U.shape[1] < psi:  # fewer rows than features: complete the basis
        U = np.hstack([U, scipy.linalg.null_space(U.T)])
    tol = eigenvalue_tolerance(w[0] if w.size else 0.0, psi, dtype)
    moment = None if Y_rows is None else Phi.T @ Y_rows
    return SpectralSolution(_coef_from_spectrum(w, U, moment, alpha, tol), w, U, tol)


def choose_solver(solver, n_rows, psi):
    """Resolve ``"auto"``.

    The SVD of a wide design (fewer rows than features) is cheaper than the
    eigen-decomposition of the psi x psi Gram matrix; a tall design is
    reduced to the Gram matrix in chunks, which costs one GEMM pass and
    O(psi^2) memory (an SVD of the tall design costs several times more).
    """
    if solver != "auto":
        return solver
    return "svd" if n_rows < psi and n_rows * psi <= _SVD_MAX_VALUES else "eigh"


def solve(X, lengths, Y, *, readout="last", alpha=0.0, solver="auto"):
    """Fit coefficients and the Gram spectrum in one pass over the data.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)
    Y : ndarray or None
        Targets as returned by ``check_targets``; None computes the spectrum
        only (for the certificate).
    readout : {"last", "all"}
    alpha : float
        Ridge penalty; 0 gives the minimum-norm least-squares solution.
    solver : {"auto", "eigh", "svd"}

    Returns
    -------
    solution : SpectralSolution
    stats : SufficientStatistics
    """
    d = X.shape[2]
    psi = n_attention_features(d)
    n_rows = X.shape[0] if readout == "last" else int(lengths.sum())
    solver = choose_solver(solver, n_rows, psi)
    d_out = None if Y is None else Y.shape[-1]
    stats = SufficientStatistics(d, d_out)
    if solver == "eigh":
        stats.update(X, lengths, Y, readout=readout)
        return solve_eigh(stats, alpha), stats
    Phi, Y_rows = feature_rows(np.asarray(X, dtype=np.float64), lengths, Y, readout=readout)
    stats.dtype = np.dtype(X.dtype)
    stats.gram = Phi.T @ Phi
    stats.n_rows, stats.n_samples = Phi.shape[0], X.shape[0]
    if Y_rows is not None:
        stats.moment = Phi.T @ Y_rows
        stats.y_sum = Y_rows.sum(axis=0)
        stats.y_sq = np.einsum("ra,ra->a", Y_rows, Y_rows)
    return solve_svd(Phi, Y_rows, alpha, X.dtype), stats
