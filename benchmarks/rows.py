"""The benchmark rows.  Each row measures one ratio, with its baseline, in one run.

=========  ==================================================================
row        ratio (target)
=========  ==================================================================
gram       fit wall time / (per-sequence moments + the SYRK ``Phi^T Phi``),
           d = 4, 8, 16, 32, N = 20 000, n = 64 (<= 1.5 at d = 4 and 8,
           <= 1.0 at d = 16 and 32)
adam       Adam (d**2 heads) time to 1e-6 relative validation MSE / closed
           form time, the paper's Sec. 4.1 setting: the paper's recipe and
           parametrisation, and the package's learner tuned (>= 1000)
samples    samples needed for 1e-6 relative error: KernelRidge(poly, 3) and
           PolynomialFeatures(3) + Ridge against ours (no target)
memory     peak memory of the streaming fit beyond X, 10**6 sequences,
           n = 32, d = 8 (<= 150 MB)
cg         d = 64 fitted with solver="cg", N = 150 000, n = 16
           (<= 4 minutes, <= 4 GB peak, lambda_min bound within 100x)
dask       solver="cg" on a dask array, 1 against 2 worker processes
           (no target)
cv         LinearAttentionRegressorCV (5 folds, 10 alphas) / one plain fit at
           the chosen alpha: digits next-row with positions (d = 15) and
           synthetic data (<= 3)
real       aeon's bundled regression sets and the digits: test RMSE of ours
           / RidgeCV (<= 1 on every set), / ROCKET on Covid3Month (<= 1.05),
           fit time of ours / ROCKET (<= 1)
=========  ==================================================================

Each row function takes a :class:`Context` and returns a list of
:class:`~benchmarks.measure.Result`.  Sizes are in the ``FULL`` and ``QUICK``
dictionaries next to each row; ``--quick`` runs the same code on tiny sizes
and does not judge the targets.
"""

import faulthandler
import importlib.util
import math
import re
import sys
import warnings
from dataclasses import dataclass

import numpy as np
from sklearn.kernel_ridge import KernelRidge
from sklearn.linear_model import Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import PolynomialFeatures

from sklearn_linattn import LinearAttentionFeatures, LinearAttentionRegressor, mhla_forward
from sklearn_linattn._solvers import cg as cg_solver

