"""``compress.json``'s contents and the console lines ``headrank compress`` prints."""

from __future__ import annotations

from typing import Any

from headrank.compress.api import KV_BYTES, Plan
from headrank.models.opener import is_causal
from headrank.util.env import versions

CONVENTIONS = {
    # the weights are cut as stored (a folded convention would change what is written): headrank.io.convention
    "convention": "raw",
    "unit": "one kv head: its query group's products cut jointly (one query head without GQA)",
    "cut": "best rank-k approximation of the unit's stacked product (Eckart-Young), factors U_k S_k^1/2, "
           "V_k S_k^1/2 (balanced)",
    "format": "factored: each cut projection keeps only its k kept dimensions per head (q, k, v rows, o columns; "
              "factored.json names them; headrank.load_compressed builds the model); dense: zero-padded back to "
              "head_dim, same architecture and tensor names",
    "whitened": "SVD-LLM: minimises ||(M - M_k) L|| (OV) or ||L^T (M - M_k) L|| (QK), E[x x^T] = L L^T",
    "rotary_qk": "rotary models: QK cut only by dropping whole rotary bands (both rows of a pair in W_Q and "
                 "W_K, by band energy) and by a best rank-k cut of the non-rotary part (partial rotary): "
                 "both commute with the rotation; k counts the kept head dimensions; never whitened",
    "kept_energy": "sum_{i<=k} s_i^2 / sum s_i^2 of the spectrum the cut was chosen on",
    "frob_error": "||M - M_k||_F of the unit's weight product (unwhitened)",
    "params_saved": "(head_dim - k) * (g*d + d) per unit: what the factored checkpoint stores less",
    "kv_cache": f"totals: {KV_BYTES} bytes per cached number (float16/bfloat16); keys shrink with the QK rank, "
                "values with the OV rank, per kv head: what a latent cache (Palu) saves. kv_cache: whether "
                "load_compressed(DIR, latent_kv=True) caches only the kept dimensions for this architecture and, "
                "with evaluate, the bytes its cache holds after a real generate against transformers' DynamicCache",
    "biases": "value bias moved into the output bias (or refitted), query/key biases refitted: exact at "
              "full rank; at rank k their terms are projected onto the kept subspaces",
    "not_cut": "norms, MLPs, embeddings, positions: copied unchanged (tied embeddings stay tied)",
}


def summary(reader, plan: Plan, rows: list[dict[str, Any]], notes: list[str], files: list[str]) -> dict[str, Any]:
    d = reader.dims
    attn_params = d.n_layers * d.head_dim * (2 * d.n_heads + 2 * d.n_kv_heads) * d.d
    saved = sum(r["params_saved"] for r in rows)
    kv = {p: sum(r["kv_cache_bytes_saved_per_token"] for r in rows if r["product"] == p) for p in plan.products}
    orig_kv = 2 * d.n_layers * d.n_kv_heads * d.head_dim * KV_BYTES
    cut_params = sum(plan.spectra[p].shape[0] * plan.spectra[p].shape[1] * d.head_dim * plan.cost[p]
                     for p in plan.products)
    return {
        "source": reader.origin,
        "rule": {"kind": plan.rule.kind, "value": plan.rule.value},
        "products": list(plan.products),
        "layers": list(plan.cut_layers(d.n_layers)),
        "whitened": plan.whiten is not None,
        "notes": notes,
        "config": {"n_layers": d.n_layers, "d_model": d.d, "n_heads": d.n_heads, "n_kv_heads": d.n_kv_heads,
                   "head_dim": d.head_dim, "position_encoding": reader.position, "split": reader.split,
                   "causal": _causal(reader)},
        "totals": {
            "attention_params": attn_params,
            "cut_products_params": cut_params,
            "params_saved_factored": saved,
            "kept_fraction_of_cut_products": 1 - saved / cut_params if cut_params else 1.0,
            "kv_cache_bytes_per_token": orig_kv,
            "kv_cache_bytes_saved_per_token": {"k (qk)": kv.get("qk", 0), "v (ov)": kv.get("ov", 0)},
            "kv_cache_measured": "factored deployment, not measured",
            "mean_k": {p: float(plan.ranks[p].double().mean()) for p in plan.products},
        },
        "units": rows,
        "files": files,
        "conventions": CONVENTIONS,
        "versions": versions(),
    }


def _num(before: float, after: float) -> tuple[str, str]:
    """Both numbers with the fewest significant digits (4 to 12) that tell them apart."""
    for digits in range(4, 13):
        a, b = f"{before:.{digits}g}", f"{after:.{digits}g}"
        if a != b:
            return a, b
    return a, b


def eval_line(e: dict[str, Any]) -> str:
    a, b = _num(e["before"], e["after"])
    change = e["after"] - e["before"]
    rel = f", {change / e['before']:+.3%}" if e["before"] and abs(e["before"]) > 1e-12 else ""
    cached = " (uncut: cached)" if e.get("before_cached") else ""
    return f"{e['metric']}: {a} -> {b} ({change:+.4g}{rel}){cached} on {e['text']}"


