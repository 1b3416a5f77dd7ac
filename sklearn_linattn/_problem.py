"""One least-squares problem in standardized coordinates: built in one pass over a source.

Every fit reads its training data through a *source*: NumPy chunks
(:class:`~._source.ArraySource`) or the blocks of a dask array
(:class:`~._dask.DaskSource`), each with one ``reduce`` that runs the fit's
accumulator (:class:`~._moments.MomentPass`) over the data.
:meth:`StandardizedProblem.from_source` is the one pass: the per-sequence
moments give the standardized coordinates (:func:`coordinates`) and, mapped
into them, the rows of the least squares or their sufficient statistics.
The problem then owns everything in those coordinates: the rows (or the
sequences to compute them from, or a dask array's persisted blocks), the
statistics, the counts, the term columns; :meth:`StandardizedProblem.solve`
hands them to a solver of the registry (plain arrays or statistics in, a
standardized solution out) and nothing is converted back to the data's units
here.

In memory the statistics are accumulated in the same pass, in the
coordinates of the first chunk, mapped into the final ones at the end (for
data of one chunk, at most 2**21 values, the two are the same).  The data
are read again only where the pass cannot do the work: final coordinates far
from the first chunk's, or a map of the Gram matrix dearer than reading the
moments again (large psi: a second pass accumulates the statistics in the
final coordinates), ``"cg"`` without room for a cache (every product reads
the sequences), ``"lsmr"`` (sparse rows from the tokens), and nearly
collinear tokens (whose whitening is refined on the standardized tokens, and
whose rows are formed from them).  The blocks of a dask array run in
parallel: they accumulate in the coordinates of the first block, gathered by
one task before the pass; for ``"cg"`` their scales are reduced first, then
their rows persisted in the final coordinates.

``partial_fit`` continues a :class:`FitState`: the statistics and scales of
every batch so far, into whose coordinates a new batch is accumulated
(``fit`` is a new state and one batch).
"""

import dataclasses
import functools

import numpy as np

from ._dask import DaskSource, is_dask_collection
from ._features import n_attention_features
from ._memory import n_pairs, zero_padding
from ._moments import MomentPass, RowReader, coordinates, scales_pass
from ._solvers import REGISTRY, RowCounts, SufficientStatistics, solve_statistics
from ._source import ArraySource
from ._terms import linear_columns

__all__ = ["ROWS_BUDGET", "FitState", "StandardizedProblem", "data_source", "keep_rows"]

# Rows a statistics solver keeps from the pass for a direct fit of few heads
# (bytes); such fits are only tried on small data anyway.
ROWS_BUDGET = 2**25


def data_source(X, y, sample_weight, *, readout, layout, n_features_in=None):
    """The source of training data: a dask array's blocks, or NumPy chunks (validated at once).

    ``layout`` holds ``token_dim`` and ``data_format``; ``n_features_in`` is
    the token dimension an earlier call fixed (``partial_fit``).
    """
    if is_dask_collection(X, y):
        return DaskSource(X, y, sample_weight, readout=readout, n_features_in=n_features_in,
                          **layout)
    return ArraySource(X, y, sample_weight, layout=layout, readout=readout,
                       n_features_in=n_features_in)


def with_linear_columns(source, n_lags):
    """The source with the linear term's columns appended to its targets (readout "last").

    The columns (:func:`~._terms.linear_columns`) are targets of the one
    solve, eliminated with the other terms; they need every token, so the
    data are validated and gathered at once.
    """
    parts = list(source.batches())
    X = np.concatenate([zero_padding(b[0], b[1]) for b in parts])
    lengths = np.concatenate([b[1] for b in parts])
    Y = np.concatenate([b[2] for b in parts])
    w = source.sample_weight
    out = ArraySource.validated(X, lengths, np.hstack([Y, linear_columns(X, lengths, n_lags)]),
                                w, readout=source.readout)
    out.layout, out.single_output = source.layout, source.single_output
    return out


def _start(d_out, *, d, readout, terms, decays, statistics=False, keep_rows=None,
           provisional=None, fixed=None, groups=None):
    """An empty pass for sources whose targets have ``d_out`` outputs (0: none).

    A module-level function so that its partial runs on dask workers.
    """
    make = None
    n_terms = 0 if terms is None else terms.n_terms
    terms = terms if n_terms else None
    if statistics:
        make = functools.partial(SufficientStatistics, d, (d_out + n_terms) or None,
                                 readout=readout, terms=terms)
    return MomentPass(d, d_out or None, readout, keep_rows=keep_rows, statistics=make,
                      terms=terms, provisional=provisional, coordinates=fixed, groups=groups,
                      decays=decays)


