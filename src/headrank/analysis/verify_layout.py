"""Verify a discovered layout against the module's own forward (``docs/architectures.md``).

The layout is read back through :class:`headrank.io.layouts.AttentionReader` from the live tiny
model, exactly as a checkpoint would be, and every attention layer's per-head products must
predict what the module computed in a captured forward (:mod:`headrank.analysis.discover`):

- QK, positions 0: ``x_q B_h A_hᵀ x_kᵀ`` (``A_h B_hᵀ = W_K,hᵀ W_Q,h``) equals ``q_h k_hᵀ``;
- QK, positions ``0 … n−1``: for a rotary layer the per-band sum of
  :func:`headrank.analysis.rotary.band_scores` at ``Δ = m − n`` equals ``q_h k_hᵀ`` (rotate-half or
  rotate-every-two pairs, whichever the module uses); a layer without rotary keeps the plain form;
- OV: ``x_v W_V,hᵀ`` equals the module's value states and ``Σ_h ctx_h P_hᵀ`` its output
  projection's output.

Errors are relative to the largest entry they compare (float64 throughout, except the rotary
angles, which transformers computes in float32: :data:`ROT_TOL`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from headrank.analysis.discover import TOL, Capture, _layer_prefix, _rel, forward_capture
from headrank.analysis.rotary import band_scores, rotary_spec
from headrank.io.layouts import AttentionReader, HeadWeights, layout_from_row
from headrank.io.live import LiveCheckpoint

#: transformers computes the rotary angles in float32 (cos, sin of float32 products): the band
#: check is at float32 round-off, the rest at float64's
ROT_TOL = 1e-5


def _calls_by_layer(model: nn.Module, cap: Capture, kind: str) -> dict[int, dict[str, Any]]:
    names = {id(m): n for n, m in model.named_modules()}
    out: dict[int, dict[str, Any]] = {}
    for c in cap.calls:
        where = _layer_prefix(names.get(id(c["module"]), ""))
        if where is not None and names[id(c["module"])] == f"{where[0]}.{kind}":
            out[where[1]] = c
    return out


def _inputs(reader: AttentionReader, cap: Capture, i: int) -> dict[str, torch.Tensor]:
    names = {r: n.removesuffix(".weight") for r, n in reader.tensor_names(i).items()}
    x = {r: cap.io[n][0] for r, n in names.items() if n in cap.io}
    if "qkv" in x:
        x.update(q=x["qkv"], k=x["qkv"], v=x["qkv"])
    x["o_out"] = cap.io[names["o"]][1]
    return x


def _plain_logits(hw: HeadWeights, xq: torch.Tensor, xk: torch.Tensor) -> torch.Tensor:
    """(b, H, n, n): each head's score form ``x_q B_h A_hᵀ x_kᵀ`` from its QK factors."""
    a, b = hw.qk_factors()
    return torch.einsum("bmd,hde,hfe,bnf->bhmn", xq, b.to(xq.dtype), a.to(xq.dtype), xk)


def _module_logits(call: dict[str, Any]) -> torch.Tensor:
    q, k = call["q"], call["k"]
    g = q.shape[1] // k.shape[1]
    return q @ (k.repeat_interleave(g, 1) if g > 1 else k).transpose(-1, -2)


def _rotary_logits(hw: HeadWeights, spec: Any, xq: torch.Tensor, xk: torch.Tensor) -> torch.Tensor:
    n = xq.shape[1]
    delta = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).to(torch.float64)
    wk = hw.kv_for_query_heads(hw.wk)
    heads = [band_scores(hw.wq[h], wk[h], spec, xq[:, :, None, :], xk[:, None, :, :], delta).sum(-1)
             for h in range(hw.wq.shape[0])]
    return torch.stack(heads, 1)


def _check_fixed(reader: AttentionReader, cap: Capture, calls: dict[int, dict[str, Any]],
                 factor: float) -> dict[str, float]:
    """Positions 0: logits, value states and output projection of every layer."""
    err = {"logits": 0.0, "values": 0.0, "output": 0.0}
    for i in sorted(set(calls) & set(reader.layer_ids)):
        hw, call, x = reader.read_layer(i), calls[i], _inputs(reader, cap, i)
        pred = _plain_logits(hw, x["q"], x["k"]) * factor
        err["logits"] = max(err["logits"], _rel(pred, _module_logits(call)))
        v = torch.einsum("bnd,hed->bhne", x["v"], hw.wv.to(x["v"].dtype))
        err["values"] = max(err["values"], _rel(v, call["v"]))
        o = torch.einsum("bnhe,hde->bnd", call["out"], hw.p.to(x["v"].dtype))
        err["output"] = max(err["output"], _rel(o, x["o_out"]))
    return err


