"""``data_format``: sequences stored as (n_samples, d, n_tokens), as aeon and sktime do.

Reproducer: aeon's and sktime's "numpy3D" arrays (n_samples, n_channels,
n_timepoints) fitted silently as d = n_timepoints.  With
``data_format="channels_first"`` they are read with tokens along axis 2, and
everything a user gets back (predictions, generated sequences, the witness
input) is in the same layout.
"""

import warnings

import numpy as np
import pytest

from sklearn_linattn import (
    AdamLinearAttentionRegressor,
    LinearAttentionFeatures,
    LinearAttentionRegressor,
    certify_identifiability,
    mhla_forward,
)
from sklearn_linattn._source import check_layout
from sklearn_linattn.exceptions import LayoutWarning


def _channels_first(X):
    return np.swapaxes(X, 1, 2).copy()


def _data(rng, n=80, n_tokens=6, d=3, d_out=None, readout="last", padded=True):
    X = rng.normal(size=(n, n_tokens, d))
    lengths = rng.integers(2, n_tokens + 1, size=n) if padded else np.full(n, n_tokens)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    V = rng.normal(size=(2, d_out or 1, d))
    Q = rng.normal(size=(2, d, d))
    y = mhla_forward(X, V, Q, readout=readout)
    if d_out is None:
        y = y[..., 0]
    return X, y, lengths


def test_the_aeon_layout_is_read_as_channels():
    """Reproducer: (n_samples, n_channels, n_timepoints) fitted as d = n_timepoints."""
    rng = np.random.default_rng(0)
    X, y, _ = _data(rng, n=120, n_tokens=40, d=3, padded=False)
    aeon = _channels_first(X)  # (120, 3, 40)
    with pytest.warns(LayoutWarning, match=r'data_format="channels_first"'):
        misread = LinearAttentionRegressor().fit(aeon[:5], y[:5])
    assert misread.n_features_in_ == 40  # what the default reads: d = 40 coordinates
    model = LinearAttentionRegressor(data_format="channels_first").fit(aeon, y)
    reference = LinearAttentionRegressor().fit(X, y)
    assert model.n_features_in_ == 3 and model.certificate_
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-10, atol=1e-12)
    X_new, y_new, _ = _data(np.random.default_rng(1), n=5, n_tokens=90, d=3)
    np.testing.assert_allclose(model.predict(_channels_first(X_new)),
                               reference.predict(X_new), rtol=1e-10)


@pytest.mark.parametrize("d_out", [None, 2])
def test_readout_all_targets_and_predictions_use_the_layout(d_out):
    rng = np.random.default_rng(2)
    X, y, lengths = _data(rng, d_out=d_out, readout="all")
    model = LinearAttentionRegressor(readout="all").fit(X, y)
    # Targets with an output axis are (n_samples, d_out, n_tokens) too.
    y_first = y if d_out is None else _channels_first(y)
    first = LinearAttentionRegressor(readout="all", data_format="channels_first")
    first.fit(_channels_first(X), y_first)
    np.testing.assert_allclose(first.coef_, model.coef_, rtol=1e-10, atol=1e-12)
    pred = first.predict(_channels_first(X))
    expected = model.predict(X)
    expected = expected if d_out is None else _channels_first(expected)
    np.testing.assert_allclose(pred, expected, rtol=1e-10, atol=1e-12)
    assert first.score(_channels_first(X), y_first) == pytest.approx(model.score(X, y))


def test_lists_and_flattened_rows_in_the_channels_first_layout():
    rng = np.random.default_rng(3)
    X, y, lengths = _data(rng)
    model = LinearAttentionRegressor().fit(X, y)
    seqs = [X[i, : lengths[i]].T for i in range(len(X))]  # (d, n_i) each
    first = LinearAttentionRegressor(data_format="channels_first").fit(seqs, y)
    np.testing.assert_allclose(first.coef_, model.coef_, rtol=1e-10, atol=1e-12)
    # 2-D rows holding d channels one after the other.
    Xf = rng.normal(size=(40, 5, 3))
    rows = _channels_first(Xf).reshape(40, -1)
    feats = LinearAttentionFeatures(token_dim=3, data_format="channels_first")
    np.testing.assert_allclose(feats.fit_transform(rows),
                               LinearAttentionFeatures().fit_transform(Xf))


