"""``solver="cg"`` on dask arrays: matrix-free, every product a map-reduce over persisted blocks.

References: the in-memory ``"cg"`` fit on the computed array (same algorithm,
same tolerance), ``"eigh"`` for the spectrum, and a dense loop over the rows
of the feature matrix for the operator itself.  The cluster is a
``distributed.LocalCluster`` of two worker processes.

No verdict depends on the machine's speed: waits for the cluster give up only
after ``SAFETY_NET`` seconds, and the tests of the timeout move the solver's
clock past its deadline instead of racing a real one.
"""

import functools
import gc
import threading
import time
import traceback
import types
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from numpy.testing import assert_allclose  # noqa: E402

from sklearn_linattn import LinearAttentionRegressor  # noqa: E402
from sklearn_linattn import _memory, mhla_forward  # noqa: E402
from sklearn_linattn._dask import (  # noqa: E402
    DaskSource,
    _BlockRows,
    _DaskGram,
    _block_rows,
)
from sklearn_linattn._features import features_matvec, n_attention_features  # noqa: E402
from sklearn_linattn._moments import RowReader, scales_pass  # noqa: E402
from sklearn_linattn._solvers import choose_solver  # noqa: E402
from sklearn_linattn._solvers.cg import cg_cache_dtype, solve_cg  # noqa: E402
from sklearn_linattn._validation import check_sequences  # noqa: E402

TOL = 1e-10
# Seconds after which a wait that should end in a second or two gives up: only
# a hang reaches it, never a slow scheduler.
SAFETY_NET = 300
GENEROUS_COMMS = {"distributed.comm.timeouts.connect": f"{SAFETY_NET}s",
                  "distributed.comm.timeouts.tcp": f"{SAFETY_NET}s"}


@pytest.fixture(scope="module")
def client():
    """Two single-threaded worker processes; the client is the default scheduler."""
    with dask.config.set(GENEROUS_COMMS):
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        )
        try:
            with distributed.Client(cluster) as c:
                yield c
        finally:
            cluster.close()


def _teacher(rng, n, T, d, d_out=1, scale=1.0):
    V = rng.normal(size=(2, d_out, d))
    Q = rng.normal(size=(2, d, d))
    X = scale * rng.normal(size=(n, T, d))
    return X, V, Q


