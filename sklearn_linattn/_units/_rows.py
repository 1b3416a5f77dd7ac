"""The one forward map of rows: sequences in the data's units to standardized feature rows.

Every feature row is ``kron(S_r, x_r)`` of a folded second moment ``S_r =
sum_{t <= r} x_t x_t^T`` and the row's token ``x_r`` (the last token for
readout ``"last"``, each token for ``"all"``).  :func:`raw_rows` forms the
factors of a chunk in its own units (powers of two only where its products
would leave float64); :func:`map_rows` maps them into standardized
coordinates as moments (``S -> A^T S A``, ``x -> x A``), never the tokens
again; :func:`standardized_rows` does both, or, for nearly collinear tokens
(where the map of a formed moment would lose ``eps cond`` of the small
directions), forms the moments of the standardized tokens.  Rows of zero
weight are dropped; targets follow their rows, the term columns ``[1, x_r]``
of the standardized row tokens appended.
"""

from dataclasses import dataclass

import numpy as np

from .._features import decayed_moments, pair_indices, row_factors
from .._memory import n_pairs, real_tokens, zero_padding
from ._coordinates import pair_map
from ._pow2 import pow2_scale, sequence_moments

__all__ = ["FeatureRows", "map_moments", "map_rows", "raw_rows", "standardized_rows",
           "token_map", "tokens_first", "with_terms"]

# Up to this d the moments are mapped by the (P, P) pair map (P**2 per row),
# above it by two GEMMs of the unfolded moments (2 d**3 per row).
_PAIR_MAP_UP_TO_D = 8


@dataclass
class FeatureRows:
    """Factors of feature rows ``H_r = kron(S_r, x_r)``, with weights and targets.

    Attributes
    ----------
    S : ndarray of shape (m, n_blocks * P)
        Folded second moments (in standardized coordinates: in the symmetric
        embedding, pairs j < k weighted by sqrt(2) when whitened), one
        (decayed) moment per feature block side by side.
    x : ndarray of shape (m, d)
        Row tokens.
    w : ndarray of shape (m,) or None
        Positive row weights (None: all one).
    Y : ndarray of shape (m, k) or None
        Targets, the term columns last.
    """

    S: np.ndarray
    x: np.ndarray
    w: np.ndarray | None
    Y: np.ndarray | None

    @property
    def n_rows(self):
        return self.S.shape[0]

    @staticmethod
    def concatenate(parts, d, d_targets, n_blocks=1):
        """One FeatureRows of several (empty ones included)."""
        P = n_blocks * n_pairs(d)
        parts = [p for p in parts if p.n_rows] or [
            FeatureRows(np.zeros((0, P)), np.zeros((0, d)), None,
                 None if d_targets is None else np.zeros((0, d_targets)))]
        weighted = any(p.w is not None for p in parts)
        return FeatureRows(
            np.concatenate([p.S for p in parts]),
            np.concatenate([p.x for p in parts]),
            np.concatenate([np.ones(p.n_rows) if p.w is None else p.w for p in parts])
            if weighted else None,
            None if parts[0].Y is None else np.concatenate([p.Y for p in parts]),
        )


def _row_targets(Y, lengths, readout, sample):
    """Targets of the rows (None passes)."""
    if Y is None:
        return None
    Y = np.asarray(Y, dtype=np.float64)
    if readout == "last":
        return Y
    return Y[real_tokens(lengths, Y.shape[1])] if sample.size != Y.shape[0] * Y.shape[1] else (
        Y.reshape(-1, Y.shape[-1]))


def raw_rows(X, lengths, readout, Y, w, S_seq=None, e=None, decays=None):
    """Rows of a zero-padded float64 chunk in its own units ``2**-e`` (with ``e``).

    ``S_seq`` and ``e`` are the chunk's :func:`~._units.sequence_moments`
    when already computed; ``decays`` those of the feature blocks.
    """
    if S_seq is None:
        S_seq, e = sequence_moments(X)
    if readout == "last":
        n, n_tokens, d = X.shape
        j, k = pair_indices(d)
        S = np.take(S_seq.reshape(n, d * d), j * d + k, axis=1)
        if decays is not None:
            # Decayed moments of the same tokens in the same units (a decay is <= 1:
            # nothing leaves the range the plain moments stay in); decay 1 is S.
            S = decayed_moments(pow2_scale(X, -e) if e.any() else X, lengths, decays, plain=S)
        # Full sequences: the last token is a view, not a gather.
        x = (X[:, -1] if lengths.size and lengths.min() == n_tokens
             else X[np.arange(n), lengths - 1])
        sample = np.arange(n)
        if e.any():
            x = pow2_scale(x, -e)
    else:
        Xs = pow2_scale(X, -e) if e.any() else X
        S, x, sample = row_factors(Xs, lengths, "all", decays)
    Yr = _row_targets(Y, lengths, readout, sample)
    wr = None if w is None else np.asarray(w, dtype=np.float64)[sample]
    if wr is not None and not np.all(wr > 0):
        keep = wr > 0
        S, x, wr = S[keep], x[keep], wr[keep]
        Yr = None if Yr is None else Yr[keep]
    return FeatureRows(np.ascontiguousarray(S), np.ascontiguousarray(x), wr, Yr), e


def token_map(standardizer, e):
    """``A`` with ``x_std = x_e A`` for tokens ``x_e = x 2**-e`` (exact powers of two)."""
    shift = (e - standardizer.exponents)[:, None]
    W = np.eye(standardizer.d) if standardizer.whitening is None else standardizer.whitening
    with np.errstate(under="ignore"):
        return pow2_scale(W, shift)


