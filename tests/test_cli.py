"""The command line, end to end on files."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sklearn_linattn
from sklearn_linattn import load_model, mhla_forward
from sklearn_linattn import __main__ as cli
from sklearn_linattn.__main__ import main
from sklearn_linattn.datasets import make_associative_memory, make_random_mhla

DOC = Path(__file__).resolve().parents[1] / "doc" / "cli.rst"


def strict_json(text):
    """Parse JSON as the standard defines it (no NaN or Infinity)."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def last_line(text):
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture
def data_file(tmp_path):
    X, y, params = make_random_mhla(
        300, 8, 3, n_heads=2, variable_length=(3, 8), random_state=0, return_params=True
    )
    path = tmp_path / "data.npz"
    np.savez(path, X=X, y=y)
    return path, X, y, params


@pytest.fixture
def memory_files(tmp_path):
    X_ok, y_ok = make_associative_memory(600, 2, distribution="gaussian", random_state=0)
    X_bad, y_bad = make_associative_memory(600, 2, distribution="orthonormal", random_state=0)
    np.savez(tmp_path / "ok.npz", X=X_ok, y=y_ok)
    np.savez(tmp_path / "bad.npz", X=X_bad, y=y_bad)
    return tmp_path / "ok.npz", tmp_path / "bad.npz"


def test_fit_then_predict_round_trip(data_file, tmp_path, capsys):
    path, X, y, params = data_file
    model_path = tmp_path / "model.npz"
    assert main(["fit", str(path), "-o", str(model_path), "--n-heads", "2",
                 "--random-state", "0", "--json"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["n_heads"] == 2 and report["feature_rank"] == 18
    assert report["train_r2"] == pytest.approx(1.0, abs=1e-10)

    pred_path = tmp_path / "pred.npy"
    assert main(["predict", str(model_path), str(path), "-o", str(pred_path)]) == 0
    pred = np.load(pred_path)
    np.testing.assert_allclose(pred, y, rtol=1e-8, atol=1e-12)

    X_long = np.random.default_rng(1).normal(size=(4, 30, 3))
    np.savez(tmp_path / "long.npz", X=X_long)
    capsys.readouterr()
    assert main(["predict", str(model_path), str(tmp_path / "long.npz"), "--json"]) == 0
    out = np.array(strict_json(capsys.readouterr().out)["predictions"])
    expected = mhla_forward(X_long, params["V"], params["Q"])[:, 0]
    np.testing.assert_allclose(out, expected, rtol=1e-8)


def test_text_output_and_progress_on_stderr(data_file, tmp_path, capsys):
    path = data_file[0]
    assert main(["fit", str(path), "-o", str(tmp_path / "m")]) == 0
    captured = capsys.readouterr()
    assert "model written to" in captured.out and str(tmp_path / "m.npz") in captured.out
    assert "[LinearAttentionRegressor] least squares" in captured.err
    assert "fitting 300 sequences of up to 8 tokens (d = 3, psi = 18 features)..." in captured.err
    assert re.search(r"done in \d+\.\d+ s", captured.err)
    assert (tmp_path / "m.npz").exists()
    assert main(["fit", str(path), "-o", str(tmp_path / "m"), "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_model_file_needs_no_pickle(data_file, tmp_path):
    path = data_file[0]
    main(["fit", str(path), "-o", str(tmp_path / "m.npz"), "-q"])
    with np.load(tmp_path / "m.npz", allow_pickle=False) as data:
        assert all(data[k].dtype != object for k in data.files)


def test_saved_model_is_quiet(data_file, tmp_path, capsys):
    # fit prints progress (verbose=1); the model it writes must not keep printing.
    path, X, y, _ = data_file
    assert main(["fit", str(path), "-o", str(tmp_path / "m.npz")]) == 0
    capsys.readouterr()
    model = load_model(tmp_path / "m.npz")
    assert model.verbose == 0
    model.fit(X, y)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["fit", "missing.npz"], "no such file: missing.npz"),
        (["fit", "{noy}"], "has no array named 'y'"),
        (["fit", "{bad}"], "X must be a 3-D array"),
        (["fit", "{text}"], "is not a readable .npz file"),
        (["fit", "{single}"], "is a single .npy array"),
        (["fit", "{objects}"], "entry 'X' holds an array of dtype object"),
        (["certify", "{text}"], "is not a readable .npz file"),
        (["predict", "{noy}", "{noy}"], "is not a sklearn-linattn model file"),
        (["predict", "missing_model.npz", "{noy}"], "no such model file"),
        (["predict", "{text}", "{noy}"], "is not a readable .npz file"),
    ],
)
def test_errors_a_shell_user_understands(tmp_path, capsys, monkeypatch, argv_tail, message):
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "noy.npz", X=np.ones((3, 4, 2)))
    np.savez(tmp_path / "bad.npz", X=np.ones(3), y=np.ones(3))
    (tmp_path / "text.npz").write_text("not an archive")
    np.save(tmp_path / "single.npy", np.ones((3, 4, 2)))
    (tmp_path / "single.npy").rename(tmp_path / "single.npz")
    np.savez(tmp_path / "objects.npz", X=np.array([None, 1], dtype=object), y=np.ones(2))
    names = {k: str(tmp_path / f"{k}.npz") for k in ("noy", "bad", "text", "single", "objects")}
    argv = [a.format(**names) for a in argv_tail]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert last_line(err).startswith("error: ") and message in last_line(err)
    assert err.count("error: ") == 1
    # numpy's advice for such files is to load pickles, which is unsafe.
    assert "allow_pickle" not in err and "pickled" not in err


