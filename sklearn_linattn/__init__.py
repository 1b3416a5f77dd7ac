"""Learn one-layer multi-head linear attention exactly, in polynomial time.

A one-layer multi-head linear attention (MHLA) is linear in a fixed cubic
feature map of its input sequence, so fitting it is least squares with a
global optimum; the solution converts back into attention heads.
"""

from ._certificate import IdentifiabilityCertificate, Witness, certify_identifiability
from ._certificate import paper_min_eigenvalue
from ._features import attention_kernel
from ._repair import RepairResult, repair_certificate
from ._attention import attention_coefficients, mhla_forward, mhla_generate, same_function
from ._heads import HeadsFit, LocalCertificate, certify_heads_locally, compress_heads, fit_heads
from ._heads import heads_from_coefficients
from .layouts import (
    heads_from_paper,
    heads_from_projections,
    paper_from_heads,
    projections_from_heads,
)
from ._estimators import LinearAttentionRegressor
from ._cv import LinearAttentionRegressorCV
from ._sequence import SequenceRegressor, make_sequence_regressor
from ._transformer import LinearAttentionFeatures
from ._io import load_model, save_model
from .optimality import OptimalityReport, compare_to_optimum
from ._adam import AdamLinearAttentionRegressor, learning_rate_schedule, mhla_loss_gradient
from . import datasets
from . import design
from . import metrics
from . import preprocessing

__version__ = "0.1.0.dev0"

__all__ = [
    "AdamLinearAttentionRegressor",
    "HeadsFit",
    "IdentifiabilityCertificate",
    "LinearAttentionFeatures",
    "LinearAttentionRegressor",
    "LinearAttentionRegressorCV",
    "SequenceRegressor",
    "LocalCertificate",
    "OptimalityReport",
    "RepairResult",
    "Witness",
    "attention_coefficients",
    "attention_kernel",
    "certify_heads_locally",
    "compare_to_optimum",
    "certify_identifiability",
    "compress_heads",
    "datasets",
    "design",
    "fit_heads",
    "heads_from_coefficients",
    "heads_from_paper",
    "heads_from_projections",
    "learning_rate_schedule",
    "load_model",
    "metrics",
    "make_sequence_regressor",
    "mhla_forward",
    "mhla_generate",
    "mhla_loss_gradient",
    "paper_from_heads",
    "paper_min_eigenvalue",
    "preprocessing",
    "projections_from_heads",
    "repair_certificate",
    "same_function",
    "save_model",
]
