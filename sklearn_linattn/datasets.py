"""Generators for the paper's tasks, in scikit-learn's ``make_*`` style (user guide: programs)."""

import numbers

import numpy as np

from ._attention import mhla_forward
from ._memory import default_memory_budget, real_tokens

from ._validation import check_readout
from ._params import check_head_decays, check_number, check_option, validate_random_state
from .programs import run_dfa

__all__ = [
    "dfa_vocabulary",
    "make_associative_memory",
    "make_dfa_execution",
    "make_in_context_regression",
    "make_random_mhla",
]


# --------------------------------------------------------------------------
# Argument checks (names the argument, what was expected, what was given)
# --------------------------------------------------------------------------


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(
        value, (bool, np.bool_)
    )


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{name} must be True or False; got {value!r} of type "
            f"{type(value).__name__}."
        )
    return bool(value)


def _check_output_size(n_values, what):
    """Refuse, before drawing anything, arrays of n_values floats beyond the memory budget."""

    need, budget = 8.0 * n_values, default_memory_budget()
    if need > budget:
        raise ValueError(
            f"{what} would take about {need / 2**30:.3g} GiB, more than the memory budget "
            f"of {budget / 2**30:.3g} GiB (half the physical memory); ask for fewer samples "
            "(or shorter sequences) and draw them in batches."
        )


def _check_variable_length(variable_length, n_tokens):
    """None for fixed length, else (min_len, max_len), 1 <= min <= max <= n_tokens."""
    if variable_length is None or (
        isinstance(variable_length, (bool, np.bool_)) and not variable_length
    ):
        return None
    if isinstance(variable_length, (bool, np.bool_)):
        return 1, n_tokens
    expected = (
        f"False, True or a pair (min_len, max_len) of integers with "
        f"1 <= min_len <= max_len <= n_tokens={n_tokens}"
    )
    if (
        not isinstance(variable_length, (tuple, list))
        or len(variable_length) != 2
        or not all(_is_int(v) for v in variable_length)
    ):
        raise TypeError(f"variable_length must be {expected}; got {variable_length!r}.")
    lo, hi = (int(v) for v in variable_length)
    if not 1 <= lo <= hi <= n_tokens:
        raise ValueError(
            f"variable_length must be {expected}; got {variable_length!r}."
        )
    return lo, hi


def _squeeze_output(y):
    """Drop the output axis when there is a single output (scikit-learn style)."""
    return y[..., 0] if y.shape[-1] == 1 else y


# --------------------------------------------------------------------------
# Sec. 4.1: random multi-head linear attention
# --------------------------------------------------------------------------


