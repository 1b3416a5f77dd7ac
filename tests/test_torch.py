"""The PyTorch layer against a loop reference; estimators to modules and back; tensor input."""

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sklearn_linattn import (  # noqa: E402
    AdamLinearAttentionRegressor,
    LinearAttentionRegressor,
    attention_coefficients,
    compare_to_optimum,
    mhla_forward,
)
from sklearn_linattn.nn import MultiHeadLinearAttention, from_torch, to_torch  # noqa: E402


def loop_module(x, lengths, W_q, W_k, W_v, W_o, scale, bias, skip, readout):
    """y_t = b + skip x_t + W_o concat_h [scale sum_{s<=t} (q_t . k_s) v_s], by loops.

    Float64 NumPy arrays; returns (batch, d_out) for "last" and
    (batch, n_tokens, d_out), zero at padded positions, for "all".
    """
    batch, n_tokens, _ = x.shape
    H, d_v = W_v.shape[:2]
    d_out = W_o.shape[0]
    out = np.zeros((batch, n_tokens, d_out))
    for i in range(batch):
        for t in range(lengths[i]):
            concat = np.zeros(H * d_v)
            for h in range(H):
                for s in range(t + 1):
                    score = float((W_q[h] @ x[i, t]) @ (W_k[h] @ x[i, s]))
                    concat[h * d_v:(h + 1) * d_v] += scale * score * (W_v[h] @ x[i, s])
            out[i, t] = W_o @ concat
            if bias is not None:
                out[i, t] += bias
            if skip is not None:
                out[i, t] += skip @ x[i, t]
    if readout == "last":
        return out[np.arange(batch), np.asarray(lengths) - 1]
    return out


def numpy_of(t):
    return None if t is None else t.detach().to(torch.float64).numpy()


def padded_batch(rng, batch, n_tokens, d, *, min_length=1):
    """NaN-padded sequences of mixed lengths, their mask and lengths."""
    lengths = rng.integers(min_length, n_tokens + 1, size=batch)
    lengths[0] = n_tokens
    x = rng.normal(size=(batch, n_tokens, d))
    mask = np.arange(n_tokens)[None, :] < lengths[:, None]
    x[~mask] = np.nan
    return x, mask, lengths


CASES = list(itertools.product(
    [(3, 1, 3), (3, 2, 3), (3, 5, 2)],   # (d, d_k, d_v): d_k < d, = d, > d
    [1, 2, 4],                             # heads
    ["last", "all"],
    [torch.float64, torch.float32],
))


@pytest.mark.parametrize("sizes, H, readout, dtype", CASES)
def test_module_is_the_loop_formula(sizes, H, readout, dtype):
    d, d_k, d_v = sizes
    seed = CASES.index((sizes, H, readout, dtype))
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    affine = bool(rng.integers(2))
    layer = MultiHeadLinearAttention(d, H, d_k=d_k, d_v=d_v, d_out=2, readout=readout,
                                     bias=affine, skip=not affine, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    x, mask, lengths = padded_batch(rng, 5, 6, d)
    y = layer(torch.as_tensor(x, dtype=dtype), torch.as_tensor(mask))
    assert y.dtype == dtype and not torch.isnan(y).any()
    expected = loop_module(np.where(mask[..., None], x, np.nan), lengths,
                           *map(numpy_of, (layer.W_q, layer.W_k, layer.W_v, layer.W_o)),
                           layer.scale, numpy_of(layer.bias), numpy_of(layer.skip), readout)
    tol = 1e-10 if dtype == torch.float64 else 1e-3
    scale = np.abs(expected).max()
    np.testing.assert_allclose(numpy_of(y), expected, rtol=tol, atol=tol * scale)
    heads = from_torch(layer)
    got = mhla_forward(x, heads.value_matrices, heads.key_query_matrices, readout=readout)
    last = np.where(mask, np.arange(6), 0).max(axis=1)
    x_out = x[np.arange(5), last] if readout == "last" else x
    if heads.intercept is not None:
        got = got + heads.intercept
    if heads.skip_coef is not None:
        got = got + x_out @ heads.skip_coef.T
    if readout == "all":
        got = np.where(mask[..., None], got, 0.0)
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * scale)


