"""LinearAttentionRegressorCV's choices beyond alpha: the terms ("auto"), the grid's edge."""

import warnings

import numpy as np
import pytest
from sklearn.model_selection import KFold

from sklearn_linattn import LinearAttentionRegressor, LinearAttentionRegressorCV, mhla_forward
from sklearn_linattn._cv import DEFAULT_ALPHAS
from sklearn_linattn.exceptions import GridEdgeWarning
from test_cv import make_data, numpy_ridge_scores, split_scores

TERM_SETS = [(False, False), (False, True), (True, False), (True, True)]


def _rows_of(model, intercept, skip):
    """The cv_results_ rows of one set of terms."""
    results = model.cv_results_
    keep = np.ones(len(results["params"]), dtype=bool)
    if "param_fit_intercept" in results:
        keep &= np.array([v == intercept for v in results["param_fit_intercept"]])
    if "param_fit_skip" in results:
        keep &= np.array([v == skip for v in results["param_fit_skip"]])
    return np.flatnonzero(keep)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_every_set_of_terms_is_scored_as_the_explicit_ridge_on_the_same_splits(readout):
    X, y, lengths = make_data(21, n=60, n_tokens=5, d=2, d_out=2, readout=readout,
                              ragged=True)
    w = np.random.default_rng(21).uniform(0.2, 3.0, size=len(X))
    alphas = np.array([0.0, 1e-4, 1e-2, 1.0])
    cv = KFold(3, shuffle=True, random_state=0)
    model = LinearAttentionRegressorCV(alphas, cv=cv, readout=readout, fit_intercept="auto",
                                       fit_skip="auto").fit(X, y, sample_weight=w)
    scores = split_scores(model).T  # (n_candidates * n_alphas, n_splits)
    assert scores.shape == (4 * alphas.size, 3)
    splits = list(cv.split(X))
    for intercept, skip in TERM_SETS:
        rows = _rows_of(model, intercept, skip)
        np.testing.assert_array_equal(model.cv_results_["param_alpha"][rows], alphas)
        reference = numpy_ridge_scores(model, X, y, lengths, splits, alphas, w,
                                       (int(intercept), int(skip)))
        np.testing.assert_allclose(scores[rows], reference, rtol=1e-8)
    best = int(np.argmax(model.cv_results_["mean_test_score"]))
    assert model.best_index_ == best
    assert model.cv_results_["params"][best] == {
        "alpha": model.alpha_, "fit_intercept": model.fit_intercept_,
        "fit_skip": model.fit_skip_}


@pytest.mark.parametrize("seed", range(4))
def test_auto_scores_the_best_of_the_searches_with_and_without_the_term(seed):
    X, y, _ = make_data(30 + seed, n=80, d=2, noise=1.0)
    alphas = np.array([0.0, 1e-3, 1e-1, 10.0])
    auto = LinearAttentionRegressorCV(alphas, cv=4, fit_skip="auto").fit(X, y)
    without = LinearAttentionRegressorCV(alphas, cv=4, fit_skip=False).fit(X, y)
    with_skip = LinearAttentionRegressorCV(alphas, cv=4, fit_skip=True).fit(X, y)
    np.testing.assert_allclose(split_scores(auto).T[_rows_of(auto, False, False)],
                               split_scores(without).T, rtol=1e-10)
    np.testing.assert_allclose(split_scores(auto).T[_rows_of(auto, False, True)],
                               split_scores(with_skip).T, rtol=1e-10)
    assert auto.best_score_ == pytest.approx(max(without.best_score_, with_skip.best_score_),
                                             rel=1e-10)
    assert auto.fit_skip_ == (with_skip.best_score_ > without.best_score_)
    assert not auto.fit_intercept_ and "param_fit_intercept" not in auto.cv_results_


def test_auto_keeps_a_skip_term_the_data_need_and_leaves_out_one_they_do_not():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(200, 4, 2))
    V, Q = rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 2, 2))
    attention = mhla_forward(X, V, Q)[:, 0]
    linear = attention + 3.0 * X[:, -1, 0] + 0.01 * rng.normal(size=200)
    assert LinearAttentionRegressorCV(fit_skip="auto").fit(X, linear).fit_skip_
    # An exact attention: the skip term adds only unpenalized variance.
    few = slice(0, 40)
    noisy = attention + 0.5 * rng.normal(size=200)
    model = LinearAttentionRegressorCV(fit_skip="auto", cv=4).fit(X[few], noisy[few])
    reference = [LinearAttentionRegressorCV(fit_skip=s, cv=4).fit(X[few], noisy[few]).best_score_
                 for s in (False, True)]
    assert model.fit_skip_ == (reference[1] > reference[0])


