"""Finite automata: the associative memory, one DFA transition, the universal DFA executor."""

import itertools

import numpy as np

from .._memory import real_tokens
from .._params import check_number
from ._compiler import CompiledProgram, Program, _rule_table_codes


def associative_memory_program(d):
    """The associative memory of the paper's Sec. 4.2 as a one-lookup program.

    Tokens have ``"key"`` and ``"value"`` attributes over ``range(d)``; the last
    token's key retrieves the value stored under it.

    Parameters
    ----------
    d : int
        Number of keys and of values.

    Returns
    -------
    program : CompiledProgram
        Token dimension 2d, one head.

    Examples
    --------
    >>> from sklearn_linattn.programs import associative_memory_program
    >>> memory = associative_memory_program(3)
    >>> memory.decode(memory.run([[{"key": 0, "value": 2}, {"key": 0}]], 1)[0])[-1]
    {'value': 2}
    """
    d = check_number(d, "d", integer=True, low=1)
    return (Program()
            .attribute("key", range(d))
            .attribute("value", range(d))
            .lookup(query="key", key="key", value="value", dest="value", name="retrieve")
            .compile())


def dfa_transition_program(n_states, alphabet_size):
    """One DFA transition as one lookup: find ``delta(s, w)`` in a table of tokens.

    Table tokens carry ``"table_key"`` = (s, w) and ``"table_next"``; the query
    token carries ``"current"`` = (s, w); the program writes ``"next_state"``.

    Parameters
    ----------
    n_states, alphabet_size : int
        Bounds on the states and letters of the automata read.

    Returns
    -------
    program : CompiledProgram
        Token dimension ``2 * n_states * (alphabet_size + 1)``, one head.

    Examples
    --------
    >>> from sklearn_linattn.programs import dfa_transition_program
    >>> step = dfa_transition_program(2, 2)
    >>> delta = {(0, 0): 1, (0, 1): 0, (1, 0): 1, (1, 1): 1}
    >>> prompt = [{"table_key": k, "table_next": v} for k, v in delta.items()]
    >>> step.decode(step.run([prompt + [{"current": (0, 0)}]], 1)[0])[-1]
    {'next_state': 1}
    """
    n_states = check_number(n_states, "n_states", integer=True, low=1)
    alphabet_size = check_number(alphabet_size, "alphabet_size", integer=True, low=1)
    pairs = list(itertools.product(range(n_states), range(alphabet_size)))
    return (Program()
            .attribute("table_key", pairs)
            .attribute("table_next", range(n_states))
            .attribute("current", pairs)
            .attribute("next_state", range(n_states))
            .lookup(query="current", key="table_key", value="table_next", dest="next_state",
                    name="transition")
            .compile())


def run_dfa(transitions, words, *, start=0):
    """Computation histories of deterministic finite automata (the plain loop).

    Parameters
    ----------
    transitions : array-like of int, shape (n, n_states, alphabet_size)
        ``transitions[i, s, w]``: the state automaton i enters from s on letter w.
    words : array-like of int, shape (n, length)
        Letters; trailing -1 ends a shorter word.
    start : int, default=0
        State every automaton starts in.

    Returns
    -------
    states : ndarray of int, shape (n, length + 1)
        ``s^0 = start, s^1, ...``; -1 after each word's end.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.programs import run_dfa
    >>> parity = np.array([[[0, 1], [1, 0]]] * 2)  # two copies: count the 1s, mod 2
    >>> run_dfa(parity, np.array([[1, 1, 0], [1, -1, -1]]))  # words 110 and 1
    array([[ 0,  1,  0,  0],
           [ 0,  1, -1, -1]])
    """
    transitions, words, lengths = _check_dfa(transitions, words)
    n, L = words.shape
    states = np.full((n, L + 1), -1, dtype=np.int64)
    states[:, 0] = start
    rows = np.arange(n)
    for t in range(L):  # sequential in t, vectorised over automata
        live = t < lengths
        states[live, t + 1] = transitions[rows[live], states[live, t], words[live, t]]
    return states


