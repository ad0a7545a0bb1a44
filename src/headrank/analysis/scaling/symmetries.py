"""Attention pair symmetries, per head (docs/methods/scale.md), found through the layout table
(:mod:`headrank.io.layouts`, read by its :class:`~headrank.io.layouts.AttentionReader`, aliases
included), so fused, interleaved, Conv1D and grouped-query layouts are handled the same way:

- QK: ``W_Q,h → c W_Q,h`` (and its bias), ``W_K,h → W_K,h / c`` (and its bias);
- OV: ``W_V,h → c W_V,h`` (and its bias), ``P_h → P_h / c`` (head h's columns of W_O).

Both leave the function unchanged; the one-sided change (only W_Q,h or only W_V,h) is measured
beside it as a control that does change it. With grouped-query attention a kv head is shared,
so the symmetry acts on a kv head and all its query heads together (one row per kv head).
Pair deviations are measured at the output of the layer's attention module (its inputs captured
from one forward pass of the whole model); one whole-model check scales every head of every
layer at once, with a different random c per head.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn as nn

from headrank.analysis.scaling.invariance import DEFAULT_SCALES, _flat, check_scales
from headrank.errors import HeadRankError
from headrank.io.layouts import SPLITS, AttentionReader, Dims, Layout
from headrank.io.live import LiveCheckpoint
from headrank.models.opener import first_tensor


@dataclass
class AttentionSite:
    """One layer's attention tensors in a live model, with head → entry index maps."""

    layer: int
    module_name: str
    weights: dict[str, str]  # role → parameter name
    biases: dict[str, str]  # role → parameter name of its bias (present ones only)
    index: Any  # HeadWeights of global float64 indices
    offsets: dict[str, tuple[int, int]]
    conv1d: bool


def _common_module(names: Iterable[str]) -> str:
    parts = [n.split(".")[:-2] for n in names]  # drop "<linear>.weight"
    common = []
    for segs in zip(*parts, strict=False):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


def attention_sites(model: nn.Module, layout: Layout, config: dict[str, Any]) -> tuple[list[AttentionSite], Dims]:
    """Every layer's attention tensors of ``model``, read through the layout table exactly as
    :class:`~headrank.io.layouts.AttentionReader` reads a checkpoint (prefix search, the row's
    aliases, shape checks, per-head split); the attention module of a layer is the longest
    common module path of its resolved tensor names."""
    reader = AttentionReader(LiveCheckpoint(model, config), layout)
    dims = reader.dims
    params = dict(model.named_parameters(remove_duplicate=False))
    sites = []
    for i in range(dims.n_layers):
        weights = reader.tensor_names(i)
        absent = [n for n in weights.values() if n not in params]
        if absent:
            raise HeadRankError(f"model has no parameter {absent[0]!r}")
        raw, offsets, off = {}, {}, 0
        for role, name in weights.items():
            p = params[name]
            raw[role] = torch.arange(off, off + p.numel(), dtype=torch.float64).reshape(p.shape)
            offsets[role] = (off, off + p.numel())
            off += p.numel()
        try:
            index = SPLITS[reader.split](raw, dims)
        except Exception as e:  # layouts._Shape: shapes contradict the config
            raise HeadRankError(f"layer {i}: attention tensors do not match the config "
                                f"({getattr(e, 'role', '')} {getattr(e, 'got', '')} vs {getattr(e, 'want', '')})") from None
        biases = {r: n.removesuffix(".weight") + ".bias" for r, n in weights.items() if r != "o"}
        biases = {r: n for r, n in biases.items() if n in params}
        sites.append(AttentionSite(i, _common_module(weights.values()), weights, biases, index, offsets,
                                   conv1d=reader.split == "conv1d_fused"))
    return sites, dims


def _edits(site: AttentionSite, params: dict[str, torch.Tensor], sel: torch.Tensor, factor: float,
           with_bias: bool) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(parameter, flat indices, factor) for the weight entries in ``sel`` (global indices),
    plus the bias entries of their output rows when ``with_bias``."""
    sel = sel.reshape(-1).to(torch.int64)
    out = []
    for role, (lo, hi) in site.offsets.items():
        local = sel[(sel >= lo) & (sel < hi)] - lo
        if local.numel() == 0:
            continue
        p = params[site.weights[role]]
        out.append((p, local, factor))
        if with_bias and role in site.biases:
            cols = p.shape[1]
            rows = (local % cols) if site.conv1d else (local // cols)
            out.append((params[site.biases[role]], torch.unique(rows), factor))
    return out


@contextmanager
def _applied(edits: list[tuple[torch.Tensor, torch.Tensor, float]]) -> Iterator[None]:
    touched = {id(p): p for p, _, _ in edits}
    saved = {k: p.detach().clone() for k, p in touched.items()}
    try:
        with torch.no_grad():
            for p, idx, f in edits:
                if not p.is_contiguous():
                    raise HeadRankError("cannot edit a non-contiguous parameter in place")
                flat = p.view(-1)
                flat[idx] = flat[idx] * f
        yield
    finally:
        with torch.no_grad():
            for k, p in touched.items():
                p.copy_(saved[k])


def pair_edits(site: AttentionSite, params: dict[str, torch.Tensor], kv_head: int, product: str, c: float,
               one_sided: bool = False) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """The in-place edits of a pair symmetry (or its one-sided control) for one kv head."""
    hw = site.index
    g = hw.group
    qheads = slice(kv_head * g, (kv_head + 1) * g)
    if product == "qk":
        e = _edits(site, params, hw.wq[qheads], c, True)
        if not one_sided:
            e += _edits(site, params, hw.wk[kv_head], 1.0 / c, True)
    elif product == "ov":
        e = _edits(site, params, hw.wv[kv_head], c, True)
        if not one_sided:
            e += _edits(site, params, hw.p[qheads], 1.0 / c, False)
    else:
        raise ValueError(product)
    return e


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = _flat(a), _flat(b)
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


Captured = dict[int, tuple[tuple, dict, torch.Tensor]]  # layer → (args, kwargs, output) of its attention module


def _capture(model: nn.Module, forward: Callable[[], Any], sites: list[AttentionSite]) -> tuple[Captured, torch.Tensor]:
    """One forward pass of the whole model with every attention module's inputs and output
    captured; returns them and the model's (flattened) output."""
    captured: Captured = {}
    hooks = []
    for s in sites:
        mod = model.get_submodule(s.module_name)

        def hook(m, args, kwargs, out, i=s.layer):
            captured[i] = (args, kwargs, first_tensor(out).detach().clone())

        hooks.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            y0 = _flat(forward())
    finally:
        for h in hooks:
            h.remove()
    return captured, y0


