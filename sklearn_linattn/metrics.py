"""Scorers and metric helpers that skip padded positions.

With ``readout="all"``, targets and predictions hold NaN at padded positions,
which scikit-learn's string scorers pass to the metric; the scorers here see
only the real positions (the user guide's "Scoring variable-length sequences").
"""

import copy
import inspect
import numbers

import numpy as np
import sklearn
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.metrics import get_scorer, get_scorer_names, make_scorer
from sklearn.utils.metadata_routing import MetadataRequest, get_routing_for_object

from ._validation import (
    DATA_FORMATS,
    READOUTS,
    as_real_array,
    check_readout,
    check_sample_weight,
    item_ndim,
    pad_targets,
    to_data_format,
)

__all__ = ["drop_padding", "regression_scorer_names", "sequence_scorer"]


# Names under which scikit-learn's get_scorer provides regression scorers (all
# of them call ``predict``).  Only the names are listed here: the metric, its
# sign and its defaults come from scikit-learn's scorer object for the name.
# Names absent from the installed scikit-learn are not offered ("max_error"
# became "neg_max_error" in scikit-learn 1.8).
_REGRESSION_SCORER_NAMES = (
    "d2_absolute_error_score",
    "explained_variance",
    "max_error",
    "neg_max_error",
    "neg_mean_absolute_error",
    "neg_mean_absolute_percentage_error",
    "neg_mean_gamma_deviance",
    "neg_mean_poisson_deviance",
    "neg_mean_squared_error",
    "neg_mean_squared_log_error",
    "neg_median_absolute_error",
    "neg_root_mean_squared_error",
    "neg_root_mean_squared_log_error",
    "r2",
)


def regression_scorer_names():
    """List the scorer names that :func:`sequence_scorer` accepts.

    These are the regression scorer names of the installed scikit-learn's
    :func:`sklearn.metrics.get_scorer`.

    Returns
    -------
    names : list of str
        Sorted names.

    See Also
    --------
    sequence_scorer : A scorer for one of these names.

    Examples
    --------
    >>> from sklearn_linattn.metrics import regression_scorer_names
    >>> names = regression_scorer_names()
    >>> "r2" in names, "neg_mean_squared_error" in names, "accuracy" in names
    (True, True, False)
    """
    available = set(get_scorer_names())
    return sorted(name for name in _REGRESSION_SCORER_NAMES if name in available)


def _routing_enabled():
    return bool(sklearn.get_config().get("enable_metadata_routing", False))


def _find_readout(estimator, name="readout", valid=READOUTS):
    """A parameter (``readout``) of an estimator, a Pipeline's last step or a search's best estimator."""
    obj = estimator
    for _ in range(32):  # nesting depth guard (a Pipeline of Pipelines, ...)
        readout = getattr(obj, name, None)
        if isinstance(readout, str) and readout in valid:
            return readout
        steps = getattr(obj, "steps", None)
        if isinstance(steps, list) and steps:
            obj = steps[-1][1]
            continue
        best = getattr(obj, "best_estimator_", None)
        if best is not None:
            obj = best
            continue
        return None
    return None


def _pad_targets(y_true, n_tokens):
    """Per-sequence targets (n_tokens_i[, d_out]) padded with NaN to n_tokens positions."""
    return pad_targets(
        y_true, n_tokens, "y_true",
        lambda i, trail: f"the predictions have {n_tokens} positions per sequence"
                         f"{f' and {trail[0]} outputs' if trail else ''}")


def _is_ragged(y_true):
    if not isinstance(y_true, (list, tuple)) or len(y_true) == 0:
        return False
    ndims = [item_ndim(s) for s in y_true]
    if any(n not in (1, 2) for n in ndims) or len(set(ndims)) != 1:
        return False
    return len({np.shape(s) for s in y_true}) > 1


