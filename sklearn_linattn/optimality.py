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

from ._attention import attention_coefficients, mhla_forward
from ._certificate import IdentifiabilityCertificate
from ._estimators import LinearAttentionRegressor
from ._memory import real_tokens
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
        compute the same function on every input.
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
        solution, over any number of heads).

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
    """The model under comparison: heads, optional intercept and skip terms, readout, layout.

    ``intercept`` (d_out,) is added to every output and ``skip`` (d_out, d)
    maps the token at the output's position (the last token for
    ``readout="last"``) into it: the residual path of an attention layer.
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
            intercept = getattr(model, "intercept", None)
            skip_coef = getattr(model, "skip_coef", None)
            self.layout = {"token_dim": None, "data_format": "channels_last"}
            own_readout = getattr(model, "readout", None)
        elif isinstance(model, tuple) and len(model) == 2:
            V, Q = model
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
            # Terms the estimator was fitted with (its intercept_ and skip_coef_
            # are zeros without them, and then not part of its class).
            intercept = (getattr(model, "intercept_", None)
                         if getattr(model, "fit_intercept", True) else None)
            skip_coef = (getattr(model, "skip_coef_", None)
                         if getattr(model, "fit_skip", True) else None)
            self.layout = {"token_dim": getattr(model, "token_dim", None),
                           "data_format": getattr(model, "data_format", "channels_last")}
            own_readout = getattr(model, "readout", None)
        else:
            raise TypeError(
                "model must be a fitted estimator with value_matrices_ and "
                "key_query_matrices_ (e.g. AdamLinearAttentionRegressor after fit) or a "
                "pair (V, Q) of arrays of shape (n_heads, d_out, d) and (n_heads, d, d); "
                f"got {type(model).__name__}."
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
        """The coefficients of the function: p(Theta), then the skip and intercept terms."""
        return _stack_coefficients(attention_coefficients(self.V, self.Q), self.skip,
                                   self.intercept)

    def outputs(self, X, lengths):
        """Outputs on validated sequences, (n, [n_tokens,] d_out), zero at padded positions."""
        Y = mhla_forward(X, self.V, self.Q, lengths, readout=self.readout)
        # The skip term reads the token at the output's position; X is zero at padding.
        tokens = X[np.arange(X.shape[0]), lengths - 1] if self.readout == "last" else X
        if self.skip is not None:
            Y += tokens @ self.skip.T
        if self.intercept is not None:
            Y += self.intercept
        if self.readout == "all":
            Y[~real_tokens(lengths, X.shape[1])] = 0.0
        return Y

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
    its heads enter.

    Parameters
    ----------
    model : estimator, heads or tuple (V, Q)
        The heads of a layer as :func:`sklearn_linattn.nn.from_torch`
        returns them (``value_matrices``, ``key_query_matrices``, and their
        ``intercept``, ``skip_coef`` and ``readout``), a fitted estimator with
        ``value_matrices_`` and
        ``key_query_matrices_`` (e.g.
        :class:`~sklearn_linattn.AdamLinearAttentionRegressor`; its
        ``readout``, ``token_dim``, ``data_format``, ``intercept_`` and
        ``skip_coef_`` are used when it has them), or a pair of arrays ``V``
        of shape (n_heads, d_out, d) and ``Q`` of shape (n_heads, d, d), the
        heads of :func:`~sklearn_linattn.mhla_forward`.  For a layer with
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
        ``(V, Q)`` pair.
    ValueError
        If the heads do not match the data (token dimension, number of
        outputs), if ``readout`` contradicts the estimator's, or for invalid
        data (as :meth:`LinearAttentionRegressor.fit
        <sklearn_linattn.LinearAttentionRegressor.fit>`).

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

    The excess risk is computed as ``mean ||delta||**2 - 2 mean <r_opt,
    delta>`` from the output difference ``delta`` and the optimum's residual
    ``r_opt`` (equal to ``risk - optimal_risk``, without its cancellation).

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

    # The optimum's predictions in the package's layout: check_targets undoes
    # predict's output shaping (dropped output axis, channels_first).
    F_opt, _ = check_targets(optimum.predict(X), lengths, Xv.shape[1],
                             readout=compared.readout, data_format=layout["data_format"],
                             name="the optimum's prediction")
    F = compared.outputs(Xv, lengths)
    if compared.readout == "last":
        rows = np.ones(Xv.shape[0]) if w is None else w
    else:
        real = real_tokens(lengths, Xv.shape[1])
        rows = real * (1.0 if w is None else w[:, None])
    total = rows.sum()

    def mean(values):  # weighted mean over rows of a per-row quantity
        return float(np.sum(rows * values) / total)

    delta, residual = F - F_opt, Y - F_opt
    squared = mean(np.einsum("...a,...a->...", delta, delta))
    optimal_risk = mean(np.einsum("...a,...a->...", residual, residual))
    excess = squared - 2.0 * mean(np.einsum("...a,...a->...", residual, delta))
    model_residual = Y - F
    risk = mean(np.einsum("...a,...a->...", model_residual, model_residual))

    p, p_opt = compared.coefficients(), _optimum_coefficients(optimum, compared)
    distance = float(np.linalg.norm(p - p_opt))
    scale = float(np.linalg.norm(p_opt))
    relative = distance / scale if scale > 0 else (0.0 if distance == 0 else np.inf)
    return OptimalityReport(
        p_distance=distance, relative_p_distance=relative,
        training_distance=float(np.sqrt(squared)), risk=risk, optimal_risk=optimal_risk,
        excess_risk=excess, alpha=float(optimum.alpha), certificate=optimum.certificate_,
        optimum=optimum,
    )
