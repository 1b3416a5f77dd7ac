"""Level normalization of windows: each window in its own location and scale, and back.

A forecaster reads a window of a series and predicts its next value.  Read
as they are, a series that trends or shifts level gives windows far from the
training ones; read relative to the window's own level they repeat.  Three
methods, each a per-window, per-channel map ``x -> (x - loc) / scale`` whose
inverse takes predictions back to the data's units:

- ``"none"``: ``loc = 0``, ``scale = 1``;
- ``"last"``: ``loc`` the window's last value, ``scale = 1`` (NLinear's
  normalization; the naive forecast is the prediction 0);
- ``"revin"``: ``loc`` and ``scale`` the window's mean and standard deviation
  (RevIN without its learned affine map); a channel constant over the window
  keeps ``scale = 1``.

Targets are mapped with the level of their channel.  The squared error of a
normalized prediction times ``scale**2`` is the squared error in the data's
units: :func:`error_weights` gives those factors, so that fits and scores
read in normalized units are about errors in the data's units.
"""

import numpy as np

__all__ = ["LEVELS", "error_weights", "levels_of", "normalize_targets", "normalize_windows",
           "restore_targets"]

#: The level normalizations, in the order a search tries them.
LEVELS = ("none", "last", "revin")


def levels_of(X, method):
    """``(loc, scale)`` of every window and channel, each of shape (n_samples, n_channels).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, n_channels)
        Complete windows (no padding), float64.
    method : {"none", "last", "revin"}

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._units import levels_of
    >>> X = np.array([[[1.0], [2.0], [3.0]]])
    >>> [a.tolist() for a in levels_of(X, "last")], [a.tolist() for a in levels_of(X, "revin")]
    ([[[3.0]], [[1.0]]], [[[2.0]], [[0.816496580927726]]])
    """
    n, _, c = X.shape
    if method == "none":
        return np.zeros((n, c)), np.ones((n, c))
    if method == "last":
        return X[:, -1, :].copy(), np.ones((n, c))
    if method == "revin":
        loc = X.mean(axis=1)
        scale = X.std(axis=1)
        # A window constant to rounding has no scale of its own.
        flat = scale <= 16 * np.finfo(np.float64).eps * np.maximum(np.abs(loc), np.abs(X).max(axis=1))
        return loc, np.where(flat, 1.0, scale)
    raise ValueError(f"level must be one of {LEVELS}; got {method!r}.")


def normalize_windows(X, loc, scale):
    """Windows in their own level: ``(X - loc) / scale`` per window and channel."""
    return (X - loc[:, None, :]) / scale[:, None, :]


def normalize_targets(y, loc, scale, channels):
    """Targets (n_samples, n_outputs) in the level of their channels ``channels``."""
    return (y - loc[:, channels]) / scale[:, channels]


def restore_targets(y, loc, scale, channels):
    """The inverse of :func:`normalize_targets`: predictions back in the data's units."""
    return y * scale[:, channels] + loc[:, channels]


def error_weights(scale, channels):
    """Per-window factors that make normalized squared errors those of the data's units.

    The mean of ``scale**2`` over the target channels (exact for one target).
    """
    return (scale[:, channels] ** 2).mean(axis=1)
