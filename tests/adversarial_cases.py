"""The adversarial catalogue: malformed and extreme inputs through every public entry point.

This module is a catalogue, not a test file (pytest does not collect it;
``tests/test_adversarial.py`` runs it).  Each :class:`Case` is a small record:
an id, the entry point it exercises, a callable that runs it, and the expected
outcome -- a checker of the right answer, or ``(exception types, regex)`` that
the error must match (the regex names the argument), or both when either is
acceptable.

Outcome classes (``evaluate``):

- ``CORRECT``: the call returned and the checker accepted the answer;
- ``CLEAR_ERROR``: a ValueError/TypeError (or the case's own types) whose
  message matches the case's pattern, i.e. names the argument;
- ``SILENT_WRONG``: the call returned, but the answer is wrong (differs from the
  reference, NaN/inf where a finite answer exists, a certificate that says
  identifiable on a design with a known null space) or invalid input was
  accepted;
- ``OTHER_EXCEPTION``: any other exception, a ValueError/TypeError whose message
  does not name the argument, a traceback from the command line, or a child
  process that died;
- ``HANG``: the case ran past its time limit and was killed.  The limit
  (``HANG_SECONDS``, 300 s) is far beyond what any case needs (the slowest,
  three command-line runs, takes about 12 s on a quiet two-core machine), so
  that a loaded machine never turns a slow case into a HANG: no outcome
  depends on the machine's speed.

Defects: ``defect=N`` ties a case to a defect it was written for.  Defects 1
to 18 are fixed.  An open defect (``OPEN_DEFECTS``) has cases that declare the
right outcome and, with ``today=``, the outcome the defect shows until it is
fixed: the suite passes while a case shows exactly that (pytest: an expected
failure, strict) and fails once the case ends as expected, so that the fix
updates the catalogue.  ``requires=`` names modules a case needs (PyTorch): the
case is skipped without them, and they are imported once before the children
fork.

Report mode, from the repository root with the checkout to test first on the
path (``PYTHONPATH=.``; otherwise an installed copy may be the one imported --
the report names it)::

    PYTHONPATH=. python tests/adversarial_cases.py [--json PATH] [--timeout 300]
        [--jobs N] [--only REGEX] [--skip-slow] [--list]

runs every case in a forked child process (its own process group, BLAS on
one thread, an address-space limit, killed at the time limit) and prints the
counts per outcome class and per entry point (the tally), the failing case ids
by defect, and the open defects that now end as expected.  It exits 0 when
every case ends as expected or as its open defect is recorded.

Conventions: the reference answers below are computed with this module's own
numpy code (features, forward pass, ranks), never with the package; where the
right answer at an extreme scale is fixed by an exact identity (X * c with
y * c**3 predicts c**3 times the unit-scale predictions, with the same
verdict; X @ A leaves identifiability unchanged) the checker uses it.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

CORRECT = "CORRECT"
CLEAR_ERROR = "CLEAR_ERROR"
SILENT_WRONG = "SILENT_WRONG"
OTHER_EXCEPTION = "OTHER_EXCEPTION"
HANG = "HANG"
OUTCOMES = (CORRECT, CLEAR_ERROR, SILENT_WRONG, OTHER_EXCEPTION, HANG)

# Seconds after which a case is killed as a HANG: a safety net far beyond the
# time of every case (about 12 s at most on a quiet two-core machine, a few
# times that under load), never a budget a slow machine could exceed.
HANG_SECONDS = 300.0
DEFAULT_TIMEOUT = HANG_SECONDS
# Address space a case may add to the process (MiB); a guard, so that a case
# that allocates without bound ends as MemoryError instead of taking the
# machine down.
DEFAULT_MEMORY_MB = 6144

# Argument names of the package's public functions: a ValueError/TypeError
# counts as naming its argument when it matches (cases that expect an error
# give their own, narrower pattern).
DEFAULT_NAMES = (
    r"\b(X|y|Y|X_new|V|Q|coef|d|n_heads|solver|readout|alpha|n_steps|random_state|"
    r"epsilon|tol|lengths|token_dim|data_format|sample_weight|max_iter|path|file)\b"
)


class Wrong(AssertionError):
    """Raised by a checker: the answer is wrong (SILENT_WRONG)."""


class Hang(Exception):
    """Raised by a case that detected a hang itself (a subprocess timeout)."""


class CliError(ValueError):
    """The command line exited non-zero without a traceback."""

    def __init__(self, returncode, stderr):
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"exit {returncode}: {stderr.strip()[-800:]}")


class CliTraceback(RuntimeError):
    """The command line printed a Python traceback (OTHER_EXCEPTION)."""


@dataclass
class Case:
    id: str
    entry: str
    call: Callable[[Path], Any]
    check: Optional[Callable[[Any], None]] = None
    error: Optional[tuple] = None  # (exception types, regex)
    names: Optional[str] = None  # regex naming the argument, for answer-only cases
    defect: Optional[int] = None
    timeout: Optional[float] = None
    memory_mb: Optional[int] = None
    slow: bool = False
    note: str = ""
    today: Optional[str] = None  # an open defect: the outcome it shows until it is fixed
    requires: tuple = ()  # modules the case needs (imported before forking)

    @property
    def open(self):
        """Whether the case records an open defect (``OPEN_DEFECTS[defect]``)."""
        return self.today is not None

    @property
    def expected(self):
        out = []
        if self.check is not None:
            out.append(CORRECT)
        if self.error is not None:
            out.append(CLEAR_ERROR)
        return tuple(out)


CASES: list[Case] = []

# Defects found by the catalogue and not fixed yet, by number.  A case of an
# open defect declares the right outcome as every case does, and the outcome
# the defect shows today (``today=``): the suite passes while the case shows
# exactly that (pytest reports it as an expected failure), and fails as soon
# as the case ends in its expected outcome -- the defect is fixed, so the case
# must lose its ``today`` (and the defect its entry here) -- or in anything
# else.
OPEN_DEFECTS = {}


def add(id, entry, call, *, check=None, error=None, names=None, defect=None,
        timeout=None, memory_mb=None, slow=False, note="", today=None, requires=()):
    if any(c.id == id for c in CASES):
        raise RuntimeError(f"duplicate case id {id}")
    if check is None and error is None:
        raise RuntimeError(f"case {id} has no expected outcome")
    if today is not None and (defect not in OPEN_DEFECTS or today not in OUTCOMES
                              or today in (CORRECT if check else None,
                                           CLEAR_ERROR if error else None)):
        raise RuntimeError(f"case {id}: today= needs an open defect and an unexpected outcome")
    CASES.append(Case(id, entry, call, check, error, names, defect, timeout, memory_mb,
                      slow, note, today, tuple(requires)))


def missing_requirements(case):
    """The modules of ``case.requires`` that are not installed."""
    import importlib.util

    out = []
    for name in case.requires:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def err(pattern, types=(ValueError, TypeError)):
    return (types, pattern)


def both(*patterns):
    """A regex matching text that contains every one of ``patterns`` (any order)."""
    return "".join(f"(?=.*?(?:{p}))" for p in patterns)


def expect(cond, message):
    if not cond:
        raise Wrong(message)


# An editable install maps every ``sklearn_linattn.*`` name to its own checkout,
# even when PYTHONPATH put another checkout's package first; then a submodule
# that the other checkout lacks (e.g. ``metrics``) would silently come from the
# editable one.  This finder makes submodules come from the package's own
# directory, or not at all.  The command-line cases run under it too.
_IMPORT_GUARD = """
import importlib.machinery as _machinery
import sys as _sys


class _SameCheckout:
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("sklearn_linattn."):
            return None
        parent = _sys.modules.get(name.rpartition(".")[0])
        if parent is None or not hasattr(parent, "__path__"):
            return None
        spec = _machinery.PathFinder.find_spec(name, list(parent.__path__))
        if spec is None:
            raise ModuleNotFoundError(
                f"No module named {name!r} in {list(parent.__path__)}", name=name)
        return spec


if not any(type(f).__name__ == "_SameCheckout" for f in _sys.meta_path):
    _sys.meta_path.insert(0, _SameCheckout())