def _check_positions(reader: AttentionReader, cap: Capture, calls: dict[int, dict[str, Any]],
                     config: dict[str, Any], dh: int, factor: float) -> dict[str, Any]:
    """Positions 0 … n−1: which layers rotate (and in which pairs), and the largest band error."""
    try:
        spec, _ = rotary_spec(config, dh)
        specs = [spec, dataclasses.replace(spec, style="interleaved" if spec.style == "half" else "half")]
    except ValueError:
        specs = []
    plain, rot, bad, style, err = [], [], [], None, 0.0
    for i in sorted(set(calls) & set(reader.layer_ids)):
        hw, x = reader.read_layer(i), _inputs(reader, cap, i)
        target = _module_logits(calls[i])
        if _rel(_plain_logits(hw, x["q"], x["k"]) * factor, target) < TOL:  # a layer without rotary (NoPE)
            plain.append(i)
            continue
        for s in specs:
            e = _rel(_rotary_logits(hw, s, x["q"], x["k"]) * factor, target)
            if e < ROT_TOL:
                rot.append(i)
                style, err = s.style, max(err, e)
                break
        else:
            bad.append(i)
    out: dict[str, Any] = {"rotary_layers_tiny": rot, "rotary_style": style, "max_band_error": err}
    if bad:
        out["rotary_unconfirmed_layers_tiny"] = bad
    return out


def verify_row(model: nn.Module, cfg: Any, row: dict[str, Any], cap: Capture, ids: torch.Tensor) -> dict[str, Any]:
    """Check ``row`` (a discovered layout) against ``model``'s captured forward ``cap`` (positions
    0) and a second forward at positions 0 … n−1. Returns the errors and, where they are not at
    round-off, ``status`` refused with the reason."""
    layout = layout_from_row(row)
    reader = AttentionReader(LiveCheckpoint(model, cfg.to_dict()), layout)
    calls = _calls_by_layer(model, cap, row["kind"])
    factor = float(row.get("rotary_attention_factor", 1.0))
    err = _check_fixed(reader, cap, calls, factor)
    out: dict[str, Any] = {f"max_{k}_error": float(f"{v:.3g}") for k, v in err.items()}
    worst = max(err, key=err.get)
    if err[worst] >= TOL:
        return {**out, "status": "refused",
                "reason": f"{row['model_type']}: the per-head products miss the module's {worst} by {err[worst]:.2g} "
                          "(relative): layout not confirmed"}
    moved = forward_capture(model, ids, torch.arange(ids.shape[1]).expand_as(ids).contiguous())
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    pos = _check_positions(reader, moved, _calls_by_layer(model, moved, row["kind"]), text.to_dict(),
                           reader.dims.head_dim, factor)
    out.update(pos)
    if pos["rotary_layers_tiny"]:
        out["position"] = "rotary"
    if pos.get("rotary_unconfirmed_layers_tiny"):
        out["position_note"] = ("scores at positions 0..n-1 match neither the plain form nor the per-band rotary "
                                "form (position-dependent beyond rotary, or scaled rotary): products verified at "
                                "relative position 0 only")
    out["layers_checked_tiny"] = sorted(set(calls) & set(reader.layer_ids))
    return out


# -- multi-head latent attention (docs/mla.md) ----------------------------------------------------
def _mla_row(model: nn.Module, cfg: Any, first: Capture) -> dict[str, Any]:
    from headrank.analysis.discover import _strip_prefix, _text

    names = {id(m): n for n, m in model.named_modules()}
    att_name = names[id(first.calls[-1]["module"])]
    layer, _ = _layer_prefix(att_name)
    pattern = layer[: layer.rfind(".") + 1] + "{i}" + att_name[len(layer):]
    q = "q_b_proj" if getattr(first.calls[-1]["module"], "q_b_proj", None) is not None else "q_proj"
    mods = _strip_prefix(model, {r: f"{pattern}.{n}" for r, n in (("q", q), ("kv_b", "kv_b_proj"), ("o", "o_proj"))})
    alt = {**mods, "q": mods["q"].replace(q, "q_proj" if q == "q_b_proj" else "q_b_proj")}
    t = _text(cfg)
    spec = {"n_layers": "num_hidden_layers", "d": "hidden_size", "n_heads": "num_attention_heads",
            "n_kv_heads": "=n_heads", "head_dim": "qk_nope_head_dim",
            "mla": {"nope": "qk_nope_head_dim", "rope": "qk_rope_head_dim", "v": "v_head_dim", "q_in": "q_lora_rank",
                    "kv": "kv_lora_rank"}}
    path = [k for k in ("text_config",) if getattr(cfg, k, None) is t]
    return {"status": "verified", "split": "mla", "modules": mods, "alternatives": [alt], "config_path": path,
            "dims": spec, "position": "rotary (decoupled, MLA)", "qk_norm": False, "kind": att_name[len(layer) + 1:]}


