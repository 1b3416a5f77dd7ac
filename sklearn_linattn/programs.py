"""Programs as linear attention: compile lookup programs into MHLA weights.

A token is an object with attributes; each attribute takes values in its own
finite alphabet and occupies a one-hot block of the token vector (an absent
attribute is an all-zero block).  A *lookup* is one attention head: the last
token's ``query`` attribute, mapped by a fixed table, selects every token
whose ``key`` attribute has the mapped value, and their ``value`` attributes,
mapped by a second table, are written into the ``dest`` attribute of the
output (the paper's Appendix B/F; DESIGN.md section 7).  With ``Q_h`` holding
the first table between the query block (columns) and the key block (rows)
and ``V_h`` the second between the value block (columns) and the destination
block (rows), the head's output

    V_h sum_t x_t (x_t^T Q_h x_last)

is exactly that sum.  Run autoregressively -- append the output, rounded to
the nearest token, and repeat -- a handful of such heads executes finite
automata: :func:`dfa_executor_program` writes the computation history of any
automaton within its bounds, given its transition table and word as tokens.

Everything compiles to plain ``(V, Q)`` arrays, so the programs' traces can be
learned back with :class:`~sklearn_linattn.LinearAttentionRegressor` and the
learned model checked with its certificate's ``covers``.

Mapping to the paper: ``X[i]`` (n_tokens x d) is the paper's ``Z_i^T``.
"""

import itertools
from collections.abc import Hashable, Mapping

import numpy as np

from ._attention import mhla_forward, mhla_generate
from ._validation import check_scalar, check_sequences

__all__ = [
    "CompiledProgram",
    "DFAExecutor",
    "Program",
    "associative_memory_program",
    "dfa_executor_program",
    "dfa_transition_program",
    "TuringMachineSimulator",
    "next_token_dataset",
    "run_dfa",
    "run_turing_machine",
    "turing_machine_program",
]

#: Name of the positional attribute of programs built with ``max_length``.
POSITION = "position"


def _show(values, limit=6):
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:limit])
    return f"[{shown}{', ...' if len(values) > limit else ''}] ({len(values)} values)"


def _as_map(table, name):
    """A function value -> value or None, from None (identity), a mapping or a callable."""
    if table is None:
        return lambda v: v
    if isinstance(table, Mapping):
        return table.get
    if callable(table):
        return table
    raise TypeError(
        f"{name} must be None (identity), a mapping or a callable; got "
        f"{type(table).__name__}."
    )


def _layout(attributes):
    """One-hot layout of attributes in declaration order: slices, d, value -> index maps."""
    layout, offset = {}, 0
    for attr, values in attributes.items():
        layout[attr] = slice(offset, offset + len(values))
        offset += len(values)
    index = {attr: {v: i for i, v in enumerate(values)} for attr, values in attributes.items()}
    return layout, offset, index


def _is_tokens(prompts):
    """Whether prompts are attribute mappings (for encode) rather than vectors."""
    if isinstance(prompts, np.ndarray) or not isinstance(prompts, (list, tuple)) or not prompts:
        return False
    first = prompts[0]
    return isinstance(first, Mapping) or (
        isinstance(first, (list, tuple)) and bool(first) and isinstance(first[0], Mapping))


