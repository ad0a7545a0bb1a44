"""The one compute setting (:class:`Compute`: threads, device, precision; :func:`computing`), the one
way to pin threads (torch intra-op threads and numpy's BLAS threads), and the one default: the
cores idle now (:func:`default_threads`, :class:`IdleCores`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from headrank.errors import HeadRankError
from headrank.util.constraints import PER_CPU, PRECISION, cpus, max_threads  # noqa: F401 - the bound's home; kept importable here

T = TypeVar("T")
R = TypeVar("R")


def check_threads(n: object, name: str = "threads") -> int:
    """``n`` as a count of threads (or, ``name`` ``workers``, worker processes): the one bound,
    declared in :mod:`headrank.util.constraints` (1 to :func:`max_threads`)."""
    from headrank.util.constraints import THREADS, WORKERS

    param = {"threads": THREADS, "workers": WORKERS}.get(name) or replace(THREADS, name=name)
    if n is None:
        raise HeadRankError(f"`{name}` must be an integer ({param.bounds()}); got None")
    return param.check(n)


def cgroup_cpus(root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this process's cgroup in cores (``cpu.max``, cgroup v2; ``cpu.cfs_quota_us``
    / ``cpu.cfs_period_us``, v1), or None when there is none (or it cannot be read)."""
    try:
        with open(os.path.join(root, "cpu.max")) as fh:
            quota, period = fh.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as fh:
            quota = int(fh.read())
        with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as fh:
            period = int(fh.read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def core_budget() -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's CPU quota."""
    n = cpus()
    quota = cgroup_cpus()
    return max(1, min(n, int(quota))) if quota is not None else n


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - no load average on this platform
        return 0.0


def default_threads(budget: int | None = None, load: float | None = None) -> int:
    """Worker threads when the user names none: the cores idle now, i.e. :func:`core_budget`
    minus the 1-minute load average (rounded), at least 1. The one default of ``spectra`` (CLI
    and Python API alike); ``--threads N`` pins it instead."""
    budget = core_budget() if budget is None else budget
    load = _load_average() if load is None else load
    return max(1, min(budget, int(budget - load + 0.5)))


def _host_busy_s() -> float | None:
    """Seconds of CPU time the whole machine has spent busy (``/proc/stat``: all but idle and
    iowait), or None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # less idle, iowait; no guest
    return busy / os.sysconf("SC_CLK_TCK")


_OWN_PIDS: set[int] = set()  # helper processes of this run (spectra's figure process): their CPU is the run's own


def count_as_own(pid: int, own: bool = True) -> None:
    """Count process ``pid``'s CPU as this run's own in :class:`IdleCores` (a helper process it
    started, e.g. the figure process importing matplotlib beside the first layers), not as other
    processes' load; ``own=False`` stops counting it."""
    (_OWN_PIDS.add if own else _OWN_PIDS.discard)(pid)


def _pid_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live (or not yet reaped) process, 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15
    except (OSError, ValueError, IndexError):
        return 0.0


class IdleCores:
    """Follows the idle cores during a run: :func:`default_threads` at the start, then, at each
    :meth:`threads` call (between layers), the budget minus what *other* processes used since the
    last call (the machine's busy CPU time from ``/proc/stat`` less this process's own and its
    helpers' (:func:`count_as_own`), over the wall time), so that this run's own threads never
    count as load against it. ``pinned``: a
    fixed count (``--threads N``), returned unchanged. Never fewer than 1 or more than the budget.
    The first interval starts when this module was imported if that was at most FRESH_S ago (a
    command's start-up: long enough for the kernel's 10 ms accounting by the first layer), else
    at construction.
    """

    MIN_INTERVAL_S = 0.05  # shorter intervals are noise at the kernel's 10 ms accounting
    FRESH_S = 5.0  # the module's import mark starts the first interval if it is at most this old

    def __init__(self, threads: int | None = None):
        self.pinned = threads  # --threads N: returned unchanged
        self.budget = core_budget()
        self.current = threads if threads is not None else default_threads(self.budget)
        self.history: list[int] = [self.current]
        now = self._sample()
        # the first interval: from this module's import (a command's start-up) when that was recent,
        # so the first layer already follows what runs now, not the 1-minute load average
        self._mark = _IMPORTED if _IMPORTED[1] is not None and now[0] - _IMPORTED[0] <= self.FRESH_S else now

    @staticmethod
    def _sample() -> tuple[float, float | None, float]:
        t = os.times()  # this process, and its children once reaped; helpers still running from /proc
        own = t.user + t.system + t.children_user + t.children_system + sum(map(_pid_cpu_s, tuple(_OWN_PIDS)))
        return time.monotonic(), _host_busy_s(), own

    def threads(self) -> int:
        """The count for the next layer (re-measured unless pinned)."""
        if self.pinned is not None:
            return self.pinned
        now = self._sample()
        wall = now[0] - self._mark[0]
        if wall >= self.MIN_INTERVAL_S and now[1] is not None and self._mark[1] is not None:
            others = max(0.0, (now[1] - self._mark[1]) - (now[2] - self._mark[2])) / wall
            self.current = max(1, min(self.budget, int(self.budget - others + 0.5)))
            self._mark = now
            self.history.append(self.current)
        return self.current


class torch_threads:
    """Context manager: torch intra-op threads (when torch is imported) and numpy's BLAS threads
    (via threadpoolctl, when installed) set to ``n`` (None: unchanged), then restored."""

    def __init__(self, n: int | None):
        self.n, self.prev, self.blas = n, None, None

    def __enter__(self):
        if self.n is not None:
            check_threads(self.n)
            torch = sys.modules.get("torch")  # not imported: nothing of torch's to pin
            if torch is not None:
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
            sys.modules["torch"].set_num_threads(self.prev)
        return False


def parallel_map(fn: Callable[[T], R], items: Sequence[T], threads: int = 1) -> list[R]:
    """``[fn(x) for x in items]``, on up to ``threads`` threads when ``threads`` > 1.

    For torch work that releases the GIL: run it under ``torch_threads(1)`` so that each task
    is one thread's, and a core taken by another process delays one task, not every one.
    """
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="headrank") as ex:
        return list(ex.map(fn, items))