"""
exec(compile(_IMPORT_GUARD, "<adversarial import guard>", "exec"))


def pkg():
    import sklearn_linattn

    return sklearn_linattn


# ---------------------------------------------------------------------------
# References (this module's own numpy code, independent of the package)
# ---------------------------------------------------------------------------


def ref_lengths(X):
    X = np.asarray(X, dtype=np.float64)
    pad = np.isnan(X).all(axis=2)
    return np.array([int(np.argmax(p)) if p.any() else X.shape[1] for p in pad])


def _zero_padded(X):
    X = np.array(X, dtype=np.float64)
    lengths = ref_lengths(X)
    X[np.arange(X.shape[1])[None, :] >= lengths[:, None]] = 0.0
    return X, lengths


def ref_forward(X, V, Q, readout="last"):
    """sum_h V_h sum_t x_t (x_t^T Q_h x_last), from the definition."""
    X0, lengths = _zero_padded(X)
    V = np.asarray(V, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    if readout == "last":
        S = np.einsum("ntj,ntk->njk", X0, X0)
        xl = X0[np.arange(len(X0)), lengths - 1]
        return np.einsum("haj,njk,hkl,nl->na", V, S, Q, xl)
    S = np.cumsum(np.einsum("ntj,ntk->ntjk", X0, X0), axis=1)
    y = np.einsum("haj,ntjk,hkl,ntl->nta", V, S, Q, X0)
    y[np.arange(X0.shape[1])[None, :] >= lengths[:, None]] = np.nan
    return y


def ref_features(X):
    """H(Z)_{(j,k),l} = S_jk x_last,l for j <= k (row-major pairs, then l)."""
    X0, lengths = _zero_padded(X)
    d = X0.shape[2]
    S = np.einsum("ntj,ntk->njk", X0, X0)
    j, k = np.triu_indices(d)
    xl = X0[np.arange(len(X0)), lengths - 1]
    return (S[:, j, k][:, :, None] * xl[:, None, :]).reshape(len(X0), -1)


def psi(d):
    return d * d * (d + 1) // 2


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (den if den > 0 else 1.0))


def teacher(d=3, n_heads=2, d_out=1, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n_heads, d_out, d)) / np.sqrt(d),
            rng.normal(size=(n_heads, d, d)) / np.sqrt(d))


def gaussian(n, T, d, seed=0):
    return np.random.default_rng(seed).normal(size=(n, T, d)) / np.sqrt(T)


def realizable(n=200, T=6, d=3, n_heads=2, d_out=1, seed=0, readout="last",
               variable=False):
    """(X, y, V, Q, X_test): exactly realizable data and longer test inputs."""
    V, Q = teacher(d, n_heads, d_out, seed)
    rng = np.random.default_rng(seed + 1000)
    X = rng.normal(size=(n, T, d)) / np.sqrt(T)
    if variable:
        lengths = rng.integers(2, T + 1, size=n)
        X[np.arange(T)[None, :] >= lengths[:, None]] = np.nan
    y = ref_forward(X, V, Q, readout)
    y = y[..., 0] if d_out == 1 else y
    Xt = rng.normal(size=(40, 2 * T, d)) / np.sqrt(T)
    return X, y, V, Q, Xt


def truth(Xt, V, Q, readout="last"):
    y = ref_forward(Xt, V, Q, readout)
    return y[..., 0] if y.shape[-1] == 1 else y


def finite(a):
    return bool(np.all(np.isfinite(np.asarray(a, dtype=np.float64))))


def LAR(**kw):
    return pkg().LinearAttentionRegressor(**kw)


def fit_check(model, X, y, Xt, yt, *, rtol=1e-8, certified=True):
    """Predictions on new inputs to rtol and the verdict."""
    p = model.predict(Xt)
    expect(finite(p), "predictions contain NaN or inf")
    expect(bool(model.certificate_) == certified,
           f"certificate_ says {bool(model.certificate_)}, expected {certified}")
    e = rel(p, yt)
    expect(e <= rtol, f"relative error on new inputs {e:.3g} > {rtol:g}")


SOLVERS6 = ("eigh", "cholesky", "svd", "dual", "cg", "lsmr")


# ---------------------------------------------------------------------------
# Defect 1: overall scale X * c, y * c**3 on every solver
# ---------------------------------------------------------------------------


def _scale_fit_call(solver, c):
    def call(tmp):
        X, y, V, Q, Xt = realizable(200, 6, 3, n_heads=2, seed=0)
        unit = LAR(solver=solver).fit(X, y)
        p1 = unit.predict(Xt)
        model = LAR(solver=solver).fit(X * c, y * c**3)
        pc = model.predict(Xt * c)
        return dict(c=c, v1=bool(unit.certificate_), vc=bool(model.certificate_),
                    p1=p1, pc=pc, yt=truth(Xt, V, Q))
    return call


def _scale_fit_check(r):
    c = r["c"]
    expect(r["v1"], "the unit-scale fit is not certified")
    expect(rel(r["p1"], r["yt"]) <= 1e-7,
           f"unit-scale predictions off by {rel(r['p1'], r['yt']):.3g}")
    expect(r["vc"] == r["v1"], f"verdict {r['vc']} at scale {c:g}, {r['v1']} at unit scale")
    expect(finite(r["pc"]), f"predictions at scale {c:g} contain NaN or inf")
    e = rel(r["pc"] / c**3, r["p1"])
    expect(e <= 1e-10, f"predictions at scale {c:g} differ from c**3 x unit-scale by {e:.3g}")


for _solver in SOLVERS6:
    for _c in (1e-100, 1e-60, 1e-30, 1e-6, 1e6, 1e25, 1e60, 1e100):
        add(f"fit_scale_{_solver}_{_c:.0e}", "LinearAttentionRegressor.fit",
            _scale_fit_call(_solver, _c), check=_scale_fit_check,
            # Outside 1e-30..1e30 the Gram matrix itself is not representable: a
            # clear refusal naming X is acceptable there (the issue's target).
            error=err(r"\bX\b|\by\b") if abs(math.log10(_c)) > 30 else None,
            names=DEFAULT_NAMES, defect=1)


def _scale_certify_call(solver, c, deficient):
    def call(tmp):
        X = gaussian(200, 6, 3, seed=3)
        if deficient:
            X[:, :, 2] = 0.0  # a known null space
        C = pkg().certify_identifiability
        return dict(c=c, v1=bool(C(X, solver=solver)), vc=bool(C(X * c, solver=solver)),
                    deficient=deficient)
    return call


def _scale_certify_check(r):
    expected = not r["deficient"]
    expect(r["v1"] == expected, f"unit-scale verdict {r['v1']}, expected {expected}")
    expect(r["vc"] == expected, f"verdict {r['vc']} at scale {r['c']:g}, expected {expected}")


for _solver in SOLVERS6:
    for _c in (1e-100, 1e100):
        add(f"certify_scale_{_solver}_{_c:.0e}", "certify_identifiability",
            _scale_certify_call(_solver, _c, False), check=_scale_certify_check,
            error=err(r"\bX\b"), defect=1)
for _solver in ("eigh", "svd", "cg"):
    for _c in (1e-100, 1e100):
        add(f"certify_scale_nullspace_{_solver}_{_c:.0e}", "certify_identifiability",
            _scale_certify_call(_solver, _c, True), check=_scale_certify_check,
            error=err(r"\bX\b"), defect=1)


# ---------------------------------------------------------------------------
# Defect 2: units per coordinate, invertible maps of the tokens
# ---------------------------------------------------------------------------


def _units_call(solver, A):
    def call(tmp):
        X, y, V, Q, Xt = realizable(300, 6, 3, n_heads=2, seed=0)
        model = LAR(solver=solver).fit(X @ A, y)
        return dict(model=model, X=X @ A, y=y, Xt=Xt @ A, yt=truth(Xt, V, Q))
    return call


def _units_check(r):
    r2 = r["model"].score(r["X"], r["y"])
    expect(r2 >= 1 - 1e-10, f"training R^2 {r2:.6g} on exactly realizable data")
    fit_check(r["model"], r["X"], r["y"], r["Xt"], r["yt"], rtol=1e-8)


def _conditioned_map(cond, seed=0):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    W, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    return U @ np.diag(np.logspace(-0.5 * np.log10(cond), 0.5 * np.log10(cond), 3)) @ W.T


_UNITS = np.diag([30.0, 1 / 30, 1.0])
for _solver in SOLVERS6:
    add(f"fit_units_30_1over30_1_{_solver}", "LinearAttentionRegressor.fit",
        _units_call(_solver, _UNITS), check=_units_check, names=DEFAULT_NAMES, defect=2)
for _solver in ("eigh", "svd", "cg"):
    add(f"fit_linear_map_cond1e6_{_solver}", "LinearAttentionRegressor.fit",
        _units_call(_solver, _conditioned_map(1e6)), check=_units_check,
        names=DEFAULT_NAMES, defect=2)


def _verdict_map_call(A):
    def call(tmp):
        X = gaussian(300, 6, 3, seed=4)
        C = pkg().certify_identifiability
        return bool(C(X)), bool(C(X @ A))
    return call


def _verdict_map_check(r):
    expect(r[0], "generic Gaussian design (N = 300 >= psi = 18) not certified")
    expect(r[1] == r[0], f"verdict flips under an invertible map of the tokens: {r}")


for _name, _A in (("units_1e3", np.diag([1e3, 1.0, 1.0])),
                  ("units_1e-2", np.diag([1e-2, 1.0, 1.0])),
                  ("units_30_1over30", _UNITS), ("map_cond1e6", _conditioned_map(1e6, seed=1))):
    add(f"certify_{_name}", "certify_identifiability", _verdict_map_call(_A),
        check=_verdict_map_check, names=DEFAULT_NAMES, defect=2)


def _null_map_call(A):
    def call(tmp):
        X = gaussian(300, 6, 3, seed=4)
        X[:, :, 2] = 0.0
        return bool(pkg().certify_identifiability(X @ A))
    return call


add("certify_nullspace_units_1e3", "certify_identifiability",
    _null_map_call(np.diag([1.0, 1.0, 1e3])),
    check=lambda v: expect(v is False, "a design with a null space certified identifiable"),
    names=DEFAULT_NAMES, defect=2)


# ---------------------------------------------------------------------------
# Defect 3: extreme entries, zero feature rows, memory of "dual"
# ---------------------------------------------------------------------------


def _entry_design(value, d=3, n=100, pos=(0, 0, 0), seed=0):
    X = np.random.default_rng(seed).normal(size=(n, 5, d))
    X[pos] = value
    return X


def _sane_certificate(cert):
    expect(isinstance(cert, pkg().IdentifiabilityCertificate), f"returned {type(cert)}")
    for name in ("min_eigenvalue", "max_eigenvalue", "tol"):
        v = getattr(cert, name)
        expect(not math.isnan(v), f"{name} is NaN")
    expect(cert.max_eigenvalue > 0, "max_eigenvalue 0 on data that is not all zero")
    expect(bool(cert) == (cert.min_eigenvalue - cert.min_eigenvalue_error > cert.tol),
           "verdict inconsistent with its own numbers")
    expect(0 <= cert.rank <= cert.n_features, f"rank {cert.rank}")


def _certify_entry(value, solver, d=3):
    return lambda tmp: pkg().certify_identifiability(_entry_design(value, d), solver=solver)


for _solver in ("svd", "eigh", "cg", "dual"):
    add(f"certify_entry_1e300_{_solver}", "certify_identifiability",
        _certify_entry(1e300, _solver), check=_sane_certificate, error=err(r"\bX\b"),
        defect=3)
for _solver in ("cg", "eigh"):
    add(f"certify_entry_3.4e38_{_solver}_d4", "certify_identifiability",
        _certify_entry(3.4e38, _solver, d=4), check=_sane_certificate, error=err(r"\bX\b"),
        defect=3)


def _fit_entry_1e300(tmp):
    X, y, V, Q, Xt = realizable(100, 5, 3, seed=0)
    X[0, 0, 0] = 1e300
    return LAR(solver="svd").fit(X, y)


def _finite_model(m):
    expect(finite(m.coef_), "coef_ has NaN or inf")
    _sane_certificate(m.certificate_)


add("fit_entry_1e300_svd", "LinearAttentionRegressor.fit", _fit_entry_1e300,
    check=_finite_model, error=err(r"\bX\b"), defect=3)


def _zero_rows_call(solver, d, how):
    def call(tmp):
        X = np.random.default_rng(1).normal(size=(100, 5, d))
        if how == "last":
            X[:, -1] = 0.0  # every feature row is zero
        else:
            X[:] = 0.0
        return pkg().certify_identifiability(X, solver=solver)
    return call


def _not_identifiable(cert):
    expect(not bool(cert), "all-zero feature rows certified identifiable")
    expect(cert.rank < cert.n_features, f"rank {cert.rank} of {cert.n_features}")
    expect(not math.isnan(cert.min_eigenvalue), "min_eigenvalue is NaN")


for _solver, _d, _how in (("cg", 4, "last"), ("cg", 5, "last"), ("cg", 2, "all"),
                          ("eigh", 4, "last"), ("svd", 3, "all"), ("dual", 3, "all"),
                          ("lsmr", 3, "all"), ("cholesky", 4, "last")):
    add(f"certify_zero_rows_{_how}_{_solver}_d{_d}", "certify_identifiability",
        _zero_rows_call(_solver, _d, _how), check=_not_identifiable, names=DEFAULT_NAMES,
        defect=3 if _solver == "cg" else None)


def _dual_memory(tmp):
    X = np.random.default_rng(0).normal(size=(60000, 2, 12)).astype(np.float32)
    return pkg().certify_identifiability(X, solver="dual")


add("certify_dual_60000_psi936", "certify_identifiability", _dual_memory,
    error=err(both(r"dual|solver", r"memory|GiB|GB|MiB|bytes")), defect=3,
    memory_mb=3072, note="RLIMIT_AS guard: ends as MemoryError while unfixed")


# ---------------------------------------------------------------------------
# Defect 4: float16
# ---------------------------------------------------------------------------


def _memory_data(dtype):
    from sklearn_linattn.datasets import make_associative_memory

    X, y = make_associative_memory(500, 3, distribution="orthonormal", random_state=0)
    return X.astype(dtype), y


def _float16_memory(tmp):
    C = pkg().certify_identifiability
    return {name: bool(C(_memory_data(dt)[0]))
            for name, dt in (("float16", np.float16), ("float32", np.float32),
                             ("float64", np.float64))}


def _float16_memory_check(v):
    expect(not v["float64"] and not v["float32"], f"orthonormal memory certified: {v}")
    expect(not v["float16"], "orthonormal memory certified in float16 (not in float32/64)")


add("certify_float16_orthonormal_memory", "certify_identifiability", _float16_memory,
    check=_float16_memory_check, error=err(r"float16|dtype|precision"), defect=4)


def _float16_fit(tmp):
    X, y = _memory_data(np.float16)
    return LAR().fit(X, y)


add("fit_float16_orthonormal_memory", "LinearAttentionRegressor.fit", _float16_fit,
    check=lambda m: expect(not bool(m.certificate_),
                           "orthonormal memory certified when given as float16"),
    error=err(r"float16|dtype|precision"), defect=4)


def _float16_gaussian(tmp):
    V, Q = teacher(2, 1, 1, seed=2)
    X16 = (np.random.default_rng(2).normal(size=(100, 4, 2))).astype(np.float16)
    X = X16.astype(np.float64)
    y = ref_forward(X, V, Q)[:, 0]
    model = LAR().fit(X16, y)
    Xt = np.random.default_rng(3).normal(size=(20, 6, 2))
    return model, X16, y, Xt, truth(Xt, V, Q)


def _float16_gaussian_check(r):
    model, X16, y, Xt, yt = r
    p = model.predict(X16)
    expect(rel(p, y) <= 1e-6, f"training predictions off by {rel(p, y):.3g}")
    if bool(model.certificate_):
        expect(rel(model.predict(Xt), yt) <= 1e-6, "certified, but wrong on new inputs")


add("fit_float16_gaussian", "LinearAttentionRegressor.fit", _float16_gaussian,
    check=_float16_gaussian_check, error=err(r"float16|dtype|precision"), defect=4)


# ---------------------------------------------------------------------------
# Defect 5: error_bound
# ---------------------------------------------------------------------------


def _bound_far(tmp):
    X = gaussian(300, 6, 3, seed=5)
    cert = pkg().certify_identifiability(X)
    Xn = gaussian(5, 7, 3, seed=6)
    return dict(ok=bool(cert), cov=cert.covers(Xn * 1e60), b1=cert.error_bound(Xn, 1e-6),
                bc=cert.error_bound(Xn * 1e60, 1e-6))


def _bound_far_check(r):
    expect(r["ok"], "generic design not certified")
    expect(bool(np.all(r["cov"])), "covers() False on an identifiable certificate")
    expect(finite(r["b1"]), "unit-scale bound not finite")
    expect(finite(r["bc"]), f"error_bound(X_new * 1e60) = {r['bc']} while covers() is True")
    e = rel(r["bc"] / 1e180, r["b1"])
    expect(e <= 1e-8, f"error_bound(X_new * 1e60) != 1e180 error_bound(X_new): {e:.3g}")


add("error_bound_scale_1e60", "IdentifiabilityCertificate.error_bound", _bound_far,
    check=_bound_far_check, names=DEFAULT_NAMES, defect=5)


def _minimizer_pair_call(design, seed=0):
    """Two explicit epsilon-minimizers that differ the most at each test input."""
    def call(tmp):
        rng = np.random.default_rng(seed)
        n, T, d = 150, 5, 3
        if design == "nullspace":
            X = rng.normal(size=(n, T, d))
            X[:, :, 2] = 0.0
            Xn = rng.normal(size=(6, T + 2, d))
            Xn[:, :, 2] = 0.0
        elif design == "collinear":
            u = rng.normal(size=(n, 1, d))
            X = u + 1e-3 * rng.normal(size=(n, T, d))
            un = rng.normal(size=(6, 1, d))
            Xn = un + 1e-3 * rng.normal(size=(6, T + 2, d))
        else:  # mixed units
            A = np.diag([1e3, 1.0, 1e-3])
            X = rng.normal(size=(n, T, d)) @ A
            Xn = rng.normal(size=(6, T + 2, d)) @ A
        V, Q = teacher(d, 2, 1, seed)
        y = ref_forward(X, V, Q)[:, 0]
        eps = 1e-6 * float(np.mean(y**2))
        cert = LAR().fit(X, y).certificate_
        covered = cert.covers(Xn)
        bound = cert.error_bound(Xn, eps)
        H = ref_features(X)
        Hn = ref_features(Xn)
        U, s, Wt = np.linalg.svd(H, full_matrices=False)
        keep = s > s[0] * 1e-13
        diffs = []
        for h in Hn:
            # delta = Lambda^+ h scaled to excess risk eps (Lambda = H^T H / n).
            z = (Wt[keep] @ h) / s[keep] ** 2
            delta = Wt[keep].T @ z
            excess = float(np.sum((H @ delta) ** 2) / n)
            delta *= math.sqrt(eps / excess) if excess > 0 else 0.0
            excess = float(np.sum((H @ delta) ** 2) / n)
            diffs.append((2 * abs(float(h @ delta)), excess))
        return dict(covered=covered, bound=bound, diffs=diffs, eps=eps)
    return call


def _minimizer_pair_check(r):
    for i, (cov, b, (diff, excess)) in enumerate(zip(r["covered"], r["bound"], r["diffs"])):
        expect(excess <= r["eps"] * (1 + 1e-9), "harness: pair exceeds epsilon")
        if cov:
            expect(np.isfinite(b), f"input {i} covered but error_bound is {b}")
            expect(diff <= b * (1 + 1e-6),
                   f"input {i} covered: two eps-minimizers differ by {diff:.6g} > "
                   f"error_bound {b:.6g}")
        else:
            expect(b == np.inf, f"input {i} not covered but error_bound is {b}")


for _design in ("nullspace", "collinear", "mixed_units"):
    add(f"error_bound_eps_minimizers_{_design}", "IdentifiabilityCertificate.error_bound",
        _minimizer_pair_call(_design), check=_minimizer_pair_check, names=DEFAULT_NAMES,
        defect=5)


def _bound_nullspace_exact(tmp):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(150, 5, 3))
    X[:, :, 2] = 0.0
    cert = pkg().certify_identifiability(X)
    Xn = rng.normal(size=(4, 6, 3))
    Xn[:2, :, 2] = 0.0
    return cert.covers(Xn), cert.error_bound(Xn, 1e-4), cert.error_bound(Xn, 0.0)


def _bound_nullspace_exact_check(r):
    cov, b, b0 = r
    expect(list(cov) == [True, True, False, False], f"covers {cov}")
    expect(finite(b[:2]) and bool(np.all(b[:2] > 0)), f"covered bounds {b[:2]}")
    expect(bool(np.all(np.isinf(b[2:]))), f"uncovered bounds {b[2:]}")
    expect(bool(np.all(b0[:2] == 0)), f"epsilon=0 bounds on covered inputs {b0[:2]}")


add("error_bound_nullspace_covered_and_not", "IdentifiabilityCertificate.error_bound",
    _bound_nullspace_exact, check=_bound_nullspace_exact_check, names=DEFAULT_NAMES)


# ---------------------------------------------------------------------------
# Defect 6: head compression
# ---------------------------------------------------------------------------


def _compress_call(seed):
    def call(tmp):
        rng = np.random.default_rng(seed)
        V, Q = rng.normal(size=(3, 1, 4)), rng.normal(size=(3, 4, 4))
        coef = pkg().attention_coefficients(V, Q)
        V2, Q2, res = pkg().compress_heads(coef, 4, 3, random_state=0)
        return V, Q, V2, Q2, res
    return call


def _compress_check(r):
    V, Q, V2, Q2, res = r
    expect(V2.shape == (3, 1, 4) and Q2.shape == (3, 4, 4), f"shapes {V2.shape}, {Q2.shape}")
    X = np.random.default_rng(99).normal(size=(30, 7, 4))
    e = rel(ref_forward(X, V2, Q2), ref_forward(X, V, Q))
    expect(e <= 1e-9, f"3 heads of an exact 3-head generator: output error {e:.3g} "
                      f"(residual {res:.3g})")


for _seed in (0, 1, 4, 8):
    add(f"compress_heads_exact_3head_seed{_seed}", "compress_heads", _compress_call(_seed),
        check=_compress_check, names=DEFAULT_NAMES, defect=6)


def _compress_model(tmp):
    from sklearn_linattn.datasets import make_random_mhla

    X, y, p = make_random_mhla(n_samples=400, n_tokens=10, d=4, n_heads=3, random_state=8,
                               return_params=True)
    model = LAR(n_heads=3, random_state=0).fit(X, y)
    Xo = np.random.default_rng(5).normal(size=(100, 30, 4)) / np.sqrt(10)
    return model, Xo, truth(Xo, p["V"], p["Q"])


def _compress_model_check(r):
    model, Xo, yo = r
    e = rel(model.predict(Xo), yo)
    expect(e <= 1e-8, f"n_heads=3 model of a 3-head generator: OOD error {e:.3g} with "
                      f"certificate_ {bool(model.certificate_)}")


add("fit_n_heads3_make_random_mhla_seed8", "LinearAttentionRegressor.fit", _compress_model,
    check=_compress_model_check, names=DEFAULT_NAMES, defect=6)


# ---------------------------------------------------------------------------
# Defect 7: scorers for readout="all" on variable-length data
# ---------------------------------------------------------------------------


def _all_data(seed=0):
    X, y, V, Q, Xt = realizable(150, 6, 2, n_heads=1, seed=seed, readout="all",
                                variable=True)
    return X, y


def _scorer_r2(tmp):
    from sklearn_linattn.metrics import sequence_scorer

    X, y = _all_data()
    model = LAR(readout="all", alpha=1e-3).fit(X, y)
    return sequence_scorer("r2")(model, X, y), model.score(X, y)


add("sequence_scorer_r2_equals_score", "metrics.sequence_scorer", _scorer_r2,
    check=lambda r: expect(np.isfinite(r[0]) and abs(r[0] - r[1]) <= 1e-12,
                           f"scorer {r[0]} vs model.score {r[1]}"),
    names=DEFAULT_NAMES, defect=7)


def _scorer_grid(tmp):
    from sklearn.model_selection import GridSearchCV
    from sklearn_linattn.metrics import sequence_scorer

    X, y = _all_data(1)
    grid = GridSearchCV(LAR(readout="all"), {"alpha": [1e3, 0.0]},
                        scoring=sequence_scorer("neg_mean_squared_error"), cv=3)
    grid.fit(X, y)
    return grid.best_params_, grid.cv_results_["mean_test_score"]


add("sequence_scorer_gridsearch_picks_best", "metrics.sequence_scorer", _scorer_grid,
    check=lambda r: expect(r[0] == {"alpha": 0.0} and finite(r[1]),
                           f"best {r[0]}, scores {r[1]}"),
    names=DEFAULT_NAMES, defect=7)


def _scorer_cv(tmp):
    from sklearn.model_selection import cross_val_score
    from sklearn_linattn.metrics import sequence_scorer

    X, y = _all_data(2)
    return cross_val_score(LAR(readout="all"), X, y, scoring=sequence_scorer("r2"), cv=3)


add("sequence_scorer_cross_val_score", "metrics.sequence_scorer", _scorer_cv,
    check=lambda s: expect(finite(s) and bool(np.all(s > 1 - 1e-8)), f"scores {s}"),
    names=DEFAULT_NAMES, defect=7)


def _scorer_bogus(tmp):
    from sklearn_linattn.metrics import sequence_scorer

    return sequence_scorer("bogus_metric")


add("sequence_scorer_unknown_name", "metrics.sequence_scorer", _scorer_bogus,
    error=err(r"bogus_metric|\bname\b|scor"), defect=7)


# ---------------------------------------------------------------------------
# Defect 8: channels_first layout
# ---------------------------------------------------------------------------


def _channels_first_fit(tmp):
    X, y, V, Q, Xt = realizable(200, 6, 3, seed=0)
    first = LAR(data_format="channels_first").fit(X.transpose(0, 2, 1), y)
    last = LAR().fit(X, y)
    return first, last, Xt


def _channels_first_check(r):
    first, last, Xt = r
    expect(first.n_features_in_ == 3, f"n_features_in_ {first.n_features_in_}, expected d = 3")
    e = rel(first.predict(Xt.transpose(0, 2, 1)), last.predict(Xt))
    expect(e <= 1e-10, f"channels_first predictions differ by {e:.3g}")


add("fit_data_format_channels_first", "LinearAttentionRegressor.fit", _channels_first_fit,
    check=_channels_first_check, names=DEFAULT_NAMES, defect=8)


def _channels_first_padded(tmp):
    X, y, V, Q, Xt = realizable(200, 6, 2, n_heads=1, seed=1, variable=True)
    first = LAR(data_format="channels_first").fit(X.transpose(0, 2, 1), y)
    return first.predict(X.transpose(0, 2, 1)), y


add("fit_data_format_channels_first_padded", "LinearAttentionRegressor.fit",
    _channels_first_padded, check=lambda r: expect(rel(*r) <= 1e-8, f"error {rel(*r):.3g}"),
    names=DEFAULT_NAMES, defect=8)


def _channels_first_certify(tmp):
    X = gaussian(100, 6, 3, seed=2)
    X[:, :, 1] = 0
    C = pkg().certify_identifiability
    a = C(X.transpose(0, 2, 1), data_format="channels_first")
    b = C(X)
    return (bool(a), a.rank, a.n_features_in), (bool(b), b.rank, b.n_features_in)


add("certify_data_format_channels_first", "certify_identifiability", _channels_first_certify,
    check=lambda r: expect(r[0] == r[1], f"channels_first {r[0]} vs channels_last {r[1]}"),
    names=DEFAULT_NAMES, defect=8)


def _channels_first_features(tmp):
    X = gaussian(10, 5, 3, seed=3)
    F = pkg().LinearAttentionFeatures
    return F(data_format="channels_first").fit_transform(X.transpose(0, 2, 1)), ref_features(X)


add("features_data_format_channels_first", "LinearAttentionFeatures", _channels_first_features,
    check=lambda r: expect(rel(*r) <= 1e-12, f"error {rel(*r):.3g}"),
    names=DEFAULT_NAMES, defect=8)


def _channels_first_adam(tmp):
    X, y, V, Q, Xt = realizable(64, 5, 2, n_heads=1, seed=4)
    model = pkg().AdamLinearAttentionRegressor(data_format="channels_first", max_epochs=2,
                                               random_state=0)
    model.fit(X.transpose(0, 2, 1), y)
    return model


add("adam_data_format_channels_first", "AdamLinearAttentionRegressor", _channels_first_adam,
    check=lambda m: expect(m.n_features_in_ == 2 and m.value_matrices_.shape == (1, 1, 2),
                           f"n_features_in_ {m.n_features_in_}"),
    names=DEFAULT_NAMES, defect=8)


add("fit_data_format_bogus", "LinearAttentionRegressor(params)",
    lambda tmp: LAR(data_format="bogus").fit(*realizable(50, 4, 2)[:2]),
    error=err(both(r"data_format", r"channels_last|channels_first|bogus"), (ValueError,)),
    defect=8)
add("params_data_format_default", "LinearAttentionRegressor(params)",
    lambda tmp: LAR().get_params(),
    check=lambda p: expect(p.get("data_format") == "channels_last",
                           f"data_format default {p.get('data_format')!r}"),
    names=DEFAULT_NAMES, defect=8)


# ---------------------------------------------------------------------------
# Defect 9: load_model on corrupt, inconsistent and huge files
# ---------------------------------------------------------------------------


def _saved_model(tmp, **fit_kw):
    X, y, V, Q, Xt = realizable(120, 5, 3, n_heads=2, seed=0)
    model = LAR(**fit_kw).fit(X, y)
    path = Path(tmp) / "model.npz"
    pkg().save_model(model, path)
    return model, path, X, y, Xt


def _npy_bytes(a):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(a), allow_pickle=True)
    return buf.getvalue()


def _rewrite(src, dst, changes=(), extra=()):
    """Copy an .npz, replacing members (name -> array, or None to drop) and appending raw ones."""
    changes = dict(changes)
    with zipfile.ZipFile(src) as zin:
        members = [(i.filename, zin.read(i.filename)) for i in zin.infolist()]
    with np.load(src) as saved:
        changes = {k: (v(saved[k]) if callable(v) else v) for k, v in changes.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
            for name, data in members:
                key = name[:-4] if name.endswith(".npy") else name
                if key in changes:
                    if changes[key] is None:
                        continue
                    data = _npy_bytes(changes[key])
                zout.writestr(name, data)
            for name, data in extra:
                zout.writestr(name, data)


def _params_json(**override):
    params = LAR().get_params()
    params.update(override)
    return np.str_(json.dumps(params))


def _load_modified(changes=(), extra=(), fit_kw=None):
    def call(tmp):
        model, path, X, y, Xt = _saved_model(tmp, **(fit_kw or {}))
        bad = Path(tmp) / "broken.npz"
        _rewrite(path, bad, changes, extra)
        loaded = pkg().load_model(bad)
        return loaded, model, Xt
    return call


def _file_and(key):
    return err(both(r"broken\.npz", key), (ValueError,))


_LOAD_BAD = {
    "coef_wrong_shape": ({"coef_": np.zeros((1, 5))}, r"coef_"),
    "coef_3d": ({"coef_": np.zeros((1, 18, 1))}, r"coef_"),
    "coef_complex": ({"coef_": np.zeros((1, 18), dtype=complex)}, r"coef_"),
    "value_matrices_nan": ({"value_matrices_": lambda a: np.full_like(a, np.nan)},
                           r"value_matrices_"),
    "key_query_inf": ({"key_query_matrices_": lambda a: np.full_like(a, np.inf)},
                      r"key_query_matrices_"),
    "zero_heads_inconsistent_coef": ({"value_matrices_": np.zeros_like,
                                      "key_query_matrices_": np.zeros_like},
                                     r"coef_|value_matrices_|key_query_matrices_|heads"),
    "heads_disagree_with_coef": ({"value_matrices_": lambda a: -a},
                                 r"coef_|value_matrices_|key_query_matrices_|heads"),
    "no_heads_n_heads_0": ({"value_matrices_": np.zeros((0, 1, 3)),
                            "key_query_matrices_": np.zeros((0, 3, 3)),
                            "n_heads_": np.int64(0)}, r"n_heads_|heads"),
    "params_readout_bogus": ({"params": _params_json(readout="bogus")}, r"readout"),
    "params_alpha_negative": ({"params": _params_json(alpha=-5)}, r"alpha"),
    "params_random_state_string": ({"params": _params_json(random_state="abc")},
                                   r"random_state"),
    "params_not_json": ({"params": np.str_("{not json")}, r"params"),
    "params_json_list": ({"params": np.str_("[1, 2]")}, r"params"),
    "params_unknown_key": ({"params": _params_json(bogus_param=1)}, r"bogus_param|params"),
    "n_features_in_huge": ({"n_features_in_": np.int64(10**9)}, r"n_features_in_|\bd\b"),
    "n_heads_float": ({"n_heads_": np.float64(1.5)}, r"n_heads_"),
    "n_outputs_negative": ({"n_outputs_": np.int64(-1)}, r"n_outputs_|d_out"),
    # Whichever name the file format gives the flag.
    "single_output_missing": ({"single_output": None, "_single_output": None},
                              r"single_output"),
    "format_version_99": ({"format_version": np.int64(99)}, r"version"),
    "missing_key_query": ({"key_query_matrices_": None}, r"key_query_matrices_"),
    "object_member": ({"coef_": np.array([None, 1], dtype=object)}, r"coef_"),
}
for _name, (_changes, _key) in _LOAD_BAD.items():
    add(f"load_model_{_name}", "load_model", _load_modified(_changes),
        error=_file_and(_key), defect=9)


def _duplicate_members(tmp):
    model, path, X, y, Xt = _saved_model(tmp)
    bad = Path(tmp) / "broken.npz"
    _rewrite(path, bad, extra=[("coef_.npy", _npy_bytes(np.zeros((1, 18))))])
    return pkg().load_model(bad)


add("load_model_duplicate_members", "load_model", _duplicate_members,
    error=_file_and(r"coef_|duplicate"), defect=9)


def _deflate_bomb(tmp):
    """A member that inflates to 512 MiB (its header is honest: shape (1, 2**26))."""
    model, path, X, y, Xt = _saved_model(tmp)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (1, 2**26)})
    bad = Path(tmp) / "broken.npz"
    _rewrite(path, bad, changes={"coef_": None})
    chunk = bytes(2**24)
    with zipfile.ZipFile(bad, "a", zipfile.ZIP_DEFLATED) as z:
        with z.open("coef_.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            for _ in range(2**29 // len(chunk)):
                f.write(chunk)
    return pkg().load_model(bad)


add("load_model_deflate_bomb", "load_model", _deflate_bomb,
    error=_file_and(r"coef_|size|large|bytes"), defect=9, memory_mb=384,
    note="a 512 MiB member under a 384 MiB address-space guard")


def _huge_header(tmp):
    model, path, X, y, Xt = _saved_model(tmp)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**6)})
    bad = Path(tmp) / "broken.npz"
    _rewrite(path, bad, changes={"coef_": None},
             extra=[("coef_.npy", header.getvalue() + bytes(64))])
    return pkg().load_model(bad)


add("load_model_huge_header", "load_model", _huge_header,
    error=_file_and(r"coef_|size|large|shape"), defect=9)


def _load_raw(content):
    def call(tmp):
        bad = Path(tmp) / "broken.npz"
        if callable(content):
            content(tmp, bad)
        else:
            bad.write_bytes(content)
        return pkg().load_model(bad)
    return call


def _npy_file(tmp, bad):
    with open(bad, "wb") as f:
        np.save(f, np.zeros(3))


def _truncated(tmp, bad):
    model, path, X, y, Xt = _saved_model(tmp)
    data = path.read_bytes()
    bad.write_bytes(data[: len(data) // 2])


def _text_npz(tmp, bad):
    bad.write_text("this is not an npz file\n")


_NO_PICKLE_ADVICE = r"^(?!.*allow_pickle)"
for _name, _content in (("npy_file", _npy_file), ("random_bytes", os.urandom(4096)),
                        ("empty_file", b""), ("truncated_zip", _truncated),
                        ("text_file", _text_npz)):
    add(f"load_model_{_name}", "load_model", _load_raw(_content),
        error=err(_NO_PICKLE_ADVICE + r"(?=.*broken\.npz)", (ValueError,)), defect=9,
        note="names the file; no advice to allow pickles (files are never trusted)")


def _load_pickle_npz(tmp, bad):
    np.savez(bad, X=np.array([{"a": 1}], dtype=object))


add("load_model_pickled_object_npz", "load_model", _load_raw(_load_pickle_npz),
    error=err(r"broken\.npz", (ValueError,)), defect=9)

add("load_model_missing_file", "load_model",
    lambda tmp: pkg().load_model(Path(tmp) / "nothing_here.npz"),
    error=err(r"nothing_here", (FileNotFoundError, ValueError)))
add("load_model_directory", "load_model", lambda tmp: pkg().load_model(tmp),
    error=err(re.escape(os.path.basename(tempfile.gettempdir())) + r"|adv-|director",
              (ValueError, IsADirectoryError)))


def _roundtrip(tmp):
    model, path, X, y, Xt = _saved_model(tmp, n_heads=2, random_state=0)
    loaded = pkg().load_model(path)
    return loaded.predict(Xt), model.predict(Xt), loaded.get_params(), model.get_params()


add("load_model_roundtrip", "load_model", _roundtrip,
    check=lambda r: expect(rel(r[0], r[1]) <= 1e-14 and r[2] == r[3], "round trip differs"),
    names=DEFAULT_NAMES)


def _load_partial_fit(tmp):
    model, path, X, y, Xt = _saved_model(tmp)
    loaded = pkg().load_model(path)
    X2, y2 = realizable(120, 5, 3, n_heads=2, seed=0)[:2]
    loaded.partial_fit(X2[:60], y2[:60])
    return loaded, X2[:60], y2[:60]


add("load_model_then_partial_fit", "LinearAttentionRegressor.partial_fit", _load_partial_fit,
    check=lambda r: expect(finite(r[0].coef_) and rel(r[0].predict(r[1]), r[2]) <= 1e-8,
                           "partial_fit after load_model gives a wrong model"),
    error=err(r"partial_fit|statistic", (ValueError,)), defect=9)

add("save_model_unfitted", "save_model",
    lambda tmp: pkg().save_model(LAR(), Path(tmp) / "m.npz"),
    error=err(r"fit", (ValueError, TypeError)))
add("save_model_wrong_type", "save_model",
    lambda tmp: pkg().save_model(pkg().AdamLinearAttentionRegressor(), Path(tmp) / "m.npz"),
    error=err(r"\bmodel\b"))


def _save_missing_dir(tmp):
    model, path, X, y, Xt = _saved_model(tmp)
    pkg().save_model(model, Path(tmp) / "no_such_dir" / "m.npz")


add("save_model_missing_directory", "save_model", _save_missing_dir,
    error=err(r"no_such_dir", (ValueError, OSError)))


# ---------------------------------------------------------------------------
# Defect 10 and more: the command line
# ---------------------------------------------------------------------------


def _package_root():
    return str(Path(pkg().__file__).resolve().parent.parent)


def cli_raw(args, tmp, timeout=None, env=None):
    """``python -m sklearn_linattn ARGS`` in ``tmp``; Hang when killed at ``timeout`` s.

    The default timeout is the case's own safety net (``HANG_SECONDS``): a
    command that a loaded machine makes slow is not a hang.
    """
    timeout = HANG_SECONDS if timeout is None else timeout
    environ = dict(os.environ)
    environ["PYTHONPATH"] = _package_root() + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(env or {})
    try:
        # ``python -m sklearn_linattn`` under the import guard.
        code = (_IMPORT_GUARD + "\nimport runpy\n"
                "runpy.run_module('sklearn_linattn', run_name='__main__', alter_sys=True)\n")
        p = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                           capture_output=True, text=True, timeout=timeout, cwd=tmp,
                           env=environ)
    except subprocess.TimeoutExpired:
        raise Hang(f"python -m sklearn_linattn {' '.join(map(str, args))} ran past "
                   f"{timeout} s") from None
    return p


def cli(args, tmp, timeout=None):
    p = cli_raw(args, tmp, timeout)
    if "Traceback (most recent call last)" in p.stderr:
        raise CliTraceback(p.stderr.strip().splitlines()[-1][:500])
    if p.returncode != 0:
        raise CliError(p.returncode, p.stderr)
    return p


def _data_file(tmp, name="data.npz", readout="last", variable=False, mutate=None, d=3):
    X, y, V, Q, Xt = realizable(150, 6, d, n_heads=2, seed=0, readout=readout,
                                variable=variable)
    if mutate is not None:
        X, y = mutate(X, y)
    path = Path(tmp) / name
    np.savez(path, X=X, y=y)
    return path, X, y


def _cli_case(args_of, *, setup=None, timeout=None):
    def call(tmp):
        extra = setup(tmp) if setup else None
        return cli(args_of(tmp, extra), tmp, timeout=timeout), extra
    return call


def _no_dir(tmp):
    _data_file(tmp)
    return None


add("cli_fit_output_missing_directory", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "-o", "no_such_dir/m.npz", "-q"], setup=_no_dir),
    error=err(r"exit [12]\b.*no_such_dir", (CliError,)), defect=10)
add("cli_demo_d300", "cli", _cli_case(lambda t, e: ["demo", "--d", "300"]),
    error=err(r"exit [12]\b.*(--d|\bd\b)", (CliError,)), defect=10, memory_mb=4096,
    note="psi = 13.5 million: a refusal naming --d, not a MemoryError traceback")


def _predict_json(tmp):
    path, X, y = _data_file(tmp, readout="all", variable=True)
    cli(["fit", "data.npz", "-o", "m.npz", "--readout", "all", "-q"], tmp)
    p = cli(["predict", "m.npz", "data.npz", "--json"], tmp)
    return p.stdout, y


def _predict_json_check(r):
    stdout, y = r

    def refuse(name):
        raise Wrong(f"predict --json printed {name}, which is not JSON")
    try:
        out = json.loads(stdout, parse_constant=refuse)
    except ValueError as exc:
        raise Wrong(f"predict --json printed invalid JSON: {exc}") from None
    pred = np.array([[np.nan if v is None else v for v in row] for row in out["predictions"]])
    expect(pred.shape == y.shape, f"shape {pred.shape}")
    expect(bool(np.all(np.isnan(pred) == np.isnan(y))), "padding not null")
    expect(rel(np.nan_to_num(pred), np.nan_to_num(y)) <= 1e-8, "predictions wrong")


add("cli_predict_json_with_padding_is_valid_json", "cli", _predict_json,
    check=_predict_json_check, names=r"JSON|json", defect=10)


def _check_codes(tmp):
    X = gaussian(10, 4, 3)  # 10 < psi = 18: not identifiable
    np.savez(Path(tmp) / "few.npz", X=X)
    a = cli_raw(["certify", "few.npz", "--check"], tmp)
    b = cli_raw(["certify", "missing.npz", "--check"], tmp)
    c = cli_raw(["certify", "few.npz"], tmp)
    return a, b, c


def _check_codes_check(r):
    a, b, c = r
    for p in r:
        expect("Traceback" not in p.stderr, "traceback on stderr")
    expect(c.returncode == 0, f"certify without --check exit {c.returncode}")
    expect(a.returncode not in (0, b.returncode),
           f"--check: exit {a.returncode} for 'not identifiable' and {b.returncode} for an "
           "error (need distinct non-zero codes)")


add("cli_certify_check_distinct_exit_codes", "cli", _check_codes, check=_check_codes_check,
    names=DEFAULT_NAMES, defect=10)


def _saved_verbose(tmp):
    _data_file(tmp)
    cli(["fit", "data.npz", "-o", "m.npz"], tmp)
    return pkg().load_model(Path(tmp) / "m.npz").get_params()["verbose"]


add("cli_fit_saved_model_not_verbose", "cli", _saved_verbose,
    check=lambda v: expect(v == 0, f"model saved by the CLI has verbose={v}"),
    names=DEFAULT_NAMES, defect=10)


def _text_as_npz(tmp):
    (Path(tmp) / "data.npz").write_text("X,y\n1,2\n")
    return None


add("cli_fit_non_zip_npz_no_pickle_advice", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "-q"], setup=_text_as_npz),
    error=err(r"^(?!.*allow_pickle)(?=.*exit 1\b)(?=.*data\.npz)", (CliError,)), defect=10)
add("cli_version", "cli", _cli_case(lambda t, e: ["--version"]),
    check=lambda r: expect(pkg().__version__ in r[0].stdout + r[0].stderr,
                           f"--version printed {r[0].stdout!r}"),
    names=r"version", defect=10)


def _svd_1e300(tmp):
    def mutate(X, y):
        X[0, 0, 0] = 1e300
        return X, y
    _data_file(tmp, mutate=mutate)
    return None


def _svd_1e300_model(r):
    model = pkg().load_model(Path(r[1]) / "m.npz")
    expect(finite(model.coef_), "the CLI wrote a model with NaN/inf coefficients")


add("cli_fit_svd_entry_1e300", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "--solver", "svd", "-q", "-o", "m.npz"],
              setup=lambda t: (_svd_1e300(t), t)[1]),
    check=_svd_1e300_model, error=err(r"exit 1\b.*\bX\b", (CliError,)), defect=3)
add("cli_certify_entry_1e300", "cli",
    _cli_case(lambda t, e: ["certify", "data.npz", "--json"], setup=_svd_1e300),
    check=lambda r: expect("NaN" not in r[0].stdout, "certify --json printed NaN"),
    error=err(r"exit 1\b.*\bX\b", (CliError,)), defect=3)


def _hole(X, y):
    X[3, 2] = np.nan
    return X, y


add("cli_fit_nan_hole", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "-q"], setup=lambda t: _data_file(t, mutate=_hole)),
    error=err(r"exit 1\b.*\bX\b", (CliError,)))
add("cli_fit_alpha_negative", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "--alpha", "-1", "-q"], setup=_no_dir),
    error=err(r"exit [12]\b.*alpha", (CliError,)))
add("cli_fit_alpha_nan", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "--alpha", "nan", "-q"], setup=_no_dir),
    error=err(r"exit [12]\b.*alpha", (CliError,)))
add("cli_missing_data_file", "cli", _cli_case(lambda t, e: ["certify", "nope.npz"]),
    error=err(r"exit 1\b.*nope\.npz", (CliError,)))
add("cli_demo_min_len_above_max_len", "cli",
    _cli_case(lambda t, e: ["demo", "--min-len", "9", "--max-len", "3"]),
    error=err(r"exit 2\b.*min-len", (CliError,)))
add("cli_demo_heads_zero", "cli", _cli_case(lambda t, e: ["demo", "--heads", "0"]),
    error=err(r"exit 2\b.*heads", (CliError,)))
add("cli_no_command", "cli", _cli_case(lambda t, e: []),
    error=err(r"exit 2\b.*(usage|command)", (CliError,)))


def _wrong_d(tmp):
    _data_file(tmp)
    cli(["fit", "data.npz", "-o", "m.npz", "-q"], tmp)
    np.savez(Path(tmp) / "new.npz", X=gaussian(5, 4, 2))
    return None


add("cli_predict_wrong_d", "cli",
    _cli_case(lambda t, e: ["predict", "m.npz", "new.npz"], setup=_wrong_d),
    error=err(r"exit 1\b.*(\bX\b|\bd\b|d=)", (CliError,)))


def _corrupt_model(tmp):
    _data_file(tmp)
    (Path(tmp) / "m.npz").write_bytes(os.urandom(300))
    return None


add("cli_predict_corrupt_model", "cli",
    _cli_case(lambda t, e: ["predict", "m.npz", "data.npz"], setup=_corrupt_model),
    error=err(r"^(?!.*allow_pickle)(?=.*exit 1\b.*m\.npz)", (CliError,)), defect=10)


def _y_missing(tmp):
    np.savez(Path(tmp) / "data.npz", X=gaussian(30, 4, 2))
    return None


add("cli_fit_without_y", "cli", _cli_case(lambda t, e: ["fit", "data.npz", "-q"], setup=_y_missing),
    error=err(r"exit 1\b.*\by\b", (CliError,)))


def _cli_roundtrip(tmp):
    path, X, y = _data_file(tmp)
    cli(["fit", "data.npz", "-o", "m.npz", "-q", "--n-heads", "2", "--random-state", "0"], tmp)
    cli(["predict", "m.npz", "data.npz", "-o", "pred.npy"], tmp)
    c = cli(["certify", "data.npz", "--json"], tmp)
    return np.load(Path(tmp) / "pred.npy"), y, json.loads(c.stdout)


add("cli_fit_predict_certify_roundtrip", "cli", _cli_roundtrip,
    check=lambda r: expect(rel(r[0], r[1]) <= 1e-8 and r[2]["identifiable"] is True,
                           f"roundtrip error {rel(r[0], r[1]):.3g}, {r[2]}"),
    names=DEFAULT_NAMES)


def _object_npz(tmp):
    np.savez(Path(tmp) / "data.npz", X=np.array([np.zeros((3, 2)), np.zeros((2, 2))],
                                               dtype=object), y=np.zeros(2))
    return None


add("cli_fit_object_array_in_npz", "cli",
    _cli_case(lambda t, e: ["fit", "data.npz", "-q"], setup=_object_npz),
    error=err(r"exit 1\b.*(data\.npz|\bX\b)", (CliError,)))


# ---------------------------------------------------------------------------
# Defect 11 and general validation of LinearAttentionRegressor
# ---------------------------------------------------------------------------


def _small():
    return realizable(80, 5, 2, n_heads=1, seed=0)


_SAME = object()  # "keep the default argument" (None is an input under test)


def _fit_with(X=_SAME, y=_SAME, sample_weight=None, **params):
    def call(tmp):
        X0, y0 = _small()[:2]
        Xa = X0 if X is _SAME else (X(X0) if callable(X) else X)
        ya = y0 if y is _SAME else (y(y0) if callable(y) else y)
        w = sample_weight(len(y0)) if callable(sample_weight) else sample_weight
        return LAR(**params).fit(Xa, ya, sample_weight=w)
    return call


def _setv(index, value):
    def f(a):
        a = np.array(a, dtype=np.float64)
        a[index] = value
        return a
    return f


def _sparse(a):
    import scipy.sparse

    return scipy.sparse.csr_matrix(a)


_X_BAD = {
    "none": (None, r"\bX\b"),
    "empty_list": ([], r"\bX\b"),
    "zero_samples": (np.empty((0, 5, 2)), r"\bX\b"),
    "zero_tokens": (np.empty((80, 0, 2)), r"\bX\b"),
    "zero_dim": (np.empty((80, 5, 0)), r"\bX\b"),
    "1d": (np.ones(80), r"\bX\b"),
    "4d": (np.ones((80, 5, 2, 1)), r"\bX\b"),
    "complex": (lambda X: X.astype(complex) + 1j, r"\bX\b"),
    "strings": (lambda X: X.astype(str), r"\bX\b"),
    "object_none": (np.full((80, 5, 2), None, dtype=object), r"\bX\b"),
    "nan_hole": (_setv((3, 1), np.nan), r"\bX\b"),
    "partly_nan_token": (_setv((3, 1, 0), np.nan), r"\bX\b"),
    "inf_entry": (_setv((3, 1, 0), np.inf), r"\bX\b"),
    "neg_inf_entry": (_setv((0, 4, 1), -np.inf), r"\bX\b"),
    "all_nan_sequence": (_setv((5,), np.nan), r"\bX\b"),
    "list_mismatched_d": (lambda X: [X[0], X[1][:, :1]] + list(X[2:]), r"\bX\b|\bd\b"),
    "ragged_nested_list": (lambda X: [[[1.0, 2.0], [3.0]]] + [x.tolist() for x in X[1:]],
                           r"\bX\b"),
    "sparse_matrix": (lambda X: _sparse(X[:, :, 0]), r"\bX\b|[Ss]parse"),
}
for _name, (_X, _pat) in _X_BAD.items():
    add(f"fit_X_{_name}", "LinearAttentionRegressor.fit", _fit_with(X=_X), error=err(_pat))

_Y_BAD = {
    "nan": (_setv(4, np.nan), r"\by\b"),
    "inf": (_setv(4, np.inf), r"\by\b"),
    "wrong_length": (lambda y: y[:-1], r"\by\b"),
    "3d": (lambda y: np.ones((80, 5, 1)), r"\by\b|readout"),
    "strings": (lambda y: y.astype(str), r"\by\b"),
    "complex": (lambda y: y + 1j, r"\by\b"),
    "none": (None, r"\by\b"),
}
for _name, (_y, _pat) in _Y_BAD.items():
    add(f"fit_y_{_name}", "LinearAttentionRegressor.fit", _fit_with(y=_y), error=err(_pat))

_W_BAD = {
    "negative": lambda n: np.r_[-1.0, np.ones(n - 1)],
    "nan": lambda n: np.r_[np.nan, np.ones(n - 1)],
    "inf": lambda n: np.r_[np.inf, np.ones(n - 1)],
    "wrong_length": lambda n: np.ones(n + 1),
    "strings": lambda n: np.array(["1"] * n),
    "complex": lambda n: np.ones(n) + 1j,
    "all_zero": lambda n: np.zeros(n),
    "2d": lambda n: np.ones((n, 1)),
}
for _name, _w in _W_BAD.items():
    add(f"fit_sample_weight_{_name}", "LinearAttentionRegressor.fit",
        _fit_with(sample_weight=_w), error=err(r"sample.weight"))

_PARAMS_BAD = {
    "alpha_negative": ({"alpha": -1.0}, r"alpha"),
    "alpha_nan": ({"alpha": float("nan")}, r"alpha"),
    "alpha_string": ({"alpha": "1"}, r"alpha"),
    "n_heads_zero": ({"n_heads": 0}, r"n_heads"),
    "n_heads_float": ({"n_heads": 1.5}, r"n_heads"),
    "n_heads_bool": ({"n_heads": True}, r"n_heads"),
    "solver_bogus": ({"solver": "bogus"}, r"solver"),
    "solver_none": ({"solver": None}, r"solver"),
    "readout_bogus": ({"readout": "bogus"}, r"readout"),
    "readout_none": ({"readout": None}, r"readout"),
    "token_dim_zero": ({"token_dim": 0}, r"token_dim"),
    "token_dim_float": ({"token_dim": 2.5}, r"token_dim"),
    "tol_zero": ({"tol": 0.0}, r"\btol\b"),
    "max_iter_zero": ({"max_iter": 0}, r"max_iter"),
    "random_state_string": ({"random_state": "seed"}, r"random_state"),
    "random_state_negative": ({"random_state": -1}, r"random_state"),
    "random_state_float": ({"random_state": 1.5}, r"random_state"),
    "random_state_too_big": ({"random_state": 2**40}, r"random_state"),
}
for _name, (_params, _pat) in _PARAMS_BAD.items():
    add(f"params_{_name}", "LinearAttentionRegressor(params)", _fit_with(**_params),
        error=err(_pat), defect=11 if _name.startswith("random_state") else None)


def _fit_edge_single(tmp):
    X = np.array([[[2.0]]])
    y = np.array([16.0])  # V Q = 2: y = 2 * S * x_last = 2 * 4 * 2
    m = LAR().fit(X, y)
    return m, m.predict(np.array([[[1.0], [3.0]]]))


add("fit_single_sequence_single_token_d1", "LinearAttentionRegressor.fit", _fit_edge_single,
    check=lambda r: expect(bool(r[0].certificate_) and abs(r[1][0] - 60.0) <= 1e-12,
                           f"prediction {r[1]}, certificate {bool(r[0].certificate_)}"),
    names=DEFAULT_NAMES)


def _fit_zero_X(tmp):
    X = np.zeros((30, 4, 2))
    return LAR().fit(X, np.zeros(30)), X


add("fit_all_zero_X", "LinearAttentionRegressor.fit", _fit_zero_X,
    check=lambda r: expect(not bool(r[0].certificate_) and finite(r[0].coef_)
                           and np.all(r[0].coef_ == 0), "zero data: wrong model/verdict"),
    names=DEFAULT_NAMES)


def _zero_head_predict(tmp):
    m = LAR().fit(np.zeros((20, 3, 2)), np.zeros(20))
    return m.n_heads_, m.predict(gaussian(4, 5, 2)), m.predict_from_coefficients(gaussian(4, 5, 2))


add("predict_after_all_zero_fit", "LinearAttentionRegressor.predict", _zero_head_predict,
    check=lambda r: expect(finite(r[1]) and not np.any(r[1]) and not np.any(r[2]),
                           f"model of all-zero data ({r[0]} heads) predicts {r[1]}"),
    names=DEFAULT_NAMES)


def _zero_head_generate(tmp):
    m = LAR().fit(np.zeros((20, 3, 2)), np.zeros((20, 2)))
    P = gaussian(3, 4, 2)
    return m.generate(P, 2), P


add("generate_after_all_zero_fit", "LinearAttentionRegressor.generate", _zero_head_generate,
    check=lambda r: expect(r[0].shape == (3, 6, 2) and rel(r[0][:, :4], r[1]) == 0
                           and not np.any(r[0][:, 4:]), "zero model: wrong continuation"),
    names=DEFAULT_NAMES, note="a fit on all-zero data has no heads")
add("mhla_forward_zero_heads", "mhla_forward",
    lambda tmp: pkg().mhla_forward(gaussian(3, 4, 2), np.zeros((0, 1, 2)), np.zeros((0, 2, 2))),
    check=lambda y: expect(y.shape == (3, 1) and not np.any(y), f"zero heads gave {y}"),
    error=err(r"\bV\b|\bQ\b|n_heads|heads"))


def _fit_duplicates(tmp):
    X = np.repeat(gaussian(1, 5, 2), 50, axis=0)
    V, Q = teacher(2, 1, 1)
    return LAR().fit(X, ref_forward(X, V, Q)[:, 0])


add("fit_duplicate_sequences", "LinearAttentionRegressor.fit", _fit_duplicates,
    check=lambda m: expect(not bool(m.certificate_) and m.feature_rank_ == 1,
                           f"50 copies of one sequence: certificate {bool(m.certificate_)}, "
                           f"rank {m.feature_rank_}"),
    names=DEFAULT_NAMES)


def _fit_single_tokens(tmp):
    X = gaussian(200, 1, 3)
    return pkg().certify_identifiability(X)


add("certify_single_token_sequences_rank10", "certify_identifiability", _fit_single_tokens,
    check=lambda c: expect(not bool(c) and c.rank == 10,
                           f"one-token sequences: verdict {bool(c)}, rank {c.rank} (exact 10)"),
    names=DEFAULT_NAMES)


def _int_fit(dtype):
    def call(tmp):
        rng = np.random.default_rng(0)
        lo = 0 if np.dtype(dtype).kind in "ub" else -3
        hi = 2 if np.dtype(dtype).kind == "b" else 4
        Xi = rng.integers(lo, hi, size=(200, 5, 2)).astype(dtype)
        V, Q = teacher(2, 1, 1)
        X = Xi.astype(np.float64)
        y = ref_forward(X, V, Q)[:, 0]
        m = LAR().fit(Xi, y)
        rank = np.linalg.matrix_rank(ref_features(X))
        return m, Xi, y, rank
    return call


def _int_fit_check(r):
    m, Xi, y, rank = r
    expect(rel(m.predict(Xi), y) <= 1e-8, "training predictions wrong")
    expect(bool(m.certificate_) == (rank == psi(2)),
           f"verdict {bool(m.certificate_)}, reference rank {rank} of {psi(2)}")


for _dt in ("int8", "int16", "int32", "int64", "uint8", "float32"):
    add(f"fit_dtype_{_dt}", "LinearAttentionRegressor.fit", _int_fit(_dt), check=_int_fit_check,
        names=DEFAULT_NAMES)
add("fit_dtype_bool", "LinearAttentionRegressor.fit", _int_fit("bool"), check=_int_fit_check,
    error=err(r"\bX\b.*bool|bool.*\bX\b"))


def _list_of_lists(tmp):
    X, y, V, Q, Xt = realizable(60, 5, 2, n_heads=1, seed=3, variable=True)
    seqs = [x[~np.isnan(x).all(axis=1)].tolist() for x in X]
    return LAR().fit(seqs, y).predict(seqs), y


add("fit_list_of_nested_lists", "LinearAttentionRegressor.fit", _list_of_lists,
    check=lambda r: expect(rel(*r) <= 1e-8, f"error {rel(*r):.3g}"), names=DEFAULT_NAMES)


def _ragged_object(tmp):
    X, y, V, Q, Xt = realizable(60, 5, 2, n_heads=1, seed=3, variable=True)
    seqs = [x[~np.isnan(x).all(axis=1)] for x in X]
    obj = np.empty(len(seqs), dtype=object)
    obj[:] = seqs
    return LAR().fit(obj, y).predict(obj), LAR().fit(seqs, y).predict(seqs)


add("fit_ragged_object_array", "LinearAttentionRegressor.fit", _ragged_object,
    check=lambda r: expect(rel(*r) <= 1e-12, "object array fit differs from the list fit"),
    error=err(r"^(?!.*dtype=float)(?=.*\bX\b)(?=.*\blist\b)"), defect=11,
    note="accept it like the list, or refuse with advice that works for ragged data")


def _numeric_object(tmp):
    X, y = _small()[:2]
    return LAR().fit(X.astype(object), y).predict(X), LAR().fit(X, y).predict(X)


add("fit_numeric_object_array", "LinearAttentionRegressor.fit", _numeric_object,
    check=lambda r: expect(rel(*r) <= 1e-12, "object array fit differs"),
    error=err(r"\bX\b"), defect=11)


def _fitted_small(**kw):
    X, y, V, Q, Xt = _small()
    return LAR(**kw).fit(X, y), X, y


def _method(method, *args_of, **kw_of):
    def call(tmp):
        model, X, y = _fitted_small()
        args = [a(X, y) if callable(a) else a for a in args_of]
        kwargs = {k: (v(X, y) if callable(v) else v) for k, v in kw_of.items()}
        return getattr(model, method)(*args, **kwargs)
    return call


add("predict_d_mismatch", "LinearAttentionRegressor.predict",
    _method("predict", lambda X, y: gaussian(3, 5, 3)), error=err(r"\bX\b"))
add("predict_nan_hole", "LinearAttentionRegressor.predict",
    _method("predict", lambda X, y: _setv((0, 1), np.nan)(X[:3])), error=err(r"\bX\b"))
add("predict_empty_list", "LinearAttentionRegressor.predict", _method("predict", []),
    error=err(r"\bX\b"))
add("predict_not_fitted", "LinearAttentionRegressor.predict",
    lambda tmp: LAR().predict(gaussian(3, 5, 2)), error=err(r"fit"))
add("predict_flattened_2d_after_3d_fit", "LinearAttentionRegressor.predict",
    _method("predict", lambda X, y: X.reshape(len(X), -1)),
    error=err(both(r"\bX\b", r"token_dim|2-D|univariate")), defect=11,
    note="a 2-D X after a d = 2 fit: the message should say how 2-D X is read")


def _predict_huge(tmp):
    model, X, y = _fitted_small()
    return model.predict(X[:5] * 1e200), model.predict(X[:5])


def _predict_huge_check(r):
    big, unit = r
    expect(not np.any(np.isnan(big)), "NaN predictions at 1e200 (true values overflow to inf)")
    ok = np.isinf(big) | (np.sign(big) == np.sign(unit))
    expect(bool(np.all(ok)), "wrong sign")


add("predict_overflowing_inputs", "LinearAttentionRegressor.predict", _predict_huge,
    check=_predict_huge_check, error=err(r"\bX\b"))
add("score_negative_sample_weight", "LinearAttentionRegressor.score",
    _method("score", lambda X, y: X, lambda X, y: y,
            sample_weight=lambda X, y: np.r_[-1.0, np.ones(len(y) - 1)]),
    error=err(r"sample.weight"), defect=11)
add("score_nan_sample_weight", "LinearAttentionRegressor.score",
    _method("score", lambda X, y: X, lambda X, y: y,
            sample_weight=lambda X, y: np.r_[np.nan, np.ones(len(y) - 1)]),
    error=err(r"sample.weight"), defect=11)
add("score_wrong_length_sample_weight", "LinearAttentionRegressor.score",
    _method("score", lambda X, y: X, lambda X, y: y, sample_weight=lambda X, y: np.ones(3)),
    error=err(r"sample.weight"))
add("score_y_all_shape_on_last_model", "LinearAttentionRegressor.score",
    _method("score", lambda X, y: X, lambda X, y: np.ones(X.shape[:2])),
    error=err(r"\by\b"))
add("score_y_nan", "LinearAttentionRegressor.score",
    _method("score", lambda X, y: X, lambda X, y: _setv(0, np.nan)(y)), error=err(r"\by\b"))
add("score_d_mismatch", "LinearAttentionRegressor.score",
    _method("score", lambda X, y: gaussian(len(y), 5, 3), lambda X, y: y), error=err(r"\bX\b"))
add("predict_from_coefficients_d_mismatch", "LinearAttentionRegressor.predict_from_coefficients",
    _method("predict_from_coefficients", lambda X, y: gaussian(3, 5, 3)), error=err(r"\bX\b"))


def _pfc_equal(tmp):
    X, y, V, Q, Xt = realizable(150, 6, 3, n_heads=2, seed=2, variable=True)
    m = LAR(readout="last").fit(X, y)
    return m.predict_from_coefficients(Xt), m.predict(Xt), truth(Xt, V, Q)


add("predict_from_coefficients_equals_predict",
    "LinearAttentionRegressor.predict_from_coefficients",
    _pfc_equal, check=lambda r: expect(rel(r[0], r[1]) <= 1e-10 and rel(r[0], r[2]) <= 1e-8,
                                       "predict_from_coefficients differs"), names=DEFAULT_NAMES)


def _all_model():
    X, y, V, Q, Xt = realizable(80, 5, 2, n_heads=1, seed=0, readout="all", variable=True)
    return LAR(readout="all").fit(X, y), X, y


add("score_readout_all_y_last_shape", "LinearAttentionRegressor.score",
    lambda tmp: (lambda m, X, y: m.score(X, np.ones(len(X))))(*_all_model()),
    error=err(r"\by\b"))


def _score_all_correct(tmp):
    m, X, y = _all_model()
    return m.score(X, y)


add("score_readout_all_variable_length", "LinearAttentionRegressor.score", _score_all_correct,
    check=lambda s: expect(abs(s - 1) <= 1e-10, f"R^2 {s}"), names=DEFAULT_NAMES)


def _ragged_targets(tmp):
    X, y, V, Q, Xt = realizable(80, 5, 2, n_heads=1, seed=0, readout="all", variable=True)
    L = ref_lengths(X)
    ys = [y[i, : L[i]] for i in range(len(y))]
    return LAR(readout="all").fit(X, ys).predict(X), y


add("fit_readout_all_ragged_target_list", "LinearAttentionRegressor.fit", _ragged_targets,
    check=lambda r: expect(rel(np.nan_to_num(r[0]), np.nan_to_num(r[1])) <= 1e-8
                           and bool(np.all(np.isnan(r[0]) == np.isnan(r[1]))), "wrong"),
    names=DEFAULT_NAMES)
add("fit_readout_all_y_wrong_n_tokens", "LinearAttentionRegressor.fit",
    lambda tmp: LAR(readout="all").fit(gaussian(20, 5, 2), np.ones((20, 4))),
    error=err(r"\by\b"))


# partial_fit


def _pf(steps):
    def call(tmp):
        X, y, V, Q, Xt = realizable(120, 5, 2, n_heads=1, seed=0)
        m = LAR()
        return steps(m, X, y)
    return call


add("partial_fit_solver_svd", "LinearAttentionRegressor.partial_fit",
    _pf(lambda m, X, y: m.set_params(solver="svd").partial_fit(X, y)), error=err(r"solver"))
add("partial_fit_d_changes", "LinearAttentionRegressor.partial_fit",
    _pf(lambda m, X, y: m.partial_fit(X, y).partial_fit(gaussian(10, 5, 3), np.ones(10))),
    error=err(r"\bX\b|\bd\b|d="))
add("partial_fit_d_out_changes", "LinearAttentionRegressor.partial_fit",
    _pf(lambda m, X, y: m.partial_fit(X, y).partial_fit(X[:10], np.ones((10, 2)))),
    error=err(r"\by\b|d_out|output"))
add("partial_fit_readout_changes", "LinearAttentionRegressor.partial_fit",
    _pf(lambda m, X, y: m.partial_fit(X, y).set_params(readout="all").partial_fit(
        X[:10], np.ones((10, 5)))), error=err(r"readout"))
add("partial_fit_after_svd_fit", "LinearAttentionRegressor.partial_fit",
    _pf(lambda m, X, y: m.set_params(solver="svd").fit(X, y).set_params(solver="eigh")
        .partial_fit(X, y)), error=err(r"solver|partial_fit"))
add("partial_fit_nan_hole_keeps_model", "LinearAttentionRegressor.partial_fit",
    _pf(lambda m, X, y: m.partial_fit(X, y).partial_fit(_setv((0, 1), np.nan)(X[:5]), y[:5])),
    error=err(r"\bX\b"))


def _pf_equals_fit(tmp):
    X, y, V, Q, Xt = realizable(120, 5, 2, n_heads=1, seed=0)
    m = LAR()
    for b in np.array_split(np.arange(120), 4):
        m.partial_fit(X[b], y[b])
    return m.coef_, LAR().fit(X, y).coef_


add("partial_fit_batches_equal_fit", "LinearAttentionRegressor.partial_fit", _pf_equals_fit,
    check=lambda r: expect(rel(*r) <= 1e-10, f"coef differs by {rel(*r):.3g}"),
    names=DEFAULT_NAMES)


# generate


def _gen_model(d=2):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(150, 4, d)) / 2
    V, Q = teacher(d, 1, d, seed=1)
    y = ref_forward(X, V, Q)
    return LAR().fit(X, y), V, Q


def _gen(n_steps, rounding=None, d=2):
    def call(tmp):
        m, V, Q = _gen_model(d)
        return m.generate(gaussian(3, 4, d), n_steps, rounding=rounding)
    return call


add("generate_n_steps_1e15", "LinearAttentionRegressor.generate", _gen(10**15),
    error=err(r"n_steps"), defect=11)
add("generate_n_steps_negative", "LinearAttentionRegressor.generate", _gen(-1),
    error=err(r"n_steps"))
add("generate_n_steps_float", "LinearAttentionRegressor.generate", _gen(1.5),
    error=err(r"n_steps"))
add("generate_n_steps_string", "LinearAttentionRegressor.generate", _gen("3"),
    error=err(r"n_steps"))
add("generate_rounding_table_wrong_width", "LinearAttentionRegressor.generate",
    _gen(2, rounding=np.eye(3)), error=err(r"rounding"))
add("generate_rounding_table_nan", "LinearAttentionRegressor.generate",
    _gen(2, rounding=np.full((2, 2), np.nan)), error=err(r"rounding"))
add("generate_rounding_callable_bad_shape", "LinearAttentionRegressor.generate",
    _gen(2, rounding=lambda Y: Y[:, :1]), error=err(r"rounding"))
add("generate_model_d_out_not_d", "LinearAttentionRegressor.generate",
    lambda tmp: _fitted_small()[0].generate(gaussian(2, 4, 2), 2),
    error=err(r"\bd\b|d=|output"))


def _gen_correct(tmp):
    m, V, Q = _gen_model(2)
    P = gaussian(3, 4, 2, seed=9)
    out = m.generate(P, 3)
    seq = P.copy()
    for _ in range(3):
        seq = np.concatenate([seq, ref_forward(seq, V, Q)[:, None, :]], axis=1)
    return out, seq


add("generate_matches_reference_loop", "LinearAttentionRegressor.generate", _gen_correct,
    check=lambda r: expect(r[0].shape == r[1].shape and rel(r[0], r[1]) <= 1e-8,
                           "generated tokens differ"), names=DEFAULT_NAMES)


# LinearAttentionFeatures


def _features_correct(tmp):
    X, y, V, Q, Xt = realizable(30, 5, 3, seed=1, variable=True)
    F = pkg().LinearAttentionFeatures().fit(X)
    return F.transform(Xt), ref_features(Xt), F.get_feature_names_out()


add("features_transform_matches_reference", "LinearAttentionFeatures", _features_correct,
    check=lambda r: expect(rel(r[0], r[1]) <= 1e-13 and len(r[2]) == 18, "features differ"),
    names=DEFAULT_NAMES)
add("features_transform_d_mismatch", "LinearAttentionFeatures",
    lambda tmp: pkg().LinearAttentionFeatures().fit(gaussian(3, 4, 2)).transform(
        gaussian(3, 4, 3)), error=err(r"\bX\b"))
add("features_transform_not_fitted", "LinearAttentionFeatures",
    lambda tmp: pkg().LinearAttentionFeatures().transform(gaussian(3, 4, 2)), error=err(r"fit"))
add("features_names_wrong_length", "LinearAttentionFeatures",
    lambda tmp: pkg().LinearAttentionFeatures().fit(gaussian(3, 4, 2)).get_feature_names_out(
        ["a"]), error=err(r"input_features"))
add("features_token_dim_not_dividing", "LinearAttentionFeatures",
    lambda tmp: pkg().LinearAttentionFeatures(token_dim=4).fit(np.ones((3, 10))),
    error=err(r"token_dim"))
add("features_token_dim_contradicts_3d", "LinearAttentionFeatures",
    lambda tmp: pkg().LinearAttentionFeatures(token_dim=2).fit(gaussian(3, 4, 3)),
    error=err(r"token_dim"))
add("features_inf", "LinearAttentionFeatures",
    lambda tmp: pkg().LinearAttentionFeatures().fit_transform(_setv((0, 0, 0), np.inf)(
        gaussian(3, 4, 2))), error=err(r"\bX\b"))


def _features_2d_token_dim(tmp):
    X = gaussian(5, 4, 3)
    return pkg().LinearAttentionFeatures(token_dim=3).fit_transform(X.reshape(5, 12)), \
        ref_features(X)


add("features_2d_token_dim", "LinearAttentionFeatures", _features_2d_token_dim,
    check=lambda r: expect(rel(*r) <= 1e-13, "features differ"), names=DEFAULT_NAMES)


# AdamLinearAttentionRegressor

def _adam(**params):
    def call(tmp):
        X, y = _small()[:2]
        return pkg().AdamLinearAttentionRegressor(max_epochs=params.pop("max_epochs", 2),
                                                  **params).fit(X, y)
    return call


for _name, (_params, _pat) in {
    "learning_rate_zero": ({"learning_rate": 0.0}, r"learning_rate"),
    "batch_size_zero": ({"batch_size": 0}, r"batch_size"),
    "max_epochs_zero": ({"max_epochs": 0}, r"max_epochs"),
    "beta_1_one": ({"beta_1": 1.0}, r"beta_1"),
    "beta_2_negative": ({"beta_2": -0.1}, r"beta_2"),
    "epsilon_zero": ({"epsilon": 0.0}, r"epsilon"),
    "validation_fraction_one": ({"validation_fraction": 1.0}, r"validation_fraction"),
    "n_heads_zero": ({"n_heads": 0}, r"n_heads"),
    "init_scale_zero": ({"init_scale": 0.0}, r"init_scale"),
    "weight_decay_negative": ({"weight_decay": -1.0}, r"weight_decay"),
    "warmup_fraction_2": ({"warmup_fraction": 2.0}, r"warmup_fraction"),
    "random_state_string": ({"random_state": "seed"}, r"random_state"),
    "readout_bogus": ({"readout": "bogus"}, r"readout"),
}.items():
    add(f"adam_{_name}", "AdamLinearAttentionRegressor", _adam(**_params), error=err(_pat))


def _adam_huge(tmp):
    X, y, V, Q, Xt = _small()
    return pkg().AdamLinearAttentionRegressor(max_epochs=2).fit(X * 1e100, y * 1e300)


add("adam_inputs_1e100", "AdamLinearAttentionRegressor", _adam_huge,
    error=err(r"\bX\b|learning_rate|init_scale"))
add("adam_nan_hole", "AdamLinearAttentionRegressor",
    lambda tmp: pkg().AdamLinearAttentionRegressor(max_epochs=1).fit(
        _setv((1, 2), np.nan)(_small()[0]), _small()[1]), error=err(r"\bX\b"))
add("adam_predict_d_mismatch", "AdamLinearAttentionRegressor",
    lambda tmp: _adam()(tmp).predict(gaussian(2, 4, 3)), error=err(r"\bX\b"))


def _adam_learns(tmp):
    X = gaussian(256, 8, 2, seed=0)
    V, Q = teacher(2, 1, 1, seed=0)
    y = ref_forward(X, V, Q)[:, 0]
    m = pkg().AdamLinearAttentionRegressor(n_heads=4, learning_rate=0.05, max_epochs=60,
                                           random_state=0).fit(X, y)
    return m, X, y


add("adam_learns_one_head", "AdamLinearAttentionRegressor", _adam_learns,
    check=lambda r: expect(rel(r[0].predict(r[1]), r[2]) <= 0.05,
                           f"Adam error {rel(r[0].predict(r[1]), r[2]):.3g}"),
    names=DEFAULT_NAMES)


# certify_identifiability validation


def _cert(X=None, **kw):
    def call(tmp):
        Xa = gaussian(60, 5, 2) if X is None else (X(gaussian(60, 5, 2)) if callable(X) else X)
        return pkg().certify_identifiability(Xa, **kw)
    return call


for _name, (_kw, _pat) in {
    "tol_negative": ({"tol": -1.0}, r"\btol\b"),
    "tol_nan": ({"tol": float("nan")}, r"\btol\b"),
    "tol_string": ({"tol": "small"}, r"\btol\b"),
    "solver_bogus": ({"solver": "bogus"}, r"solver"),
    "readout_bogus": ({"readout": "bogus"}, r"readout"),
    "token_dim_zero": ({"token_dim": 0}, r"token_dim"),
    "sample_weight_negative": ({"sample_weight": np.r_[-1.0, np.ones(59)]}, r"sample.weight"),
    "sample_weight_wrong_length": ({"sample_weight": np.ones(3)}, r"sample.weight"),
    "X_nan_hole": ({"X": _setv((2, 1), np.nan)}, r"\bX\b"),
    "X_empty": ({"X": np.empty((0, 5, 2))}, r"\bX\b"),
    "X_complex": ({"X": lambda X: X + 1j}, r"\bX\b"),
    "X_inf": ({"X": _setv((2, 1, 1), np.inf)}, r"\bX\b"),
}.items():
    _X = _kw.pop("X", None)
    add(f"certify_{_name}", "certify_identifiability", _cert(_X, **_kw), error=err(_pat))


def _cert_small_N(solver):
    return lambda tmp: pkg().certify_identifiability(gaussian(17, 5, 3, seed=1), solver=solver)


for _solver in SOLVERS6:
    add(f"certify_N_below_psi_{_solver}", "certify_identifiability", _cert_small_N(_solver),
        check=lambda c: expect(not bool(c), "17 sequences certified for psi = 18"),
        names=DEFAULT_NAMES)


def _cert_nullspace(solver):
    def call(tmp):
        X = gaussian(200, 5, 3, seed=2)
        X[:, :, 0] = X[:, :, 1]  # two coordinates always equal
        return pkg().certify_identifiability(X, solver=solver)
    return call


for _solver in SOLVERS6:
    add(f"certify_equal_coordinates_{_solver}", "certify_identifiability", _cert_nullspace(_solver),
        check=lambda c: expect(not bool(c), "design with x0 == x1 certified identifiable"),
        names=DEFAULT_NAMES)


def _cert_weights_zero_rows(tmp):
    X = gaussian(40, 5, 3, seed=1)
    w = np.r_[np.ones(15), np.zeros(25)]
    return pkg().certify_identifiability(X, sample_weight=w)


add("certify_zero_weights_drop_rows", "certify_identifiability", _cert_weights_zero_rows,
    check=lambda c: expect(not bool(c) and c.n_rows == 15, f"{c}"), names=DEFAULT_NAMES)


# certificate methods


def _deficient_cert(solver="eigh"):
    X = gaussian(100, 5, 3, seed=3)
    X[:, :, 2] = 0.0
    return pkg().certify_identifiability(X, solver=solver), X


def _witness_check(r):
    w, X = r
    (Va, Qa), (Vb, Qb) = w.model_a, w.model_b
    fa, fb = ref_forward(X, Va, Qa), ref_forward(X, Vb, Qb)
    expect(rel(fa, fb) <= 1e-8, f"witness models differ on training inputs by {rel(fa, fb):.3g}")
    Z = w.input[None]
    ga, gb = ref_forward(Z, Va, Qa), ref_forward(Z, Vb, Qb)
    expect(np.linalg.norm(ga - gb) > 1e-3 * max(np.linalg.norm(ga), 1e-300),
           "witness models agree on the witness input")


for _solver in ("eigh", "cg", "svd"):
    add(f"witness_on_failed_certificate_{_solver}", "IdentifiabilityCertificate.witness",
        (lambda s: lambda tmp: (lambda c, X: (c.witness(random_state=0), X))(*_deficient_cert(s)))(
            _solver), check=_witness_check, names=DEFAULT_NAMES)
add("witness_on_identifiable_certificate", "IdentifiabilityCertificate.witness",
    lambda tmp: pkg().certify_identifiability(gaussian(100, 5, 2)).witness(),
    error=err(r"witness|identifiable|certificate holds", (ValueError,)))
add("witness_random_state_string", "IdentifiabilityCertificate.witness",
    lambda tmp: _deficient_cert()[0].witness(random_state="abc"), error=err(r"random_state"))


def _summary(maker):
    def call(tmp):
        return maker().summary()
    return call


add("summary_all_zero_design", "IdentifiabilityCertificate.summary",
    _summary(lambda: pkg().certify_identifiability(np.zeros((30, 4, 2)))),
    check=lambda s: expect(isinstance(s, str) and "NOT IDENTIFIABLE" in s
                           and "nan" not in s.lower(), f"summary: {s!r}"),
    names=DEFAULT_NAMES)
add("summary_cg_failed", "IdentifiabilityCertificate.summary",
    _summary(lambda: _deficient_cert("cg")[0]),
    check=lambda s: expect("NOT IDENTIFIABLE" in s and "nan" not in s.lower(), s),
    names=DEFAULT_NAMES)


def _covers(X_new, solver="eigh"):
    def call(tmp):
        cert, X = _deficient_cert(solver)
        return cert.covers(X_new(X) if callable(X_new) else X_new)
    return call


add("covers_d_mismatch", "IdentifiabilityCertificate.covers", _covers(gaussian(2, 4, 2)),
    error=err(r"X_new"))
add("covers_nan_hole", "IdentifiabilityCertificate.covers",
    _covers(lambda X: _setv((0, 1), np.nan)(X[:2])), error=err(r"X_new"))
add("covers_empty_list", "IdentifiabilityCertificate.covers", _covers([]), error=err(r"X_new"))
add("covers_cg_failed_certificate", "IdentifiabilityCertificate.covers",
    _covers(lambda X: X[:2], "cg"), check=lambda c: expect(bool(np.all(c)), f"covers {c}"),
    error=err(r"solver|covers", (ValueError,)))


def _covers_lsmr_zero(tmp):
    cert = pkg().certify_identifiability(np.zeros((30, 4, 3)), solver="lsmr")
    Xn = gaussian(3, 4, 3, seed=1)
    Xn[0] = 0.0  # zero features: covered even by an all-zero design
    return cert.covers(Xn)


add("covers_lsmr_all_zero_design", "IdentifiabilityCertificate.covers", _covers_lsmr_zero,
    check=lambda c: expect(list(c) == [True, False, False], f"covers {list(c)}"),
    names=DEFAULT_NAMES, note="psi = 18: the active Gram matrix fits in any memory budget")


def _covers_exact(scale):
    def call(tmp):
        cert, X = _deficient_cert()
        Xn = gaussian(6, 8, 3, seed=11)
        Xn[:3, :, 2] = 0.0
        return cert.covers(Xn * scale)
    return call


for _s in (1.0, 1e-60, 1e60):
    add(f"covers_exact_answer_scale_{_s:.0e}", "IdentifiabilityCertificate.covers",
        _covers_exact(_s),
        check=lambda c: expect(list(c) == [True] * 3 + [False] * 3, f"covers {list(c)}"),
        names=DEFAULT_NAMES, defect=5 if _s != 1.0 else None)


def _bound(eps):
    return lambda tmp: pkg().certify_identifiability(gaussian(100, 5, 2)).error_bound(
        gaussian(3, 5, 2), eps)


add("error_bound_epsilon_negative", "IdentifiabilityCertificate.error_bound", _bound(-1.0),
    error=err(r"epsilon"))
add("error_bound_epsilon_nan", "IdentifiabilityCertificate.error_bound", _bound(float("nan")),
    error=err(r"epsilon"))
add("error_bound_epsilon_string", "IdentifiabilityCertificate.error_bound", _bound("1e-6"),
    error=err(r"epsilon"))


def _bound_reference(tmp):
    X = gaussian(100, 5, 2, seed=4)
    Xn = gaussian(4, 7, 2, seed=5)
    cert = pkg().certify_identifiability(X)
    H = ref_features(X)
    Lam = H.T @ H / len(H)
    Hn = ref_features(Xn)
    ref = 2 * np.sqrt(1e-6 * np.einsum("ip,pq,iq->i", Hn, np.linalg.inv(Lam), Hn))
    return cert.error_bound(Xn, 1e-6), ref


add("error_bound_matches_formula", "IdentifiabilityCertificate.error_bound", _bound_reference,
    check=lambda r: expect(rel(*r) <= 1e-6, f"bound {r[0]} vs 2 sqrt(eps h' Lambda^-1 h) {r[1]}"),
    names=DEFAULT_NAMES)


# ---------------------------------------------------------------------------
# The plain functions
# ---------------------------------------------------------------------------


def _heads(d=2, n_heads=2, d_out=1, seed=0):
    return teacher(d, n_heads, d_out, seed)


def _fwd(X=None, V=None, Q=None, **kw):
    def call(tmp):
        V0, Q0 = _heads()
        X0 = gaussian(4, 5, 2)
        Xa = X0 if X is None else (X(X0) if callable(X) else X)
        Va = V0 if V is None else (V(V0) if callable(V) else V)
        Qa = Q0 if Q is None else (Q(Q0) if callable(Q) else Q)
        return pkg().mhla_forward(Xa, Va, Qa, **kw)
    return call


for _name, (_args, _pat, _defect) in {
    "V_nan": ({"V": _setv((0, 0, 0), np.nan)}, r"\bV\b", 11),
    "Q_nan": ({"Q": _setv((1, 0, 1), np.nan)}, r"\bQ\b", 11),
    "V_inf": ({"V": _setv((0, 0, 0), np.inf)}, r"\bV\b", 11),
    "V_complex": ({"V": lambda V: V + 1j}, r"\bV\b", 11),
    "Q_complex": ({"Q": lambda Q: Q * (1 + 1j)}, r"\bQ\b", 11),
    "X_complex": ({"X": lambda X: X + 1j}, r"\bX\b", None),
    "V_2d": ({"V": lambda V: V[0]}, r"\bV\b", None),
    "heads_mismatch": ({"Q": lambda Q: Q[:1]}, r"\bV\b|\bQ\b|n_heads", None),
    "X_d_mismatch": ({"X": gaussian(3, 5, 3)}, r"\bX\b", None),
    "readout_bogus": ({"readout": "bogus"}, r"readout", None),
    "lengths_zero": ({"lengths": np.array([0, 5, 5, 5])}, r"lengths", None),
    "lengths_too_long": ({"lengths": np.array([6, 5, 5, 5])}, r"lengths", None),
    "lengths_float": ({"lengths": np.array([5.0, 5, 5, 5])}, r"lengths", None),
    "lengths_wrong_shape": ({"lengths": np.array([5, 5])}, r"lengths", None),
    "X_nan_hole": ({"X": _setv((1, 1), np.nan)}, r"\bX\b", None),
    "X_empty_list": ({"X": []}, r"\bX\b", None),
    "V_strings": ({"V": lambda V: V.astype(str)}, r"\bV\b", None),
}.items():
    add(f"mhla_forward_{_name}", "mhla_forward", _fwd(**_args), error=err(_pat), defect=_defect)


def _fwd_correct(readout):
    def call(tmp):
        X, y, V, Q, Xt = realizable(10, 6, 3, n_heads=3, d_out=2, seed=5, variable=True)
        return pkg().mhla_forward(X, V, Q, readout=readout), ref_forward(X, V, Q, readout)
    return call


for _r in ("last", "all"):
    add(f"mhla_forward_matches_reference_{_r}", "mhla_forward", _fwd_correct(_r),
        check=lambda r: expect(rel(np.nan_to_num(r[0]), np.nan_to_num(r[1])) <= 1e-12
                               and bool(np.all(np.isnan(r[0]) == np.isnan(r[1]))), "differs"),
        names=DEFAULT_NAMES)


def _fwd_extreme(scale):
    def call(tmp):
        V, Q = _heads()
        X = gaussian(4, 5, 2, seed=1)
        return pkg().mhla_forward(X * scale, V, Q), ref_forward(X, V, Q), scale
    return call


def _fwd_extreme_check(r):
    out, unit, c = r
    expect(not np.any(np.isnan(out)), "NaN output")
    true_log = np.log10(np.abs(unit)) + 3 * math.log10(c)
    rep = (true_log < 307) & (true_log > -290)
    expect(bool(np.all(np.isfinite(out[rep]))), "inf where the answer is representable")
    if rep.any():
        expect(rel(out[rep] / c / c / c, unit[rep]) <= 1e-10, "wrong values")
    expect(bool(np.all(np.isinf(out[true_log >= 309]))), "finite where the answer overflows")


for _c in (1e-110, 1e100, 1e120):
    add(f"mhla_forward_scale_{_c:.0e}", "mhla_forward", _fwd_extreme(_c), check=_fwd_extreme_check,
        error=err(r"\bX\b"))


def _gen_fn(n_steps=2, V=None, Q=None, **kw):
    def call(tmp):
        V0, Q0 = teacher(2, 1, 2, seed=0)
        Va = V0 if V is None else (V(V0) if callable(V) else V)
        Qa = Q0 if Q is None else (Q(Q0) if callable(Q) else Q)
        return pkg().mhla_generate(gaussian(3, 4, 2), Va, Qa, n_steps, **kw)
    return call


for _name, (_args, _pat, _defect) in {
    "V_nan": ({"V": _setv((0, 0, 0), np.nan)}, r"\bV\b", 11),
    "Q_complex": ({"Q": lambda Q: Q + 1j}, r"\bQ\b", 11),
    "n_steps_1e15": ({"n_steps": 10**15}, r"n_steps", 11),
    "n_steps_negative": ({"n_steps": -2}, r"n_steps", None),
    "V_d_out_not_d": ({"V": lambda V: V[:, :1]}, r"\bV\b", None),
    "rounding_table_1d": ({"rounding": np.ones(2)}, r"rounding", None),
    "rounding_strings": ({"rounding": np.array([["a", "b"]])}, r"rounding", None),
    "lengths_too_long": ({"lengths": np.array([5, 4, 4])}, r"lengths", None),
}.items():
    add(f"mhla_generate_{_name}", "mhla_generate", _gen_fn(**_args), error=err(_pat),
        defect=_defect)


def _gen_fn_zero(tmp):
    V, Q = teacher(2, 1, 2, seed=0)
    P = gaussian(3, 4, 2)
    return pkg().mhla_generate(P, V, Q, 0), P


add("mhla_generate_zero_steps_returns_prompts", "mhla_generate", _gen_fn_zero,
    check=lambda r: expect(r[0].shape == r[1].shape and rel(r[0], r[1]) == 0, "changed prompts"),
    names=DEFAULT_NAMES)


def _coef(V=None, Q=None):
    def call(tmp):
        V0, Q0 = _heads(3, 2, 2)
        Va = V0 if V is None else V(V0)
        Qa = Q0 if Q is None else Q(Q0)
        return pkg().attention_coefficients(Va, Qa)
    return call


add("attention_coefficients_V_nan", "attention_coefficients", _coef(V=_setv((0, 0, 0), np.nan)),
    error=err(r"\bV\b"))
add("attention_coefficients_Q_complex", "attention_coefficients", _coef(Q=lambda Q: Q + 1j),
    error=err(r"\bQ\b"))
add("attention_coefficients_shape_mismatch", "attention_coefficients",
    _coef(Q=lambda Q: Q[:, :2, :2]), error=err(r"\bV\b|\bQ\b"))


def _coef_correct(tmp):
    V, Q = _heads(3, 2, 2, seed=3)
    X = gaussian(7, 5, 3, seed=4)
    return ref_features(X) @ pkg().attention_coefficients(V, Q).T, ref_forward(X, V, Q)


add("attention_coefficients_linear_in_features", "attention_coefficients", _coef_correct,
    check=lambda r: expect(rel(*r) <= 1e-12, f"H @ coef.T differs from the forward pass "
                                             f"by {rel(*r):.3g}"), names=DEFAULT_NAMES)


def _hfc(coef, d):
    return lambda tmp: pkg().heads_from_coefficients(coef() if callable(coef) else coef, d)


add("heads_from_coefficients_wrong_length", "heads_from_coefficients", _hfc(np.ones((1, 17)), 3),
    error=err(r"coef|\bd\b|psi"))
add("heads_from_coefficients_nan", "heads_from_coefficients",
    _hfc(lambda: _setv((0, 3), np.nan)(np.ones((1, 18))), 3), error=err(r"coef"))
add("heads_from_coefficients_d_zero", "heads_from_coefficients", _hfc(np.ones((1, 1)), 0),
    error=err(r"\bd\b"))
add("heads_from_coefficients_d_float", "heads_from_coefficients", _hfc(np.ones((1, 18)), 3.0),
    check=lambda r: expect(r[0].shape[2] == 3, "shape"), error=err(r"\bd\b"))
add("heads_from_coefficients_1d_coef", "heads_from_coefficients", _hfc(np.ones(18), 3),
    error=err(r"coef"))


def _hfc_round(tmp):
    coef = np.random.default_rng(0).normal(size=(2, 18))
    V, Q = pkg().heads_from_coefficients(coef, 3)
    return pkg().attention_coefficients(V, Q), coef


add("heads_from_coefficients_round_trip", "heads_from_coefficients", _hfc_round,
    check=lambda r: expect(rel(*r) <= 1e-12, f"round trip {rel(*r):.3g}"), names=DEFAULT_NAMES)


def _compress(n_heads=2, coef=None, **kw):
    def call(tmp):
        V, Q = _heads(3, 2, 1, seed=1)
        c = pkg().attention_coefficients(V, Q) if coef is None else coef
        return pkg().compress_heads(c, 3, n_heads, **kw)
    return call


for _name, (_args, _pat, _defect) in {
    "n_heads_zero": ({"n_heads": 0}, r"n_heads", 11),
    "n_heads_negative": ({"n_heads": -1}, r"n_heads", None),
    "n_heads_float": ({"n_heads": 1.5}, r"n_heads", None),
    "n_heads_string": ({"n_heads": "2"}, r"n_heads", None),
    "coef_wrong_length": ({"coef": np.ones((1, 17))}, r"coef|\bd\b", None),
    "coef_nan": ({"coef": np.full((1, 18), np.nan)}, r"coef", None),
    "random_state_string": ({"random_state": "abc"}, r"random_state", None),
    "tol_negative": ({"tol": -1.0}, r"\btol\b", None),
    "max_iter_zero": ({"max_iter": 0}, r"max_iter", None),
    "n_init_zero": ({"n_init": 0}, r"n_init", None),
}.items():
    add(f"compress_heads_{_name}", "compress_heads", _compress(**_args), error=err(_pat),
        defect=_defect)
add("compress_heads_zero_coef", "compress_heads", _compress(2, coef=np.zeros((1, 18))),
    check=lambda r: expect(r[0].shape == (2, 1, 3) and r[2] == 0 and not np.any(r[0]),
                           "zero coefficients"), names=DEFAULT_NAMES)


def _same(a, b):
    def call(tmp):
        return pkg().same_function(*a(), *b())
    return call


_h1 = lambda: _heads(2, 2, 1, seed=0)  # noqa: E731
add("same_function_equivalent_reparametrisation", "same_function",
    _same(_h1, lambda: (2 * _h1()[0], _h1()[1] / 2)), check=lambda v: expect(v is True, f"{v}"),
    names=DEFAULT_NAMES)
add("same_function_different", "same_function", _same(_h1, lambda: _heads(2, 2, 1, seed=1)),
    check=lambda v: expect(v is False, f"{v}"), names=DEFAULT_NAMES)
add("same_function_nan", "same_function",
    _same(_h1, lambda: (_setv((0, 0, 0), np.nan)(_h1()[0]), _h1()[1])),
    error=err(r"\bV|\bQ"))
add("same_function_different_d", "same_function", _same(_h1, lambda: _heads(3, 1, 1)),
    check=lambda v: expect(v is False, f"{v}"), error=err(r"\bd\b|\bV|\bQ"))


def _kernel_correct(tmp):
    X = realizable(8, 5, 2, seed=1, variable=True)[0]
    Y = gaussian(3, 7, 2, seed=2)
    return pkg().attention_kernel(X, Y), ref_features(X) @ ref_features(Y).T


add("attention_kernel_matches_features", "attention_kernel", _kernel_correct,
    check=lambda r: expect(rel(*r) <= 1e-12, "kernel differs"), names=DEFAULT_NAMES)
add("attention_kernel_Y_d_mismatch", "attention_kernel",
    lambda tmp: pkg().attention_kernel(gaussian(3, 4, 2), gaussian(3, 4, 3)), error=err(r"\bY\b"))
add("attention_kernel_X_nan_hole", "attention_kernel",
    lambda tmp: pkg().attention_kernel(_setv((0, 1), np.nan)(gaussian(3, 4, 2))),
    error=err(r"\bX\b"))
add("attention_kernel_empty", "attention_kernel", lambda tmp: pkg().attention_kernel([]),
    error=err(r"\bX\b"))


# ---------------------------------------------------------------------------
# Datasets and programs
# ---------------------------------------------------------------------------


def _ds(name, **kw):
    def call(tmp):
        import sklearn_linattn.datasets as ds

        return getattr(ds, name)(**kw)
    return call


for _name, (_kw, _pat) in {
    "n_samples_zero": ({"n_samples": 0}, r"n_samples"),
    "n_tokens_negative": ({"n_tokens": -1}, r"n_tokens"),
    "d_zero": ({"d": 0}, r"\bd\b"),
    "n_heads_zero": ({"n_heads": 0}, r"n_heads"),
    "noise_negative": ({"noise": -1.0}, r"noise"),
    "noise_nan": ({"noise": float("nan")}, r"noise"),
    "variable_length_zero_min": ({"variable_length": (0, 5), "n_tokens": 10}, r"variable_length"),
    "variable_length_reversed": ({"variable_length": (5, 3), "n_tokens": 10}, r"variable_length"),
    "variable_length_too_long": ({"variable_length": (1, 20), "n_tokens": 10}, r"variable_length"),
    "variable_length_string": ({"variable_length": "yes"}, r"variable_length"),
    "weight_scale_zero": ({"weight_scale": 0.0}, r"weight_scale"),
    "token_scale_negative": ({"token_scale": -1.0}, r"token_scale"),
    "random_state_string": ({"random_state": "abc"}, r"random_state"),
    "random_state_negative": ({"random_state": -1}, r"random_state"),
    "random_state_float": ({"random_state": 1.5}, r"random_state"),
    "readout_bogus": ({"readout": "bogus"}, r"readout"),
    "return_params_string": ({"return_params": "yes"}, r"return_params"),
    "n_samples_1e12": ({"n_samples": 10**12}, r"n_samples"),
}.items():
    add(f"make_random_mhla_{_name}", "datasets.make_random_mhla", _ds("make_random_mhla", **_kw),
        error=err(_pat))


def _mhla_data_correct(tmp):
    import sklearn_linattn.datasets as ds

    X, y, p = ds.make_random_mhla(30, 8, 3, n_heads=2, d_out=2, readout="all",
                                  variable_length=(2, 8), random_state=np.random.default_rng(0),
                                  return_params=True)
    return X, y, ref_forward(X, p["V"], p["Q"], "all")


add("make_random_mhla_targets_match_reference", "datasets.make_random_mhla", _mhla_data_correct,
    check=lambda r: expect(rel(np.nan_to_num(r[1]), np.nan_to_num(r[2])) <= 1e-12
                           and bool(np.all(np.isnan(r[1]) == np.isnan(r[2]))), "targets differ"),
    names=DEFAULT_NAMES)

for _name, (_kw, _pat) in {
    "distribution_bogus": ({"distribution": "bogus"}, r"distribution"),
    "p_orthonormal_1.5": ({"distribution": "mixture", "p_orthonormal": 1.5}, r"p_orthonormal"),
    "d_zero": ({"d": 0}, r"\bd\b"),
    "targets_bogus": ({"targets": "bogus"}, r"targets"),
    "random_state_string": ({"random_state": "abc"}, r"random_state"),
}.items():
    add(f"make_associative_memory_{_name}", "datasets.make_associative_memory",
        _ds("make_associative_memory", **_kw), error=err(_pat))


def _memory_correct(tmp):
    import sklearn_linattn.datasets as ds

    X, y, p = ds.make_associative_memory(40, 3, random_state=0, return_params=True)
    return y, ref_forward(X, p["V"], p["Q"])


add("make_associative_memory_targets_match_reference", "datasets.make_associative_memory",
    _memory_correct, check=lambda r: expect(rel(np.reshape(r[0], r[1].shape), r[1]) <= 1e-12,
                                            "targets differ"), names=DEFAULT_NAMES)

for _name, (_kw, _pat) in {
    "n_states_zero": ({"n_states": 0}, r"n_states"),
    "alphabet_size_zero": ({"alphabet_size": 0}, r"alphabet_size"),
    "word_length_negative": ({"word_length": -1}, r"word_length"),
    "targets_bogus": ({"targets": "bogus"}, r"targets"),
    "n_samples_float": ({"n_samples": 2.5}, r"n_samples"),
}.items():
    add(f"make_dfa_execution_{_name}", "datasets.make_dfa_execution",
        _ds("make_dfa_execution", **_kw), error=err(_pat))


def _dfa_shift(tmp):
    import sklearn_linattn.datasets as ds

    X, y = ds.make_dfa_execution(5, random_state=0)
    return X, y


add("make_dfa_execution_targets_are_next_tokens", "datasets.make_dfa_execution", _dfa_shift,
    check=lambda r: expect(np.array_equal(r[1][:, :-1], r[0][:, 1:]), "y is not X shifted"),
    names=DEFAULT_NAMES)
add("dfa_vocabulary_zero_states", "datasets.dfa_vocabulary", _ds("dfa_vocabulary", n_states=0,
                                                                  alphabet_size=2),
    error=err(r"n_states"))


def _prog(fn, *args, **kw):
    def call(tmp):
        import sklearn_linattn.programs as pr

        return getattr(pr, fn)(*args, **kw)
    return call


for _name, (_fn, _args, _pat) in {
    "associative_memory_d_zero": ("associative_memory_program", (0,), r"\bd\b"),
    "associative_memory_d_string": ("associative_memory_program", ("3",), r"\bd\b"),
    "dfa_transition_alphabet_zero": ("dfa_transition_program", (2, 0), r"alphabet_size"),
    "dfa_executor_word_length_zero": ("dfa_executor_program", (2, 2, 0), r"max_word_length"),
    "turing_machine_states_zero": ("turing_machine_program", (0, 2, 4, 4), r"n_states"),
    "run_dfa_state_out_of_range": ("run_dfa", (np.full((1, 2, 2), 5), np.zeros((1, 3), int)),
                                   r"transitions"),
    "run_dfa_float_words": ("run_dfa", (np.zeros((1, 2, 2), int), np.zeros((1, 3))), r"words"),
    "run_dfa_letter_out_of_range": ("run_dfa", (np.zeros((1, 2, 2), int), np.full((1, 3), 7)),
                                    r"words"),
    "run_dfa_hole_in_word": ("run_dfa", (np.zeros((1, 2, 2), int), np.array([[0, -1, 1]])),
                             r"words"),
    "run_turing_machine_bad_move": ("run_turing_machine",
                                    (np.zeros((1, 2, 2), int), np.zeros((1, 2, 2), int),
                                     np.full((1, 2, 2), 2), np.zeros((1, 3), int), 2), r"move"),
    "next_token_dataset_start_zero": ("next_token_dataset", (gaussian(2, 4, 2), 0), r"start"),
    "next_token_dataset_start_too_big": ("next_token_dataset", (gaussian(2, 4, 2), 9), r"start"),
}.items():
    add(f"programs_{_name}", "programs", _prog(_fn, *_args), error=err(_pat))


def _program_api(action):
    def call(tmp):
        import sklearn_linattn.programs as pr

        return action(pr)
    return call


add("programs_program_max_length_zero", "programs",
    _program_api(lambda pr: pr.Program(max_length=0)), error=err(r"max_length"))
add("programs_attribute_empty_alphabet", "programs",
    _program_api(lambda pr: pr.Program().attribute("a", [])), error=err(r"attribute|\ba\b"))
add("programs_lookup_unknown_attribute", "programs",
    _program_api(lambda pr: pr.Program().attribute("a", "xy").lookup(
        query="zz", key="a", value="a", dest="a")), error=err(r"zz"))
add("programs_encode_unknown_attribute", "programs",
    _program_api(lambda pr: pr.associative_memory_program(3).encode([{"bogus": 1}])),
    error=err(r"bogus"))
add("programs_encode_unknown_value", "programs",
    _program_api(lambda pr: pr.associative_memory_program(3).encode([{"key": 7}])),
    error=err(r"key|7"))
add("programs_decode_wrong_d", "programs",
    _program_api(lambda pr: pr.associative_memory_program(3).decode(np.zeros((2, 5)))),
    error=err(r"\bX\b"))
add("programs_forward_wrong_d", "programs",
    _program_api(lambda pr: pr.associative_memory_program(3).forward(np.zeros((1, 2, 5)))),
    error=err(r"\bX\b"))
add("programs_run_n_steps_negative", "programs",
    _program_api(lambda pr: pr.associative_memory_program(3).run(
        pr.associative_memory_program(3).encode([[{"key": 0, "value": 1}, {"key": 0}]]), -1)),
    error=err(r"n_steps"))


def _executor(tmp):
    import sklearn_linattn.programs as pr

    ex = pr.dfa_executor_program(2, 2, 4)
    rng = np.random.default_rng(0)
    T = rng.integers(0, 2, size=(6, 2, 2))
    W = rng.integers(0, 2, size=(6, 4))
    return ex.execute(T, W), pr.run_dfa(T, W)


add("programs_dfa_executor_matches_run_dfa", "programs", _executor,
    check=lambda r: expect(np.array_equal(r[0], r[1]), f"{r[0]} vs {r[1]}"), names=DEFAULT_NAMES)
add("programs_dfa_executor_word_too_long", "programs",
    _program_api(lambda pr: pr.dfa_executor_program(2, 2, 3).execute(
        np.zeros((1, 2, 2), int), np.zeros((1, 5), int))), error=err(r"words|word_length|length"))


# ---------------------------------------------------------------------------
# Defect 12: dask cluster that loses every worker
# ---------------------------------------------------------------------------


def _dask_lost_workers(tmp):
    import inspect

    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    model = LAR()
    params = model.get_params()
    timeout_params = [p for p in params if "timeout" in p]
    fit_kw = {}
    if not timeout_params:
        fit_sig = inspect.signature(type(model).fit).parameters
        timeout_params = [p for p in fit_sig if "timeout" in p]
        fit_kw = {p: 5 for p in timeout_params}
    else:
        model.set_params(**{p: 5 for p in timeout_params})
    # A documented engine pass-through counts too: use it if the package names it.
    root = Path(pkg().__file__).resolve().parent
    documented = any("no-workers-timeout" in f.read_text(errors="ignore")
                     for f in list(root.rglob("*.py")) + list((root.parent / "doc").rglob("*.rst"))
                     if f.exists())
    config = {"distributed.scheduler.no-workers-timeout": "5s"} if documented else {}
    with dask.config.set(config):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=50)
        client = Client(cluster)
        try:
            X, y = _small()[:2]
            Xd, yd = da.from_array(X, chunks=20), da.from_array(y, chunks=20)
            model.fit(Xd, yd, **fit_kw)  # works while the worker lives
            cluster.scale(0)
            # However long the worker takes to go: the case's time limit is the safety net.
            while client.scheduler_info()["workers"]:
                time.sleep(0.1)
            model.fit(Xd * 1.0, yd, **fit_kw)
            return "returned"
        finally:
            client.close(timeout=120)
            cluster.close(timeout=120)


add("dask_fit_cluster_lost_all_workers", "dask", _dask_lost_workers,
    error=err(r"(?i)worker|time.?out|cluster", (Exception,)), defect=12, slow=True,
    note="a timeout option, or a documented pass-through that surfaces the engine's failure")


def _dask_bad_block(tmp):
    import dask
    import dask.array as da

    X, y = _small()[:2]
    X = _setv((47, 2), np.nan)(X)
    with dask.config.set(scheduler="synchronous"):
        return LAR().fit(da.from_array(X, chunks=20), da.from_array(y, chunks=20))


add("dask_fit_nan_hole_in_block", "dask", _dask_bad_block, error=err(r"\bX\b"))


# ---------------------------------------------------------------------------
# The newer entry points: PyTorch layers, optimality, few heads, designs, repair,
# linear terms
# ---------------------------------------------------------------------------

_TORCH = ("torch", "sklearn_linattn.nn")


def _nn():
    import sklearn_linattn.nn as nn

    return nn


def _projection_layer(d=4, n_heads=2, d_k=2, n_kv_heads=None, out="o_proj", dtype=None,
                      device=None, seed=0):
    """A layer with q_proj, k_proj, v_proj, o_proj (or out_proj) and its own forward."""
    import torch

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            kv = n_kv_heads or n_heads
            kw = dict(dtype=dtype or torch.float64, device=device)
            self.q_proj = torch.nn.Linear(d, n_heads * d_k, bias=False, **kw)
            self.k_proj = torch.nn.Linear(d, kv * d_k, bias=False, **kw)
            self.v_proj = torch.nn.Linear(d, kv * d_k, bias=False, **kw)
            setattr(self, out, torch.nn.Linear(n_heads * d_k, d, bias=True, **kw))
            self.num_heads, self.head_dim = n_heads, d_k
            if n_kv_heads is not None:
                self.num_kv_heads = n_kv_heads

        def forward(self, x):  # the definition, per head, with grouped keys and values
            b, n, _ = x.shape
            group = n_heads // (n_kv_heads or n_heads)
            q = self.q_proj(x).view(b, n, n_heads, d_k)
            k = self.k_proj(x).view(b, n, -1, d_k).repeat_interleave(group, 2)
            v = self.v_proj(x).view(b, n, -1, d_k).repeat_interleave(group, 2)
            scores = torch.einsum("bthk,bshk->bhts", q, k) / math.sqrt(d_k)
            scores = scores * torch.ones(n, n, dtype=x.dtype).tril()
            heads = torch.einsum("bhts,bshv->bthv", scores, v).reshape(b, n, -1)
            return getattr(self, out)(heads)

    torch.manual_seed(seed)
    return Attention()


def _from_torch(make, **kw):
    def call(tmp):
        return _nn().from_torch(make(), **kw)
    return call


def _reads_the_forward(**layer_kw):
    def call(tmp):
        import torch

        layer = _projection_layer(**layer_kw)
        x = torch.as_tensor(np.random.default_rng(1).normal(size=(4, 6, 4)))
        return _nn().from_torch(layer), x.numpy(), layer(x).detach().numpy()
    return call


def _reads_the_forward_check(r):
    heads, x, out = r
    expect(heads.readout == "all", f"readout {heads.readout!r} for a layer without one")
    got = ref_forward(x, heads.value_matrices, heads.key_query_matrices, "all")
    got = got + (0.0 if heads.intercept is None else heads.intercept)
    e = rel(got, out)
    expect(e <= 1e-12, f"the heads differ from the layer's forward by {e:.3g}")


for _name, _kw in {"q_k_v_o_proj": {}, "grouped_keys_and_values": {"n_kv_heads": 1},
                   "out_proj": {"out": "out_proj"}}.items():
    add(f"from_torch_{_name}_reads_the_forward", "nn.from_torch", _reads_the_forward(**_kw),
        check=_reads_the_forward_check, names=DEFAULT_NAMES, requires=_TORCH)


def _torch_dtype(name):
    import torch

    return getattr(torch, name)


add("from_torch_complex_weights", "nn.from_torch",
    _from_torch(lambda: _projection_layer(dtype=_torch_dtype("complex128"))),
    error=err(both(r"q_proj\.weight", r"complex|real")), requires=_TORCH)
add("from_torch_meta_device_linear", "nn.from_torch",
    _from_torch(lambda: _projection_layer(device="meta")),
    error=err(both(r"q_proj\.weight", r"meta")), requires=_TORCH)
add("from_torch_meta_device_package_layer", "nn.from_torch",
    _from_torch(lambda: _nn().MultiHeadLinearAttention(3, 2, device="meta")),
    error=err(both(r"W_q", r"meta")), requires=_TORCH)


def _half_precision(name):
    def call(tmp):
        import torch

        layer = _projection_layer(dtype=_torch_dtype(name))
        exact = _nn().from_torch(layer.to(torch.float64))  # the same values, widened
        return _nn().from_torch(_projection_layer(dtype=_torch_dtype(name))), exact
    return call


def _half_precision_check(r):
    heads, exact = r
    expect(heads.value_matrices.dtype == np.float64, f"dtype {heads.value_matrices.dtype}")
    expect(rel(heads.key_query_matrices, exact.key_query_matrices) <= 1e-15,
           "the heads differ from those of the weights widened to float64")
    expect(finite(heads.key_query_matrices), "non-finite heads")
    expect(heads.key_query_matrices.shape == (2, 4, 4), f"shape {heads.key_query_matrices.shape}")


for _name in ("float16", "bfloat16"):
    add(f"from_torch_{_name}_weights", "nn.from_torch", _half_precision(_name),
        check=_half_precision_check, names=DEFAULT_NAMES, requires=_TORCH)


class _Weights:
    """A duck-typed layer: per-head weights as attributes, no projection modules."""

    def __init__(self, W_q, W_k, W_v, W_o=None, readout="last"):
        self.W_q, self.W_k, self.W_v, self.W_o, self.readout = W_q, W_k, W_v, W_o, readout


def _expanded_huge(tmp):
    import torch

    one = torch.ones(1, 1, 1, dtype=torch.float64)
    W = one.expand(2, 2**20, 2**20)  # 16 TiB as float64, eight bytes in memory
    return _nn().from_torch(_Weights(W, W, W))


def _expanded_huge_linear(tmp):
    import torch

    layer = _projection_layer()
    layer.q_proj.weight = torch.nn.Parameter(
        torch.ones(1, 1, dtype=torch.float64).expand(2**22, 2**22))
    return _nn().from_torch(layer)


def _expanded_small(tmp):
    import torch

    g = torch.Generator().manual_seed(0)
    W_q = torch.ones(1, 1, 1, dtype=torch.float64).expand(2, 3, 3)  # stride 0
    W_k = torch.randn(2, 3, 3, dtype=torch.float64, generator=g)
    W_v = torch.randn(2, 3, 3, dtype=torch.float64, generator=g).transpose(1, 2)  # a view
    heads = _nn().from_torch(_Weights(W_q, W_k, W_v), scale=1.0)
    Q = np.einsum("hkd,hke->hde", W_k.numpy(), W_q.numpy())
    V = np.zeros((2, 6, 3))  # no W_o: the output is the heads' values side by side
    V[0, :3], V[1, 3:] = W_v.numpy()
    return heads, Q, V


def _expanded_small_check(r):
    heads, Q, V = r
    expect(rel(heads.key_query_matrices, Q) <= 1e-15, "Q_h = W_k^T W_q read wrongly")
    expect(heads.value_matrices.shape == V.shape and rel(heads.value_matrices, V) <= 1e-15,
           "V_h (the values, no output projection) read wrongly")


add("from_torch_expanded_huge_weight", "nn.from_torch", _expanded_huge,
    error=err(both(r"W_q", r"memory|GiB|TiB|bytes")), memory_mb=1024, requires=_TORCH,
    note="a stride-0 view of 2**41 values: refused before any copy")
add("from_torch_expanded_huge_linear_weight", "nn.from_torch", _expanded_huge_linear,
    error=err(both(r"q_proj\.weight", r"memory|GiB|TiB|bytes")), memory_mb=1024,
    requires=_TORCH)
add("from_torch_expanded_small_and_transposed_weights", "nn.from_torch", _expanded_small,
    check=_expanded_small_check, names=DEFAULT_NAMES, requires=_TORCH)


def _with_attr(make, **attrs):
    def build():
        layer = make()
        for key, value in attrs.items():
            setattr(layer, key, value() if callable(value) else value)
        return layer
    return build


def _package_layer():
    import torch

    torch.manual_seed(0)
    return _nn().MultiHeadLinearAttention(3, 2, dtype=torch.float64)


def _tensor(*args, **kw):
    def make():
        import torch

        return torch.tensor(*args, **kw)
    return make


for _name, (_value, _pat) in {
    "vector": (_tensor([0.5, 0.5]), r"module\.scale"),
    "nan": (_tensor(float("nan")), r"module\.scale"),
    "negative": (-1.0, r"module\.scale"),
    "bool": (True, r"module\.scale"),
    "string": ("auto", r"module\.scale"),
    "meta_tensor": (_tensor(2.0, device="meta"), both(r"module\.scale", r"meta")),
}.items():
    add(f"from_torch_scale_attribute_{_name}", "nn.from_torch",
        _from_torch(_with_attr(_package_layer, scale=_value)), error=err(_pat),
        requires=_TORCH)
for _name, (_value, _pat) in {
    "vector": (np.ones(2), r"\bscale\b"),
    "zero": (0.0, r"\bscale\b"),
    "infinite": (math.inf, r"\bscale\b"),
    "complex": (1j, r"\bscale\b"),
}.items():
    add(f"from_torch_scale_argument_{_name}", "nn.from_torch",
        _from_torch(_package_layer, scale=_value), error=err(_pat), requires=_TORCH)


def _q_bias():
    import torch

    layer = _projection_layer()
    layer.q_proj.bias = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    return layer


def _inf_weight():
    import torch

    layer = _projection_layer()
    with torch.no_grad():
        layer.k_proj.weight[0, 0] = math.inf
    return layer


def _sparse_weights():
    import torch

    W = torch.eye(2, dtype=torch.float64)[None].to_sparse()
    return _Weights(W, W, W)


for _name, (_make, _pat) in {
    "num_heads_not_dividing": (_with_attr(_projection_layer, num_heads=3), r"num_heads"),
    "num_heads_vector": (_with_attr(_projection_layer, num_heads=_tensor([2, 2])), r"num_heads"),
    "feature_map": (_with_attr(_projection_layer, feature_map="elu"), r"feature_map"),
    "infinite_weight": (_inf_weight, r"k_proj\.weight"),
    "sparse_weight": (_sparse_weights, both(r"W_q", r"sparse|dense")),
    "none": (lambda: None, r"projections|q_proj|W_q"),
}.items():
    add(f"from_torch_{_name}", "nn.from_torch", _from_torch(_make), error=err(_pat),
        requires=_TORCH)
def _q_bias_read(tmp):
    import torch

    layer = _q_bias()
    heads = pkg().nn.from_torch(layer)
    x = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    z = np.concatenate([x.numpy(), np.ones((3, 5, 1))], axis=2)  # the tokens [x; 1]
    return heads, ref_forward(z, heads.value_matrices, heads.key_query_matrices, "all"), (
        layer(x).detach().numpy())


def _q_bias_check(r):
    heads, outputs, expected = r
    expect(heads.constant == 1.0, f"constant {heads.constant}, expected 1.0 (a q bias)")
    got = outputs + heads.intercept
    expect(rel(got, expected) < 1e-12, f"the heads on [x; 1] differ from the layer by "
           f"{rel(got, expected):.3g}")


# A bias on q, k or v: the layer is attention on [x; 1] (it was refused before).
add("from_torch_q_proj_bias", "nn.from_torch", _q_bias_read, check=_q_bias_check,
    requires=_TORCH)
add("from_torch_names_not_a_mapping", "nn.from_torch",
    _from_torch(_projection_layer, names=["q_proj"]), error=err(r"\bnames\b"),
    requires=_TORCH)


# --- to_torch: the fitted estimator as a layer, on NaN-padded batches ---------


def _padded_batch(d=3, seed=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(8, 9, d)) / 3
    X[0, 4:] = np.nan
    X[3, 1:] = np.nan  # one real token
    X[5, 7:] = np.nan
    return X


def _fitted_for_torch(readout="last", terms=False):
    X, y, V, Q, Xt = realizable(200, 6, 3, n_heads=2, seed=0, readout=readout)
    if terms:
        y = y + 0.3 + X[..., -1 if readout == "last" else slice(None), :] @ np.r_[1.0, -2.0, 0.5]
    kw = dict(fit_intercept=True, fit_skip=True) if terms else {}
    return LAR(readout=readout, **kw).fit(X, y)


def _to_torch_padded(readout="last", terms=False, dtype="float64", mask=False):
    def call(tmp):
        import torch

        model = _fitted_for_torch(readout, terms)
        layer = _nn().to_torch(model, dtype=_torch_dtype(dtype))
        X = _padded_batch()
        x = torch.as_tensor(X, dtype=_torch_dtype(dtype))
        m = torch.as_tensor(~np.isnan(X).all(axis=2)) if mask else None
        out = layer(x, mask=m).detach().double().numpy()[..., 0]
        return out, model.predict(X), dtype, mask
    return call


def _to_torch_padded_check(r):
    out, pred, dtype, mask = r
    expect(out.shape == pred.shape, f"shape {out.shape}, predict gives {pred.shape}")
    pad = np.isnan(pred)
    if mask:  # the mask pads with zeros, NaN padding with NaN
        expect(bool(np.all(out[pad] == 0)), "masked positions are not zero")
    else:
        expect(bool(np.array_equal(np.isnan(out), pad)), "NaN where predict has none, or not")
    e = rel(out[~pad], pred[~pad])
    tol = 1e-6 if dtype == "float32" else 1e-12
    expect(e <= tol, f"layer differs from predict by {e:.3g} > {tol:g}")


for _name, _kw in {
    "last": {}, "all": {"readout": "all"}, "intercept_and_skip": {"terms": True},
    "all_intercept_and_skip": {"readout": "all", "terms": True},
    "float32": {"dtype": "float32"}, "mask_and_nan": {"readout": "all", "mask": True},
}.items():
    add(f"to_torch_nan_padded_batch_{_name}", "nn.to_torch", _to_torch_padded(**_kw),
        check=_to_torch_padded_check, names=DEFAULT_NAMES, requires=_TORCH)


def _to_torch_input(make_x, readout="last"):
    def call(tmp):
        layer = _nn().to_torch(_fitted_for_torch(readout))
        return layer(make_x())
    return call


def _x_with(index, value):
    def make():
        import torch

        X = _padded_batch()
        X[index] = value
        return torch.as_tensor(X)
    return make


for _name, (_make, _pat) in {
    "nan_hole": (_x_with((5, 2), np.nan), r"x\[5, 2\]"),
    "partly_nan_token": (_x_with((5, 2, 1), np.nan), r"x\[5, 2\]"),
    "empty_sequence": (_x_with((6,), np.nan), r"x\[6\]"),
    "numpy_array": (_padded_batch, r"\bx\b"),
    "float32_tensor": (lambda: _x_with((0, 0, 0), 0.0)().float(), both(r"\bx\b", "dtype")),
    "two_dimensional": (lambda: _x_with((0, 0, 0), 0.0)()[:, :, 0], r"\bx\b"),
}.items():
    add(f"to_torch_input_{_name}", "nn.to_torch", _to_torch_input(_make), error=err(_pat),
        requires=_TORCH)


def _to_torch_inf(tmp):
    import torch

    model = _fitted_for_torch()
    X = _padded_batch()
    X[2, 1, 0] = np.inf
    out = _nn().to_torch(model)(torch.as_tensor(X)).detach().numpy()[:, 0]
    X[2] = 0.0
    return out, model.predict(X)


def _to_torch_inf_check(r):
    out, pred = r
    others = np.arange(len(out)) != 2
    expect(bool(np.all(np.isfinite(out[others]))), "an infinite token changed other sequences")
    expect(rel(out[others], pred[others]) <= 1e-12, "the other sequences' outputs are wrong")


add("to_torch_input_infinite_token_stays_in_its_sequence", "nn.to_torch", _to_torch_inf,
    check=_to_torch_inf_check, error=err(r"\bx\b"), requires=_TORCH)


def _to_torch_overflow(tmp):
    import torch

    model = _fitted_for_torch()
    X = _padded_batch()
    unit = model.predict(X)
    out = _nn().to_torch(model)(torch.as_tensor(X * 1e120)).detach().numpy()[:, 0]
    return out, unit


def _to_torch_overflow_check(r):
    out, unit = r  # the outputs are 1e360 times the unit-scale ones: all beyond float64
    expect(not np.any(np.isnan(out)), "NaN (the padding marker) at real positions")
    expect(bool(np.all(np.isinf(out) & (np.sign(out) == np.sign(unit)))),
           "finite or wrongly signed outputs where every output overflows")


add("to_torch_outputs_overflow", "nn.to_torch", _to_torch_overflow,
    check=_to_torch_overflow_check, error=err(r"\bx\b"), defect=16,
    requires=_TORCH)


def _to_torch_empty_batch(readout):
    def call(tmp):
        import torch

        layer = _nn().to_torch(_fitted_for_torch(readout))
        return readout, tuple(layer(torch.zeros(0, 5, 3, dtype=torch.float64)).shape)
    return call


def _to_torch_empty_batch_check(r):
    readout, shape = r
    want = (0, 1) if readout == "last" else (0, 5, 1)
    expect(shape == want, f"an empty batch gives shape {shape}, expected {want}")


for _readout in ("last", "all"):
    add(f"to_torch_empty_batch_{_readout}", "nn.to_torch", _to_torch_empty_batch(_readout),
        check=_to_torch_empty_batch_check, error=err(r"\bx\b|batch"), defect=15,
        requires=_TORCH)


def _to_torch_with(**kw):
    def call(tmp):
        return _nn().to_torch(_fitted_for_torch(), **kw)
    return call


def _tampered(tmp):
    model = _fitted_for_torch()
    model.value_matrices_ = model.value_matrices_.copy()
    model.value_matrices_[0, 0, 1] = np.nan
    return _nn().to_torch(model)


add("to_torch_dtype_float16", "nn.to_torch",
    lambda tmp: _nn().to_torch(_fitted_for_torch(), dtype=_torch_dtype("float16")),
    error=err(r"\bdtype\b"), requires=_TORCH)
add("to_torch_d_k_zero", "nn.to_torch", _to_torch_with(d_k=0), error=err(r"\bd_k\b"),
    requires=_TORCH)
add("to_torch_nan_fitted_attribute", "nn.to_torch", _tampered,
    error=err(r"value_matrices_"), requires=_TORCH)


def _to_torch_gradient(tmp):
    import torch

    layer = _nn().to_torch(_fitted_for_torch("all"))
    x = torch.as_tensor(_padded_batch()).requires_grad_()
    out = layer(x)
    out[~torch.isnan(out)].sum().backward()
    return x.detach().numpy(), x.grad.numpy()


def _to_torch_gradient_check(r):
    X, grad = r
    real = ~np.isnan(X)
    expect(bool(np.all(np.isfinite(grad[real]))), "NaN or inf gradient at real tokens")
    expect(bool(np.any(grad[real] != 0)), "zero gradient everywhere")


add("to_torch_gradient_through_nan_padding", "nn.to_torch", _to_torch_gradient,
    check=_to_torch_gradient_check, names=DEFAULT_NAMES, requires=_TORCH)


# --- compare_to_optimum ---------------------------------------------------------


def _trained(seed=0):
    """(X, y, V, Q): data of a teacher and heads near it (a briefly trained model)."""
    X, y, V0, Q0, _ = realizable(150, 6, 3, n_heads=2, seed=seed)
    rng = np.random.default_rng(seed + 7)
    return X, y, V0 + 0.01 * rng.normal(size=V0.shape), Q0 + 0.01 * rng.normal(size=Q0.shape)


def _report_numbers(r):
    return dict(p_distance=r.p_distance, relative_p_distance=r.relative_p_distance,
                risk=r.risk, optimal_risk=r.optimal_risk, excess_risk=r.excess_risk,
                training_distance=r.training_distance, certificate=bool(r.certificate))


def _compare_scaled(c=None, A=None):
    """The report on X * c (or X @ A) with the same function: heads in the data's units."""
    def call(tmp):
        X, y, V, Q = _trained()
        unit = _report_numbers(pkg().compare_to_optimum((V, Q), X, y))
        if A is None:
            Xs, Vs, Qs = X * c, V * c**-3, Q
        else:
            Ai = np.linalg.inv(A)
            Xs, Vs, Qs = X @ A, V @ Ai.T, Ai @ Q @ Ai.T
        return unit, _report_numbers(pkg().compare_to_optimum((Vs, Qs), Xs, y)), c
    return call


