"""Designed identifying inputs and learning from an oracle (sklearn_linattn.design).

Every design is judged by the certificate itself and by a reference written
from the definition (tests/reference.py); every learned model is checked out
of distribution: on longer sequences with larger tokens than the queries.
"""

import math

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from sklearn_linattn import LinearAttentionRegressor, certify_identifiability
from sklearn_linattn.design import (
    OracleFit,
    identifying_design,
    learn_from_oracle,
    minimum_design_size,
)
from sklearn_linattn.design import _criterion

from reference import random_generator, ref_features, ref_forward, ref_pairs, ref_prefix_features


def _true(X, V, Q, readout):
    """The generator's outputs by the loop reference, in the oracle's form."""
    out = ref_forward(X, np.full(X.shape[0], X.shape[1]), V, Q, readout=readout)
    return out


def _ood_inputs(rng, d, n_tokens):
    """Longer sequences with larger tokens than the whitened (unit-scale) queries."""
    return 3.0 * rng.normal(size=(4, 3 * n_tokens + 5, d))


def _ref_lambda_min(X, readout):
    """lambda_min of the standardized Lambda_D from the definition.

    Tokens whitened to unit second moment (M^{-1/2} from an eigendecomposition),
    features by loops, the off-diagonal moments weighted by sqrt(2).
    """
    n, T, d = X.shape
    flat = X.reshape(-1, d)
    w, U = np.linalg.eigh(flat.T @ flat / flat.shape[0])
    Z = X @ ((U / np.sqrt(w)) @ U.T)
    lengths = np.full(n, T)
    H = ref_features(Z, lengths) if readout == "last" else ref_prefix_features(
        Z, lengths).reshape(n * T, -1)
    weights = np.repeat([1.0 if j == k else math.sqrt(2.0) for j, k in ref_pairs(d)], d)
    H = H * weights
    return np.linalg.eigvalsh(H.T @ H / H.shape[0])[0]


def _rank_bound(d, n, T, readout):
    """Most independent rows n sequences of T tokens can give, counted row by row."""
    psi = d * d * (d + 1) // 2
    cubics = len({tuple(sorted((j, k, l))) for j in range(d) for k in range(d) for l in range(d)})
    if readout == "last":
        return min(n, psi if T > 1 else cubics)
    return min(psi, min(n, cubics) + n * (T - 1))


# ------------------------------------------------------------------ minimum_design_size


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d, T", [(1, 1), (2, 2), (2, 3), (3, 2), (3, 5), (4, 3), (5, 2)])
def test_minimum_design_size_is_the_least_full_rank_count(d, T, readout):
    psi = d * d * (d + 1) // 2
    n = minimum_design_size(d, n_tokens=T, readout=readout)
    assert _rank_bound(d, n, T, readout) == psi
    assert n == 1 or _rank_bound(d, n - 1, T, readout) < psi
    # Generic inputs attain it, and one sequence fewer never does.
    rng = np.random.default_rng(d * 10 + T)
    assert certify_identifiability(rng.normal(size=(n, T, d)), readout=readout)
    if n > 1:
        assert not certify_identifiability(rng.normal(size=(n - 1, T, d)), readout=readout)


def test_minimum_design_size_for_all_exceeds_ceil_when_first_prefixes_run_out():
    # d = 5, T = 2: psi = 75, ceil(75 / 2) = 38, but the first prefixes span only 35.
    assert minimum_design_size(5, n_tokens=2, readout="all") == 40
    assert minimum_design_size(6, n_tokens=2, readout="all") == 70
    assert minimum_design_size(6, n_tokens=3, readout="all") == 42  # ceil(126 / 3)


def test_minimum_design_size_errors():
    with pytest.raises(ValueError, match="n_tokens must be at least 2 for d = 3.*got n_tokens=1"):
        minimum_design_size(3, n_tokens=1)
    with pytest.raises(ValueError, match="readout"):
        minimum_design_size(3, n_tokens=3, readout="first")
    with pytest.raises((TypeError, ValueError), match="d"):
        minimum_design_size(0, n_tokens=3)


