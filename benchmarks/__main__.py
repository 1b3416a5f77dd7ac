"""Command line of the benchmark harness: ``python -m benchmarks [options]``.

Runs the rows of :mod:`benchmarks.rows` under one BLAS thread limit and
writes the markdown report (see ``python -m benchmarks --help``).
"""

import argparse
import inspect
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

from threadpoolctl import threadpool_limits

from .measure import Result, usable_cores
from .report import git_commit, machine_info, now, parse_report, render_markdown
from .rows import ROWS, Context, log

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "README.md"


def build_parser():
    """The argument parser of ``python -m benchmarks``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure sklearn-linattn against its baselines and write a markdown "
        "table with machine information.",
    )
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (a smoke test); targets are not judged")
    parser.add_argument("--only", nargs="+", choices=list(ROWS), metavar="ROW",
                        help=f"run only these rows ({', '.join(ROWS)})")
    parser.add_argument("--skip", nargs="+", choices=list(ROWS), metavar="ROW", default=[],
                        help="do not run these rows")
    parser.add_argument("--output", default=None,
                        help="markdown file to write (default benchmarks/README.md, or "
                        "none with --quick); '-' prints only. An existing report keeps the "
                        "rows this run leaves out (--only, --skip), with their run's facts")
    parser.add_argument("--replace", action="store_true",
                        help="write the rows run alone, dropping the other rows of an "
                        "existing report")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS/OpenMP threads for the whole run (default: all usable "
                        "cores)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    parser.add_argument("--gram-ds", type=int, nargs="+", default=None, metavar="D",
                        help="token dimensions of the gram row (default 4 8 16 32; d = 32 "
                        "alone takes most of its 15 minutes)")
    return parser


def _load():
    """1-minute load average, or None where unknown."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run_rows(names, ctx):
    """Run the rows in order; a row that raises becomes an ERROR line.

    Returns
    -------
    results : list of Result
    context : dict of str to dict
        Per row: ``seconds`` (wall time) and ``load`` (1-minute load average
        before and after it).
    """
    results, context = [], {}
    for name in names:
        start, load_before = time.perf_counter(), _load()
        try:
            results.extend(ROWS[name](ctx))
        except Exception as exc:  # keep the other rows; the traceback goes to stderr
            traceback.print_exc()
            results.append(Result(
                row=name, label="error", measured=f"{type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}",
                status="ERROR",
            ))
        seconds = time.perf_counter() - start
        context[name] = {"seconds": seconds, "load": (load_before, _load())}
        log(f"{name} done in {seconds:.1f} s")
    return results, context


def main(argv=None):
    """Run the selected rows under one thread limit and write the report.

    Parameters
    ----------
    argv : list of str or None
        Command-line arguments without the program name; None reads
        ``sys.argv``.

    Returns
    -------
    status : int
        0, or 1 when a row raised (its line says ERROR).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    threads = usable_cores() if args.threads is None else args.threads
    if threads < 1:
        raise SystemExit(f"--threads must be a positive integer; got {threads}.")
    names = [n for n in (args.only or ROWS) if n not in args.skip]
    ctx = Context(quick=args.quick, threads=threads, seed=args.seed, gram_ds=args.gram_ds)
    output = args.output
    if output is None:
        output = "-" if args.quick else str(DEFAULT_OUTPUT)

    previous = None
    if output != "-" and not args.replace and Path(output).is_file():
        previous = parse_report(Path(output).read_text())
        if previous is None:
            log(f"{output} is not a report of this harness: it is rewritten with the rows run")

    started, start = now(), time.perf_counter()
    with threadpool_limits(limits=threads):
        info = machine_info(threads)
        results, row_context = run_rows(names, ctx)
    seconds = time.perf_counter() - start
    text = render_markdown(
        results, info=info, command=shlex.join(["python", "-m", "benchmarks", *argv]),
        started=started, seconds=seconds, commit=git_commit(), quick=args.quick,
        descriptions={n: inspect.cleandoc(ROWS[n].__doc__) for n in names},
        row_context=row_context, previous=previous, row_order=list(ROWS),
    )
    print(text)
    if output != "-":
        Path(output).write_text(text)
        log(f"wrote {output}")
    return 1 if any(r.status == "ERROR" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
