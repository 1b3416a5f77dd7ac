"""The modules one ``fit`` passes through, counted as it runs.

A *stay* is a maximal run of calls and returns inside one module of the
package along the call sequence; a call into numpy, scipy or scikit-learn is
attributed to the package frame that made it.  The count includes every
small helper (``_memory``, ``_params``), so it is a finer measure than the
walk-through of doc/codemap.rst, which follows the top-level steps.

Usage::

    python benchmarks/fit_path.py                   # every entry below, one line each
    python benchmarks/fit_path.py --case dask-eigh  # one entry, its modules and counts
    python benchmarks/fit_path.py --case none --path  # also print the sequence of stays
    python benchmarks/fit_path.py --units           # a subpackage (_units/, _solvers/, ...)
                                                    # counts as one module, as in the code map

The entries fit X of 400 sequences of 6 tokens, d = 4 (Dask: 4 blocks of
100, run on the synchronous scheduler, so that the blocks' tasks run in this
thread and count): ``n_heads`` None, 2 and "auto"; two ``partial_fit``
calls of 200 sequences; Dask with "eigh", with "cg", and with "cg",
``fit_intercept`` and ``alpha`` > 0.
"""

import argparse
import collections
import sys

import numpy as np

import sklearn_linattn
from sklearn_linattn import LinearAttentionRegressor


def unit_of(module):
    """The code map's unit of a module: a top-level module, or a subpackage as a whole."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def stays_of(call, units=False):
    """The package modules ``call()`` passes through, one entry per stay (per stay in a code map
    unit, subpackages as one, with ``units``)."""
    package = sklearn_linattn.__name__
    stays = []

    def module_of(frame):
        while frame is not None and not frame.f_globals.get("__name__", "").startswith(package):
            frame = frame.f_back
        if frame is None:
            return None
        return unit_of(frame.f_globals["__name__"]) if units else frame.f_globals["__name__"]

    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        module = module_of(frame if event == "call" else frame.f_back)
        if module is not None and (not stays or stays[-1] != module):
            stays.append(module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return stays


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6, 4))
    y = (X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
         + X[:, -1, 2] * (X[:, :, 3] * X[:, :, 0]).sum(axis=1))  # two heads
    return X, y


def _partial(X, y):
    model = LinearAttentionRegressor()
    model.partial_fit(X[:200], y[:200])
    return model.partial_fit(X[200:], y[200:])


def _dask(X, y, **params):
    import dask
    import dask.array as da

    with dask.config.set(scheduler="synchronous"):
        Xd, yd = da.from_array(X, chunks=(100, 6, 4)), da.from_array(y, chunks=100)
        return LinearAttentionRegressor(**params).fit(Xd, yd)


CASES = {
    "none": lambda X, y: LinearAttentionRegressor().fit(X, y),
    "n_heads=2": lambda X, y: LinearAttentionRegressor(n_heads=2, random_state=0).fit(X, y),
    "auto": lambda X, y: LinearAttentionRegressor(n_heads="auto", random_state=0).fit(X, y),
    "partial_fit-x2": _partial,
    "dask-eigh": lambda X, y: _dask(X, y, solver="eigh"),
    "dask-cg": lambda X, y: _dask(X, y, solver="cg", alpha=0.1),
    "dask-cg-intercept": lambda X, y: _dask(X, y, solver="cg", alpha=0.1, fit_intercept=True),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), help="one entry (default: all)")
    parser.add_argument("--path", action="store_true", help="print the sequence of stays")
    parser.add_argument("--units", action="store_true",
                        help="count stays in the code map's units (a subpackage as one module)")
    args = parser.parse_args(argv)
    X, y = _data()
    if args.case is None:
        print(f"{'entry':20s} {'stays':>6s}  most entered module")
        for name, run in CASES.items():
            try:
                stays = stays_of(lambda: run(X, y), args.units)
            except ImportError as exc:  # dask is optional
                print(f"{name:20s} {'n/a':>6s}  ({exc})")
                continue
            module, n = collections.Counter(stays).most_common(1)[0]
            print(f"{name:20s} {len(stays):6d}  {module} ({n})")
        return
    stays = stays_of(lambda: CASES[args.case](X, y), args.units)
    counts = collections.Counter(stays)
    print(f"{len(stays)} stays in {len(counts)} modules")
    for module, n in counts.most_common():
        print(f"  {n:4d}  {module}")
    if args.path:
        prefix = sklearn_linattn.__name__ + "."
        print(" -> ".join(s.removeprefix(prefix) for s in stays))


if __name__ == "__main__":
    main()
