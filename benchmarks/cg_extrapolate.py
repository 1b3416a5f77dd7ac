"""What ``solver="cg"`` would take at a size too large to run: measured passes, extrapolated.

For token dimension d, a full problem of ``--ratio`` x psi sequences (readout
"last") is too large to fit here in reasonable time; one pass of the solver
over the rows is linear in their number, so it is timed on ``--n-samples``
sequences and scaled.  Timed (best of ``--repeats``): one product ``G V`` with
``--columns`` columns (the fit's output plus the certificate's two probes)
streamed from X (no cache: the row factors recomputed, float64), and from a
float32 and a float64 cache of the row factors.  The estimate of a whole fit
with its certificate is ``iterations x (time of one pass)`` plus the
Lanczos run for lambda_max (``--lanczos`` single-column passes); the
iteration count is an input (280 at N = 1.13 psi, the Marchenko-Pastur
spread, as measured at d = 32 and d = 64 by the ``cg`` row).  Memory: X in
float64, the caches, and the Lanczos vectors of the certificate (float32,
capped at 1/16 of the memory budget).

Usage::

    python benchmarks/cg_extrapolate.py --d 96                 # psi = 446 976
    python benchmarks/cg_extrapolate.py --d 64 --n-samples 10000  # check against the cg row
"""

import argparse
import math
import time

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_linattn._memory import default_memory_budget, n_pairs
from sklearn_linattn._moments import ImplicitGram, RowReader
from sklearn_linattn._solvers.cg import cg_cache_dtype

GB = 1e9


def time_passes(d, n_samples, n_tokens, columns, repeats, seed=0):
    """Seconds of one product ``G V`` (V: psi x columns) for each cache, on n_samples rows."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_tokens, d)) / np.sqrt(n_tokens)
    lengths = np.full(n_samples, n_tokens)
    out = {}
    for cache in (None, "float32", "float64"):
        op = ImplicitGram(RowReader.of_arrays(X, lengths), cache_dtype=cache)
        op.setup()
        V = rng.standard_normal((op.psi, columns))
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            op.matmat(V)
            best = min(best, time.perf_counter() - start)
        out[cache or "streamed"] = best
        del op
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=96)
    parser.add_argument("--n-samples", type=int, default=4000, help="rows timed")
    parser.add_argument("--n-tokens", type=int, default=16)
    parser.add_argument("--ratio", type=float, default=1.13, help="full N / psi")
    parser.add_argument("--columns", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=280)
    parser.add_argument("--lanczos", type=int, default=60,
                        help="single-column passes of the lambda_max Lanczos run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    d, n = args.d, args.n_tokens
    P = n_pairs(d)
    psi = d * P
    N = math.ceil(args.ratio * psi)
    with threadpool_limits(args.threads):
        many = time_passes(d, args.n_samples, n, args.columns, args.repeats)
        one = time_passes(d, args.n_samples, n, 1, args.repeats)
    scale = N / args.n_samples
    budget = default_memory_budget()
    x_bytes = N * n * d * 8
    cache = {"float64": N * (P + d + 1) * 8, "float32": N * (P + d + 1) * 4}
    lanczos = min(1000 * psi * 4, budget / 16)
    chosen = cg_cache_dtype(N, d)
    print(f"d = {d}: psi = {psi}, full N = {N} ({args.ratio} psi) sequences of {n} tokens, "
          f"{args.threads} threads; passes timed on {args.n_samples} sequences, x {scale:.1f}")
    print(f"memory: X {x_bytes / GB:.1f} GB (float64); row-factor cache "
          f"{cache['float32'] / GB:.1f} GB in float32, {cache['float64'] / GB:.1f} GB in "
          f"float64; Lanczos vectors up to {lanczos / GB:.1f} GB; memory budget here "
          f"{budget / GB:.1f} GB, so the solver would use "
          f"{'no cache (rows streamed from X)' if chosen is None else f'a {chosen} cache'}")
    for name in ("streamed", "float32", "float64"):
        per_pass = many[name] * scale
        total = args.iterations * per_pass + args.lanczos * one[name] * scale
        memory = x_bytes + (cache.get(name, 0)) + lanczos
        print(f"  {name:8s}: one pass of {args.columns} columns {per_pass:7.1f} s (1 column "
              f"{one[name] * scale:6.1f} s); fit with certificate ~ {total / 60:6.1f} min; "
              f"peak ~ {memory / GB:.1f} GB")


if __name__ == "__main__":
    main()
