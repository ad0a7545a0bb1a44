"""Give freed heap memory back to the operating system between layers.

glibc raises its mmap threshold after large blocks are freed (up to 32 MiB), so the many
float64 temporaries of a layer (a few MiB each) end up in heap arenas, and a long stream of
layers keeps growing the resident set although nothing is live: measured on the 80-layer
70B-shaped checkpoint, 1.8 GiB of anonymous memory after 40 layers, 0.3 GiB with a trim per
layer (benchmarks/PROFILE.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def trim_heap() -> bool:
    """``malloc_trim(0)`` where the C library has it; True when it ran."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
