"""Benchmark: a DeepSeek-V3-shaped FP8 checkpoint (multi-head latent attention, 128 × 128 block
scales, routed experts stored per expert) read from a Hub-like server over HTTP ranges, against
downloading every shard whole and reading it locally.

    python benchmarks/bench_quant_remote.py [--layers 4] [--experts 16] [--bandwidth 0] [--dir DIR]

The checkpoint is DeepSeek-V3's layout narrowed to fit here: d = 1024, 8 heads, q_lora_rank 384,
kv_lora_rank 128, qk_nope 64, qk_rope 32, v_head_dim 64, ``--experts`` routed experts of width 256
per MoE layer (the first layer dense), every Linear of the layers in ``float8_e4m3fn`` with a
float32 ``weight_scale_inv`` per 128 × 128 block (``kv_a_proj_with_mqa``'s 160 rows and
``q_b_proj``'s 768 rows of 384 columns give ragged and exact grids), one shard per module
(routed experts, shared experts, gates, attention projections, norms: far more than 64 shards)
and a ``model.safetensors.index.json``. It is written once with random codes and scales, then
reused. tests/io/hubserver.py serves it on 127.0.0.1 from a separate process (``--bandwidth``
MB/s through one token bucket; 0: unlimited). Contenders, one after the other, same server:

- remote: ``headrank.analyze(ID, remote=True)``: config, index, the headers of the shards holding
  the attention tensors read (q_b_proj, kv_b_proj, o_proj) and those tensors with their scales;
- whole:  ``huggingface_hub.hf_hub_download`` of every file into a fresh cache, then
  ``headrank.analyze`` of the snapshot.

Printed: seconds, bytes the server sent, requests, the bound of issue 44 (bytes ≤ 1.05 × the
attention tensors and scales read + their shards' headers), the requests per shard header and
the number of shards never touched. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
REPO = "bench/deepseek-v3-fp8-shape"
DIMS = dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=384, kv_lora_rank=128,
            qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, intermediate_size=2048,
            moe_intermediate_size=256, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
            first_k_dense_replace=1, vocab_size=4096)
BLOCK = 128
READ = ("q_b_proj", "kv_b_proj", "o_proj")  # what the MLA analysis reads (docs/mla.md)


def _shapes(layers: int, experts: int) -> dict[str, dict[str, tuple[int, ...]]]:
    """Module -> {tensor name: shape} of the narrowed checkpoint, DeepSeek-V3's names."""
    d, h = DIMS["hidden_size"], DIMS["num_attention_heads"]
    nope, rope, v = DIMS["qk_nope_head_dim"], DIMS["qk_rope_head_dim"], DIMS["v_head_dim"]
    ql, kvl = DIMS["q_lora_rank"], DIMS["kv_lora_rank"]
    mods: dict[str, dict[str, tuple[int, ...]]] = {"model.embed_tokens": {"weight": (DIMS["vocab_size"], d)},
                                                   "model.norm": {"weight": (d,)},
                                                   "lm_head": {"weight": (DIMS["vocab_size"], d)}}
    for i in range(layers):
        p = f"model.layers.{i}."
        att = {"q_a_proj": (ql, d), "q_b_proj": (h * (nope + rope), ql), "kv_a_proj_with_mqa": (kvl + rope, d),
               "kv_b_proj": (h * (nope + v), kvl), "o_proj": (d, h * v)}
        mods.update({p + "self_attn." + k: {"weight": s} for k, s in att.items()})
        mods.update({p + "self_attn.q_a_layernorm": {"weight": (ql,)}, p + "self_attn.kv_a_layernorm": {"weight": (kvl,)},
                     p + "input_layernorm": {"weight": (d,)}, p + "post_attention_layernorm": {"weight": (d,)}})
        if i < DIMS["first_k_dense_replace"]:
            f = DIMS["intermediate_size"]
            mods.update({p + f"mlp.{k}": {"weight": s} for k, s in (("gate_proj", (f, d)), ("up_proj", (f, d)),
                                                                    ("down_proj", (d, f)))})
            continue
        f = DIMS["moe_intermediate_size"]
        for e in [*(f"experts.{j}" for j in range(experts)), "shared_experts"]:
            mods[p + f"mlp.{e}"] = {"gate_proj.weight": (f, d), "up_proj.weight": (f, d), "down_proj.weight": (d, f)}
        mods[p + "mlp.gate"] = {"weight": (experts, d), "e_score_correction_bias": (experts,)}
    return mods


