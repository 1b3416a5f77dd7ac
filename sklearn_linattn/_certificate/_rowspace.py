"""What a certificate knows of ``Lambda_D``, one class per way a solver computed it.

``Lambda_D = G / W`` (``G = Phi^T diag(w) Phi``, ``W = sum(w)``); every class
answers in Lambda_D's units at the certificate's ``tol``.
:func:`row_space_from_solution` picks the class.
"""

import numpy as np
import scipy.linalg

from .._features import n_attention_features
from .._spectrum import descending_eigh

__all__ = [
    "ActiveEigenBasis",
    "CholeskyRowSpace",
    "EigenBasis",
    "NullVectorRowSpace",
    "RowSpace",
    "row_space_from_solution",
]

_TINY = np.finfo(np.float64).tiny


class RowSpace:
    """The spectrum facts every representation has, the rank rule and the coverage rule.

    ``weight_sum`` is W in the standardized weights' units; ``tol=None`` uses
    the solver's ``solution.tol / W``.
    """

    #: Whether null energies are known: a failed certificate answers
    #: ``coverage`` only then.
    resolves_null_space = False

    def __init__(self, solution, *, d, weight_sum, tol=None, n_features=None):
        W = self.weight_sum = float(weight_sum)
        # psi, times the feature blocks of a model with decays.
        self.n_features = int(n_attention_features(int(d)) if n_features is None else n_features)
        self.method = solution.method
        self._eigenvalues = (
            None if solution.eigenvalues is None
            else np.asarray(solution.eigenvalues, dtype=np.float64) / W
        )
        if self._eigenvalues is not None and self._eigenvalues.shape != (self.n_features,):
            raise ValueError(
                f"{self._eigenvalues.shape[0]} eigenvalues do not match token dimension "
                f"d={int(d)} (psi = {self.n_features})."
            )
        self.rounding_tol = float(solution.tol / W)
        self.tol_is_default = tol is None
        self.tol = float(self.rounding_tol if tol is None else tol)
        self.lambda_max = float(solution.lambda_max / W)
        self.lambda_min = float(solution.lambda_min / W)
        self.lambda_min_error = float(solution.lambda_min_error / W)
        self.trace = float(solution.trace / W)
        self.identifiable = bool(self.lambda_min - self.lambda_min_error > self.tol)
        # Only eigenvalues known now give the rank; without them a failed
        # certificate knows that one direction (at least) is missing.
        self.rank_is_bound = False
        if self._eigenvalues is not None:
            self.rank = int(np.count_nonzero(self._eigenvalues > self.tol))
        elif self.identifiable:
            self.rank = self.n_features
        else:
            self.rank = min(int(solution.rank), self.n_features - 1)
            self.rank_is_bound = True
        # Coverage rule (see ``covers``): null-space energy allowed at an input
        # with features h is  max(tol, r) * h^T Lambda_D^+ h + (r / lambda_max) * ||h||^2,
        # with r the rounding level of the package's rule, so that a user's
        # tol=0 still allows for rounding.  Both terms scale like ||h||^2, so
        # the answer does not depend on the scale of h.
        self._null_lev = max(self.tol, self.rounding_tol)
        self._null_rel = (self.rounding_tol / self.lambda_max if self.lambda_max > 0
                          else 0.0)

    @property
    def eigenvalues(self):
        """All eigenvalues of Lambda_D, decreasing, or None when not computed."""
        return self._eigenvalues

    def quadratic(self, C):
        """``c^T Lambda_D c`` for each row c of C (..., psi), or None without a representation."""
        return None

    def root(self, C):
        """``R c`` for each row c of C (..., psi) with ``||R c||**2 = c^T Lambda_D c``, or None
        without a representation."""
        return None

    def allowance(self, hh, lev):
        """Null energy the coverage rule allows at rows of energy hh and leverage lev."""
        return self._null_lev * lev + self._null_rel * hh

    def coverage(self, H):
        """Per feature row h of H (n, t, psi): in the training span? and ``h^T Lambda_D^+ h``."""
        hh = np.einsum("ntp,ntp->nt", H, H)
        lev, null_energy = self._energies(H, hh)
        return self._covered(null_energy, hh, lev), lev

    def sparse_coverage(self, Hs):
        """``coverage`` for sparse rows Hs (n_rows, psi), when ``resolves_null_space``."""
        hh = np.asarray(Hs.multiply(Hs).sum(axis=1)).ravel()
        lev, null_energy = self._sparse_energies(Hs, hh)
        return self._covered(null_energy, hh, lev), lev

    def _covered(self, null_energy, hh, lev):
        # No null energy: the certificate holds, every row is in the span.
        if null_energy is None:
            return np.ones(hh.shape, dtype=bool)
        return null_energy <= self.allowance(hh, lev)

    def _energies(self, H, hh):
        """Leverage and null energy (None once identifiable) of rows H (n, t, psi), energies hh."""
        raise NotImplementedError

    def _sparse_energies(self, Hs, hh):
        raise NotImplementedError

    def witness_direction(self, h, h_norm):
        """The row of h (n, psi) farthest outside the span: index, unit null direction, norm."""
        raise NotImplementedError

    def unavailable(self, what):
        """The error for ``what``, which needs a null space this representation lacks."""
        if self.method == "lsmr":
            how = ("its Gram matrix on the active columns did not fit the memory budget, "
                   "so it found only a null vector")
        else:
            how = ("it never forms the psi x psi matrix and finds only the eigenvector of "
                   "lambda_min")
        return ValueError(
            f"{what} needs the null space of Lambda_D, which solver={self.method!r} does "
            f"not compute ({how}). Certify with a dense solver ('eigh', 'cholesky', "
            "'svd' or 'dual') when psi**2 floats fit in memory."
        )


