"""Multi-head linear attention as a function: forward pass, generation, p(Theta), equivalence.

``y = sum_h V_h sum_t x_t (x_t^T Q_h x_last)`` with ``V`` (n_heads, d_out, d) and ``Q``
(n_heads, d, d); see the user guide's :doc:`/theory` page.
"""

import numpy as np
from scipy.signal import lfilter

from ._features import fold_coefficients, n_attention_features
from ._memory import (
    default_memory_budget,
    sample_chunks,
    real_tokens,
    single_blas_thread,
    zero_padding,
)
from ._units import (
    SAFE_EXPONENT,
    column_abs_max,
    exponent,
    forward_heads,
    pow2_scale,
    restore_scale,
    scale_per_sample,
)
from ._validation import as_real_array, check_heads, check_lengths, check_readout, check_sequences
from ._params import check_decays, check_head_decays, check_number

__all__ = [
    "attention_coefficients",
    "forward_checked",
    "mhla_forward",
    "mhla_generate",
    "same_function",
]

def mhla_forward(X, V, Q, lengths=None, *, readout="last", decays=None):
    """Output of a one-layer multi-head linear attention.

    ``y_r = sum_h V_h S_r^(h) Q_h x_r`` with ``S_r^(h) = sum_(t <= r)
    decays[h]**(r - t) x_t x_t^T``, at the last real token or at every real
    position.  Any output that float64 can represent is computed to rounding
    accuracy, whatever the scale of X or of the heads (:ref:`theory-forward-pass`).

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; without ``lengths``, trailing all-NaN tokens are padding.
    V : array-like of shape (n_heads, d_out, d)
        Value matrices.
    Q : array-like of shape (n_heads, d, d)
        Fused key-query matrices.
    lengths : array-like of int, shape (n_samples,), or None, default=None
        Number of real tokens per sequence: tokens at positions ``>=
        lengths[i]`` are ignored whatever they hold.  None reads the lengths
        from the NaN padding.
    readout : {"last", "all"}, default="last"
        ``"last"``: the output at the last real token.  ``"all"``: the causal
        output at every position.
    decays : None, float or array-like of shape (n_heads,), default=None
        Fixed decay of each head in (0, 1] (retention): head h weighs the token
        k positions back by ``decays[h]**k``, padding not counted.  A float is
        every head's decay; None (or 1) is no decay.

    Returns
    -------
    y : ndarray
        Shape (n_samples, d_out) for ``"last"``; (n_samples, n_tokens, d_out)
        for ``"all"``, NaN at padded positions.

    Raises
    ------
    ValueError
        When V or Q is not finite or complex, when ``decays`` has the wrong
        shape or a value outside (0, 1], or when an output exceeds the
        float64 range (the message names the sample).
    TypeError
        When V, Q or ``decays`` does not hold numbers.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward
    >>> X = np.array([[[1.0, 0.0], [0.0, 2.0]]])
    >>> V = np.eye(2)[None]
    >>> Q = np.eye(2)[None]
    >>> mhla_forward(X, V, Q)
    array([[0., 8.]])

    Scaling X by c scales the outputs by c**3, even where c**3 alone
    overflows (here c**3 = 2**1200, compensated by the heads):

    >>> mhla_forward(2.0**400 * X, 2.0**-900 * V, 2.0**-300 * Q)
    array([[0., 8.]])

    With a decay of 0.5 the token one step before the last one counts half:

    >>> Z = np.array([[[1.0, 0.0], [1.0, 1.0]]])
    >>> mhla_forward(Z, V, Q)
    array([[3., 2.]])
    >>> mhla_forward(Z, V, Q, decays=0.5)
    array([[2.5, 2. ]])
    >>> mhla_forward(Z, V, Q, readout="all", decays=[0.5])
    array([[[1. , 0. ],
            [2.5, 2. ]]])
    """
    V, Q = check_heads(V, Q)
    check_readout(readout)
    decays = check_head_decays(decays, V.shape[0])
    if lengths is None:
        X, lengths = check_sequences(X, n_features_in=V.shape[2])
    else:
        X, lengths = check_lengths(X, lengths, n_features_in=V.shape[2])
    return forward_checked(X, V, Q, lengths, readout, decays)


