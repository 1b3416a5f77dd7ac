"""compare_to_optimum: distances and risks against direct computations, and its errors."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

from sklearn_linattn import (
    AdamLinearAttentionRegressor,
    LinearAttentionRegressor,
    OptimalityReport,
    attention_coefficients,
    compare_to_optimum,
    mhla_forward,
)
from sklearn_linattn.datasets import make_random_mhla


@pytest.fixture(scope="module")
def noisy():
    """Noisy data of a 2-head teacher (d = 3, psi = 18): the optimum has positive risk."""
    X, y, teacher = make_random_mhla(150, 5, 3, n_heads=2, noise=0.3, return_params=True,
                                     random_state=0)
    return X, y, teacher["V"], teacher["Q"]


def _direct_risk(F, y, w=None):
    """(1/W) sum_i w_i (y_i - F_i)**2, sequence by sequence."""
    w = np.ones(len(y)) if w is None else w
    return sum(wi * (yi - fi) ** 2 for wi, yi, fi in zip(w, y, F)) / w.sum()


def test_the_optimum_is_at_distance_zero(noisy):
    X, y, _, _ = noisy
    optimum = LinearAttentionRegressor().fit(X, y)
    report = compare_to_optimum(optimum, X, y)
    assert isinstance(report, OptimalityReport)
    assert report.relative_p_distance < 1e-10
    assert abs(report.excess_risk) < 1e-12 * report.optimal_risk
    assert report.training_distance < 1e-6 * np.sqrt(report.optimal_risk)
    assert report.optimal_risk > 0.01  # the noise
    assert report.identifiable and report.certificate.rank == 18
    np.testing.assert_allclose(report.optimum.coef_, optimum.coef_, rtol=1e-10, atol=1e-12)


def test_excess_risk_of_a_perturbed_model_matches_a_loop(noisy):
    X, y, V, Q = noisy
    V_p = V + 0.05 * np.random.default_rng(1).normal(size=V.shape)
    report = compare_to_optimum((V_p, Q), X, y)
    F = mhla_forward(X, V_p, Q)[:, 0]
    risk = _direct_risk(F, y)
    optimal_risk = _direct_risk(report.optimum.predict(X), y)
    assert report.risk == pytest.approx(risk, rel=1e-10)
    assert report.optimal_risk == pytest.approx(optimal_risk, rel=1e-10)
    assert report.excess_risk == pytest.approx(risk - optimal_risk, rel=1e-8)
    # With alpha=0 the excess risk is the squared distance in the data's metric.
    assert report.training_distance**2 == pytest.approx(report.excess_risk, rel=1e-8)
    p_opt = report.optimum.coef_
    distance = np.linalg.norm(attention_coefficients(V_p, Q) - p_opt)
    assert report.p_distance == pytest.approx(distance, rel=1e-10)
    assert report.relative_p_distance == pytest.approx(distance / np.linalg.norm(p_opt))


def test_reparametrized_heads_are_at_distance_zero(noisy):
    X, y, _, _ = noisy
    optimum = LinearAttentionRegressor().fit(X, y)
    V, Q = optimum.value_matrices_, optimum.key_query_matrices_
    # Each head split into two halves of its key-query matrix.
    halves = (np.concatenate([V, V]), np.concatenate([Q, Q]) / 2)
    # An orthogonal mixing R of the heads: sum_h V'_h (x) Q'_h = sum_k V_k (x) Q_k.
    R, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(len(V), len(V))))
    rotated = (np.einsum("hk,kaj->haj", R, V), np.einsum("hk,kjl->hjl", R, Q))
    for heads in (halves, rotated):
        report = compare_to_optimum(heads, X, y)
        assert report.relative_p_distance < 1e-10
        assert abs(report.excess_risk) < 1e-10 * report.optimal_risk


def test_briefly_trained_adam_is_not_at_the_optimum():
    X, y = make_random_mhla(200, 5, 2, random_state=3)
    adam = AdamLinearAttentionRegressor(max_epochs=3, random_state=0).fit(X, y)
    report = compare_to_optimum(adam, X, y)
    assert report.excess_risk > 1e-6
    assert report.p_distance > 0
    risk = _direct_risk(adam.predict(X), y)
    assert report.risk == pytest.approx(risk, rel=1e-10)
    assert report.excess_risk == pytest.approx(report.risk - report.optimal_risk, rel=1e-8)
    # The data identifies the function: the model's outputs on new inputs are within
    # half the certificate's bound (one model against the exact minimizer).
    Z = np.random.default_rng(4).normal(size=(5, 9, 2))
    gap = np.abs(adam.predict(Z) - report.optimum.predict(Z))
    assert np.all(gap <= report.certificate.error_bound(Z, report.excess_risk) / 2 * (1 + 1e-8))
    assert "must converge to p_opt" in report.verdict


def test_readout_all_with_padding_and_sample_weights():
    X, y, teacher = make_random_mhla(60, 6, 2, readout="all", noise=0.2, d_out=2,
                                     variable_length=True, return_params=True, random_state=5)
    V, Q = teacher["V"], 1.2 * teacher["Q"]
    w = np.random.default_rng(6).uniform(0, 2, size=len(X))
    w[:5] = 0.0  # left out of the fit and of every risk
    report = compare_to_optimum((V, Q), X, y, readout="all", sample_weight=w)
    F, F_opt = mhla_forward(X, V, Q, readout="all"), report.optimum.predict(X)
    total = risk = optimal = 0.0
    for i in range(len(X)):
        for t in range(X.shape[1]):
            if np.isnan(y[i, t]).all():
                continue  # padding
            total += w[i]
            risk += w[i] * np.sum((y[i, t] - F[i, t]) ** 2)
            optimal += w[i] * np.sum((y[i, t] - F_opt[i, t]) ** 2)
    assert report.risk == pytest.approx(risk / total, rel=1e-10)
    assert report.optimal_risk == pytest.approx(optimal / total, rel=1e-10)
    assert report.excess_risk == pytest.approx((risk - optimal) / total, rel=1e-8)
    assert report.certificate.n_samples == 55
    assert report.certificate.readout == "all"
    # An estimator's readout is used when none is given.
    fitted = LinearAttentionRegressor(readout="all").fit(X, y, sample_weight=w)
    again = compare_to_optimum(fitted, X, y, sample_weight=w)
    assert again.relative_p_distance < 1e-10


def test_channels_first_estimator():
    X, y = make_random_mhla(80, 5, 2, readout="all", d_out=2, random_state=7)
    Xf, yf = X.transpose(0, 2, 1), y.transpose(0, 2, 1)
    adam = AdamLinearAttentionRegressor(readout="all", data_format="channels_first",
                                        max_epochs=2, random_state=0).fit(Xf, yf)
    report = compare_to_optimum(adam, Xf, yf)
    risk = np.mean(np.sum((adam.predict(Xf) - yf) ** 2, axis=1))
    assert report.risk == pytest.approx(risk, rel=1e-10)
    assert report.optimum.data_format == "channels_first"


def test_ridge_optimum_and_reports():
    X, y, teacher = make_random_mhla(100, 5, 2, noise=0.1, return_params=True,
                                     random_state=8)
    heads = (teacher["V"], teacher["Q"])
    report = compare_to_optimum(heads, X, y, alpha=10.0)
    assert report.alpha == 10.0 and report.optimum.alpha == 10.0
    exact = compare_to_optimum(heads, X, y)
    assert report.optimal_risk > exact.optimal_risk  # ridge gives up training fit
    assert "alpha = 10" in report.verdict
    text = exact.summary()
    assert "IDENTIFIABLE" in text and f"{exact.p_distance:<10.4g}" in text
    assert all(len(line) <= 88 for line in text.splitlines())
    assert repr(exact).startswith("OptimalityReport(p_distance=")


def test_unidentified_data_says_where_the_minimizers_agree():
    X, y, teacher = make_random_mhla(4, 5, 2, return_params=True, random_state=9)
    report = compare_to_optimum((teacher["V"], teacher["Q"]), X, y)
    # The teacher fits exactly: another minimizer, away from the minimum-norm one.
    assert not report.identifiable
    assert abs(report.excess_risk) < 1e-20 and report.p_distance > 0.1
    assert "covers" in report.verdict and "witness" in report.verdict
    assert "NOT IDENTIFIABLE" in report.summary()


def test_extra_terms_of_the_compared_model(noisy):
    X, y, V, Q = noisy
    d_out, d = V.shape[1:]
    fitted = LinearAttentionRegressor(fit_intercept=True, fit_skip=True).fit(X, y)
    V_f, Q_f = fitted.value_matrices_, fitted.key_query_matrices_
    report = compare_to_optimum((V_f, Q_f), X, y, intercept=fitted.intercept_,
                                skip_coef=fitted.skip_coef_)
    assert report.relative_p_distance < 1e-8
    assert report.optimum.fit_intercept and report.optimum.fit_skip
    # A shifted intercept: p-distance the shift, and, the optimum's residual being
    # orthogonal to the constant column, excess risk its square.
    shifted = compare_to_optimum((V_f, Q_f), X, y, intercept=fitted.intercept_ + 0.5,
                                 skip_coef=fitted.skip_coef_)
    assert shifted.p_distance == pytest.approx(0.5, rel=1e-8)
    assert shifted.excess_risk == pytest.approx(0.25, rel=1e-8)
    # An estimator fitted with the terms is compared in its own class.
    assert compare_to_optimum(fitted, X, y).relative_p_distance < 1e-8
    with pytest.raises(ValueError, match=r"skip_coef must have shape \(1, 3\).*\(3,\)"):
        compare_to_optimum((V, Q), X, y, skip_coef=np.zeros(d))
    with pytest.raises(ValueError, match=r"intercept must have shape \(1,\).*\(2,\)"):
        compare_to_optimum((V, Q), X, y, intercept=np.zeros(2))


def test_validation_errors(noisy):
    X, y, V, Q = noisy
    with pytest.raises(TypeError, match="model must be a fitted estimator.*got list"):
        compare_to_optimum([V, Q], X, y)
    with pytest.raises(NotFittedError):
        compare_to_optimum(AdamLinearAttentionRegressor(), X, y)
    fitted = LinearAttentionRegressor().fit(X, y)
    with pytest.raises(ValueError, match="readout must be the model's own, 'last'.*'all'"):
        compare_to_optimum(fitted, X, y, readout="all")
    with pytest.raises(TypeError, match="intercept and skip_coef.*LinearAttentionRegressor"):
        compare_to_optimum(fitted, X, y, intercept=np.zeros(1))
    with pytest.raises(ValueError, match="readout must be one of"):
        compare_to_optimum((V, Q), X, y, readout="first")
    with pytest.raises(ValueError, match="heads act on tokens"):
        compare_to_optimum((V[:, :, :2], Q[:, :2, :2]), X, y)
    with pytest.raises(ValueError, match="y has 2 output.*d_out = 1"):
        compare_to_optimum((V, Q), X, np.c_[y, y])
    with pytest.raises(ValueError, match="alpha"):
        compare_to_optimum((V, Q), X, y, alpha=-1.0)
    with pytest.raises(ValueError, match="sample_weight must have shape"):
        compare_to_optimum((V, Q), X, y, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="V must have shape"):
        compare_to_optimum((V[0], Q), X, y)


# --------------------------------------------------------------------------
# Every representable scale
# --------------------------------------------------------------------------

FIELDS = ["p_distance", "relative_p_distance", "training_distance", "risk", "optimal_risk",
          "excess_risk"]


def _scaled_powers(x_scale, y_scale):
    """How each number of the report scales when X -> x_scale X, y -> y_scale y.

    The model follows the data (V -> V y_scale / x_scale**3, so that its
    outputs scale with y): its coefficients, and the optimum's, scale by
    y_scale / x_scale**3 (features are cubic in X), every output and residual
    by y_scale, hence the distances by those factors and the risks (means of
    squares) by y_scale**2; the relative distance does not move.
    """
    p = y_scale / x_scale**3
    return {"p_distance": p, "relative_p_distance": 1.0, "training_distance": y_scale,
            "risk": y_scale**2, "optimal_risk": y_scale**2, "excess_risk": y_scale**2}


@pytest.mark.parametrize("x_scale, y_scale", [
    (1e-100, 1.0), (1e100, 1.0),  # p_distance ~ 1e300 and 1e-300
    (1e-100, 1e-150), (1e100, 1e150),  # risks ~ 1e-301 and 1e299
    (2.0**-332, 2.0**-500), (2.0**332, 2.0**500),  # powers of two: bit for bit
])
def test_report_is_exact_at_every_representable_scale(noisy, x_scale, y_scale):
    """X * 1e-100 used to report training_distance = excess_risk = 0, X * 1e100 inf and NaN."""
    X, y, V, Q = noisy
    heads = (1.1 * V, Q)
    base = compare_to_optimum(heads, X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning on the way
        report = compare_to_optimum((heads[0] * (y_scale / x_scale**3), Q), X * x_scale,
                                    y * y_scale)
    exact = np.log2(x_scale).is_integer() and np.log2(y_scale).is_integer()
    for name, power in _scaled_powers(x_scale, y_scale).items():
        expected = getattr(base, name) * power
        if exact:  # the same computation in the same standardized coordinates
            assert getattr(report, name) == expected, name
        else:
            assert getattr(report, name) == pytest.approx(expected, rel=1e-12), name


@pytest.mark.parametrize("x_scale, y_scale", [(1e-100, 1e-150), (1e100, 1e150)])
def test_report_with_terms_padding_and_weights_at_extreme_scales(x_scale, y_scale):
    X, y, teacher = make_random_mhla(60, 6, 2, readout="all", noise=0.2, d_out=2,
                                     variable_length=True, return_params=True, random_state=5)
    w = np.random.default_rng(6).uniform(0, 2, size=len(X))
    w[:5] = 0.0
    V, Q = teacher["V"], 1.2 * teacher["Q"]
    intercept, skip = np.array([0.3, -0.2]), 0.1 * np.ones((2, 2))
    base = compare_to_optimum((V, Q), X, y, readout="all", sample_weight=w * 1e-200,
                              intercept=intercept, skip_coef=skip)
    # The unscaled report against a loop over the real positions.
    F = mhla_forward(X, V, Q, readout="all")
    F_opt = base.optimum.predict(X)
    total = risk = optimal = 0.0
    for i in range(len(X)):
        for t in range(X.shape[1]):
            if np.isnan(y[i, t]).all():
                continue
            f = F[i, t] + skip @ X[i, t] + intercept
            total += w[i]
            risk += w[i] * np.sum((y[i, t] - f) ** 2)
            optimal += w[i] * np.sum((y[i, t] - F_opt[i, t]) ** 2)
    assert base.risk == pytest.approx(risk / total, rel=1e-10)
    assert base.optimal_risk == pytest.approx(optimal / total, rel=1e-10)
    assert base.excess_risk == pytest.approx((risk - optimal) / total, rel=1e-8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = compare_to_optimum((V * (y_scale / x_scale**3), Q), X * x_scale, y * y_scale,
                                    readout="all", sample_weight=w * 1e200,
                                    intercept=intercept * y_scale,
                                    skip_coef=skip * (y_scale / x_scale))
    powers = _scaled_powers(x_scale, y_scale)
    # The terms' coefficients scale by y_scale and y_scale / x_scale, not as p:
    # the stacked coefficient vector has no single power.
    del powers["p_distance"], powers["relative_p_distance"]
    for name, power in powers.items():
        assert getattr(report, name) == pytest.approx(getattr(base, name) * power,
                                                      rel=1e-10), name


def test_a_model_far_off_the_targets_scale():
    """Outputs 1e150 times the targets: the risk is the model's mean square output."""
    X, y, teacher = make_random_mhla(100, 5, 2, return_params=True, random_state=2)
    V, Q = teacher["V"], teacher["Q"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = compare_to_optimum((V, Q), X, y * 1e-150)
    F = mhla_forward(X, V, Q)[:, 0]
    assert report.risk == pytest.approx(np.mean((y * 1e-150 - F) ** 2), rel=1e-12)
    assert report.training_distance == pytest.approx(np.sqrt(np.mean(F**2)), rel=1e-9)
    assert report.optimal_risk == pytest.approx(1e-300 * _direct_risk(
        LinearAttentionRegressor().fit(X, y).predict(X), y), rel=1e-9)


@pytest.mark.parametrize("x_scale, y_scale, words", [
    (1e-100, 1e-300, r"risk \(about 1e-\d+\), optimal_risk \(about 1e-\d+\) and excess_risk "
                     r"\(about 1e-\d+\) are below the smallest normal float64"),
    (1e100, 1e300, r"risk \(about 1e\d+\), optimal_risk \(about 1e\d+\) and excess_risk "
                   r"\(about 1e\d+\) are above the largest float64"),
])
def test_a_report_float64_cannot_hold_is_an_error(noisy, x_scale, y_scale, words):
    """Risks of y**2 ~ 1e-600 or 1e600: a ValueError that names them, not 0.0, inf or NaN."""
    X, y, V, Q = noisy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="cannot be represented in float64: " + words):
            compare_to_optimum((1.1 * V, Q), X * x_scale, y * y_scale)