def _resolve_readout(readout, y, pred):
    if readout is not None:
        return readout
    if y.ndim == 1:
        return "last"
    if y.ndim == 3:
        return "all"
    if y.ndim == 2 and (np.isnan(y).any() or np.isnan(pred).any()):
        # NaN marks padding: readout="last" targets never hold NaN.
        return "all"
    raise ValueError(
        f"cannot tell whether y_true of shape {y.shape} holds {y.shape[1]} positions "
        f"of each sequence (readout='all') or {y.shape[1]} outputs (readout='last'): "
        "the estimator has no readout parameter. Pass readout='all' or "
        "readout='last'."
    )


def drop_padding(y_true, y_pred, sample_weight=None, *, readout=None):
    """Keep the targets, predictions and weights at real (non-padded) positions.

    With ``readout="all"``, ``[i, t]`` is padding where ``y_true`` is NaN, and
    ``y_pred`` must be NaN exactly there too; the real positions of all
    sequences are stacked in order, each with its sequence's weight.  With
    ``readout="last"`` nothing is padding: the arrays come back as float64.
    See the user guide's :doc:`/scoring` page.

    Parameters
    ----------
    y_true : array-like
        ``readout="all"``: shape (n_samples, n_tokens[, d_out]) with NaN at
        padded positions, or a list of (n_tokens_i[, d_out]) arrays.
        ``readout="last"``: shape (n_samples,) or (n_samples, d_out).
    y_pred : array-like
        Predictions of the same shape, as returned by ``predict``.
    sample_weight : array-like of shape (n_samples,), real number or None, default=None
        Non-negative weight of each sequence.
    readout : {"all", "last"} or None, default=None
        None infers it: ``"last"`` for 1-D targets, ``"all"`` for 3-D targets
        and for 2-D ones when they or the predictions hold NaN.

    Returns
    -------
    y_true : ndarray of shape (n_positions,) or (n_positions, d_out), float64
        Targets at the real positions, sequence after sequence.
    y_pred : ndarray of the same shape, float64
        Predictions at the same positions.
    sample_weight : ndarray of shape (n_positions,), float64, or None
        Weight of each position; None when ``sample_weight`` was None.

    Raises
    ------
    ValueError
        If the shapes differ, ``y_true`` and ``y_pred`` are NaN at different
        positions (the message names the first), a position is only partly
        NaN, no position is real, ``readout="last"`` data hold NaN, or 2-D
        targets without NaN leave the readout undecided.

    See Also
    --------
    sequence_scorer : A scikit-learn scorer built on this.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.metrics import mean_squared_error
    >>> from sklearn_linattn.metrics import drop_padding
    >>> y_true = np.array([[1.0, 2.0, np.nan], [3.0, 4.0, 5.0]])
    >>> y_pred = np.array([[1.0, 2.5, np.nan], [3.0, 4.0, 4.0]])
    >>> yt, yp, w = drop_padding(y_true, y_pred, [2.0, 1.0], readout="all")
    >>> yt, w
    (array([1., 2., 3., 4., 5.]), array([2., 2., 1., 1., 1.]))
    >>> float(mean_squared_error(yt, yp, sample_weight=w))
    0.2142857142857143
    """
    if readout is not None:
        check_readout(readout)
    pred = as_real_array(y_pred, "y_pred")
    if readout != "last" and _is_ragged(y_true):
        if pred.ndim < 2:
            raise ValueError(
                "y_true is a list of per-sequence targets, but the predictions have "
                f"shape {pred.shape}, without a position axis."
            )
        y = _pad_targets(y_true, pred.shape[1])
    else:
        y = as_real_array(y_true, "y_true")
    if y.ndim not in (1, 2, 3):
        raise ValueError(
            "y_true must have shape (n_samples,), (n_samples, d_out), (n_samples, "
            f"n_tokens) or (n_samples, n_tokens, d_out); got shape {y.shape}."
        )
    readout = _resolve_readout(readout, y, pred)
    n_samples = y.shape[0]
    w = check_sample_weight(sample_weight, n_samples)
    if readout == "last":
        return _last_positions(y, pred, w)
    return _all_positions(y, pred, w)


