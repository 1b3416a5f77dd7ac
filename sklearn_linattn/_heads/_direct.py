"""A few heads fitted directly to the data.

The least-squares fit over any number of heads needs at least
``psi = d**2 (d + 1) / 2`` feature rows to be identified.  A model with k
heads has only ``k (d_out d + d**2)`` parameters, so far fewer rows can pin
it down, but the minimum-norm solution of an under-determined least squares
is not the generator and compressing it cannot recover one.  This module fits
the k heads to the data themselves.

The output ``y_r = sum_h V_h S_r Q_h x_r`` (one row r per sequence for the
readout ``"last"``, one per real position for ``"all"``, with S_r the moment
of the tokens up to it) is bilinear: linear in every V_h given the Q_h, with
design rows ``(S_r Q_h x_r)_h``, and linear in every Q_h given the V_h, with
design rows ``((V_h S_r)[a, k] x_r[l])_(h, k, l)``.  :func:`fit_heads` runs
alternating least squares (each half-step one exact least squares over all
heads at once) and, where that slows down, Levenberg-Marquardt on all the
parameters, whose Jacobian is the two designs side by side.
"""


import contextlib
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from .._memory import single_blas_thread
from .._params import check_number, validate_random_state
from ._bilinear import _EPS, BilinearData, _check_jacobian_memory, _validated
from ._compression import balance, heads_from_coefficients
from ._local import _certificate, _local_certificate

__all__ = ["HeadsFit", "fit_heads", "fit_standardized_heads"]

# ALS hands over to Levenberg-Marquardt when a sweep removes less than this
# fraction of the squared residual (ALS converges linearly, LM quadratically).
_ALS_STALL = 0.5
# A start stops when an accepted step removes less than this fraction of the
# squared residual (a stationary point), or when no damping gives descent.
_STATIONARY = 1e-10
_MAX_DAMPING = 1e16
# Jacobians up to this many entries are factored on one BLAS thread (several
# times faster for small matrices than threads that contend).
_SINGLE_THREAD_ENTRIES = 2**21


def _unflatten(theta, n_heads, d_out, d):
    nV = n_heads * d_out * d
    return theta[:nV].reshape(n_heads, d_out, d), theta[nV:].reshape(n_heads, d, d)


def _value_step(rows, Q):
    W = scipy.linalg.lstsq(rows.output_map_of_values(Q), rows.Y * rows.sqrt_w[:, None],
                           lapack_driver="gelsd")[0]
    return W.reshape(Q.shape[0], rows.d, rows.d_out).transpose(0, 2, 1)


def _key_query_step(rows, V):
    target = (rows.Y * rows.sqrt_w[:, None]).ravel()
    q = scipy.linalg.lstsq(rows.output_map_of_key_queries(V), target, lapack_driver="gelsd")[0]
    return q.reshape(V.shape[0], rows.d, rows.d)


def _lm_step(rows, V, Q, f, mu):
    """One Levenberg-Marquardt step from (V, Q): one SVD, as many dampings as needed.

    Returns the new heads, squared residual, damping, and whether a step was taken.
    """
    J = rows.jacobian(V, Q)
    e = rows.weighted_residual(V, Q).ravel()
    U, s, Wt = scipy.linalg.svd(J, full_matrices=False, lapack_driver="gesdd")
    g = U.T @ e
    theta = np.concatenate([V.ravel(), Q.ravel()])
    scale = s[0] ** 2 if s.size and s[0] > 0 else 1.0
    while mu <= _MAX_DAMPING:
        step = Wt.T @ (g * s / (s**2 + mu * scale))
        V_new, Q_new = _unflatten(theta + step, *V.shape)
        r = rows.weighted_residual(V_new, Q_new)
        f_new = float(np.sum(r * r))
        if f_new < f:
            return V_new, Q_new, f_new, max(mu / 10.0, 1e-15), True
        mu *= 10.0
    return V, Q, f, mu, False


