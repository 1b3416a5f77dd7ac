"""Dask input: statistics per block, tree-reduced on a two-process LocalCluster.

The reference is always the in-memory path on the same data: the validation
functions and ``SufficientStatistics.update`` on the computed numpy array.

No verdict depends on the machine's speed: a wait for the cluster (workers
gone, a subprocess) ends as soon as its condition holds and gives up only
after ``SAFETY_NET`` seconds, far beyond what a loaded machine needs; a test
that checks a timeout makes the computation unable to finish first.
"""

import asyncio
import gc
import inspect
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")  # a dependency of distributed

from dask.callbacks import Callback  # noqa: E402
from distributed.utils import key_split  # noqa: E402
from numpy.testing import assert_allclose  # noqa: E402

from sklearn_linattn import LinearAttentionRegressor  # noqa: E402
from sklearn_linattn._dask import DaskSource, is_dask_collection  # noqa: E402
from sklearn_linattn._problem import StandardizedProblem  # noqa: E402
from sklearn_linattn._solvers import SufficientStatistics  # noqa: E402
from sklearn_linattn._source import standardizer_of  # noqa: E402
from sklearn_linattn._terms import LinearTerms  # noqa: E402
from sklearn_linattn._validation import check_sequences, check_targets  # noqa: E402

N_TOKENS, D = 5, 3

# Seconds after which a wait that should end in a second or two gives up: only
# a hang reaches it, never a slow scheduler.
SAFETY_NET = 300
# The cluster's own connection timeouts (30 s by default), as generous.
GENEROUS_COMMS = {"distributed.comm.timeouts.connect": f"{SAFETY_NET}s",
                  "distributed.comm.timeouts.tcp": f"{SAFETY_NET}s"}



def dask_sufficient_statistics(X, y, *, readout="last", token_dim=None, sample_weight=None,
                               n_features_in=None, split_every=None, timeout=None,
                               data_format="channels_last"):
    """The statistics a fit's pass gathers from dask input (its source, its pass).

    Returns ``(stats, n_tokens, single_output)``.
    """
    source = DaskSource(X, y, sample_weight, readout=readout, token_dim=token_dim,
                        data_format=data_format, n_features_in=n_features_in,
                        split_every=split_every, timeout=timeout)
    problem = StandardizedProblem.from_source(source, readout=readout,
                                              terms=LinearTerms(source.d), solver="eigh")
    return problem.stats, source.n_tokens, source.single_output


_UPDATE_TAKES_SAMPLE_WEIGHT = (
    "sample_weight" in inspect.signature(SufficientStatistics.update).parameters
)


def _fit_uses_dask_path():
    """Whether LinearAttentionRegressor.fit hands dask input to sklearn_linattn._dask.

    fit already accepts dask arrays by converting them to numpy; this checks
    that it runs the block-statistics tasks instead.
    """
    rng = np.random.default_rng(0)
    X = da.from_array(rng.normal(size=(12, 3, 2)), chunks=6)
    y = da.from_array(rng.normal(size=12), chunks=6)
    keys = []
    with dask.config.set(scheduler="sync"), Callback(
        pretask=lambda key, dsk, state: keys.append(key)
    ):
        try:
            LinearAttentionRegressor().fit(X, y)
        except Exception:  # wired but broken still counts: the test then fails
            pass
    return any(key_split(k) in ("linattn-pass", "linattn-statistics") for k in keys)


_FIT_USES_DASK = _fit_uses_dask_path()


def _wait_until(condition, what):
    """Poll ``condition`` until it holds; fail only after SAFETY_NET seconds."""
    deadline = time.monotonic() + SAFETY_NET
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what} after {SAFETY_NET} s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def client():
    """A LocalCluster of two single-threaded worker processes, and its Client.

    The client becomes the default scheduler, so every computation of the
    tests that use it runs on the two workers.  Teardown checks that the
    worker processes are gone.
    """
    with dask.config.set(GENEROUS_COMMS):
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        )
        worker_pids = [nanny.process.pid for nanny in cluster.workers.values()]
        try:
            with distributed.Client(cluster) as c:
                yield c
        finally:
            cluster.close()

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    _wait_until(lambda: not any(alive(pid) for pid in worker_pids),
                f"the worker processes {worker_pids} to end after cluster.close()")


