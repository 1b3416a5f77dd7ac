"""PyTorch in and out (the ``torch`` extra): fitted heads as a ``torch.nn.Module``, and back."""

import math
import types

import numpy as np
import torch
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from ._validation import as_real_array, check_readout
from ._namespace import on_host
from ._params import check_head_decays, check_number
from ._torch_reader import AttentionHeads, from_torch
from .layouts import projections_from_heads
from .preprocessing import AppendConstant

__all__ = ["AttentionHeads", "MultiHeadLinearAttention", "from_torch", "to_torch"]

_FLOATS = (torch.float32, torch.float64)


def _positive_int(value, name):
    return check_number(value, name, integer=True, low=1)


class MultiHeadLinearAttention(torch.nn.Module):
    """Causal multi-head linear attention, the standard layout, as a PyTorch module.

    The output at position t is ``y_t = bias + skip @ x_t + W_o concat_h
    [scale * sum_{s <= t} decay[h] ** (t - s) (q_t . k_s) v_s]`` with ``q = W_q[h] x``,
    ``k = W_k[h] x``, ``v = W_v[h] x``: the package's MHLA with heads
    ``heads_from_projections(W_q, W_k, W_v, W_o, scale=scale)`` (:doc:`/torch`).

    Parameters
    ----------
    d : int
        Token dimension.
    n_heads : int, default=1
        Number of heads.
    d_k, d_v, d_out : int or None, default=None
        Size of each head's queries and keys, of its values, and of the
        output; None is d.
    scale : float or None, default=None
        Factor of every score ``q_t . k_s``; None is ``1 / sqrt(d_k)``.
    readout : {"last", "all"}, default="last"
        ``"last"``: the output at each sequence's last real token, (batch,
        d_out).  ``"all"``: the output at every position, (batch, n_tokens, d_out).
    decay : float, array-like of shape (n_heads,) or None, default=None
        Fixed, untrained decay of each head, in (0, 1] (one float: every
        head's; 1 or None: no decay).  Distances count real tokens only.
    bias, skip : bool, default=False
        Whether the output has a learned constant term ``bias``, and a learned
        term ``skip @ x_t`` (both initially zero).
    qkv_bias : bool, default=False
        Whether the query, key and value projections have biases (``q = W_q x
        + b_q``, ...; initially zero), as ``torch.nn.Linear`` has by default:
        the package's attention on the tokens ``[x; 1]``.
    dtype : torch.dtype or None, default=None
        ``torch.float32`` or ``torch.float64``; None is torch's default dtype.
    device : torch.device, str or None, default=None
        Where the parameters live.

    Attributes
    ----------
    W_q, W_k, W_v, W_o : torch.nn.Parameter
        The projections, of shapes (n_heads, d_k, d) for W_q and W_k, (n_heads,
        d_v, d) and (d_out, n_heads * d_v), as in ``heads_from_projections``.
    bias, skip : torch.nn.Parameter or None
        Constant term (d_out,) and linear term (d_out, d) in the current token, or None.
    b_q, b_k, b_v : torch.nn.Parameter or None
        Biases of the projections, (n_heads, d_k), (n_heads, d_k) and (n_heads, d_v),
        or None without ``qkv_bias``.
    decay : torch.Tensor of shape (n_heads,) or None
        The heads' fixed decays, a buffer saved in ``state_dict``; None without ``decay``.

    See Also
    --------
    to_torch : This module from a fitted estimator.
    from_torch : The heads of this module.

    Examples
    --------
    >>> import torch
    >>> from sklearn_linattn.nn import MultiHeadLinearAttention
    >>> layer = MultiHeadLinearAttention(3, n_heads=2, d_out=1, dtype=torch.float64)
    >>> x = torch.randn(4, 5, 3, dtype=torch.float64)
    >>> mask = torch.arange(5) < torch.tensor([5, 3, 2, 1])[:, None]  # four lengths
    >>> layer(x, mask).shape
    torch.Size([4, 1])
    """

    def __init__(self, d, n_heads=1, *, d_k=None, d_v=None, d_out=None, scale=None,
                 readout="last", decay=None, bias=False, skip=False, qkv_bias=False, dtype=None,
                 device=None):
        # numpydoc ignore=PR01,EX01
        """Create the parameters, drawn by ``reset_parameters``; the arguments are the class's."""
        super().__init__()
        d = _positive_int(d, "d")
        self.n_heads = _positive_int(n_heads, "n_heads")
        d_k = d if d_k is None else _positive_int(d_k, "d_k")
        d_v = d if d_v is None else _positive_int(d_v, "d_v")
        d_out = d if d_out is None else _positive_int(d_out, "d_out")
        self.scale = (1.0 / math.sqrt(d_k) if scale is None
                      else check_number(scale, "scale", low=0.0, low_open=True))
        self.readout = check_readout(readout)
        if isinstance(decay, torch.Tensor):
            decay = decay.detach().cpu().tolist()
        decay = check_head_decays(decay, self.n_heads, name="decay")
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in _FLOATS:
            raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}.")
        kw = {"dtype": dtype, "device": device}
        self.W_q = torch.nn.Parameter(torch.empty(self.n_heads, d_k, d, **kw))
        self.W_k = torch.nn.Parameter(torch.empty(self.n_heads, d_k, d, **kw))
        self.W_v = torch.nn.Parameter(torch.empty(self.n_heads, d_v, d, **kw))
        self.W_o = torch.nn.Parameter(torch.empty(d_out, self.n_heads * d_v, **kw))
        self.bias = torch.nn.Parameter(torch.empty(d_out, **kw)) if bias else None
        self.skip = torch.nn.Parameter(torch.empty(d_out, d, **kw)) if skip else None
        self.b_q, self.b_k, self.b_v = (
            (torch.nn.Parameter(torch.empty(self.n_heads, size, **kw)) for size in (d_k, d_k, d_v))
            if qkv_bias else (None, None, None))
        # A buffer: it follows .to(device, dtype) and state_dict, and no optimizer trains it.
        self.register_buffer(
            "decay", None if decay is None else torch.as_tensor(decay, **kw))
        if self.decay is not None and not bool((self.decay > 0).all()):
            # A decay below the dtype's smallest number would be stored as 0, outside (0, 1].
            raise ValueError(
                f"decay must be representable in {dtype} (in (0, 1] after the cast); got "
                f"{decay.tolist()!r}, whose smallest value rounds to 0 in {dtype}. Use "
                "torch.float64, or a decay of at least "
                f"{torch.finfo(dtype).tiny:.3g}.")
        self.reset_parameters()

    def reset_parameters(self):
        """Draw the projections uniformly as ``torch.nn.Linear`` does; zero bias and skip.

        Examples
        --------
        >>> from sklearn_linattn.nn import MultiHeadLinearAttention
        >>> layer = MultiHeadLinearAttention(2, bias=True)
        >>> layer.reset_parameters()
        >>> layer.bias.tolist()
        [0.0, 0.0]
        """
        with torch.no_grad():
            for W in (self.W_q, self.W_k, self.W_v, self.W_o):
                bound = 1.0 / math.sqrt(W.shape[-1])
                W.uniform_(-bound, bound)
            for W in (self.bias, self.skip, self.b_q, self.b_k, self.b_v):
                if W is not None:
                    W.zero_()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Loading copies buffers without looking at them: check the decays first (decays
        # outside (0, 1] make outputs grow with the distance instead of fading).  Missing,
        # unexpected and misshapen keys are left to load_state_dict's own rules.
        decay = state_dict.get(prefix + "decay")
        if (self.decay is not None and isinstance(decay, torch.Tensor)
                and decay.shape == self.decay.shape):
            check_head_decays(decay.detach().cpu().tolist(), self.n_heads,
                              name=f"state_dict[{prefix + 'decay'!r}]")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self):  # numpydoc ignore=EX01
        """The sizes, as ``print(module)`` shows them.

        Returns
        -------
        str
            The token dimension, heads, sizes, scale, readout and decays.
        """
        H, d_k, d = self.W_q.shape
        decay = (None if self.decay is None
                 else "[" + ", ".join(f"{g:.6g}" for g in self.decay.tolist()) + "]")
        return (f"d={d}, n_heads={H}, d_k={d_k}, d_v={self.W_v.shape[1]}, "
                f"d_out={self.W_o.shape[0]}, scale={self.scale:.6g}, "
                f"readout={self.readout!r}, decay={decay}, bias={self.bias is not None}, "
                f"skip={self.skip is not None}, qkv_bias={self.b_q is not None}")

    def _check_input(self, x, mask):
        """The mask (None: all real), each sequence's last real token, whether NaN padded."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                "x must be a torch.Tensor of shape (batch, n_tokens, d); got "
                f"{type(x).__name__}. Convert arrays with torch.as_tensor(x)."
            )
        d = self.W_q.shape[2]
        if x.ndim != 3 or x.shape[2] != d or x.shape[1] == 0:
            raise ValueError(
                f"x must have shape (batch, n_tokens >= 1, d={d}); got shape {tuple(x.shape)}."
            )
        if x.dtype != self.W_q.dtype:
            raise TypeError(
                f"x must have the parameters' dtype {self.W_q.dtype}; got {x.dtype}. Convert "
                "x with x.to(dtype) or the module with module.to(dtype)."
            )
        if mask is None:
            isnan = torch.isnan(x)
            # The one boolean this path reads back from the device: without NaN
            # every token is real, and nothing else needs checking.
            if not bool(isnan.any()):
                return None, torch.full((x.shape[0],), x.shape[1] - 1, device=x.device), False
            mask = _nan_padding(x, isnan)
            return mask, mask.sum(dim=1) - 1, True
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                "mask must be None or a bool torch.Tensor of shape (batch, n_tokens), True at "
                f"real tokens; got {type(mask).__name__}"
                f"{' of dtype ' + str(mask.dtype) if isinstance(mask, torch.Tensor) else ''}."
            )
        if tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(
                f"mask must have shape (batch, n_tokens) = {tuple(x.shape[:2])}; got shape "
                f"{tuple(mask.shape)}."
            )
        lengths = mask.sum(dim=1)
        prefix = torch.arange(x.shape[1], device=mask.device) < lengths[:, None]
        if not torch.equal(prefix, mask) or bool((lengths == 0).any()):
            i = int(torch.nonzero((prefix != mask).any(dim=1) | (lengths == 0))[0, 0])
            raise ValueError(
                "mask must be True at the first tokens of each sequence and False after them "
                f"(padding trails), with at least one real token; got mask[{i}] = "
                f"{mask[i].int().tolist()}."
            )
        return mask, lengths - 1, False

    def forward(self, x, mask=None):
        """The layer's output on a batch of sequences.

        Parameters
        ----------
        x : torch.Tensor of shape (batch, n_tokens, d)
            Sequences of the parameters' dtype; without ``mask``, trailing all-NaN
            tokens are padding, as for ``predict``.
        mask : torch.Tensor of shape (batch, n_tokens), bool, or None, default=None
            True at real tokens, which come first (values at padded ones are
            ignored); None: every token that is not NaN padding is real.

        Returns
        -------
        y : torch.Tensor
            Shape (batch, d_out), or (batch, n_tokens, d_out) for ``readout="all"``
            (zero where ``mask`` pads, NaN where NaN pads), also for ``d_out = 1``.

        Raises
        ------
        TypeError
            When x or mask is not a tensor of the expected dtype.
        ValueError
            When the padding or mask is malformed, or an output at a real
            position is not finite (an infinity in x, or an overflow).

        Examples
        --------
        >>> import torch
        >>> from sklearn_linattn.nn import MultiHeadLinearAttention
        >>> layer = MultiHeadLinearAttention(2, readout="all", dtype=torch.float64)
        >>> x = torch.ones(2, 4, 2, dtype=torch.float64)
        >>> x[1, 2:] = float("nan")
        >>> layer(x)[:, :, 0].isnan()
        tensor([[False, False, False, False],
                [False, False,  True,  True]])
        """
        mask, last, nan_padded = self._check_input(x, mask)
        if mask is not None:
            # Zeros, not NaN, at padded tokens: they then add nothing to any sum.
            x = torch.where(mask[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
        batch, n_tokens, _ = x.shape
        k = torch.einsum("hkd,bnd->bhnk", self.W_k, x)
        v = torch.einsum("hvd,bnd->bhnv", self.W_v, x)
        if self.b_q is not None:
            k, v = k + self.b_k[:, None], v + self.b_v[:, None]
            if mask is not None:  # a padded token has no key and no value, biases included
                real = mask[:, None, :, None].to(x.dtype)
                k, v = k * real, v * real
        positions = torch.arange(n_tokens, device=x.device)
        if self.readout == "last":
            x_out = x[torch.arange(batch, device=x.device), last]  # (batch, d)
            q = torch.einsum("hkd,bd->bhk", self.W_q, x_out)
            if self.b_q is not None:
                q = q + self.b_q
            if self.decay is not None:
                # decay[h] ** (last - s) on each key (multiplying by exact ones keeps a decay
                # of 1 bit for bit the layer without decay).  Past the last token the
                # exponent is clamped at zero, and the padded keys there are zero.
                steps = (last[:, None] - positions).clamp(min=0)                  # (b, n)
                weights = torch.pow(self.decay[:, None, None], steps)             # (h, b, n)
                k = k * weights.transpose(0, 1)[..., None]
            # Padded keys and values are zero, so summing over all positions is causal.
            state = torch.einsum("bhnk,bhnv->bhkv", k, v)
            heads = torch.einsum("bhk,bhkv->bhv", q, state).flatten(start_dim=1)
        else:
            x_out = x
            q = torch.einsum("hkd,bnd->bhnk", self.W_q, x)
            if self.b_q is not None:
                q = q + self.b_q[:, None]
            scores = torch.einsum("bhtk,bhsk->bhts", q, k)
            causal = torch.ones(n_tokens, n_tokens, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~causal, 0.0)
            if self.decay is not None:
                # decay[h] ** (t - s) below the diagonal (exponents clamped at zero above it,
                # where the scores are already zero): padding trails, so t - s counts real
                # tokens.
                steps = (positions[:, None] - positions).clamp(min=0)             # (t, s)
                scores = scores * torch.pow(self.decay[:, None, None], steps)
            heads = torch.einsum("bhts,bhsv->bthv", scores, v).flatten(start_dim=2)
        y = self.scale * heads @ self.W_o.T
        if self.skip is not None:
            y = y + x_out @ self.skip.T
        if self.bias is not None:
            y = y + self.bias
        _check_outputs(y, mask if self.readout == "all" else None)
        if self.readout == "all" and mask is not None:
            # NaN in, NaN out at padded positions (as predict); zero where a mask pads.
            y = (y.masked_fill(~mask[..., None], math.nan) if nan_padded
                 else y * mask[..., None])
        return y


def _check_outputs(y, mask):
    """Refuse outputs that are not finite at real positions: NaN marks padding, not overflow."""
    bad = ~torch.isfinite(y)
    if mask is not None:
        bad = bad & mask[..., None]
    if bool(bad.any()):
        i = int(torch.nonzero(bad.flatten(start_dim=1).any(dim=1))[0, 0])
        raise ValueError(
            f"the outputs for x[{i}] are not finite: x holds an infinity there, or its values "
            f"(cubed in the outputs) or the weights are too large for {y.dtype}; rescale x "
            "or the layer's weights."
        )


def _nan_padding(x, isnan):
    """The mask of real tokens of NaN-padded sequences: ``predict``'s padding rule, for tensors."""
    pad = isnan.all(dim=2)
    partial = isnan.any(dim=2) & ~pad
    if bool(partial.any()):
        i, t = torch.nonzero(partial)[0].tolist()
        raise ValueError(
            f"x[{i}, {t}] is partly NaN: a token is either real (no NaN) or padding (all NaN), "
            f"got {x[i, t].tolist()}."
        )
    real = ~pad
    lengths = real.sum(dim=1)
    if bool((lengths == 0).any()):
        i = int(torch.nonzero(lengths == 0)[0, 0])
        raise ValueError(
            f"x[{i}] is an empty sequence (every token is NaN padding); each sequence needs at "
            "least one real token."
        )
    prefix = torch.arange(x.shape[1], device=x.device) < lengths[:, None]
    if not torch.equal(prefix, real):
        i = int(torch.nonzero((prefix != real).any(dim=1))[0, 0])
        t = int(torch.nonzero(pad[i])[0, 0])
        raise ValueError(
            f"x[{i}, {t}] is an all-NaN token followed by real tokens: NaN padding may only "
            "appear at the end of a sequence."
        )
    return real


