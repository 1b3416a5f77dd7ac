"""The paper's own lambda_min: Lambda_D of the raw tokens' features, in the data's units."""

import numpy as np
import scipy.linalg

from .._features import n_attention_features, row_factors
from .._memory import sample_chunks, sample_values
from .._spectrum import eigenvalue_tolerance
from .._standardize import max_exponent
from .._validation import (
    check_data_format,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_token_dim,
)

__all__ = ["paper_min_eigenvalue"]


def _scaled_gram(X, lengths, weights, readout, row_exponent):
    """``Phi^T W Phi / sum(w)`` of the rows of X, their tokens scaled by ``2**-row_exponent``.

    X is already scaled by a power of two; the row tokens (the last factor of
    each feature) get their own exact power of two, so that the features of
    data whose last tokens are much smaller than the rest stay well inside
    float64.  Weights are per sequence, repeated over its rows.
    """
    n_samples, n_tokens, d = X.shape
    psi = n_attention_features(d)
    gram = np.zeros((psi, psi))
    weight_sum = 0.0
    for chunk in sample_chunks(n_samples, sample_values(d, n_tokens, readout, psi)):
        S, x, sample = row_factors(X[chunk], lengths[chunk], readout)
        x = np.ldexp(x, -row_exponent)
        w = weights[chunk][sample]
        rows = (S[:, :, None] * x[:, None, :]).reshape(S.shape[0], psi)
        gram += rows.T @ (rows * w[:, None])
        weight_sum += float(w.sum())
    return gram / weight_sum


def paper_min_eigenvalue(X, *, readout="last", sample_weight=None, token_dim=None,
                         data_format="channels_last"):
    """Smallest eigenvalue of the paper's ``Lambda_D``, on the raw tokens, in the data's units.

    The x-axis of the paper's Fig. 2: ``lambda_min((1/N) Phi^T Phi)`` with
    ``Phi`` the N feature rows of the tokens as given (the paper's
    Algorithm 2, no standardization).  It depends on the units of X (``c *
    X`` multiplies it by ``c**6``); for a verdict, and to compare data sets
    in different units, use :func:`certify_identifiability`, whose
    ``min_eigenvalue`` is that of the standardized ``Lambda_D``.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; trailing all-NaN tokens are padding.
    readout : {"last", "all"}, default="last"
        ``"last"``: one feature row per sequence.  ``"all"``: one row per real
        position (the features of the prefix ending there), as the
        certificate and ``LinearAttentionRegressor(readout="all")`` use.
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence (of each of its rows):
        ``Lambda_D = Phi^T W Phi / sum(w)`` over the rows, so a weight of 2
        counts a sequence twice and a weight of 0 drops it.
    token_dim : int or None, default=None
        Token dimension for 2-D X, as in :func:`certify_identifiability`.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X, as in :func:`certify_identifiability`.

    Returns
    -------
    min_eigenvalue : float
        ``lambda_min(Lambda_D)`` in the data's units; exactly 0.0 when it is
        zero within the rounding of the eigen-decomposition (at most
        ``lambda_max * psi * max(eps64, eps_in**2)``, the package's zero rule,
        ``eps_in`` the machine epsilon of X's dtype).

    Raises
    ------
    ValueError
        When every sequence has zero weight, or when the eigenvalue, positive,
        is outside what float64 holds in the data's units (it scales as the
        sixth power of the data: tokens of size ``1e60`` make it about
        ``1e360``): then no float64 is the answer, and the error says which way
        it leaves the range.

    See Also
    --------
    certify_identifiability : The verdict, from the standardized ``Lambda_D``.

    Notes
    -----
    The features are computed from the tokens scaled by an exact power of two
    (``2**-k``, with the row tokens scaled once more by ``2**-m``), and the
    eigenvalue is scaled back by ``2**(6k + 2m)``: exactly what the features
    of the raw tokens give, without their Gram matrix overflowing or
    underflowing on the way.  ``X * 2**j`` gives exactly ``2**(6j)`` times
    the value for X.

    The paper's ``Lambda_D`` and the standardized one have the same rank, so
    they agree on whether ``lambda_min`` is positive in exact arithmetic; in
    floating point, data whose coordinates differ by many orders of
    magnitude can have a paper's ``Lambda_D`` that is singular to rounding
    (0.0 here) while the standardized one, which rescales each coordinate,
    is not.  For tokens of identity second moment the standardized
    ``lambda_min`` lies between this value and twice it.

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
    w = np.ldexp(w, -int(max_exponent(w)))
    # Tokens below 1 in magnitude (k), and the row tokens as well (m): the
    # features then stay at most the number of tokens, far from overflow.
    k = int(max_exponent(X))
    X = np.ldexp(X, -k)
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
    with np.errstate(over="ignore", under="ignore"):
        value = float(np.ldexp(lam, exponent))
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
