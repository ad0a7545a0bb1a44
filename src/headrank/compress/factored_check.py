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
from headrank.io.validate import (
    BOUNDS,
    bounded,
    check_config_sizes,
    inside,
    read_json,
    regular_file,
)

MANIFEST = "factored.json"
FORMAT = "headrank-factored"
STEM = "factored-model"  # not `model`: see headrank.compress.factored
_SPEC_KEYS = {"keep", "features", "index", "role"}
_ROLE_KEEP = {"v": "rows", "q": "rows", "k": "rows", "o": "cols"}
#: what ``attn_implementation`` may name (transformers' own implementations)
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
MAX_MODULE_NAME = 1000


def manifest(path: Path) -> dict[str, dict[str, Any]]:
    """``factored.json``'s modules, each spec checked: keys, keep and role, features bounded, index
    runs ``[start, stop)`` of integers, sorted, disjoint, inside ``[0, features)``."""
    p = path / MANIFEST
    try:
        regular_file(p, "factored manifest")
    except HeadRankError:
        if not p.exists():
            raise HeadRankError(f"{path} holds no {MANIFEST}: not a factored compress output (a `format` dense "
                                "output loads with transformers' from_pretrained)") from None
        raise
    m = read_json(p, "factored manifest")
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("modules"), dict):
        raise HeadRankError(f"{p}: not a headrank factored manifest")
    mods = m["modules"]
    if not mods:
        raise HeadRankError(f"{p}: names no module (a factored output shrinks at least one projection)")
    bounded(len(mods), "count", "the number of modules", str(p))
    return {_name(name, p): _spec(spec, f"{p}: module {name[:80]!r}") for name, spec in mods.items()}


def _name(name: str, p: Path) -> str:
    if not name or len(name) > MAX_MODULE_NAME or not all(part.isidentifier() or part.isdigit()
                                                           for part in name.split(".")):
        raise HeadRankError(f"{p}: {name[:80]!r} is not a module name")
    return name


def _spec(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise HeadRankError(f"{where}: its entry must be an object; got {type(spec).__name__}")
    if not _SPEC_KEYS - {"role"} <= set(spec) <= _SPEC_KEYS:  # an older headrank wrote no role
        odd = sorted(set(spec) ^ _SPEC_KEYS)
        raise HeadRankError(f"{where}: its entry must hold {sorted(_SPEC_KEYS)} (role optional); differs in {odd}")
    role, keep = spec.get("role"), spec["keep"]
    if keep not in ("rows", "cols") or (role is not None and (not isinstance(role, str) or role not in _ROLE_KEEP
                                                              or keep != _ROLE_KEEP[role])):
        raise HeadRankError(f"{where}: role {str(role)[:20]!r} with keep {str(keep)[:20]!r} is not one of "
                            f"{', '.join(f'{r}/{k}' for r, k in _ROLE_KEEP.items())}")
    features = bounded(spec["features"], "ffn", "features", where)
    runs = spec["index"]
    if not isinstance(runs, list) or not runs or len(runs) > features:
        raise HeadRankError(f"{where}: index must be a list of 1 to {features:,} [start, stop) runs")
    at = 0
    for r in runs:
        if not (isinstance(r, list) and len(r) == 2):
            raise HeadRankError(f"{where}: an index run must be a pair [start, stop); got {str(r)[:60]}")
        a = bounded(r[0], "ffn", "an index run's start", where, lo=0)
        b = bounded(r[1], "ffn", "an index run's stop", where, lo=0)
        if not at <= a < b <= features:
            raise HeadRankError(f"{where}: index run [{a}, {b}) is empty, reversed, overlaps the one before or "
                                f"leaves [0, {features})")
        at = b
    return {**spec, "features": features}


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
