"""scikit-learn estimators: thin layers of validation over the math modules."""

import numbers
import time

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin
from sklearn.metrics import r2_score
from sklearn.utils.validation import check_is_fitted

from ._certificate import IdentifiabilityCertificate
from ._features import attention_features, feature_names, n_attention_features
from ._mhla import compress_heads, heads_from_coefficients, mhla_forward
from ._solvers import SOLVERS, solve
from ._validation import (
    check_readout,
    check_sequences,
    check_targets,
    check_token_dim,
)

__all__ = [
    "AttentionHeadsRegressorMixin",
    "LinearAttentionFeatures",
    "LinearAttentionRegressor",
]


def _sequence_tags(tags):
    tags.input_tags.three_d_array = True
    # NaN only marks padding at the end of a sequence; it never stands for a
    # missing value, so allow_nan stays False.
    return tags


class LinearAttentionFeatures(TransformerMixin, BaseEstimator):
    """Cubic features of multi-head linear attention (the paper's Algorithm 2).

    Maps each sequence to the psi = d**2 (d + 1) / 2 features
    ``S[j, k] * x_last[l]`` (j <= k) with ``S = sum_t x_t x_t^T``: every
    one-layer multi-head linear attention, with any number of heads, is a
    linear function of them.  Any linear model on these features is a
    linear-attention model.

    Parameters
    ----------
    token_dim : int or None, default=None
        Token dimension for 2-D input: each row of a 2-D X is read as
        ``n_columns // token_dim`` tokens.  None reads 2-D X as univariate
        sequences (d = 1).

    Attributes
    ----------
    n_features_in_ : int
        Token dimension d seen in ``fit``.
    n_features_out_ : int
        Number of features psi.

    See Also
    --------
    LinearAttentionRegressor : least squares on these features, returned as
        attention heads.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionFeatures
    >>> X = np.random.default_rng(0).normal(size=(5, 4, 2))
    >>> feats = LinearAttentionFeatures().fit(X)
    >>> feats.transform(X).shape
    (5, 6)
    >>> list(feats.get_feature_names_out()[:2])
    ['S[x0,x0]*last[x0]', 'S[x0,x0]*last[x1]']
    """

    def __init__(self, token_dim=None):
        self.token_dim = token_dim

    def fit(self, X, y=None):
        """Record the token dimension of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences; trailing all-NaN tokens are padding.
        y : None
            Ignored.

        Returns
        -------
        self : LinearAttentionFeatures
        """
        X, _ = check_sequences(X, token_dim=self.token_dim)
        self.n_features_in_ = X.shape[2]
        self.n_features_out_ = n_attention_features(X.shape[2])
        return self

    def transform(self, X):
        """Cubic attention features of each sequence.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays

        Returns
        -------
        H : ndarray of shape (n_samples, psi), float64
        """
        check_is_fitted(self)
        X, lengths = check_sequences(
            X, token_dim=self.token_dim, n_features=self.n_features_in_
        )
        return attention_features(np.asarray(X, dtype=np.float64), lengths)

    def get_feature_names_out(self, input_features=None):
        """Names ``S[xj,xk]*last[xl]`` of the output features.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the d token coordinates; default ``x0, ..., x{d-1}``.

        Returns
        -------
        names : ndarray of str objects, shape (psi,)
        """
        check_is_fitted(self)
        if input_features is not None and len(input_features) != self.n_features_in_:
            raise ValueError(
                f"input_features must name the {self.n_features_in_} token coordinates; "
                f"got {len(input_features)} names."
            )
        return feature_names(self.n_features_in_, input_features)

    def __sklearn_tags__(self):
        tags = _sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        return tags


