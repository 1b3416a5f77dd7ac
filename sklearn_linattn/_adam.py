"""Minibatch Adam on multi-head linear attention, the paper's gradient baseline, in NumPy."""

import math
import time
import warnings

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from ._attention import attention_coefficients, mhla_forward
from ._memory import sample_chunks, real_tokens
from ._units import unit_scaled
from ._validation import (
    check_data_format,
    check_heads,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_targets,
    check_token_dim,
)
from ._params import check_number, validate_random_state
from ._base import AttentionHeadsRegressorMixin

__all__ = [
    "AdamLinearAttentionRegressor",
    "learning_rate_schedule",
    "mhla_loss_gradient",
]


#: What Adam trains: the heads (V_h, Q_h) themselves, or the paper's (P_h, Q_h).
PARAMETRIZATIONS = ("sum", "paper")


# ---------------------------------------------------------------------------
# Plain functions: loss and gradients, learning-rate schedule
# ---------------------------------------------------------------------------


def _position_moments(X, Y, lengths, readout):
    """Moments S (m, d, d), query tokens x (m, d) and targets y (m, d_out) of the real outputs."""
    if readout == "last":
        S = np.matmul(X.transpose(0, 2, 1), X)
        x = X[np.arange(X.shape[0]), lengths - 1]
        return S, x, Y
    real = real_tokens(lengths, X.shape[1])
    S = np.cumsum(X[:, :, :, None] * X[:, :, None, :], axis=1)
    return S[real], X[real], Y[real]


def _sse_gradients(V, Q, S, x, y, w=None):
    """``sum_i w_i ||r_i||**2`` over positions (w=None: all 1) and its gradients in V and Q."""
    n_heads, d_out, d = V.shape
    m = x.shape[0]
    # q[i, h] = Q_h x_i, then ctx[i, h] = S_i Q_h x_i (S used as given, never
    # assumed symmetric), and y_hat_i = sum_h V_h ctx[i, h].
    q = (x @ Q.reshape(n_heads * d, d).T).reshape(m, n_heads, d)
    ctx = np.matmul(q, S.transpose(0, 2, 1)).reshape(m, n_heads * d)
    V_mat = V.transpose(0, 2, 1).reshape(n_heads * d, d_out)  # [(h, j), a]
    r = ctx @ V_mat - y
    wr = r if w is None else w[:, None] * r
    sse = float(np.einsum("ia,ia->", wr, r))
    r = wr  # the gradients of sum_i w_i ||r_i||**2 are those of the plain sum with w_i r_i
    # dV_h[a, j] = 2 sum_i r_i[a] ctx[i, h, j]
    grad_V = 2.0 * (r.T @ ctx).reshape(d_out, n_heads, d).transpose(1, 0, 2)
    # g[i, h] = V_h^T r_i, u[i, h] = S_i^T V_h^T r_i, dQ_h = 2 sum_i u[i, h] x_i^T
    g = (r @ V_mat.T).reshape(m, n_heads, d)
    u = np.matmul(g, S).reshape(m, n_heads * d)
    grad_Q = 2.0 * (u.T @ x).reshape(n_heads, d, d)
    return sse, grad_V, grad_Q


def _values_per_sample(n_tokens, d, d_out, n_heads, readout):
    """Float64 values one sample needs in the work arrays of the gradient."""
    positions = 1 if readout == "last" else n_tokens
    return n_tokens * d + positions * (3 * d * d + 4 * n_heads * d + 2 * d_out)


def _position_weights(w, lengths, readout):
    """The weight of each real output position: its sequence's weight."""
    if readout == "last":
        return w
    return np.repeat(w, lengths)  # positions in sample-major order, as _position_moments


def _loss_gradient(X, Y, lengths, V, Q, readout, w=None):
    """``(loss, grad_V, grad_Q, n_outputs)``: the mean squared error over (weighted) outputs."""
    n_samples, n_tokens, d = X.shape
    n_heads, d_out, _ = V.shape
    sse, grad_V, grad_Q, n_positions = 0.0, np.zeros_like(V), np.zeros_like(Q), 0
    per_sample = _values_per_sample(n_tokens, d, d_out, n_heads, readout)
    for sl in sample_chunks(n_samples, per_sample):
        S, x, y = _position_moments(X[sl], Y[sl], lengths[sl], readout)
        if w is None:
            s, gV, gQ = _sse_gradients(V, Q, S, x, y)
            n_positions += x.shape[0]
        else:
            w_pos = _position_weights(w[sl], lengths[sl], readout)
            s, gV, gQ = _sse_gradients(V, Q, S, x, y, w_pos)
            n_positions += float(w_pos.sum())
        sse += s
        grad_V += gV
        grad_Q += gQ
    n_outputs = n_positions * d_out
    return sse / n_outputs, grad_V / n_outputs, grad_Q / n_outputs, n_outputs


