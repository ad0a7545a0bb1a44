"""The structure of a GGUF file's header, checked before the ``gguf`` package reads it.

The gguf package's reader trusts every count and length a file declares (it loops past the end of
a 120-byte file that declares 2^62 values). :func:`check_structure` walks the header, metadata
and tensor infos with each count and length bounded by the bytes left and by caps far above
released models, and refuses what breaks them with one line, before anything is allocated.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType
_STRING, _ARRAY = 8, 9
GGML_MAX_DIMS = 4
# caps on a header, far above released models (llama 3: 29 metadata keys, 128k tokens + 280k merges,
# about 10 MB of header; the largest MoE files: a few thousand tensors); the gguf package's reader
# allocates a few hundred bytes of Python objects per entry and per array element
MAX_GGUF_KEYS = 1 << 14  # metadata entries
MAX_GGUF_TENSORS = 1 << 17
MAX_GGUF_ITEMS = 1 << 20  # array elements over all metadata arrays (Gemma 3: 786k)
ITEM_COST = 1600  # bytes gguf.GGUFReader allocates per metadata entry or array element (measured: 1.5 KB
# per string, 0.7 KB per number)
MAX_GGUF_HEADER = 64 << 20  # bytes of magic, metadata and tensor infos
_UTF8_KEYS = ("general.architecture", "general.name")


class TooLarge(HeadRankError):
    """A GGUF header beyond the caps (:data:`MAX_GGUF_KEYS` …): refused whatever follows."""


class _Walk:
    """A bounds-checked walk over a GGUF file's header, metadata and tensor infos: every count
    and length is checked against the bytes left before anything is read or allocated (the
    gguf package's reader loops past the end of a 120-byte file that declares 2^62 values)."""

    def __init__(self, buf: Any, path: Path):
        self.buf, self.path, self.pos, self.fmt = buf, path, 0, "<"
        self.items = self.keys = self.tensors = 0

    def cap(self, count: int, most: int, what: str) -> None:
        if count > most:
            raise TooLarge(f"cannot read GGUF file {self.path}: {what} ({count:,}) exceed the {most:,} a "
                           "GGUF header may hold here")

    def fail(self, what: str) -> HeadRankError:
        return HeadRankError(f"cannot read GGUF file {self.path}: {what} (truncated or corrupt)")

    def need(self, n: int, what: str) -> int:
        left = len(self.buf) - self.pos
        if n > left:
            raise self.fail(f"{what} at byte {self.pos} needs {n} bytes, {left} left")
        start, self.pos = self.pos, self.pos + n
        return start

    def num(self, code: str, what: str) -> int:
        import struct

        return struct.unpack_from(self.fmt + code, self.buf, self.need(struct.calcsize(code), what))[0]

    def string(self, what: str) -> bytes:
        n = self.num("Q", f"the length of {what}")
        start = self.need(n, what)
        return bytes(self.buf[start:start + n])

    def value(self, vtype: int, what: str, depth: int = 0) -> bytes | None:
        if vtype in _SCALAR_SIZES:
            self.need(_SCALAR_SIZES[vtype], what)
        elif vtype == _STRING:
            return self.string(what)
        elif vtype == _ARRAY and depth < 2:
            etype, count = self.num("I", f"the type of {what}"), self.num("Q", f"the count of {what}")
            self.items += count
            if self.items > MAX_GGUF_ITEMS:
                raise TooLarge(f"cannot read GGUF file {self.path}: {what} declares {count} values; a GGUF header may "
                               f"hold at most {MAX_GGUF_ITEMS:,} array elements here")
            least = _SCALAR_SIZES.get(etype, 8 if etype == _STRING else 12 if etype == _ARRAY else None)
            if least is None:
                raise self.fail(f"{what} is an array of unknown value type {etype}")
            left = len(self.buf) - self.pos
            if count * least > left:
                raise self.fail(f"{what} declares {count} values of at least {least} bytes; {left} bytes are left")
            if etype in _SCALAR_SIZES:
                self.need(count * least, what)
            else:
                for _ in range(count):
                    self.value(etype, what, depth + 1)
        else:
            raise self.fail(f"{what} has unknown value type {vtype}")
        return None

    def run(self) -> None:
        if bytes(self.buf[0:4]) != b"GGUF":
            raise self.fail("no GGUF magic")
        self.need(4, "the magic")
        version = self.num("I", "the version")
        if version & 0xFFFF == 0:  # written on a machine of the other byte order
            self.fmt, self.pos = ">", self.pos - 4
            version = self.num("I", "the version")
        if version not in (2, 3):
            return  # the gguf package names the versions it reads
        n_tensors, n_kv = self.num("Q", "the tensor count"), self.num("Q", "the metadata count")
        if n_kv > MAX_GGUF_KEYS or n_tensors > MAX_GGUF_TENSORS:
            raise TooLarge(f"cannot read GGUF file {self.path}: {n_kv} metadata entries and {n_tensors} tensors cannot "
                           f"fit in a GGUF header here (a GGUF header may hold at most {MAX_GGUF_KEYS:,} entries and "
                           f"{MAX_GGUF_TENSORS:,} tensors)")
        self.keys, self.tensors = n_kv, n_tensors
        left = len(self.buf) - self.pos
        if n_kv * 13 > left or n_tensors * 24 > left:
            raise self.fail(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in {left} bytes")
        for k in range(n_kv):
            self.past(f"metadata entry {k}")
            key = self.string(f"metadata key {k}")
            name = key.decode("utf-8", "replace")[:80]
            v = self.value(self.num("I", f"the type of {name}"), f"metadata {name}")
            _utf8(key, f"key {k} ({name})", self)
            if name in _UTF8_KEYS and v is not None:
                _utf8(v, name, self)
        for k in range(n_tensors):
            self.past(f"tensor info {k}")
            name = self.string(f"the name of tensor {k}").decode("utf-8", "replace")[:80]
            ndim = self.num("I", f"the dimension count of tensor {name}")
            if not 1 <= ndim <= GGML_MAX_DIMS:
                raise self.fail(f"tensor {name} has {ndim} dimensions (GGUF allows 1 to {GGML_MAX_DIMS})")
            dims = [self.num("Q", f"the shape of tensor {name}") for _ in range(ndim)]
            if any(d < 1 or d > 1 << 40 for d in dims):
                raise self.fail(f"tensor {name} has shape {dims}")
            self.num("I", f"the type of tensor {name}")
            self.num("Q", f"the offset of tensor {name}")
        self.cap(self.pos, MAX_GGUF_HEADER, "its header bytes")

    def past(self, what: str) -> None:
        """Stop a walk whose header already runs past :data:`MAX_GGUF_HEADER`."""
        self.cap(self.pos, MAX_GGUF_HEADER, f"its header bytes (at {what})")


def _utf8(text: bytes, key: str, walk: _Walk) -> None:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise walk.fail(f"metadata {key} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def check_structure(path: Path) -> None:
    """Refuse a GGUF file whose metadata or tensor infos run past its end, declare counts or
    lengths its bytes cannot hold, or hold ``general.architecture``/``general.name`` (or any key)
    that is not UTF-8 — one line each, before the gguf package allocates anything."""
    import mmap

    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size < 8:
                raise HeadRankError(f"cannot read GGUF file {path}: {os.fstat(fh.fileno()).st_size} bytes is "
                                    "too short for a GGUF header")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                walk = _Walk(buf, path)
                walk.run()
    except OSError as e:
        raise HeadRankError(f"cannot read GGUF file {path}: {e.strerror or e}") from None
    from headrank.io.validate import memory_available

    cost, have = ITEM_COST * (walk.items + walk.keys + walk.tensors), memory_available() // 2
    if cost > have:
        raise TooLarge(f"cannot read GGUF file {path}: reading its header ({walk.keys:,} entries, {walk.items:,} "
                       f"array elements, {walk.tensors:,} tensors) would take about {cost / (1 << 30):.3g} GiB of "
                       f"memory; {have / (1 << 30):.3g} GiB may be used")
