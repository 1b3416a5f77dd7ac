"""Hypothesis settings profiles for the test suite.

``ci`` (the default) is reproducible and quick: derandomized, no example
database, 25 examples per property.  ``dev`` explores more (200 random
examples per property).  Choose with the environment variable
``HYPOTHESIS_PROFILE``, e.g. ``HYPOTHESIS_PROFILE=dev pytest tests``.
"""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# Make tests/reference.py importable as ``reference`` whatever the rootdir
# and import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
