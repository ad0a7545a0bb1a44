"""A live model seen as a checkpoint: the layout table reads its parameters in memory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from attnrank.errors import AttnRankError
from attnrank.io.checkpoint import Checkpoint


class LiveCheckpoint(Checkpoint):
    """A :class:`Checkpoint` view of a model in memory: the same layout path (prefix search,
    shape checks, per-head split) reads the live parameters instead of a file.

    ``model``: an ``nn.Module`` (parameters and buffers by their dotted names) or a
    ``state_dict`` (a mapping of names to tensors). ``config`` is the dict a saved checkpoint's
    ``config.json`` would hold (or the path of one); for a module it defaults to
    ``model.config_dict()`` (attnrank models) or ``model.config.to_dict()`` (Hugging Face).
    ``require_config=False`` (a layout given) lets it be empty. Anything else: AttnRankError.
    """

    def __init__(self, model: nn.Module | Mapping[str, torch.Tensor],
                 config: dict[str, Any] | str | os.PathLike | None = None, *, require_config: bool = True):
        if isinstance(config, (str, os.PathLike)):
            from attnrank.io.checkpoint import read_config

            config = read_config(Path(config))
        if isinstance(model, nn.Module):
            kind = "live"
            tensors = {**dict(model.named_parameters(remove_duplicate=False)),
                       **dict(model.named_buffers(remove_duplicate=False))}
            if config is None:
                if hasattr(model, "config_dict"):
                    config = model.config_dict()
                elif hasattr(getattr(model, "config", None), "to_dict"):
                    config = model.config.to_dict()
        elif isinstance(model, Mapping) and model and all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
            kind, tensors = "state_dict", dict(model)
        else:
            raise AttnRankError(f"cannot analyse a {type(model).__module__}.{type(model).__qualname__}: pass an "
                                "nn.Module, a state_dict (name -> tensor), a path, a Hub id or a GGUF file")
        if config is None:
            if require_config:
                raise AttnRankError(f"{type(model).__name__} has no config: pass config= (a dict or a "
                                    "config.json) or layout= (a TOML layout)")
            config = {}
        self.kind = kind
        self.source = f"{kind}:{type(model).__name__}"
        self.path = Path(".")
        self.config_path = Path(f"<{self.source}>")
        self.config = dict(config)
        self._tensors: dict[str, torch.Tensor] = tensors
        self._index = {}
        self._handles = {}

    def keys(self) -> list[str]:
        return list(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._tensors[name].detach()
        except KeyError:
            raise AttnRankError(f"tensor {name!r} not found in {self.source}") from None

    def dtype(self, name: str) -> str:
        return str(self._tensors[name].dtype).removeprefix("torch.")

    @property
    def files(self) -> list[Path]:
        return []

