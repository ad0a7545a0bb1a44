"""Declarative layout table: model_type → attention tensors → per-head factors.

Conventions (REFERENCE.md §1), PyTorch ``nn.Linear`` layout ``weight = (out, in)``:

- ``W_Q,h, W_K,h, W_V,h ∈ R^{dh×d}`` are head h's rows of the projection weights;
- ``P_h ∈ R^{d×dh}`` is head h's column block of the output projection ``W_O`` (d × H·dh);
- QK product ``W_K,hᵀ W_Q,h`` = ``A Bᵀ`` with ``A = W_K,hᵀ``, ``B = W_Q,hᵀ``;
- OV product ``P_h W_V,h`` = ``A Bᵀ`` with ``A = P_h``, ``B = W_V,hᵀ``;
- grouped-query attention: query head h uses kv head ``h // (H // Hkv)``.

Each row of the table names, for one family of ``model_type``, the per-layer tensor names
(relative to a prefix found in the checkpoint, e.g. ``bert.`` in a BertForMaskedLM file),
how to read the model's sizes from its config, and how the raw tensors split into heads
(``split``). Adding an architecture is adding a row; nothing else here knows about models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .checkpoint import Checkpoint
from .errors import AttnRankError


@dataclass(frozen=True)
class Dims:
    n_layers: int
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self):
        if min(self.n_layers, self.d, self.n_heads, self.n_kv_heads, self.head_dim) <= 0:
            raise AttnRankError(f"config gives non-positive sizes: {self}")
        if self.n_heads % self.n_kv_heads:
            raise AttnRankError(f"{self.n_heads} query heads do not divide into {self.n_kv_heads} kv heads")


@dataclass(frozen=True)
class HeadWeights:
    """One layer's attention weights split per head (float32 or stored dtype, as read)."""

    wq: torch.Tensor  # (H, dh, d)
    wk: torch.Tensor  # (Hkv, dh, d)
    wv: torch.Tensor  # (Hkv, dh, d)
    p: torch.Tensor  # (H, d, dh): column blocks of W_O

    @property
    def group(self) -> int:
        return self.wq.shape[0] // self.wk.shape[0]

    def kv_for_query_heads(self, w: torch.Tensor) -> torch.Tensor:
        """Repeat kv-head tensors so index h is the kv head used by query head h."""
        return w.repeat_interleave(self.group, dim=0) if self.group > 1 else w

    def qk_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B), each (H, d, dh), with ``A Bᵀ = W_K,hᵀ W_Q,h``."""
        return self.kv_for_query_heads(self.wk).mT, self.wq.mT

    def ov_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B), each (H, d, dh), with ``A Bᵀ = P_h W_V,h``."""
        return self.p, self.kv_for_query_heads(self.wv).mT


def _split_separate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                    dims: Dims) -> HeadWeights:
    """Separate (out, in) projections, heads contiguous along ``out``; W_O is (d, H·dh)."""
    H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
    return HeadWeights(
        wq=q.reshape(H, dh, d),
        wk=k.reshape(Hkv, dh, d),
        wv=v.reshape(Hkv, dh, d),
        p=o.reshape(d, H, dh).permute(1, 0, 2),
    )


SPLITS: dict[str, Callable[..., HeadWeights]] = {"separate": _split_separate}


