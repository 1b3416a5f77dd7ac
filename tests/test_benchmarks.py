"""Smoke test of the benchmark harness (``python -m benchmarks --quick``).

Runs the documented command on tiny sizes and checks the markdown it writes.
Nothing here asserts a time, a ratio or a memory figure.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ROWS = ("gram", "adam", "samples", "memory", "cg")

pytestmark = pytest.mark.skipif(
    not (REPO_ROOT / "benchmarks" / "__main__.py").exists(),
    reason="the benchmarks/ folder is not part of this checkout",
)


def run_harness(*args):
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--threads", "1", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )


def results_table(text):
    """The lines of the results table, header and separator excluded."""
    section = text.split("## Results", 1)[1].split("## Details", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_quick_run_writes_markdown(tmp_path):
    output = tmp_path / "bench.md"
    proc = run_harness("--output", str(output))
    assert proc.returncode == 0, proc.stderr
    text = output.read_text()
    assert text.startswith("# Benchmarks")
    assert "Quick mode" in text
    # Machine and run information.
    for heading in ("## How to run", "## Run", "## Machine", "## Results", "## Details"):
        assert heading in text
    assert "- Command: `python -m benchmarks --quick --threads 1 --output" in text
    assert "limited to 1 with `threadpoolctl.threadpool_limits`" in text
    assert re.search(r"- CPU: .+; \d+ logical cores", text)
    assert "numpy " in text and "scipy " in text and "scikit-learn " in text
    assert "| user_api | internal_api |" in text
    # One or more lines per row, each with a status, none failed.
    rows = results_table(text)
    for name in ROWS:
        assert any(line.startswith(f"| `{name}`") for line in rows), name
    statuses = [line.rstrip(" |").rsplit("|", 1)[1].strip() for line in rows]
    assert "ERROR" not in statuses
    assert set(statuses) <= {"reported", "n/a (quick)", "not available"}
    # A row whose solver or method is missing says so instead of failing.
    for line in rows:
        if line.endswith("| not available |"):
            assert "not available:" in line
    # The printed table is the written one.
    assert proc.stdout.strip() == text.strip()


def test_only_and_skip_select_rows(tmp_path):
    output = tmp_path / "bench.md"
    proc = run_harness("--only", "gram", "cg", "--skip", "cg", "--output", str(output))
    assert proc.returncode == 0, proc.stderr
    rows = results_table(output.read_text())
    assert rows and all(line.startswith("| `gram`") for line in rows)


def test_unknown_row_is_an_error():
    proc = run_harness("--only", "nonsense", "--output", "-")
    assert proc.returncode != 0
    assert "nonsense" in proc.stderr
