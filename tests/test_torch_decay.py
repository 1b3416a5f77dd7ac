"""Fixed per-head decays in the PyTorch layer, to_torch and from_torch, against loop references."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import BaseEstimator

torch = pytest.importorskip("torch")

from sklearn_linattn.nn import MultiHeadLinearAttention, from_torch, to_torch  # noqa: E402


def loop_layer(x, lengths, W_q, W_k, W_v, W_o, scale, decays, readout):
    """o_t = W_o concat_h [scale sum_{s<=t} gamma_h^(t-s) (q_t . k_s) v_s], by loops.

    Float64 arrays; ``decays`` None is no decay.  Returns (batch, d_out) at the
    last real token for "last", (batch, n_tokens, d_out) with zeros at padded
    positions for "all".
    """
    batch, n_tokens, _ = x.shape
    H, d_v = W_v.shape[:2]
    out = np.zeros((batch, n_tokens, W_o.shape[0]))
    for i in range(batch):
        for t in range(lengths[i]):
            concat = np.zeros(H * d_v)
            for h in range(H):
                gamma = 1.0 if decays is None else decays[h]
                for s in range(t + 1):
                    score = float((W_q[h] @ x[i, t]) @ (W_k[h] @ x[i, s]))
                    concat[h * d_v:(h + 1) * d_v] += (
                        gamma ** (t - s) * scale * score * (W_v[h] @ x[i, s]))
            out[i, t] = W_o @ concat
    if readout == "last":
        return out[np.arange(batch), np.asarray(lengths) - 1]
    return out


def loop_heads(x, lengths, V, Q, decays, readout):
    """y_t = sum_h V_h S_t^(h) Q_h x_t, S_t^(h) = sum_{s<=t} gamma_h^(t-s) x_s x_s^T, by loops."""
    batch, n_tokens, d = x.shape
    out = np.zeros((batch, n_tokens, V.shape[1]))
    for i in range(batch):
        for t in range(lengths[i]):
            for h in range(len(V)):
                gamma = 1.0 if decays is None else decays[h]
                S = np.zeros((d, d))
                for s in range(t + 1):
                    S += gamma ** (t - s) * np.outer(x[i, s], x[i, s])
                out[i, t] += V[h] @ S @ Q[h] @ x[i, t]
    if readout == "last":
        return out[np.arange(batch), np.asarray(lengths) - 1]
    return out


def numpy_of(t):
    return t.detach().to(torch.float64).numpy()


def weights_of(layer):
    return [numpy_of(W) for W in (layer.W_q, layer.W_k, layer.W_v, layer.W_o)]


def padded_batch(rng, lengths, d):
    """NaN-padded sequences of the given lengths and their mask."""
    lengths = np.asarray(lengths)
    n_tokens = int(lengths.max())
    x = rng.normal(size=(len(lengths), n_tokens, d))
    mask = np.arange(n_tokens)[None, :] < lengths[:, None]
    x[~mask] = np.nan
    return x, mask


def random_layer(d, H, *, seed, dtype=torch.float64, **kwargs):
    torch.manual_seed(seed)
    layer = MultiHeadLinearAttention(d, H, dtype=dtype, **kwargs)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    return layer


def run(layer, x, mask, masked):
    """The layer on NaN-padded x, given the mask or finding the NaN padding itself."""
    xt = torch.as_tensor(x, dtype=layer.W_q.dtype)
    return layer(xt, torch.as_tensor(mask)) if masked else layer(xt)


def assert_close(got, expected, tol=1e-10):
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.abs(expected).max())


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("masked", [True, False])
def test_layer_is_the_loop_formula(readout, masked):
    rng = np.random.default_rng(0)
    decays = [0.9, 0.3, 1.0]
    layer = random_layer(3, 3, d_k=2, d_v=4, d_out=2, readout=readout, decay=decays, seed=0)
    x, mask = padded_batch(rng, [6, 4, 1, 5], 3)
    y = numpy_of(run(layer, x, mask, masked))
    expected = loop_layer(np.nan_to_num(x), mask.sum(axis=1), *weights_of(layer),
                          layer.scale, decays, readout)
    if readout == "all" and not masked:
        assert np.array_equal(np.isnan(y[..., 0]), ~mask)  # NaN at NaN-padded positions
        y = np.where(mask[..., None], y, 0.0)
    assert_close(y, expected)
    # The decays change the outputs: a sequence of one token is the only one they do not.
    plain = loop_layer(np.nan_to_num(x), mask.sum(axis=1), *weights_of(layer),
                       layer.scale, None, readout)
    assert not np.allclose(expected, plain)


decay_values = st.sampled_from([1.0, 1e-3, 0.5, 0.9, 0.99]) | st.floats(0.01, 1.0)


@st.composite
def layer_cases(draw):
    H = draw(st.integers(1, 3))
    return {
        "d": draw(st.integers(1, 3)),
        "H": H,
        "d_k": draw(st.integers(1, 4)),
        "d_v": draw(st.integers(1, 3)),
        "readout": draw(st.sampled_from(["last", "all"])),
        "decays": draw(st.lists(decay_values, min_size=H, max_size=H)),
        "lengths": draw(st.lists(st.integers(1, 7), min_size=1, max_size=4)),
        "masked": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=20)
@given(case=layer_cases())
def test_layer_is_the_loop_formula_property(case):
    layer = random_layer(case["d"], case["H"], d_k=case["d_k"], d_v=case["d_v"], d_out=2,
                         readout=case["readout"], decay=case["decays"], seed=case["seed"])
    x, mask = padded_batch(np.random.default_rng(case["seed"]), case["lengths"], case["d"])
    y = numpy_of(run(layer, x, mask, case["masked"]))
    lengths = mask.sum(axis=1)
    expected = loop_layer(np.nan_to_num(x), lengths, *weights_of(layer), layer.scale,
                          case["decays"], case["readout"])
    if case["readout"] == "all":
        y = np.where(mask[..., None], y, 0.0)
    assert_close(y, expected)
    # from_torch gives heads whose decayed head form is the layer.
    heads = from_torch(layer)
    np.testing.assert_array_equal(heads.decays, case["decays"])
    assert_close(loop_heads(np.nan_to_num(x), lengths, heads.value_matrices,
                            heads.key_query_matrices, heads.decays, case["readout"]), expected)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("masked", [True, False])
def test_no_decay_and_a_decay_of_one_are_the_layer_without_decay(readout, masked):
    x, mask = padded_batch(np.random.default_rng(1), [5, 2, 3], 3)
    plain = random_layer(3, 2, d_out=2, readout=readout, bias=True, skip=True, seed=1)
    y = run(plain, x, mask, masked)
    assert plain.decay is None
    for decay in (None, 1.0, [1.0, 1.0]):
        layer = random_layer(3, 2, d_out=2, readout=readout, bias=True, skip=True,
                             decay=decay, seed=1)
        # Bit for bit: the weights are exact ones.
        assert torch.equal(run(layer, x, mask, masked).isnan(), y.isnan())
        assert torch.equal(torch.nan_to_num(run(layer, x, mask, masked)), torch.nan_to_num(y))
    expected = loop_layer(np.nan_to_num(x), mask.sum(axis=1), *weights_of(plain),
                          plain.scale, None, readout)
    expected += numpy_of(plain.bias) + np.einsum(
        "ad,b...d->b...a", numpy_of(plain.skip),
        np.nan_to_num(x)[np.arange(3), mask.sum(axis=1) - 1] if readout == "last"
        else np.nan_to_num(x))
    got = numpy_of(y)
    if readout == "all":
        got, expected = np.where(mask[..., None], got, 0.0), np.where(mask[..., None],
                                                                       expected, 0.0)
    assert_close(got, expected)


def test_float32_layer_with_decays_is_close():
    layer = random_layer(3, 2, d_out=1, readout="all", decay=[0.8, 0.95], seed=2,
                         dtype=torch.float32)
    assert layer.decay.dtype == torch.float32
    x, mask = padded_batch(np.random.default_rng(2), [7, 3], 3)
    y = numpy_of(run(layer, x, mask, True))
    expected = loop_layer(np.nan_to_num(x), mask.sum(axis=1), *weights_of(layer),
                          layer.scale, numpy_of(layer.decay), "all")
    assert_close(y, expected, tol=1e-4)


def test_gradients_flow_and_decays_are_not_trained():
    layer = MultiHeadLinearAttention(3, 2, d_k=2, d_out=1, readout="all", decay=[0.7, 0.2],
                                     bias=True, skip=True, dtype=torch.float64)
    assert "decay" not in dict(layer.named_parameters())
    assert "decay" in dict(layer.named_buffers())
    x, mask = padded_batch(np.random.default_rng(3), [5, 3, 4], 3)
    for readout in ("all", "last"):
        layer.readout = readout
        layer.zero_grad()
        loss = (run(layer, x, mask, True) ** 2).sum()
        loss.backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
            assert p.grad.abs().sum() > 0, name
        assert layer.decay.grad is None and not layer.decay.requires_grad


def test_gradient_matches_finite_differences():
    layer = random_layer(2, 2, d_out=1, readout="last", decay=[0.6, 0.9], seed=4)
    x = torch.as_tensor(np.random.default_rng(4).normal(size=(2, 4, 2)))
    assert torch.autograd.gradcheck(
        lambda W_q: torch.func.functional_call(layer, {"W_q": W_q}, (x,)),
        (layer.W_q.detach().clone().requires_grad_(),))


def test_state_dict_round_trip_and_dtype():
    rng = np.random.default_rng(5)
    source = random_layer(3, 2, readout="all", decay=[0.5, 0.8], seed=5)
    target = MultiHeadLinearAttention(3, 2, readout="all", decay=1.0, dtype=torch.float64)
    target.load_state_dict(source.state_dict())
    np.testing.assert_array_equal(numpy_of(target.decay), [0.5, 0.8])
    x, mask = padded_batch(rng, [4, 2], 3)
    assert torch.equal(run(target, x, mask, True), run(source, x, mask, True))
    # Decays out of range are refused before they replace the layer's.
    bad = source.state_dict()
    bad["decay"] = torch.tensor([0.5, 1.5], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"state_dict\['decay'\] must hold real numbers in "
                                         r"\(0, 1\]; got \[0.5, 1.5\]"):
        target.load_state_dict(bad)
    np.testing.assert_array_equal(numpy_of(target.decay), [0.5, 0.8])
    # A layer without decays has no decay key, and load_state_dict's own rules apply.
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"decay\""):
        MultiHeadLinearAttention(3, 2, dtype=torch.float64).load_state_dict(source.state_dict())
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"decay\""):
        target.load_state_dict(MultiHeadLinearAttention(3, 2, readout="all").state_dict())
    assert source.to(torch.float32).decay.dtype == torch.float32
    assert "decay=[0.5, 0.8]" in repr(source) and "decay=None" in repr(
        MultiHeadLinearAttention(3))


@pytest.mark.parametrize("decay, error, message", [
    ([0.5, 0.5], ValueError, r"decay must have one decay per head, shape \(3,\); got shape "
                             r"\(2,\)"),
    (0.0, ValueError, r"decay must be a real number in \(0.0, 1.0\]; got 0.0"),
    (1.5, ValueError, r"decay must be a real number in \(0.0, 1.0\]; got 1.5"),
    (float("nan"), ValueError, r"decay must be a real number in \(0.0, 1.0\]; got nan"),
    ([0.5, float("nan"), 0.5], ValueError, r"decay must hold real numbers in \(0, 1\]"),
    ([0.5, 0.0, 0.5], ValueError, r"decay must hold real numbers in \(0, 1\]"),
    ([0.5, 1.01, 0.5], ValueError, r"decay must hold real numbers in \(0, 1\]"),
    ("0.5", TypeError, r"decay must be a real number in \(0.0, 1.0\]; got '0.5'"),
    (True, TypeError, r"decay must be a real number"),
])
def test_bad_decays_are_refused_by_name(decay, error, message):
    with pytest.raises(error, match=message):
        MultiHeadLinearAttention(2, 3, decay=decay)


def test_decay_as_a_tensor():
    layer = MultiHeadLinearAttention(2, 2, decay=torch.tensor([0.25, 0.5]),
                                     dtype=torch.float64)
    np.testing.assert_array_equal(numpy_of(layer.decay), [0.25, 0.5])
    assert numpy_of(MultiHeadLinearAttention(2, 2, decay=torch.tensor(0.5)).decay).tolist() == [
        0.5, 0.5]


# -- to_torch from an estimator with head_decays_ -----------------------------------------


class FittedHeads(BaseEstimator):
    """A fitted estimator's attributes, set by hand (what to_torch reads)."""

    def __init__(self, readout="last"):
        self.readout = readout

    def fit(self, X=None, y=None):
        return self


