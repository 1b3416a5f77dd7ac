"""Scale, units and linear maps of the tokens do not change fits, verdicts or predictions.

Every solver works on standardized tokens (``sklearn_linattn._units``):
exact power-of-two scales per coordinate, then whitening.  These tests hold
the package to the resulting contract, on the reproducers that used to fail
(lsmr stopping after one iteration at ``X * 1e-6``, cg returning zero
coefficients at ``X * 1e25``, every solver returning the zero model beyond
``1e+-51``, per-coordinate units spoiling eigh/cholesky/svd, an entry of
1e300 hanging the SVD, cg's ArpackError on all-zero rows, the dual solver
allocating until MemoryError, float16 judged as float64), and over scales,
units and maps drawn by hypothesis.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning

from sklearn_linattn import (
    LinearAttentionRegressor,
    certify_identifiability,
    mhla_forward,
)
from solving import solve_arrays
from sklearn_linattn.datasets import make_associative_memory

SOLVERS = ["eigh", "cholesky", "svd", "dual", "cg", "lsmr"]
# cg to rounding, so that its predictions can be compared at 1e-10.
TIGHT = {"cg": dict(tol=1e-13, max_iter=5000)}


def _generator(seed, d=3, n_heads=2, n_samples=90, n_tokens=6):
    rng = np.random.default_rng(seed)
    V, Q = rng.normal(size=(n_heads, 1, d)), rng.normal(size=(n_heads, d, d))
    X = rng.normal(size=(n_samples, n_tokens, d))
    X_new = rng.normal(size=(12, 2 * n_tokens, d)) * 2.0  # longer, larger
    return V, Q, X, mhla_forward(X, V, Q)[:, 0], X_new, mhla_forward(X_new, V, Q)[:, 0]


def _fit(solver, X, y, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return LinearAttentionRegressor(solver=solver, **TIGHT.get(solver, {}),
                                        **params).fit(X, y)


def _rel(a, b):
    # Scaled first: the norms of arrays near 1e-300 or 1e300 would under- or overflow.
    s = np.abs(b).max()
    return np.linalg.norm((a - b) / s) / np.linalg.norm(b / s)


# --------------------------------------------------------------------------
# An overall scale
# --------------------------------------------------------------------------


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("c", [1e-100, 1e-60, 1e-30, 1e-6, 1e25, 1e60, 1e100])
def test_an_overall_scale_changes_nothing(solver, c):
    V, Q, X, y, X_new, y_new = _generator(0)
    model = _fit(solver, X * c, y * c**3)
    assert model.certificate_
    # The same model: its outputs on unit-scale inputs are the generator's ...
    assert _rel(model.predict(X_new), y_new) <= 1e-10
    # ... and on inputs of the training scale, c**3 times them.
    assert _rel(model.predict(X_new * c), y_new * c**3) <= 1e-10
    np.testing.assert_allclose(model.coef_, _fit(solver, X, y).coef_, rtol=1e-8,
                               atol=1e-10 * np.abs(model.coef_).max())


@given(exponent=st.integers(-100, 100), seed=st.integers(0, 2**16),
       solver=st.sampled_from(SOLVERS))
@settings(max_examples=30)
def test_verdict_and_predictions_over_scales_from_1e_minus_100_to_1e100(exponent, seed, solver):
    c = 10.0**exponent
    V, Q, X, y, X_new, y_new = _generator(seed, n_samples=60, n_tokens=5)
    model = _fit(solver, X * c, y * c**3)
    assert bool(model.certificate_) == bool(certify_identifiability(X)) is True
    assert _rel(model.predict(X_new), y_new) <= 1e-10
    assert bool(certify_identifiability(X[:10] * c, solver=solver)) is False  # N < psi


def test_lsmr_at_a_small_scale_iterates_to_the_solution():
    """Reproducer: lsmr at X * 1e-6 stopped after one iteration, 30-50 % off."""
    V, Q, X, y, X_new, y_new = _generator(1)
    model = _fit("lsmr", X * 1e-6, y * 1e-18)
    assert model.n_iter_ > 1 and _rel(model.predict(X_new), y_new) <= 1e-10


@pytest.mark.parametrize("c", [1e25, 1e-30])
def test_cg_at_extreme_scales_finds_the_coefficients(c):
    """Reproducer: cg returned all-zero coefficients with certificate_ True."""
    V, Q, X, y, X_new, y_new = _generator(2)
    model = _fit("cg", X * c, y * c**3)
    assert np.abs(model.coef_).max() > 0 and model.certificate_
    assert _rel(model.predict(X_new), y_new) <= 1e-10


def test_numbers_beyond_float64_are_a_clear_error():
    V, Q, X, y, X_new, y_new = _generator(3)
    # Coefficients of about 1e300 / 1e-100**3 = 1e600 cannot be represented.
    with pytest.raises(ValueError, match="cannot be represented in float64"):
        LinearAttentionRegressor().fit(X * 1e-100, y * 1e300)
    model = LinearAttentionRegressor().fit(X, y)
    # Outputs of about 1e600: an error, not inf.
    with pytest.raises(ValueError, match="float64"):
        model.predict(X_new * 1e200)
    # Representable outputs of inputs far from the training scale are right.
    assert _rel(model.predict(X_new * 1e100), y_new * 1e300) <= 1e-10


# --------------------------------------------------------------------------
# Units per coordinate and linear maps of the tokens
# --------------------------------------------------------------------------


@pytest.mark.parametrize("solver", SOLVERS)
def test_units_per_coordinate_do_not_spoil_the_fit(solver):
    """Reproducer: units 30 : 1/30 : 1 gave training R^2 0.93-0.97, 25 % error."""
    V, Q, X, y, X_new, y_new = _generator(4)
    units = np.array([30.0, 1 / 30, 1.0])
    model = _fit(solver, X * units, y)
    assert model.certificate_
    assert model.score(X * units, y) >= 1 - 1e-12
    assert _rel(model.predict(X_new * units), y_new) <= 1e-10


@pytest.mark.parametrize("solver", SOLVERS)
def test_verdict_does_not_flip_with_units(solver):
    rng = np.random.default_rng(5)
    X = rng.normal(size=(18, 5, 3))  # psi = 18: identifiable with the least margin
    units = np.array([1e3, 1e-2, 1.0])
    assert certify_identifiability(X, solver=solver)
    assert certify_identifiability(X * units, solver=solver)
    assert not certify_identifiability(X[:17] * units, solver=solver)


def _map(rng, d, condition):
    """A random invertible map with the given condition number."""
    U = np.linalg.qr(rng.normal(size=(d, d)))[0]
    W = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return U @ np.diag(np.geomspace(1.0, 1.0 / condition, d)) @ W * rng.uniform(1e-3, 1e3)


@given(seed=st.integers(0, 2**16), log_condition=st.floats(0, 6),
       solver=st.sampled_from(SOLVERS))
@settings(max_examples=30)
def test_fits_and_verdicts_are_unchanged_by_linear_maps(seed, log_condition, solver):
    V, Q, X, y, X_new, y_new = _generator(seed, n_samples=60, n_tokens=5)
    A = _map(np.random.default_rng(seed), 3, 10.0**log_condition)
    model = _fit(solver, X @ A, y)
    reference = _fit(solver, X, y)
    assert bool(model.certificate_) == bool(reference.certificate_) is True
    np.testing.assert_allclose(model.predict(X_new @ A), reference.predict(X_new), rtol=1e-8,
                               atol=1e-8 * np.abs(y_new).max())
    # Not identifiable before and after the map (fewer sequences than psi).
    assert not certify_identifiability(X[:15] @ A, solver=solver)


@pytest.mark.parametrize("solver", ["eigh", "svd", "dual", "lsmr"])
def test_rank_deficient_fits_are_unchanged_by_linear_maps(solver):
    # Fewer sequences than psi: the minimizer of minimum norm in standardized
    # coordinates is the same function whatever the map of the tokens.
    V, Q, X, y, X_new, _ = _generator(6, n_samples=12)
    rng = np.random.default_rng(6)
    A = _map(rng, 3, 1e3)
    a, b = _fit(solver, X, y), _fit(solver, X @ A, y)
    assert not a.certificate_ and not b.certificate_ and a.feature_rank_ == b.feature_rank_
    np.testing.assert_allclose(b.predict(X_new @ A), a.predict(X_new), rtol=1e-7,
                               atol=1e-7 * np.abs(a.predict(X_new)).max())


def test_tokens_in_a_subspace_stay_not_identifiable_under_maps():
    rng = np.random.default_rng(7)
    basis = np.linalg.qr(rng.normal(size=(4, 3)))[0]
    X = rng.normal(size=(200, 5, 3)) @ basis.T  # tokens in a 3-d subspace of R^4
    for A in (np.eye(4), _map(rng, 4, 1e4), np.diag([1e5, 1.0, 1e-5, 3.0])):
        cert = certify_identifiability(X @ A)
        assert not cert and cert.rank == certify_identifiability(X).rank


# --------------------------------------------------------------------------
# Hangs and crashes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("solver", SOLVERS)
def test_one_huge_entry_returns_at_once(solver):
    """Reproducer: certify_identifiability(X, solver="svd") with one entry 1e300 never returned."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(60, 5, 3))
    X[3, 2, 1] = 1e300
    cert = certify_identifiability(X, solver=solver)
    # The other values of that coordinate are 1e-300 of it: not resolvable.
    assert not cert
    model = LinearAttentionRegressor(solver=solver).fit(X, rng.normal(size=60))
    assert np.all(np.isfinite(model.coef_))


