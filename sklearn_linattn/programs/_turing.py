"""Bounded Turing machines: the plain loop and the simulator compiled into attention."""

import itertools

import numpy as np

from .._params import check_number
from ._compiler import CompiledProgram, Program, _rule_table_codes

#: Head moves of :func:`turing_machine_program`, in one-hot order.
MOVES = (-1, 0, 1)


def _check_machines(next_state, write, move, tapes):
    arrays = {}
    for name, value in (("next_state", next_state), ("write", write), ("move", move)):
        a = np.asarray(value)
        if a.ndim != 3 or a.dtype.kind not in "iu":
            raise ValueError(
                f"{name} must be an integer array of shape (n, n_states, n_symbols); got "
                f"dtype {a.dtype} and shape {a.shape}."
            )
        arrays[name] = a
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) != 1:
        raise ValueError(
            "next_state, write and move must have the same shape (n, n_states, n_symbols); "
            f"got {[a.shape for a in arrays.values()]}."
        )
    n, n_states, n_symbols = shapes.pop()
    for name, high in (("next_state", n_states), ("write", n_symbols)):
        a = arrays[name]
        if a.size and (a.min() < 0 or a.max() >= high):
            raise ValueError(f"{name} must hold values in [0, {high - 1}]; got values in "
                             f"[{a.min()}, {a.max()}].")
    if not np.isin(arrays["move"], MOVES).all():
        raise ValueError(f"move must hold -1, 0 or 1; got {np.unique(arrays['move']).tolist()}.")
    tapes = np.asarray(tapes)
    if tapes.ndim != 2 or tapes.dtype.kind not in "iu" or tapes.shape[0] != n:
        raise ValueError(f"tapes must be an integer array of shape ({n}, tape_length); got "
                         f"dtype {tapes.dtype} and shape {tapes.shape}.")
    if tapes.size and (tapes.min() < 0 or tapes.max() >= n_symbols):
        raise ValueError(f"tapes must hold symbols in [0, {n_symbols - 1}]; got values in "
                         f"[{tapes.min()}, {tapes.max()}].")
    return arrays["next_state"], arrays["write"], arrays["move"], tapes


def run_turing_machine(next_state, write, move, tapes, n_steps):
    """Run Turing machines on a bounded tape (the plain loop).

    Every machine starts in state 0 on cell 0.  A step in state q reading g
    writes ``write[q, g]``, moves the head by ``move[q, g]`` (it stays put at
    either end of the tape) and enters ``next_state[q, g]``.

    Parameters
    ----------
    next_state, write, move : array-like of int, shape (n, n_states, n_symbols)
        The machines' rules; moves are -1, 0 or 1.
    tapes : array-like of int, shape (n, tape_length)
        Initial tape contents.
    n_steps : int
        Number of steps every machine runs.

    Returns
    -------
    states, heads : ndarray of int, shape (n, n_steps + 1)
        State and head position before each step, and after the last.
    tapes : ndarray of int, shape (n, n_steps + 1, tape_length)
        Tape contents at the same times.

    Examples
    --------
    >>> from sklearn_linattn.programs import run_turing_machine
    >>> rules = dict(next_state=[[[0, 0]]], write=[[[1, 1]]], move=[[[1, 1]]])
    >>> states, heads, tapes = run_turing_machine(**rules, tapes=[[0, 0, 0]], n_steps=3)
    >>> heads[0], tapes[0, -1]  # write 1 and move right; stay put at the end
    (array([0, 1, 2, 2]), array([1, 1, 1]))
    """
    next_state, write, move, tape = _check_machines(next_state, write, move, tapes)
    n_steps = check_number(n_steps, "n_steps", integer=True, low=0)
    n, T = tape.shape
    rows = np.arange(n)
    states = np.zeros((n, n_steps + 1), dtype=np.int64)
    heads = np.zeros((n, n_steps + 1), dtype=np.int64)
    history = np.empty((n, n_steps + 1, T), dtype=np.int64)
    tape = tape.astype(np.int64)
    history[:, 0] = tape
    for t in range(n_steps):  # sequential in t, vectorised over machines
        q, h = states[:, t], heads[:, t]
        g = tape[rows, h]
        tape = tape.copy()
        tape[rows, h] = write[rows, q, g]
        states[:, t + 1] = next_state[rows, q, g]
        heads[:, t + 1] = np.clip(h + move[rows, q, g], 0, T - 1)
        history[:, t + 1] = tape
    return states, heads, history


