"""Every solver against the loop reference fit: coefficients, spectrum, certificate.

The reference is least squares on the features of tests/reference.py (plain
Python loops): ``numpy.linalg.lstsq`` (minimum norm) for ``alpha = 0`` and, for
``alpha > 0``, the ridge normal equations of the features of the standardized
tokens with the unit-free penalty ``alpha * trace(G) / psi``, with weights
applied as ``sqrt(w)`` row scaling.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Ridge
from threadpoolctl import threadpool_limits

from reference import ref_features, ref_prefix_features
from sklearn_linattn import (
    LinearAttentionRegressor,
    attention_coefficients,
    certify_identifiability,
    mhla_forward,
)
from sklearn_linattn._features import features_matvec, features_rmatvec, row_factors
from sklearn_linattn._memory import default_memory_budget
from sklearn_linattn._source import standardizer_of
from sklearn_linattn._moments import ImplicitGram, RowReader
from sklearn_linattn._solvers import (
    SOLVERS,
    SufficientStatistics,
    choose_solver,
    solve_statistics,
)
from solving import solve_arrays
from sklearn_linattn.testing import rank_deficient_datasets, realizable_datasets

DIRECT = ["eigh", "cholesky", "svd", "dual"]
ALL = DIRECT + ["cg"]
CG = dict(tol=1e-13, max_iter=5000)  # cg to rounding, for comparisons with the reference


def _data(rng, n_samples, n_tokens, d, *, readout="last", d_out=1, min_len=2):
    """NaN-padded Gaussian sequences with random targets (shape per readout)."""
    X = rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(min_len, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    if readout == "last":
        y = rng.normal(size=(n_samples, d_out))
    else:
        y = rng.normal(size=(n_samples, n_tokens, d_out))
        y[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, lengths, y


def _reference_rows(X, lengths, y, readout, sample_weight=None):
    """Feature rows, targets and row weights from the loop reference."""
    if readout == "last":
        Phi, Y = ref_features(X, lengths), y
        w = sample_weight
    else:
        real = np.arange(X.shape[1])[None, :] < lengths[:, None]
        Phi, Y = ref_prefix_features(X, lengths)[real], y[real]
        w = None if sample_weight is None else np.broadcast_to(
            sample_weight[:, None], real.shape)[real]
    return Phi, Y, w


def _weighted(Phi, Y, w):
    if w is None:
        return Phi, Y
    keep = w > 0
    Phi, Y, w = Phi[keep], Y[keep], w[keep]
    return Phi * np.sqrt(w)[:, None], Y * np.sqrt(w)[:, None]


def _reference_fit(X, lengths, y, readout, alpha=0.0, sample_weight=None, standardizer=None):
    """Reference coefficients in the data's units and the (unweighted) reference design.

    ``alpha > 0`` needs the fit's ``standardizer``: the unit-free penalty is
    ``alpha * trace(G) / psi`` on the coefficients of the standardized
    features (their symmetric embedding), mapped back to the data's units.
    """
    Phi, Y, w = _reference_rows(X, lengths, y, readout, sample_weight)
    if alpha == 0:
        coef = np.linalg.lstsq(*_weighted(Phi, Y, w), rcond=None)[0]
        return coef.T, Phi
    st = standardizer
    Phi_s, _, _ = _reference_rows(st.transform(X), lengths, y, readout, sample_weight)
    A, B = _weighted(st.scale_features(Phi_s), Y, w)
    G = A.T @ A
    coef_s = np.linalg.solve(G + alpha * np.trace(G) / G.shape[0] * np.eye(G.shape[0]), A.T @ B)
    return st.coef_to_user(coef_s.T, targets=False), Phi


def _fit(solver, X, y, **params):
    kwargs = CG if solver == "cg" else {}
    return LinearAttentionRegressor(solver=solver, **kwargs, **params).fit(X, y)


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def _standardized_minimum_norm(model, X, lengths, y, readout):
    """The documented alpha = 0 solution: minimum norm for the standardized tokens.

    Least squares (numpy's minimum-norm lstsq) on the loop-reference features
    of ``model.standardization_.transform(X)`` in their symmetric embedding,
    mapped back to the data's coordinates.
    """
    st = model.standardization_
    Phi, Y, _ = _reference_rows(st.transform(X), lengths, y, readout)
    Phi = st.scale_features(Phi)  # the symmetric embedding of whitened tokens
    ref_s = np.linalg.lstsq(Phi, Y, rcond=None)[0].T
    return st.coef_to_user(ref_s, targets=False)


# --------------------------------------------------------------------------
# Agreement with the reference fit
# --------------------------------------------------------------------------


@pytest.mark.parametrize("solver", ALL)
@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("shape", ["tall", "wide"])
def test_every_solver_matches_the_reference(solver, readout, alpha, shape):
    rng = np.random.default_rng([ALL.index(solver), len(readout), int(alpha * 2),
                                 len(shape)])
    d = 4  # psi = 40
    n_samples = 70 if shape == "tall" else (25 if readout == "last" else 5)
    X, lengths, y = _data(rng, n_samples, 6, d, readout=readout, d_out=2)
    model = _fit(solver, X, y, readout=readout, alpha=alpha)
    ref, Phi = _reference_fit(X, lengths, y, readout, alpha,
                              standardizer=model.standardization_)
    assert model.solver_ == ("eigh" if solver == "cholesky" and shape == "wide" else solver)
    rank = np.linalg.matrix_rank(Phi)
    assert model.feature_rank_ == rank or (model.certificate_.rank_is_bound
                                           and model.feature_rank_ >= rank)
    fitted = Phi @ model.coef_.T
    assert _rel(fitted, Phi @ ref.T) <= 1e-9
    if alpha == 0 and rank < Phi.shape[1]:
        # Not the user-coordinate minimum-norm solution: the difference lies in
        # the null space of the features.
        assert np.linalg.norm(Phi @ (model.coef_ - ref).T) <= 1e-9 * np.linalg.norm(fitted)
        if solver != "cg":
            # The minimum-norm solution of the standardized tokens.
            expected = _standardized_minimum_norm(model, X, lengths, y, readout)
            assert _rel(model.coef_, expected) <= 1e-8
    else:
        assert _rel(model.coef_, ref) <= 1e-8
    # predict goes through the heads: same function.
    pred = model.predict(X)
    expect = model.predict_from_coefficients(X)
    np.testing.assert_allclose(pred, expect, rtol=1e-8, atol=1e-8 * np.nanmax(np.abs(expect)))


@given(
    rank_deficient_datasets(d=st.integers(2, 3), max_samples=30),
    st.sampled_from(["last", "all"]),
    st.sampled_from(DIRECT),
)
@settings(max_examples=15)
def test_rank_deficient_minimum_norm(data, readout, solver):
    X, rank, _ = data
    lengths = np.sum(~np.isnan(X[..., 0]), axis=1)
    rng = np.random.default_rng(int(lengths.sum()))
    n_tokens = X.shape[1]
    y = rng.normal(size=(X.shape[0],)) if readout == "last" else rng.normal(
        size=(X.shape[0], n_tokens))
    if readout == "all":
        y[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    ref, Phi = _reference_fit(X, lengths, y[..., None], readout)
    model = _fit(solver, X, y, readout=readout)
    assert model.feature_rank_ == rank and not model.certificate_
    # The minimum-norm solution of the standardized tokens (the documented
    # choice): it fits the training rows as the user-coordinate one does and
    # differs from it by a null vector of the features.
    expected = _standardized_minimum_norm(model, X, lengths, y[..., None], readout)
    assert _rel(model.coef_, expected) <= 1e-7
    scale = np.linalg.norm(Phi @ ref.T) + 1e-300
    assert np.linalg.norm(Phi @ (model.coef_ - ref).T) <= 1e-7 * scale


@given(
    realizable_datasets(d=st.integers(1, 3), readout=st.sampled_from(["last", "all"]),
                        min_samples=30, max_samples=40, min_length=3,
                        dtype=st.sampled_from([np.float64, np.float32]),
                        scale=st.sampled_from([1e-2, 1.0, 1e2])),
    st.sampled_from(ALL),
)
@settings(max_examples=20)
def test_every_solver_reproduces_realizable_targets(data, solver):
    X, y, V, Q = data
    readout = "last" if y.ndim == 2 else "all"
    model = _fit(solver, X, y, readout=readout)
    pred = model.predict(X)
    real = ~np.isnan(y)
    # Exact data: every minimizer fits it to rounding, identifiable or not.
    assert np.abs(pred[real] - y[real]).max() <= 1e-7 * np.nanmax(np.abs(y)) + 1e-300
    if model.certificate_:
        # Identified: the generator itself, on every input.
        np.testing.assert_allclose(model.coef_, attention_coefficients(V, Q), rtol=1e-6,
                                   atol=1e-6 * np.abs(model.coef_).max())


def test_ridge_with_weights_matches_sklearn_ridge():
    """alpha is unit-free: scikit-learn's Ridge on the standardized features, its
    alpha scaled by the mean eigenvalue of their weighted second moment."""
    rng = np.random.default_rng(1)
    X, lengths, y = _data(rng, 60, 5, 3, d_out=2)
    w = rng.uniform(0, 3, size=60)
    w[:5] = 0.0
    for solver in ALL:
        kwargs = CG if solver == "cg" else {}
        model = LinearAttentionRegressor(solver=solver, alpha=0.7, **kwargs)
        model.fit(X, y, sample_weight=w)
        st = model.standardization_
        H = st.scale_features(ref_features(st.transform(X), lengths))
        mean_eigenvalue = np.trace((H * w[:, None]).T @ H) / w.sum() / H.shape[1]
        expected = Ridge(alpha=0.7 * mean_eigenvalue * w.sum(), fit_intercept=False,
                         solver="svd").fit(H, y, sample_weight=w)
        np.testing.assert_allclose(model.coef_, st.coef_to_user(expected.coef_, targets=False),
                                   rtol=1e-8, atol=1e-10)


# --------------------------------------------------------------------------
# Sample weights: 2 = duplicate, 0 = drop
# --------------------------------------------------------------------------


@pytest.mark.parametrize("solver", ALL)
@pytest.mark.parametrize("readout", ["last", "all"])
def test_weights_duplicate_and_drop(solver, readout):
    rng = np.random.default_rng(2)
    X, lengths, y = _data(rng, 40, 5, 3, readout=readout)
    w = rng.integers(0, 3, size=40).astype(float)
    w[:3] = [0.0, 2.0, 1.0]
    repeat = np.repeat(np.arange(40), w.astype(int))
    kwargs = CG if solver == "cg" else {}
    weighted = LinearAttentionRegressor(solver=solver, readout=readout, **kwargs)
    weighted.fit(X, y, sample_weight=w)
    repeated = _fit(solver, X[repeat], y[repeat], readout=readout)
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, rtol=1e-8, atol=1e-10)
    a, b = weighted.certificate_, repeated.certificate_
    assert bool(a) == bool(b) and a.rank == b.rank
    assert a.min_eigenvalue == pytest.approx(b.min_eigenvalue, rel=1e-6)
    assert a.max_eigenvalue == pytest.approx(b.max_eigenvalue, rel=1e-8)
    assert a.weight_sum == pytest.approx(b.weight_sum) == pytest.approx(b.n_rows)
    # Zero-weight sequences do not count: neither in rows nor in samples.
    kept = w > 0
    assert a.n_samples == int(kept.sum())
    rows = lengths if readout == "all" else np.ones_like(lengths)
    assert a.n_rows == int(rows[kept].sum())
    # The standalone certificate with the same weights is the regressor's.
    standalone = certify_identifiability(X, readout=readout, sample_weight=w, solver=solver)
    assert standalone.min_eigenvalue == pytest.approx(a.min_eigenvalue, rel=1e-6)
    assert standalone.rank == a.rank


def test_zero_weights_on_a_rank_deficient_design_cover_the_kept_inputs():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 5, 3))
    X[:, :, 2] = 0.0  # third coordinate unused: not identifiable
    y = rng.normal(size=30)
    w = np.r_[np.full(10, 0.25), np.full(20, 4.0)]
    model = LinearAttentionRegressor(solver="eigh").fit(X, y, sample_weight=w)
    cert = model.certificate_
    assert not cert and cert.covers(X).all()
    witness = cert.witness(random_state=0)
    (Va, Qa), (Vb, Qb) = witness.model_a, witness.model_b
    fa, fb = mhla_forward(X, Va, Qa), mhla_forward(X, Vb, Qb)
    assert np.max(np.abs(fa - fb)) <= 1e-9 * np.max(np.abs(fa))


@pytest.mark.parametrize("bad, error, match", [
    (np.ones(7), ValueError, r"sample_weight must have shape \(8,\)"),
    (-np.ones(8), ValueError, r"sample_weight must be non-negative; got sample_weight\[0\]"),
    (np.full(8, np.nan), ValueError, "sample_weight must be finite"),
    (np.array(["a"] * 8), TypeError, "sample_weight must hold real numbers"),
    (np.zeros(8), ValueError, "every sequence has zero sample weight"),
])
def test_sample_weight_errors(bad, error, match):
    X = np.random.default_rng(0).normal(size=(8, 3, 2))
    with pytest.raises(error, match=match):
        LinearAttentionRegressor().fit(X, X[:, 0, 0], sample_weight=bad)


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
def test_statistics_equal_the_reference_gram_and_moment(readout):
    rng = np.random.default_rng(4)
    X, lengths, y = _data(rng, 30, 5, 3, readout=readout, d_out=2)
    w = rng.uniform(0, 2, size=30)
    Xz = np.where(np.isnan(X), 0.0, X)
    Yz = np.where(np.isnan(y), 0.0, y)
    stats = SufficientStatistics(3, 2).update(Xz, lengths, Yz, readout=readout,
                                              sample_weight=w)
    Phi, Y, wr = _reference_rows(X, lengths, y, readout, w)
    np.testing.assert_allclose(stats.gram, Phi.T @ (wr[:, None] * Phi), rtol=1e-12,
                               atol=1e-12 * np.abs(Phi).max() ** 2)
    np.testing.assert_allclose(stats.moment, Phi.T @ (wr[:, None] * Y), rtol=1e-12,
                               atol=1e-12 * np.abs(Phi).max() * np.abs(Y).max())
    assert stats.weight_sum == pytest.approx(wr.sum())
    np.testing.assert_allclose(stats.y_sq, (wr[:, None] * Y**2).sum(axis=0), rtol=1e-12)
    # Storing a Gram matrix keeps its distinct entries.
    copy = SufficientStatistics(3, 2)
    copy._set_gram(stats.gram + stats.gram)
    np.testing.assert_allclose(copy.gram, 2 * stats.gram, rtol=1e-15)


def test_factor_products_match_the_reference_rows():
    rng = np.random.default_rng(5)
    X, lengths, _ = _data(rng, 7, 5, 3)
    Xz = np.where(np.isnan(X), 0.0, X)
    for readout in ["last", "all"]:
        S, x, sample = row_factors(Xz, lengths, readout)
        Phi, _, _ = _reference_rows(X, lengths, np.zeros((7, 5, 1)), readout)
        coef = rng.normal(size=(3, Phi.shape[1]))
        R = rng.normal(size=(Phi.shape[0], 3))
        np.testing.assert_allclose(features_matvec(S, x, coef), Phi @ coef.T, rtol=1e-12,
                                   atol=1e-12)
        np.testing.assert_allclose(features_rmatvec(S, x, R), (Phi.T @ R).T, rtol=1e-12,
                                   atol=1e-12)
        assert sample.shape == (Phi.shape[0],)


def test_solve_statistics_equals_solve():
    rng = np.random.default_rng(6)
    X, lengths, y = _data(rng, 200, 6, 5)  # psi = 75: "auto" -> cholesky
    Xz = np.where(np.isnan(X), 0.0, X)
    st = standardizer_of(Xz, lengths, y)  # alpha penalises standardized coefficients
    stats = SufficientStatistics(5, 1, standardizer=st).update(Xz, lengths, y)
    for solver in ["eigh", "cholesky", "auto"]:
        a = solve_statistics(stats, 0.1, solver)
        b = solve_arrays(Xz, lengths, y, alpha=0.1, solver="svd", standardizer=st)
        np.testing.assert_allclose(a.coef, b.coef, rtol=1e-9)
        assert a.method == ("cholesky" if solver != "eigh" else "eigh")


def test_statistics_argument_errors():
    stats = SufficientStatistics(2, 1)
    X = np.zeros((3, 4, 2))
    with pytest.raises(ValueError, match="Y must be given exactly when"):
        stats.update(X, np.full(3, 4))
    with pytest.raises(ValueError, match=r"X must be a zero-padded array of shape "
                                         r"\(n_samples, n_tokens, 2\)"):
        stats.update(np.zeros((3, 4, 3)), np.full(3, 4), np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"Y must have shape \(3, 1\)"):
        stats.update(X, np.full(3, 4), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="lengths must lie between 1 and n_tokens=4"):
        stats.update(X, np.array([1, 5, 2]), np.zeros((3, 1)))
    stats.update(X + 1.0, np.full(3, 4), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="readout must stay 'last'"):
        stats.update(X, np.full(3, 4), np.zeros((3, 4, 1)), readout="all")
    with pytest.raises(ValueError, match="cannot merge statistics of d=3"):
        stats.merge(SufficientStatistics(3, 1))
    with pytest.raises(ValueError, match="readout='all'"):
        stats.merge(SufficientStatistics(2, 1).update(X, np.full(3, 4), np.zeros((3, 4, 1)),
                                                      readout="all"))
    with pytest.raises(TypeError, match="other must be a SufficientStatistics"):
        stats.merge("stats")
    with pytest.raises(ValueError, match=r"needs the sequences themselves"):
        solve_statistics(stats, solver="cg")
    with pytest.raises(ValueError, match="stats hold no feature row"):
        solve_statistics(SufficientStatistics(2, 1))


# --------------------------------------------------------------------------
# "auto" and the certificate of each solver
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n_rows, psi, budget, expected", [
    (20000, 2176, 2**33, "cholesky"),     # tall, Gram of 38 MB fits
    (20000, 40, 2**33, "eigh"),           # tall and tiny: whole spectrum
    (150000, 133120, 2**32, "cg"),        # d = 64: dense would need 142 GB per matrix
    (20000, 2176, 2**26, "cg"),           # 64 MB budget: the dense arrays do not fit
    (100, 2176, 2**33, "dual"),           # wide: the kernel form is the fast one
    (1000, 16896, 2 * 10**8, "dual"),     # wide: kernel and row basis (135 MB) fit
    (3000, 16896, 2 * 10**8, "cg"),       # wide: row basis (405 MB) does not fit
    (30000, 133120, 2**33, "cg"),         # wide, neither fits
])
def test_auto_choice(n_rows, psi, budget, expected):
    assert choose_solver("auto", n_rows, psi, memory_budget=budget) == expected
    assert choose_solver("svd", n_rows, psi, memory_budget=budget) == "svd"


def test_auto_statistics_choice_and_default_budget():
    assert choose_solver("auto", 10, 2176, statistics=True) == "cholesky"
    assert choose_solver("auto", 10, 40, statistics=True) == "eigh"
    budget = default_memory_budget()
    assert isinstance(budget, int) and budget > 0
    assert SOLVERS == ("auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr")


@pytest.mark.parametrize("readout", ["last", "all"])
def test_cholesky_certificate_equals_eigh(readout):
    rng = np.random.default_rng(7)
    X, lengths, y = _data(rng, 120 if readout == "last" else 30, 6, 5, readout=readout)
    chol = LinearAttentionRegressor(readout=readout, solver="cholesky").fit(X, y)
    eigh = LinearAttentionRegressor(readout=readout, solver="eigh").fit(X, y)
    a, b = chol.certificate_, eigh.certificate_
    assert chol.solver_ == "cholesky" and a.method == "cholesky" and a
    assert a.min_eigenvalue == pytest.approx(b.min_eigenvalue, rel=1e-9)
    assert a.max_eigenvalue == pytest.approx(b.max_eigenvalue, rel=1e-9)
    assert (a.rank, a.tol) == (b.rank, pytest.approx(b.tol, rel=1e-9))
    np.testing.assert_allclose(a.eigenvalues, b.eigenvalues, rtol=1e-8,
                               atol=1e-12 * b.max_eigenvalue)  # computed on access
    Z = rng.normal(size=(4, 9, 5))
    np.testing.assert_allclose(a.error_bound(Z, 1e-3), b.error_bound(Z, 1e-3), rtol=1e-8)
    assert a.covers(Z).all()
    with pytest.raises(ValueError, match="no witness exists"):
        a.witness()


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_dense_extreme_eigenvalues_match_eigvalsh(layout):
    """Lanczos on one triangle (symv) and on the Cholesky inverse, in every memory layout."""
    from sklearn_linattn._solvers.normal import _cholesky
    from sklearn_linattn._spectrum import largest_eigenvalue, smallest_eigenvalue_from_cholesky

    rng = np.random.default_rng(17)
    A = rng.normal(size=(400, 150)) * np.logspace(0, 3, 150)  # condition number ~1e6
    G = A.T @ A
    w = np.linalg.eigvalsh(G)
    M = {"C": np.ascontiguousarray(G), "F": np.asfortranarray(G),
         "strided": np.repeat(np.repeat(G, 2, axis=0), 2, axis=1)[::2, ::2]}[layout]
    assert largest_eigenvalue(M) == pytest.approx(w[-1], rel=1e-10)
    assert np.array_equal(M, G)  # not overwritten
    lam_min, error = smallest_eigenvalue_from_cholesky(_cholesky(G.copy()))
    assert lam_min == pytest.approx(w[0], rel=1e-8) and 0 < error <= 1e-9 * lam_min


def test_cholesky_hands_over_to_eigh_on_singular_designs():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(200, 5, 5))
    X[:, :, 4] = X[:, :, 3]  # two equal coordinates: singular Gram matrix
    y = rng.normal(size=200)
    model = LinearAttentionRegressor(solver="cholesky").fit(X, y)
    assert model.solver_ == "eigh" and not model.certificate_
    reference = LinearAttentionRegressor(solver="eigh").fit(X, y)
    np.testing.assert_array_equal(model.coef_, reference.coef_)


def _assert_interval(cg_cert, dense_cert):
    """The cg value is an upper bound within its stated error of the dense one."""
    lam, err = cg_cert.min_eigenvalue, cg_cert.min_eigenvalue_error
    rounding = 10 * dense_cert.tol
    assert lam >= dense_cert.min_eigenvalue - rounding
    assert abs(lam - dense_cert.min_eigenvalue) <= err + rounding
    assert cg_cert.max_eigenvalue == pytest.approx(dense_cert.max_eigenvalue, rel=1e-6)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_cg_certificate_agrees_on_identifiable_data(readout):
    rng = np.random.default_rng(9)
    n = 80 if readout == "last" else 20
    X, lengths, y = _data(rng, n, 6, 4, readout=readout)
    cg = LinearAttentionRegressor(readout=readout, solver="cg", **CG).fit(X, y)
    dense = LinearAttentionRegressor(readout=readout, solver="eigh").fit(X, y)
    a, b = cg.certificate_, dense.certificate_
    assert a and b and a.rank == b.rank == 40 and not a.rank_is_bound
    _assert_interval(a, b)
    # An interval [lower, upper] around lambda_min, decided: lower > tol.
    assert a.min_eigenvalue - a.min_eigenvalue_error > a.tol
    assert a.eigenvalues is None and a.method == "cg"
    Z = rng.normal(size=(3, 7, 4))
    assert a.covers(Z).all()
    # Without the inverse of Lambda_D, the bound is the coarser Lemma A.7 form.
    coarse, exact = a.error_bound(Z, 1e-4), b.error_bound(Z, 1e-4)
    assert np.all(coarse >= exact * (1 - 1e-6))
    # ||H(Z)||^2 / lambda_min in the certificate's standardized coordinates,
    # lambda_min lowered by its error bound and the rounding level tol.
    Zs = a.standardization.transform(Z)
    H = a.standardization.scale_features(ref_features(Zs, [7, 7, 7])) if readout == "last" \
        else None
    if H is not None:
        lower = a.min_eigenvalue - a.min_eigenvalue_error - a.tol
        expected = 2 * np.sqrt(1e-4 * (H**2).sum(axis=1) / lower)
        np.testing.assert_allclose(coarse, expected, rtol=1e-10)
    assert "+/-" in a.summary()


@given(
    rank_deficient_datasets(d=4, subspace_dim=st.integers(1, 3), max_samples=30),
    st.sampled_from(["last", "all"]),
)
@settings(max_examples=6)
def test_cg_certificate_agrees_on_rank_deficient_data(data, readout):
    X, rank, _ = data
    dense = certify_identifiability(X, readout=readout, solver="eigh")
    cg = certify_identifiability(X, readout=readout, solver="cg")
    assert not dense and not cg and dense.rank == rank
    assert cg.rank_is_bound and cg.rank >= rank
    _assert_interval(cg, dense)
    # The witness uses the computed null vector: same training outputs ...
    w = cg.witness(random_state=0)
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    fa = mhla_forward(X, Va, Qa, readout=readout)
    fb = mhla_forward(X, Vb, Qb, readout=readout)
    ga = mhla_forward(w.input[None], Va, Qa, readout=readout)[0]
    gb = mhla_forward(w.input[None], Vb, Qb, readout=readout)[0]
    if readout == "all":
        ga, gb = ga[-1], gb[-1]
    gap = np.linalg.norm(ga - gb)
    assert gap >= 0.99 * np.linalg.norm(ga) and gap > 0
    assert np.nanmax(np.abs(fa - fb)) <= 1e-6 * max(gap, np.nanmax(np.abs(fa)))
    # ... which is also a null vector of the dense certificate.
    assert not dense.covers(w.input[None])[0]
    with pytest.raises(ValueError, match="solver='cg' does not compute"):
        cg.covers(X)
    with pytest.raises(ValueError, match="solver='cg' does not compute"):
        cg.error_bound(X, 1e-3)


def _pencil_setup(X, lengths, readout="last", cache_dtype=np.float64):
    from sklearn_linattn._solvers.cg import _KroneckerPreconditioner

    op = ImplicitGram(RowReader.of_arrays(X, lengths, None, readout), cache_dtype=cache_dtype)
    setup = op.setup()
    precond = _KroneckerPreconditioner(setup["A"], setup["B"], setup["weight_sum"], 0.0,
                                       np.float64)
    G = op.matmat_exact(np.eye(op.psi))
    return op, precond, np.linalg.eigvalsh((G + G.T) / 2)


def test_kronecker_preconditioner_multiply_inverts_apply():
    rng = np.random.default_rng(30)
    X, lengths, _ = _data(rng, 60, 5, 3)
    _, precond, _ = _pencil_setup(X, lengths)
    R = rng.normal(size=(18, 3))
    np.testing.assert_allclose(precond.multiply(precond.apply(R, True)), R, atol=1e-10)
    w = np.linalg.eigvalsh(precond.multiply(np.eye(18)))
    assert precond.min_eigenvalue == pytest.approx(w[0], rel=1e-8)
    assert precond.max_eigenvalue == pytest.approx(w[-1], rel=1e-8)


def test_kronecker_preconditioner_leaves_null_eigenvalues_of_b_computed_above_zero():
    # Regression: a null eigenvalue of B computed a few epsilons above B's own
    # d x d threshold (as LAPACK does on some CPUs for tokens in a subspace)
    # was inverted, 1e12 times the others, and CG diverged on rank-deficient data.
    from sklearn_linattn._solvers.cg import _KroneckerPreconditioner

    rng = np.random.default_rng(31)
    P, d = 6, 4
    Ua = np.linalg.qr(rng.normal(size=(P, P)))[0]
    Ub = np.linalg.qr(rng.normal(size=(d, d)))[0]
    wa = np.array([1e4, 3e3, 2e3, 1.5e3, 1.1e3, 1e3])
    eps = np.finfo(np.float64).eps
    wb = np.array([141.0, 115.0, 107.0, 141.0 * d * eps * 1.2])  # above d eps lambda_max
    A, B = (Ua * wa) @ Ua.T, (Ub * wb) @ Ub.T
    precond = _KroneckerPreconditioner(A, B, 120.0, 0.0, np.float64)
    null = np.kron(Ua, Ub[:, 3:]).T  # rows kron(a_i, b_null)
    assert np.abs(precond.apply(null.T)).max() <= 1e-12
    inside = np.kron(Ua[:, :1], Ub[:, :1])
    np.testing.assert_allclose(precond.multiply(precond.apply(inside)), inside, atol=1e-12)


@given(
    d=st.integers(4, 6),
    excess=st.floats(0.8, 3.0),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    spread=st.sampled_from([1.0, 30.0]),
    cache=st.sampled_from([np.float64, np.float32]),
)
@settings(max_examples=15, deadline=None)
def test_pencil_lanczos_brackets_lambda_min(d, excess, scale, spread, cache):
    # [lower, upper] contains the dense lambda_min, also near N = psi (where
    # lambda_min is small and G badly conditioned) and with coordinates of
    # different scales (where M is far from a multiple of the identity).
    from sklearn_linattn._spectrum import _pencil_lanczos, eigenvalue_tolerance

    psi = d * d * (d + 1) // 2
    rng = np.random.default_rng([31, d, int(excess * 100)])
    n = max(2, int(excess * psi))
    X = rng.normal(size=(n, 6, d)) * scale * np.geomspace(1.0, spread, d)
    op, precond, w = _pencil_setup(X, np.full(n, 6), cache_dtype=cache)
    tol = eigenvalue_tolerance(w[-1], psi)
    out = _pencil_lanczos(op, precond, tol, 4)
    slack = 1e-9 * w[-1]
    assert out["lower"] <= w[0] + slack
    assert w[0] - slack <= out["upper"] <= out["values"][-1] + slack
    v = out["vector"]
    G_v = op.matmat_exact(v[:, None])[:, 0]
    assert float(v @ G_v) == pytest.approx(out["upper"], rel=1e-8, abs=slack)
    if n < psi:  # rank deficient: decided, a null vector
        assert out["upper"] <= tol


def test_pencil_lanczos_finds_null_space_outside_the_fit_range():
    # A zero coordinate makes the token moment B singular: G is singular and
    # its null directions lie where M is floored.  The certificate says so
    # with a null vector.
    rng = np.random.default_rng(32)
    X, lengths, y = _data(rng, 200, 6, 4)
    X[..., 3] = np.where(np.isnan(X[..., 3]), np.nan, 0.0)
    cert = LinearAttentionRegressor(solver="cg", **CG).fit(X, y).certificate_
    dense = certify_identifiability(X, solver="eigh")
    assert not cert and not dense
    assert cert.min_eigenvalue <= cert.tol
    _assert_interval(cert, dense)


@pytest.mark.parametrize("d", [4, 5, 6])
@pytest.mark.parametrize("excess", [-1, 0, 1])
def test_cg_certificate_brackets_lambda_min_near_square_designs(d, excess):
    # N = psi - 1, psi, psi + 1 Gaussian sequences: exactly singular or with a
    # lambda_min isolated far below the rest of the spectrum, which Ritz values
    # of a Krylov space can miss; the randomized lower bound does not.
    psi = d * d * (d + 1) // 2
    for seed in range(4):
        X = np.random.default_rng([34, d, excess + 1, seed]).normal(size=(psi + excess, 6, d))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            cg = certify_identifiability(X, solver="cg")
        dense = certify_identifiability(X, solver="eigh")
        _assert_interval(cg, dense)
        if not dense:
            assert not cg


def test_cg_certificate_falls_back_to_lobpcg_when_lanczos_is_undecided(monkeypatch):
    import sklearn_linattn._spectrum as spectrum_module

    # Too few Lanczos steps to decide: LOBPCG, started from its Ritz vectors, decides.
    monkeypatch.setattr(spectrum_module, "_PENCIL_MAX_ITER", 3)
    rng = np.random.default_rng(33)
    X, lengths, y = _data(rng, 90, 6, 5)  # psi = 75: lambda_min small
    cg = LinearAttentionRegressor(solver="cg", **CG).fit(X, y).certificate_
    dense = LinearAttentionRegressor(solver="eigh").fit(X, y).certificate_
    assert cg and dense
    _assert_interval(cg, dense)
    assert cg.min_eigenvalue_error <= 1e-4 * cg.min_eigenvalue * 1.0001


@pytest.mark.parametrize("d", [3, 5])  # psi = 18 (rows and SYRK) and 75 (pair products)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_statistics_in_blocks_match_the_reference(monkeypatch, d, weighted, padded):
    import sklearn_linattn._solvers._statistics as statistics_module

    # Blocks of a few rows: several blocks per chunk, the last one partial.
    monkeypatch.setattr(statistics_module, "_GRAM_BLOCK_VALUES", 300)
    rng = np.random.default_rng([14, d, weighted, padded])
    X, lengths, y = _data(rng, 23, 5, d, readout="all", d_out=2, min_len=2 if padded else 5)
    w = rng.uniform(0.0, 2.0, size=23) if weighted else None
    stats = SufficientStatistics(d, 2).update(X, lengths, y, readout="all", sample_weight=w)
    Phi, Y, wr = _reference_rows(X, lengths, y, "all", w)
    wr = np.ones(Phi.shape[0]) if wr is None else wr
    G = Phi.T @ (wr[:, None] * Phi)
    np.testing.assert_allclose(stats.gram, G, rtol=1e-10, atol=1e-12 * np.abs(G).max())
    M = Phi.T @ (wr[:, None] * Y)
    np.testing.assert_allclose(stats.moment, M, rtol=1e-10, atol=1e-12 * np.abs(M).max())
    np.testing.assert_allclose(stats.y_sq, (wr[:, None] * Y**2).sum(axis=0), rtol=1e-12)
    assert stats.n_rows == int(np.count_nonzero(wr > 0))


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cg_row_cache_matches_streaming(readout, weighted):
    """Cached (float64, float32) and streamed products: same G V, same fit, same certificate."""
    from sklearn_linattn._solvers.cg import solve_cg

    rng = np.random.default_rng([11, len(readout), weighted])
    n = 90 if readout == "last" else 25
    X, lengths, y = _data(rng, n, 6, 4, readout=readout, d_out=2)
    w = rng.uniform(0.5, 2.0, size=n) if weighted else None
    if weighted:
        w[:5] = 0.0  # zero-weight rows are left out of the cache
    Xz = np.where(np.isnan(X), 0.0, X)
    Yz = np.where(np.isnan(y), 0.0, y)
    V = rng.normal(size=(40, 3))
    ops = {c: ImplicitGram(RowReader.of_arrays(Xz, lengths, Yz, readout, w), cache_dtype=c)
           for c in (None, "float64", "float32")}
    for op in ops.values():
        op.setup()
    streamed = ops[None].matmat(V)
    assert ops[None].exact and ops["float64"].exact and not ops["float32"].exact
    np.testing.assert_allclose(ops["float64"].matmat(V), streamed, rtol=1e-12,
                               atol=1e-12 * np.abs(streamed).max())
    assert _rel(ops["float32"].matmat(V), streamed) <= 1e-5
    np.testing.assert_array_equal(ops["float32"].matmat_exact(V), streamed)
    # Fits: the float32 cache is corrected by exact residuals, so all agree to tol.
    dense = solve_arrays(Xz, lengths, Yz, readout=readout, solver="eigh", sample_weight=w)
    for cache in (None, "float64", "float32"):
        design = RowReader.of_arrays(Xz, lengths, Yz, readout, w, dense.standardizer)
        sol = solve_cg(design, 0.0, dict(tol=1e-12, max_iter=5000, cache_dtype=cache))
        assert _rel(sol.coef, dense.coef) <= 1e-9, cache
        assert sol.lambda_max == pytest.approx(dense.lambda_max, rel=1e-6)
        assert sol.lambda_min >= dense.lambda_min - 10 * dense.tol
        assert abs(sol.lambda_min - dense.lambda_min) <= sol.lambda_min_error + 10 * dense.tol


def test_cg_float32_cache_certifies_rank_deficient_data():
    """A float32 cache does not hide a null space: same verdict and witness as eigh."""
    from sklearn_linattn._solvers.cg import solve_cg

    rng = np.random.default_rng(15)
    # Tokens in a 3-dimensional subspace of R^4: the Gram matrix is singular.
    X = rng.normal(size=(120, 6, 3)) @ rng.normal(size=(3, 4))
    lengths = np.full(120, 6)
    y = rng.normal(size=(120, 1))
    dense = solve_arrays(X, lengths, y, solver="eigh")
    design = RowReader.of_arrays(X, lengths, y, "last", standardizer=dense.standardizer)
    sol = solve_cg(design, 0.0, dict(tol=1e-12, max_iter=5000, cache_dtype="float32"))
    assert dense.rank < 40 and sol.rank_is_bound and sol.rank >= dense.rank
    assert not sol.lambda_min - sol.lambda_min_error > sol.tol
    assert sol.lambda_min <= 1e3 * dense.tol
    # The eigenvector is a null vector of the exact Gram matrix (both solves are in
    # the same standardized coordinates).
    st = dense.standardizer
    Phi = st.scale_features(ref_features(st.transform(X), lengths))
    v = sol.min_eigenvector
    assert np.linalg.norm(Phi @ v) <= 1e-5 * np.linalg.norm(Phi, 2)
    # Fitted values agree with the minimum-norm solution's on the training rows.
    assert _rel(Phi @ sol.coef.T, Phi @ dense.coef.T) <= 1e-9


def test_cg_cache_follows_the_memory_budget():
    from sklearn_linattn._solvers.cg import cg_cache_dtype

    # d = 64, N = 150000: 2.6 GB in float64, 1.3 GB in float32.
    assert cg_cache_dtype(150000, 64, memory_budget=2**34 + 2**33) == np.float64
    assert cg_cache_dtype(150000, 64, memory_budget=2**33 + 2**32) == np.float32
    assert cg_cache_dtype(150000, 64, memory_budget=2**32) is None
    rng = np.random.default_rng(12)
    X, lengths, y = _data(rng, 80, 6, 4)
    X = np.where(np.isnan(X), 0.0, X)
    coefs = [solve_arrays(X, lengths, y, solver="cg", tol=1e-12, memory_budget=b).coef
             for b in (2**30, 8 * 80 * 15 * 6, 10)]  # float64, float32, no cache
    for c in coefs[1:]:
        assert _rel(c, coefs[0]) <= 1e-9


def test_pcg_residual_replacement_stops_on_exact_residuals():
    """With an inexact product, CG's stopping rule holds for the exact system."""
    from sklearn_linattn._krylov import pcg as _pcg

    rng = np.random.default_rng(13)
    A = rng.normal(size=(60, 30))
    G = A.T @ A
    noise = rng.normal(size=G.shape) * 1e-6 * np.abs(G).max()
    noise = (noise + noise.T) / 2
    b = rng.normal(size=(30, 2))
    calls = []

    def exact(V):
        calls.append(V.shape[1])
        return G @ V

    X, n_iter, rel = _pcg(lambda V: (G + noise) @ V, b, lambda R, definite=False: R, None,
                          1e-12, 2000, exact=exact)
    assert np.all(rel <= 1e-12) and calls
    assert _rel(X, np.linalg.solve(G, b)) <= 1e-9
    # Without the exact product, CG converges to the perturbed system.
    Xp, _, _ = _pcg(lambda V: (G + noise) @ V, b, lambda R, definite=False: R, None, 1e-12, 2000)
    assert _rel(Xp, np.linalg.solve(G, b)) > 1e-8


def test_certify_identifiability_solver_argument():
    X = np.random.default_rng(10).normal(size=(60, 5, 3))
    certs = {s: certify_identifiability(X, solver=s) for s in SOLVERS}
    for cert in certs.values():
        assert cert and cert.rank == 18
        assert cert.min_eigenvalue == pytest.approx(certs["eigh"].min_eigenvalue, rel=1e-6)
    with pytest.raises(ValueError, match="solver must be one of"):
        certify_identifiability(X, solver="lsqr")
    # A user tolerance above lambda_min of a Cholesky spectrum asks for the null space.
    big = certify_identifiability(X, solver="cholesky", tol=2 * certs["eigh"].min_eigenvalue)
    assert not big and big.method == "eigh" and big.rank < 18


# --------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------


@pytest.mark.parametrize("solver", ALL)
def test_one_and_two_blas_threads_agree(solver):
    rng = np.random.default_rng(11)
    d = 6  # psi = 126: GEMMs large enough for OpenBLAS to use both threads
    X = rng.normal(size=(600, 8, d)) if solver != "dual" else rng.normal(size=(100, 8, d))
    y = rng.normal(size=X.shape[0])
    coefs = []
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                coefs.append(_fit(solver, X, y).coef_)
    np.testing.assert_allclose(coefs[0], coefs[1], rtol=1e-10,
                               atol=1e-10 * np.abs(coefs[0]).max())


@pytest.mark.parametrize("alpha", [1e-8, 1e-3, 1.0])
def test_dual_ridge_on_tall_noisy_data_equals_eigh(alpha):
    # More rows than features and targets no attention fits: the kernel's
    # rounding-level eigenvalues hold the residual, and 1 / (mu + alpha) on
    # them once put 2e-4 relative error into the coefficients at alpha = 1e-8.
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 5, 3)), rng.normal(size=200)
    dual = LinearAttentionRegressor(solver="dual", alpha=alpha).fit(X, y).coef_
    eigh = LinearAttentionRegressor(solver="eigh", alpha=alpha).fit(X, y).coef_
    np.testing.assert_allclose(dual, eigh, rtol=0, atol=1e-10 * np.abs(eigh).max())
