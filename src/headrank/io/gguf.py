"""GGUF files (llama.cpp, Ollama) as checkpoints: sizes from the file's own metadata.

A GGUF file carries its configuration: ``general.architecture`` names the architecture and
``{arch}.block_count``, ``{arch}.embedding_length``, ``{arch}.attention.head_count``,
``head_count_kv``, ``key_length`` / ``value_length`` give the sizes. The architectures in
:data:`ARCHS` store attention as ``blk.{i}.attn_q / attn_k / attn_v / attn_output`` or a fused
``blk.{i}.attn_qkv`` whose rows are ``[q | k | v]`` (llama.cpp's converter reorders GPT-NeoX's,
BLOOM's and Falcon's per-head layouts into that order), all in ``nn.Linear`` orientation
(``out, in``; GPT-2's Conv1D weights are transposed by the converter). Mixtures of experts
(``qwen2moe``, ``qwen3moe``, ``gpt-oss``, ``minimax-m2``) keep dense attention under those names;
gpt-oss adds a per-head sink logit (``attn_sinks``) and alternating sliding windows, which change
the softmax and its mask, not the bilinear score, so its products are those of the same tensors.

``deepseek2`` (DeepSeek-V2/V3/R1, Kimi-K2) is multi-head latent attention, measured in latent
space as ``docs/mla.md`` defines it: W_Q,h from ``attn_q_b`` (``attn_q`` without a query latent),
W_K,h and W_V,h from ``attn_kv_b``, P_h from ``attn_output``; the latent sizes come from
``attention.kv_lora_rank``, ``q_lora_rank``, ``rope.dimension_count`` and
``key_length_mla``/``value_length_mla`` (files before llama.cpp's MLA cache give ``key_length``
and ``value_length`` per head instead). Newer converters store ``attn_kv_b`` split: ``attn_k_b``
(per head ``W_UK,h`` transposed, ``(H, kv_lora_rank, qk_nope_head_dim)``) and ``attn_v_b``
(``(H, v_head_dim, kv_lora_rank)``); the reader joins them back into ``attn_kv_b``'s rows, the same
values in Hugging Face's ``kv_b_proj`` order.

Tensors are read one at a time from the memory-mapped file and dequantized with the ``gguf``
package (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, ... every type it can
dequantize): the spectra are those of the dequantized weights. A type it cannot dequantize is
refused before any work.

llama.cpp's converter permutes the rows inside every Q and K head of ``llama`` models (its
rotary implementation rotates adjacent pairs where Hugging Face rotates the two halves). The
same permutation Π acts on W_Q,h and W_K,h, so ``W_Kᵀ Πᵀ Π W_Q = W_Kᵀ W_Q``: QK spectra do not
change (tests/io/test_gguf.py checks it); the reader undoes it anyway, so row norms per head
dimension line up with the Hugging Face checkpoint. The other architectures here are stored
unpermuted (their llama.cpp rotary pairs the dimensions as Hugging Face does; DeepSeek's rotary
part is interleaved in the released weights themselves).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headrank.errors import HeadRankError, one_line
from headrank.io.gguf_header import check_structure
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

    position: str  # absolute | rotary | alibi | rotary (decoupled, MLA)
    norm: str  # layernorm | rmsnorm (the attn_norm in front of attention)
    rotary_permuted: bool = False  # the converter permuted Q/K rows (llama)
    mla: bool = False  # multi-head latent attention (deepseek2)


MLA_POSITION = "rotary (decoupled, MLA)"  # as the generated MLA rows say (docs/mla.md)
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
    "qwen2moe": Arch("rotary", "rmsnorm"),
    "qwen3moe": Arch("rotary", "rmsnorm"),
    "gpt-oss": Arch("rotary", "rmsnorm"),
    "minimax-m2": Arch("rotary", "rmsnorm"),
    "nemotron": Arch("rotary", "layernorm"),  # the converter stores LayerNorm1P's 1 + w
    "deepseek2": Arch(MLA_POSITION, "rmsnorm", mla=True),
}
# architectures the test suite writes and reads back (docs/verbs/spectra.md lists these)
TESTED = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "falcon", "gpt2", "starcoder2", "qwen2moe",
          "qwen3moe", "gpt-oss", "minimax-m2", "nemotron", "deepseek2")
_SEPARATE = {"q": "blk.{i}.attn_q.weight", "k": "blk.{i}.attn_k.weight", "v": "blk.{i}.attn_v.weight",
             "o": "blk.{i}.attn_output.weight"}
_FUSED = {"qkv": "blk.{i}.attn_qkv.weight", "o": "blk.{i}.attn_output.weight"}
_MLA = {"q": "blk.{i}.attn_q_b.weight", "kv_b": "blk.{i}.attn_kv_b.weight", "o": "blk.{i}.attn_output.weight"}


@dataclass(frozen=True)
class Joined:
    """``attn_kv_b`` as newer converters store it, split in two: ``attn_k_b`` (per head W_UK,h
    transposed) and ``attn_v_b``; read back as the one ``attn_kv_b`` tensor (:func:`join_kv_b`)."""

    k_b: Any
    v_b: Any


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
        self.stamps.add(p, self._file.stamp)  # checked again after the last read (io.identity)
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
        if self.arch.mla:
            self._join_kv_b()
        self.dims = self._mla_dims() if self.arch.mla else self._dims()
        config = {"model_type": f"gguf:{self.arch_name}", "gguf_architecture": self.arch_name,
                  "name": self._field("general.name", None), **_dims_dict(self.dims)}
        config.update(self._rope_config())
        self.layout = self._mla_layout() if self.arch.mla else self._layout()
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

    def _size(self, key: str, hi: int, default: Any = ..., lo: int = 1) -> int | None:
        """Metadata ``{arch}.key`` as a checked size (None: absent, with ``default`` None)."""
        v = self._field(f"{self.arch_name}.{key}", default)
        return None if v is None else as_int(v, f"{self.arch_name}.{key}", str(self._where), lo=lo, hi=hi)

    def _sizes(self) -> tuple[int, int, int]:
        """(block_count, embedding_length, head_count)."""
        return (self._size("block_count", MAX_LAYERS), self._size("embedding_length", MAX_WIDTH),
                self._size("attention.head_count", MAX_HEADS))

    def _dims(self) -> Dims:
        L, d, H = self._sizes()
        Hkv = self._size("attention.head_count_kv", MAX_HEADS, H)
        dk = self._size("attention.key_length", MAX_HEAD_DIM, None)
        dv = self._size("attention.value_length", MAX_HEAD_DIM, None)
        if dk is not None and dv is not None and dk != dv:
            raise HeadRankError(f"{self._where}: key length {dk} differs from value length {dv}: not supported")
        dh = dk if dk is not None else dv if dv is not None else max(d // H, 1)
        try:
            return Dims(L, d, H, Hkv, dh)
        except HeadRankError as e:
            raise HeadRankError(f"{self._where}: {e}") from None

    def _mla_dims(self) -> Dims:
        """Multi-head latent attention's sizes (docs/mla.md): per-head key and value lengths from
        ``key_length_mla``/``value_length_mla`` (llama.cpp's MLA cache files, whose
        ``key_length``/``value_length`` are the latent's) or else ``key_length``/``value_length``."""
        L, d, H = self._sizes()
        rope = self._size("rope.dimension_count", MAX_HEAD_DIM)
        kv = self._size("attention.kv_lora_rank", MAX_WIDTH)
        q_lora = self._size("attention.q_lora_rank", MAX_WIDTH, None, lo=0)  # 0 or absent: no query latent
        if self._field(f"{self.arch_name}.attention.key_length_mla", None) is not None:
            qk, v = self._size("attention.key_length_mla", 2 * MAX_HEAD_DIM), self._size(
                "attention.value_length_mla", MAX_HEAD_DIM)
        else:
            qk, v = self._size("attention.key_length", 2 * MAX_HEAD_DIM), self._size(
                "attention.value_length", MAX_HEAD_DIM)
        if not 1 <= rope < qk:
            raise HeadRankError(f"{self._where}: key length {qk} leaves no non-rotary part beside rotary dimension "
                                f"count {rope}")
        try:
            return Dims(L, d, H, H, qk - rope, mla=(qk - rope, rope, v, q_lora or d, kv))
        except HeadRankError as e:
            raise HeadRankError(f"{self._where}: {e}") from None

    def _rope_config(self) -> dict[str, Any]:
        """The rotary fields the rotary bands read (``rope_scaling`` named, never applied here)."""
        a = self.arch_name
        rope = {"rope_theta": self._field(f"{a}.rope.freq_base", None),
                "rotary_dim": None if self.arch.mla else self._field(f"{a}.rope.dimension_count", None)}
        scaling = self._field(f"{a}.rope.scaling.type", None)
        if scaling not in (None, "none"):
            rope["rope_scaling"] = {"rope_type": str(scaling)[:40],
                                    "factor": self._field(f"{a}.rope.scaling.factor", None)}
        return {k: v for k, v in rope.items() if v is not None}

    def _layout(self) -> Layout:
        fused = "blk.0.attn_qkv.weight" in self._tensors
        tensors = _FUSED if fused else _SEPARATE
        self._require(tensors)
        dims, arch = self.dims, self.arch
        qk_norm = "blk.0.attn_q_norm.weight" in self._tensors
        norm = NormSpec("blk.{i}.attn_norm.weight", arch.norm) if "blk.0.attn_norm.weight" in self._tensors else None
        return Layout(model_types=(f"gguf:{self.arch_name}",), tensors=dict(tensors), dims=lambda c: dims,
                      split="fused" if fused else "separate",
                      biases=tuple(t.replace(".weight", ".bias") for t in tensors.values()),
                      position=lambda c: arch.position, qk_norm=lambda c: qk_norm, norm=lambda c: norm)

    def _mla_layout(self) -> Layout:
        """The ``mla`` split over llama.cpp's names; ``--fold-norm`` folds ``attn_q_a_norm`` and
        ``attn_kv_a_norm`` as it folds ``q_a_layernorm`` and ``kv_a_layernorm`` (docs/mla.md)."""
        tensors = dict(_MLA)
        if self.dims.mla is not None and self.dims.mla[3] == self.dims.d and "blk.0.attn_q_b.weight" not in self._tensors:
            tensors["q"] = "blk.{i}.attn_q.weight"  # no query latent
        self._require(tensors)
        dims, norm = self.dims, NormSpec("blk.{i}.attn_kv_a_norm.weight", "rmsnorm")
        return Layout(model_types=(f"gguf:{self.arch_name}",), tensors=tensors, dims=lambda c: dims, split="mla",
                      biases=(), position=lambda c: MLA_POSITION, norm=lambda c: norm)

    def _require(self, tensors: dict[str, str]) -> None:
        missing = [t.format(i=0) for t in tensors.values() if t.format(i=0) not in self._tensors]
        if missing:
            raise HeadRankError(f"{self._where}: no attention tensor {missing[0]} (architecture {self.arch_name!r})")

    def _join_kv_b(self) -> None:
        """Each layer's ``attn_k_b`` and ``attn_v_b`` (newer converters) as one ``attn_kv_b`` entry."""
        for name in [n for n in self._tensors if n.endswith(".attn_k_b.weight")]:
            base = name[: -len("attn_k_b.weight")]
            v_b = self._tensors.get(base + "attn_v_b.weight")
            if v_b is not None and base + "attn_kv_b.weight" not in self._tensors:
                self._tensors[base + "attn_kv_b.weight"] = Joined(self._tensors[name], v_b)

    def _stored(self, name: str) -> list[Any]:
        """The file's tensors behind an entry (two for a joined ``attn_kv_b``)."""
        t = self._tensors[name]
        return [t.k_b, t.v_b] if isinstance(t, Joined) else [t]

    def _check_types(self) -> None:
        ok = dequantizable()
        for i in range(self.dims.n_layers):
            for t in self.layout.tensors.values():
                name = t.format(i=i)
                if name not in self._tensors:
                    raise HeadRankError(f"{self._where}: no attention tensor {name}")
                for stored in self._stored(name):
                    kind = stored.tensor_type.name
                    if kind not in ok:
                        raise HeadRankError(f"{self._where}: tensor {stored.name} has quantization type {kind}, "
                                            "which the installed gguf package cannot dequantize")

    def quant_types(self) -> dict[str, int]:
        """How many attention tensors of each GGML type the file holds."""
        return dict(Counter(s.tensor_type.name for i in range(self.dims.n_layers) for t in self.layout.tensors.values()
                            for s in self._stored(t.format(i=i))))

    # -- access ------------------------------------------------------------------------------
    def _read(self, name: str, t: Any) -> torch.Tensor:
        """Dequantize one tensor to float32 (llama's Q/K rows back in Hugging Face order; a split
        ``attn_kv_b`` joined)."""
        if isinstance(t, Joined):
            return join_kv_b(self._dequantize(t.k_b.name, t.k_b), self._dequantize(t.v_b.name, t.v_b),
                             f"{name} in {self._where}")
        w = self._dequantize(name, t)
        if self.arch.rotary_permuted and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = self.dims.n_heads if name.endswith(".attn_q.weight") else self.dims.n_kv_heads
            w = unpermute_rotary(w, heads, f"{name} in {self._where}")
        return w

    def _dequantize(self, name: str, t: Any) -> torch.Tensor:
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
        return torch.from_numpy(arr)

    def _tensor_data(self, t: Any) -> Any:
        """A tensor's stored bytes, read with ``pread`` (never through the reader's memory map,
        which a truncated file turns into SIGBUS), in the shape of the gguf reader's array (a
        remote reader fetches them)."""
        import numpy as np

        if self._file.size != self._file._now()[2] or t.data_offset + t.n_bytes > self._file.size:
            from headrank.io.identity import changed

            raise changed(self._where)
        buf = self._file.pread(int(t.n_bytes), int(t.data_offset))
        return np.frombuffer(buf, dtype=t.data.dtype).reshape(t.data.shape)

    def _meta(self, name: str, t: Any) -> TensorMeta:
        # the gguf reader lists dimensions innermost first (ggml's ne); torch's order is the reverse
        file = Path(str(self.files[0])).name
        if isinstance(t, Joined):
            (H, kv, nope), v = _shape(t.k_b), _shape(t.v_b)[1]
            kinds = sorted({t.k_b.tensor_type.name, t.v_b.tensor_type.name})
            return TensorMeta("+".join(kinds), (H * (nope + v), kv), int(t.k_b.n_bytes) + int(t.v_b.n_bytes), file)
        return TensorMeta(t.tensor_type.name, _shape(t), int(t.n_bytes), file)

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


def join_kv_b(k_b: torch.Tensor, v_b: torch.Tensor, name: str = "attn_kv_b") -> torch.Tensor:
    """``attn_k_b`` ``(H, kv_lora_rank, qk_nope_head_dim)`` and ``attn_v_b`` ``(H, v_head_dim,
    kv_lora_rank)`` back into ``kv_b_proj``'s rows ``(H · (qk_nope_head_dim + v_head_dim),
    kv_lora_rank)``: per head its W_UK,h rows, then its W_UV,h rows (the converter's split undone)."""
    if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
        raise HeadRankError(f"GGUF tensor {name}: attn_k_b {tuple(k_b.shape)} and attn_v_b {tuple(v_b.shape)} are "
                            "not (heads, kv_lora_rank, qk_nope_head_dim) and (heads, v_head_dim, kv_lora_rank) "
                            "(corrupt file or metadata)")
    joined = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return joined.reshape(-1, k_b.shape[1]).contiguous()


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(n) for n in reversed(t.shape))