def _value_factor(parametrization, n_heads, d):
    """c with ``V_h = c A_h`` for the trained value parameters A_h of a parametrization."""
    return 1.0 if parametrization == "sum" else 1.0 / (n_heads * math.sqrt(d))


def _trained_loss_gradient(X, Y, lengths, A, Q, readout, factor, w=None):
    """``(loss, grad_A, grad_Q, n_outputs)`` in the trained parameters, with ``V = factor * A``."""
    loss, grad_V, grad_Q, n_outputs = _loss_gradient(X, Y, lengths, factor * A, Q, readout,
                                                     w)
    return loss, factor * grad_V, grad_Q, n_outputs


def _clip_gradients(grad_A, grad_Q, max_norm):
    """Both gradients rescaled together to Euclidean norm ``max_norm`` when above it."""
    norm = math.sqrt(float(np.vdot(grad_A, grad_A)) + float(np.vdot(grad_Q, grad_Q)))
    if norm <= max_norm:
        return grad_A, grad_Q
    scale = max_norm / norm
    return grad_A * scale, grad_Q * scale


def mhla_loss_gradient(X, Y, V, Q, lengths=None, *, readout="last"):
    """Mean squared error of an MHLA and its analytic gradients in V and Q.

    The loss is the mean of ``(y_hat - y)**2`` over the real outputs (every output
    coordinate of every non-padded position); formulas: :ref:`gradient-baseline`.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_tokens, d)
        Zero-padded sequences.
    Y : ndarray
        Targets, (n_samples, d_out) for ``readout="last"``, (n_samples,
        n_tokens, d_out) for ``"all"``; values at padded positions are ignored.
    V : array-like of shape (n_heads, d_out, d)
        Value matrices.
    Q : array-like of shape (n_heads, d, d)
        Fused key-query matrices.
    lengths : ndarray of shape (n_samples,) or None, default=None
        Number of real tokens per sequence; None means every token is real.
    readout : {"last", "all"}, default="last"
        Output at the last real token, or causal output at every position.

    Returns
    -------
    loss : float
        Mean squared error over the real outputs.
    grad_V : ndarray of shape (n_heads, d_out, d)
        Gradient of ``loss`` with respect to ``V``.
    grad_Q : ndarray of shape (n_heads, d, d)
        Gradient of ``loss`` with respect to ``Q``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward, mhla_loss_gradient
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(8, 5, 2))
    >>> V, Q = rng.normal(size=(2, 1, 2)), rng.normal(size=(2, 2, 2))
    >>> loss, grad_V, grad_Q = mhla_loss_gradient(X, mhla_forward(X, V, Q), V, Q)
    >>> loss, float(np.abs(grad_V).max()), float(np.abs(grad_Q).max())
    (0.0, 0.0, 0.0)
    """
    check_readout(readout)
    V, Q = check_heads(V, Q)
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    n_samples, n_tokens, d = X.shape
    if lengths is None:
        lengths = np.full(n_samples, n_tokens)
    lengths = np.asarray(lengths)
    if V.shape[2] != d:
        raise ValueError(
            f"the heads act on tokens of dimension {V.shape[2]} (V of shape {V.shape}) "
            f"but X has tokens of dimension d={d} (shape {X.shape})."
        )
    expected = (n_samples, V.shape[1]) if readout == "last" else (
        n_samples, n_tokens, V.shape[1]
    )
    if Y.shape != expected:
        raise ValueError(
            f"with readout={readout!r}, X of shape {X.shape} and V of shape {V.shape} "
            f"need Y of shape {expected}; got Y of shape {Y.shape}."
        )
    loss, grad_V, grad_Q, _ = _loss_gradient(X, Y, lengths, V, Q, readout)
    return loss, grad_V, grad_Q


