"""The ridge penalty chosen by K-fold cross-validation from per-fold statistics.

A fit is least squares on the cubic features, so everything a fold needs
is in sufficient statistics: ``Phi^T W Phi``, ``Phi^T W Y``, ``Y^T W Y``,
``Y^T w`` and the weight sum of its sequences.  :class:`LinearAttentionRegressorCV`
gathers them for every fold in the one pass a plain fit makes
(:meth:`~._problem.StandardizedProblem.from_source` with ``groups``: one set of
statistics per group of sequences, all in the standardized coordinates of
all the training data), scores every alpha of every split from them
(:func:`cross_validated_scores`) and refits at the best alpha from their sum,
without reading the data again.

A split's training statistics are the sum of the groups in its training
part; its coefficients solve the penalized normal equations exactly as a fit
on those sequences in the same coordinates would (the solver's rule for
zero eigenvalues, the penalty ``alpha * trace(G_train) / psi``, the terms
eliminated as :mod:`._terms` does), and the held-out mean squared error is
``(y^T W y - 2 c^T b + c^T G c) / W`` of the held-out statistics.

Directions in which the Gram matrix of all the data vanishes vanish in every
part of it (every row of every part is orthogonal to them), so a
rank-deficient design is solved on the row space of all the data: each split
then decomposes a matrix of the rank's size instead of psi's.

Candidate decays share the pass too: the statistics of the union of their
blocks are gathered once (cross blocks only within a candidate's:
:func:`~._attention.decay_blocks`' groups), each candidate's read from them
(:meth:`~._solvers.SufficientStatistics.blocks`, and its columns of the kept
rows) and scored with the solver of a search over it alone, so the scores equal
separate searches'.  A candidate that changes the tokens themselves
(positions) needs a pass of its own: a search over a Pipeline's encoder
(``GridSearchCV``) gives it.

Candidate linear terms (``fit_intercept="auto"``, ``fit_skip="auto"``) share
the splits' solves as well: the term columns are extra targets of the same
normal equations, so a split solves once for the columns of every term and
each candidate eliminates its own columns from those solves
(:func:`cross_validated_scores` with ``terms``).
"""


import dataclasses
import warnings

import numpy as np
from scipy.stats import rankdata, trim_mean
from sklearn.model_selection import check_cv
from sklearn.utils.metaestimators import available_if

from ._namespace import fits_in_namespace
from ._attention import decay_blocks
from ._dask import is_dask_collection
from ._estimators import LinearAttentionRegressor
from ._cv_parts import Projected, Whole, projected_from_rows, summed
from ._features import n_attention_features
from ._memory import n_pairs, resolve_budget
from ._params import FitParams, check_decays
from ._problem import StandardizedProblem, keep_rows, with_linear_columns
from ._solvers import REGISTRY, SOLVERS, STATISTICS_SOLVERS, choose_solver
from ._source import ArraySource, user_stacklevel
from ._units import EPS64, score_tie
from ._terms import LinearTerms, eliminate_path
from .exceptions import GridEdgeWarning

__all__ = ["DEFAULT_ALPHAS", "LinearAttentionRegressorCV", "cross_validated_scores",
           "split_groups"]

DEFAULT_ALPHAS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
DEFAULT_ALPHAS_LINEAR = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
# How the split scores of a candidate make its score.
FOLD_SCORES = ("mean", "trimmed", "median")


def fold_score(scores, how):
    """Candidates' scores from their splits' (n_candidates, n_splits): ``how`` of FOLD_SCORES.

    ``"trimmed"`` is the mean without the best and the worst fifth of the
    splits (``scipy.stats.trim_mean``; one of each for five splits), so
    that one split with an outlying sequence cannot decide.
    """
    if how == "mean":
        return scores.mean(axis=1)
    if how == "median":
        return np.median(scores, axis=1)
    return trim_mean(scores, 0.2, axis=1)
# The scorers the statistics determine: the mean squared error (as scikit-learn's
# "neg_mean_squared_error", greater is better) and R^2.
SCORINGS = (None, "neg_mean_squared_error", "r2")


def _no_partial_fit(estimator):
    raise AttributeError(
        f"{type(estimator).__name__} has no partial_fit: every batch would need the folds "
        "of the earlier ones. Fit it on all the data, or continue a "
        "LinearAttentionRegressor(alpha=model.alpha_) with partial_fit."
    )


def _index_array(indices, n_samples, what):
    """Sequence indices of one side of a split (integers or a boolean mask), checked."""
    indices = np.asarray(indices)
    if indices.dtype == bool:
        if indices.shape != (n_samples,):
            raise ValueError(
                f"cv gave a boolean {what} mask of shape {indices.shape}; expected "
                f"({n_samples},), one entry per sequence.")
        return np.flatnonzero(indices)
    if indices.ndim != 1 or (indices.size and indices.dtype.kind not in "iu"):
        raise ValueError(
            f"cv must give {what} indices as 1-D arrays of integers (sequence indices); got "
            f"an array of dtype {indices.dtype} and shape {indices.shape}.")
    indices = indices.astype(np.intp, copy=False)
    if indices.size and (indices.min() < 0 or indices.max() >= n_samples):
        raise ValueError(
            f"cv gave {what} indices outside [0, {n_samples}) for {n_samples} sequences.")
    unique = np.unique(indices)
    if unique.size < indices.size:
        # A fit on X[train] would count a repeated sequence twice; the groups cannot.
        raise ValueError(
            f"cv gave repeated {what} indices; each part must list a sequence at most once "
            "(weigh sequences with sample_weight instead).")
    return unique