def make_random_mhla(
    n_samples=100,
    n_tokens=100,
    d=4,
    *,
    n_heads=1,
    d_out=1,
    readout="last",
    noise=0.0,
    variable_length=False,
    weight_scale=None,
    token_scale=None,
    decays=None,
    random_state=None,
    return_params=False,
):
    """Gaussian sequences labelled by a random multi-head linear attention (paper Sec. 4.1).

    Without noise, ``y`` is exactly the output of the ``n_heads``-head teacher.
    See the user guide's :doc:`/programs` page on the paper's tasks.

    Parameters
    ----------
    n_samples, n_tokens, d : int, default=100, 100, 4
        Number of sequences, tokens per sequence (padded length), token dimension.
    n_heads, d_out : int, default=1
        Number of heads and output dimension of the teacher.
    readout : {"last", "all"}, default="last"
        One target per sequence (at the last real token), or one per position.
    noise : float, default=0.0
        Standard deviation of the Gaussian noise added to every target.
    variable_length : bool or (int, int), default=False
        ``(min_len, max_len)``: lengths drawn uniformly in that inclusive range,
        then NaN padding; True means ``(1, n_tokens)``, False full sequences.
    weight_scale, token_scale : float or None, default=None
        Standard deviations of the teacher's and of the tokens' entries; None
        means ``1 / sqrt(d)`` and ``1 / sqrt(n_tokens)``.
    decays : None, float or array-like of shape (n_heads,), default=None
        Decay of each teacher head, in (0, 1]; None: no decay.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the weights, tokens, lengths and noise.
    return_params : bool, default=False
        Also return the generating parameters.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, d)
        Token sequences; padded tokens are all NaN.
    y : ndarray of shape (n_samples[, n_tokens][, d_out])
        With ``n_tokens`` for ``readout="all"`` (NaN at padding), ``d_out`` if > 1.
    params : dict
        With ``return_params=True`` only: ``"V"``, ``"Q"``, ``"lengths"`` and
        ``"decays"`` (None without decays).

    See Also
    --------
    sklearn_linattn.mhla_forward : The teacher's forward pass.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time", arXiv:2410.10101.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> X, y, params = make_random_mhla(50, 10, 3, n_heads=2, random_state=0, return_params=True)
    >>> X.shape, y.shape, params["V"].shape
    ((50, 10, 3), (50,), (2, 1, 3))
    >>> bool(np.allclose(y, mhla_forward(X, params["V"], params["Q"])[:, 0]))
    True
    """
    n_samples = check_number(n_samples, "n_samples", integer=True, low=1)
    n_tokens = check_number(n_tokens, "n_tokens", integer=True, low=1)
    d = check_number(d, "d", integer=True, low=1)
    n_heads = check_number(n_heads, "n_heads", integer=True, low=1)
    d_out = check_number(d_out, "d_out", integer=True, low=1)
    check_readout(readout)
    noise = check_number(noise, "noise", low=0.0)
    bounds = _check_variable_length(variable_length, n_tokens)
    weight_scale = check_number(weight_scale, "weight_scale", low=0.0, low_open=True, allow_none=True)
    token_scale = check_number(token_scale, "token_scale", low=0.0, low_open=True, allow_none=True)
    return_params = _check_bool(return_params, "return_params")
    decays = check_head_decays(decays, n_heads)
    rng = validate_random_state(random_state)
    rows = n_tokens if readout == "all" else 1
    _check_output_size(n_samples * (n_tokens * d + rows * d_out),
                       f"make_random_mhla(n_samples={n_samples}, n_tokens={n_tokens}, d={d})")
    if weight_scale is None:
        weight_scale = 1.0 / np.sqrt(d)
    if token_scale is None:
        token_scale = 1.0 / np.sqrt(n_tokens)

    V = weight_scale * rng.standard_normal((n_heads, d_out, d))
    Q = weight_scale * rng.standard_normal((n_heads, d, d))
    X = token_scale * rng.standard_normal((n_samples, n_tokens, d))
    if bounds is None:
        lengths = np.full(n_samples, n_tokens, dtype=np.int64)
    else:
        lengths = rng.randint(bounds[0], bounds[1] + 1, size=n_samples).astype(np.int64)
    padded = ~real_tokens(lengths, n_tokens)
    X[padded] = 0.0  # zero tokens add nothing to the attention sums
    y = mhla_forward(X, V, Q, lengths, readout=readout, decays=decays)
    if noise > 0:
        y = y + noise * rng.standard_normal(y.shape)  # NaN stays NaN
    X[padded] = np.nan
    y = _squeeze_output(y)
    if return_params:
        return X, y, {"V": V, "Q": Q, "lengths": lengths, "decays": decays}
    return X, y


# --------------------------------------------------------------------------
# Sec. 4.2: associative memory
# --------------------------------------------------------------------------


def _random_orthogonal(rng, n, d):
    """n Haar-distributed d x d orthogonal matrices: QR with sign correction."""
    G = rng.standard_normal((n, d, d))
    Qm, R = np.linalg.qr(G)
    diag = np.diagonal(R, axis1=1, axis2=2)
    # Without the correction the signs follow LAPACK's convention and the
    # matrices are not Haar distributed.
    return Qm * np.where(diag < 0, -1.0, 1.0)[:, None, :]


