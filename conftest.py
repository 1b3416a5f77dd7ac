"""Collection rules for optional dependencies: what needs PyTorch is skipped without it.

The ``test`` extra leaves PyTorch out (install the ``torch`` extra as well to run these).
``sklearn_linattn/nn.py`` and ``_torch_reader.py`` import torch at import time, and the
examples of the user guide's PyTorch page (``doc/torch.rst``) use it: without torch each of
these files is reported as one skipped collector instead of being imported or run, whether
the run collects it from its folder or names it on the command line (pytest collects files
named there even when ``pytest_ignore_collect`` says to ignore them, so the rule is on the
collectors).  Test modules that need torch skip themselves with ``pytest.importorskip``.
"""

import importlib.util
import os
from pathlib import Path

# scikit-learn's array API dispatch (the estimators' array API checks, the tests
# of tests/test_array_api.py) needs SciPy's array API support on, set before
# SciPy is first imported.
os.environ.setdefault("SCIPY_ARRAY_API", "1")

import pytest

try:
    _HAS_TORCH = importlib.util.find_spec("torch") is not None
except (ImportError, ValueError):  # torch blocked (sys.modules["torch"] is None, a finder)
    _HAS_TORCH = False

_HERE = Path(__file__).resolve().parent
_NEEDS_TORCH = {_HERE / "sklearn_linattn" / "nn.py", _HERE / "sklearn_linattn" / "_torch_reader.py",
                _HERE / "doc" / "torch.rst"}


class _NeedsTorch(pytest.File):
    """Stands for a file whose examples need PyTorch: collecting it skips."""

    def collect(self):
        pytest.skip(f"{self.path.name} needs PyTorch, which is not installed "
                    '(pip install -e ".[test,torch]")')


@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    """Without torch, one skipping collector in place of those of the files that need it."""
    outcome = yield
    if not _HAS_TORCH and outcome.get_result() and Path(file_path).resolve() in _NEEDS_TORCH:
        outcome.force_result([_NeedsTorch.from_parent(parent, path=Path(file_path))])


def pytest_configure(config):
    """Without a usable CUDA device, scikit-learn's array API checks do not try CUDA.

    They decide from ``torch.backends.cuda.is_built()`` alone: a CUDA build of
    PyTorch on a machine without a GPU driver (pip's default build) would
    fail every CUDA variant of ``check_array_api_input`` with a driver error,
    in the suite's ``parametrize_with_checks`` and in the user guide's
    ``check_estimator`` example alike.  On such a machine, for this test
    process, ``is_built()`` says what ``torch.cuda.is_available()`` says.
    """
    if not _HAS_TORCH:
        return
    import torch

    if torch.backends.cuda.is_built() and not torch.cuda.is_available():
        torch.backends.cuda.is_built = lambda: False
