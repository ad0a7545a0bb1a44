"""Benchmark: `headrank spectra DIR --out OUT` as a user runs it (whole process, default
options), side by side in one run with the I/O floor, TransformerLens' FactoredMatrix and a dense
SVD, on LLaMA-shaped bf16 checkpoints.

    python benchmarks/bench_spectra.py [--dir DIR] [--models llama2-7b-8l,llama2-7b,llama-70b-attn]
                                       [--big-layers N] [--no-load] [--tl-layers 1] [--dense-heads 2]
                                       [--baseline-src OLD/src]

It writes (once, then reuses) attention-only bf16 checkpoints sharded like a release (2 GiB
shards, random weights): LLaMA-2-7B width with 8 and with 32 layers (d = 4096, 32 heads,
dh = 128), and the 70B shape (80 layers, d = 8192, 64 heads, 8 kv heads; ~23 GiB: free disk is
checked first; --big-layers N writes and analyses only the first N layers).

Every contender runs in its own process, on the machine as it is ("idle"), beside one CPU-bound
process the benchmark starts ("load") and, for the 8-layer shape, beside two ("load2"; --no-load
skips both):
- floor: read exactly the attention tensors with safetensors, convert them to float32 (in-process
  time, no start-up): what any analysis must at least do;
- headrank: the whole `python -m headrank spectra DIR --out OUT -q` process, start-up, figures and
  output files included (wall clock from fork to exit; CPU seconds and peak RSS of that process);
  also with --threads 2 (70B: idle only), --threads 1 and --no-plots (8 layers, idle), and meta.json's
  `timing_s` (the share of the stream the compute waited on reads and the reads on compute) and
  `compute` (device, threads per layer);
- base: the same command from another source tree (--baseline-src, e.g. `git archive` of the
  commit before a change, its own PYTHONPATH), in the same run;
- start-up: `headrank spectra --help`, and a 1-layer run minus its compute (the fixed cost);
- tl / tl1: transformer_lens.FactoredMatrix(A, Bᵀ).S for every head of --tl-layers layers, both
  products, at torch's default threads and at 1 thread, extrapolated to all layers
  (pip install '.[bench]'; idle only);
- dense: torch.linalg.svdvals of the formed d × d float64 product, a few heads, extrapolated
  (idle only).
uptime's load averages are printed next to every number (a shared machine is never idle). Numbers
are ratios measured in one run; nothing here asserts a time.
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

import torch
from bench_load import cpu_load, load_avg

DH, VOCAB = 128, 32000
SHARD_BYTES = 2 * 1024**3
# name: (layers, d, heads, kv heads, ffn); head width 128 throughout
SHAPES = {"llama2-7b-8l": (8, 4096, 32, 32, 11008), "llama2-7b": (32, 4096, 32, 32, 11008),
          "llama2-7b-gqa8": (32, 4096, 32, 8, 11008), "llama-70b-attn": (80, 8192, 64, 8, 28672)}
GIB = 2**30


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
    """Write the checkpoint once, shard by shard (never more than one shard in memory);
    ``written``: only the first that many layers (the config keeps all)."""
    from safetensors.torch import save_file

    if (path / "model.safetensors.index.json").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(n_kv)
    L, D, H, _, FF = shape  # noqa: N806 (the module constants' names, for this shape)
    specs = []  # (name, rows, cols, std or None for ones / zeros)
    if mlp:
        specs.append(("model.embed_tokens.weight", VOCAB, D, 0.0))
    for i in range(L if written is None else written):
        p = f"model.layers.{i}."
        for name, rows in (("q", H * DH), ("k", n_kv * DH), ("v", n_kv * DH)):
            specs.append((p + f"self_attn.{name}_proj.weight", rows, D, D**-0.5))
        specs.append((p + "self_attn.o_proj.weight", D, H * DH, (H * DH) ** -0.5))
        specs += [(p + "input_layernorm.weight", 1, D, None), (p + "post_attention_layernorm.weight", 1, D, None)]
        if mlp:
            specs += [(p + f"mlp.{n}_proj.weight", FF, D, 0.0) for n in ("gate", "up")]
            specs.append((p + "mlp.down_proj.weight", D, FF, 0.0))
    specs.append(("model.norm.weight", 1, D, None))
    if mlp:
        specs.append(("lm_head.weight", VOCAB, D, 0.0))

    shards, size = [[]], 0
    for spec in specs:
        shards[-1].append(spec)
        size += 2 * spec[1] * spec[2]
        if size >= SHARD_BYTES:
            shards.append([])
            size = 0
    shards = [s for s in shards if s]

    # Gaussian values drawn once (2^27 of them) and read as a window at a random offset per
    # tensor: every tensor's entries are distinct draws (full rank), and the 70B shape's 12e9
    # values take a copy each instead of a randn each (an hour on a busy 2-core machine).
    pool = torch.randn(2**27, generator=g).to(torch.bfloat16)

    def make(rows: int, cols: int, std: float | None) -> torch.Tensor:
        if std is None:
            return torch.ones(cols, dtype=torch.bfloat16)
        if std == 0.0:
            return torch.zeros(rows, cols, dtype=torch.bfloat16)
        n = rows * cols
        if n > pool.numel():
            return (torch.randn(rows, cols, generator=g) * std).to(torch.bfloat16)
        off = int(torch.randint(pool.numel(), (1,), generator=g))
        window = torch.cat([pool[off:], pool[:off]])[:n] if off + n > pool.numel() else pool[off:off + n]
        return (window.float() * std).to(torch.bfloat16).reshape(rows, cols)

    weight_map = {}
    for j, shard in enumerate(shards):
        fname = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: make(r, c, std) for name, r, c, std in shard}, path / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys((spec[0] for spec in shard), fname))
    (path / "config.json").write_text(json.dumps(config(n_kv, shape if written is None else (written, *shape[1:]))))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def attention_names(path: Path) -> dict[str, list[str]]:
    wm = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    by_file: dict[str, list[str]] = {}
    for name, f in wm.items():
        if ".self_attn." in name:
            by_file.setdefault(f, []).append(name)
    return by_file


# -- contenders that run inside a child process (`--child NAME PATH`) --------------------------
def run_floor(path: Path, _: argparse.Namespace) -> dict:
    from safetensors import safe_open

    n = 0
    for f, names in attention_names(path).items():
        with safe_open(str(path / f), framework="pt") as h:
            for name in names:
                n += h.get_tensor(name).float().numel()
    return {"elements": n}


def _reader(path: Path):
    from headrank.io.checkpoint import Checkpoint
    from headrank.io.layouts import AttentionReader

    return AttentionReader(Checkpoint(path))


def run_dense(path: Path, args: argparse.Namespace) -> dict:
    reader = _reader(path)
    A, B = reader.read_layer(0).qk_factors()
    t0 = time.perf_counter()
    for h in range(args.dense_heads):
        torch.linalg.svdvals(A[h].double() @ B[h].double().T)  # the d × d product, float64
    per_head = (time.perf_counter() - t0) / args.dense_heads
    return {"per_head_s": per_head, "per_layer_s": per_head * reader.dims.n_heads * 2}


def run_tl(path: Path, args: argparse.Namespace, threads: int | None = None) -> dict:
    from transformer_lens import FactoredMatrix

    if threads is not None:
        torch.set_num_threads(threads)
    reader = _reader(path)
    t0 = time.perf_counter()
    for i in range(args.tl_layers):
        hw = reader.read_layer(i)
        for A, B in (hw.qk_factors(), hw.ov_factors()):
            _ = FactoredMatrix(A.float(), B.float().mT).S
    return {"per_layer_s": (time.perf_counter() - t0) / args.tl_layers, "threads": torch.get_num_threads()}


CHILDREN = {"floor": run_floor, "dense": run_dense, "tl": run_tl, "tl1": lambda p, a: run_tl(p, a, 1)}


def child(name: str, path: str, args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    info = CHILDREN[name](Path(path), args)
    info["seconds"] = time.perf_counter() - t0
    info["peak_rss_mib"] = peak_rss_mib()
    print("RESULT " + json.dumps(info))


def peak_rss_mib() -> float:
    """This process's own high-water RSS (VmHWM; ru_maxrss would carry the parent's over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- measurements (parent) -------------------------------------------------------------------
