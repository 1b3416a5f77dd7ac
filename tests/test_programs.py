"""Programs compiled into linear attention: generation, builder, shipped programs, learning back."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference import (
    random_generator,
    ref_generate,
    ref_lengths,
    ref_next_token_pairs,
    ref_run_dfa,
    ref_run_turing_machine,
)
from sklearn_linattn import LinearAttentionRegressor, mhla_forward, mhla_generate
from sklearn_linattn.datasets import make_associative_memory
from sklearn_linattn.programs import (
    POSITION,
    CompiledProgram,
    Program,
    associative_memory_program,
    dfa_executor_program,
    dfa_transition_program,
    MOVES,
    next_token_dataset,
    run_dfa,
    run_turing_machine,
    turing_machine_program,
)

# ---------------------------------------------------------------- generation


@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 4),
    n_heads=st.integers(1, 3),
    n_samples=st.integers(1, 3),
    n_tokens=st.integers(1, 4),
    n_steps=st.integers(0, 3),
    scale=st.sampled_from([1e-2, 1.0, 10.0]),
    dtype=st.sampled_from([np.float64, np.float32]),
    padded=st.booleans(),
)
def test_generate_matches_loop_reference(seed, d, n_heads, n_samples, n_tokens, n_steps,
                                         scale, dtype, padded):
    rng = np.random.default_rng(seed)
    V, Q = random_generator(rng, d, d_out=d, n_heads=n_heads)
    X = (scale * rng.normal(size=(n_samples, n_tokens, d))).astype(dtype)
    if padded:
        lengths = rng.integers(1, n_tokens + 1, size=n_samples)
        X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    lengths = ref_lengths(X)
    # Raw outputs grow like scale^(3^k): few steps keep them finite.
    got = mhla_generate(X, V, Q, n_steps)
    want = ref_generate(X, lengths, V, Q, n_steps)
    assert got.shape == (n_samples, n_tokens + n_steps, d)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * scale)


@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 4),
    n_vocab=st.integers(1, 6),
    n_steps=st.integers(1, 5),
)
def test_generate_with_embedding_table_matches_loop_reference(seed, d, n_vocab, n_steps):
    rng = np.random.default_rng(seed)
    V, Q = random_generator(rng, d, d_out=d, n_heads=2)
    table = rng.normal(size=(n_vocab, d))
    X = table[rng.integers(0, n_vocab, size=(3, 4))]
    X[0, 2:] = np.nan
    got = mhla_generate(X, V, Q, n_steps, rounding=table)
    want = ref_generate(X, ref_lengths(X), V, Q, n_steps, rounding=table)
    np.testing.assert_array_equal(got, want)
    # Every generated token is a row of the table.
    gen = got[1, 4:]
    assert all(any(np.array_equal(g, e) for e in table) for g in gen)


def test_generate_with_lengths_ignores_tail_and_callable_rounding():
    rng = np.random.default_rng(0)
    V, Q = random_generator(rng, 3, d_out=3, n_heads=2)
    X = rng.normal(size=(2, 5, 3))
    lengths = np.array([2, 5])
    got = mhla_generate(X, V, Q, 2, lengths=lengths, rounding=np.sign)
    X_nan = X.copy()
    X_nan[0, 2:] = np.nan
    np.testing.assert_array_equal(got, mhla_generate(X_nan, V, Q, 2, rounding=np.sign))
    assert np.isnan(got[0, 4:]).all() and np.isfinite(got[1]).all()
    # The generated tokens are what mhla_forward gives on the growing prefix.
    step = np.sign(mhla_forward(X[1:, :5], V, Q))
    np.testing.assert_array_equal(got[1, 5], step[0])


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(V=np.zeros((1, 2, 3))), ValueError, "d_out = d = 3"),
        (dict(n_steps=-1), ValueError, "n_steps"),
        (dict(n_steps=1.5), TypeError, "n_steps"),
        (dict(rounding=np.zeros((2, 4))), ValueError, r"shape \(n_tokens, 3\)"),
        (dict(rounding=np.zeros((0, 3))), ValueError, "at least one token"),
        (dict(rounding=np.array([["a", "b", "c"]])), TypeError, "rounding"),
        (dict(rounding=np.full((1, 3), np.nan)), ValueError, "finite"),
        (dict(rounding=lambda Y: Y[:, :2]), ValueError, "same shape"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, error, match):
    args = dict(X=np.ones((1, 2, 3)), V=np.zeros((1, 3, 3)), Q=np.zeros((1, 3, 3)), n_steps=1)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        mhla_generate(args.pop("X"), args.pop("V"), args.pop("Q"), args.pop("n_steps"),
                      **args)


def test_estimator_generate_uses_fitted_heads_and_checks_output_dimension():
    rng = np.random.default_rng(1)
    V, Q = random_generator(rng, 3, d_out=3, n_heads=1)
    X = rng.normal(size=(80, 5, 3))
    model = LinearAttentionRegressor().fit(X, mhla_forward(X, V, Q))
    prompts = rng.normal(size=(4, 3, 3))
    np.testing.assert_allclose(model.generate(prompts, 3), mhla_generate(prompts, V, Q, 3),
                               rtol=1e-8, atol=1e-10)
    scalar = LinearAttentionRegressor().fit(X, mhla_forward(X, V, Q)[:, 0])
    with pytest.raises(ValueError, match="output dimension equals the token dimension"):
        scalar.generate(prompts, 1)


# ---------------------------------------------------------------- the builder


def _shift_register(max_length=10):
    return Program(max_length=max_length).attribute("letter", "abc").copy(
        "letter", offset=-3).compile()


def test_copy_repeats_the_prompt_periodically():
    program = _shift_register()
    out = program.run([[{"letter": c} for c in "abc"], [{"letter": c} for c in "cab"]], 6)
    words = ["".join(t["letter"] for t in seq) for seq in program.decode(out)]
    assert words == ["abcabcabc", "cabcabcab"]
    # Generated tokens carry their positions.
    assert program.values(out[0], POSITION).tolist() == list(range(9))


def test_if_then_maps_the_last_token_and_lookup_sums_matches():
    program = (Program(max_length=6)
               .attribute("x", range(3))
               .if_then("x", {0: 1, 1: 2, 2: 0})
               .compile())
    out = program.run([[{"x": 0}]], 4)
    assert [t["x"] for t in program.decode(out[0])] == [0, 1, 2, 0, 1]
    # Two tokens with the same key: their values add up (keys must be unique).
    memory = associative_memory_program(2)
    y = memory.forward(memory.encode([[{"key": 0, "value": 0}, {"key": 0, "value": 1},
                                       {"key": 0}]]))
    np.testing.assert_array_equal(y[0], [0, 0, 1, 1])


def test_compiled_heads_hold_the_tables_between_blocks():
    program = (Program()
               .attribute("q", range(2))
               .attribute("k", "xy")
               .attribute("v", range(3))
               .lookup(query="q", key="k", value="v", dest="q",
                       match={0: "y", 1: "x"}, write=lambda v: v % 2)
               .compile())
    assert program.layout == {"q": slice(0, 2), "k": slice(2, 4), "v": slice(4, 7)}
    Q = np.zeros((7, 7))
    Q[3, 0] = Q[2, 1] = 1  # q=0 looks for k="y", q=1 for k="x"
    V = np.zeros((7, 7))
    V[0, 4] = V[1, 5] = V[0, 6] = 1  # v -> q = v mod 2
    np.testing.assert_array_equal(program.Q[0], Q)
    np.testing.assert_array_equal(program.V[0], V)


def _random_tokens(rng, program, n_tokens):
    tokens = []
    for _ in range(n_tokens):
        token = {}
        for attr, values in program.attributes.items():
            if attr != POSITION and rng.random() < 0.6:
                token[attr] = values[rng.integers(len(values))]
        tokens.append(token)
    return tokens


@given(seed=st.integers(0, 2**32 - 1), n_tokens=st.integers(1, 6), positions=st.booleans())
def test_decode_encode_round_trips(seed, n_tokens, positions):
    rng = np.random.default_rng(seed)
    program = (Program(max_length=8 if positions else None)
               .attribute("letter", "ab")
               .attribute("pair", itertools.product(range(2), "xyz"))
               .attribute("flag", [True])
               .lookup(query="letter", key="letter", value="pair", dest="pair")
               .compile())
    batch = [_random_tokens(rng, program, n_tokens), _random_tokens(rng, program, 2)]
    X = program.encode(batch)
    assert X.shape == (2, max(n_tokens, 2), program.d)
    assert program.decode(X) == batch
    assert program.decode(program.encode(batch[0])) == batch[0]
    np.testing.assert_array_equal(program.round(X[0]), X[0])


def test_round_is_the_nearest_token_of_the_program():
    program = (Program().attribute("a", range(2)).attribute("b", range(3))
               .lookup(query="a", key="a", value="b", dest="b").compile())
    # Every token: each block one-hot or zero.
    tokens = []
    for a in [None, 0, 1]:
        for b in [None, 0, 1, 2]:
            e = np.zeros(5)
            if a is not None:
                e[a] = 1
            if b is not None:
                e[2 + b] = 1
            tokens.append(e)
    tokens = np.array(tokens)
    Y = np.random.default_rng(3).normal(0.4, 0.6, size=(200, 5))
    nearest = tokens[np.argmin(((Y[:, None] - tokens[None]) ** 2).sum(axis=2), axis=1)]
    np.testing.assert_array_equal(program.round(Y), nearest)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda p: p.attribute("a", "xy"), ValueError, "'a' is already declared"),
        (lambda p: p.attribute("b", []), ValueError, "non-empty alphabet"),
        (lambda p: p.attribute("b", "xx"), ValueError, "more than once"),
        (lambda p: p.attribute("b", [[1]]), TypeError, "hashable"),
        (lambda p: p.attribute(3, "xy"), TypeError, "name must be a str"),
        (lambda p: p.attribute(POSITION, range(3)), ValueError, "reserved"),
        (lambda p: p.lookup(query="a", key="zz", value="a", dest="a"), ValueError,
         "unknown attribute 'zz'"),
        (lambda p: p.lookup(query="a", key="a", value="a", dest="a", match=3), TypeError,
         "match must be"),
        (lambda p: p.copy("a"), ValueError, "max_length"),
        (lambda p: p.if_then("a", {0: 1}), ValueError, "max_length"),
        (lambda p: p.compile(), ValueError, "no lookup"),
        (lambda p: p.lookup(query="a", key="a", value="a", dest="a",
                            match=lambda v: v + 1).compile(),
         ValueError, "alphabet overflow .* match maps 'a' value 2 to 3"),
        (lambda p: p.lookup(query="a", key="a", value="a", dest="a",
                            write={0: 7}).compile(),
         ValueError, "alphabet overflow .* write maps 'a' value 0 to 7"),
        (lambda p: p.lookup(query="a", key="a", value="a", dest="a",
                            match=lambda v: None).compile(),
         ValueError, "never matches"),
        (lambda p: p.lookup(query="a", key="a", value="a", dest="a",
                            write={}).compile(),
         ValueError, "never writes"),
    ],
)
def test_bad_programs_raise_clear_errors(build, error, match):
    with pytest.raises(error, match=match):
        build(Program().attribute("a", range(3)))


def test_copy_and_if_then_check_their_arguments():
    program = Program(max_length=4).attribute("a", range(2))
    with pytest.raises(ValueError, match="offset"):
        program.copy("a", offset=0)
    with pytest.raises(TypeError, match="table must be a mapping"):
        program.if_then("a", [1, 0])
    with pytest.raises(ValueError, match="unknown attribute 'b'"):
        program.copy("b")
    with pytest.raises(TypeError, match="max_length"):
        Program(max_length=2.5)


def test_running_past_the_bounds_and_bad_tokens_raise():
    program = _shift_register(max_length=5)
    prompt = [[{"letter": c} for c in "abc"]]
    program.run(prompt, 2)  # exactly fills the 5 positions
    with pytest.raises(ValueError, match="n_steps=3 .* max_length=5"):
        program.run(prompt, 3)
    with pytest.raises(ValueError, match="exceed the program's max_length=5"):
        program.encode([{"letter": "a"}] * 6)
    with pytest.raises(ValueError, match="unknown attribute 'colour'"):
        program.encode([{"colour": "a"}])
    with pytest.raises(ValueError, match="value 'd' is not in the alphabet of 'letter'"):
        program.encode([{"letter": "d"}])
    with pytest.raises(ValueError, match="positions are filled in"):
        program.encode([{POSITION: 0}])
    with pytest.raises(ValueError, match="non-empty list"):
        program.encode([])
    with pytest.raises(ValueError, match="not one-hot or zero"):
        program.decode(np.full((1, program.d), 0.5))
    with pytest.raises(ValueError, match=r"codes\['letter'\] must hold indices"):
        program.encode_indices({"letter": np.array([[5]])})


# ---------------------------------------------------------------- shipped programs


@pytest.mark.parametrize("d", [1, 3, 4])
def test_associative_memory_program_has_the_papers_weights(d):
    memory = associative_memory_program(d)
    _, _, params = make_associative_memory(3, d, return_params=True, random_state=0)
    np.testing.assert_array_equal(memory.V, params["V"])
    np.testing.assert_array_equal(memory.Q, params["Q"])
    X, y = make_associative_memory(50, d, distribution="orthonormal", random_state=1)
    np.testing.assert_allclose(memory.forward(X), y, atol=1e-12)


def test_associative_memory_retrieves_every_stored_value():
    d = 4
    memory = associative_memory_program(d)
    rng = np.random.default_rng(0)
    values = np.array([rng.permutation(d) for _ in range(d)])  # one memory per query key
    prompts = [[{"key": k, "value": int(values[q, k])} for k in range(d)] + [{"key": q}]
               for q in range(d)]
    out = memory.run(prompts, 1)
    assert [memory.decode(seq)[-1] for seq in out] == [
        {"value": int(values[q, q])} for q in range(d)]


def test_dfa_transition_program_is_exact_on_every_table_and_query():
    step = dfa_transition_program(2, 2)
    pairs = list(itertools.product(range(2), range(2)))
    prompts, want = [], []
    for nexts in itertools.product(range(2), repeat=4):
        table = [{"table_key": p, "table_next": s} for p, s in zip(pairs, nexts)]
        for p, s in zip(pairs, nexts):
            prompts.append(table + [{"current": p}])
            want.append({"next_state": s})
    out = step.run(prompts, 1)
    assert [seq[-1] for seq in step.decode(out)] == want


def _all_dfas_and_words(n_states, alphabet_size, max_length):
    tables = np.array(list(itertools.product(range(n_states),
                                             repeat=n_states * alphabet_size)))
    tables = tables.reshape(-1, n_states, alphabet_size)
    words = [list(w) + [-1] * (max_length - L)
             for L in range(1, max_length + 1)
             for w in itertools.product(range(alphabet_size), repeat=L)]
    words = np.array(words)
    return np.repeat(tables, len(words), axis=0), np.tile(words, (len(tables), 1))


def test_dfa_executor_is_exact_on_every_small_automaton_and_word():
    executor = dfa_executor_program(2, 2, 4)
    assert (executor.d, executor.n_heads) == (44, 6)
    T, W = _all_dfas_and_words(2, 2, 4)
    assert len(T) == 16 * 30
    np.testing.assert_array_equal(executor.execute(T, W), ref_run_dfa(T, W))
    np.testing.assert_array_equal(run_dfa(T, W), ref_run_dfa(T, W))


def test_dfa_executor_runs_smaller_automata_within_its_bounds():
    executor = dfa_executor_program(3, 3, 5)
    rng = np.random.default_rng(0)
    for S, A in [(1, 1), (2, 3), (3, 2), (3, 3)]:
        T = rng.integers(0, S, size=(40, S, A))
        W = rng.integers(0, A, size=(40, 5))
        W[rng.random(40) < 0.5, 3:] = -1
        np.testing.assert_array_equal(executor.execute(T, W), ref_run_dfa(T, W))
    # The history: table, word, then (state token, letter token) per letter.
    T, W = np.array([[[1, 0], [0, 1]]]), np.array([[0, 1]])
    history = dfa_executor_program(2, 2, 2).decode(
        dfa_executor_program(2, 2, 2).histories(T, W))[0]
    assert history[4:] == [
        {"word_index": 0, "letter_at": (0, 0)}, {"word_index": 1, "letter_at": (1, 1)},
        {"state_at": (0, 0)}, {"transition": (0, 0, 0)}, {"state_at": (1, 1)},
        {"transition": (1, 1, 1)}, {"state_at": (1, 2)}]


@pytest.mark.parametrize(
    "T, W, match",
    [
        (np.zeros((1, 3, 2), dtype=int), np.zeros((1, 2), dtype=int), "at most 2 states"),
        (np.zeros((1, 2, 3), dtype=int), np.zeros((1, 2), dtype=int), "2 letters"),
        (np.zeros((1, 2, 2), dtype=int), np.zeros((1, 5), dtype=int), "words of 5"),
        (np.full((1, 2, 2), 2), np.zeros((1, 2), dtype=int), r"states in \[0, 1\]"),
        (np.zeros((1, 2, 2), dtype=int), np.full((1, 2), 2), r"letters in \[0, 1\]"),
        (np.zeros((1, 2, 2), dtype=int), np.array([[-1, 0]]), "may only be followed"),
        (np.zeros((1, 2, 2), dtype=int), np.array([[-1, -1]]), "at least one letter"),
        (np.zeros((1, 2, 2)), np.zeros((1, 2), dtype=int), "integer array"),
        (np.zeros((1, 2, 2), dtype=int), np.zeros((2, 2), dtype=int), r"shape \(1, length\)"),
    ],
)
def test_dfa_executor_rejects_inputs_beyond_its_bounds(T, W, match):
    with pytest.raises(ValueError, match=match):
        dfa_executor_program(2, 2, 4).execute(T, W)


def _all_machines(n_states, n_symbols):
    rules = list(itertools.product(range(n_states), range(n_symbols), MOVES))
    machines = np.array(list(itertools.product(rules, repeat=n_states * n_symbols)))
    machines = machines.reshape(-1, n_states, n_symbols, 3)
    return machines[..., 0], machines[..., 1], machines[..., 2]


def _check_simulator(tm, next_state, write, move, tapes, n_steps):
    got = tm.execute(next_state, write, move, tapes, n_steps)
    want = ref_run_turing_machine(next_state, write, move, tapes, n_steps)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(run_turing_machine(next_state, write, move, tapes, n_steps), want):
        np.testing.assert_array_equal(g, w)


def test_turing_machine_simulator_is_exact_on_every_one_state_machine_and_tape():
    tm = turing_machine_program(1, 2, tape_length=3, max_steps=5)
    next_state, write, move = _all_machines(1, 2)  # 6**2 machines
    tapes = np.array(list(itertools.product(range(2), repeat=3)))
    n = len(next_state)
    idx = np.repeat(np.arange(n), len(tapes))
    _check_simulator(tm, next_state[idx], write[idx], move[idx],
                     np.tile(tapes, (n, 1)), 5)


def test_turing_machine_simulator_is_exact_on_random_two_state_machines():
    tm = turing_machine_program(2, 2, tape_length=3, max_steps=6)
    next_state, write, move = _all_machines(2, 2)  # 12**4 machines
    rng = np.random.default_rng(0)
    pick = rng.choice(len(next_state), size=300, replace=False)
    tapes = rng.integers(0, 2, size=(300, 3))
    _check_simulator(tm, next_state[pick], write[pick], move[pick], tapes, 6)
    # Fewer steps than the bound, and a machine with fewer symbols than the bound.
    _check_simulator(tm, next_state[pick[:20]], write[pick[:20]], move[pick[:20]],
                     tapes[:20], 2)
    small = turing_machine_program(2, 3, tape_length=3, max_steps=4)
    _check_simulator(small, next_state[pick[:20]], write[pick[:20]], move[pick[:20]],
                     tapes[:20], 4)


def test_turing_machine_tape_telescopes():
    # Reads sum "plus" and subtract "minus" over every token of the cell.
    tm = turing_machine_program(1, 2, tape_length=2, max_steps=3)
    assert (tm.V < 0).any()
    flip_stay = (np.zeros((1, 1, 2), dtype=int), np.array([[[1, 0]]]), np.zeros((1, 1, 2),
                                                                                dtype=int))
    out = tm.histories(*flip_stay, np.array([[0, 1]]), 3)
    tokens = tm.decode(out[0])
    reads = [t["read"] for t in tokens if "read" in t]
    assert reads == [(0, 0, 0), (0, 0, 1), (0, 0, 0)]  # cell 0 flips every step


@pytest.mark.parametrize(
    "args, match",
    [
        (dict(n_steps=7), "n_steps"),
        (dict(tapes=np.zeros((1, 4), dtype=int)), "exactly 3 cells"),
        (dict(move=np.full((1, 2, 2), 2)), "move must hold -1, 0 or 1"),
        (dict(write=np.full((1, 2, 2), 2)), r"write must hold values in \[0, 1\]"),
        (dict(next_state=np.zeros((1, 3, 2), dtype=int)), "same shape"),
        (dict(tapes=np.full((1, 3), 5)), "symbols"),
    ],
)
def test_turing_machine_simulator_rejects_bad_machines(args, match):
    kwargs = dict(next_state=np.zeros((1, 2, 2), dtype=int), write=np.zeros((1, 2, 2), dtype=int),
                  move=np.zeros((1, 2, 2), dtype=int), tapes=np.zeros((1, 3), dtype=int),
                  n_steps=2)
    kwargs.update(args)
    with pytest.raises(ValueError, match=match):
        turing_machine_program(2, 2, tape_length=3, max_steps=6).execute(**kwargs)


def test_lookup_scale_multiplies_the_write_and_must_not_be_zero():
    program = (Program().attribute("a", range(2))
               .lookup(query="a", key="a", value="a", dest="a", scale=-2.0).compile())
    assert program.V.min() == -2.0
    with pytest.raises(ValueError, match="scale must be non-zero"):
        Program().attribute("a", range(2)).lookup(query="a", key="a", value="a", dest="a",
                                                  scale=0)


# ---------------------------------------------------------------- learning back


def test_next_token_dataset_matches_loop_reference():
    rng = np.random.default_rng(0)
    seqs = rng.normal(size=(3, 6, 2))
    seqs[1, 4:] = np.nan
    start = np.array([2, 1, 5])
    X, y, groups = next_token_dataset(seqs, start)
    pairs = ref_next_token_pairs(seqs, ref_lengths(seqs), start)
    assert X.shape == (len(pairs), 5, 2) and y.shape == (len(pairs), 2)
    for r, (prefix, target, i) in enumerate(pairs):
        n = len(prefix)
        np.testing.assert_array_equal(X[r, :n], prefix)
        assert np.isnan(X[r, n:]).all()
        np.testing.assert_array_equal(y[r], target)
        assert groups[r] == i
    with pytest.raises(ValueError, match="start"):
        next_token_dataset(seqs, 0)
    with pytest.raises(ValueError, match="start"):
        next_token_dataset(seqs, np.array([2, 5, 2]))


def test_learned_executor_is_exact_wherever_the_certificate_covers():
    L = 3
    executor = dfa_executor_program(2, 2, L)
    rng = np.random.default_rng(0)
    T = rng.integers(0, 2, size=(12, 2, 2))
    W = rng.integers(0, 2, size=(12, L))
    traces = executor.histories(T, W)
    X, y, _ = next_token_dataset(traces, traces.shape[1] - 2 * L)
    model = LinearAttentionRegressor().fit(X, y)
    assert not model.certificate_  # one-hot data: the global certificate fails
    # The program itself fits the traces exactly, so it is one of the minimizers.
    np.testing.assert_array_equal(executor.forward(X), y)

    T_test, W_test = _all_dfas_and_words(2, 2, L)
    test_traces = executor.histories(T_test, W_test)
    lengths = (W_test >= 0).sum(axis=1)
    X_test, _, groups = next_token_dataset(test_traces, 4 + lengths + 1)
    covered_pairs = model.certificate_.covers(X_test)
    covered = np.bincount(groups, weights=~covered_pairs, minlength=len(T_test)) == 0
    got = executor.execute(T_test, W_test, model=model)
    exact = np.all(got == ref_run_dfa(T_test, W_test), axis=1)
    assert 0 < covered.sum() < len(covered)
    assert exact[covered].all()
    # Per prefix too: covered prefixes get the program's output after rounding.
    pred = executor.round(model.predict(X_test[covered_pairs]))
    np.testing.assert_array_equal(pred, executor.round(executor.forward(X_test[covered_pairs])))


def test_compiled_program_object_exposes_its_weights():
    program = _shift_register()
    assert isinstance(program, CompiledProgram)
    V, Q = program.weights
    assert V.shape == Q.shape == (2, program.d, program.d)
    assert program.head_names == ["advance position", "copy letter <- letter[-3]"]
    assert "d=13" in repr(program)
