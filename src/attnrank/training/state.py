"""A run's resumable state: a checkpoint directory ``RUN/checkpoints/step-NNNNNNNN/`` holds the
model (``config.json`` + ``model.safetensors``, readable by ``attnrank spectra``) and
``state.pt`` (optimizer, RNG, data stream, the loop's running window and the byte length of
``metrics.jsonl`` at that step: plain tensors and primitives, loaded with ``weights_only``).

:func:`save_checkpoint` writes into a temporary directory and renames it into place, so a
``step-*`` directory is always whole; :func:`load_checkpoint` restores every part of it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import IO, Any

import torch
import torch.nn as nn

from attnrank.errors import AttnRankError
from attnrank.io.rundir import CHECKPOINTS, STATE, STEP_DIR, checkpoint_dirs


def save_checkpoint(run: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
                    stream: Any, window: dict[str, Any], metrics_fh: IO[bytes], keep: int) -> Path:
    """Flush ``metrics_fh``, write checkpoint ``step`` atomically, keep the newest ``keep``."""
    metrics_fh.flush()
    os.fsync(metrics_fh.fileno())
    root = run / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / STEP_DIR.format(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp)
    state = {
        "step": step,
        "metrics_bytes": metrics_fh.tell(),
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "stream": stream.state_dict(),
        "window_loss": window["loss"].clone(),
        "window_acc": window["acc"].clone(),
        "window_n": window["n"],
    }
    torch.save(state, tmp / STATE)
    for f in tmp.iterdir():
        with open(f, "rb") as h:
            os.fsync(h.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    for _, old in checkpoint_dirs(run)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, stream: Any,
                    dev: torch.device) -> dict[str, Any]:
    """Restore model, optimizer, RNG and stream from ``ckpt``; return its state dict (step, window, bytes)."""
    from safetensors.torch import load_file

    try:
        weights = load_file(str(ckpt / "model.safetensors"), device=str(dev))
        state = torch.load(ckpt / STATE, map_location="cpu", weights_only=True)
    except Exception as e:
        raise AttnRankError(f"cannot read checkpoint {ckpt}: {' '.join(str(e).split())[:300]}") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m not in model._tied_aliases()]
    if missing or unexpected:
        raise AttnRankError(f"checkpoint {ckpt} does not match the model (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]})")
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    stream.load_state_dict(state["stream"])
    return state
