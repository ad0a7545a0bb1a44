"""A live model seen as a checkpoint: the layout table reads its parameters in memory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from headrank.errors import HeadRankError
from headrank.io.checkpoint import read_config
from headrank.io.tensor_source import BaseCheckpoint, TensorMeta, dtype_name


class LiveCheckpoint(BaseCheckpoint):
    """A checkpoint view of a model in memory: the same layout path (prefix search, shape
    checks, per-head split) reads the live parameters instead of a file.

    ``model``: an ``nn.Module`` (parameters and buffers by their dotted names) or a
    ``state_dict`` (a mapping of names to tensors). ``config`` is the dict a saved checkpoint's
    ``config.json`` would hold (or the path of one); for a module it defaults to
    ``model.config_dict()`` (headrank models) or ``model.config.to_dict()`` (Hugging Face).
    ``require_config=False`` (a layout given) lets it be empty. Anything else: HeadRankError.
    ``kind``: ``live`` (a module) or ``state_dict``.
    """

    def __init__(self, model: nn.Module | Mapping[str, torch.Tensor],
                 config: dict[str, Any] | str | os.PathLike | None = None, *, require_config: bool = True):
        if isinstance(config, (str, os.PathLike)):
            config = read_config(Path(config))
        if isinstance(model, nn.Module):
            kind = "live"
            tensors = {**dict(model.named_parameters(remove_duplicate=False)),
                       **dict(model.named_buffers(remove_duplicate=False))}
            tensors.update(_dense_views(model))
            if config is None:
                if hasattr(model, "config_dict"):
                    config = model.config_dict()
                elif hasattr(getattr(model, "config", None), "to_dict"):
                    config = model.config.to_dict()
        elif isinstance(model, Mapping) and model and all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
            kind, tensors = "state_dict", dict(model)
        else:
            raise HeadRankError(f"cannot analyse a {type(model).__module__}.{type(model).__qualname__}: pass an "
                                "nn.Module, a state_dict (name -> tensor), a path, a Hub id or a GGUF file")
        if config is None:
            if require_config:
                raise HeadRankError(f"{type(model).__name__} has no config: pass config= (a dict or a "
                                    "config.json) or layout= (a TOML layout)")
            config = {}
        self.kind = kind
        label = f"{kind}:{type(model).__name__}"
        super().__init__(tensors, source=label, path=label, config=config, config_path=f"<{label}>")

    def _read(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return t.detach()

    def _meta(self, name: str, t: torch.Tensor) -> TensorMeta:
        return TensorMeta(dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size(), None)


def _dense_views(model: nn.Module) -> dict[str, torch.Tensor]:
    """The uncut-shape tensors of modules that store only part of theirs and say how to rebuild
    them (``dense_parameters()``: a factored output's latent projections,
    :func:`headrank.compress.load_compressed`), under their parameters' names."""
    out: dict[str, torch.Tensor] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        dense = getattr(mod, "dense_parameters", None)
        if callable(dense):
            out.update({f"{name}.{k}" if name else k: t for k, t in dense().items()})
    return out


# -- TransformerLens ---------------------------------------------------------------------------------

_TL_WEIGHTS = ("W_Q", "W_K", "W_V", "W_O")


