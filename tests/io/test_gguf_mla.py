"""DeepSeek-V3 (multi-head latent attention) as GGUF ``deepseek2`` files, written from a tiny random
transformers ``deepseek_v3`` model with the gguf package's writer in llama.cpp's layout: attention
tensors as they are (convert_hf_to_gguf.py's DeepseekV2Model permutes nothing), ``kv_b_proj``
either kept as ``attn_kv_b`` (older converters: ``key_length`` = qk_nope + qk_rope per head) or
split into ``attn_k_b`` (per head transposed) and ``attn_v_b`` (newer ones: MQA over the latent,
``head_count_kv`` 1, per-head sizes in ``key_length_mla``/``value_length_mla``). The latent-space
products read from the file must equal headrank's reading of the Hugging Face checkpoint through
the verified ``deepseek_v3`` row (docs/mla.md) and the dense float64 products of its weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from headrank.analysis.scan import analyze  # noqa: E402
from headrank.errors import HeadRankError  # noqa: E402
from tests.io.test_gguf_families import rel, write  # noqa: E402

# distinct sizes, the quantized tensors' rows multiples of Q8_0's 32-value blocks
D, H, NOPE, ROPE, V, KV, QL = 128, 4, 32, 16, 48, 64, 96
_NAMES = {"q_a_proj": "attn_q_a", "q_a_layernorm": "attn_q_a_norm", "q_b_proj": "attn_q_b", "q_proj": "attn_q",
          "kv_a_proj_with_mqa": "attn_kv_a_mqa", "kv_a_layernorm": "attn_kv_a_norm", "o_proj": "attn_output"}


def build(path, q_lora=True, seed=0):
    cfg = tf.DeepseekV3Config(vocab_size=101, hidden_size=D, intermediate_size=64, moe_intermediate_size=32,
                              num_hidden_layers=2, num_attention_heads=H, num_key_value_heads=H, n_shared_experts=1,
                              n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                              first_k_dense_replace=1, kv_lora_rank=KV, q_lora_rank=QL if q_lora else None,
                              qk_rope_head_dim=ROPE, v_head_dim=V, qk_nope_head_dim=NOPE)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    return model


def split_kv_b(w):
    """convert_hf_to_gguf.py's split: per head, W_UK,h transposed (H, kv, nope) and W_UV,h (H, v, kv)."""
    kv_b = w.reshape(H, NOPE + V, KV)
    return np.ascontiguousarray(kv_b[:, :NOPE].transpose(0, 2, 1)), np.ascontiguousarray(kv_b[:, NOPE:])


def gguf_tensors(model, split):
    out = {}
    for name, t in model.state_dict().items():
        parts = name.split(".")
        if parts[:2] != ["model", "layers"]:
            continue
        i, rest, arr = parts[2], parts[3:], t.detach().float().contiguous().numpy()
        if rest[0] == "self_attn" and rest[1] in _NAMES:
            out[f"blk.{i}.{_NAMES[rest[1]]}.weight"] = arr
        elif rest[:2] == ["self_attn", "kv_b_proj"]:
            if split:
                out[f"blk.{i}.attn_k_b.weight"], out[f"blk.{i}.attn_v_b.weight"] = split_kv_b(arr)
            else:
                out[f"blk.{i}.attn_kv_b.weight"] = arr
        elif rest[0] == "input_layernorm":
            out[f"blk.{i}.attn_norm.weight"] = arr
    return out


def metadata(q_lora, split):
    kv = {"block_count": 2, "embedding_length": D, "attention.head_count": H, "attention.kv_lora_rank": KV,
          "rope.dimension_count": ROPE, "rope.freq_base": 10000.0}
    if q_lora:
        kv["attention.q_lora_rank"] = QL
    if split:  # llama.cpp's MLA cache: MQA over the latent; the per-head sizes in the *_mla keys
        kv.update({"attention.head_count_kv": 1, "attention.key_length": KV + ROPE, "attention.value_length": KV,
                   "attention.key_length_mla": NOPE + ROPE, "attention.value_length_mla": V})
    else:
        kv.update({"attention.head_count_kv": H, "attention.key_length": NOPE + ROPE, "attention.value_length": V})
    return kv


