"""Model files: round trips, and every corrupt or inconsistent file refused with a ValueError."""

import io
import json
import struct
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from sklearn_linattn import (
    LinearAttentionRegressor,
    attention_coefficients,
    load_model,
    mhla_forward,
    save_model,
)
from sklearn_linattn.datasets import make_random_mhla


def npy_bytes(array, allow_pickle=False):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=allow_pickle)
    return buffer.getvalue()


def npy_header(shape, descr="<f8"):
    """The bytes of a .npy header declaring ``shape`` (the data is up to the caller)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    )
    return buffer.getvalue()


def members(path):
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def write_zip(path, entries, compression=zipfile.ZIP_DEFLATED):
    """Write ``entries`` (name -> bytes, in order; names may repeat) as a zip."""
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return path


def tampered(src, dst, replace=None, drop=(), extra=()):
    """Copy the model file ``src`` to ``dst`` with entries replaced, dropped or added.

    Values of ``replace`` are arrays (written as .npy) or raw bytes.
    """
    replace = replace or {}
    entries = []
    for name, data in members(src).items():
        key = name[:-4]
        if key in drop:
            continue
        if key in replace:
            value = replace[key]
            data = value if isinstance(value, bytes) else npy_bytes(value)
        entries.append((name, data))
    entries += [(name, data) for name, data in extra]
    return write_zip(dst, entries)


def read_entry(path, key):
    with np.load(path, allow_pickle=False) as data:
        return data[key]


@pytest.fixture(scope="module")
def fitted():
    X, y = make_random_mhla(300, 8, 3, n_heads=2, variable_length=(3, 8), random_state=0)
    model = LinearAttentionRegressor().fit(X, y)
    assert model.compression_residual_ is None
    return model, X, y


@pytest.fixture
def model_file(fitted, tmp_path):
    path = tmp_path / "model.npz"
    save_model(fitted[0], path)
    return path


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "kwargs, d_out, readout",
    [
        ({}, 1, "last"),
        ({"n_heads": 2, "random_state": 0}, 1, "last"),
        ({"n_heads": 1, "random_state": 0}, 2, "last"),  # a lossy compression
        ({"alpha": 1e-3}, 2, "all"),
        ({"solver": "svd", "token_dim": 3}, 1, "last"),
    ],
)
def test_round_trip_predicts_alike(tmp_path, kwargs, d_out, readout):
    X, y = make_random_mhla(200, 6, 3, d_out=d_out, n_heads=2, readout=readout,
                            variable_length=(2, 6), random_state=1)
    if "token_dim" in kwargs:
        X = X.reshape(len(X), -1)  # rows of flattened tokens, NaN-padded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = LinearAttentionRegressor(readout=readout, **kwargs).fit(X, y)
    save_model(model, tmp_path / "m.npz")
    loaded = load_model(tmp_path / "m.npz")
    assert loaded.get_params() == model.get_params()
    for name in ("n_heads_", "n_features_in_", "n_outputs_", "feature_rank_", "solver_",
                 "n_iter_", "compression_residual_"):
        assert getattr(loaded, name) == getattr(model, name), name
    np.testing.assert_array_equal(loaded.coef_, model.coef_)
    np.testing.assert_array_equal(loaded.value_matrices_, model.value_matrices_)
    # The same heads; the estimator may evaluate them in other coordinates.
    np.testing.assert_allclose(loaded.predict(X), model.predict(X), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(loaded.predict_from_coefficients(X),
                               model.predict_from_coefficients(X), rtol=1e-10, atol=1e-13)
    assert loaded.score(X, y) == pytest.approx(model.score(X, y), rel=1e-12)


def test_round_trip_of_the_zero_function(tmp_path):
    # Zero targets give zero coefficients and no heads: a legitimate model.
    X = np.random.default_rng(0).normal(size=(40, 5, 2))
    model = LinearAttentionRegressor().fit(X, np.zeros(40))
    assert model.n_heads_ == 0
    save_model(model, tmp_path / "zero.npz")
    np.testing.assert_array_equal(load_model(tmp_path / "zero.npz").predict(X), 0.0)


@pytest.mark.parametrize("d, d_out, scale", [(1, 1, 1.0), (4, 3, 1e-40), (8, 1, 1e40)])
def test_rounding_allowance_accepts_every_honest_fit(tmp_path, d, d_out, scale):
    # The heads-reproduce-coef_ check must not depend on the units of y.
    X, y = make_random_mhla(4 * d**3 + 20, 5, d, d_out=d_out, n_heads=3, random_state=d)
    model = LinearAttentionRegressor().fit(X, scale * y)
    save_model(model, tmp_path / "m.npz")
    np.testing.assert_array_equal(load_model(tmp_path / "m.npz").coef_, model.coef_)


def test_one_hot_program_model_round_trips(tmp_path):
    # Coefficients of 0/1 programs have highly degenerate spectra.
    from sklearn_linattn.programs import associative_memory_program

    memory = associative_memory_program(3)
    X = np.random.default_rng(0).normal(size=(300, 4, memory.d))
    model = LinearAttentionRegressor().fit(X, memory.forward(X))
    save_model(model, tmp_path / "m.npz")
    np.testing.assert_allclose(load_model(tmp_path / "m.npz").predict(X), model.predict(X),
                               rtol=1e-10, atol=1e-12)


def test_fortran_order_and_big_endian_arrays_are_read_correctly(fitted, model_file, tmp_path):
    model = fitted[0]
    coef = np.asfortranarray(model.coef_.astype(">f8"))
    V = model.value_matrices_.astype(">f8")
    path = tampered(model_file, tmp_path / "f.npz", {"coef_": coef, "value_matrices_": V})
    loaded = load_model(path)
    np.testing.assert_array_equal(loaded.coef_, model.coef_)
    np.testing.assert_array_equal(loaded.value_matrices_, model.value_matrices_)


def test_numpy_scalar_parameters_are_saved_as_plain_json(tmp_path):
    X = np.random.default_rng(0).normal(size=(40, 4, 2))
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
    model = LinearAttentionRegressor(alpha=np.float64(1e-8), n_heads=np.int64(1),
                                     random_state=np.int32(3)).fit(X, y)
    save_model(model, tmp_path / "m.npz")
    params = json.loads(str(read_entry(tmp_path / "m.npz", "params")))
    assert params["n_heads"] == 1 and params["random_state"] == 3
    assert load_model(tmp_path / "m.npz").get_params()["alpha"] == 1e-8


def test_loaded_model_partial_fit_says_why_it_cannot_continue(fitted, model_file):
    _, X, y = fitted
    loaded = load_model(model_file)
    with pytest.raises(ValueError, match="sufficient statistics") as info:
        loaded.partial_fit(X, y)
    assert "load_model" in str(info.value) and "call fit" in str(info.value)
    # The refusal leaves the model as it was, and fit starts afresh.
    np.testing.assert_array_equal(loaded.coef_, fitted[0].coef_)
    np.testing.assert_allclose(loaded.fit(X, y).predict(X), y, rtol=1e-7, atol=1e-10)


# ------------------------------------------------------- inconsistent entries


def test_coef_of_the_wrong_shape_is_refused(fitted, model_file, tmp_path):
    model = fitted[0]
    wrong = np.zeros((1, 10))
    path = tampered(model_file, tmp_path / "bad.npz", {"coef_": wrong})
    with pytest.raises(ValueError, match=r"bad\.npz: entry 'coef_' must be a floating-point "
                       r"array of shape \(1, 18\).*found shape \(1, 10\)"):
        load_model(path)
    V = model.value_matrices_[:, :, :2]
    path = tampered(model_file, tmp_path / "bad2.npz", {"value_matrices_": V})
    with pytest.raises(ValueError, match=rf"entry 'value_matrices_' .*\({model.n_heads_}, 1, 3\)"):
        load_model(path)


def test_heads_must_reproduce_coef(fitted, model_file, tmp_path):
    # Before: loaded, and predict differed from predict_from_coefficients.
    model, X, _ = fitted
    other = np.random.default_rng(5).normal(size=model.coef_.shape)
    path = tampered(model_file, tmp_path / "bad.npz", {"coef_": other})
    with pytest.raises(ValueError, match="do not reproduce 'coef_'.*would disagree"):
        load_model(path)
    # A perturbation far above rounding but tiny in absolute terms is caught too.
    V = model.value_matrices_ * (1 + 1e-7)
    path = tampered(model_file, tmp_path / "bad2.npz", {"value_matrices_": V})
    with pytest.raises(ValueError, match="'value_matrices_' and 'key_query_matrices_'"):
        load_model(path)


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """A lossy compression (two-head data, one head) and its file."""
    X, y = make_random_mhla(200, 6, 3, n_heads=2, random_state=1)
    with pytest.warns(ConvergenceWarning, match="relative coefficient residual"):
        model = LinearAttentionRegressor(n_heads=1, random_state=0).fit(X, y)
    path = tmp_path_factory.mktemp("compressed") / "m.npz"
    save_model(model, path)
    return model, path


def test_compressed_heads_differ_from_coef_as_recorded(compressed, tmp_path):
    model, path = compressed
    loaded = load_model(path)
    assert loaded.compression_residual_ == model.compression_residual_ > 0.01
    gap = np.linalg.norm(attention_coefficients(model.value_matrices_,
                                                model.key_query_matrices_) - model.coef_)
    recorded = float(read_entry(path, "heads_residual"))
    assert recorded == pytest.approx(gap / np.linalg.norm(model.coef_), rel=1e-12)
    # Claiming a smaller difference than the heads have is refused ...
    bad = tampered(path, tmp_path / "bad.npz", {"heads_residual": np.float64(recorded / 2)})
    with pytest.raises(ValueError, match="do not reproduce 'coef_' as recorded.*entry "
                       "'heads_residual' records"):
        load_model(bad)
    # ... and so is coef_ of another model with the same shape.
    other = model.coef_ + 0.01 * np.linalg.norm(model.coef_)
    bad = tampered(path, tmp_path / "bad2.npz", {"coef_": other})
    with pytest.raises(ValueError, match="as recorded"):
        load_model(bad)
    for value in (np.inf, np.nan, -1.0):
        bad = tampered(path, tmp_path / "bad3.npz", {"heads_residual": np.float64(value)})
        with pytest.raises(ValueError, match="entry 'heads_residual' must be a finite number"):
            load_model(bad)


def test_compression_residual_is_checked(compressed, tmp_path):
    path = compressed[1]
    for value, match in [(np.inf, "must be finite"),
                         (-0.5, r"must be NaN .* or a finite number >= 0")]:
        bad = tampered(path, tmp_path / "bad.npz", {"compression_residual_": np.float64(value)})
        with pytest.raises(ValueError, match="entry 'compression_residual_' " + match):
            load_model(bad)
    # Without compression the heads must reproduce coef_ to rounding.
    bad = tampered(path, tmp_path / "bad2.npz", {"compression_residual_": np.float64(np.nan)})
    with pytest.raises(ValueError, match="without compression .* must agree to rounding"):
        load_model(bad)


def test_residual_without_compression_is_refused(model_file, tmp_path):
    params = json.loads(str(read_entry(model_file, "params")))
    params["n_heads"] = None
    path = tampered(model_file, tmp_path / "bad.npz", {
        "params": np.str_(json.dumps(params)), "compression_residual_": np.float64(0.1)})
    with pytest.raises(ValueError, match="compression_residual_' is set.*n_heads=None"):
        load_model(path)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("key", ["coef_", "value_matrices_", "key_query_matrices_"])
def test_non_finite_arrays_are_refused(model_file, tmp_path, key, value):
    array = read_entry(model_file, key).copy()
    array.flat[0] = value
    path = tampered(model_file, tmp_path / "bad.npz", {key: array})
    with pytest.raises(ValueError, match=f"bad.npz: entry '{key}' holds NaN or infinite"):
        load_model(path)


def test_zero_heads_for_a_nonzero_function_are_refused(fitted, model_file, tmp_path):
    d = fitted[0].n_features_in_
    path = tampered(model_file, tmp_path / "bad.npz", {
        "n_heads_": np.int64(0), "value_matrices_": np.zeros((0, 1, d)),
        "key_query_matrices_": np.zeros((0, d, d)), "compression_residual_": np.float64(np.nan),
        "standardized_value_matrices": np.zeros((0, 1, d)),
        "standardized_key_query_matrices": np.zeros((0, d, d)),
    })
    with pytest.raises(ValueError, match="do not reproduce 'coef_'"):
        load_model(path)
    # n_heads_ = 0 next to non-empty head arrays: a shape mismatch.
    path = tampered(model_file, tmp_path / "bad2.npz", {"n_heads_": np.int64(0)})
    with pytest.raises(ValueError, match="entry 'value_matrices_' must be .* shape \\(0, 1, 3\\)"):
        load_model(path)


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("n_heads_", np.int64(10), r"must be between 0 and min\(d_out \* d, d \* d\) = 3"),
        ("n_heads_", np.int64(-1), "must be between 0 and"),
        ("n_features_in_", np.int64(0), r"\(the token dimension d\) must be at least 1"),
        ("n_outputs_", np.int64(0), "must be at least 1"),
        ("feature_rank_", np.int64(19), "must be between 0 and psi = 18"),
        ("solver_", np.str_("magic"), "must be one of"),
        ("solver_", np.str_("auto"), "must be one of"),
        ("n_iter_", np.int64(0), "must be at least 1"),
        ("n_iter_", np.float64(1.0), "must be an integer scalar"),
        ("n_heads_", np.arange(2), r"must be an integer scalar; found an array of shape \(2,\)"),
        ("_single_output", np.int64(1), "must be a boolean scalar"),
        ("format_version", np.int64(1), "is 1; this version .* reads model format version 3"),
    ],
)
def test_scalar_entries_are_checked(model_file, tmp_path, key, value, match):
    path = tampered(model_file, tmp_path / "bad.npz", {key: value})
    with pytest.raises(ValueError, match=f"bad.npz: entry '{key}' {match}"):
        load_model(path)


def test_single_output_needs_one_output(tmp_path):
    X, y = make_random_mhla(100, 5, 2, d_out=2, random_state=0)
    save_model(LinearAttentionRegressor().fit(X, y), tmp_path / "m.npz")
    path = tampered(tmp_path / "m.npz", tmp_path / "bad.npz", {"_single_output": np.True_})
    with pytest.raises(ValueError, match="'_single_output' is true, which needs n_outputs_ = 1"):
        load_model(path)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"readout": "bogus"}, "readout"),
        ({"alpha": -5}, "alpha"),
        ({"n_heads": 0}, "n_heads"),
        ({"solver": "magic"}, "solver"),
        ({"token_dim": 2}, "token_dim=2, but n_features_in_ = 3"),
        ({"random_state": -1}, "random_state"),
        ({"random_state": 1.5}, "random_state"),
        ({"verbose": "loud"}, "verbose"),
        ({"n_heads": 1}, "more than the parameter n_heads=1"),
        ({"colour": "blue"}, r"unknown parameters \['colour'\]"),
    ],
)
def test_invalid_parameters_are_refused(model_file, tmp_path, change, match):
    params = json.loads(str(read_entry(model_file, "params")))
    params.update(change)
    path = tampered(model_file, tmp_path / "bad.npz", {"params": np.str_(json.dumps(params))})
    with pytest.raises(ValueError, match=r"bad\.npz: entry '(params|n_heads_)'.*" + match):
        load_model(path)


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "is not valid JSON"),
        ('{"alpha": NaN}', "is not valid JSON.*NaN is not a finite number"),
        ("[1, 2]", "must be a JSON object of parameters; found list"),
    ],
)
def test_unreadable_parameters_are_refused(model_file, tmp_path, text, match):
    path = tampered(model_file, tmp_path / "bad.npz", {"params": np.str_(text)})
    with pytest.raises(ValueError, match="entry 'params' " + match):
        load_model(path)


@pytest.mark.parametrize("text", [
    "[" * 30000 + "]" * 30000,  # reproducer: RecursionError
    '{"alpha":' * 6000 + "0" + "}" * 6000,
    '{"readout": "x", "n_heads": ' + "[" * 33 + "]" * 33 + "}",
])
def test_deeply_nested_parameters_are_refused_without_recursion(model_file, tmp_path, text):
    path = tampered(model_file, tmp_path / "bad.npz", {"params": np.str_(text)})
    with pytest.raises(ValueError, match=r"bad\.npz: entry 'params' nests arrays or objects "
                                         r"more than 32 levels deep"):
        load_model(path)


@pytest.mark.parametrize("change, match", [
    # Brackets inside strings, escaped quotes included, are not nesting.
    ({"readout": "[" * 40 + '\\"' + "{" * 40}, "readout must be one of"),
    ({"alpha": [[1.0]]}, r"alpha must be a real number >= 0.0; got \[\[1.0\]\]"),
    # A JSON integer beyond float64 was a TypeError from np.isfinite.
    ({"alpha": 10**400}, r"alpha must be a real number >= 0.0; got 1000"),
    ({"tol": -(10**400)}, r"tol must be a real number > 0.0; got -1000"),
])
def test_nested_or_huge_parameter_values_are_named(model_file, tmp_path, change, match):
    params = json.loads(str(read_entry(model_file, "params")))
    params.update(change)
    path = tampered(model_file, tmp_path / "bad.npz", {"params": np.str_(json.dumps(params))})
    with pytest.raises(ValueError, match=r"bad\.npz: entry 'params' is invalid: " + match):
        load_model(path)


def test_a_corrupt_header_is_quoted_briefly(model_file, tmp_path):
    # numpy's message quotes the whole header (up to 10 000 characters).
    text = "{'descr': '<f8', 'fortran_order': False, 'shape': " + "(" * 3000 + ")" * 3000 + "}"
    text += " " * (-(len(text) + 11) % 64) + "\n"
    header = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")
    path = tampered(model_file, tmp_path / "bad.npz", {"coef_": header})
    with pytest.raises(ValueError, match=r"entry 'coef_' has a corrupt \.npy header") as info:
        load_model(path)
    assert len(str(info.value)) < 400


def test_missing_parameters_take_their_defaults(model_file, tmp_path):
    params = json.loads(str(read_entry(model_file, "params")))
    del params["tol"], params["verbose"]
    path = tampered(model_file, tmp_path / "ok.npz", {"params": np.str_(json.dumps(params))})
    loaded = load_model(path)
    assert loaded.tol == LinearAttentionRegressor().tol and loaded.verbose == 0


def test_missing_and_unknown_entries_are_named(model_file, tmp_path):
    path = tampered(model_file, tmp_path / "bad.npz", drop=["n_iter_", "solver_"])
    with pytest.raises(ValueError, match=r"lacks the entries \['n_iter_', 'solver_'\]"):
        load_model(path)
    path = tampered(model_file, tmp_path / "bad1.npz", drop=["compression_residual_"])
    with pytest.raises(ValueError, match=r"lacks the entries \['compression_residual_'\]"):
        load_model(path)
    path = tampered(model_file, tmp_path / "bad2.npz",
                    extra=[("surprise.npy", npy_bytes(np.zeros(2)))])
    with pytest.raises(ValueError, match=r"has unknown entries \['surprise'\]"):
        load_model(path)
    path = tampered(model_file, tmp_path / "bad3.npz", {"format": np.str_("something-else")})
    with pytest.raises(ValueError, match="is not a sklearn-linattn model file: entry 'format'"):
        load_model(path)


# ---------------------------------------------------------------- corrupt files


def test_duplicate_members_are_refused(model_file, tmp_path):
    entries = list(members(model_file).items())
    bogus = npy_bytes(np.zeros((1, 18)))
    with pytest.warns(UserWarning):  # zipfile's own warning while writing the test file
        path = write_zip(tmp_path / "dup.npz", entries + [("coef_.npy", bogus)])
    with pytest.raises(ValueError, match=r"dup\.npz is a corrupt \.npz file: the entries "
                       r"\['coef_'\] appear more than once"):
        load_model(path)
    # "coef_" and "coef_.npy" are the same key to numpy.load.
    path = write_zip(tmp_path / "dup2.npz", entries + [("coef_", bogus)])
    with pytest.raises(ValueError, match=r"\['coef_'\] appear more than once"):
        load_model(path)


def test_deflate_bomb_is_refused_before_allocating(model_file, tmp_path):
    # 400 MB of zeros behind a header declaring them, in well under 1 MB of file.
    n = 50_000_000
    entries = [(name, data) for name, data in members(model_file).items()
               if name != "coef_.npy"]
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zf.writestr(name, data)
        with zf.open("coef_.npy", "w", force_zip64=True) as member:
            member.write(npy_header((1, n)))
            zeros = bytes(8 * n // 100)
            for _ in range(100):
                member.write(zeros)
    assert path.stat().st_size < 2**20
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"entry 'coef_' must be .* shape \(1, 18\).*"
                           r"found shape \(1, 50000000\)"):
            load_model(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**24


def test_header_must_match_the_member_size(model_file, tmp_path):
    # A header declaring fewer values than the member holds (or more) is corrupt.
    data = npy_header((1, 18)) + bytes(8 * 1000)
    path = tampered(model_file, tmp_path / "bad.npz", {"coef_": data})
    with pytest.raises(ValueError, match=r"entry 'coef_' declares an array of shape \(1, 18\)"
                       r".*but the member holds 8\d+ bytes"):
        load_model(path)
    data = npy_header((1, 18)) + bytes(8 * 10)
    path = tampered(model_file, tmp_path / "bad2.npz", {"coef_": data})
    with pytest.raises(ValueError, match="entry 'coef_' declares"):
        load_model(path)
    # A declared petabyte is refused from the header, without trying to allocate it.
    data = npy_header((10**8, 10**8)) + bytes(8 * 18)
    path = tampered(model_file, tmp_path / "bad3.npz", {"coef_": data})
    with pytest.raises(ValueError, match=r"entry 'coef_' declares an array of shape "
                       r"\(100000000, 100000000\)"):
        load_model(path)


def test_huge_declared_text_is_refused(model_file, tmp_path):
    data = npy_header((), descr="<U100000000")
    path = tampered(model_file, tmp_path / "bad.npz", {"params": data})
    # The header's size claim is checked against the zip directory first...
    with pytest.raises(ValueError, match="entry 'params' declares"):
        load_model(path)
    # ... and an honest but absurd text is refused by its length.
    path = tampered(model_file, tmp_path / "bad2.npz", {"params": np.str_("x" * 70000)})
    with pytest.raises(ValueError, match="entry 'params' must be a text of at most 65536"):
        load_model(path)


def test_model_larger_than_the_memory_budget_is_refused(model_file, tmp_path, monkeypatch):
    from sklearn_linattn import _memory

    monkeypatch.setattr(_memory, "default_memory_budget", lambda: 100)
    with pytest.raises(ValueError, match=r"'n_features_in_', 'n_outputs_', 'n_heads_'\) "
                       r"needs .* GiB, more than the memory budget"):
        load_model(model_file)


def test_object_arrays_are_refused_without_mentioning_pickle_loading(model_file, tmp_path):
    data = npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True)
    path = tampered(model_file, tmp_path / "bad.npz", {"coef_": data})
    with pytest.raises(ValueError, match="entry 'coef_' holds an array of dtype object") as info:
        load_model(path)
    assert "allow_pickle" not in str(info.value)
    structured = np.zeros(2, dtype=[("a", "<f8")])
    path = tampered(model_file, tmp_path / "bad2.npz", {"coef_": structured})
    with pytest.raises(ValueError, match="entry 'coef_' holds an array of dtype"):
        load_model(path)


@pytest.mark.parametrize("cut", [0.3, 0.7, 0.99])
def test_truncated_file_is_a_value_error(model_file, tmp_path, cut):
    raw = model_file.read_bytes()
    path = tmp_path / "cut.npz"
    path.write_bytes(raw[: int(cut * len(raw))])
    with pytest.raises(ValueError, match=r"cut\.npz"):
        load_model(path)


def test_corrupt_member_data_is_a_value_error(model_file, tmp_path):
    # Flip bytes inside the compressed stream of coef_ (its CRC or inflate fails).
    with zipfile.ZipFile(model_file) as zf:
        info = zf.getinfo("coef_.npy")
    raw = model_file.read_bytes()
    # The local header's name and extra-field lengths (they may differ from the
    # central directory's).
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:
                                                   info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    for offset in (info.compress_size // 2, info.compress_size - 6):
        flipped = bytearray(raw)
        flipped[start + offset] ^= 0xFF
        path = tmp_path / "flip.npz"
        path.write_bytes(bytes(flipped))
        with pytest.raises(ValueError, match=r"flip\.npz: entry 'coef_' "):
            load_model(path)


def test_other_kinds_of_file_are_value_errors(fitted, tmp_path):
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"single\.npy is a single \.npy array"):
        load_model(tmp_path / "single.npy")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match=r"text\.npz is not a readable \.npz file") as info:
        load_model(tmp_path / "text.npz")
    assert "pickle" not in str(info.value)
    with pytest.raises(ValueError, match="is a directory"):
        load_model(tmp_path)
    write_zip(tmp_path / "notnpy.npz", [("format", b"hello")])
    with pytest.raises(ValueError, match="entry 'format' is not a .npy array"):
        load_model(tmp_path / "notnpy.npz")
    np.savez(tmp_path / "data.npz", X=np.ones((3, 4, 2)))
    with pytest.raises(ValueError, match="not a sklearn-linattn model file.*no entry 'format'"):
        load_model(tmp_path / "data.npz")
    with pytest.raises(FileNotFoundError, match="no such model file"):
        load_model(tmp_path / "missing.npz")
    with pytest.raises(TypeError, match="path must be a file name"):
        load_model(42)


def test_save_model_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(TypeError, match="fitted LinearAttentionRegressor"):
        save_model("not a model", tmp_path / "x.npz")
    X = np.random.default_rng(0).normal(size=(40, 4, 2))
    model = LinearAttentionRegressor(random_state=np.random.RandomState(0)).fit(X, X[:, -1, 0])
    save_model(model, tmp_path / "m.npz")  # a RandomState is stored as None
    assert load_model(tmp_path / "m.npz").random_state is None
    model.set_params(tol=[1e-8])
    with pytest.raises(TypeError, match=r"parameter tol=\[1e-08\] of type list"):
        save_model(model, tmp_path / "m2.npz")


def test_attention_coefficients_of_loaded_heads_match_coef(model_file):
    loaded = load_model(model_file)
    np.testing.assert_allclose(
        attention_coefficients(loaded.value_matrices_, loaded.key_query_matrices_),
        loaded.coef_, atol=1e-10 * np.abs(loaded.coef_).max(),
    )


def test_a_loaded_model_predicts_in_its_standardized_coordinates(tmp_path):
    """Badly scaled units: the loaded model predicts as the fitted one (standardized heads)."""
    rng = np.random.default_rng(50)
    V, Q = rng.normal(size=(2, 1, 3)), rng.normal(size=(2, 3, 3))
    A = np.linalg.qr(rng.normal(size=(3, 3)))[0] @ np.diag([1e3, 1.0, 1e-3])
    X = rng.normal(size=(80, 5, 3))
    y = mhla_forward(X, V, Q)[:, 0]
    model = LinearAttentionRegressor().fit(X @ A, y)
    path = tmp_path / "units.npz"
    save_model(model, path)
    loaded = load_model(path)
    X_new = rng.normal(size=(6, 8, 3))
    np.testing.assert_array_equal(loaded.predict(X_new @ A), model.predict(X_new @ A))
    truth = mhla_forward(X_new, V, Q)[:, 0]
    assert np.abs(loaded.predict(X_new @ A) - truth).max() <= 1e-8 * np.abs(truth).max()
    assert loaded.standardization_ == model.standardization_


@pytest.mark.parametrize("key, value, match", [
    ("standardization_exponents", np.array([0.5, 0.0, 0.0]), "must hold integers"),
    ("standardization_exponents", np.array([5000.0, 0.0, 0.0]), "must hold integers"),
    ("standardization_whitening", np.zeros((3, 3)), "invertible"),
    ("standardized_coef", None, "disagree"),
])
def test_tampered_standardization_is_refused(fitted, model_file, tmp_path, key, value, match):
    if value is None:
        with np.load(model_file) as data:
            value = data[key] * 1.5
    path = tampered(model_file, tmp_path / "bad.npz", {key: value})
    with pytest.raises(ValueError, match=f"entr(y|ies) .*{match}|{match}"):
        load_model(path)


def test_a_term_the_parameters_do_not_have_is_refused(tmp_path):
    X = np.random.default_rng(0).normal(size=(40, 4, 2))
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
    path = tmp_path / "model.npz"
    save_model(LinearAttentionRegressor().fit(X, y), path)
    bad = tampered(path, tmp_path / "bad.npz", {"intercept_": np.array([0.5])})
    with pytest.raises(ValueError, match="'intercept_' is not zero, but the parameters say "
                       "fit_intercept=False"):
        load_model(bad)