def cv_splits(cv, n_samples, groups=None):
    """The (train, test) sequence indices of ``cv`` (``check_cv``'s reading), checked.

    Folds are always of whole sequences: ``cv`` splits the sequences, never
    the positions of one.
    """
    try:
        raw = list(check_cv(cv).split(np.zeros((n_samples, 1)), None, groups))
    except ValueError as exc:
        raise ValueError(f"cv={cv!r} cannot split {n_samples} sequences: {exc}") from exc
    if not raw:
        raise ValueError(f"cv={cv!r} gave no split.")
    splits = []
    for k, (train, test) in enumerate(raw):
        train = _index_array(train, n_samples, "train")
        test = _index_array(test, n_samples, "test")
        if train.size == 0 or test.size == 0:
            raise ValueError(f"split {k} of cv={cv!r} has an empty train or test part.")
        if np.intersect1d(train, test).size:
            raise ValueError(
                f"split {k} of cv={cv!r} puts sequences in both its train and its test part.")
        splits.append((train, test))
    return splits


def split_groups(splits, n_samples):
    """Groups of sequences that every split treats alike, and each split's groups.

    Parameters
    ----------
    splits : list of (ndarray, ndarray)
        Train and test sequence indices of each split.
    n_samples : int

    Returns
    -------
    labels : ndarray of int, shape (n_samples,)
        Each sequence's group (sequences in the same part of every split
        share one): K groups for K-fold, plus one for sequences no split uses.
    parts : list of (ndarray, ndarray)
        The groups of each split's train and test part.

    Examples
    --------
    >>> from sklearn.model_selection import KFold
    >>> from sklearn_linattn._cv import cv_splits, split_groups
    >>> labels, parts = split_groups(cv_splits(KFold(3), 6), 6)
    >>> labels.tolist(), [test.tolist() for _, test in parts]
    ([0, 0, 1, 1, 2, 2], [[0], [1], [2]])
    """
    membership = np.zeros((n_samples, len(splits)), dtype=np.int8)
    for k, (train, test) in enumerate(splits):
        membership[train, k] = 1
        membership[test, k] = 2
    # Groups numbered in the order of their first sequence.
    _, first, inverse = np.unique(membership, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    labels = order[inverse.reshape(-1)]
    patterns = np.empty((first.size, len(splits)), dtype=np.int8)
    patterns[labels] = membership
    parts = [(np.flatnonzero(patterns[:, k] == 1), np.flatnonzero(patterns[:, k] == 2))
             for k in range(len(splits))]
    return labels, parts


def _split_solves(train, alphas, solver_name):
    """The penalized solves (n_alphas, n_targets, m) of one training part, every target column."""
    solver = REGISTRY[solver_name].penalty_path(
        train.gram, train.moment, psi=train.n_features, trace=train.trace, dtype=train.dtype,
        n_penalties=np.unique(alphas[alphas > 0]).size, n_rows=train.n_rows)
    return solver.coefs(alphas), train.moment


def _split_coefficients(solved, b, y_cross, cols, d_out, terms, alphas_linear):
    """Attention and term coefficients of one candidate's columns ``cols`` of the solves.

    The solve of every target column serves every candidate set of terms:
    a candidate's are its columns, its terms eliminated from them alone, for
    every penalty of its linear term at once.  Returns ``(coefs, betas)`` of
    shapes (n_alphas_linear, n_alphas, d_out, m) and (n_alphas_linear,
    n_alphas, n_columns, d_out).
    """
    solved = solved[:, cols]
    k = len(alphas_linear)
    if not terms.n_columns:
        return solved[None].repeat(k, axis=0), np.zeros((k, solved.shape[0], 0, d_out))
    b, y_cross = b[:, cols], y_cross[np.ix_(cols, cols)]
    coefs = np.empty((k, solved.shape[0], d_out, solved.shape[2]))
    betas = np.empty((k, solved.shape[0], terms.n_columns, d_out))
    for i, coef in enumerate(solved):
        cross = b.T @ coef.T  # [Y, E]^T W Phi coef^T
        betas[:, i], coefs[:, i] = eliminate_path(coef, y_cross, cross, d_out, terms,
                                                  alphas_linear)
    return coefs, betas


def _held_out_errors(test, coefs, betas, cols):
    """Weighted sums of squared held-out errors (n_alphas, d_out), standardized units."""
    n_alphas, d_out, m = coefs.shape
    C = coefs.reshape(-1, m).T  # (m, n_alphas * d_out)
    quadratic = np.einsum("pk,pk->k", C, test.gram @ C).reshape(n_alphas, d_out)
    linear = (test.moment[:, cols].T @ C).reshape(-1, n_alphas, d_out).transpose(1, 0, 2)
    # The targets less the terms: [Y, E] B with B = [I; -beta].
    B = np.concatenate([np.broadcast_to(np.eye(d_out), (n_alphas, d_out, d_out)), -betas],
                       axis=1)
    constant = np.einsum("ita,ts,isa->ia", B, test.y_cross[np.ix_(cols, cols)], B)
    cross = np.einsum("ita,ita->ia", B, linear)
    return np.maximum(constant - 2.0 * cross + quadratic, 0.0)


def _split_scores(sse, test, scoring, standardizer):
    """Scores (n_alphas,) of one split from its held-out squared errors."""
    W = test.weight_sum
    d_out = sse.shape[1]
    if scoring == "r2":
        yy = np.diagonal(test.y_cross)[:d_out]
        total = yy - test.y_sum[:d_out] ** 2 / W
        constant = total <= 16 * EPS64 * test.n_rows * yy
        with np.errstate(divide="ignore", invalid="ignore"):
            r2 = np.where(constant, np.where(sse <= 16 * EPS64 * test.n_rows * yy, 1.0, 0.0),
                          1.0 - sse / np.where(constant, 1.0, total))
        if test.n_rows < 2:  # scikit-learn's r2_score is not defined on one sample
            return np.full(sse.shape[0], np.nan)
        return r2.mean(axis=1)
    return -standardizer.squared_errors_to_user(sse / W).mean(axis=1)


def cross_validated_scores(problem, parts, alphas, *, scoring=None, solver="eigh",
                           terms=None, row_groups=None):
    """Score every alpha on every split of a problem accumulated with groups.

    Parameters
    ----------
    problem : StandardizedProblem
        Built by ``from_source(..., groups=labels)`` with a statistics solver:
        ``group_stats`` holds each group's statistics, ``stats`` their sum.
    parts : list of (ndarray, ndarray)
        The groups of each split's train and test part (:func:`split_groups`).
    alphas : ndarray of shape (n_alphas,)
        Unit-free penalties.
    scoring : {None, "neg_mean_squared_error", "r2"}, default=None
        None and ``"neg_mean_squared_error"``: minus the weighted mean squared
        error over the held-out rows (averaged over outputs, in the units of
        y); ``"r2"``: R^2 averaged over outputs.
    solver : {"eigh", "cholesky"}, default="eigh"
        The solver of the problem's own fit (its decomposition of all the
        data gives the row space the splits are solved on, and serves the
        refit).
    terms : list of LinearTerms or None, default=None
        Candidate linear terms, each among the problem's own (None: the
        problem's own only).  Each split's solves serve every candidate: the
        candidates differ only in which term columns are eliminated (and in
        the linear term's penalty).
    row_groups : ndarray of int or None, default=None
        The group of each of the problem's kept rows: the groups are then
        projected from the rows (:func:`projected_from_rows`).

    Returns
    -------
    scores : ndarray of shape (n_candidates * n_alphas, n_splits)
        Greater is better; candidate-major (every alpha of the first
        candidate, then of the next).
    """
    stats = problem.group_stats
    # The linear term's columns are among the problem's targets.
    d_out = problem.d_out - problem.terms.n_window
    standardizer = (problem.standardizer.with_outputs(d_out) if problem.terms.n_window
                    else problem.standardizer)
    candidates = [problem.terms] if terms is None else list(terms)
    # Candidates that differ in the linear term's penalty alone share one elimination.
    shapes = list(dict.fromkeys(t.with_penalty(0.0) for t in candidates))
    penalties = [[t.alpha_linear for t in candidates if t.with_penalty(0.0) == shape]
                 for shape in shapes]
    columns = [t.target_columns(d_out, problem.terms) for t in shapes]
    whole = problem.solve(solver, 0.0)
    if whole.eigenvectors is not None and whole.rank < whole.n_features:
        # Each group projected once; the splits' sums and solves are then of the rank's size.
        basis = whole.eigenvectors[:, : whole.rank]
        if (row_groups is not None and problem.kept is not None
                and problem.kept.n_rows == row_groups.size):
            stats = projected_from_rows(stats, basis, problem.kept, row_groups)
        else:
            stats = [Projected(part, basis) for part in stats]
    else:
        stats = [Whole(part) for part in stats]
    scores = {}
    for k, (train_groups, test_groups) in enumerate(parts):
        train, test = summed(stats, train_groups), summed(stats, test_groups)
        if train.n_rows == 0 or test.n_rows == 0:
            side = "train" if train.n_rows == 0 else "test"
            raise ValueError(
                f"the {side} part of split {k} holds no sequence of positive sample weight: "
                "there is nothing to fit or to score.")
        solved, b = _split_solves(train, alphas, solver)
        for shape, cols, lams in zip(shapes, columns, penalties):
            coefs, betas = _split_coefficients(solved, b, train.y_cross, cols, d_out, shape,
                                               lams)
            for lam, c, beta in zip(lams, coefs, betas):
                sse = _held_out_errors(test, c, beta, cols)
                scores.setdefault((shape, lam), np.empty((alphas.size, len(parts))))[:, k] = (
                    _split_scores(sse, test, scoring, standardizer))
    scores = np.stack([scores[(t.with_penalty(0.0), t.alpha_linear)] for t in candidates])
    return scores.reshape(-1, len(parts))


def _checked_alphas(alphas, name="alphas"):
    """``alphas`` as a 1-D float array of finite non-negative values (``name``: the message's)."""
    try:
        values = np.asarray(alphas, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be a non-negative number or a 1-D array-like of them; got "
            f"{alphas!r}.") from None
    values = values.reshape(1) if values.ndim == 0 else values
    if values.ndim != 1 or values.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D array-like of non-negative numbers; got an "
            f"array of shape {np.shape(alphas)}.")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError(f"{name} must be finite and non-negative; got {alphas!r}.")
    return values


