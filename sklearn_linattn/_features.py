"""The cubic feature map H of multi-head linear attention, and its kernel.

Feature order (one place: :func:`pair_indices` and :func:`attention_features`):
column ``p * d + l`` holds ``S[j_p, k_p] * x_last[l]`` where ``(j_p, k_p)`` is
the p-th pair of ``np.triu_indices(d)`` (row-major upper triangle, j <= k) and
``S = sum_t x_t x_t^T``.  This is the paper's Algorithm 2 with no rescaling of
the off-diagonal pairs, so eigenvalues can be compared with the paper's.

With fixed decays ``(gamma_1, ..., gamma_K)`` the features are K such blocks
side by side, block b built from the decayed moment ``S = sum_t gamma_b**(r - t)
x_t x_t^T`` (r the row's position): column ``(b * P + p) * d + l``.  The row
factors are then the K decayed moments side by side and the last token, so
every product of the rows below holds unchanged.

All functions take zero-filled padded arrays and lengths as returned by
:func:`sklearn_linattn._validation.check_sequences`: zero tokens contribute
nothing to ``S``.
"""

import functools

import numpy as np

import scipy.signal
import scipy.sparse

from ._memory import sample_chunks, n_pairs, real_tokens, sample_values, zero_padding
from ._validation import check_lengths_array, check_readout, check_sequences

__all__ = [
    "attention_features",
    "fold_coefficients",
    "unfold_coefficients",
    "attention_kernel",
    "feature_names",
    "features_matvec",
    "features_rmatvec",
    "padded_kernel",
    "n_attention_features",
    "pair_index_matrix",
    "pair_indices",
    "prefix_features",
    "row_factors",
    "sparse_feature_rows",
    "sparse_target_rows",
]



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
    return _triu_indices(int(d))


@functools.lru_cache(maxsize=64)
def _triu_indices(d):
    """``np.triu_indices(d)``, computed once per d and read-only (callers share it)."""
    j, k = np.triu_indices(d)
    j.setflags(write=False)
    k.setflags(write=False)
    return j, k


def pair_index_matrix(d):
    """Position of each pair in the folding order, as a symmetric matrix.

    Parameters
    ----------
    d : int

    Returns
    -------
    index : ndarray of int, shape (d, d)
        ``index[j, k] == index[k, j]`` is the position of the pair
        ``(min(j, k), max(j, k))`` in :func:`pair_indices`.

    Examples
    --------
    >>> from sklearn_linattn._features import pair_index_matrix
    >>> pair_index_matrix(2)
    array([[0, 1],
           [1, 2]])
    """
    j, k = pair_indices(d)
    index = np.empty((d, d), dtype=np.intp)
    index[j, k] = np.arange(j.size)
    index[k, j] = np.arange(j.size)
    return index


def n_attention_features(d):
    """Number of folded cubic features, psi = d**2 * (d + 1) / 2."""
    return d * n_pairs(d)


def folded_second_moments(X):
    """Folded S = sum_t x_t x_t^T per sequence, shape (n_samples, d(d+1)/2)."""
    n_samples, _, d = X.shape
    j, k = pair_indices(d)
    # Batched GEMMs for the d x d moments, then a flat gather of the triangle.
    # (matmul: einsum's optimised path is several times slower on long batches.)
    S = np.matmul(X.transpose(0, 2, 1), X)
    return np.take(S.reshape(n_samples, d * d), j * d + k, axis=1)


def _decayed_last_moments(X, lengths, decay):
    """Folded ``S = sum_t decay**(n - 1 - t) x_t x_t^T`` per sequence (n its length)."""
    n_samples, n_tokens, d = X.shape
    age = (np.asarray(lengths)[:, None] - 1 - np.arange(n_tokens)[None, :]).astype(np.float64)
    # Half the age on each side of the product; padded tokens are zero anyway.
    with np.errstate(under="ignore"):
        root = np.power(decay, 0.5 * np.maximum(age, 0.0)).astype(X.dtype, copy=False)
    return folded_second_moments(X * root[:, :, None])


