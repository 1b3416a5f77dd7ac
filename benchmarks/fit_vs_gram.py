"""Fit time as a multiple of numpy's ``Phi.T @ Phi`` on the same feature matrix.

For each token dimension d, N Gaussian sequences of n tokens labelled by a
random one-head MHLA; ``Phi`` (N x psi) is formed once, outside the timings.
Each repeat times ``Phi.T @ Phi`` and then ``LinearAttentionRegressor().fit``
(validation, statistics, solve, heads and certificate included) back to
back, under ``threadpool_limits``; the ratio of the two is reported per
repeat (median and best), so that a machine shared with other processes
disturbs both sides alike.  A breakdown times the statistics pass
(:class:`~sklearn_linattn._solvers.SufficientStatistics`) and the solve
(:func:`~sklearn_linattn._solvers.solve_statistics`) separately.

Usage::

    /work/venv/bin/python benchmarks/fit_vs_gram.py                # d = 4, 8, 16
    /work/venv/bin/python benchmarks/fit_vs_gram.py --d 16 --threads 1 --repeats 5
"""

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn._features import attention_features, n_attention_features
from sklearn_linattn._solvers import SufficientStatistics, solve_statistics


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run(d, n_samples, n_tokens, threads, repeats, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_samples, n_tokens, d))
    V = rng.normal(size=(1, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(1, d, d)) / np.sqrt(d)
    y = mhla_forward(X, V, Q)[:, 0]
    lengths = np.full(n_samples, n_tokens)
    Phi = attention_features(X, lengths)
    rows = []
    with threadpool_limits(limits=threads, user_api="blas"):
        Phi.T @ Phi  # warm-up (thread pool, page faults)
        LinearAttentionRegressor().fit(X, y)
        for _ in range(repeats):
            t_gram, _ = _timed(lambda: Phi.T @ Phi)
            t_fit, model = _timed(lambda: LinearAttentionRegressor().fit(X, y))
            t_stats, stats = _timed(
                lambda: SufficientStatistics(d, 1).update(X, lengths, y[:, None])
            )
            t_solve, _ = _timed(lambda: solve_statistics(stats, 0.0, model.solver_))
            rows.append((t_gram, t_fit, t_stats, t_solve))
    t = np.array(rows)
    ratio = t[:, 1] / t[:, 0]
    return dict(
        d=d, psi=n_attention_features(d), solver=model.solver_,
        gram=statistics.median(t[:, 0]), fit=statistics.median(t[:, 1]),
        ratio=float(np.median(ratio)), best=float(ratio.min()),
        stats=float(np.median(t[:, 2] / t[:, 0])), solve=float(np.median(t[:, 3] / t[:, 0])),
        identifiable=bool(model.certificate_),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--n-samples", type=int, default=20000)
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"N = {args.n_samples}, n = {args.n_tokens}, BLAS threads = {args.threads}, "
          f"{args.repeats} repeats; times in s, ratios = fit / (Phi.T @ Phi)")
    print(f"{'d':>3} {'psi':>5} {'solver':>9} {'Phi^T Phi':>10} {'fit':>8} {'ratio':>6} "
          f"{'best':>6} {'stats':>6} {'solve':>6}")
    for d in args.d:
        r = run(d, args.n_samples, args.n_tokens, args.threads, args.repeats)
        print(f"{r['d']:>3} {r['psi']:>5} {r['solver']:>9} {r['gram']:>10.3f} {r['fit']:>8.3f} "
              f"{r['ratio']:>6.2f} {r['best']:>6.2f} {r['stats']:>6.2f} {r['solve']:>6.2f}",
              flush=True)


if __name__ == "__main__":
    main()
