"""Fixed decays: a decayed teacher learned back, the search over decays, and what positions cost.

Four parts, each printed as a markdown table or a few lines:

- ``teacher``: a two-head MHLA at d = 4 with decays 1 and 0.6 (heads N(0, 1)),
  300 training sequences of 2 to 6 tokens (100 for ``"dual"``), NaN-padded,
  labelled exactly; ``LinearAttentionRegressor(decay=(1.0, 0.6),
  n_heads="auto")`` with every solver and both readouts.  Reported: the head
  count, the heads' decays, the certificate and the largest error on 30
  sequences of 25 tokens, 10 times larger than the training inputs, relative
  to the largest output (the target: 1e-10).
- ``search``: scikit-learn's digits as next-row prediction (rows as tokens,
  ``readout="all"``, ``train_test_split(test_size=0.25, random_state=0)``, no
  positions): ``LinearAttentionRegressorCV(decays=[None, 0.5, (1.0, 0.5)])``
  (5 folds, 8 alphas, one pass) against one plain fit of the largest
  candidate, ``LinearAttentionRegressor(decay=(1.0, 0.5))``, CPU time
  interleaved (best of ``--repeats``); the chosen decay and alpha and each
  candidate's held-out MSE.
- ``positions``: the same digits with one-hot positions
  (``PositionalEncoding``) before ``LinearAttentionRegressorCV``: the bytes of
  the encoded X against the peak memory of the search (``tracemalloc``, which
  sees numpy's allocations), the measure of what a positions option inside
  the regressor could save.
- ``joint``: one search over k = 3 candidate decays against a search per
  candidate, on windows of a noisy sine (period 17, noise 0.1; ``--windows``
  windows of 48 time points, one channel, the next value as target) cut by
  ``Patches(6)`` then ``PositionalEncoding()`` (8 tokens of d = 14, psi =
  1470 a block: far fewer rows than features, the kernel path):
  ``LinearAttentionRegressorCV(decays=[None, 0.9, 0.5])`` and
  ``LinearAttentionRegressorCV(decays=[c])`` for each candidate (5 folds, the
  default alphas), wall times interleaved in one run (best of ``--repeats``,
  at least 3); the ratio joint / slowest single search (target: at most
  1.3), joint / sum of the three, and the largest relative difference of the
  joint search's scores from the separate searches' (equal to rounding).

Usage::

    python -m benchmarks.decays                      # all four parts
    python -m benchmarks.decays --only teacher --threads 1
    python -m benchmarks.decays --only joint --threads 2 --repeats 3
"""

import argparse
import time
import tracemalloc

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

from sklearn_linattn import LinearAttentionRegressor, LinearAttentionRegressorCV, mhla_forward
from sklearn_linattn._memory import real_tokens
from sklearn_linattn.preprocessing import Patches, PositionalEncoding

from .measure import interleaved_timings

PARTS = ("teacher", "search", "positions", "joint")
JOINT_DECAYS = (None, 0.9, 0.5)
SOLVERS = ("eigh", "cholesky", "svd", "dual", "cg", "lsmr")


def teacher_table(seed=0):
    """Rows (readout, solver, n_heads_, head_decays_, certified, relative OOD error)."""
    d, decays = 4, np.array([1.0, 0.6])
    heads = np.random.default_rng(seed)
    V, Q = heads.normal(size=(2, 1, d)), heads.normal(size=(2, d, d))
    rng = np.random.default_rng(seed + 1)
    rows = []
    for readout in ("last", "all"):
        for solver in SOLVERS:
            n = 100 if solver == "dual" else 300
            lengths = rng.integers(2, 7, size=n)
            lengths[0] = 6
            X = rng.normal(size=(n, 6, d))
            X[~real_tokens(lengths, 6)] = np.nan
            y = mhla_forward(X, V, Q, readout=readout, decays=decays)[..., 0]
            model = LinearAttentionRegressor(readout=readout, decay=tuple(decays), solver=solver,
                                             n_heads="auto", tol=1e-12).fit(X, y)
            X_new = 10.0 * rng.normal(size=(30, 25, d))
            y_new = mhla_forward(X_new, V, Q, readout=readout, decays=decays)[..., 0]
            error = np.abs(model.predict(X_new) - y_new).max() / np.abs(y_new).max()
            rows.append((readout, solver, model.n_heads_, model.head_decays_.tolist(),
                         bool(model.certificate_), float(error)))
    return rows


def _digits():
    images = load_digits().images / 16.0
    X, y = images[:, :7], images[:, 1:]
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    return X_train, X_test, y_train, y_test


def _cpu(function):
    start = time.process_time()
    out = function()
    return time.process_time() - start, out


def search_cost(repeats=1):
    """The search over decay candidates against one fit of the largest candidate (CPU s)."""
    X, X_test, y, y_test = _digits()
    candidates = [None, 0.5, (1.0, 0.5)]
    search_times, plain_times = [], []
    for _ in range(repeats):
        t, search = _cpu(lambda: LinearAttentionRegressorCV(
            readout="all", decays=candidates).fit(X, y))
        search_times.append(t)
        t, _ = _cpu(lambda: LinearAttentionRegressor(readout="all", decay=(1.0, 0.5),
                                                     alpha=search.alpha_).fit(X, y))
        plain_times.append(t)
    per_candidate = {}
    for candidate in candidates:
        model = LinearAttentionRegressorCV(readout="all", decays=[candidate]).fit(X, y)
        per_candidate[str(candidate)] = (model.alpha_,
                                         float(np.mean((model.predict(X_test) - y_test) ** 2)))
    return dict(search=min(search_times), plain=min(plain_times),
                ratio=min(search_times) / min(plain_times), decay=search.decay_,
                alpha=search.alpha_,
                test_mse=float(np.mean((search.predict(X_test) - y_test) ** 2)),
                per_candidate=per_candidate)


