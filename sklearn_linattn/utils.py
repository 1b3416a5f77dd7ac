"""Helpers for testing the package's estimators with scikit-learn's own tools."""

from ._adam import AdamLinearAttentionRegressor
from ._estimators import LinearAttentionRegressor
from ._sequence import SequenceRegressor
from ._transformer import LinearAttentionFeatures
from .preprocessing import AppendConstant, Patches, PositionalEncoding

__all__ = ["expected_failed_checks"]

# scikit-learn's checks feed 2-D X of shape (n_samples, n_columns) and expect
# n_features_in_ == n_columns, and an error when a later call has another
# number of columns.  The package reads 2-D X as univariate sequences (d = 1,
# tslearn's convention): the columns are tokens, so n_features_in_ is 1 and
# another number of columns is a sequence of another length, which is valid.
_SEQUENCES = (
    "2-D X holds univariate sequences (d = 1, one token per column): n_features_in_ is "
    "the token dimension d = 1, not the number of columns, and X with another number of "
    "columns holds sequences of another length, which is valid input"
)
_COLUMNS_ARE_TOKENS = {
    "check_n_features_in": (
        f"{_SEQUENCES}; the check expects n_features_in_ == n_columns (2)"
    ),
    "check_n_features_in_after_fitting": (
        f"{_SEQUENCES}. The check's message says that fit() does not set n_features_in_; "
        "it does (to d = 1), and the assertion that fails is n_features_in_ == n_columns "
        "(4), then that predict or transform refuses X[:, [1]] (sequences of one token)"
    ),
}
_TRANSFORMER = {
    "check_transformer_general": (
        f"{_SEQUENCES}; the check expects transform to refuse X with fewer columns than "
        "in fit"
    ),
}
_PARTIAL_FIT = {
    "check_estimators_partial_fit_n_features": (
        f"{_SEQUENCES}; the check expects partial_fit to refuse a batch with another "
        "number of columns"
    ),
}
_ESTIMATORS = (LinearAttentionRegressor, LinearAttentionFeatures, AdamLinearAttentionRegressor,
               SequenceRegressor, PositionalEncoding, Patches, AppendConstant)


def expected_failed_checks(estimator):
    """The scikit-learn estimator checks an estimator of this package is expected to fail.

    Exactly the checks that read a 2-D X as a table of features, which here
    holds univariate sequences (the user guide's FAQ on ``check_estimator``).

    Parameters
    ----------
    estimator : LinearAttentionRegressor, LinearAttentionFeatures, \
AdamLinearAttentionRegressor, SequenceRegressor, PositionalEncoding, Patches or AppendConstant
        An instance (subclasses included), with any parameters.

    Returns
    -------
    checks : dict of str to str
        Check name to the reason it fails, the ``expected_failed_checks`` of
        :func:`~sklearn.utils.estimator_checks.check_estimator`.

    Raises
    ------
    TypeError
        For an estimator that is not one of the package's.

    Examples
    --------
    >>> from sklearn.utils.estimator_checks import check_estimator
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.utils import expected_failed_checks
    >>> model = LinearAttentionRegressor()
    >>> sorted(expected_failed_checks(model))
    ['check_estimators_partial_fit_n_features', 'check_n_features_in',
     'check_n_features_in_after_fitting']
    >>> results = check_estimator(model, expected_failed_checks=expected_failed_checks(model),
    ...                           on_skip=None)
    >>> sorted({r["status"] for r in results} - {"skipped"})
    ['passed', 'xfail']
    """
    if not isinstance(estimator, _ESTIMATORS):
        names = ", ".join(cls.__name__ for cls in _ESTIMATORS)
        raise TypeError(
            f"estimator must be an instance of one of the package's estimators ({names}); "
            f"got {estimator!r} of type {type(estimator).__name__}."
        )
    checks = dict(_COLUMNS_ARE_TOKENS)
    if hasattr(estimator, "transform"):
        checks.update(_TRANSFORMER)
    if hasattr(estimator, "partial_fit"):
        checks.update(_PARTIAL_FIT)
    return checks
