"""Input validation: every malformed input is refused with a message that names
the argument, what was expected and what was given; valid inputs in every
accepted form are read the same way and never modified.

Each malformed input is tried on check_sequences / check_targets directly and
through the public estimators (fit, and predict / transform / score after a
valid fit).
"""

import re

import numpy as np
import pytest

from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor
from sklearn_linattn._validation import check_sample_weight, check_sequences, check_targets

RNG = np.random.default_rng(0)
D = 2
X_GOOD = RNG.normal(size=(12, 4, D))  # 12 full-length sequences of 4 tokens
Y_GOOD = RNG.normal(size=12)


def fitted_regressor(readout="last", **params):
    y = Y_GOOD if readout == "last" else RNG.normal(size=X_GOOD.shape[:2])
    return LinearAttentionRegressor(readout=readout, **params).fit(X_GOOD, y)


def fitted_features(**params):
    return LinearAttentionFeatures(**params).fit(X_GOOD)


def n_samples_of(X):
    try:
        return len(X)
    except TypeError:
        return 1


def padded_batch():
    """5 sequences of 4 tokens; X[1] has 2 real tokens then 2 padding tokens."""
    X = np.random.default_rng(1).normal(size=(5, 4, D))
    X[1, 2:] = np.nan
    return X


# --------------------------------------------------------------------------
# Malformed X
# --------------------------------------------------------------------------


def _with(fn):
    X = X_GOOD[:5].copy()
    fn(X)
    return X


def _set(index, value):
    def fn(X):
        X[index] = value

    return fn


