"""Deterministic tiny checkpoints for the precision tests: weights from a seeded numpy generator
(not transformers' initialisation, which may change between versions), written with safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: a grouped-query Llama: 2 layers, d 64, 4 query heads, 2 kv heads, dh 16, rotary
GQA_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 10000.0, "vocab_size": 32,
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits (round to nearest even), as uint16."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def gqa_llama(path: str | Path, seed: int = 47, planted: bool = True, partial: float | None = None) -> Path:
    """Write the tiny GQA Llama's config.json and model.safetensors (bfloat16) into ``path``.
    ``planted``: head factors with planted spectra (singular values from 1 down to 1e-6), so
    rank and energy decisions are exercised near their thresholds. ``partial``: a
    ``partial_rotary_factor`` (the non-rotary part's spectra then come from restricted roots)."""
    from safetensors.numpy import save_file

    c = dict(GQA_LLAMA) if partial is None else {**GQA_LLAMA, "partial_rotary_factor": partial}
    d, H, Hkv, dh = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    rng = np.random.default_rng(seed)

    def factor(rows: int) -> np.ndarray:
        w = rng.standard_normal((rows, d)) / np.sqrt(d)
        if planted:  # each dh-row block: U diag(s) Vᵀ with s spread over decades
            for h in range(rows // dh):
                u, _ = np.linalg.qr(rng.standard_normal((dh, dh)))
                v, _ = np.linalg.qr(rng.standard_normal((d, dh)))
                s = np.logspace(0, -rng.uniform(1, 6), dh)
                w[h * dh:(h + 1) * dh] = (u * s) @ v.T
        return w

    tensors = {}
    for i in range(c["num_hidden_layers"]):
        pre = f"model.layers.{i}.self_attn."
        tensors[pre + "q_proj.weight"] = factor(H * dh)
        tensors[pre + "k_proj.weight"] = factor(Hkv * dh)
        tensors[pre + "v_proj.weight"] = factor(Hkv * dh)
        tensors[pre + "o_proj.weight"] = factor(H * dh).T.copy()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(c))
    raw = {k: _bf16_bits(v) for k, v in tensors.items()}
    # safetensors.numpy has no bfloat16: write the bits as uint16, then patch the header's dtype
    save_file(raw, str(path / "model.safetensors"))
    blob = (path / "model.safetensors").read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    for k, v in header.items():
        if k != "__metadata__":
            v["dtype"] = "BF16"
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    (path / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + n:])
    return path
