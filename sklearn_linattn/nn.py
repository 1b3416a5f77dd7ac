"""PyTorch in and out: the fitted heads as a ``torch.nn.Module``, and modules back as heads.

This module needs PyTorch (the ``torch`` extra); the rest of the package does
not import it.  The layer is the standard causal multi-head linear attention
of :func:`~sklearn_linattn.heads_from_projections`; :func:`to_torch` and
:func:`from_torch` convert between it and the package's heads exactly.
"""

import math
from collections import namedtuple
from collections.abc import Mapping

import numpy as np
import torch
from sklearn.utils.validation import check_is_fitted

from ._validation import as_real_array, check_number, check_readout
from .layouts import (
    _check_float64_size,
    _dense_weight,
    heads_from_projections,
    projections_from_heads,
)

__all__ = ["AttentionHeads", "MultiHeadLinearAttention", "from_torch", "to_torch"]

#: What :func:`from_torch` returns: the heads and the affine terms of a layer
#: as float64 arrays (intercept and skip_coef None when the layer has none).
AttentionHeads = namedtuple(
    "AttentionHeads",
    ["value_matrices", "key_query_matrices", "intercept", "skip_coef", "readout"],
)

_FLOATS = (torch.float32, torch.float64)


def _positive_int(value, name):
    return check_number(value, name, integer=True, low=1)


