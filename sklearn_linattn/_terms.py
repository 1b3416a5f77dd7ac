"""Intercept and skip terms beside the attention features, eliminated exactly around any solver.

A model with linear terms is ``y = b + W x_row + c H_row``: a constant and the
row's own token (the last token for ``readout="last"``, the current one for
``"all"``: the residual path of a transformer block) beside the cubic
features.  Writing ``E_row`` for the term columns (``1`` and ``x_row``), the
least squares with ``b, W`` unpenalized splits exactly (block elimination,
the Frisch-Waugh-Lovell theorem) into solves of the attention problem alone:

- the solver fits the attention features to the targets *and* to the term
  columns (``c_Y`` and ``c_E``: a few more outputs, the same Gram matrix);
- with ``A = E^T W E - E^T W Phi c_E^T`` and ``b = E^T W Y - E^T W Phi c_Y^T``
  the terms are ``beta = A^+ b`` and the attention coefficients
  ``c = c_Y - beta^T c_E``.

For every ridge penalty on c this is the joint minimizer (``A = E^T M E``
with ``M = I - Phi (G + alpha P)^{-1} Phi^T``).  At ``alpha = 0``, ``A`` is the
Schur complement ``K = E^T W (I - Pi) E`` of the Gram matrix of ``[E, Phi]``
(``Pi`` the projection on the span of the attention features): the part of
the term columns that attention cannot reproduce on the training rows.  The
whole linear class is identified iff the attention features are (the
certificate's Lambda_D) and K is positive definite; :class:`TermSpace` holds
K for the certificate.

Everything is computed in standardized coordinates: the term columns are
``1`` and the standardized row token, appended to the targets of every row
(:func:`~._moments.with_terms`); the term coefficients are mapped to the
data's units once, with the rest of the model (:meth:`LinearTerms.to_user`).
"""

from dataclasses import replace

import numpy as np

from ._features import features_matvec
from ._memory import n_pairs, real_tokens
from ._params import check_flag
from ._units import pow2_scale

__all__ = ["LinearTerms", "TermSpace", "cross_products", "eliminate", "eliminate_path",
           "fit_terms", "linear_columns", "schur_complement"]

_EPS = float(np.finfo(np.float64).eps)