def _mla_parts(reader: AttentionReader, cap: Capture, i: int, att: nn.Module) -> dict[str, torch.Tensor]:
    names = {r: n.removesuffix(".weight") for r, n in reader.tensor_names(i).items()}
    cq = cap.io[names["q"]][0]
    ckv = cap.io[names["kv_b"]][0]
    kv_a = names["kv_b"].replace("kv_b_proj", "kv_a_proj_with_mqa")
    return {"cq": cq, "ckv": ckv.reshape(ckv.shape[0], -1, ckv.shape[-1]), "x": cap.io[kv_a][0],
            "o_out": cap.io[names["o"]][1], "wkr": att.kv_a_proj_with_mqa.weight.detach()}


def _mla_logits(hw: HeadWeights, q_full: torch.Tensor, p: dict[str, torch.Tensor], dims: Any,
                spec: Any | None) -> torch.Tensor:
    """Module-free prediction: non-rotary latent product plus the decoupled rotary part (per band
    with the shared key ``W_KR x`` when ``spec`` is given, else at relative position 0)."""
    nope, rope, _, _, kv = dims.mla
    plain = _plain_logits(hw, p["cq"], p["ckv"])
    wqr = q_full.reshape(dims.n_heads, nope + rope, -1)[:, nope:]
    wkr = p["wkr"][kv:]
    if spec is None:
        rot = torch.einsum("bmq,hrq,rd,bnd->bhmn", p["cq"], wqr, wkr, p["x"])
    else:
        n = p["cq"].shape[1]
        delta = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).to(torch.float64)
        rot = torch.stack([band_scores(wqr[h], wkr, spec, p["cq"][:, :, None], p["x"][:, None], delta).sum(-1)
                           for h in range(dims.n_heads)], 1)
    return plain + rot


def discover_mla(model: nn.Module, cfg: Any, first: Capture, ids: torch.Tensor) -> dict[str, Any]:
    """A multi-head latent attention row, verified: logits at positions 0 and per rotary band at
    positions 0 … n−1, value states and output projection (docs/mla.md)."""
    from headrank.analysis.discover import _zero_biases

    row = {"model_type": cfg.model_type, **_mla_row(model, cfg, first)}
    _zero_biases(model)
    reader = AttentionReader(LiveCheckpoint(model, cfg.to_dict()), layout_from_row(row))
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    spec, _ = rotary_spec({**text.to_dict(), "partial_rotary_factor": 1.0}, reader.dims.mla[1])
    err = {"logits": 0.0, "values": 0.0, "output": 0.0, "band": 0.0}
    styles = set()
    for positions in (torch.zeros_like(ids), torch.arange(ids.shape[1]).expand_as(ids).contiguous()):
        cap = forward_capture(model, ids, positions)
        calls = _calls_by_layer(model, cap, row["kind"])
        for i in sorted(set(calls) & set(reader.layer_ids)):
            hw, call = reader.read_layer(i), calls[i]
            att = call["module"]
            p = _mla_parts(reader, cap, i, att)
            q_full = reader.ckpt.get(reader.tensor_names(i)["q"])
            target = _module_logits(call)
            if not positions.any():
                err["logits"] = max(err["logits"], _rel(_mla_logits(hw, q_full, p, reader.dims, None), target))
                v = torch.einsum("bnd,hed->bhne", p["ckv"], hw.wv)
                err["values"] = max(err["values"], _rel(v, call["v"]))
                o = torch.einsum("bnhe,hde->bnd", call["out"], hw.p)
                err["output"] = max(err["output"], _rel(o, p["o_out"]))
                continue
            other = dataclasses.replace(spec, style="interleaved" if spec.style == "half" else "half")
            best = min((_rel(_mla_logits(hw, q_full, p, reader.dims, s), target), s.style if s else "none")
                       for s in (spec, other, None))  # None: the decoupled part without rotation (NoPE)
            err["band"] = max(err["band"], best[0])
            styles.add(best[1])
    out = {**row, **{f"max_{k}_error": float(f"{v:.3g}") for k, v in err.items()},
           "rotary_style": ",".join(sorted(styles)), "layers_checked_tiny": list(reader.layer_ids)}
    worst = max(("logits", "values", "output"), key=err.get)
    if err[worst] >= TOL or err["band"] >= ROT_TOL:
        what, e = (worst, err[worst]) if err[worst] >= TOL else ("rotary band logits", err["band"])
        out.update(status="refused", reason=f"{row['model_type']}: the MLA products miss the module's {what} by "
                                            f"{e:.2g} (relative): layout not confirmed")
    return out
