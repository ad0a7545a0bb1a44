"""The one way to pin threads: torch intra-op threads and numpy's BLAS threads."""

from __future__ import annotations

import torch

from attnrank.errors import AttnRankError


class torch_threads:
    """Context manager: torch intra-op threads and numpy's BLAS threads (via threadpoolctl,
    when installed) set to ``n`` (None: unchanged), then restored."""

    def __init__(self, n: int | None):
        self.n, self.prev, self.blas = n, None, None

    def __enter__(self):
        if self.n is not None:
            if self.n < 1:
                raise AttnRankError(f"threads must be >= 1, got {self.n}")
            self.prev = torch.get_num_threads()
            torch.set_num_threads(self.n)
            try:
                from threadpoolctl import threadpool_limits
            except ImportError:  # pragma: no cover - optional
                pass
            else:
                self.blas = threadpool_limits(limits=self.n)
        return self

    def __exit__(self, *exc):
        # BLAS/OpenMP limits first: threadpoolctl's restore also resets OpenMP's thread count,
        # which torch shares, so torch's own setting is restored last (a resumed training run
        # is bit-identical only if every kernel runs with the threads it had before).
        if self.blas is not None:
            self.blas.restore_original_limits()
        if self.prev is not None:
            torch.set_num_threads(self.prev)
        return False