def _pair(X, y, chunks, **params):
    """The dask fit and the in-memory fit of the same estimator."""
    Xd = da.from_array(X, chunks=(chunks,) + X.shape[1:])
    yd = da.from_array(y, chunks=(chunks,) + y.shape[1:])
    kw = dict(solver="cg", tol=TOL, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither may stop short of tol
        on_dask = LinearAttentionRegressor(**kw).fit(Xd, yd, **_weights(params, chunks))
        in_memory = LinearAttentionRegressor(**kw).fit(X, y, **_weights(params, None))
    return on_dask, in_memory


_WEIGHTS = {}


def _weights(params, chunks):
    w = _WEIGHTS.get("current")
    if w is None:
        return {}
    return {"sample_weight": w if chunks is None else da.from_array(w, chunks=chunks)}


def _assert_released(client, prefix):
    """The scheduler comes to hold no task whose key contains ``prefix`` (waits SAFETY_NET s).

    After a garbage collection: a computation that outlasted one poll of
    ``_compute`` leaves its future in a reference cycle (a known defect, pinned
    by ``test_dask.py::test_a_computation_slower_than_a_poll_leaves_no_future_behind``),
    which only a slow machine would otherwise show here.
    """
    def keys(dask_scheduler):
        return [str(k) for k in dask_scheduler.tasks if prefix in str(k)]

    gc.collect()
    deadline = time.monotonic() + SAFETY_NET
    while client.run_on_scheduler(keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(keys) == []


def _late_products(monkeypatch):
    """Every cg product on dask starts after its deadline, whatever the machine's speed.

    The cg module's clock jumps past the deadline at each product (before the
    product checks it), as if the product had been slow: a timeout that
    works must then end the fit.  Returns the (deadline, timeout) each product
    saw.
    """
    import sklearn_linattn._dask as dask_cg

    offset = [0.0]
    monkeypatch.setattr(dask_cg, "time",
                        types.SimpleNamespace(monotonic=lambda: time.monotonic() + offset[0]))
    product, seen = dask_cg._DaskGram._product, []

    def late_product(self, V, exact):
        seen.append((self.deadline, self.timeout))
        if self.timeout is not None:
            offset[0] += float(self.timeout) + 1.0
        return product(self, V, exact)

    monkeypatch.setattr(dask_cg._DaskGram, "_product", late_product)
    return seen


def _rows(X, y, standardizer, w=None, offset=0, budget=None):
    """One block's ``_block_rows`` in the layout of these tests."""
    return _block_rows(X, y, w, offset, readout="last", token_dim=None, n_features_in=None,
                       data_format="channels_last", standardizer=standardizer, terms=None,
                       cache_rule=functools.partial(cg_cache_dtype, memory_budget=budget))


def dask_scales(X, y, sample_weight=None):
    """The scales a fit's first pass gathers from dask input."""
    source = DaskSource(X, y, sample_weight)
    return source.reduce(functools.partial(scales_pass, d=source.d, readout="last")).scales


def dask_solve_cg(X, y, *, standardizer, timeout=None, alpha=0.0, **options):
    """The registry's "cg" on a dask array's persisted blocks (released after)."""
    rows = DaskSource(X, y, timeout=timeout).rows(standardizer, None)
    try:
        return solve_cg(rows, alpha, options)
    finally:
        rows.release()


def _assert_same_fit(a, b, X_new):
    assert a.solver_ == b.solver_ == "cg"
    scale = np.abs(b.coef_).max()
    assert_allclose(a.coef_, b.coef_, rtol=0, atol=1e-8 * scale)
    assert_allclose(a.predict(X_new), b.predict(X_new), rtol=1e-7, atol=1e-9 * scale)
    ca, cb = a.certificate_, b.certificate_
    assert bool(ca) == bool(cb)
    assert ca.n_samples == cb.n_samples and ca.rank == cb.rank
    assert_allclose(ca.min_eigenvalue, cb.min_eigenvalue, rtol=1e-6)
    assert_allclose(ca.max_eigenvalue, cb.max_eigenvalue, rtol=1e-6)


@pytest.mark.parametrize("readout", ["last", "all"])
def test_equals_in_memory_cg_on_two_worker_processes(client, readout):
    rng = np.random.default_rng(0)
    X, V, Q = _teacher(rng, 700, 6, 3, d_out=2)
    y = mhla_forward(X, V, Q, readout=readout)
    on_dask, in_memory = _pair(X, y, 160, readout=readout)
    _assert_same_fit(on_dask, in_memory, rng.normal(size=(20, 9, 3)))
    assert on_dask.certificate_
    # Identified out of distribution: longer and 3x larger inputs.
    X_new = 3 * rng.normal(size=(30, 12, 3))
    truth = mhla_forward(X_new, V, Q, readout=readout)
    assert_allclose(on_dask.predict(X_new), truth, rtol=0, atol=1e-7 * np.abs(truth).max())


def test_sample_weights_terms_and_ridge_equal_in_memory(client):
    rng = np.random.default_rng(1)
    X, V, Q = _teacher(rng, 500, 5, 2)
    y = mhla_forward(X, V, Q)[:, 0] + 0.5 + 2.0 * X[:, -1, 0]
    w = rng.uniform(0.5, 2.0, size=500)
    w[:130] = 0.0  # the whole first block carries no weight
    _WEIGHTS["current"] = w
    try:
        on_dask, in_memory = _pair(X, y, 120, fit_intercept=True, fit_skip=True, alpha=1e-3)
    finally:
        _WEIGHTS.pop("current")
    _assert_same_fit(on_dask, in_memory, rng.normal(size=(20, 7, 2)))
    assert_allclose(on_dask.intercept_, in_memory.intercept_, rtol=1e-7, atol=1e-10)
    assert_allclose(on_dask.skip_coef_, in_memory.skip_coef_, rtol=1e-7, atol=1e-10)
    assert on_dask.certificate_.n_samples == 370


def test_a_rank_deficient_design_fails_as_in_memory(client):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 5, 3))
    X[:, :, 2] = X[:, :, 0]  # a repeated coordinate: the Gram matrix is singular
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
    on_dask, in_memory = _pair(X, y, 70)
    assert not on_dask.certificate_ and not in_memory.certificate_
    assert on_dask.certificate_.rank == in_memory.certificate_.rank
    # The witness direction is a null direction of the data on dask too.
    v = on_dask.certificate_.witness()
    assert v is not None


