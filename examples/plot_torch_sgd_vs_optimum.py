"""
=======================================================
A PyTorch layer trained by Adam, against the optimum
=======================================================

Researchers train linear attention in PyTorch. This example trains a standard causal multi-head
linear-attention layer (:class:`~sklearn_linattn.nn.MultiHeadLinearAttention`: per-head query,
key and value projections, an output projection, scores scaled by ``1/sqrt(d)``) by Adam with the
paper's recipe, and asks after every few epochs the questions the closed form answers:

- how far is the trained layer from the global least-squares optimum of its training data, in
  p-space (two layers compute the same function iff their coefficients ``p(Theta)`` agree, the
  paper's Corollary A.4) and in excess training risk?
- does the data pin the function down, so that training run to zero excess risk *must* reach the
  optimum?

The analysis is three lines: :func:`~sklearn_linattn.nn.from_torch` reads the layer's heads and
:func:`~sklearn_linattn.compare_to_optimum` measures them against the exact optimum.

The setting is the paper's Sec. 4.1 (d = 4, a random one-head teacher, tokens ``N(0, 1/T)``,
targets at every position) and its recipe: d**2 = 16 heads, learning rate 0.01, batch 64, 10 %
linear warm-up then cosine decay to lr/100, gradient clipping at 5. The paper trains for 500
epochs on 2048 sequences of 100 tokens; here 256 sequences of 16 tokens and 100 epochs (400
steps), so that the example runs in well under a minute on a laptop CPU.
"""

import math

import matplotlib.pyplot as plt
import numpy as np
import torch

from sklearn_linattn import LinearAttentionRegressor, compare_to_optimum, mhla_forward
from sklearn_linattn.nn import MultiHeadLinearAttention, from_torch

# The tensors are tiny (batches of 64 sequences of 16 tokens of 4 coordinates): splitting each
# small product across threads costs more than it saves, so PyTorch runs on one thread here.
torch.set_num_threads(1)
torch.manual_seed(0)
rng = np.random.default_rng(0)
d, T, n_train, n_val = 4, 16, 256, 256
# The teacher: one head, Gaussian entries scaled by 1/sqrt(d); the paper's scores carry a
# further 1/sqrt(d), which the layer below has too.
V_true = rng.normal(size=(1, 1, d)) / math.sqrt(d)
Q_true = rng.normal(size=(1, d, d)) / math.sqrt(d) / math.sqrt(d)
X = rng.normal(scale=1 / math.sqrt(T), size=(n_train + n_val, T, d))
y = mhla_forward(X, V_true, Q_true, readout="all")  # (n, T, 1)
X_train, y_train, X_val, y_val = X[:n_train], y[:n_train], X[n_train:], y[n_train:]

# %%
# The closed form, once
# ---------------------
# One least-squares solve gives the optimum over *any* number of heads, and its certificate.
optimum = LinearAttentionRegressor(readout="all").fit(X_train, y_train)
print(optimum.certificate_.summary())

# %%
# Adam with the paper's recipe
# ----------------------------
layer = MultiHeadLinearAttention(d, n_heads=d * d, d_out=1, scale=1 / math.sqrt(d),
                                 readout="all", dtype=torch.float64)
n_epochs, batch, lr = 100, 64, 0.01
steps = n_epochs * math.ceil(n_train / batch)
warmup = steps // 10
optimizer = torch.optim.Adam(layer.parameters(), lr=lr)


def schedule(step):  # 10 % linear warm-up, then cosine decay to lr / 100
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * progress))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
Xt, yt = torch.as_tensor(X_train), torch.as_tensor(y_train)
val_energy = np.mean(y_val**2)
history = []
for epoch in range(1, n_epochs + 1):
    for idx in torch.randperm(n_train).split(batch):
        optimizer.zero_grad()
        loss = torch.mean((layer(Xt[idx]) - yt[idx]) ** 2)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 5.0)
        optimizer.step()
        scheduler.step()
    if epoch % 10 == 0 or epoch == 1:
        # The analysis: the layer's heads against the optimum of its training data.
        heads = from_torch(layer)
        report = compare_to_optimum(heads, X_train, y_train)
        val = np.mean((mhla_forward(X_val, heads.value_matrices, heads.key_query_matrices,
                                    readout="all") - y_val) ** 2) / val_energy
        history.append((epoch, report.relative_p_distance, report.excess_risk, val))

print(report.summary())
for epoch, p_dist, excess, val in history:
    print(f"epoch {epoch:3d}: relative p-distance {p_dist:.3g}, excess training risk "
          f"{excess:.3g}, relative validation MSE {val:.3g}")

# %%
# The certificate holds (N = 256 x 16 prefix rows against psi = 40 coefficients), so the
# training loss has one minimizing *function*: every parametrization with 16 heads that drives
# the excess risk to zero must converge to the optimum in p-space. The two curves below fall
# together, as they must: the excess risk is the squared distance to the optimum in the data's
# metric ``Lambda_D``, which the certificate says is positive definite. The closed form reaches
# the end point of that descent in one solve.
epochs, p_dist, excess, val = map(np.array, zip(*history))
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.semilogy(epochs, p_dist, "o-", label="relative p-distance to the optimum")
ax.semilogy(epochs, excess / np.mean(y_train**2), "s-", label="excess training risk (relative)")
ax.semilogy(epochs, val, "^-", label="relative validation MSE")
ax.set_xlabel("epoch (Adam, 16 heads, the paper's recipe)")
ax.set_title("A PyTorch layer approaching the closed-form optimum")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
