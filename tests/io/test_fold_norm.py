"""``fold_norm``: the pre-attention norm gain folded into W_Q, W_K, W_V.

GPT-2 (LayerNorm: fold, then centre along d_model) is checked against TransformerLens' own
``ProcessWeights.fold_layer_norm`` (its ``fold_ln``), where transformer-lens is installed (the
``bench`` extra); Llama and Gemma (RMSNorm, Gemma's ``1 + w``) against a dense float64
reference computed from the Hugging Face module, which runs everywhere.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import transformers as tf

from headrank.analysis.scan import analyze
from headrank.errors import HeadRankError


def _gpt2(path):
    torch.manual_seed(0)
    m = tf.GPT2Model(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32))
    with torch.no_grad():
        for blk in m.h:
            blk.ln_1.weight.uniform_(0.3, 2.0)
            blk.ln_1.bias.normal_()
    m.save_pretrained(path)
    return m.double()


def _rel_sv(got, mats):
    """max over heads of |σ(got) − σ(ref)| / σ_1(ref) for (layer, head) → d×d reference products."""
    err = 0.0
    for (i, h), m in mats.items():
        ref = torch.linalg.svdvals(m).numpy()[: got.shape[-1]]
        err = max(err, float(np.abs(got[i, h] - ref).max() / ref[0]))
    return err


def test_gpt2_fold_equals_transformer_lens(tmp_path):
    tl = pytest.importorskip("transformer_lens.weight_processing")
    m = _gpt2(tmp_path / "m")
    H, d, dh = 4, 64, 16
    sd = {}
    for l, blk in enumerate(m.h):  # TransformerLens' layout: W_Q[h] is (d_model, d_head)
        W, b = blk.attn.c_attn.weight.detach(), blk.attn.c_attn.bias.detach()
        for j, n in enumerate("QKV"):
            sd[f"blocks.{l}.attn.W_{n}"] = W[:, j * d:(j + 1) * d].reshape(d, H, dh).permute(1, 0, 2).clone()
            sd[f"blocks.{l}.attn.b_{n}"] = b[j * d:(j + 1) * d].reshape(H, dh).clone()
        sd[f"blocks.{l}.ln1.w"] = blk.ln_1.weight.detach().clone()
        sd[f"blocks.{l}.ln1.b"] = blk.ln_1.bias.detach().clone()
    cfg = types.SimpleNamespace(n_layers=2, n_key_value_heads=None, n_heads=H, d_model=d, d_head=dh)
    folded = tl.ProcessWeights.fold_layer_norm(sd, cfg, fold_biases=True, center_weights=True)
    got = analyze(tmp_path / "m", fold_norm=True)
    raw = analyze(tmp_path / "m")
    qk, ov = {}, {}
    for l, blk in enumerate(m.h):
        P = blk.attn.c_proj.weight.detach().T  # (d, H·dh), W_O not centred (centre_writing_weights off)
        for h in range(H):
            WQ, WK, WV = (folded[f"blocks.{l}.attn.W_{n}"][h] for n in "QKV")
            qk[(l, h)] = WK @ WQ.T  # = W_K,hᵀ W_Q,h in headrank's (dh, d) convention
            ov[(l, h)] = P[:, h * dh:(h + 1) * dh] @ WV.T
    assert _rel_sv(got.sv["qk"], qk) < 1e-6 and _rel_sv(got.sv["ov"], ov) < 1e-6  # weights stored in float32
    assert _rel_sv(raw.sv["qk"], qk) > 1e-2  # folding matters here
    assert "norm folded" in got.meta["conventions"]["weights"] and "centred" in got.meta["conventions"]["weights"]


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_rmsnorm_fold_equals_dense_reference(tmp_path, kind):
    torch.manual_seed(0)
    small = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                 vocab_size=101, num_key_value_heads=2)
    cfg, cls = ((tf.LlamaConfig(**small), tf.LlamaModel) if kind == "llama"
                else (tf.GemmaConfig(**small, head_dim=24), tf.GemmaModel))
    m = cls(cfg)
    with torch.no_grad():
        for layer in m.layers:
            layer.input_layernorm.weight.uniform_(0.3, 2.0)
    m.save_pretrained(tmp_path / "m")
    got = analyze(tmp_path / "m", fold_norm=True)
    H, Hkv, dh = 4, 2, cfg.head_dim
    qk, ov = {}, {}
    for i, layer in enumerate(m.layers):
        g = layer.input_layernorm.weight.detach().double() + (1.0 if kind == "gemma" else 0.0)
        a = layer.self_attn
        WQ, WK, WV = (p.weight.detach().double() * g for p in (a.q_proj, a.k_proj, a.v_proj))
        O = a.o_proj.weight.detach().double()
        for h in range(H):
            r, kr = slice(h * dh, (h + 1) * dh), slice((h // (H // Hkv)) * dh, (h // (H // Hkv) + 1) * dh)
            qk[(i, h)] = WK[kr].T @ WQ[r]
            ov[(i, h)] = O[:, r] @ WV[kr]
    assert _rel_sv(got.sv["qk"], qk) < 1e-12 and _rel_sv(got.sv["ov"], ov) < 1e-12
    assert got.meta["conventions"]["weights"].startswith("norm folded")


def test_fold_norm_refused_without_a_pre_norm(tmp_path):
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=96, vocab_size=101)).save_pretrained(tmp_path / "b")
    with pytest.raises(HeadRankError, match="no norm precedes attention"):
        analyze(tmp_path / "b", fold_norm=True)
