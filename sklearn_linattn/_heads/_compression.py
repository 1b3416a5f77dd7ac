"""Attention heads from coefficients (SVD) and head compression (user guide: compression)."""

import itertools
import math
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from .._attention import attention_coefficients
from .._features import n_attention_features, pair_indices, unfold_coefficients
from .._memory import n_pairs, single_blas_thread
from .._units import rescale_heads, unit_scaled
from .._validation import as_real_array
from .._params import check_number, validate_random_state

__all__ = ["balance", "block_heads", "compress_heads", "heads_from_coefficients",
           "joined_heads"]


def _check_coef(coef, d):
    """Validated float64 coefficients of shape (d_out, psi) and the int d."""
    coef = as_real_array(coef, "coef", finite=True)
    d = check_number(d, "d", integer=True, low=1)
    if coef.ndim != 2 or coef.shape[0] == 0:
        raise ValueError(
            "coef must be a 2-D array of shape (d_out, psi) with d_out >= 1 and "
            f"psi = d*d*(d+1)/2 folded coefficients per output; got shape {coef.shape}."
        )
    psi = n_attention_features(d)
    if coef.shape[1] != psi:
        # Name the token dimension that would fit, when one does.
        fits = [k for k in range(1, 200) if n_attention_features(k) == coef.shape[1]]
        hint = f" (coef fits d={fits[0]})" if fits else ""
        if coef.shape[1] % psi == 0:
            # The coefficients of a model with decays: one block of psi per decay.
            hint = (f"{hint}; {coef.shape[1] // psi} blocks of psi = {psi} columns are the "
                    "coefficients of a model with that many decays: split them, "
                    f"coef[:, b * {psi}:(b + 1) * {psi}] for decay b")
        raise ValueError(
            f"coef and d do not match: d={d} needs psi = d*d*(d+1)/2 = {psi} columns, "
            f"but coef has shape {coef.shape}{hint}."
        )
    return coef, d


def _coefficient_matrix(coef, d):
    """Matrix M[(a, j), (k, l)] of the symmetrically unfolded coefficients."""
    d_out = coef.shape[0]
    return unfold_coefficients(coef, d).reshape(d_out * d, d * d)


def joined_heads(groups, decays):
    """Heads of the groups ``[(V, Q), ...]`` side by side, and each head's decay (None without)."""
    V = np.concatenate([V for V, _ in groups])
    Q = np.concatenate([Q for _, Q in groups])
    if decays is None:
        return V, Q, None
    return V, Q, np.repeat(np.asarray(decays, dtype=np.float64), [V.shape[0] for V, _ in groups])


def block_heads(folded, d, decays):
    """The SVD heads of each psi-column block of ``folded`` (one per decay), as joined_heads."""
    blocks = np.split(folded, 1 if decays is None else len(decays), axis=1)
    return joined_heads([heads_from_coefficients(f, d) for f in blocks], decays)


def heads_from_coefficients(coef, d, *, rtol=None):
    """Attention heads computing the function given by folded coefficients.

    One head per singular value of the unfolded coefficient matrix above the
    cut-off: the heads reproduce ``coef`` up to the values dropped.

    Parameters
    ----------
    coef : array-like of shape (d_out, psi)
        Folded coefficients, ``psi = d * d * (d + 1) // 2``; real and finite.
    d : int
        Token dimension.
    rtol : float or None
        Singular values below ``rtol * s_max`` are dropped; default
        ``max(d_out * d, d * d) * eps``.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
        Value matrices, one head per singular value above the cut-off.
    Q : ndarray of shape (n_heads, d, d)
        Fused key-query matrices of the same heads.

    See Also
    --------
    compress_heads : fewer heads computing the same function.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import attention_coefficients, heads_from_coefficients
    >>> rng = np.random.default_rng(0)
    >>> coef = attention_coefficients(rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3)))
    >>> V, Q = heads_from_coefficients(coef, 3)  # one head, one output: d heads back
    >>> V.shape, Q.shape
    ((3, 1, 3), (3, 3, 3))
    >>> bool(np.allclose(attention_coefficients(V, Q), coef))
    True
    """
    coef, d = _check_coef(coef, d)
    rtol = check_number(rtol, "rtol", low=0.0, allow_none=True)
    return svd_heads(coef, d, rtol=rtol)