def test_blocks_are_released_after_the_fit(client):
    rng = np.random.default_rng(3)
    X, V, Q = _teacher(rng, 400, 4, 2)
    y = mhla_forward(X, V, Q)
    LinearAttentionRegressor(solver="cg").fit(da.from_array(X, chunks=100),
                                             da.from_array(y, chunks=100))

    _assert_released(client, "linattn")


def test_the_operator_is_the_dense_gram_matrix():
    """``_DaskGram`` against ``Phi^T W Phi V`` summed row by row (threaded scheduler)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(45, 4, 2))
    y = rng.normal(size=45)
    w = rng.uniform(0, 2, size=45)
    Xd, yd, wd = (da.from_array(a, chunks=(10,) + a.shape[1:]) for a in (X, y, w))
    standardizer = dask_scales(Xd, yd, sample_weight=wd).finish()
    blocks, exact = [], True
    for start in range(0, 45, 10):
        sl = slice(start, start + 10)
        part = _rows(X[sl], y[sl], standardizer, w[sl], start)
        assert isinstance(part[0], _BlockRows)
        blocks.append(dask.delayed(part))
        exact &= part[0].op.exact
    psi = n_attention_features(2)
    op = _DaskGram(blocks, psi, exact, split_every=2, deadline=None, name="test")
    # The standardized feature rows the solver sees, formed one by one.
    Xv, lengths = check_sequences(X)
    rows = RowReader.of_arrays(Xv, lengths, None, "last", w, standardizer).all_rows()
    S, x, wr = rows.S, rows.x, rows.w
    Phi = np.stack([features_matvec(S[i:i + 1], x[i:i + 1], np.eye(psi))[0]
                    for i in range(S.shape[0])])
    G = np.zeros((psi, psi))
    for i in range(Phi.shape[0]):  # the obviously-correct loop
        G += wr[i] * np.outer(Phi[i], Phi[i])
    Vm = rng.normal(size=(psi, 3))
    assert_allclose(op.matmat(Vm), G @ Vm, rtol=1e-12, atol=1e-12 * np.abs(G).max())
    assert_allclose(op.matmat_exact(Vm[:, 0]), G @ Vm[:, 0], rtol=1e-12,
                    atol=1e-12 * np.abs(G).max())


def test_auto_picks_cg_when_the_statistics_do_not_fit(monkeypatch):
    """psi x psi statistics above the budget: "auto" runs matrix-free instead of failing."""
    rng = np.random.default_rng(5)
    X, V, Q = _teacher(rng, 300, 5, 3)
    y = mhla_forward(X, V, Q)
    reference = LinearAttentionRegressor(solver="eigh").fit(X, y)
    psi = n_attention_features(3)
    budget = 8 * psi * psi  # one psi x psi matrix: the statistics solvers need ~3.25
    monkeypatch.setattr(_memory, "default_memory_budget", lambda: budget)
    assert choose_solver("auto", psi, psi, dask=True) == "cg"
    with dask.config.set(scheduler="threads"):
        model = LinearAttentionRegressor(tol=TOL).fit(da.from_array(X, chunks=80),
                                                      da.from_array(y, chunks=80))
    assert model.solver_ == "cg" and model.certificate_
    assert_allclose(model.coef_, reference.coef_, atol=1e-8 * np.abs(reference.coef_).max())


def test_float32_block_caches_keep_float64_results():
    """A budget too small for float64 caches: float32 products, checked by exact ones."""
    rng = np.random.default_rng(6)
    X, V, Q = _teacher(rng, 400, 5, 3)
    y = mhla_forward(X, V, Q)
    Xd, yd = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
    standardizer = dask_scales(Xd, yd).finish()
    budget = 4 * 100 * (6 + 3 + 1) * 4  # a block's cache fits in float32 only
    block = _rows(X[:100], y[:100], standardizer, budget=budget)
    assert not block[0].op.exact
    with dask.config.set(scheduler="threads"):
        small = dask_solve_cg(Xd, yd, standardizer=standardizer, tol=TOL,
                              memory_budget=budget)
        large = dask_solve_cg(Xd, yd, standardizer=standardizer, tol=TOL)
    assert_allclose(small.coef, large.coef, rtol=0, atol=1e-8 * np.abs(large.coef).max())
    assert small.rank == large.rank == n_attention_features(3)


def test_the_multiprocessing_scheduler_is_refused():
    X = np.random.default_rng(7).normal(size=(40, 3, 2))
    with dask.config.set(scheduler="processes"), pytest.raises(ValueError, match="threaded"):
        LinearAttentionRegressor(solver="cg").fit(da.from_array(X, chunks=20),
                                                 da.from_array(X[:, -1, 0], chunks=20))


@pytest.mark.parametrize("solver", ["svd", "dual", "lsmr"])
def test_solvers_without_a_dask_path_are_refused(solver):
    X = np.random.default_rng(8).normal(size=(40, 3, 2))
    with pytest.raises(ValueError, match=r"needs solver in \('auto', 'eigh', 'cholesky', 'cg'\)"):
        LinearAttentionRegressor(solver=solver).fit(da.from_array(X, chunks=20),
                                                   da.from_array(X[:, -1, 0], chunks=20))


def test_value_errors_in_a_block_carry_the_in_memory_message(client):
    rng = np.random.default_rng(9)
    X = rng.normal(size=(60, 4, 2))
    y = X[:, -1, 0].copy()
    y[47] = np.nan
    with pytest.raises(ValueError) as on_dask:
        LinearAttentionRegressor(solver="cg").fit(da.from_array(X, chunks=20),
                                                 da.from_array(y, chunks=20))
    with pytest.raises(ValueError) as in_memory:
        LinearAttentionRegressor(solver="cg").fit(X, y)
    assert str(on_dask.value) == str(in_memory.value)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    d=st.integers(1, 3),
    n_samples=st.integers(25, 90),
    chunk=st.integers(7, 40),
    readout=st.sampled_from(["last", "all"]),
    log_scale=st.integers(-60, 60),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_any_chunking_equals_in_memory(d, n_samples, chunk, readout, log_scale,
                                                weighted, seed):
    """Any chunking, scale (2^-60..2^60 per coordinate), readout and weights: same fit."""
    rng = np.random.default_rng(seed)
    units = 2.0 ** rng.integers(log_scale - 5, log_scale + 6, size=d)
    X = rng.normal(size=(n_samples, 4, d)) * units
    V, Q = rng.normal(size=(1, 1, d)), rng.normal(size=(1, d, d))
    y = mhla_forward(X, V, Q, readout=readout)[..., 0]
    w = rng.uniform(0.1, 3.0, size=n_samples) if weighted else None
    kw = dict(solver="cg", tol=TOL, readout=readout)
    with dask.config.set(scheduler="threads"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny designs may be rank-deficient
        on_dask = LinearAttentionRegressor(**kw).fit(
            da.from_array(X, chunks=(chunk, 4, d)),
            da.from_array(y, chunks=(chunk,) + y.shape[1:]),
            sample_weight=None if w is None else da.from_array(w, chunks=chunk))
        in_memory = LinearAttentionRegressor(**kw).fit(X, y, sample_weight=w)
    X_new = rng.normal(size=(5, 7, d)) * units
    ref = in_memory.predict(X_new)
    assert_allclose(on_dask.predict(X_new), ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    assert bool(on_dask.certificate_) == bool(in_memory.certificate_)


def test_a_block_reports_its_size_to_the_scheduler():
    """The scheduler weighs blocks by dask's sizeof: a cached block must not look tiny."""
    from dask.sizeof import sizeof

    rng = np.random.default_rng(10)
    X = rng.normal(size=(500, 6, 3))
    y = X[:, -1, 0]
    Xd, yd = da.from_array(X, chunks=500), da.from_array(y, chunks=500)
    standardizer = dask_scales(Xd, yd).finish()
    part = _rows(X, y, standardizer)
    cache = sum(a.nbytes for a in part[0].op._cache if a is not None)
    assert cache > 0
    assert sizeof(part) >= X.nbytes + cache


