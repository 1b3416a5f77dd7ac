"""Without PyTorch, what needs it is skipped, not an error: run with torch blocked."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Blocks torch (find_spec raises, imports fail) before pytest loads the conftest.
_RUN_WITHOUT_TORCH = (
    "import sys; sys.modules['torch'] = None; import pytest; "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


def _pytest_without_torch(*args):
    return subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_TORCH, "-q", "-rs", "-p", "no:cacheprovider",
         *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def test_files_that_need_torch_skip_when_named_on_the_command_line():
    # Regression: named explicitly, nn.py and _torch_reader.py were imported
    # for their doctests (a collection error) and doc/torch.rst ran (failed).
    proc = _pytest_without_torch("sklearn_linattn/nn.py", "sklearn_linattn/_torch_reader.py",
                                 "doc/torch.rst", "tests/test_torch.py")
    out = proc.stdout + proc.stderr
    # Every collector skipped: no test ran, none failed (pytest's exit code 5).
    assert proc.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, out
    assert "5 skipped" in out, out
    for name in ("nn.py", "_torch_reader.py", "torch.rst"):
        assert f"{name} needs PyTorch, which is not installed" in out, out
    assert "could not import 'torch'" in out  # test_torch.py's importorskip
    assert "error" not in out.lower().replace("errors", ""), out


def test_collecting_the_user_guide_without_torch_has_no_error():
    proc = _pytest_without_torch("--co", "doc")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "torch.rst" not in out.replace("torch.rst needs PyTorch", "")
    assert "quickstart.rst" in out
