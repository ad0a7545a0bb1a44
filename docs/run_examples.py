"""Run a documentation page's examples as printed, each in its own process (``make doc-examples``).

Every ``console`` block's ``$ `` lines (through ``bash``, the virtual environment's ``bin`` first
on ``PATH``) and every ``python`` block (``python -c``) of the page run in order, in one fresh
directory whose name holds a space, so a later example reads what an earlier one wrote, as a
reader following the page would. ``HF_HUB_OFFLINE=1``; the cache is a fresh one inside the
directory, so no cached baseline from an earlier run is reused. A block that is only a
fragment of a session must not be on the page: every block runs.

    python docs/run_examples.py docs/compress.md --record docs/compress_examples.json

``--skip TEXT`` leaves out the examples whose text holds TEXT (``tests/compress/test_compress_docs.py``
runs the page's MiniLM examples with ``--skip smollm2``). The record holds each example, its exit
status, wall seconds and the last lines of its output, the commit and the load average; the exit
status is 1 if any example failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def examples(page: Path) -> list[tuple[str, str]]:
    """``(kind, text)`` of every example of ``page`` in order: ``("console", one command)`` per
    ``$ `` line, ``("python", the block)`` per python block."""
    out: list[tuple[str, str]] = []
    for kind, body in re.findall(r"```(console|python)\n(.*?)```", page.read_text(), flags=re.S):
        if kind == "console":
            out += [("console", ln[2:]) for ln in body.splitlines() if ln.startswith("$ ")]
        else:
            out.append(("python", body))
    return out


def env(work: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "HEADRANK_CACHE": str(work / ".cache"), "MPLBACKEND": "Agg"}


def run(kind: str, text: str, work: Path, timeout: float) -> dict:
    """One example in its own process, in ``work``."""
    argv = ["bash", "-c", text] if kind == "console" else [sys.executable, "-c", text]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(argv, cwd=work, env=env(work), capture_output=True, text=True, timeout=timeout)
        rc, tail = r.returncode, (r.stdout + r.stderr).strip().splitlines()[-6:]
    except subprocess.TimeoutExpired:
        rc, tail = None, [f"still running after {timeout:.0f} s"]
    return {"kind": kind, "example": text.strip(), "rc": rc, "seconds": round(time.perf_counter() - t0, 1),
            "load_after": round(os.getloadavg()[0], 1), "tail": tail, "ok": rc == 0 and not any("Traceback" in ln for ln in tail)}


def run_page(page: Path, work: Path, *, skip: tuple[str, ...] = (), timeout: float = 7200) -> list[dict]:
    done = []
    for kind, text in examples(page):
        if any(s in text for s in skip):
            continue
        done.append(run(kind, text, work, timeout))
        print(f"[{'ok' if done[-1]['ok'] else 'FAILED'}] {done[-1]['seconds']:>7.1f} s  "
              f"{text.strip().splitlines()[0][:100]}", flush=True)
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("--record", type=Path, help="write the record (JSON) here")
    ap.add_argument("--skip", action="append", default=[], help="leave out examples holding this text")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per example")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="doc examples ") as tmp:
        done = run_page(a.page, Path(tmp), skip=tuple(a.skip), timeout=a.timeout)
    if a.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        a.record.write_text(json.dumps({"page": str(a.page), "commit": commit.strip(), "cpus": os.cpu_count(),
                                        "examples": done}, indent=2) + "\n")
    return 0 if all(d["ok"] for d in done) else 1


if __name__ == "__main__":
    sys.exit(main())