from .adam_vs_closed_form import (
    PAPER_RECIPE,
    TUNED_SCHEDULE,
    fit_numpy,
    make_data,
    milestones,
    relative_mse,
    torch_available,
    train_paper_recipe_torch,
)
from .cg_large import teacher_data
from .fit_vs_gram import (
    STAGE_TEXT,
    STAGES,
    check_stages,
    fit_stages,
    moments,
    syrk_blas,
    syrk_numpy,
)
from .fit_vs_gram import data as gram_data
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
    gram_ds : tuple of int or None
        The token dimensions of the ``gram`` row (None: 4, 8, 16 and 32).
    threads : int
        BLAS/OpenMP thread limit (also applied in child processes).
    seed : int
        Seed of every random draw.
    """

    quick: bool = False
    threads: int = 1
    seed: int = 0
    gram_ds: tuple = None  # the gram row's token dimensions (None: the row's own)

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
# gram: fit time against the unavoidable work (moments + SYRK)
# ---------------------------------------------------------------------------

GRAM_FULL = dict(ds=(4, 8, 16, 32), n_samples=20_000, n_tokens=64, repeats=3, max_repeats=25,
                 min_time=5.0, large_d=32, large_repeats=2, timeout=5400)
GRAM_QUICK = dict(ds=(2, 3), n_samples=400, n_tokens=8, repeats=2, max_repeats=2,
                  min_time=0.0, large_d=3, large_repeats=2, timeout=300)
# The targets: the fit within 1.5 times the baseline at small d, within it at d >= 16
# (where the Gram's two symmetries halve the SYRK's multiply-adds).
GRAM_TARGETS = {4: 1.5, 8: 1.5, 16: 1.0, 32: 1.0}


def gram_target(d):
    """The target ratio at d (the small-d one for the quick sizes)."""
    return GRAM_TARGETS.get(d, 1.5)


def _discard(func, *args):
    """``func(*args)`` for timing only: its (large) result is not kept between rounds."""
    def call():
        func(*args)
    return call


def gram_child(d, n_samples, n_tokens, seed, repeats, max_repeats, min_time):
    """Moments, both SYRKs, the fit and its stage-by-stage replay, interleaved (one d).

    Runs in a fresh process: ``Phi`` and the Gram matrices of one d are gone
    before the next, and a crash inside BLAS ends this process only.

    Returns
    -------
    dict
    """
    faulthandler.enable()  # a crash inside BLAS prints where it happened
    X, y = gram_data(d, n_samples, n_tokens, seed)
    lengths = np.full(n_samples, n_tokens)
    transformed = LinearAttentionFeatures().fit(X).transform(X)
    layout = "C-contiguous" if transformed.flags.c_contiguous else (
        "F-contiguous" if transformed.flags.f_contiguous else "not contiguous"
    )
    Phi = np.ascontiguousarray(transformed)
    del transformed
    stage_rounds = []

    def stages():
        seconds, result = fit_stages(X, y)
        stage_rounds.append(seconds)
        return result

    times, last = interleaved_timings(
        {
            "moments": _discard(moments, X, lengths),
            "numpy": _discard(syrk_numpy, Phi),
            "dsyrk": _discard(syrk_blas, Phi),
            "fit": lambda: LinearAttentionRegressor().fit(X, y),
            "stages": stages,
        },
        repeats, min_time=min_time, max_repeats=max_repeats,
    )
    model = last["fit"]
    check_stages(last["stages"], model)
    cert = model.certificate_
    return dict(
        times=times, stage_rounds=stage_rounds, psi=Phi.shape[1], layout=layout,
        phi_bytes=Phi.nbytes, x_bytes=X.nbytes, solver=model.solver_,
        identifiable=bool(cert), rank=cert.rank, n_features=cert.n_features,
        lambda_min=cert.min_eigenvalue,
    )


def row_gram(ctx):
    """Fit wall time over the work any least-squares fit on the features must do.

    That work is forming the per-sequence second moments (the folded
    ``sum_t x_t x_t^T`` and the last token of every sequence, ``row_factors``)
    and the SYRK ``Phi^T Phi`` of the N x psi feature matrix ``Phi`` of
    ``LinearAttentionFeatures`` (formed once before timing, C-contiguous).
    The SYRK is timed two ways, numpy's ``Phi.T @ Phi`` (BLAS syrk, then the
    triangle mirrored) and ``scipy.linalg.blas.dsyrk`` on the Fortran view
    ``Phi.T`` (one triangle); the baseline is the best moments time plus the
    faster SYRK.  The fit is ``LinearAttentionRegressor().fit(X, y)`` with
    default parameters: input validation, standardized coordinates, the
    statistics pass, least squares, the identifiability certificate
    (``certificate_``) and the heads.  Moments, both SYRKs and the fit run
    interleaved, round after round (at least 3 rounds, more for cheap sizes
    until 5 s have passed, at most 25; 2 rounds at d = 32, where a round
    takes minutes), each d in a fresh process; the ratio is of the best
    times, judged at every d.  A replay of the fit stage by stage with the
    package's internal functions (``benchmarks/fit_vs_gram.fit_stages``,
    checked to give the fit's coefficients) runs in the same rounds and says
    where the fit's time goes.  If the process dies (a crash inside BLAS),
    that d is measured again with one BLAS thread and the Details say so.
    Multi-threaded BLAS on a machine whose cores are busy with other
    processes can slow a call by orders of magnitude (its threads wait for
    each other), hence the many rounds; see the load average.
    """
    p = ctx.sizes(GRAM_FULL, GRAM_QUICK)
    if ctx.gram_ds:
        p = dict(p, ds=tuple(ctx.gram_ds))
    n, N = p["n_tokens"], p["n_samples"]
    results = []
    for d in p["ds"]:
        large = d >= p["large_d"]
        kwargs = dict(
            d=d, n_samples=N, n_tokens=n, seed=ctx.seed,
            repeats=p["large_repeats"] if large else p["repeats"],
            max_repeats=p["large_repeats"] if large else p["max_repeats"],
            min_time=0.0 if large else p["min_time"],
        )
        threads, notes = ctx.threads, []
        while True:
            log(f"gram: d = {d}, N = {N}, n = {n}, BLAS threads: {threads} (fresh process)")
            try:
                out, timed_out = run_isolated(gram_child, kwargs, threads=threads,
                                              timeout=p["timeout"])
            except RuntimeError as exc:
                died = "child process died" in str(exc)
                if not died or threads == 1:
                    raise
                code = re.search(r"exit code (-?\d+|None)", str(exc))
                notes.append(
                    f"With {threads} BLAS threads the process measuring this d died (exit code "
                    f"{code.group(1) if code else 'unknown'}: a crash inside a native library; "
                    "the call it died in is on stderr), so this d was measured again with 1 "
                    "BLAS thread, the fit and the baseline alike."
                )
                threads = 1
                continue
            break
        psi = d * d * (d + 1) // 2
        setting = f"N = {N}, n = {n}, d = {d} (psi = {psi}), readout last"
        if threads != ctx.threads:
            setting += ", 1 BLAS thread"
        if timed_out:
            results.append(Result(
                row="gram", label=f"fit / (moments + Phi^T Phi), d = {d}", setting=setting,
                measured=f"did not finish in {fmt_seconds(p['timeout'])} (stopped)",
                target=f"<= {gram_target(d)}", status="ERROR", details=notes,
            ))
            continue
        times, stage_rounds = out["times"], out["stage_rounds"]
        best = {k: min(v) for k, v in times.items()}
        syrk_name = "numpy" if best["numpy"] <= best["dsyrk"] else "dsyrk"
        baseline = best["moments"] + best[syrk_name]
        ratio = best["fit"] / baseline
        paired = [f / (m + min(a, b)) for f, m, a, b in
                  zip(times["fit"], times["moments"], times["numpy"], times["dsyrk"])]
        stage_best = {s: min(r[s] for r in stage_rounds) for s in STAGES}
        syrk_text = {"numpy": "`Phi.T @ Phi`", "dsyrk": "`dsyrk(Phi.T)`"}
        details = notes + [
            f"psi = {psi}; Phi is {N} x {psi} float64 ({fmt_bytes(out['phi_bytes'])}), timed "
            f"as a C-contiguous array (`transform` returned it {out['layout']}); X is "
            f"{fmt_bytes(out['x_bytes'])}; the Gram matrix is {fmt_bytes(8.0 * psi * psi)}.",
            f"Moments (`row_factors(X, lengths)`): {fmt_list(times['moments'])}; numpy "
            f"`Phi.T @ Phi`: {fmt_list(times['numpy'])}; `scipy.linalg.blas.dsyrk(1.0, "
            f"Phi.T)`: {fmt_list(times['dsyrk'])}; `fit`: {fmt_list(times['fit'])} "
            f"(interleaved, {threads} BLAS thread{'s' if threads > 1 else ''}). The faster "
            f"SYRK is {syrk_text[syrk_name]}; baseline {fmt_seconds(best['moments'])} + "
            f"{fmt_seconds(best[syrk_name])} = {fmt_seconds(baseline)}.",
            f"Ratio of the bests {ratio:.2f}; per-round ratios fit / (moments + faster "
            f"SYRK): median {np.median(paired):.2f}, range {min(paired):.2f} to "
            f"{max(paired):.2f}.",
            f"Where the fit's time goes (best of {len(stage_rounds)} stage-by-stage replays, "
            f"solver {out['solver']!r}; their sum {fmt_seconds(sum(stage_best.values()))}): "
            + "; ".join(f"{STAGE_TEXT[s]} {fmt_seconds(stage_best[s])} "
                        f"({stage_best[s] / baseline:.2f} x baseline)" for s in STAGES)
            + ".",
            f"Certificate computed by the fit: identifiable = {out['identifiable']}, rank "
            f"{out['rank']}/{out['n_features']}, lambda_min = {out['lambda_min']:.3g}.",
        ]
        results.append(
            Result(
                row="gram",
                label=f"fit / (moments + Phi^T Phi), d = {d}",
                setting=setting,
                measured=f"fit {fmt_seconds(best['fit'])}",
                baseline=f"moments {fmt_seconds(best['moments'])} + "
                         f"{syrk_text[syrk_name]} {fmt_seconds(best[syrk_name])}",
                ratio=f"{ratio:.2f}",
                target=f"<= {gram_target(d)}",
                status=judge(ctx, ratio <= gram_target(d)),
                details=details,
            )
        )
    return results


# ---------------------------------------------------------------------------
# adam: closed form against Adam with d^2 heads (Sec. 4.1)
# ---------------------------------------------------------------------------

ADAM_FULL = dict(d=4, n_samples=2048, n_tokens=100, validation_fraction=0.1, paper_epochs=500,
                 tuned_epochs=200, time_limit=1800.0, repeats=3)
ADAM_QUICK = dict(d=2, n_samples=64, n_tokens=8, validation_fraction=0.25, paper_epochs=3,
                  tuned_epochs=3, time_limit=60.0, repeats=1)
ADAM_GOAL = 1e-6  # relative validation MSE
ADAM_TARGET = 1000.0
ADAM_REPEAT_BUDGET = 60.0  # seconds of runs of one learner after which it is not repeated

_ADAM_LABELS = {
    "paper-torch-scores": "Adam, the paper's recipe and model (PyTorch, T x T scores) / closed "
                          "form, time to 1e-6 val. MSE",
    "paper-torch-moments": "Adam, the paper's recipe and model (PyTorch, prefix moments) / "
                           "closed form, time to 1e-6 val. MSE",
    "paper-numpy": "Adam, the paper's recipe and model (numpy) / closed form, time to 1e-6 "
                   "val. MSE",
    "tuned": "Adam as a careful user tunes it (numpy, heads summed) / closed form, time to "
             "1e-6 val. MSE",
}


def _adam_status(ctx, run, ratio, closed_ok):
    """Status and ratio text of one Adam line (a run that missed the goal bounds the ratio)."""
    if not closed_ok:
        return judge(ctx, False), f"{ratio:.3g}"
    if run["reached"]:
        return judge(ctx, ratio >= ADAM_TARGET), f"{ratio:.3g}"
    if ratio >= ADAM_TARGET:
        return judge(ctx, True), f"> {ratio:.3g}"
    return ("n/a (quick)" if ctx.quick else "INCONCLUSIVE"), f"> {ratio:.3g}"


def _adam_learner_details(key, run, p, n_heads, ctx):
    """What was trained, how, with what, and how the run went."""
    recipe = (
        f"Recipe (the paper's Sec. 4.1): {n_heads} heads, Adam with learning rate "
        f"{PAPER_RECIPE['learning_rate']:g} (betas 0.9 / 0.999, eps 1e-8), batch "
        f"{PAPER_RECIPE['batch_size']}, a schedule over {p['paper_epochs']} epochs of "
        f"{PAPER_RECIPE['warmup_fraction']:.0%} linear warm-up then cosine decay"
    )
    model = (
        "Parametrisation (the paper's code): `mean_h causal((Z Q_h^T) Z^T / sqrt(d)) "
        "(Z P_h^T)`, P_h of shape (1, d) and Q_h (d, d) per head, entries initialised "
        "N(0, 1/d) (the teacher's distribution; how the paper's code initialises is not "
        "known here); the package's heads are V_h = P_h / (m sqrt(d)), Q_h."
    )
    if key.startswith("paper-torch"):
        how = ("a causal T x T score matrix per head, as the paper writes the model"
               if run["computation"] == "scores" else
               "the running moments S_t = sum_{s <= t} z_s z_s^T, `c sum_h P_h S_t Q_h z_t` "
               "(the same function and gradients up to rounding, about 20 times less "
               "arithmetic than T x T scores at T = 100)")
        lines = [
            recipe + f" to lr/{1 / PAPER_RECIPE['final_fraction']:g}, gradient-norm clipping "
            f"at {PAPER_RECIPE['max_grad_norm']:g} (`torch.nn.utils.clip_grad_norm_`).",
            model,
            f"Implementation: PyTorch {run['torch']}, {run['dtype']}, "
            f"`torch.set_num_threads({run['threads']})`; forward pass through {how}. Trained "
            "on the first sequences, validated on the held-out last ones (as the closed "
            "form); relative validation MSE after every epoch, its time included.",
            f"Gradient norms: largest {run['max_grad_norm_seen']:.3g}, clipped in "
            f"{run['clipped_steps']} steps; relative validation MSE of the initial "
            f"parameters {run['initial']:.3g} (before the clock starts). The trained P_h, "
            f"Q_h as the package's heads (`heads_from_paper`) give relative validation MSE "
            f"{run['heads_validation']:.3g} through `mhla_forward` in float64.",
        ]
    elif key == "paper-numpy":
        lines = [
            recipe + " to 0 (the package's schedule; the paper's decays to lr/100, at most "
            f"1 % of the peak rate apart at any step), gradient-norm clipping at "
            f"{PAPER_RECIPE['max_grad_norm']:g}.",
            model,
            "Implementation: numpy, `AdamLinearAttentionRegressor(parametrization=\"paper\", "
            f"max_grad_norm={PAPER_RECIPE['max_grad_norm']:g}, ...)` (PyTorch cannot be "
            f"imported here), float64, BLAS limited to {ctx.threads} threads; it holds out "
            f"{p['validation_fraction']:.0%} of the sequences at random and validates after "
            "every epoch, its time included.",
        ]
    else:
        lines = [
            f"`AdamLinearAttentionRegressor(n_heads={n_heads})` in the package's "
            "parametrisation (y = sum_h V_h S Q_h x: heads summed, scores not divided by "
            "sqrt(d); V_h and Q_h initialised N(0, 1/d)), learning rate "
            f"{TUNED_SCHEDULE['learning_rate']:g}, batch {TUNED_SCHEDULE['batch_size']}, "
            f"{TUNED_SCHEDULE['warmup_fraction']:.0%} warm-up then cosine decay to 0 over "
            f"{p['tuned_epochs']} epochs, no clipping: the schedule a careful user tunes to "
            f"on this data. The same learning rate moves the values V_h m sqrt(d) = "
            f"{n_heads * math.sqrt(p['d']):.3g} times more than in the paper's "
            "parametrisation.",
            f"Implementation: numpy, float64, BLAS limited to {ctx.threads} threads; it holds "
            f"out {p['validation_fraction']:.0%} of the sequences at random and validates "
            "after every epoch, its time included.",
        ]
    lines.append(f"Ran {run['epochs']} epochs, stopped: {run['stopped']}. Relative validation "
                 f"MSE: {milestones(run)}.")
    return lines


def row_adam(ctx):
    """Wall time to 1e-6 relative validation MSE: Adam (d**2 heads) / closed form.

    Data of the paper's Sec. 4.1 (``adam_vs_closed_form.make_data``): a
    one-head teacher in the paper's layout (N(0, 1/d) entries, scores divided
    by sqrt(d)), N sequences of T tokens with N(0, 1/T) entries, targets at
    every position (readout ``"all"``); 10 % of the sequences are held out.
    Adam runs the paper's recipe in the paper's parametrisation (d**2 heads
    averaged, scores over sqrt(d); lr 0.01, batch 64, 10 % warm-up and cosine
    decay to lr/100 over 500 epochs, gradient clipping at 5): in PyTorch when
    it is installed, computed once as the paper writes it (T x T causal
    scores) and once through running moments (the same model, about 20 times
    less arithmetic); else with the numpy learner
    (``AdamLinearAttentionRegressor(parametrization="paper")``).  A second line
    is the numpy learner in the package's own parametrisation with the
    schedule a careful user tunes to.  Each run stops at the first epoch
    below 1e-6 (its time is the wall time to the end of that epoch,
    validation after every epoch included), or at the end of its schedule, or
    after 30 minutes.  The closed form is ``LinearAttentionRegressor(
    readout="all").fit`` on the training sequences, timed before every Adam
    run and at the end (best of all).  A learner is repeated (same seed) only
    while its runs took less than a minute in total.
    """
    p = ctx.sizes(ADAM_FULL, ADAM_QUICK)
    d, N, T = p["d"], p["n_samples"], p["n_tokens"]
    n_heads = d * d
    X, y = make_data(np.random.default_rng(ctx.seed), N, T, d)
    n_val = math.ceil(p["validation_fraction"] * N)
    X_tr, y_tr, X_val, y_val = X[:-n_val], y[:-n_val], X[-n_val:], y[-n_val:]
    recipe = dict(PAPER_RECIPE, max_epochs=p["paper_epochs"])

    def torch_run(computation):
        return lambda: train_paper_recipe_torch(
            X_tr, y_tr, X_val, y_val, computation=computation, recipe=recipe, seed=ctx.seed,
            threads=ctx.threads, target=ADAM_GOAL, time_limit=p["time_limit"],
        )

    def numpy_run(learner, epochs):
        return lambda: fit_numpy(X, y, learner=learner, seed=ctx.seed, target=ADAM_GOAL,
                                 validation_fraction=p["validation_fraction"],
                                 max_epochs=epochs)[1]

    if torch_available() is not None:
        learners = {"paper-torch-scores": torch_run("scores"),
                    "paper-torch-moments": torch_run("moments")}
    else:
        learners = {"paper-numpy": numpy_run("paper-numpy", p["paper_epochs"])}
    learners["tuned"] = numpy_run("tuned", p["tuned_epochs"])

    def closed_form():
        return LinearAttentionRegressor(readout="all").fit(X_tr, y_tr)

    closed_times, runs = [], {}
    for key, train in learners.items():
        log(f"adam: {key}, d = {d}, N = {N}, T = {T}, {n_heads} heads")
        runs[key] = []
        while True:
            times, last = interleaved_timings({"closed": closed_form}, 1)
            closed_times += times["closed"]
            runs[key].append(train())
            log(f"adam: {key} run {len(runs[key])}: {runs[key][-1]['epochs']} epochs, "
                f"{runs[key][-1]['seconds']:.1f} s")
            if (len(runs[key]) >= p["repeats"]
                    or sum(r["seconds"] for r in runs[key]) >= ADAM_REPEAT_BUDGET):
                break
    times, last = interleaved_timings({"closed": closed_form}, 1)
    closed_times += times["closed"]
    closed_time = min(closed_times)
    closed_mse = relative_mse(last["closed"], X_val, y_val)
    closed_text = (
        f"Closed form (`LinearAttentionRegressor(readout=\"all\")`) on the {N - n_val} "
        f"training sequences: {fmt_list(closed_times)} (in call order, one before each Adam "
        f"run and one at the end); relative validation MSE {closed_mse:.2e} on the {n_val} "
        "held-out ones."
    )
    results = []
    for key, key_runs in runs.items():
        run = min(key_runs, key=lambda r: r["seconds"])
        ratio = run["seconds"] / closed_time
        status, ratio_text = _adam_status(ctx, run, ratio, closed_mse < ADAM_GOAL)
        curve = np.asarray(run["curve"])
        measured = (
            f"Adam {fmt_seconds(run['seconds'])} to {ADAM_GOAL:g} (epoch {run['epochs']})"
            if run["reached"] else
            f"Adam did not reach {ADAM_GOAL:g} in {run['epochs']} epochs "
            f"({fmt_seconds(run['seconds'])}; best {curve.min():.2e})"
        )
        details = _adam_learner_details(key, run, p, n_heads, ctx)
        details.append("Runs (same seed): " + ", ".join(
            f"{fmt_seconds(r['seconds'])} ({r['epochs']} epochs)" for r in key_runs) + ".")
        if not results:
            details.append(closed_text)
        results.append(Result(
            row="adam",
            label=_ADAM_LABELS[key],
            setting=f"Sec. 4.1: d = {d}, N = {N} ({n_val} held out), T = {T}, readout all, "
                    f"{n_heads} heads",
            measured=measured,
            baseline=f"closed form {fmt_seconds(closed_time)} (val. MSE {closed_mse:.1e})",
            ratio=ratio_text,
            target=f">= {ADAM_TARGET:g}",
            status=status,
            details=details,
        ))
    return results


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

CG_FULL = dict(n_samples=150_000, n_tokens=16, d=64, timeout=1800)
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
    stopped after 30 minutes (data generation included).
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
    if importlib.util.find_spec("distributed") is None:
        return [Result(row="dask", label="dask cg: 1 worker / 2 workers",
                       setting="needs the dask extra",
                       measured="not available: distributed is not installed",
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


# ---------------------------------------------------------------------------
# cv: the cross-validated search against one plain fit
# ---------------------------------------------------------------------------

CV_FULL = dict(settings=("digits", "synthetic"), n_samples=20_000, n_tokens=16, d=6)
CV_QUICK = dict(settings=("synthetic",), n_samples=300, n_tokens=5, d=3)


def row_cv(ctx):
    """``LinearAttentionRegressorCV`` (5 folds, 10 alphas) against one plain fit.

    ``benchmarks/cv_cost.py``: the search (the one pass with every fold's
    statistics, every alpha of every split scored from them, the refit) and
    ``LinearAttentionRegressor(alpha=alpha_)`` on the same data, interleaved;
    the ratio of their wall times (best of the repeats).
    """
    from . import cv_cost

    p = ctx.sizes(CV_FULL, CV_QUICK)
    sizes = dict(n_samples=p["n_samples"], n_tokens=p["n_tokens"], d=p["d"])
    results = []
    for name in p["settings"]:
        log(f"cv: {name}")
        r = cv_cost.run_setting(name, 1, ctx.seed, sizes)
        results.append(Result(
            row="cv",
            label=f"CV search (5 folds, 10 alphas) / plain fit, {name}",
            setting=(f"N = {r['n_samples']}, n = {r['n_tokens']}, d = {r['d']} (psi = "
                     f"{r['psi']}, rank {r['feature_rank']}), {r['params']}"),
            measured=f"search {fmt_seconds(r['cv_seconds'])}",
            baseline=f"plain fit at alpha = {r['alpha']:g} {fmt_seconds(r['plain_seconds'])}",
            ratio=f"{r['ratio']:.2f}",
            target="<= 3",
            status=judge(ctx, r["ratio"] <= 3),
            details=[
                f"alpha_ = {r['alpha']:g}; held-out MSE {r['test_mse_cv']:.4g} (plain fit "
                f"{r['test_mse_plain']:.4g}); largest prediction difference "
                f"{r['max_prediction_difference']:.1e} of the largest prediction.",
                "Stages of the search: " + "; ".join(f"{m} at {fmt_seconds(t)}"
                                                     for m, t in r["stages"]) + ".",
            ],
        ))
    return results


# ---------------------------------------------------------------------------
# real: aeon's bundled regression sets and the digits, beside ROCKET
# ---------------------------------------------------------------------------

REAL_FULL = dict(repeats=3, quick=False)
REAL_QUICK = dict(repeats=1, quick=True)


def _real_model_detail(entry):
    """One Details line: a model's test RMSE, fit time and notes."""
    from .real_data import model_line

    error, seconds, notes = model_line(entry)
    if entry.get("status") != "ok":
        return f"{entry['label']}: {notes}"
    return f"{entry['label']}: test RMSE {error}, fit {seconds} s" + (f" ({notes})" if notes
                                                                      else "")