def test_without_mask_every_token_is_real():
    layer = MultiHeadLinearAttention(2, 2, readout="all", dtype=torch.float64)
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    full = torch.ones(3, 4, dtype=torch.bool)
    assert torch.equal(layer(x), layer(x, full))
    layer.readout = "last"
    assert torch.equal(layer(x), layer(x, full))


def fitted(readout, d_out, *, n_heads=2, d=3, n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5, d))
    V, Q = rng.normal(size=(n_heads, d_out, d)), rng.normal(size=(n_heads, d, d))
    Y = mhla_forward(X, V, Q, readout=readout)
    y = Y[..., 0] if d_out == 1 else Y
    return LinearAttentionRegressor(n_heads=n_heads, readout=readout).fit(X, y)


def relative_error(Va, Qa, Vb, Qb):
    pa, pb = attention_coefficients(Va, Qa), attention_coefficients(Vb, Qb)
    return np.linalg.norm(pa - pb) / np.linalg.norm(pb)


@pytest.mark.parametrize("readout, d_out, d_k, d_v", [
    ("last", 1, None, None), ("all", 2, None, None), ("last", 2, 1, 1), ("all", 1, 2, None),
    ("last", 3, 4, 3),
])
def test_estimator_to_module_and_back(readout, d_out, d_k, d_v):
    model = fitted(readout, d_out)
    layer = to_torch(model, d_k=d_k, d_v=d_v)
    assert layer.readout == readout and layer.bias is None and layer.skip is None
    assert layer.W_q.shape[1] == (d_k or 3) and layer.W_q.dtype == torch.float64
    heads = from_torch(layer)
    assert heads.readout == readout and heads.intercept is None and heads.skip_coef is None
    assert relative_error(heads.value_matrices, heads.key_query_matrices,
                          model.value_matrices_, model.key_query_matrices_) <= 1e-12
    # Longer sequences than in training, of mixed lengths.
    x, mask, _ = padded_batch(np.random.default_rng(1), 7, 12, 3)
    y = layer(torch.as_tensor(x), torch.as_tensor(mask)).detach().numpy()
    expected = model.predict(x)
    if d_out == 1:
        expected = expected[..., None]   # the module keeps the output axis
    if readout == "all":
        expected = np.where(mask[..., None], expected, 0.0)
    np.testing.assert_allclose(y, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


def test_a_small_d_k_gives_more_heads_than_the_estimator():
    model = fitted("last", 1, n_heads=2)
    layer = to_torch(model, d_k=1)
    ranks = np.linalg.matrix_rank(model.key_query_matrices_)
    assert layer.n_heads == ranks.sum() > 2


def test_float32_module_is_close():
    model = fitted("all", 2)
    layer = to_torch(model, dtype=torch.float32)
    x, mask, _ = padded_batch(np.random.default_rng(2), 4, 8, 3)
    y = layer(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(mask))
    expected = np.where(mask[..., None], model.predict(x), 0.0)
    np.testing.assert_allclose(numpy_of(y), expected, rtol=1e-4,
                               atol=1e-4 * np.abs(expected).max())


def test_intercept_and_skip_become_bias_and_skip():
    model = fitted("all", 2)
    rng = np.random.default_rng(3)
    model.intercept_ = rng.normal(size=2)
    model.skip_coef_ = rng.normal(size=(2, 3))
    layer = to_torch(model)
    np.testing.assert_array_equal(numpy_of(layer.bias), model.intercept_)
    np.testing.assert_array_equal(numpy_of(layer.skip), model.skip_coef_)
    x, mask, _ = padded_batch(rng, 4, 6, 3)
    attention = mhla_forward(x, model.value_matrices_, model.key_query_matrices_,
                             readout="all")
    expected = attention + model.intercept_ + np.nan_to_num(x) @ model.skip_coef_.T
    expected = np.where(mask[..., None], expected, 0.0)
    y = layer(torch.as_tensor(x), torch.as_tensor(mask)).detach().numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max())
    heads = from_torch(layer)
    np.testing.assert_allclose(heads.intercept, model.intercept_, rtol=0, atol=0)
    np.testing.assert_allclose(heads.skip_coef, model.skip_coef_, rtol=0, atol=0)
    model.intercept_ = np.zeros(2)
    model.skip_coef_ = np.zeros((2, 3))
    assert to_torch(model).bias is None and to_torch(model).skip is None


