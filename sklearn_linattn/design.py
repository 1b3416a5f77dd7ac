"""Learn with the fewest samples: designed identifying inputs, and learning from an oracle.

The certificate of :func:`~sklearn_linattn.certify_identifiability` is about
the inputs only, so when the inputs can be chosen (a layer one can query, a
simulator) they can be chosen to identify the model with the fewest
sequences the algebra allows, and as well conditioned as possible:

- :func:`minimum_design_size`: the fewest sequences whose feature rows can
  have full rank psi = d**2 (d + 1) / 2;
- :func:`identifying_design`: such sequences, with the certificate's
  ``min_eigenvalue`` made large by a local optimization;
- :func:`learn_from_oracle`: queries a function on designed batches until
  the fitted model is identified (and, for a noisy function, until the
  certificate's error bound meets a tolerance).

How many sequences
------------------
With ``readout="last"`` every sequence gives one feature row, so psi
sequences are needed, and psi sequences of at least two tokens suffice
(generic inputs reach full rank).  With ``readout="all"`` every prefix is a
row, but the first prefix of a sequence, ``x_1``, has the features
``x_1 x_1^T (x) x_1``: only the ``d (d + 1) (d + 2) / 6`` symmetric cubic
monomials, whatever the number of sequences.  n sequences of T tokens thus
give at most ``min(n, d (d + 1) (d + 2) / 6) + n (T - 1)`` independent rows,
and generic inputs attain it (measured: ``benchmarks/designed_data.py``), so
the fewest sequences is the least n for which this reaches psi:
``ceil(psi / T)`` for T >= 3 (and for T = 2 with d <= 4), more for T = 2
and d >= 5 (70 instead of 63 at d = 6).

How the design is built
-----------------------
The certificate's ``min_eigenvalue`` is the least eigenvalue of ``Lambda_D =
Phi^T Phi / N`` for the whitened tokens (unit token second moment), a
smooth function of the inputs away from repeated eigenvalues.  Starting from
Gaussian sequences, :func:`identifying_design` maximizes the smooth
criterion ``phi_p = (mean(lambda_i**-p))**(-1/p)`` (Kiefer's criteria;
p = 1 is A-optimality, p -> infinity is E-optimality, ``lambda_min``) by
L-BFGS with its exact gradient, for p = 1, 4, 16, 64 in turn, each stage
starting from the last; the gradient includes the whitening, so the
criterion is exactly that of the certificate.  The result is returned
whitened.
"""

import math
import warnings

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.stats
from sklearn.exceptions import ConvergenceWarning

from ._certificate import certify_identifiability
from ._estimators import LinearAttentionRegressor
from ._features import n_attention_features, pair_indices, row_factors
from ._memory import resolve_budget
from ._validation import check_readout, check_sequences
from ._params import check_number, validate_random_state

__all__ = ["OracleFit", "identifying_design", "learn_from_oracle", "minimum_design_size"]

# The stages of the criterion phi_p, from A-optimal towards E-optimal.
_STAGES = (1.0, 4.0, 16.0, 64.0)


def _n_symmetric_cubics(d):
    """Number of cubic monomials x_j x_k x_l, j <= k <= l: the span of a first prefix."""
    return d * (d + 1) * (d + 2) // 6


def _check_size(value, name, low=1):
    return int(check_number(value, name, integer=True, low=low))


