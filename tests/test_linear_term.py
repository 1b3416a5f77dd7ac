"""The linear term over the whole window (fit_linear, alpha_linear) and SequenceRegressor."""

import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.preprocessing import StandardScaler

from sklearn_linattn import (
    LinearAttentionFeatures,
    LinearAttentionRegressor,
    LinearAttentionRegressorCV,
    SequenceRegressor,
    make_sequence_regressor,
    save_model,
)
from sklearn_linattn._units import levels_of, normalize_targets, restore_targets


def _data(n=200, T=5, d=2, seed=1, noise=0.1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    y = (0.3 * np.einsum("ntj,ntk,nk->n", X, X, X[:, -1])
         + X.reshape(n, -1) @ rng.normal(size=T * d) + noise * rng.normal(size=n))
    return X, y


def _reference(X, y, alpha_linear):
    """The joint least squares by a dense solve: features, the window by lag, a constant."""
    n = X.shape[0]
    H = LinearAttentionFeatures().fit_transform(X)
    E = X[:, ::-1, :].reshape(n, -1)
    D = ((E - E.mean(axis=0)) ** 2).sum(axis=0)
    A = np.hstack([np.ones((n, 1)), E, H])
    P = np.zeros((A.shape[1], A.shape[1]))
    m = E.shape[1]
    P[1:1 + m, 1:1 + m] = np.diag(alpha_linear * D)
    coef = np.linalg.solve(A.T @ A + P, A.T @ y)
    return A @ coef, coef[1:1 + m]


@pytest.mark.parametrize("alpha_linear", [0.0, 0.3, 10.0])
@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e40])
def test_joint_fit_equals_the_dense_reference(alpha_linear, scale):
    X, y = _data()
    X, y = X * scale, y * scale ** 3
    model = LinearAttentionRegressor(fit_linear=True, alpha_linear=alpha_linear,
                                     fit_intercept=True).fit(X, y)
    pred, linear = _reference(X / scale, y / scale ** 3, alpha_linear)
    np.testing.assert_allclose(model.predict(X) / scale ** 3, pred, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(model.linear_coef_.ravel() / scale ** 2, linear, rtol=1e-6,
                               atol=1e-9)
    assert model.linear_coef_.shape == (1, 5, 2)


@pytest.mark.parametrize("alpha_linear", [0.0, 0.05, 1.0])
def test_large_attention_penalty_leaves_standardized_ridge_on_the_window(alpha_linear):
    # The baseline it nests: StandardScaler + Ridge(alpha_linear * n) on the window.
    X, y = _data(n=150)
    n = X.shape[0]
    model = LinearAttentionRegressor(fit_linear=True, alpha_linear=alpha_linear,
                                     fit_intercept=True, alpha=1e14).fit(X, y)
    flat = X[:, ::-1, :].reshape(n, -1)
    scaler = StandardScaler().fit(flat)
    ridge = Ridge(alpha=alpha_linear * n).fit(scaler.transform(flat), y)
    np.testing.assert_allclose(model.predict(X), ridge.predict(scaler.transform(flat)),
                               atol=1e-9)


def test_linear_term_is_unit_free_per_channel():
    # A channel in other units (°C -> °F: 1.8 x + 32): the same predictions.
    X, y = _data(n=150, noise=0.5)
    Xf = X.copy()
    Xf[:, :, 1] = 1.8 * Xf[:, :, 1] + 32.0
    kw = dict(fit_linear=True, alpha_linear=0.1, fit_intercept=True, alpha=1e14)
    a = LinearAttentionRegressor(**kw).fit(X, y).predict(X)
    b = LinearAttentionRegressor(**kw).fit(Xf, y).predict(Xf)
    np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-7)


