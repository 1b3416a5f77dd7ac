"""Layout messages about arrays the package wrote, and about arrays read in the other layout.

Reproducers:

* ``Patches(7, data_format="channels_first")`` on windows stored as (n, 12, 1)
  said "pass a smaller patch_size" (it read 12 channels of 1 time point) and
  nothing of the layout: following it gives a huge model.
* ``make_pipeline(Patches(12), PositionalEncoding(), LinearAttentionRegressor())``
  on windows of shape (n, 12, 1) warned LayoutWarning on Patches' own output
  (one token of d = 13), advising ``data_format="channels_first"``.
"""

import gc
import pickle
import re
import warnings
import weakref

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import make_pipeline

from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor
from sklearn_linattn.exceptions import LayoutWarning
from sklearn_linattn.preprocessing import Patches, PositionalEncoding


def _windows(n=60, n_timepoints=12, n_channels=1, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_timepoints, n_channels))  # (n_samples, n_timepoints, n_channels)
    return X, X[:, -1, 0] * X[:, -2, 0]


# --------------------------------------------------------------------------
# 1. Patches names the layout when the array read the other way has enough time points
# --------------------------------------------------------------------------


def test_channels_first_patches_of_channels_last_windows_name_the_layout():
    """Reproducer: 12 time points of 1 channel read as 12 channels of 1 time point."""
    X, _ = _windows(n=20)
    with pytest.raises(ValueError) as info:
        Patches(7, data_format="channels_first").fit_transform(X)
    message = str(info.value)
    for part in ("X[0] has 1 real time points, fewer than patch_size=7",
                 "(n_samples, n_channels, n_timepoints) = (20, 12, 1)",
                 'data_format="channels_first"',
                 "stored as (n_samples, n_timepoints, n_channels)",
                 'pass data_format="channels_last"'):
        assert part in message, part
    assert "Pass a smaller patch_size" not in message  # the advice that misled
    # transform names it too (fitted on 12 channels, then asked for longer patches).
    patches = Patches(1, data_format="channels_first").fit(X).set_params(patch_size=7)
    with pytest.raises(ValueError, match=r'pass data_format="channels_last"'):
        patches.transform(X)


def test_channels_last_patches_of_aeon_series_name_the_layout():
    """Symmetric: aeon's univariate (n, 1, T) read as 1 time point of T channels."""
    X = np.random.default_rng(1).normal(size=(20, 1, 40))
    with pytest.raises(ValueError) as info:
        Patches(8).fit(X)
    message = str(info.value)
    for part in ("(n_samples, n_timepoints, n_channels) = (20, 1, 40)",
                 'data_format="channels_last"',
                 "stored as (n_samples, n_channels, n_timepoints)",
                 'pass data_format="channels_first"'):
        assert part in message, part
    # Read as stored, the same array is cut into 5 patches of 8 time points.
    assert Patches(8, data_format="channels_first").fit_transform(X).shape == (20, 8, 5)


@pytest.mark.parametrize("shape, lengths, size", [
    ((4, 5, 2), None, 7),         # too short either way: 2 channels < patch_size
    ((4, 5, 12), [8 - 5, 5, 5, 5], 4),   # X[0] padded: the array is read in its layout
    ((4, 3, 12), [2, 3, 3, 3], 4),       # padded, and the other layout would be all NaN
])
def test_genuinely_short_series_keep_the_advice(shape, lengths, size):
    X = np.random.default_rng(2).normal(size=shape)
    if lengths is not None:
        X[np.arange(shape[1])[None, :] >= np.asarray(lengths)[:, None]] = np.nan
    with pytest.raises(ValueError) as info:
        Patches(size).fit(X)
    message = str(info.value)
    assert re.search(r"X\[0\] has \d+ real time points, fewer than patch_size=", message)
    assert "Pass a smaller patch_size, or incomplete='zeros'" in message
    assert "data_format" not in message


# --------------------------------------------------------------------------
# 2. No LayoutWarning on an array the package's transformers wrote
# --------------------------------------------------------------------------


