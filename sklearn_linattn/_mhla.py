"""Multi-head linear attention: forward pass, coefficients p(Theta), heads.

Convention (DESIGN.md section 1), with ``X[i]`` of shape (n_tokens, d) the
paper's ``Z_i^T``:

    y = sum_h V_h sum_t x_t (x_t^T Q_h x_last)

``V`` has shape (n_heads, d_out, d) and ``Q`` shape (n_heads, d, d).  The
output is linear in the cubic features: ``y_a = <coef[a], H(X)>`` with
``coef = attention_coefficients(V, Q)`` of shape (d_out, psi).
"""

import itertools
import math
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from ._features import iter_sample_chunks, pair_indices
from ._standardize import SAFE_EXPONENT, scale_per_sample
from ._validation import (
    as_real_array,
    check_lengths,
    check_readout,
    check_scalar,
    check_sequences,
    validate_random_state,
)

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
    V = as_real_array(V, "V", finite=True)
    Q = as_real_array(Q, "Q", finite=True)
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




def _exponent(a, axis=None):
    """Binary exponent e with ``max|a| = m * 2**e``, 0.5 <= m < 1 (0 for zeros)."""
    return np.frexp(np.max(np.abs(a), axis=axis, initial=0.0))[1]


def _scaled_heads(V, Q):
    """Heads rescaled by powers of two, and the exponent that undoes it.

    ``V_h 2**-m, Q_h 2**m`` is the same head, so each head is first balanced
    (its largest V and Q entries get about the same exponent); then one
    exponent for all of V and one for all of Q bring the largest entries to
    [0.5, 1).  The output of the rescaled heads times ``2**shift`` is the
    output of the given ones; only scaling by powers of two is exact.
    """
    n_heads, d_out, d = V.shape
    eV = _exponent(V.reshape(n_heads, d_out * d), axis=1)
    eQ = _exponent(Q.reshape(n_heads, d * d), axis=1)
    m = (eV - eQ) // 2
    V = np.ldexp(V, -m[:, None, None])
    Q = np.ldexp(Q, m[:, None, None])
    gV, gQ = _exponent(V), _exponent(Q)
    # Heads far below the largest one may underflow here: their share of every
    # output is then below 2**-1000 of the largest head's.
    return np.ldexp(V, -gV), np.ldexp(Q, -gQ), int(gV) + int(gQ)


def _restore_scale(y, exponents, start):
    """``y * 2**exponents`` per sample; ValueError naming the sample on overflow."""
    shape = (-1,) + (1,) * (y.ndim - 1)
    with np.errstate(over="ignore"):
        out = np.ldexp(y, exponents.reshape(shape))
    overflow = np.isinf(out)
    if overflow.any():
        i = int(np.flatnonzero(overflow.reshape(len(out), -1).any(axis=1))[0])
        # log2 |y| of the true output, from the rescaled value and its exponent.
        log10 = (np.log2(np.nanmax(np.abs(y[i]))) + exponents[i]) * np.log10(2.0)
        raise ValueError(
            f"the outputs for X[{start + i}] exceed the float64 range: their largest "
            f"magnitude is about 1e{log10:.0f}, above the largest float64 "
            f"{np.finfo(np.float64).max:.3g}. Rescale X or the heads (the outputs are "
            "cubic in X and linear in V and in Q)."
        )
    return out


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

    Raises
    ------
    ValueError
        When V or Q is not finite or complex, or when an output exceeds the
        float64 range (the message names the sample).
    TypeError
        When V or Q does not hold numbers.

    Notes
    -----
    The result does not depend on the units: each sequence is rescaled by the
    power of two that brings its largest entry to [0.5, 1) (``y(2**e X) =
    2**(3e) y(X)`` holds exactly), each head is balanced by a power of two
    (``V_h 2**-m, Q_h 2**m`` is the same head) and the exponents are put back
    at the end (sequences whose largest entry lies within 2**+-200 need no
    rescaling and are used as they are).  So any output that float64 can
    represent is computed to rounding accuracy relative to the size of its
    terms, whatever the scale of X (1e-100 or 1e100) or of the heads.  With
    ``readout="all"`` the rescaling is per sequence, so positions whose
    outputs are below about 2**-1000 times the largest output of their
    sequence may underflow to zero.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._mhla import mhla_forward
    >>> X = np.array([[[1.0, 0.0], [0.0, 2.0]]])
    >>> V = np.eye(2)[None]
    >>> Q = np.eye(2)[None]
    >>> mhla_forward(X, V, Q)
    array([[0., 8.]])

    Scaling X by c scales the outputs by c**3, even where c**3 alone
    overflows (here c**3 = 2**1200, compensated by the heads):

    >>> mhla_forward(2.0**400 * X, 2.0**-900 * V, 2.0**-300 * Q)
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
    # Exact power-of-two rescaling: y(2**e X) = 2**(3e) y(X), and heads
    # rescaled by _scaled_heads, so that no product over- or underflows on
    # the way to an output that float64 can hold.
    V, Q, head_shift = _scaled_heads(V, Q)
    if readout == "last":
        out = np.empty((n_samples, d_out))
        per_sample = n_tokens * (d + n_heads)
    else:
        out = np.empty((n_samples, n_tokens, d_out))
        # Running d x d moments, or the masked n_tokens x n_tokens scores per head.
        per_sample = n_tokens * min(d * d, n_heads * n_tokens) + n_tokens * n_heads * d
    for sl in iter_sample_chunks(n_samples, per_sample):
        # Padding is zero here, so the scale is that of the real tokens.
        Xc, e = scale_per_sample(X[sl], safe=SAFE_EXPONENT)
        if readout == "last":
            y = _forward_last(Xc, V, Q, lengths[sl])
        else:
            y = _forward_all(Xc, V, Q, lengths[sl])
        out[sl] = _restore_scale(y, 3 * e + head_shift, sl.start)
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

    Raises
    ------
    ValueError
        When V or Q is not finite or complex; when the output would not fit
        in the memory budget (half the physical memory; the message says how
        many steps fit); when a generated value exceeds the float64 range (the
        message names the step and the prompt).
    TypeError
        When V or Q does not hold numbers.

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
    _check_generate_memory(n_samples, n_tokens, d, n_steps)
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


