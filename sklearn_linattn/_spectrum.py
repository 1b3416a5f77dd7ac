"""Eigenvalues of the feature Gram matrix: the zero rule, and bounds with their errors.

Each function says how far its answer can be from the truth; the methods are
described in the user guide's :ref:`certificate-solvers`.
"""

import time
import warnings

import numpy as np
import scipy.linalg
import scipy.stats
from scipy.linalg.blas import get_blas_funcs
from scipy.sparse.linalg import (
    ArpackError,
    ArpackNoConvergence,
    LinearOperator,
    eigsh,
    lobpcg,
    svds,
)
from sklearn.exceptions import ConvergenceWarning

from ._krylov import ByColumns, LanczosRecord, pcg
from ._memory import resolve_budget
from ._namespace import active

__all__ = [
    "descending_eigh",
    "eigenvalue_tolerance",
    "implicit_extremes",
    "largest_eigenvalue",
    "probe_threshold",
    "randomized_lower_bound",
    "smallest_eigenvalue_from_cholesky",
    "sparse_largest_eigenvalue",
    "start_vectors",
]

# Relative accuracy asked of Lanczos (ARPACK) for the extreme eigenvalues of
# the dense Gram matrix ("cholesky") and for lambda_max of the implicit one.
_LANCZOS_RTOL = 1e-10
_IMPLICIT_LMAX_RTOL = 1e-8
# On float32 products, Lanczos only locates the eigenvector; the exact
# Rayleigh quotient of its Ritz vector is then accurate to the square of this.
_IMPLICIT_LMAX_RTOL_FLOAT32 = 1e-4
# "cg" certificate: LOBPCG block size and the relative residual it stops at.
_LOBPCG_BLOCK = 4
_LOBPCG_RTOL = 1e-4
_LOBPCG_FIRST_ROUND = 30
_LOBPCG_ROUND = 30
_LOBPCG_MAX_ITER = 300
# "cg" certificate, first stage: preconditioned CG from a random right-hand
# side (Lanczos on the pencil (G, M), M the Kronecker preconditioner), a check
# for a null direction every _PENCIL_CHECK steps, at most _PENCIL_MAX_ITER
# steps (fewer when the float32 Lanczos vectors would take more than
# _PENCIL_MEMORY_FRACTION of the memory budget).
_PENCIL_CHECK = 10
# Its randomized lower bound holds except with probability _FAILURE, from
# _PROBES standard normal probes (drawn from _PROBE_SEED) solved along with
# the fit; the second stage (G X_2 = X_1) stops at the relative residual
# _STAGE2_RTOL.
_FAILURE = 8e-4
_PROBES = 2
_PROBE_SEED = 1
_STAGE2_RTOL = 1e-2
_PENCIL_MAX_ITER = 600
_PENCIL_MEMORY_FRACTION = 1 / 16


def eigenvalue_tolerance(lambda_max, n_features, dtype=np.float64):
    """The one rule for when an eigenvalue of the feature Gram matrix is zero.

    An eigenvalue counts as zero when it is at most the returned
    ``lambda_max * n_features * max(eps64, eps_in**2)``, ``eps_in`` the
    machine epsilon of ``dtype`` (the least precise input dtype).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._spectrum import eigenvalue_tolerance
    >>> eigenvalue_tolerance(1.0, 10) == 10 * float(np.finfo(np.float64).eps)
    True
    """
    # Python floats throughout: a float32 epsilon would make the product
    # float32, which rounds the threshold and overflows for lambda_max > 3e38.
    eps_in = float(np.finfo(np.dtype(dtype)).eps) if np.dtype(dtype).kind == "f" else 0.0
    rel = max(float(np.finfo(np.float64).eps), eps_in**2)
    return float(lambda_max) * n_features * rel


def rank_tolerance(w, n_features, dtype=np.float64, n_rows=None):
    """:func:`eigenvalue_tolerance` of a spectrum, raised so that at most ``n_rows`` exceed it.

    ``w`` is in decreasing order; ``n_rows`` (None: no bound) is the number of
    rows of positive weight, which bounds the rank.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._spectrum import rank_tolerance
    >>> w = np.array([4.0, 2.0, 1e-9, 0.0])
    >>> int(np.count_nonzero(w > rank_tolerance(w, 4))), int(np.count_nonzero(
    ...     w > rank_tolerance(w, 4, n_rows=2)))
    (3, 2)
    """
    tol = eigenvalue_tolerance(w[0] if w.size else 0.0, n_features, dtype)
    if n_rows is not None and 0 <= n_rows < w.size and w[n_rows] > tol:
        tol = float(w[n_rows])
    return tol


