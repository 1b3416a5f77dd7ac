"""The rows of the least squares: per-sequence moments, read from the tokens once.

Every feature row is the Kronecker product ``kron(S_r, x_r)`` of a folded
second moment ``S_r = sum_{t <= r} x_t x_t^T`` and the row's token ``x_r``
(the last token for ``readout="last"``, each token for ``"all"``).  This
module computes those factors from validated chunks of sequences:

- :class:`MomentPass` is the pass of a fit over its chunks.  Each chunk's
  moments come from its own tokens, as they are (scaled by powers of two
  only when their products would leave float64); the standardized
  coordinates (:class:`~._units.MomentScales`) are gathered from the
  same moments; and the rows, kept as they came, are mapped into those
  coordinates at the end as moments (``S -> A^T S A``, ``x -> x A``), never
  the tokens again.
- :func:`standardized_rows` gives the rows of a chunk in known coordinates:
  the same map of its moments, or, for nearly collinear tokens (where the
  map of a formed moment would lose ``eps cond`` of the small directions),
  the moments of the mapped tokens.

Rows of zero weight are dropped everywhere; targets follow their rows; the
intercept and skip columns of a model with linear terms are appended to the
targets from the standardized row tokens (``[1, x_r]``).
"""

from dataclasses import dataclass, field

import functools

import numpy as np

from ._features import (
    features_matvec,
    features_matvec_in,
    features_rmatvec,
    features_rmatvec_in,
)
from ._memory import n_pairs, sample_chunks, sample_values
from ._namespace import active, as_numpy
from ._units import (
    FeatureRows,
    MomentScales,
    TokenStandardizer,
    feature_map,
    map_is_accurate,
    map_rows,
    pow2_scale,
    raw_rows,
    refined_whitening,
    sequence_moments,
    standardized_rows,
    unit_scaled,
    with_terms,
)

__all__ = ["FeatureRows", "ImplicitGram", "MomentPass", "RowReader", "coordinates",
           "count_rows", "scales_pass", "standardized_rows", "with_terms"]

# Rows in provisional coordinates with entries beyond this would bring the
# Gram matrix (their sixth powers) near overflow: accumulated again instead.
_MODERATE = 2.0**120
# Values of the work arrays of one chunk of cg's products in another namespace (a
# device's memory, not a cache, bounds them).
_DEVICE_CHUNK_VALUES = 2**27

