"""Fixed decays in the features and the fit: loop references, decayed teachers, the certificate."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_linattn import (
    LinearAttentionFeatures,
    LinearAttentionRegressor,
    LinearAttentionRegressorCV,
    certify_identifiability,
    mhla_forward,
)
from sklearn_linattn._cv import DEFAULT_ALPHAS
from sklearn_linattn._features import attention_features, prefix_features, row_factors
from sklearn_linattn._memory import real_tokens

from reference import ref_decayed_features, ref_decayed_prefix_features

D, DECAYS = 4, (1.0, 0.6)


def _padded(rng, n, n_tokens, d, *, scale=1.0, min_length=1):
    lengths = rng.integers(min_length, n_tokens + 1, size=n)
    lengths[0] = n_tokens
    X = scale * rng.normal(size=(n, n_tokens, d))
    X[~real_tokens(lengths, n_tokens)] = 0.0
    return X, lengths


def _nan_padded(X, lengths):
    X = X.copy()
    X[~real_tokens(lengths, X.shape[1])] = np.nan
    return X


def _teacher(seed=0, d=D, d_out=1):
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(len(DECAYS), d_out, d))
    Q = rng.normal(size=(len(DECAYS), d, d))
    return V, Q, np.asarray(DECAYS)


# ------------------------------------------------------------------ features


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 3),
    n_tokens=st.integers(1, 6),
    decays=st.lists(st.sampled_from([1.0, 0.9, 0.5, 1e-3, 0.999]), min_size=1, max_size=3,
                    unique=True),
    float32=st.booleans(),
)
def test_decayed_features_match_the_loop_reference(seed, d, n_tokens, decays, float32):
    rng = np.random.default_rng(seed)
    X, lengths = _padded(rng, 5, n_tokens, d)
    if float32:
        X = X.astype(np.float32)
    decays = tuple(decays)
    ref = ref_decayed_features(X.astype(np.float64), lengths, decays)
    rtol = 1e-5 if float32 else 1e-12
    H = attention_features(X, lengths, decays)
    assert H.shape == ref.shape
    np.testing.assert_allclose(H, ref, rtol=rtol, atol=rtol * np.abs(ref).max(initial=1.0))
    ref_all = ref_decayed_prefix_features(X.astype(np.float64), lengths, decays)
    H_all = prefix_features(X, lengths, decays)
    np.testing.assert_allclose(H_all, ref_all, rtol=rtol,
                               atol=rtol * np.abs(ref_all).max(initial=1.0))
    # The row factors of readout "all" are the real rows, sample-major.
    S, x, _ = row_factors(X, lengths, "all", decays)
    rows = (S[:, :, None] * x[:, None, :]).reshape(S.shape[0], -1)
    real = real_tokens(lengths, n_tokens)
    np.testing.assert_allclose(rows, ref_all[real], rtol=rtol,
                               atol=rtol * np.abs(ref_all).max(initial=1.0))


def test_a_decay_of_one_is_the_plain_block():
    rng = np.random.default_rng(0)
    X, lengths = _padded(rng, 6, 5, 3)
    plain = attention_features(X, lengths)
    np.testing.assert_array_equal(attention_features(X, lengths, (1.0,)), plain)
    np.testing.assert_array_equal(prefix_features(X, lengths, (1.0,)),
                                  prefix_features(X, lengths))


def test_the_transformer_gives_the_decayed_blocks_and_their_names():
    rng = np.random.default_rng(1)
    X, lengths = _padded(rng, 7, 5, 2, min_length=2)
    Xn = _nan_padded(X, lengths)
    feats = LinearAttentionFeatures(decay=[1.0, 0.5]).fit(Xn)
    assert feats.n_features_out_ == 2 * 6
    np.testing.assert_allclose(feats.transform(Xn), ref_decayed_features(X, lengths, (1.0, 0.5)),
                               rtol=1e-12)
    names = feats.get_feature_names_out()
    assert names[0] == "S@1[x0,x0]*last[x0]" and names[6] == "S@0.5[x0,x0]*last[x0]"
    all_rows = LinearAttentionFeatures(readout="all", decay=0.5).fit(Xn).transform(Xn)
    real = real_tokens(lengths, 5)
    np.testing.assert_allclose(all_rows, ref_decayed_prefix_features(X, lengths, (0.5,))[real],
                               rtol=1e-12)


@pytest.mark.parametrize("decay, error", [
    (0.0, ValueError), (1.5, ValueError), ([0.5, 0.5], ValueError), ([], ValueError),
    ("0.5", TypeError), (float("nan"), ValueError), ([[0.5]], ValueError),
])
def test_bad_decays_are_refused_naming_the_parameter(decay, error):
    X = np.random.default_rng(0).normal(size=(40, 3, 2))
    y = X[:, -1, 0]
    for make in (lambda: LinearAttentionRegressor(decay=decay).fit(X, y),
                 lambda: LinearAttentionFeatures(decay=decay).fit(X),
                 lambda: certify_identifiability(X, decay=decay)):
        with pytest.raises(error, match="decay"):
            make()


# ------------------------------------------------------------------ the fit


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("solver", ["eigh", "cholesky", "svd", "dual", "cg", "lsmr"])
def test_a_decayed_two_head_teacher_is_learned_back_out_of_distribution(readout, solver):
    """Two heads of decays 1 and 0.6 at d = 4: learned to 1e-10 on longer, larger inputs."""
    V, Q, g = _teacher()
    rng = np.random.default_rng(2)
    n = 100 if solver == "dual" else 300  # dual: the kernel of the rows stays small
    X, lengths = _padded(rng, n, 6, D, min_length=2)
    Xn = _nan_padded(X, lengths)
    y = mhla_forward(Xn, V, Q, readout=readout, decays=g)[..., 0]
    model = LinearAttentionRegressor(readout=readout, decay=DECAYS, solver=solver,
                                     n_heads="auto", tol=1e-12).fit(Xn, y)
    assert model.certificate_
    assert model.n_heads_ == 2
    np.testing.assert_array_equal(model.head_decays_, g)
    assert model.coef_.shape == (1, 2 * 40)
    X_new = 10.0 * rng.normal(size=(30, 25, D))  # longer and larger than any training input
    y_new = mhla_forward(X_new, V, Q, readout=readout, decays=g)[..., 0]
    tol = 1e-6 if solver == "cg" else 1e-10
    scale = np.abs(y_new).max()
    assert np.abs(model.predict(X_new) - y_new).max() <= tol * scale
    assert np.abs(model.predict_from_coefficients(X_new) - y_new).max() <= tol * scale


def test_heads_per_decay_and_the_plain_model_misses_the_decayed_teacher():
    V, Q, g = _teacher(seed=3)
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 6, D))
    y = mhla_forward(X, V, Q, decays=g)[:, 0]
    X_new = 3.0 * rng.normal(size=(50, 12, D))
    y_new = mhla_forward(X_new, V, Q, decays=g)[:, 0]
    model = LinearAttentionRegressor(decay=DECAYS, n_heads=1).fit(X, y)
    assert model.n_heads_ == 2 and model.compression_residual_ < 1e-10
    np.testing.assert_allclose(model.predict(X_new), y_new, rtol=1e-9, atol=1e-9 * abs(y_new).max())
    plain = LinearAttentionRegressor().fit(X, y)
    assert np.abs(plain.predict(X_new) - y_new).max() > 1e-2 * np.abs(y_new).max()


def test_the_certificate_flips_at_the_total_number_of_features():
    """psi_total = n_decays * psi rows: one fewer fails, that many holds (generic inputs)."""
    rng = np.random.default_rng(4)
    d, decays = 2, (1.0, 0.7, 0.3)
    psi_total = len(decays) * 6
    X = rng.normal(size=(psi_total, 5, d))
    holds = certify_identifiability(X, decay=decays)
    assert holds and holds.n_features == psi_total
    fails = certify_identifiability(X[:-1], decay=decays)
    assert not fails and fails.rank == psi_total - 1
    # Sequences of one token cannot tell the decays apart, however many there are:
    # every block is the same x x^T x, whose rank is that of the 4 cubic monomials.
    single = certify_identifiability(rng.normal(size=(200, 1, d)), decay=decays)
    assert not single and single.rank == 4


def test_the_witness_of_a_failed_decayed_certificate():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(10, 4, 2))  # 10 < psi_total = 12
    cert = certify_identifiability(X, decay=(1.0, 0.5))
    assert not cert
    w = cert.witness(random_state=0)
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    assert w.decays_a is not None and set(np.unique(w.decays_a)) <= {1.0, 0.5}
    ya = mhla_forward(X, Va, Qa, decays=w.decays_a)
    yb = mhla_forward(X, Vb, Qb, decays=w.decays_b)
    np.testing.assert_allclose(ya, yb, atol=1e-8 * max(np.abs(ya).max(), 1.0))
    Z = w.input[None]
    za, zb = mhla_forward(Z, Va, Qa, decays=w.decays_a), mhla_forward(Z, Vb, Qb, decays=w.decays_b)
    assert np.abs(za - zb).max() > 1e-3 * max(np.abs(za).max(), 1.0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), log_scale=st.integers(-60, 60),
       units=st.lists(st.integers(-30, 30), min_size=3, max_size=3))
def test_the_decayed_fit_is_unit_free(seed, log_scale, units):
    """Units per coordinate and any scale: the same predictions, in the data's units."""
    rng = np.random.default_rng(seed)
    d = 3
    V, Q = rng.normal(size=(2, 1, d)), rng.normal(size=(2, d, d))
    g = np.array([1.0, 0.5])
    X, lengths = _padded(rng, 150, 5, d, min_length=2)
    Xn = _nan_padded(X, lengths)
    y = mhla_forward(Xn, V, Q, decays=g)[:, 0]
    c = 10.0 ** log_scale * np.ldexp(1.0, np.asarray(units))  # a unit per coordinate
    base = LinearAttentionRegressor(decay=(1.0, 0.5)).fit(Xn, y)
    scaled = LinearAttentionRegressor(decay=(1.0, 0.5)).fit(Xn * c, y)
    X_new = rng.normal(size=(10, 9, d))
    np.testing.assert_allclose(scaled.predict(X_new * c), base.predict(X_new), rtol=1e-8,
                               atol=1e-8 * np.abs(base.predict(X_new)).max())
    assert scaled.certificate_.rank == base.certificate_.rank == 36


