"""One layout test per architecture: a small random Hugging Face model, saved with
``save_pretrained``, analysed from disk by headrank, checked against the model's own forward.

For every head, the extracted factors must reproduce what the HF module computes:

- QK: ``x_iᵀ (W_K,hᵀ W_Q,h)ᵀ x_j`` equals ``q_h(x_i) · k_h(x_j)`` where q and k are the HF
  module's own per-head query/key states (captured inside its attention call, positions set to 0
  so rotary embeddings are the identity; biases zeroed, since products exclude them);
- OV: ``W_V,h x`` equals HF's per-head value states, and ``Σ_h P_h ctx_h`` equals the HF output
  projection applied to its own per-head context (``P_h W_V,h`` is thereby checked as a whole).

Grouped-query, multi-query, fused, interleaved and Conv1D layouts are all here: these tests are
what catch layout bugs.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import repeat_kv

from headrank.analysis.scan import analyze
from headrank.io.checkpoint import Checkpoint
from headrank.io.layouts import AttentionReader

CAPTURE = "headrank_capture"
_captured: dict[int, dict[str, torch.Tensor]] = {}


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    _captured[id(module)] = {"q": query, "k": key, "v": value}
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


tf.AttentionInterface.register(CAPTURE, _capture_attention)

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101)


def _falcon_qkv(module, fused):
    q, k, v = module._split_heads(fused)  # (b, n, heads, dh); k, v broadcast for new architecture
    return {"q": q.transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2)}


def _bloom_qkv(module, fused):
    q, k, v = module._reshape(fused)  # (b, heads, n, dh)
    return {"q": q, "k": k, "v": v}


# name: (config, model class, layers path, attention module, output projection, rotary, fused-qkv reader)
ARCHS = {
    "bert": (lambda: tf.BertConfig(**SMALL), tf.BertModel, "encoder.layer", "attention.self",
             "attention.output.dense", False, None),
    "roberta": (lambda: tf.RobertaConfig(**SMALL), tf.RobertaModel, "encoder.layer", "attention.self",
                "attention.output.dense", False, None),
    "distilbert": (lambda: tf.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=96, vocab_size=101),
                   tf.DistilBertModel, "transformer.layer", "attention", "attention.out_lin", False, None),
    "vit": (lambda: tf.ViTConfig(**{k: v for k, v in SMALL.items() if k != "vocab_size"}, image_size=16,
                                 patch_size=4), tf.ViTModel, "layers", "attention", "attention.o_proj", False, None),
    "gpt2": (lambda: tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32), tf.GPT2Model,
             "h", "attn", "attn.c_proj", False, None),
    "gpt_neox": (lambda: tf.GPTNeoXConfig(**SMALL, rotary_pct=0.5), tf.GPTNeoXModel, "layers", "attention",
                 "attention.dense", True, None),
    "llama_gqa": (lambda: tf.LlamaConfig(**SMALL, num_key_value_heads=2), tf.LlamaModel, "layers", "self_attn",
                  "self_attn.o_proj", True, None),
    "mistral_mqa": (lambda: tf.MistralConfig(**SMALL, num_key_value_heads=1), tf.MistralModel, "layers",
                    "self_attn", "self_attn.o_proj", True, None),
    "qwen2_gqa_bias": (lambda: tf.Qwen2Config(**SMALL, num_key_value_heads=2), tf.Qwen2Model, "layers",
                       "self_attn", "self_attn.o_proj", True, None),
    "gemma_head_dim": (lambda: tf.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=24), tf.GemmaModel,
                       "layers", "self_attn", "self_attn.o_proj", True, None),
    "opt": (lambda: tf.OPTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=96,
                                 vocab_size=101, word_embed_proj_dim=64), tf.OPTModel, "decoder.layers",
            "self_attn", "self_attn.out_proj", False, None),
    "falcon_multi_query": (lambda: tf.FalconConfig(**SMALL, multi_query=True, new_decoder_architecture=False),
                           tf.FalconModel, "h", "self_attention", "self_attention.dense", True, _falcon_qkv),
    "falcon_interleaved": (lambda: tf.FalconConfig(**SMALL, multi_query=False, new_decoder_architecture=False),
                           tf.FalconModel, "h", "self_attention", "self_attention.dense", True, _falcon_qkv),
    "falcon_new_arch": (lambda: tf.FalconConfig(**SMALL, new_decoder_architecture=True, num_kv_heads=2),
                        tf.FalconModel, "h", "self_attention", "self_attention.dense", True, _falcon_qkv),
    "bloom": (lambda: tf.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=101), tf.BloomModel, "h",
              "self_attention", "self_attention.dense", False, _bloom_qkv),
    "phi": (lambda: tf.PhiConfig(**SMALL, partial_rotary_factor=0.5), tf.PhiModel, "layers", "self_attn",
            "self_attn.dense", True, None),
    "phi3_fused_gqa": (lambda: tf.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0), tf.Phi3Model,
                       "layers", "self_attn", "self_attn.o_proj", True, None),
}


def _build(name, tmp_path):
    make_cfg, cls, *_ = ARCHS[name]
    torch.manual_seed(0)
    cfg = make_cfg()
    model = cls(cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.zero_()
    model.save_pretrained(tmp_path, safe_serialization=True)
    model = cls.from_pretrained(tmp_path, attn_implementation=CAPTURE if ARCHS[name][6] is None else "eager")
    return model.double().eval()


def _run(name, model):
    _, _, layers_path, attn_path, o_path, rotary, fused_reader = ARCHS[name]
    layers = model.get_submodule(layers_path)
    caps: list[dict] = [{} for _ in layers]
    hooks = []
    for i, layer in enumerate(layers):
        attn = layer.get_submodule(attn_path)

        def pre(mod, args, kwargs, i=i):
            caps[i]["x"] = args[0] if args else kwargs["hidden_states"]

        def post_attn(mod, args, kwargs, out, i=i):
            if fused_reader is None:
                caps[i].update(_captured.pop(id(mod)))

        def o_hook(mod, args, out, i=i):
            caps[i]["ctx"], caps[i]["o_out"] = args[0], out

        hooks += [attn.register_forward_pre_hook(pre, with_kwargs=True),
                  attn.register_forward_hook(post_attn, with_kwargs=True),
                  layer.get_submodule(o_path).register_forward_hook(o_hook)]
        if fused_reader is not None:
            def qkv_hook(mod, args, out, i=i, attn=attn):
                caps[i].update(fused_reader(attn, out))

            hooks.append(attn.query_key_value.register_forward_hook(qkv_hook))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if name == "vit":
            model(pixel_values=torch.randn(2, 3, 16, 16, generator=g, dtype=torch.float64))
        else:
            ids = torch.randint(0, 101, (2, 7), generator=g)
            kw = {"position_ids": torch.zeros_like(ids)} if rotary else {}
            model(input_ids=ids, **kw)
    for h in hooks:
        h.remove()
    return caps


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_layout_reproduces_hf_attention(name, tmp_path):
    model = _build(name, tmp_path)
    caps = _run(name, model)
    with Checkpoint(tmp_path) as ckpt:
        reader = AttentionReader(ckpt)
        H, Hkv, dh = reader.dims.n_heads, reader.dims.n_kv_heads, reader.dims.head_dim
        for i, cap in enumerate(caps):
            hw = reader.read_layer(i)
            qk_a, qk_b = (t.double() for t in hw.qk_factors())
            ov_a, ov_b = (t.double() for t in hw.ov_factors())
            x = cap["x"]  # (b, n, d)
            q, k, v = cap["q"], cap["k"], cap["v"]  # (b, heads, n, dh) as HF computed them
            if k.shape[1] != H:  # HF's own grouped-query expansion
                k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])
            hf_scores = q @ k.mT  # (b, H, n, n)
            if name == "opt":  # OPT multiplies q_proj's output by dh^-0.5 before its attention call
                hf_scores = hf_scores * dh**0.5
            M = qk_a @ qk_b.mT  # W_K,hᵀ W_Q,h, formed here only as the reference path
            ours = torch.einsum("bid,hed,bje->bhij", x, M, x)
            torch.testing.assert_close(ours, hf_scores, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(torch.einsum("hdk,bnd->bhnk", ov_b, x), v, rtol=1e-9, atol=1e-9)
            ctx = cap["ctx"].reshape(*cap["ctx"].shape[:-1], H, dh)  # HF's per-head context
            o_bias = 0.0  # zeroed above
            ours_o = torch.einsum("hdk,bnhk->bnd", ov_a, ctx) + o_bias
            torch.testing.assert_close(ours_o, cap["o_out"], rtol=1e-9, atol=1e-9)
    meta = analyze(tmp_path).meta
    assert meta["config"]["n_heads"] == H and meta["config"]["n_kv_heads"] == Hkv
    assert meta["conventions"]["rotary"] is ARCHS[name][5]


def test_wrong_split_is_caught(tmp_path, monkeypatch):
    """The test above must fail when a layout is wrong: swap GPT-NeoX's interleaving for fused."""
    import headrank.io.layouts as L

    model = _build("gpt_neox", tmp_path)
    caps = _run("gpt_neox", model)
    monkeypatch.setitem(L.SPLITS, "fused_per_head", L.SPLITS["fused"])
    with Checkpoint(tmp_path) as ckpt:
        hw = AttentionReader(ckpt).read_layer(0)
        a, b = (t.double() for t in hw.qk_factors())
        ours = torch.einsum("bid,hed,bje->bhij", caps[0]["x"], a @ b.mT, caps[0]["x"])
        assert not torch.allclose(ours, caps[0]["q"] @ caps[0]["k"].mT, atol=1e-6)