def measure_child(name: str, path: Path, args: argparse.Namespace, load: bool) -> dict:
    """One in-process contender in a fresh process (beside one CPU-bound process when ``load``)."""
    cmd = [sys.executable, __file__, "--child", name, str(path), "--dense-heads", str(args.dense_heads),
           "--tl-layers", str(args.tl_layers)]
    before = load_avg()
    with cpu_load(load):
        p = subprocess.run(cmd, capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return {**json.loads(line[0][7:]), "load_avg": before}


def measure_cli(path: Path, args: argparse.Namespace, load: bool | int, extra: tuple[str, ...] = (),
                src: Path | None = None) -> dict:
    """The whole `python -m headrank spectra PATH --out OUT -q` process: wall clock from fork
    to exit, its peak RSS (wait4's ru_maxrss), and the stream timing meta.json records.
    ``src``: run that source tree instead (PYTHONPATH=src), e.g. the baseline."""
    out = Path(tempfile.mkdtemp(prefix="out-", dir=args.dir))
    cmd = [sys.executable, "-m", "headrank", "spectra", str(path), "--out", str(out), "-q", *extra]
    env = cli_env(args, src)
    before = load_avg()
    try:
        with cpu_load(load), tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
            _, status, usage = os.wait4(p.pid, 0)
            wall = time.perf_counter() - t0
            p.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            msg = err.read().decode(errors="replace").strip().splitlines()
        if p.returncode:
            return {"error": (msg or ["failed"])[-1]}
        res = {"seconds": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024,
               "load_avg": before,
               "files": sorted(f.name for f in out.iterdir())}
        if (out / "meta.json").exists():
            meta = json.loads((out / "meta.json").read_text())
            res["timing_s"] = meta.get("timing_s", {})
            res["compute"] = meta.get("compute", {"device": "cpu (torch)"})
            res["precision"] = {k: v for k, v in (meta.get("precision") or {}).items()
                                if k in ("requested", "heads_auto", "heads_fallback", "heads_float64", "largest_bound")}
        if (out / "spectra.npz").exists():  # the singular values' bits, to compare thread settings
            import hashlib

            import numpy as np

            with np.load(out / "spectra.npz") as z:
                res["sv_sha"] = hashlib.sha256(b"".join(z[k].tobytes() for k in sorted(z.files))).hexdigest()[:16]
        return res
    finally:
        shutil.rmtree(out, ignore_errors=True)


def cli_env(args: argparse.Namespace, src: Path | None = None) -> dict[str, str]:
    """The environment of a headrank process: ``src`` first on the path (a baseline tree), and
    unless --no-bytecode-cache, compiled bytecode kept under DIR/pycache (PYTHONPYCACHEPREFIX), as
    an installed package has it: with PYTHONDONTWRITEBYTECODE=1 and a source checkout, every run
    would compile headrank's modules again (about 0.07 s of CPU a process here)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    if args.bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(args.dir / "pycache")
    return env


def warm_bytecode(args: argparse.Namespace) -> None:
    """Compile what a spectra run imports (main process and figure process) into the cache, for
    this tree and the baseline's."""
    if not args.bytecode_cache:
        return
    code = "import headrank.cli, headrank.analysis.scan, headrank.analysis.figproc, headrank.analysis.plots"
    for src in [None] + ([args.baseline_src] if args.baseline_src is not None else []):
        subprocess.run([sys.executable, "-c", code], env=cli_env(args, src), capture_output=True)


def measure_startup(path: Path, args: argparse.Namespace) -> dict:
    """`headrank spectra --help` (best of 3) and a 1-layer run's fixed cost (whole process
    minus the layer's compute as meta.json records it)."""
    helps = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "headrank", "spectra", "--help"], capture_output=True, env=cli_env(args))
        helps.append(time.perf_counter() - t0)
    ones = [measure_cli(path, args, False, ("--layers", "0")) for _ in range(2)]
    one = min((r for r in ones if "error" not in r), key=lambda r: r["seconds"], default=ones[0])
    fixed = one["seconds"] - one.get("timing_s", {}).get("compute", 0.0) if "error" not in one else None
    res = {"help_s": min(helps), "one_layer_s": one.get("seconds"), "one_layer_fixed_s": fixed,
           "one_layer_cpu_s": one.get("cpu_s"), "load_avg": one.get("load_avg", load_avg())}
    if args.baseline_src is not None:
        old = [measure_cli(path, args, False, ("--layers", "0"), src=args.baseline_src) for _ in range(2)]
        best = min((r for r in old if "error" not in r), key=lambda r: r["seconds"], default=old[0])
        res.update(base_one_layer_s=best.get("seconds"), base_one_layer_cpu_s=best.get("cpu_s"),
                   base_load_avg=best.get("load_avg"))
    return res