def test_adam_estimator_converts():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(64, 4, 2))
    y = mhla_forward(X, rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 2, 2)))[:, 0]
    model = AdamLinearAttentionRegressor(max_epochs=2, random_state=0).fit(X, y)
    layer = to_torch(model)
    y_torch = layer(torch.as_tensor(X)).detach().numpy()[:, 0]
    np.testing.assert_allclose(y_torch, model.predict(X), rtol=1e-9, atol=1e-12)


def test_gradients_flow():
    layer = MultiHeadLinearAttention(3, 2, d_k=2, d_v=2, d_out=1, readout="all", bias=True,
                                     skip=True, dtype=torch.float64)
    x, mask, _ = padded_batch(np.random.default_rng(5), 4, 5, 3)
    y = layer(torch.as_tensor(x), torch.as_tensor(mask))
    loss = (y ** 2).sum()
    loss.backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_duck_typed_module_with_fused_weights():
    rng = np.random.default_rng(6)
    H, d_k, d_v, d = 2, 2, 3, 3
    W_q, W_k = rng.normal(size=(2, H * d_k, d))
    W_v = rng.normal(size=(H * d_v, d))
    W_o = rng.normal(size=(1, H * d_v))
    module = SimpleNamespace(
        W_q=torch.as_tensor(W_q, dtype=torch.float32), W_k=torch.as_tensor(W_k),
        W_v=torch.as_tensor(W_v), W_o=torch.as_tensor(W_o), scale=torch.tensor(0.5),
        n_heads=H)
    heads = from_torch(module, readout="last")
    x = rng.normal(size=(1, 4, d))
    expected = loop_module(x, [4], np.float32(W_q).astype(float).reshape(H, d_k, d),
                           W_k.reshape(H, d_k, d), W_v.reshape(H, d_v, d), W_o, 0.5,
                           None, None, "last")
    np.testing.assert_allclose(mhla_forward(x, heads.value_matrices, heads.key_query_matrices),
                               expected, rtol=1e-10)
    with pytest.raises(ValueError, match=r"readout must be 'last' or 'all' when the module"):
        from_torch(module)
    with pytest.raises(TypeError, match=r"SimpleNamespace has no W_o"):
        from_torch(SimpleNamespace(W_q=W_q, W_k=W_k, W_v=W_v), readout="last")


def test_forward_refuses_malformed_input():
    layer = MultiHeadLinearAttention(2, dtype=torch.float64)
    x = torch.zeros(2, 3, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"x must have the parameters' dtype torch.float64"):
        layer(x.float())
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor .*got ndarray"):
        layer(np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match=r"x must have shape \(batch, n_tokens >= 1, d=2\)"):
        layer(torch.zeros(2, 3, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"mask must be None or a bool"):
        layer(x, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask must have shape \(batch, n_tokens\) = \(2, 3\)"):
        layer(x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"padding trails.*mask\[1\] = \[1, 0, 1\]"):
        layer(x, torch.tensor([[True, True, True], [True, False, True]]))
    with pytest.raises(ValueError, match=r"at least one real token.*mask\[0\] = \[0, 0, 0\]"):
        layer(x, torch.tensor([[False] * 3, [True] * 3]))
    with pytest.raises(ValueError, match=r"readout must be one of"):
        MultiHeadLinearAttention(2, readout="first")
    with pytest.raises(TypeError, match=r"dtype must be torch.float32 or torch.float64"):
        MultiHeadLinearAttention(2, dtype=torch.int64)


def test_default_scale_and_repr():
    layer = MultiHeadLinearAttention(4, 2, d_k=16)
    assert layer.scale == 0.25 and layer.W_q.dtype == torch.get_default_dtype()
    assert "n_heads=2, d_k=16" in repr(layer)


# -- Tensors as estimator input ----------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
def test_fit_on_tensors_equals_fit_on_arrays(readout):
    rng = np.random.default_rng(7)
    X, mask, _ = padded_batch(rng, 120, 5, 2, min_length=2)
    Y = mhla_forward(X, rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 2, 2)),
                     readout=readout)[..., 0]
    w = rng.uniform(0.5, 2.0, size=120)
    arrays = LinearAttentionRegressor(readout=readout).fit(X, Y, sample_weight=w)
    tensors = LinearAttentionRegressor(readout=readout).fit(
        torch.as_tensor(X), torch.as_tensor(Y), sample_weight=torch.as_tensor(w))
    np.testing.assert_array_equal(tensors.coef_, arrays.coef_)
    np.testing.assert_array_equal(tensors.predict(torch.as_tensor(X)), arrays.predict(X))
    listed = LinearAttentionRegressor(readout=readout).fit(
        [torch.as_tensor(X[i, mask[i]]) for i in range(120)], Y, sample_weight=w)
    np.testing.assert_allclose(listed.coef_, arrays.coef_, rtol=1e-12)
    float32 = LinearAttentionRegressor(readout=readout).fit(
        torch.as_tensor(X, dtype=torch.float32), Y)
    np.testing.assert_array_equal(
        float32.coef_, LinearAttentionRegressor(readout=readout).fit(np.float32(X), Y).coef_)


