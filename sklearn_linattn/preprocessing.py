"""Transformers of sequences into sequences: positional encodings and patches.

A one-layer linear attention sees its context as a bag: ``S = sum_t x_t x_t^T``
does not change when the tokens are permuted.  Appending a code of each
token's position to the token gives the layer the order back, and the model
stays linear in its cubic features (learned exactly, certified).

Long series cut into patches of consecutive time points, one token each,
keep the token dimension (and the cubic number of features) small.
"""

import math

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from ._base import sequence_tags
from ._memory import real_tokens, resolve_budget
from ._params import check_number, check_option
from ._validation import check_data_format, check_sequences, to_data_format

__all__ = ["Patches", "PositionalEncoding"]

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


def _check_output_memory(what, shape, dtype, work, work_text, advice):
    """A ValueError, before allocating it, for an output of ``shape`` beyond the memory budget.

    ``work``: the bytes that building it takes beside it, ``work_text`` what
    they are, ``advice`` what to do instead.
    """
    budget = resolve_budget(None)
    n_bytes = math.prod(shape) * np.dtype(dtype).itemsize
    if n_bytes + work > budget:
        raise ValueError(
            f"The {what} X, of shape {shape}, needs {n_bytes / 2**30:.3g} GiB of "
            f"{np.dtype(dtype).name} and {work_text}, more than the memory budget of "
            f"{budget / 2**30:.3g} GiB (half the physical memory). {advice}"
        )


