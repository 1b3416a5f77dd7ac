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
from sklearn_linattn.preprocessing import AppendConstant, PositionalEncoding  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402


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
    with pytest.raises(TypeError, match=r"SimpleNamespace has W_q, W_k, W_v but no W_o"):
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


# -- Standard layers: q_proj, k_proj, v_proj, o_proj ---------------------------------------


class ProjectedLinearAttention(torch.nn.Module):
    """Causal linear attention written as real layers write it (flash-linear-attention's names).

    ``o_t = o_proj(concat_h [scale sum_{s<=t} (q_t . k_s) v_s])`` with the heads' rows of
    each ``nn.Linear`` weight in order; grouped keys and values serve query head h with
    key-value head ``h // (num_heads // num_kv_heads)``.  The scale is ``self.scale`` if set,
    else ``1 / sqrt(head_k_dim)`` as flash-linear-attention's kernels assume.
    """

    def __init__(self, d, num_heads, head_k_dim, head_v_dim, *, d_out=None, num_kv_heads=None,
                 out_name="o_proj", out_bias=False, scale=None, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        kw = {"bias": qkv_bias, "dtype": torch.float64}
        self.q_proj = torch.nn.Linear(d, num_heads * head_k_dim, **kw)
        self.k_proj = torch.nn.Linear(d, self.num_kv_heads * head_k_dim, **kw)
        self.v_proj = torch.nn.Linear(d, self.num_kv_heads * head_v_dim, **kw)
        self.out_name = out_name
        setattr(self, out_name, torch.nn.Linear(num_heads * head_v_dim, d_out or d,
                                                bias=out_bias, dtype=torch.float64))
        if scale is not None:
            self.scale = scale

    def forward(self, x):
        B, T, _ = x.shape
        group = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_k_dim)
        k = self.k_proj(x).view(B, T, -1, self.head_k_dim).repeat_interleave(group, dim=2)
        v = self.v_proj(x).view(B, T, -1, self.head_v_dim).repeat_interleave(group, dim=2)
        scale = getattr(self, "scale", self.head_k_dim ** -0.5)
        scores = scale * torch.einsum("bthk,bshk->bhts", q, k)
        scores = scores * torch.ones(T, T, dtype=torch.bool).tril()
        o = torch.einsum("bhts,bshv->bthv", scores, v).reshape(B, T, -1)
        return getattr(self, self.out_name)(o)


def layer_outputs_of_heads(x, heads):
    """What the heads read back compute at every position, in NumPy (float64)."""
    y = mhla_forward(x, heads.value_matrices, heads.key_query_matrices, readout="all")
    return y if heads.intercept is None else y + heads.intercept


def assert_same_outputs(got, expected, rtol=1e-12):
    np.testing.assert_allclose(got, expected, rtol=0, atol=rtol * np.abs(expected).max())


@pytest.mark.parametrize("d, H, H_kv, d_k, d_v, d_out, out_name, out_bias, scale", [
    (4, 2, None, 2, 3, None, "o_proj", False, None),    # d_k < d, scale 1/sqrt(d_k)
    (3, 3, None, 5, 2, 2, "out_proj", True, 0.3),       # d_k > d, own scale, output bias
    (4, 4, 2, 2, 2, 3, "o_proj", True, None),           # grouped keys and values
    (2, 2, 1, 3, 1, 1, "o_proj", False, torch.tensor(0.7, dtype=torch.float64)),
])
def test_a_standard_layer_reads_back_to_what_it_computes(d, H, H_kv, d_k, d_v, d_out, out_name,
                                                         out_bias, scale):
    torch.manual_seed(H * 10 + d)
    layer = ProjectedLinearAttention(d, H, d_k, d_v, d_out=d_out, num_kv_heads=H_kv,
                                     out_name=out_name, out_bias=out_bias, scale=scale)
    heads = from_torch(layer)
    assert heads.readout == "all" and heads.skip_coef is None
    assert heads.value_matrices.shape == (H, d_out or d, d)
    assert (heads.intercept is not None) == out_bias
    x = torch.randn(3, 7, d, dtype=torch.float64)
    expected = layer(x).detach().numpy()
    assert_same_outputs(layer_outputs_of_heads(x.numpy(), heads), expected)
    # Read out at the last token, the same heads.
    last = from_torch(layer, readout="last")
    assert last.readout == "last"
    np.testing.assert_array_equal(last.key_query_matrices, heads.key_query_matrices)