def make_associative_memory(
    n_samples=100,
    d=4,
    *,
    distribution="gaussian",
    p_orthonormal=0.5,
    targets="token",
    random_state=None,
    return_params=False,
):
    """Key-value retrieval sequences labelled by the one-head associative memory (paper Sec. 4.2).

    Each sequence holds d tokens ``(k_j; v_j)``, then ``(q; zeta)`` with q one of
    the keys; ``y`` is the memory's exact output.  See the user guide's :doc:`/programs` page.

    Parameters
    ----------
    n_samples, d : int, default=100, 4
        Number of sequences; dimension of keys and values (tokens have 2d).
    distribution : {"gaussian", "orthonormal", "mixture"}, default="gaussian"
        Keys and values with N(0, 1/d) entries, or rows of random orthogonal
        matrices, or either per sample (orthonormal with ``p_orthonormal``).
    p_orthonormal : float in [0, 1], default=0.5
        Probability of an orthonormal sample with ``distribution="mixture"``.
    targets : {"token", "value"}, default="token"
        The whole output token (d_out = 2d, the key half zero) or its value
        part only (d_out = d; better for R^2 scoring).
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the sample kinds, keys, values, query choices and zeta.
    return_params : bool, default=False
        Also return the generating parameters.

    Returns
    -------
    X : ndarray of shape (n_samples, d + 1, 2 * d)
        ``X[i, j] = (k_j; v_j)`` for j < d and ``X[i, d] = (q; zeta)``.
    y : ndarray of shape (n_samples, d_out)
        ``mhla_forward(X, V, Q)`` (shape (n_samples,) when d_out = 1).
    params : dict
        With ``return_params=True`` only: ``"V"``, ``"Q"``, ``"orthonormal"``
        (bool per sample) and ``"query_index"`` (the j with ``q = k_j``).

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time", arXiv:2410.10101.

    Examples
    --------
    >>> from sklearn_linattn.datasets import make_associative_memory
    >>> X, y = make_associative_memory(5, 3, targets="value", random_state=0)
    >>> X.shape, y.shape
    ((5, 4, 6), (5, 3))
    """
    n_samples = check_number(n_samples, "n_samples", integer=True, low=1)
    d = check_number(d, "d", integer=True, low=1)
    check_option(distribution, "distribution", ("gaussian", "orthonormal", "mixture"))
    p_orthonormal = check_number(p_orthonormal, "p_orthonormal", low=0.0, high=1.0)
    check_option(targets, "targets", ("token", "value"))
    return_params = _check_bool(return_params, "return_params")
    rng = validate_random_state(random_state)
    _check_output_size(n_samples * ((d + 1) * 2 * d + 2 * d),
                       f"make_associative_memory(n_samples={n_samples}, d={d})")

    if distribution == "mixture":
        orthonormal = rng.random_sample(n_samples) < p_orthonormal
    else:
        orthonormal = np.full(n_samples, distribution == "orthonormal")
    n_ortho = int(orthonormal.sum())
    n_gauss = n_samples - n_ortho
    keys = np.empty((n_samples, d, d))
    values = np.empty((n_samples, d, d))
    keys[~orthonormal] = rng.standard_normal((n_gauss, d, d)) / np.sqrt(d)
    values[~orthonormal] = rng.standard_normal((n_gauss, d, d)) / np.sqrt(d)
    keys[orthonormal] = _random_orthogonal(rng, n_ortho, d)
    values[orthonormal] = _random_orthogonal(rng, n_ortho, d)
    query_index = rng.randint(0, d, size=n_samples).astype(np.int64)
    zeta = rng.standard_normal((n_samples, d))

    X = np.empty((n_samples, d + 1, 2 * d))
    X[:, :d, :d] = keys
    X[:, :d, d:] = values
    X[:, d, :d] = keys[np.arange(n_samples), query_index]
    X[:, d, d:] = zeta

    eye = np.eye(d)
    Q = np.zeros((1, 2 * d, 2 * d))
    Q[0, :d, :d] = eye
    if targets == "token":
        V = np.zeros((1, 2 * d, 2 * d))
        V[0, d:, d:] = eye
    else:
        V = np.zeros((1, d, 2 * d))
        V[0, :, d:] = eye
    y = _squeeze_output(mhla_forward(X, V, Q))
    if return_params:
        params = {
            "V": V,
            "Q": Q,
            "orthonormal": orthonormal,
            "query_index": query_index,
        }
        return X, y, params
    return X, y