def minimum_design_size(d, *, n_tokens, readout="last"):
    """The fewest sequences whose feature rows can identify the model.

    Parameters
    ----------
    d : int
        Token dimension, at least 1.
    n_tokens : int
        Number of tokens of every sequence, at least 1.
    readout : {"last", "all"}, default="last"
        ``"last"``: one feature row per sequence, so psi = d**2 (d + 1) / 2
        sequences.  ``"all"``: one row per prefix; the first prefix of every
        sequence only spans the d (d + 1) (d + 2) / 6 symmetric cubic
        monomials, so the least n with ``min(n, d (d + 1) (d + 2) / 6) + n
        (n_tokens - 1) >= psi``.

    Returns
    -------
    n_samples : int
        The fewest sequences of ``n_tokens`` tokens with which the
        certificate can hold; generic (and the designed) inputs of that size
        make it hold.

    Raises
    ------
    ValueError
        When no number of sequences of that length can identify the model:
        sequences of one token (for d >= 2) only ever give symmetric cubic
        features.

    Examples
    --------
    >>> from sklearn_linattn.design import minimum_design_size
    >>> minimum_design_size(3, n_tokens=4)
    18
    >>> minimum_design_size(3, n_tokens=4, readout="all")  # ceil(18 / 4)
    5
    >>> minimum_design_size(6, n_tokens=2, readout="all")  # not ceil(126 / 2) = 63
    70
    """
    d = _check_size(d, "d")
    n_tokens = _check_size(n_tokens, "n_tokens")
    check_readout(readout)
    psi = n_attention_features(d)
    cubics = _n_symmetric_cubics(d)
    if n_tokens == 1 and cubics < psi:
        raise ValueError(
            f"n_tokens must be at least 2 for d = {d}: sequences of one token x only have "
            f"the features x x^T (x) x, which span {cubics} of the psi = {psi} dimensions "
            "whatever the number of sequences; got n_tokens=1."
        )
    if readout == "last":
        return psi
    if math.ceil(psi / n_tokens) <= cubics:
        return math.ceil(psi / n_tokens)
    return math.ceil((psi - cubics) / (n_tokens - 1))


# ---------------------------------------------------------------- the criterion


def _whiten(X):
    """``(X M^{-1/2}, M^{-1/2})`` with M the token second moment of X (n, T, d)."""
    d = X.shape[2]
    F = X.reshape(-1, d)
    w, U = np.linalg.eigh(F.T @ F / F.shape[0])
    if w[0] <= 1e-12 * w[-1]:
        return None, None
    W = (U / np.sqrt(w)) @ U.T
    return X @ W, W


def _feature_rows(Y, readout):
    """Standardized feature rows of whitened Y: weighted moments, last tokens, rows."""
    n, T, d = Y.shape
    j, k = pair_indices(d)
    weights = np.where(j == k, 1.0, np.sqrt(2.0))
    S, x, _ = row_factors(Y, np.full(n, T), readout)
    S = np.ascontiguousarray(S) * weights
    Phi = (S[:, :, None] * x[:, None, :]).reshape(S.shape[0], -1)
    return S, x, Phi, weights


def _criterion(X, readout, p):
    """``log phi_p`` of the certificate's ``Lambda_D`` at X and its gradient in X.

    The criterion is invariant to invertible maps of the tokens, so its
    gradient at X is the gradient at the whitened ``Y = X W`` times W; at a
    whitened point, the whitening's first-order change ``-Y dM / 2`` removes
    ``Y sym(Y^T G) / n_tokens_total`` from the plain gradient G.
    """
    n, T, d = X.shape
    Y, W = _whiten(X)
    if Y is None:
        return -np.inf, np.zeros_like(X)
    S, x, Phi, weights = _feature_rows(Y, readout)
    N = Phi.shape[0]
    lam, U = np.linalg.eigh(Phi.T @ Phi / N)
    if lam[0] <= 1e-13 * lam[-1]:
        return -np.inf, np.zeros_like(X)
    ratio = (lam[0] / lam) ** p
    total = ratio.sum()
    value = math.log(lam[0]) - math.log(total / lam.size) / p
    # d value / d Lambda = lambda^{-p-1} / sum lambda^{-p}, in the eigenbasis.
    Gm = (U * (ratio / lam / total)) @ U.T
    A = ((Phi @ Gm) * (2.0 / N)).reshape(N, -1, d)
    grad_last = np.einsum("rp,rpl->rl", S, A)
    grad_moments = np.einsum("rpl,rl->rp", A, x) * weights
    j, k = pair_indices(d)
    B = np.zeros((N, d, d))
    diagonal = j == k
    B[:, j, k] += grad_moments * np.where(diagonal, 1.0, 0.5)
    B[:, k, j] += grad_moments * np.where(diagonal, 0.0, 0.5)
    if readout == "last":
        G = 2.0 * np.einsum("ijk,itk->itj", B, Y)
        G[:, -1] += grad_last
    else:  # a token enters every prefix from its position on
        B = np.cumsum(B.reshape(n, T, d, d)[:, ::-1], axis=1)[:, ::-1]
        G = 2.0 * np.einsum("itjk,itk->itj", B, Y) + grad_last.reshape(n, T, d)
    Yf, Gf = Y.reshape(-1, d), G.reshape(-1, d)
    C = Yf.T @ Gf
    Gf = Gf - Yf @ ((C + C.T) / (2.0 * Yf.shape[0]))
    return value, (Gf @ W).reshape(X.shape)