def svd_heads(coef, d, *, rtol=None):
    """Heads of checked float64 coefficients by SVD (:func:`heads_from_coefficients`)."""
    d_out = coef.shape[0]
    M = _coefficient_matrix(coef, d)
    if rtol is None:
        rtol = max(M.shape) * np.finfo(np.float64).eps
    # Zero rows and columns of M only add zero entries to the singular
    # vectors: leave them out of the SVD (models of one-hot data, e.g.
    # learned programs, have many).
    rows = np.flatnonzero(np.any(M != 0, axis=1))
    cols = np.flatnonzero(np.any(M != 0, axis=0))
    M_nz = M[np.ix_(rows, cols)]
    try:
        U, s, Vt = scipy.linalg.svd(M_nz, full_matrices=False, lapack_driver="gesdd")
    except np.linalg.LinAlgError:
        # The divide-and-conquer driver occasionally fails to converge on
        # highly degenerate spectra (e.g. coefficients of 0/1 programs); the
        # QR-iteration driver is slower but robust there.
        U, s, Vt = scipy.linalg.svd(M_nz, full_matrices=False, lapack_driver="gesvd")
    keep = s > rtol * (s[0] if s.size else 0.0)
    r = np.sqrt(s[keep])
    V = np.zeros((r.size, M.shape[0]))
    V[:, rows] = (U[:, keep] * r).T
    Q = np.zeros((r.size, M.shape[1]))
    Q[:, cols] = Vt[keep] * r[:, None]
    return V.reshape(-1, d_out, d), Q.reshape(-1, d, d)


# --------------------------------------------------------------------------
# Head compression: variable projection on the value matrices.
#
# For fixed V the folded coefficients are linear in Q, and the l index of
# Q[h, k, l] only rides along: coef[a, (j, k), l] = B(V) @ Q[:, :, l] with one
# matrix B(V) of shape (d_out * n_pairs, n_heads * d) for every l.  So Q is
# eliminated exactly (one small least squares with d right-hand sides) and
# Levenberg-Marquardt runs on V alone, on the residual left after projecting
# the coefficients onto the range of B(V) (Golub-Pereyra variable projection,
# Kaufman's Jacobian).  The residual depends on V only through span{V_h}, so V
# is kept orthonormal.  Every start of a batch runs at once (stacked arrays).
# --------------------------------------------------------------------------

_EPS_RESIDUAL = 100 * np.finfo(np.float64).eps


def _pair_selectors(d):
    j, k = pair_indices(d)
    eye = np.eye(d)
    return j, k, eye[j], eye[k], (j != k).astype(np.float64)


def _coef_map_of_key_queries(V):
    """B(V) per start: ``coef[a, p, l] = sum_(h, c) B[(a, p), (h, c)] Q[h, c, l]``."""
    n_starts, n_heads, d_out, d = V.shape
    j, k, Ej, Ek, off = _pair_selectors(d)
    B = np.einsum("shap,pc->saphc", V[..., j], Ek)
    B += np.einsum("shap,pc->saphc", V[..., k] * off, Ej)
    return B.reshape(n_starts, d_out * j.size, n_heads * d)


def _coef_map_of_values(Q):
    """A(Q) per start: ``coef[a, p, l] = sum_(h, c) A[p, l, h, c] V[h, a, c]``."""
    j, k, Ej, Ek, off = _pair_selectors(Q.shape[2])
    A = np.einsum("shpl,pc->splhc", Q[:, :, k, :], Ej)
    A += np.einsum("shpl,pc->splhc", Q[:, :, j, :] * off[:, None], Ek)
    return A


