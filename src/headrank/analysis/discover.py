"""Discover a model type's attention layout from transformers' own module, and verify it.

For a ``model_type`` that transformers knows, :func:`discover` builds a tiny random instance
(:func:`tiny_config`: widths shrunk, head counts distinct, float64), runs it with an attention
implementation of its own (registered with ``transformers.AttentionInterface``) that records the
query, key and value states every attention module hands over, and hooks every linear map of
the layers. From those records alone it finds

- which modules compute attention (the layer kinds and their true layer indices);
- which weight gives the query, key, value (a separate ``Linear``, a fused one in one of the
  table's splits, a GPT-2 ``Conv1D``) and which takes the heads' output (the output projection);
- the head counts and head dim, the score's scale, and which config attributes give them.

The candidate layout is then read back through :class:`headrank.io.layouts.AttentionReader`, as a
user's checkpoint would be, and verified against the module's own forward:

- QK: the logits ``x_i (W_K,hᵀ W_Q,h)ᵀ x_j`` predicted from the per-head product equal the
  module's ``q_h(x_i) · k_h(x_j)`` (positions 0, biases zeroed, a QK-norm replaced by the identity);
  for rotary models a second forward at positions ``0 … n−1`` must match the per-band sum of
  :func:`headrank.analysis.rotary.band_scores` (or, for layers without rotary, the plain form);
- OV: ``W_V,h x`` equals the module's value states and ``Σ_h P_h ctx_h`` its output projection.

What passes becomes a row of the generated table (``headrank/io/layouts_generated.json``); what
fails is refused with one line. Definitions: ``docs/architectures.md``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn

from headrank.analysis.discover_tiny import layer_list_field, more_sets, prepare
from headrank.errors import HeadRankError, one_line

T = TypeVar("T")
CAPTURE = "headrank_verify"
#: relative error of a verified logit or projection: float64 throughout, but some modules compute the
#: rotary embedding of q and k in float32 (round-off ~1e-7); a wrong layout misses by O(1)
TOL = 1e-5
_LOG: list[dict[str, Any]] = []
MAX_TINY_PARAMS = 80_000_000


def _eager(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any):
    """Softmax attention as transformers' eager path computes it, recording what it is handed."""
    rec = {"module": module, "q": query.detach(), "k": key.detach(), "v": value.detach(),
           "scaling": scaling, "extra": sorted(k for k, v in kwargs.items() if v is not None)}
    _LOG.append(rec)
    g = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(g, 1) if g > 1 else key
    v = value.repeat_interleave(g, 1) if g > 1 else value
    s = query @ k.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if isinstance(attention_mask, torch.Tensor):
        m = attention_mask[..., : k.shape[-2]]
        try:
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        except (RuntimeError, IndexError):  # a mask of its own shape: the records do not depend on it
            pass
    p = torch.softmax(s.float() if s.dtype == torch.float16 else s, -1).to(v.dtype)
    p = torch.nan_to_num(p)
    out = (p @ v).transpose(1, 2).contiguous()
    rec["out"] = out.detach()
    return out, p


def _register(name: str = CAPTURE, fn=None) -> None:
    """Register ``fn`` (this module's capturing eager attention by default) as transformers'
    attention implementation ``name``, with the eager mask."""
    import transformers

    transformers.AttentionInterface.register(name, fn or _eager)
    try:
        transformers.AttentionMaskInterface.register(name, transformers.masking_utils.eager_mask)
    except Exception:  # noqa: BLE001 - older releases: the eager mask is chosen anyway
        pass