def _check_design_memory(n_samples, n_tokens, d, readout):
    """Refuse, before allocating them, feature rows and Gram matrices beyond the budget.

    Each evaluation of the criterion holds the feature rows and their product
    with the gradient (two N x psi arrays) and the psi x psi Gram matrix with
    its eigenvectors and the gradient's matrix (three).
    """
    psi = n_attention_features(d)
    n_rows = n_samples * (1 if readout == "last" else n_tokens)
    need = 8.0 * (2 * n_rows * psi + 3 * psi * psi)
    budget = resolve_budget(None)
    if need > budget:
        raise ValueError(
            f"identifying_design needs about {need / 2**30:.3g} GiB for the feature rows and "
            f"Gram matrices of {n_rows} rows at d = {d} (psi = {psi}), more than the memory "
            f"budget of {budget / 2**30:.3g} GiB (half the physical memory)."
        )


def _optimize(X, readout, max_iter):
    """L-BFGS on ``-log phi_p`` for each p of the stages; returns the whitened result."""
    shape = X.shape
    for p in _STAGES:
        def objective(v, p=p):
            value, grad = _criterion(v.reshape(shape), readout, p)
            if not np.isfinite(value):
                return np.inf, np.zeros(v.size)
            return -value, -grad.ravel()

        result = scipy.optimize.minimize(
            objective, X.ravel(), jac=True, method="L-BFGS-B", options={"maxiter": max_iter},
        )
        if np.isfinite(result.fun):
            X = _whiten(result.x.reshape(shape))[0]
    return X


