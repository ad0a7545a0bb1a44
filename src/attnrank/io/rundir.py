"""The run-directory format of ``attnrank train`` (see :mod:`attnrank.training.loop`)::

    RUN/config.json                  task, model and training settings, seed, versions
    RUN/metrics.jsonl                one JSON object per logged step, append-only
    RUN/checkpoints/step-00000500/   config.json + model.safetensors + state.pt
    RUN/summary.json                 written when the run finishes
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnrank.errors import AttnRankError
from attnrank.io.validate import os_error, regular_file

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE = "state.pt"
STEP_DIR = "step-{:08d}"


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of ``RUN/metrics.jsonl`` (a torn last line, left by a kill, is skipped)."""
    p = Path(run_dir) / METRICS
    if not p.exists():
        raise AttnRankError(f"no {METRICS} in {run_dir}")
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
    """The newest complete checkpoint directory of a run (readable by ``attnrank spectra``)."""
    dirs = checkpoint_dirs(Path(run_dir))
    return dirs[-1][1] if dirs else None