def fitted_heads(readout, decays, *, H=3, d=3, d_out=2, seed=6):
    rng = np.random.default_rng(seed)
    model = FittedHeads(readout).fit()
    model.value_matrices_ = rng.normal(size=(H, d_out, d))
    model.key_query_matrices_ = rng.normal(size=(H, d, d))
    model.n_features_in_ = d
    if decays is not None:
        model.head_decays_ = np.asarray(decays, dtype=float)
    return model


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d_k, d_v", [(None, None), (1, 1), (2, None)])
def test_to_torch_carries_the_heads_decays(readout, d_k, d_v):
    decays = [0.9, 0.4, 0.9]
    model = fitted_heads(readout, decays)
    layer = to_torch(model, d_k=d_k, d_v=d_v)
    x, mask = padded_batch(np.random.default_rng(7), [6, 3, 1, 4], 3)
    y = numpy_of(run(layer, x, mask, True))
    expected = loop_heads(np.nan_to_num(x), mask.sum(axis=1), model.value_matrices_,
                          model.key_query_matrices_, decays, readout)
    assert_close(y, expected)
    assert set(numpy_of(layer.decay).tolist()) == {0.9, 0.4}
    if d_k == 1:  # every Q_h of rank 3 split into 3 layer heads, each with its head's decay
        assert layer.n_heads >= 9
    # ... and back: the heads of each decay compute the estimator's heads of that decay.
    heads = from_torch(layer)
    assert_close(loop_heads(np.nan_to_num(x), mask.sum(axis=1), heads.value_matrices,
                            heads.key_query_matrices, heads.decays, readout), expected)


