"""Tests for sklearn_linattn.datasets, against slow loop references."""

import numpy as np
import pytest

from sklearn_linattn import mhla_forward
from sklearn_linattn._validation import check_sequences, check_targets, sequence_lengths
from sklearn_linattn.datasets import (
    dfa_vocabulary,
    make_associative_memory,
    make_dfa_execution,
    make_random_mhla,
)

# ---------------------------------------------------------------------------
# Slow references
# ---------------------------------------------------------------------------


def loop_mhla(x, V, Q, t):
    """Output at position t of one sequence x (n_tokens, d), by loops."""
    out = np.zeros(V.shape[1])
    for h in range(V.shape[0]):
        for s in range(t + 1):
            out += V[h] @ x[s] * (x[s] @ Q[h] @ x[t])
    return out


def loop_dfa_history(delta, word, start=0):
    """Computation history of a DFA on a word: list of (s, w, s') triples."""
    history, s = [], start
    for w in word:
        s_next = int(delta[s][w])
        history.append((s, int(w), s_next))
        s = s_next
    return history


def loop_dfa_string(delta, word, vocabulary):
    """The task's string, as token names, built by plain loops."""
    n_states, alphabet_size = len(delta), len(delta[0])
    chars = []
    for s in range(n_states):
        for w in range(alphabet_size):
            chars += ["(", f"q{s}", f"a{w}", f"q{delta[s][w]}", ")"]
    chars.append("|")
    chars += [f"a{w}" for w in word]
    chars.append("|")
    for s, w, s_next in loop_dfa_history(delta, word):
        chars += [f"q{s}", f"a{w}", f"q{s_next}"]
    return chars


ALL_MAKERS = [
    lambda **kw: make_random_mhla(20, 5, 3, **kw),
    lambda **kw: make_associative_memory(20, 3, distribution="mixture", **kw),
    lambda **kw: make_dfa_execution(20, **kw),
]


# ---------------------------------------------------------------------------
# Common behaviour
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", ALL_MAKERS)
def test_reproducible_with_random_state(make):
    X1, y1, p1 = make(random_state=3, return_params=True)
    X2, y2, p2 = make(random_state=np.random.RandomState(3), return_params=True)
    X3, y3 = make(random_state=4)
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(y1, y2)
    assert p1.keys() == p2.keys()
    for key in p1:
        np.testing.assert_array_equal(p1[key], p2[key])
    assert not np.array_equal(X1, X3)


@pytest.mark.parametrize("make", ALL_MAKERS)
def test_numpy_generator_accepted_and_consumed(make):
    Xa, ya = make(random_state=np.random.default_rng(7))
    Xb, yb = make(random_state=np.random.default_rng(7))
    np.testing.assert_array_equal(Xa, Xb)
    np.testing.assert_array_equal(ya, yb)
    rng = np.random.default_rng(7)
    X1, _ = make(random_state=rng)
    X2, _ = make(random_state=rng)  # the generator advanced: new data
    np.testing.assert_array_equal(X1, Xa)
    assert not np.array_equal(X1, X2)


@pytest.mark.parametrize("make", ALL_MAKERS)
def test_return_params_false_returns_pair(make):
    out = make(random_state=0)
    assert isinstance(out, tuple) and len(out) == 2
    out = make(random_state=0, return_params=True)
    assert isinstance(out, tuple) and len(out) == 3 and isinstance(out[2], dict)


# ---------------------------------------------------------------------------
# make_random_mhla
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d_out", [1, 3])
@pytest.mark.parametrize("n_heads", [1, 2])
def test_random_mhla_shapes_and_targets(readout, d_out, n_heads):
    n, T, d = 30, 6, 3
    X, y, params = make_random_mhla(
        n, T, d, n_heads=n_heads, d_out=d_out, readout=readout, random_state=0,
        return_params=True,
    )
    assert X.shape == (n, T, d) and X.dtype == np.float64
    expected = {"last": (n,), "all": (n, T)}[readout] + ((d_out,) if d_out > 1 else ())
    assert y.shape == expected and y.dtype == np.float64
    V, Q = params["V"], params["Q"]
    assert V.shape == (n_heads, d_out, d) and Q.shape == (n_heads, d, d)
    np.testing.assert_array_equal(params["lengths"], np.full(n, T))
    assert np.isfinite(X).all() and np.isfinite(y).all()
    y3 = y.reshape(y.shape[: (1 if readout == "last" else 2)] + (d_out,))
    np.testing.assert_allclose(
        y3, mhla_forward(X, V, Q, readout=readout), rtol=1e-12, atol=1e-15
    )
    # Independent loop reference on a few samples.
    for i in range(4):
        if readout == "last":
            np.testing.assert_allclose(y3[i], loop_mhla(X[i], V, Q, T - 1), rtol=1e-10)
        else:
            for t in range(T):
                np.testing.assert_allclose(
                    y3[i, t], loop_mhla(X[i], V, Q, t), rtol=1e-10
                )


