"""Discover and verify the attention layout of every causal-LM, masked-LM and sequence-to-sequence
model type of the installed transformers, and write the generated rows
(src/headrank/io/layouts_generated.json).

    PYTHONPATH=src python benchmarks/discover_all.py [TYPE ...] [--out FILE]

Each type is built tiny, run, matched and verified in this process (at most 120 s each, else
refused as too slow); the wall seconds each took are kept in the row (``seconds``), so the file
also records how long discovery takes per type; the CPU seconds and the load average are printed
beside them (the machine is shared: CPU seconds are the fairer number). Before/after comparisons:
``benchmarks/bench_discover.py``. See docs/architectures.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings

import transformers

from headrank.analysis.architectures import discover
from headrank.analysis.discover import known_types
from headrank.analysis.discover_seq2seq import seq2seq_types
from headrank.io.generated import GENERATED, save_rows


def _alarm(*_):
    raise TimeoutError("discovery took over 120 s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("types", nargs="*")
    ap.add_argument("--out", default=str(GENERATED))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    signal.signal(signal.SIGALRM, _alarm)
    types = args.types or sorted({*known_types(), *seq2seq_types()})
    counts: dict[str, int] = {}
    for mt in types:
        cpu = time.process_time()
        signal.alarm(120)
        try:
            row = discover(mt)
        except TimeoutError as e:
            row = {"model_type": mt, "transformers": transformers.__version__, "status": "refused", "reason": str(e)}
        finally:
            signal.alarm(0)
        counts[row["status"]] = counts.get(row["status"], 0) + 1
        save_rows(__import__("pathlib").Path(args.out), {mt: row}, transformers.__version__)
        cpu = time.process_time() - cpu
        print(f"{mt:30s} {row['status']:9s} {row.get('seconds', 0):6.1f}s wall {cpu:6.1f}s cpu  load "
              f"{os.getloadavg()[0]:5.2f}  {row.get('reason', '')[:90]}", flush=True)
    print(counts, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