class Program:
    """A lookup program: attributes with finite alphabets and lookup heads.

    Declare attributes, then primitives; :meth:`compile` lays the attributes
    out as one-hot blocks (in declaration order) and returns the value and
    key-query matrices, one head per primitive.

    Parameters
    ----------
    max_length : int or None, default=None
        With an int, tokens carry a one-hot positional encoding (attribute
        ``"position"``, values ``0 .. max_length - 1``, filled in by
        :meth:`CompiledProgram.encode`), and the compiled program has one more
        head, first, that writes ``position + 1`` into every generated token.
        :meth:`copy` and :meth:`if_then` need positions.

    See Also
    --------
    CompiledProgram : the compiled weights, encoding and execution.

    Examples
    --------
    Copy the letter two tokens back (a shift register):

    >>> from sklearn_linattn.programs import Program
    >>> program = (Program(max_length=8)
    ...            .attribute("letter", "ab")
    ...            .copy("letter", offset=-2)
    ...            .compile())
    >>> program.d, program.n_heads  # 8 positions + 2 letters; position + copy heads
    (10, 2)
    >>> out = program.run(program.encode([[{"letter": "a"}, {"letter": "b"}]]), 4)
    >>> "".join(t["letter"] for t in program.decode(out[0]))
    'ababab'
    """

    def __init__(self, *, max_length=None):
        self.max_length = check_scalar(max_length, "max_length", integer=True, low=1,
                                       allow_none=True)
        self._attributes = {}
        self._lookups = []
        if self.max_length is not None:
            self._add(POSITION, range(self.max_length))

    def __repr__(self):
        return (
            f"Program(max_length={self.max_length}, attributes={list(self._attributes)}, "
            f"lookups={[h['name'] for h in self._lookups]})"
        )

    def _add(self, name, values):
        values = tuple(values)
        if not values:
            raise ValueError(f"attribute {name!r} needs a non-empty alphabet; got no values.")
        for v in values:
            if not isinstance(v, Hashable):
                raise TypeError(
                    f"values of attribute {name!r} must be hashable; got "
                    f"{type(v).__name__} {v!r}."
                )
        if len(set(values)) != len(values):
            seen, dup = set(), []
            for v in values:
                if v in seen:
                    dup.append(v)
                seen.add(v)
            raise ValueError(f"attribute {name!r} lists values more than once: {dup[:5]!r}.")
        self._attributes[name] = values

    def attribute(self, name, values):
        """Declare an attribute and its alphabet.

        Parameters
        ----------
        name : str
            Attribute name; ``"position"`` is reserved for positions.
        values : iterable of hashable
            The alphabet, in one-hot order (e.g. ``range(4)``, ``"ab"``, or
            ``itertools.product(...)`` for an attribute holding pairs).

        Returns
        -------
        self : Program
        """
        if not isinstance(name, str):
            raise TypeError(f"attribute name must be a str; got {type(name).__name__}.")
        if name == POSITION:
            raise ValueError(
                f"attribute name {POSITION!r} is reserved: pass max_length to Program for "
                "positional encodings."
            )
        if name in self._attributes:
            raise ValueError(f"attribute {name!r} is already declared.")
        self._add(name, values)
        return self

    def _check_attribute(self, name, role):
        if name not in self._attributes:
            raise ValueError(
                f"{role} refers to unknown attribute {name!r}; declared attributes: "
                f"{list(self._attributes)}."
            )

    def _need_positions(self, what):
        if self.max_length is None:
            raise ValueError(
                f"{what} matches tokens by position: create the Program with max_length "
                "to give tokens positional encodings."
            )

    def lookup(self, *, query, key, value, dest, match=None, write=None, scale=1.0,
               name=None):
        """Add one head: look up ``key == match(query)``, write ``write(value)`` to ``dest``.

        Every token t of the sequence (the last one included) with
        ``t.key == match(last.query)`` contributes ``write(t.value)`` to the
        ``dest`` attribute of the output; several matching tokens add up, so a
        program must keep the keys it looks up unique.

        Parameters
        ----------
        query, key, value, dest : str
            Attribute names.
        match : None, mapping or callable, default=None
            Query value -> key value to look for, or None for "look up
            nothing".  None means identity (query and key share values).
        write : None, mapping or callable, default=None
            Value -> destination value, or None for "write nothing".  None
            means identity.
        scale : float, default=1.0
            Multiplies what the head writes.  ``-1`` subtracts: paired with a
            ``+1`` head it lets matches cancel, as in the telescoping tape of
            :func:`turing_machine_program`.
        name : str or None, default=None
            Head name (default ``"lookup <dest> <- <value> by <key>"``).

        Returns
        -------
        self : Program
        """
        for attr, role in ((query, "query"), (key, "key"), (value, "value"), (dest, "dest")):
            self._check_attribute(attr, f"lookup {role}")
        match = _as_map(match, "match")
        write = _as_map(write, "write")
        scale = check_scalar(scale, "scale")
        if scale == 0:
            raise ValueError("scale must be non-zero; got 0.")
        self._lookups.append(dict(
            name=name or f"lookup {dest} <- {value} by {key}",
            query=query, key=key, value=value, dest=dest, match=match, write=write,
            scale=float(scale),
        ))
        return self

    def copy(self, attribute, *, offset=-1, dest=None, write=None, name=None):
        """Add one head copying an attribute from a fixed relative position.

        Parameters
        ----------
        attribute : str
            Attribute to copy.
        offset : int, default=-1
            Source position relative to the token being generated: -1 is the
            last token of the sequence, -2 the one before, and so on.
        dest : str or None, default=None
            Destination attribute (default: ``attribute``); its alphabet must
            contain the copied (mapped) values.
        write : None, mapping or callable, default=None
            Map applied to the copied value, as in :meth:`lookup` (None:
            identity).  ``offset=-1`` with a map transforms the last token.
        name : str or None, default=None

        Returns
        -------
        self : Program
        """
        self._need_positions("copy")
        offset = check_scalar(offset, "offset", integer=True, high=-1)
        dest = attribute if dest is None else dest
        self._check_attribute(attribute, "copy")
        self._check_attribute(dest, "copy dest")

        def match(p):
            # The last token sits at p; the generated one at p + 1.
            src = p + 1 + offset
            return src if src >= 0 else None

        return self.lookup(query=POSITION, key=POSITION, value=attribute, dest=dest,
                           match=match, write=write,
                           name=name or f"copy {dest} <- {attribute}[{offset}]")

    def if_then(self, attribute, table, *, dest=None, name=None):
        """Add one head: if the last token's attribute equals a, write table[a] to dest.

        The paper's if-then primitive (its Algorithm 5) spends k tokens writing
        the table (a_i, b_i) into scratch attributes and then looks the
        attribute up in it.  A constant table needs neither: the head looks up
        the last token itself (by its position) and maps the value through the
        table in its value matrix.  A table that is *data* -- written in the
        sequence, like a DFA's transition table -- is a plain :meth:`lookup`
        into the tokens that hold it.

        Parameters
        ----------
        attribute : str
        table : mapping
            Value of ``attribute`` -> value of ``dest``; values not in the
            table write nothing.
        dest : str or None, default=None
            Destination attribute (default: ``attribute``).
        name : str or None, default=None

        Returns
        -------
        self : Program
        """
        self._need_positions("if_then")
        if not isinstance(table, Mapping):
            raise TypeError(f"table must be a mapping; got {type(table).__name__}.")
        dest = attribute if dest is None else dest
        self._check_attribute(attribute, "if_then")
        self._check_attribute(dest, "if_then dest")
        return self.lookup(query=POSITION, key=POSITION, value=attribute, dest=dest,
                           write=table, name=name or f"if_then {dest} <- {attribute}")

    def compile(self):
        """Lay out the attributes and build the heads.

        Returns
        -------
        program : CompiledProgram

        Raises
        ------
        ValueError
            No lookup; a ``match`` or ``write`` table producing a value outside
            the target attribute's alphabet; a head that never matches or
            never writes.
        """
        if not self._lookups:
            raise ValueError("the program has no lookup: add at least one before compile().")
        layout, d, index = _layout(self._attributes)
        heads = list(self._lookups)
        if self.max_length is not None:
            last = self.max_length - 1
            heads.insert(0, dict(
                name="advance position", query=POSITION, key=POSITION, value=POSITION,
                dest=POSITION, match=lambda p: p, write=lambda p: p + 1 if p < last else None,
                scale=1.0,
            ))
        V = np.zeros((len(heads), d, d))
        Q = np.zeros((len(heads), d, d))
        for h, head in enumerate(heads):
            for matrix, src, tgt, fn, what in (
                (Q, head["query"], head["key"], head["match"], "match"),
                (V, head["value"], head["dest"], head["write"], "write"),
            ):
                for i, v in enumerate(self._attributes[src]):
                    out = fn(v)
                    if out is None:
                        continue
                    j = index[tgt].get(out) if isinstance(out, Hashable) else None
                    if j is None:
                        raise ValueError(
                            f"alphabet overflow in {head['name']!r}: {what} maps {src!r} value "
                            f"{v!r} to {out!r}, which is not in the alphabet of {tgt!r}: "
                            f"{_show(self._attributes[tgt])}."
                        )
                    weight = head["scale"] if matrix is V else 1.0
                    matrix[h, layout[tgt].start + j, layout[src].start + i] = weight
            if not Q[h].any():
                raise ValueError(f"{head['name']!r} never matches: its match maps every "
                                 f"value of {head['query']!r} to None.")
            if not V[h].any():
                raise ValueError(f"{head['name']!r} never writes: its write maps every "
                                 f"value of {head['value']!r} to None.")
        return CompiledProgram(dict(self._attributes), V, Q,
                               head_names=[h["name"] for h in heads],
                               max_length=self.max_length)


