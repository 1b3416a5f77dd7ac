"""The checks of parameters (numbers, options, random states, decays), with the messages every
estimator shares, and :class:`FitParams`, a fit's parameters checked once.
"""

import numbers
import sys
import time
from dataclasses import dataclass

import numpy as np
from sklearn.utils import check_random_state

from ._validation import check_reading

__all__ = ["FitParams", "ProgressLog", "check_decays", "check_flag", "check_head_decays",
           "check_n_heads", "check_number", "check_option", "validate_random_state"]



def check_number(
    value,
    name,
    *,
    integer=False,
    low=None,
    high=None,
    low_open=False,
    high_open=False,
    allow_none=False,
):
    """Check one numeric parameter; the message names it, the range and the value.

    An int with ``integer=True`` (bools refused), else a finite float; ``low``, ``high`` bound
    it (None: unbounded; ``*_open`` excludes the bound); ``allow_none`` lets None through.
    """
    if low is not None and high is not None:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        expected = f"in {interval}"
    elif low is not None:
        expected = f"{'>' if low_open else '>='} {low}"
    elif high is not None:
        expected = f"{'<' if high_open else '<='} {high}"
    else:
        expected = ""
    expected = f"{'an integer' if integer else 'a real number'} {expected}".strip()
    if allow_none:
        if value is None:
            return None
        expected = f"None or {expected}"
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kind):
        raise TypeError(
            f"{name} must be {expected}; got {value!r} of type {type(value).__name__}."
        )
    if isinstance(value, numbers.Integral):
        # Python integers have no size limit (np.isfinite refuses the large
        # ones); as a real number one must fit in float64.
        ok = integer or abs(value) <= sys.float_info.max
    else:
        # Any real (fractions.Fraction too) as the float it is used as.
        try:
            ok = bool(np.isfinite(float(value)))
        except OverflowError:
            ok = False
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        raise ValueError(f"{name} must be {expected}; got {value!r}.")
    return int(value) if integer else float(value)


def validate_random_state(random_state, name="random_state"):
    """``sklearn.utils.check_random_state`` with errors that name the argument; a Generator's
    bit generator is shared, so drawing advances the caller's state.
    """
    expected = "None, an int in [0, 2**32 - 1], a numpy RandomState or a numpy Generator"
    if isinstance(random_state, np.random.Generator):
        return np.random.RandomState(random_state.bit_generator)
    is_int = isinstance(random_state, numbers.Integral) and not isinstance(
        random_state, (bool, np.bool_))
    if is_int and not 0 <= random_state < 2**32:
        raise ValueError(f"{name} must be {expected}; got {random_state!r}.")
    if random_state is None or is_int or isinstance(random_state, np.random.RandomState):
        return check_random_state(random_state)
    raise TypeError(
        f"{name} must be {expected}; got {random_state!r} of type "
        f"{type(random_state).__name__}."
    )


def check_option(value, name, options):
    """Check a parameter that takes one of a few strings; the message names it and them."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}.")
    return value


def check_decays(decay, name="decay"):
    """The fixed decays, each in (0, 1], as a tuple (None: no decay): one feature block per decay,
    in the order given, so a sequence's entries must differ.
    """
    if decay is None:
        return None
    if isinstance(decay, (numbers.Real, np.number)) and not isinstance(decay, (bool, np.bool_)):
        return (check_number(decay, name, low=0.0, high=1.0, low_open=True),)
    if isinstance(decay, (str, bytes)) or not hasattr(decay, "__len__"):
        raise TypeError(
            f"{name} must be None, a real number in (0, 1] or a sequence of them; got "
            f"{decay!r} of type {type(decay).__name__}.")
    values = np.asarray(decay, dtype=object).ravel() if np.ndim(decay) else None
    if values is None or np.ndim(decay) != 1 or values.size == 0:
        raise ValueError(
            f"{name} must be None, a real number in (0, 1] or a non-empty 1-d sequence of "
            f"them; got {decay!r}.")
    out = tuple(check_number(v.item() if isinstance(v, np.generic) else v, f"{name}[{i}]",
                             low=0.0, high=1.0, low_open=True) for i, v in enumerate(values))
    if len(set(out)) != len(out):
        raise ValueError(
            f"{name} must hold distinct decays (one feature block each); got {decay!r}.")
    return out


def check_head_decays(decays, n_heads, name="decays"):
    """The decay of every head, each in (0, 1], as a float64 array (n_heads,), or None."""
    if decays is None:
        return None
    try:
        arr = np.asarray(decays)
    except (TypeError, ValueError):  # ragged sequences
        arr = None
    if arr is not None and arr.ndim == 0:
        value = decays.item() if isinstance(decays, np.generic) else decays
        return np.full(int(n_heads), check_number(value, name, low=0.0, high=1.0,
                                                  low_open=True))
    if arr is None or arr.dtype.kind not in "iuf":  # bools and strings are not decays
        raise TypeError(
            f"{name} must be None, a real number in (0, 1] or an array of one per head; got "
            f"{decays!r}.")
    arr = arr.astype(np.float64)
    if arr.shape != (int(n_heads),):
        raise ValueError(
            f"{name} must have one decay per head, shape ({int(n_heads)},); got shape "
            f"{arr.shape}.")
    if not np.all((arr > 0) & (arr <= 1)):
        raise ValueError(f"{name} must hold real numbers in (0, 1]; got {arr.tolist()!r}.")
    return arr


def check_n_heads(n_heads):
    """None, "auto" or an integer >= 1; the error names the argument and the value."""
    expected = "None, 'auto' or an integer >= 1"
    if n_heads is None or (isinstance(n_heads, str) and n_heads == "auto"):
        return n_heads
    if isinstance(n_heads, str):
        raise ValueError(f"n_heads must be {expected}; got {n_heads!r}.")
    if isinstance(n_heads, (bool, np.bool_)) or not isinstance(n_heads, numbers.Integral):
        raise TypeError(
            f"n_heads must be {expected}; got {n_heads!r} of type {type(n_heads).__name__}."
        )
    if n_heads < 1:
        raise ValueError(f"n_heads must be {expected}; got {n_heads!r}.")
    return int(n_heads)


def check_head_dim(head_dim, n_heads, decays):
    """None, or an integer >= 1 with an integer ``n_heads`` and no decays."""
    if head_dim is None:
        return None
    head_dim = check_number(head_dim, "head_dim", integer=True, low=1)
    if not isinstance(n_heads, int):
        raise ValueError(
            "head_dim needs n_heads, the layer's number of heads, as an integer; got "
            f"n_heads={n_heads!r}.")
    if decays is not None:
        raise ValueError(
            "head_dim cannot be combined with decay: heads of a given dimension are fitted "
            f"for the plain layer only; got decay={decays!r}.")
    return head_dim


def check_flag(value, name):
    """A parameter that must be True or False (numpy bools too), as a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}.")
    return bool(value)


