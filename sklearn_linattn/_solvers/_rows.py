"""What the solvers on the data read: standardized rows in memory, or the sequences to read them from."""

from dataclasses import dataclass

import numpy as np

from .._memory import iter_sample_chunks
from .._moments import Rows, standardized_rows
from .._standardize import TokenStandardizer

__all__ = ["Design", "all_rows", "chunk_rows", "count_rows"]


@dataclass(frozen=True)
class Design:
    """The rows of a least squares, as the solvers that read rows see them.

    Attributes
    ----------
    rows : Rows or None
        Every row of positive weight in standardized coordinates (targets
        with the term columns), in float64, when the fit kept them.
    arrays : tuple or None
        ``(X, lengths, Y, sample_weight)``: the validated sequences (padded
        positions ignored by length) to compute rows from when ``rows`` is
        None.
    readout : {"last", "all"}
    standardizer : TokenStandardizer
        Standardized coordinates of the rows.
    terms : LinearTerms or None
        Term columns appended to the targets.
    dtype : numpy dtype
        Least precise floating dtype of the inputs (for the zero rule).
    n_rows : int
        Number of rows of positive weight.
    """

    rows: Rows | None
    arrays: tuple | None
    readout: str
    standardizer: object
    terms: object
    dtype: np.dtype
    n_rows: int

    @classmethod
    def of_arrays(cls, X, lengths, Y=None, readout="last", sample_weight=None,
                  standardizer=None, terms=None):
        """The design of in-memory sequences, rows computed as needed (tests, benchmarks)."""
        X = np.asarray(X)
        lengths = np.asarray(lengths)
        if standardizer is None:
            standardizer = TokenStandardizer.identity(X.shape[2],
                                                      None if Y is None else Y.shape[-1])
        dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float64)
        return cls(None, (X, lengths, Y, sample_weight), readout, standardizer, terms,
                   np.dtype(dtype), count_rows(lengths, readout, sample_weight))

    @property
    def d(self):
        return self.standardizer.d

    @property
    def n_targets(self):
        """Number of target columns of the rows (term columns included); 0 without targets."""
        if self.rows is not None:
            return 0 if self.rows.Y is None else self.rows.Y.shape[1]
        Y = self.arrays[2]
        return (0 if Y is None else Y.shape[-1]) + (0 if self.terms is None else
                                                    self.terms.n_terms)

    def row_chunks(self, values_per_row):
        """The float64 rows in chunks of at most a memory chunk's worth."""
        if self.rows is not None:
            rows = self.rows
            for sl in iter_sample_chunks(rows.n_rows, values_per_row):
                yield Rows(rows.S[sl], rows.x[sl], None if rows.w is None else rows.w[sl],
                           None if rows.Y is None else rows.Y[sl])
            return
        X, lengths, Y, w = self.arrays
        n_samples, n_tokens, d = X.shape
        rows_per_sample = 1 if self.readout == "last" else n_tokens
        for sl in iter_sample_chunks(n_samples, rows_per_sample * values_per_row):
            yield chunk_rows(X, lengths, sl, self.readout, Y, w, self.standardizer, self.terms)

    def all_rows(self):
        """Every row at once (memory O(n_rows (P + d)))."""
        if self.rows is not None:
            return self.rows
        parts = list(self.row_chunks(2 * self.standardizer.n_moments + 2 * self.d))
        n_targets = parts[0].Y.shape[1] if parts and parts[0].Y is not None else None
        return Rows.concatenate(parts, self.d, n_targets, self.standardizer.n_blocks)


def chunk_rows(X, lengths, sl, readout, Y=None, sample_weight=None, standardizer=None,
               terms=None):
    """Standardized rows of the sequences ``X[sl]`` (:func:`~.._moments.standardized_rows`)."""
    return standardized_rows(
        X[sl], np.asarray(lengths)[sl], readout, standardizer,
        Y=None if Y is None else Y[sl],
        sample_weight=None if sample_weight is None else sample_weight[sl], terms=terms)


def all_rows(X, lengths, readout, Y=None, sample_weight=None, standardizer=None, terms=None):
    """Rows of every sequence with positive weight, standardized."""
    design = Design(None, (X, lengths, Y, sample_weight), readout, standardizer, terms,
                    np.dtype(np.float64), count_rows(lengths, readout, sample_weight))
    return design.all_rows()


def count_rows(lengths, readout, sample_weight):
    """Number of feature rows of positive weight: sequences for "last", real tokens for "all"."""
    rows = np.ones_like(lengths) if readout == "last" else lengths
    if sample_weight is not None:
        rows = rows[sample_weight > 0]
    return int(rows.sum())
