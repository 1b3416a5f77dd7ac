"""The cubic feature map H of multi-head linear attention, and its kernel.

The feature order is defined here alone (the user guide's :ref:`theory-feature-layout`).  The
functions take zero-padded arrays and lengths as ``_validation.check_sequences`` returns them.
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
    "features_matvec_in",
    "features_rmatvec",
    "features_rmatvec_in",
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
    """The folding rule: the pairs ``(j, k)``, j <= k, of ``np.triu_indices(d)``, read-only."""
    return _triu_indices(int(d))


@functools.lru_cache(maxsize=64)
def _triu_indices(d):
    """``np.triu_indices(d)``, computed once per d and read-only (callers share it)."""
    j, k = np.triu_indices(d)
    j.setflags(write=False)
    k.setflags(write=False)
    return j, k


def pair_index_matrix(d):
    """(d, d) symmetric int matrix: ``index[j, k]`` is the position of pair ``(min, max)``."""
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
    """The row moments of readout "last", (n_samples, n_blocks * P): each block's folded moment.

    ``decays=None`` gives the plain moments; ``plain``, when given, is the block of decay 1.
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
    """Folded (decayed) running moments ``S_t``, shape (n, n_tokens, n_blocks * P).

    A transposed view of a (P, n, n_tokens) array: running sums go along contiguous tokens.
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
    """The factors ``(S, x, sample)`` of the feature rows ``H_r = kron(S_r, x_r)``.

    One row per sequence (``"last"``) or per real position, sample-major (``"all"``); ``S`` has
    one folded moment per decay block, ``x`` the row's token, ``sample`` its sequence.
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
    """``Phi @ coef.T``, (n_rows, k), from the factors of :func:`row_factors`, rows unformed."""
    n_rows, P = S.shape
    d = x.shape[1]
    k = coef.shape[0]
    # U[r, l, c] = sum_p S[r, p] coef[c, p, l]: one GEMM with the moments,
    # then a row-wise dot product with the last tokens.
    C = np.ascontiguousarray(coef.reshape(k, P, d).transpose(1, 2, 0)).reshape(P, d * k)
    U = (S @ C).reshape(n_rows, d, k)
    return np.einsum("rlc,rl->rc", U, x)


def features_rmatvec(S, x, R):
    """``(Phi.T @ R).T``, (k, psi), from the row factors of :func:`row_factors`, rows unformed."""
    n_rows, P = S.shape
    d = x.shape[1]
    k = R.shape[1]
    if k == 1:
        return (S.T @ (x * R)).reshape(1, P * d)
    Z = (x[:, :, None] * R[:, None, :]).reshape(n_rows, d * k)
    return (S.T @ Z).reshape(P, d, k).transpose(2, 0, 1).reshape(k, P * d)


def features_matvec_in(xp, S, x, coef):
    """:func:`features_matvec` of arrays of the array API namespace ``xp``."""
    n_rows, P = S.shape
    d, k = x.shape[1], coef.shape[0]
    C = xp.reshape(xp.permute_dims(xp.reshape(coef, (k, P, d)), (1, 2, 0)), (P, d * k))
    U = xp.reshape(xp.matmul(S, C), (n_rows, d, k))
    return xp.sum(U * x[:, :, None], axis=1)


def features_rmatvec_in(xp, S, x, R):
    """:func:`features_rmatvec` of arrays of the array API namespace ``xp``."""
    n_rows, P = S.shape
    d, k = x.shape[1], R.shape[1]
    Z = xp.reshape(x[:, :, None] * R[:, None, :], (n_rows, d * k))
    out = xp.reshape(xp.matmul(xp.matrix_transpose(S), Z), (P, d, k))
    return xp.reshape(xp.permute_dims(out, (2, 0, 1)), (k, P * d))


def attention_features(X, lengths, decays=None):
    """The feature map H, (n_samples, n_blocks * psi): a row per sequence, a block per decay."""
    return outer_features(decayed_moments(X, lengths, decays), last_tokens(X, lengths))


def prefix_features(X, lengths, decays=None):
    """Features of every prefix, (n_samples, n_tokens, n_blocks * psi), for readout ``"all"``.

    ``H[i, t]`` is the feature vector of ``X[i, :t + 1]``; rows at padded positions are zero.
    """
    H = outer_features(_prefix_moments(X, decays), X)
    H[~real_tokens(lengths, X.shape[1])] = 0.0
    return H


def padded_kernel(X, lengths_X, Y, lengths_Y):
    """Gram matrix ``<H(X_i), H(Y_j)>`` of zero-padded arrays, without forming the features."""
    SX = folded_second_moments(X)
    SY = SX if Y is X else folded_second_moments(Y)
    return (SX @ SY.T) * (last_tokens(X, lengths_X) @ last_tokens(Y, lengths_Y).T)


def attention_kernel(X, Y=None, *, token_dim=None):
    """The linear-attention kernel: inner products of the cubic features.

    ``K[i, j] = <H(X_i), H(Y_j)>``, for any scikit-learn kernel method with
    ``kernel="precomputed"`` (:ref:`theory-kernel`).

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
    """Names of the features in order: ``"S[x0,x1]*last[x2]"``, ``"S@0.9[..."`` with decays.

    ``input_features`` names the d token coordinates (default ``x0, ..., x{d-1}``).
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
    """Fold ``C`` (d_out, d, d, d) into (d_out, psi): ``C[a,j,k,l] + C[a,k,j,l]`` per j <= k."""
    d_out, d = C.shape[0], C.shape[1]
    j, k = pair_indices(d)
    sym = C + C.transpose(0, 2, 1, 3)
    sym[:, np.arange(d), np.arange(d)] *= 0.5
    return sym[:, j, k, :].reshape(d_out, -1)


def unfold_coefficients(coef, d):
    """Spread folded coefficients symmetrically (minimum norm) over (d_out, d, d, d)."""
    coef = np.asarray(coef, dtype=np.float64)
    d_out = coef.shape[0]
    j, k = pair_indices(d)
    c = coef.reshape(d_out, len(j), d)
    C = np.zeros((d_out, d, d, d))
    C[:, j, k, :] = 0.5 * c
    C[:, k, j, :] += 0.5 * c
    return C


def _kron_rows(S, x):
    """CSR ``(indptr, indices, data)`` of the rows ``kron(S_r, x_r)``: their non-zero products.

    Column indices are sorted within each row.
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
    """``(H, sample)``: the feature rows as a CSR matrix, the dense rows' values and dtype.

    Rows of weight-0 sequences are dropped; with ``standardizer``, rows of the standardized tokens
    (its decays); a ValueError as soon as the non-zeros exceed ``memory_budget`` bytes.
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
