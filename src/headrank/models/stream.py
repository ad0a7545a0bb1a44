"""The one seeded, resumable batch stream: a task's stream draws every batch from its own
CPU ``torch.Generator`` (never the global RNG), and its whole state is plain tensors and ints,
so a run restarted from a checkpoint sees exactly the batches an uninterrupted run would have."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from headrank.errors import HeadRankError


class SeededStream:
    """Base of the data streams: ``next()`` counts the batch and calls :meth:`draw` with the
    stream's generator; :meth:`state_dict` / :meth:`load_state_dict` save and restore the
    generator and the count (a state from another seed or batch size is refused)."""

    def __init__(self, batch_size: int, seed: int):
        if batch_size <= 0:
            raise HeadRankError(f"batch size must be positive, got {batch_size}")
        self.batch_size, self.seed = batch_size, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.batches = 0

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One (x, y) batch from ``generator`` (subclasses)."""
        raise NotImplementedError

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) batch."""
        self.batches += 1
        return self.draw(self.generator)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()

    def state_dict(self) -> dict[str, Any]:
        """Generator state, batches drawn, seed and batch size (plain tensors and ints)."""
        return {"generator": self.generator.get_state(), "batches": self.batches, "seed": self.seed,
                "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a stream with the same seed and batch size)."""
        if state.get("seed") != self.seed or state.get("batch_size") != self.batch_size:
            raise HeadRankError("data-stream state belongs to another seed or batch size")
        self.generator.set_state(state["generator"])
        self.batches = int(state["batches"])
