"""Give freed heap memory back to the operating system between layers; pause the garbage
collector during a large import (:func:`gc_paused`).

glibc raises its mmap threshold after large blocks are freed (up to 32 MiB), so the many
float64 temporaries of a layer (a few MiB each) end up in heap arenas, and a long stream of
layers keeps growing the resident set although nothing is live: measured on the 80-layer
70B-shaped checkpoint, 1.8 GiB of anonymous memory after 40 layers, 0.3 GiB with a trim per
layer (benchmarks/PROFILE.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
from collections.abc import Iterator


@functools.cache
def _malloc_trim():
    try:  # the process's own symbols, the C library's among them (find_library runs ldconfig -p)
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def trim_heap() -> bool:
    """``malloc_trim(0)`` where the C library has it; True when it ran."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block; what it allocated is then frozen.

    For a large import in a short process (torch, pandas: about a million objects). Collections
    while they are created took 0.2–0.3 s of a 1.4–1.7 s import here, and every later full
    collection would walk them again; ``gc.freeze()`` moves them out of the collector's sight
    (they are never freed anyway). Collection is back on after the block.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
