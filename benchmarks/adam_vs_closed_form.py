"""Wall time of the closed form against minibatch Adam (the paper's Sec. 4.1 setting).

Data (the paper's Sec. 4.1): a one-head generator V (1 x d), Q (d x d) with
N(0, 1/d) entries; N sequences of T tokens with N(0, 1/T) entries; targets at
every position (causal readout "all").

- Closed form: ``LinearAttentionRegressor(readout="all")`` on all N sequences
  (best of ``--repeats`` timings).
- Adam: ``AdamLinearAttentionRegressor`` with d**2 heads, holding out
  ``--validation-fraction`` of the N sequences to decide when the relative
  validation MSE falls below ``--target``.  Its cosine schedule spans
  ``--max-epochs`` epochs; by default that number is chosen from a short
  calibration run so that the whole schedule fits in ``--budget`` seconds.

Both models are also scored on an independent test set of ``--n-test``
sequences.  The printed ratio is Adam's time to the target (or its whole run
when it misses the target) over the closed form's time.

Usage::

    python benchmarks/adam_vs_closed_form.py [--budget SECONDS] [--json]
"""

import argparse
import contextlib
import json
import math
import sys
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, mhla_forward
from sklearn_linattn import AdamLinearAttentionRegressor


def make_data(rng, n_samples, n_tokens, d):
    """Sec. 4.1 data: sequences with N(0, 1/T) entries, one-head targets at every position."""
    V = rng.normal(size=(1, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(1, d, d)) / np.sqrt(d)
    X = rng.normal(size=(n_samples, n_tokens, d)) / np.sqrt(n_tokens)
    return X, mhla_forward(X, V, Q, readout="all")[..., 0]


def relative_mse(model, X, y):
    pred = model.predict(X)
    return float(np.mean((pred - y) ** 2) / np.mean(y**2))


def run(
    *,
    d=4,
    n_samples=2048,
    n_tokens=100,
    n_heads=None,
    target=1e-6,
    budget=300.0,
    max_epochs=None,
    learning_rate=1e-2,
    batch_size=32,
    warmup_fraction=0.05,
    validation_fraction=0.1,
    n_test=512,
    repeats=3,
    seed=0,
    verbose=0,
):
    """Run both learners and return the measurements as a dict."""
    rng = np.random.default_rng(seed)
    X, y = make_data(rng, n_samples + n_test, n_tokens, d)
    X, X_test, y, y_test = X[:n_samples], X[n_samples:], y[:n_samples], y[n_samples:]
    n_heads = d * d if n_heads is None else n_heads

    closed_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        closed = LinearAttentionRegressor(readout="all").fit(X, y)
        closed_times.append(time.perf_counter() - start)
    closed_time = min(closed_times)

    params = dict(
        n_heads=n_heads, readout="all", learning_rate=learning_rate, batch_size=batch_size,
        warmup_fraction=warmup_fraction, validation_fraction=validation_fraction,
        random_state=seed,
    )
    calibration = None
    if max_epochs is None:
        probe = AdamLinearAttentionRegressor(**params, max_epochs=2).fit(X, y)
        calibration = probe.elapsed_[-1] / probe.n_iter_
        max_epochs = max(1, math.floor(budget / calibration))
    adam = AdamLinearAttentionRegressor(
        **params, max_epochs=max_epochs, tol=target, verbose=verbose
    )
    with warnings.catch_warnings():
        # Missing the target is reported in the results, not as a warning.
        warnings.simplefilter("ignore", ConvergenceWarning)
        adam.fit(X, y)
    curve = np.asarray(adam.validation_curve_)
    reached = bool(curve[-1] < target)
    best = int(np.argmin(curve))
    adam_time = adam.elapsed_[-1]  # the epoch that reached the target, or the last
    return {
        "setting": dict(d=d, n_samples=n_samples, n_tokens=n_tokens, n_heads=n_heads,
                        readout="all", target=target, seed=seed),
        "closed_form": {
            "seconds": closed_time,
            "seconds_all_repeats": closed_times,
            "relative_test_mse": relative_mse(closed, X_test, y_test),
            "relative_train_mse": relative_mse(closed, X, y),
        },
        "adam": {
            "reached_target": reached,
            "seconds": adam_time,
            "epochs_run": adam.n_iter_,
            "max_epochs": max_epochs,
            "seconds_per_epoch_calibration": calibration,
            "final_relative_validation_mse": float(curve[-1]),
            "best_relative_validation_mse": float(curve[best]),
            "best_epoch": best + 1,
            "seconds_at_best": adam.elapsed_[best],
            "relative_test_mse": relative_mse(adam, X_test, y_test),
            "learning_rate": learning_rate,
            "batch_size": batch_size,
            "validation_fraction": validation_fraction,
        },
        "ratio_adam_over_closed_form": adam_time / closed_time,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300.0,
                        help="time budget for Adam in seconds (default 300)")
    parser.add_argument("--d", type=int, default=4)
    parser.add_argument("--n-samples", type=int, default=2048)
    parser.add_argument("--n-tokens", type=int, default=100)
    parser.add_argument("--n-heads", type=int, default=None, help="default d**2")
    parser.add_argument("--target", type=float, default=1e-6)
    parser.add_argument("--max-epochs", type=int, default=None,
                        help="length of Adam's schedule; default fits the budget")
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--n-test", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="limit BLAS/OpenMP threads (threadpoolctl) for both learners")
    parser.add_argument("--verbose", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    limits = (
        threadpool_limits(limits=args.blas_threads)
        if args.blas_threads is not None
        else contextlib.nullcontext()
    )
    with limits:
        result = run(
            d=args.d, n_samples=args.n_samples, n_tokens=args.n_tokens,
            n_heads=args.n_heads, target=args.target, budget=args.budget,
            max_epochs=args.max_epochs, learning_rate=args.learning_rate,
            batch_size=args.batch_size, validation_fraction=args.validation_fraction,
            n_test=args.n_test, repeats=args.repeats, seed=args.seed,
            verbose=args.verbose,
        )
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    s, c, a = result["setting"], result["closed_form"], result["adam"]
    print(f"setting: d={s['d']}, N={s['n_samples']}, T={s['n_tokens']}, readout='all', "
          f"Adam heads={s['n_heads']}, target relative validation MSE {s['target']:g}")
    print(f"closed form: {c['seconds']:.3f} s (best of {len(c['seconds_all_repeats'])}), "
          f"relative test MSE {c['relative_test_mse']:.2e}")
    status = "reached the target" if a["reached_target"] else "did NOT reach the target"
    print(f"Adam: {status} after {a['epochs_run']} epochs ({a['seconds']:.2f} s; schedule "
          f"of {a['max_epochs']} epochs), best relative validation MSE "
          f"{a['best_relative_validation_mse']:.2e} at epoch {a['best_epoch']} "
          f"({a['seconds_at_best']:.2f} s), relative test MSE {a['relative_test_mse']:.2e}")
    print(f"ratio Adam / closed form: {result['ratio_adam_over_closed_form']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