def test_to_torch_with_one_decay_factors_as_without():
    with_decay = to_torch(fitted_heads("all", [0.7] * 3))
    without = to_torch(fitted_heads("all", None))
    assert without.decay is None
    np.testing.assert_array_equal(numpy_of(with_decay.decay), [0.7] * 3)
    for W, V in zip(weights_of(with_decay), weights_of(without)):
        np.testing.assert_array_equal(W, V)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_to_torch_without_head_decays_is_unchanged(readout):
    model = fitted_heads(readout, None)
    assert not hasattr(model, "head_decays_")
    x, mask = padded_batch(np.random.default_rng(8), [5, 2], 3)
    expected = loop_heads(np.nan_to_num(x), mask.sum(axis=1), model.value_matrices_,
                          model.key_query_matrices_, None, readout)
    layer = to_torch(model)
    assert layer.decay is None
    assert_close(numpy_of(run(layer, x, mask, True)), expected)
    model.head_decays_ = None  # None: no decay, as without the attribute
    assert to_torch(model).decay is None
    assert torch.equal(run(to_torch(model), x, mask, True), run(layer, x, mask, True))


@pytest.mark.parametrize("decays, error, message", [
    ([0.5, 0.5], ValueError, r"the estimator's head_decays_ must have one decay per head, "
                             r"shape \(3,\); got shape \(2,\)"),
    ([0.5, 0.0, 0.5], ValueError, r"the estimator's head_decays_ must hold real numbers"),
])
def test_to_torch_refuses_bad_head_decays(decays, error, message):
    with pytest.raises(error, match=message):
        to_torch(fitted_heads("last", decays))


