"""Measurement helpers: interleaved timings, peak memory, isolated processes.

Every number the harness reports comes from these functions, called in the
same run as the rest of the table.
"""

import multiprocessing
import os
import resource
import time
import traceback
import tracemalloc
from dataclasses import dataclass, field

from threadpoolctl import threadpool_limits

__all__ = [
    "MemoryPeak",
    "Result",
    "current_rss",
    "interleaved_timings",
    "measure_peak_memory",
    "peak_rss",
    "reset_peak_rss",
    "run_isolated",
]

MB = 1e6
GB = 1e9


@dataclass
class Result:
    """One line of the results table.

    Attributes
    ----------
    row : str
        Key of the row that produced it (``--only`` / ``--skip`` use it).
    label : str
        What the ratio compares, e.g. ``"fit / Phi^T Phi, d = 16"``.
    setting : str
        Sizes and data of the measurement.
    measured : str
        The measured quantity, with its unit.
    baseline : str
        What it is divided by, with its unit.
    ratio : str
        ``measured / baseline`` as text (``"> 120"`` for a lower bound).
    target : str
        The target from the issue, or ``"no target"``.
    status : str
        ``"PASS"``, ``"MISS"``, ``"INCONCLUSIVE"``, ``"reported"`` (no
        target), ``"n/a (quick)"``, ``"not available"`` or ``"ERROR"``.
    details : list of str
        Everything else measured (all repeats, accuracies, choices made).
    """

    row: str
    label: str
    setting: str = ""
    measured: str = ""
    baseline: str = ""
    ratio: str = "-"
    target: str = "no target"
    status: str = "reported"
    details: list = field(default_factory=list)


def interleaved_timings(functions, repeats, *, min_time=0.0, max_repeats=None):
    """Wall times of several functions, run in turn, round after round.

    Interleaving (a, b, a, b, ...) exposes every function to the same load on
    a shared machine; take the minimum of each list as its best time.  Cheap
    functions get more rounds (up to ``max_repeats``) until the rounds have
    taken ``min_time`` seconds, so that at least one round is likely to run
    undisturbed.

    Parameters
    ----------
    functions : dict of str to callable
        Functions called without arguments, in the order given.
    repeats : int
        Minimum number of rounds.
    min_time : float, default=0.0
        Keep adding rounds while the rounds so far took less than this.
    max_repeats : int or None, default=None
        Cap on the number of rounds; None means ``repeats``.

    Returns
    -------
    times : dict of str to list of float
        Seconds of each call, per function, in call order.
    last : dict of str to object
        Return value of each function's last call.
    """
    max_repeats = repeats if max_repeats is None else max(repeats, max_repeats)
    times = {name: [] for name in functions}
    last = {}
    start = time.perf_counter()
    for round_ in range(max_repeats):
        if round_ >= repeats and time.perf_counter() - start >= min_time:
            break
        for name, func in functions.items():
            t0 = time.perf_counter()
            last[name] = func()
            times[name].append(time.perf_counter() - t0)
    return times, last


def _status_value(key, pid="self"):
    """A ``kB`` line of ``/proc/<pid>/status`` in bytes, or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss():
    """Resident set size of this process in bytes (None if unknown)."""
    return _status_value("VmRSS")


def peak_rss():
    """Peak resident set size of this process in bytes.

    ``VmHWM`` from ``/proc/self/status`` when available (it honours
    :func:`reset_peak_rss`), else ``resource.getrusage`` (kB on Linux).
    """
    hwm = _status_value("VmHWM")
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss():
    """Reset the peak RSS to the current RSS (Linux ``clear_refs``).

    Returns
    -------
    ok : bool
        False when the kernel does not allow it; the peak then also covers
        everything this process did before.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


@dataclass
class MemoryPeak:
    """Peak memory of one call, on top of what existed before it.

    Attributes
    ----------
    seconds : float
        Wall time of the call (tracemalloc running).
    traced_peak : int
        Peak bytes of the allocations made during the call and tracked by
        tracemalloc (Python objects and numpy arrays).
    rss_before : int or None
        Resident set size just before the call.
    rss_peak : int or None
        Peak resident set size of the process during the call.
    rss_reset : bool
        Whether the peak RSS was reset before the call; if not, ``rss_peak``
        is the peak of the whole process life (an upper bound).
    """

    seconds: float
    traced_peak: int
    rss_before: int | None
    rss_peak: int | None
    rss_reset: bool

    @property
    def rss_growth(self):
        """Peak RSS minus the RSS before the call (None if unknown)."""
        if self.rss_before is None or self.rss_peak is None:
            return None
        return max(0, self.rss_peak - self.rss_before)

    @property
    def beyond(self):
        """The larger of the traced peak and the RSS growth (conservative)."""
        growth = self.rss_growth
        return self.traced_peak if growth is None else max(self.traced_peak, growth)


def measure_peak_memory(func, *, trace=True):
    """Call ``func()`` and measure the memory it needs beyond what exists.

    Create the data first, then call this: tracemalloc starts after the data
    exists, so its peak counts only what ``func`` allocates, and the peak RSS
    is reset to the current RSS just before the call.

    Parameters
    ----------
    func : callable
        Called without arguments.
    trace : bool, default=True
        Run tracemalloc (slightly slower); False reports RSS only.

    Returns
    -------
    peak : MemoryPeak
    value : object
        What ``func`` returned.
    """
    reset = reset_peak_rss()
    rss_before = current_rss()
    if trace:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        value = func()
        seconds = time.perf_counter() - start
        traced = tracemalloc.get_traced_memory()[1] if trace else 0
    finally:
        if trace:
            tracemalloc.stop()
    return MemoryPeak(seconds, traced, rss_before, peak_rss(), reset), value


def _child(conn, func, kwargs, threads):
    try:
        with threadpool_limits(limits=threads):
            conn.send(("ok", func(**kwargs)))
    except BaseException:  # report everything to the parent, then exit
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_isolated(func, kwargs, *, threads, timeout):
    """Run ``func(**kwargs)`` in a fresh Python process.

    Used for peak-memory measurements, so that nothing allocated by earlier
    rows is counted or reused, and for runs that may need a time limit.

    Parameters
    ----------
    func : callable
        A module-level function (it is pickled by name); its return value
        must be picklable.
    kwargs : dict
    threads : int
        BLAS/OpenMP thread limit applied in the child with threadpoolctl.
    timeout : float
        Seconds to wait; the child is terminated after that.

    Returns
    -------
    value : object or dict
        What ``func`` returned; on timeout, ``{"peak_rss": bytes or None}``,
        the child's peak RSS (``VmHWM``) read just before stopping it.
    timed_out : bool

    Raises
    ------
    RuntimeError
        If ``func`` raised in the child (the message holds its traceback).
    """
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(child, func, kwargs, threads))
    process.start()
    child.close()
    try:
        if not parent.poll(timeout):
            peak = _status_value("VmHWM", pid=process.pid)
            process.terminate()
            process.join()
            return {"peak_rss": peak}, True
        status, value = parent.recv()
    except EOFError:
        process.join()  # the exit code (negative: the signal) is set once it is joined
        status, value = "error", f"the child process died (exit code {process.exitcode})"
    finally:
        process.join()
        parent.close()
    if status != "ok":
        raise RuntimeError(f"isolated run of {func.__name__} failed:\n{value}")
    return value, False


def usable_cores():
    """Number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
