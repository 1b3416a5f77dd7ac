"""Solving in-memory arrays in one call, for tests of the solvers and the certificate.

The package's fit path (source, one pass, standardized problem, registry solver)
on already validated arrays, returning the standardized solution.
"""

import numpy as np

from sklearn_linattn._features import n_attention_features
from sklearn_linattn._moments import count_rows
from sklearn_linattn._problem import StandardizedProblem, keep_rows
from sklearn_linattn._solvers import REGISTRY, check_solver_memory, choose_solver
from sklearn_linattn._source import ArraySource
from sklearn_linattn._terms import LinearTerms


def solve_arrays(X, lengths, Y, *, readout="last", alpha=0.0, solver="auto",
                 sample_weight=None, tol=1e-8, max_iter=None, memory_budget=None,
                 standardizer=None):
    """The standardized solution (``SpectralSolution``) of padded arrays X (lengths given) and
    targets Y as validated (None: the spectrum only), in coordinates ``standardizer`` (None:
    computed from X)."""
    d = X.shape[2]
    psi = n_attention_features(d)
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
    n_rows = count_rows(np.asarray(lengths), readout, sample_weight)
    solver = choose_solver(solver, n_rows, psi, memory_budget=memory_budget)
    if solver not in REGISTRY:
        raise ValueError(f"solver must be one of {tuple(REGISTRY)}; got {solver!r}.")
    check_solver_memory(solver, n_rows, psi, memory_budget)
    source = ArraySource.validated(X, lengths, Y, sample_weight, readout)
    problem = StandardizedProblem.from_source(
        source, readout=readout, terms=LinearTerms(d), solver=solver,
        keep=keep_rows(solver, n_rows, d, 0 if Y is None else Y.shape[-1], memory_budget),
        fixed=standardizer)
    try:
        return problem.solve(solver, alpha, tol=tol, max_iter=max_iter,
                             memory_budget=memory_budget)
    finally:
        problem.release()
