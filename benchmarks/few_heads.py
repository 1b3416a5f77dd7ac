"""Samples needed to identify a one-head generator below psi, three ways.

For each token dimension d and readout, draws a one-head generator (V of
shape (1, 1, d), Q of shape (1, d, d), entries N(0, 1/d)) and sequences of 10
tokens with entries N(0, 1/10), from ``np.random.default_rng(seed)``.  For
each number of training sequences N of a grid (set by the tangent dimension
``dim = d + d**2 - 1``: the parameters minus the one scaling symmetry, and by
psi = d**2 (d + 1) / 2) it fits

(a) ``fit_heads(X, y, 1)`` -- the direct one-head fit;
(b) ``LinearAttentionRegressor(n_heads=1)`` -- the minimum-norm least
    squares, then compressed to one head;
(c) ``AdamLinearAttentionRegressor(n_heads=1)`` -- full-batch Adam, learning
    rate ``--adam-lr`` (default 0.1) with 5% warm-up and cosine decay, ``--adam-epochs`` epochs
    (skipped with ``--quick``),

all on the same samples, and measures the out-of-distribution relative error
``||f(X') - y'|| / ||y'||`` on 200 sequences three times longer (30 tokens)
with tokens twice larger (for ``readout="all"`` over every position).  It
prints one line per (d, readout, N) -- the errors and whether the local
certificate (:func:`~sklearn_linattn.certify_heads_locally` at the
generator) holds -- then, per (d, readout), the smallest N of the grid from
which every larger N reaches ``--target`` (default 1e-6), against psi and
dim (in rows: sequences for "last", positions for "all").

Run from the repository root::

    python -m benchmarks.few_heads            # d = 4, 8, 16 (a few minutes)
    python -m benchmarks.few_heads --quick    # d = 4, 8, no Adam (seconds)
"""

import argparse
import platform
import sys
import time
import warnings

import numpy as np

from sklearn_linattn import (
    AdamLinearAttentionRegressor,
    LinearAttentionRegressor,
    certify_heads_locally,
    fit_heads,
    mhla_forward,
)
from sklearn_linattn._features import n_attention_features

N_TOKENS = 10
FRACTIONS = (0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0)


def problem(d, readout, seed):
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(1, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(1, d, d)) / np.sqrt(d)
    return rng, V, Q


def ood_error(predict, V, Q, readout, d, rng):
    X = 2.0 * rng.normal(size=(200, 3 * N_TOKENS, d)) / np.sqrt(N_TOKENS)
    y = mhla_forward(X, V, Q, readout=readout)
    y_hat = np.asarray(predict(X)).reshape(y.shape)
    return float(np.linalg.norm(y_hat - y) / np.linalg.norm(y))


def sample_grid(d, readout):
    dim = d + d * d - 1
    psi = n_attention_features(d)
    per = 1 if readout == "last" else N_TOKENS
    rows = {int(np.ceil(f * dim)) for f in FRACTIONS} | {psi}
    return sorted({max(1, int(np.ceil(r / per))) for r in rows}), dim, psi, per


def run_cell(d, readout, n, seed, adam_epochs, adam_lr=0.1):
    rng, V, Q = problem(d, readout, seed)
    X = rng.normal(size=(n, N_TOKENS, d)) / np.sqrt(N_TOKENS)
    y = mhla_forward(X, V, Q, readout=readout)[..., 0]
    test_rng = np.random.default_rng(seed + 1000)
    out = {"cert": bool(certify_heads_locally(X, V, Q, readout=readout))}
    start = time.perf_counter()
    fit = fit_heads(X, y, 1, readout=readout, random_state=seed)
    out["direct_s"] = time.perf_counter() - start
    out["direct"] = ood_error(lambda Z: mhla_forward(Z, fit.V, fit.Q, readout=readout),
                              V, Q, readout, d, np.random.default_rng(seed + 1000))
    out["fit_cert"] = bool(fit.certificate)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LinearAttentionRegressor(readout=readout, n_heads=1).fit(X, y)
        out["compress"] = ood_error(
            lambda Z: mhla_forward(Z, model.value_matrices_, model.key_query_matrices_,
                                   readout=readout), V, Q, readout, d, test_rng)
        if adam_epochs:
            start = time.perf_counter()
            adam = AdamLinearAttentionRegressor(
                n_heads=1, readout=readout, learning_rate=adam_lr, batch_size=n,
                max_epochs=adam_epochs, random_state=seed).fit(X, y)
            out["adam_s"] = time.perf_counter() - start
            out["adam"] = ood_error(
                lambda Z: mhla_forward(Z, adam.value_matrices_, adam.key_query_matrices_,
                                       readout=readout), V, Q, readout, d,
                np.random.default_rng(seed + 1000))
    return out


