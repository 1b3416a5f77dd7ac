"""One least-squares problem in standardized coordinates: built in one pass, solved by any solver.

:meth:`StandardizedProblem.from_data` reads the validated training data once
(:class:`~._moments.MomentPass`): the per-sequence moments give the
standardized coordinates and, mapped into them, the rows of the least
squares.  The problem then owns everything in those coordinates: the rows
(or their sufficient statistics), the counts, the term columns; every solver
reads it through :meth:`StandardizedProblem.solve` (plain arrays or
statistics in, a standardized solution out) and nothing is converted back
to the data's units here.

The statistics solvers accumulate their statistics in the same pass, in the
coordinates of the first chunk, mapped into the final ones at the end (for
data of one chunk, at most 2**21 values, the two are the same).  The data
are read again only where the pass cannot do the work: final coordinates
far from the first chunk's, or a map of the Gram matrix dearer than reading
the moments again (large psi: a second pass accumulates the statistics in
the final coordinates), ``"cg"`` without room for a cache (every product reads the
sequences), ``"lsmr"`` (sparse rows from the tokens), and nearly collinear
tokens (whose whitening is refined on the standardized tokens, and whose
rows are formed from them).
"""

import numpy as np

from ._features import n_attention_features
from ._memory import n_pairs, zero_padding
from ._moments import MomentPass
from ._solvers import (
    REGISTRY,
    Design,
    RowCounts,
    SufficientStatistics,
    check_solver_memory,
    choose_solver,
    solve_statistics,
)
from ._solvers._rows import count_rows
from ._solvers._solution import dense_solution
from ._solvers.cg import cg_cache_dtype
from ._standardize import MomentScales, refined_whitening
from ._terms import LinearTerms

__all__ = ["ROWS_BUDGET", "SequenceData", "StandardizedProblem", "keep_rows", "solve_arrays"]

# Rows a statistics solver keeps from the pass for a direct fit of few heads
# (bytes); such fits are only tried on small data anyway.
ROWS_BUDGET = 2**25


class SequenceData:
    """Validated in-memory sequences, read as a fit reads its training data.

    ``(X, lengths, Y, sample_weight)`` as the package's validation returns
    them (zero- or NaN-padded X, targets or None, weights or None).
    """

    def __init__(self, X, lengths, Y=None, sample_weight=None, readout="last"):
        self.X, self.lengths, self.Y, self.sample_weight = X, lengths, Y, sample_weight
        self.readout = readout

    def solver_batches(self, defer=False):
        """The data as one batch ``(X, lengths, Y, w)``, zero-padded (checked already: with
        ``defer``, ``(X, lengths, Y, w, None)``); the pass reads it in chunks of its own."""
        batch = (zero_padding(self.X, self.lengths), self.lengths, self.Y, self.sample_weight)
        yield batch + (None,) if defer else batch

    def n_rows_bound(self, n_tokens=None):
        """Number of feature rows of positive weight."""
        return count_rows(self.lengths, self.readout, self.sample_weight)

    def arrays(self, copy=False):
        """The whole data (padded positions ignored by length)."""
        return self.X, self.lengths, self.Y, self.sample_weight


class _Lazy:
    """A value computed on first use."""

    def __init__(self, make):
        self._make, self._value = make, None

    @property
    def value(self):
        if self._make is not None:
            self._value, self._make = self._make(), None
        return self._value


def _map_is_cheaper(data, shape):
    """Whether statistics accumulated in the first chunk's coordinates should be mapped.

    Mapping the Gram matrix into the final coordinates costs about
    ``2 psi**2 (P + d)`` operations; reading the data again for a second pass
    (their moments, ``n_rows n d**2``) costs less when psi is large (d = 32
    and 20 000 sequences of 64 tokens: 3e11 against 1.3e9).  Data of one
    chunk need no map at all.
    """
    if not getattr(data, "chunked", False):
        return True
    n_samples, n_tokens, d = data.n_samples, shape[1], shape[2]
    psi = n_attention_features(d)
    return 2.0 * psi * psi * (n_pairs(d) + d) <= 2.0 * n_samples * n_tokens * d * d