def decayed_moments(X, lengths, decays=None, plain=None):
    """The row moments of readout "last": the folded (decayed) moment of each block side by side.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)
    decays : tuple of float or None
        None: the plain moments ``sum_t x_t x_t^T``.
    plain : ndarray of shape (n_samples, P) or None, default=None
        The plain folded moments of X when computed already (the block of
        decay 1).

    Returns
    -------
    S : ndarray of shape (n_samples, n_blocks * P)

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import decayed_moments
    >>> X = np.array([[[1.0], [2.0]]])
    >>> decayed_moments(X, np.array([2]), (1.0, 0.5))  # 1 + 4, then 0.5 * 1 + 4
    array([[5. , 4.5]])
    """
    if decays is None or 1.0 in decays:
        plain = folded_second_moments(X) if plain is None else plain
    if decays is None:
        return plain
    return np.concatenate([plain if g == 1.0 else _decayed_last_moments(X, lengths, g)
                           for g in decays], axis=1)


def last_tokens(X, lengths):
    """The last real token of each sequence, shape (n_samples, d)."""
    if lengths.size and lengths.min() == X.shape[1]:
        return X[:, -1]  # no padding: a view, no gather
    return X[np.arange(X.shape[0]), lengths - 1]


def outer_features(S_folded, x):
    """Row-wise Kronecker product (..., P) x (..., d) -> (..., P * d)."""
    lead = np.broadcast_shapes(S_folded.shape[:-1], x.shape[:-1])
    dtype = np.result_type(S_folded, x)
    out = np.empty(lead + (S_folded.shape[-1], x.shape[-1]), dtype=dtype)
    np.multiply(S_folded[..., :, None], x[..., None, :], out=out)
    return out.reshape(*lead, -1)


def _prefix_moments(X, decays=None):
    """Folded running moments S_t = sum_{s <= t} x_s x_s^T, shape (n, n_tokens, P).

    With ``decays``, ``S_t = sum_{s <= t} gamma**(t - s) x_s x_s^T`` for each
    decay, the blocks side by side: shape (n, n_tokens, n_blocks * P).

    The result is a transposed view of a (P, n, n_tokens) array: products
    and running sums then run along contiguous token axes (several times
    faster than along the short pair axis), and the rows of
    :func:`row_factors` come out with their pairs as columns of a
    Fortran-ordered matrix, the layout the Gram accumulation wants.
    """
    j, k = pair_indices(X.shape[2])
    Xt = np.ascontiguousarray(X.transpose(2, 0, 1))
    P = j.size
    decays = (1.0,) if decays is None else decays
    S = np.empty((len(decays) * P,) + Xt.shape[1:], dtype=Xt.dtype)
    # The products x_t x_t^T in the last block's place: each block reads them
    # before that block, the last, overwrites them in place.
    products = S[(len(decays) - 1) * P:]
    for p in range(P):
        np.multiply(Xt[j[p]], Xt[k[p]], out=products[p])
    for b, g in enumerate(decays):
        block = S[b * P:(b + 1) * P]
        if g == 1.0:
            np.cumsum(products, axis=2, out=block)
        else:
            # The recurrence S_t = g S_{t-1} + x_t x_t^T along the tokens, in C.
            with np.errstate(under="ignore"):
                block[...] = scipy.signal.lfilter([1.0], [1.0, -g], products, axis=2)
    return S.transpose(1, 2, 0)