class MomentPass:
    """The pass of a fit over its validated chunks: scales, and rows or statistics as they come.

    Each chunk is read once, in sub-chunks of a bounded size: its moments
    give the scales (:class:`~._units.MomentScales`) and

    - with ``keep_rows``, its rows are kept as they came (in the chunk's own
      units) and mapped into the final coordinates by :meth:`rows`;
    - with ``statistics``, its rows are accumulated at once into sufficient
      statistics in *provisional* coordinates (those of the first chunk, or
      given), so that memory does not grow with the data.  :meth:`statistics`
      maps them into the final coordinates when the two are close, or says
      that a second pass is needed.

    Parameters
    ----------
    d : int
    d_out : int or None
        Number of real target columns (None: no targets).
    readout : {"last", "all"}
    keep_rows : int or None, default=None
        Keep the rows, at most this many (an upper bound of the rows of
        positive weight): one array of that size, filled as the chunks come
        and mapped in place at the end.
    statistics : callable or None, default=None
        ``statistics(standardizer=...)`` makes the empty sufficient statistics to
        accumulate into (``add_rows``, ``note_sequences``,
        ``restandardized``); None accumulates none.
    terms : LinearTerms or None, default=None
        Term columns of the statistics' targets.
    provisional : TokenStandardizer or None, default=None
        Coordinates to accumulate the statistics in (None: the first chunk's).
    coordinates : TokenStandardizer or None, default=None
        The final coordinates, known before the pass (a second pass, the
        blocks of a dask array, statistics built by hand): the statistics are
        accumulated in them, with no map at the end.
    groups : ndarray of int, shape (n_samples,) or None, default=None
        A group label ``0 .. n_groups - 1`` for every sequence of the pass, in
        the order the chunks bring them: the statistics of each group are
        accumulated separately (:meth:`group_statistics`), all in the same
        coordinates, from the same pass (cross-validation folds).
    decays : tuple of float or None, default=None
        Fixed decays of the feature blocks: the rows' moments are the decayed
        moments, one block per decay (the coordinates carry them).  A
        :class:`~._attention.DecayBlocks` of several ``groups`` (the union of
        the candidates of a search over decays) gathers the Gram blocks within
        each group only (:meth:`~._solvers.SufficientStatistics.gather_block_groups`).
    tokens : TokenStandardizer or None, default=None
        Gather the scales of these standardized tokens instead of the tokens
        as they are (the refinement of a whitening, :func:`coordinates`).

    Attributes
    ----------
    scales : MomentScales
        The magnitudes and token second moment of all the chunks seen.
    n_samples, n_tokens : int
        Sequences seen (of positive weight) and the longest padded length.
    """

    def __init__(self, d, d_out, readout, *, keep_rows=None, statistics=None, terms=None,
                 provisional=None, coordinates=None, groups=None, decays=None, tokens=None):
        self.d, self.d_out, self.readout = int(d), d_out, readout
        self._tokens = tokens
        self.decays = decays
        self.n_blocks = 1 if decays is None else len(decays)
        # Work values of one feature row in a sub-chunk (moments, statistics' parts).
        self._row_values = 3 * self.n_blocks * n_pairs(self.d) + 3 * self.d + 2
        self._groups = None if groups is None else np.asarray(groups, dtype=np.intp)
        n_groups = 1 if self._groups is None else int(self._groups.max(initial=-1)) + 1
        self._group_samples = np.zeros(n_groups, dtype=np.int64)
        self._seen = 0  # sequences read so far, zero weights included
        self._noted = False
        self.scales = MomentScales(self.d, d_out, decays=decays)
        self._kept = None if keep_rows is None else _KeptRows(
            int(keep_rows), self.d, (d_out or 0) + (0 if not terms else terms.n_terms),
            self.n_blocks)
        self._make_statistics = statistics
        self._accumulate = statistics is not None
        self._terms = terms if terms else None
        # Final coordinates given: the statistics are accumulated in them as they
        # are (no range check, no map at the end).
        self._fixed = coordinates is not None
        self.provisional = coordinates if coordinates is not None else provisional
        self.stats = None
        self._first = True
        self.n_samples = 0
        self.n_tokens = 0
        self.dtype = np.dtype(np.float64)

    def add(self, X, lengths, Y=None, sample_weight=None, complete=None):
        """Add a validated chunk: zero-padded X, its lengths, targets as validated, weights.

        ``lengths`` None: X's values were not checked (readout "last"); its
        moments check them, and ``complete(X)`` (the validation's own check,
        with its messages) gives ``(X, lengths)`` when one is not finite.
        """
        X = np.asarray(X)
        if X.dtype.kind == "f" and X.dtype.itemsize < self.dtype.itemsize:
            self.dtype = X.dtype
        self.n_tokens = max(self.n_tokens, int(X.shape[1]))
        self.n_samples += X.shape[0] if sample_weight is None else int(
            np.count_nonzero(np.asarray(sample_weight) > 0))
        n_samples, n_tokens, d = X.shape
        per_sample = sample_values(d, n_tokens, self.readout, self._row_values)
        for sl in sample_chunks(n_samples, per_sample):
            sub = None if lengths is None else np.asarray(lengths)[sl]
            done = functools.partial(complete, offset=sl.start) if complete else None
            labels = None if self._groups is None else self._groups[
                self._seen + sl.start: self._seen + sl.stop]
            self._add(X[sl], sub, None if Y is None else Y[sl],
                      None if sample_weight is None else np.asarray(sample_weight)[sl], done,
                      labels)
        self._seen += n_samples
        self._first = False
        return self

    def _add(self, X, lengths, Y, w, complete, labels=None):
        X64 = np.asarray(X, dtype=np.float64)
        if self._tokens is not None:
            X64 = self._tokens.transform(X64)
        S_seq, e = sequence_moments(X64, check=lengths is None)
        if lengths is None:
            if S_seq is None:  # a value is not finite: the validation's own check
                X, lengths = complete(X)
                X64 = np.asarray(X, dtype=np.float64)
                S_seq, e = sequence_moments(X64)
            else:
                lengths = np.full(X.shape[0], X.shape[1], dtype=np.int64)
        # Whether the tokens are sparse (one-hot: not whitened) is judged on the
        # first chunk, at most 2**21 values: counting every chunk's non-zeros
        # would cost a read of X of its own.
        targets = None if Y is None else np.asarray(Y, dtype=np.float64)[
            slice(None) if w is None else w > 0]
        self.scales.add(S_seq, lengths, e, w, targets=targets,
                        tokens=X64 if self._first else None)
        if self._kept is None and not self._accumulate:
            return
        if self._kept is not None or labels is None:
            rows, e_rows = raw_rows(X64, lengths, self.readout, Y, w, S_seq, e, self.decays)
        if self._kept is not None:
            self._kept.append(rows, e_rows)
        if not self._accumulate:
            return
        if labels is None:
            self._accumulate_rows(X64, lengths, Y, w, rows, e_rows)
            return
        for group in np.unique(labels):
            # Each group's sequences give their own rows, from the same moments.
            idx = np.flatnonzero(labels == group)
            Yg = None if Y is None else np.asarray(Y)[idx]
            wg = None if w is None else np.asarray(w)[idx]
            rows, e_rows = raw_rows(X64[idx], lengths[idx], self.readout, Yg, wg, S_seq[idx], e,
                                     self.decays)
            self._accumulate_rows(X64[idx], lengths[idx], Yg, wg, rows, e_rows, group)

    def _accumulate_rows(self, X, lengths, Y, w, rows, e, group=0):
        """The rows of a sub-chunk into the statistics, in the provisional coordinates."""
        if self.provisional is None:
            # The first chunk's own coordinates (its scales so far are all of it).
            self.provisional = self.scales.finish()
        st = self.provisional
        if self.stats is None:
            self.stats = [self._make_statistics(standardizer=st) for _ in self._group_samples]
            groups = getattr(self.decays, "groups", None)
            if groups is not None and len(groups) > 1:
                for part in self.stats:
                    if part.has_gram:
                        part.gather_block_groups(groups)
        if self.stats is False:
            return  # out of the provisional coordinates' range: a second pass
        self._group_samples[group] += X.shape[0] if w is None else int(
            np.count_nonzero(np.asarray(w) > 0))
        mapped = standardized_rows(X, lengths, self.readout, st, Y=Y, sample_weight=w,
                                   terms=self._terms, raw=(rows, e))
        if not self._fixed and mapped.n_rows and not _moderate(mapped):
            self.stats = False
            return
        self.stats[group].add_rows(mapped)

    def merge(self, other):
        """Add the pass over other (disjoint) data in the same coordinates, in place.

        For the blocks of a distributed array: statistics accumulated in given
        coordinates (``coordinates``), no kept rows, no groups.
        """
        if self._kept is not None or other._kept is not None or self._groups is not None:
            raise ValueError("only passes without kept rows or groups merge.")
        self.scales.merge(other.scales)
        if self.dtype.itemsize > other.dtype.itemsize:
            self.dtype = other.dtype
        self.n_tokens = max(self.n_tokens, other.n_tokens)
        self.n_samples += other.n_samples
        self._group_samples += other._group_samples
        if self.stats is False or other.stats is False:
            self.stats = False  # out of the provisional coordinates' range: a second pass
        elif other.stats:
            if not self.stats:
                self.stats = [part.restandardized(part.standardizer) for part in other.stats]
            else:
                for part, more in zip(self.stats, other.stats):
                    part.merge(more)
        return self

    def statistics(self, standardizer):
        """The accumulated statistics in ``standardizer``'s coordinates, or None.

        None when they must be accumulated again (a second pass): rows beyond
        the provisional coordinates' range, or final coordinates too far from
        the provisional ones for an accurate map of the Gram matrix (the map
        of ``G`` rounds at ``eps cond(K)**2``, with ``K`` the map of the
        features, about ``cond(D)**3`` for the map D of the tokens).  With
        ``groups``, the statistics of all the groups together.
        """
        parts = self.group_statistics(standardizer)
        if parts is None:
            return None
        total = parts[0] if len(parts) == 1 else parts[0].restandardized(standardizer)
        for part in parts[1:]:
            total.merge(part)
        return total

    def group_statistics(self, standardizer):
        """The statistics of each group (a list) in ``standardizer``'s coordinates, or None.

        None when they must be accumulated again, as for :meth:`statistics`.
        """
        if not self.stats:
            return None
        parts = self.stats
        if not self._noted:
            self._noted = True
            counts = [self.n_samples] if self._groups is None else self._group_samples
            for part, n in zip(parts, counts):
                part.note_sequences(int(n), self.n_tokens, self.dtype)
        if parts[0].standardizer == standardizer:
            return parts
        if not map_is_accurate(feature_map(parts[0].standardizer, standardizer)[1]):
            return None
        return [part.restandardized(standardizer) for part in parts]

    def rows(self, standardizer, terms=None):
        """Every kept row in the standardizer's coordinates (targets with the term columns).

        Mapped in place (the pass keeps no second copy).  Only for
        coordinates whose map of moments is accurate (``not
        standardizer.collinear``): collinear tokens are read again
        (:func:`standardized_rows`).
        """
        if self._kept is None or standardizer.collinear:
            raise ValueError("the rows were not kept, or need the tokens again.")
        kept, self._kept = self._kept, None
        return kept.mapped(standardizer, terms)


