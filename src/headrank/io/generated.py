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
from functools import lru_cache
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError

GENERATED = Path(__file__).with_name("layouts_generated.json")


def cache_path() -> Path:
    """Where on-demand checks (``architectures --check``) are kept."""
    root = os.environ.get("HEADRANK_CACHE") or Path.home() / ".cache" / "headrank"
    return Path(root) / "layouts_checked.json"


def _load(p: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    types = data.get("types") if isinstance(data, dict) else None
    return {k: v for k, v in types.items() if isinstance(v, dict)} if isinstance(types, dict) else {}


@lru_cache(maxsize=1)
def _committed() -> dict[str, dict[str, Any]]:
    return _load(GENERATED)


def generated_rows() -> dict[str, dict[str, Any]]:
    """Every generated row by model type: the committed file, overridden by the local cache."""
    return {**_committed(), **_load(cache_path())}


def generated_version() -> str:
    try:
        return str(json.loads(GENERATED.read_text()).get("transformers", "?"))
    except (OSError, ValueError, AttributeError):
        return "?"


def save_rows(p: Path, rows: dict[str, dict[str, Any]], version: str) -> None:
    """Write ``rows`` (merged over what ``p`` holds) atomically."""
    have = _load(p)
    have.update(rows)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps({"transformers": version, "types": dict(sorted(have.items()))}, indent=1,
                              sort_keys=False) + "\n")
    os.replace(tmp, p)
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