def forward_checked(X, V, Q, lengths, readout, decays):
    """:func:`mhla_forward` on checked arrays (X zero-padded, ``decays`` None or per head)."""
    if decays is not None and np.all(decays == 1.0):
        decays = None  # no decay: the plain path, bit for bit
    n_samples, n_tokens, d = X.shape
    n_heads, d_out = V.shape[:2]
    # Exact power-of-two rescaling: y(2**e X) = 2**(3e) y(X), and heads
    # rescaled (forward_heads), so that no product over- or underflows on
    # the way to an output that float64 can hold.
    V_given, Q_given = V, Q
    V, Q, head_shift = forward_heads(V, Q)
    if readout == "last":
        out = np.empty((n_samples, d_out))
        per_sample = n_tokens * (d + n_heads)
    else:
        out = np.empty((n_samples, n_tokens, d_out))
        # Running d x d moments, or the masked n_tokens x n_tokens scores per head.
        per_sample = n_tokens * min(d * d, n_heads * n_tokens) + n_tokens * n_heads * d
    for sl in sample_chunks(n_samples, per_sample):
        Xc, Vc, Qc, shift = X[sl], V, Q, head_shift
        # Padding is zero here, so the scales are those of the real tokens.
        col = column_abs_max(Xc.reshape(-1, d))
        units = np.where(col > 0, exponent(col), 0)
        if units.max(initial=0) - units.min(initial=0) > SAFE_EXPONENT:
            # Coordinates in very different units: each one scaled to its own
            # power of two, the heads in those units (one scale for the
            # sequence could not keep every product inside float64).
            Xc = pow2_scale(np.asarray(Xc, dtype=np.float64), -units)
            Vc, Qc, shift = forward_heads(V_given, Q_given, units[None, :],
                                          units[:, None] + units[None, :])
        Xc, e = scale_per_sample(Xc, safe=SAFE_EXPONENT)
        if readout == "last":
            y = _forward_last(Xc, Vc, Qc, lengths[sl], decays)
        else:
            y = _forward_all(Xc, Vc, Qc, lengths[sl], decays)
        out[sl] = restore_scale(y, 3 * e + shift, sl.start)
    return out


def _decay_groups(decays):
    """The distinct decays and, for each, the indices of its heads."""
    values, inverse = np.unique(decays, return_inverse=True)
    return [(float(g), np.flatnonzero(inverse == i)) for i, g in enumerate(values)]


def _decay_weights(decays, lags):
    """``decays**lags`` for lags >= 0 and 0 for negative lags, shape ``decays.shape + lags.shape``.

    Negative lags are clipped before the power: ``gamma**-k`` could overflow, and inf * 0 is NaN.
    """
    decays = np.asarray(decays, dtype=np.float64)
    shape = decays.shape + (1,) * lags.ndim
    # A tiny gamma**k underflows to zero: that token's weight is below
    # 2**-1074 of the weight 1 of the readout's own token.
    with np.errstate(under="ignore"):
        w = np.power(decays.reshape(shape), np.maximum(lags, 0))
    return w * (lags >= 0)


def _forward_last(X, V, Q, lengths, decays=None):
    x_last = X[np.arange(X.shape[0]), lengths - 1]
    q = np.einsum("hkl,nl->nhk", Q, x_last)
    scores = np.matmul(q, X.transpose(0, 2, 1))  # (n, h, t): x_t^T Q_h x_last
    if decays is not None:
        # Token t of sequence n is lengths[n] - 1 - t steps before its last one.
        lags = lengths[:, None] - 1 - np.arange(X.shape[1])[None, :]
        scores *= _decay_weights(decays, lags).transpose(1, 0, 2)  # (n, h, t)
    ctx = np.matmul(scores, X)  # (n, h, d): sum_t x_t score_t
    return np.einsum("haj,nhj->na", V, ctx)


