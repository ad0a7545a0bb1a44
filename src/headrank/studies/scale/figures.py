"""Figures of the scale reproduction (training curves, equilibrium), drawn from the stored data."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headrank.analysis.plots import lam_colors  # noqa: E402


def scale_training_curves(runs: dict, variants, beta: float) -> plt.Figure:
    """Rows: variants; columns: |W| (mean over block matrices), η/|W|², minibatch loss, against
    step; one line per λ (first seed, the λ grid)."""
    fig, axes = plt.subplots(len(variants), 3, figsize=(15, 3.4 * len(variants)), squeeze=False)
    for i, v in enumerate(variants):
        r = {k: np.asarray(x) if k in ("norm", "eff_lr", "loss") else x for k, x in runs[v].items()}
        seed0 = r["seeds"][0]
        cols = [j for j, g in enumerate(r["group"]) if g == "grid" and r["seeds"][j] == seed0]
        colors = lam_colors(len(cols))
        for c, j in zip(colors, cols, strict=True):
            lab = f"λ = {r['lams'][j]:g}"
            axes[i, 0].plot(r["step"], r["norm"][:, j].mean(1), color=c, label=lab)
            axes[i, 1].plot(r["step"], r["eff_lr"][:, j].mean(1), color=c, label=lab)
            axes[i, 2].plot(r["step"], r["loss"][:, j], color=c, label=lab)
        axes[i, 0].set_ylabel(f"{v}\n" + r"$\|W\|_F$ (mean of blocks)")
        axes[i, 1].set_ylabel(r"$\eta/\|W\|^2$")
        axes[i, 2].set_ylabel("minibatch loss")
        for ax in axes[i]:
            ax.set_yscale("log")
            ax.set_xlabel("step")
        axes[i, 0].legend(fontsize=7)
    axes[0, 0].set_title("weight norm")
    axes[0, 1].set_title("effective learning rate")
    axes[0, 2].set_title(f"training loss (SGD, momentum {beta:g})")
    fig.tight_layout()
    return fig


def scale_equilibrium(summ: dict, adamw: list, variants, beta: float) -> plt.Figure:
    """Angular update against sqrt(2ηλ/(1+β)); final loss/accuracy against λ; AdamW norm against η/λ."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))
    markers = {"none": "o", "post": "s", "pre": "^"}
    colors = {"none": "tab:green", "post": "tab:blue", "pre": "tab:red"}
    lo, hi = np.inf, 0.0
    for v in variants:
        rows = [r for r in summ[v] if r["lam"] > 0]
        for r in rows:
            face = colors[v] if r["equilibrated"] else "none"
            axes[0].scatter(r["angle_pred"], r["angle"], marker=markers[v], edgecolors=colors[v], facecolors=face, s=30)
            lo, hi = min(lo, r["angle_pred"], r["angle"]), max(hi, r["angle_pred"], r["angle"])
        axes[0].scatter([], [], marker=markers[v], color=colors[v], label=v)
        grid = [r for r in summ[v] if r.get("group", "grid") == "grid"]
        lams = sorted({r["lam"] for r in grid})
        x = [lam if lam > 0 else np.nan for lam in lams]
        tl = [np.mean([r["train_loss"] for r in grid if r["lam"] == lam]) for lam in lams]
        ta = [np.mean([r["test_acc"] for r in grid if r["lam"] == lam]) for lam in lams]
        axes[1].plot(x, tl, marker=markers[v], color=colors[v], label=v)
        axes[2].plot(x, ta, marker=markers[v], color=colors[v], label=v)
        if 0.0 in lams:
            axes[1].axhline(tl[lams.index(0.0)], color=colors[v], ls=":", lw=0.8)
            axes[2].axhline(ta[lams.index(0.0)], color=colors[v], ls=":", lw=0.8)
    if hi > 0:
        axes[0].plot([lo, hi], [lo, hi], color="0.4", ls="--", lw=1, label="y = x")
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    for axis in (axes[0].xaxis, axes[0].yaxis):
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0].set_xlabel(r"predicted $\sqrt{2\eta\lambda/(1+\beta)}$")
    axes[0].set_ylabel("measured angle per step (rad)")
    axes[0].set_title("angular update, SGD (hollow: not equilibrated)", fontsize=10)
    axes[0].legend(fontsize=7)
    for ax, lab in ((axes[1], "clean training loss"), (axes[2], "test accuracy")):
        ax.set_xscale("log")
        ax.set_xlabel("λ (dotted: λ = 0)")
        ax.set_ylabel(lab)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    axes[1].set_title("what SGD reached: training loss (not judged)", fontsize=10)
    axes[2].set_title("what SGD reached: test accuracy (not judged)", fontsize=10)
    if adamw:
        xs = np.array([r["lr"] / r["lam"] for r in adamw])
        ys = np.array([r["norm"] for r in adamw])
        eq = np.array([r["equilibrated"] for r in adamw])
        axes[3].scatter(xs[eq], ys[eq], color="tab:purple", label="AdamW, none (equilibrated)")
        axes[3].scatter(xs[~eq], ys[~eq], facecolors="none", edgecolors="tab:purple", label="not equilibrated")
        ref = np.geomspace(xs.min(), xs.max(), 10)
        k = np.exp(np.mean(np.log(ys) - 0.5 * np.log(xs)))
        axes[3].plot(ref, k * np.sqrt(ref), color="0.4", ls="--", lw=1, label=r"$\propto\sqrt{\eta/\lambda}$")
        axes[3].set_xscale("log")
        axes[3].set_yscale("log")
        for axis in (axes[3].xaxis, axes[3].yaxis):
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes[3].set_xlabel(r"$\eta/\lambda$")
        axes[3].set_ylabel(r"equilibrium $\|W\|_F$")
        axes[3].set_title("AdamW equilibrium norm", fontsize=10)
        axes[3].legend(fontsize=7)
    fig.tight_layout()
    return fig


def figures(data: dict, p) -> list:
    """The two figures of the reproduction, from the stored data."""
    from headrank.studies.registry import FigureOut
    from headrank.studies.scale.summary import run_summary, summaries

    variants = tuple(data["runs"])
    summ = summaries(data, p.tail)
    asum = run_summary(data["adamw"], p.tail)
    return [
        FigureOut("scale_curves", scale_training_curves(data["runs"], variants, beta=p.momentum),
                  "Norm of the block matrices, effective learning rate eta/|W|^2 and training loss (minibatch, with input "
                  f"noise) against step, per variant (rows) and lam (colours); seed {p.seeds[0]}, lr_W = {p.lr:g}."),
        FigureOut("scale_equilibrium", scale_equilibrium(summ, asum, variants, beta=p.momentum),
                  "Left: angular update per step against the SGD prediction sqrt(2 eta lam/(1+beta)) (equilibrated runs "
                  "filled). Centre: final clean training loss and test accuracy against lam (what SGD reached; the article leaves it open, so not judged). Right: AdamW equilibrium "
                  "norm against eta/lam, with a slope-1/2 reference line."),
    ]
