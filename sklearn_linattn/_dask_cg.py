"""``solver="cg"`` on dask arrays: every product with G a map-reduce over persisted blocks.

The statistics path (:mod:`._dask`) sums psi x psi Gram matrices, which
stops where psi**2 doubles no longer fit one machine (d = 40: psi = 32 800,
8.6 GB per matrix).  Here nothing of size psi**2 exists anywhere.  Every
block of whole sequences is validated once by a task on its worker, which
keeps the block's row factors there (the ``"cg"`` cache of
:class:`~._solvers.cg._ImplicitGram`, in float64 or float32 as the
worker's memory budget allows) together with the block's counts and its
share of the preconditioner's Kronecker factors and of ``Phi^T W Y``.  The
client then runs exactly the in-memory ``"cg"`` algorithm
(:func:`~._solvers.cg.solve_implicit`: the fit's block CG with the
certificate's probes, Lanczos for lambda_max, LOBPCG when the interval on
lambda_min is undecided) on an operator whose products ``G V`` send V
(psi x k) to the blocks and sum their ``G_block V`` in a tree.  Only
vectors of length psi and the small factors (P x P and d x d) travel.

One CG pass is one round trip to the cluster; the blocks' products run in
parallel on the workers.  A ``distributed`` scheduler is what this is for
(the blocks stay on their workers between passes); the threaded scheduler
works too, in one process.  Under the multiprocessing scheduler every pass
would ship the blocks again, so it is refused.
"""

import itertools
import time
import uuid

import numpy as np

from ._dask import _check_outputs, _compute, _distributed_client, _on_block, block_tasks, \
    tree_reduce
from ._solvers import Design, RowCounts
from ._solvers._rows import count_rows
from ._solvers.cg import _ImplicitGram, cg_cache_dtype, solve_implicit
from ._terms import LinearTerms

__all__ = ["dask_solve_cg"]

_PRODUCTS = itertools.count()


class _BlockRows:
    """The rows of one block on its worker: cached row factors, counts, setup sums."""

    def __init__(self, X, lengths, Y, w, *, readout, standardizer, terms, memory_budget):
        d = X.shape[2]
        extra = LinearTerms(d, intercept=terms[0], skip=terms[1])
        self.counts = RowCounts(d, Y.shape[-1] + extra.n_terms, standardizer=standardizer)
        self.counts.readout = readout
        self.counts.terms = extra if extra else None
        self.counts.note_sequences(X.shape[0] if w is None else int(np.count_nonzero(w > 0)),
                                   X.shape[1], X.dtype)
        self.op = self.setup = None  # a block without rows of positive weight adds nothing
        n_rows = count_rows(lengths, readout, w)
        if n_rows:
            design = Design(None, (X, lengths, Y, w), readout, standardizer,
                            extra if extra else None, self.counts.dtype, n_rows)
            self.op = _ImplicitGram(design, cache_dtype=cg_cache_dtype(n_rows, d, memory_budget))
            self.setup = self.op.setup(self.counts)

    def __sizeof__(self):
        # What the scheduler weighs before moving a block: without it the block
        # looks tiny, and work stealing would ship caches between workers.
        arrays = [] if self.op is None else list(self.op.design.arrays)
        if self.op is not None and self.op._cache is not None:
            arrays += list(self.op._cache)
        arrays += [] if self.setup is None else list(self.setup.values())
        return object.__sizeof__(self) + sum(
            a.nbytes for a in arrays if isinstance(a, np.ndarray))


def _block_rows(X, y, sample_weight, offset, *, readout, token_dim, n_features_in, data_format,
                standardizer, terms, memory_budget):
    """Validate one block and keep its row factors (a persisted task on a worker)."""
    def rows(X, lengths, Y, w):
        return _BlockRows(X, lengths, Y, w, readout=readout, standardizer=standardizer,
                          terms=terms, memory_budget=memory_budget)
    return _on_block(rows, X, y, sample_weight, offset, readout=readout, token_dim=token_dim,
                     n_features_in=n_features_in, data_format=data_format)


def _block_summary(part):
    """What the client needs of a block: setup sums, counts, exactness, output layout."""
    if part is None:
        return None
    rows, single = part
    return (rows.setup, rows.counts, rows.op is None or rows.op.exact), single


