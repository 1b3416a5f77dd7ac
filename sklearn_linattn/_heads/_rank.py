"""Heads of a given head dimension: the best layer with ``n_heads`` heads whose key-query and
value matrices have rank at most ``head_dim``, fitted on the statistics of the closed form.

The training risk of coefficients c is exactly ``R* + (c - c*)^T Lambda_D (c - c*)`` (c* the
unconstrained minimizer), so the best constrained layer minimises that quadratic over
``c = p(V, Q)`` with ``V_h = O_h P_h^T`` and ``Q_h = A_h B_h^T`` (factors of r columns).  The
map is linear in each factor with the others fixed: alternating least squares, each step an
exact least squares in the metric of ``Lambda_D``, from the closed form's heads truncated to
rank r and from random starts.  Its excess over R* is the certified gap: every layer of the
architecture has a training risk of at least R*.
"""

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from .._features import pair_indices
from .._params import validate_random_state
from ._compression import heads_from_coefficients

__all__ = ["LowRankHeads", "fit_low_rank_heads"]

# Alternating steps at most per start and their stall (relative decrease), then
# Levenberg-Marquardt steps at most and theirs.
_ALS_ITER, _ALS_STALL = 50, 1e-3
_MAX_ITER, _STALL = 100, 1e-12
# An excess below this squared, relative to the fit's explained energy, is rounding.
_EXACT_RELATIVE = 1e-12
# Random starts beside the closed form's truncated heads.
_RANDOM_STARTS = 4


@dataclass
class LowRankHeads:
    """Heads in standardized coordinates and their excess risk over the unconstrained fit.

    ``excess`` (d_out,): ``(c - c*)^T Lambda_D (c - c*)`` per output, in the standardized
    targets' units; ``n_iter``: alternating steps of the best start.
    """

    V: np.ndarray
    Q: np.ndarray
    excess: np.ndarray
    n_iter: int


def _single_head_coefficients(V, Q, pair_weights):
    """Standardized coefficients (k, d_out, P * d) of k single heads V (k, d_out, d), Q (k, d, d)."""
    d = Q.shape[1]
    j, k = pair_indices(d)
    off = (j != k)[:, None]
    folded = (np.einsum("nap,npl->napl", V[:, :, j], Q[:, k, :])
              + np.einsum("nap,npl->napl", V[:, :, k], Q[:, j, :] * off))
    return (folded / pair_weights[:, None]).reshape(V.shape[0], V.shape[1], -1)


class _Objective:
    """``sum_a (c_a - c*_a)^T Lambda_D (c_a - c*_a)`` and its least squares in one factor."""

    def __init__(self, coef, row_space, gram, weight_sum, pair_weights):
        self.coef, self.pair_weights = coef, pair_weights
        self.root = getattr(row_space, "root", None)
        if self.root is not None and self.root(coef[:1]) is None:
            self.root = None
        self.gram, self.W = gram, weight_sum
        if self.root is None and gram is None:
            raise ValueError(
                "head_dim needs the training risk as a quadratic form of the coefficients: "
                "a solver that keeps the Gram matrix, its factor or the rows ('eigh', "
                "'cholesky', 'svd', 'dual', or 'cg' on data in memory); got a solve that "
                "keeps none (Dask input with 'cg').")

    def excess(self, C):
        """Per output, the excess of standardized coefficients C (d_out, psi)."""
        delta = C - self.coef
        if self.root is not None:
            R = self.root(delta)
            return np.einsum("ar,ar->a", R, R)
        return np.einsum("pa,ap->a", self.gram(delta.T), delta) / self.W

    def least_squares(self, L, target=None):
        """``solve(damping)``: theta (k,) minimising the excess of ``L theta`` over ``target``
        (default c*) plus ``damping ||theta||**2``; L (d_out, psi, k).  Of minimum norm among
        the minimizers (the factorization's own freedoms); one decomposition serves every
        damping."""
        target = self.coef if target is None else target
        d_out, psi, k = L.shape
        if self.root is not None:
            A = self.root(L.transpose(0, 2, 1).reshape(d_out * k, psi))
            A = A.reshape(d_out, k, -1).transpose(0, 2, 1).reshape(-1, k)
            U, sv, Vt = scipy.linalg.svd(A, full_matrices=False, check_finite=False)
            keep = sv > max(A.shape) * np.finfo(np.float64).eps * sv[:1].max(initial=0.0)
            Ub = U[:, keep].T @ self.root(target).reshape(-1)
            sv, Vt = sv[keep], Vt[keep]
            return lambda damping=0.0: Vt.T @ (sv / (sv**2 + damping) * Ub)
        GL = self.gram(L.transpose(1, 0, 2).reshape(psi, d_out * k)).reshape(psi, d_out, k)
        normal = np.einsum("apk,pam->km", L, GL) / self.W
        rhs = np.einsum("pak,ap->k", GL, target) / self.W
        e, E = scipy.linalg.eigh((normal + normal.T) / 2, check_finite=False)
        keep = e > k * np.finfo(np.float64).eps * e[-1:].max(initial=0.0)
        Er = E[:, keep].T @ rhs
        e, E = e[keep], E[:, keep]
        return lambda damping=0.0: E @ (Er / (e + damping))


