"""PositionalEncoding: positions appended to the tokens, against a loop reference."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.pipeline import make_pipeline

from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn.preprocessing import PositionalEncoding


def ref_encode(seqs, n_tokens, *, kind, origin, n_positions, max_period=10000.0):
    """Slow, obviously correct: each sequence, each token, each channel, in Python loops.

    ``seqs`` is a list of (n_i, d) lists of numbers; returns the padded
    (n_samples, n_tokens, d + n_positions) output, NaN at padded tokens.
    """
    out = []
    for seq in seqs:
        n = len(seq)
        rows = []
        for t in range(n_tokens):
            if t >= n:
                rows.append([math.nan] * (len(seq[0]) + n_positions))
                continue
            p = t if origin == "start" else n - 1 - t
            code = []
            for c in range(n_positions):
                if kind == "onehot":
                    code.append(1.0 if p == c else 0.0)
                else:  # Vaswani et al.: PE(p, 2i) = sin(p / T^(2i/n)), PE(p, 2i+1) = cos(...)
                    i = c // 2
                    angle = p / max_period ** (2 * i / n_positions)
                    code.append(math.sin(angle) if c % 2 == 0 else math.cos(angle))
            rows.append([float(v) for v in seq[t]] + code)
        out.append(rows)
    return np.array(out)


def _padded(rng, lengths, d, n_tokens=None, scale=1.0):
    n_tokens = max(lengths) if n_tokens is None else n_tokens
    X = scale * rng.normal(size=(len(lengths), n_tokens, d))
    X[np.arange(n_tokens)[None, :] >= np.asarray(lengths)[:, None]] = np.nan
    return X


def _unpadded(X, lengths):
    return [X[i, :n] for i, n in enumerate(lengths)]


@pytest.mark.parametrize("kind", ["onehot", "sinusoidal"])
@pytest.mark.parametrize("origin", ["start", "end"])
def test_matches_the_loop_reference(kind, origin):
    rng = np.random.default_rng(0)
    lengths = [4, 1, 3, 4, 2]
    X = _padded(rng, lengths, 3, n_tokens=6)  # two padded tokens after the longest
    enc = PositionalEncoding(kind, origin=origin, max_period=50.0).fit(X)
    n_positions = 4 if kind == "onehot" else 8
    assert enc.n_positions_ == n_positions and enc.n_features_in_ == 3
    expected = ref_encode([s.tolist() for s in _unpadded(X, lengths)], 6, kind=kind,
                          origin=origin, n_positions=n_positions, max_period=50.0)
    out = enc.transform(X)
    assert out.shape == (5, 6, 3 + n_positions) and out.dtype == np.float64
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-13)  # NaN where NaN


@settings(max_examples=25)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    extra=st.integers(0, 2),
    d=st.integers(1, 3),
    dtype=st.sampled_from(["float64", "float32", "float16", "int64"]),
    kind=st.sampled_from(["onehot", "sinusoidal"]),
    origin=st.sampled_from(["start", "end"]),
    n_positions=st.sampled_from([None, 2, 4, 6]),
    seed=st.integers(0, 2**16),
)
def test_property_reference_padding_lists_and_layouts(lengths, extra, d, dtype, kind, origin,
                                                        n_positions, seed):
    rng = np.random.default_rng(seed)
    n_tokens = max(lengths) + extra
    X = _padded(rng, lengths, d, n_tokens=n_tokens, scale=4.0)
    if dtype == "int64":
        # Integer values; integer arrays cannot pad, so only unpadded ones are int.
        X = np.round(X)
        seqs = [s.astype(np.int64) for s in _unpadded(X, lengths)]
        if not np.isnan(X).any():
            X = X.astype(np.int64)
    else:
        X = X.astype(dtype)
        seqs = _unpadded(X, lengths)
    enc = PositionalEncoding(kind, origin=origin, n_positions=n_positions,
                             handle_unknown="ignore", max_period=100.0)
    out = enc.fit(X).transform(X)
    n_pos = enc.n_positions_
    assert n_pos == (n_positions or (max(lengths) if kind == "onehot" else 8))
    out_dtype = np.dtype(np.float64 if dtype == "int64" else dtype)
    assert out.dtype == out_dtype and out.shape == (len(lengths), n_tokens, d + n_pos)
    expected = ref_encode([s.tolist() for s in seqs], n_tokens, kind=kind, origin=origin,
                          n_positions=n_pos, max_period=100.0)
    tol = {np.float16: 2e-3, np.float32: 1e-6}.get(out_dtype.type, 1e-13)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol, atol=tol)
    # The tokens are copied exactly; padding stays all-NaN (new channels too),
    # real tokens are finite.
    real = np.arange(n_tokens)[None, :] < np.asarray(lengths)[:, None]
    np.testing.assert_array_equal(out[..., :d][real], np.asarray(X, dtype=out_dtype)[real])
    assert np.isnan(out[~real]).all() and np.isfinite(out[real]).all()
    # A list of the unpadded sequences: the same, padded to the longest.
    from_list = clone(enc).fit(seqs).transform(seqs)
    np.testing.assert_array_equal(from_list, out[:, : max(lengths)])
    # channels_first input (array and list), channels_first output.
    first = clone(enc).set_params(data_format="channels_first")
    np.testing.assert_array_equal(first.fit(np.swapaxes(X, 1, 2)).transform(
        np.swapaxes(X, 1, 2)), np.swapaxes(out, 1, 2))
    np.testing.assert_array_equal(first.fit([s.T for s in seqs]).transform([s.T for s in seqs]),
                                  np.swapaxes(out[:, : max(lengths)], 1, 2))


def test_input_is_not_modified_and_fit_reads_lengths_only():
    rng = np.random.default_rng(1)
    X = _padded(rng, [3, 2], 2)
    before = X.copy()
    enc = PositionalEncoding().fit(X)
    out = enc.transform(X)
    np.testing.assert_array_equal(X, before)
    out[0, 0, 0] = 99.0
    np.testing.assert_array_equal(X, before)
    # Other values of the same lengths and d: the same fitted state.
    other = PositionalEncoding().fit(_padded(rng, [2, 3], 2, scale=1e6))
    assert (other.n_positions_, other.n_features_in_) == (enc.n_positions_, enc.n_features_in_)


def test_2d_input_is_univariate_sequences():
    X = np.arange(6.0).reshape(2, 3)
    out = PositionalEncoding().fit_transform(X)
    assert out.shape == (2, 3, 1 + 3)
    np.testing.assert_array_equal(out[..., 0], X)
    np.testing.assert_array_equal(out[1, :, 1:], np.eye(3))


def test_handle_unknown_error_names_the_sequence_and_n_positions():
    rng = np.random.default_rng(2)
    enc = PositionalEncoding().fit(_padded(rng, [3, 2], 2))
    longer = _padded(rng, [2, 5], 2)
    with pytest.raises(ValueError, match=r"X\[1\] has 5 real tokens, but one-hot positions "
                                         r"encode n_positions_=3 positions"):
        enc.transform(longer)
    # A given n_positions is checked in fit too (as OneHotEncoder's categories).
    with pytest.raises(ValueError, match=r"X\[1\] has 5 real tokens.*n_positions_=4"):
        PositionalEncoding(n_positions=4).fit(longer)
    # Shorter sequences and padding beyond n_positions_ are fine.
    assert enc.transform(_padded(rng, [1, 3], 2, n_tokens=7)).shape == (2, 7, 5)


@pytest.mark.parametrize("origin", ["start", "end"])
def test_handle_unknown_ignore_gives_zero_channels(origin):
    rng = np.random.default_rng(3)
    enc = PositionalEncoding(n_positions=2, origin=origin, handle_unknown="ignore")
    X = _padded(rng, [4, 1], 1)
    out = enc.fit(X).transform(X)
    codes = out[0, :, 1:]
    if origin == "start":  # positions 0, 1 known; 2, 3 zero
        np.testing.assert_array_equal(codes, [[1, 0], [0, 1], [0, 0], [0, 0]])
    else:  # the last two tokens are positions 1 and 0; the first two are older
        np.testing.assert_array_equal(codes, [[0, 0], [0, 0], [0, 1], [1, 0]])
    np.testing.assert_array_equal(out[1, 0, 1:], [1, 0])
    assert np.isnan(out[1, 1:]).all()


def test_sinusoidal_encodes_every_length():
    rng = np.random.default_rng(4)
    enc = PositionalEncoding("sinusoidal", n_positions=4).fit(_padded(rng, [2], 1))
    X = _padded(rng, [50], 1)
    out = enc.transform(X)  # handle_unknown="error" is about one-hot positions only
    np.testing.assert_allclose(out[0, 49, 1:], [math.sin(49), math.cos(49), math.sin(0.49),
                                                math.cos(0.49)], rtol=1e-12)


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({"kind": "learned"}, ValueError, r"kind must be one of \('onehot', 'sinusoidal'\); "
                                          r"got 'learned'"),
        ({"origin": "middle"}, ValueError, r"origin must be one of \('start', 'end'\)"),
        ({"handle_unknown": "warn"}, ValueError, r"handle_unknown must be one of"),
        ({"data_format": "nchw"}, ValueError, r"data_format must be one of"),
        ({"n_positions": 0}, ValueError, r"n_positions must be None or an integer >= 1; got 0"),
        ({"n_positions": 2.0}, TypeError, r"n_positions must be None or an integer >= 1"),
        ({"kind": "sinusoidal", "n_positions": 3}, ValueError,
         r"n_positions must be even for kind='sinusoidal'.*got 3"),
        ({"max_period": 0.0}, ValueError, r"max_period must be a real number > 0; got 0.0"),
        ({"max_period": "big"}, TypeError, r"max_period must be a real number > 0"),
    ],
)
def test_parameter_errors_name_the_parameter(params, error, message):
    with pytest.raises(error, match=message):
        PositionalEncoding(**params).fit(np.zeros((2, 3, 1)))


def test_transform_checks_the_token_dimension_and_fitting():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        PositionalEncoding().transform(np.zeros((1, 2, 2)))
    enc = PositionalEncoding().fit(np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match=r"X has tokens of dimension d=3, but d=2 was expected"):
        enc.transform(np.zeros((1, 2, 3)))


def test_feature_names():
    enc = PositionalEncoding().fit(np.zeros((1, 3, 2)))
    names = enc.get_feature_names_out()
    assert names.dtype == object
    assert names.tolist() == ["x0", "x1", "pos0", "pos1", "pos2"]
    assert enc.get_feature_names_out(["a", "b"]).tolist() == ["a", "b", "pos0", "pos1", "pos2"]
    assert len(names) == enc.transform(np.zeros((1, 3, 2))).shape[2]
    with pytest.raises(ValueError, match="input_features must name the 2 token coordinates; "
                                         "got 3 names"):
        enc.get_feature_names_out(["a", "b", "c"])
    sin = PositionalEncoding("sinusoidal", n_positions=2).fit(np.zeros((1, 3, 1)))
    assert sin.get_feature_names_out().tolist() == ["x0", "pos0", "pos1"]


def _previous_token(X):
    """The teacher y_t = x_(t-1) (0 at the first token), NaN at padding."""
    y = np.zeros_like(X)
    y[:, 1:] = X[:, :-1]
    y[np.isnan(X)] = np.nan
    return y


def test_pipeline_fits_and_predicts_with_padding():
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 5, size=30)
    X = _padded(rng, lengths, 2, n_tokens=4)
    y = _previous_token(X)[..., 0]
    pipe = make_pipeline(PositionalEncoding(), LinearAttentionRegressor(readout="all"))
    pred = pipe.fit(X, y).predict(X)
    assert pred.shape == (30, 4)
    np.testing.assert_array_equal(np.isnan(pred), np.isnan(y))


def test_previous_token_is_learned_exactly_out_of_distribution_only_with_positions():
    # With z_t = (x_t, e_t), one head represents y_t = x_(t-1): Q = the shift
    # e_(t-1) e_t^T in the position block, so z_s^T Q z_t = [s = t - 1], and
    # V = [I, 0] reads the token of that key (nothing at t = 0).  In the
    # cubic features it is sum_t' S[x_a, pos_(t'-1)] * last[pos_t'].  Without
    # positions the layer sees a bag and cannot represent it.
    rng = np.random.default_rng(6)
    n_tokens, d = 5, 2
    lengths = rng.integers(3, n_tokens + 1, size=150)  # every position seen often enough
    X = _padded(rng, lengths, d, n_tokens=n_tokens)
    y = _previous_token(X)
    enc = PositionalEncoding().fit(X)
    model = LinearAttentionRegressor(readout="all").fit(enc.transform(X), y)

    # New inputs, 10 times larger, of every length up to n_positions_.
    X_new = _padded(rng, list(range(1, n_tokens + 1)) * 3, d, scale=10.0)
    y_new = _previous_token(X_new)
    Z_new = enc.transform(X_new)
    np.testing.assert_allclose(model.predict(Z_new), y_new, rtol=0, atol=1e-8 * 10)
    # Every minimizer agrees there: the certificate covers the new inputs,
    # though its global verdict (about every input in R^(d + 5), including
    # position channels no encoding produces) cannot hold.
    assert model.certificate_.covers(Z_new).all()
    assert not model.certificate_
    assert model.certificate_.rank < model.certificate_.n_features

    # Without positions (a constant channel given for free), far off.
    def with_one(X):
        return np.concatenate([X, np.where(np.isnan(X[..., :1]), np.nan, 1.0)], axis=2)

    bag = LinearAttentionRegressor(readout="all").fit(with_one(X), y)
    real = ~np.isnan(y_new)
    error = bag.predict(with_one(X_new))[real] - y_new[real]
    assert np.sqrt(np.mean(error**2)) > 0.5 * np.sqrt(np.mean(y_new[real] ** 2))


def test_origin_end_aligns_variable_lengths_on_recency():
    # readout="last": the token before the last one, whatever the length.
    # Counted from the end it is always position 1 (the query is position 0):
    # one head, Q = e_1 e_0^T in the position block.
    rng = np.random.default_rng(7)
    lengths = rng.integers(2, 6, size=150)
    X = _padded(rng, lengths, 2)
    y = X[np.arange(150), lengths - 2]
    pipe = make_pipeline(PositionalEncoding(origin="end"), LinearAttentionRegressor())
    pipe.fit(X, y)
    new_lengths = np.array([2, 3, 4, 5, 5, 4])
    X_new = _padded(rng, new_lengths, 2, scale=10.0)
    y_new = X_new[np.arange(6), new_lengths - 2]
    np.testing.assert_allclose(pipe.predict(X_new), y_new, rtol=0, atol=1e-7)
    encoder, model = pipe[0], pipe[-1]
    assert model.certificate_.covers(encoder.transform(X_new)).all()


def test_an_output_beyond_the_memory_budget_is_refused_before_allocation(monkeypatch):
    from sklearn_linattn import _memory

    X = np.zeros((10, 20, 3), dtype=np.float32)
    enc = PositionalEncoding().fit(X)
    # 10 * 20 * 23 float32 values: 18 400 bytes, twice that while built.
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: 2 * 18_400)
    assert enc.transform(X).nbytes == 18_400
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: 2 * 18_400 - 1)
    with pytest.raises(ValueError, match=r"The encoded X, of shape \(10, 20, 23\), needs "
                                         r".* GiB of float32 .* more than the memory budget.*"
                                         r"Encode fewer sequences at a time or fewer positions"):
        enc.transform(X)


def test_changing_kind_or_n_positions_after_fit_asks_for_fit():
    X = np.zeros((2, 3, 1))
    enc = PositionalEncoding().fit(X)  # three one-hot positions
    enc.set_params(origin="end", handle_unknown="ignore").transform(X)  # read at transform
    with pytest.raises(ValueError, match=r"kind='sinusoidal' and n_positions=None were changed "
                                         r"since fit, which set n_positions_=3 for "
                                         r"kind='onehot'.*call fit again"):
        enc.set_params(kind="sinusoidal").transform(X)
    with pytest.raises(ValueError, match="call fit again"):
        enc.set_params(kind="onehot", n_positions=5).transform(X)
    assert enc.fit(X).transform(X).shape == (2, 3, 6)


@pytest.mark.parametrize("params", [{"n_positions": 7}, {"handle_unknown": "ignore"}])
def test_positions_never_seen_in_training_are_not_covered(params):
    # Encoded inputs up to the longest training length are covered; a sixth
    # position (encoded but never seen, or left without a code) is not.
    rng = np.random.default_rng(8)
    lengths = rng.integers(3, 6, size=150)
    X = _padded(rng, lengths, 2)
    enc = PositionalEncoding(**params).fit(X)
    model = LinearAttentionRegressor().fit(enc.transform(X), X[np.arange(150), lengths - 2, 0])
    X_new = _padded(rng, [5, 3, 6, 6], 2)
    np.testing.assert_array_equal(model.certificate_.covers(enc.transform(X_new)),
                                  [True, True, False, False])
