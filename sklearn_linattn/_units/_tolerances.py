"""Tolerances derived from the data's own scale and precision.

A choice that compares two computed numbers must not be decided by their
rounding, which the units of the data change: each rule here sets the margin
from a scale of the problem itself (the targets' variance, their precision).
Rank cutoffs of spectra are the spectrum module's.
"""

import numpy as np

from ._pow2 import pow2_scale

__all__ = ["EPS32", "EPS64", "SCORE_TIE", "score_tie", "target_precision"]

EPS64 = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)
# Two scores closer than this, relative to the null model's, are equal: their
# difference is the rounding of sums that the units of the data change.
SCORE_TIE = 1e-10


def score_tie(counts, d_out, y_exponents, scoring):
    """The difference below which two cross-validated scores are equal, in the scores' units.

    Relative to the targets' own scale (the null model's score: the weighted
    variance of the targets, or their mean square when they are constant), so
    that an exact fit's scores, all rounding, never decide a choice.
    """
    if scoring == "r2":
        return SCORE_TIE
    W = counts.weight_sum
    energy = np.diagonal(counts.y_cross)[:d_out] / W
    variance = energy - (counts.y_sum[:d_out] / W) ** 2
    scale = np.where(variance > 16 * EPS64 * energy, variance, energy)
    shift = 0 if y_exponents is None else 2 * np.asarray(y_exponents)[:d_out]
    return SCORE_TIE * float(np.mean(pow2_scale(scale, shift)))


def target_precision(Y):
    """The relative precision the targets carry: float32's eps when every one is a float32
    value and some use the last bits of float32's mantissa (a float32 layer's output, whatever
    its dtype now), else float64's: integers, one-hot and other short values are exact data."""
    with np.errstate(over="ignore", invalid="ignore"):
        Y32 = np.asarray(Y).astype(np.float32)
        if not np.array_equal(Y32, Y):
            return EPS64
    # The low 8 of float32's 23 mantissa bits are zero in every short value.
    return EPS32 if np.any(Y32.view(np.uint32) & 0xFF) else EPS64
