"""Figures of fig3 and table1."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attnrank.analysis.plots import PRODUCT_LABEL  # noqa: E402
from attnrank.studies.toys_plots import _lam_colors  # noqa: E402


def _lam_x(lams) -> np.ndarray:
    """λ positions on a symlog axis (λ = 0 included)."""
    return np.asarray(lams, dtype=float)


def fig3_panels(data: dict) -> plt.Figure:
    """Columns: LM QK, LM OV (middle layer, one dot per head and seed), ViT QK, ViT OV (mean over all
    heads and layers, one dot per seed); solid: effective rank, dashed: numerical rank (seed means)."""
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for j, (model, product) in enumerate((("lm", "qk"), ("lm", "ov"), ("vit", "qk"), ("vit", "ov"))):
        ax = axes[j]
        h = data[model]["heads"]
        s = data[model]["summary"]
        lam_h = np.asarray(h["lam"], dtype=float)
        prod_h = np.asarray(h["product"])
        sel = prod_h == product
        if model == "lm":
            pts = (lam_h[sel], np.asarray(h["effective_rank"])[sel], np.asarray(h["rank"])[sel])
        else:  # per-run means over heads and layers
            seeds = np.asarray(h["seed"])[sel]
            keys = sorted(set(zip(lam_h[sel], seeds, strict=True)))
            eff = np.asarray(h["effective_rank"])[sel]
            num = np.asarray(h["rank"])[sel]
            pts = (np.array([k[0] for k in keys]),
                   np.array([eff[(lam_h[sel] == k[0]) & (seeds == k[1])].mean() for k in keys]),
                   np.array([num[(lam_h[sel] == k[0]) & (seeds == k[1])].mean() for k in keys]))
        jitter = np.random.default_rng(0).uniform(-0.04, 0.04, len(pts[0])) * np.maximum(pts[0], 0.05)
        ax.scatter(pts[0] + jitter, pts[1], s=10, color="tab:blue", alpha=0.5)
        ax.scatter(pts[0] + jitter, pts[2], s=10, color="tab:orange", alpha=0.5, marker="x")
        ps = np.asarray(s["product"]) == product
        lam_s = _lam_x(np.asarray(s["lam"])[ps])
        order = np.argsort(lam_s)
        for col, color, ls, lab in (("effective_rank", "tab:blue", "-", "effective rank"),
                                    ("rank", "tab:orange", "--", "numerical rank (tol 1e-3)")):
            mu = np.asarray(s[f"{col}_mean"], dtype=float)[ps][order]
            sd = np.nan_to_num(np.asarray(s[f"{col}_std"], dtype=float)[ps][order])
            ax.errorbar(lam_s[order], mu, yerr=sd, color=color, ls=ls, marker="o", capsize=3, label=lab)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.set_xlabel("attention weight decay λ (others 0.1)")
        where = f"layer index {data[model]['layers'][0]}, per head" if model == "lm" else "mean over heads and layers"
        ax.set_title(f"{model.upper()}: {PRODUCT_LABEL[product]} ({where})", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("rank")
    fig.suptitle("Rank against attention decay (cf. paper Fig. 3); error bars: std over seeds")
    fig.tight_layout()
    return fig


def table1_panels(data: dict) -> plt.Figure:
    """Left: mean test perplexity over attention λ × MLP λ (± std in each cell); right: perplexity
    against attention λ, one line per MLP λ, error bars = std over seeds."""
    t = data["table"]
    attn = sorted(set(t["attn_weight_decay"]))
    mlp = sorted(set(t["weight_decay"]))
    mean = np.full((len(attn), len(mlp)), np.nan)
    std = np.full_like(mean, np.nan)
    for a, m, mu, sd in zip(t["attn_weight_decay"], t["weight_decay"], t["ppl_mean"], t["ppl_std"], strict=True):
        mean[attn.index(a), mlp.index(m)] = mu
        std[attn.index(a), mlp.index(m)] = np.nan if sd is None else sd
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    im = axes[0].imshow(mean, cmap="viridis_r", aspect="auto")
    for i in range(len(attn)):
        for j in range(len(mlp)):
            txt = f"{mean[i, j]:.3f}" + ("" if not np.isfinite(std[i, j]) else f"\n± {std[i, j]:.3f}")
            axes[0].text(j, i, txt, ha="center", va="center", fontsize=8, color="w")
    axes[0].set_xticks(range(len(mlp)), [f"{m:g}" for m in mlp])
    axes[0].set_yticks(range(len(attn)), [f"{a:g}" for a in attn])
    axes[0].set_xlabel("MLP (non-attention) weight decay")
    axes[0].set_ylabel("attention weight decay")
    axes[0].set_title("test perplexity, mean ± std over seeds", fontsize=10)
    fig.colorbar(im, ax=axes[0])
    for j, (m, c) in enumerate(zip(mlp, _lam_colors(len(mlp)), strict=False)):
        axes[1].errorbar(attn, mean[:, j], yerr=np.nan_to_num(std[:, j]), color=c, marker="o", capsize=3,
                         label=f"MLP λ = {m:g}")
    axes[1].set_xscale("symlog", linthresh=0.1)
    axes[1].set_xlabel("attention weight decay λ")
    axes[1].set_ylabel("test perplexity")
    axes[1].legend(fontsize=7)
    axes[1].set_title("perplexity against attention decay", fontsize=10)
    fig.suptitle("LM test perplexity over attention × MLP decay (cf. paper Table 1)")
    fig.tight_layout()
    return fig
