"""Checks of user data (sequences, targets, weights, heads) and of how it is read.

Every estimator and function reports a malformed argument with these messages;
the padding rule is implemented once, in :func:`sequence_lengths`.
"""

import numbers

import numpy as np
import scipy.sparse
from sklearn.utils.validation import assert_all_finite, check_array

from ._memory import real_tokens

__all__ = [
    "check_data_format",
    "complete_sequences",
    "check_host_tensor",
    "check_lengths",
    "check_readout",
    "check_reading",
    "check_sample_weight",
    "check_sequences",
    "check_targets",
    "check_token_dim",
    "sequence_lengths",
]

READOUTS = ("last", "all")
# Where the tokens are: Keras' spelling.  "channels_last" is (n_samples,
# n_tokens, d), the package's own layout (tslearn's); "channels_first" is
# (n_samples, d, n_tokens), aeon's and sktime's "numpy3D".
DATA_FORMATS = ("channels_last", "channels_first")
# Floating dtypes kept as given (the others are converted to float64): the
# certificate judges the data by the precision it really has.
_FLOAT_DTYPES = (np.float64, np.float32, np.float16)


def _describe(a):
    return f"an array of shape {a.shape} and dtype {a.dtype}"


def _check_real_dtype(a, name):
    """Reject complex, object, string and other non-numeric dtypes by name."""
    kind = a.dtype.kind
    if kind == "c":
        # scikit-learn's own convention (check_complex_data) is a ValueError.
        raise ValueError(
            f"Complex data not supported: {name} must hold real numbers; got "
            f"complex values ({_describe(a)})."
        )
    if kind not in "biuf":
        raise TypeError(
            f"{name} must hold real numbers (a numeric dtype); got {_describe(a)}. "
            "Convert it with np.asarray(..., dtype=float) if its entries are numbers."
        )


def check_host_tensor(a, name):
    """``a`` unchanged unless it is a tensor NumPy cannot read (it requires grad or is
    not on the CPU): then a TypeError naming the fix.
    """
    device = getattr(getattr(a, "device", None), "type", "cpu")
    if getattr(a, "requires_grad", False) is True or device != "cpu":
        why = "requires grad" if device == "cpu" else f"is on the {device} device"
        raise TypeError(
            f"{name} is a tensor that {why}; NumPy can only read CPU tensors without grad: "
            f"pass {name}.detach().cpu()."
        )
    return a


def _numeric_object_array(a, name, expected):
    """An object array of numbers as float64; anything else is a TypeError naming it."""
    try:
        return a.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{name} is an object array whose entries are not all numbers ({exc}; shape "
            f"{a.shape}); pass {expected}."
        ) from None


