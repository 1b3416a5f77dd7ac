"""How far a trained linear-attention layer is from the exact least-squares optimum.

A model trained by gradient descent (here, in PyTorch or anywhere else) is
judged against the closed-form optimum on the same training data: the
distance of the two coefficient vectors p(Theta) (two MHLAs compute the same
function iff their coefficients are equal, the paper's Corollary A.4), the
distance of their outputs on the training data, the excess training risk,
and the identifiability certificate, which says whether the data pins the
function down so that driving the excess risk to zero must drive the model
to the optimum.
"""

from dataclasses import dataclass

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._attention import attention_coefficients, decay_blocks, mhla_forward
from ._certificate import IdentifiabilityCertificate
from ._estimators import LinearAttentionRegressor
from ._memory import real_tokens
from ._params import check_head_decays
from ._standardize import NO_EXPONENT, max_exponent
from ._validation import (
    as_real_array,
    check_heads,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_targets,
)

__all__ = ["OptimalityReport", "compare_to_optimum"]


@dataclass(frozen=True, eq=False, repr=False)
class OptimalityReport:  # numpydoc ignore=PR01
    """A trained model measured against the least-squares optimum of its training data.

    Returned by :func:`compare_to_optimum`, not constructed directly.  All
    risks are those of the certificate: ``R = (1/W) sum_rows w_row
    ||y_row - f(row)||**2``, the squared error summed over outputs and
    averaged over the training feature rows (one per sequence for
    ``readout="last"``, one per real position for ``readout="all"``), each
    row weighted by its sequence's weight (W the sum of the row weights).

    Attributes
    ----------
    p_distance : float
        ``||p - p_opt||_F``: Frobenius distance of the model's coefficients
        p(Theta) (:func:`~sklearn_linattn.attention_coefficients`) to the
        optimum's ``coef_``, in the units of the data.  Zero iff the two
        compute the same function on every input.  For a model with decays,
        in the optimum's block layout: one block of coefficients per
        distinct decay of the model's heads
        (``attention_coefficients(V, Q, decays=..., blocks=optimum.decay)``).
    relative_p_distance : float
        ``p_distance / ||p_opt||_F`` (0 when both are zero, inf when only
        ``p_opt`` is).
    training_distance : float
        ``sqrt((1/W) sum_rows w_row ||f(row) - f_opt(row)||**2)``: the
        root-mean-square difference of the two models' outputs over the
        training rows, i.e. ``||p - p_opt||`` in the data's metric
        ``Lambda_D``.  With ``alpha=0`` its square is the excess risk.
    risk : float
        Training risk R of the given model.
    optimal_risk : float
        Training risk R of the optimum.
    excess_risk : float
        ``risk - optimal_risk``, computed from the difference of the two
        models' outputs (accurate even when both risks are large and the
        models close).  With ``alpha=0`` it is ``>= 0`` up to rounding; with
        ``alpha > 0`` the optimum minimises the penalized risk, so a model
        may beat it on the training risk alone (negative excess).
    alpha : float
        The ridge penalty the optimum was fitted with.
    certificate : IdentifiabilityCertificate
        The optimum's ``certificate_``: whether the training inputs identify
        the function.
    optimum : LinearAttentionRegressor
        The fitted optimum (``n_heads=None``: the exact least-squares
        solution, over any number of heads).  For a model with decays it
        is fitted with ``decay`` the distinct decays of the model's heads,
        in order of first appearance: the optimum over every model with
        heads of those decays.

    See Also
    --------
    compare_to_optimum : builds the report.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import compare_to_optimum
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> X, y, teacher = make_random_mhla(200, 5, 2, return_params=True, random_state=0)
    >>> report = compare_to_optimum((teacher["V"], teacher["Q"]), X, y)  # the teacher itself
    >>> bool(report.certificate), report.p_distance < 1e-10, report.excess_risk < 1e-20
    (True, True, True)
    """

    p_distance: float
    relative_p_distance: float
    training_distance: float
    risk: float
    optimal_risk: float
    excess_risk: float
    alpha: float
    certificate: IdentifiabilityCertificate
    optimum: LinearAttentionRegressor

    @property
    def identifiable(self):
        """Whether the certificate holds: every empirical risk minimizer is the same function.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import compare_to_optimum
        >>> from sklearn_linattn.datasets import make_random_mhla
        >>> X, y, teacher = make_random_mhla(3, 5, 2, return_params=True, random_state=0)
        >>> compare_to_optimum((teacher["V"], teacher["Q"]), X, y).identifiable  # 3 rows < psi = 6
        False
        """
        return bool(self.certificate)

    @property
    def verdict(self):
        """What the numbers mean, in plain words.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import compare_to_optimum
        >>> from sklearn_linattn.datasets import make_random_mhla
        >>> X, y, teacher = make_random_mhla(200, 5, 2, return_params=True, random_state=0)
        >>> print(compare_to_optimum((teacher["V"], teacher["Q"]), X, y).verdict)  # doctest: +ELLIPSIS
        The training inputs identify the function (the certificate holds): ...
        """
        cert = self.certificate
        ridge = self.alpha > 0
        if cert:
            if ridge:
                return (
                    "The training inputs identify the function (the certificate holds), and "
                    f"with alpha = {self.alpha:g} the optimum is the unique minimizer of the "
                    "penalized risk; the excess risk above is that of the unpenalized risk, "
                    "which this optimum need not minimise. Compare with alpha=0 to ask "
                    "whether training converged to the least-squares function."
                )
            return (
                "The training inputs identify the function (the certificate holds): every "
                "empirical risk minimizer computes the same function, p_opt. The excess risk "
                "is the squared distance to it in the data's metric, and the metric is "
                f"positive definite (lambda_min = {cert.min_eigenvalue:.3g} in standardized "
                "coordinates), so a model whose excess risk goes to zero, e.g. SGD run to "
                "convergence, must converge to p_opt in p-space."
            )
        k = cert.n_features - cert.rank
        return (
            f"The training inputs do not identify the function: {k} of the "
            f"{cert.n_features} coefficient directions are not determined by them (rank "
            f"{cert.rank}). The minimizers form an affine set and p_opt is only its point of "
            "minimum norm (in standardized coordinates), so a model can reach zero excess "
            "risk at a positive p_distance: it is then another minimizer, equal to the "
            "optimum on every input certificate.covers(X_new) accepts and free to differ "
            "elsewhere (certificate.witness() builds two such models). Where training "
            "converges among the minimizers depends on the initialization and the "
            "optimizer, not on the data."
        )

    def summary(self):
        """A readable multi-line report: the distances, the risks and the verdict.

        Returns
        -------
        text : str
            The numbers of the report with what they mean; ``print`` it.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import compare_to_optimum
        >>> from sklearn_linattn.datasets import make_random_mhla
        >>> X, y, teacher = make_random_mhla(200, 5, 2, return_params=True, random_state=0)
        >>> print(compare_to_optimum((teacher["V"], 1.1 * teacher["Q"]), X, y).summary())  # doctest: +ELLIPSIS
        Comparison with the least-squares optimum
          p_distance           ...  ||p - p_opt||_F (relative 0.1)
        ...
        """
        cert = self.certificate
        rel = self.relative_p_distance
        lines = [
            "Comparison with the least-squares optimum",
            f"  p_distance           {self.p_distance:<10.4g}  ||p - p_opt||_F (relative "
            f"{rel:.3g})",
            f"  training_distance    {self.training_distance:<10.4g}  RMS of f - f_opt on the "
            "training rows",
            f"  risk                 {self.risk:<10.4g}  training risk of the model",
            f"  optimal_risk         {self.optimal_risk:<10.4g}  training risk of the optimum"
            + (f" (alpha = {self.alpha:g})" if self.alpha > 0 else ""),
            f"  excess_risk          {self.excess_risk:<10.4g}",
            f"  certificate          {'IDENTIFIABLE' if cert else 'NOT IDENTIFIABLE'}, rank "
            f"{cert.rank} of psi = {cert.n_features}, lambda_min {cert.min_eigenvalue:.3g}",
            f"  data                 {cert.n_samples} sequences, N = {cert.n_rows} feature "
            f"rows (readout={cert.readout!r})",
        ]
        words = self.verdict.split()
        line = " "
        for word in words:  # wrap the verdict at 88 columns
            if len(line) + len(word) + 1 > 88:
                lines.append(line)
                line = " "
            line += " " + word
        lines.append(line)
        return "\n".join(line.rstrip() for line in lines)

    def __repr__(self):
        return (
            f"OptimalityReport(p_distance={self.p_distance:.3g}, "
            f"relative_p_distance={self.relative_p_distance:.3g}, "
            f"training_distance={self.training_distance:.3g}, risk={self.risk:.3g}, "
            f"optimal_risk={self.optimal_risk:.3g}, excess_risk={self.excess_risk:.3g}, "
            f"identifiable={self.identifiable})"
        )


