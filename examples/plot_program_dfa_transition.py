"""
===================================================================
One DFA transition as one head: compiled, run, learned back
===================================================================

:func:`~sklearn_linattn.programs.dfa_transition_program` compiles a single step of a finite
automaton -- find ``delta(s, w)`` in a transition table written in the prompt -- into one lookup
head. The prompt holds one token per table entry, ``table_key = (s, w)`` and ``table_next =
delta(s, w)``, followed by a query token ``current = (s, w)``; the head writes ``next_state``.
The table is *data*: the same weights serve every automaton.

We learn the program back from its own traces: for each training table, the ``S * A`` prompts
(one per query) and the token the program appends, turned into training pairs by
:func:`~sklearn_linattn.programs.next_token_dataset`. On held-out tables we compare the
exact-match accuracy of the learned model (generating with ``rounding=program.round``) with the
fraction of prompts that the certificate's
:meth:`~sklearn_linattn.IdentifiabilityCertificate.covers` certifies.
"""

import itertools

import matplotlib.pyplot as plt
import numpy as np

from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn.programs import dfa_transition_program, next_token_dataset

S, A = 3, 2  # states, letters
step = dfa_transition_program(S, A)
print(step, "heads:", step.head_names)

delta = {(0, 0): 1, (0, 1): 2, (1, 0): 1, (1, 1): 0, (2, 0): 2, (2, 1): 0}
prompt = [{"table_key": k, "table_next": v} for k, v in delta.items()] + [{"current": (1, 1)}]
print(step.decode(step.run([prompt], 1)[0])[-1])

# %%
# Prompts for many tables at once
# -------------------------------
# ``encode_indices`` builds the prompts from alphabet indices: every table (``S ** (S * A) =
# 729`` of them) with every query.
tables = np.array(list(itertools.product(range(S), repeat=S * A))).reshape(-1, S * A)
k = S * A


def prompts(table_index):
    """All k queries of each table: (len * k) prompts of k table tokens and a query token."""
    rows = np.repeat(table_index, k)
    query = np.tile(np.arange(k), len(table_index))
    table_key = np.full((len(rows), k + 1), -1)
    table_next = np.full((len(rows), k + 1), -1)
    current = np.full((len(rows), k + 1), -1)
    table_key[:, :k] = np.arange(k)
    table_next[:, :k] = tables[rows]
    current[:, k] = query
    X = step.encode_indices({"table_key": table_key, "table_next": table_next,
                             "current": current})
    return X, tables[rows, query]


rng = np.random.default_rng(0)
order = rng.permutation(len(tables))
X_test, truth = prompts(order[-200:])  # 200 held-out tables, 1200 prompts


def next_states(sequences):
    return step.values(sequences[:, -1], "next_state")


print(f"compiled program exact on {np.mean(next_states(step.run(X_test, 1)) == truth):.3f} "
      f"of {len(X_test)} held-out prompts")

# %%
# Learning it back from traces
# ----------------------------
# A trace is a prompt followed by the program's output token. Trained on one-hot traces the
# certificate never holds -- the features of all such prompts span a subspace of rank 78 out of
# ``psi = d^2 (d + 1) / 2`` -- but once the training prompts span it, every held-out prompt is
# covered: every minimiser of the training loss, the program itself among them, writes the same
# token there, so the learned model is exact.
sizes = [1, 2, 4, 6, 8, 10, 12, 14, 17, 20, 30]
accuracy, coverage, ranks = [], [], []
for n_tables in sizes:
    X_prompt, _ = prompts(order[:n_tables])
    traces = step.run(X_prompt, 1)
    X, y, groups = next_token_dataset(traces, start=X_prompt.shape[1])
    model = LinearAttentionRegressor().fit(X, y)
    covered = model.certificate_.covers(X_test)
    correct = next_states(model.generate(X_test, 1, rounding=step.round)) == truth
    assert correct[covered].all()  # the guarantee
    accuracy.append(correct.mean())
    coverage.append(covered.mean())
    ranks.append(model.feature_rank_)
    print(f"{n_tables:3d} tables ({len(X):3d} traces): certificate {bool(model.certificate_)}, "
          f"rank {model.feature_rank_:2d} of {model.coef_.shape[1]}, held-out exact "
          f"{correct.mean():.3f}, covered {covered.mean():.3f}")

# %%
# Accuracy, coverage and feature rank against training tables
# -----------------------------------------------------------
fig, (ax, ax_rank) = plt.subplots(1, 2, figsize=(10, 4))
ax.plot(sizes, accuracy, marker="o", label="exact next state (learned model)")
ax.plot(sizes, coverage, marker="s", label="covered: guaranteed exact")
ax.axhline(1 / S, color="gray", ls=":", label="chance")
ax.set_xlabel("training tables (6 traces each)")
ax.set_ylabel(f"fraction of {len(X_test)} held-out prompts")
ax.set_ylim(-0.03, 1.05)
ax.set_title(f"DFA transition lookup ({S} states, {A} letters)")
ax.legend(loc="lower right")
ax_rank.plot(sizes, ranks, marker="o")
ax_rank.set_xlabel("training tables")
ax_rank.set_ylabel("rank of the training features")
ax_rank.set_title(f"Feature rank (of psi = {model.coef_.shape[1]})")
fig.tight_layout()
plt.show()
