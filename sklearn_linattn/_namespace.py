"""The array namespace of a call: where its inputs live, and the dense kernels that run there.

With ``sklearn.set_config(array_api_dispatch=True)`` (and ``SCIPY_ARRAY_API=1``
in the environment, as scikit-learn requires), a public method given X from
another array library (PyTorch on any device, CuPy, array-api-strict) keeps
its results there: :func:`namespace_of` reads X's namespace and device once,
at the method's edge; the inputs are read into NumPy once (the validation,
the moments of the tokens and the bookkeeping of the units are small, O(n T
d**2), and run on the host); the dense kernels of a fit, whose cost grows
like psi**2 and psi**3 (the Gram matrix's products, its eigendecomposition
and Cholesky factor, conjugate gradients' products with the rows), run in
X's namespace on its device (:meth:`Namespace.active` makes a namespace the
one the kernels of a call use; its properties, such as
:attr:`Namespace.vector_products`, say which kernels it takes); and every
array the method fits or returns is put back into X's namespace and device
(:meth:`Namespace.asarray`, :func:`put_fitted`).

Without dispatch, or for NumPy, list and dask input, the namespace is
NumPy's and nothing of this module runs: the NumPy path is unchanged.
Computation is float64 in every namespace (float32 input included), like the
NumPy path, since the certificate's rank decisions need float64 Gram
matrices.
"""

import contextlib
import copy
import contextvars
import functools
import inspect
from dataclasses import dataclass

import numpy as np

from ._memory import single_blas_thread

__all__ = [
    "NUMPY",
    "Namespace",
    "active",
    "as_numpy",
    "check_fitted_namespace",
    "computes_in_namespace",
    "fits_in_namespace",
    "namespace_of",
    "on_host",
    "put_fitted",
    "put_results",
    "returns_in_namespace",
]


def _compat():
    """array_api_compat, or None where it is not installed (then only NumPy is read)."""
    try:
        import array_api_compat
    except ImportError:  # pragma: no cover - installed with scikit-learn's array API support
        return None
    return array_api_compat


def _dispatch():
    from sklearn import get_config

    return bool(get_config().get("array_api_dispatch", False))


def _foreign(a):
    """Whether ``a`` is an array of an array API library other than NumPy (dask excluded)."""
    compat = _compat()
    if compat is None or a is None or isinstance(a, np.ndarray):
        return False
    if compat.is_dask_array(a) or not compat.is_array_api_obj(a):
        return False
    return not compat.is_numpy_array(a)


def as_numpy(a):
    """``a`` as a NumPy array on the host (arrays of other libraries copied there once).

    Anything that is not an array of another library (lists, NumPy and dask
    arrays, None, scalars) is returned as it is.
    """
    if isinstance(a, (list, tuple)) and any(_foreign(b) for b in a):
        return type(a)(as_numpy(b) for b in a)
    if not _foreign(a):
        return a
    compat = _compat()
    if compat.is_torch_array(a):
        return a.detach().cpu().resolve_conj().resolve_neg().numpy()
    if compat.is_cupy_array(a):
        return a.get()
    # array-api-strict and other libraries: through DLPack, on the host.
    return np.from_dlpack(a)