class PositionalEncoding(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """Append a positional encoding to every token of every sequence.

    A one-layer linear attention sees its context as a bag: ``sum_t x_t x_t^T``
    carries no position.  This transformer appends ``n_positions_`` channels
    holding each real token's position, so that a
    :class:`~sklearn_linattn.LinearAttentionRegressor` after it in a Pipeline
    can read the order.  With one-hot positions the cubic features contain
    every token linearly (times the current position) and every token times
    the current one: an autoregression on every lag, with interactions, still
    learned exactly by least squares.

    Parameters
    ----------
    kind : {"onehot", "sinusoidal"}, default="onehot"
        ``"onehot"``: channel ``p`` is 1 at the token of position ``p`` and 0
        elsewhere.  ``"sinusoidal"``: the encoding of Vaswani et al. [1]_;
        with ``n = n_positions_`` channels and angular frequencies
        ``w_k = max_period ** (-2 k / n)``, k = 0, ..., n/2 - 1, channel
        ``2k`` is ``sin(w_k p)`` and channel ``2k + 1`` is ``cos(w_k p)``.
    origin : {"start", "end"}, default="start"
        Where position 0 is.  ``"start"``: the first token (positions 0, 1,
        ...).  ``"end"``: the last real token of each sequence, counting
        backwards (``n_i - 1`` for the first of ``n_i`` tokens): sequences
        of different lengths then align on recency (position 1 is always
        the token before the last).  Positions counted from the end tell
        every token how many follow it, so with ``readout="all"``, where
        each position's output must depend on its prefix only, use
        ``"start"``.
    n_positions : int or None, default=None
        Number of channels appended.  ``"onehot"``: the number of positions
        encoded; None learns it in ``fit`` as the longest sequence seen (its
        number of real tokens).  ``"sinusoidal"``: an even number of
        channels (n_positions / 2 frequencies); None means 8 channels
        (4 frequencies: a few channels keep psi, which grows like the cube
        of the token dimension, small).
    max_period : float, default=10000.0
        ``"sinusoidal"`` only, positive: the periods ``2 pi / w_k`` grow
        geometrically from ``2 pi`` to ``2 pi max_period ** (1 - 2 / n)``
        (Vaswani et al.'s 10000 by default).
    handle_unknown : {"error", "ignore"}, default="error"
        ``"onehot"`` only: what ``fit`` and ``transform`` do with a real
        token at a position ``>= n_positions_`` (a sequence longer than
        ``n_positions_``).  ``"error"`` raises a ValueError naming the
        sequence, its length and ``n_positions_``; ``"ignore"`` gives such
        tokens all-zero position channels, as
        :class:`~sklearn.preprocessing.OneHotEncoder` does for unknown
        categories (with ``origin="end"``, the tokens before the last
        ``n_positions_`` ones).  Sinusoidal codes exist at every position.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: ``"channels_last"`` is (n_samples, n_tokens, d),
        ``"channels_first"`` is (n_samples, d, n_tokens) as aeon and sktime
        store series.  The output is in the same layout (as Keras' layers
        read and write theirs): set the same ``data_format`` on every step
        of a Pipeline.

    Attributes
    ----------
    n_features_in_ : int
        Token dimension d seen in ``fit``.
    n_positions_ : int
        Number of position channels appended to each token.

    See Also
    --------
    LinearAttentionRegressor : the layer to put after it in a Pipeline.
    sklearn.preprocessing.OneHotEncoder : the same ``handle_unknown`` choice.

    Notes
    -----
    Padding is preserved: trailing all-NaN tokens stay all-NaN, the new
    channels included, so the output is valid input of every estimator of
    the package.  ``fit`` reads the sequences' lengths only.

    The identifiability certificate of a model fitted on encoded sequences
    speaks about the augmented tokens ``(x_t, e_t)``.  One-hot positions
    never leave the one-hot patterns (for instance the positional block of
    ``S`` is diagonal), so the global certificate, which is about every
    input in ``R^(d + n_positions_)``, cannot hold; what it certifies is
    per input, through ``certificate_.covers(encoder.transform(X_new))``.

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

    Before the layer, which can then read the previous token (a lag-1
    autoregression) exactly, also on inputs ten times larger:

    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(60, 4, 2))
    >>> y = np.concatenate([np.zeros((60, 1, 2)), X[:, :-1]], axis=1)  # y_t = x_(t-1)
    >>> model = make_pipeline(PositionalEncoding(),
    ...                       LinearAttentionRegressor(readout="all")).fit(X, y)
    >>> X_new = 10 * rng.normal(size=(5, 4, 2))
    >>> bool(np.allclose(model.predict(X_new)[:, 1:], X_new[:, :-1]))
    True
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
            Sequences; trailing all-NaN tokens are padding.  Only the token
            dimension and the lengths are read.
        y : None
            Ignored.

        Returns
        -------
        self : PositionalEncoding
            The fitted transformer, with ``n_features_in_`` and
            ``n_positions_`` set.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import PositionalEncoding
        >>> X = np.zeros((2, 5, 3))
        >>> X[0, 2:] = np.nan  # lengths 2 and 5
        >>> enc = PositionalEncoding().fit(X)
        >>> enc.n_features_in_, enc.n_positions_
        (3, 5)
        >>> PositionalEncoding("sinusoidal").fit(X).n_positions_
        8
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
            Sequences of any length, with the token dimension d seen in
            ``fit`` (layout ``data_format``); trailing all-NaN tokens are
            padding.

        Returns
        -------
        X_out : ndarray of shape (n_samples, n_tokens, n_channels)
            In the layout ``data_format`` ((n_samples, n_channels, n_tokens)
            for ``"channels_first"``); a list of sequences comes back padded
            to its longest sequence.  In the default layout,
            ``X_out[i, t, :d]`` is the token ``X[i, t]``; the last
            ``n_positions_`` channels (``n_channels = d + n_positions_``)
            hold its position's code at real tokens and NaN at padded ones.  Floating input keeps its dtype
            (float64, float32, float16); other numbers become float64.

        Raises
        ------
        ValueError
            With ``kind="onehot"`` and ``handle_unknown="error"``, for a
            sequence longer than ``n_positions_``; when ``kind`` or
            ``n_positions`` changed since ``fit``.

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
        return to_data_format(out, self.data_format)

    def get_feature_names_out(self, input_features=None):
        """Names of the output channels: the token's, then ``pos0, pos1, ...``.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the d token coordinates; default ``x0, ..., x{d-1}``
            (as :class:`~sklearn_linattn.LinearAttentionFeatures` names
            them).

        Returns
        -------
        names : ndarray of str objects, shape (n_channels,)
            One name per channel (last axis) of :meth:`transform`'s output,
            ``n_channels = d + n_positions_``.
            For ``kind="sinusoidal"``, ``pos{2k}`` and ``pos{2k+1}`` are the
            sine and cosine of frequency k.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import PositionalEncoding
        >>> enc = PositionalEncoding().fit(np.zeros((1, 2, 2)))
        >>> enc.get_feature_names_out(["price", "volume"]).tolist()
        ['price', 'volume', 'pos0', 'pos1']
        """
        check_is_fitted(self)
        if input_features is None:
            input_features = [f"x{j}" for j in range(self.n_features_in_)]
        elif len(input_features) != self.n_features_in_:
            raise ValueError(
                f"input_features must name the {self.n_features_in_} token coordinates; "
                f"got {len(input_features)} names."
            )
        names = list(input_features) + [f"pos{p}" for p in range(self.n_positions_)]
        return np.asarray(names, dtype=object)

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32", "float16"]
        return tags


class Patches(TransformerMixin, BaseEstimator, auto_wrap_output_keys=None):
    """Cut each series into patches of consecutive time points, one token per patch.

    A series of T time points of c channels read one token per time point,
    with one-hot positions, has tokens of dimension ``d = T + c``, and the
    layer's number of features ``psi = d**2 (d + 1) / 2`` grows like the
    cube of it (84 daily values of one channel: d = 85, psi = 310 675).
    Patches of p time points (as in PatchTST [1]_) make tokens of dimension
    ``p c`` and ``T / p`` of them (with positions after this step,
    ``d = p c + T / p``), so that
    :class:`~sklearn_linattn.LinearAttentionRegressor` stays small enough to
    fit exactly: 84 values in patches of 7 give d = 7 + 12 = 19, psi = 3 610.

    Parameters
    ----------
    patch_size : int, default=8
        Number p of consecutive time points in each patch, >= 1.
    stride : int or None, default=None
        Time points between the starts of consecutive patches, >= 1.  None
        is ``patch_size``: patches side by side.  A smaller stride gives
        overlapping patches (PatchTST's choice), a larger one skips the time
        points between patches.
    align : {"end", "start"}, default="end"
        Where the cutting starts.  ``"end"``: backwards from each series'
        last real time point, so that the last token always ends at the
        latest observation (what ``readout="last"`` reads), whatever the
        series' length.  ``"start"``: forwards from its first time point.
    incomplete : {"drop", "zeros"}, default="drop"
        What becomes of the time points that do not fill a whole patch (at
        the start of a series for ``align="end"``, at its end for
        ``align="start"``).  ``"drop"``: they are left out; a series of fewer
        than ``patch_size`` real time points then has no patch, a
        ValueError.  ``"zeros"``: one more patch holds them, its missing
        time points set to 0, when it holds at least one real time point
        (then every real time point is in some token unless ``stride`` is
        larger than ``patch_size``).  With ``align="start"`` that patch is
        the last token, which ``readout="last"`` reads: the zeros in it can
        keep the identifiability certificate from holding.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: ``"channels_last"`` is (n_samples, n_timepoints,
        n_channels), ``"channels_first"`` is (n_samples, n_channels,
        n_timepoints) as aeon and sktime store series.  The output is in the
        same layout: set the same ``data_format`` on every step of a
        Pipeline.

    Attributes
    ----------
    n_features_in_ : int
        Number of channels c seen in ``fit`` (the token dimension of the
        input).

    See Also
    --------
    PositionalEncoding : the positions of the patches, next in a Pipeline.
    LinearAttentionRegressor : the layer that reads the patches.

    Notes
    -----
    Token layout: the token of a patch holds its p time points in time
    order, each with its c channels, ``token[k c + j] = x[t0 + k, j]`` for
    the patch starting at time point ``t0`` (k < p, j < c); the names of
    :meth:`get_feature_names_out` say the same.  The tokens of a series come
    in time order; a series with fewer patches than the longest one is
    padded with trailing all-NaN tokens, the package's padding, so the
    output is valid input of every estimator of the package.  Trailing
    all-NaN time points of the input are padding too: series may have
    different lengths, and with ``align="end"`` each is cut from its own
    last real time point.  ``fit`` reads the number of channels and the
    lengths only.

    The patch size is a hyperparameter like any other: search it with
    :class:`~sklearn.model_selection.GridSearchCV` over
    ``patches__patch_size`` in a Pipeline (see the Examples).

    References
    ----------
    .. [1] Y. Nie, N. H. Nguyen, P. Sinthong and J. Kalagnanam, "A Time
       Series is Worth 64 Words: Long-term Forecasting with Transformers",
       ICLR 2023.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.preprocessing import Patches
    >>> X = np.arange(10.0).reshape(1, 5, 2)  # 5 time points of 2 channels
    >>> X[0]
    array([[0., 1.],
           [2., 3.],
           [4., 5.],
           [6., 7.],
           [8., 9.]])
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

    Series of 12 time points, whose target multiplies the last value by the
    one a patch before: in patches of 4 with positions, tokens of d = 4 + 3
    (196 features, instead of 1 183 for one token per time point), learned
    exactly:

    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.preprocessing import PositionalEncoding
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 12, 1))
    >>> y = X[:, -1, 0] * X[:, -5, 0]
    >>> model = make_pipeline(Patches(4), PositionalEncoding(),
    ...                       LinearAttentionRegressor()).fit(X, y)
    >>> model[-1].coef_.shape
    (1, 196)
    >>> X_new = rng.normal(size=(5, 12, 1))
    >>> bool(np.allclose(model.predict(X_new), X_new[:, -1, 0] * X_new[:, -5, 0]))
    True

    The patch size chosen by cross-validation:

    >>> from sklearn.model_selection import GridSearchCV
    >>> search = GridSearchCV(model, {"patches__patch_size": [2, 4]}, cv=3).fit(X, y)
    >>> sorted(search.cv_results_["param_patches__patch_size"].tolist())
    [2, 4]
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

    def _n_patches(self, lengths, size, stride):
        """Number of patches of each series; a ValueError for a series without one."""
        n = np.where(lengths >= size, (lengths - size) // stride + 1, 0)
        if self.incomplete == "zeros":
            # The first incomplete patch, kept when it holds a real time point.
            n = n + (n * stride < lengths)
        empty = n == 0
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            raise ValueError(
                f"X[{i}] has {int(lengths[i])} real time points, fewer than "
                f"patch_size={size}: incomplete='drop' cuts no patch from it. Pass a smaller "
                "patch_size, or incomplete='zeros' to keep its time points in a patch "
                "completed with zeros."
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
            Series (layout ``data_format``); trailing all-NaN time points are
            padding.  Only the number of channels and the lengths are read.
        y : None
            Ignored.

        Returns
        -------
        self : Patches
            The fitted transformer, with ``n_features_in_`` set.

        Raises
        ------
        ValueError
            With ``incomplete="drop"``, for a series of fewer than
            ``patch_size`` real time points.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn.preprocessing import Patches
        >>> Patches(4).fit(np.zeros((2, 12, 3))).n_features_in_
        3
        """
        size, stride = self._check_params()
        X, lengths = self._sequences(X)
        self._n_patches(lengths, size, stride)
        self.n_features_in_ = X.shape[2]
        return self

    def transform(self, X):
        """The patches of every series, one token each; fewer patches padded with NaN.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_timepoints, n_channels) or list of \
(n_timepoints_i, n_channels) arrays
            Series of any length, with the number of channels seen in
            ``fit`` (layout ``data_format``); trailing all-NaN time points are
            padding.

        Returns
        -------
        X_out : ndarray of shape (n_samples, n_patches, patch_size * n_channels)
            In the layout ``data_format`` ((n_samples, patch_size *
            n_channels, n_patches) for ``"channels_first"``); a list of series
            comes back padded.  In the default layout, ``X_out[i, m]`` is the
            m-th patch of series i in time
            order, ``X_out[i, m, k * n_channels + j]`` its k-th time point's
            channel j; ``n_patches`` is the largest number of patches of a
            series, the tokens after a series' last patch are all NaN.
            Floating input keeps its dtype (float64, float32, float16); other
            numbers become float64.

        Raises
        ------
        ValueError
            With ``incomplete="drop"``, for a series of fewer than
            ``patch_size`` real time points.

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
        X, lengths = self._sequences(X, self.n_features_in_)
        n_samples, n_timepoints, c = X.shape
        n = self._n_patches(lengths, size, stride)
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
        return to_data_format(out.reshape(n_samples, n_tokens, size * c), self.data_format)

    def get_feature_names_out(self, input_features=None):
        """Names of the output channels: ``t{k}_{name}``, time point k of the patch.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the input's channels; default ``x0, ..., x{c-1}`` (as
            :class:`PositionalEncoding` names them).

        Returns
        -------
        names : ndarray of str objects, shape (patch_size * n_channels,)
            One name per channel (last axis) of :meth:`transform`'s output,
            in its order: ``t0_x0, t0_x1, ..., t1_x0, ...``.

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
        if input_features is None:
            input_features = [f"x{j}" for j in range(self.n_features_in_)]
        elif len(input_features) != self.n_features_in_:
            raise ValueError(
                f"input_features must name the {self.n_features_in_} channels; "
                f"got {len(input_features)} names."
            )
        names = [f"t{k}_{name}" for k in range(size) for name in input_features]
        return np.asarray(names, dtype=object)

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32", "float16"]
        return tags
