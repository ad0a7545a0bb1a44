"""LoRA adapters (PEFT's saved format) on top of their base checkpoint.

An adapter directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (or
``adapter_model.bin``, read with ``weights_only=True``): for every targeted linear layer
``M``, ``base_model.model.M.lora_A.weight`` (r × in) and ``...lora_B.weight`` (out × r). The
adapted weight is PEFT's merge ``W + s · B A`` with ``s = lora_alpha / r`` (``lora_alpha / √r``
with ``use_rslora``), transposed for ``fan_in_fan_out`` (GPT-2's Conv1D).

:class:`AdaptedCheckpoint` serves the base's tensors with the update added to the targeted
ones, so the ordinary reader analyses the adapted products. :class:`DeltaReader` (``--delta``)
analyses what the adapter changed: ``W_K'ᵀ W_Q' − W_Kᵀ W_Q`` and ``P' W_V' − P W_V``, exactly,
as products of stacked factors ``[W_K', −W_K]ᵀ [W_Q', W_Q]`` (inner size 2·dh).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from headrank.errors import HeadRankError, one_line
from headrank.io.checkpoint import _TorchFile
from headrank.io.layouts import AttentionReader, HeadWeights
from headrank.io.tensor_source import BaseCheckpoint, TensorMeta
from headrank.io.validate import as_float, check_dtype, check_readable, read_json

ADAPTER_CONFIG = "adapter_config.json"
_PREFIX = "base_model.model."


def is_adapter_dir(path: Path) -> bool:
    """A directory holding a PEFT adapter (``adapter_config.json``)."""
    return path.is_dir() and (path / ADAPTER_CONFIG).is_file()


def read_adapter_config(path: Path) -> dict[str, Any]:
    """``adapter_config.json`` as a dict, checked to be a LoRA adapter headrank can merge."""
    p = path / ADAPTER_CONFIG
    cfg = read_json(p, "adapter config")
    if not isinstance(cfg, dict):
        raise HeadRankError(f"{p} is not a JSON object")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise HeadRankError(f"{p}: adapter type {cfg.get('peft_type')!r} is not supported (LoRA only)")
    if cfg.get("use_dora"):
        raise HeadRankError(f"{p}: DoRA adapters are not supported (their merge rescales W by a magnitude vector)")
    if cfg.get("alpha_pattern"):
        raise HeadRankError(f"{p}: per-module alpha_pattern is not supported")
    return cfg


def _adapter_tensors(path: Path) -> dict[str, torch.Tensor]:
    st, pt = path / "adapter_model.safetensors", path / "adapter_model.bin"
    if st.is_file():
        from safetensors import safe_open

        check_readable(st, "adapter weights file")
        try:
            with safe_open(str(st), framework="pt") as h:
                return {k: h.get_tensor(k) for k in h.keys()}
        except Exception as e:  # corrupt or truncated
            raise HeadRankError(f"cannot read {st}: {one_line(e, 200)}") from None
    if pt.is_file():
        f = _TorchFile(pt)
        return {k: f.get_tensor(k) for k in f.keys()}
    raise HeadRankError(f"{path}: no adapter_model.safetensors or adapter_model.bin")


class AdaptedCheckpoint(BaseCheckpoint):
    """The base checkpoint with each LoRA-targeted weight replaced by ``W + s · B A`` (float64);
    ``source``, ``path`` and ``config`` are the base's."""

    stored_tensors = False  # reads its base's tensors, already through the base's scheme layer

    def __init__(self, adapter: Path, base: BaseCheckpoint):
        self.adapter_path, self.base = adapter, base
        self.stamps.update(base.stamps)  # the base's files, then the adapter's (io.identity)
        for f in (ADAPTER_CONFIG, "adapter_model.safetensors", "adapter_model.bin"):
            if (adapter / f).is_file():
                self.stamps.add(adapter / f)  # before they are read
        self.adapter_config = cfg = read_adapter_config(adapter)
        tensors = _adapter_tensors(adapter)
        self.fan_in_fan_out = bool(cfg.get("fan_in_fan_out", False))
        self.rslora = bool(cfg.get("use_rslora", False))
        self.alpha = as_float(cfg.get("lora_alpha", cfg.get("r", 8)), "lora_alpha", str(adapter / ADAPTER_CONFIG))
        self._lora: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.ignored: list[str] = []
        base_keys = base.keys()
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                if not key.endswith(".lora_B.weight"):
                    self.ignored.append(key)
                continue
            module = key[: -len(".lora_A.weight")]
            b = tensors.get(module + ".lora_B.weight")
            for t, n in ((a, key), (b, module + ".lora_B.weight")):
                if t is not None:
                    check_dtype(n, t.dtype, adapter)
            if a.ndim != 2 or a.shape[0] == 0:
                raise HeadRankError(f"{adapter}: {key} has shape {tuple(a.shape)}; a LoRA A matrix is rank x in "
                                    "(2-d, rank >= 1)")
            if b is None or b.ndim != 2 or a.shape[0] != b.shape[1]:
                raise HeadRankError(f"{adapter}: {module} has no matching lora_B of rank {a.shape[0]} (out x rank)"
                                    + ("" if b is None else f"; its lora_B has shape {tuple(b.shape)}"))
            self._lora[self._base_name(module, base_keys)] = (a, b)
        if not self._lora:
            raise HeadRankError(f"{adapter}: the adapter holds no lora_A / lora_B weights")
        super().__init__(dict.fromkeys(base_keys), source=base.source, path=base.path, config=base.config,
                         config_path=base.config_path)

    def _base_name(self, module: str, base_keys: list[str]) -> str:
        rel = module.removeprefix(_PREFIX)
        parts = rel.split(".")
        for k in range(len(parts)):  # the full path, then without leading wrappers ("model.", ...)
            name = ".".join(parts[k:]) + ".weight"
            if name in self.base:
                return name
        hits = [n for n in base_keys if n.endswith("." + rel.split(".", 1)[-1] + ".weight")]
        if len(hits) == 1:
            return hits[0]
        raise HeadRankError(f"adapter {self.adapter_path} does not match the base {self.base.source}: "
                            f"it updates {rel}, which the base does not have")

    def scaling(self, r: int) -> float:
        """PEFT's ``s``: ``lora_alpha / r`` (``/ √r`` with rsLoRA)."""
        return self.alpha / (math.sqrt(r) if self.rslora else r)

    def update(self, name: str) -> torch.Tensor | None:
        """``s · B A`` in the stored orientation of ``name`` (float64), or None if not targeted."""
        if name not in self._lora:
            return None
        a, b = self._lora[name]
        d = (b.to(torch.float64) @ a.to(torch.float64)) * self.scaling(a.shape[0])
        return d.T if self.fan_in_fan_out else d

    @property
    def targets(self) -> list[str]:
        """The base tensors the adapter updates."""
        return sorted(self._lora)

    @property
    def ranks(self) -> list[int]:
        """The adapter's LoRA ranks."""
        return sorted({int(a.shape[0]) for a, _ in self._lora.values()})

    def _read(self, name: str, entry: Any) -> torch.Tensor:
        w = self.base.get(name)
        d = self.update(name)
        if d is None:
            return w
        if tuple(d.shape) != tuple(w.shape):
            raise HeadRankError(f"adapter {self.adapter_path} does not match the base {self.base.source}: "
                                f"its update of {name} is {tuple(d.shape)}, the base weight {tuple(w.shape)}")
        return w.to(torch.float64) + d

    def _meta(self, name: str, entry: Any) -> TensorMeta:
        m = self.base.meta(name)
        return replace(m, dtype="float64 (adapted)", nbytes=None) if name in self._lora else m

    def release(self) -> None:
        self.base.release()

    @property
    def files(self) -> list[Any]:
        return self.base.files

    def close(self) -> None:
        self.base.close()


