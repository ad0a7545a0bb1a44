"""Every model type transformers knows, and whether headrank measures it (``docs/architectures.md``).

A type is *measured* when the hand-written layout table has a row for it (``table``) or its
layout was discovered and verified against its own forward (``verified``, the generated rows of
:mod:`headrank.io.generated`); otherwise it is *refused* with the reason its check gave, or
*unchecked* when no check of this transformers version has run yet (``--check TYPE``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from headrank.analysis.discover import (
    CAPTURE,
    TINY,
    _dims_spec,
    _layer_count,
    _position,
    _strip_prefix,
    _strip_qk_norms,
    _text,
    _zero_biases,
    build_tiny,
    forward_capture,
    known_types,
    match,
    now,
    one_thread,
)
from headrank.analysis.discover_seq2seq import discover_seq2seq, seq2seq_types
from headrank.analysis.verify_layout import discover_mla, verify_row
from headrank.errors import HeadRankError, one_line
from headrank.io.generated import cache_path, generated_rows, save_rows
from headrank.io.layouts import layout_model_types


def architectures() -> list[dict[str, Any]]:
    """One record per causal-LM / masked-LM / sequence-to-sequence model type of the installed
    transformers (and every generated or table row besides): model_type, task, status, detail,
    transformers (of the check), seq2seq (an encoder-decoder type) and kinds (the kinds of
    attention measured: ``self``, or ``encoder, decoder, cross``)."""
    table = set(layout_model_types())
    rows = generated_rows()
    known, s2s = known_types(), seq2seq_types()
    out = []
    for mt in sorted(set(known) | set(s2s) | set(rows) | (table - {"headrank"})):
        task = known.get(mt, s2s.get(mt, ("other", "")))[0]
        row = rows.get(mt, {})
        if mt in table:
            status, detail = "table", "hand-written layout row" + (", also verified" if row.get("status") == "verified"
                                                                 else "")
        elif row.get("status") == "verified":
            status, detail = "verified", _summary(row)
        elif row:
            status, detail = "refused", str(row.get("reason", "layout not confirmed"))
        else:
            status, detail = "unchecked", "no check with this transformers version (headrank architectures --check)"
        kinds = ", ".join(p["attention"] for p in row.get("parts", ())) or ("self" if status in ("table", "verified")
                                                                            else "")
        if mt in s2s and status == "verified" and not row.get("parts"):
            detail += f" (its causal-LM class; as an encoder-decoder: {row.get('seq2seq_reason', 'not checked')})"
        out.append({"model_type": mt, "task": task, "status": status, "detail": detail,
                    "transformers": row.get("transformers", ""), "seq2seq": mt in s2s, "kinds": kinds})
    return out


def _summary(row: dict[str, Any]) -> str:
    err = max(float(row.get(k, 0.0) or 0.0) for k in ("max_logits_error", "max_values_error", "max_output_error"))
    if row.get("parts"):
        kinds = "/".join(p["attention"] for p in row["parts"])
        return (f"encoder-decoder: {kinds} {row.get('split')} {row['parts'][0]['modules'].get('q', '?')}; "
                f"{row.get('position')}; max error {err:.1g}")
    mods = row.get("modules", {})
    first = next(iter(mods.values()), "?")
    extra = ", QK-norm" if row.get("qk_norm") else ""
    return f"{row.get('split')} {first}; {row.get('position')}{extra}; max error {err:.1g}"


def counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """How many causal-LM and masked-LM types are in each status (and measured = table + verified);
    and, counted apart (``seq2seq_*``), the sequence-to-sequence types: measured as encoder,
    decoder and cross-attention, measured through their causal-LM class only (``decoder_only``: a
    decoder, or a decoder-only language model listed with them), refused, unchecked."""
    c: dict[str, int] = {"types": 0, "measured": 0, "table": 0, "verified": 0, "refused": 0, "unchecked": 0,
                         "seq2seq_types": 0, "seq2seq_measured": 0, "seq2seq_decoder_only": 0, "seq2seq_refused": 0,
                         "seq2seq_unchecked": 0}
    for r in records:
        if r["task"] in ("causal-lm", "masked-lm"):
            c["types"] += 1
            c[r["status"]] += 1
        if r.get("seq2seq"):
            c["seq2seq_types"] += 1
            key = ("measured" if "cross" in r["kinds"] else "decoder_only" if r["kinds"] else
                   "unchecked" if r["status"] == "unchecked" else "refused")
            c[f"seq2seq_{key}"] += 1
    c["measured"] = c["table"] + c["verified"]
    return c


def check(model_type: str) -> dict[str, Any]:
    """Discover and verify ``model_type`` now, keep the result in the local cache, and return its
    row; a refusal raises HeadRankError with the reason (one line)."""
    import transformers

    if model_type not in known_types() and model_type not in seq2seq_types():
        raise HeadRankError(f"transformers {transformers.__version__} knows no causal-LM, masked-LM or "
                            f"sequence-to-sequence model type {model_type!r} (headrank architectures lists them)")
    row = discover(model_type)
    save_rows(cache_path(), {model_type: row}, transformers.__version__)
    if row["status"] != "verified":
        raise HeadRankError(f"{model_type}: refused: {row.get('reason')}")
    return row


@one_thread
def discover(model_type: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Discover and verify ``model_type``'s attention layout: a generated row (``status`` verified)
    or a refusal (``status`` refused, ``reason`` one line). Never raises for a model's fault.

    An encoder-decoder type (:func:`~headrank.analysis.discover_seq2seq.seq2seq_types`) is tried
    as one first (encoder, decoder and cross-attention: a row with ``parts``); should that be
    refused, a type that also has a causal-LM class (its decoder) is tried as that, and the
    encoder-decoder's reason is kept (``seq2seq_reason``)."""
    import transformers

    t0 = now()
    row: dict[str, Any] = {"model_type": model_type, "transformers": transformers.__version__}
    if model_type in seq2seq_types() and not overrides:
        try:
            row.update(discover_seq2seq(model_type))
        except Exception as e:  # noqa: BLE001 - whatever the model does wrong becomes its reason
            row.update(status="refused", reason=_reason(e))
        if row["status"] == "verified" or model_type not in known_types():
            row["seconds"] = round(now() - t0, 2)
            return row
        row = {"model_type": model_type, "transformers": transformers.__version__,
               "seq2seq_reason": row["reason"]}
    try:
        try:
            row.update(_discover(model_type, overrides))
        except RuntimeError:  # a module that ignores head_dim: again with head_dim = width / heads
            row.update(_discover(model_type, {"head_dim": TINY["d"] // TINY["heads"], **(overrides or {})}))
    except KeyError as e:
        if CAPTURE not in str(e):
            row.update(status="refused", reason=one_line(f"KeyError: {e}", 200))
        else:  # its attention takes no registered implementation: its own eager probabilities instead
            try:
                model, cfg = build_tiny(model_type, overrides, attn="eager")
                ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
                row.update(_discover_inline(model, cfg, ids))
            except Exception as e2:  # noqa: BLE001 - whatever the model does wrong becomes its reason
                row.update(status="refused", reason=_reason(e2))
    except Exception as e:  # noqa: BLE001 - whatever the model does wrong becomes its reason
        row.update(status="refused", reason=_reason(e))
    row["seconds"] = round(now() - t0, 2)
    return row


def _reason(e: Exception) -> str:
    """A refusal's reason from what the model raised (one line; headrank's own errors by their base name)."""
    return one_line(f"{'HeadRankError' if isinstance(e, HeadRankError) else type(e).__name__}: {e}", 200)


def _discover(model_type: str, overrides: dict[str, Any] | None) -> dict[str, Any]:
    if model_type not in known_types():
        raise HeadRankError(f"transformers {__import__('transformers').__version__} knows no causal-LM or "
                            f"masked-LM model type {model_type!r}")
    model, cfg = build_tiny(model_type, overrides)
    vocab = int(getattr(_text(cfg), "vocab_size", 100) or 100)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, min(vocab, 100), (2, 6), generator=g)
    zeros = torch.zeros_like(ids)
    first = forward_capture(model, ids, zeros)
    if not first.calls:
        if not any("attention" in type(m).__name__.lower() for m in model.modules()):
            if not (overrides or {}).get("_keep_layers"):  # a hybrid's attention may lie beyond the tiny depth
                return _discover(model_type, {**(overrides or {}), "_keep_layers": True})
            return {"status": "refused", "reason": "no softmax attention (no attention module)"}
        return _discover_inline(model, cfg, ids)
    if hasattr(first.calls[0]["module"], "kv_b_proj"):
        return discover_mla(model, cfg, first, ids)
    qk_norm = _strip_qk_norms(list({id(c["module"]): c["module"] for c in first.calls}.values()))
    _zero_biases(model)
    cap = forward_capture(model, ids, zeros)
    kinds = match(model, cap)
    if isinstance(kinds, str):
        return {"status": "refused", "reason": kinds}
    m = kinds[0]
    t = _text(cfg)
    have = t.to_dict()
    spec = _dims_spec(m, _layer_count(model, m), have)
    if isinstance(spec, str):
        return {"status": "refused", "reason": spec}
    path = [k for k in ("text_config", "decoder", "language_config", "llm_config") if getattr(cfg, k, None) is t]
    row: dict[str, Any] = {
        "status": "verified", "split": "conv1d_fused" if m.conv1d and m.split == "fused" else m.split,
        "modules": _strip_prefix(model, m.modules), "config_path": path, "dims": spec,
        "position": _position(model, have), "qk_norm": qk_norm, "kind": m.kind,
        "attention_layers_tiny": sorted(m.layers), "other_kinds": [k.kind for k in kinds[1:]],
        "rotary_attention_factor": round(m.factor, 12),
        "scale_times_sqrt_head_dim": None if m.scaling is None else round(m.scaling * math.sqrt(m.dh), 6),
        "extra_arguments": [e for e in m.extra if e not in ("dropout", "position_ids", "use_cache")],
    }
    if m.conv1d and m.split != "fused":
        return {"status": "refused", "reason": f"a Conv1D projection split {m.split} is not in the table"}
    row["model_type"] = model_type
    row.update(verify_row(model, cfg, row, cap, ids))
    return row


def _discover_inline(model: Any, cfg: Any, ids: torch.Tensor) -> dict[str, Any]:
    """Attention computed inline: matched and checked on the module's own probabilities."""
    from types import SimpleNamespace

    from headrank.analysis.discover_inline import check_inline, discover_inline
    from headrank.io.layouts import AttentionReader, layout_from_row
    from headrank.io.live import LiveCheckpoint

    _zero_biases(model)
    found = discover_inline(model, cfg, ids)
    if found["status"] != "verified":
        return {**found, "reason": "attention computed inline, not through transformers' attention interface; "
                + found["reason"]}
    m = SimpleNamespace(d=found["_d"], H=found["_H"], Hkv=found["_H"], dh=found["_dh"])
    spec = _dims_spec(m, found["_n_layers"], found["_text"].to_dict())
    if isinstance(spec, str):
        return {"status": "refused", "reason": spec}
    path = [k for k in ("text_config", "decoder") if getattr(cfg, k, None) is found["_text"]]
    row = {"model_type": cfg.model_type, "status": "verified", "split": found["split"], "modules": found["modules"],
           "config_path": path, "dims": spec, "position": _position(model, found["_text"].to_dict()),
           "qk_norm": False, "kind": "inline (output_attentions)", "scale_fit": round(found["scale_fit"], 9),
           "scale_times_sqrt_head_dim": round(found["scale_fit"] * math.sqrt(m.dh), 6)}
    reader = AttentionReader(LiveCheckpoint(model, cfg.to_dict()), layout_from_row(row))
    err = check_inline(reader, found)
    row.update(err, layers_checked_tiny=list(reader.layer_ids))
    if max(err.values()) >= 1e-4:
        row.update(status="refused", reason=f"{cfg.model_type}: the per-head products miss the module's attention "
                   f"probabilities or output by {max(err.values()):.2g} (relative): layout not confirmed")
    return row
