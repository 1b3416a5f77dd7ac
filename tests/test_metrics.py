"""sklearn_linattn.metrics: scikit-learn scorers that skip padded positions."""

import pickle
import warnings

import numpy as np
import pytest
import sklearn
from hypothesis import given
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import UnsetMetadataPassedError
from sklearn.metrics import (
    d2_absolute_error_score,
    explained_variance_score,
    get_scorer,
    get_scorer_names,
    make_scorer,
    max_error,
    mean_absolute_error,
    mean_absolute_percentage_error,
    mean_gamma_deviance,
    mean_pinball_loss,
    mean_poisson_deviance,
    mean_squared_error,
    mean_squared_log_error,
    median_absolute_error,
    r2_score,
)
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score, cross_validate
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

from sklearn_linattn import AdamLinearAttentionRegressor, LinearAttentionRegressor, mhla_forward
from sklearn_linattn.datasets import make_random_mhla
from sklearn_linattn.metrics import drop_padding, regression_scorer_names, sequence_scorer

# The independent statement of what each name means: the metric and its sign
# (the module itself takes both from scikit-learn's scorer objects).
_MEANING = {
    "r2": (r2_score, 1),
    "explained_variance": (explained_variance_score, 1),
    "neg_mean_squared_error": (mean_squared_error, -1),
    "neg_root_mean_squared_error": (
        lambda y, p, **kw: np.sqrt(mean_squared_error(y, p, **kw)), -1),
    "neg_mean_absolute_error": (mean_absolute_error, -1),
    "neg_median_absolute_error": (median_absolute_error, -1),
    "max_error": (max_error, -1),
    "neg_max_error": (max_error, -1),
    "neg_mean_absolute_percentage_error": (mean_absolute_percentage_error, -1),
    "neg_mean_squared_log_error": (mean_squared_log_error, -1),
    "neg_root_mean_squared_log_error": (
        lambda y, p, **kw: np.sqrt(mean_squared_log_error(y, p, **kw)), -1),
    "neg_mean_poisson_deviance": (mean_poisson_deviance, -1),
    "neg_mean_gamma_deviance": (mean_gamma_deviance, -1),
    "d2_absolute_error_score": (d2_absolute_error_score, 1),
}
_NAMES = regression_scorer_names()
_MAX_ERROR = "neg_max_error" if "neg_max_error" in _NAMES else "max_error"
_REQUIRED = [
    "r2", "explained_variance", "neg_mean_squared_error", "neg_root_mean_squared_error",
    "neg_mean_absolute_error", "neg_median_absolute_error", _MAX_ERROR,
    "neg_mean_absolute_percentage_error",
]


# ----------------------------------------------------------------------------
# data


def _variable_data(readout="all", d_out=1, noise=0.0, n_samples=60, seed=0, lengths=(2, 7)):
    return make_random_mhla(
        n_samples, 7, 2, d_out=d_out, readout=readout, noise=noise,
        variable_length=lengths, random_state=seed,
    )


def _positive_data(readout, *, variable=True, d_out=1, n_samples=60, seed=0):
    """Tokens (1, z_t); targets t + sum_{s<=t} z_s**2 (+ noise) >= 1, realizable by 2 heads.

    Positive targets and (near-exact) positive predictions let every
    regression metric run, the log and deviance ones included.
    """
    rng = np.random.default_rng(seed)
    n_tokens = 6
    X = np.concatenate(
        [np.ones((n_samples, n_tokens, 1)), rng.normal(size=(n_samples, n_tokens, 1))], axis=2
    )
    lengths = (rng.integers(2, n_tokens + 1, size=n_samples) if variable
               else np.full(n_samples, n_tokens))
    V = np.zeros((2, d_out, 2))
    V[0, :, 0], V[1, :, 1] = 1.0, np.arange(1, d_out + 1)
    Q = np.zeros((2, 2, 2))
    Q[0, 0, 0], Q[1, 1, 0] = 1.0, 1.0
    Y = mhla_forward(X, V, Q, lengths, readout=readout)
    Y = Y + 0.05 * rng.normal(size=Y.shape)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, (Y[..., 0] if d_out == 1 else Y)