@dataclass(frozen=True, eq=False)
class Namespace:
    """An array namespace and device: NumPy's (``xp`` None) or another library's.

    Parameters
    ----------
    xp : module or None
        The array API namespace (array_api_compat's wrapper); None for NumPy.
    device : object
        The device of the input arrays (None for NumPy).
    """

    xp: object = None
    device: object = None

    @property
    def is_numpy(self):
        """Whether this is NumPy's namespace (the unchanged path)."""
        return self.xp is None

    @property
    def name(self):
        """The namespace's module name, as users import it."""
        return "numpy" if self.xp is None else self.xp.__name__.replace("array_api_compat.", "")

    def __repr__(self):
        return f"Namespace({self.name!r}, device={self.device!r})"

    @property
    def host_memory(self):
        """Whether the arrays live in the host's memory (work then fits in cache-sized blocks)."""
        compat = _compat()
        return (self.xp is None or compat.is_array_api_strict_namespace(self.xp)
                or getattr(self.device, "type", str(self.device)) == "cpu")

    @property
    def own_cpu_threads(self):
        """Whether the kernels run on the host's cores in a thread pool of the library's own.

        PyTorch on the CPU (its OpenMP pool) does; NumPy and array-api-strict
        (NumPy underneath) compute with NumPy's BLAS, and GPU libraries on the
        device.
        """
        compat = _compat()
        return (self.xp is not None and compat.is_torch_namespace(self.xp)
                and getattr(self.device, "type", str(self.device)) == "cpu")

    def same_as(self, other):
        """Whether ``other`` is the same namespace on the same device."""
        return self.name == other.name and str(self.device) == str(other.device)

    def asarray(self, a, dtype=None):
        """A NumPy array (or scalar) in this namespace on this device; None stays None."""
        if a is None or self.xp is None:
            return a
        a = np.asarray(a)
        if a.dtype.kind in "OUS":
            return a  # names and objects have no array API counterpart
        # C-contiguous and writable: the libraries read no negative strides, and
        # a library array may share the memory of a NumPy array it was made from.
        a = np.ascontiguousarray(a)
        if not a.flags.writeable:
            a = a.copy()
        return self.xp.asarray(a, dtype=dtype, device=self.device)

    @property
    def vector_products(self):
        """Whether the matrix-vector products of Lanczos run in this namespace.

        On a device they do, where the matrix is.  NumPy runs them itself, and
        so does a library with a CPU thread pool of its own: a BLAS pass over
        the same memory on the host avoids waking that pool at each of the
        hundreds of steps (a tenth of a millisecond each).
        """
        return not (self.is_numpy or self.own_cpu_threads)

    @contextlib.contextmanager
    def active(self):
        """Make this the namespace the kernels of the current call run in.

        Where the library's kernels have a CPU thread pool of their own, the
        host's BLAS runs on one thread meanwhile (as scikit-learn's KMeans
        does): the two pools, alternating on the same cores, each spin while
        the other works, which made a PyTorch CPU fit 2 to 3 times slower.
        """
        token = _ACTIVE.set(self)
        try:
            with single_blas_thread() if self.own_cpu_threads else contextlib.nullcontext():
                yield self
        finally:
            _ACTIVE.reset(token)

    def multiply_into(self, a, b, out):
        """``out[...] = a * b`` for arrays of this namespace, without a temporary where the
        library writes into ``out`` (PyTorch, CuPy)."""
        compat = _compat()
        if compat.is_torch_namespace(self.xp):
            import torch

            torch.mul(a, b, out=out)
        elif compat.is_cupy_namespace(self.xp):
            import cupy

            cupy.multiply(a, b, out=out)
        else:
            out[...] = a * b

    # The dense kernels: NumPy arrays in and out, the arithmetic in this namespace.

    def matmul(self, A, B):
        """``A @ B`` (float64 NumPy arrays), computed in this namespace."""
        if self.xp is None:
            return A @ B
        return as_numpy(self.xp.matmul(self.asarray(A), self.asarray(B)))

    def eigh(self, A):
        """Eigenvalues (increasing) and eigenvectors of a symmetric NumPy matrix."""
        w, U = self.xp.linalg.eigh(self.asarray(A))
        return as_numpy(w), as_numpy(U)

    def eigvalsh(self, A):
        """Eigenvalues (increasing) of a symmetric NumPy matrix."""
        return as_numpy(self.xp.linalg.eigvalsh(self.asarray(A)))

    def cholesky(self, A):
        """Lower Cholesky factor of a symmetric NumPy matrix (its lower triangle read).

        Raises :class:`numpy.linalg.LinAlgError` where A is not numerically
        positive definite, whatever the library reports (some return NaNs).
        """
        xp = self.xp
        M = self.asarray(A)
        M = xp.tril(M) + xp.matrix_transpose(xp.tril(M, k=-1))
        try:
            L = as_numpy(xp.linalg.cholesky(M))
        except Exception as exc:  # each library has its own error for an indefinite matrix
            raise np.linalg.LinAlgError(str(exc)) from exc
        if not np.isfinite(np.diagonal(L)).all() or not (np.diagonal(L) > 0).all():
            raise np.linalg.LinAlgError("the matrix is not positive definite.")
        return L

    def symmetric_product(self, G):
        """``v -> G @ v`` for a symmetric NumPy matrix G of which only the upper triangle is read.

        G is held once in this namespace, made whole there.
        """
        xp = self.xp
        M = xp.triu(self.asarray(G))
        M = M + xp.matrix_transpose(xp.triu(M, k=1))

        def product(v):
            return as_numpy(self.xp.matmul(M, self.asarray(v)))

        return product

    def _triangular_solve(self):
        """The library's triangular solve ``(L, b, upper) -> x``, or None (array API has none)."""
        compat = _compat()
        if compat.is_torch_namespace(self.xp):
            import torch

            return lambda L, b, upper: torch.linalg.solve_triangular(L, b, upper=upper)
        if compat.is_cupy_namespace(self.xp):
            from cupyx.scipy.linalg import solve_triangular

            return lambda L, b, upper: solve_triangular(L, b, lower=not upper)
        return None

    def cholesky_inverse_product(self, L):
        """``v -> (L L^T)^{-1} v`` for a lower NumPy factor L held once in this namespace.

        None where the library has no triangular solve (array-api-strict):
        the caller solves on the host.
        """
        solve = self._triangular_solve()
        if solve is None:
            return None
        Ld = self.asarray(L)
        Ut = self.xp.matrix_transpose(Ld)

        def inverse(v):
            b = self.xp.reshape(self.asarray(v), (-1, 1))
            return as_numpy(solve(Ut, solve(Ld, b, False), True))[:, 0]

        return inverse


