"""Programs as linear attention: compile lookup programs into MHLA weights (user guide: programs)."""

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
