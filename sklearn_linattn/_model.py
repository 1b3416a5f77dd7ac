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
from ._heads import CompressionJudge, compress_heads, heads_from_coefficients, joined_heads
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

    def to_user(self):
        """The model in the data's units: the one conversion back.

        Returns
        -------
        attributes : dict
            ``coef_``, ``intercept_``, ``skip_coef_``, ``value_matrices_``,
            ``key_query_matrices_`` and ``head_decays_``.  A number that float64 cannot hold in the
            data's units raises a ValueError naming it.
        """
        st = self.standardizer
        d_out = self.coef.shape[0]
        intercept, skip = self.terms.to_user(self.beta, st, d_out)
        V, Q = st.heads_to_user(self.V, self.Q)
        return dict(coef_=st.coef_to_user(self.coef), intercept_=intercept,
                    skip_coef_=skip, value_matrices_=V, key_query_matrices_=Q,
                    head_decays_=None if self.head_decays is None else self.head_decays.copy())


@dataclass
class _Heads:
    """Heads proposed for one head count: the compression (or direct fit) and its verdict."""

    V: np.ndarray
    Q: np.ndarray
    residual: float
    excess: float
    local: LocalCertificate | None


class _HeadGroups:
    """The heads of each feature block (one group per decay; one group without decays).

    ``groups[b]`` holds block b's heads ``(V, Q)``, from the SVD of its
    folded coefficients until a compression replaces them.
    """

    def __init__(self, folded, d, decays):
        self.d, self.decays = d, decays
        self.folded = np.split(folded, 1 if decays is None else len(decays), axis=1)
        self.whole = folded
        self.groups = [heads_from_coefficients(f, d) for f in self.folded]

    @property
    def sizes(self):
        return [V.shape[0] for V, _ in self.groups]

    @property
    def n_heads(self):
        return sum(self.sizes)

    def replaced(self, b, V, Q):
        """The groups with block b's heads replaced (a new list)."""
        return self.groups[:b] + [(V, Q)] + self.groups[b + 1:]

    def coefficients(self, groups):
        """Folded coefficients of every block's heads, side by side."""
        V, Q, head_decays = joined_heads(groups, self.decays)
        return attention_coefficients(V, Q, decays=head_decays, blocks=self.decays)

    def gap(self, groups):
        """Relative coefficient residual of the groups' heads."""
        norm = np.linalg.norm(self.whole)
        gap = np.linalg.norm(self.coefficients(groups) - self.whole)
        return float(gap / norm) if norm > 0 else float(gap)

    def heads(self):
        """All heads, block by block, and the decay of each (None without decays)."""
        return joined_heads(self.groups, self.decays)


def _relative_gap(V, Q, folded):
    """``||p(V, Q) - folded|| / ||folded||`` (the gap itself when folded is zero)."""
    norm = np.linalg.norm(folded)
    gap = np.linalg.norm(attention_coefficients(V, Q) - folded)
    return float(gap / norm) if norm > 0 else float(gap)


