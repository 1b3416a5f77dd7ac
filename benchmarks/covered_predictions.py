"""Predictions on covered inputs, for comparing two checkouts of the package.

Fits every solver on a set of designs (generic tokens, variable lengths, both
readouts, weights, decays, terms, one-hot and rank-deficient tokens, extreme
scales) and records the predictions on inputs the certificate covers (new,
longer inputs when the design is identified; the training inputs otherwise),
so that a change of the code can be checked not to move any of them::

    PYTHONPATH=/path/to/old/checkout python benchmarks/covered_predictions.py --save old.npz
    python benchmarks/covered_predictions.py --save new.npz
    python benchmarks/covered_predictions.py --compare old.npz new.npz

``--compare`` prints the largest relative difference per design and solver,
and exits 1 when one exceeds ``--rtol`` (default 1e-10).
"""

import argparse
import sys
import warnings

import numpy as np

SOLVERS = ("eigh", "cholesky", "svd", "dual", "cg")


def _teacher(rng, d, heads=2, d_out=1):
    return rng.normal(size=(heads, d_out, d)), rng.normal(size=(heads, d, d))


def designs():
    """``name -> (X, y, X_new, params)``: the fit's data, new inputs and parameters."""
    from sklearn_linattn import mhla_forward

    rng = np.random.default_rng(0)
    out = {}
    V, Q = _teacher(rng, 3)
    X = rng.normal(size=(120, 5, 3))
    X_new = rng.normal(size=(20, 9, 3))
    out["generic"] = (X, mhla_forward(X, V, Q)[:, 0], X_new, {})
    out["scaled_1e60"] = (X * 1e60, mhla_forward(X, V, Q)[:, 0], X_new * 1e60, {})
    units = np.array([1e-40, 1.0, 1e40])
    out["units_per_coordinate"] = (X * units, mhla_forward(X, V, Q)[:, 0], X_new * units, {})
    noisy = mhla_forward(X, V, Q)[:, 0] + 0.1 * rng.normal(size=120)
    out["noisy_alpha"] = (X, noisy, X_new, {"alpha": 1e-3})
    w = rng.uniform(0.0, 2.0, size=120)
    out["weights"] = (X, noisy, X_new, {"sample_weight": w})
    Xv = X.copy()
    Xv[np.arange(5)[None, :] >= rng.integers(2, 6, size=120)[:, None]] = np.nan
    out["variable_all"] = (Xv, mhla_forward(Xv, V, Q, readout="all")[..., 0], X_new,
                           {"readout": "all"})
    out["terms"] = (X, noisy + 0.5 + X[:, -1, 0], X_new,
                    {"fit_intercept": True, "fit_skip": True})
    out["decays"] = (X, mhla_forward(X, V, Q, decays=[0.5, 0.9])[:, 0], X_new,
                     {"decay": (0.5, 0.9)})
    plane = rng.normal(size=(150, 5, 2)) @ rng.normal(size=(2, 3))
    out["rank_deficient"] = (plane, mhla_forward(plane, V, Q)[:, 0], plane[:20], {})
    onehot = np.eye(4)[rng.integers(0, 4, size=(150, 5))]
    V4, Q4 = _teacher(rng, 4)
    out["one_hot"] = (onehot, mhla_forward(onehot, V4, Q4)[:, 0], onehot[:20], {})
    return out


def predictions():
    """``"design/solver" -> predictions`` on the covered new inputs."""
    from sklearn_linattn import LinearAttentionRegressor

    out = {}
    for name, (X, y, X_new, params) in designs().items():
        params = dict(params)
        weight = params.pop("sample_weight", None)
        # Which inputs are covered is a property of the data: read from a dense solver's
        # certificate ("cg" keeps no null space to tell).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dense = LinearAttentionRegressor(solver="eigh", **params)
            covered = dense.fit(X, y, sample_weight=weight).certificate_.covers(X_new)
        for solver in SOLVERS:
            if solver == "dual" and "decay" in params:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = LinearAttentionRegressor(solver=solver, tol=1e-12, **params)
                model.fit(X, y, sample_weight=weight)
            out[f"{name}/{solver}"] = model.predict(X_new[covered])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", metavar="PATH")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    parser.add_argument("--rtol", type=float, default=1e-10)
    args = parser.parse_args(argv)
    if args.save:
        np.savez(args.save, **predictions())
    if args.compare:
        old, new = (np.load(p) for p in args.compare)
        worst = 0.0
        for key in old.files:
            a, b = old[key], new[key]
            if a.shape != b.shape:
                print(f"{key:32s} covered inputs differ: {a.shape} vs {b.shape}")
                worst = np.inf
                continue
            scale = np.nanmax(np.abs(a), initial=0.0)
            diff = np.nanmax(np.abs(a - b), initial=0.0) / scale if scale > 0 else 0.0
            worst = max(worst, diff)
            print(f"{key:32s} {a.size:5d} predictions, largest relative difference {diff:.2e}")
        print(f"largest: {worst:.2e} (rtol {args.rtol:g})")
        return 0 if worst <= args.rtol else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