def _check_generate_memory(n_samples, n_tokens, d, n_steps):
    """Refuse, before allocating it, an output larger than the memory budget."""
    # Imported here: _solvers imports much of the package.
    from ._solvers import default_memory_budget

    budget = default_memory_budget()
    itemsize = np.dtype(np.float64).itemsize
    needed = n_samples * (n_tokens + n_steps) * d * itemsize
    if needed > budget:
        fits = max(0, budget // (n_samples * d * itemsize) - n_tokens)
        raise ValueError(
            f"n_steps={n_steps} would need an output of shape ({n_samples}, "
            f"{n_tokens + n_steps}, {d}), {needed / 2**30:.3g} GiB of float64, more "
            f"than the memory budget of {budget / 2**30:.3g} GiB (half the physical "
            f"memory); at most n_steps={fits} fits for these {n_samples} prompts. "
            "Generate in shorter runs or for fewer prompts at a time."
        )


def _check_generated(values, step, n_steps, start, what):
    """ValueError naming the step and the prompt when a generated value is not finite."""
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"mhla_generate: at step {step + 1} of n_steps={n_steps}, the {what} for "
            f"X[{start + i}] is not finite ({values[i]!r}): the generated values "
            "exceed the float64 range. The outputs are cubic in the tokens, so a "
            "sequence that grows does so very fast; use fewer steps, smaller heads or "
            "a rounding that keeps tokens bounded."
        )


