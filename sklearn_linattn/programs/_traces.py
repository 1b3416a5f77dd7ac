"""Traces of programs as training data for learning them back."""

import numpy as np

from .._memory import real_tokens
from .._validation import check_sequences


def next_token_dataset(sequences, start):
    """Autoregressive training pairs: every prefix and the token that follows it.

    For sequence i and each t from ``start[i]`` to its last token, the prefix
    ``sequences[i, :t]`` is a sample and ``sequences[i, t]`` its target.

    Parameters
    ----------
    sequences : array-like of shape (n, n_tokens, d)
        NaN-padded sequences, e.g. from :meth:`CompiledProgram.run`.
    start : int or array-like of int, shape (n,)
        Index of the first token to predict (the prompt's length), >= 1.

    Returns
    -------
    X, y : ndarray of shape (n_pairs, n_tokens - 1, d) and (n_pairs, d)
        The NaN-padded prefixes and the tokens that follow them.
    groups : ndarray of int, shape (n_pairs,)
        Index of the sequence each pair comes from (for ``GroupKFold``).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.programs import next_token_dataset
    >>> X, y, groups = next_token_dataset(np.arange(8.0).reshape(1, 4, 2), start=2)
    >>> X.shape, y.tolist(), groups.tolist()
    ((2, 3, 2), [[4.0, 5.0], [6.0, 7.0]], [0, 0])
    """
    X, lengths = check_sequences(sequences, name="sequences")
    n, n_tok, d = X.shape
    start = np.broadcast_to(np.asarray(start), (n,))
    if start.dtype.kind not in "iu" or np.any(start < 1) or np.any(start > lengths):
        raise ValueError(
            "start must be integers with 1 <= start[i] <= length of sequence i; got "
            f"{start[:10].tolist()} for lengths {lengths[:10].tolist()}."
        )
    counts = lengths - start
    groups = np.repeat(np.arange(n), counts)
    # Position of each pair's target: start[i], start[i] + 1, ...
    first = np.repeat(np.cumsum(counts) - counts, counts)
    t = start[groups] + np.arange(groups.size) - first
    y = np.asarray(X[groups, t], dtype=np.float64)
    prefixes = np.array(X[groups, : n_tok - 1], dtype=np.float64)
    prefixes[~real_tokens(t, n_tok - 1)] = np.nan
    return prefixes, y, groups
