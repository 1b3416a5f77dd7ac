"""Cost of ``LinearAttentionRegressorCV`` (5 folds, 10 alphas) against one plain fit.

Two settings, each timed in one run, the two fits interleaved (best of the
repeats):

- ``digits``: scikit-learn's digits as next-row prediction.  Each 8 x 8 image
  (values / 16) gives the sequence of its first 7 rows and the targets of the
  next row at every position (``readout="all"``), with one-hot positions
  appended to the tokens (d = 15, psi = 1800), intercept and skip terms;
  ``train_test_split(test_size=0.25, random_state=0)``.
- ``synthetic``: Gaussian sequences (by default N = 20 000, n = 16, d = 6, psi = 126,
  entries N(0, 1/n)) labelled by a random one-head MHLA plus 10% noise,
  ``readout="last"``.

The measured ratio is the wall time of ``LinearAttentionRegressorCV().fit``
(5 folds, the default 10 alphas, the search and the refit) over that of
``LinearAttentionRegressor(alpha=alpha_).fit`` on the same data (the target:
at most 3).  The script also reports the chosen alpha, the held-out MSE of
both models and their largest difference in prediction (the refit is the
plain fit), and how long each stage of the search took (``verbose``).

Usage::

    python -m benchmarks.cv_cost                       # both settings, 1 repeat
    python -m benchmarks.cv_cost --only synthetic --repeats 3 --json
"""

import argparse
import contextlib
import io
import json
import re
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, LinearAttentionRegressorCV, mhla_forward

from .measure import interleaved_timings

SETTINGS = ("digits", "synthetic")


def with_positions(X):
    """Tokens with a one-hot position appended: (n, T, d) -> (n, T, d + T)."""
    n, T = X.shape[:2]
    return np.concatenate([X, np.broadcast_to(np.eye(T), (n, T, T))], axis=2)


def digits_data(seed=0):
    """Next-row prediction on scikit-learn's digits, positions appended (d = 15)."""
    images = load_digits().images / 16.0
    X, y = images[:, :7], images[:, 1:]
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25,
                                                        random_state=seed)
    params = dict(readout="all", fit_intercept=True, fit_skip=True)
    return with_positions(X_train), y_train, with_positions(X_test), y_test, params


def synthetic_data(seed=0, n_samples=20000, n_tokens=16, d=6, noise=0.1):
    """A random one-head MHLA with Gaussian noise on its outputs, readout "last"."""
    rng = np.random.default_rng(seed)
    V = rng.normal(size=(1, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(1, d, d)) / np.sqrt(d)
    X = rng.normal(size=(2 * n_samples, n_tokens, d)) / np.sqrt(n_tokens)
    y = mhla_forward(X, V, Q)[:, 0]
    y = y + noise * y.std() * rng.normal(size=y.shape)
    return X[:n_samples], y[:n_samples], X[n_samples:], y[n_samples:], dict(readout="last")


def _mse(model, X, y):
    pred = model.predict(X)
    return float(np.mean((pred - y) ** 2))


def _stages(text):
    """The verbose lines of a fit: (message, seconds since the start)."""
    return [(m.group(2), float(m.group(3)))
            for m in re.finditer(r"^\[(\w+)\] (.*) \(([\d.]+) s\)$", text, flags=re.M)]


def run_setting(name, repeats, seed=0, sizes=None):
    """Time the search and one plain fit at the chosen alpha; a dict of the numbers.

    ``sizes``: ``n_samples``, ``n_tokens``, ``d`` of the synthetic setting.
    """
    X, y, X_test, y_test, params = (digits_data(seed) if name == "digits"
                                    else synthetic_data(seed, **(sizes or {})))
    search = LinearAttentionRegressorCV(cv=5, verbose=1, **params)
    verbose = io.StringIO()
    with contextlib.redirect_stdout(verbose):
        alpha = search.fit(X, y).alpha_  # fixes the plain fit's alpha (not timed)
        plain = LinearAttentionRegressor(alpha=alpha, **params)
        times, last = interleaved_timings({"cv": lambda: search.fit(X, y),
                                           "plain": lambda: plain.fit(X, y)}, repeats)
    cv_model, plain_model = last["cv"], last["plain"]
    stages = _stages(verbose.getvalue())
    # Those of the last timed search (each search starts with its pass).
    first = [i for i, (message, _) in enumerate(stages) if message.startswith("statistics")]
    stages = stages[first[-1]:]
    scale = float(np.abs(plain_model.predict(X_test)).max())
    return dict(
        setting=name, n_samples=int(X.shape[0]), n_tokens=int(X.shape[1]), d=int(X.shape[2]),
        psi=int(cv_model.coef_.shape[1]), params=params,
        cv_seconds=min(times["cv"]), plain_seconds=min(times["plain"]),
        all_cv_seconds=times["cv"], all_plain_seconds=times["plain"],
        ratio=min(times["cv"]) / min(times["plain"]),
        alpha=cv_model.alpha_, best_score=cv_model.best_score_,
        mean_test_scores=[float(s) for s in cv_model.cv_results_["mean_test_score"]],
        test_mse_cv=_mse(cv_model, X_test, y_test),
        test_mse_plain=_mse(plain_model, X_test, y_test),
        max_prediction_difference=float(np.abs(cv_model.predict(X_test)
                                               - plain_model.predict(X_test)).max()) / scale,
        feature_rank=int(cv_model.feature_rank_), solver=cv_model.solver_,
        identifiable=bool(cv_model.certificate_),
        stages=stages,
    )


def run(args):
    """Every setting of ``args.only``, under ``args.threads`` BLAS threads."""
    sizes = dict(n_samples=args.n_samples, n_tokens=args.n_tokens, d=args.d)
    with threadpool_limits(args.threads):
        return [run_setting(name, args.repeats, args.seed, sizes) for name in args.only]


def build_parser():
    """The command line (also the defaults of the ``cv`` benchmark row)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=SETTINGS, nargs="+", default=list(SETTINGS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS threads (default: the library's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-samples", type=int, default=20000, help="synthetic setting")
    parser.add_argument("--n-tokens", type=int, default=16, help="synthetic setting")
    parser.add_argument("--d", type=int, default=6, help="synthetic setting")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    start = time.perf_counter()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return out
    for r in out:
        print(f"{r['setting']}: N = {r['n_samples']}, n = {r['n_tokens']}, d = {r['d']} "
              f"(psi = {r['psi']}), {r['params']}, feature rank {r['feature_rank']}, "
              f"solver {r['solver']}")
        print(f"  CV fit (5 folds, 10 alphas) {r['cv_seconds']:.2f} s; plain fit at alpha = "
              f"{r['alpha']:g} {r['plain_seconds']:.2f} s; ratio {r['ratio']:.2f} (target <= 3)")
        print(f"  mean test scores (-MSE) {np.round(r['mean_test_scores'], 6).tolist()}")
        print(f"  held-out MSE: CV {r['test_mse_cv']:.6g}, plain {r['test_mse_plain']:.6g}; "
              f"largest prediction difference {r['max_prediction_difference']:.1e} of the "
              "largest prediction")
        print("  stages: " + "; ".join(f"{m} at {s:.2f} s" for m, s in r["stages"]))
    print(f"total {time.perf_counter() - start:.0f} s")
    return out


if __name__ == "__main__":
    main()
