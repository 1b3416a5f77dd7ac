"""Standardized coordinates: the maps between the data's units and those the solvers use.

Every solver works on tokens scaled per coordinate by exact powers of two and
whitened (``x_std = W^T (2**-e x)``), targets and weights scaled by powers of
two.  :class:`MomentScales` gathers the scales from the per-sequence second
moments a fit forms anyway; :class:`TokenStandardizer` holds them, with every
map into these coordinates and back.  The user guide's theory page
("Standardized coordinates") gives the rules and what they guarantee.
"""

import numpy as np
import scipy.linalg

from .._features import fold_coefficients, pair_indices, unfold_coefficients
from .._spectrum import eigenvalue_tolerance
from ._pow2 import (
    NO_EXPONENT,
    check_finite,
    column_abs_max,
    exponent,
    head_scales,
    moments_exponents,
    pow2_scale,
    rescale_heads,
)
from ._tolerances import EPS32, EPS64, target_precision

__all__ = ["MomentScales", "TokenStandardizer", "feature_map", "map_is_accurate", "pair_map",
           "refined_whitening", "targets_map", "weight_factor", "whitening"]


class UnitMaps:
    """The maps between standardized coordinates and the data's units.

    A base of :class:`~._units.TokenStandardizer`, which sets
    ``exponents``, ``whitening``, ``y_exponents``, ``d`` and the embedding
    (``folded``, ``pair_weights``) these maps use.
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
        return check_finite(pow2_scale(Y, shift), "The outputs")


    def squared_errors_to_user(self, E):
        """Mean squared errors (..., d_out) on standardized targets in the units of y squared."""
        shift = 0 if self.y_exponents is None else 2 * self.y_exponents[:E.shape[-1]]
        return check_finite(pow2_scale(np.asarray(E, dtype=np.float64), shift),
                            "The mean squared errors in the units of y")

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
        before = coef.reshape(d_out, -1)
        coef = pow2_scale(before, shift) if shift.any() else before
        return check_finite(coef, "The coefficients on the data's own units", before=before)

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
            coef = pow2_scale(coef, shift)
        if self.whitening is not None:
            coef = self._blockwise(coef, lambda c: fold_coefficients(self._apply_token_map(
                unfold_coefficients(c, self.d), self.inverse_whitening)))
            coef = coef.reshape(d_out, -1, self.d) / self.pair_weights[:, None]
        return check_finite(coef.reshape(d_out, -1), "The standardized coefficients")

    def _output_exponents(self, d_out):
        # A certificate of inputs alone has no targets: its models are unscaled.
        ey = self.y_exponents
        return ey[:d_out] if ey is not None and ey.size >= d_out else np.zeros(d_out, np.int64)

    def terms_to_user(self, beta, terms, d_out, window_exponents=None):
        """Standardized term coefficients (n_columns, d_out) -> ``(intercept, skip, linear)``.

        In the data's units.  The skip columns are the standardized tokens
        ``x T`` (``T = diag(2**-e) W``), so ``skip = 2**ey (T beta)^T``, scaled
        after the product with W; the linear term's columns are targets
        (``window_exponents``, else the exponents ``ey`` after the outputs').
        Zero arrays for terms the model
        does not have: intercept (d_out,), skip (d_out, d); linear, shape
        (d_out, n_lags, d), is None without the linear term.
        """
        ey = self._output_exponents(d_out)
        intercept, skip, linear = np.zeros(d_out), np.zeros((d_out, self.d)), None
        what = "The intercept and skip coefficients in the data's units"
        m = terms.n_window
        if m:
            ew = (self.y_exponents[d_out:d_out + m] if window_exponents is None
                  else np.asarray(window_exponents))
            linear = check_finite(pow2_scale(beta[:m].T, ey[:, None] - ew[None, :]),
                                  "The linear term's coefficients in the data's units",
                                  before=beta[:m].T).reshape(d_out, terms.n_lags, self.d)
        if terms.intercept:
            intercept = check_finite(pow2_scale(beta[m], ey), what, before=beta[m][:, None])
        if terms.skip:
            b = beta[m + int(terms.intercept):]
            Wb = b if self.whitening is None else self.whitening @ b
            skip = check_finite(pow2_scale(Wb.T, ey[:, None] - self.exponents[None, :]), what,
                                before=Wb.T)
        return intercept, skip, linear

    def terms_from_user(self, intercept, skip, d_out):
        """Intercept (d_out,) and skip (d_out, d) terms in the data's units -> ``(b, M)``: on
        standardized tokens x_s the terms are ``b + x_s M^T`` in units of ``2**ey`` (either
        None when absent)."""
        ey = self._output_exponents(d_out)
        b = None if intercept is None else pow2_scale(np.asarray(intercept, float), -ey)
        M = None
        if skip is not None:
            # x W^T in the data's units is x_s (Wi 2**e W^T): per output 2**-ey_a.
            M = pow2_scale(np.asarray(skip, float), self.exponents[None, :] - ey[:, None])
            if self.whitening is not None:
                M = M @ self.inverse_whitening.T
        return b, M

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
        # Each head split evenly between its factors (V_h 2**-m, Q_h 2**m: the same head).
        mv, mq, _ = head_scales(V, Q, xv, xq)
        m = (mv - mq) // 2
        V, Q = rescale_heads(V, Q, xv, xq, m, -m)
        check_finite(V, "The value matrices on the data's own units")
        check_finite(Q, "The key-query matrices on the data's own units")
        return V, Q

    def heads_from_user(self, V, Q, y_exponents=None):
        """Heads in the data's units as heads on standardized tokens, per head ``2**c_h`` apart.

        Returns ``(V_s, Q_s, c)``: the function on standardized tokens (outputs
        in units of ``2**y_exponents``, or unscaled) has the heads ``2**c[h]
        V_s[h]`` and ``Q_s[h]``, the entries of V_s and Q_s at most 1 before the
        whitening; ``c[h]`` is ``NO_EXPONENT`` for a zero head (V_h or Q_h
        zero), which comes back zero.  Each entry is scaled by one power of two
        (the units of its coordinates and output, and its head's own), so
        nothing over- or underflows whatever the units or the heads' balance.
        """
        e = self.exponents
        ey = np.zeros(V.shape[1], dtype=np.int64) if y_exponents is None else y_exponents
        sv = e[None, :] - ey[:, None]  # V[h, a, j] * 2**(e_j - ey_a)
        sq = e[:, None] + e[None, :]  # Q[h, k, l] * 2**(e_k + e_l)
        mv, mq, live = head_scales(V, Q, sv, sq)
        Vs, Qs = rescale_heads(V, Q, sv, sq, mv, mq, live)
        if self.whitening is not None:
            Wi = self.inverse_whitening
            Vs, Qs = Vs @ Wi.T, Wi @ Qs @ Wi.T
        return Vs, Qs, np.where(live, mv + mq, NO_EXPONENT).astype(np.int64)

    def inputs_to_user(self, Z):
        """Standardized sequences -> the user's sequences (inverse of :meth:`transform`)."""
        Z = np.asarray(Z, dtype=np.float64)
        if self.whitening is not None:
            Z = Z @ self.inverse_whitening
        if self.exponents.any():
            Z = pow2_scale(Z, self.exponents)
        return check_finite(Z, "The sequence on the data's own units")


# Tokens with at most this fraction of non-zero entries are not whitened.
SPARSE_DENSITY = 0.25
# A direction of the token second moment counts as empty when its eigenvalue
# is below this many times the package's zero-eigenvalue rule.
_NULL_VARIANCE_MARGIN = 100.0
# Tokens whose correlation matrix has a condition number above this get their
# whitening refined on the standardized tokens (:func:`refined_whitening`).
_REFINE_CONDITION = 2.0**16
# Exponents relative to the largest coordinate round log2 ratios shifted by this:
# ratios of square roots of counts (one-hot tokens) never fall on a boundary.
_RELATIVE_OFFSET = 0.25


class TokenStandardizer(UnitMaps):
    """Exact power-of-two scales and a whitening map of the tokens.

    Parameters
    ----------
    exponents : array-like of int, shape (d,)
        ``X_scaled = X * 2**-exponents``.
    whitening : ndarray of shape (d, d) or None
        ``X_std = X_scaled @ whitening``; None is the identity.
    y_exponents : array-like of int, shape (d_out,), or None
        ``y_std = y * 2**-y_exponents``; None leaves targets unscaled.
    weight_exponent : int, default=0
        ``w_std = w * 2**-weight_exponent``.
    collinear : bool, default=False
        Whether the tokens are nearly collinear (their correlation matrix
        has a condition number above ``2**16``): their standardized moments
        are then computed from the standardized tokens, not by mapping the
        moments of the tokens (which would lose ``eps cond`` of the small
        directions).
    decays : tuple of float or None, default=None
        The fixed decays of the feature blocks (None: one block, no decay).
        The moments of a row are then the ``n_blocks`` decayed moments side by
        side (``n_moments = n_blocks * P`` columns), each mapped alike.
    target_precision : float, default=float64's eps
        The relative precision of the targets (float32's eps when they are
        all float32 values): what a fit on them can resolve.

    Attributes
    ----------
    d : int
        Token dimension.
    whitened : bool
        Whether ``whitening`` is a full matrix (False: diagonal scaling only).
    n_blocks : int
        Number of feature blocks (decays; 1 without).
    n_moments, n_features : int
        Columns of a row's moments (``n_blocks * P``) and of its features
        (``n_moments * d``).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._units import TokenStandardizer
    >>> st = TokenStandardizer([3, -2])
    >>> st.transform(np.array([[[8.0, 0.25]]]))
    array([[[1., 1.]]])
    """

    def __init__(self, exponents, whitening=None, y_exponents=None, weight_exponent=0,
                 collinear=False, decays=None, target_precision=EPS64):
        self.collinear = bool(collinear) and whitening is not None
        self.target_precision = float(target_precision)
        self.exponents = np.asarray(exponents, dtype=np.int64).reshape(-1)
        self.d = self.exponents.shape[0]
        self.decays = None if decays is None else tuple(float(g) for g in decays)
        self.n_blocks = 1 if self.decays is None else len(self.decays)
        j, k = pair_indices(self.d)
        # Weights of the folded moments in the feature rows: sqrt(2) for the
        # pairs j < k in the symmetric embedding (whitened coordinates).
        self.block_pair_weights = (np.where(j == k, 1.0, np.sqrt(2.0)) if whitening is not None
                                   else np.ones(j.size))
        self.pair_weights = np.tile(self.block_pair_weights, self.n_blocks)
        self.n_moments = self.n_blocks * j.size
        self.n_features = self.n_moments * self.d
        self.whitening = None if whitening is None else np.asarray(whitening, dtype=np.float64)
        self.y_exponents = (
            None if y_exponents is None else np.asarray(y_exponents, dtype=np.int64).reshape(-1)
        )
        self.weight_exponent = int(weight_exponent)
        self._inverse = None
        # diag(2**-e) W as one matrix, when its entries stay normal numbers.
        self._matrix = None
        if self.whitening is not None and np.abs(self.exponents).max(initial=0) < 900:
            self._matrix = pow2_scale(self.whitening, -self.exponents[:, None])

    @classmethod
    def identity(cls, d, d_out=None, decays=None):
        """The standardizer that changes nothing (for statistics built by hand)."""
        return cls(np.zeros(d, dtype=np.int64),
                   y_exponents=None if d_out is None else np.zeros(d_out, dtype=np.int64),
                   decays=decays)

    def with_decays(self, decays):
        """The same coordinates for feature blocks of these decays (None: one, no decay)."""
        return TokenStandardizer(self.exponents, self.whitening, self.y_exponents,
                                 self.weight_exponent, collinear=self.collinear, decays=decays,
                                 target_precision=self.target_precision)

    def with_outputs(self, n):
        """The same coordinates for the first ``n`` targets only."""
        return TokenStandardizer(self.exponents, self.whitening, self.y_exponents[:n],
                                 self.weight_exponent, collinear=self.collinear,
                                 decays=self.decays, target_precision=self.target_precision)

    @property
    def whitened(self):
        return self.whitening is not None

    def __eq__(self, other):
        if not isinstance(other, TokenStandardizer):
            return NotImplemented
        same_w = (self.whitening is None) == (other.whitening is None) and (
            self.whitening is None or np.array_equal(self.whitening, other.whitening))
        same_y = (self.y_exponents is None) == (other.y_exponents is None) and (
            self.y_exponents is None or np.array_equal(self.y_exponents, other.y_exponents))
        return bool(np.array_equal(self.exponents, other.exponents) and same_w and same_y
                    and self.weight_exponent == other.weight_exponent
                    and self.decays == other.decays)

    # Equality compares the arrays, which may change: not hashable.
    __hash__ = None

    def __repr__(self):
        blocks = "" if self.decays is None else f", decays={list(self.decays)}"
        return (f"TokenStandardizer(d={self.d}, whitened={self.whitened}, "
                f"exponents={self.exponents.tolist()}{blocks})")

    # ------------------------------------------------------------ forward maps

    def transform(self, X):
        """Standardized float64 tokens of X (..., d); zero tokens stay zero."""
        X = np.asarray(X, dtype=np.float64)
        what = "The inputs in the training data's standardized units"
        shape = X.shape
        if self.whitening is not None and self._matrix is not None:
            # One product: x_j (2**-e_j W_jk) rounds exactly as (x_j 2**-e_j) W_jk;
            # as one 2-D GEMM (a stacked matmul would be one tiny GEMM per sequence).
            with np.errstate(over="ignore"):
                return check_finite(X.reshape(-1, self.d) @ self._matrix, what).reshape(shape)
        if self.exponents.any():
            # Inputs far larger than the training data can leave float64 here.
            with np.errstate(over="ignore"):
                X = check_finite(pow2_scale(X, -self.exponents), what)
        if self.whitening is not None:
            X = (X.reshape(-1, self.d) @ self.whitening).reshape(shape)
        return X

    def transform_targets(self, Y):
        """Targets (..., d_out) in the standardized units (float64)."""
        Y = np.asarray(Y, dtype=np.float64)
        if self.y_exponents is None or not self.y_exponents.any():
            return Y
        return pow2_scale(Y, -self.y_exponents)

    def weights_to_user(self, w):
        """Standardized weights (or a sum of them) in the data's units (inverse of
        :meth:`transform_weights`)."""
        return float(pow2_scale(w, self.weight_exponent)) if np.ndim(w) == 0 else (
            pow2_scale(np.asarray(w, dtype=np.float64), self.weight_exponent))

    def transform_weights(self, w):
        """Sequence weights in the standardized units (float64), or None."""
        if w is None:
            return None
        w = np.asarray(w, dtype=np.float64)
        return pow2_scale(w, -self.weight_exponent) if self.weight_exponent else w

    def scale_moments(self, S):
        """Folded moments (..., P) -> the moments of the standardized feature rows."""
        return S * self.pair_weights if self.whitening is not None else S

    def scale_features(self, H):
        """Feature rows (..., psi) of standardized tokens -> standardized feature rows."""
        if self.whitening is None:
            return H
        shape = H.shape
        return (H.reshape(*shape[:-1], -1, self.d) * self.pair_weights[:, None]).reshape(shape)

    def folded(self, coef):
        """Standardized coefficients -> folded coefficients (paper's features) of standardized tokens."""
        coef = np.asarray(coef, dtype=np.float64)
        if self.whitening is None:
            return coef
        return self.scale_features(coef)


class MomentScales:
    """Magnitudes of the tokens, targets and weights, and the tokens' second moment.

    Everything the standardized coordinates (:class:`TokenStandardizer`) are
    made of, gathered from the per-sequence second moments ``S_i`` that a fit
    forms anyway (:meth:`add`): no pass over the tokens of its own.

    - the exponent ``e_j`` of each coordinate: ``2**e_j`` is at most the
      largest root sum of squares ``sqrt(S_i[j, j])`` of the coordinate over
      one sequence, and more than half of it;
    - the weighted token second moment ``M = sum_i w_i S_i / sum_i w_i n_i``,
      kept in units ``2**-(e_j + e_k)`` and rescaled exactly (powers of two)
      when a larger magnitude arrives, so nothing overflows;
    - the exponents of the targets' largest magnitudes per output and of the
      largest weight;
    - how many token entries are non-zero, as counted by the caller.

    Scales of disjoint data merge (:meth:`merge`), which is how chunks,
    ``partial_fit`` calls and the blocks of a distributed array combine.

    Parameters
    ----------
    d : int
        Token dimension.
    d_out : int or None, default=None
        Number of outputs (None: no targets).
    whiten : bool, default=True
        False keeps the coordinates' power-of-two scales only.
    decays : tuple of float or None, default=None
        The decays of the feature blocks, carried into the coordinates.
    """

    def __init__(self, d, d_out=None, *, whiten=True, decays=None):
        self.d, self.d_out, self.whiten = int(d), d_out, bool(whiten)
        self.decays = decays
        self._e = np.full(self.d, NO_EXPONENT, dtype=np.int64)
        self._log2 = np.full(self.d, -np.inf)  # log2 of each coordinate's largest magnitude
        self._M = np.zeros((self.d, self.d))
        self._ew = NO_EXPONENT  # exponent of the largest weight seen
        self._total = 0.0  # weighted token count, in units of 2**_ew
        self._ey = None if d_out is None else np.full(d_out, NO_EXPONENT, dtype=np.int64)
        self._target_precision = EPS32  # lowered when a target is not a float32 value
        self._nonzero = 0
        self._entries = 0
        self.dtype = np.dtype(np.float64)

    def add(self, S, lengths, e, sample_weight=None, *, targets=None, tokens=None):
        """Add the moments S (n, d, d) in units ``2**-(e_j + e_k)`` of sequences of these lengths.

        Sequences of zero weight are left out.  ``targets`` (of the sequences
        of positive weight) are added as by :meth:`add_targets`, ``tokens``
        (zero-padded X) as by :meth:`add_density`.
        """
        lengths = np.asarray(lengths)
        if tokens is not None:
            self.add_density(tokens, lengths)
        if targets is not None:
            self.add_targets(targets)
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64)
            keep = w > 0
            if not keep.all():
                S, lengths, w = S[keep], lengths[keep], w[keep]
        if S.shape[0] == 0:
            return self
        e_seen, log2 = moments_exponents(S, e)
        e_new = np.maximum(self._e, e_seen)
        self._log2 = np.maximum(self._log2, log2)
        ew = 0 if sample_weight is None else int(exponent(w.max()))
        self._rescale(e_new, max(self._ew, ew))
        e_now = np.where(self._e == NO_EXPONENT, 0, self._e)
        shift = (e - e_now)[:, None] + (e - e_now)[None, :]
        if sample_weight is None:
            M = S.sum(axis=0)
            count = float(lengths.sum())
        else:
            ws = pow2_scale(w, -self._ew)
            M = np.tensordot(ws, S, axes=(0, 0))
            count = float(ws @ lengths)
        if sample_weight is None and self._ew:
            M, count = pow2_scale(M, -self._ew), float(pow2_scale(count, -self._ew))
        with np.errstate(under="ignore"):
            self._M += pow2_scale(M, shift)
        self._total += count
        return self

    def add_targets(self, Y):
        """Add targets (..., d_out) (zeros at padded positions)."""
        if self._ey is not None and Y is not None:
            Y = np.asarray(Y)
            self._target_precision = min(self._target_precision, target_precision(Y))
            m = column_abs_max(Y.reshape(-1, Y.shape[-1]))
            self._ey = np.maximum(self._ey, np.where(m > 0, exponent(m), NO_EXPONENT))
        return self

    def add_density(self, X, lengths):
        """Count the non-zero entries of the real tokens of X (zero-padded)."""
        self._nonzero += int(np.count_nonzero(X))
        self._entries += int(np.asarray(lengths).sum()) * self.d
        if X.dtype.kind == "f" and X.dtype.itemsize < self.dtype.itemsize:
            self.dtype = X.dtype
        return self

    def _rescale(self, e_new, ew):
        """Express M and the total in the column exponents e_new and weight exponent ew."""
        known = self._e != NO_EXPONENT
        if known.any():
            shift = np.where(known, self._e - e_new, 0)
            with np.errstate(under="ignore"):
                self._M = pow2_scale(self._M, shift[:, None] + shift[None, :])
        if self._ew != NO_EXPONENT and ew != self._ew:
            self._M = pow2_scale(self._M, self._ew - ew)
            self._total = float(pow2_scale(self._total, self._ew - ew))
        self._e, self._ew = e_new, ew

    def merge(self, other):
        """Add another accumulator's batches (in place)."""
        if other._total == 0:
            if self._ey is not None and other._ey is not None:
                self._ey = np.maximum(self._ey, other._ey)
                self._target_precision = min(self._target_precision, other._target_precision)
            return self
        other = other.copy()
        e_new = np.maximum(self._e, other._e)
        self._log2 = np.maximum(self._log2, other._log2)
        ew = max(self._ew, other._ew)
        self._rescale(e_new, ew)
        other._rescale(e_new, ew)
        self._M += other._M
        self._total += other._total
        if self._ey is not None and other._ey is not None:
            self._ey = np.maximum(self._ey, other._ey)
            self._target_precision = min(self._target_precision, other._target_precision)
        self._nonzero += other._nonzero
        self._entries += other._entries
        if other.dtype.itemsize < self.dtype.itemsize:
            self.dtype = other.dtype
        return self

    def copy(self):
        """An independent copy."""
        new = MomentScales.__new__(MomentScales)
        new.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                             for k, v in self.__dict__.items()})
        return new

    def second_moment(self):
        """The weighted token second moment M (d, d) in the data's units (may overflow: for
        standardized tokens, whose entries are near 1)."""
        e = np.where(self._e == NO_EXPONENT, 0, self._e)
        return pow2_scale(self._M / self._total, e[:, None] + e[None, :])

    @property
    def ill_conditioned(self):
        """Whether the whitening from the moments alone is inaccurate: the tokens' correlation
        matrix has a condition number above ``2**16``, where forming M loses more than
        ``2**16 eps`` of its smallest eigenvalue (refine with :func:`refined_whitening`)."""
        if not (self.whiten and self._total > 0 and not self.sparse and self.d > 1):
            return False
        diag = np.sqrt(np.clip(np.diagonal(self._M), np.finfo(np.float64).tiny, None))
        C = self._M / diag[:, None] / diag[None, :]
        lam = scipy.linalg.eigvalsh((C + C.T) / 2, check_finite=False)
        return not lam[0] * _REFINE_CONDITION > lam[-1]

    @property
    def sparse(self):
        """Whether at most a quarter of the token entries counted are non-zero (no whitening)."""
        return self._entries > 0 and self._nonzero <= SPARSE_DENSITY * self._entries

    def finish(self):
        """The :class:`TokenStandardizer` of the batches seen."""
        seen = self._e != NO_EXPONENT
        e = np.zeros(self.d, dtype=np.int64)
        if seen.any():
            # Exponents relative to the largest coordinate's: an overall scale of
            # the data moves them all alike, exactly, so that it changes neither
            # the standardized tokens nor the minimum-norm choice among minimizers.
            # A coordinate that is zero in every token carries no data: it gets
            # the largest coordinate's (its own would be arbitrary).
            top = float(self._log2[seen].max())
            rel = np.floor(np.where(seen, self._log2, top) - top + _RELATIVE_OFFSET)
            e = int(np.floor(top)) + rel.astype(np.int64)
        ey = None if self._ey is None else np.where(self._ey == NO_EXPONENT, 0, self._ey)
        ew = 0 if self._ew == NO_EXPONENT else self._ew
        W = None
        if self.whiten and self._total > 0 and not self.sparse and self.d > 1:
            shift = np.where(seen, self._e - e, 0)
            M = pow2_scale(self._M, shift[:, None] + shift[None, :])
            W = whitening(M / self._total, e, self.dtype)
        return TokenStandardizer(e, W, ey, ew, collinear=self.ill_conditioned,
                                 decays=self.decays, target_precision=self._target_precision)


