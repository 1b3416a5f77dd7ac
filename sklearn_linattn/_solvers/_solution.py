"""What every solver returns: coefficients with what the certificate needs of the spectrum."""

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from .._namespace import active
from .._spectrum import eigenvalue_tolerance, rank_tolerance
from .._units import TokenStandardizer, exponent, pow2_scale

__all__ = ["SpectralSolution", "coef_from_gram", "coef_from_spectrum", "dense_solution",
           "ridge_penalty", "spectral_inverse", "zero_design_solution"]


@dataclass
class SpectralSolution:
    """Coefficients with what the certificate needs about the Gram spectrum.

    Everything but ``coef`` is about the standardized problem (see
    :mod:`.._units`): the spectrum, eigenvectors and factor are those of
    ``G = Phi^T W Phi`` for the standardized tokens and weights.

    Attributes
    ----------
    coef : ndarray of shape (d_out, psi) or None
        Coefficients of the standardized problem (``y_std = H_std @ coef.T``;
        None without targets).
    standardizer : TokenStandardizer or None
        The standardized coordinates (None: the data as given).
    tol : float
        Eigenvalues of ``G = Phi^T W Phi`` ``<= tol`` count as zero
        (:func:`~.._spectrum.eigenvalue_tolerance`).
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
    counts : RowCounts or None
        Counts of the rows fitted (set by the dispatch,
        :func:`~sklearn_linattn._solvers.solve`).
    diagnostics : dict or None
        Seconds and iterations of an iterative solver's phases (``"cg"``:
        ``setup_seconds``, the pass that caches the rows, and the keys of
        :func:`~.._spectrum.implicit_extremes`), for benchmarks and
        ``verbose`` logs.
    moment : ndarray of shape (psi, d_out) or None
        ``Phi^T W Y`` in standardized coordinates, when a solver without
        statistics computed it (``"cg"``); the statistics solvers' counts
        hold it instead.
    gram_coef, normal_residual : ndarray of shape (psi, d_out) or None
        ``G coef^T`` and the residual ``Phi^T W Y - G coef^T`` of an
        unpenalized iterative solve (``"cg"``, when asked for them): what a
        rigorous bound of the term columns' Schur complement needs
        (:func:`~.._terms.schur_complement`).  None for direct solvers, whose
        residual is rounding.
    gram_product : callable or None
        ``gram_product(V)``: exact products ``G V`` (V of shape (psi, k)),
        for a solver that keeps no representation of G (in-memory ``"cg"``);
        holds the solver's row cache, so the fit drops it when done.
    coef_accuracy : float or None
        Relative accuracy of ``coef`` when the solver stops at a tolerance
        (``"cg"``: its ``tol`` times the square root of the condition
        number); None for direct solvers, exact to rounding.
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
    standardizer: TokenStandardizer | None = None
    counts: object = None
    diagnostics: dict | None = None
    moment: np.ndarray | None = None
    gram_coef: np.ndarray | None = None
    normal_residual: np.ndarray | None = None
    gram_product: object = None
    coef_accuracy: float | None = None


def coef_from_spectrum(w, U, moment, alpha, tol):
    """Ridge / minimum-norm coefficients from (part of) an eigen-decomposition of G.

    ``U`` holds the eigenvectors of the first ``U.shape[1]`` eigenvalues; the
    moment lies in their span (the row space of the design), so the missing
    ones do not matter.  ``alpha`` is the ridge added to every eigenvalue.
    """
    if moment is None:
        return None
    inv = spectral_inverse(w[: U.shape[1]], alpha, tol)
    proj = U.T @ moment  # (k, d_out)
    return (U @ (inv[:, None] * proj)).T


def spectral_inverse(w, ridge, tol):
    """``1 / (w + ridge)`` on the eigendirections a solve keeps, 0 on the others.

    Unpenalized, eigenvalues at or below ``tol`` count as zero (the
    minimum-norm solution); with a ridge, every direction it makes positive.
    """
    denom = w + ridge
    keep = w > tol if ridge == 0 else denom > 0
    inv = np.zeros_like(w)
    inv[keep] = 1.0 / denom[keep]
    return inv


def ridge_penalty(alpha, trace, n_features):
    """The multiple of the identity that the unit-free ``alpha`` adds to ``G = Phi^T W Phi``.

    ``alpha`` penalises the coefficients of the standardized features scaled to
    unit mean second moment: the fit minimises ``(1/W) sum_r w_r ||y_r - c h_r||**2
    + alpha (tr Lambda_D / psi) ||c||**2`` (``Lambda_D = G / W``), whose normal
    equations are ``(G + alpha tr(G) / psi I) c = Phi^T W y``.  The shrinkage of
    an eigendirection of eigenvalue mu is ``mu / (mu + alpha * mean(mu))``:
    ``alpha = 1e-3`` leaves alone what carries more than a thousandth of an
    average direction's energy, whatever the units of X.  Capped below the
    largest float64 so that a huge alpha gives coefficients near zero, not NaN.
    """
    if not alpha or not trace > 0:
        return 0.0
    return float(min(float(alpha) * (float(trace) / n_features),
                     np.finfo(np.float64).max / 8))


def coef_from_gram(G, moment, ridge):
    """Ridge coefficients ``(G + ridge I)^{-1} moment`` (ridge > 0), transposed.

    Cholesky of the system scaled by a power of two; eigh if rounding makes it
    indefinite (a ridge far below the rounding of G).  Only the lower
    triangle of G is read (zeros above it are fine).
    """
    top = max(float(np.abs(G).max(initial=0.0)), ridge, np.finfo(np.float64).tiny)
    m = int(exponent(top))
    M = pow2_scale(G, -m)
    M[np.diag_indices_from(M)] += pow2_scale(ridge, -m)
    b = pow2_scale(moment, -m)
    ns = active()
    try:
        if ns.is_numpy:
            c, low = scipy.linalg.cho_factor(M, lower=True, overwrite_a=True,
                                             check_finite=False)
        else:
            c, low = ns.cholesky(M), True
        return scipy.linalg.cho_solve((c, low), b, check_finite=False).T
    except np.linalg.LinAlgError:
        A = pow2_scale(G, -m)
        w, U = scipy.linalg.eigh(A, check_finite=False) if ns.is_numpy else ns.eigh(A)
        w = w + pow2_scale(ridge, -m)
        keep = w > eigenvalue_tolerance(w.max(), w.size)
        return ((U[:, keep] / w[keep]) @ (U[:, keep].T @ b)).T


def dense_solution(w, U, moment, alpha, dtype, method, standardizer, n_rows=None):
    """SpectralSolution from eigenvalues w (length psi, decreasing) and eigenvectors U.

    ``n_rows``: the rows of positive weight behind them, which bound the
    rank (:func:`~.._spectrum.rank_tolerance`).
    """
    psi = w.shape[0]
    tol = rank_tolerance(w, psi, dtype, n_rows)
    ridge = ridge_penalty(alpha, w.sum(), psi)
    return SpectralSolution(
        coef=coef_from_spectrum(w, U, moment, ridge, tol),
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


def zero_design_solution(psi, d_out, standardizer, method):
    """Every feature row is zero: nothing is determined, the fit is the zero model."""
    null = np.zeros(psi)
    null[0] = 1.0
    return SpectralSolution(
        coef=None if d_out is None else np.zeros((d_out, psi)),
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