def write(path: Path, layers: int, experts: int) -> Path:
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    mods = _shapes(layers, experts)
    weight_map, total = {}, 0
    for k, (module, tensors) in enumerate(sorted(mods.items())):
        out = {}
        for rel, shape in tensors.items():
            name = f"{module}.{rel}"
            if ".layers." in name and name.endswith("proj.weight"):  # FP8 codes + block scales
                out[name] = (torch.randn(shape, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
                grid = (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))
                out[name + "_scale_inv"] = torch.rand(grid, generator=g) * 1e-3 + 1e-4
            else:
                out[name] = torch.randn(shape, generator=g, dtype=torch.float32).to(torch.bfloat16)
        fname = f"model-{k + 1:05d}-of-{len(mods):05d}.safetensors"
        save_file(out, str(path / fname))
        for n, t in out.items():
            weight_map[n], total = fname, total + t.numel() * t.element_size()
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    cfg = tf.DeepseekV3Config(num_hidden_layers=layers, n_routed_experts=experts, **DIMS).to_dict()
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [BLOCK, BLOCK]}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def serve(directory: str, bandwidth: float, conn) -> None:
    from tests.io.hubserver import HubServer

    with HubServer(bandwidth=bandwidth or None) as srv:
        srv.add(REPO, "main", Path(directory))
        conn.send(srv.url)
        while True:
            msg = conn.recv()
            if msg == "stop":
                break
            if msg == "reset":
                srv.reset()
                conn.send(None)
            else:
                conn.send((srv.sent, list(srv.log)))


def expected(path: Path) -> tuple[int, int, set[str]]:
    """(bytes of the attention tensors read and their scales, header bytes of their shards, those shards)."""
    wm = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    names = {n for n in wm if any(f"self_attn.{r}.weight" in n for r in READ)}
    shards = {wm[n] for n in names}
    from safetensors import safe_open

    tensors = headers = 0
    for s in shards:
        headers += 8 + int.from_bytes((path / s).read_bytes()[:8], "little")
        with safe_open(str(path / s), "pt") as h:
            for n in h.keys():
                if n in names:
                    t = h.get_tensor(n)
                    tensors += t.numel() * t.element_size()
    return tensors, headers, shards


def _measure(conn, fn):
    conn.send("reset")
    conn.recv()
    t0 = time.perf_counter()
    res = fn()
    sec = time.perf_counter() - t0
    conn.send("stats")
    sent, log = conn.recv()
    return res, sec, sent, log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/headrank-bench-quant-remote"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--bandwidth", type=float, default=0.0, help="MB/s through one token bucket (0: unlimited)")
    args = ap.parse_args()
    path = write(args.dir / f"l{args.layers}-e{args.experts}", args.layers, args.experts)
    files = sorted(path.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in files)
    print(f"checkpoint: {path} ({args.layers} layers, {args.experts} experts, {len(files)} shards, {size / 1e6:.1f} MB); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=serve, args=(str(path), args.bandwidth * 1e6, child), daemon=True)
    proc.start()
    url = parent.recv()
    os.environ.update(HF_ENDPOINT=url, HF_HUB_DISABLE_PROGRESS_BARS="1")
    os.environ.pop("HF_HUB_OFFLINE", None)
    from headrank.analysis.scan import analyze

    try:
        remote, t_remote, sent_remote, log_remote = _measure(parent, lambda: analyze(REPO, remote=True))
        cache = Path(tempfile.mkdtemp(prefix="headrank-bench-cache-"))

        def whole():
            from huggingface_hub import hf_hub_download

            for f in ["config.json", "model.safetensors.index.json", *(p.name for p in files)]:
                local = hf_hub_download(REPO, f, cache_dir=cache, endpoint=url)
            return analyze(Path(local).parent)

        local, t_whole, sent_whole, log_whole = _measure(parent, whole)
        shutil.rmtree(cache, ignore_errors=True)
    finally:
        parent.send("stop")
        proc.join(5)
    tensors, headers, shards = expected(path)
    per_shard: dict[str, int] = {}
    for _, p, _ in log_remote:
        m = re.search(r"/(model-\d+-of-\d+\.safetensors)$", p)
        if m and p.startswith("/cdn/"):
            per_shard[m.group(1)] = per_shard.get(m.group(1), 0) + 1
    import numpy as np

    same = all(np.array_equal(remote.sv[p], local.sv[p], equal_nan=True) for p in ("qk", "ov"))
    print(f"{'contender':<8} {'seconds':>8} {'bytes sent':>14} {'share':>7} {'requests':>9}")
    for name, sec, sent, log in (("remote", t_remote, sent_remote, log_remote), ("whole", t_whole, sent_whole, log_whole)):
        print(f"{name:<8} {sec:8.2f} {sent:14,d} {sent / size:7.2%} {len(log):9d}")
    print(f"ratios whole/remote: time {t_whole / t_remote:.2f}x, bytes {sent_whole / max(sent_remote, 1):.1f}x")
    print(f"bound: sent {sent_remote:,} <= 1.05 x {tensors:,} (attention + scales read) + {headers:,} (their shards' "
          f"headers) + JSON = {1.05 * tensors + headers:,.0f} + JSON: "
          f"{sent_remote - sum((path / f).stat().st_size for f in ('config.json', 'model.safetensors.index.json')) <= 1.05 * tensors + headers}")
    print(f"shards touched {len(per_shard)} of {len(files)} (those holding attention tensors read: {len(shards)}; "
          f"same set: {set(per_shard) == shards}); requests per touched shard: at most {max(per_shard.values())} "
          f"(2 for its header, 1 per tensor); spectra identical to the downloaded checkpoint's: {same}; "
          f"quantization: {remote.meta['quantization']['method']}")


if __name__ == "__main__":
    main()
