"""Rows at large d: the map of the moments into standardized coordinates, and what "cg" keeps.

Checked against loops: ``fold(A^T S A)`` entry by entry, and rows computed from
the standardized tokens one sequence at a time.
"""

import tracemalloc
import warnings

import numpy as np
import pytest
import sklearn
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_linattn import LinearAttentionRegressor, _memory
from sklearn_linattn._features import n_pairs, pair_indices
from sklearn_linattn._moments import MomentPass
from sklearn_linattn._units import map_moments, standardized_rows
from sklearn_linattn._solvers.cg import cg_cache_dtype
from sklearn_linattn.datasets import make_random_mhla


def _loop_map(S, A, weights):
    """fold(A^T S A) * weights, one row and one entry at a time."""
    d = A.shape[0]
    j, k = pair_indices(d)
    out = np.empty_like(S)
    for r in range(S.shape[0]):
        full = np.zeros((d, d))
        for p in range(j.size):
            full[j[p], k[p]] = full[k[p], j[p]] = S[r, p]
        mapped = A.T @ full @ A
        for p in range(j.size):
            out[r, p] = mapped[j[p], k[p]] * weights[p]
    return out


@settings(max_examples=40, deadline=None)
@given(
    d=st.integers(1, 12),  # both sides of the pair map's limit (d = 8)
    m=st.integers(0, 5),
    kind=st.sampled_from(["dense", "diagonal", "powers of two"]),
    scale=st.sampled_from([1e-100, 1.0, 1e100]),
    seed=st.integers(0, 2**16),
)
def test_map_moments_matches_the_loop_reference(d, m, kind, scale, seed):
    rng = np.random.default_rng(seed)
    S = rng.normal(size=(m, n_pairs(d))) * scale
    if kind == "dense":
        A = rng.normal(size=(d, d))
    elif kind == "diagonal":
        A = np.diag(rng.uniform(0.5, 2.0, size=d))
    else:
        A = np.diag(np.ldexp(1.0, rng.integers(-60, 60, size=d)))
    j, k = pair_indices(d)
    weights = np.where(j == k, 1.0, np.sqrt(2.0))
    expected = _loop_map(S, A, weights)
    got = map_moments(S, A, weights)
    assert got.shape == expected.shape
    if kind == "powers of two":  # a diagonal map of powers of two is exact
        np.testing.assert_array_equal(got, expected)
    else:
        bound = 1e-13 * scale * np.abs(A).max() ** 2 * d * d
        np.testing.assert_allclose(got, expected, rtol=0, atol=bound)


def _kept_and_streamed(X, lengths, y, readout, decays):
    """The rows the pass keeps (moments mapped) and the rows streamed from the tokens."""
    pass_ = MomentPass(X.shape[2], 1, readout, keep_rows=X.shape[0] * X.shape[1],
                       decays=decays)
    pass_.add(X, lengths, y)
    standardizer = pass_.scales.finish()
    kept = pass_.rows(standardizer)
    streamed = standardized_rows(X, lengths, readout, standardizer, Y=y)
    return standardizer, kept, streamed


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d", [3, 9, 12])
@pytest.mark.parametrize("decays", [None, (1.0, 0.5)])
def test_streamed_rows_match_the_kept_rows(readout, d, decays):
    """Streamed chunks (tokens standardized first where cheaper) = the pass's mapped moments."""
    rng = np.random.default_rng(d)
    n, t = 40, 6
    # Coordinates in different units and correlated: a dense whitening map.
    X = rng.normal(size=(n, t, d)) @ rng.normal(size=(d, d)) * np.geomspace(1e-3, 1e3, d)
    lengths = rng.integers(1, t + 1, size=n)
    X[np.arange(t)[None, :] >= lengths[:, None]] = 0.0
    y = rng.normal(size=(n, 1)) if readout == "last" else rng.normal(size=(n, t, 1))
    standardizer, kept, streamed = _kept_and_streamed(X, lengths, y, readout, decays)
    assert standardizer.whitened
    scale = np.abs(kept.S).max()
    np.testing.assert_allclose(streamed.S, kept.S, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(streamed.x, kept.x, rtol=0, atol=1e-12 * np.abs(kept.x).max())
    np.testing.assert_array_equal(streamed.Y, kept.Y)


def test_a_float32_cache_keeps_no_float64_rows(monkeypatch):
    """With a float32 cache, "cg" holds the cache and not float64 rows twice its size.

    The fit once kept every row in float64 from its pass and then made the
    float32 cache as a copy: three times the cache at the peak (d = 64,
    N = 150 000: 5.2 GB instead of 3 GB).
    """
    X, y = make_random_mhla(16000, 5, 8, random_state=0)[:2]
    n_rows, d = X.shape[0], X.shape[2]
    values = n_rows * (n_pairs(d) + d + 1)
    # A budget where only a float32 cache fits (an eighth of it is below the
    # float64 cache, a quarter above the float32 one).
    budget = 32 * values
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: budget)
    assert cg_cache_dtype(n_rows, d) == np.float32
    model = LinearAttentionRegressor(solver="cg")
    with sklearn.config_context(working_memory=0.25), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tracemalloc.start()
        try:
            model.fit(X, y)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert model.certificate_.identifiable
    float64_rows = 8 * values
    # The float32 cache (half of float64_rows), the certificate's Lanczos
    # vectors and chunks of work arrays: 0.75 of the float64 rows alone, 1.51
    # when they were kept.
    assert peak < float64_rows, (peak, float64_rows)


