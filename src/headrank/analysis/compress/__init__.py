"""Cut each head to the rank it uses and say what that costs (``headrank compress``).

- :mod:`.plan`: ranks by energy (``keep``), fixed (``rank``) or a global budget (``params``);
- :mod:`.cut`: the exact best rank-k cut of every unit (a head, or a kv head's query group),
  balanced factors, biases kept exact at full rank, activation whitening (SVD-LLM);
- :mod:`.write`: the checkpoint (same architecture and tensor names, safetensors) and side files;
- :mod:`.evaluate`: perplexity or embedding drift with the real Hugging Face forward;
- :mod:`.api`: the two passes over the layers; :func:`compress` and :func:`cost_curve` here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from headrank.analysis.compress.api import (
    Plan,
    cut_layers,
    make_plan,
    open_source,
    parse_products,
    source_dir,
)
from headrank.analysis.compress.evaluate import Scorer, TextSpec, calibration, load
from headrank.analysis.compress.plan import Rule, choose
from headrank.analysis.compress.write import ShardWriter, copy_side_files, save_hf_side
from headrank.errors import HeadRankError
from headrank.util.env import versions
from headrank.util.fileio import check_writable, staged_output, write_json

__all__ = ["Plan", "Rule", "TextSpec", "compress", "cost_curve", "cut_in_place", "kept_fraction", "make_plan"]


def _check_out(out: Path) -> dict[str, Any] | None:
    """``out`` must be empty or hold a previous compress output (whose files are then replaced).
    A missing ``out`` is not created here: a run that fails before writing leaves nothing behind."""
    out = check_writable(out)
    if not out.exists():
        return None
    entries = [p for p in out.iterdir() if not p.name.startswith(".")]
    if not entries:
        return None
    prev = out / "compress.json"
    try:
        old = json.loads(prev.read_text()) if prev.is_file() else None
    except (OSError, ValueError):
        old = None
    if not isinstance(old, dict):
        raise HeadRankError(f"`out` {out} is not empty and holds no compress.json: choose an empty or new directory")
    return old


def _original(reader, live) -> tuple[Any, Any]:
    if live is not None:
        tok = getattr(live, "_headrank_tokenizer", None)
        if tok is None:
            raise HeadRankError("`evaluate` and `whiten` need a tokenizer; this GGUF file holds none")
        return live, tok
    src = source_dir(reader)
    if src is None:
        raise HeadRankError("`evaluate` and `whiten` need a checkpoint directory transformers can load")
    return load(src)


def compress(source: Any, out: str | os.PathLike, *, keep: float | None = None, rank: int | None = None,
             params: float | None = None, products: str | Iterable[str] | None = None, whiten: bool = False,
             evaluate: bool = False, text: str | os.PathLike | None = None, n_eval: int = 32, seq_len: int = 128,
             config: Any = None, layout: Any = None, revision: str | None = None,
             progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Write the compressed checkpoint and ``compress.json`` into ``out``; return compress.json.

    ``source``: anything :func:`headrank.io.sources.open_reader` opens. One of ``keep``,
    ``rank``, ``params`` (:class:`~.plan.Rule`). ``products``: ``"ov,qk"`` (default: both where
    QK can be cut). ``whiten``: activation-whitened cut calibrated on the validation split.
    ``evaluate``: perplexity (causal LM) or embedding drift (encoder) before and after, the
    after measured on the written checkpoint.
    """
    rule = Rule.of(keep=keep, rank=rank, params=params)
    out = Path(out)
    reader, live, gguf_note = open_source(source, config=config, layout=layout, revision=revision)
    if reader.origin.get("input") == "adapter":
        raise HeadRankError("a LoRA adapter: merge it into its base first (peft's merge_and_unload, then "
                            "save_pretrained) and compress the merged checkpoint")
    prods, note = parse_products(None if products is None else (
        products if isinstance(products, str) else list(products)), reader)
    if rule.kind == "rank" and rule.value > reader.dims.head_dim:
        raise HeadRankError(f"`rank` {int(rule.value)} exceeds the head dimension {reader.dims.head_dim}")
    old = _check_out(out)
    spec = TextSpec(n=n_eval, seq_len=seq_len, text_file=None if text is None else str(text))
    orig = tok = None
    if whiten or evaluate:
        orig, tok = _original(reader, live)
    Ls = calibration(orig, tok, reader.layout.modules, spec, reader.dims.n_layers) if whiten else None
    plan = make_plan(reader, rule, prods, Ls, progress)
    notes = [n for n in (gguf_note, note) if n]
    with staged_output(out) as stage:
        writer, rows = ShardWriter(stage), []
        for _, tensors, r in cut_layers(reader, plan, progress):
            for name, t in tensors.items():
                writer.add(name, t)
            rows += r
        names = list(live.state_dict()) if live is not None else reader.ckpt.keys()
        for name in names:
            writer.add(name, reader.ckpt.get(name))
        reader.ckpt.release()
        files = writer.finish()
        side = (save_hf_side(live, stage, getattr(live, "_headrank_tokenizer", None)) if live is not None
                else copy_side_files(source_dir(reader), stage))
        if "config.json" not in side and reader.ckpt.config:  # a single weights file, a state_dict
            write_json(stage / "config.json", reader.ckpt.config)
            side.append("config.json")
        result = _summary(reader, plan, rows, notes, files + [s for s in side if s not in files])
        if evaluate:
            result["eval"] = _evaluate(orig, tok, stage, spec)
        write_json(stage / "compress.json", result)
    _drop_stale(out, old, result["files"])
    return result


