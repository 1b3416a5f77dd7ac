"""The "cg" solver's shared Krylov pass: fit and certificate probes in one block CG."""

import numpy as np
import pytest

from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn import _spectrum as spectrum
from sklearn_linattn._krylov import ByColumns, pcg
from sklearn_linattn._moments import ImplicitGram, RowReader
from sklearn_linattn._solvers.cg import _KroneckerPreconditioner
from sklearn_linattn._spectrum import (
    _pencil_lanczos,
    eigenvalue_tolerance,
    probe_threshold,
    randomized_lower_bound,
)


def _setup(X, cache_dtype=np.float64):
    lengths = np.full(X.shape[0], X.shape[1])
    op = ImplicitGram(RowReader.of_arrays(X, lengths), cache_dtype=cache_dtype)
    setup = op.setup()
    precond = _KroneckerPreconditioner(setup["A"], setup["B"], setup["weight_sum"], 0.0,
                                       np.float64)
    G = op.matmat_exact(np.eye(op.psi))
    w, U = np.linalg.eigh((G + G.T) / 2)
    return op, precond, w, U


def _designs():
    """Small Gaussian designs: near square, tall, ill-conditioned, rank deficient."""
    rng = np.random.default_rng(40)
    for d in (3, 4, 5):
        psi = d * d * (d + 1) // 2
        for n in (psi - 3, psi + 1, int(1.2 * psi), 3 * psi):
            for spread in (1.0, 1e3):
                X = rng.normal(size=(n, 5, d)) * np.geomspace(1.0, spread, d)
                yield X
        X = rng.normal(size=(2 * psi, 5, d))
        X[..., -1] = 0.0  # singular token moment: null directions outside the fit range
        yield X


# A float32 cache once overflowed casting the long CG directions of a null
# direction (a RuntimeWarning, and inf in the products): the products scale
# each column by a power of two first.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("cache", [np.float64, np.float32])
def test_lower_bound_is_below_the_dense_lambda_min(cache):
    # The seeded probes' bound is a valid lower bound on every design (the
    # probability 8e-4 of failure per design makes a failure among these
    # unlikely, and the seed is fixed: the test is deterministic).
    for X in _designs():
        op, precond, w, _ = _setup(X, cache)
        tol = eigenvalue_tolerance(w[-1], op.psi)
        out = _pencil_lanczos(op, precond, tol, 4)
        slack = 1e-9 * w[-1]
        assert out["lower"] <= w[0] + slack
        assert w[0] - slack <= out["upper"]
        if w[0] <= tol:  # singular (to rounding): the bound must not certify it
            assert out["lower"] <= tol


def test_lower_bound_is_tight_on_a_near_square_design():
    # Two probes and the second stage: within a factor 100 of lambda_min
    # (the single-probe bound was 1e-5 to 1e-3 of it).
    X = np.random.default_rng(41).normal(size=(int(1.13 * 550), 8, 10)) / np.sqrt(8)
    op, precond, w, _ = _setup(X)
    out = _pencil_lanczos(op, precond, eigenvalue_tolerance(w[-1], op.psi), 4)
    assert w[0] / 100 <= out["lower"] <= w[0]


def test_probe_threshold_is_the_chi_square_quantile():
    rng = np.random.default_rng(42)
    for k in (1, 2, 4):
        delta = probe_threshold(k, failure=0.1)
        g = rng.standard_normal((200_000, k))
        frequency = np.mean(np.linalg.norm(g, axis=1) < delta)
        assert frequency == pytest.approx(0.1, abs=0.004)
    assert probe_threshold(1) == pytest.approx(8e-4 * np.sqrt(np.pi / 2), rel=1e-3)


