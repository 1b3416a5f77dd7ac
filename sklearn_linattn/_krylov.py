"""Preconditioned conjugate gradients, and the Lanczos process CG carries out.

The matrix-free solver and the certificate's matrix-free eigenvalue bounds
share this Krylov machinery: block CG with residual replacement (so that
inexact float32 products still give exact float64 residuals), and the
Lanczos record of CG's first column (CG on ``G x = b`` preconditioned by
``M^{-1}`` is Lanczos on the pencil ``(G, M)``).
"""

import numpy as np
import scipy.linalg

__all__ = ["LanczosRecord", "pcg"]

# With a float32 cache, CG replaces its recursive residual by the exact one
# whenever it has dropped by this factor since the last replacement.
_CG_REPLACE = 1e-2


def pcg(matmat, Bm, precond, penalty, rtol, max_iter, exact=None, record=None, stop=None):
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

    ``record`` (a :class:`LanczosRecord`) keeps the Lanczos vectors and
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


class LanczosRecord:
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
