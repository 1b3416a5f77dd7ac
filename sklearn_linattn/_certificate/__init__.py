"""The identifiability certificate of the paper's Lemma A.3, and what follows from it.

The verdict, a witness of a failed certificate, per-input coverage and error
bounds (the user guide's ``doc/certificate.rst``).
"""

from ._certificate import IdentifiabilityCertificate
from ._certify import certify_identifiability
from ._paper import paper_min_eigenvalue
from ._rowspace import row_space_from_solution
from ._witness import Witness

__all__ = ["IdentifiabilityCertificate", "Witness", "certify_identifiability",
           "paper_min_eigenvalue", "row_space_from_solution"]
