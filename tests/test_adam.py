"""AdamLinearAttentionRegressor: gradients, optimiser, schedule, estimator contract."""

import math
import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from reference import random_generator as _generator
from sklearn_linattn import (
    LinearAttentionRegressor,
    attention_coefficients,
    mhla_forward,
    paper_from_heads,
)
from sklearn_linattn import _adam as adam
from sklearn_linattn._memory import sample_chunks
from sklearn_linattn import (
    AdamLinearAttentionRegressor,
    learning_rate_schedule,
    mhla_loss_gradient,
)

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------




def _padded(rng, n_samples, n_tokens, d, min_len=1, scale=1.0):
    """Gaussian sequences with random lengths, NaN-padded, plus lengths."""
    X = scale * rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(min_len, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, lengths


def _loop_loss(X, Y, V, Q, lengths, readout):
    """Slow, obviously-correct loss: loops over samples, positions and heads."""
    total, count = 0.0, 0
    for i in range(X.shape[0]):
        positions = [lengths[i] - 1] if readout == "last" else range(lengths[i])
        for t in positions:
            y_hat = np.zeros(V.shape[1])
            for h in range(V.shape[0]):
                for s in range(t + 1):
                    xs = X[i, s]
                    y_hat += V[h] @ xs * (xs @ Q[h] @ X[i, t])
            target = Y[i] if readout == "last" else Y[i, t]
            total += np.sum((y_hat - target) ** 2)
            count += V.shape[1]
    return total / count


# ---------------------------------------------------------------------------
# loss and gradients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("n_heads, d_out", [(1, 1), (2, 3), (3, 2)])
def test_gradient_matches_finite_differences(readout, n_heads, d_out):
    rng = np.random.default_rng(100 * n_heads + d_out + (readout == "all"))
    d, n_tokens = 3, 4
    X, lengths = _padded(rng, 5, n_tokens, d)
    lengths[0] = n_tokens  # at least one full-length sequence
    X[0] = rng.normal(size=(n_tokens, d))
    X = np.nan_to_num(X)
    shape = (5, d_out) if readout == "last" else (5, n_tokens, d_out)
    Y = rng.normal(size=shape)
    V = rng.normal(size=(n_heads, d_out, d))
    Q = rng.normal(size=(n_heads, d, d))
    loss, grad_V, grad_Q = mhla_loss_gradient(X, Y, V, Q, lengths, readout=readout)
    assert loss == pytest.approx(_loop_loss(X, Y, V, Q, lengths, readout), rel=1e-12)

    def central(P, which):
        out = np.zeros_like(P)
        h = 1e-5
        for idx in np.ndindex(P.shape):
            E = np.zeros_like(P)
            E[idx] = h
            args = [(V + E, Q), (V - E, Q)] if which == "V" else [(V, Q + E), (V, Q - E)]
            plus = mhla_loss_gradient(X, Y, *args[0], lengths, readout=readout)[0]
            minus = mhla_loss_gradient(X, Y, *args[1], lengths, readout=readout)[0]
            out[idx] = (plus - minus) / (2 * h)
        return out

    for analytic, numeric in [(grad_V, central(V, "V")), (grad_Q, central(Q, "Q"))]:
        assert np.linalg.norm(analytic - numeric) / np.linalg.norm(analytic) < 1e-6


def test_gradient_ignores_padding_and_chunks(monkeypatch):
    rng = np.random.default_rng(1)
    X, lengths = _padded(rng, 30, 7, 2, min_len=2)
    V, Q = rng.normal(size=(2, 2, 2)), rng.normal(size=(2, 2, 2))
    Y = rng.normal(size=(30, 7, 2))
    real = np.arange(7)[None, :] < lengths[:, None]
    Y_nan = Y.copy()
    Y_nan[~real] = np.nan
    a = mhla_loss_gradient(np.nan_to_num(X), Y, V, Q, lengths, readout="all")
    b = mhla_loss_gradient(np.nan_to_num(X), Y_nan, V, Q, lengths, readout="all")
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    # Trimming the padded tail of the array changes nothing either.
    n = lengths.max()
    c = mhla_loss_gradient(np.nan_to_num(X)[:, :n], Y[:, :n], V, Q, lengths, readout="all")
    for u, v in zip(a, c):
        np.testing.assert_allclose(u, v, rtol=1e-12)
    # Splitting the samples into two calls and weighting by counts is the same mean.
    n_out = real.sum() * 2
    parts = [slice(0, 11), slice(11, 30)]
    acc = [0.0, 0.0, 0.0]
    for sl in parts:
        w = real[sl].sum() * 2 / n_out
        res = mhla_loss_gradient(
            np.nan_to_num(X[sl]), Y[sl], V, Q, lengths[sl], readout="all"
        )
        acc = [s + w * r for s, r in zip(acc, res)]
    for u, v in zip(a, acc):
        np.testing.assert_allclose(u, v, rtol=1e-12)
    # Memory-bounded chunks of three samples give the same loss and gradients.
    calls = []

    def small_chunks(n_samples, values_per_sample):
        calls.append(n_samples)
        return sample_chunks(n_samples, values_per_sample, budget=3 * values_per_sample)

    monkeypatch.setattr(adam, "sample_chunks", small_chunks)
    for readout, Yr in [("all", Y), ("last", Y[:, 0])]:
        chunked = mhla_loss_gradient(np.nan_to_num(X), Yr, V, Q, lengths, readout=readout)
        monkeypatch.undo()
        whole = mhla_loss_gradient(np.nan_to_num(X), Yr, V, Q, lengths, readout=readout)
        monkeypatch.setattr(adam, "sample_chunks", small_chunks)
        for u, v in zip(whole, chunked):
            np.testing.assert_allclose(u, v, rtol=1e-12)
    assert calls == [30, 30]


def test_zero_gradient_at_generator():
    rng = np.random.default_rng(2)
    V, Q = _generator(rng, 3, 2, 2)
    X = rng.normal(size=(20, 6, 3))
    for readout in ["last", "all"]:
        Y = mhla_forward(X, V, Q, readout=readout)
        loss, gV, gQ = mhla_loss_gradient(X, Y, V, Q, readout=readout)
        assert loss < 1e-28
        assert np.abs(gV).max() < 1e-13 and np.abs(gQ).max() < 1e-13


def test_loss_gradient_shape_errors():
    X = np.ones((4, 3, 2))
    V, Q = np.ones((1, 1, 2)), np.ones((1, 2, 2))
    with pytest.raises(ValueError, match="need Y of shape \\(4, 1\\)"):
        mhla_loss_gradient(X, np.ones((4, 2)), V, Q)
    with pytest.raises(ValueError, match="need Y of shape \\(4, 3, 1\\)"):
        mhla_loss_gradient(X, np.ones((4, 1)), V, Q, readout="all")
    with pytest.raises(ValueError, match="readout must be one of"):
        mhla_loss_gradient(X, np.ones((4, 1)), V, Q, readout="first")
    with pytest.raises(ValueError, match="tokens of dimension 3 .* d=2"):
        mhla_loss_gradient(X, np.ones((4, 1)), np.ones((1, 1, 3)), np.ones((1, 3, 3)))


# ---------------------------------------------------------------------------
# learning-rate schedule and the optimiser
# ---------------------------------------------------------------------------


def _direct_rate(s, n_steps, lr, warmup_fraction):
    w = int(round(warmup_fraction * n_steps))
    if s < w:
        return lr * (s + 1) / w
    return lr * 0.5 * (1 + math.cos(math.pi * (s - w) / (n_steps - w)))


@pytest.mark.parametrize(
    "n_steps, warmup_fraction", [(1, 0.0), (10, 0.0), (10, 0.2), (37, 0.05), (8, 1.0)]
)
def test_learning_rate_schedule_formula(n_steps, warmup_fraction):
    steps = np.arange(n_steps)
    rates = learning_rate_schedule(steps, n_steps, 0.3, warmup_fraction)
    expected = [_direct_rate(s, n_steps, 0.3, warmup_fraction) for s in steps]
    np.testing.assert_allclose(rates, expected, rtol=1e-14, atol=0)
    assert learning_rate_schedule(n_steps - 1, n_steps, 0.3, warmup_fraction) == (
        pytest.approx(expected[-1], rel=1e-14)
    )
    assert (rates > 0).all() and rates.max() <= 0.3 + 1e-15


def test_learning_rate_schedule_shape():
    rates = learning_rate_schedule(np.arange(100), 100, 1.0, 0.1)
    # Warm-up rises linearly to the peak, the cosine then only decreases.
    np.testing.assert_allclose(rates[:10], np.arange(1, 11) / 10)
    assert rates[10] == 1.0
    assert (np.diff(rates[10:]) < 0).all()
    assert rates[55] == pytest.approx(0.5)  # half-way through the cosine
    assert rates[-1] == pytest.approx(0.5 * (1 - math.cos(math.pi / 90)))


def _reference_adam(X, Y, lengths, V, Q, readout, n_steps, lr, warmup, b1, b2, eps, wd,
                    factor=1.0, max_norm=None):
    """Full-batch AdamW written out step by step, with the direct schedule.

    The trained parameters are ``(A, Q)`` with heads ``V = factor * A``, so
    the gradient in A is ``factor`` times the one in V; with ``max_norm`` both
    gradients are rescaled together to that norm whenever it is exceeded.
    """
    params = [V.copy(), Q.copy()]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for s in range(n_steps):
        _, gV, gQ = mhla_loss_gradient(X, Y, factor * params[0], params[1], lengths,
                                       readout=readout)
        grads = [factor * gV, gQ]
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads))
        if max_norm is not None and norm > max_norm:
            grads = [g * (max_norm / norm) for g in grads]
        rate = _direct_rate(s, n_steps, lr, warmup)
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1 ** (s + 1))
            v_hat = v[i] / (1 - b2 ** (s + 1))
            params[i] = params[i] * (1 - rate * wd) - rate * m_hat / (np.sqrt(v_hat) + eps)
    return params