def test_a_standard_layer_is_the_optimum_of_its_own_outputs():
    torch.manual_seed(0)
    layer = ProjectedLinearAttention(3, 2, 2, 2, d_out=1, out_bias=True)
    X = torch.randn(200, 5, 3, dtype=torch.float64)
    y = layer(X).detach().numpy()[..., 0]
    report = compare_to_optimum(from_torch(layer), X.numpy(), y)
    assert report.certificate and report.relative_p_distance < 1e-9
    np.testing.assert_allclose(report.optimum.predict(X.numpy()), y, rtol=0,
                               atol=1e-9 * np.abs(y).max())


def test_head_dim_and_scale_attributes_of_other_libraries():
    torch.manual_seed(1)
    layer = ProjectedLinearAttention(4, 2, 3, 3, scale=0.25)
    del layer.num_heads, layer.head_k_dim, layer.head_v_dim
    layer.head_dim = 3                          # the number of heads follows: 6 rows / 3
    layer.scaling, layer.scale = layer.scale, None   # Hugging Face's name; None is absent
    heads = from_torch(layer)
    layer.num_heads, layer.head_k_dim, layer.head_v_dim, layer.scale = 2, 3, 3, 0.25
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    assert_same_outputs(layer_outputs_of_heads(x.numpy(), heads), layer(x).detach().numpy())
    layer.head_dim = 2
    with pytest.raises(ValueError, match=r"module.head_dim = 2, but the projections have heads "
                                         r"of size 3"):
        from_torch(layer)


def test_an_explicit_mapping_reads_any_layer():
    torch.manual_seed(2)
    inner = ProjectedLinearAttention(3, 2, 2, 3, d_out=2, out_bias=True)
    block = torch.nn.Module()
    block.attn = torch.nn.Module()
    block.attn.wq, block.attn.wk, block.attn.wv = inner.q_proj, inner.k_proj, inner.v_proj
    block.attn.out = inner.o_proj
    block.attn.heads = 2
    block.attn.temperature = torch.tensor(2 ** -0.5, dtype=torch.float64)
    # A block around the layer may normalize; only the layer holding the projections counts.
    block.norm = torch.nn.LayerNorm(3)
    names = {"q": "attn.wq", "k": "attn.wk", "v": "attn.wv.weight", "o": "attn.out",
             "n_heads": "attn.heads", "scale": "attn.temperature"}
    heads = from_torch(block, names=names)
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    assert_same_outputs(layer_outputs_of_heads(x.numpy(), heads), inner(x).detach().numpy())
    # The numbers as keywords instead; no output projection.
    heads = from_torch(block, names={"q": "attn.wq", "k": "attn.wk", "v": "attn.wv", "o": None},
                       n_heads=2)
    assert heads.value_matrices.shape == (2, 6, 3) and heads.intercept is None
    np.testing.assert_allclose(heads.key_query_matrices[0], 2 ** -0.5 * (
        numpy_of(inner.k_proj.weight[:2]).T @ numpy_of(inner.q_proj.weight[:2])), rtol=1e-14)


def test_a_module_that_cannot_be_read_says_what_was_looked_for():
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = torch.nn.Linear(4, 4)

    with pytest.raises(TypeError, match=r"cannot find the projections of Attention: it looked "
                                        r"for the attributes W_q, W_k, W_v, W_o .* q_proj, "
                                        r"k_proj, v_proj, o_proj or out_proj .*num_heads or "
                                        r"n_heads.*names=\{'q'.*heads_from_projections"):
        from_torch(Attention())
    layer = ProjectedLinearAttention(4, 2, 2, 2)
    del layer.o_proj
    with pytest.raises(TypeError, match=r"has q_proj, k_proj, v_proj but no o_proj or out_proj"):
        from_torch(layer)
    layer = ProjectedLinearAttention(4, 2, 2, 2)
    del layer.num_heads, layer.head_k_dim
    with pytest.raises(ValueError, match=r"number of heads of ProjectedLinearAttention is unknown"
                                         r".*num_heads, n_heads.*Pass n_heads="):
        from_torch(layer)
    layer.num_heads = 3
    with pytest.raises(ValueError, match=r"module.q_proj.weight has 4 rows, not a multiple of "
                                         r"module.num_heads = 3"):
        from_torch(layer)