def _drop_stale(out: Path, old: dict[str, Any] | None, files: list[str]) -> None:
    """Files of a previous compress output (listed in its compress.json) that the new set lacks."""
    import shutil

    for name in (old or {}).get("files", []):
        if not isinstance(name, str) or name in files or name.strip("/") in ("", ".", "..") or "/" in name.rstrip("/"):
            continue
        p = out / name.rstrip("/")
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)


def _evaluate(orig, tok, stage: Path, spec: TextSpec) -> dict[str, Any]:
    scorer = Scorer(orig, tok, spec)
    before = scorer(orig)
    after_model, _ = load(stage)
    after = scorer(after_model)
    return {"metric": scorer.metric, "before": before, "after": after, "text": scorer.note,
            "note": ("after: measured on the written checkpoint, loaded back with transformers (float32)")}


def _summary(reader, plan: Plan, rows: list[dict[str, Any]], notes: list[str], files: list[str]) -> dict[str, Any]:
    d = reader.dims
    attn_params = d.n_layers * d.head_dim * (2 * d.n_heads + 2 * d.n_kv_heads) * d.d
    saved = sum(r["params_saved"] for r in rows)
    kv = {p: sum(r["kv_cache_bytes_saved_per_token"] for r in rows if r["product"] == p) for p in plan.products}
    orig_kv = 2 * d.n_layers * d.n_kv_heads * d.head_dim * 2
    cut_params = sum(plan.spectra[p].shape[0] * plan.spectra[p].shape[1] * d.head_dim * plan.cost[p]
                     for p in plan.products)
    return {
        "source": reader.origin,
        "rule": {"kind": plan.rule.kind, "value": plan.rule.value},
        "products": list(plan.products),
        "whitened": plan.whiten is not None,
        "notes": notes,
        "config": {"n_layers": d.n_layers, "d_model": d.d, "n_heads": d.n_heads, "n_kv_heads": d.n_kv_heads,
                   "head_dim": d.head_dim, "position_encoding": reader.position, "split": reader.split},
        "totals": {
            "attention_params": attn_params,
            "cut_products_params": cut_params,
            "params_saved_factored": saved,
            "kept_fraction_of_cut_products": 1 - saved / cut_params if cut_params else 1.0,
            "kv_cache_bytes_per_token": orig_kv,
            "kv_cache_bytes_saved_per_token": {"k (qk)": kv.get("qk", 0), "v (ov)": kv.get("ov", 0)},
            "mean_k": {p: float(plan.ranks[p].double().mean()) for p in plan.products},
        },
        "units": rows,
        "files": files,
        "conventions": {
            "unit": "one kv head: its query group's products cut jointly (one query head without GQA)",
            "cut": "best rank-k approximation of the unit's stacked product (Eckart-Young), factors U_k S_k^1/2, "
                   "V_k S_k^1/2, zero-padded to head_dim: same architecture, same tensor names",
            "whitened": "SVD-LLM: minimises ||(M - M_k) L|| (OV) or ||L^T (M - M_k) L|| (QK), E[x x^T] = L L^T",
            "rotary_qk": "rotary models: QK cut only by dropping whole rotary bands (both rows of a pair in W_Q and "
                         "W_K, by band energy) and by a best rank-k cut of the non-rotary part (partial rotary): "
                         "both commute with the rotation; k counts the kept head dimensions; never whitened",
            "kept_energy": "sum_{i<=k} s_i^2 / sum s_i^2 of the spectrum the cut was chosen on",
            "frob_error": "||M - M_k||_F of the unit's weight product (unwhitened)",
            "params_saved": "(head_dim - k) * (g*d + d) per unit: what a factored deployment stores less",
            "kv_cache": f"{2} bytes per cached number (float16/bfloat16); keys shrink with the QK rank, "
                        "values with the OV rank, per kv head",
            "biases": "value bias moved into the output bias (or refitted), query/key biases refitted: exact at "
                      "full rank; at rank k their terms are projected onto the kept subspaces",
            "not_cut": "norms, MLPs, embeddings, positions: copied unchanged",
        },
        "versions": versions(),
    }