@pytest.mark.parametrize("readout, weight_decay", [("last", 0.0), ("all", 0.3)])
def test_matches_reference_adamw(readout, weight_decay):
    rng = np.random.default_rng(3)
    d, n_heads, d_out, seed = 3, 2, 2, 7
    X, lengths = _padded(rng, 20, 5, d, min_len=2)
    V_true, Q_true = _generator(rng, d, d_out)
    Y = mhla_forward(np.nan_to_num(X), V_true, Q_true, lengths, readout=readout)
    params = dict(
        n_heads=n_heads, readout=readout, learning_rate=0.02, batch_size=64,
        max_epochs=6, warmup_fraction=0.34, weight_decay=weight_decay, beta_1=0.8,
        beta_2=0.99, epsilon=1e-7, init_scale=0.4, random_state=seed,
    )
    model = AdamLinearAttentionRegressor(**params).fit(X, Y)
    # The initial heads are the first draws of the seeded generator.
    rs = check_random_state(seed)
    V0 = 0.4 * rs.standard_normal((n_heads, d_out, d))
    Q0 = 0.4 * rs.standard_normal((n_heads, d, d))
    Y0 = np.nan_to_num(Y)
    V_ref, Q_ref = _reference_adam(
        np.nan_to_num(X), Y0, lengths, V0, Q0, readout, 6, 0.02, 0.34, 0.8, 0.99, 1e-7,
        weight_decay,
    )
    # Full batches: the shuffle only reorders the sum of the gradient.
    np.testing.assert_allclose(model.value_matrices_, V_ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.key_query_matrices_, Q_ref, rtol=1e-9, atol=1e-12)
    assert not np.allclose(V_ref, V0)