class LinearTerms:
    """Which linear terms a model has beside attention: a constant, the row's token, the window.

    Parameters
    ----------
    d : int
        Token dimension.
    intercept : bool
        A constant term b (one per output).
    skip : bool
        A linear term ``W x_row`` in the row's token (d per output).
    n_lags : int, default=0
        A penalized linear term in the last ``n_lags`` tokens of the sequence
        (``readout="last"``): ``n_lags * d`` columns, given with the targets
        (:func:`linear_columns`) rather than formed from the rows.
    alpha_linear : float, default=0.0
        Its unit-free penalty (:func:`eliminate_path`).
    """

    def __init__(self, d, *, intercept=False, skip=False, n_lags=0, alpha_linear=0.0):
        self.d = int(d)
        self.intercept = bool(intercept)
        self.skip = bool(skip)
        self.n_lags = int(n_lags)
        self.alpha_linear = float(alpha_linear)
        # Columns appended to the targets of every row (intercept + d * skip).
        self.n_terms = int(self.intercept) + self.d * int(self.skip)
        # Columns of the linear term, among the targets; every eliminated column.
        self.n_window = self.n_lags * self.d
        self.n_columns = self.n_window + self.n_terms

    @classmethod
    def checked(cls, d, intercept, skip, names=("fit_intercept", "fit_skip")):
        """The terms of two user flags, each checked to be a bool (``names`` for the message)."""
        return cls(d, intercept=check_flag(intercept, names[0]), skip=check_flag(skip, names[1]))

    def __bool__(self):
        return self.n_columns > 0

    def _key(self):
        return (self.d, self.intercept, self.skip, self.n_lags, self.alpha_linear)

    def __eq__(self, other):
        return isinstance(other, LinearTerms) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def with_penalty(self, alpha_linear):
        """The same terms with another penalty of the linear term."""
        return LinearTerms(self.d, intercept=self.intercept, skip=self.skip,
                           n_lags=self.n_lags, alpha_linear=alpha_linear)

    def target_columns(self, d_out, within):
        """Indices of the targets and of these term columns among those of ``within``'s.

        The targets come first (``d_out`` of them), then the linear term's
        columns, the intercept column and the d skip columns; ``within`` must
        have every term this has.

        Examples
        --------
        >>> from sklearn_linattn._terms import LinearTerms
        >>> both = LinearTerms(2, intercept=True, skip=True)
        >>> LinearTerms(2, skip=True).target_columns(1, both).tolist()
        [0, 2, 3]
        """
        if ((self.intercept and not within.intercept) or (self.skip and not within.skip)
                or (self.n_lags and self.n_lags != within.n_lags)):
            raise ValueError(f"the terms {self!r} are not among {within!r}.")
        cols = [np.arange(d_out)]
        start = d_out + within.n_window
        if self.n_lags:
            cols.append(d_out + np.arange(self.n_window))
        if self.intercept:
            cols.append([start])
        if self.skip:
            cols.append(start + int(within.intercept) + np.arange(self.d))
        return np.concatenate(cols).astype(np.intp)

    def __repr__(self):
        window = (f", n_lags={self.n_lags}, alpha_linear={self.alpha_linear:g}"
                  if self.n_lags else "")
        return f"LinearTerms({self.d}, intercept={self.intercept}, skip={self.skip}{window})"

    def columns(self, X, lengths, readout):
        """Term columns of every row, in the data's units: the window, ``1``, the row's token.

        ``readout="last"``: shape (n_samples, n_columns), the row of each
        sequence's last token; ``"all"``: (n_samples, n_tokens, n_terms), zero
        at padded positions (no linear term).
        """
        X = np.asarray(X, dtype=np.float64)
        lengths = np.asarray(lengths)
        n, T, d = X.shape
        if readout == "last":
            x = X[np.arange(n), np.maximum(lengths - 1, 0)]
            ones = np.ones((n, int(self.intercept)))
            window = [linear_columns(X, lengths, self.n_lags)] if self.n_lags else []
        else:
            real = real_tokens(lengths, T)
            x = np.where(real[:, :, None], X, 0.0)
            ones = np.broadcast_to(real[:, :, None], (n, T, int(self.intercept))).astype(float)
            window = []
        parts = window + [ones] + ([x] if self.skip else [])
        return np.concatenate(parts, axis=-1)

    def names(self, input_features):
        """Names of the term columns: ``"lag{k}[x]"``, ``"1"`` and ``"last[x]"``."""
        window = [f"lag{k}[{name}]" for k in range(self.n_lags) for name in input_features]
        return window + (["1"] if self.intercept else []) + (
            [f"last[{name}]" for name in input_features] if self.skip else [])

    def standardized_rows(self, X, lengths, readout, standardizer):
        """Term columns in standardized units: ``[window 2**-ey, 1, x T]`` of every row slot.

        Shape (n_samples, n_columns) for ``"last"``, (n_samples, n_tokens,
        n_terms) for ``"all"`` (zero at padding).  The window's columns are
        targets: scaled by their exponents, the last ``n_window`` of the
        standardizer's target exponents.
        """
        E = self.columns(X, lengths, readout)
        m = self.n_window if readout == "last" else 0
        if m:
            E[..., :m] = pow2_scale(E[..., :m], -standardizer.y_exponents[-m:])
        if self.skip:
            i = m + int(self.intercept)
            E[..., i:] = standardizer.transform(E[..., i:])
        return E


