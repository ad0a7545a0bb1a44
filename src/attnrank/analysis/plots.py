"""Figures (matplotlib, Agg). Plots draw results; they compute nothing of substance."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attnrank.util.fileio import write_atomic  # noqa: E402

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


# --------------------------------------------------------------------------- rank collapse (second document)

_VARIANT_STYLE = {"pure": ("tab:red", "o", "-", "attention only"), "mlp": ("tab:orange", "s", "-", "attention + MLP"),
                  "skip": ("tab:blue", "^", "--", "attention + skip"), "full": ("tab:green", "D", "-", "full")}


def collapse_layers(table, meta: dict, measure: str = "res_composite", floor: float = 1e-16) -> plt.Figure:
    """Relative residual against layer (log scale), one panel per init, one line per variant,
    mean ± std over the batch (band clipped at ``floor``, about float64 rounding)."""
    inits = list(dict.fromkeys(table["init"]))
    fig, axes = plt.subplots(1, len(inits), figsize=(5.2 * len(inits), 4.3), sharey=True, squeeze=False)
    for ax, init in zip(axes[0], inits, strict=True):
        for variant in dict.fromkeys(table["variant"]):
            s = table[(table["init"] == init) & (table["variant"] == variant) & (table["measure"] == measure)]
            s = s.sort_values("layer")
            color, marker, ls, label = _VARIANT_STYLE.get(variant, ("0.3", "o", "-", variant))
            m, sd = s["mean"].to_numpy(), s["std"].to_numpy()
            ax.plot(s["layer"], np.maximum(m, floor), marker=marker, ls=ls, color=color, label=label, ms=5)
            ax.fill_between(s["layer"], np.maximum(m - sd, floor), np.maximum(m + sd, floor), color=color, alpha=0.12)
        ax.set_yscale("log")
        ax.set_xlabel("layer (0 = embedding output)")
        ax.set_title(f"{init} weights")
    axes[0][0].set_ylabel(r"$\|X - 1x^\top\| / \|X\|$" + f"  ({measure})")
    axes[0][-1].legend(fontsize=8, loc="lower left")
    fig.suptitle(f"{meta.get('source', '')}: rank collapse by layer, mean ± std over {meta.get('n_seqs', '?')} "
                 "sequences (x = mean row; band clipped at 1e-16)", fontsize=10)
    return fig


def collapse_path_products(summary, meta: dict, paths=None, floor: float = 1e-17) -> plt.Figure:
    """Left: share of paths of each length, C(L,k)·H^k / (H+1)^L. Right: relative residual of
    products of attention matrices along sampled head paths against path length (every sample
    as a dot when ``paths`` is given; arithmetic and geometric means)."""
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2))
    counts = np.array([float(c) for c in summary["n_paths"]])
    axes[0].bar(summary["length"], counts / counts.sum(), color="0.5")
    axes[0].set_xlabel("path length k (heads on the path)")
    axes[0].set_ylabel(r"share of paths $\binom{L}{k}H^k / (H+1)^L$")
    axes[0].set_title(f"L = {meta.get('n_layers')}, H = {meta.get('n_heads')}")
    ax = axes[1]
    if paths is not None and len(paths):
        jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(paths))
        ax.scatter(paths["length"] + jitter, np.maximum(paths["residual"], floor), s=3, alpha=0.15, color="0.4",
                   label="sampled paths")
        geo = paths.groupby("length")["residual"].apply(lambda r: float(np.exp(np.log(np.maximum(r, floor)).mean())))
        ax.plot(geo.index, geo.to_numpy(), marker="s", color="tab:purple", label="geometric mean")
    ax.plot(summary["length"], np.maximum(summary["mean"], floor), marker="o", color="tab:blue", label="mean")
    ax.set_yscale("log")
    ax.set_xlabel("path length k")
    ax.set_ylabel("residual of the attention product (composite)")
    ax.set_title("products along sampled head paths")
    ax.legend(fontsize=8)
    fig.suptitle(f"{meta.get('source', '')}: paths through heads", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- scale invariance (third document)

_VERDICT_COLOR = {"invariant": "tab:green", "homogeneous": "tab:blue", "neither": "tab:red",
                  "no effect": "0.6", "zero": "0.8"}


def scale_tensor_deviations(table, meta: dict, floor: float = 1e-17) -> plt.Figure:
    """Per tensor (and group): deviation from invariance and from homogeneity, coloured by verdict."""
    n = len(table)
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.16 * n + 1.2)))
    y = np.arange(n)[::-1]
    inv = np.maximum(table["inv_dev"].to_numpy(float), floor)
    hom = np.maximum(np.nan_to_num(table["hom_dev"].to_numpy(float), nan=np.nan, posinf=1e3), floor)
    colors = [_VERDICT_COLOR.get(v, "k") for v in table["verdict"]]
    ax.scatter(inv, y, c=colors, marker="o", s=18, label="|f(cW) − f(W)| / |f(W)|")
    ax.scatter(hom, y, c=colors, marker="x", s=18, label="|f(cW) − c^k f(W)| / |c^k f(W)|")
    ax.axvline(meta.get("tol", 1e-6), color="k", ls="--", lw=0.8, label=f"tol = {meta.get('tol', 1e-6):g}")
    ax.set_xscale("log")
    ax.set_yticks(y)
    labels = [f"{nm}  [{v}{'' if not np.isfinite(k) or v != 'homogeneous' else f', k={k:.2f}'}]"
              for nm, v, k in zip(table["name"], table["verdict"], table["k"].to_numpy(float), strict=True)]
    ax.set_yticklabels(labels, fontsize=6 if n > 40 else 8)
    ax.set_xlabel("relative deviation (max over c)")
    ax.set_title(f"{meta.get('source', '')}: scaling verdict per tensor "
                 f"(c in {', '.join(f'{c:g}' for c in meta.get('scales', []))})", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_ylim(-1, n)
    fig.tight_layout()
    return fig


def scale_pair_deviations(pairs, meta: dict, floor: float = 1e-18) -> plt.Figure:
    """Per layer: the pair symmetries (W_Q→cW_Q, W_K→W_K/c; W_V→cW_V, P→P/c) against the
    one-sided controls, at the attention module's output."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, prod, label in zip(axes, ("qk", "ov"), (r"$W_Q\to cW_Q,\ W_K\to W_K/c$", r"$W_V\to cW_V,\ P\to P/c$"),
                               strict=True):
        t = pairs[pairs["product"] == prod]
        ax.scatter(t["layer"] - 0.1, np.maximum(t["pair_dev"].to_numpy(float), floor), s=10, color="tab:green",
                   label="pair (should be 0)")
        ax.scatter(t["layer"] + 0.1, np.maximum(t["one_sided_dev"].to_numpy(float), floor), s=10, color="tab:red",
                   label="one side only (control)")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(label, fontsize=10)
    axes[0].set_ylabel("relative change of the attention output")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{meta.get('source', '')}: per-head rescaling symmetries", fontsize=10)
    fig.tight_layout()
    return fig


def lam_colors(n: int) -> list:
    """``n`` colours along viridis (0 to 0.9), one per λ (or any ordered setting); at least two."""
    cmap = plt.get_cmap("viridis")
    return [cmap(x) for x in np.linspace(0.0, 0.9, max(n, 2))]
