"""Generated layout rows: model types whose layout was discovered from transformers' own module
and verified against its forward (``headrank.analysis.discover``, ``docs/architectures.md``).

``layouts_generated.json`` beside this file holds, per model type, either a row (``status``
``verified``: the projections' module paths with ``{i}`` for the layer, the split, which config
fields give the sizes, position encoding, QK-norm, the checked logit error and the transformers
version of the check) or a refusal (``status`` ``refused`` and a one-line ``reason``). The file is
written by ``benchmarks/discover_all.py`` (``headrank architectures --check TYPE`` checks one
type on demand and caches its result in ``$HEADRANK_CACHE`` or ``~/.cache/headrank``) and read
here without transformers being imported, except to fill sizes a config.json leaves at their
default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError
from headrank.io.validate import read_json, tensor_pattern

GENERATED = Path(__file__).with_name("layouts_generated.json")


def cache_path() -> Path:
    """Where on-demand checks (``architectures --check``) are kept."""
    from headrank.util.env import cache_root

    return cache_root() / "layouts_checked.json"  # the one cache root (XDG_CACHE_HOME honoured)


def _load(p: Path, *, trusted: bool = False) -> dict[str, dict[str, Any]]:
    """The rows a layout file holds, each checked (:func:`check_row`). A missing file holds none;
    the local cache, which any process may have written, is read as every planted file is (a
    regular file, capped: :func:`~headrank.io.validate.read_json`) and a garbage row in it is one
    line naming the file and the type. ``trusted``: the committed file (unreadable: no rows)."""
    if not p.exists() and not p.is_symlink():
        return {}
    try:
        data = read_json(p, "layout cache")
    except HeadRankError:
        if trusted:
            return {}
        raise
    types = data.get("types") if isinstance(data, dict) else None
    if not isinstance(types, dict):
        raise HeadRankError(f"{p}: not a layout cache (an object with \"types\"); remove it and check the "
                            "types again (headrank architectures)")
    return {str(k): check_row(k, v, p) for k, v in types.items()}


_DIM_FORMS = ("=1", "=n_heads", "=d/n_heads")
_DIM_KEYS = ("n_layers", "d", "n_heads", "n_kv_heads", "head_dim")


def check_row(model_type: Any, row: Any, where: Any) -> dict[str, Any]:
    """One generated row checked before anything is read through it: a status, a reason or
    module paths that use only ``{i}`` (:func:`~headrank.io.validate.tensor_pattern`: no
    ``{i:>2000000000}``), dims that name config fields, lists of names."""
    at = f"{where}: row {str(model_type)[:60]!r}"
    if not isinstance(row, dict) or row.get("status") not in ("verified", "refused"):
        raise HeadRankError(f"{at} is not a layout row (an object whose status is verified or refused); remove "
                            f"{where} or check {str(model_type)[:60]!r} again (headrank architectures)")
    if row["status"] == "refused":
        if not isinstance(row.get("reason", ""), str):
            raise HeadRankError(f"{at}: its reason must be text")
        return row
    parts = row.get("parts")
    if parts is not None:
        if not isinstance(parts, list) or not parts or not all(isinstance(x, dict) for x in parts):
            raise HeadRankError(f"{at}: parts must be a non-empty list of rows")
        for x in parts:
            _check_part(x, at)
            if not isinstance(x.get("attention"), str):
                raise HeadRankError(f"{at}: each part must name its attention")
        return row
    _check_part(row, at)
    return row


def _check_part(row: dict[str, Any], at: str) -> None:
    mods, dims = row.get("modules"), row.get("dims")
    if not isinstance(row.get("split"), str) or not isinstance(mods, dict) or not mods:
        raise HeadRankError(f"{at}: a verified row needs a split and its modules")
    for alt in [mods, *_list(row.get("alternatives", []), at, dict)]:
        for role, path in alt.items():
            tensor_pattern(path, f"{at} module {str(role)[:20]}", need_i=False)
    if not isinstance(dims, dict) or any(not isinstance(dims.get(k), str) for k in _DIM_KEYS):
        raise HeadRankError(f"{at}: dims must name a config field or a rule for each of {', '.join(_DIM_KEYS)}")
    for k in _DIM_KEYS:
        how = dims[k]
        if not (how in _DIM_FORMS or how.isidentifier() or (how.startswith("=len:") and how[5:].isidentifier())):
            raise HeadRankError(f"{at}: dims {k} {how[:40]!r} is neither a config field nor a known rule")
    mla = dims.get("mla")
    if mla is not None and (not isinstance(mla, dict) or not all(isinstance(v, str) for v in mla.values())
                            or not {"nope", "rope", "v", "q_in", "kv"} <= set(mla)):
        raise HeadRankError(f"{at}: dims mla must name nope, rope, v, q_in and kv config fields")
    _list(row.get("config_path", []), at, str)
    norm = row.get("norm")
    if norm is not None and not (isinstance(norm, dict) and isinstance(norm.get("name"), str)
                                 and isinstance(norm.get("kind"), str)):
        raise HeadRankError(f"{at}: norm must name a tensor and its kind")


def _list(v: Any, at: str, kind: type) -> list[Any]:
    if not isinstance(v, list) or not all(isinstance(x, kind) for x in v) or len(v) > 64:
        raise HeadRankError(f"{at}: expected a short list of {kind.__name__}; got {str(v)[:60]}")
    return v


@lru_cache(maxsize=1)
def _committed() -> dict[str, dict[str, Any]]:
    return _load(GENERATED, trusted=True)


def generated_rows() -> dict[str, dict[str, Any]]:
    """Every generated row by model type: the committed file, overridden by the local cache."""
    return {**_committed(), **_load(cache_path())}


def generated_version() -> str:
    try:
        return str(json.loads(GENERATED.read_text()).get("transformers", "?"))
    except (OSError, ValueError, AttributeError):
        return "?"


@contextmanager
def cache_locked(p: Path) -> Iterator[None]:
    """Hold an exclusive lock on the cache's directory for a read-modify-write of ``p``: two
    ``architectures --check`` at once each merge into what the other wrote (no lock file: the
    directory itself is locked, so nothing is created that a symlink could redirect)."""
    import fcntl

    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def save_rows(p: Path, rows: dict[str, dict[str, Any]], version: str) -> None:
    """Merge ``rows`` into what ``p`` holds now and write it atomically, under :func:`cache_locked`."""
    from headrank.util.fileio import write_json

    with cache_locked(p):
        have = _load(p)
        have.update(rows)
        write_json(p, {"transformers": version, "types": dict(sorted(have.items()))})
    _committed.cache_clear()


# -- sizes of a row from a config dict ----------------------------------------------------------
@lru_cache(maxsize=64)
def _defaults(model_type: str, path: tuple[str, ...]) -> dict[str, Any]:
    """transformers' default config of ``model_type`` (the sub-config at ``path``) as a dict."""
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.for_model(model_type)
        for k in path:
            cfg = getattr(cfg, k)
        return cfg.to_dict()
    except Exception:  # noqa: BLE001 - no defaults: a missing field is reported by the caller
        return {}