class MultiHeadLinearAttention(torch.nn.Module):
    """Causal multi-head linear attention, the standard layout, as a PyTorch module.

    For tokens ``x_1, ..., x_n`` the output at position t is

        ``y_t = bias + skip @ x_t + W_o concat_h [scale * sum_{s <= t} (q_t . k_s) v_s]``

    with ``q = W_q[h] x``, ``k = W_k[h] x`` and ``v = W_v[h] x``: the package's
    MHLA with heads ``heads_from_projections(W_q, W_k, W_v, W_o, scale=scale)``
    plus an affine term in the current token.  No softmax and no
    normalization: the scores enter linearly.

    Parameters
    ----------
    d : int
        Token dimension.
    n_heads : int, default=1
        Number of heads.
    d_k : int or None, default=None
        Size of each head's queries and keys; None is d.
    d_v : int or None, default=None
        Size of each head's values; None is d.
    d_out : int or None, default=None
        Output dimension; None is d.
    scale : float or None, default=None
        Factor of every score ``q_t . k_s``; None is ``1 / sqrt(d_k)``.
    readout : {"last", "all"}, default="last"
        ``"last"``: the output at the last real token of each sequence, shape
        (batch, d_out).  ``"all"``: the output at every position, shape
        (batch, n_tokens, d_out), zero at positions a mask pads and NaN at
        NaN-padded positions.
    bias : bool, default=False
        Whether the output has a learned constant term ``bias`` (initialized
        to zero).
    skip : bool, default=False
        Whether the output has a learned linear term ``skip @ x_t`` in the
        current token (initialized to zero).
    dtype : torch.dtype or None, default=None
        ``torch.float32`` or ``torch.float64``; None is torch's default dtype.
    device : torch.device, str or None, default=None
        Where the parameters live.

    Attributes
    ----------
    W_q : torch.nn.Parameter of shape (n_heads, d_k, d)
        Query projections.
    W_k : torch.nn.Parameter of shape (n_heads, d_k, d)
        Key projections.
    W_v : torch.nn.Parameter of shape (n_heads, d_v, d)
        Value projections.
    W_o : torch.nn.Parameter of shape (d_out, n_heads * d_v)
        Output projection of the concatenated heads.
    bias : torch.nn.Parameter of shape (d_out,) or None
        Constant term; None without ``bias=True``.
    skip : torch.nn.Parameter of shape (d_out, d) or None
        Linear term in the current token; None without ``skip=True``.

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
                 readout="last", bias=False, skip=False, dtype=None, device=None):
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
        self.reset_parameters()

    def reset_parameters(self):
        """Draw the projections uniformly as ``torch.nn.Linear`` does; zero bias and skip.

        Returns
        -------
        None
            The parameters are changed in place.

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
            for W in (self.bias, self.skip):
                if W is not None:
                    W.zero_()

    def extra_repr(self):  # numpydoc ignore=EX01
        """The sizes, as ``print(module)`` shows them.

        Returns
        -------
        str
            The token dimension, heads, sizes, scale and readout.
        """
        H, d_k, d = self.W_q.shape
        return (f"d={d}, n_heads={H}, d_k={d_k}, d_v={self.W_v.shape[1]}, "
                f"d_out={self.W_o.shape[0]}, scale={self.scale:.6g}, "
                f"readout={self.readout!r}, bias={self.bias is not None}, "
                f"skip={self.skip is not None}")

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
            Sequences, of the parameters' dtype.  Without ``mask``, trailing
            all-NaN tokens are padding, the rule of the package's ``predict``
            (a partly-NaN token, or a NaN token followed by a real one, is a
            ValueError).  With ``mask``, values at padded positions are
            ignored (they may be NaN).
        mask : torch.Tensor of shape (batch, n_tokens), bool, or None, default=None
            True at real tokens, which come first in each sequence (padding
            trails); None: every token that is not NaN padding is real.

        Returns
        -------
        y : torch.Tensor
            ``readout="last"``: shape (batch, d_out), the output at each
            sequence's last real token.  ``readout="all"``: shape
            (batch, n_tokens, d_out), zero at the positions ``mask`` pads
            (losses over the batch stay finite) and NaN at NaN-padded
            positions (as ``predict``).  The output axis is there even for
            ``d_out = 1``.

        Notes
        -----
        Without ``mask`` the layer reads one boolean back from the device
        per call (whether x holds a NaN); only then does it look for the
        padding.  With ``mask`` it checks the mask's layout, which also reads
        back from the device.

        Examples
        --------
        >>> import torch
        >>> from sklearn_linattn.nn import MultiHeadLinearAttention
        >>> layer = MultiHeadLinearAttention(2, readout="all", dtype=torch.float64)
        >>> layer(torch.ones(3, 4, 2, dtype=torch.float64)).shape
        torch.Size([3, 4, 2])

        NaN padding, as the estimators read it (here the second sequence has
        two real tokens):

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
        if self.readout == "last":
            x_out = x[torch.arange(batch, device=x.device), last]  # (batch, d)
            q = torch.einsum("hkd,bd->bhk", self.W_q, x_out)
            # Padded keys and values are zero, so summing over all positions is causal.
            state = torch.einsum("bhnk,bhnv->bhkv", k, v)
            heads = torch.einsum("bhk,bhkv->bhv", q, state).reshape(batch, -1)
        else:
            x_out = x
            q = torch.einsum("hkd,bnd->bhnk", self.W_q, x)
            scores = torch.einsum("bhtk,bhsk->bhts", q, k)
            causal = torch.ones(n_tokens, n_tokens, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~causal, 0.0)
            heads = torch.einsum("bhts,bhsv->bthv", scores, v).reshape(batch, n_tokens, -1)
        y = self.scale * heads @ self.W_o.T
        if self.skip is not None:
            y = y + x_out @ self.skip.T
        if self.bias is not None:
            y = y + self.bias
        if self.readout == "all" and mask is not None:
            # NaN in, NaN out at padded positions (as predict); zero where a mask pads.
            y = (y.masked_fill(~mask[..., None], math.nan) if nan_padded
                 else y * mask[..., None])
        return y


def _nan_padding(x, isnan):
    """The mask of real tokens of NaN-padded sequences: the package's padding rule, for tensors.

    A token is padding when all its entries are NaN, and padding may only
    trail the sequence; the errors are those of ``predict``.
    """
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


