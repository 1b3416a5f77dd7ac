"""The benchmark rows.  Each row measures one ratio, with its baseline, in one run.

=========  ==================================================================
row        ratio (target)
=========  ==================================================================
gram       fit wall time / numpy's ``Phi.T @ Phi`` on the same feature matrix
           (<= 1.5 at d = 16, N = 20 000, n = 64)
adam       Adam (d**2 heads) time to 1e-6 relative validation MSE / closed
           form time, the paper's Sec. 4.1 setting (>= 1000)
samples    samples needed for 1e-6 relative error: KernelRidge(poly, 3) and
           PolynomialFeatures(3) + Ridge against ours (no target)
memory     peak memory of the streaming fit beyond X, 10**6 sequences,
           n = 32, d = 8 (<= 150 MB)
cg         d = 64 fitted with solver="cg", N = 150 000, n = 16
           (<= 10 minutes and <= 4 GB peak)
=========  ==================================================================

Each row function takes a :class:`Context` and returns a list of
:class:`~benchmarks.measure.Result`.  Sizes are in the ``FULL`` and ``QUICK``
dictionaries next to each row; ``--quick`` runs the same code on tiny sizes
and does not judge the targets.
"""

import math
import sys
import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures

from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor, mhla_forward
from sklearn_linattn.datasets import make_random_mhla
from sklearn_linattn import AdamLinearAttentionRegressor
from sklearn_linattn._solvers import cg as cg_solver

from .adam_vs_closed_form import make_data, relative_mse
from .cg_large import teacher_data
from .measure import (
    GB,
    MB,
    Result,
    interleaved_timings,
    measure_peak_memory,
    run_isolated,
)

__all__ = ["ROWS", "Context", "solver_available"]


@dataclass
class Context:
    """Settings shared by every row.

    Attributes
    ----------
    quick : bool
        Tiny sizes; targets are not judged.
    threads : int
        BLAS/OpenMP thread limit (also applied in child processes).
    seed : int
        Seed of every random draw.
    """

    quick: bool = False
    threads: int = 1
    seed: int = 0

    def sizes(self, full, quick):
        """The row's size dictionary for this run."""
        return quick if self.quick else full


def log(message):
    """Progress on stderr (the table goes to stdout and the output file)."""
    print(f"[benchmarks] {message}", file=sys.stderr, flush=True)


