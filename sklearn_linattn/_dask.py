"""Sufficient statistics of dask arrays, computed per block and tree-reduced.

Least squares on the cubic features needs only the Gram matrix
``Phi^T Phi``, the moment ``Phi^T Y`` and a few target sums
(:class:`~sklearn_linattn._solvers.SufficientStatistics`), and statistics of
disjoint sets of sequences add up.  So a dask array of sequences chunked
along the samples is reduced where its blocks live: every block is
validated and turned into statistics by a task on a worker, and the
statistics (psi x psi matrices, never the sequences) are summed in a tree of
``split_every``-ary merge tasks.  The computation runs on the scheduler of
the current dask context, so a ``distributed.Client`` is used when one is
the default.

dask is optional: this module imports it only when it is given dask input,
and :func:`is_dask_collection` never imports it.

Two passes, as in memory: the blocks' token and target magnitudes first
(:func:`dask_scales`, the standardized coordinates of
:mod:`._standardize`), then their statistics in those coordinates.

A ``distributed`` cluster that loses every worker would make the
computation wait forever; it raises a TimeoutError instead (see
:func:`_compute` and the dask config keys ``sklearn-linattn.no-workers-timeout``
and ``sklearn-linattn.timeout``).

Validation is the in-memory one.  Before any data are read, a one-sample
stand-in of X (and of y) with the array's dtype and trailing shape goes
through :func:`~sklearn_linattn._validation.check_sequences` and
:func:`~sklearn_linattn._validation.check_targets`, so errors about dtypes,
dimensions, ``token_dim`` and target shapes are raised at once, worded as for
numpy input and naming the full shape.  Errors that depend on the values
(the NaN padding rule, NaN or infinite targets) are raised by the same
functions inside the block tasks; their sample indices are shifted by the
block's offset, so that the message a worker raises is the message the
in-memory fit would raise on the whole array.
"""

import sys

import numpy as np
from sklearn.utils.validation import check_array

from ._solvers import SufficientStatistics
from ._standardize import MomentScales, TokenStandardizer, refined_whitening
from ._terms import LinearTerms
from ._training import check_layout
from ._validation import (
    check_data_format,
    check_readout,
    check_sequences,
    check_targets,
    check_token_dim,
)
from ._params import check_number

__all__ = ["dask_coordinates", "dask_scales", "dask_sufficient_statistics",
           "is_dask_collection"]

# Statistics merged by one task of the reduction tree.
_DEFAULT_SPLIT_EVERY = 8


def is_dask_collection(obj):
    """Whether ``obj`` is a dask collection (dask array, bag, delayed, ...).

    Never imports dask: an object can only be a dask collection if dask has
    already been imported, so this costs nothing when dask is not in use (or
    not installed).

    Parameters
    ----------
    obj : object
        Anything, typically the ``X`` given to ``fit``.

    Returns
    -------
    is_dask : bool

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._dask import is_dask_collection
    >>> is_dask_collection(np.zeros((2, 3, 1)))
    False
    """
    if sys.modules.get("dask") is None:  # never imported (or import blocked)
        return False
    import dask

    return bool(dask.is_dask_collection(obj))


def _import_dask_array():
    try:
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - exercised without dask only
        raise ImportError(
            "dask input needs the optional dependency dask[array]; install it with "
            "pip install 'sklearn-linattn[dask]'."
        ) from exc
    return da


def _check_known_chunks(a, name):
    """Raise unless the chunk sizes of dask array ``a`` along axis 0 are known."""
    if a.ndim and not all(np.isfinite(c) for c in a.chunks[0]):
        raise ValueError(
            f"{name} must have known chunk sizes along axis 0 (the samples); got "
            f"chunks {a.chunks[0]}. Call {name}.compute_chunk_sizes() first."
        )
    return a


