"""GGUF files written with the ``gguf`` package's own writer from small random transformers
models, the way llama.cpp's converter lays them out (Q/K row permutation for llama, fused
``[q | k | v]`` for Phi-3, Falcon and GPT-2, GPT-2's Conv1D transposed, Gemma's norm stored as
1 + w), read back by headrank and compared with the spectra of the Hugging Face checkpoint."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import torch
import transformers as tf

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from headrank.analysis.scan import analyze  # noqa: E402
from headrank.errors import HeadRankError  # noqa: E402
from headrank.io import gguf as ag  # noqa: E402
from tests.helpers import write_gguf_tensors  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101)
# name: (config, model class, gguf architecture)
ARCHS = {
    "llama": (lambda: tf.LlamaConfig(**SMALL, num_key_value_heads=2), tf.LlamaModel, "llama"),
    "qwen2": (lambda: tf.Qwen2Config(**SMALL, num_key_value_heads=2), tf.Qwen2Model, "qwen2"),
    "qwen3": (lambda: tf.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16), tf.Qwen3Model, "qwen3"),
    "gemma": (lambda: tf.GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=24), tf.GemmaModel, "gemma"),
    "gemma2": (lambda: tf.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=16), tf.Gemma2Model, "gemma2"),
    "phi3": (lambda: tf.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0), tf.Phi3Model, "phi3"),
    "falcon": (lambda: tf.FalconConfig(**SMALL, new_decoder_architecture=True, num_kv_heads=2), tf.FalconModel,
               "falcon"),
    "gpt2": (lambda: tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32), tf.GPT2Model,
             "gpt2"),
    "starcoder2": (lambda: tf.Starcoder2Config(**SMALL, num_key_value_heads=2), tf.Starcoder2Model, "starcoder2"),
}


def build_hf(name, path, seed=0, cfg=None):
    make_cfg, cls, _ = ARCHS[name]
    torch.manual_seed(seed)
    model = cls(cfg or make_cfg()).eval()
    with torch.no_grad():  # non-trivial norm gains, so --fold-norm is tested too
        for pname, p in model.named_parameters():
            if "norm" in pname or "ln_" in pname:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


def _sizes(cfg):
    c = cfg.to_dict()
    d = c.get("hidden_size") or c["n_embd"]
    H = c.get("num_attention_heads") or c["n_head"]
    L = c.get("num_hidden_layers") or c["n_layer"]
    Hkv = c.get("num_key_value_heads") or c.get("num_kv_heads") or H
    if c["model_type"] == "falcon" and not c.get("new_decoder_architecture"):
        Hkv = 1 if c.get("multi_query", True) else H
    return L, d, H, Hkv, c.get("head_dim") or d // H


def hf_to_gguf_tensors(name, model):
    """{gguf name: float32 array} the way convert_hf_to_gguf.py writes attention (+ attn_norm)."""
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    L, d, H, Hkv, dh = _sizes(model.config)
    out = {}
    for i in range(L):
        if name == "phi3":
            out[f"blk.{i}.attn_qkv.weight"] = sd[f"layers.{i}.self_attn.qkv_proj.weight"]
            out[f"blk.{i}.attn_output.weight"] = sd[f"layers.{i}.self_attn.o_proj.weight"]
            norm = sd[f"layers.{i}.input_layernorm.weight"]
        elif name == "falcon":  # per-kv-group rows → [q | k | v] (FalconModel.modify_tensors)
            g = H // Hkv
            w = sd[f"h.{i}.self_attention.query_key_value.weight"].view(Hkv, g + 2, dh, d)
            out[f"blk.{i}.attn_qkv.weight"] = torch.cat([w[:, :g].reshape(-1, d), w[:, g].reshape(-1, d),
                                                         w[:, g + 1].reshape(-1, d)])
            out[f"blk.{i}.attn_output.weight"] = sd[f"h.{i}.self_attention.dense.weight"]
            norm = sd[f"h.{i}.ln_attn.weight"]
        elif name == "gpt2":  # Conv1D (in, out) → Linear (out, in)
            out[f"blk.{i}.attn_qkv.weight"] = sd[f"h.{i}.attn.c_attn.weight"].T
            out[f"blk.{i}.attn_output.weight"] = sd[f"h.{i}.attn.c_proj.weight"].T
            norm = sd[f"h.{i}.ln_1.weight"]
        else:
            pre = f"layers.{i}.self_attn."
            q, k = sd[pre + "q_proj.weight"], sd[pre + "k_proj.weight"]
            if name == "llama":
                q, k = ag.permute_rotary(q, H), ag.permute_rotary(k, Hkv)
            out.update({f"blk.{i}.attn_q.weight": q, f"blk.{i}.attn_k.weight": k,
                        f"blk.{i}.attn_v.weight": sd[pre + "v_proj.weight"],
                        f"blk.{i}.attn_output.weight": sd[pre + "o_proj.weight"]})
            if name == "qwen3":
                out[f"blk.{i}.attn_q_norm.weight"] = sd[pre + "q_norm.weight"]
            norm = sd[f"layers.{i}.input_layernorm.weight"]
        out[f"blk.{i}.attn_norm.weight"] = norm + 1 if name.startswith("gemma") else norm
    return {k: v.contiguous().numpy() for k, v in out.items()}


def write_gguf(path, arch, model, tensors, qtypes=None, *, key_length=True, raw=None):
    """Write with gguf's GGUFWriter; ``qtypes``: {gguf name suffix: type} quantized by gguf;
    ``raw``: {gguf name: (uint8 blocks, type)} written as they are."""
    L, d, H, Hkv, dh = _sizes(model.config)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(L)
    w.add_embedding_length(d)
    w.add_head_count(H)
    if arch != "gpt2":  # GPT-2's converter writes no head_count_kv: headrank defaults it to head_count
        w.add_head_count_kv(Hkv)
    if key_length:
        w.add_key_length(dh)
        w.add_value_length(dh)
    write_gguf_tensors(w, tensors, qtypes, raw)
    return path


def max_rel_err(a, b):
    """Largest |a − b| over the largest |b|, per product, maximised over products."""
    return max(float(np.abs(a.sv[p] - b.sv[p]).max() / np.abs(b.sv[p]).max()) for p in ("qk", "ov"))


@pytest.mark.parametrize("name", list(ARCHS))
def test_gguf_f32_matches_hf_checkpoint(name, tmp_path):
    assert name in ag.TESTED
    model = build_hf(name, tmp_path / "hf")
    f = write_gguf(tmp_path / "m.gguf", ARCHS[name][2], model, hf_to_gguf_tensors(name, model),
                   key_length=name not in ("gpt2", "falcon"))
    ref, got = analyze(tmp_path / "hf"), analyze(f)
    assert got.meta["input"] == "gguf" and got.meta["gguf"]["architecture"] == ARCHS[name][2]
    assert got.meta["gguf"]["quantization_types"] == {"F32": 2 * len(got.meta["layout"]["tensors"])}
    for k in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim"):
        assert got.meta["config"][k] == ref.meta["config"][k], k
    assert max_rel_err(got, ref) < 1e-12
    for k in ref.row_norms:  # llama's permutation undone: even per-dimension row norms line up
        np.testing.assert_allclose(got.row_norms[k], ref.row_norms[k], rtol=1e-12, atol=1e-12)
    assert got.meta["conventions"]["qk_norm"] == (name == "qwen3")
    # the folded norm too (Gemma's 1 + w is stored by the converter; falcon reads ln_attn)
    ff, rf = analyze(f, fold_norm=True), analyze(tmp_path / "hf", fold_norm=True)
    tol = 1e-6 if name.startswith("gemma") else 1e-12  # the file holds 1 + w rounded to float32
    assert max_rel_err(ff, rf) < tol and max_rel_err(ff, got) > 1e-3


def test_llama_rotary_permutation_leaves_qk_spectra_unchanged(tmp_path, monkeypatch):
    """Read llama's permuted rows as they are: QK and OV spectra unchanged, row norms permuted."""
    model = build_hf("llama", tmp_path / "hf")
    f = write_gguf(tmp_path / "m.gguf", "llama", model, hf_to_gguf_tensors("llama", model))
    monkeypatch.setitem(ag.ARCHS, "llama", ag.Arch("rotary", "rmsnorm", rotary_permuted=False))
    ref, got = analyze(tmp_path / "hf"), analyze(f)
    assert max_rel_err(got, ref) < 1e-12
    assert not np.allclose(got.row_norms["q"], ref.row_norms["q"])  # the permutation did act


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q5_1, Q.Q4_0])
def test_gguf_quantized_equals_dequantized_reference(qtype, tmp_path):
    """Quantized attention tensors: spectra of exactly the dequantized weights (a safetensors
    checkpoint holding them is the reference), and close to the float model's."""
    model = build_hf("llama", tmp_path / "hf")
    tensors = hf_to_gguf_tensors("llama", model)
    f = write_gguf(tmp_path / "m.gguf", "llama", model, tensors, {".weight": qtype})
    back = gguf.GGUFReader(str(f))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    H, Hkv = 4, 2
    for t in back.tensors:
        if t.name.endswith("attn_norm.weight"):
            continue
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        i, part = t.name.split(".")[1], t.name.split(".")[2]
        hf = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj"}[part]
        if part in ("attn_q", "attn_k"):
            w = ag.unpermute_rotary(w, H if part == "attn_q" else Hkv)
        sd[f"layers.{i}.self_attn.{hf}.weight"] = w
    (tmp_path / "ref").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "ref" / "model.safetensors")
    (tmp_path / "ref" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    got, ref, orig = analyze(f), analyze(tmp_path / "ref"), analyze(tmp_path / "hf")
    assert got.meta["gguf"]["quantization_types"] == {qtype.name: 8}
    assert got.meta["dtype_read"] == [qtype.name]
    assert max_rel_err(got, ref) < 1e-12
    assert max_rel_err(got, orig) < {Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 2e-2, Q.Q5_1: 0.1, Q.Q4_0: 0.2}[qtype]


K_QUANTS = {Q.Q4_K: [(0, 2), (2, 4)], Q.Q6_K: [(208, 210)]}  # byte ranges of the f16 super-block scales


@pytest.mark.parametrize("qtype", list(K_QUANTS))
def test_gguf_k_quants_dequantize(qtype, tmp_path):
    """gguf cannot write K-quants: random super-blocks (with sane f16 scales) stand in for v."""
    cfg = tf.LlamaConfig(**{**SMALL, "hidden_size": 256}, num_key_value_heads=2)
    model = build_hf("llama", tmp_path / "hf", cfg=cfg)
    tensors = hf_to_gguf_tensors("llama", model)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    raw, sd = {}, {k: v.clone() for k, v in model.state_dict().items()}
    for i in range(2):
        rows = tensors[f"blk.{i}.attn_v.weight"].shape[0]
        b = rng.integers(0, 256, size=(rows, 256 // block * size), dtype=np.uint8)
        for lo, hi in K_QUANTS[qtype]:
            b[:, lo:hi] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
        raw[f"blk.{i}.attn_v.weight"] = (b, qtype)
        sd[f"layers.{i}.self_attn.v_proj.weight"] = torch.from_numpy(
            np.array(gguf.quants.dequantize(b, qtype), dtype=np.float32))
    f = write_gguf(tmp_path / "m.gguf", "llama", model, tensors, raw=raw)
    (tmp_path / "ref").mkdir()
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "ref" / "model.safetensors")
    (tmp_path / "ref" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    got, ref = analyze(f), analyze(tmp_path / "ref")
    assert got.meta["gguf"]["quantization_types"] == {"F32": 6, qtype.name: 2}
    assert max_rel_err(got, ref) < 1e-12


def test_gguf_streams_one_layer_at_a_time(tmp_path, monkeypatch):
    model = build_hf("qwen2", tmp_path / "hf")
    f = write_gguf(tmp_path / "m.gguf", "qwen2", model, hf_to_gguf_tensors("qwen2", model))
    seen: list[str] = []
    orig = ag.GGUFCheckpoint.get
    monkeypatch.setattr(ag.GGUFCheckpoint, "get", lambda self, n: seen.append(n) or orig(self, n))
    analyze(f, layers="1")
    assert seen and all(n.startswith("blk.1.") for n in seen)


# -- bad input -------------------------------------------------------------------------------
def test_corrupt_header(tmp_path):
    f = tmp_path / "bad.gguf"
    f.write_bytes(b"GGUX" + bytes(64))
    with pytest.raises(HeadRankError, match="cannot read GGUF file"):
        analyze(f)
    f.write_bytes(b"GGUF" + bytes(3))  # truncated right after the magic
    with pytest.raises(HeadRankError, match="cannot read GGUF file"):
        analyze(f)


def test_unknown_architecture(tmp_path):
    model = build_hf("llama", tmp_path / "hf")
    f = write_gguf(tmp_path / "m.gguf", "mamba", model, hf_to_gguf_tensors("qwen2", model))
    with pytest.raises(HeadRankError, match="architecture 'mamba' is not supported"):
        analyze(f)


def test_unsupported_quantization(tmp_path):
    model = build_hf("qwen2", tmp_path / "hf")
    tensors = hf_to_gguf_tensors("qwen2", model)
    block, size = gguf.GGML_QUANT_SIZES[Q.Q8_1]
    raw = {"blk.1.attn_k.weight": (np.zeros((32, 64 // block * size), np.uint8), Q.Q8_1)}
    f = write_gguf(tmp_path / "m.gguf", "qwen2", model, tensors, raw=raw)
    with pytest.raises(HeadRankError, match="quantization type Q8_1"):
        analyze(f)


def test_cli_bad_gguf_exit_2_nothing_written(tmp_path):
    from typer.testing import CliRunner

    from headrank.cli import app

    f = tmp_path / "bad.gguf"
    f.write_bytes(b"not a gguf at all")
    res = CliRunner().invoke(app, ["spectra", str(f), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "cannot read GGUF file" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


# -- hostile files: every cause one line, before gguf allocates (issue 27) ----------------------
def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def raw_gguf(kvs: list[bytes], n_kv: int | None = None, n_tensors: int = 0, tail: bytes = b"") -> bytes:
    """A GGUF v3 file from raw metadata entries (key string, u32 type, value)."""
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + tail


def kv_str(key: str, value: bytes) -> bytes:
    return _s(key.encode()) + struct.pack("<I", 8) + _s(value)


def kv_array(key: str, etype: int, count: int, payload: bytes = b"") -> bytes:
    return _s(key.encode()) + struct.pack("<IIQ", 9, etype, count) + payload


ARCH = kv_str("general.architecture", b"llama")


@pytest.mark.parametrize("data, needle", [
    (raw_gguf([ARCH, kv_array("x.arr", 4, 2**62)]), "declares 4611686018427387904 values"),  # 120-odd bytes
    (raw_gguf([ARCH, kv_array("x.arr", 4, 10**8, bytes(16))]), "declares 100000000 values"),
    (raw_gguf([ARCH, kv_array("x.strs", 8, 10**9)]), "declares 1000000000 values"),
    (raw_gguf([ARCH, _s(b"x.s") + struct.pack("<IQ", 8, 2**60) + b"abc"]), "needs 1152921504606846976 bytes"),
    (raw_gguf([ARCH], n_kv=2**40), "metadata entries"),
    (raw_gguf([ARCH], n_tensors=2**50), "tensors cannot fit"),
    (raw_gguf([kv_str("general.architecture", b"ll\xffama")]), "general.architecture is not UTF-8"),
    (raw_gguf([ARCH, kv_str("general.name", b"\xc3\x28")]), "general.name is not UTF-8"),
    (raw_gguf([ARCH, _s(b"x.t") + struct.pack("<I", 77)]), "unknown value type 77"),
    (raw_gguf([ARCH, kv_array("x.arr", 9, 1, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) + bytes(4))]),
     "unknown value type 9"),  # arrays nested deeper than two levels
    (raw_gguf([ARCH], n_tensors=1, tail=_s(b"blk.0.attn_q.weight") + struct.pack("<I", 9) + bytes(100)),
     "has 9 dimensions"),
    (raw_gguf([ARCH], n_tensors=1, tail=_s(b"w") + struct.pack("<IQQ", 2, 0, 4) + bytes(20)), "has shape [0, 4]"),
    (b"GGUF\x03\x00", "too short"),
])
def test_hostile_metadata_is_one_line(tmp_path, data, needle):
    f = tmp_path / "bad.gguf"
    f.write_bytes(data)
    with pytest.raises(HeadRankError, match=re.escape(needle)):
        analyze(f)


def test_a_file_ending_inside_its_last_metadata_value(tmp_path):
    model = build_hf("qwen2", tmp_path / "hf")
    w = gguf.GGUFWriter(str(tmp_path / "full.gguf"), "qwen2")
    w.add_block_count(2)
    w.add_string("general.name", "a rather long model name")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    data = (tmp_path / "full.gguf").read_bytes()
    assert model is not None
    for cut in (3, 1):
        (tmp_path / "cut.gguf").write_bytes(data[:-cut])
        with pytest.raises(HeadRankError, match="cannot read GGUF file .*truncated or corrupt"):
            analyze(tmp_path / "cut.gguf")


@pytest.mark.parametrize("rows, heads", [(15, 4), (12, 4), (16, 65536), (16, 0)])
def test_unpermute_rotary_checks_the_shape_first(rows, heads):
    with pytest.raises(HeadRankError, match=rf"blk.0.attn_q.weight has shape \({rows}, 8\)"):
        ag.unpermute_rotary(torch.zeros(rows, 8), heads, "blk.0.attn_q.weight")
    w = torch.randn(16, 8)
    assert torch.equal(ag.unpermute_rotary(ag.permute_rotary(w, 4), 4), w)


@pytest.mark.parametrize("change", ["rows", "head_dim", "head_count"])
def test_llama_file_with_a_wrong_q_shape_is_one_line(tmp_path, change):
    """A 15-row attn_q, head_dim 3 (odd: no rotary pairs) or head_count 65536, through the CLI."""
    from tests.fuzz.harness import check_outcome, run_cli

    d, H, Hkv, dh = 64, 4, 2, {"rows": 16, "head_dim": 3, "head_count": 16}[change]
    heads = 65536 if change == "head_count" else H
    g = torch.Generator().manual_seed(0)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    for add, v in ((w.add_block_count, 1), (w.add_embedding_length, d), (w.add_head_count, heads),
                   (w.add_head_count_kv, Hkv), (w.add_key_length, dh), (w.add_value_length, dh)):
        add(v)
    shapes = {"attn_q": (15 if change == "rows" else H * dh, d), "attn_k": (Hkv * dh, d), "attn_v": (Hkv * dh, d),
              "attn_output": (d, H * dh)}
    for n, shape in shapes.items():
        w.add_tensor(f"blk.0.{n}.weight", torch.randn(*shape, generator=g).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    code, _, err = run_cli("spectra", str(tmp_path / "m.gguf"))
    check_outcome(code, err)
    assert code == 2 and "blk.0.attn_q.weight" in err and "rotary heads of an even head dimension" in err, err