def _forward_all(X, V, Q, lengths, decays=None):
    n_samples, n_tokens, d = X.shape
    q = np.einsum("hkl,ntl->nhtk", Q, X)  # Q_h x_t
    if d * d <= Q.shape[0] * n_tokens:
        # y_t = sum_h V_h S_t Q_h x_t with S_t the running second moment.
        if decays is None:
            S = np.cumsum(X[:, :, :, None] * X[:, :, None, :], axis=1)
            # Batched GEMM (S_t is symmetric): ctx[n, h, t] = S[n, t] @ q[n, h, t].
            ctx = np.matmul(q.transpose(0, 2, 1, 3), S).transpose(0, 2, 1, 3)
        else:
            outer = X[:, :, :, None] * X[:, :, None, :]
            ctx = np.empty_like(q)
            for gamma, heads in _decay_groups(decays):
                # S_t = gamma S_(t-1) + x_t x_t^T along the tokens: a first-order
                # recursive filter, run in C.  Padded tokens are zero; the
                # positions after them are NaN in the output.
                S = (np.cumsum(outer, axis=1) if gamma == 1.0
                     else lfilter([1.0], [1.0, -gamma], outer, axis=1))
                ctx[:, heads] = np.matmul(q[:, heads].transpose(0, 2, 1, 3),
                                          S).transpose(0, 2, 1, 3)
    else:
        # Causal scores x_s^T Q_h x_t for s <= t, then their weighted sum of x_s.
        scores = np.matmul(q, X.transpose(0, 2, 1)[:, None])  # (n, h, t, s)
        if decays is None:
            scores *= np.tril(np.ones((n_tokens, n_tokens)))
        else:
            # gamma_h**(t - s) for s <= t, 0 above the diagonal.
            positions = np.arange(n_tokens)
            scores *= _decay_weights(decays, positions[:, None] - positions[None, :])
        ctx = np.matmul(scores, X[:, None])  # (n, h, t, d)
    y = np.einsum("haj,nhtj->nta", V, ctx)
    y[~real_tokens(lengths, n_tokens)] = np.nan
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


def mhla_generate(X, V, Q, n_steps, *, rounding=None, lengths=None, intercept=None,
                  skip_coef=None, decays=None):
    """Run a linear-attention model autoregressively for ``n_steps`` tokens.

    At each step the output at the last token (that of :func:`mhla_forward`,
    plus the optional intercept and skip terms) is optionally rounded to a
    token and appended; every sequence grows at its own end.  A step costs
    O(n_heads d^2) per sequence whatever the length (:ref:`theory-generation`).

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
        None appends the raw outputs.  An embedding table appends the nearest
        of its rows (Euclidean; ties go to the first row).  A callable maps the
        outputs (m, d) to the tokens to append, same shape.
    lengths : array-like of int, shape (n_samples,), or None, default=None
        Number of real tokens per prompt when X has no NaN padding; None reads
        them from the padding.
    intercept : array-like of shape (d,) or None, default=None
        A constant added to every output (as ``intercept_``).
    skip_coef : array-like of shape (d, d) or None, default=None
        ``skip_coef @ x_last`` is added to every output (as ``skip_coef_``).
    decays : None, float or array-like of shape (n_heads,), default=None
        Fixed decay of each head in (0, 1], as in :func:`mhla_forward`; a
        float is every head's decay, None (or 1) is no decay.

    Returns
    -------
    sequences : ndarray of shape (n_samples, max(lengths) + n_steps, d)
        Prompt ``i`` followed by its ``n_steps`` generated tokens at
        positions ``lengths[i] .. lengths[i] + n_steps - 1``; NaN after.

    Raises
    ------
    ValueError
        When V or Q is not finite or complex; when ``decays`` is invalid; when
        the output would not fit in the memory budget (half the physical
        memory); when a generated value exceeds the float64 range.
    TypeError
        When V, Q or ``decays`` does not hold numbers.

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

    With one scalar token and ``V = Q = 1`` each output is ``S x_last``; a
    decay of 0.5 halves the weight of the past at every step:

    >>> one = np.ones((1, 1, 1))
    >>> mhla_generate(one, one, one, 3).ravel()
    array([ 1.,  1.,  2., 12.])
    >>> mhla_generate(one, one, one, 3, decays=0.5).ravel()
    array([1. , 1. , 1.5, 4.5])
    """
    V, Q = check_heads(V, Q)
    d = Q.shape[1]
    if V.shape[1] != d:
        raise ValueError(
            "mhla_generate appends each output to its sequence, so V must have shape "
            f"(n_heads, d, d) with d_out = d = {d}; got V of shape {V.shape}."
        )
    decays = check_head_decays(decays, V.shape[0])
    if decays is not None and np.all(decays == 1.0):
        decays = None  # no decay: the plain path, bit for bit
    n_steps = check_number(n_steps, "n_steps", integer=True, low=0)
    if lengths is None:
        X, lengths = check_sequences(X, n_features_in=d)
    else:
        X, lengths = check_lengths(X, lengths, n_features_in=d)
    round_ = _check_rounding(rounding, d)
    terms = [as_real_array(np.zeros(shape) if value is None else value, name, finite=True)
             for value, name, shape in ((intercept, "intercept", (d,)),
                                        (skip_coef, "skip_coef", (d, d)))]
    for value, name, shape in zip(terms, ("intercept", "skip_coef"), ((d,), (d, d))):
        if value.shape != shape:
            raise ValueError(f"{name} must have shape {shape} for tokens of d = {d}; got "
                             f"shape {value.shape}.")
    n_samples, n_tokens = X.shape[:2]
    _check_generate_memory(n_samples, n_tokens, d, n_steps)
    out = np.full((n_samples, n_tokens + n_steps, d), np.nan)
    real = real_tokens(lengths, n_tokens)
    out[:, :n_tokens][real] = X[real]
    n_heads = V.shape[0]
    # (h*d, d) stacks of the heads, so that one GEMM serves all heads.
    Q_flat = Q.reshape(n_heads * d, d)
    V_flat = V.transpose(0, 2, 1).reshape(n_heads * d, d)
    # One BLAS thread: the batched q @ S is one small GEMM per sequence, which
    # threads only slow down (36 times, for 96 sequences, 321 heads, d = 44).
    with single_blas_thread():
        _generate_into(out, X, lengths, Q_flat, V_flat, n_heads, d, n_steps, round_, terms,
                       decays)
    return out


