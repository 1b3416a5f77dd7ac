"""Hypothesis strategies for property-based tests of linear-attention code.

The strategies follow the keyword style of :mod:`hypothesis.extra.numpy`:
every size argument is either a fixed value or a strategy of values, and
every strategy returns plain NumPy arrays in the package's data conventions
(NaN-padded sequences of shape (n_samples, n_tokens, d), heads ``V`` of
shape (n_heads, d_out, d) and ``Q`` of shape (n_heads, d, d)).

Array entries come from :class:`numpy.random.Generator` objects seeded by
hypothesis, so values are generic (no accidental ties, no exact zeros) and
well scaled, while shapes, lengths and padding shrink the usual way.

- :func:`mhla_parameters`: random attention heads ``(V, Q)``.
- :func:`sequence_batches`: NaN-padded batches of variable-length sequences.
- :func:`realizable_datasets`: ``(X, y, V, Q)`` with ``y`` the exact output of
  the heads on ``X``.
- :func:`rank_deficient_datasets`: sequences whose cubic features span a
  subspace of known dimension, so the identifiability certificate must fail
  by a known amount.

Requires the optional dependency ``hypothesis``.
"""

import math

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.errors import InvalidArgument
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sklearn_linattn.testing needs the optional dependency hypothesis; install it "
        'with pip install "sklearn-linattn[test]" or pip install hypothesis.'
    ) from exc

from ._features import n_attention_features
from ._memory import real_tokens
from ._attention import mhla_forward

__all__ = [
    "mhla_parameters",
    "rank_deficient_datasets",
    "realizable_datasets",
    "sequence_batches",
]

_SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# --------------------------------------------------------------------------
# Argument handling: a value or a strategy of values, checked when drawn.
# --------------------------------------------------------------------------


def _check_int(value, name, minimum):
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, np.integer)
    ):
        raise InvalidArgument(
            f"{name} must be an integer >= {minimum} or a strategy of them; got "
            f"{value!r} of type {type(value).__name__}."
        )
    if value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}; got {value}.")
    return int(value)


