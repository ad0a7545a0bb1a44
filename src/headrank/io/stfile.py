"""A local safetensors file read with ``pread`` instead of a memory map.

A memory-mapped file that another process truncates kills the reader with SIGBUS (exit 135, no
message) at the first page past the new end. Here every tensor is read with ``os.pread`` into
its own buffer, and the file's identity (device, inode, size, modification time) is compared
before and after each read: a file that shrank, grew or was rewritten underneath gives one line,
``FILE changed while it was read``, never a crash and never numbers from two versions of the
file. The header is checked by :func:`headrank.io.validate.safetensors_entries`, the same check
a remote header gets (overlapping tensors refused on both paths). The cost against safetensors'
own memory-mapped reader is measured in ``benchmarks/bench_stfile.py``.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from headrank.errors import HeadRankError
from headrank.io.identity import Stamp, changed, stamp_of
from headrank.io.tensor_source import ST_ITEMSIZE
from headrank.io.validate import JSON_CAPS, MAX_ST_HEADER, os_error, parse_json, safetensors_entries

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["BufferPool", "SafetensorsFile", "StampedFile", "changed", "reading_into"]


class _Slice:
    """What ``get_slice`` gives for metadata: dtype code and shape (safetensors' API)."""

    def __init__(self, dtype: str, shape: tuple[int, ...]):
        self._dtype, self._shape = dtype, shape

    def get_dtype(self) -> str:
        return self._dtype

    def get_shape(self) -> list[int]:
        return list(self._shape)


class StampedFile:
    """A file read with ``pread`` whose identity (device, inode, size, modification time) is
    checked after every read against the one it had when opened (module docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise os_error(e, self.path, "read the weights file") from None
        self._stamp = self._now()

    @property
    def size(self) -> int:
        return self._stamp[2]

    @property
    def stamp(self) -> Stamp:
        """The file's identity when it was opened (:mod:`headrank.io.identity`)."""
        return self._stamp

    def _now(self) -> Stamp:
        return stamp_of(os.fstat(self._fd))

    def pread(self, n: int | np.ndarray, at: int) -> bytearray | np.ndarray:
        """``n`` bytes at offset ``at``, read straight into a fresh buffer (one copy, from the page
        cache); ``n`` may instead be a buffer to fill (a 1-D uint8 numpy array, its length the
        count), which is returned filled. The file must be as it was when opened."""
        buf = bytearray(n) if isinstance(n, int) else n
        n = len(buf)
        view, got = memoryview(buf), 0
        try:
            while got < n:
                k = os.preadv(self._fd, [view[got:]], at + got)
                if k <= 0:
                    break
                got += k
        except OSError as e:
            raise os_error(e, self.path, "read") from None
        if got != n or self._now() != self._stamp:
            raise changed(self.path)
        return buf

    def close(self) -> None:
        fd, self._fd = getattr(self, "_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class SafetensorsFile(StampedFile):
    """``keys()``, ``get_tensor(name)`` and ``get_slice(name)`` of a safetensors file, each
    tensor read with one ``pread`` (module docstring). Opens one descriptor; :meth:`close`."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path)
        try:
            self._entries = self._header()
        except BaseException:
            self.close()
            raise

    def _header(self) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
        size = self.size
        if size < 8:
            raise HeadRankError(f"cannot read {self.path}: {size} bytes is too short for a safetensors file")
        n = int.from_bytes(self.pread(8, 0), "little")
        if n > size - 8:
            raise HeadRankError(f"cannot read {self.path}: corrupt safetensors header: it claims {n:,} bytes but "
                                f"the file holds {size:,}")
        if n > min(MAX_ST_HEADER, JSON_CAPS["safetensors header"]):
            raise HeadRankError(f"cannot read {self.path}: a safetensors header of {n:,} bytes exceeds the "
                                f"{JSON_CAPS['safetensors header'] >> 20} MiB a header may have")
        header = parse_json(self.pread(n, 8), "safetensors header", self.path)
        self._data = 8 + n
        return safetensors_entries(header, size - self._data, f"cannot read {self.path}")

    def keys(self) -> list[str]:
        return list(self._entries)

    def get_slice(self, name: str) -> _Slice:
        dtype, shape, _, _ = self._entries[name]
        return _Slice(dtype, shape)

    def get_tensor(self, name: str) -> torch.Tensor:
        import torch

        from headrank.io.tensor_source import ST_DTYPES

        dtype, shape, b, end = self._entries[name]
        if dtype not in ST_DTYPES:
            raise HeadRankError(f"tensor {name} in {self.path} has unsupported dtype {dtype!r}")
        if end == b:
            return torch.empty(shape, dtype=ST_DTYPES[dtype])
        buf = self.pread(end - b, self._data + b)
        return torch.frombuffer(buf, dtype=ST_DTYPES[dtype]).reshape(shape)

    def get_array(self, name: str) -> np.ndarray | None:
        """Tensor ``name`` as a numpy array, without torch: float64/32/16 as they are, bfloat16
        as its raw bits marked as such (:mod:`headrank.util.bf16`); None for a dtype numpy lacks
        (the caller reads it with :meth:`get_tensor`)."""
        import numpy as np

        dtype, shape, b, end = self._entries[name]
        if dtype not in _NP_DTYPES or sys.byteorder != "little":
            return None
        if end - b != math.prod(shape) * ST_ITEMSIZE[dtype]:
            raise HeadRankError(f"cannot read tensor {name!r} from {self.path}: its bytes {b}..{end} do not match "
                                f"its shape {list(shape)}")
        pool = getattr(_READING, "pool", None)
        raw = self.pread(end - b if pool is None else pool.take(end - b), self._data + b)
        arr = np.frombuffer(raw, dtype=_NP_DTYPES[dtype]).reshape(shape)
        if dtype == "BF16":
            from headrank.util.bf16 import mark

            return mark(arr)
        return arr


_NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # BF16: its raw 16 bits


class BufferPool:
    """Buffers for :meth:`SafetensorsFile.get_array`, each reused once nothing refers to it.

    A fresh buffer per tensor costs the kernel a page fault and a zeroed page for every 4 KiB
    before the read copies into it: on a 7B layer (128 MB) about 60 ms of system time, three
    times the copy itself (benchmarks/PROFILE.md). A buffer is free when the pool holds the
    only reference to it (every numpy view of it keeps it referenced as its ``base``), so a
    tensor still in use is never overwritten. At most ``max_bytes`` are kept; beyond that,
    buffers are allocated as before and freed with their arrays. Used by one reading thread at
    a time (:func:`reading_into`).
    """

    MIN_BYTES = 1 << 20  # smaller tensors: a fresh buffer (no page faults worth saving)

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._bufs: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray | int:
        """A uint8 buffer of ``n`` bytes nothing else refers to (or ``n``, for a fresh one)."""
        import numpy as np

        if n < self.MIN_BYTES:
            return n
        with self._lock:
            for buf in self._bufs:  # references: the list, ``buf``, getrefcount's argument
                if buf.nbytes == n and sys.getrefcount(buf) <= 3:
                    return buf
            buf = np.empty(n, dtype=np.uint8)
            if sum(b.nbytes for b in self._bufs) + n <= self.max_bytes:
                self._bufs.append(buf)
            return buf


_READING = threading.local()


@contextlib.contextmanager
def reading_into(pool: BufferPool | None) -> Iterator[None]:
    """Within the block, :meth:`SafetensorsFile.get_array` calls of this thread read into
    ``pool``'s buffers (a streaming scan's reader thread; None: fresh buffers)."""
    prev = getattr(_READING, "pool", None)
    _READING.pool = pool
    try:
        yield
    finally:
        _READING.pool = prev
