"""Generators for the paper's tasks, in scikit-learn's ``make_*`` style.

Every generator returns ``(X, y)``, or ``(X, y, params)`` with
``return_params=True``, where ``params`` is a dict holding the generating
parameters (always including the attention weights ``"V"`` and ``"Q"`` when
the task is realized by a known MHLA).  ``X`` follows the package's data
convention: shape (n_samples, n_tokens, d), tokens along axis 1, trailing
all-NaN tokens are padding.  ``y`` has no output axis when there is a single
output (scikit-learn's convention for ``make_regression``).

``random_state`` accepts None, an int, a :class:`numpy.random.RandomState` or
a :class:`numpy.random.Generator` (whose bit generator is then consumed, so
that two calls with the same Generator give different data, as with a
RandomState).

==============================  ============================================
:func:`make_random_mhla`        random H-head MHLA teacher (paper Sec. 4.1)
:func:`make_associative_memory` key-value retrieval (paper Sec. 4.2)
:func:`make_dfa_execution`      executing random finite automata (App. G.4)
==============================  ============================================
"""

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
    """Gaussian sequences labelled by a random multi-head linear attention.

    The data of the paper's Sec. 4.1: a random H-head MHLA teacher with
    Gaussian weights, Gaussian token sequences, and targets equal to the
    teacher's output (plus optional Gaussian noise).  Without noise the data
    is exactly realizable by an MHLA with ``n_heads`` heads.

    Parameters
    ----------
    n_samples : int, default=100
        Number of sequences.
    n_tokens : int, default=100
        Number of tokens per sequence (the padded length when
        ``variable_length`` is used).  The paper uses T = 100.
    d : int, default=4
        Token dimension.  The paper uses d in {2, 4} (appendix: up to 16).
    n_heads : int, default=1
        Number of heads H of the generating MHLA.
    d_out : int, default=1
        Output dimension of the generating MHLA.
    readout : {"last", "all"}, default="last"
        ``"last"``: one target per sequence, the teacher's output at the last
        real token.  ``"all"``: the causal output at every position, as in the
        paper's Sec. 4.1 (autoregressive training).
    noise : float, default=0.0
        Standard deviation of the Gaussian noise added to every target.
    variable_length : bool or (int, int), default=False
        False: every sequence has ``n_tokens`` tokens.  A pair
        ``(min_len, max_len)`` with ``1 <= min_len <= max_len <= n_tokens``:
        each length is drawn uniformly from ``min_len..max_len`` (inclusive)
        and the sequence is padded to ``n_tokens`` with trailing all-NaN
        tokens.  True means ``(1, n_tokens)``.
    weight_scale : float or None, default=None
        Standard deviation of the i.i.d. Gaussian entries of every ``V_h`` and
        ``Q_h``.  None means ``1 / sqrt(d)``, as in the paper.
    token_scale : float or None, default=None
        Standard deviation of the i.i.d. Gaussian entries of the tokens.  None
        means ``1 / sqrt(n_tokens)`` (entries N(0, 1/T), as in the paper; with
        ``variable_length`` T is the padded length ``n_tokens``).
    decays : None, float or array-like of shape (n_heads,), default=None
        Fixed decay of each head of the teacher, in (0, 1] (retention, as
        :func:`~sklearn_linattn.mhla_forward` reads it); None: no decay.  The
        teacher is then learned by ``LinearAttentionRegressor(decay=...)``
        with its distinct decays.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the weights, tokens, lengths and noise.
    return_params : bool, default=False
        Also return the generating parameters.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, d), float64
        Token sequences; padded tokens (if any) are all NaN.
    y : ndarray of float64
        ``readout="last"``: shape (n_samples,) if ``d_out == 1`` else
        (n_samples, d_out).  ``readout="all"``: shape (n_samples, n_tokens) if
        ``d_out == 1`` else (n_samples, n_tokens, d_out), NaN exactly at the
        padded positions.
    params : dict
        Only with ``return_params=True``:

        - ``"V"``: ndarray of shape (n_heads, d_out, d), the value matrices;
        - ``"Q"``: ndarray of shape (n_heads, d, d), the key-query matrices;
        - ``"lengths"``: ndarray of shape (n_samples,), int64, the number of
          real tokens of each sequence;
        - ``"decays"``: ndarray of shape (n_heads,), the decay of each head,
          or None without ``decays``.

        Without noise, ``y`` equals ``mhla_forward(X0, V, Q, lengths,
        readout=readout, decays=decays)`` (with its output axis dropped when
        ``d_out == 1``), where ``X0`` is ``X`` with NaN replaced by 0.

    See Also
    --------
    sklearn_linattn.mhla_forward : the teacher's forward pass.

    Notes
    -----
    The teacher computes ``y = sum_h V_h sum_t x_t (x_t^T Q_h x_last)`` (sum
    over the prefix up to each position for ``readout="all"``).  Random draws
    are made in this order: V, Q, tokens, lengths, noise.

    The paper's layer also divides its scores by sqrt(d) and averages its
    heads (``V_h = P_h / (H sqrt(d))``, :func:`~sklearn_linattn.heads_from_paper`):
    with the same N(0, 1/d) draws its targets are these divided by
    ``H sqrt(d)``.  The closed form is unaffected; gradient-based learners
    compared with the paper's curves should be given ``y / (H sqrt(d))``.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time",
       arXiv:2410.10101, Sec. 4.1.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> X, y, params = make_random_mhla(
    ...     50, 10, 3, n_heads=2, readout="all", random_state=0, return_params=True
    ... )
    >>> X.shape, y.shape, params["V"].shape, params["Q"].shape
    ((50, 10, 3), (50, 10), (2, 1, 3), (2, 3, 3))
    >>> y_teacher = mhla_forward(X, params["V"], params["Q"], readout="all")
    >>> bool(np.allclose(y, y_teacher[..., 0]))
    True

    Variable lengths pad with trailing NaN tokens:

    >>> X, y = make_random_mhla(4, 6, 2, variable_length=(2, 6), random_state=0)
    >>> np.isnan(X).all(axis=2).sum(axis=1)  # padded tokens per sequence
    array([4, 3, 2, 0])
    >>> y.shape
    (4,)

    A teacher with one head of decay 1 and one of decay 0.5, learned back:

    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> X, y = make_random_mhla(200, 6, 2, n_heads=2, decays=[1.0, 0.5], random_state=0)
    >>> model = LinearAttentionRegressor(decay=(1.0, 0.5), n_heads="auto").fit(X, y)
    >>> model.head_decays_.tolist()
    [1.0, 0.5]
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
    """Key-value retrieval sequences labelled by the one-head associative memory.

    The task of the paper's Sec. 4.2.  Each sequence stores d key-value pairs
    as tokens ``(k_j; v_j)`` in R^(2d), j = 1..d, followed by a query token
    ``(q; zeta)`` whose key part q is one of the d keys, chosen uniformly, and
    whose value part zeta ~ N(0, I_d) is a distractor.  The targets are the
    output of the one-head MHLA with ``V = [[0, 0], [0, I]]`` and
    ``Q = [[I, 0], [0, 0]]`` (2d x 2d blocks), the query token's own term
    included, so the data is exactly realizable:

        y = (0; sum_j v_j (k_j . q) + zeta (q . q))

    With orthonormal keys this is ``(0; v_q + zeta)``: the memory retrieves
    the value stored under the query key (plus the query's own value part).

    Parameters
    ----------
    n_samples : int, default=100
        Number of sequences.
    d : int, default=4
        Dimension of keys and values; tokens have dimension 2d and each
        sequence has d + 1 tokens.  The paper uses d = 4.
    distribution : {"gaussian", "orthonormal", "mixture"}, default="gaussian"
        ``"gaussian"``: keys and values have i.i.d. N(0, 1/d) entries (so that
        ``E ||k_j||^2 = 1``, the same as an orthonormal key).
        ``"orthonormal"``: the d keys are the rows of a random (Haar)
        orthogonal matrix, and so are the d values (an independent one),
        redrawn for every sample.  ``"mixture"``: each sample is orthonormal
        with probability ``p_orthonormal``, Gaussian otherwise.  The paper's
        finding: Gaussian data identifies the memory, orthonormal data does
        not.
    p_orthonormal : float in [0, 1], default=0.5
        Probability of an orthonormal sample; used only with
        ``distribution="mixture"`` (sweep it to sweep lambda_min).
    targets : {"token", "value"}, default="token"
        ``"token"``: the paper's V literally, d_out = 2d; the first d outputs
        (the key part of the output token) are identically zero.
        ``"value"``: only the value part, ``V = [[0, I]]`` of shape d x 2d,
        d_out = d.  Prefer it for scoring: scikit-learn's R^2 of an
        identically-zero output is 0 unless the prediction is exactly 0, so a
        perfect fit of the ``"token"`` targets scores about 0.5.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the sample kinds, keys, values, query choices and zeta.
    return_params : bool, default=False
        Also return the generating parameters.

    Returns
    -------
    X : ndarray of shape (n_samples, d + 1, 2 * d), float64
        ``X[i, j] = (k_j; v_j)`` for j < d and ``X[i, d] = (q; zeta)``.
    y : ndarray of shape (n_samples, d_out), float64
        ``mhla_forward(X, V, Q)``; d_out = 2d (``targets="token"``) or d
        (``targets="value"``; shape (n_samples,) when d = 1).
    params : dict
        Only with ``return_params=True``:

        - ``"V"``: ndarray of shape (1, d_out, 2 * d), the value matrix;
        - ``"Q"``: ndarray of shape (1, 2 * d, 2 * d), the key-query matrix;
        - ``"orthonormal"``: bool ndarray of shape (n_samples,), which
          samples have orthonormal keys and values;
        - ``"query_index"``: int64 ndarray of shape (n_samples,), the key
          ``j`` with ``q = k_j``.

    Notes
    -----
    ``x_t^T Q x_q = k_t . q`` for the key-query matrix above, and ``V`` keeps
    the value part of each token, whence the closed form of y.  Orthonormal
    keys make the cubic features rank-deficient (the identifiability
    certificate fails); Gaussian keys do not.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time",
       arXiv:2410.10101, Sec. 4.2.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.datasets import make_associative_memory
    >>> X, y, params = make_associative_memory(
    ...     5, 3, distribution="orthonormal", random_state=0, return_params=True
    ... )
    >>> X.shape, y.shape, params["V"].shape
    ((5, 4, 6), (5, 6), (1, 6, 6))
    >>> keys, values, zeta = X[:, :3, :3], X[:, :3, 3:], X[:, 3, 3:]
    >>> retrieved = values[np.arange(5), params["query_index"]]
    >>> bool(np.allclose(y[:, 3:], retrieved + zeta)), bool(np.all(y[:, :3] == 0))
    (True, True)
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

    States ``"q0" .. "q{n_states-1}"``, then letters ``"a0" ..
    "a{alphabet_size-1}"``, then ``"("``, ``")"`` and the separator ``"|"``.

    Parameters
    ----------
    n_states : int
        Number of DFA states.
    alphabet_size : int
        Number of letters.

    Returns
    -------
    vocabulary : list of str
        ``vocabulary[i]`` is the token whose one-hot vector is ``e_i``;
        length ``n_states + alphabet_size + 3``.

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

    The task of the paper's App. G.4.  Each sample draws a deterministic
    finite automaton (DFA) with transition function
    ``delta: states x letters -> states`` uniformly at random (every entry
    independently uniform over the states), start state ``q0``, and a word of
    ``word_length`` letters drawn uniformly.  The sample is the string

        ( s w delta(s, w) )  for every state s and letter w   [5 tokens each]
        |                                                     [separator]
        w_0 w_1 ... w_{L-1}                                   [the word]
        |                                                     [separator]
        s^0 w_0 s^1  s^1 w_1 s^2  ...  s^{L-1} w_{L-1} s^L    [the history]

    with ``s^0 = q0`` and ``s^{t+1} = delta(s^t, w_t)``.  The table lists the
    relations in a fixed order, state-major: (q0, a0), (q0, a1), ..., (q1,
    a0), ...  The string has ``n_chars = 5 * n_states * alphabet_size +
    4 * word_length + 2`` tokens, each embedded as a one-hot vector over the
    vocabulary of :func:`dfa_vocabulary` (no positional encoding).

    The learning problem is next-token prediction with teacher forcing:
    ``X`` holds the first ``n_chars - 1`` tokens and ``y[:, t]`` the one-hot
    token ``t + 1``, so that ``y`` fits a ``readout="all"`` model directly.

    Parameters
    ----------
    n_samples : int, default=100
        Number of strings.
    n_states : int, default=3
        Number of DFA states.
    alphabet_size : int, default=2
        Number of letters.
    word_length : int, default=5
        Number of letters L of the word (and of steps in the history).
    targets : {"all", "history"}, default="all"
        ``"all"``: a target at every position.  ``"history"``: targets only
        where the next token belongs to the computation history (positions
        ``history_start - 1`` to the end, the part the DFA determines), NaN
        elsewhere.  Note that scikit-learn-style estimators accept NaN targets
        only at padded positions; use ``"history"`` to score predictions,
        ``"all"`` to fit.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the DFAs and the words.
    return_params : bool, default=False
        Also return the generating parameters.

    Returns
    -------
    X : ndarray of shape (n_samples, n_chars - 1, vocab_size), float64
        One-hot tokens of the string without its last token;
        ``vocab_size = n_states + alphabet_size + 3``.
    y : ndarray of shape (n_samples, n_chars - 1, vocab_size), float64
        ``y[:, t]`` is the one-hot of token ``t + 1`` (``y[:, t] == X[:, t +
        1]`` for ``t < n_chars - 2``; ``y[:, -1]`` is the final state
        ``s^L``).  With ``targets="history"``, ``y[:, :history_start - 1]``
        is NaN.
    params : dict
        Only with ``return_params=True``:

        - ``"vocabulary"``: list of str, the tokens in one-hot order;
        - ``"transitions"``: int64 ndarray of shape (n_samples, n_states,
          alphabet_size), ``delta[i, s, w]``;
        - ``"words"``: int64 ndarray of shape (n_samples, word_length), letter
          indices (letter ``w`` is vocabulary entry ``n_states + w``);
        - ``"states"``: int64 ndarray of shape (n_samples, word_length + 1),
          the states ``s^0 = 0, s^1, ..., s^L`` visited;
        - ``"tokens"``: int64 ndarray of shape (n_samples, n_chars), the
          whole string as vocabulary indices (``X`` is the one-hot of
          ``tokens[:, :-1]``, ``y`` of ``tokens[:, 1:]``);
        - ``"history_start"``: int, index in ``tokens`` of ``s^0``.

    Notes
    -----
    One-hot inputs make the cubic features sparse and rank-deficient: the
    global identifiability certificate fails, and per-input coverage is the
    relevant check.  Append positional encodings yourself if a construction
    needs them, e.g. ``np.concatenate([X, np.broadcast_to(np.eye(n)[None],
    (len(X), n, n))], axis=2)`` with ``n = X.shape[1]``.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time",
       arXiv:2410.10101, App. G.4.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.datasets import make_dfa_execution
    >>> X, y, params = make_dfa_execution(
    ...     2, n_states=3, alphabet_size=2, word_length=4, random_state=2,
    ...     return_params=True,
    ... )
    >>> X.shape, y.shape  # 5 * 3 * 2 + 4 * 4 + 2 = 48 tokens, 3 + 2 + 3 = 8 symbols
    ((2, 47, 8), (2, 47, 8))
    >>> names = [params["vocabulary"][i] for i in params["tokens"][0]]
    >>> " ".join(names[:30])  # the transition table
    '( q0 a0 q0 ) ( q0 a1 q1 ) ( q1 a0 q0 ) ( q1 a1 q2 ) ( q2 a0 q2 ) ( q2 a1 q0 )'
    >>> " ".join(names[30:])  # separator, word, separator, history
    '| a0 a1 a1 a1 | q0 a0 q0 q0 a1 q1 q1 a1 q2 q2 a1 q0'
    >>> bool(np.array_equal(y[:, :-1], X[:, 1:]))
    True
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