def _first_shape(data):
    """Shape of the first validated chunk (peeked without consuming the data)."""
    first = getattr(data, "first", None)
    if first is not None:
        return first()[0].shape
    return data.arrays(False)[0].shape


def _rows_bytes(n_rows, d, n_targets, n_blocks=1):
    return 8.0 * n_rows * (n_blocks * n_pairs(d) + d + 1 + n_targets)


def keep_rows(solver, n_rows, d, n_targets, memory_budget=None, *, direct=False, n_blocks=1):
    """Whether the pass keeps the (float64) rows for a solver.

    Statistics solvers accumulate their statistics in the pass and keep no
    rows, unless ``direct`` (heads may be fitted to the rows directly) and
    they take at most :data:`ROWS_BUDGET`; ``"svd"`` and ``"dual"`` always
    (their design is larger still); ``"cg"`` float64 rows when its cache is
    float64 (the rows are the cache), else none: a float32 cache is filled
    by the solver's own pass, which keeps no float64 rows of twice its size;
    ``"lsmr"`` none (its sparse rows come from the tokens).
    """
    spec = REGISTRY[solver]
    if spec.sparse_only:
        return False
    if spec.statistics:
        return direct and _rows_bytes(n_rows, d, n_targets, n_blocks) <= ROWS_BUDGET
    if spec.reads_in_place:  # "cg": its cache
        return cg_cache_dtype(n_rows, d, memory_budget, n_blocks) == np.float64
    return True


def _group_statistics_again(data, make, standardizer, groups, readout, d, d_out, terms):
    """The groups' statistics accumulated in a second pass, in the final coordinates."""
    again = MomentPass(d, d_out if d_out else None, readout, statistics=make,
                       terms=terms if terms else None, provisional=standardizer, groups=groups,
                       decays=standardizer.decays)
    for X, lengths, Y, w in data.solver_batches():
        again.add(zero_padding(X, np.asarray(lengths)), lengths, Y if d_out else None, w)
    parts = again.group_statistics(standardizer)
    if parts is None:
        raise ValueError(
            "the sufficient statistics overflow float64: some sequences are many orders of "
            "magnitude larger than the rest of the data; rescale or remove them.")
    return parts


