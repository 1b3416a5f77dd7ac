"""The data of a few-head fit and of its local certificate, and the bilinear model on them.

One row r per sequence (readout ``"last"``) or per real position (``"all"``):
the second moment ``S_r`` of the tokens up to it, unfolded (d x d), the row's
token ``x_r``, its targets and the square root of its weight, in coordinates
scaled by powers of two (or already standardized by the package); the
model ``y_r = sum_h V_h S_r Q_h x_r`` on them and its designs and Jacobian.
"""

import numpy as np

from .._features import pair_indices
from .._memory import real_tokens, resolve_budget
from .._standardize import exponent, max_exponent
from .._validation import check_readout, check_sample_weight, check_sequences, check_targets

__all__ = ["BilinearData", "fit_heads_memory", "fit_heads_work"]

_EPS = np.finfo(np.float64).eps
# Largest feature matrix (entries) built for the minimum-norm start.
_MAX_START_ENTRIES = 2**24


class BilinearData:
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
        self.token_exp = exponent(rms)
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
        self.target_exp = exponent(rms_y)
        self.Y = np.ldexp(Yr, -self.target_exp)
        self.sqrt_w = np.sqrt(w)
        self.n_rows, self.d_out, self.d = Yr.shape[0], Yr.shape[1], d

    @classmethod
    def standardized(cls, rows, pair_weights):
        """Rows already in the package's standardized coordinates (:class:`~._moments.Rows`).

        The folded moments of the symmetric embedding are unfolded (the pairs
        j < k divided by their weight); nothing is scaled again.
        """
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
        self.token_exp = np.zeros(d, dtype=np.int64)
        self.target_exp = np.zeros(self.Y.shape[1], dtype=np.int64)
        self.n_rows, self.d_out, self.d = n, self.Y.shape[1], d
        return self

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


def _balance_pow2(V, Q):
    """Each head rescaled by a power of two so that its V and Q have similar size."""
    n_heads = V.shape[0]
    eV = max_exponent(V.reshape(n_heads, -1), axis=1)
    eQ = max_exponent(Q.reshape(n_heads, -1), axis=1)
    m = (eV - eQ) // 2
    return np.ldexp(V, -m[:, None, None]), np.ldexp(Q, m[:, None, None])


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


def _training_data(X, y, readout, sample_weight, heads_d=None):
    X, lengths, Y, w = _validated(X, y, readout, sample_weight, heads_d=heads_d)
    return BilinearData(X.astype(np.float64, copy=False), lengths, Y, readout, w)


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