def _ref_positions(y, pred, w=None):
    """Real positions gathered one by one (readout='all'): y, pred, weights."""
    ys, ps, ws = [], [], []
    for i in range(y.shape[0]):
        for t in range(y.shape[1]):
            if np.all(np.isnan(y[i, t])):
                continue
            ys.append(y[i, t])
            ps.append(pred[i, t])
            ws.append(1.0 if w is None else w[i])
    return np.array(ys), np.array(ps), np.array(ws)


def _gs(estimator, scoring, grid=None, **kw):
    grid = {"alpha": [1e6, 0.0]} if grid is None else grid
    return GridSearchCV(estimator, grid, scoring=scoring, cv=KFold(3), **kw)


# ----------------------------------------------------------------------------
# the problem: string scorers see the padding


def test_string_r2_fails_on_padding_and_sequence_scorer_picks_right_alpha():
    X, y = _variable_data()  # exactly realizable, noise-free, variable length
    assert np.isnan(y).any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = _gs(LinearAttentionRegressor(readout="all"), "r2").fit(X, y)
    # Today: every candidate scores NaN and the search keeps the first one.
    assert np.isnan(plain.cv_results_["mean_test_score"]).all()
    assert plain.best_params_ == {"alpha": 1e6}

    search = _gs(LinearAttentionRegressor(readout="all"), sequence_scorer("r2")).fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert np.isfinite(scores).all()
    assert search.best_params_ == {"alpha": 0.0}
    assert scores[1] > 1 - 1e-9 and scores[0] < 0.5


@pytest.mark.parametrize("name", ["neg_mean_squared_error", "neg_mean_absolute_error",
                                  _MAX_ERROR, "explained_variance"])
def test_other_names_pick_right_alpha(name):
    X, y = _variable_data()
    search = _gs(LinearAttentionRegressor(readout="all"), sequence_scorer(name)).fit(X, y)
    assert search.best_params_ == {"alpha": 0.0}
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


# ----------------------------------------------------------------------------
# values


@pytest.mark.parametrize("name", [n for n in _MEANING if n in _NAMES])
def test_value_is_metric_on_real_positions(name):
    X, y = _positive_data("all")
    model = LinearAttentionRegressor(readout="all", alpha=1e-3).fit(X, y)
    metric, sign = _MEANING[name]
    yr, pr, _ = _ref_positions(y, model.predict(X))
    expected = sign * metric(yr, pr)
    assert sequence_scorer(name)(model, X, y) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_required_names_are_offered():
    assert set(_REQUIRED) <= set(_NAMES)
    for name in _NAMES:  # every offered name is a scikit-learn scorer name
        assert name in get_scorer_names()
    assert "accuracy" not in _NAMES and "roc_auc" not in _NAMES


@pytest.mark.parametrize("name", _NAMES)
@pytest.mark.parametrize("variable", [False, True])
def test_last_readout_equals_plain_sklearn_scorer(name, variable):
    X, y = _positive_data("last", variable=variable)
    model = LinearAttentionRegressor(alpha=1e-3).fit(X, y)
    assert sequence_scorer(name)(model, X, y) == get_scorer(name)(model, X, y)
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=len(y))
    if "sample_weight" in sklearn.utils.metadata_routing.get_routing_for_object(
        get_scorer(name)
    ).score.requests:
        ours = sequence_scorer(name)(model, X, y, sample_weight=w)
        assert ours == get_scorer(name)(model, X, y, sample_weight=w)
        assert ours != get_scorer(name)(model, X, y)


@pytest.mark.parametrize("name", ["r2", "neg_mean_squared_error", "neg_mean_absolute_error"])
def test_fixed_length_all_readout_is_metric_on_all_positions(name):
    X, y = _variable_data(noise=0.1, lengths=False)
    assert not np.isnan(y).any()
    model = LinearAttentionRegressor(readout="all").fit(X, y)
    metric, sign = _MEANING[name]
    expected = sign * metric(y.ravel(), model.predict(X).ravel())
    assert sequence_scorer(name)(model, X, y) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("readout", ["all", "last"])
