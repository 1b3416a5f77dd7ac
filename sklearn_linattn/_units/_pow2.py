"""Exact scaling by powers of two: the package's only exponent arithmetic.

A product by ``2**e`` never rounds (unless it leaves float64's range), so data
of any magnitude can be brought near 1, computed on, and brought back without
losing a digit.  Everything here works on exponents: of values, of the
per-sequence moments, of heads, and of numbers carried as pairs ``m * 2**e``
where float64 alone would over- or underflow.
"""

import numpy as np

__all__ = ["NO_EXPONENT", "SAFE_EXPONENT", "check_finite", "column_abs_max", "exponent",
           "head_scales", "max_exponent", "pow2_scale", "rescale_heads", "restore_scale",
           "scale_per_sample", "sequence_moments", "unit_scaled"]

# Below every float64 exponent: marks a head (or a coordinate) with no non-zero entry.
NO_EXPONENT = -(2**40)
# Sequences whose largest entry is within 2**+-SAFE_EXPONENT need no rescaling
# before a cubic product: it stays within 2**+-600 (times coefficients or
# heads of moderate size), far from over- and underflow.
SAFE_EXPONENT = 200
# Per-sequence sums of squares within these bounds are computed from X itself
# (no scaled copy): their products and sums stay far inside float64.
_SAFE_MOMENT_LOW, _SAFE_MOMENT_HIGH = 2.0**-900, 2.0**900
# The smallest largest magnitude of a row of values: from there on every entry
# is exact to eps times it (subnormals are spaced 2**-1074 = eps * tiny).
_SMALLEST_ROW = float(np.finfo(np.float64).tiny)
# Binary exponents of the smallest normal float64 and of the first power of
# two that overflows: a reported value keeps its digits between them.
_TINY_EXPONENT, _HUGE_EXPONENT = -1022, 1024


def exponent(values):
    """Integer e with ``2**e <= |v| < 2**(e + 1)`` elementwise (0 where v == 0)."""
    mantissa, exp = np.frexp(np.asarray(values, dtype=np.float64))
    return np.where(mantissa == 0, 0, exp - 1).astype(np.int64)


def max_exponent(a, axis=None):
    """Binary exponent e with ``max|a| = m * 2**e``, 0.5 <= m < 1 (0 for zeros)."""
    return np.frexp(np.max(np.abs(a), axis=axis, initial=0.0))[1]


def unit_scaled(a, axis=None):
    """``(a * 2**-k, k)`` with the largest magnitude of the result in [0.5, 1) (k = 0 for
    zeros); with ``axis``, one k per slice along it (``k`` has the other axes' shape)."""
    a = np.asarray(a, dtype=np.float64)
    if axis is None:
        k = int(max_exponent(a))
        return pow2_scale(a, -k), k
    k = max_exponent(a, axis=axis)
    return pow2_scale(a, -np.expand_dims(k, axis)), k


def pow2_scale(X, e):
    """``X * 2**e`` (broadcast), exactly; an overflow gives inf, for :func:`check_finite`."""
    e = np.asarray(e)
    with np.errstate(over="ignore"):
        if np.abs(e).max(initial=0) < 1000:  # 2**e is a normal float64: multiply
            return X * np.ldexp(1.0, e)
        return np.ldexp(X, e)


def check_finite(values, what, *, before=None):
    """Raise if scaling back overflowed (NaN, e.g. at padded positions, passes).

    With ``before`` (the values before the scaling), also raise where a row
    (last axis) that was not zero came back below float64's normal range,
    where its digits are lost (or it is zero).
    """
    if np.isinf(values).any():
        raise ValueError(
            f"{what} cannot be represented in float64 (they overflow): the data span "
            "more orders of magnitude than float64 holds; rescale X or y."
        )
    if before is not None:
        was = np.max(np.abs(before), axis=-1, initial=0.0) > 0
        now = np.max(np.abs(values), axis=-1, initial=0.0)
        if np.any(was & (now < _SMALLEST_ROW)):
            raise ValueError(
                f"{what} cannot be represented in float64 (they underflow below "
                f"{_SMALLEST_ROW:.3g}, where digits are lost): the data span more orders of "
                "magnitude than float64 holds; rescale X or y."
            )
    return values


