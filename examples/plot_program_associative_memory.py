"""
=====================================================================
The associative memory as a program: compiled, run, learned back
=====================================================================

:func:`~sklearn_linattn.programs.associative_memory_program` writes the associative memory of the
paper's Sec. 4.2 as a one-lookup program. Tokens have a ``key`` and a ``value`` attribute, each a
one-hot block over ``range(d)``; the prompt stores ``d`` key-value pairs followed by a query token
that carries only a key, and the single head writes the value stored under that key.

We check that the compiled weights are those of
:func:`~sklearn_linattn.datasets.make_associative_memory`, retrieve with
:meth:`~sklearn_linattn.programs.CompiledProgram.run`, and learn the program back twice with
:class:`~sklearn_linattn.LinearAttentionRegressor`:

- from **Gaussian** sequences, which identify it: the certificate holds and the learned head is
  the compiled one;
- from **one-hot prompts** only, which never identify it (the certificate fails however many
  prompts there are), yet certify more and more held-out prompts through
  :meth:`~sklearn_linattn.IdentifiabilityCertificate.covers` -- and on every covered prompt the
  learned model retrieves exactly.
"""

import itertools

import matplotlib.pyplot as plt
import numpy as np

from sklearn_linattn import LinearAttentionRegressor, same_function
from sklearn_linattn.datasets import make_associative_memory
from sklearn_linattn.programs import associative_memory_program

d = 4
memory = associative_memory_program(d)
_, _, params = make_associative_memory(1, d, return_params=True)
print(memory, "heads:", memory.head_names)
print("V equals make_associative_memory's V:", np.array_equal(memory.V, params["V"]))
print("Q equals make_associative_memory's Q:", np.array_equal(memory.Q, params["Q"]))

# %%
# Retrieval from one-hot prompts
# ------------------------------
# A prompt stores a value for each of the ``d`` keys (any map from keys to values: ``d ** d =
# 256`` of them) and asks for one key: 1024 prompts in all. ``run`` appends the output rounded to
# the nearest token; its ``value`` attribute is the answer.
prompt = [{"key": k, "value": v} for k, v in enumerate([2, 0, 3, 3])] + [{"key": 2}]
print(memory.decode(memory.run([prompt], 1)[0])[-1])

value_maps = np.array(list(itertools.product(range(d), repeat=d)))
maps, queries = np.divmod(np.arange(len(value_maps) * d), d)


def one_hot_prompts(index):
    """Encoded prompts: d stored pairs, then the query key."""
    keys = np.tile(np.arange(d + 1), (len(index), 1))
    keys[:, d] = queries[index]
    values = np.full((len(index), d + 1), -1)
    values[:, :d] = value_maps[maps[index]]
    return memory.encode_indices({"key": keys, "value": values})


def answers(index):
    return value_maps[maps[index], queries[index]]


def retrieved(sequences):
    """Index of the value written by the last (generated) token, -1 if it is not a clean token."""
    return memory.values(sequences[:, -1], "value")


rng = np.random.default_rng(0)
order = rng.permutation(len(maps))
held_out = order[-200:]
X_test, truth = one_hot_prompts(held_out), answers(held_out)
print(f"compiled program: {np.mean(retrieved(memory.run(X_test, 1)) == truth):.3f} of "
      f"{len(held_out)} held-out prompts retrieved exactly")

# %%
# Learning it back from Gaussian sequences
# ----------------------------------------
# Gaussian sequences with targets ``memory.forward(X)`` identify the memory as soon as there are
# ``psi = (2d)^2 (2d + 1) / 2 = 288`` of them. Compressed to one head, the learned head is the
# compiled one up to a scale that passes between V and Q.
X_gauss = rng.normal(size=(400, d + 1, 2 * d))
gauss = LinearAttentionRegressor(n_heads=1, random_state=0).fit(X_gauss, memory.forward(X_gauss))
print(f"Gaussian data: certificate {bool(gauss.certificate_)}, feature rank "
      f"{gauss.feature_rank_} of {gauss.coef_.shape[1]}")
print("same function as the program:",
      same_function(gauss.value_matrices_, gauss.key_query_matrices_, memory.V, memory.Q,
                    rtol=1e-8))
