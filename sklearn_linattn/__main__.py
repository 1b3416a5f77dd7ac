"""Command line: ``python -m sklearn_linattn {demo,fit,predict,certify}``.

Exit codes: 0 success, 1 a file or its arrays could not be used, 2 bad
command-line usage (argparse's convention).
"""

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np


from ._solvers import SOLVERS


class _UserError(Exception):
    """A problem with the user's files or arrays: message, exit code 1."""


def _load_data(path, need_y):
    if not os.path.exists(path):
        raise _UserError(f"no such file: {path}")
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # numpy raises several types for non-npz files
        raise _UserError(f"{path} is not a readable .npz file ({exc})") from None
    with data:
        if not hasattr(data, "files"):
            raise _UserError(f"{path} holds a single array; expected an .npz with X and y")
        if "X" not in data.files:
            raise _UserError(f"{path} has no array named 'X' (it has {data.files})")
        if need_y and "y" not in data.files:
            raise _UserError(f"{path} has no array named 'y' (it has {data.files})")
        try:
            X = data["X"]
            y = data["y"] if "y" in data.files else None
        except ValueError as exc:  # object arrays need pickle, which we refuse
            raise _UserError(f"{path}: {exc}") from None
    return X, y


def _emit(args, payload, lines):
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print("\n".join(lines))


def _fit(args):
    from . import LinearAttentionRegressor, save_model

    X, y = _load_data(args.data, need_y=True)
    model = LinearAttentionRegressor(
        readout=args.readout,
        alpha=args.alpha,
        n_heads=args.n_heads,
        solver=args.solver,
        token_dim=args.token_dim,
        random_state=args.random_state,
        verbose=0 if args.json or args.quiet else 1,
    )
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Progress goes to stderr so that stdout stays machine-readable.
        stdout, sys.stdout = sys.stdout, sys.stderr
        try:
            model.fit(X, y)
        finally:
            sys.stdout = stdout
    elapsed = time.perf_counter() - start
    save_model(model, args.output)
    output = args.output if args.output.endswith(".npz") else args.output + ".npz"
    payload = {
        "model": output,
        "n_samples": int(np.shape(X)[0]),
        "d": model.n_features_in_,
        "d_out": model.n_outputs_,
        "n_heads": model.n_heads_,
        "feature_rank": model.feature_rank_,
        "n_features": int(model.coef_.shape[1]),
        "train_r2": model.score(X, y),
        "compression_residual": model.compression_residual_,
        "seconds": elapsed,
        "warnings": [str(w.message) for w in caught],
    }
    _emit(
        args,
        payload,
        [
            f"fitted {payload['n_samples']} sequences (d = {payload['d']}, "
            f"d_out = {payload['d_out']}) in {elapsed:.3f} s",
            f"heads: {model.n_heads_}; feature rank {model.feature_rank_} of "
            f"{payload['n_features']}; training R^2 = {payload['train_r2']:.6g}",
            *[f"warning: {w}" for w in payload["warnings"]],
            f"model written to {output}",
        ],
    )
    return 0


def _predict(args):
    from . import load_model

    try:
        model = load_model(args.model)
    except (FileNotFoundError, ValueError) as exc:
        raise _UserError(str(exc)) from None
    X, _ = _load_data(args.data, need_y=False)
    pred = model.predict(X)
    if args.output:
        np.save(args.output, pred)
        where = args.output if args.output.endswith(".npy") else args.output + ".npy"
    if args.json:
        print(json.dumps({"predictions": pred.tolist(), **({"output": where} if args.output else {})}))
    elif args.output:
        print(f"{pred.shape} predictions written to {where}")
    else:
        np.savetxt(sys.stdout, pred.reshape(pred.shape[0], -1), fmt="%.17g")
    return 0


