"""One sequence regressor for windows of series: normalization, patches and the search chosen.

:class:`SequenceRegressor` is the recipe of the README and the real-data
page as one estimator: each candidate configuration (a level normalization
of the windows, a patch size) is a pipeline ``Patches -> PositionalEncoding ->
LinearAttentionRegressorCV``, whose one pass scores every penalty, decay,
term and linear-term penalty on the same folds; the configuration with the
best score is kept, already refitted.  Scores of every configuration are
squared errors in the data's units (:func:`~._units.error_weights`), so the
normalizations are compared on the same footing.
"""

import numbers

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone
from sklearn.metrics import r2_score
from sklearn.model_selection import check_cv
from sklearn.pipeline import make_pipeline
from sklearn.utils import check_array
from sklearn.utils.validation import check_is_fitted

from ._cv import FOLD_SCORES, LinearAttentionRegressorCV, fold_score
from ._params import check_flag, check_option
from ._units import (
    LEVELS,
    error_weights,
    levels_of,
    normalize_targets,
    normalize_windows,
    restore_targets,
)
from .preprocessing import Patches, PositionalEncoding

__all__ = ["SequenceRegressor", "make_sequence_regressor"]

DEFAULT_ALPHAS = (0.0, *np.logspace(-6, 6, 13).tolist())
# Token dimension above which a patch size is not tried: psi = d^2 (d + 1) / 2
# features grow like its cube (d = 40: 32 800 features).
_MAX_D = 40