def _gpu_present() -> bool:
    """A GPU driver is loaded (NVIDIA or ROCm device nodes): only then is torch imported to ask."""
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version", "/dev/kfd"))


def resolve_device(device: object) -> str | None:
    """``--device``: ``"auto"`` (or None), ``"cpu"``, ``"cuda"``, ``"cuda:N"`` → None for the CPU
    (numpy's LAPACK, no torch) or the torch device to compute on. ``auto`` takes a CUDA GPU when
    torch sees one and imports torch only where a GPU driver is present; ``cuda`` without one is
    one line."""
    from headrank.util.constraints import DEVICE

    if device is None:
        device = "auto"
    DEVICE.check(device)
    if device == "cpu" or (device == "auto" and not _gpu_present()):
        return None
    import torch

    if not torch.cuda.is_available():
        if device == "auto":
            return None
        raise HeadRankError(f"`device` {device}: torch sees no CUDA GPU here (torch.cuda.is_available() is "
                            "False); use `device` cpu or auto")
    if ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
        raise HeadRankError(f"`device` {device}: torch sees {torch.cuda.device_count()} CUDA GPU(s), "
                            f"numbered from 0")
    return "cuda" if device == "auto" else device


#: the precisions a product's Grams may be formed in (docs/methods/precision.md): ``auto`` (from
#: the stored bfloat16 values, float32 accumulation in chunks summed in float64, a per-head error
#: bound and a float64 fallback) and ``float64`` (every step in float64)
PRECISIONS = PRECISION.choices


@dataclass(frozen=True)
class Compute:
    """The one compute setting, set once per command (:func:`computing`) and read where the work
    is done (:func:`compute_setting`), under the same names from the CLI flag to the call:
    ``threads`` (threads sharing a layer's heads; the BLAS and torch threads are pinned to 1 inside
    each), ``device`` (None: the CPU through numpy's LAPACK; a torch device string: torch there,
    as :func:`resolve_device` returns it) and ``precision`` (:data:`PRECISIONS`). Results never
    depend on ``threads``."""

    threads: int = 1
    device: str | None = None
    precision: str = "auto"


_COMPUTE: ContextVar[Compute] = ContextVar("headrank_compute", default=Compute())  # noqa: B039 (frozen)


def compute_setting() -> Compute:
    """The compute setting in force (outside any :func:`computing`: one thread, the CPU, ``auto``,
    which computes in float64 unless the factors are stored in bfloat16)."""
    return _COMPUTE.get()


def check_precision(precision: object) -> str:
    """``precision`` as one of :data:`PRECISIONS`, else one line."""
    return PRECISION.check(precision)


@contextmanager
def computing(**changes: Any) -> Iterator[Compute]:
    """Context: the compute setting with ``changes`` (``threads``, ``device``, ``precision``),
    checked, in force inside; restored after. Worker threads do not inherit it: read it
    (:func:`compute_setting`) where a layer's work is scheduled, in the calling thread."""
    if "threads" in changes:
        changes["threads"] = check_threads(changes["threads"])
    if "precision" in changes:
        changes["precision"] = check_precision(changes["precision"])
    token = _COMPUTE.set(replace(_COMPUTE.get(), **changes))
    try:
        yield _COMPUTE.get()
    finally:
        _COMPUTE.reset(token)


_IMPORTED = IdleCores._sample()  # when this module was imported (IdleCores' first interval starts here)