# -- from_torch: the package's layer and layers with other names ----------------------------


class Retention(torch.nn.Module):
    """Multi-scale retention with fixed decays, written with q_proj, k_proj, v_proj, o_proj.

    ``o_t = o_proj(concat_h [sum_{s<=t} gamma_h^(t-s) (q_t . k_s) v_s / sqrt(head_dim)])``;
    the decays are a plain list, not a weight.
    """

    def __init__(self, d, num_heads, head_dim, gammas):
        super().__init__()
        self.num_heads, self.head_dim, self.gammas = num_heads, head_dim, gammas
        inner = num_heads * head_dim
        kw = {"bias": False, "dtype": torch.float64}
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(d, inner, **kw)
                                                 for _ in range(3))
        self.o_proj = torch.nn.Linear(inner, d, **kw)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (p(x).view(B, T, self.num_heads, self.head_dim)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        steps = (torch.arange(T)[:, None] - torch.arange(T)).clamp(min=0)
        D = torch.tensor(self.gammas, dtype=x.dtype)[:, None, None] ** steps
        D = D * torch.ones(T, T).tril()
        scores = torch.einsum("bthk,bshk->bhts", q, k) * D / self.head_dim ** 0.5
        return self.o_proj(torch.einsum("bhts,bshv->bthv", scores, v).reshape(B, T, -1))


def test_from_torch_reads_fixed_decays_of_another_layer():
    torch.manual_seed(9)
    gammas = [0.95, 0.6]
    layer = Retention(3, 2, 2, gammas)
    heads = from_torch(layer, decays=gammas)
    np.testing.assert_array_equal(heads.decays, gammas)
    assert heads.readout == "all"
    x = np.random.default_rng(9).normal(size=(2, 6, 3))
    expected = layer(torch.as_tensor(x)).detach().numpy()
    assert_close(loop_heads(x, [6, 6], heads.value_matrices, heads.key_query_matrices,
                            heads.decays, "all"), expected)
    # Without decays it is read as plain linear attention, as before: decays None.
    assert from_torch(layer).decays is None
    np.testing.assert_array_equal(from_torch(layer, decays=0.5).decays, [0.5, 0.5])
    np.testing.assert_array_equal(from_torch(layer, decays=torch.tensor([0.5, 1.0])).decays,
                                  [0.5, 1.0])


@pytest.mark.parametrize("decays, error, message", [
    ([0.5, 0.5, 0.5], ValueError, r"decays must have one decay per head, shape \(2,\); got "
                                  r"shape \(3,\)"),
    (np.ones((2, 1)), ValueError, r"decays must have one decay per head"),
    (1.5, ValueError, r"decays must be a real number in \(0.0, 1.0\]"),
    ([0.5, np.nan], ValueError, r"decays must hold real numbers in \(0, 1\]"),
    (np.array([0.5, np.nan]), ValueError, r"decays must be finite|decays must hold"),
    ("x", TypeError, r"decays must be a real number"),
])
def test_from_torch_refuses_bad_decays_by_name(decays, error, message):
    with pytest.raises(error, match=message):
        from_torch(Retention(3, 2, 2, [0.5, 0.5]), decays=decays)


def test_from_torch_refuses_a_projected_layer_with_a_decay_attribute():
    layer = Retention(3, 2, 2, [0.5, 0.5])
    layer.decay = torch.tensor([0.5, 0.5])
    with pytest.raises(ValueError, match=r"module.decay is Tensor: .*Pass decays="):
        from_torch(layer)
    np.testing.assert_array_equal(from_torch(layer, decays=0.5).decays, [0.5, 0.5])


def test_from_torch_on_the_package_layer():
    layer = MultiHeadLinearAttention(3, 2, decay=[0.25, 0.5], dtype=torch.float32)
    heads = from_torch(layer)
    assert heads.decays.dtype == np.float64
    np.testing.assert_array_equal(heads.decays, [0.25, 0.5])
    assert from_torch(MultiHeadLinearAttention(3, 2)).decays is None
    # decays= overrides the layer's, as scale= does.
    np.testing.assert_array_equal(from_torch(layer, decays=0.75).decays, [0.75, 0.75])
    # A decay changed by hand after construction is checked when read.
    with torch.no_grad():
        layer.decay[1] = 2.0
    with pytest.raises(ValueError, match=r"module.decay must hold real numbers in \(0, 1\]"):
        from_torch(layer)


def test_attention_heads_without_decays_keeps_working():
    from sklearn_linattn.nn import AttentionHeads
    heads = AttentionHeads(np.ones((1, 1, 2)), np.eye(2)[None], None, None, "last")
    assert heads.decays is None and heads.constant is None
    assert heads._fields[-2:] == ("decays", "constant")


def test_a_decay_float32_cannot_hold_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"decay must be representable in torch.float32 .*"
                                         r"\[1.0, 1e-60\]"):
        MultiHeadLinearAttention(2, n_heads=2, decay=[1.0, 1e-60], dtype=torch.float32)
    layer = MultiHeadLinearAttention(2, n_heads=2, decay=[1.0, 1e-60], dtype=torch.float64)
    assert float(layer.decay[1]) == 1e-60
