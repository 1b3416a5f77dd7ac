"""The "cholesky" solver's extreme eigenvalues: where its solve time goes, and symv against G @ v.

Builds the Gram matrix ``Phi^T Phi`` of the ``gram`` row's data
(``make_random_mhla``, N sequences of n tokens, readout "last") at each d,
then times, in one process and interleaved (best of ``--repeats``):

- ``scipy``: Lanczos for lambda_max with scipy's own dense product
  (``eigsh(G)``, each product ``G @ v`` reads all psi**2 entries);
- ``package``: :func:`sklearn_linattn._spectrum.largest_eigenvalue` (the same
  Lanczos, each product a BLAS ``symv`` reading one triangle);
- ``full`` and ``upper``: the Gram matrix expanded from its compact
  statistics whole, and its upper block triangle alone (what the
  ``"cholesky"`` solve reads);
- ``cholesky``: the factorisation alone (on a copy);
- ``lambda_min``: Lanczos on ``G^{-1}`` through the factor (two triangular
  solves per product).

The two lambda_max agree to rounding (printed: their relative difference).

Run:  python benchmarks/dense_extremes.py [--d 16 32] [--n-samples 20000] [--n-tokens 64]
      [--threads 1] [--repeats 2]
"""

import argparse
import time

from scipy.sparse.linalg import eigsh
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor
from sklearn_linattn._problem import StandardizedProblem
from sklearn_linattn._solvers.normal import _cholesky
from sklearn_linattn._spectrum import (
    _LANCZOS_RTOL,
    largest_eigenvalue,
    smallest_eigenvalue_from_cholesky,
    start_vectors,
)
from sklearn_linattn._terms import LinearTerms
from sklearn_linattn._source import ArraySource
from sklearn_linattn.datasets import make_random_mhla


def statistics(d, n_samples, n_tokens, seed=0):
    """The fit's statistics (standardized coordinates) of the ``gram`` row's data."""
    X, y = make_random_mhla(n_samples, n_tokens, d, random_state=seed)
    est = LinearAttentionRegressor()
    data = ArraySource(X, y, None, layout=est._layout(), readout=est.readout)
    problem = StandardizedProblem.from_source(data, readout=est.readout, terms=LinearTerms(d),
                                              solver="cholesky")
    return problem.stats


def scipy_largest(G):
    """lambda_max by the same Lanczos with scipy's dense product ``G @ v``."""
    v0 = start_vectors(G.shape[0])[:, 0]
    return float(eigsh(G, k=1, which="LA", tol=_LANCZOS_RTOL, v0=v0,
                       return_eigenvectors=False)[0])


def best(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--n-samples", type=int, default=20000)
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"N = {args.n_samples}, n = {args.n_tokens}, BLAS threads = {args.threads}, best of "
          f"{args.repeats}; times in s")
    print(f"{'d':>3} {'psi':>6} {'scipy':>8} {'package':>8} {'ratio':>6} {'rel.diff':>9} "
          f"{'full':>7} {'upper':>7} {'cholesky':>9} {'lambda_min':>10}")
    with threadpool_limits(limits=args.threads):
        for d in args.d:
            stats = statistics(d, args.n_samples, args.n_tokens)
            t_full, G = best(lambda: stats.gram, args.repeats)
            t_upper, _ = best(lambda: stats.expanded_gram(upper=True), args.repeats)
            t_scipy, l_scipy = best(lambda: scipy_largest(G), args.repeats)
            t_ours, l_ours = best(lambda: largest_eigenvalue(G), args.repeats)
            t_chol, L = best(lambda: _cholesky(G.copy()), args.repeats)
            t_min, _ = best(lambda: smallest_eigenvalue_from_cholesky(L), args.repeats)
            print(f"{d:>3} {G.shape[0]:>6} {t_scipy:>8.3f} {t_ours:>8.3f} "
                  f"{t_scipy / t_ours:>6.2f} {abs(l_scipy - l_ours) / l_scipy:>9.1e} "
                  f"{t_full:>7.3f} {t_upper:>7.3f} {t_chol:>9.3f} {t_min:>10.3f}", flush=True)
            stats = G = L = None  # free the psi x psi arrays before the next d


if __name__ == "__main__":
    main()
