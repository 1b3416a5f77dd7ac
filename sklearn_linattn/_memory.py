"""Memory: the budget dense arrays may use, chunking, and the shapes every module shares.

The rules are described on the user guide's "Large problems" page.
"""

import os

import numpy as np
from sklearn import get_config
from threadpoolctl import ThreadpoolController

__all__ = [
    "DENSE_ARRAYS",
    "FLOP_RATE",
    "default_memory_budget",
    "heads_size",
    "sample_chunks",
    "least_squares_work",
    "n_pairs",
    "real_tokens",
    "resolve_budget",
    "sample_values",
    "single_blas_thread",
    "zero_padding",
]

# Transient arrays of one chunk of samples hold at most this many bytes
# (32 MiB: they stay close to the caches between the GEMMs that read them),
# or scikit-learn's ``working_memory`` when that is smaller.
CHUNK_BYTES = 2**25
# Dense psi x psi float64 arrays a normal-equation fit holds at once (the
# compact statistics, the Gram matrix, its factor or eigenvectors), per psi**2
# doubles.
DENSE_ARRAYS = 3.25
# Floating-point operations per second that the time estimates assume: dense
# BLAS products on a few cores (one core of a laptop does a few GFLOP/s in
# DGEMM, a server's cores together over a hundred).  Only warnings use it.
FLOP_RATE = 1e10


def default_memory_budget():
    """Bytes that dense arrays may use: half the physical memory (``os.sysconf``), 8 GiB where
    the platform does not report it.
    """
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 2**33
    if pages <= 0 or page_size <= 0:
        return 2**33
    return int(pages) * int(page_size) // 2


def resolve_budget(memory_budget=None):
    """``memory_budget`` in bytes, or :func:`default_memory_budget` when it is None."""
    return default_memory_budget() if memory_budget is None else memory_budget


def n_pairs(d):
    """Number of pairs (j, k), j <= k, of d coordinates: ``d (d + 1) / 2``."""
    return d * (d + 1) // 2


def least_squares_work(n_rows, psi):
    """Floating-point operations of a dense least squares of n_rows x psi, at the least:
    ``n_rows psi k + k**3 / 3`` with ``k = min(n_rows, psi)``.
    """
    n_rows, psi = float(n_rows), float(psi)
    k = min(n_rows, psi)
    return n_rows * psi * k + k**3 / 3


def heads_size(d, d_out):
    """Bytes and floating-point operations ``(n_bytes, flops)`` of the thin SVD that turns the
    coefficients of d_out outputs, a (d_out d) x d**2 matrix, into heads.
    """
    m, n = float(d_out) * d, float(d) * d
    k = min(m, n)
    return 8.0 * (m * n + m * k + k * n), m * n * k


def real_tokens(lengths, n_tokens):
    """Boolean mask (n_samples, n_tokens) of the real (not padded) positions."""
    return np.arange(n_tokens)[None, :] < np.asarray(lengths)[:, None]


def zero_padding(X, lengths):
    """X with zeros at positions ``>= lengths`` (a new array only when some are padded), so that
    padding, NaN included, adds nothing to any feature.
    """
    if lengths.size == 0 or lengths.min() >= X.shape[1]:
        return X
    return np.where(real_tokens(lengths, X.shape[1])[:, :, None], X, 0.0)


def sample_values(d, n_tokens, readout, per_row):
    """Float64 values one sequence occupies in a chunk of feature-row work arrays: its tokens, its
    folded moments, and ``per_row`` values per feature row.
    """
    rows = 1 if readout == "last" else n_tokens
    moments = d * d if readout == "last" else n_tokens * n_pairs(d)
    return n_tokens * d + moments + rows * per_row


def sample_chunks(n_samples, values_per_sample, budget=None):
    """Slices of consecutive samples whose work arrays (``values_per_sample`` float64 each) fit a
    chunk of ``budget`` values: by default 32 MiB, or ``working_memory`` when smaller.
    """
    if budget is None:
        working = float(get_config()["working_memory"]) * 2**20
        budget = int(min(CHUNK_BYTES, working)) // 8
    n_samples = int(n_samples)
    step = max(1, int(budget) // max(1, int(values_per_sample)))
    # A plain loop: scikit-learn's gen_batches validates its parameters at every
    # call, which costs more than the work of a small chunk.
    return [slice(start, min(start + step, n_samples)) for start in range(0, n_samples, step)]


_CONTROLLER = []  # the process's ThreadpoolController, found once (a scan costs ~4 ms)


def single_blas_thread():
    """Context with BLAS on one thread: small products that threads only slow down."""
    if not _CONTROLLER:
        _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1, user_api="blas")

