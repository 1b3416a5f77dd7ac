"""Projection and paper layouts against loops over their formulas; round trips."""

import math

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given
from hypothesis import strategies as st

from sklearn_linattn import (
    attention_coefficients,
    heads_from_paper,
    heads_from_projections,
    mhla_forward,
    paper_from_heads,
    projections_from_heads,
)


def loop_layer(Z, W_q, W_k, W_v, W_o, scale):
    """o_t = W_o concat_h [scale sum_{s<=t} (q_t . k_s) v_s], by loops over tokens and heads.

    Z of shape (n_tokens, d); per-head weights (H, rows, d); W_o None is the identity.
    """
    H, d_v = W_v.shape[0], W_v.shape[1]
    outputs = []
    for t in range(len(Z)):
        concat = []
        for h in range(H):
            q = W_q[h] @ Z[t]
            acc = np.zeros(d_v)
            for s in range(t + 1):
                k = W_k[h] @ Z[s]
                v = W_v[h] @ Z[s]
                acc = acc + scale * float(q @ k) * v
            concat.append(acc)
        concat = np.concatenate(concat)
        outputs.append(concat if W_o is None else W_o @ concat)
    return np.array(outputs)


def loop_paper(Z, P, Q):
    """mean_h causal((Z Q_h^T) Z^T / sqrt(d)) (Z P_h^T), entry by entry."""
    m, d_out, d = P.shape
    out = np.zeros((len(Z), d_out))
    for t in range(len(Z)):
        for h in range(m):
            for s in range(t + 1):
                score = float((Q[h] @ Z[t]) @ Z[s]) / math.sqrt(d)
                out[t] += score * (P[h] @ Z[s]) / m
    return out


def relative_error(Va, Qa, Vb, Qb):
    pa, pb = attention_coefficients(Va, Qa), attention_coefficients(Vb, Qb)
    return np.linalg.norm(pa - pb) / np.linalg.norm(pb)


def low_rank(rng, shape, rank):
    """Random matrices (n, a, b) of the given rank each."""
    n, a, b = shape
    return rng.normal(size=(n, a, rank)) @ rng.normal(size=(n, rank, b))


shapes = st.fixed_dictionaries({
    "H": st.integers(1, 4), "d": st.integers(1, 4), "d_k": st.integers(1, 5),
    "d_v": st.integers(1, 4), "d_out": st.integers(1, 3), "seed": st.integers(0, 2**16),
    "fused": st.booleans(), "identity": st.booleans(),
})


@given(shapes)
def test_heads_of_a_layer_compute_the_layer(s):
    rng = np.random.default_rng(s["seed"])
    H, d, d_k, d_v = s["H"], s["d"], s["d_k"], s["d_v"]
    W_q, W_k = rng.normal(size=(2, H, d_k, d))
    W_v = rng.normal(size=(H, d_v, d))
    W_o = None if s["identity"] else rng.normal(size=(s["d_out"], H * d_v))
    scale = 1 / math.sqrt(d_k)
    Z = rng.normal(size=(5, d))
    expected = loop_layer(Z, W_q, W_k, W_v, W_o, scale)
    if s["fused"]:
        V, Q = heads_from_projections(W_q.reshape(H * d_k, d), W_k.reshape(H * d_k, d),
                                      W_v.reshape(H * d_v, d), W_o, scale=scale, n_heads=H)
    else:
        V, Q = heads_from_projections(W_q, W_k, W_v, W_o, scale=scale)
    assert V.shape == (H, expected.shape[1], d) and Q.shape == (H, d, d)
    got = mhla_forward(Z[None], V, Q, readout="all")[0]
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


heads = st.fixed_dictionaries({
    "H": st.integers(1, 4), "d": st.integers(1, 5), "d_out": st.integers(1, 4),
    "d_k": st.none() | st.integers(1, 6), "d_v": st.none() | st.integers(1, 5),
    "rank_q": st.integers(0, 5), "rank_v": st.integers(0, 4), "seed": st.integers(0, 2**16),
    "scale": st.sampled_from([1.0, 0.125, 3.0]),
})