class _ComparedModel:
    """The model under comparison: heads, decays, intercept and skip terms, readout, layout.

    ``intercept`` (d_out,) is added to every output and ``skip`` (d_out, d)
    maps the token at the output's position (the last token for
    ``readout="last"``) into it: the residual path of an attention layer.
    ``decays`` (n_heads,) are the heads' fixed decays (None: no decay) and
    ``blocks`` their distinct values in order of first appearance, the
    optimum's feature blocks.
    """

    def __init__(self, model, readout, intercept, skip_coef):
        if hasattr(model, "value_matrices") and hasattr(model, "key_query_matrices"):
            # Heads converted from a layer (sklearn_linattn.nn.from_torch): they
            # carry their own terms and readout.
            if intercept is not None or skip_coef is not None:
                raise TypeError(
                    "intercept and skip_coef describe a model given as a (V, Q) pair; "
                    f"{type(model).__name__} carries its own, so pass None."
                )
            V, Q = model.value_matrices, model.key_query_matrices
            decays = getattr(model, "decays", None)
            decays_name = f"{type(model).__name__}.decays"
            intercept = getattr(model, "intercept", None)
            skip_coef = getattr(model, "skip_coef", None)
            self.layout = {"token_dim": None, "data_format": "channels_last"}
            own_readout = getattr(model, "readout", None)
        elif isinstance(model, tuple) and len(model) in (2, 3):
            V, Q, decays = model if len(model) == 3 else (*model, None)
            decays_name = "model[2] (the heads' decays)"
            self.layout = {"token_dim": None, "data_format": "channels_last"}
            own_readout = None
        elif hasattr(model, "fit") or hasattr(model, "value_matrices_"):
            check_is_fitted(model, ["value_matrices_", "key_query_matrices_"])
            if intercept is not None or skip_coef is not None:
                raise TypeError(
                    "intercept and skip_coef describe a model given as a (V, Q) pair; a "
                    "fitted estimator's own intercept_ and skip_coef_ are read from it, "
                    f"so pass None with {type(model).__name__}."
                )
            V, Q = model.value_matrices_, model.key_query_matrices_
            decays, decays_name = getattr(model, "head_decays_", None), "head_decays_"
            # Terms the estimator was fitted with (its intercept_ and skip_coef_
            # are zeros without them, and then not part of its class); a search
            # that chose them ("auto") says which in fit_intercept_ / fit_skip_.
            with_intercept = getattr(model, "fit_intercept_", getattr(model, "fit_intercept", True))
            with_skip = getattr(model, "fit_skip_", getattr(model, "fit_skip", True))
            intercept = getattr(model, "intercept_", None) if with_intercept else None
            skip_coef = getattr(model, "skip_coef_", None) if with_skip else None
            self.layout = {"token_dim": getattr(model, "token_dim", None),
                           "data_format": getattr(model, "data_format", "channels_last")}
            own_readout = getattr(model, "readout", None)
        else:
            raise TypeError(
                "model must be a fitted estimator with value_matrices_ and "
                "key_query_matrices_ (e.g. AdamLinearAttentionRegressor after fit), a "
                "pair (V, Q) of arrays of shape (n_heads, d_out, d) and (n_heads, d, d) or "
                "a triple (V, Q, decays) with the heads' decays of shape (n_heads,); got "
                f"{type(model).__name__}"
                + (f" of length {len(model)}." if isinstance(model, tuple) else ".")
            )
        if readout is None:
            readout = "last" if own_readout is None else own_readout
        check_readout(readout)
        if own_readout is not None and readout != own_readout:
            raise ValueError(
                f"readout must be the model's own, {own_readout!r} (or None); got "
                f"readout={readout!r}."
            )
        self.readout = readout
        self.V, self.Q = check_heads(V, Q)
        self.decays = check_head_decays(decays, self.V.shape[0], name=decays_name)
        self.blocks = None if self.decays is None else decay_blocks(self.decays)
        if self.blocks == ():
            raise ValueError(
                f"{decays_name} is empty: a model with decays needs at least one head "
                "(its decays give the optimum's feature blocks).")
        d_out, d = self.V.shape[1:]
        self.intercept = self._term(intercept, "intercept", (d_out,),
                                    "one value per output of the heads")
        self.skip = self._term(skip_coef, "skip_coef", (d_out, d),
                               "(d_out, d) like the heads' value matrices")

    @staticmethod
    def _term(value, name, shape, what):
        if value is None:
            return None
        value = as_real_array(value, name, finite=True)
        if value.shape != shape:
            raise ValueError(
                f"{name} must have shape {shape}, {what}; got shape {value.shape}."
            )
        return value

    def coefficients(self):
        """The coefficients of the function: p(Theta), then the skip and intercept terms.

        With decays, p(Theta) in the block layout of ``blocks``, the optimum's ``coef_``.
        """
        coef = attention_coefficients(self.V, self.Q, decays=self.decays, blocks=self.blocks)
        return _stack_coefficients(coef, self.skip, self.intercept)

    def optimum_params(self):
        """Parameters of a LinearAttentionRegressor fitted with the model's extra terms."""
        wanted = {"fit_intercept": self.intercept is not None,
                  "fit_skip": self.skip is not None}
        available = LinearAttentionRegressor().get_params()
        missing = [name for name, on in wanted.items() if on and name not in available]
        if missing:
            raise ValueError(
                f"the model has {' and '.join(n[4:] for n in missing)} terms, but this "
                f"version of LinearAttentionRegressor has no {' or '.join(missing)} "
                "parameter to fit an optimum with them; compare the attention heads alone "
                "(intercept=None, skip_coef=None)."
            )
        params = {name: on for name, on in wanted.items() if name in available}
        if self.blocks is not None:
            params["decay"] = self.blocks
        return {"readout": self.readout, **self.layout, **params}


