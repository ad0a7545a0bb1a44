"""Figures of the Figure 1 + Proposition 3.1 reproduction, drawn from the stored data only."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headrank.analysis.plots import (
    _diag,  # noqa: E402
    lam_colors,  # noqa: E402
)
from headrank.studies.fig1.gd import fit_log_slope  # noqa: E402
from headrank.studies.fig1.params import Fig1Params  # noqa: E402
from headrank.studies.registry import FigureOut  # noqa: E402

FLOOR = 1e-17  # plotting floor for log axes (gap/balance reach rounding level, can be <= 0)


def balance_prediction(data: dict[str, Any]) -> np.ndarray:
    """The per-mode prediction of ‖AᵀA − BᵀB‖'s late slope per λ (main seed), drawn from the start of each
    fit window (NaN elsewhere and at an exact threshold)."""
    bal = np.asarray(data["balance"], dtype=np.float64)  # (L, T+1)
    pred = np.full_like(bal, np.nan)
    lo, hi = data["rates"]["window"]
    steps = data["steps"]
    rates = data["rates"]
    main = rates["fits"][rates["seeds"].index(data["seed"])] if data["seed"] in rates["seeds"] else None
    for j, lam in enumerate(data["lambdas"]):
        fit = fit_log_slope(bal[j], lo, hi)
        slope = None
        if lam > 0 and main is not None:
            slope = (main[rates["lambdas"].index(lam)].get("predicted") or {}).get("slope")
        if slope is None or fit["t_first"] is None:
            continue
        ta = fit["t_first"]
        tt = np.arange(ta, min(steps, ta + int(40 / abs(slope))) + 1)
        pred[j, tt] = bal[j, ta] * np.exp(slope * (tt - ta))
    return pred


def _series_panels(axes, data: dict[str, Any]) -> None:
    t, lambdas = np.asarray(data["t"]), data["lambdas"]
    gap, bal = np.asarray(data["gap"], dtype=np.float64), np.asarray(data["balance"], dtype=np.float64)
    pred = balance_prediction(data)
    colors = lam_colors(len(lambdas))
    for j, lam in enumerate(lambdas):
        axes[0].plot(t, np.maximum(gap[j], FLOOR), color=colors[j], label=f"λ = {lam:g}")
        axes[1].plot(t, np.maximum(bal[j], FLOOR), color=colors[j], label=f"λ = {lam:g}")
        axes[1].plot(t, pred[j], color="k", ls="--", lw=0.8)
    axes[0].set_ylabel(r"$\frac{1}{2}(\|A\|^2+\|B\|^2) - \|AB^\top\|_*$")
    axes[0].set_title("Frobenius bound minus nuclear norm")
    axes[1].set_ylabel(r"$\|A^\top A - B^\top B\|_F$")
    axes[1].set_title("discrepancy; dashed: per-mode GD rates")
    for ax in axes[:2]:
        ax.set_yscale("log")
        ax.set_xlabel("step t")
        ax.set_ylim(bottom=FLOOR)
    axes[0].legend(fontsize=7)


def _sv_panels(axes, data: dict[str, Any]) -> None:
    sweep = np.asarray(data["lambda_sweep"])
    sw_sv, sw_cf = np.asarray(data["sv_sweep_final"]), np.asarray(data["sv_sweep_closed_form"])
    t, sv_traj, lam_traj = np.asarray(data["t"]), np.asarray(data["sv_traj"]), data["sv_traj_lambda"]
    cf_traj = np.sort(np.maximum(np.asarray(data["d"]) - lam_traj / 2.0, 0.0))[::-1]
    n = sw_sv.shape[1]
    sv_colors = plt.get_cmap("plasma")(np.linspace(0.0, 0.85, n))
    for i in range(n):
        axes[0].plot(sweep, sw_cf[:, i], color=sv_colors[i], lw=1)
        axes[0].scatter(sweep, sw_sv[:, i], color=sv_colors[i], s=10, label=f"$s_{i + 1}$")
        axes[1].plot(t, sv_traj[:, i], color=sv_colors[i], label=f"$s_{i + 1}$")
        axes[1].axhline(cf_traj[i], color=sv_colors[i], ls="--", lw=0.8)
    axes[0].set_xlabel("λ")
    axes[0].set_ylabel("singular value")
    axes[0].set_title(f"singular values of $AB^\\top$ at t = {data['steps']}; lines: max($d_i$ − λ/2, 0)")
    axes[0].legend(fontsize=7)
    axes[1].set_xscale("symlog", linthresh=10)
    axes[1].set_xlim(0, t[-1])
    axes[1].set_xlabel("step t")
    axes[1].set_title(f"singular values over steps, λ = {lam_traj:g}")
    axes[1].legend(fontsize=7)


def fig1_panels(data: dict[str, Any]) -> plt.Figure:
    """Paper Figure 1: gap, balance, singular values against λ at the last step, singular values over t."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.3))
    _series_panels(axes[:2], data)
    _sv_panels(axes[2:], data)
    fig.tight_layout()
    return fig


def prop31_scatter(p: dict[str, Any]) -> plt.Figure:
    """Proposition 3.1: Frobenius bound against nuclear norm for balanced and unbalanced pairs."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
    nuc_scaled, nuc_indep = p["bound_scaled"] - p["gap_scaled"], p["bound_indep"] - p["gap_indep"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3))
    ax = axes[0]
    ax.scatter(p["nuclear_bal"], p["bound_bal"], s=10, label="balanced  B = QA", color="tab:green")
    ax.scatter(nuc_scaled, p["bound_scaled"], s=10, marker="^", label="rescaled (cA, B/c)", color="tab:orange")
    ax.scatter(nuc_indep, p["bound_indep"], s=10, marker="s", label="independent A, B", color="tab:gray")
    allv = np.concatenate([p["nuclear_bal"], p["bound_bal"], nuc_scaled, p["bound_scaled"], nuc_indep,
                           p["bound_indep"]])
    allv = allv[allv > 0]
    _diag(ax, allv.min(), allv.max())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"nuclear norm $\|AB^\top\|_*$")
    ax.set_ylabel(r"bound $\frac{1}{2}(\|A\|_F^2+\|B\|_F^2)$")
    ax.legend(fontsize=8)
    ax.set_title("bound = nuclear exactly when balanced")
    rel = np.abs(p["bound_bal"] - p["nuclear_bal"]) / p["bound_bal"]
    axes[1].hist(np.log10(np.maximum(rel, 1e-18)), bins=30, color="tab:green")
    axes[1].set_xlabel(r"$\log_{10}$ |bound − nuclear| / bound, balanced pairs (exact 0 drawn at −18)")
    axes[1].set_ylabel("pairs")
    axes[1].set_title("balanced pairs: float64 rounding only")
    fig.tight_layout()
    return fig


def figures(data: dict[str, Any], params: Fig1Params) -> list[FigureOut]:
    """The Figure 1 panels and the Proposition 3.1 scatter."""
    return [
        FigureOut("fig1", fig1_panels(data),
                  "Gradient descent on 5x5 A, B (cf. paper Fig. 1). Left: Frobenius bound minus nuclear norm. "
                  "Center left: |A^TA - B^TB|_F with the prediction from the per-mode GD rates (dashed). Center right: "
                  f"singular values at t = {data['steps']} against lam; lines max(d_i - lam/2, 0). Right: singular "
                  f"values over steps for lam = {data['sv_traj_lambda']:g}; dashed: closed form."),
        FigureOut("prop31", prop31_scatter(data["prop31"]),
                  "Proposition 3.1: balanced pairs lie on bound = nuclear; rescaled and independent pairs above it."),
    ]
