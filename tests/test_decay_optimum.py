"""Fixed decays in the coefficient map, in same_function and in compare_to_optimum.

A model whose head h has decay gamma_h computes ``sum_b <coef_b, H_(gamma_b)(X)>``,
one block of features per distinct decay: ``attention_coefficients(V, Q,
decays=..., blocks=...)`` gives those blocks, ``same_function`` compares two
models block by block and ``compare_to_optimum`` fits the optimum with the
model's decays as blocks.
"""

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_linattn import (
    LinearAttentionRegressor,
    attention_coefficients,
    compare_to_optimum,
    mhla_forward,
    same_function,
)
from sklearn_linattn._features import (
    attention_features,
    fold_coefficients,
    n_attention_features,
    prefix_features,
)


def random_heads(rng, n_heads, d_out, d):
    return rng.normal(size=(n_heads, d_out, d)), rng.normal(size=(n_heads, d, d))


def padded(rng, n_samples, n_tokens, d, min_length=1):
    """Random sequences of random lengths: NaN-padded and zero-padded copies, and the lengths."""
    X = rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(min_length, n_tokens + 1, size=n_samples)
    pad = np.arange(n_tokens)[None, :] >= lengths[:, None]
    return np.where(pad[:, :, None], np.nan, X), np.where(pad[:, :, None], 0.0, X), lengths


def real_mask(lengths, n_tokens):
    return np.arange(n_tokens)[None, :] < lengths[:, None]


@st.composite
def decayed_models(draw):
    """Heads, their decays (repeats allowed) and a block order holding every head's decay."""
    n_heads = draw(st.integers(1, 4))
    pool = draw(st.lists(st.sampled_from([1.0, 0.9, 0.5, 0.25, 1e-3]), min_size=1,
                         max_size=3, unique=True))
    decays = draw(st.lists(st.sampled_from(pool), min_size=n_heads, max_size=n_heads))
    # Every decay of the heads, maybe an unused one, in any order.
    extra = draw(st.sampled_from([None, 0.75]))
    blocks = list(dict.fromkeys(decays)) + ([] if extra is None else [extra])
    blocks = draw(st.permutations(blocks))
    default = draw(st.booleans())
    return (n_heads, draw(st.integers(1, 3)), draw(st.integers(1, 3)), decays,
            None if default else blocks, draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=30, deadline=None)
@given(model=decayed_models())
def test_coefficients_reproduce_the_decayed_forward_pass(model):
    n_heads, d_out, d, decays, blocks, seed = model
    rng = np.random.default_rng(seed)
    V, Q = random_heads(rng, n_heads, d_out, d)
    X_nan, X_zero, lengths = padded(rng, 5, 6, d)
    coef = attention_coefficients(V, Q, decays=decays, blocks=blocks)
    layout = tuple(dict.fromkeys(decays)) if blocks is None else tuple(blocks)
    psi = n_attention_features(d)
    assert coef.shape == (d_out, len(layout) * psi)

    last = mhla_forward(X_nan, V, Q, decays=decays)
    H = attention_features(X_zero, lengths, layout)
    np.testing.assert_allclose(H @ coef.T, last, rtol=1e-10, atol=1e-10 * np.abs(last).max())

    every = mhla_forward(X_nan, V, Q, readout="all", decays=decays)
    real = real_mask(lengths, X_zero.shape[1])
    H_all = prefix_features(X_zero, lengths, layout)
    assert np.all(np.isnan(every[~real]))
    np.testing.assert_allclose(H_all[real] @ coef.T, every[real], rtol=1e-10,
                               atol=1e-10 * np.abs(every[real]).max())


@pytest.mark.parametrize("blocks", [(1.0, 0.5), (0.5, 1.0), (0.9, 0.5, 1.0), (0.5, 0.9)])
def test_prefix_feature_blocks_are_those_of_each_decay_alone(blocks):
    # Regression: the first block's running moment was formed in place over the
    # products the later blocks were built from.
    X_nan, X_zero, lengths = padded(np.random.default_rng(9), 4, 5, 2)
    together = prefix_features(X_zero, lengths, blocks)
    alone = np.concatenate([prefix_features(X_zero, lengths, (g,)) for g in blocks], axis=-1)
    np.testing.assert_allclose(together, alone, rtol=1e-14, atol=0.0)


