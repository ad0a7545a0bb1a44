"""The project's own transformer, in one readable file (nanoGPT-style: a dataclass config and
a handful of modules, nothing hidden).

Attention keeps **separate** ``q``, ``k``, ``v``, ``o`` projections (``nn.Linear``, weight =
(out, in), heads contiguous along ``out``; ``o`` is ``(d_model, n_heads·head_dim)``), so a
state_dict has exactly the tensor names the layout table reads:
``blocks.{i}.attn.q.weight`` … ``blocks.{i}.attn.o.weight``. :meth:`Transformer.save_pretrained`
writes ``config.json`` (``model_type: "headrank"`` plus ``n_layers``, ``d_model``, ``n_heads``,
``n_kv_heads``, ``head_dim``) and ``model.safetensors``, so ``headrank spectra DIR`` reads a
saved model through the same layout row as any other checkpoint.

Switches (all in :class:`ModelConfig`): layers, heads (and grouped-query kv heads), width, head
width, MLP on/off, skip connections on/off, norm placement ``pre`` / ``post`` / ``none``,
causal or bidirectional attention, learned absolute positions on/off, biases on/off, tied
input/output embeddings. :class:`ViT` is a small vision transformer built from the same
:class:`Block`.

A block computes, for ``norm="pre"`` (``N`` = LayerNorm, ``f`` = attention or MLP)::

    skip:    x ← x + f(N(x))          no skip:  x ← f(N(x))

for ``norm="post"``: ``x ← N(x + f(x))`` (no skip: ``x ← N(f(x))``); for ``norm="none"`` the
norms are identities. Pre-norm models end with a final norm before the head; the others don't.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from headrank.errors import HeadRankError, one_line
from headrank.util.fileio import write_atomic, write_json
from headrank.util.legacy import upgrade

NormPlacement = Literal["pre", "post", "none"]
MODEL_TYPE = "headrank"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class ModelConfig:
    """Sizes and switches of :class:`Transformer` (``head_dim`` defaults to d_model / n_heads,
    ``n_kv_heads`` to n_heads, ``d_mlp`` to 4·d_model)."""

    vocab_size: int = 64
    max_seq_len: int = 64
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    d_mlp: int | None = None
    mlp: bool = True
    skip: bool = True
    norm: NormPlacement = "pre"
    causal: bool = True
    learned_positions: bool = True
    bias: bool = False
    tie_embeddings: bool = False
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise HeadRankError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                                    "give head_dim explicitly")
            self.head_dim = self.d_model // self.n_heads
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "max_seq_len", "n_layers", "d_model", "n_heads", "n_kv_heads",
                     "head_dim", "d_mlp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise HeadRankError(f"model {name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise HeadRankError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.norm not in ("pre", "post", "none"):
            raise HeadRankError(f"norm must be 'pre', 'post' or 'none', got {self.norm!r}")
        if not self.init_std > 0:
            raise HeadRankError(f"init_std must be > 0, got {self.init_std}")

    def to_dict(self) -> dict[str, Any]:
        """The saved ``config.json``: ``model_type`` plus every field (the layout row's keys
        ``n_layers``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim`` among them)."""
        return {"model_type": MODEL_TYPE, "architecture": "Transformer", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) self-attention with separate q, k, v, o."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int, n_kv_heads: int | None = None,
                 causal: bool = True, bias: bool = False):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.n_kv_heads = n_kv_heads or n_heads
        self.causal = causal
        self.q = nn.Linear(d_model, n_heads * head_dim, bias=bias)
        self.k = nn.Linear(d_model, self.n_kv_heads * head_dim, bias=bias)
        self.v = nn.Linear(d_model, self.n_kv_heads * head_dim, bias=bias)
        self.o = nn.Linear(n_heads * head_dim, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, d)
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.n_kv_heads != self.n_heads:  # query head h uses kv head h // (H // Hkv)
            g = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # (B, H, T, dh)
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """The attention matrices (B, H, T, T) this layer would use on ``x``."""
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        return s.softmax(-1)


class MLP(nn.Module):
    def __init__(self, d_model: int, d_mlp: int, bias: bool = False):
        super().__init__()
        self.fc = nn.Linear(d_model, d_mlp, bias=bias)
        self.proj = nn.Linear(d_mlp, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def _norm(kind: NormPlacement, d: int, bias: bool) -> nn.Module:
    return nn.Identity() if kind == "none" else nn.LayerNorm(d, bias=bias)


class Block(nn.Module):
    """Attention (+ MLP) with the configured skip connections and norm placement."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.skip, self.placement = cfg.skip, cfg.norm
        self.attn_norm = _norm(cfg.norm, cfg.d_model, cfg.bias)
        self.attn = Attention(cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.n_kv_heads, cfg.causal, cfg.bias)
        self.mlp: MLP | None = MLP(cfg.d_model, cfg.d_mlp, cfg.bias) if cfg.mlp else None
        self.mlp_norm = _norm(cfg.norm, cfg.d_model, cfg.bias) if cfg.mlp else None

    def _sub(self, x: torch.Tensor, f: nn.Module, norm: nn.Module) -> torch.Tensor:
        if self.placement == "post":
            return norm(x + f(x) if self.skip else f(x))
        y = f(norm(x))  # pre-norm (or identity norm)
        return x + y if self.skip else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._sub(x, self.attn, self.attn_norm)
        if self.mlp is not None:
            x = self._sub(x, self.mlp, self.mlp_norm)
        return x


