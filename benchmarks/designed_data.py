"""Designed identifying inputs against i.i.d. Gaussian inputs of the same size.

For each token dimension d and readout, the minimal design of
:func:`sklearn_linattn.design.identifying_design` (psi sequences for
``readout="last"``, :func:`~sklearn_linattn.design.minimum_design_size` for
``"all"``) against standard Gaussian sequences of the same shape (same
number of sequences, same length, same token scale: the certificate whitens
both to unit token second moment), over several seeds.  Printed: the
certificate's ``min_eigenvalue`` (median, min and max over the seeds), the
share of Gaussian draws whose certificate holds, and the design's time.
A second table gives the fewest sequences for ``readout="all"`` per d and
n_tokens: the formula, ``ceil(psi / n_tokens)``, and the least number of
Gaussian sequences whose certificate holds (measured).

Run:  python benchmarks/designed_data.py [--dims 2 3 4 6] [--n-tokens 4] [--seeds 3] [--max-iter 100]

It took 619 s on two shared cores (d = 6 dominates: about 1.5 min per design);
``--dims 2 3 4`` takes under a minute.  d = 8 (psi = 288) was not run.
"""

import argparse
import math
import time

import numpy as np

from sklearn_linattn import certify_identifiability
from sklearn_linattn.design import identifying_design, minimum_design_size


def lambda_table(dims, n_tokens, seeds, max_iter):
    print(f"lambda_min of the certificate, minimal size, n_tokens = {n_tokens}, "
          f"{seeds} seeds (median [min, max])")
    print(f"{'d':>2} {'readout':>7} {'psi':>4} {'n':>4} | {'designed':>28} | "
          f"{'i.i.d. Gaussian':>28} {'holds':>5} | {'ratio':>8} {'time s':>6}")
    for d in dims:
        for readout in ("last", "all"):
            n = minimum_design_size(d, n_tokens=n_tokens, readout=readout)
            designed, gaussian, holds, seconds = [], [], 0, 0.0
            for seed in range(seeds):
                start = time.perf_counter()
                X = identifying_design(d, n_tokens=n_tokens, readout=readout,
                                       max_iter=max_iter, random_state=seed)
                seconds += time.perf_counter() - start
                cert = certify_identifiability(X, readout=readout)
                assert cert, (d, readout, seed)
                designed.append(cert.min_eigenvalue)
                G = np.random.default_rng(1000 + seed).standard_normal(X.shape)
                cert = certify_identifiability(G, readout=readout)
                gaussian.append(cert.min_eigenvalue)
                holds += bool(cert)

            def stats(v):
                return f"{np.median(v):9.3g} [{min(v):8.2g}, {max(v):8.2g}]"

            ratio = np.median(designed) / max(np.median(gaussian), 1e-300)
            print(f"{d:>2} {readout:>7} {d * d * (d + 1) // 2:>4} {n:>4} | {stats(designed)} | "
                  f"{stats(gaussian)} {holds:>2}/{seeds:<2} | {ratio:8.2g} {seconds / seeds:6.1f}",
                  flush=True)


def size_table(dims, lengths):
    print("\nfewest sequences for readout='all' (formula / ceil(psi / n_tokens) / measured with "
          "Gaussian sequences)")
    print(f"{'d':>2} {'psi':>4} " + " ".join(f"{'T=' + str(t):>12}" for t in lengths))
    for d in dims:
        psi = d * d * (d + 1) // 2
        cells = []
        for t in lengths:
            n = minimum_design_size(d, n_tokens=t, readout="all")
            rng = np.random.default_rng(0)
            measured = next(m for m in range(max(1, n - 2), n + 3)
                            if certify_identifiability(rng.standard_normal((m, t, d)),
                                                       readout="all"))
            cells.append(f"{n}/{math.ceil(psi / t)}/{measured}")
        print(f"{d:>2} {psi:>4} " + " ".join(f"{c:>12}" for c in cells), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 3, 4, 6])
    parser.add_argument("--n-tokens", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-iter", type=int, default=100)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    lambda_table(args.dims, args.n_tokens, args.seeds, args.max_iter)
    size_table(args.dims, (2, 3, 4, 8))
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
