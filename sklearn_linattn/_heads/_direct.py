"""A few heads fitted directly to the data, below psi rows: alternating least squares, then LM."""


import contextlib
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from .._memory import single_blas_thread
from .._params import check_number, validate_random_state
from .._source import standardizer_of
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
    """One Levenberg-Marquardt step (one SVD): ``(V, Q, f, mu, moved)``."""
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
    """The result of :func:`fit_heads`; the parameters are kept as attributes of the same names.

    Parameters
    ----------
    V : ndarray of shape (n_heads, d_out, d)
        Value matrices, in the data's units.
    Q : ndarray of shape (n_heads, d, d)
        Fused key-query matrices, in the data's units.
    residual : float
        Relative training residual ``sqrt(sum w (y - f(X))**2 / sum w y**2)``
        over the real targets (the absolute one when every target is zero).
    n_iter : int
        Iterations of the best start (ALS sweeps plus Levenberg-Marquardt steps).
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
    ``n_heads`` heads, the best of up to ``n_init`` starts.  Non-convex: only
    ``residual`` says how well the heads fit, and ``certificate`` (locally)
    whether the data pin them down.  See the user guide's :doc:`/few_heads` page.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; trailing all-NaN tokens are padding.
    y : array-like
        Targets as for :class:`~sklearn_linattn.LinearAttentionRegressor`: (n_samples[,
        d_out]) for ``readout="last"``, (n_samples, n_tokens[, d_out]) for ``"all"``.
    n_heads : int
        Number of heads k, at least 1.
    readout : {"last", "all"}, default="last"
        Targets at the last token, or at every position (causal).
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence (of each of its positions for ``"all"``).
    n_init : int, default=30
        Largest number of starts; the search stops at the first that reaches ``tol``.
    max_iter : int, default=300
        Iterations per start (ALS sweeps plus Levenberg-Marquardt steps).
    tol : float, default=1e-12
        Relative training residual at which a start stops and the search ends;
        with noisy targets each start stops where its residual stops decreasing.
    certify : bool, default=True
        Compute the :class:`LocalCertificate` at the result.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the random starts.

    Returns
    -------
    result : HeadsFit
        The heads in the data's units, their residual and certificate.

    Raises
    ------
    ValueError
        For invalid arguments, and before allocating Jacobians beyond the memory budget.
    TypeError
        For parameters of the wrong type.

    Warns
    -----
    ConvergenceWarning
        When the best start stopped at ``max_iter`` with its residual still falling.

    See Also
    --------
    certify_heads_locally : the local certificate of any heads.
    compress_heads : fewer heads from coefficients (identified from psi rows).

    Examples
    --------
    A one-head generator at d = 4 (20 parameters, psi = 40) from 30 sequences:

    >>> import numpy as np
    >>> from sklearn_linattn import fit_heads, mhla_forward
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 4, 4))
    >>> X = rng.normal(size=(30, 10, 4))
    >>> fit = fit_heads(X, mhla_forward(X, V, Q), 1, random_state=0)
    >>> bool(fit.residual < 1e-10), bool(fit.certificate)
    (True, True)
    >>> X_test = 2 * rng.normal(size=(50, 30, 4))  # longer and larger
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
    X = X.astype(np.float64, copy=False)
    rows = BilinearData(X, lengths, Y, readout, w, standardizer_of(X, lengths, Y, w))
    _check_jacobian_memory("fit_heads", rows, n_heads)
    with _threads(rows, n_heads):
        V, Q, n_iter, n_starts = _search(rows, n_heads, n_init, max_iter, tol, rng)
        V_out, Q_out = rows.from_standard(V, Q)
        # Judged like certify_heads_locally(X, V_out, Q_out): in the package's
        # standardized (whitened) coordinates, not these.
        certificate = (_local_certificate(X, lengths, readout, w, V_out, Q_out)
                       if certify else None)
    # The residual in the data's units (each output's in its own).
    num = np.sum(rows.outputs_to_user(rows.weighted_residual(V, Q)) ** 2)
    den = np.sum(rows.outputs_to_user(rows.Y * rows.sqrt_w[:, None]) ** 2)
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
    """k heads fitted to a fit's standardized rows: V, Q and their local certificate."""
    rng = validate_random_state(random_state)
    std_rows = BilinearData.standardized(rows, pair_weights)
    with _threads(std_rows, n_heads):
        V, Q, _, _ = _search(std_rows, n_heads, 30, 300, 1e-12, rng)
        eps_in = max(_EPS, float(np.finfo(dtype).eps)) if np.dtype(dtype).kind == "f" else _EPS
        return V, Q, _certificate(std_rows, V, Q, eps_in=eps_in)