# ---------------------------------------------------------------------------
# the paper's parametrisation and gradient clipping
# ---------------------------------------------------------------------------


def _paper_loop_outputs(X, P, Q, lengths, readout):
    """The paper's code, literally: mean_h causal((Z Q_h^T) Z^T / sqrt(d)) (Z P_h^T)."""
    n_heads, d = Q.shape[0], Q.shape[1]
    outputs = []
    for i in range(X.shape[0]):
        Z = X[i, : lengths[i]]
        out = 0.0
        for h in range(n_heads):
            scores = np.tril((Z @ Q[h].T) @ Z.T / np.sqrt(d))
            out = out + scores @ (Z @ P[h].T)
        out = out / n_heads
        outputs.append(out[-1:] if readout == "last" else out)
    return outputs


def _paper_loop_loss(X, Y, P, Q, lengths, readout):
    """Mean squared error over real outputs of :func:`_paper_loop_outputs`."""
    total, count = 0.0, 0
    for i, out in enumerate(_paper_loop_outputs(X, P, Q, lengths, readout)):
        target = Y[i][None] if readout == "last" else Y[i, : lengths[i]]
        total += np.sum((out - target) ** 2)
        count += out.size
    return total / count


@pytest.mark.parametrize("readout", ["last", "all"])
def test_paper_gradient_matches_finite_differences(readout):
    rng = np.random.default_rng(20 + (readout == "all"))
    n_heads, d_out, d, n_tokens = 3, 2, 3, 4
    X, lengths = _padded(rng, 5, n_tokens, d)
    X = np.nan_to_num(X)
    Y = rng.normal(size=(5, d_out) if readout == "last" else (5, n_tokens, d_out))
    P = rng.normal(size=(n_heads, d_out, d))
    Q = rng.normal(size=(n_heads, d, d))
    factor = adam._value_factor("paper", n_heads, d)
    assert factor == pytest.approx(1 / (n_heads * math.sqrt(d)), rel=1e-15)
    loss, grad_P, grad_Q, _ = adam._trained_loss_gradient(
        X, Y, lengths, P, Q, readout, factor
    )
    assert loss == pytest.approx(_paper_loop_loss(X, Y, P, Q, lengths, readout), rel=1e-12)

    def central(which):
        base = P if which == "P" else Q
        out = np.zeros_like(base)
        h = 1e-5
        for idx in np.ndindex(base.shape):
            E = np.zeros_like(base)
            E[idx] = h
            if which == "P":
                plus, minus = (P + E, Q), (P - E, Q)
            else:
                plus, minus = (P, Q + E), (P, Q - E)
            out[idx] = (_paper_loop_loss(X, Y, *plus, lengths, readout)
                        - _paper_loop_loss(X, Y, *minus, lengths, readout)) / (2 * h)
        return out

    for analytic, numeric in [(grad_P, central("P")), (grad_Q, central("Q"))]:
        assert np.linalg.norm(analytic - numeric) / np.linalg.norm(analytic) < 1e-6
    # The exact reparametrisation V = factor * P of the package's own gradient.
    _, grad_V, grad_QV = mhla_loss_gradient(X, Y, factor * P, Q, lengths, readout=readout)
    np.testing.assert_allclose(grad_P, factor * grad_V, rtol=1e-13)
    np.testing.assert_allclose(grad_Q, grad_QV, rtol=1e-13)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_paper_parametrization_matches_reference_adam(readout):
    rng = np.random.default_rng(21)
    d, n_heads, d_out, seed = 3, 2, 2, 5
    X, lengths = _padded(rng, 20, 5, d, min_len=2)
    V_true, Q_true = _generator(rng, d, d_out)
    Y = mhla_forward(np.nan_to_num(X), V_true, Q_true, lengths, readout=readout)
    model = AdamLinearAttentionRegressor(
        n_heads=n_heads, readout=readout, parametrization="paper", learning_rate=0.05,
        batch_size=64, max_epochs=6, warmup_fraction=0.34, init_scale=0.4,
        random_state=seed,
    ).fit(X, Y)
    rs = check_random_state(seed)
    P0 = 0.4 * rs.standard_normal((n_heads, d_out, d))
    Q0 = 0.4 * rs.standard_normal((n_heads, d, d))
    factor = 1 / (n_heads * math.sqrt(d))
    P_ref, Q_ref = _reference_adam(
        np.nan_to_num(X), np.nan_to_num(Y), lengths, P0, Q0, readout, 6, 0.05, 0.34, 0.9,
        0.999, 1e-8, 0.0, factor=factor,
    )
    np.testing.assert_allclose(model.value_matrices_, factor * P_ref, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(model.key_query_matrices_, Q_ref, rtol=1e-9, atol=1e-12)
    P_fit, Q_fit = paper_from_heads(model.value_matrices_, model.key_query_matrices_)
    np.testing.assert_allclose(P_fit, P_ref, rtol=1e-9, atol=1e-12)
    # Adam's steps are taken in P: training the heads V_h directly goes elsewhere.
    summed = clone(model).set_params(parametrization="sum").fit(X, Y)
    assert not np.allclose(summed.value_matrices_, model.value_matrices_, rtol=1e-3)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_paper_parametrization_exports_the_learned_function(readout):
    rng = np.random.default_rng(22)
    d, n_heads = 3, 4
    V, Q = _generator(rng, d)
    X, lengths = _padded(rng, 60, 6, d, min_len=2, scale=1 / np.sqrt(6))
    y = mhla_forward(np.nan_to_num(X), V, Q, lengths, readout=readout)[..., 0]
    model = AdamLinearAttentionRegressor(
        n_heads=n_heads, readout=readout, parametrization="paper", max_epochs=3,
        validation_fraction=0.25, random_state=0,
    ).fit(X, y)
    # The exported heads are the function Adam monitored: the validation split
    # is the generator's draw after the initial parameters.
    rs = check_random_state(0)
    rs.standard_normal(n_heads * d + n_heads * d * d)
    val = np.sort(rs.permutation(60)[:15])
    pred_val = model.predict(X[val])
    if readout == "all":
        real = ~np.isnan(pred_val)
        pred_val, y_val = pred_val[real], y[val][real]
    else:
        y_val = y[val]
    monitored = np.mean((pred_val - y_val) ** 2) / np.mean(y_val**2)
    assert monitored == pytest.approx(model.validation_curve_[-1], rel=1e-10)
    X_nan, lengths_new = _padded(rng, 7, 9, d)
    X_new = np.nan_to_num(X_nan)
    heads = mhla_forward(X_new, model.value_matrices_, model.key_query_matrices_,
                         lengths_new, readout=readout)[..., 0]
    pred = model.predict(X_nan)
    if readout == "all":  # NaN exactly at the padded positions, as the targets
        real = np.arange(9)[None, :] < lengths_new[:, None]
        np.testing.assert_array_equal(np.isnan(pred), ~real)
        pred, heads = pred[real], heads[real]
    np.testing.assert_array_equal(pred, heads)
    np.testing.assert_allclose(
        attention_coefficients(model.value_matrices_, model.key_query_matrices_),
        model.coef_,
    )
    # The paper's own forward pass of the trained (P_h, Q_h) computes the same outputs.
    P, Q_fit = paper_from_heads(model.value_matrices_, model.key_query_matrices_)
    loops = _paper_loop_outputs(X_new, P, Q_fit, lengths_new, readout)
    np.testing.assert_allclose(np.concatenate([out[:, 0] for out in loops]), heads,
                               rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("parametrization", ["sum", "paper"])
def test_parametrization_sets_the_scale_of_the_values(parametrization):
    rng = np.random.default_rng(23)
    d, n_heads, lr = 4, 3, 1e-3
    X = rng.normal(size=(40, 5, d))
    y = rng.normal(size=40)
    factor = 1.0 if parametrization == "sum" else 1 / (n_heads * math.sqrt(d))
    # One full-batch step without warm-up: Adam's first step moves every
    # trained entry by the learning rate (m_hat / sqrt(v_hat) = sign of the
    # gradient), so each V_h entry moves by factor * lr.
    model = AdamLinearAttentionRegressor(
        n_heads=n_heads, parametrization=parametrization, learning_rate=lr,
        batch_size=100, max_epochs=1, warmup_fraction=0.0, epsilon=1e-300, random_state=1,
    ).fit(X, y)
    rs = check_random_state(1)
    A0 = rs.standard_normal((n_heads, 1, d)) / math.sqrt(d)
    Q0 = rs.standard_normal((n_heads, d, d)) / math.sqrt(d)
    np.testing.assert_allclose(np.abs(model.value_matrices_ - factor * A0), factor * lr,
                               rtol=1e-9)
    np.testing.assert_allclose(np.abs(model.key_query_matrices_ - Q0), lr, rtol=1e-9)


@pytest.mark.parametrize("parametrization", ["sum", "paper"])
def test_gradient_clipping_matches_reference(parametrization):
    rng = np.random.default_rng(24)
    d, n_heads, seed, n_steps = 3, 2, 3, 8
    X = rng.normal(size=(30, 5, d))
    V_true, Q_true = _generator(rng, d)
    y = mhla_forward(X, V_true, Q_true)[:, 0]
    factor = 1.0 if parametrization == "sum" else 1 / (n_heads * math.sqrt(d))
    rs = check_random_state(seed)
    A0 = rs.standard_normal((n_heads, 1, d)) / math.sqrt(d)
    Q0 = rs.standard_normal((n_heads, d, d)) / math.sqrt(d)
    _, gV, gQ = mhla_loss_gradient(X, y[:, None], factor * A0, Q0)
    first_norm = math.sqrt(np.sum((factor * gV) ** 2) + np.sum(gQ**2))
    max_norm = 0.3 * first_norm
    params = dict(n_heads=n_heads, parametrization=parametrization, learning_rate=0.05,
                  batch_size=64, max_epochs=n_steps, warmup_fraction=0.25, random_state=seed)
    model = AdamLinearAttentionRegressor(**params, max_grad_norm=max_norm).fit(X, y)
    reference = [_reference_adam(X, y[:, None], np.full(30, 5), A0, Q0, "last", n_steps, 0.05,
                                 0.25, 0.9, 0.999, 1e-8, 0.0, factor=factor, max_norm=norm)
                 for norm in (max_norm, None)]
    np.testing.assert_allclose(model.value_matrices_, factor * reference[0][0], rtol=1e-9,
                               atol=1e-13)
    np.testing.assert_allclose(model.key_query_matrices_, reference[0][1], rtol=1e-9,
                               atol=1e-13)
    # Clipping changed the run: the norms differ from step to step, which Adam sees.
    assert not np.allclose(reference[0][1], reference[1][1], rtol=1e-4)
    # A bound above every gradient norm never clips: the same run as without one.
    free = AdamLinearAttentionRegressor(**params).fit(X, y)
    loose = AdamLinearAttentionRegressor(**params, max_grad_norm=1e6 * first_norm).fit(X, y)
    np.testing.assert_array_equal(loose.value_matrices_, free.value_matrices_)
    np.testing.assert_array_equal(loose.key_query_matrices_, free.key_query_matrices_)


def test_clip_gradients_rescales_both_together():
    rng = np.random.default_rng(25)
    gA, gQ = rng.normal(size=(2, 1, 3)), rng.normal(size=(2, 3, 3))
    norm = math.sqrt(np.sum(gA**2) + np.sum(gQ**2))
    cA, cQ = adam._clip_gradients(gA, gQ, 0.5 * norm)
    assert math.sqrt(np.sum(cA**2) + np.sum(cQ**2)) == pytest.approx(0.5 * norm, rel=1e-14)
    np.testing.assert_allclose(cA, 0.5 * gA, rtol=1e-14)
    np.testing.assert_allclose(cQ, 0.5 * gQ, rtol=1e-14)
    same = adam._clip_gradients(gA, gQ, 2 * norm)
    assert same[0] is gA and same[1] is gQ


def test_training_decreases_loss():
    rng = np.random.default_rng(4)
    V, Q = _generator(rng, 3, 1, 2)
    X = rng.normal(size=(300, 8, 3)) / np.sqrt(8)
    y = mhla_forward(X, V, Q)[:, 0]
    model = AdamLinearAttentionRegressor(
        n_heads=2, max_epochs=30, learning_rate=0.03, random_state=0
    ).fit(X, y)
    curve = np.array(model.loss_curve_)
    assert len(curve) == model.n_iter_ == 30
    assert curve[-1] < 0.1 * curve[0]
    assert np.mean(curve[-5:]) < 0.1 * np.mean(curve[:5])
    # The trained model is much better than the initial one on the training data.
    init = AdamLinearAttentionRegressor(
        n_heads=2, max_epochs=1, learning_rate=1e-12, random_state=0
    ).fit(X, y)
    assert model.score(X, y) > 0.9 and init.score(X, y) < 0


@pytest.mark.parametrize("readout, seed", [("last", 0), ("last", 1), ("all", 2)])
def test_realizable_data_reaches_low_validation_error(readout, seed):
    rng = np.random.default_rng(seed)
    d = 2
    V, Q = _generator(rng, d)
    X = rng.normal(size=(512, 10, d)) / np.sqrt(10)
    y = mhla_forward(X, V, Q, readout=readout)[..., 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = AdamLinearAttentionRegressor(
            n_heads=4, readout=readout, learning_rate=0.05, max_epochs=100,
            validation_fraction=0.25, tol=1e-3, random_state=seed,
        ).fit(X, y)
    assert model.validation_curve_[-1] < 1e-3
    assert model.n_iter_ == len(model.validation_curve_) == len(model.elapsed_) < 100
    assert all(v >= 1e-3 for v in model.validation_curve_[:-1])
    assert np.all(np.diff(model.elapsed_) > 0)
    # The learned function is close to the generator on unseen, longer inputs.
    X_new = rng.normal(size=(50, 30, d)) / np.sqrt(10)
    y_new = mhla_forward(X_new, V, Q, readout=readout)[..., 0]
    pred = model.predict(X_new)
    assert np.linalg.norm(pred - y_new) / np.linalg.norm(y_new) < 0.1
    # Four heads at d = 2 match the closed form's coefficients once trained longer.
    p_true = attention_coefficients(V, Q)
    long = clone(model).set_params(tol=None, max_epochs=150).fit(X, y)
    assert np.linalg.norm(long.coef_ - p_true) / np.linalg.norm(p_true) < 1e-6


def test_tol_without_validation_uses_training_data_and_warns():
    rng = np.random.default_rng(5)
    V, Q = _generator(rng, 2)
    X = rng.normal(size=(200, 6, 2)) / np.sqrt(6)
    y = mhla_forward(X, V, Q)[:, 0]
    model = AdamLinearAttentionRegressor(
        n_heads=4, learning_rate=0.05, max_epochs=200, tol=1e-2, random_state=0
    ).fit(X, y)
    assert model.validation_curve_ is None
    assert model.n_iter_ < 200
    pred = model.predict(X)
    assert np.mean((pred - y) ** 2) / np.mean(y**2) < 1e-2
    with pytest.warns(ConvergenceWarning, match="above tol=1e-12"):
        AdamLinearAttentionRegressor(max_epochs=2, tol=1e-12, random_state=0).fit(X, y)


def test_reproducible_with_random_state():
    rng = np.random.default_rng(6)
    X, lengths = _padded(rng, 60, 6, 2, min_len=2)
    y = rng.normal(size=60)
    params = dict(n_heads=2, max_epochs=5, batch_size=8, validation_fraction=0.2)
    a = AdamLinearAttentionRegressor(**params, random_state=3).fit(X, y)
    b = AdamLinearAttentionRegressor(**params, random_state=3).fit(X, y)
    c = AdamLinearAttentionRegressor(**params, random_state=4).fit(X, y)
    np.testing.assert_array_equal(a.value_matrices_, b.value_matrices_)
    np.testing.assert_array_equal(a.key_query_matrices_, b.key_query_matrices_)
    assert a.loss_curve_ == b.loss_curve_ and a.validation_curve_ == b.validation_curve_
    assert not np.allclose(a.value_matrices_, c.value_matrices_)
    # A RandomState instance is consumed, as everywhere in scikit-learn.
    rs = np.random.RandomState(3)
    d = AdamLinearAttentionRegressor(**params, random_state=rs).fit(X, y)
    np.testing.assert_array_equal(a.value_matrices_, d.value_matrices_)


# ---------------------------------------------------------------------------
# estimator contract
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("multi", [False, True])
def test_shapes_match_closed_form(readout, multi):
    rng = np.random.default_rng(7)
    d, d_out = 3, 2
    V, Q = _generator(rng, d, d_out)
    X, lengths = _padded(rng, 40, 6, d, min_len=2)
    Y = mhla_forward(np.nan_to_num(X), V, Q, lengths, readout=readout)
    y = Y if multi else Y[..., 0]
    seqs = [X[i, : lengths[i]] for i in range(len(X))]
    adam = AdamLinearAttentionRegressor(n_heads=3, readout=readout, max_epochs=2).fit(
        seqs, y
    )
    closed = LinearAttentionRegressor(readout=readout).fit(X, y)
    X_new, lengths_new = _padded(rng, 7, 9, d, min_len=1)
    for inp in (X_new, [X_new[i, : lengths_new[i]] for i in range(7)]):
        p_adam, p_closed = adam.predict(inp), closed.predict(inp)
        assert p_adam.shape == p_closed.shape
        np.testing.assert_array_equal(np.isnan(p_adam), np.isnan(p_closed))
    assert adam.coef_.shape == closed.coef_.shape
    assert adam.value_matrices_.shape == (3, y.shape[-1] if multi else 1, d)
    assert adam.key_query_matrices_.shape == (3, d, d)
    assert adam.n_heads_ == 3 and adam.n_features_in_ == d
    assert adam.n_outputs_ == (d_out if multi else 1)
    np.testing.assert_allclose(
        adam.coef_, attention_coefficients(adam.value_matrices_, adam.key_query_matrices_)
    )
    # predict is the forward pass of the fitted heads.
    expected = mhla_forward(
        np.nan_to_num(X_new), adam.value_matrices_, adam.key_query_matrices_,
        lengths_new, readout=readout,
    )
    np.testing.assert_array_equal(
        adam.predict(X_new), expected if multi else expected[..., 0]
    )


def test_two_d_input_and_token_dim():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(30, 12))
    y = rng.normal(size=30)
    a = AdamLinearAttentionRegressor(max_epochs=2, random_state=0).fit(X, y)
    assert a.n_features_in_ == 1
    b = AdamLinearAttentionRegressor(max_epochs=2, token_dim=3, random_state=0).fit(X, y)
    assert b.n_features_in_ == 3
    c = AdamLinearAttentionRegressor(max_epochs=2, random_state=0).fit(
        X.reshape(30, 4, 3), y
    )
    np.testing.assert_array_equal(b.value_matrices_, c.value_matrices_)
    assert b.predict(X).shape == (30,)


def test_score_matches_closed_form_semantics():
    rng = np.random.default_rng(9)
    X, lengths = _padded(rng, 40, 6, 2, min_len=2)
    y = rng.normal(size=(40, 6))
    real = np.arange(6)[None, :] < lengths[:, None]
    y[~real] = np.nan
    model = AdamLinearAttentionRegressor(readout="all", max_epochs=3, random_state=0)
    model.fit(X, y)
    pred = model.predict(X)
    resid = ((y[real] - pred[real]) ** 2).sum()
    total = ((y[real] - y[real].mean()) ** 2).sum()
    assert model.score(X, y) == pytest.approx(1 - resid / total, rel=1e-12)
    w = rng.uniform(0.5, 2.0, size=40)
    wr = np.broadcast_to(w[:, None], real.shape)[real]
    mean = np.average(y[real], weights=wr)
    expected = 1 - np.sum(wr * (y[real] - pred[real]) ** 2) / np.sum(
        wr * (y[real] - mean) ** 2
    )
    assert model.score(X, y, sample_weight=w) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="sample_weight must have shape \\(40,\\)"):
        model.score(X, y, sample_weight=np.ones(3))


def test_validation_split_and_curves():
    rng = np.random.default_rng(10)
    X = rng.normal(size=(50, 5, 2))
    y = rng.normal(size=50)
    model = AdamLinearAttentionRegressor(
        max_epochs=4, validation_fraction=0.3, random_state=0
    ).fit(X, y)
    assert len(model.loss_curve_) == len(model.validation_curve_) == 4
    assert len(model.elapsed_) == model.n_iter_ == 4
    assert all(np.isfinite(model.loss_curve_)) and all(np.isfinite(model.validation_curve_))
    with pytest.raises(ValueError, match="validation_fraction=0.5 leaves no training"):
        AdamLinearAttentionRegressor(validation_fraction=0.5).fit(X[:1], y[:1])


def test_verbose_prints_epochs(capsys):
    X = np.random.default_rng(11).normal(size=(20, 4, 2))
    y = np.ones(20)
    AdamLinearAttentionRegressor(max_epochs=2, verbose=1, validation_fraction=0.2).fit(X, y)
    out = capsys.readouterr().out
    assert "epoch 2/2: loss" in out and "relative validation MSE" in out


def test_divergence_is_reported():
    X = 1e3 * np.random.default_rng(12).normal(size=(20, 4, 2))
    y = np.zeros(20)
    with pytest.raises(ValueError, match="Adam diverged"), np.errstate(all="ignore"):
        AdamLinearAttentionRegressor(
            learning_rate=1e3, init_scale=1e80, max_epochs=2
        ).fit(X, y)


def test_clone_pickle():
    rng = np.random.default_rng(13)
    X = rng.normal(size=(30, 4, 2))
    y = rng.normal(size=30)
    model = AdamLinearAttentionRegressor(max_epochs=2, random_state=0).fit(X, y)
    cloned = clone(model)
    assert cloned.get_params() == model.get_params()
    assert not hasattr(cloned, "coef_")
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(X), model.predict(X))