def _fitted_array(estimator, name, expected):
    """A fitted attribute as a finite float64 array; the messages name the attribute."""
    arr = as_real_array(getattr(estimator, name), name)
    if not np.all(np.isfinite(arr)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        where = f" at {name}[{', '.join(map(str, bad))}]" if bad else ""
        raise ValueError(
            f"the estimator's {name} must be finite ({expected}); got {float(arr[bad])!r}"
            f"{where}: the fit diverged or the attribute was changed after fitting. Refit "
            "the estimator."
        )
    return arr


def _fitted_heads(estimator):
    """The estimator's heads (V, Q), checked by attribute name."""
    V = _fitted_array(estimator, "value_matrices_", "value matrices of shape (n_heads, d_out, d)")
    Q = _fitted_array(estimator, "key_query_matrices_",
                      "key-query matrices of shape (n_heads, d, d)")
    if (V.ndim != 3 or Q.ndim != 3 or Q.shape[1] != Q.shape[2] or V.shape[0] != Q.shape[0]
            or V.shape[2] != Q.shape[1] or V.shape[0] == 0):
        raise ValueError(
            "the estimator's value_matrices_ must have shape (n_heads, d_out, d) and its "
            "key_query_matrices_ shape (n_heads, d, d), with the same n_heads >= 1 and d; got "
            f"shapes {V.shape} and {Q.shape}."
        )
    return V, Q


def _fitted_affine(estimator, name, shape):
    """An optional fitted affine term as float64 of ``shape``; None when absent or zero."""
    if getattr(estimator, name, None) is None:
        return None
    arr = _fitted_array(estimator, name, f"an array of shape {shape}")
    if arr.size != math.prod(shape):
        raise ValueError(
            f"the estimator's {name} must have shape {shape}; got shape {arr.shape}."
        )
    arr = arr.reshape(shape)
    return arr if np.any(arr != 0) else None


def _factor_heads(V, Q, decays, **kwargs):
    """``projections_from_heads`` per group of heads of one decay, and each layer head's decay."""
    if decays is None:
        return projections_from_heads(V, Q, **kwargs), None
    _, first = np.unique(decays, return_index=True)
    groups = [decays == decays[i] for i in np.sort(first)]
    parts = [projections_from_heads(V[g], Q[g], **kwargs) for g in groups]
    p = type(parts[0])(*(np.concatenate(Ws, axis=1 if name == "W_o" else 0)
                         for name, Ws in zip(parts[0]._fields, zip(*parts))))
    layer_decays = np.concatenate([np.full(len(part.W_q), decays[g][0])
                                   for part, g in zip(parts, groups)])
    return p, layer_decays


def _with_constant(model):
    """``(fitted, constant)``: a fitted estimator as is (constant None), the estimator of a
    Pipeline ``(AppendConstant, estimator)`` and the constant it appends, or the heads that
    :func:`from_torch` read, as an object with an estimator's fitted attributes."""
    if isinstance(model, AttentionHeads):
        fitted = types.SimpleNamespace(
            value_matrices_=model.value_matrices, key_query_matrices_=model.key_query_matrices,
            intercept_=model.intercept, skip_coef_=model.skip_coef, head_decays_=model.decays,
            readout=check_readout(model.readout))
        return fitted, model.constant
    if not isinstance(model, Pipeline):
        check_is_fitted(model, ["value_matrices_", "key_query_matrices_"])
        return model, None
    steps = [step for _, step in model.steps if step not in (None, "passthrough")]
    if len(steps) != 2 or not isinstance(steps[0], AppendConstant):
        raise ValueError(
            "to_torch takes a fitted estimator, or a Pipeline of AppendConstant and a fitted "
            f"estimator (a layer with q, k and v biases); got a Pipeline of "
            f"{[type(step).__name__ for step in steps]}. Other preprocessing (positions, "
            "patches) is not part of the layer.")
    check_is_fitted(steps[0])
    check_is_fitted(steps[1], ["value_matrices_", "key_query_matrices_"])
    return steps[1], float(steps[0].value)


def to_torch(estimator, *, d_k=None, d_v=None, dtype=torch.float64):
    """A fitted estimator as a :class:`MultiHeadLinearAttention` computing the same function.

    The heads are factored exactly by :func:`~sklearn_linattn.projections_from_heads`
    with ``scale = 1 / sqrt(d_k)``; a non-zero ``intercept_``, ``skip_coef_`` and the
    ``head_decays_`` become the module's ``bias``, ``skip`` and ``decay``.

    Parameters
    ----------
    estimator : LinearAttentionRegressor, AdamLinearAttentionRegressor, Pipeline or AttentionHeads
        A fitted estimator (anything with ``value_matrices_``,
        ``key_query_matrices_``, ``n_features_in_`` and ``readout``); a
        fitted Pipeline of :class:`~sklearn_linattn.preprocessing.AppendConstant`
        and one, or heads :func:`from_torch` read with a ``constant``: a
        layer with q, k and v biases on the tokens before the constant.
    d_k, d_v : int or None, default=None
        Size of each head's queries and keys, and of its values; None is the
        estimator's ``head_dim_`` when it has one, else d and ``min(d_out, d)``,
        one module head per estimator head.
    dtype : torch.dtype, default=torch.float64
        ``torch.float64`` or ``torch.float32`` (about 7 significant digits).

    Returns
    -------
    module : MultiHeadLinearAttention
        With the estimator's readout, on (batch, n_tokens, d) whatever the
        ``data_format``; its output keeps the axis that ``predict`` may drop.

    Raises
    ------
    ValueError
        When a fitted attribute is not finite, out of range or has the wrong
        shape (the message names it), or the estimator has the linear term of
        ``fit_linear=True``.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> from sklearn_linattn.nn import to_torch
    >>> X, y = make_random_mhla(200, n_tokens=6, d=3, random_state=0)
    >>> model = LinearAttentionRegressor(n_heads=1).fit(X, y)
    >>> out = to_torch(model)(torch.as_tensor(X)).detach().numpy()
    >>> bool(np.allclose(out[:, 0], model.predict(X)))
    True
    """
    estimator, constant = _with_constant(estimator)
    estimator = on_host(estimator)  # a fit in another array namespace: its arrays read once
    if getattr(estimator, "linear_coef_", None) is not None:
        raise ValueError(
            "to_torch writes attention with a bias and a skip term; this estimator has the "
            "linear term of fit_linear=True, which MultiHeadLinearAttention does not hold.")
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}.")
    V, Q = _fitted_heads(estimator)
    d_out, d = V.shape[1:]
    if constant is not None and d < 2:
        raise ValueError(
            f"the estimator after AppendConstant reads tokens of d={d}: there is no token "
            "besides the constant coordinate.")
    decays = getattr(estimator, "head_decays_", None)
    if decays is not None:
        decays = check_head_decays(decays, len(V), name="the estimator's head_decays_")
    head_dim = getattr(estimator, "head_dim_", None)
    if head_dim is not None:  # the fitted layer's own head dimension
        d_k = head_dim if d_k is None else d_k
        d_v = min(d_out, head_dim) if d_v is None else d_v
    size = d if d_k is None else _positive_int(d_k, "d_k")
    scale = 1.0 / math.sqrt(size)
    p, layer_decays = _factor_heads(V, Q, decays, d_k=d_k, d_v=d_v, scale=scale)
    intercept = _fitted_affine(estimator, "intercept_", (d_out,))
    skip = _fitted_affine(estimator, "skip_coef_", (d_out, d))
    values = {"W_q": p.W_q, "W_k": p.W_k, "W_v": p.W_v, "W_o": p.W_o}
    if constant is not None:
        # The last coordinate is the constant c: W [x; c] = W_x x + c w, a bias.
        d -= 1
        for role in ("q", "k", "v"):
            W = values[f"W_{role}"]
            values[f"W_{role}"], values[f"b_{role}"] = W[..., :d], constant * W[..., d]
        if skip is not None:
            extra = constant * skip[:, d]
            skip = skip[:, :d] if np.any(skip[:, :d]) else None
            intercept = extra if intercept is None else intercept + extra
    values.update(bias=intercept, skip=skip)
    module = MultiHeadLinearAttention(
        d, len(p.W_q), d_k=p.W_q.shape[1], d_v=p.W_v.shape[1], d_out=d_out, scale=scale,
        readout=estimator.readout, decay=layer_decays, bias=intercept is not None,
        skip=skip is not None, qkv_bias=constant is not None, dtype=dtype,
    )
    with torch.no_grad():
        for name, value in values.items():
            if value is not None:
                getattr(module, name).copy_(torch.from_numpy(value))
    return module
