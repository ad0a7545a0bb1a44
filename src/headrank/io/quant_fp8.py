"""FP8 checkpoints (docs/quantized.md): ``quant_method: fp8`` (DeepSeek-V2/V3/R1, Kimi-K2,
Qwen3-FP8, MiniMax: float8 codes and a float ``weight_scale_inv`` per ``weight_block_size``
block, the weight being code × scale of its block; the grid is ⌈rows/b⌉ × ⌈cols/b⌉, ceiling
division, so a ragged edge block is a partial block of the configured size, as DeepSeek's own
``weight_dequant`` and compressed-tensors' block strategy take it; without
``weight_block_size``, one scale per tensor) and ``fbgemm_fp8`` (Llama 4's FP8 release: one
float ``weight_scale`` per output row).

transformers' FP8 loader (5.24, ``finegrained_fp8``) instead derives the block from the stored
grid, rows ÷ grid rows: for a ragged matrix that is a different block (a 448 × 160
``kv_b_proj`` with a 4 × 2 grid of 128-blocks gets 112 × 80 blocks) and other numbers, silently.
This module follows the config's block size with ceiling division, which is how the checkpoints
were written, and refuses a grid that does not match it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError
from headrank.io.quant_base import (
    FP8,
    MAX_BLOCK,
    Plan,
    Scheme,
    TensorMeta,
    ceil_div,
    check_scale_meta,
    finite_scale,
    fp8_codes,
    mul_blocks,
)

if TYPE_CHECKING:
    import torch


class FP8Blocks(Scheme):
    """``quant_method: fp8``: float8 codes, ``weight_scale_inv`` per block (module docstring)."""

    method = "fp8"
    suffix = "_scale_inv"
    aux_suffixes = ("_scale_inv", ".input_scale")  # input_scale: static activation scales, not weights

    def __init__(self, qc: dict[str, Any], where: Any):
        super().__init__(qc, where)
        bs = qc.get("weight_block_size")
        if bs is not None:
            if not isinstance(bs, list) or len(bs) != 2 or not all(
                    isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_BLOCK for b in bs):
                raise HeadRankError(f"config {where}: quantization_config.weight_block_size must be two integers in "
                                    f"1..{MAX_BLOCK}; got {str(bs)[:60]}")
            bs = (bs[0], bs[1])
        self.block: tuple[int, int] | None = bs

    @property
    def label(self) -> str:
        if self.block is None:
            return "float8 codes x one float scale per tensor (weight_scale_inv)"
        return (f"float8 codes x one float scale per {self.block[0]}x{self.block[1]} block (weight_scale_inv; "
                "ragged edge blocks by ceiling division)")

    def record(self) -> dict[str, Any]:
        return {**super().record(), "weight_block_size": list(self.block) if self.block else None}

    def plan(self, name: str, metas: Mapping[str, TensorMeta], logical: str | None = None,
             read: Any = None) -> Plan | None:
        m = metas[name]
        scale = name + self.suffix
        if m.dtype not in FP8:
            if scale in metas:
                return Plan(name, {"codes": name, "scale": scale}, m.shape,
                            error=f"tensor {name} is stored as {m.dtype} but has an FP8 scale {scale}: the tensors "
                                  "contradict each other")
            return None
        if scale not in metas:
            return Plan(name, {"codes": name}, m.shape, error=f"tensor {name} holds {m.dtype} codes but its scale "
                        f"{scale} is missing: a code is not a weight")
        return Plan(name, {"codes": name, "scale": scale}, m.shape)

    def expected_scale(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        if self.block is None:
            return (), (1,), (1, 1)
        if len(shape) < 2:
            return ((),)
        r, c = shape[-2:]
        return ((*shape[:-2], ceil_div(r, self.block[0]), ceil_div(c, self.block[1])),)

    def check_parts(self, plan: Plan, metas: Mapping[str, TensorMeta]) -> None:
        codes, scale = metas[plan.parts["codes"]], metas[plan.parts["scale"]]
        want = self.expected_scale(codes.shape)
        if len(codes.shape) < 2 and self.block is not None:
            raise HeadRankError(f"tensor {plan.name} ({list(codes.shape)}) is not a matrix, so it has no "
                                f"{self.block[0]}x{self.block[1]} blocks")
        check_scale_meta(plan.parts["scale"], scale, want, self._why(codes.shape))

    def _why(self, shape: tuple[int, ...]) -> str:
        if self.block is None:
            return "one scale per tensor (no weight_block_size)"
        return (f"one per {self.block[0]}x{self.block[1]} block of {list(shape)} (ceiling division): the block size "
                "does not match the stored scales")

    def dequantize(self, plan: Plan, raw: dict[str, torch.Tensor], metas: Mapping[str, TensorMeta]) -> torch.Tensor:
        w = fp8_codes(plan.name, raw["codes"])
        s = finite_scale(plan.parts["scale"], raw["scale"])
        if self.block is None:
            return w.mul_(s.reshape(()))
        return mul_blocks(w, s, self.block)


class FP8Rows(FP8Blocks):
    """``quant_method: fbgemm_fp8``: float8 codes, one float ``weight_scale`` per output row."""

    method = "fbgemm_fp8"
    suffix = "_scale"
    aux_suffixes = (".weight_scale", ".input_scale")

    def __init__(self, qc: dict[str, Any], where: Any):
        Scheme.__init__(self, qc, where)
        self.block = None

    @property
    def label(self) -> str:
        return "float8 codes x one float scale per output row (weight_scale)"

    def record(self) -> dict[str, Any]:
        return Scheme.record(self)

    def expected_scale(self, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        return ((*shape[:-1], 1), shape[:-1])

    def _why(self, shape: tuple[int, ...]) -> str:
        return f"one per output row of {list(shape)}"

    def dequantize(self, plan: Plan, raw: dict[str, torch.Tensor], metas: Mapping[str, TensorMeta]) -> torch.Tensor:
        w = fp8_codes(plan.name, raw["codes"])
        s = finite_scale(plan.parts["scale"], raw["scale"])
        return w.mul_(s.reshape(*w.shape[:-1], 1))
