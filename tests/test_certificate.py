"""The identifiability certificate: verdict, tolerance, witness, coverage, error bound."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import ref_features, ref_prefix_features
from sklearn_linattn import (
    IdentifiabilityCertificate,
    LinearAttentionRegressor,
    certify_identifiability,
    heads_from_coefficients,
    mhla_forward,
    same_function,
)
from sklearn_linattn._certificate import Witness
from sklearn_linattn._features import attention_features, n_attention_features
from solving import solve_arrays
from sklearn_linattn._units import TokenStandardizer
from sklearn_linattn.datasets import make_associative_memory
from sklearn_linattn.testing import rank_deficient_datasets

SCALES = [1e-6, 1e-3, 1.0, 1e3, 1e6]
DTYPES = [np.float64, np.float32]


def _subspace_tokens(rng, n_samples, n_tokens, d, r):
    """Tokens confined to a random r-dimensional subspace of R^d (rounded, not exact)."""
    basis = np.linalg.qr(rng.normal(size=(d, r)))[0]
    return rng.normal(size=(n_samples, n_tokens, r)) @ basis.T


def _pad(rng, X, min_length=2):
    """NaN-pad X to random lengths >= min_length."""
    X = X.copy()
    lengths = rng.integers(min_length, X.shape[1] + 1, size=X.shape[0])
    X[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = np.nan
    return X, lengths


def _lambda_min_reference(X, lengths, readout="last", standardization=None):
    """lambda_min of (1/N) Phi^T Phi with the loop reference features.

    With a standardization, of the features of the standardized tokens in the
    certificate's embedding.
    """
    if standardization is not None:
        X = standardization.transform(X)
    if readout == "last":
        Phi = ref_features(X, lengths)
    else:
        H = ref_prefix_features(X, lengths)
        Phi = H[np.arange(X.shape[1])[None, :] < lengths[:, None]]
    if standardization is not None:
        Phi = standardization.scale_features(Phi)
    return np.linalg.eigvalsh(Phi.T @ Phi / Phi.shape[0])[0], Phi.shape[0]


def _check_witness(cert, X, readout="last", random_state=0):
    """The witness, verified with the forward pass; returns it."""
    w = cert.witness(random_state=random_state)
    assert isinstance(w, Witness)
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    d = X.shape[2]
    assert Va.ndim == 3 and Va.shape[2] == d and Qa.shape[1:] == (d, d)
    assert Vb.shape[1:] == Va.shape[1:] and Qb.shape[1:] == (d, d)
    assert w.input.shape == (w.input.shape[0], d) and np.all(np.isfinite(w.input))
    fa = mhla_forward(X, Va, Qa, readout=readout)
    fb = mhla_forward(X, Vb, Qb, readout=readout)
    train_gap = np.nanmax(np.abs(fa - fb))
    Z = w.input[None]
    ga = mhla_forward(Z, Va, Qa, readout=readout)[0]
    gb = mhla_forward(Z, Vb, Qb, readout=readout)[0]
    if readout == "all":
        ga, gb = ga[-1], gb[-1]
    gap = np.linalg.norm(ga - gb)
    # Clearly different at the input: at least model_a's own output there ...
    assert gap >= 0.99 * np.linalg.norm(ga)
    assert gap > 0
    # ... and equal to rounding on every training input, relative to that gap.
    assert train_gap <= 1e-9 * max(gap, np.nanmax(np.abs(fa)))
    assert not cert.covers(Z)[0]
    return w


# --------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gaussian_flips_exactly_at_psi(d, seed):
    # Lemma A.5: i.i.d. Gaussian entries (m4 = 3 m2**2 > m2**2) identify
    # as soon as there are psi feature rows, never before.
    psi = n_attention_features(d)
    X = np.random.default_rng(seed).normal(size=(psi, 5, d))
    below = certify_identifiability(X[:-1])
    at = certify_identifiability(X)
    assert not below and below.rank == psi - 1 and below.min_eigenvalue <= below.tol
    assert at and at.rank == psi and at.min_eigenvalue > at.tol
    assert bool(at) is True and bool(below) is False
    assert at.n_features == below.n_features == psi
    assert (at.n_samples, at.n_rows, below.n_samples) == (psi, psi, psi - 1)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_min_eigenvalue_is_that_of_the_paper_features_of_the_standardized_tokens(readout):
    rng = np.random.default_rng(3)
    X, lengths = _pad(rng, rng.normal(size=(40, 5, 2)) * [3.0, 0.2])
    cert = certify_identifiability(X, readout=readout)
    # Lambda_D of the paper's features, computed by the loop reference on the
    # tokens in the coordinates the certificate states it uses.
    expected, n_rows = _lambda_min_reference(X, lengths, readout, cert.standardization)
    Xs = cert.standardization.transform(X)
    assert cert.n_rows == n_rows == (40 if readout == "last" else lengths.sum())
    assert cert.min_eigenvalue == pytest.approx(expected, rel=1e-8)
    assert cert.eigenvalues[-1] == cert.min_eigenvalue
    assert cert.eigenvalues[0] == cert.max_eigenvalue
    assert np.all(np.diff(cert.eigenvalues) <= 0)
    # The standardized tokens have unit second moment.
    real = Xs[~np.isnan(Xs[..., 0])]
    np.testing.assert_allclose(real.T @ real / real.shape[0], np.eye(2), atol=1e-12)


def test_min_eigenvalue_brackets_the_papers_for_tokens_of_unit_second_moment():
    # Tokens whose second moment is already the identity are left as they are
    # (up to rounding); the symmetric embedding weights the off-diagonal pairs
    # by sqrt(2), so min_eigenvalue lies between the paper's lambda_min of
    # Lambda_D and twice it.
    rng = np.random.default_rng(30)
    Z = rng.normal(size=(60, 5, 3))
    flat = Z.reshape(-1, 3)
    M = flat.T @ flat / flat.shape[0]
    w, U = np.linalg.eigh(M)
    X = Z @ (U / np.sqrt(w)) @ U.T
    cert = certify_identifiability(X)
    np.testing.assert_allclose(cert.standardization.transform(X), X, atol=1e-12)
    paper, _ = _lambda_min_reference(X, np.full(60, 5))
    assert paper * (1 - 1e-9) <= cert.min_eigenvalue <= 2 * paper * (1 + 1e-9)


def test_min_eigenvalue_is_invariant_under_linear_maps_of_the_tokens():
    rng = np.random.default_rng(31)
    X = rng.normal(size=(80, 5, 3))
    A = (np.linalg.qr(rng.normal(size=(3, 3)))[0] * [1e-3, 1.0, 1e3]) @ np.linalg.qr(
        rng.normal(size=(3, 3)))[0]
    a, b = certify_identifiability(X), certify_identifiability(X @ A)
    assert a and b
    # X @ A is X rounded after a map of condition number 1e6: equal to that.
    assert b.min_eigenvalue == pytest.approx(a.min_eigenvalue, rel=1e-8)
    assert b.max_eigenvalue == pytest.approx(a.max_eigenvalue, rel=1e-8)


@pytest.mark.parametrize("d, n_samples", [(2, 400), (3, 1000)])
def test_associative_memory_gaussian_vs_orthonormal(d, n_samples):
    # Paper Sec. 4.2: Gaussian keys/values identify the memory, orthonormal
    # keys/values (redrawn per sample) never do.
    Xg, _ = make_associative_memory(n_samples, d, distribution="gaussian", random_state=0)
    Xo, _ = make_associative_memory(n_samples, d, distribution="orthonormal", random_state=0)
    gauss, ortho = certify_identifiability(Xg), certify_identifiability(Xo)
    psi = n_attention_features(2 * d)
    assert gauss and gauss.rank == psi
    assert not ortho and ortho.rank < psi
    # The orthonormal null space is structural: more samples do not fill it.
    Xo2, _ = make_associative_memory(2 * n_samples, d, distribution="orthonormal", random_state=1)
    assert certify_identifiability(Xo2).rank == ortho.rank
    _check_witness(ortho, Xo)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "design", ["gaussian_at_psi", "subspace", "one_token", "rademacher", "orthonormal"]
)
def test_verdict_does_not_depend_on_units_or_float32(design, dtype):
    rng = np.random.default_rng(4)
    if design == "gaussian_at_psi":  # identifiable, with the least margin
        X, expected_rank = rng.normal(size=(18, 5, 3)), 18
    elif design == "subspace":  # tokens in a random plane of R^3: rank of d = 2
        X, expected_rank = _subspace_tokens(rng, 60, 5, 3, 2), 6
    elif design == "one_token":  # only symmetric monomials x_j x_k x_l
        X, expected_rank = rng.normal(size=(60, 1, 3)), 10
    elif design == "rademacher":  # m4 = m2**2: S_jj = n for every j
        X, expected_rank = rng.choice([-1.0, 1.0], size=(60, 5, 3)), 12
    else:
        X, _ = make_associative_memory(300, 2, distribution="orthonormal", random_state=0)
        expected_rank = certify_identifiability(X).rank
        assert expected_rank < 40
    ranks, verdicts, maxima = [], [], []
    A = np.linalg.qr(rng.normal(size=(X.shape[2],) * 2))[0] * np.geomspace(
        1e-2, 1e3, X.shape[2])  # a unit per coordinate after a rotation
    variants = [X * c for c in SCALES] + [X * np.geomspace(1e3, 1e-2, X.shape[2]), X @ A]
    for Xc in variants:
        cert = certify_identifiability(Xc.astype(dtype))
        assert cert.dtype == np.dtype(dtype)
        ranks.append(cert.rank)
        verdicts.append(bool(cert))
        maxima.append(cert.max_eigenvalue)
        assert bool(cert) == (cert.min_eigenvalue > cert.tol)
        # Threshold relative to lambda_max: the rule of the docstring.
        eps = float(np.finfo(dtype).eps)
        rel = max(float(np.finfo(np.float64).eps), eps**2) * cert.n_features
        assert cert.tol == pytest.approx(rel * cert.max_eigenvalue, rel=1e-12)
    assert ranks == [expected_rank] * len(variants)
    psi = n_attention_features(X.shape[2])
    assert verdicts == [expected_rank == psi] * len(variants)
    assert (design == "gaussian_at_psi") == (expected_rank == psi)
    # The spectrum is that of standardized tokens: an overall scale does not
    # change it at all (float32 rounding aside).
    np.testing.assert_allclose(maxima[: len(SCALES)], maxima[2], rtol=1e-5)


def test_float32_threshold_is_the_squared_precision():
    # Tokens in a rotated plane, rounded to float32: the rounding lifts the
    # null eigenvalues off zero, and they must still count as zero.
    rng = np.random.default_rng(5)
    X = _subspace_tokens(rng, 500, 6, 4, 3)
    c64 = certify_identifiability(X)
    c32 = certify_identifiability(X.astype(np.float32))
    assert not c64 and not c32 and c64.rank == c32.rank == 18
    assert c32.tol / c32.max_eigenvalue == pytest.approx(
        40 * np.finfo(np.float32).eps ** 2, rel=1e-12
    )
    assert c32.tol / c32.max_eigenvalue > 60 * c64.tol / c64.max_eigenvalue
    # Generic float32 data just at N = psi is still certified.
    assert certify_identifiability(rng.normal(size=(40, 5, 4)).astype(np.float32))


@given(
    rank_deficient_datasets(
        dtype=st.sampled_from(DTYPES), scale=st.sampled_from([2.0**-20, 1.0, 2.0**20])
    ),
    st.sampled_from(["last", "all"]),
)
def test_no_false_certificate_on_known_null_spaces(data, readout):
    X, rank, _ = data
    cert = certify_identifiability(X, readout=readout)
    assert not cert
    assert cert.rank == rank
    assert cert.covers(X).all()
    _check_witness(cert, X, readout)


def test_tokens_in_a_subspace_are_never_identifiable():
    rng = np.random.default_rng(6)
    for d, r in [(3, 1), (3, 2), (4, 2), (4, 3)]:
        X = _subspace_tokens(rng, 3 * n_attention_features(d), 5, d, r)
        for dtype in DTYPES:
            cert = certify_identifiability(X.astype(dtype))
            assert not cert and cert.rank == n_attention_features(r), (d, r, dtype)


def test_user_tolerance():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(30, 4, 2))
    default = certify_identifiability(X)
    assert default
    strict = certify_identifiability(X, tol=default.max_eigenvalue)
    assert not strict and strict.rank == 0 and strict.tol == default.max_eigenvalue
    loose = certify_identifiability(X, tol=0.0)
    assert loose and loose.tol == 0.0
    at_lambda_min = certify_identifiability(X, tol=default.min_eigenvalue)
    assert not at_lambda_min and at_lambda_min.rank == 5
    assert "user-supplied" in strict.summary()
    # Without data beyond psi, an exactly singular Lambda_D fails even at tol=0,
    # and the training inputs are still covered (their null components are rounding).
    few = certify_identifiability(X[:5], tol=0.0)
    assert not few and few.rank == 5
    assert few.covers(X[:5]).all() and not few.covers(X[5:]).any()
    # With every direction declared zero nothing is determined: no input is
    # covered, the training inputs included, at any scale.
    assert not strict.covers(X).any()
    assert not strict.covers(1e-60 * X).any()
    assert not strict.covers(strict.witness(random_state=0).input[None])[0]
    # Coverage does not depend on the scale of the inputs.
    Z = rng.normal(size=(5, 4, 2))
    Z[:2] = X[:2]
    for c in (1e-60, 1e-3, 1e3, 1e60):
        np.testing.assert_array_equal(few.covers(c * Z), few.covers(Z))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"tol": -1.0}, ValueError, "tol must be"),
        ({"tol": np.nan}, ValueError, "tol must be"),
        ({"tol": "small"}, TypeError, "tol must be"),
        ({"tol": True}, TypeError, "tol must be"),
        ({"readout": "first"}, ValueError, "readout must be"),
        ({"token_dim": 0}, ValueError, "token_dim"),
    ],
)
def test_argument_errors(kwargs, error, match):
    X = np.random.default_rng(0).normal(size=(5, 3, 2))
    with pytest.raises(error, match=match):
        certify_identifiability(X, **kwargs)


def test_input_forms():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(30, 4, 2))
    ref = certify_identifiability(X)
    listed = certify_identifiability([x for x in X])
    flat = certify_identifiability(X.reshape(30, 8), token_dim=2)
    for other in (listed, flat):
        assert other.rank == ref.rank
        assert other.min_eigenvalue == pytest.approx(ref.min_eigenvalue, rel=1e-10)
    # 2-D input to covers is read with the same token_dim.
    assert flat.covers(rng.normal(size=(3, 10))).all()
    with pytest.raises(ValueError, match="X_new has tokens of dimension d=3"):
        ref.covers(rng.normal(size=(2, 4, 3)))


def test_all_zero_inputs():
    cert = certify_identifiability(np.zeros((5, 3, 2)))
    assert not cert and cert.rank == 0 and cert.max_eigenvalue == 0.0
    assert cert.covers(np.zeros((2, 4, 2))).all()
    assert not cert.covers(np.ones((1, 4, 2)))[0]
    _check_witness(cert, np.zeros((5, 3, 2)))


# --------------------------------------------------------------------------
# Display
# --------------------------------------------------------------------------


def test_repr_and_summary():
    rng = np.random.default_rng(9)
    bad = certify_identifiability(rng.normal(size=(16, 4, 3)))
    good = certify_identifiability(rng.normal(size=(50, 4, 2)).astype(np.float32))
    assert repr(bad).startswith("IdentifiabilityCertificate(identifiable=False")
    assert f"rank={bad.rank}" in repr(bad) and "n_features=18" in repr(bad)
    text = bad.summary()
    assert text.splitlines()[0] == "Identifiability certificate: NOT IDENTIFIABLE"
    assert "2 of the 18 coefficient directions" in text and "witness()" in text
    assert f"{bad.min_eigenvalue:.4g}" in text and f"{bad.tol:.4g}" in text
    assert "16 sequences of d = 3, N = 16 feature rows" in text and "N >= psi = 18" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    text = good.summary()
    assert text.splitlines()[0] == "Identifiability certificate: IDENTIFIABLE"
    assert "float32" in text and "witness" not in text
    assert isinstance(good, IdentifiabilityCertificate)


# --------------------------------------------------------------------------
# Witness
# --------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
def test_witness_below_psi_and_on_subspaces(readout):
    rng = np.random.default_rng(10)
    X, _ = _pad(rng, rng.normal(size=(5 if readout == "last" else 1, 5, 2)))
    _check_witness(certify_identifiability(X, readout=readout), X, readout)
    X = _subspace_tokens(rng, 40, 5, 3, 2)
    _check_witness(certify_identifiability(X, readout=readout), X, readout)


def test_witness_is_reproducible_and_absent_when_identifiable():
    rng = np.random.default_rng(11)
    cert = certify_identifiability(rng.normal(size=(5, 4, 2)))
    w1, w2 = cert.witness(random_state=3), cert.witness(random_state=3)
    np.testing.assert_array_equal(w1.input, w2.input)
    np.testing.assert_array_equal(w1.model_b[1], w2.model_b[1])
    assert "heads" in repr(w1)
    good = certify_identifiability(rng.normal(size=(40, 4, 2)))
    with pytest.raises(ValueError, match="no witness exists"):
        good.witness()


# --------------------------------------------------------------------------
# Coverage
# --------------------------------------------------------------------------


def test_covers_when_identifiable_is_everything():
    rng = np.random.default_rng(12)
    cert = certify_identifiability(rng.normal(size=(40, 4, 2)))
    X_new, _ = _pad(rng, rng.normal(size=(20, 30, 2)) * 100, min_length=1)
    assert cert.covers(X_new).all()


@pytest.mark.parametrize("readout", ["last", "all"])
def test_covers_training_inputs_span_and_generic_inputs(readout):
    rng = np.random.default_rng(13)
    d, r = 3, 2
    basis = np.linalg.qr(rng.normal(size=(d, r)))[0]
    X, _ = _pad(rng, rng.normal(size=(30, 6, r)) @ basis.T)
    cert = certify_identifiability(X, readout=readout)
    assert not cert
    assert cert.covers(X).all()
    # Longer, differently scaled sequences in the same plane: covered.
    inside = rng.normal(size=(10, 12, r)) @ basis.T * 1e3
    assert cert.covers(inside).all()
    # Generic sequences leave the plane: not covered.
    assert not cert.covers(rng.normal(size=(10, 6, d))).any()
    # Units do not matter: scale training and new inputs together.
    for c in (1e-6, 1e6):
        scaled = certify_identifiability(X * c, readout=readout)
        assert scaled.covers(inside * c).all()
        assert not scaled.covers(rng.normal(size=(10, 6, d)) * c).any()


def test_covers_all_readout_is_per_prefix():
    # A sequence leaving the span only at its last token: its earlier prefixes
    # are covered, the whole sequence (readout "all") is not.
    rng = np.random.default_rng(14)
    basis = np.linalg.qr(rng.normal(size=(3, 2)))[0]
    X = rng.normal(size=(40, 5, 2)) @ basis.T
    cert_all = certify_identifiability(X, readout="all")
    # The same feature rows as separate prefix sequences, readout "last".
    prefixes = np.full((40 * 5, 5, 3), np.nan)
    for t in range(5):
        prefixes[t * 40 : (t + 1) * 40, : t + 1] = X[:, : t + 1]
    cert_last = certify_identifiability(prefixes)
    assert cert_all.rank == cert_last.rank
    # In the same coordinates the two designs have the same Gram matrix (the
    # certificates standardize each by its own tokens, which differ).
    same = TokenStandardizer.identity(3)
    Xz, lengths = np.nan_to_num(X), np.full(40, 5)
    pz = np.nan_to_num(prefixes)
    pl = np.repeat(np.arange(1, 6), 40)
    a = solve_arrays(Xz, lengths, None, readout="all", solver="eigh", standardizer=same)
    b = solve_arrays(pz, pl, None, solver="eigh", standardizer=same)
    np.testing.assert_allclose(a.eigenvalues, b.eigenvalues, atol=1e-12 * a.lambda_max)
    X_new = rng.normal(size=(6, 4, 2)) @ basis.T
    X_new[3:, -1] = rng.normal(size=(3, 3))  # last token leaves the plane
    X_new[5, 0] = rng.normal(size=3)  # first token too
    covered = cert_all.covers(X_new)
    np.testing.assert_array_equal(covered, [True, True, True, False, False, False])
    per_prefix = np.array(
        [cert_last.covers(X_new[:, : t + 1]) for t in range(4)]
    ).T  # (n_samples, n_prefixes)
    np.testing.assert_array_equal(covered, per_prefix.all(axis=1))
    assert per_prefix[3, :3].all() and not per_prefix[5, 0]


def test_covers_agrees_with_witness_on_orthonormal_memory():
    X, _ = make_associative_memory(300, 2, distribution="orthonormal", random_state=2)
    cert = certify_identifiability(X)
    assert cert.covers(X).all()
    w = _check_witness(cert, X, random_state=5)
    # The witness models agree wherever covers says so.
    X_more, _ = make_associative_memory(50, 2, distribution="orthonormal", random_state=3)
    covered = cert.covers(X_more)
    assert covered.all()  # unseen samples of the same distribution stay in the span
    fa, fb = mhla_forward(X_more, *w.model_a), mhla_forward(X_more, *w.model_b)
    assert np.abs(fa - fb).max() <= 1e-9 * np.abs(fa).max()
    Xg, _ = make_associative_memory(50, 2, distribution="gaussian", random_state=3)
    assert not cert.covers(Xg).any()


# --------------------------------------------------------------------------
# Error bound
# --------------------------------------------------------------------------


def _risk(X, Y, coef, readout="last"):
    """(1/N) sum over feature rows of the squared error, through the forward pass."""
    V, Q = heads_from_coefficients(coef, X.shape[2])
    pred = mhla_forward(X, V, Q, readout=readout)
    sq = np.nansum((pred - Y) ** 2)
    n_rows = pred.shape[0] if readout == "last" else np.count_nonzero(~np.isnan(pred[..., 0]))
    return sq / n_rows


def _diff_at(Z, coef1, coef2, readout="last"):
    d = Z.shape[2]
    f1 = mhla_forward(Z, *heads_from_coefficients(coef1, d), readout=readout)
    f2 = mhla_forward(Z, *heads_from_coefficients(coef2, d), readout=readout)
    diff = np.linalg.norm(f1 - f2, axis=-1)
    return diff if readout == "last" else np.nanmax(diff, axis=1)


def test_error_bound_holds_and_is_attained():
    rng = np.random.default_rng(15)
    X = rng.normal(size=(60, 4, 2))
    Y = rng.normal(size=(60, 2))  # two outputs, not realizable
    Phi = attention_features(X, np.full(60, 4))
    Lam = Phi.T @ Phi / 60
    c_star = np.linalg.lstsq(Phi, Y, rcond=None)[0].T  # (d_out, psi)
    r_star = _risk(X, Y, c_star)
    eps = 1e-3 * r_star
    cert = certify_identifiability(X)
    Z = rng.normal(size=(5, 7, 2))
    bound = cert.error_bound(Z, eps)
    assert bound.shape == (5,) and np.all(np.isfinite(bound)) and np.all(bound > 0)
    H = attention_features(Z, np.full(5, 7))
    for i in range(5):
        # The extremal pair: c* +- sqrt(eps) Lam^-1 h / ||h||_{Lam^-1}, excess eps each.
        v = np.linalg.solve(Lam, H[i])
        step = np.sqrt(eps / (H[i] @ v)) * v
        c1, c2 = c_star.copy(), c_star.copy()
        c1[0] += step
        c2[0] -= step
        for c in (c1, c2):
            assert _risk(X, Y, c) - r_star <= eps * (1 + 1e-6)
        gap = _diff_at(Z[i : i + 1], c1, c2)[0]
        assert gap <= bound[i] * (1 + 1e-6)
        assert gap >= bound[i] * (1 - 1e-6)  # attained: the bound is the supremum
    # Random pairs within eps, spread over both outputs.
    for _ in range(20):
        pair = []
        for _ in range(2):
            D = rng.normal(size=c_star.shape)
            D *= np.sqrt(rng.uniform() * eps / np.einsum("ap,pq,aq->", D, Lam, D))
            pair.append(c_star + D)
        for c in pair:
            assert _risk(X, Y, c) - r_star <= eps * (1 + 1e-6)
        assert np.all(_diff_at(Z, *pair) <= bound * (1 + 1e-9))
    # The coarser forms it implies, including the paper's Lemma A.7 (squared, x4).
    h_norm = np.linalg.norm(H, axis=1)
    z_norm = np.linalg.norm(Z.reshape(5, -1), axis=1)
    lam_min = cert.min_eigenvalue
    assert np.all(bound <= 2 * np.sqrt(eps / lam_min) * h_norm * (1 + 1e-9))
    assert np.all(h_norm <= z_norm**3)
    assert np.all((bound / 2) ** 2 <= eps / lam_min * z_norm**6)
    # Units: scaling the data by c scales Lambda by c**6 and inputs' features by c**3.
    scaled = certify_identifiability(X * 10.0).error_bound(Z * 10.0, eps)
    np.testing.assert_allclose(scaled, bound, rtol=1e-6)


def test_error_bound_on_failed_certificate():
    rng = np.random.default_rng(16)
    basis = np.linalg.qr(rng.normal(size=(3, 2)))[0]
    X = rng.normal(size=(50, 4, 2)) @ basis.T
    Y = rng.normal(size=(50, 1))
    Phi = attention_features(X, np.full(50, 4))
    cert = certify_identifiability(X)
    assert not cert
    c_star = np.linalg.lstsq(Phi, Y, rcond=None)[0].T
    r_star = _risk(X, Y, c_star)
    eps = 1e-2 * r_star
    inside = rng.normal(size=(4, 6, 2)) @ basis.T
    outside = rng.normal(size=(4, 6, 3))
    b_in, b_out = cert.error_bound(inside, eps), cert.error_bound(outside, eps)
    assert np.all(np.isfinite(b_in)) and np.all(b_out == np.inf)
    assert np.all(np.isfinite(cert.error_bound(X, eps)))
    np.testing.assert_array_equal(np.isfinite(cert.error_bound(inside, 0.0)), True)
    assert np.all(cert.error_bound(inside, 0.0) == 0.0)
    # Approximate minimizers with arbitrary null-space parts still obey it inside.
    U, s, Vt = np.linalg.svd(Phi, full_matrices=True)
    null = Vt[np.count_nonzero(s > 1e-10 * s[0]) :]
    Lam = Phi.T @ Phi / 50
    for _ in range(10):
        pair = []
        for _ in range(2):
            D = rng.normal(size=c_star.shape)
            D -= (D @ null.T) @ null
            D *= np.sqrt(eps / np.einsum("ap,pq,aq->", D, Lam, D))
            D += 10 * np.linalg.norm(c_star) * rng.normal(size=null.shape[0]) @ null
            pair.append(c_star + D)
        for c in pair:
            assert _risk(X, Y, c) - r_star <= eps * (1 + 1e-6)
        assert np.all(_diff_at(inside, *pair) <= b_in * (1 + 1e-6))
        assert np.all(_diff_at(outside, *pair) > 1e-3)  # really not determined there


def _null_space_pairs(rng, Phi, c_star, eps, n_pairs=8):
    """Pairs of eps-minimizers that also move far along the exact null space of Phi."""
    _, s, Vt = np.linalg.svd(Phi, full_matrices=True)
    null = Vt[np.count_nonzero(s > 1e-9 * s[0]):]
    G = Phi.T @ Phi / Phi.shape[0]
    pairs = []
    for _ in range(n_pairs):
        pair = []
        for _ in range(2):
            D = rng.normal(size=c_star.shape)
            D -= (D @ null.T) @ null
            D *= np.sqrt(rng.uniform(0.1, 1.0) * eps / np.einsum("ap,pq,aq->", D, G, D))
            D += 10 * np.abs(c_star).max() * rng.normal(size=(c_star.shape[0], len(null))) @ null
            pair.append(c_star + D)
        pairs.append(pair)
    return pairs


@pytest.mark.parametrize("design", ["subspace_in_units", "orthonormal_memory", "one_hot"])
def test_error_bound_holds_on_failed_certificates_at_any_scale(design):
    # Structural rank deficiencies, in mixed units: constructed eps-minimizers
    # that differ arbitrarily along the null space never exceed the bound at
    # covered inputs, whatever the inputs' scale.
    rng = np.random.default_rng(40)
    if design == "subspace_in_units":
        basis = np.linalg.qr(rng.normal(size=(3, 2)))[0] * [[30.0], [1 / 30], [1.0]]
        X = rng.normal(size=(60, 4, 2)) @ basis.T
        Z = rng.normal(size=(6, 5, 2)) @ basis.T
    elif design == "orthonormal_memory":
        X, _ = make_associative_memory(200, 2, distribution="orthonormal", random_state=0)
        Z, _ = make_associative_memory(6, 2, distribution="orthonormal", random_state=1)
    else:
        X = np.eye(4)[rng.integers(0, 4, size=(80, 3))]
        Z = np.eye(4)[rng.integers(0, 4, size=(6, 3))]
    lengths = np.full(X.shape[0], X.shape[1])
    Phi = attention_features(X, lengths)
    Y = rng.normal(size=(X.shape[0], 1))
    c_star = np.linalg.lstsq(Phi, Y, rcond=None)[0].T
    r_star = _risk(X, Y, c_star)
    eps = 1e-2 * max(r_star, 1e-3)
    cert = certify_identifiability(X)
    assert not cert and cert.covers(Z).all()
    pairs = _null_space_pairs(rng, Phi, c_star, eps)
    for c in (1e-60, 1.0, 1e60):
        bound = cert.error_bound(Z * c, eps)
        assert np.all(np.isfinite(bound)) and cert.covers(Z * c).all()
        np.testing.assert_allclose(bound, cert.error_bound(Z, eps) * c**3, rtol=1e-8)
    bound = cert.error_bound(Z, eps)
    for a, b in pairs:
        for coef in (a, b):
            assert _risk(X, Y, coef) - r_star <= eps * (1 + 1e-6)
        assert np.all(_diff_at(Z, a, b) <= bound * (1 + 1e-6) + 1e-9 * np.abs(Y).max())


def test_error_bound_far_from_the_training_scale_is_finite_where_covered():
    """Reproducer: error_bound(X_new * 1e60) was inf while covers() said True."""
    rng = np.random.default_rng(41)
    X = rng.normal(size=(80, 4, 2))
    cert = certify_identifiability(X)
    Z = rng.normal(size=(3, 6, 2))
    base = cert.error_bound(Z, 1e-6)
    for c in (1e-90, 1e-60, 1e60, 1e90):
        assert cert.covers(Z * c).all()
        np.testing.assert_allclose(cert.error_bound(Z * c, 1e-6), base * c**3, rtol=1e-8)


def test_error_bound_all_readout_takes_the_worst_position():
    rng = np.random.default_rng(17)
    X, lengths = _pad(rng, rng.normal(size=(20, 5, 2)))
    Y = rng.normal(size=(20, 5, 1))
    Y[np.isnan(X[..., :1])] = np.nan
    H = ref_prefix_features(X, lengths)
    real = np.arange(5)[None, :] < lengths[:, None]
    Phi = H[real]
    Lam = Phi.T @ Phi / Phi.shape[0]
    c_star = np.linalg.lstsq(Phi, Y[real], rcond=None)[0].T
    r_star = _risk(X, Y, c_star, "all")
    eps = 1e-3 * r_star
    cert = certify_identifiability(X, readout="all")
    Z, z_len = _pad(rng, rng.normal(size=(6, 8, 2)), min_length=1)
    bound = cert.error_bound(Z, eps)
    HZ = ref_prefix_features(Z, z_len)
    solved = np.linalg.solve(Lam, HZ.reshape(-1, 6).T).T.reshape(HZ.shape)
    lev = np.einsum("ntp,ntp->nt", HZ, solved)
    np.testing.assert_allclose(bound, 2 * np.sqrt(eps * lev.max(axis=1)), rtol=1e-7)
    for _ in range(10):
        pair = []
        for _ in range(2):
            D = rng.normal(size=c_star.shape)
            D *= np.sqrt(rng.uniform() * eps / np.einsum("ap,pq,aq->", D, Lam, D))
            pair.append(c_star + D)
        for c in pair:
            assert _risk(X, Y, c, "all") - r_star <= eps * (1 + 1e-6)
        assert np.all(_diff_at(Z, *pair, readout="all") <= bound * (1 + 1e-9))


@pytest.mark.parametrize(
    "epsilon, error",
    [(-1.0, ValueError), (np.inf, ValueError), ("1e-3", TypeError), (None, TypeError)],
)
def test_error_bound_epsilon_errors(epsilon, error):
    cert = certify_identifiability(np.random.default_rng(0).normal(size=(20, 3, 2)))
    with pytest.raises(error, match="epsilon"):
        cert.error_bound(np.ones((1, 3, 2)), epsilon)


# --------------------------------------------------------------------------
# The regressor's certificate_
# --------------------------------------------------------------------------


def _assert_same_certificate(a, b, rtol=1e-10):
    assert bool(a) == bool(b)
    assert (a.rank, a.n_features, a.n_samples, a.n_rows, a.readout) == (
        b.rank, b.n_features, b.n_samples, b.n_rows, b.readout
    )
    assert a.tol == pytest.approx(b.tol, rel=rtol)
    assert a.min_eigenvalue == pytest.approx(b.min_eigenvalue, rel=rtol, abs=a.tol)


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("identifiable", [True, False])
def test_regressor_certificate_equals_standalone(readout, identifiable):
    rng = np.random.default_rng(18)
    n = 40 if identifiable else 5
    X, lengths = _pad(rng, rng.normal(size=(n, 5, 2)))
    if not identifiable and readout == "all":
        X = np.concatenate([X[:, :, :1], 0 * X[:, :, 1:]], axis=2)  # second coordinate unused
    Y = rng.normal(size=(n, 2)) if readout == "last" else rng.normal(size=(n, 5))
    if readout == "all":
        Y[np.isnan(X[..., 0])] = np.nan
    model = LinearAttentionRegressor(readout=readout).fit(X, Y)
    cert = model.certificate_
    standalone = certify_identifiability(X, readout=readout)
    assert bool(cert) is identifiable
    _assert_same_certificate(cert, standalone)
    assert cert.rank == model.feature_rank_
    if readout == "all":
        assert cert.n_rows == lengths.sum()
    # The other solver (SVD of the design instead of eigh of the Gram matrix,
    # or the reverse): same verdict, same numbers to rounding.
    for solver in ("eigh", "svd"):
        other = LinearAttentionRegressor(readout=readout, solver=solver).fit(X, Y).certificate_
        _assert_same_certificate(other, standalone, rtol=1e-6)
    if not identifiable:
        # The witness starts from the fitted model: another exact minimizer.
        w = _check_witness(cert, X, readout)
        assert same_function(*w.model_a, model.value_matrices_, model.key_query_matrices_)
        pred_b = mhla_forward(X, *w.model_b, readout=readout)
        pred = model.predict(X)
        pred = pred if pred.ndim == pred_b.ndim else pred[..., None]
        np.testing.assert_allclose(pred_b, pred, rtol=0, atol=1e-9 * np.nanmax(np.abs(pred)))


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("solver", ["eigh", "dual", "lsmr"])
def test_covers_on_sparse_inputs_matches_the_dense_computation(monkeypatch, readout, solver):
    # One-hot tokens take the sparse-rows path of covers() and error_bound().
    from sklearn_linattn._certificate import _certificate

    rng = np.random.default_rng(0)
    d = 13  # psi = 1183 >= the sparse path's minimum
    n_train = 60 if solver != "eigh" else 400
    X = np.eye(d)[rng.integers(0, 4, size=(n_train, 3))]  # 4 of the 13 symbols
    X_new = np.eye(d)[rng.integers(0, 5, size=(40, 4))]  # a fifth symbol: often not covered
    X_new[:5, 3:] = np.nan
    cert = certify_identifiability(X, readout=readout, solver=solver)
    assert not cert
    sparse = cert.covers(X_new), cert.error_bound(X_new, 1e-3)
    monkeypatch.setattr(_certificate, "_SPARSE_DENSITY", -1.0)  # force the dense path
    dense = cert.covers(X_new), cert.error_bound(X_new, 1e-3)
    np.testing.assert_array_equal(sparse[0], dense[0])
    assert 0 < sparse[0].sum() < len(X_new)
    np.testing.assert_allclose(sparse[1], dense[1], rtol=1e-10)
    monkeypatch.setattr(_certificate, "_SPARSE_DENSITY", 0.25)
    assert cert.covers(X).all()


def test_user_tol_within_the_cholesky_lanczos_error_certifies_with_eigh():
    # psi = 75 > 64: "cholesky" bounds lambda_min by Lanczos, with an error.
    # A user tol between lambda_min - error and lambda_min fails the
    # certificate; covers and witness then need the null space, so the
    # verdict comes from eigh (before: a failed cholesky certificate whose
    # covers and witness raised).
    X = np.random.default_rng(0).normal(size=(200, 6, 5))
    cert = certify_identifiability(X, solver="cholesky")
    assert cert.method == "cholesky" and cert.min_eigenvalue_error > 0
    tol = cert.min_eigenvalue - cert.min_eigenvalue_error / 2
    strict = certify_identifiability(X, solver="cholesky", tol=tol)
    assert strict.method == "eigh"
    assert bool(strict) == bool(certify_identifiability(X, solver="eigh", tol=tol))
    assert strict.covers(X[:3]).shape == (3,)
    if not strict:
        assert strict.witness() is not None