@pytest.mark.parametrize("readout", ["last", "all"])
def test_random_mhla_variable_length(readout):
    n, T, d = 200, 7, 2
    X, y, params = make_random_mhla(
        n, T, d, d_out=2, readout=readout, variable_length=(2, 5), random_state=1,
        return_params=True,
    )
    lengths = params["lengths"]
    # The package's padding rule accepts X (trailing all-NaN rows only) and
    # finds the generated lengths.
    np.testing.assert_array_equal(sequence_lengths(X), lengths)
    assert lengths.min() == 2 and lengths.max() == 5
    assert set(np.unique(lengths)) == {2, 3, 4, 5}
    real = np.arange(T)[None, :] < lengths[:, None]
    assert not np.isnan(X[real]).any()
    assert np.isnan(X[~real]).all()
    X0 = np.where(np.isnan(X), 0.0, X)
    if readout == "all":
        assert y.shape == (n, T, 2)
        assert np.array_equal(np.isnan(y).any(axis=2), ~real)
        assert np.array_equal(np.isnan(y).all(axis=2), ~real)
        # The package's own target validation accepts the pair.
        Xv, lv = check_sequences(X)
        check_targets(y, lv, Xv.shape[1], readout="all")
        for i in range(5):
            for t in range(lengths[i]):
                np.testing.assert_allclose(
                    y[i, t], loop_mhla(X0[i], params["V"], params["Q"], t), rtol=1e-10
                )
    else:
        assert y.shape == (n, 2) and np.isfinite(y).all()
        for i in range(5):
            np.testing.assert_allclose(
                y[i], loop_mhla(X0[i], params["V"], params["Q"], lengths[i] - 1),
                rtol=1e-10,
            )


def test_random_mhla_variable_length_true_means_full_range():
    X, _, params = make_random_mhla(
        300, 4, 2, variable_length=True, random_state=0, return_params=True
    )
    assert set(np.unique(params["lengths"])) == {1, 2, 3, 4}
    np.testing.assert_array_equal(sequence_lengths(X), params["lengths"])


def test_random_mhla_noise_has_requested_std():
    noise = 0.3
    X, y, params = make_random_mhla(
        400, 10, 2, readout="all", noise=noise, random_state=0, return_params=True
    )
    clean = mhla_forward(X, params["V"], params["Q"], readout="all")[..., 0]
    residual = y - clean
    assert abs(residual.std() - noise) < 0.05 * noise
    assert abs(residual.mean()) < 0.05 * noise
    # Same seed without noise: the clean targets, exactly.
    _, y0 = make_random_mhla(400, 10, 2, readout="all", random_state=0)
    np.testing.assert_array_equal(y0, clean)


def test_random_mhla_default_scales_follow_the_paper():
    d, T = 8, 50
    X, _, params = make_random_mhla(
        200, T, d, n_heads=40, random_state=0, return_params=True
    )
    assert abs(X.std() - 1 / np.sqrt(T)) < 0.02 / np.sqrt(T)
    for W in (params["V"], params["Q"]):
        assert abs(W.std() - 1 / np.sqrt(d)) < 0.1 / np.sqrt(d)


def test_random_mhla_explicit_scales():
    X, _, params = make_random_mhla(
        200, 20, 4, n_heads=50, weight_scale=2.0, token_scale=3.0, random_state=0,
        return_params=True,
    )
    assert abs(X.std() - 3.0) < 0.1
    assert abs(params["Q"].std() - 2.0) < 0.1