class _KeptRows:
    """Rows kept from the pass: one preallocated array, filled chunk by chunk in their units."""

    def __init__(self, capacity, d, n_targets, n_blocks=1):
        self.S = np.empty((capacity, n_blocks * n_pairs(d)))
        self.x = np.empty((capacity, d))
        self.Y = np.empty((capacity, n_targets)) if n_targets else None
        self.w = None
        self.n = 0
        self.segments = []  # (start, stop, exponents of the chunk's units)

    def append(self, rows, e):
        m = rows.n_rows
        if self.n + m > self.S.shape[0]:
            raise ValueError(f"more rows than the {self.S.shape[0]} announced.")
        sl = slice(self.n, self.n + m)
        self.S[sl], self.x[sl] = rows.S, rows.x
        if rows.Y is not None:
            self.Y[sl, : rows.Y.shape[1]] = rows.Y
        if rows.w is not None:
            if self.w is None:
                self.w = np.ones(self.S.shape[0])
            self.w[sl] = rows.w
        self.segments.append((self.n, self.n + m, e))
        self.n += m

    def mapped(self, standardizer, terms):
        """The rows mapped into the standardizer's coordinates, in place."""
        n_real = None if self.Y is None else self.Y.shape[1] - (0 if not terms else terms.n_terms)
        for start, stop, e in self.segments:
            per_row = 2 * self.S.shape[1] + 3 * self.x.shape[1] ** 2  # map_moments unfolds
            for sl in sample_chunks(stop - start, per_row):
                sl = slice(start + sl.start, start + sl.stop)
                rows = FeatureRows(self.S[sl], self.x[sl], None,
                            None if self.Y is None else self.Y[sl, :n_real])
                mapped = map_rows(rows, e, standardizer, terms)
                self.S[sl], self.x[sl] = mapped.S, mapped.x
                if self.Y is not None:
                    self.Y[sl] = mapped.Y
        n = self.n
        w = None if self.w is None else standardizer.transform_weights(self.w[:n])
        return FeatureRows(self.S[:n], self.x[:n], w, None if self.Y is None else self.Y[:n])