def identifying_design(d, *, n_tokens, readout="last", n_samples=None, max_iter=100,
                       random_state=None):
    """Input sequences that identify the model with the fewest samples, well conditioned.

    Parameters
    ----------
    d : int
        Token dimension.
    n_tokens : int
        Number of tokens of every sequence (at least 2 for d >= 2).
    readout : {"last", "all"}, default="last"
        The readout the design is for: the certificate of
        ``certify_identifiability(X, readout=readout)`` holds.
    n_samples : int or None, default=None
        Number of sequences; None is :func:`minimum_design_size`, the fewest
        possible.  More gives a larger ``min_eigenvalue``.
    max_iter : int, default=100
        L-BFGS iterations of each of the four stages of the optimization
        (0: the Gaussian starting point, whitened).
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the Gaussian starting point; the optimization is deterministic,
        so an integer gives the same design every time.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, d), float64
        Whitened sequences (their token second moment is the identity, the
        scale of standard Gaussian tokens) whose certificate holds, with its
        ``min_eigenvalue`` locally maximal (as the criterion's last stage
        leaves it).

    Raises
    ------
    ValueError
        If ``n_samples`` is below :func:`minimum_design_size` (no inputs of
        that size identify the model), before allocating feature rows and
        psi x psi matrices beyond the memory budget (half the physical
        memory; each criterion evaluation is then also an O(psi**3)
        eigen-decomposition), or for invalid arguments.

    See Also
    --------
    minimum_design_size : how many sequences, and why.
    learn_from_oracle : query a function on such designs.

    Notes
    -----
    The certificate's ``min_eigenvalue`` is the least eigenvalue of the
    standardized ``Lambda_D``; the design maximizes ``(mean(lambda_i**-p))**(-1/p)``
    for p = 1, 4, 16 and 64 in turn (each stage starting from the last),
    which tends to ``lambda_min`` as p grows while staying smooth where
    eigenvalues meet.  At the minimal size it is 3.5e3 to 4.8e5 times
    above i.i.d. Gaussian inputs of the same size for d >= 3 (see the user guide's
    table, ``benchmarks/designed_data.py``).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import certify_identifiability
    >>> from sklearn_linattn.design import identifying_design
    >>> X = identifying_design(2, n_tokens=3, random_state=0)
    >>> X.shape  # psi = 6 sequences, the fewest
    (6, 3, 2)
    >>> cert = certify_identifiability(X)
    >>> bool(cert), cert.min_eigenvalue > 100 * certify_identifiability(
    ...     np.random.default_rng(0).normal(size=X.shape)).min_eigenvalue
    (True, True)
    """
    d = _check_size(d, "d")
    n_tokens = _check_size(n_tokens, "n_tokens")
    n_min = minimum_design_size(d, n_tokens=n_tokens, readout=readout)
    if n_samples is None:
        n_samples = n_min
    n_samples = _check_size(n_samples, "n_samples")
    if n_samples < n_min:
        raise ValueError(
            f"n_samples must be at least {n_min} for d = {d}, n_tokens = {n_tokens} and "
            f"readout={readout!r}: fewer sequences never identify the psi = "
            f"{n_attention_features(d)} coefficients; got n_samples={n_samples}."
        )
    max_iter = _check_size(max_iter, "max_iter", low=0)
    _check_design_memory(n_samples, n_tokens, d, readout)
    rng = validate_random_state(random_state)
    for _ in range(10):  # a rank-deficient start has probability zero
        X = rng.standard_normal((n_samples, n_tokens, d))
        if np.isfinite(_criterion(X, readout, 1.0)[0]):
            break
    X = _whiten(X)[0] if max_iter == 0 else _optimize(X, readout, max_iter)
    # The claim is the certificate's, so the certificate checks it.
    if X is None or not certify_identifiability(X, readout=readout, solver="eigh"):
        raise ValueError(
            f"identifying_design found no identifying inputs of {n_samples} sequences of "
            f"{n_tokens} tokens at d = {d} (readout={readout!r}) from this random_state: "
            "the certificate of the result fails; try another random_state or more samples."
        )
    return X


# ---------------------------------------------------------------- learning from an oracle


