"""Learn with the fewest samples: designed identifying inputs, and learning from an oracle.

See the user guide's design page.
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
        One feature row per sequence, or one per prefix.

    Returns
    -------
    n_samples : int
        The fewest sequences of ``n_tokens`` tokens with which the certificate
        can hold; generic (and designed) inputs of that size make it hold.

    Raises
    ------
    ValueError
        When no number of sequences of that length identifies the model
        (one-token sequences for d >= 2), or for invalid arguments.

    Examples
    --------
    >>> from sklearn_linattn.design import minimum_design_size
    >>> minimum_design_size(3, n_tokens=4), minimum_design_size(3, n_tokens=4, readout="all")
    (18, 5)
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

    The gradient is G at the whitened ``Y = X W``, less ``Y sym(Y^T G) / n_tokens_total``,
    times W.
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
    """Refuse, before allocating them, feature rows and Gram matrices beyond the budget."""
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

    The certificate's ``min_eigenvalue`` is maximized locally from Gaussian
    sequences (method and gains: the user guide's :ref:`design-designed-inputs`).

    Parameters
    ----------
    d : int
        Token dimension.
    n_tokens : int
        Number of tokens of every sequence (at least 2 for d >= 2).
    readout : {"last", "all"}, default="last"
        The readout whose certificate the design makes hold.
    n_samples : int or None, default=None
        Number of sequences; None is :func:`minimum_design_size`, the fewest.
    max_iter : int, default=100
        L-BFGS iterations of each of the four stages (0: the whitened start).
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the Gaussian start; an integer gives the same design every time.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, d), float64
        Whitened sequences (unit token second moment) whose certificate
        holds, with its ``min_eigenvalue`` locally maximal.

    Raises
    ------
    ValueError
        If ``n_samples`` is below :func:`minimum_design_size`, the memory budget
        would be exceeded, the result's certificate fails, or for invalid arguments.

    See Also
    --------
    minimum_design_size : how many sequences, and why.
    learn_from_oracle : query a function on such designs.

    Examples
    --------
    >>> from sklearn_linattn import certify_identifiability
    >>> from sklearn_linattn.design import identifying_design
    >>> X = identifying_design(2, n_tokens=3, random_state=0)
    >>> X.shape, bool(certify_identifiability(X))  # psi = 6 sequences, the fewest
    ((6, 3, 2), True)
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
        Fitted on every sequence sent to the oracle; its ``certificate_`` holds.
    n_queries : int
        Number of sequences sent to the oracle.
    n_calls : int
        Number of calls of the oracle.
    residual : float
        Relative residual ``||y - model.predict(X)|| / ||y||`` over every answer.
    noise : float
        Estimated standard deviation of the noise per output (0 if exact).
    epsilon : float
        The excess empirical risk the error bound is computed for (0 if exact).
    error_bound : float
        Largest ``model.certificate_.error_bound(X_eval, epsilon)``, valid with
        probability at least ``1 - 2 delta`` under i.i.d. Gaussian noise; 0 for
        an exact oracle, NaN when not computed.
    linear_attention : bool or None
        Whether the answers are a linear attention to rounding; None: untested.
    converged : bool
        Whether the goal was met: identification for ``tol=None``,
        ``error_bound <= tol`` otherwise.
    note : str
        What the residual says, in plain words.
    X : ndarray of shape (n_sequences, n_tokens, d)
        The sequences fitted, in order (not the repeated check sequence).
    y : ndarray
        The oracle's answers to X, in its own form.

    See Also
    --------
    learn_from_oracle : what builds it.

    Examples
    --------
    >>> from sklearn_linattn.design import learn_from_oracle
    >>> one_head = lambda X: X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
    >>> fit = learn_from_oracle(one_head, 2, n_tokens=3, random_state=0)
    >>> fit.n_queries, fit.n_calls, bool(fit.model.certificate_)
    (6, 1, True)
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

    Fits the answers to the minimal identifying design; with ``tol``, tests the function and
    queries more until the error bound meets ``tol`` (see :ref:`design-oracle`).

    Parameters
    ----------
    oracle : callable
        ``oracle(X) -> y`` for X of shape (m, n_tokens, d); y of shape (m,) or
        (m, d_out) for ``readout="last"``, (m, n_tokens) or (m, n_tokens,
        d_out) for ``"all"``; NumPy arrays or PyTorch tensors.
    d : int
        Token dimension.
    d_out : int or None, default=None
        Number of outputs; None takes it from the first answer.
    readout : {"last", "all"}, default="last"
        Whether the oracle answers at the last position or at every position.
    n_tokens : int or None, default=None
        Length of the query sequences; None is ``d + 1``.
    tol : float or None, default=None
        Absolute tolerance on the outputs at ``X_eval``; None: the minimal
        design only, untested unless ``n_check`` asks.
    X_eval : array-like of shape (n_eval, n_tokens_eval, d) or None, default=None
        Reference inputs of the error bound; None uses the first design.
    max_queries : int or None, default=None
        Most sequences sent (None: 100 times the minimal design); reaching it
        before ``tol`` issues a ConvergenceWarning.
    n_check : int or None, default=None
        Extra sequences that test the fit, plus one repeat.  None: 0 when
        ``tol`` is None, else ``max(2, n_min // 4)``.
    n_heads : int, "auto" or None, default=None
        Passed to :class:`~sklearn_linattn.LinearAttentionRegressor`.
    exact_rtol : float, default=1e-9
        Relative residual at or below which the answers count as exact.
    delta : float, default=1e-3
        Failure probability of each of the two noise estimates of the bound.
    max_iter : int, default=100
        Passed to :func:`identifying_design`.
    random_state : int, RandomState instance, Generator or None, default=None
        Seeds the designs.

    Returns
    -------
    result : OracleFit
        The fitted model, the query counts, the residual and the error bound.

    Raises
    ------
    TypeError
        If ``oracle`` is not callable or returns something not numeric.
    ValueError
        If ``oracle`` returns the wrong shape or non-finite values, or for
        invalid arguments.

    See Also
    --------
    identifying_design : the queries.
    OracleFit : the result.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward
    >>> from sklearn_linattn.design import learn_from_oracle
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(2, 1, 2)), rng.normal(size=(2, 2, 2))
    >>> fit = learn_from_oracle(lambda X: mhla_forward(X, V, Q), 2, n_tokens=3, random_state=0)
    >>> X_long = rng.normal(size=(5, 40, 2))  # longer than the queries
    >>> fit.n_queries, bool(np.allclose(fit.model.predict(X_long), mhla_forward(X_long, V, Q)))
    (6, True)
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
