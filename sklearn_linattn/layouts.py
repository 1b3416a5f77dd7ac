"""Other layouts of the same function, both ways: projection weights and the paper's code."""

import math
from collections import namedtuple

import numpy as np
import scipy.sparse

from ._memory import resolve_budget
from ._validation import as_real_array
from ._params import check_number

__all__ = [
    "Projections",
    "heads_from_paper",
    "heads_from_projections",
    "paper_from_heads",
    "projections_from_heads",
]

#: The weights of a standard causal multi-head linear attention layer:
#: W_q and W_k of shape (n_heads, d_k, d), W_v of shape (n_heads, d_v, d),
#: W_o of shape (d_out, n_heads * d_v).
Projections = namedtuple("Projections", ["W_q", "W_k", "W_v", "W_o"])


def _bytes(n_bytes):
    return (f"{n_bytes / 2**40:.3g} TiB" if n_bytes >= 2**40 else f"{n_bytes / 2**30:.3g} GiB")


def check_float64_size(n_values, what, memory_budget=None):
    """Refuse ``n_values`` float64 values (``what``, in the message) beyond the memory budget."""
    budget = resolve_budget(memory_budget)
    if 8 * n_values > budget:
        raise ValueError(
            f"{what} would take {_bytes(8 * n_values)} as float64, more than the memory budget "
            f"of {_bytes(budget)}{' (half the physical memory)' if memory_budget is None else ''}"
            "; a broadcast or expanded view counts at its full size. Pass smaller weights."
        )


def dense_weight(W, name, memory_budget=None):
    """A weight as a finite float64 array; sparse, meta-device and over-budget ones refused."""
    if scipy.sparse.issparse(W):
        raise TypeError(
            f"{name} must be a dense array (or tensor); got a scipy.sparse {W.format} matrix of "
            f"shape {W.shape}: pass {name}.toarray()."
        )
    if getattr(getattr(W, "device", None), "type", None) == "meta":
        raise ValueError(
            f"{name} is a tensor on the meta device: it has a shape, {tuple(W.shape)}, but no "
            "values. Load the weights first (for a module built on the meta device: "
            "module.to_empty(device='cpu'), then module.load_state_dict(...))."
        )
    if str(getattr(W, "layout", "torch.strided")) != "torch.strided":
        raise TypeError(
            f"{name} must be a dense tensor; got a tensor of layout {W.layout}: pass "
            f"{name}.to_dense()."
        )
    try:
        dims = tuple(int(n) for n in W.shape)
    except (AttributeError, TypeError, ValueError):  # no shape yet: a list, a number
        dims = None
    if dims is not None:
        check_float64_size(math.prod(dims), f"{name} of shape {dims}", memory_budget)
    return as_real_array(W, name, finite=True)


def _check_ndim(a, name, ndims, expected):
    if a.ndim not in ndims:
        raise ValueError(f"{name} must have shape {expected}; got shape {a.shape}.")


