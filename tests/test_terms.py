"""Intercept and skip terms (``fit_intercept``, ``fit_skip``) against a loop reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_linattn import (
    LinearAttentionFeatures,
    LinearAttentionRegressor,
    certify_identifiability,
    load_model,
    mhla_forward,
    mhla_generate,
    save_model,
)
from reference import ref_features

SOLVERS = ["eigh", "cholesky", "svd", "dual", "cg", "lsmr"]


def _term_rows(X, readout, intercept, skip):
    """Rows [1, x_row] and the row features, one row per sequence or per prefix (loops)."""
    rows, feats = [], []
    for Z in X:
        ends = [len(Z)] if readout == "last" else range(1, len(Z) + 1)
        for t in ends:
            e = ([1.0] if intercept else []) + (list(Z[t - 1]) if skip else [])
            rows.append(e)
            feats.append(ref_features(Z[None, :t], [t])[0])
    return np.array(rows, dtype=float).reshape(len(rows), -1), np.array(feats)


def _targets(y, readout):
    y = np.asarray(y, dtype=float)
    return y.reshape(-1, y.shape[-1]) if readout == "all" else y


def _teacher(rng, d, d_out):
    V, Q = rng.normal(size=(1, d_out, d)), rng.normal(size=(1, d, d))
    b, W = rng.normal(size=d_out), rng.normal(size=(d_out, d))
    return V, Q, b, W


def _apply(X, teacher, readout, intercept=True, skip=True):
    V, Q, b, W = teacher
    out = mhla_forward(X, V, Q, readout=readout)
    x = X[:, -1] if readout == "last" else X
    return out + (b if intercept else 0.0) + (x @ W.T if skip else 0.0)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("intercept,skip", [(True, False), (False, True), (True, True)])
def test_matches_joint_least_squares_loop_reference(readout, intercept, skip):
    rng = np.random.default_rng(1)
    d, d_out = 2, 2
    X = rng.normal(size=(40, 4, d))
    y = rng.normal(size=(40, 4, d_out) if readout == "all" else (40, d_out))  # not realizable
    w = rng.uniform(0.5, 2.0, size=40)
    E, H = _term_rows(X, readout, intercept, skip)
    rw = np.repeat(w, 4) if readout == "all" else w
    A = np.hstack([E, H]) * np.sqrt(rw)[:, None]
    theta = np.linalg.lstsq(A, _targets(y, readout) * np.sqrt(rw)[:, None], rcond=None)[0]
    n_terms = E.shape[1]
    for solver in SOLVERS:
        model = LinearAttentionRegressor(
            readout, solver=solver, fit_intercept=intercept, fit_skip=skip, tol=1e-12,
        ).fit(X, y, sample_weight=w)
        atol = 1e-6 if solver == "cg" else 1e-9
        np.testing.assert_allclose(model.coef_, theta[n_terms:].T, atol=atol, err_msg=solver)
        got_b = model.intercept_ if intercept else np.zeros(0)
        np.testing.assert_allclose(got_b, theta[0] if intercept else got_b, atol=atol)
        if skip:
            np.testing.assert_allclose(model.skip_coef_, theta[int(intercept):n_terms].T,
                                       atol=atol, err_msg=solver)
        else:
            assert not model.skip_coef_.any()
        if not intercept:
            assert not model.intercept_.any()
        assert model.certificate_.n_features == H.shape[1] + n_terms
        assert model.certificate_


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("solver", ["eigh", "cholesky", "svd", "cg"])
def test_recovers_generator_out_of_distribution(readout, solver):
    rng = np.random.default_rng(2)
    d = 3
    teacher = _teacher(rng, d, 2)
    X = rng.normal(size=(120, 5, d))
    model = LinearAttentionRegressor(readout, solver=solver, fit_intercept=True, fit_skip=True,
                                     n_heads=1, random_state=0).fit(X, _apply(X, teacher, readout))
    assert model.certificate_
    X_far = 4.0 * rng.normal(size=(6, 40, d))  # longer and larger than any training input
    truth = _apply(X_far, teacher, readout)
    rtol = 1e-6 if solver == "cg" else 1e-9
    np.testing.assert_allclose(model.predict(X_far), truth, rtol=rtol, atol=rtol * np.abs(truth).max())
    np.testing.assert_allclose(model.predict_from_coefficients(X_far), truth,
                               atol=rtol * np.abs(truth).max())
    np.testing.assert_allclose(model.intercept_, teacher[2], atol=1e-6)
    np.testing.assert_allclose(model.skip_coef_, teacher[3], atol=1e-6)
    assert model.certificate_.covers(X_far).all()


@pytest.mark.parametrize("scale", [1e-80, 1e-3, 1e60])
def test_units_do_not_change_the_fit(scale):
    rng = np.random.default_rng(3)
    d = 2
    teacher = _teacher(rng, d, 1)
    X = rng.normal(size=(60, 4, d))
    units = np.array([scale, 1.0 / np.sqrt(scale)])
    y = _apply(X, teacher, "last")[:, 0]
    base = LinearAttentionRegressor(fit_intercept=True, fit_skip=True).fit(X, y)
    # Tokens in other units and targets in other units: the same function.
    model = LinearAttentionRegressor(fit_intercept=True, fit_skip=True).fit(X * units, y * scale)
    X_new = rng.normal(size=(5, 9, d))
    np.testing.assert_allclose(model.predict(X_new * units), base.predict(X_new) * scale,
                               rtol=1e-8)
    np.testing.assert_allclose(model.intercept_, base.intercept_ * scale, rtol=1e-8)
    assert bool(model.certificate_) == bool(base.certificate_) is True
    assert model.certificate_.term_min_eigenvalue == pytest.approx(
        base.certificate_.term_min_eigenvalue, rel=1e-6)


def test_skip_confounded_with_attention_fails_the_certificate_with_a_witness():
    # d = 1, tokens +-1, fixed length n: every feature row is H = n * x_last, so
    # the skip term W x_last and attention fit the training data alike.
    rng = np.random.default_rng(4)
    X = rng.choice([-1.0, 1.0], size=(50, 3, 1))
    y = 2.0 * X[:, -1, 0] + 0.5 * (X[:, :, 0] ** 2).sum(axis=1) * X[:, -1, 0]
    model = LinearAttentionRegressor(fit_skip=True).fit(X, y)
    cert = model.certificate_
    assert not cert
    assert cert.rank == 1 and cert.n_features == 2
    assert cert.term_min_eigenvalue < 1e-10
    np.testing.assert_allclose(model.predict(X), y, atol=1e-12)
    # Inputs of the training kind are covered; other lengths and values are not.
    X_same = rng.choice([-1.0, 1.0], size=(4, 3, 1))
    assert cert.covers(X_same).all()
    assert not cert.covers(2.0 * X_same).any()
    assert np.isinf(cert.error_bound(2.0 * X_same, 1e-6)).all()
    w = cert.witness(random_state=0)
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    (ba, Wa), (bb, Wb) = w.terms_a, w.terms_b
    fa = lambda Z: mhla_forward(Z, Va, Qa)[:, 0] + Z[:, -1] @ Wa[0] + ba[0]  # noqa: E731
    fb = lambda Z: mhla_forward(Z, Vb, Qb)[:, 0] + Z[:, -1] @ Wb[0] + bb[0]  # noqa: E731
    np.testing.assert_allclose(fa(X), fb(X), atol=1e-9 * np.abs(fa(X)).max())
    Z = w.input[None]
    assert abs(fa(Z)[0] - fb(Z)[0]) > 1e-3 * max(1.0, abs(fa(Z)[0]))
    assert not cert.covers(Z)[0]


def test_unused_token_coordinate_leaves_its_skip_term_undetermined():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 4, 3))
    X[:, :, 2] = 0.0
    y = X[:, -1, 0] + (X[:, :, 1] ** 2).sum(axis=1) * X[:, -1, 0]
    model = LinearAttentionRegressor(fit_skip=True, fit_intercept=True).fit(X, y)
    assert not model.certificate_
    assert model.certificate_.term_min_eigenvalue == 0.0
    assert not model.skip_coef_[0, 2]


def test_error_bound_bounds_an_epsilon_approximate_model():
    rng = np.random.default_rng(6)
    d = 2
    teacher = _teacher(rng, d, 1)
    X = rng.normal(size=(60, 4, d))
    y = _apply(X, teacher, "last")[:, 0]
    model = LinearAttentionRegressor(fit_intercept=True, fit_skip=True).fit(X, y)
    E, H = _term_rows(X, "last", True, True)
    theta = np.concatenate([model.intercept_, model.skip_coef_[0], model.coef_[0]])
    Z = 3.0 * rng.normal(size=(5, 7, d))
    Ez, Hz = _term_rows(Z, "last", True, True)
    for _ in range(5):
        delta = rng.normal(size=theta.size) * 1e-3
        eps = np.mean((np.hstack([E, H]) @ delta) ** 2)
        diff = np.abs(np.hstack([Ez, Hz]) @ delta)
        bound = model.certificate_.error_bound(Z, eps)
        assert np.all(diff <= bound * (1 + 1e-9))
    # The worst direction attains half the bound (one model at the optimum).
    A = np.hstack([E, H])
    G = A.T @ A / len(A)
    z = np.hstack([Ez, Hz])[0]
    delta = np.linalg.solve(G, z)
    eps = delta @ G @ delta
    assert model.certificate_.error_bound(Z[:1], eps)[0] == pytest.approx(
        2 * abs(z @ delta), rel=1e-6)


def test_partial_fit_with_terms_equals_fit():
    rng = np.random.default_rng(7)
    teacher = _teacher(rng, 2, 1)
    X = rng.normal(size=(90, 4, 2))
    X[60:] *= 100.0  # later batches in other magnitudes: the coordinates are redone
    y = _apply(X, teacher, "all")
    model = LinearAttentionRegressor("all", fit_intercept=True, fit_skip=True)
    for batch in np.array_split(np.arange(90), 3):
        model.partial_fit(X[batch], y[batch])
    whole = LinearAttentionRegressor("all", fit_intercept=True, fit_skip=True).fit(X, y)
    np.testing.assert_allclose(model.intercept_, whole.intercept_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(model.skip_coef_, whole.skip_coef_, rtol=1e-7)
    np.testing.assert_allclose(model.coef_, whole.coef_, rtol=1e-7, atol=1e-12)
    model.set_params(fit_skip=False)
    with pytest.raises(ValueError, match="fit_intercept and fit_skip must stay"):
        model.partial_fit(X[:5], y[:5])


def test_terms_parameters_are_checked():
    X = np.random.default_rng(8).normal(size=(30, 4, 2))
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + 1.0
    with pytest.raises(TypeError, match="fit_intercept must be True or False"):
        LinearAttentionRegressor(fit_intercept="yes").fit(X, y)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_dask_input_with_terms_equals_the_in_memory_fit(readout):
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(9)
    teacher = _teacher(rng, 2, 1)
    X = rng.normal(size=(90, 4, 2))
    y = _apply(X, teacher, readout)
    whole = LinearAttentionRegressor(readout, fit_intercept=True, fit_skip=True).fit(X, y)
    lazy = LinearAttentionRegressor(readout, fit_intercept=True, fit_skip=True).fit(
        da.from_array(X, chunks=25), da.from_array(y, chunks=25))
    np.testing.assert_allclose(lazy.intercept_, whole.intercept_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(lazy.skip_coef_, whole.skip_coef_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(lazy.coef_, whole.coef_, rtol=1e-9, atol=1e-12)
    assert lazy.certificate_ and lazy.certificate_.n_features == whole.certificate_.n_features
    # partial_fit on dask blocks continues the same statistics.
    model = LinearAttentionRegressor(readout, fit_intercept=True, fit_skip=True)
    model.partial_fit(da.from_array(X[:45], chunks=20), y[:45])
    model.partial_fit(X[45:], y[45:])
    np.testing.assert_allclose(model.coef_, whole.coef_, rtol=1e-7, atol=1e-10)


def test_model_file_round_trip_keeps_the_terms(tmp_path):
    rng = np.random.default_rng(10)
    teacher = _teacher(rng, 2, 2)
    X = rng.normal(size=(60, 4, 2))
    model = LinearAttentionRegressor(fit_intercept=True, fit_skip=True).fit(
        X, _apply(X, teacher, "last"))
    save_model(model, tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    X_new = rng.normal(size=(4, 8, 2))
    np.testing.assert_array_equal(loaded.predict(X_new), model.predict(X_new))
    np.testing.assert_array_equal(loaded.intercept_, model.intercept_)


def test_features_transformer_names_and_columns_of_the_terms():
    X = np.random.default_rng(11).normal(size=(5, 3, 2))
    feats = LinearAttentionFeatures(include_bias=True, include_skip=True).fit(X)
    names = feats.get_feature_names_out(["a", "b"])
    assert list(names[:3]) == ["1", "last[a]", "last[b]"]
    out = feats.transform(X)
    assert out.shape == (5, 3 + 6) == (5, feats.n_features_out_)
    np.testing.assert_array_equal(out[:, 0], 1.0)
    np.testing.assert_array_equal(out[:, 1:3], X[:, -1])
    np.testing.assert_allclose(out[:, 3:], LinearAttentionFeatures().fit(X).transform(X))


@pytest.mark.parametrize("solver", ["eigh", "svd", "cg"])
def test_certify_identifiability_of_the_class_with_terms(solver):
    rng = np.random.default_rng(12)
    X = rng.normal(size=(60, 4, 2))
    for intercept, skip in [(True, False), (False, True), (True, True)]:
        cert = certify_identifiability(X, fit_intercept=intercept, fit_skip=skip, solver=solver)
        model = LinearAttentionRegressor(fit_intercept=intercept, fit_skip=skip,
                                         solver=solver).fit(X, rng.normal(size=60))
        assert bool(cert) is bool(model.certificate_) is True
        assert cert.n_features == model.certificate_.n_features
        assert cert.term_min_eigenvalue == pytest.approx(
            model.certificate_.term_min_eigenvalue, rel=1e-6)
    # Tokens of +-1 at a fixed length: the skip term is attention's H = n x_last.
    X = rng.choice([-1.0, 1.0], size=(50, 3, 1))
    cert = certify_identifiability(X, fit_skip=True, solver=solver)
    assert not cert and certify_identifiability(X, solver=solver)
    w = cert.witness(random_state=0)
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    (ba, Wa), (bb, Wb) = w.terms_a, w.terms_b
    fa = mhla_forward(X, Va, Qa)[:, 0] + X[:, -1] @ Wa[0] + ba[0]
    fb = mhla_forward(X, Vb, Qb)[:, 0] + X[:, -1] @ Wb[0] + bb[0]
    np.testing.assert_allclose(fa, fb, atol=1e-9 * max(1.0, np.abs(fb).max()))
    with pytest.raises(TypeError, match="fit_skip must be True or False"):
        certify_identifiability(X, fit_skip=1)


@given(
    d=st.integers(1, 3),
    d_out=st.integers(1, 2),
    n_heads=st.integers(1, 2),
    readout=st.sampled_from(["last", "all"]),
    log_scale=st.integers(-100, 100),
    units=st.lists(st.integers(-30, 30), min_size=3, max_size=3),
    dtype=st.sampled_from([np.float64, np.float32]),
    terms=st.sampled_from([(True, False), (False, True), (True, True)]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=25, deadline=None)
def test_property_exact_generators_with_terms_identified_out_of_distribution(
        d, d_out, n_heads, readout, log_scale, units, dtype, terms, seed):
    intercept, skip = terms
    rng = np.random.default_rng(seed)
    V, Q = rng.normal(size=(n_heads, d_out, d)), rng.normal(size=(n_heads, d, d))
    b, W = rng.normal(size=d_out), rng.normal(size=(d_out, d))
    teacher = (V, Q, b, W)
    psi = d * d * (d + 1) // 2
    X = rng.normal(size=(3 * psi + 20, 4, d)).astype(dtype).astype(np.float64)
    y = _apply(X, teacher, readout, intercept, skip)
    # The same data in other units: an overall scale and a unit per coordinate.
    # Powers of two: exact in float32 too, whose range ends near 1e38.
    top = 300 if dtype == np.float64 else 30
    unit = 2.0 ** (np.clip(round(log_scale * 1.6), -top, top) + np.array(units[:d]))
    Xu = (X * unit).astype(dtype)
    y_scale = 10.0 ** (-log_scale)
    model = LinearAttentionRegressor(readout, fit_intercept=intercept, fit_skip=skip).fit(
        Xu, y * y_scale)
    assert model.certificate_
    X_far = 3.0 * rng.normal(size=(4, 11, d))  # longer and larger than any training input
    truth = _apply(X_far, teacher, readout, intercept, skip) * y_scale
    scale = np.abs(truth).max()
    rtol = 1e-4 if dtype == np.float32 else 1e-8
    np.testing.assert_allclose(model.predict(X_far * unit).reshape(truth.shape), truth,
                               atol=rtol * scale)
    assert model.certificate_.covers(X_far * unit).all()
    assert np.isfinite(model.certificate_.error_bound(X_far * unit, 1e-12)).all()


def test_generate_with_terms_matches_a_loop_over_predict():
    rng = np.random.default_rng(13)
    d = 2
    teacher = _teacher(rng, d, d)
    teacher = (teacher[0] * 0.3, teacher[1] * 0.3, teacher[2] * 0.1, teacher[3] * 0.3)
    X = rng.normal(size=(60, 4, d))
    model = LinearAttentionRegressor(fit_intercept=True, fit_skip=True).fit(
        X, _apply(X, teacher, "last"))
    prompts = rng.normal(size=(3, 3, d))
    out = model.generate(prompts, 4)
    seq = prompts
    for _ in range(4):  # the reference: append the teacher's output, step by step
        seq = np.concatenate([seq, _apply(seq, teacher, "last")[:, None]], axis=1)
    np.testing.assert_allclose(out, seq, rtol=1e-8, atol=1e-10)
    with pytest.raises(ValueError, match=r"skip_coef must have shape \(2, 2\)"):
        mhla_generate(prompts, model.value_matrices_, model.key_query_matrices_, 1,
                      skip_coef=np.zeros((2, 3)))


def _null_through_terms(rng, kind, n=120, d=3, n_tokens=4):
    """Sequences whose intercept (or first skip) column is a cubic feature combination.

    Each sequence is rescaled so that ``u . H(X_i)`` equals 1 (intercept) or
    the row token's first coordinate (skip) on every training row, with a
    random u: an exact null direction of the joint design through the term
    columns, while the attention features alone stay generic (identified).
    """
    u = rng.normal(size=d * d * (d + 1) // 2)
    X = rng.normal(size=(3 * n, n_tokens, d))
    p = ref_features(X, np.full(len(X), n_tokens)) @ u
    if kind == "intercept":
        c = np.cbrt(1.0 / p)  # u . H(c X) = c**3 p = 1
    else:
        ratio = X[:, -1, 0] / p  # u . H(c X) = c**3 p = c x_0
        keep = ratio > 0
        X, ratio = X[keep], ratio[keep]
        c = np.sqrt(ratio)
    return (X * c[:, None, None])[:n]


@pytest.mark.parametrize("kind", ["intercept", "skip"])
@pytest.mark.parametrize("scale", [1e-100, 1.0, 1e100])
@pytest.mark.parametrize("solver", SOLVERS)
def test_null_directions_through_the_terms_fail_every_solver(kind, scale, solver):
    """Regression: "cg" certified designs with an exact null direction through the term
    columns (its Schur complement came from coefficients only within tol of the solution),
    while every dense solver said "not identifiable".  Its term certificate now uses a
    lower bound of the Schur complement, so no solver certifies them, at any scale."""
    rng = np.random.default_rng([len(kind), int(np.log10(scale) + 200)])
    X = _null_through_terms(rng, kind) * scale
    attention = certify_identifiability(X, solver=solver)
    assert attention, "the attention features alone are identified"
    kwargs = dict(fit_intercept=kind == "intercept", fit_skip=kind == "skip")
    cert = certify_identifiability(X, solver=solver, **kwargs)
    assert not cert and cert.n_terms == (1 if kind == "intercept" else 3)
    y = rng.normal(size=len(X))
    model = LinearAttentionRegressor(solver=solver, tol=1e-10, **kwargs).fit(X, y)
    assert not model.certificate_


@pytest.mark.parametrize("solver", ["eigh", "svd", "cg"])
def test_terms_at_mixed_units_are_represented(solver):
    """Regression: certify_identifiability(X * [1e80, 1e-80, 1], fit_skip=True) raised "The
    coefficients on the data's own units cannot be represented" (the term columns' internal
    coefficients were mapped to the data's units), while the same X without terms was
    certified.  Nothing is mapped back before the end now: certified, and the fit is right
    out of distribution."""
    rng = np.random.default_rng(11)
    d = 3
    teacher = _teacher(rng, d, 1)
    units = np.array([1e80, 1e-80, 1.0])
    X = rng.normal(size=(80, 4, d))
    assert certify_identifiability(X * units, fit_skip=True, solver=solver)
    assert certify_identifiability(X * units, fit_skip=True, fit_intercept=True, solver=solver)
    kwargs = dict(tol=1e-12) if solver == "cg" else {}
    model = LinearAttentionRegressor(solver=solver, fit_intercept=True, fit_skip=True,
                                     **kwargs).fit(X * units, _apply(X, teacher, "last"))
    X_far = 3.0 * rng.normal(size=(5, 20, d))
    truth = _apply(X_far, teacher, "last")
    np.testing.assert_allclose(model.predict(X_far * units), truth,
                               atol=1e-6 * np.abs(truth).max())