def _check_dfa(transitions, words):
    transitions = np.asarray(transitions)
    words = np.asarray(words)
    if transitions.ndim != 3 or transitions.dtype.kind not in "iu":
        raise ValueError(
            "transitions must be an integer array of shape (n, n_states, alphabet_size); "
            f"got dtype {transitions.dtype} and shape {transitions.shape}."
        )
    n, n_states, alphabet_size = transitions.shape
    if transitions.size and (transitions.min() < 0 or transitions.max() >= n_states):
        raise ValueError(
            f"transitions must hold states in [0, {n_states - 1}]; got values in "
            f"[{transitions.min()}, {transitions.max()}]."
        )
    if words.ndim != 2 or words.dtype.kind not in "iu" or words.shape[0] != n:
        raise ValueError(
            f"words must be an integer array of shape ({n}, length); got dtype "
            f"{words.dtype} and shape {words.shape}."
        )
    if words.size and (words.min() < -1 or words.max() >= alphabet_size):
        raise ValueError(
            f"words must hold letters in [0, {alphabet_size - 1}] (-1 after the end); got "
            f"values in [{words.min()}, {words.max()}]."
        )
    present = words >= 0
    lengths = present.sum(axis=1)
    if np.any(present != real_tokens(lengths, words.shape[1])):
        raise ValueError("words: -1 (end of word) may only be followed by -1.")
    return transitions, words, lengths


class DFAExecutor(CompiledProgram):  # numpydoc ignore=PR01
    """A universal DFA executor compiled into linear attention.

    A :class:`CompiledProgram`, built by :func:`dfa_executor_program`.

    Attributes
    ----------
    n_states, alphabet_size, max_word_length : int
        The bounds.

    Examples
    --------
    >>> from sklearn_linattn.programs import dfa_executor_program
    >>> executor = dfa_executor_program(2, 2, 3)
    >>> executor.execute([[[0, 1], [1, 0]]], [[1, 0, 1]])  # parity of the word 101
    array([[0, 1, 1, 0]])
    """

    def __init__(self, attributes, V, Q, *, head_names, n_states, alphabet_size,
                 max_word_length):
        super().__init__(attributes, V, Q, head_names=head_names)
        self.n_states = n_states
        self.alphabet_size = alphabet_size
        self.max_word_length = max_word_length

    def _check_bounds(self, transitions, words):
        transitions, words, lengths = _check_dfa(transitions, words)
        _, S, A = transitions.shape
        if S > self.n_states or A > self.alphabet_size or words.shape[1] > self.max_word_length:
            raise ValueError(
                f"the executor runs automata of at most {self.n_states} states and "
                f"{self.alphabet_size} letters on words of at most {self.max_word_length} "
                f"letters; got {S} states, {A} letters and words of {words.shape[1]}."
            )
        if lengths.size and lengths.min() < 1:
            raise ValueError("every word needs at least one letter.")
        return transitions, words, lengths

    def prompts(self, transitions, words):
        """Encode automata and words: table tokens, word tokens, the start token.

        Parameters
        ----------
        transitions : array-like of int, shape (n, n_states, alphabet_size)
            Within the executor's bounds.
        words : array-like of int, shape (n, length)
            Non-empty words; trailing -1 ends a shorter word.

        Returns
        -------
        X : ndarray of shape (n, n_tokens, d)
            ``n_states * alphabet_size`` table tokens, the word, then the start
            token; NaN-padded.

        Examples
        --------
        >>> from sklearn_linattn.programs import dfa_executor_program
        >>> executor = dfa_executor_program(2, 2, 3)
        >>> X = executor.prompts([[[0, 1], [1, 0]]], [[1, 0]])
        >>> X.shape, executor.decode(X[0])[-1]  # 4 table tokens, 2 letters, the start token
        ((1, 7, 35), {'state_at': (0, 0)})
        """
        return self._prompts(*self._check_bounds(transitions, words))

    def _prompts(self, transitions, words, lengths):
        n, S, A = transitions.shape
        L = words.shape[1]
        n_table = S * A
        n_tok = n_table + L + 1
        codes = _rule_table_codes(
            ("table_key", "table_next", "word_index", "letter_at", "state_at"), n, n_tok,
            key="table_key", shape=(S, A), width=self.alphabet_size)
        codes["table_next"][:, :n_table] = transitions.reshape(n, n_table)
        t = np.arange(L)
        present = words >= 0
        codes["word_index"][:, n_table:n_table + L] = np.where(present, t, -1)
        # letter_at holds pairs (letter, index), letter-major.
        codes["letter_at"][:, n_table:n_table + L] = np.where(
            present, words * self.max_word_length + t, -1)
        # The start token follows each word's last letter; state_at = (0, 0).
        rows = np.arange(n)
        codes["state_at"][rows, n_table + lengths] = 0
        return self.encode_indices(codes, n_table + lengths + 1)

    def histories(self, transitions, words, *, model=None):
        """Prompts followed by the generated computation histories.

        Parameters
        ----------
        transitions, words : array-like of int
            The automata and their words, as for :meth:`prompts`.
        model : None or estimator with ``generate``, default=None
            None runs the compiled program, else ``model.generate`` rounding with :meth:`round`.

        Returns
        -------
        sequences : ndarray of shape (n, n_tokens, d)
            Each prompt and two tokens per letter (transition, then state),
            NaN-padded.

        Examples
        --------
        >>> from sklearn_linattn.programs import dfa_executor_program
        >>> executor = dfa_executor_program(2, 2, 3)
        >>> out = executor.histories([[[0, 1], [1, 0]]], [[1, 0]])
        >>> out.shape, executor.decode(out[0])[-1]  # 7 prompt tokens, 2 per letter
        ((1, 11, 35), {'state_at': (1, 2)})
        """
        return self._histories(*self._check_bounds(transitions, words), model)

    def _histories(self, transitions, words, lengths, model):
        X = self._prompts(transitions, words, lengths)
        n_steps = 2 * int(lengths.max())
        out = self._generate(X, n_steps, model)
        # Every sequence generates as many steps as the longest word needs, so
        # a shorter word's history ends early: what follows is padding.
        n_table = transitions.shape[1] * transitions.shape[2]
        end = n_table + 3 * lengths + 1
        out[~real_tokens(end, out.shape[1])] = np.nan
        return out[:, : int(end.max())]

    def execute(self, transitions, words, *, model=None):
        """States visited, read from the generated history.

        Parameters
        ----------
        transitions, words : array-like of int
            The automata and their words, as for :meth:`prompts`.
        model : None or estimator with ``generate``, default=None
            What generates the histories, as for :meth:`histories`.

        Returns
        -------
        states : ndarray of int, shape (n, length + 1)
            As :func:`run_dfa`; also -1 where a state token is not a clean one-hot
            with the right step.

        Examples
        --------
        >>> from sklearn_linattn.programs import dfa_executor_program
        >>> executor = dfa_executor_program(2, 2, 3)
        >>> executor.execute([[[0, 1], [1, 0]]], [[1, -1, -1]])  # parity of the word 1
        array([[ 0,  1, -1, -1]])
        """
        transitions, words, lengths = self._check_bounds(transitions, words)
        out = self._histories(transitions, words, lengths, model)
        n, L = words.shape
        n_table = transitions.shape[1] * transitions.shape[2]
        steps = np.arange(L + 1)
        pos = n_table + lengths[:, None] + 2 * steps[None, :]  # state tokens
        live = steps[None, :] <= lengths[:, None]
        pos = np.where(live, pos, 0)
        code = self.values(out[np.arange(n)[:, None], pos], "state_at")
        state, step = np.divmod(code, self.max_word_length + 1)
        ok = live & (code >= 0) & (step == steps[None, :])
        return np.where(ok, state, -1)


