"""paper_min_eigenvalue: the paper's lambda_min of the raw tokens, against the loop reference."""

import numpy as np
import pytest

from reference import ref_features, ref_prefix_features
from sklearn_linattn import certify_identifiability, paper_min_eigenvalue


def _padded(rng, n_samples, n_tokens, d, min_length=1):
    """Gaussian sequences NaN-padded to random lengths, and the lengths."""
    X = rng.normal(size=(n_samples, n_tokens, d))
    lengths = rng.integers(min_length, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, lengths


def _reference_rows(X, lengths, readout, weights):
    """The paper's feature rows by loops, and each row's weight (its sequence's)."""
    if readout == "last":
        return ref_features(X, lengths), np.asarray(weights, dtype=float)
    H = ref_prefix_features(X, lengths)
    real = np.arange(X.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return H[real], np.repeat(np.asarray(weights, dtype=float), lengths)


def _reference_lambda(X, lengths, readout="last", weights=None):
    """lambda_min of (1/sum w) Phi^T W Phi, Phi the loop reference's rows, by numpy."""
    weights = np.ones(X.shape[0]) if weights is None else weights
    Phi, w = _reference_rows(X, lengths, readout, weights)
    return np.linalg.eigvalsh(Phi.T @ (w[:, None] * Phi) / w.sum())


@pytest.mark.parametrize("readout", ["last", "all"])
def test_matches_the_reference_features(readout):
    rng = np.random.default_rng(0)
    X, lengths = _padded(rng, 40, 5, 3, min_length=2)
    values = _reference_lambda(X, lengths, readout)
    assert values[0] > 1e-6 * values[-1]  # well inside float64: a real comparison
    assert paper_min_eigenvalue(X, readout=readout) == pytest.approx(values[0], rel=1e-9)
    # A list of unpadded sequences is the same data.
    seqs = [X[i, : lengths[i]] for i in range(X.shape[0])]
    assert paper_min_eigenvalue(seqs, readout=readout) == pytest.approx(values[0], rel=1e-9)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_sample_weight_is_the_weighted_mean_and_counts_sequences(readout):
    rng = np.random.default_rng(1)
    X, lengths = _padded(rng, 30, 4, 2, min_length=2)
    w = rng.integers(0, 4, size=30).astype(float)
    w[:3] = [0.0, 2.0, 1.0]
    values = _reference_lambda(X, lengths, readout, w)
    got = paper_min_eigenvalue(X, readout=readout, sample_weight=w)
    assert got == pytest.approx(values[0], rel=1e-9)
    # Weight 2 is the sequence twice, weight 0 is the sequence dropped.
    repeated = np.repeat(X, w.astype(int), axis=0)
    assert got == pytest.approx(paper_min_eigenvalue(repeated, readout=readout), rel=1e-9)
    # Weights are relative: multiplying them all changes nothing.
    assert paper_min_eigenvalue(X, readout=readout, sample_weight=w * 1e300) == pytest.approx(
        got, rel=1e-12)


def test_differs_from_the_standardized_certificate_by_units_only():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 5, 3))
    cert = certify_identifiability(X)
    lam = paper_min_eigenvalue(X)
    A = np.diag([1.0, 10.0, 0.1])
    # The certificate's value is unit-free; the paper's follows the data's units.
    assert certify_identifiability(X @ A).min_eigenvalue == pytest.approx(cert.min_eigenvalue,
                                                                         rel=1e-8)
    assert paper_min_eigenvalue(X @ A) != pytest.approx(lam, rel=1e-2)
    assert paper_min_eigenvalue(X @ A) == pytest.approx(_reference_lambda(
        X @ A, np.full(60, 5))[0], rel=1e-8)


def test_singular_lambda_d_is_exactly_zero():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(17, 5, 3))  # psi = 18 > 17 rows
    values = _reference_lambda(X, np.full(17, 5))
    assert abs(values[0]) <= 18 * np.finfo(float).eps * values[-1]
    assert paper_min_eigenvalue(X) == 0.0
    assert paper_min_eigenvalue(np.zeros((5, 3, 2))) == 0.0
    # Orthonormal keys and values (the paper's Sec. 4.2): zero however many samples.
    from sklearn_linattn.datasets import make_associative_memory

    X, _ = make_associative_memory(400, 2, distribution="orthonormal", random_state=0)
    assert paper_min_eigenvalue(X) == 0.0


@pytest.mark.parametrize("readout", ["last", "all"])
def test_powers_of_two_scale_it_exactly_where_the_naive_gram_overflows(readout):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 4, 2))
    lam = paper_min_eigenvalue(X, readout=readout)
    assert 0 < lam < 2.0**3
    lengths = np.full(40, 4)
    # 2**170: features about 2**510, their Gram matrix about 2**1020 times
    # lambda_max, beyond float64; lambda_min itself, 2**1020 * lam, is not.
    big = X * 2.0**170
    with np.errstate(over="ignore", invalid="ignore"):
        Phi, w = _reference_rows(big, lengths, readout, np.ones(40))
        naive = Phi.T @ Phi / w.sum()
    assert not np.all(np.isfinite(naive))
    assert paper_min_eigenvalue(big, readout=readout) == np.ldexp(lam, 1020)
    assert paper_min_eigenvalue(X * 2.0**-150, readout=readout) == np.ldexp(lam, -900)


def test_outside_float64_is_an_error_not_zero_or_inf():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, 4, 2))
    with pytest.raises(ValueError, match="overflows float64 in the data's units"):
        paper_min_eigenvalue(X * 2.0**200)
    with pytest.raises(ValueError, match="underflows float64 in the data's units"):
        paper_min_eigenvalue(X * 2.0**-200)
    # The certificate's value, unit-free, is the same at both scales.
    a = certify_identifiability(X * 2.0**200).min_eigenvalue
    b = certify_identifiability(X * 2.0**-200).min_eigenvalue
    assert a == pytest.approx(b, rel=1e-9)


def test_small_last_tokens_beside_large_ones():
    # Tokens up to 2**200, last tokens about 2**-400: the features S * x_last
    # are of order 1, and so is lambda_min, although scaling every token by
    # the same power of two would put the last ones below float64's range.
    rng = np.random.default_rng(6)
    X = rng.normal(size=(40, 4, 2))
    X[:, :-1] *= 2.0**200
    X[:, -1] *= 2.0**-400
    values = _reference_lambda(X, np.full(40, 4))
    assert np.isfinite(values).all() and values[0] > 1e-6 * values[-1]
    assert paper_min_eigenvalue(X) == pytest.approx(values[0], rel=1e-9)


def test_invalid_arguments():
    X = np.random.default_rng(7).normal(size=(10, 3, 2))
    with pytest.raises(ValueError, match="sample_weight must be positive for at least one"):
        paper_min_eigenvalue(X, sample_weight=np.zeros(10))
    with pytest.raises(ValueError, match="readout"):
        paper_min_eigenvalue(X, readout="first")
    with pytest.raises(ValueError, match="sample_weight"):
        paper_min_eigenvalue(X, sample_weight=np.ones(9))
