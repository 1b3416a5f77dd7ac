"""Wall time to a relative validation MSE of 1e-6: Adam against the closed form (Sec. 4.1).

Data (the paper's Sec. 4.1, :func:`make_data`): a one-head teacher in the
paper's layout, ``causal((Z Q^T) Z^T / sqrt(d)) (Z P^T)`` with P (1 x d) and
Q (d x d) of N(0, 1/d) entries; N sequences of T tokens with N(0, 1/T)
entries; targets at every position (causal readout ``"all"``).  The last
``validation_fraction`` of the sequences are held out.

Learners (``--learner``, several allowed):

- ``paper-torch-scores``: the paper's recipe in PyTorch, in the paper's
  parametrisation, ``mean_h causal((Z Q_h^T) Z^T / sqrt(d)) (Z P_h^T)`` with
  d**2 heads, computed as the paper writes it (a T x T score matrix per head).
- ``paper-torch-moments``: the same model, recipe and seed, computed through
  the running moments ``S_t = sum_{s <= t} z_s z_s^T`` (the same function and
  gradients up to rounding, about 20 times less arithmetic at T = 100).
- ``paper-numpy``: the recipe with the package's numpy learner,
  ``AdamLinearAttentionRegressor(parametrization="paper", max_grad_norm=5)``;
  its cosine decays to 0 instead of lr/100 (at most 1 % of the peak rate
  apart at any step), and it holds out a random ``validation_fraction``.
- ``tuned``: ``AdamLinearAttentionRegressor`` in the package's own
  parametrisation (heads summed, no 1/sqrt(d)) with the schedule a careful
  user would tune to: lr 0.01, batch 32, 5 % warm-up, cosine over 200 epochs.

The paper's recipe (:data:`PAPER_RECIPE`): d**2 heads, Adam (lr 0.01, betas
0.9 / 0.999, eps 1e-8), batch 64, a schedule over 500 epochs of 10 % linear
warm-up and cosine decay to lr/100, gradient-norm clipping at 5, entries of
P_h and Q_h drawn N(0, 1/d) (the teacher's distribution), float32 (torch's
default).  Each run stops at the first epoch whose relative validation MSE
(``MSE / mean(y**2)``, computed after every epoch and counted in the time) is
below ``--target``, or at the end of the schedule, or after ``--time-limit``
seconds.  The closed form is ``LinearAttentionRegressor(readout="all")`` on
the training sequences (best of ``--repeats``).

Usage::

    python benchmarks/adam_vs_closed_form.py                     # every learner available
    python benchmarks/adam_vs_closed_form.py --learner paper-torch-moments tuned --json
"""

import argparse
import json
import math
import sys
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from sklearn_linattn import AdamLinearAttentionRegressor, LinearAttentionRegressor, mhla_forward
from sklearn_linattn.layouts import heads_from_paper

#: The paper's Sec. 4.1 training recipe (``n_heads`` None means d**2).
PAPER_RECIPE = dict(
    n_heads=None, learning_rate=1e-2, batch_size=64, max_epochs=500, warmup_fraction=0.1,
    final_fraction=0.01, max_grad_norm=5.0,
)
#: The package's learner as a careful user tunes it (heads summed, no clipping).
TUNED_SCHEDULE = dict(learning_rate=1e-2, batch_size=32, max_epochs=200, warmup_fraction=0.05)
LEARNERS = ("paper-torch-scores", "paper-torch-moments", "paper-numpy", "tuned")
MILESTONES = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


