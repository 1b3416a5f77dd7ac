"""Collection rules for optional dependencies: what needs PyTorch is skipped without it.

``sklearn_linattn/nn.py`` and ``_torch_reader.py`` import torch at import time, so without torch its
doctests (and the user guide's PyTorch page) are not collected at all, even
when named on the command line.  ``tests/test_torch.py`` skips itself with
``pytest.importorskip``.
"""

import importlib.util
from pathlib import Path

try:
    _HAS_TORCH = importlib.util.find_spec("torch") is not None
except (ImportError, ValueError):  # torch blocked (sys.modules["torch"] is None, a finder)
    _HAS_TORCH = False

_HERE = Path(__file__).resolve().parent
_NEEDS_TORCH = {_HERE / "sklearn_linattn" / "nn.py", _HERE / "sklearn_linattn" / "_torch_reader.py",
                _HERE / "doc" / "torch.rst"}


def pytest_ignore_collect(collection_path, config):
    """Without torch, leave out the files whose examples need it (None: pytest decides)."""
    if not _HAS_TORCH and Path(collection_path).resolve() in _NEEDS_TORCH:
        return True
    return None