def linear_columns(X, lengths, n_lags):
    """The last ``n_lags`` tokens of every sequence, lag-major: shape (n_samples, n_lags * d).

    Lag 0 is the last real token; lags beyond a sequence's length are zero.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn._terms import linear_columns
    >>> X = np.arange(6.0).reshape(1, 3, 2)
    >>> linear_columns(X, np.array([3]), 2).tolist()
    [[4.0, 5.0, 2.0, 3.0]]
    """
    X = np.asarray(X, dtype=np.float64)
    lengths = np.asarray(lengths)
    n, _, d = X.shape
    index = lengths[:, None] - 1 - np.arange(n_lags)[None, :]
    valid = index >= 0
    tokens = X[np.arange(n)[:, None], np.maximum(index, 0)]
    return np.where(valid[:, :, None], tokens, 0.0).reshape(n, n_lags * d)


def cross_products(rows, coef):
    """``Y^T W Phi coef^T`` over every training row (the term columns last among the targets).

    Parameters
    ----------
    rows : RowReader
        The rows (:class:`~._moments.RowReader`), targets with the term columns.
    coef : ndarray of shape (k, psi)
        Standardized coefficients.

    Returns
    -------
    cross : ndarray of shape (n_targets, k)
    """
    out = np.zeros((rows.n_targets, coef.shape[0]))
    per_row = 2 * n_pairs(rows.d) + 2 * rows.d + rows.n_targets + coef.shape[0]
    for chunk in rows.row_chunks(per_row):
        if chunk.n_rows == 0:
            continue
        pred = features_matvec(chunk.S, chunk.x, coef)
        Yw = chunk.Y if chunk.w is None else chunk.Y * chunk.w[:, None]
        out += Yw.T @ pred
    return out


def _normalized_spectrum(A, EE):
    """Eigen-decomposition of A relative to EE (both n_terms x n_terms, symmetric).

    Returns ``(T, mu, V, empty)``: ``T`` maps normalized coordinates to term
    coefficients (``T^T EE T = I`` on the range of EE), ``mu`` and ``V`` the
    eigenvalues and eigenvectors of ``T^T A T`` (in [0, 1] for the Schur
    complement), ``empty`` the directions of EE that no training row uses.
    """
    lam, Q = np.linalg.eigh((EE + EE.T) / 2)
    lam_max = max(float(lam[-1]), 0.0)
    keep = lam > lam_max * EE.shape[0] * _EPS * 16 if lam_max > 0 else np.zeros(lam.shape, bool)
    T = Q[:, keep] / np.sqrt(lam[keep])
    An = T.T @ A @ T
    mu, V = np.linalg.eigh((An + An.T) / 2)
    return T, mu, V, Q[:, ~keep]


def eliminate(coef, y_cross, cross, d_out, *, tol=None):
    """Terms and attention coefficients from the joint solve (block elimination).

    Parameters
    ----------
    coef : ndarray of shape (d_out + n_terms, psi)
        Standardized coefficients ``[c_Y; c_E]`` of the solve with the term
        columns as extra targets.
    y_cross : ndarray of shape (d_out + n_terms, d_out + n_terms)
        ``[Y, E]^T W [Y, E]`` (standardized).
    cross : ndarray of shape (d_out + n_terms, d_out + n_terms)
        ``[Y, E]^T W Phi coef^T``.
    d_out : int
    tol : float or None
        Relative eigenvalue threshold of the normalized ``A`` (None: the
        rounding rule ``n_terms * 16 eps``).

    Returns
    -------
    beta : ndarray of shape (n_terms, d_out)
        Standardized term coefficients (minimum norm in the metric of EE
        when A is singular).
    attention : ndarray of shape (d_out, psi)
        ``c_Y - beta^T c_E``.
    """
    EE, EY = y_cross[d_out:, d_out:], y_cross[d_out:, :d_out]
    A = EE - cross[d_out:, d_out:]
    b = EY - cross[d_out:, :d_out]
    beta = _pseudo_inverse(A, EE, tol) @ b
    return beta, coef[:d_out] - beta.T @ coef[d_out:]