def _check_dask_array(X, da, name):
    """Return X if it is a dask array with known chunk sizes along the samples."""
    if not isinstance(X, da.Array):
        hint = (
            f" Convert it with {name}.to_dask_array(lengths=True)."
            if hasattr(X, "to_dask_array")
            else ""
        )
        raise TypeError(
            f"{name} must be a dask array (dask.array.Array) of sequences; got "
            f"{type(X).__module__}.{type(X).__qualname__}.{hint}"
        )
    return _check_known_chunks(X, name)


def _with_message(exc, message):
    """A new exception of exc's type with another message (exc if impossible)."""
    if type(exc) not in (TypeError, ValueError):
        return exc
    return type(exc)(message)


def _reworded(exc, replacements):
    """The same exception type with substrings of its message replaced."""
    message = str(exc)
    for old, new in replacements:
        message = message.replace(old, new)
    return _with_message(exc, message)


def _check_sample_dtype_shape(X, *, token_dim, n_features_in, data_format="channels_last"):
    """Run the shape and dtype checks of ``check_sequences`` without data.

    A zero-filled stand-in holding one sample of X's dtype and trailing shape
    is validated; messages name X's full shape.

    Returns
    -------
    n_tokens, d : int
        Padded length and token dimension of the validated sequences.
    """
    shape = tuple(X.shape)
    probe_shape = (min(shape[0], 1),) + shape[1:] if shape else ()
    probe = np.zeros(probe_shape, dtype=X.dtype)
    try:
        Xv, _ = check_sequences(probe, token_dim=token_dim, n_features_in=n_features_in,
                                data_format=data_format)
    except (TypeError, ValueError) as exc:
        raise _reworded(exc, [(str(probe_shape), str(shape))]) from None
    return Xv.shape[1], Xv.shape[2]


def _check_targets_shape(y, n_samples, n_tokens, readout, data_format="channels_last"):
    """Shape and dtype checks of ``check_targets`` on an array y, without data."""
    shape = tuple(y.shape)
    if shape[:1] != (n_samples,):
        # check_targets' words for the same mistake.
        raise ValueError(
            f"y must have one entry per sequence of X (n_samples={n_samples}); got "
            f"shape {shape}."
        )
    probe_shape = (1,) + shape[1:]
    probe = np.zeros(probe_shape, dtype=y.dtype)
    try:
        check_targets(probe, np.array([n_tokens]), n_tokens, readout=readout,
                      data_format=data_format)
    except (TypeError, ValueError) as exc:
        raise _reworded(
            exc,
            [
                (str(probe_shape), str(shape)),
                (f"= (1, {n_tokens}[, d_out])", f"= ({n_samples}, {n_tokens}[, d_out])"),
            ],
        ) from None