NUMPY = Namespace(None, "cpu")

_ACTIVE = contextvars.ContextVar("sklearn_linattn_namespace", default=NUMPY)


def active():
    """The namespace the dense kernels of the current call run in (NumPy's by default)."""
    return _ACTIVE.get()


def _first_array(X):
    if isinstance(X, (list, tuple)):
        return next((b for b in X if _foreign(b)), None)
    return X if _foreign(X) else None


def namespace_of(X):
    """The namespace of X under array API dispatch: NumPy's without dispatch or for NumPy X.

    X is a call's reference input ("everything follows X": targets and
    weights from other libraries are read into NumPy and the results put
    into X's namespace).  A list of sequences takes its arrays' namespace.

    Parameters
    ----------
    X : array-like or list of arrays
        The input.

    Returns
    -------
    namespace : Namespace
    """
    if not _dispatch():
        return NUMPY
    a = _first_array(X)
    if a is None:
        return NUMPY
    compat = _compat()
    return Namespace(compat.array_namespace(a), compat.device(a))


def _fit_key(namespace):
    return (namespace.name, str(namespace.device))


def check_fitted_namespace(estimator, X, method):
    """Refuse X of another namespace or device than the fit's, under dispatch.

    Parameters
    ----------
    estimator : object
        The fitted estimator (named in the message).
    X : array-like
        The method's input.
    method : str
        The method's name.

    Returns
    -------
    namespace : Namespace
        X's namespace (the fit's), where the method's results are put.
    """
    if not _dispatch():
        return NUMPY
    given = namespace_of(X)
    fitted = getattr(estimator, "_fit_namespace", None)  # None: not fitted by a fit of ours
    if fitted is not None and _fit_key(given) != fitted:
        raise ValueError(
            f"Inputs passed to {type(estimator).__name__}.{method}() must use the same namespace "
            f"and the same device as those passed to fit(): fit's were {fitted[0]} on "
            f"{fitted[1]}, these are {given.name} on {given.device!r}.")
    return given


def _read(a, name):
    """``a`` read into NumPy under dispatch; a tensor that requires grad is refused by name.

    The fits and their results are not differentiable: reading such a tensor
    would drop its graph without a word.
    """
    if isinstance(a, (list, tuple)) and any(_foreign(b) for b in a):
        return type(a)(_read(b, f"{name}[{i}]") for i, b in enumerate(a))
    if getattr(a, "requires_grad", False) is True and _foreign(a):
        raise TypeError(
            f"{name} is a tensor that requires grad; the fit and its results are not "
            f"differentiable: pass {name}.detach().")
    return as_numpy(a)