def _checked_decays(decays):
    """The candidate decays as a list of ``check_decays`` values (None: no decay), distinct."""
    if decays is None or isinstance(decays, (str, bytes)) or not isinstance(
            decays, (list, tuple, np.ndarray)):
        raise TypeError(
            "decays must be a list of candidates, each None, a decay in (0, 1] or a tuple of "
            f"decays (one feature block each), e.g. [None, 0.9, (1.0, 0.5)]; got {decays!r}.")
    candidates = [check_decays(c, f"decays[{i}]") for i, c in enumerate(decays)]
    if not candidates:
        raise ValueError("decays must hold at least one candidate; got an empty list.")
    keys = [(1.0,) if c is None else c for c in candidates]
    if len(set(keys)) < len(keys):
        raise ValueError(
            f"decays must hold distinct candidates (None is the same model as (1.0,)); got "
            f"{decays!r}.")
    return candidates


def _checked_term_options(value, name):
    """The candidate values of a term flag: (False,), (True,) or, for "auto", (False, True)."""
    if isinstance(value, str) and value == "auto":
        return (False, True)
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or 'auto'; got {value!r}.")
    return (bool(value),)


def _term_candidates(d, intercept, skip, linear=(False,), alphas_linear=(), n_lags=0):
    """Every candidate set of linear terms (the fewest first, each linear penalty) and their union."""
    candidates = [
        LinearTerms(d, intercept=i, skip=k, n_lags=n_lags, alpha_linear=a) if w
        else LinearTerms(d, intercept=i, skip=k)
        for w in linear for i in intercept for k in skip
        for a in (alphas_linear if w else (0.0,))]
    return candidates, LinearTerms(d, intercept=max(intercept), skip=max(skip),
                                   n_lags=n_lags if max(linear) else 0)