def _generate_into(out, X, lengths, real, Q_flat, V_flat, n_heads, d, n_steps, round_):
    n_samples = X.shape[0]
    for sl in iter_sample_chunks(n_samples, d * d + n_heads * d):
        Xc = np.where(real[sl, :, None], X[sl], 0.0).astype(np.float64)
        S = np.matmul(Xc.transpose(0, 2, 1), Xc)
        rows = np.arange(Xc.shape[0])
        pos = lengths[sl].copy()
        x = Xc[rows, pos - 1]
        for step in range(n_steps):
            with np.errstate(over="ignore", invalid="ignore"):
                q = (x @ Q_flat.T).reshape(len(x), n_heads, d)  # Q_h x_last
                ctx = np.matmul(q, S)  # (S Q_h x_last)^T, S symmetric
                y = ctx.reshape(len(x), n_heads * d) @ V_flat
            # Overflow turns into inf or NaN; appending it would poison every
            # later token, so stop at the first one.
            _check_generated(y, step, n_steps, sl.start, "output")
            x = y if round_ is None else round_(y)
            if round_ is not None:
                _check_generated(x, step, n_steps, sl.start, "rounded token")
            out[sl][rows, pos] = x
            with np.errstate(over="ignore", invalid="ignore"):
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
        Value matrices; real and finite.
    Q : array-like of shape (n_heads, d, d)
        Key-query matrices; real and finite.

    Returns
    -------
    coef : ndarray of shape (d_out, psi)
        ``psi = d * d * (d + 1) // 2``.

    Raises
    ------
    ValueError
        When V or Q has the wrong shape, is complex or not finite, or when
        the coefficients exceed the float64 range.
    TypeError
        When V or Q does not hold numbers.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._mhla import attention_coefficients
    >>> attention_coefficients(np.ones((1, 1, 1)), 2 * np.ones((1, 1, 1)))
    array([[2.]])
    """
    V, Q = _check_heads(V, Q)
    with np.errstate(over="ignore", invalid="ignore"):
        coef = fold_coefficients(np.einsum("haj,hkl->ajkl", V, Q))
    if not np.all(np.isfinite(coef)):
        raise ValueError(
            "the coefficients of these heads exceed the float64 range: sums of products "
            f"V[h, a, j] * Q[h, k, l] overflow (largest |V| {np.max(np.abs(V)):.3g}, "
            f"largest |Q| {np.max(np.abs(Q)):.3g}). Rescale the heads."
        )
    return coef


def _psi(d):
    return d * d * (d + 1) // 2


def _check_coef(coef, d):
    """Validated float64 coefficients of shape (d_out, psi) and the int d."""
    coef = as_real_array(coef, "coef", finite=True)
    d = check_scalar(d, "d", integer=True, low=1)
    if coef.ndim != 2 or coef.shape[0] == 0:
        raise ValueError(
            "coef must be a 2-D array of shape (d_out, psi) with d_out >= 1 and "
            f"psi = d*d*(d+1)/2 folded coefficients per output; got shape {coef.shape}."
        )
    psi = _psi(d)
    if coef.shape[1] != psi:
        # Name the token dimension that would fit, when one does.
        fits = [k for k in range(1, 200) if _psi(k) == coef.shape[1]]
        hint = f" (coef fits d={fits[0]})" if fits else ""
        raise ValueError(
            f"coef and d do not match: d={d} needs psi = d*d*(d+1)/2 = {psi} columns, "
            f"but coef has shape {coef.shape}{hint}."
        )
    return coef, d


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
        Folded coefficients, ``psi = d * d * (d + 1) // 2``; real and finite.
    d : int
        Token dimension.
    rtol : float or None
        Relative cut-off; default ``max(M.shape) * eps``.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
    Q : ndarray of shape (n_heads, d, d)

    See Also
    --------
    compress_heads : fewer heads computing the same function.

    Examples
    --------
    A one-head model with one output comes back with d heads:

    >>> import numpy as np
    >>> from sklearn_linattn import attention_coefficients, heads_from_coefficients
    >>> rng = np.random.default_rng(0)
    >>> coef = attention_coefficients(rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3)))
    >>> V, Q = heads_from_coefficients(coef, 3)
    >>> V.shape, Q.shape
    ((3, 1, 3), (3, 3, 3))
    >>> bool(np.allclose(attention_coefficients(V, Q), coef))
    True
    """
    coef, d = _check_coef(coef, d)
    rtol = check_scalar(rtol, "rtol", low=0.0, allow_none=True)
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


def _key_query_design(V):
    """B with ``coef[a, p, l] = sum_(h, c) B[(a, p), (h, c)] Q[h, c, l]``, per start.

    V has shape (n_starts, n_heads, d_out, d); B (n_starts, d_out * n_pairs, n_heads * d).
    Pair p = (j, k): ``V[h, a, j] Q[h, k, l] + V[h, a, k] Q[h, j, l]`` (once if j == k).
    """
    n_starts, n_heads, d_out, d = V.shape
    j, k, Ej, Ek, off = _pair_selectors(d)
    B = np.einsum("shap,pc->saphc", V[..., j], Ek)
    B += np.einsum("shap,pc->saphc", V[..., k] * off, Ej)
    return B.reshape(n_starts, d_out * j.size, n_heads * d)


