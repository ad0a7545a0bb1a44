"""Hypothesis profiles for the fuzz suite.

``default`` (``make test``): few examples, derandomized (the same inputs every run), no example
database. ``fuzz`` (``make fuzz``, ``--hypothesis-profile=fuzz``): many more examples, random,
failures kept in a database under the system's temporary directory.
"""

import os
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                     HealthCheck.data_too_large])
settings.register_profile("default", max_examples=int(os.environ.get("HEADRANK_FUZZ_EXAMPLES", "25")),
                          derandomize=True, database=None, **_COMMON)
settings.register_profile("fuzz", max_examples=int(os.environ.get("HEADRANK_FUZZ_EXAMPLES", "400")),
                          database=DirectoryBasedExampleDatabase(
                              os.path.join(tempfile.gettempdir(), "headrank-hypothesis")), **_COMMON)
settings.load_profile("default")