def make_data(rng, n_samples, n_tokens, d):
    """The paper's Sec. 4.1 data: N(0, 1/T) tokens, a one-head teacher's output at every position.

    The teacher is one head of the paper's layout, ``P`` (1 x d) and ``Q``
    (d x d) with N(0, 1/d) entries and its scores divided by sqrt(d): the
    package's head ``V = P / sqrt(d)``, ``Q``.

    Returns
    -------
    X : ndarray of shape (n_samples, n_tokens, d)
    y : ndarray of shape (n_samples, n_tokens)
    """
    P = rng.normal(size=(1, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(1, d, d)) / np.sqrt(d)
    V, Q = heads_from_paper(P, Q)
    X = rng.normal(size=(n_samples, n_tokens, d)) / np.sqrt(n_tokens)
    return X, mhla_forward(X, V, Q, readout="all")[..., 0]


def relative_mse(model, X, y):
    """``MSE / mean(y**2)`` of a fitted estimator's predictions."""
    pred = model.predict(X)
    return float(np.mean((pred - y) ** 2) / np.mean(y**2))


def torch_available():
    """The torch module, or None when it cannot be imported."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def paper_forward(torch, Z, P, Q, computation="scores"):
    """The paper's MHLA at every position, ``mean_h causal((Z Q_h^T) Z^T / sqrt(d)) (Z P_h^T)``.

    Parameters
    ----------
    torch : module
    Z : tensor of shape (batch, T, d)
    P : tensor of shape (m, d_out, d)
    Q : tensor of shape (m, d, d)
    computation : {"scores", "moments"}
        ``"scores"``: a causal T x T score matrix per head, as the paper
        writes it.  ``"moments"``: ``c sum_h P_h S_t Q_h z_t`` with
        ``S_t = sum_{s <= t} z_s z_s^T`` and ``c = 1 / (m sqrt(d))``.

    Returns
    -------
    out : tensor of shape (batch, T, d_out)
    """
    m, _, d = P.shape
    if computation == "scores":
        T = Z.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=Z.device).tril()
        ZQ = torch.einsum("btd,hed->bhte", Z, Q)
        # scores[b, h, t, s] = z_s^T Q_h z_t / sqrt(d), kept for s <= t.
        scores = (ZQ @ Z.transpose(1, 2).unsqueeze(1)) / math.sqrt(d)
        scores = scores.masked_fill(~causal, 0.0)
        ZP = torch.einsum("btd,hod->bhto", Z, P)
        return (scores @ ZP).mean(dim=1)
    S = torch.cumsum(Z.unsqueeze(-1) * Z.unsqueeze(-2), dim=1)
    q = torch.einsum("btd,hed->bthe", Z, Q)
    u = torch.einsum("btef,bthf->bthe", S, q)
    return torch.einsum("bthe,hoe->bto", u, P) / (m * math.sqrt(d))


def _recipe_rate(step, n_steps, warmup_fraction, final_fraction):
    """Factor of the peak rate: linear warm-up, then cosine decay to ``final_fraction``."""
    n_warmup = max(1, int(n_steps * warmup_fraction))
    if step < n_warmup:
        return (step + 1) / n_warmup
    progress = (step - n_warmup) / max(1, n_steps - n_warmup)
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def train_paper_recipe_torch(X_train, y_train, X_val, y_val, *, computation="scores",
                             recipe=PAPER_RECIPE, seed=0, threads=None, target=1e-6,
                             time_limit=None, dtype=None):
    """Train the paper's model with the paper's recipe in PyTorch until ``target``.

    Parameters
    ----------
    X_train, y_train, X_val, y_val : ndarrays
        Sequences (n, T, d) and targets (n, T).
    computation : {"scores", "moments"}
        How the forward pass is computed (:func:`paper_forward`).
    recipe : dict
        As :data:`PAPER_RECIPE`.
    seed : int
        Seeds the initial parameters and the shuffles (a torch generator).
    threads : int or None
        ``torch.set_num_threads`` during the run (restored afterwards).
    target : float
        Stop at the first epoch whose relative validation MSE is below it.
    time_limit : float or None
        Stop after the first epoch that ends later than this (seconds).
    dtype : torch.dtype or None
        None is torch's default dtype.

    Returns
    -------
    run : dict
        ``curve`` (relative validation MSE after each epoch), ``elapsed``
        (seconds since the start at the end of each epoch, validation
        included), ``epochs``, ``reached``, ``seconds`` (at the last epoch),
        ``stopped`` (why), ``initial`` (relative validation MSE of the
        initial parameters, computed before the clock starts),
        ``max_grad_norm_seen``, ``clipped_steps``, ``heads`` (the trained
        ``(V, Q)`` in the package's layout, float64), ``heads_validation``
        (their relative validation MSE through ``mhla_forward`` in float64),
        ``torch``, ``threads`` and ``dtype``.
    """
    torch = torch_available()
    if torch is None:
        raise ImportError("train_paper_recipe_torch needs PyTorch (pip install torch).")
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        return _train_torch(torch, X_train, y_train, X_val, y_val, computation, recipe, seed,
                            target, time_limit, dtype)
    finally:
        torch.set_num_threads(previous)


def _train_torch(torch, X_train, y_train, X_val, y_val, computation, recipe, seed, target,
                 time_limit, dtype):
    dtype = torch.get_default_dtype() if dtype is None else dtype
    d = X_train.shape[2]
    m = d * d if recipe["n_heads"] is None else int(recipe["n_heads"])
    generator = torch.Generator().manual_seed(int(seed))
    P = torch.nn.Parameter(torch.randn(m, 1, d, generator=generator, dtype=dtype) / math.sqrt(d))
    Q = torch.nn.Parameter(torch.randn(m, d, d, generator=generator, dtype=dtype) / math.sqrt(d))
    Xt, Xv = torch.as_tensor(X_train, dtype=dtype), torch.as_tensor(X_val, dtype=dtype)
    yt = torch.as_tensor(y_train, dtype=dtype).unsqueeze(-1)
    yv = torch.as_tensor(y_val, dtype=dtype).unsqueeze(-1)
    val_energy = torch.mean(yv**2)

    def validation():
        with torch.no_grad():
            pred = paper_forward(torch, Xv, P, Q, computation)
            return float(torch.mean((pred - yv) ** 2) / val_energy)

    initial = validation()
    n_train, batch = len(Xt), int(recipe["batch_size"])
    n_steps = int(recipe["max_epochs"]) * math.ceil(n_train / batch)
    optimizer = torch.optim.Adam([P, Q], lr=float(recipe["learning_rate"]))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _recipe_rate(
        step, n_steps, recipe["warmup_fraction"], recipe["final_fraction"]))
    max_norm = recipe["max_grad_norm"]
    curve, elapsed, clipped, largest = [], [], 0, 0.0
    stopped = f"end of the {recipe['max_epochs']}-epoch schedule"
    start = time.perf_counter()
    for _ in range(int(recipe["max_epochs"])):
        for idx in torch.randperm(n_train, generator=generator).split(batch):
            optimizer.zero_grad()
            loss = torch.mean((paper_forward(torch, Xt[idx], P, Q, computation) - yt[idx]) ** 2)
            loss.backward()
            if max_norm is not None:
                norm = float(torch.nn.utils.clip_grad_norm_([P, Q], max_norm))
                clipped += norm > max_norm
                largest = max(largest, norm)
            optimizer.step()
            scheduler.step()
        curve.append(validation())
        elapsed.append(time.perf_counter() - start)
        if not math.isfinite(curve[-1]):
            stopped = "the validation MSE is not finite (diverged)"
            break
        if curve[-1] < target:
            stopped = f"relative validation MSE below {target:g}"
            break
        if time_limit is not None and elapsed[-1] > time_limit:
            stopped = f"time limit of {time_limit:g} s"
            break
    V, Qh = heads_from_paper(P.detach().double().numpy(), Q.detach().double().numpy())
    heads_pred = mhla_forward(np.asarray(X_val, dtype=np.float64), V, Qh, readout="all")[..., 0]
    return dict(
        curve=curve, elapsed=elapsed, epochs=len(curve), reached=bool(curve[-1] < target),
        seconds=elapsed[-1], stopped=stopped, initial=initial, max_grad_norm_seen=largest,
        clipped_steps=int(clipped), heads=(V, Qh),
        heads_validation=float(np.mean((heads_pred - y_val) ** 2) / np.mean(y_val**2)),
        torch=torch.__version__, threads=torch.get_num_threads(), dtype=str(dtype),
        computation=computation, n_heads=m,
    )


def fit_numpy(X, y, *, learner, validation_fraction, seed=0, target=1e-6, max_epochs=None):
    """Fit ``AdamLinearAttentionRegressor`` as the ``paper-numpy`` or ``tuned`` learner.

    Parameters
    ----------
    X, y : ndarrays
        All the sequences; the estimator holds out ``validation_fraction`` at random.
    learner : {"paper-numpy", "tuned"}
    max_epochs : int or None
        Length of the schedule; None is the recipe's (500) or the tuned one (200).

    Returns
    -------
    model : AdamLinearAttentionRegressor
    run : dict
        ``curve``, ``elapsed``, ``epochs``, ``reached``, ``seconds`` as
        :func:`train_paper_recipe_torch` returns them.
    """
    d = X.shape[2]
    if learner == "paper-numpy":
        r = PAPER_RECIPE
        params = dict(
            n_heads=d * d if r["n_heads"] is None else r["n_heads"], parametrization="paper",
            learning_rate=r["learning_rate"], batch_size=r["batch_size"],
            max_epochs=r["max_epochs"], warmup_fraction=r["warmup_fraction"],
            max_grad_norm=r["max_grad_norm"],
        )
    elif learner == "tuned":
        params = dict(n_heads=d * d, **TUNED_SCHEDULE)
    else:
        raise ValueError(f"learner must be 'paper-numpy' or 'tuned'; got {learner!r}.")
    if max_epochs is not None:
        params["max_epochs"] = max_epochs
    model = AdamLinearAttentionRegressor(
        readout="all", validation_fraction=validation_fraction, tol=target,
        random_state=seed, **params,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # reported by the caller
        model.fit(X, y)
    curve = list(model.validation_curve_)
    stopped = (f"relative validation MSE below {target:g}" if curve[-1] < target
               else f"end of the {params['max_epochs']}-epoch schedule")
    return model, dict(curve=curve, elapsed=list(model.elapsed_), epochs=model.n_iter_,
                       reached=bool(curve[-1] < target), seconds=model.elapsed_[-1],
                       stopped=stopped)


def milestones(run):
    """First epoch (and its time) below each of :data:`MILESTONES`, as text."""
    curve, elapsed = np.asarray(run["curve"]), run["elapsed"]
    parts = [f"epoch 1: {curve[0]:.3g}"]
    for level in MILESTONES:
        below = np.flatnonzero(curve < level)
        if below.size:
            e = int(below[0])
            parts.append(f"< {level:g} at epoch {e + 1} ({elapsed[e]:.3g} s)")
    best = int(np.argmin(curve))
    parts.append(f"best {curve[best]:.3g} at epoch {best + 1}")
    return "; ".join(parts)


def run(*, d=4, n_samples=2048, n_tokens=100, target=1e-6, validation_fraction=0.1,
        learners=None, repeats=3, seed=0, time_limit=1800.0, threads=None):
    """Run the closed form and each learner; return the measurements as a dict."""
    torch = torch_available()
    if learners is None:
        learners = [name for name in LEARNERS if torch is not None or "torch" not in name]
    X, y = make_data(np.random.default_rng(seed), n_samples, n_tokens, d)
    n_val = math.ceil(validation_fraction * n_samples)
    X_tr, y_tr, X_val, y_val = X[:-n_val], y[:-n_val], X[-n_val:], y[-n_val:]
    closed_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        closed = LinearAttentionRegressor(readout="all").fit(X_tr, y_tr)
        closed_times.append(time.perf_counter() - start)
    out = {
        "setting": dict(d=d, n_samples=n_samples, n_tokens=n_tokens, n_validation=n_val,
                        readout="all", target=target, seed=seed),
        "closed_form": dict(seconds=min(closed_times), seconds_all_repeats=closed_times,
                            relative_validation_mse=relative_mse(closed, X_val, y_val)),
        "learners": {},
    }
    for name in learners:
        if name.startswith("paper-torch"):
            result = train_paper_recipe_torch(
                X_tr, y_tr, X_val, y_val, computation=name.rsplit("-", 1)[1], seed=seed,
                threads=threads, target=target, time_limit=time_limit,
            )
            result.pop("heads")
        else:
            _, result = fit_numpy(X, y, learner=name, validation_fraction=validation_fraction,
                                  seed=seed, target=target)
        result["milestones"] = milestones(result)
        result["ratio_over_closed_form"] = result["seconds"] / out["closed_form"]["seconds"]
        out["learners"][name] = result
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learner", nargs="+", choices=LEARNERS, default=None,
                        help="learners to run (default: all; the PyTorch ones when torch "
                        "is installed)")
    parser.add_argument("--d", type=int, default=4)
    parser.add_argument("--n-samples", type=int, default=2048)
    parser.add_argument("--n-tokens", type=int, default=100)
    parser.add_argument("--target", type=float, default=1e-6)
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--time-limit", type=float, default=1800.0,
                        help="seconds after which a PyTorch run stops (default 1800)")
    parser.add_argument("--repeats", type=int, default=3, help="closed-form repeats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS/OpenMP and torch threads for every learner")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    with threadpool_limits(limits=args.threads):
        result = run(
            d=args.d, n_samples=args.n_samples, n_tokens=args.n_tokens, target=args.target,
            validation_fraction=args.validation_fraction, learners=args.learner,
            repeats=args.repeats, seed=args.seed, time_limit=args.time_limit,
            threads=args.threads,
        )
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    s, c = result["setting"], result["closed_form"]
    print(f"setting: d={s['d']}, N={s['n_samples']} ({s['n_validation']} held out), "
          f"T={s['n_tokens']}, readout='all', target relative validation MSE {s['target']:g}")
    print(f"closed form: {c['seconds']:.3f} s (best of {len(c['seconds_all_repeats'])}), "
          f"relative validation MSE {c['relative_validation_mse']:.2e}")
    for name, r in result["learners"].items():
        print(f"{name}: {r['epochs']} epochs, {r['seconds']:.2f} s, stopped: {r['stopped']}; "
              f"ratio {r['ratio_over_closed_form']:.3g}; {r['milestones']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