@pytest.mark.parametrize("terms", TERM_SETS)
def test_the_refit_is_the_plain_fit_of_the_chosen_terms_on_longer_inputs(terms):
    X, y, _ = make_data(40, n=90, d=2, noise=0.5)
    y = y + (2.0 * X[:, -1, 1] if terms[1] else 0.0) + (5.0 if terms[0] else 0.0)
    model = LinearAttentionRegressorCV([0.0, 1e-3, 1e-1], cv=3, fit_intercept="auto",
                                       fit_skip="auto").fit(X, y)
    plain = LinearAttentionRegressor(alpha=model.alpha_, fit_intercept=model.fit_intercept_,
                                     fit_skip=model.fit_skip_).fit(X, y)
    X_new = 3.0 * np.random.default_rng(41).normal(size=(10, 12, 2))
    np.testing.assert_allclose(model.predict(X_new), plain.predict(X_new), rtol=1e-8,
                               atol=1e-10 * np.abs(plain.predict(X_new)).max())
    if not model.fit_intercept_:
        assert np.all(model.intercept_ == 0)
    if not model.fit_skip_:
        assert np.all(model.skip_coef_ == 0)


def test_auto_terms_with_candidate_decays_score_each_pair_as_its_own_search():
    X, y, _ = make_data(42, n=80, d=2)
    alphas = np.array([0.0, 1e-2])
    model = LinearAttentionRegressorCV(alphas, cv=3, decays=[None, 0.5],
                                       fit_skip="auto").fit(X, y)
    results = model.cv_results_
    assert len(results["params"]) == 2 * 2 * alphas.size
    for decay in (None, 0.5):
        for skip in (False, True):
            alone = LinearAttentionRegressorCV(alphas, cv=3, decays=[decay],
                                               fit_skip=skip).fit(X, y)
            rows = [i for i, p in enumerate(results["params"])
                    if p["decay"] == (None if decay is None else (decay,))
                    and p["fit_skip"] == skip]
            np.testing.assert_allclose(split_scores(model).T[rows], split_scores(alone).T,
                                       rtol=1e-8)


def test_auto_terms_decompose_the_gram_matrix_once(monkeypatch):
    from sklearn_linattn._solvers import normal

    calls = []
    original = normal.descending_eigh
    monkeypatch.setattr(normal, "descending_eigh",
                        lambda *a, **k: calls.append(a[0].shape) or original(*a, **k))
    X, y, _ = make_data(43, n=60, d=2)  # psi = 6 < 60 rows: no split decomposes
    model = LinearAttentionRegressorCV([0.0, 1e-2], cv=3, solver="eigh", fit_intercept="auto",
                                       fit_skip="auto").fit(X, y)
    assert model.solver_ == "eigh"
    whole = [shape for shape in calls if shape == (6, 6)]
    assert len(whole) == 1 + 3  # all the data once (it serves the refit), each split once


def test_save_model_of_an_auto_search_writes_the_chosen_terms(tmp_path):
    from sklearn_linattn import load_model, save_model

    X, y, _ = make_data(44)
    model = LinearAttentionRegressorCV(cv=3, fit_intercept="auto", fit_skip="auto").fit(X, y)
    save_model(model, tmp_path / "model.npz")
    loaded = load_model(tmp_path / "model.npz")
    assert (loaded.fit_intercept, loaded.fit_skip) == (model.fit_intercept_, model.fit_skip_)
    np.testing.assert_allclose(loaded.predict(X), model.predict(X), rtol=1e-12)


def test_compare_to_optimum_reads_the_chosen_terms():
    from sklearn_linattn import compare_to_optimum

    X, y, _ = make_data(45, n=120, d=2, noise=0.0)
    model = LinearAttentionRegressorCV([0.0], cv=3, fit_skip="auto").fit(X, y)
    assert not model.fit_skip_  # an exact attention: the fewer terms tie and come first
    report = compare_to_optimum(model, X, y)
    assert report.optimum.fit_skip is False


@pytest.mark.parametrize("params, error, match", [
    (dict(fit_skip="yes"), TypeError, "fit_skip must be True, False or 'auto'; got 'yes'"),
    (dict(fit_intercept=1), TypeError, "fit_intercept must be True, False or 'auto'; got 1"),
])
def test_invalid_term_options_are_named(params, error, match):
    X, y, _ = make_data(46, n=30)
    with pytest.raises(error, match=match):
        LinearAttentionRegressorCV(**params).fit(X, y)


def test_the_plain_estimator_has_no_auto_terms():
    X, y, _ = make_data(47, n=30)
    with pytest.raises(TypeError, match="fit_skip must be True or False; got 'auto'"):
        LinearAttentionRegressor(fit_skip="auto").fit(X, y)


# ---------------------------------------------------------------------------- the edge


def _fit(alphas, X, y):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = LinearAttentionRegressorCV(alphas, cv=3).fit(X, y)
    return model, [w for w in caught if issubclass(w.category, GridEdgeWarning)]


def test_a_choice_at_the_largest_alpha_warns():
    rng = np.random.default_rng(50)
    X, y = rng.normal(size=(60, 4, 2)), rng.normal(size=60)  # nothing to learn
    model, caught = _fit([0.0, 1e-3, 1e-1], X, y)
    assert model.alpha_ == 0.1 and len(caught) == 1
    assert "alpha_ = 0.1 is the largest of the alphas searched" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the user's call