def _last_positions(y, pred, w):
    if y.ndim not in (1, 2):
        raise ValueError(
            f"with readout='last', y_true must have shape (n_samples,) or "
            f"(n_samples, d_out); got shape {y.shape}."
        )
    for arr, name in ((y, "y_true"), (pred, "the prediction")):
        nan = np.isnan(arr)
        if nan.any():
            i = int(np.argwhere(nan)[0][0])
            raise ValueError(
                f"{name} for sequence {i} is NaN; with readout='last' every sequence "
                "has one target and one prediction, and nothing is padding."
            )
    return y, pred, w


def _all_positions(y, pred, w):
    if y.ndim not in (2, 3):
        raise ValueError(
            "with readout='all', y_true must have shape (n_samples, n_tokens) or "
            f"(n_samples, n_tokens, d_out), NaN at padded positions; got shape {y.shape}."
        )
    single = y.ndim == 2 and pred.ndim == 2
    Y = y[:, :, None] if y.ndim == 2 else y
    P = pred[:, :, None] if pred.ndim == 2 else pred
    if Y.shape != P.shape:
        raise ValueError(
            f"y_true has shape {y.shape} but the predictions have shape {pred.shape}; "
            "with readout='all' both hold (n_samples, n_tokens[, d_out]) values."
        )
    y_nan, p_nan = np.isnan(Y), np.isnan(P)
    for nan, name in ((y_nan, "y_true"), (p_nan, "the prediction")):
        partly = nan.any(axis=2) & ~nan.all(axis=2)
        if partly.any():
            i, t = np.argwhere(partly)[0]
            raise ValueError(
                f"{name} at position [{i}, {t}] is only partly NaN; a position is "
                "either padding (every output NaN) or real (no output NaN)."
            )
    y_pad, p_pad = y_nan[:, :, 0], p_nan[:, :, 0]
    if (y_pad & ~p_pad).any():
        i, t = np.argwhere(y_pad & ~p_pad)[0]
        raise ValueError(
            f"y_true[{i}, {t}] is NaN (padding) but the prediction there is not: "
            f"X[{i}, {t}] is a real token. y_true is misaligned with X, or a target "
            "is missing; only padded positions may have NaN targets."
        )
    if (p_pad & ~y_pad).any():
        i, t = np.argwhere(p_pad & ~y_pad)[0]
        raise ValueError(
            f"the prediction at position [{i}, {t}] is NaN (X[{i}, {t}] is padding, or "
            f"the model returned NaN there) but y_true[{i}, {t}] holds a target; "
            "targets at padded positions must be NaN (is y_true aligned with X?)."
        )
    real = ~y_pad
    if not real.any():
        raise ValueError("every position is padding: there is nothing to score.")
    yr, pr = Y[real], P[real]
    if single:
        yr, pr = yr[:, 0], pr[:, 0]
    wr = None if w is None else np.broadcast_to(w[:, None], real.shape)[real]
    return yr, pr, wr


class _FixedPredictions(RegressorMixin, BaseEstimator):
    """A regressor whose ``predict`` returns given values (the real positions)."""

    def __init__(self, predictions):
        self.predictions = predictions

    def predict(self, X):
        return self.predictions


def _is_sklearn_scorer(obj):
    # Scorers from get_scorer / make_scorer are metadata consumers with a
    # score method request; metric functions and plain scorer functions are not.
    return callable(obj) and callable(getattr(obj, "set_score_request", None)) and callable(
        getattr(obj, "get_metadata_routing", None)
    )


def _first_parameter(func):
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return params[0] if params else None