def refined_whitening(standardizer, M):
    """Coordinates whitened again by ``M``, the second moment of their own standardized tokens.

    A whitening computed from a formed second moment is accurate to about
    ``eps cond(M)``; the tokens it standardizes are then close to white, and
    their own second moment (condition number near 1) gives the correction
    to full accuracy, as a QR factorisation of the tokens would.
    """
    if standardizer.whitening is None:
        return standardizer
    D = whitening(M, np.zeros(standardizer.d, dtype=np.int64), frame=False)
    if D is None:
        return standardizer
    W = _symmetric_frame(standardizer.whitening @ D, standardizer.exponents)
    return TokenStandardizer(standardizer.exponents, W, standardizer.y_exponents,
                             standardizer.weight_exponent, collinear=standardizer.collinear,
                             decays=standardizer.decays,
                             target_precision=standardizer.target_precision)


def whitening(M, e, dtype=np.float64, *, frame=True):
    """The symmetric whitening W of a token second moment M in units ``2**-(e_j + e_k)``.

    ``W = M^{-1/2}`` over the directions that carry data; directions whose
    variance is rounding (an eigen-solver's error, times a margin) keep the
    scale of the others instead of amplifying their rounding.  The split
    between the two is orthogonal in the data's own metric (each coordinate
    in units of its root mean square: the correlation matrix), so that
    neither an overall scale nor a unit per coordinate moves it; it decides
    the minimum-norm choice on inputs off the training tokens' span.  Then
    put in the symmetric frame (:func:`_symmetric_frame`) when ``frame``
    (else the metric is M's own, for tokens standardized already).  None
    when M is zero.
    """
    d = M.shape[0]
    M = (M + M.T) / 2
    diag = np.diagonal(M)
    largest = diag.max(initial=0.0)
    if not largest > 0:
        return None
    c = 1.0 / np.sqrt(np.where(diag > 0, diag, largest)) if frame else np.ones(d)
    lam, V = scipy.linalg.eigh(M * c[:, None] * c[None, :], check_finite=False)
    top = lam.max(initial=0.0)
    null = lam <= _NULL_VARIANCE_MARGIN * eigenvalue_tolerance(top, d, dtype)
    lam = np.where(null, top, lam)
    W = ((c[:, None] * V) / np.sqrt(lam)) @ V.T
    return _symmetric_frame(W, e) if frame else W


