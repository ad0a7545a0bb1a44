"""Benchmark: full per-head QK + OV analysis of a LLaMA-2-7B-shaped checkpoint, side by side with
the I/O floor, dense SVD of the formed product, and TransformerLens' FactoredMatrix.

    python benchmarks/bench_spectra.py [--dir DIR] [--no-mlp] [--dense-heads 2] [--tl-layers 1]
                                       [--models llama2-7b,llama2-7b-gqa8] [--no-load] [--big]

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
Each contender runs twice: on the machine as it is ("idle"), and beside one CPU-bound process
the benchmark starts itself ("load"; --no-load skips it); the slowdown under load is reported.
uptime's load averages are printed with every measurement (a shared machine is never idle).
--big adds the 70B shape (80 layers, d = 8192, 64 heads, 8 kv heads, attention only, ~24 GB
bf16; free disk is checked first): time, floor and peak RSS, idle only.
Numbers are ratios measured in one run; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_load import cpu_load, load_avg

L, D, H, DH, FF, VOCAB = 32, 4096, 32, 128, 11008, 32000
SHARD_BYTES = 2 * 1024**3
# name: (layers, d, heads, kv heads, ffn); head width 128 throughout
SHAPES = {"llama2-7b": (32, 4096, 32, 32, 11008), "llama2-7b-gqa8": (32, 4096, 32, 8, 11008),
          "llama-70b-attn": (80, 8192, 64, 8, 28672)}


def config(n_kv: int, shape: tuple = SHAPES["llama2-7b"]) -> dict:
    n_layers, d, h, _, ff = shape
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": d,
            "intermediate_size": ff, "num_attention_heads": h, "num_key_value_heads": n_kv,
            "num_hidden_layers": n_layers, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5}


def attention_bytes(shape: tuple) -> int:
    """bf16 bytes of the attention tensors (q, k, v, o) of a shape."""
    n_layers, d, h, kv, _ = shape
    return n_layers * 2 * (2 * d * h * DH + 2 * d * kv * DH)


def generate(path: Path, n_kv: int, mlp: bool, shape: tuple = SHAPES["llama2-7b"], written: int | None = None) -> None:
    """Write the checkpoint once; ``written``: only the first that many layers (the config keeps all)."""
    from safetensors.torch import save_file

    if (path / "model.safetensors.index.json").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(n_kv)
    bf = torch.bfloat16
    L, D, H, _, FF = shape  # noqa: N806 (the module constants' names, for this shape)

    def tensors():
        if mlp:
            yield "model.embed_tokens.weight", torch.zeros(VOCAB, D, dtype=bf)
        for i in range(L if written is None else written):
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
    (path / "config.json").write_text(json.dumps(config(n_kv, shape if written is None else (written, *shape[1:]))))
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

    present = {int(n.split("layers.")[1].split(".")[0]) for ns in attention_names(path).values() for n in ns}
    t = attnrank.spectra(path, layers=sorted(present))  # every layer written (--big-layers: a prefix)
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
    cfg = reader.dims
    return {"per_head_s": per_head, "extrapolated_s": per_head * cfg.n_heads * 2 * cfg.n_layers}


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
    return {"per_layer_s": per_layer, "extrapolated_s": per_layer * reader.dims.n_layers}


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


def measure(name: str, path: Path, args: argparse.Namespace, load: bool = False) -> dict:
    """One contender in a fresh process (beside one CPU-bound process when ``load``)."""
    cmd = [sys.executable, __file__, "--child", name, str(path), "--dense-heads", str(args.dense_heads),
           "--tl-layers", str(args.tl_layers)]
    before = load_avg()
    with cpu_load(load):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return {**json.loads(line[0][7:]), "process_s": wall, "load_avg_before": before, "load_avg_after": load_avg()}


def best_of(name: str, path: Path, args: argparse.Namespace, load: bool, repeats: int) -> dict:
    best: dict = {}
    for _ in range(repeats):
        r = measure(name, path, args, load)
        if "error" in r or not best or r["seconds"] < best["seconds"]:
            best = r
    print(f"    {name:5s} {'load' if load else 'idle'}: " + (best.get("error") or f"{best['seconds']:.2f} s, peak RSS "
          f"{best['peak_rss_mib']:.0f} MiB, load average {best['load_avg_before']}"), flush=True)
    return best


def report(label: str, res: dict, args: argparse.Namespace) -> None:
    """One model's table: each contender idle and under load, ratios to the floor and to ours."""
    def cell(r: dict, key: str = "seconds") -> str:
        return r["error"][:40] if "error" in r else f"{r[key]:9.2f} s"

    modes = [m for m in ("idle", "load") if m in res]
    print(f"  {'':34s}" + "".join(f"{m:>24s}" for m in modes))
    for name, key, what in (("floor", "seconds", "I/O floor (read + to float32)"), ("ours", "seconds", "attnrank, all heads, QK+OV"),
                            ("dense", "extrapolated_s", "dense SVD of d x d (extrap.)"),
                            ("tl", "extrapolated_s", "TransformerLens .S (extrap.)")):
        row = f"  {what:34s}"
        for m in modes:
            r = res[m].get(name)
            if r is None:
                row += f"{'-':>24s}"
                continue
            extra = ""
            if "error" not in r and "error" not in res[m]["floor"] and "error" not in res[m]["ours"]:
                if name == "ours":
                    extra = f" {r['seconds'] / res[m]['floor']['seconds']:5.2f}xF"
                elif name in ("dense", "tl"):
                    extra = f" {r[key] / res[m]['ours']['seconds']:5.1f}x"
            row += f"{cell(r, key) + extra:>24s}"
        print(row)
    for m in modes:
        o, f = res[m]["ours"], res[m]["floor"]
        if "error" not in o and "error" not in f:
            print(f"  [{m}] peak RSS ours {o['peak_rss_mib']:.0f} MiB, floor {f['peak_rss_mib']:.0f} MiB; "
                  f"load average {o['load_avg_before']} -> {o['load_avg_after']}")
    if len(modes) == 2 and all("error" not in res[m]["ours"] and "error" not in res[m]["floor"] for m in modes):
        so = res["load"]["ours"]["seconds"] / res["idle"]["ours"]["seconds"]
        sf = res["load"]["floor"]["seconds"] / res["idle"]["floor"]["seconds"]
        print(f"  slowdown under one concurrent CPU-bound process: attnrank {so:.2f}x, floor {sf:.2f}x")
    print("  targets: <= 2x floor idle, <= 3x under load, >= 10x faster than TransformerLens, RSS <= 2 GiB")


