"""The scheme layer: what a stored tensor means (docs/quantized.md).

A checkpoint is read in three layers: bytes (a local file, HTTP ranges, memory), format
(safetensors, ``.bin``, GGUF) and scheme. The scheme comes from ``quantization_config`` in
config.json and is applied after the format reader and before the layout, by
:class:`~headrank.io.tensor_source.BaseCheckpoint` itself, so every reader (local, shards, Hub
cache, ``--remote``, a live model) and every verb (``spectra``, ``track``, ``compress``) gets the
same dequantized tensors:

- ``fp8`` (DeepSeek-V2/V3/R1, Kimi-K2, Qwen3-FP8, MiniMax; block scales, ragged edges by
  ceiling division) and ``fbgemm_fp8`` (per-row scales): :mod:`headrank.io.quant_fp8`;
- ``compressed-tensors`` (float-, int-, naive- and pack-quantized): :mod:`headrank.io.quant_ct`;
- ``gptq`` and ``awq`` (int codes packed in int32, per-group scales and zero points):
  :mod:`headrank.io.quant_int`.

:class:`View` is what a checkpoint shows through its scheme; :data:`KNOWN` names every method
transformers knows, and :func:`scheme_for` refuses, by name, each one not read.

Each quantized weight becomes one logical tensor under the weight's own name (its scales, zero
points and group indices are hidden from ``keys()``); ``get`` fetches the codes and their
scales (a remote reader fetches them concurrently, in the same round of range requests) and
returns the product in float64, which holds it exactly (an FP8 or int8 code has at most 8
significant bits, a float32 scale 24). Anything else is refused in one line: an unknown
``quant_method``, a config that no stored tensor agrees with (says fp8, stores bf16), scales
missing, of the wrong shape or dtype, or not finite, codes that are NaN. An attention tensor
stored as integers or float8 that no scheme explains is refused by
:func:`headrank.io.validate.check_dtype`: a code is never read as a weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError
from headrank.io.quant_base import Plan, Scheme, as_torch
from headrank.io.quant_ct import CompressedTensors
from headrank.io.quant_fp8 import FP8Blocks, FP8Rows
from headrank.io.quant_int import IntGroups

if TYPE_CHECKING:
    from headrank.io.quant_base import TensorMeta

# the checkpoint (a headrank.io.tensor_source.BaseCheckpoint), named here without importing that module: it
# imports this one
BaseCheckpoint = Any

# every quant_method transformers knows (transformers.utils.quantization_config.QuantizationMethod and
# AUTO_QUANTIZATION_CONFIG_MAPPING), with what its tensors are; the ones read are in READ
KNOWN = {
    "fp8": "FP8 codes with block scales", "fbgemm_fp8": "FP8 codes with per-channel scales",
    "compressed-tensors": "compressed-tensors codes",
    "gptq": "GPTQ int4/int8 codes packed in int32 (qweight, qzeros, scales, g_idx)",
    "awq": "AWQ int4 codes packed in int32 (qweight, qzeros, scales)",
    "bitsandbytes": "bitsandbytes int8 or NF4/FP4 codes", "bitsandbytes_4bit": "bitsandbytes NF4/FP4 codes",
    "bitsandbytes_8bit": "bitsandbytes int8 codes", "mxfp4": "MXFP4 codes with E8M0 block scales",
    "nvfp4": "NVFP4 codes with FP8 block scales", "mxfp8": "MXFP8 codes with E8M0 block scales",
    "aqlm": "AQLM additive codebooks", "vptq": "VPTQ vector codebooks", "quanto": "optimum-quanto codes",
    "eetq": "EETQ int8 codes", "higgs": "HIGGS codes", "hqq": "HQQ codes", "torchao": "torchao tensor subclasses",
    "gguf": "GGUF blocks", "bitnet": "BitNet ternary codes", "spqr": "SpQR codes", "quark": "AMD Quark codes",
    "fp_quant": "FP-Quant codes", "auto-round": "AutoRound int codes", "metal": "Metal codes",
    "fouroversix": "FourOverSix codes", "sinq": "SINQ codes", "gemma": "Gemma QAT codes",
}


def quant_config(config: Mapping[str, Any], where: Any) -> dict[str, Any] | None:
    """The checkpoint's ``quantization_config`` (compressed-tensors' older ``compression_config``
    too), or None; one line for one that is not an object naming a ``quant_method``."""
    qc = config.get("quantization_config", config.get("compression_config"))
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise HeadRankError(f"config {where}: quantization_config must be an object; got {type(qc).__name__}")
    method = qc.get("quant_method")
    if method is None and (qc.get("load_in_4bit") or qc.get("load_in_8bit")):
        method = "bitsandbytes"
    if not isinstance(method, str) or not method:
        raise HeadRankError(f"config {where}: quantization_config names no quant_method; its tensors cannot be read "
                            "without one")
    return {**qc, "quant_method": method.lower()}


def scheme_for(config: Mapping[str, Any], where: Any) -> Scheme | None:
    """The scheme that explains the stored tensors of a checkpoint with ``config``, None for an
    unquantized one; one line (naming the method) for a method that is not read."""
    qc = quant_config(config, where)
    if qc is None:
        return None
    method = qc["quant_method"]
    if method == "fp8":
        return FP8Blocks(qc, where)
    if method == "fbgemm_fp8":
        return FP8Rows(qc, where)
    if method == "compressed-tensors":
        return CompressedTensors(qc, where)
    if method in ("gptq", "awq"):
        return IntGroups(qc, where)
    what = KNOWN.get(method, "a quantization scheme headrank does not know")
    if method == "bitsandbytes":
        what = KNOWN["bitsandbytes_4bit" if qc.get("load_in_4bit") else "bitsandbytes_8bit"]
    raise HeadRankError(f"config {where}: quant_method {method!r} ({what}) is not read by headrank: its attention "
                        "tensors are codes, not weights, so nothing is read (read: fp8, fbgemm_fp8, "
                        "compressed-tensors, gptq, awq; docs/quantized.md)")

# -- the logical view ----------------------------------------------------------------------------
class View:
    """A checkpoint's tensors as the scheme makes them: each quantized weight under its own name,
    its auxiliary tensors hidden. The logical names come from the stored names alone (no header
    is needed: a remote sharded checkpoint fetches only the headers of the shards it reads);
    each tensor's plan is made from its header entry when it is first read."""

    def __init__(self, ckpt: BaseCheckpoint, scheme: Scheme):
        self.scheme, self.metas = scheme, _Metas(ckpt)
        stored = list(ckpt._entries)
        names = set(stored)
        self.renamed: dict[str, str] = {}  # logical name -> stored codes name, where they differ
        self._hidden: set[str] = set()
        keys = []
        for n in stored:
            role = scheme.role(n, names)
            if role == "aux":
                self._hidden.add(n)
            elif role is not None and role != n:
                self.renamed[role] = n
                self._hidden.add(n)
                keys.append(role)
            else:
                keys.append(n)
        self.keys = list(dict.fromkeys(keys))
        self._known = set(self.keys)
        self._plans: dict[str, Plan | None] = {}

    def record(self) -> dict[str, Any]:
        return {**self.scheme.record(), "dequantized": True, "to": "float64 (exact: code x scale)"}

    def is_hidden(self, name: str) -> bool:
        return name in self._hidden and name not in self._known

    def has(self, name: str) -> bool:
        return name in self._known

    def plan(self, name: str) -> Plan | None:
        """The plan of logical tensor ``name`` (None: stored plain), made on first use."""
        if name not in self._plans:
            ck = self.metas._ckpt
            self._plans[name] = self.scheme.plan(self.renamed.get(name, name), self.metas, logical=name,
                                                 read=lambda n: as_torch(ck._read(n, ck._entry(n))))
        return self._plans[name]

    def meta(self, name: str) -> TensorMeta | None:
        p = self.plan(name)
        if p is None:
            return None
        from dataclasses import replace

        codes = self.metas[p.parts["codes"]]
        parts = [self.metas[v].nbytes for v in p.parts.values() if v in self.metas]
        n = sum(parts) if all(b is not None for b in parts) else None
        return replace(codes, shape=tuple(p.shape), nbytes=n)

    def stored_parts(self, name: str) -> list[str]:
        """The stored tensors behind ``name`` (checked first: refusals before any byte is read)."""
        p = self.plan(name)
        if p is None:
            return [name]
        if p.error is not None:
            raise HeadRankError(p.error)
        self.scheme.check_parts(p, self.metas)
        return list(dict.fromkeys(p.parts.values()))

    def build(self, name: str, raw: dict[str, Any], numpy: bool) -> Any:
        """The logical tensor ``name`` from its stored parts (``raw``: stored name -> tensor)."""
        p = self.plan(name)
        if p is None:
            return raw[name]
        parts = {r: as_torch(raw[v]) for r, v in p.parts.items()}
        w = self.scheme.dequantize(p, parts, self.metas)
        return w.numpy() if numpy else w

    def check_attention(self, names: list[str]) -> None:
        """Attention tensors stored plain under a quantization config must be ones the config
        excludes (``modules_to_not_convert``, ``ignore``); else the config contradicts them."""
        for n in names:
            if self.plan(n) is None and not self.scheme.excluded(n):
                m = self.metas[n]
                raise HeadRankError(f"config {self.scheme.where} says quant_method {self.scheme.method!r} but attention "
                                    f"tensor {n} is stored as {m.dtype} with no scale, and the config does not exclude "
                                    "it: the config contradicts the tensors")


class _Metas(Mapping):
    """Stored tensors' header entries by name, each read once (a remote shard's header on demand)."""

    def __init__(self, ckpt: BaseCheckpoint):
        self._ckpt, self._cache = ckpt, {}

    def __getitem__(self, name: str) -> TensorMeta:
        if name not in self._cache:
            if name not in self._ckpt._entries:
                raise KeyError(name)
            self._cache[name] = self._ckpt._meta(name, self._ckpt._entry(name))
        return self._cache[name]

    def __contains__(self, name: object) -> bool:
        return name in self._ckpt._entries

    def __iter__(self):
        return iter(self._ckpt._entries)

    def __len__(self) -> int:
        return len(self._ckpt._entries)