def _sample_aligned(arg, X, da):
    """Split a sample-aligned argument into one piece per sample block of X.

    Dask arrays are rechunked to X's chunks along axis 0 (and one chunk along
    the other axes) and split into delayed blocks; in-memory arguments (arrays
    or lists) are sliced.
    """
    if isinstance(arg, da.Array):
        arg = arg.rechunk((X.chunks[0],) + tuple((s,) for s in arg.shape[1:]))
        return list(arg.to_delayed(optimize_graph=False).ravel())
    bounds = np.cumsum((0,) + X.chunks[0])
    return [arg[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _as_targets(y, da, n_samples, n_tokens, readout, data_format="channels_last"):
    """Check y's shape up front; return it as a dask or numpy array, or a list.

    A list of per-sequence targets of different lengths (``readout="all"``)
    stays a list; its items are checked in the blocks.
    """
    if y is None:
        # check_targets' own refusal.
        check_targets(None, np.zeros(0, dtype=np.int64), n_tokens, readout=readout)
    if isinstance(y, da.Array):
        _check_known_chunks(y, "y")
    elif isinstance(y, (list, tuple)):
        try:
            y = np.asarray(y)
        except ValueError:  # ragged: per-sequence targets, padded by check_targets
            if len(y) != n_samples:
                raise ValueError(
                    f"y must have one entry per sequence of X (n_samples={n_samples}); "
                    f"got a list of {len(y)} sequences."
                ) from None
            return list(y)
    else:
        y = np.asarray(y)
    _check_targets_shape(y, n_samples, n_tokens, readout, data_format)
    return y


def _as_sample_weight(sample_weight, da, n_samples):
    """Check sample_weight's shape up front (a scalar is broadcast)."""
    if sample_weight is None:
        return None
    if not isinstance(sample_weight, da.Array):
        sample_weight = np.asarray(sample_weight)
        if sample_weight.ndim == 0:
            sample_weight = np.full(n_samples, sample_weight)
    else:
        _check_known_chunks(sample_weight, "sample_weight")
        if sample_weight.ndim == 0:
            sample_weight = da.broadcast_to(sample_weight, (n_samples,))
    if tuple(sample_weight.shape) != (n_samples,):
        raise ValueError(
            f"sample_weight must have shape ({n_samples},); got "
            f"{tuple(sample_weight.shape)}."
        )
    return sample_weight


def _validated_block(X, y, sample_weight, offset, *, readout, token_dim, n_features_in,
                     data_format):
    """Validate one block of sequences (on a worker); messages count samples globally."""
    X, lengths = check_sequences(X, token_dim=token_dim, n_features_in=n_features_in,
                                 data_format=data_format, offset=offset)
    Y, single = check_targets(y, lengths, X.shape[1], readout=readout,
                              data_format=data_format, offset=offset)
    w = None
    if sample_weight is not None:
        w = check_array(sample_weight, ensure_2d=False, dtype=np.float64,
                        input_name="sample_weight")
    return X, lengths, Y, single, w


def _block_standardizer(X, y, sample_weight, offset, *, readout, token_dim, n_features_in,
                        data_format, whiten, standardizer=None):
    """Token and target magnitudes of one block (a MomentScales), or None.

    With ``standardizer``, those of its standardized tokens (no targets): the
    refinement of a whitening (:func:`~._standardize.refined_whitening`).
    """
    def magnitudes(X, lengths, Y, w):
        if standardizer is not None:
            return MomentScales(X.shape[2], Y.shape[-1], whiten=whiten).update(
                standardizer.transform(X), lengths, sample_weight=w)
        return MomentScales(X.shape[2], Y.shape[-1], whiten=whiten).update(
            X, lengths, Y, w)
    return _on_block(magnitudes, X, y, sample_weight, offset, readout=readout,
                     token_dim=token_dim, n_features_in=n_features_in, data_format=data_format)


def _block_statistics(X, y, sample_weight, offset, *, readout, token_dim, n_features_in,
                      data_format, standardizer, terms=(False, False)):
    """Sufficient statistics of one block of sequences, or None for an empty block.

    ``terms`` (intercept, skip) appends the term columns ``[1, x]`` of the
    standardized row tokens to the targets.
    """
    def statistics(X, lengths, Y, w):
        extra = LinearTerms(X.shape[2], intercept=terms[0], skip=terms[1])
        stats = SufficientStatistics(X.shape[2], Y.shape[-1] + extra.n_terms,
                                     standardizer=standardizer)
        return stats.update(X, lengths, Y, readout=readout, sample_weight=w,
                            terms=extra if extra else None)
    return _on_block(statistics, X, y, sample_weight, offset, readout=readout,
                     token_dim=token_dim, n_features_in=n_features_in, data_format=data_format)


def _on_block(work, X, y, sample_weight, offset, **layout):
    """``(work(X, lengths, Y, w), single_output)`` of one validated block (on a worker).

    None for an empty block.
    """
    if X.shape[0] == 0:
        return None
    X, lengths, Y, single, w = _validated_block(X, y, sample_weight, offset, **layout)
    return work(X, lengths, Y, w), single


def _check_outputs(first, single, other, part_single):
    if first != other or part_single != single:
        raise ValueError(
            "every target in y must have the same output dimension; got "
            f"{'no output axis' if single else f'd_out={first}'} for some "
            f"sequences and "
            f"{'no output axis' if part_single else f'd_out={other}'} "
            "for others."
        )


def _merged(parts, empty):
    """Sum per-block results ``(part, single_output)`` into ``empty(first part)``.

    The inputs are left untouched, so a task that is run again after a
    worker failure gives the same sum.
    """
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    first, single = parts[0]
    total = empty(first)
    for part, part_single in parts:
        _check_outputs(first.d_out, single, part.d_out, part_single)
        total.merge(part)
    return total, single


def _merge_blocks(*parts):
    """Sum the statistics of several blocks into a new object (a tree node)."""
    return _merged(parts, lambda s: SufficientStatistics(s.d, s.d_out,
                                                         standardizer=s.standardizer))


def _merge_standardizers(*parts):
    """Merge the accumulators of several blocks into a new one (a tree node)."""
    return _merged(parts, lambda a: MomentScales(a.d, a.d_out, whiten=a.whiten))


def _check_split_every(split_every):
    if split_every is None:
        return _DEFAULT_SPLIT_EVERY
    return check_number(split_every, "split_every", integer=True, low=2, allow_none=True)


def _reduction(X, y, task, merge, name, *, split_every=None, **kwargs):
    """Build a lazy block-by-block reduction of sequences and targets.

    ``task(X_block, y_block, w_block, offset, readout=..., token_dim=...,
    n_features_in=..., **extra)`` runs on each block (:func:`block_tasks`,
    which takes the other arguments) and ``merge(*parts)`` combines them in a
    tree of ``split_every``-ary tasks (:func:`tree_reduce`).

    Returns
    -------
    result : dask.delayed.Delayed
        Computes to ``merge``'s output over all blocks.
    n_tokens : int
        Padded length of the validated sequences.
    """
    split_every = _check_split_every(split_every)
    level, n_tokens, token = block_tasks(X, y, task, name, split_every=split_every, **kwargs)
    return tree_reduce(level, merge, f"{name}-merge-{token}", split_every), n_tokens


def tree_reduce(level, merge, name, split_every=None):
    """``merge(*parts)`` over delayed ``level`` in a tree of ``split_every``-ary tasks.

    ``name`` makes the task keys (``linattn-{name}-{depth}-{index}``); it
    must identify the inputs.
    """
    import dask

    split_every = _check_split_every(split_every)
    depth = 0
    while len(level) > 1:
        level = [
            dask.delayed(merge)(
                *level[start : start + split_every],
                dask_key_name=f"linattn-{name}-{depth}-{start // split_every}",
            )
            for start in range(0, len(level), split_every)
        ]
        depth += 1
    return level[0]


def block_tasks(
    X, y, task, name, *, readout="last", token_dim=None, sample_weight=None,
    n_features_in=None, split_every=None, data_format="channels_last", **extra,
):
    """One delayed ``task`` per block of whole sequences, after the shape checks.

    ``task(X_block, y_block, w_block, offset, readout=..., token_dim=...,
    n_features_in=..., data_format=..., **extra)``; the arguments are those
    of :func:`dask_sufficient_statistics`.

    Returns
    -------
    level : list of dask.delayed.Delayed
        One task per block, in sample order.
    n_tokens : int
        Padded length of the validated sequences.
    token : str
        A hash of the inputs and arguments (for task keys).
    """
    da = _import_dask_array()
    import dask
    from dask.base import tokenize

    check_readout(readout)
    token_dim = check_token_dim(token_dim)
    data_format = check_data_format(data_format)
    split_every = _check_split_every(split_every)
    X = _check_dask_array(X, da, "X")
    n_tokens, _ = _check_sample_dtype_shape(X, token_dim=token_dim, n_features_in=n_features_in,
                                            data_format=data_format)
    n_samples = X.shape[0]
    y = _as_targets(y, da, n_samples, n_tokens, readout, data_format)
    sample_weight = _as_sample_weight(sample_weight, da, n_samples)

    # One chunk along the tokens and the token coordinates: a block is a set
    # of whole sequences.
    X = X.rechunk({axis: -1 for axis in range(1, X.ndim)})
    collections = [X] + [a for a in (y, sample_weight) if isinstance(a, da.Array)]
    # Optimised together, so that work shared by X and y is done once.
    collections = dask.optimize(*collections)
    aligned = iter(collections[1:])
    X = collections[0]
    y = next(aligned) if isinstance(y, da.Array) else y
    if isinstance(sample_weight, da.Array):
        sample_weight = next(aligned)

    extra_token = [
        (v.exponents, v.whitening, v.y_exponents, v.weight_exponent)
        if isinstance(v, TokenStandardizer) else v for v in extra.values()
    ]
    token = tokenize(X, y, sample_weight, readout, token_dim, n_features_in, split_every,
                     data_format, name, extra_token)
    x_blocks = X.to_delayed(optimize_graph=False).ravel()
    y_blocks = _sample_aligned(y, X, da)
    w_blocks = (
        [None] * len(x_blocks)
        if sample_weight is None
        else _sample_aligned(sample_weight, X, da)
    )
    offsets = np.cumsum((0,) + X.chunks[0][:-1])
    level = [
        dask.delayed(task)(
            xb, yb, wb, int(offset), readout=readout, token_dim=token_dim,
            n_features_in=n_features_in, data_format=data_format, **extra,
            dask_key_name=f"linattn-{name}-{token}-{i}",
        )
        for i, (xb, yb, wb, offset) in enumerate(zip(x_blocks, y_blocks, w_blocks, offsets))
    ]
    return level, n_tokens, token


def dask_scales(
    X, y, *, readout="last", token_dim=None, sample_weight=None, n_features_in=None,
    split_every=None, timeout=None, data_format="channels_last", standardizer=None,
):
    """Token and target magnitudes of a dask array of sequences, block by block.

    The first of the two passes of a fit on dask input: each block's
    :class:`~sklearn_linattn._standardize.MomentScales`, merged
    in a tree, gives the standardized coordinates of all the data (as the
    in-memory fit computes them).  Arguments as for
    :func:`dask_sufficient_statistics`.

    With ``standardizer``, the scales of its standardized tokens instead (a
    second pass that refines the whitening of nearly collinear tokens,
    :func:`dask_coordinates`).

    Returns
    -------
    scales : MomentScales
        ``scales.finish()`` is the standardizer.
    """
    check_layout(getattr(X, "shape", ()), readout=readout, token_dim=token_dim,
                 data_format=data_format)
    result, _ = _reduction(
        X, y, _block_standardizer, _merge_standardizers, "scales", readout=readout,
        token_dim=token_dim, sample_weight=sample_weight, n_features_in=n_features_in,
        split_every=split_every, data_format=data_format, whiten=True,
        **({} if standardizer is None else {"standardizer": standardizer}),
    )
    merged = _compute(result, timeout)
    if merged is None:
        raise ValueError("X must hold at least one sequence; got 0 samples.")
    return merged[0]


def dask_coordinates(scales, X, y, **kwargs):
    """``scales.finish()``, refined by a second pass when the tokens are nearly collinear.

    ``kwargs`` as for :func:`dask_scales`.
    """
    standardizer = scales.finish()
    if not scales.ill_conditioned:
        return standardizer
    again = dask_scales(X, y, standardizer=standardizer, **kwargs)
    return refined_whitening(standardizer, again.second_moment())


def _distributed_client():
    """The distributed Client that dask computes with by default, or None."""
    import dask

    scheduler = dask.base.get_scheduler()
    owner = getattr(scheduler, "__self__", None)
    if owner is None or type(owner).__module__.split(".")[0] != "distributed":
        return None
    return owner


def _compute(result, timeout):
    """Compute a delayed result on the current scheduler, never waiting forever.

    On a ``distributed`` cluster the result is awaited in short polls: a
    TimeoutError is raised (and the computation cancelled) when the cluster
    has had no worker for ``no_workers_timeout`` seconds (the dask config key
    ``sklearn-linattn.no-workers-timeout``, default 60: every worker lost,
    nothing can run) or when ``timeout`` seconds have passed (None: the
    config key ``sklearn-linattn.timeout``, default no limit).  Errors of the
    tasks themselves propagate as they are.  Other schedulers (threads,
    processes, synchronous) cannot lose their workers and compute directly.
    """
    import time

    import dask

    client = _distributed_client()
    if client is None:
        return result.compute()
    if timeout is None:
        timeout = dask.config.get("sklearn-linattn.timeout", None)
    no_workers_limit = float(dask.config.get("sklearn-linattn.no-workers-timeout", 60))
    poll = min(1.0, no_workers_limit / 4) if no_workers_limit > 0 else 1.0
    if timeout is not None:
        poll = min(poll, max(float(timeout), 0.01))
    future = client.compute(result)
    start = time.monotonic()
    without_workers = None
    try:
        while True:
            try:
                return future.result(timeout=poll)
            except TimeoutError:
                pass
            now = time.monotonic()
            if not client.scheduler_info().get("workers"):
                without_workers = now if without_workers is None else without_workers
                if now - without_workers >= no_workers_limit:
                    raise TimeoutError(
                        f"the dask cluster at {client.scheduler.address} has had no worker "
                        f"for {now - without_workers:.0f} s (every worker lost?), so the fit "
                        "cannot proceed; restart workers and fit again (the wait is the "
                        "dask config key 'sklearn-linattn.no-workers-timeout', in seconds)."
                    ) from None
            else:
                without_workers = None
            if timeout is not None and now - start >= float(timeout):
                raise TimeoutError(
                    f"the dask computation did not finish within timeout={timeout} s "
                    "(the dask config key 'sklearn-linattn.timeout')."
                )
    except BaseException:
        future.cancel()
        raise
    finally:
        # A poll's TimeoutError traceback can hold this future in a reference
        # cycle; release the client's reference now, not when the collector runs.
        future.release()


def dask_sufficient_statistics(
    X, y, *, readout="last", token_dim=None, sample_weight=None, n_features_in=None,
    split_every=None, standardizer=None, timeout=None, data_format="channels_last",
    terms=(False, False),
):
    """Least-squares sufficient statistics of a dask array of sequences.

    Each block of samples is validated and reduced to
    :class:`~sklearn_linattn._solvers.SufficientStatistics` by a task of its
    own, and the blocks' statistics are summed in a tree of merge tasks, on
    the scheduler of the current dask context (a ``distributed.Client`` when
    one is the default).  Only the statistics (a psi x psi Gram matrix, a
    psi x d_out moment, a few sums) travel between workers and back.

    Parameters
    ----------
    X : dask array of shape (n_samples, n_tokens, d) or (n_samples, n_columns)
        Sequences, chunked along the samples; trailing all-NaN tokens are
        padding.  Chunks along the other axes are merged (each block holds
        whole sequences).  2-D X is read as in ``check_sequences``: univariate
        sequences, or ``n_columns // token_dim`` tokens when ``token_dim`` is
        given.  Chunk sizes along axis 0 must be known.
    y : dask array, array-like or list of array-likes
        Targets as for the in-memory fit (see ``check_targets``), one entry
        per sequence.  A dask y may be chunked differently from X: it is
        rechunked to X's sample chunks.  A list of per-sequence targets
        (``readout="all"``) is split along with X's blocks.
    readout : {"last", "all"}, default="last"
        One feature row per sequence, or one per real token (causal prefixes).
    token_dim : int or None, default=None
        Token dimension for 2-D X.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X (and of 3-D targets of ``readout="all"``), as for the
        in-memory fit.
    sample_weight : dask array, array-like of shape (n_samples,), float or None, \
default=None
        Weight of each sequence, aligned with X's blocks like y.
    n_features_in : int or None, default=None
        Expected token dimension d (as seen by an earlier fit); None accepts
        any.
    split_every : int or None, default=None
        Number of statistics merged by one task of the reduction tree (at
        least 2); None means 8.
    standardizer : TokenStandardizer or None, default=None
        The standardized coordinates to accumulate in; None finds those of
        all the data in a first pass over the blocks (:func:`dask_scales`),
        as the in-memory fit does.
    timeout : float or None, default=None
        Seconds to wait for a ``distributed`` cluster before a TimeoutError;
        None reads the dask config key ``sklearn-linattn.timeout`` (default:
        no limit).  Independently, a cluster without any worker for
        ``sklearn-linattn.no-workers-timeout`` seconds (default 60) raises a
        TimeoutError instead of waiting for workers that will not come.
    terms : tuple of bool (intercept, skip), default=(False, False)
        Append the intercept and skip columns to the targets
        (``fit_intercept`` / ``fit_skip``); ``standardizer`` must then be
        given, with the term columns' target exponents.

    Returns
    -------
    stats : SufficientStatistics
        Sums over every block, in the standardized coordinates
        ``stats.standardizer``; ``stats.dtype`` is the least precise input
        dtype (float32 for float32 X), as for in-memory input.
    n_tokens : int
        Padded length of the sequences (after ``token_dim`` reshaping).
    single_output : bool
        True when y has no output axis.

    Raises
    ------
    TimeoutError
        When a ``distributed`` cluster has no worker left, or ``timeout``
        passes (see there).
    TypeError
        If X is not a dask array, or an argument has a non-numeric dtype.
    ValueError
        With the in-memory fit's message for any invalid input.  Errors about
        shapes and dtypes are raised before any block is computed; errors
        about values (the padding rule, NaN targets) when the blocks are, with
        sample indices counted over the whole array.

    Notes
    -----
    The statistics equal those of the in-memory array to rounding: the
    blocks' Gram matrices are summed in a different order.  Empty blocks are
    skipped.

    Examples
    --------
    >>> import numpy as np
    >>> import pytest
    >>> da = pytest.importorskip("dask.array")  # skips this example without dask
    >>> from sklearn_linattn._dask import dask_sufficient_statistics
    >>> from sklearn_linattn._solvers import SufficientStatistics
    >>> from sklearn_linattn._validation import check_sequences
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(100, 6, 2))
    >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
    >>> stats, n_tokens, single = dask_sufficient_statistics(
    ...     da.from_array(X, chunks=30), da.from_array(y, chunks=45))
    >>> stats.gram.shape, stats.n_samples, n_tokens, single
    ((6, 6), 100, 6, True)
    >>> Xv, lengths = check_sequences(X)
    >>> in_memory = SufficientStatistics(2, 1, standardizer=stats.standardizer).update(
    ...     Xv, lengths, y[:, None])
    >>> bool(np.allclose(stats.gram, in_memory.gram, rtol=1e-12))
    True
    """
    if standardizer is None:
        kwargs = dict(readout=readout, token_dim=token_dim, sample_weight=sample_weight,
                      n_features_in=n_features_in, split_every=split_every, timeout=timeout,
                      data_format=data_format)
        standardizer = dask_coordinates(dask_scales(X, y, **kwargs), X, y, **kwargs)
    result, n_tokens = _reduction(
        X, y, _block_statistics, _merge_blocks, "statistics", readout=readout,
        token_dim=token_dim, sample_weight=sample_weight, n_features_in=n_features_in,
        split_every=split_every, data_format=data_format, standardizer=standardizer,
        terms=tuple(bool(t) for t in terms),
    )
    stats, single = _compute(result, timeout)
    return stats, n_tokens, single
