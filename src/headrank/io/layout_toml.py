"""Layouts a user describes in a small TOML file (``--layout FILE``), checked key by key:
:func:`layout_from_toml` (the example in its docstring is the format)."""

from __future__ import annotations

import os
import tomllib
import warnings
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError, one_line
from headrank.io.layouts import (
    SPLIT_ALIASES,
    SPLIT_ROLES,
    SPLITS,
    Dims,
    Layout,
    NormSpec,
    _bias_names,
)
from headrank.io.validate import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_WIDTH,
    as_float,
    as_int,
    read_text,
    tensor_pattern,
)


def layout_from_toml(path: str | os.PathLike) -> Layout:
    """A user-described layout. Example::

        split = "separate"            # or fused, conv1d_fused, fused_per_head, fused_per_kv_group
        position = "rotary"           # absolute | rotary | alibi | none (recorded in meta)
        qk_norm = false
        [tensors]                     # {i} is the layer index; names may omit a common prefix
        q = "model.layers.{i}.attn.wq.weight"
        k = "model.layers.{i}.attn.wk.weight"
        v = "model.layers.{i}.attn.wv.weight"
        o = "model.layers.{i}.attn.wo.weight"
        [sizes]
        n_layers = 32
        d_model = 4096
        n_heads = 32
        n_kv_heads = 8                # optional, default n_heads (grouped-query attention)
        head_dim = 128                # optional, default d_model / n_heads
        [norm]                        # optional: the norm before attention, for fold_norm
        name = "model.layers.{i}.attn_norm.weight"
        kind = "rmsnorm"              # or layernorm
        offset = 0.0                  # added to the stored gain (Gemma: 1.0)

    The old split names ``interleaved`` and ``grouped`` are accepted with a warning.
    """
    p = Path(path)
    try:
        spec = tomllib.loads(read_text(p, "layout file"))
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise HeadRankError(f"cannot read layout file {p}: {one_line(str(e), 200) or 'nested too deeply'}"
                            ) from None
    where = f"layout {p}"
    _only_keys(spec, _TOML_KEYS, where)
    split, alias = _toml_split(spec.get("split", "separate"), p)
    tensors = _toml_tensors(spec.get("tensors", {}), split, p)
    dims = _toml_sizes(spec.get("sizes"), where)
    norm = _toml_norm(p, spec.get("norm"))
    position = spec.get("position", "none")
    if position not in _POSITIONS:
        raise HeadRankError(f"{where}: position must be one of {', '.join(_POSITIONS)}; got {position!r}"[:300])
    qk_norm = spec.get("qk_norm", False)
    if not isinstance(qk_norm, bool):
        raise HeadRankError(f"{where}: qk_norm must be true or false; got {qk_norm!r}"[:300])
    if alias is not None:  # warned only once the file is valid: an error stays one line
        warnings.warn(f"layout {p}: split {alias!r} is now called {split!r} (grouped-query attention with "
                      "separate q, k, v tensors is split = \"separate\" with n_kv_heads)", FutureWarning, stacklevel=2)
    return Layout(model_types=(f"layout:{p.name}",), tensors=dict(tensors), dims=lambda c: dims, split=split,
                  biases=_bias_names(tensors), position=lambda c: position,
                  qk_norm=lambda c: qk_norm, norm=lambda c: norm)


_TOML_KEYS = ("split", "position", "qk_norm", "tensors", "sizes", "norm")
_POSITIONS = ("absolute", "rotary", "alibi", "none")


def _toml_split(split: Any, p: Path) -> tuple[str, str | None]:
    """The layout file's ``split``, and the retired name it was given by (None if current)."""
    if not isinstance(split, str):
        raise HeadRankError(f"layout {p}: split must be a string, one of {', '.join(SPLITS)}; got {split!r}"[:300])
    alias = split if split in SPLIT_ALIASES else None
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise HeadRankError(f"layout {p}: split must be one of {', '.join(SPLITS)}; got {split!r}")
    return split, alias


def _toml_tensors(tensors: Any, split: str, p: Path) -> dict[str, str]:
    """The layout file's ``[tensors]`` table: exactly the roles ``split`` reads, each a name pattern."""
    need = SPLIT_ROLES[split]
    if not isinstance(tensors, dict) or set(tensors) != set(need):
        got = ", ".join(sorted(map(str, tensors))) if isinstance(tensors, dict) and tensors else "nothing"
        raise HeadRankError(f"layout {p}: the [tensors] table must name exactly {', '.join(need)} for split "
                            f"{split!r}, each a tensor name containing {{i}} (got {got})")
    for role, t in tensors.items():
        tensor_pattern(t, f"layout {p} [tensors] {role}")
    return tensors


def _only_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(str(k) for k in table if k not in allowed)
    if extra:
        raise HeadRankError(f"{where}: unknown key {extra[0]!r}; allowed: {', '.join(allowed)}"[:300])


def _toml_sizes(sizes: Any, where: str) -> Dims:
    """The [sizes] table: integers n_layers, d_model, n_heads (n_kv_heads, head_dim optional)."""
    if not isinstance(sizes, dict):
        raise HeadRankError(f"{where}: the [sizes] table needs integers n_layers, d_model and n_heads")
    for k in ("n_layers", "d_model", "n_heads"):
        if k not in sizes:
            raise HeadRankError(f"{where}: the [sizes] table needs integers n_layers, d_model and n_heads "
                                f"(missing {k})")
    where = f"{where} [sizes]"
    _only_keys(sizes, ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim"), where)
    d = as_int(sizes["d_model"], "d_model", where, hi=MAX_WIDTH)
    H = as_int(sizes["n_heads"], "n_heads", where, hi=MAX_HEADS)
    Hkv = as_int(sizes.get("n_kv_heads", H), "n_kv_heads", where, hi=MAX_HEADS)
    dh = as_int(sizes.get("head_dim", max(d // H, 1)), "head_dim", where, hi=MAX_HEAD_DIM)
    n = as_int(sizes["n_layers"], "n_layers", where, hi=MAX_LAYERS)
    try:
        return Dims(n, d, H, Hkv, dh)
    except HeadRankError as e:
        raise HeadRankError(f"{where}: {e}") from None


def _toml_norm(p: Path, norm: Any) -> NormSpec | None:
    if norm is None:
        return None
    where = f"layout {p} [norm]"
    if not isinstance(norm, dict) or "name" not in norm:
        raise HeadRankError(f"{where}: the [norm] table needs name (with {{i}}), kind = layernorm|rmsnorm "
                            "and an optional offset")
    _only_keys(norm, ("name", "kind", "offset"), where)
    kind = norm.get("kind", "rmsnorm")
    if kind not in ("layernorm", "rmsnorm"):
        raise HeadRankError(f"{where}: kind must be layernorm or rmsnorm; got {kind!r}"[:300])
    try:
        name = tensor_pattern(norm["name"], f"{where} name")
    except HeadRankError as e:
        raise HeadRankError(f"{where}: the [norm] table needs name (with {{i}}): {e}") from None
    return NormSpec(name, kind,
                    as_float(norm.get("offset", 0.0), "offset", where))