@pytest.mark.parametrize(
    "params, error, match",
    [
        ({"n_heads": 0}, ValueError, "n_heads must be an integer >= 1; got 0"),
        ({"n_heads": 2.0}, TypeError, "n_heads must be an integer >= 1; got 2.0"),
        ({"n_heads": True}, TypeError, "n_heads must be an integer"),
        ({"readout": "first"}, ValueError, "readout must be one of"),
        ({"learning_rate": 0}, ValueError, "learning_rate must be a real number > 0; got 0"),
        ({"learning_rate": "1e-3"}, TypeError, "learning_rate must be a real number"),
        ({"learning_rate": np.inf}, ValueError, "learning_rate must be a real number"),
        ({"batch_size": 0}, ValueError, "batch_size must be an integer >= 1; got 0"),
        ({"max_epochs": 0}, ValueError, "max_epochs must be an integer >= 1; got 0"),
        ({"max_epochs": 1.5}, TypeError, "max_epochs must be an integer"),
        (
            {"warmup_fraction": 1.5},
            ValueError,
            "warmup_fraction must be a real number in \\[0, 1\\]; got 1.5",
        ),
        ({"weight_decay": -1.0}, ValueError, "weight_decay must be a real number >= 0; got -1.0"),
        ({"beta_1": 1.0}, ValueError, "beta_1 must be a real number in \\[0, 1\\); got 1.0"),
        ({"beta_2": -0.1}, ValueError, "beta_2 must be a real number in \\[0, 1\\)"),
        ({"epsilon": 0.0}, ValueError, "epsilon must be a real number > 0; got 0.0"),
        ({"init_scale": -1.0}, ValueError, "init_scale must be None or a real number > 0; got -1.0"),
        ({"init_scale": "big"}, TypeError, "init_scale must be None or a real number"),
        (
            {"parametrization": "mean"},
            ValueError,
            "parametrization must be one of \\('sum', 'paper'\\).*got 'mean'",
        ),
        ({"parametrization": None}, ValueError, "parametrization must be one of"),
        (
            {"max_grad_norm": 0.0},
            ValueError,
            "max_grad_norm must be None or a real number > 0; got 0.0",
        ),
        ({"max_grad_norm": "5"}, TypeError, "max_grad_norm must be None or a real number"),
        (
            {"validation_fraction": 1.0},
            ValueError,
            "validation_fraction must be a real number in \\[0, 1\\)",
        ),
        ({"tol": 0.0}, ValueError, "tol must be None or a real number > 0; got 0.0"),
        ({"tol": np.nan}, ValueError, "tol must be None or a real number"),
        ({"token_dim": 0}, ValueError, "token_dim must be a positive integer"),
        ({"verbose": -1}, ValueError, "verbose must be an integer >= 0"),
        ({"verbose": "yes"}, TypeError, "verbose must be an integer"),
    ],
)
def test_parameter_validation(params, error, match):
    X = np.ones((10, 3, 2))
    y = np.ones(10)
    model = AdamLinearAttentionRegressor(**params)
    assert model.get_params()[next(iter(params))] is params[next(iter(params))]
    with pytest.raises(error, match=match):
        model.fit(X, y)