class AttentionHeadsRegressorMixin(RegressorMixin):
    """Prediction and scoring for regressors whose fitted model is a set of heads.

    Subclasses set ``value_matrices_``, ``key_query_matrices_``,
    ``n_features_in_`` and ``_single_output`` in ``fit`` and have ``readout``
    and ``token_dim`` parameters.
    """

    def _validate_X(self, X):
        check_is_fitted(self)
        return check_sequences(X, token_dim=self.token_dim, n_features=self.n_features_in_)

    def _shape_output(self, Y):
        return Y[..., 0] if self._single_output else Y

    def predict(self, X):
        """Run the fitted attention heads on X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length, including lengths never seen in ``fit``.

        Returns
        -------
        y : ndarray
            ``readout="last"``: shape (n_samples,) or (n_samples, d_out).
            ``readout="all"``: shape (n_samples, n_tokens[, d_out]), NaN at
            padded positions.
        """
        X, lengths = self._validate_X(X)
        Y = mhla_forward(
            X, self.value_matrices_, self.key_query_matrices_, lengths, readout=self.readout
        )
        return self._shape_output(Y)

    def score(self, X, y, sample_weight=None):
        """Coefficient of determination R^2 over every non-padded output.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        y : array-like, shaped as in :meth:`fit`
        sample_weight : array-like of shape (n_samples,) or None
            Weight of each sequence (applied to each of its positions for
            ``readout="all"``).

        Returns
        -------
        score : float
            R^2 averaged uniformly over outputs.
        """
        Xv, lengths = self._validate_X(X)
        Y, _ = check_targets(y, lengths, Xv.shape[1], readout=self.readout)
        pred = mhla_forward(
            Xv, self.value_matrices_, self.key_query_matrices_, lengths, readout=self.readout
        )
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if w is not None and w.shape != (Xv.shape[0],):
            raise ValueError(
                f"sample_weight must have shape ({Xv.shape[0]},); got {w.shape}."
            )
        if self.readout == "all":
            real = np.arange(Xv.shape[1])[None, :] < lengths[:, None]
            Y, pred = Y[real], pred[real]
            if w is not None:
                w = np.broadcast_to(w[:, None], real.shape)[real]
        return float(r2_score(Y, pred, sample_weight=w))

    def __sklearn_tags__(self):
        tags = _sequence_tags(super().__sklearn_tags__())
        # Tabular data is read as univariate sequences (d = 1): a cubic model
        # of them cannot fit arbitrary regression data well.
        tags.regressor_tags.poor_score = True
        tags.target_tags.multi_output = True
        return tags


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
        Ridge penalty on the coefficients.  0 gives the exact empirical risk
        minimizer, the minimum-norm one when the features are rank-deficient.
    n_heads : int or None, default=None
        None returns every head of the SVD.  An integer k compresses to at
        most k heads by alternating least squares started from the truncated
        SVD; a :class:`~sklearn.exceptions.ConvergenceWarning` says when k heads
        cannot reproduce the unconstrained optimum.
    solver : {"auto", "eigh", "svd"}, default="auto"
        ``"eigh"``: normal equations through an eigen-decomposition of
        ``Phi^T Phi``, accumulated over chunks (memory O(psi^2)).  ``"svd"``:
        SVD of the design matrix (more accurate, memory O(n_rows psi)).
        ``"auto"`` uses ``"svd"`` when there are fewer feature rows than
        features (and the design holds at most 2**24 values), ``"eigh"``
        otherwise.
    token_dim : int or None, default=None
        Token dimension for 2-D X (see :class:`LinearAttentionFeatures`).
    random_state : int, RandomState instance or None, default=None
        Seeds the random restarts of the head compression.
    verbose : int, default=0
        Print the time spent in each stage when positive.

    Attributes
    ----------
    coef_ : ndarray of shape (d_out, psi)
        Folded coefficients p of the fitted model: ``y = H(X) @ coef_.T``.
    value_matrices_ : ndarray of shape (H, d_out, d)
        Value matrices V_h, one per returned head (H = ``n_heads_``).
    key_query_matrices_ : ndarray of shape (H, d, d)
        Fused key-query matrices Q_h.
    n_heads_ : int
        Number of heads returned.
    compression_residual_ : float or None
        Relative coefficient residual of the head compression (None when
        ``n_heads`` did not call for compression).
    n_features_in_ : int
        Token dimension d.
    n_outputs_ : int
        Output dimension d_out.
    feature_rank_ : int
        Numerical rank of the feature Gram matrix (psi when the training data
        identifies the function).
    certificate_ : IdentifiabilityCertificate
        Whether the training inputs identify the function (truthy iff every
        empirical risk minimizer computes the same function on every input),
        computed from the fit's own eigen-decomposition: equal to
        ``certify_identifiability(X, readout=readout, token_dim=token_dim)``.
        With ``readout="all"`` it is about the prefix rows fitted.  Its
        ``witness()`` starts from this fitted model.

    See Also
    --------
    LinearAttentionFeatures : the feature map on its own.

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
    >>> X_long = rng.normal(size=(3, 40, 3))  # longer than any training sequence
    >>> y_long = np.einsum("aj,ntj,ntk,kl,nl->n", V[0], X_long, X_long, Q[0], X_long[:, -1])
    >>> bool(np.allclose(model.predict(X_long), y_long))
    True
    """

    def __init__(
        self,
        readout="last",
        alpha=0.0,
        n_heads=None,
        solver="auto",
        token_dim=None,
        random_state=None,
        verbose=0,
    ):
        self.readout = readout
        self.alpha = alpha
        self.n_heads = n_heads
        self.solver = solver
        self.token_dim = token_dim
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self):
        check_readout(self.readout)
        check_token_dim(self.token_dim)
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real):
            raise TypeError(
                f"alpha must be a non-negative real number; got {self.alpha!r}."
            )
        if not np.isfinite(self.alpha) or self.alpha < 0:
            raise ValueError(
                f"alpha must be a finite non-negative number; got {self.alpha!r}."
            )
        if self.n_heads is not None:
            if isinstance(self.n_heads, bool) or not isinstance(
                self.n_heads, numbers.Integral
            ):
                raise TypeError(
                    f"n_heads must be None or a positive integer; got {self.n_heads!r}."
                )
            if self.n_heads < 1:
                raise ValueError(
                    f"n_heads must be None or a positive integer; got {self.n_heads}."
                )
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}; got {self.solver!r}.")

    def _log(self, message, start):
        if self.verbose:
            print(f"[LinearAttentionRegressor] {message} ({time.perf_counter() - start:.3f} s)")

    def fit(self, X, y):
        """Fit the global least-squares optimum and convert it into heads.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Training sequences; trailing all-NaN tokens are padding.
        y : array-like
            ``readout="last"``: shape (n_samples,) or (n_samples, d_out).
            ``readout="all"``: shape (n_samples, n_tokens) or
            (n_samples, n_tokens, d_out), NaN at padded positions.

        Returns
        -------
        self : LinearAttentionRegressor
        """
        self._check_params()
        start = time.perf_counter()
        X, lengths = check_sequences(X, token_dim=self.token_dim)
        Y, single = check_targets(y, lengths, X.shape[1], readout=self.readout)
        d = X.shape[2]
        solution, stats = solve(
            X, lengths, Y, readout=self.readout, alpha=float(self.alpha), solver=self.solver
        )
        self._log(f"least squares on {n_attention_features(d)} features", start)
        self.coef_ = solution.coef
        self.feature_rank_ = solution.rank
        # Same spectrum, same tolerance: no second pass over the data.
        self.certificate_ = IdentifiabilityCertificate._from_solution(
            solution, stats, readout=self.readout, token_dim=self.token_dim,
            n_tokens=X.shape[1], coef=solution.coef,
        )
        V, Q = heads_from_coefficients(self.coef_, d)
        self._log(f"{V.shape[0]} heads from the SVD", start)
        self.compression_residual_ = None
        if self.n_heads is not None and V.shape[0] > self.n_heads:
            V, Q, self.compression_residual_ = compress_heads(
                self.coef_, d, self.n_heads, random_state=self.random_state
            )
            self._log(
                f"compressed to {self.n_heads} heads, relative coefficient residual "
                f"{self.compression_residual_:.2e}",
                start,
            )
        self.value_matrices_ = V
        self.key_query_matrices_ = Q
        self.n_heads_ = V.shape[0]
        self.n_features_in_ = d
        self.n_outputs_ = Y.shape[-1]
        self._single_output = single
        return self

    def predict_from_coefficients(self, X):
        """Predict with ``coef_`` on the cubic features instead of the heads.

        Equal to :meth:`predict` to rounding when ``n_heads`` is None; after a
        compression the difference is the compression residual.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays

        Returns
        -------
        y : ndarray, shaped as for :meth:`predict`
        """
        from ._features import prefix_features

        X, lengths = self._validate_X(X)
        X = np.asarray(X, dtype=np.float64)
        if self.readout == "last":
            Y = attention_features(X, lengths) @ self.coef_.T
        else:
            Y = prefix_features(X, lengths) @ self.coef_.T
            Y[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = np.nan
        return self._shape_output(Y)

