"""How many sequences ``repair_certificate`` adds, against the optimum and the lower bound.

Two parts.

**Brute force** (small cases, token dimension d = 2 or 3): a training set
that fails the certificate and a pool of ``--pool`` structured candidates
(random lengths 1 to 4; each candidate's tokens confined to a random set of
coordinates, some of them all multiples of one vector), so that candidates
close different numbers and kinds of directions.  The optimum is the
smallest subset (searched by size, all subsets of each size) whose raw
feature rows, stacked under the training rows, have full rank (or span the
target's rows), computed here from ``attention_features`` / ``prefix_features``
with ``numpy.linalg.matrix_rank``, independently of the package's greedy.
Printed: how often greedy equals the optimum, the worst ratio
greedy / optimum, and trials where greedy did not reach the goal though the
optimum exists.

**Realistic cases**: the orthonormal associative memory at d = 2, 3, 4 with
a pool of Gaussian memories; a one-hot program trace (the associative memory
program, keys distinct) with a pool of traces with repeated keys, the
certificate itself and held-out traces as target; Gaussian data with N <
psi.  Printed: the number added, the lower bound (``psi - rank`` for
``readout="last"``), the recomputed certificate and the time.

Run from the repository root (about 1 minute)::

    python benchmarks/repair_sizes.py                 # 100 trials per small case
    python benchmarks/repair_sizes.py --trials 20     # a quick look
"""

import argparse
import itertools
import time

import numpy as np

from sklearn_linattn import certify_identifiability, repair_certificate
from sklearn_linattn._features import attention_features, prefix_features
from sklearn_linattn.datasets import make_associative_memory
from sklearn_linattn.programs import associative_memory_program, next_token_dataset


def raw_rows(X, readout):
    """Feature rows (n_rows, psi) of NaN-padded X, raw units."""
    X = np.asarray(X, float)
    lengths = (~np.isnan(X).all(axis=2)).sum(axis=1)
    Z = np.nan_to_num(X)
    if readout == "last":
        return attention_features(Z, lengths)
    H = prefix_features(Z, lengths)
    real = np.arange(X.shape[1])[None, :] < lengths[:, None]
    return H[real]


def rank(A):
    return 0 if A.shape[0] == 0 else int(np.linalg.matrix_rank(A, tol=1e-9 * max(
        1.0, np.abs(A).max())))


def optimum(X, pool, readout, target=None, max_size=None):
    """Smallest subset of the pool reaching the goal, by exhaustive search (None: none)."""
    base = raw_rows(X, readout)
    scale = np.abs(base).max()
    base = base / scale
    # Null basis of the training rows: ranks are computed on the null components.
    _, s, Vt = np.linalg.svd(base)
    r0 = int(np.count_nonzero(s > 1e-9 * s[0]))
    B = Vt[r0:].T
    cand = [raw_rows(c[None], readout) / scale @ B for c in pool]
    goal_T = None if target is None else raw_rows(target, readout) / scale @ B
    k = B.shape[1]
    need = k if goal_T is None else rank(goal_T)
    if need == 0:
        return 0
    for size in range(1, (max_size or len(pool)) + 1):
        for subset in itertools.combinations(range(len(pool)), size):
            C = np.concatenate([cand[i] for i in subset])
            if goal_T is None:
                if rank(C) == k:
                    return size
            elif rank(C) == rank(np.concatenate([C, goal_T])):
                return size
    return None


def structured_sequence(rng, d, length):
    """Tokens on a random set of coordinates; half of them multiples of one vector."""
    coords = rng.choice(d, size=rng.integers(1, d + 1), replace=False)
    Z = np.zeros((length, d))
    if rng.random() < 0.5:
        Z[:, coords] = rng.normal(size=(length, coords.size))
    else:
        Z[:, coords] = rng.normal(size=(length, 1)) * rng.normal(size=coords.size)
    return Z


def structured_pool(rng, d, m, readout):
    lengths = rng.integers(1, 5, size=m) if readout == "all" else np.full(m, 4)
    pool = np.full((m, 4, d), np.nan)
    for i, L in enumerate(lengths):
        pool[i, :L] = structured_sequence(rng, d, L)
    return pool


def small_case(rng, d, m, readout, with_target):
    X = rng.normal(size=(6 if d == 3 else 2, 3, d))
    X[:, :, rng.integers(d)] = 0.0  # a coordinate that never varies
    pool = structured_pool(rng, d, m, readout)
    target = None
    if with_target:
        target = np.stack([structured_sequence(rng, d, 3) for _ in range(2)])
    return X, pool, target


