"""The certificate: verdict, the numbers behind it, and what follows at new inputs."""

from typing import NamedTuple

import numpy as np
import scipy.sparse

from .._namespace import computes_in_namespace
from .._features import attention_features, prefix_features, sparse_feature_rows
from .._memory import sample_chunks, real_tokens
from .._units import TokenStandardizer, pow2_scale, scale_per_sample
from .._validation import check_sequences
from .._params import check_number
from ._rowspace import row_space_from_solution
from ._witness import make_term_witness, make_witness

__all__ = ["IdentifiabilityCertificate"]

# covers() and error_bound() build sparse feature rows for chunks of inputs
# with at most this fraction of non-zero entries (one-hot tokens), when psi is
# at least _SPARSE_MIN_PSI: there the null energy is computed from the
# projection alone, whose cancellation error (a few eps ||h||^2) stays far
# below the coverage rule's relative allowance psi * eps * ||h||^2.
_SPARSE_DENSITY = 0.25
_SPARSE_MIN_PSI = 1000


def _check_epsilon(epsilon):
    return check_number(epsilon, "epsilon", low=0.0)


class _Layout(NamedTuple):
    """How inputs to ``covers`` / ``error_bound`` are read, and the witness input's length."""

    token_dim: int | None = None
    data_format: str = "channels_last"
    n_tokens: int | None = None