def row_real(ctx):
    """Real data: test RMSE and fit time of ours beside ROCKET and ridge baselines.

    ``benchmarks/real_data.py``: every regression set aeon bundles without
    download (aeon 1.6.0: Covid3Month, CardanoSentiment; default splits) and
    scikit-learn's digits (rows 0-6 of each image, 7 time points of 8
    channels, predict row 7, 8 outputs; 30% held out, ``random_state=0``).
    Models: the training mean; ``RidgeCV`` on the flattened series;
    ``PolynomialFeatures(2)`` and ``(3)`` + ``RidgeCV`` on the last L time
    points (L as large as 5 000 features allow); aeon's ``RocketRegressor``
    and ``MiniRocketRegressor`` (default kernels, ``random_state=0``, for the
    digits' multi-output y their transformer + ``RidgeCV``, what they are);
    ours, ``linattn_recipe``: ``Patches`` (p minimizing ``d = p c +
    ceil(T / p)``) -> one-hot ``PositionalEncoding`` from the end ->
    ``LinearAttentionRegressorCV`` (0 and 1e-6 ... 1e3, intercept and skip),
    and two variants of it (no positions; each channel as its symlog and its
    shape, no positions).  Fit wall time: best of the repeats, the models
    interleaved, BLAS threads and aeon's ``n_jobs`` both the run's
    ``--threads``, the Rocket models compiled by one fit on 10 series first.
    Targets from the issue: ours at least as good as RidgeCV on every set,
    within 5% of ROCKET's test RMSE on Covid3Month (published there: ROCKET
    0.0389, FreshPRINCE 0.0402, DrCIF 0.0430), our fit no slower than
    ROCKET's.  Needs the bench extra (``pip install -e ".[bench]"``) for the
    aeon sets and the Rocket models; without it those lines say "not
    available" and the digits run with the others.
    """
    from . import real_data

    p = ctx.sizes(REAL_FULL, REAL_QUICK)
    argv = ["--repeats", str(p["repeats"]), "--threads", str(ctx.threads), "--seed",
            str(ctx.seed)] + (["--quick"] if p["quick"] else [])
    args = real_data.build_parser().parse_args(argv)
    log(f"real: {', '.join(args.only)} ({p['repeats']} repeat(s), {ctx.threads} thread(s))")
    out = real_data.run(args)
    results = []
    for r in out:
        if not r.get("available"):
            results.append(Result(row="real", label=f"every model, {r['dataset']}",
                                  setting="needs the bench extra (aeon)",
                                  measured=f"not available: {r['reason']}",
                                  status="not available"))
            continue
        setting = (f"{r['n_train']} train / {r['n_test']} test series, {r['n_channels']} "
                   f"channel(s) x {r['n_timepoints']} time points, {r['n_outputs']} output(s)")
        details = [f"Data: {r['source']}."]
        details += [_real_model_detail(e) for e in r["models"].values()]
        details += [f"Variants against the baselines: {t}." for t in real_data.variant_ratios(r)]
        for i, t in enumerate(real_data.targets(r)):
            available = t["passed"] is not None
            results.append(Result(
                row="real", label=t["label"], setting=setting, measured=t["measured"],
                baseline=t["baseline"],
                ratio="-" if t["ratio"] is None else f"{t['ratio']:.3g}",
                target=t["target"],
                status=judge(ctx, t["passed"]) if available else "not available",
                details=details if i == 0 else [],
            ))
    return results