@given(heads)
def test_projections_of_heads_compute_the_heads(s):
    rng = np.random.default_rng(s["seed"])
    H, d, d_out = s["H"], s["d"], s["d_out"]
    rank_q, rank_v = min(s["rank_q"], d), min(s["rank_v"], d, d_out)
    Q = low_rank(rng, (H, d, d), rank_q)
    V = low_rank(rng, (H, d_out, d), rank_v)
    V[0] = rng.normal(size=(d_out, d))   # one head is non-zero, so the function is
    Q[0] = rng.normal(size=(d, d))
    p = projections_from_heads(V, Q, d_k=s["d_k"], d_v=s["d_v"], scale=s["scale"])
    d_k = s["d_k"] or d
    d_v = s["d_v"] or min(d_out, d)
    n = len(p.W_q)
    assert p.W_q.shape == p.W_k.shape == (n, d_k, d)
    assert p.W_v.shape == (n, d_v, d) and p.W_o.shape == (d_out, n * d_v)
    ranks_q = np.linalg.matrix_rank(Q)
    ranks_v = np.linalg.matrix_rank(V) * (ranks_q > 0)
    assert n == sum(-(-rq // d_k) * -(-rv // d_v) for rq, rv in zip(ranks_q, ranks_v))
    V2, Q2 = heads_from_projections(*p, scale=s["scale"])
    assert relative_error(V2, Q2, V, Q) <= 1e-12
    Z = rng.normal(size=(4, d))
    np.testing.assert_allclose(loop_layer(Z, *p, s["scale"]),
                               mhla_forward(Z[None], V, Q, readout="all")[0],
                               rtol=1e-9, atol=1e-9)


def test_a_head_of_high_rank_becomes_several_layer_heads():
    rng = np.random.default_rng(0)
    V, Q = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 4, 4))
    p = projections_from_heads(V, Q, d_k=2, d_v=2)   # rank 4 = 2 groups, rank 3 = 2 groups
    assert len(p.W_q) == 2 * 2 * 2
    assert relative_error(*heads_from_projections(*p), V, Q) <= 1e-12
    padded = projections_from_heads(V, Q, d_k=2, d_v=2, n_heads=10)
    assert len(padded.W_q) == 10 and not padded.W_q[8:].any() and not padded.W_o[:, 16:].any()
    with pytest.raises(ValueError, match=r"needs 8 layer heads.*n_heads=7.*compress_heads"):
        projections_from_heads(V, Q, d_k=2, d_v=2, n_heads=7)


def test_zero_heads_get_no_layer_head():
    rng = np.random.default_rng(1)
    V, Q = rng.normal(size=(3, 1, 3)), rng.normal(size=(3, 3, 3))
    V[1] = 0.0
    Q[2] = 0.0
    p = projections_from_heads(V, Q)
    assert len(p.W_q) == 1
    assert relative_error(*heads_from_projections(*p), V[:1], Q[:1]) <= 1e-12
    zero = projections_from_heads(np.zeros((2, 1, 3)), np.zeros((2, 3, 3)))
    assert len(zero.W_q) == 1 and not zero.W_o.any()


def test_rtol_drops_small_singular_values():
    rng = np.random.default_rng(2)
    U = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    Q = (U * [1.0, 1e-3, 0.0]) @ U.T
    V = rng.normal(size=(1, 1, 3))
    assert len(projections_from_heads(V, Q[None], d_k=1).W_q) == 2
    assert len(projections_from_heads(V, Q[None], d_k=1, rtol=1e-2).W_q) == 1


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**16))
def test_paper_layout_is_the_papers_formula(m, d, d_out, seed):
    rng = np.random.default_rng(seed)
    P, Q = rng.normal(size=(m, d_out, d)), rng.normal(size=(m, d, d))
    Z = rng.normal(size=(5, d))
    V, Q2 = heads_from_paper(P, Q)
    np.testing.assert_allclose(mhla_forward(Z[None], V, Q2, readout="all")[0],
                               loop_paper(Z, P, Q), rtol=1e-10, atol=1e-10)
    P2, Q3 = paper_from_heads(V, Q2)
    np.testing.assert_allclose(P2, P, rtol=1e-14)
    assert np.array_equal(Q3, Q) and Q3 is not Q


