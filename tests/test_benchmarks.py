"""Smoke test of the benchmark harness (``python -m benchmarks --quick``).

Runs the documented command on tiny sizes and checks the markdown it writes.
Nothing here asserts a time, a ratio or a memory figure.
"""

import datetime
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ROWS = ("gram", "adam", "samples", "memory", "cg", "array_api")

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


def test_dense_extremes_script_runs():
    """``benchmarks/dense_extremes.py`` on a tiny size (it once used internals that were gone)."""
    out = subprocess.run(
        [sys.executable, "benchmarks/dense_extremes.py", "--d", "3", "--n-samples", "200",
         "--n-tokens", "4", "--repeats", "1"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    row = out.stdout.strip().splitlines()[-1].split()
    assert row[:2] == ["3", "18"]  # d, psi


def test_row_notes_are_kept_in_the_report():
    """A row's hand-written note follows its details in a full report, not in a quick one."""
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from benchmarks.report import render_markdown, row_note
    finally:
        sys.path.remove(str(REPO_ROOT))
    note = row_note("gram")
    assert note  # benchmarks/notes/gram.md
    info = dict(load_average=None, threads=1, cpu_model="cpu", logical_cores=1, usable_cores=1,
                mem_total=None, mem_available=None, platform="p", python="3", versions={},
                threadpools=[])
    common = dict(info=info, command="c", started=datetime.datetime.now().astimezone(),
                  seconds=1.0, commit=None, descriptions={"gram": "What the row measures."})
    full = render_markdown([], quick=False, **common)
    assert "Measured apart from this run (`benchmarks/notes/gram.md`)" in full
    assert note in full
    assert note not in render_markdown([], quick=True, **common)


def test_fit_path_counts_the_stays_of_a_fit(capsys):
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from benchmarks import fit_path
    finally:
        sys.path.remove(str(REPO_ROOT))
    fit_path.main(["--case", "none", "--path"])
    out = capsys.readouterr().out
    total = int(out.split(" stays")[0])
    assert total > 10
    assert "sklearn_linattn._estimators" in out and "_model" in out.splitlines()[-1]