@pytest.mark.parametrize("d_out", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_estimator_score_equals_sequence_r2_exactly(readout, d_out, weighted):
    X, y = _variable_data(readout, d_out=d_out, noise=0.2)
    w = np.random.default_rng(2).uniform(0.1, 3.0, size=len(X)) if weighted else None
    model = LinearAttentionRegressor(readout=readout, alpha=0.1).fit(X, y)
    ours = sequence_scorer("r2")(model, X, y, sample_weight=w)
    assert ours == model.score(X, y, sample_weight=w)
    assert 0.0 < ours < 1.0


def test_gradient_regressor_score_equals_sequence_r2():
    X, y = _variable_data("all", noise=0.2, n_samples=30)
    model = AdamLinearAttentionRegressor(readout="all", max_epochs=2, random_state=0).fit(X, y)
    assert sequence_scorer("r2")(model, X, y) == model.score(X, y)


# ----------------------------------------------------------------------------
# weights


def test_weights_broadcast_to_each_real_position():
    X, y = _variable_data(noise=0.3)
    model = LinearAttentionRegressor(readout="all", alpha=0.5).fit(X, y)
    w = np.random.default_rng(3).uniform(0.0, 2.0, size=len(X))
    yr, pr, wr = _ref_positions(y, model.predict(X), w)
    for name in ["r2", "neg_mean_squared_error", "neg_median_absolute_error"]:
        metric, sign = _MEANING[name]
        ours = sequence_scorer(name)(model, X, y, sample_weight=w)
        assert ours == pytest.approx(sign * metric(yr, pr, sample_weight=wr), rel=1e-12)
        assert ours != sequence_scorer(name)(model, X, y)


def test_integer_weight_equals_repeating_the_sequence_and_zero_drops_it():
    X, y = _variable_data(noise=0.3)
    model = LinearAttentionRegressor(readout="all", alpha=0.5).fit(X, y)
    w = np.ones(len(X))
    w[:5], w[5:9] = 3.0, 0.0
    idx = np.concatenate([np.repeat(np.arange(5), 3), np.arange(9, len(X))])
    for name in ["r2", "neg_mean_squared_error", "explained_variance"]:
        scorer = sequence_scorer(name)
        assert scorer(model, X, y, sample_weight=w) == pytest.approx(
            scorer(model, X[idx], y[idx]), rel=1e-12
        )


def test_sample_weight_is_validated():
    X, y = _variable_data()
    model = LinearAttentionRegressor(readout="all").fit(X, y)
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(60,\)"):
        sequence_scorer("r2")(model, X, y, sample_weight=np.ones(59))
    with pytest.raises(ValueError, match="non-negative"):
        sequence_scorer("r2")(model, X, y, sample_weight=-np.ones(60))


# ----------------------------------------------------------------------------
# multi-output


def test_multi_output_uniform_average_and_metric_kwargs():
    X, y = _positive_data("all", d_out=2)
    model = LinearAttentionRegressor(readout="all", alpha=1e-3).fit(X, y)
    assert y.shape[2] == 2
    yr, pr, _ = _ref_positions(y, model.predict(X))
    per_output = [r2_score(yr[:, k], pr[:, k]) for k in range(2)]
    ours = sequence_scorer("r2")(model, X, y)
    assert ours == pytest.approx(np.mean(per_output), rel=1e-12)
    assert ours == model.score(X, y)
    weighted = sequence_scorer("r2", multioutput="variance_weighted")(model, X, y)
    assert weighted == pytest.approx(
        r2_score(yr, pr, multioutput="variance_weighted"), rel=1e-12
    )
    assert weighted != pytest.approx(ours, rel=1e-9)
    mse = sequence_scorer("neg_mean_squared_error")(model, X, y)
    assert mse == pytest.approx(-np.mean((yr - pr) ** 2), rel=1e-12)
    with pytest.raises(ValueError, match="[Mm]ultioutput"):
        sequence_scorer(_MAX_ERROR)(model, X, y)


# ----------------------------------------------------------------------------
# misaligned data


def _model_and_data(d_out=1):
    X, y = _variable_data(d_out=d_out, noise=0.1)
    return LinearAttentionRegressor(readout="all").fit(X, y), X, y


def _first_padded(X):
    lengths = (~np.isnan(X).all(axis=2)).sum(axis=1)
    i = int(np.flatnonzero(lengths < X.shape[1])[0])
    return i, int(lengths[i])


def test_nan_target_at_a_real_token_names_the_position():
    model, X, y = _model_and_data()
    y = y.copy()
    y[4, 1] = np.nan
    with pytest.raises(ValueError, match=r"y_true\[4, 1\] is NaN \(padding\) but the "
                                         r"prediction there is not"):
        sequence_scorer("r2")(model, X, y)


def test_target_at_a_padded_position_names_the_position():
    model, X, y = _model_and_data()
    i, t = _first_padded(X)
    y = y.copy()
    y[i, t] = 1.0
    with pytest.raises(ValueError, match=rf"prediction at position \[{i}, {t}\] is NaN.*"
                                         rf"y_true\[{i}, {t}\] holds a target"):
        sequence_scorer("r2")(model, X, y)


def test_shifted_targets_are_an_error():
    model, X, y = _model_and_data()
    shifted = np.roll(y, 1, axis=0)  # targets of another sequence, other padding
    with pytest.raises(ValueError, match="misaligned|aligned"):
        sequence_scorer("neg_mean_squared_error")(model, X, shifted)


def test_partly_nan_multi_output_position_is_an_error():
    model, X, y = _model_and_data(d_out=2)
    y = y.copy()
    y[2, 0, 1] = np.nan
    with pytest.raises(ValueError, match=r"y_true at position \[2, 0\] is only partly NaN"):
        sequence_scorer("r2")(model, X, y)


def test_shape_mismatch_and_last_readout_nan():
    model, X, y = _model_and_data()
    with pytest.raises(ValueError, match=r"y_true has shape \(60, 6\) but the predictions "
                                         r"have shape \(60, 7\)"):
        sequence_scorer("r2")(model, X, y[:, :6])
    Xl, yl = _variable_data("last")
    last = LinearAttentionRegressor().fit(Xl, yl)
    yl = yl.copy()
    yl[7] = np.nan
    with pytest.raises(ValueError, match="y_true for sequence 7 is NaN; with readout='last'"):
        sequence_scorer("r2")(last, Xl, yl)


def test_ragged_list_targets_equal_padded_targets():
    model, X, y = _model_and_data()
    lengths = (~np.isnan(X).all(axis=2)).sum(axis=1)
    ragged = [y[i, : lengths[i]] for i in range(len(y))]
    scorer = sequence_scorer("r2")
    assert scorer(model, X, ragged) == scorer(model, X, y)
    ragged[3] = np.ones(8)
    with pytest.raises(ValueError, match=r"y_true\[3\] has shape \(8,\)"):
        scorer(model, X, ragged)


def test_readout_inference():
    y = np.array([[1.0, 2.0], [3.0, 4.0]])
    p = y + 0.5
    with pytest.raises(ValueError, match="cannot tell whether y_true of shape"):
        drop_padding(y, p)
    positions, _, _ = drop_padding(y, p, readout="all")
    assert positions.shape == (4,)
    outputs, _, _ = drop_padding(y, p, readout="last")
    assert outputs.shape == (2, 2)
    y_nan = np.array([[1.0, np.nan], [3.0, 4.0]])
    p_nan = np.array([[1.5, np.nan], [3.0, 4.0]])
    yr, pr, w = drop_padding(y_nan, p_nan, [1.0, 2.0])
    np.testing.assert_array_equal(yr, [1.0, 3.0, 4.0])
    np.testing.assert_array_equal(w, [1.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="readout must be one of"):
        drop_padding(y, p, readout="first")


def test_explicit_readout_for_an_estimator_without_one():
    model, X, y = _model_and_data()

    class Wrapped:  # a predict-only object, no readout parameter
        def predict(self, X):
            return model.predict(X)

    assert sequence_scorer("r2", readout="all")(Wrapped(), X, y) == model.score(X, y)
    X_full, y_full = _variable_data(noise=0.1, lengths=False)
    full = LinearAttentionRegressor(readout="all").fit(X_full, y_full)

    class WrappedFull:
        def predict(self, X):
            return full.predict(X)

    with pytest.raises(ValueError, match="Pass readout='all' or readout='last'"):
        sequence_scorer("r2")(WrappedFull(), X_full, y_full)


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 6),
    n_tokens=st.integers(1, 6),
    d_out=st.sampled_from([None, 1, 3]),
    weighted=st.booleans(),
)
def test_drop_padding_matches_loops(seed, n, n_tokens, d_out, weighted):
    rng = np.random.default_rng(seed)
    trail = () if d_out is None else (d_out,)
    y = rng.normal(size=(n, n_tokens) + trail)
    p = rng.normal(size=y.shape)
    lengths = rng.integers(1, n_tokens + 1, size=n)
    pad = np.arange(n_tokens)[None, :] >= lengths[:, None]
    y[pad], p[pad] = np.nan, np.nan
    w = rng.uniform(0, 2, size=n) if weighted else None
    yr, pr, wr = drop_padding(y, p, w, readout="all")
    ry, rp, rw = _ref_positions(y, p, w)
    np.testing.assert_array_equal(yr, ry)
    np.testing.assert_array_equal(pr, rp)
    if weighted:
        np.testing.assert_array_equal(wr, rw)
    else:
        assert wr is None