class CompiledProgram:
    """Value and key-query matrices of a lookup program, with its token encoding.

    Built by :meth:`Program.compile` or the program functions of this module.

    Attributes
    ----------
    V : ndarray of shape (n_heads, d, d)
        Value matrices (output dimension = token dimension, so the program
        can run autoregressively).
    Q : ndarray of shape (n_heads, d, d)
        Key-query matrices.
    d : int
        Token dimension: the sum of the alphabet sizes.
    n_heads : int
    head_names : list of str
    attributes : dict
        Attribute name -> tuple of values, in layout order.
    layout : dict
        Attribute name -> slice of the token vector holding its one-hot block.
    max_length : int or None
        Number of positions, or None without positional encodings.
    """

    def __init__(self, attributes, V, Q, *, head_names, max_length=None):
        self.attributes = dict(attributes)
        self.layout, self.d, self._index = _layout(self.attributes)
        self.V = np.asarray(V, dtype=np.float64)
        self.Q = np.asarray(Q, dtype=np.float64)
        self.n_heads = self.V.shape[0]
        self.head_names = list(head_names)
        self.max_length = max_length

    def __repr__(self):
        return (
            f"{type(self).__name__}(d={self.d}, n_heads={self.n_heads}, "
            f"attributes={list(self.attributes)}, max_length={self.max_length})"
        )

    # ------------------------------------------------------------ encoding

    def _index_of(self, attr, value, where):
        if attr not in self._index:
            raise ValueError(
                f"{where}: unknown attribute {attr!r}; the program's attributes: "
                f"{list(self.attributes)}."
            )
        i = self._index[attr].get(value) if isinstance(value, Hashable) else None
        if i is None:
            raise ValueError(
                f"{where}: value {value!r} is not in the alphabet of {attr!r}: "
                f"{_show(self.attributes[attr])}."
            )
        return i

    def encode(self, tokens):
        """Token vectors from attribute values.

        Parameters
        ----------
        tokens : list of mappings, or list of lists of mappings
            One sequence (each token a mapping attribute -> value; absent
            attributes are all-zero blocks), or a batch of sequences.
            Positions are filled in (token i gets position i); do not pass them.

        Returns
        -------
        X : ndarray of shape (n_tokens, d), or (n_sequences, max_tokens, d)
            A batch is NaN-padded at the end (the package's padding rule).
        """
        if isinstance(tokens, Mapping) or not len(tokens):
            raise ValueError(
                "tokens must be a non-empty list of mappings (one sequence) or of lists of "
                f"mappings (a batch); got {type(tokens).__name__} of length "
                f"{len(tokens) if hasattr(tokens, '__len__') else '?'}."
            )
        single = isinstance(tokens[0], Mapping)
        batch = [tokens] if single else list(tokens)
        lengths = np.array([len(seq) for seq in batch])
        if lengths.min() == 0:
            raise ValueError(f"sequence {int(np.argmin(lengths))} of tokens is empty.")
        self._check_length(int(lengths.max()), "encode")
        codes = {attr: np.full((len(batch), int(lengths.max())), -1, dtype=np.int64)
                 for attr in self.attributes if attr != POSITION}
        for s, seq in enumerate(batch):
            for t, token in enumerate(seq):
                if not isinstance(token, Mapping):
                    raise TypeError(
                        f"token {t} of sequence {s} must be a mapping attribute -> value; "
                        f"got {type(token).__name__}."
                    )
                for attr, value in token.items():
                    if attr == POSITION and self.max_length is not None:
                        raise ValueError(
                            f"token {t} of sequence {s}: positions are filled in by encode; "
                            "do not pass them."
                        )
                    codes[attr][s, t] = self._index_of(attr, value,
                                                       f"token {t} of sequence {s}")
        X = self.encode_indices(codes, lengths)
        return X[0] if single else X

    def encode_indices(self, codes, lengths=None):
        """Token vectors from alphabet indices (vectorised :meth:`encode`).

        Parameters
        ----------
        codes : mapping of str to array-like of int, each of shape (n_sequences, n_tokens)
            For each attribute, the index of its value in the alphabet, or -1
            where the token does not have it.  Attributes not given are absent;
            positions are filled in.
        lengths : array-like of int, shape (n_sequences,), or None
            Real tokens per sequence; the rest is NaN padding.  None: all.

        Returns
        -------
        X : ndarray of shape (n_sequences, n_tokens, d)
        """
        shapes = set()
        arrays = {}
        for attr, idx in codes.items():
            if attr not in self.attributes:
                raise ValueError(
                    f"codes: unknown attribute {attr!r}; the program's attributes: "
                    f"{list(self.attributes)}."
                )
            idx = np.asarray(idx)
            if idx.dtype.kind not in "iu" or idx.ndim != 2:
                raise ValueError(
                    f"codes[{attr!r}] must be a 2-D integer array (n_sequences, n_tokens); "
                    f"got dtype {idx.dtype} and shape {idx.shape}."
                )
            size = len(self.attributes[attr])
            if idx.size and (idx.min() < -1 or idx.max() >= size):
                raise ValueError(
                    f"codes[{attr!r}] must hold indices in [-1, {size - 1}] (alphabet of "
                    f"{size} values, -1 for absent); got values in [{idx.min()}, {idx.max()}]."
                )
            shapes.add(idx.shape)
            arrays[attr] = idx
        if len(shapes) != 1:
            raise ValueError(f"codes must all have the same shape; got shapes {sorted(shapes)}.")
        n_seq, n_tok = shapes.pop()
        self._check_length(n_tok, "encode_indices")
        X = np.zeros((n_seq, n_tok, self.d))
        if self.max_length is not None and POSITION not in arrays:
            arrays[POSITION] = np.broadcast_to(np.arange(n_tok), (n_seq, n_tok))
        seq, tok = np.indices((n_seq, n_tok))
        for attr, idx in arrays.items():
            present = idx >= 0
            X[seq[present], tok[present], self.layout[attr].start + idx[present]] = 1.0
        if lengths is not None:
            lengths = np.asarray(lengths)
            if lengths.shape != (n_seq,) or lengths.dtype.kind not in "iu" or (
                    n_seq and (lengths.min() < 1 or lengths.max() > n_tok)):
                raise ValueError(
                    f"lengths must be {n_seq} integers in [1, {n_tok}]; got "
                    f"{lengths!r}."
                )
            X[tok >= lengths[:, None]] = np.nan
        return X

    def _check_length(self, n_tokens, where):
        if self.max_length is not None and n_tokens > self.max_length:
            raise ValueError(
                f"{where}: sequences of {n_tokens} tokens exceed the program's "
                f"max_length={self.max_length} positions."
            )

    def round(self, Y):
        """Nearest token: per attribute, the one-hot of the largest entry if it exceeds 1/2.

        This is the Euclidean nearest token among all tokens whose blocks are
        one-hot or zero (``||y - e_i||^2 < ||y||^2`` iff ``y_i > 1/2``), the
        paper's rounding (Def. G.2) over the program's token set.

        Parameters
        ----------
        Y : array-like of shape (..., d)

        Returns
        -------
        tokens : ndarray of shape (..., d)
            NaN where the output has a NaN (e.g. padding).
        """
        Y = np.asarray(Y, dtype=np.float64)
        if Y.shape[-1] != self.d:
            raise ValueError(f"Y must have {self.d} columns (the token dimension); "
                             f"got shape {Y.shape}.")
        out = np.zeros_like(Y)
        for sl in self.layout.values():
            block = Y[..., sl]
            best = np.argmax(block, axis=-1)
            hit = np.take_along_axis(block, best[..., None], axis=-1)[..., 0] > 0.5
            np.put_along_axis(out[..., sl], best[..., None], hit[..., None].astype(float),
                              axis=-1)
        # Padding stays padding (and a NaN output is no token).
        out[np.isnan(Y).any(axis=-1)] = np.nan
        return out

    def decode(self, X):
        """Attribute values of token vectors (inverse of :meth:`encode`).

        Parameters
        ----------
        X : array-like of shape (n_tokens, d) or (n_sequences, n_tokens, d)
            Tokens whose blocks are one-hot or zero (round raw outputs with
            :meth:`round` first); trailing all-NaN tokens are padding and are
            dropped.

        Returns
        -------
        tokens : list of dict, or list of lists of dict
            Absent attributes (zero blocks) are left out, and so are
            positions.
        """
        X = np.asarray(X, dtype=np.float64)
        if X.ndim not in (2, 3) or X.shape[-1] != self.d:
            raise ValueError(
                f"X must have shape (n_tokens, {self.d}) or (n_sequences, n_tokens, "
                f"{self.d}); got shape {X.shape}."
            )
        if X.ndim == 3:
            return [self.decode(x) for x in X]
        X = X[~np.all(np.isnan(X), axis=1)]
        tokens = [dict() for _ in range(X.shape[0])]
        for attr, sl in self.layout.items():
            block = X[:, sl]
            ok = np.all((block == 0) | (block == 1), axis=1) & (block.sum(axis=1) <= 1)
            if not ok.all():
                t = int(np.argmin(ok))
                raise ValueError(
                    f"token {t}: the block of attribute {attr!r} is not one-hot or zero "
                    f"(values {np.round(block[t], 3).tolist()}); round outputs with round() "
                    "before decoding."
                )
            if attr == POSITION:
                continue
            rows, cols = np.nonzero(block)
            values = self.attributes[attr]
            for r, c in zip(rows.tolist(), cols.tolist()):
                tokens[r][attr] = values[c]
        return tokens

    def values(self, X, attribute):
        """Alphabet index of one attribute in each token (-1 where absent or not one-hot).

        A lenient, vectorised reading for checking generated sequences of
        learned models, whose tokens may be anything.

        Parameters
        ----------
        X : array-like of shape (..., d)
        attribute : str

        Returns
        -------
        index : ndarray of int, shape X.shape[:-1]
        """
        if attribute not in self.layout:
            raise ValueError(f"unknown attribute {attribute!r}; the program's attributes: "
                             f"{list(self.attributes)}.")
        block = np.asarray(X, dtype=np.float64)[..., self.layout[attribute]]
        clean = np.all((block == 0) | (block == 1), axis=-1) & (block.sum(axis=-1) == 1)
        return np.where(clean, np.argmax(np.nan_to_num(block), axis=-1), -1)

    # ------------------------------------------------------------ running

    @property
    def weights(self):
        """``(V, Q)``, for :func:`~sklearn_linattn.mhla_forward` and friends."""
        return self.V, self.Q

    def forward(self, X):
        """The program's raw output at the last token of each sequence.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays

        Returns
        -------
        Y : ndarray of shape (n_samples, d)
        """
        return mhla_forward(X, self.V, self.Q)

    def run(self, prompts, n_steps):
        """Run the program autoregressively: append the rounded output ``n_steps`` times.

        Parameters
        ----------
        prompts : array-like of shape (n_sequences, n_tokens, d), or tokens for :meth:`encode`
            Encoded prompts (NaN-padded) or lists of attribute mappings.
        n_steps : int
            Tokens to generate.

        Returns
        -------
        sequences : ndarray of shape (n_sequences, max_tokens + n_steps, d)
            Prompts followed by their generated tokens, NaN-padded.

        Raises
        ------
        ValueError
            With positions, when a sequence would grow beyond ``max_length``.
        """
        if _is_tokens(prompts):
            prompts = self.encode(prompts)
        X, lengths = check_sequences(prompts, n_features=self.d, name="prompts")
        n_steps = check_scalar(n_steps, "n_steps", integer=True, low=0)
        if self.max_length is not None and int(lengths.max()) + n_steps > self.max_length:
            raise ValueError(
                f"n_steps={n_steps} after a prompt of {int(lengths.max())} tokens needs "
                f"{int(lengths.max()) + n_steps} positions; the program has "
                f"max_length={self.max_length}."
            )
        return mhla_generate(X, self.V, self.Q, n_steps, rounding=self.round, lengths=lengths)


