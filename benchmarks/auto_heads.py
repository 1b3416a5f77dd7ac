"""How often ``n_heads="auto"`` returns the head count of a random generator.

For every token dimension d and generator head count H of the grid (H at
most the SVD's largest count min(d_out d, d**2)), draws ``--n-seeds``
generators and their data with
``make_random_mhla(N, 10, d, n_heads=H, d_out=d_out, random_state=seed)``
(seeds 0, 1, ...; weights N(0, 1/d), tokens N(0, 1/10)) with ``N =
--samples`` times psi sequences, so that the data identify the function
(the certificate is checked).  With ``--noise s`` Gaussian noise of standard
deviation s times the targets' standard deviation is added (drawn from
``np.random.default_rng(seed + 10**6)``).  It fits
``LinearAttentionRegressor(n_heads="auto", random_state=0)`` and records the
count chosen, the largest relative error on 50 sequences three times longer
with tokens twice larger than in training (against the noise-free
generator), and the time of the fit.

With ``--profile`` it also fits ``n_heads=k`` for every k below the SVD's
count and records which k warn (the compression is material): the search of
"auto" assumes these verdicts are monotone in k, and the profile says
whether they were, and whether "auto" chose the smallest k that does not
warn (what a scan of every count would choose).

Prints one line per (d, H): how often the count chosen equals H, the counts
chosen, the largest out-of-distribution error where it does, the mean and
largest time; then the rate over every draw and over H <= 3.

Run from the repository root::

    python -m benchmarks.auto_heads                    # d = 3..6, H = 1..4, 10 seeds
    python -m benchmarks.auto_heads --noise 0.1        # noisy targets
    python -m benchmarks.auto_heads --n-seeds 2        # a quick look
"""

import argparse
import collections
import multiprocessing
import os
import platform
import sys
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn._features import n_attention_features
from sklearn_linattn.datasets import make_random_mhla

N_TOKENS = 10


def draw(seed, d, n_heads, d_out, samples, noise):
    """Training data of generator ``seed``, its parameters and out-of-distribution inputs."""
    n = int(np.ceil(samples * n_attention_features(d)))
    X, y, params = make_random_mhla(n, N_TOKENS, d, n_heads=n_heads, d_out=d_out,
                                    random_state=seed, return_params=True)
    if noise:
        y = y + noise * np.std(y) * np.random.default_rng(seed + 10**6).standard_normal(y.shape)
    X_far = 2.0 * np.random.default_rng(seed + 2 * 10**6).normal(
        size=(50, 3 * N_TOKENS, d)) / np.sqrt(N_TOKENS)
    return X, y, params, X_far


