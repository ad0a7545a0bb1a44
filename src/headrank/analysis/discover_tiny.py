"""More of a default config shrunk for discovery (:func:`headrank.analysis.discover.tiny_config`):
sizes that :data:`~headrank.analysis.discover.TINY` does not name but that must follow it for
the tiny model to build, run, or stay small. Each rule names a config field and the reason it is
set; none of them changes how attention is computed (``docs/architectures.md``).
"""

from __future__ import annotations

from typing import Any

#: fields left as None by a default config that the model needs as a size
_NONE_SIZES = {"vocab_size": 128}
#: a second width that must fit inside the tiny width (MobileBERT: hidden_size - embedding_size)
_INNER_WIDTHS = ("embedding_size", "intra_bottleneck_size", "true_hidden_size")
#: per-layer or per-entity vocabularies far larger than the tiny model (Gemma 3n/4, LUKE, BLT)
_SIDE_VOCABS = ("vocab_size_per_layer_input", "entity_vocab_size", "encoder_hash_byte_group_vocab")


def more_sets(obj: Any, have: dict[str, Any], d: int) -> dict[str, Any]:
    """Further ``field → value`` settings for the (sub-)config ``obj`` (``have``: its dict) at
    tiny width ``d``."""
    sets: dict[str, Any] = {}
    for k, v in _NONE_SIZES.items():
        if k in have and have[k] is None:
            sets[k] = v
    for k in _INNER_WIDTHS:
        if isinstance(have.get(k), int) and not isinstance(have[k], bool) and have[k] > d:
            sets[k] = d // 2
    width = next((have[k] for k in ("hidden_size", "d_model") if isinstance(have.get(k), int)), None)
    if isinstance(have.get("attention_hidden_size"), int) and width:  # Zamba: attention on [hidden, embedding]
        sets["attention_hidden_size"] = round(have["attention_hidden_size"] / width * d)
    expand = have.get("mamba_expand") if isinstance(have.get("mamba_expand"), int) else 2
    for k, v in (("mamba_d_ssm", expand * d), ("lru_width", d), ("mamba_dt_rank", max(d // 16, 1))):
        if isinstance(have.get(k), int) and not isinstance(have[k], bool):  # state-space / recurrent widths
            sets[k] = v
    # a hybrid whose default config has no attention layer (Bamba, Granite-4 hybrid): two, so it is checked
    if "attn_layer_indices" in have and not have["attn_layer_indices"]:
        sets["attn_layer_indices"] = [1, 5]
    types = getattr(obj, "layer_types", None)
    if isinstance(types, list) and types and set(types) == {"linear_attention"}:
        sets["layer_types"] = ["full_attention" if i in (1, 5) else t for i, t in enumerate(types)]
    for k in _SIDE_VOCABS:
        if isinstance(have.get(k), int) and not isinstance(have[k], bool) and have[k] > 1024:
            sets[k] = 128
    return sets


#: lists (or pattern strings) with one entry per layer, where a config gives no layer count
LAYER_LISTS = ("layers_block_type", "layer_types", "hybrid_override_pattern")


def layer_list_field(have: dict[str, Any], n_layers: int) -> str | None:
    """``=len:FIELD`` for a config field listing ``n_layers`` layers' kinds (read by
    :func:`headrank.io.generated.row_sizes`), or None."""
    return next((f"=len:{k}" for k in LAYER_LISTS if isinstance(have.get(k), (list, str)) and
                 len(have[k]) == n_layers), None)


def prepare(model: Any, cfg: Any) -> None:
    """What a tiny model needs before its first forward: X-MOD's adapters a default language (its
    public ``set_default_language``; the attention does not depend on it)."""
    langs = getattr(cfg, "languages", None)
    if callable(getattr(model, "set_default_language", None)) and langs:
        model.set_default_language(langs[0])
