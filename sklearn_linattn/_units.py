"""The data's units and the standardized coordinates: exact scales, and the maps back.

Everything a fit computes is in standardized coordinates
(:mod:`._standardize`); this module holds what turns its results into the
data's own units (coefficients, heads, outputs, inputs) and back, by exact
powers of two and the whitening, and refuses a number that float64 cannot
hold in those units instead of returning ``inf``.
"""

import numpy as np
import scipy.linalg

from ._features import fold_coefficients, pair_indices, unfold_coefficients

__all__ = ["UnitMaps", "max_exponent"]


def exponent(values):
    """Integer e with ``2**e <= |v| < 2**(e + 1)`` elementwise (0 where v == 0)."""
    mantissa, exp = np.frexp(np.asarray(values, dtype=np.float64))
    return np.where(mantissa == 0, 0, exp - 1).astype(np.int64)


def max_exponent(a, axis=None):
    """Binary exponent e with ``max|a| = m * 2**e``, 0.5 <= m < 1 (0 for zeros)."""
    return np.frexp(np.max(np.abs(a), axis=axis, initial=0.0))[1]


def ldexp(x, e):
    """``np.ldexp`` whose overflow to inf is reported by :func:`check_finite`, not warned."""
    with np.errstate(over="ignore"):
        return np.ldexp(x, e)


def check_finite(values, what):
    """Raise if scaling back overflowed (NaN, e.g. at padded positions, passes)."""
    if np.isinf(values).any():
        raise ValueError(
            f"{what} cannot be represented in float64 (they overflow): the data span "
            "more orders of magnitude than float64 holds; rescale X or y."
        )
    return values


def column_abs_max(A):
    """``np.abs(A).max(axis=0)`` of a 2-D array, fast for few columns.

    A reduction over the rows of an (m, d) array with small d runs d lanes
    wide; grouping k rows into one row of k * d values makes it k times wider.
    """
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


def pow2_scale(X, e):
    """``X * 2**e`` per last axis, exactly (a product by exact powers of two)."""
    e = np.asarray(e)
    if np.abs(e).max(initial=0) < 1000:  # 2**e is a normal float64: multiply
        return X * np.ldexp(1.0, e)
    return np.ldexp(X, e)


