"""Reading safetensors tensors with ``pread`` (headrank.io.stfile, safe against a file truncated
while read) against safetensors' own memory-mapped ``safe_open``, side by side in one run.

Writes a checkpoint-shaped file (``--tensors`` float32 tensors of ``--dim`` x ``--dim``), then
reads every tensor ``--repeat`` times with each reader, alternating (the page cache is warm for
both), and prints the median seconds per pass and their ratio. Run:
``PYTHONPATH=src python benchmarks/bench_stfile.py``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from headrank.io.stfile import SafetensorsFile


def one_pass_mmap(path: Path, names: list[str]) -> float:
    t = time.perf_counter()
    with safe_open(str(path), framework="pt") as h:
        for n in names:
            h.get_tensor(n).sum()
    return time.perf_counter() - t


def one_pass_pread(path: Path, names: list[str]) -> float:
    t = time.perf_counter()
    h = SafetensorsFile(path)
    for n in names:
        h.get_tensor(n).sum()
    h.close()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=48)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        torch.manual_seed(0)
        save_file({f"t{i}": torch.randn(a.dim, a.dim) for i in range(a.tensors)}, str(path))
        names = [f"t{i}" for i in range(a.tensors)]
        one_pass_mmap(path, names), one_pass_pread(path, names)  # warm the page cache
        mm, pr = [], []
        for _ in range(a.repeat):
            mm.append(one_pass_mmap(path, names))
            pr.append(one_pass_pread(path, names))
        m, p = statistics.median(mm), statistics.median(pr)
        mb = path.stat().st_size / 1e6
        print(f"{a.tensors} tensors, {mb:.0f} MB: safe_open (mmap) {m * 1e3:.1f} ms/pass, pread {p * 1e3:.1f} ms/pass, "
              f"pread/mmap = {p / m:.2f}")


if __name__ == "__main__":
    main()
