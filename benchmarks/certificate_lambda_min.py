"""lambda_min of the identifiability certificate on the associative-memory task.

Reproduces the x-axis of the paper's Fig. 2 (Sec. 4.2): d = 4 (tokens in
R^8, psi = 288 cubic features), N = 2**14 sequences per dataset.  Keys and
values are Gaussian (identifiable) or random orthonormal bases redrawn per
sample (not identifiable), or a mixture with a given fraction of orthonormal
samples.  Prints lambda_min and lambda_max of Lambda_D = (1/N) Phi^T Phi, the
threshold tol of the package's rule, the rank, the verdict and the time.

Run:  python benchmarks/certificate_lambda_min.py [--n-samples 16384] [--d 4] [--seed 0]
"""

import argparse
import time

from threadpoolctl import threadpool_limits

from sklearn_linattn import certify_identifiability
from sklearn_linattn.datasets import make_associative_memory

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def row(label, X):
    start = time.perf_counter()
    cert = certify_identifiability(X)
    seconds = time.perf_counter() - start
    print(
        f"{label:<28} {cert.min_eigenvalue:>11.3e} {cert.max_eigenvalue:>11.3e} "
        f"{cert.tol:>10.2e} {cert.rank:>4d}/{cert.n_features:<4d} "
        f"{str(bool(cert)):>12} {seconds:>7.2f}"
    )
    return cert


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=2**14)
    parser.add_argument("--d", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads")
    args = parser.parse_args(argv)
    n, d = args.n_samples, args.d
    print(f"associative memory, d = {d} (tokens in R^{2 * d}), N = {n}, seed = {args.seed}")
    print(
        f"{'keys / values':<28} {'lambda_min':>11} {'lambda_max':>11} {'tol':>10} "
        f"{'rank':>9} {'identifiable':>12} {'time s':>7}"
    )
    with threadpool_limits(limits=args.threads, user_api="blas"):
        for dist in ("gaussian", "orthonormal"):
            X, _ = make_associative_memory(n, d, distribution=dist, random_state=args.seed)
            row(dist, X)
        print("mixture, fraction orthonormal:")
        for p in FRACTIONS:
            X, _, params = make_associative_memory(
                n, d, distribution="mixture", p_orthonormal=p,
                random_state=args.seed, return_params=True,
            )
            frac = params["orthonormal"].mean()
            row(f"  p = {p:<4} (actual {frac:.3f})", X)


if __name__ == "__main__":
    main()
