"""The Figure 2 experiment: one recall run per attention decay λ, tracked over training.

Recorded per λ, every ``track_every`` steps, by the live rank tracker (the numbers
``attnrank spectra`` gives on a checkpoint): for both products of both layers, per head, the
numerical rank (``#{σ_i > 10⁻³ σ_1}``), effective rank, balance discrepancy ``‖AᵀA − BᵀB‖_F``
(for OV: ``‖P_hᵀP_h − W_V,h W_V,hᵀ‖_F``) and the gap ``½(‖A‖²+‖B‖²) − ‖ABᵀ‖_*``. "Layer 1"
of the paper is the first layer (index 0 here).
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from attnrank.io.rundir import read_metrics
from attnrank.studies.fig2.params import Fig2Params
from attnrank.training.config import TrainConfig, recall_config
from attnrank.training.loop import train

SERIES_KEYS = ("rank", "effective_rank", "balance", "balance_rel", "gap", "nuclear", "frob_bound")


def fig2_config(attn_wd: float, steps: int, seed: int = 0, other_wd: float = 0.1) -> TrainConfig:
    """One Figure 2 run: the default recall task (4 pairs, 8 keys, 8 values, one query) and
    model (2 layers, width 64, 4 heads of width 16, no MLP), AdamW lr 3e-3 (100 warmup steps),
    β = (0.9, 0.99), batch 64, weight decay ``other_wd`` on everything but Q/K/V/O, λ on those."""
    return recall_config(steps=steps, attn_weight_decay=attn_wd, weight_decay=other_wd, seed=seed,
                         track_every=max(steps // 40, 10), log_every=max(steps // 40, 10),
                         checkpoint_every=steps)


def _run_one(args: tuple[TrainConfig, str, str]) -> list[dict[str, Any]]:
    import torch

    cfg, name, root = args
    torch.set_num_threads(1)  # runs go side by side, one core each; deterministic either way
    run = Path(root) / name
    train(run, cfg, device="cpu", tensorboard=False)
    return read_metrics(run)


def run_configs(configs: dict[str, TrainConfig], workers: int = 1,
                keep: str | os.PathLike | None = None) -> dict[str, list[dict[str, Any]]]:
    """Train every config (in parallel spawned processes, one thread each); their metrics rows
    by name. With ``workers > 1`` a calling script needs the ``if __name__ == "__main__":``
    guard. Results do not depend on ``workers``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = str(keep) if keep is not None else tmp
        jobs = [(cfg, name, root) for name, cfg in configs.items()]
        if workers <= 1 or len(jobs) == 1:
            rows = [_run_one(j) for j in jobs]
        else:
            import multiprocessing as mp

            with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
                rows = list(pool.map(_run_one, jobs))
    return dict(zip(configs, rows, strict=True))


def series(rows: list[dict[str, Any]], product: str, layer: int) -> dict[str, list[float]]:
    """Per tracked step: mean over heads of one layer's metrics of one product."""
    out: dict[str, list[float]] = {"step": [], **{k: [] for k in SERIES_KEYS}, "gap_rel": []}
    for r in rows:
        if "heads" not in r:
            continue
        h = r["heads"][product]
        out["step"].append(r["step"])
        for k in SERIES_KEYS:
            out[k].append(float(np.mean(h[k][layer])))
        gap_rel = np.asarray(h["gap"][layer]) / np.asarray(h["frob_bound"][layer])
        out["gap_rel"].append(float(np.mean(gap_rel)))
    return out


def training_curve(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Logged loss and accuracy over steps."""
    out: dict[str, list[float]] = {"step": [], "loss": [], "acc": []}
    for r in rows:
        if "loss" in r:
            out["step"].append(r["step"])
            out["loss"].append(r["loss"])
            out["acc"].append(r["acc"])
    return out


def run(p: Fig2Params) -> dict[str, Any]:
    """Train one run per λ and keep, per λ, the training curve and the per-layer series of both
    products (what the claims and the figure need)."""
    configs = {f"{lam:g}": fig2_config(lam, p.steps, p.seed, p.other_weight_decay) for lam in p.lambdas}
    runs = run_configs(configs, workers=p.workers)
    data: dict[str, Any] = {"lambdas": list(p.lambdas), "ov": {}, "qk": {}, "training": {},
                            "config": next(iter(configs.values())).to_dict()}
    for key, rows in runs.items():
        data["training"][key] = training_curve(rows)
        for product in ("ov", "qk"):
            data[product][key] = {str(layer): series(rows, product, layer) for layer in (0, 1)}
    return data
