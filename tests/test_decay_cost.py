"""A search over candidate decays scores each candidate as a search over it alone would.

``LinearAttentionRegressorCV(decays=[...])`` gathers the statistics of the
union of the candidates' blocks in one pass, the cross blocks of two blocks
only where a candidate holds both (:func:`decay_blocks`' groups), reads each
candidate's from them, and scores it with the solver a search over it alone
uses (the kernel of the kept rows for far fewer rows than features).  The
joint search equals the separate ones: scores, choices and the refitted model.
No timing here (``python -m benchmarks.decays --only joint`` measures the cost).
"""

import functools

import numpy as np
import pytest
from numpy.testing import assert_allclose

from sklearn_linattn import LinearAttentionRegressorCV
from sklearn_linattn import _source
from sklearn_linattn._attention import decay_blocks
from sklearn_linattn._moments import MomentPass
from sklearn_linattn._solvers import SufficientStatistics, _statistics
from sklearn_linattn._units import TokenStandardizer
from sklearn_linattn.preprocessing import Patches, PositionalEncoding

pytestmark = pytest.mark.filterwarnings("ignore::sklearn_linattn.exceptions.GridEdgeWarning")

CANDIDATES = [None, 0.9, (1.0, 0.5)]
ALPHAS = [0.0, 1e-4, 1e-2, 1.0]


def sine_windows(n_windows=60, window=24, patch=4, seed=0):
    """Windows of a noisy sine cut into patches with one-hot positions; next value as target."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_windows + window)
    s = np.sin(2 * np.pi * t / 17.0) + 0.1 * rng.normal(size=t.size)
    X = s[np.arange(n_windows)[:, None] + np.arange(window)][:, :, None]
    y = s[np.arange(n_windows) + window]
    return PositionalEncoding().fit_transform(Patches(patch).fit_transform(X)), y


def tall_sequences(n=200, n_tokens=5, d=3, seed=1):
    """More rows than features: a decayed two-head teacher plus noise."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_tokens, d))
    lags = 0.5 ** np.arange(n_tokens)[::-1]
    y = (X[:, -1, 0] * ((X[:, :, 1] ** 2) * lags).sum(axis=1)
         + X[:, -1, 1] * (X[:, :, 0] * X[:, :, 2]).sum(axis=1) + 0.1 * rng.normal(size=n))
    return X, y


def assert_joint_equals_separate(X, y, candidates=CANDIDATES, **params):
    joint = LinearAttentionRegressorCV(decays=candidates, alphas=ALPHAS, cv=4,
                                       **params).fit(X, y)
    separate = [LinearAttentionRegressorCV(decays=[c], alphas=ALPHAS, cv=4, **params).fit(X, y)
                for c in candidates]
    n = separate[0].cv_results_["mean_test_score"].size  # alphas x sets of terms
    keys = [f"split{k}_test_score" for k in range(4)] + ["mean_test_score"]
    for i, (c, one) in enumerate(zip(candidates, separate)):
        for key in keys:
            assert_allclose(joint.cv_results_[key][i * n:(i + 1) * n], one.cv_results_[key],
                            rtol=1e-10, atol=0, err_msg=f"{key} of decay {c}")
    best = int(np.argmax([one.best_score_ for one in separate]))
    expected = separate[best]
    assert joint.decay_ == expected.decay_ == (None if candidates[best] is None
                                               else tuple(np.atleast_1d(candidates[best])))
    assert joint.alpha_ == expected.alpha_
    assert joint.best_score_ == pytest.approx(expected.best_score_, rel=1e-10)
    assert joint.solver_ == expected.solver_
    scale = np.abs(expected.predict(X)).max()
    assert_allclose(joint.predict(X), expected.predict(X), rtol=0, atol=1e-10 * scale)
    return joint, separate


def test_wide_windows_search_equals_separate_searches():
    X, y = sine_windows()
    joint, _ = assert_joint_equals_separate(X, y)
    assert joint.solver_ == "dual"  # the kernel path, as each candidate alone


def test_tall_search_with_terms_equals_separate_searches():
    X, y = tall_sequences()
    joint, _ = assert_joint_equals_separate(X, y, fit_intercept="auto")
    assert joint.solver_ in ("eigh", "cholesky")
    assert joint.decay_ == (1.0, 0.5)


def test_tuple_candidates_sharing_blocks_equal_separate_searches():
    X, y = tall_sequences(d=4, seed=2)  # 40 features a block: the pair products' path
    # Blocks 1.0 and 0.9 are read together (the tuple's order is not the union's), 0.5 alone.
    candidates = [1.0, 0.5, (0.9, 1.0)]
    assert decay_blocks(*candidates).groups == ((0, 2), (1,))
    assert_joint_equals_separate(X, y, candidates=candidates)


def test_search_over_chunks_equals_separate_searches(monkeypatch):
    # Chunks of the data: the first chunk's coordinates are not the final ones, and
    # the statistics are gathered again in those (a second pass, with the groups).
    monkeypatch.setattr(_source, "_VALIDATION_CHUNK", 300)
    X, y = tall_sequences(n=240, seed=3)
    X[20:] *= np.array([4.0, 0.25, 1.0])
    assert_joint_equals_separate(X, y, candidates=[0.9, (1.0, 0.5)])


