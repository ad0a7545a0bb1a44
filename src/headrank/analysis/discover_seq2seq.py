"""Discovery of encoder-decoders: encoder self-attention, decoder self-attention and
cross-attention as three kinds of layer (``docs/architectures.md``).

A tiny random instance of the type's sequence-to-sequence class (``AutoModelForSeq2SeqLM`` or
``AutoModelForSpeechSeq2Seq``) runs once on an encoder input of one length and decoder ids of
another, through the recording attention of :mod:`headrank.analysis.discover` (a wrapper here adds
an additive position bias, T5's, to the scores and records it). Each attention call is then of
one kind, told apart by the lengths it was handed:

- ``encoder``: queries and keys of the encoder's length;
- ``decoder``: queries and keys of the decoder's length (causal);
- ``cross``: decoder queries against encoder keys and values (``W_Q`` on the decoder side,
  ``W_K`` and ``W_V`` applied to the encoder's output).

Per kind, the module paths with ``{i}`` for the layer (the one index that varies over the kind's
calls), the projections (:func:`headrank.analysis.discover._find_roles`) and the config fields of
the sizes are found, and the kind is verified as a decoder-only layout is: every layer's per-head
products, read back through :class:`headrank.io.layouts.AttentionReader`, must predict the
module's ``q_h k_hᵀ`` (times the constant the module folds into q and k, e.g. Whisper's
``1/√dh`` on the query), its value states and its output projection, to float round-off
(:func:`headrank.analysis.verify_layout._check_fixed`). What passes is one generated row with
``parts``; the first failure refuses the type with its reason, and so does a kind that never calls
the attention interface (an encoder whose attention is computed inline is not measured silently).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headrank.analysis.discover import (
    _LOG,
    TOL,
    _attr,
    _eager,
    _find_roles,
    _position,
    _register,
    _strip_prefix,
    _strip_qk_norms,
    _zero_biases,
    build_tiny,
    forward_capture,
    types_of,
)

CAPTURE_S2S = "headrank_verify_seq2seq"
N_ENC, N_DEC = 7, 5  # encoder and decoder lengths (text): distinct, so a call's lengths name its kind
KINDS = ("encoder", "decoder", "cross")
#: tiny sizes distinct between the encoder and the decoder, so a size found names its config field
TINY_S2S = {"encoder_layers": 3, "num_layers": 3, "decoder_layers": 2, "num_decoder_layers": 2,
            "encoder_attention_heads": 6, "decoder_attention_heads": 4}
_FIELDS = {
    "encoder": {"n_layers": ("encoder_layers", "num_layers", "num_hidden_layers", "encoder_num_layers"),
                "n_heads": ("encoder_attention_heads", "num_heads", "num_attention_heads")},
    "decoder": {"n_layers": ("decoder_layers", "num_decoder_layers", "decoder_num_layers", "num_layers",
                             "num_hidden_layers"),
                "n_heads": ("decoder_attention_heads", "num_heads", "num_attention_heads")},
}
_WIDTH = ("d_model", "hidden_size", "model_dim")
_HEAD_DIM = ("d_kv", "head_dim", "attention_head_dim")


def seq2seq_types() -> dict[str, tuple[str, str]]:
    """Every sequence-to-sequence model type of the installed transformers (text and speech):
    ``type → (task, class)``."""
    return types_of(("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
                    ("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"))


def _eager_bias(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, scaling: float | None = None, **kwargs: Any):
    """The recording attention, with an additive position bias (T5's ``position_bias``) added to
    the mask as the module's eager path adds it to the scores; the bias is recorded."""
    bias = kwargs.pop("position_bias", None)
    if isinstance(bias, torch.Tensor):
        if attention_mask is None:
            attention_mask = bias
        elif attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros((), dtype=bias.dtype).masked_fill(~attention_mask, float("-inf")) + bias
        else:
            attention_mask = attention_mask + bias
    out = _eager(module, query, key, value, attention_mask, scaling, **kwargs)
    _LOG[-1]["position_bias"] = bias.detach() if isinstance(bias, torch.Tensor) else None
    return out


def auto_class_seq2seq(model_type: str) -> Any:
    import transformers

    task = seq2seq_types()[model_type][0]
    return transformers.AutoModelForSpeechSeq2Seq if task == "speech-seq2seq" else transformers.AutoModelForSeq2SeqLM


def build_tiny_seq2seq(model_type: str, attn: str = CAPTURE_S2S) -> tuple[nn.Module, Any]:
    """A tiny random float64 encoder-decoder of ``model_type`` (:data:`TINY_S2S` where its config
    has the fields; a speech encoder's input shortened to 14 frames)."""
    from transformers import AutoConfig

    _register(CAPTURE_S2S, _eager_bias)
    have = AutoConfig.for_model(model_type).to_dict()
    over = {k: v for k, v in TINY_S2S.items() if isinstance(have.get(k), int)}
    if isinstance(have.get("max_source_positions"), int) and "num_mel_bins" in have:
        over["max_source_positions"] = N_ENC  # Whisper: the encoder takes exactly 2 x this many frames
    return build_tiny(model_type, over, attn=attn, auto=auto_class_seq2seq(model_type))


def model_inputs(model: nn.Module, cfg: Any) -> list[dict[str, torch.Tensor]]:
    """Candidate inputs of one forward (the first that runs is used): encoder input (ids, or
    features for a speech encoder) and decoder ids."""
    g = torch.Generator().manual_seed(1)
    vocab = int(getattr(cfg, "vocab_size", 100) or 100)
    dec = torch.randint(3, min(vocab, 100), (2, N_DEC), generator=g)
    name = getattr(model, "main_input_name", "input_ids")
    if name == "input_ids":
        return [{"input_ids": torch.randint(3, min(vocab, 100), (2, N_ENC), generator=g), "decoder_input_ids": dec}]
    if name == "input_values":  # raw audio: lengths a convolutional front end shortens to a few frames
        return [{name: torch.randn(2, n, generator=g, dtype=torch.float64), "decoder_input_ids": dec}
                for n in (3200, 1600, 6400)]
    dicts = [cfg.to_dict(), *(v for v in cfg.to_dict().values() if isinstance(v, dict))]  # sub-configs too
    feats = list(dict.fromkeys(int(d[k]) for d in dicts for k in ("num_mel_bins", "input_feat_per_channel",
                                                                  "feature_size", "d_model")
                               if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)))
    channels = int(dicts[0].get("input_channels", 1) or 1)
    out = []
    for f in feats:
        for shape in ((2, f, 2 * N_ENC), (2, 2 * N_ENC, f * channels), (2, f, 8 * N_ENC), (2, 8 * N_ENC, f * channels)):
            out.append({name: torch.randn(*shape, generator=g, dtype=torch.float64), "decoder_input_ids": dec})
    return out