@pytest.mark.parametrize("d", [1, 3, 5])
@pytest.mark.parametrize("decays", [None, (1.0, 0.6)])
def test_the_gram_expanded_whole_or_by_its_upper_triangle(d, decays):
    """Both expansions of the compact statistics against the feature rows' ``Phi^T W Phi``."""
    from sklearn_linattn._memory import real_tokens
    from sklearn_linattn._solvers import SufficientStatistics
    from sklearn_linattn._units import TokenStandardizer

    from reference import ref_decayed_features

    rng = np.random.default_rng([41, d])
    lengths = rng.integers(1, 7, size=150)
    X = rng.normal(size=(150, 6, d)) * np.geomspace(1.0, 1e3, d)
    X[~real_tokens(lengths, 6)] = 0.0
    w = rng.uniform(0.5, 2.0, size=150)
    st = TokenStandardizer.identity(d, None, decays)
    stats = SufficientStatistics(d, standardizer=st).update(X, lengths, sample_weight=w)
    H = ref_decayed_features(X, lengths, (1.0,) if decays is None else decays)
    G = (H * w[:, None]).T @ H
    atol = 1e-12 * np.abs(G).max()
    np.testing.assert_allclose(stats.gram, G, rtol=1e-12, atol=atol)
    upper = stats.expanded_gram(upper=True)
    np.testing.assert_allclose(np.triu(upper), np.triu(G), rtol=1e-12, atol=atol)
    # Below the diagonal blocks: zeros, nothing left uninitialised.
    P = G.shape[0] // d
    below = np.tril(np.ones((P, P), dtype=bool), -1)
    assert not np.any(upper.reshape(P, d, P, d)[np.nonzero(below)[0], :, np.nonzero(below)[1]])


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("alpha", [0.0, 0.3])
def test_cholesky_from_the_upper_triangle_equals_eigh(readout, alpha):
    """psi = 75 (above the full-spectrum limit): the Cholesky solve reads one triangle."""
    rng = np.random.default_rng([42, len(readout), int(alpha * 10)])
    n = 160 if readout == "last" else 40
    lengths = rng.integers(3, 7, size=n)
    X = rng.normal(size=(n, 6, 5)) * np.array([1e-3, 1.0, 1.0, 30.0, 1e4])
    for i, m in enumerate(lengths):
        X[i, m:] = np.nan
    y = rng.normal(size=(n, 6, 2) if readout == "all" else (n, 2))
    if readout == "all":
        y[np.isnan(X[..., 0])] = np.nan
    w = rng.uniform(0.5, 2.0, size=n)
    chol = LinearAttentionRegressor(readout=readout, alpha=alpha, solver="cholesky")
    chol.fit(X, y, sample_weight=w)
    eigh = LinearAttentionRegressor(readout=readout, alpha=alpha, solver="eigh")
    eigh.fit(X, y, sample_weight=w)
    assert chol.solver_ == "cholesky" and chol.certificate_
    np.testing.assert_allclose(chol.coef_, eigh.coef_, rtol=1e-7,
                               atol=1e-9 * np.abs(eigh.coef_).max())
    a, b = chol.certificate_, eigh.certificate_
    assert a.max_eigenvalue == pytest.approx(b.max_eigenvalue, rel=1e-9)
    assert a.min_eigenvalue == pytest.approx(b.min_eigenvalue, rel=1e-7)
    # The factor (from one triangle) serves the eigenvalues and the error bounds.
    np.testing.assert_allclose(a.eigenvalues, b.eigenvalues, rtol=1e-7,
                               atol=1e-12 * b.max_eigenvalue)
    Z = rng.normal(size=(4, 9, 5))
    np.testing.assert_allclose(a.error_bound(Z, 1e-3), b.error_bound(Z, 1e-3), rtol=1e-7)
