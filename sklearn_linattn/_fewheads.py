"""A few heads fitted directly to the data, and their local certificate.

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
import functools
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from ._features import pair_indices
from ._heads import _key_query_design, _value_design, heads_from_coefficients
from ._memory import real_tokens, resolve_budget, single_blas_thread
from ._standardize import _exponent, max_exponent, standardizer_for
from ._validation import (
    check_heads,
    check_number,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_targets,
    validate_random_state,
)

__all__ = ["HeadsFit", "LocalCertificate", "certify_heads_locally", "fit_heads",
           "fit_heads_memory", "fit_heads_work"]

_EPS = np.finfo(np.float64).eps
# Largest feature matrix (entries) built for the minimum-norm start.
_MAX_START_ENTRIES = 2**24
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


class _Rows:
    """Standardized training rows: moments S (R, d, d), queries x (R, d), targets, weights.

    Tokens are scaled per coordinate, targets per output, by the powers of two
    nearest their root mean square (``token_exp``, ``target_exp``): exact, so
    heads map back to the data's units without rounding.
    """

    def __init__(self, X, lengths, Y, readout, weight):
        n_samples, n_tokens, d = X.shape
        real = real_tokens(lengths, n_tokens)
        w_tok = np.broadcast_to(weight[:, None], real.shape)[real]
        tokens = X[real]
        if w_tok.sum() > 0:
            rms = np.sqrt(np.average(tokens**2, axis=0, weights=w_tok))
        else:
            rms = np.sqrt(np.mean(tokens**2, axis=0))
        self.token_exp = _exponent(rms)
        Xs = np.ldexp(X, -self.token_exp)
        if readout == "last":
            self.S = np.matmul(Xs.transpose(0, 2, 1), Xs)
            self.x = Xs[np.arange(n_samples), lengths - 1]
            Yr, w = Y, weight
        else:
            S = np.cumsum(Xs[:, :, :, None] * Xs[:, :, None, :], axis=1)
            self.S, self.x = S[real], Xs[real]
            Yr, w = Y[real], np.broadcast_to(weight[:, None], real.shape)[real]
        keep = w > 0
        self.S, self.x, Yr, w = self.S[keep], self.x[keep], Yr[keep], w[keep]
        rms_y = np.sqrt(np.average(Yr**2, axis=0, weights=w)) if w.size else np.zeros(
            Yr.shape[1])
        self.target_exp = _exponent(rms_y)
        self.Y = np.ldexp(Yr, -self.target_exp)
        self.sqrt_w = np.sqrt(w)
        self.n_rows, self.d_out, self.d = Yr.shape[0], Yr.shape[1], d

    # -- heads between the data's units and these coordinates (exact) --------
    def to_standard(self, V, Q):
        e, f = self.token_exp, self.target_exp
        return (np.ldexp(V, e[None, None, :] - f[None, :, None]),
                np.ldexp(Q, e[None, :, None] + e[None, None, :]))

    def from_standard(self, V, Q):
        e, f = self.token_exp, self.target_exp
        V = np.ldexp(V, f[None, :, None] - e[None, None, :])
        Q = np.ldexp(Q, -e[None, :, None] - e[None, None, :])
        return _balance_pow2(V, Q)

    # -- the model on these rows ---------------------------------------------
    def contexts(self, Q):
        """u[r, h] = S_r Q_h x_r, shape (R, n_heads, d)."""
        q = np.einsum("hkl,rl->rhk", Q, self.x)
        return np.matmul(q, self.S)  # S_r symmetric

    def predict(self, V, Q):
        return np.einsum("haj,rhj->ra", V, self.contexts(Q))

    def weighted_residual(self, V, Q):
        return (self.Y - self.predict(V, Q)) * self.sqrt_w[:, None]

    def value_design(self, Q):
        """Weighted design of the value step: (R, n_heads * d), columns (h, j)."""
        u = self.contexts(Q)
        return u.reshape(self.n_rows, -1) * self.sqrt_w[:, None]

    def key_query_design(self, V):
        """Weighted design of the key-query step: rows (r, a), columns (h, k, l)."""
        VS = np.einsum("haj,rjk->rahk", V, self.S)
        B = VS[..., None] * self.x[:, None, None, None, :]
        B *= self.sqrt_w[:, None, None, None, None]
        return B.reshape(self.n_rows * self.d_out, -1)

    def jacobian(self, V, Q):
        """Jacobian of the weighted outputs in (V, Q), rows (r, a), V then Q flattened."""
        u = self.contexts(Q) * self.sqrt_w[:, None, None]
        JV = np.einsum("rhj,ab->rahbj", u, np.eye(self.d_out))
        JV = JV.reshape(self.n_rows * self.d_out, -1)
        return np.hstack([JV, self.key_query_design(V)])

    def features(self):
        """Weighted standardized feature rows (R, psi), or None when too large."""
        j, k = np.triu_indices(self.d)
        if self.n_rows * j.size * self.d > _MAX_START_ENTRIES:
            return None
        H = self.S[:, j, k][:, :, None] * self.x[:, None, :]
        return H.reshape(self.n_rows, -1) * self.sqrt_w[:, None]


def _balance_pow2(V, Q):
    """Each head rescaled by a power of two so that its V and Q have similar size."""
    n_heads = V.shape[0]
    eV = max_exponent(V.reshape(n_heads, -1), axis=1)
    eQ = max_exponent(Q.reshape(n_heads, -1), axis=1)
    m = (eV - eQ) // 2
    return np.ldexp(V, -m[:, None, None]), np.ldexp(Q, m[:, None, None])


def _balance(V, Q):
    """Each head rescaled so that ||V_h|| = ||Q_h|| (the same function)."""
    nv = np.linalg.norm(V.reshape(V.shape[0], -1), axis=1)
    nq = np.linalg.norm(Q.reshape(Q.shape[0], -1), axis=1)
    c = np.where((nv > 0) & (nq > 0), np.sqrt(nq / np.where(nv > 0, nv, 1.0)), 1.0)
    return V * c[:, None, None], Q / c[:, None, None]


def _unflatten(theta, n_heads, d_out, d):
    nV = n_heads * d_out * d
    return theta[:nV].reshape(n_heads, d_out, d), theta[nV:].reshape(n_heads, d, d)


def _value_step(rows, Q):
    W = scipy.linalg.lstsq(rows.value_design(Q), rows.Y * rows.sqrt_w[:, None],
                           lapack_driver="gelsd")[0]
    return W.reshape(Q.shape[0], rows.d, rows.d_out).transpose(0, 2, 1)


def _key_query_step(rows, V):
    target = (rows.Y * rows.sqrt_w[:, None]).ravel()
    q = scipy.linalg.lstsq(rows.key_query_design(V), target, lapack_driver="gelsd")[0]
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
            V_new, Q_new = _balance(V_new, Q_new)
            r = rows.weighted_residual(V_new, Q_new)
            f_new = float(np.sum(r * r))
            if f_new <= f:
                V, Q = V_new, Q_new
            if not f_new <= (1.0 - _ALS_STALL) * f:
                mode = "lm"
            f = min(f, f_new)
            continue
        V, Q, f_new, mu, moved = _lm_step(rows, V, Q, f, mu)
        V, Q = _balance(V, Q)
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


class LocalCertificate:
    """Whether the data identify a k-head function near the given heads, and only near.

    At heads theta, the functions of k heads form (locally) a manifold whose
    tangent space is the image of the Jacobian ``J_p = dp/dtheta`` of the
    coefficient map p (:func:`~sklearn_linattn.attention_coefficients`).  Its
    dimension, ``tangent_rank``, is the number of parameters minus those of
    the directions that change nothing (each head's ``V_h c, Q_h / c``; with
    several heads their mixings, and with one output more): it is computed,
    not assumed.  The data identify the function locally iff their feature
    rows restricted to that tangent space have full rank,
    ``rank(Phi U) == rank(J_p)`` with U an orthonormal basis of the image of
    ``J_p``; equivalently the Jacobian of the training outputs in theta has
    the rank of ``J_p``.

    That first-order argument needs the heads to be a regular point of the
    parametrization, so the certificate also requires that (i) no head is
    degenerate (zero, or contributing less to the coefficients than their
    rounding) and (ii) ``tangent_rank`` equals ``generic_rank``, the rank of
    ``J_p`` at random heads of the same shape (the largest it can be).  At a
    point of lower rank (a zero head, two heads that share a value or
    key-query factor, ...) k-head functions arbitrarily near leave the
    tangent space at second order, and the rank test proves nothing.
    ``reason`` says which condition failed.  Degenerate heads enter the ranks
    as zero heads (both factors).

    The certificate is **local**.  It rules out other k-head functions that
    fit the data equally well *near* the fitted one (a neighbourhood of
    theta), not far ones: two rank-one heads whose outputs agree on every
    training row but whose coefficients differ by much lie outside every
    neighbourhood the Jacobian sees, and with fewer than psi rows such pairs
    exist for some data sets (the global certificate,
    :func:`~sklearn_linattn.certify_identifiability`, needs psi rows and
    then holds for any number of heads).  It also says nothing about whether
    the fit is the best k-head fit.

    **Coordinates.**  Everything is computed in balanced, standardized
    coordinates: the tokens standardized as the package does (an exact power
    of two per coordinate, then whitening, as ``LinearAttentionRegressor``'s
    ``standardization_``), the heads mapped into them, scaled together by
    one power of two and each balanced to ``||V_h||_F = ||Q_h||_F``, and the
    coefficients in the symmetric embedding (the pairs j < k weighted by
    sqrt(2), so that an orthogonal map of the tokens is an orthogonal map of
    ``J_p`` and of the feature rows).  The verdict therefore does not depend
    on the heads' balance (``V_h c, Q_h / c``), on the overall scale of the
    heads or of the tokens, or on an invertible linear map of the tokens
    applied to the data and the heads together (``X A`` with
    ``V_h A^-T`` and ``A^-1 Q_h A^-T``).

    **Tolerances** (eps the float64 machine epsilon; each relative to the
    quantities it judges, so that no scale moves a verdict):

    - a head is degenerate when ``||V_h||_F ||Q_h||_F <= k eps sum_g
      ||V_g||_F ||Q_g||_F``: its share of the coefficients is below their
      rounding (zero heads included);
    - a singular value of ``J_p`` (m x n) counts when it exceeds ``tau_p =
      max(m, n) eps s_max``: the SVD's backward error and the rounding of the
      standardized heads (a few eps per entry) perturb ``J_p`` by less;
    - a singular value of ``G = Phi U`` (``m_G`` equations x r) counts when
      it exceeds ``max(m_G, r) eps_X s_max(G) + ||Phi||_F tau_p / s_r(J_p)``,
      with ``eps_X`` the machine epsilon of X's dtype (at least eps): the
      first term is the SVD's and the rows' rounding, the second the error
      of the tangent basis U, known to within an angle ``tau_p / s_r(J_p)``
      (Wedin's bound), which moves G by up to ``||Phi||`` times it.

    Parameters
    ----------
    tangent_rank : int
        Rank of ``J_p``: the dimension of the k-head functions near theta.
    data_rank : int
        Rank of the feature rows restricted to the tangent space.
    n_parameters : int
        ``k * (d_out * d + d * d)``.
    n_equations : int
        Training rows times outputs (rows of positive weight).
    relative_sigma_min : float
        Smallest singular value of ``Phi U`` over its largest (0 when it has
        fewer rows than columns): how close the data are to missing a
        direction.
    generic_rank : int or None, default=None
        Rank of ``J_p`` at generic heads of the same shape; None takes
        ``tangent_rank``.
    degenerate_heads : sequence of int, default=()
        Indices of the degenerate heads.

    Attributes
    ----------
    holds : bool
        No degenerate head, ``tangent_rank == generic_rank`` and
        ``data_rank == tangent_rank``; also the truth value of the object.
    n_symmetries : int
        ``n_parameters - tangent_rank``: the directions that change nothing.
    reason : str or None
        Why the certificate does not hold; None when it holds.

    The parameters are kept as attributes of the same names
    (``degenerate_heads`` as a tuple).

    See Also
    --------
    certify_heads_locally : the certificate of given heads on given data.
    fit_heads : fits k heads and certifies them.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import certify_heads_locally
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3))
    >>> cert = certify_heads_locally(rng.normal(size=(20, 5, 3)), V, Q)
    >>> bool(cert), cert.n_parameters, cert.n_symmetries, cert.reason
    (True, 12, 1, None)
    >>> zero = certify_heads_locally(rng.normal(size=(20, 5, 3)), 0 * V, Q)
    >>> bool(zero), zero.degenerate_heads, zero.reason[:22]
    (False, (0,), 'head 0 is degenerate (')
    """

    def __init__(self, *, tangent_rank, data_rank, n_parameters, n_equations,
                 relative_sigma_min, generic_rank=None, degenerate_heads=()):
        self.tangent_rank = int(tangent_rank)
        self.data_rank = int(data_rank)
        self.n_parameters = int(n_parameters)
        self.n_symmetries = self.n_parameters - self.tangent_rank
        self.n_equations = int(n_equations)
        self.relative_sigma_min = float(relative_sigma_min)
        self.generic_rank = self.tangent_rank if generic_rank is None else int(generic_rank)
        self.degenerate_heads = tuple(int(h) for h in degenerate_heads)
        self.reason = self._reason()
        self.holds = self.reason is None

    def _reason(self):
        if self.degenerate_heads:
            heads = self.degenerate_heads
            which = (f"head {heads[0]} is" if len(heads) == 1
                     else f"heads {', '.join(map(str, heads))} are")
            return (f"{which} degenerate (zero, or a share of the coefficients below their "
                    "rounding): a first-order certificate says nothing at such heads; "
                    f"certify without {'it' if len(heads) == 1 else 'them'}.")
        if self.tangent_rank < self.generic_rank:
            return (f"the heads are a singular point of the parametrization: the tangent rank "
                    f"{self.tangent_rank} is below the rank {self.generic_rank} of generic heads "
                    "(e.g. two heads share a value or key-query factor), so k-head functions "
                    "arbitrarily near leave the tangent space and a first-order certificate "
                    "says nothing.")
        if self.data_rank < self.tangent_rank:
            return (f"the data determine {self.data_rank} of the {self.tangent_rank} tangent "
                    f"directions ({self.n_equations} equations).")
        return None

    def __bool__(self):
        return self.holds

    def __repr__(self):
        text = (f"LocalCertificate(holds={self.holds}, data_rank={self.data_rank}, "
                f"tangent_rank={self.tangent_rank}, n_parameters={self.n_parameters}, "
                f"n_equations={self.n_equations}, "
                f"relative_sigma_min={self.relative_sigma_min:.3g}")
        return text + (")" if self.reason is None else f", reason={self.reason!r})")


def _rank(s, shape):
    """Singular values s (descending) of an m x n matrix above ``max(m, n) eps s_max``."""
    return int(np.sum(s > _rank_tolerance(s, shape)))


def _rank_tolerance(s, shape):
    return max(shape) * _EPS * float(s[0]) if s.size else 0.0


def _coefficient_jacobian(V, Q):
    """J_p: rows (a, p, l) of the folded coefficients, columns V then Q flattened."""
    n_heads, d_out, d = V.shape
    B = _key_query_design(V[None])[0]  # (d_out * P, n_heads * d): rows (a, p), cols (h, c)
    JQ = np.einsum("xy,lm->xlym", B, np.eye(d)).reshape(B.shape[0] * d, -1)
    A = _value_design(Q[None])[0]  # (P, d, n_heads, d): A[p, l, h, c]
    JV = np.einsum("plhc,ab->aplhbc", A, np.eye(d_out)).reshape(B.shape[0] * d, -1)
    return np.hstack([JV, JQ])


def _symmetric_jacobian(V, Q):
    """J_p in the symmetric embedding: the rows of pairs j < k divided by sqrt(2).

    The folded coefficient of a pair is the sum of two entries of the
    symmetric coefficient tensor; its symmetric coordinate (that entry times
    sqrt(2)) makes the Frobenius norm of the tensor the Euclidean norm, so an
    orthogonal map of the tokens acts orthogonally.
    """
    d_out, d = V.shape[1:]
    j, k = pair_indices(d)
    pw = np.where(j == k, 1.0, np.sqrt(2.0))
    Jp = _coefficient_jacobian(V, Q)
    return (Jp.reshape(d_out, j.size, d, -1) / pw[None, :, None, None]).reshape(Jp.shape)


@functools.lru_cache(maxsize=32)
def _generic_rank(n_heads, d_out, d):
    """Rank of J_p at random heads: its largest value, reached almost everywhere."""
    rng = np.random.default_rng(0)
    V = rng.standard_normal((n_heads, d_out, d))
    Q = rng.standard_normal((n_heads, d, d))
    Jp = _symmetric_jacobian(V, Q)
    return _rank(scipy.linalg.svd(Jp, compute_uv=False, lapack_driver="gesdd"), Jp.shape)


def _certificate(rows, V, Q, eps_in=_EPS):
    """LocalCertificate of balanced heads (V, Q) in the standardized coordinates of the rows.

    The tolerances are those of :class:`LocalCertificate`; ``eps_in`` is the
    machine epsilon of the sequences' dtype (at least float64's).
    """
    n_heads, d_out, d = V.shape
    size = (np.linalg.norm(V.reshape(n_heads, -1), axis=1)
            * np.linalg.norm(Q.reshape(n_heads, -1), axis=1))
    degenerate = np.flatnonzero(size <= n_heads * _EPS * size.sum())
    Jp = _symmetric_jacobian(V, Q)
    _, sp, Wt = scipy.linalg.svd(Jp, full_matrices=False, lapack_driver="gesdd")
    tau_p = _rank_tolerance(sp, Jp.shape)
    r = int(np.sum(sp > tau_p))
    # G = Phi U, U an orthonormal basis of range(J_p): the output Jacobian
    # (Phi J_p) on the right singular vectors, divided by the singular values.
    G = (rows.jacobian(V, Q) @ Wt[:r].T) / sp[:r]
    sg = scipy.linalg.svd(G, compute_uv=False) if G.size else np.zeros(0)
    data_rank = 0
    if sg.size and sg[0] > 0:
        # ||Phi||_F: a symmetric-embedding feature row S_r (x) x_r has norm ||S_r||_F ||x_r||.
        phi = np.sqrt(np.sum(rows.sqrt_w**2 * np.sum(rows.S**2, axis=(1, 2))
                             * np.sum(rows.x**2, axis=1)))
        tau_g = max(G.shape) * eps_in * sg[0] + phi * tau_p / sp[r - 1]
        data_rank = int(np.sum(sg > tau_g))
    full = np.zeros(r)
    full[:sg.size] = sg[:r]
    rel = full[-1] / full[0] if r and full[0] > 0 else 0.0
    return LocalCertificate(tangent_rank=r, data_rank=data_rank, n_parameters=Jp.shape[1],
                            n_equations=G.shape[0], relative_sigma_min=rel,
                            generic_rank=_generic_rank(n_heads, d_out, d),
                            degenerate_heads=degenerate)


# Exponent below every float64's: marks a head with no non-zero entry.
_NO_EXPONENT = -(2**40)


def _head_exponents(A, shift):
    """Per head, the largest binary exponent of ``A[h] * 2**shift`` (``_NO_EXPONENT`` if zero)."""
    mantissa, exp = np.frexp(A)
    exp = np.where(mantissa != 0, exp + shift[None], _NO_EXPONENT)
    return exp.reshape(A.shape[0], -1).max(axis=1, initial=_NO_EXPONENT)


def standardized_heads(st, V, Q, y_exponents=None):
    """Heads in the data's units as heads on st's standardized tokens, per head ``2**c_h`` apart.

    Returns ``(V_s, Q_s, c)``: the function on standardized tokens (outputs
    in units of ``2**y_exponents``, or unscaled) has the heads ``2**c[h]
    V_s[h]`` and ``Q_s[h]``, the entries of V_s and Q_s at most 1 before the
    whitening; ``c[h]`` is ``_NO_EXPONENT`` for a zero head (V_h or Q_h
    zero), which comes back zero.  Each entry is scaled by one power of two
    (the units of its coordinates and output, and its head's own), so
    nothing over- or underflows whatever the units or the heads' balance.
    """
    e = st.exponents
    ey = np.zeros(V.shape[1], dtype=np.int64) if y_exponents is None else y_exponents
    sv = e[None, :] - ey[:, None]  # V[h, a, j] * 2**(e_j - ey_a)
    sq = e[:, None] + e[None, :]  # Q[h, k, l] * 2**(e_k + e_l)
    mv, mq = _head_exponents(V, sv), _head_exponents(Q, sq)
    live = (mv != _NO_EXPONENT) & (mq != _NO_EXPONENT)
    mv, mq = np.where(live, mv, 0), np.where(live, mq, 0)
    # A head with one zero factor is zero: cleared before scaling, which could overflow.
    Vs = np.ldexp(V * live[:, None, None], sv[None] - mv[:, None, None])
    Qs = np.ldexp(Q * live[:, None, None], sq[None] - mq[:, None, None])
    if st.whitening is not None:
        Wi = st.inverse_whitening
        Vs, Qs = Vs @ Wi.T, Wi @ Qs @ Wi.T
    return Vs, Qs, np.where(live, mv + mq, _NO_EXPONENT).astype(np.int64)


def _standard_heads(st, V, Q):
    """The heads on st's standardized tokens up to one positive factor, the largest about 1.

    Each head keeps its size relative to the largest, split evenly between
    its two factors (a head 2**-2000 below the largest underflows to zero:
    it is degenerate either way).
    """
    Vs, Qs, c = standardized_heads(st, V, Q)
    live = c != _NO_EXPONENT
    rel = np.where(live, c - (c[live].max() if live.any() else 0), 0)
    half = rel // 2
    return (np.ldexp(Vs, half[:, None, None]),
            np.ldexp(Qs, (rel - half)[:, None, None]))


def _local_certificate(X, lengths, readout, weight, V, Q, what=None):
    """LocalCertificate of heads (V, Q) in the data's units on validated sequences.

    ``what`` names the caller in the memory check (None: checked already).
    """
    eps_in = max(_EPS, float(np.finfo(X.dtype).eps)) if X.dtype.kind == "f" else _EPS
    st = standardizer_for(X, lengths, None, weight)
    n_samples, n_tokens = X.shape[:2]
    d_out = V.shape[1]
    # The rows need targets only for their scale, which ranks do not see.
    Y = np.ones((n_samples, d_out) if readout == "last" else (n_samples, n_tokens, d_out))
    # Whitened tokens have unit root mean square, where _Rows' powers of two
    # would flip between 2**-1 and 2**0 with rounding, scaling coordinates
    # unequally; at 1.5 times that they are all 2**0 (a uniform scale, which
    # no rank sees).
    rows = _Rows(1.5 * st.transform(X), lengths, Y, readout, st.transform_weights(weight))
    if what is not None:
        _check_jacobian_memory(what, rows, V.shape[0])
    Vs, Qs = rows.to_standard(*_standard_heads(st, V, Q))
    return _certificate(rows, *_balance(Vs, Qs), eps_in=eps_in)


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


def _validated(X, y, readout, sample_weight, *, heads_d=None, task="fit"):
    """Validated sequences, lengths, targets (None without y) and weights (ones for None)."""
    check_readout(readout)
    X, lengths = check_sequences(X, n_features_in=heads_d)
    Y = None if y is None else check_targets(y, lengths, X.shape[1], readout=readout)[0]
    w = check_sample_weight(sample_weight, X.shape[0])
    w = np.ones(X.shape[0]) if w is None else w
    if not np.any(w > 0):
        raise ValueError(
            f"sample_weight is zero for every one of the {X.shape[0]} sequences: there is "
            f"nothing to {task}; give some sequence a positive weight."
        )
    return X, lengths, Y, w


def _training_rows(X, y, readout, sample_weight, heads_d=None):
    X, lengths, Y, w = _validated(X, y, readout, sample_weight, heads_d=heads_d)
    return _Rows(X.astype(np.float64, copy=False), lengths, Y, readout, w)


def fit_heads_memory(n_rows, d, d_out, n_heads):
    """Bytes of the largest arrays ``fit_heads`` holds at once.

    The Jacobian of the training outputs (``n_rows d_out`` x the ``k (d_out d
    + d**2)`` parameters) and that of the coefficient map (``d_out psi`` x
    the parameters), each with its SVD factors (about three copies).
    """
    n_params = n_heads * (d_out * d + d * d)
    psi = d * d * (d + 1) // 2
    return 8.0 * 3 * n_params * (n_rows * d_out + d_out * psi)


def _check_jacobian_memory(what, rows, n_heads):
    """Refuse, before allocating them, Jacobians larger than the memory budget."""
    need = fit_heads_memory(rows.n_rows, rows.d, rows.d_out, n_heads)
    budget = resolve_budget(None)
    if need > budget:
        raise ValueError(
            f"{what} needs about {need / 2**30:.3g} GiB for the Jacobians of {n_heads} "
            f"heads on {rows.n_rows} rows (d = {rows.d}, d_out = {rows.d_out}), more than the "
            f"memory budget of {budget / 2**30:.3g} GiB (half the physical memory); use "
            "fewer rows or heads."
        )


def fit_heads_work(n_rows, d, d_out, n_heads):
    """Floating-point operations of one Levenberg-Marquardt step of ``fit_heads`` (an SVD)."""
    n_params = n_heads * (d_out * d + d * d)
    m = n_rows * d_out
    return float(m) * n_params * min(m, n_params)


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
    rows = _Rows(X.astype(np.float64, copy=False), lengths, Y, readout, w)
    _check_jacobian_memory("fit_heads", rows, n_heads)
    norm2 = float(np.sum((rows.Y * rows.sqrt_w[:, None]) ** 2))
    best = None
    n_starts = 0
    n_params = n_heads * (rows.d_out * rows.d + rows.d**2)
    small = rows.n_rows * rows.d_out * n_params <= _SINGLE_THREAD_ENTRIES
    with single_blas_thread() if small else contextlib.nullcontext():
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
                f"fit_heads: the best of {n_starts} starts stopped at max_iter={max_iter} "
                "iterations while its residual was still falling; the heads may fit the data "
                "worse than they can. Increase max_iter.",
                ConvergenceWarning,
            )
        V, Q = _balance(V, Q)
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


def certify_heads_locally(X, V, Q, *, readout="last", sample_weight=None):
    """The local certificate of given heads on given sequences.

    Whether the training rows of X determine the k-head function of (V, Q)
    among the k-head functions near it (see :class:`LocalCertificate`:
    local, not global).  Only the sequences enter, not the targets.  The
    verdict does not depend on how the function is written down: each head's
    balance, the scale of the heads, or the units of the tokens (see
    :class:`LocalCertificate` for the coordinates and tolerances).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; trailing all-NaN tokens are padding.
    V : array-like of shape (n_heads, d_out, d)
        Value matrices.
    Q : array-like of shape (n_heads, d, d)
        Fused key-query matrices.
    readout : {"last", "all"}, default="last"
        One row per sequence, or one per real position.
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Sequences of zero weight do not count.

    Returns
    -------
    certificate : LocalCertificate
        Truthy iff no head is degenerate, the heads are a regular point of
        the parametrization and the restricted feature rows have full rank;
        otherwise its ``reason`` says which fails.

    Raises
    ------
    ValueError
        For invalid X, heads, readout or sample_weight (every weight zero
        included: nothing to certify), and before allocating Jacobians larger
        than the memory budget.
    TypeError
        For arguments of the wrong type.

    Examples
    --------
    A one-head model at d = 4 with one output has 20 parameters and one
    symmetry (``V c, Q / c``): 18 sequences cannot pin it down, 19 can.

    >>> import numpy as np
    >>> from sklearn_linattn import certify_heads_locally
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 4, 4))
    >>> X = rng.normal(size=(19, 10, 4))
    >>> bool(certify_heads_locally(X[:18], V, Q)), bool(certify_heads_locally(X, V, Q))
    (False, True)
    >>> certify_heads_locally(X, V, Q).tangent_rank
    19
    """
    V, Q = check_heads(V, Q)
    X, lengths, _, w = _validated(X, None, readout, sample_weight, heads_d=V.shape[2],
                                  task="certify")
    return _local_certificate(X, lengths, readout, w, V, Q, what="certify_heads_locally")
