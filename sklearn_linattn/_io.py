"""Model files that are safe to load: plain arrays in ``.npz``, never pickles."""

import json
import math
import numbers
import os

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._features import n_attention_features
from ._attention import attention_coefficients
from ._memory import resolve_budget
from ._namespace import on_host
from ._npz import NpzReader, gib
from ._params import check_decays
from ._solvers import SOLVERS
from ._units import TokenStandardizer
from ._estimators import LinearAttentionRegressor
from ._cv import LinearAttentionRegressorCV

__all__ = ["load_model", "save_model"]

_FORMAT = "sklearn-linattn-model"
# Version 2 added solver_ and n_iter_, the standardized coordinates and the
# model in them, and stores _single_output under its attribute name;
# version 1 files came from development snapshots only.  Fixed decays added
# entries to version 3 that only models with decays have (_DECAY_ENTRIES), so
# the files of models without them are what they were.
_FORMAT_VERSION = 3

# The fitted attributes a model file holds.  A scalar is given by its kind;
# an array (always real floating point) by its shape in terms of
# d = n_features_in_, d_out = n_outputs_, h = n_heads_ and k, the number of
# feature blocks (decays; 1 without), which the file must match exactly
# before the array is read.  This is the one list to extend when the
# estimator gains a fitted attribute.
_ATTRIBUTES = {
    "n_features_in_": "int",
    "n_outputs_": "int",
    "n_heads_": "int",
    "feature_rank_": "int",
    "solver_": "str",
    "n_iter_": "int",
    "compression_residual_": "float or None",
    "_single_output": "bool",
    "coef_": lambda d, d_out, h, k: (d_out, k * n_attention_features(d)),
    "value_matrices_": lambda d, d_out, h, k: (h, d_out, d),
    "key_query_matrices_": lambda d, d_out, h, k: (h, d, d),
    "head_decays_": lambda d, d_out, h, k: (h,),
    "intercept_": lambda d, d_out, h, k: (d_out,),
    "skip_coef_": lambda d, d_out, h, k: (d_out, d),
}
# The standardized coordinates the model was fitted in (``standardization_``)
# and the model in them, which ``predict`` evaluates; stored as plain arrays
# (the exponents as exact float64 integers) and checked against the
# attributes above when loaded.
_STANDARDIZED = {
    "standardization_exponents": lambda d, d_out, h, k: (d,),
    "standardization_whitening": lambda d, d_out, h, k: (d, d),
    "standardization_y_exponents": lambda d, d_out, h, k: (d_out,),
    "standardization_decays": lambda d, d_out, h, k: (k,),
    "standardized_coef": lambda d, d_out, h, k: (d_out, k * n_attention_features(d)),
    "standardized_value_matrices": lambda d, d_out, h, k: (h, d_out, d),
    "standardized_key_query_matrices": lambda d, d_out, h, k: (h, d, d),
}
_STANDARDIZED_SCALARS = {"standardization_whitened": "bool",
                         "standardization_weight_exponent": "int"}