def with_terms(Yr, x, terms):
    """Targets with the term columns ``[1, x]`` of the standardized row tokens appended."""
    if terms is None or not terms:
        return Yr
    parts = [] if Yr is None else [Yr]
    if terms.intercept:
        parts.append(np.ones((x.shape[0], 1)))
    if terms.skip:
        parts.append(np.asarray(x, dtype=np.float64))
    return np.concatenate(parts, axis=1)


def _map_cost(d):
    """Multiply-adds per folded moment of :func:`map_moments` (the pair map or two GEMMs)."""
    return n_pairs(d) ** 2 if d <= _PAIR_MAP_UP_TO_D else 2 * d**3


def map_moments(S, A, weights):
    """``fold(A^T S A) * weights`` for each row of folded moments S, shape (m, P).

    A diagonal A (no whitening) scales each pair; a small d multiplies by
    the (P, P) pair map (:func:`~._units.pair_map`, ``P**2`` per row);
    a larger d unfolds the moments and applies A from both sides as two
    GEMMs (``2 d**3`` per row, ``(d + 1)**2 / (8 d)`` times fewer).
    """
    d = A.shape[0]
    j, k = pair_indices(d)
    if not np.any(A - np.diag(np.diagonal(A))):
        a = np.diagonal(A)
        return S * (a[j] * a[k] * weights)
    if d <= _PAIR_MAP_UP_TO_D:
        return S @ (pair_map(A) * weights[:, None]).T
    m = S.shape[0]
    U = np.empty((m, d, d))
    U[:, j, k] = S
    U[:, k, j] = S
    SA = (U.reshape(m * d, d) @ A).reshape(m, d, d)
    # (S A)^T = A^T S for a symmetric S: the second GEMM gives A^T S A.
    U = (np.ascontiguousarray(SA.transpose(0, 2, 1)).reshape(m * d, d) @ A).reshape(m, d * d)
    return U[:, j * d + k] * weights


def map_rows(rows, e, standardizer, terms):
    """Rows in units ``2**-e`` -> rows in the standardizer's coordinates (their moments mapped)."""
    A = token_map(standardizer, e)
    Yr = None if rows.Y is None else standardizer.transform_targets(rows.Y)
    x = rows.x @ A
    m, P = rows.n_rows, n_pairs(standardizer.d)
    # Every block's moments map alike: one map of the blocks stacked as rows.
    S = map_moments(rows.S.reshape(m * standardizer.n_blocks, P), A,
                    standardizer.block_pair_weights).reshape(m, rows.S.shape[1])
    return FeatureRows(S, x, standardizer.transform_weights(rows.w), with_terms(Yr, x, terms))


def tokens_first(standardizer, n_tokens, readout):
    """Whether standardizing the tokens costs less than mapping every row's moments.

    Whitening the tokens costs ``n_tokens d**2`` per sequence, mapping the
    moments :func:`_map_cost` per row (one row per sequence for readout
    "last", one per token for "all"); a diagonal map is cheap either way.
    """
    if not standardizer.whitened:
        return False
    d = standardizer.d
    rows = 1 if readout == "last" else n_tokens
    return n_tokens * d * d < rows * _map_cost(d)


def standardized_rows(X, lengths, readout, standardizer, *, Y=None, sample_weight=None,
                      terms=None, raw=None):
    """Rows of a chunk of sequences in the standardizer's coordinates.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Tokens; anything (NaN included) at positions ``>= lengths``.
    lengths : ndarray of int, shape (n_samples,)
    readout : {"last", "all"}
    standardizer : TokenStandardizer
    Y : ndarray or None
        Targets as validated (shape per readout).
    sample_weight : ndarray of shape (n_samples,) or None
    terms : LinearTerms or None
        Term columns to append to the targets.
    raw : tuple or None
        The chunk's rows in its own units and their exponents, as
        :func:`raw_rows` returns them, when formed already (mapped unless
        the tokens are standardized first).

    Returns
    -------
    rows : FeatureRows
        Rows of positive weight, targets and weights standardized too.
    """
    X = zero_padding(np.asarray(X, dtype=np.float64), np.asarray(lengths))
    if standardizer.collinear or tokens_first(standardizer, X.shape[1], readout):
        # The moments of the standardized tokens: for nearly collinear tokens
        # the only accurate rows, else the cheaper ones for these sizes.
        Xs = standardizer.transform(X)
        rows, e = raw_rows(Xs, lengths, readout, Y, sample_weight,
                            decays=standardizer.decays)
        S, x = rows.S, rows.x
        if e.any():  # back from the chunk's own units (standardized tokens are near 1)
            j, k = pair_indices(X.shape[2])
            S = pow2_scale(S, np.tile(e[j] + e[k], standardizer.n_blocks))
            x = pow2_scale(x, e)
        rows = FeatureRows(S * standardizer.pair_weights, x, rows.w, rows.Y)
        Yr = None if rows.Y is None else standardizer.transform_targets(rows.Y)
        return FeatureRows(rows.S, rows.x, standardizer.transform_weights(rows.w),
                    with_terms(Yr, rows.x, terms))
    rows, e = raw if raw is not None else raw_rows(X, lengths, readout, Y, sample_weight,
                                                    decays=standardizer.decays)
    return map_rows(rows, e, standardizer, terms)