def row_factors(X, lengths, readout="last", decays=None):
    """The two factors of each feature row: ``H_row = kron(S_row, x_row)``.

    Every feature row is the row-wise Kronecker product of a folded second
    moment and a token (see :func:`attention_features`).  Solvers work on
    these factors instead of the rows, which are ``d`` times longer.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)
    readout : {"last", "all"}, default="last"
        ``"last"``: one row per sequence.  ``"all"``: one row per real token,
        the features of the prefix ending there (padded positions dropped),
        in sample-major order.
    decays : tuple of float or None, default=None
        Fixed decays of the feature blocks (None: one block, no decay).

    Returns
    -------
    S : ndarray of shape (n_rows, n_blocks * d * (d + 1) // 2)
        Folded second moments of the rows (of the prefixes for ``"all"``),
        one decayed moment per block side by side.
    x : ndarray of shape (n_rows, d)
        Last token of each row.
    sample : ndarray of int, shape (n_rows,)
        Index of the sequence each row comes from.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features, row_factors
    >>> X = np.array([[[1.0, 2.0], [3.0, 0.5]]])
    >>> S, x, sample = row_factors(X, np.array([2]), readout="all")
    >>> S.shape, x.shape, sample
    ((2, 3), (2, 2), array([0, 0]))
    >>> bool(np.allclose(np.einsum("rp,rl->rpl", S, x)[-1].ravel(),
    ...                  attention_features(X, np.array([2]))[0]))
    True
    """
    if readout == "last":
        return (decayed_moments(X, lengths, decays), last_tokens(X, lengths),
                np.arange(X.shape[0]))
    n_samples, n_tokens, d = X.shape
    # (P, n_samples, n_tokens) running moments; rows are taken along the last
    # two axes so that S comes out as the transpose of a contiguous array.
    St = _prefix_moments(X, decays).transpose(2, 0, 1)
    if lengths.size == 0 or lengths.min() == n_tokens:
        # No padding: every position is a row, in the same sample-major order.
        return (St.reshape(St.shape[0], -1).T, X.reshape(-1, d),
                np.repeat(np.arange(n_samples), n_tokens))
    real = real_tokens(lengths, n_tokens)
    sample = np.nonzero(real)[0]
    return St[:, real].T, X[real], sample


def features_matvec(S, x, coef):
    """Products ``Phi @ coef.T`` of the feature rows with coefficient vectors.

    ``(Phi c)_r = S_r^T C x_r`` with ``C`` the (P, d) reshape of ``c``: one
    GEMM of the tokens with the coefficients, then a row-wise dot product;
    the rows ``Phi`` themselves are never formed.

    Parameters
    ----------
    S, x : ndarray of shape (n_rows, P) and (n_rows, d)
        Row factors from :func:`row_factors`.
    coef : ndarray of shape (k, psi)
        Coefficient vectors in feature order.

    Returns
    -------
    out : ndarray of shape (n_rows, k)

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features, features_matvec, row_factors
    >>> X = np.random.default_rng(0).normal(size=(4, 3, 2))
    >>> lengths = np.full(4, 3)
    >>> c = np.arange(12.0).reshape(2, 6)
    >>> S, x, _ = row_factors(X, lengths)
    >>> bool(np.allclose(features_matvec(S, x, c), attention_features(X, lengths) @ c.T))
    True
    """
    n_rows, P = S.shape
    d = x.shape[1]
    k = coef.shape[0]
    # U[r, l, c] = sum_p S[r, p] coef[c, p, l]: one GEMM with the moments,
    # then a row-wise dot product with the last tokens.
    C = np.ascontiguousarray(coef.reshape(k, P, d).transpose(1, 2, 0)).reshape(P, d * k)
    U = (S @ C).reshape(n_rows, d, k)
    return np.einsum("rlc,rl->rc", U, x)


def features_rmatvec(S, x, R):
    """Products ``Phi.T @ R`` of the transposed feature rows, without the rows.

    ``sum_r R_r kron(S_r, x_r)`` is the (P, d) matrix ``S^T diag(R) x``: one
    GEMM per column of R.

    Parameters
    ----------
    S, x : ndarray of shape (n_rows, P) and (n_rows, d)
        Row factors from :func:`row_factors`.
    R : ndarray of shape (n_rows, k)

    Returns
    -------
    out : ndarray of shape (k, psi)
        ``out[c] = Phi.T @ R[:, c]`` in feature order.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features, features_rmatvec, row_factors
    >>> X = np.random.default_rng(0).normal(size=(4, 3, 2))
    >>> lengths = np.full(4, 3)
    >>> R = np.arange(8.0).reshape(4, 2)
    >>> S, x, _ = row_factors(X, lengths)
    >>> bool(np.allclose(features_rmatvec(S, x, R), (attention_features(X, lengths).T @ R).T))
    True
    """
    n_rows, P = S.shape
    d = x.shape[1]
    k = R.shape[1]
    if k == 1:
        return (S.T @ (x * R)).reshape(1, P * d)
    Z = (x[:, :, None] * R[:, None, :]).reshape(n_rows, d * k)
    return (S.T @ Z).reshape(P, d, k).transpose(2, 0, 1).reshape(k, P * d)


