"""``headrank compress``: cut every head's products to the rank chosen, write the checkpoint.

Two passes over the layers (one layer in memory at a time): the units' spectra (from the
factors' roots) for the rank choice, then the exact cut (:mod:`.cut`) written back into the
same tensors (:mod:`.write`), with ``compress.json``: per unit k, kept energy, Frobenius error,
and what a factored deployment saves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headrank.analysis.compress import rotary_cut
from headrank.analysis.compress.cut import (
    CUT_ORDER,
    cut_biases,
    cut_unit,
    join,
    join_biases,
    split_biases,
    unit_factors,
    unit_spectra,
)
from headrank.analysis.compress.plan import Rule, choose
from headrank.errors import HeadRankError, one_line
from headrank.io.layouts import SPLITS, AttentionReader, HeadWeights
from headrank.io.sources import open_reader
from headrank.util.threads import torch_threads

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

    A GGUF file is loaded with transformers (``gguf_file=``, dequantized to float32): the
    compressed checkpoint is written as safetensors with Hugging Face names. transformers' own
    progress bars (its GGUF reader's among them) are silenced unless ``verbose``."""
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
    from headrank.models.opener import quiet_transformers

    path = Path(reader.ckpt.path)
    try:
        with quiet_transformers() as tf, _stderr_off(not verbose):
            model = tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - an architecture transformers cannot load from GGUF
        raise HeadRankError(f"cannot load {path} with transformers (gguf_file=): {one_line(e, 200)}"
                            ) from None
    try:
        with quiet_transformers() as tf, _stderr_off(not verbose):
            tok = tf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception:  # noqa: BLE001 - a GGUF without tokenizer metadata: weights only
        tok = None
    model.eval()
    model._headrank_tokenizer = tok
    live = open_reader(model)
    live.origin = {**reader.origin, "loaded_with": "transformers gguf_file= (dequantized to float32)"}
    return live, model, (f"GGUF source {path.name}: written as safetensors (float32, dequantized by "
                         "transformers), not GGUF")


@contextmanager
def _stderr_off(off: bool) -> Iterator[None]:
    """transformers' GGUF reader draws a tqdm bar of its own (not its logging's): sent nowhere."""
    if not off:
        yield
        return
    import io
    from contextlib import redirect_stderr

    with redirect_stderr(io.StringIO()):
        yield


@dataclass
class Plan:
    """What will be cut: products, ranks per product ``(layers, units)``, the spectra they were
    chosen on, optional whitening matrices per layer."""

    rule: Rule
    products: tuple[str, ...]
    ranks: dict[str, torch.Tensor]
    spectra: dict[str, torch.Tensor]
    cost: dict[str, int]
    whiten: dict[int, torch.Tensor] | None = None
    rotary: Any = None  # RotarySpec: QK cut by whole bands (+ the non-rotary part)
    layers: tuple[int, ...] | None = None  # the layers cut (ranks[p][j] is layers[j]'s); None: all
    roots: dict[str, list[Any]] | None = None  # pass 1's factor roots per product and cut layer

    def cut_layers(self, n_layers: int) -> tuple[int, ...]:
        return tuple(range(n_layers)) if self.layers is None else self.layers


def make_plan(reader: AttentionReader, rule: Rule, products: tuple[str, ...],
              whiten: dict[int, torch.Tensor] | None = None,
              progress: Callable[[int, int], None] | None = None, layers: tuple[int, ...] | None = None,
              threads: int = 1) -> Plan:
    """Pass 1: every unit's spectrum (whitened when ``whiten`` gives a matrix per layer), then
    ranks; only ``layers`` (default all) are cut."""
    d = reader.dims
    g = d.n_heads // d.n_kv_heads
    spec = qk_rotary(reader)[0] if "qk" in products else None
    sv: dict[str, list[torch.Tensor]] = {p: [] for p in products}
    roots: dict[str, list[Any]] = {p: [] for p in products}
    todo = tuple(range(d.n_layers)) if layers is None else tuple(layers)
    with torch_threads(1):  # factor_roots' workers share the heads, one torch thread each
        for j, i in enumerate(todo):
            hw = reader.read_layer(i)
            bad = [n for n in ("wq", "wk", "wv", "p") if not _finite(getattr(hw, n))]
            if bad:
                raise HeadRankError(f"layer {i} holds NaN/Inf attention weights ({', '.join(bad)}): nothing to cut")
            for p in products:
                if p == "qk" and spec is not None:
                    sv[p].append(rotary_cut.items(hw, spec)[0])
                    roots[p].append(None)
                    continue
                s, r = unit_spectra(hw, p, None if whiten is None else whiten[i], with_roots=True, workers=threads)
                sv[p].append(s)
                roots[p].append(r)
            reader.ckpt.release()
            if progress:
                progress(j + 1, 2 * len(todo))
    spectra = {p: torch.stack(v) for p, v in sv.items()}
    cost = {p: (g + 1) * d.d for p in products}
    return Plan(rule, products, choose(rule, spectra, cost, d.head_dim), spectra, cost, whiten, spec,
                None if layers is None else todo, roots)