# ------------------------------------------------------------------ identifying_design


@pytest.mark.parametrize("readout", ["last", "all"])
def test_criterion_gradient_matches_finite_differences(readout):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(minimum_design_size(3, n_tokens=3, readout=readout) + 1, 3, 3))
    value, grad = _criterion(X, readout, 4.0)
    D = rng.normal(size=X.shape)
    h = 1e-6
    numeric = (_criterion(X + h * D, readout, 4.0)[0] - _criterion(X - h * D, readout, 4.0)[0]) / (2 * h)
    assert np.isclose(np.sum(grad * D), numeric, rtol=1e-5)
    # Invariance: the criterion of X A is that of X.
    A = rng.normal(size=(3, 3))
    assert np.isclose(_criterion(X @ A, readout, 4.0)[0], value, rtol=1e-10)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d, T", [(1, 2), (2, 3), (3, 4)])
def test_design_is_minimal_certified_and_better_than_gaussian(d, T, readout):
    X = identifying_design(d, n_tokens=T, readout=readout, random_state=0)
    n = minimum_design_size(d, n_tokens=T, readout=readout)
    assert X.shape == (n, T, d)
    cert = certify_identifiability(X, readout=readout)
    assert cert and cert.rank == cert.n_features
    # The certificate's lambda_min is the reference's, in its own (whitened) units.
    assert np.isclose(cert.min_eigenvalue, _ref_lambda_min(X, readout), rtol=1e-8)
    # Whitened: unit token second moment, the scale of standard Gaussian tokens.
    flat = X.reshape(-1, d)
    np.testing.assert_allclose(flat.T @ flat / flat.shape[0], np.eye(d), atol=1e-10)
    if d > 1:
        gaussian = [certify_identifiability(np.random.default_rng(s).normal(size=X.shape),
                                            readout=readout).min_eigenvalue for s in range(3)]
        assert cert.min_eigenvalue > 10 * np.median(gaussian)


def test_design_is_deterministic_and_accepts_more_samples():
    a = identifying_design(2, n_tokens=3, random_state=3)
    np.testing.assert_array_equal(a, identifying_design(2, n_tokens=3, random_state=3))
    assert not np.array_equal(a, identifying_design(2, n_tokens=3, random_state=4))
    big = identifying_design(2, n_tokens=3, n_samples=12, random_state=3)
    assert big.shape == (12, 3, 2) and certify_identifiability(big)
    start = identifying_design(2, n_tokens=3, max_iter=0, random_state=3)
    assert certify_identifiability(a).min_eigenvalue > certify_identifiability(start).min_eigenvalue


def test_design_errors():
    with pytest.raises(ValueError, match="n_samples must be at least 18 .*got n_samples=17"):
        identifying_design(3, n_tokens=3, n_samples=17)
    with pytest.raises(ValueError, match="n_tokens must be at least 2"):
        identifying_design(3, n_tokens=1)
    with pytest.raises(TypeError, match="random_state"):
        identifying_design(2, n_tokens=3, random_state="seed")
    with pytest.raises((TypeError, ValueError), match="max_iter"):
        identifying_design(2, n_tokens=3, max_iter=-1)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_fit_on_design_recovers_generator_out_of_distribution(readout):
    rng = np.random.default_rng(1)
    d, T = 3, 4
    V, Q = random_generator(rng, d, d_out=2, n_heads=3)
    X = identifying_design(d, n_tokens=T, readout=readout, random_state=1)
    model = LinearAttentionRegressor(readout=readout).fit(X, _true(X, V, Q, readout))
    assert model.certificate_
    X_new = _ood_inputs(rng, d, T)
    truth = _true(X_new, V, Q, readout)
    np.testing.assert_allclose(model.predict(X_new), truth, rtol=0, atol=1e-8 * np.abs(truth).max())