def dense_sv(model, fold=False):
    """The latent products of docs/mla.md from the Hugging Face weights in float64: per head
    W_UK,hᵀ W_UQ,h (rank <= qk_nope_head_dim) and P_h W_UV,h (rank <= v_head_dim)."""
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    out = {"qk": [], "ov": []}
    for i in range(2):
        a = f"model.layers.{i}.self_attn."
        q = sd[a + "q_b_proj.weight"] if a + "q_b_proj.weight" in sd else sd[a + "q_proj.weight"]
        q = q.reshape(H, NOPE + ROPE, -1)[:, :NOPE]
        kv_b = sd[a + "kv_b_proj.weight"].reshape(H, NOPE + V, KV)
        if fold:
            q = q * sd[a + "q_a_layernorm.weight"] if a + "q_a_layernorm.weight" in sd else q
            kv_b = kv_b * sd[a + "kv_a_layernorm.weight"]
        p = sd[a + "o_proj.weight"].reshape(D, H, V)
        out["qk"].append([np.linalg.svd(kv_b[h, :NOPE].T @ q[h], compute_uv=False)[:NOPE] for h in range(H)])
        out["ov"].append([np.linalg.svd(p[:, h] @ kv_b[h, NOPE:], compute_uv=False)[:V] for h in range(H)])
    return {k: np.array(v) for k, v in out.items()}


@pytest.mark.parametrize("q_lora", [True, False], ids=["q_lora", "no_q_lora"])
@pytest.mark.parametrize("split", [True, False], ids=["k_b_v_b", "kv_b"])
def test_deepseek2_latent_products_match_hf_and_dense(q_lora, split, tmp_path):
    model = build(tmp_path / "hf", q_lora)
    f = write(tmp_path / "m.gguf", "deepseek2", metadata(q_lora, split), gguf_tensors(model, split))
    ref, got, dense = analyze(tmp_path / "hf"), analyze(f), dense_sv(model)
    assert got.meta["layout"]["split"] == ref.meta["layout"]["split"] == "mla"
    assert got.sv["qk"].shape[-1] == NOPE and got.sv["ov"].shape[-1] == V  # ranks <= qk_nope_head_dim, v_head_dim
    for p in ("qk", "ov"):
        assert rel(got.sv[p], ref.sv[p]) < 1e-12 and rel(got.sv[p], dense[p]) < 1e-10, p
    for k in ("n_layers", "d_model", "n_heads", "head_dim"):
        assert got.meta["config"][k] == ref.meta["config"][k], k
    cols = ["rank", "effective_rank", "nuclear", "frob", "frob_bound", "balance"]
    np.testing.assert_allclose(got.table[cols].to_numpy(float), ref.table[cols].to_numpy(float), rtol=1e-10)
    assert ("joined" in got.meta["gguf"]["mla"]) == split
    assert got.meta["gguf"]["quantization_types"] == {"F32": 2 * (4 if split else 3)}
    # --fold-norm: attn_q_a_norm and attn_kv_a_norm as q_a_layernorm and kv_a_layernorm
    gf, rf, df = analyze(f, fold_norm=True), analyze(tmp_path / "hf", fold_norm=True), dense_sv(model, fold=True)
    for p in ("qk", "ov"):
        assert rel(gf.sv[p], rf.sv[p]) < 1e-12 and rel(gf.sv[p], df[p]) < 1e-10, p
    assert rel(gf.sv["ov"], got.sv["ov"]) > 1e-3


