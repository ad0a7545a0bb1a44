"""Peak memory of ``analyze(..., vectors=True)`` against ``vectors=False``, side by side in one run.

Issue 46's red team measured, on an 805 MB LLaMA, a peak RSS of 1,533 MiB with vectors against
289 MiB without, for 768 MiB of vectors: 1.6x the vectors, where the guard in
:class:`headrank.analysis.scan._Vectors` counts 1x. This builds a LLaMA of that shape from a
config with random weights (12 layers, d = 2048, 16 heads of 128: exactly 768 MiB of float32
vectors; ``--dtype`` float32 or bfloat16, the MLP sized so the file is about 805 MB), written
once under ``--dir``, then runs each analysis in a fresh interpreter and prints its RSS after
the imports ("at load"), its peak RSS, the vectors' bytes, what the guard counts, and the
ratio (peak with - peak without) / vectors. Run:
``PYTHONPATH=src python benchmarks/bench_vectors.py --dtype float32``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

LAYERS, D, HEADS, VOCAB = 12, 2048, 16, 64
MLP = {"float32": 16, "bfloat16": 2730}  # intermediate sizes: each file about 805 MB

# VmHWM, not getrusage's ru_maxrss: ru_maxrss survives exec, so a child of a large parent (this
# script, once it has built the model) reports the parent's peak
CHILD = r"""
import json, sys
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key + ":")) * 1024
from headrank.analysis.scan import analyze
at_load = status("VmRSS")
res = analyze(sys.argv[1], vectors=sys.argv[2] == "1", threads=1)
vec = sum(a.nbytes for d in (res.vectors or {}).values() for a in d.values())
print(json.dumps({"at_load": at_load, "peak": status("VmHWM"), "after": status("VmRSS"), "vectors": vec}))
"""


def build(path: Path, dtype: str) -> Path:
    if (path / "model.safetensors").exists():
        return path
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=HEADS, intermediate_size=MLP[dtype], vocab_size=VOCAB,
                         tie_word_embeddings=False)
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(getattr(torch, dtype))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.save_pretrained(path, safe_serialization=True)
    return path


def run(path: Path, vectors: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), "1" if vectors else "0"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=sorted(MLP), default="float32")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/headrank-bench-vectors"))
    a = ap.parse_args()
    path = build(a.dir / a.dtype, a.dtype)
    size = (path / "model.safetensors").stat().st_size
    from types import SimpleNamespace

    from headrank.analysis.scan import _Vectors

    vec, guard = _Vectors.memory(SimpleNamespace(n_heads=HEADS, head_dim=D // HEADS, d=D), LAYERS)
    without, with_ = run(path, False), run(path, True)
    mib = 2**20
    extra = with_["peak"] - without["peak"]
    print(f"{a.dtype} LLaMA, {size / 1e6:.0f} MB file; vectors {with_['vectors'] / mib:.0f} MiB "
          f"({vec / mib:.0f} MiB by the guard's count)")
    for name, r in (("vectors=False", without), ("vectors=True", with_)):
        print(f"  {name:14s} RSS at load {r['at_load'] / mib:6.0f} MiB, peak {r['peak'] / mib:6.0f} MiB, "
              f"after {r['after'] / mib:6.0f} MiB")
    print(f"  peak with - peak without = {extra / mib:.0f} MiB = {extra / with_['vectors']:.2f}x the vectors; "
          f"the guard counts {guard / mib:.0f} MiB = {guard / vec:.2f}x ({'enough' if guard >= extra else 'TOO LITTLE'})")


if __name__ == "__main__":
    main()
