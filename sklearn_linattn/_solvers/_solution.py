"""What every solver returns: coefficients with what the certificate needs of the spectrum."""

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from .._spectrum import eigenvalue_tolerance
from .._standardize import TokenStandardizer, _exponent

__all__ = ["SpectralSolution", "coef_from_spectrum", "dense_solution", "penalized_solve",
           "ridge_coef", "zero_design_solution"]


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
    counts: object = None
    diagnostics: dict | None = None
    moment: np.ndarray | None = None

    def __post_init__(self):
        # Solvers set the standardized coefficients; the data's own follow.
        if self.standardized_coef is None and self.coef is not None and (
            self.standardizer is None or self.standardizer.is_identity
        ):
            self.standardized_coef = self.coef
        elif self.standardized_coef is not None and self.coef is None:
            self.coef = (self.standardized_coef if self.standardizer is None
                         else self.standardizer.coef_to_user(self.standardized_coef))


def coef_from_spectrum(w, U, moment, alpha, tol):
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


def penalized_solve(G, moment, alpha, standardizer):
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


def ridge_coef(w, U, moment, alpha, tol, standardizer, gram=None):
    """Coefficients for eigenvalues w and eigenvectors U of G (standardized).

    ``alpha`` penalises the user's coefficients; it is a multiple of the
    identity in standardized coordinates only for a pure power-of-two
    scaling, otherwise ``gram`` (or ``U diag(w) U^T``) is solved with the
    penalty by :func:`penalized_solve`.
    """
    if moment is None:
        return None
    if alpha == 0:
        return coef_from_spectrum(w, U, moment, 0.0, tol)
    alpha_s = standardizer.alpha(alpha)
    scalar = standardizer.penalty_scalar()
    if scalar is not None:
        return coef_from_spectrum(w, U, moment, float(np.ldexp(alpha_s, scalar)), tol)
    if gram is None:
        k = U.shape[1]
        gram = (U * w[:k]) @ U.T
    return penalized_solve(gram, moment, alpha_s, standardizer)


def dense_solution(w, U, moment, alpha, dtype, method, standardizer, gram=None):
    """SpectralSolution from eigenvalues w (length psi, decreasing) and eigenvectors U."""
    psi = w.shape[0]
    tol = eigenvalue_tolerance(w[0] if psi else 0.0, psi, dtype)
    return SpectralSolution(
        coef=None,
        standardized_coef=ridge_coef(w, U, moment, alpha, tol, standardizer, gram),
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
