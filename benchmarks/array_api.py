"""Fit + certificate with NumPy input against PyTorch input under array API dispatch.

``LinearAttentionRegressor.fit`` computes the certificate as part of the fit,
so one fit is timed.  Gaussian sequences labelled by a random one-head MHLA
(:func:`benchmarks.cg_large.teacher_data`, tokens N(0, 1/n)).

On this machine (``--device cpu``, the default) the same data are fitted
from NumPy arrays and from torch CPU tensors under
``sklearn.config_context(array_api_dispatch=True)``, alternately, best of
``--repeats``, each fit after a pause of 0.5 s (the two libraries' thread
pools, which spin for a while after their last task, parked); the ratio
torch / NumPy is measured in one run.  With
``--device cuda`` the cases are the GPU ones: d = 16 and 32 dense
(``solver="auto"``, N = 20 000 sequences of 16 tokens) and d = 64 with
``solver="cg"`` (150 000 sequences of 16 tokens, as ``benchmarks/cg_large.py
--fit``), each with its peak device memory (``torch.cuda.max_memory_allocated``)
and, for the dense cases, a NumPy fit of the same data on the host for the
ratio (skipped with ``--no-numpy``; NumPy's d = 64 cg fit is the ``cg`` row
of ``benchmarks/README.md``, many minutes).

Usage (``SCIPY_ARRAY_API=1`` is set by the script before SciPy is imported)::

    python benchmarks/array_api.py                      # d = 8, NumPy vs torch CPU
    python benchmarks/array_api.py --d 8 16 --threads 1
    python benchmarks/array_api.py --device cuda        # d = 16, 32 dense; 64 cg
    python benchmarks/array_api.py --device cuda --json > gpu.json
"""

import os

os.environ.setdefault("SCIPY_ARRAY_API", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import sklearn  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from sklearn_linattn import LinearAttentionRegressor  # noqa: E402

try:
    from .cg_large import teacher_data
except ImportError:  # run as a script
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.cg_large import teacher_data

# Pause before each timed fit, longer than the thread pools spin after their last task.
_PARK_SECONDS = 0.5
# (d, n_samples, n_tokens, solver) of the GPU cases of the issue.
GPU_CASES = [(16, 20_000, 16, "auto"), (32, 20_000, 16, "auto"), (64, 150_000, 16, "cg")]


def _fit(X, y, solver, namespace=None):
    """Seconds of one fit (+ certificate), the model, in NumPy or on torch tensors."""
    import torch

    # Both libraries' thread pools parked first: a pool still spinning after
    # the other library's fit (OpenBLAS's for about 0.1 s) would take a core
    # from this one.
    time.sleep(_PARK_SECONDS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if namespace is None:
            start = time.perf_counter()
            model = LinearAttentionRegressor(solver=solver).fit(X, y)
            return time.perf_counter() - start, model
        Xt, yt = torch.asarray(X, device=namespace), torch.asarray(y, device=namespace)
        if namespace != "cpu":
            torch.cuda.synchronize()
        with sklearn.config_context(array_api_dispatch=True):
            start = time.perf_counter()
            model = LinearAttentionRegressor(solver=solver).fit(Xt, yt)
            if namespace != "cpu":
                torch.cuda.synchronize()
            return time.perf_counter() - start, model


def cpu_case(d, n_samples, n_tokens, repeats, solver="auto"):
    """NumPy against torch CPU on the same data, alternately, best of ``repeats``."""
    rng = np.random.default_rng(0)
    X, y, _, _ = teacher_data(rng, n_samples, n_tokens, d, token_scale=1 / np.sqrt(n_tokens))
    numpy_s, torch_s = [], []
    for _ in range(repeats):
        t, ref = _fit(X, y, solver)
        numpy_s.append(t)
        t, model = _fit(X, y, solver, "cpu")
        torch_s.append(t)
    diff = float(np.abs(model.coef_.numpy() - ref.coef_).max() / np.abs(ref.coef_).max())
    return {"device": "cpu", "d": d, "n_samples": n_samples, "n_tokens": n_tokens,
            "solver": ref.solver_, "numpy_s": min(numpy_s), "torch_s": min(torch_s),
            "numpy_all": numpy_s, "torch_all": torch_s,
            "ratio": min(torch_s) / min(numpy_s), "coef_rel_diff": diff,
            "identifiable": bool(model.certificate_)}


def gpu_case(d, n_samples, n_tokens, solver, numpy_too=True):
    """One fit on the GPU (after a small warm-up fit), its peak memory, and NumPy's."""
    import torch

    rng = np.random.default_rng(0)
    X, y, _, _ = teacher_data(rng, n_samples, n_tokens, d, token_scale=1 / np.sqrt(n_tokens))
    _fit(X[:200], y[:200], "auto", "cuda")  # CUDA context and kernels loaded
    torch.cuda.reset_peak_memory_stats()
    seconds, model = _fit(X, y, solver, "cuda")
    out = {"device": torch.cuda.get_device_name(), "d": d, "n_samples": n_samples,
           "n_tokens": n_tokens, "solver": model.solver_, "torch_s": seconds,
           "peak_device_gib": torch.cuda.max_memory_allocated() / 2**30,
           "identifiable": bool(model.certificate_)}
    if numpy_too:
        numpy_s, ref = _fit(X, y, solver)
        out.update(numpy_s=numpy_s, ratio=seconds / numpy_s,
                   coef_rel_diff=float(np.abs(model.coef_.cpu().numpy() - ref.coef_).max()
                                       / np.abs(ref.coef_).max()))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--d", type=int, nargs="+", default=[8])
    parser.add_argument("--n-samples", type=int, default=20_000)
    parser.add_argument("--n-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="BLAS (and torch) threads")
    parser.add_argument("--no-numpy", action="store_true", help="GPU: skip the NumPy fits")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    with threadpool_limits(limits=args.threads):
        if args.device == "cpu":
            for d in args.d:
                results.append(cpu_case(d, args.n_samples, args.n_tokens, args.repeats))
        else:
            if not torch.cuda.is_available():
                parser.error("--device cuda: torch sees no CUDA device.")
            for case in GPU_CASES:
                # NumPy's d = 64 cg fit takes many minutes (the `cg` row of
                # benchmarks/README.md): compared with the dense cases only.
                numpy_too = not args.no_numpy and case[3] != "cg"
                results.append(gpu_case(*case, numpy_too=numpy_too))
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return
    for r in results:
        line = (f"{r['device']}: d={r['d']} N={r['n_samples']} T={r['n_tokens']} "
                f"solver={r['solver']}: torch {r['torch_s']:.3f} s")
        if "numpy_s" in r:
            line += (f", NumPy {r['numpy_s']:.3f} s, torch/NumPy {r['ratio']:.2f}, "
                     f"coef rel. diff {r['coef_rel_diff']:.1e}")
        if "peak_device_gib" in r:
            line += f", peak device memory {r['peak_device_gib']:.2f} GiB"
        print(line + f", identifiable {r['identifiable']}")


if __name__ == "__main__":
    main()