class StandardizedProblem:
    """The least squares of a fit in standardized coordinates, and what solves it.

    Parameters
    ----------
    standardizer : TokenStandardizer
        The coordinates of the tokens (real outputs' and weights' scales).
    counts : RowCounts
        Row counts and the targets' energy, term columns included (None
        until a solver's pass fills them, for rows that were not kept).
    readout : {"last", "all"}
    d_out : int or None
        Number of real outputs (0: a certificate of inputs alone; None: read
        from the counts an external solver returns).
    terms : LinearTerms
        Intercept and skip columns, the last targets.
    rows : Rows or None
        Every row of positive weight, when kept.
    stats : SufficientStatistics or None
        The statistics, when accumulated (or given: Dask, ``partial_fit``).
    arrays : tuple or None
        ``(X, lengths, Y, sample_weight)``, the validated sequences for a
        second pass; None when the problem holds only statistics.
    scales : MomentScales or None
        The magnitudes the coordinates came from (``partial_fit`` merges them).
    external : callable or None
        ``external(alpha, tol=..., max_iter=..., residuals=...)`` returns the
        solution of a solver that runs elsewhere (``"cg"`` on the blocks of a
        dask array), with its counts.
    """

    def __init__(self, standardizer, counts, *, readout, d_out, terms, rows=None, stats=None,
                 arrays=None, scales=None, external=None):
        if isinstance(arrays, tuple):
            given = arrays
            arrays = _Lazy(lambda: given)
        self.standardizer = standardizer
        self.counts = counts
        self.readout = readout
        self.d = standardizer.d
        self._d_out = None if d_out is None else int(d_out)
        self.terms = terms
        self.rows = rows
        self.stats = stats
        self._arrays = arrays
        self.scales = scales
        self._external = external
        self.group_stats = None
        # (statistics, solver, solution) of the last eigen-decomposition: it
        # serves every alpha (a fit with terms and a penalty solves twice).
        self._spectrum = None

    @property
    def d_out(self):
        """Number of real outputs (known after the solve for an external solver)."""
        if self._d_out is None:
            return self.counts.d_out - self.terms.n_terms
        return self._d_out

    @property
    def n_targets(self):
        """Target columns of the rows: the real outputs, then the term columns."""
        return self.d_out + self.terms.n_terms

    @classmethod
    def from_data(cls, data, *, readout, d_out, terms, keep=False, statistics=False,
                  previous=None, standardizer=None, provisional=None, groups=None,
                  decays=None):
        """The problem of validated training data, in one pass where possible.

        Parameters
        ----------
        data : object
            ``solver_batches()`` yields validated ``(X, lengths, Y, w)``
            chunks (zero-padded X); ``arrays(copy)`` returns them whole (for a
            second pass, padded positions ignored by length).
        readout : {"last", "all"}
        d_out : int
            Real outputs (0: no targets).
        terms : LinearTerms
        keep : bool
            Keep the rows from the pass, in float64 (:func:`keep_rows`).
        statistics : bool
            Accumulate the sufficient statistics in the pass (memory that
            does not grow with the data), for the statistics solvers.
        previous : MomentScales or None
            Scales of earlier data to merge into the coordinates
            (``partial_fit``).
        standardizer : TokenStandardizer or None
            Coordinates to use as they are (statistics given by hand, which
            keep theirs); None: those of the data (and ``previous``).
        provisional : TokenStandardizer or None
            Coordinates to accumulate the statistics in during the pass (None:
            those of the first chunk); mapped into the final ones at the end.
        groups : ndarray of int, shape (n_samples,) or None
            With ``statistics``: a label ``0 .. n_groups - 1`` per sequence;
            the statistics of each group are accumulated in the same pass and
            the same (final) coordinates (``problem.group_stats``, a list),
            and ``problem.stats`` is their sum (cross-validation folds).
        decays : tuple of float or None
            Fixed decays of the feature blocks (None: one block, no decay);
            those of ``standardizer`` or ``provisional`` when given.
        """
        known = standardizer if standardizer is not None else provisional
        if known is not None:
            decays = known.decays
        if groups is not None and not statistics:
            raise ValueError("groups need statistics=True.")
        n_targets = d_out + terms.n_terms
        make = None
        if statistics:
            def make(st):
                stats = SufficientStatistics(st.d, n_targets or None, standardizer=st)
                stats.readout = readout
                stats.terms = terms if terms else None
                return stats
        shape = _first_shape(data)
        accumulate = make if statistics and (
            known is not None or _map_is_cheaper(data, shape)) else None
        moments = MomentPass(
            shape[2], d_out if d_out else None, readout,
            keep_rows=data.n_rows_bound(shape[1]) if keep else None,
            statistics=accumulate, terms=terms if terms else None,
            provisional=standardizer if standardizer is not None else provisional,
            groups=groups, decays=decays)
        for X, lengths, Y, w, complete in data.solver_batches(defer=True):
            moments.add(X, lengths, Y if d_out else None, w, complete)
        d = moments.d
        scales = moments.scales if previous is None else previous.copy().merge(moments.scales)
        if standardizer is None:
            standardizer = scales.finish()
            if standardizer.collinear:
                # Nearly collinear tokens: the standardized tokens' own second moment
                # refines the whitening (and their rows are formed from them).
                again = MomentScales(d)
                for X, lengths, _, w in data.solver_batches():
                    again.update(standardizer.transform(X), lengths, sample_weight=w)
                standardizer = refined_whitening(standardizer, again.second_moment())
        # The whole data, for a second pass (read on demand: for chunked data
        # this validates the chunks again).
        arrays = _Lazy(lambda: data.arrays(False))
        sequences = (moments.n_samples, moments.n_tokens, moments.dtype)
        rows = None
        if keep:
            if standardizer.collinear:
                design = Design(None, arrays.value, readout, standardizer, terms,
                                moments.dtype, 0)
                rows = design.all_rows()
            else:
                rows = moments.rows(standardizer, terms)
        group_stats = None
        if groups is not None:
            group_stats = moments.group_statistics(standardizer)
            if group_stats is None:
                group_stats = _group_statistics_again(data, make, standardizer, groups,
                                                      readout, d, d_out, terms)
            stats = group_stats[0].restandardized(standardizer)  # a copy
            for part in group_stats[1:]:
                stats.merge(part)
        else:
            stats = moments.statistics(standardizer) if statistics else None
        if statistics and stats is None:
            # The provisional coordinates were too far from the final ones.
            stats = make(standardizer)
            X, lengths, Y, w = arrays.value
            stats.update(X, lengths, Y if d_out else None, readout=readout, sample_weight=w,
                         terms=terms if terms else None)
        counts = stats
        if counts is None and rows is not None:
            counts = RowCounts(d, n_targets or None, standardizer=standardizer)
            counts.readout = readout
            counts.terms = terms if terms else None
            counts.note_sequences(*sequences)
            counts.add_rows(rows)
        problem = cls(standardizer, counts, readout=readout, d_out=d_out, terms=terms,
                      rows=rows, stats=stats, arrays=arrays, scales=scales)
        problem._sequences = sequences
        problem.group_stats = group_stats
        return problem

    @classmethod
    def from_statistics(cls, stats, *, d_out, terms):
        """The problem of sufficient statistics accumulated elsewhere (Dask, ``partial_fit``)."""
        return cls(stats.standardizer, stats, readout=stats.readout, d_out=d_out, terms=terms,
                   stats=stats)

    # ------------------------------------------------------------------ data

    @property
    def arrays(self):
        """``(X, lengths, Y, sample_weight)`` of the validated data (None: statistics only)."""
        return None if self._arrays is None else self._arrays.value

    def design(self):
        """The rows as the solvers that read rows see them."""
        n_rows = self.rows.n_rows if self.rows is not None else (
            self.counts.n_rows if self.counts is not None else count_rows(
                self.arrays[1], self.readout, self.arrays[3]))
        dtype = self._sequences[2] if hasattr(self, "_sequences") else np.dtype(np.float64)
        return Design(self.rows, self.arrays, self.readout, self.standardizer,
                      self.terms if self.terms else None, np.dtype(dtype), n_rows)

    def statistics(self):
        """``Phi^T W Phi`` and ``Phi^T W Y`` (from the kept rows, else one more pass)."""
        if self.stats is None:
            stats = SufficientStatistics(self.d, self.n_targets or None,
                                         standardizer=self.standardizer)
            stats.readout = self.readout
            stats.terms = self.terms if self.terms else None
            if self.rows is not None:
                stats.add_rows(self.rows)
                n_samples, n_tokens, dtype = self._sequences
                stats.note_sequences(n_samples, n_tokens, dtype)
            else:
                X, lengths, Y, w = self.arrays
                stats.update(X, lengths, Y if self.d_out else None, readout=self.readout,
                             sample_weight=w, terms=self.terms if self.terms else None)
            self.stats = stats
            self.counts = stats
        return self.stats

    # ------------------------------------------------------------------ solve

    def solve(self, solver, alpha=0.0, *, tol=1e-8, max_iter=None, memory_budget=None,
              residuals=False):
        """The standardized solution of one solver (:data:`~._solvers.REGISTRY`).

        ``alpha`` is the unit-free ridge penalty; ``residuals`` asks an
        iterative solver for what a rigorous bound of the term columns'
        certificate needs (``gram_coef``, ``normal_residual``).
        """
        if self._external is not None:
            solution = self._external(alpha, tol=tol, max_iter=max_iter, residuals=residuals)
            self.counts = solution.counts
            return solution
        spec = REGISTRY[solver]
        if spec.statistics:
            stats = self.statistics()
            if stats.n_rows == 0:
                raise ValueError(
                    "every sequence has zero sample weight: there is nothing to fit.")
            cached = self._spectrum
            if cached is not None and cached[0] is stats and cached[1] == solver:
                # The same eigen-decomposition of G, another alpha: what the
                # solver would compute again (its choice does not depend on alpha).
                w, U = cached[2].eigenvalues, cached[2].eigenvectors
                solution = dense_solution(w, U, stats.moment, alpha, stats.dtype, "eigh",
                                          stats.standardizer)
                solution.counts = stats
                return solution
            solution = solve_statistics(stats, alpha, solver)
            if solution.method == "eigh" and solution.eigenvectors is not None:
                self._spectrum = (stats, solver, solution)
            return solution
        design = self.design()
        if design.n_rows == 0:
            raise ValueError("every sequence has zero sample weight: there is nothing to fit.")
        options = dict(tol=tol, max_iter=max_iter, memory_budget=memory_budget,
                       residuals=residuals)
        fill = None
        if self.counts is None:
            fill = self._empty_counts()
            if spec.reads_in_place:  # "cg" counts its rows in its own first pass
                options["counts"] = fill
            else:
                for rows in design.row_chunks(2 * self.standardizer.n_moments + 2 * self.d):
                    fill.add_rows(rows)
            self.counts = fill
        solution = spec.function(design, alpha, options)
        solution.counts = self.counts
        return solution

    def _empty_counts(self):
        counts = RowCounts(self.d, self.n_targets or None, standardizer=self.standardizer)
        counts.readout = self.readout
        counts.terms = self.terms if self.terms else None
        counts.note_sequences(*self._sequences)
        return counts


