"""The estimator: parameters checked once, then the one fit path (source, pass, model).

:class:`LinearAttentionRegressor` checks its parameters, reads X through a
source (:func:`~._problem.data_source`: NumPy chunks or dask blocks), builds
the one standardized problem (:class:`~._problem.StandardizedProblem`),
hands it to :func:`~._model.fit_model` and sets the fitted attributes from
the one conversion back.  ``fit``, ``partial_fit`` (which continues a
:class:`~._problem.FitState`) and fits from statistics share that path.
"""

import numpy as np
from sklearn.base import BaseEstimator

from ._namespace import fits_in_namespace, returns_in_namespace
from ._base import AttentionHeadsRegressorMixin
from ._features import features_matvec, n_attention_features, row_factors
from ._memory import sample_chunks, real_tokens, sample_values
from ._model import fit_model
from ._problem import FitState, StandardizedProblem, data_source, keep_rows, with_linear_columns
from ._solvers import (
    REGISTRY,
    SOLVERS,
    STATISTICS_SOLVERS,
    choose_solver,
    solver_memory,
)
from ._units import SAFE_EXPONENT, TokenStandardizer, scale_per_sample
from ._params import FitParams, check_decays
from ._terms import LinearTerms

__all__ = ["LinearAttentionRegressor"]