def test_cv_scores_equal_refits_on_each_split():
    X, y = _data(n=240, noise=0.5)
    # alpha = 0: with alpha > 0 the search penalizes in the whole data's standardized
    # coordinates, a refit in its split's; the linear term's penalty is the split's in both.
    search = LinearAttentionRegressorCV(fit_linear="auto", fit_intercept=True,
                                        alphas=[0.0]).fit(X, y)
    assert len(search.cv_results_["params"]) == 1 + 6
    for i in range(7):
        params = search.cv_results_["params"][i]
        scores = []
        for train, test in KFold(5).split(X):
            kw = dict(alpha=params["alpha"], fit_intercept=True,
                      fit_linear=params["fit_linear"])
            if params["fit_linear"]:
                kw["alpha_linear"] = params["alpha_linear"]
            fit = LinearAttentionRegressor(**kw).fit(X[train], y[train])
            scores.append(-np.mean((fit.predict(X[test]) - y[test]) ** 2))
        np.testing.assert_allclose(search.cv_results_["mean_test_score"][i], np.mean(scores),
                                   rtol=1e-8)
    assert search.fit_linear_ is True
    refit = LinearAttentionRegressor(alpha=search.alpha_, fit_intercept=True, fit_linear=True,
                                     alpha_linear=search.alpha_linear_).fit(X, y)
    np.testing.assert_allclose(search.predict(X), refit.predict(X), atol=1e-9)


def test_median_fold_score_is_not_decided_by_one_outlying_sequence():
    X, y = _data(n=200, noise=0.5)
    y = y.copy()
    y[7] = 1e4  # one outlying window in the first fold
    mean = LinearAttentionRegressorCV(fit_intercept=True, fold_score="mean").fit(X, y)
    median = LinearAttentionRegressorCV(fit_intercept=True, fold_score="median").fit(X, y)
    split = np.array([median.cv_results_[f"split{k}_test_score"] for k in range(5)])
    np.testing.assert_allclose(median.best_score_, np.median(split[:, median.best_index_]))
    assert median.alpha_ < mean.alpha_


@pytest.mark.parametrize("name, kw", [
    ("readout", dict(readout="all")),
    ("alphas_linear", dict(alphas_linear=[-1.0])),
    ("fold_score", dict(fold_score="max")),
])
def test_cv_refuses_bad_linear_parameters(name, kw):
    X, y = _data(n=60)
    if name == "readout":
        y = np.repeat(y[:, None], X.shape[1], axis=1)
    with pytest.raises(ValueError, match=name):
        LinearAttentionRegressorCV(fit_linear="auto", **kw).fit(X, y)


def test_linear_term_refused_where_it_is_not_written(tmp_path):
    X, y = _data(n=60)
    model = LinearAttentionRegressor(fit_linear=True, fit_intercept=True).fit(X, y)
    with pytest.raises(ValueError, match="fit_linear"):
        save_model(model, tmp_path / "m.npz")
    with pytest.raises(ValueError, match="fit_linear"):
        model.partial_fit(X, y)
    with pytest.raises(ValueError, match="readout"):
        LinearAttentionRegressor(readout="all", fit_linear=True).fit(X, np.ones((60, 5)))


@pytest.mark.parametrize("level", ["none", "last", "revin"])
def test_levels_round_trip_and_error_weights(level):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 8, 3)) * [1.0, 100.0, 1e-3] + [0.0, 50.0, -2.0]
    y = rng.normal(size=(30, 2))
    loc, scale = levels_of(X, level)
    channels = np.array([1, 2])
    back = restore_targets(normalize_targets(y, loc, scale, channels), loc, scale, channels)
    np.testing.assert_allclose(back, y, rtol=1e-12, atol=1e-12)
    if level == "revin":
        np.testing.assert_allclose(loc, X.mean(axis=1))
        np.testing.assert_allclose(scale, X.std(axis=1))


def _series_windows(n=360, T=12, seed=0, trend=0.05):
    rng = np.random.default_rng(seed)
    t = np.arange(n + T + 1.0)
    s = 5 + trend * t + np.sin(2 * np.pi * t / 12) + 0.1 * rng.normal(size=t.size)
    X = np.lib.stride_tricks.sliding_window_view(s[:-1], T)[:, :, None]
    return X, s[T:]


def test_sequence_regressor_chooses_on_training_windows_and_beats_naive():
    X, y = _series_windows()
    model = make_sequence_regressor(patch_sizes=[3], decays=[None]).fit(X[:280], y[:280])
    assert set(model.best_params_) == {"level", "patch_size", "positions", "alpha", "decay",
                                       "fit_linear", "alpha_linear"}
    assert len(model.cv_results_["params"]) == 3
    both = make_sequence_regressor(patch_sizes=[3], decays=[None], levels=("last",),
                                   positions=(True, False)).fit(X[:280], y[:280])
    assert both.cv_results_["param_positions"].tolist() == [True, False]
    assert both.best_params_["positions"] == bool(
        both.cv_results_["param_positions"][np.argmax(both.cv_results_["mean_test_score"])])
    assert len(both.best_estimator_.steps) == 3 if both.best_params_["positions"] else 2
    rmse = np.sqrt(np.mean((model.predict(X[280:]) - y[280:]) ** 2))
    naive = np.sqrt(np.mean((X[280:, -1, 0] - y[280:]) ** 2))
    assert rmse < 0.5 * naive