def smallest(ns, errors, target):
    """Smallest N from which every larger N of the grid reaches the target."""
    best = None
    for n, e in zip(reversed(ns), reversed(errors)):
        if e is None or not e <= target:
            break
        best = n
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.few_heads",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d = 4, 8 and no Adam")
    parser.add_argument("--d", type=int, nargs="+", default=None,
                        help="token dimensions (default 4 8 16; --quick: 4 8)")
    parser.add_argument("--adam-epochs", type=int, default=2000,
                        help="full-batch Adam epochs (default 2000; 0 skips Adam)")
    parser.add_argument("--adam-lr", type=float, default=0.1,
                        help="peak Adam learning rate (default 0.1; 1e-2 stalls at these scales)")
    parser.add_argument("--target", type=float, default=1e-6,
                        help="OOD relative error counted as identified (default 1e-6)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    dims = args.d or ([4, 8] if args.quick else [4, 8, 16])
    adam_epochs = 0 if args.quick else args.adam_epochs
    print(f"python {platform.python_version()}, numpy {np.__version__}; seed {args.seed}, "
          f"{N_TOKENS} tokens per training sequence, OOD: 30 tokens, 2x scale; "
          f"Adam: {adam_epochs or 'skipped'} full-batch epochs, peak rate {args.adam_lr:g}")
    header = ("| d | readout | N | rows | direct fit | min-norm + compress | Adam | "
              "local cert. | direct s |")
    print(header)
    print("|" + "---|" * 9)
    summary = []
    start = time.perf_counter()
    for d in dims:
        for readout in ("last", "all"):
            ns, dim, psi, per = sample_grid(d, readout)
            cells = [run_cell(d, readout, n, args.seed, adam_epochs, args.adam_lr) for n in ns]
            for n, c in zip(ns, cells):
                adam = f"{c['adam']:.1e}" if "adam" in c else "-"
                print(f"| {d} | {readout} | {n} | {n * per} | {c['direct']:.1e} | "
                      f"{c['compress']:.1e} | {adam} | {c['cert']} | "
                      f"{c['direct_s']:.2f} |", flush=True)
            found = {k: smallest(ns, [c.get(k) for c in cells], args.target)
                     for k in ("direct", "compress", "adam")}
            cert = next((n for n, c in zip(ns, cells) if c["cert"]), None)
            summary.append((d, readout, dim, psi, per, found, cert))
    print()
    print(f"Smallest N (sequences) from which the OOD error stays <= {args.target:g}; "
          "rows = N for 'last', 10 N for 'all':")
    print("| d | readout | dim = d + d^2 - 1 | psi | direct fit | min-norm + compress | "
          "Adam | local cert. from |")
    print("|" + "---|" * 8)
    for d, readout, dim, psi, per, found, cert in summary:
        def show(n):
            return "none in grid" if n is None else f"{n} ({n * per} rows)"
        adam = show(found["adam"]) if adam_epochs else "-"
        print(f"| {d} | {readout} | {dim} | {psi} | {show(found['direct'])} | "
              f"{show(found['compress'])} | {adam} | {show(cert)} |")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