def _map_is_cheaper(source):
    """Whether statistics accumulated in the first chunk's coordinates should be mapped.

    Mapping the Gram matrix into the final coordinates costs about
    ``2 psi**2 (P + d)`` operations; reading the data again for a second pass
    (their moments, ``n_rows n d**2``) costs less when psi is large (d = 32
    and 20 000 sequences of 64 tokens: 3e11 against 1.3e9).  Data of one
    chunk need no map at all.  The blocks of a dask array run in parallel:
    the first block's coordinates stand for the first chunk's.
    """
    if not source.chunked:
        return True
    d, psi = source.d, n_attention_features(source.d)
    return 2.0 * psi * psi * (n_pairs(d) + d) <= 2.0 * source.n_samples * source.n_tokens * d * d


def _rows_bytes(n_rows, d, n_targets, n_blocks=1):
    return 8.0 * n_rows * (n_blocks * n_pairs(d) + d + 1 + n_targets)


def keep_rows(solver, n_rows, d, n_targets, memory_budget=None, *, direct=False, n_blocks=1):
    """Whether the pass keeps the (float64) rows for a solver.

    What the solver declares (:attr:`~._solvers.Solver.keeps_rows`); a
    statistics solver also keeps them when heads may be fitted to the rows
    directly (``direct``) and they take at most :data:`ROWS_BUDGET`.
    """
    spec = REGISTRY[solver]
    if spec.statistics:
        return direct and _rows_bytes(n_rows, d, n_targets, n_blocks) <= ROWS_BUDGET
    return spec.keeps_rows(n_rows, d, n_blocks, memory_budget)


