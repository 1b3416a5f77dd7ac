"""Programs as linear attention: compile lookup programs into MHLA weights.

A token is an object with attributes; each attribute takes values in its own
finite alphabet and occupies a one-hot block of the token vector (an absent
attribute is an all-zero block).  A *lookup* is one attention head: the last
token's ``query`` attribute, mapped by a fixed table, selects every token
whose ``key`` attribute has the mapped value, and their ``value`` attributes,
mapped by a second table, are written into the ``dest`` attribute of the
output (the paper's Appendices B and F).  With ``Q_h`` holding
the first table between the query block (columns) and the key block (rows)
and ``V_h`` the second between the value block (columns) and the destination
block (rows), the head's output

    V_h sum_t x_t (x_t^T Q_h x_last)

is exactly that sum.  Run autoregressively -- append the output, rounded to
the nearest token, and repeat -- a handful of such heads executes finite
automata: :func:`dfa_executor_program` writes the computation history of any
automaton within its bounds, given its transition table and word as tokens.

Everything compiles to plain ``(V, Q)`` arrays, so the programs' traces can be
learned back with :class:`~sklearn_linattn.LinearAttentionRegressor` and the
learned model checked with its certificate's ``covers``.

Mapping to the paper: ``X[i]`` (n_tokens x d) is the paper's ``Z_i^T``.
"""

from ._automata import (
    DFAExecutor,
    associative_memory_program,
    dfa_executor_program,
    dfa_transition_program,
    run_dfa,
)
from ._compiler import CompiledProgram, Program
from ._traces import next_token_dataset
from ._turing import TuringMachineSimulator, run_turing_machine, turing_machine_program

# Constants that callers build tokens with, importable from here although
# __all__ has never listed them.
from ._compiler import POSITION  # noqa: F401
from ._turing import MOVES  # noqa: F401

__all__ = [
    "CompiledProgram",
    "DFAExecutor",
    "Program",
    "associative_memory_program",
    "dfa_executor_program",
    "dfa_transition_program",
    "TuringMachineSimulator",
    "next_token_dataset",
    "run_dfa",
    "run_turing_machine",
    "turing_machine_program",
]
