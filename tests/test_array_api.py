"""Array API dispatch: inputs of other libraries keep their namespace; results equal NumPy's.

Under ``sklearn.config_context(array_api_dispatch=True)`` every public entry
point given array-api-strict arrays (both of its devices) or PyTorch tensors
(float64 and float32; CUDA where there is one) must return arrays and fitted
attributes of that namespace and device, equal to the NumPy fit's to 1e-10
(float64), and run the dense kernels (Gram products, eigh, Cholesky, cg's
products) in that namespace.  The conftest sets ``SCIPY_ARRAY_API=1``.
"""

import pickle
import re

import numpy as np
import pytest
import sklearn
from hypothesis import given, settings
from hypothesis import strategies as st

from sklearn_linattn import (
    LinearAttentionFeatures,
    LinearAttentionRegressor,
    LinearAttentionRegressorCV,
    certify_identifiability,
)
from sklearn_linattn._namespace import NUMPY, Namespace, as_numpy, namespace_of

xs = pytest.importorskip("array_api_strict")
compat = pytest.importorskip("array_api_compat")


def _namespaces():
    """(name, make, device) of every namespace and device this machine has."""
    out = [
        pytest.param(xs, xs.Device("CPU_DEVICE"), id="strict-cpu"),
        pytest.param(xs, xs.Device("device1"), id="strict-device1"),
    ]
    try:
        import torch
    except ImportError:
        return out
    out.append(pytest.param(torch, "cpu", id="torch-cpu"))
    if torch.cuda.is_available():
        out.append(pytest.param(torch, "cuda", id="torch-cuda"))
    return out


NAMESPACES = _namespaces()
TOL = 1e-10


def put(lib, device, a, dtype=None):
    a = np.asarray(a)
    if dtype is not None:
        a = a.astype(dtype)
    return lib.asarray(a, device=device)


def dispatch():
    return sklearn.config_context(array_api_dispatch=True)


def assert_in(result, lib, device):
    """``result`` is an array of lib's namespace on ``device``."""
    assert compat.array_namespace(result).__name__.endswith(lib.__name__.split(".")[-1])
    assert str(compat.device(result)) == str(device)


def assert_close(result, expected, tol=TOL):
    got = as_numpy(result)
    expected = np.asarray(expected)
    assert got.shape == expected.shape
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol * scale)


def one_head_data(n=300, T=5, d=3, seed=0, noise=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    y = X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1) + noise * rng.normal(size=n)
    return X, y