def _init_weights(module: nn.Module, std: float) -> None:
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)


class _Saveable(nn.Module):
    """save_pretrained / from_pretrained: config.json + model.safetensors, both atomic."""

    config: Any

    def config_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.state_dict().items()}
        # Tied weights are one tensor under two names: safetensors refuses shared storage,
        # so store the alias once (the embedding's name) and re-tie on load.
        for alias in self._tied_aliases():
            tensors.pop(alias, None)
        write_atomic(directory / WEIGHTS_NAME, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
        write_json(directory / "config.json", self.config_dict())
        return directory

    def _tied_aliases(self) -> list[str]:
        return []

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location: str | torch.device = "cpu"):
        from safetensors.torch import load_file

        directory = Path(directory)
        from headrank.io.validate import read_json

        cfg = upgrade(read_json(directory / "config.json", "config"))  # a regular file only
        model = cls.from_config_dict(cfg)
        try:
            state = load_file(str(directory / WEIGHTS_NAME), device=str(map_location))
        except Exception as e:  # missing or corrupt file
            raise HeadRankError(f"cannot read {directory / WEIGHTS_NAME}: {one_line(e, None)}") from None
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if m not in model._tied_aliases()]
        if missing or unexpected:
            raise HeadRankError(f"{directory} does not match its config: missing {missing[:3]}, "
                                f"unexpected {unexpected[:3]}")
        return model

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any]):
        raise NotImplementedError


