"""bfloat16 without torch: a tensor's raw 16-bit patterns in a numpy array, marked as such.

numpy has no bfloat16 dtype. A bfloat16 is the upper half of a float32, so its value is exactly
the float32 whose high 16 bits are the stored ones and whose low 16 bits are zero:
:func:`to_float32` is a shift, exact for every value (NaN and ±Inf included). The checkpoint
reader returns bfloat16 tensors as :class:`BF16Bits` views of its memory map (no copy), and the
float64 upcast (:func:`headrank.core.linalg.factor_roots`) shifts them a chunk at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class BF16Bits(np.ndarray):
    """A uint16 array holding bfloat16 bit patterns. Reshapes, transposes, slices and repeats
    keep the mark; convert with :func:`to_float32` (or :func:`as_float`) before any arithmetic."""


def mark(bits: np.ndarray) -> BF16Bits:
    """``bits`` (uint16) marked as bfloat16 patterns (a view, no copy)."""
    if bits.dtype != np.uint16:
        raise TypeError(f"bfloat16 bits must be uint16, got {bits.dtype}")
    return bits.view(BF16Bits)


def to_float32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The float32 values of bfloat16 patterns ``x`` (same shape), exactly; into ``out``
    (uint32 or float32, C-contiguous, ``x``'s shape) when given."""
    src = np.asarray(x).view(np.uint16) if isinstance(x, BF16Bits) else np.asarray(x, dtype=np.uint16)
    if out is None:
        return np.left_shift(src, np.uint32(16), dtype=np.uint32).view(np.float32)
    np.left_shift(src, np.uint32(16), out=out.view(np.uint32))
    return out.view(np.float32)


def as_float(x: Any, dtype: Any = np.float64) -> Any:
    """``x`` as a floating numpy array of ``dtype``: bfloat16 patterns converted exactly, any
    other array cast; a torch tensor is left to its caller (returned unchanged)."""
    if type(x).__module__.startswith("torch"):
        return x
    if isinstance(x, BF16Bits):
        return to_float32(x).astype(dtype, copy=False)
    return np.asarray(x, dtype=dtype)
