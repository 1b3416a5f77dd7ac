"""Training data in memory as a source of the one pass: validated once, at the edge, in chunks.

:class:`ArraySource` is what ``fit`` and ``partial_fit`` read from NumPy
input (and what the certificate reads from validated arrays): the pass folds
its validated chunks into one accumulator (:meth:`ArraySource.reduce`), and
the solvers that read sequences get them from it.  The blocks of a dask array
are the other source (:class:`~._dask.DaskSource`).

Also the one check of the layout every entry point that fits runs before its
work (:func:`check_layout`), and the mark that exempts the arrays whose layout
the package's transformers chose (:func:`mark_layout_written`).
"""

import functools
import itertools
import numbers
import os
import sys
import warnings
import weakref

import numpy as np

from ._memory import FLOP_RATE, heads_size, least_squares_work, n_pairs, real_tokens, zero_padding
from ._moments import RowReader, coordinates, count_rows, scales_pass
from ._solvers import REGISTRY, solver_memory
from ._validation import (
    check_sample_weight,
    check_sequences,
    check_targets,
    complete_sequences,
)
from .exceptions import LayoutWarning

__all__ = ["ArraySource", "check_layout", "layout_written", "looks_transposed",
           "mark_layout_written", "standardizer_of"]

# Values of a NumPy X validated (and copied) at a time by fit and partial_fit
# (2**21 float64 values, 16 MiB).
_VALIDATION_CHUNK = 2**21

# X in the default layout looks like aeon's and sktime's series (n_samples,
# n_channels, n_timepoints) read as (n_samples, n_tokens, d) when it has at
# least this many coordinates per token: most multivariate series of the UEA
# archive have 8 or more time points per channel (BasicMotions 100 / 6,
# univariate series T / 1), while the package's own wide tokens stay near 4
# (the Turing machine example, 41 one-hot coordinates over 10 tokens; d = 64
# over 16 tokens on the scale page).
_TRANSPOSED_RATIO = 8
# ... or more than this many per token when the fit is also large: more than
# _LARGE_BYTES of dense arrays or _LARGE_SECONDS of work at FLOP_RATE.
_LARGE_FIT_RATIO = 4
_LARGE_BYTES = 2**30
_LARGE_SECONDS = 60.0
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep

# The arrays a transformer of the package returned in a token layout it chose
# (Patches: one token per patch, wide by design, so that a window of 12 time
# points is one token of d = 12, which the shape rule of check_layout would
# take for transposed series), by id().  The values are weak references: an
# entry goes with its array, and the lookup checks identity, so an id reused
# by a later array is never taken for it.  Why a registry: an ndarray takes no
# attribute, and a subclass or a wrapper would reach the user's results (their
# type, pickles, set_output, sklearn's checks of X), while this mark lives only
# as long as the very object returned; a copy, a slice or an unpickled copy of
# it is the user's array again, judged as any other.
_LAYOUT_WRITTEN = weakref.WeakValueDictionary()


def user_stacklevel():
    """``warnings.warn``'s stacklevel for the caller's caller's first frame outside the package."""
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def mark_layout_written(X):
    """Record that the package chose the token layout of the array X; return X.

    :func:`check_layout` does not judge X itself (not a copy, a slice or an
    unpickled copy of it): the transformer that returns X vouches for its layout.
    Nothing is kept alive by the mark, and X is returned unchanged.

    Parameters
    ----------
    X : ndarray
        The array a transformer returns, the very object.

    Returns
    -------
    X : ndarray
        X itself.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._source import layout_written, mark_layout_written
    >>> X = mark_layout_written(np.zeros((3, 1, 12)))
    >>> layout_written(X), layout_written(X.copy())
    (True, False)
    """
    _LAYOUT_WRITTEN[id(X)] = X
    return X


def layout_written(X):
    """Whether X is an array whose layout :func:`mark_layout_written` recorded.

    Parameters
    ----------
    X : object
        Anything given as X.

    Returns
    -------
    written : bool
        True only for the very object recorded (while it lives).
    """
    return _LAYOUT_WRITTEN.get(id(X)) is X


