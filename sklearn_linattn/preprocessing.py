"""Transformers of sequences into sequences: positional encodings and patches."""

import math

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from ._base import sequence_tags
from ._memory import real_tokens, resolve_budget
from ._params import check_number, check_option
from ._source import layout_written, looks_transposed, mark_layout_written
from ._validation import check_data_format, check_sequences, to_data_format

__all__ = ["AppendConstant", "Patches", "PositionalEncoding"]

KINDS = ("onehot", "sinusoidal")
ORIGINS = ("start", "end")
HANDLE_UNKNOWN = ("error", "ignore")
ALIGNS = ("end", "start")
INCOMPLETE = ("drop", "zeros")
#: Channels of ``kind="sinusoidal"`` when ``n_positions`` is None: 4 frequencies.
_DEFAULT_SINUSOIDAL_CHANNELS = 8


def _sinusoidal_frequencies(n_channels, max_period):
    """The angular frequencies ``max_period ** (-2k / n_channels)``, k < n_channels / 2."""
    return max_period ** (-2.0 * np.arange(n_channels // 2) / n_channels)


def _input_names(n, input_features, what):
    """The names of the n input channels: ``input_features`` (checked), or x0, x1, ..."""
    if input_features is None:
        return [f"x{j}" for j in range(n)]
    if len(input_features) != n:
        raise ValueError(
            f"input_features must name the {n} {what}; got {len(input_features)} names.")
    return list(input_features)


def _count(n, noun):
    """``"1 time point"``, ``"12 time points"``."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _other_layout_advice(shape, size, data_format):
    """Patches' advice for series without a patch that are read in the wrong layout, or None.

    ``shape`` is X as read, (n_samples, n_timepoints, n_channels).  Advice
    only when the time axis as read is shorter than ``size`` and the channel
    axis is not: X read in the other layout would have enough time points.
    """
    n_samples, n_timepoints, n_channels = shape
    if not n_timepoints < size <= n_channels:
        return None
    last = "(n_samples, n_timepoints, n_channels)"
    first = "(n_samples, n_channels, n_timepoints)"
    if data_format == "channels_last":
        axes, as_read = last, (n_samples, n_timepoints, n_channels)
        other_axes, other = first + ", as aeon and sktime store them", "channels_first"
    else:
        axes, as_read = first, (n_samples, n_channels, n_timepoints)
        other_axes, other = last, "channels_last"
    return (
        f'X is read as {axes} = {as_read} with data_format="{data_format}": series of '
        f"{_count(n_timepoints, 'time point')} of {_count(n_channels, 'channel')}. If X "
        f"holds series of {_count(n_channels, 'time point')} of "
        f"{_count(n_timepoints, 'channel')} stored as {other_axes}, pass "
        f'data_format="{other}"; if it does hold series of '
        f"{_count(n_timepoints, 'time point')}, pass a patch_size of at most "
        f"{n_timepoints}, or incomplete='zeros' to keep their time points in a patch "
        "completed with zeros."
    )


def _check_output_memory(what, shape, dtype, work, work_text, advice):
    """A ValueError, before allocating it, for an output of ``shape`` beyond the memory budget.

    ``work``: the bytes built beside it, ``work_text`` what they are, ``advice`` what to do.
    """
    budget = resolve_budget(None)
    n_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    if n_bytes + work > budget:
        raise ValueError(
            f"The {what} X, of shape {shape}, needs {n_bytes / 2**30:.3g} GiB of "
            f"{np.dtype(dtype).name} and {work_text}, more than the memory budget of "
            f"{budget / 2**30:.3g} GiB (half the physical memory). {advice}"
        )


def _carry_layout_mark(out, given):
    """``out``, marked as written by the package when ``given`` was.

    A transformer that keeps its input's token layout (positions or a constant
    appended) carries the mark of a layout the package chose (Patches) on;
    the output of a user's array is judged as that array.
    """
    if layout_written(given):
        mark_layout_written(out)
    return out


class PositionalEncoding(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """Append a positional encoding to every token of every sequence.

    Appends ``n_positions_`` channels holding each real token's position, so
    that a :class:`~sklearn_linattn.LinearAttentionRegressor` after it in a
    Pipeline can read the order.  Padded tokens stay all-NaN, the new channels
    included.  See the user guide's :doc:`/positions` page.

    Parameters
    ----------
    kind : {"onehot", "sinusoidal"}, default="onehot"
        ``"onehot"``: channel ``p`` is 1 at the token of position ``p``, else 0.
        ``"sinusoidal"`` (Vaswani et al. [1]_): channels ``2k`` and ``2k + 1`` are
        ``sin(w_k p)`` and ``cos(w_k p)``, ``w_k = max_period ** (-2k / n_positions_)``.
    origin : {"start", "end"}, default="start"
        Position 0 is the first token (``"start"``), or the last real token of
        each sequence, counting backwards (``"end"``: sequences align on
        recency).  With ``readout="all"`` use ``"start"``.
    n_positions : int or None, default=None
        Number of channels appended.  ``"onehot"``: positions encoded; None
        learns the longest sequence seen in ``fit``.  ``"sinusoidal"``: an even
        number; None means 8 (4 frequencies).
    max_period : float, default=10000.0
        ``"sinusoidal"`` only, positive: the periods ``2 pi / w_k`` grow
        geometrically from ``2 pi`` to ``2 pi max_period ** (1 - 2 / n_positions_)``.
    handle_unknown : {"error", "ignore"}, default="error"
        ``"onehot"`` only: a real token at a position ``>= n_positions_`` raises
        a ValueError (``"error"``) or gets all-zero position channels
        (``"ignore"``, as OneHotEncoder does for unknown categories).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X and of the output: (n_samples, n_tokens, d), or (n_samples,
        d, n_tokens) as aeon and sktime store series.

    Attributes
    ----------
    n_features_in_ : int
        Token dimension d seen in ``fit``.
    n_positions_ : int
        Number of position channels appended to each token.

    See Also
    --------
    Patches : patches of long series, before it in a Pipeline.

    References
    ----------
    .. [1] A. Vaswani et al., "Attention Is All You Need", NeurIPS 2017,
       Section 3.5.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.preprocessing import PositionalEncoding
    >>> X = [np.array([[5.0], [6.0], [7.0]]), np.array([[8.0], [9.0]])]
    >>> enc = PositionalEncoding().fit(X)
    >>> enc.n_positions_, enc.get_feature_names_out().tolist()
    (3, ['x0', 'pos0', 'pos1', 'pos2'])
    >>> enc.transform(X)[1]  # padding stays NaN
    array([[ 8.,  1.,  0.,  0.],
           [ 9.,  0.,  1.,  0.],
           [nan, nan, nan, nan]])
    >>> PositionalEncoding(origin="end").fit_transform(X)[1, :2]  # 0 = the last token
    array([[8., 0., 1., 0.],
           [9., 1., 0., 0.]])
    """

    def __init__(self, kind="onehot", *, origin="start", n_positions=None, max_period=10000.0,
                 handle_unknown="error", data_format="channels_last"):
        self.kind = kind
        self.origin = origin
        self.n_positions = n_positions
        self.max_period = max_period
        self.handle_unknown = handle_unknown
        self.data_format = data_format

    def _check_params(self):
        check_option(self.kind, "kind", KINDS)
        check_option(self.origin, "origin", ORIGINS)
        check_option(self.handle_unknown, "handle_unknown", HANDLE_UNKNOWN)
        check_data_format(self.data_format)
        check_number(self.max_period, "max_period", low=0, low_open=True)
        n = check_number(self.n_positions, "n_positions", integer=True, low=1, allow_none=True)
        if self.kind == "sinusoidal" and n is not None and n % 2:
            raise ValueError(
                "n_positions must be even for kind='sinusoidal' (a sine and a cosine per "
                f"frequency); got {n}."
            )
        return n

    def _sequences(self, X, n_features_in=None):
        # fill_value=None keeps the NaN padding: it is copied into the output.
        return check_sequences(X, n_features_in=n_features_in, data_format=self.data_format,
                               fill_value=None, copy=False)

    def _check_lengths(self, lengths, n_positions):
        if self.kind != "onehot" or self.handle_unknown == "ignore":
            return
        too_long = lengths > n_positions
        if too_long.any():
            i = int(np.flatnonzero(too_long)[0])
            raise ValueError(
                f"X[{i}] has {int(lengths[i])} real tokens, but one-hot positions encode "
                f"n_positions_={n_positions} positions (0 to {n_positions - 1}); the longest "
                f"sequence here has {int(lengths.max())}. Pass a larger n_positions, or "
                "handle_unknown='ignore' to give the tokens at later positions all-zero "
                "position channels."
            )

    def _check_memory(self, shape, dtype):
        """Refuse, before allocating it, an output larger than the memory budget."""
        fewer = (" or fewer positions (n_positions with handle_unknown='ignore'; with "
                 "origin='end' the most recent tokens keep theirs)"
                 if self.kind == "onehot" else "")
        # Beside the output: the positions' angles or comparisons while they are written.
        _check_output_memory("encoded", shape, dtype, math.prod(shape) * np.dtype(dtype).itemsize,
                             "up to as much again while it is built",
                             f"Encode fewer sequences at a time{fewer}.")

    def fit(self, X, y=None):
        """Learn the token dimension and, for one-hot positions, the number of positions.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences; trailing all-NaN tokens are padding.  Only d and the lengths are read.
        y : None
            Ignored.

        Returns
        -------
        self : PositionalEncoding
            The fitted transformer.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import PositionalEncoding
        >>> X = np.zeros((2, 5, 3))
        >>> X[0, 2:] = np.nan  # lengths 2 and 5
        >>> enc = PositionalEncoding().fit(X)
        >>> enc.n_features_in_, enc.n_positions_
        (3, 5)
        """
        n_positions = self._check_params()
        X, lengths = self._sequences(X)
        if n_positions is None:
            n_positions = (int(lengths.max()) if self.kind == "onehot"
                           else _DEFAULT_SINUSOIDAL_CHANNELS)
        self._check_lengths(lengths, n_positions)
        self.n_features_in_ = X.shape[2]
        self.n_positions_ = n_positions
        self._fitted_for = (self.kind, self.n_positions)
        return self

    def _check_fitted_for(self):
        """The parameters ``n_positions_`` was set for are the current ones."""
        fitted_for = self._fitted_for
        if fitted_for != (self.kind, self.n_positions):
            raise ValueError(
                f"kind={self.kind!r} and n_positions={self.n_positions!r} were changed since "
                f"fit, which set n_positions_={self.n_positions_} for kind={fitted_for[0]!r} "
                f"and n_positions={fitted_for[1]!r}; call fit again."
            )

    def transform(self, X):
        """Each token followed by the code of its position; padding stays NaN.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length and the d seen in ``fit``; trailing all-NaN tokens are padding.

        Returns
        -------
        X_out : ndarray of shape (n_samples, n_tokens, n_channels)
            In the layout ``data_format``, lists padded: each token, then its position's
            code (NaN at padded tokens), ``n_channels = d + n_positions_``.  Float64,
            float32 and float16 keep their dtype, other numbers become float64.
            When X is an output of :class:`Patches` (or of a chain of this
            module's transformers from one), so is X_out for the estimators'
            layout check: neither is judged (no
            :class:`~sklearn_linattn.exceptions.LayoutWarning`).

        Raises
        ------
        ValueError
            For a sequence longer than ``n_positions_`` with ``handle_unknown="error"``
            (one-hot), or when ``kind`` or ``n_positions`` changed since ``fit``.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import PositionalEncoding
        >>> enc = PositionalEncoding("sinusoidal", n_positions=2).fit(np.zeros((1, 3, 1)))
        >>> enc.transform(np.zeros((1, 3, 1))).round(3)  # sin(p), cos(p)
        array([[[ 0.   ,  0.   ,  1.   ],
                [ 0.   ,  0.841,  0.54 ],
                [ 0.   ,  0.909, -0.416]]])
        """
        check_is_fitted(self)
        self._check_params()
        self._check_fitted_for()
        given = X
        X, lengths = self._sequences(X, self.n_features_in_)
        n_samples, n_tokens, d = X.shape
        self._check_lengths(lengths, self.n_positions_)
        self._check_memory((n_samples, n_tokens, d + self.n_positions_), X.dtype)
        real = real_tokens(lengths, n_tokens)
        t = np.arange(n_tokens)
        pos = np.broadcast_to(t, real.shape) if self.origin == "start" else (
            lengths[:, None] - 1 - t)
        out = np.empty((n_samples, n_tokens, d + self.n_positions_), dtype=X.dtype)
        out[..., :d] = X  # NaN padding included
        if self.kind == "onehot":
            out[..., d:] = pos[:, :, None] == np.arange(self.n_positions_)
        else:
            angle = pos[:, :, None] * _sinusoidal_frequencies(self.n_positions_,
                                                              float(self.max_period))
            out[..., d::2] = np.sin(angle)
            out[..., d + 1::2] = np.cos(angle)
        out[~real] = np.nan
        return _carry_layout_mark(to_data_format(out, self.data_format), given)

    def get_feature_names_out(self, input_features=None):
        """Names of the output channels: the token's, then ``pos0, pos1, ...``.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the d token coordinates; default ``x0, ..., x{d-1}``.

        Returns
        -------
        names : ndarray of str objects, shape (n_channels,)
            One per output channel (``d + n_positions_``); ``kind="sinusoidal"``:
            ``pos{2k}``, ``pos{2k+1}`` the sine and cosine of frequency k.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import PositionalEncoding
        >>> enc = PositionalEncoding().fit(np.zeros((1, 2, 2)))
        >>> enc.get_feature_names_out(["price", "volume"]).tolist()
        ['price', 'volume', 'pos0', 'pos1']
        """
        check_is_fitted(self)
        names = (_input_names(self.n_features_in_, input_features, "token coordinates")
                 + [f"pos{p}" for p in range(self.n_positions_)])
        return np.asarray(names, dtype=object)

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32", "float16"]
        return tags


class Patches(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """Cut each series into patches of consecutive time points, one token per patch.

    The token of the patch starting at time point ``t0`` is ``token[k c + j] =
    x[t0 + k, j]`` (k < p time points, j < c channels), tokens in time order,
    series with fewer patches padded with all-NaN tokens.  Trailing all-NaN time
    points of the input are padding.  See the user guide's :ref:`real-data-patches`.

    Parameters
    ----------
    patch_size : int, default=8
        Number p of consecutive time points in each patch, >= 1.
    stride : int or None, default=None
        Time points between the starts of consecutive patches, >= 1; None is
        ``patch_size`` (side by side).  Smaller strides overlap, larger skip.
    align : {"end", "start"}, default="end"
        ``"end"``: cut backwards from each series' last real time point (the
        last token ends at the latest observation, whatever the length);
        ``"start"``: forwards from its first time point.
    incomplete : {"drop", "zeros"}, default="drop"
        The time points that fill no whole patch: left out (``"drop"``; a
        series shorter than ``patch_size`` is then a ValueError), or kept in
        one more patch completed with zeros (``"zeros"``).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X and of the output: (n_samples, n_timepoints, n_channels) or
        (n_samples, n_channels, n_timepoints).

    Attributes
    ----------
    n_features_in_ : int
        Number of channels c seen in ``fit``.

    See Also
    --------
    PositionalEncoding : the positions of the patches, next in a Pipeline.

    References
    ----------
    .. [1] Y. Nie, N. H. Nguyen, P. Sinthong and J. Kalagnanam, "A Time
       Series is Worth 64 Words: Long-term Forecasting with Transformers",
       ICLR 2023.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.preprocessing import Patches
    >>> X = np.arange(10.0).reshape(1, 5, 2)  # 5 time points of 2 channels: (0, 1), ..., (8, 9)
    >>> patches = Patches(2).fit(X)
    >>> patches.get_feature_names_out().tolist()
    ['t0_x0', 't0_x1', 't1_x0', 't1_x1']
    >>> patches.transform(X)  # cut from the end: time point 0 left out
    array([[[2., 3., 4., 5.],
            [6., 7., 8., 9.]]])
    >>> Patches(2, align="start", incomplete="zeros").fit_transform(X)
    array([[[0., 1., 2., 3.],
            [4., 5., 6., 7.],
            [8., 9., 0., 0.]]])
    >>> Patches(2, stride=1).fit_transform(X[:, :3])  # overlapping
    array([[[0., 1., 2., 3.],
            [2., 3., 4., 5.]]])
    """

    def __init__(self, patch_size=8, *, stride=None, align="end", incomplete="drop",
                 data_format="channels_last"):
        self.patch_size = patch_size
        self.stride = stride
        self.align = align
        self.incomplete = incomplete
        self.data_format = data_format

    def _check_params(self):
        """The checked ``(patch_size, stride)``, stride None resolved."""
        size = check_number(self.patch_size, "patch_size", integer=True, low=1)
        stride = check_number(self.stride, "stride", integer=True, low=1, allow_none=True)
        check_option(self.align, "align", ALIGNS)
        check_option(self.incomplete, "incomplete", INCOMPLETE)
        check_data_format(self.data_format)
        return size, size if stride is None else stride

    def _sequences(self, X, n_features_in=None):
        # fill_value=None keeps the NaN padding: it marks the series' lengths,
        # and copy=False because only the gathered copy is written.
        return check_sequences(X, n_features_in=n_features_in, data_format=self.data_format,
                               fill_value=None, copy=False)

    def _n_patches(self, lengths, size, stride, shape):
        """Number of patches of each series; a ValueError for a series without one.

        ``shape``: X as read, (n_samples, n_timepoints, n_channels).  When the
        series is X's whole time axis and X read in the other layout would have
        ``patch_size`` time points, the message says so rather than advise a
        smaller ``patch_size`` (which would fit a model of every "channel").
        """
        n = np.where(lengths >= size, (lengths - size) // stride + 1, 0)
        if self.incomplete == "zeros":
            # The first incomplete patch, kept when it holds a real time point.
            n = n + (n * stride < lengths)
        empty = n == 0
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            # Padding in the series as read means X was read in its layout.
            advice = (_other_layout_advice(shape, size, self.data_format)
                      if lengths[i] == shape[1] else None)
            raise ValueError(
                f"X[{i}] has {int(lengths[i])} real time points, fewer than "
                f"patch_size={size}: incomplete='drop' cuts no patch from it. "
                + (advice or "Pass a smaller patch_size, or incomplete='zeros' to keep its "
                   "time points in a patch completed with zeros.")
            )
        return n

    def _check_memory(self, shape, dtype):
        """Refuse, before allocating it, an output larger than the memory budget."""
        # Beside the output: the time index of every time point of every
        # patch (int64) and two masks of them.
        work = 10 * math.prod(shape) // int(self.n_features_in_)
        _check_output_memory("patched", shape, dtype, work,
                             f"{work / 2**30:.3g} GiB of indices while it is built",
                             "Patch fewer sequences at a time, or pass a larger stride.")

    def fit(self, X, y=None):
        """Learn the number of channels; check that every series has a patch.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_timepoints, n_channels) or list of \
        (n_timepoints_i, n_channels) arrays
            Series; trailing all-NaN time points are padding.  Only the number of
            channels and the lengths are read.
        y : None
            Ignored.

        Returns
        -------
        self : Patches
            The fitted transformer.

        Raises
        ------
        ValueError
            With ``incomplete="drop"``, for a series shorter than ``patch_size``
            (naming the other layout when X read in it would have enough time points).

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import Patches
        >>> Patches(4).fit(np.zeros((2, 12, 3))).n_features_in_
        3
        """
        size, stride = self._check_params()
        X, lengths = self._sequences(X)
        self._n_patches(lengths, size, stride, X.shape)
        self.n_features_in_ = X.shape[2]
        return self

    def transform(self, X):
        """The patches of every series, one token each; fewer patches padded with NaN.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_timepoints, n_channels) or list of \
        (n_timepoints_i, n_channels) arrays
            Series of any length and the channels seen in ``fit``; trailing all-NaN
            time points are padding.

        Returns
        -------
        X_out : ndarray of shape (n_samples, n_patches, patch_size * n_channels)
            In the layout ``data_format``, lists padded: the patches in time order,
            ``n_patches`` the most of any series, later tokens all NaN.  Float64,
            float32 and float16 keep their dtype, other numbers become float64.
            The estimators' layout check does not judge this very array (wide
            tokens are what patches are: no
            :class:`~sklearn_linattn.exceptions.LayoutWarning`), unless X as
            read has more than 4 times as many channels as time points, or fewer
            time points than ``patch_size`` and at least as many channels: X may
            then be stored in the other layout, and X_out is judged as X would be.

        Raises
        ------
        ValueError
            With ``incomplete="drop"``, for a series shorter than ``patch_size``;
            when X read in the other layout would have ``patch_size`` time points,
            the message names the layout X was read in and the ``data_format``
            of the other.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import Patches
        >>> X = [np.arange(1.0, 6.0)[:, None], np.arange(1.0, 4.0)[:, None]]  # lengths 5, 3
        >>> Patches(2).fit(X).transform(X)  # each cut from its own last time point
        array([[[ 2.,  3.],
                [ 4.,  5.]],
        <BLANKLINE>
               [[ 2.,  3.],
                [nan, nan]]])
        """
        check_is_fitted(self)
        size, stride = self._check_params()
        given = X
        X, lengths = self._sequences(X, self.n_features_in_)
        n_samples, n_timepoints, c = X.shape
        n = self._n_patches(lengths, size, stride, X.shape)
        n_tokens = int(n.max())
        self._check_memory((n_samples, n_tokens, size * c), X.dtype)
        m = np.arange(n_tokens)
        if self.align == "start":
            start = np.broadcast_to(m * stride, (n_samples, n_tokens))
        else:
            # The last patch ends at the last real time point, each one before
            # it starts a stride earlier.
            start = (lengths - size)[:, None] - (n[:, None] - 1 - m) * stride
        t = start[:, :, None] + np.arange(size)  # (n_samples, n_tokens, size)
        inside = (t >= 0) & (t < lengths[:, None, None])
        np.clip(t, 0, n_timepoints - 1, out=t)
        out = X[np.arange(n_samples)[:, None, None], t]  # (n_samples, n_tokens, size, c)
        out[~inside] = 0.0  # the missing time points of incomplete patches
        out[m[None, :] >= n[:, None]] = np.nan
        out = to_data_format(out.reshape(n_samples, n_tokens, size * c), self.data_format)
        # The tokens are patches, wide by design (a window of p time points is
        # one token of d = p c): the estimator's layout check, made for raw
        # series, is not for them.  Unless X itself could be series stored the
        # other way (many more channels than time points as read): then the
        # estimator judges the output, as it would have judged X.
        if layout_written(given) or not (looks_transposed(n_timepoints, c)
                                         or n_timepoints < size <= c):
            mark_layout_written(out)
        return out

    def get_feature_names_out(self, input_features=None):
        """Names of the output channels: ``t{k}_{name}``, time point k of the patch.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the input's channels; default ``x0, ..., x{c-1}``.

        Returns
        -------
        names : ndarray of str objects, shape (patch_size * n_channels,)
            One per output channel: ``t0_x0, t0_x1, ..., t1_x0, ...``.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import Patches
        >>> patches = Patches(3).fit(np.zeros((1, 6, 2)))
        >>> patches.get_feature_names_out(["price", "volume"]).tolist()
        ['t0_price', 't0_volume', 't1_price', 't1_volume', 't2_price', 't2_volume']
        """
        check_is_fitted(self)
        size, _ = self._check_params()
        input_features = _input_names(self.n_features_in_, input_features, "channels")
        names = [f"t{k}_{name}" for k in range(size) for name in input_features]
        return np.asarray(names, dtype=object)

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32", "float16"]
        return tags


class AppendConstant(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """A constant channel appended to every token: attention with biases as plain attention.

    A layer whose query, key and value projections have biases computes
    ``q = W_q x + b_q = [W_q b_q] [x; 1]``: it is the package's attention on
    the tokens ``[x; 1]``, exactly (its output bias is the ``intercept_`` of
    ``fit_intercept=True``).  So ``make_pipeline(AppendConstant(),
    LinearAttentionRegressor(fit_intercept=True))`` fits the class of layers
    with biases, its certificate speaks about the augmented tokens, and
    :func:`~sklearn_linattn.nn.to_torch` of the Pipeline writes a layer with
    biases on the tokens as given (the user guide's :doc:`/in_context` page).

    Parameters
    ----------
    value : float, default=1.0
        The constant, non-zero and finite (its size only rescales the biases).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X and of the output, as for :class:`PositionalEncoding`.

    Attributes
    ----------
    n_features_in_ : int
        Token dimension d seen in ``fit``; the output has ``d + 1``.

    See Also
    --------
    PositionalEncoding : positions appended to the tokens.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.preprocessing import AppendConstant
    >>> X = np.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [np.nan, np.nan]]])
    >>> AppendConstant().fit_transform(X)[1]  # padding stays NaN
    array([[ 5.,  6.,  1.],
           [nan, nan, nan]])
    """

    def __init__(self, value=1.0, *, data_format="channels_last"):
        self.value = value
        self.data_format = data_format

    def _check_params(self):
        check_data_format(self.data_format)
        value = check_number(self.value, "value")
        if value == 0:
            raise ValueError("value must be non-zero (a zero channel adds nothing); got 0.")
        return value

    def fit(self, X, y=None):
        """Learn the token dimension.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences; trailing all-NaN tokens are padding.
        y : None
            Ignored.

        Returns
        -------
        self : AppendConstant
            The fitted transformer.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import AppendConstant
        >>> AppendConstant().fit(np.zeros((2, 4, 3))).n_features_in_
        3
        """
        self._check_params()
        X, _ = check_sequences(X, data_format=self.data_format, fill_value=None, copy=False)
        self.n_features_in_ = X.shape[2]
        return self

    def transform(self, X):
        """Each real token followed by ``value``; padding stays NaN.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences with the d seen in ``fit``; trailing all-NaN tokens are padding.

        Returns
        -------
        X_out : ndarray of shape (n_samples, n_tokens, d + 1)
            In the layout ``data_format``; float64, float32 and float16 keep their dtype.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import AppendConstant
        >>> AppendConstant(2.0).fit_transform(np.ones((1, 1, 2)))
        array([[[1., 1., 2.]]])
        """
        check_is_fitted(self)
        value = self._check_params()
        given = X
        X, lengths = check_sequences(X, n_features_in=self.n_features_in_,
                                     data_format=self.data_format, fill_value=None, copy=False)
        n_samples, n_tokens, d = X.shape
        _check_output_memory("augmented", (n_samples, n_tokens, d + 1), X.dtype,
                             0, "nothing beside it", "Transform fewer sequences at a time.")
        out = np.empty((n_samples, n_tokens, d + 1), dtype=X.dtype)
        out[..., :d] = X
        out[..., d] = np.where(real_tokens(lengths, n_tokens), value, np.nan)
        return _carry_layout_mark(to_data_format(out, self.data_format), given)

    def get_feature_names_out(self, input_features=None):
        """Names of the output channels: the token's, then ``"const"``.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the d token coordinates; default ``x0, ..., x{d-1}``.

        Returns
        -------
        names : ndarray of str objects, shape (d + 1,)
            One per output channel.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import AppendConstant
        >>> AppendConstant().fit(np.zeros((1, 2, 2))).get_feature_names_out().tolist()
        ['x0', 'x1', 'const']
        """
        check_is_fitted(self)
        names = _input_names(self.n_features_in_, input_features, "token coordinates")
        return np.asarray(names + ["const"], dtype=object)

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32", "float16"]
        return tags
