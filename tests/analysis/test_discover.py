"""Generated layouts against the Hugging Face modules' own eager attention.

For a model type without a hand-written row, ``layout_for`` reads the committed generated row
(src/headrank/io/layouts_generated.json). Here a tiny random model of that type is built
independently of the discovery code's capture (its own eager attention, ``output_attentions``),
its QK-norms replaced by the identity (the products are those before the norm) and biases zeroed,
at positions 0 (rotary is then the identity, up to a YaRN attention factor that the model's own
rotary embedding reports). The per-head products read through the generated layout must give

- QK: the module's attention probabilities, renormalised over the keys (so an attention sink's
  share does not matter), equal the causal softmax of the scaled per-head logits;
- OV: the module's output, ``Σ_h P_h W_V,h Σ_j p_hij x_j``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from headrank.analysis.discover import auto_class, known_types, tiny_config
from headrank.analysis.discover_tiny import prepare
from headrank.io.generated import generated_rows
from headrank.io.layouts import AttentionReader, layout_for, layout_from_row, layout_model_types
from headrank.io.live import LiveCheckpoint

FAST = ["qwen3_moe"]
REQUIRED = ["olmoe", "gpt_oss", "llama4_text", "gemma3_text", "mixtral", "granitemoe", "smollm3"]
MORE = ["qwen2_moe", "glm4_moe", "exaone4", "seed_oss", "apertus", "hunyuan_v1_moe", "ministral", "phimoe",
        "gpt_bigcode", "stablelm", "modernbert", "olmo3", "cohere2", "ernie4_5", "jamba", "olmo", "granite",
        "hunyuan_v1_dense", "ernie4_5_moe", "whisper"]
# measured since the tiny configs follow the tiny width further (discover_tiny) and GPT's fused Conv1D is
# found in inline attention
NEWER = ["esm", "xmod", "nemotron_h", "falcon_h1", "bamba", "recurrent_gemma", "openai-gpt"]


def _tiny(mt: str, overrides=None):
    cfg = tiny_config(mt, overrides)
    torch.manual_seed(0)
    model = auto_class(mt).from_config(cfg, attn_implementation="eager", experts_implementation="eager",
                                       dtype=torch.float64)
    prepare(model, cfg)  # X-MOD: a default language for its adapters
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.zero_()
    return model.eval(), cfg


class _Identity(nn.Module):
    """The identity, whatever else a norm is called with (Nemotron-H's gated norm)."""

    def forward(self, x, *args, **kwargs):
        return x


#: models that scale the query by 1/sqrt(dh) inside the module and hand the attention a scale of 1
#: (ESM: "For BC we apply scaling before RoPE")
PRESCALED_QUERY = {"esm"}


def _attention_modules(model: nn.Module, row: dict, role: str | None = None) -> dict[int, nn.Module]:
    pattern = row["modules"][role] if role else next(iter(row["modules"].values()))  # e.g. layers.{i}.self_attn.q_proj
    att = pattern if role else pattern.rsplit(".", 1)[0]
    pre, post = att.split("{i}")
    base = getattr(model, model.base_model_prefix, model) if pattern.split(".")[0] != model.base_model_prefix else model
    out = {}
    for name, m in base.named_modules():
        if name.startswith(pre) and name.endswith(post):
            mid = name[len(pre): len(name) - len(post)]
            if mid.isdigit():
                out[int(mid)] = m
    return out


def _check(mt: str, overrides=None) -> dict[str, float]:
    row = generated_rows()[mt]
    assert row["status"] == "verified", row.get("reason")
    if row.get("parts"):  # an encoder-decoder's row (Whisper): its causal-LM class holds the decoder
        dec = next(p for p in row["parts"] if p["attention"] == "decoder")
        row = {k: v for k, v in {**row, **dec}.items() if k != "parts"}
    model, cfg = _tiny(mt, overrides)
    # the generated row (also where the hand-written table has one); layout_for picks it otherwise
    reader = AttentionReader(LiveCheckpoint(model, cfg.to_dict()), layout_from_row(row))
    atts = {i: a for i, a in _attention_modules(model, row).items() if i in reader.layer_ids}
    outs = _attention_modules(model, row, "o")  # the output projection: in the module, or after it (BERT-style)
    for a in atts.values():  # QK-norm → identity: products are those of the projections
        for n, _c in list(a.named_children()):
            if "norm" in n.lower():
                setattr(a, n, _Identity())
    seen: dict[int, dict] = {}
    hooks = [a.register_forward_hook(lambda m, args, kw, out, i=i: seen.setdefault(i, {}).update(
        x=kw.get("hidden_states", args[0] if args else None), p=out[1]), with_kwargs=True)
        for i, a in atts.items()]
    hooks += [outs[i].register_forward_hook(lambda m, args, out, i=i: seen.setdefault(i, {}).__setitem__("out", out))
              for i in atts]
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.zeros_like(ids), output_attentions=True)
    for h in hooks:
        h.remove()
    if mt not in layout_model_types():
        assert layout_for(cfg.to_dict()).model_types == (mt,)
    rot = getattr(getattr(model, model.base_model_prefix, model), "rotary_emb", None)
    factor = float(getattr(rot, "attention_scaling", 1.0)) ** 2 if row["position"] == "rotary" else 1.0
    err = {"qk": 0.0, "ov": 0.0}
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    for i in sorted(seen):
        hw, x, p = reader.read_layer(i), seen[i]["x"], seen[i]["p"]
        a, b = hw.qk_factors()
        scaling = (getattr(atts[i], "scaling", None) if mt not in PRESCALED_QUERY else None) or hw.wq.shape[1] ** -0.5
        logits = torch.einsum("bmd,hde,hfe,bnf->bhmn", x, b, a, x) * scaling * factor
        # probabilities renormalised over the keys (an attention sink takes its share first)
        mask = causal if not bool(p[..., ~causal].any()) else torch.ones_like(causal)  # decoder or encoder
        want = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
        got = p / p.sum(-1, keepdim=True)
        err["qk"] = max(err["qk"], float((want - got).abs().max()))
        ctx = torch.einsum("bhmn,bnd->bhmd", p, x)
        pa, pb = hw.ov_factors()
        pred = torch.einsum("bhmd,hde,hfe->bmf", ctx, pb, pa)
        err["ov"] = max(err["ov"], float((pred - seen[i]["out"]).abs().max() / seen[i]["out"].abs().max()))
    assert seen, "no attention layer ran"
    return err


