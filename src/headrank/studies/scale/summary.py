"""Per-run summaries of the scale experiment's histories (pure: from data as read from JSON)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ADAM_BETA1 = 0.9
# A run is at equilibrium when its weight norm is stationary on the scale of its relaxation time:
# s = |d ln‖W‖/dt|·τ over the tail (least-squares line through the logged norms of the last
# quarter, largest over the block matrices) at most this. Why this quantity: with g ⟂ W,
# ‖W_{t+1}‖² = ‖W_t‖² − (2ηλ/(1−β))‖W_t‖² + (turn)²‖W_t‖², so the squared turn per step is
# 2ηλ/(1−β)·(1 + 2 s_signed): a norm moving at s per τ shifts the angular-update relation by
# about s (a run still descending from its initial norm has s ≈ 0.2, and an angle ratio ≈ 0.8).
EQ_DRIFT = 0.05
# Decay time constants a training finding needs (docs/METHODS.md gives no other horizon).
TIME_CONSTANTS_NEEDED = 3.0


def norm_drift(norm: Any, steps: Any, frac: float = 0.25) -> tuple[float, float]:
    """(relative change of the norm over the last ``frac`` of the run, steps that tail spans):
    slope of a least-squares line through the logged norms (T,) or (T, L) times the tail's
    length, over the tail mean; the largest over the last axis."""
    n = np.asarray(norm, float)
    n = n[:, None] if n.ndim == 1 else n
    t = np.asarray(steps, float)
    k = max(2, int(round(len(t) * frac)))
    tt, nn = t[-k:], n[-k:]
    dt = tt - tt.mean()
    slope = (dt[:, None] * (nn - nn.mean(0))).sum(0) / (dt**2).sum()
    return float(np.max(np.abs(slope) * (tt[-1] - tt[0]) / nn.mean(0))), float(tt[-1] - tt[0])


def exposure_needed(optimizer: str, momentum: float | None) -> float:
    """λ·Σlr for ``TIME_CONSTANTS_NEEDED`` decay time constants: decoupled decay (AdamW) shrinks
    W by e per unit of λ·Σlr; coupled L2 through SGD momentum β acts with the effective rate
    η/(1−β), so one time constant is (1−β) of exposure."""
    if optimizer == "sgd":
        return TIME_CONSTANTS_NEEDED * (1.0 - float(momentum or 0.0))
    return TIME_CONSTANTS_NEEDED


def tail_mean(a: Any, frac: float = 0.25) -> np.ndarray:
    """Mean over the last ``frac`` of the first axis."""
    a = np.asarray(a, dtype=float)
    return a[-max(1, int(round(len(a) * frac))):].mean(0)


def run_summary(r: dict[str, Any], frac: float = 0.25) -> list[dict[str, Any]]:
    """Per run of a batched history ``r``: tail means of the tracked quantities; for λ > 0 the
    SGD/AdamW predictions (angle, norm), the relaxation time τ (steps), ``tail_drift`` (relative
    change of ‖W‖ over the tail), ``drift`` (that change per τ: |d ln‖W‖/dt|·τ) and
    ``equilibrated`` (drift ≤ :data:`EQ_DRIFT`), and the decay exposure λ·η·steps got and needed."""
    out = []
    norm, angle = np.asarray(r["norm"], float), np.asarray(r["angle"], float)
    grad_sq, update_sq = np.asarray(r["grad_sq"], float), np.asarray(r["update_sq"], float)
    cos_gw = np.asarray(r["cos_gw"], float)
    n_tail = max(1, int(round(len(r["step"]) * frac)))
    for j in range(len(r["lams"])):
        lam, lr = float(r["lams"][j]), float(r["lrs"][j])
        norm_l, ang_l, gsq_l = tail_mean(norm[:, j], frac), tail_mean(angle[:, j], frac), tail_mean(grad_sq[:, j], frac)
        row = {
            "variant": r["variant"], "optimizer": r["optimizer"], "lam": lam, "lr": lr, "seed": int(r["seeds"][j]),
            "norm": float(norm_l.mean()), "eff_lr": float(tail_mean(np.asarray(r["eff_lr"], float)[:, j], frac).mean()),
            "angle": float(ang_l.mean()), "grad_sq": float(gsq_l.mean()),
            "update_sq": float(tail_mean(update_sq[:, j], frac).mean()),
            "cos_gw_max": float(np.abs(cos_gw[-n_tail:, j]).max()),
            "loss_tail": float(tail_mean(np.asarray(r["loss"], float)[:, j], frac)),
        }
        for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
            row[k] = float(tail_mean(np.asarray(r[k], float)[:, j], frac))
        tl = np.asarray(r["train_loss"], float)[:, j]
        tl = tl[-max(1, int(round(len(tl) * frac))):]
        row["train_loss_sem"] = float(tl.std(ddof=1) / np.sqrt(len(tl))) if len(tl) > 1 else math.inf
        if lam > 0:
            row.update(_predictions(r, lam, lr, norm_l, ang_l, gsq_l))
            drift, span = norm_drift(norm[:, j], r["step"], frac)
            row.update(tail_drift=drift, drift=drift * row["tau"] / span if span > 0 else math.inf,
                       exposure=lam * lr * float(r["steps"]),
                       exposure_needed=exposure_needed(r["optimizer"], r.get("momentum")))
            row["equilibrated"] = bool(row["drift"] <= EQ_DRIFT)
        out.append(row)
    return out


def _predictions(r: dict[str, Any], lam: float, lr: float, norm_l: np.ndarray, ang_l: np.ndarray,
                 gsq_l: np.ndarray) -> dict[str, Any]:
    if r["optimizer"] == "sgd":
        beta = float(r["momentum"])
        tau = (1 - beta) / (2 * lr * lam)
        pred_ang = math.sqrt(2 * lr * lam / (1 + beta))
        pred_norm = np.sqrt(lr * gsq_l / (2 * lam * (1 - beta)))
        return dict(tau=tau, angle_pred=pred_ang, angle_ratio=float((ang_l / pred_ang).mean()), norm_pred=float(pred_norm.mean()),
                    norm_ratio=float((norm_l / pred_norm).mean()))
    # AdamW, derived here for noise-dominated gradients (v ≈ E g², u = m̂/√v̂ an EMA of white
    # noise): the walk of W diffuses by η² per entry per step, so |W|² = η n / (2λ), and the
    # per-step turn is √(2ηλ (1−β1)/(1+β1)) (β1 = 0.9), below the plain √(2ηλ).
    b1 = ADAM_BETA1
    tau = 1 / (2 * lr * lam)
    pred_ang = math.sqrt(2 * lr * lam * (1 - b1) / (1 + b1))
    pred_norm = np.sqrt(lr * np.asarray(r["n_entries"], float) / (2 * lam))
    return dict(tau=tau, angle_pred=pred_ang, angle_ratio=float((ang_l / pred_ang).mean()), norm_pred=float(pred_norm.mean()),
                norm_ratio=float((norm_l / pred_norm).mean()),
                angle_over_sqrt_2_eta_lam=float(ang_l.mean() / math.sqrt(2 * lr * lam)))


def summaries(data: dict[str, Any], frac: float = 0.25) -> dict[str, list[dict[str, Any]]]:
    """run_summary of every variant's SGD runs (each row with its ``group``: grid or product)."""
    out = {}
    for v, r in data["runs"].items():
        rows = run_summary(r, frac)
        for row, grp in zip(rows, r["group"], strict=True):
            row["group"] = grp
        out[v] = rows
    return out
