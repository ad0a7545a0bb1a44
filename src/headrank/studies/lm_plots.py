"""Figures of fig3, table1 and fig4."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headrank.analysis.plots import (
    PRODUCT_LABEL,  # noqa: E402
    lam_colors,  # noqa: E402
)


def fig3_panels(data: dict) -> plt.Figure:
    """Columns: LM QK, LM OV, ViT QK, ViT OV; x: attention decay exposure λ·Σlr (symlog); per run
    (dots) and seed mean ± std (lines) of the effective rank (solid), numerical rank at τ = 1e-3
    (dashed) and at τ above the measured noise floor (dotted)."""
    from headrank.studies.lm_common import LOW_TOL, floor_tol, per_run

    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    for j, (model, product) in enumerate((("lm", "qk"), ("lm", "ov"), ("vit", "qk"), ("vit", "ov"))):
        ax, m = axes[j], data.get(model)
        if m is None:  # a model not in this run (fig3's paper_vit profile)
            ax.set_title(f"{model.upper()}: not in this run", fontsize=10)
            ax.axis("off")
            continue
        tol = floor_tol(m)["tol"]
        ex = {r["lam"]: r["exposure"]["attn"] for r in m["runs"]}
        for measure, t, color, ls, lab in (("effective", LOW_TOL, "tab:blue", "-", "effective rank"),
                                           ("numerical", LOW_TOL, "tab:orange", "--", "numerical rank (τ 1e-3)"),
                                           ("numerical", tol, "tab:green", ":", f"numerical rank (τ {tol:.2g})")):
            v = per_run(m, product, measure, t)
            lams = sorted(v)
            x = np.array([ex[lam] for lam in lams])
            mu = np.array([np.mean(list(v[lam].values())) for lam in lams])
            sd = np.array([np.std(list(v[lam].values()), ddof=1) if len(v[lam]) > 1 else 0.0 for lam in lams])
            for lam in lams:
                ax.scatter([ex[lam]] * len(v[lam]), list(v[lam].values()), s=10, color=color, alpha=0.5)
            ax.errorbar(x, mu, yerr=sd, color=color, ls=ls, marker="o", capsize=3, label=lab)
        ax.set_xscale("symlog", linthresh=0.3)
        ax.set_xlabel("attention decay exposure λ·Σlr (others λ 0.1)")
        where = f"layer index {m['layers'][0]}" if model == "lm" else "mean over heads and layers"
        ax.set_title(f"{model.upper()}: {PRODUCT_LABEL[product]} ({where})", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("rank (mean over heads)")
    fig.suptitle("Rank against attention decay exposure (cf. paper Fig. 3); error bars: std over seeds")
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
            if not np.isfinite(mean[i, j]):  # a cell not run stays blank (no "nan" label)
                continue
            txt = f"{mean[i, j]:.3f}" + ("" if not np.isfinite(std[i, j]) else f"\n± {std[i, j]:.3f}")
            axes[0].text(j, i, txt, ha="center", va="center", fontsize=8, color="w")
    axes[0].set_xticks(range(len(mlp)), [f"{m:g}" for m in mlp])
    axes[0].set_yticks(range(len(attn)), [f"{a:g}" for a in attn])
    axes[0].set_xlabel("MLP (non-attention) weight decay")
    axes[0].set_ylabel("attention weight decay")
    axes[0].set_title("test perplexity, mean ± std over seeds", fontsize=10)
    fig.colorbar(im, ax=axes[0])
    for j, (m, c) in enumerate(zip(mlp, lam_colors(len(mlp)), strict=False)):
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


def fig4_rows_head0(d: dict) -> plt.Figure:
    """Squared row norms of W_Q vs W_K and of W_V vs columns of P, head 0 of each layer (log-log, y = x)."""
    rn = d["rows_head0"]
    n = d["n_layers"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    cmap = plt.get_cmap("viridis", max(n, 2))
    for ax, (x, y, xl, yl) in zip(axes, (("k", "q", "row of W_K", "row of W_Q"), ("p", "v", "column of P", "row of W_V")),
                                  strict=True):
        xs, ys = np.asarray(rn[x], dtype=float), np.asarray(rn[y], dtype=float)
        for j in range(n):
            ax.scatter(xs[j], ys[j], s=8, color=cmap(j), label=f"layer {j}" if n <= 12 else None)
        pos = np.concatenate([xs.ravel(), ys.ravel()])
        pos = pos[np.isfinite(pos) & (pos > 0)]
        if pos.size:
            ax.plot([pos.min(), pos.max()], [pos.min(), pos.max()], "k--", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(f"|{xl}|²")
        ax.set_ylabel(f"|{yl}|²")
    if n <= 12:
        axes[1].legend(fontsize=7, markerscale=1.5)
    fig.suptitle(f"{d['source']}: head 0 of each layer; balance puts points on y = x (cf. paper Fig. 4)")
    fig.tight_layout()
    return fig


def fig4_ratios(data: dict) -> plt.Figure:
    """Per product: nuclear/bound of every head (strip per group) for the described model and our LMs
    per λ (seeds pooled), each beside its rotation and row-pairing nulls."""
    groups = [("described", [data["described"]])]
    for lam in data["lambdas"]:
        rs = [r for r in data["runs"] if r["lam"] == lam]
        groups.append((f"LM exposure {rs[0]['exposure']['attn']:.2g}", rs))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = {"trained": "tab:blue", "rotation": "tab:gray", "pairing": "tab:orange"}
    rng = np.random.default_rng(0)
    for ax, product in zip(axes, ("qk", "ov"), strict=True):
        for i, (_label, ds) in enumerate(groups):
            for k, (name, c) in enumerate(colors.items()):
                v = np.concatenate([np.asarray(d["products"][product][f"ratio_{name}"], dtype=float).ravel() for d in ds])
                x = i + (k - 1) * 0.25 + rng.uniform(-0.06, 0.06, v.size)
                ax.scatter(x, v, s=6, color=c, alpha=0.5, label=name if i == 0 else None)
                ax.plot([i + (k - 1) * 0.25 - 0.1, i + (k - 1) * 0.25 + 0.1], [np.median(v)] * 2, color="k", lw=1.5)
        ax.axhline(0.99, color="r", ls=":", lw=0.8)
        ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
        ax.set_title(f"{PRODUCT_LABEL[product]}: nuclear / Frobenius bound", fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("nuclear / bound (1 = balanced)")
    fig.suptitle("Balance of trained factors against nulls that keep the factors and destroy the pairing")
    fig.tight_layout()
    return fig