def _warn_if_at_the_edge(alphas, alpha):
    """A GridEdgeWarning when the chosen alpha is the largest, or the smallest above 0 without 0."""
    positive = alphas[alphas > 0]
    if np.unique(alphas).size < 2 or positive.size == 0:
        return
    if alpha == positive.max():
        side, advice = "largest", "larger"
    elif alpha == positive.min() and not np.any(alphas == 0):
        side, advice = "smallest", "smaller (or 0)"
    else:
        return
    warnings.warn(
        f"alpha_ = {alpha:g} is the {side} of the alphas searched: a {advice} penalty may "
        f"score better. Extend alphas beyond {alpha:g} (unit-free: the same grid means the "
        "same on any data).", GridEdgeWarning, stacklevel=user_stacklevel())


def _union_of(candidates):
    """The decays of every candidate's blocks, in order of first appearance (None: plain only)."""
    if all(c is None for c in candidates):
        return None
    return decay_blocks(*candidates)  # None counts as decay 1


def _search_solver(requested, n_rows, psi):
    """The solver of a search over psi features: a statistics solver, or ("auto", far fewer
    rows than features) the N x N kernel of the kept rows, as a plain fit would."""
    solver = choose_solver(requested, n_rows, psi, statistics=True)
    if requested == "auto":
        wide = choose_solver("auto", n_rows, psi)
        if REGISTRY[wide].penalty_path is not None and not REGISTRY[wide].statistics:
            solver = wide
    return solver


def _candidate_problem(problem, union, candidate):
    """The problem of one candidate's blocks, from the statistics (and rows) of all of them."""
    which = [union.index(g) for g in ((1.0,) if candidate is None else candidate)]
    stats = problem.stats.blocks(which, candidate)
    out = StandardizedProblem.from_statistics(stats, d_out=problem.d_out, terms=problem.terms)
    out.group_stats = [part.blocks(which, candidate) for part in problem.group_stats]
    out.scales = problem.scales
    if problem.kept is not None:  # the moments of its blocks: S's columns, block by block
        P = n_pairs(problem.d)
        cols = (np.asarray(which)[:, None] * P + np.arange(P)).ravel()
        out.kept = dataclasses.replace(problem.kept, S=problem.kept.S[:, cols])
        out.rows = dataclasses.replace(problem.rows, kept=out.kept,
                                       standardizer=stats.standardizer, _operators={})
    return out