# --------------------------------------------------------------------------
# App. G.4: executing finite automata
# --------------------------------------------------------------------------


def dfa_vocabulary(n_states, alphabet_size):
    """Token vocabulary of :func:`make_dfa_execution`, in one-hot order.

    Parameters
    ----------
    n_states, alphabet_size : int
        Number of DFA states and of letters.

    Returns
    -------
    vocabulary : list of str
        States ``"q<s>"``, letters ``"a<w>"``, then ``"("``, ``")"`` and ``"|"``.

    Examples
    --------
    >>> from sklearn_linattn.datasets import dfa_vocabulary
    >>> dfa_vocabulary(2, 3)
    ['q0', 'q1', 'a0', 'a1', 'a2', '(', ')', '|']
    """
    n_states = check_number(n_states, "n_states", integer=True, low=1)
    alphabet_size = check_number(alphabet_size, "alphabet_size", integer=True, low=1)
    return (
        [f"q{s}" for s in range(n_states)]
        + [f"a{w}" for w in range(alphabet_size)]
        + ["(", ")", "|"]
    )


def make_dfa_execution(
    n_samples=100,
    *,
    n_states=3,
    alphabet_size=2,
    word_length=5,
    targets="all",
    random_state=None,
    return_params=False,
):
    """Strings asking to execute a random finite automaton, for next-token prediction.

    The task of the paper's App. G.4: a random transition table, a random word
    and the computation history, as one-hot tokens over :func:`dfa_vocabulary`;
    ``y[:, t]`` is token ``t + 1`` (teacher forcing, for ``readout="all"``).
    See the user guide's :doc:`/programs` page for the layout.

    Parameters
    ----------
    n_samples : int, default=100
        Number of strings.
    n_states, alphabet_size, word_length : int, default=3, 2, 5
        Number of DFA states, of letters, and letters L of the word.
    targets : {"all", "history"}, default="all"
        A target at every position, or NaN except where the next token belongs
        to the history (for scoring; estimators accept NaN only at padding).
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the DFAs and the words.
    return_params : bool, default=False
        Also return the generating parameters.

    Returns
    -------
    X, y : ndarray of shape (n_samples, n_chars - 1, n_states + alphabet_size + 3)
        One-hot tokens ``0 .. n_chars - 2`` and ``1 .. n_chars - 1`` of the
        string of ``n_chars = 5 * n_states * alphabet_size + 4 * L + 2`` tokens.
    params : dict
        With ``return_params=True`` only: ``"vocabulary"``, ``"transitions"``,
        ``"words"``, ``"states"`` (as :func:`~sklearn_linattn.programs.run_dfa`),
        ``"tokens"`` (the string as indices) and ``"history_start"``.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time", arXiv:2410.10101.

    Examples
    --------
    >>> from sklearn_linattn.datasets import make_dfa_execution
    >>> X, y, params = make_dfa_execution(2, n_states=3, alphabet_size=2, word_length=4,
    ...                                   random_state=2, return_params=True)
    >>> X.shape  # 5 * 3 * 2 + 4 * 4 + 2 = 48 tokens, 3 + 2 + 3 = 8 symbols
    (2, 47, 8)
    >>> " ".join(params["vocabulary"][i] for i in params["tokens"][0, 30:])
    '| a0 a1 a1 a1 | q0 a0 q0 q0 a1 q1 q1 a1 q2 q2 a1 q0'
    """
    n_samples = check_number(n_samples, "n_samples", integer=True, low=1)
    n_states = check_number(n_states, "n_states", integer=True, low=1)
    alphabet_size = check_number(alphabet_size, "alphabet_size", integer=True, low=1)
    word_length = check_number(word_length, "word_length", integer=True, low=1)
    check_option(targets, "targets", ("all", "history"))
    return_params = _check_bool(return_params, "return_params")
    rng = validate_random_state(random_state)
    n_chars = 5 * n_states * alphabet_size + 4 * word_length + 2
    _check_output_size(2 * n_samples * n_chars * (n_states + alphabet_size + 3),
                       f"make_dfa_execution(n_samples={n_samples}, ...)")

    vocabulary = dfa_vocabulary(n_states, alphabet_size)
    letter0 = n_states  # vocabulary index of letter 0
    open_, close, sep = (n_states + alphabet_size + i for i in range(3))

    transitions = rng.randint(
        0, n_states, size=(n_samples, n_states, alphabet_size)
    ).astype(np.int64)
    words = rng.randint(0, alphabet_size, size=(n_samples, word_length))
    words = words.astype(np.int64)

    states = run_dfa(transitions, words)

    # Transition table: "( s w delta(s, w) )", state-major.
    s_grid, w_grid = np.meshgrid(
        np.arange(n_states), np.arange(alphabet_size), indexing="ij"
    )
    table = np.empty((n_samples, n_states, alphabet_size, 5), dtype=np.int64)
    table[..., 0] = open_
    table[..., 1] = s_grid
    table[..., 2] = letter0 + w_grid
    table[..., 3] = transitions
    table[..., 4] = close
    history = np.stack(
        [states[:, :-1], letter0 + words, states[:, 1:]], axis=2
    ).reshape(n_samples, 3 * word_length)
    separator = np.full((n_samples, 1), sep, dtype=np.int64)
    tokens = np.concatenate(
        [
            table.reshape(n_samples, -1),
            separator,
            letter0 + words,
            separator,
            history,
        ],
        axis=1,
    )
    history_start = 5 * n_states * alphabet_size + word_length + 2

    onehot = np.eye(len(vocabulary))
    X = onehot[tokens[:, :-1]]
    y = onehot[tokens[:, 1:]]
    if targets == "history":
        y[:, : history_start - 1] = np.nan
    if return_params:
        params = {
            "vocabulary": vocabulary,
            "transitions": transitions,
            "words": words,
            "states": states,
            "tokens": tokens,
            "history_start": history_start,
        }
        return X, y, params
    return X, y