@pytest.mark.parametrize("names, error, match", [
    ({"q": "q_proj", "k": "k_proj", "v": "v_proj"}, ValueError,
     r"keys 'q', 'k', 'v' and 'o'.*no 'o'"),
    ({"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": None, "heads": "x"}, ValueError,
     r"unknown keys 'heads'"),
    ({"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": None, "n_heads": 2}, TypeError,
     r"names\['n_heads'\] must be the name of an attribute.*pass the number itself as n_heads"),
    ({"q": "wq", "k": "k_proj", "v": "v_proj", "o": None}, ValueError,
     r"names\['q'\] = 'wq' is not an attribute of ProjectedLinearAttention"),
    ({"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": None, "scale": "temp"}, ValueError,
     r"names gives 'temp' for the factor of every score"),
    (["q_proj"], TypeError, r"names must be None or a mapping"),
])
def test_a_malformed_mapping_is_refused_by_key(names, error, match):
    with pytest.raises(error, match=match):
        from_torch(ProjectedLinearAttention(4, 2, 2, 2), names=names)


@pytest.mark.parametrize("H_kv", [None, 1])
def test_biases_on_q_k_v_are_read_as_heads_on_tokens_with_a_constant(H_kv):
    """A layer with q, k and v biases is the package's attention on [x; 1]: read exactly, and
    written back by to_torch (biases then in the package's layer) to rounding."""
    torch.manual_seed(3)
    layer = ProjectedLinearAttention(3, 2, 2, 2, num_kv_heads=H_kv, qkv_bias=True,
                                     out_bias=True)
    heads = from_torch(layer)
    assert heads.constant == 1.0 and heads.value_matrices.shape == (2, 3, 4)
    assert heads.key_query_matrices.shape == (2, 4, 4)
    x = torch.randn(3, 5, 3, dtype=torch.float64)
    z = AppendConstant().fit_transform(x.numpy())
    assert_same_outputs(layer_outputs_of_heads(z, heads), layer(x).detach().numpy())
    back = to_torch(heads)
    assert back.b_q is not None and back.W_q.shape[2] == 3
    assert_same_outputs(back(x).detach().numpy(), layer(x).detach().numpy(), rtol=1e-10)
    # Only some projections with a bias: the others' column is zero.
    with torch.no_grad():
        layer.k_proj.bias = None
    assert_same_outputs(layer_outputs_of_heads(z, from_torch(layer)),
                        layer(x).detach().numpy())


@pytest.mark.parametrize("readout", ["last", "all"])
def test_the_package_layer_with_biases_round_trips_with_padding(readout):
    """The package's layer with qkv_bias: padded tokens have no key and no value (their bias
    included), and from_torch / to_torch keep the function (decays, skip and bias too)."""
    torch.manual_seed(4)
    layer = MultiHeadLinearAttention(3, n_heads=2, d_k=2, d_out=2, qkv_bias=True, bias=True,
                                     skip=True, readout=readout, decay=[0.9, 0.5],
                                     dtype=torch.float64)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_()
    x = torch.randn(4, 6, 3, dtype=torch.float64)
    x[1, 3:] = float("nan")
    heads = from_torch(layer)
    z = AppendConstant().fit_transform(x.numpy())
    lengths = (~np.isnan(z[..., 0])).sum(axis=1)
    y = mhla_forward(z, heads.value_matrices, heads.key_query_matrices, readout=readout,
                     decays=heads.decays) + heads.intercept
    rows = z[np.arange(4), lengths - 1] if readout == "last" else np.nan_to_num(z)
    y = y + rows @ heads.skip_coef.T
    expected = layer(x).detach().numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12 * np.nanmax(np.abs(y)))
    back = to_torch(heads)(x).detach().numpy()
    np.testing.assert_allclose(back, expected, rtol=1e-10, atol=1e-10 * np.nanmax(np.abs(y)))


def test_a_pipeline_with_a_constant_fits_and_writes_a_biased_layer():
    """make_pipeline(AppendConstant(), LinearAttentionRegressor(fit_intercept=True)) fits the
    class of layers with biases exactly, and to_torch of the Pipeline writes one."""
    torch.manual_seed(5)
    layer = MultiHeadLinearAttention(3, n_heads=2, d_k=2, d_out=2, qkv_bias=True, bias=True,
                                     dtype=torch.float64)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 7, 3))
    X[np.arange(7)[None] >= rng.integers(2, 8, size=600)[:, None]] = np.nan
    y = layer(torch.as_tensor(X)).detach().numpy()
    pipe = make_pipeline(AppendConstant(), LinearAttentionRegressor(fit_intercept=True))
    pipe.fit(X, y)
    assert pipe[-1].certificate_
    X_new = torch.randn(5, 9, 3, dtype=torch.float64)
    expected = layer(X_new).detach().numpy()
    assert_same_outputs(pipe.predict(X_new.numpy()), expected, rtol=1e-9)
    assert_same_outputs(to_torch(pipe)(X_new).detach().numpy(), expected, rtol=1e-9)
    with pytest.raises(ValueError, match="Pipeline of AppendConstant"):
        to_torch(make_pipeline(PositionalEncoding(), LinearAttentionRegressor()))


