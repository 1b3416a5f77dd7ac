"""How many heads a fit returns (:func:`select_heads`): the judge of a compression, the search."""

import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from .._attention import attention_coefficients
from .._memory import resolve_budget
from ._bilinear import fit_heads_memory, fit_heads_work
from ._compression import compress_heads, joined_heads, svd_heads
from ._direct import fit_standardized_heads
from ._local import LocalCertificate

__all__ = ["CompressionJudge", "HeadChoice", "select_heads"]

# An unidentified fit's heads are fitted to the data directly only when one
# Levenberg-Marquardt step (an SVD of the Jacobian) stays below this many
# floating-point operations, about a second here: restarts and iterations
# multiply it.
DIRECT_FIT_WORK = 2e9


class CompressionJudge:
    """Whether compressed heads fit the training data materially worse than the optimum.

    Material: an excess empirical risk ``(c - c*)^T Lambda_D (c - c*)`` above
    ``max(0.01, 6 p / (N - p))`` times the optimum's residual risk plus a tiny
    share of its explained energy (user guide: compression); without a quadratic
    form of ``Lambda_D``, judged by an upper bound, so that nothing material passes.

    Parameters
    ----------
    coef : ndarray of shape (d_out, psi)
        The unconstrained standardized coefficients c*.
    spectrum : RowSpace
        ``quadratic``, ``lambda_max``, ``lambda_min(_error)`` and ``rank`` of ``Lambda_D``.
    counts : RowCounts
        ``n_rows``, ``weight_sum`` and the targets' ``y_sq``.
    pair_weights : ndarray of shape (P,)
        Weights of the folded moments in the standardized features.
    n_outputs : int or None
        Real outputs (targets beyond are term columns).
    gram : callable or None
        ``gram(V)``: exact products ``G V`` (V of shape (psi, k)).
    moment : ndarray of shape (psi, d_out) or None
        ``Phi^T W Y`` of the real outputs.
    accuracy : float or None
        Relative accuracy of an iterative solver's c*, which widens the "visible change" allowance.
    residual_sq : ndarray of shape (n_outputs,) or None
        The fit's weighted squared residuals: R* when intercept or skip terms explain part of Y.
    precision : float
        Relative precision of the targets: a change below a small multiple of it is rounding.
    """

    _NOISE_FRACTION = 1e-2
    _NOISE_DOF = 6.0
    _EXACT_RELATIVE = 1e-8
    # Targets rounded to a precision eps change the fit's function by this many eps.
    _ROUNDING_MULTIPLE = 4.0
    # A relative coefficient residual above this, accepted as noise, is said.
    _STATED_RESIDUAL = 0.1

    def __init__(self, coef, spectrum, counts, *, pair_weights, n_outputs=None, gram=None,
                 moment=None, accuracy=None, residual_sq=None, precision=0.0):
        self.spectrum, self.coef, self.gram = spectrum, coef, gram
        self.exact_relative = max(self._EXACT_RELATIVE, 0.0 if accuracy is None else accuracy,
                                  self._ROUNDING_MULTIPLE * precision)
        self.pair_weights = np.asarray(pair_weights, dtype=np.float64)
        dof = spectrum.rank * coef.shape[0]
        spare = counts.n_rows * coef.shape[0] - dof
        self.noise_fraction = max(self._NOISE_FRACTION,
                                  self._NOISE_DOF * dof / spare if spare > 0 else 0.0)
        self.W = counts.weight_sum if counts.weight_sum > 0 else float(counts.n_rows)
        # Targets beyond n_outputs are the term columns of fit_intercept / fit_skip.
        self.y_energy = (float(np.sum(counts.y_sq[:n_outputs])) / self.W
                         if counts.y_sq is not None else 0.0)
        self.lambda_min_lower = max(spectrum.lambda_min - spectrum.lambda_min_error, 0.0)
        q = self._quadratic(coef)
        self.exact = q is not None
        if q is not None:
            self.explained = float(np.sum(q))
        elif moment is not None:  # c*^T G c* = c*^T b at the minimizer
            self.explained = max(float(np.sum(coef * np.asarray(moment).T)) / self.W, 0.0)
        else:  # lower bound of the explained energy: lambda_min ||c||^2
            self.explained = self.lambda_min_lower * float(np.sum(coef**2))
        if residual_sq is not None:
            self.residual_risk = max(float(np.sum(residual_sq[:n_outputs])) / self.W, 0.0)
        else:
            self.residual_risk = max(self.y_energy - self.explained, 0.0)

    def _quadratic(self, C):
        """``c^T Lambda_D c`` per row of C, or None when neither a form nor products exist."""
        C = np.atleast_2d(C)
        q = self.spectrum.quadratic(C)
        if q is None and self.gram is not None:
            q = np.einsum("kp,pk->k", C, self.gram(C.T)) / self.W
        return q

    def _folded(self, coef):
        """Coefficients of the features -> folded coefficients (pair weights applied)."""
        shape = coef.shape
        return (coef.reshape(shape[0], self.pair_weights.size, -1)
                * self.pair_weights[:, None]).reshape(shape)

    def _allowed(self):
        return (self.noise_fraction * self.residual_risk
                + self.exact_relative**2 * self.explained)

    def tolerance(self):
        """A relative coefficient residual below which the compression cannot be material.

        ``lambda_max ||c - c*||^2`` bounds the excess risk, and the pair weights are >= 1.
        """
        top = self.spectrum.lambda_max
        norm2 = float(np.sum(self._folded(self.coef) ** 2))
        if top <= 0 or norm2 <= 0:
            return 1e-10
        return max(1e-10, float(np.sqrt(self._allowed() / (top * norm2))))

    def excess(self, V, Q):
        """Excess empirical risk of standardized heads (V, Q) over the unconstrained fit."""
        return self.excess_of(attention_coefficients(V, Q))

    def excess_of(self, folded):
        """Excess empirical risk of folded coefficients (d_out, psi) over the unconstrained fit."""
        pw = self.pair_weights[:, None]
        delta = (folded.reshape(folded.shape[0], pw.shape[0], -1) / pw).reshape(
            folded.shape) - self.coef
        q = self._quadratic(delta) if self.exact else None
        if q is not None:
            return float(np.sum(q))
        # Bounded only: judged by the upper bound, so that nothing material passes.
        return self.spectrum.lambda_max * float(np.sum(delta**2))

    def is_material(self, excess):
        """Whether an excess risk (:meth:`excess`) is more than the data's noise explains."""
        return excess > self._allowed()

    def warn_if_material(self, excess, n_heads, per_decay=None):
        """Warn when an excess risk is material; ``per_decay``: the head count of each decay."""
        if self.is_material(excess):
            ratio = excess / self.residual_risk if self.residual_risk > 0 else np.inf
            heads = "head" if n_heads == 1 else "heads"
            what = f"n_heads={n_heads} {heads}"
            if per_decay is not None:
                what = (f"{n_heads} {heads} ({', '.join(map(str, per_decay))} per decay, in "
                        "the order of decay)")
            warnings.warn(
                f"compressing to {what} raises the training error: the "
                f"excess empirical risk is {ratio:.3g} times the risk of the unconstrained "
                f"fit (more than the {self.noise_fraction:.3g} the data's own noise explains), "
                f"so {n_heads} {heads} may not be enough to compute the fitted function; "
                "increase n_heads or use n_heads=None (compression_residual_ holds the "
                "relative coefficient residual).",
                ConvergenceWarning,
            )

    def warn_if_kept_as_noise(self, excess, residual, n_heads):
        """Warn when ``"auto"`` kept heads far from the fit only as noise."""
        if (residual is None or not residual > self._STATED_RESIDUAL
                or excess <= self.exact_relative**2 * self.explained):
            return
        ratio = excess / self.residual_risk if self.residual_risk > 0 else np.inf
        heads = "head" if n_heads == 1 else "heads"
        warnings.warn(
            f"n_heads='auto' kept {n_heads} {heads} whose coefficients are {residual:.2g} "
            f"(relative) from the unconstrained least squares: on the training data that "
            f"costs {ratio:.3g} of its residual risk, within the {self.noise_fraction:.3g} the "
            "data's own noise explains, so the fewer heads were kept, but the two are "
            "different functions away from the training data. Compare them on held-out data "
            "(n_heads=None fits the unconstrained minimizer).",
            UserWarning,
        )