def _stack_coefficients(coef, skip, intercept):
    """One (d_out, m) array of every coefficient of the function (absent terms omitted)."""
    parts = [coef] + [np.reshape(t, (coef.shape[0], -1)) for t in (skip, intercept)
                      if t is not None]
    return np.concatenate(parts, axis=1)


def _optimum_coefficients(optimum, compared):
    """The optimum's coefficients in the layout of ``compared.coefficients()``."""
    skip = getattr(optimum, "skip_coef_", None) if compared.skip is not None else None
    intercept = getattr(optimum, "intercept_", None) if compared.intercept is not None else None
    return _stack_coefficients(optimum.coef_, skip, intercept)


# Binary exponents of the smallest normal float64 and of the first power of
# two that overflows: a reported value keeps its digits between them.
_TINY_EXPONENT = -1022
_HUGE_EXPONENT = 1024


def _pow2_sum(values, exponents):
    """``sum_i values[i] * 2**exponents[i]`` as a pair ``(m, e)``: the sum is ``m * 2**e``.

    Every term is brought to the exponent of the largest, so nothing over-
    or underflows on the way (a term 2**1074 below the largest vanishes, far
    below the sum's rounding).
    """
    mantissa, exp = np.frexp(np.asarray(values, dtype=np.float64))
    exp = exp.astype(np.int64) + np.asarray(exponents, dtype=np.int64)
    live = mantissa != 0
    if not live.any():
        return 0.0, 0
    top = int(exp[live].max())
    return float(np.sum(np.ldexp(mantissa[live], exp[live] - top))), top


