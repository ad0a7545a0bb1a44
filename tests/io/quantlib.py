"""Quantized checkpoints written for the tests of the scheme layer (headrank.io.schemes).

Each writer quantizes a tiny random transformers model with its own float64 reference: FP8
codes from ``torch.float8_e4m3fn`` casts and explicit per-block (or per-row) float32 scales,
following the published formats (DeepSeek-V3's ``weight_scale_inv`` per 128 × 128 block in
its ``inference/kernel.py`` ``weight_dequant``, ragged edges as partial blocks; fbgemm's
``weight_scale`` per output row). ``reference`` is the dequantized state dict, each block
multiplied out one at a time in a Python loop (a different computation from the library's
vectorised one), written beside as an unquantized float64 checkpoint."""

from __future__ import annotations

import json
import math

import numpy as np
import torch
import transformers as tf
from safetensors.torch import save_file

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def llama(hidden=72, heads=4, kv=2, layers=2, seed=0):
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=80, vocab_size=101)
    return tf.LlamaForCausalLM(cfg).eval()


def block_quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn, scale_inv float32 of shape ⌈r/b⌉ × ⌈c/b⌉): each block's amax maps to 448."""
    r, c = w.shape
    br, bc = block
    R, C = math.ceil(r / br), math.ceil(c / bc)
    scale = torch.empty(R, C, dtype=torch.float32)
    codes = torch.empty(r, c, dtype=torch.float8_e4m3fn)
    for i in range(R):
        for j in range(C):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].double()
            s = torch.tensor(float(blk.abs().max()) / FP8_MAX, dtype=torch.float32)
            scale[i, j] = s
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = (blk / float(s)).clamp(-FP8_MAX, FP8_MAX).to(
                torch.float8_e4m3fn)
    return codes, scale


