"""Figures (matplotlib, Agg). Plots draw results; they compute nothing of substance."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .fileio import write_atomic  # noqa: E402

PRODUCT_LABEL = {"qk": r"$W_K^\top W_Q$", "ov": r"$P W_V$"}


def save_figure(fig, path: str | os.PathLike, dpi: int = 120) -> Path:
    try:
        return write_atomic(path, lambda p: fig.savefig(p, dpi=dpi, bbox_inches="tight", format="png"))
    finally:
        plt.close(fig)


def _diag(ax, lo: float, hi: float) -> None:
    ax.plot([lo, hi], [lo, hi], color="0.4", lw=1, ls="--", zorder=0, label="y = x")


def fig4_rows(result) -> plt.Figure:
    """Squared row norms of W_Q vs W_K and of W_V vs columns of P, head 0 of each layer."""
    rn = result.row_norms
    layers = result.meta["layers"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    cmap = plt.get_cmap("viridis", max(len(layers), 2))
    for ax, (x, y, xl, yl) in zip(axes, (("k", "q", r"$\|$row of $W_K\|^2$", r"$\|$row of $W_Q\|^2$"),
                                          ("p", "v", r"$\|$column of $P\|^2$", r"$\|$row of $W_V\|^2$")),
                                  strict=True):
        xs, ys = rn[x][:, 0, :], rn[y][:, 0, :]
        for j, layer in enumerate(layers):
            ax.scatter(xs[j], ys[j], s=8, color=cmap(j), label=f"layer {layer}" if len(layers) <= 12 else None)
        pos = np.concatenate([xs.ravel(), ys.ravel()])
        pos = pos[np.isfinite(pos) & (pos > 0)]
        if pos.size:
            _diag(ax, pos.min(), pos.max())
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(f"{yl} vs {xl}", fontsize=10)
    if len(layers) <= 12:
        axes[1].legend(fontsize=7, markerscale=1.5, loc="best")
    fig.suptitle(f"{result.meta['source']}: head 0 of each layer; balance puts points on y = x (cf. paper Fig. 4)")
    return fig


def fig4_norms(result) -> plt.Figure:
    """Frobenius bound ½(‖A‖²+‖B‖²) against nuclear norm, one point per head, all layers."""
    t = result.table
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, product in zip(axes, ("qk", "ov"), strict=True):
        s = t[(t["product"] == product) & t["finite"]]
        sc = ax.scatter(s["nuclear"], s["frob_bound"], c=s["layer"], s=12, cmap="viridis")
        if len(s):
            lo = float(min(s["nuclear"].min(), s["frob_bound"].min()))
            hi = float(max(s["nuclear"].max(), s["frob_bound"].max()))
            _diag(ax, lo, hi)
        ax.set_xlabel(r"nuclear norm $\|AB^\top\|_*$")
        ax.set_ylabel(r"Frobenius bound $\frac{1}{2}(\|A\|_F^2+\|B\|_F^2)$")
        ax.set_title(f"{PRODUCT_LABEL[product]}: one point per head")
        fig.colorbar(sc, ax=ax, label="layer")
    fig.suptitle(f"{result.meta['source']}: bound vs nuclear norm (equal iff balanced)")
    return fig


def rank_heatmaps(result, column: str = "rank") -> plt.Figure:
    """Layer × head heatmap of a rank measure, one panel per product."""
    t = result.table
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(result.meta["layers"]) + 2.2))
    dh = result.meta["config"]["head_dim"]
    for ax, product in zip(axes, ("qk", "ov"), strict=True):
        grid = t[t["product"] == product].pivot(index="layer", columns="head", values=column)
        im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="magma", vmin=0, vmax=dh)
        ax.set_yticks(range(len(grid.index)), [str(i) for i in grid.index])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{column} of {PRODUCT_LABEL[product]} (max {dh})")
        fig.colorbar(im, ax=ax)
    tol = result.meta["tolerance"]
    fig.suptitle(f"{result.meta['source']}: {column}" + (f" (tau = {tol:g})" if column == "rank" else ""))
    return fig


def sv_curves(result) -> plt.Figure:
    """Normalised singular values σ_i/σ_1 of every head, coloured by layer."""
    layers = result.meta["layers"]
    cmap = plt.get_cmap("viridis", max(len(layers), 2))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), sharey=True)
    for ax, product in zip(axes, ("qk", "ov"), strict=True):
        sv = result.sv[product]
        for j, layer in enumerate(layers):
            for h in range(sv.shape[1]):
                s = sv[j, h]
                if not np.all(np.isfinite(s)) or s[0] <= 0:
                    continue
                ax.plot(np.arange(1, s.size + 1), s / s[0], color=cmap(j), lw=0.7, alpha=0.7,
                        label=f"layer {layer}" if h == 0 and len(layers) <= 12 else None)
        ax.axhline(result.meta["tolerance"], color="red", lw=0.8, ls=":", label="rank threshold")
        ax.set_yscale("log")
        ax.set_xlabel("index i")
        ax.set_title(PRODUCT_LABEL[product])
    axes[0].set_ylabel(r"$\sigma_i / \sigma_1$")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{result.meta['source']}: singular values of every head")
    return fig


def spectra_figures(result, out: str | os.PathLike) -> list[Path]:
    out = Path(out)
    return [
        save_figure(fig4_rows(result), out / "fig4_rows.png"),
        save_figure(fig4_norms(result), out / "fig4_norms.png"),
        save_figure(rank_heatmaps(result, "rank"), out / "rank_heatmap.png"),
        save_figure(rank_heatmaps(result, "effective_rank"), out / "effective_rank_heatmap.png"),
        save_figure(sv_curves(result), out / "singular_values.png"),
    ]