# --------------------------------------------------------------------------
# In-context regression (the setting of most theory on linear attention)
# --------------------------------------------------------------------------


def _check_covariance(covariance, D):
    """``(Lambda, L)``: the covariance of the inputs (D, D) and its Cholesky factor."""
    if covariance is None:
        return np.eye(D), np.eye(D)
    try:
        C = np.asarray(covariance, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"covariance must be None or an array of numbers; got {covariance!r}."
                        ) from None
    if C.shape == (D,):
        C = np.diag(C)
    if C.shape != (D, D) or not np.all(np.isfinite(C)):
        raise ValueError(
            f"covariance must be None, the ({D},) diagonal or a ({D}, {D}) matrix of finite "
            f"numbers (n_features={D}); got shape {C.shape}.")
    if not np.allclose(C, C.T, rtol=1e-12, atol=1e-12 * np.abs(C).max(initial=0.0)):
        raise ValueError("covariance must be symmetric; got a matrix that is not.")
    try:
        L = np.linalg.cholesky(C)
    except np.linalg.LinAlgError:
        raise ValueError("covariance must be positive definite; got a matrix that is not."
                         ) from None
    return C, L


def make_in_context_regression(n_prompts, n_context, n_features, *, covariance=None, noise=0.0,
                               task="linear", return_weights=False, random_state=None):
    """Prompts of in-context linear regression: ``(x_1, y_1), ..., (x_N, y_N), (x_q, 0)``.

    Each prompt has its own task ``w``, inputs ``x ~ N(0, covariance)`` and
    labels ``y = w . x`` (plus noise); the target is the query's label.  The
    tokens are ``(x_i, y_i)`` and the query token ``(x_q, 0)``, the setting of
    most theory on linear attention; the user guide's :doc:`/in_context` page
    gives the known optimum of one layer and what the package fits.

    Parameters
    ----------
    n_prompts, n_context, n_features : int
        Number of prompts, context pairs per prompt (N) and input dimension (D).
    covariance : array-like of shape (n_features,) or (n_features, n_features) or None, \
default=None
        Covariance Lambda of the inputs (a diagonal, or a positive definite
        matrix); None is the identity.
    noise : float, default=0.0
        Standard deviation of Gaussian noise added to every label, the
        query's included.
    task : {"linear", "sparse"}, default="linear"
        ``"linear"``: ``w ~ N(0, I)``.  ``"sparse"``: ``w`` non-zero on
        ``ceil(sqrt(D))`` coordinates drawn per prompt, those ``N(0, D / k)``,
        so that ``E ||w||**2 = D`` as for ``"linear"``.
    return_weights : bool, default=False
        Also return each prompt's ``w``.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the tasks, inputs and noise.

    Returns
    -------
    X : ndarray of shape (n_prompts, n_context + 1, n_features + 1)
        ``X[i, j] = (x_j, y_j)`` for j < N and ``X[i, N] = (x_q, 0)``.
    y : ndarray of shape (n_prompts,)
        The query's label ``w . x_q`` (plus noise).
    w : ndarray of shape (n_prompts, n_features)
        With ``return_weights=True`` only.

    References
    ----------
    .. [1] R. Zhang, S. Frei, P. Bartlett, "Trained Transformers Learn Linear
       Models In-Context", JMLR 25 (2024).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.datasets import make_in_context_regression
    >>> X, y, w = make_in_context_regression(4, 8, 3, return_weights=True, random_state=0)
    >>> X.shape, y.shape, w.shape
    ((4, 9, 4), (4,), (4, 3))
    >>> bool(np.allclose(X[:, :8, 3], np.einsum("ijk,ik->ij", X[:, :8, :3], w)))
    True
    >>> bool(np.all(X[:, 8, 3] == 0))
    True
    """
    n_prompts = check_number(n_prompts, "n_prompts", integer=True, low=1)
    n_context = check_number(n_context, "n_context", integer=True, low=1)
    D = check_number(n_features, "n_features", integer=True, low=1)
    noise = check_number(noise, "noise", low=0.0)
    check_option(task, "task", ("linear", "sparse"))
    return_weights = _check_bool(return_weights, "return_weights")
    _, L = _check_covariance(covariance, D)
    rng = validate_random_state(random_state)
    _check_output_size(n_prompts * ((n_context + 1) * (D + 1) + D + 1),
                       f"make_in_context_regression(n_prompts={n_prompts}, "
                       f"n_context={n_context}, n_features={D})")
    w = rng.standard_normal((n_prompts, D))
    if task == "sparse":
        k = int(np.ceil(np.sqrt(D)))
        # k coordinates per prompt: the first k of a random permutation of each row.
        keep = np.argsort(rng.random_sample((n_prompts, D)), axis=1)[:, :k]
        mask = np.zeros((n_prompts, D), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=1)
        w = np.where(mask, w * np.sqrt(D / k), 0.0)
    inputs = rng.standard_normal((n_prompts, n_context + 1, D)) @ L.T
    labels = np.einsum("ijk,ik->ij", inputs, w)
    if noise > 0:
        labels = labels + noise * rng.standard_normal(labels.shape)
    X = np.concatenate([inputs, labels[:, :, None]], axis=2)
    X[:, -1, -1] = 0.0  # the query's label is what the model predicts
    y = labels[:, -1].copy()
    return (X, y, w) if return_weights else (X, y)