def _merge_summaries(*parts):
    """Sum block summaries into new objects (the inputs stay untouched)."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    (_, counts, exact), single = parts[0]
    total = None
    merged = RowCounts(counts.d, counts.d_out, standardizer=counts.standardizer)
    for (part_setup, part_counts, part_exact), part_single in parts:
        _check_outputs(counts.d_out, single, part_counts.d_out, part_single)
        if part_setup is not None:
            total = dict(part_setup) if total is None else {
                key: None if value is None else value + part_setup[key]
                for key, value in total.items()}
        merged.merge(part_counts)
        exact = exact and part_exact
    return (total, merged, exact), single


def _block_product(part, V, exact):
    """``G_block V`` (psi x k) of one block, or None for an empty block."""
    op = None if part is None else part[0].op
    if op is None:
        return None
    return op.matmat_exact(V) if exact else op.matmat(V)


def _sum_products(*parts):
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


class _DaskGram:
    """``G = sum_blocks G_block`` as products over the persisted blocks (the "cg" operator)."""

    def __init__(self, blocks, psi, exact, *, split_every, deadline, name, timeout=None):
        self.blocks, self.psi, self.exact = blocks, psi, exact
        self.split_every, self.deadline, self.name = split_every, deadline, name
        self.timeout = timeout
        self.n_products = 0

    def _remaining(self):
        """Seconds left before the deadline (None: no deadline); raises once it has passed.

        Checked before every product: each one may be far shorter than the
        polls of ``_compute``, which alone would never see the deadline.
        """
        if self.deadline is None:
            return None
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"the dask computation did not finish within timeout={self.timeout} s "
                "(the dask config key 'sklearn-linattn.timeout')."
            )
        return remaining

    def _product(self, V, exact):
        import dask

        V = np.ascontiguousarray(V, dtype=np.float64)
        if V.ndim == 1:
            return self._product(V[:, None], exact)[:, 0]
        remaining = self._remaining()
        client = _distributed_client()
        # Scattered once to every worker, not embedded in each block's task.
        shared = client.scatter(V, broadcast=True) if client is not None else V
        index = next(_PRODUCTS)
        parts = [
            dask.delayed(_block_product)(block, shared, exact,
                                         dask_key_name=f"linattn-cg-{self.name}-{index}-{i}")
            for i, block in enumerate(self.blocks)
        ]
        total = tree_reduce(parts, _sum_products, f"cg-sum-{self.name}-{index}",
                            self.split_every)
        out = _compute(total, remaining)
        self.n_products += 1
        return np.zeros_like(V) if out is None else out

    def matmat(self, V):
        """``G @ V`` from the blocks' caches (float32 ones inexact)."""
        return self._product(V, False)

    def matmat_exact(self, V):
        """``G @ V`` in float64 (blocks with a float32 cache stream from their X)."""
        return self._product(V, True)


def _release(blocks):
    """Drop the workers' copies of the persisted blocks now.

    Deleting the client's references is not enough: an exception's
    traceback (kept by a notebook as ``sys.last_traceback``, or by a caller
    that stores the error) holds the frames that refer to the blocks, so the
    workers would keep every block's cache for as long as the error lives.
    """
    client = _distributed_client()
    if client is None:
        return
    from distributed import futures_of

    futures = futures_of(blocks)
    if futures:
        client.cancel(futures)


def _check_scheduler():
    import dask

    scheduler = dask.base.get_scheduler()
    module = getattr(scheduler, "__module__", "") or ""
    if module.startswith("dask.multiprocessing"):
        raise ValueError(
            "solver='cg' on dask input keeps every block on its worker between CG passes; "
            "the multiprocessing scheduler would ship the blocks again at every pass. Use a "
            "distributed.Client (its LocalCluster on one machine) or the threaded scheduler; "
            "got scheduler='processes'."
        )


