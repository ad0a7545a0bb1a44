"""Associative recall, fully online (a fresh batch every step), seeded and resumable.

Sequence format (docs/methods/training.md; sizes are *our choice*)::

    k_1 v_1 k_2 v_2 … k_n v_n q   →   v(q)

- key tokens are ``0 … n_keys−1``, value tokens ``n_keys … n_keys+n_values−1`` (disjoint
  ranges; ``vocab_size = n_keys + n_values``, no other tokens);
- the ``n`` keys of one sequence are distinct (drawn without replacement), values are drawn
  independently with replacement, so two keys may share a value;
- the query ``q`` is one of the sequence's keys, chosen uniformly; the target is the value
  that followed it. Sequence length ``2n + 1``; the loss and the accuracy are taken at the
  last position only (argmax over the whole vocabulary).
- default sizes: n = 4 pairs, 8 key tokens, 8 value tokens (vocabulary 16, length 9);
- optional ``n_queries = m > 1`` (multi-query recall): ``… k_n v_n q_1 a_1 … q_m`` with the
  loss at every query (the answers a_i = v(q_i) of earlier queries are part of the input).
- optional ``label_noise = p``: each target is replaced, with probability p, by a value token
  drawn uniformly, so the loss cannot reach 0 (the inputs keep the true answers).

Every batch is new, so training accuracy is an unbiased estimate of test accuracy.

The stream draws from its own ``torch.Generator`` (CPU), never from the global RNG, and its
whole state (the generator state and the number of batches drawn) is a dict of plain
tensors and ints (:class:`headrank.models.stream.SeededStream`), so a run restarted from a checkpoint sees
exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from headrank.errors import HeadRankError
from headrank.models.stream import SeededStream


@dataclass(frozen=True)
class RecallConfig:
    n_pairs: int = 4
    n_keys: int = 8
    n_values: int = 8
    n_queries: int = 1
    label_noise: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n_pairs", "n_keys", "n_values", "n_queries"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise HeadRankError(f"recall {name} must be a positive integer, got {v!r}")
        ln = self.label_noise
        if isinstance(ln, bool) or not isinstance(ln, int | float) or not 0.0 <= ln < 1.0:
            raise HeadRankError(f"recall label_noise must be a number in [0, 1), got {ln!r}")
        if self.n_pairs > self.n_keys:
            raise HeadRankError(f"n_pairs={self.n_pairs} distinct keys need n_keys >= n_pairs "
                                f"(got n_keys={self.n_keys})")

    @property
    def vocab_size(self) -> int:
        return self.n_keys + self.n_values

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + 2 * self.n_queries - 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["label_noise"]:
            del d["label_noise"]  # the default is left out: config.json of a noise-free run stays as before
        return {**d, "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                "format": "k1 v1 ... kn vn q -> v(q); keys 0..n_keys-1, values n_keys..vocab_size-1; "
                          "distinct keys per sequence, values with replacement; loss at the last position"}


def make_recall_batch(cfg: RecallConfig, batch_size: int, generator: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch: tokens (B, 2n+1) int64 and targets (B,) int64, on the CPU."""
    if batch_size <= 0:
        raise HeadRankError(f"batch size must be positive, got {batch_size}")
    B, n, m = batch_size, cfg.n_pairs, cfg.n_queries
    keys = torch.rand(B, cfg.n_keys, generator=generator).argsort(dim=1)[:, :n]
    values = torch.randint(cfg.n_keys, cfg.vocab_size, (B, n), generator=generator)
    which = torch.randint(0, n, (B, m), generator=generator)
    queries, answers = keys.gather(1, which), values.gather(1, which)
    x = torch.empty(B, 2 * (n + m), dtype=torch.long)
    x[:, 0:2 * n:2] = keys
    x[:, 1:2 * n:2] = values
    x[:, 2 * n::2] = queries
    x[:, 2 * n + 1::2] = answers
    x = x[:, :-1]  # the last answer is only a target
    y = answers.clone()
    if cfg.label_noise > 0:  # drawn after everything else: a noise-free stream is unchanged
        flip = torch.rand(B, m, generator=generator) < cfg.label_noise
        y = torch.where(flip, torch.randint(cfg.n_keys, cfg.vocab_size, (B, m), generator=generator), y)
    return x, (y[:, 0] if m == 1 else y)


class RecallStream(SeededStream):
    """An endless, seeded, resumable stream of fresh associative-recall batches."""

    def __init__(self, cfg: RecallConfig, batch_size: int, seed: int):
        super().__init__(batch_size, seed)
        self.cfg = cfg

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One fresh batch (:func:`make_recall_batch`)."""
        return make_recall_batch(self.cfg, self.batch_size, generator)


def query_positions(cfg: RecallConfig) -> torch.Tensor:
    """Positions of the queries in a sequence (the last position is the last query)."""
    return torch.arange(2 * cfg.n_pairs, cfg.seq_len, 2)


def recall_loss_and_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy and accuracy at the query positions. logits (B, T, V); targets (B,) for
    one query (the last position) or (B, m) for m queries (positions T−2m+1, T−2m+3, …, T−1)."""
    if targets.ndim == 1:
        targets = targets[:, None]
    m = targets.shape[1]
    T = logits.shape[1]
    at = logits[:, T - 2 * m + 1::2, :]
    loss = torch.nn.functional.cross_entropy(at.reshape(-1, at.shape[-1]), targets.reshape(-1))
    acc = (at.argmax(-1) == targets).float().mean()
    return loss, acc
