"""Warnings of the package, to filter by category.

Like :mod:`sklearn.exceptions`: the classes live in one public module so that
``warnings.filterwarnings`` can name them.
"""

__all__ = ["LayoutWarning", "MappedStatisticsWarning"]


class LayoutWarning(UserWarning):
    """X looks like series stored with their time points along the last axis.

    Issued by ``fit`` and ``partial_fit`` of
    :class:`~sklearn_linattn.LinearAttentionRegressor`,
    :meth:`LinearAttentionFeatures.fit <sklearn_linattn.LinearAttentionFeatures.fit>`
    and :func:`~sklearn_linattn.certify_identifiability`, before any heavy work,
    when X in the default layout ``data_format="channels_last"``, read as
    (n_samples, n_tokens, d), has far more coordinates d than tokens: the
    shape of aeon's and sktime's series (n_samples, n_channels, n_timepoints)
    passed without ``data_format="channels_first"``.  Such an X is read as
    ``n_channels`` tokens of ``d = n_timepoints`` coordinates, a model of
    ``psi = d**2 (d + 1) / 2`` features, often a fit of minutes and gigabytes.

    It is issued when ``d >= 8 n_tokens``, or when ``d > 4 n_tokens`` and the
    fit is large by the package's own estimate (the dense least squares needs
    more than 1 GiB, or more than a minute at 10 GFLOP/s).  The message gives
    the shape as read, psi and the estimate.  Data whose layout is right (few
    tokens of many coordinates on purpose) can silence it, as below.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from sklearn_linattn import certify_identifiability
    >>> from sklearn_linattn.exceptions import LayoutWarning
    >>> X = np.random.default_rng(0).normal(size=(20, 2, 40))  # 2 tokens of d = 40?
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = certify_identifiability(X)
    >>> [w.category.__name__ for w in caught]
    ['LayoutWarning']
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error")
    ...     warnings.filterwarnings("ignore", category=LayoutWarning)
    ...     bool(certify_identifiability(X))
    False
    """


class MappedStatisticsWarning(UserWarning):
    """Sufficient statistics lost eigenvalues to the rounding of a map between coordinates.

    Statistics accumulated in one standardized coordinate system (those of
    the first batch of ``partial_fit``, or of the first chunk or block of a
    large fit) are mapped into the coordinates of all the data.  When the
    later data reach directions the first data hardly did, the map cancels
    large terms and its rounding can exceed eigenvalues of the Gram matrix
    that a fit of all the data at once tells apart from zero.  The package
    bounds that rounding (``map_rounding``), counts the eigenvalues below it
    as zero, and issues this warning when that lowered the rank:
    ``feature_rank_`` is then lower than ``fit`` on all the data would give,
    and the model is the minimum-norm fit of the part the mapped statistics
    still determine.  ``fit`` on all the data at once, or a first batch that
    covers every direction of the tokens, avoids it.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.exceptions import MappedStatisticsWarning
    >>> rng = np.random.default_rng(47)
    >>> scales = 10.0 ** rng.uniform(-3, 3, size=3)
    >>> X, y = rng.normal(size=(3, 1, 3)) * scales, rng.normal(size=3)
    >>> model = LinearAttentionRegressor().partial_fit(X[:1], y[:1])
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     model = model.partial_fit(X[1:], y[1:])
    >>> [w.category.__name__ for w in caught]
    ['MappedStatisticsWarning']
    >>> LinearAttentionRegressor().fit(X, y).feature_rank_ > model.feature_rank_
    True
    """