BAD_X = [
    # id, X, exception, regex on the message
    ("nan-hole", _with(_set((0, 1), np.nan)), ValueError,
     r"X\[0, 1\] is an all-NaN token followed by real tokens: NaN padding may only "
     r"appear at the end"),
    ("partly-nan-token", _with(_set((0, 3, 0), np.nan)), ValueError,
     r"X\[0, 3\] is partly NaN: a token is either real \(no NaN\) or padding "
     r"\(all NaN\), got array\(\[\s*nan,"),
    ("partly-nan-inside", _with(_set((2, 1, 1), np.nan)), ValueError,
     r"X\[2, 1\] is partly NaN"),
    ("inf", _with(_set((3, 2, 1), np.inf)), ValueError, r"Input X contains infinity"),
    ("minus-inf", _with(_set((0, 0, 0), -np.inf)), ValueError,
     r"Input X contains infinity"),
    ("all-nan-sequence", _with(_set(1, np.nan)), ValueError,
     r"X\[1\] is an empty sequence \(every token is NaN padding\)"),
    ("zero-samples", np.zeros((0, 4, D)), ValueError,
     r"X must hold at least one sequence: found array with 0 sample\(s\) "
     r"\(shape=\(0, 4, 2\)\)"),
    ("empty-list", [], ValueError,
     r"X must hold at least one sequence; got an empty list"),
    ("zero-tokens", np.zeros((3, 0, D)), ValueError,
     r"X must have at least one token and a token dimension d >= 1; got shape "
     r"\(3, 0, 2\)"),
    ("zero-token-dim", np.zeros((3, 4, 0)), ValueError,
     r"X must have at least one token and a token dimension d >= 1; got shape "
     r"\(3, 4, 0\)"),
    ("2d-zero-columns", np.zeros((3, 0)), ValueError,
     r"X must have at least one column: found array with 0 feature\(s\) "
     r"\(shape=\(3, 0\)\)"),
    ("list-empty-sequence", [np.ones((2, D)), np.ones((0, D))], ValueError,
     r"X\[1\] is an empty sequence: each sequence needs at least one token; got "
     r"shape \(0, 2\)"),
    ("list-mismatched-d", [np.ones((3, D)), np.ones((2, D)), np.ones((2, 3))], ValueError,
     r"every sequence in X must have the same token dimension d; X\[0\] has d=2 "
     r"but X\[2\] has d=3"),
    ("list-1d-item", [np.ones((3, D)), np.ones(3)], ValueError,
     r"X\[1\] must be a 2-D array of shape \(n_tokens, d\) when X is a list of "
     r"sequences; got 1-D shape \(3,\)"),
    ("list-3d-item", [np.ones((3, D)), np.ones((1, 3, D))], ValueError,
     r"X\[1\] must be a 2-D array .*got 3-D shape \(1, 3, 2\)"),
    ("list-nan-hole", [np.ones((3, D)), np.array([[1.0, 2.0], [np.nan, np.nan], [3, 4]])],
     ValueError, r"X\[1, 1\] is an all-NaN token followed by real tokens"),
    ("list-inf", [np.ones((3, D)), np.array([[1.0, np.inf]])], ValueError,
     r"Input X contains infinity"),
    ("complex", X_GOOD[:5] + 1j, ValueError,
     r"X must hold real numbers; got complex values \(an array of shape \(5, 4, 2\) "
     r"and dtype complex128\)"),
    ("list-complex-item", [np.ones((2, D)), np.ones((2, D)) * 1j], ValueError,
     r"X\[1\] must hold real numbers; got complex values"),
    ("object", np.array([[[1.0, {"a": 1}]]], dtype=object), TypeError,
     r"X is an object array whose entries are not all numbers \(.*; shape \(1, 1, 2\)\)"),
    ("strings", np.full((2, 3, D), "1.0"), TypeError,
     r"X must hold real numbers \(a numeric dtype\); got an array of shape "
     r"\(2, 3, 2\) and dtype <U3"),
    ("list-strings-item", [np.ones((2, D)), np.array([["a", "b"]])], TypeError,
     r"X\[1\] must hold real numbers \(a numeric dtype\); got an array of shape "
     r"\(1, 2\) and dtype <U1"),
    ("4d", np.ones((2, 3, D, 1)), ValueError,
     r"X must be a 3-D array of shape \(n_samples, n_tokens, d\), a 2-D array .*; got "
     r"a 4-D array of shape \(2, 3, 2, 1\)"),
    ("1d", np.ones(3), ValueError,
     r"X must be a 3-D array .*; got a 1-D array of shape \(3,\)"),
    ("0d", 3.0, ValueError, r"X must be a 3-D array .*; got a 0-D array of shape \(\)"),
    ("none", None, TypeError, r"X must be an array-like of sequences .*; got None"),
]
BAD_X_IDS = [case[0] for case in BAD_X]


@pytest.mark.parametrize("_, X, error, match", BAD_X, ids=BAD_X_IDS)
def test_check_sequences_rejects(_, X, error, match):
    with pytest.raises(error, match=match):
        check_sequences(X)


@pytest.mark.parametrize("_, X, error, match", BAD_X, ids=BAD_X_IDS)
def test_fit_rejects_malformed_X(_, X, error, match):
    y = np.zeros(n_samples_of(X))
    with pytest.raises(error, match=match):
        LinearAttentionRegressor().fit(X, y)
    with pytest.raises(error, match=match):
        LinearAttentionFeatures().fit(X)


@pytest.mark.parametrize("_, X, error, match", BAD_X, ids=BAD_X_IDS)
def test_predict_transform_score_reject_malformed_X(_, X, error, match):
    model = fitted_regressor()
    with pytest.raises(error, match=match):
        model.predict(X)
    with pytest.raises(error, match=match):
        model.score(X, np.zeros(n_samples_of(X)))
    with pytest.raises(error, match=match):
        fitted_features().transform(X)
    with pytest.raises(error, match=match):
        fitted_regressor(readout="all").predict(X)


WRONG_D = [
    ("3d", RNG.normal(size=(3, 4, 3)), 3),
    ("list", [RNG.normal(size=(2, 3)), RNG.normal(size=(4, 3))], 3),
    ("2d-univariate", RNG.normal(size=(3, 5)), 1),
]


