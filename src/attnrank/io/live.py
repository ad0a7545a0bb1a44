"""A live model seen as a checkpoint: the layout table reads its parameters in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from attnrank.errors import AttnRankError
from attnrank.io.checkpoint import Checkpoint


class LiveCheckpoint(Checkpoint):
    """A :class:`Checkpoint` view of a model in memory: the same layout path (prefix search,
    shape checks, per-head split) reads the live parameters instead of a file.

    ``config`` is the dict a saved checkpoint's ``config.json`` would hold; it defaults to
    ``model.config_dict()`` (attnrank models) or ``model.config.to_dict()`` (Hugging Face).
    """

    def __init__(self, model: nn.Module, config: dict[str, Any] | None = None):
        if config is None:
            if hasattr(model, "config_dict"):
                config = model.config_dict()
            elif hasattr(getattr(model, "config", None), "to_dict"):
                config = model.config.to_dict()
            else:
                raise AttnRankError(f"{type(model).__name__} has no config: pass config=")
        self.source = f"live:{type(model).__name__}"
        self.path = Path(".")
        self.config_path = Path(f"<{self.source}>")
        self.config = config
        self._tensors: dict[str, torch.Tensor] = {
            **dict(model.named_parameters(remove_duplicate=False)),
            **dict(model.named_buffers(remove_duplicate=False)),
        }
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