def _check_generate_memory(n_samples, n_tokens, d, n_steps):
    """Refuse, before allocating it, an output larger than the memory budget."""
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


def _decayed_moments(X, lengths, gamma):
    """``sum_t gamma**(lengths - 1 - t) x_t x_t^T`` of each zero-padded sequence, (n, d, d)."""
    if gamma == 1.0:
        return np.matmul(X.transpose(0, 2, 1), X)
    lags = lengths[:, None] - 1 - np.arange(X.shape[1])[None, :]
    w = _decay_weights(gamma, lags)  # 0 at the padding
    return np.matmul((X * w[:, :, None]).transpose(0, 2, 1), X)


def _generate_into(out, X, lengths, Q_flat, V_flat, n_heads, d, n_steps, round_, terms,
                   decays=None):
    intercept, skip = terms
    with_terms = bool(intercept.any() or skip.any())
    n_samples = X.shape[0]
    # One running moment per distinct decay, shared by its heads.
    groups = [(1.0, np.arange(n_heads))] if decays is None else _decay_groups(decays)
    for sl in sample_chunks(n_samples, len(groups) * d * d + n_heads * d):
        Xc = zero_padding(np.asarray(X[sl], dtype=np.float64), lengths[sl])
        moments = [_decayed_moments(Xc, lengths[sl], gamma) for gamma, _ in groups]
        rows = np.arange(Xc.shape[0])
        pos = lengths[sl].copy()
        x = Xc[rows, pos - 1]
        for step in range(n_steps):
            with np.errstate(over="ignore", invalid="ignore"):
                q = (x @ Q_flat.T).reshape(len(x), n_heads, d)  # Q_h x_last
                if len(groups) == 1:
                    ctx = np.matmul(q, moments[0])  # (S Q_h x_last)^T, S symmetric
                else:
                    ctx = np.empty_like(q)
                    for (_, heads), S in zip(groups, moments):
                        ctx[:, heads] = np.matmul(q[:, heads], S)
                y = ctx.reshape(len(x), n_heads * d) @ V_flat
                if with_terms:
                    y += intercept + x @ skip.T
            # Overflow turns into inf or NaN; appending it would poison every
            # later token, so stop at the first one.
            _check_generated(y, step, n_steps, sl.start, "output")
            x = y if round_ is None else round_(y)
            if round_ is not None:
                _check_generated(x, step, n_steps, sl.start, "rounded token")
            out[sl][rows, pos] = x
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                outer = x[:, :, None] * x[:, None, :]
                for (gamma, _), S in zip(groups, moments):
                    if gamma != 1.0:
                        S *= gamma
                    S += outer
            pos += 1


class DecayBlocks(tuple):
    """Distinct decays of feature blocks, and which blocks some model reads together.

    A tuple of float (one feature block per decay); ``groups`` partitions the
    block indices so that every model's blocks lie in one group: the
    statistics of blocks of two groups (their cross Gram blocks) are never
    read, so a pass over the data need not gather them.
    """

    def __new__(cls, decays, groups=None):
        self = super().__new__(cls, decays)
        self.groups = ((tuple(range(len(self))),) if groups is None
                       else tuple(tuple(int(b) for b in g) for g in groups))
        return self

    def __getnewargs__(self):
        return tuple(self), self.groups


