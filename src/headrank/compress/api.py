"""``headrank compress``: cut every head's products to the rank chosen, write the checkpoint.

The layers stream past once, each read by a reader thread while the previous one is cut (one
layer or two in memory): each unit's spectrum and SVD from its factors' roots, its rank (a rule
of the unit's own: ``keep``, ``rank``), the exact cut (:mod:`.cut`) from that SVD, and the new
tensors, zero-padded (dense) or only the kept dimensions (factored, :mod:`.kept`), handed to the
writer (:mod:`.write`). A global budget (``params``) takes two passes: every spectrum first,
with the SVDs kept, then the cuts. ``compress.json``: per unit k, kept energy, Frobenius error,
and what a factored deployment saves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from headrank.compress import rotary_cut
from headrank.compress.cut import (
    CUT_ORDER,
    cut_biases,
    cut_unit,
    join,
    join_biases,
    split_biases,
    unit_basis,
    unit_factors,
)
from headrank.compress.plan import Rule, choose
from headrank.errors import HeadRankError
from headrank.io.layouts import AttentionReader, HeadWeights
from headrank.io.sources import open_reader
from headrank.util.threads import computing, torch_threads

KV_BYTES = 2  # bytes per cached number (a float16/bfloat16 KV cache)


def qk_rotary(reader: AttentionReader) -> tuple[Any, str | None]:
    """``(rotary spec or None, refusal or None)``: how QK can be cut on this model.

    Without rotary embeddings the whole ``W_Kᵀ W_Q`` is cut; with them only whole bands and the
    non-rotary part (:mod:`.rotary_cut`); with QK normalisation not at all (a per-head norm of q
    and k does not commute with any cut of their projections)."""
    if reader.qk_norm:
        return None, "q and k are normalised per head before the score: a cut of W_K^T W_Q does not commute with that"
    if reader.position != "rotary":
        return None, None
    from headrank.analysis.rotary import rotary_spec

    try:
        spec, _ = rotary_spec(reader.ckpt.config, reader.dims.head_dim)
    except ValueError as e:
        return None, f"rotary position embeddings, and the rotary layout is unreadable ({e})"
    return spec, None


def parse_products(products: str | list[str] | tuple[str, ...] | None, reader: AttentionReader
                   ) -> tuple[tuple[str, ...], str | None]:
    """The products to cut and a note (QK skipped by default where it cannot be cut)."""
    _, refusal = qk_rotary(reader)
    if products is None:
        return (("ov",), f"QK not cut: {refusal}") if refusal else (CUT_ORDER, None)
    items = products.split(",") if isinstance(products, str) else list(products)
    items = [p.strip().lower() for p in items if p.strip()]
    bad = [p for p in items if p not in CUT_ORDER]
    if bad or not items:
        raise HeadRankError(f"`products` must name ov and/or qk (comma-separated); got {products!r}")
    if "qk" in items and refusal:
        raise HeadRankError(f"`products` qk: {refusal}; cut OV only (`products` ov)")
    return tuple(p for p in CUT_ORDER if p in items), None


def open_source(source: Any, verbose: bool = False, **kw: Any) -> tuple[AttentionReader, Any, str | None]:
    """The reader, the live Hugging Face model when one had to be loaded (GGUF), and a note.

    A GGUF file is loaded with transformers (:func:`headrank.models.opener.load_gguf`,
    dequantized to float32): the compressed checkpoint is written as safetensors with Hugging
    Face names. transformers' own progress bars (its GGUF reader's among them) are silenced
    unless ``verbose``."""
    reader = open_reader(source, **kw)
    if reader.parts:
        raise HeadRankError(f"compress: {reader.layout.model_types[0]!r} is an encoder-decoder (encoder, decoder and "
                            "cross-attention): cutting it is not supported (spectra and track measure it)")
    if reader.split == "mla":
        raise HeadRankError(f"compress: {reader.layout.model_types[0]!r} uses multi-head latent attention, whose heads "
                            "share the latent projections: cutting one head's product is not supported (spectra "
                            "measures it; docs/mla.md)")
    if len(getattr(reader, "layer_ids", ())) != reader.dims.n_layers:
        raise HeadRankError(f"compress: {reader.layout.model_types[0]!r} has softmax attention in only some layers "
                            "(a hybrid): not supported (spectra measures those layers)")
    if reader.origin.get("input") != "gguf" and "gguf" not in reader.origin:
        return reader, None, None
    from headrank.models.opener import load_gguf

    path = Path(reader.ckpt.path)
    model, tok = load_gguf(path, what="compress (a GGUF source)", verbose=verbose)
    model._headrank_tokenizer = tok
    live = open_reader(model)
    live.origin = {**reader.origin, "loaded_with": "transformers gguf_file= (dequantized to float32)"}
    live.source_file = path  # what the uncut baseline's cache key is made from (the live model has no files)
    return live, model, (f"GGUF source {path.name}: written as safetensors (float32, dequantized by "
                         "transformers), not GGUF")


@dataclass
class Plan:
    """What will be cut: products, ranks per product ``(layers, units)``, the spectra they were
    chosen on, optional whitening matrices per layer. ``streamed``: ranks that each unit's own
    spectrum decides (``keep``, ``rank``) are chosen as the layers stream past in the one pass
    over them (:func:`cut_layers` fills ``spectra`` and ``ranks``); a global budget (``params``)
    needs every spectrum first (pass 1, :func:`make_plan`), and ``roots`` keeps pass 1's SVDs
    for the cut."""

    rule: Rule
    products: tuple[str, ...]
    ranks: dict[str, torch.Tensor]
    spectra: dict[str, torch.Tensor]
    cost: dict[str, int]
    whiten: dict[int, torch.Tensor] | None = None
    rotary: Any = None  # RotarySpec: QK cut by whole bands (+ the non-rotary part)
    layers: tuple[int, ...] | None = None  # the layers cut (ranks[p][j] is layers[j]'s); None: all
    # pass 1's result the cut starts from, per product and cut layer: the roots' Basis (its SVD);
    # a rotary QK: its band items
    roots: dict[str, list[Any]] | None = None
    streamed: bool = False
    device: str | None = None  # a torch device for the roots, SVDs and GEMMs; None: the CPU route

    def cut_layers(self, n_layers: int) -> tuple[int, ...]:
        return tuple(range(n_layers)) if self.layers is None else self.layers


@dataclass
class Layer:
    """One layer as stored: the attention weights by role, split into heads, and its biases by role."""

    i: int
    names: dict[str, str]
    raw: dict[str, torch.Tensor]
    hw: HeadWeights
    bias_names: dict[str, str]
    biases: dict[str, torch.Tensor]
    _qk: Any = None

    def qk64(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`.rotary_cut.groups` of this layer, made once (a rotary QK's spectra, cut, biases)."""
        if self._qk is None:
            self._qk = rotary_cut.groups(self.hw)
        return self._qk


