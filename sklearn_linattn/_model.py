"""From a standardized problem to a fitted model: solved, certified, in heads, converted once.

:func:`fit_model` runs the rest of a fit in the standardized coordinates of
its :class:`~._problem.StandardizedProblem`: the solve (and, with a penalty
and linear terms, the unpenalized solve the certificate is about, from the
same rows or statistics), the elimination of the intercept and skip terms,
the identifiability certificate, the heads by SVD, their compression and, for
an unidentified fit whose compression is material, heads fitted to the same
standardized rows.  The result, a :class:`StandardizedModel`, is converted
to the data's units exactly once (:meth:`StandardizedModel.to_user`), like
scikit-learn's ``_set_intercept`` at the end of ``Ridge.fit``.
"""

from dataclasses import dataclass

import numpy as np

from ._attention import attention_coefficients
from ._certificate import IdentifiabilityCertificate, row_space_from_solution
from ._fewheads import fit_standardized_heads
from ._head_rows import fit_heads_memory, fit_heads_work
from ._local_certificate import LocalCertificate
from ._heads import CompressionJudge, compress_heads, heads_from_coefficients
from ._memory import resolve_budget
from ._solvers import REGISTRY
from ._terms import fit_terms

__all__ = ["StandardizedModel", "fit_model"]

# An unidentified fit's heads are fitted to the data directly only when one
# Levenberg-Marquardt step (an SVD of the Jacobian) stays below this many
# floating-point operations, about a second here: restarts and iterations
# multiply it.
DIRECT_FIT_WORK = 2e9


@dataclass
class StandardizedModel:
    """A fitted model in the standardized coordinates of its problem.

    Attributes
    ----------
    standardizer : TokenStandardizer
    coef : ndarray of shape (d_out, psi)
        Standardized coefficients.
    beta : ndarray of shape (n_terms, d_out)
        Standardized intercept and skip coefficients (term columns ``[1, x]``).
    V, Q : ndarray
        Standardized heads.
    certificate : IdentifiabilityCertificate
    local_certificate : LocalCertificate or None
    compression_residual : float or None
    solver : str
    n_iter : int
    feature_rank : int
    terms : LinearTerms
    counts : RowCounts
        The counts (and statistics, for the statistics solvers) of the rows.
    """

    standardizer: object
    coef: np.ndarray
    beta: np.ndarray
    V: np.ndarray
    Q: np.ndarray
    certificate: IdentifiabilityCertificate
    local_certificate: LocalCertificate | None
    compression_residual: float | None
    solver: str
    n_iter: int
    feature_rank: int
    terms: object
    counts: object

    def to_user(self):
        """The model in the data's units: the one conversion back.

        Returns
        -------
        attributes : dict
            ``coef_``, ``intercept_``, ``skip_coef_``, ``value_matrices_`` and
            ``key_query_matrices_``.  A number that float64 cannot hold in the
            data's units raises a ValueError naming it.
        """
        st = self.standardizer
        d_out = self.coef.shape[0]
        intercept, skip = self.terms.to_user(self.beta, st, d_out)
        V, Q = st.heads_to_user(self.V, self.Q)
        return dict(coef_=st.coef_to_user(self.coef), intercept_=intercept,
                    skip_coef_=skip, value_matrices_=V, key_query_matrices_=Q)


def _direct_fit_affordable(rows, d, d_out, n_heads):
    shape = (rows.n_rows, d, d_out, n_heads)
    return (fit_heads_memory(*shape) <= resolve_budget(None)
            and fit_heads_work(*shape) <= DIRECT_FIT_WORK)


