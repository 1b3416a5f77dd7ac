"""Fixed cost of ``LinearAttentionRegressor().fit`` at small psi, against ``Phi.T @ Phi``.

At d = 4 (psi = 40) the Gram product is a few milliseconds, so validation and
bookkeeping decide the fit time.  Two settings: the closed-form side of the
``adam`` row (d = 4, N = 2048, T = 100, readout "all": 204 800 feature rows)
and the d = 4 ``gram`` row (N = 20 000, n = 64, readout "last").  Each repeat
runs ``fit`` and then ``Phi.T @ Phi`` (Phi formed once, outside the timings)
under ``threadpool_limits(threads)``; wall and CPU (process) times are the
best of the repeats.  CPU time is the steadier of the two on a shared machine.

Usage::

    python benchmarks/closed_form_overhead.py --threads 1 --repeats 7
"""

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn._features import attention_features, prefix_features

SETTINGS = {
    "adam": dict(n_samples=2048, n_tokens=100, d=4, readout="all"),
    "gram": dict(n_samples=20000, n_tokens=64, d=4, readout="last"),
}


def _data(rng, n_samples, n_tokens, d, readout):
    V = rng.normal(size=(1, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(1, d, d)) / np.sqrt(d)
    X = rng.normal(size=(n_samples, n_tokens, d)) / np.sqrt(n_tokens)
    y = mhla_forward(X, V, Q, readout=readout)[..., 0]
    lengths = np.full(n_samples, n_tokens)
    if readout == "all":
        Phi = prefix_features(X, lengths).reshape(-1, d * d * (d + 1) // 2)
    else:
        Phi = attention_features(X, lengths)
    return X, y, Phi


def _clock():
    return time.perf_counter(), time.process_time()


def run(name, threads, repeats, seed=0):
    p = SETTINGS[name]
    X, y, Phi = _data(np.random.default_rng(seed), **p)
    fit_wall, fit_cpu, gram_wall, gram_cpu = [], [], [], []
    with threadpool_limits(threads):
        model = LinearAttentionRegressor(readout=p["readout"])
        model.fit(X, y)  # warm-up
        for _ in range(repeats):
            w, c = _clock()
            model.fit(X, y)
            w2, c2 = _clock()
            Phi.T @ Phi
            w3, c3 = _clock()
            fit_wall.append(w2 - w)
            fit_cpu.append(c2 - c)
            gram_wall.append(w3 - w2)
            gram_cpu.append(c3 - c2)
    fw, fc, gw, gc = (1e3 * min(v) for v in (fit_wall, fit_cpu, gram_wall, gram_cpu))
    print(f"{name}: {p}: fit {fw:.1f} ms wall / {fc:.1f} ms CPU; Phi^T Phi {gw:.2f} ms wall / "
          f"{gc:.2f} ms CPU; ratio (CPU) {fc / gc:.1f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=sorted(SETTINGS), nargs="+", default=sorted(SETTINGS))
    args = parser.parse_args(argv)
    for name in args.only:
        run(name, args.threads, args.repeats)


if __name__ == "__main__":
    main()