# ---------------------------------------------------------------------------
# make_associative_memory
# ---------------------------------------------------------------------------


def _split(X, d):
    return X[:, :d, :d], X[:, :d, d:], X[:, d, :d], X[:, d, d:]


@pytest.mark.parametrize("distribution", ["gaussian", "orthonormal", "mixture"])
@pytest.mark.parametrize("d", [1, 2, 4])
def test_associative_memory_structure(distribution, d):
    n = 60
    X, y, params = make_associative_memory(
        n, d, distribution=distribution, random_state=0, return_params=True
    )
    assert X.shape == (n, d + 1, 2 * d) and X.dtype == np.float64
    assert y.shape == (n, 2 * d) and y.dtype == np.float64
    V, Q = params["V"], params["Q"]
    eye, zero = np.eye(d), np.zeros((d, d))
    np.testing.assert_array_equal(V[0], np.block([[zero, zero], [zero, eye]]))
    np.testing.assert_array_equal(Q[0], np.block([[eye, zero], [zero, zero]]))
    keys, values, q, zeta = _split(X, d)
    idx = params["query_index"]
    assert idx.shape == (n,) and idx.min() >= 0 and idx.max() < d
    # The query key is one of the keys, the one at query_index.
    np.testing.assert_array_equal(q, keys[np.arange(n), idx])
    # Targets are the generating MHLA's output.
    np.testing.assert_array_equal(y, mhla_forward(X, V, Q))
    # Closed form, by loops: y = (0; sum_t v_t (k_t . q) + zeta (q . q)).
    for i in range(n):
        expected = zeta[i] * (q[i] @ q[i])
        for t in range(d):
            expected = expected + values[i, t] * (keys[i, t] @ q[i])
        np.testing.assert_allclose(y[i, d:], expected, rtol=1e-12, atol=1e-14)
        assert np.all(y[i, :d] == 0)

    ortho = params["orthonormal"]
    assert ortho.dtype == bool and ortho.shape == (n,)
    if distribution == "gaussian":
        assert not ortho.any()
    elif distribution == "orthonormal":
        assert ortho.all()
    else:
        assert ortho.any() and not ortho.all()
    for i in range(n):
        gram_k, gram_v = keys[i] @ keys[i].T, values[i] @ values[i].T
        if ortho[i]:
            np.testing.assert_allclose(gram_k, eye, atol=1e-12)
            np.testing.assert_allclose(gram_v, eye, atol=1e-12)
            # Retrieval: the stored value plus the query's own term.
            np.testing.assert_allclose(
                y[i, d:], values[i, idx[i]] + zeta[i], atol=1e-12
            )
        else:
            assert not np.allclose(gram_k, eye, atol=1e-6)
            assert not np.allclose(gram_v, eye, atol=1e-6)