def decay_blocks(*head_decays):
    """The distinct decays of models' checked per-head decays, in order of first appearance.

    A tuple of float (a :class:`DecayBlocks`); None is a model without decays
    (decay 1); empty when no model has a head.  Its ``groups`` join the blocks
    of each model (connected components, each in block order): blocks of two
    groups are never read together.

    Examples
    --------
    >>> from sklearn_linattn._attention import decay_blocks
    >>> blocks = decay_blocks(None, (0.9, 1.0), 0.5)
    >>> blocks, blocks.groups
    ((1.0, 0.9, 0.5), ((0, 1), (2,)))
    """
    models = [(1.0,) if decays is None else tuple(map(float, np.atleast_1d(decays)))
              for decays in head_decays]
    blocks = tuple(dict.fromkeys(g for decays in models for g in decays))
    index = {g: b for b, g in enumerate(blocks)}
    groups = []
    for decays in models:  # a model's blocks join every group they meet
        joined = {index[g] for g in decays}
        met = [group for group in groups if group & joined]
        groups = [group for group in groups if not group & joined] + [joined.union(*met)]
    return DecayBlocks(blocks, sorted(tuple(sorted(group)) for group in groups))


def attention_coefficients(V, Q, *, decays=None, blocks=None):
    """The coefficient map p(Theta): folded coefficients of an MHLA.

    For every input, output ``a`` of the heads is the inner product of
    ``coef[a]`` with the cubic features of the input (:doc:`/theory`); with
    decays, in blocks of psi, one per decay of ``blocks``, as the features of
    ``LinearAttentionRegressor(decay=blocks)``.

    Parameters
    ----------
    V : array-like of shape (n_heads, d_out, d)
        Value matrices; real and finite.
    Q : array-like of shape (n_heads, d, d)
        Key-query matrices; real and finite.
    decays : None, float or array-like of shape (n_heads,), default=None
        Fixed decay of each head in (0, 1], as in :func:`mhla_forward`; a
        float is every head's decay, None is no decay (decay 1).
    blocks : None, float or array-like of float, default=None
        Distinct decays of the blocks, in order; every head's decay must be
        among them, and a block no head has is zero.  None: one block without
        ``decays``, else the heads' distinct decays in order of first appearance.

    Returns
    -------
    coef : ndarray of shape (d_out, psi) or (d_out, len(blocks) * psi)
        ``psi = d * d * (d + 1) // 2``; block b (columns ``b * psi`` on) is the
        sum of the coefficients of the heads of decay ``blocks[b]``.

    Raises
    ------
    ValueError
        When V or Q has the wrong shape, is complex or not finite; when
        ``decays`` or ``blocks`` is invalid (``blocks`` empty, repeated or
        outside (0, 1]), or a head's decay is not among ``blocks``; when the
        coefficients exceed the float64 range.
    TypeError
        When V, Q, ``decays`` or ``blocks`` does not hold numbers.

    See Also
    --------
    same_function : Whether two parameter sets, with their decays, compute
        the same function.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import attention_coefficients
    >>> attention_coefficients(np.ones((1, 1, 1)), 2 * np.ones((1, 1, 1)))
    array([[2.]])

    With decays, one block per decay; heads of equal decays add up, and a
    block no head has is zero:

    >>> V, Q = np.ones((3, 1, 1)), np.array([1.0, 2.0, 4.0]).reshape(3, 1, 1)
    >>> attention_coefficients(V, Q, decays=[0.5, 1.0, 0.5])
    array([[5., 2.]])
    >>> attention_coefficients(V, Q, decays=[0.5, 1.0, 0.5], blocks=[1.0, 0.9, 0.5])
    array([[2., 0., 5.]])
    """
    V, Q = check_heads(V, Q)
    n_heads, d_out, d = V.shape
    head_decays = check_head_decays(decays, n_heads)
    if blocks is not None:
        blocks = check_decays(blocks, "blocks")
        given = ("decays=None (no decay: decay 1 for every head)" if head_decays is None
                 else f"decays={head_decays.tolist()!r}")
        if head_decays is None:
            head_decays = np.ones(n_heads)  # no decay is decay 1, as in mhla_forward
        outside = ~np.isin(head_decays, blocks)
        if outside.any():
            h = int(np.flatnonzero(outside)[0])
            raise ValueError(
                f"every head's decay must be among blocks={list(blocks)!r}, one block of "
                f"coefficients per decay; decays[{h}] = {float(head_decays[h])!r} is not "
                f"({given}).")
    elif head_decays is not None:
        blocks = decay_blocks(head_decays)
        if not blocks:
            raise ValueError(
                "blocks must be given for a model with no heads (its decays give no "
                f"block); got decays={head_decays.tolist()!r} and blocks=None.")
    with np.errstate(over="ignore", invalid="ignore"):
        if blocks is None:
            coef = fold_coefficients(np.einsum("haj,hkl->ajkl", V, Q))
        else:
            psi = n_attention_features(d)
            coef = np.zeros((d_out, len(blocks) * psi))
            for b, gamma in enumerate(blocks):
                heads = head_decays == gamma
                coef[:, b * psi:(b + 1) * psi] = fold_coefficients(
                    np.einsum("haj,hkl->ajkl", V[heads], Q[heads]))
    if not np.all(np.isfinite(coef)):
        raise ValueError(
            "the coefficients of these heads exceed the float64 range: sums of products "
            f"V[h, a, j] * Q[h, k, l] overflow (largest |V| {np.max(np.abs(V)):.3g}, "
            f"largest |Q| {np.max(np.abs(Q)):.3g}). Rescale the heads."
        )
    return coef