# The entries of the decays, which a file holds exactly when the parameter
# decay is set: without decays head_decays_ is None and the standardized
# coordinates have one block, as in files written before decays existed.
_DECAY_ENTRIES = frozenset({"head_decays_", "standardization_decays"})
# Parameters that may be a sequence (of numbers): stored as a JSON array, so
# they come back as a list.
_SEQUENCE_PARAMS = frozenset({"decay"})
# Exponents of the power-of-two scales that float64 can hold at all.
_MAX_EXPONENT = 1100
# Entries of the file itself, not attributes of the model.  heads_residual
# is what save_model measured between the heads' coefficients and coef_, in
# the data's own units: load_model measures it again (see
# _check_heads_reproduce_coef).
_FILE_ENTRIES = ("format", "format_version", "params", "heads_residual")
# The parameters are one flat JSON object (one level).  Python's JSON decoder
# recurses once per level of nesting, so a text nested deeper than this is
# refused before it is decoded: 2**16 characters can nest 32 768 levels, far
# past the interpreter's recursion limit.
_MAX_JSON_DEPTH = 32
def _json_value(name, value):
    """A parameter as plain JSON data; those of ``_SEQUENCE_PARAMS`` may be a JSON array."""
    if (name in _SEQUENCE_PARAMS and not isinstance(value, (str, bytes))
            and np.ndim(value) == 1):
        return [_json_value(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    sequence = " (or a sequence of numbers)" if name in _SEQUENCE_PARAMS else ""
    raise TypeError(
        f"save_model stores parameters as plain data; parameter {name}={value!r} of type "
        f"{type(value).__name__} is not a number{sequence}, string or None."
    )


def save_model(model, path):
    """Write a fitted :class:`LinearAttentionRegressor` to an ``.npz`` file.

    Only numeric arrays and text, never pickles; no certificate or sufficient
    statistics (see :ref:`the FAQ on model files <faq-model-files>`).

    Parameters
    ----------
    model : LinearAttentionRegressor or LinearAttentionRegressorCV
        A fitted model.
    path : str or path-like
        Destination; ``.npz`` is appended by numpy when missing.

    Raises
    ------
    TypeError
        When ``model`` is not a fitted LinearAttentionRegressor, or a
        parameter is not plain data.
    ValueError
        When the parameter ``decay`` is not the decays the model was fitted with,
        or the model has the linear term of ``fit_linear=True``.

    See Also
    --------
    load_model : Read the file back, checking every entry.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from sklearn_linattn import LinearAttentionRegressor, load_model, save_model
    >>> X = np.random.default_rng(0).normal(size=(40, 5, 2))
    >>> model = LinearAttentionRegressor().fit(X, X[:, -1, 0])
    >>> path = os.path.join(tempfile.mkdtemp(), "model.npz")
    >>> save_model(model, path)
    >>> bool(np.allclose(load_model(path).predict(X), model.predict(X)))
    True
    """
    if not isinstance(model, LinearAttentionRegressor):
        raise TypeError(
            f"model must be a fitted LinearAttentionRegressor; got {type(model).__name__}."
        )
    check_is_fitted(model)
    model = on_host(model)  # a fit in another array namespace: its arrays read once
    if getattr(model, "linear_coef_", None) is not None:
        raise ValueError(
            "save_model writes attention heads with intercept and skip terms only; this model "
            "has the linear term of fit_linear=True. Save it with pickle or joblib.")
    params = model.get_params()
    if isinstance(model, LinearAttentionRegressorCV):
        # The search's parameters describe how alpha_ was chosen, not the model.
        params = {name: params[name] for name in LinearAttentionRegressor().get_params()
                  if name in params}
        params["alpha"] = model.alpha_
        # A search over candidate decays and terms records its choices as decay_,
        # fit_intercept_ and fit_skip_.
        params["decay"] = getattr(model, "decay_", params.get("decay"))
        params["fit_intercept"] = getattr(model, "fit_intercept_", params["fit_intercept"])
        params["fit_skip"] = getattr(model, "fit_skip_", params["fit_skip"])
    if isinstance(params["random_state"], np.random.RandomState):
        params["random_state"] = None
    missing = [name for name in _ATTRIBUTES if not hasattr(model, name)]
    if missing:
        raise TypeError(f"model lacks the fitted attributes {missing}; fit it again.")
    decays = _fitted_decays(model, params["decay"])
    params = {name: _json_value(name, value) for name, value in params.items()}
    entries = {"heads_residual": np.float64(_heads_residual(model, decays))}
    for name, spec in _ATTRIBUTES.items():
        value = getattr(model, name)
        if name in _DECAY_ENTRIES and decays is None:
            continue
        if spec == "int":
            entries[name] = np.int64(value)
        elif spec == "bool":
            entries[name] = np.bool_(value)
        elif spec == "str":
            entries[name] = np.str_(value)
        elif spec == "float or None":
            entries[name] = np.float64(np.nan if value is None else value)
        else:
            entries[name] = np.asarray(value, dtype=np.float64)
    entries.update(_standardized_entries(model))
    np.savez(
        path,
        format=np.str_(_FORMAT),
        format_version=np.int64(_FORMAT_VERSION),
        params=np.str_(json.dumps(params, allow_nan=False)),
        **entries,
    )


def _fitted_decays(model, decay):
    """The decays the model was fitted with, which its parameter ``decay`` must give."""
    fitted = model.standardization_.decays
    try:
        same = check_decays(decay) == fitted
    except (TypeError, ValueError):
        same = False
    if not same:
        raise ValueError(
            f"model was fitted with decay={None if fitted is None else list(fitted)}, but its "
            f"parameter is decay={decay!r} (set after fit?); fit it again or set it back.")
    head_decays = model.head_decays_
    if (fitted is None) != (head_decays is None):
        raise ValueError(
            f"model was fitted with decay={None if fitted is None else list(fitted)}, but its "
            f"head_decays_ is {head_decays!r}; fit it again.")
    return fitted


def _standardized_entries(model):
    """The file entries of ``standardization_`` and of the model in those coordinates."""
    st = model.standardization_
    d, d_out = model.n_features_in_, model.n_outputs_
    V, Q = model._standardized_heads
    decays = {} if st.decays is None else {
        "standardization_decays": np.asarray(st.decays, dtype=np.float64)}
    return {
        **decays,
        "standardization_exponents": st.exponents.astype(np.float64),
        "standardization_whitening": np.eye(d) if st.whitening is None else st.whitening,
        "standardization_y_exponents": (np.zeros(d_out) if st.y_exponents is None
                                        else st.y_exponents.astype(np.float64)),
        "standardization_whitened": np.bool_(st.whitened),
        "standardization_weight_exponent": np.int64(st.weight_exponent),
        "standardized_coef": np.asarray(model._standardized_coef, dtype=np.float64),
        "standardized_value_matrices": np.asarray(V, dtype=np.float64),
        "standardized_key_query_matrices": np.asarray(Q, dtype=np.float64),
    }


def _restore_standardization(path, model, values, decays):
    """Set ``standardization_`` and the standardized model, which must map back to ``coef_``."""
    def fail(key, message):
        raise ValueError(f"{path}: entry {key!r} {message}")

    exponents = {}
    for key in ("standardization_exponents", "standardization_y_exponents"):
        e = values[key]
        if not (np.all(e == np.round(e)) and np.all(np.abs(e) <= _MAX_EXPONENT)):
            fail(key, f"must hold integers between -{_MAX_EXPONENT} and {_MAX_EXPONENT}; "
                 f"found {e}.")
        exponents[key] = e.astype(np.int64)
    ew = values["standardization_weight_exponent"]
    if abs(ew) > _MAX_EXPONENT:
        fail("standardization_weight_exponent", f"must be between -{_MAX_EXPONENT} and "
             f"{_MAX_EXPONENT}; found {ew}.")
    W = values["standardization_whitening"]
    whitened = values["standardization_whitened"]
    if not whitened and not np.array_equal(W, np.eye(W.shape[0])):
        fail("standardization_whitening", "must be the identity when "
             "'standardization_whitened' is false.")
    if whitened and not np.linalg.cond(W) < 1e15:
        fail("standardization_whitening", "must be an invertible matrix (a whitening).")
    st = TokenStandardizer(exponents["standardization_exponents"],
                           W if whitened else None,
                           exponents["standardization_y_exponents"], ew, decays=decays)
    coef_s = values["standardized_coef"]
    V_s = values["standardized_value_matrices"]
    Q_s = values["standardized_key_query_matrices"]
    try:
        coef = st.coef_to_user(coef_s)
        V, Q = st.heads_to_user(V_s, Q_s)
    except ValueError as exc:
        fail("standardized_coef", f"cannot be mapped back to the data's units ({exc}).")
    for key, got, want in (("coef_", coef, values["coef_"]),
                           ("value_matrices_", V, values["value_matrices_"]),
                           ("key_query_matrices_", Q, values["key_query_matrices_"])):
        scale = float(np.abs(want).max(initial=0.0))
        if not np.allclose(got, want, rtol=1e-9, atol=1e-12 * scale):
            raise ValueError(
                f"{path}: entries {key!r} and the standardized model disagree: "
                f"'standardized_*' mapped back through 'standardization_*' differ from "
                f"{key!r} by {np.abs(got - want).max():.3g} (largest entry {scale:.3g}); "
                "predict and the fitted attributes would describe different models."
            )
    model.standardization_ = st
    model._standardized_coef = coef_s
    model._standardized_heads = (V_s, Q_s)


def _json_depth_exceeds(text, limit):
    """Whether JSON text nests more than ``limit`` levels deep (a scan, without recursion)."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _refuse_constant(name):
    raise ValueError(f"{name} is not a finite number")


def _model_from_params(path, text):
    """The estimator the file's JSON parameters describe, validated as ``fit`` would."""
    if _json_depth_exceeds(text, _MAX_JSON_DEPTH):
        raise ValueError(
            f"{path}: entry 'params' nests arrays or objects more than {_MAX_JSON_DEPTH} "
            "levels deep; it must be one JSON object of parameters (numbers, strings, "
            "booleans and null)."
        )
    try:
        params = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ValueError(f"{path}: entry 'params' is not valid JSON ({exc}).") from None
    if not isinstance(params, dict):
        raise ValueError(
            f"{path}: entry 'params' must be a JSON object of parameters; found "
            f"{type(params).__name__}."
        )
    known = LinearAttentionRegressor().get_params()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(
            f"{path}: entry 'params' has unknown parameters {unknown}; "
            f"LinearAttentionRegressor takes {sorted(known)}."
        )
    model = LinearAttentionRegressor(**params)
    try:
        model._check_params()
        # Neither is checked by fit: random_state by check_random_state when
        # compressing, verbose by truth value; a file must still be sane.
        rs = model.random_state
        if rs is not None and (isinstance(rs, bool) or not isinstance(rs, int)
                               or not 0 <= rs < 2**32):
            raise ValueError(f"random_state must be None or an integer in [0, 2**32); "
                             f"got {rs!r}.")
        if not isinstance(model.verbose, int) or model.verbose < 0:
            raise ValueError(f"verbose must be a non-negative integer; got {model.verbose!r}.")
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: entry 'params' is invalid: {exc}") from None
    return model


def _check_scalars(path, model, values, decays):
    """Ranges of the scalar attributes and their consistency with the parameters."""
    d, d_out, h = values["n_features_in_"], values["n_outputs_"], values["n_heads_"]

    def fail(key, message):
        raise ValueError(f"{path}: entry {key!r} {message}")

    if d < 1:
        fail("n_features_in_", f"(the token dimension d) must be at least 1; found {d}.")
    if d_out < 1:
        fail("n_outputs_", f"must be at least 1; found {d_out}.")
    # The SVD of the (d_out d) x d^2 coefficient matrix gives at most that many
    # heads (per decay, one matrix each), and compression only ever reduces the
    # count.
    most = min(d_out * d, d * d)
    k = 1 if decays is None else len(decays)
    if not 0 <= h <= k * most:
        bound = (f"min(d_out * d, d * d) = {most} for d = {d}, d_out = {d_out}"
                 if decays is None else f"n_decays * min(d_out * d, d * d) = {k * most} "
                 f"for d = {d}, d_out = {d_out} and {_decays_text(k)}")
        fail("n_heads_", f"must be between 0 and {bound}; found {h}.")
    psi = n_attention_features(d)
    if not 0 <= values["feature_rank_"] <= k * psi:
        features = "psi" if decays is None else f"n_decays * psi = {k} * {psi}"
        fail("feature_rank_", f"must be between 0 and {features} = {k * psi}; found "
             f"{values['feature_rank_']}.")
    if values["solver_"] not in SOLVERS[1:]:
        fail("solver_", f"must be one of {SOLVERS[1:]}; found {values['solver_']!r}.")
    if values["n_iter_"] < 1:
        fail("n_iter_", f"must be at least 1; found {values['n_iter_']}.")
    if values["_single_output"] and d_out != 1:
        fail("_single_output", f"is true, which needs n_outputs_ = 1; found {d_out}.")
    if model.token_dim is not None and model.token_dim != d:
        fail("params", f"has token_dim={model.token_dim}, but n_features_in_ = {d}.")
    residual = values["compression_residual_"]
    if model.n_heads == "auto":
        # The count is chosen, between 0 (zero coefficients) and the SVD's;
        # the residual of the heads returned is always recorded.
        if residual is None:
            fail("compression_residual_", "is NaN, but the parameter n_heads='auto' "
                 "always records the residual of the heads it chose.")
        if not 0 <= residual < np.inf:
            fail("compression_residual_", f"must be a finite number >= 0; found {residual}.")
    elif residual is None:
        # With decays the bound is per decay (checked with head_decays_).
        if decays is None and model.n_heads is not None and h > model.n_heads:
            fail("n_heads_", f"is {h}, more than the parameter n_heads={model.n_heads}, "
                 "with no compression_residual_.")
    else:
        # A compression of coef_ has a relative residual of at most 1 (zero heads
        # have exactly 1); heads fitted to the data directly (n_heads below an
        # unidentified fit) may be another minimizer, far from coef_.
        if not 0 <= residual < np.inf:
            fail("compression_residual_", f"must be NaN (no compression) or a finite "
                 f"number >= 0; found {residual}.")
        # With decays, some decay's heads (checked with head_decays_).
        if model.n_heads is None or (decays is None and h != model.n_heads):
            fail("compression_residual_", f"is set, so the heads were compressed to the "
                 f"parameter n_heads={model.n_heads}; but n_heads_ = {h}.")


def _decays_text(k):
    return f"{k} decay{'' if k == 1 else 's'}"


def _check_head_decays(path, model, values, decays):
    """``head_decays_`` and ``standardization_decays`` against ``decay`` and ``n_heads``."""
    def fail(key, message):
        raise ValueError(f"{path}: entry {key!r} {message}")

    given = values["standardization_decays"]
    if not np.all((given > 0) & (given <= 1)):
        fail("standardization_decays", f"must hold decays in (0, 1]; found {given.tolist()}.")
    if tuple(given.tolist()) != decays:
        fail("standardization_decays", f"must be the parameter decay={list(decays)} (the "
             f"feature blocks the model was fitted with); found {given.tolist()}.")
    head_decays = values["head_decays_"]
    if not np.all((head_decays > 0) & (head_decays <= 1)):
        fail("head_decays_", f"must hold decays in (0, 1]; found {head_decays.tolist()}.")
    block = np.full(head_decays.shape, len(decays))
    for b, gamma in enumerate(decays):
        block[head_decays == gamma] = b
    if np.any(block == len(decays)):
        stray = head_decays[block == len(decays)][0]
        fail("head_decays_", f"holds the decay {stray}, which is not one of the parameter "
             f"decay={list(decays)}.")
    if np.any(np.diff(block) < 0):
        fail("head_decays_", f"must list the heads decay by decay in the order of the "
             f"parameter decay={list(decays)}; found {head_decays.tolist()}.")
    d, d_out = values["n_features_in_"], values["n_outputs_"]
    counts = np.bincount(block, minlength=len(decays))
    largest = int(counts.max())
    gamma = decays[int(counts.argmax())]
    most = min(d_out * d, d * d)
    if largest > most:
        fail("head_decays_", f"gives {largest} heads the decay {gamma}, more than the "
             f"min(d_out * d, d * d) = {most} one decay's coefficients have for d = {d}, "
             f"d_out = {d_out}.")
    n_heads, residual = model.n_heads, values["compression_residual_"]
    if n_heads is None or n_heads == "auto":
        return
    if residual is None and largest > n_heads:
        fail("head_decays_", f"gives {largest} heads the decay {gamma}, more than the "
             f"parameter n_heads={n_heads} (the most per decay), with no "
             "compression_residual_.")
    if residual is not None and largest != n_heads:
        fail("compression_residual_", f"is set, so some decay's heads were compressed to "
             f"the parameter n_heads={n_heads}; but the most heads of one decay (entry "
             f"'head_decays_') is {largest}.")


def _head_coefficients(model, decays):
    """The coefficients ``p(V, Q)`` of the model's heads, shaped as ``coef_`` (block by decay)."""
    return attention_coefficients(model.value_matrices_, model.key_query_matrices_,
                                  decays=model.head_decays_ if decays is not None else None,
                                  blocks=decays)


def _heads_residual(model, decays):
    """``||p(V, Q) - coef_|| / ||coef_||`` in the data's own units (0 for 0 = 0)."""
    coef = np.asarray(model.coef_, dtype=np.float64)
    p = _head_coefficients(model, decays)
    norm = float(np.linalg.norm(coef))
    gap = float(np.linalg.norm(p - coef))
    if gap == 0:
        return 0.0
    return gap / norm if norm > 0 else math.inf


def _rounding_allowance(d, d_out):
    """Relative difference between honest heads and ``coef_`` that is only rounding."""
    rows, cols = d_out * d, d * d
    return 10 * max(rows, cols) * math.sqrt(min(rows, cols)) * np.finfo(np.float64).eps


def _check_terms_match_params(path, model):
    """An intercept or skip term the parameters do not have would change predict silently."""
    for flag, name in (("fit_intercept", "intercept_"), ("fit_skip", "skip_coef_")):
        if not getattr(model, flag) and np.any(getattr(model, name)):
            raise ValueError(
                f"{path}: entry {name!r} is not zero, but the parameters say {flag}=False; "
                "predict would add a term the model was not fitted with."
            )


def _check_heads_reproduce_coef(path, model, recorded, decays):
    """The heads must compute ``coef_``: to rounding, or to the recorded ``heads_residual``."""
    d, d_out = model.n_features_in_, model.n_outputs_
    allowance = _rounding_allowance(d, d_out)
    found = _heads_residual(model, decays)
    heads = "entries 'value_matrices_' and 'key_query_matrices_' do not reproduce 'coef_'"
    if not (math.isfinite(recorded) and recorded >= 0):
        raise ValueError(f"{path}: entry 'heads_residual' must be a finite number >= 0; "
                         f"found {recorded}.")
    if model.compression_residual_ is None and not found <= allowance:
        raise ValueError(
            f"{path}: {heads}: the heads' coefficients differ from coef_ by {found:.3g} "
            f"relative, but without compression (compression_residual_ is NaN) they "
            f"must agree to rounding ({allowance:.1e}); predict and "
            "predict_from_coefficients would disagree."
        )
    if not abs(found - recorded) <= allowance + 1e-9 * recorded:
        raise ValueError(
            f"{path}: {heads} as recorded: the heads' coefficients differ from coef_ by "
            f"{found:.3g} relative, but entry 'heads_residual' records {recorded:.3g} (to "
            f"rounding, {allowance:.1e}); predict and predict_from_coefficients would "
            "disagree by more than the file says."
        )


def load_model(path):
    """Read a model written by :func:`save_model`, checking every entry.

    Nothing in the file is trusted (see :ref:`the FAQ on model files
    <faq-model-files>`); missing parameters take their defaults.  The
    model predicts; ``partial_fit`` raises a ``ValueError``.

    Parameters
    ----------
    path : str or path-like
        The ``.npz`` file written by :func:`save_model`.

    Returns
    -------
    model : LinearAttentionRegressor
        Fitted, ready to ``predict``.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not a sklearn-linattn model file or any entry is
        corrupt or inconsistent; the message names the file and the entry.

    See Also
    --------
    save_model : Write the file.

    Examples
    --------
    >>> import numpy as np, os, tempfile
    >>> from sklearn_linattn import LinearAttentionRegressor, load_model, save_model
    >>> X = np.random.default_rng(0).normal(size=(40, 5, 2))
    >>> path = os.path.join(tempfile.mkdtemp(), "model.npz")
    >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)  # one head computes this
    >>> save_model(LinearAttentionRegressor(n_heads=1).fit(X, y), path)
    >>> model = load_model(path)
    >>> model.n_heads_, bool(np.allclose(model.predict(X), model.predict_from_coefficients(X)))
    (1, True)
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"path must be a file name; got {type(path).__name__}.")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: {os.fsdecode(path)}")
    with NpzReader(path, "a sklearn-linattn model file") as reader:
        path = reader.path
        if "format" not in reader.entries:
            raise ValueError(
                f"{path} is not a sklearn-linattn model file (it has no entry 'format'; "
                f"its entries are {sorted(reader.entries)})."
            )
        tag = reader.scalar("format", "str")
        if tag != _FORMAT:
            raise ValueError(
                f"{path} is not a sklearn-linattn model file: entry 'format' is {tag!r}, "
                f"expected {_FORMAT!r}."
            )
        if "format_version" not in reader.entries:
            raise ValueError(f"{path} lacks the entry 'format_version'.")
        version = reader.scalar("format_version", "int")
        if version != _FORMAT_VERSION:
            raise ValueError(
                f"{path}: entry 'format_version' is {version}; this version of "
                f"sklearn-linattn reads model format version {_FORMAT_VERSION} (fit and "
                "save the model again)."
            )
        expected = (set(_FILE_ENTRIES) | set(_ATTRIBUTES) | set(_STANDARDIZED)
                    | set(_STANDARDIZED_SCALARS)) - _DECAY_ENTRIES
        missing = sorted(expected - set(reader.entries))
        if missing:
            raise ValueError(f"{path} lacks the entries {missing}.")
        unknown = sorted(set(reader.entries) - expected - _DECAY_ENTRIES)
        if unknown:
            raise ValueError(f"{path} has unknown entries {unknown}.")

        model = _model_from_params(path, reader.scalar("params", "str"))
        decays = check_decays(model.decay)  # valid: checked with the parameters
        present = sorted(_DECAY_ENTRIES & set(reader.entries))
        if decays is None and present:
            raise ValueError(
                f"{path}: the entries {present} hold decays, but entry 'params' has no "
                "decay (decay=None); the file is inconsistent.")
        if decays is not None and len(present) < len(_DECAY_ENTRIES):
            raise ValueError(
                f"{path} lacks the entries {sorted(_DECAY_ENTRIES - set(present))}, which a "
                f"model with decay={list(decays)} (entry 'params') has.")
        values = {}
        for name, spec in _ATTRIBUTES.items():
            if spec == "float or None":
                value = reader.scalar(name, "float")
                if math.isinf(value):
                    raise ValueError(f"{path}: entry {name!r} must be finite or NaN (none); "
                                     f"found {value}.")
                values[name] = None if math.isnan(value) else value
            elif isinstance(spec, str):
                values[name] = reader.scalar(name, spec)
        _check_scalars(path, model, values, decays)
        for name, kind in _STANDARDIZED_SCALARS.items():
            values[name] = reader.scalar(name, kind)

        d, d_out, h = values["n_features_in_"], values["n_outputs_"], values["n_heads_"]
        k = 1 if decays is None else len(decays)
        shapes = {name: spec(d, d_out, h, k)
                  for name, spec in {**_ATTRIBUTES, **_STANDARDIZED}.items()
                  if callable(spec) and (decays is not None or name not in _DECAY_ENTRIES)}
        total = 8 * sum(math.prod(shape) for shape in shapes.values())
        budget = resolve_budget()
        if total > budget:
            raise ValueError(
                f"{path}: a model with d = {d}, d_out = {d_out} and {h} heads (entries "
                f"'n_features_in_', 'n_outputs_', 'n_heads_') needs {gib(total)}, more "
                f"than the memory budget of {gib(budget)}."
            )
        for name, shape in shapes.items():
            found, dtype, _, _ = reader.header(name)
            if found != shape or dtype.kind != "f":
                blocks = "" if decays is None else f", {_decays_text(k)}"
                raise ValueError(
                    f"{path}: entry {name!r} must be a floating-point array of shape "
                    f"{shape} (d = {d}, d_out = {d_out}, n_heads_ = {h}{blocks}); found "
                    f"shape {found} and dtype {dtype}."
                )
        for name in shapes:
            array = reader.read(name).astype(np.float64)
            if not np.all(np.isfinite(array)):
                raise ValueError(f"{path}: entry {name!r} holds NaN or infinite values.")
            values[name] = array
        recorded = reader.scalar("heads_residual", "float")

    if decays is not None:
        _check_head_decays(path, model, values, decays)
    for name in _ATTRIBUTES:
        setattr(model, name, values.get(name))  # head_decays_ None without decays
    # The head dimension is the parameter's; its gap is not stored.
    model.head_dim_, model.head_dim_gap_ = getattr(model, "head_dim", None), None
    _check_heads_reproduce_coef(path, model, recorded, decays)
    _check_terms_match_params(path, model)
    _restore_standardization(path, model, values, decays)
    # Statistics are not stored: partial_fit must refuse rather than restart.
    model._state = None
    return model