FITTED = ("coef_", "intercept_", "skip_coef_", "value_matrices_", "key_query_matrices_")


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
@pytest.mark.parametrize("params", [
    {"solver": "eigh"},
    {"solver": "cholesky", "alpha": 1e-3},
    {"solver": "cg", "tol": 1e-13},
    {"solver": "svd", "n_heads": "auto"},
    {"fit_intercept": True, "fit_skip": True, "n_heads": 1},
    {"readout": "all"},
    {"decay": [0.6, 1.0]},
], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_regressor_equals_numpy_and_stays_in_the_namespace(lib, device, params):
    X, y = one_head_data(d=4, noise=0.01)
    if params.get("readout") == "all":
        y = np.cumsum(X[:, :, 0] * X[:, :, 1], axis=1)
    ref = LinearAttentionRegressor(**params).fit(X, y)
    with dispatch():
        model = LinearAttentionRegressor(**params).fit(put(lib, device, X), put(lib, device, y))
        X_long = np.random.default_rng(5).normal(size=(7, 11, 4)) * 3.0  # out of distribution
        pred = model.predict(put(lib, device, X_long))
        from_coef = model.predict_from_coefficients(put(lib, device, X_long))
        score = model.score(put(lib, device, X), put(lib, device, y))
    # Heads of a compression to fewer heads are refined iteratively, to the
    # refinement's own tolerance: another LAPACK driver's eigenvectors move them
    # within it.  The coefficients and an SVD's heads are exact.
    tol = 1e-6 if params.get("n_heads") is not None else TOL
    for name in FITTED:
        assert_in(getattr(model, name), lib, device)
        assert_close(getattr(model, name), getattr(ref, name),
                     tol=tol if name in ("value_matrices_", "key_query_matrices_") else TOL)
    assert model.solver_ == ref.solver_
    assert bool(model.certificate_) == bool(ref.certificate_)
    assert_in(pred, lib, device)
    assert_close(pred, ref.predict(X_long), tol=tol)
    assert_close(from_coef, ref.predict_from_coefficients(X_long))
    assert isinstance(score, float) and abs(score - ref.score(X, y)) < TOL


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
def test_cv_equals_numpy_and_stays_in_the_namespace(lib, device):
    X, y = one_head_data(n=200, noise=0.1)
    kwargs = {"alphas": (0.0, 1e-2, 1.0), "fit_intercept": "auto"}
    ref = LinearAttentionRegressorCV(**kwargs).fit(X, y)
    with dispatch():
        model = LinearAttentionRegressorCV(**kwargs).fit(put(lib, device, X), put(lib, device, y))
        pred = model.predict(put(lib, device, X))
    assert model.alpha_ == ref.alpha_ and model.best_index_ == ref.best_index_
    np.testing.assert_allclose(model.cv_results_["mean_test_score"],
                               ref.cv_results_["mean_test_score"], rtol=1e-9)
    for name in FITTED:
        assert_in(getattr(model, name), lib, device)
        assert_close(getattr(model, name), getattr(ref, name))
    assert_in(pred, lib, device)
    assert_close(pred, ref.predict(X))


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
@pytest.mark.parametrize("readout", ["last", "all"])
def test_transformer_equals_numpy(lib, device, readout):
    X, _ = one_head_data(n=20)
    X[3, 3:] = np.nan  # padding
    ref = LinearAttentionFeatures(readout=readout, include_bias=True).fit_transform(X)
    with dispatch():
        H = LinearAttentionFeatures(readout=readout, include_bias=True).fit_transform(
            put(lib, device, X))
    assert_in(H, lib, device)
    assert_close(H, ref)


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
@pytest.mark.parametrize("solver", ["eigh", "cholesky", "cg"])
def test_certificate_and_covers_equal_numpy(lib, device, solver):
    rng = np.random.default_rng(3)
    # Not identifying (sequences of one token): covers() has work to do; it
    # covers the new sequences of one token, not the longer ones.
    X = rng.normal(size=(400, 1, 3))
    X_new = rng.normal(size=(6, 4, 3))
    X_new[:3, 1:] = np.nan
    ref = certify_identifiability(X, solver=solver)
    with dispatch():
        cert = certify_identifiability(put(lib, device, X), solver=solver)
        covered = cert.covers(put(lib, device, X_new)) if solver != "cg" else None
        bound = cert.error_bound(put(lib, device, X_new), 1e-3) if solver != "cg" else None
    assert bool(cert) == bool(ref) is False
    assert cert.rank == ref.rank
    np.testing.assert_allclose(cert.min_eigenvalue, ref.min_eigenvalue, atol=1e-12)
    if solver != "cg":
        assert_in(covered, lib, device)
        np.testing.assert_array_equal(as_numpy(covered), ref.covers(X_new))
        np.testing.assert_array_equal(as_numpy(covered), [True] * 3 + [False] * 3)
        finite = np.isfinite(ref.error_bound(X_new, 1e-3))
        assert_close(as_numpy(bound)[finite], ref.error_bound(X_new, 1e-3)[finite])


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
def test_model_certificate_covers_inputs_of_the_namespace(lib, device):
    X, y = one_head_data(n=100)
    with dispatch():
        model = LinearAttentionRegressor().fit(put(lib, device, X), put(lib, device, y))
        covered = model.certificate_.covers(put(lib, device, X[:4]))
    assert_in(covered, lib, device)
    assert bool(model.certificate_) and as_numpy(covered).all()


def test_float32_input_fits_in_float64_like_numpy():
    torch = pytest.importorskip("torch")
    X, y = one_head_data(n=200)
    X32, y32 = X.astype(np.float32), y.astype(np.float32)
    ref = LinearAttentionRegressor().fit(X32, y32)
    with dispatch():
        model = LinearAttentionRegressor().fit(torch.asarray(X32), torch.asarray(y32))
        pred = model.predict(torch.asarray(X32))
    assert model.coef_.dtype == torch.float64 and ref.coef_.dtype == np.float64
    assert_close(model.coef_, ref.coef_)
    assert_close(pred, ref.predict(X32))


class _Counting(Namespace):
    """A namespace that counts the kernels run in it."""

    calls = None

    def _count(self, name):
        type(self).calls[name] = type(self).calls.get(name, 0) + 1

    def matmul(self, A, B):
        self._count("matmul")
        return super().matmul(A, B)

    def eigh(self, A):
        self._count("eigh")
        return super().eigh(A)

    def eigvalsh(self, A):
        self._count("eigvalsh")
        return super().eigvalsh(A)

    def cholesky(self, A):
        self._count("cholesky")
        return super().cholesky(A)

    def symmetric_product(self, G):
        self._count("symmetric_product")
        return super().symmetric_product(G)

    def cholesky_inverse_product(self, L):
        self._count("cholesky_inverse_product")
        return super().cholesky_inverse_product(L)


@pytest.mark.parametrize(("solver", "d", "kernels"), [
    ("eigh", 4, {"matmul", "eigh"}),  # psi = 40 <= 64: the rows' SYRK
    ("eigh", 5, {"eigh"}),  # psi = 75: the pair products (counted apart below)
    ("cholesky", 5, {"cholesky", "symmetric_product"}),
    ("cg", 5, set()),
])
def test_the_dense_kernels_run_in_the_input_namespace(monkeypatch, solver, d, kernels):
    from sklearn_linattn import _namespace
    from sklearn_linattn._moments import ImplicitGram
    from sklearn_linattn._solvers import _statistics

    _Counting.calls = {}
    original = _namespace.namespace_of

    def counting_namespace_of(X):
        ns = original(X)
        return ns if ns.is_numpy else _Counting(ns.xp, ns.device)

    pairs, products = [], []
    monkeypatch.setattr(_namespace, "namespace_of", counting_namespace_of)
    real_pairs = _statistics._pair_products_in
    monkeypatch.setattr(_statistics, "_pair_products_in",
                        lambda ns, St, B: pairs.append(1) or real_pairs(ns, St, B))
    real_products = ImplicitGram._device_products
    monkeypatch.setattr(ImplicitGram, "_device_products",
                        lambda self, ns, V: products.append(1) or real_products(self, ns, V))
    X, y = one_head_data(n=600, d=d, noise=0.01)
    with dispatch():
        LinearAttentionRegressor(solver=solver).fit(xs.asarray(X), xs.asarray(y))
    assert kernels <= set(_Counting.calls), _Counting.calls
    if d > 4 and solver != "cg":
        assert pairs
    if solver == "cg":
        assert products


def test_where_the_kernels_of_each_namespace_run():
    # array-api-strict computes with NumPy underneath: every kernel runs through
    # its namespace, and it stands for a device in these tests.
    with dispatch():
        strict = namespace_of(xs.asarray(np.ones((2, 3, 2))))
    assert strict.name.endswith("array_api_strict") and strict.host_memory
    assert strict.vector_products and not strict.own_cpu_threads
    assert not NUMPY.vector_products and not NUMPY.own_cpu_threads
    torch = pytest.importorskip("torch")
    from threadpoolctl import threadpool_info

    with dispatch():
        cpu = namespace_of(torch.ones(2, 3, 2, dtype=torch.float64))
    # PyTorch on the CPU: its own thread pool; Lanczos' vector products stay on the host,
    # and the host's BLAS runs on one thread while torch's pool does the dense kernels.
    assert cpu.host_memory and cpu.own_cpu_threads and not cpu.vector_products
    with cpu.active():
        blas = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        assert blas and set(blas) == {1}
    outside = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with strict.active():  # NumPy's BLAS is strict's own: left as it is
        assert [i["num_threads"] for i in threadpool_info()
                if i["user_api"] == "blas"] == outside


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
def test_namespace_kernels_read_one_triangle_and_equal_numpy(lib, device):
    # The dense solvers hand over matrices whose other triangle is zeros or stale.
    from array_api_compat import array_namespace

    rng = np.random.default_rng(3)
    F = rng.normal(size=(40, 12))
    G = F.T @ F
    garbage = np.triu(G) + np.tril(rng.normal(size=G.shape), -1)  # upper triangle read
    ns = Namespace(array_namespace(put(lib, device, G)), device)
    v = rng.normal(size=12)
    assert_close(ns.symmetric_product(garbage)(v), G @ v, tol=1e-13)
    L = ns.cholesky(garbage.T)  # lower triangle read
    assert_close(L, np.linalg.cholesky(G), tol=1e-13)
    inverse = ns.cholesky_inverse_product(L)
    if inverse is not None:  # array-api-strict has no triangular solve
        assert_close(inverse(v), np.linalg.solve(G, v), tol=1e-10)
    w, U = ns.eigh(G)
    assert_close(w, np.linalg.eigvalsh(G), tol=1e-13)
    assert_close((U * w) @ U.T, G, tol=1e-12)
    with pytest.raises(np.linalg.LinAlgError):
        ns.cholesky(-G)


@pytest.mark.parametrize(("lib", "device"), NAMESPACES)
def test_inputs_of_another_namespace_than_fit_are_refused(lib, device):
    X, y = one_head_data(n=60)
    with dispatch():
        model = LinearAttentionRegressor().fit(put(lib, device, X), put(lib, device, y))
        for method in ("predict", "score", "predict_from_coefficients"):
            args = (X, y) if method == "score" else (X,)
            with pytest.raises(ValueError, match=rf"LinearAttentionRegressor\.{method}\(\) must "
                               "use the same namespace.*numpy"):
                getattr(model, method)(*args)
        numpy_model = LinearAttentionRegressor().fit(X, y)
        with pytest.raises(ValueError, match="fit's were numpy"):
            numpy_model.predict(put(lib, device, X))


def test_without_dispatch_tensors_are_read_as_numpy():
    torch = pytest.importorskip("torch")
    X, y = one_head_data(n=60)
    model = LinearAttentionRegressor().fit(torch.asarray(X), torch.asarray(y))
    assert isinstance(model.coef_, np.ndarray)
    assert isinstance(model.predict(torch.asarray(X)), np.ndarray)
    assert namespace_of(torch.asarray(X)) is NUMPY


def test_tensors_that_require_grad_are_refused_by_name_under_dispatch():
    # Reading them into NumPy would drop their graph silently: the fit is not differentiable.
    torch = pytest.importorskip("torch")
    X, y = one_head_data(n=60)
    with dispatch():
        fitted = LinearAttentionRegressor().fit(torch.asarray(X), torch.asarray(y))
        with pytest.raises(TypeError, match=r"X is a tensor that requires grad.*X\.detach\(\)"):
            LinearAttentionRegressor().fit(torch.tensor(X, requires_grad=True), y)
        with pytest.raises(TypeError, match=r"y is a tensor that requires grad.*y\.detach\(\)"):
            LinearAttentionRegressor().fit(torch.asarray(X), torch.tensor(y, requires_grad=True))
        with pytest.raises(TypeError, match=r"X\[1\] is a tensor that requires grad"):
            fitted.predict([torch.asarray(X[0]), torch.tensor(X[1], requires_grad=True)])
        with pytest.raises(TypeError, match=r"X is a tensor that requires grad"):
            fitted.predict(torch.tensor(X, requires_grad=True))


def test_inputs_passed_by_keyword_keep_their_namespace():
    X, y = one_head_data(n=120)
    ref = LinearAttentionRegressor().fit(X, y)
    cpu = xs.Device("CPU_DEVICE")
    with dispatch():
        model = LinearAttentionRegressor().fit(X=xs.asarray(X), y=xs.asarray(y))
        covered = model.certificate_.covers(X_new=xs.asarray(X[:4]))
        certificate = certify_identifiability(X=xs.asarray(X))
        pred = model.predict(X=xs.asarray(X[:4]))
    assert_in(covered, xs, cpu)
    assert_in(pred, xs, cpu)
    assert_close(pred, ref.predict(X[:4]))
    assert bool(certificate) == bool(ref.certificate_)


def test_targets_and_weights_follow_X():
    torch = pytest.importorskip("torch")
    X, y = one_head_data(n=80)
    w = np.linspace(0.5, 2.0, 80)
    ref = LinearAttentionRegressor().fit(X, y, sample_weight=w)
    with dispatch():
        model = LinearAttentionRegressor().fit(xs.asarray(X), torch.asarray(y),
                                               sample_weight=torch.asarray(w))
        mixed = LinearAttentionRegressor().fit(X, xs.asarray(y), sample_weight=xs.asarray(w))
    assert_in(model.coef_, xs, xs.Device("CPU_DEVICE"))
    assert_close(model.coef_, ref.coef_)
    assert isinstance(mixed.coef_, np.ndarray)
    assert_close(mixed.coef_, ref.coef_)


def test_partial_fit_pickle_and_host_routines_read_a_namespaced_fit(tmp_path):
    torch = pytest.importorskip("torch")
    from sklearn_linattn import load_model, save_model
    from sklearn_linattn.nn import to_torch

    X, y = one_head_data(n=300)
    ref = LinearAttentionRegressor(solver="eigh").partial_fit(X[:150], y[:150])
    ref.partial_fit(X[150:], y[150:])
    with dispatch():
        model = LinearAttentionRegressor(solver="eigh").partial_fit(
            torch.asarray(X[:150]), torch.asarray(y[:150]))
        model.partial_fit(torch.asarray(X[150:]), torch.asarray(y[150:]))
        again = pickle.loads(pickle.dumps(model))
        assert_close(again.predict(torch.asarray(X[:5])), ref.predict(X[:5]))
    assert_close(model.coef_, ref.coef_)
    save_model(model, tmp_path / "m.npz")
    np.testing.assert_allclose(load_model(tmp_path / "m.npz").predict(X[:5]), ref.predict(X[:5]),
                               rtol=1e-12)
    layer = to_torch(model)
    out = layer(torch.asarray(X[:5]))
    np.testing.assert_allclose(out.detach().numpy()[:, 0], ref.predict(X[:5]), rtol=1e-10)


def test_dask_input_stays_on_the_numpy_path():
    da = pytest.importorskip("dask.array")
    X, y = one_head_data(n=120)
    ref = LinearAttentionRegressor(solver="eigh").fit(X, y)
    with dispatch():
        model = LinearAttentionRegressor(solver="eigh").fit(
            da.from_array(X, chunks=(40, 5, 3)), da.from_array(y, chunks=40))
    assert isinstance(model.coef_, np.ndarray)
    np.testing.assert_allclose(model.coef_, ref.coef_, atol=1e-10)


@settings(max_examples=15, deadline=None)
@given(n_samples=st.integers(1, 60), n_tokens=st.integers(1, 6), d=st.integers(1, 4),
       log_scale=st.integers(-100, 100), log_scale_y=st.integers(-100, 100),
       seed=st.integers(0, 2**16), solver=st.sampled_from(["auto", "eigh", "cholesky"]))
def test_strict_equals_numpy_over_shapes_and_scales(n_samples, n_tokens, d, log_scale,
                                                    log_scale_y, seed, solver):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_samples, n_tokens, d)) * 10.0 ** log_scale
    y = rng.normal(size=n_samples) * 10.0 ** log_scale_y
    X_new = rng.normal(size=(3, n_tokens + 2, d)) * 10.0 ** log_scale
    try:
        ref = LinearAttentionRegressor(solver=solver).fit(X, y)
    except ValueError as exc:
        # Coefficients beyond float64 (y / X**3 out of range): the same refusal.
        with dispatch(), pytest.raises(ValueError, match=re.escape(str(exc))):
            LinearAttentionRegressor(solver=solver).fit(xs.asarray(X), xs.asarray(y))
        return
    with dispatch():
        model = LinearAttentionRegressor(solver=solver).fit(xs.asarray(X), xs.asarray(y))
        pred = model.predict(xs.asarray(X_new))
        covered = model.certificate_.covers(xs.asarray(X_new))
    assert model.solver_ == ref.solver_
    assert bool(model.certificate_) == bool(ref.certificate_)
    np.testing.assert_array_equal(as_numpy(covered), ref.certificate_.covers(X_new))
    expected = ref.predict(X_new)
    assert_close(pred, expected, tol=1e-8)
