"""Benchmark: reading a LLaMA-2-7B-shaped checkpoint from a Hub-like server with a bandwidth limit,
the whole download then the analysis, against ``headrank spectra ID --remote`` (HTTP ranges).

    python benchmarks/bench_remote.py [--layers 4] [--bandwidth 50] [--kv 32] [--dir DIR]

It writes (once, then reuses) a bf16 checkpoint of the 7B shape sharded like a release (d = 4096,
32 heads, dh = 128, FFN 11008, vocabulary 32000; MLP and embeddings present, zeros) with
``--layers`` layers (32 = the whole model, 13.5 GB; the default 4 keeps the run to a few
minutes). tests/io/hubserver.py serves it on 127.0.0.1 from a separate process, every body sent
through one token bucket of ``--bandwidth`` MB/s, as ``/{repo}/resolve/{revision}/{file}`` with
redirects. Contenders, one after the other, same server, same run:

- download: ``huggingface_hub.hf_hub_download`` of every file (what ``hf download`` does) into a
  fresh cache, then ``headrank.analyze`` of the snapshot;
- remote:   ``headrank.analyze(ID, remote=True)``: config, index, headers, attention tensors;
- local:    ``headrank.analyze`` of the files already on disk (no network): the compute alone.

Printed: wall seconds, bytes the server sent, and the ratios. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
REPO = "bench/llama2-7b-shape"


def serve(directory: str, bandwidth: float, conn) -> None:
    """The server process: serve ``directory`` as REPO@main until told to stop."""
    from tests.io.hubserver import HubServer

    with HubServer(bandwidth=bandwidth) as srv:
        srv.add(REPO, "main", Path(directory))
        conn.send(srv.url)
        while True:
            msg = conn.recv()
            if msg == "stop":
                break
            if msg == "reset":
                srv.reset()
            conn.send(srv.sent)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/headrank-bench-remote"))
    ap.add_argument("--layers", type=int, default=4, help="layers written and read (32: the whole 7B)")
    ap.add_argument("--bandwidth", type=float, default=50.0, help="server bandwidth, MB/s (all bodies together)")
    ap.add_argument("--kv", type=int, default=32, help="kv heads (8: the GQA variant)")
    args = ap.parse_args()
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.pop(k, None)
    from bench_spectra import SHAPES, generate

    shape = SHAPES["llama2-7b"]
    path = args.dir / f"l{args.layers}-kv{args.kv}"
    generate(path, args.kv, mlp=True, shape=(args.layers, *shape[1:3], args.kv, shape[4]), written=args.layers)
    files = sorted(p.name for p in path.iterdir() if p.is_file())
    total = sum((path / f).stat().st_size for f in files)
    print(f"checkpoint: {path} ({args.layers} layers, {len(files)} files, {total / 1e9:.2f} GB); "
          f"server: {args.bandwidth:g} MB/s; load average {load_avg()}", flush=True)

    here, there = mp.Pipe()
    server = mp.get_context("spawn").Process(target=serve, args=(str(path), args.bandwidth * 1e6, there), daemon=True)
    server.start()
    url = here.recv()
    os.environ["HF_ENDPOINT"] = url

    def sent() -> int:
        here.send("count")
        return here.recv()

    from huggingface_hub import hf_hub_download

    import headrank

    results = {}
    try:
        here.send("reset")
        here.recv()
        t = time.perf_counter()
        cache = Path(tempfile.mkdtemp(prefix="headrank-bench-cache-", dir=args.dir))
        for f in files:
            local = hf_hub_download(REPO, f, cache_dir=cache, endpoint=url)
        t_dl = time.perf_counter() - t
        res = headrank.analyze(Path(local).parent, threads=1)
        results["download"] = (time.perf_counter() - t, sent(), f"download {t_dl:.1f} s + analyse")
        shutil.rmtree(cache)

        here.send("reset")
        here.recv()
        t = time.perf_counter()
        rem = headrank.analyze(REPO, remote=True, threads=1)
        results["remote"] = (time.perf_counter() - t, sent(), f"{rem.meta['remote']['requests']} requests")
        same = all((rem.sv[p] == res.sv[p]).all() for p in ("qk", "ov"))

        t = time.perf_counter()
        headrank.analyze(path, threads=1)
        results["local"] = (time.perf_counter() - t, 0, "files already on disk, no network")
    finally:
        here.send("stop")
        server.join(timeout=10)

    base = results["download"][0]
    print(f"{'contender':<10} {'seconds':>9} {'bytes sent':>16} {'share':>7} {'vs download':>12}  note")
    for name, (sec, n, note) in results.items():
        print(f"{name:<10} {sec:9.2f} {n:16,d} {n / total:7.1%} {base / sec:11.2f}x  {note}")
    print(f"remote spectra identical to the downloaded checkpoint's: {same}; load average {load_avg()}")


if __name__ == "__main__":
    main()
