"""LinearAttentionRegressorCV: per-split scores from statistics against slow references."""

import numpy as np
import pytest
import sklearn
from sklearn.metrics import r2_score
from sklearn.model_selection import GroupKFold, KFold, TimeSeriesSplit

from reference import ref_features, ref_prefix_features
from sklearn_linattn import LinearAttentionRegressor, LinearAttentionRegressorCV, mhla_forward
from sklearn_linattn._cv import DEFAULT_ALPHAS, cv_splits, split_groups
from sklearn_linattn._problem import StandardizedProblem
from sklearn_linattn._source import ArraySource
from sklearn_linattn._solvers import SufficientStatistics
from sklearn_linattn._terms import LinearTerms
from sklearn_linattn.metrics import sequence_scorer


def make_data(seed, *, n=90, n_tokens=5, d=3, d_out=1, readout="last", noise=0.3,
              ragged=False):
    """Gaussian sequences, a random one-head teacher, Gaussian noise; NaN padding if ragged."""
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(1, d_out, d))
    Q = rng.normal(size=(1, d, d))
    X = rng.normal(size=(n, n_tokens, d))
    lengths = rng.integers(2, n_tokens + 1, size=n) if ragged else np.full(n, n_tokens)
    y = mhla_forward(X, V, Q, lengths, readout=readout)
    y = y + noise * rng.normal(size=y.shape)
    if ragged:
        for i, m in enumerate(lengths):
            X[i, m:] = np.nan
            if readout == "all":
                y[i, m:] = np.nan
    return X, (y[..., 0] if d_out == 1 else y), lengths


def plain_scores(X, y, splits, alpha=0.0, scoring="neg_mean_squared_error", **params):
    """The slow reference: a plain fit on each train part, scored on its test part."""
    scorer = sequence_scorer(scoring)
    out = []
    for train, test in splits:
        model = LinearAttentionRegressor(alpha=alpha, **params).fit(X[train], y[train])
        out.append(scorer(model, X[test], y[test]))
    return np.array(out)


def split_scores(model):
    return np.array([model.cv_results_[f"split{k}_test_score"] for k in range(model.n_splits_)])


def numpy_ridge_scores(model, X, y, lengths, splits, alphas, sample_weight, terms):
    """Explicit ridge with unpenalized terms on reference features in the model's coordinates."""
    st = model.standardization_
    readout = model.readout
    Xs = st.transform(np.where(np.isnan(X), 0.0, X))
    if readout == "last":
        H = ref_features(Xs, lengths)
        x_row = Xs[np.arange(len(X)), lengths - 1]
        rows = np.arange(len(X))
        Y = y.reshape(len(X), -1)
    else:
        real = np.arange(X.shape[1])[None, :] < lengths[:, None]
        H = ref_prefix_features(Xs, lengths)[real]
        x_row = Xs[real]
        rows = np.nonzero(real)[0]
        Y = y.reshape(*X.shape[:2], -1)[real]
    H = st.scale_features(H)
    E = np.concatenate([np.ones((len(rows), terms[0])), x_row[:, : X.shape[2] * terms[1]]],
                       axis=1)
    w = sample_weight[rows]
    psi = H.shape[1]
    ey = st.y_exponents[: Y.shape[1]]
    Ystd = np.ldexp(Y, -ey)
    scores = np.empty((len(alphas), len(splits)))
    for k, (train, test) in enumerate(splits):
        tr, te = np.isin(rows, train), np.isin(rows, test)
        D = np.concatenate([H[tr], E[tr]], axis=1) * np.sqrt(w[tr])[:, None]
        A = D.T @ D
        b = D.T @ (Ystd[tr] * np.sqrt(w[tr])[:, None])
        for i, alpha in enumerate(alphas):
            P = A.copy()
            P[np.arange(psi), np.arange(psi)] += alpha * np.trace(A[:psi, :psi]) / psi
            # At alpha = 0 the minimum-norm solution, zero eigenvalues by the package's
            # rule (at most psi * eps * lambda_max); the inverse where there are none.
            coef = np.linalg.pinv(P, rcond=psi * np.finfo(float).eps, hermitian=True) @ b
            pred = np.ldexp(np.concatenate([H[te], E[te]], axis=1) @ coef, ey)
            mse = (w[te][:, None] * (Y[te] - pred) ** 2).sum(axis=0) / w[te].sum()
            scores[i, k] = -mse.mean()
    return scores


