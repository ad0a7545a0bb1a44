"""Same-run A/B of two headrank source trees on a few layers of a benchmark checkpoint.

    python benchmarks/bench_before_after.py PATH --before OLD_SRC [--layers 0-7] [--repeats 1]

Each run is a fresh process (``PYTHONPATH`` = the tree's ``src``), idle and beside one
CPU-bound process; the I/O floor of the same layers is measured alongside. OLD_SRC comes from
e.g. ``git archive <commit> src | tar -x -C /tmp/old``. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_load import cpu_load, load_avg

OURS = "import headrank; headrank.analyze({path!r}, layers={layers!r})"
FLOOR = """
from headrank.io.checkpoint import Checkpoint
from headrank.io.layouts import AttentionReader
from headrank.analysis.scan import parse_layers
r = AttentionReader(Checkpoint({path!r}))
for i in parse_layers({layers!r}, r.dims.n_layers):
    for t in (r.ckpt.get(n) for n in r.tensor_names(i).values()):
        t.float()
    r.ckpt.release()
"""


def timed(code: str, src: Path, load: bool) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    prog = f"import time; t0 = time.perf_counter()\n{code}\nprint('T', time.perf_counter() - t0)"
    before = load_avg()
    with cpu_load(load):
        out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split("T ")[-1]), before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path")
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    ap.add_argument("--layers", default="0-7")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    rows = {"floor": (FLOOR, args.after), "before": (OURS, args.before), "after": (OURS, args.after)}
    print(f"{args.path}, layers {args.layers}; seconds inside the process (its imports included), best of {args.repeats}")
    for mode in ("idle", "load"):
        res = {}
        for name, (code, src) in rows.items():
            best = min(timed(code.format(path=args.path, layers=args.layers), src, mode == "load")
                       for _ in range(args.repeats))
            res[name] = best
            print(f"  {mode:4s} {name:6s} {best[0]:8.2f} s  ({best[0] / res['floor'][0]:5.2f} x floor)  "
                  f"load average before {best[1]}", flush=True)
        time.sleep(1)


if __name__ == "__main__":
    main()