def test_partial_fit_with_decays_equals_fit_and_keeps_its_decays():
    V, Q, g = _teacher(seed=6)
    rng = np.random.default_rng(6)
    X = rng.normal(size=(300, 5, D))
    y = mhla_forward(X, V, Q, decays=g)[:, 0]
    streamed = LinearAttentionRegressor(decay=DECAYS)
    for part in np.array_split(np.arange(300), 3):
        streamed.partial_fit(X[part], y[part])
    whole = LinearAttentionRegressor(decay=DECAYS).fit(X, y)
    X_new = rng.normal(size=(20, 9, D))
    np.testing.assert_allclose(streamed.predict(X_new), whole.predict(X_new), rtol=1e-9)
    streamed.set_params(decay=0.5)
    with pytest.raises(ValueError, match="decay must stay"):
        streamed.partial_fit(X[:10], y[:10])


def test_cross_validation_with_decays_recovers_the_teacher():
    V, Q, g = _teacher(seed=7)
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 5, D))
    y = mhla_forward(X, V, Q, decays=g)[:, 0]
    model = LinearAttentionRegressorCV(decays=[None, 0.6, DECAYS], n_heads="auto").fit(X, y)
    assert model.alpha_ == 0.0 and model.n_heads_ == 2 and model.decay_ == DECAYS
    n = len(DEFAULT_ALPHAS)
    assert list(model.cv_results_["param_decay"][::n]) == [None, (0.6,), DECAYS]
    # The plain model and the one decay miss the teacher: the search saw it.
    assert model.cv_results_["rank_test_score"][2 * n] == 1
    assert model.cv_results_["mean_test_score"][:2 * n].max() < -1e-3
    X_new = 3.0 * rng.normal(size=(20, 11, D))
    y_new = mhla_forward(X_new, V, Q, decays=g)[:, 0]
    np.testing.assert_allclose(model.predict(X_new), y_new, rtol=1e-9,
                               atol=1e-9 * np.abs(y_new).max())