@pytest.mark.parametrize("solver", SOLVERS)
def test_all_zero_feature_rows_are_not_identifiable(solver):
    """Reproducer: solver="cg" raised scipy's ArpackError when the last token is zero."""
    X = np.random.default_rng(9).normal(size=(60, 5, 4))
    X[:, -1] = 0.0
    cert = certify_identifiability(X, solver=solver)
    assert not cert and cert.rank == 0
    model = LinearAttentionRegressor(solver=solver).fit(X, np.ones(60))
    assert not np.any(model.coef_) and model.predict(X[:3]).tolist() == [0.0, 0.0, 0.0]
    witness = cert.witness(random_state=0)
    assert np.all(np.isfinite(witness.input))


@pytest.mark.parametrize("solver", ["eigh", "cg"])
def test_an_entry_at_the_float32_limit_is_answered(solver):
    """Reproducer: solver="cg" raised ArpackError on an entry 3.4e38."""
    X = np.random.default_rng(10).normal(size=(60, 5, 4))
    X[2, 1, 1] = 3.4e38
    assert not certify_identifiability(X, solver=solver)


def test_explicit_solvers_refuse_before_allocating_what_does_not_fit():
    """Reproducer: solver="dual" with 60 000 sequences at psi = 936 ran into MemoryError."""
    X = np.random.default_rng(11).normal(size=(60000, 3, 12)).astype(np.float32)
    y = np.zeros(60000)
    with pytest.raises(ValueError, match=r"solver='dual' needs about .* GiB .* "
                                         r"solvers whose arrays fit: \[.*'cg'\]"):
        LinearAttentionRegressor(solver="dual").fit(X, y)
    with pytest.raises(ValueError, match=r"solver='dual' needs about"):
        certify_identifiability(X, solver="dual")
    # The same rule with a small budget, for every dense solver.
    Xs = X[:200]
    for solver in ("eigh", "cholesky", "svd", "dual"):
        with pytest.raises(ValueError, match=rf"solver='{solver}' needs about"):
            solve_arrays(Xs, np.full(200, 3), None, solver=solver, memory_budget=2**16)


