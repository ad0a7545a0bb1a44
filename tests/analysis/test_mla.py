"""Multi-head latent attention (DeepSeek-V3) against the Hugging Face module's own eager attention.

A tiny random ``deepseek_v3`` (with a query latent, ``q_lora_rank`` set, and without it) is saved
and measured by ``spectra`` through its generated ``mla`` layout; the per-head latent products
(docs/mla.md) plus the decoupled rotary part, computed here from the module's own weights at
positions 0, must give the module's attention probabilities, and the OV products its output. The
measured QK ranks are at most ``qk_nope_head_dim``, the OV ranks at most ``v_head_dim``.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from headrank.analysis.discover import MLA_TINY, tiny_config
from headrank.analysis.scan import analyze
from headrank.io.checkpoint import Checkpoint
from headrank.io.layouts import AttentionReader


def _model(q_lora: bool):
    cfg = tiny_config("deepseek_v3", None if q_lora else {"q_lora_rank": None})
    cfg.num_hidden_layers, cfg.first_k_dense_replace = 2, 1
    torch.manual_seed(0)
    model = tf.DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="eager", experts_implementation="eager",
                                                  dtype=torch.float64)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.zero_()
            if "layernorm" in n:  # gains off 1, so that folding them is seen
                p.uniform_(0.5, 1.5)
    return model.eval(), cfg


def _capture(model, ids):
    seen = {}
    hooks = [layer.self_attn.register_forward_hook(
        lambda m, a, kw, out, i=i: seen.__setitem__(i, (kw["hidden_states"], out[0], out[1])), with_kwargs=True)
        for i, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.zeros_like(ids), output_attentions=True)
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("q_lora", [True, False], ids=["q_lora_rank", "q_lora_rank_null"])
def test_mla_matches_forward_and_ranks(q_lora, tmp_path):
    model, cfg = _model(q_lora)
    model.save_pretrained(tmp_path)
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(1))
    seen = _capture(model, ids)
    nope, rope, v, kv = (MLA_TINY[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    with Checkpoint(tmp_path) as ckpt:
        reader = AttentionReader(ckpt)
        assert reader.split == "mla" and reader.dims.mla[3] == (MLA_TINY["q_lora_rank"] if q_lora else cfg.hidden_size)
        for i, (x, out, p) in seen.items():
            att = model.model.layers[i].self_attn
            hw = reader.read_layer(i)
            with torch.no_grad():
                cq = att.q_a_layernorm(att.q_a_proj(x)) if q_lora else x
                ckv_full = att.kv_a_proj_with_mqa(x)
                ckv = att.kv_a_layernorm(ckv_full[..., :kv])
                wq_full = (att.q_b_proj if q_lora else att.q_proj).weight.reshape(-1, nope + rope, cq.shape[-1])
                rot = torch.einsum("bmq,hrq,bnr->bhmn", cq, wq_full[:, nope:], ckv_full[..., kv:])
            a, b = hw.qk_factors()
            logits = (torch.einsum("bmq,hqe,hce,bnc->bhmn", cq, b, a, ckv) + rot) * att.scaling
            want = (logits - logits[..., :1])[..., causal]
            got = (p.log() - p[..., :1].log())[..., causal]
            assert float((want - got).abs().max() / want.abs().max()) < 1e-4  # float32 eager softmax
            pa, pb = hw.ov_factors()
            pred = torch.einsum("bhmn,bnc,hce,hfe->bmf", p, ckv, pb, pa)
            assert float((pred - out).abs().max() / out.abs().max()) < 1e-9
    res = analyze(tmp_path)
    qk, ov = res.table[res.table["product"] == "qk"], res.table[res.table["product"] == "ov"]
    assert len(qk) == 2 * cfg.num_attention_heads and qk["rank"].max() <= nope and ov["rank"].max() <= v
    assert qk["rank"].max() == nope and ov["rank"].max() == v  # random weights: full rank
    folded = analyze(tmp_path, fold_norm=True).table
    assert not torch.allclose(torch.tensor(folded["nuclear"].to_numpy()), torch.tensor(res.table["nuclear"].to_numpy()))


def test_compress_refuses_mla(tmp_path):
    from headrank.compress.api import open_source
    from headrank.errors import HeadRankError

    model, _ = _model(True)
    model.save_pretrained(tmp_path)
    with pytest.raises(HeadRankError, match="multi-head latent attention") as e:
        open_source(tmp_path)
    assert "\n" not in str(e.value)