def attention_features(X, lengths, decays=None):
    """The feature map H: one row of psi cubic features per sequence.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)
        Number of real tokens per sequence.
    decays : tuple of float or None, default=None
        Fixed decays: one block of psi features per decay.

    Returns
    -------
    H : ndarray of shape (n_samples, n_blocks * psi)
        ``H[i, p * d + l] = S_i[j_p, k_p] * X[i, lengths[i] - 1, l]`` (block
        b at offset ``b * psi``, from the decayed moment).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features
    >>> X = np.array([[[1.0, 2.0], [3.0, 0.5]]])
    >>> attention_features(X, np.array([2]))
    array([[30.   ,  5.   , 10.5  ,  1.75 , 12.75 ,  2.125]])
    """
    return outer_features(decayed_moments(X, lengths, decays), last_tokens(X, lengths))


def prefix_features(X, lengths, decays=None):
    """Features of every prefix, for the causal readout ``"all"``.

    Uses a cumulative sum of the folded outer products, so the n prefixes are
    never materialised as sequences.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    lengths : ndarray of shape (n_samples,)
    decays : tuple of float or None, default=None
        Fixed decays: one block of psi features per decay.

    Returns
    -------
    H : ndarray of shape (n_samples, n_tokens, n_blocks * psi)
        ``H[i, t]`` is the feature vector of the prefix ``X[i, :t + 1]``; rows at
        padded positions are zero.
    """
    H = outer_features(_prefix_moments(X, decays), X)
    H[~real_tokens(lengths, X.shape[1])] = 0.0
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
        Gram matrix of the cubic features: ``K[i, j]`` is the inner product
        of the features of ``X[i]`` and ``Y[j]`` (of ``X[j]`` when Y is None).

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
    X, lengths_X = check_sequences(X, token_dim=token_dim)
    X = np.asarray(X, dtype=np.float64)
    if Y is None:
        return padded_kernel(X, lengths_X, X, lengths_X)
    Y, lengths_Y = check_sequences(Y, token_dim=token_dim, n_features_in=X.shape[2], name="Y")
    return padded_kernel(X, lengths_X, np.asarray(Y, dtype=np.float64), lengths_Y)


def feature_names(d, input_features=None, decays=None):
    """Readable names of the psi features, in feature order.

    ``"S[x0,x1]*last[x2]"`` is the column holding ``S[0, 1] * x_last[2]``;
    with decays, ``"S@0.9[x0,x1]*last[x2]"`` the same of the block of decay 0.9.

    Parameters
    ----------
    d : int
        Token dimension.
    input_features : sequence of str or None
        Names of the d token coordinates; default ``x0, ..., x{d-1}``.
    decays : tuple of float or None, default=None
        Fixed decays of the feature blocks.

    Returns
    -------
    names : ndarray of str, shape (n_blocks * psi,)

    Examples
    --------
    >>> from sklearn_linattn._features import feature_names
    >>> list(feature_names(1))
    ['S[x0,x0]*last[x0]']
    >>> list(feature_names(1, decays=(1.0, 0.5)))
    ['S@1[x0,x0]*last[x0]', 'S@0.5[x0,x0]*last[x0]']
    """
    if decays is not None:
        # Each decay as its shortest exact decimal: distinct decays, distinct names.
        labels = [np.format_float_positional(g, trim="-") for g in decays]
        base = feature_names(d, input_features)
        return np.concatenate([
            np.asarray([name.replace("S[", f"S@{label}[", 1) for name in base], dtype=object)
            for label in labels])
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


