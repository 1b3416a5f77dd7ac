"""Machine information and the markdown report."""

import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

import numpy
import scipy
import sklearn
import threadpoolctl

import sklearn_linattn

from .measure import GB, usable_cores

__all__ = ["git_commit", "machine_info", "parse_report", "render_markdown"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def _read_first(path, prefix):
    """Value after ``:`` on the first line of ``path`` starting with ``prefix``."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _meminfo_bytes(key):
    value = _read_first("/proc/meminfo", key + ":")
    return None if value is None else int(value.split()[0]) * 1024


def machine_info(threads):
    """Facts about this machine and run that the numbers depend on.

    Call it inside the ``threadpool_limits`` context of the run, so that the
    BLAS entries show the thread counts actually used.

    Parameters
    ----------
    threads : int
        Thread limit applied with threadpoolctl.

    Returns
    -------
    info : dict
    """
    return {
        "cpu_model": _read_first("/proc/cpuinfo", "model name") or platform.processor()
        or "unknown",
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "mem_total": _meminfo_bytes("MemTotal"),
        "mem_available": _meminfo_bytes("MemAvailable"),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "numpy": numpy.__version__,
            "scipy": scipy.__version__,
            "scikit-learn": sklearn.__version__,
            "threadpoolctl": threadpoolctl.__version__,
            "sklearn-linattn": sklearn_linattn.__version__,
        },
        "threadpools": threadpoolctl.threadpool_info(),
        "threads": threads,
    }


def git_commit():
    """``(commit, n_modified)`` of the repository, or None outside a git checkout.

    Read-only: ``--no-optional-locks`` keeps ``git status`` from touching the
    index.
    """
    def git(*args):
        out = subprocess.run(
            ["git", "--no-optional-locks", *args], cwd=REPO_ROOT, capture_output=True,
            text=True, timeout=30, check=True,
        )
        return out.stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        changed = [line for line in git("status", "--porcelain").splitlines() if line]
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, len(changed)


def _cell(text):
    """Text safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _gb(n_bytes):
    return "unknown" if n_bytes is None else f"{n_bytes / GB:.1f} GB"


HOW_TO_RUN = """\
## How to run

From a fresh clone, at the repository root:

```bash
pip install -e . && python -m benchmarks
```

This runs every row and rewrites this file; the total time of the run below is under "Run". The
`cg` row alone takes 10 to 20 minutes on 2 cores (its process is stopped after 30); leave it out
with `--skip cg`. The `gram` row takes about 15 minutes, most of them at d = 32 (a 2.7 GB feature
matrix; each d runs in a fresh process). The `adam` row takes about 5 minutes with PyTorch
installed, where it trains the paper's recipe in PyTorch (a run is stopped after 30 minutes), and
under a minute without it, where the package's numpy learner runs the recipe instead. Options:

- `--quick`: tiny sizes, a smoke test of the harness (targets are not judged; prints the table
  and writes no file unless `--output` is given).
- `--only ROW ...` / `--skip ROW ...`: run some rows (`gram`, `adam`, `samples`, `memory`, `cg`,
  `dask`, `cv`, `real`, `array_api`). Written into an existing report (this file by default), the rows run
  replace their lines and sections, and the other rows keep theirs: "Earlier runs" gives the date,
  command, commit and machine of the run each kept row comes from. `--replace` writes the rows run
  alone. The `dask` row needs the dask extra (`pip install -e ".[dask]"`); without it the row
  says "not available". The `real` row takes about 2 minutes on 2 cores; it needs the bench extra
  (`pip install -e ".[bench]"`, aeon) for aeon's data sets and the Rocket models, and without it
  those lines say "not available" and the digits run with the other models. The `array_api`
  row needs PyTorch (the torch extra); it runs its GPU cases where torch sees a CUDA device.
- `--output PATH`: where to write the markdown (default `benchmarks/README.md`; `-` for stdout only).
- `--threads N`: BLAS/OpenMP threads for the whole run, set with threadpoolctl (default: all usable
  cores).
- `--seed S`: seed of every random draw (default 0).
- `--gram-ds D ...`: the token dimensions of the `gram` row (default 4 8 16 32; d = 32 alone
  takes most of its time).

Each ratio is measured in one run: the quantity and its baseline run interleaved (best of several
repeats) on the same machine, so ratios are meaningful on a shared machine where absolute times are
noisy. Busy cores still distort multi-threaded BLAS calls unevenly: the load average of each row is
recorded under Details; for the steadiest numbers run on an idle machine (or with `--threads 1`). Memory rows run in a fresh process. Targets come from the issue; rows whose solver or method
does not exist yet print "not available" and fill in once it does. Every number below comes from the
run described in "Run" (or, for a row kept from an earlier run, from the one "Earlier runs" names
for it), except the paragraphs headed "Measured apart from this run" under Details: those come
from `benchmarks/notes/ROW.md`, written by hand, each number with the command and commit that
produced it. The file is generated, edit `benchmarks/report.py` (or a
note) instead.

The stand-alone scripts in this folder (`adam_vs_closed_form.py`, `certificate_lambda_min.py`, ...)
run on their own: `python benchmarks/adam_vs_closed_form.py --help`.
"""


def render_markdown(results, *, info, command, started, seconds, commit, quick,
                    descriptions, row_context=None, previous=None, row_order=None):
    """The report: how to run, run and machine facts, results table, details.

    With ``previous`` (the :func:`parse_report` of the file being
    rewritten), the rows that did not run now keep their results lines and
    Details sections from it, and "Earlier runs" says which run (date,
    command, commit, machine) each of them comes from.

    Parameters
    ----------
    results : list of Result
    info : dict
        From :func:`machine_info`.
    command : str
        The exact command line.
    started : datetime.datetime
        Start of the run (local time zone aware).
    seconds : float
        Total wall time of the run.
    commit : tuple or None
        From :func:`git_commit`.
    quick : bool
    descriptions : dict of str to str
        What each row that ran measures (its function's docstring).
    row_context : dict of str to dict or None
        Per row: ``seconds`` and ``load`` (1-minute load average before and
        after), from ``run_rows``.
    previous : dict or None
        :func:`parse_report` of the existing report: its rows that are not in
        ``descriptions`` are kept.
    row_order : list of str or None
        The order of the rows in the table and under Details (the rows of
        ``ROWS``); rows outside it follow, those run now first.

    Returns
    -------
    text : str
    """
    ran = list(descriptions)
    kept_blocks, kept_results, kept_details = _kept_parts(previous, ran)
    order = _row_order(row_order, ran, [row for block in kept_blocks for row in block["rows"]])
    kept = [row for row in order if row not in descriptions]
    lines = ["# Benchmarks", ""]
    quick_kept = [row for block in kept_blocks if block["quick"] for row in block["rows"]]
    if quick and kept:
        lines += [f"**Quick mode for the rows {_row_list(ran)} of the last run: tiny sizes, a "
                  "smoke test. These are not the benchmark's numbers and the targets are not "
                  "judged.**", ""]
    elif quick:
        lines += ["**Quick mode: tiny sizes, a smoke test. These are not the benchmark's "
                  "numbers and the targets are not judged.**", ""]
    if quick_kept:
        lines += [f"**The rows {_row_list(quick_kept)}, kept from an earlier run, come from a "
                  "quick run (tiny sizes, a smoke test; targets not judged).**", ""]
    lines += [HOW_TO_RUN, "## Run", ""]
    if kept:
        lines += [f"This run wrote the rows {_row_list(ran)}. The rows {_row_list(kept)} are "
                  "kept from earlier runs, each described under \"Earlier runs\" below.", ""]
    if commit is None:
        commit_text = "not a git checkout"
    else:
        commit_text = f"`{commit[0]}`" + (
            f" plus uncommitted changes ({commit[1]} paths in `git status`)" if commit[1]
            else " (clean)"
        )
    load = info["load_average"]
    lines += [
        f"- Date: {started.isoformat(timespec='seconds')}",
        f"- Command: `{command}`",
        f"- Rows: {_row_list(ran) or 'none'}",
        *([QUICK_MODE_LINE] if quick else []),
        f"- Git commit: {commit_text}",
        f"- Total wall time: {seconds / 60:.1f} min ({seconds:.0f} s)",
        f"- Threads: BLAS and OpenMP limited to {info['threads']} with "
        f"`threadpoolctl.threadpool_limits` for the whole run (child processes too)",
        "",
        "## Machine",
        "",
        f"- CPU: {info['cpu_model']}; {info['logical_cores']} logical cores, "
        f"{info['usable_cores']} usable by this process",
        f"- Memory: {_gb(info['mem_total'])} total, {_gb(info['mem_available'])} available "
        "at the start",
        "- Load average at the start: "
        + ("unknown" if load is None else " / ".join(f"{x:.2f}" for x in load))
        + " (1 / 5 / 15 min; other processes share this machine)",
        f"- Platform: {info['platform']}, Python {info['python']}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        "",
        "BLAS and OpenMP libraries (`threadpoolctl.threadpool_info()` inside the limit):",
        "",
        "| user_api | internal_api | version | threads | threading layer | architecture "
        "| library |",
        "|---|---|---|---|---|---|---|",
    ]
    for pool in info["threadpools"]:
        lines.append("| " + " | ".join(_cell(x) for x in (
            pool.get("user_api"), pool.get("internal_api"), pool.get("version"),
            pool.get("num_threads"), pool.get("threading_layer", "-"),
            pool.get("architecture", "-"), Path(pool.get("filepath", "")).name,
        )) + " |")
    if kept_blocks:
        lines += ["", "## Earlier runs", "",
                  "The rows kept from earlier runs (not run by the command above), each with the "
                  "run and machine it comes from.", ""]
        for block in kept_blocks:
            lines += [f"### Rows {_row_list(block['rows'])}", "", *block["lines"], ""]
        lines.pop()
    lines += [
        "",
        "## Results",
        "",
        "Ratio = A / B. Times are the best of the interleaved repeats listed under Details.",
        "",
        "| Row | Setting | A (measured) | B (baseline) | A / B | Target | Result |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in order:
        if row in descriptions:
            lines += [_result_line(r) for r in results if r.row == row]
        else:
            lines += kept_results.get(row, [])
    lines += [_result_line(r) for r in results if r.row not in descriptions]
    lines += ["", "## Details", ""]
    row_context = row_context or {}
    kept_date = {row: block["date"] for block in kept_blocks for row in block["rows"]}
    for row in order:
        if row in descriptions:
            lines += _details(row, descriptions[row], results, row_context, quick)
        else:
            lines += [f"### `{row}`", "",
                      f"{KEPT_MARK} {kept_date[row]} (see \"Earlier runs\"), not run by the "
                      "command under \"Run\".*", "", *kept_details[row], ""]
    return "\n".join(lines).rstrip() + "\n"


def _details(row, text, results, row_context, quick):
    """The Details section of a row that ran."""
    lines = [f"### `{row}`", "", text, ""]
    if row in row_context:
        ran = row_context[row]
        load = " -> ".join("unknown" if x is None else f"{x:.2f}" for x in ran["load"])
        lines += [f"Row wall time {ran['seconds']:.0f} s; 1-minute load average "
                  f"{load} (start -> end of the row).", ""]
    for r in (r for r in results if r.row == row):
        if r.details:
            lines.append(f"{r.label}:")
            lines.append("")
            lines += [f"- {d}" for d in r.details]
            lines.append("")
    note = row_note(row)
    if note and not quick:
        lines += [f"Measured apart from this run (`benchmarks/notes/{row}.md`):", "", note, ""]
    return lines


def _result_line(r):
    """One line of the results table."""
    return "| " + " | ".join(_cell(x) for x in (
        f"`{r.row}`: {r.label}", r.setting, r.measured, r.baseline or "-", r.ratio,
        r.target, f"**{r.status}**" if r.status in ("PASS", "MISS") else r.status,
    )) + " |"


QUICK_MODE_LINE = "- Mode: quick (tiny sizes, a smoke test; targets not judged)"
KEPT_MARK = "*Kept from the earlier run of"
_ROW_HEADING = re.compile(r"^### `([^`]+)`\s*$")
_RESULT_LINE = re.compile(r"^\| `([^`]+)`: ")
_BLOCK_HEADING = re.compile(r"^### Rows (.*)$")


def _row_list(rows):
    return ", ".join(f"`{row}`" for row in rows)


def _row_order(row_order, ran, kept):
    order = [row for row in (row_order or []) if row in ran or row in kept]
    return order + [row for row in [*ran, *kept] if row not in order]


def _strip_blank(lines):
    lines = list(lines)
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _sections(lines, pattern):
    """``[(match or None, lines)]``: the lines before the first heading, then each headed part."""
    parts, match, body = [], None, []
    for line in lines:
        found = pattern.match(line)
        if found:
            parts.append((match, body))
            match, body = found, []
        else:
            body.append(line)
    parts.append((match, body))
    return parts


def _date_of(lines):
    for line in lines:
        if line.startswith("- Date: "):
            return line[len("- Date: "):].strip()
    return "unknown date"


def parse_report(text):
    """The parts of a report written by :func:`render_markdown` that a later run can keep.

    Parameters
    ----------
    text : str
        The report (``benchmarks/README.md``), of this version or an earlier
        one (without "Earlier runs" and the "Rows" line).

    Returns
    -------
    previous : dict or None
        ``runs``: list of dicts, ``rows`` (the rows whose numbers come from
        that run), ``lines`` (its run and machine facts as markdown),
        ``date`` and ``quick``; ``results``: row -> its lines of the results
        table; ``details``: row -> its Details section, without the heading
        and the line that says it was kept. None when the text is not such a
        report (no "## Results" or "## Details" section).
    """
    top = {}
    for match, body in _sections(text.splitlines(), re.compile(r"^## (.+?)\s*$")):
        if match is not None:
            top[match.group(1)] = body
    if "Results" not in top or "Details" not in top:
        return None
    results = {}
    for line in top["Results"]:
        found = _RESULT_LINE.match(line)
        if found:
            results.setdefault(found.group(1), []).append(line)
    details = {}
    for match, body in _sections(top["Details"], _ROW_HEADING):
        if match is not None:
            details[match.group(1)] = _strip_blank(
                line for line in body if not line.startswith(KEPT_MARK))
    runs = []
    for match, body in _sections(top.get("Earlier runs", []), _BLOCK_HEADING):
        if match is not None:
            body = _strip_blank(body)
            runs.append(dict(rows=re.findall(r"`([^`]+)`", match.group(1)), lines=body,
                             date=_date_of(body), quick=QUICK_MODE_LINE in body))
    claimed = {row for run in runs for row in run["rows"]}
    run_lines = [line.replace("- Rows: ", "- Rows it ran: ", 1)
                 for line in _strip_blank(top.get("Run", []))
                 if not line.startswith("This run wrote the rows")]
    run_lines = _strip_blank(run_lines)
    quick = (QUICK_MODE_LINE in run_lines
             or "**Quick mode: tiny sizes" in text.split("## How to run")[0])
    if quick and QUICK_MODE_LINE not in run_lines:
        run_lines.append(QUICK_MODE_LINE)
    machine = _strip_blank(top.get("Machine", []))
    rows = [row for row in [*results, *details] if row not in claimed]
    runs.insert(0, dict(rows=list(dict.fromkeys(rows)),
                        lines=[*run_lines, "", "Machine:", "", *machine],
                        date=_date_of(run_lines), quick=quick))
    return dict(runs=runs, results=results, details=details)


def _kept_parts(previous, ran):
    """The earlier runs' rows that did not run now: (run blocks, results lines, details)."""
    if not previous:
        return [], {}, {}
    blocks, seen = [], set(ran)
    for run in previous["runs"]:
        rows = [row for row in run["rows"] if row not in seen
                and (row in previous["details"] or row in previous["results"])]
        seen.update(rows)
        if rows:
            blocks.append({**run, "rows": rows})
    kept = {row for block in blocks for row in block["rows"]}
    return (blocks, {row: previous["results"].get(row, []) for row in kept},
            {row: previous["details"].get(row, []) for row in kept})


NOTES = Path(__file__).resolve().parent / "notes"


def row_note(row):
    """The hand-written note of a row (measurements made apart from the run), or None."""
    path = NOTES / f"{row}.md"
    return path.read_text().strip() if path.is_file() else None


def now():
    """The current local time, time-zone aware."""
    return datetime.datetime.now().astimezone()
