"""Few heads fitted directly below psi (fit_heads) and the local certificate.

Identification is checked out of distribution: on sequences three times
longer and with tokens twice larger than the training ones.  The derivatives
the certificate uses are checked against finite differences of the loop
references, and the fitted model against the loop forward pass.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from reference import ref_coefficients, ref_forward, ref_lengths, ref_local_ranks
from sklearn_linattn import (
    HeadsFit,
    LocalCertificate,
    certify_heads_locally,
    fit_heads,
    mhla_forward,
)
from sklearn_linattn._features import n_attention_features
from sklearn_linattn._heads._bilinear import BilinearData, _validated
from sklearn_linattn._source import standardizer_of
from sklearn_linattn._heads._local import _coefficient_jacobian

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
        Xv, lv, Y, w = _validated(X, y, readout, None)
        rows = BilinearData(Xv, lv, Y, readout, w, standardizer_of(Xv, lv, Y, w))
        Vs, Qs = rows.to_standard(V, Q)
        ref = ref_forward(X, lengths, V, Q, readout)
        ref = ref if readout == "last" else ref.reshape(-1, 2)
        np.testing.assert_allclose(rows.outputs_to_user(rows.predict(Vs, Qs)), ref,
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
            np.testing.assert_allclose(rows.outputs_to_user(J[:, i].reshape(-1, 2)),
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
    from sklearn_linattn._heads import _bilinear

    rng, V, Q = generator(1, 4, 1)
    X = sequences(rng, 30, 4)
    monkeypatch.setattr(_bilinear, "resolve_budget", lambda budget: 1000.0)
    with pytest.raises(ValueError, match="fit_heads needs about .* GiB for the Jacobians"):
        fit_heads(X, mhla_forward(X, V, Q), 1)
    with pytest.raises(ValueError, match="certify_heads_locally needs about .* GiB"):
        certify_heads_locally(X, V, Q)


def test_regressor_keeps_the_compression_when_a_direct_fit_would_be_too_large(monkeypatch):
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    from sklearn_linattn import LinearAttentionRegressor
    from sklearn_linattn._heads import _selection

    rng, V, Q = generator(1, 6, 1)
    X = sequences(rng, 60, 6)
    y = mhla_forward(X, V, Q)[:, 0]
    monkeypatch.setattr(_selection, "DIRECT_FIT_WORK", 1.0)
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


# --------------------------------------------------------------------------
# The local certificate: the model's symmetries, units, degenerate heads
# --------------------------------------------------------------------------


def _transformed(X, V, Q, *, scale=1.0, units=None, A=None, balance=None, out=1.0):
    """The same function on the same data in other coordinates.

    Tokens ``x -> x A diag(units) scale`` (mixed first, then scaled, so that
    each step rounds only relatively), heads ``V_h M^-T`` and ``M^-1 Q_h M^-T``
    for ``M = A diag(units) scale``, head h rebalanced to ``c_h V_h, Q_h / c_h``,
    and every output times ``out``.
    """
    d = X.shape[2]
    A = np.eye(d) if A is None else A
    units = np.ones(d) if units is None else np.asarray(units)
    c = np.ones(len(V)) if balance is None else np.asarray(balance)
    Minv = np.linalg.inv(A) / (units * scale)[:, None]  # diag(1 / (units scale)) A^-1
    X2 = (X @ A) * (units * scale)
    V2 = out * np.einsum("haj,kj->hak", V, Minv) * c[:, None, None]
    Q2 = np.einsum("jk,hkl,ml->hjm", Minv, Q, Minv) / c[:, None, None]
    return X2, V2, Q2


def _verdict(cert):
    return cert.holds, cert.tangent_rank, cert.data_rank, cert.generic_rank, cert.degenerate_heads


def _local_case(name):
    """Data and heads whose local verdict is clear-cut, with the verdict expected."""
    rng = np.random.default_rng(11)
    if name in ("at_dim", "below_dim", "duplicated_rows"):
        V, Q = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 4, 4))
        X = rng.normal(size=(19, 8, 4))  # tangent dimension 19
        if name == "below_dim":
            X = X[:18]
        elif name == "duplicated_rows":  # 30 equations, only 10 different ones
            X = np.concatenate([X[:10]] * 3)
        return X, V, Q, "last", name == "at_dim"
    if name == "two_heads_all":
        V, Q = rng.normal(size=(2, 2, 3)), rng.normal(size=(2, 3, 3))
        X = rng.normal(size=(3, 6, 3))  # 18 positions x 2 outputs >= 26 - 4
        return X, V, Q, "all", True
    if name == "zero_head":
        V, Q = rng.normal(size=(2, 1, 3)), rng.normal(size=(2, 3, 3))
        V[1] = 0.0
        return rng.normal(size=(40, 6, 3)), V, Q, "last", False
    assert name == "shared_value"  # two heads with one value matrix: a singular point
    V, Q = rng.normal(size=(1, 1, 3)), rng.normal(size=(2, 3, 3))
    return rng.normal(size=(40, 6, 3)), np.concatenate([V, V]), Q, "last", False


LOCAL_CASES = ["at_dim", "below_dim", "duplicated_rows", "two_heads_all", "zero_head",
               "shared_value"]


def test_transformed_heads_compute_the_same_function():
    """The helper of the invariance tests: its heads on its tokens give the same outputs."""
    X, V, Q, _, _ = _local_case("two_heads_all")
    A = np.random.default_rng(0).normal(size=(3, 3))
    X2, V2, Q2 = _transformed(X, V, Q, scale=1e3, units=[1e-2, 1.0, 1e2], A=A,
                              balance=[1e5, 1e-5], out=7.0)
    np.testing.assert_allclose(mhla_forward(X2, V2, Q2, readout="all"),
                               7.0 * mhla_forward(X, V, Q, readout="all"), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", LOCAL_CASES)
def test_local_certificate_matches_the_loop_reference(name):
    """Ranks from finite differences of the loop forward pass and coefficient map."""
    X, V, Q, readout, holds = _local_case(name)
    cert = certify_heads_locally(X, V, Q, readout=readout)
    # Degenerate heads enter the ranks as zero heads (both factors).
    gone = list(cert.degenerate_heads)
    V, Q = V.copy(), Q.copy()
    V[gone], Q[gone] = 0.0, 0.0
    tangent, data, generic = ref_local_ranks(X, ref_lengths(X), V, Q, readout)
    assert (cert.tangent_rank, cert.data_rank, cert.generic_rank) == (tangent, data, generic)
    assert cert.holds is holds and bool(cert) is holds
    assert (cert.reason is None) is holds


@pytest.mark.parametrize("name", LOCAL_CASES)
@given(log_scale=hst.floats(-100, 100), log_units=hst.lists(hst.floats(-20, 20), min_size=4,
                                                            max_size=4),
       mix=hst.integers(0, 2**32 - 1), log_balance=hst.lists(hst.floats(-30, 30), min_size=2,
                                                             max_size=2),
       log_out=hst.floats(-30, 30))
@settings(max_examples=10)
def test_local_certificate_is_invariant(name, log_scale, log_units, mix, log_balance, log_out):
    """Overall scales, units per coordinate, invertible maps and head balances: one verdict.

    (The verdict used to flip once a head's V/Q balance passed about 1e7, or
    after X * 1e4 with V / 1e12.)
    """
    X, V, Q, readout, holds = _local_case(name)
    d, k = X.shape[2], V.shape[0]
    A = np.random.default_rng(mix).normal(size=(d, d))
    X2, V2, Q2 = _transformed(X, V, Q, scale=10.0**log_scale,
                              units=10.0 ** np.array(log_units[:d]), A=A,
                              balance=10.0 ** np.array(log_balance[:k]), out=10.0**log_out)
    # Within these ranges every token and head entry stays a normal float64.
    assert all(np.all(np.isfinite(a)) for a in (X2, V2, Q2))
    base = certify_heads_locally(X, V, Q, readout=readout)
    cert = certify_heads_locally(X2, V2, Q2, readout=readout)
    assert base.holds is holds
    assert _verdict(cert) == _verdict(base)
    if holds:
        assert cert.relative_sigma_min == pytest.approx(base.relative_sigma_min, rel=1e-6)


@pytest.mark.parametrize("balance", [1e-30, 1e-7, 1e7, 1e30])
def test_local_certificate_ignores_the_balance_of_a_head(balance):
    """The reported flip: V * 1e-30, Q * 1e30 is the same function."""
    X, V, Q, _, _ = _local_case("below_dim")
    assert not certify_heads_locally(X, V, Q)
    assert not certify_heads_locally(X, V * balance, Q / balance)
    assert not certify_heads_locally(X * 1e4, V / 1e12, Q)  # the same verdict's other flip
    X, V, Q, _, _ = _local_case("at_dim")
    assert certify_heads_locally(X, V * balance, Q / balance)


def test_degenerate_heads_certify_nothing():
    rng = np.random.default_rng(3)
    V, Q = rng.normal(size=(2, 1, 3)), rng.normal(size=(2, 3, 3))
    X = rng.normal(size=(40, 6, 3))
    assert certify_heads_locally(X, V, Q)  # 40 rows, tangent dimension 2 * 12 - 4 = 20
    # Zero heads, as reported: one sequence, V = Q = 0, "held" with tangent rank 0.
    zero = certify_heads_locally(X[:1], 0 * V[:1], 0 * Q[:1])
    assert not zero and zero.degenerate_heads == (0,) and "degenerate" in zero.reason
    assert "degenerate" in repr(zero)
    for V_bad, Q_bad in [(np.stack([V[0], 0 * V[1]]), Q), (V, np.stack([Q[0], 0 * Q[1]]))]:
        cert = certify_heads_locally(X, V_bad, Q_bad)
        assert not cert and cert.degenerate_heads == (1,)
    # A head whose share of the coefficients is below their rounding (1e-18).
    small = certify_heads_locally(X, np.stack([V[0], 1e-9 * V[1]]), np.stack([Q[0], 1e-9 * Q[1]]))
    assert not small and small.degenerate_heads == (1,)
    # A small head above it (1e-12) is a head like any other.
    assert certify_heads_locally(X, np.stack([V[0], 1e-6 * V[1]]), np.stack([Q[0], 1e-6 * Q[1]]))


def test_singular_points_of_the_parametrization_certify_nothing():
    """Two heads fitted to a one-head function: the tangent rank drops below the generic one.

    k-head functions arbitrarily near then leave the tangent space (a second
    small head in any direction), so the rank test proves nothing; it used to
    hold here.
    """
    rng = np.random.default_rng(0)
    V, Q = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 4, 4))
    X = rng.normal(size=(60, 10, 4))
    fit = fit_heads(X, mhla_forward(X, V, Q), 2, random_state=0)
    assert fit.residual < 1e-10
    cert = fit.certificate
    assert not cert and cert.tangent_rank < cert.generic_rank == 32
    assert cert.data_rank == cert.tangent_rank and "singular point" in cert.reason
    assert _verdict(certify_heads_locally(X, fit.V, fit.Q)) == _verdict(cert)


def test_fit_heads_certificate_is_certify_heads_locally_at_the_fit():
    rng, V, Q = generator(13, 4, 1, d_out=2)
    X = sequences(rng, 20, 4)
    X[:, :, 2] *= 1e3  # a coordinate in its own units
    fit = fit_heads(X, mhla_forward(X, V, Q), 1, random_state=0)
    assert fit.residual < 1e-10 and fit.certificate
    assert _verdict(certify_heads_locally(X, fit.V, fit.Q)) == _verdict(fit.certificate)


def test_all_weights_zero_is_an_error_naming_sample_weight():
    rng, V, Q = generator(14, 3, 1)
    X = sequences(rng, 10, 3)
    for readout in ("last", "all"):
        with pytest.raises(ValueError, match="sample_weight is zero for every one of the 10 "
                                             "sequences: there is nothing to certify"):
            certify_heads_locally(X, V, Q, readout=readout, sample_weight=np.zeros(10))
    with pytest.raises(ValueError, match="sample_weight is zero .* nothing to fit"):
        fit_heads(X, mhla_forward(X, V, Q), 1, sample_weight=np.zeros(10))
    # Zero weights elsewhere still leave the sequences out.
    w = np.ones(10)
    w[3:] = 0.0
    assert certify_heads_locally(X, V, Q, sample_weight=w).n_equations == 3