def _pseudo_inverse(A, EE, tol=None):
    """``A^+`` in the metric of EE; eigenvalues of the normalized A at or below ``tol`` (None:
    ``n_terms * 16 eps``) count as zero."""
    T, mu, V, _ = _normalized_spectrum((A + A.T) / 2, EE)
    rule = EE.shape[0] * 16 * _EPS if tol is None else tol
    inv = np.where(mu > rule, 1.0 / np.where(mu > rule, mu, 1.0), 0.0)
    TV = T @ V
    return (TV * inv) @ TV.T


def penalty_weights(EE, terms):
    """Per linear-term column, its weighted second moment, centered when there is an intercept.

    The penalty ``alpha_linear * sum_k D_k beta_k**2`` is then a ridge on
    the columns scaled to unit variance (``StandardScaler`` then ``Ridge``,
    relative to the weight sum): the same for any unit of each column.
    """
    m = terms.n_window
    D = np.diagonal(EE)[:m].copy()
    if terms.intercept:
        one = EE[m, m]
        if one > 0:
            D = D - EE[:m, m] ** 2 / one
    return np.maximum(D, 0.0)


def eliminate_path(coef, y_cross, cross, d_out, terms, alphas_linear, *, tol=None):
    """:func:`eliminate` with the linear term penalized, for every ``alpha_linear`` at once.

    The unpenalized columns (intercept, skip) are eliminated first; the
    linear term's normal equations, scaled to unit diagonal penalty, are
    decomposed once, so each penalty costs a product.  A linear-term column
    without variance (a constant beside the intercept) gets coefficient 0.

    Returns
    -------
    betas : ndarray of shape (n_alphas_linear, n_columns, d_out)
    attention : ndarray of shape (n_alphas_linear, d_out, psi)
    """
    alphas_linear = np.atleast_1d(np.asarray(alphas_linear, dtype=np.float64))
    if not terms.n_window:
        beta, attention = eliminate(coef, y_cross, cross, d_out, tol=tol)
        k = alphas_linear.size
        return np.broadcast_to(beta, (k,) + beta.shape), np.broadcast_to(
            attention, (k,) + attention.shape)
    EE, EY = y_cross[d_out:, d_out:], y_cross[d_out:, :d_out]
    A = EE - cross[d_out:, d_out:]
    A = (A + A.T) / 2
    b = EY - cross[d_out:, :d_out]
    m, n = terms.n_window, EE.shape[0]
    D = penalty_weights(EE, terms)
    L = np.flatnonzero(D > n * 16 * _EPS * max(float(D.max()), 0.0))
    U = np.arange(m, n)
    AL, bL = A[np.ix_(L, L)], b[L]
    if U.size:
        AUU_inv = _pseudo_inverse(A[np.ix_(U, U)], EE[np.ix_(U, U)], tol)
        ALU = A[np.ix_(L, U)]
        AL = AL - ALU @ AUU_inv @ ALU.T
        bL = bL - ALU @ (AUU_inv @ b[U])
    s = np.sqrt(D[L])
    mu, V = np.linalg.eigh((AL + AL.T) / 2 / np.outer(s, s))
    Vb = V.T @ (bL / s[:, None])
    rule = (L.size * 16 * _EPS if tol is None else tol) * max(float(mu[-1]) if mu.size else 0.0,
                                                              1.0)
    betas = np.zeros((alphas_linear.size, n, d_out))
    for i, a in enumerate(alphas_linear):
        shifted = mu + a
        inv = np.where(shifted > rule, 1.0 / np.where(shifted > rule, shifted, 1.0), 0.0)
        betas[i, L] = (V @ (inv[:, None] * Vb)) / s[:, None]
        if U.size:
            betas[i, U] = AUU_inv @ (b[U] - A[np.ix_(U, L)] @ betas[i, L])
    attention = coef[None, :d_out] - np.einsum("ktd,tp->kdp", betas, coef[d_out:])
    return betas, attention


