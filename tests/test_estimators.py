"""LinearAttentionRegressor and LinearAttentionFeatures as scikit-learn estimators."""

import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline

from reference import random_generator as _generator
from sklearn_linattn import (
    AdamLinearAttentionRegressor,
    LinearAttentionFeatures,
    LinearAttentionRegressor,
    attention_coefficients,
    mhla_forward,
    same_function,
)
from sklearn_linattn._features import attention_features, n_attention_features



def _rel_err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _padded(rng, n_samples, n_tokens, d, min_len=1, scale=1.0):
    """Gaussian sequences with random lengths, NaN-padded, plus lengths."""
    X = scale * rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(min_len, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, lengths


def _targets(X, lengths, V, Q, readout="last"):
    return mhla_forward(np.nan_to_num(X), V, Q, lengths, readout=readout)


@pytest.mark.parametrize("solver", ["eigh", "svd"])
@pytest.mark.parametrize("d, d_out, n_heads", [(2, 1, 1), (3, 2, 3), (4, 1, 2)])
def test_exact_recovery_out_of_distribution(solver, d, d_out, n_heads):
    rng = np.random.default_rng(d * 100 + d_out * 10 + n_heads)
    V, Q = _generator(rng, d, d_out, n_heads)
    psi = n_attention_features(d)
    X, lengths = _padded(rng, 3 * psi, 12, d, min_len=2)
    y = _targets(X, lengths, V, Q)
    model = LinearAttentionRegressor(solver=solver).fit(X, y)
    assert model.feature_rank_ == psi
    # Unseen sequences four times longer and five times larger than in training.
    X_new, lengths_new = _padded(rng, 40, 48, d, min_len=30, scale=5.0)
    y_new = _targets(X_new, lengths_new, V, Q)
    assert _rel_err(model.predict(X_new), y_new) <= 1e-8
    assert same_function(V, Q, model.value_matrices_, model.key_query_matrices_, rtol=1e-8)


def test_single_output_shapes():
    rng = np.random.default_rng(0)
    V, Q = _generator(rng, 2)
    X = rng.normal(size=(40, 5, 2))
    y = mhla_forward(X, V, Q)
    m1 = LinearAttentionRegressor().fit(X, y[:, 0])
    assert m1.predict(X).shape == (40,)
    m2 = LinearAttentionRegressor().fit(X, y)
    assert m2.predict(X).shape == (40, 1)
    assert m1.coef_.shape == (1, n_attention_features(2)) == m2.coef_.shape
    assert m1.value_matrices_.shape[1:] == (1, 2)
    assert m1.key_query_matrices_.shape[1:] == (2, 2)
    assert m1.n_heads_ == m1.value_matrices_.shape[0] == m1.key_query_matrices_.shape[0]


def test_list_of_sequences_equals_padded_array():
    rng = np.random.default_rng(1)
    V, Q = _generator(rng, 3)
    X, lengths = _padded(rng, 60, 7, 3)
    y = _targets(X, lengths, V, Q)[:, 0]
    seqs = [X[i, : lengths[i]] for i in range(len(X))]
    a = LinearAttentionRegressor().fit(X, y)
    b = LinearAttentionRegressor().fit(seqs, y)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.predict(seqs), b.predict(X), rtol=1e-10)


@pytest.mark.parametrize("solver", ["eigh", "svd"])
def test_readout_all_recovery(solver):
    rng = np.random.default_rng(2)
    d, d_out = 3, 2
    V, Q = _generator(rng, d, d_out, n_heads=2)
    X, lengths = _padded(rng, 12, 10, d, min_len=3)
    y = _targets(X, lengths, V, Q, readout="all")
    assert np.isnan(y[np.arange(10)[None, :] >= lengths[:, None]]).all()
    model = LinearAttentionRegressor(readout="all", solver=solver).fit(X, y)
    X_new, lengths_new = _padded(rng, 5, 30, d, min_len=20, scale=3.0)
    y_new = _targets(X_new, lengths_new, V, Q, readout="all")
    pred = model.predict(X_new)
    real = ~np.isnan(y_new[..., 0])
    assert np.array_equal(~np.isnan(pred[..., 0]), real)
    assert _rel_err(pred[real], y_new[real]) <= 1e-8
    # Univariate targets at every position: y of shape (n_samples, n_tokens).
    m1 = LinearAttentionRegressor(readout="all").fit(X, y[..., 0])
    assert m1.predict(X_new).shape == X_new.shape[:2]


def test_float32_input():
    rng = np.random.default_rng(3)
    V, Q = _generator(rng, 3)
    X = rng.normal(size=(200, 6, 3)).astype(np.float32)
    y = mhla_forward(X.astype(np.float64), V, Q)[:, 0]
    model = LinearAttentionRegressor().fit(X, y)
    X_new = rng.normal(size=(20, 25, 3)).astype(np.float32)
    y_new = mhla_forward(X_new.astype(np.float64), V, Q)[:, 0]
    # The float32 values are exact inputs: the fit is still exact to float64 rounding.
    assert _rel_err(model.predict(X_new), y_new) <= 1e-8