def run_model(label: str, args: argparse.Namespace) -> None:
    shape = SHAPES[label]
    path = args.dir / label
    big = label.startswith("llama-70b")
    written = args.big_layers if big else None
    if written is not None:
        shape_w = (written, *shape[1:])
        path = args.dir / f"{label}-first{written}"
    need = attention_bytes(shape if written is None else shape_w) + (0 if args.no_mlp or big else 17 * 2**30)
    if not (path / "model.safetensors.index.json").exists():
        free = shutil.disk_usage(args.dir if args.dir.exists() else args.dir.parent).free
        print(f"\n{label}: needs {need / 2**30:.1f} GiB of disk, {free / 2**30:.1f} GiB free")
        if free < need * 1.1:
            print("  skipped: not enough free disk")
            return
    t0 = time.perf_counter()
    generate(path, shape[3], mlp=not args.no_mlp and not big, shape=shape, written=written)
    n_layers, d, h, kv, _ = shape
    print(f"\n== {label}: {n_layers} layers, d={d}, heads={h}, kv heads={kv}, dh={DH}, bf16, "
          f"{len(list(path.glob('*.safetensors')))} shards (ready in {time.perf_counter() - t0:.0f} s)")
    if written is not None:
        print(f"  only the first {written} of {n_layers} layers written and analysed (--big-layers)")
    measure("floor", path, args)  # warm the page cache (as far as it holds the checkpoint)
    res: dict = {}
    for mode in ("idle",) if args.no_load or big else ("idle", "load"):
        load = mode == "load"
        res[mode] = {name: best_of(name, path, args, load, 1 if big else args.repeats) for name in ("floor", "ours")}
        if not big:
            if args.dense_heads > 0:
                res[mode]["dense"] = best_of("dense", path, args, load, 1)
            if args.tl_layers > 0:
                res[mode]["tl"] = best_of("tl", path, args, load, 1)
    report(label, res, args)
    print("  RESULT_JSON " + json.dumps({"model": label, **res}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/attnrank-bench"))
    ap.add_argument("--no-mlp", action="store_true")
    ap.add_argument("--dense-heads", type=int, default=2)
    ap.add_argument("--tl-layers", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--models", default="llama2-7b,llama2-7b-gqa8")
    ap.add_argument("--no-load", action="store_true", help="skip the runs beside a CPU-bound process")
    ap.add_argument("--big", action="store_true", help="also the 70B shape (~24 GB of disk)")
    ap.add_argument("--big-layers", type=int, default=None, help="write and analyse only this many 70B layers")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PATH"))
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load average {load_avg()}")
    for label in [m for m in args.models.split(",") if m] + (["llama-70b-attn"] if args.big else []):
        run_model(label, args)


if __name__ == "__main__":
    main()