def positions_memory():
    """Bytes of X, of the encoded X, and the peak traced memory of the search on it."""
    X, _, y, _ = _digits()
    encoded = PositionalEncoding().fit_transform(X)
    tracemalloc.start()
    LinearAttentionRegressorCV(readout="all").fit(encoded, y)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dict(x_bytes=X.nbytes, encoded_bytes=encoded.nbytes, search_peak_bytes=peak)


def sine_windows(n_windows=300, window=48, period=17.0, noise=0.1, seed=0):
    """Windows of a noisy sine as patches with one-hot positions, the next value as target."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_windows + window)
    s = np.sin(2 * np.pi * t / period) + noise * rng.normal(size=t.size)
    X = s[np.arange(n_windows)[:, None] + np.arange(window)][:, :, None]
    y = s[np.arange(n_windows) + window]
    return PositionalEncoding().fit_transform(Patches(6).fit_transform(X)), y


def joint_cost(repeats=3, n_windows=300, seed=0):
    """One search over JOINT_DECAYS against a search per candidate (wall s, interleaved)."""
    X, y = sine_windows(n_windows, seed=seed)
    functions = {str(c): (lambda c=c: LinearAttentionRegressorCV(decays=[c]).fit(X, y))
                 for c in JOINT_DECAYS}
    functions["joint"] = lambda: LinearAttentionRegressorCV(decays=list(JOINT_DECAYS)).fit(X, y)
    times, last = interleaved_timings(functions, repeats)
    best = {name: min(t) for name, t in times.items()}
    single = [best[str(c)] for c in JOINT_DECAYS]
    joint, separate = last["joint"], [last[str(c)] for c in JOINT_DECAYS]
    n = len(joint.cv_results_["mean_test_score"]) // len(JOINT_DECAYS)
    difference = 0.0
    for i, one in enumerate(separate):
        for key, value in one.cv_results_.items():
            if key.endswith("test_score") and not key.startswith("rank"):
                part = joint.cv_results_[key][i * n:(i + 1) * n]
                difference = max(difference, float(np.max(np.abs(part - value) / np.abs(value))))
    expected = separate[int(np.argmax([one.best_score_ for one in separate]))]
    return dict(shape=X.shape, joint=best["joint"],
                single=dict(zip(map(str, JOINT_DECAYS), single)),
                ratio=best["joint"] / max(single), ratio_sum=best["joint"] / sum(single),
                decay=joint.decay_, alpha=joint.alpha_, solver=joint.solver_,
                same_choice=(joint.decay_, joint.alpha_) == (expected.decay_, expected.alpha_),
                score_difference=difference, all_times=times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=PARTS, nargs="+", default=list(PARTS))
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of the search and joint parts")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS threads (default: the library's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--windows", type=int, default=300, help="sine windows of the joint part")
    args = parser.parse_args(argv)
    with threadpool_limits(args.threads):
        if "teacher" in args.only:
            print("| readout | solver | n_heads_ | head_decays_ | certified | relative OOD error |")
            print("|---|---|---|---|---|---|")
            for row in teacher_table(args.seed):
                print("| {} | {} | {} | {} | {} | {:.1e} |".format(*row))
        if "search" in args.only:
            out = search_cost(args.repeats)
            print(f"\nsearch over decays [None, 0.5, (1.0, 0.5)] x 8 alphas x 5 folds: "
                  f"{out['search']:.2f} s CPU; one fit of (1.0, 0.5): {out['plain']:.2f} s; "
                  f"ratio {out['ratio']:.2f}; chosen decay {out['decay']}, alpha "
                  f"{out['alpha']:g}, test MSE {out['test_mse']:.4f}")
            for candidate, (alpha, mse) in out["per_candidate"].items():
                print(f"  decay {candidate}: alpha {alpha:g}, test MSE {mse:.4f}")
        if "positions" in args.only:
            out = positions_memory()
            print(f"\nX {out['x_bytes'] / 2**20:.2f} MiB, with one-hot positions "
                  f"{out['encoded_bytes'] / 2**20:.2f} MiB; peak traced memory of the search "
                  f"{out['search_peak_bytes'] / 2**20:.0f} MiB")
        if "joint" in args.only:
            out = joint_cost(max(args.repeats, 3), args.windows, args.seed)
            n, T, d = out["shape"]
            print(f"\njoint search over decays {list(JOINT_DECAYS)} (5 folds, 10 alphas) on {n} "
                  f"sine windows ({T} tokens, d = {d}), solver {out['solver']}: "
                  f"{out['joint']:.3f} s; one search per decay: "
                  + ", ".join(f"{c} {t:.3f} s" for c, t in out["single"].items()))
            print(f"  joint / slowest single: {out['ratio']:.2f} (target <= 1.3); joint / sum: "
                  f"{out['ratio_sum']:.2f}; chosen decay {out['decay']}, alpha {out['alpha']:g} "
                  f"(that of the separate searches: {out['same_choice']}); largest relative "
                  f"score difference {out['score_difference']:.1e}")


if __name__ == "__main__":
    main()