def test_sequence_regressor_is_unit_free_and_a_scikit_learn_estimator():
    X, y = _series_windows(n=200)
    kw = dict(patch_sizes=[4], decays=[None], levels=("last", "revin"))
    a = make_sequence_regressor(**kw).fit(X, y)
    # °C -> °F on the channel and the target: the same forecast in °F.
    b = make_sequence_regressor(**kw).fit(1.8 * X + 32, 1.8 * y + 32)
    np.testing.assert_allclose(b.predict(1.8 * X + 32), 1.8 * a.predict(X) + 32, rtol=1e-6)
    assert b.best_params_ == a.best_params_
    np.testing.assert_allclose(b.best_score_, 1.8 ** 2 * a.best_score_, rtol=1e-8)
    c = pickle.loads(pickle.dumps(a))
    np.testing.assert_array_equal(c.predict(X), a.predict(X))
    assert clone(a).get_params() == a.get_params()
    with pytest.raises(ValueError, match="windows of 11 time points"):
        a.predict(X[:, 1:])
    first = SequenceRegressor(data_format="channels_first", **kw).fit(X.transpose(0, 2, 1), y)
    np.testing.assert_allclose(first.predict(X.transpose(0, 2, 1)), a.predict(X))
    grid = GridSearchCV(make_sequence_regressor(**kw), {"fold_score": ["mean", "median"]},
                        cv=2).fit(X, y)
    assert grid.best_params_["fold_score"] in ("mean", "median")


@pytest.mark.parametrize("kw, match", [
    (dict(levels=["median"]), "levels"),
    (dict(patch_sizes=[0]), "patch_sizes"),
    (dict(target_channels=[3]), "target_channels"),
    (dict(fold_score="max"), "fold_score"),
    (dict(positions=["yes"]), "positions"),
])
def test_sequence_regressor_refuses_bad_parameters(kw, match):
    X, y = _series_windows(n=60)
    with pytest.raises((ValueError, TypeError), match=match):
        make_sequence_regressor(**kw).fit(X, y)


def test_level_targets_false_normalizes_the_windows_only():
    # y in other units than X (a rate): the windows' level applies to X alone.
    X, _ = _series_windows(n=160)
    y = X[:, -1, 0] / (1.0 + np.abs(X[:, :, 0]).mean(axis=1))
    kw = dict(patch_sizes=[4], decays=[None], levels=("revin",))
    model = make_sequence_regressor(level_targets=False, **kw).fit(X, y)
    # The same pipeline by hand on windows in their own mean and standard deviation.
    loc, scale = levels_of(X, "revin")
    Xn = (X - loc[:, None, :]) / scale[:, None, :]
    by_hand = clone(model.best_estimator_).fit(Xn, y)
    np.testing.assert_allclose(model.predict(X), by_hand.predict(Xn), rtol=1e-10, atol=1e-12)
    with pytest.raises(TypeError, match="level_targets"):
        make_sequence_regressor(level_targets="yes", **kw).fit(X, y)


def test_sequence_regressor_reads_one_draw_of_a_random_or_one_shot_cv():
    # Regression: each configuration drew its own splits from cv (a shuffled KFold without
    # a seed gave every configuration, and the rescaling of its scores, other folds; a
    # generator was used up by the first).
    from sklearn.model_selection import KFold

    X, y = _series_windows(n=120)
    kw = dict(patch_sizes=[3], decays=[None], levels=("none", "revin"))
    splits = list(KFold(4, shuffle=True, random_state=0).split(X))
    fixed = make_sequence_regressor(cv=splits, **kw).fit(X, y)
    once = make_sequence_regressor(cv=(s for s in splits), **kw).fit(X, y)
    np.testing.assert_allclose(once.cv_results_["mean_test_score"],
                               fixed.cv_results_["mean_test_score"], rtol=1e-12)
    shuffled = make_sequence_regressor(cv=KFold(4, shuffle=True), **kw).fit(X, y)
    search = shuffled.best_estimator_[-1]
    assert isinstance(search.cv, list) and len(search.cv) == 4
