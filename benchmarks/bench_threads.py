"""Wall time of `headrank train` (recall, LM and ViT defaults, a fixed number of steps) at 1 and 2
torch threads, with the machine as it is ("idle": no job of ours besides the run) and with one
concurrent CPU-bound job (a pure-Python busy loop started here and ended by its pid). The load
average (`/proc/loadavg`, 1 min) is recorded before each run: the machine is shared.

    python benchmarks/bench_threads.py [--steps 200] [--repeats 2] [--out benchmarks/THREADS.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BURN = "import time\nt = time.time()\nwhile time.time() - t < 3600:\n    pass\n"


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def one(kind: str, steps: int, threads: int, out: Path) -> float:
    cmd = [sys.executable, "-m", "headrank", "train", kind, "--out", str(out), "--steps", str(steps),
           "--threads", str(threads), "--device", "cpu", "--quiet", "--log", "none",
           "--track-every", str(steps), "--checkpoint-every", str(steps)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kinds", default="recall,lm,vit")
    ap.add_argument("--busy", default="no,yes", help="phases: no (as the machine is), yes (+1 busy loop)")
    ap.add_argument("--out", default=str(Path(__file__).with_name("THREADS.md")))
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for busy in [b == "yes" for b in a.busy.split(",")]:
            burner = subprocess.Popen([sys.executable, "-c", BURN]) if busy else None
            try:
                for kind in a.kinds.split(","):
                    for threads in (1, 2):
                        for r in range(a.repeats):
                            la = load()
                            s = one(kind, a.steps, threads, Path(tmp) / f"{kind}-{threads}-{busy}-{r}")
                            rows.append((kind, threads, "1 busy loop" if busy else "none", r, la, s))
                            print(rows[-1], flush=True)
            finally:
                if burner is not None:
                    burner.kill()
                    burner.wait()
    lines = [f"# `headrank train` wall time, {a.steps} steps, 1 vs 2 torch threads", "",
             f"{os.cpu_count()} cores, shared with other jobs; load = 1-minute load average just before the run.",
             "Command: `headrank train KIND --steps N --threads T --device cpu --log none --quiet` (defaults "
             "otherwise; one rank measurement and one checkpoint at the end).", "",
             "| task | threads | concurrent job of ours | run | load before | wall s |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    lines += [f"| {k} | {t} | {b} | {r} | {la} | {s:.1f} |" for k, t, b, r, la, s in rows]
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
