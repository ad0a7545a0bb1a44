"""The whole factored checkpoint checked before :func:`~.factored.load_compressed` builds a model.

A factored output is a directory anyone may have planted or damaged, read as ``spectra`` reads a
checkpoint (docs/compress.md, "Loading a factored output"): every file through the one reader of
planted files (:func:`headrank.io.validate.read_json`: a regular file, a byte cap, no FIFO), every
file name it names confined to the directory (:func:`~headrank.io.validate.inside`), every
number bounded (:data:`~headrank.io.validate.BOUNDS`) before anything is allocated from it, the
weight files' headers checked as safetensors checks them (:mod:`headrank.io.stfile`), and each
stored tensor's shape compared with the module it goes into. Each problem is one
:class:`~headrank.errors.HeadRankError` line naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError
from headrank.io.factored import FORMAT, MANIFEST, STEM, manifest  # noqa: F401 - re-exported
from headrank.io.validate import (
    BOUNDS,
    bounded,
    check_config_sizes,
    inside,
    read_json,
    regular_file,
)

#: what ``attn_implementation`` may name (transformers' own implementations)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def config(path: Path, dtype_bytes: int) -> dict[str, Any]:
    """config.json read and its sizes bounded, before transformers builds anything from it."""
    from headrank.io.checkpoint import read_config

    cfg = read_config(path)
    check_config_sizes(cfg, path / "config.json", dtype_bytes=dtype_bytes)
    return cfg


def weight_files(path: Path) -> list[Path]:
    """The weight files: the index's (a JSON object whose ``weight_map`` maps names to files in
    this directory) or the single file; each a regular file."""
    index = path / f"{STEM}.safetensors.index.json"
    if not index.exists() and not index.is_symlink():
        return [regular_file(path / f"{STEM}.safetensors", "weights file")]
    data = read_json(index, "shard index")
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not wm:
        raise HeadRankError(f"corrupt shard index {index}: its weight_map must be a non-empty object "
                            "(tensor name -> file)")
    files = sorted({str(f) if isinstance(f, str) else f for f in wm.values()}, key=str)
    return [regular_file(inside(path, f, f"shard index {index}"), "weights file") for f in files]


def compress_info(path: Path) -> dict[str, Any]:
    """compress.json's ``config`` block (head layout, position encoding), its sizes bounded; an
    empty dict where there is no compress.json."""
    p = path / "compress.json"
    if not p.exists() and not p.is_symlink():
        return {}
    rec = read_json(p, "compress record")
    info = rec.get("config") if isinstance(rec, dict) else None
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise HeadRankError(f"{p}: its config must be an object")
    where = f"{p} config"
    for key, kind in (("n_heads", "heads"), ("n_kv_heads", "heads"), ("head_dim", "head_dim"), ("n_layers", "layers")):
        if info.get(key) is not None:
            bounded(info[key], kind, key, where)
    if info.get("n_heads") and info.get("n_kv_heads") and int(info["n_heads"]) % int(info["n_kv_heads"]):
        raise HeadRankError(f"{where}: n_heads {info['n_heads']} is not a multiple of n_kv_heads {info['n_kv_heads']}")
    return info


def arguments(path: Any, dtype: Any, attn_implementation: Any, latent_kv: Any) -> Path:
    """``load_compressed``'s arguments checked (a path, a floating torch dtype or None, a known
    attention implementation or None, a bool)."""
    import os

    import torch

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise HeadRankError(f"`path` must be a directory path; got {type(path).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise HeadRankError(f"`dtype` must be a floating torch dtype (torch.float32, ...) or None; got {dtype!r:.60}")
    if attn_implementation is not None and attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise HeadRankError(f"`attn_implementation` must be one of {', '.join(ATTN_IMPLEMENTATIONS)}; "
                            f"got {attn_implementation!r:.60}")
    if not isinstance(latent_kv, bool):
        raise HeadRankError(f"`latent_kv` must be True or False; got {latent_kv!r:.60}")
    p = Path(path)
    if not p.is_dir():
        raise HeadRankError(f"{p} is not a directory: load_compressed needs a factored compress output")
    return p


def shapes(model: Any, sd: dict[str, Any], prefix: str, where: Path) -> None:
    """Every stored tensor the model takes has the shape of the parameter it goes into."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for k, t in sd.items():
        for cand in (k, k.removeprefix(prefix + "."), f"{prefix}.{k}"):
            if cand in want:
                if tuple(t.shape) != want[cand]:
                    raise HeadRankError(f"{where}: tensor {k} has shape {list(t.shape)}, but the model's {cand} "
                                        f"(config.json, factored.json) needs {list(want[cand])}")
                break


def in_attention(model: Any, full: str, where: Path) -> None:
    """A shrunk module lies inside an attention block (not the embeddings or the LM head)."""
    parts = full.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if "attention" in type(model.get_submodule(".".join(parts[:i]))).__name__.lower():
            return
    raise HeadRankError(f"{where / MANIFEST}: module {full!r} is not an attention projection")


#: what a bound of the count kind allows (the modules of a manifest, for messages)
MAX_MODULES = BOUNDS["count"]
