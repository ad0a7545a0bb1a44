"""Overhead of the live RankTracker at its default interval, measured side by side.

Two ways, in one run, on the default recall configuration (2 layers, 4 heads, width 64):

1. whole runs: ``train()`` with the tracker every ``TrainConfig.track_every`` steps (default)
   against ``train()`` with the tracker only at the first and last step; after a warm-up
   run, interleaved A B, B A, …; the ratio of median wall times is the overhead (on a
   shared, loaded machine this ratio carries a few percent of noise either way);
2. the parts: median time of one ``RankTracker.measure()`` against the median time of one
   training step; overhead = measure / (interval × step).

Target: overhead ≤ 2 % at the default interval. Prints numbers; asserts nothing.

    .venv/bin/python benchmarks/bench_tracker.py [--steps 600] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from headrank.analysis.tracker import RankTracker
from headrank.models.tasks import RecallStream, recall_loss_and_accuracy
from headrank.models.transformer import Transformer
from headrank.training.config import TrainConfig, lr_at, recall_config
from headrank.training.loop import train
from headrank.training.optim import param_groups


def whole_runs(steps: int, repeats: int) -> tuple[dict[str, float], dict[str, float], int]:
    default_every = TrainConfig.track_every
    times: dict[str, list[float]] = {"tracked": [], "untracked": []}
    cpu: dict[str, list[float]] = {"tracked": [], "untracked": []}
    with tempfile.TemporaryDirectory() as tmp:
        train(Path(tmp) / "warmup", recall_config(steps=50), device="cpu", tensorboard=False)
        for r in range(repeats):
            order = [("tracked", default_every), ("untracked", 10**9)]
            for name, every in order if r % 2 == 0 else order[::-1]:  # A B, B A, …
                cfg = recall_config(steps=steps, track_every=every, checkpoint_every=10**9)
                t0, c0 = time.perf_counter(), time.process_time()
                train(Path(tmp) / f"{name}-{r}", cfg, device="cpu", tensorboard=False)
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    med = lambda d: {k: statistics.median(v) for k, v in d.items()}  # noqa: E731
    return med(times), med(cpu), default_every


def parts(n_steps: int = 200, n_measures: int = 50) -> tuple[float, float]:
    cfg = recall_config()
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay, cfg.attn_weight_decay), lr=cfg.lr)
    stream = RecallStream(cfg.task, cfg.batch_size, 0)
    step_times = []
    for step in range(1, n_steps + 1):
        t0 = time.perf_counter()
        x, y = stream.next()
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        loss, _ = recall_loss_and_accuracy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step_times.append(time.perf_counter() - t0)
    tracker = RankTracker(model, every=cfg.track_every)
    measure_times = []
    for _ in range(n_measures):
        t0 = time.perf_counter()
        tracker.measure()
        measure_times.append(time.perf_counter() - t0)
    return statistics.median(step_times[20:]), statistics.median(measure_times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    step, measure = parts()
    every = TrainConfig.track_every
    print(f"[parts] one training step: {step * 1e3:.2f} ms (median); one tracker measurement: "
          f"{measure * 1e3:.2f} ms (median)")
    print(f"[parts] overhead at the default interval ({every} steps): "
          f"{measure / (every * step):.2%}  (target <= 2%)")

    wall, cpu, every = whole_runs(args.steps, args.repeats)
    for label, t in (("wall", wall), ("cpu ", cpu)):
        r = t["tracked"] / t["untracked"]
        print(f"[runs]  {label} time, {args.steps} steps, median of {args.repeats} interleaved runs: tracked every "
              f"{every}: {t['tracked']:.2f} s, tracker at start and end only: {t['untracked']:.2f} s; "
              f"ratio {r:.4f} (overhead {r - 1:+.2%})")
    print("        (whole-run ratios include the noise of a shared machine; the [parts] figure isolates the tracker)")


if __name__ == "__main__":
    main()