class ProgressLog:
    """The progress lines ``verbose`` asks for: a message and the seconds since the start."""

    def __init__(self, name, verbose):
        self.name = name
        self.verbose = verbose
        self.start = time.perf_counter()

    def __call__(self, message):
        if self.verbose:
            print(f"[{self.name}] {message} ({time.perf_counter() - self.start:.3f} s)")


@dataclass(frozen=True)
class FitParams:
    """A fit's parameters, each checked once; the fit reads these, not the estimator.

    ``alpha`` is None for a search (it checks its candidates), ``decays`` None for no decay.
    """

    readout: str
    layout: dict
    solver: str
    alpha: float | None
    n_heads: object
    decays: tuple | None
    tol: float
    max_iter: int | None
    random_state: object
    intercept: bool | None
    skip: bool | None
    log: ProgressLog
    n_blocks: int  # feature blocks, one per decay
    head_dim: int | None = None
    linear: bool | None = None
    alpha_linear: float | None = None

    @classmethod
    def checked(cls, estimator, *, solvers, alpha=True, decay=True, terms=True):
        """Check the fit parameters of ``estimator`` (its ``get_params`` names).

        ``solvers``: the solver names it accepts; ``alpha``, ``decay``, ``terms``: False when it
        has no such plain parameter (``intercept`` and ``skip`` are then None).
        """
        e = estimator
        readout, layout = check_reading(e.readout, e.token_dim, e.data_format)
        validate_random_state(e.random_state)
        penalty = check_number(e.alpha, "alpha", low=0.0) if alpha else None
        n_heads = check_n_heads(e.n_heads)
        decays = check_decays(e.decay) if decay else None
        check_option(e.solver, "solver", tuple(solvers))
        tol = check_number(e.tol, "tol", low=0.0, low_open=True)
        max_iter = check_number(e.max_iter, "max_iter", integer=True, low=1, allow_none=True)
        intercept = check_flag(e.fit_intercept, "fit_intercept") if terms else None
        skip = check_flag(e.fit_skip, "fit_skip") if terms else None
        linear = check_flag(e.fit_linear, "fit_linear") if terms else None
        alpha_linear = check_number(e.alpha_linear, "alpha_linear", low=0.0) if (
            terms and alpha) else None
        if linear and readout != "last":
            raise ValueError(
                f"fit_linear=True needs readout='last' (one linear term in the tokens of each "
                f"sequence); got readout={readout!r}.")
        head_dim = check_head_dim(getattr(e, "head_dim", None), n_heads, decays)
        return cls(readout=readout, layout=layout, solver=e.solver, alpha=penalty,
                   n_heads=n_heads, decays=decays, tol=tol, max_iter=max_iter,
                   random_state=e.random_state, intercept=intercept, skip=skip,
                   log=ProgressLog(type(e).__name__, e.verbose),
                   n_blocks=1 if decays is None else len(decays), head_dim=head_dim,
                   linear=linear, alpha_linear=alpha_linear)