def pair_map(T):
    """The (P, P) matrix R with ``fold(T^T S T) = R fold(S)`` for symmetric S.

    ``R[p', p] = T[j_p, j'] T[k_p, k'] + (j_p != k_p) T[k_p, j'] T[j_p, k']``
    with ``(j_p, k_p)`` and ``(j', k')`` the pairs p and p' of the folding
    order.
    """
    jp, kp = pair_indices(T.shape[0])
    R = T[jp][:, jp].T * T[kp][:, kp].T
    off = jp != kp
    R[:, off] += (T[kp][:, jp] * T[jp][:, kp]).T[:, off]
    return R


def feature_map(old, new):
    """Factors ``(A, B)`` with ``h_new = (A kron B) h_old`` between two standardizations.

    The feature rows of the same data in two standardized coordinates differ
    by ``kron(A, B)``: with ``T = diag(2**-e) W`` for each and ``D =
    T_old^{-1} T_new``, ``B = D^T`` and ``A = diag(s_new) R_D diag(1 / s_old)``
    (:func:`pair_map`, the pair weights of each embedding).
    """
    W_old = np.eye(old.d) if old.whitening is None else old.inverse_whitening
    W_new = np.eye(new.d) if new.whitening is None else new.whitening
    D = W_old @ pow2_scale(W_new, (old.exponents - new.exponents)[:, None])
    A = pair_map(D) * new.block_pair_weights[:, None] / old.block_pair_weights[None, :]
    if new.n_blocks > 1:  # every block's moments map alike
        A = scipy.linalg.block_diag(*([A] * new.n_blocks))
    return A, D.T