class _SequenceScorer:
    """Scorer ``scorer(estimator, X, y_true, sample_weight=None)`` over real positions."""

    def __init__(self, scorer, metric_kwargs, readout, description):
        self._scorer = scorer
        self._metric_kwargs = dict(metric_kwargs)
        self._readout = readout
        self._description = description

    def __repr__(self):
        return f"sequence_scorer({self._description})"

    def _routing_repr(self):
        return repr(self)

    def __call__(self, estimator, X, y_true, sample_weight=None, **kwargs):
        """Score ``estimator.predict(X)`` against ``y_true`` at the real positions.

        Other keyword metadata go to the metric unchanged (with metadata routing only).
        """
        if kwargs and not _routing_enabled():
            raise ValueError(
                f"{self!r} got metadata {sorted(kwargs)}, which needs metadata routing: "
                "enable it with sklearn.set_config(enable_metadata_routing=True), or "
                "pass metric arguments to sequence_scorer itself."
            )
        y_pred = estimator.predict(X)
        readout = self._readout if self._readout is not None else _find_readout(estimator)
        if _find_readout(estimator, "data_format", DATA_FORMATS) == "channels_first":
            # (n_samples, d_out, n_tokens) targets and predictions: positions on axis 1.
            y_pred = to_data_format(y_pred, "channels_first")
            if isinstance(y_true, (list, tuple)):
                y_true = [np.asarray(s).T if np.ndim(s) == 2 else s for s in y_true]
            else:
                y_true = to_data_format(np.asarray(y_true), "channels_first")
        y, pred, w = drop_padding(y_true, y_pred, sample_weight, readout=readout)
        return self._score_positions(y, pred, w, kwargs)

    def _score_positions(self, y, pred, w, metadata):
        extra = {**self._metric_kwargs, **metadata}
        if w is not None:
            extra["sample_weight"] = w
        proxy = _FixedPredictions(pred)
        if set(extra) - {"sample_weight"}:
            # scikit-learn scorers take metric arguments at call time only as
            # routed metadata; the positions are already routed here.
            with sklearn.config_context(enable_metadata_routing=True):
                score = self._scorer(proxy, None, y, **extra)
        else:
            score = self._scorer(proxy, None, y, **extra)
        return float(score) if isinstance(score, numbers.Real) else score

    def set_score_request(self, **kwargs):
        """Request metadata (e.g. ``sample_weight=True``), as for scikit-learn scorers."""
        self._scorer.set_score_request(**kwargs)
        return self

    def get_metadata_routing(self):
        """The ``MetadataRequest`` of the wrapped scikit-learn scorer."""
        inner = get_routing_for_object(self._scorer)
        request = MetadataRequest(owner=self)
        for param, alias in inner.score.requests.items():
            request.score.add_request(param=param, alias=alias)
        return request

    def _accept_sample_weight(self):
        # Asked by scikit-learn's searches and multi-metric scorers when
        # routing is disabled, to decide whether to forward sample_weight.
        return "sample_weight" in get_routing_for_object(self._scorer).score.requests


