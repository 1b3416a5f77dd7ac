"""The matrix-free solver ``"cg"``: preconditioned CG on implicit normal equations."""

import functools
import time
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from .._memory import n_pairs, resolve_budget
from .._namespace import active
from .._spectrum import eigenvalue_tolerance, implicit_extremes
from ._solution import SpectralSolution, ridge_penalty, zero_design_solution

__all__ = ["cg_cache_dtype", "solve_cg", "solve_implicit"]

# Default iteration cap of "cg".
_CG_MAX_ITER = 1000
# "cg" caches the row factors (folded moments, last tokens, weights) in
# float64 when they fit in this fraction of the memory budget, else in
# float32 (then every result is checked with exact float64 products streamed
# from X) when they fit in that fraction.
_CG_CACHE_FRACTION = {np.dtype(np.float64): 1 / 8, np.dtype(np.float32): 1 / 4}


class _KroneckerPreconditioner:
    """Inverse of ``(A kron B) / W + alpha I``, an approximation of ``G + alpha I``.

    ``A = S^T W S`` (P x P) and ``B = x^T W x`` (d x d) are the second
    moments of the two factors of the rows ``kron(S_r, x_r)``; if they were
    independent, ``E[h h^T] = E[S S^T] kron E[x x^T]``.  The eigenvectors of
    A and B diagonalise both terms, so applying the inverse costs
    O(P^2 d + P d^2) per vector.  ``range(G)`` lies in ``range(A) kron range(B)``: the
    positive-semidefinite version (``definite=False``, alpha = 0) inverts
    there (where the eigenvalues of ``A kron B / W`` exceed the zero
    threshold of a Gram matrix of psi features) and is zero elsewhere, so
    that iterates never leave the span of the data.
    """

    def __init__(self, A, B, weight_sum, alpha, dtype):
        self.P, self.d = A.shape[0], B.shape[0]
        ns = active()  # A is P x P (P = d (d + 1) / 2): 2080 x 2080 at d = 64
        wa, self.Ua = scipy.linalg.eigh(A, check_finite=False) if ns.is_numpy else ns.eigh(A)
        wb, self.Ub = scipy.linalg.eigh(B, check_finite=False)
        wa, wb = np.clip(wa, 0.0, None), np.clip(wb, 0.0, None)
        D = np.outer(wa, wb) / max(weight_sum, np.finfo(np.float64).tiny)
        # The zero rule of the psi x psi Gram matrix, applied to the eigenvalues
        # of its Kronecker model: a null eigenvalue of the small B computed as a
        # few epsilons above B's own d x d threshold would otherwise be inverted
        # (1e12 times the others) and make CG diverge on rank-deficient data.
        floor = eigenvalue_tolerance(D.max(), self.P * self.d, dtype)
        keep = D > floor
        D = D + min(alpha, np.finfo(np.float64).max / 4)
        self.inv = np.zeros_like(D)
        if alpha > 0:
            self.inv = 1.0 / np.maximum(D, np.finfo(np.float64).tiny)
        else:
            self.inv[keep] = 1.0 / D[keep]
        self.inv_definite = 1.0 / np.maximum(D, max(floor, np.finfo(np.float64).tiny))
        # Extreme eigenvalues of the definite M (the inverse of inv_definite).
        self.min_eigenvalue = float(1.0 / self.inv_definite.max())
        self.max_eigenvalue = float(1.0 / self.inv_definite.min())

    def apply(self, R, definite=False):
        return self._diagonal_product(R, self.inv_definite if definite else self.inv)

    def multiply(self, R):
        """``M R`` for the definite M whose inverse is ``apply(R, definite=True)``."""
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


def cg_cache_dtype(n_rows, d, memory_budget=None, n_blocks=1):
    """Dtype of the row-factor cache of "cg": float64 or float32 if it fits, else None.

    The cache holds ``n_rows * (n_blocks * P + d + 1)`` values (``n_blocks``
    decays): float64 when they fit in
    1/8 of ``memory_budget`` (None: half the physical memory), else
    float32 when they fit in 1/4 of it.  (d = 64, N = 150 000: 2.6 GB in
    float64, 1.3 GB in float32; with 24 GB of memory the budget is 12 GB and
    the cache float32.)
    """
    budget = resolve_budget(memory_budget)
    values = n_rows * (n_blocks * n_pairs(d) + d + 1)
    for dtype, fraction in _CG_CACHE_FRACTION.items():
        if values * dtype.itemsize <= fraction * budget:
            return dtype
    return None


def _fixed_cache(dtype, n_rows, d, n_blocks=1):
    """The cache dtype asked for (a rule of :meth:`~.._moments.RowReader.gram_operator`)."""
    return dtype