def _run(model: nn.Module, cfg: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """The first candidate input that runs, and its capture."""
    err: Exception | None = None
    for inputs in model_inputs(model, cfg):
        try:
            return inputs, forward_capture(model, None, None, inputs=inputs)
        except Exception as e:  # noqa: BLE001 - the next candidate input; the last error is reported
            err = e
    raise err if err is not None else ValueError("no input for this model")


def _kind(call: dict[str, Any]) -> str:
    nq, nk = call["q"].shape[-2], call["k"].shape[-2]
    return "cross" if nq != nk else "decoder" if nq == N_DEC else "encoder"


def _pattern(names: list[str]) -> str | None:
    """The module path of a kind's calls with ``{i}`` for the one index that varies (a single
    layer: the last index); None when the calls are not one numbered list of one module."""
    parts = [n.split(".") for n in names]
    if len({len(p) for p in parts}) != 1:
        return None
    vary = [j for j in range(len(parts[0])) if len({p[j] for p in parts}) > 1]
    if len(vary) > 1 or any(not p[j].isdigit() for p in parts for j in vary):
        return None
    digits = [j for j, c in enumerate(parts[0]) if c.isdigit()]
    if not vary and not digits:
        return None
    j = vary[0] if vary else digits[-1]
    return ".".join("{i}" if k == j else c for k, c in enumerate(parts[0]))


def group_calls(model: nn.Module, cap: Any) -> dict[str, tuple[str, dict[int, dict[str, Any]]]] | str:
    """kind → (attention module pattern, layer → call), or why the calls do not form the kinds."""
    names = {id(m): n for n, m in model.named_modules()}
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for call in cap.calls:
        by_kind.setdefault(_kind(call), {})[names.get(id(call["module"]), "")] = call
    if by_kind.get("encoder") and any(c["q"].shape[-2] == N_DEC for c in by_kind["encoder"].values()):
        return "the encoder's length equals the decoder's: kinds not told apart"
    out: dict[str, tuple[str, dict[int, dict[str, Any]]]] = {}
    for kind in KINDS:
        calls = by_kind.get(kind)
        if not calls:
            continue
        pattern = _pattern(list(calls))
        if pattern is None:
            return f"{kind} attention: its modules ({', '.join(list(calls)[:3])}) are not one numbered list"
        pre, post = pattern.split("{i}")
        out[kind] = (pattern, {int(n[len(pre): len(n) - len(post)]): c for n, c in calls.items()})
    return out


def _roles(pattern: str, i: int, call: dict[str, Any], io: dict) -> tuple[str, dict[str, str]] | str:
    """(split, role → module pattern) of one kind, from layer ``i``'s call: the projections
    inside the attention module, else inside its layer."""
    name = pattern.format(i=i)
    pre = pattern.split("{i}")[0] + str(i)
    found = _find_roles(call, io, name)
    if isinstance(found, str):
        found = _find_roles(call, io, pre)
    if isinstance(found, str):
        return found
    split, roles = found
    return split, {r: pattern.split("{i}")[0] + "{i}" + n[len(pre):] for r, n in roles.items()}


def _dims(kind: str, H: int, Hkv: int, dh: int, d: int, n_layers: int, cfg: Any
          ) -> tuple[list[str], dict[str, str]] | str:
    """(config path, which config fields give the sizes) of one kind (cross: the decoder's)."""
    side = "encoder" if kind == "encoder" else "decoder"
    for path in ([], [side], ["text_config"]):
        sub = cfg
        for k in path:
            sub = getattr(sub, k, None)
        if sub is None or not hasattr(sub, "to_dict"):
            continue
        have = sub.to_dict()
        spec = {"n_layers": _attr(have, _FIELDS[side]["n_layers"], n_layers), "d": _attr(have, _WIDTH, d),
                "n_heads": _attr(have, _FIELDS[side]["n_heads"], H),
                "n_kv_heads": "=n_heads" if Hkv == H else "=1" if Hkv == 1 else None,
                "head_dim": _attr(have, _HEAD_DIM, dh) or ("=d/n_heads" if d // H == dh else None)}
        if all(spec.values()):
            return path, spec  # type: ignore[return-value]
    return (f"{kind} attention: no config field gives its sizes ({H} heads of {dh} dims, {Hkv} kv heads, "
            f"width {d}, {n_layers} layers)")


def _part(model: nn.Module, cfg: Any, cap: Any, kind: str, pattern: str, calls: dict[int, dict[str, Any]]
          ) -> dict[str, Any] | str:
    """One kind's candidate row (before verification), or why none was found."""
    i = max(calls)
    found = _roles(pattern, i, calls[i], cap.io)
    if isinstance(found, str):
        return f"{kind} attention: {found}"
    split, mods = found
    if split != "separate" or type(model.get_submodule(mods["q"].format(i=i))).__name__ == "Conv1D":
        return f"{kind} attention: a {split} projection in an encoder-decoder is not in the table"
    q, k = (cap.io[mods[r].format(i=i)][0] for r in "qk")
    if q.shape[-1] != k.shape[-1]:
        return f"{kind} attention: queries of width {q.shape[-1]} against keys of width {k.shape[-1]}"
    call = calls[i]
    H, Hkv, dh = call["q"].shape[1], call["k"].shape[1], call["q"].shape[-1]
    layers = len(model.get_submodule(pattern[: pattern.index(".{i}")]))
    where = _dims(kind, H, Hkv, dh, int(q.shape[-1]), layers, cfg)
    if isinstance(where, str):
        return where
    path, spec = where
    factor = float(call.get("factor_q", 1.0) * call.get("factor_k", 1.0))
    scaling = call["scaling"] if call["scaling"] is not None else dh ** -0.5
    biased = any(c.get("position_bias") is not None and bool(c["position_bias"].abs().max() > 0) for c in calls.values())
    return {"attention": kind, "split": split, "modules": _strip_prefix(model, mods), "config_path": path,
            "dims": spec, "position": "relative_bias" if biased else _position(model, cfg.to_dict()),
            "qk_factor": round(factor, 12), "scaling": round(float(scaling), 12),
            "score_scale_times_sqrt_head_dim": round(factor * float(scaling) * dh ** 0.5, 6),
            "additive_score_terms": ["position_bias"] if biased else [], "kind": pattern.split("{i}")[1].lstrip("."),
            "layers_tiny": sorted(calls)}


def _verify(model: nn.Module, cfg: Any, cap: Any, part: dict[str, Any], model_type: str,
            calls: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The part's errors (every layer, read back through the reader) and, past round-off, the refusal."""
    from headrank.analysis.verify_layout import _check_fixed
    from headrank.io.layouts import AttentionReader, layout_from_row
    from headrank.io.live import LiveCheckpoint

    reader = AttentionReader(LiveCheckpoint(model, cfg.to_dict()), layout_from_row({**part, "model_type": model_type}))
    err = _check_fixed(reader, cap, calls, part["qk_factor"])
    out: dict[str, Any] = {f"max_{k}_error": float(f"{v:.3g}") for k, v in err.items()}
    out["layers_checked_tiny"] = sorted(set(calls) & set(reader.layer_ids))
    worst = max(err, key=err.get)
    if err[worst] >= TOL or out["layers_checked_tiny"] != sorted(calls):
        miss = (f"misses the module's {worst} by {err[worst]:.2g} (relative)" if err[worst] >= TOL
                else f"reads layers {out['layers_checked_tiny']} of {sorted(calls)}")
        out["reason"] = f"{model_type} {part['attention']} attention: the per-head products {miss}: layout not confirmed"
    return out


def discover_seq2seq(model_type: str) -> dict[str, Any]:
    """A verified row with ``parts`` (one per kind of attention) for an encoder-decoder, or a
    refusal (``status``, ``reason``). Raises what transformers raises when it cannot build or run
    the tiny model (the caller records it)."""
    from transformers import AutoConfig

    subs = getattr(type(AutoConfig.for_model(model_type)), "sub_configs", None) or {}
    if all(getattr(subs.get(k), "__name__", "") == "AutoConfig" for k in ("encoder", "decoder")):
        return {"status": "refused", "reason": "a composite of two model types (its config's encoder and decoder): "
                "its layout is theirs, not this type's (describe it in a TOML layout)"}
    model, cfg = build_tiny_seq2seq(model_type)
    inputs, first = _run(model, cfg)
    if not first.calls:
        return {"status": "refused", "reason": "encoder-decoder whose attention is computed inline, not through "
                "transformers' attention interface: layout not confirmed"}
    qk_norm = _strip_qk_norms(list({id(c["module"]): c["module"] for c in first.calls}.values()))
    _zero_biases(model)
    cap = forward_capture(model, None, None, inputs=inputs)
    kinds = group_calls(model, cap)
    if isinstance(kinds, str):
        return {"status": "refused", "reason": kinds}
    if "cross" not in kinds:
        return {"status": "refused", "reason": "no cross-attention found: not an encoder-decoder of this kind"}
    missing = [k for k in KINDS if k not in kinds]
    if missing:  # e.g. a block-sparse or local encoder attention computed inline (BigBird-Pegasus, LongT5)
        return {"status": "refused", "reason": f"no {missing[0]} attention through transformers' attention interface "
                "(computed inline): layout not confirmed"}
    parts = []
    for kind, (pattern, calls) in kinds.items():
        part = _part(model, cfg, cap, kind, pattern, calls)
        if isinstance(part, str):
            return {"status": "refused", "reason": part}
        part["qk_norm"] = qk_norm
        part.update(_verify(model, cfg, cap, part, model_type, calls))
        if "reason" in part:
            return {"status": "refused", "reason": part["reason"], "parts": parts + [part]}
        parts.append(part)
    first_part = parts[0]
    return {"status": "verified", "seq2seq": True, "parts": parts, "split": first_part["split"],
            "modules": first_part["modules"], "position": ",".join(dict.fromkeys(p["position"] for p in parts)),
            "qk_norm": qk_norm, "kind": "encoder-decoder",
            **{k: max(p[k] for p in parts) for k in ("max_logits_error", "max_values_error", "max_output_error")}}