def test_usage_errors_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit"])
    assert info.value.code == 2
    assert main(["demo", "--d", "0"]) == 2
    assert "--d must be an integer >= 1; got 0" in capsys.readouterr().err
    assert main(["demo", "--min-len", "9", "--max-len", "3"]) == 2
    assert "--min-len (9) exceeds --max-len (3)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, option", [
    (["certify", "{data}", "--tol", "inf"], "--tol"),  # reproducer: exited 1
    (["certify", "{data}", "--tol", "nan"], "--tol"),
    (["certify", "{data}", "--tol", "-0.001"], "--tol"),
    (["certify", "{data}", "--token-dim", "0"], "--token-dim"),
    (["fit", "{data}", "--alpha", "inf"], "--alpha"),
    (["fit", "{data}", "--alpha", "nan"], "--alpha"),
    (["fit", "{data}", "--alpha", "1e400"], "--alpha"),  # overflows to inf
    (["fit", "{data}", "--alpha", "-5"], "--alpha"),
    (["fit", "{data}", "--n-heads", "-2"], "--n-heads"),
    (["fit", "{data}", "--random-state", "-1"], "--random-state"),
    (["fit", "{data}", "--random-state", "4294967296"], "--random-state"),
    (["fit", "{data}", "--token-dim", "0"], "--token-dim"),
    (["demo", "--seed", "-1"], "--seed"),  # reproducer: exited 1
    (["demo", "--seed", "4294967296", "--d", "2"], "--seed"),  # exited 1 after the work
    (["demo", "--heads", "0"], "--heads"),
    (["demo", "--n-samples", "-4"], "--n-samples"),
    (["demo", "--min-len", "0"], "--min-len"),
    (["demo", "--max-len", "0"], "--max-len"),
])
def test_option_values_out_of_range_exit_2_before_any_work(tmp_path, capsys, argv, option):
    # The data file does not exist: the options are checked before it is read.
    argv = [a.format(data=tmp_path / "nothing.npz") for a in argv]
    assert main(argv + ["-q"]) == cli.EXIT_USAGE == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {option} must be ")
    assert "nothing.npz" not in err


