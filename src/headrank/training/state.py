"""A run's resumable state: a checkpoint directory ``RUN/checkpoints/step-NNNNNNNN/`` holds the
model (``config.json`` + ``model.safetensors``, readable by ``headrank spectra``) and
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

from headrank.errors import HeadRankError, one_line
from headrank.io.rundir import CHECKPOINTS, STATE, STEP_DIR, checkpoint_dirs


def save_checkpoint(run: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
                    stream: Any, window: dict[str, Any], metrics_fh: IO[bytes], keep: int) -> Path:
    """Flush ``metrics_fh``, write checkpoint ``step`` atomically, keep the newest ``keep`` (0: all)."""
    metrics_fh.flush()
    os.fsync(metrics_fh.fileno())
    root = run / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / STEP_DIR.format(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_checkpoint(tmp, step, model, opt, stream, window, metrics_fh)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and (err := _save_error(e, final)) is not None:
            raise err from None
        raise
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    if keep > 0:
        for _, old in checkpoint_dirs(run)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _write_checkpoint(tmp: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer, stream: Any,
                      window: dict[str, Any], metrics_fh: IO[bytes]) -> None:
    """The model and ``state.pt`` into ``tmp``, fsynced. ``state.pt`` is serialised in memory
    and written with an ordinary file write, so a full disk is an OSError (ENOSPC), not
    torch's "unexpected pos" from inside its zip writer."""
    import io

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
    buf = io.BytesIO()
    torch.save(state, buf)
    with open(tmp / STATE, "wb") as h:
        h.write(buf.getbuffer())
    for f in tmp.iterdir():
        with open(f, "rb") as h:
            os.fsync(h.fileno())


def _save_error(e: Exception, final: Path) -> HeadRankError | None:
    """One line for a checkpoint that could not be written: the OSError's own (no space left,
    permission denied, ...), or "no space" where a library hid ENOSPC in its own error
    (safetensors' "StorageFull") or the file system has no room left; None: not a write error."""
    from headrank.util.fileio import write_error

    if isinstance(e, OSError):
        return write_error(e, final, "write the checkpoint")
    text = str(e)
    try:
        st = os.statvfs(final.parent)
        full = st.f_bavail * st.f_frsize < (1 << 20)
    except OSError:
        full = False
    if "StorageFull" in text or "No space left" in text or "unexpected pos" in text and full:
        return HeadRankError(f"no space left on the device: cannot write the checkpoint {final}")
    return None


def parse_keep(text: str | int | None) -> int | None:
    """``--keep-checkpoints``: a positive count or ``all`` (0: every checkpoint is kept); None stays None."""
    if text is None or (isinstance(text, int) and not isinstance(text, bool)):
        if isinstance(text, int) and text < 0:
            raise HeadRankError(f"`keep_checkpoints` takes a positive number or 'all', got {text}")
        return text
    t = str(text).strip().lower()
    if t == "all":
        return 0
    if not t.isdigit() or int(t) < 1:
        raise HeadRankError(f"`keep_checkpoints` takes a positive number or 'all', got {text!r}")
    return int(t)


def load_checkpoint(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, stream: Any,
                    dev: torch.device) -> dict[str, Any]:
    """Restore model, optimizer, RNG and stream from ``ckpt``; return its state dict (step, window, bytes)."""
    from safetensors.torch import load_file

    try:
        weights = load_file(str(ckpt / "model.safetensors"), device=str(dev))
        state = torch.load(ckpt / STATE, map_location="cpu", weights_only=True)
    except Exception as e:
        raise HeadRankError(f"cannot read checkpoint {ckpt}: {one_line(e, 300)}") from None
    check_state(state, ckpt / STATE)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m not in model._tied_aliases()]
    if missing or unexpected:
        raise HeadRankError(f"checkpoint {ckpt} does not match the model (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]})")
    try:
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        stream.load_state_dict(state["stream"])
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as e:  # parts of the wrong shape
        raise HeadRankError(f"{ckpt / STATE} does not fit this run: {one_line(e, 200)}") from None
    return state


# what state.pt must hold, and of which type (bool is not an int here)
_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "step": (int,), "metrics_bytes": (int,), "window_n": (int,), "optimizer": (dict,), "stream": (dict,),
    "torch_rng": (torch.Tensor,), "cuda_rng": (list, tuple), "window_loss": (torch.Tensor,),
    "window_acc": (torch.Tensor,)}


def check_state(state: Any, where: Path) -> None:
    """``state.pt`` as :func:`save_checkpoint` writes it: every part present with its type (a
    step that is a string, or no optimizer, is one line naming the part)."""
    if not isinstance(state, dict):
        raise HeadRankError(f"{where} is not a training state (a dict), got {type(state).__name__}")
    for key, types in _STATE_TYPES.items():
        if key not in state:
            raise HeadRankError(f"{where} has no {key!r}: not a complete training state")
        v = state[key]
        if not isinstance(v, types) or isinstance(v, bool):
            raise HeadRankError(f"{where}: {key!r} must be {' or '.join(t.__name__ for t in types)}, "
                                f"got {type(v).__name__} {str(v)[:40]!r}")
    if state["step"] < 0 or state["metrics_bytes"] < 0 or state["window_n"] < 0:
        raise HeadRankError(f"{where}: step, metrics_bytes and window_n must be >= 0")
    if not isinstance(state["optimizer"].get("state"), dict) or not isinstance(
            state["optimizer"].get("param_groups"), list):
        raise HeadRankError(f"{where}: 'optimizer' is not an optimizer state (state, param_groups)")