def descending_eigh(A, *, vectors=True, overwrite_a=False):
    """Eigenvalues of a symmetric matrix in decreasing order, clipped at 0, and eigenvectors.

    Returns ``w`` or ``(w, U)`` with ``A = U diag(w) U^T`` to rounding.
    """
    ns = active()
    if not vectors:
        w = (scipy.linalg.eigvalsh(A, overwrite_a=overwrite_a) if ns.is_numpy
             else ns.eigvalsh(A))
        return np.clip(w[::-1], 0.0, None)
    if ns.is_numpy:
        w, U = scipy.linalg.eigh(A, driver="evr", overwrite_a=overwrite_a, check_finite=False)
    else:
        w, U = ns.eigh(A)
    return np.clip(w[::-1], 0.0, None), U[:, ::-1]


def start_vectors(n, k=1):
    """Deterministic start vectors for the iterative eigensolvers."""
    return np.random.default_rng(0).standard_normal((n, k))


def largest_eigenvalue(G):
    """lambda_max of a dense symmetric matrix by Lanczos (relative accuracy _LANCZOS_RTOL).

    Of a C-ordered G only the upper triangle is read.
    """
    ns = active()
    if not ns.vector_products:
        A = G.T if G.T.flags.f_contiguous else np.asfortranarray(G)
        symv = get_blas_funcs("symv", (A,))

        def product(v):
            return symv(1.0, A, v, lower=1)
    else:
        A, product = G, ns.symmetric_product(G)

    op = LinearOperator(A.shape, matvec=product, dtype=A.dtype)
    v0 = start_vectors(A.shape[0])[:, 0]
    return float(eigsh(op, k=1, which="LA", tol=_LANCZOS_RTOL, v0=v0,
                       return_eigenvectors=False)[0])


def smallest_eigenvalue_from_cholesky(L):
    """lambda_min of ``L L^T`` by Lanczos on its inverse (two triangular solves per step).

    Returns ``(lambda_min, error_bound)`` or None when Lanczos fails.
    """
    psi = L.shape[0]
    inverse = active().cholesky_inverse_product(L) if active().vector_products else None
    if inverse is None:
        trsv = get_blas_funcs("trsv", (L,))

        def inverse(v):
            return trsv(L, trsv(L, v, lower=1), lower=1, trans=1)

    op = LinearOperator((psi, psi), matvec=inverse, dtype=np.float64)
    try:
        mu = float(eigsh(op, k=1, which="LA", tol=_LANCZOS_RTOL,
                         v0=start_vectors(psi)[:, 0], return_eigenvectors=False)[0])
    except (ArpackNoConvergence, ArpackError):
        return None
    if not np.isfinite(mu) or mu <= 0:
        return None
    return 1.0 / mu, _LANCZOS_RTOL / mu


def probe_threshold(n_probes, failure=_FAILURE):
    """``delta`` with ``P(||g|| < delta) = failure`` for a standard normal g in R^n_probes."""
    return float(np.sqrt(scipy.stats.chi2.ppf(failure, n_probes)))


def randomized_lower_bound(delta, solutions, residuals):
    """Lower bound on lambda_min from chained solves ``G X_j ~ X_{j-1}``, ``X_0 = B``.

    Holds whenever ``||B^T u|| >= delta`` for the unit eigenvector u of
    lambda_min; the largest of the bounds for J = 1, 2 stages.
    """
    x = [np.linalg.norm(s, 2) if s.size else 0.0 for s in solutions]
    r = [np.linalg.norm(s, 2) if s.size else 0.0 for s in residuals]
    if not x or x[0] <= 0:
        return -np.inf
    lower = (delta - r[0]) / x[0]
    if lower > 0 and len(x) > 1 and x[1] > 0:
        # ||X_2|| l^2 + ||R_2|| l + ||R_1|| = delta: the positive root, in
        # the form that does not cancel.
        c = delta - r[0]
        lower = max(lower, 2 * c / (r[1] + np.sqrt(r[1] ** 2 + 4 * x[1] * c)))
    return float(lower)