def kept_fraction(plan: Plan, head_dim: int) -> float:
    """Kept share of the cut products' parameters in a factored deployment."""
    kept = sum(float(plan.ranks[p].sum()) * plan.cost[p] for p in plan.products)
    return kept / sum(plan.ranks[p].numel() * head_dim * plan.cost[p] for p in plan.products)


@contextmanager
def cut_in_place(model: torch.nn.Module, reader, plan: Plan) -> Iterator[None]:
    """Apply ``plan`` to a live model's own parameters (``reader`` = ``open_reader(model)``) for
    the block, then put the original values back."""
    params = dict(model.named_parameters())
    saved = {}
    try:
        for _, tensors, _ in cut_layers(reader, plan):
            for name, t in tensors.items():
                saved[name] = params[name].detach().clone()
                params[name].data.copy_(t)
        yield
    finally:
        for name, t in saved.items():
            params[name].data.copy_(t)


def cost_curve(source: Any, budgets: Iterable[float], *, methods: Iterable[str] = ("weight", "whitened"),
               products: str | None = None, spec: TextSpec | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Cost (perplexity or drift) against the kept fraction of the cut products' parameters, for
    weight-only and activation-whitened cuts at each ``--params`` budget, applied in memory to
    the real Hugging Face model (the same cut code that :func:`compress` writes)."""
    from headrank.io.sources import open_reader

    spec = spec or TextSpec()
    reader0, live, _ = open_source(source)
    orig, tok = _original(reader0, live)
    orig = orig.to(torch.float32).eval()
    reader = open_reader(orig)
    prods, _ = parse_products(products, reader)
    scorer = Scorer(orig, tok, spec)
    rows = [{"method": "none", "budget": 1.0, "kept": 1.0, "cost": scorer(orig), "metric": scorer.metric}]
    for method in methods:
        Ls = calibration(orig, tok, reader.layout.modules, spec, reader.dims.n_layers) if method == "whitened" else None
        base = make_plan(reader, Rule("params", 1.0), prods, Ls)
        for b in budgets:
            rule = Rule("params", b)
            plan = replace(base, rule=rule, ranks=choose(rule, base.spectra, base.cost, reader.dims.head_dim))
            with cut_in_place(orig, reader, plan):
                rows.append({"method": method, "budget": b, "kept": kept_fraction(plan, reader.dims.head_dim),
                             "cost": scorer(orig), "metric": scorer.metric})
            if progress:
                progress(f"{method} {b:g}: {rows[-1]['cost']:.4g}")
    return rows