def fmt_seconds(seconds):
    """Seconds with three significant digits."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def fmt_bytes(n_bytes):
    """Bytes in MB or GB (10**6, 10**9), three significant digits."""
    if n_bytes >= 1e15:
        return f"{n_bytes / 1e15:.3g} PB"
    if n_bytes >= 1e12:
        return f"{n_bytes / 1e12:.3g} TB"
    if n_bytes >= GB:
        return f"{n_bytes / GB:.3g} GB"
    return f"{n_bytes / MB:.3g} MB"


def fmt_list(seconds):
    """Comma-separated :func:`fmt_seconds`; a summary for more than six values."""
    if len(seconds) > 6:
        return (f"{len(seconds)} rounds: best {fmt_seconds(min(seconds))}, median "
                f"{fmt_seconds(float(np.median(seconds)))}, worst {fmt_seconds(max(seconds))}")
    return ", ".join(fmt_seconds(s) for s in seconds)


def judge(ctx, passed):
    """Status text: PASS / MISS, or n/a in quick mode."""
    if ctx.quick:
        return "n/a (quick)"
    return "PASS" if passed else "MISS"


def relative_error(pred, y):
    """``||pred - y|| / ||y||`` over all outputs (the norm ratio, not the MSE ratio)."""
    pred, y = np.ravel(pred), np.ravel(y)
    return float(np.linalg.norm(pred - y) / np.linalg.norm(y))


def solver_available(solver):
    """Whether ``LinearAttentionRegressor(solver=solver)`` can fit.

    Fits 8 random sequences; a ``ValueError`` whose message names the solver
    parameter means the solver does not exist (yet).

    Returns
    -------
    available : bool
    reason : str
        The error message when not available, else ``""``.
    """
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8, 3, 2))
    y = rng.normal(size=8)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            LinearAttentionRegressor(solver=solver).fit(X, y)
    except ValueError as exc:
        if "solver" in str(exc):
            return False, str(exc)
        raise
    return True, ""


# ---------------------------------------------------------------------------
# gram: fit time against numpy's Phi^T Phi
# ---------------------------------------------------------------------------

GRAM_FULL = dict(ds=(4, 8, 16), n_samples=20_000, n_tokens=64, repeats=3, max_repeats=25,
                 min_time=5.0, target_d=16)
GRAM_QUICK = dict(ds=(2, 3), n_samples=400, n_tokens=8, repeats=2, max_repeats=2,
                  min_time=0.0, target_d=3)
GRAM_TARGET = 1.5


def row_gram(ctx):
    """Fit wall time over the time numpy takes to form ``Phi.T @ Phi``.

    ``Phi`` (N x psi) is the feature matrix of ``LinearAttentionFeatures``,
    formed once before timing and made C-contiguous (numpy's fastest case);
    ``Phi.T @ Phi`` is the one product no least-squares fit on it can avoid.  The fit is
    ``LinearAttentionRegressor().fit(X, y)`` with default parameters: input
    validation, features, least squares, the identifiability certificate
    (``certificate_``) and the heads.  Gram product, feature transform and
    fit run interleaved, round after round (at least 3 rounds, more for
    cheap sizes until 5 s have passed, at most 25); the ratio is of the best
    times.  Multi-threaded BLAS on a machine whose cores are busy with other
    processes can slow a short product by orders of magnitude (its threads
    wait for each other), hence the many rounds; see the load average.
    """
    p = ctx.sizes(GRAM_FULL, GRAM_QUICK)
    n, N = p["n_tokens"], p["n_samples"]
    results = []
    for d in p["ds"]:
        log(f"gram: d = {d}, N = {N}, n = {n}")
        X, y = make_random_mhla(N, n, d, random_state=ctx.seed)
        features = LinearAttentionFeatures().fit(X)
        transformed = features.transform(X)
        layout = "C-contiguous" if transformed.flags.c_contiguous else (
            "F-contiguous" if transformed.flags.f_contiguous else "not contiguous"
        )
        # numpy at its best: a C-contiguous copy (A.T @ A then runs as one BLAS syrk).
        Phi = np.ascontiguousarray(transformed)
        del transformed
        times, last = interleaved_timings(
            {
                "gram": lambda: Phi.T @ Phi,
                "features": lambda: features.transform(X),
                "fit": lambda: LinearAttentionRegressor().fit(X, y),
            },
            p["repeats"], min_time=p["min_time"], max_repeats=p["max_repeats"],
        )
        model = last["fit"]
        best = {k: min(v) for k, v in times.items()}
        ratio = best["fit"] / best["gram"]
        paired = [f / g for f, g in zip(times["fit"], times["gram"])]
        has_target = d == p["target_d"]
        cert = getattr(model, "certificate_", None)
        details = [
            f"psi = {Phi.shape[1]}; Phi is {Phi.shape[0]} x {Phi.shape[1]} float64 "
            f"({fmt_bytes(Phi.nbytes)}), timed as a C-contiguous array "
            f"(`transform` returned it {layout}); X is {fmt_bytes(X.nbytes)}.",
            f"`Phi.T @ Phi`: {fmt_list(times['gram'])}; "
            f"`LinearAttentionFeatures().transform(X)`: {fmt_list(times['features'])}; "
            f"`fit`: {fmt_list(times['fit'])} (interleaved).",
            f"Ratio of the bests {ratio:.2f}; per-round ratios fit / gram: median "
            f"{np.median(paired):.2f}, range {min(paired):.2f} to {max(paired):.2f}.",
        ]
        if cert is not None:
            details.append(
                f"Certificate computed by the fit: identifiable = {bool(cert)}, "
                f"rank {cert.rank}/{cert.n_features}, lambda_min = {cert.min_eigenvalue:.3g}."
            )
        else:
            details.append("The fitted model has no `certificate_` attribute.")
        results.append(
            Result(
                row="gram",
                label=f"fit / Phi^T Phi, d = {d}",
                setting=f"N = {N}, n = {n}, d = {d} (psi = {Phi.shape[1]}), readout last",
                measured=f"fit {fmt_seconds(best['fit'])}",
                baseline=f"`Phi.T @ Phi` {fmt_seconds(best['gram'])}",
                ratio=f"{ratio:.2f}",
                target=f"<= {GRAM_TARGET}" if has_target else "no target",
                status=judge(ctx, ratio <= GRAM_TARGET) if has_target else "reported",
                details=details,
            )
        )
    return results


# ---------------------------------------------------------------------------
# adam: closed form against Adam with d^2 heads (Sec. 4.1)
# ---------------------------------------------------------------------------

ADAM_FULL = dict(
    d=4, n_samples=2048, n_tokens=100, learning_rate=1e-2, batch_size=32, max_epochs=200,
    validation_fraction=0.1, repeats=3,
)
ADAM_QUICK = dict(
    d=2, n_samples=64, n_tokens=8, learning_rate=1e-2, batch_size=32, max_epochs=5,
    validation_fraction=0.25, repeats=1,
)
ADAM_GOAL = 1e-6  # relative validation MSE
ADAM_TARGET = 1000.0
ADAM_REPEAT_BUDGET = 60.0  # seconds of Adam runs after which it is not repeated


def row_adam(ctx):
    """Wall time to 1e-6 relative validation MSE: Adam (d**2 heads) / closed form.

    Data of the paper's Sec. 4.1 (``adam_vs_closed_form.make_data``): a
    one-head generator, N sequences of T tokens with N(0, 1/T) entries,
    targets at every position (readout ``"all"``).  Adam
    (``AdamLinearAttentionRegressor``, d**2 heads, cosine schedule over
    ``max_epochs`` epochs) holds out ``validation_fraction`` of the N
    sequences and stops at the first epoch below 1e-6; its time is
    ``elapsed_`` at that epoch.  The closed form is fitted on the first
    ``(1 - validation_fraction) N`` sequences and validated on the rest.
    Runs alternate closed form, Adam, closed form, ... (best of each); Adam,
    with the same seed each time, is repeated only while its runs took less
    than a minute in total.
    """
    p = ctx.sizes(ADAM_FULL, ADAM_QUICK)
    d, N, T = p["d"], p["n_samples"], p["n_tokens"]
    n_heads = d * d
    log(f"adam: d = {d}, N = {N}, T = {T}, {n_heads} heads, up to {p['max_epochs']} epochs")
    X, y = make_data(np.random.default_rng(ctx.seed), N, T, d)
    n_val = math.ceil(p["validation_fraction"] * N)
    X_tr, y_tr, X_val, y_val = X[:-n_val], y[:-n_val], X[-n_val:], y[-n_val:]

    def closed_form():
        return LinearAttentionRegressor(readout="all").fit(X_tr, y_tr)

    def adam_fit():
        model = AdamLinearAttentionRegressor(
            n_heads=n_heads, readout="all", learning_rate=p["learning_rate"],
            batch_size=p["batch_size"], max_epochs=p["max_epochs"],
            validation_fraction=p["validation_fraction"], tol=ADAM_GOAL,
            random_state=ctx.seed,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # reported below instead
            return model.fit(X, y)

    # closed, Adam, closed, Adam, ..., closed: Adam (same seed, same run) is
    # repeated only while its runs stay within ADAM_REPEAT_BUDGET seconds.
    closed_times, adam_runs = [], []
    for _ in range(p["repeats"]):
        times, last = interleaved_timings({"closed": closed_form}, 1)
        closed_times += times["closed"]
        if not adam_runs or sum(a.elapsed_[-1] for a in adam_runs) < ADAM_REPEAT_BUDGET:
            adam_runs.append(adam_fit())
    times, last = interleaved_timings({"closed": closed_form}, 1)
    closed_times += times["closed"]
    closed_time = min(closed_times)
    closed_mse = relative_mse(last["closed"], X_val, y_val)
    adam = min(adam_runs, key=lambda a: a.elapsed_[-1])
    curve = np.asarray(adam.validation_curve_)
    reached = bool(curve[-1] < ADAM_GOAL)
    adam_time = adam.elapsed_[-1]
    ratio = adam_time / closed_time
    closed_ok = closed_mse < ADAM_GOAL
    if not closed_ok:
        status = judge(ctx, False)
        ratio_text = f"{ratio:.3g}"
    elif reached:
        status = judge(ctx, ratio >= ADAM_TARGET)
        ratio_text = f"{ratio:.3g}"
    else:
        # Adam never got there: its whole run only bounds the ratio from below.
        status = judge(ctx, True) if ratio >= ADAM_TARGET else (
            "n/a (quick)" if ctx.quick else "INCONCLUSIVE"
        )
        ratio_text = f"> {ratio:.3g}"
    best = int(np.argmin(curve))
    adam_text = (
        f"Adam {fmt_seconds(adam_time)} to {ADAM_GOAL:g} (epoch {adam.n_iter_})"
        if reached
        else f"Adam did not reach {ADAM_GOAL:g} in {adam.n_iter_} epochs "
        f"({fmt_seconds(adam_time)}; best {curve[best]:.2e})"
    )
    return [
        Result(
            row="adam",
            label="Adam (d^2 heads) / closed form, time to 1e-6 val. MSE",
            setting=f"Sec. 4.1: d = {d}, N = {N}, T = {T}, readout all, {n_heads} heads",
            measured=adam_text,
            baseline=f"closed form {fmt_seconds(closed_time)} (val. MSE {closed_mse:.1e})",
            ratio=ratio_text,
            target=f">= {ADAM_TARGET:g}",
            status=status,
            details=[
                f"Adam: learning rate {p['learning_rate']:g}, batch {p['batch_size']}, "
                f"cosine schedule over max_epochs = {p['max_epochs']} epochs (5% warm-up), "
                f"validation on {n_val} held-out sequences, random_state = {ctx.seed}; "
                f"ran {adam.n_iter_} epochs; relative validation MSE "
                f"{curve[-1]:.2e} at the end, best {curve[best]:.2e} at epoch {best + 1} "
                f"({fmt_seconds(adam.elapsed_[best])}). Its time includes the validation "
                "after each epoch (how it knows it has reached the target).",
                "Adam runs (same seed, interleaved with the closed form): "
                + ", ".join(f"{fmt_seconds(a.elapsed_[-1])} ({a.n_iter_} epochs)"
                            for a in adam_runs) + ".",
                f"Closed form (`LinearAttentionRegressor(readout=\"all\")`) on {N - n_val} "
                f"training sequences: {fmt_list(closed_times)} (in call order, one before "
                f"each Adam run and one at the end); relative validation MSE "
                f"{closed_mse:.2e} on the {n_val} held-out sequences.",
            ],
        )
    ]


# ---------------------------------------------------------------------------
# samples: samples needed against polynomial baselines on flattened sequences
# ---------------------------------------------------------------------------

SAMPLES_FULL = dict(settings=((8, 4), (100, 4)), n_test=2000, max_samples=2**14,
                    memory_limit=1 * GB)
SAMPLES_QUICK = dict(settings=((3, 2), (12, 2)), n_test=200, max_samples=2**9,
                     memory_limit=2 * MB)
SAMPLES_GOAL = 1e-6  # relative error ||pred - y|| / ||y||
BASELINE_ALPHA = 1e-9


def _grow(fit_error, grid, bytes_needed, memory_limit):
    """Fit on the first N samples for N in ``grid`` until the error is small.

    Returns
    -------
    reached : int or None
        First N whose error is below :data:`SAMPLES_GOAL`.
    history : list of (N, error)
    stop : str
        Why the growth stopped.
    """
    history = []
    for N in grid:
        need = bytes_needed(N)
        if need > memory_limit:
            return None, history, (
                f"N = {N} needs {fmt_bytes(need)} for its largest array, above the "
                f"memory limit of {fmt_bytes(memory_limit)}"
            )
        error = fit_error(N)
        history.append((N, error))
        if error < SAMPLES_GOAL:
            return N, history, f"error below {SAMPLES_GOAL:g} at N = {N}"
    return None, history, f"stopped at the cap N = {grid[-1]}"


def _chunked_predict(model, X, max_bytes_per_row, memory_limit):
    """Predict in row chunks so that transformed test rows fit the limit."""
    step = max(1, int(memory_limit // max(1, max_bytes_per_row)))
    return np.concatenate([model.predict(X[i:i + step]) for i in range(0, len(X), step)])


def _history_text(history):
    """``"N: error, ..."`` of a growth history."""
    return ", ".join(f"{N}: {err:.1e}" for N, err in history) or "none"


def row_samples(ctx):
    """Samples needed to reach 1e-6 relative error, ours against polynomial baselines.

    For each (n, d): a one-head teacher (entries N(0, 1/d)), unit-variance
    tokens (so the monomials of every degree have comparable scale: fair to
    the polynomial baselines), noise-free targets at the last token.  N grows
    through powers of 2 from psi/4 on nested training sets.  Ours
    (``LinearAttentionRegressor()``, alpha = 0) is scored on unseen sequences
    of length 2n; ``KernelRidge(kernel="poly", degree=3)`` and
    ``PolynomialFeatures(3) + Ridge`` (alpha = 1e-9, no noise to regularise
    against) see each sequence flattened to n*d columns, so they cannot take
    longer sequences: they are scored on unseen sequences of length n.  A
    baseline stops when its largest array (kernel N x N; design N x
    C(nd + 3, 3)) would exceed the memory limit.  N only takes powers of 2,
    so each count (and the ratio) is resolved to a factor of 2.  Settings:
    n = 8, d = 4 (the paper's d, short sequences), where both baselines
    reach the goal within the memory limit in about a minute; n = 100, d = 4
    (the paper's T), where they cannot.
    """
    p = ctx.sizes(SAMPLES_FULL, SAMPLES_QUICK)
    limit = p["memory_limit"]
    results = []
    for n, d in p["settings"]:
        psi = d * d * (d + 1) // 2
        nd = n * d
        n_poly = math.comb(nd + 3, 3)
        grid = [2**k for k in range(max(0, math.ceil(math.log2(psi / 4))),
                                    int(math.log2(p["max_samples"])) + 1)]
        log(f"samples: n = {n}, d = {d}, psi = {psi}, C({nd}+3, 3) = {n_poly}")
        rng = np.random.default_rng(ctx.seed)
        X, y, V, Q = teacher_data(rng, grid[-1], n, d, token_scale=1.0)
        X_same = rng.standard_normal((p["n_test"], n, d))
        y_same = mhla_forward(X_same, V, Q)[:, 0]
        X_long = rng.standard_normal((p["n_test"], 2 * n, d))
        y_long = mhla_forward(X_long, V, Q)[:, 0]
        flat, flat_same = X.reshape(len(X), nd), X_same.reshape(len(X_same), nd)
        ours_same = {}

        def ours(N):
            model = LinearAttentionRegressor().fit(X[:N], y[:N])
            ours_same[N] = relative_error(model.predict(X_same), y_same)
            return relative_error(model.predict(X_long), y_long)

        def kernel_ridge(N):
            model = KernelRidge(alpha=BASELINE_ALPHA, kernel="poly", degree=3)
            model.fit(flat[:N], y[:N])
            pred = _chunked_predict(model, flat_same, 8 * N, limit)
            return relative_error(pred, y_same)

        def poly_ridge(N):
            model = make_pipeline(PolynomialFeatures(3), Ridge(alpha=BASELINE_ALPHA))
            model.fit(flat[:N], y[:N])
            pred = _chunked_predict(model, flat_same, 8 * n_poly, limit)
            return relative_error(pred, y_same)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ill-conditioning warnings of the baselines
            ours_n, ours_hist, ours_stop = _grow(ours, grid, lambda N: 0, limit)
            krr = _grow(kernel_ridge, grid, lambda N: 8 * N * N, limit)
            poly = _grow(poly_ridge, grid, lambda N: 8 * N * n_poly, limit)
        ours_text = (
            f"ours {ours_n} (error {ours_hist[-1][1]:.1e} at length {2 * n})"
            if ours_n else f"ours did not reach {SAMPLES_GOAL:g} ({ours_stop})"
        )
        setting = (f"n = {n}, d = {d} (psi = {psi}; flattened: {nd} columns, "
                   f"C({nd}+3, 3) = {n_poly} cubic monomials)")
        common = [
            f"Ours, relative error on length-{2 * n} sequences by N: "
            f"{_history_text(ours_hist)} ({ours_stop}); on length-{n} sequences: "
            + ", ".join(f"{N}: {e:.1e}" for N, e in ours_same.items()) + ".",
            f"Baselines are scored on {p['n_test']} unseen sequences of the training "
            f"length {n}: flattened to {nd} columns, they cannot accept longer sequences.",
        ]
        full_design = 8.0 * n_poly * n_poly
        for name, (reached, hist, stop) in (
            ("KernelRidge(poly, 3)", krr),
            ("PolynomialFeatures(3) + Ridge", poly),
        ):
            details = common + [
                f"{name}, relative error by N: {_history_text(hist)} ({stop})."
            ]
            common = []  # said once per setting
            if name.startswith("Poly"):
                details.append(
                    f"PolynomialFeatures(3) on {nd} columns has C({nd}+3, 3) = {n_poly} "
                    f"columns; a square design (as many rows as columns) would take "
                    f"{fmt_bytes(full_design)}."
                )
            if reached and ours_n:
                measured = f"{name} {reached} (error {hist[-1][1]:.1e} at length {n})"
                ratio = f"{reached / ours_n:.3g}"
            elif not hist:
                measured = f"{name}: does not fit in memory ({stop})"
                ratio = "-"
            else:
                measured = (f"{name} did not reach {SAMPLES_GOAL:g} by N = {hist[-1][0]} "
                            f"(error {hist[-1][1]:.1e}); {stop}")
                ratio = f"> {hist[-1][0] / ours_n:.3g}" if ours_n else "-"
            results.append(
                Result(
                    row="samples",
                    label=f"samples to 1e-6 rel. error: {name.split('(')[0]} / ours, "
                    f"n = {n}, d = {d}",
                    setting=setting,
                    measured=measured,
                    baseline=ours_text,
                    ratio=ratio,
                    details=details,
                )
            )
    return results


# ---------------------------------------------------------------------------
# memory: peak memory of the streaming fit beyond X
# ---------------------------------------------------------------------------

MEMORY_FULL = dict(n_samples=10**6, n_tokens=32, d=8, batch=10_000, timeout=1800)
MEMORY_QUICK = dict(n_samples=3000, n_tokens=8, d=3, batch=500, timeout=300)
MEMORY_TARGET = 150 * MB


def memory_child(n_samples, n_tokens, d, seed, mode, batch):
    """Create X, then measure the fit alone (runs in a fresh process).

    Parameters
    ----------
    mode : {"fit", "partial_fit"}
        ``fit(X, y)`` on all of X, or ``partial_fit`` over consecutive
        batches of ``batch`` sequences (views of X).

    Returns
    -------
    dict
    """
    rng = np.random.default_rng(seed)
    X, y, V, Q = teacher_data(rng, n_samples, n_tokens, d, token_scale=1 / np.sqrt(n_tokens))
    model = LinearAttentionRegressor()

    def fit():
        if mode == "fit":
            model.fit(X, y)
        else:
            for start in range(0, n_samples, batch):
                model.partial_fit(X[start:start + batch], y[start:start + batch])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peak, _ = measure_peak_memory(fit)
    X_check = rng.standard_normal((1000, 2 * n_tokens, d)) / np.sqrt(n_tokens)
    y_check = mhla_forward(X_check, V, Q)[:, 0]
    return dict(
        x_bytes=X.nbytes, y_bytes=y.nbytes, seconds=peak.seconds,
        traced_peak=peak.traced_peak, rss_before=peak.rss_before, rss_peak=peak.rss_peak,
        rss_growth=peak.rss_growth, rss_reset=peak.rss_reset, beyond=peak.beyond,
        error=relative_error(model.predict(X_check), y_check),
        warnings=sorted({str(w.message) for w in caught}),
    )


def row_memory(ctx):
    """Peak memory of the streaming fit beyond the size of X.

    In a fresh process: X (float64) and y are created first, in place; then
    tracemalloc starts and the peak RSS is reset, and only the fit runs.
    "Beyond X" is the larger of the tracemalloc peak (allocations made by the
    fit, numpy arrays included) and the growth of the process peak RSS over
    the RSS before the fit; both must be under the target.  ``fit(X, y)`` is
    the main row; ``partial_fit`` over batches of X is measured when the
    estimator has it.
    """
    p = ctx.sizes(MEMORY_FULL, MEMORY_QUICK)
    N, n, d = p["n_samples"], p["n_tokens"], p["d"]
    results = []
    for mode in ("fit", "partial_fit"):
        label = f"streaming `{mode}`: peak beyond X / size of X"
        setting = f"N = {N}, n = {n}, d = {d}, float64, readout last"
        if mode == "partial_fit":
            setting += f", batches of {p['batch']}"
            if not hasattr(LinearAttentionRegressor, "partial_fit"):
                results.append(Result(
                    row="memory", label=label, setting=setting,
                    measured="not available: LinearAttentionRegressor has no partial_fit",
                    target=f"<= {fmt_bytes(MEMORY_TARGET)} beyond X",
                    status="not available",
                ))
                continue
        log(f"memory: {mode}, N = {N}, n = {n}, d = {d} (fresh process)")
        try:
            out, timed_out = run_isolated(
                memory_child,
                dict(n_samples=N, n_tokens=n, d=d, seed=ctx.seed, mode=mode,
                     batch=p["batch"]),
                threads=ctx.threads, timeout=p["timeout"],
            )
        except RuntimeError as exc:  # e.g. a partial_fit with another signature
            print(exc, file=sys.stderr)
            lines = str(exc).strip().splitlines()
            results.append(Result(
                row="memory", label=label, setting=setting,
                measured=f"error: {lines[-1] if lines else exc}",
                target=f"<= {fmt_bytes(MEMORY_TARGET)} beyond X", status="ERROR",
            ))
            continue
        if timed_out:
            results.append(Result(
                row="memory", label=label, setting=setting,
                measured=f"did not finish in {fmt_seconds(p['timeout'])} (stopped)",
                target=f"<= {fmt_bytes(MEMORY_TARGET)} beyond X", status="ERROR",
            ))
            continue
        growth = out["rss_growth"]
        details = [
            f"X: {fmt_bytes(out['x_bytes'])}; y: {fmt_bytes(out['y_bytes'])} "
            "(both created before the measurement).",
            f"tracemalloc peak during the fit: {fmt_bytes(out['traced_peak'])}; "
            f"process RSS before the fit {fmt_bytes(out['rss_before'] or 0)}, peak "
            f"during it {fmt_bytes(out['rss_peak'] or 0)} (growth "
            f"{'unknown' if growth is None else fmt_bytes(growth)}; peak RSS reset "
            f"before the fit: {out['rss_reset']}).",
            f"Fit wall time (tracemalloc on): {fmt_seconds(out['seconds'])}; relative "
            f"error on 1000 unseen sequences of length {2 * n}: {out['error']:.1e}.",
        ]
        if out["warnings"]:
            details.append("Warnings during the fit: " + "; ".join(out["warnings"]))
        results.append(Result(
            row="memory", label=label, setting=setting,
            measured=(f"{fmt_bytes(out['beyond'])} beyond X (tracemalloc "
                      f"{fmt_bytes(out['traced_peak'])}, RSS +"
                      f"{'?' if growth is None else fmt_bytes(growth)})"),
            baseline=f"X {fmt_bytes(out['x_bytes'])}",
            ratio=f"{out['beyond'] / out['x_bytes']:.3g}",
            target=f"<= {fmt_bytes(MEMORY_TARGET)} beyond X",
            status=judge(ctx, out["beyond"] <= MEMORY_TARGET),
            details=details,
        ))
    return results


# ---------------------------------------------------------------------------
# cg: d = 64 with the matrix-free solver
# ---------------------------------------------------------------------------

CG_FULL = dict(n_samples=150_000, n_tokens=16, d=64, timeout=1200)
CG_QUICK = dict(n_samples=300, n_tokens=4, d=4, timeout=300)
CG_TIME_TARGET = 240.0
CG_MEMORY_TARGET = 4 * GB
CG_BOUND_TARGET = 100.0  # the lower bound on lambda_min within this factor of the upper one


def cg_child(n_samples, n_tokens, d, seed):
    """Create X, then time ``fit`` with ``solver="cg"`` (runs in a fresh process)."""
    rng = np.random.default_rng(seed)
    X, y, V, Q = teacher_data(rng, n_samples, n_tokens, d, token_scale=1 / np.sqrt(n_tokens))
    model = LinearAttentionRegressor(solver="cg")
    # The solver's own record of its phases (it shares passes between the fit
    # and the certificate, so only it can tell where the time went).
    solutions = []
    original = cg_solver.solve_implicit

    def keep(*args, **kwargs):
        solutions.append(original(*args, **kwargs))
        return solutions[-1]

    cg_solver.solve_implicit = keep
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # RSS only: tracemalloc would slow down the timed fit.
            peak, _ = measure_peak_memory(lambda: model.fit(X, y), trace=False)
    finally:
        cg_solver.solve_implicit = original
    X_check = rng.standard_normal((200, n_tokens, d)) / np.sqrt(n_tokens)
    y_check = mhla_forward(X_check, V, Q)[:, 0]
    cert = model.certificate_
    return dict(
        x_bytes=X.nbytes, seconds=peak.seconds, rss_before=peak.rss_before,
        rss_peak=peak.rss_peak, rss_growth=peak.rss_growth, rss_reset=peak.rss_reset,
        error=relative_error(model.predict(X_check), y_check),
        warnings=sorted({str(w.message) for w in caught}),
        n_iter=int(model.n_iter_), identifiable=bool(cert),
        lambda_min=cert.min_eigenvalue, lambda_min_error=cert.min_eigenvalue_error,
        lambda_max=cert.max_eigenvalue, tol=cert.tol,
        diagnostics=solutions[-1].diagnostics if solutions else None,
    )


def _cg_split(diag):
    """Seconds of the fit (caching pass, CG until its columns converged) and of the certificate."""
    fit = diag["setup_seconds"] + diag["fit_seconds"]
    certificate = (diag["lambda_max_seconds"] + diag["block_cg_seconds"] - diag["fit_seconds"]
                   + diag["bounds_seconds"] + diag["lobpcg_seconds"])
    return fit, certificate


def _cg_phases(diag):
    """Details lines: the fit's and the certificate's share of a "cg" fit."""
    if not diag:
        return ["The solver recorded no phases (psi too small for the iterative certificate)."]
    fit, certificate = _cg_split(diag)
    return [
        f"Fit: {fmt_seconds(fit)} = the pass that caches the row factors "
        f"{fmt_seconds(diag['setup_seconds'])} + block CG until the fit's columns converged "
        f"({diag['fit_iterations']} iterations, {fmt_seconds(diag['fit_seconds'])}; those "
        f"passes also carried the certificate's {diag['n_probes']} probes).",
        f"Certificate beyond that: {fmt_seconds(certificate)} = lambda_max by Lanczos "
        f"{fmt_seconds(diag['lambda_max_seconds'])} + the probes' remaining CG "
        f"{fmt_seconds(diag['block_cg_seconds'] - diag['fit_seconds'])} (iterations per stage "
        f"{diag['probe_iterations']}) + exact residuals and Rayleigh-Ritz "
        f"{fmt_seconds(diag['bounds_seconds'])} + LOBPCG {fmt_seconds(diag['lobpcg_seconds'])} "
        f"({diag['lobpcg_iterations']} iterations).",
    ]


def row_cg(ctx):
    """d = 64 (psi = 133 120) fitted with ``solver="cg"``: time, peak memory, lambda_min bound.

    Availability is detected at run time: ``LinearAttentionRegressor(
    solver="cg").fit`` raising a ValueError that names the solver means
    "not available".  In a fresh process, X and y are created in place, then
    the fit (with its certificate) alone is timed; the peak is the process
    peak RSS (X included), against 4 GB.  The split between fit and
    certificate is the solver's own record (``SpectralSolution.diagnostics``):
    the fit is the caching pass plus the block CG until the fit's columns
    converged; the rest (lambda_max, the probes' further iterations, the
    bounds) is the certificate's.  The target on the lower bound of
    lambda_min: within 100x of the Rayleigh quotient above it.  The child is
    stopped after 20 minutes (data generation included).
    """
    p = ctx.sizes(CG_FULL, CG_QUICK)
    N, n, d = p["n_samples"], p["n_tokens"], p["d"]
    psi = d * d * (d + 1) // 2
    target = (f"<= {CG_TIME_TARGET / 60:g} min, <= {fmt_bytes(CG_MEMORY_TARGET)} peak, "
              f"lambda_min bound within {CG_BOUND_TARGET:g}x")
    result = Result(
        row="cg", label="solver=\"cg\": fit and certificate time, peak RSS, lambda_min bound",
        setting=f"N = {N}, n = {n}, d = {d} (psi = {psi}), readout last", target=target,
    )
    available, reason = solver_available("cg")
    if not available:
        result.measured = f"not available: {reason}"
        result.status = "not available"
        return [result]
    log(f"cg: N = {N}, n = {n}, d = {d} (fresh process, up to {p['timeout']} s)")
    out, timed_out = run_isolated(
        cg_child, dict(n_samples=N, n_tokens=n, d=d, seed=ctx.seed),
        threads=ctx.threads, timeout=p["timeout"],
    )
    if timed_out:
        peak = out.get("peak_rss")
        result.measured = (
            f"did not finish in {p['timeout'] / 60:g} min (stopped); peak RSS by then "
            + ("unknown" if peak is None else fmt_bytes(peak))
        )
        result.status = judge(ctx, False)
        result.details = [
            f"The child process (its data generation included) was stopped after "
            f"{p['timeout'] / 60:g} min, {p['timeout'] / CG_TIME_TARGET:g} x the time "
            "target. The peak RSS is that of the child (X included) since the fit began, "
            "read from /proc when it was stopped."
        ]
        return [result]
    lower = out["lambda_min"] - out["lambda_min_error"]
    spread = out["lambda_min"] / lower if lower > 0 else np.inf
    diag = out.get("diagnostics")
    split = ""
    if diag:
        fit, certificate = _cg_split(diag)
        split = (f" (fit {fmt_seconds(fit)}, certificate {fmt_seconds(certificate)}, the rest "
                 f"{fmt_seconds(out['seconds'] - fit - certificate)})")
    result.measured = (f"fit with certificate {fmt_seconds(out['seconds'])}{split}, peak RSS "
                       f"{fmt_bytes(out['rss_peak'] or 0)}, lambda_min in "
                       f"[{lower:.3g}, {out['lambda_min']:.3g}]")
    result.baseline = (f"targets {fmt_seconds(CG_TIME_TARGET)}, "
                       f"{fmt_bytes(CG_MEMORY_TARGET)}, bound within {CG_BOUND_TARGET:g}x; "
                       f"X {fmt_bytes(out['x_bytes'])}")
    result.ratio = (f"time {out['seconds'] / CG_TIME_TARGET:.3g}, "
                    f"memory {(out['rss_peak'] or 0) / CG_MEMORY_TARGET:.3g} (of target), "
                    f"bound {spread:.3g}x")
    result.status = judge(
        ctx, out["seconds"] <= CG_TIME_TARGET and (out["rss_peak"] or 0) <= CG_MEMORY_TARGET
        and spread <= CG_BOUND_TARGET
    )
    result.details = [
        f"X: {fmt_bytes(out['x_bytes'])}; process RSS before the fit "
        f"{fmt_bytes(out['rss_before'] or 0)}, growth during it "
        f"{fmt_bytes(out['rss_growth'] or 0)} (peak reset before the fit: {out['rss_reset']}).",
        f"Relative error on 200 unseen sequences: {out['error']:.1e}; CG iterations "
        f"{out['n_iter']}.",
        f"Certificate computed by the fit: identifiable = {out['identifiable']}, lambda_min "
        f"in [{out['lambda_min'] - out['lambda_min_error']:.3g}, {out['lambda_min']:.3g}] "
        f"(a randomized lower bound and a Rayleigh quotient), lambda_max = "
        f"{out['lambda_max']:.3g}, tol = {out['tol']:.3g}.",
    ]
    result.details += _cg_phases(out.get("diagnostics"))
    if out["warnings"]:
        result.details.append("Warnings during the fit: " + "; ".join(out["warnings"]))
    return [result]


# ---------------------------------------------------------------------------
# dask: matrix-free cg on a dask array, 1 against 2 worker processes
# ---------------------------------------------------------------------------

DASK_FULL = dict(d=32, n_samples=20_000, n_tokens=16, blocks=4)
DASK_QUICK = dict(d=3, n_samples=400, n_tokens=4, blocks=4)


def row_dask(ctx):
    """``solver="cg"`` on a dask array: 1 against 2 single-threaded worker processes.

    ``benchmarks/dask_cg.py``: the data are generated and persisted on a
    ``distributed.LocalCluster`` before the clock starts; the fit keeps the
    blocks' row factors on the workers and every product is a map-reduce
    over them.  The client and each worker use one BLAS thread; the
    in-memory fit (one thread) is the reference of the coefficients.  No
    target: the figure shows what a second worker buys on this machine.
    """
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        return [Result(row="dask", label="dask cg: 1 worker / 2 workers",
                       setting="needs the dask extra", measured=f"not available: {exc}",
                       status="not available")]
    from . import dask_cg

    p = ctx.sizes(DASK_FULL, DASK_QUICK)
    args = dask_cg.build_parser().parse_args(
        ["--d", str(p["d"]), "--n-samples", str(p["n_samples"]), "--n-tokens",
         str(p["n_tokens"]), "--blocks", str(p["blocks"]), "--seed", str(ctx.seed)])
    log(f"dask: d = {p['d']}, N = {p['n_samples']}, n = {p['n_tokens']}, 1 and 2 workers")
    out = dask_cg.run(args)
    one, two = out["runs"]
    return [Result(
        row="dask",
        label="dask cg: fit on 1 worker / on 2 workers",
        setting=(f"N = {p['n_samples']}, n = {p['n_tokens']}, d = {p['d']} (psi = "
                 f"{out['psi']}), readout last, {p['blocks']} blocks"),
        measured=f"1 worker {fmt_seconds(one['seconds'])}",
        baseline=f"2 workers {fmt_seconds(two['seconds'])}",
        ratio=f"{one['seconds'] / two['seconds']:.2f}",
        target="no target",
        status="reported",
        details=[
            f"In memory (`solver=\"cg\"`, one BLAS thread): "
            f"{fmt_seconds(out['in_memory_seconds'])}, {out['in_memory_n_iter']} CG iterations.",
        ] + [
            f"{r['workers']} worker process(es), BLAS threads per worker "
            f"{r['worker_blas_threads']}: {fmt_seconds(r['seconds'])}, {r['n_iter']} CG "
            f"iterations, identifiable {r['identifiable']}, largest coefficient difference "
            f"from the in-memory fit {r['max_coef_difference']:.1e} of the largest "
            "coefficient." + (f" Warnings: {'; '.join(r['warnings'])}" if r["warnings"] else "")
            for r in out["runs"]
        ],
    )]


ROWS = {
    "gram": row_gram,
    "adam": row_adam,
    "samples": row_samples,
    "memory": row_memory,
    "cg": row_cg,
    "dask": row_dask,
}
