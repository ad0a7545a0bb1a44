"""Benchmark: full per-head QK + OV analysis of a LLaMA-2-7B-shaped checkpoint, side by side with
the I/O floor, dense SVD of the formed product, and TransformerLens' FactoredMatrix.

    python benchmarks/bench_spectra.py [--dir DIR] [--no-mlp] [--dense-heads 2] [--tl-layers 1]

It writes (once, then reuses) two bf16 checkpoints sharded like a real release, with random
attention weights: LLaMA-2-7B (32 layers, d = 4096, 32 heads, dh = 128) and the same with 8 kv
heads (GQA). MLP and embedding tensors are present (zeros; never read by any contender) so
shards have a release's size and layout; --no-mlp leaves them out to save 17 GB of disk.

Every contender runs in its own subprocess (peak RSS is per contender) on a warm page cache:
- floor: read exactly the attention tensors with safetensors and convert them to float32;
- ours:  attnrank.analyze(path) — every head, both products, all metrics;
- dense: torch.linalg.svdvals of the formed 4096 × 4096 float64 product, a few heads,
         extrapolated to all heads and both products;
- tl:    transformer_lens.FactoredMatrix(A, Bᵀ).S for every head of --tl-layers layers, both
         products, extrapolated to all layers (pip install '.[bench]').
Numbers are ratios measured in one run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

L, D, H, DH, FF, VOCAB = 32, 4096, 32, 128, 11008, 32000
SHARD_BYTES = 2 * 1024**3


def config(n_kv: int) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": D,
            "intermediate_size": FF, "num_attention_heads": H, "num_key_value_heads": n_kv,
            "num_hidden_layers": L, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5}


def generate(path: Path, n_kv: int, mlp: bool) -> None:
    from safetensors.torch import save_file

    if (path / "model.safetensors.index.json").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(n_kv)
    bf = torch.bfloat16

    def tensors():
        if mlp:
            yield "model.embed_tokens.weight", torch.zeros(VOCAB, D, dtype=bf)
        for i in range(L):
            p = f"model.layers.{i}."
            for name, rows in (("q", H * DH), ("k", n_kv * DH), ("v", n_kv * DH)):
                yield p + f"self_attn.{name}_proj.weight", (torch.randn(rows, D, generator=g) * D**-0.5).to(bf)
            yield p + "self_attn.o_proj.weight", (torch.randn(D, H * DH, generator=g) * (H * DH) ** -0.5).to(bf)
            yield p + "input_layernorm.weight", torch.ones(D, dtype=bf)
            yield p + "post_attention_layernorm.weight", torch.ones(D, dtype=bf)
            if mlp:
                yield p + "mlp.gate_proj.weight", torch.zeros(FF, D, dtype=bf)
                yield p + "mlp.up_proj.weight", torch.zeros(FF, D, dtype=bf)
                yield p + "mlp.down_proj.weight", torch.zeros(D, FF, dtype=bf)
        yield "model.norm.weight", torch.ones(D, dtype=bf)
        if mlp:
            yield "lm_head.weight", torch.zeros(VOCAB, D, dtype=bf)

    shards, cur, size = [], {}, 0
    for name, t in tensors():
        cur[name] = t
        size += t.numel() * t.element_size()
        if size >= SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
    if cur:
        shards.append(cur)
    weight_map = {}
    for j, sd in enumerate(shards):
        fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sd, path / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(sd, fname))
    (path / "config.json").write_text(json.dumps(config(n_kv)))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def attention_names(path: Path) -> dict[str, list[str]]:
    wm = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    by_file: dict[str, list[str]] = {}
    for name, f in wm.items():
        if ".self_attn." in name:
            by_file.setdefault(f, []).append(name)
    return by_file


# -- contenders (each runs in a child process) -----------------------------------------------
def run_floor(path: Path, _: argparse.Namespace) -> dict:
    from safetensors import safe_open

    n = 0
    for f, names in attention_names(path).items():
        with safe_open(str(path / f), framework="pt") as h:
            for name in names:
                n += h.get_tensor(name).float().numel()
    return {"elements": n}


def run_ours(path: Path, _: argparse.Namespace) -> dict:
    import attnrank

    t = attnrank.spectra(path)
    return {"rows": len(t), "mean_qk_rank": float(t[t["product"] == "qk"]["rank"].mean())}


def _layer0_factors(path: Path):
    from attnrank.io.checkpoint import Checkpoint
    from attnrank.io.layouts import AttentionReader

    reader = AttentionReader(Checkpoint(path))
    return reader, reader.read_layer(0)


def run_dense(path: Path, args: argparse.Namespace) -> dict:
    reader, hw = _layer0_factors(path)
    A, B = hw.qk_factors()
    t0 = time.perf_counter()
    for h in range(args.dense_heads):
        M = A[h].double() @ B[h].double().T  # d × d
        torch.linalg.svdvals(M)
    per_head = (time.perf_counter() - t0) / args.dense_heads
    return {"per_head_s": per_head, "extrapolated_s": per_head * H * 2 * L}


def run_tl(path: Path, args: argparse.Namespace) -> dict:
    from transformer_lens import FactoredMatrix

    from attnrank.io.checkpoint import Checkpoint
    from attnrank.io.layouts import AttentionReader

    reader = AttentionReader(Checkpoint(path))
    t0 = time.perf_counter()
    for i in range(args.tl_layers):
        hw = reader.read_layer(i)
        for A, B in (hw.qk_factors(), hw.ov_factors()):
            _ = FactoredMatrix(A.float(), B.float().mT).S
    per_layer = (time.perf_counter() - t0) / args.tl_layers
    return {"per_layer_s": per_layer, "extrapolated_s": per_layer * L}


CONTENDERS = {"floor": run_floor, "ours": run_ours, "dense": run_dense, "tl": run_tl}


def child(name: str, path: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(torch.get_num_threads())
    t0 = time.perf_counter()
    info = CONTENDERS[name](Path(path), args)
    info["seconds"] = time.perf_counter() - t0
    info["peak_rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(info))


def peak_rss_mib() -> float:
    """This process's own high-water RSS (VmHWM; ru_maxrss would carry the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(name: str, path: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", name, str(path), "--dense-heads", str(args.dense_heads),
           "--tl-layers", str(args.tl_layers)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(line[0][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/attnrank-bench"))
    ap.add_argument("--no-mlp", action="store_true")
    ap.add_argument("--dense-heads", type=int, default=2)
    ap.add_argument("--tl-layers", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PATH"))
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    for label, n_kv in (("llama2-7b", H), ("llama2-7b-gqa8", 8)):
        path = args.dir / label
        t0 = time.perf_counter()
        generate(path, n_kv, mlp=not args.no_mlp)
        print(f"\n== {label}: {L} layers, d={D}, heads={H}, kv heads={n_kv}, dh={DH}, bf16, "
              f"{len(list(path.glob('*.safetensors')))} shards (ready in {time.perf_counter() - t0:.0f} s)")
        measure("floor", path, args)  # warm the page cache
        res = {}
        for _ in range(args.repeats):  # interleaved repeats; keep each contender's best
            for name in ("floor", "ours"):
                r = measure(name, path, args)
                if "error" in r or name not in res or r["seconds"] < res[name]["seconds"]:
                    res[name] = r
        res["dense"] = measure("dense", path, args)
        res["tl"] = measure("tl", path, args)
        floor, ours = res["floor"]["seconds"], res["ours"]["seconds"]
        print(f"  I/O floor (read + to float32): {floor:8.2f} s   peak RSS {res['floor']['peak_rss_mib']:7.0f} MiB")
        print(f"  attnrank, all heads, QK+OV:    {ours:8.2f} s   peak RSS {res['ours']['peak_rss_mib']:7.0f} MiB"
              f"   -> {ours / floor:5.2f} x floor (target <= 2)")
        if "error" in res["dense"]:
            print(f"  dense SVD: {res['dense']['error']}")
        else:
            dn = res["dense"]["extrapolated_s"]
            print(f"  dense SVD of d x d product:   {dn:8.0f} s (extrapolated from {args.dense_heads} heads, "
                  f"{res['dense']['per_head_s']:.1f} s/head) -> attnrank {dn / ours:7.0f} x faster (target >= 1000)")
        if "error" in res["tl"]:
            print(f"  TransformerLens: {res['tl']['error']}  (pip install '.[bench]')")
        else:
            tl = res["tl"]["extrapolated_s"]
            print(f"  TransformerLens FactoredMatrix.S: {tl:8.1f} s (extrapolated from {args.tl_layers} layer(s))"
                  f" -> attnrank {tl / ours:5.1f} x faster (target >= 10)")
        print("  RESULT_JSON " + json.dumps({"model": label, **res}))


if __name__ == "__main__":
    main()