class LinearAttentionRegressorCV(LinearAttentionRegressor):
    """Linear attention with its ridge penalty chosen by cross-validation over sequences.

    The same model as :class:`LinearAttentionRegressor`, refitted at the
    ``alpha`` of ``alphas`` (and the candidate decays and terms) with the best
    cross-validated score, as scikit-learn's
    :class:`~sklearn.linear_model.RidgeCV`.  The search costs about one plain
    fit: the data are read once, the sufficient statistics of every fold
    gathered in that pass, and every candidate of every split scored from
    them exactly.  The refit is ``LinearAttentionRegressor(alpha=alpha_,
    ...).fit(X, y)`` to rounding.  The user guide's scoring page ("Choosing
    alpha by cross-validation") gives the scores, coordinates and cost.

    Parameters
    ----------
    alphas : array-like of shape (n_alphas,) or float, \
default=(0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
        Candidate unit-free penalties, non-negative (0: the exact least
        squares).  A choice at the grid's edge issues a
        :class:`~sklearn_linattn.exceptions.GridEdgeWarning`.
    cv : int, cross-validation splitter or iterable, default=5
        How the *sequences* are split (never a sequence's positions): an int
        k is ``KFold(k)`` over the sequences in order; a splitter (``groups``
        go to its ``split``) or an iterable of ``(train, test)`` indices,
        ``TimeSeriesSplit`` included.
    readout : {"last", "all"}, default="last"
        As in :class:`LinearAttentionRegressor`; with ``"all"`` every real
        position of a held-out sequence is a scored sample.
    fit_intercept, fit_skip : bool or "auto", default=False
        The terms of :class:`LinearAttentionRegressor`.  ``"auto"`` scores
        every alpha with and without the term on the same splits and keeps it
        (``fit_intercept_``, ``fit_skip_``) only when it scores better by more
        than the tie of ``alpha_``.
    fit_linear, alphas_linear : bool or "auto", array-like, default=False, (1e-5, ..., 1.0)
        The linear term of :class:`LinearAttentionRegressor`, scored at every
        penalty of ``alphas_linear`` (one solve serves them all).
    n_heads : int, "auto" or None, default=None
        Heads of the refitted model; the scores are those of the
        unconstrained least squares.
    head_dim : int or None, default=None
        The head dimension of the refitted model (as in
        :class:`LinearAttentionRegressor`).
    decays : list, default=(None,)
        Candidate decays, each as the ``decay`` of
        :class:`LinearAttentionRegressor` (None, a float or a tuple):
        ``[None, 0.9, (1.0, 0.5)]`` compares three models (write ``[0.9]``
        for one).
    solver : {"auto", "eigh", "cholesky"}, default="auto"
        The solver of the search and the refit; the search needs psi x psi
        statistics per fold, so the solvers on the rows cannot be asked for
        (``"auto"`` takes ``"dual"``'s row space for far fewer rows than
        features).
    scoring : {None, "neg_mean_squared_error", "r2"}, default=None
        Minus the weighted mean squared error over the held-out rows (in the
        units of y), or R^2, averaged over outputs.  Other scorers need every
        held-out prediction: use :class:`~sklearn.model_selection.GridSearchCV`
        with :func:`~sklearn_linattn.metrics.sequence_scorer`.
    fold_score : {"mean", "trimmed", "median"}, default="mean"
        A candidate's score from its splits': their mean, the mean without the
        best and worst fifth, or their median (robust to one outlying split).
    token_dim : int or None, default=None
        As in :class:`LinearAttentionRegressor`.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        As in :class:`LinearAttentionRegressor`.
    random_state : int, RandomState instance or None, default=None
        Seeds the head compression of the refit.
    verbose : int, default=0
        Print the time of each stage (the pass, the search, the refit).
    tol, max_iter : float and int or None, default=1e-8 and None
        As in :class:`LinearAttentionRegressor` (only ``"cg"`` reads them,
        which the search does not use).

    Attributes
    ----------
    alpha_ : float
        The chosen penalty: the first candidate (decays, then sets of terms,
        fewer first, then ``alphas`` in order) whose mean test score is within
        1e-10 times the null model's score (the targets' variance) of the
        best, so that rounding never decides.
    decay_ : None or tuple of float
        The chosen candidate of ``decays``.
    fit_intercept_, fit_skip_, fit_linear_ : bool
        The chosen terms.
    alpha_linear_ : float or None
        The chosen penalty of the linear term.
    best_score_ : float
        Its test score (``fold_score`` of its splits').
    best_index_ : int
        Its index in ``cv_results_`` (decays, then sets of terms, then alphas).
    cv_results_ : dict of ndarray
        As in :class:`~sklearn.model_selection.GridSearchCV`: ``"param_*"``,
        ``"params"``, ``"split{k}_test_score"``, ``"mean_test_score"``,
        ``"std_test_score"`` and ``"rank_test_score"``.
    n_splits_ : int
        Number of splits.
    coef_, intercept_, skip_coef_, linear_coef_, value_matrices_, key_query_matrices_, \
n_heads_, certificate_, standardization_, feature_rank_, solver_, n_iter_, \
n_features_in_, n_outputs_, local_certificate_, compression_residual_, head_dim_, head_dim_gap_
        Those of the model refitted at ``alpha_`` (see
        :class:`LinearAttentionRegressor`).

    See Also
    --------
    LinearAttentionRegressor : the fit at one alpha.
    sklearn.linear_model.RidgeCV : the same search for linear models.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionRegressorCV
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 5, 3))
    >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)  # a one-head MHLA, no noise
    >>> model = LinearAttentionRegressorCV(cv=5).fit(X, y)
    >>> model.alpha_, bool(model.certificate_)
    (0.0, True)
    >>> y_noisy = y + rng.normal(scale=3.0, size=300)
    >>> model = LinearAttentionRegressorCV(alphas=np.logspace(-4, 2, 7)).fit(X, y_noisy)
    >>> int(model.cv_results_["rank_test_score"][model.best_index_])
    1
    """

    def __init__(
        self,
        alphas=DEFAULT_ALPHAS,
        *,
        cv=5,
        readout="last",
        fit_intercept=False,
        fit_skip=False,
        fit_linear=False,
        alphas_linear=DEFAULT_ALPHAS_LINEAR,
        n_heads=None,
        head_dim=None,
        decays=(None,),
        solver="auto",
        scoring=None,
        fold_score="mean",
        token_dim=None,
        data_format="channels_last",
        random_state=None,
        verbose=0,
        tol=1e-8,
        max_iter=None,
    ):
        self.alphas = alphas
        self.cv = cv
        self.readout = readout
        self.fit_intercept = fit_intercept
        self.fit_skip = fit_skip
        self.fit_linear = fit_linear
        self.alphas_linear = alphas_linear
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.decays = decays
        self.solver = solver
        self.scoring = scoring
        self.fold_score = fold_score
        self.token_dim = token_dim
        self.data_format = data_format
        self.random_state = random_state
        self.verbose = verbose
        self.tol = tol
        self.max_iter = max_iter

    partial_fit = available_if(_no_partial_fit)(LinearAttentionRegressor.partial_fit)

    def _check_params(self):
        """The search's own parameters, then the fit's (without alpha, decay and the terms)."""
        _checked_alphas(self.alphas)
        candidates = _checked_decays(self.decays)
        if self.head_dim is not None and any(c is not None for c in candidates):
            raise ValueError(
                "head_dim cannot be combined with decays: heads of a given dimension are "
                f"fitted for the plain layer only; got decays={self.decays!r}.")
        _checked_term_options(self.fit_intercept, "fit_intercept")
        _checked_term_options(self.fit_skip, "fit_skip")
        if _checked_term_options(self.fit_linear, "fit_linear") != (False,):
            _checked_alphas(self.alphas_linear, "alphas_linear")
            if self.readout != "last":
                raise ValueError(
                    f"fit_linear needs readout='last' (one linear term in the tokens of each "
                    f"sequence); got readout={self.readout!r}.")
        if not (isinstance(self.fold_score, str) and self.fold_score in FOLD_SCORES):
            raise ValueError(
                f"fold_score must be one of {FOLD_SCORES}; got {self.fold_score!r}.")
        if not (self.scoring is None or (isinstance(self.scoring, str)
                                         and self.scoring in SCORINGS)):
            raise ValueError(
                f"scoring must be one of {SCORINGS}; got {self.scoring!r}. The search scores "
                "from per-fold statistics, which give the squared errors and R^2 but not "
                "the held-out predictions other scorers need: use GridSearchCV with "
                "sklearn_linattn.metrics.sequence_scorer for those.")
        if isinstance(self.cv, (bool, np.bool_)):
            raise TypeError(f"cv must be an int, a splitter or an iterable; got {self.cv!r}.")
        if not isinstance(self.solver, str) or self.solver not in (
                ("auto",) + STATISTICS_SOLVERS):
            raise ValueError(
                f"solver must be one of {('auto',) + STATISTICS_SOLVERS}: the search scores "
                f"every alpha from the psi x psi statistics of each fold; got "
                f"solver={self.solver!r}. For data whose statistics do not fit in memory, "
                "search alpha with LinearAttentionRegressor(solver='cg') in GridSearchCV.")
        return FitParams.checked(self, solvers=SOLVERS, alpha=False, decay=False, terms=False)

    def _fit_alpha(self):
        return self.alpha_

    def _decays(self):
        # The union of the candidates' blocks during the pass, the chosen ones after.
        return getattr(self, "_decays_in_use", None)

    @fits_in_namespace
    def fit(self, X, y, sample_weight=None, *, groups=None):
        """Score every alpha by cross-validation, then refit at the best one.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Training sequences; trailing all-NaN tokens are padding.
        y : array-like
            Targets, as for :meth:`LinearAttentionRegressor.fit`.
        sample_weight : array-like of shape (n_samples,) or None, default=None
            Non-negative weight of each sequence, in the fits and in the
            scores.
        groups : array-like of shape (n_samples,) or None, default=None
            Group labels of the sequences, for a group splitter such as
            :class:`~sklearn.model_selection.GroupKFold`.

        Returns
        -------
        self : LinearAttentionRegressorCV
            The estimator, refitted at ``alpha_``.

        Raises
        ------
        ValueError
            For dask input, a split with an empty part or a part without a
            sequence of positive weight, or psi x psi statistics of every
            fold larger than the memory budget.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn.model_selection import GroupKFold
        >>> from sklearn_linattn import LinearAttentionRegressorCV
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(120, 4, 2))
        >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + 0.1 * rng.normal(size=120)
        >>> groups = np.repeat(np.arange(12), 10)  # e.g. 12 recordings of 10 sequences
        >>> model = LinearAttentionRegressorCV(cv=GroupKFold(4)).fit(X, y, groups=groups)
        >>> model.n_splits_, len(model.cv_results_["mean_test_score"])
        (4, 10)
        """
        params = self._check_params()
        self._state = None
        if is_dask_collection(X, y):
            raise ValueError(
                f"{type(self).__name__} needs X and y in memory: the statistics of every "
                "fold are gathered in one pass over them. For dask arrays, search alpha "
                "with LinearAttentionRegressor in GridSearchCV.")
        alphas = _checked_alphas(self.alphas)
        candidates = _checked_decays(self.decays)
        union = _union_of(candidates)
        self._decays_in_use = union
        source = ArraySource(X, y, sample_weight, layout=params.layout, readout=params.readout)
        d, n_rows = source.d, source.n_rows_bound()
        n_blocks = 1 if union is None else len(union)
        psi = n_blocks * n_attention_features(d)
        if groups is not None:
            groups = np.asarray(groups)
            if groups.shape != (source.n_samples,):
                raise ValueError(
                    f"groups must have shape ({source.n_samples},), one label per sequence; "
                    f"got shape {groups.shape}.")
        labels, parts = split_groups(cv_splits(self.cv, source.n_samples, groups),
                                     source.n_samples)
        # Each candidate decay solved as a search over it alone would solve it.
        solvers = [_search_solver(params.solver, n_rows, n_attention_features(d) * len(
            (1.0,) if c is None else c)) for c in candidates]
        self._check_memory(psi, d, n_blocks, int(labels.max()) + 1)
        linear = _checked_term_options(self.fit_linear, "fit_linear")
        term_options, terms = _term_candidates(
            d, _checked_term_options(self.fit_intercept, "fit_intercept"),
            _checked_term_options(self.fit_skip, "fit_skip"), linear,
            _checked_alphas(self.alphas_linear, "alphas_linear") if max(linear) else (),
            source.n_tokens)
        if terms.n_window:
            source = with_linear_columns(source, terms.n_lags)
        # Heads fitted to the rows directly need the rows (a compression without terms).
        direct = params.n_heads is not None and not terms.n_columns and union is None
        # The folds' statistics in the pass, whatever solves the whole.
        pass_solver = next((s for s in solvers if REGISTRY[s].statistics), STATISTICS_SOLVERS[0])
        problem = StandardizedProblem.from_source(
            source, readout=params.readout, terms=terms, solver=pass_solver, decays=union,
            keep=any(keep_rows(s, n_rows, d, source.d_out + terms.n_terms, direct=direct,
                               n_blocks=n_blocks) for s in solvers),
            groups=labels)
        params.log(f"statistics of {int(labels.max()) + 1} groups of sequences (one pass)")
        if candidates == [union]:
            problems = [problem]
        else:
            problems = [_candidate_problem(problem, union, c) for c in candidates]
        searched = [(c, t) for c in candidates for t in term_options]
        # The group of each kept row (one per sequence of positive weight, in order).
        row_groups = None
        if params.readout == "last":
            w = source.sample_weight
            row_groups = labels if w is None else labels[np.asarray(w) > 0]
        scores = np.concatenate([
            cross_validated_scores(p, parts, alphas, scoring=self.scoring, solver=s,
                                   terms=term_options, row_groups=row_groups)
            for p, s in zip(problems, solvers)])
        d_out = problem.d_out - terms.n_window
        tie = score_tie(problem.stats, d_out, problem.standardizer.y_exponents[:d_out],
                         self.scoring)
        chosen = self._set_results(alphas, searched, scores, tie)
        self._decays_in_use = self.decay_
        decay_problem = problems[chosen // len(term_options)]
        solver = solvers[chosen // len(term_options)]
        # The folds are scored: the refit needs the sum only (no copy of every group's).
        for p in problems + [problem]:
            p.group_stats = None
        refit = decay_problem.with_terms(searched[chosen][1])
        params.log(f"{alphas.size} alphas, {len(candidates)} decays and {len(term_options)} "
                   f"sets of terms scored on {len(parts)} splits, alpha_ = {self.alpha_:g}, "
                   f"decay_ = {self.decay_}, fit_intercept_ = {self.fit_intercept_}, "
                   f"fit_skip_ = {self.fit_skip_}, fit_linear_ = {self.fit_linear_}")
        _warn_if_at_the_edge(alphas, self.alpha_)
        return self._fit_problem(refit, params, solver, source.single_output)

    def _check_memory(self, psi, d, n_blocks, n_groups):
        """Refuse, before the pass, statistics of every group larger than the memory budget."""
        P = n_blocks * n_pairs(d)
        # The groups' compact statistics, their sum and a split's two sums; a
        # split's Gram matrices, eigenvectors and products.
        need = 8.0 * ((n_groups + 3) * n_pairs(P) * n_pairs(d) + 5 * psi * psi)
        budget = resolve_budget(None)
        if need > budget:
            raise ValueError(
                f"{type(self).__name__} keeps psi x psi statistics for each of the {n_groups} "
                f"groups of sequences its splits make (psi = {psi} at d = {d}): about "
                f"{need / 2**30:.3g} GiB, more than the memory budget of "
                f"{budget / 2**30:.3g} GiB. Use fewer splits (cv), or search alpha with "
                "LinearAttentionRegressor(solver='cg') in GridSearchCV.")

    def _set_results(self, alphas, searched, scores, tie):
        """``cv_results_``, the best alpha, decay and terms (the first of equal best scores).

        ``searched`` lists the pairs (candidate decay, LinearTerms) in the
        order of the rows of ``scores``, each pair with one row per alpha.
        Returns the index of the chosen pair; scores within ``tie`` of the
        best are equal.
        """
        with np.errstate(over="ignore"):
            means, stds = scores.mean(axis=1), scores.std(axis=1)
        # The candidates' scores: the splits' mean, or their median (one split
        # with an outlying sequence cannot decide).
        chosen_by = fold_score(scores, self.fold_score)
        # Scores near float64's limit: their squares overflowed, scaled they do not.
        big = np.isfinite(means) & ~np.isfinite(stds)
        if big.any():
            top = np.abs(scores[big]).max(axis=1, keepdims=True)
            stds[big] = top[:, 0] * (scores[big] / top).std(axis=1)
        valid = ~np.isnan(means)
        if not valid.any():
            raise ValueError(
                f"scoring={self.scoring!r} is undefined on some split (NaN test scores): R^2 "
                "needs at least two held-out rows per split (LeaveOneOut holds out one). Use "
                "scoring='neg_mean_squared_error' or a splitter with larger test parts.")
        ranks = np.full(means.size, np.iinfo(np.int32).max, dtype=np.int32)
        ranks[valid] = rankdata(-chosen_by[valid], method="min")
        scored = np.where(valid, chosen_by, -np.inf)
        # The first candidate (decays, then fewer terms, then alphas in order) whose
        # score is within rounding of the best: scores that differ in their last
        # digits (another unit of the data) never decide a choice.
        best = int(np.flatnonzero(scored >= scored.max() - tie)[0])
        grid = [(a, c, t) for c, t in searched for a in alphas]
        columns = {"alpha": [float(a) for a, _, _ in grid]}
        if len({c for c, _ in searched}) > 1 or searched[0][0] is not None:
            columns["decay"] = [c for _, c, _ in grid]
        if len({t.intercept for _, t in searched}) > 1:
            columns["fit_intercept"] = [t.intercept for _, _, t in grid]
        if len({t.skip for _, t in searched}) > 1:
            columns["fit_skip"] = [t.skip for _, _, t in grid]
        if any(t.n_lags for _, t in searched):
            if len({bool(t.n_lags) for _, t in searched}) > 1:
                columns["fit_linear"] = [bool(t.n_lags) for _, _, t in grid]
            columns["alpha_linear"] = [t.alpha_linear if t.n_lags else None
                                       for _, _, t in grid]
        results = {}
        for name, values in columns.items():
            column = np.empty(len(values), dtype=np.float64 if name == "alpha" else object)
            column[:] = values
            results[f"param_{name}"] = np.ma.MaskedArray(column, mask=False)
        results["params"] = [{name: values[i] for name, values in columns.items()}
                             for i in range(len(grid))]
        for k in range(scores.shape[1]):
            results[f"split{k}_test_score"] = scores[:, k].copy()
        results.update(mean_test_score=means, std_test_score=stds, rank_test_score=ranks)
        self.cv_results_ = results
        self.n_splits_ = scores.shape[1]
        self.best_index_ = best
        alpha, self.decay_, terms = grid[best]
        self.alpha_ = float(alpha)
        self.fit_intercept_, self.fit_skip_ = terms.intercept, terms.skip
        self.fit_linear_ = bool(terms.n_lags)
        self.alpha_linear_ = terms.alpha_linear if terms.n_lags else None
        self.best_score_ = float(chosen_by[best])
        return best // alphas.size
