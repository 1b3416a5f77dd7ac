"""Patches: long series cut into patch tokens, against a loop reference."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn.preprocessing import Patches, PositionalEncoding


def ref_patches(seqs, *, patch_size, stride=None, align="end", incomplete="drop"):
    """Slow, obviously correct: each sequence, each patch, each value, in Python loops.

    ``seqs`` is a list of (n_i, c) lists of numbers; returns the padded
    (n_samples, n_patches_max, patch_size * c) output, NaN at padded tokens.
    A sequence without a patch raises ValueError.
    """
    stride = patch_size if stride is None else stride
    all_tokens = []
    for seq in seqs:
        n, c = len(seq), len(seq[0])

        def patch(t0):
            token = []
            for k in range(patch_size):
                for j in range(c):
                    t = t0 + k
                    token.append(float(seq[t][j]) if 0 <= t < n else 0.0)
            return token

        tokens = []
        if align == "start":
            t0 = 0
            while t0 + patch_size <= n:
                tokens.append(patch(t0))
                t0 += stride
            if incomplete == "zeros" and t0 < n:  # the incomplete patch holds a real point
                tokens.append(patch(t0))
        else:
            end = n  # one past the patch's last time point
            while end - patch_size >= 0:
                tokens.insert(0, patch(end - patch_size))
                end -= stride
            if incomplete == "zeros" and end > 0:
                tokens.insert(0, patch(end - patch_size))
        if not tokens:
            raise ValueError("no patch")
        all_tokens.append(tokens)
    n_patches = max(len(tokens) for tokens in all_tokens)
    width = len(all_tokens[0][0])
    return np.array([tokens + [[math.nan] * width] * (n_patches - len(tokens))
                     for tokens in all_tokens])


def _padded(rng, lengths, c, n_timepoints=None, scale=1.0):
    n_timepoints = max(lengths) if n_timepoints is None else n_timepoints
    X = scale * rng.normal(size=(len(lengths), n_timepoints, c))
    X[np.arange(n_timepoints)[None, :] >= np.asarray(lengths)[:, None]] = np.nan
    return X


def _unpadded(X, lengths):
    return [X[i, :n] for i, n in enumerate(lengths)]


def test_the_reference_on_a_hand_example():
    # The reference itself, on values one can check by eye: 7 time points
    # of 2 channels, x[t] = (10 t, 10 t + 1).
    seq = [[10 * t, 10 * t + 1] for t in range(7)]
    np.testing.assert_array_equal(
        ref_patches([seq], patch_size=3),
        [[[10, 11, 20, 21, 30, 31], [40, 41, 50, 51, 60, 61]]])
    np.testing.assert_array_equal(
        ref_patches([seq], patch_size=3, align="start", incomplete="zeros"),
        [[[0, 1, 10, 11, 20, 21], [30, 31, 40, 41, 50, 51], [60, 61, 0, 0, 0, 0]]])
    np.testing.assert_array_equal(
        ref_patches([seq], patch_size=3, incomplete="zeros"),
        [[[0, 0, 0, 0, 0, 1], [10, 11, 20, 21, 30, 31], [40, 41, 50, 51, 60, 61]]])
    np.testing.assert_array_equal(
        ref_patches([seq[:4]], patch_size=2, stride=1, align="start"),
        [[[0, 1, 10, 11], [10, 11, 20, 21], [20, 21, 30, 31]]])


@pytest.mark.parametrize("align", ["end", "start"])
@pytest.mark.parametrize("incomplete", ["drop", "zeros"])
@pytest.mark.parametrize("stride", [None, 1, 2, 5])
@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_matches_the_loop_reference(align, incomplete, stride, data_format):
    rng = np.random.default_rng(0)
    lengths = [11, 4, 9, 3, 12, 7]
    X = _padded(rng, lengths, 2, n_timepoints=14)  # two padded time points after the longest
    expected = ref_patches([s.tolist() for s in _unpadded(X, lengths)], patch_size=3,
                           stride=stride, align=align, incomplete=incomplete)
    X_in = np.swapaxes(X, 1, 2) if data_format == "channels_first" else X
    patches = Patches(3, stride=stride, align=align, incomplete=incomplete,
                      data_format=data_format).fit(X_in)
    assert patches.n_features_in_ == 2
    out = patches.transform(X_in)
    if data_format == "channels_first":  # the output in the input's layout
        expected = np.swapaxes(expected, 1, 2)
    assert out.dtype == np.float64 and out.shape == expected.shape
    assert out.shape[1 if data_format == "channels_first" else 2] == 6
    np.testing.assert_array_equal(out, expected)  # NaN where NaN
    # A list of the unpadded series gives the same.
    seqs = [s.T if data_format == "channels_first" else s for s in _unpadded(X, lengths)]
    np.testing.assert_array_equal(clone(patches).fit(seqs).transform(seqs), expected)


def test_align_end_ends_every_series_at_its_last_observation():
    rng = np.random.default_rng(1)
    lengths = np.array([5, 9, 13, 6])
    X = _padded(rng, lengths, 1)
    for incomplete in ("drop", "zeros"):
        out = Patches(4, stride=3, incomplete=incomplete).fit_transform(X)
        n_patches = (~np.isnan(out[..., 0])).sum(axis=1)
        last = out[np.arange(4), n_patches - 1]  # each series' last token
        np.testing.assert_array_equal(last[:, -1], X[np.arange(4), lengths - 1, 0])
        np.testing.assert_array_equal(last, [X[i, n - 4:n, 0] for i, n in enumerate(lengths)])


@st.composite
def _cases(draw):
    n = draw(st.integers(1, 5))
    c = draw(st.integers(1, 3))
    patch_size = draw(st.integers(1, 6))
    stride = draw(st.one_of(st.none(), st.integers(1, 8)))
    lengths = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    extra = draw(st.integers(0, 3))
    return dict(c=c, patch_size=patch_size, stride=stride, lengths=lengths, extra=extra,
                align=draw(st.sampled_from(["end", "start"])),
                incomplete=draw(st.sampled_from(["drop", "zeros"])),
                data_format=draw(st.sampled_from(["channels_last", "channels_first"])),
                dtype=draw(st.sampled_from(["float64", "float32", "float16"])),
                seed=draw(st.integers(0, 2**16)))


@given(case=_cases())
def test_property_matches_the_loop_reference(case):
    rng = np.random.default_rng(case["seed"])
    lengths = case["lengths"]
    X = _padded(rng, lengths, case["c"], n_timepoints=max(lengths) + case["extra"],
                scale=3.0).astype(case["dtype"])
    seqs = _unpadded(X, lengths)
    params = {k: case[k] for k in ("patch_size", "stride", "align", "incomplete")}
    first = case["data_format"] == "channels_first"
    X_in = np.swapaxes(X, 1, 2) if first else X
    patches = Patches(**params, data_format=case["data_format"])
    if params["incomplete"] == "drop" and min(lengths) < params["patch_size"]:
        i = int(np.argmax(np.asarray(lengths) < params["patch_size"]))
        message = (rf"X\[{i}\] has {lengths[i]} real time points, fewer than "
                   rf"patch_size={params['patch_size']}")
        with pytest.raises(ValueError, match=message):
            patches.fit(X_in)
        with pytest.raises(ValueError, match=message):
            Patches(1, data_format=case["data_format"]).fit(X_in).set_params(
                **params).transform(X_in)
        return
    expected = ref_patches([s.tolist() for s in seqs], **params)
    out = patches.fit(X_in).transform(X_in)
    if first:  # the output in the input's layout; checked below in the package's
        out = np.swapaxes(out, 1, 2)
    assert out.dtype == np.dtype(case["dtype"])
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out.astype(np.float64), expected)
    # Padding is whole trailing tokens, the package's rule; real tokens are finite.
    real = ~np.isnan(out).all(axis=2)
    assert np.isfinite(out[real]).all()
    assert (np.diff(real.astype(int), axis=1) <= 0).all()
    assert out.shape[1] == real.sum(axis=1).max()
    # Every real time point is in a token with incomplete="zeros", strides <= patch_size.
    stride = params["stride"] or params["patch_size"]
    if params["incomplete"] == "zeros" and stride <= params["patch_size"]:
        for i, n in enumerate(lengths):
            for t in range(n):
                assert any(np.array_equal(out[i, m].reshape(params["patch_size"], -1)[k],
                                          X[i, t])
                           for m in range(out.shape[1]) for k in range(params["patch_size"]))
    # The list of the unpadded series.
    listed = [s.T for s in seqs] if first else seqs
    from_list = clone(patches).fit(listed).transform(listed)
    np.testing.assert_array_equal(np.swapaxes(from_list, 1, 2) if first else from_list, out)


def test_input_is_not_modified_and_output_is_a_new_array():
    rng = np.random.default_rng(2)
    X = _padded(rng, [7, 5], 2)
    before = X.copy()
    out = Patches(2, incomplete="zeros").fit(X).transform(X)
    np.testing.assert_array_equal(X, before)
    out[0, 0, 0] = 99.0
    np.testing.assert_array_equal(X, before)
    assert not np.shares_memory(out, X)


def test_2d_input_is_univariate_series():
    X = np.arange(12.0).reshape(2, 6)
    out = Patches(3).fit_transform(X)
    np.testing.assert_array_equal(out, [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]])


def test_feature_names_follow_the_token_layout():
    # x[t, j] = 100 t + j: each output value says where it comes from.
    X = (100.0 * np.arange(6)[:, None] + np.arange(3))[None]  # 6 time points, 3 channels
    patches = Patches(2).fit(X)
    names = patches.get_feature_names_out()
    assert names.dtype == object
    assert names.tolist() == ["t0_x0", "t0_x1", "t0_x2", "t1_x0", "t1_x1", "t1_x2"]
    out = patches.transform(X)
    for m in range(3):
        for col, name in enumerate(names):
            k, j = int(name[1]), int(name[4])
            assert out[0, m, col] == 100 * (2 * m + k) + j
    assert patches.get_feature_names_out(["a", "b", "c"]).tolist() == [
        "t0_a", "t0_b", "t0_c", "t1_a", "t1_b", "t1_c"]
    with pytest.raises(ValueError, match="input_features must name the 3 channels; got 2 names"):
        patches.get_feature_names_out(["a", "b"])
    # The names follow the current patch_size, as transform does.
    assert len(patches.set_params(patch_size=3).get_feature_names_out()) == 9


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"patch_size": 0}, ValueError, r"patch_size must be an integer >= 1; got 0\."),
        ({"patch_size": -2}, ValueError, r"patch_size must be an integer >= 1; got -2\."),
        ({"patch_size": 2.0}, TypeError,
         r"patch_size must be an integer >= 1; got 2\.0 of type float"),
        ({"patch_size": True}, TypeError,
         r"patch_size must be an integer >= 1; got True of type bool"),
        ({"patch_size": None}, TypeError, r"patch_size must be an integer >= 1; got None"),
        ({"stride": 0}, ValueError, r"stride must be None or an integer >= 1; got 0\."),
        ({"stride": 1.5}, TypeError, r"stride must be None or an integer >= 1; got 1\.5"),
        ({"stride": False}, TypeError, r"stride must be None or an integer >= 1; got False"),
        ({"align": "middle"}, ValueError,
         r"align must be one of \('end', 'start'\); got 'middle'"),
        ({"incomplete": "pad"}, ValueError,
         r"incomplete must be one of \('drop', 'zeros'\); got 'pad'"),
        ({"data_format": "nct"}, ValueError, r"data_format must be one of"),
    ],
)
def test_parameter_errors_name_the_parameter(params, error, message):
    X = np.zeros((2, 8, 1))
    with pytest.raises(error, match=message):
        Patches(**params).fit(X)
    # Checked in transform too: set_params after fit is not trusted.
    fitted = Patches(2).fit(X).set_params(**params)
    with pytest.raises(error, match=message):
        fitted.transform(X)


def test_numpy_integers_and_strides_larger_than_the_patch_are_valid():
    X = np.arange(11.0).reshape(1, 11, 1)
    out = Patches(np.int64(2), stride=np.int32(4), align="start").fit_transform(X)
    np.testing.assert_array_equal(out[0], [[0, 1], [4, 5], [8, 9]])  # 2, 3, 6, 7, 10 skipped
    out = Patches(2, stride=4).fit_transform(X)  # from the end: 0, 3, 4, 7, 8 skipped
    np.testing.assert_array_equal(out[0], [[1, 2], [5, 6], [9, 10]])
    # incomplete="zeros" adds a patch only when it holds a real time point
    # (10 is between patches, 8 starts an incomplete one).
    zeros = Patches(2, stride=4, align="start", incomplete="zeros")
    np.testing.assert_array_equal(zeros.fit_transform(X), Patches(2, stride=4, align="start")
                                  .fit_transform(X))
    np.testing.assert_array_equal(zeros.fit_transform(X[:, :9])[0], [[0, 1], [4, 5], [8, 0]])


def test_a_series_shorter_than_the_patch_is_an_error_with_drop():
    rng = np.random.default_rng(3)
    X = _padded(rng, [8, 5, 3, 2], 2)
    with pytest.raises(ValueError, match=r"X\[2\] has 3 real time points, fewer than "
                                         r"patch_size=4: incomplete='drop' cuts no patch.*"
                                         r"incomplete='zeros'"):
        Patches(4).fit(X)
    patches = Patches(4).fit(X[:2])
    with pytest.raises(ValueError, match=r"X\[1\] has 2 real time points, fewer than "
                                         r"patch_size=4"):
        patches.transform(X[[0, 3]])
    # With zeros each short series is one token, zeros first (cut from the end).
    out = Patches(4, incomplete="zeros").fit_transform(X)
    assert out.shape == (4, 2, 8)
    np.testing.assert_array_equal(out[3, 0], np.concatenate([np.zeros(4), X[3, :2].ravel()]))
    assert np.isnan(out[3, 1]).all()


def test_nan_inside_a_series_is_an_error_as_for_positional_encoding():
    X = np.ones((2, 6, 2))
    X[1, 2, 0] = np.nan  # partly NaN
    with pytest.raises(ValueError, match=r"X\[1, 2\] is partly NaN"):
        Patches(2).fit(X)
    X[1, 2] = np.nan  # a hole: padding followed by real time points
    with pytest.raises(ValueError, match=r"X\[1, 2\] is an all-NaN token followed by real"):
        Patches(2).fit(X)
    with pytest.raises(ValueError, match=r"X\[1, 2\]"):
        PositionalEncoding().fit(X)


def test_transform_checks_the_channels_and_fitting():
    with pytest.raises(NotFittedError):
        Patches(2).transform(np.zeros((1, 4, 2)))
    patches = Patches(2).fit(np.zeros((1, 4, 2)))
    with pytest.raises(ValueError, match=r"X has tokens of dimension d=3, but d=2 was expected"):
        patches.transform(np.zeros((1, 4, 3)))
    channels_first = Patches(2, data_format="channels_first").fit(np.zeros((1, 2, 4)))
    assert channels_first.n_features_in_ == 2
    with pytest.raises(ValueError, match=r"d=4, but d=2 was expected"):
        channels_first.transform(np.zeros((1, 4, 2)))  # a channels_last array by mistake


def test_an_output_beyond_the_memory_budget_is_refused_before_allocation(monkeypatch):
    from sklearn_linattn import _memory

    X = np.zeros((10, 20, 3), dtype=np.float32)
    patches = Patches(4).fit(X)
    # (10, 5, 12) float32 values, 2 400 bytes, and 10 bytes per time point of
    # a patch while it is built: 2 000.
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: 4_400)
    assert patches.transform(X).nbytes == 2_400
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: 4_399)
    with pytest.raises(ValueError, match=r"The patched X, of shape \(10, 5, 12\), needs .* GiB "
                                         r"of float32 .* more than the memory budget.*"
                                         r"Patch fewer sequences at a time"):
        patches.transform(X)


def _last_values_target(X, lengths):
    """y = x[L-1] x[L-5] + 2 x[L-2] - x[L-7]: the last two patches of 4, from the end."""
    idx = np.arange(len(X))
    return (X[idx, lengths - 1, 0] * X[idx, lengths - 5, 0] + 2 * X[idx, lengths - 2, 0]
            - X[idx, lengths - 7, 0])


def test_pipeline_with_positions_predicts_longer_series_exactly():
    # Positions counted from the end: the last patch is position 0, whatever
    # the length; patches beyond the positions seen get zero position
    # channels (handle_unknown="ignore") and the target never reads them.
    rng = np.random.default_rng(4)
    lengths = rng.integers(12, 21, size=600)  # 3 to 5 patches, first points dropped
    X = _padded(rng, lengths, 1)
    y = _last_values_target(X, lengths)
    pipe = make_pipeline(Patches(4), PositionalEncoding(origin="end", handle_unknown="ignore"),
                         LinearAttentionRegressor()).fit(X, y)
    assert pipe[1].n_positions_ == 5 and pipe[-1].n_features_in_ == 4 + 5
    new_lengths = np.array([41, 40, 30, 57, 13, 20])
    X_new = _padded(rng, new_lengths, 1, scale=3.0)
    y_new = _last_values_target(X_new, new_lengths)
    np.testing.assert_allclose(pipe.predict(X_new), y_new, rtol=1e-7, atol=1e-7)
    # Cut from the start instead, the last patch moves with the length: not learned.
    start = clone(pipe).set_params(patches__align="start").fit(X, y)
    assert not np.allclose(start.predict(X_new), y_new, rtol=1e-2, atol=1e-2)


def test_grid_search_over_the_patch_size():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(450, 12, 1))
    lengths = np.full(450, 12)
    y = _last_values_target(X, lengths)
    pipe = make_pipeline(Patches(3), PositionalEncoding(origin="end"),
                         LinearAttentionRegressor())
    search = GridSearchCV(pipe, {"patches__patch_size": [2, 4]}, cv=3).fit(X, y)
    assert search.cv_results_["param_patches__patch_size"].tolist() == [2, 4]
    scores = search.cv_results_["mean_test_score"]
    assert np.isfinite(scores).all() and scores.max() > 1 - 1e-8
    assert search.best_params_["patches__patch_size"] in (2, 4)
    assert search.best_estimator_[0].patch_size == search.best_params_["patches__patch_size"]
    X_new = rng.normal(size=(4, 12, 1))
    np.testing.assert_allclose(search.predict(X_new), _last_values_target(X_new, lengths[:4]),
                               rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("params", [
    {"patch_size": 3},
    {"patch_size": 3, "stride": 2},
    {"patch_size": 3, "incomplete": "zeros"},
    # (Not all choices leave data that identifies the model: cut from the
    # start, incomplete="zeros" puts zeros at the end of the last token;
    # overlapping patches whose first one starts with zeros make the
    # features dependent.)
])
def test_exact_recovery_of_an_attention_on_patch_tokens(params):
    # y from a known 2-head MHLA on the patch tokens (d = 3 * 2 = 6, psi =
    # 126): noiseless, the fit is that function, on longer series too.
    rng = np.random.default_rng(6)
    d, d_out = 6, 2
    V = rng.normal(size=(2, d_out, d)) / np.sqrt(d)
    Q = rng.normal(size=(2, d, d)) / np.sqrt(d)
    lengths = rng.integers(7, 16, size=400)
    X = _padded(rng, lengths, 2)
    patches = Patches(**params).fit(X)
    y = mhla_forward(patches.transform(X), V, Q)
    pipe = make_pipeline(Patches(**params), LinearAttentionRegressor()).fit(X, y)
    assert pipe[-1].certificate_
    new_lengths = rng.integers(30, 50, size=20)
    X_new = _padded(rng, new_lengths, 2)
    y_new = mhla_forward(patches.transform(X_new), V, Q)
    np.testing.assert_allclose(pipe.predict(X_new), y_new, rtol=1e-8,
                               atol=1e-8 * np.abs(y_new).max())
    # Other patches of the same series are another function of them.
    other = Patches(**{**params, "align": "start" if params.get("align") != "start" else "end"})
    assert not np.allclose(mhla_forward(other.fit_transform(X_new), V, Q), y_new)
