"""Discovery time per model type, before and after, in one run (docs/architectures.md).

    PYTHONPATH=src python benchmarks/bench_discover.py --base /tmp/base/src [TYPE ...] [--slowest N]

Two worker processes, one per source tree (``--base``: an older checkout's ``src``; the other is
this tree's), each with transformers and its model-building modules imported once up front (that
import is timed and reported apart: a fresh ``headrank architectures --check`` pays it once). The
driver hands every type to both workers in turn, alternating which goes first, so the two see the
same load; each reports the wall seconds and the CPU seconds (all threads of the process,
``time.process_time``) of :func:`headrank.analysis.architectures.discover`, and the row it made.
Rows must agree (status, split, modules, position); the verification errors of both are printed.
The load average is printed with every type: the machine is shared, CPU seconds are the fairer
number. ``--profile DIR`` also writes a cProfile dump per type and version there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import load_avg  # noqa: E402

WORKER = r"""
import cProfile, json, os, signal, sys, time, warnings
warnings.filterwarnings("ignore")
t0, c0 = time.perf_counter(), time.process_time()
import transformers, transformers.modeling_utils  # noqa: F401  (the import every fresh check pays once)
transformers.logging.set_verbosity_error()
from headrank.analysis.architectures import discover
print(json.dumps({"import_wall": time.perf_counter() - t0, "import_cpu": time.process_time() - c0}), flush=True)
prof = os.environ.get("BENCH_PROFILE")
def alarm(*_):
    raise TimeoutError("over 600 s")
signal.signal(signal.SIGALRM, alarm)
for line in sys.stdin:
    mt = line.strip()
    pr = cProfile.Profile() if prof else None
    t, c = time.perf_counter(), time.process_time()
    signal.alarm(600)
    try:
        if pr: pr.enable()
        row = discover(mt)
    except TimeoutError as e:
        row = {"status": "timeout", "reason": str(e)}
    finally:
        if pr: pr.disable()
        signal.alarm(0)
    out = {"type": mt, "wall": time.perf_counter() - t, "cpu": time.process_time() - c,
           "row": {k: v for k, v in row.items() if k != "seconds"}}
    if pr:
        pr.dump_stats(os.path.join(prof, f"{mt}.{os.environ['BENCH_NAME']}.prof"))
    print(json.dumps(out, default=str), flush=True)
"""

SAME = ("status", "split", "modules", "position", "qk_norm", "dims", "kind", "rotary_style", "reason")
ERRS = ("max_logits_error", "max_values_error", "max_output_error", "max_band_error", "max_probability_error")


def _same(v: object) -> object:
    """A row's field as compared: a refusal's reason without its numbers (the error a refused
    candidate missed by depends on the random weights, which change with the sizes)."""
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", v) if isinstance(v, str) else v


def _worker(src: str, name: str, profile: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "BENCH_NAME": name}
    if profile:
        env["BENCH_PROFILE"] = profile
    return subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)


def _ask(p: subprocess.Popen, mt: str) -> dict:
    p.stdin.write(mt + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def slowest(n: int) -> list[str]:
    """The ``n`` types whose committed rows recorded the most seconds."""
    from headrank.io.generated import GENERATED

    rows = json.loads(GENERATED.read_text())["types"]
    return [k for k, _ in sorted(rows.items(), key=lambda kv: -float(kv[1].get("seconds") or 0))[:n]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("types", nargs="*")
    ap.add_argument("--base", required=True, help="src directory of the version to compare with")
    ap.add_argument("--new", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--slowest", type=int, default=0, help="add the N slowest types of the committed rows")
    ap.add_argument("--profile", default=None, help="directory for one cProfile dump per type and version")
    ap.add_argument("--json", default=None, help="write the measurements here")
    args = ap.parse_args()
    types = list(dict.fromkeys([*args.types, *slowest(args.slowest)]))
    ws = {"base": _worker(args.base, "base", args.profile), "new": _worker(args.new, "new", args.profile)}
    start = {k: json.loads(p.stdout.readline()) for k, p in ws.items()}
    print("imports (wall/cpu s): " + ", ".join(f"{k} {v['import_wall']:.1f}/{v['import_cpu']:.1f}"
                                                for k, v in start.items()) + f"; load {load_avg()}")
    print(f"{'type':28s} {'base wall':>9s} {'cpu':>6s} {'new wall':>9s} {'cpu':>6s}  same  load")
    res = []
    for j, mt in enumerate(types):
        order = ("base", "new") if j % 2 == 0 else ("new", "base")
        got = {k: _ask(ws[k], mt) for k in order}
        b, n = got["base"], got["new"]
        diff = [k for k in SAME if _same(b["row"].get(k)) != _same(n["row"].get(k))]
        res.append({"type": mt, "base": b, "new": n, "differs": diff, "load": load_avg()})
        print(f"{mt:28s} {b['wall']:9.2f} {b['cpu']:6.2f} {n['wall']:9.2f} {n['cpu']:6.2f}  "
              f"{'yes' if not diff else 'NO ' + ','.join(diff)}  {load_avg()}  {n['row'].get('status')}", flush=True)
        if diff:
            for k in diff:
                print(f"    {k}: base {b['row'].get(k)!r:.150} | new {n['row'].get(k)!r:.150}")
        errs = [f"{k[4:-6]} {b['row'].get(k)}/{n['row'].get(k)}" for k in ERRS if k in b["row"] or k in n["row"]]
        if errs:
            print("    errors base/new: " + ", ".join(errs))
    for p in ws.values():
        p.stdin.close()
        p.wait()
    for k in ("base", "new"):
        walls, cpus = [r[k]["wall"] for r in res], [r[k]["cpu"] for r in res]
        print(f"{k}: median wall {statistics.median(walls):.2f} s, cpu {statistics.median(cpus):.2f} s; "
              f"max wall {max(walls):.1f}, cpu {max(cpus):.1f}; over 10 s: {sum(w > 10 for w in walls)} wall, "
              f"{sum(c > 10 for c in cpus)} cpu (of {len(res)})")
    if args.json:
        Path(args.json).write_text(json.dumps({"imports": start, "types": res}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