def test_each_block_sums_the_heads_of_its_decay():
    rng = np.random.default_rng(0)
    V, Q = random_heads(rng, 4, 2, 3)
    decays = [0.5, 1.0, 0.5, 0.9]
    psi = n_attention_features(3)

    def plain(heads):
        return fold_coefficients(np.einsum("haj,hkl->ajkl", V[heads], Q[heads]))

    coef = attention_coefficients(V, Q, decays=decays, blocks=[0.9, 0.25, 1.0, 0.5])
    np.testing.assert_array_equal(coef[:, :psi], plain([3]))
    np.testing.assert_array_equal(coef[:, psi:2 * psi], 0.0)  # no head of decay 0.25
    np.testing.assert_array_equal(coef[:, 2 * psi:3 * psi], plain([1]))
    np.testing.assert_allclose(coef[:, 3 * psi:], plain([0, 2]), rtol=1e-14)
    # The default order: first appearance among the heads.
    default = attention_coefficients(V, Q, decays=decays)
    np.testing.assert_array_equal(
        default, attention_coefficients(V, Q, decays=decays, blocks=[0.5, 1.0, 0.9]))


def test_without_decays_the_coefficients_are_unchanged():
    rng = np.random.default_rng(1)
    V, Q = random_heads(rng, 3, 2, 2)
    plain = fold_coefficients(np.einsum("haj,hkl->ajkl", V, Q))
    np.testing.assert_array_equal(attention_coefficients(V, Q), plain)
    # Decay 1 everywhere is no decay: one block, the same numbers.
    np.testing.assert_array_equal(attention_coefficients(V, Q, decays=1.0), plain)
    # No decays in a block layout: every head in the block of decay 1.
    psi = n_attention_features(2)
    coef = attention_coefficients(V, Q, blocks=[0.5, 1.0])
    np.testing.assert_array_equal(coef[:, :psi], 0.0)
    np.testing.assert_array_equal(coef[:, psi:], plain)


@pytest.mark.parametrize("decays, blocks, match", [
    ([0.5, 0.9], [0.5], r"blocks=\[0\.5\].*decays\[1\] = 0\.9.*decays=\[0\.5, 0\.9\]"),
    (None, [0.5], r"blocks=\[0\.5\].*decays\[0\] = 1\.0"),
    ([0.5, 0.9], [0.5, 0.9, 0.5], "blocks must hold distinct decays"),
    ([0.5, 0.9], [0.5, 1.5], r"blocks\[1\]"),
    ([0.5, 0.9], [], "blocks must be None, a real number"),
    ([0.5, 0.9, 0.5], None, r"decays must have one decay per head, shape \(2,\)"),
    ([0.5, 0.0], None, r"decays must hold real numbers in \(0, 1\]"),
])
def test_coefficient_errors_name_the_argument(decays, blocks, match):
    V, Q = random_heads(np.random.default_rng(2), 2, 1, 2)
    with pytest.raises(ValueError, match=match):
        attention_coefficients(V, Q, decays=decays, blocks=blocks)


def test_no_heads_with_decays_needs_blocks():
    V, Q = np.zeros((0, 1, 2)), np.zeros((0, 2, 2))
    with pytest.raises(ValueError, match="blocks must be given"):
        attention_coefficients(V, Q, decays=np.zeros(0))
    np.testing.assert_array_equal(
        attention_coefficients(V, Q, decays=np.zeros(0), blocks=[0.5, 1.0]), np.zeros((1, 12)))


def test_same_function_regroups_heads_of_equal_decays():
    rng = np.random.default_rng(3)
    V, Q = random_heads(rng, 3, 2, 3)
    decays = np.array([0.5, 1.0, 0.5])
    order = [2, 0, 1]
    assert same_function(V, Q, V[order], Q[order], decays_a=decays, decays_b=decays[order])
    # Head 0 split in two halves of the same decay, and heads 0 and 2 merged when equal.
    split_V = np.concatenate([V, V[:1]])
    split_Q = np.concatenate([Q[:1] / 2, Q[1:], Q[:1] / 2])
    assert same_function(V, Q, split_V, split_Q, decays_a=decays,
                         decays_b=[0.5, 1.0, 0.5, 0.5])
    merged_V, merged_Q = np.concatenate([V[:2], V[:1]]), np.concatenate([Q[:2], Q[:1]])
    doubled = Q[:2].copy()
    doubled[0] *= 2
    assert same_function(V[:2], doubled, merged_V, merged_Q, decays_a=decays[:2],
                         decays_b=decays, rtol=1e-12)
    # No decays and decay 1 are one function.
    assert same_function(V, Q, V, Q, decays_b=1.0)
    assert same_function(V, Q, V, Q, decays_a=[1.0, 1.0, 1.0])