class TuringMachineSimulator(CompiledProgram):  # numpydoc ignore=PR01
    """A bounded Turing-machine simulator compiled into linear attention.

    A :class:`CompiledProgram`, built by :func:`turing_machine_program`.

    Attributes
    ----------
    n_states, n_symbols, tape_length, max_steps : int
        The bounds.

    Examples
    --------
    >>> from sklearn_linattn.programs import turing_machine_program
    >>> tm = turing_machine_program(2, 3, tape_length=5, max_steps=6)
    >>> tm.n_states, tm.n_symbols, tm.tape_length, tm.max_steps
    (2, 3, 5, 6)
    """

    def __init__(self, attributes, V, Q, *, head_names, max_length, n_states, n_symbols,
                 tape_length, max_steps):
        super().__init__(attributes, V, Q, head_names=head_names, max_length=max_length)
        self.n_states = n_states
        self.n_symbols = n_symbols
        self.tape_length = tape_length
        self.max_steps = max_steps

    def _check(self, next_state, write, move, tapes):
        next_state, write, move, tapes = _check_machines(next_state, write, move, tapes)
        _, S, G = next_state.shape
        if S > self.n_states or G > self.n_symbols or tapes.shape[1] != self.tape_length:
            raise ValueError(
                f"the simulator runs machines of at most {self.n_states} states and "
                f"{self.n_symbols} symbols on tapes of exactly {self.tape_length} cells; got "
                f"{S} states, {G} symbols and tapes of {tapes.shape[1]} cells."
            )
        return next_state, write, move, tapes

    def prompts(self, next_state, write, move, tapes):
        """Encode machines and tapes: rule tokens, tape tokens, the start token.

        Parameters
        ----------
        next_state, write, move : array-like of int, shape (n, n_states, n_symbols)
            The rules, as for :func:`run_turing_machine`, within the bounds.
        tapes : array-like of int, shape (n, tape_length)
            Initial tapes of exactly ``tape_length`` cells.

        Returns
        -------
        X : ndarray of shape (n, n_rules + tape_length + 1, d)
            One token per rule (``n_rules = n_states * n_symbols`` as given), one
            per cell, then the start token.

        Examples
        --------
        >>> from sklearn_linattn.programs import turing_machine_program
        >>> tm = turing_machine_program(1, 2, tape_length=3, max_steps=3)
        >>> rules = dict(next_state=[[[0, 0]]], write=[[[1, 1]]], move=[[[1, 1]]])
        >>> tm.prompts(**rules, tapes=[[0, 0, 0]]).shape  # 2 rules, 3 cells, the start token
        (1, 6, 56)
        """
        next_state, write, move, tapes = self._check(next_state, write, move, tapes)
        n, S, G = next_state.shape
        T = self.tape_length
        n_rules = S * G
        n_tok = n_rules + T + 1
        codes = _rule_table_codes(("rule_key", "rule_action", "cell", "plus", "state"), n,
                                  n_tok, key="rule_key", shape=(S, G), width=self.n_symbols)
        # rule_action holds (next state, symbol written, move), in product order.
        action = ((next_state * self.n_symbols + write) * len(MOVES) + (move + 1))
        codes["rule_action"][:, :n_rules] = action.reshape(n, n_rules)
        cells = np.arange(T)
        codes["cell"][:, n_rules:n_rules + T] = cells
        codes["plus"][:, n_rules:n_rules + T] = cells * self.n_symbols + tapes
        codes["state"][:, -1] = 0  # state 0, head on cell 0
        return self.encode_indices(codes)

    def histories(self, next_state, write, move, tapes, n_steps, *, model=None):
        """Prompts followed by ``3 * n_steps`` generated tokens (three per step).

        Parameters
        ----------
        next_state, write, move, tapes : array-like of int
            The machines and tapes, as for :meth:`prompts`.
        n_steps : int
            Steps to simulate, at most ``max_steps``.
        model : None or estimator with ``generate``, default=None
            None runs the compiled program, else ``model.generate`` rounding with :meth:`round`.

        Returns
        -------
        sequences : ndarray of shape (n, n_prompt + 3 * n_steps, d)
            Each prompt followed by a read, a write and a state token per step.

        Examples
        --------
        >>> from sklearn_linattn.programs import turing_machine_program
        >>> tm = turing_machine_program(1, 2, tape_length=3, max_steps=3)
        >>> rules = dict(next_state=[[[0, 0]]], write=[[[1, 1]]], move=[[[1, 1]]])
        >>> out = tm.histories(**rules, tapes=[[0, 0, 0]], n_steps=1)
        >>> tm.decode(out[0])[-1]  # after one step: state 0, head on cell 1
        {'state': (0, 1)}
        """
        X = self.prompts(next_state, write, move, tapes)
        n_steps = check_number(n_steps, "n_steps", integer=True, low=0, high=self.max_steps)
        return self._generate(X, 3 * n_steps, model)

    def execute(self, next_state, write, move, tapes, n_steps, *, model=None):
        """States, head positions and tapes read from the generated history.

        Parameters
        ----------
        next_state, write, move, tapes : array-like of int
            The machines and tapes, as for :meth:`prompts`.
        n_steps : int
            Steps to simulate, at most ``max_steps``.
        model : None or estimator with ``generate``, default=None
            What generates the histories, as for :meth:`histories`.

        Returns
        -------
        states, heads : ndarray of int, shape (n, n_steps + 1)
            As :func:`run_turing_machine`; -1 where a state token is not clean.
        tapes : ndarray of int, shape (n, n_steps + 1, tape_length)
            The tapes replayed from the write tokens; -1 where one is not clean.

        Examples
        --------
        >>> from sklearn_linattn.programs import turing_machine_program
        >>> tm = turing_machine_program(1, 2, tape_length=3, max_steps=3)
        >>> rules = dict(next_state=[[[0, 0]]], write=[[[1, 1]]], move=[[[1, 1]]])
        >>> states, heads, tapes = tm.execute(**rules, tapes=[[0, 0, 0]], n_steps=3)
        >>> heads[0], tapes[0, -1]  # as run_turing_machine
        (array([0, 1, 2, 2]), array([1, 1, 1]))
        """
        out = self.histories(next_state, write, move, tapes, n_steps, model=model)
        n = out.shape[0]
        T, G = self.tape_length, self.n_symbols
        start = out.shape[1] - 3 * n_steps - 1  # the start token
        code = self.values(out[:, start::3], "state")  # (n, n_steps + 1)
        states = np.where(code >= 0, code // T, -1)
        heads = np.where(code >= 0, code % T, -1)
        written = self.values(out[:, start + 2::3], "plus")  # (n, n_steps)
        history = np.empty((n, n_steps + 1, T), dtype=np.int64)
        history[:, 0] = tapes
        rows = np.arange(n)
        # The history holds each step's write, not the tape: replay the writes.
        for t in range(n_steps):
            history[:, t + 1] = history[:, t]
            ok = written[:, t] >= 0
            cell, symbol = np.divmod(written[:, t], G)
            history[rows[ok], t + 1, cell[ok]] = symbol[ok]
            history[~ok, t + 1] = -1
        return states, heads, history


def turing_machine_program(n_states, n_symbols, tape_length, max_steps):
    """Compile a universal simulator of Turing machines with a bounded tape and run time.

    It reproduces :func:`run_turing_machine` within its bounds; see the user
    guide's :doc:`/programs` page for the construction.

    Parameters
    ----------
    n_states, n_symbols : int
        Bounds on the machines' states and tape symbols.
    tape_length : int
        Number of cells; the head stays put at either end.
    max_steps : int
        Steps the positions allow.

    Returns
    -------
    simulator : TuringMachineSimulator
        ``2 * n_states + 2 * tape_length + 4`` heads.

    See Also
    --------
    run_turing_machine : The same runs from a plain loop.

    Examples
    --------
    >>> from sklearn_linattn.programs import turing_machine_program
    >>> tm = turing_machine_program(2, 3, tape_length=5, max_steps=6)
    >>> tm.d, tm.n_heads, tm.max_length
    (159, 18, 30)
    """
    S = check_number(n_states, "n_states", integer=True, low=1)
    G = check_number(n_symbols, "n_symbols", integer=True, low=1)
    T = check_number(tape_length, "tape_length", integer=True, low=1)
    K = check_number(max_steps, "max_steps", integer=True, low=1)
    program = (Program(max_length=S * G + T + 1 + 3 * K)
               .attribute("rule_key", itertools.product(range(S), range(G)))
               .attribute("rule_action", itertools.product(range(S), range(G), MOVES))
               .attribute("cell", range(T))
               .attribute("plus", itertools.product(range(T), range(G)))
               .attribute("minus", itertools.product(range(T), range(G)))
               .attribute("state", itertools.product(range(S), range(T)))
               .attribute("read", itertools.product(range(S), range(T), range(G)))
               .attribute("pending", itertools.product(range(S), range(T), MOVES)))
    for q in range(S):
        for sign, src in ((1.0, "plus"), (-1.0, "minus")):
            program.lookup(
                query="state", key="cell", value=src, dest="read",
                match=lambda v, q=q: v[1] if v[0] == q else None,
                write=lambda v, q=q: (q, v[0], v[1]), scale=sign,
                name=f"read {src} | state {q}",
            )
    program.copy("read", dest="cell", write=lambda v: v[1], name="write token: cell")
    program.copy("read", dest="minus", write=lambda v: v[1:], name="write token: minus")
    for h in range(T):
        def rule(v, h=h):
            return (v[0], v[2]) if v[1] == h else None
        program.lookup(query="read", key="rule_key", value="rule_action", dest="plus",
                       match=rule, write=lambda a, h=h: (h, a[1]), name=f"write | head {h}")
        program.lookup(query="read", key="rule_key", value="rule_action", dest="pending",
                       match=rule, write=lambda a, h=h: (a[0], h, a[2]),
                       name=f"move | head {h}")
    program.copy("pending", dest="state",
                 write=lambda p: (p[0], min(max(p[1] + p[2], 0), T - 1)), name="state")
    compiled = program.compile()
    return TuringMachineSimulator(
        compiled.attributes, compiled.V, compiled.Q, head_names=compiled.head_names,
        max_length=compiled.max_length, n_states=S, n_symbols=G, tape_length=T,
        max_steps=K)
