"""Multi-head linear attention: forward pass, coefficients p(Theta), heads.

Convention (DESIGN.md section 1), with ``X[i]`` of shape (n_tokens, d) the
paper's ``Z_i^T``:

    y = sum_h V_h sum_t x_t (x_t^T Q_h x_last)

``V`` has shape (n_heads, d_out, d) and ``Q`` shape (n_heads, d, d).  The
output is linear in the cubic features: ``y_a = <coef[a], H(X)>`` with
``coef = attention_coefficients(V, Q)`` of shape (d_out, psi).
"""

import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from threadpoolctl import threadpool_limits

from ._features import iter_sample_chunks, pair_indices
from ._validation import check_lengths, check_readout, check_scalar, check_sequences

__all__ = [
    "attention_coefficients",
    "compress_heads",
    "fold_coefficients",
    "heads_from_coefficients",
    "mhla_forward",
    "mhla_generate",
    "same_function",
    "unfold_coefficients",
]


def _check_heads(V, Q):
    V = np.asarray(V, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    if V.ndim != 3 or Q.ndim != 3:
        raise ValueError(
            "V must have shape (n_heads, d_out, d) and Q shape (n_heads, d, d); got "
            f"V of shape {V.shape} and Q of shape {Q.shape}."
        )
    if Q.shape[1] != Q.shape[2] or V.shape[0] != Q.shape[0] or V.shape[2] != Q.shape[1]:
        raise ValueError(
            "V must have shape (n_heads, d_out, d) and Q shape (n_heads, d, d) with the "
            f"same n_heads and d; got V of shape {V.shape} and Q of shape {Q.shape}."
        )
    return V, Q


def mhla_forward(X, V, Q, lengths=None, *, readout="last"):
    """Output of a one-layer multi-head linear attention.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences.  Without ``lengths``, trailing all-NaN tokens are padding
        (the package's padding rule).
    V : array-like of shape (n_heads, d_out, d)
        Value matrices.
    Q : array-like of shape (n_heads, d, d)
        Fused key-query matrices.
    lengths : array-like of int, shape (n_samples,), or None
        Number of real tokens per sequence, for callers that keep lengths
        next to a NaN-free array: tokens at positions ``>= lengths[i]`` are
        then ignored whatever they hold.  None reads lengths from the NaN
        padding.
    readout : {"last", "all"}, default="last"
        ``"last"``: the output at the last real token.  ``"all"``: the causal
        output at every position.

    Returns
    -------
    y : ndarray
        Shape (n_samples, d_out) for ``"last"``; (n_samples, n_tokens, d_out)
        for ``"all"``, NaN at padded positions.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._mhla import mhla_forward
    >>> X = np.array([[[1.0, 0.0], [0.0, 2.0]]])
    >>> V = np.eye(2)[None]
    >>> Q = np.eye(2)[None]
    >>> mhla_forward(X, V, Q)
    array([[0., 8.]])
    """
    V, Q = _check_heads(V, Q)
    check_readout(readout)
    if lengths is None:
        X, lengths = check_sequences(X, n_features=V.shape[2])
    else:
        X, lengths = check_lengths(X, lengths, n_features=V.shape[2])
    n_samples, n_tokens, d = X.shape
    n_heads, d_out = V.shape[:2]
    if readout == "last":
        out = np.empty((n_samples, d_out))
        per_sample = n_tokens * (d + n_heads)
    else:
        out = np.empty((n_samples, n_tokens, d_out))
        # Running d x d moments, or the masked n_tokens x n_tokens scores per head.
        per_sample = n_tokens * min(d * d, n_heads * n_tokens) + n_tokens * n_heads * d
    for sl in iter_sample_chunks(n_samples, per_sample):
        Xc = np.asarray(X[sl], dtype=np.float64)
        if readout == "last":
            out[sl] = _forward_last(Xc, V, Q, lengths[sl])
        else:
            out[sl] = _forward_all(Xc, V, Q, lengths[sl])
    return out


def _forward_last(X, V, Q, lengths):
    x_last = X[np.arange(X.shape[0]), lengths - 1]
    q = np.einsum("hkl,nl->nhk", Q, x_last)
    scores = np.matmul(q, X.transpose(0, 2, 1))  # (n, h, t): x_t^T Q_h x_last
    ctx = np.matmul(scores, X)  # (n, h, d): sum_t x_t score_t
    return np.einsum("haj,nhj->na", V, ctx)


def _forward_all(X, V, Q, lengths):
    n_samples, n_tokens, d = X.shape
    q = np.einsum("hkl,ntl->nhtk", Q, X)  # Q_h x_t
    if d * d <= Q.shape[0] * n_tokens:
        # y_t = sum_h V_h S_t Q_h x_t with S_t the running second moment.
        S = np.cumsum(X[:, :, :, None] * X[:, :, None, :], axis=1)
        # Batched GEMM (S_t is symmetric): ctx[n, h, t] = S[n, t] @ q[n, h, t].
        ctx = np.matmul(q.transpose(0, 2, 1, 3), S).transpose(0, 2, 1, 3)
    else:
        # Causal scores x_s^T Q_h x_t for s <= t, then their weighted sum of x_s.
        scores = np.matmul(q, X.transpose(0, 2, 1)[:, None])  # (n, h, t, s)
        scores *= np.tril(np.ones((n_tokens, n_tokens)))
        ctx = np.matmul(scores, X[:, None])  # (n, h, t, d)
    y = np.einsum("haj,nhtj->nta", V, ctx)
    y[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return y


def _check_rounding(rounding, d):
    """``rounding`` as a function from outputs (m, d) to tokens (m, d)."""
    if rounding is None:
        return None
    if callable(rounding):
        def apply(Y):
            out = np.asarray(rounding(Y), dtype=np.float64)
            if out.shape != Y.shape:
                raise ValueError(
                    f"rounding must map outputs of shape {Y.shape} to tokens of the same "
                    f"shape; it returned shape {out.shape}."
                )
            return out
        return apply
    table = np.asarray(rounding)
    if table.dtype.kind not in "biuf":
        raise TypeError(
            "rounding must be None, a callable or an embedding table of numbers; got an "
            f"array of dtype {table.dtype}."
        )
    table = table.astype(np.float64)
    if table.ndim != 2 or table.shape[1] != d or table.shape[0] == 0:
        raise ValueError(
            f"rounding as an embedding table must have shape (n_tokens, {d}) with at least "
            f"one token; got shape {table.shape}."
        )
    if not np.all(np.isfinite(table)):
        raise ValueError("rounding as an embedding table must be finite; it has NaN or inf.")
    half_norms = 0.5 * np.einsum("vd,vd->v", table, table)

    def nearest(Y):
        # argmin_v ||y - e_v||^2 = argmax_v (y . e_v - ||e_v||^2 / 2)
        return table[np.argmax(Y @ table.T - half_norms, axis=1)]
    return nearest


def mhla_generate(X, V, Q, n_steps, *, rounding=None, lengths=None):
    """Run a linear-attention model autoregressively for ``n_steps`` tokens.

    At each step the output at the last token, ``y = sum_h V_h S Q_h x_last``
    with ``S = sum_t x_t x_t^T``, is (optionally) rounded to a token and
    appended to the sequence; every sequence of the batch grows at its own
    end.  The running second moment S is updated by one outer product per
    step, so a step costs O(n_heads d^2) per sequence whatever the length.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Prompts; trailing all-NaN tokens are padding.
    V : array-like of shape (n_heads, d, d)
        Value matrices; the output dimension must equal the token dimension d.
    Q : array-like of shape (n_heads, d, d)
        Key-query matrices.
    n_steps : int
        Number of tokens to append (0 returns the prompts).
    rounding : None, callable or array-like of shape (n_vocab, d), default=None
        None appends the raw outputs.  An embedding table appends, for each
        output, the nearest of its rows in Euclidean distance (the paper's
        Def. G.2; ties go to the first row).  A callable receives the outputs
        as an array (m, d) and returns the tokens to append, same shape (e.g.
        ``CompiledProgram.round`` from :mod:`sklearn_linattn.programs`).
    lengths : array-like of int, shape (n_samples,), or None
        Number of real tokens per prompt when X has no NaN padding; None reads
        them from the padding.

    Returns
    -------
    sequences : ndarray of shape (n_samples, max(lengths) + n_steps, d)
        Prompt ``i`` followed by its ``n_steps`` generated tokens at
        positions ``lengths[i] .. lengths[i] + n_steps - 1``; NaN after.

    See Also
    --------
    mhla_forward : one output per sequence, nothing appended.

    Examples
    --------
    A one-head associative memory (key block, value block): the query's key
    retrieves the value stored under it.

    >>> import numpy as np
    >>> from sklearn_linattn import mhla_generate
    >>> V = np.zeros((1, 4, 4)); V[0, 2:, 2:] = np.eye(2)
    >>> Q = np.zeros((1, 4, 4)); Q[0, :2, :2] = np.eye(2)
    >>> memory = np.array([[[1., 0., 0., 1.],    # key 0 -> value 1
    ...                     [0., 1., 1., 0.],    # key 1 -> value 0
    ...                     [0., 1., 0., 0.]]])  # query: key 1
    >>> mhla_generate(memory, V, Q, 1)[0, -1]
    array([0., 0., 1., 0.])
    """
    V, Q = _check_heads(V, Q)
    d = Q.shape[1]
    if V.shape[1] != d:
        raise ValueError(
            "mhla_generate appends each output to its sequence, so V must have shape "
            f"(n_heads, d, d) with d_out = d = {d}; got V of shape {V.shape}."
        )
    n_steps = check_scalar(n_steps, "n_steps", integer=True, low=0)
    if lengths is None:
        X, lengths = check_sequences(X, n_features=d)
    else:
        X, lengths = check_lengths(X, lengths, n_features=d)
    round_ = _check_rounding(rounding, d)
    n_samples, n_tokens = X.shape[:2]
    out = np.full((n_samples, n_tokens + n_steps, d), np.nan)
    real = np.arange(n_tokens)[None, :] < lengths[:, None]
    out[:, :n_tokens][real] = X[real]
    n_heads = V.shape[0]
    # (h*d, d) stacks of the heads, so that one GEMM serves all heads.
    Q_flat = Q.reshape(n_heads * d, d)
    V_flat = V.transpose(0, 2, 1).reshape(n_heads * d, d)
    # One BLAS thread: the batched q @ S is one small GEMM per sequence (see
    # mhla_forward); 5.4 s -> 0.15 s for 96 sequences, 321 heads, d = 44.
    with threadpool_limits(limits=1, user_api="blas"):
        _generate_into(out, X, lengths, real, Q_flat, V_flat, n_heads, d, n_steps, round_)
    return out


def _generate_into(out, X, lengths, real, Q_flat, V_flat, n_heads, d, n_steps, round_):
    n_samples = X.shape[0]
    for sl in iter_sample_chunks(n_samples, d * d + n_heads * d):
        Xc = np.where(real[sl, :, None], X[sl], 0.0).astype(np.float64)
        S = np.matmul(Xc.transpose(0, 2, 1), Xc)
        rows = np.arange(Xc.shape[0])
        pos = lengths[sl].copy()
        x = Xc[rows, pos - 1]
        for _ in range(n_steps):
            q = (x @ Q_flat.T).reshape(-1, n_heads, d)  # Q_h x_last
            ctx = np.matmul(q, S)  # (S Q_h x_last)^T, S symmetric
            y = ctx.reshape(-1, n_heads * d) @ V_flat
            x = y if round_ is None else round_(y)
            out[sl][rows, pos] = x
            S += x[:, :, None] * x[:, None, :]
            pos += 1


def fold_coefficients(C):
    """Fold a full coefficient tensor C[a, j, k, l] into psi coefficients.

    Only ``C[a, j, k, l] + C[a, k, j, l]`` reaches the output because S is
    symmetric; the folded vector keeps that sum once per pair j <= k.

    Parameters
    ----------
    C : ndarray of shape (d_out, d, d, d)

    Returns
    -------
    coef : ndarray of shape (d_out, psi)
    """
    d_out, d = C.shape[0], C.shape[1]
    j, k = pair_indices(d)
    sym = C + C.transpose(0, 2, 1, 3)
    sym[:, np.arange(d), np.arange(d)] *= 0.5
    return sym[:, j, k, :].reshape(d_out, -1)


def unfold_coefficients(coef, d):
    """Spread folded coefficients symmetrically over C[a, j, k, l] and C[a, k, j, l].

    Any split of each pair computes the same function; the symmetric one is
    the minimum-norm one.

    Returns
    -------
    C : ndarray of shape (d_out, d, d, d)
    """
    coef = np.asarray(coef, dtype=np.float64)
    d_out = coef.shape[0]
    j, k = pair_indices(d)
    c = coef.reshape(d_out, len(j), d)
    C = np.zeros((d_out, d, d, d))
    C[:, j, k, :] = 0.5 * c
    C[:, k, j, :] += 0.5 * c
    return C


def attention_coefficients(V, Q):
    """The coefficient map p(Theta): folded coefficients of an MHLA.

    ``mhla_forward(X, V, Q)[:, a] == attention_features(X) @ coef[a]`` for every X.

    Parameters
    ----------
    V : array-like of shape (n_heads, d_out, d)
    Q : array-like of shape (n_heads, d, d)

    Returns
    -------
    coef : ndarray of shape (d_out, psi)

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._mhla import attention_coefficients
    >>> attention_coefficients(np.ones((1, 1, 1)), 2 * np.ones((1, 1, 1)))
    array([[2.]])
    """
    V, Q = _check_heads(V, Q)
    return fold_coefficients(np.einsum("haj,hkl->ajkl", V, Q))


def _coefficient_matrix(coef, d):
    """Matrix M[(a, j), (k, l)] of the symmetrically unfolded coefficients."""
    d_out = coef.shape[0]
    return unfold_coefficients(coef, d).reshape(d_out * d, d * d)


def heads_from_coefficients(coef, d, *, rtol=None):
    """Attention heads computing the function given by folded coefficients.

    The unfolded coefficients, reshaped to M[(a, j), (k, l)], are split by SVD:
    each singular triple (s, u, v) gives ``V_h = sqrt(s) u`` and
    ``Q_h = sqrt(s) v``.  Singular values below ``rtol * s_max`` are dropped.

    Parameters
    ----------
    coef : array-like of shape (d_out, psi)
    d : int
        Token dimension.
    rtol : float or None
        Relative cut-off; default ``max(M.shape) * eps``.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
    Q : ndarray of shape (n_heads, d, d)
    """
    coef = np.asarray(coef, dtype=np.float64)
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


def _value_design(Q):
    """Matrix A with ``p(V, Q)[a] == A @ V[:, a, :].ravel()`` for fixed Q."""
    n_heads, d, _ = Q.shape
    # Column (h, j0) is the folded tensor T[j, k, l] = delta(j, j0) Q[h, k, l].
    E = np.einsum("hkl,iJ->hiJkl", Q, np.eye(d)).reshape(n_heads * d, d, d, d)
    return fold_coefficients(E).T


def _key_query_design(V):
    """Matrix B with ``p(V, Q).ravel() == B @ Q.ravel()`` for fixed V."""
    n_heads, d_out, d = V.shape
    # Column (h, k0, l0) is the folded C[a, j, k, l] = V[h, a, j] d(k, k0) d(l, l0).
    eye = np.eye(d)
    E = np.einsum("haj,mk,nl->hmnajkl", V, eye, eye)
    cols = fold_coefficients(E.reshape(n_heads * d * d * d_out, d, d, d))
    return cols.reshape(n_heads * d * d, -1).T


def _balance(V, Q):
    """Rescale each head so that ||V_h|| == ||Q_h|| (same function)."""
    nv = np.linalg.norm(V.reshape(len(V), -1), axis=1)
    nq = np.linalg.norm(Q.reshape(len(Q), -1), axis=1)
    ok = (nv > 0) & (nq > 0)
    s = np.ones_like(nv)
    s[ok] = np.sqrt(nq[ok] / nv[ok])
    return V * s[:, None, None], Q / s[:, None, None]


_EPS_RESIDUAL = 100 * np.finfo(np.float64).eps


def _damped_lstsq(A, b, damping):
    """``argmin ||A x - b||^2 + damping * mean(||A_col||^2) * ||x||^2``."""
    n = A.shape[1]
    if damping > 0:
        lam = np.sqrt(damping * np.einsum("ij,ij->", A, A) / n)
        A = np.vstack([A, lam * np.eye(n)])
        b = np.concatenate([b, np.zeros((n,) + b.shape[1:])])
    return scipy.linalg.lstsq(A, b, lapack_driver="gelsd")[0]


def compress_heads(
    coef, d, n_heads, *, tol=1e-10, max_iter=1000, n_init=4, random_state=None
):
    """Find an ``n_heads``-head MHLA whose coefficients best match ``coef``.

    Alternating least squares on ``||p(V, Q) - coef||``: for fixed Q the
    coefficients are linear in V and vice versa.  Each step is damped by a
    Tikhonov term that decays geometrically (1e-3, then x0.7 per sweep, down
    to 1e-15): the map Q -> p(V, Q) has an exact null space (for two heads,
    ``Q_1 += V_2 t^T, Q_2 -= V_1 t^T`` leaves p unchanged), and undamped
    steps wander along it and stall.  The first start is the truncated SVD of
    :func:`heads_from_coefficients`; further starts are random.

    Parameters
    ----------
    coef : array-like of shape (d_out, psi)
        Folded coefficients to reproduce.
    d : int
        Token dimension.
    n_heads : int
        Number of heads of the result.
    tol : float, default=1e-10
        Target relative residual ``||p(V, Q) - coef|| / ||coef||``.
    max_iter : int, default=1000
        Alternating sweeps per start.
    n_init : int, default=4
        Number of starts (the first is the SVD start).
    random_state : int, RandomState instance or None
        Seeds the random starts.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
    Q : ndarray of shape (n_heads, d, d)
    residual : float
        Relative residual reached.  A ConvergenceWarning is issued when it is
        above ``tol``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import attention_coefficients, compress_heads
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(2, 1, 4)), rng.normal(size=(2, 4, 4))
    >>> coef = attention_coefficients(V, Q)
    >>> V2, Q2, residual = compress_heads(coef, 4, 2, random_state=0)
    >>> bool(residual < 1e-10)
    True
    """
    coef = np.asarray(coef, dtype=np.float64)
    d_out = coef.shape[0]
    norm = np.linalg.norm(coef)
    if norm == 0:
        return np.zeros((n_heads, d_out, d)), np.zeros((n_heads, d, d)), 0.0
    rng = check_random_state(random_state)
    scale = np.sqrt(norm / n_heads) / d

    def random_heads(k):
        return (
            rng.standard_normal((k, d_out, d)) * scale,
            rng.standard_normal((k, d, d)) * scale,
        )

    V0, Q0 = heads_from_coefficients(coef, d, rtol=0.0)
    V0, Q0 = V0[:n_heads], Q0[:n_heads]
    if V0.shape[0] < n_heads:  # fewer singular triples than heads: add random ones
        Vr, Qr = random_heads(n_heads - V0.shape[0])
        V0, Q0 = np.concatenate([V0, Vr]), np.concatenate([Q0, Qr])
    starts = [(V0, Q0)] + [random_heads(n_heads) for _ in range(n_init - 1)]
    # The alternating steps are many small least-squares problems: BLAS threads
    # only add synchronisation, and on a busy machine spinning threads made
    # them ~100x slower (30 s instead of 0.3 s at d = 8).
    with threadpool_limits(limits=1, user_api="blas"):
        V, Q, res = _alternate(coef, starts, tol, max_iter)
    if res > tol:
        warnings.warn(
            f"compressing to n_heads={n_heads} left a relative coefficient residual of "
            f"{res:.3g} (tolerance {tol:.3g}): {n_heads} heads may not be enough to "
            "compute the fitted function; increase n_heads or use n_heads=None.",
            ConvergenceWarning,
        )
    return V, Q, res


def _alternate(coef, starts, tol, max_iter):
    """Run damped alternating least squares from each start; keep the best."""
    d_out = coef.shape[0]
    norm = np.linalg.norm(coef)
    n_heads, _, d = starts[0][0].shape
    best = None
    for V, Q in starts:
        damping, history = 1e-3, []
        for _ in range(max_iter):
            sol = _damped_lstsq(_value_design(Q), coef.T, damping)
            V = sol.T.reshape(d_out, n_heads, d).transpose(1, 0, 2)
            Q = _damped_lstsq(_key_query_design(V), coef.ravel(), damping)
            V, Q = _balance(V, Q.reshape(n_heads, d, d))
            res = np.linalg.norm(attention_coefficients(V, Q) - coef) / norm
            history.append(res)
            damping = max(0.7 * damping, 1e-15)
            # Stop at rounding level, or once undamped sweeps no longer help;
            # ``tol`` only decides whether the result is good enough.
            if res <= _EPS_RESIDUAL or (
                damping == 1e-15 and len(history) > 20 and res > 0.999 * history[-20]
            ):
                break
        if best is None or res < best[2]:
            best = (V, Q, res)
        if res <= tol:
            break
    return best


def same_function(V_a, Q_a, V_b, Q_b, *, rtol=1e-9, atol=0.0):
    """Whether two parameter sets compute the same function on every input.

    Two MHLAs are the same function iff their coefficients p(Theta) are equal
    (the paper's Corollary A.4); the head counts need not match.

    Returns
    -------
    bool

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._mhla import same_function
    >>> V, Q = np.ones((1, 1, 2)), np.eye(2)[None]
    >>> same_function(V, Q, 2 * V, Q / 2)
    True
    """
    pa = attention_coefficients(V_a, Q_a)
    pb = attention_coefficients(V_b, Q_b)
    if pa.shape != pb.shape:
        return False
    diff = np.linalg.norm(pa - pb)
    return bool(diff <= atol + rtol * max(np.linalg.norm(pa), np.linalg.norm(pb)))
