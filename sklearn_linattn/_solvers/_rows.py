"""Feature rows of chunks of sequences, in standardized coordinates, as the solvers read them."""

from dataclasses import dataclass

import numpy as np

from .._features import row_factors
from .._memory import iter_sample_chunks, n_pairs, real_tokens, sample_values, zero_padding

__all__ = ["Design", "all_rows", "chunk_rows", "count_rows", "load_chunk"]


@dataclass(frozen=True)
class Design:
    """Validated training sequences as the solvers on the data read them.

    Attributes
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Padded sequences; values at positions ``>= lengths`` are ignored.
    lengths : ndarray of int, shape (n_samples,)
    Y : ndarray or None
        Targets as :func:`~.._validation.check_targets` returns them.
    readout : {"last", "all"}
    sample_weight : ndarray of shape (n_samples,) or None
    standardizer : TokenStandardizer
        Standardized coordinates the solver works in.
    dtype : numpy dtype
        Least precise floating dtype of the inputs (for the zero rule).
    n_rows : int or None
        Number of feature rows of positive weight (None: counted when needed).
    """

    X: object
    lengths: np.ndarray
    Y: object
    readout: str
    sample_weight: object
    standardizer: object
    dtype: np.dtype
    n_rows: int | None = None

    def rows(self):
        """Row factors, weights and targets of every row of positive weight (:func:`all_rows`)."""
        return all_rows(self.X, self.lengths, self.readout, self.Y, self.sample_weight,
                        self.standardizer)


def load_chunk(X, lengths, sl, standardizer=None):
    """Float64 chunk ``X[sl]``, zeros at positions ``>= lengths`` (NaN allowed there), standardized."""
    lc = lengths[sl]
    Xc = zero_padding(np.asarray(X[sl], dtype=np.float64), lc)
    if standardizer is not None:
        Xc = standardizer.transform(Xc)
    return Xc, lc


def chunk_rows(X, lengths, sl, readout, Y=None, sample_weight=None, standardizer=None):
    """Row factors of one chunk with their targets and weights; zero-weight rows dropped.

    Everything is returned in the standardizer's units (tokens, targets and
    weights); which rows are kept depends on the weights as given.
    """
    Xc, lc = load_chunk(X, lengths, sl, standardizer)
    S, x, sample = row_factors(Xc, lc, readout)
    if standardizer is not None:
        S = standardizer.scale_moments(S)
    Yr = None
    if Y is not None:
        Yc = np.asarray(Y[sl], dtype=np.float64)
        if readout == "last":
            Yr = Yc
        elif lc.size == 0 or lc.min() == Yc.shape[1]:
            Yr = Yc.reshape(-1, Yc.shape[2])
        else:
            Yr = Yc[real_tokens(lc, Xc.shape[1])]
        if standardizer is not None:
            Yr = standardizer.transform_targets(Yr)
    w = None
    if sample_weight is not None:
        raw = sample_weight[sl][sample]
        keep = raw > 0
        w = raw if standardizer is None else standardizer.transform_weights(raw)
        if not keep.all():
            S, x, w = S[keep], x[keep], w[keep]
            Yr = None if Yr is None else Yr[keep]
    return S, x, w, Yr


def all_rows(X, lengths, readout, Y=None, sample_weight=None, standardizer=None):
    """Row factors of every row with positive weight, with targets and weights."""
    n_samples, n_tokens, d = X.shape
    per_sample = sample_values(d, n_tokens, readout, 2 * n_pairs(d) + 2 * d)
    parts = [
        chunk_rows(X, lengths, sl, readout, Y, sample_weight, standardizer)
        for sl in iter_sample_chunks(n_samples, per_sample)
    ]
    S = np.concatenate([p[0] for p in parts])
    x = np.concatenate([p[1] for p in parts])
    w = None if sample_weight is None else np.concatenate([p[2] for p in parts])
    Yr = None if Y is None else np.concatenate([p[3] for p in parts])
    return S, x, w, Yr


def count_rows(lengths, readout, sample_weight):
    """Number of feature rows of positive weight: sequences for "last", real tokens for "all"."""
    rows = np.ones_like(lengths) if readout == "last" else lengths
    if sample_weight is not None:
        rows = rows[sample_weight > 0]
    return int(rows.sum())
