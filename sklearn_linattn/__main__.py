"""Command line: ``python -m sklearn_linattn demo``."""

import argparse
import sys
import time
import warnings

import numpy as np


def _demo(args):
    from sklearn.exceptions import ConvergenceWarning

    from . import LinearAttentionRegressor, mhla_forward
    from ._features import n_attention_features

    rng = np.random.default_rng(args.seed)
    d, n_heads = args.d, args.heads
    psi = n_attention_features(d)
    n_samples = args.n_samples if args.n_samples else 4 * psi
    V = rng.normal(size=(n_heads, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(n_heads, d, d)) / np.sqrt(d)

    def sequences(n, min_len, max_len, scale):
        X = scale * rng.normal(size=(n, max_len, d))
        lengths = rng.integers(min_len, max_len + 1, size=n)
        X[np.arange(max_len)[None, :] >= lengths[:, None]] = np.nan
        y = mhla_forward(np.nan_to_num(X), V, Q, lengths)[:, 0]
        return X, y

    X, y = sequences(n_samples, 4, args.max_len, 1.0)
    # Out of distribution: 4x longer sequences with 3x larger tokens.
    X_ood, y_ood = sequences(500, 2 * args.max_len, 4 * args.max_len, 3.0)

    print(f"generator: {n_heads} head(s), d = {d}, psi = {psi} cubic features")
    print(
        f"training:  {n_samples} sequences of 4..{args.max_len} tokens (NaN-padded); "
        f"test: 500 sequences of {2 * args.max_len}..{4 * args.max_len} tokens, 3x larger"
    )
    start = time.perf_counter()
    full = LinearAttentionRegressor().fit(X, y)
    t_fit = time.perf_counter() - start
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        small = LinearAttentionRegressor(n_heads=n_heads, random_state=args.seed).fit(X, y)
    t_small = time.perf_counter() - start

    def ood_error(model):
        return np.linalg.norm(model.predict(X_ood) - y_ood) / np.linalg.norm(y_ood)

    print(f"closed-form fit:        {t_fit:.3f} s, rank {full.feature_rank_} of {psi}")
    print(f"heads from the SVD:     {full.n_heads_}")
    print(
        f"heads after compression: {small.n_heads_} "
        f"(residual {small.compression_residual_:.1e}, {t_small:.3f} s)"
        if small.compression_residual_ is not None
        else f"heads after compression: {small.n_heads_} (no compression needed)"
    )
    for w in caught:
        print(f"warning: {w.message}")
    print(f"out-of-distribution relative error: {ood_error(full):.2e} (SVD heads), "
          f"{ood_error(small):.2e} ({small.n_heads_} heads)")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m sklearn_linattn",
        description="Learn multi-head linear attention in closed form.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="fit a random multi-head generator and report out-of-distribution error",
        description=(
            "Draw a random multi-head linear attention and variable-length Gaussian "
            "sequences, fit it in closed form, compress to the generator's head count, "
            "and report the error on longer, larger unseen sequences."
        ),
    )
    demo.add_argument("--d", type=int, default=8, help="token dimension (default 8)")
    demo.add_argument("--heads", type=int, default=2, help="generator heads (default 2)")
    demo.add_argument(
        "--n-samples", type=int, default=None, help="training sequences (default 4 psi)"
    )
    demo.add_argument("--max-len", type=int, default=16, help="longest training sequence")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.set_defaults(func=_demo)
    return parser


def main(argv=None):
    """Entry point of ``python -m sklearn_linattn``."""
    args = build_parser().parse_args(argv)
    for name in ("d", "heads", "max_len"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            print(f"error: --{name.replace('_', '-')} must be at least 1; got {value}",
                  file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