def dfa_executor_program(n_states, alphabet_size, max_word_length):
    """Compile a universal DFA executor: given a transition table and a word, write the history.

    Exact on every automaton and word within the bounds; see the user guide's
    :doc:`/programs` page for the construction.

    Parameters
    ----------
    n_states, alphabet_size, max_word_length : int
        The bounds.

    Returns
    -------
    executor : DFAExecutor
        ``n_states + max_word_length`` heads.

    See Also
    --------
    run_dfa : The same histories from a plain loop.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.programs import dfa_executor_program, run_dfa
    >>> parity, words = np.array([[[0, 1], [1, 0]]]), np.array([[1, 1, 0, 1]])
    >>> dfa_executor_program(2, 2, 4).execute(parity, words)  # count the 1s, mod 2
    array([[0, 1, 0, 0, 1]])
    >>> run_dfa(parity, words)
    array([[0, 1, 0, 0, 1]])
    """
    S = check_number(n_states, "n_states", integer=True, low=1)
    A = check_number(alphabet_size, "alphabet_size", integer=True, low=1)
    L = check_number(max_word_length, "max_word_length", integer=True, low=1)
    program = (Program()
               .attribute("table_key", itertools.product(range(S), range(A)))
               .attribute("table_next", range(S))
               .attribute("word_index", range(L))
               .attribute("letter_at", itertools.product(range(A), range(L)))
               .attribute("state_at", itertools.product(range(S), range(L + 1)))
               .attribute("transition", itertools.product(range(S), range(A), range(L))))
    for s in range(S):
        program.lookup(
            query="state_at", key="word_index", value="letter_at", dest="transition",
            match=lambda q, s=s: q[1] if q[0] == s and q[1] < L else None,
            write=lambda v, s=s: (s, v[0], v[1]),
            name=f"read letter | state {s}",
        )
    for t in range(L):
        program.lookup(
            query="transition", key="table_key", value="table_next", dest="state_at",
            match=lambda q, t=t: q[:2] if q[2] == t else None,
            write=lambda s2, t=t: (s2, t + 1),
            name=f"step {t}",
        )
    compiled = program.compile()
    return DFAExecutor(compiled.attributes, compiled.V, compiled.Q,
                       head_names=compiled.head_names, n_states=S, alphabet_size=A,
                       max_word_length=L)