def test_certificate_covers_and_witness_use_the_layout():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 5, 3))
    X[:, :, 2] = 0.0  # not identifiable: the third coordinate never varies
    cert = certify_identifiability(_channels_first(X), data_format="channels_first")
    reference = certify_identifiability(X)
    assert not cert and cert.rank == reference.rank
    assert cert.min_eigenvalue == pytest.approx(reference.min_eigenvalue, abs=reference.tol)
    X_new = rng.normal(size=(2, 7, 3))
    X_new[0, :, 2] = 0.0
    np.testing.assert_array_equal(cert.covers(_channels_first(X_new)), [True, False])
    w = cert.witness(random_state=0)
    assert w.input.shape[0] == 3  # (d, n_tokens)
    assert not cert.covers(w.input[None])[0]


def test_generate_and_adam_use_the_layout():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 4, 2))
    y = X[:, -1] * (X[:, :, :1] ** 2).sum(axis=1)  # d_out = d: can generate
    model = LinearAttentionRegressor(data_format="channels_first").fit(_channels_first(X), y)
    out = model.generate(_channels_first(X[:3]), 2)
    reference = LinearAttentionRegressor().fit(X, y).generate(X[:3], 2)
    assert out.shape == (3, 2, 6)
    np.testing.assert_allclose(out, _channels_first(reference), rtol=1e-9)
    adam = AdamLinearAttentionRegressor(n_heads=2, max_epochs=2, random_state=0,
                                        data_format="channels_first")
    adam.fit(_channels_first(X), y)
    assert adam.n_features_in_ == 2 and adam.predict(_channels_first(X)).shape == (60, 2)


@pytest.mark.parametrize("bad", ["channels_middle", None, 1])
def test_data_format_must_be_one_of_the_two(bad):
    X = np.ones((3, 2, 2))
    with pytest.raises(ValueError, match=r"data_format must be one of \('channels_last', "
                                         r"'channels_first'\)"):
        LinearAttentionRegressor(data_format=bad).fit(X, np.ones(3))
    with pytest.raises(ValueError, match=r"data_format must be one of"):
        certify_identifiability(X, data_format=bad)
    with pytest.raises(ValueError, match=r"data_format must be one of"):
        LinearAttentionFeatures(data_format=bad).fit(X)


def test_dask_input_uses_the_layout():
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(6)
    X, y, _ = _data(rng, n=90)
    model = LinearAttentionRegressor(data_format="channels_first").fit(
        da.from_array(_channels_first(X), chunks=30), da.from_array(y, chunks=30))
    reference = LinearAttentionRegressor().fit(X, y)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-9, atol=1e-12)


def test_sequence_scorer_reads_the_channels_first_layout():
    from sklearn_linattn.metrics import sequence_scorer

    rng = np.random.default_rng(7)
    X, y, _ = _data(rng, d_out=2, readout="all")
    model = LinearAttentionRegressor(readout="all", data_format="channels_first")
    model.fit(_channels_first(X), _channels_first(y))
    score = sequence_scorer("r2")(model, _channels_first(X), _channels_first(y))
    assert score == pytest.approx(model.score(_channels_first(X), _channels_first(y)))
    assert score == pytest.approx(1.0)


# --------------------------------------------------------------------------
# A forgotten layout is caught before the work
# --------------------------------------------------------------------------


def _no_work(*args, **kwargs):
    raise AssertionError("the work started before the layout was checked")


