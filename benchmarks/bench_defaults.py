"""`headrank collapse minilm` with its default threads against `--threads 1` (and the old default
of 2 threads), each run beside one CPU-bound job (a pure-Python busy loop started here and ended
by its pid), interleaved in one run so that all see the same machine. Issue 27's target: the
default takes at most 1.3x the `--threads 1` time. The load average (1 min) is printed before
each run: the machine may be shared.

    python benchmarks/bench_defaults.py [--repeats 2] [--command "collapse minilm"] [--no-old]

(``--no-old`` leaves out the 2-thread variant, which can take many times longer on a busy machine.)
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

BURN = "import time\nt = time.time()\nwhile time.time() - t < 3600:\n    pass\n"
VARIANTS = {"default": [], "--threads 1": ["--threads", "1"], "--threads 2 (old default)": ["--threads", "2"]}


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def one(command: list[str], extra: list[str]) -> float:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "headrank", *command, "--quiet", *extra], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--command", default="collapse minilm")
    ap.add_argument("--no-old", action="store_true", help="leave out the old 2-thread default")
    a = ap.parse_args()
    variants = {k: v for k, v in VARIANTS.items() if not (a.no_old and "old" in k)}
    command = shlex.split(a.command)
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    times: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for r in range(a.repeats):
            for name, extra in variants.items():
                la = load()
                s = one(command, extra)
                times[name].append(s)
                print(f"repeat {r}  {name:<26} {s:7.1f} s   load average before: {la}", flush=True)
    finally:
        os.kill(burner.pid, signal.SIGTERM)
        burner.wait()
    base = statistics.median(times["--threads 1"])
    print(f"\n`headrank {a.command}` beside one CPU-bound process, median of {a.repeats}:")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:<26} {m:7.1f} s   {m / base:5.2f} x the --threads 1 time")


if __name__ == "__main__":
    main()
