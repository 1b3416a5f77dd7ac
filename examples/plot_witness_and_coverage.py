"""
=======================================================
A failed certificate, explained: witness and coverage
=======================================================

One-hot tokens make the cubic features sparse and rank-deficient, so on the DFA-execution task
(:func:`~sklearn_linattn.datasets.make_dfa_execution`) the identifiability certificate fails no
matter how much data there is. This example shows what that means and what can still be certified.

1. The **witness** (:meth:`~sklearn_linattn.IdentifiabilityCertificate.witness`) *demonstrates* the
   failure: two attention models whose outputs agree on every training sequence to rounding, and
   disagree on the witness's input.
2. **Coverage** (:meth:`~sklearn_linattn.IdentifiabilityCertificate.covers`) certifies individual
   inputs: where a held-out sequence's features lie in the span of the training features, every
   minimiser of the training loss gives the same prediction there, however the data fails the
   global certificate. We plot the fraction of held-out strings covered against the number of
   training strings.
"""

import matplotlib.pyplot as plt
import numpy as np

from sklearn_linattn import LinearAttentionRegressor, certify_identifiability, mhla_forward
from sklearn_linattn.datasets import make_dfa_execution

settings = dict(n_states=2, alphabet_size=2, word_length=3)
X_train, y_train = make_dfa_execution(200, **settings, random_state=0)
X_test, _ = make_dfa_execution(300, **settings, random_state=1)

model = LinearAttentionRegressor(readout="all").fit(X_train, y_train)
cert = model.certificate_
print(cert.summary())

# %%
# The witness: same training outputs, different outputs elsewhere
# ---------------------------------------------------------------
witness = cert.witness(random_state=0)
(V_a, Q_a), (V_b, Q_b) = witness.model_a, witness.model_b
train_a = mhla_forward(X_train, V_a, Q_a, readout="all")
train_b = mhla_forward(X_train, V_b, Q_b, readout="all")
new_a = mhla_forward(witness.input[None], V_a, Q_a, readout="all")
new_b = mhla_forward(witness.input[None], V_b, Q_b, readout="all")
train_gap = np.nanmax(np.abs(train_a - train_b)) / np.nanmax(np.abs(train_a))
new_gap = np.nanmax(np.abs(new_a - new_b)) / np.nanmax(np.abs(new_a))
print(f"largest relative disagreement on the training strings: {train_gap:.1e}")
print(f"largest relative disagreement on the witness input:    {new_gap:.1e}")
print("witness input covered:", bool(cert.covers(witness.input[None])[0]))

# %%
# Coverage of held-out strings against training size
# --------------------------------------------------
sizes = [1, 2, 3, 5, 8, 12, 20, 50, 200]
covered, ranks = [], []
for n in sizes:
    c = certify_identifiability(X_train[:n], readout="all")
    covered.append(c.covers(X_test).mean())
    ranks.append(c.rank)
    print(f"{n:4d} training strings: rank {c.rank:3d} of {c.n_features}, "
          f"{100 * covered[-1]:5.1f}% of held-out strings covered")

fig, (ax_gap, ax_cov) = plt.subplots(1, 2, figsize=(10, 4))
ax_gap.bar(["training strings", "witness input"], [max(train_gap, 1e-17), new_gap],
           color=["tab:green", "tab:red"])
ax_gap.set_yscale("log")
ax_gap.set_ylabel("relative disagreement of the two models")
ax_gap.set_title("Witness: two minimisers of the training loss")
ax_cov.semilogx(sizes, np.array(covered) * 100, "o-")
ax_cov.set_xlabel("training strings")
ax_cov.set_ylabel("held-out strings covered (%)")
ax_cov.set_ylim(-5, 105)
ax_cov.set_title("Per-input certificate on held-out strings")
fig.tight_layout()
plt.show()
