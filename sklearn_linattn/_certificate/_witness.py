"""Two models that a failed certificate cannot tell apart, and how they are built."""

from dataclasses import dataclass

import numpy as np

from .._features import attention_features
from .._heads import block_heads
from .._validation import to_data_format
from .._params import validate_random_state

__all__ = ["Witness", "make_term_witness", "make_witness"]

# Random candidate inputs tried by ``make_witness``; the one whose features
# stick out of the training span the most (relative to their norm) is returned.
_WITNESS_CANDIDATES = 16
# Candidate lengths tried (each twice the last) before giving up.
_WITNESS_LENGTHS = 4


def _candidate_length(layout, d, standardizer):
    """First candidate length: the training length, at least 2 (K + 1 with K decays)."""
    return max(layout.n_tokens or d + 1, 2, standardizer.n_blocks + 1)


def _leaves_the_span(row_space, h, null_norm, h_norm):
    """Whether a candidate's feature row is outside the training span (not covered)."""
    if row_space.resolves_null_space:
        return not bool(row_space.coverage(h[None, None, :])[0][0, 0])
    # One null vector: its component must stand above the rounding of the row.
    return null_norm > np.sqrt(row_space.n_features * np.finfo(np.float64).eps) * h_norm


@dataclass(frozen=True, eq=False, repr=False)
class Witness:  # numpydoc ignore=PR01
    """Two attention models that a failed certificate cannot tell apart.

    Returned by :meth:`~sklearn_linattn.IdentifiabilityCertificate.witness`,
    not constructed directly.  Both models give the same outputs on every
    training input (to rounding), and clearly different outputs at the last
    position of ``input`` (:ref:`certificate-witness`).

    Attributes
    ----------
    model_a : tuple (V_a, Q_a)
        ``V_a`` of shape (n_heads_a, d_out, d) and ``Q_a`` of shape
        (n_heads_a, d, d), for :func:`~sklearn_linattn.mhla_forward`.
    model_b : tuple (V_b, Q_b)
        The second model, same layout (its head count may differ).
    input : ndarray of shape (n_tokens, d)
        One sequence on which the two models disagree ((d, n_tokens) for a
        certificate of ``data_format="channels_first"`` data).
    null_vector : ndarray of shape (psi,)
        Unit null vector of the training features: ``p(model_b) - p(model_a)``
        is a multiple of it in every output row (zero when only the terms differ).
    terms_a, terms_b : tuple (intercept, skip) or None
        Each model's intercept (d_out,) and skip coefficients (d_out, d) for
        a model with ``fit_intercept`` / ``fit_skip``; None without terms.
    decays_a, decays_b : ndarray of shape (n_heads,) or None
        The decay of each head of ``model_a`` and ``model_b`` for a model with
        decays (``mhla_forward(..., decays=decays_a)``); None without.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import certify_identifiability, mhla_forward
    >>> X = np.random.default_rng(0).normal(size=(14, 4, 3))  # 14 < psi = 18
    >>> w = certify_identifiability(X).witness(random_state=0)
    >>> (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    >>> bool(np.allclose(mhla_forward(X, Va, Qa), mhla_forward(X, Vb, Qb)))
    True
    >>> Z = w.input[None]
    >>> bool(np.allclose(mhla_forward(Z, Va, Qa), mhla_forward(Z, Vb, Qb)))
    False
    """

    model_a: tuple
    model_b: tuple
    input: np.ndarray
    null_vector: np.ndarray
    terms_a: tuple | None = None
    terms_b: tuple | None = None
    decays_a: np.ndarray | None = None
    decays_b: np.ndarray | None = None

    def __repr__(self):
        return (
            f"Witness(model_a={self.model_a[0].shape[0]} heads, "
            f"model_b={self.model_b[0].shape[0]} heads, "
            f"input of shape {self.input.shape})"
        )


