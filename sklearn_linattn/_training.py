"""Training data of ``fit`` and ``partial_fit``: validated once, at the edge, in batches."""

import itertools

import numpy as np

from ._standardize import StandardizerAccumulator
from ._validation import check_sample_weight, check_sequences, check_targets

__all__ = ["TrainingData"]

# Values of a NumPy X validated (and copied) at a time by fit and partial_fit
# (2**21 float64 values, 16 MiB).
_VALIDATION_CHUNK = 2**21


class TrainingData:
    """Training data, validated in chunks when X is a large array.

    A large NumPy X (more than ``_VALIDATION_CHUNK`` values) is validated
    and copied one chunk of sequences at a time, so that fitting it never
    holds a second copy of it: the statistics solvers consume the chunks as
    they come, and ``"cg"`` reads the caller's array directly (its padding is
    ignored through the lengths).  Any other input (lists of sequences,
    DataFrames, small arrays) is validated at once.  Error messages on a
    chunk name it, e.g. ``X[4096:8192][3, 2] is partly NaN``.
    """

    def __init__(self, X, y, sample_weight, *, layout, readout, n_features_in=None):
        self.layout, self.readout, self.n_features_in = layout, readout, n_features_in
        self._first = self._rest = None
        self.chunked = (
            isinstance(X, np.ndarray)
            and X.ndim in (2, 3)
            and X.dtype.kind in "fiu"
            and X.size > _VALIDATION_CHUNK
            and X.shape[0] > 1
            and isinstance(y, np.ndarray)
            and y.shape[:1] == X.shape[:1]
        )
        if self.chunked:
            self.X, self.y = X, y
            self.n_samples = X.shape[0]
            self.sample_weight = check_sample_weight(sample_weight, self.n_samples)
        else:
            # Read only (statistics, solvers, or concatenated): no copy needed.
            Xv, lengths = check_sequences(X, n_features_in=n_features_in, copy=False, **layout)
            Y, single = check_targets(y, lengths, Xv.shape[1], readout=readout,
                                      data_format=layout["data_format"])
            w = check_sample_weight(sample_weight, Xv.shape[0])
            self._whole = (Xv, lengths, Y, single, w)
            self.n_samples = Xv.shape[0]
            self.sample_weight = w

    def batches(self):
        """Validated ``(X, lengths, Y, single_output, sample_weight)`` batches, in order."""
        if not self.chunked:
            yield self._whole
            return
        step = max(1, _VALIDATION_CHUNK // max(1, self.X[0].size))
        for start in range(0, self.n_samples, step):
            sl = slice(start, min(start + step, self.n_samples))
            Xc, lc = check_sequences(
                self.X[sl], n_features_in=self.n_features_in,
                name=f"X[{sl.start}:{sl.stop}]", copy=False, **self.layout,
            )
            Yc, single = check_targets(
                self.y[sl], lc, Xc.shape[1], readout=self.readout,
                name=f"y[{sl.start}:{sl.stop}]", data_format=self.layout["data_format"],
            )
            w = None if self.sample_weight is None else self.sample_weight[sl]
            yield Xc, lc, Yc, single, w

    def first(self):
        """The first validated batch: its shapes fix d, the outputs and ``single_output``."""
        if self._first is None:
            self._rest = self.batches()
            self._first = next(self._rest)
        return self._first

    def scales(self):
        """Token and target magnitudes of all the data (one pass over the batches).

        Returns the :class:`~._standardize.StandardizerAccumulator` whose
        ``finish()`` gives the standardized coordinates.  For chunked data this
        validates every chunk once more before the solver's own pass; errors in
        the data are raised here, before any expensive work.
        """
        acc = None
        self.first()
        for Xc, lc, Yc, _, wc in itertools.chain([self._first], self._rest):
            if acc is None:
                acc = StandardizerAccumulator(Xc.shape[2], Yc.shape[-1])
            acc.update(Xc, lc, Yc, wc)
        return acc

    def n_rows_bound(self, n_tokens):
        """Number of feature rows (an upper bound for ``readout="all"`` on chunked data)."""
        w = self.sample_weight
        n = self.n_samples if w is None else int(np.count_nonzero(w > 0))
        if self.readout == "last":
            return n
        if not self.chunked:
            lengths = self._whole[1]
            return int(lengths.sum() if w is None else lengths[w > 0].sum())
        return n * n_tokens

    def solver_batches(self):
        """Validated ``(X, lengths, Y, sample_weight)`` batches, as the solvers read them."""
        for Xc, lc, Yc, _, wc in self.batches():
            yield Xc, lc, Yc, wc

    def arrays(self, copy):
        """Whole-data arrays ``(X, lengths, Y, sample_weight)``, validated once more if chunked.

        ``copy=False`` returns the caller's array itself for chunked data (NaN
        or anything at padded positions; the solver ignores it by length).
        """
        if not self.chunked:
            Xv, lengths, Y, _, w = self._whole
            return Xv, lengths, Y, w
        # Keep only what is needed of each validated chunk: its copy of the
        # sequences is dropped at once unless the solver needs them all.
        parts = [(Xc if copy else None, lc, Yc) for Xc, lc, Yc, _, _ in self.batches()]
        lengths = np.concatenate([p[1] for p in parts])
        Y = np.concatenate([p[2] for p in parts])
        if copy:
            X = np.concatenate([p[0] for p in parts])
        else:
            X = self.X
            token_dim = self.layout["token_dim"]
            first = self.layout["data_format"] == "channels_first"
            if X.ndim == 2:
                d = 1 if token_dim is None else token_dim
                X = (np.swapaxes(X.reshape(X.shape[0], d, -1), 1, 2) if first
                     else X.reshape(X.shape[0], -1, d))
            elif first:
                X = np.swapaxes(X, 1, 2)  # a view: "cg" reads chunks of it
        return X, lengths, Y, self.sample_weight