def test_causal_lm_prefix_and_toml_escape_hatch(tmp_path):
    """LlamaForCausalLM stores 'model.layers…'; a TOML layout reads a renamed copy with no config."""
    import json

    import pandas as pd
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**SMALL, num_key_value_heads=2)
    tf.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "lm")
    ref = analyze(tmp_path / "lm")
    assert ref.meta["layout"]["prefix"] == "model."

    sd = load_file(tmp_path / "lm" / "model.safetensors")
    renamed = {k.replace("model.layers.", "net.blk.").replace("self_attn.", "mix."): v for k, v in sd.items()}
    (tmp_path / "own").mkdir()
    save_file(renamed, tmp_path / "own" / "weights.safetensors")
    toml = tmp_path / "layout.toml"
    toml.write_text(
        'split = "separate"\nposition = "rotary"\n[tensors]\n'
        + "".join(f'{r} = "net.blk.{{i}}.mix.{r}_proj.weight"\n' for r in "qkvo")
        + "[sizes]\nn_layers = 2\nd_model = 64\nn_heads = 4\nn_kv_heads = 2\n"
    )
    own = analyze(tmp_path / "own" / "weights.safetensors", layout=toml)
    cols = ["layer", "head", "product", "nuclear", "gap", "balance", "rank"]
    pd.testing.assert_frame_equal(own.table[cols], ref.table[cols])
    assert own.meta["conventions"]["rotary"] is True

    bad = tmp_path / "bad.toml"
    bad.write_text('split = "separate"\n[tensors]\nq = "x.{i}"\n[sizes]\nn_layers = 1\n')
    from headrank.errors import HeadRankError

    with pytest.raises(HeadRankError, match="tensors"):
        analyze(tmp_path / "own" / "weights.safetensors", layout=bad)
    cfg_dict = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert cfg_dict["model_type"] == "llama"