def _check_scale(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise InvalidArgument(
            f"{name} must be a positive finite number or a strategy of them; got "
            f"{value!r} of type {type(value).__name__}."
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{name} must be a positive finite number; got {value!r}.")
    return float(value)


def _check_dtype(value, name="dtype"):
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise InvalidArgument(
            f"{name} must be np.float32 or np.float64 or a strategy of them; got "
            f"{value!r}."
        ) from None
    if dtype not in _FLOAT_DTYPES:
        raise InvalidArgument(
            f"{name} must be np.float32 or np.float64 or a strategy of them; got "
            f"{dtype}."
        )
    return dtype


def _check_readout(value):
    if value not in ("last", "all"):
        raise InvalidArgument(
            f"readout must be 'last' or 'all' or a strategy of them; got {value!r}."
        )
    return value


def _argument(value, check):
    """A strategy drawing ``value`` (or from it, if it is a strategy), checked.

    Fixed values are checked at once, so a bad argument fails when the
    strategy is built; values drawn from a user's strategy are checked when
    they are drawn.
    """
    if isinstance(value, st.SearchStrategy):
        return value.map(check)
    return st.just(check(value))


def _check_range(lo, hi, lo_name, hi_name, minimum):
    """Check a fixed integer range ``minimum <= lo <= hi``."""
    lo = _check_int(lo, lo_name, minimum)
    hi = _check_int(hi, hi_name, minimum)
    if hi < lo:
        raise InvalidArgument(
            f"{hi_name} must be >= {lo_name}; got {lo_name}={lo} and {hi_name}={hi}."
        )
    return lo, hi


# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------


def mhla_parameters(*, d=None, d_out=None, n_heads=None, scale=1.0):
    """Strategy for the weights ``(V, Q)`` of a multi-head linear attention.

    Entries are independent Gaussians with standard deviation
    ``scale / sqrt(d)`` (the paper's initialisation when ``scale=1``), drawn
    from a NumPy generator seeded by hypothesis: finite, generic and well
    conditioned.

    Parameters
    ----------
    d : int or SearchStrategy of int, default=None
        Token dimension; None draws from 1 to 4.
    d_out : int or SearchStrategy of int, default=None
        Output dimension; None draws from 1 to 3.
    n_heads : int or SearchStrategy of int, default=None
        Number of heads; None draws from 1 to 3.
    scale : float or SearchStrategy of float, default=1.0
        Scale of the entries (positive, finite).  The output of the heads
        scales like ``scale**2``.

    Returns
    -------
    strategy : SearchStrategy of tuple (V, Q)
        ``V`` of shape (n_heads, d_out, d) and ``Q`` of shape
        (n_heads, d, d), both float64.

    See Also
    --------
    realizable_datasets : Sequences together with the output of such heads.

    Examples
    --------
    A property of the coefficient map p(Theta), checked on 10 random models:

    >>> import numpy as np
    >>> from hypothesis import given, settings
    >>> from sklearn_linattn import attention_coefficients
    >>> from sklearn_linattn.testing import mhla_parameters
    >>> @settings(max_examples=10, derandomize=True, database=None, deadline=None)
    ... @given(mhla_parameters(d=3, n_heads=2))
    ... def test_heads_add_up(params):
    ...     V, Q = params
    ...     total = attention_coefficients(V, Q)
    ...     per_head = sum(attention_coefficients(V[h:h + 1], Q[h:h + 1]) for h in range(2))
    ...     assert np.allclose(total, per_head)
    >>> test_heads_add_up()
    """
    d_st = _argument(st.integers(1, 4) if d is None else d,
                     lambda v: _check_int(v, "d", 1))
    d_out_st = _argument(st.integers(1, 3) if d_out is None else d_out,
                         lambda v: _check_int(v, "d_out", 1))
    n_heads_st = _argument(st.integers(1, 3) if n_heads is None else n_heads,
                           lambda v: _check_int(v, "n_heads", 1))
    scale_st = _argument(scale, lambda v: _check_scale(v, "scale"))
    return d_st.flatmap(lambda dd: _heads(dd, d_out_st, n_heads_st, scale_st))


@st.composite
def _heads(draw, d, d_out_st, n_heads_st, scale_st):
    d_out = draw(d_out_st)
    n_heads = draw(n_heads_st)
    scale = draw(scale_st)
    rng = np.random.default_rng(draw(_SEEDS))
    std = scale / math.sqrt(d)
    V = rng.standard_normal((n_heads, d_out, d)) * std
    Q = rng.standard_normal((n_heads, d, d)) * std
    return V, Q


def _draw_lengths(draw, n_samples, min_length, max_length, padded):
    """Padded length and per-sequence lengths (all full when not padded)."""
    n_tokens = draw(st.integers(min_length, max_length))
    if not padded:
        return n_tokens, np.full(n_samples, n_tokens, dtype=np.int64)
    lengths = draw(st.lists(st.integers(min_length, n_tokens), min_size=n_samples,
                            max_size=n_samples))
    return n_tokens, np.asarray(lengths, dtype=np.int64)


@st.composite
def _padded_batch(draw, d, min_samples, max_samples, min_length, max_length,
                  dtype_st, scale_st, padded):
    """(X, lengths): Gaussian tokens, NaN after each sequence's length."""
    n_samples = draw(st.integers(min_samples, max_samples))
    n_tokens, lengths = _draw_lengths(draw, n_samples, min_length, max_length, padded)
    dtype = draw(dtype_st)
    scale = draw(scale_st)
    rng = np.random.default_rng(draw(_SEEDS))
    X = (rng.standard_normal((n_samples, n_tokens, d)) * scale).astype(dtype)
    X[~real_tokens(lengths, n_tokens)] = np.nan
    return X, lengths


def _batch_arguments(d, d_min, min_samples, max_samples, min_length, max_length,
                     length_min, dtype, scale, padded):
    """Check the arguments shared by the batch strategies, once, when built."""
    samples = _check_range(min_samples, max_samples, "min_samples", "max_samples", 1)
    lengths = _check_range(min_length, max_length, "min_length", "max_length", length_min)
    if not isinstance(padded, (bool, np.bool_)):
        raise InvalidArgument(f"padded must be True or False; got {padded!r}.")
    dtype_st = _argument(dtype, _check_dtype)
    scale_st = _argument(scale, lambda v: _check_scale(v, "scale"))
    d_st = _argument(st.integers(d_min, 4) if d is None else d,
                     lambda v: _check_int(v, "d", d_min))
    return d_st, samples, lengths, dtype_st, scale_st


def _batch_strategy(d, min_samples, max_samples, min_length, max_length, dtype,
                    scale, padded):
    """Check the batch arguments once, return a strategy of (X, lengths)."""
    d_st, (min_samples, max_samples), (min_length, max_length), dtype_st, scale_st = (
        _batch_arguments(d, 1, min_samples, max_samples, min_length, max_length, 1,
                         dtype, scale, padded)
    )
    return d_st.flatmap(
        lambda dd: _padded_batch(dd, min_samples, max_samples, min_length,
                                 max_length, dtype_st, scale_st, bool(padded))
    )


def sequence_batches(*, d=None, min_samples=1, max_samples=6, min_length=1,
                     max_length=6, dtype=np.float64, scale=1.0, padded=True):
    """Strategy for NaN-padded batches of variable-length sequences.

    Every sequence has between ``min_length`` and ``n_tokens`` real tokens
    (Gaussian entries with standard deviation ``scale``), followed by
    all-NaN padding tokens up to the common length ``n_tokens``, which is
    itself drawn from ``min_length`` to ``max_length``.  Padding never
    precedes a real token, and every sequence has at least one real token, so
    the result is valid input for every estimator of the package.

    Parameters
    ----------
    d : int or SearchStrategy of int, default=None
        Token dimension; None draws from 1 to 4.
    min_samples, max_samples : int, default=1, 6
        Range of the number of sequences.
    min_length, max_length : int, default=1, 6
        Range of the number of real tokens per sequence (and of the padded
        length ``n_tokens``).
    dtype : {np.float64, np.float32} or SearchStrategy of them, default=np.float64
        Floating dtype of the array.
    scale : float or SearchStrategy of float, default=1.0
        Standard deviation of the entries (positive, finite).
    padded : bool, default=True
        If False, every sequence has exactly ``n_tokens`` real tokens and the
        array holds no NaN.

    Returns
    -------
    strategy : SearchStrategy of ndarray of shape (n_samples, n_tokens, d)
        NaN-padded batches ``X`` of dtype ``dtype``.

    See Also
    --------
    realizable_datasets : Such batches together with exact targets.

    Examples
    --------
    >>> import numpy as np
    >>> from hypothesis import given, settings
    >>> from sklearn_linattn import LinearAttentionFeatures
    >>> from sklearn_linattn.testing import sequence_batches
    >>> @settings(max_examples=10, derandomize=True, database=None, deadline=None)
    ... @given(sequence_batches(d=2, dtype=np.float32))
    ... def test_features_are_finite(X):
    ...     assert X.dtype == np.float32 and X.shape[2] == 2
    ...     H = LinearAttentionFeatures().fit_transform(X)
    ...     assert H.shape == (X.shape[0], 6) and np.isfinite(H).all()
    >>> test_features_are_finite()
    """
    return _batch_strategy(
        d, min_samples, max_samples, min_length, max_length, dtype, scale, padded
    ).map(lambda batch: batch[0])


def realizable_datasets(*, d=None, d_out=None, n_heads=None, readout="last",
                        min_samples=1, max_samples=6, min_length=1, max_length=6,
                        dtype=np.float64, scale=1.0, parameter_scale=1.0,
                        padded=True):
    """Strategy for datasets labelled exactly by a random linear attention.

    Draws heads ``(V, Q)`` as :func:`mhla_parameters` and sequences ``X`` as
    :func:`sequence_batches` (with the same ``d``), and returns the heads'
    exact output ``y`` on ``X`` (computed in float64 from the values actually
    stored in ``X``, so float32 data is labelled exactly too).

    Parameters
    ----------
    d, d_out, n_heads : int or SearchStrategy of int, default=None
        As in :func:`mhla_parameters`.
    readout : {"last", "all"} or SearchStrategy of them, default="last"
        ``"last"``: one target per sequence.  ``"all"``: a target at every
        position (causal readout), NaN at padded positions.
    min_samples, max_samples : int, default=1, 6
        Range of the number of sequences, as in :func:`sequence_batches`.
    min_length, max_length : int, default=1, 6
        Range of the number of real tokens per sequence, as in
        :func:`sequence_batches`.
    dtype : {np.float64, np.float32} or SearchStrategy of them, default=np.float64
        Floating dtype of ``X``, as in :func:`sequence_batches`.
    scale : float or SearchStrategy of float, default=1.0
        Standard deviation of the entries of ``X``, as in
        :func:`sequence_batches`.
    parameter_scale : float or SearchStrategy of float, default=1.0
        ``scale`` of :func:`mhla_parameters`.
    padded : bool, default=True
        As in :func:`sequence_batches`.

    Returns
    -------
    strategy : SearchStrategy of tuple (X, y, V, Q)
        ``X`` of shape (n_samples, n_tokens, d), NaN-padded; ``y`` float64 of
        shape (n_samples, d_out) for ``"last"`` or
        (n_samples, n_tokens, d_out) for ``"all"`` (always with the output
        axis); ``V`` of shape (n_heads, d_out, d); ``Q`` of shape
        (n_heads, d, d).

    See Also
    --------
    mhla_parameters : The heads.
    sequence_batches : The sequences.

    Examples
    --------
    A model fitted on enough realizable data reproduces its targets:

    >>> import numpy as np
    >>> from hypothesis import given, settings
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.testing import realizable_datasets
    >>> @settings(max_examples=5, derandomize=True, database=None, deadline=None)
    ... @given(realizable_datasets(d=2, min_samples=20, max_samples=30))
    ... def test_fit_is_exact(data):
    ...     X, y, V, Q = data
    ...     model = LinearAttentionRegressor().fit(X, y)
    ...     assert np.allclose(model.predict(X), y, rtol=1e-6, atol=1e-9 * np.abs(y).max())
    >>> test_fit_is_exact()
    """
    batch_st = _batch_strategy(
        d, min_samples, max_samples, min_length, max_length, dtype, scale, padded
    )
    readout_st = _argument(readout, _check_readout)
    # Check the head arguments now (fixed values fail at construction).
    d_out_st = _argument(st.integers(1, 3) if d_out is None else d_out,
                         lambda v: _check_int(v, "d_out", 1))
    n_heads_st = _argument(st.integers(1, 3) if n_heads is None else n_heads,
                           lambda v: _check_int(v, "n_heads", 1))
    pscale_st = _argument(parameter_scale,
                          lambda v: _check_scale(v, "parameter_scale"))

    @st.composite
    def build(draw):
        X, lengths = draw(batch_st)
        V, Q = draw(_heads(X.shape[2], d_out_st, n_heads_st, pscale_st))
        mode = draw(readout_st)
        filled = np.where(np.isnan(X), 0.0, X).astype(np.float64)
        y = mhla_forward(filled, V, Q, lengths, readout=mode)
        return X, y, V, Q

    return build()


def _psi(r):
    return n_attention_features(r)


def rank_deficient_datasets(*, d=None, subspace_dim=None, min_samples=1,
                            max_samples=6, min_length=2, max_length=6,
                            dtype=np.float64, scale=1.0, padded=True):
    """Strategy for sequences whose cubic features have a known rank.

    Every token is ``x = B z`` for a fixed basis ``B`` of shape (d, r) with
    ``r = subspace_dim < d`` and a random ``z``.  Then ``S = B S_z B^T`` and
    ``x_last = B z_last``, and the folded map ``(S_z, z_last) -> H`` is
    injective (``B`` has full column rank), so the features ``H`` of the
    sequences (readout ``"last"``) and of all their prefixes (readout
    ``"all"``) span a space of dimension at most ``r**2 (r + 1) / 2``, the
    number of features of r-dimensional tokens.  Sequences with at least two
    tokens reach every direction of it, so with at least twice as many
    sequences as that number the rank is *exactly* ``rank = r**2 (r + 1) / 2``
    (almost surely), and the feature Gram matrix ``Phi^T Phi`` has a null
    space of dimension ``d**2 (d + 1) / 2 - rank``.

    The data is exact in floating point, also in float32: ``B`` is
    ``P [I_r; M]`` with ``P`` a permutation and ``M`` an integer matrix with
    entries in {-1, 0, 1}, ``z`` lies on a grid of step ``2**-16`` in
    [-1, 1], and ``scale`` is rounded to a power of two, so every stored
    token lies exactly in the column span of ``B``.

    Parameters
    ----------
    d : int or SearchStrategy of int, default=None
        Token dimension, at least 2; None draws from 2 to 4.
    subspace_dim : int or SearchStrategy of int, default=None
        Dimension r of the token subspace, ``1 <= r < d``; None draws from 1
        to ``d - 1``.
    min_samples, max_samples : int, default=1, 6
        Range of the number of sequences; it is raised to
        ``r**2 (r + 1)`` when smaller, so that the rank is attained.
    min_length, max_length : int, default=2, 6
        Range of the number of real tokens per sequence; ``min_length`` must
        be at least 2 (one-token sequences only reach the symmetric cubic
        monomials, a smaller space).
    dtype : {np.float64, np.float32} or SearchStrategy of them, default=np.float64
        Floating dtype of ``X``; the data is exact in either.
    scale : float or SearchStrategy of float, default=1.0
        Magnitude of the entries, rounded to the nearest power of two.
    padded : bool, default=True
        As in :func:`sequence_batches`.

    Returns
    -------
    strategy : SearchStrategy of tuple (X, rank, basis)
        ``X`` of shape (n_samples, n_tokens, d), NaN-padded; ``rank`` the
        exact rank ``r**2 (r + 1) / 2`` of the feature rows (both readouts);
        ``basis`` the float64 matrix ``B`` of shape (d, r).

    See Also
    --------
    sklearn_linattn.certify_identifiability : The certificate such data fails.

    Examples
    --------
    >>> import numpy as np
    >>> from hypothesis import given, settings
    >>> from sklearn_linattn import LinearAttentionFeatures
    >>> from sklearn_linattn.testing import rank_deficient_datasets
    >>> @settings(max_examples=5, derandomize=True, database=None, deadline=None)
    ... @given(rank_deficient_datasets(d=3, subspace_dim=2))
    ... def test_rank(data):
    ...     X, rank, basis = data
    ...     assert rank == 6  # 2**2 * 3 / 2 of the 18 features of d = 3
    ...     H = LinearAttentionFeatures().fit_transform(X)
    ...     s = np.linalg.svd(H, compute_uv=False)
    ...     assert s[rank - 1] > 1e-8 * s[0] and s[rank] <= 1e-12 * s[0]
    >>> test_rank()
    """
    # Tokens need two per sequence and d >= 2 for a proper subspace to exist.
    d_st, (min_samples, max_samples), (min_length, max_length), dtype_st, scale_st = (
        _batch_arguments(d, 2, min_samples, max_samples, min_length, max_length, 2,
                         dtype, scale, padded)
    )

    def check_r(r, dd):
        r = _check_int(r, "subspace_dim", 1)
        if r >= dd:
            raise InvalidArgument(
                f"subspace_dim must be smaller than d={dd}; got subspace_dim={r}."
            )
        return r

    @st.composite
    def build(draw):
        dd = draw(d_st)
        if subspace_dim is None:
            r = draw(st.integers(1, dd - 1))
        elif isinstance(subspace_dim, st.SearchStrategy):
            r = check_r(draw(subspace_dim), dd)
        else:
            r = check_r(subspace_dim, dd)
        rank = _psi(r)
        n_samples = max(draw(st.integers(min_samples, max_samples)), 2 * rank)
        n_tokens, lengths = _draw_lengths(draw, n_samples, min_length, max_length,
                                          padded)
        dtype_ = draw(dtype_st)
        power = 2.0 ** round(math.log2(draw(scale_st)))
        rng = np.random.default_rng(draw(_SEEDS))
        M = rng.integers(-1, 2, size=(dd - r, r)).astype(np.float64)
        basis = np.vstack([np.eye(r), M])[rng.permutation(dd)]
        z = rng.integers(-(2**16), 2**16 + 1, size=(n_samples, n_tokens, r)) / 2**16
        X = (np.einsum("jr,ntr->ntj", basis, z) * power).astype(dtype_)
        X[~real_tokens(lengths, n_tokens)] = np.nan
        return X, rank, basis

    return build()
