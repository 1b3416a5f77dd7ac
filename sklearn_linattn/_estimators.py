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

from ._base import AttentionHeadsRegressorMixin
from ._features import features_matvec, n_attention_features, row_factors
from ._memory import sample_chunks, real_tokens, sample_values
from ._model import fit_model
from ._problem import FitState, StandardizedProblem, data_source, keep_rows
from ._solvers import (
    REGISTRY,
    SOLVERS,
    STATISTICS_SOLVERS,
    SufficientStatistics,
    choose_solver,
    solver_memory,
)
from ._standardize import SAFE_EXPONENT, TokenStandardizer, scale_per_sample
from ._params import FitParams, check_decays
from ._terms import LinearTerms

__all__ = ["LinearAttentionRegressor"]


class LinearAttentionRegressor(AttentionHeadsRegressorMixin, BaseEstimator):
    """One-layer multi-head linear attention fitted exactly by least squares.

    The output ``y = sum_h V_h sum_t x_t (x_t^T Q_h x_last)`` is linear in
    the cubic features of :class:`LinearAttentionFeatures`, so the best MHLA
    over *any* number of heads is a (ridge) least-squares problem with a
    global optimum.  Its solution is converted back into attention heads by
    an SVD, and optionally compressed to ``n_heads`` heads computing the same
    function.

    Parameters
    ----------
    readout : {"last", "all"}, default="last"
        ``"last"``: one target per sequence, the output at its last token.
        ``"all"``: a target at every position (causal attention over each
        prefix), as in autoregressive training.
    alpha : float, default=0.0
        Ridge penalty, unit-free: it penalises the coefficients of the
        features of the standardized tokens relative to the mean eigenvalue
        of their second moment, so that the fit minimises the weighted mean
        squared error plus ``alpha * mean(eigenvalues of Lambda_D) *
        ||c||**2`` (the user guide's theory page).  ``X``, ``c * X`` and
        ``X @ A`` give the same predictions for every alpha, and a grid such
        as ``np.logspace(-8, 2, 11)`` means the same on any data.  The
        intercept and skip terms are not penalized.  0 gives the exact
        empirical risk minimizer; when the features are rank-deficient, the
        one of minimum norm in the standardized coordinates
        (``standardization_``, see Notes), except with ``solver="cg"`` (see
        there).
    n_heads : int, "auto" or None, default=None
        None returns every head of the SVD.  An integer k compresses to at
        most k heads (:func:`~sklearn_linattn.compress_heads`); a
        :class:`~sklearn.exceptions.ConvergenceWarning` says when the k heads
        fit the training data materially worse than the unconstrained
        optimum: by more than the data's own noise explains (see the user
        guide on compression), not merely inexactly.  When the data do not
        identify the unconstrained model (``certificate_`` fails, e.g. fewer
        rows than psi) and its minimum-norm point has no k-head form, ``fit``
        fits k heads to the data directly
        (:func:`~sklearn_linattn.fit_heads`, far fewer samples than psi for
        few heads) and keeps them if they fit better; ``local_certificate_``
        then says whether the data identify them locally.  Not with
        ``fit_intercept`` / ``fit_skip``, nor in ``partial_fit`` or on Dask
        input (which keep no sequences).
        ``"auto"`` returns the fewest heads, between 1 and the SVD's count (0
        for a zero fit), whose fit is not materially worse: the smallest k
        for which the heads ``n_heads=k`` would return (compressed, or fitted
        directly) raise the training risk over the unconstrained optimum by
        no more than the noise explains, ``max(0.01, 6 p / (N - p))`` times
        the optimum's residual risk (p = rank times ``d_out``, N the feature
        rows), plus
        ``(1e-8)**2`` of its explained energy (more with ``"cg"``, to its
        accuracy).  On noise-free data only rounding is allowed, so k is the
        least number of heads computing the fitted function (as far as the
        compression's search finds it); on noisy data a head whose effect
        stays within the noise allowance may be left out.  Where the risk
        has no exact form (``"cg"`` on Dask input) its upper bound is judged.
        ``n_heads_`` is the count chosen (the user guide on compression
        describes the search and its measurements).  A UserWarning says when
        the heads kept are more than 0.1 (``compression_residual_``, relative)
        from the unconstrained coefficients and were kept only because the
        excess is within the noise allowance: the two are then different
        functions away from the training data.  Each count tried costs a
        compression; where the heads are fitted to the data directly (above),
        each also costs a direct fit of k heads (``fit_heads``' restarts over
        the rows), by far the dearest part of the search: set an integer, or
        None, where that is too slow.
        With ``decay``, each decay's group of heads is compressed on its own:
        an integer is the most heads per decay, ``"auto"`` the fewest per
        decay, judged on the fit of all the groups together; heads are not
        fitted to the data directly.
    decay : None, float or array-like of float, default=None
        Fixed decays in (0, 1] (retention with fixed decays): a head of decay
        gamma attends to ``sum_t gamma**(r - t) x_t x_t^T`` at row position
        r, so a token s steps back weighs ``gamma**s`` (for ``readout="last"``
        counted from the last real token).  A sequence gives one block of
        psi features and one group of heads per decay (in the order given;
        1.0 is the plain layer), all fitted jointly, exactly, and certified
        together; ``head_decays_`` gives each head's decay.  None: no decay
        (the paper's layer).
    solver : {"auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr"}, default="auto"
        How the least squares is solved (N feature rows, psi features, P =
        d (d + 1) / 2); all give the same fit and verdict, to rounding (to
        ``tol`` for ``"cg"``).  The user guide's theory page ("Solvers")
        describes each algorithm and its cost.

        - ``"eigh"``: normal equations accumulated over chunks of sequences
          (memory O(chunk + psi^2)), then the whole spectrum.
        - ``"cholesky"``: the same statistics solved by a Cholesky factor,
          extreme eigenvalues by Lanczos; hands over to ``"eigh"`` when the
          Gram matrix is (nearly) singular.
        - ``"svd"``: SVD of the design matrix (the most accurate; memory
          O(N psi)).
        - ``"dual"``: the N x N kernel, for N < psi (memory O(N^2 + N psi)).
        - ``"cg"``: matrix-free conjugate gradients, with a matrix-free
          certificate (memory O(N n d + psi + P^2)).  With ``alpha=0`` on a
          rank-deficient design the coefficients are the least-squares
          solution of minimal preconditioned norm, not the minimum-norm one:
          same training fit, same predictions on every input the certificate
          would cover.  On dask input it runs on the workers' blocks, every
          pass a map-reduce (nothing of size psi^2 anywhere).
        - ``"lsmr"``: sparse feature rows of one-hot tokens on their active
          columns (memory follows the non-zeros; ``max_iter`` caps its
          iterations, default 10 times the number of active columns).  Never
          chosen by ``"auto"``.
        - ``"auto"``: ``"cg"`` when the dense psi x psi arrays would take more
          than half the physical memory; ``"dual"`` for N < psi (``"cg"`` if
          its kernel and row basis do not fit); otherwise ``"eigh"`` for
          psi <= 64 and ``"cholesky"`` above.

        ``partial_fit`` needs ``"auto"``, ``"eigh"`` or ``"cholesky"``.
    token_dim : int or None, default=None
        Token dimension for 2-D X (see :class:`LinearAttentionFeatures`).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X (and of targets with an output axis for ``readout="all"``,
        and of what ``predict`` and ``generate`` return):
        ``"channels_last"`` is (n_samples, n_tokens, d), ``"channels_first"``
        (n_samples, d, n_tokens), the layout of aeon and sktime (see
        :class:`LinearAttentionFeatures`).
    random_state : int, RandomState instance or None, default=None
        Seeds the random restarts of the head compression.
    verbose : int, default=0
        Print the time spent in each stage when positive.
    tol : float, default=1e-8
        ``solver="cg"`` stops when the residual of the normal equations is
        below ``tol`` times their right-hand side ``Phi^T W y``.
    max_iter : int or None, default=None
        Iteration cap of ``solver="cg"``; None means 1000.
    fit_intercept : bool, default=False
        Add a constant ``intercept_`` to every output (not penalized by
        ``alpha``).  Off by default, unlike scikit-learn's linear models:
        multi-head linear attention has no constant term, so without it the
        fitted class is exactly the paper's (outputs scale as ``c**3`` with
        the inputs; the certificate needs psi rows), and one more column is
        one more direction the data must determine.
    fit_skip : bool, default=False
        Add a linear term in the row's own token, ``skip_coef_ @ x``: the last
        token for ``readout="last"``, the current one for ``"all"`` (the
        residual path of a transformer block, ``y = b + W x + MHLA(X)``); not
        penalized by ``alpha``.  With either term the fit is the joint least
        squares over the terms and the attention coefficients, and
        ``certificate_``, ``covers`` and ``error_bound`` are about the whole
        linear class (see the user guide's "Intercept and skip terms");
        ``predict`` and ``generate`` add them; ``partial_fit`` and Dask input
        accumulate them with the rest.

    Attributes
    ----------
    coef_ : ndarray of shape (d_out, psi) or (d_out, n_decays * psi)
        Folded coefficients p of the fitted model: ``y = H(X) @ coef_.T``
        (plus ``intercept_ + x_last @ skip_coef_.T`` with the terms); with
        ``decay``, one block of psi per decay, in the order of ``decay``.
    intercept_ : ndarray of shape (d_out,)
        The constant term (zeros without ``fit_intercept``).
    skip_coef_ : ndarray of shape (d_out, d)
        The linear term in the row's token (zeros without ``fit_skip``).
    value_matrices_ : ndarray of shape (H, d_out, d)
        Value matrices V_h, one per returned head (H = ``n_heads_``).
    key_query_matrices_ : ndarray of shape (H, d, d)
        Fused key-query matrices Q_h.
    head_decays_ : ndarray of shape (H,) or None
        The decay of each head (with ``decay``; the heads come block by
        block), for :func:`~sklearn_linattn.mhla_forward` and
        :func:`~sklearn_linattn.nn.to_torch`.  None without ``decay``.
    n_heads_ : int
        Number of heads returned (with ``n_heads="auto"``, the count chosen).
    local_certificate_ : LocalCertificate or None
        When the heads were fitted to the data directly (see ``n_heads``):
        whether the data identify the k-head function near the fit
        (:func:`~sklearn_linattn.certify_heads_locally`; a local statement
        only).  None otherwise.
    compression_residual_ : float or None
        Relative coefficient residual of the head compression (None when
        ``n_heads`` did not call for compression), measured in the
        standardized coordinates where the heads are compressed.  With
        ``n_heads="auto"`` always set: the residual of the heads returned
        (rounding, about 1e-15, when the SVD's heads are kept).
    standardization_ : TokenStandardizer
        The standardized coordinates the model was fitted in: exact
        power-of-two scales of each token coordinate, the targets and the
        weights, and (for dense tokens) the whitening of the token second
        moment; ``standardization_.transform(X)`` gives the standardized
        tokens.  See Notes.
    n_features_in_ : int
        Token dimension d.
    n_outputs_ : int
        Output dimension d_out.
    feature_rank_ : int
        Numerical rank of the feature Gram matrix (psi when the training data
        identifies the function).  With ``solver="cg"`` on a design that is
        not identifiable only an upper bound (see ``certificate_.rank_is_bound``).
    certificate_ : IdentifiabilityCertificate
        Whether the training inputs identify the function (truthy iff every
        empirical risk minimizer computes the same function on every input),
        computed from the fit's own spectrum: equal to
        ``certify_identifiability(X, readout=readout, token_dim=token_dim,
        sample_weight=sample_weight)``.  With ``readout="all"`` it is about
        the prefix rows fitted; with sample weights about the rows of positive
        weight.  Its ``witness()`` starts from this fitted model.  It holds
        psi x rank eigenvectors (or, for ``"cholesky"``, the psi x psi
        factor).
    solver_ : str
        The solver that produced the fit (``"auto"`` resolved; ``"eigh"``
        when ``"cholesky"`` handed over).
    n_iter_ : int
        Conjugate-gradient iterations of ``solver="cg"`` (1 for the direct
        solvers: one solve).

    See Also
    --------
    LinearAttentionFeatures : the feature map on its own.

    Notes
    -----
    **Sample weights** are per sequence: the fit minimises
    ``sum_i w_i ||y_i - f(X_i)||^2 + alpha ||coef||^2`` (with ``readout="all"``,
    ``w_i`` multiplies the error at every position of sequence i).  A weight of
    2 is the same as the sequence appearing twice, a weight of 0 the same as
    leaving it out.

    **Streaming.** ``fit`` on a large array and ``partial_fit`` accumulate
    the sufficient statistics ``Phi^T W Phi`` and ``Phi^T W y`` chunk by
    chunk (memory O(chunk + psi^2): about 50 MB beyond X at d = 8, for a
    million sequences as for a thousand); ``fit`` is one reset followed by a
    pass over the chunks.

    **Units.** The fit does not depend on the units of the data: every
    solver works on standardized tokens (each coordinate scaled by an exact
    power of two, then whitened to unit second moment) and maps the result
    back, so ``X``, ``c * X`` (any c from 1e-100 to 1e100) and ``X @ A`` (any
    invertible A) give the same function, verdict and predictions, to the
    rounding of the data.  Two choices follow from it: on a rank-deficient
    design ``alpha=0`` returns the minimizer of minimum norm in those
    coordinates (itself unit-free; all minimizers agree on the inputs
    ``certificate_.covers``), and ``predict`` evaluates the model there.
    Results that do not fit in float64 in the data's own units raise a
    ValueError.

    **Precision.** Float32 sequences stay float32 in memory (validation
    copies them as float32, and ``"cg"`` reads them in place); the features
    of each chunk and all statistics are computed in float64.  Forming them
    in float32 would perturb the Gram matrix by about ``eps32 * lambda_max``
    (1e-7 relative), far above the certificate's float32 threshold
    ``psi * eps32**2 * lambda_max`` and enough to lose every digit of
    coefficients whose Gram matrix has a condition number above 1e7.

    **Threads.** The work is BLAS-shaped (GEMMs over chunks of rows); control
    its threads with ``threadpoolctl.threadpool_limits``.  Results with 1 and
    2 threads agree to rounding.

    References
    ----------
    .. [1] M. Yau, E. Akyurek, J. Mao, J. B. Tenenbaum, S. Jegelka and
       J. Andreas, "Learning Linear Attention in Polynomial Time",
       arXiv:2410.10101.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 3)), rng.normal(size=(1, 3, 3))
    >>> X = rng.normal(size=(200, 5, 3))
    >>> y = np.einsum("aj,ntj,ntk,kl,nl->n", V[0], X, X, Q[0], X[:, -1])
    >>> model = LinearAttentionRegressor(n_heads=1).fit(X, y)
    >>> model.n_heads_
    1
    >>> LinearAttentionRegressor().fit(X, y).n_heads_  # the SVD's heads
    3
    >>> LinearAttentionRegressor(n_heads="auto").fit(X, y).n_heads_  # the fewest
    1
    >>> X_long = rng.normal(size=(3, 40, 3))  # longer than any training sequence
    >>> y_long = np.einsum("aj,ntj,ntk,kl,nl->n", V[0], X_long, X_long, Q[0], X_long[:, -1])
    >>> bool(np.allclose(model.predict(X_long), y_long))
    True
    """

    def __init__(
        self,
        readout="last",
        *,
        alpha=0.0,
        n_heads=None,
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
    ):
        self.readout = readout
        self.alpha = alpha
        self.n_heads = n_heads
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

    def _check_params(self):
        """The parameters of this fit, each checked once (:class:`~._params.FitParams`)."""
        return FitParams.checked(self, solvers=SOLVERS)

    def _decays(self):
        """The decays of the fitted model's feature blocks (None: one block, no decay)."""
        return check_decays(self.decay)

    def _fit_alpha(self):
        """The unit-free penalty of the fit (a search sets it from its candidates)."""
        return float(self.alpha)

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
        # Heads fitted to the rows directly need the rows (a compression without terms).
        direct = (not partial and source.sequential and p.n_heads is not None
                  and not terms.n_terms and p.decays is None)
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
                max_iter=p.max_iter, n_heads=p.n_heads, random_state=p.random_state,
                log=p.log, **p.layout)
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
        self.n_features_in_ = problem.d
        self.n_outputs_ = problem.d_out
        self._single_output = bool(single_output)
        return self

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

    def _fit_statistics(self, stats, *, single_output=False):
        """Finish a fit from sufficient statistics accumulated elsewhere (Dask, tests).

        The result is that of :meth:`fit` on all the sequences the statistics
        were accumulated from; a later :meth:`partial_fit` adds to ``stats``
        (in place).

        Parameters
        ----------
        stats : sklearn_linattn._solvers.SufficientStatistics
            With targets (``d_out`` set), the Gram matrix, the estimator's
            readout and at least one row of positive weight.
        single_output : bool, default=False
            Whether ``predict`` drops the output axis (targets were 1-D).

        Returns
        -------
        self : LinearAttentionRegressor
            The fitted estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> from sklearn_linattn._solvers import SufficientStatistics
        >>> X = np.random.default_rng(0).normal(size=(60, 4, 2))
        >>> Y = (X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1))[:, None]
        >>> blocks = [SufficientStatistics(2, 1).update(X[i::3], np.full(20, 4), Y[i::3])
        ...           for i in range(3)]
        >>> stats = blocks[0].merge(blocks[1]).merge(blocks[2])
        >>> model = LinearAttentionRegressor()._fit_statistics(stats, single_output=True)
        >>> bool(np.allclose(model.predict(X), Y[:, 0]))
        True
        """
        params = self._check_params()
        if not isinstance(stats, SufficientStatistics):
            raise TypeError(
                f"stats must be a SufficientStatistics; got {type(stats).__name__}."
            )
        if stats.d_out is None:
            raise ValueError("stats must hold targets (created with d_out set).")
        if stats.readout is not None and stats.readout != params.readout:
            raise ValueError(
                f"stats were accumulated with readout={stats.readout!r}, but this "
                f"estimator has readout={params.readout!r}."
            )
        if self.solver != "auto" and not REGISTRY[self.solver].statistics:
            raise ValueError(
                f"solver must be one of {('auto',) + STATISTICS_SOLVERS} to fit from "
                f"sufficient statistics; got solver={self.solver!r}."
            )
        if stats.n_rows == 0:
            raise ValueError(
                "every sequence has zero sample weight: there is nothing to fit."
            )
        terms = LinearTerms(stats.d, intercept=params.intercept, skip=params.skip)
        problem = StandardizedProblem.from_statistics(stats, d_out=stats.d_out - terms.n_terms,
                                                      terms=terms)
        solver = choose_solver(params.solver, stats.n_rows, stats.n_features, statistics=True)
        # Statistics from elsewhere keep their coordinates (a state without scales).
        return self._fit_problem(problem, params, solver, single_output,
                                 previous=FitState(stats, None, stats.standardizer.decays))

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
