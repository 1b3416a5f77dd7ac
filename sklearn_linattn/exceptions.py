"""Warnings of the package, to filter by category with ``warnings.filterwarnings``."""

__all__ = ["GridEdgeWarning", "LayoutWarning"]


class GridEdgeWarning(UserWarning):
    """A cross-validated search chose a value at the edge of its grid.

    Issued by :meth:`LinearAttentionRegressorCV.fit
    <sklearn_linattn.LinearAttentionRegressorCV.fit>` when ``alpha_`` is the
    largest of ``alphas``, or the smallest above 0 when 0 is not among them:
    the best penalty may lie beyond the grid.  A grid of one alpha, and
    ``alpha_ = 0``, never warn.

    Examples
    --------
    >>> import warnings
    >>> import numpy as np
    >>> from sklearn_linattn import LinearAttentionRegressorCV
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

    Issued by the estimators' ``fit`` and ``partial_fit`` and by
    :func:`~sklearn_linattn.certify_identifiability`, before any heavy work,
    when X in the default layout has far more coordinates than tokens (the
    rule: the user guide's conventions page), the shape of aeon's and sktime's
    series passed without ``data_format="channels_first"``.

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
    >>> with warnings.catch_warnings():  # when the layout is right
    ...     warnings.filterwarnings("ignore", category=LayoutWarning)
    ...     _ = certify_identifiability(X)
    """
