"""Writing a compressed checkpoint: safetensors shards of the same tensor names, plus the
source's small side files (config, tokenizer, pooling config), staged by the caller."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError  # imported here, never by the writing thread
from safetensors.torch import save_file

from headrank.errors import HeadRankError
from headrank.util.fileio import write_error

SHARD_BYTES = 2 * 2**30
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx", ".ckpt")
_SKIP = ("optimizer", "scheduler", "scaler", "rng_state", "training_args", "trainer_state", "compress.json",
         "factored.json")  # a factored source's manifest would mislabel the output
SIDE_DIR_BYTES = 4 * 2**20


class ShardWriter:
    """Collects tensors and writes safetensors shards of at most SHARD_BYTES each: one
    ``STEM.safetensors``, or ``STEM-0000i-of-0000N.safetensors`` with Hugging Face's index
    (stem ``model``: what ``from_pretrained`` reads). A full shard is written by a background
    thread while the next one fills (at most one write in flight; its error is raised by the
    next :meth:`flush` or :meth:`finish`); :meth:`close` waits for it."""

    def __init__(self, stage: Path, shard_bytes: int | None = None, dtype: torch.dtype | None = None,
                 stem: str = "model"):
        self.stage, self.dtype, self.stem = stage, dtype, stem
        self.shard_bytes = SHARD_BYTES if shard_bytes is None else shard_bytes
        self.cur: dict[str, torch.Tensor] = {}
        self.size = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total = 0
        self.dense = 0  # bytes the same tensors would take uncut (a factored tensor is smaller)
        self.names: set[str] = set()
        self.dtypes: set[str] = set()
        self._pool: Any = None
        self._pending: Any = None
        self._mask = _umask()  # read here: os.umask is process-wide, not for a background thread to flip

    def add(self, name: str, t: torch.Tensor, dense_numel: int | None = None, owned: bool = False) -> None:
        """Queue ``name``; floating tensors are cast to ``dtype`` when one was given. ``owned``:
        ``t`` is a fresh tensor nothing else holds (not copied again)."""
        if name in self.names:
            return
        if self.dtype is not None and t.is_floating_point() and t.dtype != self.dtype:
            t, owned = _cast(name, t, self.dtype), True
        n = t.numel() * t.element_size()
        if self.cur and self.size + n > self.shard_bytes:
            self.flush()
        t = t.detach()
        self.cur[name] = t.contiguous() if owned and t.is_contiguous() else t.contiguous().clone()
        self.size += n
        self.total += n
        self.dense += (t.numel() if dense_numel is None else dense_numel) * t.element_size()
        self.names.add(name)
        self.dtypes.add(str(t.dtype).removeprefix("torch."))

    def flush(self, wait: bool = False) -> None:
        """Write the shard collected so far (in the background unless ``wait``)."""
        self._wait()
        if not self.cur:
            return
        p = self.stage / f".shard-{len(self.shards)}.safetensors"
        self.shards.append((p, list(self.cur)))
        cur, self.cur, self.size = self.cur, {}, 0
        if wait:
            _save(cur, p, self.stage.parent, self._mask)
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="headrank-write")
        self._pending = self._pool.submit(_save, cur, p, self.stage.parent, self._mask)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for a write in flight (its error ignored: the caller is failing already)."""
        try:
            self._wait()
        except Exception:  # noqa: BLE001, S110 - the run's own error is the one to report
            pass
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def report(self, fmt: str) -> dict:
        """Bytes of the weight files written, and what the uncut tensors would take on disk."""
        written = sum((self.stage / f).stat().st_size for f in self.files)
        uncut = written + self.dense - self.total
        return {"format": fmt, "dtypes": sorted(self.dtypes), "bytes_written": written, "bytes_uncut": uncut,
                "share_saved": 1 - written / uncut if uncut else 0.0,
                "note": "bytes of the safetensors weight files; uncut: the same files with every tensor at its "
                        "uncut shape, in the dtypes written"}

    def finish(self) -> list[str]:
        """Final names of the weight files (renamed within the stage)."""
        self.flush(wait=True)
        self.close()
        n = len(self.shards)
        if n == 1:
            self.shards[0][0].rename(self.stage / f"{self.stem}.safetensors")
            self.files = [f"{self.stem}.safetensors"]
            return list(self.files)
        weight_map, files = {}, []
        for i, (p, names) in enumerate(self.shards, 1):
            name = f"{self.stem}-{i:05d}-of-{n:05d}.safetensors"
            p.rename(self.stage / name)
            files.append(name)
            weight_map.update({k: name for k in names})
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.stage / f"{self.stem}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        self.files = files
        return [*files, f"{self.stem}.safetensors.index.json"]


def _save(tensors: dict[str, torch.Tensor], p: Path, where: Path, mask: int) -> None:
    """Runs in the writing thread: imports nothing (the module imported safetensors)."""
    try:
        save_file(tensors, str(p), metadata={"format": "pt"})
        os.chmod(p, 0o666 & ~mask)  # safetensors writes 0600; a checkpoint is read by others
    except (OSError, SafetensorError) as e:
        raise _write_error(e, where) from None


