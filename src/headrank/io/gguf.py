"""GGUF files (llama.cpp, Ollama) as checkpoints: sizes from the file's own metadata.

A GGUF file carries its configuration: ``general.architecture`` names the architecture and
``{arch}.block_count``, ``{arch}.embedding_length``, ``{arch}.attention.head_count``,
``head_count_kv``, ``key_length`` / ``value_length`` give the sizes. The architectures in
:data:`ARCHS` store attention as ``blk.{i}.attn_q / attn_k / attn_v / attn_output`` or a fused
``blk.{i}.attn_qkv`` whose rows are ``[q | k | v]`` (llama.cpp's converter reorders GPT-NeoX's,
BLOOM's and Falcon's per-head layouts into that order), all in ``nn.Linear`` orientation
(``out, in``; GPT-2's Conv1D weights are transposed by the converter).

Tensors are read one at a time from the memory-mapped file and dequantized with the ``gguf``
package (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, ... every type it can
dequantize): the spectra are those of the dequantized weights. A type it cannot dequantize is
refused before any work.

llama.cpp's converter permutes the rows inside every Q and K head of ``llama`` models (its
rotary implementation rotates adjacent pairs where Hugging Face rotates the two halves). The
same permutation Π acts on W_Q,h and W_K,h, so ``W_Kᵀ Πᵀ Π W_Q = W_Kᵀ W_Q``: QK spectra do not
change (tests/io/test_gguf.py checks it); the reader undoes it anyway, so row norms per head
dimension line up with the Hugging Face checkpoint.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headrank.errors import HeadRankError, one_line
from headrank.io.layouts import Dims, Layout, NormSpec
from headrank.io.tensor_source import BaseCheckpoint, TensorMeta
from headrank.io.validate import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_WIDTH,
    as_int,
    check_readable,
    is_regular_file,
)


@dataclass(frozen=True)
class Arch:
    """What the metadata does not say about a llama.cpp architecture."""

    position: str  # absolute | rotary | alibi
    norm: str  # layernorm | rmsnorm (the attn_norm in front of attention)
    rotary_permuted: bool = False  # the converter permuted Q/K rows (llama)


ARCHS: dict[str, Arch] = {
    "llama": Arch("rotary", "rmsnorm", rotary_permuted=True),
    "qwen2": Arch("rotary", "rmsnorm"),
    "qwen3": Arch("rotary", "rmsnorm"),
    "gemma": Arch("rotary", "rmsnorm"),  # the converter stores Gemma's 1 + w
    "gemma2": Arch("rotary", "rmsnorm"),
    "gemma3": Arch("rotary", "rmsnorm"),
    "phi3": Arch("rotary", "rmsnorm"),
    "phi2": Arch("rotary", "layernorm"),
    "falcon": Arch("rotary", "layernorm"),
    "gpt2": Arch("absolute", "layernorm"),
    "starcoder": Arch("absolute", "layernorm"),
    "starcoder2": Arch("rotary", "layernorm"),
    "gptneox": Arch("rotary", "layernorm"),
    "bloom": Arch("alibi", "layernorm"),
    "stablelm": Arch("rotary", "layernorm"),
}
# architectures the test suite writes and reads back (README lists these)
TESTED = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "falcon", "gpt2", "starcoder2")
_SEPARATE = {"q": "blk.{i}.attn_q.weight", "k": "blk.{i}.attn_k.weight", "v": "blk.{i}.attn_v.weight",
             "o": "blk.{i}.attn_output.weight"}
_FUSED = {"qkv": "blk.{i}.attn_qkv.weight", "o": "blk.{i}.attn_output.weight"}


def is_gguf(path: str | os.PathLike) -> bool:
    """A ``.gguf`` file name, or a file that starts with the GGUF magic."""
    p = Path(path)
    if p.suffix.lower() == ".gguf":
        return True
    if not is_regular_file(p):  # never open a FIFO or a device to sniff it
        return False
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def dequantizable() -> set[str]:
    """Names of the GGML types the installed ``gguf`` package can turn into floats."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits

    ok = {t.name for t in _type_traits} | {"F32", "F16", "F64"}
    return {t.name for t in GGMLQuantizationType if t.name in ok}