# --------------------------------------------------------------------------
# Precision of the input
# --------------------------------------------------------------------------


def test_float16_is_judged_by_its_own_precision():
    """Reproducer: float16 input was upcast and certified by the float64 rule."""
    X, _ = make_associative_memory(300, 3, distribution="orthonormal", random_state=0)
    for dtype in (np.float16, np.float32, np.float64):
        cert = certify_identifiability(X.astype(dtype))
        assert not cert and cert.dtype == dtype
    rng = np.random.default_rng(12)
    X16 = rng.normal(size=(200, 6, 3)).astype(np.float16)
    cert = certify_identifiability(X16)
    eps = float(np.finfo(np.float16).eps)
    assert cert.tol == pytest.approx(cert.max_eigenvalue * 18 * eps**2, rel=1e-12)
    assert cert and LinearAttentionRegressor().fit(X16, X16[:, -1, 0]).certificate_.dtype == \
        np.float16


@pytest.mark.parametrize("solver", SOLVERS)
def test_ridge_is_unit_free(solver):
    """alpha means the same whatever the units: X, c * X, units per coordinate and
    a linear map give the same predictions for every alpha (it penalises the
    standardized coefficients relative to the mean eigenvalue of Lambda_D)."""
    rng = np.random.default_rng(13)
    A = np.array([[3.0, 0.5, 0.0], [0.0, 0.2, 0.1], [0.4, 0.0, 1.5]])
    X = rng.normal(size=(70, 5, 3)) @ A
    y = rng.normal(size=70)
    X_new = rng.normal(size=(20, 8, 3)) @ A
    units = np.array([1e30, 1e-20, 7.0])
    M = _map(rng, 3, 1e3)
    for alpha in (1e-2, 10.0):
        base = _fit(solver, X, y, alpha=alpha).predict(X_new)
        assert _rel(_fit(solver, X * 1e40, y * 1e-7, alpha=alpha).predict(X_new * 1e40),
                    base * 1e-7) <= 1e-9
        assert _rel(_fit(solver, X * units, y, alpha=alpha).predict(X_new * units),
                    base) <= 1e-9
        assert _rel(_fit(solver, X @ M, y, alpha=alpha).predict(X_new @ M), base) <= 1e-8
        # The penalty is felt: far from the least-squares fit at alpha = 10.
        assert alpha < 1 or _rel(base, _fit(solver, X, y).predict(X_new)) > 0.1


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("decay", [None, (1.0, 0.5)])
@pytest.mark.parametrize("train, test", [(1e50, 1e-60), (1e-50, 1e60), (1e20, 1e-85)])
def test_predictions_far_from_the_training_scale_are_exact(readout, decay, train, test):
    """Inputs whose outputs float64 holds but whose standardized outputs it does not (far
    smaller or larger than the training data) are predicted to rounding, not as 0 or an
    overflow error."""
    from sklearn_linattn import mhla_forward

    rng = np.random.default_rng(0)
    V, Q = rng.normal(size=(2, 1, 2)), rng.normal(size=(2, 2, 2))
    g = None if decay is None else list(decay)
    X = train * rng.normal(size=(300, 5, 2))
    y = mhla_forward(X, V, Q, readout=readout, decays=g)[..., 0]
    model = LinearAttentionRegressor(readout=readout, decay=decay).fit(X, y)
    X_new = test * rng.normal(size=(3, 6, 2))
    truth = mhla_forward(X_new, V, Q, readout=readout, decays=g)[..., 0]
    assert model.certificate_.covers(X_new).all()
    for pred in (model.predict(X_new), model.predict_from_coefficients(X_new)):
        np.testing.assert_allclose(pred, truth, rtol=1e-10, atol=0)