def _padded(rng, n_samples, min_length=1, n_tokens=N_TOKENS, d=D, dtype=np.float64):
    """Gaussian sequences NaN-padded to random lengths."""
    X = rng.normal(size=(n_samples, n_tokens, d)).astype(dtype)
    lengths = rng.integers(min_length, n_tokens + 1, size=n_samples)
    X[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return X, lengths


def _targets(rng, lengths, readout, d_out=None, n_tokens=N_TOKENS):
    """Targets shaped for readout, NaN at padded positions for "all"."""
    shape = (len(lengths),) if readout == "last" else (len(lengths), n_tokens)
    y = rng.normal(size=shape + (() if d_out is None else (d_out,)))
    if readout == "all":
        y[np.arange(n_tokens)[None, :] >= lengths[:, None]] = np.nan
    return y


def _in_memory(X, y, *, readout="last", token_dim=None, sample_weight=None):
    """The in-memory statistics of numpy X and y (the reference).

    In the standardized coordinates the in-memory fit computes for the same
    data (the dask path must find the same ones).
    """
    Xv, lengths = check_sequences(X, token_dim=token_dim)
    Y, single = check_targets(y, lengths, Xv.shape[1], readout=readout)
    w = None if sample_weight is None else np.broadcast_to(
        np.asarray(sample_weight, dtype=float), (Xv.shape[0],))
    standardizer = standardizer_of(Xv, lengths, Y, w)
    stats = SufficientStatistics(Xv.shape[2], Y.shape[-1], standardizer=standardizer)
    return stats.update(Xv, lengths, Y, readout=readout, sample_weight=w), Xv.shape[1], single


def _in_memory_error(X, y, **kwargs):
    """Type and message of the error the in-memory validation raises."""
    with pytest.raises((TypeError, ValueError)) as info:
        _in_memory(X, y, **kwargs)
    return info.type, str(info.value)


def _assert_same_statistics(got, want):
    assert got.standardizer.weight_exponent == want.standardizer.weight_exponent
    np.testing.assert_array_equal(got.standardizer.exponents, want.standardizer.exponents)
    if want.standardizer.whitening is not None:
        assert_allclose(got.standardizer.whitening, want.standardizer.whitening,
                        rtol=1e-12, atol=1e-12 * np.abs(want.standardizer.whitening).max())
    assert got.n_rows == want.n_rows
    assert got.n_samples == want.n_samples
    assert got.dtype == want.dtype
    for field in ("gram", "moment", "y_sq"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.shape == b.shape, field
        # Sums in another order: equal to rounding, relative to the largest entry.
        assert_allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max(), err_msg=field)


def _dask_tasks(task_stream):
    """Counts of the package's tasks in a task stream, and the workers they ran on."""
    counts, workers = {}, set()
    for record in task_stream.data:
        prefix = key_split(record["key"])
        if prefix.startswith("linattn-"):
            counts[prefix] = counts.get(prefix, 0) + 1
            workers.add(record["worker"])
    return counts, workers


def test_is_dask_collection():
    X = np.zeros((4, 3, 2))
    assert is_dask_collection(da.from_array(X, chunks=2))
    assert is_dask_collection(dask.delayed(sum)([1, 2]))
    assert not is_dask_collection(X)
    assert not is_dask_collection(X.tolist())
    assert not is_dask_collection(None)


def test_is_dask_collection_never_imports_dask():
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from sklearn_linattn._dask import is_dask_collection\n"
        "assert is_dask_collection(np.ones(2)) is False\n"
        "assert 'dask' not in sys.modules, 'importing or calling it imported dask'\n"
        "sys.modules['dask'] = None  # as if dask were not installed\n"
        "assert is_dask_collection([1.0]) is False\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=SAFETY_NET)


CHUNKINGS = {
    "one block": 37,
    "uneven tail": 10,
    "uneven with an empty block": ((0, 5, 12, 1, 19), N_TOKENS, D),
    "chunked along tokens and d": (10, 2, 1),
}


@pytest.mark.parametrize("chunks", CHUNKINGS.values(), ids=CHUNKINGS.keys())
@pytest.mark.parametrize("readout", ["last", "all"])
@pytest.mark.parametrize("d_out", [None, 2])
def test_statistics_equal_in_memory(client, chunks, readout, d_out):
    rng = np.random.default_rng(1)
    X, lengths = _padded(rng, 37)
    y = _targets(rng, lengths, readout, d_out)
    stats, n_tokens, single = dask_sufficient_statistics(
        da.from_array(X, chunks=chunks), da.from_array(y, chunks=9), readout=readout
    )
    want, want_tokens, want_single = _in_memory(X, y, readout=readout)
    _assert_same_statistics(stats, want)
    assert (n_tokens, single) == (want_tokens, want_single) == (N_TOKENS, d_out is None)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_float32_input(client, readout):
    rng = np.random.default_rng(2)
    X, lengths = _padded(rng, 40, dtype=np.float32)
    y = _targets(rng, lengths, readout).astype(np.float32)
    stats, _, _ = dask_sufficient_statistics(
        da.from_array(X, chunks=11), da.from_array(y, chunks=11), readout=readout
    )
    want, _, _ = _in_memory(X, y, readout=readout)
    assert stats.dtype == want.dtype == np.float32
    _assert_same_statistics(stats, want)


def test_two_dimensional_X_with_token_dim(client):
    rng = np.random.default_rng(3)
    X, lengths = _padded(rng, 30)
    X2 = X.reshape(30, N_TOKENS * D)
    y = _targets(rng, lengths, "all", 2)
    stats, n_tokens, single = dask_sufficient_statistics(
        da.from_array(X2, chunks=(8, 4)), y, readout="all", token_dim=D
    )
    want, _, _ = _in_memory(X2, y, readout="all", token_dim=D)
    _assert_same_statistics(stats, want)
    assert (n_tokens, single) == (N_TOKENS, False)
    assert stats.n_features == D * D * (D + 1) // 2


def test_two_dimensional_X_is_univariate_by_default(client):
    rng = np.random.default_rng(4)
    X = rng.normal(size=(25, 7))
    y = rng.normal(size=25)
    stats, n_tokens, _ = dask_sufficient_statistics(da.from_array(X, chunks=(6, 3)), y)
    want, _, _ = _in_memory(X, y)
    _assert_same_statistics(stats, want)
    assert (n_tokens, stats.n_features) == (7, 1)


Y_LAYOUTS = {
    "dask, other chunks": lambda y: da.from_array(y, chunks=7),
    "dask, chunked along outputs": lambda y: da.from_array(y, chunks=(13, 2, 1)),
    "numpy": lambda y: y,
    "list of arrays": lambda y: list(y),
}


@pytest.mark.parametrize("layout", Y_LAYOUTS.values(), ids=Y_LAYOUTS.keys())
def test_y_layouts(client, layout):
    rng = np.random.default_rng(5)
    X, lengths = _padded(rng, 33)
    y = _targets(rng, lengths, "all", 2)
    stats, _, single = dask_sufficient_statistics(
        da.from_array(X, chunks=10), layout(y), readout="all"
    )
    _assert_same_statistics(stats, _in_memory(X, y, readout="all")[0])
    assert not single


def test_ragged_list_of_targets(client):
    """Per-sequence targets of their own lengths, as the in-memory fit accepts them."""
    rng = np.random.default_rng(6)
    X, lengths = _padded(rng, 21)
    y = _targets(rng, lengths, "all")
    ragged = [y[i, : lengths[i]] for i in range(21)]
    stats, _, single = dask_sufficient_statistics(
        da.from_array(X, chunks=6), ragged, readout="all"
    )
    _assert_same_statistics(stats, _in_memory(X, ragged, readout="all")[0])
    assert single
    with pytest.raises(ValueError, match=r"one entry per sequence of X \(n_samples=21\)"):
        dask_sufficient_statistics(da.from_array(X, chunks=6), ragged[:-1], readout="all")
    # Consistent within each block, not across blocks: refused like in memory.
    mixed = ragged[:6] + [t[:, None] for t in ragged[6:]]
    with pytest.raises(ValueError, match="could not be converted"):
        _in_memory(X, mixed, readout="all")
    with pytest.raises(ValueError, match="same output dimension; got no output axis"):
        dask_sufficient_statistics(da.from_array(X, chunks=6), mixed, readout="all")


@pytest.mark.parametrize("split_every, n_merges", [(2, 4 + 2 + 1), (3, 3 + 1), (8, 1)])
def test_reduction_runs_as_a_tree_on_the_workers(client, split_every, n_merges):
    """One task per block, merge tasks forming a tree, all on workers.

    Two passes for so few sequences (reading them again costs less than
    mapping the statistics): the token magnitudes (standardized coordinates),
    then the statistics.  A version that computed X and reduced it in this
    process would run no such task.
    """
    rng = np.random.default_rng(7)
    X, lengths = _padded(rng, 40)
    y = _targets(rng, lengths, "last")
    with distributed.get_task_stream(client) as tasks:
        stats, _, _ = dask_sufficient_statistics(
            da.from_array(X, chunks=5), da.from_array(y, chunks=5), split_every=split_every
        )
    counts, workers = _dask_tasks(tasks)
    assert counts == {"linattn-scales": 8, "linattn-scales-merge": n_merges,
                      "linattn-statistics": 8, "linattn-statistics-merge": n_merges}
    assert workers <= set(client.scheduler_info()["workers"])
    _assert_same_statistics(stats, _in_memory(X, y)[0])


def _bad_values(X, y, readout):
    """Invalid values in the third block (samples 20..29) of chunks of 10."""
    X, y = X.copy(), y.copy()
    cases = {}
    if readout == "last":
        a = X.copy()
        a[23, 0, 1] = np.nan
        cases["partly NaN token"] = (a, y)
        a = X.copy()
        a[26, 0] = np.nan  # samples have >= 2 tokens: a hole before a real token
        cases["NaN token before a real one"] = (a, y)
        a = X.copy()
        a[21] = np.nan
        cases["empty sequence"] = (a, y)
        a = X.copy()
        a[24, 1, 2] = np.inf
        cases["infinite X"] = (a, y)
        b = y.copy()
        b[28] = np.nan
        cases["NaN target"] = (X, b)
        b = y.copy()
        b[22] = np.inf
        cases["infinite target"] = (X, b)
    else:
        b = y.copy()
        b[25, 0] = np.nan
        cases["NaN target at a real token"] = (X, b)
        b = y.copy()
        b[27, N_TOKENS - 1] = 1.0
        cases["target at a padded position"] = (X, b)
    return cases


@pytest.mark.parametrize("readout", ["last", "all"])
def test_value_errors_in_a_block_carry_the_in_memory_message(client, readout):
    rng = np.random.default_rng(8)
    X, lengths = _padded(rng, 40, min_length=2)
    X[27, N_TOKENS - 1] = np.nan  # sequence 27 is padded (target case for "all")
    lengths[27] = min(lengths[27], N_TOKENS - 1)
    y = _targets(rng, lengths, readout)
    for case, (Xb, yb) in _bad_values(X, y, readout).items():
        error, message = _in_memory_error(Xb, yb, readout=readout)
        if "infinity" not in message:  # sklearn's message names no sample
            assert "[2" in message, case  # a sample of the third block, counted globally
        with pytest.raises(error) as info:
            dask_sufficient_statistics(
                da.from_array(Xb, chunks=10), da.from_array(yb, chunks=10), readout=readout
            )
        assert str(info.value) == message, case


def _never_computed(shape, dtype, chunks):
    """A dask array that raises if any of its blocks is ever computed."""

    def explode(block):
        raise RuntimeError("a block was computed before the shapes were checked")

    zeros = da.zeros(shape, dtype=dtype, chunks=chunks)
    return zeros.map_blocks(explode, dtype=dtype)


SHAPE_CASES = {
    "1-D X": dict(X=((40,), np.float64), y=((40,), np.float64)),
    "4-D X": dict(X=((40, 5, 3, 2), np.float64), y=((40,), np.float64)),
    "no sample": dict(X=((0, 5, 3), np.float64), y=((0,), np.float64)),
    "no token": dict(X=((40, 0, 3), np.float64), y=((40,), np.float64)),
    "complex X": dict(X=((40, 5, 3), np.complex128), y=((40,), np.float64)),
    "string X": dict(X=((40, 5, 3), "<U2"), y=((40,), np.float64)),
    "token_dim not dividing": dict(
        X=((40, 7), np.float64), y=((40,), np.float64), token_dim=3
    ),
    "token_dim contradicting d": dict(
        X=((40, 5, 3), np.float64), y=((40,), np.float64), token_dim=2
    ),
    "bad token_dim": dict(X=((40, 5, 3), np.float64), y=((40,), np.float64), token_dim=0),
    "y too short": dict(X=((40, 5, 3), np.float64), y=((39,), np.float64)),
    "y per token with readout last": dict(
        X=((40, 5, 3), np.float64), y=((40, 5, 2), np.float64)
    ),
    "y with other n_tokens": dict(
        X=((40, 5, 3), np.float64), y=((40, 4), np.float64), readout="all"
    ),
    "y without outputs": dict(X=((40, 5, 3), np.float64), y=((40, 0), np.float64)),
    "complex y": dict(X=((40, 5, 3), np.float64), y=((40,), np.complex128)),
    "bad readout": dict(X=((40, 5, 3), np.float64), y=((40,), np.float64), readout="first"),
}


@pytest.mark.parametrize("case", SHAPE_CASES.values(), ids=SHAPE_CASES.keys())
def test_shape_errors_carry_the_in_memory_message_before_computing(case):
    (x_shape, x_dtype), (y_shape, y_dtype) = case["X"], case["y"]
    kwargs = {k: case[k] for k in ("token_dim", "readout") if k in case}
    error, message = _in_memory_error(
        np.zeros(x_shape, x_dtype), np.zeros(y_shape, y_dtype), **kwargs
    )
    X = _never_computed(x_shape, x_dtype, chunks=(10,) + x_shape[1:])
    y = _never_computed(y_shape, y_dtype, chunks=(10,) + y_shape[1:])
    with pytest.raises(error) as info:
        dask_sufficient_statistics(X, y, **kwargs)
    assert str(info.value) == message


def test_n_features_is_checked_before_computing():
    X = _never_computed((40, 5, 3), np.float64, chunks=10)
    with pytest.raises(ValueError, match=r"tokens of dimension d=3, but d=4 was expected"):
        dask_sufficient_statistics(X, np.zeros(40), n_features_in=4)


def test_y_none_is_refused_with_the_package_message():
    X = _never_computed((40, 5, 3), np.float64, chunks=10)
    with pytest.raises(ValueError, match="requires y to be passed, but the target y is None"):
        dask_sufficient_statistics(X, None)


def test_X_must_be_a_dask_array_with_known_chunks(client):
    X = np.random.default_rng(9).normal(size=(20, 4, 2))
    with pytest.raises(TypeError, match=r"X must be a dask array .*got numpy.ndarray"):
        dask_sufficient_statistics(X, np.zeros(20))
    Xd = da.from_array(X, chunks=5)
    unknown = Xd[Xd[:, 0, 0] > -np.inf]  # boolean indexing: unknown chunk sizes
    with pytest.raises(ValueError, match=r"X must have known chunk sizes .*compute_chunk_sizes"):
        dask_sufficient_statistics(unknown, np.zeros(20))
    y = da.zeros(20, chunks=5)
    with pytest.raises(ValueError, match=r"y must have known chunk sizes .*compute_chunk_sizes"):
        dask_sufficient_statistics(Xd, y[y > -1])


@pytest.mark.parametrize(
    "split_every, error, match",
    [(1, ValueError, "split_every must be None or an integer >= 2; got 1"),
     (2.0, TypeError, "split_every must be None or an integer >= 2; got 2.0 of type float")],
)
def test_split_every_is_checked(split_every, error, match):
    X = _never_computed((40, 5, 3), np.float64, chunks=10)
    with pytest.raises(error, match=match):
        dask_sufficient_statistics(X, np.zeros(40), split_every=split_every)


def test_sample_weight_shape_is_checked_before_computing():
    X = _never_computed((40, 5, 3), np.float64, chunks=10)
    w = _never_computed((39,), np.float64, chunks=10)
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(40,\); got \(39,\)"):
        dask_sufficient_statistics(X, np.zeros(40), sample_weight=w)


@pytest.mark.skipif(
    not _UPDATE_TAKES_SAMPLE_WEIGHT,
    reason="SufficientStatistics.update does not take sample_weight yet",
)
@pytest.mark.parametrize("readout", ["last", "all"])
def test_sample_weight_equals_in_memory(client, readout):
    rng = np.random.default_rng(10)
    X, lengths = _padded(rng, 36)
    y = _targets(rng, lengths, readout, 2)
    w = rng.uniform(0.1, 3.0, size=36)
    want, _, _ = _in_memory(X, y, readout=readout, sample_weight=w)
    for weights in (da.from_array(w, chunks=7), w):
        stats, _, _ = dask_sufficient_statistics(
            da.from_array(X, chunks=10), y, readout=readout, sample_weight=weights
        )
        _assert_same_statistics(stats, want)
    stats, _, _ = dask_sufficient_statistics(
        da.from_array(X, chunks=10), y, readout=readout, sample_weight=2.5
    )
    _assert_same_statistics(
        stats, _in_memory(X, y, readout=readout, sample_weight=np.full(36, 2.5))[0]
    )


@pytest.mark.skipif(
    not _FIT_USES_DASK,
    reason="LinearAttentionRegressor.fit does not hand dask input to sklearn_linattn._dask yet",
)
@pytest.mark.parametrize("readout", ["last", "all"])
def test_estimator_fit_on_dask_equals_in_memory(client, readout):
    rng = np.random.default_rng(11)
    X, lengths = _padded(rng, 300, min_length=2, n_tokens=6)
    y = _targets(rng, lengths, readout, n_tokens=6)
    want = LinearAttentionRegressor(readout=readout).fit(X, y)
    with distributed.get_task_stream(client) as tasks:
        got = LinearAttentionRegressor(readout=readout).fit(
            da.from_array(X, chunks=70), da.from_array(y, chunks=90)
        )
    counts = _dask_tasks(tasks)[0]
    # One pass over the 5 blocks, after the first block's coordinates.
    assert (counts["linattn-pass"], counts["linattn-head"]) == (5, 1)
    assert "linattn-statistics" not in counts and "linattn-scales" not in counts
    assert_allclose(got.coef_, want.coef_, rtol=1e-9, atol=1e-9 * np.abs(want.coef_).max())
    assert got.n_features_in_ == want.n_features_in_ == D
    assert got.feature_rank_ == want.feature_rank_
    assert bool(got.certificate_) == bool(want.certificate_)
    assert_allclose(got.predict(X[:5]), want.predict(X[:5]), rtol=1e-8, atol=1e-10)


def test_a_cluster_without_workers_raises_instead_of_hanging():
    """Every worker lost: a TimeoutError after the configured wait, not a hang.

    The wait is the config key's (0.5 s), not the default 60 s: the error
    cannot come before the configured wait, and a fit that ignored the key
    could not raise before the default's 60 s whatever the machine's speed
    (while one that honours it takes about a second, a few under load).
    """
    with dask.config.set(GENEROUS_COMMS):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0")
        try:
            with distributed.Client(cluster) as lost:
                rng = np.random.default_rng(20)
                X = da.from_array(rng.normal(size=(200, 5, 2)), chunks=50)
                y = da.from_array(rng.normal(size=200), chunks=50)
                assert LinearAttentionRegressor().fit(X, y).certificate_
                cluster.scale(0)
                _wait_until(lambda: not lost.scheduler_info()["workers"], "the workers to leave")
                start = time.monotonic()
                # The overall timeout only ends a fit that never notices the lost workers.
                with dask.config.set({"sklearn-linattn.no-workers-timeout": 0.5,
                                      "sklearn-linattn.timeout": SAFETY_NET}):
                    with pytest.raises(TimeoutError, match="has had no worker for"):
                        LinearAttentionRegressor().fit(X, y)
                waited = time.monotonic() - start
                assert 0.5 <= waited < 60, f"raised after {waited:.1f} s"
        finally:
            cluster.close()


def test_a_timeout_ends_a_computation_that_cannot_finish(client):
    """``timeout`` raises a TimeoutError and cancels the computation.

    Its only task waits for an event that the test sets after the error: the
    computation cannot finish first, however fast or slow the machine.  (A
    timer sets the event after SAFETY_NET seconds, so that a timeout that does
    not work fails the test instead of blocking it.)
    """
    from sklearn_linattn._dask import _compute

    event = distributed.Event(f"linattn-test-{uuid.uuid4().hex}", client=client)
    key = f"linattn-blocked-{uuid.uuid4().hex}"
    blocked = dask.delayed(event.wait, pure=False)(dask_key_name=key)
    backstop = threading.Timer(SAFETY_NET, event.set)
    backstop.start()
    try:
        with pytest.raises(TimeoutError, match=r"did not finish within timeout=0\.5 s"):
            _compute(blocked, 0.5)
    finally:
        backstop.cancel()
        event.set()  # frees the worker's thread

    def forgotten(dask_scheduler):
        return key not in dask_scheduler.tasks

    _wait_until(lambda: client.run_on_scheduler(forgotten), "the scheduler to forget the task")


def test_a_computation_slower_than_a_poll_leaves_no_future_behind(client, monkeypatch):
    """The result's key is released when ``_compute`` returns, not by the garbage collector.

    Regression: a poll's TimeoutError traceback held the future in a reference
    cycle, so its result stayed on the workers until the collector ran.

    The task waits for an event that is set only when ``_compute`` asks the
    scheduler for its workers, which it does after a poll timed out: at least
    one poll times out, whatever the machine's speed.
    """
    from sklearn_linattn._dask import _compute

    event = distributed.Event(f"linattn-test-{uuid.uuid4().hex}", client=client)
    key = f"linattn-slow-{uuid.uuid4().hex}"
    task = dask.delayed(event.wait, pure=False)(dask_key_name=key)
    scheduler_info = client.scheduler_info

    def scheduler_info_after_a_poll(*args, **kwargs):
        event.set()
        return scheduler_info(*args, **kwargs)

    monkeypatch.setattr(client, "scheduler_info", scheduler_info_after_a_poll)
    gc.disable()  # what the collector would free later is not released here
    try:
        assert _compute(task, None) is True
        # A released future's decrement is a callback on the client's loop: wait for the
        # callbacks queued so far, then read the client's references to the key.
        client.sync(asyncio.sleep, 0)
        references = client.refcount.get(key, 0)
    finally:
        gc.enable()
        event.set()
    assert references == 0, (
        f"the client still holds {references} reference(s) to {key} after _compute returned")
