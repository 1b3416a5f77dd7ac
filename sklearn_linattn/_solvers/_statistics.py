"""Sufficient statistics of the least squares: row counts, ``Phi^T W Phi`` and ``Phi^T W Y``."""

import functools

import numpy as np

from .._features import features_rmatvec, pair_index_matrix, pair_indices
from .._memory import sample_chunks, n_pairs, zero_padding
from .._moments import MomentPass
from .._namespace import active, as_numpy
from .._spectrum import descending_eigh, rank_tolerance
from .._units import TokenStandardizer, feature_map, map_is_accurate, targets_map, weight_factor
from .._validation import check_lengths_array, check_readout

__all__ = ["RowCounts", "SufficientStatistics"]

# Pair products of the moments formed at a time while accumulating the Gram
# matrix (2**20 float64 values, 8 MiB: they stay in cache for the GEMM).
_GRAM_BLOCK_VALUES = 2**20
# Up to this many features the transposed feature rows themselves and one
# SYRK are cheaper than pair products (which save little arithmetic there).
_ROWS_UP_TO_PSI = 64
# Values of the pair products formed at a time in another namespace (a
# device's memory, not a cache, bounds them; each block is one GEMM).
_DEVICE_BLOCK_VALUES = 2**26


def _check_batch(X, lengths, Y, sample_weight, d, d_out, readout):
    """Shapes of an internal batch (zero-padded arrays, as the package's validation returns)."""
    X = np.asarray(X)
    if X.ndim != 3 or X.shape[2] != d:
        raise ValueError(
            f"X must be a zero-padded array of shape (n_samples, n_tokens, {d}); got shape "
            f"{X.shape}."
        )
    lengths = check_lengths_array(lengths, X.shape[0], X.shape[1])
    if (Y is None) != (d_out is None):
        raise ValueError(
            "Y must be given exactly when the statistics have targets: these statistics "
            f"have d_out={d_out}, got Y={'None' if Y is None else 'an array'}."
        )
    if Y is not None:
        Y = np.asarray(Y)
        expected = (X.shape[0], d_out) if readout == "last" else (*X.shape[:2], d_out)
        if Y.shape != expected:
            raise ValueError(
                f"Y must have shape {expected} for readout={readout!r}; got shape {Y.shape}."
            )
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
        if sample_weight.shape != (X.shape[0],):
            raise ValueError(
                f"sample_weight must have shape ({X.shape[0]},); got shape "
                f"{sample_weight.shape}."
            )
        if not np.all(np.isfinite(sample_weight)) or np.any(sample_weight < 0):
            raise ValueError("sample_weight must hold finite non-negative numbers.")
    return X, lengths.astype(np.int64, copy=False), Y, sample_weight


def _pair_offsets(P):
    """Start of each row block p (pairs (p, q), q >= p) in triu order."""
    return np.concatenate([[0], np.cumsum(P - np.arange(P))])


def _pair_rows(P, moments):
    """Rows of a compact Gram matrix of P moments that hold the pairs of some of them.

    ``moments`` (indices among the P, in any order) are the moments of other
    statistics: row ``i`` of those statistics' compact Gram matrix (their pair
    ``i`` in triu order) is row ``out[i]`` of this one (the pair in either
    order: a block ``(p, q)`` is also the block ``(q, p)``).
    """
    moments = np.asarray(moments, dtype=np.intp)
    j, k = pair_indices(moments.size)
    lo, hi = np.minimum(moments[j], moments[k]), np.maximum(moments[j], moments[k])
    return _pair_offsets(P)[lo] + (hi - lo)


def _block_moments(which, n_moments):
    """The moment indices of feature blocks ``which`` (each of ``n_moments`` moments)."""
    return (np.asarray(which, dtype=np.intp)[:, None] * n_moments
            + np.arange(n_moments)).ravel()


