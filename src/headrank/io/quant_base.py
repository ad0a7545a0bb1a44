"""The scheme layer's parts shared by every scheme (docs/quantized.md): :class:`Plan` (how one
logical tensor is built from stored ones), :class:`Scheme` (one ``quant_method``: which stored
tensors it explains, how they dequantize) and the checks and arithmetic they share. The schemes
are :mod:`headrank.io.quant_fp8` and :mod:`headrank.io.quant_ct`; :mod:`headrank.io.schemes`
chooses one from config.json and applies it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError

if TYPE_CHECKING:
    import torch

# a stored tensor's header entry (a headrank.io.tensor_source.TensorMeta), named here without importing that
# module: it imports the scheme layer
TensorMeta = Any

FP8 = ("float8_e4m3fn", "float8_e5m2")
FLOATS = ("float32", "bfloat16", "float16", "float64")
MAX_BLOCK = 1 << 16  # a weight_block_size side larger than this is not a block
@dataclass
class Plan:
    """How one logical tensor is built from stored ones: ``parts`` (role -> stored name; role
    ``codes`` is the one that names it), ``shape`` (of the logical tensor), ``error`` (a refusal
    raised when the tensor is read: a code is never read as a weight), ``extra`` (per scheme)."""

    name: str
    parts: dict[str, str]
    shape: tuple[int, ...] = ()
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Scheme:
    """One ``quant_method``: which stored tensors it explains and how they dequantize."""

    method = ""
    #: the quantized weights' auxiliary tensors end with these (hidden from the logical keys)
    aux_suffixes: tuple[str, ...] = ()

    def __init__(self, qc: dict[str, Any], where: Any):
        self.qc, self.where = qc, where

    @property
    def label(self) -> str:
        raise NotImplementedError

    def role(self, name: str, names: set[str]) -> str | None:
        """From names alone: ``"aux"`` for a scale (zero point, …) of another tensor, the logical
        name for codes stored under another name, else None."""
        return "aux" if name.endswith(self.aux_suffixes) else None

    def plan(self, name: str, metas: Mapping[str, TensorMeta], logical: str | None = None,
             read: Any = None) -> Plan | None:
        """The plan of stored tensor ``name`` when it holds codes of this scheme, else None
        (``read(name)``: a small stored tensor, e.g. an unpacked shape, as torch)."""
        raise NotImplementedError

    def dequantize(self, plan: Plan, raw: dict[str, torch.Tensor], metas: Mapping[str, TensorMeta]) -> torch.Tensor:
        raise NotImplementedError

    def check_parts(self, plan: Plan, metas: Mapping[str, TensorMeta]) -> None:
        """Refuse, before any byte is read, parts whose stored shape or dtype this plan does not
        allow (a header claiming a huge scale tensor never gets fetched)."""

    def excluded(self, name: str) -> bool:
        """Whether the config leaves tensor ``name`` unquantized (``modules_to_not_convert``)."""
        skip = self.qc.get("modules_to_not_convert") or []
        module = name.rsplit(".", 1)[0]
        return isinstance(skip, list) and any(isinstance(k, str) and k and (k in module) for k in skip)

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "scheme": self.label}

# -- shared checks and arithmetic ----------------------------------------------------------------
def check_scale_meta(name: str, meta: TensorMeta, want: tuple[tuple[int, ...], ...], why: str,
                     dtypes: tuple[str, ...] = FLOATS) -> None:
    """A scale (or zero point) of one of the ``want`` shapes and a ``dtypes`` dtype, from its
    header entry alone."""
    if meta.dtype not in dtypes:
        raise HeadRankError(f"scale tensor {name} has dtype {meta.dtype}; expected {' or '.join(dtypes)}")
    if tuple(meta.shape) not in want:
        raise HeadRankError(f"scale tensor {name} has shape {list(meta.shape)}; expected {list(want[0])} ({why})")


def fp8_codes(name: str, codes: torch.Tensor) -> torch.Tensor:
    """Float8 codes as float64 (exact); NaN or infinite codes refused."""
    import torch

    if str(codes.dtype).removeprefix("torch.") not in FP8:
        raise HeadRankError(f"tensor {name} has dtype {codes.dtype}; its scheme stores float8 codes")
    w = codes.to(torch.float64)
    if not torch.isfinite(w).all():
        raise HeadRankError(f"tensor {name} holds NaN or infinite float8 codes: the file is corrupt")
    return w


def finite_scale(name: str, s: torch.Tensor, *, nonzero: bool = False) -> torch.Tensor:
    """A scale as float64 (exact); NaN, infinite (and with ``nonzero``, zero) values refused."""
    import torch

    s = as_torch(s).to(torch.float64)
    if not torch.isfinite(s).all():
        raise HeadRankError(f"scale tensor {name} holds NaN or infinite values")
    if nonzero and (s == 0).any():
        raise HeadRankError(f"scale tensor {name} holds zeros, and it divides")
    return s


def mul_blocks(w: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``w`` (…, r, c) times the scale of its ``block`` (ceiling division: edge blocks partial), in
    place; the row-expanded scales are the only temporary (r × ⌈c/b⌉)."""
    r, c = w.shape[-2:]
    br, bc = block
    rows = s.repeat_interleave(br, dim=-2)[..., :r, :]
    full, rem = divmod(c, bc)
    if full:
        w[..., : full * bc].unflatten(-1, (full, bc)).mul_(rows[..., :full, None])
    if rem:
        w[..., full * bc:].mul_(rows[..., full:full + 1])
    return w


def as_torch(x: Any) -> torch.Tensor:
    """A torch tensor for a stored tensor read as torch or as numpy (bfloat16 bits converted exactly)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x
    import numpy as np

    from headrank.util.bf16 import BF16Bits, to_float32

    if isinstance(x, BF16Bits):
        return torch.from_numpy(to_float32(x))
    return torch.from_numpy(np.ascontiguousarray(x))

def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
