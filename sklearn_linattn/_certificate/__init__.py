"""The identifiability certificate of the paper's Lemma A.3, and what follows.

Every one-layer multi-head linear attention computes ``y = C @ H(Z)`` for its
folded coefficients C and the cubic features H (the theory page of the user
guide, ``doc/theory.rst``).  Two empirical risk minimizers therefore differ by
coefficients in the null space of the feature rows, and they compute the same
function on *every* input exactly when that null space is trivial, i.e. when
the second-moment matrix

    Lambda_D = (1/N) sum_i H(Z_i) H(Z_i)^T          (psi x psi)

of the N training feature rows has a positive smallest eigenvalue (with
sample weights, ``Lambda_D = sum_i w_i H_i H_i^T / sum_i w_i`` over the rows
of positive weight: a weight of 2 counts a sequence twice, a weight of 0
drops it).  This package turns what the fit's solver already computed about
the spectrum of ``Phi^T W Phi`` (a ``SpectralSolution``) into:

- the verdict (``bool(certificate)``), using the zero-eigenvalue rule of the
  fit's pseudo-inverse (an eigenvalue is zero when at most ``lambda_max * psi
  * max(eps64, eps_in**2)``);
- a witness of a failed certificate: two MHLAs that agree on the training
  inputs and disagree on a given input;
- per-input coverage: inputs whose features lie in the training span, where
  all minimizers agree even when the certificate fails;
- a bound on how far two approximate minimizers can disagree at an input.

Modules: ``_rowspace`` (one class per representation of Lambda_D a solver
leaves), ``_certificate`` (:class:`IdentifiabilityCertificate`), ``_witness``
(:class:`Witness`), ``_certify`` (:func:`certify_identifiability`).

Mapping to the paper: ``X[i]`` (n_tokens x d) is the paper's ``Z_i^T``.
"""

from ._certificate import IdentifiabilityCertificate
from ._certify import certify_identifiability
from ._paper import paper_min_eigenvalue
from ._rowspace import row_space_from_solution
from ._witness import Witness

__all__ = ["IdentifiabilityCertificate", "Witness", "certify_identifiability",
           "paper_min_eigenvalue", "row_space_from_solution"]
