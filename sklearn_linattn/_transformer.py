"""The cubic feature map as a scikit-learn transformer."""

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from ._namespace import fits_in_namespace, returns_in_namespace
from ._base import sequence_tags
from ._features import attention_features, feature_names, n_attention_features, row_factors
from ._memory import real_tokens
from ._terms import LinearTerms
from ._source import check_layout
from ._params import check_decays
from ._validation import check_data_format, check_readout, check_sequences

__all__ = ["LinearAttentionFeatures"]


class LinearAttentionFeatures(TransformerMixin, BaseEstimator):
    """Cubic features of multi-head linear attention (the paper's Algorithm 2).

    Maps each sequence to the psi = d**2 (d + 1) / 2 features
    ``S[j, k] * x_last[l]`` (j <= k) with ``S = sum_t x_t x_t^T``.  Every
    one-layer multi-head linear attention is a linear function of them, so any
    linear model on them is a linear-attention model.  See the user guide's
    :ref:`features-pipeline` section.

    Parameters
    ----------
    token_dim : int or None, default=None
        Token dimension for 2-D input: each row of a 2-D X is read as
        ``n_columns // token_dim`` tokens.  None reads 2-D X as univariate
        sequences (d = 1).
    readout : {"last", "all"}, default="last"
        ``"last"``: one row per sequence.  ``"all"``: one row per real
        position, the features of the prefix ending there, in the order of
        ``X[real]`` for ``real = ~np.isnan(X).all(axis=2)``.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: (n_samples, n_tokens, d), or (n_samples, d, n_tokens), the
        "numpy3D" layout of aeon and sktime.
    include_bias : bool, default=False
        Prepend a constant column ``1`` (the intercept of
        ``LinearAttentionRegressor(fit_intercept=True)``).
    include_skip : bool, default=False
        Prepend the last token's d coordinates (after the constant): the skip
        term of ``LinearAttentionRegressor(fit_skip=True)``.
    decay : None, float or array-like of float, default=None
        Fixed decays in (0, 1], as ``LinearAttentionRegressor(decay=...)``:
        one block of psi features per decay, side by side in the order given.

    Attributes
    ----------
    n_features_in_ : int
        Token dimension d seen in ``fit``.
    n_features_out_ : int
        Number of features: psi (times the number of decays), plus 1 with
        ``include_bias`` and d with ``include_skip``.

    See Also
    --------
    LinearAttentionRegressor : Least squares on these features, returned as
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

    def __init__(self, token_dim=None, *, readout="last", data_format="channels_last",
                 include_bias=False, include_skip=False, decay=None):
        self.token_dim = token_dim
        self.decay = decay
        self.readout = readout
        self.data_format = data_format
        self.include_bias = include_bias
        self.include_skip = include_skip

    def _terms(self, d):
        return LinearTerms.checked(d, self.include_bias, self.include_skip,
                                   ("include_bias", "include_skip"))

    def _decays(self):
        """The decays ``fit`` used: ``n_features_out_`` and the names are theirs."""
        decays = check_decays(self.decay)
        fitted = getattr(self, "_fitted_decays", decays)
        if decays != fitted:
            raise ValueError(
                f"decay={self.decay!r} was set after fit, which gave n_features_out_="
                f"{self.n_features_out_} for decay={fitted!r}; call fit again.")
        return decays

    def _layout(self):
        return {"token_dim": self.token_dim, "data_format": check_data_format(self.data_format)}

    @fits_in_namespace
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
            The fitted transformer.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionFeatures
        >>> feats = LinearAttentionFeatures().fit(np.zeros((5, 4, 3)))
        >>> feats.n_features_in_, feats.n_features_out_  # d and d**2 (d + 1) / 2
        (3, 18)
        """
        check_readout(self.readout)
        decays = check_decays(self.decay)
        given = X  # the very object a transformer of the package may have marked
        X, lengths = check_sequences(X, **self._layout())
        # transform's output is the n_rows x psi feature matrix.
        n_rows = X.shape[0] if self.readout == "last" else int(lengths.sum())
        check_layout(X.shape, readout=self.readout, n_rows=n_rows, solve=False, X=given,
                     **self._layout())
        self.n_features_in_ = X.shape[2]
        self._fitted_decays = decays
        self.n_features_out_ = ((1 if decays is None else len(decays))
                                * n_attention_features(X.shape[2])
                                + self._terms(X.shape[2]).n_terms)
        return self

    @returns_in_namespace
    def transform(self, X):
        """Cubic attention features of each sequence.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length with the token dimension seen in ``fit``;
            trailing all-NaN tokens are padding.

        Returns
        -------
        H : ndarray of shape (n_rows, n_output_features), float64
            ``n_features_out_`` columns, in the order of
            :meth:`get_feature_names_out`.  One row per sequence for
            ``readout="last"``; one per real position, in the order of
            ``X[real]``, for ``readout="all"``.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionFeatures
        >>> X = [np.ones((3, 2)), np.ones((5, 2))]  # two sequences, 3 and 5 tokens
        >>> LinearAttentionFeatures().fit(X).transform(X)
        array([[3., 3., 3., 3., 3., 3.],
               [5., 5., 5., 5., 5., 5.]])
        >>> LinearAttentionFeatures(readout="all").fit(X).transform(X)[:4, 0]
        array([1., 2., 3., 1.])
        """
        check_is_fitted(self)
        check_readout(self.readout)
        X, lengths = check_sequences(X, n_features_in=self.n_features_in_, **self._layout())
        X = np.asarray(X, dtype=np.float64)
        terms = self._terms(X.shape[2])
        decays = self._decays()
        if self.readout == "last":
            H = attention_features(X, lengths, decays)
            return np.hstack([terms.columns(X, lengths, "last"), H]) if terms else H
        # The regressor's rows: real positions only, in sample-major order.
        S, x, _ = row_factors(X, lengths, "all", decays)
        H = (S[:, :, None] * x[:, None, :]).reshape(S.shape[0], -1)
        if not terms:
            return H
        columns = terms.columns(X, lengths, "all")[real_tokens(lengths, X.shape[1])]
        return np.hstack([columns, H])

    def get_feature_names_out(self, input_features=None):
        """Names ``S[xj,xk]*last[xl]`` of the output features.

        Parameters
        ----------
        input_features : array-like of str or None
            Names of the d token coordinates; default ``x0, ..., x{d-1}``.

        Returns
        -------
        names : ndarray of str objects, shape (n_output_features,)
            One name per column of :meth:`transform`: ``"1"`` and ``"last[x]"``
            for the term columns, then the cubic features.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionFeatures
        >>> feats = LinearAttentionFeatures().fit(np.zeros((1, 3, 2)))
        >>> feats.get_feature_names_out(["price", "volume"])[:2].tolist()
        ['S[price,price]*last[price]', 'S[price,price]*last[volume]']
        """
        check_is_fitted(self)
        if input_features is not None and len(input_features) != self.n_features_in_:
            raise ValueError(
                f"input_features must name the {self.n_features_in_} token coordinates; "
                f"got {len(input_features)} names."
            )
        names = feature_names(self.n_features_in_, input_features, self._decays())
        terms = self._terms(self.n_features_in_)
        if not terms:
            return names
        coords = (list(input_features) if input_features is not None
                  else [f"x{j}" for j in range(self.n_features_in_)])
        return np.concatenate([np.asarray(terms.names(coords), dtype=object), names])

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        tags.requires_fit = True
        tags.array_api_support = True
        return tags