# ----------------------------------------------------------------------------
# names and callables


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="regression scorer names") as info:
        sequence_scorer("r3")
    for name in _REQUIRED:
        assert repr(name) in str(info.value)
    with pytest.raises(ValueError, match="not a regression one"):
        sequence_scorer("accuracy")


@pytest.mark.skipif("max_error" in _NAMES, reason="this scikit-learn still names it max_error")
def test_renamed_max_error_gets_a_hint():
    with pytest.raises(ValueError, match="did you mean 'neg_max_error'"):
        sequence_scorer("max_error")


def test_bad_arguments():
    with pytest.raises(ValueError, match="greater_is_better applies to metric functions"):
        sequence_scorer("r2", greater_is_better=False)
    with pytest.raises(ValueError, match="greater_is_better applies to metric functions"):
        sequence_scorer(get_scorer("r2"), greater_is_better=True)
    with pytest.raises(TypeError, match="scoring must be a regression scorer name"):
        sequence_scorer(3)

    def my_scorer(estimator, X, y):
        return 0.0

    with pytest.raises(TypeError, match="looks like a scorer function"):
        sequence_scorer(my_scorer)
    with pytest.raises(ValueError, match="readout must be one of"):
        sequence_scorer("r2", readout="causal")


def test_metric_function_and_make_scorer_object():
    model, X, y = _model_and_data()
    yr, pr, _ = _ref_positions(y, model.predict(X))
    pinball = sequence_scorer(mean_pinball_loss, greater_is_better=False, alpha=0.9)
    assert pinball(model, X, y) == pytest.approx(-mean_pinball_loss(yr, pr, alpha=0.9),
                                                 rel=1e-12)
    assert pinball(model, X, y) != pytest.approx(-mean_pinball_loss(yr, pr), rel=1e-6)
    score = sequence_scorer(r2_score)
    assert score(model, X, y) == model.score(X, y)
    made = sequence_scorer(make_scorer(mean_absolute_error, greater_is_better=False))
    assert made(model, X, y) == sequence_scorer("neg_mean_absolute_error")(model, X, y)
    assert repr(pinball) == (
        "sequence_scorer(mean_pinball_loss, greater_is_better=False, alpha=0.9)"
    )
    assert repr(sequence_scorer("r2")) == "sequence_scorer('r2')"