class StandardizedProblem:
    """The least squares of a fit in standardized coordinates, and what solves it.

    Parameters
    ----------
    standardizer : TokenStandardizer
        The coordinates of the tokens (real outputs' and weights' scales).
    counts : RowCounts or None
        Row counts and the targets' energy, term columns included (None
        until a solver's own pass fills them, for rows that were not kept).
    readout : {"last", "all"}
    d_out : int
        Number of real outputs (0: a certificate of inputs alone).
    terms : LinearTerms
        Intercept and skip columns, the last targets.
    rows : RowReader, DaskRows or None
        What the solvers on rows read: the kept rows, the sequences to compute
        them from, or a dask array's blocks (None for statistics alone).
    stats : SufficientStatistics or None
        The statistics, for the statistics solvers.
    kept : FeatureRows or None
        Every row of positive weight, when the pass kept them.
    scales : MomentScales or None
        The magnitudes the coordinates came from (``partial_fit`` merges them).
    sequences : tuple
        ``(n_samples, n_tokens, dtype)`` the pass saw.
    """

    def __init__(self, standardizer, counts, *, readout, d_out, terms, rows=None, stats=None,
                 kept=None, scales=None, sequences=None):
        self.standardizer = standardizer
        self.counts = counts
        self.readout = readout
        self.d = standardizer.d
        self.d_out = int(d_out)
        self.terms = terms
        self.rows = rows
        self.stats = stats
        self.kept = kept
        self.scales = scales
        self._sequences = sequences
        self.group_stats = None
        # The last eigen-decomposition of the statistics: it serves every alpha
        # (a fit with terms and a penalty solves twice).
        self._previous = None

    @property
    def n_targets(self):
        """Target columns of the rows: the real outputs, then the term columns."""
        return self.d_out + self.terms.n_terms

    @classmethod
    def from_source(cls, source, *, readout, terms, solver, decays=None, keep=False,
                    groups=None, previous=None, fixed=None):
        """The problem of a source's training data, in one pass where possible.

        Parameters
        ----------
        source : ArraySource or DaskSource
        readout : {"last", "all"}
        terms : LinearTerms
        solver : str
            A name of the registry: its capabilities say what the pass keeps
            (statistics, or rows).
        decays : tuple of float or None
            Fixed decays of the feature blocks (None: one block, no decay).
        keep : bool
            Keep the rows from the pass, in float64 (for a statistics solver:
            for a direct fit of few heads).
        groups : ndarray of int, shape (n_samples,) or None
            With a statistics solver, a label ``0 .. n_groups - 1`` per
            sequence: the statistics of each group are accumulated in the same
            pass and the same (final) coordinates (``problem.group_stats``, a
            list), and ``problem.stats`` is their sum (cross-validation folds).
        previous : FitState or None
            The statistics of earlier batches (``partial_fit``): this batch is
            accumulated in their coordinates, merged into the coordinates of
            all the data, and the problem's statistics are the sum.
        fixed : TokenStandardizer or None
            Coordinates to use as they are (None: those of the data).
        """
        statistics = REGISTRY[solver].statistics
        if groups is not None and not statistics:
            raise ValueError("groups need a statistics solver.")
        d = source.d
        start = functools.partial(_start, d=d, readout=readout, terms=terms, decays=decays)
        given, provisional = fixed, None
        if previous is not None:
            provisional = previous.stats.standardizer
            if previous.scales is None:  # statistics given by hand keep their coordinates
                given = provisional
        # Accumulated in the first pass in coordinates known before it, or in those
        # of the first chunk (mapped at the end).
        accumulate = statistics and (given is not None or provisional is not None
                                     or _map_is_cheaper(source))
        if accumulate and given is None and provisional is None and not source.sequential:
            # Blocks run in parallel: they start from the first block's coordinates,
            # gathered before the pass (a read of that block alone).
            provisional = source.reduce(functools.partial(scales_pass, d=d, readout=readout,
                                                          decays=decays),
                                        head=True, name="head").scales.finish()
        if previous is not None and source.d_out is not None:
            previous.check_outputs(source.d_out)  # before the work, when the source knows
        n_keep = None
        if keep and source.sequential:
            n_keep = source.n_rows_bound()
        first = source.reduce(
            functools.partial(start, statistics=accumulate, keep_rows=n_keep,
                              provisional=provisional, fixed=given,
                              groups=groups if accumulate else None),
            first=True, name="pass" if accumulate else "scales")
        if previous is not None:
            previous.check_outputs(source.d_out)
        scales = first.scales
        if previous is not None and previous.scales is not None:
            scales = previous.scales.copy().merge(scales)
        standardizer = given if given is not None else coordinates(scales, source)
        stats = group_stats = None
        if statistics:
            group_stats = first.group_statistics(standardizer) if accumulate else None
            if group_stats is None:
                # The statistics in the final coordinates, in a pass of their own.
                again = source.reduce(functools.partial(start, statistics=True,
                                                        fixed=standardizer, groups=groups),
                                      name="statistics")
                group_stats = again.group_statistics(standardizer)
                if group_stats is None:
                    raise ValueError(
                        "the sufficient statistics overflow float64: some sequences are many "
                        "orders of magnitude larger than the rest of the data; rescale or "
                        "remove them.")
            stats = group_stats[0] if len(group_stats) == 1 else group_stats[0].restandardized(
                standardizer)  # a copy
            for part in group_stats[1:]:
                stats.merge(part)
            if previous is not None:
                stats = previous.stats.restandardized(standardizer).merge(stats)
        n_targets = source.d_out + terms.n_terms
        sequences = (first.n_samples, first.n_tokens, first.dtype)
        kept = None
        if n_keep is not None:
            if standardizer.collinear:
                # Rows of collinear tokens are formed from the standardized tokens.
                kept = source.rows(standardizer, terms, first.dtype).all_rows()
            else:
                kept = first.rows(standardizer, terms)
        counts = stats
        if counts is None and kept is not None:
            counts = RowCounts(d, n_targets or None, standardizer=standardizer, readout=readout,
                               terms=terms if terms else None)
            counts.note_sequences(*sequences)
            counts.add_rows(kept)
        if kept is not None:
            rows = RowReader(kept, None, readout, standardizer, terms if terms else None,
                             first.dtype, kept.n_rows)
        elif statistics:
            rows = None
        else:
            rows = source.rows(standardizer, terms, first.dtype)
        problem = cls(standardizer, counts, readout=readout, d_out=source.d_out, terms=terms,
                      rows=rows, stats=stats, kept=kept, scales=scales, sequences=sequences)
        if groups is not None:
            problem.group_stats = group_stats
        return problem

    @classmethod
    def from_statistics(cls, stats, *, d_out, terms):
        """The problem of sufficient statistics accumulated elsewhere (``partial_fit``, tests)."""
        return cls(stats.standardizer, stats, readout=stats.readout, d_out=d_out, terms=terms,
                   stats=stats)

    def with_terms(self, terms):
        """The problem of fewer linear terms, from these statistics (a new object).

        The Gram matrix is the same, so this problem's eigen-decomposition,
        when it has made one, serves the new one too; the moment, the
        targets' moments and the kept rows' targets keep the columns of
        ``terms`` (:meth:`~._terms.LinearTerms.target_columns`).
        """
        if terms == self.terms:
            return self
        # The linear term's columns are among the targets (d_out counts them).
        d_real = self.d_out - self.terms.n_window
        cols = terms.target_columns(d_real, self.terms)
        out = type(self).from_statistics(self.stats.target_columns(cols, terms),
                                         d_out=d_real + terms.n_window, terms=terms)
        if self.kept is not None:
            out.kept = dataclasses.replace(
                self.kept, Y=None if self.kept.Y is None else self.kept.Y[:, cols])
            # Operators cached on the rows hold the reader they were made from.
            out.rows = dataclasses.replace(self.rows, kept=out.kept, terms=terms or None,
                                           _operators={})
        if self.group_stats is not None:
            out.group_stats = [part.target_columns(cols, terms) for part in self.group_stats]
        out.scales = self.scales
        out._previous = self._previous
        return out

    # ------------------------------------------------------------------ solve

    def solve(self, solver, alpha=0.0, *, tol=1e-8, max_iter=None, memory_budget=None,
              residuals=False):
        """The standardized solution of one solver (:data:`~._solvers.REGISTRY`).

        ``alpha`` is the unit-free ridge penalty; ``residuals`` asks an
        iterative solver for what a rigorous bound of the term columns'
        certificate needs (``gram_coef``, ``normal_residual``).
        """
        spec = REGISTRY[solver]
        if spec.statistics:
            if self.stats.n_rows == 0:
                raise ValueError(
                    "every sequence has zero sample weight: there is nothing to fit.")
            solution = solve_statistics(self.stats, alpha, solver, previous=self._previous)
            if solution.method == "eigh" and solution.eigenvectors is not None:
                self._previous = solution
            return solution
        if self.rows.n_rows == 0:
            raise ValueError("every sequence has zero sample weight: there is nothing to fit.")
        options = dict(tol=tol, max_iter=max_iter, memory_budget=memory_budget,
                       residuals=residuals)
        if self.counts is None:
            fill = RowCounts(self.d, self.n_targets or None, standardizer=self.standardizer,
                             readout=self.readout, terms=self.terms if self.terms else None)
            fill.note_sequences(*self._sequences)
            if spec.counts_rows:  # the solver counts the rows in its own first pass
                options["counts"] = fill
            else:
                for rows in self.rows.row_chunks(2 * self.standardizer.n_moments + 2 * self.d):
                    fill.add_rows(rows)
            self.counts = fill
        solution = spec.function(self.rows, alpha, options)
        solution.counts = self.counts
        return solution

    def release(self):
        """Drop what the solves cached (row caches; a dask array's persisted blocks)."""
        if self.rows is not None:
            self.rows.release()