print(f"retrieval on held-out one-hot prompts: "
      f"{np.mean(retrieved(gauss.generate(X_test, 1, rounding=memory.round)) == truth):.3f}")

V_learned, Q_learned = gauss.value_matrices_[0], gauss.key_query_matrices_[0]
scale = Q_learned.flat[np.abs(Q_learned).argmax()]
fig, axes = plt.subplots(1, 4, figsize=(12, 3.4), layout="constrained")
for ax, matrix, title in zip(
    axes,
    [memory.Q[0], memory.V[0], Q_learned / scale, V_learned * scale],
    ["Q, compiled", "V, compiled", "Q, learned", "V, learned"],
):
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_title(title)
    ax.set_xticks([1.5, 5.5], ["key", "value"])
    ax.set_yticks([1.5, 5.5], ["key", "value"], rotation=90, va="center")
fig.colorbar(image, ax=axes, shrink=0.8)
fig.suptitle("The compiled head and the head learned from Gaussian data (rescaled)")
plt.show()

# %%
# Learning it back from one-hot prompts
# -------------------------------------
# Trained on one-hot prompts only, the features span a subspace of rank 52 out of 288, whatever
# the number of prompts: the certificate fails and a witness exists. But a held-out prompt is
# *covered* when its features lie in the span of the training features; then every minimiser of
# the training loss -- the program among them, since it fits its own outputs exactly -- gives the
# same output there, and the learned model, rounded to the nearest token, retrieves exactly.
sizes = [5, 10, 20, 50, 100, 200, 400, 800]
coverage, accuracy = [], []
for n in sizes:
    X_train = one_hot_prompts(order[:n])
    model = LinearAttentionRegressor().fit(X_train, memory.forward(X_train))
    covered = model.certificate_.covers(X_test)
    correct = retrieved(model.generate(X_test, 1, rounding=memory.round)) == truth
    assert correct[covered].all()  # the guarantee
    coverage.append(covered.mean())
    accuracy.append(correct.mean())
    print(f"{n:4d} one-hot prompts: certificate {bool(model.certificate_)}, rank "
          f"{model.feature_rank_:2d} of {model.coef_.shape[1]}, held-out covered "
          f"{covered.mean():.3f}, retrieved exactly {correct.mean():.3f}")

fig, ax = plt.subplots(figsize=(6, 4))
ax.semilogx(sizes, accuracy, marker="o", label="retrieved exactly (learned model)")
ax.semilogx(sizes, coverage, marker="s", label="covered: guaranteed exact")
ax.set_xlabel("training prompts (one-hot)")
ax.set_ylabel(f"fraction of {len(held_out)} held-out prompts")
ax.set_ylim(-0.03, 1.05)
ax.set_title(f"Associative memory (d = {d}) learned from one-hot prompts")
ax.legend(loc="lower right")
fig.tight_layout()
plt.show()

# %%
# Outside the span: keys that are not one-hot
# -------------------------------------------
# The compiled weights retrieve from any orthonormal keys. The model learned from one-hot
# prompts only (800 of them) was never shown such keys; its prompts are not covered, and its
# retrievals are not guaranteed. The model learned from Gaussian data is certified everywhere.
n = 200
keys = np.linalg.qr(rng.normal(size=(n, d, d)))[0]  # orthonormal rows, one basis per prompt
stored = rng.integers(0, d, size=(n, d))
asked = rng.integers(0, d, size=n)
X_rot = np.zeros((n, d + 1, 2 * d))
X_rot[:, :d, :d] = keys
X_rot[np.arange(n)[:, None], np.arange(d), d + stored] = 1.0
X_rot[:, d, :d] = keys[np.arange(n), asked]
truth_rot = stored[np.arange(n), asked]
for name, m in [("program", None), ("learned, one-hot", model), ("learned, Gaussian", gauss)]:
    out = memory.run(X_rot, 1) if m is None else m.generate(X_rot, 1, rounding=memory.round)
    covered = "" if m is None else f", covered {m.certificate_.covers(X_rot).mean():.3f}"
    print(f"rotated keys, {name}: retrieved exactly {np.mean(retrieved(out) == truth_rot):.3f}"
          f"{covered}")