def _compare_scaled_check(r):
    unit, scaled, c = r
    expect(scaled["certificate"] == unit["certificate"] is True, "certificate changed")
    for key in ("risk", "optimal_risk", "excess_risk", "training_distance"):
        # optimal_risk is rounding (about 1e-31 here): only its size is meaningful
        tol = 1e-8 if key != "optimal_risk" else None
        if tol is None:
            expect(scaled[key] <= 1e-20, f"optimal_risk {scaled[key]:.3g} on exact data")
            continue
        e = abs(scaled[key] - unit[key]) / unit[key]
        expect(e <= tol, f"{key} {scaled[key]:.6g} at the new scale, {unit[key]:.6g} at unit scale")
    if c is not None:  # per-coordinate units change the norm of p: compare only overall scales
        for key, power in (("p_distance", -3), ("relative_p_distance", 0)):
            e = abs(scaled[key] / c**power - unit[key]) / unit[key]
            expect(e <= 1e-8, f"{key} {scaled[key]:.6g}, expected {unit[key] * c**power:.6g}")


for _c in (1e-100, 1e100):
    add(f"compare_to_optimum_scale_{_c:.0e}", "compare_to_optimum", _compare_scaled(c=_c),
        check=_compare_scaled_check, names=DEFAULT_NAMES)
