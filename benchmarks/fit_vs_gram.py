"""Fit time against the work no least-squares fit on the cubic features can avoid.

Any least-squares fit on the features of N sequences must read every token
to form the per-sequence second moments ``S_i = sum_t x_t x_t^T`` (folded,
:func:`~sklearn_linattn._features.row_factors`) and must form, or do the
arithmetic of, the Gram matrix ``Phi^T Phi`` of the N x psi feature matrix:
one SYRK.  The baseline is the sum of the two, each at its best: the moments
as the package computes them, and the faster of numpy's ``Phi.T @ Phi`` on a
C-contiguous ``Phi`` (numpy calls BLAS syrk and mirrors the triangle) and
``scipy.linalg.blas.dsyrk`` on ``Phi.T`` (its Fortran-ordered view, one
triangle only).  ``Phi`` is formed once, outside the timings.

The fit is ``LinearAttentionRegressor().fit(X, y)`` with default parameters
(validation, standardized coordinates, statistics, solve, certificate and
heads).  Moments, the two SYRKs and the fit run interleaved, round after
round; the ratio is of the best times.  :func:`fit_stages` replays the fit
stage by stage with the package's own functions and times each stage, so that
a ratio above target has its measured reason.

Usage::

    python benchmarks/fit_vs_gram.py                 # d = 4, 8, 16, 32 (d = 32 takes minutes)
    python benchmarks/fit_vs_gram.py --d 16 --threads 1 --repeats 5
"""

import argparse
import time

import numpy as np
import scipy.linalg.blas
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor
from sklearn_linattn._certificate import IdentifiabilityCertificate
from sklearn_linattn._features import n_attention_features, row_factors
from sklearn_linattn._heads import heads_from_coefficients
from sklearn_linattn._problem import StandardizedProblem, keep_rows
from sklearn_linattn._solvers import choose_solver
from sklearn_linattn._terms import LinearTerms
from sklearn_linattn._source import ArraySource
from sklearn_linattn.datasets import make_random_mhla

STAGES = ("validation", "pass", "solve", "certificate", "heads")
STAGE_TEXT = {
    "validation": "validation of the first chunk and the choice of solver",
    "pass": "the one pass over X (chunks validated, moments formed, coordinates gathered, "
            "rows mapped and accumulated into Phi^T Phi and Phi^T y, mapped into the final "
            "coordinates)",
    "solve": "solve (Gram expansion, Cholesky or eigendecomposition, extreme eigenvalues, "
             "coefficients)",
    "certificate": "certificate",
    "heads": "heads (SVD of the folded coefficients, mapped back to the data's units)",
}


def moments(X, lengths):
    """The folded second moments and last tokens of every sequence (the fit's first need)."""
    return row_factors(X, lengths)


def syrk_numpy(Phi):
    """``Phi.T @ Phi`` of a C-contiguous Phi: numpy calls syrk and mirrors the triangle."""
    return Phi.T @ Phi


def syrk_blas(Phi):
    """The upper triangle of ``Phi^T Phi`` from one ``dsyrk`` on the Fortran view ``Phi.T``."""
    return scipy.linalg.blas.dsyrk(1.0, Phi.T, trans=0, lower=0)