class Transformer(_Saveable):
    """Decoder (``causal=True``) or encoder (``causal=False``) language-model transformer.

    ``forward(idx)`` maps token ids (B, T) to logits (B, T, vocab_size).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model) if config.learned_positions else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = _norm(config.norm if config.norm == "pre" else "none", config.d_model, config.bias)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        _init_weights(self, config.init_std)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def _tied_aliases(self) -> list[str]:
        return ["head.weight"] if self.config.tie_embeddings else []

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any]) -> Transformer:
        if cfg.get("model_type") != MODEL_TYPE or cfg.get("architecture", "Transformer") != "Transformer":
            raise HeadRankError(f"config is not a headrank Transformer: model_type={cfg.get('model_type')!r}, "
                                f"architecture={cfg.get('architecture')!r}")
        return cls(ModelConfig.from_dict(cfg))

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.config.max_seq_len:
            raise HeadRankError(f"sequence length {T} exceeds max_seq_len={self.config.max_seq_len}")
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(T, device=idx.device))
        return x

    def forward(self, idx: torch.Tensor, return_hidden: bool = False):
        """Logits (B, T, vocab); with ``return_hidden``, also the list of residual-stream
        states [embedding output, after block 0, …, after block L−1]."""
        x = self.embed(idx)
        hidden = [x]
        for block in self.blocks:
            x = block(x)
            hidden.append(x)
        logits = self.head(self.final_norm(x))
        return (logits, hidden) if return_hidden else logits


@dataclass
class ViTConfig:
    """A small vision transformer: square images cut into ``patch_size`` patches, a class
    token, learned positions, bidirectional blocks of the same :class:`Block`."""

    image_size: int = 32
    patch_size: int = 4
    channels: int = 3
    n_classes: int = 10
    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    d_mlp: int | None = None
    mlp: bool = True
    skip: bool = True
    norm: NormPlacement = "pre"
    bias: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.patch_size <= 0 or self.image_size <= 0 or self.image_size % self.patch_size:
            raise HeadRankError(f"image_size={self.image_size} must be a positive multiple of "
                                f"patch_size={self.patch_size}")
        if self.channels <= 0 or self.n_classes <= 0:
            raise HeadRankError("channels and n_classes must be positive")
        blocks = self.block_config()  # validates the shared fields
        self.head_dim, self.n_kv_heads, self.d_mlp = blocks.head_dim, blocks.n_kv_heads, blocks.d_mlp

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def block_config(self) -> ModelConfig:
        return ModelConfig(vocab_size=1, max_seq_len=self.n_patches + 1, n_layers=self.n_layers,
                           d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                           head_dim=self.head_dim, d_mlp=self.d_mlp, mlp=self.mlp, skip=self.skip,
                           norm=self.norm, causal=False, learned_positions=True, bias=self.bias,
                           init_std=self.init_std)

    def to_dict(self) -> dict[str, Any]:
        return {"model_type": MODEL_TYPE, "architecture": "ViT", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class ViT(_Saveable):
    """``forward(images)`` maps (B, C, H, W) images to class logits (B, n_classes)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        bc = config.block_config()
        self.patch_emb = nn.Linear(config.channels * config.patch_size**2, config.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.d_model))
        self.pos_emb = nn.Parameter(torch.zeros(1, config.n_patches + 1, config.d_model))
        self.blocks = nn.ModuleList(Block(bc) for _ in range(config.n_layers))
        self.final_norm = _norm(config.norm if config.norm == "pre" else "none", config.d_model, config.bias)
        self.head = nn.Linear(config.d_model, config.n_classes)
        _init_weights(self, config.init_std)
        nn.init.normal_(self.pos_emb, std=config.init_std)
        nn.init.normal_(self.cls_token, std=config.init_std)

    @classmethod
    def from_config_dict(cls, cfg: dict[str, Any]) -> ViT:
        if cfg.get("model_type") != MODEL_TYPE or cfg.get("architecture") != "ViT":
            raise HeadRankError("config is not a headrank ViT")
        return cls(ViTConfig.from_dict(cfg))

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) → (B, n_patches, C·p·p), patches in row-major order."""
        B, C, Hh, W = images.shape
        c = self.config
        if (C, Hh, W) != (c.channels, c.image_size, c.image_size):
            raise HeadRankError(f"images of shape {(C, Hh, W)} do not match the config "
                                f"{(c.channels, c.image_size, c.image_size)}")
        p = c.patch_size
        x = images.unfold(2, p, p).unfold(3, p, p)  # B, C, H/p, W/p, p, p
        return x.permute(0, 2, 3, 1, 4, 5).reshape(B, -1, C * p * p)

    def forward(self, images: torch.Tensor, return_hidden: bool = False):
        x = self.patch_emb(self.patchify(images))
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_emb
        hidden = [x]
        for block in self.blocks:
            x = block(x)
            hidden.append(x)
        logits = self.head(self.final_norm(x[:, 0]))
        return (logits, hidden) if return_hidden else logits


def load_model(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> Transformer | ViT:
    """Load a saved :class:`Transformer` or :class:`ViT` from its directory."""
    directory = Path(directory)
    from headrank.io.validate import read_json

    cfg = upgrade(read_json(directory / "config.json", "config"))  # a regular file only
    if not isinstance(cfg, dict):
        raise HeadRankError(f"{directory / 'config.json'} is not a JSON object")
    arch = cfg.get("architecture", "Transformer")
    return (ViT if arch == "ViT" else Transformer).from_pretrained(directory, map_location)