class TermSpace:
    """What the certificate knows about the term columns: their Schur complement K.

    Parameters
    ----------
    terms : LinearTerms
    coef_terms : ndarray of shape (n_terms, psi)
        ``c_E`` of the unpenalized (minimum-norm) solve: the attention
        features' best reproduction of each term column.
    EE : ndarray of shape (n_terms, n_terms)
        ``E^T W E`` (standardized).
    K : ndarray of shape (n_terms, n_terms)
        ``E^T W (I - Pi) E``, or a lower bound of it (:func:`schur_complement`).
    weight_sum : float
        Sum of the standardized row weights W.
    condition : float
        ``lambda_max / lambda_min`` of Lambda_D over the directions the
        attention features determine: the rounding of K grows with it.
    beta : ndarray of shape (n_terms, d_out)
        The fitted standardized term coefficients (the witness's base model).

    Attributes
    ----------
    min_eigenvalue : float
        Smallest eigenvalue of K relative to ``E^T W E`` (in [0, 1]; 0 when
        some term direction is not used by any training row).
    tol : float
        ``n_terms * 16 eps * condition`` (at most 0.5): values at or below
        count as zero.
    rank : int
        Number of term directions determined.
    identifiable : bool
        ``rank == n_terms``.
    """

    def __init__(self, terms, coef_terms, EE, K, *, weight_sum, condition, beta):
        self.terms = terms
        self.n_terms = terms.n_columns
        self.coef_terms = np.asarray(coef_terms, dtype=np.float64)
        self.beta = np.asarray(beta, dtype=np.float64)
        self.weight_sum = float(weight_sum)
        T, mu, V, empty = _normalized_spectrum((K + K.T) / 2, EE)
        self.tol = float(min(0.5, self.n_terms * 16 * _EPS * max(1.0, condition)))
        good = mu > self.tol
        self.rank = int(np.count_nonzero(good))
        self.identifiable = self.rank == self.n_terms
        self.min_eigenvalue = (float(max(mu.min(), 0.0)) if empty.shape[1] == 0 and mu.size
                               else 0.0)
        # K^+ in term coordinates, over the determined directions.
        TV = T @ V[:, good]
        self._inverse_root = TV / np.sqrt(mu[good])
        null = np.concatenate([T @ V[:, ~good], empty], axis=1)
        self.null_directions = null / np.maximum(np.linalg.norm(null, axis=0), 1e-300)

    def residuals(self, E, H):
        """Term columns minus their attention reproduction, ``E - H c_E^T``."""
        return E - H @ self.coef_terms.T

    def leverage(self, R):
        """``r^T (K / W)^+ r`` of each row r of R (..., n_terms)."""
        Z = R @ self._inverse_root
        return self.weight_sum * np.einsum("...k,...k->...", Z, Z)

    def covered(self, R, E):
        """Rows whose residual ``R = E - H c_E^T`` has no component along an undetermined term direction.

        Judged relative to the row's own term columns and their attention
        reproduction, whose difference R is: on a training row R is rounding.
        """
        if self.null_directions.shape[1] == 0:
            return np.ones(R.shape[:-1], dtype=bool)
        along = R @ self.null_directions
        scale = np.einsum("...k,...k->...", E, E) + np.einsum("...k,...k->...", E - R, E - R)
        return np.einsum("...k,...k->...", along, along) <= self.tol * scale


def _condition(solution):
    """lambda_max over the smallest eigenvalue the attention features determine."""
    lam_max = solution.lambda_max
    w = solution.eigenvalues
    if w is not None and np.any(w > solution.tol):
        small = float(w[w > solution.tol].min())
    elif solution.rank >= solution.n_features and solution.lambda_min > solution.tol:
        small = solution.lambda_min - solution.lambda_min_error
    else:
        small = solution.tol
    return lam_max / small if small > 0 else np.inf


