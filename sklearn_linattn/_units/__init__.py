"""Units: the one owner of scaling.

Every guarantee the package makes about units (unit-free fits, sound
certificates, ``covers``, the minimum-norm choice) is a statement about the
coordinates defined here:

- ``_pow2``: exact scaling by powers of two, the package's only exponent
  arithmetic (values, per-sequence moments, heads, numbers as pairs
  ``m * 2**e``);
- ``_coordinates``: the standardized coordinates (:class:`MomentScales`
  gathers them in a fit's one pass, :class:`TokenStandardizer` holds them)
  with the one forward map (tokens, targets, weights, rows into standardized
  coordinates) and the one inverse (coefficients, heads, terms, outputs back
  to the data's units);
- ``_rows``: the forward map of rows (sequences to standardized feature
  rows, their targets and weights), formed once per chunk of a fit's pass;
- ``_tolerances``: the margins of choices, from the data's own scale and
  precision;
- ``_levels``: windows of a series in their own level (location and scale)
  and predictions back.

Everything else receives plain arrays in standardized coordinates.
"""

from ._coordinates import (
    MomentScales,
    TokenStandardizer,
    feature_map,
    map_is_accurate,
    pair_map,
    refined_whitening,
    targets_map,
    weight_factor,
    whitening,
)
from ._pow2 import (
    NO_EXPONENT,
    SAFE_EXPONENT,
    check_finite,
    column_abs_max,
    column_exponents,
    exponent,
    forward_heads,
    head_scales,
    max_exponent,
    mean_products,
    pair_log10,
    pair_norm,
    pair_sqrt,
    pair_sum,
    pair_to_float,
    pow2_scale,
    rescale_heads,
    restore_scale,
    scale_per_sample,
    sequence_moments,
    unit_scaled,
)
from ._rows import (
    FeatureRows,
    map_moments,
    map_rows,
    raw_rows,
    standardized_rows,
    token_map,
    tokens_first,
    with_terms,
)
from ._levels import (
    LEVELS,
    error_weights,
    levels_of,
    normalize_targets,
    normalize_windows,
    restore_targets,
)
from ._tolerances import EPS32, EPS64, SCORE_TIE, score_tie, target_precision

__all__ = [
    "LEVELS", "error_weights", "levels_of", "normalize_targets", "normalize_windows",
    "restore_targets",
    "FeatureRows", "map_moments", "map_rows", "raw_rows", "standardized_rows", "token_map",
    "tokens_first", "with_terms",
    "EPS32", "EPS64", "MomentScales", "NO_EXPONENT", "SAFE_EXPONENT", "SCORE_TIE",
    "TokenStandardizer", "check_finite", "column_abs_max", "column_exponents",
    "exponent", "feature_map", "forward_heads", "head_scales", "map_is_accurate",
    "max_exponent", "mean_products", "pair_log10", "pair_map", "pair_norm", "pair_sqrt",
    "pair_sum", "pair_to_float", "pow2_scale", "refined_whitening", "rescale_heads",
    "restore_scale", "scale_per_sample", "score_tie", "sequence_moments", "target_precision",
    "targets_map", "unit_scaled", "weight_factor", "whitening",
]