def as_real_array(a, name, *, finite=False):
    """``a`` as a float64 array, refusing complex and non-numeric values by name;
    ``finite=True`` also refuses NaN and infinity, naming the first entry.
    """
    try:
        arr = np.asarray(check_host_tensor(a, name))
    except ValueError as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    _check_real_dtype(arr, name)
    arr = arr.astype(np.float64, copy=False)
    if finite and not np.all(np.isfinite(arr)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        where = f" at {name}[{', '.join(map(str, bad))}]" if bad else ""
        raise ValueError(f"{name} must be finite; got {float(arr[bad])!r}{where}.")
    return arr


def pad_targets(items, n_tokens, name, expected, offset=0):
    """Per-sequence targets (n_tokens_i[, d_out]) padded with NaN to n_tokens positions.

    ``expected(i, trail)`` words what item i should have been; messages number the items
    from ``offset``.
    """
    items = [as_real_array(s, f"{name}[{i + offset}]") for i, s in enumerate(items)]
    trail = items[0].shape[1:]
    out = np.full((len(items), n_tokens) + trail, np.nan)
    for i, a in enumerate(items):
        if a.shape[1:] != trail or a.shape[0] > n_tokens:
            raise ValueError(
                f"{name}[{i + offset}] has shape {a.shape}; {expected(i, trail)}."
            )
        out[i, : a.shape[0]] = a
    return out


def check_readout(readout):
    """Return ``readout`` if it is ``"last"`` or ``"all"``, else raise."""
    if not isinstance(readout, str) or readout not in READOUTS:
        raise ValueError(
            f"readout must be one of {READOUTS}; got {readout!r}."
        )
    return readout


def check_data_format(data_format):
    """Return ``data_format`` if it is ``"channels_last"`` or ``"channels_first"``, else raise."""
    if not isinstance(data_format, str) or data_format not in DATA_FORMATS:
        raise ValueError(
            f"data_format must be one of {DATA_FORMATS}: 'channels_last' for sequences of "
            "shape (n_samples, n_tokens, d), 'channels_first' for (n_samples, d, n_tokens) "
            f"as aeon and sktime store them; got {data_format!r}."
        )
    return data_format


def check_reading(readout, token_dim, data_format):
    """``readout`` and the layout keywords ``{"token_dim", "data_format"}`` of
    :func:`check_sequences`, checked.
    """
    return check_readout(readout), {"token_dim": check_token_dim(token_dim),
                                    "data_format": check_data_format(data_format)}


def to_data_format(Y, data_format):
    """Arrays in the package's layout (n, n_tokens, ...) to the user's layout:
    ``"channels_first"`` swaps axis 1 and the last axis of arrays with three or more.
    """
    if data_format == "channels_first" and np.ndim(Y) >= 3:
        return np.swapaxes(Y, 1, -1)
    return Y


def check_token_dim(token_dim):
    """Return ``token_dim`` as an int (or None) after checking it."""
    if token_dim is None:
        return None
    if isinstance(token_dim, (bool, np.bool_)) or not isinstance(
        token_dim, numbers.Integral
    ):
        raise TypeError(
            f"token_dim must be None or a positive integer; got {token_dim!r} "
            f"of type {type(token_dim).__name__}."
        )
    if token_dim < 1:
        raise ValueError(f"token_dim must be a positive integer; got {token_dim}.")
    return int(token_dim)


def item_ndim(s):
    """np.ndim of a list item, or -1 when it is not even a regular array."""
    try:
        return np.ndim(s)
    except ValueError:  # ragged nested lists
        return -1


def _pad_list(seqs, name, data_format="channels_last", offset=0):
    """A list of (n_tokens_i, d) arrays, (d, n_tokens_i) for channels_first, as one NaN-padded
    3-D array."""
    shape = "(d, n_tokens)" if data_format == "channels_first" else "(n_tokens, d)"
    arrays = []
    for i, s in enumerate(seqs):
        if item_ndim(s) == -1:
            raise ValueError(
                f"{name}[{i + offset}] must be a 2-D array of shape {shape} when {name} "
                "is a list of sequences; got a ragged nested list."
            )
        a = np.asarray(check_host_tensor(s, f"{name}[{i + offset}]"))
        if a.ndim != 2:
            raise ValueError(
                f"{name}[{i + offset}] must be a 2-D array of shape {shape} when {name} "
                f"is a list of sequences; got {a.ndim}-D shape {a.shape}."
            )
        _check_real_dtype(a, f"{name}[{i + offset}]")
        if data_format == "channels_first":
            a = a.T
        if a.shape[0] == 0:
            raise ValueError(
                f"{name}[{i + offset}] is an empty sequence: each sequence needs at least one "
                f"token; got shape {a.shape}."
            )
        arrays.append(a)
    dims = {a.shape[1] for a in arrays}
    if len(dims) > 1:
        found = [a.shape[1] for a in arrays]
        first = found[0]
        bad = next(i for i, dd in enumerate(found) if dd != first)
        raise ValueError(
            f"every sequence in {name} must have the same token dimension d; "
            f"{name}[{offset}] has d={first} but {name}[{bad + offset}] has d={found[bad]}."
        )
    n_tokens = max(a.shape[0] for a in arrays)
    dtype = np.result_type(*arrays)
    if dtype.kind != "f":
        dtype = np.float64
    if dtype not in _FLOAT_DTYPES:
        dtype = np.float64
    out = np.full((len(arrays), n_tokens, dims.pop()), np.nan, dtype=dtype)
    for i, a in enumerate(arrays):
        out[i, : a.shape[0]] = a
    return out


def sequence_lengths(X, *, name="X", offset=0):
    """Number of real tokens of each padded sequence (int64): the padding rule.

    Trailing all-NaN tokens are padding; a partly-NaN token, an all-NaN token before a
    real one, or a sequence without a real token is a ValueError.
    """
    n_samples, n_tokens, _ = X.shape
    if X.size and not np.isnan(np.sum(X)):
        # NaN propagates through the sum: without one, every token is real.
        return np.full(n_samples, n_tokens, dtype=np.int64)
    isnan = np.isnan(X)
    pad = isnan.all(axis=2)
    partial = isnan.any(axis=2) & ~pad
    if partial.any():
        i, t = np.argwhere(partial)[0]
        raise ValueError(
            f"{name}[{i + offset}, {t}] is partly NaN: a token is either real (no NaN) or "
            f"padding (all NaN), got {X[i, t]!r}."
        )
    real = ~pad
    # Index one past the last real token; 0 when the sequence has none.
    last_real = n_tokens - np.argmax(real[:, ::-1], axis=1)
    lengths = np.where(real.any(axis=1), last_real, 0).astype(np.int64)
    empty = lengths == 0
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise ValueError(
            f"{name}[{i + offset}] is an empty sequence (every token is NaN padding); "
            "each sequence needs at least one real token."
        )
    holes = real.sum(axis=1) != lengths
    if holes.any():
        i = int(np.flatnonzero(holes)[0])
        t = int(np.flatnonzero(pad[i, : lengths[i]])[0])
        raise ValueError(
            f"{name}[{i + offset}, {t}] is an all-NaN token followed by real tokens: NaN "
            "padding may only appear at the end of a sequence."
        )
    return lengths


def check_sequences(
    X, *, token_dim=None, n_features_in=None, name="X", fill_value=0.0, copy=True,
    data_format="channels_last", expected_by=None, offset=0, defer_finite=False,
):
    """Validate sequences; return a padded 3-D array (n_samples, n_tokens, d) and the lengths.

    X is read as the user guide's "Data conventions" say (3-D, a list of 2-D arrays, or
    2-D with ``token_dim``; ``data_format``).  Floating dtypes are kept, others become
    float64; the result is in the package's layout and X is never modified.

    Parameters
    ----------
    n_features_in : int or None
        Expected token dimension d; ``expected_by`` says in the message where it comes from.
    fill_value : float or None
        Written at padded positions (zero tokens add nothing to the sums); None keeps NaN.
    copy : bool
        False lets the result share memory with X when nothing is converted or filled.
    offset : int
        Index of the first sequence in messages (for a block of a larger array).
    defer_finite : bool
        Skip the NaN and infinity checks and return lengths None; the caller finishes
        them with :func:`complete_sequences`.
    """
    token_dim = check_token_dim(token_dim)
    data_format = check_data_format(data_format)
    X = check_host_tensor(X, name)
    first = data_format == "channels_first"
    layout = "(n_samples, d, n_tokens)" if first else "(n_samples, n_tokens, d)"
    item = "(d, n_tokens_i)" if first else "(n_tokens_i, d)"
    if scipy.sparse.issparse(X):
        # check_array words the refusal of sparse input the way sklearn users know.
        check_array(X, accept_sparse=False, input_name=name)
    if X is None:
        raise TypeError(
            f"{name} must be an array-like of sequences of shape {layout} or a list of "
            "2-D arrays; got None."
        )
    if isinstance(X, np.ndarray) and X.dtype.kind == "O":
        if X.ndim == 1 and len(X) and any(item_ndim(s) == 2 for s in X):
            X = list(X)  # an object array of sequences: the same as their list
        else:
            X = _numeric_object_array(X, name, f"a numeric array of shape {layout} or a "
                                      f"list of 2-D arrays of shape {item}")
    if isinstance(X, (list, tuple)) and len(X) == 0:
        raise ValueError(
            f"{name} must hold at least one sequence; got an empty {type(X).__name__}."
        )
    if isinstance(X, (list, tuple)) and len(X) > 0 and any(
        item_ndim(s) == 2 for s in X
    ):
        # A list of sequences; _pad_list names any item that is not 2-D.
        X = _pad_list(X, name, data_format, offset)
        first = False  # already in the package's layout
    elif hasattr(X, "dtype") and hasattr(X, "shape") and not hasattr(X, "iloc"):
        X = np.asarray(X)
        _check_real_dtype(X, name)
    else:
        try:
            X = np.asarray(X)
        except ValueError as exc:
            raise ValueError(
                f"{name} must be an array of shape {layout} or a list of 2-D arrays of "
                f"shape {item}; could not convert it: {exc}"
            ) from None
        if X.dtype.kind == "O" and X.ndim == 1 and len(X) > 0:
            raise ValueError(
                f"{name} is a ragged list whose items are not all 2-D arrays of shape "
                f"{item}; got items with shapes {[np.shape(s) for s in X[:3]]}..."
            )
        _check_real_dtype(X, name)
    if X.ndim not in (2, 3):
        raise ValueError(
            f"{name} must be a 3-D array of shape {layout}, a 2-D "
            f"array of shape (n_samples, n_columns) or a list of 2-D arrays; got a "
            f"{X.ndim}-D array of shape {X.shape}."
            + (
                " Reshape your data: X.reshape(1, -1, 1) for one univariate sequence."
                if X.ndim == 1
                else ""
            )
        )
    if first and X.ndim == 3:
        X = np.swapaxes(X, 1, 2)
    if X.shape[0] == 0:
        raise ValueError(
            f"{name} must hold at least one sequence: found array with 0 sample(s) "
            f"(shape={X.shape}) while a minimum of 1 is required."
        )
    if X.ndim == 2 and X.shape[1] == 0:
        raise ValueError(
            f"{name} must have at least one column: found array with 0 feature(s) "
            f"(shape={X.shape}) while a minimum of 1 is required."
        )
    X = check_array(
        X,
        dtype=list(_FLOAT_DTYPES),
        ensure_all_finite=False,
        ensure_2d=False,
        allow_nd=True,
        ensure_min_samples=1,
        ensure_min_features=1,
        input_name=name,
        copy=copy,
    )
    two_d = X.ndim == 2
    if two_d:
        if token_dim is None:
            X = X[:, :, None]
        else:
            if X.shape[1] % token_dim:
                raise ValueError(
                    f"token_dim={token_dim} must divide the number of columns of the "
                    f"2-D {name}; got {X.shape[1]} columns."
                )
            if first:  # each row holds token_dim channels one after the other
                X = np.swapaxes(X.reshape(X.shape[0], token_dim, -1), 1, 2)
            else:
                X = X.reshape(X.shape[0], X.shape[1] // token_dim, token_dim)
    elif token_dim is not None and X.shape[2] != token_dim:
        raise ValueError(
            f"token_dim={token_dim} contradicts the token dimension of the 3-D {name}: "
            f"got tokens of dimension d={X.shape[2]} (shape {to_data_format(X, data_format).shape}"
            f"{', data_format=' + repr(data_format) if first else ''}). token_dim only "
            "reshapes 2-D input; leave it None or make it equal to d."
        )
    if X.shape[1] == 0 or X.shape[2] == 0:
        raise ValueError(
            f"{name} must have at least one token and a token dimension d >= 1; got "
            f"shape {X.shape}."
        )
    _check_token_dimension(X, n_features_in, name, expected_by, two_d and token_dim is None)
    if defer_finite:
        return np.ascontiguousarray(X), None
    return complete_sequences(np.ascontiguousarray(X), name=name, offset=offset,
                              fill_value=fill_value, copy=copy)


def complete_sequences(X, *, name="X", offset=0, fill_value=0.0, copy=True):
    """The checks :func:`check_sequences` defers: infinity, NaN and the padding rule.

    Returns X with ``fill_value`` at padded positions (copied first unless ``copy=False``) and
    the lengths.
    """
    # One pass: a finite sum means no NaN and no infinity (both propagate).
    # Otherwise scikit-learn's check words the refusal of infinity.
    if bool(np.isfinite(np.sum(X))):
        return X, np.full(X.shape[0], X.shape[1], dtype=np.int64)
    assert_all_finite(X, allow_nan=True, input_name=name)
    lengths = sequence_lengths(X, name=name, offset=offset)
    if fill_value is not None and lengths.min() < X.shape[1]:
        # Only padding can be NaN (sequence_lengths rejects any other NaN).
        if not copy:
            X = X.copy()
        X[np.isnan(X)] = fill_value
    return np.ascontiguousarray(X), lengths


def _check_token_dimension(X, n_features_in, name, expected_by=None, two_d=False):
    """The token dimension of a 3-D X against the expected one (None: any)."""
    if n_features_in is not None and X.shape[2] != n_features_in:
        by = expected_by or ("the estimator was fitted on tokens of that dimension "
                             "(n_features_in_ is the token dimension d)")
        hint = (
            f" A 2-D {name} is read as univariate sequences (d = 1) unless token_dim is "
            f"set: pass token_dim={n_features_in} to read each row as tokens of dimension "
            f"{n_features_in}, or a 3-D array." if two_d else ""
        )
        raise ValueError(
            f"{name} has tokens of dimension d={X.shape[2]}, but d={n_features_in} was "
            f"expected: {by}.{hint}"
        )


def check_lengths_array(lengths, n_samples, n_tokens):
    """Explicit sequence lengths as int64, each from 1 to ``n_tokens``."""
    raw = np.asarray(lengths)
    if raw.shape != (n_samples,) or raw.dtype.kind not in "iu":
        raise ValueError(
            f"lengths must be an integer array of shape ({n_samples},); got "
            f"{_describe(raw)}."
        )
    lengths = raw.astype(np.int64)
    if n_samples and (lengths.min() < 1 or lengths.max() > n_tokens):
        raise ValueError(
            f"lengths must lie between 1 and n_tokens={n_tokens}; got values from "
            f"{lengths.min()} to {lengths.max()}."
        )
    return lengths


def check_lengths(X, lengths, *, n_features_in=None, name="X", expected_by=None):
    """Validate a NaN-free 3-D X with explicit ``lengths``; return X and lengths (int64).

    Tokens at positions ``>= lengths[i]`` are ignored and zeroed (in a copy, when some are
    not zero); NaN or infinity within the lengths is a ValueError.
    """
    X = np.asarray(check_host_tensor(X, name))
    _check_real_dtype(X, name)
    if X.ndim != 3:
        raise ValueError(
            f"{name} must be a 3-D array of shape (n_samples, n_tokens, d) when lengths "
            f"are given; got shape {X.shape}."
        )
    _check_token_dimension(X, n_features_in, name, expected_by)
    lengths = check_lengths_array(lengths, X.shape[0], X.shape[1])
    if X.dtype not in _FLOAT_DTYPES:
        X = X.astype(np.float64)
    pad = ~real_tokens(lengths, X.shape[1])
    if pad.any() and np.any(X[pad] != 0):
        X = X.copy()
        X[pad] = 0.0
    real = X[~pad]
    if not np.isfinite(real).all():
        raise ValueError(
            f"Input {name} contains NaN or infinity inside the given lengths."
        )
    return X, lengths


def check_targets(y, lengths, n_tokens, *, readout, name="y", data_format="channels_last",
                  offset=0):
    """Validate targets against validated sequences; return ``(Y, single_output)``.

    ``Y`` is (n_samples, d_out) for ``readout="last"``, (n_samples, n_tokens, d_out) with zeros
    at padded positions for ``"all"`` (where y may be a list of per-sequence targets, with the
    output axis first for ``"channels_first"``); ``single_output``: y had no output axis.
    """
    check_readout(readout)
    n_samples = lengths.shape[0]
    if y is None:
        raise ValueError(
            f"this estimator requires y to be passed, but the target {name} is None."
        )
    first = check_data_format(data_format) == "channels_first" and readout == "all"
    y = check_host_tensor(y, name)
    if first and isinstance(y, (list, tuple)):
        # (d_out, n_tokens_i) per sequence, like the sequences themselves.
        y = [np.asarray(s).T if np.ndim(s) == 2 else s for s in y]
    if readout == "all" and isinstance(y, (list, tuple)) and len(y) > 0 and all(
        item_ndim(s) in (1, 2) for s in y
    ) and len({np.ndim(s) for s in y}) == 1 and any(
        np.shape(s)[0] != n_tokens for s in y
    ):
        # Per-sequence targets (n_tokens_i[, d_out]); pad them with NaN like X.
        y = pad_targets(
            y, n_tokens, name,
            lambda i, trail: f"expected ({lengths[i] if i < n_samples else '?'},"
                             f"{' ' + str(trail[0]) if trail else ''}) to match X[{i + offset}]",
            offset)
    try:
        y = np.asarray(y)
    except ValueError as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if y.dtype.kind == "O":
        y = _numeric_object_array(y, name, "numeric targets")
    _check_real_dtype(y, name)
    y = y.astype(np.float64, copy=True)
    if first and y.ndim == 3:
        y = np.swapaxes(y, 1, 2)
    if np.isinf(y).any():
        raise ValueError(f"Input {name} contains infinity.")
    if y.shape[:1] != (n_samples,):
        raise ValueError(
            f"{name} must have one entry per sequence of X (n_samples={n_samples}); got "
            f"shape {y.shape}."
        )
    if readout == "last":
        if y.ndim not in (1, 2):
            raise ValueError(
                f"with readout='last', {name} must have shape (n_samples,) or "
                f"(n_samples, d_out); got shape {y.shape}. Targets at every position "
                "need readout='all'."
            )
        single = y.ndim == 1
        Y = y[:, None] if single else y
        if Y.shape[1] == 0:
            raise ValueError(f"{name} must have at least one output; got shape {y.shape}.")
        if np.isnan(Y).any():
            i = int(np.flatnonzero(np.isnan(Y).any(axis=1))[0])
            raise ValueError(
                f"{name}[{i + offset}] is NaN; with readout='last' every sequence needs a "
                "target."
            )
        return Y, single
    if y.ndim not in (2, 3) or y.shape[1] != n_tokens:
        raise ValueError(
            f"with readout='all', {name} must have shape (n_samples, n_tokens) or "
            f"(n_samples, n_tokens, d_out) = ({n_samples}, {n_tokens}[, d_out]), with NaN "
            f"at padded positions; got shape {y.shape}."
        )
    single = y.ndim == 2
    Y = y[:, :, None] if single else y
    if Y.shape[2] == 0:
        raise ValueError(f"{name} must have at least one output; got shape {y.shape}.")
    real = real_tokens(lengths, n_tokens)
    nan = np.isnan(Y)
    bad = nan.any(axis=2) & real
    if bad.any():
        i, t = np.argwhere(bad)[0]
        raise ValueError(
            f"{name}[{i + offset}, {t}] is NaN but X[{i + offset}, {t}] is a real token; "
            "only padded positions may have NaN targets."
        )
    stray = ~nan.all(axis=2) & ~real
    if stray.any():
        i, t = np.argwhere(stray)[0]
        raise ValueError(
            f"{name}[{i + offset}, {t}] holds a target but X[{i + offset}, {t}] is padding; "
            "targets at padded positions must be NaN (is y aligned with X?)."
        )
    Y[~real] = 0.0
    return Y, single


def check_sample_weight(sample_weight, n_samples, *, name="sample_weight", offset=0):
    """Per-sequence weights as a new float64 array of shape (n_samples,), or None.

    A number gives every sequence that weight; weights must be finite and non-negative.
    """
    if sample_weight is None:
        return None
    if isinstance(sample_weight, numbers.Real) and not isinstance(
        sample_weight, (bool, np.bool_)
    ):
        sample_weight = np.full(n_samples, float(sample_weight))
    try:
        w = np.asarray(check_host_tensor(sample_weight, name))
    except ValueError as exc:
        raise ValueError(f"{name} could not be converted to an array: {exc}") from None
    if w.dtype.kind == "b" or w.dtype.kind not in "iuf":
        raise TypeError(
            f"{name} must hold real numbers, one per sequence; got {_describe(w)}."
        )
    if w.shape != (n_samples,):
        raise ValueError(
            f"{name} must have shape ({n_samples},), one weight per sequence of X; got "
            f"shape {w.shape}."
        )
    w = w.astype(np.float64, copy=True)
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name} must be finite; got NaN or infinity.")
    if np.any(w < 0):
        i = int(np.flatnonzero(w < 0)[0])
        raise ValueError(
            f"{name} must be non-negative; got {name}[{i + offset}] = {float(w[i])!r}."
        )
    return w


def check_heads(V, Q):
    """Validated float64 heads: V of shape (n_heads, d_out, d), Q of shape (n_heads, d, d)."""
    V = as_real_array(V, "V", finite=True)
    Q = as_real_array(Q, "Q", finite=True)
    if V.ndim != 3 or Q.ndim != 3:
        raise ValueError(
            "V must have shape (n_heads, d_out, d) and Q shape (n_heads, d, d); got "
            f"V of shape {V.shape} and Q of shape {Q.shape}."
        )
    if Q.shape[1] != Q.shape[2] or V.shape[0] != Q.shape[0] or V.shape[2] != Q.shape[1]:
        raise ValueError(
            "V must have shape (n_heads, d_out, d) and Q shape (n_heads, d, d) with the "
            f"same n_heads and d; got V of shape {V.shape} and Q of shape {Q.shape}."
        )
    return V, Q
