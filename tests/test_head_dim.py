"""head_dim: the best layer whose heads' key-query and value matrices have a given rank."""

import numpy as np
import pytest

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn.datasets import make_in_context_regression


def low_rank_teacher(rng, d, n_heads, r, d_out=1):
    V = np.einsum("hai,hji->haj", rng.normal(size=(n_heads, d_out, r)),
                  rng.normal(size=(n_heads, d, r)))
    Q = np.einsum("hki,hli->hkl", rng.normal(size=(n_heads, d, r)),
                  rng.normal(size=(n_heads, d, r)))
    return V, Q


def als_rank_one_reference(X, y, n_starts=6, n_iter=150, seed=0):
    """The best one-head layer with rank-one key-query matrix, by multi-start alternating least
    squares on the rows: y = p^T S a (b^T x_last), S = sum_t x_t x_t^T (d_out = 1)."""
    S = np.einsum("ntj,ntk->njk", X, X)
    x = X[:, -1]
    rng = np.random.default_rng(seed)
    best = (np.inf, None)
    for _ in range(n_starts):
        p, a, b = rng.normal(size=(3, X.shape[2]))
        for _ in range(n_iter):
            p = np.linalg.lstsq(np.einsum("njk,k,n->nj", S, a, x @ b), y, rcond=None)[0]
            a = np.linalg.lstsq(np.einsum("njk,j,n->nk", S, p, x @ b), y, rcond=None)[0]
            b = np.linalg.lstsq(np.einsum("njk,j,k,nl->nl", S, p, a, x), y, rcond=None)[0]
        risk = np.mean((np.einsum("njk,j,k,n->n", S, p, a, x @ b) - y) ** 2)
        if risk < best[0]:
            best = (risk, (p, a, b))
    p, a, b = best[1]
    return p[None, None, :], np.outer(a, b)[None]


@pytest.mark.parametrize("d, n_heads, r, d_out", [(4, 2, 1, 1), (5, 2, 2, 2), (3, 3, 1, 1)])
@pytest.mark.parametrize("solver", ["eigh", "cholesky", "svd", "cg"])
def test_a_teacher_of_the_architecture_is_recovered_with_a_gap_at_rounding(d, n_heads, r,
                                                                           d_out, solver):
    rng = np.random.default_rng(d * 10 + r)
    V, Q = low_rank_teacher(rng, d, n_heads, r, d_out)
    X = rng.normal(size=(400, 6, d))
    y = mhla_forward(X, V, Q)
    model = LinearAttentionRegressor(n_heads=n_heads, head_dim=r, solver=solver, tol=1e-12,
                                     random_state=0).fit(X, y)
    assert model.n_heads_ == n_heads and model.head_dim_ == r
    for Qh, Vh in zip(model.key_query_matrices_, model.value_matrices_):
        assert np.linalg.matrix_rank(Qh, tol=1e-10 * np.abs(Qh).max()) <= r
        assert np.linalg.matrix_rank(Vh, tol=1e-10 * np.abs(Vh).max()) <= r
    energy = np.mean(y**2) * d_out
    assert 0 <= model.head_dim_gap_ <= 1e-16 * energy
    X_far = 3.0 * rng.normal(size=(30, 11, d))  # longer and larger than the training inputs
    truth = mhla_forward(X_far, V, Q)
    np.testing.assert_allclose(model.predict(X_far), truth, atol=1e-7 * np.abs(truth).max())


def test_the_gap_is_the_excess_training_risk_over_the_unconstrained_optimum():
    rng = np.random.default_rng(1)
    V, Q = low_rank_teacher(rng, 4, 2, 2)
    X = rng.normal(size=(600, 5, 4))
    y = mhla_forward(X, V, Q)[:, 0] + 0.3 * rng.normal(size=600)
    w = rng.uniform(0.5, 2.0, size=600)
    optimum = LinearAttentionRegressor().fit(X, y, sample_weight=w)
    for n_heads, r in ((1, 1), (2, 1), (1, 3)):
        model = LinearAttentionRegressor(n_heads=n_heads, head_dim=r, random_state=0)
        model.fit(X, y, sample_weight=w)
        risk = np.average((model.predict(X) - y) ** 2, weights=w)
        risk_opt = np.average((optimum.predict(X) - y) ** 2, weights=w)
        assert model.head_dim_gap_ >= 0
        assert model.head_dim_gap_ == pytest.approx(risk - risk_opt, rel=1e-6, abs=1e-12)


def test_in_context_prompts_head_dim_one_matches_a_multi_start_reference():
    cov = np.array([0.5, 1.0, 2.0])
    X, y = make_in_context_regression(4000, 8, 3, covariance=cov, random_state=0)
    X_test, y_test = make_in_context_regression(2000, 8, 3, covariance=cov, random_state=1)
    model = LinearAttentionRegressor(n_heads=1, head_dim=1, random_state=0).fit(X, y)
    assert np.linalg.matrix_rank(model.key_query_matrices_[0]) == 1
    V_ref, Q_ref = als_rank_one_reference(X, y)
    mse = np.mean((model.predict(X_test) - y_test) ** 2)
    mse_ref = np.mean((mhla_forward(X_test, V_ref, Q_ref)[:, 0] - y_test) ** 2)
    assert mse <= 1.01 * mse_ref
    assert model.head_dim_gap_ >= 0


def test_to_torch_writes_heads_of_the_fitted_dimension():
    torch = pytest.importorskip("torch")
    from sklearn_linattn.nn import to_torch

    rng = np.random.default_rng(2)
    V, Q = low_rank_teacher(rng, 4, 2, 1)
    X = rng.normal(size=(300, 5, 4))
    model = LinearAttentionRegressor(n_heads=2, head_dim=1, random_state=0)
    model.fit(X, mhla_forward(X, V, Q)[:, 0])
    layer = to_torch(model)
    assert tuple(layer.W_q.shape) == (2, 1, 4) and tuple(layer.W_v.shape) == (2, 1, 4)
    out = layer(torch.as_tensor(X)).detach().numpy()[:, 0]
    np.testing.assert_allclose(out, model.predict(X), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("params, match", [
    (dict(head_dim=1), "head_dim needs n_heads"),
    (dict(head_dim=1, n_heads="auto"), "head_dim needs n_heads"),
    (dict(head_dim=1, n_heads=1, decay=0.5), "head_dim cannot be combined with decay"),
    (dict(head_dim=0, n_heads=1), "head_dim"),
])
def test_invalid_head_dim_is_named(params, match):
    X = np.random.default_rng(0).normal(size=(20, 3, 2))
    with pytest.raises(ValueError, match=match):
        LinearAttentionRegressor(**params).fit(X, X[:, -1, 0])