def _is_transformer_lens(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "transformer_lens"


def transformer_lens_view(obj: Any, config: Any, layout: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """What to read for a TransformerLens model (anything else is returned as it is, with ``{}``).

    - A TransformerLens 4 ``TransformerBridge`` wraps a Hugging Face model: that model
      (``original_model``) is read through the layout table, exactly as ``headrank spectra`` reads
      the same checkpoint (raw weights, grouped-query attention as stored, ``fold_norm`` available).
    - Any other object with TransformerLens' stacked weights ``W_Q``, ``W_K``, ``W_V`` of shape
      (layers, heads, d_model, d_head) and ``W_O`` of (layers, heads, d_head, d_model) — a
      ``HookedTransformer`` of TransformerLens 2/3, a bridge whose model the layout table does not
      know, or a compatible object — is read from those tensors (``q = x W_Q``: each head's
      ``W_Qᵀ`` is its rows of an ``nn.Linear`` weight, ``W_Oᵀ`` its columns of the output
      projection), with the weights as TransformerLens holds them (folded and centred if it did so).

    Returns ``(model or state_dict, config, layout, origin details)``."""
    if layout is not None or config is not None:
        return obj, config, layout, {}
    tl = _is_transformer_lens(obj)
    inner = obj.__dict__.get("original_model") if tl and hasattr(obj, "__dict__") else None
    if isinstance(inner, nn.Module) and hasattr(getattr(inner, "config", None), "to_dict"):
        from headrank.io.layouts import layout_model_types

        cfg = inner.config.to_dict()
        if cfg.get("model_type") in layout_model_types():
            # the bridge wraps each Hugging Face module: its parameters are named with
            # "._original_component" segments; without them they are the checkpoint's names
            named = {**dict(inner.named_parameters(remove_duplicate=False)),
                     **dict(inner.named_buffers(remove_duplicate=False))}
            tensors = {k.replace("._original_component", ""): v for k, v in named.items()}
            return tensors, cfg, None, {"transformer_lens": {
                "class": f"{type(obj).__module__}.{type(obj).__qualname__}",
                "read": "original_model (the wrapped Hugging Face model) through the layout table"}}
    if not all(isinstance(getattr(obj, n, None), torch.Tensor) for n in _TL_WEIGHTS):
        if tl:
            raise HeadRankError(f"cannot analyse a {type(obj).__qualname__}: it has neither a Hugging Face model "
                                "the layout table knows (original_model) nor W_Q, W_K, W_V, W_O")
        return obj, config, layout, {}
    return _from_stacked(obj)


def _from_stacked(obj: Any) -> tuple[dict[str, torch.Tensor], None, Any, dict[str, Any]]:
    from headrank.io.layouts import Dims, Layout

    wq, wk, wv, wo = (getattr(obj, n).detach() for n in _TL_WEIGHTS)
    if wq.ndim != 4 or wk.shape != wq.shape or wv.shape != wq.shape or wo.shape != wq.shape[:2] + wq.shape[2:][::-1]:
        raise HeadRankError(f"{type(obj).__qualname__}: W_Q, W_K, W_V must be (layers, heads, d_model, d_head) and "
                            f"W_O (layers, heads, d_head, d_model); got {tuple(wq.shape)}, {tuple(wk.shape)}, "
                            f"{tuple(wv.shape)}, {tuple(wo.shape)}")
    n_layers, n_heads, d, dh = (int(x) for x in wq.shape)
    tensors: dict[str, torch.Tensor] = {}
    for i in range(n_layers):
        for role, w in (("q", wq), ("k", wk), ("v", wv)):
            tensors[f"blocks.{i}.attn.{role}"] = w[i].permute(0, 2, 1).reshape(n_heads * dh, d)
        tensors[f"blocks.{i}.attn.o"] = wo[i].reshape(n_heads * dh, d).T
    cfg = getattr(obj, "cfg", None)
    position = str(getattr(cfg, "positional_embedding_type", "none") or "none")
    position = {"standard": "absolute", "shortformer": "absolute"}.get(position, position)
    position = position if position in ("absolute", "rotary", "alibi") else "none"
    dims = Dims(n_layers=n_layers, d=d, n_heads=n_heads, n_kv_heads=n_heads, head_dim=dh)
    layout = Layout(model_types=("transformer_lens",), tensors={r: f"blocks.{{i}}.attn.{r}" for r in "qkvo"},
                    dims=lambda c: dims, position=lambda c: position)
    return tensors, None, layout, {"transformer_lens": {
        "class": f"{type(obj).__module__}.{type(obj).__qualname__}",
        "read": "W_Q, W_K, W_V, W_O as TransformerLens holds them (grouped kv heads repeated per query head)",
        "model_name": str(getattr(cfg, "model_name", "") or "")}}