add("compare_to_optimum_units_1e80_1e-80_1", "compare_to_optimum",
    _compare_scaled(A=np.diag([1e80, 1e-80, 1.0])), check=_compare_scaled_check,
    names=DEFAULT_NAMES)


def _compare_with(model=None, X=None, y=None, **kw):
    def call(tmp):
        X0, y0, V, Q = _trained()
        m = (V, Q) if model is None else model(V, Q)
        Xa = X0 if X is None else X(X0)
        ya = y0 if y is None else y(y0)
        return pkg().compare_to_optimum(m, Xa, ya, **kw)
    return call


for _c in (1e-100, 1e100):
    # Targets that scale with X (y * c**3): every risk is c**6 times, beyond float64.
    add(f"compare_to_optimum_risks_beyond_float64_{_c:.0e}", "compare_to_optimum",
        _compare_with(X=lambda X, c=_c: X * c, y=lambda y, c=_c: y * c**3),
        error=err(r"\brisk\b|excess_risk|optimal_risk"))


def _compare_zero_heads_check(r):
    expect(abs(r.relative_p_distance - 1.0) <= 1e-12,
           f"relative_p_distance {r.relative_p_distance} for zero heads (expected 1)")
    expect(abs(r.excess_risk - (r.risk - r.optimal_risk)) <= 1e-12 * r.risk,
           "excess_risk != risk - optimal_risk")
    expect(bool(r.certificate), "generic data not certified")