def _orthonormal(V):
    """An orthonormal basis of span{V_h} (same shape): the residual only sees the span."""
    n_starts, n_heads = V.shape[:2]
    basis = np.linalg.qr(V.reshape(n_starts, n_heads, -1).transpose(0, 2, 1))[0]
    return basis.transpose(0, 2, 1).reshape(V.shape)


def _project(V, target):
    """Best Q for each V: the basis U of range(B(V)), Q and the residual of ``target``."""
    B = _coef_map_of_key_queries(V)
    U, s, Wt = np.linalg.svd(B, full_matrices=False)
    # B is rank deficient by construction for one output (Q_1 += v_2 t^T,
    # Q_2 -= v_1 t^T changes nothing): drop those directions.
    keep = s > 10 * max(B.shape[1:]) * np.finfo(np.float64).eps * s[:, :1]
    U = U * keep[:, None, :]
    proj = np.matmul(U.transpose(0, 2, 1), target)
    inv = np.divide(1.0, s, out=np.zeros_like(s), where=keep)
    Qm = np.matmul(Wt.transpose(0, 2, 1), proj * inv[:, :, None])
    return U, Qm, target - np.matmul(U, proj)


def _normal_equations(A, U, E, d_out):
    """Gauss-Newton matrix and right-hand side in V (Kaufman's Jacobian ``-(I - U U^T) G``)."""
    n_starts, n_pairs, d, n_heads, _ = A.shape
    n = n_heads * d_out * d
    A2 = A.reshape(n_starts, n_pairs * d, n_heads * d)
    AtA = np.matmul(A2.transpose(0, 2, 1), A2).reshape(n_starts, n_heads, d, n_heads, d)
    GtG = np.einsum("shjgi,ab->shajgbi", AtA, np.eye(d_out)).reshape(n_starts, n, n)
    # (U^T G)[r, l, (h, a, j)] = sum_p U[(a, p), r] A[p, l, h, j]
    U4 = U.reshape(n_starts, d_out, n_pairs, -1).transpose(0, 1, 3, 2)
    UG = np.matmul(U4, A.reshape(n_starts, 1, n_pairs, d * n_heads * d))
    rank = U.shape[2]
    Z = UG.reshape(n_starts, d_out, rank, d, n_heads, d).transpose(0, 2, 3, 4, 1, 5)
    Z = Z.reshape(n_starts, rank * d, n)
    JtJ = GtG - np.matmul(Z.transpose(0, 2, 1), Z)
    E3 = E.reshape(n_starts, d_out, n_pairs * d)
    rhs = np.matmul(E3, A2).reshape(n_starts, d_out, n_heads, d).transpose(0, 2, 1, 3)
    return JtJ, rhs.reshape(n_starts, n)