def looks_transposed(n_tokens, d):
    """Whether tokens of ``d`` coordinates, ``n_tokens`` of them, could be transposed series.

    The necessary condition of :func:`check_layout`'s warning, ``d > 4 n_tokens``
    (series stored as (n_samples, n_channels, n_timepoints) have far more time
    points than channels); a transformer that finds it in its input does not
    vouch for the layout of its output, which the estimator then judges.

    Parameters
    ----------
    n_tokens, d : int
        The two axes of X as read, (n_samples, n_tokens, d).

    Returns
    -------
    suspicious : bool

    Examples
    --------
    >>> from sklearn_linattn._source import looks_transposed
    >>> looks_transposed(1, 40), looks_transposed(12, 1)
    (True, False)
    """
    return d > _LARGE_FIT_RATIO * n_tokens


def _fit_size(n_rows, d, psi, d_out, solve):
    """Bytes and floating-point operations of a fit (or, ``solve=False``, of the features).

    The least squares' dense arrays are those of the dense solver that needs
    the least (``solver_memory``; the matrix-free solvers trade them for
    passes over the data), plus the SVD into heads when there are targets.
    """
    if not solve:  # the n_rows x psi feature matrix
        return 8.0 * n_rows * psi, float(n_rows) * psi
    need = min(solver_memory(name, n_rows, psi) for name, spec in REGISTRY.items()
               if not spec.sparse_only and spec.memory(n_rows, psi) > 0)
    work = least_squares_work(n_rows, psi)
    if d_out:
        heads_bytes, heads_work = heads_size(d, d_out)
        need, work = need + heads_bytes, work + heads_work
    return need, work


def check_layout(shape, *, readout="last", token_dim=None, data_format="channels_last",
                 n_rows=None, d_out=0, solve=True, varying=None, X=None):
    """Warn, before the work, when X looks like series stored with time along the last axis.

    aeon and sktime store series as (n_samples, n_channels, n_timepoints);
    passed without ``data_format="channels_first"`` they are read as
    ``n_channels`` tokens of ``d = n_timepoints`` coordinates, a model of
    ``psi = d**2 (d + 1) / 2`` features.  Only the default layout is judged
    (a ``data_format`` or ``token_dim`` given by the user says the layout on
    purpose): a :class:`~sklearn_linattn.exceptions.LayoutWarning` when
    ``d >= 8 n_tokens``, or when ``d > 4 n_tokens`` and the fit is large
    (more than 1 GiB of dense arrays, or more than a minute at
    ``FLOP_RATE``).  With ``varying``, only the coordinates that vary count
    as d in that rule: a coordinate that is constant over every token (a
    position code of one-token windows, say) is not a time point of stored
    series.  An array X a transformer of the package wrote in a layout it
    chose (:func:`mark_layout_written`, e.g. the output of
    :class:`~sklearn_linattn.preprocessing.Patches`) is not judged either.

    Parameters
    ----------
    shape : tuple
        ``(n_samples, n_tokens, d)`` of X as read; anything else (2-D input,
        unknown dask sizes, an empty axis) is not judged.
    readout : {"last", "all"}, default="last"
    token_dim, data_format
        The layout X was read with.
    n_rows : int or None, default=None
        Feature rows of the fit; None counts every position.
    d_out : int, default=0
        Outputs (0: no targets, as for the certificate).
    solve : bool, default=True
        False sizes the feature matrix instead of a least squares
        (:class:`~sklearn_linattn.LinearAttentionFeatures`).
    varying : callable or None, default=None
        ``varying()``: the number of coordinates that vary over the real
        tokens of the data seen, asked for only when the shape alone would
        warn (None: every coordinate counts).
    X : object or None, default=None
        X as the caller received it, before any conversion (the mark is on
        that object); None: only the shape is judged.

    Returns
    -------
    warned : bool

    Examples
    --------
    >>> import warnings
    >>> from sklearn_linattn._source import check_layout
    >>> check_layout((40, 16, 64))  # wide tokens on purpose
    False
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     check_layout((40, 6, 100), readout="all")
    True
    >>> print(caught[0].message)  # doctest: +ELLIPSIS
    X is read as (n_samples, n_tokens, d) = (40, 6, 100): 6 tokens of d = 100 ...
    """
    if (data_format != "channels_last" or token_dim is not None or len(shape) != 3
            or not all(isinstance(n, numbers.Integral) and n >= 1 for n in shape)
            or (X is not None and layout_written(X))):
        return False  # not judged; an empty axis is the validation's to refuse
    n_samples, n_tokens, d = (int(n) for n in shape)
    if not looks_transposed(n_tokens, d):
        return False
    series = d if varying is None else min(d, int(varying()))
    if not series > _LARGE_FIT_RATIO * n_tokens:
        return False
    psi = d * n_pairs(d)
    if n_rows is None:
        n_rows = n_samples * (1 if readout == "last" else n_tokens)
    need, work = _fit_size(n_rows, d, psi, d_out, solve)
    seconds = work / FLOP_RATE
    if series < _TRANSPOSED_RATIO * n_tokens and not (need > _LARGE_BYTES
                                                 or seconds > _LARGE_SECONDS):
        return False
    tokens = f"{n_tokens} token{'s' * (n_tokens != 1)}"
    if solve:
        what = "the least squares and the heads need" if d_out else "the least squares needs"
    else:
        what = "the feature matrix needs"
    warnings.warn(
        f"X is read as (n_samples, n_tokens, d) = ({n_samples}, {n_tokens}, {d}): {tokens} "
        f"of d = {d} coordinates, a model of psi = d**2 (d + 1) / 2 = {psi} features; "
        f"{what} about {need / 2**30:.3g} GiB and {work:.2g} floating-point operations "
        f"(about {seconds:.3g} s at {FLOP_RATE / 1e9:g} GFLOP/s). Series stored as "
        "(n_samples, n_channels, n_timepoints), as aeon and sktime store them, need "
        f'data_format="channels_first" (then d = {n_tokens}, psi = '
        f"{n_tokens * n_pairs(n_tokens)}). If X does hold {tokens} of {d} coordinates, "
        'silence this with warnings.filterwarnings("ignore", '
        "category=sklearn_linattn.exceptions.LayoutWarning).",
        LayoutWarning, stacklevel=user_stacklevel(),
    )
    return True