def test_a_timeout_ends_the_fit_and_releases_the_blocks(client, monkeypatch):
    """The config key's timeout reaches the cg solve and ends it there.

    The timeout is generous (the passes before the solve never reach it) and
    the first product starts past the deadline (``_late_products``).
    """
    rng = np.random.default_rng(11)
    X, V, Q = _teacher(rng, 3000, 6, 4)
    y = mhla_forward(X, V, Q)
    Xd, yd = da.from_array(X, chunks=500), da.from_array(y, chunks=500)
    seen = _late_products(monkeypatch)
    with dask.config.set({"sklearn-linattn.timeout": SAFETY_NET}), pytest.raises(
            TimeoutError, match=f"did not finish within timeout={SAFETY_NET} s"):
        LinearAttentionRegressor(solver="cg").fit(Xd, yd)
    assert len(seen) >= 1 and seen[0][0] is not None and seen[0][1] == SAFETY_NET

    _assert_released(client, "linattn-cg")


def test_blocks_are_released_while_the_timeout_error_lives(client, monkeypatch):
    """Regression: the error's frames referred to the blocks, so workers kept every cache.

    The error is kept (as a notebook keeps ``sys.last_traceback``); the first
    product starts past the deadline (``_late_products``), so the error always
    comes from inside the cg solve, while the blocks are persisted.
    """
    rng = np.random.default_rng(13)
    X, V, Q = _teacher(rng, 3000, 6, 4)
    y = mhla_forward(X, V, Q)
    Xd, yd = da.from_array(X, chunks=500), da.from_array(y, chunks=500)
    standardizer = dask_scales(Xd, yd).finish()
    seen = _late_products(monkeypatch)
    with pytest.raises(TimeoutError, match=f"timeout={SAFETY_NET} s") as error:
        dask_solve_cg(Xd, yd, standardizer=standardizer, tol=1e-14, timeout=SAFETY_NET)
    assert seen
    frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.tb)]
    assert "solve_cg" in frames
    _assert_released(client, "linattn-cg")


