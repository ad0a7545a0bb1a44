"""The Figure 2 panels, drawn from the stored data only."""

from __future__ import annotations

from typing import Any

import numpy as np

from headrank.studies.fig2.claims import GAP_TOL, RANK_LAYER
from headrank.studies.fig2.horizon import horizon_lr_sums
from headrank.studies.fig2.params import Fig2Params
from headrank.studies.registry import FigureOut


def fig2_panels(data: dict[str, Any]) -> Any:
    """Rank, balance discrepancy, relative gap of layer-1 P W_V and training loss over training, per λ
    (the first seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lams = data["lambdas"]
    seed = str(data["seeds"][0])
    cmap = plt.get_cmap("viridis", max(len(lams), 2))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for j, lam in enumerate(lams):
        key = f"{lam:g}"
        ov = data["ov"][key][seed][RANK_LAYER]
        c = cmap(j)
        label = f"λ = {lam:g} (exposure {data['exposure'][key]['attn']:.1f})"
        axes[0, 0].plot(ov["step"], ov["effective_rank"], color=c, label=label)
        axes[0, 0].plot(ov["step"], ov["rank"], color=c, ls=":", lw=1)
        axes[0, 1].semilogy(ov["step"], np.maximum(np.asarray(ov["balance"], float), 1e-12), color=c, label=label)
        axes[1, 0].semilogy(ov["step"], np.maximum(np.asarray(ov["gap_rel"], float), 1e-12), color=c, label=label)
        tc = data["training"][key][seed]
        axes[1, 1].plot(tc["step"], tc["loss"], color=c, label=label)
    axes[0, 0].set_title(r"rank of $P W_V$, layer 1 (solid: effective, dotted: numerical $\tau=10^{-3}$)",
                         fontsize=10)
    axes[0, 0].set_ylabel("mean over heads")
    axes[0, 1].set_title(r"$\|P^\top P - W_V W_V^\top\|_F$, layer 1 (mean over heads)", fontsize=10)
    axes[1, 0].set_title(r"(bound $-$ nuclear) / bound of $P W_V$, layer 1", fontsize=10)
    axes[1, 0].axhline(GAP_TOL, color="0.5", ls="--", lw=1)
    axes[1, 1].set_title("training loss (fresh batches)", fontsize=10)
    axes[1, 1].set_yscale("symlog", linthresh=1e-4)
    for ax in axes.ravel():
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle(f"Associative recall, AdamW ({data['config']['schedule'] if 'schedule' in data['config'] else 'constant'}"
                 f" lr), seed {seed}: attention decay λ varied, every other matrix 0.1 (cf. paper Fig. 2)")
    fig.tight_layout()
    return fig


def horizon_panels(data: dict[str, Any], p: Fig2Params | None = None) -> Any:
    """The horizon runs against exposure (gap/bound, relative imbalance; every seed) and the SGD
    positive control against its theory line. Exposure at a step is λ·Σlr up to it over the runs'
    schedule, warmup included (:func:`horizon_lr_sums`, as the horizon claim reports it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, c = data.get("horizon"), data.get("sgd_control")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    if h:
        lr_sums = horizon_lr_sums(data, p or Fig2Params())[0]
        cmap = plt.get_cmap("viridis", max(len(h["lambdas"]), 2))
        for j, lam in enumerate(h["lambdas"]):
            key = f"{lam:g}"
            for k, x in enumerate(h["ov"][key].values()):
                e = (lam if lam > 0 else 1.0) * lr_sums[np.minimum(np.asarray(x["step"], int), len(lr_sums) - 1)]
                label = f"λ = {lam:g} (exposure {h['exposure_end'][key]:.3g})" if k == 0 else None
                for ax, col in ((axes[0], "gap_rel"), (axes[1], "balance_rel")):
                    y = np.maximum(np.asarray([np.nan if v is None else v for v in x[col]], float), 1e-12)
                    ax.semilogy(e, y, color=cmap(j), lw=1, alpha=0.8, label=label)
        axes[0].axhline(GAP_TOL, color="0.5", ls="--", lw=1)
        axes[0].set_title(f"(bound − nuclear)/bound of $P W_V$, constant lr, label noise {h['label_noise']:g}",
                          fontsize=9)
        axes[1].set_title("relative imbalance of $P W_V$ (every seed)", fontsize=9)
        for ax in axes[:2]:
            ax.set_xlabel("exposure λ·Σlr (λ = 0: Σlr)")
            ax.legend(fontsize=7)
    if c:
        for key, r in c["runs"].items():
            lam = float(key.split("/")[0])
            t, y = np.asarray(r["step"], float), np.asarray(r["imbalance"], float)
            axes[2].semilogy(t, y, lw=1, label=f"λ = {key}")
            axes[2].semilogy(t, y[0] * (1 - c["lr"] * lam) ** (2 * t), color="k", ls=":", lw=0.8)
        axes[2].set_title(f"plain SGD (η = {c['lr']:g}): ‖PᵀP − W_V W_Vᵀ‖ and e^(−2ηλt) (dotted)", fontsize=9)
        axes[2].set_xlabel("step")
        axes[2].legend(fontsize=6)
    fig.tight_layout()
    return fig


def figures(data: dict[str, Any], p: Fig2Params) -> list[FigureOut]:
    """The Figure 2 panels, and the horizon study with the SGD control when they ran."""
    out = [FigureOut("fig2", fig2_panels(data), "Layer-1 P W_V over training per attention decay λ.")]
    if data.get("horizon") or data.get("sgd_control"):
        out.append(FigureOut("fig2_horizon", horizon_panels(data, p), "Horizon study: AdamW at constant lr on recall "
                             "with label noise, gap/bound and imbalance against exposure (floor and rebound); plain "
                             "SGD positive control against exp(-2 eta lambda t)."))
    return out