# --------------------------------------------------------------------------
# Programs shipped with the package
# --------------------------------------------------------------------------


def associative_memory_program(d):
    """The associative memory of the paper's Sec. 4.2 as a one-lookup program.

    Tokens have a ``"key"`` and a ``"value"`` attribute over ``range(d)``;
    the last token's key looks up the stored pair with that key and writes
    its value.  Compiled, ``V = [[0, 0], [0, I]]`` and ``Q = [[I, 0], [0,
    0]]`` (d x d blocks): the weights of
    :func:`~sklearn_linattn.datasets.make_associative_memory`.  The same
    weights retrieve from any orthonormal keys, not only one-hot ones.

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
    >>> prompt = [{"key": 0, "value": 2}, {"key": 1, "value": 0}, {"key": 2, "value": 1},
    ...           {"key": 2}]
    >>> memory.decode(memory.run([prompt], 1)[0])[-1]
    {'value': 1}
    """
    d = check_scalar(d, "d", integer=True, low=1)
    return (Program()
            .attribute("key", range(d))
            .attribute("value", range(d))
            .lookup(query="key", key="key", value="value", dest="value", name="retrieve")
            .compile())


def dfa_transition_program(n_states, alphabet_size):
    """One DFA transition as one lookup: find ``delta(s, w)`` in a table of tokens.

    Attributes: table tokens carry ``"table_key"`` (a pair (s, w)) and
    ``"table_next"`` (a state); the query token carries ``"current"`` (a
    pair); the program writes ``"next_state"``.

    Parameters
    ----------
    n_states, alphabet_size : int

    Returns
    -------
    program : CompiledProgram
        Token dimension ``2 * n_states * alphabet_size + 2 * n_states``, one head.

    Examples
    --------
    >>> from sklearn_linattn.programs import dfa_transition_program
    >>> step = dfa_transition_program(2, 2)
    >>> delta = {(0, 0): 1, (0, 1): 0, (1, 0): 1, (1, 1): 1}
    >>> prompt = [{"table_key": k, "table_next": v} for k, v in delta.items()]
    >>> step.decode(step.run([prompt + [{"current": (0, 0)}]], 1)[0])[-1]
    {'next_state': 1}
    """
    n_states = check_scalar(n_states, "n_states", integer=True, low=1)
    alphabet_size = check_scalar(alphabet_size, "alphabet_size", integer=True, low=1)
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
        ``transitions[i, s, w]`` is the state automaton i moves to from s on
        letter w.
    words : array-like of int, shape (n, length)
        Letters; -1 marks the end of a shorter word (trailing only).
    start : int, default=0

    Returns
    -------
    states : ndarray of int, shape (n, length + 1)
        ``s^0 = start, s^1, ...``; -1 after each word's end.
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