def _say(label: str, r: dict, key: str = "seconds", scale: float = 1.0) -> None:
    if "error" in r:
        print(f"    {label:28s} error: {r['error'][:100]}", flush=True)
    else:
        c = r.get("compute") or {}
        how = f"   device {c.get('device', 'cpu')}, threads {c.get('threads', '?')}" if "compute" in r else ""
        print(f"    {label:28s} {r[key] * scale:9.2f} s   peak RSS {r.get('peak_rss_mib', 0):6.0f} MiB   "
              f"load average {r['load_avg']}{how}", flush=True)


def run_model(label: str, args: argparse.Namespace) -> dict | None:
    shape = SHAPES[label]
    path = args.dir / label
    written = args.big_layers if label.startswith("llama-70b") else None
    if written is not None:
        shape = (written, *shape[1:])
        path = args.dir / f"{label}-first{written}"
    if not (path / "model.safetensors.index.json").exists():
        need, free = attention_bytes(shape), shutil.disk_usage(args.dir).free
        print(f"\n{label}: needs {need / GIB:.1f} GiB of disk, {free / GIB:.1f} GiB free", flush=True)
        if free < need * 1.1:
            print("  skipped: not enough free disk (use --big-layers N for a prefix)")
            return None
    t0 = time.perf_counter()
    generate(path, shape[3], mlp=False, shape=SHAPES[label], written=written)
    n_layers, d, h, kv, _ = shape
    print(f"\n== {label}: {n_layers} layers, d={d}, heads={h}, kv heads={kv}, dh={DH}, bf16 attention "
          f"{attention_bytes(shape) / GIB:.1f} GiB in {len(list(path.glob('*.safetensors')))} shards "
          f"(ready in {time.perf_counter() - t0:.0f} s)", flush=True)
    measure_child("floor", path, args, False)  # warm the page cache (as far as it holds the checkpoint)
    res: dict = {"model": label, "layers": n_layers}
    modes = ("idle", "load", "load2") if label == "llama2-7b-8l" else ("idle", "load")
    for mode in ("idle",) if args.no_load else modes:
        load = {"idle": 0, "load": 1, "load2": 2}[mode]
        print(f"  [{mode}]", flush=True)
        r = res[mode] = {"floor": measure_child("floor", path, args, load)}
        _say("I/O floor", r["floor"])
        r["ours"] = measure_cli(path, args, load)
        _say("headrank whole process", r["ours"])
        if mode != "load2" and label.startswith("llama2-7b"):  # today's route, side by side
            r["f64"] = measure_cli(path, args, load, ("--precision", "float64"))
            _say("headrank --precision float64", r["f64"])
        if args.baseline_src is not None and mode != "load2":
            r["base"] = measure_cli(path, args, load, src=args.baseline_src)
            _say("baseline tree, whole process", r["base"])
        if not (load and label.startswith("llama-70b")) and mode != "load2":
            r["ours2"] = measure_cli(path, args, load, ("--threads", "2"))
            _say("headrank --threads 2", r["ours2"])
        if label == "llama2-7b-8l":
            r["ours1"] = measure_cli(path, args, load, ("--threads", "1"))
            _say("headrank --threads 1", r["ours1"])
        if not load and label == "llama2-7b-8l":  # what the figures cost
            r["noplots"] = measure_cli(path, args, load, ("--no-plots",))
            _say("headrank --no-plots", r["noplots"])
        if label == "llama2-7b-8l" and args.tl_layers > 0 and not load:
            for name in ("tl", "tl1"):
                r[name] = measure_child(name, path, args, load)
                _say(f"TransformerLens {'1 thread' if name == 'tl1' else 'default threads'} /layer", r[name],
                     "per_layer_s")
        if label == "llama2-7b-8l" and args.dense_heads > 0 and not load:
            r["dense"] = measure_child("dense", path, args, load)
            _say("dense float64 SVD /layer", r["dense"], "per_layer_s")
    if label == "llama2-7b-8l":
        res["startup"] = measure_startup(path, args)
        s = res["startup"]
        print(f"    start-up: --help {s['help_s']:.2f} s; 1-layer run {s['one_layer_s']:.2f} s "
              f"({s['one_layer_cpu_s']:.2f} s CPU), of which fixed {s['one_layer_fixed_s']:.2f} s (load average "
              f"{s['load_avg']})", flush=True)
        if "base_one_layer_s" in s:
            print(f"    baseline 1-layer run {s['base_one_layer_s']:.2f} s ({s['base_one_layer_cpu_s']:.2f} s CPU; "
                  f"load average {s['base_load_avg']})", flush=True)
        one, eight = s.get("one_layer_cpu_s"), (res["idle"].get("ours1") or {}).get("cpu_s")
        if one is not None and eight is not None:  # load-independent where the cores are not oversubscribed
            s["cpu_per_layer_s"] = (eight - one) / (n_layers - 1)
            s["cpu_fixed_s"] = one - s["cpu_per_layer_s"]
            print(f"    CPU seconds: {s['cpu_per_layer_s']:.3f} a layer, {s['cpu_fixed_s']:.2f} fixed (the process, "
                  f"its figure process and one layer's read), from the 8-layer --threads 1 and 1-layer runs", flush=True)
    print("  RESULT_JSON " + json.dumps(res), flush=True)
    return res