def schur_complement(solution, EE, cross, d_out):
    """``K = E^T W (I - Pi) E`` of an unpenalized solve, or a lower bound when it is inexact.

    A direct solve gives ``c_E = G^+ Phi^T W E`` to rounding and ``K = E^T W E
    - E^T W Phi c_E^T``.  An iterative one (``"cg"``) stops at a residual
    ``R = Phi^T W E - G C`` of its computed ``C``: then, with ``b = G C + R``,

        b^T G^{-1} b = C^T G C + C^T R + R^T C + R^T G^{-1} R
                    <= C^T G C + C^T R + R^T C + (||R||^2 / lambda_min) I,

    so ``E^T W E - C^T G C - C^T R - R^T C - ||R||^2 / l I`` is a lower bound of
    K for any ``l <= lambda_min`` (the certificate's lower bound of it, which
    holds with the probability it states).  A term direction is then only
    judged determined when even the bound says so.  Without a positive lower
    bound of lambda_min the attention features are not identified either, and
    K is the estimate from the computed coefficients.
    """
    if solution.normal_residual is None:
        return EE - cross
    C = solution.coef[d_out:]
    GC = solution.gram_coef[:, d_out:]
    R = solution.normal_residual[:, d_out:]
    CR = C @ R
    K = EE - C @ GC - CR - CR.T
    floor = solution.lambda_min - solution.lambda_min_error
    if floor > 0:
        K = K - (np.linalg.norm(R, 2) ** 2 / floor) * np.eye(K.shape[0])
    return K


def fit_terms(solution, counts, terms, d_out, *, rows=None, free=None):
    """Split a joint solve into the attention model and its linear terms (standardized).

    Parameters
    ----------
    solution : SpectralSolution
        The solve with the term columns as the last targets.
    counts : RowCounts
        ``y_cross`` of all the targets (term columns included) and the weight sum.
    terms : LinearTerms
    d_out : int
        Number of real outputs (0 for a certificate of inputs alone).
    rows : RowReader or None
        The rows, for ``E^T W Phi c^T`` when no moment ``Phi^T W Y`` was kept.
    free : SpectralSolution or None
        The unpenalized solve when ``solution`` is penalized (the certificate
        is about the data, never the penalty); None: ``solution`` itself.

    Returns
    -------
    attention : SpectralSolution
        The attention coefficients alone (None without real outputs).
    space : TermSpace
        The term columns' part of the certificate.
    beta : ndarray of shape (n_terms, d_out)
        Standardized term coefficients.
    """
    def cross_of(sol):
        # Y^T W Phi C^T from a moment Phi^T W Y when one was computed, else a pass.
        moment = getattr(counts, "moment", None)
        moment = sol.moment if moment is None else moment
        if moment is not None:
            return moment.T @ sol.coef.T
        return cross_products(rows, sol.coef)

    cross = cross_of(solution)
    betas, coefs = eliminate_path(solution.coef, counts.y_cross, cross, d_out, terms,
                                  [terms.alpha_linear])
    beta, coef = betas[0], coefs[0]
    free = solution if free is None else free
    cross_free = cross if free is solution else cross_of(free)
    EE = counts.y_cross[d_out:, d_out:]
    space = TermSpace(
        terms, free.coef[d_out:], EE, schur_complement(free, EE, cross_free[d_out:, d_out:],
                                                       d_out),
        weight_sum=counts.weight_sum, condition=_condition(free), beta=beta,
    )
    # Without real outputs (a certificate of inputs alone) there is no model.
    attention = replace(solution, coef=coef if d_out else None, moment=None,
                        normal_residual=None, gram_coef=None)
    attention.counts = counts
    # The joint fit's residual energy per output, ``Y^T M Y - b^T beta`` with
    # M = I - Phi (G + alpha P)^{-1} Phi^T W (the objective's minimum; at
    # alpha = 0 the training residual): what the targets' energy less the
    # attention's overstates by all the terms explain.
    b = counts.y_cross[d_out:, :d_out] - cross[d_out:, :d_out]
    residual = (np.diagonal(counts.y_cross[:d_out, :d_out] - cross[:d_out, :d_out])
                - np.einsum("ta,ta->a", b, beta))
    attention.residual_sq = np.maximum(residual, 0.0)
    return attention, space, beta
