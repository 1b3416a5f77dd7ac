"""Normal equations from sufficient statistics: ``"eigh"`` and ``"cholesky"``."""

import numpy as np
import scipy.linalg
from scipy.linalg.lapack import get_lapack_funcs

from .._spectrum import (
    descending_eigh,
    eigenvalue_tolerance,
    largest_eigenvalue,
    smallest_eigenvalue_from_cholesky,
)
from ._solution import SpectralSolution, coef_from_gram, dense_solution, ridge_penalty

__all__ = ["FULL_SPECTRUM_PSI", "solve_cholesky", "solve_eigh"]

# Up to this many features a dense eigen-decomposition costs less than a
# millisecond: "auto" uses "eigh", and "cholesky" takes the whole spectrum.
FULL_SPECTRUM_PSI = 64
# "cholesky" hands over to "eigh" when lambda_min is within this factor of the
# zero-eigenvalue tolerance (then rank and null space must be resolved).
_CHOLESKY_MARGIN = 100.0


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
    w, U = descending_eigh(stats.gram, overwrite_a=True)
    return dense_solution(w, U, stats.moment, alpha, stats.dtype, "eigh", stats.standardizer)


def _cholesky(G):
    """Lower Cholesky factor (Fortran order, computed in place); None if not positive definite."""
    potrf = get_lapack_funcs("potrf", (G,))
    # G is symmetric: its transpose is a Fortran-ordered view of the same matrix.
    L, info = potrf(G.T, lower=1, overwrite_a=1, clean=1)
    return L if info == 0 else None


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
    if psi <= FULL_SPECTRUM_PSI:
        G = stats.gram
        w = descending_eigh(G, vectors=False)
        lam_max, lam_min, error = float(w[0]), float(w[-1]), 0.0
    else:
        # Everything below reads G's upper triangle only (potrf and symv on
        # the Fortran-ordered G.T, coef_from_gram on the transpose).
        G = stats.expanded_gram(upper=True)
        w = None
        lam_max = largest_eigenvalue(G)
    tol = eigenvalue_tolerance(lam_max, psi, stats.dtype)
    trace = float(np.trace(G))
    ridge = ridge_penalty(alpha, trace, psi) if stats.moment is not None else 0.0
    G_ridge = G.copy() if ridge else None
    L = _cholesky(G)  # overwrites G
    if L is None:
        return solve_eigh(stats, alpha)
    if w is None:
        found = smallest_eigenvalue_from_cholesky(L)
        if found is None:
            return solve_eigh(stats, alpha)
        lam_min, error = found
    if not lam_min > _CHOLESKY_MARGIN * tol:
        return solve_eigh(stats, alpha)
    coef = None
    if stats.moment is not None:
        if not ridge:
            coef = scipy.linalg.cho_solve((L, True), stats.moment, check_finite=False).T
        else:
            coef = coef_from_gram(G_ridge.T, stats.moment, ridge)
    return SpectralSolution(
        coef=coef,
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
