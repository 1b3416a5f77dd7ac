"""Attention heads: from coefficients, compressed, fitted directly, certified locally, chosen."""

from ._compression import balance, block_heads, compress_heads, heads_from_coefficients
from ._compression import joined_heads
from ._direct import HeadsFit, fit_heads
from ._local import LocalCertificate, certify_heads_locally
from ._rank import LowRankHeads, fit_low_rank_heads
from ._selection import CompressionJudge, HeadChoice, select_heads

__all__ = ["CompressionJudge", "HeadChoice", "HeadsFit", "LocalCertificate", "LowRankHeads",
           "balance", "block_heads", "certify_heads_locally", "compress_heads", "fit_heads",
           "fit_low_rank_heads", "heads_from_coefficients", "joined_heads", "select_heads"]