@pytest.mark.parametrize("_, X, d", WRONG_D, ids=[c[0] for c in WRONG_D])
def test_wrong_token_dimension_at_predict_time(_, X, d):
    match = rf"X has tokens of dimension d={d}, but d=2 was expected"
    with pytest.raises(ValueError, match=match):
        fitted_regressor().predict(X)
    with pytest.raises(ValueError, match=match):
        fitted_regressor().predict_from_coefficients(X)
    with pytest.raises(ValueError, match=match):
        fitted_features().transform(X)


# --------------------------------------------------------------------------
# token_dim
# --------------------------------------------------------------------------

BAD_TOKEN_DIM = [
    (4, np.ones((3, 6)), ValueError,
     r"token_dim=4 must divide the number of columns of the 2-D X; got 6 columns"),
    (1.5, np.ones((3, 6)), TypeError,
     r"token_dim must be None or a positive integer; got 1\.5 of type float"),
    (2.0, np.ones((3, 6)), TypeError,
     r"token_dim must be None or a positive integer; got 2\.0 of type float"),
    ("2", np.ones((3, 6)), TypeError,
     r"token_dim must be None or a positive integer; got '2' of type str"),
    (True, np.ones((3, 6)), TypeError,
     r"token_dim must be None or a positive integer; got True of type bool"),
    (0, np.ones((3, 6)), ValueError, r"token_dim must be a positive integer; got 0"),
    (-2, np.ones((3, 6)), ValueError, r"token_dim must be a positive integer; got -2"),
    (3, np.ones((3, 4, 2)), ValueError,
     r"token_dim=3 contradicts the token dimension of the 3-D X: got tokens of "
     r"dimension d=2 \(shape \(3, 4, 2\)\)"),
    (3, [np.ones((4, 2)), np.ones((1, 2))], ValueError,
     r"token_dim=3 contradicts the token dimension of the 3-D X: got tokens of "
     r"dimension d=2"),
]


@pytest.mark.parametrize("token_dim, X, error, match", BAD_TOKEN_DIM)
def test_bad_token_dim(token_dim, X, error, match):
    with pytest.raises(error, match=match):
        check_sequences(X, token_dim=token_dim)
    with pytest.raises(error, match=match):
        LinearAttentionFeatures(token_dim=token_dim).fit(X)
    with pytest.raises(error, match=match):
        LinearAttentionRegressor(token_dim=token_dim).fit(X, np.zeros(n_samples_of(X)))


def test_token_dim_not_dividing_at_predict_time():
    X2 = X_GOOD.reshape(len(X_GOOD), -1)  # 8 columns, token_dim 2
    model = LinearAttentionRegressor(token_dim=2).fit(X2, Y_GOOD)
    with pytest.raises(ValueError, match=r"token_dim=2 must divide .*; got 7 columns"):
        model.predict(np.ones((3, 7)))
    with pytest.raises(ValueError, match=r"token_dim=2 must divide .*; got 5 columns"):
        LinearAttentionFeatures(token_dim=2).fit(X2).transform(np.ones((3, 5)))


# --------------------------------------------------------------------------
# Malformed y
# --------------------------------------------------------------------------

X_PADDED = padded_batch()
_, LENGTHS = check_sequences(X_PADDED)


def _y_all(fn=None, d_out=None):
    """Targets for X_PADDED with readout='all': NaN exactly at padding."""
    shape = (5, 4) if d_out is None else (5, 4, d_out)
    y = np.random.default_rng(2).normal(size=shape)
    y[1, 2:] = np.nan
    if fn is not None:
        fn(y)
    return y