def learning_rate_schedule(step, n_steps, learning_rate, warmup_fraction):
    """Linear warm-up then cosine decay to zero, per optimisation step.

    The first ``round(warmup_fraction * n_steps)`` steps rise linearly to ``learning_rate``;
    the cosine would reach zero one step after the last (:ref:`gradient-baseline`).

    Parameters
    ----------
    step : int or ndarray of int
        Step index, from 0 to ``n_steps - 1``.
    n_steps : int
        Total number of steps of the schedule.
    learning_rate : float
        Peak learning rate.
    warmup_fraction : float
        Fraction of the steps spent warming up, in [0, 1].

    Returns
    -------
    rate : float or ndarray of float
        Learning rate of each step, shaped like ``step`` (a float for a scalar step).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import learning_rate_schedule
    >>> learning_rate_schedule(np.arange(6), 6, 1.0, 1 / 3)
    array([0.5 , 1.  , 1.  , 0.85355339, 0.5 , 0.14644661])
    """
    step = np.asarray(step, dtype=np.float64)
    n_warmup = int(round(warmup_fraction * n_steps))
    warm = (step + 1.0) / max(n_warmup, 1)
    progress = (step - n_warmup) / max(n_steps - n_warmup, 1)
    cosine = 0.5 * (1.0 + np.cos(np.pi * progress))
    rate = learning_rate * np.where(step < n_warmup, warm, cosine)
    return float(rate) if rate.ndim == 0 else rate


def _relative_mse(X, lengths, Y, V, Q, readout, w=None):
    """MSE / mean(y**2) over the real outputs (plain MSE if every y is 0), weighted by ``w``."""
    pred = mhla_forward(X, V, Q, lengths, readout=readout)
    if readout == "all":
        real = real_tokens(lengths, X.shape[1])
        pred, Y = pred[real], Y[real]
    if w is None:
        mse, scale = float(np.mean((pred - Y) ** 2)), float(np.mean(Y**2))
    else:
        w_pos = _position_weights(w, lengths, readout)
        mse = float(np.average(np.mean((pred - Y) ** 2, axis=1), weights=w_pos))
        scale = float(np.average(np.mean(Y**2, axis=1), weights=w_pos))
    return mse / scale if scale > 0 else mse


