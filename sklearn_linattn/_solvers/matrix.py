"""Solvers on the feature matrix itself: ``"svd"`` of the feature rows, ``"dual"`` through their kernel."""

import numpy as np
import scipy.linalg

from .._features import outer_features, features_rmatvec
from .._spectrum import descending_eigh, eigenvalue_tolerance
from ._solution import SpectralSolution, dense_solution, ridge_penalty

__all__ = ["solve_dual", "solve_svd"]


def solve_svd(rows, alpha=0.0, options=None):
    """Solve on the feature matrix itself through its SVD (more accurate).

    ``rows`` (a :class:`~.._moments.RowReader`) gives the standardized rows.
    Conditioning is that of ``W^{1/2} Phi`` rather than of ``Phi^T W Phi``;
    eigenvalues of the Gram matrix are the squared singular values.  Memory
    O(n_rows * psi).
    """
    psi = rows.standardizer.n_features
    standardizer = rows.standardizer
    dtype = rows.dtype
    rows = rows.all_rows()
    S, x, w, Yr = rows.S, rows.x, rows.w, rows.Y
    Phi = outer_features(S, x)
    if w is not None:
        sw = np.sqrt(w)
        Phi *= sw[:, None]
        Yr = None if Yr is None else Yr * sw[:, None]
    _, s, Vt = scipy.linalg.svd(Phi, full_matrices=False, lapack_driver="gesdd",
                                check_finite=False)
    eig = np.zeros(psi)
    eig[: s.size] = s**2
    moment = None if Yr is None else Phi.T @ Yr
    return dense_solution(eig, Vt.T, moment, alpha, dtype, "svd", standardizer)


def solve_dual(rows, alpha=0.0, options=None):
    """Solve in the dual (kernel) form, for fewer rows than features.

    ``K = W^{1/2} Phi Phi^T W^{1/2}`` costs O(N^2 d^2) from the kernel
    ``<H_r, H_s> = <S_r, S_s> <x_r, x_s>`` (also between prefixes, so both
    readouts are supported).  With ``K = U diag(mu) U^T``, the nonzero
    eigenvalues of the Gram matrix are mu, its eigenvectors
    ``Phi^T W^{1/2} U mu^{-1/2}``, and the coefficients
    ``Phi^T W^{1/2} (K + alpha I)^+ W^{1/2} y`` (the pseudo-inverse keeps mu
    above the zero-eigenvalue tolerance, giving the minimum-norm solution).
    Memory O(N^2 + N psi); accuracy that of eigh on the Gram matrix.
    """
    psi = rows.standardizer.n_features
    standardizer = rows.standardizer
    dtype = rows.dtype
    rows = rows.all_rows()
    S, x, w, Yr = rows.S, rows.x, rows.w, rows.Y
    K = (S @ S.T) * (x @ x.T)
    sw = None if w is None else np.sqrt(w)
    if sw is not None:
        K *= sw[:, None] * sw[None, :]
    mu, U = descending_eigh(K, overwrite_a=True)
    m = mu.size
    eig = np.zeros(psi)
    eig[: min(m, psi)] = mu[: min(m, psi)]
    tol = eigenvalue_tolerance(eig[0] if psi else 0.0, psi, dtype)
    # At most psi eigenvalues of K are not zero (K = Phi Phi^T has rank <= psi);
    # with more rows than features the others are rounding of size ~ m eps.
    k = min(m, psi)
    r = int(np.count_nonzero(eig > tol))
    Ur = U[:, :r] if sw is None else U[:, :r] * sw[:, None]
    V = features_rmatvec(S, x, Ur).T / np.sqrt(mu[:r])  # (psi, r) eigenvectors
    coef = None
    if Yr is not None:
        alpha = ridge_penalty(alpha, eig.sum(), psi)
        Yw = Yr if sw is None else Yr * sw[:, None]
        proj = U.T @ Yw
        # Pseudo-inverse as in the primal solvers: eigenvalues above tol for
        # alpha = 0, all of them for alpha > 0 (the null space of K maps to
        # zero coefficients either way, so it is left out).
        inv = np.zeros_like(mu)
        n_kept = r if alpha == 0 else k
        inv[:n_kept] = 1.0 / (mu[:n_kept] + alpha)
        a = U @ (inv[:, None] * proj)  # dual coefficients, (m, d_out)
        coef = features_rmatvec(S, x, a if sw is None else a * sw[:, None])
    return SpectralSolution(
        coef=coef,
        standardizer=standardizer,
        tol=tol,
        lambda_max=float(eig[0]),
        lambda_min=float(eig[-1]),
        n_features=psi,
        method="dual",
        eigenvalues=eig,
        eigenvectors=V,
        trace=float(eig.sum()),
        rank=r,
    )