def _pow2_sqrt(pair):
    """The square root of the pair ``m * 2**e`` (m >= 0), exactly scaled."""
    m, e = pair
    if e % 2:
        m, e = 2.0 * m, e - 1
    return float(np.sqrt(m)), e // 2


def _column_exponents(A):
    """Per output (last axis), the exponent of the largest magnitude; ``NO_EXPONENT`` if zero."""
    A = A.reshape(-1, A.shape[-1])
    top = np.max(np.abs(A), axis=0, initial=0.0)
    return np.where(top > 0, np.frexp(top)[1], NO_EXPONENT).astype(np.int64)


def _mean_products(A, B, rows, total, exponents):
    """``(1/W) sum_rows w_row sum_a A[row, a] B[row, a] 2**exponents[a]`` as a pair.

    A and B are scaled per output by the power of two of their largest entry
    first, so no product over- or underflows on the way.
    """
    d_out = A.shape[-1]
    A, B, w = A.reshape(-1, d_out), B.reshape(-1, d_out), rows.reshape(-1)
    ka, kb = _column_exponents(A), _column_exponents(B)
    ka, kb = np.where(ka == NO_EXPONENT, 0, ka), np.where(kb == NO_EXPONENT, 0, kb)
    m = np.einsum("r,ra,ra->a", w, np.ldexp(A, -ka), np.ldexp(B, -kb)) / total
    return _pow2_sum(m, ka + kb + exponents)


def _norm(A):
    """Frobenius norm of A as a pair (scaled first: no over- or underflow)."""
    k = int(np.frexp(np.max(np.abs(A), initial=0.0))[1])
    return float(np.linalg.norm(np.ldexp(A, -k))), k


def _log10(pair):
    m, e = pair
    return float(np.log10(abs(m)) + e * np.log10(2.0))