def test_the_default_grid_reaches_far_enough_to_warn_only_at_its_edge():
    assert max(DEFAULT_ALPHAS) == 100.0 and 0.0 in DEFAULT_ALPHAS
    rng = np.random.default_rng(51)
    X, y = rng.normal(size=(60, 4, 2)), rng.normal(size=60)
    model, caught = _fit(DEFAULT_ALPHAS, X, y)
    assert model.alpha_ == 100.0 and len(caught) == 1


def test_a_choice_at_the_smallest_positive_alpha_warns_only_without_zero():
    X, y, _ = make_data(52, n=120, noise=0.0)  # exact: the smallest penalty is best
    model, caught = _fit([1e-6, 1e-2, 1.0], X, y)
    assert model.alpha_ == 1e-6 and len(caught) == 1
    assert "smallest" in str(caught[0].message)
    model, caught = _fit([0.0, 1e-6, 1e-2], X, y)
    assert model.alpha_ == 0.0 and caught == []


def test_an_inner_choice_and_a_single_alpha_do_not_warn():
    X, y, _ = make_data(53, n=150, noise=1.0)
    model, caught = _fit(np.r_[0.0, np.logspace(-6, 6, 13)], X, y)
    assert 0 < model.alpha_ < 1e6 and caught == []
    model, caught = _fit([10.0], X, y)
    assert caught == []


# ---------------------------------------------------------------------------- wide data


@pytest.mark.parametrize("terms", [(False, False), ("auto", "auto"), (True, True)])
@pytest.mark.parametrize("readout", ["last", "all"])
def test_far_fewer_rows_than_features_search_on_the_kernel_as_the_eigh_search(terms, readout,
                                                                             monkeypatch):
    """Reproducer: the search decomposed the psi x psi Gram matrix of 40 rows (psi = 336)."""
    from sklearn_linattn._solvers import normal

    X, y, _ = make_data(60, n=40, n_tokens=3, d=7, readout=readout, noise=0.5)
    X_new = 2.0 * np.random.default_rng(61).normal(size=(6, 9, 7))
    alphas = np.array([0.0, 1e-4, 1e-2, 1.0, 1e3])
    params = dict(cv=4, readout=readout, fit_intercept=terms[0], fit_skip=terms[1])
    eigh = LinearAttentionRegressorCV(alphas, solver="eigh", **params).fit(X, y)
    sizes = []
    original = normal.descending_eigh
    monkeypatch.setattr(normal, "descending_eigh",
                        lambda G, *a, **k: sizes.append(G.shape[0]) or original(G, *a, **k))
    wide = LinearAttentionRegressorCV(alphas, **params).fit(X, y)
    assert wide.solver_ == "dual" and eigh.solver_ == "eigh"
    assert max(sizes, default=0) < 336  # no decomposition of psi x psi
    np.testing.assert_allclose(split_scores(wide), split_scores(eigh), rtol=1e-7)
    assert (wide.alpha_, wide.fit_intercept_, wide.fit_skip_) == (
        eigh.alpha_, eigh.fit_intercept_, eigh.fit_skip_)
    plain = LinearAttentionRegressor(alpha=wide.alpha_, readout=readout,
                                     fit_intercept=wide.fit_intercept_,
                                     fit_skip=wide.fit_skip_).fit(X, y)
    assert plain.solver_ == "dual"
    expected = plain.predict(X_new)
    np.testing.assert_allclose(wide.predict(X_new), expected, rtol=1e-9,
                               atol=1e-9 * np.abs(expected).max())
    np.testing.assert_allclose(eigh.predict(X_new), expected, rtol=1e-6,
                               atol=1e-6 * np.abs(expected).max())
    assert wide.feature_rank_ == eigh.feature_rank_ == plain.feature_rank_


def test_the_choice_of_terms_does_not_depend_on_the_units_of_the_data():
    """Reproducer: X * 1e30, y * 1e80 chose fit_skip_=True where X, y chose False.

    The teacher has no terms, so the scores with and without them differ in
    their last digits only, which the units change.
    """
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3, 7))
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + 0.3 * rng.normal(size=40)
    X_new = 2.0 * rng.normal(size=(5, 9, 7))
    units = 10.0 ** rng.uniform(-60, 60, size=7)
    params = dict(fit_intercept="auto", fit_skip="auto")
    base = LinearAttentionRegressorCV(**params).fit(X, y)
    expected = base.predict(X_new)
    for scale, y_scale in ((1e30, 1e80), (1e-100, 1e-250), (units, 1.0)):
        model = LinearAttentionRegressorCV(**params).fit(X * scale, y * y_scale)
        assert (model.fit_intercept_, model.fit_skip_, model.alpha_) == (
            base.fit_intercept_, base.fit_skip_, base.alpha_)
        np.testing.assert_allclose(model.predict(X_new * scale) / y_scale, expected,
                                   rtol=1e-10, atol=1e-12 * np.abs(expected).max())