def _pencil_lanczos(op, precond, tol, block, memory_budget=None, fit=None, n_probes=None,
                    seed=None):
    """Bounds on lambda_min of the implicit G: a randomized lower one, a Rayleigh quotient above.

    ``fit``, when given, is a dict ``rhs``, ``precond``, ``penalty``, ``tol``,
    ``max_iter`` of the fit's system ``(G + penalty) C = rhs``, solved in the
    same block as the probes.  Returns a dict with lower, upper, vector (of
    upper), vectors, values (increasing), n_iter and fit (None or
    ``(C, n_iter, rel)`` as :func:`pcg` returns them).
    """
    psi = op.psi
    k = _PROBES if n_probes is None else int(n_probes)
    budget = resolve_budget(memory_budget)
    max_iter = int(min(_PENCIL_MAX_ITER, max(2 * _PENCIL_CHECK,
                                             _PENCIL_MEMORY_FRACTION * budget // (4 * psi))))
    record = LanczosRecord(psi, max_iter)
    m_max = precond.max_eigenvalue
    rng = np.random.default_rng(_PROBE_SEED if seed is None else seed)
    B = rng.standard_normal((psi, k))
    delta = probe_threshold(k)
    d_out = 0 if fit is None else fit["rhs"].shape[1]
    probes = np.arange(d_out, d_out + k)
    chain = dict(columns=probes, rtol=[_STAGE2_RTOL], solutions=[], iterations=[])

    def stop(n_iter):
        if chain["solutions"]:
            return False  # the record follows the first stage only
        if record.full:
            return True
        if record.k == 0 or record.k % _PENCIL_CHECK:
            return False
        return bool(record.ritz(1)[0][0] * m_max <= tol)

    def inverse(R):
        return precond.apply(R, True)

    probe_rtol = 0.25 * delta / np.sqrt(k) / np.linalg.norm(B, axis=0)
    exact = None if op.exact else op.matmat_exact
    info = {}
    started = time.perf_counter()
    if fit is None:
        x, _, rel = pcg(op.matmat, B, inverse, None, probe_rtol, max_iter, exact=exact,
                             record=record, stop=stop, chain=chain, info=info)
    else:
        block_rhs = np.hstack([fit["rhs"], B])
        precond_all = ByColumns(d_out, fit["precond"], inverse)
        penalty_all = None if fit["penalty"] is None else ByColumns(d_out, fit["penalty"], None)
        rtol = np.concatenate([np.full(d_out, fit["tol"]), probe_rtol])
        caps = np.concatenate([np.full(d_out, fit["max_iter"]), np.full(k, max_iter)])
        x, _, rel = pcg(op.matmat, block_rhs, precond_all, penalty_all, rtol, caps,
                        exact=exact, record=record, stop=stop, record_column=d_out,
                        stop_columns=probes, chain=chain, info=info)
        fit_n_iter = int(info["iterations"][:d_out].max()) if d_out else 0
        fit = (x[:, :d_out], fit_n_iter, rel[:d_out])
    block_cg = time.perf_counter() - started
    last = x[:, probes]
    if chain["solutions"]:
        last = last * chain["scales"][-1]  # pcg solved for X_1 / scale
    solutions = chain["solutions"] + [last]
    # Exact residuals of every stage, in one pass.
    G_sol = op.matmat_exact(np.hstack(solutions))
    previous = [B] + solutions[:-1]
    residuals = [previous[j] - G_sol[:, j * k:(j + 1) * k] for j in range(len(solutions))]
    lower = randomized_lower_bound(delta, solutions, residuals)
    # Each finished stage's count, then the last stage's.
    probe_iterations = [int(i) for i in chain["iterations"]] + [
        int(info["iterations"][probes].max())]

    vectors = []
    if record.k > 0:
        vectors.append(record.ritz_vectors(record.ritz(block)[1]))
    if record.null_direction is not None:
        vectors.append(record.null_direction[:, None])
    for s in solutions:
        norms = np.linalg.norm(s, axis=0)
        if np.all(norms > 0) and np.all(np.isfinite(norms)):
            vectors.append(s / norms)
    if not vectors:
        vectors.append(B)
    W = np.linalg.qr(np.hstack(vectors))[0]
    # Exact Rayleigh-Ritz of the pencil on span(W).
    GW, MW = op.matmat_exact(W), precond.multiply(W)
    _, C = scipy.linalg.eigh((W.T @ GW + GW.T @ W) / 2, (W.T @ MW + MW.T @ W) / 2)
    W, GW = W @ C, GW @ C
    rho = np.einsum("ik,ik->k", W, GW) / np.einsum("ik,ik->k", W, W)
    order = np.argsort(rho)
    best = order[0]
    diagnostics = dict(
        block_cg_seconds=block_cg,
        fit_seconds=float(info["seconds"][:d_out].max()) if d_out else 0.0,
        bounds_seconds=time.perf_counter() - started - block_cg,
        fit_iterations=fit[1] if fit is not None else 0,
        probe_iterations=probe_iterations,
        n_probes=k,
    )
    return dict(lower=float(lower), upper=max(float(rho[best]), 0.0),
                vector=W[:, best] / np.linalg.norm(W[:, best]), vectors=W[:, order],
                values=np.clip(rho[order], 0.0, None), n_iter=sum(probe_iterations), fit=fit,
                stages=len(solutions), stage_iterations=chain["iterations"],
                lower_single=randomized_lower_bound(delta, solutions[:1], residuals[:1]),
                diagnostics=diagnostics)


def implicit_extremes(op, precond, dtype, block=_LOBPCG_BLOCK, memory_budget=None, fit=None,
                      seed=None):
    """lambda_max, lambda_min (with eigenvector and error bound) of the implicit G.

    ``fit`` is as in :func:`_pencil_lanczos`; ``seed`` draws the probes.
    Returns a dict with lambda_max, lambda_min, error, vector, tol, values,
    n_iter, fit, and diagnostics (timings and iteration counts, absent when G
    is small enough to be formed); warns when the error leaves the verdict open.
    """
    psi = op.psi
    if psi < 5 * block:
        solved = None
        if fit is not None:
            solved = pcg(op.matmat, fit["rhs"], fit["precond"], fit["penalty"], fit["tol"],
                         fit["max_iter"], exact=None if op.exact else op.matmat_exact)
        # Too small for LOBPCG (scipy would form the matrix anyway).
        G = op.matmat_exact(np.eye(psi))
        w, U = scipy.linalg.eigh((G + G.T) / 2)
        w = np.clip(w, 0.0, None)
        tol = eigenvalue_tolerance(w[-1], psi, dtype)
        return dict(lambda_max=float(w[-1]), lambda_min=float(w[0]), error=0.0,
                    vector=U[:, 0], tol=tol, values=w[:block], n_iter=0, fit=solved)
    started = time.perf_counter()
    gop = LinearOperator((psi, psi), matvec=op.matmat, matmat=op.matmat, dtype=np.float64)
    rtol_max = _IMPLICIT_LMAX_RTOL if op.exact else _IMPLICIT_LMAX_RTOL_FLOAT32
    lam_max, v_max = eigsh(gop, k=1, which="LA", tol=rtol_max, v0=start_vectors(psi)[:, 0])
    lam_max = float(lam_max[0])
    if not op.exact:
        v_max = v_max[:, 0] / np.linalg.norm(v_max[:, 0])
        lam_max = float(v_max @ op.matmat_exact(v_max))
    lam_max = max(lam_max, 0.0)
    tol = eigenvalue_tolerance(lam_max, psi, dtype)
    lambda_max_seconds = time.perf_counter() - started

    pencil = _pencil_lanczos(op, precond, tol, block, memory_budget, fit=fit, seed=seed)
    diagnostics = dict(pencil["diagnostics"], lambda_max_seconds=lambda_max_seconds,
                       lobpcg_seconds=0.0, lobpcg_iterations=0)
    lower, upper = pencil["lower"], pencil["upper"]
    if lower > tol or upper <= tol:
        return dict(lambda_max=lam_max, lambda_min=upper, error=upper - max(lower, 0.0),
                    vector=pencil["vector"], tol=tol, values=pencil["values"],
                    n_iter=pencil["n_iter"], fit=pencil["fit"], diagnostics=diagnostics)
    lobpcg_started = time.perf_counter()

    mop = LinearOperator((psi, psi), matvec=lambda r: precond.apply(r, True),
                         matmat=lambda r: precond.apply(r, True), dtype=np.float64)
    V = pencil["vectors"][:, :block]
    if V.shape[1] < block:
        V = np.hstack([V, start_vectors(psi, block)[:, V.shape[1]:]])
    target = _LOBPCG_RTOL * lam_max
    steps = _LOBPCG_FIRST_ROUND
    n_iter, error = 0, np.inf
    while True:
        steps = min(steps, _LOBPCG_MAX_ITER - n_iter)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values, V = lobpcg(gop, V, M=mop, largest=False, tol=target, maxiter=steps)
        n_iter += steps
        order = np.argsort(values)
        values, V = values[order], V[:, order]
        # Exact Rayleigh-Ritz on the two smallest Ritz vectors.
        W = np.linalg.qr(V[:, :2])[0]
        GW = op.matmat_exact(W)
        theta, Yr = np.linalg.eigh((W.T @ GW + GW.T @ W) / 2)
        W, GW = W @ Yr, GW @ Yr
        resid = np.linalg.norm(GW - W * theta, axis=0)
        previous, error = error, _ritz_error(theta, resid)
        target = max(_LOBPCG_RTOL * max(theta[0], 0.0), 0.5 * tol)
        if error <= target or n_iter >= _LOBPCG_MAX_ITER:
            break
        if np.isfinite(previous):
            if not error < previous:
                break
            # Where this round's rate of decrease would take the bound by the
            # iteration cap: stop if that reaches neither the accuracy target
            # nor, while the verdict is undecided, a decided verdict.
            undecided = theta[0] - error <= tol < theta[0]
            goal = max(target, theta[0] - tol) if undecided else target
            rate = (error / previous) ** (1.0 / steps)
            if error * rate ** (_LOBPCG_MAX_ITER - n_iter) > goal:
                break
        steps = _LOBPCG_ROUND
    values = np.concatenate([theta, values[2:]])
    # Intersect the two intervals [theta - error, theta] and [lower, upper].
    vector = W[:, 0]
    lower = max(lower, float(theta[0]) - error)
    if upper < theta[0]:
        vector = pencil["vector"]
    else:
        upper = max(float(theta[0]), 0.0)
    error = upper - max(lower, 0.0)
    if lower <= tol < upper:
        warnings.warn(
            f"The certificate resolved lambda_min = {upper:.3g} of the unnormalised Gram "
            f"matrix Phi^T W Phi only to +-{error:.3g} after {pencil['n_iter']} CG steps "
            f"and {n_iter} LOBPCG iterations, which cannot tell it from the zero threshold "
            f"{tol:.3g} (same units; the certificate reports all three divided by the sum of "
            "the row weights): it says 'not identifiable' for lack of accuracy.",
            ConvergenceWarning,
        )
    diagnostics.update(lobpcg_seconds=time.perf_counter() - lobpcg_started,
                       lobpcg_iterations=n_iter)
    return dict(lambda_max=lam_max, lambda_min=upper, error=error, vector=vector, tol=tol,
                values=values, n_iter=pencil["n_iter"] + n_iter, fit=pencil["fit"],
                diagnostics=diagnostics)


def _ritz_error(theta, resid):
    """Error bound of the smallest Ritz value theta[0]: its residual, or Kato-Temple's."""
    r = float(resid[0])
    mu = float(theta[1] - resid[1])
    if mu > theta[0]:
        return min(r, r * r / (mu - float(theta[0])))
    return r


def sparse_largest_eigenvalue(A):
    """Largest eigenvalue of ``A^T A`` by Lanczos on the sparse rows."""
    if min(A.shape) == 1:
        return float(scipy.sparse.linalg.norm(A) ** 2)
    s = svds(A, k=1, which="LM", tol=1e-10, v0=start_vectors(min(A.shape))[:, 0],
             return_singular_vectors=False)
    return float(s[0]) ** 2