def _ratio(a: dict, b: dict, ka: str = "seconds", kb: str = "seconds", fa: float = 1.0) -> float | None:
    if not a or not b or "error" in a or "error" in b:
        return None
    return a[ka] * fa / b[kb]


def _shares(r: dict) -> str:
    t = r.get("timing_s") or {}
    if not t.get("wall"):
        return "-"
    return (f"compute waited on reads {100 * t['compute_waited_on_read'] / t['wall']:.0f} %, reads waited on "
            f"compute {100 * t['read_waited_on_compute'] / t['wall']:.0f} %")


def verdicts(results: dict[str, dict]) -> list[str]:
    """The issue's targets, met or missed, from the ratios measured in this run."""
    out = []

    def check(what: str, value: float | None, limit: float, at_most: bool = True) -> None:
        if value is None:
            out.append(f"{what}: not measured")
        else:
            ok = value <= limit if at_most else value >= limit
            out.append(f"{what}: {value:.3f} ({'<=' if at_most else '>='} {limit:g}) {'met' if ok else 'MISSED'}")

    r8, r32, r70 = (results.get(k) for k in ("llama2-7b-8l", "llama2-7b", "llama-70b-attn"))
    for name, r in results.items():
        shas = {x["sv_sha"] for m in ("idle", "load", "load2") for k in ("ours", "ours1", "ours2", "noplots")
                if (x := (r.get(m) or {}).get(k)) and "sv_sha" in x}
        threads = sorted({t for m in ("idle", "load", "load2") for k in ("ours", "ours1", "ours2")
                          for t in ((r.get(m) or {}).get(k) or {}).get("compute", {}).get("threads", [])})
        out.append(f"{name}: spectra.npz bit-identical over every run (threads per layer seen: {threads}): "
                   + ("met" if len(shas) == 1 else f"MISSED ({len(shas)} different results)" if shas else "not measured"))
    if r8:
        i = r8["idle"]
        s = r8.get("startup") or {}
        check("1-layer run, whole process, seconds", s.get("one_layer_s"), 1.0)
        for mode in ("idle", "load"):
            if mode in r8:
                check(f"8-layer 7B, --precision float64 / auto (defaults), {mode}: speed-up of auto",
                      _ratio(r8[mode].get("f64"), r8[mode].get("ours")), 1.0, at_most=False)
        check("1-layer run, fixed cost (whole process minus the layer's compute), seconds",
              s.get("one_layer_fixed_s"), 0.5)
        check("8-layer 7B, defaults / --threads 2, idle (within 10 %)", _ratio(i.get("ours"), i.get("ours2")), 1.10)
        for mode, what in (("load", "one"), ("load2", "two")):
            if mode in r8:
                if mode == "load":
                    check("8-layer 7B, defaults / floor, beside one CPU-bound process",
                          _ratio(r8[mode].get("ours"), r8[mode]["floor"]), 3)
                check(f"8-layer 7B, defaults / --threads 1, beside {what} CPU-bound process(es)",
                      _ratio(r8[mode].get("ours"), r8[mode].get("ours1")), 1.3)
        for r, name in ((r8, "8-layer"), (r32, "32-layer")):
            if r and "base" in r["idle"]:
                check(f"{name} 7B, baseline tree / headrank (defaults), idle: speed-up",
                      _ratio(r["idle"].get("base"), r["idle"].get("ours")), 1.0, at_most=False)
    for ours, how in (("ours", "defaults"), ("ours2", "--threads 2")):
        if r8:
            i = r8["idle"]
            check(f"8-layer 7B, whole process ({how}) / floor, idle", _ratio(i.get(ours), i["floor"]), 2.5)
            check(f"8-layer 7B, TransformerLens (default threads) / headrank ({how}), idle",
                  _ratio(i.get("tl", {}), i.get(ours), "per_layer_s", fa=r8["layers"]), 10, at_most=False)
        if r32:
            check(f"32-layer 7B, whole process ({how}) / floor, idle",
                  _ratio(r32["idle"].get(ours), r32["idle"]["floor"]), 2.0)
            if "load" in r32:
                check(f"32-layer 7B, whole process ({how}) / floor, beside a CPU-bound process",
                      _ratio(r32["load"].get(ours), r32["load"]["floor"]), 3)
    if r70:
        for ours, how in (("ours", "defaults"), ("ours2", "--threads 2")):
            o = r70["idle"].get(ours) or {"error": "not run"}
            check(f"70B shape, whole process ({how}) / floor, idle", _ratio(o, r70["idle"]["floor"]), 2)
            check(f"70B shape ({how}), peak RSS GiB", None if "error" in o else o["peak_rss_mib"] / 1024, 1.5)
    return out