def test_associative_memory_value_targets():
    d = 3
    X, y, params = make_associative_memory(
        40, d, distribution="mixture", targets="value", random_state=5,
        return_params=True,
    )
    X_tok, y_tok = make_associative_memory(
        40, d, distribution="mixture", targets="token", random_state=5
    )
    np.testing.assert_array_equal(X, X_tok)
    assert y.shape == (40, d) and params["V"].shape == (1, d, 2 * d)
    np.testing.assert_allclose(y, y_tok[:, d:], rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(y, mhla_forward(X, params["V"], params["Q"]))
    _, y1 = make_associative_memory(5, 1, targets="value", random_state=0)
    assert y1.shape == (5,)


def test_associative_memory_distributions():
    d, n = 4, 4000
    X, _, params = make_associative_memory(
        n, d, distribution="mixture", p_orthonormal=0.3, random_state=0,
        return_params=True,
    )
    ortho = params["orthonormal"]
    assert abs(ortho.mean() - 0.3) < 0.03
    keys, values, _, zeta = _split(X, d)
    # Gaussian keys and values: N(0, 1/d) entries; zeta: N(0, 1) entries.
    for block in (keys[~ortho], values[~ortho]):
        assert abs(block.var() - 1 / d) < 0.05 / d
        assert abs(block.mean()) < 0.02
    assert abs(zeta.var() - 1.0) < 0.05
    # Haar orthogonal matrices: every entry has mean 0 and variance 1/d.  A QR
    # without sign correction would make the first entry always negative.
    for block in (keys[ortho], values[ortho]):
        assert abs(block[:, 0, 0].mean()) < 0.05
        assert abs(block.var() - 1 / d) < 0.05 / d
    # Query indices are uniform.
    counts = np.bincount(params["query_index"], minlength=d)
    assert counts.min() > 0.2 * n


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_associative_memory_mixture_extremes(p):
    _, _, params = make_associative_memory(
        50, 2, distribution="mixture", p_orthonormal=p, random_state=0,
        return_params=True,
    )
    assert params["orthonormal"].all() == (p == 1.0)
    assert params["orthonormal"].any() == (p == 1.0)


# ---------------------------------------------------------------------------
# make_dfa_execution
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_states, alphabet_size, word_length", [(1, 1, 1), (3, 2, 5), (4, 3, 9)]
)
def test_dfa_string_matches_loop_simulation(n_states, alphabet_size, word_length):
    n = 25
    X, y, params = make_dfa_execution(
        n, n_states=n_states, alphabet_size=alphabet_size, word_length=word_length,
        random_state=0, return_params=True,
    )
    vocabulary = params["vocabulary"]
    assert vocabulary == dfa_vocabulary(n_states, alphabet_size)
    vocab_size = n_states + alphabet_size + 3
    assert len(vocabulary) == len(set(vocabulary)) == vocab_size
    n_chars = 5 * n_states * alphabet_size + 4 * word_length + 2
    assert X.shape == y.shape == (n, n_chars - 1, vocab_size)
    assert X.dtype == y.dtype == np.float64
    delta, words, states, tokens = (
        params["transitions"], params["words"], params["states"], params["tokens"]
    )
    assert delta.shape == (n, n_states, alphabet_size)
    assert words.shape == (n, word_length)
    assert states.shape == (n, word_length + 1)
    assert tokens.shape == (n, n_chars)
    assert delta.min() >= 0 and delta.max() < n_states
    assert words.min() >= 0 and words.max() < alphabet_size
    assert params["history_start"] == 5 * n_states * alphabet_size + word_length + 2
    for i in range(n):
        chars = [vocabulary[c] for c in tokens[i]]
        expected = loop_dfa_string(delta[i].tolist(), words[i].tolist(), vocabulary)
        assert chars == expected
        history = loop_dfa_history(delta[i].tolist(), words[i].tolist())
        assert states[i].tolist() == [0] + [s_next for _, _, s_next in history]
        hist_chars = chars[params["history_start"]:]
        assert hist_chars == [f"{p}{v}" for triple in history
                              for p, v in zip("qaq", triple)]
    # Every token is one-hot, and X / y are the one-hots of the shifted string.
    for A in (X, y):
        assert set(np.unique(A)) == {0.0, 1.0}
        np.testing.assert_array_equal(A.sum(axis=2), 1.0)
    np.testing.assert_array_equal(X.argmax(axis=2), tokens[:, :-1])
    np.testing.assert_array_equal(y.argmax(axis=2), tokens[:, 1:])
    np.testing.assert_array_equal(y[:, :-1], X[:, 1:])


def test_dfa_history_targets():
    X, y_all, params = make_dfa_execution(
        30, n_states=3, alphabet_size=2, word_length=4, random_state=1,
        return_params=True,
    )
    X_h, y_hist = make_dfa_execution(
        30, n_states=3, alphabet_size=2, word_length=4, targets="history",
        random_state=1,
    )
    np.testing.assert_array_equal(X, X_h)
    start = params["history_start"]
    scored = np.arange(X.shape[1]) >= start - 1
    assert np.isnan(y_hist[:, ~scored]).all()
    assert not np.isnan(y_hist[:, scored]).any()
    np.testing.assert_array_equal(y_hist[:, scored], y_all[:, scored])
    # The first scored target is the start state q0, after the separator.
    assert params["tokens"][0, start - 1] == params["vocabulary"].index("|")
    assert (y_hist[:, start - 1].argmax(axis=1) == 0).all()
    # The "all" targets are accepted by the package's validation for readout="all".
    Xv, lengths = check_sequences(X)
    check_targets(y_all, lengths, Xv.shape[1], readout="all")


