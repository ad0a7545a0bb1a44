"""The environment record: the platform string is platform.platform()'s, without its subprocess."""

from __future__ import annotations

import platform
import subprocess
import sys

from headrank.util.env import _platform

FRESH = """
import subprocess
def refuse(*a, **k):
    raise AssertionError("a subprocess was started")
subprocess.Popen = refuse
from headrank.util.env import versions
print(versions()["platform"])
"""


def test_platform_text_equals_the_standard_librarys():
    assert _platform() == platform.platform()


def test_platform_text_starts_no_subprocess():
    """In a fresh interpreter (platform caches what it ran): no subprocess on the way."""
    r = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == platform.platform()