BAD_Y = [
    # readout, y, exception, regex
    ("last", np.zeros(4), ValueError,
     r"y must have one entry per sequence of X \(n_samples=5\); got shape \(4,\)"),
    ("last", np.zeros((6, 2)), ValueError,
     r"y must have one entry per sequence of X \(n_samples=5\); got shape \(6, 2\)"),
    ("last", 1.0, ValueError,
     r"y must have one entry per sequence of X \(n_samples=5\); got shape \(\)"),
    ("last", np.zeros((5, 4, 1)), ValueError,
     r"with readout='last', y must have shape \(n_samples,\) or \(n_samples, d_out\); "
     r"got shape \(5, 4, 1\)"),
    ("last", np.zeros((5, 0)), ValueError, r"y must have at least one output; got shape \(5, 0\)"),
    ("last", np.array([0.0, 1.0, np.nan, 2.0, 3.0]), ValueError,
     r"y\[2\] is NaN; with readout='last' every sequence needs a target"),
    ("last", np.array([[0.0, 1.0]] * 3 + [[np.nan, 1.0]] + [[1.0, 1.0]]), ValueError,
     r"y\[3\] is NaN"),
    ("last", np.array([0.0, np.inf, 0, 0, 0]), ValueError, r"Input y contains infinity"),
    ("last", np.zeros(5) + 1j, ValueError,
     r"y must hold real numbers; got complex values \(an array of shape \(5,\) and "
     r"dtype complex128\)"),
    ("last", np.array(["a"] * 5), TypeError,
     r"y must hold real numbers \(a numeric dtype\); got an array of shape \(5,\) and "
     r"dtype <U1"),
    ("last", np.array([0.0, {"a": 1}, 0.0, 0.0, 0.0], dtype=object), TypeError,
     r"y is an object array whose entries are not all numbers"),
    ("last", None, ValueError, r"the target y is None"),
    ("all", np.zeros(5), ValueError,
     r"with readout='all', y must have shape \(n_samples, n_tokens\) or "
     r"\(n_samples, n_tokens, d_out\) = \(5, 4\[, d_out\]\), with NaN at padded "
     r"positions; got shape \(5,\)"),
    ("all", np.zeros((5, 3)), ValueError,
     r"with readout='all', y must have shape .*= \(5, 4\[, d_out\]\).*got shape \(5, 3\)"),
    ("all", np.zeros((5, 4, 1, 1)), ValueError,
     r"with readout='all', y must have shape .*got shape \(5, 4, 1, 1\)"),
    ("all", np.zeros((4, 4)), ValueError,
     r"y must have one entry per sequence of X \(n_samples=5\); got shape \(4, 4\)"),
    ("all", _y_all(_set((0, 1), np.nan)), ValueError,
     r"y\[0, 1\] is NaN but X\[0, 1\] is a real token; only padded positions may "
     r"have NaN targets"),
    ("all", _y_all(_set((1, 1), np.nan)), ValueError,
     r"y\[1, 1\] is NaN but X\[1, 1\] is a real token"),
    ("all", _y_all(_set((3, 0, 1), np.nan), d_out=2), ValueError,
     r"y\[3, 0\] is NaN but X\[3, 0\] is a real token"),
    ("all", _y_all(_set((1, 2), 0.5)), ValueError,
     r"y\[1, 2\] holds a target but X\[1, 2\] is padding; targets at padded "
     r"positions must be NaN"),
    ("all", np.zeros((5, 4)), ValueError,
     r"y\[1, 2\] holds a target but X\[1, 2\] is padding"),
    ("all", _y_all(_set((1, 3, 0), 0.5), d_out=2), ValueError,
     r"y\[1, 3\] holds a target but X\[1, 3\] is padding"),
    ("all", _y_all(_set((4, 3), np.inf)), ValueError, r"Input y contains infinity"),
    ("all", _y_all() + 0j, ValueError, r"y must hold real numbers; got complex values"),
    ("all", [np.zeros(4), np.zeros(3), np.zeros(4), np.zeros(4), np.zeros(4)], ValueError,
     r"y\[1, 2\] holds a target but X\[1, 2\] is padding"),
    ("all", [np.zeros(5), np.zeros(2), np.zeros(4), np.zeros(4), np.zeros(4)], ValueError,
     r"y\[0\] has shape \(5,\); expected \(4,\) to match X\[0\]"),
    ("all", [np.zeros((4, 2)), np.zeros((2, 3)), np.zeros((4, 2)), np.zeros((4, 2)),
             np.zeros((4, 2))], ValueError,
     r"y\[1\] has shape \(2, 3\); expected \(2, 2\) to match X\[1\]"),
    ("all", [np.zeros(4), np.array(["a", "b"]), np.zeros(4), np.zeros(4), np.zeros(4)],
     TypeError, r"y\[1\] must hold real numbers \(a numeric dtype\)"),
]
BAD_Y_IDS = [f"{c[0]}-{i}" for i, c in enumerate(BAD_Y)]