class IdentifiabilityCertificate:  # numpydoc ignore=PR01
    """Whether the training inputs identify every linear-attention model that fits them.

    Do not build one directly: use :func:`certify_identifiability`, or read
    ``LinearAttentionRegressor.certificate_`` after a fit.  The object is
    truthy if and only if the certificate holds.  See the user guide's
    :doc:`/certificate` page.

    Attributes
    ----------
    identifiable : bool
        ``min_eigenvalue - min_eigenvalue_error > tol``: every empirical risk
        minimizer computes the same function on every input of every length.
    min_eigenvalue : float
        Smallest eigenvalue of ``Lambda_D`` of the standardized tokens
        (``standardization``): the same for X, ``c * X`` and ``X @ A``.
    min_eigenvalue_error : float
        Bound on the error of ``min_eigenvalue`` beyond rounding: 0 for the
        direct solvers; ``min_eigenvalue - min_eigenvalue_error`` is a lower
        bound (:ref:`certificate-solvers`).
    max_eigenvalue : float
        Largest eigenvalue of ``Lambda_D``.
    standardization : TokenStandardizer
        The standardized coordinates of the spectrum; ``covers``,
        ``error_bound`` and ``witness`` answer in the data's own units.
    eigenvalues : ndarray of shape (psi,) or None
        All eigenvalues of ``Lambda_D``, decreasing, clipped at 0; None with
        solver "cg".
    tol : float
        The threshold used: eigenvalues ``<= tol`` count as zero.
    rank : int
        Number of eigenvalues above ``tol``; ``rank == n_features`` iff
        identifiable.  An upper bound when ``rank_is_bound``.
    rank_is_bound : bool
        Whether ``rank`` is an upper bound rather than the rank ("cg" on a
        design that is not identifiable).
    n_features : int
        Number of cubic features psi = d**2 (d + 1) / 2, plus ``n_terms``.
    n_terms : int
        Number of intercept and skip columns (1 + d with both, 0 without);
        ``rank`` and the verdict then cover them too.
    term_min_eigenvalue : float or None
        Least fraction, in [0, 1], of any combination of the term columns
        that attention cannot reproduce on the training rows; None without terms.
    n_features_in : int
        Token dimension d.
    n_samples : int
        Number of training sequences.
    n_rows : int
        Number N of feature rows of positive weight: one per sequence for
        ``readout="last"``, one per real token for ``readout="all"``.
    weight_sum : float
        Sum of the row weights (``n_rows`` without sample weights).
    method : str
        The solver whose spectrum the certificate reads.
    readout : {"last", "all"}
        Which feature rows the certificate is about.
    dtype : numpy dtype
        Least precise floating dtype of the training sequences.

    See Also
    --------
    certify_identifiability : build a certificate from sequences.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import certify_identifiability
    >>> cert = certify_identifiability(np.random.default_rng(0).normal(size=(40, 5, 3)))
    >>> bool(cert), cert.rank, cert.n_features
    (True, 18, 18)
    """

    def __init__(self, row_space, stats, *, readout, standardizer=None, layout=_Layout(),  # numpydoc ignore=PR01,EX01
                 coef=None, terms=None):
        """Built by :meth:`_from_solution`; ``coef`` is the fitted standardized model, if any."""
        self._row_space = row_space
        self._terms = terms
        self.n_features_in = int(stats.d)
        self.n_features = row_space.n_features
        self.n_rows = int(stats.n_rows)
        self.n_samples = int(stats.n_samples)
        self.readout = readout
        self.dtype = np.dtype(stats.dtype)
        self._layout = layout
        # Fitted coefficients of the standardized problem (see ``standardization``).
        self._coef = None if coef is None else np.array(coef, dtype=np.float64)
        self.standardization = (
            TokenStandardizer.identity(self.n_features_in) if standardizer is None
            else standardizer
        )
        self.method = row_space.method
        self.tol = row_space.tol
        self.max_eigenvalue = row_space.lambda_max
        self.min_eigenvalue = row_space.lambda_min
        self.min_eigenvalue_error = row_space.lambda_min_error
        self.identifiable = row_space.identifiable
        self.rank = row_space.rank
        self.rank_is_bound = row_space.rank_is_bound
        self.n_terms = 0 if terms is None else terms.n_terms
        self.term_min_eigenvalue = None if terms is None else terms.min_eigenvalue
        if terms is not None:
            self.n_features += terms.n_terms
            self.rank += terms.rank
            self.identifiable = self.identifiable and terms.identifiable

    @classmethod
    def _from_solution(
        cls, solution, stats, *, readout, tol=None, token_dim=None, data_format="channels_last",
        n_tokens=None, coef=None, terms=None, row_space=None,
    ):
        """Certificate from the spectrum a fit already computed (no second pass).

        ``tol=None`` uses the fit's ``solution.tol / W``; ``coef``, when given,
        is the witness's ``model_a``; ``row_space`` may be passed to share it.
        """
        if row_space is None:
            row_space = row_space_from_solution(solution, stats, tol)
        return cls(
            row_space, stats, readout=readout,
            standardizer=solution.standardizer,
            layout=_Layout(token_dim, data_format, n_tokens), coef=coef, terms=terms,
        )

    @property
    def weight_sum(self):
        """Sum of the row weights (``n_rows`` without sample weights).

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import certify_identifiability
        >>> X = np.random.default_rng(0).normal(size=(30, 4, 2))
        >>> certify_identifiability(X, sample_weight=np.full(30, 0.5)).weight_sum
        15.0
        """
        # The row space's W is in the standardized weights' units.
        return self.standardization.weights_to_user(self._row_space.weight_sum)

    @property
    def eigenvalues(self):
        """All eigenvalues of Lambda_D, decreasing (None when not computed).

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import certify_identifiability
        >>> cert = certify_identifiability(np.random.default_rng(0).normal(size=(30, 4, 2)))
        >>> w = cert.eigenvalues
        >>> w.shape, bool(w[0] == cert.max_eigenvalue), bool(w[-1] == cert.min_eigenvalue)
        ((6,), True, True)
        """
        return self._row_space.eigenvalues

    def _quadratic(self, C):
        """``c^T Lambda_D c`` for each row c of C (..., psi), or None with solver "cg"."""
        return self._row_space.quadratic(np.atleast_2d(np.asarray(C, dtype=np.float64)))

    # ------------------------------------------------------------------ display

    def __bool__(self):
        return self.identifiable

    def __repr__(self):
        return (
            f"IdentifiabilityCertificate(identifiable={self.identifiable}, "
            f"min_eigenvalue={self.min_eigenvalue:.3g}, tol={self.tol:.3g}, "
            f"rank={self.rank}, n_features={self.n_features}, "
            f"n_samples={self.n_samples}, readout={self.readout!r})"
        )

    def _tol_rule(self):
        if not self._row_space.tol_is_default:
            return "user-supplied"
        eps64 = float(np.finfo(np.float64).eps)
        eps_in = float(np.finfo(self.dtype).eps) if self.dtype.kind == "f" else 0.0
        if eps_in**2 > eps64:
            return f"lambda_max * psi * eps({self.dtype.name})**2, eps**2 = {eps_in**2:.2g}"
        return f"lambda_max * psi * eps(float64), eps = {eps64:.2g}"

    def summary(self):
        """A readable multi-line report of the certificate.

        Returns
        -------
        text : str
            Verdict, what it means, the numbers behind it and what to do next;
            ``print`` it.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import certify_identifiability
        >>> cert = certify_identifiability(np.random.default_rng(0).normal(size=(14, 4, 3)))
        >>> print(cert.summary())  # doctest: +ELLIPSIS
        Identifiability certificate: NOT IDENTIFIABLE
          4 of the 18 coefficient directions are not determined by these inputs:
        ...
          rank         14 of psi = 18
          data         14 sequences of d = 3, N = 14 feature rows (readout='last')
        ...
        """
        psi = self.n_features
        lines = []
        if self.identifiable:
            lines += [
                "Identifiability certificate: IDENTIFIABLE",
                "  Every empirical risk minimizer computes the same function on every input",
                "  of every length (Lemma A.3 of Yau et al.).",
            ]
        else:
            k = psi - self.rank
            are = "is" if k == 1 else "are"
            lines += [
                "Identifiability certificate: NOT IDENTIFIABLE",
                f"  {k} of the {psi} coefficient directions {are} not determined by these inputs:",
                "  models that fit the training data equally well can disagree on new inputs.",
            ]
        lam_note = "smallest eigenvalue of Lambda_D (standardized tokens)"
        if self.min_eigenvalue_error > 0:
            lam_note += f" (+/- {self.min_eigenvalue_error:.2g}, solver={self.method!r})"
        lines += [
            f"  lambda_min   {self.min_eigenvalue:<10.4g}  {lam_note}",
            f"  lambda_max   {self.max_eigenvalue:<10.4g}",
            f"  tol          {self.tol:<10.4g}  {self._tol_rule()}",
            f"  rank         {'at most ' if self.rank_is_bound else ''}{self.rank} of "
            + (f"psi = {psi}" if not self.n_terms else
               f"{psi} (psi = {psi - self.n_terms} and {self.n_terms} term columns)"),
        ]
        if self._terms is not None:
            lines += [
                f"  terms        {self.n_terms} intercept/skip columns, {self._terms.rank} "
                f"determined (least unexplained fraction {self.term_min_eigenvalue:.3g}, "
                f"tol {self._terms.tol:.2g})",
            ]
        lines += [
            f"  data         {self.n_samples} sequences of d = {self.n_features_in}, "
            f"N = {self.n_rows} feature rows (readout={self.readout!r})",
        ]
        if not self.identifiable:
            covers = (
                "covers(X) tells which" if self._row_space.resolves_null_space
                else "covers(X) needs a dense solver;"
            )
            lines += [
                f"  next steps   witness() builds two such models; {covers}",
                "               inputs are still certified; more varied inputs may help",
            ]
            if self.n_rows < psi:
                lines += [f"               (N >= psi = {psi} feature rows at least)."]
            else:
                lines[-1] += "."
        return "\n".join(line.rstrip() for line in lines)

    # ------------------------------------------------------------------ per input

    def _input_rows(self, X_new):
        """Per sequence of X_new: covered (bool), the largest leverage and its scale f.

        The sequence's leverage is ``leverage * 2**(6 f)``, returned apart
        since it may exceed float64.
        """
        X, lengths = check_sequences(
            X_new, token_dim=self._layout.token_dim, data_format=self._layout.data_format,
            n_features_in=self.n_features_in, name="X_new",
            expected_by="the certificate is about tokens of that dimension",
        )
        space, st = self._row_space, self.standardization
        if not self._row_space.identifiable and not space.resolves_null_space:
            raise space.unavailable("covers() and error_bound() on a failed certificate")
        n_samples = X.shape[0]
        rows_per_sample = 1 if self.readout == "last" else X.shape[1]
        covered = np.empty(n_samples, dtype=bool)
        leverage = np.empty(n_samples)
        scale = np.zeros(n_samples, dtype=np.int64)
        # Sparse rows give coordinates in a basis, not the factor's solves.
        terms = self._terms
        if terms is not None and not self._row_space.identifiable and (
                not space.resolves_null_space):
            raise space.unavailable("covers() and error_bound() on a failed certificate")
        sparse_ok = (space.resolves_null_space and self.n_features >= _SPARSE_MIN_PSI
                     and terms is None)
        for sl in sample_chunks(n_samples, rows_per_sample * self.n_features):
            Xc, f = scale_per_sample(st.transform(X[sl]))
            scale[sl] = f
            if sparse_ok and np.count_nonzero(Xc) <= _SPARSE_DENSITY * Xc.size:
                Hs, sample = sparse_feature_rows(Xc, lengths[sl], self.readout,
                                                 decays=st.decays)
                if st.whitened:
                    Hs = Hs @ scipy.sparse.diags(st.scale_features(np.ones(self.n_features)))
                row_cov, lev = space.sparse_coverage(Hs)
                n = Xc.shape[0]
                covered[sl] = np.bincount(sample, weights=~row_cov, minlength=n) == 0
                worst = np.full(n, -np.inf)
                np.maximum.at(worst, sample, np.where(row_cov, lev, np.inf))
                leverage[sl] = worst
                continue
            if self.readout == "last":
                H = attention_features(Xc, lengths[sl], st.decays)[:, None, :]
            else:
                H = prefix_features(Xc, lengths[sl], st.decays)  # padded rows are zero
            H = st.scale_features(H)
            row_cov, lev = space.coverage(H)
            if terms is not None:
                row_cov, lev = self._with_terms(X[sl], lengths[sl], H, f, row_cov, lev)
            covered[sl] = row_cov.all(axis=1)
            leverage[sl] = np.where(row_cov, lev, np.inf).max(axis=1)
        return covered, leverage, scale

    def _with_terms(self, X, lengths, H, f, row_cov, lev):
        """Coverage and leverage of rows with their intercept and skip columns (at ``2**-f``)."""
        terms = self._terms
        E = terms.terms.standardized_rows(X, lengths, self.readout, self.standardization)
        E = E[:, None, :] if self.readout == "last" else E
        with np.errstate(over="ignore", invalid="ignore"):
            R = terms.residuals(E, pow2_scale(H, 3 * f[:, None, None]))
            lev_terms = terms.leverage(R)
            lev = lev + pow2_scale(lev_terms, -6 * f[:, None])
        cov = row_cov & terms.covered(R, E)
        if self.readout == "all":  # padded rows have no term columns
            pad = ~real_tokens(lengths, X.shape[1])
            cov = cov | pad
            lev = np.where(pad, 0.0, lev)
        return cov, np.where(np.isnan(lev), np.inf, lev)

    @computes_in_namespace
    def covers(self, X_new):
        """Which inputs every empirical risk minimizer agrees on.

        An input is covered when its feature vector lies in the span of the
        training feature rows, up to the certificate's tolerance
        (:ref:`certificate-coverage`); then all minimizers agree on it, whether
        or not the certificate holds.  When it holds, every input is covered.

        Parameters
        ----------
        X_new : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length; trailing all-NaN tokens are padding.

        Returns
        -------
        covered : ndarray of bool, shape (n_samples,)
            With ``readout="last"``: whether the whole sequence's features are
            in the training span.  With ``readout="all"``: whether the features
            of every prefix are.

        Raises
        ------
        ValueError
            On a failed certificate whose solver found no null space ("cg").

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import certify_identifiability
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(30, 4, 3))
        >>> X[:, :, 2] = 0.0  # the third coordinate never varies in training
        >>> cert = certify_identifiability(X)
        >>> bool(cert)
        False
        >>> X_new = rng.normal(size=(2, 7, 3))
        >>> X_new[0, :, 2] = 0.0  # inside the training span, longer sequence
        >>> cert.covers(X_new)
        array([ True, False])
        """
        return self._input_rows(X_new)[0]

    @computes_in_namespace
    def error_bound(self, X_new, epsilon):
        """How far two epsilon-approximate empirical risk minimizers can disagree.

        The bound is ``2 sqrt(epsilon * h^T Lambda_D^+ h)`` at features h,
        attained by some pair of models (coarser with solver "cg"; see
        :ref:`certificate-error-bound`).

        Parameters
        ----------
        X_new : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Inputs at which to bound the disagreement.
        epsilon : float >= 0
            Excess empirical risk allowed to each model: ``R(c) - min R <=
            epsilon``, with R the (weighted) mean over the training feature rows
            of the squared error summed over outputs.

        Returns
        -------
        bound : ndarray of shape (n_samples,)
            ``bound[i] >= ||f_1(Z_i) - f_2(Z_i)||`` for any two such models; the
            largest over the positions with ``readout="all"``; ``inf`` at inputs
            that are not covered (see :meth:`covers`).

        Raises
        ------
        ValueError
            On a failed certificate whose solver found no null space ("cg").

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import certify_identifiability
        >>> rng = np.random.default_rng(0)
        >>> cert = certify_identifiability(rng.normal(size=(200, 5, 2)))
        >>> bound = cert.error_bound(rng.normal(size=(3, 5, 2)), epsilon=1e-6)
        >>> bound.shape, bool(np.all(np.isfinite(bound)))
        ((3,), True)
        """
        epsilon = _check_epsilon(epsilon)
        covered, leverage, scale = self._input_rows(X_new)
        out = np.full(covered.shape, np.inf)
        out[covered] = pow2_scale(2.0 * np.sqrt(epsilon * leverage[covered]), 3 * scale[covered])
        return out

    # ------------------------------------------------------------------ witness

    def witness(self, random_state=None):
        """Two models that fit the training inputs identically but differ elsewhere.

        Parameters
        ----------
        random_state : int, RandomState instance or None, default=None
            Seeds the candidate inputs (and the base model when the
            certificate does not come from a fitted regressor).

        Returns
        -------
        witness : Witness
            ``model_a`` (the fitted model for a regressor's ``certificate_``,
            else a random one), ``model_b`` and an ``input`` that is never
            covered, where they differ (:ref:`certificate-witness`).

        Raises
        ------
        ValueError
            If the certificate holds (no two minimizers differ anywhere), or if
            no random candidate input leaves the training span.

        Examples
        --------
        >>> import numpy as np
        >>> from sklearn_linattn import certify_identifiability
        >>> X = np.random.default_rng(0).normal(size=(30, 4, 3))
        >>> X[:, :, 2] = 0.0
        >>> w = certify_identifiability(X).witness(random_state=0)
        >>> w.input.shape
        (4, 3)
        >>> bool(certify_identifiability(X).covers(w.input[None])[0])
        False
        """
        if self.identifiable:
            raise ValueError(
                "no witness exists: the certificate holds (min_eigenvalue "
                f"{self.min_eigenvalue:.3g} > tol {self.tol:.3g}), so every empirical "
                "risk minimizer computes the same function on every input."
            )
        if self._row_space.identifiable:
            return make_term_witness(
                self._terms, self.standardization, self._layout, d=self.n_features_in,
                coef=self._coef, readout=self.readout, random_state=random_state,
            )
        return make_witness(
            self._row_space, self.standardization, self._layout, d=self.n_features_in,
            coef=self._coef, random_state=random_state, terms=self._terms,
        )