# ---------------------------------------------------------------------------- scores


def test_split_scores_equal_plain_fits_at_alpha_zero():
    # An identified design: at alpha = 0 the coordinates do not matter, so a
    # plain fit on each train part is the reference.
    X, y, _ = make_data(0)
    model = LinearAttentionRegressorCV(alphas=[0.0, 1e-3], cv=4).fit(X, y)
    splits = list(KFold(4).split(X))
    np.testing.assert_allclose(split_scores(model)[:, 0], plain_scores(X, y, splits),
                               rtol=1e-8)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_split_scores_equal_numpy_ridge_with_terms_weights_and_padding(readout):
    X, y, lengths = make_data(1, n=60, n_tokens=5, d=2, d_out=2, readout=readout,
                              ragged=True)
    w = np.random.default_rng(1).uniform(0.2, 3.0, size=len(X))
    alphas = np.array([0.0, 1e-4, 1e-2, 1.0])
    cv = KFold(3, shuffle=True, random_state=0)
    model = LinearAttentionRegressorCV(alphas, cv=cv, readout=readout, fit_intercept=True,
                                       fit_skip=True).fit(X, y, sample_weight=w)
    reference = numpy_ridge_scores(model, X, y, lengths, list(cv.split(X)), alphas, w,
                                   (1, 1))
    np.testing.assert_allclose(split_scores(model).T, reference, rtol=1e-8)
    assert model.best_score_ == pytest.approx(reference.mean(axis=1).max(), rel=1e-8)


def test_r2_scores_equal_plain_fits():
    X, y, _ = make_data(2, d_out=2)
    model = LinearAttentionRegressorCV([0.0], cv=3, scoring="r2").fit(X, y)
    splits = list(KFold(3).split(X))
    reference = [r2_score(y[test], LinearAttentionRegressor().fit(X[train], y[train])
                          .predict(X[test])) for train, test in splits]
    np.testing.assert_allclose(split_scores(model)[:, 0], reference, rtol=1e-8)


@pytest.mark.parametrize("cv", [
    TimeSeriesSplit(3),  # train parts that are not the complements of the test parts
    [(np.arange(40, 90), np.arange(40)), (np.arange(45), np.arange(50, 90))],
    KFold(3, shuffle=True, random_state=1),
], ids=["time-series", "iterable", "shuffled-kfold"])
def test_splitters_and_iterables(cv):
    X, y, _ = make_data(3)
    model = LinearAttentionRegressorCV([0.0], cv=cv).fit(X, y)
    splits = cv_splits(cv, len(X))
    np.testing.assert_allclose(split_scores(model)[:, 0], plain_scores(X, y, splits),
                               rtol=1e-8)


def test_group_kfold_keeps_groups_together():
    X, y, _ = make_data(4)
    groups = np.repeat(np.arange(9), 10)
    model = LinearAttentionRegressorCV([0.0], cv=GroupKFold(3)).fit(X, y, groups=groups)
    splits = list(GroupKFold(3).split(X, y, groups))
    np.testing.assert_allclose(split_scores(model)[:, 0], plain_scores(X, y, splits),
                               rtol=1e-8)


def test_split_groups_of_kfold_and_of_unused_sequences():
    splits = [(np.arange(2, 6), np.arange(2)), (np.arange(0, 2), np.arange(2, 4))]
    labels, parts = split_groups(splits, 7)
    # Sequences 4, 5 are in the first train part only; 6 in no split.
    assert labels.tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert [(tr.tolist(), te.tolist()) for tr, te in parts] == [([1, 2], [0]), ([0], [1])]


# ---------------------------------------------------------------------------- the refit


