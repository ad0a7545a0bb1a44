"""A network with skips as an ensemble of shallow networks (docs/methods/collapse.md).

With the attention probabilities and the norms' per-token scales frozen at their values in the
forward pass, each layer maps its input ``Y`` affinely: ``Y ↦ skip(Y) + heads(Y) + c`` with
``skip`` and ``heads`` linear (the heads of the layer summed) and ``c`` a constant (biases and
LayerNorm's shift; none in the project's bias-free models). Expanding the product over layers,
the output is exactly the sum of the ensemble's **members**: one per subset S of layers (the
heads of S traversed, the skip taken at the others) starting from the embedding, and one per
(layer l that adds a constant, subset of the later layers). A member's **length** is the number
of layers whose heads it passes, ``k = |S|``; the members of length k sum to the length-k part
of the path decomposition (:func:`headrank.analysis.collapse.paths.path_restricted`).

Measured per sequence (:func:`ensemble_measures`): the share of ``Σ_k ‖Y_k‖_F`` carried by the
lengths ``k ≤ L/2`` (the short paths), and how dependent the members are: the norm-weighted mean
absolute Pearson correlation between distinct members' outputs, ``Σ_{S≠T} |⟨ỹ_S, ỹ_T⟩| /
Σ_{S≠T} ‖ỹ_S‖‖ỹ_T‖`` with ``ỹ`` a member's output (tokens × features, flattened) minus its mean
(0: uncorrelated members, 1: all proportional).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headrank.analysis.collapse.paths import _frozen_attention, _frozen_norm
from headrank.analysis.collapse.surgery import _replay
from headrank.errors import HeadRankError


@dataclass
class LayerMaps:
    """One layer with frozen attention and norm scales: ``Y ↦ skip(Y) + heads(Y) + const``."""

    skip: Callable[[torch.Tensor], torch.Tensor]
    heads: Callable[[torch.Tensor], torch.Tensor]
    const: torch.Tensor | None = None


def members(x0: torch.Tensor, maps: list[LayerMaps]) -> dict[tuple[int, tuple[int, ...]], torch.Tensor]:
    """Every member's output, keyed ``(origin, S)``: origin −1 for the embedding ``x0``, l for the
    constant layer l adds; S the layers (0-based) whose heads the member passes."""
    cur: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {(-1, ()): x0}
    for layer, m in enumerate(maps):
        nxt = {}
        for (origin, S), Y in cur.items():
            nxt[(origin, S)] = m.skip(Y)
            nxt[(origin, (*S, layer))] = m.heads(Y)
        if m.const is not None:
            nxt[(layer, ())] = m.const
        cur = nxt
    return cur


def project_maps(model, ids: torch.Tensor) -> tuple[torch.Tensor, list[LayerMaps], torch.Tensor]:
    """``(x0, maps, output)`` of the project's Transformer on ``ids``: the embedding output, each
    block's frozen maps (pre-, post- or no norm) and the last block's output (before any final
    norm). Needs skips, no MLP, no biases."""
    cfg = model.config
    if not cfg.skip or cfg.mlp or cfg.bias:
        raise HeadRankError("the ensemble decomposition needs skip=True, mlp=False, bias=False")
    with torch.no_grad():
        _, hidden = model(ids, return_hidden=True)
        maps = []
        for block, x in zip(model.blocks, hidden[:-1], strict=True):
            attn, norm = block.attn, block.attn_norm
            if block.placement == "post":
                s, probs = x + attn(x), attn.attention_probs(x)
                maps.append(LayerMaps(skip=lambda Y, n=norm, s=s: _frozen_norm(n, Y, s),
                                      heads=lambda Y, a=attn, n=norm, s=s, p=probs: _frozen_norm(
                                          n, _frozen_attention(a, Y, p), s)))
            else:
                probs = attn.attention_probs(norm(x))
                maps.append(LayerMaps(skip=lambda Y: Y, heads=lambda Y, a=attn, n=norm, x=x, p=probs:
                                      _frozen_attention(a, _frozen_norm(n, Y, x), p)))
    return hidden[0], maps, hidden[-1]


def _frozen_layernorm(ln: torch.nn.LayerNorm, z: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """The linear part of ``ln`` with its per-token scale frozen at its value on ``z``:
    ``Y ↦ (Y − mean_features(Y)) / σ(z) · weight`` (the shift is a constant member)."""
    sigma = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + ln.eps)
    return lambda Y: (Y - Y.mean(-1, keepdim=True)) / sigma * ln.weight


def _heads(P: torch.Tensor, Y: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    """``Σ_h P_h Y W_V,hᵀ W_O,hᵀ`` (no biases) for probabilities P (1, H, n, n), Y (B, n, d) and
    ``nn.Linear`` weights ``wv`` (H·dh, d), ``wo`` (d, H·dh)."""
    B, n, _ = Y.shape
    H = P.shape[1]
    v = (Y @ wv.T).view(B, n, H, -1).transpose(1, 2)  # (B, H, n, dh)
    return (P @ v).transpose(1, 2).reshape(B, n, -1) @ wo.T


def bert_skip_maps(adapter, cap: dict[str, Any]) -> tuple[torch.Tensor, list[LayerMaps], torch.Tensor]:
    """``(x0, maps, output)`` of a BERT-style model's ``skip`` variant (attention + skips, no MLP:
    ``x ← LN(x + dense(attention(x)))``, :mod:`~headrank.analysis.collapse.surgery`) on one
    sequence: the embedding output, each layer's frozen maps (its own probabilities on the
    variant's hidden states, LayerNorm's scale on the variant's pre-norm sum; the value and
    output biases and LayerNorm's shift as the layer's constant) and the variant's last hidden
    state (as these maps compute it; :func:`bert_ensemble` checks the members' sum against
    :func:`~headrank.analysis.collapse.surgery.run_variant`)."""
    mods = getattr(adapter, "modules", None)
    if mods is None or mods.placement != "post" or not mods.attn_out:
        raise HeadRankError("the ensemble decomposition of a pretrained model reads BERT-style post-norm layers")
    x, maps = cap["emb"], []
    with torch.no_grad():
        for i, layer in enumerate(adapter.layers):
            sa, so = layer.get_submodule(mods.attn), layer.get_submodule(mods.attn_out)
            args, kwargs = _replay(cap["calls"][i], x)
            out = sa(*args, **kwargs)
            probs = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if probs is None:
                raise HeadRankError("the attention module returned no probabilities (eager attention needed)")
            z = so.dense(out[0]) + x
            lin = _frozen_layernorm(so.LayerNorm, z)
            c = so.dense.weight @ (sa.value.bias if sa.value.bias is not None else 0.0) \
                + (so.dense.bias if so.dense.bias is not None else 0.0)
            const = lin(torch.zeros_like(x) + c) + (so.LayerNorm.bias if so.LayerNorm.bias is not None else 0.0)
            maps.append(LayerMaps(skip=lin, heads=lambda Y, P=probs, v=sa.value.weight, o=so.dense.weight, lin=lin:
                                  lin(_heads(P, Y, v, o)), const=const))
            x = so.LayerNorm(z)
    return cap["emb"], maps, x


def ensemble_measures(parts: dict[tuple[int, tuple[int, ...]], torch.Tensor], n_layers: int,
                      output: torch.Tensor) -> dict[str, Any]:
    """Per sequence (the leading batch index of every member): the norm share of each length
    k = 0..L, the share of the lengths k ≤ L/2 (``short_share``), the members' norm-weighted mean
    |Pearson r| (``dependence``) and its unweighted mean over pairs of nonzero members, and the
    relative error of the members' sum against ``output`` (the model's own forward)."""
    keys = list(parts)
    Y = torch.stack([parts[k] for k in keys]).double()  # (members, B, n, d)
    lengths = np.array([len(S) for _, S in keys])
    total = Y.sum(0)
    err = ((total - output.double()).flatten(1).norm(dim=1) / output.double().flatten(1).norm(dim=1)).numpy()
    fro = np.stack([Y[lengths == k].sum(0).flatten(1).norm(dim=1).numpy() for k in range(n_layers + 1)], 1)
    share = fro / fro.sum(1, keepdims=True)  # (B, L+1)
    flat = Y.flatten(2)  # (members, B, n·d)
    flat = flat - flat.mean(-1, keepdim=True)
    G = torch.einsum("mbx,nbx->bmn", flat, flat).numpy()  # (B, members, members)
    nrm = np.sqrt(np.clip(np.einsum("bmm->bm", G), 0.0, None))
    off = ~np.eye(len(keys), dtype=bool)
    w = (nrm[:, :, None] * nrm[:, None, :])[:, off]
    dep = np.abs(G[:, off]).sum(1) / w.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(G[:, off]) / w
    unweighted = np.array([np.nanmean(row[wr > 0]) if (wr > 0).any() else np.nan for row, wr in zip(r, w, strict=True)])
    return {"share_by_k": share.tolist(), "short_share": share[:, : n_layers // 2 + 1].sum(1).tolist(),
            "dependence": dep.tolist(), "mean_abs_r": unweighted.tolist(), "n_members": len(keys),
            "sum_rel_error": float(err.max())}


def project_ensemble(model, ids: torch.Tensor) -> dict[str, Any]:
    """:func:`ensemble_measures` of the project's Transformer (skips, no MLP, no bias) on ``ids``
    (B, T), float64 (the model is converted in place)."""
    model = model.double().eval()
    x0, maps, out = project_maps(model, ids)
    with torch.no_grad():
        parts = members(x0, maps)
    return ensemble_measures(parts, len(maps), out)


def bert_ensemble(adapter, seqs: list[list[int]]) -> dict[str, Any]:
    """:func:`ensemble_measures` of a BERT-style model's ``skip`` variant, one sequence at a
    time (unpadded), the per-sequence lists concatenated; the members' sum is checked against
    the variant's output as :func:`~headrank.analysis.collapse.surgery.run_variant` computes it."""
    from headrank.analysis.collapse.surgery import run_variant

    rows: dict[str, Any] = {}
    for ids in seqs:
        cap = adapter.reference(torch.tensor([ids]))
        x0, maps, _ = bert_skip_maps(adapter, cap)
        with torch.no_grad():
            m = ensemble_measures(members(x0, maps), len(maps), run_variant(adapter, cap, "skip")[-1])
        for k, v in m.items():
            if isinstance(v, list):
                rows.setdefault(k, []).extend(v)
        rows["n_members"] = m["n_members"]
        rows["sum_rel_error"] = max(rows.get("sum_rel_error", 0.0), m["sum_rel_error"])
    return rows


def pretrained_ensemble(source, *, n_seqs: int, max_tokens: int, seed: int = 0, min_tokens: int = 8) -> dict[str, Any]:
    """:func:`bert_ensemble` of a pretrained BERT-style model on the sentences
    :func:`~headrank.analysis.collapse.analyze` uses (float64)."""
    from headrank.analysis.collapse.surgery import make_adapter, surgery_modules
    from headrank.models.opener import open_model

    op = open_model(source, dtype=torch.float64, n_inputs=0, what="collapse", check=surgery_modules)
    seqs = op.sequences(n_seqs, max_tokens=max_tokens, min_tokens=min_tokens)
    return bert_ensemble(make_adapter(op, "pretrained", seed), seqs.ids)