# ------------------------------------------------------------------ learn_from_oracle


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("n_heads", [1, 3])
def test_exact_oracle_is_learned_with_the_minimal_queries(readout, n_heads):
    rng = np.random.default_rng(n_heads)
    d, T = 3, 4
    V, Q = random_generator(rng, d, d_out=2, n_heads=n_heads)
    fit = learn_from_oracle(lambda X: _true(X, V, Q, readout), d, readout=readout, n_tokens=T,
                            random_state=0)
    assert isinstance(fit, OracleFit)
    assert fit.n_queries == minimum_design_size(d, n_tokens=T, readout=readout)
    assert fit.n_calls == 1 and fit.converged and fit.model.certificate_
    assert fit.residual < 1e-12
    X_new = _ood_inputs(rng, d, T)
    truth = _true(X_new, V, Q, readout)
    np.testing.assert_allclose(fit.model.predict(X_new), truth, atol=1e-8 * np.abs(truth).max())
    if readout == "all":  # 20 rows for psi = 18: the residual says "exact"
        assert fit.linear_attention is True and fit.error_bound == 0.0
    else:  # psi rows interpolate anything
        assert fit.linear_attention is None and "interpolates" in fit.note


def test_exact_oracle_with_check_sequences_is_found_exact():
    rng = np.random.default_rng(5)
    V, Q = random_generator(rng, 2, n_heads=2)
    fit = learn_from_oracle(lambda X: _true(X, V, Q, "last")[:, 0], 2, n_tokens=3, tol=1e-6,
                            random_state=0)
    assert fit.linear_attention is True and fit.converged and fit.error_bound == 0.0
    assert fit.n_queries == 6 + 2 + 1 and fit.n_calls == 3  # design, checks, one repeat
    assert fit.y.shape == (8,)  # the oracle's own form, the repeat not kept


@pytest.mark.parametrize("readout", ["last", "all"])
def test_noisy_oracle_reaches_tol_and_the_bound_holds_at_held_out_inputs(readout):
    rng = np.random.default_rng(2)
    d, T, sd, tol = 2, 3, 0.01, 0.05
    V, Q = random_generator(rng, d, n_heads=2)
    noise = np.random.default_rng(7)

    def oracle(X):
        y = _true(X, V, Q, readout)
        return y + sd * noise.normal(size=y.shape)

    fit = learn_from_oracle(oracle, d, readout=readout, n_tokens=T, tol=tol, random_state=0)
    n_min = minimum_design_size(d, n_tokens=T, readout=readout)
    assert fit.converged and fit.error_bound <= tol and fit.n_queries > n_min
    assert fit.linear_attention is None and "noisy" in fit.note
    assert 0.5 * sd < fit.noise < 2 * sd
    X_held = rng.normal(size=(30, T, d))
    bound = fit.model.certificate_.error_bound(X_held, fit.epsilon)
    err = np.abs(fit.model.predict(X_held) - _true(X_held, V, Q, readout)).reshape(30, -1)
    assert np.all(err.max(axis=1) <= bound)
    # The reference inputs default to the first design: the bound there is the one reported.
    first = fit.X[:n_min]
    assert np.isclose(fit.model.certificate_.error_bound(first, fit.epsilon).max(), fit.error_bound)


def test_noisy_oracle_stops_at_max_queries_with_a_warning():
    rng = np.random.default_rng(3)
    V, Q = random_generator(rng, 2)
    noise = np.random.default_rng(0)
    with pytest.warns(ConvergenceWarning, match="max_queries=20"):
        fit = learn_from_oracle(lambda X: _true(X, V, Q, "last") + noise.normal(size=(len(X), 1)),
                                2, n_tokens=3, tol=1e-9, max_queries=20, random_state=0)
    assert not fit.converged and fit.n_queries <= 20 and fit.error_bound > 1e-9


def _softmax_attention(V, Q):
    def oracle(X):
        scores = np.einsum("ntj,jk,nk->nt", X, Q, X[:, -1])
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        return np.einsum("nt,ntj,aj->na", w, X, V)
    return oracle