@pytest.mark.parametrize("call, match", [
    (lambda: heads_from_projections(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3))),
     r"W_q is 2-D .*pass n_heads"),
    (lambda: heads_from_projections(np.ones((3, 3)), np.ones((3, 3)), np.ones((3, 3)),
                                    n_heads=2), r"fused W_q must have n_heads \* d_k rows"),
    (lambda: heads_from_projections(np.ones((1, 2, 3)), np.ones((1, 2, 2)), np.ones((1, 2, 3))),
     r"W_q and W_k must have the same shape .*W_k of shape \(1, 2, 2\)"),
    (lambda: heads_from_projections(np.ones((1, 2, 3)), np.ones((1, 2, 3)), np.ones((1, 2, 3)),
                                    np.ones((1, 3))),
     r"W_o must have shape .* = \(d_out, 2\); got shape \(1, 3\)"),
    (lambda: heads_from_projections(np.ones((1, 2, 3)), np.ones((1, 2, 3)), np.ones((1, 2, 3)),
                                    n_heads=2), r"W_q has 1 heads .*n_heads=2"),
    (lambda: heads_from_projections(np.ones((1, 2, 3)), np.ones((1, 2, 3)), np.ones(3)),
     r"W_v must have shape \(n_heads, d_v, d\)"),
    (lambda: projections_from_heads(np.ones((1, 1, 3)), np.ones((1, 2, 2))),
     r"V must have shape .*got V of shape \(1, 1, 3\) and Q of shape \(1, 2, 2\)"),
    (lambda: projections_from_heads(np.ones((1, 1, 2)), np.ones((1, 2, 2)), d_k=0),
     r"d_k must be None or an integer >= 1; got 0"),
    (lambda: heads_from_paper(np.ones((2, 1, 3)), np.ones((1, 3, 3))),
     r"P must have shape .*got P of shape \(2, 1, 3\)"),
])
def test_malformed_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_scale_must_be_positive():
    W = np.ones((1, 1, 2))
    with pytest.raises(ValueError, match=r"scale must be a real number > 0.0; got 0.0"):
        heads_from_projections(W, W, W, scale=0.0)
    with pytest.raises(TypeError, match=r"scale must be a real number"):
        projections_from_heads(W, np.ones((1, 2, 2)), scale="1")


@pytest.mark.parametrize("call, error, match", [
    (lambda W: heads_from_projections(scipy.sparse.csr_matrix(W[0]), W[0], W[0], n_heads=1),
     TypeError, r"W_q must be a dense array \(or tensor\); got a scipy.sparse csr matrix of "
                r"shape \(2, 2\): pass W_q.toarray\(\)"),
    (lambda W: heads_from_projections(W, W, W, scipy.sparse.coo_array(np.eye(2))),
     TypeError, r"W_o must be a dense array .*coo matrix"),
    # A view of 10**12 zeros holds one number; its float64 copy would not fit.
    (lambda W: heads_from_projections(np.broadcast_to(np.zeros(1), (10**6, 10**6)), W[0],
                                      W[0], n_heads=1),
     ValueError, r"W_q of shape \(1000000, 1000000\) would take 7.28 TiB as float64, more "
                 r"than the memory budget"),
    (lambda W: heads_from_projections(*[np.broadcast_to(np.zeros(1), (1, 1, 10**6))] * 3),
     ValueError, r"the heads V of shape \(1, 1, 1000000\) and Q of shape \(1, 1000000, "
                 r"1000000\) would take 7.28 TiB"),
    (lambda W: heads_from_projections(W, W, W, scale=np.ones(2)),
     TypeError, r"scale must be a real number > 0.0; got array\(\[1., 1.\]\)"),
])
def test_inputs_that_cannot_be_read_are_refused_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call(np.ones((1, 2, 2)))


def test_a_tensor_without_values_is_refused_by_name():
    torch = pytest.importorskip("torch")
    W = torch.ones(1, 2, 2)
    with pytest.raises(ValueError, match=r"W_k is a tensor on the meta device: it has a shape, "
                                         r"\(1, 2, 2\), but no values"):
        heads_from_projections(W, W.to("meta"), W)
    with pytest.raises(TypeError, match=r"W_v must be a dense tensor; got a tensor of layout "
                                        r"torch.sparse_coo: pass W_v.to_dense\(\)"):
        heads_from_projections(W, W, W.to_sparse())
