"""How often head compression misses the head count of an exact generator.

For every token dimension d, head count H and output dimension d_out of the
grid, draws ``--n-tries`` random H-head generators (standard normal V of
shape (H, d_out, d) and Q of shape (H, d, d), drawn in that order from
``np.random.default_rng(seed)`` with ``seed = 0, 1, ...``), takes their exact
coefficients ``attention_coefficients(V, Q)`` and asks
``compress_heads(coef, d, H)`` for H heads.  A try fails when the relative
coefficient residual stays above ``--tol``: an H-head model with zero
residual exists, so every failure is the search's fault.

Prints one line per (d, H, d_out): failures / tries, the largest residual,
the mean and largest time per compression, and the first failing seeds.

Run from the repository root::

    python -m benchmarks.compression_failures                 # 500 tries per cell
    python -m benchmarks.compression_failures --n-tries 20    # a quick look
    python -m benchmarks.compression_failures --d 4 --heads 3 --d-out 1
"""

import argparse
import inspect
import multiprocessing
import os
import platform
import sys
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_linattn import attention_coefficients, compress_heads


def generator_coefficients(seed, d, n_heads, d_out):
    """Exact coefficients of the random generator number ``seed``."""
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((n_heads, d_out, d))
    Q = rng.standard_normal((n_heads, d, d))
    return attention_coefficients(V, Q)


def _compress_quietly(coef, d, n_heads, tol):
    kwargs = {"tol": tol, "random_state": 0}
    if "warn" in inspect.signature(compress_heads).parameters:
        kwargs["warn"] = False
    with warnings.catch_warnings():
        # Versions without ``warn`` warn on every miss; the table counts them.
        warnings.simplefilter("ignore")
        return compress_heads(coef, d, n_heads, **kwargs)[2]


def run_cell(args):
    """Failures, residuals and times of one (d, H, d_out) cell."""
    d, n_heads, d_out, n_tries, tol = args
    residuals = np.empty(n_tries)
    times = np.empty(n_tries)
    with threadpool_limits(limits=1):
        for seed in range(n_tries):
            coef = generator_coefficients(seed, d, n_heads, d_out)
            start = time.perf_counter()
            residuals[seed] = _compress_quietly(coef, d, n_heads, tol)
            times[seed] = time.perf_counter() - start
    return d, n_heads, d_out, residuals, times


def grid(dims, max_heads, d_outs):
    cells = []
    for d in dims:
        for n_heads in range(1, min(d, max_heads) + 1):
            outs = sorted({d if o == "d" else int(o) for o in d_outs})
            cells.extend((d, n_heads, d_out) for d_out in outs)
    return cells


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compression_failures",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--n-tries", type=int, default=500,
                        help="generators per (d, H, d_out) cell (default 500)")
    parser.add_argument("--d", type=int, nargs="+", default=list(range(3, 9)),
                        help="token dimensions (default 3 4 5 6 7 8)")
    parser.add_argument("--heads", type=int, default=4,
                        help="largest head count; H runs over 1..min(d, HEADS) (default 4)")
    parser.add_argument("--d-out", nargs="+", default=["1", "d"],
                        help="output dimensions: integers or 'd' (default: 1 d)")
    parser.add_argument("--tol", type=float, default=1e-10,
                        help="relative residual counted as success (default 1e-10)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes, one BLAS thread each (default 1)")
    args = parser.parse_args(argv)
    if args.n_tries < 1:
        parser.error(f"--n-tries must be at least 1; got {args.n_tries}")
    cells = grid(args.d, args.heads, args.d_out)
    print(f"compress_heads on exact coefficients of random generators, tol = {args.tol:g}, "
          f"random_state = 0, {args.n_tries} tries per cell, seeds 0..{args.n_tries - 1}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} cores, {args.jobs} job(s), 1 BLAS thread per job")
    print(f"signature: compress_heads{inspect.signature(compress_heads)}")
    header = (f"{'d':>2} {'H':>2} {'d_out':>5} {'failures':>12} {'max residual':>13} "
              f"{'mean s':>8} {'max s':>8}  failing seeds")
    print(header)
    print("-" * len(header))
    work = [(d, h, o, args.n_tries, args.tol) for d, h, o in cells]
    start = time.perf_counter()
    total_fail = total = 0
    if args.jobs > 1:
        pool = multiprocessing.Pool(args.jobs)
        results = pool.imap(run_cell, work)
    else:
        pool = None
        results = map(run_cell, work)
    try:
        for d, h, o, residuals, times in results:
            failed = np.flatnonzero(residuals > args.tol)
            total_fail += failed.size
            total += residuals.size
            seeds = " ".join(map(str, failed[:8])) + (" ..." if failed.size > 8 else "")
            print(f"{d:>2} {h:>2} {o:>5} {f'{failed.size}/{residuals.size}':>12} "
                  f"{residuals.max():>13.2e} {times.mean():>8.3f} {times.max():>8.3f}  "
                  f"{seeds}", flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    print("-" * len(header))
    print(f"total: {total_fail}/{total} failures, {time.perf_counter() - start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