def _add_pair_products(out, St, B):
    """Add ``pairs(St) @ B`` to ``out`` (compact Gram rows of the moments St, in order)."""
    ns = active()
    if not ns.is_numpy:
        out += _pair_products_in(ns, St, B)
        return
    P, m = St.shape
    # Pair products of the moments (rows (p, q), q >= p, in triu order)
    # times pair products of the tokens: a GEMM gives every distinct Gram
    # entry of this chunk.  The pair products are formed a block of rows
    # at a time, small enough to stay in cache until the GEMM reads them.
    offsets = _pair_offsets(P)
    block = max(1, _GRAM_BLOCK_VALUES // m)
    buffer = np.empty(min(offsets[-1], max(block, P)) * m)
    p = 0
    while p < P:
        stop = p + 1  # rows offsets[p]:offsets[stop] of the compact Gram
        while stop < P and offsets[stop + 1] - offsets[p] <= block:
            stop += 1
        start = offsets[p]
        A = buffer[: (offsets[stop] - start) * m].reshape(-1, m)
        for q in range(p, stop):
            np.multiply(St[q:], St[q], out=A[offsets[q] - start : offsets[q + 1] - start])
        out[start : offsets[stop]] += A @ B
        p = stop


def _pair_products_in(ns, St, B):
    """``pairs(St) @ B`` computed in a namespace (the pair products formed there too)."""
    xp, P, m = ns.xp, St.shape[0], St.shape[1]
    offsets = [int(o) for o in _pair_offsets(P)]
    S, Bd = ns.asarray(St), ns.asarray(B)
    out = xp.zeros((offsets[-1], B.shape[1]), dtype=xp.float64, device=ns.device)
    block = max(1, (_GRAM_BLOCK_VALUES if ns.host_memory else _DEVICE_BLOCK_VALUES) // m)
    buffer = xp.empty((min(offsets[-1], max(block, P)), m), dtype=xp.float64, device=ns.device)
    p = 0
    while p < P:
        stop = p + 1
        while stop < P and offsets[stop + 1] - offsets[p] <= block:
            stop += 1
        start = offsets[p]
        for q in range(p, stop):
            ns.multiply_into(S[q:, :], S[q:q + 1, :],
                             buffer[offsets[q] - start:offsets[q + 1] - start, :])
        out[start:offsets[stop], :] = xp.matmul(buffer[:offsets[stop] - start, :], Bd)
        p = stop
    return as_numpy(out)


def _mapped_gram(G, A, B):
    """``kron(A, B) G kron(A, B)^T`` of G shaped (P, d, P, d), as a (P d, P d) matrix."""
    G = np.tensordot(A, G, axes=([1], [0]))               # (p', l, q, m)
    G = np.tensordot(B, G, axes=([1], [1])).swapaxes(0, 1)  # (p', l', q, m)
    G = np.tensordot(G, A, axes=([2], [1]))               # (p', l', m, q')
    G = np.tensordot(G, B, axes=([2], [1]))               # (p', l', q', m')
    n = G.shape[0] * G.shape[1]
    return G.reshape(n, n)


class RowCounts:
    """Counts of the feature rows of positive weight, and the energy of their targets.

    What every fit knows about its rows whatever the solver: how many there
    are, their weights, the least precise input dtype, and the weighted sum
    of squares of the (standardized) targets.  :class:`SufficientStatistics`
    adds the Gram matrix and the moment.

    Parameters
    ----------
    d : int
        Token dimension.
    d_out : int or None, default=None
        Number of outputs; None for rows without targets (the certificate).
    standardizer : TokenStandardizer or None, default=None
        Standardized coordinates of the rows (see :mod:`.._units`);
        None counts the data as given.
    readout : {"last", "all"} or None, default=None
        Readout of the counted rows; None: fixed by the first :meth:`update`.
    terms : LinearTerms or None, default=None
        Intercept and skip columns among the targets (the last ``n_terms``
        of ``d_out``); None: none, or set by the first :meth:`update` that
        has them.

    Attributes
    ----------
    y_sq : ndarray of shape (d_out,) or None
        Weighted sum of squares of the targets.
    y_cross : ndarray of shape (d_out, d_out) or None
        Weighted cross moments ``Y^T W Y`` of the targets (``y_sq`` is its
        diagonal); the intercept and skip terms are eliminated from them.
    y_sum : ndarray of shape (d_out,) or None
        Weighted sums ``Y^T w`` of the targets (the means of a
        cross-validation's R^2).
    n_rows : int
        Number of feature rows with positive weight.
    n_samples : int
        Number of sequences with positive weight.
    weight_sum : float
        Sum of the row weights (``n_rows`` without weights).
    min_weight : float
        Smallest positive row weight (inf before any row).
    dtype : numpy dtype
        The least precise floating dtype seen in the inputs.
    n_tokens : int
        Longest padded length seen.
    """

    has_gram = False

    def __init__(self, d, d_out=None, *, standardizer=None, readout=None, terms=None):
        self.d = int(d)
        if self.d < 1:
            raise ValueError(f"d must be a positive integer; got {d!r}.")
        if d_out is not None and int(d_out) < 1:
            raise ValueError(f"d_out must be None or a positive integer; got {d_out!r}.")
        self.d_out = None if d_out is None else int(d_out)
        if standardizer is None:
            standardizer = TokenStandardizer.identity(self.d, self.d_out)
        if standardizer.d != self.d:
            raise ValueError(
                f"the standardizer is for d={standardizer.d}, but these statistics have "
                f"d={self.d}."
            )
        self.standardizer = standardizer
        self.readout = readout
        self.terms = terms if terms else None
        self.y_sq = None if self.d_out is None else np.zeros(self.d_out)
        self.y_cross = None if self.d_out is None else np.zeros((self.d_out, self.d_out))
        self.y_sum = None if self.d_out is None else np.zeros(self.d_out)
        self.n_rows = 0
        self.n_samples = 0
        self.weight_sum = 0.0
        self.min_weight = np.inf
        self.dtype = np.dtype(np.float64)
        self.n_tokens = 0

    def __repr__(self):
        return (
            f"{type(self).__name__}(d={self.d}, d_out={self.d_out}, readout={self.readout!r}, "
            f"n_samples={self.n_samples}, n_rows={self.n_rows})"
        )

    @property
    def n_features(self):
        """Number of features psi (times the number of feature blocks, with decays)."""
        return self.standardizer.n_features

    def update(self, X, lengths, Y=None, *, readout="last", sample_weight=None, terms=None):
        """Add the feature rows of a batch of sequences.

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_tokens, d)
            Padded sequences (float32 or float64); values at positions
            ``>= lengths`` are ignored (zero or NaN).
        lengths : ndarray of int, shape (n_samples,)
            Number of real tokens of each sequence.
        Y : ndarray or None
            Targets as :func:`~.._validation.check_targets` returns them:
            shape (n_samples, d_out) for ``"last"``, (n_samples, n_tokens,
            d_out) for ``"all"``; given exactly when ``d_out`` is not None.
        readout : {"last", "all"}, default="last"
            Must be the same in every call.
        sample_weight : ndarray of shape (n_samples,) or None
            Non-negative weight of each sequence (of each of its positions for
            ``"all"``); rows of weight zero are skipped.
        terms : LinearTerms or None, default=None
            Intercept and skip columns appended to the targets (``d_out``
            counts them), from the standardized row tokens.

        Returns
        -------
        self
            The updated statistics.
        """
        if self.readout is None:  # later batches must match the first
            check_readout(readout)
        elif readout != self.readout:
            raise ValueError(
                f"readout must stay {self.readout!r} for these statistics; got {readout!r}."
            )
        n_terms = 0 if terms is None else terms.n_terms
        X, lengths, Y, w = _check_batch(
            X, lengths, Y, sample_weight, self.d,
            None if self.d_out is None or (Y is None and n_terms) else self.d_out - n_terms,
            readout,
        )
        self.readout = readout
        if terms:
            self.terms = terms
        # The fit's own accumulator, in these coordinates.
        n_real = None if Y is None else Y.shape[-1]
        batch = MomentPass(self.d, n_real, readout, terms=terms if terms else None,
                           statistics=functools.partial(type(self), self.d, self.d_out,
                                                        readout=readout, terms=self.terms),
                           coordinates=self.standardizer, decays=self.standardizer.decays)
        batch.add(zero_padding(np.asarray(X), lengths), lengths, Y, w)
        part = batch.statistics(self.standardizer)
        if part is not None:
            self.merge(part)
        return self

    def note_sequences(self, n_samples, n_tokens, dtype):
        """Count sequences of positive weight, their padded length and input dtype."""
        dtype = np.dtype(dtype)
        if dtype.kind == "f" and dtype.itemsize < self.dtype.itemsize:
            self.dtype = dtype
        self.n_tokens = max(self.n_tokens, int(n_tokens))
        self.n_samples += int(n_samples)
        return self

    def add_rows(self, rows):
        """Add standardized rows (:class:`~.._moments.Rows`): counts and target energy."""
        m = rows.n_rows
        if m == 0:
            return self
        w = rows.w
        self.n_rows += m
        self.weight_sum += float(m if w is None else w.sum())
        self.min_weight = min(self.min_weight, 1.0 if w is None else float(w.min()))
        if rows.Y is not None and self.y_sq is not None:
            Yw = rows.Y if w is None else rows.Y * w[:, None]
            self.y_sq += np.einsum("ra,ra->a", Yw, rows.Y)
            self.y_cross += Yw.T @ rows.Y
            self.y_sum += Yw.sum(axis=0)
        return self

    def _copy_into(self, standardizer):
        """A copy in other standardized coordinates, counts and energy mapped exactly.

        Returns the copy, the factor of the weights and the map of the
        targets between the two coordinates (None, None when they are
        equal): powers of two for the real outputs, the map of the tokens
        for the skip columns.
        """
        old = self.standardizer
        out = type(self).__new__(type(self))
        out.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                             for k, v in self.__dict__.items()})
        out.standardizer = standardizer
        if standardizer == old:
            return out, None, None
        wf = weight_factor(old, standardizer)
        target_map = None
        if self.d_out is not None:
            n_terms = 0 if self.terms is None else self.terms.n_terms
            target_map = targets_map(old, standardizer, self.d_out - n_terms, self.terms)
            out.y_cross = (target_map.T @ self.y_cross @ target_map) * wf
            out.y_sq = np.diagonal(out.y_cross).copy()
            out.y_sum = (self.y_sum @ target_map) * wf
        out.weight_sum = self.weight_sum * wf
        out.min_weight = self.min_weight * wf
        return out, wf, target_map

    def target_columns(self, cols, terms):
        """The same rows with some of the targets only (a new object).

        Parameters
        ----------
        cols : ndarray of int
            Indices of the kept targets, among ``d_out`` (the term columns
            among them, :meth:`~.._terms.LinearTerms.target_columns`).
        terms : LinearTerms or None
            The terms of the kept columns.
        """
        out = self.restandardized(self.standardizer)  # a copy
        out.d_out = len(cols)
        out.terms = terms if terms else None
        out.y_sq = self.y_sq[cols].copy()
        out.y_cross = self.y_cross[np.ix_(cols, cols)].copy()
        out.y_sum = self.y_sum[cols].copy()
        return out

    def restandardized(self, standardizer):
        """The same counts in other standardized coordinates (a new object).

        Parameters
        ----------
        standardizer : TokenStandardizer
            The new coordinates.

        Returns
        -------
        RowCounts
            A new object; this one is unchanged.
        """
        return self._copy_into(standardizer)[0]

    def merge(self, other):
        """Add the counts of other (disjoint) data, in place.

        Parameters
        ----------
        other : RowCounts
            Same class, ``d``, ``d_out``, readout and standardized coordinates.

        Returns
        -------
        self
            The merged statistics.
        """
        if not isinstance(other, RowCounts) or other.has_gram != self.has_gram:
            raise TypeError(
                f"other must be a {type(self).__name__}; got {type(other).__name__}."
            )
        if (other.d, other.d_out) != (self.d, self.d_out):
            raise ValueError(
                f"cannot merge statistics of d={other.d}, d_out={other.d_out} into "
                f"statistics of d={self.d}, d_out={self.d_out}."
            )
        if other.standardizer != self.standardizer:
            raise ValueError(
                "cannot merge statistics accumulated in different standardized coordinates: "
                "create both with the same standardizer."
            )
        if self.readout is not None and other.readout is not None and (
            self.readout != other.readout
        ):
            raise ValueError(
                f"cannot merge statistics of readout={other.readout!r} into statistics of "
                f"readout={self.readout!r}."
            )
        self.readout = self.readout if self.readout is not None else other.readout
        self.terms = self.terms if self.terms is not None else other.terms
        if self.y_sq is not None:
            self.y_sq += other.y_sq
            self.y_cross += other.y_cross
            self.y_sum += other.y_sum
        self.n_rows += other.n_rows
        self.n_samples += other.n_samples
        self.weight_sum += other.weight_sum
        self.min_weight = min(self.min_weight, other.min_weight)
        if other.dtype.itemsize < self.dtype.itemsize:
            self.dtype = other.dtype
        self.n_tokens = max(self.n_tokens, other.n_tokens)
        return self


