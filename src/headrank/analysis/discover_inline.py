"""Discovery for attention that transformers computes inline (not through its attention
interface): BERT clones, RoFormer, MPNet, … (``docs/architectures.md``).

With no query/key states to record, the model's own eager attention probabilities
(``output_attentions``) are the reference. For each layer, every pair of linear maps of equal
output width is tried as (query, key): the row-centred log-probabilities ``log p_ij − log p_i0``
must equal a constant times the logit differences that the pair's per-head product predicts; the
value map and output projection are then those for which ``Σ_j p_hij W_V,h x_j`` is exactly the
output projection's input. The layout found is read back through the reader and checked again.
Separate projections with as many key/value heads as query heads only.
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
    """The linear maps of each layer of the layer list that has ``n_layers`` entries."""
    groups: dict[str, dict[int, dict[str, nn.Module]]] = {}
    for name, m in model.named_modules():
        where = _layer_prefix(name)
        if where is None or not _is_linear(m) or not isinstance(m, nn.Linear):
            continue
        layer, i = where
        base = layer[: layer.rfind(".")]
        groups.setdefault(base, {}).setdefault(i, {})[name] = m
    for layers in groups.values():
        if sorted(layers) == list(range(n_layers)):
            return layers
    return {}


def _find(lin: dict[str, nn.Module], io: dict, p: torch.Tensor) -> tuple[dict[str, str], float, float] | str:
    H = p.shape[1]
    cands = [n for n, m in lin.items() if m.out_features % H == 0 and n in io]
    for nq, nk in itertools.permutations(cands, 2):
        if lin[nq].out_features != lin[nk].out_features:
            continue
        q = _heads_out(io[nq][0], lin[nq].weight, H)
        k = _heads_out(io[nk][0], lin[nk].weight, H)
        e, c = _logit_fit(q @ k.transpose(-1, -2), p)
        if e < TOL_P:
            for nv in (n for n in cands if n not in (nq, nk)):
                ctx = (p @ _heads_out(io[nv][0], lin[nv].weight, H)).transpose(1, 2).reshape(p.shape[0], p.shape[2], -1)
                for no in lin:
                    if no in io and io[no][0].shape == ctx.shape and _rel(io[no][0], ctx) < 1e-6:
                        return {"q": nq, "k": nk, "v": nv, "o": no}, e, c
            return "the heads' output reaches no linear map as it is: layout not confirmed"
    return "no pair of linear maps predicts the module's attention probabilities: layout not confirmed"


def discover_inline(model: nn.Module, cfg: Any, ids: torch.Tensor) -> dict[str, Any]:
    """A verified row for a model whose attention is inline, or a refusal (``status``, ``reason``)."""
    from headrank.analysis.discover import Capture, _text

    cap = Capture([])
    hooks = [m.register_forward_hook(lambda mod, a, o, n=n: cap.io.__setitem__(n, (a[0].detach(), o.detach())))
             for n, m in model.named_modules() if isinstance(m, nn.Linear)]
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
    roles, err, c = found
    last = _layer_prefix(roles["q"])[0]
    pattern = last[: last.rfind(".") + 1] + "{i}"
    mods = _strip_prefix(model, {r: pattern + n[len(last):] for r, n in roles.items()})
    H, dh = atts[-1].shape[1], layers[len(atts) - 1][roles["q"]].out_features // atts[-1].shape[1]
    return {"status": "verified", "split": "separate", "modules": mods, "_H": H, "_dh": dh,
            "_d": layers[len(atts) - 1][roles["q"]].in_features, "_n_layers": len(atts),
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
        xq, xk, xv = (io[names[r]][0] for r in "qkv")
        a, b = hw.qk_factors()
        s = torch.einsum("bmd,hde,hfe,bnf->bhmn", xq, b.to(xq.dtype), a.to(xq.dtype), xk)
        e, c = _logit_fit(s, p)
        worst_qk = max(worst_qk, e if abs(c - row["scale_fit"]) < 1e-3 * abs(c) else math.inf)
        pa, pb = hw.ov_factors()
        ctx = torch.einsum("bhmn,bnd->bhmd", p, xv)
        pred = torch.einsum("bhmd,hde,hfe->bmf", ctx, pb.to(ctx.dtype), pa.to(ctx.dtype))
        worst_ov = max(worst_ov, _rel(pred, io[names["o"]][1]))
    return {"max_probability_error": float(f"{worst_qk:.3g}"), "max_output_error": float(f"{worst_ov:.3g}")}