def _rule_table_codes(attributes, n, n_tok, *, key, shape, width):
    """Codes of ``n`` prompts of ``n_tok`` tokens, all absent but a rule table.

    The first ``shape[0] * shape[1]`` tokens get ``key`` = the pair (i, j),
    row-major, in a product alphabet with ``width`` values of j (the
    program's bound, which may exceed ``shape[1]``).
    """
    codes = {attr: np.full((n, n_tok), -1, dtype=np.int64) for attr in attributes}
    i, j = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    codes[key][:, : i.size] = (i * width + j).ravel()
    return codes


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
    if np.any(present != (np.arange(words.shape[1])[None, :] < lengths[:, None])):
        raise ValueError("words: -1 (end of word) may only be followed by -1.")
    return transitions, words, lengths


class DFAExecutor(CompiledProgram):
    """A universal DFA executor compiled into linear attention.

    Built by :func:`dfa_executor_program`; see there for the construction.

    Attributes
    ----------
    n_states, alphabet_size, max_word_length : int
        The bounds.
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
            Within the executor's bounds (fewer states or letters are fine).
        words : array-like of int, shape (n, length)
            -1 after the end of shorter words.

        Returns
        -------
        X : ndarray of shape (n, n_tokens, d)
            ``n_states * alphabet_size`` table tokens, the word's tokens, then
            the start token (state 0 at step 0); NaN-padded for shorter words.
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
        transitions, words : see :meth:`prompts`
        model : None or estimator with ``generate``, default=None
            None runs the compiled program; otherwise ``model.generate(prompts,
            n_steps, rounding=self.round)`` (e.g. a fitted
            :class:`~sklearn_linattn.LinearAttentionRegressor`).

        Returns
        -------
        sequences : ndarray of shape (n, n_tokens, d)
            Each prompt and its ``2 * len(word)`` history tokens (a letter
            token, then a state token, per letter), NaN-padded.
        """
        return self._histories(*self._check_bounds(transitions, words), model)

    def _histories(self, transitions, words, lengths, model):
        X = self._prompts(transitions, words, lengths)
        n_steps = 2 * int(lengths.max())
        out = (self.run(X, n_steps) if model is None
               else model.generate(X, n_steps, rounding=self.round))
        # Cut what shorter words generated past their last state.
        n_table = transitions.shape[1] * transitions.shape[2]
        end = n_table + 3 * lengths + 1
        out[np.arange(out.shape[1])[None, :] >= end[:, None]] = np.nan
        return out[:, : int(end.max())]

    def execute(self, transitions, words, *, model=None):
        """States visited, read from the generated history.

        Parameters
        ----------
        transitions, words, model : see :meth:`histories`

        Returns
        -------
        states : ndarray of int, shape (n, length + 1)
            Like :func:`run_dfa`: -1 after each word's end, and -1 where a
            model's state token is not a clean one-hot of a (state, step) pair
            with the right step.
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

    The prompt lists the automaton's transition table (one token per pair
    (s, w) with attributes ``table_key = (s, w)`` and ``table_next =
    delta(s, w)``), the word (token t has ``word_index = t`` and
    ``letter_at = (w_t, t)``) and a start token ``state_at = (0, 0)``.  Each
    step of the automaton then takes two generated tokens:

    - from a state token ``state_at = (s, t)``, heads ``read letter | s``
      (one per state s) look up the word token with index t and write
      ``transition = (s, w_t, t)``;
    - from a letter token ``transition = (s, w, t)``, heads ``step t`` (one
      per step t) look up the table token with key (s, w) and write
      ``state_at = (delta(s, w), t + 1)``.

    A bilinear score can only test one attribute of the last token against
    one of the other token, so everything a step needs is carried in one
    attribute of product alphabet, and the part of it that the looked-up
    token does not hold (s, resp. t) selects the head: ``n_states +
    max_word_length`` heads in all.  Keys are unique (one table token per
    pair, one word token per index), so exactly one token matches and the
    outputs are exact 0/1 vectors: the executor is exact on every automaton
    with at most ``n_states`` states and ``alphabet_size`` letters and every
    word of at most ``max_word_length`` letters.  No positional encoding is
    needed.

    Parameters
    ----------
    n_states, alphabet_size, max_word_length : int
        The bounds.

    Returns
    -------
    executor : DFAExecutor
        Token dimension ``d = S A + S + L + A L + S (L + 1) + S A L`` for S
        states, A letters, L letters per word (44 for S = A = 2, L = 4).

    See Also
    --------
    run_dfa : the same histories from a plain loop.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.programs import dfa_executor_program, run_dfa
    >>> executor = dfa_executor_program(2, 2, 4)
    >>> executor.d, executor.n_heads
    (44, 6)
    >>> parity = np.array([[[0, 1], [1, 0]]])  # counts the letters 1, mod 2
    >>> words = np.array([[1, 1, 0, 1]])
    >>> executor.execute(parity, words)
    array([[0, 1, 0, 0, 1]])
    >>> bool(np.array_equal(executor.execute(parity, words), run_dfa(parity, words)))
    True
    """
    S = check_scalar(n_states, "n_states", integer=True, low=1)
    A = check_scalar(alphabet_size, "alphabet_size", integer=True, low=1)
    L = check_scalar(max_word_length, "max_word_length", integer=True, low=1)
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