def table(results: dict[str, dict]) -> None:
    """One markdown table: every shape and mode side by side, ratios to the floor and to headrank."""
    cols = [(k, m) for k, r in results.items() for m in ("idle", "load") if m in r]
    print("\n| | " + " | ".join(f"{k}, {m}" for k, m in cols) + " |")
    print("| --- |" + " --- |" * len(cols))

    def row(label: str, cell) -> None:
        print(f"| {label} | " + " | ".join(cell(results[k], results[k][m]) for k, m in cols) + " |")

    def secs(name: str, key: str = "seconds", per_layer: bool = False, vs: str | None = None):
        def cell(model: dict, r: dict) -> str:
            x = r.get(name)
            if not x:
                return "—"
            if "error" in x:
                return "error"
            v = x[key] * (model["layers"] if per_layer else 1)
            ref = r.get(vs) if vs else None
            if ref and "error" not in ref:
                return f"{v:.2f} s ({v / ref['seconds']:.1f} ×)"
            return f"{v:.2f} s"
        return cell

    row("I/O floor: read the attention tensors, to float32", secs("floor"))
    row("headrank spectra --out, whole process (× floor)", secs("ours", vs="floor"))
    row("headrank --precision float64 (× floor)", secs("f64", vs="floor"))
    row("headrank --threads 2 (× floor)", secs("ours2", vs="floor"))
    row("headrank --threads 1 (× floor)", secs("ours1", vs="floor"))
    row("baseline tree, defaults (× floor)", secs("base", vs="floor"))
    row("headrank --no-plots (× floor)", secs("noplots", vs="floor"))
    row("TransformerLens `FactoredMatrix.S`, default threads, extrapolated (× headrank)",
        secs("tl", "per_layer_s", True, vs="ours"))
    row("TransformerLens, 1 thread, extrapolated (× headrank)", secs("tl1", "per_layer_s", True, vs="ours"))
    row("dense float64 SVD of the d × d product, extrapolated (× headrank)",
        secs("dense", "per_layer_s", True, vs="ours"))
    row("headrank CPU seconds (user + sys, with its figure process)",
        lambda m, r: "—" if "error" in r["ours"] else f"{r['ours']['cpu_s']:.1f} s")
    row("peak RSS of headrank", lambda m, r: "—" if "error" in r["ours"] else f"{r['ours']['peak_rss_mib'] / 1024:.2f} GiB")
    row("stream: compute waited on reads / reads on compute", lambda m, r: _shares(r["ours"]).replace(
        "compute waited on reads ", "").replace("reads waited on compute ", "").replace(", ", " / "))
    row("load average before headrank (1, 5, 15 min)", lambda m, r: r["ours"].get("load_avg", "—"))
    row("headrank device, threads per layer", lambda m, r: "—" if "error" in r["ours"] else
        f"{r['ours'].get('compute', {}).get('device')}, {r['ours'].get('compute', {}).get('threads')}")
    row("headrank precision: heads auto / fallback / float64, largest bound", lambda m, r: "—" if "error" in r["ours"]
        else "{heads_auto} / {heads_fallback} / {heads_float64}, {largest_bound:.1e}".format(
            **{"heads_auto": "?", "heads_fallback": "?", "heads_float64": "?", "largest_bound": float("nan"),
               **r["ours"].get("precision", {})}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/headrank-bench"))
    ap.add_argument("--dense-heads", type=int, default=2)
    ap.add_argument("--tl-layers", type=int, default=1)
    ap.add_argument("--models", default="llama2-7b-8l,llama2-7b,llama-70b-attn")
    ap.add_argument("--no-load", action="store_true", help="skip the runs beside a CPU-bound process")
    ap.add_argument("--big-layers", type=int, default=None, help="write and analyse only this many 70B layers")
    ap.add_argument("--child", nargs=2, metavar=("NAME", "PATH"))
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="a source tree (its src/ directory) to run side by side, e.g. the commit before a change")
    ap.add_argument("--no-bytecode-cache", dest="bytecode_cache", action="store_false",
                    help="let every headrank process compile its modules again (as PYTHONDONTWRITEBYTECODE=1 "
                         "with a source checkout does); default: a bytecode cache under DIR, as installed")
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args)

    args.dir.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cores {os.cpu_count()}, "
          f"load average {load_avg()}; GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'} "
          "(every number below is the CPU's unless a line says otherwise)", flush=True)
    warm_bytecode(args)
    print(f"bytecode: {'cached under ' + str(args.dir / 'pycache') if args.bytecode_cache else 'compiled by every process'}",
          flush=True)
    results = {m: r for m in args.models.split(",") if m and (r := run_model(m, args))}
    table(results)
    print("\ntargets (ratios measured in this run):")
    for line in verdicts(results):
        print("  " + line)


if __name__ == "__main__":
    main()