@pytest.mark.parametrize("attr, value, what", [
    ("feature_map_q", torch.nn.ReLU(), r"module.feature_map_q is ReLU: the layer applies a "
                                       r"feature map on the queries"),
    ("norm", torch.nn.LayerNorm(2), r"module.norm is LayerNorm: .*normalization"),
    ("do_feature_map_norm", True, r"module.do_feature_map_norm is True"),
    ("gk_proj", torch.nn.Linear(3, 2), r"module.gk_proj is Linear: the layer applies a gate"),
])
def test_a_layer_with_another_stage_is_refused(attr, value, what):
    layer = ProjectedLinearAttention(3, 1, 2, 2)
    setattr(layer, attr, value)
    with pytest.raises(ValueError, match=what + r".*heads_from_projections"):
        from_torch(layer)
    setattr(layer, attr, torch.nn.Identity() if isinstance(value, torch.nn.Module) else False)
    from_torch(layer)


def test_a_gated_layer_of_flash_linear_attention_is_refused():
    gated = type("GatedLinearAttention", (ProjectedLinearAttention,),
                 {"__module__": "fla.layers.gla"})
    with pytest.raises(ValueError, match=r"flash-linear-attention's GatedLinearAttention"):
        from_torch(gated(3, 1, 2, 2))
    plain = type("LinearAttention", (ProjectedLinearAttention,),
                 {"__module__": "fla.layers.linear_attn"})
    from_torch(plain(3, 1, 2, 2))


def package_layout(**weights):
    """A duck-typed object of MultiHeadLinearAttention's layout, the given weights replaced."""
    base = {"W_q": torch.zeros(1, 2, 2), "W_k": torch.zeros(1, 2, 2),
            "W_v": torch.zeros(1, 2, 2), "W_o": torch.zeros(2, 2), "scale": 0.5,
            "readout": "all"}
    return SimpleNamespace(**{**base, **weights})


@pytest.mark.parametrize("module, error, match", [
    (package_layout(W_q=torch.zeros(1, 2, 2, dtype=torch.complex64)), TypeError,
     r"module.W_q must be a real tensor; got a complex tensor of dtype torch.complex64"),
    (package_layout(W_k=torch.zeros(1, 2, 2, device="meta")), ValueError,
     r"module.W_k is a tensor on the meta device: it has a shape, \(1, 2, 2\), but no values"),
    (package_layout(W_v=torch.zeros(1).expand(10**6, 10**6)), ValueError,
     r"module.W_v of shape \(1000000, 1000000\) would take 7.28 TiB as float64, more than "
     r"the memory budget"),
    (package_layout(W_o=torch.zeros(2, 2).to_sparse()), TypeError,
     r"module.W_o must be a dense tensor; got a tensor of layout torch.sparse_coo"),
    (package_layout(scale=torch.ones(2)), ValueError,
     r"module.scale must be one number, the factor of every score; got a Tensor of shape \(2,\)"),
    (package_layout(scale=torch.ones(1, device="meta")), ValueError,
     r"module.scale is a tensor on the meta device"),
    (package_layout(scale=-1.0), ValueError, r"module.scale must be a real number > 0.0"),
    (package_layout(W_q=torch.full((1, 2, 2), math.inf)), ValueError,
     r"module.W_q must be finite; got inf at module.W_q\[0, 0, 0\]"),
    # Heads of d x d per head: d = 10**6 is 7.28 TiB, refused before the product.
    (package_layout(W_q=torch.zeros(1, 1, 1).expand(1, 1, 10**6),
                    W_k=torch.zeros(1, 1, 1).expand(1, 1, 10**6),
                    W_v=torch.zeros(1, 1, 1).expand(1, 1, 10**6), W_o=None), ValueError,
     r"the heads V of shape \(1, 1, 1000000\) and Q of shape \(1, 1000000, 1000000\) would take"),
])
def test_weights_that_cannot_be_read_are_refused_by_name(module, error, match):
    with pytest.raises(error, match=match):
        from_torch(module)


def test_a_one_element_scale_and_any_real_dtype_are_read():
    layer = MultiHeadLinearAttention(3, 2, dtype=torch.float64)
    reference = from_torch(layer)
    layer.scale = torch.tensor([layer.scale], dtype=torch.float64)
    np.testing.assert_array_equal(from_torch(layer).key_query_matrices,
                                  reference.key_query_matrices)
    half = from_torch(layer.to(torch.bfloat16))
    np.testing.assert_allclose(half.key_query_matrices, reference.key_query_matrices,
                               rtol=0.05, atol=0.05 * np.abs(reference.key_query_matrices).max())
    # The keyword overrides the layer's own.
    np.testing.assert_allclose(from_torch(layer, scale=2 * float(layer.scale)).key_query_matrices,
                               2 * half.key_query_matrices)