def _to_float(pair, scale):
    """The float64 of the pair ``m * 2**e``, or why float64 cannot hold it.

    ``scale`` (a pair) is the size of the terms the value is computed from.
    A value that overflows is lost; so is a non-zero value whose terms lie
    below the smallest normal float64, where their digits are lost.  A value
    that is smaller only because it cancels among larger terms is returned as
    float64 rounds it (a subnormal or zero: within its own rounding).
    Returns ``(value, None)``, or ``(None, "over")`` / ``(None, "under")``.
    """
    m, e = pair
    if m != 0 and int(np.frexp(m)[1]) + e > _HUGE_EXPONENT:
        return None, "over"
    sm, se = scale
    if m != 0 and (sm == 0 or int(np.frexp(sm)[1]) + se - 1 < _TINY_EXPONENT):
        return None, "under"
    return float(np.ldexp(m, e)), None


def _unrepresentable(lost):
    """The error for the quantities float64 cannot hold: ``(name, pair, "over" | "under")``."""
    why = {
        "over": f"above the largest float64 ({np.finfo(np.float64).max:.3g})",
        "under": (f"below the smallest normal float64 ({np.finfo(np.float64).tiny:.3g}), "
                  "where their digits are lost"),
    }
    groups = []
    for kind in ("over", "under"):
        named = [f"{name} (about 1e{_log10(pair):.0f})" for name, pair, k in lost if k == kind]
        if named:
            listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
            groups.append(f"{listed} {'is' if len(named) == 1 else 'are'} {why[kind]}")
    return ValueError(
        "compare_to_optimum: the report cannot be represented in float64: "
        + "; ".join(groups)
        + ". The risks scale as y**2, training_distance as y and p_distance as y / X**3: "
        "rescale y (and the model's value matrices with it) or X by a power of two."
    )


def _standardized_terms(st, ey, intercept, skip, Xs, lengths, readout):
    """Intercept and skip terms on standardized tokens, outputs in units of ``2**ey``."""
    n, n_tokens, _ = Xs.shape
    out = np.zeros((n, ey.size) if readout == "last" else (n, n_tokens, ey.size))
    with np.errstate(over="ignore", invalid="ignore"):
        if skip is not None:
            # x W^T in the data's units is x_s (Wi 2**e W^T): per output 2**-ey_a.
            W = np.ldexp(skip, st.exponents[None, :] - ey[:, None])
            if st.whitening is not None:
                W = W @ st.inverse_whitening.T
            tokens = Xs[np.arange(n), lengths - 1] if readout == "last" else Xs
            out = out + tokens @ W.T
        if intercept is not None:
            out = out + np.ldexp(intercept, -ey)
    return out


def _head_outputs(st, ey, Xs, lengths, readout, V, Q, decays=None):
    """The heads' outputs on standardized tokens as ``(F, top)``: the outputs are ``F 2**top``.

    One forward pass over every head, head h weighted by ``2**(c_h - top)``
    (at most 1; heads 2**1074 below the largest vanish, far below rounding).
    """
    Vs, Qs, c = st.heads_from_user(V, Q, ey)
    top = int(c.max()) if c.size and c.max() != NO_EXPONENT else 0
    Vw = np.ldexp(Vs, np.maximum(c - top, -2 * _HUGE_EXPONENT)[:, None, None])
    return mhla_forward(Xs, Vw, Qs, lengths, readout=readout, decays=decays), top