class SufficientStatistics(RowCounts):
    """Running ``Phi^T W Phi`` and ``Phi^T W Y`` over feature rows, with their counts.

    Statistics of disjoint data add up (:meth:`merge`), which is how
    streaming, ``partial_fit`` and Dask fits work; the normal-equation
    solvers finish a fit from them.  The Gram matrix
    ``G[(p, l), (q, m)] = sum_r w_r S_rp S_rq x_rl x_rm`` is symmetric in
    ``(p, q)`` and in ``(l, m)`` separately, so only about a quarter of its
    psi**2 entries differ.  They are stored compactly and accumulated by one
    GEMM per chunk of rows (pair products of the folded moments times pair
    products of the tokens), about half the arithmetic of ``Phi.T @ Phi``;
    :attr:`gram` expands them.

    Parameters
    ----------
    d : int
        Token dimension.
    d_out : int or None, default=None
        Number of outputs; None accumulates the Gram matrix only (for the
        certificate).
    standardizer : TokenStandardizer or None, default=None
        Standardized coordinates the rows are accumulated in: every statistic
        is that of the standardized tokens, targets and weights.  None
        accumulates the data as given.

    Attributes
    ----------
    moment : ndarray of shape (psi, d_out) or None
        ``Phi^T W Y``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._features import attention_features
    >>> from sklearn_linattn._solvers import SufficientStatistics
    >>> X = np.random.default_rng(0).normal(size=(30, 4, 2))
    >>> lengths = np.full(30, 4)
    >>> a = SufficientStatistics(2).update(X[:10], lengths[:10])
    >>> b = SufficientStatistics(2).update(X[10:], lengths[10:])
    >>> H = attention_features(X, lengths)
    >>> bool(np.allclose(a.merge(b).gram, H.T @ H)), a.n_rows
    (True, 30)
    """

    has_gram = True
    # Groups of feature blocks whose Gram blocks are gathered (None: all of them).
    block_groups = None

    def __init__(self, d, d_out=None, *, standardizer=None, readout=None, terms=None):
        super().__init__(d, d_out, standardizer=standardizer, readout=readout, terms=terms)
        P = self.standardizer.n_moments
        self._compact = np.zeros((n_pairs(P), n_pairs(self.d)))
        self.moment = None if self.d_out is None else np.zeros((self.n_features, self.d_out))

    def gather_block_groups(self, groups):
        """Gather only the Gram blocks of feature blocks in one group (before any row).

        For statistics whose feature blocks (decays) are read in groups, never
        two groups together (the candidates of a search over decays): the
        cross blocks of two groups are neither gathered nor stored (the
        distinct entries of each group's blocks are stored group after
        group), so the whole Gram matrix is not available; :meth:`blocks`
        within one group is.  The moment, counts and targets are whole.

        Parameters
        ----------
        groups : sequence of sequences of int
            A partition of the block indices; one group gathers everything.
        """
        groups = tuple(tuple(sorted(int(b) for b in g)) for g in groups)
        if sorted(b for g in groups for b in g) != list(range(self.standardizer.n_blocks)):
            raise ValueError(
                f"groups must partition the {self.standardizer.n_blocks} feature blocks; got "
                f"{groups!r}.")
        if self.n_rows:
            raise ValueError("the groups of blocks are fixed before the first row.")
        self.block_groups = groups if len(groups) > 1 else None
        if self.block_groups is not None:
            self._compact = np.zeros((self._segments()[-1][2], n_pairs(self.d)))
        return self

    def _segments(self):
        """Per group of blocks: its moments and its rows ``start:stop`` of the stored entries."""
        P1, out, stop = n_pairs(self.d), [], 0
        for group in self.block_groups:
            moments = _block_moments(group, P1)
            out.append((moments, stop, stop + n_pairs(moments.size)))
            stop = out[-1][2]
        return out

    @property
    def gram(self):
        """The full Gram matrix ``Phi^T W Phi``, shape (psi, psi), as a new array."""
        return self.expanded_gram()

    def expanded_gram(self, *, upper=False):
        """The Gram matrix ``Phi^T W Phi`` as a new (psi, psi) array.

        Parameters
        ----------
        upper : bool, default=False
            Write only the blocks ``G[(p, .), (q, .)]`` with ``p <= q``: the
            upper triangle (and the diagonal blocks whole), zeros below, for
            the LAPACK and BLAS calls that read one triangle (half the
            writes).
        """
        if self.block_groups is not None:
            raise ValueError(
                f"these statistics gather the Gram blocks within the groups of feature blocks "
                f"{self.block_groups} only: the whole Gram matrix is not available; blocks() "
                "gives the statistics of one group's blocks.")
        P, d = self.standardizer.n_moments, self.d
        unfold = pair_index_matrix(d).ravel()
        offsets = _pair_offsets(P)
        G = (np.zeros if upper else np.empty)((P, d, P, d))
        # The stored rows (p, q), q >= p, are consecutive for each p and each
        # holds the symmetric d x d block G[(p, .), (q, .)] (also the block
        # (q, p)): a block row at a time is unfolded and written whole, rows
        # of G written contiguously (a gather of every entry, or a scatter of
        # single blocks, costs several times more at large psi).
        for p in range(P):
            blocks = self._compact[offsets[p]:offsets[p + 1]][:, unfold].reshape(P - p, d, d)
            G[p, :, p:, :] = blocks.transpose(1, 0, 2)
            if not upper:
                G[p + 1:, :, p, :] = blocks[1:]
        return G.reshape(self.n_features, self.n_features)

    def _set_gram(self, value):
        """Store the distinct entries of a psi x psi matrix with the Gram matrix's symmetries."""
        self._compact = self._compact_of(value)

    def _compact_of(self, value):
        """The distinct entries of a psi x psi matrix with the Gram matrix's symmetries."""
        P = self.standardizer.n_moments
        jp, kp = pair_indices(P)
        jd, kd = pair_indices(self.d)
        G4 = np.asarray(value, dtype=np.float64).reshape(P, self.d, P, self.d)
        return np.ascontiguousarray(G4[jp[:, None], jd[None, :], kp[:, None], kd[None, :]])

    def add_rows(self, rows):
        """Add standardized rows (:class:`~.._moments.Rows`): Gram matrix, moment, counts."""
        per_row = 3 * self.standardizer.n_moments + 2 * self.d + (self.d_out or 0) * (self.d + 2)
        for sl in sample_chunks(rows.n_rows, per_row):
            self._accumulate(rows.S[sl], rows.x[sl], None if rows.w is None else rows.w[sl],
                             None if rows.Y is None else rows.Y[sl])
        return self

    def _accumulate(self, S, x, w, Yr):
        """Add the rows ``kron(S_r, x_r)`` with weights w (None: ones) and targets Yr."""
        m = S.shape[0]
        if m == 0:
            return
        if self.n_features <= _ROWS_UP_TO_PSI:
            # The moment and y_sq come out of the same SYRK.
            self._accumulate_rows(S, x, w, Yr)
        else:
            self._accumulate_pairs(S, x, w)
        if Yr is not None:
            Yw = Yr if w is None else Yr * w[:, None]
            self.y_sum += Yw.sum(axis=0)
        if Yr is not None and self.n_features > _ROWS_UP_TO_PSI:
            self.moment += features_rmatvec(S, x, Yw).T
            self.y_sq += np.einsum("ra,ra->a", Yw, Yr)
            self.y_cross += Yw.T @ Yr
        self.n_rows += m
        self.weight_sum += float(m if w is None else w.sum())
        self.min_weight = min(self.min_weight, 1.0 if w is None else float(w.min()))

    def _accumulate_rows(self, S, x, w, Yr):
        """Small psi: transposed feature rows (and targets) and one SYRK per block of rows.

        At psi <= 64 the pair products of :meth:`_accumulate_pairs` save
        little arithmetic and cost more memory traffic than the rows
        themselves, built here with long inner loops (rows along the last
        axis) a cache-sized block at a time.  The targets ride along as
        extra rows, so the same product gives ``Phi^T W Y`` and the weighted
        sums of squares of the targets.
        """
        m, P = S.shape
        d, psi = self.d, self.n_features
        d_out = 0 if Yr is None else Yr.shape[1]
        St, xt = np.ascontiguousarray(S.T), np.ascontiguousarray(x.T)
        Yt = None if Yr is None else np.ascontiguousarray(Yr.T)
        sw = None if w is None else np.sqrt(w)
        ns = active()
        step = max(1, (_GRAM_BLOCK_VALUES if ns.host_memory else _DEVICE_BLOCK_VALUES)
                   // (psi + d_out))
        buffer = np.empty((psi + d_out, min(step, m)))
        G = np.zeros((psi + d_out, psi + d_out))
        for start in range(0, m, step):
            stop = min(start + step, m)
            H = buffer[:, : stop - start]
            np.multiply(St[:, None, start:stop], xt[None, :, start:stop],
                        out=H[:psi].reshape(P, d, stop - start))
            if Yt is not None:
                H[psi:] = Yt[:, start:stop]
            if sw is not None:
                H *= sw[start:stop]
            G += H @ H.T if ns.is_numpy else ns.matmul(H, H.T)
        jp, kp = pair_indices(P)
        jd, kd = pair_indices(d)
        index = (jp[:, None] * d + jd[None, :]) * (psi + d_out) + (kp[:, None] * d + kd[None, :])
        if self.block_groups is None:
            self._compact += G.reshape(-1)[index]
        else:  # the pairs within each group, group after group
            rows = np.concatenate([_pair_rows(P, m) for m, _, _ in self._segments()])
            self._compact += G.reshape(-1)[index[rows]]
        if Yt is not None:
            self.moment += G[:psi, psi:]
            self.y_sq += np.diagonal(G[psi:, psi:])
            self.y_cross += G[psi:, psi:]

    def _accumulate_pairs(self, S, x, w):
        """Distinct Gram entries from pair products of the moments and of the tokens."""
        jd, kd = pair_indices(self.d)
        B = x[:, jd] * x[:, kd]
        if w is not None:
            B *= w[:, None]
        St = np.ascontiguousarray(S.T)
        if self.block_groups is None:
            _add_pair_products(self._compact, St, B)
            return
        for moments, start, stop in self._segments():
            # Each group's Gram blocks as statistics of its blocks alone gather them.
            _add_pair_products(self._compact[start:stop], St[moments], B)

    def restandardized(self, standardizer):
        """The same statistics in other standardized coordinates (a new object).

        The feature rows of the two coordinates differ by a Kronecker map
        (:func:`~.._units.feature_map`) and the weights and targets by
        powers of two, so the Gram matrix and the moment are transformed
        exactly (to rounding) instead of being accumulated again.  Where the
        map of the tokens is far from a rotation times a scale
        (:func:`~.._units.map_is_accurate`: new coordinates that
        stretch directions the data hardly reach, as a ``partial_fit`` whose
        later batches change a collinear whitening), the map's cancellations
        would round the Gram matrix's zero eigenvalues up into spurious rank;
        its non-zero eigenpairs are mapped instead (one eigen-decomposition),
        so the mapped statistics have the same rank.

        Parameters
        ----------
        standardizer : TokenStandardizer
            The new coordinates.

        Returns
        -------
        SufficientStatistics
            A new object; this one is unchanged.
        """
        out, wf, target_map = self._copy_into(standardizer)
        if wf is None:
            return out
        A, B = feature_map(self.standardizer, standardizer)
        P, d = A.shape[0], self.d
        if self.block_groups is None:
            out._compact = self._mapped_compact(A, B, wf)
        else:
            # Every block's moments map alike (A is block diagonal): each
            # group's Gram blocks are mapped on their own.
            decays = self.standardizer.decays
            for group, (moments, start, stop) in zip(self.block_groups, self._segments()):
                part = self.blocks(group, tuple(decays[b] for b in group))
                out._compact[start:stop] = part._mapped_compact(A[np.ix_(moments, moments)],
                                                                B, wf)
        if self.moment is not None:
            b = self.moment.reshape(P, d, self.d_out)
            b = np.einsum("ip,jl,pla->ija", A, B, b).reshape(P * d, self.d_out)
            out.moment = (b @ target_map) * wf
        return out

    def _mapped_compact(self, A, B, wf):
        """The compact Gram matrix mapped by ``kron(A, B)`` and scaled by ``wf``."""
        P, d = A.shape[0], self.d
        if map_is_accurate(B):
            return self._compact_of(_mapped_gram(self.gram.reshape(P, d, P, d), A, B) * wf)
        # Mapping G itself would round its zero eigenvalues up by the map's
        # cancellations; its factor keeps them zero (the rank is kept).
        F = self._gram_factor().reshape(P, d, -1)
        F = np.einsum("ip,jl,plr->ijr", A, B, F).reshape(P * d, -1)
        return self._compact_of((F @ F.T) * wf)

    def _gram_factor(self):
        """``F`` (psi, r) with ``G = F F^T`` to the zero tolerance: its non-zero eigenpairs."""
        w, U = descending_eigh(self.gram, overwrite_a=True)
        r = int(np.count_nonzero(w > rank_tolerance(w, w.size, self.dtype, self.n_rows)))
        return U[:, :r] * np.sqrt(w[:r])

    def target_columns(self, cols, terms):
        """The same statistics with some of the targets only (a new object).

        The Gram matrix is the same; the moment keeps the columns ``cols``
        (see :meth:`RowCounts.target_columns`).
        """
        out = super().target_columns(cols, terms)
        if self.moment is not None:
            out.moment = self.moment[:, cols].copy()
        return out

    def blocks(self, which, decays):
        """The statistics of some feature blocks, in a given order (a new object).

        Parameters
        ----------
        which : sequence of int
            Indices of this object's feature blocks (decays), in the order of
            the new statistics' blocks.
        decays : tuple of float or None
            The new statistics' decays (None for one block without decay).

        Returns
        -------
        SufficientStatistics
            The same rows with the features of those blocks only: the Gram
            matrix's and moment's rows and columns of those blocks, read from
            the distinct entries as they are stored (the whole Gram matrix is
            never formed).
        """
        which = [int(b) for b in which]
        moments = _block_moments(which, n_pairs(self.d))
        if self.block_groups is None:
            rows = _pair_rows(self.standardizer.n_moments, moments)
        else:
            segment = [seg for group, seg in zip(self.block_groups, self._segments())
                       if set(which) <= set(group)]
            if not segment:
                raise ValueError(
                    f"blocks {which} are not within one of the groups {self.block_groups} "
                    "whose Gram blocks these statistics gathered.")
            stored, start, _ = segment[0]
            # The moments' places among the group's, whose pairs are stored from start on.
            rows = start + _pair_rows(stored.size, np.searchsorted(stored, moments))
        out = type(self).__new__(type(self))
        out.__dict__.update({k: (v.copy() if isinstance(v, np.ndarray) else v)
                             for k, v in self.__dict__.items()
                             if k not in ("_compact", "moment")})
        out.block_groups = None
        out.standardizer = self.standardizer.with_decays(decays)
        # One stored group, or statistics' own blocks in order: a copy of consecutive rows.
        contiguous = rows.size and np.all(np.diff(rows) == 1)
        out._compact = (self._compact[rows[0]:rows[-1] + 1].copy() if contiguous
                        else self._compact[rows])
        out.moment = None if self.moment is None else self.moment[
            (moments[:, None] * self.d + np.arange(self.d)).ravel()]
        return out

    def merge(self, other):
        """Add the statistics of other (disjoint) data, in place.

        Parameters
        ----------
        other : SufficientStatistics
            Same ``d``, ``d_out``, readout and standardized coordinates, and
            the same groups of blocks (:meth:`gather_block_groups`), or whole
            statistics, whose groups' blocks are added.

        Returns
        -------
        self : SufficientStatistics
            The merged statistics.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn._solvers import SufficientStatistics
        >>> X = np.random.default_rng(0).normal(size=(8, 3, 2))
        >>> Y = X[:, -1, :1]
        >>> whole = SufficientStatistics(2, 1).update(X, np.full(8, 3), Y)
        >>> parts = [SufficientStatistics(2, 1).update(X[i::2], np.full(4, 3), Y[i::2])
        ...          for i in range(2)]
        >>> merged = parts[0].merge(parts[1])
        >>> bool(np.allclose(merged.gram, whole.gram)), merged.n_samples
        (True, 8)
        """
        groups = getattr(other, "block_groups", None)  # (other is checked below)
        if groups not in (None, self.block_groups):
            raise ValueError(
                f"cannot merge statistics that gather the Gram blocks of groups {groups} into "
                f"statistics that gather those of {self.block_groups}.")
        super().merge(other)
        if self.block_groups is None or groups is not None:
            self._compact += other._compact
        else:  # whole statistics: their groups' blocks
            P = self.standardizer.n_moments
            for moments, start, stop in self._segments():
                self._compact[start:stop] += other._compact[_pair_rows(P, moments)]
        if self.moment is not None:
            self.moment += other.moment
        return self