# -- NaN padding into the module -------------------------------------------------------------


@pytest.mark.parametrize("readout, d_out, affine", [
    ("last", 1, False), ("all", 1, False), ("last", 2, True), ("all", 2, True),
])
def test_a_nan_padded_batch_gives_what_predict_gives(readout, d_out, affine):
    model = fitted(readout, d_out)
    if affine:
        rng = np.random.default_rng(12)
        model.intercept_ = rng.normal(size=d_out)
        model.skip_coef_ = rng.normal(size=(d_out, 3))
    layer = to_torch(model)
    x, mask, _ = padded_batch(np.random.default_rng(13), 6, 9, 3)
    expected = model.predict(x)
    if d_out == 1:
        expected = expected[..., None]
    y = layer(torch.as_tensor(x)).detach().numpy()
    assert np.array_equal(np.isnan(y), np.isnan(expected))   # NaN exactly at padded positions
    np.testing.assert_allclose(y, expected, rtol=1e-10,
                               atol=1e-10 * np.nanmax(np.abs(expected)))
    # With the mask instead: the same values, zero (not NaN) at padded positions.
    masked = layer(torch.as_tensor(x), torch.as_tensor(mask)).detach().numpy()
    np.testing.assert_array_equal(masked, np.nan_to_num(y, nan=0.0))


def test_nan_padding_trains_like_a_mask():
    layer = MultiHeadLinearAttention(3, 2, readout="last", bias=True, skip=True,
                                     dtype=torch.float64)
    x, mask, _ = padded_batch(np.random.default_rng(14), 4, 5, 3)
    grads = []
    for args in ((torch.as_tensor(x),), (torch.as_tensor(x), torch.as_tensor(mask))):
        layer.zero_grad()
        (layer(*args) ** 2).sum().backward()
        grads.append([p.grad.clone() for p in layer.parameters()])
    for nan_padded, masked in zip(*grads):
        assert torch.isfinite(nan_padded).all()
        assert torch.equal(nan_padded, masked)


@pytest.mark.parametrize("row, match", [
    ((1, 2, [np.nan, 0.0, np.nan]), r"x\[1, 2\] is partly NaN: a token is either real"),
    ((0, 1, [np.nan] * 3), r"x\[0, 1\] is an all-NaN token followed by real tokens"),
])
def test_malformed_nan_padding_is_refused_like_predict(row, match):
    x = np.ones((2, 4, 3))
    i, t, value = row
    x[i, t] = value
    layer = MultiHeadLinearAttention(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=match):
        layer(torch.as_tensor(x))
    model = fitted("last", 1)
    with pytest.raises(ValueError, match=match.replace("x", "X", 1)):
        model.predict(x)


def test_an_all_padding_sequence_is_refused():
    x = torch.ones(3, 2, 2, dtype=torch.float64)
    x[2] = float("nan")
    with pytest.raises(ValueError, match=r"x\[2\] is an empty sequence"):
        MultiHeadLinearAttention(2, dtype=torch.float64)(x)


# -- Estimators whose fitted attributes are not heads ----------------------------------------


@pytest.mark.parametrize("attribute, value, match", [
    ("value_matrices_", np.nan, r"the estimator's value_matrices_ must be finite \(value "
                                r"matrices of shape \(n_heads, d_out, d\)\); got nan at "
                                r"value_matrices_\[0, 0, 0\].*Refit"),
    ("key_query_matrices_", np.inf, r"the estimator's key_query_matrices_ must be finite .*inf"),
    ("intercept_", np.nan, r"the estimator's intercept_ must be finite"),
])
def test_to_torch_names_a_fitted_attribute_that_is_not_finite(attribute, value, match):
    model = fitted("last", 1)
    model.intercept_ = np.zeros(1)
    setattr(model, attribute, np.array(getattr(model, attribute), dtype=float))
    getattr(model, attribute).flat[0] = value
    with pytest.raises(ValueError, match=match):
        to_torch(model)


def test_to_torch_names_a_fitted_attribute_of_the_wrong_shape():
    model = fitted("last", 1)
    model.key_query_matrices_ = model.key_query_matrices_[:, :2]
    with pytest.raises(ValueError, match=r"the estimator's value_matrices_ must have shape "
                                         r"\(n_heads, d_out, d\) and its key_query_matrices_"):
        to_torch(model)
