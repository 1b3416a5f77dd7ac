"""Model files of models with fixed decays: round trips, old files, every malformed decay entry.

A model with decays has one block of psi features per decay (``coef_`` of shape
(d_out, n_decays * psi)) and one group of heads per decay (``head_decays_``).
"""

import copy
import json
import re
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from test_io import npy_bytes, read_entry, tampered

from sklearn_linattn import (
    LinearAttentionRegressor,
    LinearAttentionRegressorCV,
    load_model,
    mhla_forward,
    save_model,
)
from sklearn_linattn.__main__ import main

DECAYS = [0.9, 0.5]


def teacher_data(readout="last", d_out=1, decays=DECAYS, n=240, seed=0):
    """Sequences of d = 3 and the targets of one random head per decay."""
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(len(decays), d_out, 3))
    Q = rng.normal(size=(len(decays), 3, 3))
    X = rng.normal(size=(n, 6, 3))
    X[: n // 3, 4:] = np.nan  # some shorter sequences, NaN-padded
    y = mhla_forward(np.nan_to_num(X), V, Q, np.where(np.arange(n) < n // 3, 4, 6),
                     readout=readout, decays=decays)
    if readout == "all":
        y[: n // 3, 4:] = np.nan
    return X, (y[..., 0] if d_out == 1 else y)


def fit(X, y, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return LinearAttentionRegressor(**kwargs).fit(X, y)


def decay_heads_forward(model, X):
    """The loaded heads run with their decays (what predict computes with decays)."""
    return mhla_forward(np.nan_to_num(X), model.value_matrices_, model.key_query_matrices_,
                        np.where(np.isnan(X).all(axis=2), 0, 1).sum(axis=1),
                        readout=model.readout, decays=model.head_decays_)


@pytest.fixture(scope="module")
def decay_file(tmp_path_factory):
    """An uncompressed model with two decays (three heads each, d = 3) and its file."""
    X, y = teacher_data()
    model = fit(X, y, decay=DECAYS)
    assert model.n_heads_ == 6 and model.compression_residual_ is None
    path = tmp_path_factory.mktemp("decay") / "m.npz"
    save_model(model, path)
    return model, X, y, path


@pytest.fixture(scope="module")
def compressed_file(tmp_path_factory):
    """Two decays, each compressed to one head (their teacher's)."""
    X, y = teacher_data()
    model = fit(X, y, decay=DECAYS, n_heads=1, random_state=0)
    assert model.n_heads_ == 2 and model.compression_residual_ is not None
    path = tmp_path_factory.mktemp("decay_compressed") / "m.npz"
    save_model(model, path)
    return model, path


def with_params(src, dst, **change):
    params = json.loads(str(read_entry(src, "params")))
    params.update(change)
    for name in [name for name, value in change.items() if value is _DROP]:
        del params[name]
    return tampered(src, dst, {"params": np.str_(json.dumps(params))})


_DROP = object()


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("decay, kwargs, readout, d_out", [
    (0.8, {}, "last", 1),  # one decay, one block
    ((1.0, 0.5), {"n_heads": "auto", "random_state": 0}, "last", 1),
    ([0.9, 0.5], {"n_heads": 1, "random_state": 0}, "all", 1),
    ([0.9, 0.5], {"fit_intercept": True, "fit_skip": True}, "last", 2),
    ([1.0, 0.9, 0.5], {"n_heads": 2, "random_state": 0, "fit_intercept": True}, "all", 1),
    (np.array([0.9, 0.5]), {"alpha": 1e-6, "fit_skip": True}, "all", 2),
])
def test_round_trip_predicts_exactly_alike(tmp_path, decay, kwargs, readout, d_out):
    # Before: a sequence of decays was a TypeError in save_model, and one decay
    # was saved without it: the loaded model ran its coefficients without decay.
    X, y = teacher_data(readout, d_out, decays=list(np.atleast_1d(decay)), seed=1)
    if kwargs.get("fit_intercept"):
        y = y + 0.5
    model = fit(X, y, readout=readout, decay=decay, **kwargs)
    save_model(model, tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")

    expected = decay if np.ndim(decay) == 0 else list(decay)  # a sequence comes back a list
    assert loaded.get_params()["decay"] == expected
    assert type(loaded.get_params()["decay"]) is type(expected)
    params = {k: v for k, v in model.get_params().items() if k != "decay"}
    assert {k: v for k, v in loaded.get_params().items() if k != "decay"} == params
    for name in ("n_heads_", "n_features_in_", "n_outputs_", "feature_rank_", "solver_",
                 "compression_residual_"):
        assert getattr(loaded, name) == getattr(model, name), name
    for name in ("coef_", "value_matrices_", "key_query_matrices_", "head_decays_",
                 "intercept_", "skip_coef_"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(model, name), err_msg=name)
    assert loaded.head_decays_.dtype == np.float64
    assert loaded.coef_.shape[1] == np.size(decay) * 18
    assert loaded.standardization_ == model.standardization_
    assert loaded.standardization_.decays == tuple(np.atleast_1d(decay).tolist())

    X_new, _ = teacher_data(readout, d_out, n=30, seed=2)
    for data in (X, X_new):
        assert np.array_equal(loaded.predict(data), model.predict(data), equal_nan=True)
        assert np.array_equal(loaded.predict_from_coefficients(data),
                              model.predict_from_coefficients(data), equal_nan=True)
        assert np.array_equal(decay_heads_forward(loaded, data),
                              decay_heads_forward(model, data), equal_nan=True)
    # The decays reached the loaded model: its coefficients fit the decayed teacher.
    if not loaded.alpha:
        np.testing.assert_allclose(loaded.predict_from_coefficients(X), y, rtol=1e-6,
                                   atol=1e-8)
    # And its heads, run with their decays, compute its coefficients' function.
    if not (loaded.fit_intercept or loaded.fit_skip):
        np.testing.assert_allclose(decay_heads_forward(loaded, X).reshape(y.shape),
                                   loaded.predict_from_coefficients(X), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(loaded.predict(X), loaded.predict_from_coefficients(X),
                               rtol=1e-7, atol=1e-9)


def test_one_decay_file_keeps_its_decay_when_saved_again(decay_file, tmp_path):
    model, X, _, path = decay_file
    loaded = load_model(path)
    save_model(loaded, tmp_path / "again.npz")
    again = load_model(tmp_path / "again.npz")
    np.testing.assert_array_equal(again.head_decays_, model.head_decays_)
    assert np.array_equal(again.predict_from_coefficients(X), model.predict_from_coefficients(X))


def test_a_model_without_decays_has_no_decay_entries(tmp_path):
    X, y = teacher_data(decays=[1.0])
    model = fit(X, y)
    save_model(model, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as data:
        assert not {"head_decays_", "standardization_decays"} & set(data.files)
    loaded = load_model(tmp_path / "m.npz")
    assert loaded.decay is None and loaded.head_decays_ is None
    assert loaded.standardization_.decays is None


def test_a_file_written_before_decays_loads_without_them(tmp_path):
    # Such a file has no decay entries and no parameter 'decay' at all.
    X, y = teacher_data(decays=[1.0])
    model = fit(X, y, n_heads=1, random_state=0)
    save_model(model, tmp_path / "m.npz")
    old = with_params(tmp_path / "m.npz", tmp_path / "old.npz", decay=_DROP)
    assert "decay" not in json.loads(str(read_entry(old, "params")))
    loaded = load_model(old)
    assert loaded.decay is None and loaded.head_decays_ is None
    assert loaded.standardization_.decays is None
    assert np.array_equal(loaded.predict(X), model.predict(X))
    assert np.array_equal(loaded.predict_from_coefficients(X), model.predict_from_coefficients(X))


def test_save_refuses_a_decay_changed_after_fit(decay_file, tmp_path):
    model = decay_file[0]
    for decay in ([0.5, 0.9], None, 0.9, [0.9, 2.0]):
        changed = copy.deepcopy(model).set_params(decay=decay)
        with pytest.raises(ValueError, match=re.escape(
                f"model was fitted with decay=[0.9, 0.5], but its parameter is decay={decay!r}")):
            save_model(changed, tmp_path / "x.npz")
    X, y = teacher_data(decays=[1.0])
    plain = fit(X, y).set_params(decay=0.5)
    with pytest.raises(ValueError, match=r"fitted with decay=None, but its parameter is "
                       r"decay=0\.5"):
        save_model(plain, tmp_path / "y.npz")


def test_a_search_is_saved_with_the_decays_it_refitted_with(tmp_path):
    X, y = teacher_data()
    search = LinearAttentionRegressorCV(alphas=[0.0, 1e-3], cv=3, decays=[None, (0.9, 0.5)])
    search.fit(X, y)
    assert search.decay_ == (0.9, 0.5)
    save_model(search, tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    assert type(loaded) is LinearAttentionRegressor
    assert loaded.decay == DECAYS and loaded.alpha == search.alpha_
    np.testing.assert_array_equal(loaded.head_decays_, search.head_decays_)
    assert np.array_equal(loaded.predict(X), search.predict(X))
    assert np.array_equal(loaded.predict_from_coefficients(X), search.predict_from_coefficients(X))


# ------------------------------------------------------- malformed decay entries


@pytest.mark.parametrize("value, match", [
    (np.full(7, 0.9), r"entry 'head_decays_' must be a floating-point array of shape \(6,\) "
                      r"\(d = 3, d_out = 1, n_heads_ = 6, 2 decays\); found shape \(7,\)"),
    (np.full((6, 1), 0.9), r"entry 'head_decays_' must be a floating-point array of shape "
                           r"\(6,\).*found shape \(6, 1\)"),
    (np.array([9, 9, 9, 5, 5, 5]), r"entry 'head_decays_' must be a floating-point array"),
    (np.array([0.9, 0.9, 0.9, 0.5, 0.5, 1.5]), r"entry 'head_decays_' must hold decays in "
                                               r"\(0, 1\]; found \[0\.9, .*1\.5\]"),
    (np.array([0.9, 0.9, 0.9, 0.5, 0.5, 0.0]), r"entry 'head_decays_' must hold decays in"),
    (np.array([0.9, 0.9, 0.9, 0.5, 0.5, -0.5]), r"entry 'head_decays_' must hold decays in"),
    (np.array([0.9, 0.9, 0.9, 0.5, 0.5, np.nan]), r"entry 'head_decays_' holds NaN"),
    (np.array([0.9, 0.9, 0.9, 0.5, 0.5, 0.7]), r"entry 'head_decays_' holds the decay 0\.7, "
                                               r"which is not one of the parameter decay="
                                               r"\[0\.9, 0\.5\]"),
    (np.array([0.9, 0.9, 0.9, 0.5, 0.5, 0.5]) + 1e-16,
     r"entry 'head_decays_' holds the decay 0\.9000000000000001"),
    (np.array([0.5, 0.5, 0.5, 0.9, 0.9, 0.9]), r"entry 'head_decays_' must list the heads "
                                               r"decay by decay in the order of the parameter"),
    (np.array([0.9, 0.5, 0.9, 0.5, 0.9, 0.5]), r"entry 'head_decays_' must list the heads"),
    # Six heads, but four of decay 0.9: one decay's coefficients have at most three.
    (np.array([0.9, 0.9, 0.9, 0.9, 0.5, 0.5]), r"entry 'head_decays_' gives 4 heads the decay "
                                               r"0\.9, more than the min\(d_out \* d, d \* d\) "
                                               r"= 3 one decay's coefficients have"),
])
def test_malformed_head_decays_are_refused(decay_file, tmp_path, value, match):
    path = tampered(decay_file[3], tmp_path / "bad.npz", {"head_decays_": value})
    with pytest.raises(ValueError, match=r"bad\.npz: " + match):
        load_model(path)


@pytest.mark.parametrize("value, match", [
    (np.array([0.9, 0.5, 0.1]), r"entry 'standardization_decays' must be a floating-point "
                                r"array of shape \(2,\).*found shape \(3,\)"),
    (np.array(0.9), r"entry 'standardization_decays' must be a floating-point array of shape "
                    r"\(2,\).*found shape \(\)"),
    (np.array(["0.9", "0.5"]), r"entry 'standardization_decays' must be a floating-point"),
    (np.array([0.9, 1.5]), r"entry 'standardization_decays' must hold decays in \(0, 1\]"),
    (np.array([0.9, 0.0]), r"entry 'standardization_decays' must hold decays in \(0, 1\]"),
    (np.array([0.9, np.inf]), r"entry 'standardization_decays' holds NaN or infinite"),
    (np.array([0.9, 0.4]), r"entry 'standardization_decays' must be the parameter "
                           r"decay=\[0\.9, 0\.5\] .*found \[0\.9, 0\.4\]"),
    (np.array([0.5, 0.9]), r"entry 'standardization_decays' must be the parameter"),
])
def test_malformed_standardization_decays_are_refused(decay_file, tmp_path, value, match):
    path = tampered(decay_file[3], tmp_path / "bad.npz", {"standardization_decays": value})
    with pytest.raises(ValueError, match=r"bad\.npz: " + match):
        load_model(path)


@pytest.mark.parametrize("decay, match", [
    ([0.9, 0.9], r"entry 'params' is invalid: decay must hold distinct decays"),
    ([0.9, 1.5], r"entry 'params' is invalid: decay\[1\] must be a real number in"),
    (0.0, r"entry 'params' is invalid: decay must be a real number in \(0\.0, 1\.0\]"),
    ([], r"entry 'params' is invalid: decay must be None, a real number in \(0, 1\] or a "
         r"non-empty"),
    ([[0.9, 0.5]], r"entry 'params' is invalid: decay must be None"),
    ("0.9", r"entry 'params' is invalid: decay must be None"),
    ([0.9, "0.5"], r"entry 'params' is invalid: decay\[1\] must be a real number"),
    ({"0": 0.9}, r"entry 'params' is invalid: decay must be None"),
    # Valid decays, but not those of the file's blocks and heads.
    ([0.5, 0.9], r"entry 'standardization_decays' must be the parameter decay=\[0\.5, 0\.9\]"),
    # One decay: six heads are more than one block's coefficients have.
    ([0.9], r"entry 'n_heads_' must be between 0 and n_decays \* min\(d_out \* d, d \* d\) "
            r"= 3 for d = 3, d_out = 1 and 1 decay; found 6"),
    ([0.9, 0.5, 0.1], r"entry 'coef_' must be a floating-point array of shape \(1, 54\) "
                      r"\(d = 3, d_out = 1, n_heads_ = 6, 3 decays\); found shape \(1, 36\)"),
])
def test_malformed_decay_parameters_are_refused(decay_file, tmp_path, decay, match):
    path = with_params(decay_file[3], tmp_path / "bad.npz", decay=decay)
    with pytest.raises(ValueError, match=r"bad\.npz: " + match):
        load_model(path)


def test_decay_entries_must_match_the_parameter(decay_file, tmp_path):
    path = decay_file[3]
    for dropped in (["head_decays_"], ["standardization_decays"],
                    ["head_decays_", "standardization_decays"]):
        bad = tampered(path, tmp_path / "bad.npz", drop=dropped)
        with pytest.raises(ValueError, match=rf"bad\.npz lacks the entries "
                           rf"{dropped!r}".replace("[", r"\[") + r", which a model with "
                           r"decay=\[0\.9, 0\.5\] \(entry 'params'\) has"):
            load_model(bad)
    for decay in (None, _DROP):
        bad = with_params(path, tmp_path / "bad.npz", decay=decay)
        with pytest.raises(ValueError, match=r"bad\.npz: the entries \['head_decays_', "
                           r"'standardization_decays'\] hold decays, but entry 'params' has "
                           r"no decay"):
            load_model(bad)
    # Decay entries added to the file of a model without decays.
    X, y = teacher_data(decays=[1.0])
    save_model(fit(X, y), tmp_path / "plain.npz")
    n_heads = int(read_entry(tmp_path / "plain.npz", "n_heads_"))
    bad = tampered(tmp_path / "plain.npz", tmp_path / "bad2.npz", extra=[
        ("head_decays_.npy", npy_bytes(np.ones(n_heads)))])
    with pytest.raises(ValueError, match=r"bad2\.npz: the entries \['head_decays_'\] hold "
                       r"decays, but entry 'params' has no decay \(decay=None\)"):
        load_model(bad)


@pytest.mark.parametrize("key, value, match", [
    ("n_heads_", np.int64(7), r"must be between 0 and n_decays \* min\(d_out \* d, d \* d\) = "
                              r"6 for d = 3, d_out = 1 and 2 decays; found 7"),
    ("feature_rank_", np.int64(37), r"must be between 0 and n_decays \* psi = 2 \* 18 = 36; "
                                    r"found 37"),
])
def test_scalar_bounds_count_every_decay(decay_file, tmp_path, key, value, match):
    path = tampered(decay_file[3], tmp_path / "bad.npz", {key: value})
    with pytest.raises(ValueError, match=rf"bad\.npz: entry '{key}' {match}"):
        load_model(path)


def test_heads_must_compute_their_own_decays_block(decay_file, tmp_path):
    # Heads 2 (decay 0.9) and 3 (decay 0.5) swapped: every count and label is
    # plausible, but each decay's heads now compute another block of coef_.
    model, _, _, path = decay_file
    order = [0, 1, 3, 2, 4, 5]
    Vs, Qs = model._standardized_heads
    bad = tampered(path, tmp_path / "bad.npz", {
        "value_matrices_": model.value_matrices_[order],
        "key_query_matrices_": model.key_query_matrices_[order],
        "standardized_value_matrices": Vs[order], "standardized_key_query_matrices": Qs[order]})
    with pytest.raises(ValueError, match=r"bad\.npz: entries 'value_matrices_' and "
                       r"'key_query_matrices_' do not reproduce 'coef_'.*without compression"):
        load_model(bad)


def test_n_heads_bounds_every_decay(decay_file, compressed_file, tmp_path):
    # Uncompressed: three heads per decay, more than n_heads=2 allows per decay.
    bad = with_params(decay_file[3], tmp_path / "bad.npz", n_heads=2)
    with pytest.raises(ValueError, match=r"bad\.npz: entry 'head_decays_' gives 3 heads the "
                       r"decay 0\.9, more than the parameter n_heads=2 \(the most per decay\), "
                       r"with no compression_residual_"):
        load_model(bad)
    # Three heads per decay are what n_heads=3 allows (six in all, more than 3).
    assert load_model(with_params(decay_file[3], tmp_path / "ok.npz", n_heads=3)).n_heads_ == 6
    # Compressed to one head per decay: the parameter must say so.
    model, path = compressed_file
    assert load_model(path).head_decays_.tolist() == DECAYS
    bad = with_params(path, tmp_path / "bad2.npz", n_heads=2)
    with pytest.raises(ValueError, match=r"bad2\.npz: entry 'compression_residual_' is set, so "
                       r"some decay's heads were compressed to the parameter n_heads=2; but "
                       r"the most heads of one decay \(entry 'head_decays_'\) is 1"):
        load_model(bad)
    bad = with_params(path, tmp_path / "bad3.npz", n_heads=None)
    with pytest.raises(ValueError, match=r"entry 'compression_residual_' is set.*n_heads=None"):
        load_model(bad)


def test_compressed_decay_heads_differ_from_coef_as_recorded(compressed_file, tmp_path):
    model, path = compressed_file
    recorded = float(read_entry(path, "heads_residual"))
    assert recorded < 1e-6  # each decay's teacher has one head
    other = model.coef_.copy()
    other[:, 18:] *= 1.01  # the second decay's block only
    bad = tampered(path, tmp_path / "bad.npz", {"coef_": other})
    with pytest.raises(ValueError, match=r"do not reproduce 'coef_' as recorded"):
        load_model(bad)


# ---------------------------------------------------------------- command line


def test_cli_fit_with_decays_round_trips(tmp_path, capsys):
    X, y = teacher_data(decays=[1.0, 0.5])
    np.savez(tmp_path / "data.npz", X=X, y=y)
    model_path = tmp_path / "model.npz"
    assert main(["fit", str(tmp_path / "data.npz"), "-o", str(model_path),
                 "--decay", "1.0", "0.5", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["n_features"] == 36 and report["feature_rank"] == 36
    assert ("fitting 240 sequences of up to 6 tokens (d = 3, psi = 36 features: 2 decays x "
            "18)...") in captured.err
    loaded = load_model(model_path)
    assert loaded.decay == [1.0, 0.5] and loaded.verbose == 0
    direct = fit(X, y, decay=[1.0, 0.5])
    np.testing.assert_array_equal(loaded.coef_, direct.coef_)
    np.testing.assert_array_equal(loaded.head_decays_, direct.head_decays_)
    assert np.array_equal(loaded.predict_from_coefficients(X), direct.predict_from_coefficients(X))
    np.testing.assert_allclose(decay_heads_forward(loaded, X)[:, 0], y, rtol=1e-7, atol=1e-9)

    assert main(["fit", str(tmp_path / "data.npz"), "-o", str(tmp_path / "one.npz"),
                 "--decay", "0.5"]) == 0
    err = capsys.readouterr().err
    assert "(d = 3, psi = 18 features: 1 decay x 18)" in err
    assert load_model(tmp_path / "one.npz").decay == [0.5]


@pytest.mark.parametrize("values, message", [
    (["1.5"], "error: --decay must be a real number in (0.0, 1.0]; got 1.5"),
    (["0.9", "0"], "error: --decay must be a real number in (0.0, 1.0]; got 0.0"),
    (["nan"], "error: --decay must be a real number in (0.0, 1.0]; got nan"),
    (["-0.5"], "error: --decay must be a real number in (0.0, 1.0]; got -0.5"),
    (["0.5", "0.5"], "error: --decay must hold distinct decays (one feature block each)"),
])
def test_cli_decay_out_of_range_exits_2_before_reading(tmp_path, capsys, values, message):
    # The data file does not exist: the option is checked before it is read.
    argv = ["fit", str(tmp_path / "nothing.npz"), "-q", "--decay", *values]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message) and "nothing.npz" not in err


@pytest.mark.parametrize("argv", [["fit", "data.npz", "--decay"],
                                  ["fit", "data.npz", "--decay", "slow"]])
def test_cli_decay_of_the_wrong_type_exits_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "--decay" in capsys.readouterr().err


def test_cli_certify_with_decays(tmp_path, capsys):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(36, 5, 3))  # psi = 18 per decay: 36 rows for two decays
    np.savez(tmp_path / "data.npz", X=X)
    assert main(["certify", str(tmp_path / "data.npz"), "--decay", "1.0", "0.5",
                 "--json", "--check"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identifiable"] and report["n_features"] == 36
    np.savez(tmp_path / "fewer.npz", X=X[:35])
    assert main(["certify", str(tmp_path / "fewer.npz"), "--decay", "1.0", "0.5",
                 "--json", "--check"]) == 3
    assert json.loads(capsys.readouterr().out)["rank"] == 35
