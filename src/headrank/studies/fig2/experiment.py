"""The Figure 2 experiment: one recall run per attention decay λ, tracked over training.

Recorded per λ, every ``track_every`` steps, by the live rank tracker (the numbers
``headrank spectra`` gives on a checkpoint): for both products of both layers, per head, the
numerical rank (``#{σ_i > 10⁻³ σ_1}``), effective rank, balance discrepancy ``‖AᵀA − BᵀB‖_F``
(for OV: ``‖P_hᵀP_h − W_V,h W_V,hᵀ‖_F``) and the gap ``½(‖A‖²+‖B‖²) − ‖ABᵀ‖_*``. "Layer 1"
of the paper is the first layer (index 0 here).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from headrank.io.rundir import read_metrics
from headrank.studies.fig2.params import Fig2Params
from headrank.training.config import RecallTrainConfig, decay_exposure, recall_config

SERIES_KEYS = ("rank", "effective_rank", "balance", "balance_rel", "gap", "nuclear", "frob_bound", "gap_rel")


def fig2_overrides(steps: int, other_wd: float = 0.1, lr: float = 3e-3, schedule: str = "constant",
                   **extra: Any) -> dict[str, Any]:
    """The recall overrides every Figure 2 run shares (all but attention λ and seed): the default
    recall task (4 pairs, 8 keys, 8 values, one query) and model (2 layers, width 64, 4 heads of
    width 16, no MLP), AdamW at peak ``lr`` (100 warmup steps, then ``schedule``), β = (0.9, 0.99),
    batch 64, weight decay ``other_wd`` on everything but Q/K/V/O. ``extra``: further recall
    overrides (``label_noise``, ``bias`` …)."""
    return {"steps": steps, "weight_decay": other_wd, "lr": lr, "schedule": schedule,
            "track_every": max(steps // 40, 10), "log_every": max(steps // 40, 10), "checkpoint_every": steps, **extra}


def fig2_config(attn_wd: float, steps: int, seed: int = 0, other_wd: float = 0.1, lr: float = 3e-3,
                schedule: str = "constant", **extra: Any) -> RecallTrainConfig:
    """One Figure 2 run's config: :func:`fig2_overrides` with attention λ ``attn_wd`` on Q/K/V/O."""
    return recall_config(attn_weight_decay=attn_wd, seed=seed, **fig2_overrides(steps, other_wd, lr, schedule, **extra))