@pytest.mark.parametrize("params", [
    dict(), dict(readout="all", fit_intercept=True, fit_skip=True), dict(n_heads=1),
])
def test_refit_equals_the_plain_fit_at_alpha_(params):
    X, y, _ = make_data(5, readout=params.get("readout", "last"))
    model = LinearAttentionRegressorCV(cv=3, random_state=0, **params).fit(X, y)
    plain = LinearAttentionRegressor(alpha=model.alpha_, random_state=0, **params).fit(X, y)
    X_new = np.random.default_rng(5).normal(size=(10, 8, 3))
    np.testing.assert_allclose(model.coef_, plain.coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.intercept_, plain.intercept_, atol=1e-12)
    np.testing.assert_allclose(model.skip_coef_, plain.skip_coef_, atol=1e-12)
    # (A compression converges to its own tolerance: the heads to about 1e-9.)
    np.testing.assert_allclose(model.predict(X_new), plain.predict(X_new), rtol=1e-7)
    assert model.n_heads_ == plain.n_heads_
    assert bool(model.certificate_) == bool(plain.certificate_)
    assert model.certificate_.rank == plain.certificate_.rank
    assert model.solver_ == plain.solver_


def test_exact_teacher_chooses_alpha_zero_and_is_certified():
    X, _, _ = make_data(6, n=200, noise=0.0)
    rng = np.random.default_rng(6)
    V, Q = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3))
    y = mhla_forward(X, V, Q)[:, 0]
    model = LinearAttentionRegressorCV().fit(X, y)
    assert model.alpha_ == 0.0 and model.best_index_ == 0
    assert tuple(model.alphas) == DEFAULT_ALPHAS
    assert model.certificate_
    X_long = rng.normal(size=(5, 30, 3))
    np.testing.assert_allclose(model.predict(X_long), mhla_forward(X_long, V, Q)[:, 0],
                               rtol=1e-8)
    assert model.cv_results_["rank_test_score"][0] == 1


def test_fewest_heads_of_the_refit_with_n_heads_auto():
    X, _, _ = make_data(7, n=300, noise=0.0)
    rng = np.random.default_rng(7)
    V, Q = rng.normal(size=(2, 1, 3)), rng.normal(size=(2, 3, 3))
    y = mhla_forward(X, V, Q)[:, 0]
    model = LinearAttentionRegressorCV(n_heads="auto", random_state=0).fit(X, y)
    assert model.alpha_ == 0.0 and model.n_heads_ == 2
    X_long = 10 * rng.normal(size=(5, 30, 3))
    np.testing.assert_allclose(model.predict(X_long), mhla_forward(X_long, V, Q)[:, 0],
                               rtol=1e-8)


def test_rank_deficient_design_refit_is_the_minimum_norm_fit():
    # One-hot positions appended: the features are rank-deficient, so alpha = 0
    # is the minimum-norm solution, the same as the plain fit's.
    rng = np.random.default_rng(7)
    X = np.concatenate([rng.normal(size=(80, 4, 2)), np.broadcast_to(np.eye(4), (80, 4, 4))],
                       axis=2)
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + 0.1 * rng.normal(size=80)
    model = LinearAttentionRegressorCV([0.0], cv=4).fit(X, y)
    plain = LinearAttentionRegressor().fit(X, y)
    assert not model.certificate_ and model.feature_rank_ == plain.feature_rank_
    np.testing.assert_allclose(model.coef_, plain.coef_, rtol=1e-8, atol=1e-10)


def test_rank_deficient_design_scores_on_the_row_space_equal_full_size_solves(monkeypatch):
    import sklearn_linattn._cv as cv_module

    rng = np.random.default_rng(18)
    X = np.concatenate([rng.normal(size=(150, 4, 2)),
                        np.broadcast_to(np.eye(4), (150, 4, 4))], axis=2)  # psi = 126
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + 0.3 * rng.normal(size=150)
    alphas = np.array([0.0, 1e-4, 1e-2])
    reduced = LinearAttentionRegressorCV(alphas, cv=4, fit_intercept=True).fit(X, y)
    assert reduced.feature_rank_ < 126
    # The groups as they are, not projected on the row space: full-size solves.
    monkeypatch.setattr(cv_module, "Projected", lambda part, basis: cv_module.Whole(part))
    monkeypatch.setattr(cv_module, "projected_from_rows",
                        lambda stats, basis, rows, groups: [cv_module.Whole(p) for p in stats])
    full = LinearAttentionRegressorCV(alphas, cv=4, fit_intercept=True).fit(X, y)
    np.testing.assert_allclose(split_scores(reduced), split_scores(full), rtol=1e-8)