def fold_coefficients(C):
    """Fold a full coefficient tensor C[a, j, k, l] into psi coefficients.

    Only ``C[a, j, k, l] + C[a, k, j, l]`` reaches the output because S is
    symmetric; the folded vector keeps that sum once per pair j <= k.

    Parameters
    ----------
    C : ndarray of shape (d_out, d, d, d)

    Returns
    -------
    coef : ndarray of shape (d_out, psi)
    """
    d_out, d = C.shape[0], C.shape[1]
    j, k = pair_indices(d)
    sym = C + C.transpose(0, 2, 1, 3)
    sym[:, np.arange(d), np.arange(d)] *= 0.5
    return sym[:, j, k, :].reshape(d_out, -1)


def unfold_coefficients(coef, d):
    """Spread folded coefficients symmetrically over C[a, j, k, l] and C[a, k, j, l].

    Any split of each pair computes the same function; the symmetric one is
    the minimum-norm one.

    Returns
    -------
    C : ndarray of shape (d_out, d, d, d)
    """
    coef = np.asarray(coef, dtype=np.float64)
    d_out = coef.shape[0]
    j, k = pair_indices(d)
    c = coef.reshape(d_out, len(j), d)
    C = np.zeros((d_out, d, d, d))
    C[:, j, k, :] = 0.5 * c
    C[:, k, j, :] += 0.5 * c
    return C


def _kron_rows(S, x):
    """CSR rows ``kron(S_r, x_r)`` of dense factors, only their non-zero products.

    Parameters
    ----------
    S : ndarray of shape (n_rows, P)
    x : ndarray of shape (n_rows, d)

    Returns
    -------
    indptr, indices, data : ndarrays of one CSR matrix of shape (n_rows, P * d)
        Column indices sorted within each row (``p * d + l`` increases with p,
        then l).
    """
    n_rows, d = x.shape
    sr, sp = np.nonzero(S)  # row-major: sorted by row, then by pair p
    xr, xl = np.nonzero(x)
    x_count = np.bincount(xr, minlength=n_rows)
    x_ptr = np.concatenate([[0], np.cumsum(x_count)])
    rep = x_count[sr]  # each non-zero S_rp pairs with every non-zero x_rl
    total = int(rep.sum())
    entry = np.repeat(np.arange(sr.size), rep)
    offset = np.arange(total) - np.repeat(np.cumsum(rep) - rep, rep)
    xi = x_ptr[sr[entry]] + offset
    indices = sp[entry] * d + xl[xi]
    data = S[sr[entry], sp[entry]] * x[xr[xi], xl[xi]]
    row_nnz = np.bincount(sr, weights=rep, minlength=n_rows).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(row_nnz)])
    return indptr, indices, data