def same_function(V_a, Q_a, V_b, Q_b, *, rtol=1e-9, atol=0.0, decays_a=None, decays_b=None):
    """Whether two parameter sets compute the same function on every input.

    Two MHLAs are the same function iff their coefficients p(Theta) are equal
    (the paper's Corollary A.4); the head counts need not match.  With fixed
    decays the coefficients are compared block by block, one block per decay
    of either model (:ref:`theory-decays`).

    Parameters
    ----------
    V_a, Q_a : array-like of shape (n_heads_a, d_out, d) and (n_heads_a, d, d)
        The first model's heads; real and finite.
    V_b, Q_b : array-like of shape (n_heads_b, d_out, d) and (n_heads_b, d, d)
        The second model's heads.
    rtol, atol : float
        ``||p_a - p_b|| <= atol + rtol * max(||p_a||, ||p_b||)`` counts as equal.
    decays_a, decays_b : None, float or array-like of shape (n_heads_a,) and (n_heads_b,)
        Fixed decay of each head of the first and of the second model, each
        in (0, 1], as in :func:`mhla_forward`; None is no decay (every head
        has decay 1).

    Returns
    -------
    bool
        True iff the coefficients p(Theta) of the two models agree within
        the tolerance, i.e. their outputs agree on every input.

    Raises
    ------
    ValueError
        When the heads are invalid (as :func:`attention_coefficients`), when
        ``decays_a`` or ``decays_b`` has the wrong shape or a value outside
        (0, 1], or ``rtol`` or ``atol`` is negative.
    TypeError
        When an argument does not hold numbers.

    See Also
    --------
    attention_coefficients : The coefficients compared.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import same_function
    >>> V, Q = np.ones((1, 1, 2)), np.eye(2)[None]
    >>> same_function(V, Q, 2 * V, Q / 2)
    True

    With decays, heads of the same decay may be split or merged, but a head
    of another decay is another function:

    >>> V2, Q2 = np.concatenate([V, V]), np.concatenate([Q, Q]) / 2
    >>> same_function(V, Q, V2, Q2, decays_a=0.5, decays_b=[0.5, 0.5])
    True
    >>> same_function(V, Q, V2, Q2, decays_a=0.5, decays_b=[0.5, 0.9])
    False
    """
    rtol = check_number(rtol, "rtol", low=0.0)
    atol = check_number(atol, "atol", low=0.0)
    V_a, Q_a = check_heads(V_a, Q_a)
    V_b, Q_b = check_heads(V_b, Q_b)
    decays_a = check_head_decays(decays_a, V_a.shape[0], name="decays_a")
    decays_b = check_head_decays(decays_b, V_b.shape[0], name="decays_b")
    if decays_a is None and decays_b is None:
        pa = attention_coefficients(V_a, Q_a)
        pb = attention_coefficients(V_b, Q_b)
    else:
        # One layout for both: a block per decay of either model (a model
        # without heads has none; any block then does).
        blocks = decay_blocks(decays_a, decays_b) or (1.0,)
        pa = attention_coefficients(V_a, Q_a, decays=decays_a, blocks=blocks)
        pb = attention_coefficients(V_b, Q_b, decays=decays_b, blocks=blocks)
    if pa.shape != pb.shape:
        return False
    diff = np.linalg.norm(pa - pb)
    return bool(diff <= atol + rtol * max(np.linalg.norm(pa), np.linalg.norm(pb)))