def compare_to_optimum(model, X, y, *, readout=None, sample_weight=None, alpha=0.0,
                       intercept=None, skip_coef=None):
    """Measure a trained linear-attention layer against the exact optimum of its training data.

    Fits :class:`~sklearn_linattn.LinearAttentionRegressor` (the global
    least-squares optimum over any number of heads) on ``(X, y)`` and
    reports how far ``model`` is from it: in coefficient space (two MHLAs
    compute the same function iff their coefficients p(Theta) are equal,
    the paper's Corollary A.4), in outputs on the training data, and in
    training risk, with the optimum's identifiability certificate (does the
    data pin the function down, so that training run to zero excess risk
    must reach the optimum?).  The model may come from any framework: only
    its heads (with their decays) and its affine terms enter.

    Parameters
    ----------
    model : estimator, heads, tuple (V, Q) or tuple (V, Q, decays)
        The heads of a layer as :func:`sklearn_linattn.nn.from_torch`
        returns them (``value_matrices``, ``key_query_matrices``, and their
        ``intercept``, ``skip_coef``, ``readout`` and ``decays``), a fitted
        estimator with ``value_matrices_`` and ``key_query_matrices_`` (e.g.
        :class:`~sklearn_linattn.AdamLinearAttentionRegressor`; its
        ``readout``, ``token_dim``, ``data_format``, ``intercept_``,
        ``skip_coef_`` and ``head_decays_`` are used when it has them), or
        a pair of arrays ``V`` of shape (n_heads, d_out, d) and ``Q`` of
        shape (n_heads, d, d), the heads of
        :func:`~sklearn_linattn.mhla_forward`, or a triple ``(V, Q,
        decays)`` with the fixed decay of each head, shape (n_heads,), each
        in (0, 1] (as ``decays`` of :func:`~sklearn_linattn.mhla_forward`;
        None is no decay).  For a layer with
        keys ``W_K x_t``, queries ``W_Q x_n``, values ``W_V x_t`` and output
        projection ``W_O`` per head (e.g. in PyTorch), ``Q_h = W_K^T W_Q``
        and ``V_h = W_O W_V``.
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        The training sequences; trailing all-NaN tokens are padding.
    y : array-like
        The training targets, shaped as for
        :meth:`LinearAttentionRegressor.fit <sklearn_linattn.LinearAttentionRegressor.fit>`.
    readout : {"last", "all"} or None, default=None
        None takes the estimator's ``readout`` (``"last"`` for a pair);
        an estimator's own readout cannot be overridden.
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence, in the optimum's fit and in
        every risk.
    alpha : float, default=0.0
        Ridge penalty of the optimum.  0 compares with the least-squares
        optimum, the function that training without weight decay targets.
    intercept : array-like of shape (d_out,) or None, default=None
        For a ``(V, Q)`` pair: a constant added to every output of the model.
    skip_coef : array-like of shape (d_out, d) or None, default=None
        For a ``(V, Q)`` pair: a linear map of the token at the output's
        position added to the output (a residual path).  The optimum is
        then fitted with the same terms, which needs a
        LinearAttentionRegressor with ``fit_intercept`` / ``fit_skip``
        parameters; without them a ValueError says so.

    Returns
    -------
    report : OptimalityReport
        ``p_distance``, ``relative_p_distance``, ``training_distance``,
        ``risk``, ``optimal_risk``, ``excess_risk``, the ``certificate`` and
        the fitted ``optimum``; ``print(report.summary())`` explains them.

    Raises
    ------
    TypeError
        If ``model`` is neither a fitted estimator with heads nor a
        ``(V, Q)`` pair or ``(V, Q, decays)`` triple.
    ValueError
        If the heads do not match the data (token dimension, number of
        outputs), if the decays are not one number in (0, 1] per head, if
        ``readout`` contradicts the estimator's, or for invalid
        data (as :meth:`LinearAttentionRegressor.fit
        <sklearn_linattn.LinearAttentionRegressor.fit>`); and when a number
        of the report cannot be represented in float64 (the message names
        each, with its size): above the largest float64, or non-zero while
        the terms it is computed from lie below the smallest normal one.
        With ``alpha=0`` the excess risk is the square of
        ``training_distance``, so a distance beyond about 1e154 (or below
        about 1e-154) cannot come with its risks.

    See Also
    --------
    same_function : whether two parameter sets compute the same function.
    IdentifiabilityCertificate.error_bound : how far near-minimizers can
        disagree on new inputs.

    Notes
    -----
    The training risk is quadratic in the coefficients, so with
    ``alpha=0`` the excess risk of any model is exactly
    ``(p - p_opt)^T Lambda_D (p - p_opt)`` (summed over outputs), the square
    of ``training_distance``.  When the certificate holds, ``Lambda_D`` is
    positive definite: excess risk zero forces ``p = p_opt``, so gradient
    training that drives its excess risk to zero converges to the optimum's
    function whatever its parametrization (number of heads, factorization of
    ``Q_h`` into keys and queries).  The model's outputs on a new input
    ``Z`` then differ from the optimum's by at most
    ``certificate.error_bound(Z, excess_risk) / 2``.

    A model with fixed decays (``decays`` of the heads, ``head_decays_``
    of an estimator, or the third entry of the triple) is compared with the
    optimum over models with heads of the same decays:
    ``LinearAttentionRegressor(decay=blocks)`` with ``blocks`` the distinct
    decays in order of first appearance, whose features are one block per
    decay.  Two such models compute the same function iff their
    coefficients agree block by block (distinct decays give linearly
    independent functions of the input, see
    :func:`~sklearn_linattn.same_function`), so everything above holds
    block by block: ``p_distance`` compares
    ``attention_coefficients(V, Q, decays=decays, blocks=blocks)`` with the
    optimum's ``coef_``, and the certificate is that of the decayed
    features.

    The excess risk is computed as ``mean ||delta||**2 - 2 mean <r_opt,
    delta>`` from the output difference ``delta`` and the optimum's residual
    ``r_opt`` (equal to ``risk - optimal_risk``, without its cancellation).

    Every number is exact to rounding at any scale float64 can represent:
    the outputs are compared in the optimum's standardized coordinates
    (``optimum.standardization_``: tokens scaled per coordinate by powers of
    two and whitened, targets per output by a power of two), the sums of
    squares are carried as a mantissa and a binary exponent, and the results
    are mapped back to the data's units by exact powers of two.  Scaling X
    and y by powers of two (and the model with them) scales every number by
    the matching power, bit for bit.

    Examples
    --------
    A model trained briefly by Adam, against the optimum of its data:

    >>> import numpy as np
    >>> from sklearn_linattn import AdamLinearAttentionRegressor, compare_to_optimum
    >>> from sklearn_linattn.datasets import make_random_mhla
    >>> X, y = make_random_mhla(300, 6, 2, random_state=0)
    >>> adam = AdamLinearAttentionRegressor(max_epochs=5, random_state=0).fit(X, y)
    >>> report = compare_to_optimum(adam, X, y)
    >>> bool(report.certificate), report.excess_risk > 0, report.p_distance > 0
    (True, True, True)
    >>> bool(np.isclose(report.excess_risk, report.risk - report.optimal_risk))
    True

    Any parametrization of the same function is at distance zero:

    >>> V, Q = report.optimum.value_matrices_, report.optimum.key_query_matrices_
    >>> halves = (np.concatenate([V, V]), np.concatenate([Q, Q]) / 2)  # each head split in two
    >>> bool(compare_to_optimum(halves, X, y).relative_p_distance < 1e-10)
    True

    Heads with fixed decays, as a triple ``(V, Q, decays)``: the optimum has
    one block of features per decay.

    >>> from sklearn_linattn import mhla_forward
    >>> rng = np.random.default_rng(0)
    >>> V, Q = rng.normal(size=(3, 1, 2)), rng.normal(size=(3, 2, 2))
    >>> decays = np.array([0.9, 0.5, 0.9])
    >>> X = rng.normal(size=(200, 6, 2))
    >>> y = mhla_forward(X, V, Q, decays=decays)
    >>> report = compare_to_optimum((V, Q, decays), X, y)
    >>> report.optimum.decay, report.relative_p_distance < 1e-10
    ((0.9, 0.5), True)
    >>> bool(compare_to_optimum((V, Q, [0.9, 0.5, 0.5]), X, y).excess_risk > 0)
    True
    """
    compared = _ComparedModel(model, readout, intercept, skip_coef)
    layout = compared.layout
    Xv, lengths = check_sequences(X, n_features_in=compared.V.shape[2],
                                  expected_by="the model's heads act on tokens of that "
                                  "dimension", **layout)
    Y, _ = check_targets(y, lengths, Xv.shape[1], readout=compared.readout,
                         data_format=layout["data_format"])
    d_out = compared.V.shape[1]
    if Y.shape[-1] != d_out:
        raise ValueError(
            f"y has {Y.shape[-1]} output(s) per position, but the model's heads have "
            f"d_out = {d_out} (V of shape {compared.V.shape})."
        )
    w = check_sample_weight(sample_weight, Xv.shape[0])
    optimum = LinearAttentionRegressor(alpha=alpha, **compared.optimum_params())
    optimum.fit(X, y, sample_weight=sample_weight)
    values, lost = _measures(compared, optimum, Xv, lengths, Y, w)
    if lost:
        raise _unrepresentable(lost)
    return OptimalityReport(**values, alpha=float(optimum.alpha),
                            certificate=optimum.certificate_, optimum=optimum)