def _fit_from(rows, V, Q, max_iter, tol, norm2):
    """ALS from (V, Q), then Levenberg-Marquardt once ALS slows down."""
    V = _value_step(rows, Q)
    r = rows.weighted_residual(V, Q)
    f = float(np.sum(r * r))
    target = (tol**2) * norm2
    mode, mu, n_iter = "als", 1e-3, 0
    stationary = False
    while n_iter < max_iter and f > target:
        n_iter += 1
        if mode == "als":
            Q_new = _key_query_step(rows, V)
            V_new = _value_step(rows, Q_new)
            V_new, Q_new = balance(V_new, Q_new)
            r = rows.weighted_residual(V_new, Q_new)
            f_new = float(np.sum(r * r))
            if f_new <= f:
                V, Q = V_new, Q_new
            if not f_new <= (1.0 - _ALS_STALL) * f:
                mode = "lm"
            f = min(f, f_new)
            continue
        V, Q, f_new, mu, moved = _lm_step(rows, V, Q, f, mu)
        V, Q = balance(V, Q)
        stationary = not moved or f - f_new <= _STATIONARY * f
        f = f_new
        if stationary:
            break
    # Stopped by the iteration cap, neither at the target nor at a stationary point.
    capped = n_iter >= max_iter and f > target and not stationary
    return V, Q, f, n_iter, capped


def _starts(rows, n_heads, n_init, rng):
    """Key-query starts: the truncated SVD of the minimum-norm solution, then random."""
    d = rows.d
    H = rows.features()
    if H is not None and n_init > 0:
        coef = scipy.linalg.lstsq(H, rows.Y * rows.sqrt_w[:, None],
                                  lapack_driver="gelsd")[0].T
        if np.any(coef != 0):
            Q = heads_from_coefficients(coef, d)[1][:n_heads]
            if Q.shape[0] < n_heads:
                extra = rng.standard_normal((n_heads - Q.shape[0], d, d)) / d
                Q = np.concatenate([Q, extra])
            yield Q
            n_init -= 1
    for _ in range(n_init):
        yield rng.standard_normal((n_heads, d, d)) / d


class HeadsFit:
    """The result of :func:`fit_heads`.

    The parameters are kept as attributes of the same names.

    Parameters
    ----------
    V : ndarray of shape (n_heads, d_out, d)
        Value matrices, in the data's units.
    Q : ndarray of shape (n_heads, d, d)
        Fused key-query matrices, in the data's units.
    residual : float
        Relative training residual ``sqrt(sum w (y - f(X))**2 / sum w y**2)``
        over the real targets (the absolute root sum of squares when every
        target is zero).
    n_iter : int
        Iterations of the best start (ALS sweeps plus Levenberg-Marquardt
        steps).
    n_starts : int
        Starts run (the search stops at the first that reaches ``tol``).
    certificate : LocalCertificate or None
        The local certificate at the fitted heads; None with ``certify=False``.

    See Also
    --------
    fit_heads : returns it.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import fit_heads, mhla_forward
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3))
    >>> X = rng.normal(size=(20, 5, 3))
    >>> fit = fit_heads(X, mhla_forward(X, V, Q), 1, random_state=0)
    >>> fit.V.shape, fit.Q.shape, bool(fit.residual < 1e-10)
    ((1, 1, 3), (1, 3, 3), True)
    """

    def __init__(self, V, Q, residual, n_iter, n_starts, certificate):
        self.V, self.Q = V, Q
        self.residual = float(residual)
        self.n_iter, self.n_starts = int(n_iter), int(n_starts)
        self.certificate = certificate

    def __repr__(self):
        return (f"HeadsFit(n_heads={self.V.shape[0]}, residual={self.residual:.3g}, "
                f"n_iter={self.n_iter}, n_starts={self.n_starts}, "
                f"certificate={self.certificate!r})")