class EigenBasis(RowSpace):
    """Eigenvalues and orthonormal eigenvectors (psi, k >= rank) ("eigh", "svd", "dual")."""

    resolves_null_space = True

    def __init__(self, solution, **kwargs):
        super().__init__(solution, **kwargs)
        if self._eigenvalues is None:
            raise ValueError("eigenvectors need their eigenvalues.")
        self.eigenvectors = np.asarray(solution.eigenvectors, dtype=np.float64)
        # Eigenvalues decrease, so the rank columns above tol come first.
        n_vec = self.eigenvectors.shape[1]
        if n_vec < self.rank:
            raise ValueError(
                f"{n_vec} eigenvectors cannot span the rank-{self.rank} row space."
            )
        self._complete = n_vec == self.n_features
        # Lowered by tol, the rounding they may carry.
        self._determined = np.maximum(self._eigenvalues[: self.rank] - self.tol, _TINY)
        self._basis_gram = None  # U^T U of the row basis, for sparse rows

    def _coordinates(self, H2):
        """Coordinates of rows H2 (n, psi) in the eigenvectors above tol."""
        return H2 @ self.eigenvectors[:, : self.rank]

    def _remainder(self, H2, coords):
        """``h - P h`` for rows H2 (n, psi) with coordinates ``coords``."""
        return H2 - coords @ self.eigenvectors[:, : self.rank].T

    def _project(self, H):
        """Rows H (n, t, psi) as one 2-D array, their coordinates and leverages (n, t)."""
        # One 2-D GEMM: a stacked (n, 1, psi) @ (psi, rank) product would
        # stream the eigenvectors once per sample.
        H2 = H.reshape(-1, H.shape[-1])
        coords = self._coordinates(H2)
        proj = coords.reshape(*H.shape[:-1], self.rank)
        return H2, coords, np.einsum("ntr,ntr->nt", proj, proj / self._determined)

    def quadratic(self, C):
        proj = self._coordinates(C.reshape(-1, C.shape[-1])).reshape(*C.shape[:-1], self.rank)
        return np.einsum("...r,r,...r->...", proj, self._eigenvalues[: self.rank], proj)

    def root(self, C):
        proj = self._coordinates(C.reshape(-1, C.shape[-1])).reshape(*C.shape[:-1], self.rank)
        return proj * np.sqrt(np.maximum(self._eigenvalues[: self.rank], 0.0))

    def _energies(self, H, hh):
        H2, coords, lev = self._project(H)
        if self.identifiable:
            return lev, None
        if self._complete:
            null = (H2 @ self.eigenvectors[:, self.rank:]).reshape(*H.shape[:-1], -1)
            return lev, np.einsum("ntk,ntk->nt", null, null)
        left = self._remainder(H2, coords).reshape(H.shape)
        return lev, np.einsum("ntp,ntp->nt", left, left)

    def _sparse_energies(self, Hs, hh):
        coords = np.asarray(self._coordinates(Hs))
        lev = (coords * coords / self._determined).sum(axis=1)
        if self.identifiable:
            return lev, None
        return lev, self._sparse_null_energy(Hs, coords, hh)

    def _sparse_null_energy(self, Hs, coords, hh):
        if self._complete:
            null = np.asarray(Hs @ self.eigenvectors[:, self.rank:])
            return (null * null).sum(axis=1)
        return self._sparse_remainder_energy(coords, hh)

    def _sparse_remainder_energy(self, coords, hh):
        # ||h - U p||^2 = ||h||^2 - 2 p.p + p^T (U^T U) p with p = U^T h, so
        # that sparse rows never form the psi-wide rest.  U^T U is not taken
        # to be I: eigenvectors formed from the row kernel ("dual", "lsmr"
        # with fewer rows than columns) are orthonormal only to rounding.
        if self._basis_gram is None:
            U = self.eigenvectors[:, : self.rank]
            self._basis_gram = U.T @ U
        return hh - 2 * (coords * coords).sum(axis=1) + (
            (coords @ self._basis_gram) * coords).sum(axis=1)

    def witness_direction(self, h, h_norm):
        H2, coords, lev = self._project(h[:, None, :])
        if self._complete:
            null_basis = self.eigenvectors[:, self.rank:]
            directions = (H2 @ null_basis) @ null_basis.T
        else:
            directions = self._remainder(H2, coords)
        null_norm = np.linalg.norm(directions, axis=1)
        # Farthest outside the coverage rule's allowance, so never covered.
        with np.errstate(over="ignore"):
            best = int(np.argmax(null_norm**2 / np.maximum(
                self.allowance(h_norm**2, lev[:, 0]), _TINY)))
        return best, directions[best] / null_norm[best], null_norm[best]