# --------------------------------------------------------------------------
# Bounded Turing machines
# --------------------------------------------------------------------------

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

    Every machine starts in state 0 with its head on cell 0.  A step in state
    q reading symbol g writes ``write[q, g]``, moves the head by
    ``move[q, g]`` (-1, 0 or 1; the head stays put at either end of the tape)
    and enters ``next_state[q, g]``.  Halting states are states whose rules
    write what they read and do not move.

    Parameters
    ----------
    next_state, write, move : array-like of int, shape (n, n_states, n_symbols)
        The machines' rules.
    tapes : array-like of int, shape (n, tape_length)
        Initial tape contents.
    n_steps : int

    Returns
    -------
    states, heads : ndarray of int, shape (n, n_steps + 1)
        State and head position before each step, and after the last.
    tapes : ndarray of int, shape (n, n_steps + 1, tape_length)
        Tape contents at the same times.
    """
    next_state, write, move, tape = _check_machines(next_state, write, move, tapes)
    n_steps = check_scalar(n_steps, "n_steps", integer=True, low=0)
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


class TuringMachineSimulator(CompiledProgram):
    """A bounded Turing-machine simulator compiled into linear attention.

    Built by :func:`turing_machine_program`; see there for the construction.

    Attributes
    ----------
    n_states, n_symbols, tape_length, max_steps : int
        The bounds.
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
        next_state, write, move, tapes : see :func:`run_turing_machine`

        Returns
        -------
        X : ndarray of shape (n, n_rules + tape_length + 1, d)
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
        next_state, write, move, tapes : see :func:`run_turing_machine`
        n_steps : int
            At most ``max_steps``.
        model : None or estimator with ``generate``, default=None
            None runs the compiled program.

        Returns
        -------
        sequences : ndarray of shape (n, n_prompt + 3 * n_steps, d)
        """
        X = self.prompts(next_state, write, move, tapes)
        n_steps = check_scalar(n_steps, "n_steps", integer=True, low=0, high=self.max_steps)
        if model is None:
            return self.run(X, 3 * n_steps)
        return model.generate(X, 3 * n_steps, rounding=self.round)

    def execute(self, next_state, write, move, tapes, n_steps, *, model=None):
        """States, head positions and tapes read from the generated history.

        Parameters
        ----------
        next_state, write, move, tapes, n_steps, model : see :meth:`histories`

        Returns
        -------
        states, heads : ndarray of int, shape (n, n_steps + 1)
            As :func:`run_turing_machine`; -1 where a state token is not a
            clean one-hot.
        tapes : ndarray of int, shape (n, n_steps + 1, tape_length)
            The tape replayed from the generated write tokens (initial tape,
            then each step's written symbol at its cell); -1 where a write
            token is not clean.
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
        for t in range(n_steps):  # replay the writes, vectorised over machines
            history[:, t + 1] = history[:, t]
            ok = written[:, t] >= 0
            cell, symbol = np.divmod(written[:, t], G)
            history[rows[ok], t + 1, cell[ok]] = symbol[ok]
            history[~ok, t + 1] = -1
        return states, heads, history


def turing_machine_program(n_states, n_symbols, tape_length, max_steps):
    """Compile a universal simulator of Turing machines with a bounded tape and run time.

    In the spirit of the paper's Lemma B.1 (bounded computation histories),
    with a tape that is never copied: the prompt lists the machine's rules
    (tokens with ``rule_key = (q, g)`` and ``rule_action = (q', g', m)``),
    the tape (token i has ``cell = i`` and ``plus = (i, g_i)``) and a start
    token ``state = (0, 0)`` (state 0, head on cell 0).  Each step appends
    three tokens:

    - ``read = (q, h, g)``: heads ``read plus | q`` and ``read minus | q``
      look up every token with ``cell = h`` and add its ``plus`` and
      subtract its ``minus`` symbol.  The tape token wrote the initial
      symbol, every later write token wrote ``plus`` = the new symbol and
      ``minus`` = the symbol it replaced, so the sum telescopes to the
      current symbol -- exactly, in integers;
    - a write token ``cell = h``, ``minus = (h, g)`` (copies of the read
      token), ``plus = (h, g')`` and ``pending = (q', h, m)`` (heads ``write
      | h`` and ``move | h`` look up the rule for (q, g), one per head
      position h, which the rule token does not hold);
    - ``state = (q', clip(h + m))``: a copy of ``pending`` mapped to the new
      state and head position.

    A step therefore costs three tokens whatever the tape length; positions
    (one-hot, ``max_length = rules + tape + 1 + 3 * max_steps``) serve the
    copies of the last token.

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
        ``2 * n_states + 2 * tape_length + 4`` heads (one for positions,
        ``2 * n_states`` reads, two copies of the read token, ``2 *
        tape_length`` rule lookups, one state update).

    See Also
    --------
    run_turing_machine : the same runs from a plain loop.

    Examples
    --------
    A machine that flips bits while moving right and halts (state 1) on the
    blank symbol 2:

    >>> import numpy as np
    >>> from sklearn_linattn.programs import turing_machine_program, run_turing_machine
    >>> tm = turing_machine_program(2, 3, tape_length=5, max_steps=6)
    >>> tm.d, tm.n_heads
    (159, 18)
    >>> next_state = np.array([[[0, 0, 1], [1, 1, 1]]])
    >>> write = np.array([[[1, 0, 2], [0, 1, 2]]])     # flip 0 <-> 1, keep the blank
    >>> move = np.array([[[1, 1, 0], [0, 0, 0]]])
    >>> tape = np.array([[0, 1, 1, 2, 0]])
    >>> states, heads, tapes = tm.execute(next_state, write, move, tape, 6)
    >>> tapes[0, -1], states[0], heads[0]
    (array([1, 0, 0, 2, 0]), array([0, 0, 0, 0, 1, 1, 1]), array([0, 1, 2, 3, 3, 3, 3]))
    >>> all(np.array_equal(a, b) for a, b in zip(
    ...     (states, heads, tapes), run_turing_machine(next_state, write, move, tape, 6)))
    True
    """
    S = check_scalar(n_states, "n_states", integer=True, low=1)
    G = check_scalar(n_symbols, "n_symbols", integer=True, low=1)
    T = check_scalar(tape_length, "tape_length", integer=True, low=1)
    K = check_scalar(max_steps, "max_steps", integer=True, low=1)
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


# --------------------------------------------------------------------------
# Learning programs back
# --------------------------------------------------------------------------


def next_token_dataset(sequences, start):
    """Autoregressive training pairs: every prefix and the token that follows it.

    For sequence i and every position t from ``start[i]`` to its last token,
    the prefix ``sequences[i, :t]`` is one sample and ``sequences[i, t]`` its
    target, so a ``readout="last"`` model fitted on them learns exactly what
    generation uses.

    Parameters
    ----------
    sequences : array-like of shape (n, n_tokens, d)
        NaN-padded sequences (e.g. from :meth:`CompiledProgram.run`).
    start : int or array-like of int, shape (n,)
        Index of the first token to predict (the prompt's length), >= 1.

    Returns
    -------
    X : ndarray of shape (n_pairs, n_tokens - 1, d)
        Prefixes, NaN-padded.
    y : ndarray of shape (n_pairs, d)
        The next tokens.
    groups : ndarray of int, shape (n_pairs,)
        Index of the sequence each pair comes from (for ``GroupKFold``).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn.programs import next_token_dataset
    >>> seq = np.arange(8.0).reshape(1, 4, 2)
    >>> X, y, groups = next_token_dataset(seq, start=2)
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
    prefixes[np.arange(n_tok - 1)[None, :] >= t[:, None]] = np.nan
    return prefixes, y, groups