def _value_design(Q):
    """A with ``coef[a, p, l] = sum_(h, c) A[p, l, h, c] V[h, a, c]``, per start.

    Q has shape (n_starts, n_heads, d, d); A (n_starts, n_pairs, d, n_heads, d).
    """
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
    """Best Q for each V, and what is left of the coefficients.

    target has shape (d_out * n_pairs, d): ``coef[a, p * d + l]`` at row
    ``a * n_pairs + p``, column l.  Returns the orthonormal basis of range(B(V))
    (zero columns for dropped singular values), Q as (n_starts, n_heads * d, d)
    and the residual (n_starts, d_out * n_pairs, d).
    """
    B = _key_query_design(V)
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
    """Gauss-Newton matrix and right-hand side of the projected residual in V.

    With G the derivative of the coefficients in V at fixed Q (block diagonal
    over outputs, blocks A), Kaufman's Jacobian is ``-(I - U U^T) G``, so
    ``J^T J = G^T G - (U^T G)^T (U^T G)`` and ``-J^T e = G^T E`` (E is already
    projected).  Parameters are ordered like V[h, a, j].
    """
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
        A = _value_design(Qm[act].reshape(-1, n_heads, d, d))
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
# n_heads = 4 needs 792 (about 0.1 s).
_MAX_MACAULAY_COLUMNS = 1000


def _isotropic_start(coef, d, n_heads):
    """Start for one output and n_heads < d: span{v_h} from common zeros of quadrics.

    With N the orthogonal complement of span{v_h}, the symmetric part of the
    coefficients vanishes on N x N: ``q_l(n) = sum_p coef[p, l] n_j n_k = 0``
    for every n in N and every l (d quadrics).  Their common zeros are found
    by linear algebra: the null space of the Macaulay matrix of degree
    ``D = n_heads + 1`` (the quadrics times all monomials of degree D - 2) is
    spanned by the powers ``n**D`` of the n in N, from which N is read off.
    D = n_heads + 1 is the smallest degree at which that held for every
    d <= 8, n_heads <= 4 checked (smaller degrees leave extra null vectors).
    Exact for exact coefficients; for noisy ones a start that the iterations
    refine.  None when the matrix would be too large.
    """
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
    # the Gram matrix (0.14 s at d = 8 against 0.9 s for a full SVD).
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
    return check_scalar(n_init, "n_init", integer=True, low=1)


def _auto_n_init(d_out, d, n_heads, max_iter):
    """Starts that fit about a second of one core, between 10 and 500.

    The time per iteration of one start is modelled from the sizes (a fixed
    overhead, the SVD of B(V), the Gauss-Newton matrix), fitted to
    measurements; it depends on the sizes only, so results are reproducible.
    Small problems, where local minima are most common (d_out = d = n_heads
    = 3 or 4), get the most starts.
    """
    n = n_heads * d_out * d
    rows = d_out * d * (d + 1) // 2
    rank = min(rows, n_heads * d)
    seconds = 30e-6 + 8e-9 * rows * (n_heads * d) ** 2 + 5e-11 * n * n * (rank * d + n)
    return int(np.clip(1.0 / (max_iter * seconds), 10, 500))