def test_failure_probability_is_respected(monkeypatch):
    # With a failure probability of 0.3, the bound fails on at most about
    # 30% of seeds (binomial, 60 seeds: mean 18, sd 3.5); it fails only when
    # ||B^T u|| < delta, which the test checks too.
    monkeypatch.setattr(spectrum, "_FAILURE", 0.3)
    X = np.random.default_rng(43).normal(size=(45, 5, 4))  # psi = 40, near square
    op, precond, w, U = _setup(X)
    tol = eigenvalue_tolerance(w[-1], op.psi)
    delta = probe_threshold(spectrum._PROBES, failure=0.3)
    failures = small = 0
    for seed in range(60):
        out = _pencil_lanczos(op, precond, tol, 4, seed=seed)
        B = np.random.default_rng(seed).standard_normal((op.psi, spectrum._PROBES))
        below = np.linalg.norm(B.T @ U[:, 0]) < delta
        small += below
        if out["lower"] > w[0] * (1 + 1e-9):
            failures += 1
            assert below
    assert failures <= small <= 30


def test_randomized_lower_bound_formula():
    # One stage: (delta - ||R_1||) / ||X_1||; two: the positive root of the quadratic.
    X1, R1 = np.array([[4.0], [0.0]]), np.array([[0.1], [0.0]])
    X2, R2 = np.array([[2.0], [0.0]]), np.array([[0.0], [0.3]])
    assert randomized_lower_bound(0.5, [X1], [R1]) == pytest.approx(0.1)
    lam = randomized_lower_bound(0.5, [X1, X2], [R1, R2])
    assert 2 * lam**2 + 0.3 * lam + 0.1 == pytest.approx(0.5)
    # Singular: the residual never falls below delta, no positive bound.
    assert randomized_lower_bound(0.5, [X1, X2], [R1 * 6, R2]) < 0


def test_by_columns_solves_two_systems_in_one_block():
    # Column 0: (G + 2 I) x = b with a Jacobi preconditioner; column 1: G x = b unpreconditioned.
    rng = np.random.default_rng(44)
    A = rng.normal(size=(30, 20))
    G, b = A.T @ A, rng.normal(size=(20, 2))
    precond = ByColumns(1, lambda R: R / (np.diag(G)[:, None] + 2), lambda R: R)
    penalty = ByColumns(1, lambda V: 2 * V, None)
    X, _, rel = pcg(lambda V: G @ V, b, precond, penalty, 1e-12, 500)
    np.testing.assert_allclose(X[:, 0], np.linalg.solve(G + 2 * np.eye(20), b[:, 0]), rtol=1e-8)
    np.testing.assert_allclose(X[:, 1], np.linalg.solve(G, b[:, 1]), rtol=1e-7)
    assert np.all(rel <= 1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_shared_pass_fit_matches_eigh(alpha):
    rng = np.random.default_rng(45)
    X = rng.normal(size=(150, 6, 4))
    y = rng.normal(size=(150, 2))
    cg = LinearAttentionRegressor(solver="cg", alpha=alpha, tol=1e-12, max_iter=5000).fit(X, y)
    eigh = LinearAttentionRegressor(solver="eigh", alpha=alpha).fit(X, y)
    np.testing.assert_allclose(cg.predict(X), eigh.predict(X), rtol=1e-8, atol=1e-9)
    assert bool(cg.certificate_) == bool(eigh.certificate_)
    lam = eigh.certificate_.min_eigenvalue
    assert cg.certificate_.min_eigenvalue - cg.certificate_.min_eigenvalue_error <= lam * (
        1 + 1e-9)


def test_diagnostics_record_the_shared_pass():
    """The solver's phase record agrees with its own counts and clock."""
    from solving import solve_arrays

    rng = np.random.default_rng(41)
    X = rng.normal(size=(400, 5, 4))
    Y = X[:, -1, :1] * (X[:, :, 1:2] ** 2).sum(axis=1)
    solution = solve_arrays(X, np.full(400, 5), Y, solver="cg")
    diag = solution.diagnostics
    assert diag["fit_iterations"] == solution.n_iter > 0
    assert diag["n_probes"] == 2 and len(diag["probe_iterations"]) == 2  # both stages ran
    assert all(i > 0 for i in diag["probe_iterations"])
    # The fit's columns stop inside the shared block CG, never after it.
    assert 0 < diag["fit_seconds"] <= diag["block_cg_seconds"]
    assert all(diag[k] >= 0 for k in diag if k.endswith("_seconds"))
    assert diag["lobpcg_iterations"] == 0  # the interval decided the verdict
