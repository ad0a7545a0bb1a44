"""Test helpers: real inputs built from what ships offline."""

import json
import shutil
from dataclasses import dataclass

from safetensors.torch import load_file, save_file


def shard(src_dir, dst, n_shards=3, dtype=None):
    """Re-save a checkpoint as a sharded release with model.safetensors.index.json."""
    sd = load_file(src_dir / "model.safetensors")
    if dtype is not None:
        sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
    names = sorted(sd)
    dst.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for j in range(n_shards):
        part = names[j::n_shards]
        fname = f"model-{j + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: sd[k].contiguous() for k in part}, dst / fname)
        weight_map.update({k: fname for k in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(src_dir / "config.json", dst / "config.json")
    return dst


@dataclass(frozen=True)
class Profile:
    """The smallest study params: a ``profile`` name with ``quick()`` and ``full()`` (probe studies)."""

    profile: str = "full"

    @classmethod
    def quick(cls):
        return cls("quick")

    @classmethod
    def full(cls):
        return cls()