def _balance(V, Q):
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

    Minimises the relative residual ``||p(V, Q) - coef|| / ||coef||`` over
    heads (V, Q), where p is :func:`attention_coefficients` (the Frobenius
    norm of the folded coefficients).  Zero means the same function on every
    input.  The problem is non-convex, so it runs from several starts and
    keeps the best:

    - for fixed V the coefficients are linear in Q, so Q is eliminated by
      least squares and Levenberg-Marquardt runs on V alone (variable
      projection); from a good start it converges quadratically;
    - the first start is the truncated SVD of :func:`heads_from_coefficients`;
      with one output (``d_out == 1``) the second is computed from the
      coefficients by linear algebra (the span of the value vectors is fixed
      by the common zeros of d quadratic forms, which the null space of a
      Macaulay matrix gives); exact coefficients of an ``n_heads``-head
      model are recovered from it directly;
    - the other starts are random; they run in batches of growing size and
      the search stops at the first batch whose best residual is at most
      ``tol``.

    When ``coef`` needs at most ``n_heads`` heads (the SVD gives that many or
    fewer), the SVD heads are returned, completed with zero heads.

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
        Relative residual that is good enough: the search stops after the
        first batch of starts in which one reaches it, and a
        ConvergenceWarning is issued when none does.
        For coefficients fitted to noisy data, pass the residual that the
        noise allows: otherwise every one of the ``n_init`` starts runs.
    max_iter : int, default=50
        Levenberg-Marquardt iterations per start (starts that reach the
        global minimum converge quadratically, in about 10); the best start is
        then continued for up to ``max_iter`` more.  A start also stops when
        its residual reaches rounding level or stops decreasing.
    n_init : int or "auto", default="auto"
        Largest number of starts, the SVD (and one-output) start included.
        ``"auto"``: as many as about a second of work on one core allows,
        estimated from the sizes alone (so results are reproducible), between
        10 and 500 (458 at d = d_out = n_heads = 3, 10 at d = d_out = 8).
    random_state : int, RandomState instance or None, default=None
        Seeds the random starts.
    warn : bool, default=True
        Whether to issue a ConvergenceWarning when the residual stays above
        ``tol``.  Callers that judge the residual themselves (e.g. against
        the noise level of fitted coefficients) pass False.

    Returns
    -------
    V : ndarray of shape (n_heads, d_out, d)
        Value matrices.
    Q : ndarray of shape (n_heads, d, d)
        Key-query matrices; each head is balanced (``||V_h|| == ||Q_h||``).
    residual : float
        ``||attention_coefficients(V, Q) - coef|| / ||coef||`` (Frobenius
        norms of the folded coefficients; 0 for zero coefficients).  It bounds
        the change of every output on every input X: ``|y_a - y'_a| <=
        residual * ||coef|| * ||H(X)||`` with H(X) the cubic features
        (:func:`~sklearn_linattn.attention_kernel` gives ``||H(X)||**2``).

    Raises
    ------
    ValueError
        When an argument is out of range, coef is not finite or complex, or
        coef's number of columns does not match d.
    TypeError
        When an argument has the wrong type.

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

    One head cannot compute this two-head function; ``warn=False`` leaves
    the judgement to the caller:

    >>> V1, Q1, residual = compress_heads(coef, 4, 1, random_state=0, warn=False)
    >>> bool(residual > 0.1)
    True
    """
    coef, d = _check_coef(coef, d)
    n_heads = check_scalar(n_heads, "n_heads", integer=True, low=1)
    tol = check_scalar(tol, "tol", low=0.0)
    max_iter = check_scalar(max_iter, "max_iter", integer=True, low=1)
    n_init = _check_n_init(n_init)
    if not isinstance(warn, (bool, np.bool_)):
        raise TypeError(f"warn must be True or False; got {warn!r} of type {type(warn).__name__}.")
    rng = validate_random_state(random_state)
    d_out = coef.shape[0]
    if not np.any(coef):
        return np.zeros((n_heads, d_out, d)), np.zeros((n_heads, d, d)), 0.0
    # Work at unit scale (a power of two, so exactly): the Gauss-Newton
    # matrices are quartic in the coefficients' size.
    shift = int(_exponent(coef))
    c = np.ldexp(coef, -shift)
    norm = np.linalg.norm(c)
    if n_init == "auto":
        n_init = _auto_n_init(d_out, d, n_heads, max_iter)
    with threadpool_limits(limits=1, user_api="blas"):
        # Small dense problems: BLAS threads only add synchronisation (on a busy
        # machine spinning threads made the old alternating search 100x slower).
        V, Q, n_starts = _search(c, d, n_heads, tol * norm, max_iter, n_init, rng)
    V, Q = _balance(V, Q)
    residual = float(np.linalg.norm(attention_coefficients(V, Q) - c) / norm)
    half = shift // 2
    V, Q = np.ldexp(V, half), np.ldexp(Q, shift - half)
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
    target = c.reshape(d_out * (d * (d + 1) // 2), d)
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


def same_function(V_a, Q_a, V_b, Q_b, *, rtol=1e-9, atol=0.0):
    """Whether two parameter sets compute the same function on every input.

    Two MHLAs are the same function iff their coefficients p(Theta) are equal
    (the paper's Corollary A.4); the head counts need not match.

    Parameters
    ----------
    V_a, Q_a : array-like of shape (n_heads_a, d_out, d) and (n_heads_a, d, d)
        The first model's heads; real and finite.
    V_b, Q_b : array-like of shape (n_heads_b, d_out, d) and (n_heads_b, d, d)
        The second model's heads.
    rtol, atol : float
        ``||p_a - p_b|| <= atol + rtol * max(||p_a||, ||p_b||)`` counts as equal.

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
    rtol = check_scalar(rtol, "rtol", low=0.0)
    atol = check_scalar(atol, "atol", low=0.0)
    pa = attention_coefficients(V_a, Q_a)
    pb = attention_coefficients(V_b, Q_b)
    if pa.shape != pb.shape:
        return False
    diff = np.linalg.norm(pa - pb)
    return bool(diff <= atol + rtol * max(np.linalg.norm(pa), np.linalg.norm(pb)))
