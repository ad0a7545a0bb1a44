"""GGUF files of the 2025-26 families (qwen2moe, qwen3moe, gpt-oss, gemma3, minimax-m2, nemotron),
written from tiny random transformers models with the ``gguf`` package's own writer in llama.cpp's
layout (convert_hf_to_gguf.py: none of these permutes Q/K rows; Gemma 3 and Nemotron store their
norms' ``1 + w``; gpt-oss's sinks become ``attn_sinks.weight``), read back by headrank and compared
with two references: headrank's reading of the Hugging Face checkpoint (the generated or table row,
verified against the module's forward) and the dense float64 products of the Hugging Face weights
(numpy SVD of ``W_K,hᵀ W_Q,h`` and ``P_h W_V,h``, norm gains folded by hand for ``fold_norm``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from headrank.analysis.scan import analyze  # noqa: E402
from headrank.io import gguf as ag  # noqa: E402
from tests.helpers import write_gguf_tensors  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
             vocab_size=101)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# gguf architecture: (transformers config, norm shift the converter adds, norm kind)
FAMILIES = {
    "qwen2moe": (lambda: tf.Qwen2MoeConfig(**SMALL, **MOE, num_experts=4, shared_expert_intermediate_size=32),
                 0.0, "rmsnorm"),
    "qwen3moe": (lambda: tf.Qwen3MoeConfig(**SMALL, **MOE, num_experts=4, head_dim=24), 0.0, "rmsnorm"),
    "gpt-oss": (lambda: tf.GptOssConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2, head_dim=24,
                                        sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
                0.0, "rmsnorm"),
    "gemma3": (lambda: tf.Gemma3TextConfig(**SMALL, head_dim=24, sliding_window=8,
                                           layer_types=["sliding_attention", "full_attention"]), 1.0, "rmsnorm"),
    "minimax-m2": (lambda: tf.MiniMaxM2Config(**SMALL, num_local_experts=4, num_experts_per_tok=2, head_dim=24),
                   0.0, "rmsnorm"),
    "nemotron": (lambda: tf.NemotronConfig(**SMALL, head_dim=24), 1.0, "layernorm"),
}
_ROLES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
          "q_norm": "attn_q_norm", "k_norm": "attn_k_norm"}


def build(arch, path, seed=0, cfg=None):
    """A tiny random model of the family, non-trivial norm gains and biases, saved as safetensors."""
    cfg = cfg or FAMILIES[arch][0]()
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(("bias", "sinks")):
                p.normal_()
    model.save_pretrained(path)
    return model


def gguf_tensors(arch, model):
    """{gguf name: float32 array}: attention, its norm, biases and sinks as convert_hf_to_gguf.py writes them."""
    shift = FAMILIES[arch][1]
    out = {}
    for name, t in model.state_dict().items():
        parts = name.split(".")  # model.layers.{i}.self_attn.q_proj.weight
        if parts[:2] != ["model", "layers"]:
            continue
        i, rest = parts[2], parts[3:]
        if rest[0] == "self_attn" and rest[1] in _ROLES:
            key = f"blk.{i}.{_ROLES[rest[1]]}.{rest[2]}"
        elif rest == ["self_attn", "sinks"]:
            key = f"blk.{i}.attn_sinks.weight"
        elif rest[0] == "input_layernorm":
            key = f"blk.{i}.attn_norm.{rest[1]}"
        else:
            continue
        t = t.detach().float()
        out[key] = (t + shift if key.endswith("norm.weight") else t).contiguous().numpy()
    return out


def write(path, arch, kv, tensors, qtypes=None):
    """``kv``: {key without the arch prefix: int, float or str}; ``qtypes``: {name suffix: GGML type}."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        add = w.add_string if isinstance(value, str) else w.add_float32 if isinstance(value, float) else w.add_uint32
        add(f"{arch}.{key}", value)
    write_gguf_tensors(w, tensors, qtypes)
    return path