def _certify(args):
    from . import certify_identifiability

    X, _ = _load_data(args.data, need_y=False)
    cert = certify_identifiability(X, readout=args.readout, token_dim=args.token_dim, tol=args.tol)
    payload = {
        "identifiable": bool(cert),
        "min_eigenvalue": float(cert.min_eigenvalue),
        "rank": int(cert.rank),
        "n_features": int(cert.n_features),
        "n_samples": int(cert.n_samples),
        "tol": float(cert.tol),
    }
    _emit(args, payload, [cert.summary()])
    return 1 if args.check and not cert else 0


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

    if args.min_len > args.max_len:
        print(f"error: --min-len ({args.min_len}) exceeds --max-len ({args.max_len})",
              file=sys.stderr)
        return 2
    X, y = sequences(n_samples, args.min_len, args.max_len, 1.0)
    # Out of distribution: 4x longer sequences with 3x larger tokens.
    X_ood, y_ood = sequences(500, 2 * args.max_len, 4 * args.max_len, 3.0)

    print(f"generator: {n_heads} head(s), d = {d}, psi = {psi} cubic features")
    print(
        f"training:  {n_samples} sequences of {args.min_len}..{args.max_len} tokens "
        "(NaN-padded); "
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
          f"{ood_error(small):.2e} ({small.n_heads_} head{'s' if small.n_heads_ > 1 else ''})")
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
    demo.add_argument("--min-len", type=int, default=4, help="shortest training sequence")
    demo.add_argument("--max-len", type=int, default=16, help="longest training sequence")
    demo.add_argument("--seed", type=int, default=0, help="random seed")
    demo.set_defaults(func=_demo)

    def model_options(p):
        p.add_argument("--readout", choices=["last", "all"], default="last",
                       help="targets at the last token (default) or at every position")
        p.add_argument("--token-dim", type=int, default=None,
                       help="token dimension for 2-D X (rows are flattened sequences)")
        p.add_argument("--json", action="store_true", help="print JSON instead of text")

    fit = sub.add_parser(
        "fit",
        help="fit a model to arrays X and y in an .npz file",
        description="Fit LinearAttentionRegressor to DATA.npz (arrays X and y) and write "
        "the model as plain arrays to an .npz file (no pickle).",
    )
    fit.add_argument("data", help="an .npz file with arrays X and y")
    fit.add_argument("-o", "--output", default="model.npz", help="model file (default model.npz)")
    fit.add_argument("--alpha", type=float, default=0.0, help="ridge penalty (default 0)")
    fit.add_argument("--n-heads", type=int, default=None, help="compress to this many heads")
    fit.add_argument("--solver", choices=list(SOLVERS), default="auto")
    fit.add_argument("--random-state", type=int, default=None)
    fit.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    model_options(fit)
    fit.set_defaults(func=_fit)

    predict = sub.add_parser(
        "predict",
        help="predict with a model file on arrays X in an .npz file",
        description="Load MODEL.npz (written by fit) and predict on the array X of DATA.npz.",
    )
    predict.add_argument("model", help="a model file written by fit")
    predict.add_argument("data", help="an .npz file with an array X")
    predict.add_argument("-o", "--output", default=None,
                         help="write predictions to this .npy file instead of stdout")
    predict.add_argument("--json", action="store_true", help="print JSON instead of text")
    predict.set_defaults(func=_predict)

    certify = sub.add_parser(
        "certify",
        help="certify whether the sequences X in an .npz file identify the function",
        description="Check whether every least-squares minimiser on DATA.npz computes the "
        "same function on every input (the identifiability certificate).",
    )
    certify.add_argument("data", help="an .npz file with an array X")
    certify.add_argument("--tol", type=float, default=None,
                         help="eigenvalue threshold (default: the package's rule)")
    certify.add_argument("--check", action="store_true",
                         help="exit with status 1 when the data is not identifiable")
    model_options(certify)
    certify.set_defaults(func=_certify)
    return parser


def main(argv=None):
    """Entry point of ``python -m sklearn_linattn``."""
    args = build_parser().parse_args(argv)
    for name in ("d", "heads", "min_len", "max_len", "n_samples", "n_heads", "token_dim"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            print(f"error: --{name.replace('_', '-')} must be at least 1; got {value}",
                  file=sys.stderr)
            return 2
    try:
        return args.func(args)
    except _UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError) as exc:
        # Validation errors name the argument and what was wrong with it.
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: stop quietly, as shell tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
