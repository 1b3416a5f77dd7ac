"""certify_identifiability: the certificate of a set of training sequences."""

from .._features import n_attention_features
from .._solvers import (
    REGISTRY,
    SOLVERS,
    choose_solver,
    solve_statistics,
)
from .._moments import count_rows
from .._namespace import computes_in_namespace
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


@computes_in_namespace
def certify_identifiability(
    X, *, readout="last", token_dim=None, tol=None, sample_weight=None, solver="auto",
    data_format="channels_last", fit_intercept=False, fit_skip=False, decay=None,
):
    """Certify whether the inputs X identify every linear-attention model that fits them.

    The certificate holds when ``Lambda_D``, the second-moment matrix of the
    feature rows of the standardized tokens, has its smallest eigenvalue above
    ``tol``; the verdict is the same for X, ``c * X`` and ``X @ A`` (A
    invertible).  See the user guide's :doc:`/certificate` page.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_tokens, d) or list of (n_tokens_i, d) arrays
        Training sequences; trailing all-NaN tokens are padding.  Only the
        inputs matter: the certificate never looks at targets.
    readout : {"last", "all"}, default="last"
        ``"last"``: one feature row per sequence (targets at the last token).
        ``"all"``: one row per prefix, as ``LinearAttentionRegressor(readout="all")``.
    token_dim : int or None, default=None
        Token dimension for 2-D X (each row is ``n_columns // token_dim``
        tokens); None reads 2-D X as univariate sequences.
    tol : float or None, default=None
        Threshold on the eigenvalues of the standardized ``Lambda_D`` (units of
        ``min_eigenvalue``): eigenvalues ``<= tol`` count as zero.  None uses
        the package's rule (:ref:`certificate-tolerance`).
    sample_weight : array-like of shape (n_samples,) or None, default=None
        Non-negative weight of each sequence: ``Lambda_D = Phi^T W Phi /
        sum(w)`` over the rows of positive weight (a weight of zero drops a sequence).
    solver : {"auto", "eigh", "cholesky", "svd", "dual", "cg", "lsmr"}, default="auto"
        How the spectrum is computed, as in ``LinearAttentionRegressor``; a
        failed "cg" certificate offers ``witness()`` but not ``covers()``
        (:ref:`certificate-solvers`).
    data_format : {"channels_last", "channels_first"}, default="channels_last"
        Layout of X: (n_samples, n_tokens, d) or (n_samples, d, n_tokens).
        The certificate's ``covers``, ``error_bound`` and ``witness`` use it too.
    fit_intercept, fit_skip : bool, default=False
        Certify the class with an intercept and/or a skip term, as
        ``LinearAttentionRegressor`` fits it: the term columns must then be
        separable from attention too (``term_min_eigenvalue``).
    decay : None, float or array-like of float, default=None
        Fixed decays, as ``LinearAttentionRegressor(decay=...)``: the
        certificate is about the model with one group of heads per decay.

    Returns
    -------
    certificate : IdentifiabilityCertificate
        Truthy if and only if every empirical risk minimizer computes the same
        function on every input of every length.

    Raises
    ------
    ValueError
        If every sequence has zero sample weight, or a parameter is invalid.

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
                 data_format=data_format, X=X)
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
