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

from ._certificate import IdentifiabilityCertificate, row_space_from_solution
from ._heads import HeadChoice, LocalCertificate, fit_low_rank_heads, select_heads
from ._terms import fit_terms

__all__ = ["StandardizedModel", "fit_model"]

@dataclass
class StandardizedModel:
    """A fitted model in the standardized coordinates of its problem.

    Attributes
    ----------
    standardizer : TokenStandardizer
    coef : ndarray of shape (d_out, psi)
        Standardized coefficients.
    beta : ndarray of shape (n_columns, d_out)
        Standardized term coefficients (columns ``[window, 1, x]``).
    V, Q : ndarray
        Standardized heads.
    head_decays : ndarray of shape (n_heads,) or None
        The decay of every head (None: no decays).
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
    head_decays: np.ndarray | None
    certificate: IdentifiabilityCertificate
    local_certificate: LocalCertificate | None
    compression_residual: float | None
    solver: str
    n_iter: int
    feature_rank: int
    terms: object
    counts: object
    head_dim_gap: np.ndarray | None = None
    window_exponents: np.ndarray | None = None

    def to_user(self):
        """The model in the data's units: the one conversion back.

        Returns
        -------
        attributes : dict
            ``coef_``, ``intercept_``, ``skip_coef_``, ``linear_coef_`` (None
            without the linear term), ``value_matrices_``,
            ``key_query_matrices_`` and ``head_decays_``.  A number that float64 cannot hold in the
            data's units raises a ValueError naming it.
        """
        st = self.standardizer
        d_out = self.coef.shape[0]
        intercept, skip, linear = st.terms_to_user(self.beta, self.terms, d_out,
                                                   self.window_exponents)
        V, Q = st.heads_to_user(self.V, self.Q)
        return dict(coef_=st.coef_to_user(self.coef), intercept_=intercept,
                    skip_coef_=skip, linear_coef_=linear, value_matrices_=V,
                    key_query_matrices_=Q,
                    head_decays_=None if self.head_decays is None else self.head_decays.copy())


def fit_model(problem, *, solver, alpha=0.0, tol=1e-8, max_iter=None, n_heads=None,
              head_dim=None, random_state=None, token_dim=None, data_format="channels_last",
              direct=True, log=None):
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
    n_heads : int, "auto" or None
        Compress to at most this many heads; ``"auto"``: to the fewest whose
        compression is not material (:func:`~._heads.select_heads`).
    head_dim : int or None
        Fit ``n_heads`` heads of rank at most this instead
        (:func:`~._heads.fit_low_rank_heads`).
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
                             residuals=bool(terms.n_columns) and not alpha)
    # The linear term's columns are targets of the solve, eliminated with the terms.
    d_out = problem.d_out - terms.n_window
    log(f"least squares on {solution.n_features} features (solver={solution.method!r})")
    counts = solution.counts
    beta = np.zeros((terms.n_columns, d_out))
    term_space = None
    if terms.n_columns:
        # The certificate is about the data, never the penalty: with alpha > 0
        # the unpenalized solve of the same rows or statistics (no new pass).
        free = None if not alpha else problem.solve(solver, 0.0, tol=tol, max_iter=max_iter,
                                                    residuals=True)
        solution, term_space, beta = fit_terms(solution, counts, terms, d_out,
                                               rows=problem.rows, free=free)
    row_space = row_space_from_solution(solution, counts)
    certificate = IdentifiabilityCertificate._from_solution(
        solution, counts, readout=problem.readout, token_dim=token_dim,
        data_format=data_format, n_tokens=counts.n_tokens, coef=solution.coef,
        terms=term_space, row_space=row_space,
    )
    st = problem.standardizer
    window_exponents = None
    if st.y_exponents is not None and st.y_exponents.size > d_out:
        # Past the elimination the model has its real outputs only (a search's
        # coordinates may also hold the linear term's columns it left out).
        window_exponents = st.y_exponents[d_out:d_out + terms.n_window]
        st = st.with_outputs(d_out)
    # An unidentified fit may have a k-head minimizer that its minimum-norm
    # point hides: heads may be fitted to the rows directly when a
    # compression is material (rows of one block: the few-head fit knows no
    # decays).
    direct_rows = (problem.kept if direct and not terms.n_columns and st.decays is None
                   and not certificate.identifiable else None)
    if head_dim is not None:
        low = fit_low_rank_heads(solution.coef, row_space, counts, st.pair_weights,
                                 n_heads=n_heads, head_dim=head_dim, gram=solution.gram_product,
                                 random_state=random_state, log=log)
        choice = HeadChoice(low.V, low.Q, None, None, None)
    else:
        choice = select_heads(solution, row_space, counts, st, n_heads=n_heads,
                              rows=direct_rows, random_state=random_state, log=log)
    return StandardizedModel(
        standardizer=st, coef=solution.coef, beta=beta, V=choice.V, Q=choice.Q,
        head_decays=choice.head_decays, certificate=certificate,
        local_certificate=choice.local_certificate,
        compression_residual=choice.compression_residual,
        solver=solution.method, n_iter=max(1, int(solution.n_iter)),
        feature_rank=solution.rank, terms=terms, counts=counts,
        head_dim_gap=None if head_dim is None else low.excess,
        window_exponents=window_exponents,
    )