def scales_pass(d_out, *, d, readout, decays=None, tokens=None):
    """An empty pass that gathers the scales only (``tokens``: of these standardized tokens).

    A module-level function, so that its partial runs on dask workers.
    """
    return MomentPass(d, None if tokens is not None else (d_out or None), readout,
                      decays=decays, tokens=tokens)


def coordinates(scales, source):
    """The standardized coordinates of a source's scales: the one place they are finished.

    Nearly collinear tokens get their whitening refined by the second moment
    of their own standardized tokens: one more pass over the source
    (:func:`~._units.refined_whitening`).
    """
    standardizer = scales.finish()
    if standardizer.collinear:
        again = source.reduce(functools.partial(scales_pass, d=standardizer.d,
                                                readout=source.readout, tokens=standardizer),
                              name="scales")
        standardizer = refined_whitening(standardizer, again.scales.second_moment())
    return standardizer


def _moderate(rows):
    """Whether rows stay far from overflow in the Gram matrix (their sixth powers)."""
    peak = max(float(np.abs(rows.S).max(initial=0.0)), float(np.abs(rows.x).max(initial=0.0)))
    return np.isfinite(peak) and peak < _MODERATE


def count_rows(lengths, readout, sample_weight):
    """Number of feature rows of positive weight: sequences for "last", real tokens for "all"."""
    rows = np.ones_like(lengths) if readout == "last" else lengths
    if sample_weight is not None:
        rows = rows[sample_weight > 0]
    return int(rows.sum())