@pytest.mark.parametrize("readout, y, error, match", BAD_Y, ids=BAD_Y_IDS)
def test_check_targets_rejects(readout, y, error, match):
    with pytest.raises(error, match=match):
        check_targets(y, LENGTHS, X_PADDED.shape[1], readout=readout)


@pytest.mark.parametrize("readout, y, error, match", BAD_Y, ids=BAD_Y_IDS)
def test_fit_and_score_reject_malformed_y(readout, y, error, match):
    with pytest.raises(error, match=match):
        LinearAttentionRegressor(readout=readout).fit(X_PADDED, y)
    model = fitted_regressor(readout=readout)
    with pytest.raises(error, match=match):
        model.score(X_PADDED, y)


# --------------------------------------------------------------------------
# Estimator parameters
# --------------------------------------------------------------------------

BAD_PARAMS = [
    ({"readout": "first"}, ValueError, r"readout must be one of \('last', 'all'\); got 'first'"),
    ({"readout": None}, ValueError, r"readout must be one of \('last', 'all'\); got None"),
    ({"readout": ["last"]}, ValueError, r"readout must be one of .*; got \['last'\]"),
    ({"alpha": -1.0}, ValueError, r"alpha must be a real number >= 0\.0; got -1\.0"),
    ({"alpha": np.nan}, ValueError, r"alpha must be a real number >= 0\.0; got nan"),
    ({"alpha": np.inf}, ValueError, r"alpha must be a real number >= 0\.0; got inf"),
    ({"alpha": "1"}, TypeError, r"alpha must be a real number >= 0\.0; got '1'"),
    ({"alpha": None}, TypeError, r"alpha must be a real number >= 0\.0; got None"),
    ({"alpha": True}, TypeError, r"alpha must be a real number >= 0\.0; got True"),
    ({"n_heads": 0}, ValueError, r"n_heads must be None, 'auto' or an integer >= 1; got 0"),
    ({"n_heads": -3}, ValueError, r"n_heads must be None, 'auto' or an integer >= 1; got -3"),
    ({"n_heads": 1.5}, TypeError,
     r"n_heads must be None, 'auto' or an integer >= 1; got 1\.5 of type float"),
    ({"n_heads": "2"}, ValueError, r"n_heads must be None, 'auto' or an integer >= 1; got '2'"),
    ({"n_heads": "Auto"}, ValueError,
     r"n_heads must be None, 'auto' or an integer >= 1; got 'Auto'"),
    ({"n_heads": True}, TypeError,
     r"n_heads must be None, 'auto' or an integer >= 1; got True of type bool"),
    ({"solver": "lsqr"}, ValueError,
     r"solver must be one of \('auto', 'eigh', 'cholesky', 'svd', 'dual', 'cg', 'lsmr'\); "
     r"got 'lsqr'"),
    ({"solver": "SVD"}, ValueError, r"solver must be one of .*; got 'SVD'"),
    ({"solver": None}, ValueError, r"solver must be one of .*; got None"),
    ({"token_dim": 0}, ValueError, r"token_dim must be a positive integer; got 0"),
    ({"token_dim": 2.5}, TypeError, r"token_dim must be None or a positive integer; got 2\.5"),
]


@pytest.mark.parametrize("params, error, match", BAD_PARAMS,
                         ids=[f"{next(iter(p))}={p[next(iter(p))]!r}" for p, _, _ in BAD_PARAMS])