def _factor_map(i, O, P, A, B, pair_weights):
    """The linear map (d_out, psi, k) of factor i (O, P, A or B) to the coefficients, the
    others fixed: one single head per entry of the factor, that entry 1 and the rest 0."""
    H, d_out, r = O.shape
    d = P.shape[1]
    if i < 2:  # V_h = O_h P_h^T
        Q = np.einsum("hki,hli->hkl", A, B)
        if i == 0:
            Vs = np.einsum("ab,hji->haibj", np.eye(d_out), P).reshape(-1, d_out, d)
        else:
            Vs = np.einsum("jk,hai->hkiaj", np.eye(d), O).reshape(-1, d_out, d)
        Qs = np.repeat(Q, Vs.shape[0] // H, axis=0)
    else:  # Q_h = A_h B_h^T
        V = np.einsum("hai,hji->haj", O, P)
        if i == 2:
            Qs = np.einsum("km,hli->hmikl", np.eye(d), B).reshape(-1, d, d)
        else:
            Qs = np.einsum("lm,hki->hmikl", np.eye(d), A).reshape(-1, d, d)
        Vs = np.repeat(V, Qs.shape[0] // H, axis=0)
    return _single_head_coefficients(Vs, Qs, pair_weights).transpose(1, 2, 0)


def _coefficients(O, P, A, B, pair_weights):
    V = np.einsum("hai,hji->haj", O, P)
    Q = np.einsum("hki,hli->hkl", A, B)
    return _single_head_coefficients(V, Q, pair_weights).sum(axis=0), V, Q


def _balanced(O, P, A, B):
    """Each factor pair rescaled to equal norms (the same heads), so no factor runs away."""
    def even(X, Y):
        nx, ny = np.linalg.norm(X, axis=(1, 2)), np.linalg.norm(Y, axis=(1, 2))
        s = np.where((nx > 0) & (ny > 0), np.sqrt(ny / np.where(nx > 0, nx, 1.0)), 1.0)
        return X * s[:, None, None], Y / s[:, None, None]
    O, P = even(O, P)
    A, B = even(A, B)
    return O, P, A, B


def _run(objective, start, pair_weights):
    """Alternating least squares from one start, then Levenberg-Marquardt on every factor at
    once (alternation alone converges linearly): ``(O, P, A, B, excess, n_iter)``."""
    factors = list(start)
    shapes = [f.shape for f in factors]
    sizes = np.cumsum([0] + [int(np.prod(shape)) for shape in shapes])
    total = float(objective.excess(_coefficients(*factors, pair_weights)[0]).sum())
    n_iter = 0
    for n_iter in range(1, _ALS_ITER + 1):
        for i in range(4):
            L = _factor_map(i, *factors, pair_weights)
            factors[i] = objective.least_squares(L)().reshape(shapes[i])
        factors = list(_balanced(*factors))
        new = float(objective.excess(_coefficients(*factors, pair_weights)[0]).sum())
        done = new >= total * (1 - _ALS_STALL) or new == 0.0
        total = new
        if done:
            break
    damping = None
    for _ in range(_MAX_ITER):
        if total == 0.0:
            break
        c = _coefficients(*factors, pair_weights)[0]
        L = np.concatenate([_factor_map(i, *factors, pair_weights) for i in range(4)], axis=2)
        if damping is None:  # scaled to the Jacobian's size
            damping = 1e-3 * float(np.mean(L**2)) * L.shape[1]
        improved = False
        solve = objective.least_squares(L, objective.coef - c)
        while damping < 1e300:
            step = solve(damping)
            trial = [f + step[a:b].reshape(shape)
                     for f, a, b, shape in zip(factors, sizes[:-1], sizes[1:], shapes)]
            new = float(objective.excess(_coefficients(*trial, pair_weights)[0]).sum())
            if new < total:
                factors, improved = list(_balanced(*trial)), True
                damping /= 10
                break
            damping *= 10
        n_iter += 1
        if not improved or new >= total * (1 - _STALL):
            total = min(total, new)
            break
        total = new
    excess = objective.excess(_coefficients(*factors, pair_weights)[0])
    return (*factors, excess, n_iter)


def _truncated_start(coef, d, n_heads, r, pair_weights):
    """The closed form's largest heads (of its SVD), each factor truncated to rank r."""
    folded = (coef.reshape(coef.shape[0], -1, d) * pair_weights[:, None]).reshape(coef.shape)
    V, Q = heads_from_coefficients(folded, d)
    d_out = coef.shape[0]
    O, P = np.zeros((n_heads, d_out, r)), np.zeros((n_heads, d, r))
    A, B = np.zeros((n_heads, d, r)), np.zeros((n_heads, d, r))
    for h in range(min(n_heads, len(V))):
        u, s, vt = np.linalg.svd(V[h], full_matrices=False)
        m = min(r, s.size)
        O[h, :, :m], P[h, :, :m] = u[:, :m] * np.sqrt(s[:m]), vt[:m].T * np.sqrt(s[:m])
        u, s, vt = np.linalg.svd(Q[h])
        A[h], B[h] = u[:, :r] * np.sqrt(s[:r]), vt[:r].T * np.sqrt(s[:r])
    return O, P, A, B


def fit_low_rank_heads(coef, row_space, counts, pair_weights, *, n_heads, head_dim, gram=None,
                       random_state=None, log=None):
    """The best heads of rank at most ``head_dim`` found, in standardized coordinates.

    Parameters
    ----------
    coef : ndarray of shape (d_out, psi)
        The unconstrained standardized coefficients c*.
    row_space : RowSpace
        The certificate's ``Lambda_D`` (its ``root``), or None with ``gram``.
    counts : RowCounts
        ``weight_sum`` of the rows.
    pair_weights : ndarray of shape (P,)
        Weights of the folded moments in the standardized features.
    n_heads, head_dim : int
        Heads of the layer and the rank of each head's V and Q.
    gram : callable or None
        ``gram(C)``: exact products ``G C`` (C of shape (psi, k)), where the row
        space has no root.
    random_state : None, int or RandomState
        Seeds the random starts.
    log : callable or None
        ``log(message)`` for ``verbose`` progress.

    Returns
    -------
    LowRankHeads
    """
    d_out, psi = coef.shape
    d = psi // pair_weights.size
    r = head_dim
    objective = _Objective(coef, row_space, gram, counts.weight_sum, pair_weights)
    rng = validate_random_state(random_state)
    scale = np.sqrt(np.linalg.norm(coef) / max(n_heads, 1)) or 1.0
    starts = [_truncated_start(coef, d, n_heads, r, pair_weights)]
    for _ in range(_RANDOM_STARTS):
        starts.append(tuple(rng.standard_normal(shape) * np.sqrt(scale) / np.sqrt(shape[1])
                            for shape in ((n_heads, d_out, r), (n_heads, d, r),
                                          (n_heads, d, r), (n_heads, d, r))))
    # A start that reproduces c* to rounding is the best there is: no more starts.
    exact = _EXACT_RELATIVE**2 * float(objective.excess(np.zeros_like(coef)).sum())
    best = None
    for start in starts:
        O, P, A, B, excess, n_iter = _run(objective, start, pair_weights)
        if best is None or excess.sum() < best[4].sum():
            best = (O, P, A, B, excess, n_iter)
        if best[4].sum() <= exact:
            break
    O, P, A, B, excess, n_iter = best
    _, V, Q = _coefficients(O, P, A, B, pair_weights)
    if log is not None:
        log(f"{n_heads} heads of dimension {head_dim} (best of {len(starts)} starts, "
            f"{n_iter} alternating steps)")
    return LowRankHeads(V, Q, excess, n_iter)