# ---------------------------------------------------------------------------
# array_api: PyTorch input under array API dispatch, beside NumPy input
# ---------------------------------------------------------------------------

ARRAY_API_FULL = dict(d=8, n_samples=20_000, n_tokens=16, repeats=5)
ARRAY_API_QUICK = dict(d=4, n_samples=500, n_tokens=8, repeats=1)
# The targets: seconds of fit + certificate on one H100 or H200.
ARRAY_API_GPU_TARGETS = {32: 10.0, 64: 60.0}


def row_array_api(ctx):
    """Fit + certificate from torch tensors under array API dispatch / from NumPy arrays.

    ``benchmarks/array_api.py``: the same data (a random one-head teacher,
    N sequences of 16 tokens) fitted from NumPy arrays and from torch CPU
    tensors under ``sklearn.config_context(array_api_dispatch=True)``,
    interleaved, best of the repeats; the fitted arrays are then torch
    tensors and the Gram products, its factor and the Lanczos products run
    in torch.  Target from the issue: within 1.5x of NumPy at d = 8.  Where
    torch sees a CUDA device, the GPU cases too (d = 16 and 32 dense with
    N = 20 000, d = 64 ``solver="cg"`` with N = 150 000; targets 10 s at
    d = 32 and 60 s at d = 64 on one H100 or H200), with their peak device
    memory; without one those lines say "not available".  Needs PyTorch.
    """
    from . import array_api

    try:
        import torch
    except ImportError:
        return [Result(row="array_api", label="torch CPU / NumPy, fit + certificate",
                       measured="not available: PyTorch is not installed",
                       status="not available")]
    p = ctx.sizes(ARRAY_API_FULL, ARRAY_API_QUICK)
    torch.set_num_threads(ctx.threads)
    log(f"array_api: d = {p['d']}, torch CPU and NumPy")
    r = array_api.cpu_case(p["d"], p["n_samples"], p["n_tokens"], p["repeats"])
    results = [Result(
        row="array_api",
        label=f"torch CPU / NumPy, fit + certificate, d = {r['d']}",
        setting=(f"N = {r['n_samples']}, n = {r['n_tokens']}, d = {r['d']}, solver "
                 f"{r['solver']!r}, float64, torch {torch.__version__}"),
        measured=f"torch CPU {fmt_seconds(r['torch_s'])}",
        baseline=f"NumPy {fmt_seconds(r['numpy_s'])}",
        ratio=f"{r['ratio']:.2f}",
        target="<= 1.5",
        status=judge(ctx, r["ratio"] <= 1.5),
        details=[f"Coefficients' largest relative difference {r['coef_rel_diff']:.1e}; "
                 f"certified identifiable: {r['identifiable']}; torch repeats "
                 f"{fmt_list(r['torch_all'])}, NumPy repeats {fmt_list(r['numpy_all'])}."],
    )]
    if not torch.cuda.is_available():
        results.append(Result(
            row="array_api", label="CUDA: fit + certificate, d = 16, 32 dense and 64 cg",
            setting="N = 20 000 (dense), 150 000 (cg), n = 16",
            measured="not available: torch sees no CUDA device on this machine",
            target="d = 32 <= 10 s, d = 64 <= 60 s", status="not available"))
        return results
    for case in array_api.GPU_CASES if not ctx.quick else array_api.GPU_CASES[:1]:
        log(f"array_api: CUDA d = {case[0]}")
        g = array_api.gpu_case(*case, numpy_too=False)
        target = ARRAY_API_GPU_TARGETS.get(g["d"])
        results.append(Result(
            row="array_api",
            label=f"CUDA fit + certificate, d = {g['d']}",
            setting=(f"{g['device']}; N = {g['n_samples']}, n = {g['n_tokens']}, d = {g['d']}, "
                     f"solver {g['solver']!r}"),
            measured=f"{fmt_seconds(g['torch_s'])}, peak device memory "
                     f"{g['peak_device_gib']:.2f} GiB",
            target="no target" if target is None else f"<= {target:g} s",
            status="reported" if target is None else judge(ctx, g["torch_s"] <= target),
            details=[f"d = {g['d']}: certified identifiable: {g['identifiable']}."],
        ))
    return results


ROWS = {
    "gram": row_gram,
    "adam": row_adam,
    "samples": row_samples,
    "memory": row_memory,
    "cg": row_cg,
    "dask": row_dask,
    "cv": row_cv,
    "real": row_real,
    "array_api": row_array_api,
}
