"""The compiler: lookup programs, their one-hot layout and the compiled weights."""

from collections.abc import Hashable, Mapping

import numpy as np

from .._attention import mhla_forward, mhla_generate
from .._validation import check_sequences
from .._params import check_number

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
    """A lookup program: attributes with finite alphabets, and one head per primitive.

    See the user guide's :doc:`/programs` page.

    Parameters
    ----------
    max_length : int or None, default=None
        With an int, tokens carry a one-hot ``"position"`` attribute, advanced by
        a first head; :meth:`copy` and :meth:`if_then` need it.

    See Also
    --------
    CompiledProgram : The compiled weights, encoding and execution.

    Examples
    --------
    >>> from sklearn_linattn.programs import Program
    >>> shift = (Program(max_length=8).attribute("letter", "ab")
    ...          .copy("letter", offset=-2).compile())
    >>> out = shift.run([[{"letter": "a"}, {"letter": "b"}]], 4)
    >>> "".join(t["letter"] for t in shift.decode(out[0]))
    'ababab'
    """

    def __init__(self, *, max_length=None):
        self.max_length = check_number(max_length, "max_length", integer=True, low=1,
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
            Attribute name; ``"position"`` is reserved.
        values : iterable of hashable
            The alphabet, in one-hot order, without repeats.

        Returns
        -------
        self : Program
            The program, with the attribute added.

        Examples
        --------
        >>> from sklearn_linattn.programs import Program
        >>> Program().attribute("colour", ["red", "green"]).attribute("size", range(3))
        Program(max_length=None, attributes=['colour', 'size'], lookups=[])
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
        """Add one head: tokens with ``key == match(last.query)`` add ``write(value)`` to ``dest``.

        Parameters
        ----------
        query, key, value, dest : str
            Declared attribute names.
        match, write : None, mapping or callable, default=None
            Query value -> key value, and value -> ``dest`` value; a None result
            looks up or writes nothing.  None means identity.
        scale : float, default=1.0
            Non-zero factor on what the head writes; ``-1`` subtracts.
        name : str or None, default=None
            Head name (default ``"lookup <dest> <- <value> by <key>"``).

        Returns
        -------
        self : Program
            The program, with the head added.

        Examples
        --------
        >>> from sklearn_linattn.programs import Program
        >>> other = (Program().attribute("name", "ab").attribute("age", range(3))
        ...          .lookup(query="name", key="name", value="age", dest="age",
        ...                  match={"a": "b", "b": "a"}).compile())
        >>> prompt = [{"name": "a", "age": 2}, {"name": "b", "age": 0}, {"name": "a"}]
        >>> other.decode(other.run([prompt], 1)[0])[-1]  # the age of the other name
        {'age': 0}
        """
        for attr, role in ((query, "query"), (key, "key"), (value, "value"), (dest, "dest")):
            self._check_attribute(attr, f"lookup {role}")
        match = _as_map(match, "match")
        write = _as_map(write, "write")
        scale = check_number(scale, "scale")
        if scale == 0:
            raise ValueError("scale must be non-zero; got 0.")
        self._lookups.append(dict(
            name=name or f"lookup {dest} <- {value} by {key}",
            query=query, key=key, value=value, dest=dest, match=match, write=write,
            scale=float(scale),
        ))
        return self

    def copy(self, attribute, *, offset=-1, dest=None, write=None, name=None):
        """Add one head copying an attribute from a fixed relative position (needs positions).

        Parameters
        ----------
        attribute : str
            Attribute to copy.
        offset : int, default=-1
            Source position relative to the generated token: -1 is the last token.
        dest : str or None, default=None
            Destination attribute (default: ``attribute``).
        write : None, mapping or callable, default=None
            Map applied to the copied value, as in :meth:`lookup` (None: identity).
        name : str or None, default=None
            Head name (default ``"copy <dest> <- <attribute>[<offset>]"``).

        Returns
        -------
        self : Program
            The program, with the head added.

        Examples
        --------
        >>> from sklearn_linattn.programs import Program
        >>> flip = (Program(max_length=4).attribute("bit", [0, 1])
        ...         .copy("bit", write={0: 1, 1: 0}).compile())
        >>> [t["bit"] for t in flip.decode(flip.run([[{"bit": 0}]], 3)[0])]
        [0, 1, 0, 1]
        """
        self._need_positions("copy")
        offset = check_number(offset, "offset", integer=True, high=-1)
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
        """Add one head: if the last token's attribute is a, write ``table[a]`` (needs positions).

        Parameters
        ----------
        attribute : str
            Attribute of the last token read.
        table : mapping
            Value of ``attribute`` -> value of ``dest``; other values write nothing.
        dest : str or None, default=None
            Destination attribute (default: ``attribute``).
        name : str or None, default=None
            Head name (default ``"if_then <dest> <- <attribute>"``).

        Returns
        -------
        self : Program
            The program, with the head added.

        Examples
        --------
        >>> from sklearn_linattn.programs import Program
        >>> counter = (Program(max_length=5).attribute("state", range(3))
        ...            .if_then("state", {0: 1, 1: 2, 2: 0}).compile())
        >>> [t["state"] for t in counter.decode(counter.run([[{"state": 0}]], 4)[0])]
        [0, 1, 2, 0, 1]
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
            One head per primitive, after the position head when there are positions.

        Raises
        ------
        ValueError
            No lookup; a ``match`` or ``write`` value outside the target alphabet;
            a head that never matches or never writes.

        Examples
        --------
        >>> from sklearn_linattn.programs import Program
        >>> compiled = (Program().attribute("key", range(2)).attribute("value", range(2))
        ...             .lookup(query="key", key="key", value="value", dest="value").compile())
        >>> compiled.d, compiled.n_heads, compiled.head_names
        (4, 1, ['lookup value <- value by key'])
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


class CompiledProgram:  # numpydoc ignore=PR01
    """Value and key-query matrices of a lookup program, with its token encoding.

    Built by :meth:`Program.compile` or a program function, not directly.

    Attributes
    ----------
    V, Q : ndarray of shape (n_heads, d, d)
        Value and key-query matrices.
    d, n_heads : int
        Token dimension (the sum of the alphabet sizes) and number of heads.
    head_names : list of str
    attributes, layout : dict
        Attribute name -> tuple of values, and -> slice of its one-hot block.
    max_length : int or None
        Number of positions, or None without positional encodings.

    Examples
    --------
    >>> from sklearn_linattn.programs import associative_memory_program
    >>> associative_memory_program(2).layout
    {'key': slice(0, 2, None), 'value': slice(2, 4, None)}
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
            One sequence or a batch; each token maps attribute -> value (absent
            attributes are zero blocks).  Positions are filled in; do not pass them.

        Returns
        -------
        X : ndarray of shape (n_tokens, d), or (n_sequences, max_tokens, d)
            A batch is NaN-padded at the end.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> associative_memory_program(2).encode([{"key": 1, "value": 0}])  # blocks: key, value
        array([[0., 1., 1., 0.]])
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
            Per attribute, the index of its value in the alphabet, or -1 where
            absent.  Attributes not given are absent; positions are filled in.
        lengths : array-like of int, shape (n_sequences,), or None
            Real tokens per sequence; the rest is NaN padding.  None: all.

        Returns
        -------
        X : ndarray of shape (n_sequences, n_tokens, d)
            The tokens, as :meth:`encode` makes them.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> associative_memory_program(2).encode_indices({"key": [[1, 0]]}, lengths=[1])
        array([[[ 0.,  1.,  0.,  0.],
                [nan, nan, nan, nan]]])
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

        Parameters
        ----------
        Y : array-like of shape (..., d)
            Raw outputs, e.g. of :meth:`forward` or of a learned model.

        Returns
        -------
        tokens : ndarray of shape (..., d)
            Each block one-hot or zero; NaN where ``Y`` has a NaN.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> associative_memory_program(2).round([0.9, 0.2, 0.4, 0.45])  # blocks: key, value
        array([1., 0., 0., 0.])
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
            Tokens whose blocks are one-hot or zero (else ValueError; see
            :meth:`round`); trailing all-NaN tokens are dropped.

        Returns
        -------
        tokens : list of dict, or list of lists of dict
            Absent attributes and positions are left out.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> memory = associative_memory_program(2)
        >>> memory.decode(memory.encode([{"key": 1, "value": 0}, {"key": 0}]))
        [{'key': 1, 'value': 0}, {'key': 0}]
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

        Parameters
        ----------
        X : array-like of shape (..., d)
            Token vectors of any values, NaN padding included.
        attribute : str
            The attribute to read.

        Returns
        -------
        index : ndarray of int, shape X.shape[:-1]
            Index of the value in the alphabet, or -1.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> associative_memory_program(2).values([[0, 1, 1, 0], [1, 0, 0.9, 0]], "value")
        array([ 0, -1])
        """
        if attribute not in self.layout:
            raise ValueError(f"unknown attribute {attribute!r}; the program's attributes: "
                             f"{list(self.attributes)}.")
        block = np.asarray(X, dtype=np.float64)[..., self.layout[attribute]]
        clean = np.all((block == 0) | (block == 1), axis=-1) & (block.sum(axis=-1) == 1)
        return np.where(clean, np.argmax(np.nan_to_num(block), axis=-1), -1)

    @property
    def weights(self):
        """``(V, Q)``, for :func:`~sklearn_linattn.mhla_forward` and friends.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> [w.shape for w in associative_memory_program(2).weights]
        [(1, 4, 4), (1, 4, 4)]
        """
        return self.V, self.Q

    def forward(self, X):
        """The program's raw output (not rounded) at the last token of each sequence.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Encoded sequences; trailing all-NaN tokens are padding.

        Returns
        -------
        Y : ndarray of shape (n_samples, d)
            The output at the last token of each sequence.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> memory = associative_memory_program(2)  # blocks: key (2 values), value (2)
        >>> memory.forward(memory.encode([[{"key": 0, "value": 1}, {"key": 0}]]))
        array([[0., 0., 0., 1.]])
        """
        return mhla_forward(X, self.V, self.Q)

    def run(self, prompts, n_steps):
        """Run the program autoregressively: append the rounded output ``n_steps`` times.

        Parameters
        ----------
        prompts : array-like of shape (n_sequences, n_tokens, d), or tokens for :meth:`encode`
            Encoded prompts (NaN-padded) or lists of attribute mappings.
        n_steps : int
            Tokens to generate; with positions, at most ``max_length`` minus the
            longest prompt (else ValueError).

        Returns
        -------
        sequences : ndarray of shape (n_sequences, max_tokens + n_steps, d)
            Prompts followed by their generated tokens, NaN-padded.

        Examples
        --------
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> memory = associative_memory_program(2)
        >>> memory.decode(memory.run([[{"key": 0, "value": 1}, {"key": 0}]], 1)[0])
        [{'key': 0, 'value': 1}, {'key': 0}, {'value': 1}]
        """
        if _is_tokens(prompts):
            prompts = self.encode(prompts)
        X, lengths = check_sequences(prompts, n_features_in=self.d, name="prompts")
        n_steps = check_number(n_steps, "n_steps", integer=True, low=0)
        if self.max_length is not None and int(lengths.max()) + n_steps > self.max_length:
            raise ValueError(
                f"n_steps={n_steps} after a prompt of {int(lengths.max())} tokens needs "
                f"{int(lengths.max()) + n_steps} positions; the program has "
                f"max_length={self.max_length}."
            )
        return mhla_generate(X, self.V, self.Q, n_steps, rounding=self.round, lengths=lengths)

    def _generate(self, X, n_steps, model):
        """:meth:`run`, or ``model.generate`` rounding to this program's tokens."""
        if model is None:
            return self.run(X, n_steps)
        return model.generate(X, n_steps, rounding=self.round)


def _rule_table_codes(attributes, n, n_tok, *, key, shape, width):
    """Codes of ``n`` prompts of ``n_tok`` absent tokens but a rule table.

    The first ``shape[0] * shape[1]`` tokens get ``key = (i, j)``, row-major, in
    a product alphabet with ``width`` values of j.
    """
    codes = {attr: np.full((n, n_tok), -1, dtype=np.int64) for attr in attributes}
    i, j = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    codes[key][:, : i.size] = (i * width + j).ravel()
    return codes
