"""compressed-tensors checkpoints (``quant_method: compressed-tensors``), read exactly
(docs/quantized.md; the scheme layer is :mod:`headrank.io.schemes`).

The format, as the compressed-tensors library (vLLM's) writes and reads it: ``config_groups``
name, per group, the modules it targets (``re:`` patterns, module names, or a class such as
``Linear``), the ``weights`` arguments (``num_bits``, ``type`` int or float, ``symmetric``,
``strategy`` tensor / channel / group / block, ``group_size``, ``block_structure``) and the
``format`` (per group, else the config's); ``ignore`` lists modules left unquantized. Per
quantized module:

- ``float-quantized``: ``weight`` float8 codes, ``weight_scale``;
- ``int-quantized`` / ``naive-quantized``: ``weight`` int8 codes, ``weight_scale``, and
  ``weight_zero_point`` (int8) when not symmetric;
- ``pack-quantized``: ``weight_packed`` int32 (the codes plus 2^(b-1), element i of a row at
  bits i·b of the row's bit stream), ``weight_shape`` (the unpacked shape), ``weight_scale``,
  and ``weight_zero_point`` packed the same way along the output dimension when not symmetric.

The weight is ``(code − zero point) × scale`` of the code's tensor, row, group of
``group_size`` input columns, or block (edge blocks partial, as the library pads them), in
float64, where it is exact. The library computes the same product in the scale's dtype, which
rounds it; rounding this one to the scale's dtype gives the library's numbers (the test). Read
only where the layout is unambiguous: ``num_bits`` dividing 32 for packed codes (other widths
were packed differently by older versions), no activation-ordered group index
(``weight_g_idx``), no ``tensor_group`` strategy (NVFP4) and none of the sparse or MX formats;
anything else is one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError
from headrank.io.quant_base import (
    FLOATS,
    FP8,
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

FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
AUX = (".weight_scale", ".weight_zero_point", ".weight_shape", ".weight_g_idx", ".input_scale",
       ".input_zero_point", ".weight_global_scale", ".input_global_scale")
MAX_DIM = 1 << 24


class CompressedTensors(Scheme):
    method = "compressed-tensors"
    aux_suffixes = AUX

    def __init__(self, qc: dict[str, Any], where: Any):
        super().__init__(qc, where)
        groups = qc.get("config_groups")
        self.status = qc.get("quantization_status", "compressed")
        if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
            raise HeadRankError(f"config {where}: compressed-tensors quantization_config has no config_groups object")
        self.groups = {name: self._group(name, g) for name, g in groups.items()}
        ignore = qc.get("ignore") or []
        self.ignore = [i for i in ignore if isinstance(i, str)] if isinstance(ignore, list) else []

    def _group(self, name: str, g: dict[str, Any]) -> dict[str, Any]:
        fmt = g.get("format") or self.qc.get("format") or "dense"
        targets = g.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise HeadRankError(f"config {self.where}: compressed-tensors group {name!r} has no list of targets")
        w = g.get("weights")
        if fmt == "dense" or w is None:
            return {"format": "dense", "targets": targets}
        if fmt not in FORMATS:
            raise HeadRankError(f"config {self.where}: compressed-tensors format {fmt!r} (group {name!r}) is not read by "
                                f"headrank: its tensors are codes, so nothing is read (read: {', '.join(FORMATS)})")
        if not isinstance(w, dict):
            raise HeadRankError(f"config {self.where}: compressed-tensors group {name!r}: weights must be an object")
        return {"format": fmt, "targets": targets, **self._args(name, fmt, w)}

    def _args(self, name: str, fmt: str, w: dict[str, Any]) -> dict[str, Any]:
        where = f"config {self.where}: compressed-tensors group {name!r}"
        bits, kind, strategy = w.get("num_bits", 8), w.get("type", "int"), w.get("strategy", "tensor")
        if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 8:
            raise HeadRankError(f"{where}: num_bits must be an integer in 1..8; got {bits!r}")
        if strategy not in ("tensor", "channel", "group", "block"):
            raise HeadRankError(f"{where}: weight strategy {strategy!r} is not read by headrank (read: tensor, channel, "
                                "group, block)")
        if kind not in ("int", "float") or (kind == "float") != (fmt == "float-quantized") or \
                (kind == "float" and bits != 8):
            raise HeadRankError(f"{where}: {bits}-bit {kind} weights in format {fmt!r} are not read by headrank")
        if fmt == "pack-quantized" and 32 % bits:
            raise HeadRankError(f"{where}: {bits}-bit packed codes are not read by headrank (compressed-tensors "
                                "versions packed widths that do not divide 32 in two different ways)")
        out = {"bits": bits, "kind": kind, "strategy": strategy, "symmetric": w.get("symmetric", True) is not False}
        if strategy == "group":
            gs = w.get("group_size")
            if not isinstance(gs, int) or isinstance(gs, bool) or not 1 <= gs <= MAX_DIM:
                raise HeadRankError(f"{where}: group strategy needs a positive integer group_size; got {gs!r}")
            out["group_size"] = gs
        if strategy == "block":
            bs = w.get("block_structure")
            if not isinstance(bs, list) or len(bs) != 2 or not all(
                    isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_DIM for b in bs):
                raise HeadRankError(f"{where}: block strategy needs block_structure [rows, cols]; got {bs!r}")
            out["block"] = (bs[0], bs[1])
        return out

    @property
    def label(self) -> str:
        parts = []
        for g in self.groups.values():
            if g["format"] == "dense":
                continue
            how = {"tensor": "per tensor", "channel": "per output row", "group": f"per group of {g.get('group_size')} "
                   "inputs", "block": "per {}x{} block".format(*g.get("block", (0, 0)))}[g["strategy"]]
            sym = "symmetric" if g["symmetric"] else "with zero points"
            parts.append(f"{g['format']} {g['bits']}-bit {g['kind']} {how}, {sym}")
        return "; ".join(parts) or "dense (no quantized weights)"

    def record(self) -> dict[str, Any]:
        return {**super().record(), "format": self.qc.get("format"), "quantization_status": self.status}

    # -- which group a tensor belongs to -------------------------------------------------------------
    def excluded(self, name: str) -> bool:
        module = name.rsplit(".", 1)[0]
        return _matches(module, self.ignore) or self._group_of(module) is None

    def _group_of(self, module: str) -> dict[str, Any] | None:
        specific = [g for g in self.groups.values() if _matches(module, [t for t in g["targets"] if _specific(t)])]
        generic = [g for g in self.groups.values() if any(not _specific(t) for t in g["targets"])]
        found = specific or generic
        if len(found) > 1:
            raise HeadRankError(f"config {self.where}: module {module} matches {len(found)} compressed-tensors config "
                                "groups; which one applies is ambiguous")
        return found[0] if found and found[0]["format"] != "dense" else None

    def role(self, name: str, names: set[str]) -> str | None:
        if name.endswith(".weight_packed"):
            return name[: -len("_packed")]
        return super().role(name, names)

    # -- plans ------------------------------------------------------------------------------------------
    def plan(self, name: str, metas: Mapping[str, TensorMeta], logical: str | None = None,
             read: Any = None) -> Plan | None:
        logical = logical or name
        module = logical.rsplit(".", 1)[0]
        if not logical.endswith(".weight") or self.status != "compressed" or _matches(module, self.ignore):
            return self._plain(name, metas)
        g = self._group_of(module)
        if g is None:
            return self._plain(name, metas)
        if metas[name].dtype in FLOATS:
            return Plan(logical, {"codes": name}, metas[name].shape, error=f"config {self.where} says "
                        f"compressed-tensors {g['format']} but tensor {name} is stored as {metas[name].dtype}: the "
                        "config contradicts the tensors")
        parts = {"codes": name, "scale": module + ".weight_scale"}
        if not g["symmetric"]:
            parts["zero"] = module + ".weight_zero_point"
        shape_name = module + ".weight_shape"
        missing = [p for p in (*parts.values(), *([shape_name] if g["format"] == "pack-quantized" else []))
                   if p not in metas]
        if module + ".weight_g_idx" in metas:
            return Plan(logical, parts, error=f"tensor {logical} has an activation-ordered group index "
                        f"({module}.weight_g_idx), which headrank does not read")
        if missing:
            return Plan(logical, parts, error=f"tensor {logical} is {g['format']} codes but {missing[0]} is missing: a "
                        "code is not a weight")
        shape = self._shape(g, parts, metas, shape_name, read)
        return Plan(logical, parts, shape, extra={"group": g})

    def _plain(self, name: str, metas: Mapping[str, TensorMeta]) -> Plan | None:
        m = metas[name]
        if name.endswith(".weight") and (m.dtype.startswith(("int", "uint")) or m.dtype in FP8):
            return Plan(name, {"codes": name}, m.shape, error=f"tensor {name} is stored as {m.dtype} but no "
                        "compressed-tensors config group that quantizes it applies: a code is not a weight")
        return None

    def _shape(self, g: dict[str, Any], parts: dict[str, str], metas: Mapping[str, TensorMeta], shape_name: str,
               read: Any) -> tuple[int, ...]:
        codes = metas[parts["codes"]]
        want = "int32" if g["format"] == "pack-quantized" else "float8_e4m3fn" if g["kind"] == "float" else "int8"
        if codes.dtype != want or len(codes.shape) != 2:
            raise HeadRankError(f"tensor {parts['codes']} is {codes.dtype} {list(codes.shape)}; {g['format']} "
                                f"{g['kind']} codes are a {want} matrix")
        if g["format"] != "pack-quantized":
            return tuple(codes.shape)
        sm = metas[shape_name]  # the unpacked shape: 2 integers, checked before it is read
        if not sm.dtype.startswith("int") or tuple(sm.shape) != (2,):
            raise HeadRankError(f"tensor {shape_name} must be 2 integers (the unpacked shape); it is {sm.dtype} "
                                f"{list(sm.shape)}")
        vals = [int(v) for v in read(shape_name).reshape(-1).tolist()]
        rows, words = codes.shape
        if vals[0] != rows or not 1 <= vals[1] <= MAX_DIM or ceil_div(vals[1] * g["bits"], 32) != words:
            raise HeadRankError(f"tensor {parts['codes']} packs {words} int32 words per row, which does not match its "
                                f"weight_shape {vals} at {g['bits']} bits ({shape_name})")
        return rows, vals[1]

    def check_parts(self, plan: Plan, metas: Mapping[str, TensorMeta]) -> None:
        g = plan.extra["group"]
        rows, cols = plan.shape
        check_scale_meta(plan.parts["scale"], metas[plan.parts["scale"]], _scale_shapes(g, rows, cols),
                         f"{g['strategy']} scales of {plan.name}")
        if "zero" in plan.parts:
            zm = metas[plan.parts["zero"]]
            shapes = _scale_shapes(g, rows, cols)
            packed = g["format"] == "pack-quantized" and g["strategy"] in ("group", "channel")
            if packed:
                shapes = tuple((ceil_div(s[0] * g["bits"], 32), *s[1:]) for s in shapes if len(s) == 2)
            check_scale_meta(plan.parts["zero"], zm, shapes, f"zero points of {plan.name}",
                             dtypes=("int32",) if packed else ("int8", "int32", "float32"))

    # -- arithmetic -----------------------------------------------------------------------------------
    def dequantize(self, plan: Plan, raw: dict[str, torch.Tensor], metas: Mapping[str, TensorMeta]) -> torch.Tensor:
        import torch

        g = plan.extra["group"]
        codes = raw["codes"]
        if g["format"] == "pack-quantized":
            rows, cols = plan.shape
            q = unpack(codes, g["bits"], cols, plan.parts["codes"])
        elif g["kind"] == "float":
            q, rows, cols = fp8_codes(plan.name, codes), *codes.shape
        else:
            q, (rows, cols) = codes.to(torch.float64), codes.shape
        s = finite_scale(plan.parts["scale"], raw["scale"])
        if tuple(s.shape) not in _scale_shapes(g, rows, cols):
            raise HeadRankError(f"scale tensor {plan.parts['scale']} has shape {list(s.shape)}; expected "
                                f"{list(_scale_shapes(g, rows, cols)[0])} ({g['strategy']} scales of {plan.name})")
        if "zero" in plan.parts:
            z = raw["zero"]
            if g["format"] == "pack-quantized" and g["strategy"] in ("group", "channel"):
                z = unpack(z.mT.contiguous(), g["bits"], rows, plan.parts["zero"]).mT
            q = q - _expand(z.to(torch.float64).reshape(s.shape), g, rows, cols)
        return _apply_scale(q, s, g, rows, cols)


def _specific(target: str) -> bool:
    """A target naming modules (``re:`` pattern or a dotted name) rather than a class (``Linear``)."""
    return target.startswith("re:") or "." in target or not target[:1].isupper()


def _matches(module: str, targets: list[str]) -> bool:
    for t in targets:
        if t.startswith("re:"):
            try:
                if re.match(t[3:], module):
                    return True
            except re.error:
                raise HeadRankError(f"compressed-tensors target {t!r} is not a valid regular expression") from None
        elif t == module or module.endswith("." + t):
            return True
    return False


def _scale_shapes(g: dict[str, Any], rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    s = g["strategy"]
    if s == "tensor":
        return (1,), (), (1, 1)
    if s == "channel":
        return (rows, 1), (rows,)
    if s == "group":
        return ((rows, ceil_div(cols, g["group_size"])),)
    return ((ceil_div(rows, g["block"][0]), ceil_div(cols, g["block"][1])),)


def unpack(packed: torch.Tensor, bits: int, cols: int, name: str) -> torch.Tensor:
    """Codes packed ``32 / bits`` per int32 word, element i of a row at bits ``i·bits``, stored plus
    2^(bits-1): as signed float64 codes (rows, ``cols``)."""
    import torch

    if packed.dtype != torch.int32 or packed.ndim != 2:
        raise HeadRankError(f"tensor {name} must be a 2-d int32 tensor of packed codes; it is {packed.dtype} "
                            f"{list(packed.shape)}")
    per = 32 // bits
    if packed.shape[1] != ceil_div(cols * bits, 32):
        raise HeadRankError(f"tensor {name} holds {packed.shape[1]} int32 words per row; {cols} {bits}-bit codes need "
                            f"{ceil_div(cols * bits, 32)}")
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per, dtype=torch.int64) * bits
    q = (words[..., None] >> shifts) & ((1 << bits) - 1)
    return q.reshape(packed.shape[0], -1)[:, :cols].to(torch.float64) - (1 << (bits - 1))


def _expand(x: torch.Tensor, g: dict[str, Any], rows: int, cols: int) -> torch.Tensor:
    """Per-tensor, per-row or per-group values broadcast to (rows, cols)."""
    if g["strategy"] == "tensor":
        return x.reshape(())
    if g["strategy"] == "channel":
        return x.reshape(rows, 1)
    if g["strategy"] == "group":
        return x.repeat_interleave(g["group_size"], dim=1)[:, :cols]
    raise HeadRankError("zero points with block scales are not read by headrank")


def _apply_scale(q: torch.Tensor, s: torch.Tensor, g: dict[str, Any], rows: int, cols: int) -> torch.Tensor:
    if g["strategy"] == "block":
        return mul_blocks(q, s, g["block"])
    return q * _expand(s, g, rows, cols)