def test_deepseek2_q8_0_equals_its_dequantized_weights(tmp_path):
    """Q8_0 attn_q_b, attn_k_b, attn_v_b and attn_output: the spectra of exactly the dequantized
    weights (a Hugging Face checkpoint holding them, attn_k_b/attn_v_b joined back by hand)."""
    model = build(tmp_path / "hf")
    tensors = gguf_tensors(model, split=True)
    quant = ("attn_q_b.weight", "attn_k_b.weight", "attn_v_b.weight", "attn_output.weight")
    f = write(tmp_path / "m.gguf", "deepseek2", metadata(True, True), tensors, {k: Q.Q8_0 for k in quant})
    back = {t.name: np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            for t in gguf.GGUFReader(str(f)).tensors if t.tensor_type == Q.Q8_0}
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    for i in range(2):
        a, b = f"model.layers.{i}.self_attn.", f"blk.{i}."
        k_b, v_b = back[b + "attn_k_b.weight"], back[b + "attn_v_b.weight"]
        kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1).reshape(H * (NOPE + V), KV)
        for hf, w in (("q_b_proj", back[b + "attn_q_b.weight"]), ("kv_b_proj", kv_b),
                      ("o_proj", back[b + "attn_output.weight"])):
            sd[a + hf + ".weight"] = torch.from_numpy(np.ascontiguousarray(w))
    (tmp_path / "ref").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "ref" / "model.safetensors")
    (tmp_path / "ref" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    got, ref, orig = analyze(f), analyze(tmp_path / "ref"), analyze(tmp_path / "hf")
    assert got.meta["gguf"]["quantization_types"] == {"Q8_0": 8}
    assert got.meta["dtype_read"] == ["Q8_0"]
    for p in ("qk", "ov"):
        assert rel(got.sv[p], ref.sv[p]) < 1e-12 and 1e-6 < rel(got.sv[p], orig.sv[p]) < 2e-2, p


@pytest.mark.parametrize("change, needle", [
    ("no_kv_lora_rank", "metadata lacks deepseek2.attention.kv_lora_rank"),
    ("k_b_shape", "attn_k_b (4, 64, 32) and attn_v_b (4, 48, 72)"),
    ("no_kv_b", "no attention tensor blk.0.attn_kv_b.weight"),
    ("rope_too_wide", "leaves no non-rotary part"),
])
def test_deepseek2_bad_files_are_one_line(change, needle, tmp_path):
    from tests.fuzz.harness import check_outcome, run_cli

    model = build(tmp_path / "hf")
    tensors, kv = gguf_tensors(model, split=True), metadata(True, True)
    if change == "no_kv_lora_rank":
        del kv["attention.kv_lora_rank"]
    elif change == "k_b_shape":  # a v_b of the wrong latent width
        for i in range(2):
            tensors[f"blk.{i}.attn_v_b.weight"] = np.zeros((H, V, KV + 8), np.float32)
    elif change == "no_kv_b":
        for i in range(2):
            del tensors[f"blk.{i}.attn_k_b.weight"]
    else:
        kv["rope.dimension_count"] = NOPE + ROPE
    f = write(tmp_path / "bad file.gguf", "deepseek2", kv, tensors)
    with pytest.raises(HeadRankError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        analyze(f)
    code, _, err = run_cli("spectra", str(f))
    check_outcome(code, err)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_deepseek2_over_http_reads_only_the_latent_projections(tmp_path, monkeypatch):
    """``--remote`` on a URL of a deepseek2 file: the same products as the local file, and only the
    layout's tensors (attn_q_b, attn_k_b, attn_v_b, attn_output) fetched after the header."""
    from headrank.io import remote
    from tests.io.hubserver import HubServer

    model = build(tmp_path / "hf")
    quant = {k: Q.Q8_0 for k in ("attn_q_b.weight", "attn_k_b.weight", "attn_v_b.weight", "attn_output.weight")}
    f = write(tmp_path / "m.gguf", "deepseek2", metadata(True, True), gguf_tensors(model, split=True), quant)
    import huggingface_hub.constants as hc

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)  # (conftest set it before huggingface_hub was imported)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    with HubServer(root=tmp_path) as srv:
        got = analyze(f"{srv.url}/files/m.gguf")
    local = analyze(f)
    for p in ("qk", "ov"):
        np.testing.assert_array_equal(got.sv[p], local.sv[p])
    wanted = ("attn_q_b.weight", "attn_k_b.weight", "attn_v_b.weight", "attn_output.weight")
    r = gguf.GGUFReader(str(f))
    assert got.meta["remote"]["tensor_bytes"] == sum(t.n_bytes for t in r.tensors if t.name.endswith(wanted))
    assert got.meta["input"] == "remote" and got.meta["gguf"]["quantization_types"] == {"Q8_0": 8}