def test_input_errors_as_closed_form():
    X = np.ones((10, 3, 2))
    model = AdamLinearAttentionRegressor(max_epochs=1)
    with pytest.raises(ValueError, match="readout='all'"):
        model.fit(X, np.ones((10, 3, 1)))
    with pytest.raises(ValueError, match="one entry per sequence"):
        model.fit(X, np.ones(9))
    model.fit(X, np.ones(10))
    with pytest.raises(ValueError, match="dimension d=3.*d=2"):
        model.predict(np.ones((2, 3, 3)))


# ---------------------------------------------------------------------------
# sample weights
# ---------------------------------------------------------------------------


def _weighted_loop_loss(X, Y, V, Q, lengths, readout, w):
    """The loop loss with every output of sequence i counted w[i] times."""
    total, count = 0.0, 0.0
    for i in range(X.shape[0]):
        part = _loop_loss(X[i:i + 1], Y[i:i + 1], V, Q, lengths[i:i + 1], readout)
        outputs = V.shape[1] * (1 if readout == "last" else lengths[i])
        total += w[i] * part * outputs
        count += w[i] * outputs
    return total / count


@pytest.mark.parametrize("readout", ["last", "all"])
def test_weighted_loss_and_gradient_match_the_loop_and_finite_differences(readout):
    rng = np.random.default_rng(20)
    X, lengths = _padded(rng, 7, 4, 2, min_len=2)
    V, Q = rng.normal(size=(2, 2, 2)), rng.normal(size=(2, 2, 2))
    Y = rng.normal(size=(7, 2) if readout == "last" else (7, 4, 2))
    w = rng.uniform(0.2, 3.0, size=7)
    X0 = np.nan_to_num(X)
    loss, gV, gQ, _ = adam._loss_gradient(X0, Y, lengths, V, Q, readout, w)
    assert loss == pytest.approx(_weighted_loop_loss(X, Y, V, Q, lengths, readout, w),
                                 rel=1e-12)
    h = 1e-6
    for G, P, which in ((gV, V, 0), (gQ, Q, 1)):
        for index in np.ndindex(P.shape):
            Pp, Pm = P.copy(), P.copy()
            Pp[index] += h
            Pm[index] -= h
            args_p = (Pp, Q) if which == 0 else (V, Pp)
            args_m = (Pm, Q) if which == 0 else (V, Pm)
            fd = (adam._loss_gradient(X0, Y, lengths, *args_p, readout, w)[0]
                  - adam._loss_gradient(X0, Y, lengths, *args_m, readout, w)[0]) / (2 * h)
            assert G[index] == pytest.approx(fd, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_sample_weight_two_is_a_duplicate_and_zero_a_drop(readout):
    # Full-batch steps (batch_size above the number of sequences): weight 2
    # and a duplicated sequence give the same gradient at every step, so the
    # same trained heads; weight 0 and a dropped sequence are the same data.
    rng = np.random.default_rng(21)
    X, lengths = _padded(rng, 12, 5, 2, min_len=2)
    y = rng.normal(size=12) if readout == "last" else np.where(
        np.isnan(X[:, :, 0]), np.nan, rng.normal(size=(12, 5)))
    w = np.array([2, 0, 1, 1, 2, 0, 1, 3, 1, 1, 2, 1])
    params = dict(n_heads=2, readout=readout, batch_size=64, max_epochs=30,
                  learning_rate=0.05, random_state=0)
    weighted = AdamLinearAttentionRegressor(**params).fit(X, y, sample_weight=w)
    repeated = AdamLinearAttentionRegressor(**params).fit(np.repeat(X, w, axis=0),
                                                          np.repeat(y, w, axis=0))
    np.testing.assert_allclose(weighted.value_matrices_, repeated.value_matrices_,
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(weighted.key_query_matrices_, repeated.key_query_matrices_,
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(weighted.loss_curve_, repeated.loss_curve_, rtol=1e-9)
    # The training has moved the heads: the comparison is not between two starts.
    start = AdamLinearAttentionRegressor(**dict(params, max_epochs=1, learning_rate=1e-12))
    start.fit(X, y)
    assert not np.allclose(weighted.key_query_matrices_, start.key_query_matrices_, atol=1e-3)
    # Weights are relative: scaling them all changes nothing.
    scaled = AdamLinearAttentionRegressor(**params).fit(X, y, sample_weight=w * 1e300)
    np.testing.assert_allclose(scaled.value_matrices_, weighted.value_matrices_, rtol=1e-9,
                               atol=1e-12)


def test_zero_weights_are_dropped_before_any_draw():
    # With minibatches and a validation split, weight 0 is still exactly the
    # sequence removed: it is dropped before the split and the shuffles draw.
    rng = np.random.default_rng(22)
    X, lengths = _padded(rng, 40, 5, 2, min_len=2)
    y = rng.normal(size=40)
    w = np.ones(40)
    w[[3, 17, 30]] = 0.0
    params = dict(n_heads=2, batch_size=8, max_epochs=4, validation_fraction=0.2,
                  random_state=0)
    a = AdamLinearAttentionRegressor(**params).fit(X, y, sample_weight=w)
    b = AdamLinearAttentionRegressor(**params).fit(X[w > 0], y[w > 0])
    np.testing.assert_array_equal(a.value_matrices_, b.value_matrices_)
    np.testing.assert_array_equal(a.key_query_matrices_, b.key_query_matrices_)
    assert a.validation_curve_ == b.validation_curve_


def test_weighted_validation_curve_is_the_weighted_relative_mse():
    rng = np.random.default_rng(23)
    X = rng.normal(size=(30, 4, 2))
    y = rng.normal(size=30)
    w = rng.uniform(0.5, 3.0, size=30)
    model = AdamLinearAttentionRegressor(max_epochs=2, validation_fraction=0.3,
                                         random_state=0).fit(X, y, sample_weight=w)
    # The split the fit drew: the same draws as without weights.
    fit_rng = check_random_state(0)
    fit_rng.standard_normal((1, 1, 2))
    fit_rng.standard_normal((1, 2, 2))
    _, val = model._split(30, fit_rng)
    pred = model.predict(X[val])
    expected = np.average((pred - y[val]) ** 2, weights=w[val]) / np.average(
        y[val] ** 2, weights=w[val])
    assert model.validation_curve_[-1] == pytest.approx(expected, rel=1e-10)


def test_sample_weight_errors():
    X = np.random.default_rng(24).normal(size=(10, 3, 2))
    y = np.ones(10)
    model = AdamLinearAttentionRegressor(max_epochs=1)
    with pytest.raises(ValueError, match="sample_weight must be positive for at least one"):
        model.fit(X, y, sample_weight=np.zeros(10))
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(10,\)"):
        model.fit(X, y, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match=r"sample_weight must be non-negative"):
        model.fit(X, y, sample_weight=-np.ones(10))
