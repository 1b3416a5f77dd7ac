"""What the regressors share: predict, generate and score a fitted set of heads."""

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.metrics import r2_score
from sklearn.utils.validation import check_is_fitted

from ._attention import forward_checked, mhla_forward, mhla_generate
from ._memory import real_tokens
from ._namespace import returns_in_namespace
from ._terms import linear_columns
from ._units import SAFE_EXPONENT, scale_per_sample
from ._validation import (
    check_data_format,
    check_sample_weight,
    check_sequences,
    check_targets,
    to_data_format,
)

__all__ = ["AttentionHeadsRegressorMixin", "sequence_tags"]


def sequence_tags(tags):
    """Tags of estimators on sequences: 3-D input; NaN marks padding, not missing values."""
    tags.input_tags.three_d_array = True
    # NaN only marks padding at the end of a sequence; it never stands for a
    # missing value, so allow_nan stays False.
    return tags


class AttentionHeadsRegressorMixin(RegressorMixin):
    """Prediction and scoring for regressors whose fitted model is a set of heads.

    Subclasses set ``value_matrices_``, ``key_query_matrices_``,
    ``n_features_in_`` and ``_single_output`` in ``fit`` and have ``readout``
    and ``token_dim`` parameters.  A subclass that fitted in standardized
    coordinates also sets ``standardization_`` and ``_standardized_heads``
    (the heads in those coordinates): outputs are then computed there, where
    the model is best conditioned, and mapped back exactly.
    """

    def _layout(self):
        """How X is read: ``token_dim`` and ``data_format`` (checked)."""
        return {"token_dim": self.token_dim,
                "data_format": check_data_format(getattr(self, "data_format", "channels_last"))}

    def _validate_X(self, X):
        check_is_fitted(self)
        return check_sequences(X, n_features_in=self.n_features_in_, **self._layout())

    def _forward(self, X, lengths):
        """Outputs of the fitted model on validated sequences, shape (n, [n_tokens,] d_out)."""
        heads = getattr(self, "_standardized_heads", None)
        if heads is None:
            out = mhla_forward(X, self.value_matrices_, self.key_query_matrices_, lengths,
                               readout=self.readout, decays=self._head_decays())
        else:
            st = self.standardization_
            # Each standardized sequence scaled by a power of two 2**-f (its
            # outputs by 2**(3 f), exactly), put back with the targets' scale
            # in one step: inputs far from the training data's magnitude have
            # standardized outputs beyond float64 whose user units are not.
            Xs, f = scale_per_sample(st.transform(X), safe=SAFE_EXPONENT)
            out = st.outputs_to_user(forward_checked(Xs, *heads, lengths, self.readout,
                                                     self._head_decays()),
                                     sample_exponents=3 * f)
        return self._add_terms(out, X, lengths)

    def _head_decays(self):
        """The decay of each head (None: no decays; estimators without them have none)."""
        return getattr(self, "head_decays_", None)

    def _has_terms(self):
        return bool(np.any(getattr(self, "intercept_", 0.0))
                    or np.any(getattr(self, "skip_coef_", 0.0))
                    or getattr(self, "linear_coef_", None) is not None)

    def _add_terms(self, out, X, lengths):
        """Add the terms ``b + W x_row`` and the linear term (padded positions stay NaN)."""
        if not self._has_terms():
            return out
        X = np.asarray(X, dtype=np.float64)
        if self.readout == "last":
            x = X[np.arange(X.shape[0]), lengths - 1]
        else:
            x = np.where(real_tokens(lengths, X.shape[1])[:, :, None], X, 0.0)
        linear = getattr(self, "linear_coef_", None)
        with np.errstate(over="ignore", invalid="ignore"):
            terms = self.intercept_ + x @ self.skip_coef_.T
            if linear is not None:
                # Lags beyond the training length have no coefficient.
                terms = terms + linear_columns(X, lengths, linear.shape[1]) @ linear.reshape(
                    linear.shape[0], -1).T
        if np.isinf(terms).any():
            raise ValueError(
                "The intercept and skip terms of these inputs cannot be represented in "
                "float64 (they overflow); rescale X."
            )
        return out + terms

    @returns_in_namespace
    def predict(self, X):
        """Run the fitted attention heads on X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length, including lengths never seen in ``fit``.

        Returns
        -------
        y : ndarray
            ``readout="last"``: shape (n_samples,) or (n_samples, d_out).
            ``readout="all"``: shape (n_samples, n_tokens[, d_out]), NaN at
            padded positions.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> rng = np.random.default_rng(0)
        >>> X, X_long = rng.normal(size=(50, 4, 2)), rng.normal(size=(3, 9, 2))
        >>> f = lambda X: X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)  # a one-head MHLA
        >>> model = LinearAttentionRegressor().fit(X, f(X))
        >>> bool(np.allclose(model.predict(X_long), f(X_long)))  # longer sequences too
        True
        """
        X, lengths = self._validate_X(X)
        return self._shape_output(self._forward(X, lengths))

    def _shape_output(self, Y):
        Y = Y[..., 0] if self._single_output else Y
        return to_data_format(Y, self._layout()["data_format"])

    @returns_in_namespace
    def generate(self, X, n_steps, *, rounding=None):
        """Continue sequences autoregressively with the fitted heads.

        Each step appends the model's output at the last token (optionally
        rounded to a token) to the sequence, as in
        :func:`~sklearn_linattn.mhla_generate`.  The output at the last token
        is the same function for both readouts, so models fitted with
        ``readout="all"`` (next-token targets at every position) and with
        ``readout="last"`` (one target per prefix) generate alike.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Prompts; trailing all-NaN tokens are padding.
        n_steps : int
            Number of tokens to append.
        rounding : None, callable or array-like of shape (n_vocab, d), default=None
            None appends raw outputs; an embedding table appends the nearest
            row; a callable maps outputs (m, d) to tokens (m, d), e.g.
            ``CompiledProgram.round``.

        Returns
        -------
        sequences : ndarray of shape (n_samples, max(lengths) + n_steps, d)
            Each prompt followed by its generated tokens, NaN-padded.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> from sklearn_linattn.programs import associative_memory_program
        >>> memory = associative_memory_program(3)
        >>> prompts = memory.encode([[{"key": 0, "value": 2}, {"key": 1, "value": 0},
        ...                           {"key": 2, "value": 1}, {"key": 1}]])
        >>> X = np.random.default_rng(0).normal(size=(200, 4, 6))
        >>> model = LinearAttentionRegressor().fit(X, memory.forward(X))
        >>> memory.decode(model.generate(prompts, 1, rounding=memory.round)[0])[-1]
        {'value': 0}
        """
        X, lengths = self._validate_X(X)
        d = self.n_features_in_
        if self.value_matrices_.shape[1] != d:
            raise ValueError(
                "generate appends each output to its sequence, so it needs a model whose "
                f"output dimension equals the token dimension d={d}; this model outputs "
                f"{self.value_matrices_.shape[1]} values per position (fit it with y of "
                f"shape (n_samples, {d}) or (n_samples, n_tokens, {d}))."
            )
        terms = {}
        if self._has_terms():
            terms = {"intercept": self.intercept_, "skip_coef": self.skip_coef_}
        return to_data_format(mhla_generate(
            X, self.value_matrices_, self.key_query_matrices_, n_steps,
            rounding=rounding, lengths=lengths, decays=self._head_decays(), **terms,
        ), self._layout()["data_format"])

    @returns_in_namespace
    def score(self, X, y, sample_weight=None):
        """Coefficient of determination R^2 over every non-padded output.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Test sequences; trailing all-NaN tokens are padding.
        y : array-like, shaped as in :meth:`fit`
            True targets; with ``readout="all"``, NaN at padded positions
            (those positions are not scored).
        sample_weight : array-like of shape (n_samples,) or None
            Weight of each sequence (applied to each of its positions for
            ``readout="all"``).

        Returns
        -------
        score : float
            R^2 averaged uniformly over outputs.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import LinearAttentionRegressor
        >>> rng = np.random.default_rng(0)
        >>> X, X_test = rng.normal(size=(50, 4, 2)), rng.normal(size=(20, 6, 2))
        >>> f = lambda X: X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)  # a one-head MHLA
        >>> model = LinearAttentionRegressor().fit(X, f(X))
        >>> round(model.score(X_test, f(X_test)), 6)
        1.0
        """
        Xv, lengths = self._validate_X(X)
        Y, _ = check_targets(y, lengths, Xv.shape[1], readout=self.readout,
                             data_format=self._layout()["data_format"])
        d_out = self.value_matrices_.shape[1]
        if Y.shape[-1] != d_out:
            raise ValueError(
                f"y has {Y.shape[-1]} output(s) per position, but the model was fitted with "
                f"{d_out} (y of shape {np.shape(y)} for readout={self.readout!r}; targets at "
                "every position need readout='all')."
            )
        w = check_sample_weight(sample_weight, Xv.shape[0])
        pred = self._forward(Xv, lengths)
        if self.readout == "all":
            real = real_tokens(lengths, Xv.shape[1])
            Y, pred = Y[real], pred[real]
            if w is not None:
                w = np.broadcast_to(w[:, None], real.shape)[real]
        return float(r2_score(Y, pred, sample_weight=w))

    def __sklearn_tags__(self):
        tags = sequence_tags(super().__sklearn_tags__())
        # Tabular data is read as univariate sequences (d = 1): a cubic model
        # of them cannot fit arbitrary regression data well.
        tags.regressor_tags.poor_score = True
        tags.target_tags.multi_output = True
        return tags