class GGUFCheckpoint(BaseCheckpoint):
    """A checkpoint over a GGUF file: ``config`` from its metadata, tensors dequantized to
    float32 (F64 kept) one at a time; :attr:`layout` is the matching :class:`Layout`.

    ``source``: the file parsed. ``label`` (default: ``source``) and ``where`` (default: the
    file) name it for ``source``/``path`` and in messages (a remote reader parses a local copy
    of the header but names the URL)."""

    def __init__(self, source: str | os.PathLike, *, label: str | None = None, where: str | Path | None = None):
        try:
            from gguf import GGUFReader
        except ImportError:
            raise HeadRankError("reading GGUF files needs the package gguf (pip install gguf)") from None
        from headrank.io.stfile import StampedFile

        p = check_readable(source, "GGUF file")
        self._file = StampedFile(p)  # tensor data read with pread: a file truncated meanwhile is one line
        check_structure(p)  # counts, lengths and header size bounded before gguf allocates anything
        try:
            self._reader = GGUFReader(p)
        except MemoryError:
            raise HeadRankError(f"cannot read GGUF file {p}: its header needs more memory than this machine "
                                "has") from None
        except Exception as e:  # bad magic, version, truncated header, bad alignment
            raise HeadRankError(f"cannot read GGUF file {p}: {one_line(e, 200)}"
                                ) from None
        self._where = where if where is not None else p
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.arch_name = str(self._field("general.architecture"))[:100]
        self.arch = ARCHS.get(self.arch_name)
        if self.arch is None:
            raise HeadRankError(f"{self._where}: GGUF architecture {self.arch_name!r} is not supported; supported: "
                                f"{', '.join(sorted(ARCHS))}")
        self.dims = self._dims()
        config = {"model_type": f"gguf:{self.arch_name}", "gguf_architecture": self.arch_name,
                  "name": self._field("general.name", None), **_dims_dict(self.dims)}
        rope = {"rope_theta": self._field(f"{self.arch_name}.rope.freq_base", None),  # for the rotary bands
                "rotary_dim": self._field(f"{self.arch_name}.rope.dimension_count", None)}
        config.update({k: v for k, v in rope.items() if v is not None})
        self.layout = self._layout()
        self._check_types()
        super().__init__(self._tensors, source=label if label is not None else str(source), path=self._where,
                         config=config, config_path=self._where)

    # -- metadata ----------------------------------------------------------------------------
    def _field(self, key: str, default: Any = ...) -> Any:
        f = self._reader.get_field(key)
        if f is None:
            if default is ...:
                raise HeadRankError(f"{self._where}: GGUF metadata lacks {key}")
            return default
        try:
            value = f.contents()
        except (UnicodeDecodeError, ValueError, IndexError, TypeError) as e:
            raise HeadRankError(f"{self._where}: cannot read GGUF metadata {key}: {one_line(e, 200)}"
                                ) from None
        if isinstance(value, list):
            if not value or len(set(value)) != 1:
                raise HeadRankError(f"{self._where}: {key} varies per layer ({value[:4]}...): not supported")
            value = value[0]
        return value

    def _dims(self) -> Dims:
        a, where = self.arch_name, f"{self._where}"

        def size(key: str, hi: int, default: Any = ...) -> int | None:
            v = self._field(key, default)
            return None if v is None else as_int(v, key, where, hi=hi)

        d = size(f"{a}.embedding_length", MAX_WIDTH)
        H = size(f"{a}.attention.head_count", MAX_HEADS)
        Hkv = size(f"{a}.attention.head_count_kv", MAX_HEADS, H)
        dk = size(f"{a}.attention.key_length", MAX_HEAD_DIM, None)
        dv = size(f"{a}.attention.value_length", MAX_HEAD_DIM, None)
        if dk is not None and dv is not None and dk != dv:
            raise HeadRankError(f"{self._where}: key length {dk} differs from value length {dv}: not supported")
        dh = dk if dk is not None else dv if dv is not None else max(d // H, 1)
        try:
            return Dims(size(f"{a}.block_count", MAX_LAYERS), d, H, Hkv, dh)
        except HeadRankError as e:
            raise HeadRankError(f"{self._where}: {e}") from None

    def _layout(self) -> Layout:
        fused = "blk.0.attn_qkv.weight" in self._tensors
        tensors = _FUSED if fused else _SEPARATE
        missing = [t.format(i=0) for t in tensors.values() if t.format(i=0) not in self._tensors]
        if missing:
            raise HeadRankError(f"{self._where}: no attention tensor {missing[0]} (architecture {self.arch_name!r})")
        dims, arch = self.dims, self.arch
        qk_norm = "blk.0.attn_q_norm.weight" in self._tensors
        norm = NormSpec("blk.{i}.attn_norm.weight", arch.norm) if "blk.0.attn_norm.weight" in self._tensors else None
        return Layout(model_types=(f"gguf:{self.arch_name}",), tensors=dict(tensors), dims=lambda c: dims,
                      split="fused" if fused else "separate",
                      biases=tuple(t.replace(".weight", ".bias") for t in tensors.values()),
                      position=lambda c: arch.position, qk_norm=lambda c: qk_norm, norm=lambda c: norm)

    def _check_types(self) -> None:
        ok = dequantizable()
        for i in range(self.dims.n_layers):
            for t in self.layout.tensors.values():
                name = t.format(i=i)
                if name not in self._tensors:
                    raise HeadRankError(f"{self._where}: no attention tensor {name}")
                kind = self._tensors[name].tensor_type.name
                if kind not in ok:
                    raise HeadRankError(f"{self._where}: tensor {name} has quantization type {kind}, which the "
                                        f"installed gguf package cannot dequantize")

    def quant_types(self) -> dict[str, int]:
        """How many attention tensors of each GGML type the file holds."""
        return dict(Counter(self._tensors[t.format(i=i)].tensor_type.name
                            for i in range(self.dims.n_layers) for t in self.layout.tensors.values()))

    # -- access ------------------------------------------------------------------------------
    def _read(self, name: str, t: Any) -> torch.Tensor:
        """Dequantize one tensor to float32 (llama's Q/K rows back in Hugging Face order)."""
        import numpy as np
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        data = self._tensor_data(t)
        try:
            if t.tensor_type == GGMLQuantizationType.F64:
                arr = np.array(data, dtype=np.float64)
            elif t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                arr = np.array(data, dtype=np.float32)
            else:
                arr = np.ascontiguousarray(dequantize(data, t.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise HeadRankError(f"{self._where}: cannot dequantize {name} ({t.tensor_type.name})") from None
        except Exception as e:  # truncated data
            raise HeadRankError(f"cannot read tensor {name!r} from {self._where}: {one_line(e, 200)}"
                                ) from None
        w = torch.from_numpy(arr)
        if self.arch.rotary_permuted and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = self.dims.n_heads if name.endswith(".attn_q.weight") else self.dims.n_kv_heads
            w = unpermute_rotary(w, heads, f"{name} in {self._where}")
        return w

    def _tensor_data(self, t: Any) -> Any:
        """A tensor's stored bytes, read with ``pread`` (never through the reader's memory map,
        which a truncated file turns into SIGBUS), in the shape of the gguf reader's array (a
        remote reader fetches them)."""
        import numpy as np

        if self._file.size != self._file._now()[2] or t.data_offset + t.n_bytes > self._file.size:
            from headrank.io.stfile import changed

            raise changed(self._where)
        buf = self._file.pread(int(t.n_bytes), int(t.data_offset))
        return np.frombuffer(buf, dtype=t.data.dtype).reshape(t.data.shape)

    def _meta(self, name: str, t: Any) -> TensorMeta:
        # the gguf reader lists dimensions innermost first (ggml's ne); torch's order is the reverse
        return TensorMeta(t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)), int(t.n_bytes),
                          Path(str(self.files[0])).name)

    @property
    def files(self) -> list[Any]:
        return [self._where]

    def close(self) -> None:
        self._tensors.clear()  # the reader's memory maps go with its tensors
        self._file.close()


def permute_rotary(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter permutation of Q/K rows (``convert_hf_to_gguf.py``'s ``permute``):
    inside each head, rows ``[first half | second half]`` become interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_rotary(w: torch.Tensor, heads: int, name: str = "a Q/K tensor") -> torch.Tensor:
    """The inverse of :func:`permute_rotary`; the shape is checked first (a matrix whose rows
    are ``heads`` heads of an even head dimension), one line naming ``name`` otherwise."""
    if w.ndim != 2 or heads < 1 or w.shape[0] % (2 * heads) != 0:
        raise HeadRankError(f"GGUF tensor {name} has shape {tuple(w.shape)}: its rows cannot be {heads} rotary "
                            f"heads of an even head dimension (corrupt file or metadata)")
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -- structure, checked before the gguf package reads the file ----------------------------------
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


def gguf_origin(ckpt: GGUFCheckpoint) -> dict[str, Any]:
    """What meta.json says about a GGUF source."""
    return {
        "input": "gguf",
        "gguf": {
            "architecture": ckpt.arch_name,
            "name": ckpt.config.get("name"),
            "quantization_types": ckpt.quant_types(),
            "dequantized": "spectra of the dequantized weights (gguf package), float32",
            "rotary_rows": ("llama.cpp's per-head Q/K row permutation undone (QK products are invariant to it)"
                            if ckpt.arch.rotary_permuted else "not permuted by the converter"),
        },
    }


def _dims_dict(d: Dims) -> dict[str, int]:
    return {"n_layers": d.n_layers, "d_model": d.d, "n_heads": d.n_heads, "n_kv_heads": d.n_kv_heads,
            "head_dim": d.head_dim}
