"""The modules one ``fit`` passes through, counted as it runs.

A *stay* is a maximal run of calls and returns inside one module of the
package along the call sequence; a call into numpy, scipy or scikit-learn is
attributed to the package frame that made it.  The count includes every
small helper (``_memory``, ``_params``), so it is a finer measure than the
walk-through of doc/codemap.rst, which follows the top-level steps.

Usage::

    python benchmarks/fit_path.py             # LinearAttentionRegressor(n_heads=2), readout "last"
    python benchmarks/fit_path.py --path      # also print the sequence of stays
"""

import argparse
import collections
import sys

import numpy as np

import sklearn_linattn
from sklearn_linattn import LinearAttentionRegressor


def stays_of(call):
    """The package modules ``call()`` passes through, one entry per stay."""
    package = sklearn_linattn.__name__
    stays = []

    def module_of(frame):
        while frame is not None and not frame.f_globals.get("__name__", "").startswith(package):
            frame = frame.f_back
        return None if frame is None else frame.f_globals["__name__"]

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", action="store_true", help="print the sequence of stays")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6, 4))
    y = (X[:, -1, 0] * (X[:, :, 1] ** 2).sum(axis=1)
         + X[:, -1, 2] * (X[:, :, 3] * X[:, :, 0]).sum(axis=1))  # two heads
    stays = stays_of(lambda: LinearAttentionRegressor(n_heads=2).fit(X, y))
    counts = collections.Counter(stays)
    print(f"{len(stays)} stays in {len(counts)} modules")
    for module, n in counts.most_common():
        print(f"  {n:4d}  {module}")
    if args.path:
        prefix = sklearn_linattn.__name__ + "."
        print(" -> ".join(s.removeprefix(prefix) for s in stays))


if __name__ == "__main__":
    main()