class OracleFit:  # numpydoc ignore=PR01
    """What :func:`learn_from_oracle` learned, and from how many queries.

    Attributes
    ----------
    model : LinearAttentionRegressor
        Fitted on every sequence sent to the oracle; its ``certificate_``
        holds.
    n_queries : int
        Number of sequences sent to the oracle.
    n_calls : int
        Number of calls of the oracle.
    residual : float
        Relative residual of the fit, ``||y - model.predict(X)|| / ||y||``
        over every answer (0 when the rows do not exceed psi: the fit then
        interpolates any answers).
    noise : float
        Estimated standard deviation of the oracle's noise per output
        (0 for an oracle found exact).
    epsilon : float
        The excess empirical risk the error bound is computed for (0 for an
        exact oracle).
    error_bound : float
        Largest ``model.certificate_.error_bound(X_eval, epsilon)`` over the
        reference inputs: with probability at least ``1 - 2 delta`` under
        i.i.d. Gaussian noise, the true function is within it of the model
        there.  0 for an exact oracle, NaN when not computed (``tol=None``).
    linear_attention : bool or None
        True: the answers are a linear attention to rounding.  False: they
        are not (see ``note``).  None: not tested (the minimal design alone
        interpolates any answers).
    converged : bool
        Whether the goal was met: identification for ``tol=None``,
        ``error_bound <= tol`` otherwise.
    note : str
        What the residual says, in plain words.
    X : ndarray of shape (n_queries, n_tokens, d)
        Every sequence sent to the oracle, in order.
    y : ndarray
        The oracle's answers to X, in its own form: ``(n_queries,)`` or
        ``(n_queries, d_out)`` for ``readout="last"``, ``(n_queries,
        n_tokens)`` or ``(n_queries, n_tokens, d_out)`` for ``"all"``.
        A repeated query (``n_check``) is counted in ``n_queries`` but not
        kept here.

    See Also
    --------
    learn_from_oracle : what builds it.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward
    >>> from sklearn_linattn.design import learn_from_oracle
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 2, 2))
    >>> fit = learn_from_oracle(lambda X: mhla_forward(X, V, Q), 2, n_tokens=3, random_state=0)
    >>> fit.n_queries, fit.n_calls
    (6, 1)
    """

    def __init__(self, **fields):  # numpydoc ignore=PR01,EX01
        """Built by :func:`learn_from_oracle`."""
        self.__dict__.update(fields)

    def __repr__(self):
        return (
            f"OracleFit(n_queries={self.n_queries}, n_calls={self.n_calls}, "
            f"residual={self.residual:.3g}, error_bound={self.error_bound:.3g}, "
            f"linear_attention={self.linear_attention}, converged={self.converged})"
        )


def _to_numpy(out):
    """The oracle's answer as a NumPy array (PyTorch tensors detached and moved to the CPU)."""
    if hasattr(out, "detach") and hasattr(out, "cpu"):
        out = out.detach().cpu().numpy()
    kind = getattr(np.asarray(out), "dtype", np.dtype(object)).kind
    if kind == "c":
        # A cast to float64 would drop the imaginary part: another function.
        raise TypeError(
            f"oracle must return real numbers; got complex values ({np.asarray(out).dtype}). "
            "Return the real outputs the oracle computes (np.real if the imaginary part is "
            "rounding)."
        )
    try:
        return np.asarray(out, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"oracle must return numeric arrays; got {type(out).__name__} ({exc})."
        ) from None


class _Oracle:
    """Calls the user's function on batches, checks its answers and keeps them."""

    def __init__(self, oracle, readout, d_out):
        if not callable(oracle):
            raise TypeError(f"oracle must be callable, oracle(X) -> y; got {oracle!r} "
                            f"of type {type(oracle).__name__}.")
        self.oracle, self.readout, self.d_out = oracle, readout, d_out
        self.n_calls = self.n_queries = 0
        self.squeeze = None  # whether the oracle answers without an output axis
        self.X, self.y = [], []

    def __call__(self, X, keep=True):
        m, T, _ = X.shape
        y = _to_numpy(self.oracle(X.copy()))
        self.n_calls += 1
        self.n_queries += m
        lead = (m,) if self.readout == "last" else (m, T)
        form = "(m,) or (m, d_out)" if self.readout == "last" else "(m, n_tokens) or (m, n_tokens, d_out)"
        if y.shape == lead:
            y = y[..., None]
            self.squeeze = True if self.squeeze is None else self.squeeze
        else:
            self.squeeze = False if self.squeeze is None else self.squeeze
        if y.ndim != len(lead) + 1 or y.shape[:-1] != lead:
            raise ValueError(
                f"oracle must return an array of shape {form} for readout={self.readout!r} "
                f"(here m = {m}, n_tokens = {T}); got shape {y.shape}."
            )
        if self.d_out is None:
            self.d_out = y.shape[-1]
        elif y.shape[-1] != self.d_out:
            raise ValueError(
                f"oracle must return d_out = {self.d_out} outputs per "
                f"{'sequence' if self.readout == 'last' else 'position'}; got {y.shape[-1]} "
                f"(shape {y.shape})."
            )
        if not np.all(np.isfinite(y)):
            raise ValueError(
                f"oracle returned {int(np.size(y) - np.isfinite(y).sum())} non-finite values "
                f"(NaN or inf) for {m} finite input sequences; it must return finite outputs."
            )
        if keep:
            self.X.append(X)
            self.y.append(y)
        return y

    def stacked(self):
        """Every kept query and answer; the answers in the oracle's own form."""
        y = np.concatenate(self.y)
        return np.concatenate(self.X), (y[..., 0] if self.squeeze else y)