def test_fit_with_n_heads_auto_keeps_the_fewest_heads(data_file, tmp_path, capsys):
    path, X, y, params = data_file  # a two-head teacher
    model_path = tmp_path / "model.npz"
    assert main(["fit", str(path), "-o", str(model_path), "--n-heads", "auto",
                 "--random-state", "0", "--json"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["n_heads"] == 2
    assert report["train_r2"] == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("argv", [
    ["certify", "data.npz", "--tol", "abc"],
    ["fit", "data.npz", "--n-heads", "1.5"],
    ["fit", "data.npz", "--n-heads", "fewest"],
    ["fit", "data.npz", "--alpha", "one"],
    ["demo", "--seed", "0x10"],
])
def test_option_values_of_the_wrong_type_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "invalid" in capsys.readouterr().err


def test_every_numeric_option_has_a_range():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    numeric = {action.dest for sub in subparsers.values() for action in sub._actions
               if action.type in (int, float, cli._n_heads_option)}
    assert numeric == set(cli._NUMERIC_OPTIONS)


def test_invalid_fit_options_are_refused_before_reading_the_data(tmp_path, capsys):
    # The data file does not even exist: the options are checked first.
    assert main(["fit", str(tmp_path / "nothing.npz"), "--alpha", "-5"]) == 2
    err = capsys.readouterr().err
    assert last_line(err).startswith("error: ") and "alpha" in err and "nothing" not in err


def test_output_location_is_checked_before_fitting(data_file, tmp_path, capsys):
    path = data_file[0]
    target = tmp_path / "no" / "such" / "dir" / "m.npz"
    assert main(["fit", str(path), "-o", str(target)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the model to") and "does not exist" in err
    assert "fitting" not in err  # refused before the (possibly long) fit
    (tmp_path / "taken.npz").mkdir()
    assert main(["fit", str(path), "-o", str(tmp_path / "taken")]) == 1
    assert "taken.npz: it is a directory" in capsys.readouterr().err

    main(["fit", str(path), "-o", str(tmp_path / "m.npz"), "-q"])
    assert main(["predict", str(tmp_path / "m.npz"), str(path), "-o",
                 str(tmp_path / "none" / "p")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the predictions to") and "p.npy" in err


def test_demo_too_large_says_what_fits(capsys):
    assert main(["demo", "--d", "300"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: demo --d 300 needs about")
    assert "psi = 13545000 features" in err and "memory budget" in err
    largest = int(re.search(r"the largest --d that fits with these options is (\d+)",
                            err).group(1))
    assert 8 <= largest < 300


def test_demo_size_estimate_matches_the_budget(monkeypatch, capsys):
    from sklearn_linattn import _memory

    budget = 2 * 2**30
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: budget)
    assert main(["demo", "--d", "40", "-q"]) == 2
    largest = int(re.search(r"is (\d+)\.", capsys.readouterr().err).group(1))
    assert cli._demo_bytes(largest, 2, None, 16) <= budget
    assert cli._demo_bytes(largest + 1, 2, None, 16) > budget
    # The estimate covers what the default d = 8 really needs, by a wide margin
    # for the dense statistics (psi = 288: 2.2 MB).
    assert cli._demo_bytes(8, 2, None, 16) > 3.25 * 8 * 288**2
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: 1000)
    assert main(["demo", "--d", "2", "-q"]) == 2
    assert "no --d fits with these options" in capsys.readouterr().err


def test_demo_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "sklearn_linattn", "demo", "--d", "3", "--heads", "2"],
        capture_output=True, text=True, timeout=600, check=True,
    )
    out = result.stdout
    assert "heads from the SVD" in out and "heads after compression: 2" in out
    err = float(out.split("out-of-distribution relative error:")[1].split()[0])
    assert err < 1e-8
    assert "fitting the closed form (72 sequences, psi = 18 features)..." in result.stderr


def test_certify_text_json_and_check(memory_files, capsys):
    ok, bad = memory_files
    assert main(["certify", str(ok)]) == 0
    assert capsys.readouterr().out.startswith("Identifiability certificate: IDENTIFIABLE")

    assert main(["certify", str(bad), "--json"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["identifiable"] is False
    assert report["rank"] < report["n_features"] == 4 * 4 * 5 // 2
    assert report["n_samples"] == 600 and report["tol"] > 0

    # "Not identifiable" and "could not run" are different answers.
    assert main(["certify", str(bad), "--check"]) == cli.EXIT_NOT_IDENTIFIABLE == 3
    assert main(["certify", str(ok), "--check"]) == 0
    assert main(["certify", str(ok.parent / "missing.npz"), "--check"]) == 1


def test_certify_shows_progress_and_keeps_stdout_json(memory_files, capsys):
    ok = memory_files[0]
    assert main(["certify", str(ok), "--json"]) == 0
    captured = capsys.readouterr()
    strict_json(captured.out)
    assert "certifying 600 sequences of up to 3 tokens (d = 4, psi = 40 features)..." in (
        captured.err)
    assert re.search(r"done in \d+\.\d+ s", captured.err)
    assert main(["certify", str(ok), "--json", "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_fit_reports_the_certificate_verdict(memory_files, tmp_path, capsys):
    ok, bad = memory_files
    model = str(tmp_path / "model.npz")
    assert main(["fit", str(ok), "-o", model, "-q"]) == 0
    assert "certificate: identifiable" in capsys.readouterr().out
    assert main(["fit", str(bad), "-o", model, "-q"]) == 0
    assert "certificate: NOT identifiable: rank 36 of 40" in capsys.readouterr().out
    assert main(["fit", str(bad), "-o", model, "-q", "--json"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["identifiable"] is False and report["feature_rank"] == 36
    assert main(["fit", str(ok), "-o", model, "-q", "--json"]) == 0
    assert strict_json(capsys.readouterr().out)["identifiable"] is True


def test_predict_json_is_valid_json_with_padding(tmp_path, capsys):
    # readout="all" predictions are NaN at padded positions: null, not NaN.
    X, y = make_random_mhla(200, 6, 2, readout="all", variable_length=(2, 6), random_state=0)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    assert main(["fit", str(tmp_path / "d.npz"), "--readout", "all", "-q",
                 "-o", str(tmp_path / "m.npz")]) == 0
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "m.npz"), str(tmp_path / "d.npz"), "--json"]) == 0
    pred = strict_json(capsys.readouterr().out)["predictions"]
    padded = np.isnan(y)
    assert padded.any()
    assert all((v is None) == padded[i, t] for i, row in enumerate(pred)
               for t, v in enumerate(row))
    got = np.array([[np.nan if v is None else v for v in row] for row in pred])
    np.testing.assert_allclose(got[~padded], y[~padded], rtol=1e-6, atol=1e-9)


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sklearn-linattn {sklearn_linattn.__version__}"


def test_usage_names_the_program_that_ran(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: sklearn-linattn ")
    result = subprocess.run([sys.executable, "-m", "sklearn_linattn", "certify", "--help"],
                            capture_output=True, text=True, timeout=600, check=True)
    assert result.stdout.startswith("usage: python -m sklearn_linattn certify ")


def test_console_script_names_itself():
    script = Path(sys.executable).parent / "sklearn-linattn"
    if not script.exists():
        pytest.skip("the package is not installed with its console script")
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                            timeout=600, check=True)
    assert result.stdout.startswith("usage: sklearn-linattn ")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                            timeout=600, check=True)
    assert result.stdout.strip() == f"sklearn-linattn {sklearn_linattn.__version__}"


def test_exit_codes_are_documented_everywhere(capsys):
    codes = {cli.EXIT_OK, cli.EXIT_INPUT, cli.EXIT_USAGE, cli.EXIT_NOT_IDENTIFIABLE,
             cli.EXIT_INTERNAL, cli.EXIT_INTERRUPTED}
    assert codes == {0, 1, 2, 3, 4, 130}
    with pytest.raises(SystemExit):
        main(["certify", "--help"])
    help_text = capsys.readouterr().out
    epilog = help_text.split("exit status:")[1]
    docs = DOC.read_text()
    for code in codes:
        assert re.search(rf"^- {code}: ", cli.__doc__, re.M), code
        assert re.search(rf"^  {code} +\S", epilog, re.M), code
        assert re.search(rf"^``{code}``", docs, re.M), code


@pytest.mark.parametrize(
    "exception, status, message",
    [
        (RuntimeError("solver broke"), 4, "error: internal error (RuntimeError: solver broke)"),
        (MemoryError(), 1, "error: not enough memory for certify"),
        (ValueError("first line\n  second line"), 1, "error: first line second line"),
        (OSError(28, "No space left on device"), 1, "error: [Errno 28] No space left"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_every_failure_is_one_line_with_its_status(memory_files, monkeypatch, capsys,
                                                   exception, status, message):
    def fail(*args, **kwargs):
        raise exception

    monkeypatch.setattr(sklearn_linattn, "certify_identifiability", fail)
    assert main(["certify", str(memory_files[0]), "-q"]) == status
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message)
    assert "Traceback" not in err


def test_failure_while_saving_is_one_line(data_file, tmp_path, monkeypatch, capsys):
    def no_space(model, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(sklearn_linattn, "save_model", no_space)
    assert main(["fit", str(data_file[0]), "-o", str(tmp_path / "m.npz"), "-q"]) == 1
    assert capsys.readouterr().err.startswith("error: [Errno 28] No space left on device")


def test_warnings_are_one_line_on_stderr(memory_files, monkeypatch, capsys):
    import warnings

    real = sklearn_linattn.certify_identifiability

    def warn_then_certify(*args, **kwargs):
        warnings.warn("something to know\nacross two lines", UserWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(sklearn_linattn, "certify_identifiability", warn_then_certify)
    assert main(["certify", str(memory_files[0]), "-q", "--json"]) == 0
    captured = capsys.readouterr()
    strict_json(captured.out)
    assert captured.err == "warning: something to know across two lines\n"


def test_fit_and_certify_with_intercept_and_skip(tmp_path, capsys):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, 5, 2))
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + 2.0 - 3.0 * X[:, -1, 1]
    np.savez(tmp_path / "data.npz", X=X, y=y)
    model_path = tmp_path / "model.npz"
    assert main(["fit", str(tmp_path / "data.npz"), "-o", str(model_path), "--fit-intercept",
                 "--fit-skip", "--json"]) == 0
    report = strict_json(capsys.readouterr().out)
    assert report["identifiable"] and report["train_r2"] == pytest.approx(1.0, abs=1e-10)
    model = load_model(model_path)
    np.testing.assert_allclose(model.intercept_, [2.0], atol=1e-9)
    np.testing.assert_allclose(model.skip_coef_, [[0.0, -3.0]], atol=1e-9)
    assert main(["certify", str(tmp_path / "data.npz"), "--fit-skip", "--json"]) == 0
    assert strict_json(capsys.readouterr().out)["n_features"] == 6 + 2