def test_dfa_transitions_and_words_are_uniform():
    _, _, params = make_dfa_execution(
        2000, n_states=3, alphabet_size=2, word_length=3, random_state=0,
        return_params=True,
    )
    freq = np.bincount(params["transitions"].ravel(), minlength=3) / params[
        "transitions"
    ].size
    np.testing.assert_allclose(freq, 1 / 3, atol=0.02)
    freq = np.bincount(params["words"].ravel(), minlength=2) / params["words"].size
    np.testing.assert_allclose(freq, 1 / 2, atol=0.02)


# ---------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------


RM, AM, DFA = make_random_mhla, make_associative_memory, make_dfa_execution
VE, TE = ValueError, TypeError


@pytest.mark.parametrize(
    "make, kwargs, error, match",
    [
        (RM, {"n_samples": 0}, VE, r"n_samples must be an integer >= 1; got 0"),
        (RM, {"n_samples": 2.5}, TE, r"n_samples must be an integer .* float"),
        (RM, {"n_tokens": True}, TE, r"n_tokens must be an integer"),
        (RM, {"d": -1}, VE, r"d must be an integer >= 1; got -1"),
        (RM, {"n_heads": 0}, VE, r"n_heads must be"),
        (RM, {"d_out": "2"}, TE, r"d_out must be an integer .* str"),
        (RM, {"readout": "first"}, VE, r"readout must be one of .*'first'"),
        (RM, {"noise": -0.1}, VE, r"noise must be a real number >= 0.0; got -0.1"),
        (RM, {"noise": np.nan}, VE, r"noise must be"),
        (RM, {"noise": "a"}, TE, r"noise must be .* str"),
        (
            RM, {"weight_scale": 0.0}, VE,
            r"weight_scale must be None or a real number > 0",
        ),
        (RM, {"token_scale": np.inf}, VE, r"token_scale must be"),
        (RM, {"variable_length": (3, 2)}, VE, r"variable_length must be .*\(3, 2\)"),
        (RM, {"variable_length": (0, 2)}, VE, r"variable_length must be"),
        (RM, {"n_tokens": 4, "variable_length": (1, 5)}, VE, r"max_len <= n_tokens=4"),
        (RM, {"variable_length": 3}, TE, r"variable_length must be .*got 3"),
        (RM, {"variable_length": (1.0, 2)}, TE, r"variable_length must be"),
        (RM, {"random_state": "seed"}, TE, r"random_state must be .*'seed'"),
        (RM, {"random_state": -1}, VE, r"random_state must be .*got -1"),
        (RM, {"return_params": 1}, TE, r"return_params must be True or False; got 1"),
        (AM, {"d": 0}, VE, r"d must be an integer >= 1; got 0"),
        (
            AM, {"distribution": "uniform"}, VE,
            r"distribution must be one of .*'uniform'",
        ),
        (
            AM, {"p_orthonormal": 1.5}, VE,
            r"p_orthonormal must be a real number in \[0.0, 1.0\]; got 1.5",
        ),
        (AM, {"p_orthonormal": None}, TE, r"p_orthonormal must be"),
        (
            AM, {"targets": "key"}, VE,
            r"targets must be one of \('token', 'value'\); got 'key'",
        ),
        (AM, {"random_state": 1.5}, TE, r"random_state must be"),
        (DFA, {"n_states": 0}, VE, r"n_states must be an integer >= 1; got 0"),
        (DFA, {"alphabet_size": 1.0}, TE, r"alphabet_size must be an integer"),
        (DFA, {"word_length": 0}, VE, r"word_length must be an integer >= 1; got 0"),
        (
            DFA, {"targets": "table"}, VE,
            r"targets must be one of \('all', 'history'\); got 'table'",
        ),
        (DFA, {"n_samples": None}, TE, r"n_samples must be an integer .* NoneType"),
    ],
)
def test_bad_arguments_raise_clear_errors(make, kwargs, error, match):
    with pytest.raises(error, match=match):
        make(**kwargs)


def test_positional_options_are_rejected():
    with pytest.raises(TypeError):
        make_random_mhla(10, 5, 2, 3)  # n_heads is keyword-only
    with pytest.raises(TypeError):
        make_associative_memory(10, 2, "gaussian")
    with pytest.raises(TypeError):
        make_dfa_execution(10, 3)