def sparse_feature_rows(X, lengths, readout="last", *, sample_weight=None, standardizer=None,
                        memory_budget=None, decays=None):
    """The feature rows H as a scipy.sparse CSR matrix.

    Same rows, same order and same feature order as the dense
    :func:`attention_features` (``"last"``) and the real rows of
    :func:`prefix_features` (``"all"``), and the same values
    (the products of the same factors), for any float input; only the
    non-zero products are formed, chunk by chunk of sequences.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Padded sequences; values at positions ``>= lengths`` are ignored
        (zero or NaN).
    lengths : ndarray of int, shape (n_samples,)
        Number of real tokens of each sequence.
    readout : {"last", "all"}, default="last"
        ``"last"``: one row per sequence.  ``"all"``: one row per real token
        (the features of the prefix ending there), sample-major.
    sample_weight : ndarray of shape (n_samples,) or None, default=None
        When given, rows of sequences with weight 0 are dropped (the other
        rows are not scaled).
    standardizer : TokenStandardizer or None, default=None
        Build the rows of the standardized tokens (float64); a power-of-two
        scaling per coordinate keeps them as sparse as the tokens.
    memory_budget : int or None, default=None
        Bytes the rows may take (None: no limit); a ValueError is raised as
        soon as the non-zeros built so far exceed it, before any more is
        allocated.
    decays : tuple of float or None, default=None
        Fixed decays of the feature blocks (the standardizer's when given).

    Returns
    -------
    H : scipy.sparse.csr_matrix of shape (n_rows, n_blocks * psi)
        dtype float64, or float32 for float32 X (as the dense features).
    sample : ndarray of int, shape (n_rows,)
        Index of the sequence each row comes from.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features
    >>> from sklearn_linattn._features import sparse_feature_rows
    >>> X = np.eye(4)[np.random.default_rng(0).integers(0, 4, size=(5, 3))]  # one-hot
    >>> H, sample = sparse_feature_rows(X, np.full(5, 3))
    >>> H.shape, int(H.nnz) <= 5 * 6
    ((5, 40), True)
    >>> bool(np.array_equal(H.toarray(), attention_features(X, np.full(5, 3))))
    True
    """
    check_readout(readout)
    X = np.asarray(X)
    if X.ndim != 3:
        raise ValueError(f"X must be an array of shape (n_samples, n_tokens, d); got {X.shape}.")
    n_samples, n_tokens, d = X.shape
    lengths = check_lengths_array(lengths, n_samples, n_tokens).astype(np.int64, copy=False)
    dtype = np.float32 if X.dtype == np.float32 and standardizer is None else np.float64
    keep = None
    if sample_weight is not None:
        keep = np.asarray(sample_weight) > 0
    if standardizer is not None:
        decays = standardizer.decays
    psi = n_attention_features(d) * (1 if decays is None else len(decays))
    indptrs, indices, data, samples = [], [], [], []
    n_rows, nnz = 0, 0
    # The chunk's tokens (as given and standardized), its moments and rows.
    per_sample = sample_values(d, n_tokens, readout, n_pairs(d) + d) + n_tokens * d
    for sl in sample_chunks(n_samples, per_sample):
        Xc, lc = X[sl].astype(dtype, copy=False), lengths[sl]
        if keep is not None and not keep[sl].all():
            Xc, lc = Xc[keep[sl]], lc[keep[sl]]
            base = np.flatnonzero(keep[sl]) + sl.start
        else:
            base = np.arange(sl.start, sl.stop)
        if Xc.shape[0] == 0:
            continue
        Xc = zero_padding(Xc, lc)
        if standardizer is not None:
            Xc = standardizer.transform(Xc)
        S, x, sample = row_factors(Xc, lc, readout, decays)
        if standardizer is not None:
            S = standardizer.scale_moments(S)
        ptr, ind, val = _kron_rows(S, x)
        if memory_budget is not None and (nnz + int(ptr[-1])) * 16 > memory_budget:
            raise ValueError(
                f"the sparse feature rows need more than the memory budget of "
                f"{memory_budget / 2**30:.3g} GiB (half the physical memory): "
                f"{nnz + int(ptr[-1])} non-zeros after {sl.stop} of {n_samples} sequences, "
                "so the data are not sparse enough for solver='lsmr'; use solver='cg'."
            )
        indptrs.append(ptr[1:] + nnz)
        indices.append(ind)
        data.append(val.astype(dtype, copy=False))
        samples.append(base[sample])
        n_rows += S.shape[0]
        nnz += int(ptr[-1])
    index_dtype = np.int32 if max(nnz, psi) < 2**31 else np.int64
    indptr = np.concatenate([[0]] + indptrs).astype(index_dtype)
    indices = np.concatenate([np.zeros(0, np.int64)] + indices).astype(index_dtype)
    data = np.concatenate([np.zeros(0, dtype)] + data)
    sample = np.concatenate([np.zeros(0, np.int64)] + samples)
    H = scipy.sparse.csr_matrix((data, indices, indptr), shape=(n_rows, psi))
    return H, sample


def sparse_target_rows(Y, lengths, readout, sample):
    """Targets of the rows of :func:`sparse_feature_rows` (same order), float64."""
    Y = np.asarray(Y, dtype=np.float64)
    if readout == "last":
        return Y[sample]
    real = real_tokens(lengths, Y.shape[1])
    rows = Y[real]
    # ``sample`` lists the kept rows in sample-major order; map them back.
    all_sample = np.nonzero(real)[0]
    if all_sample.size == sample.size:
        return rows
    return rows[np.isin(all_sample, np.unique(sample))]
