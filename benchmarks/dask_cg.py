"""``solver="cg"`` on a dask array: 1 against 2 worker processes, and the in-memory fit.

N Gaussian sequences of n tokens (entries N(0, 1/n)) labelled by a random
one-head MHLA are generated block by block on the cluster and persisted
there before the clock starts (the data live on the workers, as they would
on a real cluster).  Then ``LinearAttentionRegressor(solver="cg").fit`` runs
on the dask arrays: the standardization pass, the blocks' row factors
persisted on the workers, and every CG / Lanczos / LOBPCG product a
map-reduce over them.  Each ``distributed.LocalCluster`` has single-threaded
worker processes (one BLAS thread each) and the client runs under one BLAS
thread too (on one small machine its idle BLAS threads would otherwise spin
on the cores the workers compute on); the in-memory reference is the same
fit on the computed numpy arrays under one BLAS thread.

The printed speedup is the 1-worker time over the 2-worker time; the
coefficients of every fit are compared with the in-memory fit.

Usage::

    python benchmarks/dask_cg.py                      # d = 32, N = 20000, n = 16, 4 blocks
    python benchmarks/dask_cg.py --d 16 --n-samples 3000 --workers 1 2 --json
"""

import argparse
import json
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, mhla_forward


def _labels(block, V, Q):
    return mhla_forward(block, V, Q)[:, 0]


def make_data(da, seed, n_samples, n_tokens, d, n_blocks):
    """Sequences and one-head targets as dask arrays of ``n_blocks`` blocks (lazy)."""
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((1, 1, d)) / np.sqrt(d)
    Q = rng.standard_normal((1, d, d)) / np.sqrt(d)
    chunk = -(-n_samples // n_blocks)
    X = da.random.default_rng(seed).standard_normal(
        (n_samples, n_tokens, d), chunks=(chunk, n_tokens, d)) / np.sqrt(n_tokens)
    y = X.map_blocks(_labels, V, Q, drop_axis=[1, 2], dtype=np.float64)
    return X, y


def _blas_threads(info):
    return sorted({lib["num_threads"] for lib in info if lib.get("user_api") == "blas"})


def fit_on_cluster(n_workers, args):
    """Time the fit on a LocalCluster of ``n_workers`` single-threaded processes."""
    import dask.array as da
    import distributed

    with distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        X, y = make_data(da, args.seed, args.n_samples, args.n_tokens, args.d, args.blocks)
        X, y = client.persist([X, y])
        distributed.wait([X, y])
        threads = sorted({t for v in client.run(threadpool_info).values()
                          for t in _blas_threads(v)})
        model = LinearAttentionRegressor(solver="cg", tol=args.tol)
        start = time.perf_counter()
        # The client's own BLAS threads would spin on the workers' cores between
        # its small products (the preconditioner), so it gets one, as they do.
        with warnings.catch_warnings(record=True) as caught, threadpool_limits(1):
            warnings.simplefilter("always")
            model.fit(X, y)
        seconds = time.perf_counter() - start
        Xn, yn = X.compute(), y.compute()
    return dict(workers=n_workers, seconds=seconds, n_iter=int(model.n_iter_),
                worker_blas_threads=threads, model=model, X=Xn, y=yn,
                warnings=sorted({str(w.message) for w in caught}))


def run(args):
    """Fit on each cluster size of ``args.workers`` and in memory; a dict of the numbers."""
    runs = [fit_on_cluster(w, args) for w in args.workers]
    X, y = runs[0]["X"], runs[0]["y"]
    with threadpool_limits(1):
        start = time.perf_counter()
        reference = LinearAttentionRegressor(solver="cg", tol=args.tol).fit(X, y)
        in_memory = time.perf_counter() - start
    scale = np.abs(reference.coef_).max()
    out = dict(
        d=args.d, n_samples=args.n_samples, n_tokens=args.n_tokens, blocks=args.blocks,
        psi=int(reference.coef_.shape[1]), in_memory_seconds=in_memory,
        in_memory_n_iter=int(reference.n_iter_),
        lambda_min=reference.certificate_.min_eigenvalue,
        runs=[dict(workers=r["workers"], seconds=r["seconds"], n_iter=r["n_iter"],
                   worker_blas_threads=r["worker_blas_threads"],
                   max_coef_difference=float(np.abs(r["model"].coef_ - reference.coef_).max()
                                             / scale),
                   identifiable=bool(r["model"].certificate_),
                   lambda_min=r["model"].certificate_.min_eigenvalue,
                   lambda_min_error=r["model"].certificate_.min_eigenvalue_error,
                   warnings=r["warnings"])
              for r in runs],
    )
    by_workers = {r["workers"]: r["seconds"] for r in out["runs"]}
    if 1 in by_workers and 2 in by_workers:
        out["speedup_2_over_1"] = by_workers[1] / by_workers[2]
    return out


def build_parser():
    """The command line (also the defaults of the ``dask`` benchmark row)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--n-samples", type=int, default=20000)
    parser.add_argument("--n-tokens", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=4, help="dask blocks along the samples")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return out
    print(f"d = {args.d} (psi = {out['psi']}), N = {args.n_samples}, n = {args.n_tokens}, "
          f"{args.blocks} blocks")
    print(f"in memory, 1 BLAS thread: {out['in_memory_seconds']:.1f} s, "
          f"{out['in_memory_n_iter']} CG "
          f"iterations, lambda_min {out['lambda_min']:.3g}")
    for r in out["runs"]:
        print(f"{r['workers']} worker(s), BLAS threads per worker {r['worker_blas_threads']}: "
              f"{r['seconds']:.1f} s, {r['n_iter']} iterations, identifiable "
              f"{r['identifiable']}, max coefficient difference {r['max_coef_difference']:.1e} "
              f"(relative to the largest)")
        for w in r["warnings"]:
            print(f"  warning: {w}")
    if "speedup_2_over_1" in out:
        print(f"speedup 1 -> 2 workers: {out['speedup_2_over_1']:.2f}")
    return out


if __name__ == "__main__":
    main()