@dataclass
class HeadChoice:
    """The heads a fit returns, in standardized coordinates, block by block (one group per decay).

    ``head_decays`` is None without decays, ``compression_residual`` None when nothing was
    compressed, ``local_certificate`` set when the heads were fitted to the rows directly.
    """

    V: np.ndarray
    Q: np.ndarray
    head_decays: np.ndarray | None
    compression_residual: float | None
    local_certificate: LocalCertificate | None


@dataclass
class _Heads:
    """Heads proposed for one head count: the compression (or direct fit) and its verdict."""

    V: np.ndarray
    Q: np.ndarray
    residual: float
    excess: float
    local: LocalCertificate | None


class _HeadGroups:
    """The heads of each feature block (one group per decay): the SVD's until compressed."""

    def __init__(self, folded, d, decays):
        self.d, self.decays = d, decays
        self.folded = np.split(folded, 1 if decays is None else len(decays), axis=1)
        self.whole = folded
        self.groups = [svd_heads(f, d) for f in self.folded]

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
    """The fewest heads whose compression is not material: counts 1, 2, 4, ..., then bisection.

    ``heads(k)``: the :class:`_Heads` of k heads; ``svd``: the ``n_svd`` SVD heads (when every
    smaller count is material).
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


class _HeadSearch:
    """Heads of each block for a head count, judged on the fit of all the blocks together.

    ``rows``: standardized rows of one block, for a direct fit when a compression is material.
    """

    def __init__(self, groups, judge, *, rows, pair_weights, dtype, random_state, log):
        self.groups, self.judge, self.rows = groups, judge, rows
        self.pair_weights, self.dtype = pair_weights, dtype
        self.random_state, self.log = random_state, log

    def heads(self, b, k):
        """Block b's k heads (``n_heads=k`` returns them) and the excess training risk."""
        groups, judge = self.groups, self.judge
        Vk, Qk, residual = compress_heads(groups.folded[b], groups.d, k, tol=judge.tolerance(),
                                          random_state=self.random_state, warn=False)
        excess = judge.excess_of(groups.coefficients(groups.replaced(b, Vk, Qk)))
        local = None
        if judge.is_material(excess) and self._direct_fit_affordable(k):
            # The data do not determine the unconstrained fit, and its
            # minimum-norm point has no k-head form: fit k heads to the rows.
            Vd, Qd, local_d = fit_standardized_heads(self.rows, k, self.pair_weights,
                                                     random_state=self.random_state,
                                                     dtype=self.dtype)
            excess_d = judge.excess(Vd, Qd)
            if excess_d < excess:
                Vk, Qk, excess, local = Vd, Qd, excess_d, local_d
                residual = _relative_gap(Vd, Qd, groups.whole)
                self.log(f"{k} heads fitted to the data directly (local certificate "
                         f"{'holds' if local_d else 'fails'})")
        return _Heads(Vk, Qk, residual, excess, local)

    def _direct_fit_affordable(self, k):
        if self.rows is None:
            return False
        shape = (self.rows.n_rows, self.groups.d, self.judge.coef.shape[0], k)
        return (fit_heads_memory(*shape) <= resolve_budget(None)
                and fit_heads_work(*shape) <= DIRECT_FIT_WORK)

    def fewest(self, b, may_drop):
        """Block b's fewest heads not material; ``may_drop``: its group may go whole."""
        groups, judge = self.groups, self.judge
        Vb, Qb = groups.groups[b]
        if may_drop:
            empty = groups.replaced(b, Vb[:0], Qb[:0])
            none = _Heads(Vb[:0], Qb[:0], groups.gap(empty),
                          judge.excess_of(groups.coefficients(empty)), None)
            if not judge.is_material(none.excess):
                self.log(f"n_heads='auto': no head of decay {groups.decays[b]:g} (excess risk "
                         f"{none.excess:.3g})")
                return none
        svd = _Heads(Vb, Qb, groups.gap(groups.groups),
                     judge.excess_of(groups.coefficients(groups.groups)), None)
        if groups.sizes[b] == 1:
            return svd
        return _fewest_heads(groups.sizes[b], lambda k: self.heads(b, k), judge.is_material,
                             svd, self.log)