def _varying(X, lengths):
    """Number of coordinates that take more than one value over the real tokens of X."""
    tokens = X[real_tokens(lengths, X.shape[1])] if lengths is not None else X.reshape(
        -1, X.shape[2])
    with np.errstate(invalid="ignore"):
        return int(np.count_nonzero(np.nanmax(tokens, axis=0, initial=-np.inf)
                                    > np.nanmin(tokens, axis=0, initial=np.inf)))


def _full(X):
    """Lengths of sequences with no padding."""
    return np.full(X.shape[0], X.shape[1], dtype=np.int64)


def _targets_after(X, lengths, name, check):
    """``check()`` of the targets, X's own error first when X's values were not checked.

    A bad y often comes from a bad X (an infinity in X makes the targets
    computed from it NaN): the message names the cause.
    """
    try:
        return check()
    except ValueError:
        if lengths is None:
            complete_sequences(X, name=name, copy=False)
        raise


class ArraySource:
    """Training data in memory, validated in chunks when X is a large array.

    A large NumPy X (more than ``_VALIDATION_CHUNK`` values) is validated
    and copied one chunk of sequences at a time, so that fitting it never
    holds a second copy of it: the pass consumes the chunks as they come, and
    ``"cg"`` reads the caller's array directly (its padding is ignored
    through the lengths).  Any other input (lists of sequences, DataFrames,
    small arrays) is validated at once.  Error messages on a chunk name it,
    e.g. ``X[4096:8192][3, 2] is partly NaN``.

    Parameters
    ----------
    X, y, sample_weight
        As given to ``fit`` (for validated sequences without targets, the
        certificate's, see :meth:`validated`).
    layout : dict
        ``token_dim`` and ``data_format``.
    readout : {"last", "all"}
    n_features_in : int or None, default=None
        The token dimension d an earlier call fixed (``partial_fit``).

    Attributes
    ----------
    sequential : bool
        True: the chunks are read in order by one process, so the pass can
        accumulate in the coordinates of its first chunk (the blocks of a
        dask array cannot).
    d, n_tokens, d_out, single_output
        What the first chunk fixes: the token dimension, its padded length,
        the number of outputs (0 without targets) and whether y had no
        output axis.
    n_samples : int
    """

    sequential = True

    def __init__(self, X, y, sample_weight, *, layout, readout, n_features_in=None):
        self.layout, self.readout, self.n_features_in = layout, readout, n_features_in
        self._first = self._rest = None
        # With readout="last" the targets do not depend on the padding, so the
        # check of X's values (NaN, infinity, the padding rule) can be left to
        # the fit's pass, whose moments read every value anyway; it finishes
        # the check (complete_sequences) only on a chunk with a non-finite one.
        self._defer = readout == "last"
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
            Xv, lengths = check_sequences(X, n_features_in=n_features_in, copy=False,
                                          defer_finite=self._defer, **layout)
            Y, single = _targets_after(Xv, lengths, "X", lambda: check_targets(
                y, _full(Xv) if lengths is None else lengths, Xv.shape[1], readout=readout,
                data_format=layout["data_format"]))
            w = check_sample_weight(sample_weight, Xv.shape[0])
            self._whole = (Xv, lengths, Y, single, w)
            self.n_samples = Xv.shape[0]
            self.sample_weight = w
        Xf, lengths_f, Yf, self.single_output, _ = self.first()
        self.n_tokens, self.d = Xf.shape[1], Xf.shape[2]
        self.d_out = 0 if Yf is None else Yf.shape[-1]
        check_layout((self.n_samples,) + Xf.shape[1:], readout=readout,
                     n_rows=self.n_rows_bound(), d_out=self.d_out,
                     varying=functools.partial(_varying, Xf, lengths_f), X=X, **layout)

    @classmethod
    def validated(cls, X, lengths, Y=None, sample_weight=None, readout="last"):
        """The source of sequences validated already (zero- or NaN-padded, lengths known).

        ``Y`` as the validation returns targets, or None (inputs alone).
        """
        self = cls.__new__(cls)
        self.layout = dict(token_dim=None, data_format="channels_last")
        self.readout, self.n_features_in = readout, None
        self._first = self._rest = None
        self.chunked = False
        lengths = np.asarray(lengths)
        self._whole = (zero_padding(X, lengths), lengths, Y, False, sample_weight)
        self.n_samples = X.shape[0]
        self.sample_weight = sample_weight
        self.n_tokens, self.d = X.shape[1], X.shape[2]
        self.d_out = 0 if Y is None else Y.shape[-1]
        self.single_output = False
        return self

    def batches(self, defer=False):
        """Validated ``(X, lengths, Y, single_output, sample_weight, name)`` batches, in order.

        With ``defer`` (and readout "last"), ``lengths`` is None for a batch
        whose values were not checked: :func:`complete_sequences` with its
        ``name`` finishes the check.
        """
        if not self.chunked:
            Xv, lengths, Y, single, w = self._whole
            if lengths is None and not defer:
                Xv, lengths = complete_sequences(Xv, copy=False)
                self._whole = (Xv, lengths, Y, single, w)
            yield Xv, lengths, Y, single, w, "X"
            return
        step = max(1, _VALIDATION_CHUNK // max(1, self.X[0].size))
        for start in range(0, self.n_samples, step):
            sl = slice(start, min(start + step, self.n_samples))
            name = f"X[{sl.start}:{sl.stop}]"
            Xc, lc = check_sequences(
                self.X[sl], n_features_in=self.n_features_in, name=name, copy=False,
                defer_finite=defer and self._defer, **self.layout,
            )
            Yc, single = _targets_after(Xc, lc, name, lambda: check_targets(
                self.y[sl], _full(Xc) if lc is None else lc, Xc.shape[1], readout=self.readout,
                name=f"y[{sl.start}:{sl.stop}]", data_format=self.layout["data_format"],
            ))
            w = None if self.sample_weight is None else self.sample_weight[sl]
            yield Xc, lc, Yc, single, w, name

    def first(self):
        """The first validated batch: its shapes fix d, the outputs and ``single_output``."""
        if self._first is None:
            self._rest = self.batches(defer=True)
            self._first = next(self._rest)
        return self._first[:5]

    def n_rows_bound(self):
        """Number of feature rows (an upper bound for ``readout="all"`` on chunked data)."""
        n_tokens = self.first()[0].shape[1]
        w = self.sample_weight
        n = self.n_samples if w is None else int(np.count_nonzero(w > 0))
        if self.readout == "last":
            return n
        if not self.chunked:
            lengths = self._whole[1]
            return int(lengths.sum() if w is None else lengths[w > 0].sum())
        return n * n_tokens

    def reduce(self, start, *, first=False, name=None):
        """The pass ``start(d_out)`` over every validated chunk, in order.

        ``start(d_out)`` makes an empty accumulator (the pass's
        :class:`~._moments.MomentPass`); every chunk is added to it
        (``add(X, lengths, Y, sample_weight, complete)``), in one process, so
        it may accumulate in the coordinates of its first chunk.  ``first``:
        the fit's first pass, which reads the chunk :meth:`first` validated
        without validating it again, and leaves the check of X's values to the
        moments where the readout allows (``lengths`` None, ``complete(X)``
        the validation's own check); later passes validate every chunk.
        ``name`` is the distributed source's (task names).
        """
        accumulator = start(self.d_out)
        for X, lengths, Y, w, complete in self.solver_batches(defer=first):
            accumulator.add(X, lengths, Y, w, complete)
        return accumulator

    def rows(self, standardizer, terms, dtype):
        """The sequences as the solvers on rows read them (rows computed as needed)."""
        arrays = self.arrays(False)
        return RowReader(None, arrays, self.readout, standardizer, terms if terms else None,
                         np.dtype(dtype), count_rows(arrays[1], self.readout, arrays[3]))

    def solver_batches(self, defer=False):
        """Validated ``(X, lengths, Y, sample_weight, complete)`` batches, in order.

        With ``defer`` (the fit's first pass), lengths None where X's values
        were not checked, and ``complete(X)`` returns ``(X, lengths)`` checked
        (the messages of :func:`check_sequences`, the padding zero-filled).
        The first time, the batch that :meth:`first` validated is not
        validated again; later calls (a second pass) validate every chunk.
        """
        if defer and self._rest is not None:
            first, rest, self._rest = self._first, self._rest, None
            batches = itertools.chain([first], rest)
        else:
            batches = self.batches(defer=defer)
        for Xc, lc, Yc, _, wc, name in batches:
            yield Xc, lc, Yc, wc, functools.partial(complete_sequences, name=name, copy=False)

    def arrays(self, copy):
        """Whole-data arrays ``(X, lengths, Y, sample_weight)``, validated once more if chunked.

        ``copy=False`` returns the caller's array itself for chunked data (NaN
        or anything at padded positions; the solver ignores it by length).
        """
        if not self.chunked:
            Xv, lengths, Y, _, w, _ = next(self.batches())
            return Xv, lengths, Y, w
        # Keep only what is needed of each validated chunk: its copy of the
        # sequences is dropped at once unless the solver needs them all.
        parts = [(Xc if copy else None, lc, Yc) for Xc, lc, Yc, _, _, _ in self.batches()]
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


def standardizer_of(X, lengths, Y=None, sample_weight=None):
    """The standardized coordinates a fit computes for validated sequences.

    The fit's own pass over them and :func:`~._moments.coordinates` (``Y``
    as validated, or None: its scales then stay those of the data).
    """
    source = ArraySource.validated(X, lengths, Y, sample_weight)
    scales = source.reduce(functools.partial(scales_pass, d=source.d, readout="last"),
                           first=True).scales
    return coordinates(scales, source)