def _varpro(V, target, max_iter):
    """Levenberg-Marquardt from each start V[s]; returns V, Q and the squared residual."""
    n_starts, n_heads, d_out, d = V.shape
    n = n_heads * d_out * d
    norm2 = np.sum(target * target)
    V = _orthonormal(V)
    U, Qm, E = _project(V, target)
    f = np.einsum("sij,sij->s", E, E)
    mu = np.full(n_starts, 1e-3)
    active = np.ones(n_starts, dtype=bool)
    # Squared residual ten iterations ago, to stop starts that no longer move.
    lagged = np.full((10, n_starts), np.inf)
    for it in range(max_iter):
        act = np.flatnonzero(active)
        if act.size == 0:
            break
        A = _coef_map_of_values(Qm[act].reshape(-1, n_heads, d, d))
        JtJ, rhs = _normal_equations(A, U[act], E[act], d_out)
        scale = np.einsum("sii->s", JtJ) / n + np.finfo(np.float64).tiny
        damped = JtJ + (mu[act] * scale)[:, None, None] * np.eye(n)
        try:
            step = np.linalg.solve(damped, rhs[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            # Singular only in exact arithmetic accidents; a larger damping
            # makes the matrix definite at the next iteration.
            mu[act] *= 4.0
            continue
        V_new = _orthonormal(V[act] + step.reshape(-1, n_heads, d_out, d))
        U_new, Q_new, E_new = _project(V_new, target)
        f_new = np.einsum("sij,sij->s", E_new, E_new)
        better = f_new < f[act]
        take = act[better]
        V[take], U[take], Qm[take], E[take], f[take] = (
            V_new[better], U_new[better], Q_new[better], E_new[better], f_new[better]
        )
        mu[take] = np.maximum(mu[take] / 3.0, 1e-15)
        mu[act[~better]] *= 4.0
        moved = f[act] < (1.0 - 1e-6) * lagged[it % 10, act]
        lagged[it % 10, act] = f[act]
        done = (
            (f[act] <= _EPS_RESIDUAL**2 * norm2)
            | (mu[act] > 1e12)  # no descent even with tiny steps: stationary
            | ((it >= 10) & ~moved)
        )
        active[act[done]] = False
    return V, Qm.reshape(n_starts, n_heads, d, d), f


def _monomials(d, degree):
    """Exponent vectors (n, d) of the monomials of the given degree."""
    if degree == 0:
        return np.zeros((1, d), dtype=np.int64)
    combos = np.array(
        list(itertools.combinations_with_replacement(range(d), degree)), dtype=np.intp
    )
    exps = np.zeros((combos.shape[0], d), dtype=np.int64)
    for c in range(degree):
        np.add.at(exps, (np.arange(combos.shape[0]), combos[:, c]), 1)
    return exps


# Largest Macaulay matrix (columns) built for the one-output start: d = 8,
# n_heads = 4 needs 792.
_MAX_MACAULAY_COLUMNS = 1000


def _isotropic_start(coef, d, n_heads):
    """One-output start for n_heads < d: span{v_h} from a Macaulay null space (None: too large)."""
    m = d - n_heads
    degree = n_heads + 1
    if math.comb(d + degree - 1, degree) > _MAX_MACAULAY_COLUMNS:
        return None
    base = degree + 1
    powers = base ** np.arange(d, dtype=np.int64)
    exps = _monomials(d, degree)
    keys = exps @ powers
    order = np.argsort(keys)
    sorted_keys = keys[order]

    def column(k):
        return order[np.searchsorted(sorted_keys, k)]

    j, k = pair_indices(d)
    mu_keys = _monomials(d, degree - 2) @ powers
    cols = column(mu_keys[:, None] + powers[j] + powers[k])  # (n_mu, n_pairs)
    c = coef[0].reshape(j.size, d)  # c[p, l]
    macaulay = np.zeros((mu_keys.size * d, exps.shape[0]))
    rows = np.arange(mu_keys.size)[:, None, None] * d + np.arange(d)[None, :, None]
    macaulay[rows, cols[:, None, :]] = c.T[None, :, :]
    n_kernel = math.comb(m - 1 + degree, degree)
    # Only the n_kernel smallest singular vectors are needed: eigenvectors of
    # the Gram matrix, several times cheaper than a full SVD.
    gram = macaulay.T @ macaulay
    kernel = scipy.linalg.eigh(gram, subset_by_index=[0, n_kernel - 1])[1]
    # kernel[nu + e_i] = n_i * kernel[nu]: the vectors over i lie in N.
    nu_keys = _monomials(d, degree - 1) @ powers
    Z = kernel[column(nu_keys[:, None] + powers[None, :])]  # (n_nu, d, n_kernel)
    Uz = np.linalg.svd(Z.transpose(1, 0, 2).reshape(d, -1), full_matrices=False)[0]
    return Uz[:, m:].T.reshape(n_heads, 1, d)


def _check_n_init(n_init):
    if isinstance(n_init, str):
        if n_init != "auto":
            raise ValueError(f"n_init must be 'auto' or a positive integer; got {n_init!r}.")
        return n_init
    return check_number(n_init, "n_init", integer=True, low=1)


def _auto_n_init(d_out, d, n_heads, max_iter):
    """Starts for about a second of one core (10 to 500), modelled from the sizes alone."""
    n = n_heads * d_out * d
    rows = d_out * n_pairs(d)
    rank = min(rows, n_heads * d)
    seconds = 30e-6 + 8e-9 * rows * (n_heads * d) ** 2 + 5e-11 * n * n * (rank * d + n)
    return int(np.clip(1.0 / (max_iter * seconds), 10, 500))


def balance(V, Q):
    """Rescale each head so that ||V_h|| == ||Q_h|| (same function)."""
    nv = np.linalg.norm(V.reshape(len(V), -1), axis=1)
    nq = np.linalg.norm(Q.reshape(len(Q), -1), axis=1)
    ok = (nv > 0) & (nq > 0)
    s = np.ones_like(nv)
    s[ok] = np.sqrt(nq[ok] / nv[ok])
    return V * s[:, None, None], Q / s[:, None, None]


def compress_heads(
    coef,
    d,
    n_heads,
    *,
    tol=1e-10,
    max_iter=50,
    n_init="auto",
    random_state=None,
    warn=True,
):
    """Find an ``n_heads``-head MHLA whose coefficients best match ``coef``.

    Minimises ``||p(V, Q) - coef|| / ||coef||``, p being :func:`attention_coefficients`;
    zero means the same function on every input.  Non-convex: the best of several
    starts is returned (the SVD heads, completed with zero heads, when they are at
    most ``n_heads``).  See the user guide's :doc:`/compression` page.

    Parameters
    ----------
    coef : array-like of shape (d_out, psi)
        Folded coefficients to reproduce, ``psi = d * d * (d + 1) // 2``;
        real and finite.
    d : int
        Token dimension.
    n_heads : int
        Number of heads of the result, at least 1.
    tol : float, default=1e-10
        Relative residual that is good enough: the search stops at the first batch
        of starts that reaches it (for noisy coefficients, what the noise allows).
    max_iter : int, default=50
        Levenberg-Marquardt iterations per start (the best then gets as many more).
    n_init : int or "auto", default="auto"
        Largest number of starts.  ``"auto"``: about a second of work on one
        core, estimated from the sizes alone (reproducible), between 10 and 500.
    random_state : int, RandomState instance or None, default=None
        Seeds the random starts.
    warn : bool, default=True
        Whether to issue a ConvergenceWarning when the residual stays above ``tol``.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
        Value matrices.
    Q : ndarray of shape (n_heads, d, d)
        Key-query matrices; each head is balanced (``||V_h|| == ||Q_h||``).
    residual : float
        ``||attention_coefficients(V, Q) - coef|| / ||coef||`` (0 for zero coef):
        no output on any X moves more than ``residual ||coef|| ||H(X)||``.

    Raises
    ------
    ValueError
        For arguments out of range, coef not finite or complex, or not matching d.
    TypeError
        For arguments of the wrong type.

    Warns
    -----
    ConvergenceWarning
        When ``warn`` is True and the residual is above ``tol``.

    See Also
    --------
    heads_from_coefficients : as many heads as the SVD needs.
    same_function : whether two sets of heads compute the same function.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import attention_coefficients, compress_heads
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(2, 1, 4)), rng.normal(size=(2, 4, 4))
    >>> coef = attention_coefficients(V, Q)
    >>> V2, Q2, residual = compress_heads(coef, 4, 2, random_state=0)
    >>> V2.shape, Q2.shape, bool(residual < 1e-10)
    ((2, 1, 4), (2, 4, 4), True)

    One head cannot compute this two-head function (``warn=False``: no warning):

    >>> V1, Q1, residual = compress_heads(coef, 4, 1, random_state=0, warn=False)
    >>> bool(residual > 0.1)
    True
    """
    coef, d = _check_coef(coef, d)
    n_heads = check_number(n_heads, "n_heads", integer=True, low=1)
    tol = check_number(tol, "tol", low=0.0)
    max_iter = check_number(max_iter, "max_iter", integer=True, low=1)
    n_init = _check_n_init(n_init)
    if not isinstance(warn, (bool, np.bool_)):
        raise TypeError(f"warn must be True or False; got {warn!r} of type {type(warn).__name__}.")
    rng = validate_random_state(random_state)
    d_out = coef.shape[0]
    if not np.any(coef):
        return np.zeros((n_heads, d_out, d)), np.zeros((n_heads, d, d)), 0.0
    # Work at unit scale (a power of two, so exactly): the Gauss-Newton
    # matrices are quartic in the coefficients' size.
    c, shift = unit_scaled(coef)
    norm = np.linalg.norm(c)
    if n_init == "auto":
        n_init = _auto_n_init(d_out, d, n_heads, max_iter)
    with single_blas_thread():
        # Small dense problems: BLAS threads only add synchronisation (on a busy
        # machine spinning threads made the old alternating search 100x slower).
        V, Q, n_starts = _search(c, d, n_heads, tol * norm, max_iter, n_init, rng)
    V, Q = balance(V, Q)
    residual = float(np.linalg.norm(attention_coefficients(V, Q) - c) / norm)
    half = shift // 2
    V, Q = rescale_heads(V, Q, mv=-half, mq=-(shift - half))
    if warn and residual > tol:
        heads = f"{n_heads} head{'' if n_heads == 1 else 's'}"
        starts = f"{n_starts} start{'' if n_starts == 1 else 's'}"
        warnings.warn(
            f"compressing to n_heads={n_heads} left a relative coefficient residual of "
            f"{residual:.3g} (tol={tol:.3g}) after {starts}: {heads} may not be enough "
            "to compute this function. Increase n_heads, use n_heads=None, or try more "
            "starts (n_init).",
            ConvergenceWarning,
        )
    return V, Q, residual


def _search(c, d, n_heads, abs_tol, max_iter, n_init, rng):
    """Best heads over the starts; returns V, Q and the number of starts run."""
    d_out = c.shape[0]
    V_svd, Q_svd = heads_from_coefficients(c, d)
    if V_svd.shape[0] <= n_heads:
        # Exact with the SVD heads; zero heads fill up the count.
        pad = n_heads - V_svd.shape[0]
        return (
            np.concatenate([V_svd, np.zeros((pad, d_out, d))]),
            np.concatenate([Q_svd, np.zeros((pad, d, d))]),
            1,
        )
    target = c.reshape(d_out * n_pairs(d), d)
    # Deterministic starts, each computed only if the previous ones fell short.
    batches = [lambda: V_svd[None, :n_heads]]
    if d_out == 1:
        batches.append(lambda: _isotropic_start(c, d, n_heads))
    # Work arrays of one batch (the Gauss-Newton matrices dominate) stay
    # within about 2**24 float64 values (128 MiB) however large n_init is.
    n = n_heads * d_out * d
    rank = min(target.shape[0], n_heads * d)
    per_start = 4 * n * n + 2 * rank * d * n + 2 * target.size * (n_heads * d + 2)
    largest = max(1, 2**24 // per_start)
    best_V = best_Q = None
    best_f = np.inf
    n_done = 0
    size = 4
    while n_done < n_init:
        if batches:
            starts = batches.pop(0)()
            if starts is None:
                continue
            starts = starts.reshape(-1, n_heads, d_out, d)
        else:
            count = min(size, largest, n_init - n_done)
            starts = rng.standard_normal((count, n_heads, d_out, d))
            size *= 2
        V, Q, f = _varpro(starts, target, max_iter)
        n_done += starts.shape[0]
        i = int(np.argmin(f))
        if f[i] < best_f:
            best_V, best_Q, best_f = V[i], Q[i], f[i]
        if np.sqrt(best_f) <= abs_tol:
            break
    if best_f > _EPS_RESIDUAL**2 * np.sum(target * target):
        # Starts stop at max_iter, which matters most for residuals far from
        # zero (slow, linear convergence): continue the best one alone.
        V, Q, f = _varpro(best_V[None], target, max_iter)
        if f[0] < best_f:
            best_V, best_Q = V[0], Q[0]
    return best_V, best_Q, n_done
