"""certify_identifiability: the certificate of a set of training sequences."""

from .._features import n_attention_features
from .._solvers import (
    REGISTRY,
    SOLVERS,
    choose_solver,
    solve_statistics,
)
from .._moments import count_rows
from .._problem import StandardizedProblem, keep_rows
from .._source import ArraySource, check_layout
from .._terms import LinearTerms, fit_terms
from .._validation import (
    check_data_format,
    check_readout,
    check_sample_weight,
    check_sequences,
    check_token_dim,
)
from .._params import check_decays, check_number
from ._certificate import IdentifiabilityCertificate

__all__ = ["certify_identifiability"]


def _check_tol(tol):
    return check_number(tol, "tol", low=0.0, allow_none=True)


def certify_identifiability(
    X, *, readout="last", token_dim=None, tol=None, sample_weight=None, solver="auto",
    data_format="channels_last", fit_intercept=False, fit_skip=False, decay=None,
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
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: (n_samples, n_tokens, d), or (n_samples, d, n_tokens) as
        aeon and sktime store multivariate series.  The certificate's
        ``covers``, ``error_bound`` and ``witness`` use the same layout.
    fit_intercept, fit_skip : bool, default=False
        Certify the class with an intercept and/or a skip term in the row's
        token, as ``LinearAttentionRegressor(fit_intercept=..., fit_skip=...)``
        fits it: the certificate then also needs the term columns to be
        separable from attention (``term_min_eigenvalue``).
    decay : None, float or array-like of float, default=None
        Fixed decays, as ``LinearAttentionRegressor(decay=...)``: the rows
        are the features of every decay's block side by side, and the
        certificate speaks about the model with those decays (one group of
        heads per decay).

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

    **Tolerance rule** (the one the fit's pseudo-inverse uses): an eigenvalue
    counts as zero when

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
    decays = check_decays(decay)
    if not isinstance(solver, str) or solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}.")
    LinearTerms.checked(1, fit_intercept, fit_skip)
    check_layout(getattr(X, "shape", ()), readout=readout, token_dim=token_dim,
                 data_format=data_format)
    X, lengths = check_sequences(X, token_dim=token_dim, data_format=data_format)
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    d = X.shape[2]
    terms = LinearTerms(d, intercept=fit_intercept, skip=fit_skip)
    n_blocks = 1 if decays is None else len(decays)
    psi = n_blocks * n_attention_features(d)
    n_rows = count_rows(lengths, readout, sample_weight)
    solver = choose_solver(solver, n_rows, psi, check_memory=True)
    if n_rows == 0:
        raise ValueError("every sequence has zero sample weight: there is nothing to fit.")
    problem = StandardizedProblem.from_source(
        ArraySource.validated(X, lengths, None, sample_weight, readout), readout=readout,
        terms=terms, solver=solver, decays=decays,
        keep=keep_rows(solver, n_rows, d, terms.n_terms, n_blocks=n_blocks))
    try:
        # The term columns are the only targets: their fit by attention gives K.
        solution = problem.solve(solver, residuals=bool(terms))
        stats = solution.counts
        space = None
        if terms:
            solution, space, _ = fit_terms(solution, stats, terms, 0, rows=problem.rows)
    finally:
        problem.release()
    if (
        tol is not None
        and REGISTRY[solution.method].spectrum == "factor"
        and not (solution.lambda_min - solution.lambda_min_error) / stats.weight_sum > tol
    ):
        # A user threshold the Cholesky solution does not clear, its Lanczos
        # error included: the certificate fails, and covers and witness need
        # the null space, which eigh provides.
        solution = solve_statistics(stats, solver="eigh")
    return IdentifiabilityCertificate._from_solution(
        solution, stats, readout=readout, tol=tol, token_dim=token_dim,
        data_format=data_format, n_tokens=X.shape[1], terms=space,
    )