def solve_arrays(X, lengths, Y, *, readout="last", alpha=0.0, solver="auto",
                 sample_weight=None, tol=1e-8, max_iter=None, memory_budget=None,
                 standardizer=None):
    """The standardized solution of in-memory arrays, in one call.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Padded sequences (float32 or float64); values at positions
        ``>= lengths`` are ignored.
    lengths : ndarray of shape (n_samples,)
    Y : ndarray or None
        Targets as returned by ``check_targets``; None computes the spectrum
        only (for the certificate).
    readout : {"last", "all"}
    alpha : float
        The unit-free ridge penalty.
    solver : {"auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr"}
        ``"lsmr"`` (sparse rows, for one-hot data) is never chosen by ``"auto"``.
    sample_weight : ndarray of shape (n_samples,) or None
        Non-negative weight of each sequence (of all its rows for ``"all"``).
    tol, max_iter : float, int or None
        Stopping rule of ``"cg"``; ``max_iter`` also caps ``"lsmr"``.
    memory_budget : int or None
        For ``"auto"``, the memory check of an explicit solver and the
        certificate of ``"lsmr"``.
    standardizer : TokenStandardizer or None
        The standardized coordinates; None computes them from X.

    Returns
    -------
    solution : SpectralSolution
        In the standardized coordinates ``solution.standardizer``
        (``solution.standardizer.coef_to_user(solution.coef)`` in the data's
        units), with ``counts``.

    Raises
    ------
    ValueError
        When the solver's dense arrays would not fit the memory budget (the
        message says which solvers would), or every row has zero weight.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._problem import solve_arrays
    >>> X = np.random.default_rng(0).normal(size=(30, 4, 2))
    >>> Y = X[:, -1, :1] * (X[:, :, :1] ** 2).sum(axis=1)
    >>> coefs = [solve_arrays(X, np.full(30, 4), Y, solver=s).coef
    ...          for s in ("eigh", "cholesky", "svd", "dual", "cg")]
    >>> all(np.allclose(c, coefs[0], atol=1e-7) for c in coefs)
    True
    """
    d = X.shape[2]
    psi = n_attention_features(d)
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
    n_rows = count_rows(lengths, readout, sample_weight)
    solver = choose_solver(solver, n_rows, psi, memory_budget=memory_budget)
    if solver not in REGISTRY:
        raise ValueError(f"solver must be one of {tuple(REGISTRY)}; got {solver!r}.")
    check_solver_memory(solver, n_rows, psi, memory_budget)
    d_out = 0 if Y is None else Y.shape[-1]
    problem = StandardizedProblem.from_data(
        SequenceData(X, np.asarray(lengths), Y, sample_weight, readout), readout=readout,
        d_out=d_out,
        terms=LinearTerms(d), keep=keep_rows(solver, n_rows, d, d_out, memory_budget),
        standardizer=standardizer)
    return problem.solve(solver, alpha, tol=tol, max_iter=max_iter, memory_budget=memory_budget)