def weight_factor(old, new):
    """The factor of standardized weights from coordinates ``old`` to ``new`` (a power of two)."""
    return float(pow2_scale(1.0, old.weight_exponent - new.weight_exponent))


def targets_map(old, new, n_real, terms=None):
    """``M`` with ``Y_new = Y_old M`` for standardized targets (term columns last) between two
    coordinates: powers of two for the ``n_real`` outputs, the map of the tokens for skip
    columns."""
    n_terms = 0 if terms is None else terms.n_terms
    M = np.zeros((n_real + n_terms, n_real + n_terms))
    ey_old = old.y_exponents if old.y_exponents is not None else np.zeros(n_real, int)
    ey_new = new.y_exponents if new.y_exponents is not None else np.zeros(n_real, int)
    M[np.arange(n_real), np.arange(n_real)] = pow2_scale(1.0, ey_old[:n_real] - ey_new[:n_real])
    i = n_real
    if terms is not None and terms.intercept:
        M[i, i] = 1.0
        i += 1
    if terms is not None and terms.skip:
        M[i:, i:] = feature_map(old, new)[1].T  # x_new = x_old D
    return M


# The map of the tokens between two coordinates with a condition number up to
# this maps a Gram matrix at a few eps.
MAP_CONDITION = 1.25


def map_is_accurate(D):
    """Whether the token map ``D`` (:func:`feature_map`'s ``B``) maps a Gram matrix at a few eps.

    Its condition number is at most ``MAP_CONDITION``: then no cancellation
    in the map of the features (cubic in D) rounds more than a few eps of
    the largest eigenvalue into any other.  Provisional statistics are mapped
    into the final coordinates only then; else they are accumulated again,
    or mapped through a factor (:meth:`SufficientStatistics.restandardized`).
    """
    sv = np.linalg.svd(D, compute_uv=False)
    return bool(sv[-1] * MAP_CONDITION >= sv[0])


def _symmetric_frame(W, e):
    """``W Q`` with Q orthogonal such that ``diag(2**-e) W Q`` is symmetric.

    ``T0 = diag(2**-e) W`` whitens the tokens, and so does ``T0 Q`` for any
    orthogonal Q; the symmetric choice (the polar factor of T0) is the
    inverse square root of the token second moment itself, which does not
    depend on the power-of-two scales chosen for the coordinates, so neither
    do the standardized tokens (up to rounding).  The scales are factored out
    by a common power of two; if the coordinates' scales are too far apart
    for that, W is kept as it is.
    """
    rel = e - e.max()
    if rel.min() < -900:
        return W
    T0 = pow2_scale(W, -rel[:, None])
    U, _, Vt = scipy.linalg.svd(T0, check_finite=False)
    return W @ (Vt.T @ U.T)
