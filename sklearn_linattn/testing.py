"""Hypothesis strategies for property-based tests of linear-attention code (needs hypothesis)."""

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
    """A strategy of ``value`` (or drawing from it), checked: fixed values at once, others when drawn."""
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

    Entries are independent Gaussians with standard deviation ``scale / sqrt(d)``.

    Parameters
    ----------
    d : int or SearchStrategy of int, default=None
        Token dimension; None draws from 1 to 4.
    d_out, n_heads : int or SearchStrategy of int, default=None
        Output dimension and number of heads; None draws from 1 to 3.
    scale : float or SearchStrategy of float, default=1.0
        Scale of the entries (positive, finite).

    Returns
    -------
    strategy : SearchStrategy of tuple (V, Q)
        ``V`` of shape (n_heads, d_out, d) and ``Q`` of shape (n_heads, d, d), float64.

    See Also
    --------
    realizable_datasets : Sequences together with the output of such heads.

    Examples
    --------
    >>> import numpy as np
    >>> from hypothesis import given, settings
    >>> from sklearn_linattn import attention_coefficients
    >>> from sklearn_linattn.testing import mhla_parameters
    >>> @settings(max_examples=10, derandomize=True, database=None, deadline=None)
    ... @given(mhla_parameters(d=3, n_heads=2))
    ... def test_heads_add_up(params):
    ...     V, Q = params
    ...     assert np.allclose(attention_coefficients(V, Q), sum(
    ...         attention_coefficients(V[h:h + 1], Q[h:h + 1]) for h in range(2)))
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

    Real tokens have Gaussian entries of standard deviation ``scale``; the
    batches are valid input for every estimator of the package.

    Parameters
    ----------
    d : int or SearchStrategy of int, default=None
        Token dimension; None draws from 1 to 4.
    min_samples, max_samples, min_length, max_length : int, default=1, 6, 1, 6
        Ranges of the number of sequences and of real tokens per sequence.
    dtype : {np.float64, np.float32} or SearchStrategy of them, default=np.float64
        Floating dtype of the array.
    scale : float or SearchStrategy of float, default=1.0
        Standard deviation of the entries (positive, finite).
    padded : bool, default=True
        If False, every sequence has ``n_tokens`` real tokens (no NaN).

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
    ...     assert np.isfinite(LinearAttentionFeatures().fit_transform(X)).all()
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

    Draws heads as :func:`mhla_parameters` and ``X`` as :func:`sequence_batches`;
    ``y`` is the heads' output on the values stored in ``X``, in float64.

    Parameters
    ----------
    d, d_out, n_heads : int or SearchStrategy of int, default=None
        As in :func:`mhla_parameters`.
    readout : {"last", "all"} or SearchStrategy of them, default="last"
        One target per sequence, or one per position (NaN at padding).
    min_samples, max_samples, min_length, max_length : int, default=1, 6, 1, 6
        As in :func:`sequence_batches`.
    dtype : {np.float64, np.float32} or SearchStrategy of them, default=np.float64
        Floating dtype of ``X``.
    scale, parameter_scale : float or SearchStrategy of float, default=1.0
        ``scale`` of :func:`sequence_batches` and of :func:`mhla_parameters`.
    padded : bool, default=True
        As in :func:`sequence_batches`.

    Returns
    -------
    strategy : SearchStrategy of tuple (X, y, V, Q)
        ``y`` of shape (n_samples, d_out), or (n_samples, n_tokens, d_out) for
        ``"all"``.

    See Also
    --------
    mhla_parameters, sequence_batches : The heads and the sequences.

    Examples
    --------
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

    Tokens lie exactly (also in float32) in a random subspace of dimension
    ``r = subspace_dim``, so the cubic features have rank ``r**2 (r + 1) / 2``
    (almost surely).  See the user guide's :doc:`/testing` page.

    Parameters
    ----------
    d : int or SearchStrategy of int, default=None
        Token dimension, at least 2; None draws from 2 to 4.
    subspace_dim : int or SearchStrategy of int, default=None
        Dimension r, ``1 <= r < d``; None draws from 1 to ``d - 1``.
    min_samples, max_samples : int, default=1, 6
        Range of the number of sequences, raised to ``r**2 (r + 1)`` if smaller.
    min_length, max_length : int, default=2, 6
        Range of the real tokens per sequence; ``min_length >= 2``.
    dtype : {np.float64, np.float32} or SearchStrategy of them, default=np.float64
        Floating dtype of ``X``.
    scale : float or SearchStrategy of float, default=1.0
        Magnitude of the entries, rounded to a power of two.
    padded : bool, default=True
        As in :func:`sequence_batches`.

    Returns
    -------
    strategy : SearchStrategy of tuple (X, rank, basis)
        NaN-padded ``X``, the exact feature ``rank`` and the float64 ``basis``
        of shape (d, r) spanning the tokens.

    See Also
    --------
    sklearn_linattn.certify_identifiability : The certificate such data fails.

    Examples
    --------
    >>> from hypothesis import given, settings
    >>> from sklearn_linattn import certify_identifiability
    >>> from sklearn_linattn.testing import rank_deficient_datasets
    >>> @settings(max_examples=5, derandomize=True, database=None, deadline=None)
    ... @given(rank_deficient_datasets(d=3, subspace_dim=2))
    ... def test_rank(data):
    ...     X, rank, basis = data
    ...     assert rank == 6 and certify_identifiability(X).rank == 6  # of 18 features
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
