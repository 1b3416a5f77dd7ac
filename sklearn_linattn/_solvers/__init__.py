"""Least squares in feature space: the solvers and what each can do.

Every solver minimises ``sum_rows w_row ||y_row - c H_row||^2 + alpha ||c||^2``
over the folded coefficients c, in standardized coordinates (see
:mod:`.._units`), and returns a :class:`SpectralSolution`: the
coefficients with what the identifiability certificate needs about the
spectrum of ``G = Phi^T W Phi``, and the counts of the rows it was fitted on.

:data:`REGISTRY` maps each name to a :class:`Solver` that declares what it
can do (what it reads, which spectrum it returns, its memory, whether the
pass keeps rows for it, how it runs on dask input, how it solves many
penalties at once); :func:`choose_solver` resolves ``"auto"`` once.  The
callers read the declarations, never a solver's name.  One module per
family: :mod:`.normal` (``"eigh"``, ``"cholesky"`` from
:class:`SufficientStatistics`), :mod:`.matrix` (``"svd"``, ``"dual"``),
:mod:`.cg` (matrix-free) and :mod:`.lsmr` (sparse rows).
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .._memory import DENSE_ARRAYS, resolve_budget
from ._solution import SpectralSolution
from ._statistics import RowCounts, SufficientStatistics
from .cg import cg_cache_dtype, solve_cg
from .lsmr import solve_lsmr
from .matrix import solve_dual, solve_svd
from .normal import FULL_SPECTRUM_PSI, PenaltyPath, solve_cholesky, solve_eigh

__all__ = [
    "DASK_SOLVERS",
    "REGISTRY",
    "SOLVERS",
    "STATISTICS_SOLVERS",
    "RowCounts",
    "Solver",
    "SpectralSolution",
    "SufficientStatistics",
    "check_solver_memory",
    "choose_solver",
    "solve_statistics",
    "solver_memory",
]


def _normal_equations_memory(n_rows, psi):
    return DENSE_ARRAYS * 8 * psi * psi


def _svd_memory(n_rows, psi):
    k = min(n_rows, psi)
    return 8.0 * (3 * n_rows * psi + psi * psi + 4 * k * k)


def _dual_memory(n_rows, psi):
    return 8.0 * (3 * n_rows * n_rows + n_rows * psi)


def _sized_to_budget(n_rows, psi):
    return 0.0


def _never(n_rows, d, n_blocks=1, memory_budget=None):
    return False


def _always(n_rows, d, n_blocks=1, memory_budget=None):
    return True


def _cg_keeps_rows(n_rows, d, n_blocks=1, memory_budget=None):
    # The float64 rows are the cache; a float32 cache is filled by the solver's
    # own pass, which keeps no float64 rows of twice its size.
    return cg_cache_dtype(n_rows, d, memory_budget, n_blocks) == np.float64


@dataclass(frozen=True)
class Solver:
    """A solver and what it can do.

    Attributes
    ----------
    name : str
        The ``solver`` value that selects it.
    function : callable
        ``function(stats, alpha, previous=None)`` when ``statistics`` (with
        ``previous`` an earlier solution of the same statistics whose
        decomposition serves another penalty), else ``function(rows, alpha,
        options)`` with a :class:`~.._moments.RowReader` (the standardized
        rows, or the sequences to compute them from; for ``"cg"`` on dask
        input the persisted blocks) and a dict of ``tol``, ``max_iter``,
        ``memory_budget``, ``residuals`` and ``counts``; ``alpha`` is the
        unit-free ridge penalty.
    statistics : bool
        Works from :class:`SufficientStatistics` alone: streams over chunks,
        continues with ``partial_fit``, merges Dask blocks.
    spectrum : str
        What the certificate gets: ``"eigenbasis"`` (every eigenvalue and
        the eigenvectors of the row space), ``"factor"`` (a Cholesky factor
        and the extreme eigenvalues), ``"min-vector"`` (extreme eigenvalues
        and the eigenvector of lambda_min) or ``"active-eigenbasis"`` (the
        eigenbasis over the columns non-zero in some row).
    memory : callable
        ``memory(n_rows, psi)``: bytes of the dense arrays it allocates; 0
        for solvers that size their work to the budget themselves.
    keeps_rows : callable
        ``keeps_rows(n_rows, d, n_blocks, memory_budget)``: whether the fit's
        pass keeps the standardized rows (float64) for it.
    counts_rows : bool
        Counts the rows in a pass of its own (they were not kept): the caller
        hands it an empty :class:`RowCounts` to fill (``options["counts"]``).
    sparse_only : bool
        Only worth it on sparse (one-hot) tokens; never chosen by ``"auto"``.
    dask : str or None
        How it runs on a dask array chunked along the samples:
        ``"statistics"`` (each block reduced to statistics, summed in a
        tree), ``"matrix-free"`` (each product with G a map-reduce over the
        persisted blocks) or None (not at all).
    penalty_path : object or None
        ``penalty_path(G, b, psi=, trace=, dtype=, n_penalties=, n_rows=)``: the
        solutions of many penalties from one factorization of the same Gram
        matrix (:class:`~.normal.PenaltyPath`; the cross-validation's solves),
        by the solver's own rule of zero eigenvalues.
    """

    name: str
    function: Callable
    statistics: bool
    spectrum: str
    memory: Callable
    keeps_rows: Callable = _never
    counts_rows: bool = False
    sparse_only: bool = False
    dask: str | None = None
    penalty_path: object = None


REGISTRY = {
    s.name: s
    for s in (
        Solver("eigh", solve_eigh, True, "eigenbasis", _normal_equations_memory,
               dask="statistics", penalty_path=PenaltyPath),
        Solver("cholesky", solve_cholesky, True, "factor", _normal_equations_memory,
               dask="statistics", penalty_path=PenaltyPath),
        Solver("svd", solve_svd, False, "eigenbasis", _svd_memory, keeps_rows=_always),
        Solver("dual", solve_dual, False, "eigenbasis", _dual_memory, keeps_rows=_always,
               penalty_path=PenaltyPath),
        Solver("cg", solve_cg, False, "min-vector", _sized_to_budget,
               keeps_rows=_cg_keeps_rows, counts_rows=True, dask="matrix-free"),
        Solver("lsmr", solve_lsmr, False, "active-eigenbasis", _sized_to_budget,
               sparse_only=True),
    )
}
# The values ``solver`` accepts.
SOLVERS = ("auto",) + tuple(REGISTRY)
STATISTICS_SOLVERS = tuple(name for name, s in REGISTRY.items() if s.statistics)
DASK_SOLVERS = tuple(name for name, s in REGISTRY.items() if s.dask is not None)


def choose_solver(solver, n_rows, psi, *, memory_budget=None, statistics=False, dask=False,
                  check_memory=False):
    """Resolve ``"auto"`` from the shape of the design and the memory budget.

    - Dense psi x psi arrays of the normal equations above ``memory_budget``
      -> ``"cg"`` (matrix-free).
    - Fewer rows than features (wide) -> ``"dual"`` when the kernel matrix
      and the row basis fit, else ``"cg"``.  (``"svd"`` gives the same
      minimum-norm solution; the user guide's solver table says when it is
      worth its cost.)
    - Otherwise (tall) -> ``"eigh"`` when psi <= 64, where its cost is
      negligible and it gives the whole spectrum, else ``"cholesky"``.

    Parameters
    ----------
    solver : str
        Returned unchanged unless ``"auto"``.
    n_rows : int
        Number of feature rows (an upper bound is fine).
    psi : int
        Number of features.
    memory_budget : int or None, default=None
        Bytes; None uses half the physical memory.
    statistics : bool, default=False
        Only the statistics solvers ("eigh", "cholesky") are possible.
    dask : bool, default=False
        Only the solvers that run on dask arrays (:data:`DASK_SOLVERS`): the
        statistics solver for the shape, or ``"cg"`` when its psi x psi
        arrays exceed ``memory_budget``; another ``solver`` is refused.
    check_memory : bool, default=False
        Also refuse a chosen solver whose dense arrays exceed the budget
        (:func:`check_solver_memory`).

    Returns
    -------
    solver : str
        A name in :data:`REGISTRY`.

    Raises
    ------
    ValueError
        With ``dask=True``, for a solver that does not run on dask arrays;
        with ``check_memory=True``, for a solver whose arrays exceed the budget.

    Examples
    --------
    >>> from sklearn_linattn._solvers import choose_solver
    >>> choose_solver("auto", 20000, 2176, memory_budget=2**33)
    'cholesky'
    >>> choose_solver("auto", 150000, 133120, memory_budget=2**32)
    'cg'
    >>> choose_solver("auto", 100, 2176, memory_budget=2**33)
    'dual'
    >>> choose_solver("auto", 10**6, 133120, memory_budget=2**34, dask=True)
    'cg'
    """
    if dask and solver != "auto" and REGISTRY[solver].dask is None:
        raise ValueError(
            f"dask input is processed block by block on the workers, which needs solver in "
            f"{('auto',) + DASK_SOLVERS}; got solver={solver!r}."
        )
    budget = resolve_budget(memory_budget)
    tall_choice = "eigh" if psi <= FULL_SPECTRUM_PSI else "cholesky"
    if solver != "auto":
        chosen = solver
    elif statistics:
        chosen = tall_choice
    elif n_rows < psi and not dask:
        chosen = "dual" if solver_memory("dual", n_rows, psi) <= budget else "cg"
    else:
        chosen = tall_choice if solver_memory(tall_choice, n_rows, psi) <= budget else "cg"
    if check_memory:
        _check_memory(chosen, n_rows, psi, budget)
    return chosen


def solver_memory(solver, n_rows, psi):
    """Bytes of the dense arrays a solver allocates for a design of n_rows x psi.

    ``"eigh"`` and ``"cholesky"`` hold about 3.25 psi x psi float64 arrays
    (statistics, Gram matrix, eigenvectors or factor); ``"svd"`` the design
    matrix, its copy for LAPACK and the factors (``3 n_rows psi + psi**2 + 4
    k**2`` values, k = min(n_rows, psi)); ``"dual"`` the n_rows x n_rows
    kernel, its eigenvectors and LAPACK's work space, and the row basis
    (``3 n_rows**2 + n_rows psi`` values).  ``"cg"`` sizes its cache and
    Lanczos vectors to the budget and ``"lsmr"`` checks its sparse rows while
    it builds them, so both count 0 here.

    Parameters
    ----------
    solver : str
        A name in :data:`REGISTRY`.
    n_rows, psi : int
        Shape of the design.

    Returns
    -------
    float
        Bytes.

    Examples
    --------
    >>> from sklearn_linattn._solvers import solver_memory
    >>> round(solver_memory("dual", 1000, 936) / 2**20, 1)  # MiB
    30.0
    """
    return float(REGISTRY[solver].memory(int(n_rows), int(psi)))


def check_solver_memory(solver, n_rows, psi, memory_budget=None):
    """Raise a ValueError before a solver allocates more than the memory budget.

    The message gives the estimate (:func:`solver_memory`), the budget and
    the solvers whose arrays would fit.
    """
    _check_memory(solver, n_rows, psi, resolve_budget(memory_budget))


def _check_memory(solver, n_rows, psi, budget):
    need = solver_memory(solver, n_rows, psi)
    if need <= budget:
        return
    fits = [name for name, s in REGISTRY.items()
            if not s.sparse_only and solver_memory(name, n_rows, psi) <= budget]
    what = {
        "dual": f"the {n_rows} x {n_rows} kernel matrix of N = {n_rows} feature rows",
        "svd": f"the {n_rows} x {psi} design matrix and its SVD",
    }.get(solver, f"{psi} x {psi} dense matrices (psi = {psi} features)")
    raise ValueError(
        f"solver={solver!r} needs about {need / 2**30:.3g} GiB for {what}, more than the "
        f"memory budget of {budget / 2**30:.3g} GiB (half the physical memory); solvers "
        f"whose arrays fit: {fits}."
    )


def solve_statistics(stats, alpha=0.0, solver="eigh", *, previous=None):
    """Finish a fit from sufficient statistics.

    Statistics accumulated anywhere (chunks of a stream, blocks of a
    distributed array combined with :meth:`SufficientStatistics.merge`) give
    the same coefficients and spectrum as a fit on all the data at once.

    Parameters
    ----------
    stats : SufficientStatistics
        At least one row of positive weight.
    alpha : float, default=0.0
        Ridge penalty; 0 gives the minimum-norm least-squares solution.
    solver : {"eigh", "cholesky", "auto"}, default="eigh"
        ``"auto"`` picks by shape as :func:`choose_solver` does.
    previous : SpectralSolution or None, default=None
        An earlier solution of the same statistics: its eigen-decomposition,
        when it has one, serves this penalty (the solver's choice does not
        depend on the penalty).

    Returns
    -------
    solution : SpectralSolution
        With ``counts`` the statistics themselves.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._solvers import SufficientStatistics, solve_statistics
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(40, 4, 2))
    >>> y = (X[:, :, 0] ** 2).sum(axis=1) * X[:, -1, 1]  # a linear-attention output
    >>> stats = SufficientStatistics(2, 1).update(X, np.full(40, 4), y[:, None])
    >>> solution = solve_statistics(stats)
    >>> solution.rank, np.round(solution.coef, 8) + 0.0
    (6, array([[0., 1., 0., 0., 0., 0.]]))
    """
    if not isinstance(stats, SufficientStatistics):
        raise TypeError(f"stats must be a SufficientStatistics; got {type(stats).__name__}.")
    if solver == "auto":
        solver = choose_solver("auto", stats.n_rows, stats.n_features, statistics=True)
    if solver not in STATISTICS_SOLVERS:
        raise ValueError(
            f"solver must be one of {('auto',) + STATISTICS_SOLVERS} to solve from sufficient "
            f"statistics; got {solver!r} (it needs the sequences themselves)."
        )
    if stats.n_rows == 0:
        raise ValueError(
            "stats hold no feature row: every sequence so far had zero weight, or none "
            "was added; there is nothing to fit."
        )
    solution = REGISTRY[solver].function(stats, alpha, previous=previous)
    solution.counts = stats
    return solution