def test_bad_regressor_parameters(params, error, match):
    model = LinearAttentionRegressor(**params)
    with pytest.raises(error, match=match):
        model.fit(X_GOOD, Y_GOOD)
    assert not hasattr(model, "coef_")


def test_readout_checked_by_check_targets():
    with pytest.raises(ValueError, match=r"readout must be one of .*; got 'middle'"):
        check_targets(np.zeros(5), LENGTHS, 4, readout="middle")


# --------------------------------------------------------------------------
# Accepted forms
# --------------------------------------------------------------------------


def test_list_of_sequences_is_padded():
    rng = np.random.default_rng(3)
    seqs = [rng.normal(size=(n, 3)) for n in (2, 5, 1, 5)]
    X, lengths = check_sequences(seqs)
    assert X.shape == (4, 5, 3) and X.dtype == np.float64
    np.testing.assert_array_equal(lengths, [2, 5, 1, 5])
    for i, s in enumerate(seqs):
        np.testing.assert_array_equal(X[i, : len(s)], s)
        assert np.all(X[i, len(s):] == 0)
    Xn, _ = check_sequences(seqs, fill_value=None)
    for i, s in enumerate(seqs):
        np.testing.assert_array_equal(Xn[i, : len(s)], s)
        assert np.isnan(Xn[i, len(s):]).all()
    # Nested Python lists, and a tuple, are read the same way.
    X_lists, lengths_lists = check_sequences([s.tolist() for s in seqs])
    np.testing.assert_array_equal(X_lists, X)
    np.testing.assert_array_equal(lengths_lists, lengths)
    np.testing.assert_array_equal(check_sequences(tuple(seqs))[0], X)


def test_list_input_is_the_padded_array_for_the_estimators():
    rng = np.random.default_rng(4)
    seqs = [rng.normal(size=(n, 2)) for n in rng.integers(1, 6, size=30)]
    padded = np.full((30, 5, 2), np.nan)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    y = rng.normal(size=30)
    a = LinearAttentionRegressor().fit(seqs, y)
    b = LinearAttentionRegressor().fit(padded, y)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.predict(seqs), b.predict(padded), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(
        LinearAttentionFeatures().fit_transform(seqs),
        LinearAttentionFeatures().fit_transform(padded),
    )


def test_2d_input_is_univariate_sequences():
    rng = np.random.default_rng(5)
    X2 = rng.normal(size=(6, 4))
    X2[2, 3:] = np.nan  # trailing NaN: a shorter univariate sequence
    X2[4, 1:] = np.nan
    X, lengths = check_sequences(X2)
    assert X.shape == (6, 4, 1)
    np.testing.assert_array_equal(lengths, [4, 4, 3, 4, 1, 4])
    np.testing.assert_array_equal(X[..., 0], np.nan_to_num(X2, nan=0.0))
    model = LinearAttentionFeatures().fit(X2)
    assert model.n_features_in_ == 1
    np.testing.assert_array_equal(model.transform(X2), model.transform(X2[:, :, None]))
    with pytest.raises(ValueError, match=r"X\[0, 1\] is an all-NaN token followed"):
        check_sequences(np.array([[1.0, np.nan, 2.0]]))


def test_2d_input_with_token_dim():
    rng = np.random.default_rng(6)
    X3 = rng.normal(size=(20, 3, 2))
    X3[5, 2] = np.nan
    X2 = X3.reshape(20, 6)
    X, lengths = check_sequences(X2, token_dim=2)
    np.testing.assert_array_equal(X, np.nan_to_num(X3, nan=0.0))
    assert lengths[5] == 2 and np.all(np.delete(lengths, 5) == 3)
    # token_dim equal to d is accepted for 3-D input.
    np.testing.assert_array_equal(check_sequences(X3, token_dim=2)[0], X)
    y = rng.normal(size=20)
    a = LinearAttentionRegressor(token_dim=2).fit(X2, y)
    b = LinearAttentionRegressor().fit(X3, y)
    assert a.n_features_in_ == 2
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.predict(X2), b.predict(X3), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(
        LinearAttentionFeatures(token_dim=2).fit_transform(X2),
        LinearAttentionFeatures().fit_transform(X3),
    )


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_dtype_is_preserved(dtype):
    X = padded_batch().astype(dtype)
    out, _ = check_sequences(X)
    assert out.dtype == dtype
    out_list, _ = check_sequences([x[: 2 + i % 2] for i, x in enumerate(X.astype(dtype))])
    assert out_list.dtype == dtype