def select_heads(solution, row_space, counts, standardizer, *, n_heads, rows=None,
                 random_state=None, log=None):
    """The :class:`HeadChoice` of a fitted solution: SVD heads, compressed, or fitted directly.

    Parameters
    ----------
    solution : SpectralSolution
        The coefficients (``coef``, real outputs) and what the judge reads of
        the solve: ``gram_product``, ``moment``, ``coef_accuracy``, ``residual_sq``.
    row_space, counts, standardizer : RowSpace, RowCounts, TokenStandardizer
        The judge's view of ``Lambda_D``, the rows' counts and targets' energy,
        and the coordinates (pair weights and decays) of the coefficients.
    n_heads : int, "auto" or None
        At most this many heads (per decay); ``"auto"``: the fewest not
        material; None: the SVD's heads.
    rows : FeatureRows or None
        Rows to fit heads to directly when a compression is material (None: never).
    random_state, log
        Seeds the compression's restarts and a direct fit; ``log(message)`` for ``verbose``.
    """
    log = log if log is not None else (lambda message: None)
    st = standardizer
    coef = solution.coef
    d_out = coef.shape[0]
    groups = _HeadGroups(st.folded(coef), st.d, st.decays)
    log(f"{groups.n_heads} heads from the SVD")
    auto = isinstance(n_heads, str)  # "auto", validated by the caller
    # With decays, every block's group of heads is compressed on its own (to at
    # most n_heads), judged on the coefficients of all the groups together;
    # "auto" may also drop a decay's group whole, so every group with a head
    # is tried.
    fewest = 0 if auto and st.decays is not None else 1
    to_compress = [b for b, size in enumerate(groups.sizes)
                   if (size > fewest if auto else n_heads is not None and size > n_heads)]
    residual = local = None
    if auto and not to_compress:
        # Nothing fewer to try: the SVD heads, whose residual is rounding.
        residual = groups.gap(groups.groups)
    elif to_compress:
        moment = getattr(counts, "moment", None)
        moment = solution.moment if moment is None else moment
        judge = CompressionJudge(coef, row_space, counts, pair_weights=st.pair_weights,
                                 n_outputs=d_out, gram=solution.gram_product,
                                 moment=None if moment is None else moment[:, :d_out],
                                 accuracy=solution.coef_accuracy,
                                 residual_sq=getattr(solution, "residual_sq", None),
                                 precision=st.target_precision)
        search = _HeadSearch(groups, judge, rows=rows, pair_weights=st.pair_weights,
                             dtype=counts.dtype, random_state=random_state, log=log)
        for b in to_compress:
            chosen = search.fewest(b, fewest == 0) if auto else search.heads(b, n_heads)
            groups.groups = groups.replaced(b, chosen.V, chosen.Q)
            residual, local = chosen.residual, chosen.local
        if st.decays is not None:
            residual = groups.gap(groups.groups)
        # "auto" only returns a material count when even the SVD's is (it is
        # not: the SVD heads reproduce the coefficients to rounding).
        excess = judge.excess_of(groups.coefficients(groups.groups))
        judge.warn_if_material(excess, groups.n_heads,
                               None if st.decays is None else groups.sizes)
        if auto:
            judge.warn_if_kept_as_noise(excess, residual, groups.n_heads)
        log(f"compressed to {groups.n_heads} heads, relative coefficient residual "
            f"{residual:.2e}")
    V, Q, head_decays = groups.heads()
    return HeadChoice(V, Q, head_decays, residual, local)