def test_call_time_metadata_needs_routing():
    model, X, y = _model_and_data()
    with pytest.raises(ValueError, match="needs metadata routing"):
        sequence_scorer("r2")(model, X, y, multioutput="raw_values")


def test_pickle_round_trip_and_parallel_search():
    model, X, y = _model_and_data()
    scorer = pickle.loads(pickle.dumps(sequence_scorer("neg_mean_squared_error")))
    assert scorer(model, X, y) == sequence_scorer("neg_mean_squared_error")(model, X, y)
    serial = cross_val_score(LinearAttentionRegressor(readout="all"), X, y, cv=KFold(3),
                             scoring=sequence_scorer("r2"))
    parallel = cross_val_score(LinearAttentionRegressor(readout="all"), X, y, cv=KFold(3),
                               scoring=sequence_scorer("r2"), n_jobs=2)
    np.testing.assert_allclose(parallel, serial, rtol=1e-12)


# ----------------------------------------------------------------------------
# model selection: cross_val_score, cross_validate, pipelines, refit


def _fold_scores(estimator, X, y, scorer, w_fit=None, w_score=None):
    out = []
    for train, test in KFold(3).split(X):
        kw = {} if w_fit is None else {"sample_weight": w_fit[train]}
        fitted = clone(estimator).fit(X[train], y[train], **kw)
        sw = None if w_score is None else w_score[test]
        out.append(scorer(fitted, X[test], y[test], sample_weight=sw))
    return np.array(out)