def test_a_pass_maps_each_group_of_blocks_into_the_final_coordinates():
    rng = np.random.default_rng(5)
    X, Y = rng.normal(size=(40, 5, 3)), rng.normal(size=(40, 1))
    union = decay_blocks(0.9, (1.0, 0.5))
    # A map of condition 1 (one power of two): mapped, not gathered again.
    final = TokenStandardizer([1, 1, 1], y_exponents=[2], weight_exponent=1, decays=union)
    labels = np.arange(40) % 3
    parts = []
    for decays in (union, tuple(union)):  # grouped, and the whole statistics
        one = MomentPass(3, 1, "last", decays=decays, groups=labels,
                         provisional=TokenStandardizer.identity(3, 1, union),
                         statistics=functools.partial(SufficientStatistics, 3, 1,
                                                      readout="last"))
        parts.append(one.add(X, np.full(40, 5), Y).group_statistics(final))
    for grouped, whole in zip(*parts):
        assert grouped.block_groups == ((0,), (1, 2)) and whole.block_groups is None
        assert grouped.standardizer == whole.standardizer == final
        for which in ([0], [1, 2], [2, 1]):
            decays = tuple(union[b] for b in which)
            a, b = whole.blocks(which, decays).gram, grouped.blocks(which, decays).gram
            assert_allclose(b, a, rtol=1e-13, atol=1e-13 * np.abs(a).max())
        assert_allclose(grouped.moment, whole.moment, rtol=1e-13)


def test_decay_blocks_groups_join_the_blocks_of_each_model():
    blocks = decay_blocks(None, 0.9, 0.5)
    assert blocks == (1.0, 0.9, 0.5) and blocks.groups == ((0,), (1,), (2,))
    blocks = decay_blocks((1.0, 0.9), 0.5, (0.2, 0.9))
    assert blocks == (1.0, 0.9, 0.5, 0.2) and blocks.groups == ((0, 1, 3), (2,))
    assert decay_blocks(np.array([0.5, 1.0, 0.5])).groups == ((0, 1),)
    assert decay_blocks() == () and decay_blocks().groups == ()


def _stats(d, union, groups=None, seed=0):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(50, 4, d)), rng.normal(size=(50, 2))
    stats = SufficientStatistics(d, 2, standardizer=TokenStandardizer.identity(d, 2, union))
    if groups is not None:
        stats.gather_block_groups(groups)
    return stats.update(X, np.full(50, 4), Y)


@pytest.mark.parametrize("d", [2, 4])  # the rows' SYRK and the pair products
def test_grouped_statistics_hold_the_blocks_of_the_whole(d):
    union, groups = (1.0, 0.9, 0.5), ((0, 2), (1,))
    whole, grouped = _stats(d, union), _stats(d, union, groups)
    for which in ([0, 2], [2, 0], [1], [2]):
        decays = tuple(union[b] for b in which)
        a, b = whole.blocks(which, decays), grouped.blocks(which, decays)
        assert b.block_groups is None and b.standardizer.decays == decays
        assert_allclose(b.gram, a.gram, rtol=1e-13, atol=1e-13 * np.abs(a.gram).max())
        assert_allclose(b.moment, a.moment, rtol=1e-13)
        assert b.n_rows == a.n_rows == 50
    # The whole Gram matrix is the whole's, its blocks in place: a principal submatrix.
    psi = whole.n_features // 3
    cols = np.r_[2 * psi:3 * psi, 0:psi]
    assert_allclose(whole.blocks([2, 0], (0.5, 1.0)).gram, whole.gram[np.ix_(cols, cols)])
    with pytest.raises(ValueError, match="not available"):
        grouped.gram
    with pytest.raises(ValueError, match="not within one of the groups"):
        grouped.blocks([0, 1], (1.0, 0.9))
    with pytest.raises(ValueError, match="cannot merge"):
        whole.merge(grouped)


@pytest.mark.parametrize("accurate", [True, False])
def test_grouped_statistics_map_into_other_coordinates(accurate, monkeypatch):
    if not accurate:  # the map of the Gram matrix's factor, group by group
        monkeypatch.setattr(_statistics, "map_is_accurate", lambda B: False)
    union, groups = (1.0, 0.9, 0.5), ((0,), (1, 2))
    whole, grouped = _stats(4, union), _stats(4, union, groups)
    other = TokenStandardizer([1, -2, 0, 3], y_exponents=[1, 0], weight_exponent=2,
                              decays=union)
    a, b = whole.restandardized(other), grouped.restandardized(other)
    assert b.block_groups == groups
    for which in ([0], [1, 2], [2]):
        decays = tuple(union[i] for i in which)
        ga, gb = a.blocks(which, decays).gram, b.blocks(which, decays).gram
        assert_allclose(gb, ga, rtol=1e-12, atol=1e-12 * np.abs(ga).max())
    assert_allclose(b.moment, a.moment, rtol=1e-13)
    assert_allclose(b.y_cross, a.y_cross)