class DeltaReader(AttentionReader):
    """Reads the adapter's change of each product: factors ``[new, old]`` stacked so that
    ``A Bᵀ`` is ``W_K'ᵀ W_Q' − W_Kᵀ W_Q`` (QK) and ``P' W_V' − P W_V`` (OV); rank ≤ 2·dh."""

    def __init__(self, ckpt: AdaptedCheckpoint, layout: Any = None, **kw: Any):
        super().__init__(ckpt, layout, **kw)
        self.base_reader = AttentionReader(ckpt.base, self.layout, fold_norm=self.norm is not None)

    def read_layer(self, i: int) -> HeadWeights:
        new, old = super().read_layer(i), self.base_reader.read_layer(i)
        f = lambda t: t.to(torch.float64)  # noqa: E731
        return HeadWeights(wq=torch.cat([f(new.wq), f(old.wq)], 1), wk=torch.cat([f(new.wk), -f(old.wk)], 1),
                           wv=torch.cat([f(new.wv), f(old.wv)], 1), p=torch.cat([f(new.p), -f(old.p)], 2))

    @property
    def weights_note(self) -> str:
        return ("adapter delta: each product is the adapted one minus the base's (W_K'^T W_Q' - W_K^T W_Q, "
                "P' W_V' - P W_V), from stacked factors of inner size 2*dh; the balance and bound columns "
                "describe those stacked factors. " + super().weights_note)


def adapter_origin(ckpt: AdaptedCheckpoint, delta: bool) -> dict[str, Any]:
    """What meta.json says about an adapter source."""
    cfg = ckpt.adapter_config
    ranks = ckpt.ranks
    return {"input": "adapter", "adapter": {
        "path": str(ckpt.adapter_path.resolve()), "base": ckpt.base.source, "peft_type": "LORA",
        "r": ranks, "lora_alpha": ckpt.alpha, "use_rslora": ckpt.rslora, "scaling": [ckpt.scaling(r) for r in ranks],
        "fan_in_fan_out": ckpt.fan_in_fan_out, "target_modules": cfg.get("target_modules"),
        "updated_tensors": len(ckpt.targets), "ignored_tensors": ckpt.ignored[:20],
        "products": "adapted minus base (--delta)" if delta else "adapted: W + scaling * B A (PEFT's merge)"}}
