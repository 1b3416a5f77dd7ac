"""The certificate: verdict, the numbers behind it, and what follows at new inputs.

:class:`IdentifiabilityCertificate` holds one representation of ``Lambda_D``
(:mod:`._rowspace`) and the few facts about the training data its answers
need; how the solver represented ``Lambda_D`` is the row space's business.
"""

from typing import NamedTuple

import numpy as np
import scipy.sparse

from .._features import attention_features, prefix_features, sparse_feature_rows
from .._memory import sample_chunks, real_tokens
from .._standardize import TokenStandardizer, scale_per_sample
from .._standardize import ldexp
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
    truthy if and only if the certificate holds.

    Attributes
    ----------
    identifiable : bool
        ``min_eigenvalue - min_eigenvalue_error > tol``: every empirical risk
        minimizer computes the same function on every input of every length.
    min_eigenvalue : float
        Smallest eigenvalue of ``Lambda_D = (1/N) Phi^T Phi``, with ``Phi``
        the N feature rows of the standardized tokens (``standardization``:
        whitened to unit second moment, the off-diagonal moments weighted by
        sqrt(2)), so that it is the same for X, ``c * X`` and ``X @ A`` for
        any invertible A.  For tokens whose second moment is the identity it
        lies between the paper's lambda_min (Algorithm 2 features) and twice
        it.  With sample weights, ``Lambda_D = Phi^T W Phi / sum(w)``.
    min_eigenvalue_error : float
        Bound on the error of ``min_eigenvalue`` beyond rounding: 0 for the
        direct solvers ("eigh", "svd", "dual", "lsmr"; their error is
        rounding, about ``psi * eps * max_eigenvalue``); the relative Lanczos
        accuracy 1e-10 times the value for "cholesky".  For "cg",
        ``min_eigenvalue`` is a Rayleigh quotient (never below the true
        lambda_min) and ``min_eigenvalue - min_eigenvalue_error`` a lower
        bound that holds except with probability 8e-4 over the certificate's
        random probes (two standard normal probes solved with the fit, the
        chi-squared bound of the theory page; refined by LOBPCG when it
        leaves the verdict open), so the two
        bracket lambda_min; values and residuals are float64 even on a
        float32 cache.  The user guide's theory page describes the bounds and
        how tight they are.
    max_eigenvalue : float
        Largest eigenvalue of ``Lambda_D``.
    standardization : TokenStandardizer
        The standardized coordinates the spectrum is computed in:
        ``standardization.transform(X)`` gives the standardized tokens, and
        ``covers``, ``error_bound`` and ``witness`` standardize their inputs
        alike (their answers are in the data's own units).
    eigenvalues : ndarray of shape (psi,) or None
        All eigenvalues of ``Lambda_D``, in decreasing order (clipped at 0).
        With solver "cholesky" they are computed on first access (a dense
        eigenvalue decomposition, O(psi^3)); with "cg" they are never
        computed (None).
    tol : float
        The threshold used: eigenvalues ``<= tol`` count as zero.  By default
        ``max_eigenvalue * psi * max(eps64, eps_in**2)``, see Notes of
        :func:`certify_identifiability`.
    rank : int
        Number of eigenvalues above ``tol``; ``rank == n_features`` iff
        identifiable.  With solver "cg" on a design that is not identifiable
        only an upper bound (``rank_is_bound``).
    rank_is_bound : bool
        Whether ``rank`` is an upper bound rather than the rank.
    n_features : int
        Number of cubic features psi = d**2 (d + 1) / 2, plus ``n_terms``.
    n_terms : int
        Number of intercept and skip columns of a model fitted with
        ``fit_intercept`` / ``fit_skip`` (1 + d with both; 0 without).  The
        certificate is then about the whole linear class: it holds iff
        Lambda_D's verdict holds and the term columns are determined
        (``term_min_eigenvalue`` above its rounding threshold, see the user
        guide); ``rank`` counts both.
    term_min_eigenvalue : float or None
        Smallest eigenvalue of the term columns' Schur complement
        ``E^T W (I - Pi) E`` relative to ``E^T W E`` (``Pi`` the projection on
        the span of the attention features over the training rows): the least
        fraction of any combination of the term columns that attention cannot
        reproduce, in [0, 1].  None without terms.
    n_features_in : int
        Token dimension d.
    n_samples : int
        Number of training sequences.
    n_rows : int
        Number N of feature rows: ``n_samples`` for ``readout="last"``, the
        number of real tokens (one row per prefix) for ``readout="all"``;
        rows of weight zero do not count.
    weight_sum : float
        Sum of the row weights (``n_rows`` without sample weights).
    method : str
        The solver whose spectrum the certificate reads: "eigh", "svd" and
        "dual" keep eigenvectors (what ``covers``, ``error_bound`` and
        ``witness`` use; psi x rank floats), "cholesky" keeps the Cholesky factor of the Gram matrix
        instead (same size), "cg" keeps the eigenvector of lambda_min only,
        "lsmr" keeps eigenvectors in the coordinates of the m active columns
        (m x rank floats; the inactive columns are null directions).
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
        """Built by :meth:`_from_solution`.

        ``row_space`` is the solver's representation of Lambda_D at the
        certificate's threshold (``_rowspace``); ``stats`` gives the token
        dimension, the row and sample counts and the dtype; ``layout`` says
        how inputs of ``covers`` / ``error_bound`` are read and how long the
        witness input is; ``coef`` is the fitted standardized model, the
        witness's ``model_a``; ``terms`` (a ``_terms.TermSpace``) the
        intercept and skip columns of a model fitted with them.
        """
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

        Parameters
        ----------
        solution : SpectralSolution
            From :func:`sklearn_linattn._solvers.solve` or
            :func:`~sklearn_linattn._solvers.solve_statistics`: what its solver
            computed of the spectrum of ``Phi^T W Phi`` and the tolerance on it.
        stats : SufficientStatistics
            The statistics the solution came from (row and sample counts,
            weights, dtype).
        readout : {"last", "all"}
            Readout the feature rows were built for.
        tol : float or None
            Threshold on the eigenvalues of ``Lambda_D``; None uses the fit's
            ``solution.tol / W``, W the weight sum (the same rule, in
            Lambda_D's units).
        token_dim : int or None
            How 2-D input to ``covers`` / ``error_bound`` is reshaped.
        data_format : {"channels_last", "channels_first"}
            Layout of the inputs of ``covers`` / ``error_bound`` and of the
            witness input.
        n_tokens : int or None
            Length of the witness input (default: the token dimension plus one).
        coef : ndarray of shape (d_out, psi) or None
            Fitted coefficients of the standardized problem
            (``solution.coef``); when given, the witness's
            ``model_a`` is this fitted model.
        terms : TermSpace or None
            The intercept and skip columns of the fit (``_terms``), if any.
        row_space : RowSpace or None
            ``row_space_from_solution(solution, stats, tol)`` when the caller
            built it already (to share it).
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
        return float(np.ldexp(self._row_space.weight_sum, self.standardization.weight_exponent))

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
        """``c^T Lambda_D c`` for each row c of C (..., psi) in the certificate's coordinates.

        The excess empirical risk of coefficients ``c* + c`` over a minimizer
        ``c*`` (and the explained energy of ``c*`` itself); None when the
        certificate holds no representation of ``Lambda_D`` (``"cg"``).
        """
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
        """Per sequence of X_new: covered (bool), the largest leverage and its scale.

        The inputs are standardized like the training data and each sequence
        is then scaled by a power of two ``2**-f`` into [1, 2), so that its
        features can be formed at any magnitude: the leverage of the
        sequence is ``leverage * 2**(6 f)`` (returned apart, since it may
        exceed float64) and its coverage is decided on the scaled features
        with the absolute allowance scaled alike.
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
        """Coverage and leverage of rows with their intercept and skip columns.

        The leverage of the whole row ``[e, h]`` is ``h^T Lambda_D^+ h`` plus
        that of the term residual ``r = e - c_E h`` in ``K / W`` (block
        elimination); both are returned at the sequence's scale ``2**-f``.
        """
        terms = self._terms
        E = terms.terms.standardized_rows(X, lengths, self.readout, self.standardization)
        E = E[:, None, :] if self.readout == "last" else E
        with np.errstate(over="ignore", invalid="ignore"):
            R = terms.residuals(E, ldexp(H, 3 * f[:, None, None]))
            lev_terms = terms.leverage(R)
            lev = lev + ldexp(lev_terms, -6 * f[:, None])
        cov = row_cov & terms.covered(R, E)
        if self.readout == "all":  # padded rows have no term columns
            pad = ~real_tokens(lengths, X.shape[1])
            cov = cov | pad
            lev = np.where(pad, 0.0, lev)
        return cov, np.where(np.isnan(lev), np.inf, lev)

    def covers(self, X_new):
        """Which inputs every empirical risk minimizer agrees on.

        An input Z is covered when its feature vector H(Z) lies in the span of
        the training feature rows; then ``<c1 - c2, H(Z)> = 0`` for any two
        minimizers c1, c2, whether or not the global certificate holds.

        Parameters
        ----------
        X_new : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Sequences of any length; trailing all-NaN tokens are padding.

        Returns
        -------
        covered : ndarray of bool, shape (n_samples,)
            With ``readout="last"``: whether H(Z) of the whole sequence is in
            the training span.  With ``readout="all"``: whether the features
            of *every* prefix are, i.e. whether all minimizers agree at every
            position of the sequence.

        Notes
        -----
        "In the span" uses the certificate's tolerance.  With ``U_0`` the
        eigenvectors of ``Lambda_D`` whose eigenvalues are ``<= tol`` (in the
        standardized coordinates of ``standardization``), an input with
        features h is covered when

            ||U_0^T h||**2 <= max(tol, r) * h^T Lambda_D^+ h + (r / lambda_max) * ||h||**2,

        with ``r`` the threshold of the package's rule (``r = tol`` unless a
        ``tol`` was passed) and ``Lambda_D^+`` over the eigenvalues above
        tol.  The first term is what an input exactly in the span of the
        training rows can show in those directions (if ``h = Phi^T b``,
        ``||U_0^T h||**2 <= N tol ||b||**2`` and the smallest such
        ``||b||**2`` is ``h^T Lambda_D^+ h / N``); the second allows rounding
        relative to the input itself.  Both scale like ``||h||**2``, so the
        answer does not depend on the scale of X_new (nor, through the
        standardization, on the units of the data).  Training inputs are
        covered, unless a ``tol`` declares directions they use undetermined
        (with a ``tol`` above every eigenvalue nothing is covered).  When the
        certificate holds there are no such directions and every input is
        covered.  A failed certificate from ``solver="cg"`` cannot answer (it
        has one null direction, not the null space) and raises a ValueError.

        Inputs whose entries are mostly zero (at most a quarter, e.g. one-hot
        tokens) get sparse feature rows when psi >= 1000; the null energy is
        then ``||h||**2 - 2 p.p + p^T (U^T U) p`` with ``p = U^T h`` for the
        row basis U, whose cancellation error (a few ``eps * ||h||**2``) is
        far below the rule's relative allowance.  Same answers, at the cost
        of the non-zeros (600 held-out prefixes of a DFA executor at psi =
        22 050: 0.02 s instead of 0.4 s).

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

    def error_bound(self, X_new, epsilon):
        """How far two epsilon-approximate empirical risk minimizers can disagree.

        Parameters
        ----------
        X_new : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
            Inputs at which to bound the disagreement.
        epsilon : float >= 0
            Excess empirical risk allowed to each model: ``R(c) - min R <=
            epsilon`` with ``R(c) = (1/N) sum_rows ||y_row - c H_row||**2``,
            the squared error summed over outputs and averaged over the N
            training feature rows (for one output, the mean squared error of
            :func:`sklearn.metrics.mean_squared_error`; with ``readout="all"``
            averaged over every real position).

        Returns
        -------
        bound : ndarray of shape (n_samples,)
            ``bound[i] >= ||f_1(Z_i) - f_2(Z_i)||`` (Euclidean norm over
            outputs) for any two linear-attention models ``f_1, f_2`` whose
            excess risk is at most epsilon.  ``readout="all"``: the largest
            bound over the positions of the sequence.  ``inf`` at inputs that
            are not covered (see :meth:`covers`), where exact minimizers
            already disagree arbitrarily.

        Notes
        -----
        The empirical risk is quadratic, so at any minimizer ``c*`` the excess
        risk of ``c`` is exactly ``(c - c*)^T Lambda_D (c - c*)`` (per output,
        summed).  Two models within epsilon of the minimum thus satisfy
        ``||c1 - c2||_Lambda <= 2 sqrt(epsilon)``, and for h = H(Z) in the
        span of Lambda_D, Cauchy-Schwarz in the Lambda_D metric gives

            ||f_1(Z) - f_2(Z)|| <= 2 sqrt(epsilon * h^T Lambda_D^+ h)

        which is what is returned (``Lambda_D^+`` over eigenvalues above
        ``tol``).  It is attained by some pair, and it implies the coarser
        forms ``2 sqrt(epsilon / lambda_min) ||H(Z)||`` and, because
        ``||H(Z)|| <= ||S||_F ||x_last|| <= ||Z||_F**3``,
        ``2 sqrt(epsilon / lambda_min) ||Z||_F**3``.  Squared, that is the
        paper's Lemma A.7, ``(epsilon / lambda_min) ||Z||_F**6``, with a
        factor 4 for two models each within epsilon of the minimum.

        With sample weights R is the weighted mean ``(1/W) sum_rows w_row
        ||...||**2``.  A certificate from ``solver="cg"`` has no inverse of
        Lambda_D and returns the coarser ``2 sqrt(epsilon / lambda_min)
        ||H(Z)||`` (still a bound, not attained; lambda_min is lowered by its
        error bound); on a failed one it raises a ValueError.

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
        out[covered] = np.ldexp(2.0 * np.sqrt(epsilon * leverage[covered]), 3 * scale[covered])
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
            ``model_a`` and ``model_b`` as ``(V, Q)`` pairs and one ``input``
            sequence.  Their coefficients differ by a multiple of a null
            vector w of the training features, so their outputs on every
            training input agree to rounding (up to ``sqrt(N * tol) * ||w||``
            in exact terms); at the last position of ``input`` they differ by
            ``a * ||H(input)||`` in every output, with ``a`` the largest row
            norm of model_a's coefficients (both in the standardized
            coordinates, ``standardization``; the outputs are in the units of
            the targets), as large as model_a's own output there can be.
            ``model_a`` is the fitted model when the certificate is a
            regressor's ``certificate_``, otherwise a random one.  The input
            is never covered (:meth:`covers`).  With ``solver="cg"`` the null
            vector is the computed eigenvector of lambda_min (the training
            outputs then differ by at most ``sqrt(W * (min_eigenvalue +
            min_eigenvalue_error))`` times the shift's size).

        Raises
        ------
        ValueError
            If the certificate holds: then no two minimizers differ anywhere.

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