def head_dim(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def metadata(arch, cfg):
    """The sizes the converter writes: key/value length only where the config has a head_dim."""
    kv = {"block_count": cfg.num_hidden_layers, "embedding_length": cfg.hidden_size,
          "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
          "rope.freq_base": 10000.0}
    if getattr(cfg, "head_dim", None):
        kv.update({"attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim})
    if getattr(cfg, "sliding_window", None):
        kv["attention.sliding_window"] = cfg.sliding_window
    return kv


def dense_sv(model, gains=None):
    """Per layer, head and product the singular values of the dense float64 product, from the
    Hugging Face weights (``gains``: fold each layer's norm gain, centring too for a LayerNorm)."""
    c = model.config
    H, Hkv, dh, d = c.num_attention_heads, c.num_key_value_heads, head_dim(c), c.hidden_size
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    out = {"qk": [], "ov": []}
    for i in range(c.num_hidden_layers):
        w = {r: sd[f"model.layers.{i}.self_attn.{r}_proj.weight"] for r in "qkvo"}
        if gains is not None:
            g, centre = gains(sd, i)
            for r in "qkv":
                w[r] = w[r] * g
                w[r] = w[r] - w[r].mean(-1, keepdims=True) if centre else w[r]
        wq, wk, wv = w["q"].reshape(H, dh, d), w["k"].reshape(Hkv, dh, d), w["v"].reshape(Hkv, dh, d)
        p = w["o"].reshape(d, H, dh)
        g = H // Hkv
        out["qk"].append([np.linalg.svd(wk[h // g].T @ wq[h], compute_uv=False)[:dh] for h in range(H)])
        out["ov"].append([np.linalg.svd(p[:, h] @ wv[h // g], compute_uv=False)[:dh] for h in range(H)])
    return {k: np.array(v) for k, v in out.items()}


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def norm_gains(arch):
    """The fold a reader should do, from the Hugging Face weights: Gemma 3's and Nemotron's norms
    multiply by ``1 + w``, Nemotron's is a LayerNorm (its output centred: the weights centred too)."""
    shift, kind = FAMILIES[arch][1], FAMILIES[arch][2]
    return lambda sd, i: (sd[f"model.layers.{i}.input_layernorm.weight"] + shift, kind == "layernorm")


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_matches_hf_checkpoint_and_dense_products(arch, tmp_path):
    assert arch in ag.TESTED and arch in ag.ARCHS
    model = build(arch, tmp_path / "hf dir")
    f = write(tmp_path / "m.gguf", arch, metadata(arch, model.config), gguf_tensors(arch, model))
    ref, got = analyze(tmp_path / "hf dir"), analyze(f)
    assert got.meta["gguf"]["architecture"] == arch
    for k in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim"):
        assert got.meta["config"][k] == ref.meta["config"][k], k
    dense = dense_sv(model)
    for p in ("qk", "ov"):
        assert rel(got.sv[p], ref.sv[p]) < 1e-12 and rel(got.sv[p], dense[p]) < 1e-10, p
    for k in ref.row_norms:  # unpermuted rows: per-dimension row norms line up with the HF checkpoint
        np.testing.assert_allclose(got.row_norms[k], ref.row_norms[k], rtol=1e-12, atol=1e-12)
    assert got.meta["conventions"]["qk_norm"] == ref.meta["conventions"]["qk_norm"] == (
        arch in ("qwen3moe", "gemma3", "minimax-m2"))
    assert ("attention_sinks" in got.meta["gguf"]) == (arch == "gpt-oss")
    assert ("sliding_window" in got.meta["gguf"]) == (arch in ("gpt-oss", "gemma3"))
    # --fold-norm: the file's gain (1 + w where the converter added it) against the fold done by hand
    folded, dense_f = analyze(f, fold_norm=True), dense_sv(model, norm_gains(arch))
    tol = 1e-6 if FAMILIES[arch][1] else 1e-10  # the file holds 1 + w rounded to float32
    for p in ("qk", "ov"):
        assert rel(folded.sv[p], dense_f[p]) < tol, p
    assert rel(folded.sv["qk"], got.sv["qk"]) > 1e-3


def test_gpt_oss_biases_are_listed_not_measured(tmp_path):
    model = build("gpt-oss", tmp_path / "hf")
    f = write(tmp_path / "m.gguf", "gpt-oss", metadata("gpt-oss", model.config), gguf_tensors("gpt-oss", model))
    got = analyze(f)
    ref = analyze(tmp_path / "hf")
    biases = got.meta["conventions"]["biases_present"]
    assert sorted(biases) == sorted(f"blk.0.{r}.bias" for r in ("attn_q", "attn_k", "attn_v", "attn_output"))
    assert len(biases) == len(ref.meta["conventions"]["biases_present"])


def test_q8_0_family_equals_its_dequantized_weights(tmp_path):
    """qwen3moe with Q8_0 attention: exactly the spectra of the dequantized weights (a Hugging Face
    checkpoint holding them is the reference), close to the float model's."""
    model = build("qwen3moe", tmp_path / "hf")
    tensors = gguf_tensors("qwen3moe", model)
    f = write(tmp_path / "m.gguf", "qwen3moe", metadata("qwen3moe", model.config), tensors,
              {k: Q.Q8_0 for k in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")})
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    for t in gguf.GGUFReader(str(f)).tensors:
        if t.tensor_type == Q.Q8_0:
            i, part = t.name.split(".")[1:3]
            hf = {v: k for k, v in _ROLES.items()}[part]
            sd[f"model.layers.{i}.self_attn.{hf}.weight"] = torch.from_numpy(
                np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    (tmp_path / "ref").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "ref" / "model.safetensors")
    (tmp_path / "ref" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    got, ref, orig = analyze(f), analyze(tmp_path / "ref"), analyze(tmp_path / "hf")
    assert got.meta["gguf"]["quantization_types"] == {"Q8_0": 8}
    for p in ("qk", "ov"):
        assert rel(got.sv[p], ref.sv[p]) < 1e-12 and 1e-6 < rel(got.sv[p], orig.sv[p]) < 2e-2, p


# transformers' GGUF loader (an independent inverse of llama.cpp's converter) has no head_dim key for
# these two: their tiny models take the head_dim it assumes
_TF_HEAD_DIM = {"gpt-oss": 64, "nemotron": 16}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_transformers_gguf_loader_reads_back_the_hf_weights(arch, tmp_path):
    """The writer above follows llama.cpp's layout: transformers' own GGUF loader
    (``from_pretrained(gguf_file=)``) turns the file back into the Hugging Face attention weights
    (gpt-oss's sinks aside: that loader does not map ``attn_sinks``)."""
    cfg = FAMILIES[arch][0]()
    if arch in _TF_HEAD_DIM:
        cfg.head_dim = _TF_HEAD_DIM[arch]
    model = build(arch, tmp_path / "hf", cfg=cfg)
    kv = {**metadata(arch, model.config), "context_length": 64, "feed_forward_length": 32, "vocab_size": 101,
          "attention.layer_norm_rms_epsilon": 1e-6, "attention.layer_norm_epsilon": 1e-5, "expert_count": 4,
          "expert_used_count": 2}
    write(tmp_path / "m.gguf", arch, kv, gguf_tensors(arch, model))
    back = tf.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).state_dict()
    mine = {k: v for k, v in model.state_dict().items() if ".self_attn." in k and not k.endswith("sinks")}
    assert mine and all(k in back for k in mine)
    tol = 2e-7 if FAMILIES[arch][1] else 0.0  # Gemma 3's and Nemotron's 1 + w, stored in float32, minus 1
    for k, v in mine.items():
        assert float((back[k] - v).abs().max()) <= tol * max(1.0, float(v.abs().max())), k


def test_unknown_gguf_architecture_is_one_line_exit_2(tmp_path):
    from tests.fuzz.harness import check_outcome, run_cli

    model = build("qwen3moe", tmp_path / "hf")
    f = write(tmp_path / "m.gguf", "rwkv7", metadata("qwen3moe", model.config), gguf_tensors("qwen3moe", model))
    code, _, err = run_cli("spectra", str(f), "--out", str(tmp_path / "out"))
    check_outcome(code, err)
    assert code == 2 and "GGUF architecture 'rwkv7' is not supported" in err and "deepseek2" in err, err
    assert not (tmp_path / "out").exists()
