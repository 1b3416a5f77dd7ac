"""Repairing a failed certificate: the fewest candidate sequences that close its null space."""

import dataclasses
import math
import numbers

import numpy as np

from ._certificate import IdentifiabilityCertificate, certify_identifiability
from ._features import attention_features, prefix_features
from ._validation import check_readout, check_sequences
from ._params import check_number, validate_random_state

__all__ = ["RepairResult", "repair_certificate"]

_EPS = np.finfo(np.float64).eps
# A direction counts as new when its squared size exceeds this many times the
# certificate's thresholds (the eigenvalue tol times the row weight, and the
# rounding level relative to the candidate's own energy).
_SAFETY = 16.0
# Each round of a generator draws max(_MIN_DRAW, 2 * remaining) candidates.
_MIN_DRAW = 16


@dataclasses.dataclass(frozen=True)
class RepairResult:  # numpydoc ignore=PR01
    """The sequences chosen to repair a certificate, and the certificate they give.

    Returned by :func:`repair_certificate`.  Truthy iff the goal was reached.

    Attributes
    ----------
    indices : ndarray of int or None
        Positions of the chosen sequences in ``candidates``; None for a generator.
    added : ndarray of shape (n_added, n_tokens, d)
        The chosen sequences, NaN-padded, in the order chosen.
    certificate : IdentifiabilityCertificate
        The certificate (``solver="eigh"``) of the training sequences and ``added``.
    n_added : int
        Number of sequences chosen.
    reached : bool
        Whether ``certificate`` holds, or with a ``target`` covers all of it.
    null_dimension : int
        ``n_features - certificate.rank``: undetermined directions left.
    n_uncovered : int
        Number of ``target`` sequences not covered (0 without a target).
    lower_bound : int
        Fewest additions any choice could need, from the initial certificate.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import repair_certificate
    >>> rng = np.random.default_rng(0)
    >>> result = repair_certificate(rng.normal(size=(4, 4, 2)), rng.normal(size=(20, 4, 2)))
    >>> bool(result), result.n_added, result.lower_bound
    (True, 2, 2)
    """

    indices: np.ndarray | None
    added: np.ndarray
    certificate: IdentifiabilityCertificate
    n_added: int
    reached: bool
    null_dimension: int
    n_uncovered: int
    lower_bound: int

    def __bool__(self):
        return self.reached

    def __repr__(self):
        return (f"RepairResult(n_added={self.n_added}, reached={self.reached}, "
                f"null_dimension={self.null_dimension}, n_uncovered={self.n_uncovered}, "
                f"lower_bound={self.lower_bound})")


def _padded(X, lengths, n_tokens):
    """Zero-padded sequences (n, t, d) as NaN-padded (n, n_tokens, d)."""
    out = np.full((X.shape[0], n_tokens, X.shape[2]), np.nan)
    t = min(X.shape[1], n_tokens)
    real = np.arange(t)[None, :] < lengths[:, None]
    out[:, :t][real] = X[:, :t][real]
    return out


def _union(parts):
    """NaN-padded concatenation of (X, lengths) pairs."""
    n_tokens = max(int(L.max(initial=1)) for _, L in parts)
    return np.concatenate([_padded(X, L, n_tokens) for X, L in parts])


def _rows(cert, X, lengths, readout):
    """Feature rows (n, t, psi) of zero-padded X in the certificate's coordinates."""
    st = cert.standardization
    Xs = st.transform(X)
    H = attention_features(Xs, lengths, st.decays)[:, None, :] if readout == "last" else (
        prefix_features(Xs, lengths, st.decays))
    return st.scale_features(H)


def _null_basis(cert):
    """Orthonormal basis (psi, k) of the directions the certificate leaves undetermined."""
    space = cert._row_space
    V = space.eigenvectors
    if V.shape[1] == space.n_features:
        return V[:, space.rank:]
    Q = np.linalg.qr(V[:, : space.rank], mode="complete")[0]
    return Q[:, space.rank:]


