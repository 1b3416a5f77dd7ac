"""Rows of a few-head fit and its local certificate; the model y_r = sum_h V_h S_r Q_h x_r."""

import numpy as np

from .._features import pair_indices
from .._memory import real_tokens, resolve_budget, zero_padding
from .._units import NO_EXPONENT, rescale_heads
from .._validation import check_readout, check_sample_weight, check_sequences, check_targets

__all__ = ["BilinearData", "fit_heads_memory", "fit_heads_work"]

_EPS = np.finfo(np.float64).eps
# Largest feature matrix (entries) built for the minimum-norm start.
_MAX_START_ENTRIES = 2**24


class BilinearData:
    """Rows in standardized coordinates, one per sequence or real position: S_r, x_r, Y, sqrt(w).

    Mapped by ``standardizer``, or already standardized (:meth:`standardized`: no standardizer).
    """

    def __init__(self, X, lengths, Y, readout, weight, standardizer):
        n_samples, n_tokens, d = X.shape
        st = self.standardizer = standardizer
        Xs = st.transform(zero_padding(X, lengths))
        Yr, w = st.transform_targets(Y), st.transform_weights(weight)
        if readout == "last":
            self.S = np.matmul(Xs.transpose(0, 2, 1), Xs)
            self.x = Xs[np.arange(n_samples), lengths - 1]
        else:
            real = real_tokens(lengths, n_tokens)
            S = np.cumsum(Xs[:, :, :, None] * Xs[:, :, None, :], axis=1)
            self.S, self.x = S[real], Xs[real]
            Yr, w = Yr[real], np.broadcast_to(w[:, None], real.shape)[real]
        keep = w > 0
        self.S, self.x, self.Y, w = self.S[keep], self.x[keep], Yr[keep], w[keep]
        self.sqrt_w = np.sqrt(w)
        self.n_rows, self.d_out, self.d = self.Y.shape[0], self.Y.shape[1], d

    @classmethod
    def standardized(cls, rows, pair_weights):
        """Rows a fit standardized already (``FeatureRows``), their folded moments unfolded."""
        self = cls.__new__(cls)
        n, P = rows.S.shape
        d = rows.x.shape[1]
        j, k = pair_indices(d)
        folded = rows.S / pair_weights
        S = np.empty((n, d, d))
        S[:, j, k] = folded
        S[:, k, j] = folded
        w = np.ones(n) if rows.w is None else rows.w
        self.S, self.x = S, np.asarray(rows.x, dtype=np.float64)
        self.Y = np.asarray(rows.Y, dtype=np.float64)
        self.sqrt_w = np.sqrt(w)
        self.standardizer = None
        self.n_rows, self.d_out, self.d = n, self.Y.shape[1], d
        return self

    # -- heads between the data's units and these coordinates (exact) --------
    def to_standard(self, V, Q):
        """Heads in the data's units -> the same heads on these rows."""
        st = self.standardizer
        Vs, Qs, c = st.heads_from_user(V, Q, st.y_exponents)
        c = np.where(c != NO_EXPONENT, c, 0)
        return rescale_heads(Vs, Qs, mv=-(c // 2), mq=-(c - c // 2))

    def from_standard(self, V, Q):
        """Heads on these rows -> the same heads in the data's units."""
        return self.standardizer.heads_to_user(V, Q)

    def outputs_to_user(self, Y):
        """Outputs on these rows (..., d_out) in the data's units."""
        return self.standardizer.outputs_to_user(Y)

    # -- the model on these rows ---------------------------------------------
    def contexts(self, Q):
        """u[r, h] = S_r Q_h x_r, shape (R, n_heads, d)."""
        q = np.einsum("hkl,rl->rhk", Q, self.x)
        return np.matmul(q, self.S)  # S_r symmetric

    def predict(self, V, Q):
        return np.einsum("haj,rhj->ra", V, self.contexts(Q))

    def weighted_residual(self, V, Q):
        return (self.Y - self.predict(V, Q)) * self.sqrt_w[:, None]

    def output_map_of_values(self, Q):
        """Weighted design of the value step: (R, n_heads * d), columns (h, j)."""
        u = self.contexts(Q)
        return u.reshape(self.n_rows, -1) * self.sqrt_w[:, None]

    def output_map_of_key_queries(self, V):
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
        return np.hstack([JV, self.output_map_of_key_queries(V)])

    def features(self):
        """Weighted standardized feature rows (R, psi), or None when too large."""
        j, k = np.triu_indices(self.d)
        if self.n_rows * j.size * self.d > _MAX_START_ENTRIES:
            return None
        H = self.S[:, j, k][:, :, None] * self.x[:, None, :]
        return H.reshape(self.n_rows, -1) * self.sqrt_w[:, None]


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


def fit_heads_memory(n_rows, d, d_out, n_heads):
    """Bytes of the largest arrays ``fit_heads`` holds at once (its two Jacobians)."""
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