def _head_rows(model: nn.Module, sites: list[AttentionSite], dims: Dims, params: dict[str, torch.Tensor],
               captured: Captured, scales: tuple[float, ...],
               progress: Callable[[int, int], None] | None) -> list[dict[str, Any]]:
    """One row per layer, kv head and product: the pair symmetry's deviation (max over c) and
    the one-sided control's (min over c) at the attention module's output."""
    rows = []
    total = len(sites) * dims.n_kv_heads
    done = 0
    g = dims.n_heads // dims.n_kv_heads
    for s in sites:
        mod = model.get_submodule(s.module_name)
        args, kwargs, ref = captured[s.layer]

        def local() -> torch.Tensor:
            return first_tensor(mod(*args, **kwargs))  # noqa: B023 - called within this iteration

        base_dev = _rel(local(), ref)  # re-running the module reproduces the captured output
        for j in range(dims.n_kv_heads):
            for product in ("qk", "ov"):
                pair, one = [], []
                for c in scales:
                    with _applied(pair_edits(s, params, j, product, c)):
                        pair.append(_rel(local(), ref))
                    with _applied(pair_edits(s, params, j, product, c, one_sided=True)):
                        one.append(_rel(local(), ref))
                rows.append({"layer": s.layer, "kv_head": j, "heads": f"{j * g}-{(j + 1) * g - 1}" if g > 1 else str(j),
                             "product": product, "pair_dev": max(pair), "one_sided_dev": min(one),
                             "rerun_dev": base_dev})
            done += 1
            if progress:
                progress(done, total)
    return rows


def _whole_model_devs(forward: Callable[[], Any], sites: list[AttentionSite], dims: Dims,
                      params: dict[str, torch.Tensor], y0: torch.Tensor, seed: int) -> dict[str, float]:
    """Per product: the whole model's deviation with every head of every layer scaled at once,
    a random c per head (log-uniform in [1/4, 4], drawn from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    whole = {}
    for product in ("qk", "ov"):
        edits = []
        for s in sites:
            for j in range(dims.n_kv_heads):
                c = float(torch.exp(torch.empty(1).uniform_(math.log(0.25), math.log(4.0), generator=gen)))
                edits += pair_edits(s, params, j, product, c)
        with _applied(edits):
            whole[product] = _rel(forward(), y0)
    return whole


def _wrong_partner_dev(model: nn.Module, sites: list[AttentionSite], dims: Dims, params: dict[str, torch.Tensor],
                       captured: Captured, c: float) -> float:
    """Layer 0's deviation with Q of query-head group 1 scaled by c and K of kv head 0 by 1/c
    (a pair that is not a symmetry); NaN without grouped kv heads to mismatch."""
    if dims.n_kv_heads <= 1:
        return math.nan
    g = dims.n_heads // dims.n_kv_heads
    s = sites[0]
    mod = model.get_submodule(s.module_name)
    args, kwargs, ref = captured[s.layer]
    e = _edits(s, params, s.index.wq[g:2 * g], c, True) + _edits(s, params, s.index.wk[0], 1.0 / c, True)
    with _applied(e):
        return _rel(first_tensor(mod(*args, **kwargs)), ref)


def pair_symmetries(model: nn.Module, forward: Callable[[], Any], layout: Layout, config: dict[str, Any], *,
                    scales: Iterable[float] = DEFAULT_SCALES, seed: int = 0,
                    progress: Callable[[int, int], None] | None = None) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per kv head and product: deviation of the attention module's output under the pair
    symmetry (``pair_dev``, max over c) and under the one-sided control (``one_sided_dev``).

    Also returns whole-model deviations (every head of every layer scaled at once, a random
    c per head in [1/4, 4]) for each product, and the maximum deviation with the pair applied
    to the wrong partner (kv head j's K with query head group j+1's Q) as a second control.
    """
    scales = check_scales(scales)
    sites, dims = attention_sites(model, layout, config)
    params = dict(model.named_parameters(remove_duplicate=False))
    captured, y0 = _capture(model, forward, sites)
    with torch.no_grad():
        rows = _head_rows(model, sites, dims, params, captured, scales, progress)
        whole = _whole_model_devs(forward, sites, dims, params, y0, seed)
        wrong = _wrong_partner_dev(model, sites, dims, params, captured, scales[-1])
    extra = {"whole_model_qk": whole["qk"], "whole_model_ov": whole["ov"], "wrong_partner_qk_layer0": wrong}
    cols = ["layer", "kv_head", "heads", "product", "pair_dev", "one_sided_dev", "rerun_dev"]
    return pd.DataFrame(rows, columns=cols), extra