class _Greedy:
    """One round of the greedy in the null coordinates of one failed dense certificate."""

    def __init__(self, cert, H, T=None):
        space = cert._row_space
        B = _null_basis(cert)
        self.k = B.shape[1]
        m, t, psi = H.shape
        self.R = (H.reshape(-1, psi) @ B).reshape(m, t, self.k)
        self.hh = np.einsum("mtp,mtp->m", H, H)
        self.weight = space.weight_sum
        self.tol = space.tol
        self.rel = _SAFETY * space.rounding_tol / max(space.lambda_max, np.finfo(float).tiny)
        self.available = self.hh > 0
        self.target = None
        if T is not None:
            tt = np.einsum("rp,rp->r", T, T)
            covered, lev = space.coverage(T[:, None, :])
            self.allow = space.allowance(tt, lev[:, 0])
            scale = np.sqrt(np.where(tt > 0, tt, 1.0))
            self.target = (T @ B) / scale[:, None]  # unit rows: each counts alike
            self.allow = self.allow / scale**2

    def remaining(self):
        """Dimension still to close: k, or that of the uncovered target components."""
        if self.target is None:
            return self.k
        energy = np.einsum("rk,rk->r", self.target, self.target)
        open_rows = self.target[energy > self.allow]
        if not open_rows.shape[0]:
            return 0
        s = np.linalg.svd(open_rows, compute_uv=False)
        return int(np.count_nonzero(s**2 > self.rel * max(1.0, float(s[0]) ** 2)))

    def _directions(self):
        """Per candidate: its new directions (m, r, k), which count (m, r), and gains."""
        gain_tol = _SAFETY * self.tol * (self.weight + self.R.shape[1])
        thr = np.maximum(gain_tol, self.rel * self.hh)
        if self.R.shape[1] == 1:
            r = self.R[:, 0, :]
            s2 = np.einsum("mk,mk->m", r, r)
            with np.errstate(invalid="ignore", divide="ignore"):
                dirs = (r / np.sqrt(np.where(s2 > 0, s2, 1.0))[:, None])[:, None, :]
            return dirs, (s2 > thr)[:, None], s2[:, None]
        _, s, Vt = np.linalg.svd(self.R, full_matrices=False)
        return Vt, s**2 > thr[:, None], s**2

    def step(self):
        """Choose one candidate and update every residual; its index, or None."""
        dirs, useful, s2 = self._directions()
        useful &= self.available[:, None]
        rank = useful.sum(axis=1)
        best = None
        if self.target is not None:
            # Target energy the candidate's new directions absorb.
            absorbed = np.einsum("rk,mik->mir", self.target, dirs) ** 2
            score = np.where(useful, absorbed.sum(axis=2), 0.0).sum(axis=1)
            best = int(np.argmax(score))
            if not score[best] > self.rel:
                best = None  # no single candidate helps now: widen the span instead
        if best is None:
            energy = np.where(useful, s2, 0.0).sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                score = np.where(rank > 0, energy / self.hh, -1.0)
            key = np.lexsort((-score, -rank))  # most new directions, then most energy
            best = int(key[0])
            if rank[best] == 0:
                return None
        U = dirs[best][useful[best]].T  # (k, r), orthonormal
        # Re-orthogonalize against rounding before the rank-r update.
        U = np.linalg.qr(U)[0]
        self.R -= (self.R @ U) @ U.T[None]
        if self.target is not None:
            self.target -= (self.target @ U) @ U.T
        self.available[best] = False
        self.weight += self.R.shape[1]
        if self.target is None:
            self.k -= U.shape[1]
        return best


def _check_max_added(max_added):
    return check_number(max_added, "max_added", integer=True, low=0, allow_none=True)


def _draw(generate, k, rng, d):
    """``generate(k, rng)``, validated as k sequences of token dimension d."""
    out = generate(k, rng)
    try:
        Xc, Lc = check_sequences(out, n_features_in=d, name="the candidates generate(k, rng) "
                                 "returned", expected_by="the training sequences have it")
    except TypeError as exc:
        raise TypeError(f"candidates: {exc}") from None
    if Xc.shape[0] == 0:
        raise ValueError(f"candidates: generate({k}, rng) returned no sequences.")
    return Xc, Lc


