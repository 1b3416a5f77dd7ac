"""The identifiability certificate of the paper's Lemma A.3, and what follows.

Every one-layer multi-head linear attention computes ``y = C @ H(Z)`` for its
folded coefficients C (DESIGN.md section 1).  Two empirical risk minimizers
therefore differ by coefficients in the null space of the feature rows, and
they compute the same function on *every* input exactly when that null space
is trivial, i.e. when the second-moment matrix

    Lambda_D = (1/N) sum_i H(Z_i) H(Z_i)^T          (psi x psi)

of the N training feature rows has a positive smallest eigenvalue (with
sample weights, ``Lambda_D = sum_i w_i H_i H_i^T / sum_i w_i`` over the rows
of positive weight: a weight of 2 counts a sequence twice, a weight of 0
drops it).  This module turns what the fit's solver already computed about
the spectrum of ``Phi^T W Phi`` (:class:`~._solvers.SpectralSolution`) into:

- the verdict (``bool(certificate)``), using the one zero-eigenvalue rule
  :func:`~._solvers.eigenvalue_tolerance` that the fit's pseudo-inverse uses;
- a witness of a failed certificate: two MHLAs that agree on the training
  inputs and disagree on a given input;
- per-input coverage: inputs whose features lie in the training span, where
  all minimizers agree even when the certificate fails;
- a bound on how far two approximate minimizers can disagree at an input.

Mapping to the paper: ``X[i]`` (n_tokens x d) is the paper's ``Z_i^T``.
"""

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse

from ._features import (
    attention_features,
    n_attention_features,
    prefix_features,
    sparse_feature_rows,
)
from ._heads import heads_from_coefficients
from ._memory import iter_sample_chunks
from ._solvers import SOLVERS, solve_arrays, solve_eigh
from ._standardize import TokenStandardizer, scale_per_sample
from ._validation import (
    check_data_format,
    check_scalar,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_token_dim,
    to_data_format,
    validate_random_state,
)

__all__ = ["IdentifiabilityCertificate", "Witness", "certify_identifiability"]

# covers() and error_bound() build sparse feature rows for chunks of inputs
# with at most this fraction of non-zero entries (one-hot tokens), when psi is
# at least _SPARSE_MIN_PSI: there the null energy is computed from the
# projection alone, whose cancellation error (a few eps ||h||^2) stays far
# below the coverage rule's relative allowance psi * eps * ||h||^2.
_SPARSE_DENSITY = 0.25
_SPARSE_MIN_PSI = 1000

# Random candidate inputs tried by ``witness``; the one whose features stick
# out of the training span the most (relative to their norm) is returned.
_WITNESS_CANDIDATES = 16


def _check_tol(tol):
    return check_scalar(tol, "tol", low=0.0, allow_none=True)


def _check_epsilon(epsilon):
    return check_scalar(epsilon, "epsilon", low=0.0)