def solve_cg(rows, alpha=0.0, options=None):
    """Matrix-free fit: preconditioned CG on the normal equations, certificate by Lanczos and LOBPCG.

    Never forms ``Phi`` nor ``G``: ``rows`` (a :class:`~.._moments.RowReader`,
    or the persisted blocks of a dask array) give the operator
    (``rows.gram_operator``), which caches the row factors in float64 or
    float32 when they fit the memory budget (a float32 cache is checked by
    exact float64 products, so the results keep float64 guarantees).  Stops
    at a relative residual ``tol``; with ``alpha=0`` on a rank-deficient
    design returns the least-squares solution of minimal preconditioned norm.
    ``options``: ``tol``, ``max_iter`` (default 1000), ``memory_budget``,
    optionally ``cache_dtype`` ("auto", None, "float32", "float64"),
    ``residuals`` (True: keep ``G coef^T`` and the normal-equation residual
    of an unpenalized fit, for the term columns' certificate) and ``counts``
    (a RowCounts to fill from the setup pass, when the rows were not counted
    before).  The algorithm: the user guide's theory page, "Solvers".
    """
    options = {} if options is None else options
    cache_dtype = options.get("cache_dtype", "auto")
    if isinstance(cache_dtype, str) and cache_dtype == "auto":
        rule = functools.partial(cg_cache_dtype, memory_budget=options.get("memory_budget"))
    else:
        rule = functools.partial(_fixed_cache, cache_dtype)
    started = time.perf_counter()
    op = rows.gram_operator(rule)
    setup = op.setup(options.get("counts"))
    setup_seconds = time.perf_counter() - started
    solution = solve_implicit(op, setup, standardizer=rows.standardizer,
                              dtype=rows.dtype, alpha=alpha, options=options)
    solution.gram_product = op.gram_product
    if solution.diagnostics is not None:
        solution.diagnostics.update(setup_seconds=setup_seconds, products=op.n_products)
    return solution


def solve_implicit(op, setup, *, standardizer, dtype, alpha=0.0, options=None):
    """The fit and certificate of "cg" on any implicit Gram operator.

    ``op`` has ``psi``, ``exact``, ``matmat(V)`` and ``matmat_exact(V)``
    (:class:`~.._moments.ImplicitGram`, or one whose products are reductions
    over the blocks of a dask array); ``setup`` is what its ``setup`` returns,
    summed over all rows (``b`` None: the certificate alone).
    ``options`` as for :func:`solve_cg` (``tol``, ``max_iter``,
    ``memory_budget``, ``seed``).
    """
    options = {} if options is None else options
    tol, max_iter = options.get("tol", 1e-8), options.get("max_iter")
    memory_budget = options.get("memory_budget")
    has_targets = setup["b"] is not None
    if not setup["trace"] > 0:
        solution = zero_design_solution(op.psi, setup["b"].shape[0] if has_targets else None,
                                        standardizer, "cg")
        solution.moment = None if not has_targets else setup["b"].T
        return solution
    precond = _KroneckerPreconditioner(setup["A"], setup["B"], setup["weight_sum"],
                                       0.0, dtype)
    coef, n_iter = None, 0
    if has_targets:
        max_iter = _CG_MAX_ITER if max_iter is None else int(max_iter)
        fit_precond, penalty = precond, None
        ridge = ridge_penalty(alpha, setup["trace"], op.psi)
        if ridge > 0:
            fit_precond = _KroneckerPreconditioner(setup["A"], setup["B"],
                                                   setup["weight_sum"], ridge, dtype)
            penalty = lambda V: ridge * V  # noqa: E731
        fit = dict(rhs=setup["b"].T, precond=fit_precond.apply, penalty=penalty, tol=tol,
                   max_iter=max_iter)
    # The fit's CG and the certificate's probes share every pass over the data.
    ext = implicit_extremes(op, precond, dtype, memory_budget=memory_budget,
                            fit=fit if has_targets else None, seed=options.get("seed"))
    if has_targets:
        C, n_iter, rel = ext["fit"]
        if np.any(rel > tol):
            warnings.warn(
                f"solver='cg' stopped after {n_iter} iterations with a relative residual of "
                f"{rel.max():.3g} > tol={tol:g}; increase max_iter or tol.",
                ConvergenceWarning,
            )
        coef = C.T
    gram_coef = residual = None
    if has_targets and not alpha and options.get("residuals"):
        # One exact product: what a rigorous bound of the term columns' Schur
        # complement needs (the CG residual is only below tol).
        gram_coef = op.matmat_exact(coef.T)
        residual = setup["b"].T - gram_coef
    identifiable = ext["lambda_min"] - ext["error"] > ext["tol"]
    # Stopped at tol, the coefficients are that far from the minimizer, times
    # the square root of the condition number.
    floor = ext["lambda_min"] - ext["error"]
    accuracy = tol * np.sqrt(ext["lambda_max"] / floor) if floor > 0 else None
    if identifiable:
        rank = op.psi
    else:
        rank = op.psi - max(1, int(np.count_nonzero(ext["values"] <= ext["tol"])))
    return SpectralSolution(
        coef=coef,
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
        moment=setup["b"].T if has_targets else None,
        diagnostics=ext.get("diagnostics"),
        gram_coef=gram_coef,
        normal_residual=residual,
        coef_accuracy=accuracy,
    )