def test_object_arrays_of_numbers_or_of_sequences_are_read_like_lists():
    """Numeric object arrays and object arrays of ragged sequences are sequences too."""
    X = padded_batch()
    out, lengths = check_sequences(X.astype(object))
    np.testing.assert_array_equal(out, check_sequences(X)[0])
    seqs = [np.ones((3, 2)), np.full((1, 2), 2.0)]
    ragged = np.empty(2, dtype=object)
    ragged[:] = seqs
    a, la = check_sequences(ragged)
    b, lb = check_sequences(seqs)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_other_real_dtypes_become_float64(dtype):
    X = np.ones((2, 3, 2), dtype=dtype)
    out, lengths = check_sequences(X)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, X.astype(np.float64))
    np.testing.assert_array_equal(lengths, [3, 3])


def test_valid_targets_all_forms():
    y = _y_all()
    Y, single = check_targets(y, LENGTHS, 4, readout="all")
    assert single and Y.shape == (5, 4, 1)
    assert np.all(Y[1, 2:] == 0)
    np.testing.assert_array_equal(Y[..., 0][~np.isnan(y)], y[~np.isnan(y)])
    ragged = [y[i, : LENGTHS[i]] for i in range(5)]
    Y_ragged, single_ragged = check_targets(ragged, LENGTHS, 4, readout="all")
    np.testing.assert_array_equal(Y_ragged, Y)
    assert single_ragged
    Y2, single2 = check_targets(_y_all(d_out=3), LENGTHS, 4, readout="all")
    assert not single2 and Y2.shape == (5, 4, 3)
    Y_last, single_last = check_targets(np.arange(5), LENGTHS, 4, readout="last")
    assert single_last and Y_last.shape == (5, 1) and Y_last.dtype == np.float64