def test_tensors_numpy_cannot_read_are_refused_by_name():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(30, 4, 2))
    y = rng.normal(size=30)
    model = LinearAttentionRegressor().fit(X, y)
    with pytest.raises(TypeError, match=r"X is a tensor that requires grad.*X.detach\(\).cpu\(\)"):
        model.predict(torch.tensor(X, requires_grad=True))
    with pytest.raises(TypeError, match=r"y is a tensor that requires grad.*y.detach\(\).cpu"):
        LinearAttentionRegressor().fit(X, torch.tensor(y, requires_grad=True))
    with pytest.raises(TypeError, match=r"X\[0\] is a tensor that requires grad"):
        model.predict([torch.tensor(X[0], requires_grad=True)])
    # A CUDA tensor, without a GPU: only its device is read before the refusal.
    cuda = SimpleNamespace(device=SimpleNamespace(type="cuda"), requires_grad=False,
                           shape=X.shape, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"X is a tensor that is on the cuda device.*\.cpu\(\)"):
        model.predict(cuda)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_tensor_is_refused():
    model = LinearAttentionRegressor().fit(np.ones((10, 3, 1)) * np.arange(10)[:, None, None],
                                           np.arange(10.0))
    with pytest.raises(TypeError, match=r"on the cuda device"):
        model.predict(torch.ones(2, 3, 1, device="cuda"))


def test_to_torch_refuses_an_unfitted_estimator():
    from sklearn.exceptions import NotFittedError
    with pytest.raises(NotFittedError):
        to_torch(LinearAttentionRegressor())
    with pytest.raises(TypeError, match=r"dtype must be torch.float32 or torch.float64"):
        to_torch(fitted("last", 1), dtype=torch.float16)


def test_scale_is_the_default_of_the_factorization():
    layer = to_torch(fitted("last", 1), d_k=2)
    assert layer.scale == pytest.approx(1 / math.sqrt(2))


@pytest.mark.parametrize("readout", ["last", "all"])
def test_a_fit_with_intercept_and_skip_round_trips_through_torch(readout):
    rng = np.random.default_rng(11)
    X = rng.normal(size=(80, 5, 3))
    V, Q = rng.normal(size=(1, 2, 3)), rng.normal(size=(1, 3, 3))
    b, W = rng.normal(size=2), rng.normal(size=(2, 3))
    x_row = X[:, -1] if readout == "last" else X
    y = mhla_forward(X, V, Q, readout=readout) + b + x_row @ W.T
    model = LinearAttentionRegressor(readout, fit_intercept=True, fit_skip=True,
                                     n_heads=1, random_state=0).fit(X, y)
    layer = to_torch(model)
    X_long = rng.normal(size=(3, 12, 3))  # longer than training
    out = layer(torch.as_tensor(X_long)).detach().numpy()
    np.testing.assert_allclose(out, model.predict(X_long), rtol=1e-10,
                               atol=1e-10 * np.abs(out).max())
    heads = from_torch(layer)
    np.testing.assert_allclose(heads.intercept, b, atol=1e-9)
    np.testing.assert_allclose(heads.skip_coef, W, atol=1e-9)
    # The layer analysed against the optimum of the data, from its converted heads.
    report = compare_to_optimum(heads, X, y)
    assert report.certificate and report.relative_p_distance < 1e-8
    assert report.excess_risk < 1e-12 * np.mean(y**2)
