"""Benchmark: `headrank compress` on a LLaMA-2-7B-shaped checkpoint, side by side with the I/O
floor of the same job and with `headrank spectra`, in one run.

    python benchmarks/bench_compress.py [--dir DIR] [--layers 4] [--kv 32] [--rank 64]
                                        [--baseline-src OLD/src] [--device auto] [--repeat 1]

It writes (once, then reuses) a bf16 checkpoint of the LLaMA-2-7B shape (d = 4096, 32 heads,
dh = 128, random attention weights; `--layers` of its 32 layers, no MLP or embeddings: the
benchmark of bench_spectra.py's writer with fewer layers), then runs, each in its own subprocess
(peak RSS per contender), on a warm page cache:

- floor: read every tensor with safetensors and write it back as safetensors shards (what any
  rewrite of the checkpoint costs, with no arithmetic);
- spectra: headrank.analyze (every head, QK + OV, all metrics, 1 thread);
- compress ov: headrank compress --rank R --products ov (the factored format, the default), one
  pass over the layers (the rank of each unit is its own: roots, the core SVD, the cut factors
  from it, X' = X Rx^-1 Uc_k S_k^1/2, only the kept dimensions written), 1 thread; and
  compress ov t2: the same with --threads 2;
- compress ov dense: the same written --format dense (zero-padded, the input's size);
- compress ov params: --params 0.5 instead of --rank (a global budget: two passes, pass 1's SVDs
  kept for the cut);
- compress ov+qk: --rank with a layout declaring no rotary, so QK is cut too (the cost of
  cutting both products on a model where that is allowed);
- compress default: --rank with the default products, OV and QK by whole rotary bands (what
  `headrank compress --rank R` does on LLaMA);
- base, base default: compress ov and compress default from another source tree
  (--baseline-src, e.g. `git archive` of the commit before a change), in the same run.

Times are whole calls inside the child (imports of headrank and torch excluded; anything the
call imports included): wall seconds, and CPU seconds of the child (user + system, all its
threads: the number to compare on a shared machine), with uptime's load average beside each;
--repeat N runs each contender N times and keeps the fastest wall time (with its CPU time).
32 layers: multiply by 32 / --layers, or run --layers 32. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_load import load_avg
from bench_spectra import SHAPES, generate

NO_ROPE = """split = "separate"
position = "none"
[tensors]
q = "model.layers.{{i}}.self_attn.q_proj.weight"
k = "model.layers.{{i}}.self_attn.k_proj.weight"
v = "model.layers.{{i}}.self_attn.v_proj.weight"
o = "model.layers.{{i}}.self_attn.o_proj.weight"
[sizes]
n_layers = {layers}
d_model = 4096
n_heads = 32
n_kv_heads = {kv}
head_dim = 128
"""


def run_floor(path: Path, out: Path, _args) -> dict:
    from safetensors import safe_open
    from safetensors.torch import save_file

    n = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            sd = {k: h.get_tensor(k) for k in h.keys()}
        save_file(sd, str(out / f.name), metadata={"format": "pt"})
        n += sum(t.numel() for t in sd.values())
    return {"elements": n}


def run_spectra(path: Path, _out: Path, _args) -> dict:
    import headrank

    return {"rows": len(headrank.spectra(path, threads=1).table)}


def run_compress(path: Path, out: Path, args, layout: str | None = None, fmt: str = "factored",
                 threads: int = 1, products: str | None = "ov", **rule) -> dict:
    import inspect

    from headrank.compress import compress

    kw = {"device": args.device} if "device" in inspect.signature(compress).parameters else {}  # a baseline tree
    res = compress(str(path), out, **(rule or {"rank": args.rank}), layout=layout,
                   products=products if layout is None else "ov,qk", format=fmt, threads=threads, **kw)
    return {"products": res["products"], "saved": res["totals"]["params_saved_factored"],
            "bytes_written": res["checkpoint"]["bytes_written"], "device": kw.get("device", "cpu")}


def run_compress_t2(path: Path, out: Path, args) -> dict:
    return run_compress(path, out, args, threads=2)


def run_compress_dense(path: Path, out: Path, args) -> dict:
    return run_compress(path, out, args, fmt="dense")


def run_compress_params(path: Path, out: Path, args) -> dict:
    return run_compress(path, out, args, params=0.5)


def run_compress_default(path: Path, out: Path, args) -> dict:
    return run_compress(path, out, args, products=None)


def run_compress_both(path: Path, out: Path, args) -> dict:
    lay = out / "norope.toml"
    lay.write_text(NO_ROPE.format(layers=args.layers, kv=args.kv))
    return run_compress(path, out / "o", args, str(lay))


CONTENDERS = {"floor": run_floor, "spectra": run_spectra, "compress_ov": run_compress, "base": run_compress,
              "compress_ov_t2": run_compress_t2, "compress_ov_dense": run_compress_dense,
              "compress_ov_params": run_compress_params, "compress_ov_qk": run_compress_both,
              "compress_default": run_compress_default, "base_default": run_compress_default}


def child(name: str, path: str, args) -> None:
    out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=args.dir))
    try:
        t, c = time.perf_counter(), time.process_time()
        res = CONTENDERS[name](Path(path), out, args)
        res["seconds"], res["cpu_seconds"] = time.perf_counter() - t, time.process_time() - c
    finally:
        shutil.rmtree(out, ignore_errors=True)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(res))


def measure(name: str, path: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--child", name, str(path), "--dir", str(args.dir), "--layers",
           str(args.layers), "--kv", str(args.kv), "--rank", str(args.rank), "--device", args.device]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    src = args.baseline_src if name.startswith("base") else os.environ.get("PYTHONPATH")
    if src:  # a worktree's source first, as for the parent; the baseline's own tree
        env["PYTHONPATH"] = str(src)
    best = None
    for _ in range(args.repeat):
        before = load_avg()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            raise SystemExit(f"{name} failed:\n{p.stderr[-2000:]}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
        res["load"] = f"{before} -> {load_avg()}"
        best = res if best is None or res["seconds"] < best["seconds"] else best
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/headrank-bench-compress"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--kv", type=int, default=32, help="kv heads (32: LLaMA-2-7B; 8: its GQA variant)")
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--device", default="auto", help="compress's device (auto, cpu, cuda)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per contender; the fastest is kept")
    ap.add_argument("--baseline-src", type=Path, default=None, help="another source tree's src/ (the `base` row)")
    ap.add_argument("--only", default=None, help="comma-separated contenders (floor always runs)")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PATH"))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.child:
        child(*args.child, args)
        return
    path = args.dir / f"llama2-7b-kv{args.kv}-{args.layers}layers"
    generate(path, args.kv, mlp=False, shape=SHAPES["llama2-7b"], written=args.layers)
    names = [n for n in CONTENDERS if (not n.startswith("base") or args.baseline_src is not None)
             and (args.only is None or n == "floor" or n in args.only.split(","))]
    res = {name: measure(name, path, args) for name in names}
    report(res, args)


def report(res: dict, args) -> None:
    floor, floor_cpu = res["floor"]["seconds"], res["floor"]["cpu_seconds"]
    dev = next((r["device"] for r in res.values() if "device" in r), "cpu")
    print(f"LLaMA-2-7B shape, {args.layers} of 32 layers, {args.kv} kv heads, bf16, rank {args.rank}; "
          f"compress --device {dev}; {os.cpu_count()} CPUs")
    print("| contender | seconds | x floor | CPU seconds | x floor CPU | peak RSS MiB | bytes written | "
          "load average before -> after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in res.items():
        print(f"| {name} | {r['seconds']:.2f} | {r['seconds'] / floor:.2f} | {r['cpu_seconds']:.2f} | "
              f"{r['cpu_seconds'] / floor_cpu:.2f} | {r['peak_rss_mib']:.0f} | {r.get('bytes_written', '')} | "
              f"{r['load']} |")
    scale = 32 / args.layers
    if scale != 1:
        print(f"32 layers, extrapolated (x {scale:g}): " + ", ".join(
            f"{n} {r['seconds'] * scale:.0f} s ({r['cpu_seconds'] * scale:.0f} s CPU)" for n, r in res.items()))


if __name__ == "__main__":
    main()