def test_per_sequence_targets_shorter_than_the_padded_length():
    # Every sequence is padded (lengths 2 and 3 of n_tokens=5): targets given
    # per sequence are padded like X, whether their lengths differ or not.
    X = np.random.default_rng(7).normal(size=(2, 5, 2))
    X[:, 3:] = np.nan
    X[0, 2] = np.nan
    _, lengths = check_sequences(X)
    np.testing.assert_array_equal(lengths, [2, 3])
    Y, _ = check_targets([np.ones(2), np.ones(3)], lengths, 5, readout="all")
    np.testing.assert_array_equal(Y[..., 0], [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    X[1, 2] = np.nan
    _, lengths = check_sequences(X)
    Y, _ = check_targets([np.ones(2), np.ones(2)], lengths, 5, readout="all")
    np.testing.assert_array_equal(Y[..., 0], [[1, 1, 0, 0, 0]] * 2)
    with pytest.raises(ValueError, match=r"y\[1, 1\] is NaN but X\[1, 1\] is a real token"):
        check_targets([np.ones(2), np.ones(1)], lengths, 5, readout="all")
    model = LinearAttentionRegressor(readout="all").fit(X, [np.ones(2), np.ones(2)])
    assert model.predict(X).shape == (2, 5)


def _snapshot(obj):
    if isinstance(obj, list):
        return [np.array(o, copy=True) for o in obj]
    return np.array(obj, copy=True)


def _assert_unchanged(obj, snap):
    if isinstance(obj, list):
        for o, s in zip(obj, snap):
            np.testing.assert_array_equal(o, s)
    else:
        np.testing.assert_array_equal(obj, snap)  # NaN compares equal here


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_input_is_never_modified(dtype):
    X = padded_batch().astype(dtype)
    seqs = [X[i, : LENGTHS[i]].copy() for i in range(5)]
    X2 = X.reshape(5, 8)
    y_all = _y_all()
    y_last = np.arange(5.0)
    snaps = [_snapshot(o) for o in (X, seqs, X2, y_all, y_last)]

    for inp, kwargs in ((X, {}), (seqs, {}), (X2, {"token_dim": 2}), (X2, {})):
        out, _ = check_sequences(inp, **kwargs)
        assert not np.shares_memory(out, X)
        out[...] = 123.0  # writing to the result does not reach the input
    Y, _ = check_targets(y_all, LENGTHS, 4, readout="all")
    assert not np.shares_memory(Y, y_all)
    Y[...] = 7.0

    for readout, y in (("last", y_last), ("all", y_all)):
        model = LinearAttentionRegressor(readout=readout).fit(X, y)
        model.predict(X)
        model.predict(seqs)
        model.score(X, y)
    LinearAttentionRegressor(token_dim=2).fit(X2, y_last).predict(X2)
    LinearAttentionFeatures().fit(X).transform(seqs)

    for obj, snap in zip((X, seqs, X2, y_all, y_last), snaps):
        _assert_unchanged(obj, snap)
    assert np.isnan(X[1, 2:]).all()  # the NaN padding is still there


def test_messages_name_the_argument():
    # The name passed to the checks is the one reported.
    with pytest.raises(ValueError, match=re.escape("X_test[0, 1] is an all-NaN token")):
        check_sequences(_with(_set((0, 1), np.nan)), name="X_test")
    with pytest.raises(ValueError, match=re.escape("sample_targets[2] is NaN")):
        check_targets(np.array([0, 1, np.nan, 2, 3]), LENGTHS, 4, readout="last",
                      name="sample_targets")


def test_offset_numbers_the_samples_of_a_block():
    # A block that starts at sample 100 of a larger array names samples globally.
    with pytest.raises(ValueError, match=re.escape("X[100, 1] is an all-NaN token")):
        check_sequences(_with(_set((0, 1), np.nan)), offset=100)
    with pytest.raises(ValueError, match=re.escape("y[102] is NaN")):
        check_targets(np.array([0, 1, np.nan, 2, 3]), LENGTHS, 4, readout="last",
                      offset=100)
    with pytest.raises(ValueError, match=re.escape("sample_weight[101] = -1.0")):
        check_sample_weight([1.0, -1.0], 2, offset=100)
    with pytest.raises(ValueError, match=re.escape("X[7] is an empty sequence")):
        check_sequences([np.ones((2, 3)), np.ones((0, 3))], offset=6)


def test_negative_sample_weight_message_shows_the_number():
    # Before: "sample_weight[1] = np.float64(-2.5)", numpy's repr of the entry.
    with pytest.raises(ValueError, match=re.escape("got sample_weight[1] = -2.5.")):
        check_sample_weight([1.0, -2.5], 2)


def test_integers_beyond_float64_are_named_not_a_numpy_type_error():
    """Reproducer: alpha=10**400 raised numpy's TypeError ("ufunc 'isfinite' not supported")."""
    from sklearn_linattn._params import check_number

    with pytest.raises(ValueError, match=r"^alpha must be a real number >= 0; got 1000"):
        check_number(10**400, "alpha", low=0)
    with pytest.raises(ValueError, match=r"^alpha must be a real number >= 0.0; got -1000"):
        LinearAttentionRegressor(alpha=-(10**400)).fit(X_GOOD, Y_GOOD)
    # An integer parameter may be as large as it likes.
    assert check_number(10**400, "max_iter", integer=True, low=1) == 10**400
    assert check_number(2**60, "alpha", low=0) == 2.0**60
