"""Profile of ``headrank.analyze`` on a few layers of a benchmark checkpoint (torch.profiler).

    python benchmarks/profile_spectra.py PATH [--layers 0-3] [--threads N] [--load] [--top 15]

Prints the operators with the most self CPU time and the wall time of each stage; ``--load``
runs one CPU-bound process beside it (as bench_spectra does). Writes nothing; the profiles
recorded in ``benchmarks/PROFILE.md`` were taken with it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from bench_load import cpu_load, load_avg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--layers", default="0-3")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from torch.profiler import ProfilerActivity, profile

    import headrank

    headrank.analyze(args.path, layers="0")  # warm imports and page cache
    print(f"load average before: {load_avg()}; torch threads {torch.get_num_threads()}; "
          f"concurrent CPU-bound process: {'yes' if args.load else 'no'}")
    with cpu_load(args.load), profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        headrank.analyze(args.path, layers=args.layers)
        wall = time.perf_counter() - t0
    print(f"wall {wall:.2f} s for layers {args.layers}; load average after: {load_avg()}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