def to_torch(estimator, *, d_k=None, d_v=None, dtype=torch.float64):
    """A fitted estimator as a :class:`MultiHeadLinearAttention` computing the same function.

    The heads are factored exactly by
    :func:`~sklearn_linattn.projections_from_heads` with ``scale = 1 / sqrt(d_k)``;
    with ``d_k`` (``d_v``) below the rank of some ``Q_h`` (``V_h``) the module
    has more heads than the estimator.  A fitted ``intercept_`` or
    ``skip_coef_`` that is not zero becomes the module's ``bias`` or ``skip``.

    Parameters
    ----------
    estimator : LinearAttentionRegressor or AdamLinearAttentionRegressor
        A fitted estimator (anything with ``value_matrices_``,
        ``key_query_matrices_``, ``n_features_in_`` and ``readout``).
    d_k : int or None, default=None
        Size of each head's queries and keys; None is d (one module head per
        estimator head).
    d_v : int or None, default=None
        Size of each head's values; None is ``min(d_out, d)``.
    dtype : torch.dtype, default=torch.float64
        ``torch.float64`` or ``torch.float32`` (which rounds the weights to
        about 7 significant digits).

    Returns
    -------
    module : MultiHeadLinearAttention
        With the estimator's readout.  Its input is (batch, n_tokens, d)
        whatever the estimator's ``data_format``, NaN-padded as for
        ``predict`` (same outputs, NaN at padded positions) or with a mask;
        its output keeps the output axis also where ``predict`` drops it
        (targets fitted without one).

    Raises
    ------
    ValueError
        When a fitted attribute (``value_matrices_``,
        ``key_query_matrices_``, ``intercept_``, ``skip_coef_``) is not
        finite or has the wrong shape; the message names it.

    Examples
    --------
    >>> import numpy as np
    >>> import torch
    >>> from sklearn_linattn import LinearAttentionRegressor
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> from sklearn_linattn.nn import to_torch
    >>> X, y = make_random_mhla(200, n_tokens=6, d=3, random_state=0)
    >>> model = LinearAttentionRegressor(n_heads=1).fit(X, y)
    >>> layer = to_torch(model)
    >>> out = layer(torch.as_tensor(X)).detach().numpy()
    >>> bool(np.allclose(out[:, 0], model.predict(X)))
    True

    NaN-padded sequences, as ``predict`` reads them:

    >>> X[0, 4:] = np.nan                       # the first sequence has 4 tokens
    >>> out = layer(torch.as_tensor(X)).detach().numpy()
    >>> bool(np.allclose(out[:, 0], model.predict(X)))
    True
    """
    check_is_fitted(estimator, ["value_matrices_", "key_query_matrices_"])
    if dtype not in _FLOATS:
        raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}.")
    V, Q = _fitted_heads(estimator)
    d_out, d = V.shape[1:]
    size = d if d_k is None else _positive_int(d_k, "d_k")
    scale = 1.0 / math.sqrt(size)
    p = projections_from_heads(V, Q, d_k=d_k, d_v=d_v, scale=scale)
    intercept = _fitted_affine(estimator, "intercept_", (d_out,))
    skip = _fitted_affine(estimator, "skip_coef_", (d_out, d))
    module = MultiHeadLinearAttention(
        d, len(p.W_q), d_k=p.W_q.shape[1], d_v=p.W_v.shape[1], d_out=d_out, scale=scale,
        readout=estimator.readout, bias=intercept is not None, skip=skip is not None,
        dtype=dtype,
    )
    values = {"W_q": p.W_q, "W_k": p.W_k, "W_v": p.W_v, "W_o": p.W_o,
              "bias": intercept, "skip": skip}
    with torch.no_grad():
        for name, value in values.items():
            if value is not None:
                getattr(module, name).copy_(torch.from_numpy(value))
    return module


# What from_torch reads.  Weights by role: the package's own layout, then the names of
# flash-linear-attention and most PyTorch code (o: either name).
_PACKAGE_LAYOUT = {"q": "W_q", "k": "W_k", "v": "W_v", "o": "W_o"}
_PROJ_LAYOUT = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": ("o_proj", "out_proj")}
_NAME_KEYS = ("q", "k", "v", "o", "n_heads", "n_kv_heads", "scale")
# Numbers, on the module holding the query projection: the first attribute present (and not
# None) counts.
_HEADS_ATTRS = ("num_heads", "n_heads")
_KV_HEADS_ATTRS = ("num_kv_heads", "num_key_value_heads", "n_kv_heads")
_SCALE_ATTRS = ("scale", "scaling")
# Stages real layers add around the projections; each makes the layer another function than
# the plain linear attention whose weights from_torch reads.  Present and neither None, False
# nor an identity: refused.
_STAGES = {
    "feature_map": "a feature map on queries and keys",
    "feature_map_q": "a feature map on the queries",
    "feature_map_k": "a feature map on the keys",
    "norm_q": "a normalization of the queries",
    "norm_k": "a normalization of the keys",
    "do_feature_map_norm": "a normalization of the scores",
    "q_norm": "a normalization of the queries",
    "k_norm": "a normalization of the keys",
    "norm": "a normalization of the heads' outputs",
    "o_norm": "a normalization of the heads' outputs",
    "g_norm": "a normalization of the heads' outputs",
    "g_proj": "a gate",
    "gk_proj": "a gate (data-dependent decay)",
    "b_proj": "a gate (delta rule)",
    "a_proj": "a gate",
    "f_proj": "a gate",
    "rotary": "rotary position embeddings",
    "rotary_emb": "rotary position embeddings",
    "use_short_conv": "a short convolution",
}
_HINTS = (
    "Name the module's own attributes with names={'q': ..., 'k': ..., 'v': ..., 'o': ...} "
    "(dotted paths such as 'attn.wq'; n_heads=... for fused 2-D weights), or compute the "
    "heads from the weights with sklearn_linattn.heads_from_projections."
)