def auto_patch_sizes(n_tokens, n_channels, k=2):
    """The ``k`` patch sizes of smallest token dimension ``p c + ceil(T / p)`` (positions included).

    Examples
    --------
    >>> from sklearn_linattn._sequence import auto_patch_sizes
    >>> auto_patch_sizes(84, 1), auto_patch_sizes(12, 1), auto_patch_sizes(24, 5)
    ([12, 11], [4, 3], [2, 3])
    """
    sizes = np.arange(1, n_tokens + 1)
    d = sizes * n_channels + -(-n_tokens // sizes)
    # Smallest d first; the larger patch of equal d (fewer tokens, a cheaper pass).
    order = np.lexsort((-sizes, d))
    keep = [int(sizes[i]) for i in order if d[i] <= _MAX_D and sizes[i] < n_tokens]
    return keep[:k] if keep else [1]


class SequenceRegressor(RegressorMixin, BaseEstimator):
    """A forecaster of one value per window, its configuration chosen by cross-validation.

    For windows ``X`` of shape (n_samples, n_tokens, n_channels) of one or
    more series and one target per window (the next value, say), ``fit``
    tries every level normalization and patch size, each with positions
    from the end and a :class:`LinearAttentionRegressorCV` with an intercept,
    a linear term over the whole window with its own penalty
    (``fit_linear="auto"``) and the candidate decays; the configuration
    with the best cross-validated score on the training windows only is kept.

    Parameters
    ----------
    levels : tuple of {"none", "last", "revin"}, default=("none", "last", "revin")
        Level normalizations to try: none, each window less its last value
        (NLinear), or in its own mean and standard deviation (RevIN); the
        inverse is applied to predictions.  With ``"last"`` the naive
        forecast is the model that predicts 0.
    patch_sizes : "auto" or list of int, default="auto"
        Patch sizes to try; ``"auto"``: the two of smallest token dimension.
    positions : tuple of bool, default=(True,)
        With one-hot positions of the patches counted from the end (True),
        without (False), or both tried (``(True, False)``).
    decays : list, default=(None,)
        Candidate decays (as in :class:`LinearAttentionRegressorCV`), e.g.
        ``[None, 0.9]``; they share each configuration's pass.
    alphas, alphas_linear : array-like, default=(0, 1e-6, ..., 1e6) and (1e-5, ..., 1)
        Penalties of attention and of the linear term, unit-free.
    cv : int, splitter or iterable, default=5
        Splits of the windows (``KFold(5)``: contiguous blocks, in order).
    fold_score : {"trimmed", "median", "mean"}, default="trimmed"
        How the splits' scores make a candidate's: the mean without the best
        and the worst fifth of the splits, or the median, so that one split
        with an outlying window cannot decide; or the plain mean.
    level_targets : bool, default=True
        Whether y is in the units of channels of X (the next value, say): the
        level normalization then applies to y too, and its inverse to the
        predictions.  False: y is in other units (a rate, a score) and only
        the windows are normalized.
    target_channels : None, int or list of int, default=None
        The channel of each output, for the level normalization; None: channel
        0 for one output or one channel, else output i is channel i (as many
        outputs as channels).  Scores are in y's units exactly for one output;
        for outputs of channels whose window scales differ, each window is
        weighted by the mean of their squared scales (an approximation).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: (n_samples, n_tokens, n_channels) or, as aeon and sktime
        store series, (n_samples, n_channels, n_tokens).
    random_state : int, RandomState instance or None, default=None
        Seeds the heads' compression of the refit.

    Attributes
    ----------
    best_params_ : dict
        The chosen ``level``, ``patch_size``, ``positions``, ``alpha``,
        ``decay``, ``fit_linear`` and ``alpha_linear``.
    best_score_ : float
        Its cross-validated score (minus the mean squared error in y's units).
    best_estimator_ : Pipeline
        The refitted pipeline on normalized windows.
    cv_results_ : dict of ndarray
        ``param_level``, ``param_patch_size``, ``param_positions``, ``params``,
        ``mean_test_score``
        (each configuration's best) and ``rank_test_score``.
    n_features_in_, n_tokens_in_, n_outputs_ : int
        Channels, the windows' length (``predict`` needs the same) and outputs.

    See Also
    --------
    make_sequence_regressor : the same, as the one-line recipe.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import make_sequence_regressor
    >>> t = np.arange(400.0)
    >>> series = 10 + 0.05 * t + np.sin(t / 3)
    >>> X = np.lib.stride_tricks.sliding_window_view(series[:-1], 12)[:, :, None]
    >>> y = series[12:]
    >>> model = make_sequence_regressor(patch_sizes=[3]).fit(X[:300], y[:300])
    >>> sorted(model.best_params_)
    ['alpha', 'alpha_linear', 'decay', 'fit_linear', 'level', 'patch_size', 'positions']
    >>> bool(np.sqrt(np.mean((model.predict(X[300:]) - y[300:]) ** 2)) < 0.05)
    True
    """

    def __init__(self, *, levels=LEVELS, patch_sizes="auto", positions=(True,), decays=(None,),
                 alphas=DEFAULT_ALPHAS, alphas_linear=(1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0),
                 cv=5, fold_score="trimmed", level_targets=True, target_channels=None,
                 data_format="channels_last", random_state=None):
        self.levels = levels
        self.patch_sizes = patch_sizes
        self.positions = positions
        self.decays = decays
        self.alphas = alphas
        self.alphas_linear = alphas_linear
        self.cv = cv
        self.fold_score = fold_score
        self.level_targets = level_targets
        self.target_channels = target_channels
        self.data_format = data_format
        self.random_state = random_state

    def _windows(self, X, reset):
        """X as complete float64 windows (n_samples, n_tokens, n_channels), checked."""
        check_option(self.data_format, "data_format", ("channels_last", "channels_first"))
        X = check_array(X, allow_nd=True, dtype=np.float64, input_name="X")
        if X.ndim == 2:
            X = X[:, :, None]  # windows of one channel, one time point per column
        elif X.ndim != 3:
            raise ValueError(
                f"X must be 3-D windows (n_samples, n_tokens, n_channels) "
                f"({self.data_format}), or 2-D windows of one channel; got an array of "
                f"shape {X.shape}.")
        elif self.data_format == "channels_first":
            X = np.ascontiguousarray(X.transpose(0, 2, 1))
        if reset:
            self.n_features_in_ = X.shape[2]
            self.n_tokens_in_ = X.shape[1]
        elif X.shape[2] != self.n_features_in_ or X.shape[1] != self.n_tokens_in_:
            # The linear term and the positions are per lag of the training windows.
            raise ValueError(
                f"X holds windows of {X.shape[1]} time points of {X.shape[2]} channels; "
                f"{type(self).__name__} was fitted on windows of {self.n_tokens_in_} of "
                f"{self.n_features_in_} ({self.data_format}).")
        return X

    def _channels(self, n_outputs, n_channels):
        """The channel of each output (``target_channels`` resolved and checked)."""
        if self.target_channels is None:
            if n_channels == 1 or n_outputs == 1:
                return np.zeros(n_outputs, dtype=np.intp)
            if n_outputs == n_channels:
                return np.arange(n_outputs)
            raise ValueError(
                f"y has {n_outputs} outputs and X {n_channels} channels: pass "
                "target_channels, the channel of each output (for the level normalization).")
        channels = np.atleast_1d(np.asarray(self.target_channels))
        if (channels.dtype.kind not in "iu" or channels.shape != (n_outputs,)
                or channels.min() < 0 or channels.max() >= n_channels):
            raise ValueError(
                f"target_channels must give one channel in [0, {n_channels}) per output "
                f"({n_outputs}); got {self.target_channels!r}.")
        return channels

    def _configurations(self, n_tokens, n_channels):
        levels = list(self.levels) if not isinstance(self.levels, str) else [self.levels]
        for level in levels:
            check_option(level, "levels", LEVELS)
        if not levels:
            raise ValueError("levels must hold at least one of " f"{LEVELS}; got none.")
        if isinstance(self.patch_sizes, str) and self.patch_sizes == "auto":
            sizes = auto_patch_sizes(n_tokens, n_channels)
        else:
            sizes = list(np.atleast_1d(self.patch_sizes))
            if not sizes or not all(isinstance(p, numbers.Integral) and 1 <= p <= n_tokens
                                    for p in sizes):
                raise ValueError(
                    f"patch_sizes must be 'auto' or integers in [1, {n_tokens}] (the "
                    f"windows' length); got {self.patch_sizes!r}.")
        positions = list(np.atleast_1d(self.positions))
        if not positions or not all(isinstance(p, (bool, np.bool_)) for p in positions):
            raise TypeError(
                f"positions must be a sequence of True (one-hot positions from the end) and "
                f"False (none); got {self.positions!r}.")
        return [(level, int(p), bool(q)) for level in levels for p in sizes
                for q in dict.fromkeys(positions)]

    def _pipeline(self, patch_size, positions, splits):
        check_option(self.fold_score, "fold_score", FOLD_SCORES)
        encode = [PositionalEncoding(origin="end", handle_unknown="ignore")] if positions else []
        return make_pipeline(
            Patches(patch_size), *encode,
            LinearAttentionRegressorCV(
                alphas=self.alphas, cv=splits, fit_intercept=True, fit_linear="auto",
                alphas_linear=self.alphas_linear, decays=list(self.decays),
                fold_score=self.fold_score, random_state=self.random_state))

    def fit(self, X, y):
        """Try every configuration on the training windows, keep the best, refitted.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, n_channels) or (n_samples, n_tokens)
            Complete windows (in ``data_format``); 2-D: one channel.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            One target per window (the next value, say).

        Returns
        -------
        self : SequenceRegressor
            The estimator, its best configuration refitted.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import SequenceRegressor
        >>> series = np.sin(np.arange(200.0) / 4)
        >>> X = np.lib.stride_tricks.sliding_window_view(series[:-1], 8)
        >>> model = SequenceRegressor(levels=("last",), patch_sizes=[2]).fit(X, series[8:])
        >>> model.best_params_["level"], model.cv_results_["params"][0]["patch_size"]
        ('last', 2)
        """
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None.")
        X = self._windows(X, reset=True)
        y = check_array(y, ensure_2d=False, dtype=np.float64, input_name="y")
        self._single = y.ndim == 1
        Y = y.reshape(-1, 1) if y.ndim == 1 else y
        if Y.ndim != 2 or Y.shape[0] != X.shape[0]:
            raise ValueError(
                f"y must have shape ({X.shape[0]},) or ({X.shape[0]}, n_outputs), one row per "
                f"window; got {y.shape}.")
        self.n_outputs_ = Y.shape[1]
        check_flag(self.level_targets, "level_targets")
        self._target_channels = (self._channels(Y.shape[1], X.shape[2]) if self.level_targets
                                 else None)
        rows, best_model = [], None
        # The splits drawn once: every configuration, and the rescaling of its
        # scores, reads the same ones (a shuffled or one-shot cv included).
        splits = list(check_cv(self.cv).split(X[:, :, 0]))
        tests = [test for _, test in splits]
        for level, patch_size, positions in self._configurations(X.shape[1], X.shape[2]):
            loc, scale = levels_of(X, level)
            Xn = normalize_windows(X, loc, scale)
            Yn = (Y if self._target_channels is None else
                  normalize_targets(Y, loc, scale, self._target_channels))
            model = self._pipeline(patch_size, positions, splits)
            # Squared errors in y's units: the fit's and the folds' weights.
            weights = (np.ones(X.shape[0]) if self._target_channels is None else
                       error_weights(scale, self._target_channels))
            model.fit(Xn, Yn, linearattentionregressorcv__sample_weight=weights)
            rows.append((level, patch_size, positions, self._score(model[-1], weights, tests)))
            if best_model is None or rows[-1][3] > max(r[3] for r in rows[:-1]):
                best_model = model  # the first of equal best scores is kept
        scores = np.array([r[3] for r in rows])
        best = int(np.argmax(scores))
        self.cv_results_ = {
            "param_level": np.array([r[0] for r in rows], dtype=object),
            "param_patch_size": np.array([r[1] for r in rows]),
            "param_positions": np.array([r[2] for r in rows]),
            "params": [{"level": r[0], "patch_size": r[1], "positions": r[2]} for r in rows],
            "mean_test_score": scores,
            "rank_test_score": (np.argsort(np.argsort(-scores, kind="stable")) + 1),
        }
        self.best_estimator_ = best_model
        search = self.best_estimator_[-1]
        self.best_score_ = float(scores[best])
        self.best_params_ = {
            "level": rows[best][0], "patch_size": rows[best][1], "positions": rows[best][2],
            "alpha": search.alpha_,
            "decay": search.decay_, "fit_linear": search.fit_linear_,
            "alpha_linear": search.alpha_linear_}
        return self

    def _score(self, search, weights, tests):
        """The chosen candidate's score in y's units: each split's weighted mean squared
        error times its mean weight, then the splits' median or mean."""
        k = search.best_index_
        splits = np.array([search.cv_results_[f"split{i}_test_score"][k] * weights[test].mean()
                           for i, test in enumerate(tests)])
        return float(fold_score(splits[None], self.fold_score)[0])

    def predict(self, X):
        """Predictions in y's units: the chosen pipeline on normalized windows, restored.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, n_channels)
            Windows as in :meth:`fit`, of the same length.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            The predictions, in y's units.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import SequenceRegressor
        >>> series = np.sin(np.arange(200.0) / 4)
        >>> X = np.lib.stride_tricks.sliding_window_view(series[:-1], 8)
        >>> model = SequenceRegressor(levels=("none",), patch_sizes=[2]).fit(X, series[8:])
        >>> bool(np.abs(model.predict(X[-5:]) - series[-5:]).max() < 1e-3)
        True
        """
        check_is_fitted(self, "best_estimator_")
        X = self._windows(X, reset=False)
        loc, scale = levels_of(X, self.best_params_["level"])
        pred = np.asarray(self.best_estimator_.predict(normalize_windows(X, loc, scale)),
                          dtype=np.float64).reshape(X.shape[0], -1)
        out = (pred if self._target_channels is None else
               restore_targets(pred, loc, scale, self._target_channels))
        return out[:, 0] if self._single else out

    def score(self, X, y, sample_weight=None):
        """Coefficient of determination R^2 of the predictions.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, n_channels)
            Windows as in :meth:`fit`.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            True targets.
        sample_weight : array-like of shape (n_samples,) or None, default=None
            Weight of each window.

        Returns
        -------
        score : float
            R^2 averaged uniformly over outputs (scikit-learn's ``r2_score``).

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import SequenceRegressor
        >>> series = np.sin(np.arange(200.0) / 4)
        >>> X = np.lib.stride_tricks.sliding_window_view(series[:-1], 8)
        >>> model = SequenceRegressor(levels=("none",), patch_sizes=[2]).fit(X, series[8:])
        >>> bool(model.score(X, series[8:]) > 0.999)
        True
        """
        return r2_score(y, self.predict(X), sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.three_d_array = True
        tags.target_tags.multi_output = True
        return tags


def make_sequence_regressor(**params):
    """The package's recipe for windows of series: an unfitted :class:`SequenceRegressor`.

    Parameters
    ----------
    **params
        Parameters of :class:`SequenceRegressor`; the defaults need no tuning.

    Returns
    -------
    SequenceRegressor
        Unfitted, with these parameters.

    Examples
    --------
    >>> from sklearn_linattn import make_sequence_regressor
    >>> make_sequence_regressor(data_format="channels_first").data_format
    'channels_first'
    """
    return SequenceRegressor(**params)
