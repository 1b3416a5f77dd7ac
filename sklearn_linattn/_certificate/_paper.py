"""The paper's own lambda_min: Lambda_D of the raw tokens' features, in the data's units."""

import numpy as np
import scipy.linalg

from .._features import n_attention_features, row_factors
from .._memory import sample_chunks, sample_values
from .._spectrum import eigenvalue_tolerance
from .._units import max_exponent, pow2_scale, unit_scaled
from .._validation import (
    check_data_format,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_token_dim,
)

__all__ = ["paper_min_eigenvalue"]


def _scaled_gram(X, lengths, weights, readout, row_exponent):
    """``Phi^T W Phi / sum(w)`` of the rows of X, their row tokens scaled by ``2**-row_exponent``.

    Weights are per sequence, repeated over its rows.
    """
    n_samples, n_tokens, d = X.shape
    psi = n_attention_features(d)
    gram = np.zeros((psi, psi))
    weight_sum = 0.0
    for chunk in sample_chunks(n_samples, sample_values(d, n_tokens, readout, psi)):
        S, x, sample = row_factors(X[chunk], lengths[chunk], readout)
        x = pow2_scale(x, -row_exponent)
        w = weights[chunk][sample]
        rows = (S[:, :, None] * x[:, None, :]).reshape(S.shape[0], psi)
        gram += rows.T @ (rows * w[:, None])
        weight_sum += float(w.sum())
    return gram / weight_sum


def paper_min_eigenvalue(X, *, readout="last", sample_weight=None, token_dim=None,
                         data_format="channels_last"):
    """Smallest eigenvalue of the paper's ``Lambda_D``, on the raw tokens, in the data's units.

    The x-axis of the paper's Fig. 2: ``lambda_min(Phi^T W Phi / sum(w))``
    with ``Phi`` the feature rows of the tokens as given (no standardization),
    so ``c * X`` multiplies it by ``c**6``.  For a verdict use
    :func:`certify_identifiability`; see the user guide's :ref:`certificate-paper`.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; trailing all-NaN tokens are padding.
    readout : {"last", "all"}, default="last"
        ``"last"``: one feature row per sequence.  ``"all"``: one row per real
        position (the features of the prefix ending there).
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence (of each of its rows); a weight
        of 0 drops it.
    token_dim : int or None, default=None
        Token dimension for 2-D X, as in :func:`certify_identifiability`.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X, as in :func:`certify_identifiability`.

    Returns
    -------
    min_eigenvalue : float
        ``lambda_min(Lambda_D)`` in the data's units; exactly 0.0 when it is at
        most the package's zero threshold ``lambda_max * psi * max(eps64, eps_in**2)``.

    Raises
    ------
    ValueError
        When every sequence has zero weight, or when the eigenvalue, positive,
        overflows or underflows float64 in the data's units.

    See Also
    --------
    certify_identifiability : The verdict, from the standardized ``Lambda_D``.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time",
       arXiv:2410.10101, Sec. 4.2 and Fig. 2.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import certify_identifiability, paper_min_eigenvalue
    >>> X = np.random.default_rng(0).normal(size=(200, 6, 3))
    >>> lam = paper_min_eigenvalue(X)
    >>> lam > 0, bool(certify_identifiability(X))
    (True, True)
    >>> paper_min_eigenvalue(X * 2.0) == lam * 2.0**6   # the data's units, exactly
    True
    >>> paper_min_eigenvalue(X[:17])                    # fewer sequences than psi = 18
    0.0
    """
    check_readout(readout)
    token_dim = check_token_dim(token_dim)
    data_format = check_data_format(data_format)
    X, lengths = check_sequences(X, token_dim=token_dim, data_format=data_format)
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    dtype = X.dtype if X.dtype.kind == "f" else np.dtype(np.float64)
    if sample_weight is None:
        sample_weight = np.ones(X.shape[0])
    keep = sample_weight > 0
    if not keep.any():
        raise ValueError(
            "sample_weight must be positive for at least one sequence; got all zeros: "
            "there is no feature row."
        )
    X, lengths = X[keep].astype(np.float64, copy=False), lengths[keep]
    # Weights by an exact power of two too: their sum cannot overflow, and
    # Phi^T W Phi / sum(w) does not change.
    w = sample_weight[keep]
    w, _ = unit_scaled(w)
    # Tokens below 1 in magnitude (k), and the row tokens as well (m): the
    # features then stay at most the number of tokens, far from overflow.
    X, k = unit_scaled(X)
    if readout == "last":
        m = int(max_exponent(X[np.arange(X.shape[0]), lengths - 1]))
    else:
        m = 0  # the row tokens are all the tokens, already below 1
    gram = _scaled_gram(X, lengths, w, readout, m)
    values = scipy.linalg.eigvalsh(gram)
    lam, lam_max = float(values[0]), float(values[-1])
    if lam <= eigenvalue_tolerance(lam_max, gram.shape[0], dtype):
        return 0.0
    exponent = 6 * k + 2 * m
    value = float(pow2_scale(lam, exponent))
    if np.isinf(value):
        raise ValueError(
            f"the smallest eigenvalue of the paper's Lambda_D of X, {lam!r} * 2**{exponent}, "
            "overflows float64 in the data's units (it scales as the sixth power of X); "
            "rescale X, or use certify_identifiability(X).min_eigenvalue, which is unit-free."
        )
    if value < np.finfo(np.float64).tiny:
        raise ValueError(
            f"the smallest eigenvalue of the paper's Lambda_D of X, {lam!r} * 2**{exponent}, "
            "underflows float64 in the data's units (it scales as the sixth power of X); "
            "rescale X, or use certify_identifiability(X).min_eigenvalue, which is unit-free."
        )
    return value