def _fewest_heads(n_svd, heads, is_material, svd, log):
    """The fewest heads whose compression is not material, by exponential search and bisection.

    Counts 1, 2, 4, ... below ``n_svd`` are tried until one is not material
    (``n_svd``, the SVD's own heads ``svd``, when none is), then the gap to the
    last material count is bisected.  Every count returned has been judged
    not material (or is the SVD's), and every count tried below it was
    material.  The best compression residual never grows with the count (an
    extra zero head changes nothing), so the verdicts are monotone but for
    searches that miss a global minimum.  Material counts are the costly
    ones (every start runs); for an answer of k this tries the same ones as
    a scan from 1 up to k = 4, and at most ``2 log2(k)`` of them beyond
    instead of ``k - 1`` (at most 11 compressions in all for 64 SVD heads).

    Parameters
    ----------
    n_svd : int
        Number of SVD heads, at least 2.
    heads : callable
        ``heads(k)``: the :class:`_Heads` of k heads.
    is_material : callable
        ``is_material(excess)``: the judge's verdict.
    svd : _Heads
        The SVD's heads (``n_svd`` of them).
    log : callable

    Returns
    -------
    _Heads
    """
    tried = {n_svd: svd}

    def material(k):
        tried[k] = heads(k)
        verdict = bool(is_material(tried[k].excess))
        log(f"n_heads='auto': {k} head{'' if k == 1 else 's'} "
            f"{'material' if verdict else 'not material'} (excess risk "
            f"{tried[k].excess:.3g}, relative coefficient residual {tried[k].residual:.2e})")
        return verdict

    below, above = 0, n_svd  # largest count found material, smallest found not material
    k = 1
    while k < n_svd:
        if not material(k):
            above = k
            break
        below, k = k, 2 * k
    while above - below > 1:
        mid = (below + above) // 2
        if material(mid):
            below = mid
        else:
            above = mid
    return tried[above]


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
    n_heads : int, "auto" or None
        Compress to at most this many heads; ``"auto"``: to the fewest whose
        compression is not material by the :class:`CompressionJudge`
        (:func:`_fewest_heads`).
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
    blocks = _HeadGroups(folded, d, st.decays)
    n_svd = blocks.n_heads
    log(f"{n_svd} heads from the SVD")
    compression_residual = local = None
    auto = isinstance(n_heads, str)  # "auto", validated by the caller
    # With decays, every block's group of heads is compressed on its own (to at
    # most n_heads), judged on the coefficients of all the groups together.
    # With decays, "auto" may also drop a decay's group whole (a block the data
    # leave at rounding level), so every group with a head is tried.
    fewest = 0 if auto and st.decays is not None else 1
    to_compress = [b for b, size in enumerate(blocks.sizes)
                   if (size > fewest if auto else n_heads is not None and size > n_heads)]
    if auto and not to_compress:
        # Nothing fewer to try: the SVD heads, whose residual is rounding.
        compression_residual = blocks.gap(blocks.groups)
    elif to_compress:
        moment = getattr(counts, "moment", None)
        moment = solution.moment if moment is None else moment
        accuracy = None
        if REGISTRY[solution.method].spectrum == "min-vector":  # CG, stopped at tol
            floor = solution.lambda_min - solution.lambda_min_error
            accuracy = (tol * np.sqrt(solution.lambda_max / floor) if floor > 0 else None)
        judge = CompressionJudge(coef, row_space, counts, pair_weights=st.pair_weights,
                                 n_outputs=d_out, gram=solution.gram_product,
                                 moment=None if moment is None else moment[:, :d_out],
                                 accuracy=accuracy,
                                 residual_sq=getattr(solution, "residual_sq", None))
        rows = problem.rows
        # An unidentified fit may have a k-head minimizer that its minimum-norm
        # point hides: fit k heads to the rows when the compression is material
        # (rows of one block: the few-head fit knows no decays).
        may_fit_directly = (direct and not terms and rows is not None and not certificate
                            and st.decays is None)
        for b in to_compress:
            def heads(k, b=b):
                """Block b's k heads ``n_heads=k`` returns, and the excess training risk."""
                Vk, Qk, residual = compress_heads(blocks.folded[b], d, k,
                                                  tol=judge.tolerance(),
                                                  random_state=random_state, warn=False)
                trial = blocks.replaced(b, Vk, Qk)
                excess, local_k = judge.excess_of(blocks.coefficients(trial)), None
                if (may_fit_directly and judge.is_material(excess)
                        and _direct_fit_affordable(rows, d, d_out, k)):
                    # The data do not determine the unconstrained fit, and its
                    # minimum-norm point has no k-head form: fit k heads to the rows.
                    Vd, Qd, local_d = fit_standardized_heads(rows, k, st.pair_weights,
                                                             random_state=random_state,
                                                             dtype=counts.dtype)
                    excess_d = judge.excess(Vd, Qd)
                    if excess_d < excess:
                        Vk, Qk, excess, local_k = Vd, Qd, excess_d, local_d
                        residual = _relative_gap(Vd, Qd, folded)
                        log(f"{k} heads fitted to the data directly (local certificate "
                            f"{'holds' if local_d else 'fails'})")
                return _Heads(Vk, Qk, residual, excess, local_k)

            if auto:
                Vb, Qb = blocks.groups[b]
                svd = _Heads(Vb, Qb, blocks.gap(blocks.groups),
                             judge.excess_of(blocks.coefficients(blocks.groups)), None)
                chosen = None
                if fewest == 0:
                    empty = blocks.replaced(b, Vb[:0], Qb[:0])
                    none = _Heads(Vb[:0], Qb[:0], blocks.gap(empty),
                                  judge.excess_of(blocks.coefficients(empty)), None)
                    if not judge.is_material(none.excess):
                        chosen = none
                        log(f"n_heads='auto': no head of decay {st.decays[b]:g} (excess risk "
                            f"{none.excess:.3g})")
                if chosen is None:
                    chosen = (svd if blocks.sizes[b] == 1 else
                              _fewest_heads(blocks.sizes[b], heads, judge.is_material, svd, log))
            else:
                chosen = heads(n_heads)
            blocks.groups = blocks.replaced(b, chosen.V, chosen.Q)
            compression_residual, local = chosen.residual, chosen.local
        if st.decays is not None:
            compression_residual = blocks.gap(blocks.groups)
        # "auto" only returns a material count when even the SVD's is (it is
        # not: the SVD heads reproduce the coefficients to rounding).
        judge.warn_if_material(judge.excess_of(blocks.coefficients(blocks.groups)),
                               blocks.n_heads,
                               None if st.decays is None else blocks.sizes)
        log(f"compressed to {blocks.n_heads} heads, relative coefficient residual "
            f"{compression_residual:.2e}")
    V, Q, head_decays = blocks.heads()
    return StandardizedModel(
        standardizer=st, coef=coef, beta=beta, V=V, Q=Q, head_decays=head_decays,
        certificate=certificate,
        local_certificate=local, compression_residual=compression_residual,
        solver=solution.method, n_iter=max(1, int(solution.n_iter)),
        feature_rank=solution.rank, terms=terms, counts=counts,
    )
