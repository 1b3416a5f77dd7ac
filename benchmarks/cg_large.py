"""Time ``solver="cg"`` phase by phase on Gaussian data (issue 5's d = 64 target).

N Gaussian sequences of n tokens (entries N(0, 1/n)) labelled by a random
one-head MHLA, created in place by :func:`teacher_data` (which the ``cg``,
``samples`` and ``memory`` rows of ``benchmarks/rows.py`` use too).
Then :func:`~sklearn_linattn._solvers.cg.solve_cg` runs with its phases timed:
the setup pass (which fills the row-factor cache), CG, and the certificate
(Lanczos for lambda_max, CG from a random start and, when needed, LOBPCG
for lambda_min), with the number of cached
and exact (float64, streamed) products.  ``--products`` instead times one
product ``G v`` streamed from X and from float64 / float32 caches, for
extrapolating to large N.  ``--fit`` times ``LinearAttentionRegressor(
solver="cg").fit`` as a whole (what the benchmark row measures).

Run the full d = 64 case in the background with the peak RSS::

    /usr/bin/time -v python benchmarks/cg_large.py --fit \\
        --d 64 --n-samples 150000 --n-tokens 16

Usage::

    python benchmarks/cg_large.py --d 32 --n-samples 19100
    python benchmarks/cg_large.py --products --d 64 --n-samples 10000
    python benchmarks/cg_large.py --d 32 --n-samples 19100 --cache float32
"""

import argparse
import contextlib
import resource
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn import _spectrum as spectrum
from sklearn_linattn._moments import ImplicitGram, RowReader
from sklearn_linattn._solvers import cg