add("compare_to_optimum_zero_heads", "compare_to_optimum",
    _compare_with(model=lambda V, Q: (0 * V, Q)), check=_compare_zero_heads_check,
    names=DEFAULT_NAMES)


def _compare_weights(w):
    def call(tmp):
        X, y, V, Q = _trained()
        return (_report_numbers(pkg().compare_to_optimum((V, Q), X, y)),
                _report_numbers(pkg().compare_to_optimum((V, Q), X, y,
                                                         sample_weight=np.full(len(y), w))), None)
    return call


for _w in (1e-300, 1e300):
    add(f"compare_to_optimum_uniform_weights_{_w:.0e}", "compare_to_optimum",
        _compare_weights(_w), check=_compare_scaled_check, names=DEFAULT_NAMES)

for _name, (_kw, _pat) in {
    "zero_weights": ({"sample_weight": np.zeros(150)}, r"sample.weight"),
    "tokens_of_other_d": ({"X": lambda X: np.concatenate([X, X[..., :1]], axis=2)},
                          r"\bX\b|\bd\b"),
    "heads_count_mismatch": ({"model": lambda V, Q: (V, Q[:1])}, r"\bV\b|\bQ\b"),
    "more_outputs_than_heads": ({"y": lambda y: np.stack([y, y], axis=1)}, r"\by\b|d_out"),
    "intercept_shape": ({"intercept": np.zeros(3)}, r"\bintercept\b"),
    "skip_coef_shape": ({"skip_coef": np.zeros((3, 3))}, r"skip_coef"),
    "not_a_model": ({"model": lambda V, Q: "heads"}, r"\bmodel\b"),
    "nan_heads": ({"model": lambda V, Q: (V * np.nan, Q)}, r"\bV\b"),
    "readout_contradicts_y": ({"readout": "all"}, r"\by\b|readout"),
}.items():
    add(f"compare_to_optimum_{_name}", "compare_to_optimum", _compare_with(**_kw),
        error=err(_pat))