def fit_model(problem, *, solver, alpha=0.0, tol=1e-8, max_iter=None, n_heads=None,
              random_state=None, token_dim=None, data_format="channels_last", direct=True,
              log=None):
    """Solve, certify and split into heads, all in the problem's standardized coordinates.

    Parameters
    ----------
    problem : StandardizedProblem
    solver : str
        A name of the solver registry (``"auto"`` resolved).
    alpha : float
        The unit-free ridge penalty.
    tol, max_iter : float, int or None
        Options of the iterative solvers.
    n_heads : int or None
        Compress to at most this many heads.
    random_state : None, int or RandomState
        Seeds the compression's restarts and a direct head fit.
    token_dim, data_format
        How the certificate reads new inputs.
    direct : bool
        Allow heads fitted to the rows directly (needs the rows).
    log : callable or None
        ``log(message)`` for ``verbose`` progress.

    Returns
    -------
    StandardizedModel
    """
    log = log if log is not None else (lambda message: None)
    terms = problem.terms
    solution = problem.solve(solver, alpha, tol=tol, max_iter=max_iter,
                             residuals=bool(terms) and not alpha)
    d, d_out = problem.d, problem.d_out
    log(f"least squares on {solution.n_features} features (solver={solution.method!r})")
    counts = solution.counts
    beta = np.zeros((terms.n_terms, d_out))
    term_space = None
    if terms:
        # The certificate is about the data, never the penalty: with alpha > 0
        # the unpenalized solve of the same rows or statistics (no new pass).
        free = None if not alpha else problem.solve(solver, 0.0, tol=tol, max_iter=max_iter,
                                                    residuals=True)
        design = None if getattr(counts, "moment", None) is not None or (
            solution.moment is not None) else problem.design()
        solution, term_space, beta = fit_terms(solution, counts, terms, d_out,
                                               design=design, free=free)
    row_space = row_space_from_solution(solution, counts)
    certificate = IdentifiabilityCertificate._from_solution(
        solution, counts, readout=problem.readout, token_dim=token_dim,
        data_format=data_format, n_tokens=counts.n_tokens, coef=solution.coef,
        terms=term_space, row_space=row_space,
    )
    st = problem.standardizer
    coef = solution.coef
    folded = st.folded(coef)
    V, Q = heads_from_coefficients(folded, d)
    log(f"{V.shape[0]} heads from the SVD")
    compression_residual = local = None
    if n_heads is not None and V.shape[0] > n_heads:
        moment = getattr(counts, "moment", None)
        moment = solution.moment if moment is None else moment
        accuracy = None
        if REGISTRY[solution.method].spectrum == "min-vector":  # CG, stopped at tol
            floor = solution.lambda_min - solution.lambda_min_error
            accuracy = (tol * np.sqrt(solution.lambda_max / floor) if floor > 0 else None)
        judge = CompressionJudge(coef, row_space, counts, pair_weights=st.pair_weights,
                                 n_outputs=d_out, gram=solution.gram_product,
                                 moment=None if moment is None else moment[:, :d_out],
                                 accuracy=accuracy)
        V, Q, compression_residual = compress_heads(
            folded, d, n_heads, tol=judge.tolerance(), random_state=random_state, warn=False)
        excess = judge.excess(V, Q)
        rows = problem.rows
        if (direct and not terms and rows is not None and not certificate
                and judge.is_material(excess) and _direct_fit_affordable(rows, d, d_out, n_heads)):
            # The data do not determine the unconstrained fit, and its
            # minimum-norm point has no k-head form: fit k heads to the rows.
            Vd, Qd, local_d = fit_standardized_heads(rows, n_heads, st.pair_weights,
                                                     random_state=random_state,
                                                     dtype=counts.dtype)
            excess_d = judge.excess(Vd, Qd)
            if excess_d < excess:
                V, Q, excess, local = Vd, Qd, excess_d, local_d
                norm = np.linalg.norm(folded)
                gap = np.linalg.norm(attention_coefficients(Vd, Qd) - folded)
                compression_residual = float(gap / norm) if norm > 0 else float(gap)
                log(f"{n_heads} heads fitted to the data directly (local certificate "
                    f"{'holds' if local_d else 'fails'})")
        judge.warn_if_material(excess, n_heads)
        log(f"compressed to {n_heads} heads, relative coefficient residual "
            f"{compression_residual:.2e}")
    return StandardizedModel(
        standardizer=st, coef=coef, beta=beta, V=V, Q=Q, certificate=certificate,
        local_certificate=local, compression_residual=compression_residual,
        solver=solution.method, n_iter=max(1, int(solution.n_iter)),
        feature_rank=solution.rank, terms=terms, counts=counts,
    )
