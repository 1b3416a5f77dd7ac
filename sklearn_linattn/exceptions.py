"""Warnings of the package, to filter by category.

Like :mod:`sklearn.exceptions`: the classes live in one public module so that
``warnings.filterwarnings`` can name them.
"""

__all__ = ["GridEdgeWarning", "LayoutWarning"]


class GridEdgeWarning(UserWarning):
    """A cross-validated search chose a value at the edge of its grid.

    Issued by :meth:`LinearAttentionRegressorCV.fit
    <sklearn_linattn.LinearAttentionRegressorCV.fit>` when ``alpha_`` is the
    largest of ``alphas``, or the smallest of them above 0 when 0 is not
    among them: the best penalty may lie beyond the grid, and the search
    cannot tell.  Extending ``alphas`` past the edge settles it (the
    penalties are unit-free, so a grid means the same on any data).  A grid
    of one alpha, and ``alpha_ = 0`` (the exact least squares, the end of
    every grid), never warn.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionRegressorCV
    >>> from sklearn_linattn.exceptions import GridEdgeWarning
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(60, 4, 2)), rng.normal(size=60)  # nothing to learn
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     model = LinearAttentionRegressorCV(alphas=[1e-3, 1e-2, 1e-1]).fit(X, y)
    >>> model.alpha_, [w.category.__name__ for w in caught]
    (0.1, ['GridEdgeWarning'])
    """


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
