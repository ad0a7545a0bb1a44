"""The one way to pin threads: torch intra-op threads and numpy's BLAS threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from headrank.errors import HeadRankError

T = TypeVar("T")
R = TypeVar("R")


def cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - no affinity on this platform
        return os.cpu_count() or 1


PER_CPU = 4  # oversubscription allowed: a test asking for 2 workers still runs on a 1-CPU machine


def max_threads() -> int:
    """The most threads or worker processes a command may ask for: :data:`PER_CPU` per CPU."""
    return PER_CPU * cpus()


def check_threads(n: object, name: str = "threads") -> int:
    """``n`` as a count of threads or worker processes: an integer from 1 to
    :func:`max_threads`. More would only slow everything down, and a million threads crash
    OpenBLAS's thread creation (SIGSEGV) instead of failing."""
    import numbers

    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise HeadRankError(f"`{name}` must be an integer, got {str(n)[:40]!r}")
    if not 1 <= n <= max_threads():
        raise HeadRankError(f"`{name}` must lie in 1..{max_threads()} ({PER_CPU} per CPU this process may use; "
                            f"1 is best on a shared machine), got {n}")
    return int(n)


class torch_threads:
    """Context manager: torch intra-op threads and numpy's BLAS threads (via threadpoolctl,
    when installed) set to ``n`` (None: unchanged), then restored."""

    def __init__(self, n: int | None):
        self.n, self.prev, self.blas = n, None, None

    def __enter__(self):
        if self.n is not None:
            check_threads(self.n)
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


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int = 1) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``workers`` threads when ``workers`` > 1.

    For torch work that releases the GIL: run it under ``torch_threads(1)`` so that each task
    is one thread's, and a core taken by another process delays one task, not every one.
    """
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(workers, len(items)), thread_name_prefix="headrank") as ex:
        return list(ex.map(fn, items))
