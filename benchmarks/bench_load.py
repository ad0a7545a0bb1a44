"""Helpers shared by the benchmarks: one concurrent CPU-bound process, and the load average."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

BUSY = "import time\nx = 0\nwhile True:\n    x = (x * 1103515245 + 12345) % 2147483648\n"


@contextlib.contextmanager
def cpu_load(on: bool | int = True) -> Iterator[subprocess.Popen | None]:
    """Run ``on`` CPU-bound processes (True: one; each a pure-Python loop, one core) for the
    duration; ends them after. Yields the first (None when there are none)."""
    n = int(on)
    if n <= 0:
        yield None
        return
    ps = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n)]
    try:
        yield ps[0]
    finally:
        for p in ps:
            p.kill()
            p.wait()


def load_avg() -> str:
    """``uptime``'s three load averages, e.g. '7.62 4.75 2.45'."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
