"""Benchmark: what the rotary-band table (``rotary.csv``) adds to ``headrank.analyze``, side by
side in one run: ``rotary=True`` (the default) against ``rotary=False`` on random checkpoints
written here with transformers (no download).

    python benchmarks/bench_rotary.py [--d 2048] [--layers 4] [--reps 3] [--threads 1]

Shapes: a full-rotary Llama (the band energies come from row norms the scan has already: the
table should cost nothing) and GPT-NeoX with ``rotary_pct`` 0.25 and 0.5 (the non-rotary part's
metric table is one more QK-like product, on ``(1 − pct)·dh`` dimensions). Runs alternate and the
minimum of ``--reps`` is kept; uptime's load average is printed (a shared machine is never idle).
Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _models(d: int, layers: int):
    import transformers as tf

    small = dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=d // 128, intermediate_size=64,
                 vocab_size=16)
    return {"llama (full rotary, GQA 4)": (tf.LlamaModel, tf.LlamaConfig(**small, num_key_value_heads=max(1, d // 512))),
            "gpt_neox rotary_pct 0.25": (tf.GPTNeoXModel, tf.GPTNeoXConfig(**small, rotary_pct=0.25)),
            "gpt_neox rotary_pct 0.5": (tf.GPTNeoXModel, tf.GPTNeoXConfig(**small, rotary_pct=0.5))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from headrank.analysis.scan import analyze

    with tempfile.TemporaryDirectory() as tmp:
        for name, (cls, cfg) in _models(args.d, args.layers).items():
            torch.manual_seed(0)
            path = Path(tmp) / name.replace(" ", "_")
            cls(cfg).save_pretrained(path)
            best = {True: float("inf"), False: float("inf")}
            for _ in range(args.reps):
                for rotary in (False, True):
                    t = time.perf_counter()
                    analyze(path, threads=args.threads, rotary=rotary)
                    best[rotary] = min(best[rotary], time.perf_counter() - t)
            print(f"{name:28s} d={args.d} layers={args.layers}: --no-rotary {best[False]:.2f} s, rotary "
                  f"{best[True]:.2f} s, ratio {best[True] / best[False]:.2f}  (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