@dataclass
class RowReader:
    """The feature rows of a least squares as the solvers on rows read them.

    Attributes
    ----------
    kept : FeatureRows or None
        Every row of positive weight in standardized coordinates (targets
        with the term columns), in float64, when the pass kept them.
    arrays : tuple or None
        ``(X, lengths, Y, sample_weight)``: the validated sequences (padded
        positions ignored by length) to compute rows from when ``kept`` is
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

    kept: FeatureRows | None
    arrays: tuple | None
    readout: str
    standardizer: object
    terms: object
    dtype: np.dtype
    n_rows: int
    _operators: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of_arrays(cls, X, lengths, Y=None, readout="last", sample_weight=None,
                  standardizer=None, terms=None):
        """The rows of in-memory sequences, computed as needed (tests, benchmarks)."""
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
    def weighted(self):
        """Whether the rows carry weights (else all weigh one)."""
        return (self.kept.w if self.kept is not None else self.arrays[3]) is not None

    @property
    def n_targets(self):
        """Number of target columns of the rows (term columns included); 0 without targets."""
        if self.kept is not None:
            return 0 if self.kept.Y is None else self.kept.Y.shape[1]
        Y = self.arrays[2]
        return (0 if Y is None else Y.shape[-1]) + (0 if self.terms is None else
                                                    self.terms.n_terms)

    def row_chunks(self, values_per_row):
        """The float64 rows in chunks of at most a memory chunk's worth."""
        if self.kept is not None:
            rows = self.kept
            for sl in sample_chunks(rows.n_rows, values_per_row):
                yield FeatureRows(rows.S[sl], rows.x[sl], None if rows.w is None else rows.w[sl],
                                  None if rows.Y is None else rows.Y[sl])
            return
        X, lengths, Y, w = self.arrays
        lengths = np.asarray(lengths)
        n_samples, n_tokens, d = X.shape
        rows_per_sample = 1 if self.readout == "last" else n_tokens
        for sl in sample_chunks(n_samples, rows_per_sample * values_per_row):
            yield standardized_rows(X[sl], lengths[sl], self.readout, self.standardizer,
                                    Y=None if Y is None else Y[sl],
                                    sample_weight=None if w is None else w[sl],
                                    terms=self.terms)

    def all_rows(self):
        """Every row at once (memory O(n_rows (P + d)))."""
        if self.kept is not None:
            return self.kept
        parts = list(self.row_chunks(2 * self.standardizer.n_moments + 2 * self.d))
        n_targets = parts[0].Y.shape[1] if parts and parts[0].Y is not None else None
        return FeatureRows.concatenate(parts, self.d, n_targets, self.standardizer.n_blocks)

    def gram_operator(self, cache_rule):
        """``G = Phi^T W Phi`` as products over these rows (:class:`ImplicitGram`).

        ``cache_rule(n_rows, d, n_blocks)`` gives the dtype of the cache of
        row factors that the operator's first pass fills (None: no cache);
        rows kept already are the cache.  The operator of a cache dtype is made
        once: a second solve (another penalty) reuses its cache and setup.
        """
        cache = None if self.kept is not None else cache_rule(
            self.n_rows, self.d, n_blocks=self.standardizer.n_blocks)
        key = None if cache is None else np.dtype(cache)
        if key not in self._operators:
            self._operators[key] = ImplicitGram(self, cache_dtype=cache)
        return self._operators[key]

    def release(self):
        """Drop the operators' row caches (the fit is done with them)."""
        self._operators.clear()


