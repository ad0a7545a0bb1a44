"""Where a layer's CPU goes on spectra's numpy route, against its arithmetic floor.

    python benchmarks/profile_spectra.py PATH [--layers 0-1] [--repeat 5]

For the given layers of a checkpoint (e.g. bench_spectra.py's 7B shape): the thread CPU of the
reader (``read_layer`` into reused buffers), of ``layer_metrics`` on one thread (best and median
of ``--repeat``), its split by stage (cProfile timed by thread CPU: the float64 Gram, the bfloat16
upcast, Cholesky, the certificate, QR fallbacks, the core SVDs, the rest), and the floor: the
same symmetric rank-k Grams (BLAS ``dsyrk``) on float64 copies made beforehand, nothing else.
CPU time, not wall time: it holds on a shared machine as long as the cores are not
oversubscribed (prints the load average). Writes nothing.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path

STAGES = {  # cProfile function (file suffix, name) → stage; self time of each
    ("linalg.py", "_factor_root"): "Gram (dsyrk) and checks",
    ("bf16.py", "to_float32"): "bfloat16 → float32 shift",
    ("linalg.py", "_float64_rows"): "float64 upcast copy",
    ("_linalg.py", "cholesky"): "Cholesky",
    ("linalg.py", "_triu_inv"): "certificate (R⁻¹, bounds)",
    ("_linalg.py", "inv"): "certificate (R⁻¹, bounds)",
    ("linalg.py", "_certified"): "certificate (R⁻¹, bounds)",
    ("linalg.py", "_gram_certified"): "certificate (R⁻¹, bounds)",
    ("_linalg.py", "qr"): "QR fallback",
    ("_linalg.py", "svd"): "core SVDs",
    ("linalg.py", "_metrics"): "metrics (products, norms)",
    ("metrics.py", "from_singular_values"): "metrics (products, norms)",
}


def _stages(prof: cProfile.Profile, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for (file, _, name), (_, _, tottime, _, _) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        stage = next((v for (f, fn), v in STAGES.items() if file.endswith(f) and name == fn), "other")
        out[stage] = out.get(stage, 0.0) + tottime / n
    return out


def _floor(hw) -> float:
    """Thread CPU of the float64 Grams alone (each head's ``X_hᵀ X_h`` by dsyrk), inputs prepared."""
    import numpy as np

    from headrank.util.bf16 import as_float

    mats = []
    for x, rows in ((hw.wq, True), (hw.wk, True), (hw.wv, True), (hw.p, False)):
        f = as_float(x)  # (heads, dh, d) rows, or (heads, d, dh) column blocks
        mats += [(np.ascontiguousarray(f[h]), rows) for h in range(f.shape[0])]
    best = float("inf")
    for _ in range(3):
        t = time.thread_time()
        for m, rows in mats:
            np.matmul(m, m.T) if rows else np.matmul(m.T, m)
        best = min(best, time.thread_time() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--layers", default="0-1")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from headrank.analysis.scan import layer_metrics, parse_layers
    from headrank.io.sources import open_reader
    from headrank.io.stfile import BufferPool, reading_into
    from headrank.util.threads import torch_threads

    reader = open_reader(args.path, arrays="numpy")
    sel = parse_layers(args.layers, reader.dims.n_layers)
    pool, reads, layers = BufferPool(), [], []
    for _ in range(2):  # the second pass reads into the buffers the first one left
        layers.clear()
        for i in sel:
            t = time.thread_time()
            with reading_into(pool):
                layers.append(reader.read_layer(i))
            reads.append(time.thread_time() - t)
    d, h = reader.dims.d, reader.dims.n_heads
    print(f"{args.path}: layers {sel}, d={d}, heads={h} (kv {reader.dims.n_kv_heads}), dh={reader.dims.head_dim}, "
          f"dtype {reader.dtypes()}; load average {os.getloadavg()}")
    print(f"read_layer (thread CPU, reused buffers): {min(reads[len(sel):]) * 1e3:.0f} ms a layer "
          f"(first read, fresh buffers: {reads[0] * 1e3:.0f} ms)")
    with torch_threads(1):
        layer_metrics(layers[0])  # warm: buffers, LAPACK workspaces
        times = []
        for k in range(args.repeat):
            t = time.thread_time()
            layer_metrics(layers[k % len(layers)])
            times.append(time.thread_time() - t)
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        for hw in layers:
            layer_metrics(hw)
        prof.disable()
        floor = _floor(layers[0])
    times.sort()
    print(f"layer_metrics, one thread: best {times[0] * 1e3:.0f} ms, median {times[len(times) // 2] * 1e3:.0f} ms "
          f"a layer; the Grams alone (dsyrk, float64 inputs ready): {floor * 1e3:.0f} ms "
          f"= {times[0] / floor:.2f} x the arithmetic floor")
    stages = _stages(prof, len(layers))
    total = sum(stages.values())
    for name, v in sorted(stages.items(), key=lambda kv: -kv[1]):
        print(f"  {name:30s} {v * 1e3:7.1f} ms  {100 * v / total:5.1f} %")


if __name__ == "__main__":
    main()