class AdamLinearAttentionRegressor(AttentionHeadsRegressorMixin, BaseEstimator):
    """Multi-head linear attention with a fixed number of heads, trained by Adam.

    The paper's gradient baseline: minibatch Adam (AdamW when ``weight_decay > 0``)
    with linear warm-up and cosine decay on the non-convex heads ``V_h, Q_h``, in
    float64.  Unlike :class:`~sklearn_linattn.LinearAttentionRegressor` it may stop
    short of the global optimum; compare their ``coef_`` (:ref:`gradient-baseline`).

    Parameters
    ----------
    n_heads : int, default=1
        Number of attention heads trained.
    readout : {"last", "all"}, default="last"
        One target per sequence, at its last token, or one at every position.
    parametrization : {"sum", "paper"}, default="sum"
        The parameters Adam trains: the heads ``V_h, Q_h`` (``"sum"``) or the
        ``P_h, Q_h`` of the paper's code, ``V_h = P_h / (n_heads sqrt(d))``
        (``"paper"``).  The fitted attributes hold ``V_h`` and ``Q_h`` either way.
    learning_rate : float, default=1e-2
        Peak learning rate of the schedule.
    batch_size : int, default=32
        Sequences per minibatch; above the number of training sequences, full batches.
    max_epochs : int, default=100
        Passes over the training data; the schedule spans all of them.
    warmup_fraction : float, default=0.05
        Fraction of the steps with linear warm-up, in [0, 1] (:func:`learning_rate_schedule`).
    weight_decay : float, default=0.0
        Decoupled (AdamW) weight decay: each step first multiplies the
        parameters by ``1 - rate * weight_decay``.
    beta_1, beta_2 : float, default=0.9, 0.999
        Decay rates of Adam's first and second moment estimates, in [0, 1).
    epsilon : float, default=1e-8
        Adam's epsilon, added to the root of the second moment estimate.
    init_scale : float or None, default=None
        Standard deviation of the Gaussian initial entries of the trained
        parameters; None is ``1 / sqrt(d)``.
    max_grad_norm : float or None, default=None
        Rescale a minibatch's gradient (all trained parameters together) to
        this Euclidean norm when above it; None never clips.
    validation_fraction : float, default=0.0
        Fraction of the sequences held out at random for
        ``validation_curve_`` and ``tol``, in [0, 1); 0 trains on everything.
    tol : float or None, default=None
        Stop after the first epoch whose relative MSE ``MSE / mean(y**2)`` (validation split,
        else training data) is below ``tol``, else warn (ConvergenceWarning); None: no check.
    token_dim : int or None, default=None
        Token dimension for 2-D X (:class:`~sklearn_linattn.LinearAttentionFeatures`).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X, as for :class:`~sklearn_linattn.LinearAttentionRegressor`.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialisation, the validation split and the shuffling.
    verbose : int, default=0
        Print the loss of each epoch when positive.

    Attributes
    ----------
    value_matrices_ : ndarray of shape (H, d_out, d)
        Value matrices V_h, one per head (H = ``n_heads_``).
    key_query_matrices_ : ndarray of shape (H, d, d)
        Fused key-query matrices Q_h.
    n_heads_ : int
        Number of heads.
    coef_ : ndarray of shape (d_out, psi)
        Folded coefficients of the heads (:func:`~sklearn_linattn.attention_coefficients`).
    loss_curve_ : list of float
        Mean training loss of each epoch, over the minibatches' real outputs.
    validation_curve_ : list of float or None
        Relative MSE on the validation split after each epoch; None without one.
    elapsed_ : list of float
        Wall-clock seconds since the start of ``fit`` at the end of each epoch.
    n_iter_ : int
        Number of epochs run.
    n_features_in_ : int
        Token dimension d.
    n_outputs_ : int
        Output dimension d_out.

    See Also
    --------
    LinearAttentionRegressor : the closed-form (global optimum) learner.

    References
    ----------
    .. [1] D. P. Kingma and J. Ba, "Adam: A Method for Stochastic Optimization", 2014.
    .. [2] I. Loshchilov and F. Hutter, "Decoupled Weight Decay Regularization", 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import mhla_forward
    >>> from sklearn_linattn import AdamLinearAttentionRegressor, LinearAttentionRegressor
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(1, 1, 2)), rng.normal(size=(1, 2, 2))
    >>> X = rng.normal(size=(512, 10, 2)) / np.sqrt(10)
    >>> y = mhla_forward(X, V, Q)[:, 0]
    >>> model = AdamLinearAttentionRegressor(
    ...     n_heads=4, learning_rate=0.05, max_epochs=100, validation_fraction=0.25,
    ...     tol=1e-6, random_state=0,
    ... ).fit(X, y)
    >>> bool(model.n_iter_ < 100 and model.validation_curve_[-1] < 1e-6)
    True
    >>> closed = LinearAttentionRegressor().fit(X, y).coef_    # the same function, nearly
    >>> bool(np.linalg.norm(model.coef_ - closed) < 1e-2 * np.linalg.norm(closed))
    True
    """

    def __init__(
        self,
        n_heads=1,
        *,
        readout="last",
        parametrization="sum",
        learning_rate=1e-2,
        batch_size=32,
        max_epochs=100,
        warmup_fraction=0.05,
        weight_decay=0.0,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        init_scale=None,
        max_grad_norm=None,
        validation_fraction=0.0,
        tol=None,
        token_dim=None,
        data_format="channels_last",
        random_state=None,
        verbose=0,
    ):
        self.n_heads = n_heads
        self.readout = readout
        self.parametrization = parametrization
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.warmup_fraction = warmup_fraction
        self.weight_decay = weight_decay
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.init_scale = init_scale
        self.max_grad_norm = max_grad_norm
        self.validation_fraction = validation_fraction
        self.tol = tol
        self.token_dim = token_dim
        self.data_format = data_format
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self):
        if isinstance(self.n_heads, str) and self.n_heads == "auto":
            # Gradient descent trains a fixed number of heads; only the closed
            # form can choose the count after the fit.
            raise TypeError(
                "n_heads must be an integer >= 1: Adam trains a fixed number of heads; got "
                "'auto'. LinearAttentionRegressor(n_heads='auto') chooses the fewest heads."
            )
        check_number(self.n_heads, "n_heads", integer=True, low=1)
        check_readout(self.readout)
        if not isinstance(self.parametrization, str) or (
            self.parametrization not in PARAMETRIZATIONS
        ):
            raise ValueError(
                f"parametrization must be one of {PARAMETRIZATIONS}: 'sum' trains the heads "
                "V_h, Q_h, 'paper' the P_h, Q_h of the paper's code (heads averaged, scores "
                f"divided by sqrt(d)); got {self.parametrization!r}."
            )
        check_number(self.learning_rate, "learning_rate", low=0, low_open=True)
        check_number(self.batch_size, "batch_size", integer=True, low=1)
        check_number(self.max_epochs, "max_epochs", integer=True, low=1)
        check_number(self.warmup_fraction, "warmup_fraction", low=0, high=1)
        check_number(self.weight_decay, "weight_decay", low=0)
        check_number(self.beta_1, "beta_1", low=0, high=1, high_open=True)
        check_number(self.beta_2, "beta_2", low=0, high=1, high_open=True)
        check_number(self.epsilon, "epsilon", low=0, low_open=True)
        check_number(self.init_scale, "init_scale", low=0, low_open=True, allow_none=True)
        check_number(
            self.max_grad_norm, "max_grad_norm", low=0, low_open=True, allow_none=True
        )
        check_number(
            self.validation_fraction, "validation_fraction", low=0, high=1, high_open=True
        )
        check_number(self.tol, "tol", low=0, low_open=True, allow_none=True)
        check_token_dim(self.token_dim)
        check_data_format(self.data_format)
        validate_random_state(self.random_state)
        if not isinstance(self.verbose, (bool, np.bool_)):
            check_number(self.verbose, "verbose", integer=True, low=0)

    def _split(self, n_samples, rng):
        """Indices of the training and validation sequences."""
        if self.validation_fraction == 0:
            return np.arange(n_samples), None
        n_val = math.ceil(self.validation_fraction * n_samples)
        if n_val >= n_samples:
            raise ValueError(
                f"validation_fraction={self.validation_fraction!r} leaves no training "
                f"sequence out of n_samples={n_samples}; use a smaller fraction or more "
                "data."
            )
        perm = rng.permutation(n_samples)
        return np.sort(perm[n_val:]), np.sort(perm[:n_val])

    def fit(self, X, y, sample_weight=None):
        """Train the heads by minibatch Adam.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Training sequences; trailing all-NaN tokens are padding.
        y : array-like
            Shape (n_samples,) or (n_samples, d_out) for ``readout="last"``; for
            ``"all"``, (n_samples, n_tokens[, d_out]), NaN at padded positions.
        sample_weight : array-like of shape (n_samples,) or None, default=None
            Non-negative weight of each sequence in the mean loss and validation
            error; sequences of weight 0 are dropped before anything is drawn.

        Returns
        -------
        self : AdamLinearAttentionRegressor
            The fitted estimator.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import AdamLinearAttentionRegressor
        >>> X = np.random.default_rng(0).normal(size=(50, 4, 2))
        >>> y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
        >>> model = AdamLinearAttentionRegressor(n_heads=2, max_epochs=5, random_state=0).fit(X, y)
        >>> model.n_iter_, bool(model.loss_curve_[-1] < model.loss_curve_[0])  # 5 epochs
        (5, True)
        """
        start = time.perf_counter()
        self._check_params()
        X, lengths = check_sequences(X, **self._layout())
        Y, single = check_targets(y, lengths, X.shape[1], readout=self.readout,
                                  data_format=self.data_format)
        X = np.asarray(X, dtype=np.float64)
        w = check_sample_weight(sample_weight, X.shape[0])
        if w is not None:
            keep = w > 0
            if not keep.any():
                raise ValueError(
                    "sample_weight must be positive for at least one sequence; got all "
                    "zeros: there is nothing to fit."
                )
            X, Y, lengths, w = X[keep], Y[keep], lengths[keep], w[keep]
            # Relative weights: an exact power of two keeps w * residual**2 finite.
            w, _ = unit_scaled(w)
        readout = self.readout
        n_samples, _, d = X.shape
        d_out = Y.shape[-1]
        n_heads = int(self.n_heads)
        rng = check_random_state(self.random_state)

        # Draw order (part of the reproducibility contract): heads, split, shuffles.
        # A holds the trained value parameters (V_h, or the paper's P_h); V = factor * A.
        scale = 1.0 / math.sqrt(d) if self.init_scale is None else float(self.init_scale)
        factor = _value_factor(self.parametrization, n_heads, d)
        max_norm = None if self.max_grad_norm is None else float(self.max_grad_norm)
        A = scale * rng.standard_normal((n_heads, d_out, d))
        Q = scale * rng.standard_normal((n_heads, d, d))
        train, val = self._split(n_samples, rng)
        X_tr, Y_tr, len_tr = X[train], Y[train], lengths[train]
        w_tr = None if w is None else w[train]
        w_val = None if w is None or val is None else w[val]
        n_train = len(train)
        batch_size = min(int(self.batch_size), n_train)
        steps_per_epoch = math.ceil(n_train / batch_size)
        n_steps = int(self.max_epochs) * steps_per_epoch
        rates = learning_rate_schedule(
            np.arange(n_steps), n_steps, float(self.learning_rate),
            float(self.warmup_fraction),
        )
        beta_1, beta_2 = float(self.beta_1), float(self.beta_2)
        eps, wd = float(self.epsilon), float(self.weight_decay)
        m_A, v_A = np.zeros_like(A), np.zeros_like(A)
        m_Q, v_Q = np.zeros_like(Q), np.zeros_like(Q)

        self.loss_curve_ = []
        self.validation_curve_ = None if val is None else []
        self.elapsed_ = []
        converged = False
        step = 0
        for epoch in range(int(self.max_epochs)):
            order = rng.permutation(n_train)
            epoch_sse, epoch_outputs = 0.0, 0
            for b in range(steps_per_epoch):
                idx = order[b * batch_size : (b + 1) * batch_size]
                loss, g_A, g_Q, n_out = _trained_loss_gradient(
                    X_tr[idx], Y_tr[idx], len_tr[idx], A, Q, readout, factor,
                    None if w_tr is None else w_tr[idx],
                )
                if not np.isfinite(loss):
                    raise ValueError(
                        f"the training loss became {loss} at epoch {epoch + 1}: Adam "
                        f"diverged with learning_rate={self.learning_rate!r}. Scale X "
                        "towards unit size or lower learning_rate / init_scale."
                    )
                epoch_sse += loss * n_out
                epoch_outputs += n_out
                if max_norm is not None:
                    g_A, g_Q = _clip_gradients(g_A, g_Q, max_norm)
                t = step + 1
                rate = rates[step]
                m_A = beta_1 * m_A + (1 - beta_1) * g_A
                m_Q = beta_1 * m_Q + (1 - beta_1) * g_Q
                v_A = beta_2 * v_A + (1 - beta_2) * g_A**2
                v_Q = beta_2 * v_Q + (1 - beta_2) * g_Q**2
                c_1, c_2 = 1 - beta_1**t, 1 - beta_2**t
                if wd:
                    A = A * (1 - rate * wd)
                    Q = Q * (1 - rate * wd)
                A = A - rate * (m_A / c_1) / (np.sqrt(v_A / c_2) + eps)
                Q = Q - rate * (m_Q / c_1) / (np.sqrt(v_Q / c_2) + eps)
                step += 1
            self.loss_curve_.append(epoch_sse / epoch_outputs)
            message = f"epoch {epoch + 1}/{self.max_epochs}: loss {self.loss_curve_[-1]:.3e}"
            monitored = None
            if val is not None:
                monitored = _relative_mse(
                    X[val], lengths[val], Y[val], factor * A, Q, readout, w_val
                )
                self.validation_curve_.append(monitored)
                message += f", relative validation MSE {monitored:.3e}"
            elif self.tol is not None:
                monitored = _relative_mse(X_tr, len_tr, Y_tr, factor * A, Q, readout, w_tr)
                message += f", relative training MSE {monitored:.3e}"
            self.elapsed_.append(time.perf_counter() - start)
            if self.verbose:
                print(f"[AdamLinearAttentionRegressor] {message} ({self.elapsed_[-1]:.3f} s)")
            if self.tol is not None and monitored < self.tol:
                converged = True
                break
        self.n_iter_ = len(self.loss_curve_)
        if self.tol is not None and not converged:
            warnings.warn(
                f"AdamLinearAttentionRegressor stopped after max_epochs={self.max_epochs} "
                f"epochs with relative MSE {monitored:.3g}, above tol={self.tol!r}; "
                "increase max_epochs or n_heads, or tune learning_rate.",
                ConvergenceWarning,
            )
        V = factor * A
        self.value_matrices_ = V
        self.key_query_matrices_ = Q
        self.n_heads_ = n_heads
        self.coef_ = attention_coefficients(V, Q)
        self.n_features_in_ = d
        self.n_outputs_ = d_out
        self._single_output = single
        return self