def test_terms_and_decays_and_generation():
    V, Q, g = _teacher(seed=8, d_out=D)
    rng = np.random.default_rng(8)
    X = 0.5 * rng.normal(size=(400, 5, D))
    b, W = rng.normal(size=D), rng.normal(size=(D, D))
    y = mhla_forward(X, V, Q, decays=g) + b + X[:, -1] @ W.T
    model = LinearAttentionRegressor(decay=DECAYS, fit_intercept=True, fit_skip=True,
                                     n_heads="auto").fit(X, y)
    np.testing.assert_allclose(model.intercept_, b, atol=1e-9)
    np.testing.assert_allclose(model.skip_coef_, W, atol=1e-9)
    prompts = 0.5 * rng.normal(size=(3, 4, D))
    out = model.generate(prompts, 2)
    step = prompts
    for _ in range(2):
        nxt = mhla_forward(step, V, Q, decays=g) + b + step[:, -1] @ W.T
        step = np.concatenate([step, nxt[:, None]], axis=1)
    np.testing.assert_allclose(out, step, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("solver", ["eigh", "cg"])
def test_dask_fits_with_decays_equal_the_in_memory_fit(solver):
    da = pytest.importorskip("dask.array")
    V, Q, g = _teacher(seed=9)
    rng = np.random.default_rng(9)
    X = rng.normal(size=(200, 5, D))
    y = mhla_forward(X, V, Q, decays=g)[:, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazy = LinearAttentionRegressor(decay=DECAYS, solver=solver, tol=1e-12).fit(
            da.from_array(X, chunks=(50, 5, D)), da.from_array(y, chunks=50))
    whole = LinearAttentionRegressor(decay=DECAYS, solver="eigh").fit(X, y)
    X_new = rng.normal(size=(10, 8, D))
    np.testing.assert_allclose(lazy.predict(X_new), whole.predict(X_new), rtol=1e-8)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_to_torch_of_a_decayed_model_computes_predict(readout):
    torch = pytest.importorskip("torch")
    from sklearn_linattn.nn import from_torch, to_torch

    V, Q, g = _teacher(seed=10)
    rng = np.random.default_rng(10)
    X, lengths = _padded(rng, 300, 6, D, min_length=2)
    Xn = _nan_padded(X, lengths)
    y = mhla_forward(Xn, V, Q, readout=readout, decays=g)[..., 0]
    model = LinearAttentionRegressor(readout=readout, decay=DECAYS, n_heads="auto").fit(Xn, y)
    layer = to_torch(model)
    X_new = _nan_padded(*_padded(rng, 8, 10, D, min_length=2))
    with torch.no_grad():
        out = layer(torch.from_numpy(X_new)).numpy()[..., 0]
    expected = model.predict(X_new)
    real = ~np.isnan(expected)
    np.testing.assert_allclose(out[real], expected[real], rtol=1e-9,
                               atol=1e-9 * np.abs(expected[real]).max())
    heads = from_torch(layer)
    back = mhla_forward(X_new, heads.value_matrices, heads.key_query_matrices,
                        readout=readout, decays=heads.decays)[..., 0]
    np.testing.assert_allclose(back[real], expected[real], rtol=1e-9,
                               atol=1e-9 * np.abs(expected[real]).max())


@pytest.mark.parametrize("route", ["map", "second pass"])
@pytest.mark.parametrize("readout", ["last", "all"])
def test_chunked_decayed_fit_equals_the_whole_fit(monkeypatch, route, readout):
    """Many chunks: statistics mapped from the first chunk's coordinates (block by block) or
    accumulated again, with decays, equal the fit of all the data at once."""
    import sklearn

    from sklearn_linattn import _problem
    from sklearn_linattn import _source as training_module

    monkeypatch.setattr(training_module, "_VALIDATION_CHUNK", 2**14)
    if route == "second pass":
        monkeypatch.setattr(_problem, "_map_is_cheaper", lambda source: False)
    V, Q, g = _teacher(seed=11, d=3)
    rng = np.random.default_rng(11)
    X, lengths = _padded(rng, 1500, 12, 3, min_length=2)
    X[:300, :, 1] *= 8.0  # the first chunks unlike the rest
    Xn = _nan_padded(X, lengths)
    y = mhla_forward(Xn, V, Q, readout=readout, decays=g)[..., 0]
    with sklearn.config_context(working_memory=2**17 / 2**20):
        chunked = LinearAttentionRegressor(readout=readout, decay=DECAYS, solver="eigh").fit(
            Xn, y)
    whole = LinearAttentionRegressor(readout=readout, decay=DECAYS, solver="eigh").fit(
        [X[i, : lengths[i]] for i in range(len(X))], y if readout == "last" else y)
    X_new = rng.normal(size=(10, 15, 3))
    y_new = mhla_forward(X_new, V, Q, readout=readout, decays=g)[..., 0]
    for model in (chunked, whole):
        np.testing.assert_allclose(model.predict(X_new), y_new, rtol=1e-9,
                                   atol=1e-9 * np.abs(y_new).max())
    np.testing.assert_allclose(chunked.coef_, whole.coef_, rtol=1e-8,
                               atol=1e-10 * np.abs(whole.coef_).max())


def test_a_material_compression_with_decays_names_the_heads_per_decay():
    V, Q, g = _teacher(seed=12)
    rng = np.random.default_rng(12)
    X = rng.normal(size=(30, 6, D))  # fewer rows than psi_total = 80: not identified
    y = mhla_forward(X, V, Q, decays=g)[:, 0]
    from sklearn.exceptions import ConvergenceWarning

    with pytest.warns(ConvergenceWarning, match=r"compressing to 2 heads \(1, 1 per decay"):
        model = LinearAttentionRegressor(decay=DECAYS, n_heads=1).fit(X, y)
    assert model.n_heads_ == 2 and list(model.head_decays_) == [1.0, 0.6]


@pytest.mark.parametrize("decays", [[[1.0], [1.0, 0.5]], [True, True], [0.5, None]])
def test_head_decays_that_are_not_numbers_are_refused_naming_them(decays):
    V, Q, _ = _teacher()
    X = np.random.default_rng(0).normal(size=(3, 4, D))
    with pytest.raises(TypeError, match="decays must be None, a real number in"):
        mhla_forward(X, V, Q, decays=decays)


@pytest.mark.parametrize("d", [1, 2, 5])
def test_the_statistics_of_decayed_blocks_are_those_of_the_features(d):
    """Phi^T W Phi and Phi^T W y from the compact statistics equal those of the feature rows."""
    from sklearn_linattn._solvers import SufficientStatistics
    from sklearn_linattn._units import TokenStandardizer

    rng = np.random.default_rng(d)
    X, lengths = _padded(rng, 200, 6, d)
    y = rng.normal(size=(200, 2))
    w = rng.uniform(0.5, 2.0, size=200)
    decays = (1.0, 0.7, 0.2)
    st = TokenStandardizer.identity(d, 2, decays)
    stats = SufficientStatistics(d, 2, standardizer=st).update(X, lengths, y, sample_weight=w)
    H = ref_decayed_features(X, lengths, decays)
    np.testing.assert_allclose(stats.gram, (H * w[:, None]).T @ H, rtol=1e-12,
                               atol=1e-12 * np.abs(H).max() ** 2)
    np.testing.assert_allclose(stats.moment, (H * w[:, None]).T @ y, rtol=1e-12,
                               atol=1e-12 * np.abs(H).max())
    sub = stats.blocks([2, 0], (0.2, 1.0))
    cols = np.r_[2 * H.shape[1] // 3:H.shape[1], 0:H.shape[1] // 3]
    np.testing.assert_allclose(sub.gram, stats.gram[np.ix_(cols, cols)], rtol=0, atol=0)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_random_teachers_with_decays_are_labelled_and_learned_back(readout):
    from sklearn_linattn.datasets import make_random_mhla

    X, y, params = make_random_mhla(300, 7, 3, n_heads=3, decays=[1.0, 0.5, 0.5],
                                    readout=readout, variable_length=(2, 7), random_state=0,
                                    return_params=True)
    np.testing.assert_array_equal(params["decays"], [1.0, 0.5, 0.5])
    expected = mhla_forward(X, params["V"], params["Q"], readout=readout,
                            decays=params["decays"])[..., 0]
    np.testing.assert_allclose(y, expected, rtol=1e-13, atol=1e-15)
    model = LinearAttentionRegressor(readout=readout, decay=(1.0, 0.5), n_heads="auto").fit(X, y)
    assert model.n_heads_ == 3 and sorted(model.head_decays_) == [0.5, 0.5, 1.0]
    with pytest.raises(ValueError, match="decays must have one decay per head"):
        make_random_mhla(10, 4, 2, n_heads=2, decays=[1.0, 0.5, 0.2])


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("n_tokens, decays", [(2, (1.0, 0.5)), (3, (1.0, 0.7, 0.3))])
def test_the_witness_of_short_sequences_agrees_on_them(readout, n_tokens, decays):
    """Training sequences too short to tell the decays apart: the witness's candidates are
    longer, so its two models agree on the training data and differ on its input."""
    X = np.random.default_rng(0).normal(size=(100, n_tokens, 2))
    cert = certify_identifiability(X, decay=decays, readout=readout)
    assert not cert
    w = cert.witness(random_state=0)
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    ya = mhla_forward(X, Va, Qa, readout=readout, decays=w.decays_a)
    yb = mhla_forward(X, Vb, Qb, readout=readout, decays=w.decays_b)
    assert np.nanmax(np.abs(ya - yb)) <= 1e-10 * np.nanmax(np.abs(ya))
    assert w.input.shape[0] > len(decays)
    Z = w.input[None]
    za, zb = mhla_forward(Z, Va, Qa, decays=w.decays_a), mhla_forward(Z, Vb, Qb, decays=w.decays_b)
    assert np.abs(za - zb).max() > 0.1 * np.abs(za).max()


def test_fractions_are_real_numbers_for_every_numeric_parameter():
    from fractions import Fraction

    V, Q, g = _teacher(seed=13)
    X = np.random.default_rng(13).normal(size=(200, 5, D))
    y = mhla_forward(X, V, Q, decays=[0.5, 0.5])[:, 0]
    exact = LinearAttentionRegressor(decay=0.5, alpha=1e-3).fit(X, y)
    fractions = LinearAttentionRegressor(decay=Fraction(1, 2), alpha=Fraction(1, 1000)).fit(X, y)
    np.testing.assert_array_equal(fractions.predict(X), exact.predict(X))
    with pytest.raises(ValueError, match="alpha must be a real number >= 0"):
        LinearAttentionRegressor(alpha=Fraction(10**400)).fit(X, y)


def test_feature_names_of_near_decays_differ():
    names = LinearAttentionFeatures(decay=(0.5, 0.5000000001, 1 - 1e-12)).fit(
        np.zeros((1, 2, 2))).get_feature_names_out()
    assert len(set(names)) == len(names) == 3 * 6
    assert names[6].startswith("S@0.5000000001[") and names[12].startswith("S@0.999999999999[")


def test_auto_drops_a_decay_the_data_do_not_use():
    """A teacher of decay 0.5 only, fitted with decays (1, 0.5): the block of decay 1 is
    rounding, and n_heads="auto" keeps no head of it."""
    rng = np.random.default_rng(14)
    V, Q = rng.normal(size=(1, 1, D)), rng.normal(size=(1, D, D))
    X = rng.normal(size=(300, 5, D))
    y = mhla_forward(X, V, Q, decays=[0.5])[:, 0]
    model = LinearAttentionRegressor(decay=(1.0, 0.5), n_heads="auto").fit(X, y)
    assert model.n_heads_ == 1 and list(model.head_decays_) == [0.5]
    X_new = 3.0 * rng.normal(size=(10, 9, D))
    y_new = mhla_forward(X_new, V, Q, decays=[0.5])[:, 0]
    np.testing.assert_allclose(model.predict(X_new), y_new, rtol=1e-9,
                               atol=1e-9 * np.abs(y_new).max())


def test_the_coefficients_of_a_decayed_model_are_named_as_blocks_when_misread():
    from sklearn_linattn import heads_from_coefficients

    X = np.random.default_rng(15).normal(size=(100, 4, 2))
    model = LinearAttentionRegressor(decay=(1.0, 0.7, 0.3)).fit(X, X[:, -1, 0] ** 3)
    with pytest.raises(ValueError, match=r"3 blocks of psi = 6 columns are the coefficients "
                                         r"of a model with that many decays"):
        heads_from_coefficients(model.coef_, 2)


def test_the_transformer_refuses_a_decay_set_after_fit():
    X = np.random.default_rng(16).normal(size=(5, 4, 2))
    feats = LinearAttentionFeatures(decay=0.5).fit(X)
    feats.set_params(decay=(1.0, 0.5))
    with pytest.raises(ValueError, match=r"decay=\(1.0, 0.5\) was set after fit"):
        feats.transform(X)
    with pytest.raises(ValueError, match="call fit again"):
        feats.get_feature_names_out()
    assert feats.fit(X).transform(X).shape == (5, feats.n_features_out_) == (5, 12)