def _assert_matches(mt: str) -> None:
    err = _check(mt)
    # the eager softmax runs in float32 (transformers' eager_attention_forward): probabilities carry
    # float32 round-off; the output uses those same probabilities (float64 round-off)
    assert err["qk"] < 1e-5 and err["ov"] < 1e-9, f"{mt}: relative error {err} (expected round-off)"


@pytest.mark.parametrize("mt", FAST)
def test_generated_layout_matches_forward(mt):
    _assert_matches(mt)


@pytest.mark.slow
@pytest.mark.parametrize("mt", REQUIRED + MORE + NEWER)
def test_generated_layout_matches_forward_more(mt):
    if generated_rows().get(mt, {}).get("status") != "verified":
        pytest.fail(f"{mt}: {generated_rows().get(mt, {}).get('reason', 'no row')}")
    _assert_matches(mt)


def test_every_type_is_measured_or_refused():
    rows = generated_rows()
    table = set(layout_model_types())
    missing = [mt for mt in known_types() if mt not in table and mt not in rows]
    assert not missing, f"types with no table row and no generated row: {missing[:10]}"
    refused = [mt for mt, r in rows.items() if r["status"] != "verified"]
    assert all(rows[mt].get("reason") for mt in refused)
    measured = len([mt for mt in known_types() if mt in table or rows.get(mt, {}).get("status") == "verified"])
    # the goal is 150; transformers 5.24.0 gives 145 (docs/architectures.md): a floor against regressions
    assert measured >= 140, f"{measured} of {len(known_types())} measured"


def test_refused_type_is_one_line():
    rows = generated_rows()
    mt = next(mt for mt, r in rows.items() if r["status"] == "refused")
    with pytest.raises(Exception) as e:
        layout_for({"model_type": mt})
    assert "refused" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow
def test_spectra_reads_a_hybrid_from_disk(tmp_path):
    """Jamba: only its softmax-attention layers are measured, by their true layer index."""
    from headrank.analysis.scan import analyze

    model, cfg = _tiny("jamba")
    model.save_pretrained(tmp_path)
    res = analyze(tmp_path)
    want = [i for i in range(cfg.num_hidden_layers) if i % cfg.attn_layer_period == cfg.attn_layer_offset]
    assert sorted(res.table["layer"].unique()) == want and want and want[0] > 0
    with pytest.raises(Exception, match="has no softmax attention"):
        analyze(tmp_path, layers="0")


@pytest.mark.slow
def test_esm_rotary_variant_matches_forward_and_is_read_as_rotary():
    """ESM-2 checkpoints say position_embedding_type rotary (the default config: absolute). The same
    layout is verified per rotary band with that setting, and a generated row's position follows
    the config's position_embedding_type, as the table's BERT rows do."""
    from headrank.analysis.architectures import discover

    row = discover("esm", {"position_embedding_type": "rotary"})
    assert row["status"] == "verified" and row["position"] == "rotary" and row["rotary_style"] == "half"
    assert row["modules"] == generated_rows()["esm"]["modules"] and row["max_band_error"] < 1e-5
    cfg = tiny_config("esm", {"position_embedding_type": "rotary"}).to_dict()
    assert layout_for(cfg).position(cfg) == "rotary"
    assert layout_for({**cfg, "position_embedding_type": "absolute"}).position(cfg | {"position_embedding_type": "absolute"}) == "absolute"