def fit_stages(X, y, estimator=None):
    """``estimator.fit(X, y)`` replayed stage by stage, each stage timed.

    The stages are those of ``LinearAttentionRegressor.fit`` for a NumPy X
    with readout "last", no sample weights, no intercept or skip term and no
    head compression (the defaults): ``validation`` (the checks of the first
    chunk and the solver's choice), ``pass`` (the one pass over X: chunks
    validated, moments, standardized coordinates, ``Phi^T Phi`` and
    ``Phi^T y``), ``solve`` (Gram expansion, factorisation or
    eigendecomposition, extreme eigenvalues, coefficients), ``certificate``
    (from the solve's spectrum) and ``heads`` (SVD of the folded
    coefficients, mapped back to the data's units).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
    y : ndarray of shape (n_samples,)
    estimator : LinearAttentionRegressor or None
        Its parameters must be the defaults but for ``solver``; None is
        ``LinearAttentionRegressor()``.

    Returns
    -------
    seconds : dict of str to float
        Wall time of each stage, in :data:`STAGES` order.
    result : dict
        ``coef`` (in the data's units), ``V``, ``Q``, ``certificate`` and
        ``solver``, to check against the estimator's own fit.
    """
    est = LinearAttentionRegressor() if estimator is None else estimator
    seconds = {}
    t0 = time.perf_counter()
    data = ArraySource(X, y, None, layout=est._layout(), readout=est.readout)
    d, d_out = data.d, data.d_out
    psi = n_attention_features(d)
    n_rows = data.n_rows_bound()
    solver = choose_solver(est.solver, n_rows, psi)
    terms = LinearTerms(d)
    t1 = time.perf_counter()
    problem = StandardizedProblem.from_source(
        data, readout=est.readout, terms=terms, solver=solver,
        keep=keep_rows(solver, n_rows, d, d_out))
    t2 = time.perf_counter()
    solution = problem.solve(solver, float(est.alpha))
    t3 = time.perf_counter()
    cert = IdentifiabilityCertificate._from_solution(
        solution, solution.counts, readout=est.readout, **est._layout(),
        n_tokens=solution.counts.n_tokens, coef=solution.coef,
    )
    t4 = time.perf_counter()
    standardizer = problem.standardizer
    folded = standardizer.folded(solution.coef)
    V, Q = standardizer.heads_to_user(*heads_from_coefficients(folded, d))
    coef = standardizer.coef_to_user(solution.coef)
    t5 = time.perf_counter()
    seconds = dict(zip(STAGES, np.diff([t0, t1, t2, t3, t4, t5]).tolist()))
    return seconds, dict(coef=coef, V=V, Q=Q, certificate=cert, solver=solution.method)


def check_stages(result, model):
    """Raise if the replayed fit differs from the estimator's (the breakdown would be of
    something else)."""
    if result["solver"] != model.solver_ or not np.allclose(
            result["coef"], model.coef_, rtol=1e-9, atol=1e-12 * np.abs(model.coef_).max()):
        raise AssertionError("the stage-by-stage fit does not reproduce LinearAttentionRegressor"
                             ".fit; update benchmarks/fit_vs_gram.fit_stages")


def data(d, n_samples, n_tokens, seed=0):
    """X, y of the measurement: ``make_random_mhla`` (Gaussian tokens, one-head teacher)."""
    return make_random_mhla(n_samples, n_tokens, d, random_state=seed)


def run(d, n_samples, n_tokens, threads, repeats, seed=0):
    X, y = data(d, n_samples, n_tokens, seed)
    lengths = np.full(n_samples, n_tokens)
    Phi = np.ascontiguousarray(LinearAttentionFeatures().fit(X).transform(X))
    rows = []
    with threadpool_limits(limits=threads):
        for _ in range(repeats):
            row = {}
            for name, fn in (("moments", lambda: moments(X, lengths)),
                             ("numpy", lambda: syrk_numpy(Phi)),
                             ("dsyrk", lambda: syrk_blas(Phi)),
                             ("fit", lambda: LinearAttentionRegressor().fit(X, y))):
                start = time.perf_counter()
                out = fn()
                row[name] = time.perf_counter() - start
                if name == "fit":
                    model = out
            stages, result = fit_stages(X, y)
            check_stages(result, model)
            row.update(stages)
            rows.append(row)
    best = {k: min(r[k] for r in rows) for k in rows[0]}
    syrk = min(best["numpy"], best["dsyrk"])
    return dict(d=d, psi=Phi.shape[1], solver=model.solver_, best=best,
                baseline=best["moments"] + syrk,
                ratio=best["fit"] / (best["moments"] + syrk),
                identifiable=bool(model.certificate_))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--n-samples", type=int, default=20000)
    parser.add_argument("--n-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"N = {args.n_samples}, n = {args.n_tokens}, BLAS threads = {args.threads}, best of "
          f"{args.repeats}; times in s; ratio = fit / (moments + faster SYRK)")
    print(f"{'d':>3} {'psi':>6} {'solver':>9} {'moments':>8} {'A.T@A':>8} {'dsyrk':>8} "
          f"{'fit':>8} {'ratio':>6}  " + " ".join(f"{s:>11}" for s in STAGES))
    for d in args.d:
        r = run(d, args.n_samples, args.n_tokens, args.threads, args.repeats)
        b = r["best"]
        print(f"{r['d']:>3} {r['psi']:>6} {r['solver']:>9} {b['moments']:>8.3f} "
              f"{b['numpy']:>8.3f} {b['dsyrk']:>8.3f} {b['fit']:>8.3f} {r['ratio']:>6.2f}  "
              + " ".join(f"{b[s]:>11.3f}" for s in STAGES), flush=True)


if __name__ == "__main__":
    main()
