"""Normal equations from sufficient statistics: ``"eigh"`` and ``"cholesky"``."""

import numpy as np
import scipy.linalg
from scipy.linalg.lapack import get_lapack_funcs

from .._namespace import active
from .._spectrum import (
    descending_eigh,
    eigenvalue_tolerance,
    largest_eigenvalue,
    rank_tolerance,
    smallest_eigenvalue_from_cholesky,
)
from ._solution import (
    SpectralSolution,
    coef_from_gram,
    dense_solution,
    ridge_penalty,
    spectral_inverse,
)

__all__ = ["CHOLESKY_SOLVES", "FULL_SPECTRUM_PSI", "PenaltyPath", "solve_cholesky", "solve_eigh"]

# Up to this many features a dense eigen-decomposition costs less than a
# millisecond: "auto" uses "eigh", and "cholesky" takes the whole spectrum.
FULL_SPECTRUM_PSI = 64
# "cholesky" hands over to "eigh" when lambda_min is within this factor of the
# zero-eigenvalue tolerance (then rank and null space must be resolved).
_CHOLESKY_MARGIN = 100.0
# Many penalties of one Gram matrix are solved by one Cholesky factorization
# per positive alpha up to this many alphas, else by one eigen-decomposition
# for all of them: the tridiagonal reduction of an eigen-decomposition is bound
# by memory traffic and costs as much as a dozen or more factorizations
# (psi = 1800: 10-20 s against 0.4-0.6 s each on a loaded two-core machine).
CHOLESKY_SOLVES = 12


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


def solve_eigh(stats, alpha=0.0, previous=None):
    """Solve the normal equations through ``eigh(Phi^T W Phi)`` (full spectrum).

    ``previous``: an earlier solution of the same statistics; its
    eigen-decomposition, when it has one, serves this penalty.
    """
    if previous is not None and previous.eigenvectors is not None:
        w, U = previous.eigenvalues, previous.eigenvectors
    else:
        _check_statistics_finite(stats)
        w, U = descending_eigh(stats.gram, overwrite_a=True)
    return dense_solution(w, U, stats.moment, alpha, stats.dtype, "eigh", stats.standardizer,
                          n_rows=stats.n_rows)


def _cholesky(G):
    """Lower Cholesky factor (Fortran order, computed in place); None if not positive definite."""
    ns = active()
    if not ns.is_numpy:
        try:
            return np.asfortranarray(ns.cholesky(G.T))
        except np.linalg.LinAlgError:
            return None
    potrf = get_lapack_funcs("potrf", (G,))
    # G is symmetric: its transpose is a Fortran-ordered view of the same matrix.
    L, info = potrf(G.T, lower=1, overwrite_a=1, clean=1)
    return L if info == 0 else None


def solve_cholesky(stats, alpha=0.0, previous=None):
    """Solve the normal equations through a Cholesky factor of ``Phi^T W Phi``.

    The certificate's extreme eigenvalues come from Lanczos: on G for
    lambda_max, on ``G^{-1} = L^{-T} L^{-1}`` for lambda_min (relative
    accuracy 1e-10, plus the rounding of the factorisation, about
    ``psi * eps * lambda_max`` as for eigh).  The full spectrum is not
    computed.  When G is not positive definite, or lambda_min is within a
    factor 100 of the zero-eigenvalue tolerance, rank and null space matter and
    the solve hands over to :func:`solve_eigh`, so the result is always that
    of the eigh rule.  The hand-over does not depend on the penalty: after an
    earlier one (``previous``, a solution by eigh of the same statistics) its
    eigen-decomposition serves this penalty too.
    """
    if previous is not None and previous.method == "eigh":
        return solve_eigh(stats, alpha, previous)
    psi = stats.n_features
    if stats.n_rows < psi:
        # Singular whatever the rounding says: fewer rows than features.
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


class PenaltyPath:
    """The coefficients of normal equations for many penalties, by the rule of the plain fit.

    As ``"cholesky"`` does: a Cholesky factor when the Gram matrix is
    positive definite with a margin (one factorization per penalty), else its
    eigen-decomposition (every penalty from it, zero eigenvalues by
    :func:`~._spectrum.rank_tolerance`); eigh at small sizes, or for many
    penalties.  ``G`` may be the Gram matrix on a basis of the row space of
    all the data; ``psi`` and ``trace`` are those of the whole training Gram
    matrix and ``n_rows`` its rows of positive weight, so that the tolerance,
    the rank and the penalty are the plain fit's.
    """

    def __init__(self, G, b, *, psi, trace, dtype, n_penalties, n_rows=None):
        self.b, self.psi, self.trace = b, psi, trace
        self._factor = self._spectrum = None
        m = G.shape[0]
        if m == 0:
            self._spectrum = (np.zeros(0), np.zeros((0, 0)), 0.0)
            return
        if m > FULL_SPECTRUM_PSI and n_penalties <= CHOLESKY_SOLVES and not (
                n_rows is not None and n_rows < m):
            L = _cholesky(G.copy())
            if L is not None:
                tol = eigenvalue_tolerance(largest_eigenvalue(G), psi, dtype)
                # Each pivot L_ii**2 is at least lambda_min: a small one settles it.
                if np.diagonal(L).min() ** 2 > _CHOLESKY_MARGIN * tol:
                    found = smallest_eigenvalue_from_cholesky(L)
                    if found is not None and found[0] > _CHOLESKY_MARGIN * tol:
                        self._factor, self._G = L, G
                        return
        w, U = descending_eigh(G)
        self._spectrum = (w, U, rank_tolerance(w, psi, dtype, n_rows))

    def coefs(self, alphas):
        """Coefficients (n_alphas, n_targets, m) of the penalties ``alphas``."""
        ridges = [ridge_penalty(alpha, self.trace, self.psi) for alpha in alphas]
        if self._spectrum is None:
            return np.stack([
                scipy.linalg.cho_solve((self._factor, True), self.b, check_finite=False).T
                if not ridge else coef_from_gram(self._G, self.b, ridge) for ridge in ridges])
        # Every penalty's spectral_inverse, in one product with U.
        w, U, tol = self._spectrum
        proj = U.T @ self.b  # (m, n_targets)
        inverse = np.array([spectral_inverse(w, ridge, tol) for ridge in ridges]).reshape(
            len(ridges), w.size)
        Z = inverse[:, :, None] * proj[None]  # (n_alphas, m, n_targets)
        C = U @ Z.transpose(1, 0, 2).reshape(w.size, -1)
        return C.reshape(w.size, len(ridges), -1).transpose(1, 2, 0)