@pytest.mark.parametrize(
    "d, n_heads, d_out", [(4, 1, 1), (5, 2, 1), (6, 3, 1), (6, 1, 1), (4, 3, 2), (3, 2, 2)]
)
def test_compression_recovers_head_count(d, n_heads, d_out):
    rng = np.random.default_rng(10 * d + n_heads)
    V, Q = _generator(rng, d, d_out, n_heads)
    X = rng.normal(size=(2 * n_attention_features(d), 8, d))
    y = mhla_forward(X, V, Q)
    full = LinearAttentionRegressor().fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        small = LinearAttentionRegressor(n_heads=n_heads, random_state=0).fit(X, y)
    assert small.n_heads_ == n_heads
    assert small.value_matrices_.shape == (n_heads, d_out, d)
    assert small.compression_residual_ <= 1e-10
    X_new = 4.0 * rng.normal(size=(30, 40, d))
    y_new = mhla_forward(X_new, V, Q)
    assert _rel_err(full.predict(X_new), y_new) <= 1e-8
    assert _rel_err(small.predict(X_new), y_new) <= 1e-8


def test_compression_warns_when_too_few_heads():
    rng = np.random.default_rng(4)
    V, Q = _generator(rng, 4, 1, n_heads=3)
    X = rng.normal(size=(100, 6, 4))
    y = mhla_forward(X, V, Q)[:, 0]
    with pytest.warns(ConvergenceWarning, match="n_heads=1"):
        model = LinearAttentionRegressor(n_heads=1, random_state=0).fit(X, y)
    assert model.n_heads_ == 1
    assert model.compression_residual_ > 1e-3


def test_compression_warns_only_when_material_at_the_noise_level():
    """Reproducer: every noisy fit warned (one GridSearchCV printed 18 warnings)."""
    rng = np.random.default_rng(40)
    V, Q = _generator(rng, 4, 1, n_heads=2)
    X = rng.normal(size=(600, 6, 4))
    y = mhla_forward(X, V, Q)[:, 0]
    noisy = y + 0.05 * np.abs(y).mean() * rng.normal(size=y.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        search = GridSearchCV(LinearAttentionRegressor(n_heads=2, random_state=0),
                              {"alpha": [0.0, 1e-6, 1e-3]}, cv=3).fit(X, noisy)
        # The generator's head count on noisy data: not material.
        model = LinearAttentionRegressor(n_heads=2, random_state=0).fit(X, noisy)
    assert search.best_estimator_.n_heads_ == 2 and model.compression_residual_ > 1e-10
    # Too few heads on exact data: material, and the message counts heads right.
    with pytest.warns(ConvergenceWarning, match=r"n_heads=1 head raises the training error"):
        LinearAttentionRegressor(n_heads=1, random_state=0).fit(X, y)


def test_n_heads_above_rank_returns_svd_heads():
    rng = np.random.default_rng(5)
    V, Q = _generator(rng, 3, 1, 1)
    X = rng.normal(size=(60, 5, 3))
    y = mhla_forward(X, V, Q)[:, 0]
    model = LinearAttentionRegressor(n_heads=50).fit(X, y)
    # d_out = 1: the SVD of the (d_out d) x d^2 coefficient matrix has at most d heads.
    assert model.n_heads_ <= 3
    assert model.compression_residual_ is None


@pytest.mark.parametrize("readout", ["last", "all"])
def test_predict_matches_coefficients(readout):
    rng = np.random.default_rng(6)
    X, lengths = _padded(rng, 50, 6, 3, min_len=2)
    y = rng.normal(size=(50,)) if readout == "last" else rng.normal(size=(50, 6))
    if readout == "all":
        y[np.arange(6)[None, :] >= lengths[:, None]] = np.nan
    model = LinearAttentionRegressor(readout=readout).fit(X, y)
    a, b = model.predict(X), model.predict_from_coefficients(X)
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.nanmax(np.abs(b)))


def test_ridge_matches_sklearn_ridge_on_features():
    # alpha is unit-free: Ridge on the features of the standardized tokens with
    # alpha times the mean eigenvalue of their second moment, times N.
    rng = np.random.default_rng(7)
    X = rng.normal(size=(30, 5, 3))  # fewer samples than the 18 features squared
    y = rng.normal(size=(30, 2))
    for solver in ["eigh", "svd"]:
        model = LinearAttentionRegressor(alpha=0.5, solver=solver).fit(X, y)
        st = model.standardization_
        H = st.scale_features(LinearAttentionFeatures().fit_transform(st.transform(X)))
        ridge = 0.5 * np.trace(H.T @ H) / H.shape[1]
        ref = Ridge(alpha=ridge, fit_intercept=False, solver="svd").fit(H, y)
        np.testing.assert_allclose(model.coef_, st.coef_to_user(ref.coef_, targets=False),
                                   rtol=1e-8, atol=1e-10)