def _compare_roundtrip(tmp):
    X, y, V, Q, _ = realizable(200, 6, 3, n_heads=2, seed=0)
    y = y + 0.3 + X[:, -1] @ np.r_[1.0, -2.0, 0.5]
    model = LAR(fit_intercept=True, fit_skip=True).fit(X, y)
    heads = _nn().from_torch(_nn().to_torch(model))
    return pkg().compare_to_optimum(heads, X, y)


add("compare_to_optimum_of_its_own_optimum_through_torch", "compare_to_optimum",
    _compare_roundtrip,
    check=lambda r: expect(r.relative_p_distance <= 1e-10 and bool(r.certificate),
                           f"relative_p_distance {r.relative_p_distance:.3g}"),
    names=DEFAULT_NAMES, requires=_TORCH)


# --- fit_heads and certify_heads_locally ---------------------------------------


def _few(n=19, seed=0):
    """One head at d = 4 (20 parameters, one symmetry) and n sequences: 19 identify it
    locally; 30 (fit_heads' own example) give the generator, also on new inputs."""
    rng = np.random.default_rng(seed)
    V, Q = rng.normal(size=(1, 1, 4)), rng.normal(size=(1, 4, 4))
    return rng.normal(size=(n, 10, 4)), V, Q


def _local(transform):
    """Verdicts on 18 and on 19 sequences after ``transform(X, V, Q)`` (18: False, 19: True)."""
    def call(tmp):
        X, V, Q = _few()
        C = pkg().certify_heads_locally
        Xt, Vt, Qt = transform(X, V, Q)
        return bool(C(Xt[:18], Vt, Qt)), bool(C(Xt, Vt, Qt))
    return call