@pytest.mark.parametrize("kw", [{}, dict(fit_linear="auto", fit_intercept=True),
                                dict(decays=[None, 0.9])])
def test_groups_projected_from_the_kept_rows_equal_their_gram_projection(monkeypatch, kw):
    import sklearn_linattn._cv as cv_module

    rng = np.random.default_rng(3)
    X = rng.normal(size=(120, 6, 9))  # psi = 405 > 120 rows: the row space
    y = X[:, -1, 0] * X[:, :, 1].sum(axis=1) + 0.1 * rng.normal(size=120)
    w = rng.uniform(0.0, 2.0, size=120)
    w[:5] = 0.0  # rows of zero weight are not kept
    used = []
    rows = cv_module.projected_from_rows
    monkeypatch.setattr(cv_module, "projected_from_rows", lambda *a: used.append(1) or rows(*a))
    from_rows = LinearAttentionRegressorCV(**kw).fit(X, y, sample_weight=w)
    assert used
    monkeypatch.setattr(cv_module, "projected_from_rows",
                        lambda stats, basis, r, g: [cv_module.Projected(p, basis) for p in stats])
    from_gram = LinearAttentionRegressorCV(**kw).fit(X, y, sample_weight=w)
    np.testing.assert_allclose(split_scores(from_rows), split_scores(from_gram), rtol=1e-8)


def test_positive_definite_splits_by_cholesky_equal_the_references(monkeypatch):
    from sklearn_linattn._solvers import normal  # the splits' solves (PenaltyPath)

    decompositions = []
    eigh = normal.descending_eigh
    monkeypatch.setattr(normal, "descending_eigh",
                        lambda *args, **kwargs: decompositions.append(1) or eigh(*args, **kwargs))
    X, y, lengths = make_data(19, n=300, d=5)  # psi = 75: "cholesky"
    w = np.ones(len(X))
    alphas = np.array([0.0, 1e-3, 1e-1])
    model = LinearAttentionRegressorCV(alphas, cv=3).fit(X, y)
    assert decompositions == [] and model.solver_ == "cholesky"
    splits = list(KFold(3).split(X))
    np.testing.assert_allclose(split_scores(model)[:, 0], plain_scores(X, y, splits),
                               rtol=1e-8)
    reference = numpy_ridge_scores(model, X, y, lengths, splits, alphas, w, (0, 0))
    np.testing.assert_allclose(split_scores(model).T, reference, rtol=1e-8)


def test_train_parts_with_fewer_sequences_than_psi_give_the_minimum_norm_fit():
    # psi = 75, 60 training sequences per split: each training part is
    # rank-deficient although all the data are not (no common row space).
    X, y, lengths = make_data(20, n=90, d=5)
    alphas = np.array([0.0, 1e-3])
    model = LinearAttentionRegressorCV(alphas, cv=3).fit(X, y)
    assert model.certificate_
    reference = numpy_ridge_scores(model, X, y, lengths, list(KFold(3).split(X)), alphas,
                                   np.ones(len(X)), (0, 0))
    np.testing.assert_allclose(split_scores(model).T, reference, rtol=1e-8)


def test_cv_results_have_the_shape_of_grid_search():
    X, y, _ = make_data(8)
    alphas = [1.0, 0.0, 1e-2]
    model = LinearAttentionRegressorCV(alphas, cv=3).fit(X, y)
    results = model.cv_results_
    assert list(results["param_alpha"]) == alphas
    assert results["params"] == [{"alpha": a} for a in alphas]
    scores = split_scores(model)
    np.testing.assert_array_equal(results["mean_test_score"], scores.mean(axis=0))
    np.testing.assert_array_equal(results["std_test_score"], scores.std(axis=0))
    assert sorted(results["rank_test_score"]) == [1, 2, 3]
    assert model.alpha_ == alphas[int(np.argmax(results["mean_test_score"]))]