def make_witness(row_space, standardizer, layout, *, d, coef=None, random_state=None,
                 terms=None):
    """The witness of a failed certificate (see ``IdentifiabilityCertificate.witness``).

    ``coef`` (standardized, d_out x psi) is the base model, None for a random
    one; ``terms`` are the fit's intercept and skip columns, kept by both models.
    """
    rng = validate_random_state(random_state)
    n_tokens = _candidate_length(layout, d, standardizer)
    rms_row = np.sqrt(row_space.trace)
    for _ in range(_WITNESS_LENGTHS):
        Z = rng.standard_normal((_WITNESS_CANDIDATES, n_tokens, d))
        lengths = np.full(_WITNESS_CANDIDATES, n_tokens)
        h = standardizer.scale_features(attention_features(Z, lengths, standardizer.decays))
        # At the training scale (||H|| ~ RMS training row) the candidates' null
        # components compare with the coverage rule's allowance.
        h_norm = np.linalg.norm(h, axis=1)
        if rms_row > 0:
            factor = (rms_row / h_norm) ** (1.0 / 3.0)
            Z *= factor[:, None, None]
            h *= (factor**3)[:, None]
            h_norm = np.linalg.norm(h, axis=1)
        best, w, n_best = row_space.witness_direction(h, h_norm)
        if _leaves_the_span(row_space, h[best], n_best, h_norm[best]):
            break
        # Every candidate of this length lies in the training span (to rounding):
        # longer sequences reach more of the feature space.
        n_tokens *= 2
    else:
        raise ValueError(
            f"witness() found no input of up to {n_tokens // 2} tokens outside the training "
            "span among its random candidates; try another random_state.")
    Z, h_best = Z[best], h_norm[best]

    if coef is None:
        g = rng.standard_normal((1, row_space.n_features))
        coef = g / (np.linalg.norm(g) * (rms_row if rms_row > 0 else 1.0))
    a = np.linalg.norm(coef, axis=1).max()
    if a == 0:
        a = 1.0 / (rms_row if rms_row > 0 else 1.0)
    # Sized so that the outputs at the input differ by a * ||h_best|| in every
    # output, as much as model_a's own output there can be.
    shift = (a * h_best / n_best) * w
    coef_b = coef + shift[None, :]
    # Everything above is in the standardized coordinates the certificate
    # computes in; the witness is given in the data's own.
    st = standardizer
    user_null = st.coef_to_user(w, targets=False)
    user_null = user_null / np.abs(user_null).max()
    shared = None
    if terms is not None:
        beta = (terms.beta if terms.beta.shape[1] == coef.shape[0]
                else np.zeros((terms.n_terms, coef.shape[0])))
        _refuse_linear_term(terms)
        shared = st.terms_to_user(beta, terms.terms, coef.shape[0])[:2]
    Va, Qa, decays_a = block_heads(st.folded(coef), d, st.decays)
    Vb, Qb, decays_b = block_heads(st.folded(coef_b), d, st.decays)
    return Witness(
        model_a=st.heads_to_user(Va, Qa), model_b=st.heads_to_user(Vb, Qb),
        decays_a=decays_a, decays_b=decays_b,
        input=to_data_format(st.inputs_to_user(Z)[None], layout.data_format)[0],
        null_vector=user_null / np.linalg.norm(user_null),
        terms_a=shared, terms_b=shared,
    )


def _refuse_linear_term(terms):
    if terms.terms.n_window:
        raise ValueError(
            "witness() does not build models with the linear term (fit_linear=True): its "
            "models hold attention, intercept and skip terms only. Fit with "
            "fit_linear=False for a witness.")


def make_term_witness(terms, standardizer, layout, *, d, coef, readout, random_state=None):
    """The witness when attention is determined but the intercept or skip terms are not."""
    _refuse_linear_term(terms)
    rng = validate_random_state(random_state)
    st = standardizer
    n_tokens = _candidate_length(layout, d, st)
    Z = rng.standard_normal((_WITNESS_CANDIDATES, n_tokens, d))
    lengths = np.full(_WITNESS_CANDIDATES, n_tokens)
    h = st.scale_features(attention_features(Z, lengths, st.decays))
    Zu = st.inputs_to_user(Z)
    E = terms.terms.standardized_rows(Zu, lengths, "last", st)
    R = terms.residuals(E, h)
    u = terms.null_directions[:, 0]
    along = R @ u
    best = int(np.argmax(np.abs(along) / np.maximum(np.linalg.norm(R, axis=1), 1e-300)))
    beta = terms.beta
    if coef is None or coef.shape[0] == 0 or beta.shape[1] != coef.shape[0]:
        # A certificate of inputs alone: a zero base model with one output.
        coef, beta = np.zeros((1, h.shape[1])), np.zeros((terms.n_terms, 1))
    out_a = coef @ h[best] + beta.T @ E[best]
    t = max(float(np.abs(out_a).max()), 1.0) / abs(float(along[best]))
    beta_b = beta + t * u[:, None]
    shift = -t * (u @ terms.coef_terms)
    coef_b = coef + shift[None, :]
    user_null = st.coef_to_user(shift, targets=False)
    norm = np.linalg.norm(user_null)
    d_out = coef.shape[0]
    Va, Qa, decays_a = block_heads(st.folded(coef), d, st.decays)
    Vb, Qb, decays_b = block_heads(st.folded(coef_b), d, st.decays)
    return Witness(
        model_a=st.heads_to_user(Va, Qa), model_b=st.heads_to_user(Vb, Qb),
        decays_a=decays_a, decays_b=decays_b,
        input=to_data_format(Zu[best][None], layout.data_format)[0],
        null_vector=user_null / norm if norm > 0 else user_null,
        terms_a=st.terms_to_user(beta, terms.terms, d_out)[:2],
        terms_b=st.terms_to_user(beta_b, terms.terms, d_out)[:2],
    )
