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


def write_gguf_tensors(w, tensors, qtypes=None, raw=None):
    """Add ``tensors`` ({gguf name: array}) to the gguf ``GGUFWriter`` ``w`` and write the file:
    1-D and F32 ones as float32, ``qtypes`` ({name suffix: type}) as F16 or quantized by gguf,
    ``raw`` ({gguf name: (uint8 blocks, type)}) as they are."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as Q

    for name, arr in tensors.items():
        if raw and name in raw:
            blocks, t = raw[name]
            w.add_tensor(name, blocks, raw_dtype=t)
            continue
        t = next((t for suffix, t in (qtypes or {}).items() if name.endswith(suffix)), Q.F32)
        if arr.ndim == 1 or t == Q.F32:
            w.add_tensor(name, arr.astype(np.float32))
        elif t == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()



def smollm2() -> str | None:
    """The shipped SmolLM2-135M GGUF's path (``headrank spectra smollm2``), None without its package."""
    from headrank.errors import HeadRankError
    from headrank.io.checkpoint import shipped_model_path

    try:
        return str(shipped_model_path("smollm2"))
    except HeadRankError:
        return None


class Stopped(Exception):
    """Raised by :func:`track_stopped_after_first`'s progress callback."""


def track_stopped_after_first(sources, out) -> None:
    """``track(sources, out)`` stopped once its first checkpoint is measured (a run cut short)."""
    import pytest

    from headrank.analysis.series import track

    def stop(done, total):
        if done == 1:
            raise Stopped

    with pytest.raises(Stopped):
        track(sources, out, workers=1, plots=False, progress=stop)