def fit_heads(X, y, n_heads, *, readout="last", sample_weight=None, n_init=30, max_iter=300,
              tol=1e-12, certify=True, random_state=None):
    """Fit a k-head linear attention directly to data, with fewer rows than psi.

    Minimises the (weighted) squared error of ``y = sum_h V_h S Q_h x`` over
    ``n_heads`` heads.  Each start runs alternating least squares, each
    half-step one exact least squares over all heads (the values given the
    key-queries, then the key-queries given the values), and switches to
    Levenberg-Marquardt on all the parameters when a sweep removes less than
    10% of the squared residual.  The first start is the truncated SVD of the
    minimum-norm least-squares coefficients (when their feature matrix has at
    most 2**24 entries), the others are random; the search stops at the
    first start whose relative residual reaches ``tol`` and returns the best.
    The fit runs in standardized coordinates (tokens per coordinate and
    targets per output divided by the powers of two nearest their root mean
    square) and maps the heads back exactly, so the scale of the data does
    not matter.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; trailing all-NaN tokens are padding.
    y : array-like
        Targets, as for :class:`~sklearn_linattn.LinearAttentionRegressor`:
        (n_samples,) or (n_samples, d_out) for ``readout="last"``;
        (n_samples, n_tokens[, d_out]) with NaN at padded positions for
        ``"all"``.
    n_heads : int
        Number of heads k, at least 1.
    readout : {"last", "all"}, default="last"
        Targets at the last token, or at every position (causal).
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence (of each of its positions for
        ``"all"``).
    n_init : int, default=30
        Largest number of starts, the minimum-norm start included.  Local
        minima are common with several heads near the smallest sample sizes
        (a random start reached the global one 10% to 65% of the time for
        two heads at d = 4 to 6), so many starts are allowed; the search
        stops at the first that fits.
    max_iter : int, default=300
        Iterations per start (ALS sweeps plus Levenberg-Marquardt steps).
    tol : float, default=1e-12
        Relative training residual at which a start stops and the search
        ends.  With noisy targets no start reaches it; each then stops where
        its residual stops decreasing, and the best is returned.
    certify : bool, default=True
        Compute the :class:`LocalCertificate` at the result.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the random starts.

    Returns
    -------
    result : HeadsFit
        ``V``, ``Q`` (data units), ``residual``, ``n_iter``, ``n_starts`` and
        ``certificate``.

    Raises
    ------
    ValueError
        For invalid X, y, sample_weight, readout or numbers out of range, and
        before allocating Jacobians larger than the memory budget (half the
        physical memory).
    TypeError
        For parameters of the wrong type.

    Warns
    -----
    ConvergenceWarning
        When the best start stopped at ``max_iter`` while its residual was
        still falling (neither at ``tol`` nor at a stationary point).

    See Also
    --------
    certify_heads_locally : the local certificate of any heads.
    compress_heads : fewer heads from coefficients (needs psi rows to have
        the generator's coefficients).

    Notes
    -----
    The fit is non-convex; it can end in a local minimum, which is why there
    are restarts.  Only ``residual`` says how well it fits, and only
    ``certificate`` (locally) whether the data pin the fitted function down.
    The designs hold ``R * d_out * k * d**2`` numbers (R rows: sequences for
    ``"last"``, real positions for ``"all"``), all in memory.

    Examples
    --------
    A one-head generator at d = 4 (20 parameters against psi = 40) from 30
    sequences, checked on sequences three times longer and twice larger:

    >>> import numpy as np
    >>> from sklearn_linattn import fit_heads, mhla_forward
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 4, 4))
    >>> X = rng.normal(size=(30, 10, 4))
    >>> fit = fit_heads(X, mhla_forward(X, V, Q), 1, random_state=0)
    >>> bool(fit.residual < 1e-10), bool(fit.certificate)
    (True, True)
    >>> X_test = 2 * rng.normal(size=(50, 30, 4))
    >>> y_test = mhla_forward(X_test, V, Q)
    >>> error = np.linalg.norm(mhla_forward(X_test, fit.V, fit.Q) - y_test)
    >>> bool(error < 1e-8 * np.linalg.norm(y_test))
    True
    """
    n_heads = check_number(n_heads, "n_heads", integer=True, low=1)
    n_init = check_number(n_init, "n_init", integer=True, low=1)
    max_iter = check_number(max_iter, "max_iter", integer=True, low=1)
    tol = check_number(tol, "tol", low=0.0)
    if not isinstance(certify, (bool, np.bool_)):
        raise TypeError(f"certify must be True or False; got {certify!r}.")
    rng = validate_random_state(random_state)
    X, lengths, Y, w = _validated(X, y, readout, sample_weight)
    rows = BilinearData(X.astype(np.float64, copy=False), lengths, Y, readout, w)
    _check_jacobian_memory("fit_heads", rows, n_heads)
    with _threads(rows, n_heads):
        V, Q, n_iter, n_starts = _search(rows, n_heads, n_init, max_iter, tol, rng)
        V_out, Q_out = rows.from_standard(V, Q)
        # Judged like certify_heads_locally(X, V_out, Q_out): in the package's
        # standardized (whitened) coordinates, not these.
        certificate = (_local_certificate(X, lengths, readout, w, V_out, Q_out)
                       if certify else None)
    # The residual in the data's units: each output's is scaled by 2**target_exp.
    r = rows.weighted_residual(V, Q)
    num = np.sum(np.ldexp(r, rows.target_exp[None, :]) ** 2)
    den = np.sum(np.ldexp(rows.Y * rows.sqrt_w[:, None], rows.target_exp[None, :]) ** 2)
    residual = np.sqrt(num / den) if den > 0 else np.sqrt(num)
    return HeadsFit(V_out, Q_out, residual, n_iter, n_starts, certificate)