def _double(X):
    return 2.0 * X  # NaN padding stays NaN


def _pipeline(alpha=0.1):
    return Pipeline([
        ("scale", FunctionTransformer(_double)),
        ("model", LinearAttentionRegressor(readout="all", alpha=alpha)),
    ])


def test_cross_val_score_on_a_pipeline():
    X, y = _variable_data(noise=0.2)
    pipe = _pipeline()
    pipe_fitted = clone(pipe).fit(X, y)
    assert sequence_scorer("r2")(pipe_fitted, X, y) == pipe_fitted.score(X, y)
    scores = cross_val_score(pipe, X, y, cv=KFold(3), scoring=sequence_scorer("r2"))
    np.testing.assert_allclose(scores, _fold_scores(pipe, X, y, sequence_scorer("r2")),
                               rtol=1e-12)
    assert np.isfinite(scores).all() and (scores > 0).all()


def test_cross_validate_multi_metric_dict():
    X, y = _variable_data(noise=0.2)
    scoring = {"r2": sequence_scorer("r2"), "mse": sequence_scorer("neg_mean_squared_error")}
    res = cross_validate(_pipeline(), X, y, cv=KFold(3), scoring=scoring,
                         return_train_score=True)
    for key, scorer in scoring.items():
        np.testing.assert_allclose(res[f"test_{key}"],
                                   _fold_scores(_pipeline(), X, y, scorer), rtol=1e-12)
        assert np.isfinite(res[f"train_{key}"]).all()
    assert (res["test_mse"] < 0).all()


@pytest.mark.parametrize("refit", ["r2", "mse"])
def test_grid_search_multi_metric_refit(refit):
    X, y = _variable_data(noise=0.05)
    scoring = {"r2": sequence_scorer("r2"), "mse": sequence_scorer("neg_mean_squared_error")}
    search = _gs(_pipeline(), scoring, grid={"model__alpha": [1e6, 1e-2]},
                 refit=refit).fit(X, y)
    means = search.cv_results_[f"mean_test_{refit}"]
    assert search.best_index_ == int(np.argmax(means)) == 1
    assert search.best_params_ == {"model__alpha": 1e-2}
    assert search.score(X, y) == scoring[refit](search.best_estimator_, X, y)
    # A search used as an estimator: its readout is that of its best estimator.
    assert sequence_scorer("r2")(search, X, y) == search.best_estimator_.score(X, y)


def test_grid_search_with_sample_weight_routes_like_sklearn_without_routing():
    # Without metadata routing scikit-learn decides itself whether a search
    # forwards fit's sample_weight to the scorer; the sequence scorer must
    # behave exactly as scikit-learn's own scorer does.
    X, y = _positive_data("last")
    w = np.random.default_rng(4).uniform(0.2, 3.0, size=len(X))
    grid = {"alpha": [1e-3, 1.0, 30.0]}
    est = LinearAttentionRegressor()
    for name in ["r2", "neg_mean_absolute_error"]:
        for scoring in (name, {"a": name, "b": "r2"}):
            ours = ({k: sequence_scorer(v) for k, v in scoring.items()}
                    if isinstance(scoring, dict) else sequence_scorer(scoring))
            refit = "a" if isinstance(scoring, dict) else True
            plain = _gs(est, scoring, grid, refit=refit).fit(X, y, sample_weight=w)
            seq = _gs(est, ours, grid, refit=refit).fit(X, y, sample_weight=w)
            for key in plain.cv_results_:
                if key.startswith(("mean_test", "split")):
                    np.testing.assert_array_equal(seq.cv_results_[key],
                                                  plain.cv_results_[key])