def test_same_function_tells_a_head_moved_to_another_decay():
    rng = np.random.default_rng(4)
    V, Q = random_heads(rng, 3, 2, 3)
    decays = np.array([0.5, 1.0, 0.5])
    moved = np.array([0.5, 1.0, 0.9])  # head 2 to a decay no head had
    swapped = np.array([1.0, 1.0, 0.5])  # head 0 to the other decay
    X = rng.normal(size=(20, 4, 3))
    y = mhla_forward(X, V, Q, decays=decays)
    for other in (moved, swapped, None):
        assert not same_function(V, Q, V, Q, decays_a=decays, decays_b=other)
        assert not same_function(V, Q, V, Q, decays_a=other, decays_b=decays)
        y_other = mhla_forward(X, V, Q, decays=other)
        assert np.max(np.abs(y - y_other)) > 1e-3 * np.max(np.abs(y))
    # One token carries no lag: there the blocks coincide (see the Notes).
    one = X[:, :1]
    np.testing.assert_allclose(mhla_forward(one, V, Q, decays=decays),
                               mhla_forward(one, V, Q, decays=moved), rtol=1e-12)


def test_same_function_decays_are_checked_by_name():
    V, Q = random_heads(np.random.default_rng(5), 2, 1, 2)
    with pytest.raises(ValueError, match=r"decays_b must have one decay per head"):
        same_function(V, Q, V, Q, decays_a=[0.5, 0.5], decays_b=[0.5])
    with pytest.raises(ValueError, match=r"decays_a must hold real numbers in \(0, 1\]"):
        same_function(V, Q, V, Q, decays_a=[0.5, 2.0])


# compare_to_optimum

Heads = namedtuple("Heads", ["value_matrices", "key_query_matrices", "intercept", "skip_coef",
                             "readout", "decays"])


def teacher_data(seed, readout, noise=0.0):
    """A decayed teacher (three heads, two decays, the order of first appearance 1.0, 0.5)."""
    rng = np.random.default_rng(seed)
    V, Q = random_heads(rng, 3, 2, 2)
    decays = np.array([1.0, 0.5, 1.0])
    X, X_zero, lengths = padded(rng, 200, 5, 2, min_length=3)
    y = mhla_forward(X, V, Q, readout=readout, decays=decays)
    y = y + noise * rng.normal(size=y.shape)
    return X, X_zero, lengths, y, V, Q, decays


def direct_risk(y, f, lengths, readout):
    """(1/N) sum_rows ||y_row - f_row||**2 over the rows (sequences or real positions)."""
    if readout == "last":
        return float(np.mean(np.sum((y - f) ** 2, axis=-1)))
    real = real_mask(lengths, y.shape[1])
    return float(np.mean(np.sum((y[real] - f[real]) ** 2, axis=-1)))


@pytest.mark.parametrize("readout", ["last", "all"])
def test_exact_decayed_teacher_is_the_optimum(readout):
    X, _, _, y, V, Q, decays = teacher_data(0, readout)
    report = compare_to_optimum((V, Q, decays), X, y, readout=readout)
    assert report.optimum.decay == (1.0, 0.5)  # first appearance among the heads
    assert report.optimum.coef_.shape == (2, 2 * n_attention_features(2))
    assert report.identifiable
    assert report.relative_p_distance < 1e-10
    assert report.training_distance < 1e-9 * np.sqrt(np.nanmean(y ** 2))
    assert abs(report.excess_risk) < 1e-18 * np.nanmean(y ** 2)
    # The same heads as a from_torch-style object: the same numbers.
    heads = compare_to_optimum(Heads(V, Q, None, None, readout, decays), X, y)
    assert heads.relative_p_distance < 1e-10