def test_minimum_norm_solution_when_rank_deficient():
    # 10 rows < 18 features: the minimum-norm solution for the standardized
    # tokens (model.standardization_), which does not depend on their units.
    rng = np.random.default_rng(8)
    X = rng.normal(size=(10, 4, 3))  # 10 rows < 18 features
    y = rng.normal(size=10)
    A = np.array([[2.0, 0.3, 0.0], [0.0, 0.05, 0.1], [0.0, 0.0, 7.0]])
    X_new = rng.normal(size=(5, 6, 3))
    for solver in ["eigh", "svd"]:
        model = LinearAttentionRegressor(solver=solver).fit(X, y)
        assert model.feature_rank_ == 10
        st = model.standardization_
        Hs = st.scale_features(attention_features(st.transform(X), np.full(10, 4)))
        expected = st.coef_to_user(np.linalg.pinv(Hs) @ y, targets=False)
        np.testing.assert_allclose(model.coef_[0], expected, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(model.predict(X), y, rtol=1e-6, atol=1e-8)
        # Unit-free: the same tokens in other coordinates give the same model.
        mapped = LinearAttentionRegressor(solver=solver).fit(X @ A, y)
        np.testing.assert_allclose(mapped.predict(X_new @ A), model.predict(X_new),
                                   rtol=1e-8, atol=1e-8 * np.abs(model.predict(X_new)).max())


def test_score_all_counts_real_positions_only():
    rng = np.random.default_rng(9)
    X, lengths = _padded(rng, 40, 6, 2, min_len=2)
    y = rng.normal(size=(40, 6))
    real = np.arange(6)[None, :] < lengths[:, None]
    y[~real] = np.nan
    model = LinearAttentionRegressor(readout="all", alpha=1.0).fit(X, y)
    pred = model.predict(X)
    resid = ((y[real] - pred[real]) ** 2).sum()
    total = ((y[real] - y[real].mean()) ** 2).sum()
    assert model.score(X, y) == pytest.approx(1 - resid / total, rel=1e-12)


def test_pipeline_gridsearch_cross_val_clone_pickle():
    rng = np.random.default_rng(11)
    V, Q = _generator(rng, 3)
    X = rng.normal(size=(120, 6, 3))
    y = mhla_forward(X, V, Q)[:, 0] + 0.01 * rng.normal(size=120)

    pipe = make_pipeline(LinearAttentionFeatures(), Ridge(alpha=1e-3, fit_intercept=False))
    assert pipe.fit(X, y).score(X, y) > 0.99

    search = GridSearchCV(
        LinearAttentionRegressor(), {"alpha": [0.0, 1e-2, 1e3]}, cv=KFold(3)
    ).fit(X, y)
    assert search.best_params_["alpha"] in (0.0, 1e-2)
    assert search.best_estimator_.coef_.shape == (1, n_attention_features(3))

    scores = cross_val_score(LinearAttentionRegressor(), X, y, cv=KFold(4))
    assert scores.shape == (4,) and (scores > 0.99).all()

    model = LinearAttentionRegressor(alpha=1e-3).fit(X, y)
    cloned = clone(model)
    assert cloned.get_params() == model.get_params()
    assert not hasattr(cloned, "coef_")
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(X), model.predict(X))


def test_same_function_distinguishes_generators():
    rng = np.random.default_rng(12)
    V, Q = _generator(rng, 3, 1, 2)
    V2, Q2 = V.copy(), Q.copy()
    V2[0, 0, 0] += 1e-3
    assert same_function(V, Q, V, Q)
    assert not same_function(V, Q, V2, Q2)
    # Splitting one head into two halves is the same function.
    assert same_function(V, Q, np.concatenate([V, V]) / 2, np.concatenate([Q, Q]))
    np.testing.assert_allclose(
        attention_coefficients(np.concatenate([V, V]) / 2, np.concatenate([Q, Q])),
        attention_coefficients(V, Q),
    )


def test_feature_names_out_are_readable():
    feats = LinearAttentionFeatures().fit(np.zeros((2, 3, 2)) + 1.0)
    names = feats.get_feature_names_out(["a", "b"])
    assert list(names) == [
        "S[a,a]*last[a]",
        "S[a,a]*last[b]",
        "S[a,b]*last[a]",
        "S[a,b]*last[b]",
        "S[b,b]*last[a]",
        "S[b,b]*last[b]",
    ]
    with pytest.raises(ValueError, match="input_features must name the 2"):
        feats.get_feature_names_out(["a"])


def test_verbose_prints_stages(capsys):
    rng = np.random.default_rng(13)
    X = rng.normal(size=(30, 4, 2))
    LinearAttentionRegressor(verbose=1, n_heads=1).fit(X, rng.normal(size=30))
    out = capsys.readouterr().out
    assert "least squares on 6 features" in out
    assert "compressed" in out


@pytest.mark.parametrize("make", [
    lambda: LinearAttentionRegressor("last", 0.1),
    lambda: LinearAttentionFeatures(None, "channels_first"),
    lambda: AdamLinearAttentionRegressor(2, "all"),
])
def test_parameters_after_the_first_are_keyword_only(make):
    with pytest.raises(TypeError, match="positional"):
        make()