# ----------------------------------------------------------------------------
# metadata routing


def _routed_search(scorer, X, y, w, **fit_kw):
    est = LinearAttentionRegressor(readout="all", alpha=0.1).set_fit_request(sample_weight=True)
    return cross_validate(est, X, y, cv=KFold(3), scoring=scorer,
                          params={"sample_weight": w, **fit_kw})


def test_metadata_routing_sample_weight():
    X, y = _variable_data(noise=0.3)
    w = np.random.default_rng(5).uniform(0.1, 3.0, size=len(X))
    est = LinearAttentionRegressor(readout="all", alpha=0.1)
    weighted = _fold_scores(est, X, y, sequence_scorer("r2"), w_fit=w, w_score=w)
    unweighted = _fold_scores(est, X, y, sequence_scorer("r2"), w_fit=w)
    assert not np.allclose(weighted, unweighted)
    with sklearn.config_context(enable_metadata_routing=True):
        with pytest.raises(UnsetMetadataPassedError, match="sample_weight"):
            _routed_search(sequence_scorer("r2"), X, y, w)
        res = _routed_search(sequence_scorer("r2").set_score_request(sample_weight=True),
                             X, y, w)
        np.testing.assert_allclose(res["test_score"], weighted, rtol=1e-12)
        res = _routed_search(sequence_scorer("r2").set_score_request(sample_weight=False),
                             X, y, w)
        np.testing.assert_allclose(res["test_score"], unweighted, rtol=1e-12)
        scoring = {
            "r2": sequence_scorer("r2").set_score_request(sample_weight=True),
            "mse": sequence_scorer("neg_mean_squared_error").set_score_request(
                sample_weight=True),
        }
        res = _routed_search(scoring, X, y, w)
        np.testing.assert_allclose(res["test_r2"], weighted, rtol=1e-12)
        mse = _fold_scores(est, X, y, sequence_scorer("neg_mean_squared_error"),
                           w_fit=w, w_score=w)
        np.testing.assert_allclose(res["test_mse"], mse, rtol=1e-12)


def test_metadata_routing_grid_search_refit():
    X, y = _variable_data(noise=0.05)
    w = np.random.default_rng(6).uniform(0.1, 3.0, size=len(X))
    with sklearn.config_context(enable_metadata_routing=True):
        est = LinearAttentionRegressor(readout="all").set_fit_request(sample_weight=True)
        scoring = {
            "r2": sequence_scorer("r2").set_score_request(sample_weight=True),
            "mae": sequence_scorer("neg_mean_absolute_error").set_score_request(
                sample_weight=True),
        }
        search = _gs(est, scoring, refit="mae").fit(X, y, sample_weight=w)
        assert search.best_params_ == {"alpha": 0.0}
        split0 = search.cv_results_["split0_test_r2"]
        train, test = next(KFold(3).split(X))
        for k, alpha in enumerate([1e6, 0.0]):
            fitted = LinearAttentionRegressor(readout="all", alpha=alpha).fit(
                X[train], y[train], sample_weight=w[train])
            assert split0[k] == pytest.approx(
                fitted.score(X[test], y[test], sample_weight=w[test]), rel=1e-12)


def test_metadata_routing_metric_metadata_and_request_errors():
    model, X, y = _model_and_data(d_out=2)
    yr, pr, _ = _ref_positions(y, model.predict(X))
    with pytest.raises(RuntimeError, match="metadata routing is enabled"):
        sequence_scorer("r2").set_score_request(sample_weight=True)
    with sklearn.config_context(enable_metadata_routing=True):
        scorer = sequence_scorer("r2").set_score_request(multioutput=True)
        assert scorer.get_metadata_routing().score.requests["multioutput"] is True
        value = scorer(model, X, y, multioutput="variance_weighted")
        assert value == pytest.approx(r2_score(yr, pr, multioutput="variance_weighted"),
                                      rel=1e-12)