class LinearAttentionRegressor(AttentionHeadsRegressorMixin, BaseEstimator):
    """One-layer multi-head linear attention fitted exactly by least squares.

    The output ``y = sum_h V_h sum_t x_t (x_t^T Q_h x_last)`` is linear in
    the cubic features of :class:`LinearAttentionFeatures`, so the best MHLA
    over *any* number of heads is a (ridge) least-squares problem with a
    global optimum, converted back into attention heads by an SVD and
    optionally compressed to fewer heads computing the same function.  Fits,
    verdicts and predictions do not depend on the units of the data (the user
    guide's theory page, "Standardized coordinates").

    Parameters
    ----------
    readout : {"last", "all"}, default="last"
        One target per sequence (its last token), or one at every position
        (causal attention over each prefix, as in autoregressive training).
    alpha : float, default=0.0
        Ridge penalty, unit-free: the fit minimises the weighted mean squared
        error plus ``alpha * mean(eigenvalues of Lambda_D) * ||c||**2`` on the
        standardized features (the terms not penalized).  0 gives the exact
        empirical risk minimizer (of minimum norm in the standardized
        coordinates when the features are rank-deficient).
    n_heads : int, "auto" or None, default=None
        None returns every head of the SVD; an integer k at most k heads (a
        :class:`~sklearn.exceptions.ConvergenceWarning` when they fit the
        training data materially worse than the unconstrained optimum, or
        heads fitted to the data directly: ``local_certificate_``); ``"auto"``
        the fewest heads whose fit is not materially worse.  Per decay with
        ``decay``.  The compression page says what "materially" means and
        what the search costs.
    head_dim : int or None, default=None
        Every head's dimension (PyTorch's ``head_dim``): the best layer found
        of ``n_heads`` (an integer) heads of rank at most ``head_dim``, with its
        certified gap ``head_dim_gap_``.  Not with ``decay``.
    decay : None, float or array-like of float, default=None
        Fixed decays in (0, 1] (retention): a token s steps back weighs
        ``gamma**s``; one group of heads per decay, fitted jointly.
    solver : {"auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr"}, default="auto"
        How the least squares is solved; all give the same fit and verdict to
        rounding (``"cg"`` to ``tol``).  ``"auto"`` never picks ``"lsmr"``
        (sparse one-hot rows); ``partial_fit`` needs ``"auto"``, ``"eigh"`` or
        ``"cholesky"``.  The user guide's theory page ("Solvers") gives each
        one's algorithm, its cost and the choice of ``"auto"``.
    token_dim : int or None, default=None
        Token dimension for 2-D X (see :class:`LinearAttentionFeatures`).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X (and of outputs with a token axis): (n_samples, n_tokens,
        d) or (n_samples, d, n_tokens) as aeon and sktime store series.
    random_state : int, RandomState instance or None, default=None
        Seeds the restarts of the heads' compression or fit.
    verbose : int, default=0
        Print the time of each stage when positive.
    tol, max_iter : float and int or None, default=1e-8 and None
        ``"cg"`` stops at a relative residual ``tol``, or after ``max_iter`` (1000).
    fit_intercept, fit_skip : bool, default=False
        Add a constant ``intercept_``, and a linear term ``skip_coef_ @ x`` in
        the row's own token (a transformer block's residual path), both not
        penalized; the fit and the certificate are then about the joint class.
    fit_linear, alpha_linear : bool and float, default=False and 1e-2
        A linear term in the last ``n_tokens`` (fit's) tokens, ``readout="last"``,
        with its own penalty: ``StandardScaler`` then ``Ridge(alpha_linear * n)``.

    Attributes
    ----------
    coef_ : ndarray of shape (d_out, psi) or (d_out, n_decays * psi)
        Folded coefficients: ``y = H(X) @ coef_.T`` (plus the terms).
    intercept_, skip_coef_, linear_coef_ : ndarray
        The terms, (d_out,), (d_out, d) and by lag (d_out, n_tokens, d), lag 0
        last (zeros, zeros and None without them).
    value_matrices_, key_query_matrices_ : ndarray of shape (H, d_out, d) and (H, d, d)
        The heads V_h and Q_h (H = ``n_heads_``).
    head_decays_ : ndarray of shape (H,) or None
        Each head's decay (None without ``decay``).
    n_heads_ : int
        Number of heads returned.
    head_dim_, head_dim_gap_ : int or None, float or None
        The head dimension; the heads' training risk less the unconstrained
        optimum's (in y's units), which bounds the best such layer's.  Or None.
    local_certificate_, compression_residual_ : LocalCertificate or None, float or None
        For heads fitted to the data directly, whether the data identify them
        locally; the relative coefficient residual of a compression.
    standardization_, n_features_in_, n_outputs_ : TokenStandardizer, int, int
        The standardized coordinates of the fit; d and d_out.
    feature_rank_ : int
        Rank of the feature Gram matrix (an upper bound with ``"cg"``).
    certificate_ : IdentifiabilityCertificate
        Truthy iff every empirical risk minimizer computes the same function
        on every input (``certify_identifiability`` of the same data).
    solver_, n_iter_ : str, int
        The solver (``"auto"`` resolved), its iterations (1 but for ``"cg"``).

    See Also
    --------
    LinearAttentionRegressorCV : alpha, decays and terms chosen by cross-validation.

    Notes
    -----
    Sample weights are per sequence.  Results float64 cannot hold in the
    data's own units raise a ValueError.  See the user guide's theory page
    ("The estimator's contract") for streaming, float32 input and threads.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time", arXiv:2410.10101.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3))
    >>> X = rng.normal(size=(200, 5, 3))
    >>> y = np.einsum("aj,ntj,ntk,kl,nl->n", V[0], X, X, Q[0], X[:, -1])
    >>> model = LinearAttentionRegressor(n_heads="auto").fit(X, y)
    >>> model.n_heads_  # the fewest heads computing the fitted function
    1
    >>> X_long = rng.normal(size=(3, 40, 3))  # longer than any training sequence
    >>> f = np.einsum("aj,ntj,ntk,kl,nl->n", V[0], X_long, X_long, Q[0], X_long[:, -1])
    >>> bool(np.allclose(model.predict(X_long), f))
    True
    """

    def __init__(
        self,
        readout="last",
        *,
        alpha=0.0,
        n_heads=None,
        head_dim=None,
        decay=None,
        solver="auto",
        token_dim=None,
        data_format="channels_last",
        random_state=None,
        verbose=0,
        tol=1e-8,
        max_iter=None,
        fit_intercept=False,
        fit_skip=False,
        fit_linear=False,
        alpha_linear=1e-2,
    ):
        self.readout = readout
        self.alpha = alpha
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.decay = decay
        self.solver = solver
        self.token_dim = token_dim
        self.data_format = data_format
        self.random_state = random_state
        self.verbose = verbose
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.fit_skip = fit_skip
        self.fit_linear = fit_linear
        self.alpha_linear = alpha_linear

    def _check_params(self):
        """The parameters of this fit, each checked once (:class:`~._params.FitParams`)."""
        return FitParams.checked(self, solvers=SOLVERS)

    def _decays(self):
        """The decays of the fitted model's feature blocks (None: one block, no decay)."""
        return check_decays(self.decay)

    def _fit_alpha(self):
        """The unit-free penalty of the fit (a search sets it from its candidates)."""
        return float(self.alpha)

    @fits_in_namespace
    def fit(self, X, y, sample_weight=None):
        """Fit the global least-squares optimum and convert it into heads.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Training sequences; trailing all-NaN tokens are padding.  A dask
            array is processed block by block where it lives: reduced to
            sufficient statistics (``solver`` "eigh" or "cholesky"), or kept
            on the workers for a matrix-free ``"cg"`` whose every pass is a
            map-reduce over the blocks (``"auto"`` picks it when the psi x psi
            statistics would not fit the memory budget); see the user guide's
            Dask page.
        y : array-like
            ``readout="last"``: shape (n_samples,) or (n_samples, d_out).
            ``readout="all"``: shape (n_samples, n_tokens) or
            (n_samples, n_tokens, d_out), NaN at padded positions.
        sample_weight : array-like of shape (n_samples,) or None, default=None
            Non-negative weight of each sequence (of each of its positions for
            ``readout="all"``); see Notes of the class.

        Returns
        -------
        self : LinearAttentionRegressor
            The fitted estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> X = np.random.default_rng(0).normal(size=(60, 4, 2))
        >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
        >>> w = np.r_[np.zeros(10), np.ones(50)]  # the first ten sequences do not count
        >>> model = LinearAttentionRegressor().fit(X, y, sample_weight=w)
        >>> model.certificate_.n_samples, bool(np.allclose(model.predict(X), y))
        (50, True)
        """
        params = self._check_params()
        self._state = None  # fit = a new state and one batch
        return self._fit_batch(X, y, sample_weight, params)

    def _fit_batch(self, X, y, sample_weight, params, *, state=None, partial=False):
        """The one path below ``fit`` and ``partial_fit``: a source, the one pass, the fit.

        ``state`` is the :class:`~._problem.FitState` a ``partial_fit``
        continues (None: a first batch); ``partial``: the statistics solvers
        only, and no heads fitted to the rows directly.
        """
        p = params
        source = data_source(X, y, sample_weight, readout=p.readout, layout=p.layout,
                             n_features_in=None if state is None else state.d)
        d, n_rows = source.d, source.n_rows_bound()
        psi = p.n_blocks * n_attention_features(d)
        if partial and state is None:
            self._check_statistics_fit(d, p.n_blocks)
        solver = choose_solver(p.solver, n_rows, psi, statistics=partial,
                               dask=not source.sequential, check_memory=source.sequential)
        terms = LinearTerms(d, intercept=p.intercept, skip=p.skip)
        if p.linear:
            if partial or not source.sequential:
                raise ValueError(
                    "fit_linear=True needs the whole training data in memory at once (its "
                    "columns are every token of each sequence): use fit on NumPy arrays, not "
                    "partial_fit or dask arrays.")
            terms = LinearTerms(d, intercept=p.intercept, skip=p.skip, n_lags=source.n_tokens,
                                alpha_linear=p.alpha_linear)
            source = with_linear_columns(source, terms.n_lags)
        # Heads fitted to the rows directly need the rows (a compression without terms).
        direct = (not partial and source.sequential and p.n_heads is not None
                  and not terms.n_columns and p.decays is None)
        problem = StandardizedProblem.from_source(
            source, readout=p.readout, terms=terms, solver=solver, decays=p.decays,
            keep=keep_rows(solver, n_rows, d, (source.d_out or 0) + terms.n_terms, direct=direct,
                           n_blocks=p.n_blocks),
            previous=state)
        p.log("standardized coordinates and rows or statistics (one pass)")
        single = source.single_output if state is None else self._single_output
        return self._fit_problem(problem, p, solver, single, previous=state)

    def _fit_problem(self, problem, params, solver, single_output, previous=None):
        """The rest of every fit: solve, certify, heads, and the one conversion back."""
        p = params
        try:
            model = fit_model(
                problem, solver=solver, alpha=self._fit_alpha(), tol=p.tol,
                max_iter=p.max_iter, n_heads=p.n_heads, head_dim=p.head_dim,
                random_state=p.random_state, log=p.log, **p.layout)
        finally:
            problem.release()
        # What a later partial_fit continues (statistics solvers only).
        self._state = FitState.committed(problem, previous)
        attributes = model.to_user()
        for name, value in attributes.items():
            setattr(self, name, value)
        self.standardization_ = model.standardizer
        self.certificate_ = model.certificate
        self.local_certificate_ = model.local_certificate
        self.compression_residual_ = model.compression_residual
        self.feature_rank_ = model.feature_rank
        self.solver_ = model.solver
        self.n_iter_ = model.n_iter
        self._standardized_heads = (model.V, model.Q)
        self._standardized_coef = model.coef
        self.n_heads_ = model.V.shape[0]
        self.head_dim_ = p.head_dim
        self.head_dim_gap_ = (None if model.head_dim_gap is None else
                              model.standardizer.squared_errors_to_user(model.head_dim_gap).sum())
        self.n_features_in_ = problem.d
        self.n_outputs_ = problem.d_out - problem.terms.n_window
        self._single_output = bool(single_output)
        return self

    @fits_in_namespace
    def partial_fit(self, X, y, sample_weight=None):
        """Add a batch of sequences to the fit (incremental sufficient statistics).

        The statistics ``Phi^T W Phi`` and ``Phi^T W y`` of all batches seen
        so far (since the last ``fit``, or continuing a ``fit`` made with
        ``"eigh"``/``"cholesky"``) are summed, and ``coef_``, the heads and
        ``certificate_`` are recomputed from them after every call: the model
        after k calls equals ``fit`` on the k batches together (to rounding)
        wherever the data determine the answer (``certificate_`` True), and
        on rank-deficient data it is the same minimum-norm fit in the same
        coordinates, to the rounding of a map: the statistics of earlier
        batches are mapped into the coordinates of all the data (through the
        factor of their non-zero eigenvalues where later batches stretch
        directions the earlier ones hardly reached, so that the rank is
        kept).  The rank is never more than the number of rows seen; where
        later batches change a collinear whitening by a large factor,
        ``feature_rank_`` can exceed ``fit``'s by eigenvalues at the rounding
        of that map, with predictions equal to ``fit``'s to about the same
        relative rounding.  Each call
        therefore costs one solve of the psi x psi normal equations plus, when
        ``n_heads`` is set, a head compression (with ``"auto"``, the search
        over head counts); for many small batches keep
        ``n_heads=None`` and compress once at the end
        (:func:`~sklearn_linattn.compress_heads` on ``coef_``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of this batch; any length, but the same token dimension
            d in every call.
        y : array-like
            Targets shaped as in :meth:`fit`, with the same number of outputs
            in every call.
        sample_weight : array-like of shape (n_samples,) or None, default=None
            Non-negative weight of each sequence.

        Returns
        -------
        self : LinearAttentionRegressor
            The estimator, fitted on every batch seen so far.

        Raises
        ------
        ValueError
            If ``solver`` is ``"svd"``, ``"dual"`` or ``"cg"`` (they keep no
            statistics), if d or the number of outputs differs from the first
            call, or if ``readout`` changed since the first call.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> X = np.random.default_rng(0).normal(size=(60, 4, 2))
        >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
        >>> model = LinearAttentionRegressor()
        >>> for batch in np.array_split(np.arange(60), 3):
        ...     model = model.partial_fit(X[batch], y[batch])
        >>> whole = LinearAttentionRegressor().fit(X, y)
        >>> bool(np.allclose(model.coef_, whole.coef_))
        True
        """
        params = self._check_params()
        return self._fit_batch(X, y, sample_weight, params,
                               state=self._continued_state(params), partial=True)

    def _continued_state(self, params):
        """The state a partial_fit continues (None to start), or why it cannot."""
        if self.solver != "auto" and not REGISTRY[self.solver].statistics:
            raise ValueError(
                f"partial_fit needs solver in {('auto',) + STATISTICS_SOLVERS}, which "
                f"accumulate the psi x psi sufficient statistics; got solver={self.solver!r}."
            )
        state = getattr(self, "_state", None)
        if state is None and hasattr(self, "coef_"):
            if getattr(self, "solver_", None) in STATISTICS_SOLVERS:
                raise ValueError(
                    "partial_fit cannot continue this model: it keeps no sufficient "
                    "statistics (a model read by load_model does not store them); call "
                    "fit on all the data, or fit with partial_fit from the start."
                )
            raise ValueError(
                f"partial_fit cannot continue a fit made with solver={self.solver_!r}, "
                "which keeps no sufficient statistics; call fit again, or fit with "
                "partial_fit from the start (or with solver='eigh' or 'cholesky')."
            )
        if state is not None:
            state.check(readout=params.readout, intercept=params.intercept,
                        skip=params.skip, decays=params.decays)
        return state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # Inputs of other array libraries keep their namespace and device under
        # array API dispatch (the user guide's array API page).
        tags.array_api_support = True
        return tags

    @staticmethod
    def _check_statistics_fit(d, n_blocks=1):
        """Refuse psi x psi statistics larger than the memory budget, before accumulating."""
        psi = n_blocks * n_attention_features(d)
        if choose_solver("auto", psi, psi) == "cg":
            need = solver_memory("eigh", psi, psi)
            raise ValueError(
                f"partial_fit keeps psi x psi statistics (psi = {psi} at d = {d}), about "
                f"{need / 2**30:.3g} GiB with the solve, more than half the physical "
                "memory; use fit with solver='cg'."
            )

    @returns_in_namespace
    def predict_from_coefficients(self, X):
        """Predict with ``coef_`` on the cubic features instead of the heads.

        Equal to :meth:`predict` to rounding when ``n_heads`` is None; after a
        compression the difference is the compression residual.  Computed from
        the two factors of the features chunk by chunk (the feature rows are
        never formed).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length; trailing all-NaN tokens are padding.

        Returns
        -------
        y : ndarray, shaped as for :meth:`predict`
            ``H(X) @ coef_.T``: the outputs of the uncompressed least-squares
            solution.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> X = np.random.default_rng(0).normal(size=(50, 4, 2))
        >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)  # a one-head MHLA
        >>> model = LinearAttentionRegressor(n_heads=1).fit(X, y)
        >>> bool(np.allclose(model.predict_from_coefficients(X), model.predict(X)))
        True
        """
        X, lengths = self._validate_X(X)
        n_samples, n_tokens, d = X.shape
        k = self.coef_.shape[0]
        st = getattr(self, "standardization_", None)
        coef = getattr(self, "_standardized_coef", None)
        if st is None or coef is None:
            st, coef = TokenStandardizer.identity(d, k, self._decays()), self.coef_
        P = st.n_moments
        real = real_tokens(lengths, n_tokens)
        if self.readout == "last":
            Y = np.empty((n_samples, k))
        else:
            Y = np.full((n_samples, n_tokens, k), np.nan)
        per_sample = sample_values(d, n_tokens, self.readout, P * (k + 2) + d)
        for sl in sample_chunks(n_samples, per_sample):
            # Standardized like the training data, then each sequence scaled by
            # a power of two 2**-f (its outputs scale by 2**(3 f), exactly).
            Xc, f = scale_per_sample(st.transform(X[sl]), safe=SAFE_EXPONENT)
            S, x, sample = row_factors(Xc, lengths[sl], self.readout, st.decays)
            S = st.scale_moments(S)
            out = st.outputs_to_user(features_matvec(S, x, coef),
                                     sample_exponents=3 * f[sample])
            if self.readout == "last":
                Y[sl] = out
            else:
                Y[sl][real[sl]] = out
        return self._shape_output(self._add_terms(Y, X, lengths))
