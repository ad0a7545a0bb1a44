"""Discovery for attention that transformers computes inline (not through its attention
interface): BERT clones, RoFormer, MPNet, … (``docs/architectures.md``).

With no query/key states to record, the model's own eager attention probabilities
(``output_attentions``) are the reference. For each layer, every pair of linear maps of equal
output width is tried as (query, key): the row-centred log-probabilities ``log p_ij − log p_i0``
must equal a constant times the logit differences that the pair's per-head product predicts; the
value map and output projection are then those for which ``Σ_j p_hij W_V,h x_j`` is exactly the
output projection's input. The layout found is read back through the reader and checked again.
Separate projections (or GPT's fused ``Conv1D``, openai-gpt) with as many key/value heads as
query heads only.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn

from headrank.analysis.discover import _is_linear, _layer_prefix, _rel, _strip_prefix

TOL_P = 1e-4  # the eager softmax runs in float32


def _heads_out(x: torch.Tensor, w: torch.Tensor, H: int) -> torch.Tensor:
    """(b, n, in) through w (H·dh, in) → (b, H, n, dh)."""
    y = x @ w.T
    return y.reshape(y.shape[0], y.shape[1], H, -1).transpose(1, 2)


def _logit_fit(s: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """(relative error, c) of ``log p_ij − log p_i0 = c (s_ij − s_i0)`` over the entries attended."""
    ok = (p > 1e-30) & (p[..., :1] > 1e-30)
    want = (p.clamp_min(1e-300).log() - p[..., :1].clamp_min(1e-300).log())[ok]
    got = (s - s[..., :1])[ok]
    denom = float((got * got).sum())
    if denom == 0.0 or want.numel() < 4:
        return math.inf, 1.0
    c = float((got * want).sum()) / denom
    return float((c * got - want).abs().max()) / max(float(want.abs().max()), 1e-30), c


def _layer_linears(model: nn.Module, n_layers: int) -> dict[int, dict[str, nn.Module]]:
    """The linear maps (``Linear``, GPT's ``Conv1D``) of each layer of the layer list that has
    ``n_layers`` entries."""
    groups: dict[str, dict[int, dict[str, nn.Module]]] = {}
    for name, m in model.named_modules():
        where = _layer_prefix(name)
        if where is None or not _is_linear(m):
            continue
        layer, i = where
        base = layer[: layer.rfind(".")]
        groups.setdefault(base, {}).setdefault(i, {})[name] = m
    for layers in groups.values():
        if sorted(layers) == list(range(n_layers)):
            return layers
    return {}


def _views(lin: dict[str, nn.Module], io: dict, H: int) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """``(name, part) → (input, weight (out, in))`` of every map whose output splits into heads:
    a ``Linear`` whole (part -1); a GPT ``Conv1D`` (weight stored (in, out)) whole, and where its
    output is three equal blocks each block (parts 0, 1, 2: a fused ``[q | k | v]``)."""
    out = {}
    for n, m in lin.items():
        if n not in io:
            continue
        w = m.weight.T if type(m).__name__ == "Conv1D" else m.weight
        if w.shape[0] % H == 0:
            out[(n, -1)] = (io[n][0], w)
        if type(m).__name__ == "Conv1D" and w.shape[0] % (3 * H) == 0:
            third = w.shape[0] // 3
            out.update({(n, j): (io[n][0], w[j * third:(j + 1) * third]) for j in range(3)})
    return out


def _roles(q: tuple[str, int], k: tuple[str, int], v: tuple[str, int], o: str) -> tuple[str, dict[str, str]] | None:
    """The split and role → module of a (q, k, v, o) found, or None when it is no split of the table."""
    if q[1] == k[1] == v[1] == -1:
        return "separate", {"q": q[0], "k": k[0], "v": v[0], "o": o}
    if q[0] == k[0] == v[0] and (q[1], k[1], v[1]) == (0, 1, 2):
        return "conv1d_fused", {"qkv": q[0], "o": o}
    return None


def _find(lin: dict[str, nn.Module], io: dict, p: torch.Tensor) -> tuple[str, dict[str, str], float, float] | str:
    H = p.shape[1]
    views = _views(lin, io, H)
    for vq, vk in itertools.permutations(views, 2):
        (xq, wq), (xk, wk) = views[vq], views[vk]
        if wq.shape[0] != wk.shape[0]:
            continue
        e, c = _logit_fit(_heads_out(xq, wq, H) @ _heads_out(xk, wk, H).transpose(-1, -2), p)
        if e < TOL_P:
            for vv in (v for v in views if v not in (vq, vk)):
                ctx = (p @ _heads_out(*views[vv], H)).transpose(1, 2).reshape(p.shape[0], p.shape[2], -1)
                for no in lin:
                    if no in io and io[no][0].shape == ctx.shape and _rel(io[no][0], ctx) < 1e-6:
                        found = _roles(vq, vk, vv, no)
                        if found is not None:
                            return (*found, e, c)
            return "the heads' output reaches no linear map as it is: layout not confirmed"
    return "no pair of linear maps predicts the module's attention probabilities: layout not confirmed"


def discover_inline(model: nn.Module, cfg: Any, ids: torch.Tensor) -> dict[str, Any]:
    """A verified row for a model whose attention is inline, or a refusal (``status``, ``reason``)."""
    from headrank.analysis.discover import Capture, _text

    cap = Capture([])
    hooks = [m.register_forward_hook(lambda mod, a, o, n=n: cap.io.__setitem__(n, (a[0].detach(), o.detach())))
             for n, m in model.named_modules() if _is_linear(m)]
    try:
        with torch.no_grad():
            out = model(input_ids=ids, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    atts = [a for a in (getattr(out, "attentions", None) or ()) if isinstance(a, torch.Tensor)]
    if not atts or len(atts) != len(getattr(out, "attentions", ())):
        return {"status": "refused", "reason": "attention computed inline and not returned by output_attentions: "
                "layout not confirmed"}
    layers = _layer_linears(model, len(atts))
    if not layers:
        return {"status": "refused", "reason": "attention computed inline in no numbered layer list: layout not confirmed"}
    found = _find(layers[len(atts) - 1], cap.io, atts[-1].double())
    if isinstance(found, str):
        return {"status": "refused", "reason": found}
    split, roles, err, c = found
    first = roles.get("q", roles.get("qkv", ""))
    last = _layer_prefix(first)[0]
    pattern = last[: last.rfind(".") + 1] + "{i}"
    mods = _strip_prefix(model, {r: pattern + n[len(last):] for r, n in roles.items()})
    q_in, q_out = cap.io[first][0].shape[-1], cap.io[first][1].shape[-1] // (3 if split == "conv1d_fused" else 1)
    H = atts[-1].shape[1]
    return {"status": "verified", "split": split, "modules": mods, "_H": H, "_dh": q_out // H,
            "_d": q_in, "_n_layers": len(atts),
            "_io": cap.io, "_atts": atts, "scale_fit": c, "max_probability_fit_error_last_layer": err,
            "_text": _text(cfg)}


def check_inline(reader: Any, row: dict[str, Any]) -> dict[str, float]:
    """Every layer again, through the reader: the products' logits against the module's
    probabilities (largest relative error), and the OV products against its output projection."""
    io, atts = row["_io"], row["_atts"]
    worst_qk, worst_ov = 0.0, 0.0
    for i in reader.layer_ids:
        hw, p = reader.read_layer(i), atts[i].double()
        names = {r: n.removesuffix(".weight") for r, n in reader.tensor_names(i).items()}
        xq, xk, xv = (io[names.get(r, names.get("qkv"))][0] for r in "qkv")
        a, b = hw.qk_factors()
        s = torch.einsum("bmd,hde,hfe,bnf->bhmn", xq, b.to(xq.dtype), a.to(xq.dtype), xk)
        e, c = _logit_fit(s, p)
        worst_qk = max(worst_qk, e if abs(c - row["scale_fit"]) < 1e-3 * abs(c) else math.inf)
        pa, pb = hw.ov_factors()
        ctx = torch.einsum("bhmn,bnd->bhmd", p, xv)
        pred = torch.einsum("bhmd,hde,hfe->bmf", ctx, pb.to(ctx.dtype), pa.to(ctx.dtype))
        worst_ov = max(worst_ov, _rel(pred, io[names["o"]][1]))
    return {"max_probability_error": float(f"{worst_qk:.3g}"), "max_output_error": float(f"{worst_ov:.3g}")}