def _scalar(value, label, what, **limits):
    """One number read from a module (a tensor or array of one element included), checked."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if isinstance(value, torch.Tensor) and value.device.type == "meta":
            raise ValueError(
                f"{label} is a tensor on the meta device: it has no value. Load the module's "
                "weights first."
            )
        size = value.numel() if isinstance(value, torch.Tensor) else value.size
        if size != 1:
            raise ValueError(
                f"{label} must be one number, {what}; got a {type(value).__name__} of shape "
                f"{tuple(value.shape)}."
            )
        value = value.item()
    return check_number(value, label, **limits)


def _weight_array(value, label):
    """A weight read from a module as float64, refused by name when it cannot be read exactly."""
    if isinstance(value, torch.Tensor):
        if torch.nn.parameter.is_lazy(value):
            raise ValueError(
                f"{label} is not initialized (a lazy module): run the module once on an input "
                "of the right size, then read it."
            )
        if value.is_complex():
            raise TypeError(
                f"{label} must be a real tensor; got a complex tensor of dtype {value.dtype} "
                f"and shape {tuple(value.shape)}. The heads are real: dropping the imaginary "
                "part would change the layer's function."
            )
        if value.device.type != "meta" and value.layout == torch.strided:
            if value.is_quantized:
                raise TypeError(
                    f"{label} is a quantized tensor of dtype {value.dtype}: pass the module "
                    "with dequantized weights (tensor.dequantize())."
                )
            # Before the copy: an expanded view holds few values but copies to its full size.
            _check_float64_size(value.numel(), f"{label} of shape {tuple(value.shape)}")
            value = value.detach().to("cpu", torch.float64).numpy()
    return _dense_weight(value, label)


_MISSING = object()


def _resolve(module, path):
    """The attribute at a dotted path, or _MISSING."""
    obj = module
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return _MISSING
    return obj


def _check_names(names):
    """``names`` as a dict of attribute paths, checked key by key."""
    if not isinstance(names, Mapping):
        raise TypeError(
            "names must be None or a mapping (dict) from 'q', 'k', 'v', 'o' (and optionally "
            f"'n_heads', 'n_kv_heads', 'scale') to attribute names; got {type(names).__name__}."
        )
    unknown = sorted(repr(key) for key in names if key not in _NAME_KEYS)
    missing = [repr(key) for key in _PACKAGE_LAYOUT if key not in names]
    if unknown or missing:
        got = " and ".join(part for part in (
            "unknown keys " + ", ".join(unknown) if unknown else "",
            "no " + ", ".join(missing) if missing else "") if part)
        raise ValueError(
            "names must have the keys 'q', 'k', 'v' and 'o' ('o': None for a layer without "
            f"output projection), and may have 'n_heads', 'n_kv_heads' and 'scale'; got {got}."
        )
    for key, value in names.items():
        if value is None and key == "o":
            continue
        if not isinstance(value, str) or not all(value.split(".")):
            hint = (f" (pass the number itself as {key}=...)"
                    if key in ("n_heads", "scale") and not isinstance(value, str) else "")
            raise TypeError(
                f"names[{key!r}] must be the name of an attribute of the module (a dotted path "
                f"such as 'attn.q_proj'){hint}; got {value!r}."
            )
    return dict(names)


def _find_layout(module):
    """A module's projections in a layout from_torch knows: their paths; the package's or not."""
    cls = type(module).__name__
    looked = (
        "the attributes W_q, W_k, W_v, W_o (the layout of MultiHeadLinearAttention) and "
        "q_proj, k_proj, v_proj, o_proj or out_proj (torch.nn.Linear, with num_heads or "
        "n_heads: the naming of flash-linear-attention and most PyTorch code)"
    )
    for layout in (_PACKAGE_LAYOUT, _PROJ_LAYOUT):
        options = {role: (a,) if isinstance(a, str) else a for role, a in layout.items()}
        found = {role: next((a for a in attrs if hasattr(module, a)), None)
                 for role, attrs in options.items()}
        if not any(found[role] for role in ("q", "k", "v")):
            continue
        absent = [" or ".join(options[role]) for role in options if found[role] is None]
        if absent:
            raise TypeError(
                f"{cls} has {', '.join(a for a in found.values() if a)} but no "
                f"{', '.join(absent)}: from_torch looked for {looked}. {_HINTS}"
            )
        return found, layout is _PACKAGE_LAYOUT
    raise TypeError(
        f"from_torch cannot find the projections of {cls}: it looked for {looked}. {_HINTS}"
    )


def _check_plain(owner, label):
    """Refuse a layer with a stage that makes it another function than plain linear attention."""
    cls = type(owner)
    if cls.__module__.split(".")[0] == "fla" and cls.__name__ != "LinearAttention":
        raise ValueError(
            f"{label} is flash-linear-attention's {cls.__name__}: its gates, decays or delta "
            "rule make it another function than the plain linear attention from_torch reads. "
            "Of that library's layers only LinearAttention (with feature_map='identity' and "
            "output_norm='identity') is plain linear attention."
        )
    for attr, what in _STAGES.items():
        value = getattr(owner, attr, None)
        if (value is None or isinstance(value, torch.nn.Identity)
                or (isinstance(value, (bool, int, np.bool_)) and not value)
                or (isinstance(value, str) and value == "identity")):
            continue
        shown = repr(value) if isinstance(value, (bool, str, int)) else type(value).__name__
        raise ValueError(
            f"{label}.{attr} is {shown}: the layer applies {what}, so it is another function "
            "than the plain linear attention o_t = W_o concat_h [scale sum_(s<=t) (q_t . k_s) "
            "v_s] whose weights from_torch reads, and its heads would compute something else. "
            "Read a layer without it (flash-linear-attention: LinearAttention(feature_map="
            f"'identity', output_norm='identity')); if its forward does not use {attr}, "
            "compute the heads from the weights with sklearn_linattn.heads_from_projections."
        )


def _projection(obj, label):
    """(weight, bias or None, label of the weight) of a projection: a tensor or a Linear."""
    weight = _MISSING if isinstance(obj, torch.Tensor) else getattr(obj, "weight", _MISSING)
    if weight is _MISSING:  # the weight itself: a tensor, or an array of a duck-typed object
        return _weight_array(obj, label), None, label
    bias = getattr(obj, "bias", None)
    bias = None if bias is None else _weight_array(bias, f"{label}.bias")
    return _weight_array(weight, f"{label}.weight"), bias, f"{label}.weight"


def _number(module, owner, owner_label, path, attrs, what, **limits):
    """(value, label) of a layer's number: at ``path`` if named, else the first of ``attrs``."""
    if path is not None:
        value = _resolve(module, path)
        if value is _MISSING or value is None:
            raise ValueError(
                f"names gives {path!r} for {what}, which {type(module).__name__} does not have "
                "(or is None)."
            )
        return _scalar(value, f"module.{path}", what, **limits), f"module.{path}"
    for attr in attrs:
        value = getattr(owner, attr, None)
        if value is not None:
            label = f"{owner_label}.{attr}"
            return _scalar(value, label, what, **limits), label
    return None, None


