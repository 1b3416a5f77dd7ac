"""Few heads fitted directly below psi (fit_heads) and the local certificate.

Identification is checked out of distribution: on sequences three times
longer and with tokens twice larger than the training ones.  The derivatives
the certificate uses are checked against finite differences of the loop
references, and the fitted model against the loop forward pass.
"""

import numpy as np
import pytest

from reference import ref_coefficients, ref_forward, ref_lengths
from sklearn_linattn import (
    HeadsFit,
    LocalCertificate,
    certify_heads_locally,
    fit_heads,
    mhla_forward,
)
from sklearn_linattn._features import n_attention_features
from sklearn_linattn._fewheads import _coefficient_jacobian, _training_rows

N_TOKENS = 10


def generator(seed, d, n_heads, d_out=1):
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(n_heads, d_out, d)) / np.sqrt(d)
    Q = rng.normal(size=(n_heads, d, d)) / np.sqrt(d)
    return rng, V, Q


def sequences(rng, n, d, n_tokens=N_TOKENS, scale=1.0):
    return scale * rng.normal(size=(n, n_tokens, d)) / np.sqrt(N_TOKENS)


def ood_error(V, Q, V_fit, Q_fit, readout, seed=123):
    """Relative error on sequences 3x longer with tokens 2x larger."""
    rng = np.random.default_rng(seed)
    X = sequences(rng, 100, V.shape[2], 3 * N_TOKENS, scale=2.0)
    y = mhla_forward(X, V, Q, readout=readout)
    y_fit = mhla_forward(X, V_fit, Q_fit, readout=readout)
    return np.linalg.norm(y_fit - y) / np.linalg.norm(y)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d, n_heads, d_out, n_last, n_all", [
    (4, 1, 1, 30, 3),
    (6, 1, 1, 60, 8),
    (5, 1, 1, 40, 4),
    (6, 2, 1, 110, 12),
    (4, 2, 3, 30, 3),
])
def test_recovers_generator_below_psi_out_of_distribution(readout, d, n_heads, d_out,
                                                          n_last, n_all):
    n = n_last if readout == "last" else n_all
    rows = n if readout == "last" else n * N_TOKENS
    assert rows < n_attention_features(d)  # below psi: the min-norm fit is not the generator
    rng, V, Q = generator(1, d, n_heads, d_out)
    X = sequences(rng, n, d)
    y = mhla_forward(X, V, Q, readout=readout)
    fit = fit_heads(X, y, n_heads, readout=readout, random_state=0)
    assert isinstance(fit, HeadsFit)
    assert fit.V.shape == V.shape and fit.Q.shape == Q.shape
    assert fit.residual < 1e-10
    assert ood_error(V, Q, fit.V, fit.Q, readout) < 1e-8
    assert fit.certificate and isinstance(fit.certificate, LocalCertificate)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_min_norm_then_compress_does_not_recover_below_psi():
    """The contrast: compressing the minimum-norm coefficients misses the generator."""
    from sklearn_linattn import LinearAttentionRegressor
    rng, V, Q = generator(1, 6, 1)
    X = sequences(rng, 60, 6)
    y = mhla_forward(X, V, Q)
    from sklearn_linattn import compress_heads
    min_norm = LinearAttentionRegressor().fit(X, y[:, 0]).coef_
    V_c, Q_c, _ = compress_heads(min_norm, 6, 1, random_state=0, warn=False)
    assert ood_error(V, Q, V_c, Q_c, "last") > 1e-2
    fit = fit_heads(X, y, 1, random_state=0)
    assert ood_error(V, Q, fit.V, fit.Q, "last") < 1e-8
    # The regressor with n_heads=1 takes the direct fit on such data.
    model = LinearAttentionRegressor(n_heads=1, random_state=0).fit(X, y[:, 0])
    assert ood_error(V, Q, model.value_matrices_, model.key_query_matrices_, "last") < 1e-8