def teacher_data(rng, n_samples, n_tokens, d, *, token_scale, readout="last"):
    """One-head teacher and sequences, filled in place in chunks of sequences.

    Generating in place keeps the peak memory of data generation at the size
    of X (plus a chunk), so that X can be created before a memory
    measurement without inflating the process.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, d)
    y : ndarray of shape (n_samples,), or (n_samples, n_tokens) for readout "all"
    V, Q : ndarray of shape (1, 1, d) and (1, d, d)
    """
    V = rng.standard_normal((1, 1, d)) / np.sqrt(d)
    Q = rng.standard_normal((1, d, d)) / np.sqrt(d)
    X = np.empty((n_samples, n_tokens, d))
    y = np.empty(n_samples if readout == "last" else (n_samples, n_tokens))
    step = max(1, 2**22 // (n_tokens * d))
    for start in range(0, n_samples, step):
        sl = slice(start, min(start + step, n_samples))
        rng.standard_normal(out=X[sl])
        X[sl] *= token_scale
        y[sl] = mhla_forward(X[sl], V, Q, readout=readout)[..., 0]
    return X, y, V, Q


class _Timed:
    """Wall time and calls of a method, patched on the class."""

    def __init__(self, cls, name):
        self.cls, self.name, self.seconds, self.calls = cls, name, 0.0, 0
        self.original = getattr(cls, name)

        def wrapper(obj, *args, **kwargs):
            start = time.perf_counter()
            try:
                return self.original(obj, *args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        setattr(cls, name, wrapper)

    def restore(self):
        setattr(self.cls, self.name, self.original)


@contextlib.contextmanager
def _progress():
    """Print when CG and the certificate end (wall and CPU seconds since the start)."""
    pcg, extremes = spectrum.pcg, cg.implicit_extremes
    wall, cpu = time.perf_counter(), time.process_time()

    def report(name, fn):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            label = "CG (fit and certificate probes)" if kwargs.get("record") is not None else name
            print(f"  {label} done at {time.perf_counter() - wall:.1f} s "
                  f"(CPU {time.process_time() - cpu:.1f} s); iterations "
                  f"{out[1] if name == 'CG' else out['n_iter']}", flush=True)
            return out
        return wrapper

    spectrum.pcg = report("CG", pcg)
    cg.implicit_extremes = report("certificate", extremes)
    try:
        yield
    finally:
        spectrum.pcg = pcg
        cg.implicit_extremes = extremes


def time_products(X, repeats=2):
    """(wall, CPU) seconds of one product ``G v`` streamed, and from float64 / float32 caches."""
    lengths = np.full(X.shape[0], X.shape[1])
    out = {}
    for cache in (None, "float64", "float32"):
        op = ImplicitGram(RowReader.of_arrays(X, lengths), cache_dtype=cache)
        op.setup()
        v = np.random.default_rng(0).standard_normal((op.psi, 1))
        best = (np.inf, np.inf)
        for _ in range(repeats):
            start, cpu = time.perf_counter(), time.process_time()
            op.matmat(v)
            best = min(best, (time.perf_counter() - start, time.process_time() - cpu))
        out[cache or "streamed"] = best
    return out


def time_iteration(X, y, readout="last", cache="auto", n_probes=2, repeats=2):
    """The caching pass and one CG iteration of the fit at full size, with the peak RSS.

    What a fit with ``solver="cg"`` repeats a few hundred times: one block
    product with the row cache (the fit's column and the certificate's
    ``n_probes`` probes) and one exact product streamed from the sequences
    (a residual replacement).  The coordinates are those of the fit
    (:func:`~sklearn_linattn._source.standardizer_of`); ``cache`` is
    the row cache's dtype ("auto": the fit's choice by the memory budget,
    None, "float32" or "float64").  Returns a dict of seconds, the cache's
    dtype and bytes, and the peak RSS in bytes.
    """
    from sklearn_linattn._source import standardizer_of

    lengths = np.full(X.shape[0], X.shape[1])
    Y = y[:, None] if readout == "last" else y[..., None]
    start = time.perf_counter()
    standardizer = standardizer_of(X, lengths, Y)
    rows = RowReader.of_arrays(X, lengths, Y, readout, standardizer=standardizer)
    if cache == "auto":
        cache = cg.cg_cache_dtype(rows.n_rows, rows.d)
    op = ImplicitGram(rows, cache_dtype=cache)
    op.setup()
    out = dict(setup=time.perf_counter() - start, cache=str(op.cache_dtype),
               cache_bytes=sum(a.nbytes for a in op._cache if a is not None)
               if op._cache is not None else 0)
    V = np.random.default_rng(0).standard_normal((op.psi, 1 + n_probes))
    for name, fn, cols in (("block product", op.matmat, V), ("exact product", op.matmat_exact,
                                                              V[:, :1])):
        best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            fn(cols)
            best = min(best, time.perf_counter() - start)
        out[name] = best
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def time_solve(X, y, cache="auto", tol=1e-8):
    """solve_cg with its phases timed; returns a dict of numbers."""
    lengths = np.full(X.shape[0], X.shape[1])
    timers = [_Timed(ImplicitGram, name)
              for name in ("setup", "matmat", "matmat_exact")]
    phases = {}
    pcg, extremes = spectrum.pcg, cg.implicit_extremes

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            # One CG for the fit and the certificate's random probes (recording Lanczos vectors).
            key = "CG (fit and certificate probes)" if kwargs.get("record") is not None else name
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - start
        return wrapper

    spectrum.pcg = timed("cg", pcg)
    cg.implicit_extremes = timed("certificate", extremes)
    try:
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rows = RowReader.of_arrays(X, lengths, y[:, None])
            solution = cg.solve_cg(rows, 0.0, dict(tol=tol, cache_dtype=cache))
        total = time.perf_counter() - start
    finally:
        spectrum.pcg = pcg
        cg.implicit_extremes = extremes
        for t in timers:
            t.restore()
    counts = {t.name: (t.calls, t.seconds) for t in timers}
    return dict(total=total, phases=phases, counts=counts, solution=solution,
                warnings=[str(w.message) for w in caught])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--n-samples", type=int, default=19100)
    parser.add_argument("--n-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="auto",
                        help="auto, none, float64 or float32 (solve_cg's cache_dtype)")
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--products", action="store_true", help="time one product only")
    parser.add_argument("--fit", action="store_true",
                        help="time LinearAttentionRegressor(solver='cg').fit")
    parser.add_argument("--iteration", action="store_true",
                        help="time the caching pass and one CG iteration at full size, "
                             "with the peak RSS (sizes a fit too long to run)")
    parser.add_argument("--readout", default="last", help="last or all (with --iteration)")
    args = parser.parse_args(argv)
    d, N, n = args.d, args.n_samples, args.n_tokens
    psi = d * d * (d + 1) // 2
    X, y, V, Q = teacher_data(np.random.default_rng(0), N, n, d, token_scale=1 / np.sqrt(n),
                              readout=args.readout)
    print(f"d = {d}, N = {N}, n = {n}, psi = {psi}, X {X.nbytes / 2**30:.2f} GiB, "
          f"threads {args.threads}", flush=True)
    with threadpool_limits(args.threads):
        if args.iteration:
            out = time_iteration(X, y, args.readout,
                                 None if args.cache == "none" else args.cache, repeats=1)
            print(f"caching pass {out['setup']:.1f} s (cache {out['cache']}, "
                  f"{out['cache_bytes'] / 1e9:.2f} GB); one CG iteration of the fit: block "
                  f"product (fit + 2 probes) {out['block product']:.2f} s, exact product "
                  f"{out['exact product']:.2f} s; peak RSS {out['peak_rss'] / 1e9:.2f} GB")
            return
        if args.products:
            for name, (wall, cpu) in time_products(X).items():
                print(f"one product G v, {name}: {wall:.3f} s wall, {cpu:.3f} s CPU")
            return
        if args.fit:
            model = LinearAttentionRegressor(solver="cg", tol=args.tol)
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught, _progress():
                warnings.simplefilter("always")
                model.fit(X, y)
            seconds = time.perf_counter() - start
            rng = np.random.default_rng(1)
            X_check = rng.standard_normal((200, n, d)) / np.sqrt(n)
            y_check = mhla_forward(X_check, V, Q)[:, 0]
            err = np.linalg.norm(model.predict(X_check) - y_check) / np.linalg.norm(y_check)
            cert = model.certificate_
            print(f"fit {seconds:.1f} s (CPU of the process so far {time.process_time():.0f} s); "
                  f"CG iterations {model.n_iter_}; relative error on 200 unseen sequences "
                  f"{err:.2e}")
            print(f"certificate: identifiable={bool(cert)}, lambda_min={cert.min_eigenvalue:.4g}"
                  f" +/- {cert.min_eigenvalue_error:.3g} (lower bound "
                  f"{cert.min_eigenvalue - cert.min_eigenvalue_error:.3g}), "
                  f"lambda_max={cert.max_eigenvalue:.4g}, tol={cert.tol:.3g}")
            for w in {str(w.message) for w in caught}:
                print("warning:", w)
            return
        cache = None if args.cache == "none" else args.cache
        out = time_solve(X, y, cache=cache, tol=args.tol)
    sol = out["solution"]
    print(f"solve_cg {out['total']:.1f} s: " + ", ".join(
        f"{k} {v:.1f} s" for k, v in out["phases"].items()))
    for name, (calls, seconds) in out["counts"].items():
        print(f"  {name}: {calls} calls, {seconds:.1f} s")
    print(f"  CG iterations {sol.n_iter}; lambda_min {sol.lambda_min:.6g} +/- "
          f"{sol.lambda_min_error:.3g} (lower bound {sol.lambda_min - sol.lambda_min_error:.3g}); "
          f"lambda_max {sol.lambda_max:.8g}; tol {sol.tol:.3g}; "
          f"identifiable {sol.lambda_min - sol.lambda_min_error > sol.tol}")
    for w in out["warnings"]:
        print("warning:", w)


if __name__ == "__main__":
    main()