def _bert_dims(c: dict[str, Any]) -> Dims:
    H = int(c["num_attention_heads"])
    d = int(c["hidden_size"])
    return Dims(int(c["num_hidden_layers"]), d, H, H, int(c.get("head_dim") or d // H))


@dataclass(frozen=True)
class Layout:
    """How one family of model_type stores its attention."""

    model_types: tuple[str, ...]
    q: str
    k: str
    v: str
    o: str
    dims: Callable[[dict[str, Any]], Dims]
    split: str = "separate"
    biases: tuple[str, ...] = ()
    rotary: Callable[[dict[str, Any]], bool] = field(default=lambda c: False)
    qk_norm: Callable[[dict[str, Any]], bool] = field(default=lambda c: False)

    def names(self, i: int) -> dict[str, str]:
        return {r: t.format(i=i) for r, t in (("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o))}

    def expected_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
        return {"q": (H * dh, d), "k": (Hkv * dh, d), "v": (Hkv * dh, d), "o": (d, H * dh)}


def _attnrank_dims(c: dict[str, Any]) -> Dims:
    return Dims(int(c["n_layers"]), int(c["d_model"]), int(c["n_heads"]),
                int(c.get("n_kv_heads") or c["n_heads"]), int(c["head_dim"]))


_BERT = "encoder.layer.{i}.attention."
_OWN = "blocks.{i}.attn."
LAYOUTS: tuple[Layout, ...] = (
    Layout(
        model_types=("bert", "roberta"),
        q=_BERT + "self.query.weight",
        k=_BERT + "self.key.weight",
        v=_BERT + "self.value.weight",
        o=_BERT + "output.dense.weight",
        biases=(_BERT + "self.query.bias", _BERT + "self.key.bias", _BERT + "self.value.bias",
                _BERT + "output.dense.bias"),
        dims=_bert_dims,
        rotary=lambda c: c.get("position_embedding_type", "absolute") not in ("absolute", None),
    ),
    # The project's own model (attnrank.model): separate bias-free-or-not q/k/v/o Linear layers.
    Layout(
        model_types=("attnrank",),
        q=_OWN + "q.weight",
        k=_OWN + "k.weight",
        v=_OWN + "v.weight",
        o=_OWN + "o.weight",
        biases=(_OWN + "q.bias", _OWN + "k.bias", _OWN + "v.bias", _OWN + "o.bias"),
        dims=_attnrank_dims,
    ),
)


def supported_model_types() -> list[str]:
    return sorted(t for lay in LAYOUTS for t in lay.model_types)


def layout_for(config: dict[str, Any]) -> Layout:
    mt = config.get("model_type")
    for lay in LAYOUTS:
        if mt in lay.model_types:
            return lay
    raise AttnRankError(
        f"unsupported model_type {mt!r}; supported: {', '.join(supported_model_types())}"
    )


class AttentionReader:
    """Reads one layer at a time from a checkpoint and splits it into per-head weights."""

    def __init__(self, ckpt: Checkpoint, layout: Layout | None = None):
        self.ckpt = ckpt
        self.layout = layout or layout_for(ckpt.config)
        try:
            self.dims = self.layout.dims(ckpt.config)
        except (KeyError, TypeError, ValueError) as e:
            raise AttnRankError(f"config {ckpt.config_path} lacks or garbles a size field: {e}") from None
        self.prefix = self._find_prefix()

    def _find_prefix(self) -> str:
        q0 = self.layout.names(0)["q"]
        prefixes = sorted({k[: -len(q0)] for k in self.ckpt.keys() if k.endswith(q0)})
        prefixes = [p for p in prefixes if p == "" or p.endswith(".")]
        if not prefixes:
            raise AttnRankError(
                f"checkpoint has no tensor named like {q0!r}: weights do not match "
                f"model_type {self.ckpt.config.get('model_type')!r}"
            )
        return prefixes[0]  # shortest (sorted): the base model's own weights

    def tensor_names(self, i: int) -> dict[str, str]:
        return {r: self.prefix + n for r, n in self.layout.names(i).items()}

    def read_layer(self, i: int) -> HeadWeights:
        if not 0 <= i < self.dims.n_layers:
            raise AttnRankError(f"layer {i} out of range 0..{self.dims.n_layers - 1}")
        shapes = self.layout.expected_shapes(self.dims)
        raw = {}
        for role, name in self.tensor_names(i).items():
            t = self.ckpt.get(name)
            if tuple(t.shape) != shapes[role]:
                raise AttnRankError(
                    f"tensor {name} has shape {tuple(t.shape)} but the config implies {shapes[role]}"
                )
            raw[role] = t
        return SPLITS[self.layout.split](raw["q"], raw["k"], raw["v"], raw["o"], self.dims)

    def dtypes(self) -> list[str]:
        return sorted({self.ckpt.dtype(n) for n in self.tensor_names(0).values()})

    def biases_present(self) -> bool:
        return any(self.prefix + b.format(i=0) in self.ckpt for b in self.layout.biases)
