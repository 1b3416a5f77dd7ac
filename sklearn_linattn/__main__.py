"""Command line: ``sklearn-linattn`` or ``python -m sklearn_linattn`` {demo,fit,predict,certify}.

Results go to standard output, progress and errors to standard error.  Exit status:

- 0: success (with ``certify --check``: the data identifies the function).
- 1: an input or output could not be used (a file, the arrays, the output, the memory).
- 2: command-line usage (an unknown option, a value of the wrong type or out of range).
- 3: ``certify --check`` only: the data does not identify the function.
- 4: internal error (a bug, please report it).
- 130: interrupted (Ctrl-C).
"""

import argparse
import contextlib
import json
import os
import sys
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

# The package's functions are looked up on the package at each call, so that
# what a caller (or a test) puts there is what the command line runs.
import sklearn_linattn as package

from . import _memory
from ._features import n_attention_features
from ._memory import n_pairs, real_tokens
from ._npz import load_arrays
from ._solvers import SOLVERS, choose_solver, solver_memory
from ._params import check_decays, check_number

EXIT_OK = 0
EXIT_INPUT = 1
EXIT_USAGE = 2
EXIT_NOT_IDENTIFIABLE = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130

_EPILOG = f"""\
exit status:
  {EXIT_OK}    success (certify --check: the data identifies the function)
  {EXIT_INPUT}    a file, its arrays or an output location could not be used, or not
       enough memory
  {EXIT_USAGE}    command-line usage error, or an option value out of range
  {EXIT_NOT_IDENTIFIABLE}    certify --check: the data does not identify the function
  {EXIT_INTERNAL}    internal error (a bug; please report it)
  {EXIT_INTERRUPTED}  interrupted
Progress and errors go to standard error; --json output on standard output
stays machine-readable.
"""


# The numeric options and the values they take, as check_number's arguments:
# a value outside its range is a usage error (status 2), caught before any
# file is read, and every subcommand's options are here.
_SEED = dict(integer=True, low=0, high=2**32 - 1)
_NUMERIC_OPTIONS = {
    "d": dict(integer=True, low=1),
    "heads": dict(integer=True, low=1),
    "n_samples": dict(integer=True, low=1),
    "min_len": dict(integer=True, low=1),
    "max_len": dict(integer=True, low=1),
    "seed": _SEED,
    "alpha": dict(low=0.0),
    "n_heads": dict(integer=True, low=1),
    "random_state": _SEED,
    "token_dim": dict(integer=True, low=1),
    "tol": dict(low=0.0),
    "decay": dict(low=0.0, high=1.0, low_open=True),  # each of the values given
}


class _UserError(Exception):
    """A problem with the user's files, arrays or output location: exit status 1."""


class _UsageError(Exception):
    """An option value that cannot work: exit status 2."""


def _load_data(path, need_y):

    if not os.path.exists(path):
        raise _UserError(f"no such file: {path}")
    try:
        arrays = load_arrays(path, ["X", "y"] if need_y else ["X"])
    except ValueError as exc:
        raise _UserError(str(exc)) from None
    return arrays["X"], arrays.get("y")


def _output_path(path, suffix, what):
    """The file an output will be written to, checked before any work is done."""
    path = os.fspath(path)
    if not path.endswith(suffix):
        path += suffix  # numpy appends it too; say the name that will exist
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _UserError(f"cannot write the {what} to {path}: directory {parent} does not exist")
    if os.path.isdir(path):
        raise _UserError(f"cannot write the {what} to {path}: it is a directory")
    if not os.access(parent, os.W_OK) or (
        os.path.exists(path) and not os.access(path, os.W_OK)
    ):
        raise _UserError(f"cannot write the {what} to {path}: permission denied")
    return path


def _json_safe(value):
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _emit(args, payload, lines):
    if args.json:
        print(json.dumps(_json_safe(payload), indent=2, allow_nan=False))
    else:
        print("\n".join(lines))