def _finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in ``t``: one sum (NaN and ±Inf survive it; a tenth of the per-element
    check's time), the per-element check only where the sum is not finite (it overflowed)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def cut_layer(reader: AttentionReader, i: int, plan: Plan, j: int | None = None
              ) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Pass 2 for layer ``i`` (the plan's ``j``-th cut layer, default ``i``): the new stored
    tensors (full names, stored dtypes) and rows."""
    j = i if j is None else j
    names = reader.tensor_names(i)
    raw = {r: reader.ckpt.get(n) for r, n in names.items()}
    shapes = {r: tuple(t.shape) for r, t in raw.items()}
    hw = SPLITS[reader.split](raw, reader.dims)  # shapes were checked by pass 1's read_layer
    cuts, rot = {}, None
    for p in plan.products:
        if p == "qk" and plan.rotary is not None:
            cuts[p], keep, part = rotary_cut.cut(hw, plan.rotary, plan.ranks[p][j])
            rot = (plan.rotary, keep, part)
            continue
        X, S = unit_factors(hw, p)
        L = None if plan.whiten is None else plan.whiten[i]
        roots = plan.roots[p][j] if plan.roots is not None else None
        cuts[p] = cut_unit(X, S, plan.ranks[p][j], p, L, roots)
    new = _replace(hw, cuts)
    tensors = {names[r]: t.to(raw[r].dtype) for r, t in join(reader.split, shapes, reader.dims, new).items()
               if not _same(t, raw[r])}  # a product not cut: its stored tensors are copied as they are
    tensors.update(_biases(reader, i, hw, shapes, cuts, rot))
    return tensors, _rows(i, plan, cuts, reader)


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


def _biases(reader: AttentionReader, i: int, hw: HeadWeights, shapes: dict[str, tuple[int, ...]],
            cuts: dict[str, Any], rot: tuple | None) -> dict[str, torch.Tensor]:
    names = _bias_names(reader, i)
    if not [r for r in names if r != "o"]:
        return {}
    raw = {r: reader.ckpt.get(n).to(torch.float64) for r, n in names.items()}
    per_head = split_biases(reader.split, shapes, reader.dims, raw)
    per_head["o"] = raw.get("o")
    new, _ = cut_biases(hw, per_head, {p: c for p, c in cuts.items() if rot is None or p != "qk"})
    if rot is not None:
        new["q"], new["k"] = rotary_cut.biases(hw, *rot, per_head["q"], per_head["k"])
    filled = {r: (new[r] if new[r] is not None else torch.zeros_like(per_head_zero)) for r, per_head_zero in
              (("q", hw.wq[..., 0]), ("k", hw.wk[..., 0]), ("v", hw.wv[..., 0]))}
    joined = join_biases(reader.split, shapes, reader.dims, {r: t.to(torch.float64) for r, t in filled.items()})
    dtypes = {r: reader.ckpt.get(n).dtype for r, n in names.items()}
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


def cut_layers(reader: AttentionReader, plan: Plan, progress: Callable[[int, int], None] | None = None,
               threads: int = 1) -> Iterator[tuple[int, dict[str, torch.Tensor], list[dict[str, Any]]]]:
    """Pass 2, layer by layer (the plan's layers): ``(i, new tensors by full name, rows)``."""
    from headrank.util.memory import trim_heap

    todo = plan.cut_layers(reader.dims.n_layers)
    n = len(todo)
    with torch_threads(threads):
        for j, i in enumerate(todo):
            tensors, rows = cut_layer(reader, i, plan, j)
            reader.ckpt.release()
            yield i, tensors, rows
            trim_heap()
            if progress:
                progress(n + j + 1, 2 * n)


def source_dir(reader: AttentionReader) -> Path | None:
    p = getattr(reader.ckpt, "path", None)
    if p is None or reader.origin.get("input") in ("live", "state_dict", "gguf"):
        return None
    p = Path(p)
    return p if p.is_dir() else None  # a single weights file: its config is written, nothing copied