def repair_certificate(
    X, candidates, *, readout="last", target=None, max_added=None, tol=None, random_state=None,
):
    """Choose the fewest candidate sequences to add so that the certificate holds.

    Greedy in the null space of the certificate; the fewest possible for
    ``readout="last"`` without a target, a heuristic otherwise.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Training sequences, NaN-padded (trailing all-NaN tokens are padding).
    candidates : array-like of shape (m, n_tokens_c, d), list of (n_i, d) arrays, or callable
        The pool, or a generator ``candidates(k, rng)`` of k new sequences
        (``rng``: a :class:`numpy.random.Generator`), called with ``k =
        max(16, 2 r)``, r the dimension still to close, until nothing is chosen.
    readout : {"last", "all"}, default="last"
        One feature row per sequence, or one per prefix, as in
        :func:`~sklearn_linattn.certify_identifiability`.
    target : array-like of shape (n_target, n_tokens_t, d), list of arrays, or None, default=None
        Held-out inputs to make covered; None: repair the certificate itself.
    max_added : int or None, default=None
        Most sequences to add; None: no limit beyond the pool.
    tol : float or None, default=None
        Eigenvalue threshold of every certificate computed.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the ``rng`` handed to a generator; unused for a fixed pool.

    Returns
    -------
    result : RepairResult
        The chosen sequences and the recomputed certificate; falsy (no error)
        when the pool cannot reach the goal.

    Raises
    ------
    ValueError
        If ``candidates`` or ``target`` do not have the token dimension of X,
        or a parameter is out of range.
    TypeError
        If ``candidates`` is neither sequences nor callable.

    See Also
    --------
    certify_identifiability : The certificate being repaired.

    Examples
    --------
    >>> from sklearn_linattn import certify_identifiability, repair_certificate
    >>> from sklearn_linattn.datasets import make_associative_memory
    >>> X, _ = make_associative_memory(200, 2, distribution="orthonormal", random_state=0)
    >>> bool(certify_identifiability(X))
    False
    >>> pool, _ = make_associative_memory(30, 2, random_state=1)  # Gaussian memories
    >>> result = repair_certificate(X, pool)
    >>> bool(result.certificate), result.n_added, result.indices.shape
    (True, 4, (4,))
    """
    check_readout(readout)
    max_added = _check_max_added(max_added)
    tol = check_number(tol, "tol", low=0.0, allow_none=True)
    X, lengths = check_sequences(X)
    d = X.shape[2]
    expected = "the training sequences X have it"
    generate = candidates if callable(candidates) else None
    if generate is None:
        if isinstance(candidates, (str, bytes, numbers.Number)) or candidates is None:
            raise TypeError(
                "candidates must be sequences (an array of shape (m, n_tokens, d) or a list "
                f"of (n_i, d) arrays) or a callable generate(k, rng); got {candidates!r} of "
                f"type {type(candidates).__name__}."
            )
        pool, pool_lengths = check_sequences(
            candidates, n_features_in=d, name="candidates", expected_by=expected)
        rng = None
    else:
        rng = (random_state if isinstance(random_state, np.random.Generator)
               else np.random.default_rng(validate_random_state(random_state).randint(2**31)))
    if target is not None:
        target, target_lengths = check_sequences(
            target, n_features_in=d, name="target", expected_by=expected)

    def certify(parts):
        return certify_identifiability(_union(parts), readout=readout, tol=tol, solver="eigh")

    def goal(cert):
        if target is None:
            return bool(cert), 0
        uncovered = int(np.count_nonzero(~cert.covers(_padded(target, target_lengths,
                                                              target.shape[1]))))
        return uncovered == 0, uncovered

    def target_rows(cert):
        if target is None:
            return None
        return _rows(cert, target, target_lengths, readout).reshape(-1, cert.n_features)

    parts = [(X, lengths)]
    cert = certify(parts)
    chosen, chosen_parts = [], []
    budget = math.inf if max_added is None else max_added
    reached, uncovered = goal(cert)
    rows_max = 1 if readout == "last" else (
        int(pool_lengths.max(initial=1)) if generate is None else 1)
    to_close = 0 if reached else _Greedy(cert, np.zeros((0, 1, cert.n_features)),
                                         target_rows(cert)).remaining()
    taken = np.zeros(0 if generate is not None else pool.shape[0], dtype=bool)
    n_chosen = 0
    while not reached and n_chosen < budget:
        if generate is None:
            left = np.flatnonzero(~taken)
            Xc, Lc = pool[left], pool_lengths[left]
        else:
            g0 = _Greedy(cert, np.zeros((0, 1, cert.n_features)), target_rows(cert))
            Xc, Lc = _draw(generate, max(_MIN_DRAW, 2 * g0.remaining()), rng, d)
            if readout == "all":
                rows_max = max(rows_max, int(Lc.max(initial=1)))
            left = np.arange(Xc.shape[0])
        if not Xc.shape[0]:
            break
        greedy = _Greedy(cert, _rows(cert, Xc, Lc, readout), target_rows(cert))
        picked = []
        while n_chosen + len(picked) < budget and greedy.remaining() > 0:
            j = greedy.step()
            if j is None:
                break
            picked.append(j)
        if not picked:
            break
        picked = np.asarray(picked)
        n_chosen += picked.size
        if generate is None:
            taken[left[picked]] = True
            chosen.extend(left[picked].tolist())
        chosen_parts.append((Xc[picked], Lc[picked]))
        cert = certify(parts + chosen_parts)
        reached, uncovered = goal(cert)
    added_parts = chosen_parts or [(np.zeros((0, 1, d)), np.zeros(0, dtype=np.int64))]
    added = _union(added_parts)
    n_added = added.shape[0]
    return RepairResult(
        indices=None if generate is not None else np.asarray(chosen, dtype=np.intp),
        added=added, certificate=cert, n_added=n_added, reached=bool(reached),
        null_dimension=int(cert.n_features - cert.rank), n_uncovered=uncovered,
        lower_bound=int(math.ceil(to_close / rows_max)),
    )