def test_fitted_model_matches_loop_forward_pass():
    rng, V, Q = generator(2, 4, 2)
    X = sequences(rng, 12, 4)
    X[3, 7:] = np.nan  # a padded sequence
    y = mhla_forward(X, V, Q, readout="all")
    fit = fit_heads(X, y, 2, readout="all", random_state=0)
    lengths = ref_lengths(X)
    X0 = np.nan_to_num(X)
    for readout in ("last", "all"):
        ref_fit = ref_forward(X0, lengths, fit.V, fit.Q, readout)
        ref_gen = ref_forward(X0, lengths, V, Q, readout)
        np.testing.assert_allclose(mhla_forward(X, fit.V, fit.Q, readout=readout), ref_fit,
                                   rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ref_fit, ref_gen, rtol=1e-8, atol=1e-12)


def test_rows_model_and_jacobians_match_loop_references():
    rng, V, Q = generator(3, 3, 2, d_out=2)
    X = sequences(rng, 5, 3)
    lengths = ref_lengths(X)
    for readout in ("last", "all"):
        y = mhla_forward(X, V, Q, readout=readout)
        rows = _training_rows(X, y, readout, None)
        Vs, Qs = rows.to_standard(V, Q)
        ref = ref_forward(X, lengths, V, Q, readout)
        ref = ref if readout == "last" else ref.reshape(-1, 2)
        np.testing.assert_allclose(np.ldexp(rows.predict(Vs, Qs), rows.target_exp), ref,
                                   rtol=1e-12)
        # The output Jacobian by central differences of the loop forward pass.
        theta = np.concatenate([Vs.ravel(), Qs.ravel()])
        J = rows.jacobian(Vs, Qs)
        h = 1e-6
        for i in range(0, theta.size, 5):
            step = np.zeros_like(theta)
            step[i] = h
            plus, minus = (rows.from_standard(*_split(theta + s, Vs.shape)) for s in (step, -step))
            diff = (ref_forward(X, lengths, *plus, readout)
                    - ref_forward(X, lengths, *minus, readout)).reshape(-1, 2) / (2 * h)
            np.testing.assert_allclose(np.ldexp(J[:, i].reshape(-1, 2), rows.target_exp),
                                       diff, rtol=1e-6, atol=1e-8)
    # The coefficient Jacobian J_p by central differences of ref_coefficients.
    theta = np.concatenate([V.ravel(), Q.ravel()])
    Jp = _coefficient_jacobian(V, Q)
    for i in range(theta.size):
        step = np.zeros_like(theta)
        step[i] = 1e-6
        diff = (ref_coefficients(*_split(theta + step, V.shape))
                - ref_coefficients(*_split(theta - step, V.shape))) / 2e-6
        np.testing.assert_allclose(Jp[:, i], diff.ravel(), atol=1e-8)


def _split(theta, V_shape):
    n_heads, d_out, d = V_shape
    nV = n_heads * d_out * d
    return theta[:nV].reshape(V_shape), theta[nV:].reshape(n_heads, d, d)