def test_a_forgotten_channels_first_layout_warns_before_the_work(monkeypatch):
    """Reproducer: BasicMotions' (40, 6, 100) ran 703 s and 6.3 GB into 840 heads, silently."""
    from sklearn_linattn._problem import StandardizedProblem

    # The pass over the data is not reached: the warning, raised as an error, ends the fit
    # first.
    monkeypatch.setattr(StandardizedProblem, "from_source", _no_work)
    rng = np.random.default_rng(8)
    X = rng.normal(size=(40, 6, 100))  # (n_samples, n_channels, n_timepoints)
    y = rng.normal(size=(40, 6, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        with pytest.raises(LayoutWarning) as info:
            LinearAttentionRegressor(readout="all").fit(X, y)
        message = str(info.value)
        for part in ('data_format="channels_first"', "(40, 6, 100)", "psi = d**2 (d + 1) / 2 = "
                     "505000", "GiB", "GFLOP/s", "then d = 6, psi = 126"):
            assert part in message, part
        with pytest.raises(LayoutWarning, match=r"\(40, 6, 100\)"):
            LinearAttentionRegressor().partial_fit(X, y[:, -1])
        with pytest.raises(LayoutWarning, match=r"the feature matrix needs"):
            LinearAttentionFeatures().fit(X)
    monkeypatch.undo()
    # certify_identifiability warns and goes on (here quickly: 40 rows, "dual").
    with pytest.warns(LayoutWarning, match=r"the least squares needs"):
        assert not certify_identifiability(X)


def test_the_layout_warning_points_at_the_callers_line():
    X = np.random.default_rng(9).normal(size=(6, 1, 12))
    with pytest.warns(LayoutWarning) as record:
        LinearAttentionFeatures().fit(X)
    assert record[0].filename == __file__


def test_dask_input_is_checked_too():
    da = pytest.importorskip("dask.array")
    X = da.from_array(np.random.default_rng(10).normal(size=(40, 6, 100)), chunks=20)
    y = da.from_array(np.ones(40), chunks=20)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        with pytest.raises(LayoutWarning, match=r"\(40, 6, 100\)"):
            LinearAttentionRegressor().fit(X, y)


@pytest.mark.parametrize("shape, kwargs", [
    ((40, 6, 100), {"readout": "all"}),          # BasicMotions
    ((300, 1, 8), {}),                            # univariate series: 1 channel
    ((20000, 6, 30), {"d_out": 1}),               # d = 5 n_tokens and 5 GiB of Gram matrix
])
def test_layouts_that_look_transposed(shape, kwargs):
    with pytest.warns(LayoutWarning):
        assert check_layout(shape, **kwargs)


@pytest.mark.parametrize("shape, kwargs", [
    ((150000, 16, 64), {}),                       # the scale page: 16 tokens of d = 64
    ((1200, 10, 41), {"d_out": 41}),              # the Turing machine example (one-hot)
    ((1280, 16, 44), {"d_out": 44}),              # the DFA executor example
    ((60000, 2, 12), {}),                         # wide, but a small fit
    ((2000, 6, 30), {"d_out": 1}),                # d = 5 n_tokens, but a fit of seconds
    ((40, 6, 100), {"data_format": "channels_first"}),  # the layout was given
    ((40, 6, 100), {"token_dim": 100}),
    ((40, 600), {}),                              # 2-D: univariate sequences
    ((float("nan"), 6, 100), {}),                 # unknown dask sizes
    ((40, 0, 3), {}),                             # no token: validation refuses it
])
def test_layouts_that_do_not_warn(shape, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not check_layout(shape, **kwargs)


def test_the_layout_warning_can_be_filtered_by_category():
    X = np.random.default_rng(11).normal(size=(30, 2, 24))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=LayoutWarning)
        assert LinearAttentionFeatures().fit(X).n_features_in_ == 24
    assert issubclass(LayoutWarning, UserWarning)


def test_one_token_windows_with_positions_do_not_warn():
    """Reproducer: one-token windows after sinusoidal positions (d = 10) warned of a transposed layout.

    Their 8 position channels are the same on every token (position 0), so only the 2 data
    channels vary: fewer than 8 per token, which stored series cannot be.
    """
    from sklearn.pipeline import make_pipeline

    from sklearn_linattn.preprocessing import PositionalEncoding

    rng = np.random.default_rng(12)
    X = rng.normal(size=(50, 1, 2))
    y = X[:, 0, 0] * X[:, 0, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutWarning)
        model = make_pipeline(PositionalEncoding(kind="sinusoidal"),
                              LinearAttentionRegressor()).fit(X, y)
    assert model[-1].n_features_in_ == 10
    # Stored series of one channel still warn: every coordinate varies.
    with pytest.warns(LayoutWarning, match=r"\(50, 1, 30\)"):
        LinearAttentionRegressor().fit(rng.normal(size=(50, 1, 30)), y)
