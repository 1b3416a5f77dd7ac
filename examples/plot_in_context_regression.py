"""
===============================================================
In-context linear regression: the optimum of one layer, exactly
===============================================================

A prompt is ``N`` pairs ``(x_i, y_i)`` with ``y_i = w . x_i`` for a task ``w`` of its own, then a
query ``(x_q, 0)``; the target is ``w . x_q``. One linear self-attention layer trained on such
prompts is known to converge to ``y_hat = x_q^T Gamma^-1 (1/N) sum_i y_i x_i`` with
``Gamma = (1 + 1/N) Lambda + tr(Lambda) / N I`` (Zhang, Frei and Bartlett, JMLR 2024; Ahn et al.,
NeurIPS 2023: one step of preconditioned gradient descent). Here the exact least squares over the
whole layer class reaches it in a fraction of a second, and we compare it, over N, with

- the formula above,
- a PyTorch layer trained by Adam,
- least squares and ridge regression on each prompt's own context.

Then the layer with heads of dimension one (``head_dim=1``): the best such layers with 1, 2 and 3
heads, fitted exactly, against the plateaus of a gradient descent run on a layer of three heads
of dimension one, which learns the input's principal directions one at a time (Zhang, Singh,
Latham and Saxe, ICML 2025). The user guide's :doc:`/in_context` page explains the certificate's
answer on these prompts.
"""

import time

import matplotlib.pyplot as plt
import numpy as np
import torch

from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn.datasets import make_in_context_regression
from sklearn_linattn.nn import MultiHeadLinearAttention

D = 3
cov = np.array([0.25, 1.0, 4.0])  # Lambda, the inputs' covariance


def formula(X, N):
    Lam = np.diag(cov)
    Gamma = (1 + 1 / N) * Lam + np.trace(Lam) / N * np.eye(D)
    moment = (X[:, :N, :D] * X[:, :N, D:]).mean(axis=1)  # (1/N) sum_i y_i x_i
    return np.einsum("ij,ij->i", X[:, N, :D], np.linalg.solve(Gamma, moment.T).T)


def on_context(X, N, ridge):
    """Each prompt's own (ridge) least squares on its N pairs, evaluated at its query."""
    A = np.einsum("itj,itk->ijk", X[:, :N, :D], X[:, :N, :D]) + ridge * np.eye(D)
    b = np.einsum("itj,it->ij", X[:, :N, :D], X[:, :N, D])
    # The minimum-norm solution where the N pairs do not determine w (N < D).
    w = np.einsum("ijk,ik->ij", np.linalg.pinv(A) if ridge == 0 else np.linalg.inv(A), b)
    return np.einsum("ij,ij->i", X[:, N, :D], w)


def adam_layer(X, y, steps=300):
    torch.manual_seed(0)
    layer = MultiHeadLinearAttention(D + 1, n_heads=1, d_out=1, dtype=torch.float64)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.02)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((layer(Xt)[:, 0] - yt) ** 2).mean()
        loss.backward()
        optimizer.step()
    return layer


Ns = [2, 4, 8, 16, 32]
results = {name: [] for name in ("closed form", "formula", "Adam layer", "least squares",
                                 "ridge (lambda = 1)")}
for N in Ns:
    X, y = make_in_context_regression(20000, N, D, covariance=cov, random_state=0)
    X_test, y_test = make_in_context_regression(5000, N, D, covariance=cov, random_state=1)
    start = time.perf_counter()
    model = LinearAttentionRegressor().fit(X, y)
    seconds = time.perf_counter() - start
    layer = adam_layer(X[:2000], y[:2000])
    preds = {
        "closed form": model.predict(X_test),
        "formula": formula(X_test, N),
        "Adam layer": layer(torch.as_tensor(X_test)).detach().numpy()[:, 0],
        "least squares": on_context(X_test, N, 0.0),
        "ridge (lambda = 1)": on_context(X_test, N, 1.0),
    }
    for name, p in preds.items():
        results[name].append(np.mean((p - y_test) ** 2))
    print(f"N = {N:2d}: closed form {results['closed form'][-1]:.4f} in {seconds:.2f} s, "
          f"formula {results['formula'][-1]:.4f}, certificate {bool(model.certificate_)}, "
          f"test prompts covered {model.certificate_.covers(X_test).mean():.0%}")

# %%
# The closed form meets the formula at every N (to the sampling error of the training prompts):
# both are the best one layer can do, and Adam approaches it. One layer is not a solver: it takes
# one preconditioned gradient step from w = 0, so on these noiseless labels least squares on
# each prompt's own context is exact as soon as N >= D (below the plot's floor), and ridge with
# lambda = 1 does better than the layer at every N.

fig, ax = plt.subplots(figsize=(6, 4))
for name, values in results.items():
    style = "--" if name == "formula" else "-o"
    ax.plot(Ns, values, style, label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_ylim(bottom=0.05)  # least squares is exact (rounding) from N = 3 on
ax.set_xlabel("context pairs N")
ax.set_ylabel("test MSE")
ax.legend()
ax.set_title("In-context regression, D = 3")
fig.tight_layout()

# %%
# Heads of dimension one: exact fits against the plateaus of gradient descent
# ---------------------------------------------------------------------------
# A layer of k heads of dimension one has key-query matrices of rank one; the best such layer
# for k = 0 (the zero model), 1, 2 and 3 is fitted exactly with ``head_dim=1``, and its
# certified gap says how far it is from the unconstrained optimum. Gradient descent from a small
# start on a layer of three such heads stalls near each of these losses in turn.

X, y = make_in_context_regression(1000, 8, D, covariance=cov, random_state=2)
levels = {0: np.mean(y**2)}
for k in (1, 2, 3):
    fit = LinearAttentionRegressor(n_heads=k, head_dim=1, random_state=0).fit(X, y)
    levels[k] = np.mean((fit.predict(X) - y) ** 2)
    print(f"{k} head(s) of dimension 1: training MSE {levels[k]:.4f}, "
          f"gap to the optimum {fit.head_dim_gap_:.2e}")

torch.manual_seed(0)
layer = MultiHeadLinearAttention(D + 1, n_heads=3, d_k=1, d_v=1, d_out=1, dtype=torch.float64)
with torch.no_grad():
    for param in layer.parameters():
        param.mul_(0.3)
optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
curve = []
for _ in range(2500):
    optimizer.zero_grad()
    loss = ((layer(Xt)[:, 0] - yt) ** 2).mean()
    loss.backward()
    optimizer.step()
    curve.append(loss.item())

fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(curve, label="gradient descent, 3 heads of dimension 1")
for k, level in levels.items():
    ax.axhline(level, color="grey", lw=0.8, ls=":")
    ax.text(len(curve), level, f" {k} head{'s' if k != 1 else ''}", va="center", fontsize=8)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("training MSE")
ax.set_title("Exact rank-one fits and the plateaus of training")
ax.legend()
fig.tight_layout()
plt.show()