def block_dequantize(codes: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> np.ndarray:
    """The reference: every element code × its block's scale in float64, block by block."""
    r, c = codes.shape
    br, bc = block
    out = np.empty((r, c), dtype=np.float64)
    q = codes.to(torch.float64).numpy()
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = q[i * br:(i + 1) * br, j * bc:(j + 1) * bc] * \
                float(scale[i, j])
    return out


def quantized(name: str) -> bool:
    return name.endswith(".weight") and ("self_attn." in name or ".mlp." in name)


def write_fp8_blocks(model, path, block=(32, 32), per_tensor=False) -> dict[str, np.ndarray]:
    """``model`` written as an FP8 block checkpoint (``quant_method: fp8``); its reference weights."""
    path.mkdir(parents=True, exist_ok=True)
    out, ref = {}, {}
    for n, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        if quantized(n):
            b = tuple(t.shape) if per_tensor else block
            codes, s = block_quantize(t, b)
            out[n], out[n + "_scale_inv"] = codes, (s.reshape(()) if per_tensor else s)
            ref[n] = block_dequantize(codes, s, b)
        else:
            out[n] = t
            ref[n] = t.double().numpy()
    save_file(out, str(path / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  **({} if per_tensor else {"weight_block_size": list(block)})}
    (path / "config.json").write_text(json.dumps(cfg))
    return ref


def write_fp8_rows(model, path) -> dict[str, np.ndarray]:
    """``model`` as fbgemm_fp8 (one float32 ``weight_scale`` per output row, shape (out, 1))."""
    path.mkdir(parents=True, exist_ok=True)
    out, ref = {}, {}
    for n, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        if quantized(n):
            codes, s = block_quantize(t, (1, t.shape[1]))
            out[n], out[n.replace(".weight", ".weight_scale")] = codes, s
            ref[n] = block_dequantize(codes, s, (1, t.shape[1]))
        else:
            out[n], ref[n] = t, t.double().numpy()
    save_file(out, str(path / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}
    (path / "config.json").write_text(json.dumps(cfg))
    return ref


def write_dense(model, ref: dict[str, np.ndarray], path) -> None:
    """The reference weights as an unquantized float64 checkpoint of the same model."""
    path.mkdir(parents=True, exist_ok=True)
    save_file({n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in ref.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(model.config.to_dict()))


def head_spectra(ref: dict[str, np.ndarray], layer: int, heads: int, kv: int, dh: int) -> dict[str, np.ndarray]:
    """Dense float64 SVD of every head's W_K,hᵀ W_Q,h and P_h W_V,h from the reference weights."""
    p = f"model.layers.{layer}.self_attn."
    wq, wk, wv, wo = (ref[p + f"{x}_proj.weight"] for x in "qkvo")
    g = heads // kv
    out = {"qk": [], "ov": []}
    for h in range(heads):
        q, k = wq[h * dh:(h + 1) * dh], wk[(h // g) * dh:(h // g + 1) * dh]
        v, o = wv[(h // g) * dh:(h // g + 1) * dh], wo[:, h * dh:(h + 1) * dh]
        out["qk"].append(np.linalg.svd(k.T @ q, compute_uv=False)[:dh])
        out["ov"].append(np.linalg.svd(o @ v, compute_uv=False)[:dh])
    return {k: np.array(v) for k, v in out.items()}


# -- DeepSeek-V3-shaped: MLA, FP8 blocks, MoE experts stored per expert, many shards ----------------
MLA = dict(D=128, H=4, NOPE=32, ROPE=16, V=48, KV=64, QL=96, LAYERS=3, EXPERTS=8)


def deepseek(seed=0):
    m = MLA
    cfg = tf.DeepseekV3Config(vocab_size=101, hidden_size=m["D"], intermediate_size=64, moe_intermediate_size=32,
                              num_hidden_layers=m["LAYERS"], num_attention_heads=m["H"], num_key_value_heads=m["H"],
                              n_shared_experts=1, n_routed_experts=m["EXPERTS"], num_experts_per_tok=2, n_group=1,
                              topk_group=1, first_k_dense_replace=1, kv_lora_rank=m["KV"], q_lora_rank=m["QL"],
                              qk_rope_head_dim=m["ROPE"], v_head_dim=m["V"], qk_nope_head_dim=m["NOPE"])
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def _deepseek_names(model) -> dict[str, torch.Tensor]:
    """The state dict under DeepSeek-V3's own names: routed experts one module each."""
    out = {}
    for n, t in model.state_dict().items():
        t = t.detach().float().contiguous()
        if n.endswith("mlp.experts.gate_up_proj"):
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[n.replace("gate_up_proj", f"{e}.gate_proj.weight")] = t[e, :half].contiguous()
                out[n.replace("gate_up_proj", f"{e}.up_proj.weight")] = t[e, half:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                out[n.replace("down_proj", f"{e}.down_proj.weight")] = t[e].contiguous()
        else:
            out[n] = t
    return out


def write_deepseek_fp8(model, path, block=(64, 64)) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``model`` as DeepSeek-V3 stores it: every Linear weight of the layers in FP8 blocks (norms,
    router gate, embeddings, head in float32), one shard per module (> 64 shards) and an index;
    returns the reference weights and the weight map."""
    path.mkdir(parents=True, exist_ok=True)
    ref, shards = {}, {}
    for n, t in _deepseek_names(model).items():
        module = n.rsplit(".", 1)[0]
        if ".layers." in n and n.endswith("proj.weight"):
            codes, s = block_quantize(t, block)
            shards.setdefault(module, {})[n] = codes
            shards[module][n + "_scale_inv"] = s
            ref[n] = block_dequantize(codes, s, block)
        else:
            shards.setdefault(module, {})[n] = t
            ref[n] = t.double().numpy()
    weight_map, total = {}, 0
    for k, (_, tensors) in enumerate(sorted(shards.items())):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(path / fname))
        for n, t in tensors.items():
            weight_map[n] = fname
            total += t.numel() * t.element_size()
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    cfg = model.config.to_dict()
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (path / "config.json").write_text(json.dumps(cfg))
    return ref, weight_map


def mla_spectra(ref: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
    """Dense float64 SVD of each head's latent-space products (docs/mla.md): QK = W_K,hᵀ W_Q,h with W_Q,h
    the head's non-rotary rows of q_b_proj and W_K,h its key rows of kv_b_proj; OV = W_o[:, h] W_V,h."""
    m = MLA
    p = f"model.layers.{layer}.self_attn."
    qb, kvb, wo = ref[p + "q_b_proj.weight"], ref[p + "kv_b_proj.weight"], ref[p + "o_proj.weight"]
    nope, rope, v = m["NOPE"], m["ROPE"], m["V"]
    out = {"qk": [], "ov": []}
    for h in range(m["H"]):
        q = qb[h * (nope + rope):h * (nope + rope) + nope]
        k = kvb[h * (nope + v):h * (nope + v) + nope]
        wv = kvb[h * (nope + v) + nope:(h + 1) * (nope + v)]
        out["qk"].append(np.linalg.svd(k.T @ q, compute_uv=False)[:nope])
        out["ov"].append(np.linalg.svd(wo[:, h * v:(h + 1) * v] @ wv, compute_uv=False)[:v])
    return out


def each_refused(tmp_path, tensors, cfg, cases) -> None:
    """Each case ``name: (edit(tensors, config), needle)`` applied to a fresh copy of a quantized
    checkpoint's tensors and config, written and analyzed: one HeadRankError line naming ``needle``."""
    import pytest

    from headrank.analysis.scan import analyze
    from headrank.errors import HeadRankError

    for case, (edit, needle) in cases.items():
        tt, cc = {k: v.clone() for k, v in tensors.items()}, json.loads(json.dumps(cfg))
        edit(tt, cc)
        d = tmp_path / case.replace(" ", "-")
        d.mkdir()
        save_file(tt, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(cc))
        with pytest.raises(HeadRankError) as e:
            analyze(d)
        assert needle in str(e.value) and "\n" not in str(e.value), (case, str(e.value))
