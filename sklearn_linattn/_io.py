"""Model files that are safe to load: plain arrays in ``.npz``, never pickles."""

import json
import os

import numpy as np
from sklearn.utils.validation import check_is_fitted

from .estimators import LinearAttentionRegressor

__all__ = ["load_model", "save_model"]

_FORMAT = "sklearn-linattn-model"
_FORMAT_VERSION = 1
_ARRAYS = ("coef_", "value_matrices_", "key_query_matrices_")
_SCALARS = ("n_heads_", "n_features_in_", "n_outputs_", "feature_rank_")


def save_model(model, path):
    """Write a fitted :class:`LinearAttentionRegressor` to an ``.npz`` file.

    The file holds only numeric arrays and a JSON string of the parameters,
    so :func:`load_model` never unpickles anything.  The identifiability
    certificate is not stored (recompute it from the data).

    Parameters
    ----------
    model : LinearAttentionRegressor
        A fitted model.
    path : str or path-like
        Destination; ``.npz`` is appended by numpy when missing.

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
    params = model.get_params()
    if params["random_state"] is not None and not isinstance(params["random_state"], int):
        params["random_state"] = None  # a RandomState instance is not plain data
    arrays = {name: getattr(model, name) for name in _ARRAYS}
    arrays.update({name: np.int64(getattr(model, name)) for name in _SCALARS})
    residual = model.compression_residual_
    np.savez(
        path,
        format=np.str_(_FORMAT),
        format_version=np.int64(_FORMAT_VERSION),
        params=np.str_(json.dumps(params)),
        single_output=np.bool_(model._single_output),
        compression_residual_=np.float64(np.nan if residual is None else residual),
        **arrays,
    )


def load_model(path):
    """Read a model written by :func:`save_model`.

    Parameters
    ----------
    path : str or path-like

    Returns
    -------
    model : LinearAttentionRegressor
        Fitted, ready to ``predict``.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is not a sklearn-linattn model file or is inconsistent.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such model file: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a readable .npz model file: {exc}") from None
    with data:
        if "format" not in data.files or str(data["format"]) != _FORMAT:
            raise ValueError(f"{path} is not a sklearn-linattn model file.")
        version = int(data["format_version"])
        if version != _FORMAT_VERSION:
            raise ValueError(
                f"{path} has model format version {version}; this version of "
                f"sklearn-linattn reads version {_FORMAT_VERSION}."
            )
        missing = [k for k in _ARRAYS + _SCALARS + ("params",) if k not in data.files]
        if missing:
            raise ValueError(f"{path} lacks the entries {missing}.")
        model = LinearAttentionRegressor(**json.loads(str(data["params"])))
        for name in _ARRAYS:
            setattr(model, name, np.asarray(data[name], dtype=np.float64))
        for name in _SCALARS:
            setattr(model, name, int(data[name]))
        residual = float(data["compression_residual_"])
        model.compression_residual_ = None if np.isnan(residual) else residual
        model._single_output = bool(data["single_output"])
    V, Q = model.value_matrices_, model.key_query_matrices_
    d, d_out = model.n_features_in_, model.n_outputs_
    if V.shape != (model.n_heads_, d_out, d) or Q.shape != (model.n_heads_, d, d):
        raise ValueError(
            f"{path} is inconsistent: value matrices {V.shape} and key-query matrices "
            f"{Q.shape} do not match n_heads_={model.n_heads_}, d_out={d_out}, d={d}."
        )
    return model