def test_equal_scores_choose_the_first_alpha_in_the_order_given():
    X, y, _ = make_data(9)
    model = LinearAttentionRegressorCV([1e-3, 1e-3, 0.0], cv=3).fit(X, y)
    assert model.best_index_ in (0, 2) and model.cv_results_["rank_test_score"][1] in (1, 2)
    if model.best_index_ != 2:
        assert model.best_index_ == 0


# ---------------------------------------------------------------------------- the pass


def test_group_statistics_of_one_pass_equal_each_groups_own_statistics():
    # Small chunks: several sub-chunks, statistics accumulated in provisional
    # coordinates and mapped into the final ones.
    X, y, lengths = make_data(10, n=40, readout="all", ragged=True)
    Xz = np.where(np.isnan(X), 0.0, X)
    labels = np.arange(40) % 3
    terms = LinearTerms(3, intercept=True, skip=True)
    Y = np.where(np.isnan(y), 0.0, y)[..., None]
    data = ArraySource.validated(Xz, lengths, Y, None, "all")
    with sklearn.config_context(working_memory=0.02):
        problem = StandardizedProblem.from_source(data, readout="all", terms=terms,
                                                  solver="eigh", groups=labels)
    st = problem.standardizer
    for g, part in enumerate(problem.group_stats):
        own = SufficientStatistics(3, 1 + terms.n_terms, standardizer=st).update(
            Xz[labels == g], lengths[labels == g], Y[labels == g], readout="all", terms=terms)
        np.testing.assert_allclose(part.gram, own.gram, rtol=1e-10, atol=1e-10 * own.gram.max())
        np.testing.assert_allclose(part.moment, own.moment, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(part.y_cross, own.y_cross, rtol=1e-10)
        np.testing.assert_allclose(part.y_sum, own.y_sum, rtol=1e-10)
        assert (part.n_rows, part.n_samples) == (own.n_rows, own.n_samples)
    assert problem.stats.n_samples == 40
    np.testing.assert_allclose(problem.stats.y_sum, sum(p.y_sum for p in problem.group_stats))


def test_groups_accumulated_again_when_the_map_is_refused_equal_the_mapped_ones(monkeypatch):
    from sklearn_linattn._units import _coordinates

    X, y, lengths = make_data(17, n=40)
    labels = np.arange(40) % 4
    data = ArraySource.validated(X, lengths, y[:, None], None, "last")

    def problem():
        with sklearn.config_context(working_memory=0.01):
            return StandardizedProblem.from_source(data, readout="last", terms=LinearTerms(3),
                                                   solver="eigh", groups=labels)

    passes = []
    reduce = ArraySource.reduce

    def counted(self, start, **kwargs):
        passes.append(kwargs.get("name"))
        return reduce(self, start, **kwargs)

    monkeypatch.setattr(ArraySource, "reduce", counted)
    mapped = problem()
    # Final coordinates "too far" from the first chunk's: a second pass.
    monkeypatch.setattr(_coordinates, "MAP_CONDITION", 0.5)
    again = problem()
    assert passes.count("statistics") == 1 and len(passes) == 3
    for a, b in zip(mapped.group_stats, again.group_stats):
        np.testing.assert_allclose(a.gram, b.gram, rtol=1e-10, atol=1e-12 * b.gram.max())
        np.testing.assert_allclose(a.moment, b.moment, rtol=1e-10, atol=1e-12)
        assert (a.n_rows, a.n_samples) == (b.n_rows, b.n_samples) == (10, 10)


def test_a_fit_with_terms_and_a_penalty_decomposes_the_gram_matrix_once(monkeypatch):
    from sklearn_linattn._solvers import normal

    calls = []
    original = normal.descending_eigh
    monkeypatch.setattr(normal, "descending_eigh",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    X, y, _ = make_data(11)
    LinearAttentionRegressor(alpha=1e-3, solver="eigh", fit_intercept=True).fit(X, y)
    assert len(calls) == 1


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("params, error, match", [
    (dict(alphas=[-1.0]), ValueError, "alphas must be finite and non-negative"),
    (dict(alphas=[]), ValueError, "alphas must be a non-empty 1-D"),
    (dict(alphas="large"), TypeError, "alphas must be a non-negative number"),
    (dict(scoring="neg_mean_absolute_error"), ValueError,
     r"scoring must be one of \(None, 'neg_mean_squared_error', 'r2'\); got "
     r"'neg_mean_absolute_error'"),
    (dict(solver="cg"), ValueError, r"solver must be one of \('auto', 'eigh', 'cholesky'\)"),
    (dict(cv=True), TypeError, "cv must be an int"),
    (dict(cv=1), ValueError, "cv=1 cannot split"),
    (dict(cv=[(np.arange(10), np.arange(5))]), ValueError,
     "split 0 of cv=.* puts sequences in both"),
    (dict(cv=[(np.arange(10), np.array([0.5]))]), ValueError, "cv must give test indices"),
    (dict(cv=[(np.r_[0, 0, 1], np.arange(2, 30))]), ValueError, "repeated train indices"),
    (dict(cv=[(np.arange(10), np.array([30]))]), ValueError,
     r"cv gave test indices outside \[0, 30\)"),
    (dict(alpha=1.0), TypeError, "unexpected keyword argument 'alpha'"),
])
def test_invalid_parameters_are_named(params, error, match):
    X, y, _ = make_data(12, n=30)
    with pytest.raises(error, match=match):
        LinearAttentionRegressorCV(**params).fit(X, y)


def test_invalid_groups_and_empty_weight_parts_are_refused():
    X, y, _ = make_data(13, n=30)
    with pytest.raises(ValueError, match=r"groups must have shape \(30,\)"):
        LinearAttentionRegressorCV(cv=GroupKFold(3)).fit(X, y, groups=np.arange(5))
    w = np.r_[np.zeros(10), np.ones(20)]
    with pytest.raises(ValueError, match="the test part of split 0 holds no sequence of "
                                         "positive sample weight"):
        LinearAttentionRegressorCV(cv=3).fit(X, y, sample_weight=w)


def test_dask_input_and_partial_fit_are_refused():
    da = pytest.importorskip("dask.array")
    X, y, _ = make_data(14, n=30)
    model = LinearAttentionRegressorCV()
    with pytest.raises(ValueError, match="needs X and y in memory"):
        model.fit(da.from_array(X, chunks=10), da.from_array(y, chunks=10))
    assert not hasattr(model, "partial_fit")
    with pytest.raises(AttributeError, match="no attribute 'partial_fit'") as caught:
        model.partial_fit(X, y)
    assert "has no partial_fit: every batch would need the folds" in str(caught.value.__cause__)


def test_statistics_larger_than_the_memory_budget_are_refused_before_the_pass(monkeypatch):
    import sklearn_linattn._cv as cv_module

    monkeypatch.setattr(cv_module, "resolve_budget", lambda budget: 1000)
    X, y, _ = make_data(15, n=30)
    with pytest.raises(ValueError, match="keeps psi x psi statistics for each of the 5 groups"):
        LinearAttentionRegressorCV().fit(X, y)


def test_save_model_writes_the_refitted_plain_model(tmp_path):
    from sklearn_linattn import load_model, save_model

    X, y, _ = make_data(16)
    model = LinearAttentionRegressorCV(cv=3, fit_intercept=True).fit(X, y)
    save_model(model, tmp_path / "model.npz")
    loaded = load_model(tmp_path / "model.npz")
    assert type(loaded) is LinearAttentionRegressor
    assert loaded.alpha == model.alpha_ and loaded.fit_intercept
    np.testing.assert_allclose(loaded.predict(X), model.predict(X), rtol=1e-12)