@pytest.mark.parametrize("d, n_heads, d_out, symmetries", [
    (4, 1, 1, 1),   # V c, Q / c
    (5, 1, 3, 1),
    (4, 2, 3, 4),   # GL(2) mixing of the heads
    (4, 2, 1, 8),   # and with one output, Q_1 += v_2 t^T, Q_2 -= v_1 t^T
])
def test_certificate_turns_true_at_parameters_minus_symmetries(d, n_heads, d_out, symmetries):
    rng, V, Q = generator(4, d, n_heads, d_out)
    n_params = n_heads * (d_out * d + d * d)
    dim = n_params - symmetries
    n = -(-dim // d_out)  # fewest sequences with n * d_out >= dim
    X = sequences(rng, n, d)
    below = certify_heads_locally(X[:n - 1], V, Q)
    at = certify_heads_locally(X, V, Q)
    assert at.tangent_rank == below.tangent_rank == dim
    assert at.n_parameters == n_params and at.n_symmetries == symmetries
    assert (n - 1) * d_out < dim and not below and below.relative_sigma_min == 0.0
    assert at and at.data_rank == dim and at.relative_sigma_min > 1e-6
    assert at.n_equations == n * d_out
    # Readout "all": one row per position.
    assert certify_heads_locally(X[:1], V, Q, readout="all").n_equations == N_TOKENS * d_out


def test_certificate_is_local_not_global():
    """At exactly as many rows as the tangent dimension another 1-head fit exists.

    The certificate holds at it (nothing else near it fits), yet it is a
    different function: the certificate excludes nearby functions only.
    """
    rng, V, Q = generator(0, 4, 1)
    X = sequences(rng, 19, 4)
    y = mhla_forward(X, V, Q)
    found = []
    for seed in range(3):
        fit = fit_heads(X, y, 1, random_state=seed)
        if fit.residual < 1e-10:
            found.append(ood_error(V, Q, fit.V, fit.Q, "last"))
            assert fit.certificate
    assert found and max(found) > 1e-2


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_scale_invariance(scale):
    rng, V, Q = generator(5, 5, 1, d_out=2)
    X = sequences(rng, 30, 5)
    X[:, :, 1] *= 1e2  # one coordinate on its own scale
    y = mhla_forward(X, V, Q)
    base = fit_heads(X, y, 1, random_state=0)
    Vs, Qs = V * 1e5, Q  # outputs scaled by scale**3 * 1e5
    ys = mhla_forward(scale * X, Vs, Qs)
    fit = fit_heads(scale * X, ys, 1, random_state=0)
    assert fit.residual < 1e-10 and base.residual < 1e-10
    assert fit.certificate.data_rank == base.certificate.data_rank
    # Standardized coordinates use the nearest powers of two: the same up to a
    # factor below 2 per coordinate, so the relative sigma moves a little.
    ratio = fit.certificate.relative_sigma_min / base.certificate.relative_sigma_min
    assert 0.1 < ratio < 10
    X_test = 2 * sequences(rng, 50, 5, 3 * N_TOKENS)
    X_test[:, :, 1] *= 1e2
    y_test = mhla_forward(scale * X_test, Vs, Qs)
    error = np.linalg.norm(mhla_forward(scale * X_test, fit.V, fit.Q) - y_test)
    assert error < 1e-8 * np.linalg.norm(y_test)


def test_sample_weight_ignores_zero_weight_sequences():
    rng, V, Q = generator(6, 4, 1)
    X = sequences(rng, 40, 4)
    y = mhla_forward(X, V, Q)[:, 0]
    y[:5] += 10.0  # corrupted, weighted out
    w = np.ones(40)
    w[:5] = 0.0
    fit = fit_heads(X, y, 1, sample_weight=w, random_state=0)
    assert fit.residual < 1e-10 and ood_error(V, Q, fit.V, fit.Q, "last") < 1e-8
    assert fit.certificate.n_equations == 35


def test_noisy_targets_return_best_fit_without_error():
    rng, V, Q = generator(7, 4, 1)
    X = sequences(rng, 60, 4)
    y = mhla_forward(X, V, Q)
    y_noisy = y + 1e-3 * np.std(y) * rng.normal(size=y.shape)
    fit = fit_heads(X, y_noisy, 1, n_init=3, random_state=0)
    assert 1e-5 < fit.residual < 1e-2
    assert ood_error(V, Q, fit.V, fit.Q, "last") < 1e-1
    assert fit.n_starts == 3
    assert "HeadsFit(n_heads=1" in repr(fit) and "LocalCertificate(holds=" in repr(fit)


def test_certify_false_and_reproducible():
    rng, V, Q = generator(8, 4, 2)
    X = sequences(rng, 60, 4)
    y = mhla_forward(X, V, Q)
    a = fit_heads(X, y, 2, certify=False, random_state=3)
    b = fit_heads(X, y, 2, certify=False, random_state=3)
    assert a.certificate is None
    np.testing.assert_array_equal(a.V, b.V)
    np.testing.assert_array_equal(a.Q, b.Q)


def test_errors_name_the_argument():
    rng, V, Q = generator(9, 3, 1)
    X = sequences(rng, 10, 3)
    y = mhla_forward(X, V, Q)
    with pytest.raises(ValueError, match="n_heads"):
        fit_heads(X, y, 0)
    with pytest.raises(TypeError, match="n_heads"):
        fit_heads(X, y, 1.5)
    with pytest.raises(ValueError, match="n_init"):
        fit_heads(X, y, 1, n_init=0)
    with pytest.raises(ValueError, match="max_iter"):
        fit_heads(X, y, 1, max_iter=0)
    with pytest.raises(ValueError, match="tol"):
        fit_heads(X, y, 1, tol=-1.0)
    with pytest.raises(TypeError, match="certify"):
        fit_heads(X, y, 1, certify="yes")
    with pytest.raises(ValueError, match="readout"):
        fit_heads(X, y, 1, readout="first")
    with pytest.raises(ValueError, match="y"):
        fit_heads(X, y[:5], 1)
    with pytest.raises(ValueError, match="sample_weight"):
        fit_heads(X, y, 1, sample_weight=-np.ones(10))
    with pytest.raises(TypeError, match="random_state"):
        fit_heads(X, y, 1, random_state="a")
    with pytest.raises(ValueError, match="X"):
        certify_heads_locally(X[:, :, :2], V, Q)
    with pytest.raises(ValueError, match="V"):
        certify_heads_locally(X, V[:, :, :2], Q)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_regressor_fits_few_heads_directly_below_psi(readout, tmp_path):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    from sklearn_linattn import LinearAttentionRegressor, load_model, save_model

    rng = np.random.default_rng(21)
    d = 6  # psi = 126
    V, Q = rng.normal(size=(1, 1, d)), rng.normal(size=(1, d, d))
    n = 60 if readout == "last" else 8  # 60 rows, or 80 prefix rows, against psi = 126
    X = rng.normal(size=(n, 10, d))
    y = mhla_forward(X, V, Q, readout=readout)[..., 0]
    X_far = 2.0 * rng.normal(size=(5, 30, d))
    truth = mhla_forward(X_far, V, Q, readout=readout)[..., 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = LinearAttentionRegressor(readout, n_heads=1, random_state=0).fit(X, y)
    assert not model.certificate_ and model.local_certificate_
    np.testing.assert_allclose(model.predict(X_far), truth, atol=1e-8 * np.abs(truth).max())
    # Compressing the minimum-norm solution instead (the previous behaviour) is far off.
    plain = LinearAttentionRegressor(readout).fit(X, y)
    assert np.abs(plain.predict(X_far) - truth).max() > 1e-2 * np.abs(truth).max()
    save_model(model, tmp_path / "m.npz")
    np.testing.assert_array_equal(load_model(tmp_path / "m.npz").predict(X_far),
                                  model.predict(X_far))
    # Identifiable data keep the compression path.
    X_many = rng.normal(size=(300, 5, d))
    y_many = mhla_forward(X_many, V, Q, readout=readout)[..., 0]
    full = LinearAttentionRegressor(readout, n_heads=1, random_state=0).fit(X_many, y_many)
    assert full.certificate_ and full.local_certificate_ is None


def test_fit_heads_refuses_jacobians_beyond_the_memory_budget(monkeypatch):
    from sklearn_linattn import _fewheads

    rng, V, Q = generator(1, 4, 1)
    X = sequences(rng, 30, 4)
    monkeypatch.setattr(_fewheads, "resolve_budget", lambda budget: 1000.0)
    with pytest.raises(ValueError, match="fit_heads needs about .* GiB for the Jacobians"):
        fit_heads(X, mhla_forward(X, V, Q), 1)
    with pytest.raises(ValueError, match="certify_heads_locally needs about .* GiB"):
        certify_heads_locally(X, V, Q)


def test_regressor_keeps_the_compression_when_a_direct_fit_would_be_too_large(monkeypatch):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    from sklearn_linattn import LinearAttentionRegressor, _estimators

    rng, V, Q = generator(1, 6, 1)
    X = sequences(rng, 60, 6)
    y = mhla_forward(X, V, Q)[:, 0]
    monkeypatch.setattr(_estimators, "_DIRECT_FIT_WORK", 1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = LinearAttentionRegressor(n_heads=1, random_state=0).fit(X, y)
    assert model.local_certificate_ is None
    assert any(issubclass(w.category, ConvergenceWarning) for w in caught)


def test_fit_heads_says_when_the_iteration_cap_stopped_it():
    from sklearn.exceptions import ConvergenceWarning

    rng, V, Q = generator(1, 4, 1)
    X = sequences(rng, 30, 4)
    with pytest.warns(ConvergenceWarning, match="stopped at max_iter=1"):
        fit = fit_heads(X, mhla_forward(X, V, Q), 1, n_init=1, max_iter=1, random_state=0)
    assert fit.n_iter == 1