def _describe(X, token_dim, data_format="channels_last", n_decays=None):
    """'N sequences (d = .., psi = .. features)' from the raw array, before validation."""

    X = np.asarray(X)
    if X.ndim == 3:
        d, tokens = X.shape[2], X.shape[1]
        if data_format == "channels_first":
            d, tokens = tokens, d
    elif X.ndim == 2:
        d = token_dim or 1
        tokens = X.shape[1] // d
    else:
        return f"X of shape {X.shape}"
    psi = n_attention_features(d)
    if n_decays is None:
        features = f"psi = {psi} features"
    else:
        blocks = f"{n_decays} decay{'s' if n_decays > 1 else ''}"
        features = f"psi = {n_decays * psi} features: {blocks} x {psi}"
    return f"{X.shape[0]} sequences of up to {tokens} tokens (d = {d}, {features})"


@contextlib.contextmanager
def _stage(args, message):
    """A line on stderr before a stage that may take a while, its time after."""
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(f"{message}...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    if not quiet:
        print(f"  done in {time.perf_counter() - start:.3f} s", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stdout_to_stderr():
    # The estimator's verbose progress is printed; stdout must stay for results.
    stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        yield
    finally:
        sys.stdout = stdout


def _fit(args):

    output = _output_path(args.output, ".npz", "model")
    model = package.LinearAttentionRegressor(
        readout=args.readout,
        alpha=args.alpha,
        n_heads=args.n_heads,
        decay=args.decay,
        solver=args.solver,
        token_dim=args.token_dim,
        data_format=args.data_format,
        random_state=args.random_state,
        verbose=0 if args.quiet else 1,
        fit_intercept=args.fit_intercept,
        fit_skip=args.fit_skip,
    )
    try:
        model._check_params()  # before reading (maybe large) data
    except (ValueError, TypeError) as exc:
        raise _UsageError(str(exc)) from None
    X, y = _load_data(args.data, need_y=True)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n_decays = None if args.decay is None else len(args.decay)
        what = _describe(X, args.token_dim, args.data_format, n_decays)
        with _stage(args, f"fitting {what}"), _stdout_to_stderr():
            model.fit(X, y)
    elapsed = time.perf_counter() - start
    with _stage(args, "scoring the fit on its training data"):
        train_r2 = model.score(X, y)
    # A loaded model should not print progress in the user's later code.
    model.set_params(verbose=0)
    package.save_model(model, output)
    cert = model.certificate_
    payload = {
        "model": output,
        "n_samples": int(np.shape(X)[0]),
        "d": model.n_features_in_,
        "d_out": model.n_outputs_,
        "n_heads": model.n_heads_,
        "feature_rank": model.feature_rank_,
        "n_features": int(model.coef_.shape[1]),
        "identifiable": bool(cert),
        "min_eigenvalue": float(cert.min_eigenvalue),
        "train_r2": train_r2,
        "compression_residual": model.compression_residual_,
        "seconds": elapsed,
        "warnings": [str(w.message) for w in caught],
    }
    if cert:
        verdict = ("identifiable: every least-squares fit of these data computes this "
                   "function on every input")
    else:
        verdict = (f"NOT identifiable: rank {cert.rank} of {cert.n_features}; other fits of "
                   "these data compute different functions elsewhere (see the certify "
                   "command)")
    _emit(
        args,
        payload,
        [
            f"fitted {payload['n_samples']} sequences (d = {payload['d']}, "
            f"d_out = {payload['d_out']}) in {elapsed:.3f} s",
            f"heads: {model.n_heads_}; feature rank {model.feature_rank_} of "
            f"{payload['n_features']}; training R^2 = {payload['train_r2']:.6g}",
            f"certificate: {verdict}",
            *[f"warning: {w}" for w in payload["warnings"]],
            f"model written to {output}",
        ],
    )
    return EXIT_OK


def _predict(args):

    where = _output_path(args.output, ".npy", "predictions") if args.output else None
    try:
        model = package.load_model(args.model)
    except ValueError as exc:
        raise _UserError(str(exc)) from None
    X, _ = _load_data(args.data, need_y=False)
    decays = check_decays(model.decay)
    what = _describe(X, model.token_dim, model.data_format,
                     None if decays is None else len(decays))
    with _stage(args, f"predicting {what}"):
        pred = model.predict(X)
    if where:
        np.save(where, pred)
    if args.json:
        # readout="all" predictions are NaN at padded positions: null in JSON.
        values = np.where(np.isfinite(pred), pred, None).tolist()
        payload = {"predictions": values, **({"output": where} if where else {})}
        print(json.dumps(payload, allow_nan=False))
    elif where:
        print(f"{pred.shape} predictions written to {where}")
    else:
        np.savetxt(sys.stdout, pred.reshape(pred.shape[0], -1), fmt="%.17g")
    return EXIT_OK


def _certify(args):

    X, _ = _load_data(args.data, need_y=False)
    n_decays = None if args.decay is None else len(args.decay)
    what = _describe(X, args.token_dim, args.data_format, n_decays)
    with _stage(args, f"certifying {what}"):
        cert = package.certify_identifiability(X, readout=args.readout, token_dim=args.token_dim,
                                       data_format=args.data_format, tol=args.tol,
                                       fit_intercept=args.fit_intercept,
                                       fit_skip=args.fit_skip, decay=args.decay)
    payload = {
        "identifiable": bool(cert),
        "min_eigenvalue": float(cert.min_eigenvalue),
        "rank": int(cert.rank),
        "n_features": int(cert.n_features),
        "n_samples": int(cert.n_samples),
        "tol": float(cert.tol),
    }
    _emit(args, payload, [cert.summary()])
    return EXIT_NOT_IDENTIFIABLE if args.check and not cert else EXIT_OK


# Test sequences of the demo (out of distribution: 4x longer, 3x larger).
_DEMO_TEST_SEQUENCES = 500


def _demo_bytes(d, n_heads, n_samples, max_len):
    """Peak memory of ``demo``, estimated from its sizes before anything is drawn."""

    psi = n_attention_features(d)
    n = n_samples or 4 * psi
    sequences = 2 * 8 * d * (n * max_len + _DEMO_TEST_SEQUENCES * 4 * max_len)
    solver = choose_solver("auto", n, psi)
    if solver == "cg":  # its cache of row factors, in float64
        fit = 8 * n * (n_pairs(d) + d + 1)
    else:
        fit = int(solver_memory(solver, n, psi))
    compression = 8 * n_heads * (d**5 + 2 * d * d * psi) + 8 * (n_heads * d * d) ** 2
    return sequences + max(fit, compression)


def _check_demo_size(args):

    budget = _memory.default_memory_budget()
    need = _demo_bytes(args.d, args.heads, args.n_samples, args.max_len)
    if need <= budget:
        return
    fits = [d for d in range(1, args.d)
            if _demo_bytes(d, args.heads, args.n_samples, args.max_len) <= budget]
    psi = n_attention_features(args.d)
    n = args.n_samples or 4 * psi
    advice = (f"the largest --d that fits with these options is {fits[-1]}" if fits
              else "no --d fits with these options; lower --max-len or --n-samples")
    raise _UsageError(
        f"demo --d {args.d} needs about {need / 2**30:.3g} GiB (psi = {psi} features, "
        f"{n} training sequences of up to {args.max_len} tokens), more than the memory "
        f"budget of {budget / 2**30:.3g} GiB (half the physical memory); {advice}."
    )


def _demo(args):


    if args.min_len > args.max_len:
        raise _UsageError(f"--min-len ({args.min_len}) exceeds --max-len ({args.max_len})")
    _check_demo_size(args)
    rng = np.random.default_rng(args.seed)
    d, n_heads = args.d, args.heads
    psi = n_attention_features(d)
    n_samples = args.n_samples if args.n_samples else 4 * psi
    V = rng.normal(size=(n_heads, 1, d)) / np.sqrt(d)
    Q = rng.normal(size=(n_heads, d, d)) / np.sqrt(d)

    def sequences(n, min_len, max_len, scale):
        X = scale * rng.normal(size=(n, max_len, d))
        lengths = rng.integers(min_len, max_len + 1, size=n)
        X[~real_tokens(lengths, max_len)] = np.nan
        y = package.mhla_forward(np.nan_to_num(X), V, Q, lengths)[:, 0]
        return X, y

    n_test, long = _DEMO_TEST_SEQUENCES, 4 * args.max_len
    with _stage(args, f"drawing {n_samples} training and {n_test} test sequences "
                f"(d = {d}, up to {long} tokens)"):
        X, y = sequences(n_samples, args.min_len, args.max_len, 1.0)
        X_ood, y_ood = sequences(n_test, 2 * args.max_len, long, 3.0)

    print(f"generator: {n_heads} head(s), d = {d}, psi = {psi} cubic features")
    print(
        f"training:  {n_samples} sequences of {args.min_len}..{args.max_len} tokens "
        "(NaN-padded); "
        f"test: {n_test} sequences of {2 * args.max_len}..{long} tokens, 3x larger",
        flush=True,
    )
    start = time.perf_counter()
    with _stage(args, f"fitting the closed form ({n_samples} sequences, psi = {psi} "
                "features)"):
        full = package.LinearAttentionRegressor().fit(X, y)
    t_fit = time.perf_counter() - start
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        with _stage(args, f"fitting again and compressing to {n_heads} head(s)"):
            small = package.LinearAttentionRegressor(n_heads=n_heads,
                                                     random_state=args.seed).fit(X, y)
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
    return EXIT_OK


def build_parser(prog="sklearn-linattn"):
    """Build the argument parser of the command line.

    Parameters
    ----------
    prog : str, default="sklearn-linattn"
        Program name shown in usage lines.

    Returns
    -------
    parser : argparse.ArgumentParser
        One subcommand each for ``demo``, ``fit``, ``predict`` and
        ``certify``; the chosen one's function is ``args.func``.

    Examples
    --------
    >>> from sklearn_linattn.__main__ import build_parser
    >>> args = build_parser().parse_args(["certify", "data.npz", "--check"])
    >>> args.command, args.data, args.check
    ('certify', 'data.npz', True)
    """

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Learn multi-head linear attention in closed form.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def quiet_option(p):
        p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    def subcommand(name, **kwargs):
        return sub.add_parser(name, epilog=_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    demo = subcommand(
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
    quiet_option(demo)
    demo.set_defaults(func=_demo)

    def model_options(p):
        p.add_argument("--readout", choices=["last", "all"], default="last",
                       help="targets at the last token (default) or at every position")
        p.add_argument("--token-dim", type=int, default=None,
                       help="token dimension for 2-D X (rows are flattened sequences)")
        p.add_argument("--data-format", choices=["channels_last", "channels_first"],
                       default="channels_last",
                       help="layout of X: (n_samples, n_tokens, d), the default, or "
                            "(n_samples, d, n_tokens) as aeon and sktime store series")
        p.add_argument("--fit-intercept", action="store_true",
                       help="a constant term beside attention (the certificate covers it)")
        p.add_argument("--fit-skip", action="store_true",
                       help="a linear term in the row's token beside attention (the "
                            "residual path)")
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        quiet_option(p)

    fit = subcommand(
        "fit",
        help="fit a model to arrays X and y in an .npz file",
        description="Fit LinearAttentionRegressor to DATA.npz (arrays X and y) and write "
        "the model as plain arrays to an .npz file (no pickle).  Prints whether the data "
        "identifies the function (the identifiability certificate).",
    )
    fit.add_argument("data", help="an .npz file with arrays X and y")
    fit.add_argument("-o", "--output", default="model.npz", help="model file (default model.npz)")
    fit.add_argument("--alpha", type=float, default=0.0, help="ridge penalty (default 0)")
    fit.add_argument("--n-heads", type=_n_heads_option, default=None,
                     help="compress to this many heads (per decay with --decay), or 'auto' for "
                          "the fewest that fit as well")
    fit.add_argument("--decay", type=float, nargs="+", default=None, metavar="GAMMA",
                     help="fixed decays in (0, 1] (retention), distinct: one block of psi "
                          "features and one group of heads per decay (default: none)")
    fit.add_argument("--solver", choices=list(SOLVERS), default="auto")
    fit.add_argument("--random-state", type=int, default=None)
    model_options(fit)
    fit.set_defaults(func=_fit)

    predict = subcommand(
        "predict",
        help="predict with a model file on arrays X in an .npz file",
        description="Load MODEL.npz (written by fit) and predict on the array X of DATA.npz. "
        "With --json, non-finite predictions (NaN at the padded positions of readout='all') "
        "are written as null.",
    )
    predict.add_argument("model", help="a model file written by fit")
    predict.add_argument("data", help="an .npz file with an array X")
    predict.add_argument("-o", "--output", default=None,
                         help="write predictions to this .npy file instead of stdout")
    predict.add_argument("--json", action="store_true", help="print JSON instead of text")
    quiet_option(predict)
    predict.set_defaults(func=_predict)

    certify = subcommand(
        "certify",
        help="certify whether the sequences X in an .npz file identify the function",
        description="Check whether every least-squares minimiser on DATA.npz computes the "
        "same function on every input (the identifiability certificate).",
    )
    certify.add_argument("data", help="an .npz file with an array X")
    certify.add_argument("--tol", type=float, default=None,
                         help="eigenvalue threshold (default: the package's rule)")
    certify.add_argument("--check", action="store_true",
                         help=f"exit with status {EXIT_NOT_IDENTIFIABLE} when the data is "
                         "not identifiable")
    certify.add_argument("--decay", type=float, nargs="+", default=None, metavar="GAMMA",
                         help="certify the model with these fixed decays in (0, 1], distinct: "
                              "one block of psi features per decay (default: none)")
    model_options(certify)
    certify.set_defaults(func=_certify)
    return parser


def _n_heads_option(text):
    """``--n-heads``: an integer, or ``auto`` for ``n_heads="auto"``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected an integer or 'auto'") from None


def _check_numeric_options(args):
    """Every numeric option in its range (finite, not negative, ...), else a usage error."""

    for name, expected in _NUMERIC_OPTIONS.items():
        value = getattr(args, name, None)
        if value is not None and not (name == "n_heads" and value == "auto"):
            option = f"--{name.replace('_', '-')}"
            try:
                # An option of several values (--decay) checks each.
                for item in value if isinstance(value, list) else [value]:
                    check_number(item, option, **expected)
                if name == "decay":
                    check_decays(value, option)  # one block per decay: distinct
            except (TypeError, ValueError) as exc:
                raise _UsageError(str(exc)) from None


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {_one_line(message)}", file=sys.stderr)


def main(argv=None, *, prog="sklearn-linattn"):
    """Run the command line; every error becomes one ``error: ...`` line and an exit status.

    Parameters
    ----------
    argv : list of str or None, default=None
        Arguments after the program name; None reads ``sys.argv[1:]``.
    prog : str, default="sklearn-linattn"
        Program name for usage lines (``python -m sklearn_linattn`` passes its own).

    Returns
    -------
    status : int
        The exit status (usage errors, ``--help`` and ``--version`` raise ``SystemExit``).

    Examples
    --------
    >>> from sklearn_linattn.__main__ import main
    >>> main(["demo", "--d", "0"])
    2
    """
    args = build_parser(prog).parse_args(argv)
    try:
        _check_numeric_options(args)
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning
            return args.func(args)
    except _UsageError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: stop quietly, as shell tools do,
        # and keep Python from failing again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except (_UserError, ValueError, TypeError, OSError) as exc:
        # Validation errors name the file or argument and what was wrong.
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_INPUT
    except MemoryError as exc:
        detail = f" ({_one_line(exc)})" if str(exc) else ""
        print(f"error: not enough memory for {args.command}{detail}; try smaller inputs",
              file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, documented status
        print(f"error: internal error ({type(exc).__name__}: {_one_line(exc)}); please "
              "report this bug to the sklearn-linattn developers", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main(prog="python -m sklearn_linattn"))