def dask_solve_cg(X, y, *, standardizer, readout="last", token_dim=None, sample_weight=None,
                  n_features_in=None, split_every=None, timeout=None,
                  data_format="channels_last", terms=(False, False), alpha=0.0, tol=1e-8,
                  max_iter=None, memory_budget=None, residuals=False):
    """The ``"cg"`` fit and certificate of a dask array, matrix-free on its blocks.

    Parameters
    ----------
    X, y, readout, token_dim, sample_weight, n_features_in, split_every, data_format
        As for :func:`~sklearn_linattn._dask.dask_sufficient_statistics`.
    standardizer : TokenStandardizer
        The standardized coordinates (from
        :func:`~sklearn_linattn._dask.dask_coordinates`).
    timeout : float or None, default=None
        Seconds for the whole solve on a ``distributed`` cluster (None: the
        dask config key ``sklearn-linattn.timeout``, default no limit); a
        cluster without workers raises a TimeoutError as in ``_dask``.
    terms : tuple of bool (intercept, skip), default=(False, False)
        Term columns carried as extra targets.
    alpha, tol, max_iter : float, float, int or None
        The ridge penalty and the CG stopping rule, as for ``solver="cg"``.
    memory_budget : int or None, default=None
        Each worker's budget for its block's cache (None: half the physical
        memory of the worker's machine); the client's for the Lanczos
        vectors.
    residuals : bool, default=False
        Keep ``G coef^T`` and the normal-equation residual of an unpenalized
        fit (the term columns' certificate needs them).

    Returns
    -------
    solution : SpectralSolution
        As the in-memory ``"cg"`` returns it, with ``counts`` summed over
        the blocks.
    single_output : bool
        True when y has no output axis.

    Raises
    ------
    ValueError
        With the in-memory messages for invalid input; also under the
        multiprocessing scheduler, and when no sequence has positive weight.
    TimeoutError
        As :func:`~sklearn_linattn._dask.dask_sufficient_statistics`.

    Examples
    --------
    >>> import numpy as np
    >>> import pytest
    >>> da = pytest.importorskip("dask.array")  # skips this example without dask
    >>> from sklearn_linattn._dask import dask_coordinates, dask_scales
    >>> from sklearn_linattn._dask_cg import dask_solve_cg
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 6, 2))
    >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) / 6
    >>> Xd, yd = da.from_array(X, chunks=50), da.from_array(y, chunks=50)
    >>> standardizer = dask_coordinates(dask_scales(Xd, yd), Xd, yd)
    >>> solution, single = dask_solve_cg(Xd, yd, standardizer=standardizer)
    >>> solution.counts.n_samples, solution.rank, single
    (200, 6, True)
    """
    import dask
    from dask.base import tokenize

    _check_scheduler()
    terms = tuple(bool(t) for t in terms)
    # Keys of this fit's own: another fit of the same blocks (another alpha, say)
    # must not share them, since each fit cancels its blocks when it ends.
    level, _, token = block_tasks(
        X, y, _block_rows, f"cg-rows-{uuid.uuid4().hex}", readout=readout, token_dim=token_dim,
        sample_weight=sample_weight, n_features_in=n_features_in, split_every=split_every,
        data_format=data_format, standardizer=standardizer, terms=terms,
        memory_budget=memory_budget,
    )
    start = time.monotonic()
    if timeout is None:
        timeout = dask.config.get("sklearn-linattn.timeout", None)
    deadline = None if timeout is None else start + float(timeout)
    blocks = list(dask.persist(*level))
    try:
        summaries = [dask.delayed(_block_summary)(b, dask_key_name=f"linattn-cg-summary-"
                                                  f"{token}-{i}") for i, b in enumerate(blocks)]
        merged = _compute(tree_reduce(summaries, _merge_summaries, f"cg-summary-merge-{token}",
                                      split_every),
                          None if deadline is None else max(deadline - time.monotonic(), 0.0))
        if merged is None:
            raise ValueError("X must hold at least one sequence; got 0 samples.")
        (setup, counts, exact), single = merged
        if counts.n_rows == 0:
            raise ValueError("every sequence has zero sample weight: there is nothing to fit.")
        setup_seconds = time.monotonic() - start
        name = tokenize(token, alpha, tol, max_iter)
        op = _DaskGram(blocks, standardizer.n_features, exact, split_every=split_every,
                       deadline=deadline, name=name, timeout=timeout)
        solution = solve_implicit(op, setup, standardizer=standardizer, dtype=counts.dtype,
                                  alpha=alpha, options=dict(tol=tol, max_iter=max_iter,
                                                            memory_budget=memory_budget,
                                                            residuals=residuals))
    finally:
        _release(blocks)
    solution.counts = counts
    if solution.diagnostics is not None:
        # The blocks' validation and caches, then one round trip per product.
        solution.diagnostics.update(setup_seconds=setup_seconds, products=op.n_products)
    return solution, single