def brute_force_table(trials, m, seed):
    print(f"Brute force: pool of {m} structured candidates, {trials} trials per row")
    print(f"{'case':<28}{'greedy = opt':>14}{'worst ratio':>13}{'mean added':>12}"
          f"{'mean opt':>10}{'missed':>8}{'time/trial':>12}")
    for d, readout, with_target in [(2, "all", False), (3, "all", False),
                                    (2, "last", True), (3, "last", True),
                                    (3, "all", True), (3, "last", False)]:
        rng = np.random.default_rng(seed)
        equal = total = missed = 0
        ratios, added, opts, times = [], [], [], []
        for _ in range(trials):
            X, pool, target = small_case(rng, d, m, readout, with_target)
            opt = optimum(X, pool, readout, target)
            if opt is None or opt == 0:
                continue
            t0 = time.perf_counter()
            res = repair_certificate(X, pool, readout=readout, target=target)
            times.append(time.perf_counter() - t0)
            total += 1
            if not res.reached:
                missed += 1
                continue
            equal += res.n_added == opt
            ratios.append(res.n_added / opt)
            added.append(res.n_added)
            opts.append(opt)
        name = f"d={d} readout={readout!r}" + (" target" if with_target else "")
        print(f"{name:<28}{f'{equal}/{total}':>14}{max(ratios, default=np.nan):>13.3g}"
              f"{np.mean(added):>12.2f}{np.mean(opts):>10.2f}{missed:>8}"
              f"{np.mean(times) * 1e3:>10.1f}ms")


def report(name, X, pool, *, readout="last", target=None, **kwargs):
    cert = certify_identifiability(X, readout=readout)
    t0 = time.perf_counter()
    res = repair_certificate(X, pool, readout=readout, target=target, **kwargs)
    elapsed = time.perf_counter() - t0
    bound = cert.n_features - cert.rank
    print(f"{name:<46}{cert.rank:>5}/{cert.n_features:<5}{bound:>7}{res.lower_bound:>7}"
          f"{res.n_added:>7}  {str(res.reached):<6}{res.null_dimension:>6}"
          f"{res.n_uncovered:>6}{elapsed:>8.2f}s")
    return res


def one_hot_traces(memory, d, n, distinct, rng):
    prompts = []
    for _ in range(n):
        n_pairs = d if distinct else int(rng.integers(1, d + 2))
        keys = rng.permutation(d)[:n_pairs] if distinct else rng.integers(0, d, n_pairs)
        values = rng.integers(0, d, n_pairs)
        prompts.append([{"key": int(k), "value": int(v)} for k, v in zip(keys, values)]
                       + [{"key": int(rng.choice(keys))}])
    sequences = memory.run(prompts, 1)
    return next_token_dataset(sequences, np.array([len(p) for p in prompts]))[0]


def realistic_table(seed):
    print()
    print("Realistic cases (psi - rank: lower bound of the certificate itself, readout='last')")
    print(f"{'case':<46}{'rank':>11}{'psi-r':>7}{'bound':>7}{'added':>7}  {'holds':<6}"
          f"{'null':>6}{'uncov':>6}{'time':>9}")
    for d in (2, 3, 4):
        X, _ = make_associative_memory(500, d, distribution="orthonormal", random_state=seed)
        pool, _ = make_associative_memory(200, d, random_state=seed + 1)
        report(f"orthonormal memory d={d}, Gaussian pool 200", X, pool)
        gen = (lambda k, rng, d=d: make_associative_memory(
            k, d, random_state=int(rng.integers(2**31)))[0])
        report(f"orthonormal memory d={d}, Gaussian generator", X, gen, random_state=seed)
    rng = np.random.default_rng(seed)
    memory = associative_memory_program(3)
    X = one_hot_traces(memory, 3, 200, True, rng)
    pool = one_hot_traces(memory, 3, 200, False, rng)
    target = one_hot_traces(memory, 3, 20, False, np.random.default_rng(seed + 7))
    report("one-hot memory trace d=3, pool 200 traces", X, pool)
    report("  same, target: 20 held-out traces", X, pool, target=target)
    report("  same, readout='all'", X, pool, readout="all")
    for d in (3, 4):
        psi = d * d * (d + 1) // 2
        X = rng.normal(size=(psi // 2, 5, d))
        report(f"Gaussian N = psi/2 = {psi // 2}, d={d}, pool 2 psi", X,
               rng.normal(size=(2 * psi, 5, d)))
    X = rng.normal(size=(60, 5, 4))
    X[:, :, 3] = 0.0
    report("Gaussian d=4, coordinate 3 zero, pool 80", X, rng.normal(size=(80, 5, 4)))
    report("  same, readout='all'", X, rng.normal(size=(80, 5, 4)), readout="all")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/repair_sizes.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100, help="trials per small case")
    parser.add_argument("--pool", type=int, default=13, help="pool size of the small cases")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    brute_force_table(args.trials, args.pool, args.seed)
    realistic_table(args.seed)


if __name__ == "__main__":
    main()
