"""The local certificate of few heads: whether the data pin down the k-head function near them."""

import functools

import numpy as np
import scipy.linalg

from .._units import NO_EXPONENT, rescale_heads
from .._features import pair_indices
from .._source import standardizer_of
from .._validation import check_heads
from ._bilinear import _EPS, BilinearData, _check_jacobian_memory, _validated
from ._compression import _coef_map_of_key_queries, _coef_map_of_values, balance

__all__ = ["LocalCertificate", "certify_heads_locally"]


class LocalCertificate:
    """Whether the data identify a k-head function near the given heads, and only near.

    It holds when no head is degenerate, the heads are a regular point of the
    parametrization, and the feature rows restricted to the tangent space of the
    k-head functions at the heads have full rank.  Local: it rules out other
    k-head functions that fit the data equally well near the heads, not far
    ones.  See the user guide's :ref:`few-heads-local`.

    Parameters
    ----------
    tangent_rank : int
        Rank of the Jacobian ``J_p`` of the coefficient map at the heads: the
        dimension of the k-head functions near them.
    data_rank : int
        Rank of the feature rows restricted to the tangent space.
    n_parameters : int
        ``k * (d_out * d + d * d)``.
    n_equations : int
        Training rows times outputs (rows of positive weight).
    relative_sigma_min : float
        Smallest over largest singular value of the restricted feature rows (0
        with fewer rows than columns): how close the data are to missing a direction.
    generic_rank : int or None, default=None
        Rank of ``J_p`` at generic heads of the same shape; None takes
        ``tangent_rank``.
    degenerate_heads : tuple of int, default=()
        Indices of the degenerate heads.

    Attributes
    ----------
    holds : bool
        No degenerate head, ``tangent_rank == generic_rank`` and ``data_rank ==
        tangent_rank``; also the truth value of the object.
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
    B = _coef_map_of_key_queries(V[None])[0]  # (d_out * P, n_heads * d): rows (a, p), cols (h, c)
    JQ = np.einsum("xy,lm->xlym", B, np.eye(d)).reshape(B.shape[0] * d, -1)
    A = _coef_map_of_values(Q[None])[0]  # (P, d, n_heads, d): A[p, l, h, c]
    JV = np.einsum("plhc,ab->aplhbc", A, np.eye(d_out)).reshape(B.shape[0] * d, -1)
    return np.hstack([JV, JQ])


def _symmetric_jacobian(V, Q):
    """J_p in the symmetric embedding: the rows of pairs j < k divided by sqrt(2).

    Then the Euclidean norm is the Frobenius norm of the symmetric coefficient tensor.
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

    ``eps_in``: the machine epsilon of the sequences' dtype (at least float64's).
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


def _standard_heads(st, V, Q):
    """The heads on st's standardized tokens up to one positive factor, the largest about 1.

    Each head keeps its size relative to the largest, split evenly between V and Q.
    """
    Vs, Qs, c = st.heads_from_user(V, Q)
    live = c != NO_EXPONENT
    rel = np.where(live, c - (c[live].max() if live.any() else 0), 0)
    return rescale_heads(Vs, Qs, mv=-(rel // 2), mq=-(rel - rel // 2))


def _local_certificate(X, lengths, readout, weight, V, Q, what=None):
    """LocalCertificate of heads (V, Q) in the data's units on validated sequences.

    ``what`` names the caller in the memory check (None: checked already).
    """
    eps_in = max(_EPS, float(np.finfo(X.dtype).eps)) if X.dtype.kind == "f" else _EPS
    st = standardizer_of(X, lengths, None, weight)
    n_samples, n_tokens = X.shape[:2]
    d_out = V.shape[1]
    # The rows need targets only for their scale, which ranks do not see.
    Y = np.ones((n_samples, d_out) if readout == "last" else (n_samples, n_tokens, d_out))
    rows = BilinearData(X, lengths, Y, readout, weight, st)
    if what is not None:
        _check_jacobian_memory(what, rows, V.shape[0])
    return _certificate(rows, *balance(*_standard_heads(st, V, Q)), eps_in=eps_in)


def certify_heads_locally(X, V, Q, *, readout="last", sample_weight=None):
    """The local certificate of given heads on given sequences.

    Whether the rows of X determine the k-head function of (V, Q) among the
    k-head functions near it (:class:`LocalCertificate`).  Targets do not enter,
    and the verdict does not depend on the heads' balance or scale or the tokens' units.

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
        Truthy iff it holds; otherwise its ``reason`` says why not.

    Raises
    ------
    ValueError
        For invalid arguments (every weight zero included), and before
        allocating Jacobians beyond the memory budget.
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