def row_config(row: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The (sub-)config dict a row's sizes are read from, defaults filled in."""
    sub = config
    path = tuple(row.get("config_path", ()))
    for k in path:
        nxt = sub.get(k)
        sub = nxt if isinstance(nxt, dict) else sub
    mt = str(sub.get("model_type") or config.get("model_type") or row.get("model_type", ""))
    base = _defaults(mt, path) if mt else {}
    return {**base, **sub}  # a null in config.json stays null (MLA: q_lora_rank null)


#: older config.json names of a per-layer list (transformers converts them on load)
_LIST_ALIASES = {"layers_block_type": ("hybrid_override_pattern", "layer_types"),
                 "layer_types": ("layers_block_type", "hybrid_override_pattern")}


def _layer_count(field: str, row: dict[str, Any], config: dict[str, Any], merged: dict[str, Any]) -> int:
    """The length of the per-layer list ``field`` (or an older name of it) as the config file gives
    it, before transformers' default: a default would count the default's layers."""
    raw = config
    for k in row.get("config_path", ()):
        raw = raw.get(k) if isinstance(raw.get(k), dict) else raw
    for src in (raw, merged):
        for name in (field, *_LIST_ALIASES.get(field, ())):
            if isinstance(src.get(name), (list, str)) and src[name]:
                return len(src[name])
    raise HeadRankError(f"config lacks {field!r} (n_layers) for model type {row.get('model_type')!r}")


def row_sizes(row: dict[str, Any], config: dict[str, Any]) -> dict[str, int]:
    """n_layers, d, n_heads, n_kv_heads, head_dim of a row for ``config`` (a config.json dict)."""
    c = row_config(row, config)
    spec = row["dims"]
    out: dict[str, int] = {}
    for key in ("n_layers", "d", "n_heads", "n_kv_heads", "head_dim"):
        how = spec[key]
        if how == "=1":
            val = 1
        elif how == "=n_heads":
            val = out["n_heads"]
        elif how == "=d/n_heads":
            val = out["d"] // out["n_heads"]
        elif how.startswith("=len:"):  # one entry per layer (Nemotron-H's layer kinds or its older pattern string)
            val = _layer_count(how[5:], row, config, c)
        else:
            val = c.get(how)
            if val is None and key == "head_dim":
                val = out["d"] // out["n_heads"]
            if val is None:
                raise HeadRankError(f"config lacks {how!r} ({key}) for model type {row.get('model_type')!r}")
        out[key] = val
    if "mla" in spec:
        nope, rope, v, kv = (c.get(spec["mla"][k]) for k in ("nope", "rope", "v", "kv"))
        q_in = c.get(spec["mla"]["q_in"]) or out["d"]  # q_lora_rank null: the query starts at q_proj
        if None in (nope, rope, v, kv):
            raise HeadRankError(f"config lacks an MLA size ({', '.join(spec['mla'].values())})")
        out["head_dim"] = nope
        out["mla"] = (nope, rope, v, q_in, kv)  # type: ignore[assignment]
    return out