def _cast(name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, or one line where the cast turns a finite value into ±Inf (float16's
    largest is 65504: never an infinite weight written silently)."""
    out = t.to(dtype)
    if out.is_floating_point() and not bool(torch.isfinite(out).all()) and bool(torch.isfinite(t).all()):
        big = float(t.detach().abs().max())
        raise HeadRankError(f"{name}: a value of magnitude {big:.4g} overflows {str(dtype).removeprefix('torch.')} "
                            f"(largest {torch.finfo(dtype).max:.6g}); use `dtype` bfloat16 or float32")
    return out


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_error(e: Exception, where: Path) -> HeadRankError:
    """The one line spectra gives for the same failure (safetensors reports an OS error as a
    SafetensorError whose message ends in "(os error N)"). Called in the writing thread: its
    imports are the module's."""

    if not isinstance(e, OSError):
        m = re.search(r"os error (\d+)", str(e))
        code = int(m.group(1)) if m else None
        e = OSError(code, os.strerror(code) if code else str(e)) if code else OSError(errno.EIO, str(e))
    return write_error(e, where)


def _side_name(name: str) -> bool:
    return (not name.startswith(".") and not name.endswith(_WEIGHT_SUFFIXES) and not name.endswith(".index.json")
            and not any(name.startswith(s) for s in _SKIP))


def _regular(p: Path, root: Path) -> int | None:
    """The size of ``p`` when it is a regular file, or a symlink to a regular file inside
    ``root`` (a Hub snapshot's links into its blobs); None for anything else (a link out of the
    checkpoint, a FIFO, a device)."""
    import stat

    try:
        st = p.lstat()
        if p.is_symlink():
            real = Path(os.path.realpath(p))
            if not real.is_relative_to(root):
                return None
            st = real.stat()
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _copy_tree(src: Path, dst: Path, root: Path, skipped: list[str], budget: list[int]) -> bool:
    """Copy the regular files of the side directory ``src`` (its own subdirectories too) into
    ``dst``, never through a link leading out of ``root``; False (nothing kept) when it holds
    weights or more than SIDE_DIR_BYTES."""
    dst.mkdir()
    for e in sorted(os.scandir(src), key=lambda e: e.name):
        p = Path(e.path)
        if e.name.endswith(_WEIGHT_SUFFIXES):
            return False
        if e.is_dir(follow_symlinks=False):
            if not _copy_tree(p, dst / e.name, root, skipped, budget):
                return False
            continue
        size = _regular(p, root)
        if size is None:
            skipped.append(str(p.relative_to(root)))
            continue
        budget[0] -= size
        if budget[0] < 0:
            return False
        _copy_file(p, dst / e.name)
    return True


def _copy_file(src: Path, dst: Path) -> None:
    """Copy one file whose path was checked; opened again without following a link the check did
    not see (a Hub snapshot's checked links are followed by their resolved path)."""
    real = Path(os.path.realpath(src))
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f, open(dst, "xb") as g:
        shutil.copyfileobj(f, g, 2**20)


def _root(src: Path) -> Path:
    """What a side file's link may point into: the checkpoint directory, or a Hub cache repo's
    folder for a snapshot (``.../snapshots/REV`` links into ``.../blobs``)."""
    real = Path(os.path.realpath(src))
    return real.parent.parent if real.parent.name == "snapshots" else real


def copy_side_files(src: Path | None, stage: Path, notes: list[str] | None = None) -> list[str]:
    """Copy the config, tokenizer and other small non-weight files (and small subdirectories
    such as sentence-transformers' ``1_Pooling``) of a checkpoint directory: regular files only,
    never through a link out of the checkpoint (each one skipped is named in ``notes``)."""
    if src is None or not src.is_dir():
        return []
    root, out, skipped = _root(src), [], []
    for p in sorted(src.iterdir()):
        if not _side_name(p.name):
            continue
        size = _regular(p, root)
        if size is not None:
            if size < SIDE_DIR_BYTES:
                _copy_file(p, stage / p.name)
                out.append(p.name)
            continue
        if p.is_dir() and not p.is_symlink() and not p.name.startswith("checkpoint"):
            if _copy_tree(p, stage / p.name, root, skipped, [SIDE_DIR_BYTES]):
                out.append(p.name + "/")
            else:
                shutil.rmtree(stage / p.name)
        elif p.is_symlink() or not p.is_dir():
            skipped.append(p.name)
    if skipped and notes is not None:
        notes.append(f"not copied (a link out of the checkpoint, or not a regular file): {', '.join(skipped[:5])}"
                     + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""))
    return out


def save_hf_side(model, stage: Path, tokenizer=None) -> list[str]:
    """config.json (without GGUF's quantization_config), generation config and tokenizer of a
    live Hugging Face model."""
    cfg = type(model.config).from_dict({k: v for k, v in model.config.to_dict().items()
                                        if k != "quantization_config"})
    cfg.architectures = [type(model).__name__]
    cfg.save_pretrained(stage)
    out = ["config.json"]
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(stage)
        out.append("generation_config.json")
    if tokenizer is not None:
        out += [Path(p).name for p in tokenizer.save_pretrained(stage)]
    return sorted(set(out))