def column_abs_max(A):
    """``np.abs(A).max(axis=0)`` of a 2-D array, fast for few columns (rows grouped k at a time)."""
    m, d = A.shape
    k = max(1, 1024 // max(d, 1))
    head = (m // k) * k
    out = np.zeros(d)
    if head:
        B = A[:head].reshape(-1, k * d)
        out = np.maximum(B.max(axis=0), -B.min(axis=0)).reshape(k, d).max(axis=0)
    if head < m:
        out = np.maximum(out, np.abs(A[head:]).max(axis=0))
    return out


def scale_per_sample(X, safe=None):
    """Each sequence of X (n, t, d) scaled by a power of two into [1, 2): ``(X * 2**-f, f)``.

    Outputs cubic in a sequence scale by ``2**(3 f)``, exactly.  With ``safe``,
    a chunk whose every exponent is within ``+-safe`` is returned as it is
    (f = 0, no copy).  NaN entries (padding) are ignored.
    """
    X = np.asarray(X, dtype=np.float64)
    flat = X.reshape(X.shape[0], -1)
    with np.errstate(invalid="ignore"):
        peak = np.fmax(np.fmax.reduce(flat, axis=1, initial=0.0),
                       -np.fmin.reduce(flat, axis=1, initial=0.0))
    f = exponent(peak)
    if safe is not None and np.abs(f).max(initial=0) <= safe:
        return X, np.zeros_like(f)
    return pow2_scale(X, -f[:, None, None]), f


def restore_scale(y, exponents, start=0):
    """``y * 2**exponents`` per sample (axis 0); a ValueError naming the sample on overflow."""
    out = pow2_scale(y, np.asarray(exponents).reshape((-1,) + (1,) * (y.ndim - 1)))
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


def sequence_moments(X, *, check=False):
    """Per-sequence second moments ``S_i = sum_t x_t x_t^T`` of finite zero-padded X, overflow-free.

    Returns ``(S, e)``: the moments of the tokens scaled by ``2**-e`` (the true
    ones are ``S * 2**(e_j + e_k)``).  ``e`` is 0, and no copy of X is made,
    when every sequence's sum of squares of every coordinate lies within
    ``2**+-900``; otherwise each coordinate is first scaled by the power of two
    of its largest magnitude.  With ``check`` (X's values not checked yet),
    ``(None, None)`` when a sum of squares is not finite.
    """
    X = np.asarray(X)
    n, _, d = X.shape
    e = np.zeros(d, dtype=np.int64)
    if X.dtype != np.float64:
        X = X.astype(np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        S = np.matmul(X.transpose(0, 2, 1), X)
    diagonal = np.diagonal(S, axis1=1, axis2=2)
    if check and not np.isfinite(diagonal).all():
        return None, None
    peak = diagonal.max(axis=0, initial=0.0) if n else np.zeros(d)
    unsafe = ~((peak == 0) | ((peak >= _SAFE_MOMENT_LOW) & (peak <= _SAFE_MOMENT_HIGH)))
    if (peak == 0).any():
        # Zero sums of squares are zeros, or squares that underflowed.
        zero = np.flatnonzero(peak == 0)
        unsafe[zero] = column_abs_max(X[..., zero].reshape(-1, zero.size)) > 0
    if unsafe.any():
        col = column_abs_max(X.reshape(-1, d))
        e = np.where(col > 0, exponent(col), 0)
        Xs = pow2_scale(X, -e)
        S = np.matmul(Xs.transpose(0, 2, 1), Xs)
    return S, e


def moments_exponents(S, e):
    """Each coordinate's largest per-sequence root sum of squares, for moments S in units
    ``2**-(e_j + e_k)``: its exponent (``NO_EXPONENT`` if none) and its base-2 logarithm
    (``-inf`` if none)."""
    peak = np.diagonal(S, axis1=1, axis2=2).max(axis=0, initial=0.0) if S.shape[0] else (
        np.zeros(S.shape[-1]))
    with np.errstate(divide="ignore"):
        log2 = np.where(peak > 0, 0.5 * np.log2(peak) + e, -np.inf)
    return np.where(peak > 0, exponent(np.sqrt(peak)) + e, NO_EXPONENT), log2


# --- heads: V_h 2**-m and Q_h 2**m are the same head --------------------------


def _largest_exponents(A, shift):
    """Per head, the largest binary exponent of ``A[h] * 2**shift`` (``NO_EXPONENT`` if zero)."""
    mantissa, exp = np.frexp(A)
    exp = np.where(mantissa != 0, exp + shift[None], NO_EXPONENT)
    return exp.reshape(A.shape[0], int(np.prod(A.shape[1:]))).max(axis=1, initial=NO_EXPONENT)


def head_scales(V, Q, sv=0, sq=0):
    """Per head, the binary exponents ``(mv, mq)`` of the largest entries of ``V * 2**sv`` and
    ``Q * 2**sq`` (per-entry shifts, broadcast over heads), and which heads are live (both
    factors non-zero; the others' exponents are 0)."""
    sv = np.broadcast_to(np.asarray(sv, dtype=np.int64), V.shape[1:])
    sq = np.broadcast_to(np.asarray(sq, dtype=np.int64), Q.shape[1:])
    mv, mq = _largest_exponents(V, sv), _largest_exponents(Q, sq)
    live = (mv != NO_EXPONENT) & (mq != NO_EXPONENT)
    return np.where(live, mv, 0), np.where(live, mq, 0), live


def rescale_heads(V, Q, sv=0, sq=0, mv=0, mq=0, live=None):
    """``(V * 2**(sv - mv_h), Q * 2**(sq - mq_h))``, exactly: per-entry shifts sv, sq and per-head
    shifts mv, mq (arrays of one per head, or 0).  Heads not ``live`` come back zero (cleared
    before the scaling, which could overflow them)."""
    n = V.shape[0]
    mv = np.broadcast_to(np.asarray(mv, dtype=np.int64), (n,))[:, None, None]
    mq = np.broadcast_to(np.asarray(mq, dtype=np.int64), (n,))[:, None, None]
    if live is not None:
        V, Q = V * live[:, None, None], Q * live[:, None, None]
    return (pow2_scale(V, np.asarray(sv, dtype=np.int64)[None] - mv),
            pow2_scale(Q, np.asarray(sq, dtype=np.int64)[None] - mq))


def forward_heads(V, Q, sv=0, sq=0):
    """Heads for a forward pass, ``(V_w, Q_s, top)``: the outputs of the heads ``V * 2**sv,
    Q * 2**sq`` are those of ``(V_w, Q_s)`` times ``2**top``, every entry of V_w and Q_s at
    most 1 (heads far below the largest vanish, far below the outputs' rounding)."""
    mv, mq, live = head_scales(V, Q, sv, sq)
    c = mv + mq
    top = int(c[live].max()) if live.any() else 0
    # Head h weighted by 2**(c_h - top) <= 1 in V; clipped where it underflows anyway.
    return (*rescale_heads(V, Q, sv, sq, mv + np.minimum(top - c, 2 * _HUGE_EXPONENT), mq,
                           live), top)


# --- numbers as pairs m * 2**e, where float64 alone over- or underflows ---------


def pair_sum(values, exponents):
    """``sum_i values[i] * 2**exponents[i]`` as a pair ``(m, e)``: the sum is ``m * 2**e``.

    Every term is brought to the exponent of the largest, so nothing over- or
    underflows on the way.
    """
    mantissa, exp = np.frexp(np.asarray(values, dtype=np.float64))
    exp = exp.astype(np.int64) + np.asarray(exponents, dtype=np.int64)
    live = mantissa != 0
    if not live.any():
        return 0.0, 0
    top = int(exp[live].max())
    return float(np.sum(np.ldexp(mantissa[live], exp[live] - top))), top


def pair_sqrt(pair):
    """The square root of the pair ``m * 2**e`` (m >= 0), exactly scaled."""
    m, e = pair
    if e % 2:
        m, e = 2.0 * m, e - 1
    return float(np.sqrt(m)), e // 2


def column_exponents(A):
    """Per column (last axis), the exponent of the largest magnitude; ``NO_EXPONENT`` if zero."""
    top = np.max(np.abs(A.reshape(-1, A.shape[-1])), axis=0, initial=0.0)
    return np.where(top > 0, np.frexp(top)[1], NO_EXPONENT).astype(np.int64)


def mean_products(A, B, weights, total, exponents):
    """``(1/total) sum_rows w_row sum_a A[row, a] B[row, a] 2**exponents[a]`` as a pair.

    A and B are scaled per column by the power of two of their largest entry
    first, so no product over- or underflows on the way.
    """
    d_out = A.shape[-1]
    A, B, w = A.reshape(-1, d_out), B.reshape(-1, d_out), weights.reshape(-1)
    ka, kb = column_exponents(A), column_exponents(B)
    ka, kb = np.where(ka == NO_EXPONENT, 0, ka), np.where(kb == NO_EXPONENT, 0, kb)
    m = np.einsum("r,ra,ra->a", w, np.ldexp(A, -ka), np.ldexp(B, -kb)) / total
    return pair_sum(m, ka + kb + exponents)


def pair_norm(A, B=None):
    """Frobenius norm of A (or of ``A - B``) as a pair, scaled first: no over- or underflow."""
    both = A if B is None else np.concatenate([np.ravel(A), np.ravel(B)])
    k = int(max_exponent(both))
    diff = np.ldexp(A, -k) if B is None else np.ldexp(A, -k) - np.ldexp(B, -k)
    return float(np.linalg.norm(diff)), k


def pair_log10(pair):
    """``log10 |m * 2**e|`` of a pair."""
    m, e = pair
    return float(np.log10(abs(m)) + e * np.log10(2.0))


def pair_to_float(pair, scale):
    """The float64 of the pair ``m * 2**e``, or why float64 cannot hold it.

    ``scale`` (a pair) is the size of the terms the value is computed from: a
    value that overflows is lost; so is a non-zero value whose terms lie below
    the smallest normal float64.  A value that is small only because it
    cancels among larger terms is returned as float64 rounds it.  Returns
    ``(value, None)``, or ``(None, "over")`` / ``(None, "under")``.
    """
    m, e = pair
    if m != 0 and int(np.frexp(m)[1]) + e > _HUGE_EXPONENT:
        return None, "over"
    sm, se = scale
    if m != 0 and (sm == 0 or int(np.frexp(sm)[1]) + se - 1 < _TINY_EXPONENT):
        return None, "under"
    return float(np.ldexp(m, e)), None