def train_grid(base: dict[str, Any], lambdas: list[float], seeds: list[int], workers: int = 1
               ) -> dict[tuple[str, str], tuple[list[dict[str, Any]], dict[str, list]]]:
    """Train attention λ × seed on the recall task through the one sweep path (``run_sweep``, one
    thread per run, as fig3 and table1); by ``(f"{λ:g}", str(seed))``, each run's metrics rows and
    the final singular values of both products (``{product: [layer][head][i]}``). Results do not
    depend on ``workers``."""
    from headrank.analysis.scan import analyze
    from headrank.io.rundir import latest_checkpoint
    from headrank.studies.lm_common import sweep

    out: dict[tuple[str, str], tuple[list[dict[str, Any]], dict[str, list]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        res = sweep("recall", base, {"attn_weight_decay": list(lambdas)}, list(seeds), Path(tmp), workers)
        for _, r in res.runs.iterrows():
            run = res.out / "runs" / r["name"]
            sv = analyze(latest_checkpoint(run), threads=1).sv  # final singular values, (layers, heads, k)
            out[f"{float(r['attn_weight_decay']):g}", str(int(r["seed"]))] = (
                read_metrics(run), {product: np.asarray(sv[product]).tolist() for product in ("ov", "qk")})
    return out


def series(rows: list[dict[str, Any]], product: str, layer: int) -> dict[str, list[float]]:
    """Per tracked step: mean over heads of one layer's metrics of one product."""
    out: dict[str, list[float]] = {"step": [], **{k: [] for k in SERIES_KEYS}}
    for r in rows:
        if "heads" not in r:
            continue
        h = r["heads"][product]
        out["step"].append(r["step"])
        for k in SERIES_KEYS:  # gap_rel: the tracker's per-head gap / bound (core.metrics)
            out[k].append(float(np.mean(h[k][layer])))
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
    """Train one run per λ and seed; keep, per λ and seed, the training curve, the per-layer series
    of both products, the final singular values, and per λ the decay exposure (what the claims
    and the figure need). Keys: ``f"{λ:g}"`` then ``str(seed)``."""
    configs = {(f"{lam:g}", str(seed)): fig2_config(lam, p.steps, seed, p.other_weight_decay, p.lr, p.schedule)
               for lam in p.lambdas for seed in p.seeds}
    runs = train_grid(fig2_overrides(p.steps, p.other_weight_decay, p.lr, p.schedule), list(p.lambdas), list(p.seeds),
                      p.workers)
    data: dict[str, Any] = {"lambdas": list(p.lambdas), "seeds": list(p.seeds), "ov": {}, "qk": {}, "training": {},
                            "sv": {"ov": {}, "qk": {}}, "exposure": {},
                            "config": next(iter(configs.values())).to_dict()}
    for (lam, seed), (rows, sv) in ((k, runs[k]) for k in configs):
        data["exposure"][lam] = decay_exposure(configs[lam, seed])
        data["training"].setdefault(lam, {})[seed] = training_curve(rows)
        for product in ("ov", "qk"):
            data[product].setdefault(lam, {})[seed] = {str(layer): series(rows, product, layer) for layer in (0, 1)}
            data["sv"][product].setdefault(lam, {})[seed] = sv[product]
    if p.horizon_steps > 0:
        data["horizon"] = horizon_runs(p)
    if p.sgd_steps > 0:
        data["sgd_control"] = sgd_control(p)
    return data


# -- the horizon study and the SGD positive control (claims: .horizon) ----------------------------

def horizon_runs(p: Fig2Params) -> dict[str, Any]:
    """AdamW, constant lr, label noise: per λ and seed the layer-1 OV series (gap/bound, relative
    imbalance, effective rank), the loss, and per λ the exposure at each tracked step."""
    configs = {(f"{lam:g}", str(s)): fig2_config(lam, p.horizon_steps, s, p.other_weight_decay, p.lr, "constant",
                                                 label_noise=p.horizon_label_noise)
               for lam in p.horizon_lambdas for s in p.horizon_seeds}
    runs = train_grid(fig2_overrides(p.horizon_steps, p.other_weight_decay, p.lr, "constant",
                                     label_noise=p.horizon_label_noise),
                      list(p.horizon_lambdas), list(p.horizon_seeds), p.workers)
    out: dict[str, Any] = {"lambdas": list(p.horizon_lambdas), "seeds": list(p.horizon_seeds), "ov": {}, "loss": {},
                           "exposure_end": {}, "steps": p.horizon_steps, "label_noise": p.horizon_label_noise}
    for (lam, seed), (rows, _) in ((k, runs[k]) for k in configs):
        out["exposure_end"][lam] = decay_exposure(configs[lam, seed])["attn"]
        s = series(rows, "ov", 0)
        out["ov"].setdefault(lam, {})[seed] = {k: s[k] for k in ("step", "gap_rel", "balance_rel", "effective_rank")}
        out["loss"].setdefault(lam, {})[seed] = training_curve(rows)
    return out


def _ov_imbalance(model: Any) -> float:
    """Mean over layer-1 heads of ‖PᵀP − W_V W_Vᵀ‖_F, read from the live model."""
    from headrank.io.sources import open_reader

    A, B = open_reader(model).read_layer(0).ov_factors()
    A, B = A.double(), B.double()
    return float((A.transpose(-1, -2) @ A - B.transpose(-1, -2) @ B).flatten(1).norm(dim=-1).mean())


def sgd_control(p: Fig2Params) -> dict[str, Any]:
    """Plain SGD (coupled L2 λ on attention, 0.1 elsewhere) on the recall model without biases:
    the layer-1 OV imbalance every ``p.sgd_every`` steps, per λ and seed."""
    import torch

    from headrank.training.optim import param_groups

    out: dict[str, Any] = {"lr": p.sgd_lr, "lambdas": list(p.sgd_lambdas), "runs": {}}
    for lam in p.sgd_lambdas:
        for seed in p.horizon_seeds[:2]:
            cfg = fig2_config(lam, p.sgd_steps, seed, p.other_weight_decay, p.sgd_lr, "constant", bias=False)
            job = cfg.job(None, torch.device("cpu"))
            opt = torch.optim.SGD(param_groups(job.model, p.other_weight_decay, lam), lr=p.sgd_lr)
            steps, imb, losses = [], [], []
            for t in range(p.sgd_steps + 1):
                if t % p.sgd_every == 0:
                    steps.append(t)
                    imb.append(_ov_imbalance(job.model))
                if t == p.sgd_steps:
                    break
                x, y = job.stream.next()
                loss, _ = job.loss_and_accuracy(job.model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
            out["runs"][f"{lam:g}/{seed}"] = {"step": steps, "imbalance": imb, "loss_first": losses[0],
                                              "loss_last": losses[-1]}
    return out