class FitState:
    """What a fit carries from one call to the next: the statistics of every batch, their scales.

    ``fit`` is a new state and one batch; ``partial_fit`` adds a batch to
    the state it continues (:meth:`problem`, then :meth:`commit` once the fit
    succeeded, so that a batch that fails leaves the model as it was).

    Parameters
    ----------
    stats : SufficientStatistics
        The statistics of all the batches so far (their ``readout`` and
        ``terms`` included).
    scales : MomentScales or None
        Their magnitudes; None for statistics given by hand, whose
        coordinates are kept as they are.
    decays : tuple of float or None
    """

    def __init__(self, stats, scales, decays):
        self.stats, self.scales, self.decays = stats, scales, decays

    @property
    def d(self):
        return self.stats.d

    def check(self, *, readout, intercept, skip, decays):
        """Refuse a batch fitted with other settings than the earlier ones."""
        terms = self.stats.terms
        earlier = (bool(terms and terms.intercept), bool(terms and terms.skip))
        if earlier != (bool(intercept), bool(skip)):
            raise ValueError(
                "fit_intercept and fit_skip must stay as they were between calls to "
                f"partial_fit (fit_intercept={earlier[0]}, fit_skip={earlier[1]}); call fit "
                "to start afresh.")
        if self.stats.standardizer.decays != decays:
            raise ValueError(
                f"decay must stay {self.stats.standardizer.decays!r} between calls to "
                f"partial_fit; got decay={decays!r}. Call fit to start afresh.")
        if self.stats.readout != readout:
            raise ValueError(
                f"readout must stay {self.stats.readout!r} between calls to partial_fit; "
                f"got readout={readout!r}. Call fit to start afresh.")

    def check_outputs(self, d_out):
        """Refuse a batch with another number of outputs than the earlier ones."""
        n_terms = 0 if self.stats.terms is None else self.stats.terms.n_terms
        if d_out + n_terms != self.stats.d_out:
            raise ValueError(
                f"y has {d_out} output(s), but partial_fit was started with "
                f"d_out={self.stats.d_out - n_terms}.")

    @staticmethod
    def committed(problem, previous=None):
        """The state after a successful fit of ``problem`` (None: its solver keeps none)."""
        if problem.stats is None:
            return None
        scales = problem.scales
        if previous is not None and previous.scales is None:
            scales = None  # statistics given by hand keep their coordinates
        return FitState(problem.stats, scales, problem.standardizer.decays)