@pytest.mark.parametrize("readout", ["last", "all"])
def test_perturbed_decayed_heads_have_the_direct_excess_risk(readout):
    X, X_zero, lengths, y, V, Q, decays = teacher_data(1, readout, noise=0.3)
    Vp = V + 0.2 * np.random.default_rng(7).normal(size=V.shape)
    report = compare_to_optimum((Vp, Q, decays), X, y, readout=readout)
    optimum = report.optimum
    f_model = mhla_forward(X, Vp, Q, readout=readout, decays=decays)
    f_opt = mhla_forward(X, optimum.value_matrices_, optimum.key_query_matrices_,
                         readout=readout, decays=optimum.head_decays_)
    risk, optimal_risk = (direct_risk(y, f, lengths, readout) for f in (f_model, f_opt))
    assert optimal_risk > 0.01 and risk - optimal_risk > 0.01
    assert report.risk == pytest.approx(risk, rel=1e-10)
    assert report.optimal_risk == pytest.approx(optimal_risk, rel=1e-10)
    assert report.excess_risk == pytest.approx(risk - optimal_risk, rel=1e-9)
    # With alpha = 0 the excess risk is the squared distance of the outputs.
    assert report.training_distance ** 2 == pytest.approx(report.excess_risk, rel=1e-9)
    # p-space: the model's blocks (1.0, 0.5) against the optimum's coef_.
    p = attention_coefficients(Vp, Q, decays=decays, blocks=(1.0, 0.5))
    assert report.p_distance == pytest.approx(np.linalg.norm(p - optimum.coef_), rel=1e-9)
    # The optimum's coefficients reproduce its outputs through the decayed features.
    if readout == "last":
        np.testing.assert_allclose(attention_features(X_zero, lengths, (1.0, 0.5))
                                   @ optimum.coef_.T, f_opt, rtol=1e-8, atol=1e-8)


def test_a_decayed_estimator_is_compared_with_its_decays():
    X, _, lengths, y, V, Q, decays = teacher_data(2, "last", noise=0.3)
    # Fitted on half the data, measured on all of it: a model near, not at, the optimum.
    est = LinearAttentionRegressor(decay=(0.5, 1.0)).fit(X[:100], y[:100])
    assert est.head_decays_ is not None
    report = compare_to_optimum(est, X, y)
    f_est = mhla_forward(X, est.value_matrices_, est.key_query_matrices_,
                         decays=est.head_decays_) + est.intercept_
    f_opt = mhla_forward(X, report.optimum.value_matrices_,
                         report.optimum.key_query_matrices_,
                         decays=report.optimum.head_decays_) + report.optimum.intercept_
    risk, optimal_risk = (direct_risk(y, f, lengths, "last") for f in (f_est, f_opt))
    assert report.excess_risk == pytest.approx(risk - optimal_risk, rel=1e-8)
    assert 0 < report.relative_p_distance < 0.5
    assert report.optimum.decay == tuple(dict.fromkeys(est.head_decays_.tolist()))
    # The optimum itself is at distance zero.
    assert compare_to_optimum(report.optimum, X, y).relative_p_distance < 1e-10


def test_from_torch_decays_are_compared():
    torch = pytest.importorskip("torch")
    from sklearn_linattn.nn import MultiHeadLinearAttention, from_torch

    torch.manual_seed(0)
    layer = MultiHeadLinearAttention(2, n_heads=2, decay=[0.9, 0.5], dtype=torch.float64)
    X = np.random.default_rng(8).normal(size=(150, 5, 2))
    with torch.no_grad():
        y = layer(torch.as_tensor(X)).numpy()
    report = compare_to_optimum(from_torch(layer), X, y)
    assert report.relative_p_distance < 1e-10
    assert abs(report.excess_risk) < 1e-18 * np.mean(y ** 2)
    assert report.optimum.decay == (0.9, 0.5)


def test_decay_one_compares_as_no_decay():
    X, _, _, _, V, Q, _ = teacher_data(3, "last")
    y = mhla_forward(X, V, Q)
    plain = compare_to_optimum((V, 1.1 * Q), X, y)
    ones = compare_to_optimum((V, 1.1 * Q, np.ones(3)), X, y)
    assert plain.optimum.decay is None and ones.optimum.decay == (1.0,)
    for name in ("p_distance", "training_distance", "risk", "excess_risk"):
        assert getattr(ones, name) == pytest.approx(getattr(plain, name), rel=1e-9)


def test_decayed_model_errors():
    X, _, _, y, V, Q, decays = teacher_data(4, "last")
    with pytest.raises(ValueError, match=r"model\[2\] \(the heads' decays\) must have one "
                                         r"decay per head, shape \(3,\)"):
        compare_to_optimum((V, Q, decays[:2]), X, y)
    with pytest.raises(ValueError, match=r"Heads\.decays must hold real numbers"):
        compare_to_optimum(Heads(V, Q, None, None, "last", [1.0, 0.5, 1.5]), X, y)
    with pytest.raises(TypeError, match=r"triple \(V, Q, decays\).*tuple of length 4"):
        compare_to_optimum((V, Q, decays, None), X, y)