def _kv_measured(res: dict[str, Any]) -> str:
    m = (res.get("kv_cache") or {}).get("measured")
    if not isinstance(m, dict):
        return " (not measured)"
    return (f"; measured by a generate with the latent cache: {m['bytes_per_token']:,.0f} bytes/token kept of "
            f"{m['uncut_bytes_per_token']:,.0f} uncut ({m['dtype']}), {m['share_saved']:.1%} saved")


def _kv_saved(t: dict[str, Any]) -> str:
    """``N bytes/token saved of M (K kept)``: which number is which, and in which dtype, said."""
    saved, total = sum(t["kv_cache_bytes_saved_per_token"].values()), t["kv_cache_bytes_per_token"]
    return f"{saved:,} bytes/token saved of {total:,} ({total - saved:,} kept; {KV_BYTES} bytes per cached number)"


def _causal(reader) -> bool | None:
    """Whether the checkpoint is a causal LM by its config's ``architectures`` (None: not said)."""
    archs = (reader.ckpt.config or {}).get("architectures") if isinstance(reader.ckpt.config, dict) else None
    if not isinstance(archs, list) or not archs:
        return None
    return is_causal(reader.ckpt.config)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


#: the parts of compress.json that ``headrank compress --json`` prints (``CompressResult.to_json``)
JSON_KEYS = ("rule", "products", "whitened", "notes", "warnings", "totals", "checkpoint", "files", "eval", "kv_cache",
             "allocation")

NOT_MEASURED = "factored deployment, not measured"


def kv_block(res: dict[str, Any], kv: dict[str, Any] | None) -> None:
    """compress.json's ``kv_cache`` block (and ``totals.kv_cache_measured``) from what
    :func:`~.latent.kv_measure` found (None: not tried)."""
    fmt = (res.get("checkpoint") or {}).get("format")
    if kv is None:
        kv = {"latent": "format dense: the cut dimensions are stored as zeros and cached as such" if fmt == "dense"
              else "load_compressed(DIR, latent_kv=True); not tried here (with evaluate: measured by a generate)"}
    measured = kv.get("measured")
    res["kv_cache"] = {"latent": kv["latent"], "measured": measured or NOT_MEASURED}
    res["totals"]["kv_cache_measured"] = "measured: see kv_cache" if measured else NOT_MEASURED


def json_view(res: dict[str, Any]) -> dict[str, Any]:
    """The totals of a compress result: :data:`JSON_KEYS` of it."""
    return {k: res[k] for k in JSON_KEYS if k in res}


def report_lines(res: dict[str, Any], out: Any = None) -> list[str]:
    """The console report of a compress result: the totals, checkpoint bytes and eval as lines."""
    t = res["totals"]
    ks = ", ".join(f"{p} {k:.2f}" for p, k in t["mean_k"].items())
    lines = [f"mean k ({ks}) of {res['config']['head_dim']}; {t['params_saved_factored']:,} parameters "
             f"saved ({1 - t['kept_fraction_of_cut_products']:.1%} of the cut products); "
             + ("no KV cache (an encoder)" if res["config"].get("causal") is False else
                f"KV cache {_kv_saved(t)} in a factored deployment" + _kv_measured(res))]
    if res.get("allocation"):
        a = res["allocation"]
        lines.append(f"ranks allocated by measured loss (ASVD): {a['metric']} uncut {a['baseline']:.6g}, threshold "
                     f"{a['threshold']:.6g} on {a['calibration']}")
    c = res.get("checkpoint")
    if c:
        dt = ", ".join(c["dtypes"])
        line = (f"checkpoint ({c['format']}, {dt}, --dtype {c.get('dtype', 'auto')}): {_mb(c['bytes_written'])} "
                f"written; against the uncut model in "
                f"{dt}, {_mb(c['bytes_uncut'])}: {c['share_saved']:.2%} smaller")
        if c.get("bytes_input"):
            n = c["bytes_input"]
            line += (f"; against the input as on disk, {_mb(n)}: "
                     + (f"{1 - c['bytes_written'] / n:.2%} smaller" if c["bytes_written"] <= n else
                        f"{c['bytes_written'] / n:.2f}x larger"))
        lines.append(line)
    if "eval" in res:
        lines.append(eval_line(res["eval"]))
        g = res["eval"].get("generation")
        if g and g.get("agreement") is not None:
            lines.append(f"generation: greedy tokens agreeing with the uncut model {g['agreement']:.0%} "
                         f"({len(g['prompts'])} prompts x {g['new_tokens']} tokens)")
    if out is not None and res.get("files"):
        lines.append(f"wrote {len(res['files']) + 1} files to {out} (compress.json, {res['files'][0]}, ...)")
    return lines
