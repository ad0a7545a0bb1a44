"""A latent KV cache for a factored ``compress`` output (Palu's idea), through transformers'
public attention and cache interfaces.

A unit cut in OV to rank k keeps k of its kv head's ``dh`` value dimensions (``v_proj`` computes
only those: :class:`~.factored.LatentLinear`), and every query head of the group reads only them
through its ``o_proj`` columns, which hold the other factor (``P`` absorbs ``U_k Σ_k^½``). So
the value cache can hold the k-dimensional latent ``x W_V'ᵀ`` instead of ``dh`` numbers, and
attention can weight the latent directly: ``(A_h z) X_h'ᵀ = (A_h V) P_hᵀ`` after the cut. The
same holds for keys where QK is cut (kept rows of ``k_proj``; with rotary embeddings the kept
dimensions closed under the rotation's pairs, which whole-band cuts keep whole): the scores
read only the kept key dimensions, exactly.

How, without a modeling file of our own:

- :func:`enable` gives each cut attention module a :class:`LatentSpec` (which dimensions each kv
  head keeps) and switches the model to the attention function registered here
  (``AttentionInterface`` / ``AttentionMaskInterface``), which packs keys and values to the kept
  dimensions (if the cache has not already), runs the library's own ``sdpa`` or ``eager`` attention
  per kv head on them (value head dim k ≠ key head dim, which both accept), and returns the
  heads' latent outputs side by side, the layout ``o_proj`` (:class:`~.factored.LatentOutput`)
  reads;
- :class:`LatentCache` (a ``DynamicCache``) stores each layer's keys and values packed, one
  ``(batch, 1, tokens, Σ_u k_u)`` tensor each: pass it to ``generate`` (``latent_cache(model)``).

The module's own forward (projections, rotation, norms, the cache call, the reshape before
``o_proj``) is transformers' unchanged. An attention module that does not call the attention
interface is found by :func:`enable`'s probe, and the model is left as it was, with the reason.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from headrank.errors import HeadRankError

NAMES = {"sdpa": "headrank_latent_sdpa", "eager": "headrank_latent_eager"}
ATTR = "headrank_latent"  # the LatentSpec on an attention module
STATUS = "headrank_latent_kv"  # on the model: True, or why the latent cache is not used


@dataclass
class LatentSpec:
    """The kept dimensions (indices in ``0 … dh-1``) of each kv head's keys and values.

    The cache holds them packed, ``Σ_u k_u`` numbers per token; attention runs once per layer on
    each kv head's kept dimensions laid side by side and padded with zeros to the layer's largest
    ``k`` (for the computation only: a zero key dimension adds nothing to a score, a zero value
    dimension is not read back). Under ``sdpa`` the values are padded to the keys' width: with a
    value width other than the key's, torch's CPU SDPA leaves its fused kernel for the math path
    (3.1x slower in bfloat16, 1.5x in float32 at SmolLM2's decode shapes)."""

    base: str
    n_kv: int
    group: int
    head_dim: int
    k_dims: list[torch.Tensor]
    v_dims: list[torch.Tensor]
    calls: int = 0
    flat: dict[str, torch.Tensor] = field(default_factory=dict)
    width: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sizes = {"k": [len(d) for d in self.k_dims], "v": [len(d) for d in self.v_dims]}
        kmax = max(self.sizes["k"])
        self.width = {"k": kmax, "v": kmax if self.base == "sdpa" else max(self.sizes["v"])}
        for name, dims in (("k", self.k_dims), ("v", self.v_dims)):
            self.flat[name] = torch.cat([u * self.head_dim + d for u, d in enumerate(dims)])
        self.k_full = all(s == self.head_dim for s in self.sizes["k"])
        # per query head, its kv head's kept key dimensions (padding: any dimension, the key is zero there)
        self.q_index = None if self.k_full else torch.stack(
            [torch.nn.functional.pad(self.k_dims[h // self.group], (0, kmax - len(self.k_dims[h // self.group])))
             for h in range(self.n_kv * self.group)])

    def pack(self, x: torch.Tensor, which: str) -> torch.Tensor:
        """``(B, Hkv, T, dh)`` → ``(B, 1, T, Σ_u k_u)`` (a tensor already packed is returned)."""
        total = len(self.flat[which])
        if x.shape[1] == 1 and x.shape[-1] == total:
            return x
        B, H, T, dh = x.shape
        flat = x.transpose(1, 2).reshape(B, T, H * dh)
        if total != H * dh:
            flat = flat.index_select(-1, self.flat[which].to(x.device))
        return flat[:, None]

    def heads(self, packed: torch.Tensor, which: str) -> torch.Tensor:
        """Packed ``(B, 1, T, Σ)`` → ``(B, Hkv, T, width)``, each kv head zero-padded to the width
        (a view where every size is the width)."""
        x, sizes, width = packed[:, 0], self.sizes[which], self.width[which]
        if all(n == width for n in sizes):
            return x.view(*x.shape[:-1], self.n_kv, width).transpose(1, 2)
        out = x.new_zeros(x.shape[0], self.n_kv, x.shape[1], width)
        at = 0
        for u, n in enumerate(sizes):
            out[:, u, :, :n] = x[..., at:at + n]
            at += n
        return out

    def unpad(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's ``(B, T, H, width)`` output → ``(B, T, Σ_h k_v(h))``, head-major (the
        layout ``o_proj`` reads)."""
        sizes, width = self.sizes["v"], self.width["v"]
        if all(n == width for n in sizes):
            return out
        B, T = out.shape[:2]
        heads = out.view(B, T, self.n_kv, self.group, width)
        return torch.cat([heads[:, :, u, :, :n].reshape(B, T, -1) for u, n in enumerate(sizes)], -1)

    def attend(self, base, module, query, key, value, attention_mask, **kwargs):
        """Attention on the kept dimensions; output ``(B, T, Σ_h k_v(h))`` (head-major)."""
        self.calls += 1
        kk, vv = self.heads(self.pack(key, "k"), "k"), self.heads(self.pack(value, "v"), "v")
        if self.q_index is not None:
            idx = self.q_index.to(query.device)[None, :, None, :].expand(query.shape[0], -1, query.shape[2], -1)
            query = query.gather(-1, idx)
        out, weights = base(module, query, kk, vv, attention_mask, **kwargs)
        return self.unpad(out), weights


def _base_function(name: str, module):
    if name == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"]
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        raise HeadRankError(f"latent KV cache: {type(module).__name__}'s module has no eager_attention_forward")
    return fn


def _latent_attention(base_name: str):
    def attention(module, query, key, value, attention_mask, **kwargs):
        spec = getattr(module, ATTR, None)
        base = _base_function(spec.base if spec is not None else base_name, module)
        if spec is None:
            return base(module, query, key, value, attention_mask, **kwargs)
        return spec.attend(base, module, query, key, value, attention_mask, **kwargs)

    return attention


def register() -> None:
    """Register the latent attention under :data:`NAMES` (idempotent), with the base's masks."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    for base, name in NAMES.items():
        AttentionInterface.register(name, _latent_attention(base))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])


@functools.cache
def _cache_class():
    from transformers import DynamicCache

    class _LatentCache(DynamicCache):
        """A ``DynamicCache`` whose cut layers store keys and values packed to the kept dimensions."""

        def __init__(self, model):
            super().__init__(config=model.config)
            self.specs = {m.layer_idx: getattr(m, ATTR) for m in model.modules() if getattr(m, ATTR, None) is not None}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            spec = self.specs.get(layer_idx)
            if spec is not None:
                key_states, value_states = spec.pack(key_states, "k"), spec.pack(value_states, "v")
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return _LatentCache


def latent_cache(model):
    """A fresh latent cache for ``model`` (loaded with ``load_compressed(..., latent_kv=True)``):
    ``model.generate(ids, **{cache_kwarg(model): latent_cache(model)})``."""
    if getattr(model, STATUS, None) is not True:
        why = getattr(model, STATUS, "the model was not loaded with load_compressed(..., latent_kv=True)")
        raise HeadRankError(f"no latent KV cache for this model: {why}")
    return _cache_class()(model)


def cache_kwarg(model) -> str:
    """The name ``generate`` and ``forward`` take a cache under (``cache`` in transformers 5.24,
    ``past_key_values`` in earlier releases)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_bytes(cache) -> int:
    """Bytes of the key and value tensors a cache holds."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


# -- switching a loaded factored model to the latent cache -----------------------------------------
def _per_head(index: torch.Tensor, n_kv: int, dh: int) -> list[torch.Tensor]:
    """Kept rows of a ``(n_kv·dh)``-row projection as each kv head's kept dimensions (at least one)."""
    out = []
    for u in range(n_kv):
        d = index[(index >= u * dh) & (index < (u + 1) * dh)] - u * dh
        out.append(d if len(d) else torch.zeros(1, dtype=torch.long))
    return out


def _close_pairs(dims: list[torch.Tensor], pairs: tuple[Any, Any] | None) -> list[torch.Tensor]:
    """With rotary embeddings a kept key dimension's band partner is nonzero after the rotation:
    keep whole pairs (whole-band cuts already do)."""
    if pairs is None:
        return dims
    a, b = (torch.as_tensor(x, dtype=torch.long) for x in pairs)
    out = []
    for d in dims:
        keep = set(d.tolist())
        for x, y in zip(a.tolist(), b.tolist(), strict=True):
            if x in keep or y in keep:
                keep |= {x, y}
        out.append(torch.tensor(sorted(keep), dtype=torch.long))
    return out


def _to_latent_output(o: torch.nn.Module, v_dims: list[torch.Tensor], n_heads: int, group: int, dh: int) -> Any:
    """Make ``o_proj`` (a :class:`~.factored.LatentOutput`) read the heads' latent outputs side
    by side (head h: its kv head's value dimensions); returns what :func:`_undo` puts back."""
    index = torch.cat([h * dh + v_dims[h // group] for h in range(n_heads)]).to(o.weight.device)
    full = o.weight.new_zeros(o.out_features, n_heads * dh)
    full[:, o.index] = o.weight.detach()
    old = (o.weight, o.index)
    o.weight = torch.nn.Parameter(full[:, index].contiguous(), requires_grad=o.weight.requires_grad)
    o.index = index
    return old


def _rotary_pairs(config: Any, info: dict[str, Any]):
    if info.get("position_encoding") != "rotary":
        return None
    from headrank.analysis.rotary import rotary_spec

    try:
        return rotary_spec(config.to_dict(), int(info["head_dim"]))[0].pairs()
    except (ValueError, KeyError, TypeError):
        return "unknown"


def enable(model, modules: dict[str, dict[str, Any]], info: dict[str, Any]) -> bool | str:
    """Switch a model built by :func:`~.factored.load_compressed` to the latent cache.
    ``modules``: the manifest's entries by the model's module names, each with its ``kept``
    indices decoded; ``info``: compress.json's ``config`` block. Returns True, or why not (the
    model is then left as it was)."""
    from headrank.models.opener import is_causal

    base = getattr(model.config, "_attn_implementation", None)
    if not is_causal(model):
        return "not a causal LM: no KV cache to shrink"
    if base not in NAMES:
        return f"attention implementation {base!r}: the latent cache wraps sdpa or eager"
    try:
        n_heads, n_kv, dh = int(info["n_heads"]), int(info["n_kv_heads"]), int(info["head_dim"])
    except (KeyError, TypeError, ValueError):
        return "compress.json does not give the head layout"
    roles: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}
    for name, entry in modules.items():
        if "role" not in entry:
            return "factored.json names no projection roles (written by an older headrank)"
        roles.setdefault(name.rpartition(".")[0], {})[entry["role"]] = (name, entry)
    pairs = _rotary_pairs(model.config, info)
    done: list[tuple[torch.nn.Module, str, Any]] = []
    named = dict(model.named_modules())
    for parent, r in roles.items():
        attn = named[parent]
        if "v" not in r and "k" not in r:
            continue
        if not isinstance(getattr(attn, "layer_idx", None), int):
            _undo(done)
            return f"{type(attn).__name__} has no layer_idx: its cache layer is unknown"
        k_dims = [torch.arange(dh)] * n_kv
        if "k" in r and pairs != "unknown":
            k_dims = _close_pairs(_per_head(r["k"][1]["kept"], n_kv, dh), pairs)
        v_dims = _per_head(r["v"][1]["kept"], n_kv, dh) if "v" in r else [torch.arange(dh)] * n_kv
        if "v" in r:
            o = named.get(r["o"][0]) if "o" in r else None
            if o is None or not hasattr(o, "index"):
                _undo(done)
                return f"{parent}: no factored output projection beside v_proj"
            done.append((o, "o", _to_latent_output(o, v_dims, n_heads, n_heads // n_kv, dh)))
        setattr(attn, ATTR, LatentSpec(base, n_kv, n_heads // n_kv, dh, k_dims, v_dims))
        done.append((attn, ATTR, None))
    register()
    model.set_attn_implementation(NAMES[base])
    why = _probe(model)
    if why is not None:
        _undo(done)
        model.set_attn_implementation(base)
        return why
    return True


def _undo(done: list[tuple[torch.nn.Module, str, Any]]) -> None:
    for mod, name, old in reversed(done):
        if name == "o":
            mod.weight, mod.index = old
        else:
            delattr(mod, name)


@torch.no_grad()
def _probe(model) -> str | None:
    """A 3-token forward through the latent cache: every cut layer's attention must have run the
    latent attention (a module that bypasses the attention interface would not)."""
    specs = [m for m in model.modules() if getattr(m, ATTR, None) is not None]
    ids = torch.tensor([[1, 2, 3]], device=next(model.parameters()).device) % model.config.vocab_size
    try:
        model(input_ids=ids, use_cache=True, **{cache_kwarg(model): _cache_class()(model)})
    except Exception as e:  # noqa: BLE001 - an architecture the latent cache does not fit
        from headrank.errors import one_line

        return f"the latent attention failed on this architecture ({one_line(e, 120)})"
    missed = [type(m).__name__ for m in specs if getattr(m, ATTR).calls == 0]
    for m in specs:
        getattr(m, ATTR).calls = 0
    return f"{missed[0]} does not call transformers' attention interface" if missed else None


def kv_report(model, prompt: torch.Tensor, new_tokens: int = 8) -> dict[str, Any]:
    """KV bytes of a real greedy ``generate`` (``prompt`` ``(1, T)``, ``new_tokens`` more): the
    latent cache's tensors against transformers' ``DynamicCache`` of the same model (the uncut
    layout: ``dh`` numbers per kv head), per token; and whether both generated the same tokens."""
    from transformers import DynamicCache

    from headrank.models.opener import quiet_transformers

    kw = cache_kwarg(model)
    eos = model.config.eos_token_id
    pad = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    runs = {}
    with quiet_transformers(), torch.no_grad():
        for name, cache in (("latent", latent_cache(model)), ("uncut", DynamicCache(config=model.config))):
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad, **{kw: cache})
            runs[name] = (out, cache_bytes(cache), cache.get_seq_length())
    (a, lat, n), (b, unc, _) = runs["latent"], runs["uncut"]
    per = prompt.shape[0] * max(n, 1)
    return {"bytes_per_token": lat / per, "uncut_bytes_per_token": unc / per, "share_saved": 1 - lat / unc if unc else 0.0,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."), "tokens_cached": n,
            "same_tokens": bool(torch.equal(a, b)),
            "how": "a greedy generate on the written checkpoint (load_compressed, latent_kv=True): the bytes of the "
                   "key and value tensors its latent cache holds, against transformers' DynamicCache of the same "
                   "model (the uncut layout), per cached token"}


def kv_measure(model, scorer) -> dict[str, Any]:
    """compress.json's ``kv_cache`` after ``evaluate``: the latent cache's status on the written
    checkpoint and, where it works, :func:`kv_report` from the first 16 tokens of the first
    evaluation window."""
    status = getattr(model, STATUS, None)
    if status is not True:
        return {"latent": status or "not loaded with latent_kv"}
    if not scorer.causal:
        return {"latent": "not a causal LM: no KV cache to shrink"}
    return {"latent": True, "measured": kv_report(model, scorer.data[:1, :16])}