def warns(X, y, k):
    """Whether ``n_heads=k`` finds its compression material (a ConvergenceWarning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        LinearAttentionRegressor(n_heads=k, random_state=0).fit(X, y)
    return any(issubclass(w.category, ConvergenceWarning) for w in caught)


def run_draw(args):
    """One generator: count chosen, OOD error, time, certificate, SVD count, profile."""
    seed, d, n_heads, d_out, samples, noise, profile = args
    with threadpool_limits(limits=1):
        X, y, params, X_far = draw(seed, d, n_heads, d_out, samples, noise)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            start = time.perf_counter()
            model = LinearAttentionRegressor(n_heads="auto", random_state=0).fit(X, y)
            seconds = time.perf_counter() - start
        truth = mhla_forward(X_far, params["V"], params["Q"]).reshape(50, -1)
        got = np.asarray(model.predict(X_far)).reshape(50, -1)
        error = float(np.max(np.abs(got - truth)) / np.max(np.abs(truth)))
        n_svd = LinearAttentionRegressor().fit(X, y).n_heads_
        verdicts = [warns(X, y, k) for k in range(1, n_svd)] if profile else None
    return dict(seed=seed, d=d, H=n_heads, chosen=model.n_heads_, error=error,
                seconds=seconds, certified=bool(model.certificate_), n_svd=n_svd,
                warned=bool(caught), verdicts=verdicts)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.auto_heads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[3, 4, 5, 6],
                        help="token dimensions (default 3 4 5 6)")
    parser.add_argument("--heads", type=int, nargs="+", default=[1, 2, 3, 4],
                        help="generator head counts (default 1 2 3 4; those above "
                        "min(d_out d, d**2) are skipped)")
    parser.add_argument("--d-out", type=int, default=1, help="output dimension (default 1)")
    parser.add_argument("--n-seeds", type=int, default=10,
                        help="generators per (d, H) cell, seeds 0.. (default 10)")
    parser.add_argument("--samples", type=float, default=2.0,
                        help="training sequences as a multiple of psi (default 2)")
    parser.add_argument("--noise", type=float, default=0.0,
                        help="noise standard deviation relative to the targets' (default 0)")
    parser.add_argument("--profile", action="store_true",
                        help="also fit every n_heads=k below the SVD's count (monotonicity)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="worker processes, one BLAS thread each (default 1)")
    args = parser.parse_args(argv)
    if args.n_seeds < 1 or args.d_out < 1 or args.samples <= 0 or args.noise < 0:
        parser.error("--n-seeds and --d-out must be positive, --samples > 0, --noise >= 0")
    cells = [(d, h) for d in args.d for h in args.heads if h <= min(args.d_out * d, d * d)]
    print(f"LinearAttentionRegressor(n_heads='auto', random_state=0) on make_random_mhla "
          f"generators: d_out = {args.d_out}, {N_TOKENS} tokens, N = {args.samples:g} psi "
          f"sequences, noise {args.noise:g} of the targets' std, seeds 0..{args.n_seeds - 1}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          f"{os.cpu_count()} cores, {args.jobs} job(s), 1 BLAS thread per job")
    header = (f"{'d':>2} {'H':>2} {'chosen = H':>10}  {'counts chosen':<22} "
              f"{'max OOD err':>11} {'mean s':>7} {'max s':>7}")
    print(header)
    print("-" * len(header))
    work = [(seed, d, h, args.d_out, args.samples, args.noise, args.profile)
            for d, h in cells for seed in range(args.n_seeds)]
    start = time.perf_counter()
    pool = multiprocessing.Pool(args.jobs) if args.jobs > 1 else None
    results = (pool.imap if pool is not None else map)(run_draw, work)
    by_cell = collections.defaultdict(list)
    try:
        for r in results:
            cell = by_cell[(r["d"], r["H"])]
            cell.append(r)
            if len(cell) < args.n_seeds:
                continue
            hits = [c for c in cell if c["chosen"] == r["H"]]
            counts = collections.Counter(c["chosen"] for c in cell)
            shown = ", ".join(f"{k}: {counts[k]}" for k in sorted(counts))
            err = max((c["error"] for c in hits), default=float("nan"))
            times = [c["seconds"] for c in cell]
            print(f"{r['d']:>2} {r['H']:>2} {f'{len(hits)}/{len(cell)}':>10}  {shown:<22} "
                  f"{err:>11.1e} {np.mean(times):>7.2f} {np.max(times):>7.2f}", flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    every = [r for cell in by_cell.values() for r in cell]
    small = [r for r in every if r["H"] <= 3]
    print("-" * len(header))
    for label, group in (("every draw", every), ("H <= 3", small)):
        hits = sum(r["chosen"] == r["H"] for r in group)
        print(f"chosen = H, {label}: {hits}/{len(group)} = {hits / max(len(group), 1):.1%}")
    print(f"more heads than the SVD's: {sum(r['chosen'] > r['n_svd'] for r in every)}; "
          f"a ConvergenceWarning: {sum(r['warned'] for r in every)}; "
          f"certificate fails: {sum(not r['certified'] for r in every)}")
    if args.profile:
        monotone = scan = 0
        for r in every:
            v = r["verdicts"]
            monotone += all(a or not b for a, b in zip(v, v[1:]))  # never False then True
            first = next((k for k, material in enumerate(v, 1) if not material), r["n_svd"])
            scan += first == r["chosen"]
        print(f"profiles monotone (n_heads=k warns for every k below a count, for none "
              f"above): {monotone}/{len(every)}; 'auto' = the smallest k that does not "
              f"warn: {scan}/{len(every)}")
    print(f"total {time.perf_counter() - start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