class UnitMaps:
    """The maps between standardized coordinates and the data's units.

    A base of :class:`~._standardize.TokenStandardizer`, which sets
    ``exponents``, ``whitening``, ``y_exponents``, ``d`` and the embedding
    (``folded``, ``from_folded``, ``pair_weights``) these maps use.
    """

    def outputs_to_user(self, Y, sample_exponents=None):
        """Outputs (n, ..., d_out) of a model fitted on standardized targets, in the user's units.

        ``sample_exponents`` (n,): outputs computed on sequences scaled by
        powers of two, ``Y[i] * 2**sample_exponents[i]`` in standardized
        units; applied with the targets' exponents in one exact step, so that
        an output float64 holds in the user's units is never lost to an
        intermediate overflow or underflow.
        """
        Y = np.asarray(Y, dtype=np.float64)
        shift = np.zeros(Y.shape[-1:], dtype=np.int64) if self.y_exponents is None else (
            self.y_exponents)
        if sample_exponents is not None:
            shift = shift + np.asarray(sample_exponents, dtype=np.int64).reshape(
                (-1,) + (1,) * (Y.ndim - 1))
        if not np.any(shift):
            return Y
        return check_finite(ldexp(Y, shift), "The outputs")


    def _feature_exponents(self):
        """Exponent of each folded feature ``S[j, k] * x[l]``: e_j + e_k + e_l, shape (n_moments, d).

        The same in every feature block (a decay does not change units).
        """
        j, k = pair_indices(self.d)
        e = self.exponents
        return np.tile((e[j] + e[k])[:, None] + e[None, :], (getattr(self, "n_blocks", 1), 1))

    def _blockwise(self, coef, map_block):
        """``map_block`` applied to each feature block of coefficients (d_out, n_features)."""
        n_blocks = getattr(self, "n_blocks", 1)
        if n_blocks == 1:
            return map_block(coef)
        return np.concatenate([map_block(c) for c in np.split(coef, n_blocks, axis=1)], axis=1)

    def _apply_token_map(self, C, M):
        """``C x_1 M x_2 M x_3 M`` of unfolded coefficients C (d_out, d, d, d)."""
        C = np.tensordot(C, M, axes=([1], [1]))  # (a, k, l, j)
        C = np.tensordot(C, M, axes=([1], [1]))  # (a, l, j, k)
        C = np.tensordot(C, M, axes=([1], [1]))  # (a, j, k, l)
        return C

    def coef_to_user(self, coef, *, targets=True):
        """Folded coefficients on standardized data -> coefficients on the user's data.

        ``targets=False`` maps a direction (no target scaling), e.g. a null vector.
        """
        coef = np.asarray(coef, dtype=np.float64)
        if coef.ndim == 1:
            return self.coef_to_user(coef[None], targets=targets)[0]
        d, d_out = self.d, coef.shape[0]
        coef = self.folded(coef)
        if self.whitening is not None:
            coef = self._blockwise(coef, lambda c: fold_coefficients(
                self._apply_token_map(unfold_coefficients(c, d), self.whitening)))
        shift = -self._feature_exponents().reshape(1, -1)
        if targets and self.y_exponents is not None:
            shift = shift + self.y_exponents[:, None]
        if shift.any():
            coef = ldexp(coef.reshape(d_out, -1), shift)
        return check_finite(coef, "The coefficients on the data's own units")

    def coef_from_user(self, coef, *, targets=True):
        """Inverse of :meth:`coef_to_user`."""
        coef = np.asarray(coef, dtype=np.float64)
        if coef.ndim == 1:
            return self.coef_from_user(coef[None], targets=targets)[0]
        d_out = coef.shape[0]
        shift = self._feature_exponents().reshape(1, -1)
        if targets and self.y_exponents is not None:
            shift = shift - self.y_exponents[:, None]
        if shift.any():
            coef = ldexp(coef, shift)
        if self.whitening is not None:
            coef = self._blockwise(coef, lambda c: fold_coefficients(self._apply_token_map(
                unfold_coefficients(c, self.d), self.inverse_whitening)))
            coef = coef.reshape(d_out, -1, self.d) / self.pair_weights[:, None]
        return check_finite(coef.reshape(d_out, -1), "The standardized coefficients")

    @property
    def inverse_whitening(self):
        if self._inverse is None and self.whitening is not None:
            self._inverse = scipy.linalg.inv(self.whitening)
        return self._inverse

    def heads_to_user(self, V, Q):
        """Heads fitted on standardized data -> heads on the user's data (same function).

        ``V_h -> V_h W^T`` and ``Q_h -> W Q_h W^T``, then the exact scales:
        ``V[h, a, j] * 2**(ey_a - e_j)`` and ``Q[h, k, l] * 2**(-e_k - e_l)``,
        split per head (``V_h 2**-m``, ``Q_h 2**m`` is the same head) so that
        both stay representable.
        """
        V = np.asarray(V, dtype=np.float64)
        Q = np.asarray(Q, dtype=np.float64)
        if V.shape[0] == 0:
            return V.copy(), Q.copy()
        if self.whitening is not None:
            W = self.whitening
            V = V @ W.T
            Q = W @ Q @ W.T
        e = self.exponents
        ey = np.zeros(V.shape[1], dtype=np.int64) if self.y_exponents is None else self.y_exponents
        xv = ey[:, None] - e[None, :]  # (d_out, d)
        xq = -(e[:, None] + e[None, :])  # (d, d)
        if not (xv.any() or xq.any()):
            return V, Q
        # Largest exponent of each head's entries after scaling, to balance them.
        with np.errstate(divide="ignore"):
            lv = np.where(V != 0, np.log2(np.abs(V)) + xv, -np.inf).reshape(len(V), -1).max(1)
            lq = np.where(Q != 0, np.log2(np.abs(Q)) + xq, -np.inf).reshape(len(Q), -1).max(1)
        ok = np.isfinite(lv) & np.isfinite(lq)
        m = np.where(ok, np.floor((np.where(ok, lv, 0) - np.where(ok, lq, 0)) / 2), 0)
        m = m.astype(np.int64)
        V = ldexp(V, xv[None] - m[:, None, None])
        Q = ldexp(Q, xq[None] + m[:, None, None])
        check_finite(V, "The value matrices on the data's own units")
        check_finite(Q, "The key-query matrices on the data's own units")
        return V, Q

    def heads_from_user(self, V, Q):
        """Heads on the user's data -> heads on standardized data (inverse of :meth:`heads_to_user`)."""
        V = np.asarray(V, dtype=np.float64)
        Q = np.asarray(Q, dtype=np.float64)
        e = self.exponents
        ey = np.zeros(V.shape[1], dtype=np.int64) if self.y_exponents is None else self.y_exponents
        V = ldexp(V, (e[None, :] - ey[:, None])[None])
        Q = ldexp(Q, (e[:, None] + e[None, :])[None])
        if self.whitening is not None:
            Wi = self.inverse_whitening
            V = V @ Wi.T
            Q = Wi @ Q @ Wi.T
        check_finite(V, "The value matrices in standardized units")
        check_finite(Q, "The key-query matrices in standardized units")
        return V, Q

    def inputs_to_user(self, Z):
        """Standardized sequences -> the user's sequences (inverse of :meth:`transform`)."""
        Z = np.asarray(Z, dtype=np.float64)
        if self.whitening is not None:
            Z = Z @ self.inverse_whitening
        if self.exponents.any():
            Z = ldexp(Z, self.exponents)
        return check_finite(Z, "The sequence on the data's own units")