@dataclass(frozen=True, eq=False, repr=False)
class Witness:
    """Two attention models that a failed certificate cannot tell apart.

    Returned by :meth:`IdentifiabilityCertificate.witness`.  Both models give
    the same outputs on every training input (to rounding: their coefficient
    difference lies in the numerical null space of the training features),
    and clearly different outputs at the last position of ``input``.

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
        Unit vector of folded coefficients, in the null space of the training
        features, along which the two models differ: ``p(model_b) - p(model_a)``
        is a multiple of it in every output row.

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

    def __repr__(self):
        return (
            f"Witness(model_a={self.model_a[0].shape[0]} heads, "
            f"model_b={self.model_b[0].shape[0]} heads, "
            f"input of shape {self.input.shape})"
        )


class IdentifiabilityCertificate:
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
        direct solvers ("eigh", "svd", "dual", "lsmr"; their error is rounding, about
        ``psi * eps * max_eigenvalue``); the relative Lanczos accuracy 1e-10
        times the value for "cholesky".  For "cg", ``min_eigenvalue`` is a
        Rayleigh quotient (never below the true lambda_min) and
        ``min_eigenvalue - min_eigenvalue_error`` a lower bound, so the two
        bracket lambda_min.  The lower bound comes first from preconditioned
        CG on ``Lambda_D x = b`` for a standard normal b: ``(delta - ||r||) /
        ||x||`` with r the exact residual and delta = 1e-3 bounds lambda_min
        from below except with probability ``delta sqrt(2 / pi) = 8e-4`` over
        b, whatever the data (it is far below lambda_min, measured 2e-5 to
        3e-3 times it on Gaussian designs with d = 4 to 64 and N / psi = 1.1
        to 10, lowest at the largest psi: enough for the verdict, coarse for
        ``error_bound``).  When
        that leaves the verdict undecided, LOBPCG refines the interval: its
        Ritz value's residual ``r = ||Lambda_D v - min_eigenvalue v||``, or
        the Kato-Temple bound ``r**2 / (mu - min_eigenvalue)`` once the next
        Ritz value minus its residual, mu, lies above it (valid when LOBPCG
        has found the two smallest eigenvalues, as it does from a random
        start); it stops when this error is below 1e-4 times the value,
        after 300 iterations, or once its rate of progress, extrapolated to
        300 iterations, would reach neither that accuracy nor a decided
        verdict.  Values and residuals are computed in float64 even when
        "cg" multiplies by a float32 cache of the row factors.
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
        Number of cubic features psi = d**2 (d + 1) / 2.
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
        ``witness`` use; psi x rank floats, 38 MB at d = 16 when
        identifiable), "cholesky" keeps the Cholesky factor of the Gram matrix
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

    def __init__(
        self,
        eigenvalues,
        eigenvectors,
        *,
        n_rows,
        n_samples,
        n_features_in,
        readout,
        dtype,
        tol,
        tol_is_default,
        rounding_tol=None,
        token_dim=None,
        data_format="channels_last",
        n_tokens=None,
        coef=None,
        weight_sum=None,
        min_weight=1.0,
        min_eigenvalue=None,
        max_eigenvalue=None,
        min_eigenvalue_error=0.0,
        factor=None,
        null_vector=None,
        rank=None,
        trace=None,
        method="eigh",
        active=None,
        standardizer=None,
    ):
        # Everything is in the units of Lambda_D except ``factor``, the
        # Cholesky factor of the unnormalised Phi^T W Phi (= weight_sum * Lambda_D).
        self.n_features_in = int(n_features_in)
        self.n_features = n_attention_features(self.n_features_in)
        self._eigenvalues = (
            None if eigenvalues is None else np.asarray(eigenvalues, dtype=np.float64)
        )
        if self._eigenvalues is not None and self._eigenvalues.shape != (self.n_features,):
            raise ValueError(
                f"{self._eigenvalues.shape[0]} eigenvalues do not match token dimension "
                f"d={self.n_features_in} (psi = {self.n_features})."
            )
        self._eigenvectors = (
            None if eigenvectors is None else np.asarray(eigenvectors, dtype=np.float64)
        )
        if self._eigenvalues is None and self._eigenvectors is not None:
            raise ValueError("eigenvectors need their eigenvalues.")
        # Columns of the eigenvectors' coordinates (solver "lsmr": the active
        # columns; the others are null directions); None: all psi columns.
        self._active = None if active is None else np.asarray(active, dtype=np.intp)
        self._basis_gram = None  # U^T U of the row basis, for sparse coverage
        self.n_rows = int(n_rows)
        self.n_samples = int(n_samples)
        # In the standardized weights' units (see ``weight_sum`` for the user's).
        self._weight_sum = float(self.n_rows if weight_sum is None else weight_sum)
        self._min_weight = float(min_weight)
        self.readout = readout
        self.dtype = np.dtype(dtype)
        self.tol = float(tol)
        self._tol_is_default = bool(tol_is_default)
        self._token_dim = token_dim
        self._data_format = data_format
        self._n_tokens = n_tokens
        # Fitted coefficients of the standardized problem (see ``standardization``).
        self._coef = None if coef is None else np.array(coef, dtype=np.float64)
        self.standardization = (
            TokenStandardizer.identity(self.n_features_in) if standardizer is None
            else standardizer
        )
        self._factor = factor
        self._null_vector = None if null_vector is None else np.asarray(null_vector, float)
        self.method = method
        ev = self._eigenvalues
        self.max_eigenvalue = float(ev[0] if max_eigenvalue is None else max_eigenvalue)
        self.min_eigenvalue = float(ev[-1] if min_eigenvalue is None else min_eigenvalue)
        self.min_eigenvalue_error = float(min_eigenvalue_error)
        self.identifiable = bool(self.min_eigenvalue - self.min_eigenvalue_error > self.tol)
        self.rank_is_bound = False
        if ev is not None:
            self.rank = int(np.count_nonzero(ev > self.tol))
        elif self.identifiable:
            self.rank = self.n_features
        else:
            bound = self.n_features - 1
            self.rank = bound if rank is None else min(int(rank), bound)
            self.rank_is_bound = True
        if self._eigenvectors is not None:
            # Eigenvalues decrease, so those above tol come first.
            n_vec = self._eigenvectors.shape[1]
            if n_vec < self.rank:
                raise ValueError(
                    f"{n_vec} eigenvectors cannot span the rank-{self.rank} row space."
                )
        if trace is None:
            trace = float(ev.sum()) if ev is not None else self.max_eigenvalue
        self._trace = float(trace)
        # Coverage rule (see ``covers``): null-space energy allowed at an input
        # with features h is  max(tol, r) * h^T Lambda_D^+ h + (r / lambda_max) * ||h||^2,
        # with r the rounding level of the package's rule (so that a user's
        # tol=0 still allows for rounding).  Both terms scale like ||h||^2, so
        # the answer does not depend on the scale of h.
        rounding = self.tol if rounding_tol is None else float(rounding_tol)
        self._null_lev = max(self.tol, rounding)
        self._null_rel = rounding / self.max_eigenvalue if self.max_eigenvalue > 0 else 0.0

    @property
    def weight_sum(self):
        """Sum of the row weights (``n_rows`` without sample weights)."""
        return float(np.ldexp(self._weight_sum, self.standardization.weight_exponent))

    @property
    def eigenvalues(self):
        """All eigenvalues of Lambda_D, decreasing (None when not computed)."""
        if self._eigenvalues is None and self._factor is not None:
            L = self._factor
            w = scipy.linalg.eigvalsh(L @ L.T, check_finite=False)
            self._eigenvalues = np.clip(w[::-1], 0.0, None) / self._weight_sum
        return self._eigenvalues

    def _has_spectrum(self):
        return self._eigenvectors is not None

    def _unavailable(self, what):
        if self.method == "lsmr":
            how = ("its Gram matrix on the active columns did not fit the memory budget, "
                   "so it found only a null vector")
        else:
            how = ("it never forms the psi x psi matrix and finds only the eigenvector of "
                   "lambda_min")
        return ValueError(
            f"{what} needs the null space of Lambda_D, which solver={self.method!r} does "
            f"not compute ({how}). Certify with a dense solver ('eigh', 'cholesky', "
            "'svd' or 'dual') when psi**2 floats fit in memory."
        )

    def _quadratic(self, C):
        """``c^T Lambda_D c`` for each row c of C (..., psi) in the certificate's coordinates.

        The excess empirical risk of coefficients ``c* + c`` over a minimizer
        ``c*`` (and the explained energy of ``c*`` itself); None when the
        certificate holds no representation of ``Lambda_D`` (``"cg"``).
        """
        C = np.atleast_2d(np.asarray(C, dtype=np.float64))
        if self._has_spectrum():
            proj = self._split(C)[0]
            return np.einsum("...r,r,...r->...", proj, self.eigenvalues[: self.rank], proj)
        if self._factor is not None:
            z = C @ self._factor  # rows of L^T c, G = L L^T
            return np.einsum("...p,...p->...", z, z) / self._weight_sum
        return None

    def _split(self, H):
        """Projection of feature rows H (..., psi) on the row space: coordinates and rest.

        Returns ``proj`` (..., rank), the coordinates in the eigenvectors above
        tol, and a function giving ``h - P h`` per row (what the projection
        leaves, inactive columns included).
        """
        U = self._eigenvectors[:, : self.rank]
        lead = H.shape[:-1]
        # One 2-D GEMM: a stacked (n, 1, psi) @ (psi, rank) product would
        # stream U once per sample.
        H2 = H.reshape(-1, H.shape[-1])
        Ha = H2 if self._active is None else H2[:, self._active]
        proj2 = Ha @ U

        def rest():
            if self._active is None:
                return (H2 - proj2 @ U.T).reshape(H.shape)
            out = H2.copy()
            out[:, self._active] = Ha - proj2 @ U.T
            return out.reshape(H.shape)
        return proj2.reshape(*lead, U.shape[1]), rest

    @classmethod
    def _from_solution(
        cls, solution, stats, *, readout, tol=None, token_dim=None, data_format="channels_last",
        n_tokens=None, coef=None,
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
            ``solution.tol / n_rows`` (the same rule, in Lambda_D's units).
        token_dim : int or None
            How 2-D input to ``covers`` / ``error_bound`` is reshaped.
        data_format : {"channels_last", "channels_first"}
            Layout of the inputs of ``covers`` / ``error_bound`` and of the
            witness input.
        n_tokens : int or None
            Length of the witness input (default: the token dimension plus one).
        coef : ndarray of shape (d_out, psi) or None
            Fitted coefficients of the standardized problem
            (``solution.standardized_coef``); when given, the witness's
            ``model_a`` is this fitted model.
        """
        # Statistics summed field by field by an older caller may lack the
        # weight totals; without weights they equal the row count.
        W = stats.weight_sum if stats.weight_sum > 0 else float(stats.n_rows)
        min_weight = stats.min_weight if np.isfinite(stats.min_weight) else 1.0
        eigenvalues = None
        if solution.eigenvalues is not None:
            eigenvalues = np.asarray(solution.eigenvalues, dtype=np.float64) / W
        if tol is None:
            tol_used, is_default = solution.tol / W, True
        else:
            tol_used, is_default = tol, False
        return cls(
            eigenvalues,
            solution.eigenvectors,
            n_rows=stats.n_rows,
            n_samples=stats.n_samples,
            n_features_in=stats.d,
            readout=readout,
            dtype=stats.dtype,
            tol=tol_used,
            tol_is_default=is_default,
            rounding_tol=solution.tol / W,
            token_dim=token_dim,
            data_format=data_format,
            n_tokens=n_tokens,
            coef=coef,
            weight_sum=W,
            min_weight=min_weight,
            min_eigenvalue=solution.lambda_min / W,
            max_eigenvalue=solution.lambda_max / W,
            min_eigenvalue_error=solution.lambda_min_error / W,
            factor=solution.factor,
            null_vector=solution.min_eigenvector,
            rank=solution.rank,
            trace=solution.trace / W,
            method=solution.method,
            active=solution.active_columns,
            standardizer=solution.standardizer,
        )

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
        if not self._tol_is_default:
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
            f"psi = {psi}",
            f"  data         {self.n_samples} sequences of d = {self.n_features_in}, "
            f"N = {self.n_rows} feature rows (readout={self.readout!r})",
        ]
        if not self.identifiable:
            covers = (
                "covers(X) tells which" if self._has_spectrum()
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
            X_new, token_dim=self._token_dim, data_format=self._data_format,
            n_features=self.n_features_in, name="X_new",
            expected_by="the certificate is about tokens of that dimension",
        )
        if not self.identifiable and not self._has_spectrum():
            raise self._unavailable("covers() and error_bound() on a failed certificate")
        n_samples = X.shape[0]
        rows_per_sample = 1 if self.readout == "last" else X.shape[1]
        covered = np.empty(n_samples, dtype=bool)
        leverage = np.empty(n_samples)
        scale = np.zeros(n_samples, dtype=np.int64)
        sparse_ok = self._has_spectrum() and self.n_features >= _SPARSE_MIN_PSI
        for sl in iter_sample_chunks(n_samples, rows_per_sample * self.n_features):
            Xc, f = scale_per_sample(self.standardization.transform(X[sl]))
            scale[sl] = f
            if sparse_ok and np.count_nonzero(Xc) <= _SPARSE_DENSITY * Xc.size:
                Hs, sample = sparse_feature_rows(Xc, lengths[sl], self.readout)
                if self.standardization.whitened:
                    Hs = Hs @ scipy.sparse.diags(self.standardization.scale_features(
                        np.ones(self.n_features)))
                row_cov, lev = self._sparse_row_coverage(Hs)
                n = Xc.shape[0]
                covered[sl] = np.bincount(sample, weights=~row_cov, minlength=n) == 0
                worst = np.full(n, -np.inf)
                np.maximum.at(worst, sample, np.where(row_cov, lev, np.inf))
                leverage[sl] = worst
                continue
            if self.readout == "last":
                H = attention_features(Xc, lengths[sl])[:, None, :]
            else:
                H = prefix_features(Xc, lengths[sl])  # padded rows are zero
            H = self.standardization.scale_features(H)
            row_cov, lev = self._row_coverage(H)
            covered[sl] = row_cov.all(axis=1)
            leverage[sl] = np.where(row_cov, lev, np.inf).max(axis=1)
        return covered, leverage, scale

    def _determined_eigenvalues(self):
        """Eigenvalues above tol, lowered by tol (the rounding they may carry)."""
        return np.maximum(self.eigenvalues[: self.rank] - self.tol,
                          np.finfo(np.float64).tiny)

    def _row_coverage(self, H):
        """Per feature row h (array (n, t, psi)): in the span? and ``h^T Lambda_D^+ h``."""
        hh = np.einsum("ntp,ntp->nt", H, H)
        if self._has_spectrum():
            U, rank = self._eigenvectors, self.rank
            proj, rest = self._split(H)
            lev = np.einsum("ntr,ntr->nt", proj, proj / self._determined_eigenvalues())
            if self.identifiable:
                return np.ones(hh.shape, dtype=bool), lev
            if U.shape[1] == self.n_features:  # complete basis: null coordinates
                null = (H.reshape(-1, H.shape[-1]) @ U[:, rank:]).reshape(*H.shape[:-1], -1)
                null_energy = np.einsum("ntk,ntk->nt", null, null)
            else:  # row basis only (on the active columns): what the projection leaves
                left = rest()
                null_energy = np.einsum("ntp,ntp->nt", left, left)
            return self._in_span(null_energy, hh, lev), lev
        covered = np.ones(hh.shape, dtype=bool)
        if self._factor is not None:
            # h^T Lambda_D^{-1} h = W ||L^{-1} h||^2 with G = L L^T.
            flat = H.reshape(-1, H.shape[-1]).T
            z = scipy.linalg.solve_triangular(self._factor, flat, lower=True,
                                              check_finite=False)
            return covered, self._weight_sum * np.einsum("pk,pk->k", z, z).reshape(hh.shape)
        # Matrix-free certificate: the coarse bound ||h||^2 / lambda_min, with
        # lambda_min lowered by its error bound and by the rounding level.
        lower = self.min_eigenvalue - self.min_eigenvalue_error - self.tol
        return covered, hh / max(lower, np.finfo(np.float64).tiny)

    def _allowance(self, hh, lev):
        """Null energy the coverage rule allows at rows of energy hh and leverage lev."""
        return self._null_lev * lev + self._null_rel * hh

    def _in_span(self, null_energy, hh, lev):
        """The coverage rule (see ``covers``): null energy within the allowance."""
        return null_energy <= self._allowance(hh, lev)

    def _sparse_row_coverage(self, Hs):
        """``_row_coverage`` for sparse rows Hs (n_rows, psi) of a certificate with a spectrum."""
        rank = self.rank
        U = self._eigenvectors[:, :rank]
        Ha = Hs if self._active is None else Hs[:, self._active]
        proj = np.asarray(Ha @ U)
        hh = np.asarray(Hs.multiply(Hs).sum(axis=1)).ravel()
        lev = (proj * proj / self._determined_eigenvalues()).sum(axis=1)
        if self.identifiable:
            return np.ones(hh.shape, dtype=bool), lev
        if self._active is None and self._eigenvectors.shape[1] == self.n_features:
            null = np.asarray(Hs @ self._eigenvectors[:, rank:])
            null_energy = (null * null).sum(axis=1)
        else:
            # ||h - U p||^2 = ||h||^2 - 2 p.p + p^T (U^T U) p with p = U^T h,
            # without forming the psi-wide rest (U^T U is not assumed to be I).
            if self._basis_gram is None:
                self._basis_gram = U.T @ U
            null_energy = hh - 2 * (proj * proj).sum(axis=1) + (
                (proj @ self._basis_gram) * proj).sum(axis=1)
        return self._in_span(null_energy, hh, lev), lev

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
            the targets), as large as model_a's own output there can be.  ``model_a`` is the fitted model when the
            certificate is a regressor's ``certificate_``, otherwise a random
            one.  The input is never covered (:meth:`covers`).  With
            ``solver="cg"`` the null vector is the computed eigenvector of
            lambda_min (the training outputs then differ by at most
            ``sqrt(W * (min_eigenvalue + min_eigenvalue_error))`` times the
            shift's size).

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
        rng = validate_random_state(random_state)
        d, psi = self.n_features_in, self.n_features
        n_tokens = self._n_tokens if self._n_tokens else d + 1
        n_tokens = max(n_tokens, 2)  # one token reaches only symmetric monomials
        Z = rng.standard_normal((_WITNESS_CANDIDATES, n_tokens, d))
        lengths = np.full(_WITNESS_CANDIDATES, n_tokens)
        h = self.standardization.scale_features(attention_features(Z, lengths))
        # Bring the candidates to the training scale: ||H|| ~ RMS training row.
        rms_row = np.sqrt(self._trace)
        h_norm = np.linalg.norm(h, axis=1)
        if rms_row > 0:
            factor = (rms_row / h_norm) ** (1.0 / 3.0)
            Z *= factor[:, None, None]
            h *= (factor**3)[:, None]
            h_norm = np.linalg.norm(h, axis=1)
        if self._has_spectrum():
            U, rank = self._eigenvectors, self.rank
            if U.shape[1] == psi:
                null = h @ U[:, rank:]
                directions = null @ U[:, rank:].T
            else:
                directions = self._split(h)[1]()
            null_norm = np.linalg.norm(directions, axis=1)
            lev = self._row_coverage(h[:, None, :])[1][:, 0]
            # The candidate farthest outside the coverage rule's allowance.
            with np.errstate(over="ignore"):
                best = int(np.argmax(null_norm**2 / np.maximum(
                    self._allowance(h_norm**2, lev), np.finfo(np.float64).tiny)))
            w = directions[best] / null_norm[best]
        else:  # "cg": the eigenvector of lambda_min is the null direction
            v = self._null_vector
            along = h @ v
            null_norm = np.abs(along)
            best = int(np.argmax(null_norm / h_norm))
            w = v * np.sign(along[best]) / np.linalg.norm(v)
        Z, h_best, n_best = Z[best], h_norm[best], null_norm[best]

        if self._coef is not None:
            coef_a = self._coef
        else:
            g = rng.standard_normal((1, psi))
            coef_a = g / (np.linalg.norm(g) * (rms_row if rms_row > 0 else 1.0))
        a = np.linalg.norm(coef_a, axis=1).max()
        if a == 0:
            a = 1.0 / (rms_row if rms_row > 0 else 1.0)
        # <shift, h_best> = a * ||h_best|| in every output.
        shift = (a * h_best / n_best) * w
        coef_b = coef_a + shift[None, :]
        # Everything above is in the standardized coordinates the certificate
        # computes in; the witness is given in the data's own.
        st = self.standardization
        user_null = st.coef_to_user(w, targets=False)
        user_null = user_null / np.abs(user_null).max()
        return Witness(
            model_a=st.heads_to_user(*heads_from_coefficients(st.folded(coef_a), d)),
            model_b=st.heads_to_user(*heads_from_coefficients(st.folded(coef_b), d)),
            input=to_data_format(st.inputs_to_user(Z)[None], self._data_format)[0],
            null_vector=user_null / np.linalg.norm(user_null),
        )


def certify_identifiability(
    X, *, readout="last", token_dim=None, tol=None, sample_weight=None, solver="auto",
    data_format="channels_last",
):
    """Certify whether the inputs X identify every linear-attention model that fits them.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Training sequences; trailing all-NaN tokens are padding.  Only the
        inputs matter: the certificate never looks at targets.
    readout : {"last", "all"}, default="last"
        ``"last"``: one feature row per sequence (targets at the last token).
        ``"all"``: one row per prefix (targets at every position, causal
        training), as ``LinearAttentionRegressor(readout="all")`` uses.
    token_dim : int or None, default=None
        Token dimension for 2-D X (each row is ``n_columns // token_dim``
        tokens); None reads 2-D X as univariate sequences.
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: (n_samples, n_tokens, d), or (n_samples, d, n_tokens) as
        aeon and sktime store multivariate series.  The certificate's
        ``covers``, ``error_bound`` and ``witness`` use the same layout.
    tol : float or None, default=None
        Threshold on the eigenvalues of the standardized ``Lambda_D`` (same
        units as ``min_eigenvalue``): eigenvalues ``<= tol`` count as zero.
        None uses the package's rule (Notes).
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence, as in
        ``LinearAttentionRegressor.fit``: ``Lambda_D = Phi^T W Phi / sum(w)``
        over the rows of positive weight (a weight of zero drops a sequence).
    solver : {"auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr"}, default="auto"
        How the spectrum is computed, as in ``LinearAttentionRegressor``.
        ``"cg"`` never forms the psi x psi matrix: lambda_max comes from
        Lanczos, lambda_min is bracketed by preconditioned CG from a random
        start and, if needed, LOBPCG (see ``min_eigenvalue_error``), and a
        failed certificate then offers ``witness()`` but not ``covers()``.
        ``"lsmr"`` (one-hot data) works on the active columns of the sparse
        feature rows: the full spectrum when the smaller of their Gram matrix
        and the row kernel fits in memory, else as ``"cg"`` (an inactive
        column as null vector).

    Returns
    -------
    certificate : IdentifiabilityCertificate
        Truthy if and only if every empirical risk minimizer computes the same
        function on every input of every length.

    Notes
    -----
    With ``Phi`` the N feature rows H(Z_i) (the paper's Algorithm 2 features),
    ``Lambda_D = (1/N) Phi^T Phi``.  If ``lambda_min(Lambda_D) > 0`` two
    minimizers can only differ by a vector c with ``Phi c = 0``, i.e. c = 0,
    so they compute the same function everywhere (Lemma A.3; with at least
    d**2 heads no realizability is needed, Lemma A.6, since every coefficient
    vector is then the coefficients of some MHLA).

    Identifiability is unchanged by any invertible linear map of the tokens
    (it maps the features by an invertible matrix), so ``Lambda_D`` is
    computed for standardized tokens (see ``standardization``): each
    coordinate scaled by an exact power of two, then whitened to unit second
    moment, which keeps the Gram matrix representable and well scaled for
    data of any magnitude and units.

    **Tolerance rule** (:func:`sklearn_linattn._solvers.eigenvalue_tolerance`,
    shared with the fit's pseudo-inverse): an eigenvalue counts as zero when

        lambda <= lambda_max * psi * max(eps64, eps_in**2)

    with ``eps_in`` the machine epsilon of the input dtype.  ``psi * eps64 *
    lambda_max`` is the rounding level of an eigen-decomposition of the
    float64 Gram matrix; float32 (float16) input is itself rounded by
    ``eps32`` (``eps16``) relative, which moves an exactly zero eigenvalue up
    to about ``eps**2 * lambda_max``, so such data is only certified above
    ``psi * eps**2 * lambda_max`` (about ``1.4e-14 * psi`` relative for
    float32, ``9.5e-7 * psi`` for float16).  Integer and boolean input is
    exact (the float64 rule).  The standardized spectrum is the same for X,
    ``c * X`` and ``X @ A``, and so is the verdict.

    References
    ----------
    .. [1] M. Yau et al., "Learning Linear Attention in Polynomial Time",
       arXiv:2410.10101, Lemmas A.3, A.5, A.6 and A.7.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_linattn import certify_identifiability
    >>> X = np.random.default_rng(0).normal(size=(50, 6, 3))
    >>> cert = certify_identifiability(X)
    >>> bool(cert), cert.rank, cert.n_features
    (True, 18, 18)
    >>> bool(certify_identifiability(X[:17]))  # fewer sequences than psi = 18
    False
    """
    check_readout(readout)
    token_dim = check_token_dim(token_dim)
    data_format = check_data_format(data_format)
    tol = _check_tol(tol)
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}.")
    X, lengths = check_sequences(X, token_dim=token_dim, data_format=data_format)
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    solution = solve_arrays(
        X, lengths, None, readout=readout, solver=solver, sample_weight=sample_weight
    )
    stats = solution.counts
    if (
        tol is not None
        and solution.eigenvectors is None
        and stats.has_gram
        and not solution.lambda_min / stats.weight_sum > tol
    ):
        # A user threshold above lambda_min of a Cholesky solution: the null
        # space is then needed, which eigh provides.
        solution = solve_eigh(stats)
    return IdentifiabilityCertificate._from_solution(
        solution, stats, readout=readout, tol=tol, token_dim=token_dim,
        data_format=data_format, n_tokens=X.shape[1],
    )