# -- model types --------------------------------------------------------------------------------
def known_types() -> dict[str, tuple[str, str]]:
    """Every causal-LM and masked-LM model type of the installed transformers: ``type → (task, class)``."""
    # the auto classes' name tables: public constants (no underscore) that name each type's class
    # without importing every model's module, as transformers.MODEL_FOR_*_MAPPING would
    return types_of(("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"), ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"))


def types_of(*tables: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """``type → (task, class)`` from the auto classes' name ``tables`` ((task, table name) pairs,
    later tables winning), sorted by type."""
    import transformers.models.auto.modeling_auto as ma

    out: dict[str, tuple[str, str]] = {}
    for task, table in tables:
        for mt, cls in getattr(ma, table).items():
            out[mt] = (task, cls if isinstance(cls, str) else cls[0])
    return dict(sorted(out.items()))


# tiny sizes, pairwise distinct where a config could name them (a value found names its attribute)
TINY = {"d": 48, "heads": 6, "kv_heads": 3, "head_dim": 16, "ffn": 40, "experts": 4, "layers": 8, "linear_dim": 8,
        "linear_heads": 2}
MLA_TINY = {"qk_nope_head_dim": 12, "qk_rope_head_dim": 8, "v_head_dim": 10, "kv_lora_rank": 20, "q_lora_rank": 24}
_WIDTH = ("emb_dim", "hidden_size", "d_model", "n_embd", "dim", "embed_dim", "n_embed", "model_dim", "hidden_dim_model",
          "attention_hidden_size")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
          "decoder_attention_heads", "attention_heads")
_KV = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "n_kv_heads",
       "num_key_value_groups_heads")
_HEAD_DIM = ("head_dim", "kv_channels", "attention_head_size", "d_head", "d_kv", "head_size", "attention_head_dim")
_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers")
_FFN = ("intermediate_size", "ffn_dim", "n_inner", "d_ff", "moe_intermediate_size", "shared_expert_intermediate_size",
        "ffn_hidden_size", "encoder_ffn_dim", "decoder_ffn_dim", "expert_intermediate_size", "moe_ffn_hidden_size",
        "dense_intermediate_size", "intermediate_size_mlp", "ffn_config_hidden", "hidden_dim", "inner_hidden_size",
        "feed_forward_proj_dim", "shared_intermediate_size", "dff", "dim_ff")
# the linear-attention layers of hybrids (Qwen3-Next, Qwen3.5, Kimi-Linear, ...): not measured, but at their
# default sizes their float64 causal convolution alone took 30-70 s of a check
_LINEAR_DIMS = ("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim")
_LINEAR_HEADS = ("linear_num_key_heads", "linear_num_heads")
_LINEAR_VALUE_HEADS = ("linear_num_value_heads",)
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")
_TOPK = ("num_experts_per_tok", "num_experts_per_token", "top_k", "moe_topk", "moe_k", "num_selected_experts")


#: the inputs' token ids are drawn from 3 .. INPUT_IDS - 1; the tiny vocabulary has at least VOCAB ids
INPUT_IDS, VOCAB = 100, 128


def _small_vocab(have: dict[str, Any]) -> dict[str, Any]:
    """Special token ids past the tiny vocabulary moved to ids no input holds (from
    :data:`INPUT_IDS` up), so the vocabulary stays at :data:`VOCAB`: a default config's ids
    (151329, 255001, ...) would otherwise keep the embedding, by far the largest tensor, at full
    size (7–12 M float64 weights to initialise and multiply). No input holds either id."""
    ids = {k: v for k, v in have.items() if k.endswith("token_id") and isinstance(v, int) and not isinstance(v, bool)}
    keep = {v for v in ids.values() if v < VOCAB}
    free = (i for i in range(INPUT_IDS, 1 << 31) if i not in keep)
    moved: dict[int, int] = {}
    sets: dict[str, Any] = {}
    for k, v in sorted(ids.items()):
        if v >= VOCAB:
            sets[k] = moved.setdefault(v, next(free))
    sets["vocab_size"] = max([VOCAB, *(i + 1 for i in (*keep, *moved.values()))])
    return sets


def _text(cfg: Any) -> Any:
    get = getattr(cfg, "get_text_config", None)
    try:
        return get(decoder=True) if get is not None else cfg
    except TypeError:
        return get()