def _local_check(r):
    expect(r == (False, True), f"verdicts {r} on 18 and 19 sequences, expected (False, True)")


_UNITS4 = np.diag([1e80, 1e-80, 1.0, 1.0])
_UNITS4_INV = np.diag([1e-80, 1e80, 1.0, 1.0])
for _name, _t in {
    "balance_V_1e-30_Q_1e30": lambda X, V, Q: (X, V * 1e-30, Q * 1e30),
    "balance_V_1e30_Q_1e-30": lambda X, V, Q: (X, V * 1e30, Q * 1e-30),
    "balance_V_1e-150_Q_1e150": lambda X, V, Q: (X, V * 1e-150, Q * 1e150),
    "balance_V_1e150_Q_1e-150": lambda X, V, Q: (X, V * 1e150, Q * 1e-150),
    "X_1e-100": lambda X, V, Q: (X * 1e-100, V, Q),
    "X_1e100": lambda X, V, Q: (X * 1e100, V, Q),
    "X_1e-100_same_function": lambda X, V, Q: (X * 1e-100, V * 1e100, Q * 1e200),
    "X_1e100_same_function": lambda X, V, Q: (X * 1e100, V * 1e-100, Q * 1e-200),
    "units_1e80_1e-80_same_function": lambda X, V, Q: (
        X @ _UNITS4, V @ _UNITS4_INV, _UNITS4_INV @ Q @ _UNITS4_INV),
}.items():
    add(f"certify_heads_locally_{_name}", "certify_heads_locally", _local(_t),
        check=_local_check, names=DEFAULT_NAMES)


def _local_with(V=None, Q=None, X=None, **kw):
    def call(tmp):
        X0, V0, Q0 = _few()
        return pkg().certify_heads_locally(
            X0 if X is None else X(X0), V0 if V is None else V(V0), Q0 if Q is None else Q(Q0),
            **kw)
    return call


def _degenerate_check(r):
    expect(not r, "a certificate holds at degenerate heads")
    expect(r.reason is not None and "degenerate" in r.reason, f"reason {r.reason!r}")


add("certify_heads_locally_V_and_Q_zero", "certify_heads_locally",
    _local_with(V=lambda V: 0 * V, Q=lambda Q: 0 * Q), check=_degenerate_check,
    names=DEFAULT_NAMES)
add("certify_heads_locally_two_equal_heads", "certify_heads_locally",
    _local_with(V=lambda V: np.concatenate([V, V]), Q=lambda Q: np.concatenate([Q, Q])),
    check=lambda r: expect(not r and "singular" in (r.reason or ""), f"{r!r}"),
    names=DEFAULT_NAMES)
add("certify_heads_locally_zero_weight_drops_a_sequence", "certify_heads_locally",
    _local_with(sample_weight=np.r_[np.ones(18), 0.0]),
    check=lambda r: expect(not r, "19 sequences, one of weight zero, certified"),
    names=DEFAULT_NAMES)
for _name, (_kw, _pat) in {
    "all_zero_sample_weight": ({"sample_weight": np.zeros(19)}, r"sample.weight"),
    "nan_sample_weight": ({"sample_weight": np.r_[np.nan, np.ones(18)]}, r"sample.weight"),
    "nan_V": ({"V": lambda V: V * np.nan}, r"\bV\b"),
    "tokens_of_other_d": ({"X": lambda X: X[..., :3]}, r"\bX\b|\bd\b"),
    "a_million_heads": ({"V": lambda V: np.zeros((10**6, 1, 4)),
                         "Q": lambda Q: np.zeros((10**6, 4, 4))}, r"memory|GiB|heads"),
}.items():
    add(f"certify_heads_locally_{_name}", "certify_heads_locally", _local_with(**_kw),
        error=err(_pat), memory_mb=2048)


def _fit_heads(X=None, y=None, n_heads=1, **kw):
    def call(tmp):
        X0, V, Q = _few(30)
        Xt = np.random.default_rng(3).normal(size=(20, 15, 4))
        y0 = ref_forward(X0, V, Q)[..., 0]
        Xa = X0 if X is None else X(X0)
        ya = y0 if y is None else y(y0)
        fit = pkg().fit_heads(Xa, ya, n_heads, random_state=0, **kw)
        return fit, Xt, truth(Xt, V, Q), X, y
    return call


def _fit_heads_check(r):
    fit, Xt, yt, X, y = r
    expect(fit.residual <= 1e-9, f"residual {fit.residual:.3g} on exactly realizable data")
    expect(bool(fit.certificate), f"certificate: {fit.certificate!r}")
    # Predictions on new, longer inputs, in the units of the fit, by the reference forward
    # pass (mhla_forward loses mixed units: see mhla_forward_units_1e70_1e-70).
    Xs = Xt if X is None else X(Xt)
    ys = yt if y is None else y(yt)
    p = ref_forward(Xs, fit.V, fit.Q)[..., 0]
    e = rel(p, ys)
    expect(e <= 1e-7, f"relative error on new inputs {e:.3g}")


for _name, _kw in {
    "unit_scale": {},
    "X_1e-100": {"X": lambda X: X * 1e-100}, "X_1e100": {"X": lambda X: X * 1e100},
    "y_1e-100": {"y": lambda y: y * 1e-100}, "y_1e100": {"y": lambda y: y * 1e100},
    "units_1e80_1e-80": {"X": lambda X: X @ _UNITS4},
}.items():
    add(f"fit_heads_{_name}", "fit_heads", _fit_heads(**_kw), check=_fit_heads_check,
        names=DEFAULT_NAMES)


def _fit_heads_zero_check(r):
    fit = r[0]
    expect(fit.residual == 0 or fit.residual <= 1e-300, f"residual {fit.residual}")
    expect(finite(fit.V) and finite(fit.Q), "non-finite heads")
    expect(not np.any(ref_forward(r[1], fit.V, fit.Q)), "zero targets, non-zero predictions")
    expect(not fit.certificate, "a certificate holds at the zero function")


add("fit_heads_zero_targets", "fit_heads", _fit_heads(y=lambda y: 0 * y),
    check=_fit_heads_zero_check, names=DEFAULT_NAMES)
for _name, (_kw, _pat) in {
    "all_zero_sample_weight": ({"sample_weight": np.zeros(30)}, r"sample.weight"),
    "negative_sample_weight": ({"sample_weight": np.r_[-1.0, np.ones(29)]}, r"sample.weight"),
    "n_heads_zero": ({"n_heads": 0}, r"n_heads"),
    "n_init_zero": ({"n_init": 0}, r"n_init"),
    "tol_nan": ({"tol": math.nan}, r"\btol\b"),
    "certify_one": ({"certify": 1}, r"certify"),
    "nan_target": ({"y": _setv(4, np.nan)}, r"\by\b"),
    "a_billion_heads": ({"n_heads": 10**9, "n_init": 1, "max_iter": 1},
                        r"memory|GiB|heads"),
}.items():
    add(f"fit_heads_{_name}", "fit_heads", _fit_heads(**_kw), error=err(_pat))


def _forward_units(a):
    def call(tmp):
        X, V, Q = _few(30)
        A, Ai = np.diag([a, 1 / a, 1.0, 1.0]), np.diag([1 / a, a, 1.0, 1.0])
        # The same function in other units: every entry representable, outputs of order 1.
        return pkg().mhla_forward(X @ A, V @ Ai, Ai @ Q @ Ai), ref_forward(X, V, Q)
    return call


def _forward_units_check(r):
    out, want = r
    expect(finite(out), "NaN or inf outputs")
    e = rel(out, want)
    expect(e <= 1e-12, f"relative error {e:.3g} against the same function in unit coordinates")


add("mhla_forward_units_1e60_1e-60", "mhla_forward", _forward_units(1e60),
    check=_forward_units_check, names=DEFAULT_NAMES)
add("mhla_forward_units_1e70_1e-70", "mhla_forward", _forward_units(1e70),
    check=_forward_units_check, error=err(r"\bX\b|\bV\b|\bQ\b"), defect=18)


# --- design: learn_from_oracle and identifying_design ---------------------------


def _oracle_heads():
    rng = np.random.default_rng(0)
    return rng.normal(size=(2, 1, 2)), rng.normal(size=(2, 2, 2))


def _learn(oracle, d=2, **kw):
    """learn_from_oracle on the unoptimized design (max_iter=0) unless told otherwise."""
    def call(tmp):
        from sklearn_linattn.design import learn_from_oracle

        V, Q = _oracle_heads()
        kw.setdefault("max_iter", 0)
        kw.setdefault("n_tokens", 3)
        return learn_from_oracle(oracle(V, Q), d, random_state=0, **kw), V, Q
    return call


def _exact(V, Q, readout="last"):
    return lambda X: ref_forward(X, V, Q, readout)[..., 0]


def _learned_check(r):
    fit, V, Q = r
    expect(bool(fit.model.certificate_), "the design's certificate does not hold")
    Xt = np.random.default_rng(9).normal(size=(6, 12, 2))
    readout = fit.model.readout
    e = rel(fit.model.predict(Xt), truth(Xt, V, Q, readout))
    expect(e <= 1e-8, f"relative error on long inputs {e:.3g}")


def _returns(value):
    return lambda V, Q: (lambda X: value(X) if callable(value) else value)


def _raising(V, Q):
    def oracle(X):
        raise RuntimeError("the oracle's own failure")
    return oracle


def _vandal(V, Q):
    def oracle(X):
        y = ref_forward(X, V, Q)[..., 0]
        X[:] = np.nan  # writes into the queries it was given
        return y
    return oracle


def _torch_answers(V, Q):
    import torch

    return lambda X: torch.as_tensor(ref_forward(X, V, Q)[..., 0]).requires_grad_()


def _changing_outputs(V, Q):
    calls = []

    def oracle(X):
        calls.append(len(X))
        return np.zeros((len(X), 1 if len(calls) == 1 else 2))
    return oracle


for _name, (_oracle, _kw) in {
    "exact": (lambda V, Q: _exact(V, Q), {}),
    "exact_readout_all": (lambda V, Q: _exact(V, Q, "all"), {"readout": "all"}),
    "exact_optimized_design": (lambda V, Q: _exact(V, Q), {"max_iter": 20}),
    "writes_into_its_queries": (_vandal, {}),
}.items():
    add(f"learn_from_oracle_{_name}", "design.learn_from_oracle", _learn(_oracle, **_kw),
        check=_learned_check, names=DEFAULT_NAMES)


def _integer_answers_check(r):  # answers rounded to 1e-6 of their size: checked at that
    fit, V, Q = r
    Xt = np.random.default_rng(9).normal(size=(6, 12, 2))
    e = rel(fit.model.predict(Xt) / 1e6, truth(Xt, V, Q))
    expect(bool(fit.model.certificate_) and e <= 1e-5, f"relative error {e:.3g}")


add("learn_from_oracle_integer_answers", "design.learn_from_oracle",
    _learn(lambda V, Q: (lambda X: np.rint(1e6 * _exact(V, Q)(X)).astype(np.int64))),
    check=_integer_answers_check, names=DEFAULT_NAMES)
add("learn_from_oracle_torch_tensor_answers", "design.learn_from_oracle",
    _learn(_torch_answers), check=_learned_check, names=DEFAULT_NAMES, requires=_TORCH)

for _name, (_oracle, _kw, _pat) in {
    "nan_answers": (_returns(lambda X: np.full(len(X), np.nan)), {}, r"oracle"),
    "one_nan_answer": (lambda V, Q: (lambda X: np.where(np.arange(len(X)) == 2, np.nan,
                                                         _exact(V, Q)(X))), {}, r"oracle"),
    "infinite_answers": (_returns(lambda X: np.full(len(X), np.inf)), {}, r"oracle"),
    "one_answer_too_many": (_returns(lambda X: np.zeros(len(X) + 1)), {}, r"oracle"),
    "answers_per_position_for_last": (_returns(lambda X: np.zeros(X.shape[:2] + (2,))), {},
                                      r"oracle"),
    "scalar_answer": (_returns(1.0), {}, r"oracle"),
    "none_answer": (_returns(None), {}, r"oracle"),
    "string_answers": (_returns(lambda X: ["a"] * len(X)), {}, r"oracle"),
    "object_answers": (_returns(lambda X: np.array([object()] * len(X))), {}, r"oracle"),
    "d_out_mismatch": (lambda V, Q: _exact(V, Q), {"d_out": 2}, r"oracle|d_out"),
    "changes_its_number_of_outputs": (_changing_outputs, {"tol": 1e-3}, r"oracle|d_out"),
    "not_callable": (lambda V, Q: 3, {}, r"oracle"),
    "max_queries_below_the_design": (lambda V, Q: _exact(V, Q), {"max_queries": 2},
                                     r"max_queries"),
    "max_queries_without_room_for_checks": (lambda V, Q: _exact(V, Q),
                                            {"max_queries": 6, "tol": 1e-3}, r"max_queries"),
    "tol_zero": (lambda V, Q: _exact(V, Q), {"tol": 0.0}, r"\btol\b"),
    "X_eval_of_other_d": (lambda V, Q: _exact(V, Q), {"tol": 1e-3,
                                                      "X_eval": np.zeros((2, 3, 3))}, r"X_eval"),
    "one_token_queries": (lambda V, Q: _exact(V, Q), {"n_tokens": 1}, r"n_tokens"),
}.items():
    add(f"learn_from_oracle_{_name}", "design.learn_from_oracle", _learn(_oracle, **_kw),
        error=err(_pat))
add("learn_from_oracle_oracle_raises", "design.learn_from_oracle", _learn(_raising),
    error=err(r"the oracle's own failure", (RuntimeError,)),
    note="the user's own exception, unchanged")
add("learn_from_oracle_complex_answers", "design.learn_from_oracle",
    _learn(lambda V, Q: (lambda X: _exact(V, Q)(X) + 1j)), error=err(r"oracle"),
    defect=17)


def _noisy(tmp):
    from sklearn_linattn.design import learn_from_oracle

    V, Q = _oracle_heads()
    rng = np.random.default_rng(4)
    fit = learn_from_oracle(lambda X: ref_forward(X, V, Q)[..., 0] + 0.1 * rng.normal(size=len(X)),
                            2, n_tokens=3, tol=1e-6, max_queries=20, max_iter=0, random_state=0)
    return fit


add("learn_from_oracle_noisy_with_a_tight_budget", "design.learn_from_oracle", _noisy,
    check=lambda f: expect(not f.converged and f.n_queries <= 20 and f.error_bound > 1e-6,
                           f"converged={f.converged}, n_queries={f.n_queries}, "
                           f"error_bound={f.error_bound:.3g}"),
    names=DEFAULT_NAMES)


def _not_attention(tmp):
    from sklearn_linattn.design import learn_from_oracle

    V, Q = _oracle_heads()
    return learn_from_oracle(lambda X: np.tanh(ref_forward(X, V, Q)[..., 0]), 2, n_tokens=3,
                             n_check=3, max_iter=0, random_state=0)


add("learn_from_oracle_deterministic_but_not_attention", "design.learn_from_oracle",
    _not_attention,
    check=lambda f: expect(f.linear_attention is False, f"linear_attention={f.linear_attention}"),
    names=DEFAULT_NAMES)


def _design(d=2, **kw):
    def call(tmp):
        from sklearn_linattn.design import identifying_design

        kw.setdefault("n_tokens", 3)
        return identifying_design(d, random_state=0, **kw), kw.get("readout", "last")
    return call


def _design_check(r):
    X, readout = r
    H = ref_features(X) if readout == "last" else np.concatenate(
        [ref_features(X[:, : t + 1]) for t in range(X.shape[1])])
    expect(int(np.linalg.matrix_rank(H)) == psi(X.shape[2]),
           "the design does not identify the model (reference rank)")
    expect(bool(pkg().certify_identifiability(X, readout=readout)), "certificate fails")


for _name, _kw in {
    "unoptimized": {"max_iter": 0}, "one_token_d1": {"d": 1, "n_tokens": 1, "max_iter": 0},
    "readout_all": {"readout": "all", "max_iter": 5},
    "more_samples_than_needed": {"n_samples": 9, "max_iter": 2},
}.items():
    add(f"identifying_design_{_name}", "design.identifying_design", _design(**_kw),
        check=_design_check, names=DEFAULT_NAMES)
for _name, (_kw, _pat) in {
    "n_samples_below_minimum": ({"n_samples": 2}, r"n_samples"),
    "d_zero": ({"d": 0}, r"\bd\b"),
    "one_token_for_d2": ({"n_tokens": 1}, r"n_tokens"),
    "d_300": ({"d": 300}, r"memory|GiB"),
    "max_iter_negative": ({"max_iter": -1}, r"max_iter"),
    "n_samples_float": ({"n_samples": 6.0}, r"n_samples"),
    "readout_bogus": ({"readout": "first"}, r"readout"),
}.items():
    add(f"identifying_design_{_name}", "design.identifying_design", _design(**_kw),
        error=err(_pat), memory_mb=2048)


# --- repair_certificate ---------------------------------------------------------


def _deficient_and_pool(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(60, 5, 3))
    X[:, :, 2] = 0.0  # rank 6 of psi = 18
    return X, rng.normal(size=(40, 5, 3))


def _repair(X=None, pool=None, **kw):
    def call(tmp):
        X0, P0 = _deficient_and_pool()
        Xa = X0 if X is None else X(X0)
        Pa = P0 if pool is None else pool(P0)
        return pkg().repair_certificate(Xa, Pa, **kw), Xa, Pa
    return call


def _union_rank(X, added):
    """Reference rank of the features of X and the added sequences (NaN padding kept)."""
    if X.shape[1:] != added.shape[1:]:
        return None
    return int(np.linalg.matrix_rank(ref_features(np.concatenate([X, added]))))


def _repaired_check(r):
    res, X, pool = r
    expect(res.reached and bool(res.certificate), f"not repaired: {res!r}")
    expect(res.n_added == 12, f"{res.n_added} sequences added, the fewest is psi - rank = 12")
    if not callable(pool) and res.indices is not None:
        expect(bool(np.array_equal(pool[res.indices], res.added, equal_nan=True)),
               "indices do not match added")
    added = np.asarray(res.added, dtype=np.float64)
    rank = _union_rank(X / np.nanmax(np.abs(X)), added / np.nanmax(np.abs(added)))
    expect(rank is None or rank == 18, f"the union has reference rank {rank} < 18")


def _generator(d=3, n_tokens=5, nan_hole=False):
    def generate(k, rng):
        Z = rng.normal(size=(k, n_tokens, d))
        if nan_hole:
            Z[0, 1] = np.nan
        return Z
    return generate


for _name, _kw in {
    "gaussian_pool": {}, "generator": {"pool": lambda P: _generator(), "random_state": 0},
    "at_1e100": {"X": lambda X: X * 1e100, "pool": lambda P: P * 1e100},
    "at_1e-100": {"X": lambda X: X * 1e-100, "pool": lambda P: P * 1e-100},
    "padded_pool": {"pool": lambda P: np.where(
        (np.arange(5)[None, :, None] >= 3) & (np.arange(40)[:, None, None] % 2 == 0), np.nan, P)},
}.items():
    add(f"repair_certificate_{_name}", "repair_certificate", _repair(**_kw),
        check=_repaired_check, names=DEFAULT_NAMES)


def _repair_pool_far(r):
    res, X, pool = r
    # Sequences 1e100 times larger: exactly an identifying union, but its Gram matrix spans
    # 1e600; a claim must be right, a refusal to claim is honest.
    expect(res.reached == bool(res.certificate), f"reached={res.reached}, {res.certificate!r}")
    if res.reached:
        added = np.asarray(res.added) / 1e100
        expect(_union_rank(X, added) == 18, "claimed a repair that does not identify")


add("repair_certificate_pool_1e100_times_the_data", "repair_certificate",
    _repair(pool=lambda P: P * 1e100), check=_repair_pool_far, names=DEFAULT_NAMES)
add("repair_certificate_empty_pool", "repair_certificate", _repair(pool=lambda P: P[:0]),
    check=lambda r: expect(not r[0].reached and r[0].n_added == 0, f"{r[0]!r}"),
    error=err(r"candidates"))
add("repair_certificate_pool_that_cannot_repair", "repair_certificate",
    _repair(pool=lambda P: np.concatenate([P[:, :, :2], 0 * P[:, :, 2:]], axis=2)),
    check=lambda r: expect(not r[0].reached and r[0].null_dimension == 12
                           and not r[0].certificate, f"{r[0]!r}"),
    names=DEFAULT_NAMES)
add("repair_certificate_already_identifiable", "repair_certificate",
    _repair(X=lambda X: _deficient_and_pool(1)[1]),
    check=lambda r: expect(r[0].reached and r[0].n_added == 0, f"{r[0]!r}"),
    names=DEFAULT_NAMES)
add("repair_certificate_max_added_zero", "repair_certificate", _repair(max_added=0),
    check=lambda r: expect(not r[0].reached and r[0].n_added == 0, f"{r[0]!r}"),
    error=err(r"max_added"))


def _raising_generator(k, rng):
    raise RuntimeError("the generator's own failure")


for _name, (_kw, _pat) in {
    "candidates_of_other_d": ({"pool": lambda P: P[..., :2]}, r"candidates"),
    "generator_of_other_d": ({"pool": lambda P: _generator(d=2)}, r"candidates"),
    "generator_with_a_nan_hole": ({"pool": lambda P: _generator(nan_hole=True)},
                                  r"candidates"),
    "generator_returns_nothing": ({"pool": lambda P: (lambda k, rng: np.zeros((0, 5, 3)))},
                                  r"candidates"),
    "candidates_string": ({"pool": lambda P: "abc"}, r"candidates"),
    "candidates_with_a_nan_hole": ({"pool": _setv((0, 1), np.nan)}, r"candidates"),
    "target_of_other_d": ({"target": np.zeros((2, 5, 2))}, r"\btarget\b"),
    "max_added_negative": ({"max_added": -1}, r"max_added"),
}.items():
    add(f"repair_certificate_{_name}", "repair_certificate", _repair(**_kw), error=err(_pat))
add("repair_certificate_generator_raises", "repair_certificate",
    _repair(pool=lambda P: _raising_generator),
    error=err(r"the generator's own failure", (RuntimeError,)),
    note="the user's own exception, unchanged")


# --- intercept and skip terms at extreme scales and in mixed units ---------------

_TERMS = dict(fit_intercept=True, fit_skip=True)
_TERM_B, _TERM_S = 0.7, np.array([1.0, -2.0, 0.5])
_TERM_SCALES = {"1e-100": 1e-100, "1e100": 1e100,
                "units_1e80_1e-80_1": np.array([1e80, 1e-80, 1.0])}
_TERMS_FIT = "LinearAttentionRegressor(fit_intercept, fit_skip).fit"
_TERMS_CERTIFY = "certify_identifiability(fit_intercept, fit_skip)"


def _terms_data(seed=0):
    X, y, V, Q, Xt = realizable(200, 6, 3, n_heads=2, seed=seed)
    f = lambda Z: truth(Z, V, Q) + _TERM_B + Z[:, -1] @ _TERM_S  # noqa: E731
    return X, f(X), Xt, f(Xt)


def _terms_fit(solver, scale):
    def call(tmp):
        X, y, Xt, yt = _terms_data()
        model = LAR(solver=solver, **_TERMS).fit(X * scale, y)  # targets in their own units
        return model, model.predict(Xt * scale), yt, solver, np.broadcast_to(scale, (3,))
    return call


def _terms_fit_check(r):
    model, p, yt, solver, scale = r
    tol = 1e-6 if solver in ("cg", "lsmr") else 1e-9
    expect(bool(model.certificate_), "generic data with terms not certified")
    expect(finite(p), "predictions contain NaN or inf")
    e = rel(p, yt)
    expect(e <= tol, f"relative error on new inputs {e:.3g} > {tol:g}")
    expect(abs(float(np.ravel(model.intercept_)[0]) - _TERM_B) <= tol * 10,
           f"intercept_ {model.intercept_}, expected {_TERM_B}")
    e = rel(np.ravel(model.skip_coef_) * scale, _TERM_S)
    expect(e <= tol * 10, f"skip_coef_ off by {e:.3g} (in the tokens' units)")


