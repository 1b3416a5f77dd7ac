"""How far a trained linear-attention layer is from the exact least-squares optimum.

See the user guide's :ref:`torch-vs-optimum`.
"""

from dataclasses import dataclass

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._attention import attention_coefficients, decay_blocks, mhla_forward
from ._certificate import IdentifiabilityCertificate
from ._estimators import LinearAttentionRegressor
from ._memory import real_tokens
from ._namespace import on_host
from ._params import check_head_decays
from .preprocessing import AppendConstant
from ._units import (
    NO_EXPONENT,
    column_exponents,
    mean_products,
    pair_log10,
    pair_norm,
    pair_sqrt,
    pair_sum,
    pair_to_float,
    pow2_scale,
    rescale_heads,
)
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

    Returned by :func:`compare_to_optimum`, not constructed directly.  Every
    risk is the weighted mean squared error over the training feature rows
    (:ref:`torch-vs-optimum`).

    Attributes
    ----------
    p_distance : float
        ``||p - p_opt||_F``, the distance of the model's coefficients p(Theta)
        to the optimum's ``coef_`` (with decays, in its block layout).  Zero
        iff the two compute the same function on every input.
    relative_p_distance : float
        ``p_distance / ||p_opt||_F`` (0 when both are zero, inf when only
        ``p_opt`` is).
    training_distance : float
        Root-mean-square difference of the two models' outputs over the
        training rows; with ``alpha=0`` its square is the excess risk.
    risk : float
        Training risk of the given model.
    optimal_risk : float
        Training risk of the optimum.
    excess_risk : float
        ``risk - optimal_risk``, computed without cancellation: ``>= 0`` up to
        rounding with ``alpha=0``, possibly negative with ``alpha > 0``.
    alpha : float
        The ridge penalty the optimum was fitted with.
    certificate : IdentifiabilityCertificate
        The optimum's ``certificate_``: whether the training inputs identify
        the function.
    optimum : LinearAttentionRegressor
        The fitted optimum over any number of heads, with the model's
        distinct decays (in order of first appearance) when it has decays.

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
    """The model under comparison: heads, readout, layout and terms, from any accepted form.

    ``blocks`` are the distinct ``decays`` in order of first appearance (the optimum's feature
    blocks); absent decays, ``intercept`` and ``skip`` are None.
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
            model = on_host(model)  # a fit in another array namespace: its arrays read once
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
        """p(Theta) (with decays, in the optimum's block layout), then the skip and intercept."""
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


def _unrepresentable(lost):
    """The error for the quantities float64 cannot hold: ``(name, pair, "over" | "under")``."""
    why = {
        "over": f"above the largest float64 ({np.finfo(np.float64).max:.3g})",
        "under": (f"below the smallest normal float64 ({np.finfo(np.float64).tiny:.3g}), "
                  "where their digits are lost"),
    }
    groups = []
    for kind in ("over", "under"):
        named = [f"{name} (about 1e{pair_log10(pair):.0f})" for name, pair, k in lost if k == kind]
        if named:
            listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
            groups.append(f"{listed} {'is' if len(named) == 1 else 'are'} {why[kind]}")
    return ValueError(
        "compare_to_optimum: the report cannot be represented in float64: "
        + "; ".join(groups)
        + ". The risks scale as y**2, training_distance as y and p_distance as y / X**3: "
        "rescale y (and the model's value matrices with it) or X by a power of two."
    )


def _standardized_terms(st, d_out, intercept, skip, Xs, lengths, readout):
    """Intercept and skip terms on standardized tokens, outputs in units of ``2**ey``."""
    n, n_tokens, _ = Xs.shape
    out = np.zeros((n, d_out) if readout == "last" else (n, n_tokens, d_out))
    b, M = st.terms_from_user(intercept, skip, d_out)
    with np.errstate(over="ignore", invalid="ignore"):
        if M is not None:
            tokens = Xs[np.arange(n), lengths - 1] if readout == "last" else Xs
            out = out + tokens @ M.T
        if b is not None:
            out = out + b
    return out


def _head_outputs(st, ey, Xs, lengths, readout, V, Q, decays=None):
    """The heads' outputs on standardized tokens as ``(F, top)``: the outputs are ``F 2**top``.

    Head h is weighted by ``2**(c_h - top) <= 1``: heads far below the largest vanish.
    """
    Vs, Qs, c = st.heads_from_user(V, Q, ey)
    live = c != NO_EXPONENT
    top = int(c[live].max()) if live.any() else 0
    Vw, _ = rescale_heads(Vs, Qs, mv=np.where(live, np.minimum(top - c, 4096), 0))
    return mhla_forward(Xs, Vw, Qs, lengths, readout=readout, decays=decays), top


def compare_to_optimum(model, X, y, *, readout=None, sample_weight=None, alpha=0.0,
                       intercept=None, skip_coef=None):
    """Measure a trained linear-attention layer against the exact optimum of its training data.

    Fits :class:`~sklearn_linattn.LinearAttentionRegressor` (the global
    least-squares optimum over any number of heads, with the model's decays,
    intercept and skip terms) on ``(X, y)`` and reports how far ``model`` is
    from it: in coefficients p(Theta), in outputs and in risk on the training
    data, with the optimum's identifiability certificate.  See the user
    guide's :ref:`torch-vs-optimum`.

    Parameters
    ----------
    model : estimator, heads, tuple (V, Q) or tuple (V, Q, decays)
        A fitted estimator with ``value_matrices_`` and ``key_query_matrices_``
        (its readout, layout, ``intercept_``, ``skip_coef_`` and
        ``head_decays_`` are used when present), heads from
        :func:`sklearn_linattn.nn.from_torch`, or arrays ``V`` (n_heads,
        d_out, d), ``Q`` (n_heads, d, d) and optionally ``decays`` (n_heads,)
        in (0, 1], as for :func:`~sklearn_linattn.mhla_forward`.
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        The training sequences; trailing all-NaN tokens are padding.
    y : array-like
        The training targets, shaped as for
        :meth:`LinearAttentionRegressor.fit <sklearn_linattn.LinearAttentionRegressor.fit>`.
    readout : {"last", "all"} or None, default=None
        None takes the estimator's ``readout`` (``"last"`` for arrays); an
        estimator's own readout cannot be overridden.
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence, in the optimum's fit and in
        every risk.
    alpha : float, default=0.0
        Ridge penalty of the optimum; 0 compares with the least-squares
        optimum, the function that training without weight decay targets.
    intercept : array-like of shape (d_out,) or None, default=None
        For a tuple ``model``: a constant added to every output of the model.
    skip_coef : array-like of shape (d_out, d) or None, default=None
        For a tuple ``model``: a linear map of the token at the output's
        position added to the output (a residual path).

    Returns
    -------
    report : OptimalityReport
        The distances, the risks, the certificate and the fitted ``optimum``;
        ``print(report.summary())`` explains them.

    Raises
    ------
    TypeError
        If ``model`` is none of the forms above, or ``intercept`` or
        ``skip_coef`` is given with a model that carries its own.
    ValueError
        If the heads or terms do not match the data, the decays are not one
        number in (0, 1] per head, ``readout`` contradicts the estimator's, the
        data are invalid (as for ``LinearAttentionRegressor.fit``), or a number
        of the report cannot be represented in float64 (the message names it).

    See Also
    --------
    same_function : whether two parameter sets compute the same function.
    IdentifiabilityCertificate.error_bound : how far near-minimizers can
        disagree on new inputs.

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
    constant = getattr(model, "constant", None)
    if constant is not None:
        # Heads of a layer with q, k and v biases act on the tokens [x; constant].
        X = AppendConstant(constant).fit_transform(X)
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
                    + _standardized_terms(st, d_out, terms.get("intercept"), terms.get("skip"),
                                          Xs, lengths, readout))
    Ys = at_rows(st.transform_targets(Y))
    F_heads, top = _head_outputs(st, ey, Xs, lengths, readout, compared.V, compared.Q,
                                 compared.decays)
    F_heads = at_rows(F_heads)
    F_terms = at_rows(_standardized_terms(st, d_out, compared.intercept, compared.skip, Xs,
                                          lengths, readout))
    if not np.all(np.isfinite(F_terms)):
        raise ValueError(
            "The model's intercept and skip terms on X are more than 2**1024 times the "
            "targets: float64 cannot compare them with the optimum's outputs; check the "
            "model's intercept and skip_coef."
        )
    # One exponent per output above every part: each part scaled to at most 2.
    parts = [column_exponents(F_heads) + top, column_exponents(F_terms),
             column_exponents(F_opt), column_exponents(Ys)]
    D = np.max(np.maximum(parts, NO_EXPONENT), axis=0)
    D = np.where(D <= NO_EXPONENT // 2, 0, D)
    F = pow2_scale(F_heads, top - D) + pow2_scale(F_terms, -D)
    Fo, Yd = pow2_scale(F_opt, -D), pow2_scale(Ys, -D)
    delta, model_residual = F - Fo, Yd - F
    residual = Ys - F_opt  # the optimum's own residual, in units of 2**ey

    def mean(A, B, shift):  # (1/W) sum_rows w sum_a A B in the data's units, as a pair
        return mean_products(A, B, rows, total, shift)

    two = 2 * (ey + D)
    squared = mean(delta, delta, two)
    cross = mean(residual, delta, 2 * ey + D)
    risk = mean(model_residual, model_residual, two)
    optimal_risk = mean(residual, residual, 2 * ey)
    excess = pair_sum([squared[0], -2.0 * cross[0]], [squared[1], cross[1]])
    # The size of the terms each value is computed from (see pair_to_float).
    size_y, size_f, size_o = (mean(A, A, two) for A in (Yd, F, Fo))

    def plus(*pairs):
        return pair_sum([p[0] for p in pairs], [p[1] for p in pairs])

    p, p_opt = compared.coefficients(), _optimum_coefficients(optimum, compared)
    distance = pair_norm(p, p_opt)
    norm_opt = pair_norm(p_opt)
    if norm_opt[0] > 0:
        relative = (distance[0] / norm_opt[0], distance[1] - norm_opt[1])
    else:
        relative = (0.0 if distance[0] == 0 else np.inf, 0)
    wanted = {
        "p_distance": (distance, plus(pair_norm(p), norm_opt)),
        "relative_p_distance": (relative, (1.0, 0)),
        "training_distance": (pair_sqrt(squared), pair_sqrt(plus(size_f, size_o))),
        "risk": (risk, plus(size_y, size_f)),
        "optimal_risk": (optimal_risk, plus(size_y, size_o)),
        "excess_risk": (excess, plus(size_y, size_f, size_o)),
    }
    values, lost = {}, []
    for name, (pair, scale) in wanted.items():
        if name == "relative_p_distance" and np.isinf(pair[0]):
            values[name] = np.inf  # p_opt = 0 and p != 0 (documented)
            continue
        values[name], kind = pair_to_float(pair, scale)
        if kind is not None:
            lost.append((name, pair, kind))
    return values, lost