def _measures(compared, optimum, Xv, lengths, Y, w):
    """The report's numbers, computed in the optimum's standardized coordinates.

    Outputs are compared on standardized tokens, output a in units of
    ``2**(ey_a + D_a)`` with ``D_a`` the largest exponent among the outputs
    of the model, of the optimum and the targets (so each lies within
    [-2, 2], and none over- or underflows); sums of squares are formed per
    output after scaling by powers of two and carried as pairs ``m * 2**e``,
    and only the final values are converted to float64 in the data's units.

    Returns ``(values, lost)``: the OptimalityReport fields, and
    ``(name, pair, "over" | "under")`` for each that float64 cannot hold.
    """
    st = optimum.standardization_
    readout = compared.readout
    d_out = compared.V.shape[1]
    ey = (np.zeros(d_out, dtype=np.int64) if st.y_exponents is None
          else st.y_exponents[:d_out].astype(np.int64))
    Xs = st.transform(Xv)
    if readout == "last":
        rows = np.ones(Xv.shape[0]) if w is None else st.transform_weights(w)
        real = None
    else:
        real = real_tokens(lengths, Xv.shape[1])
        rows = real * (1.0 if w is None else st.transform_weights(w)[:, None])
    total = float(rows.sum())

    def at_rows(F):  # zero at padded positions (mhla_forward leaves NaN there)
        return F if real is None else np.where(real[:, :, None], F, 0.0)

    terms = {}
    if compared.intercept is not None:
        terms["intercept"] = getattr(optimum, "intercept_", None)
    if compared.skip is not None:
        terms["skip"] = getattr(optimum, "skip_coef_", None)
    Vo, Qo = optimum._standardized_heads
    F_opt = at_rows(mhla_forward(Xs, Vo, Qo, lengths, readout=readout,
                                 decays=optimum.head_decays_)
                    + _standardized_terms(st, ey, terms.get("intercept"), terms.get("skip"),
                                          Xs, lengths, readout))
    Ys = at_rows(st.transform_targets(Y))
    F_heads, top = _head_outputs(st, ey, Xs, lengths, readout, compared.V, compared.Q,
                                 compared.decays)
    F_heads = at_rows(F_heads)
    F_terms = at_rows(_standardized_terms(st, ey, compared.intercept, compared.skip, Xs,
                                          lengths, readout))
    if not np.all(np.isfinite(F_terms)):
        raise ValueError(
            "The model's intercept and skip terms on X are more than 2**1024 times the "
            "targets: float64 cannot compare them with the optimum's outputs; check the "
            "model's intercept and skip_coef."
        )
    # One exponent per output above every part: each part scaled to at most 2.
    parts = [_column_exponents(F_heads) + top, _column_exponents(F_terms),
             _column_exponents(F_opt), _column_exponents(Ys)]
    D = np.max(np.maximum(parts, NO_EXPONENT), axis=0)
    D = np.where(D <= NO_EXPONENT // 2, 0, D)
    F = np.ldexp(F_heads, top - D) + np.ldexp(F_terms, -D)
    Fo, Yd = np.ldexp(F_opt, -D), np.ldexp(Ys, -D)
    delta, model_residual = F - Fo, Yd - F
    residual = Ys - F_opt  # the optimum's own residual, in units of 2**ey

    def mean(A, B, shift):  # (1/W) sum_rows w sum_a A B in the data's units, as a pair
        return _mean_products(A, B, rows, total, shift)

    two = 2 * (ey + D)
    squared = mean(delta, delta, two)
    cross = mean(residual, delta, 2 * ey + D)
    risk = mean(model_residual, model_residual, two)
    optimal_risk = mean(residual, residual, 2 * ey)
    excess = _pow2_sum([squared[0], -2.0 * cross[0]], [squared[1], cross[1]])
    # The size of the terms each value is computed from (see _to_float).
    size_y, size_f, size_o = (mean(A, A, two) for A in (Yd, F, Fo))

    def plus(*pairs):
        return _pow2_sum([p[0] for p in pairs], [p[1] for p in pairs])

    p, p_opt = compared.coefficients(), _optimum_coefficients(optimum, compared)
    k = int(max_exponent(np.concatenate([p.ravel(), p_opt.ravel()])))
    distance = (float(np.linalg.norm(np.ldexp(p, -k) - np.ldexp(p_opt, -k))), k)
    norm_opt = _norm(p_opt)
    if norm_opt[0] > 0:
        relative = (distance[0] / norm_opt[0], distance[1] - norm_opt[1])
    else:
        relative = (0.0 if distance[0] == 0 else np.inf, 0)
    wanted = {
        "p_distance": (distance, plus(_norm(p), norm_opt)),
        "relative_p_distance": (relative, (1.0, 0)),
        "training_distance": (_pow2_sqrt(squared), _pow2_sqrt(plus(size_f, size_o))),
        "risk": (risk, plus(size_y, size_f)),
        "optimal_risk": (optimal_risk, plus(size_y, size_o)),
        "excess_risk": (excess, plus(size_y, size_f, size_o)),
    }
    values, lost = {}, []
    for name, (pair, scale) in wanted.items():
        if name == "relative_p_distance" and np.isinf(pair[0]):
            values[name] = np.inf  # p_opt = 0 and p != 0 (documented)
            continue
        values[name], kind = _to_float(pair, scale)
        if kind is not None:
            lost.append((name, pair, kind))
    return values, lost
