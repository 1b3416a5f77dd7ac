"""The command line, end to end on files."""

import json
import subprocess
import sys

import numpy as np
import pytest

from sklearn_linattn import load_model, mhla_forward, save_model
from sklearn_linattn.__main__ import main
from sklearn_linattn.datasets import make_random_mhla


@pytest.fixture
def data_file(tmp_path):
    X, y, params = make_random_mhla(
        300, 8, 3, n_heads=2, variable_length=(3, 8), random_state=0, return_params=True
    )
    path = tmp_path / "data.npz"
    np.savez(path, X=X, y=y)
    return path, X, y, params


def test_fit_then_predict_round_trip(data_file, tmp_path, capsys):
    path, X, y, params = data_file
    model_path = tmp_path / "model.npz"
    assert main(["fit", str(path), "-o", str(model_path), "--n-heads", "2",
                 "--random-state", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
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
    out = np.array(json.loads(capsys.readouterr().out)["predictions"])
    expected = mhla_forward(X_long, params["V"], params["Q"])[:, 0]
    np.testing.assert_allclose(out, expected, rtol=1e-8)


def test_text_output_and_progress_on_stderr(data_file, tmp_path, capsys):
    path = data_file[0]
    assert main(["fit", str(path), "-o", str(tmp_path / "m")]) == 0
    captured = capsys.readouterr()
    assert "model written to" in captured.out and str(tmp_path / "m.npz") in captured.out
    assert "[LinearAttentionRegressor] least squares" in captured.err
    assert (tmp_path / "m.npz").exists()


def test_model_file_needs_no_pickle(data_file, tmp_path):
    path = data_file[0]
    main(["fit", str(path), "-o", str(tmp_path / "m.npz"), "-q"])
    with np.load(tmp_path / "m.npz", allow_pickle=False) as data:
        assert all(data[k].dtype != object for k in data.files)


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["fit", "missing.npz"], "no such file: missing.npz"),
        (["fit", "{noy}"], "has no array named 'y'"),
        (["fit", "{bad}"], "X must be a 3-D array"),
        (["fit", "{text}"], "is not a readable .npz file"),
        (["predict", "{noy}", "{noy}"], "is not a sklearn-linattn model file"),
        (["predict", "missing_model.npz", "{noy}"], "no such model file"),
    ],
)
def test_errors_a_shell_user_understands(tmp_path, capsys, monkeypatch, argv_tail, message):
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "noy.npz", X=np.ones((3, 4, 2)))
    np.savez(tmp_path / "bad.npz", X=np.ones(3), y=np.ones(3))
    (tmp_path / "text.npz").write_text("not an archive")
    names = {k: str(tmp_path / f"{k}.npz") for k in ("noy", "bad", "text")}
    argv = [a.format(**names) for a in argv_tail]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["fit"])
    assert info.value.code == 2
    assert main(["demo", "--d", "0"]) == 2
    assert "--d must be at least 1" in capsys.readouterr().err


def test_load_model_rejects_inconsistent_file(data_file, tmp_path):
    path, X, y, _ = data_file
    from sklearn_linattn import LinearAttentionRegressor

    model = LinearAttentionRegressor().fit(X, y)
    save_model(model, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as data:
        entries = dict(data)
    entries["value_matrices_"] = entries["value_matrices_"][:, :, :2]
    np.savez(tmp_path / "broken.npz", **entries)
    with pytest.raises(ValueError, match="inconsistent"):
        load_model(tmp_path / "broken.npz")
    with pytest.raises(TypeError, match="fitted LinearAttentionRegressor"):
        save_model("not a model", tmp_path / "x.npz")


def test_demo_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "sklearn_linattn", "demo", "--d", "3", "--heads", "2"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    out = result.stdout
    assert "heads from the SVD" in out and "heads after compression: 2" in out
    err = float(out.split("out-of-distribution relative error:")[1].split()[0])
    assert err < 1e-8


def test_certify_text_json_and_check(tmp_path, capsys):
    from sklearn_linattn.datasets import make_associative_memory

    X_ok, _ = make_associative_memory(600, 2, distribution="gaussian", random_state=0)
    X_bad, _ = make_associative_memory(600, 2, distribution="orthonormal", random_state=0)
    np.savez(tmp_path / "ok.npz", X=X_ok)
    np.savez(tmp_path / "bad.npz", X=X_bad)

    assert main(["certify", str(tmp_path / "ok.npz")]) == 0
    assert capsys.readouterr().out.startswith("Identifiability certificate: IDENTIFIABLE")

    assert main(["certify", str(tmp_path / "bad.npz"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identifiable"] is False
    assert report["rank"] < report["n_features"] == 4 * 4 * 5 // 2
    assert report["n_samples"] == 600 and report["tol"] > 0

    assert main(["certify", str(tmp_path / "bad.npz"), "--check"]) == 1
    assert main(["certify", str(tmp_path / "ok.npz"), "--check"]) == 0
