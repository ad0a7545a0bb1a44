"""Writing a compressed checkpoint: safetensors shards of the same tensor names, plus the
source's small side files (config, tokenizer, pooling config), staged by the caller."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from headrank.errors import HeadRankError

SHARD_BYTES = 2 * 2**30
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx", ".ckpt")
_SKIP = ("optimizer", "scheduler", "scaler", "rng_state", "training_args", "trainer_state", "compress.json")
SIDE_DIR_BYTES = 4 * 2**20


class ShardWriter:
    """Collects tensors and writes safetensors shards of at most SHARD_BYTES each: one
    ``model.safetensors``, or ``model-0000i-of-0000N.safetensors`` with Hugging Face's index."""

    def __init__(self, stage: Path, shard_bytes: int = SHARD_BYTES):
        self.stage, self.shard_bytes = stage, shard_bytes
        self.cur: dict[str, torch.Tensor] = {}
        self.size = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total = 0
        self.names: set[str] = set()

    def add(self, name: str, t: torch.Tensor) -> None:
        if name in self.names:
            return
        n = t.numel() * t.element_size()
        if self.cur and self.size + n > self.shard_bytes:
            self.flush()
        self.cur[name] = t.detach().contiguous().clone()
        self.size += n
        self.total += n
        self.names.add(name)

    def flush(self) -> None:
        if not self.cur:
            return
        from safetensors.torch import save_file

        p = self.stage / f".shard-{len(self.shards)}.safetensors"
        try:
            save_file(self.cur, str(p), metadata={"format": "pt"})
        except OSError as e:
            raise HeadRankError(f"cannot write {p}: {e.strerror or e}") from None
        self.shards.append((p, list(self.cur)))
        self.cur, self.size = {}, 0

    def finish(self) -> list[str]:
        """Final names of the weight files (renamed within the stage)."""
        self.flush()
        n = len(self.shards)
        if n == 1:
            self.shards[0][0].rename(self.stage / "model.safetensors")
            return ["model.safetensors"]
        weight_map, files = {}, []
        for i, (p, names) in enumerate(self.shards, 1):
            name = f"model-{i:05d}-of-{n:05d}.safetensors"
            p.rename(self.stage / name)
            files.append(name)
            weight_map.update({k: name for k in names})
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.stage / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return [*files, "model.safetensors.index.json"]


def _is_side_file(p: Path) -> bool:
    name = p.name
    return (p.is_file() and not p.is_symlink() and not name.startswith(".")
            and not name.endswith(_WEIGHT_SUFFIXES) and not name.endswith(".index.json")
            and not any(name.startswith(s) for s in _SKIP) and p.stat().st_size < SIDE_DIR_BYTES)


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def copy_side_files(src: Path | None, stage: Path) -> list[str]:
    """Copy the config, tokenizer and other small non-weight files (and small subdirectories
    such as sentence-transformers' ``1_Pooling``) of a checkpoint directory."""
    if src is None or not src.is_dir():
        return []
    out = []
    for p in sorted(src.iterdir()):
        if _is_side_file(p):
            shutil.copyfile(p, stage / p.name)
            out.append(p.name)
        elif (p.is_dir() and not p.is_symlink() and not p.name.startswith((".", "checkpoint"))
              and _dir_bytes(p) < SIDE_DIR_BYTES
              and not any(q.name.endswith(_WEIGHT_SUFFIXES) for q in p.rglob("*"))):
            shutil.copytree(p, stage / p.name, symlinks=False)
            out.append(p.name + "/")
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