def _read_arguments(function, args, kwargs):
    """The arguments of a call, those of other libraries read into NumPy under dispatch.

    Without dispatch they are passed on untouched, so that the validation of
    the NumPy path sees them as it always has (and refuses, by name, the
    tensors NumPy cannot read).
    """
    if not _dispatch():
        return list(args), kwargs
    bound = inspect.signature(function).bind_partial(*args, **kwargs)
    names = list(bound.arguments)
    args = [_read(a, names[i] if i < len(names) else f"argument {i}")
            for i, a in enumerate(args)]
    kwargs = {k: _read(v, k) for k, v in kwargs.items()}
    return args, kwargs


def _call(function, ns, args, kwargs):
    """``function(*args, **kwargs)``, its arguments read, run with ``ns`` active."""
    args, kwargs = _read_arguments(function, args, kwargs)
    if ns.is_numpy:
        return function(*args, **kwargs)
    with ns.active():
        return function(*args, **kwargs)


def fits_in_namespace(fit):
    """Decorate a ``fit(self, X, ...)``: inputs read once, fitted arrays put in X's namespace.

    Targets, weights and other array arguments of another library are read
    into NumPy too ("everything follows X").
    """
    @functools.wraps(fit)
    def wrapper(self, X, *args, **kwargs):
        ns = namespace_of(X)
        out = _call(fit, ns, (self, X, *args), kwargs)
        put_fitted(self, ns)
        self._fit_namespace = _fit_key(ns)
        return out

    return wrapper


def returns_in_namespace(method):
    """Decorate a fitted method ``method(self, X, ...)``: its arrays in the fit's namespace.

    Under dispatch X must be in the namespace and on the device of the fit
    (a ValueError names both); the method reads the fitted arrays on the host
    (:func:`on_host`), and array results (and the arrays of a tuple of
    results) are put in that namespace.
    """
    @functools.wraps(method)
    def wrapper(self, X, *args, **kwargs):
        ns = check_fitted_namespace(self, X, method.__name__)
        return put_results(_call(method, ns, (on_host(self), X, *args), kwargs), ns)

    return wrapper


def computes_in_namespace(function):
    """Decorate a function ``function(X, ...)`` or a method ``method(self, X, ...)``.

    X's namespace (under dispatch) runs the kernels; array arguments are read
    into NumPy once; array results (and the arrays of a tuple) are put in X's
    namespace.  Unlike a fitted method, there is no fit to agree with.
    """
    names = list(inspect.signature(function).parameters)
    position = 1 if names[0] == "self" else 0  # X's

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        X = args[position] if len(args) > position else kwargs.get(names[position])
        ns = namespace_of(X)
        return put_results(_call(function, ns, args, kwargs), ns)

    return wrapper


def put_results(out, namespace):
    """A method's results in a namespace: arrays, and the arrays of a tuple."""
    if namespace.is_numpy:
        return out
    if isinstance(out, tuple):
        return tuple(put_results(o, namespace) for o in out)
    return namespace.asarray(out) if isinstance(out, np.ndarray) else out


def put_fitted(estimator, namespace):
    """Put the estimator's fitted NumPy arrays into a namespace (the parameters untouched).

    Fitted arrays are the attributes ending in ``_`` and the private ones
    (a leading ``_``): no parameter is named either way.
    """
    if namespace.is_numpy:
        return estimator
    for name, value in list(vars(estimator).items()):
        if ((name.endswith("_") or name.startswith("_")) and isinstance(value, np.ndarray)
                and value.dtype.kind in "fiub"):
            setattr(estimator, name, namespace.asarray(value))
    return estimator


def on_host(estimator):
    """The estimator with its fitted arrays in NumPy: itself, or a shallow copy.

    For the routines that read a fitted estimator on the host (model files,
    PyTorch modules, comparisons with the optimum): the copy shares
    everything else with the estimator.
    """
    foreign = {name: value for name, value in vars(estimator).items() if _foreign(value)}
    if not foreign:
        return estimator
    out = copy.copy(estimator)
    for name, value in foreign.items():
        setattr(out, name, as_numpy(value))
    return out