def gguf_origin(ckpt: GGUFCheckpoint) -> dict[str, Any]:
    """What meta.json says about a GGUF source."""
    info: dict[str, Any] = {
        "architecture": ckpt.arch_name,
        "name": ckpt.config.get("name"),
        "quantization_types": ckpt.quant_types(),
        "dequantized": "spectra of the dequantized weights (gguf package), float32",
        "rotary_rows": ("llama.cpp's per-head Q/K row permutation undone (QK products are invariant to it)"
                        if ckpt.arch.rotary_permuted else "not permuted by the converter"),
    }
    if ckpt.arch.mla:
        joined = isinstance(ckpt._tensors.get(ckpt.layout.tensors["kv_b"].format(i=0)), Joined)
        info["mla"] = ("latent-space products (docs/mla.md); attn_kv_b joined from the file's attn_k_b and "
                       "attn_v_b" if joined else "latent-space products (docs/mla.md) from attn_kv_b")
    if "blk.0.attn_sinks.weight" in ckpt:
        info["attention_sinks"] = ("per-head sink logits (attn_sinks) present: they add a column to each "
                                   "head's softmax, not a term of its bilinear score, and are not measured")
    window = ckpt._field(f"{ckpt.arch_name}.attention.sliding_window", None)
    if window is not None:
        info["sliding_window"] = {"tokens": window, "note": "a mask on which keys a query sees: the per-head "
                                  "products do not depend on it"}
    return {"input": "gguf", "gguf": info}


def _dims_dict(d: Dims) -> dict[str, int]:
    return {"n_layers": d.n_layers, "d_model": d.d, "n_heads": d.n_heads, "n_kv_heads": d.n_kv_heads,
            "head_dim": d.head_dim}