def _per_head(W, name, rows, n_heads):
    """A projection as (n_heads, rows, d): 3-D as given, 2-D fused (n_heads * rows, d) split."""
    W = dense_weight(W, name)
    _check_ndim(W, name, (2, 3), f"(n_heads, {rows}, d) or the fused (n_heads * {rows}, d)")
    if W.ndim == 3:
        if n_heads is not None and W.shape[0] != n_heads:
            raise ValueError(
                f"{name} has {W.shape[0]} heads (shape {W.shape}); got n_heads={n_heads}."
            )
        return W
    if n_heads is None:
        raise ValueError(
            f"{name} is 2-D (the fused layout of shape (n_heads * {rows}, d)), so the number "
            f"of heads is not in its shape: pass n_heads; got {name} of shape {W.shape} and "
            "n_heads=None."
        )
    if W.shape[0] % n_heads:
        raise ValueError(
            f"the fused {name} must have n_heads * {rows} rows; got {W.shape[0]} rows, not a "
            f"multiple of n_heads={n_heads}."
        )
    return W.reshape(n_heads, W.shape[0] // n_heads, W.shape[1])


def heads_from_projections(W_q, W_k, W_v, W_o=None, *, scale=1.0, n_heads=None):
    """The heads (V, Q) of a standard causal multi-head linear attention layer.

    The layer ``o_t = W_o concat_h [scale * sum_{s <= t} (q_t . k_s) v_s]`` is
    the package's MHLA with ``V_h = W_o[:, h * d_v:(h + 1) * d_v] @ W_v[h]``
    and ``Q_h = scale * W_k[h].T @ W_q[h]``.

    Parameters
    ----------
    W_q, W_k : array-like of shape (n_heads, d_k, d) or (n_heads * d_k, d)
        Query and key projections, per head or fused as ``torch.nn.Linear``
        stores them (rows ``h * d_k`` to ``(h + 1) * d_k - 1`` for head h).
    W_v : array-like of shape (n_heads, d_v, d) or (n_heads * d_v, d)
        Value projections, per head or fused.
    W_o : array-like of shape (d_out, n_heads * d_v) or None, default=None
        Output projection of the concatenated heads; None is the identity.
    scale : float, default=1.0
        Factor of every score ``q_t . k_s`` (often ``1 / sqrt(d_k)``); positive.
    n_heads : int or None, default=None
        Number of heads; needed only for the fused 2-D layouts.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
        Value matrices, float64.
    Q : ndarray of shape (n_heads, d, d)
        Key-query matrices, float64.

    Raises
    ------
    TypeError
        When a weight is not a dense array or tensor of numbers.
    ValueError
        When a weight is complex, not finite or without values, the sizes do not
        fit together, or the float64 arrays would exceed the memory budget.

    See Also
    --------
    sklearn_linattn.nn.from_torch : The same from a PyTorch layer.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import heads_from_projections
    >>> W_q = W_k = W_v = np.eye(2)[None]      # one head, d = d_k = d_v = 2
    >>> V, Q = heads_from_projections(W_q, W_k, W_v, 3 * np.eye(2), scale=0.5)
    >>> np.diag(V[0]), np.diag(Q[0])
    (array([3., 3.]), array([0.5, 0.5]))
    """
    scale = check_number(scale, "scale", low=0.0, low_open=True)
    n_heads = check_number(n_heads, "n_heads", integer=True, low=1, allow_none=True)
    W_q = _per_head(W_q, "W_q", "d_k", n_heads)
    W_k = _per_head(W_k, "W_k", "d_k", n_heads)
    W_v = _per_head(W_v, "W_v", "d_v", n_heads)
    H, d_k, d = W_q.shape
    if W_k.shape != W_q.shape or W_v.shape[0] != H or W_v.shape[2] != d:
        raise ValueError(
            "W_q and W_k must have the same shape (n_heads, d_k, d) and W_v shape "
            f"(n_heads, d_v, d) with the same n_heads and d; got W_q of shape {W_q.shape}, "
            f"W_k of shape {W_k.shape} and W_v of shape {W_v.shape}."
        )
    d_v = W_v.shape[1]
    if W_o is None:
        check_float64_size((H * d_v) ** 2, f"the identity W_o of shape ({H * d_v}, {H * d_v})")
        W_o = np.eye(H * d_v)
    else:
        W_o = dense_weight(W_o, "W_o")
        if W_o.ndim != 2 or W_o.shape[1] != H * d_v:
            raise ValueError(
                f"W_o must have shape (d_out, n_heads * d_v) = (d_out, {H * d_v}); got shape "
                f"{W_o.shape}."
            )
    d_out = W_o.shape[0]
    # The heads hold d x d numbers per head: d = 4096 and 32 heads are 4 GiB.
    check_float64_size(H * d * (d_out + d),
                       f"the heads V of shape ({H}, {d_out}, {d}) and Q of shape ({H}, {d}, {d})")
    blocks = W_o.reshape(W_o.shape[0], H, d_v).transpose(1, 0, 2)  # (H, d_out, d_v)
    V = blocks @ W_v
    Q = scale * np.swapaxes(W_k, 1, 2) @ W_q
    return V, Q


def _rank(s, rtol):
    """Singular values above ``rtol`` times the largest (rows of s: one matrix each)."""
    return np.sum(s > rtol * s[:, :1], axis=1) * (s[:, 0] > 0)


def _groups(rank, size):
    return [slice(start, min(start + size, rank)) for start in range(0, rank, size)]


def projections_from_heads(V, Q, *, d_k=None, d_v=None, scale=1.0, n_heads=None, rtol=None):
    """Projection weights of a standard causal multi-head linear attention layer, from heads.

    The inverse of :func:`heads_from_projections`, exact up to rounding.  A head whose
    ``Q_h`` (``V_h``) has rank above ``d_k`` (``d_v``) becomes several layer heads
    (:doc:`/torch`).

    Parameters
    ----------
    V : array-like of shape (n_heads_in, d_out, d)
        Value matrices.
    Q : array-like of shape (n_heads_in, d, d)
        Key-query matrices.
    d_k, d_v : int or None, default=None
        Rows of each layer head's query and key, and value projections; None is
        d and ``min(d_out, d)``.
    scale : float, default=1.0
        The layer's factor of every score; positive.
    n_heads : int or None, default=None
        Number of layer heads, completed with zero heads; None uses as many as
        the factorization needs (at least one).
    rtol : float or None, default=None
        Singular values of ``Q_h`` or ``V_h`` at most ``rtol`` times their matrix's
        largest count as zero; None is ``max(d_out, d)`` times the float64 epsilon.

    Returns
    -------
    projections : Projections
        A named tuple ``(W_q, W_k, W_v, W_o)`` of float64 arrays for which
        ``heads_from_projections(*projections, scale=scale)`` computes the
        same function as ``(V, Q)``.

    Raises
    ------
    ValueError
        When ``n_heads`` is below the number of layer heads needed (the
        message says how many), or an argument has the wrong shape or value.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import projections_from_heads, same_function
    >>> V, Q = np.ones((1, 1, 3)), np.eye(3)[None]     # rank(Q_0) = 3
    >>> p = projections_from_heads(V, Q, d_k=1)         # three layer heads of d_k = 1
    >>> p.W_q.shape
    (3, 1, 3)
    >>> same_function(V, Q, *heads_from_projections(*p))
    True
    """
    V = as_real_array(V, "V", finite=True)
    Q = as_real_array(Q, "Q", finite=True)
    if (V.ndim != 3 or Q.ndim != 3 or Q.shape[1] != Q.shape[2] or V.shape[0] != Q.shape[0]
            or V.shape[2] != Q.shape[1] or V.shape[0] == 0):
        raise ValueError(
            "V must have shape (n_heads, d_out, d) and Q shape (n_heads, d, d) with the same "
            f"n_heads >= 1 and d; got V of shape {V.shape} and Q of shape {Q.shape}."
        )
    _, d_out, d = V.shape
    d_k = check_number(d_k, "d_k", integer=True, low=1, allow_none=True) or d
    d_v = check_number(d_v, "d_v", integer=True, low=1, allow_none=True) or min(d_out, d)
    scale = check_number(scale, "scale", low=0.0, low_open=True)
    n_heads = check_number(n_heads, "n_heads", integer=True, low=1, allow_none=True)
    eps = np.finfo(np.float64).eps
    rtol = check_number(rtol, "rtol", low=0.0, allow_none=True)
    rtol = max(d_out, d) * eps if rtol is None else rtol
    Uq, sq, Wq = np.linalg.svd(Q / scale)
    Uv, sv, Wv = np.linalg.svd(V, full_matrices=False)
    rank_q, rank_v = _rank(sq, rtol), _rank(sv, rtol)
    rank_v = rank_v * (rank_q > 0)
    needed = int(np.sum(-(-rank_q // d_k) * -(-rank_v // d_v)))
    if n_heads is not None and needed > n_heads:
        raise ValueError(
            f"an exact factorization into heads with d_k={d_k} and d_v={d_v} needs {needed} "
            f"layer heads (ranks of Q_h: {rank_q.tolist()}, of V_h: {rank_v.tolist()}); got "
            f"n_heads={n_heads}. Pass n_heads={needed}, a larger d_k or d_v, or first reduce "
            "the number of heads of the function with sklearn_linattn.compress_heads."
        )
    L = max(needed, n_heads or 1)
    W_q, W_k = np.zeros((L, d_k, d)), np.zeros((L, d_k, d))
    W_v, blocks = np.zeros((L, d_v, d)), np.zeros((L, d_out, d_v))
    rq, rv = np.sqrt(sq), np.sqrt(sv)
    layer = 0
    for h in range(len(V)):
        for gv in _groups(rank_v[h], d_v):
            for gq in _groups(rank_q[h], d_k):
                n_q, n_v = gq.stop - gq.start, gv.stop - gv.start
                W_k[layer, :n_q] = rq[h, gq, None] * Uq[h][:, gq].T
                W_q[layer, :n_q] = rq[h, gq, None] * Wq[h][gq]
                W_v[layer, :n_v] = rv[h, gv, None] * Wv[h][gv]
                blocks[layer, :, :n_v] = Uv[h][:, gv] * rv[h, gv]
                layer += 1
    W_o = blocks.transpose(1, 0, 2).reshape(d_out, L * d_v)
    return Projections(W_q, W_k, W_v, W_o)


def _paper_pair(A, Q, name):
    A = as_real_array(A, name, finite=True)
    Q = as_real_array(Q, "Q", finite=True)
    if (A.ndim != 3 or Q.ndim != 3 or Q.shape[1] != Q.shape[2] or A.shape[0] != Q.shape[0]
            or A.shape[2] != Q.shape[1] or A.shape[0] == 0):
        raise ValueError(
            f"{name} must have shape (n_heads, d_out, d) and Q shape (n_heads, d, d) with the "
            f"same n_heads >= 1 and d; got {name} of shape {A.shape} and Q of shape {Q.shape}."
        )
    return A, Q, A.shape[0] * np.sqrt(A.shape[2])


def heads_from_paper(P, Q):
    """The heads (V, Q) of the paper's research-code layout, ``V_h = P_h / (m sqrt(d))``.

    Parameters
    ----------
    P : array-like of shape (m, d_out, d)
        The paper's value matrices.
    Q : array-like of shape (m, d, d)
        The paper's key-query matrices.

    Returns
    -------
    V : ndarray of shape (m, d_out, d)
        The package's value matrices, ``P / (m sqrt(d))``.
    Q : ndarray of shape (m, d, d)
        The key-query matrices, unchanged (a float64 copy).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import heads_from_paper
    >>> V, Q = heads_from_paper(np.full((2, 1, 4), 4.0), np.ones((2, 4, 4)))
    >>> V[0]
    array([[1., 1., 1., 1.]])
    """
    P, Q, factor = _paper_pair(P, Q, "P")
    return P / factor, Q.copy()


def paper_from_heads(V, Q):
    """The paper's research-code layout (P, Q) of heads; the inverse of :func:`heads_from_paper`.

    Parameters
    ----------
    V : array-like of shape (m, d_out, d)
        The package's value matrices.
    Q : array-like of shape (m, d, d)
        Key-query matrices.

    Returns
    -------
    P : ndarray of shape (m, d_out, d)
        The paper's value matrices, ``V * m sqrt(d)``.
    Q : ndarray of shape (m, d, d)
        The key-query matrices, unchanged (a float64 copy).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import paper_from_heads
    >>> P, Q = paper_from_heads(np.ones((2, 1, 4)), np.ones((2, 4, 4)))
    >>> P[0]
    array([[4., 4., 4., 4.]])
    """
    V, Q, factor = _paper_pair(V, Q, "V")
    return V * factor, Q.copy()
