"""Preconditioned block conjugate gradients, and the Lanczos process CG carries out.

The matrix-free solver and the certificate's matrix-free eigenvalue bounds share it; the
user guide's "Large problems" page describes the method.
"""

import time

import numpy as np
import scipy.linalg

__all__ = ["ByColumns", "LanczosRecord", "pcg"]

# With a float32 cache, CG replaces its recursive residual by the exact one
# whenever it has dropped by this factor since the last replacement.
_CG_REPLACE = 1e-2


class ByColumns:
    """Different operators on the columns of a block: ``first`` below ``split``, ``second`` from
    it (None contributes zero), so that two systems share every product with G.
    """

    def __init__(self, split, first, second):
        self.split, self.first, self.second = split, first, second

    def __call__(self, V, idx):
        out = np.zeros_like(V)
        low = idx < self.split
        for mask, fn in ((low, self.first), (~low, self.second)):
            if fn is not None and mask.any():
                out[:, mask] = fn(V[:, mask])
        return out


def _apply(fn, V, idx):
    return fn(V, idx) if isinstance(fn, ByColumns) else fn(V)


def pcg(matmat, Bm, precond, penalty, rtol, max_iter, exact=None, record=None, stop=None,
        *, record_column=0, stop_columns=None, chain=None, info=None):
    """Preconditioned block CG on ``(G + penalty) X = Bm``, one independent recurrence per column.

    Returns ``(X, n_iter, rel)``, ``rel`` the final relative residuals (exact ones with
    ``exact``).  A column stops when ``rel <= rtol`` (a number or one per column), after
    ``max_iter`` of its iterations (counted afresh in each stage of a chain), or when
    ``stop(n_iter)`` returns True (for ``stop_columns``, default all).

    Parameters
    ----------
    precond, penalty : callable or ByColumns
        The products ``M^{-1} V`` and ``alpha P V`` (the ridge term; None: no penalty).
    exact : callable or None
        An accurate product when ``matmat`` is a cheaper, inexact one (a float32 cache): only
        exact residuals then stop a column, so ``rtol`` holds for the exact system.
    record : LanczosRecord or None
        Keeps the Lanczos vectors of column ``record_column`` (first stage only).
    chain : dict or None
        ``columns``, ``rtol`` (one per further stage) and an empty list ``solutions``: when
        these columns converge, their solution is appended (iteration count to
        ``iterations``, scale to ``scales``) and, divided by that scale, solved again
        (``G X_{j+1} = X_j``, no penalty); X holds the last stage's.
    info : dict or None
        Receives ``iterations`` and ``seconds`` (to each column's last stop), per column.
    """
    started = time.perf_counter()
    psi, k = Bm.shape
    Bm = Bm.copy()
    X = np.zeros_like(Bm)
    R = Bm.copy()
    rtol = np.broadcast_to(np.asarray(rtol, dtype=np.float64), (k,)).copy()
    bnorm = np.linalg.norm(Bm, axis=0)
    every = np.arange(k)
    Z = _apply(precond, R, every)
    D = Z.copy()
    rz = np.einsum("ik,ik->k", R, Z)
    if record is not None:
        record.add(Z[:, record_column], rz[record_column])
    active = (bnorm > 0) & (rz > 0)
    rel = np.where(bnorm > 0, 1.0, 0.0)
    replaced = rel.copy()  # relative residual at the last replacement
    stopped = np.zeros(k, dtype=bool)  # ended by ``stop`` (not converged)
    cap = np.broadcast_to(np.asarray(max_iter), (k,))
    count = np.zeros(k, dtype=int)
    stage_rtol = [] if chain is None else list(chain["rtol"])
    n_iter = 0
    seconds = np.zeros(k)
    was_active = active.copy()
    while True:
        rel[active] = np.linalg.norm(R[:, active], axis=0) / bnorm[active]
        if exact is not None:
            check = active & ((rel <= rtol) | (rel <= _CG_REPLACE * replaced))
            if check.any():
                # Every active column whose residual fell since its last
                # replacement joins: an exact product streams the data once,
                # whatever the number of columns.
                idx = np.flatnonzero(active & (rel < replaced))
                Q = exact(X[:, idx])
                if penalty is not None:
                    Q += _apply(penalty, X[:, idx], idx)
                R[:, idx] = Bm[:, idx] - Q
                rel[idx] = np.linalg.norm(R[:, idx], axis=0) / bnorm[idx]
                replaced[idx] = rel[idx]
                rz[idx] = np.einsum("ik,ik->k", R[:, idx], _apply(precond, R[:, idx], idx))
        active &= (rel > rtol) & (count < cap)
        if stop is not None and stop(n_iter):
            cols = every if stop_columns is None else np.asarray(stop_columns)
            stopped[cols[active[cols]]] = True
            active[cols] = False
        if stage_rtol and not active[chain["columns"]].any():
            cols = np.asarray(chain["columns"])
            if stopped[cols].any() or (count[cols] >= cap[cols]).any():
                stage_rtol = []
            else:
                # Next stage: the solution becomes the right-hand side, divided
                # by its largest column norm (the stages grow like
                # lambda_min^-j, which a float32 cache could not hold).
                chain["solutions"].append(X[:, cols].copy())
                chain.setdefault("iterations", []).append(int(count[cols].max()))
                scale = float(np.linalg.norm(X[:, cols], axis=0).max())
                scale = scale if scale > 0 and np.isfinite(scale) else 1.0
                chain.setdefault("scales", []).append(scale)
                Bm[:, cols] = X[:, cols] / scale
                X[:, cols], R[:, cols] = 0.0, Bm[:, cols]
                bnorm[cols] = np.linalg.norm(Bm[:, cols], axis=0)
                rtol[cols] = stage_rtol.pop(0)
                Zc = _apply(precond, R[:, cols], cols)
                D[:, cols] = Zc
                rz[cols] = np.einsum("ik,ik->k", R[:, cols], Zc)
                active[cols] = (bnorm[cols] > 0) & (rz[cols] > 0)
                rel[cols] = np.where(bnorm[cols] > 0, 1.0, 0.0)
                replaced[cols] = rel[cols]
                count[cols] = 0
                if record is not None and record_column in cols:
                    record = None
        seconds[was_active & ~active] = time.perf_counter() - started
        was_active = active.copy()
        if not active.any():
            break
        idx = np.flatnonzero(active)
        Da = D[:, idx]
        Q = matmat(Da)
        if penalty is not None:
            Q += _apply(penalty, Da, idx)
        dq = np.einsum("ik,ik->k", Da, Q)
        ok = dq > 0
        step = np.where(ok, rz[idx] / np.where(ok, dq, 1.0), 0.0)
        X[:, idx] += step * Da
        R[:, idx] -= step * Q
        Za = _apply(precond, R[:, idx], idx)
        rz_new = np.einsum("ik,ik->k", R[:, idx], Za)
        beta = np.where(rz[idx] > 0, rz_new / np.where(rz[idx] > 0, rz[idx], 1.0), 0.0)
        D[:, idx] = Za + beta * Da
        rz[idx] = rz_new
        pos = np.flatnonzero(idx == record_column)
        if record is not None and pos.size:
            j = pos[0]
            if ok[j]:
                record.add(Za[:, j], rz_new[j], step[j], beta[j])
            else:
                record.null_direction = Da[:, j].copy()  # G d = 0 to rounding
        active[idx[~ok | (rz_new <= 0)]] = False  # exact solution or breakdown
        count[idx] += 1
        n_iter += 1
    nonzero = bnorm > 0
    if exact is not None and nonzero.any():
        # Report exact residuals (a column may have stopped on a breakdown or at max_iter).
        stale = np.flatnonzero(nonzero & (replaced != rel))
        if stale.size:
            Q = exact(X[:, stale])
            if penalty is not None:
                Q += _apply(penalty, X[:, stale], stale)
            R[:, stale] = Bm[:, stale] - Q
    rel[nonzero] = np.linalg.norm(R[:, nonzero], axis=0) / bnorm[nonzero]
    if info is not None:
        info["iterations"], info["seconds"] = count, seconds
    return X, n_iter, rel


class LanczosRecord:
    """Lanczos vectors (float32) and coefficients of one column of preconditioned CG on
    ``G x = b``, which is Lanczos on the pencil ``(G, M)``.
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