def _split_heads(W, labels, n_heads, n_kv_heads, dims):
    """Fused (rows, d) projections as per-head (n_heads, rows, d); grouped keys repeated."""
    H, heads_label = n_heads
    rows = {role: W[role].shape[0] for role in ("q", "k", "v")}
    if rows["q"] % H:
        raise ValueError(
            f"{labels['q']} has {rows['q']} rows, not a multiple of {heads_label} = {H}."
        )
    d_k = rows["q"] // H
    H_kv, kv_label = n_kv_heads
    if H_kv is None:
        H_kv = H if rows["k"] == rows["q"] else None
    if H_kv is None or H % H_kv or rows["k"] != H_kv * d_k or rows["v"] % H_kv:
        raise ValueError(
            f"{labels['k']} must have n_kv_heads * d_k rows and {labels['v']} a multiple of "
            f"n_kv_heads rows, with d_k = {d_k} ({labels['q']} has {rows['q']} rows for "
            f"{heads_label} = {H}) and n_kv_heads dividing it; got {rows['k']} and "
            f"{rows['v']} rows and n_kv_heads = "
            f"{H_kv if kv_label is None else f'{kv_label} = {H_kv}'} (grouped keys and values "
            f"are read from the attribute {' or '.join(_KV_HEADS_ATTRS)})."
        )
    d_v = rows["v"] // H_kv
    for (value, label), size, role in zip(dims, (d_k, d_k, d_v), ("q", "q", "v")):
        if value is not None and value != size:
            raise ValueError(
                f"{label} = {value}, but the projections have heads of size {size} "
                f"({labels[role]} has {rows[role]} rows for {H if role == 'q' else H_kv} heads)."
            )
    d = W["q"].shape[1]
    _check_float64_size(H * (2 * d_k + d_v) * d, f"the per-head projections of {H} heads")
    group = H // H_kv
    return (W["q"].reshape(H, d_k, d),
            np.repeat(W["k"].reshape(H_kv, d_k, d), group, axis=0),
            np.repeat(W["v"].reshape(H_kv, d_v, d), group, axis=0))


