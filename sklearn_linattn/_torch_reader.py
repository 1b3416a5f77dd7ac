"""Reading PyTorch layers back as heads: ``from_torch``, part of ``sklearn_linattn.nn``."""

import math
from collections import namedtuple
from collections.abc import Mapping

import numpy as np
import torch


from ._validation import check_readout
from ._params import check_head_decays, check_number
from .layouts import check_float64_size, dense_weight, heads_from_projections

__all__ = ["AttentionHeads", "from_torch"]

#: What :func:`from_torch` returns: the heads and the affine terms of a layer
#: as float64 arrays (intercept and skip_coef None when the layer has none),
#: its readout, the heads' fixed decays (None: no decay) and ``constant``: None,
#: or the value of a last token coordinate the heads read as a constant (1.0 for
#: a layer whose q, k or v projection has a bias: heads over ``[x; 1]``).  The
#: last two are None unless given, so that tuples built without them keep working.
AttentionHeads = namedtuple(
    "AttentionHeads",
    ["value_matrices", "key_query_matrices", "intercept", "skip_coef", "readout", "decays",
     "constant"],
    defaults=(None, None),
)

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


def _head_decays(value, n_heads, label):
    """One decay per head as float64 (n_heads,), or None; the message names ``label``."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = _weight_array(value, label)
        value = value.item() if value.ndim == 0 else value
    return check_head_decays(value, n_heads, name=label)


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
            check_float64_size(value.numel(), f"{label} of shape {tuple(value.shape)}")
            value = value.detach().to("cpu", torch.float64).numpy()
    return dense_weight(value, label)


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
    check_float64_size(H * (2 * d_k + d_v) * d, f"the per-head projections of {H} heads")
    group = H // H_kv
    return (W["q"].reshape(H, d_k, d),
            np.repeat(W["k"].reshape(H_kv, d_k, d), group, axis=0),
            np.repeat(W["v"].reshape(H_kv, d_v, d), group, axis=0))


def from_torch(module, *, readout=None, names=None, n_heads=None, scale=None, decays=None):
    """The heads and affine terms of a linear attention layer, as NumPy arrays.

    Reads the weights (not the forward pass) of causal multi-head linear attention,
    ``o_t = W_o concat_h [scale * sum_{s <= t} (q_t . k_s) v_s]``, optionally with
    fixed decays, under the names of the package's layer (``W_q``, ...), of most
    PyTorch code (``q_proj``, ...) or of ``names``.  The heads are exact up to
    rounding, in float64 (:doc:`/torch`).

    Parameters
    ----------
    module : torch.nn.Module or object
        The layer; its tensors may be on any device and of any real dtype.
    readout : {"last", "all"} or None, default=None
        None: the layer's ``readout`` attribute, or ``"all"`` for a layer
        found by its projections that has none.
    names : dict or None, default=None
        Attribute paths (``"attn.wq"``) of the weights under the keys ``"q"``,
        ``"k"``, ``"v"``, ``"o"`` (``"o": None``: no output projection), and
        optionally of the numbers under ``"n_heads"``, ``"n_kv_heads"``, ``"scale"``.
    n_heads : int or None, default=None
        Number of heads, overriding the layer's; needed for fused weights
        when the layer does not carry it.
    scale : float or None, default=None
        Factor of every score, overriding the layer's; None: the layer's
        ``scale`` (or ``scaling``) attribute, else ``1 / sqrt(d_k)``.
    decays : float, array-like of shape (n_heads,) or None, default=None
        Fixed decay of each head, in (0, 1], overriding the layer's.  None:
        the ``decay`` attribute of the package's layout, or no decay.

    Returns
    -------
    heads : AttentionHeads
        A named tuple ``(value_matrices, key_query_matrices, intercept,
        skip_coef, readout, decays, constant)``, float64 arrays of shapes
        (n_heads, d_out, d), (n_heads, d, d), (d_out,), (d_out, d) and
        (n_heads,), None where absent.  When the q, k or v projection has a
        bias, the heads are over ``d + 1`` coordinates, the tokens ``[x; 1]``
        (``constant`` is then 1.0, else None): feed them
        :class:`~sklearn_linattn.preprocessing.AppendConstant`'s output.

    Raises
    ------
    TypeError
        When the weights are not found, or a weight is complex, sparse or quantized.
    ValueError
        When the layer is not plain linear attention (a feature map,
        normalization, gate or undeclared ``decay``), a weight is
        unreadable (not finite, no values, over the memory budget), or sizes disagree.

    See Also
    --------
    sklearn_linattn.heads_from_projections : The same from weight arrays.
    to_torch : A fitted estimator as a layer.

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
    >>> attn = torch.nn.Module()
    >>> attn.wq, attn.wk, attn.wv, attn.wo = (torch.nn.Linear(8, 8, bias=False) for _ in range(4))
    >>> heads = from_torch(attn, n_heads=2, names={"q": "wq", "k": "wk", "v": "wv", "o": "wo"})
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
    if package:
        for role in ("q", "k", "v"):
            value = getattr(owner, f"b_{role}", None)
            biases[role] = None if value is None else _weight_array(value, f"module.b_{role}")
    # Biases on q, k or v: the layer is attention on the tokens [x; 1], each weight with
    # its bias as one more column (zero where a projection has none).
    constant = 1.0 if any(biases[role] is not None for role in ("q", "k", "v")) else None
    if constant is not None:
        for role in ("q", "k", "v"):
            b = np.zeros(W[role].shape[:-1]) if biases[role] is None else biases[role]
            if b.shape != W[role].shape[:-1]:
                raise ValueError(
                    f"the bias of {labels[role]} must have shape {W[role].shape[:-1]}, one "
                    f"per row of the weight; got shape {b.shape}.")
            W[role] = np.concatenate([W[role], b[..., None]], axis=-1)
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
    if decays is not None:
        decays = _head_decays(decays, W_q.shape[0], "decays")
    else:
        own = getattr(owner, "decay", None)
        if own is not None and package:
            decays = _head_decays(own, W_q.shape[0], f"{owner_label}.decay")
        elif own is not None and own is not False:
            raise ValueError(
                f"{owner_label}.decay is {type(own).__name__}: the layer may weight its "
                "scores by decays, which its projections do not carry. Pass decays=... (one "
                "per head in (0, 1], 1.0 for none) to say what they are."
            )
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
        if constant is not None and affine["skip"] is not None:
            # The skip term reads the token, not the constant coordinate.
            affine["skip"] = np.concatenate([affine["skip"], np.zeros((d_out, 1))], axis=1)
    elif biases["o"] is not None:
        # The output projection's bias is the layer's constant term: exact, kept.
        affine["bias"], where["bias"] = biases["o"], labels["o"][:-len(".weight")] + ".bias"
    for name, shape in (("bias", (d_out,)), ("skip", (d_out, d))):
        if affine[name] is not None and affine[name].shape != shape:
            raise ValueError(
                f"{where[name]} must have shape {shape} for heads with d_out={d_out} and "
                f"d={d}; got shape {affine[name].shape}."
            )
    return AttentionHeads(V, Q, affine["bias"], affine["skip"], check_readout(readout),
                          decays, constant)