def test_a_fit_that_ends_does_not_release_the_blocks_of_another(client, monkeypatch):
    """Regression: fits differing only in alpha shared their blocks' keys, so the first to
    end cancelled the other's blocks (a second fit runs, to its end, during the first one's
    first product)."""
    import sklearn_linattn._dask as dask_cg

    rng = np.random.default_rng(14)
    X, V, Q = _teacher(rng, 400, 5, 3)
    y = mhla_forward(X, V, Q)
    Xd, yd = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
    product, inner, started = dask_cg._DaskGram._product, [], []

    def another_fit():
        inner.append(LinearAttentionRegressor(solver="cg", tol=TOL, alpha=1e-3).fit(Xd, yd))

    def product_running_another_fit(self, V, exact):
        if not started:  # the outer fit's first product; the inner fit's run unchanged
            started.append(True)
            thread = threading.Thread(target=another_fit)  # a stack of its own
            thread.start()
            thread.join()
        return product(self, V, exact)

    monkeypatch.setattr(dask_cg._DaskGram, "_product", product_running_another_fit)
    outer = LinearAttentionRegressor(solver="cg", tol=TOL).fit(Xd, yd)
    monkeypatch.undo()
    assert_allclose(outer.coef_, LinearAttentionRegressor(solver="cg", tol=TOL).fit(X, y).coef_,
                    rtol=0, atol=1e-8 * np.abs(outer.coef_).max())
    assert inner[0].alpha == 1e-3 and inner[0].certificate_
    _assert_released(client, "linattn-cg")


def test_the_deadline_is_checked_before_every_product():
    """Short products never reach a poll of ``_compute``: the deadline is checked itself."""
    X = np.random.default_rng(12).normal(size=(30, 4, 2))
    Xd, yd = da.from_array(X, chunks=15), da.from_array(X[:, -1, 0], chunks=15)
    standardizer = dask_scales(Xd, yd).finish()
    part = _rows(X, X[:, -1, 0], standardizer)
    psi = n_attention_features(2)
    op = _DaskGram([dask.delayed(part)], psi, True, split_every=2,
                   deadline=time.monotonic() - 1.0, name="late", timeout=5)
    with pytest.raises(TimeoutError, match="timeout=5 s"):
        op.matmat(np.ones((psi, 1)))
    on_time = _DaskGram([dask.delayed(part)], psi, True, split_every=2,
                        deadline=time.monotonic() + SAFETY_NET, name="on-time",
                        timeout=SAFETY_NET)
    assert on_time.matmat(np.ones((psi, 1))).shape == (psi, 1)