def test_softmax_attention_oracle_is_flagged_by_the_residual():
    rng = np.random.default_rng(4)
    V, Q = random_generator(rng, 3, d_out=2)
    fit = learn_from_oracle(_softmax_attention(V[0], Q[0]), 3, n_tokens=4, tol=1e-3,
                            random_state=0)
    assert fit.model.certificate_  # the certificate is about the inputs: it holds
    assert fit.linear_attention is False and not fit.converged
    assert fit.residual > 1e-3
    assert "not a linear attention" in fit.note
    assert math.isnan(fit.error_bound)


def test_oracle_may_return_torch_tensors():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    V, Q = random_generator(rng, 2, n_heads=2)
    Vt, Qt = torch.from_numpy(V), torch.from_numpy(Q)

    def layer(X):  # sum_h V_h sum_t x_t (x_t^T Q_h x_last), with gradients on
        X = torch.from_numpy(X).requires_grad_(True)
        scores = torch.einsum("ntj,hjk,nk->nht", X, Qt, X[:, -1])
        return torch.einsum("nht,ntj,haj->na", scores, X, Vt)

    fit = learn_from_oracle(layer, 2, n_tokens=3, random_state=0)
    X_new = _ood_inputs(rng, 2, 3)
    truth = _true(X_new, V, Q, "last")
    np.testing.assert_allclose(fit.model.predict(X_new), truth, atol=1e-8 * np.abs(truth).max())


def test_oracle_errors():
    def good(X):
        return X[:, -1, :1] ** 3

    with pytest.raises(TypeError, match="oracle must be callable"):
        learn_from_oracle(3, 2)
    with pytest.raises(ValueError, match=r"oracle must return an array of shape \(m,\) or "
                                         r"\(m, d_out\).*got shape \(6, 3, 1\)"):
        learn_from_oracle(lambda X: X[:, :, :1], 2, n_tokens=3)
    with pytest.raises(ValueError, match=r"\(m, n_tokens\) or \(m, n_tokens, d_out\).*"
                                         r"got shape \(2,\)"):
        learn_from_oracle(lambda X: X[:, -1, 0], 2, n_tokens=3, readout="all")
    with pytest.raises(ValueError, match="oracle returned 6 non-finite values"):
        learn_from_oracle(lambda X: np.full(len(X), np.nan), 2, n_tokens=3)
    with pytest.raises(ValueError, match="oracle must return d_out = 2 outputs.*got 1"):
        learn_from_oracle(good, 2, d_out=2, n_tokens=3)
    with pytest.raises(TypeError, match="oracle must return numeric arrays"):
        learn_from_oracle(lambda X: [object()] * len(X), 2, n_tokens=3)
    with pytest.raises(ValueError, match="max_queries must allow the minimal design of 6"):
        learn_from_oracle(good, 2, n_tokens=3, max_queries=5)
    with pytest.raises(ValueError, match="tol"):
        learn_from_oracle(good, 2, n_tokens=3, tol=0.0)
    with pytest.raises(ValueError, match="X_eval"):
        learn_from_oracle(good, 2, n_tokens=3, tol=1.0, X_eval=np.zeros((2, 3, 5)))


def test_identifying_design_refuses_arrays_beyond_the_memory_budget(monkeypatch):
    from sklearn_linattn import design

    monkeypatch.setattr(design, "resolve_budget", lambda budget: 1000.0)
    with pytest.raises(ValueError, match="identifying_design needs about .* GiB"):
        design.identifying_design(3, n_tokens=4, random_state=0)


def test_identifying_design_checks_its_claim_with_the_certificate(monkeypatch):
    from sklearn_linattn import design

    # A result the certificate rejects (here: every sequence the same) is an error, not a design.
    monkeypatch.setattr(design, "_optimize",
                        lambda X, readout, max_iter: np.repeat(X[:1], len(X), axis=0))
    with pytest.raises(ValueError, match="found no identifying inputs"):
        design.identifying_design(2, n_tokens=3, random_state=0)