def sequence_scorer(scoring, *, greater_is_better=None, readout=None, **kwargs):
    """Make a scikit-learn scorer that scores only the real positions of sequences.

    For ``scoring=`` of scikit-learn's searches and cross-validation, alone or
    in a multi-metric dict.  It calls ``estimator.predict(X)`` (the estimator
    may be a Pipeline ending in the regressor), drops the padded positions with
    :func:`drop_padding` and gives the rest to scikit-learn's scorer of the
    same name: its metric, sign and multi-output averaging.  A sequence's
    ``sample_weight`` weighs each of its real positions, so
    ``sequence_scorer("r2")`` equals ``estimator.score``.  See the user guide's
    :doc:`/scoring` page.

    Parameters
    ----------
    scoring : str or callable
        A regression scorer name (see :func:`regression_scorer_names`), a
        scorer made by :func:`sklearn.metrics.make_scorer`, or a metric function
        ``metric(y_true, y_pred, **kwargs) -> float``.
    greater_is_better : bool or None, default=None
        For a metric function only: whether it is a score (True, the default)
        or a loss (False, negated as in ``make_scorer``).
    readout : {"all", "last"} or None, default=None
        None reads it from the estimator (its ``readout`` parameter, or that
        of a Pipeline's last step).  Give it for estimators without one.
    **kwargs : dict
        Keyword arguments of the metric, as for ``make_scorer``, e.g.
        ``sequence_scorer("r2", multioutput="variance_weighted")``.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y_true, sample_weight=None) -> float``, with
        ``set_score_request`` for metadata routing (it requests no
        ``sample_weight`` until asked to).

    Raises
    ------
    ValueError
        If the name is not a regression scorer name (the message lists the
        valid ones), or ``greater_is_better`` is given with a name or scorer.
    TypeError
        If ``scoring`` is neither a string nor a callable, or is a plain
        scorer function ``f(estimator, X, y)``, which would see the padding.

    See Also
    --------
    drop_padding : The real positions, for metrics called by hand.
    regression_scorer_names : The names accepted.

    Examples
    --------
    >>> from sklearn.model_selection import GridSearchCV
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> from sklearn_linattn.metrics import sequence_scorer
    >>> X, y = make_random_mhla(60, 6, 2, readout="all", variable_length=(2, 6),
    ...                         random_state=0)  # NaN at padded positions
    >>> search = GridSearchCV(LinearAttentionRegressor(readout="all"),
    ...                       {"alpha": [1e6, 0.0]}, cv=3,
    ...                       scoring=sequence_scorer("r2")).fit(X, y)
    >>> search.best_params_
    {'alpha': 0.0}
    >>> model = search.best_estimator_
    >>> sequence_scorer("r2")(model, X, y) == model.score(X, y)
    True
    """
    if readout is not None:
        check_readout(readout)
    if isinstance(scoring, str):
        names = regression_scorer_names()
        if scoring not in names:
            hint = ""
            if f"neg_{scoring}" in names:
                hint = f" (did you mean 'neg_{scoring}'?)"
            elif scoring in get_scorer_names():
                hint = " (a scikit-learn scorer, but not a regression one)"
            raise ValueError(
                f"scoring must be one of the regression scorer names {names}, a scorer "
                f"made by make_scorer, or a metric function; got {scoring!r}{hint}."
            )
        if greater_is_better is not None:
            raise ValueError(
                f"greater_is_better applies to metric functions only; the sign of "
                f"{scoring!r} comes from scikit-learn's scorer of that name."
            )
        description = ", ".join([repr(scoring)] + [f"{k}={v!r}" for k, v in kwargs.items()])
        return _SequenceScorer(get_scorer(scoring), kwargs, readout, description)
    if not callable(scoring):
        raise TypeError(
            "scoring must be a regression scorer name, a scorer made by make_scorer, "
            f"or a metric function; got {scoring!r} of type {type(scoring).__name__}."
        )
    if _is_sklearn_scorer(scoring):
        if greater_is_better is not None:
            raise ValueError(
                f"greater_is_better applies to metric functions only; the scorer "
                f"{scoring!r} carries its own sign."
            )
        description = ", ".join([repr(scoring)] + [f"{k}={v!r}" for k, v in kwargs.items()])
        return _SequenceScorer(copy.deepcopy(scoring), kwargs, readout, description)
    if _first_parameter(scoring) == "estimator":
        raise TypeError(
            f"{getattr(scoring, '__name__', scoring)!r} looks like a scorer function "
            "f(estimator, X, y), which would see the padded positions; pass the metric "
            "function metric(y_true, y_pred) instead, or a scorer made by make_scorer."
        )
    sign = True if greater_is_better is None else bool(greater_is_better)
    inner = make_scorer(scoring, greater_is_better=sign, **kwargs)
    name = getattr(scoring, "__name__", repr(scoring))
    description = ", ".join(
        [name] + ([] if sign else ["greater_is_better=False"])
        + [f"{k}={v!r}" for k, v in kwargs.items()]
    )
    return _SequenceScorer(inner, {}, readout, description)
