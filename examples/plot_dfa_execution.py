"""
=====================================================
Executing finite automata with one attention layer
=====================================================

The paper's Appendix G.4 task: each string holds the transition table of a random DFA, a word, and
the DFA's computation history on that word, one-hot encoded (see
:func:`~sklearn_linattn.datasets.make_dfa_execution`). A model reads the string and predicts the
next token at every position (``readout="all"``).

We fit the closed-form one-layer linear attention on more and more training strings and measure
next-token accuracy on held-out strings, separately for

- the tokens of the history that only *copy* what came before (the current state and the next
  letter of the word), and
- the *transitions* ``s^{t+1} = delta(s^t, w_t)``, which need a lookup in the table.

The paper trains a 4-layer softmax transformer on this task; a single linear-attention layer over
plain one-hot tokens (no positional encoding) has far less room, and the curves show how far the
exact least-squares optimum gets.
"""

import matplotlib.pyplot as plt
import numpy as np

from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn.datasets import make_dfa_execution

settings = dict(n_states=2, alphabet_size=2, word_length=4)
X_train, y_train = make_dfa_execution(1600, **settings, random_state=0)
X_test, y_test, params = make_dfa_execution(500, **settings, random_state=1, return_params=True)
start = params["history_start"]

# Position t predicts token t + 1; the history occupies tokens start .. end.
# Within each triple (s^t, w_t, s^{t+1}) the third token is the transition.
positions = np.arange(start - 1, X_test.shape[1])
is_transition = (positions + 1 - start) % 3 == 2
truth = y_test.argmax(axis=2)

sizes = [25, 100, 400, 1600]
acc_copy, acc_transition, tokens = [], [], []
for n in sizes:
    model = LinearAttentionRegressor(readout="all").fit(X_train[:n], y_train[:n])
    correct = model.predict(X_test).argmax(axis=2) == truth
    acc_copy.append(correct[:, positions[~is_transition]].mean())
    acc_transition.append(correct[:, positions[is_transition]].mean())
    tokens.append(n * X_train.shape[1])
    print(
        f"{n:5d} strings ({tokens[-1]:6d} tokens): copy accuracy {acc_copy[-1]:.3f}, "
        f"transition accuracy {acc_transition[-1]:.3f}, feature rank "
        f"{model.feature_rank_} of {model.coef_.shape[1]}"
    )

# %%
# Next-token accuracy against training tokens
# -------------------------------------------
fig, ax = plt.subplots(figsize=(6, 4))
ax.semilogx(tokens, acc_copy, marker="o", label="history: copied tokens")
ax.semilogx(tokens, acc_transition, marker="s", label="history: transitions")
ax.axhline(1 / settings["n_states"], color="gray", ls=":", label="chance (transitions)")
ax.set_xlabel("training tokens")
ax.set_ylabel("next-token accuracy on held-out strings")
ax.set_ylim(0, 1.05)
ax.set_title("DFA execution, one linear-attention layer (2 states, 2 letters)")
ax.legend(loc="lower right")
fig.tight_layout()
plt.show()
