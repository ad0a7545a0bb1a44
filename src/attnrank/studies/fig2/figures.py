"""The Figure 2 panels, drawn from the stored data only."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnrank.studies.fig2.claims import GAP_TOL, RANK_LAYER
from attnrank.studies.fig2.params import Fig2Params
from attnrank.studies.registry import FigureOut


def fig2_panels(data: dict[str, Any]) -> Any:
    """Rank, balance discrepancy, relative gap of layer-1 P W_V and accuracy over training, per λ."""
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
        axes[0, 1].semilogy(ov["step"], np.maximum(np.asarray(ov["balance_rel"], float), 1e-12), color=c, label=label)
        axes[1, 0].semilogy(ov["step"], np.maximum(np.asarray(ov["gap_rel"], float), 1e-12), color=c, label=label)
        tc = data["training"][key][seed]
        axes[1, 1].plot(tc["step"], tc["loss"], color=c, label=label)
    axes[0, 0].set_title(r"rank of $P W_V$, layer 1 (solid: effective, dotted: numerical $\tau=10^{-3}$)",
                         fontsize=10)
    axes[0, 0].set_ylabel("mean over heads")
    axes[0, 1].set_title(r"$\|P^\top P - W_V W_V^\top\|_F\,/\,(\|P^\top P\|_F + \|W_V W_V^\top\|_F)$, layer 1",
                         fontsize=10)
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


def figures(data: dict[str, Any], p: Fig2Params) -> list[FigureOut]:
    """The one Figure 2 figure."""
    return [FigureOut("fig2", fig2_panels(data), "Layer-1 P W_V over training per attention decay λ.")]