class ActiveEigenBasis(EigenBasis):
    """:class:`EigenBasis` in the coordinates (m, k) of the m active columns ("lsmr")."""

    def __init__(self, solution, **kwargs):
        super().__init__(solution, **kwargs)
        self.active = np.asarray(solution.active_columns, dtype=np.intp)

    def _coordinates(self, H2):
        return H2[:, self.active] @ self.eigenvectors[:, : self.rank]

    def _remainder(self, H2, coords):
        out = H2.copy()
        out[:, self.active] = H2[:, self.active] - coords @ self.eigenvectors[:, : self.rank].T
        return out

    def _sparse_null_energy(self, Hs, coords, hh):
        return self._sparse_remainder_energy(coords, hh)


class CholeskyRowSpace(RowSpace):
    """Lower Cholesky factor L of ``G = W Lambda_D`` (solver "cholesky"); no null space."""

    def __init__(self, solution, **kwargs):
        super().__init__(solution, **kwargs)
        self.factor = solution.factor

    @property
    def eigenvalues(self):
        if self._eigenvalues is None:
            L = self.factor
            self._eigenvalues = descending_eigh(L @ L.T, vectors=False) / self.weight_sum
        return self._eigenvalues

    def quadratic(self, C):
        z = C @ self.factor  # rows of L^T c, G = L L^T
        return np.einsum("...p,...p->...", z, z) / self.weight_sum

    def root(self, C):
        return (C @ self.factor) / np.sqrt(self.weight_sum)

    def _energies(self, H, hh):
        # h^T Lambda_D^{-1} h = W ||L^{-1} h||^2 with G = L L^T.
        flat = H.reshape(-1, H.shape[-1]).T
        z = scipy.linalg.solve_triangular(self.factor, flat, lower=True, check_finite=False)
        return self.weight_sum * np.einsum("pk,pk->k", z, z).reshape(H.shape[:-1]), None

    def witness_direction(self, h, h_norm):
        # Reached only when min_eigenvalue is above tol but its error bound is not.
        raise ValueError(
            "witness() needs a null direction of Lambda_D; solver='cholesky' keeps a "
            "Cholesky factor instead, and its certificate fails only through the error "
            "bound of min_eigenvalue. Certify with solver='eigh'."
        )


class NullVectorRowSpace(RowSpace):
    """One unit null direction and the extreme eigenvalues ("cg", "lsmr" beyond its budget)."""

    def __init__(self, solution, **kwargs):
        super().__init__(solution, **kwargs)
        self.null_vector = (None if solution.min_eigenvector is None
                            else np.asarray(solution.min_eigenvector, float))

    def _energies(self, H, hh):
        # No inverse of Lambda_D: the coarse bound ||h||^2 / lambda_min, with
        # lambda_min lowered by its error bound and by the rounding level.
        lower = self.lambda_min - self.lambda_min_error - self.tol
        return hh / max(lower, _TINY), None

    def witness_direction(self, h, h_norm):
        v = self.null_vector
        along = h @ v
        null_norm = np.abs(along)
        best = int(np.argmax(null_norm / h_norm))
        return best, v * np.sign(along[best]) / np.linalg.norm(v), null_norm[best]


def row_space_from_solution(solution, stats, tol=None):
    """The representation of Lambda_D that ``solution`` holds, at ``tol`` (None: the solver's)."""
    # Statistics summed field by field by an older caller may lack the
    # weight totals; without weights they equal the row count.
    W = stats.weight_sum if stats.weight_sum > 0 else float(stats.n_rows)
    if solution.eigenvectors is not None:
        cls = EigenBasis if solution.active_columns is None else ActiveEigenBasis
    elif solution.factor is not None:
        cls = CholeskyRowSpace
    else:
        cls = NullVectorRowSpace
    return cls(solution, d=stats.d, weight_sum=W, tol=tol,
               n_features=getattr(stats, "n_features", None))