def _head_dim_sets(have: dict[str, Any], add: bool) -> dict[str, Any]:
    """``head_dim`` of the tiny config: set where the config derives it (``None``, filled in
    ``__post_init__``, not run again), and added (``add``: a text config with heads) where the
    config has none, so that a module that reads ``getattr(config, "head_dim", width // heads)``
    shows it and its row names the field (width / heads where a checkpoint's config has none:
    Qwen3-MoE's 128 is not 2048 / 32)."""
    if "head_dim" in have and have["head_dim"] is None:
        return {"head_dim": TINY["d"] // TINY["heads"]}
    if add and "head_dim" not in have and "kv_lora_rank" not in have:
        return {"head_dim": TINY["head_dim"]}
    return {}


def _shrink(obj: Any, overrides: dict[str, Any] | None, text: bool = False) -> None:
    have = obj.to_dict()
    overrides = dict(overrides or {})
    keep_layers, add_head_dim = overrides.pop("_keep_layers", False), overrides.pop("_add_head_dim", True)
    default_heads = next((have[k] for k in _HEADS if isinstance(have.get(k), int)), None)
    default_kv = next((have[k] for k in _KV if isinstance(have.get(k), int)), None)
    sets: dict[str, Any] = {}
    for names, value in ((_WIDTH, TINY["d"]), (_HEADS, TINY["heads"]), (_FFN, TINY["ffn"]),
                         (_HEAD_DIM, TINY["head_dim"]), (_EXPERTS, TINY["experts"]), (_TOPK, 2)):
        for k in names:
            if isinstance(have.get(k), int) and not isinstance(have.get(k), bool):
                sets[k] = value
    for k in _KV:
        if k in have and have[k] is None:
            sets[k] = TINY["heads"]
    expand = have.get("mamba_expand") if isinstance(have.get("mamba_expand"), int) else 2
    for heads, dim in (("mamba_n_heads", "mamba_d_head"), ("n_mamba_heads", "mamba_headdim")):
        if isinstance(have.get(heads), int):  # state-space layers of a hybrid: heads x head dim = expand x width
            sets.update({heads: expand * TINY["d"] // 8, dim: 8})
    if isinstance(have.get("rotary_dim"), int):
        sets["rotary_dim"] = 4
    sets.update(_head_dim_sets(have, text and add_head_dim and default_heads is not None))
    if default_kv is not None:
        kv = 1 if default_kv == 1 else (TINY["heads"] if default_kv == default_heads else TINY["kv_heads"])
        sets.update({k: kv for k in _KV if isinstance(have.get(k), int)})
    n = TINY["layers"] if not keep_layers else 10**9
    for k in _LAYERS:
        if isinstance(have.get(k), int) and have[k] > n:
            sets[k] = n
    for k in ("layer_types", "layers_block_type", "attn_type_list", "mlp_layer_types", "layer_type_list"):
        if isinstance(have.get(k), list) and len(have[k]) > n:
            sets[k] = have[k][:n]
    for k in ("n_group", "topk_group", "num_expert_group", "topk_groups"):
        if k in have:
            sets[k] = 1
    for k in _TOPK:
        if k in have and have[k] is None:
            sets[k] = 2
    sets.update(more_sets(obj, have, TINY["d"]))
    if isinstance(have.get("kv_lora_rank"), int):  # multi-head latent attention: distinct latent sizes
        sets.update(MLA_TINY)
        if have.get("q_lora_rank") is None:
            sets.pop("q_lora_rank")
        if "head_dim" in have:
            sets["head_dim"] = MLA_TINY["qk_rope_head_dim"]
    for names, value in ((_LINEAR_DIMS, TINY["linear_dim"]), (_LINEAR_HEADS, TINY["linear_heads"]),
                         (_LINEAR_VALUE_HEADS, 2 * TINY["linear_heads"])):
        sets.update({k: value for k in names if isinstance(have.get(k), int) and not isinstance(have.get(k), bool)})
    if isinstance(have.get("vocab_size"), int):
        sets.update(_small_vocab(have))
    sets.update(overrides)
    for k, v in sets.items():
        try:
            setattr(obj, k, v)
        except Exception:  # noqa: BLE001 - a read-only property: left as it is
            pass


def tiny_config(model_type: str, overrides: dict[str, Any] | None = None) -> Any:
    """transformers' default config of ``model_type`` with every size shrunk to :data:`TINY`.

    A text config without a ``head_dim`` field gets one (:data:`TINY` ``head_dim``, not width /
    heads) where the model's parameters read it (``getattr(config, "head_dim", width // heads)``,
    as Qwen3-MoE does): its layout then names the field. Where no parameter's shape changes with
    it, the config stays as transformers makes it."""
    cfg = _shrunk(model_type, overrides)
    if (overrides or {}).get("head_dim") is None and model_type in known_types():
        auto = auto_class(model_type)
        bare = _shrunk(model_type, {**(overrides or {}), "_add_head_dim": False})
        try:  # eager: every model takes it (some take no registered implementation)
            same = _meta_shapes(auto, bare, "eager")[1] == _meta_shapes(auto, cfg, "eager")[1]
        except Exception:  # noqa: BLE001 - a model that cannot be built: build_tiny says why
            same = False
        if same:
            return bare
    return cfg


def _shrunk(model_type: str, overrides: dict[str, Any] | None) -> Any:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type)
    t = _text(cfg)
    subs = [getattr(cfg, k, None) for k in getattr(cfg, "sub_configs", {}) or {}]
    for obj in {id(o): o for o in (cfg, t, *subs) if o is not None and hasattr(o, "to_dict")}.values():
        _shrink(obj, overrides if obj is t or obj is cfg else None, text=obj is t)
    return cfg


# -- capture ------------------------------------------------------------------------------------
@dataclass
class Capture:
    """One forward's records: per attention call its module, q/k/v and scale; per linear map and
    norm of the model its input and output (the last call)."""

    calls: list[dict[str, Any]]
    io: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"


def _is_norm(m: nn.Module) -> bool:
    return "norm" in type(m).__name__.lower() and isinstance(getattr(m, "weight", None), torch.Tensor)


def forward_capture(model: nn.Module, ids: torch.Tensor | None, positions: torch.Tensor | None,
                    inputs: dict[str, torch.Tensor] | None = None) -> Capture:
    """Run ``model`` once on ``ids`` (or on ``inputs``, the keyword inputs of an encoder-decoder)
    and record what its attention and linear maps saw."""
    _LOG.clear()
    cap = Capture([])
    hooks = []
    for name, m in model.named_modules():
        if _is_linear(m) or _is_norm(m):
            def hook(mod, args, kwargs, out, name=name):
                x = args[0] if args else next(iter(kwargs.values()), None)
                y = out[0] if isinstance(out, tuple) else out
                if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
                    cap.io[name] = (x.detach(), y.detach())
            hooks.append(m.register_forward_hook(hook, with_kwargs=True))
    kw: dict[str, Any] = {**(inputs if inputs is not None else {"input_ids": ids}), "use_cache": False}
    if positions is not None:
        kw["position_ids"] = positions
    try:
        with torch.no_grad():
            try:
                model(**kw)
            except TypeError:
                kw.pop("use_cache")
                model(**kw)
    finally:
        for h in hooks:
            h.remove()
    cap.calls = list(_LOG)
    _LOG.clear()
    return cap


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(float(b.abs().max()), 1e-30)
    return float((a - b).abs().max()) / scale if a.shape == b.shape else math.inf


# -- build --------------------------------------------------------------------------------------
def build_tiny(model_type: str, overrides: dict[str, Any] | None = None, attn: str = CAPTURE,
               auto: Any = None) -> tuple[nn.Module, Any]:
    """A tiny random float64 model of ``model_type`` (its causal-LM or masked-LM class, or the
    auto class ``auto``), biases and QK-norms left as built; raises with transformers' own message
    when it cannot be built."""
    _register()
    auto = auto or auto_class(model_type)
    cfg, shapes = _meta_shapes(auto, tiny_config(model_type, overrides), attn)
    n = sum(math.prod(s) for s in shapes)
    if n > MAX_TINY_PARAMS:
        raise HeadRankError(f"could not shrink {model_type}: its tiny instance still has {n / 1e6:.0f}M parameters")
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = auto.from_config(cfg, attn_implementation=attn, experts_implementation="eager", dtype=torch.float64)
    prepare(model, cfg)
    return model.eval(), cfg


def _meta_shapes(auto: Any, cfg: Any, attn: str = CAPTURE) -> tuple[Any, list[tuple[int, ...]]]:
    """``cfg`` (or its text config, for a causal-LM class of a composite type) and the parameter
    shapes of the model it builds on the meta device."""
    _register()
    with torch.device("meta"):
        try:
            model = auto.from_config(cfg, attn_implementation=attn)
        except AttributeError:  # a causal-LM class that takes the text config of a composite type
            cfg = _text(cfg)
            model = auto.from_config(cfg, attn_implementation=attn)
    return cfg, [tuple(p.shape) for p in model.parameters()]


def auto_class(model_type: str) -> Any:
    """transformers' public auto class of ``model_type``'s task (:func:`known_types`): its
    ``from_config`` builds the type's causal-LM or masked-LM class from a config."""
    import transformers

    task = known_types()[model_type][0]
    return transformers.AutoModelForCausalLM if task == "causal-lm" else transformers.AutoModelForMaskedLM



# -- match: which weights give q, k, v and take the heads' output --------------------------------
def _heads(t: torch.Tensor) -> torch.Tensor:
    """(b, heads, n, dh) → (b, n, heads·dh)."""
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


def _fused_views(y: torch.Tensor, H: int, Hkv: int, dh: int) -> dict[str, tuple[torch.Tensor, ...]]:
    """The (q, k, v) parts of a fused projection's output ``y`` (b, n, ·) under each split."""
    b, n, out = y.shape
    views: dict[str, tuple[torch.Tensor, ...]] = {}
    if out == (H + 2 * Hkv) * dh:
        views["fused"] = tuple(y.split([H * dh, Hkv * dh, Hkv * dh], -1))
        g = H // Hkv
        w = y.reshape(b, n, Hkv, g + 2, dh)
        views["fused_per_kv_group"] = (w[:, :, :, :g].reshape(b, n, -1), w[:, :, :, g].reshape(b, n, -1),
                                       w[:, :, :, g + 1].reshape(b, n, -1))
        if H == Hkv:
            w = y.reshape(b, n, H, 3, dh)
            views["fused_per_head"] = tuple(w[:, :, :, j].reshape(b, n, -1) for j in range(3))
    return views


def _layer_prefix(name: str) -> tuple[str, int] | None:
    """``model.layers.3.self_attn`` → (``model.layers.3``, 3): the last numbered module above."""
    parts = name.split(".")
    for j in range(len(parts) - 1, -1, -1):
        if parts[j].isdigit():
            return ".".join(parts[: j + 1]), int(parts[j])
    return None


@dataclass
class Match:
    """What the records say about one kind of attention module."""

    kind: str  # the module's path inside its layer, e.g. ``self_attn``
    split: str
    modules: dict[str, str]  # role → module path with ``{i}`` (relative to the model's root)
    conv1d: bool
    H: int
    Hkv: int
    dh: int
    d: int
    scaling: float | None
    layers: list[int]
    extra: list[str]
    factor: float = 1.0  # q and k come out of the projections times constants (YaRN): their product


def _fit(y: torch.Tensor, t: torch.Tensor) -> tuple[float, float]:
    """(relative error, c) of the best ``c·y ≈ t`` (a constant rotary attention factor, e.g. YaRN's)."""
    if y.shape != t.shape:
        return math.inf, 1.0
    c = float((y * t).sum() / (y * y).sum().clamp_min(1e-300))
    return _rel(c * y, t), c


def _find_roles(call: dict[str, Any], io: dict[str, tuple[torch.Tensor, torch.Tensor]], layer: str,
                ) -> tuple[str, dict[str, str]] | str:
    """(split, role → module name) for one attention call, or why none was found."""
    q, k, v = (_heads(call[r]) for r in "qkv")
    H, Hkv, dh = call["q"].shape[1], call["k"].shape[1], call["q"].shape[-1]
    if call["v"].shape[-1] != dh:
        return f"value head dim {call['v'].shape[-1]} differs from the query head dim {dh}"
    cands = {n: xy for n, xy in io.items() if n.startswith(layer + ".") and xy[1].dim() == 3}
    roles: dict[str, str] = {}
    for role, want in (("q", q), ("k", k), ("v", v)):
        for n, (_, y) in cands.items():
            e, c = _fit(y, want)
            if n not in roles.values() and e < TOL and (role != "v" or abs(c - 1) < TOL):
                roles[role] = n
                call[f"factor_{role}"] = c
                break
    split = "separate"
    if len(roles) < 3:
        roles = {}
        for n, (_, y) in cands.items():
            for sp, (yq, yk, yv) in _fused_views(y, H, Hkv, dh).items():
                (eq, cq), (ek, ck) = _fit(yq, q), _fit(yk, k)
                if max(eq, ek, _rel(yv, v)) < TOL:
                    split, roles = sp, {"qkv": n}
                    call.update(factor_q=cq, factor_k=ck)
                    break
            if roles:
                break
    if not roles:
        return "no projection's output equals the query, key and value the module computes"
    out = call["out"].reshape(call["out"].shape[0], call["out"].shape[1], -1)
    o = [n for n, (x, _) in cands.items() if x.shape == out.shape and _rel(x, out) < TOL]
    if not o:
        return "no linear map takes the heads' output as it is (gated or transformed output)"
    roles["o"] = o[0]
    return split, roles


def match(model: nn.Module, cap: Capture) -> list[Match] | str:
    """The attention kinds of a captured forward (positions 0, QK-norms removed), or why not."""
    if not cap.calls:
        return "no softmax attention: no module called transformers' attention interface"
    names = {id(m): n for n, m in model.named_modules()}
    kinds: dict[str, Match] = {}
    for call in reversed(cap.calls):  # the linear maps' records are of their last call
        name = names.get(id(call["module"]), "")
        where = _layer_prefix(name)
        if where is None:
            if any(_layer_prefix(names.get(id(c["module"]), "")) for c in cap.calls):
                continue  # an attention outside the layer stack (e.g. a final pooling): not measured
            return f"attention module {name or '?'} is not inside a numbered layer"
        layer, i = where
        kind = name[len(layer) + 1:]
        if kind in kinds:
            if i not in kinds[kind].layers:
                kinds[kind].layers.append(i)
            continue
        found = _find_roles(call, cap.io, layer)
        if isinstance(found, str):
            return f"{kind or 'attention'}: {found}"
        split, roles = found
        pattern = layer[: layer.rfind(".") + 1] + "{i}"
        mods = {r: pattern + n[len(layer):] for r, n in roles.items()}
        first = model.get_submodule(roles.get("q", roles.get("qkv", "")))
        d = cap.io[roles.get("q", roles.get("qkv", ""))][0].shape[-1]
        kinds[kind] = Match(kind, split, mods, type(first).__name__ == "Conv1D", call["q"].shape[1],
                            call["k"].shape[1], call["q"].shape[-1], int(d), call["scaling"], [i], call["extra"],
                            call.get("factor_q", 1.0) * call.get("factor_k", 1.0))
    return list(kinds.values())


# -- the row ---------------------------------------------------------------------------------------
def _attr(have: dict[str, Any], names: tuple[str, ...], value: int) -> str | None:
    return next((k for k in names if have.get(k) == value and not isinstance(have.get(k), bool)), None)


def _dims_spec(m: Match, n_layers: int, have: dict[str, Any]) -> dict[str, str] | str:
    """Which config fields give the sizes found (or why they could not be named)."""
    spec = {"n_layers": _attr(have, _LAYERS, n_layers), "d": _attr(have, _WIDTH, m.d),
            "n_heads": _attr(have, _HEADS, m.H)}
    spec["n_kv_heads"] = _attr(have, _KV, m.Hkv) or ("=n_heads" if m.Hkv == m.H else "=1" if m.Hkv == 1 else None)
    spec["head_dim"] = _attr(have, _HEAD_DIM, m.dh) or ("=d/n_heads" if m.d // m.H == m.dh else None)
    if spec["n_layers"] is None and n_layers == 1:  # one layer shared by all (ALBERT): measured once
        spec["n_layers"] = "=1"
    if spec["n_layers"] is None:  # a hybrid whose config lists its layers' kinds instead (Nemotron-H)
        spec["n_layers"] = layer_list_field(have, n_layers)
    missing = [k for k, v in spec.items() if v is None]
    if missing:
        return f"no config field gives {missing[0]} ({m.H} heads of {m.dh} dims, width {m.d}, {n_layers} layers)"
    return spec  # type: ignore[return-value]


def _position(model: nn.Module, cfg: dict[str, Any]) -> str:
    if cfg.get("alibi") or cfg.get("model_type") in ("bloom", "mpt") or (cfg.get("attn_config") or {}).get("alibi"):
        return "alibi"
    names = " ".join(n for n, _ in model.named_modules())
    return "absolute" if any(k in names for k in ("position_embeddings", "wpe", "embed_positions",
                                                   "position_embedding")) else "none"


class _Identity(nn.Module):
    """The identity, whatever else a norm is called with (a gate, a dimension)."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return x


def _strip_qk_norms(modules: list[nn.Module]) -> bool:
    """Replace every norm inside the attention modules by the identity (QK-norm: the products
    are those of the projections before it). True if there was one."""
    found = False
    for att in modules:
        for name, child in list(att.named_children()):
            if "norm" in type(child).__name__.lower() or "norm" in name.lower():
                setattr(att, name, _Identity())
                found = True
    return found


def _zero_biases(model: nn.Module) -> None:
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.zero_()


def _strip_prefix(model: nn.Module, mods: dict[str, str]) -> dict[str, str]:
    base = getattr(model, "base_model_prefix", "") or ""
    if base and all(m.startswith(base + ".") for m in mods.values()):
        return {r: m[len(base) + 1:] for r, m in mods.items()}
    return mods


def _layer_count(model: nn.Module, m: Match) -> int:
    pattern = next(iter(m.modules.values()))
    return len(model.get_submodule(pattern[: pattern.index(".{i}")]))


def now() -> float:
    return time.perf_counter()


def one_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run with one torch (and BLAS) thread. A tiny model's operations are far smaller than
    what a second thread saves, and on a shared machine each parallel region waits for a thread
    that has no core: a 12 x 48 ``index_add_`` took 50 ms instead of 0.1 ms under load."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        from headrank.util.threads import torch_threads

        with torch_threads(1):
            return fn(*args, **kwargs)

    return run


__all__ = ["CAPTURE", "Capture", "HeadRankError", "auto_class", "build_tiny", "forward_capture", "known_types", "now",
           "one_line", "one_thread", "tiny_config"]