@pytest.mark.parametrize("steps, n_channels", [
    (lambda: [Patches(12), PositionalEncoding()], 1),
    (lambda: [Patches(12)], 1),
    (lambda: [Patches(12, incomplete="zeros"), PositionalEncoding()], 1),
    (lambda: [Patches(6), PositionalEncoding("sinusoidal", n_positions=2)], 2),  # d = 14
])
def test_patches_output_does_not_warn_in_a_pipeline(steps, n_channels):
    """Reproducer: one token of d = 13 from Patches(12) warned of a transposed layout."""
    X, y = _windows(n_timepoints=12 if n_channels == 1 else 6, n_channels=n_channels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        model = make_pipeline(*steps(), LinearAttentionRegressor()).fit(X, y)
        model.predict(X)
        # Cloned, pickled: the same pipeline, the same silence.
        clone(model).fit(X, y)
        pickle.loads(pickle.dumps(model)).fit(X, y)


def test_a_raw_array_of_the_same_shape_still_warns():
    X, y = _windows()
    out = make_pipeline(Patches(12), PositionalEncoding()).fit_transform(X)  # (60, 1, 13)
    assert out.shape == (60, 1, 13)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        LinearAttentionRegressor().fit(out, y)
    # A copy, or a pickled round trip, is the user's array: judged as any other (12 varying
    # coordinates for one token; the position code is constant).
    with pytest.warns(LayoutWarning, match=r"\(60, 1, 13\)"):
        LinearAttentionRegressor().fit(out.copy(), y)
    with pytest.warns(LayoutWarning, match=r"\(60, 1, 13\)"):
        LinearAttentionRegressor().fit(pickle.loads(pickle.dumps(out)), y)


def test_a_raw_univariate_aeon_array_still_warns():
    """aeon's univariate (n, 1, T), large T, passed without data_format: warned as before."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 1, 40))
    y = rng.normal(size=50)
    with pytest.warns(LayoutWarning, match=r'\(50, 1, 40\).*data_format="channels_first"'):
        LinearAttentionRegressor().fit(X, y)
    with pytest.warns(LayoutWarning, match=r"\(50, 1, 40\)"):
        LinearAttentionFeatures().fit(X)


def test_transformers_pass_on_a_raw_arrays_layout_warning():
    """The package vouches only for the layout it chose: a transposed input still warns.

    PositionalEncoding keeps its input's layout, so its output of a raw array is judged; so
    is Patches' output of an input that looks transposed (aeon's (n, 1, T) read as 1 time
    point of T channels, kept whole by incomplete='zeros').
    """
    rng = np.random.default_rng(4)
    X = rng.normal(size=(50, 1, 40))
    y = rng.normal(size=50)
    with pytest.warns(LayoutWarning, match=r"\(50, 1, 41\)"):
        make_pipeline(PositionalEncoding(), LinearAttentionRegressor()).fit(X, y)
    with pytest.warns(LayoutWarning, match=r"\(50, 1, 80\)"):
        make_pipeline(Patches(2, incomplete="zeros"), LinearAttentionRegressor()).fit(X, y)


def test_the_mark_does_not_keep_arrays_alive():
    X, _ = _windows()
    out = Patches(12).fit_transform(X)
    ref = weakref.ref(out)
    del out
    gc.collect()
    assert ref() is None


def test_append_constant_features_and_certificate_do_not_warn_on_patches_output():
    import warnings

    from sklearn_linattn import LinearAttentionFeatures, certify_identifiability
    from sklearn_linattn.exceptions import LayoutWarning
    from sklearn_linattn.preprocessing import AppendConstant, Patches

    X = np.random.default_rng(0).normal(size=(60, 12, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        tokens = Patches(12).fit_transform(X)
        LinearAttentionFeatures().fit(tokens)
        certify_identifiability(tokens)
        LinearAttentionRegressor().fit(AppendConstant().fit_transform(tokens), X[:, -1, 0])