def test_gpt2_lm_head_with_tied_embeddings(tmp_path):
    torch.manual_seed(0)
    tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32)) \
        .save_pretrained(tmp_path)
    r = analyze(tmp_path)
    assert r.meta["layout"]["prefix"] == "transformer." and r.meta["layout"]["split"] == "conv1d_fused"
    assert len(r.table) == 2 * 4 * 2


SURGERY = {  # model_type: (config, model class) of a small live model
    "bert": (lambda: tf.BertConfig(**SMALL), tf.BertModel),
    "gpt2": (ARCHS["gpt2"][0], tf.GPT2Model),
    "llama": (ARCHS["llama_gqa"][0], tf.LlamaModel),
}


@pytest.mark.parametrize("model_type", sorted(SURGERY))
def test_layout_modules_name_live_submodules(model_type):
    """A row's ``modules`` (what collapse surgery calls) names real submodules of a live model."""
    from headrank.io.layouts import layout_for, surgery_model_types

    make_cfg, cls = SURGERY[model_type]
    model = cls(make_cfg())
    m = layout_for({"model_type": model_type}).modules
    assert m is not None and model_type in surgery_model_types()
    layers = model.get_submodule(m.layers)
    assert isinstance(layers, torch.nn.ModuleList) and len(layers) == 2
    names = [m.attn, m.mlp] + ([m.attn_out, m.mlp_out] if m.placement == "post" else [m.attn_norm, m.mlp_norm])
    for name in names:
        assert name and layers[1].get_submodule(name) is not None
    assert model.get_submodule(m.attention(1)) is layers[1].get_submodule(m.attn)
    if m.final_norm:
        assert model.get_submodule(m.final_norm) is not None


def test_rows_without_modules_are_not_offered_to_surgery():
    from headrank.io.layouts import LAYOUTS, surgery_model_types

    with_modules = {t for lay in LAYOUTS if lay.modules is not None for t in lay.model_types}
    assert set(surgery_model_types()) == with_modules
    assert {"mixtral", "gemma2", "vit", "distilbert", "headrank"}.isdisjoint(with_modules)