def from_torch(module, *, readout=None, names=None, n_heads=None, scale=None):
    """The heads and affine terms of a linear attention layer, as NumPy arrays.

    Reads the weights of a layer computing causal multi-head linear attention

        ``o_t = W_o concat_h [scale * sum_{s <= t} (q_t . k_s) v_s]``

    with ``q = W_q[h] x``, ``k = W_k[h] x`` and ``v = W_v[h] x`` (no softmax,
    normalization or feature map), and returns the package's heads
    ``V_h = W_o[:, block h] W_v[h]`` and ``Q_h = scale * W_k[h]^T W_q[h]``:
    exact up to rounding, in float64 whatever the layer's dtype and device.
    The weights are found

    - in a :class:`MultiHeadLinearAttention`, or any object with its
      attributes ``W_q``, ``W_k``, ``W_v`` (per head, of shape
      (n_heads, rows, d), or fused 2-D of shape (n_heads * rows, d) with
      ``n_heads``), ``W_o`` (None: no output projection), and optionally
      ``scale``, ``bias``, ``skip`` and ``readout``;
    - under the names of flash-linear-attention and most PyTorch code:
      ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` (or ``out_proj``), each a
      ``torch.nn.Linear`` whose weight has shape (out, in) and rows
      ``h * d_k`` to ``(h + 1) * d_k - 1`` for head h, with the number of heads
      in ``num_heads`` or ``n_heads`` (or implied by ``head_dim``).  Grouped
      keys and values (``num_kv_heads`` or ``num_key_value_heads`` below
      ``num_heads``) serve query head h with key-value head
      ``h // (num_heads // num_kv_heads)``; ``head_dim``, ``head_k_dim`` and
      ``head_v_dim`` are checked when present.  The output projection's bias
      is the constant term;
    - wherever ``names`` says, for any other layer.

    Parameters
    ----------
    module : torch.nn.Module or object
        The layer; tensors may be on any device and of any real dtype.
    readout : {"last", "all"} or None, default=None
        None: the layer's ``readout`` attribute.  A layer found by its
        projections (``q_proj``, ... or ``names``) without one outputs at
        every position: ``"all"``.
    names : dict or None, default=None
        Where the weights are, for a layer the conventions above do not
        cover: keys ``"q"``, ``"k"``, ``"v"`` and ``"o"`` with attribute names
        of ``module`` (dotted paths such as ``"attn.wq"``) of a
        ``torch.nn.Linear`` or of a weight tensor (fused 2-D, or per head
        3-D); ``"o": None`` for a layer without output projection.  Optional
        keys ``"n_heads"``, ``"n_kv_heads"`` and ``"scale"`` name attributes
        holding those numbers; numbers not named are looked for under the
        conventional names on the module holding the query projection.
    n_heads : int or None, default=None
        Number of heads, for a layer with fused weights that does not carry
        it; it overrides the layer's attribute.
    scale : float or None, default=None
        Factor of every score ``q_t . k_s``; it overrides the layer's.
        None: the layer's ``scale`` (or ``scaling``) attribute, one positive
        number, when it has one that is not None; otherwise
        ``1 / sqrt(d_k)`` is assumed, the default of the package's layer and
        of flash-linear-attention's kernels: pass ``scale=1.0`` for a layer
        that does not scale its scores.

    Returns
    -------
    heads : AttentionHeads
        A named tuple ``(value_matrices, key_query_matrices, intercept,
        skip_coef, readout)``: float64 arrays of shape (n_heads, d_out, d)
        and (n_heads, d, d) for :func:`~sklearn_linattn.mhla_forward`, the
        constant term (d_out,) and the linear term (d_out, d) (each None when
        the layer has none), and the readout.

    Raises
    ------
    TypeError
        When the weights are not found (the message says what was looked
        for), or a weight is complex, sparse or quantized.
    ValueError
        When a query, key or value projection has a bias that is not zero
        (no MHLA computes its terms); when the layer has a stage that makes
        it another function (a feature map, a normalization, a gate, rotary
        embeddings, a convolution: the attributes of flash-linear-attention's
        layers); when a weight is not finite, has no values (the meta
        device) or would not fit the memory budget as float64 (checked
        before copying); when ``scale`` is not one positive number; or when
        the sizes do not fit together.

    See Also
    --------
    sklearn_linattn.heads_from_projections : The same from weight arrays.
    to_torch : A fitted estimator as a layer.

    Notes
    -----
    ``from_torch`` reads weights, not the forward pass.  A layer with these
    names that computes something else inside its forward (a softmax,
    positions, decays) gives the heads of another function: compare
    ``layer(x)`` with the heads on a random input once when in doubt.

    Examples
    --------
    >>> import torch
    >>> from sklearn_linattn import mhla_forward
    >>> from sklearn_linattn.nn import MultiHeadLinearAttention, from_torch
    >>> layer = MultiHeadLinearAttention(3, n_heads=2, dtype=torch.float64)
    >>> heads = from_torch(layer)
    >>> x = torch.randn(2, 4, 3, dtype=torch.float64)
    >>> y = mhla_forward(x.numpy(), heads.value_matrices, heads.key_query_matrices)
    >>> torch.allclose(layer(x), torch.as_tensor(y))
    True

    A layer with other names, read through ``names``:

    >>> class Attention(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.wq, self.wk, self.wv, self.wo = (
    ...             torch.nn.Linear(8, 8, bias=False) for _ in range(4))
    ...         self.heads = 2
    >>> heads = from_torch(Attention(), scale=1.0, names={
    ...     "q": "wq", "k": "wk", "v": "wv", "o": "wo", "n_heads": "heads"})
    >>> heads.value_matrices.shape, heads.key_query_matrices.shape, heads.readout
    ((2, 8, 8), (2, 8, 8), 'all')
    """
    if names is None:
        paths, package = _find_layout(module)
    else:
        paths, package = _check_names(names), False
    sources = {}
    for role in _PACKAGE_LAYOUT:
        path = paths[role]
        sources[role] = None if path is None else _resolve(module, path)
        if sources[role] is _MISSING:
            raise ValueError(
                f"names[{role!r}] = {path!r} is not an attribute of {type(module).__name__}. "
                f"{_HINTS}"
            )
        if sources[role] is None and role != "o":
            raise ValueError(f"module.{path} is None: the layer needs a {role} projection.")
    # The module holding the query projection carries the layer's stages and numbers.
    parts = paths["q"].split(".")[:-1]
    if paths["q"].endswith(".weight"):
        parts = parts[:-1]  # "attn.q_proj.weight": the layer is attn, not its Linear
    owner = _resolve(module, ".".join(parts)) if parts else module
    owner_label = ".".join(["module"] + parts)
    _check_plain(owner, owner_label)
    named = {key: paths.get(key) if names is not None else None
             for key in ("n_heads", "n_kv_heads", "scale")}

    W, biases, labels = {}, {}, {}
    for role, obj in sources.items():
        label = f"module.{paths[role]}" if paths[role] is not None else "W_o"
        W[role], biases[role], labels[role] = (
            (None, None, label) if obj is None else _projection(obj, label))
    for role in ("q", "k", "v"):
        if biases[role] is not None and np.any(biases[role] != 0):
            raise ValueError(
                f"{labels[role][:-len('.weight')]}.bias must be zero or None; got a bias "
                f"of largest magnitude {np.max(np.abs(biases[role])):.3g}. A bias on the "
                "query, key or value projection adds terms of lower degree in the tokens that "
                "no MHLA computes: read a layer whose q, k and v projections have no bias."
            )
    if {W[role].ndim for role in ("q", "k", "v")} not in ({2}, {3}):
        raise ValueError(
            f"{labels['q']}, {labels['k']} and {labels['v']} must be all fused 2-D (rows, d) "
            "or all per head (n_heads, rows, d); got shapes "
            f"{W['q'].shape}, {W['k'].shape} and {W['v'].shape}."
        )
    if n_heads is not None:
        heads = (_scalar(n_heads, "n_heads", "the number of heads", integer=True, low=1),
                 "n_heads")
    else:
        heads = _number(module, owner, owner_label, named["n_heads"], _HEADS_ATTRS,
                        "the number of heads", integer=True, low=1)
    W_q, W_k, W_v = W["q"], W["k"], W["v"]
    if W_q.ndim == 2:
        dims = [_number(module, owner, owner_label, None, (attr,), f"the head size {attr}",
                        integer=True, low=1) for attr in ("head_dim", "head_k_dim", "head_v_dim")]
        if heads[0] is None:
            size, label = next((dim for dim in dims[:2] if dim[0] is not None), (None, None))
            if size is None or W_q.shape[0] % size:
                raise ValueError(
                    f"the number of heads of {type(module).__name__} is unknown: its weights "
                    f"are fused ({labels['q']} has shape {W_q.shape}) and {owner_label} has "
                    f"none of the attributes {', '.join(_HEADS_ATTRS)}"
                    f"{'' if size is None else f' ({label} = {size} does not divide it)'}. "
                    "Pass n_heads=..., or name the attribute with names={..., 'n_heads': ...}."
                )
            heads = (W_q.shape[0] // size, f"{label} ({W_q.shape[0]} rows / {size})")
        kv = _number(module, owner, owner_label, named["n_kv_heads"], _KV_HEADS_ATTRS,
                     "the number of key-value heads", integer=True, low=1)
        W_q, W_k, W_v = _split_heads(W, labels, heads, kv, dims)
    elif heads[0] is not None and W_q.shape[0] != heads[0]:
        raise ValueError(
            f"{labels['q']} has {W_q.shape[0]} heads (shape {W_q.shape}); got "
            f"{heads[1]} = {heads[0]}."
        )
    if scale is not None:
        scale = _scalar(scale, "scale", "the factor of every score", low=0.0, low_open=True)
    else:
        scale, _ = _number(module, owner, owner_label, named["scale"], _SCALE_ATTRS,
                           "the factor of every score", low=0.0, low_open=True)
        if scale is None:
            scale = 1.0 / math.sqrt(W_q.shape[1])
    V, Q = heads_from_projections(W_q, W_k, W_v, W["o"], scale=scale)
    d_out, d = V.shape[1:]
    if readout is None:
        readout = getattr(owner, "readout", None)
        if readout is None and package:
            raise ValueError(
                f"readout must be 'last' or 'all' when the module has no readout attribute; "
                f"got readout=None and a {type(module).__name__} without one."
            )
        readout = "all" if readout is None else readout
    affine = {"bias": None, "skip": None}
    where = {}
    if package:
        for name in affine:
            value = getattr(module, name, None)
            where[name] = f"module.{name}"
            affine[name] = None if value is None else _weight_array(value, where[name])
    elif biases["o"] is not None:
        # The output projection's bias is the layer's constant term: exact, kept.
        affine["bias"], where["bias"] = biases["o"], labels["o"][:-len(".weight")] + ".bias"
    for name, shape in (("bias", (d_out,)), ("skip", (d_out, d))):
        if affine[name] is not None and affine[name].shape != shape:
            raise ValueError(
                f"{where[name]} must have shape {shape} for heads with d_out={d_out} and "
                f"d={d}; got shape {affine[name].shape}."
            )
    return AttentionHeads(V, Q, affine["bias"], affine["skip"], check_readout(readout))