def read_layer(reader: AttentionReader, i: int) -> Layer:
    """Layer ``i``'s attention weights and biases, read once, checked (shapes, dtypes, NaN/Inf)."""
    names, raw = reader.read_raw(i)
    hw = reader.split_raw(names, raw)
    bad = [n for n in ("wq", "wk", "wv", "p") if not _finite(getattr(hw, n))]
    if bad:
        raise HeadRankError(f"layer {i} holds NaN/Inf attention weights ({', '.join(bad)}): nothing to cut")
    bias_names = _bias_names(reader, i)
    return Layer(i, names, raw, hw, bias_names, {r: reader.ckpt.get(n) for r, n in bias_names.items()})


def make_plan(reader: AttentionReader, rule: Rule, products: tuple[str, ...],
              whiten: dict[int, torch.Tensor] | None = None,
              progress: Callable[[int, int], None] | None = None, layers: tuple[int, ...] | None = None,
              threads: int = 1, device: str | None = None, stream: bool = False) -> Plan:
    """Pass 1: every unit's spectrum (whitened when ``whiten`` gives a matrix per layer), then
    ranks; only ``layers`` (default all) are cut. ``stream``: where the rule lets each unit's own
    spectrum decide its rank, no pass 1 (:attr:`Plan.streamed`). ``device``: see :class:`Plan`."""
    d = reader.dims
    g = d.n_heads // d.n_kv_heads
    spec = qk_rotary(reader)[0] if "qk" in products else None
    todo = tuple(range(d.n_layers)) if layers is None else tuple(layers)
    cost = {p: (g + 1) * d.d for p in products}
    sel = None if layers is None else todo
    if stream and rule.kind in ("keep", "rank"):
        return Plan(rule, products, {}, {}, cost, whiten, spec, sel, None, True, device)
    sv: dict[str, list[torch.Tensor]] = {p: [] for p in products}
    roots: dict[str, list[Any]] = {p: [] for p in products}
    with torch_threads(1), reader.stream(todo, partial(read_layer, reader)) as stream:  # the workers share the heads, one torch thread each
        for j, (_, layer) in enumerate(stream):
            for p, (s, b) in _spectra(layer, products, whiten, spec, threads, device).items():
                sv[p].append(s)
                roots[p].append(b)
            del layer
            if progress:
                progress(j + 1, 2 * len(todo))
    spectra = {p: torch.stack(v) for p, v in sv.items()}
    return Plan(rule, products, choose(rule, spectra, cost, d.head_dim), spectra, cost, whiten, spec, sel, roots,
                False, device)