def _threads(rows, n_heads):
    """One BLAS thread for small Jacobians (threads only contend there)."""
    n_params = n_heads * (rows.d_out * rows.d + rows.d**2)
    small = rows.n_rows * rows.d_out * n_params <= _SINGLE_THREAD_ENTRIES
    return single_blas_thread() if small else contextlib.nullcontext()


def _search(rows, n_heads, n_init, max_iter, tol, rng, name="fit_heads"):
    """The best of up to n_init starts on the rows: ``(V, Q, n_iter, n_starts)``, balanced."""
    norm2 = float(np.sum((rows.Y * rows.sqrt_w[:, None]) ** 2))
    best = None
    n_starts = 0
    for Q0 in _starts(rows, n_heads, n_init, rng):
        n_starts += 1
        V, Q, f, n_iter, capped = _fit_from(rows, None, Q0, max_iter, tol, norm2)
        if best is None or f < best[2]:
            best = (V, Q, f, n_iter, capped)
        if best[2] <= tol**2 * norm2:
            break
    V, Q, f, n_iter, capped = best
    if capped:
        warnings.warn(
            f"{name}: the best of {n_starts} starts stopped at max_iter={max_iter} "
            "iterations while its residual was still falling; the heads may fit the data "
            "worse than they can. Increase max_iter.",
            ConvergenceWarning,
        )
    V, Q = balance(V, Q)
    return V, Q, n_iter, n_starts


def fit_standardized_heads(rows, n_heads, pair_weights, *, random_state=None, dtype=np.float64):
    """k heads fitted directly to rows in the package's standardized coordinates.

    What ``LinearAttentionRegressor.fit`` runs on its own standardized rows
    (:class:`~._moments.Rows`, real outputs only) when compressing an
    unidentified fit to ``n_heads`` is material: no second standardization.

    Returns
    -------
    V, Q : ndarray
        The heads in those coordinates.
    certificate : LocalCertificate
        Judged in the same coordinates.
    """
    rng = validate_random_state(random_state)
    std_rows = BilinearData.standardized(rows, pair_weights)
    with _threads(std_rows, n_heads):
        V, Q, _, _ = _search(std_rows, n_heads, 30, 300, 1e-12, rng)
        eps_in = max(_EPS, float(np.finfo(dtype).eps)) if np.dtype(dtype).kind == "f" else _EPS
        return V, Q, _certificate(std_rows, V, Q, eps_in=eps_in)
