"""Warnings of the package, to filter by category.

Like :mod:`sklearn.exceptions`: the classes live in one public module so that
``warnings.filterwarnings`` can name them.
"""

__all__ = ["LayoutWarning"]


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