def _spectra(layer: Layer, products: tuple[str, ...], whiten: dict[int, torch.Tensor] | None, spec: Any,
             threads: int, device: str | None) -> dict[str, tuple[torch.Tensor, Any]]:
    """Per product, the units' spectra of one layer and what the cut uses: the :class:`~.cut.Basis`,
    or for a rotary QK (cut by whole bands) :func:`.rotary_cut.items`."""
    out = {}
    for p in products:
        if p == "qk" and spec is not None:  # the items (pseudo-spectrum, tags) kept for the cut
            found = rotary_cut.items(layer.hw, spec, layer.qk64())
            out[p] = (found[0], found)
            continue
        with computing(threads=threads, device=device):
            b = unit_basis(layer.hw, p, None if whiten is None else whiten[layer.i])
        out[p] = (b.sv.cpu(), b)
    return out


def _finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in ``t``: one sum (NaN and ±Inf survive it; a tenth of the per-element
    check's time), the per-element check only where the sum is not finite (it overflowed)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


@dataclass
class LayerCut:
    """One layer after the cut: the tensors to write by full name, in the stored dtypes (the
    factored format: only the kept dimensions), factored.json's entries, compress.json's rows,
    and the layer's attention tensors the cut left as stored (the products not cut)."""

    i: int
    tensors: dict[str, torch.Tensor]
    entries: dict[str, Any]
    rows: list[dict[str, Any]]
    same: dict[str, torch.Tensor]


def cut_products(layer: Layer, plan: Plan, j: int, threads: int = 1) -> tuple[dict[str, Any], tuple | None]:
    """Pass 2's cut of each product of one layer (the plan's ``j``-th cut layer): the
    :class:`~.cut.UnitCut` per product and, for a rotary QK, its kept bands."""
    cuts, rot = {}, None
    for p in plan.products:
        if p == "qk" and plan.rotary is not None:
            found = plan.roots[p][j] if plan.roots is not None else None
            with torch_threads(threads):
                cuts[p], keep, part = rotary_cut.cut(layer.hw, plan.rotary, plan.ranks[p][j], found, layer.qk64())
            rot = (plan.rotary, keep, part, layer.qk64())
            continue
        X, S = unit_factors(layer.hw, p)
        L = None if plan.whiten is None else plan.whiten[layer.i]
        basis = plan.roots[p][j] if plan.roots is not None else None
        fast = basis is not None and basis.A is not None  # the units shared by the workers
        with torch_threads(1 if fast else threads):
            cuts[p] = cut_unit(X, S, plan.ranks[p][j], p, L, basis, threads, plan.device)
    return cuts, rot


def layer_tensors(layer: Layer, reader: AttentionReader, plan: Plan, cuts: dict[str, Any], rot: tuple | None,
                  factored: bool = False) -> LayerCut:
    """The tensors of one cut layer: zero-padded to the stored shapes, or (``factored``) only
    the kept dimensions (:func:`.kept.kept_tensors`), with the rows of compress.json."""
    shapes = {r: tuple(t.shape) for r, t in layer.raw.items()}
    padded = lambda: {p: c.padded(reader.dims.head_dim) for p, c in cuts.items()}  # noqa: E731
    biases = _biases(reader, layer, shapes, padded, rot)
    if factored:
        from headrank.compress.kept import kept_tensors

        tensors, entries = kept_tensors(layer.names, layer.raw, cuts, biases, reader.dims)
    else:
        new = _replace(layer.hw, padded())
        tensors = {layer.names[r]: t.to(layer.raw[r].dtype) for r, t in
                   join(reader.split, shapes, reader.dims, new).items() if not _same(t, layer.raw[r])}
        tensors.update(biases)
        entries = {}
    same = {n: layer.raw[r] for r, n in layer.names.items() if n not in tensors}
    same.update({n: layer.biases[r] for r, n in layer.bias_names.items() if n not in tensors})
    return LayerCut(layer.i, tensors, entries, _rows(layer.i, plan, cuts, reader), same)


def _same(t: torch.Tensor, raw: torch.Tensor) -> bool:
    return t.dtype == raw.dtype and t.shape == raw.shape and t.data_ptr() == raw.data_ptr() and t.stride() == raw.stride()


def _replace(hw: HeadWeights, cuts: dict[str, Any]) -> HeadWeights:
    H = hw.wq.shape[0]
    dh, d = hw.wq.shape[1:]
    f = {k: getattr(hw, k) for k in ("wq", "wk", "wv", "p")}  # the products not cut: as stored
    if "ov" in cuts:
        f["p"] = cuts["ov"].X.reshape(H, d, dh)
        f["wv"] = cuts["ov"].S.mT
    if "qk" in cuts:
        f["wq"] = cuts["qk"].X.reshape(H, d, dh).mT
        f["wk"] = cuts["qk"].S.mT
    return HeadWeights(**f)


def _bias_names(reader: AttentionReader, i: int) -> dict[str, str]:
    out = {}
    for role, t in reader.layout.names(i).items():
        name = reader.prefix + t.replace(".weight", ".bias")
        if name in reader.ckpt:
            out[role] = name
    return out


def _biases(reader: AttentionReader, layer: Layer, shapes: dict[str, tuple[int, ...]],
            padded: Callable[[], dict[str, Any]], rot: tuple | None) -> dict[str, torch.Tensor]:
    """The layer's new bias vectors by full name, in their stored dtypes (``padded``: the cuts
    zero-padded to dh columns, made only where there are biases)."""
    names, hw = layer.bias_names, layer.hw
    if not [r for r in names if r != "o"]:
        return {}
    cuts = padded()
    raw = {r: layer.biases[r].to(torch.float64) for r in names}
    per_head = split_biases(reader.split, shapes, reader.dims, raw)
    per_head["o"] = raw.get("o")
    new, _ = cut_biases(hw, per_head, {p: c for p, c in cuts.items() if rot is None or p != "qk"})
    if rot is not None:
        spec, keep, part, qk = rot
        new["q"], new["k"] = rotary_cut.biases(hw, spec, keep, part, per_head["q"], per_head["k"], qk)
    filled = {r: (new[r] if new[r] is not None else torch.zeros_like(per_head_zero)) for r, per_head_zero in
              (("q", hw.wq[..., 0]), ("k", hw.wk[..., 0]), ("v", hw.wv[..., 0]))}
    joined = join_biases(reader.split, shapes, reader.dims, {r: t.to(torch.float64) for r, t in filled.items()})
    dtypes = {r: layer.biases[r].dtype for r in names}
    out = {names[r]: t.to(dtypes[r]) for r, t in joined.items() if r in names}
    if "o" in names and new.get("o") is not None:
        out[names["o"]] = new["o"].to(dtypes["o"])
    return out


def _rows(i: int, plan: Plan, cuts: dict[str, Any], reader: AttentionReader) -> list[dict[str, Any]]:
    d = reader.dims
    g = d.n_heads // d.n_kv_heads
    rows = []
    for p, c in cuts.items():
        e = c.sv.to(torch.float64) ** 2
        tot = e.sum(-1)
        for u in range(c.k.shape[0]):
            k = int(c.k[u])
            rows.append({
                "layer": i, "kv_head": u, "heads": list(range(u * g, (u + 1) * g)), "product": p, "k": k,
                "head_dim": d.head_dim,
                "kept_energy": float(e[u, :k].sum() / tot[u]) if tot[u] > 0 else 1.0,
                "frob_error": float(c.err[u]), "frob_rel_error": float(c.err[u] / c.norm[u]) if c.norm[u] > 0 else 0.0,
                "params_saved": (d.head_dim - k) * plan.cost[p],
                "kv_cache_bytes_saved_per_token": (d.head_dim - k) * KV_BYTES,
            })
    return rows


def cut_layers(reader: AttentionReader, plan: Plan, progress: Callable[[int, int, str], None] | None = None,
               threads: int = 1, factored: bool | Callable[[], bool] = False) -> Iterator[LayerCut]:
    """Pass 2 (a streamed plan: the one pass), layer by layer, the next layer read meanwhile:
    a :class:`LayerCut` per cut layer. ``progress(done, total, phase)``: after each layer's
    spectra (a streamed plan) and cut. ``factored``: the factored format's tensors (a callable:
    asked once the first layer's cut is done)."""
    todo = plan.cut_layers(reader.dims.n_layers)
    n = len(todo)
    tell = progress or (lambda *a: None)
    sv: dict[str, list[torch.Tensor]] = {p: [] for p in plan.products}
    with torch_threads(1), reader.stream(todo, partial(read_layer, reader)) as stream:  # the workers share the units, one torch thread each
        for j, (_, layer) in enumerate(stream):
            if plan.streamed:
                _choose_layer(plan, layer, sv, threads)
                tell(j + 1, n, "spectra")
            cuts, rot = cut_products(layer, plan, 0 if plan.streamed else j, threads)
            fmt = factored() if callable(factored) else factored
            yield layer_tensors(layer, reader, plan, cuts, rot, fmt)
            del layer, cuts
            tell(*((j + 1, n) if plan.streamed else (n + j + 1, 2 * n)), "cutting")
    if plan.streamed:
        plan.spectra = {p: torch.stack(v) for p, v in sv.items()}
        plan.ranks = choose(plan.rule, plan.spectra, plan.cost, reader.dims.head_dim)


def _choose_layer(plan: Plan, layer: Layer, sv: dict[str, list[torch.Tensor]], threads: int) -> None:
    """A streamed plan: this layer's spectra and SVDs, and its ranks (each unit's own rule)."""
    found = _spectra(layer, plan.products, plan.whiten, plan.rotary, threads, plan.device)
    for p, (s, _) in found.items():
        sv[p].append(s)
    spectra = {p: s[None] for p, (s, _) in found.items()}
    plan.roots = {p: [b] for p, (_, b) in found.items()}
    plan.ranks = {p: r for p, r in choose(plan.rule, spectra, plan.cost, layer.hw.wq.shape[1]).items()}


def source_dir(reader: AttentionReader) -> Path | None:
    p = getattr(reader.ckpt, "path", None)
    if p is None or reader.origin.get("input") in ("live", "state_dict", "gguf"):
        return None
    p = Path(p)
    return p if p.is_dir() else None  # a single weights file: its config is written, nothing copied

