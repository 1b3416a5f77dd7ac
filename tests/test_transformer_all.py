"""LinearAttentionFeatures(readout="all"): one row per real position, the regressor's rows."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline

from reference import ref_features, ref_prefix_features
from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor, mhla_forward


def _padded(rng, n_samples, n_tokens, d, min_length=1):
    X = rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(min_length, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, lengths


def test_rows_are_the_prefix_features_of_the_real_positions_in_order():
    rng = np.random.default_rng(0)
    X, lengths = _padded(rng, 9, 5, 2)
    real = np.arange(5)[None, :] < lengths[:, None]
    H = LinearAttentionFeatures(readout="all").fit(X).transform(X)
    expected = ref_prefix_features(X, lengths)[real]  # sample-major, padding skipped
    assert H.shape == (lengths.sum(), 6)
    np.testing.assert_allclose(H, expected, rtol=1e-12, atol=1e-12)
    # The last row of each sequence is its "last" feature row.
    ends = np.cumsum(lengths) - 1
    np.testing.assert_allclose(H[ends], ref_features(X, lengths), rtol=1e-12, atol=1e-12)
    # A list of unpadded sequences gives the same rows.
    seqs = [X[i, : lengths[i]] for i in range(9)]
    np.testing.assert_allclose(LinearAttentionFeatures(readout="all").fit(seqs).transform(seqs),
                               H, rtol=1e-12, atol=1e-12)


def test_terms_per_position():
    rng = np.random.default_rng(1)
    X, lengths = _padded(rng, 6, 4, 3, min_length=2)
    real = np.arange(4)[None, :] < lengths[:, None]
    feats = LinearAttentionFeatures(readout="all", include_bias=True, include_skip=True)
    H = feats.fit(X).transform(X)
    assert H.shape == (lengths.sum(), feats.n_features_out_) == (lengths.sum(), 1 + 3 + 18)
    np.testing.assert_array_equal(H[:, 0], 1.0)
    np.testing.assert_array_equal(H[:, 1:4], X[real])  # the token at the row's position
    np.testing.assert_allclose(H[:, 4:], ref_prefix_features(X, lengths)[real], rtol=1e-12,
                               atol=1e-12)
    assert len(feats.get_feature_names_out()) == H.shape[1]


def test_pipeline_on_per_position_targets_is_the_regressor():
    # A plain least squares on the rows, with the targets of the real
    # positions in the same order, is LinearAttentionRegressor(readout="all").
    rng = np.random.default_rng(2)
    V, Q = rng.normal(size=(2, 2, 2)), rng.normal(size=(2, 2, 2))
    X, _ = _padded(rng, 30, 6, 2, min_length=3)
    y = mhla_forward(X, V, Q, readout="all") + 0.1 * rng.normal(size=(30, 6, 2))
    real = ~np.isnan(X).all(axis=2)
    y[~real] = np.nan
    pipe = make_pipeline(LinearAttentionFeatures(readout="all"),
                         LinearRegression(fit_intercept=False)).fit(X, y[real])
    model = LinearAttentionRegressor(readout="all").fit(X, y)
    X_new, _ = _padded(rng, 5, 8, 2, min_length=2)
    real_new = ~np.isnan(X_new).all(axis=2)
    np.testing.assert_allclose(pipe.predict(X_new), model.predict(X_new)[real_new],
                               rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(pipe[-1].coef_, model.coef_, rtol=1e-8, atol=1e-10)


def test_last_is_unchanged_and_readout_is_checked():
    rng = np.random.default_rng(3)
    X, lengths = _padded(rng, 7, 4, 2)
    np.testing.assert_allclose(LinearAttentionFeatures().fit(X).transform(X),
                               ref_features(X, lengths), rtol=1e-12, atol=1e-12)
    assert clone(LinearAttentionFeatures(readout="all")).get_params()["readout"] == "all"
    with pytest.raises(ValueError, match="readout"):
        LinearAttentionFeatures(readout="first").fit(X)
    fitted = LinearAttentionFeatures().fit(X)
    fitted.set_params(readout="every")
    with pytest.raises(ValueError, match="readout"):
        fitted.transform(X)
