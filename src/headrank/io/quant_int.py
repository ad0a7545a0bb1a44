"""GPTQ and AWQ checkpoints (docs/quantized.md), read exactly from their published formats.

GPTQ (AutoGPTQ's ``QuantLinear.pack`` / GPTQModel, ``quant_method: gptq``), for a Linear of
``in`` inputs and ``out`` outputs at ``bits`` ∈ {2, 4, 8}: ``qweight`` int32 [in·bits/32, out],
the codes of 32/bits consecutive inputs per word (input i at bits (i mod 32/bits)·bits);
``qzeros`` int32 [groups, out·bits/32], zero points packed along the outputs the same way;
``scales`` float16 [groups, out]; ``g_idx`` int32 [in], the group of each input (with
``desc_act`` not in order). ``W[o, i] = scales[g(i), o] · (q[i, o] − z[g(i), o])``, where the
stored zero is z − 1 in the original format (``checkpoint_format``/``format`` ``gptq``, "v1"),
read back as AutoGPTQ's own dequantization reads it, (stored + 1) mod 2^bits (a zero point of 0
was stored as 2^bits − 1), and z itself in GPTQModel's ``gptq_v2``. Without ``g_idx``, g(i) = i // group_size
(``group_size`` −1: one group).

AWQ (AutoAWQ's GEMM ``WQLinear_GEMM.pack``, ``quant_method: awq``, ``version``/``format``
``gemm``, 4 bits): ``qweight`` int32 [in, out/8] packs 8 outputs per word in the order
0, 2, 4, 6, 1, 3, 5, 7 (output 8c + order[j] at bits 4j of word c); ``qzeros`` int32
[groups, out/8] the same way; ``scales`` float16 [groups, out]; g(i) = i // group_size;
``W[o, i] = scales[g(i), o] · (q[i, o] − z[g(i), o])``. With ``zero_point: false`` the stored
zero points must all be 2^(bits-1) (8): any other value contradicts the config and is refused.

Refused in one line: other bit widths (3-bit GPTQ packs across words), AWQ's GEMV, Marlin or
exllama packings, a ``g_idx`` outside 0..groups−1, packed lengths that do not match, a scale
count that does not match ``group_size`` (with or without ``g_idx``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError
from headrank.io.quant_base import (
    FLOATS,
    Plan,
    Scheme,
    TensorMeta,
    ceil_div,
    check_scale_meta,
    finite_scale,
)

if TYPE_CHECKING:
    import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # output 8c + AWQ_ORDER[j] sits at bits 4j of word c


class IntGroups(Scheme):
    """``gptq`` and ``awq``: int codes packed in int32, float16 scales and zero points per group."""

    aux_suffixes = (".qzeros", ".scales", ".g_idx")

    def __init__(self, qc: dict[str, Any], where: Any):
        super().__init__(qc, where)
        self.method = qc["quant_method"]
        bits, gs = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size", 128))
        allowed = (4,) if self.method == "awq" else (2, 4, 8)
        if not isinstance(bits, int) or isinstance(bits, bool) or bits not in allowed:
            raise HeadRankError(f"config {where}: {self.method} with bits {bits!r} is not read by headrank (read: "
                                f"{', '.join(map(str, allowed))})")
        if not isinstance(gs, int) or isinstance(gs, bool) or not (gs == -1 or 1 <= gs <= 1 << 24):
            raise HeadRankError(f"config {where}: {self.method} group_size must be -1 or a positive integer; got {gs!r}")
        self.bits, self.group_size = bits, gs
        fmt = str(qc.get("format", qc.get("checkpoint_format", qc.get("version", "gemm" if self.method == "awq"
                                                                               else "gptq")))).lower()
        if fmt not in (("gemm",) if self.method == "awq" else ("gptq", "gptq_v2")):
            raise HeadRankError(f"config {where}: {self.method} format {fmt!r} is not read by headrank (its packing "
                                f"differs; read: {'gemm' if self.method == 'awq' else 'gptq, gptq_v2'})")
        self.fmt = fmt
        self.zero_offset = 1 if fmt == "gptq" else 0  # GPTQ v1 stores z - 1
        self.zero_point = qc.get("zero_point", True) is not False

    @property
    def label(self) -> str:
        groups = "one group per row" if self.group_size == -1 else f"groups of {self.group_size} inputs"
        return f"{self.method} ({self.fmt}) {self.bits}-bit int codes packed in int32, float scale and zero per {groups}"

    def role(self, name: str, names: set[str]) -> str | None:
        if name.endswith(".qweight"):
            return name[: -len(".qweight")] + ".weight"
        return super().role(name, names)

    def plan(self, name: str, metas: Mapping[str, TensorMeta], logical: str | None = None,
             read: Any = None) -> Plan | None:
        logical = logical or name
        if not name.endswith(".qweight"):
            m = metas[name]
            if name.endswith(".weight") and m.dtype not in FLOATS and len(m.shape) == 2:
                return Plan(name, {"codes": name}, m.shape, error=f"tensor {name} is stored as {m.dtype}, which "
                            f"{self.method} does not explain: a code is not a weight")
            return None
        module = name[: -len(".qweight")]
        parts = {"codes": name, "zeros": module + ".qzeros", "scale": module + ".scales"}
        if self.method == "gptq" and module + ".g_idx" in metas:
            parts["g_idx"] = module + ".g_idx"
        missing = [p for p in parts.values() if p not in metas]
        if missing:
            return Plan(logical, parts, error=f"tensor {name} holds {self.method} codes but {missing[0]} is missing: a "
                        "code is not a weight")
        q, s = metas[name], metas[parts["scale"]]
        if q.dtype != "int32" or len(q.shape) != 2 or len(s.shape) != 2:
            raise HeadRankError(f"tensor {name} is {q.dtype} {list(q.shape)} with scales {list(s.shape)}; {self.method} "
                                "stores int32 packed codes and a 2-d scale tensor")
        per = 32 // self.bits
        out, inp = (q.shape[1], q.shape[0] * per) if self.method == "gptq" else (q.shape[1] * per, q.shape[0])
        return Plan(logical, parts, (out, inp))

    def _groups(self, inp: int) -> int:
        return 1 if self.group_size == -1 else ceil_div(inp, self.group_size)

    def check_parts(self, plan: Plan, metas: Mapping[str, TensorMeta]) -> None:
        out, inp = plan.shape
        per, n = 32 // self.bits, metas[plan.parts["scale"]].shape[0]
        if n != self._groups(inp):  # with g_idx too: desc_act reorders the inputs, not the number of groups
            raise HeadRankError(f"scale tensor {plan.parts['scale']} has {n} groups; {inp} inputs in groups of "
                                f"{self.group_size} make {self._groups(inp)}: the group size does not match")
        check_scale_meta(plan.parts["scale"], metas[plan.parts["scale"]], ((n, out),), f"{self.method} scales")
        check_scale_meta(plan.parts["zeros"], metas[plan.parts["zeros"]], ((n, ceil_div(out, per)),),
                         f"{self.method} zero points packed {per} per int32", dtypes=("int32",))
        if "g_idx" in plan.parts:
            check_scale_meta(plan.parts["g_idx"], metas[plan.parts["g_idx"]], ((inp,),), "a group per input",
                             dtypes=("int32", "int64"))

    def dequantize(self, plan: Plan, raw: dict[str, torch.Tensor], metas: Mapping[str, TensorMeta]) -> torch.Tensor:
        import torch

        out, inp = plan.shape
        s = finite_scale(plan.parts["scale"], raw["scale"])  # (groups, out)
        if self.method == "gptq":
            q = _unpack(raw["codes"].mT, self.bits).mT  # (in, out): inputs packed along the words' rows
            z = (_unpack(raw["zeros"], self.bits)[:, :out] + self.zero_offset) % (1 << self.bits)  # (groups, out)
        else:
            q = _unpack(raw["codes"], self.bits, AWQ_ORDER)  # (in, out)
            z = _unpack(raw["zeros"], self.bits, AWQ_ORDER)[:, :out]
            if not self.zero_point and bool((z != 1 << (self.bits - 1)).any()):  # the config contradicts the tensors
                raise HeadRankError(f"tensor {plan.parts['zeros']} holds zero points other than {1 << (self.bits - 1)} "
                                    "while the quantization_config says zero_point false: refusing to guess which one "
                                    "the weights were made with")
        g = raw.get("g_idx")
        if g is None:
            g = torch.arange(inp) // (inp if self.group_size == -1 else self.group_size)
        g = g.to(torch.int64)
        if g.numel() and (int(g.min()) < 0 or int(g.max()) >= s.shape[0]):
            raise HeadRankError(f"tensor {plan.parts.get('g_idx', plan.name)} names groups outside 0..{s.shape[0] - 1}")
        return ((q[:inp] - z[g]) * s[g]).mT.contiguous()  # (out, in), exact in float64


def _unpack(words: torch.Tensor, bits: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 words (rows, n) holding 32/bits codes each along the last axis -> float64 (rows, n·32/bits);
    ``order``: the position within each group of 32/bits of the code at bits ``bits·j`` (AWQ)."""
    import torch

    per = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    codes = (w[..., None] >> (torch.arange(per, dtype=torch.int64) * bits)) & ((1 << bits) - 1)  # (rows, n, per)
    if order is not None:
        codes = codes[..., list(_inverse(order))]
    return codes.reshape(words.shape[0], -1).to(torch.float64)


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(order)
    for j, pos in enumerate(order):
        inv[pos] = j
    return tuple(inv)