class ImplicitGram:
    """``G = Phi^T W Phi`` as products over the row factors; never formed.

    The rows come from a :class:`RowReader`: the fit's standardized rows
    in memory (then they are the cache: :meth:`matmat` is two GEMMs per
    chunk), or the sequences, whose rows each product recomputes
    (O(N n d^2) per pass) unless :meth:`setup` keeps them in ``cache_dtype``
    (``n_rows * (P + d + 1)`` values).  A float32 cache makes :meth:`matmat`
    inexact (relative error about 1e-7): :meth:`matmat_exact` then streams
    float64 products from the sequences, and :attr:`exact` is False.
    """

    def __init__(self, rows, cache_dtype=None):
        self.rows = rows
        self.n_rows = rows.n_rows
        self.d = rows.d
        self.P = rows.standardizer.n_moments
        self.psi = rows.standardizer.n_features
        self.cache_dtype = None if cache_dtype is None else np.dtype(cache_dtype)
        self._cache = None
        self._setup = None
        self._device = None  # the cache in another namespace: (namespace, S, x, w)
        self.n_products = 0
        kept = rows.kept
        if kept is not None:
            # Rows kept by the pass (float64) are the cache already.
            self._cache, self.cache_dtype = (kept.S, kept.x, kept.w), None

    @property
    def exact(self):
        """Whether :meth:`matmat` is a float64 product."""
        return self._cache is None or self._cache[0].dtype == np.float64

    @property
    def gram_product(self):
        """Exact products for whoever needs ``G V`` after the solve (the compression's judge)."""
        return self.matmat_exact

    def _chunks(self, k):
        """Exact (float64) rows, chunk by chunk."""
        yield from self.rows.row_chunks(self.P * (k + 2) + self.d * (k + 2))

    def matmat(self, V):
        """``G @ V`` for V of shape (psi, k), from the cache when there is one."""
        V = np.asarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat(V[:, None])[:, 0]
        if self._cache is None:
            return self.matmat_exact(V)
        self.n_products += 1
        S_all, x_all, w_all = self._cache
        k = V.shape[1]
        # Each column scaled by a power of two into [0.5, 1) of its largest entry:
        # exact, and a float32 cache cannot overflow on long CG directions.
        V, e = unit_scaled(V, axis=0)
        ns = active()
        if not ns.is_numpy:
            return pow2_scale(self._device_products(ns, V), e[:, None]).T
        out = np.zeros((k, self.psi))
        Vt = np.ascontiguousarray(V.T, dtype=S_all.dtype)
        for sl in sample_chunks(S_all.shape[0], 3 * self.d * k + k):
            S, x = S_all[sl], x_all[sl]
            U = features_matvec(S, x, Vt)
            if w_all is not None:
                U *= w_all[sl, None]
            out += features_rmatvec(S, x, U)
        return pow2_scale(out, e[:, None]).T

    def _device_products(self, ns, V):
        """``(G V)^T`` with the cache held in a namespace (moved there once, at the first product)."""
        if self._device is None or not self._device[0].same_as(ns):
            self._device = (ns,) + tuple(ns.asarray(a) for a in self._cache)
        _, S_all, x_all, w_all = self._device
        xp = ns.xp
        Vt = ns.asarray(np.ascontiguousarray(V.T), dtype=S_all.dtype)
        out = None
        for sl in sample_chunks(S_all.shape[0], 3 * self.d * V.shape[1] + V.shape[1],
                                budget=_DEVICE_CHUNK_VALUES):
            S, x = S_all[sl, ...], x_all[sl, ...]
            U = features_matvec_in(xp, S, x, Vt)
            if w_all is not None:
                U = U * w_all[sl, None]
            part = features_rmatvec_in(xp, S, x, U)
            out = part if out is None else out + part
        return as_numpy(out).astype(np.float64)

    def matmat_exact(self, V):
        """``G @ V`` in float64 (streamed from the sequences unless the cache is float64)."""
        V = np.asarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self.matmat_exact(V[:, None])[:, 0]
        if self.exact and self._cache is not None:
            return self.matmat(V)
        self.n_products += 1
        k = V.shape[1]
        out = np.zeros((k, self.psi))
        Vt = np.ascontiguousarray(V.T)
        for rows in self._chunks(k):
            if rows.n_rows == 0:
                continue
            U = features_matvec(rows.S, rows.x, Vt)
            if rows.w is not None:
                U *= rows.w[:, None]
            out += features_rmatvec(rows.S, rows.x, U)
        return out.T

    def setup(self, counts=None):
        """One pass: ``Phi^T W Y``, the Kronecker factors, the trace and the weight sum.

        ``counts`` (a RowCounts without rows yet) is filled from the same pass.
        Computed once: a second solve of the same operator (another penalty)
        reads the first one's.
        """
        if self._setup is not None:
            return self._setup
        A = np.zeros((self.P, self.P))
        B = np.zeros((self.d, self.d))
        b = None
        trace, n_rows, weight_sum = 0.0, 0, 0.0
        if self.cache_dtype is not None:
            total = self.n_rows
            weighted = self.rows.weighted
            cache = (np.empty((total, self.P), dtype=self.cache_dtype),
                     np.empty((total, self.d), dtype=self.cache_dtype),
                     np.empty(total, dtype=self.cache_dtype) if weighted else None)
        for rows in self._chunks(2):
            S, x, w, Yr = rows.S, rows.x, rows.w, rows.Y
            m = S.shape[0]
            if m == 0:
                continue
            if counts is not None:
                counts.add_rows(rows)
            if self.cache_dtype is not None:
                cache[0][n_rows : n_rows + m] = S
                cache[1][n_rows : n_rows + m] = x
                if w is not None:
                    cache[2][n_rows : n_rows + m] = w
            if w is None:
                Sw, xw, rw = S, x, np.ones(m)
            else:
                sw = np.sqrt(w)[:, None]
                Sw, xw, rw = S * sw, x * sw, w
            A += Sw.T @ Sw
            B += xw.T @ xw
            trace += float(rw @ (np.einsum("rp,rp->r", S, S) * np.einsum("rl,rl->r", x, x)))
            n_rows += m
            weight_sum += float(rw.sum())
            if Yr is not None:
                part = features_rmatvec(S, x, Yr * rw[:, None])
                b = part if b is None else b + part
        if self.cache_dtype is not None:
            self._cache = cache
        if b is None and self.rows.n_targets:
            b = np.zeros((self.rows.n_targets, self.psi))
        self._setup = dict(A=A, B=B, b=b, trace=trace, weight_sum=weight_sum)
        return self._setup