def _terms_certify(solver, scale, **terms):
    def call(tmp):
        X = _terms_data()[0]
        C = pkg().certify_identifiability
        return bool(C(X * scale, solver=solver)), bool(C(X * scale, solver=solver,
                                                         **(terms or _TERMS)))
    return call


def _terms_certify_check(r):
    expect(r == (True, True), f"verdicts without and with terms {r}, expected (True, True)")


for _solver in SOLVERS6:
    for _name, _scale in _TERM_SCALES.items():
        _open = dict(defect=13) if _name.startswith("units") else {}
        add(f"terms_fit_{_name}_{_solver}", _TERMS_FIT,
            _terms_fit(_solver, _scale), check=_terms_fit_check, names=DEFAULT_NAMES, **_open)
        add(f"terms_certify_{_name}_{_solver}", _TERMS_CERTIFY,
            _terms_certify(_solver, _scale), check=_terms_certify_check, names=DEFAULT_NAMES,
            **_open)
add("terms_certify_units_1e80_1e-80_1_skip_only", _TERMS_CERTIFY,
    _terms_certify("eigh", _TERM_SCALES["units_1e80_1e-80_1"], fit_skip=True),
    check=_terms_certify_check, names=DEFAULT_NAMES, defect=13)


def _null_through_intercept_feature(n=120, T=5, d=3, seed=5):
    """Each sequence's first coordinate scaled so that S_11 x_last,1 = 1: that attention
    feature equals the intercept column on every training row."""
    X = np.random.default_rng(seed).normal(size=(n, T, d))
    X[:, :, 0] *= np.cbrt(1.0 / (X[:, -1, 0] * (X[:, :, 0] ** 2).sum(axis=1)))[:, None]
    return X


def _null_through_intercept_combination(n=150, T=5, d=3, seed=5):
    """Each sequence scaled so that a random combination of its features is 1."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    c = rng.normal(size=psi(d))
    return X * np.cbrt(1.0 / (ref_features(X) @ c))[:, None, None]


def _null_through_skip(n=120, T=5, d=3, seed=6):
    """S_11 = 1 for every sequence: the features S_11 x_last,l are the skip columns."""
    X = np.random.default_rng(seed).normal(size=(n, T, d))
    X[:, :, 0] /= np.sqrt((X[:, :, 0] ** 2).sum(axis=1))[:, None]
    return X


def _null_through_intercept_all(n=60, T=4, d=2, seed=7):
    """readout="all": x_t,1 solves x_t,1 (sum_{s<=t} x_s,1**2) = 1 at every prefix."""
    X = np.random.default_rng(seed).normal(size=(n, T, d))
    s = 0.0
    for t in range(T):  # the positive root of x**3 + s x - 1 = 0
        roots = np.roots([1.0, 0.0, s, -1.0])
        x = float(max(r.real for r in roots if abs(r.imag) < 1e-12))
        X[:, t, 0] = x
        s += x * x
    return X


_NULL_DESIGNS = {
    "intercept_equals_a_feature": (_null_through_intercept_feature, {"fit_intercept": True},
                                   "last"),
    "intercept_equals_a_combination": (_null_through_intercept_combination,
                                       {"fit_intercept": True}, "last"),
    "skip_equals_features": (_null_through_skip, {"fit_skip": True}, "last"),
    "intercept_equals_a_feature_readout_all": (_null_through_intercept_all,
                                               {"fit_intercept": True}, "all"),
}


def _null_certify(make, terms, readout, solver, fit=False):
    def call(tmp):
        X = make()
        C = pkg().certify_identifiability
        plain = bool(C(X, readout=readout, solver=solver))
        if fit:
            y = np.random.default_rng(0).normal(size=X.shape[:2] if readout == "all"
                                                else len(X))
            with_terms = bool(LAR(readout=readout, solver=solver, **terms)
                              .fit(X, y).certificate_)
        else:
            with_terms = bool(C(X, readout=readout, solver=solver, **terms))
        return plain, with_terms
    return call


def _null_check(r):
    expect(r[0], "the design without terms is not certified (it should be)")
    expect(not r[1], "certified although a term column is an exact combination of features")


for _name, (_make, _terms, _readout) in _NULL_DESIGNS.items():
    for _solver in SOLVERS6:
        _open = (dict(defect=14)
                 if (_name, _solver) == ("intercept_equals_a_feature", "cg") else {})
        add(f"terms_certify_null_{_name}_{_solver}", _TERMS_CERTIFY,
            _null_certify(_make, _terms, _readout, _solver), check=_null_check,
            names=DEFAULT_NAMES, **_open)
for _solver in ("eigh", "cg"):
    _open = dict(defect=14) if _solver == "cg" else {}
    add(f"terms_fit_null_intercept_equals_a_feature_{_solver}", _TERMS_FIT,
        _null_certify(_null_through_intercept_feature, {"fit_intercept": True}, "last",
                      _solver, fit=True),
        check=_null_check, names=DEFAULT_NAMES, **_open)


# --- units and tolerances: choices and results that must not depend on units ----
# Defects 19 to 27: each a place where a scale or a tolerance was handled locally.


def _exact_attention_data(n=40, T=4, d=2, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, T, d))
    V, Q = teacher(d=d, n_heads=1, seed=seed + 1)
    return X, truth(X, V, Q) + offset


def _auto_terms_call(offset, scales):
    def call(tmp):
        X, y = _exact_attention_data(offset=offset)
        out = []
        for c in scales:
            m = pkg().LinearAttentionRegressorCV(fit_intercept="auto", fit_skip="auto")
            m.fit(X * c, y * (c**3 if offset == 0 else 1.0))
            out.append((m.fit_intercept_, m.fit_skip_, m.alpha_))
        return out
    return call


def _auto_terms_check(expected):
    def check(r):
        expect(all(t[:2] == expected for t in r),
               f"(fit_intercept_, fit_skip_, alpha_) per scale {r}, expected terms {expected} "
               "at every scale")
        expect(len({t[2] for t in r}) == 1, f"alpha_ depends on the units: {r}")
    return check


add("cv_auto_terms_exact_attention_in_any_units", "LinearAttentionRegressorCV.fit",
    _auto_terms_call(0.0, (1.0, 3.0, 1e3, 1e-50)), check=_auto_terms_check((False, False)),
    defect=19)
add("cv_auto_terms_exact_intercept_only", "LinearAttentionRegressorCV.fit",
    _auto_terms_call(0.7, (1.0, 3.0)), check=_auto_terms_check((True, False)), defect=19)


def _dask_negative_weight(solver, weights_in_dask):
    def call(tmp):
        import dask.array as da

        X, y = gaussian(200, 4, 2), np.random.default_rng(1).normal(size=200)
        w = np.ones(200)
        w[3] = -1.0
        w = da.from_array(w, chunks=50) if weights_in_dask else w
        return LAR(solver=solver).fit(da.from_array(X, chunks=(50, 4, 2)),
                                      da.from_array(y, chunks=50), sample_weight=w)
    return call


for _solver in ("eigh", "cg"):
    for _where in ("dask", "numpy"):
        add(f"dask_negative_sample_weight_{_solver}_{_where}_weights", "dask",
            _dask_negative_weight(_solver, _where == "dask"),
            error=err(both(r"sample_weight", r"non-negative|negative")), defect=20,
            requires=("dask",))


def _coef_underflow(c):
    def call(tmp):
        X, y = realizable(n=200, T=4, d=2, n_heads=1)[:2]
        return LAR().fit(X * c, y)
    return call


def _coef_underflow_check(m):
    c = np.asarray(m.coef_)
    expect(np.all(np.isfinite(c)) and np.any(c != 0), "coef_ underflowed to zero")
    expect(np.all((c == 0) | (np.abs(c) >= np.finfo(np.float64).tiny)),
           "coef_ holds subnormal values (digits lost)")


for _c in (1e105, 1e110):
    add(f"coef_underflow_X_times_{_c:g}", "LinearAttentionRegressor.fit",
        _coef_underflow(_c), check=_coef_underflow_check,
        error=err(both(r"coef|coefficients", r"float64")), defect=21)


def _r2_leave_one_out(tmp):
    from sklearn.model_selection import LeaveOneOut

    X, y = gaussian(30, 4, 2), np.random.default_rng(0).normal(size=30)
    return pkg().LinearAttentionRegressorCV(scoring="r2", cv=LeaveOneOut()).fit(X, y)


add("cv_r2_leave_one_out_every_score_nan", "LinearAttentionRegressorCV.fit", _r2_leave_one_out,
    error=err(both(r"scoring", r"r2")), defect=22)


def _pipeline_channels_first(tmp):
    from sklearn.pipeline import make_pipeline
    from sklearn_linattn.preprocessing import PositionalEncoding

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 2, 6))  # 2 channels, 6 time points
    y = (X[:, 0, :] ** 2).sum(axis=1) * X[:, 1, -1]
    pipe = make_pipeline(PositionalEncoding(data_format="channels_first"),
                         LAR(data_format="channels_first")).fit(X, y)
    return pipe, X, y


def _pipeline_channels_first_check(r):
    pipe, X, y = r
    d = pipe[-1].n_features_in_
    expect(d == 2 + 6, f"the estimator read d = {d}, expected 2 channels + 6 positions")
    expect(rel(pipe.predict(X), y) < 1e-8, "the pipeline does not fit its training data")


add("pipeline_positions_channels_first_on_every_step", "LinearAttentionRegressor.fit",
    _pipeline_channels_first, check=_pipeline_channels_first_check, defect=23)


def _covers_training_with_terms(terms):
    def call(tmp):
        from sklearn_linattn.preprocessing import PositionalEncoding

        rng = np.random.default_rng(0)
        Z = PositionalEncoding().fit_transform(rng.normal(size=(300, 5, 2)))
        y = rng.normal(size=300)
        cert = LAR(**terms).fit(Z, y).certificate_
        return cert.covers(Z), cert.covers(2.0 * Z), bool(terms)
    return call


def _covers_all_check(r):
    covered, doubled, terms = r
    expect(bool(np.all(covered)), f"{int(np.sum(~covered))} of the {covered.size} training "
           "sequences are not covered")
    # Twice the tokens: the cubic features grow 8 times, a term column 1 or 2 times.
    expect(bool(np.all(doubled != terms)), "the doubled sequences are covered "
           f"{int(np.sum(doubled))} times of {doubled.size}, expected {'none' if terms else 'all'}")


for _name, _terms in (("none", {}), ("skip", {"fit_skip": True}),
                      ("intercept", {"fit_intercept": True}),
                      ("both", {"fit_intercept": True, "fit_skip": True})):
    add(f"covers_training_sequences_positions_terms_{_name}",
        "IdentifiabilityCertificate.covers", _covers_training_with_terms(_terms),
        check=_covers_all_check, defect=24)


def _plane_tokens(n=200, T=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, T, 2)) @ rng.normal(size=(2, 3))


def _rank_deficient_scale_call(terms, partial):
    def call(tmp):
        X = _plane_tokens()
        V, Q = teacher(d=3, n_heads=1, seed=4)
        y = truth(X, V, Q)
        Xt = np.random.default_rng(9).normal(size=(50, 5, 3))  # off the plane
        out = []
        for c in (1.0, 1.5, 3.0, 0.7, 1e10):
            if partial:
                m = LAR(**terms)
                for part in np.array_split(np.arange(len(X)), 4):
                    m.partial_fit(X[part] * c, y[part] * c**3)
            else:
                m = LAR(**terms).fit(X * c, y * c**3)
            out.append(m.predict(Xt * c) / c**3)
        return out
    return call


def _rank_deficient_scale_check(preds):
    worst = max(rel(p, preds[0]) for p in preds[1:])
    expect(worst < 1e-8, f"predictions off the training plane change with the scale of X "
           f"(relative {worst:.3g})")


def _rank_deficient_units_call(tmp):
    X = _plane_tokens()
    V, Q = teacher(d=3, n_heads=1, seed=4)
    y = truth(X, V, Q)
    Xt = np.random.default_rng(9).normal(size=(50, 5, 3))
    out = []
    for u in ([1.0, 1.0, 1.0], [1e3, 1.0, 1e-3], [0.3, 7.0, 1.5]):
        u = np.asarray(u)
        # Unit u per coordinate: the teacher in the new units computes the same outputs.
        out.append(LAR().fit(X * u, y).predict(Xt * u))
    return out


add("rank_deficient_tokens_unit_per_coordinate", "LinearAttentionRegressor.fit",
    _rank_deficient_units_call, check=_rank_deficient_scale_check, defect=25)

for _terms_name, _terms in (("none", {}), ("skip", {"fit_skip": True})):
    for _how in ("fit", "partial_fit"):
        add(f"rank_deficient_tokens_scale_{_how}_{_terms_name}",
            "LinearAttentionRegressor.fit", _rank_deficient_scale_call(_terms, _how != "fit"),
            check=_rank_deficient_scale_check, defect=25)


def _float32_heads(n_heads):
    def call(tmp):
        rng = np.random.default_rng(0)
        d = 4
        V, Q = rng.normal(size=(2, 1, d)), rng.normal(size=(2, d, d))
        X = rng.normal(size=(500, 6, d))
        y = truth(X, V, Q).astype(np.float32)  # a float32 layer's output
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = LAR(n_heads=n_heads, random_state=0).fit(X, y)
        return m, [w.category.__name__ for w in caught]
    return call


def _float32_heads_check(r):
    m, caught = r
    expect(m.n_heads_ == 2, f"n_heads_ = {m.n_heads_} on a 2-head layer's float32 output")
    expect("ConvergenceWarning" not in caught, "ConvergenceWarning at float32 rounding")


for _n in ("auto", 2):
    add(f"heads_of_float32_targets_n_heads_{_n}", "LinearAttentionRegressor.fit",
        _float32_heads(_n), check=_float32_heads_check, defect=26)


# ---------------------------------------------------------------------------
# Running cases: classification, isolation, report
# ---------------------------------------------------------------------------


def _short(text, limit=400):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify_exception(case, exc):
    if isinstance(exc, Hang):
        return HANG, _short(exc)
    types, pattern = case.error if case.error is not None else (
        (ValueError, TypeError), case.names or DEFAULT_NAMES)
    message = str(exc)
    detail = f"{type(exc).__module__}.{type(exc).__name__}: {_short(message)}"
    if isinstance(exc, types) and re.search(pattern, message, re.S):
        return CLEAR_ERROR, detail
    return OTHER_EXCEPTION, detail


def evaluate(case, tmp):
    """(outcome, detail) of one case, in this process."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = case.call(tmp)
    except Exception as exc:  # noqa: BLE001 - every exception is an outcome
        return classify_exception(case, exc)
    if case.check is None:
        return SILENT_WRONG, f"accepted invalid input; returned {_short(repr(result), 200)}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case.check(result)
    except Wrong as w:
        return SILENT_WRONG, _short(w)
    except Exception as exc:  # noqa: BLE001
        outcome, detail = classify_exception(case, exc)
        return (OTHER_EXCEPTION if outcome == CLEAR_ERROR else outcome), "in check: " + detail
    return CORRECT, ""


def _vm_size():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child_main(case, fd, memory_mb):
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    payload = None
    try:
        try:
            import resource

            limit = _vm_size() + memory_mb * 2**20
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            if hard == resource.RLIM_INFINITY or limit < hard:
                resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        except (ImportError, ValueError, OSError):
            pass
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(1)
        except Exception:  # noqa: BLE001
            pass
        tmp = Path(tempfile.mkdtemp(prefix="adv-"))
        start = time.perf_counter()
        try:
            outcome, detail = case_runner(case, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        module = sys.modules.get("sklearn_linattn")
        payload = dict(outcome=outcome, detail=detail, seconds=time.perf_counter() - start,
                       module=getattr(module, "__file__", None))
    except BaseException as exc:  # noqa: BLE001
        payload = dict(outcome=OTHER_EXCEPTION, detail=f"harness: {exc!r}", seconds=0.0,
                       module=None)
    try:
        data = json.dumps(payload).encode()
        while data:
            n = os.write(fd, data)
            data = data[n:]
    finally:
        os._exit(0)


def case_runner(case, tmp):
    """Hook: evaluate a case (callables in the fuzz tests reuse the machinery)."""
    return evaluate(case, tmp)


def run_cases(cases, *, timeout=None, jobs=None, progress=None):
    """Run cases in forked children, ``jobs`` at a time; returns {id: result dict}."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    # What the cases need is imported once, here: every child inherits it (PyTorch
    # alone takes seconds to import).  Children limit every thread pool to one
    # thread, so a fork after these imports is safe.
    import importlib

    for name in sorted({m for c in cases for m in c.requires}):
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the cases that need it report the ImportError themselves
    # Long cases first (slow ones, the command line), so that they overlap the rest.
    pending = sorted(cases, key=lambda c: (not c.slow, c.entry != "cli"))
    running = {}
    results = {}
    sys.stdout.flush()
    sys.stderr.flush()
    while pending or running:
        while pending and len(running) < jobs:
            case = pending.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child
                os.close(r)
                _child_main(case, w, case.memory_mb or DEFAULT_MEMORY_MB)
            os.close(w)
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass
            limit = case.timeout or timeout or DEFAULT_TIMEOUT
            running[r] = dict(case=case, pid=pid, start=time.monotonic(), limit=limit, buf=b"")
        now = time.monotonic()
        wait = min(job["start"] + job["limit"] for job in running.values()) - now
        ready, _, _ = select.select(list(running), [], [], max(0.0, min(wait, 1.0)))
        finished = []
        for fd in ready:
            job = running[fd]
            chunk = os.read(fd, 65536)
            if chunk:
                job["buf"] += chunk
                continue
            finished.append(fd)
            _, status = os.waitpid(job["pid"], 0)
            try:
                res = json.loads(job["buf"].decode())
            except ValueError:
                sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
                res = dict(outcome=OTHER_EXCEPTION,
                           detail=f"child process died (signal {sig}, status {status})",
                           seconds=time.monotonic() - job["start"], module=None)
            job["result"] = res
        now = time.monotonic()
        for fd, job in running.items():
            if fd in finished:
                continue
            if now - job["start"] > job["limit"]:
                try:
                    os.killpg(job["pid"], signal.SIGKILL)
                except OSError:
                    try:
                        os.kill(job["pid"], signal.SIGKILL)
                    except OSError:
                        pass
                os.waitpid(job["pid"], 0)
                job["result"] = dict(outcome=HANG, detail=f"no answer after {job['limit']:g} s",
                                     seconds=now - job["start"], module=None)
                finished.append(fd)
        for fd in finished:
            job = running.pop(fd)
            os.close(fd)
            case = job["case"]
            res = dict(job["result"])
            res.update(id=case.id, entry=case.entry, defect=case.defect,
                       expected=list(case.expected),
                       passed=res["outcome"] in case.expected,
                       today=case.today,
                       as_recorded=(res["outcome"] == case.today) if case.open
                       else res["outcome"] in case.expected)
            results[case.id] = res
            if progress:
                progress(res)
    return results


def _table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(v).rjust(w) if i else str(v).ljust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def report(results, cases):
    order = [c.id for c in cases if c.id in results]
    out = []
    modules = sorted({r["module"] for r in results.values() if r.get("module")})
    out.append(f"sklearn_linattn imported from: {', '.join(modules) or '?'}")
    total = {k: 0 for k in OUTCOMES}
    for r in results.values():
        total[r["outcome"]] += 1
    passed = sum(r["passed"] for r in results.values())
    recorded = sum(bool(r.get("today")) and r["as_recorded"] for r in results.values())
    unexpected = sum(not r["as_recorded"] for r in results.values())
    out.append(f"\n{len(results)} cases: {passed} as expected, {len(results) - passed} failing "
               f"({recorded} of them open defects showing their recorded outcome); "
               f"{unexpected} not as recorded\n")
    out.append(_table([[k, total[k]] for k in OUTCOMES], ["outcome", "cases"]))
    entries = {}
    for cid in order:
        r = results[cid]
        e = entries.setdefault(r["entry"], {k: 0 for k in OUTCOMES + ("total", "failing")})
        e[r["outcome"]] += 1
        e["total"] += 1
        e["failing"] += not r["passed"]
    rows = [[name] + [e[k] for k in OUTCOMES + ("total", "failing")]
            for name, e in sorted(entries.items())]
    rows.append(["TOTAL"] + [total[k] for k in OUTCOMES] + [len(results), len(results) - passed])
    out.append("\nper entry point:\n")
    out.append(_table(rows, ["entry point", *OUTCOMES, "total", "failing"]))
    failing = [results[c] for c in order if not results[c]["passed"]]
    out.append(f"\nfailing cases ({len(failing)}), by defect:")
    groups = {}
    for r in failing:
        groups.setdefault(r["defect"], []).append(r)
    for defect in sorted(groups, key=lambda d: (d is None, d or 0)):
        label = f"defect {defect}" if defect is not None else "beyond the known defects"
        if defect in OPEN_DEFECTS:
            label += f", open: {OPEN_DEFECTS[defect]}"
        out.append(f"\n  [{label}]")
        for r in groups[defect]:
            mark = "" if not r.get("today") else (
                " [recorded]" if r["as_recorded"] else f" [recorded as {r['today']}]")
            out.append(f"    {r['id']}: {r['outcome']} (expected {'/'.join(r['expected'])})"
                       f"{mark} -- {_short(r['detail'], 160)}")
    fixed = [r for r in results.values() if r.get("today") and r["passed"]]
    if fixed:
        out.append(f"\nopen defects that now end as expected ({len(fixed)}): drop their "
                   "today= (and the defect from OPEN_DEFECTS once none is left):")
        out.extend(f"    {r['id']} (defect {r['defect']})" for r in fixed)
    return "\n".join(out)


def select_cases(only=None, skip_slow=False):
    cases = [c for c in CASES if not (skip_slow and c.slow)]
    if only:
        cases = [c for c in cases if re.search(only, c.id)]
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="write per-case results to PATH")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds before a case is killed as a HANG (default "
                             f"{HANG_SECONDS:g}; a case may set its own)")
    parser.add_argument("--jobs", type=int, default=None, help="cases at a time (default: CPUs)")
    parser.add_argument("--only", metavar="REGEX", help="run the cases whose id matches")
    parser.add_argument("--skip-slow", action="store_true", help="leave out slow cases")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    cases = select_cases(args.only, args.skip_slow)
    if args.list:
        for c in cases:
            print(f"{c.id}\t{c.entry}\t{c.defect or ''}\t{'/'.join(c.expected)}"
                  f"\t{'open, today ' + c.today if c.open else ''}")
        return 0
    absent = {c.id: missing_requirements(c) for c in cases}
    for cid, names in absent.items():
        if names:
            print(f"skipped {cid}: needs {', '.join(names)}", file=sys.stderr)
    cases = [c for c in cases if not absent[c.id]]
    pkg()  # import once; children inherit it
    probe = ("import sklearn_linattn, sys; sys.stdout.write(sklearn_linattn.__file__)")
    environ = dict(os.environ)
    environ["PYTHONPATH"] = _package_root() + os.pathsep + environ.get("PYTHONPATH", "")
    cli_module = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                env=environ, timeout=HANG_SECONDS).stdout
    done = [0]

    def progress(r):
        done[0] += 1
        mark = "." if r["passed"] else r["outcome"][0]
        print(mark, end="" if done[0] % 80 else "\n", file=sys.stderr, flush=True)

    start = time.monotonic()
    results = run_cases(cases, timeout=args.timeout, jobs=args.jobs, progress=progress)
    print(file=sys.stderr)
    print(report(results, cases).replace(
        "\n", f"\ncommand-line cases import it from: {cli_module or '?'}\n", 1))
    print(f"\n({time.monotonic() - start:.0f} s)")
    if args.json:
        ordered = [results[c.id] for c in cases]
        Path(args.json).write_text(json.dumps(ordered, indent=1))
    # As in the test suite: an open defect passes while it shows its recorded outcome.
    return 0 if all(r["as_recorded"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
