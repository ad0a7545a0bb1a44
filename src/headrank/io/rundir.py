"""The run-directory format of ``headrank train`` (see :mod:`headrank.training.loop`)::

    RUN/config.json                  task, model and training settings, seed, versions
    RUN/metrics.jsonl                one JSON object per logged step, append-only
    RUN/checkpoints/step-00000500/   config.json + model.safetensors + state.pt
    RUN/summary.json                 written when the run finishes

One writer per run: :func:`locked_run` takes an exclusive ``flock`` on the directory ``RUN`` itself
for as long as a process writes the run (``train``, ``--resume``, a sweep worker). A second writer gets one
line (the holder's PID) instead of interleaving its rows into ``metrics.jsonl``. The kernel
drops the lock when its holder exits or is killed, so a crash never leaves a stale lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError
from headrank.io.validate import os_error, regular_file

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE = "state.pt"
STEP_DIR = "step-{:08d}"
LOCK = ".lock"  # the lock file of earlier versions (now the directory is locked): ignored where found


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of ``RUN/metrics.jsonl`` (a torn last line, left by a kill, is skipped)."""
    p = Path(run_dir) / METRICS
    if not p.exists():
        raise HeadRankError(f"no {METRICS} in {run_dir}")
    regular_file(p, "metrics file")
    try:
        text = p.read_text(errors="replace")
    except OSError as e:
        raise os_error(e, p) from None
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows




def checkpoint_dirs(run: Path) -> list[tuple[int, Path]]:
    root = run / CHECKPOINTS
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step-"):
            try:
                step = int(p.name[5:])
            except ValueError:
                continue
            if all((p / f).is_file() for f in ("config.json", "model.safetensors", STATE)):
                out.append((step, p))
    return sorted(out)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory of a run (readable by ``headrank spectra``)."""
    dirs = checkpoint_dirs(Path(run_dir))
    return dirs[-1][1] if dirs else None


@contextmanager
def locked_run(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the exclusive writer's lock of ``run_dir`` (created if missing) for the block: a
    ``flock`` on the directory itself (:func:`headrank.io.writer.lock_dir`; no lock file to
    plant a symlink at or to leave behind).

    Another live process holding it: HeadRankError naming the run and that process's PID, at
    once (no waiting).
    """
    from headrank.io.writer import lock_dir

    run = Path(run_dir)
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, run, "create the run directory") from None
    fd = lock_dir(run, f"run directory {run}")
    try:
        yield run
    finally:
        os.close(fd)  # releases the lock


def run_locked(run_dir: str | os.PathLike) -> bool:
    """Whether a live process holds the writer's lock of ``run_dir`` now."""
    from headrank.io.writer import dir_locked

    return dir_locked(run_dir)


def lock_holder(run_dir: str | os.PathLike) -> int | None:
    """The PID of the process writing ``run_dir`` now (None: none, or not known here)."""
    from headrank.io.writer import lock_holder as holder

    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return holder(fd) if run_locked(run_dir) else None
    finally:
        os.close(fd)