def _fit(X, y, readout, n_heads):
    model = LinearAttentionRegressor(readout=readout, n_heads=n_heads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    pred = np.asarray(model.predict(X), dtype=np.float64).reshape(y.shape)
    rss = float(np.sum((y - pred) ** 2))
    scale = float(np.sum(y**2))
    return model, rss, (math.sqrt(rss / scale) if scale > 0 else math.sqrt(rss))


def _rotated(X, rng):
    """X times a random orthogonal map: the same certificate, new inputs."""
    d = X.shape[2]
    Q, R = np.linalg.qr(rng.standard_normal((d, d)))
    return X @ (Q * np.sign(np.diag(R)))


def learn_from_oracle(oracle, d, *, d_out=None, readout="last", n_tokens=None, tol=None,
                      X_eval=None, max_queries=None, n_check=None, n_heads=None,
                      exact_rtol=1e-9, delta=1e-3, max_iter=100, random_state=None):
    """Learn a linear attention from a function one can query, with the fewest queries.

    Parameters
    ----------
    oracle : callable
        ``oracle(X) -> y`` for X a float64 array of shape (m, n_tokens, d);
        y of shape (m,) or (m, d_out) for ``readout="last"``, (m, n_tokens)
        or (m, n_tokens, d_out) for ``"all"`` (NumPy arrays, or PyTorch
        tensors, e.g. ``lambda X: layer(torch.from_numpy(X))``).
    d : int
        Token dimension.
    d_out : int or None, default=None
        Number of outputs; None takes it from the first answer.
    readout : {"last", "all"}, default="last"
        Which outputs the oracle gives: the last position's, or every
        position's (causal).
    n_tokens : int or None, default=None
        Length of the query sequences; None is ``d + 1``.
    tol : float or None, default=None
        None: identify an exact oracle with the fewest queries, the minimal
        design only (:func:`minimum_design_size`); nothing tests whether the
        oracle is a linear attention unless ``n_check`` asks for it.  A float
        > 0: an absolute tolerance on the outputs at the reference inputs
        ``X_eval``; ``n_check`` sequences are added to test the oracle, and a
        noisy oracle is queried on further designs until the certificate's
        error bound there is at most ``tol``.
    X_eval : array-like of shape (n_eval, n_tokens_eval, d) or None, default=None
        Reference inputs of the error bound (any length); None uses the
        first design (whitened tokens: unit second moment, the scale of
        standard Gaussian tokens).
    max_queries : int or None, default=None
        Most sequences sent to the oracle; None is 100 times the minimal
        design.  When reached before ``tol``, a ConvergenceWarning is
        issued and ``converged`` is False.
    n_check : int or None, default=None
        Extra sequences (a rotated copy of part of the design: new inputs,
        the same certificate) whose answers test the fit, plus one repeated
        sequence that tells noise from a deterministic misfit.  None: 0 when
        ``tol`` is None, else ``max(2, n_min // 4)``.
    n_heads : int, "auto" or None, default=None
        Passed to :class:`~sklearn_linattn.LinearAttentionRegressor`.
    exact_rtol : float, default=1e-9
        Relative residual at or below which the answers count as exact.
    delta : float, default=1e-3
        Failure probability of each of the two noise estimates behind the
        error bound (see Notes).
    max_iter : int, default=100
        Passed to :func:`identifying_design`.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the designs.

    Returns
    -------
    result : OracleFit
        The fitted model, ``n_queries``, ``n_calls``, the residual, the error
        bound and a plain-words ``note``.

    Raises
    ------
    TypeError
        If ``oracle`` is not callable or returns something not numeric.
    ValueError
        If ``oracle`` returns an array of the wrong shape or non-finite
        values, or for invalid arguments.

    See Also
    --------
    identifying_design : the queries.
    OracleFit : the result.

    Notes
    -----
    The loop: (1) query the minimal identifying design and fit (the
    certificate holds by construction); with ``tol=None`` and ``n_check=0``
    stop there.  (2) Query ``n_check`` check sequences and one repeat of the
    first design sequence, and refit on everything.  A relative residual at
    or below ``exact_rtol`` means the oracle is a linear attention: stop,
    identified.  A residual above it while the repeat returns the same
    answer means a deterministic function that is *not* a linear attention
    (softmax attention, say): the model is its least-squares linear-attention
    approximation on the queries; stop, and ``note`` says so.  (3) Otherwise
    the oracle is noisy: with RSS the residual sum of squares over N rows
    and d_out outputs, ``sigma^2 <= RSS / chi2_delta(d_out (N - psi))`` and
    the true coefficients' excess risk is at most ``epsilon = sigma^2
    chi2_{1-delta}(d_out psi) / N`` (i.i.d. Gaussian noise, each with
    probability ``1 - delta``); the certificate's ``error_bound(X_eval,
    epsilon)`` then bounds the distance of the model to the true function.
    While it exceeds ``tol``, rotated copies of the design are queried (as
    many as the bound's 1/sqrt(N) decay says, at most doubling each time).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward, same_function
    >>> from sklearn_linattn.design import learn_from_oracle
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(2, 1, 2)), rng.normal(size=(2, 2, 2))
    >>> fit = learn_from_oracle(lambda X: mhla_forward(X, V, Q), 2, n_tokens=3, random_state=0)
    >>> fit.n_queries, bool(fit.model.certificate_)
    (6, True)
    >>> X_long = rng.normal(size=(5, 40, 2))
    >>> bool(np.allclose(fit.model.predict(X_long), mhla_forward(X_long, V, Q)))
    True
    """
    readout = check_readout(readout)
    d = _check_size(d, "d")
    if d_out is not None:
        d_out = _check_size(d_out, "d_out")
    n_tokens = d + 1 if n_tokens is None else _check_size(n_tokens, "n_tokens")
    tol = check_number(tol, "tol", low=0.0, low_open=True, allow_none=True)
    exact_rtol = check_number(exact_rtol, "exact_rtol", low=0.0)
    delta = check_number(delta, "delta", low=0.0, high=0.5, low_open=True)
    n_min = minimum_design_size(d, n_tokens=n_tokens, readout=readout)
    if n_check is None:
        n_check = 0 if tol is None else max(2, n_min // 4)
    n_check = _check_size(n_check, "n_check", low=0)
    max_queries = 100 * n_min if max_queries is None else _check_size(max_queries, "max_queries")
    if max_queries < n_min + (n_check + 1 if n_check else 0):
        raise ValueError(
            f"max_queries must allow the minimal design of {n_min} sequences"
            + (f" and the {n_check} + 1 check sequences" if n_check else "")
            + f"; got max_queries={max_queries}."
        )
    if X_eval is not None:
        X_eval, _ = check_sequences(X_eval, n_features_in=d, name="X_eval",
                                    expected_by="the oracle's tokens have that dimension")
    rng = validate_random_state(random_state)
    calls = _Oracle(oracle, readout, d_out)
    design = identifying_design(d, n_tokens=n_tokens, readout=readout, max_iter=max_iter,
                                random_state=rng)
    X_ref = design if X_eval is None else X_eval
    calls(design)
    psi = n_attention_features(d)

    def result(model, rss, residual, **fields):
        X, y = calls.stacked()
        fields.setdefault("noise", 0.0)
        fields.setdefault("epsilon", 0.0)
        return OracleFit(model=model, n_queries=calls.n_queries, n_calls=calls.n_calls,
                         residual=residual, X=X, y=y, **fields)

    def refit():
        return _fit(*calls.stacked(), readout, n_heads)

    model, rss, residual = refit()
    n_rows = model.certificate_.n_rows
    if n_check == 0:
        if n_rows > psi:
            exact = residual <= exact_rtol
            note = (f"relative residual {residual:.2g} over {n_rows} rows (psi = {psi}): "
                    + ("the answers are a linear attention to rounding; identified."
                       if exact else "above rounding: the oracle is noisy or not a linear "
                       "attention (pass tol to test and bound it)."))
        else:
            exact = None
            note = (f"the minimal design ({n_rows} rows for psi = {psi}) interpolates any "
                    "answers: identified if the oracle is a linear attention; pass tol or "
                    "n_check to test that.")
        return result(model, rss, residual, error_bound=0.0 if exact else math.nan,
                      linear_attention=exact, converged=bool(model.certificate_) and exact is not False,
                      note=note)

    # Check sequences: rotated design sequences (new inputs) and one repeat.
    check = _rotated(design, rng)[np.resize(np.arange(n_min), n_check)]
    calls(check)
    repeat = calls(design[:1], keep=False)  # counted in n_queries, not fitted
    repeats_same = np.allclose(repeat, calls.y[0][:1], rtol=1e-12, atol=0.0)
    model, rss, residual = refit()

    if residual <= exact_rtol:
        return result(model, rss, residual, error_bound=0.0, linear_attention=True,
                      converged=True,
                      note=f"relative residual {residual:.2g} over {model.certificate_.n_rows} "
                           "rows: the answers are a linear attention to rounding; identified.")
    if repeats_same:
        return result(
            model, rss, residual, error_bound=math.nan, linear_attention=False, converged=False,
            note=(f"relative residual {residual:.2g}, far above rounding, while the oracle "
                  "answers a repeated input identically: it is not a linear attention (e.g. "
                  "softmax attention). The certificate still holds (it is about the inputs), "
                  "so the model is the unique least-squares linear attention of these queries, "
                  "an approximation; no error bound applies."),
        )
    while True:
        n = model.certificate_.n_rows
        dof = calls.d_out * (n - psi)
        sigma2 = rss / scipy.stats.chi2.ppf(delta, dof)
        epsilon = sigma2 * scipy.stats.chi2.ppf(1.0 - delta, calls.d_out * psi) / n
        bound = float(np.max(model.certificate_.error_bound(X_ref, epsilon)))
        fields = dict(noise=math.sqrt(rss / dof), epsilon=float(epsilon), error_bound=bound,
                      linear_attention=None)
        if bound <= tol:
            return result(model, rss, residual, converged=True, note=(
                f"noisy oracle (relative residual {residual:.2g}, noise sd about "
                f"{fields['noise']:.2g}): error bound {bound:.2g} <= tol at the reference "
                f"inputs after {calls.n_queries} queries."), **fields)
        room = max_queries - calls.n_queries
        if room <= 0:
            warnings.warn(
                f"learn_from_oracle reached max_queries={max_queries} with an error bound of "
                f"{bound:.3g} > tol={tol:.3g}; raise max_queries or tol.",
                ConvergenceWarning, stacklevel=2,
            )
            return result(model, rss, residual, converged=False, note=(
                f"noisy oracle: error bound {bound:.2g} > tol after max_queries."), **fields)
        # The bound decays like 1/sqrt(N): aim at the size it asks for, at most doubling.
        have = n // (1 if readout == "last" else n_tokens)
        want = int(math.ceil(have * ((bound / tol) ** 2 * 1.1 - 1.0)))
        m = min(max(want, n_min), have, room)
        batch = np.concatenate([_rotated(design, rng) for _ in range(-(-m // n_min))])[:m]
        calls(batch)
        model, rss, residual = refit()
