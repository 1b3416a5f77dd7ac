"""The cubic feature map H of multi-head linear attention, and its kernel.

Feature order (one place: :func:`pair_indices` and :func:`attention_features`):
column ``p * d + l`` holds ``S[j_p, k_p] * x_last[l]`` where ``(j_p, k_p)`` is
the p-th pair of ``np.triu_indices(d)`` (row-major upper triangle, j <= k) and
``S = sum_t x_t x_t^T``.  This is the paper's Algorithm 2 with no rescaling of
the off-diagonal pairs, so eigenvalues can be compared with the paper's.

All functions take zero-filled padded arrays and lengths as returned by
:func:`sklearn_linattn._validation.check_sequences`: zero tokens contribute
nothing to ``S``.
"""

import numpy as np

__all__ = [
    "attention_features",
    "attention_kernel",
    "feature_names",
    "padded_kernel",
    "n_attention_features",
    "pair_indices",
    "prefix_features",
]


# Transient arrays of one chunk of samples hold at most this many float64
# values (2**22 values, 32 MiB).
_CHUNK_VALUES = 2**22


def iter_sample_chunks(n_samples, values_per_sample, budget=_CHUNK_VALUES):
    """Slices of consecutive samples whose work arrays fit the memory budget.

    Parameters
    ----------
    n_samples : int
    values_per_sample : int
        Number of float64 values one sample needs in the largest work array.
    budget : int
        Number of values a chunk may use.

    Yields
    ------
    slice
    """
    step = max(1, budget // max(1, int(values_per_sample)))
    for start in range(0, n_samples, step):
        yield slice(start, min(start + step, n_samples))


def pair_indices(d):
    """The folding rule: index pairs (j, k), j <= k, in feature order.

    Parameters
    ----------
    d : int
        Token dimension.

    Returns
    -------
    j, k : ndarray of shape (d * (d + 1) // 2,)
        Row and column of each folded pair of the symmetric matrix S.

    Examples
    --------
    >>> from sklearn_linattn._features import pair_indices
    >>> pair_indices(2)
    (array([0, 0, 1]), array([0, 1, 1]))
    """
    return np.triu_indices(d)


def n_attention_features(d):
    """Number of folded cubic features, psi = d**2 * (d + 1) / 2."""
    return d * d * (d + 1) // 2


def folded_second_moments(X):
    """Folded S = sum_t x_t x_t^T per sequence, shape (n_samples, d(d+1)/2)."""
    j, k = pair_indices(X.shape[2])
    # One batched GEMM for the d x d moments, then a gather of the triangle.
    S = np.matmul(X.transpose(0, 2, 1), X)
    return S[:, j, k]


def last_tokens(X, lengths):
    """The last real token of each sequence, shape (n_samples, d)."""
    return X[np.arange(X.shape[0]), lengths - 1]


def _outer_features(S_folded, x):
    """Row-wise Kronecker product (..., P) x (..., d) -> (..., P * d)."""
    out = S_folded[..., :, None] * x[..., None, :]
    return out.reshape(*out.shape[:-2], -1)


def attention_features(X, lengths):
    """The feature map H: one row of psi cubic features per sequence.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)
        Number of real tokens per sequence.

    Returns
    -------
    H : ndarray of shape (n_samples, psi)
        ``H[i, p * d + l] = S_i[j_p, k_p] * X[i, lengths[i] - 1, l]``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features
    >>> X = np.array([[[1.0, 2.0], [3.0, 0.5]]])
    >>> attention_features(X, np.array([2]))
    array([[30.   ,  5.   , 10.5  ,  1.75 , 12.75 ,  2.125]])
    """
    return _outer_features(folded_second_moments(X), last_tokens(X, lengths))


def prefix_features(X, lengths):
    """Features of every prefix, for the causal readout ``"all"``.

    Uses a cumulative sum of the folded outer products, so the n prefixes are
    never materialised as sequences.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)

    Returns
    -------
    H : ndarray of shape (n_samples, n_tokens, psi)
        ``H[i, t]`` is the feature vector of the prefix ``X[i, :t + 1]``; rows at
        padded positions are zero.
    """
    j, k = pair_indices(X.shape[2])
    S = np.cumsum(X[:, :, j] * X[:, :, k], axis=1)
    H = _outer_features(S, X)
    H[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = 0.0
    return H


def padded_kernel(X, lengths_X, Y, lengths_Y):
    """Gram matrix <H(X_i), H(Y_j)> of zero-padded arrays, without features.

    ``<H(Z), H(Z')> = sum_{j <= k} S_jk S'_jk * <x_last, x'_last>``, which costs
    O(d^2) per pair instead of O(d^3).

    Returns
    -------
    K : ndarray of shape (n_samples_X, n_samples_Y)
    """
    SX = folded_second_moments(X)
    SY = SX if Y is X else folded_second_moments(Y)
    return (SX @ SY.T) * (last_tokens(X, lengths_X) @ last_tokens(Y, lengths_Y).T)


def attention_kernel(X, Y=None, *, token_dim=None):
    """The linear-attention kernel: inner products of the cubic features.

    ``K[i, j] = <H(X_i), H(Y_j)> = sum_{j <= k} S_jk S'_jk <x_last, x'_last>``
    with ``S = sum_t x_t x_t^T``.  It costs O(d^2) per pair instead of the
    O(d^3) of forming the features, and any scikit-learn kernel method can
    use it with ``kernel="precomputed"`` (kernel ridge regression on it is
    the dual form of :class:`LinearAttentionRegressor`).

    Parameters
    ----------
    X : array-like of shape (n_samples_X, n_tokens, d) or list of (n_tokens_i, d) arrays
        Sequences; trailing all-NaN tokens are padding.
    Y : array-like of shape (n_samples_Y, n_tokens_Y, d), list, or None
        Second set of sequences; None means ``X``.
    token_dim : int or None, default=None
        Token dimension for 2-D input.

    Returns
    -------
    K : ndarray of shape (n_samples_X, n_samples_Y), float64

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.kernel_ridge import KernelRidge
    >>> from sklearn_linattn import attention_kernel
    >>> rng = np.random.default_rng(0)
    >>> X, X_new = rng.normal(size=(30, 5, 2)), rng.normal(size=(4, 9, 2))
    >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)  # a linear-attention output
    >>> model = KernelRidge(alpha=1e-10, kernel="precomputed").fit(attention_kernel(X), y)
    >>> pred = model.predict(attention_kernel(X_new, X))
    >>> bool(np.allclose(pred, X_new[:, -1, 0] * (X_new[:, :, 1] ** 2).sum(axis=1)))
    True
    """
    from ._validation import check_sequences

    X, lengths_X = check_sequences(X, token_dim=token_dim)
    X = np.asarray(X, dtype=np.float64)
    if Y is None:
        return padded_kernel(X, lengths_X, X, lengths_X)
    Y, lengths_Y = check_sequences(Y, token_dim=token_dim, n_features=X.shape[2], name="Y")
    return padded_kernel(X, lengths_X, np.asarray(Y, dtype=np.float64), lengths_Y)


def feature_names(d, input_features=None):
    """Readable names of the psi features, in feature order.

    ``"S[x0,x1]*last[x2]"`` is the column holding ``S[0, 1] * x_last[2]``.

    Parameters
    ----------
    d : int
        Token dimension.
    input_features : sequence of str or None
        Names of the d token coordinates; default ``x0, ..., x{d-1}``.

    Returns
    -------
    names : ndarray of str, shape (psi,)

    Examples
    --------
    >>> from sklearn_linattn._features import feature_names
    >>> list(feature_names(1))
    ['S[x0,x0]*last[x0]']
    """
    if input_features is None:
        input_features = [f"x{i}" for i in range(d)]
    names = np.asarray(input_features, dtype=object)
    j, k = pair_indices(d)
    out = [
        f"S[{names[a]},{names[b]}]*last[{names[l]}]"
        for a, b in zip(j, k)
        for l in range(d)
    ]
    return np.asarray(out, dtype=object)
