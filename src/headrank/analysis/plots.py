"""Figures (matplotlib, Agg). Plots draw results; they compute nothing of substance."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headrank.util.fileio import write_atomic  # noqa: E402

PRODUCT_LABEL = {"qk": r"$W_K^\top W_Q$", "ov": r"$P W_V$"}


def save_figure(fig, path: str | os.PathLike, dpi: int = 120, tight: bool = True) -> Path:
    """``fig`` as a PNG at ``path`` (atomic), then closed. ``tight=False`` for figures laid out
    at creation: ``bbox_inches="tight"`` renders the figure twice."""
    kw = {"bbox_inches": "tight"} if tight else {}
    try:
        return write_atomic(path, lambda p: fig.savefig(p, dpi=dpi, format="png", **kw))
    finally:
        plt.close(fig)


def _diag(ax, lo: float, hi: float) -> None:
    ax.plot([lo, hi], [lo, hi], color="0.4", lw=1, ls="--", zorder=0, label="y = x")


# --------------------------------------------------------------------------- spectra (headrank spectra)
# Drawn from ``headrank.analysis.figproc.figure_data`` (numpy arrays only), in the spectra
# process or in a separate one started before torch is imported. One artist per panel (no
# per-head Python loops), fixed margins and title heights (no layout pass measuring every label),
# 100 dpi.
SPECTRA_DPI = 100
_LAYER_CMAP = "viridis"


def _panels(nrows: int, ncols: int, *, figsize, top: float = 0.88, bottom: float = 0.12,
            hspace: float = 0.3, **kw):
    """Subplots with fixed margins: measuring every label for an automatic layout (constrained
    or ``bbox_inches="tight"``) cost more than drawing the figure."""
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, **kw)
    fig.subplots_adjust(left=0.08, right=0.97, top=top, bottom=bottom, wspace=0.28, hspace=hspace)
    return fig, axes


def _layer_key(fig, ax, layers: np.ndarray):
    """A colour per layer and, with more than one layer, a colour bar keyed by layer index."""
    lo, hi = float(layers.min()), float(max(layers.max(), layers.min() + 1))
    norm = matplotlib.colors.Normalize(lo, hi)
    if len(layers) > 1:
        sm = matplotlib.cm.ScalarMappable(norm=norm, cmap=_LAYER_CMAP)
        fig.colorbar(sm, ax=ax, label="layer", fraction=0.05, pad=0.02)
    return norm


def _title(data: dict, what: str) -> str:
    layers = data["layers"]
    span = f"layer {layers[0]}" if len(layers) == 1 else f"{len(layers)} layers"
    return f"{data['name']} ({span}): {what}"


def fig4_rows(data: dict) -> plt.Figure:
    """Squared row norms of W_Q vs W_K and of W_V vs columns of P, head 0 of each layer."""
    layers = data["layers"]
    fig, axes = _panels(1, 2, figsize=(10, 4.3))
    norm = _layer_key(fig, list(axes), layers)
    for ax, (x, y, xl, yl) in zip(axes, (("k", "q", r"$\|$row of $W_K\|^2$", r"$\|$row of $W_Q\|^2$"),
                                          ("p", "v", r"$\|$column of $P\|^2$", r"$\|$row of $W_V\|^2$")),
                                  strict=True):
        xs, ys = data[f"rows_{x}"], data[f"rows_{y}"]  # (layers, dh)
        c = np.repeat(layers, xs.shape[1]).astype(float)
        ax.scatter(xs.ravel(), ys.ravel(), s=6, c=c, cmap=_LAYER_CMAP, norm=norm, linewidths=0)
        pos = np.concatenate([xs.ravel(), ys.ravel()])
        pos = pos[np.isfinite(pos) & (pos > 0)]
        if pos.size:
            _diag(ax, pos.min(), pos.max())
            if pos.max() > 10 * pos.min():  # log axes only where the norms span a decade
                ax.set_xscale("log")
                ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
    fig.suptitle(_title(data, "head 0 of each layer; balance puts points on y = x (cf. paper Fig. 4)"),
                 fontsize=10)
    return fig


def fig4_norms(data: dict) -> plt.Figure:
    """Frobenius bound ½(‖A‖²+‖B‖²) against nuclear norm, one point per head, all layers."""
    layers = data["layers"]
    fig, axes = _panels(1, 2, figsize=(10, 4.3))
    norm = _layer_key(fig, list(axes), layers)
    for ax, product in zip(axes, ("qk", "ov"), strict=True):
        nuc, bound = data[f"{product}_nuclear"], data[f"{product}_frob_bound"]
        c = np.broadcast_to(layers[:, None], nuc.shape).astype(float)
        ok = data[f"{product}_finite"].astype(bool)
        ax.scatter(nuc[ok], bound[ok], c=c[ok], s=10, cmap=_LAYER_CMAP, norm=norm, linewidths=0)
        if ok.any():
            lo = float(min(nuc[ok].min(), bound[ok].min()))
            hi = float(max(nuc[ok].max(), bound[ok].max()))
            _diag(ax, lo, hi)
        ax.set_xlabel(r"nuclear norm $\|AB^\top\|_*$")
        ax.set_ylabel(r"Frobenius bound $\frac{1}{2}(\|A\|_F^2+\|B\|_F^2)$")
        ax.set_title(f"{PRODUCT_LABEL[product]}: one point per head", fontsize=10, y=1.0)
    fig.suptitle(_title(data, "bound vs nuclear norm (equal iff balanced)"), fontsize=10)
    return fig


HEATMAP_MEASURES = (("effective_rank", "effective rank"), ("k90", "k90 (σ² energy)"), ("rank", "numerical rank"))


def _flat(grid: np.ndarray, scale: float) -> str | None:
    """What a near-solid panel would show, as text: its finite entries span less than 1 % of
    ``scale`` (the head width); None when the grid moves."""
    v = grid[np.isfinite(grid)]
    if not v.size or v.max() - v.min() >= 0.01 * scale:
        return None
    return f"{v[0]:g}" if v.min() == v.max() else f"{v.min():.4g} to {v.max():.4g}"


def rank_heatmaps(data: dict) -> plt.Figure | None:
    """Layer × head maps of the rank measures that move, effective rank first; a panel whose
    heads all share one value is a line of text, not a solid square (None: nothing moves)."""
    layers, dh = data["layers"], int(data["head_dim"])
    rows = [(k, label) for k, label in HEATMAP_MEASURES if f"qk_{k}" in data
            and not all(_flat(data[f"{p}_{k}"], dh) is not None for p in ("qk", "ov"))]
    if not rows:
        return None
    height = len(rows) * (0.16 * len(layers) + 1.6) + 0.6
    fig, axes = _panels(len(rows), 2, figsize=(11, height), squeeze=False, top=1 - 0.75 / height,
                        bottom=0.5 / height, hspace=0.5)
    for (key, label), pair in zip(rows, axes, strict=True):
        grids = [data[f"{p}_{key}"] for p in ("qk", "ov")]
        vals = np.concatenate([g[np.isfinite(g)] for g in grids])
        im = None
        for ax, product, grid in zip(pair, ("qk", "ov"), grids, strict=True):
            flat = _flat(grid, dh)
            if flat is not None:
                ax.set_axis_off()
                ax.text(0.5, 0.5, f"{label} of {PRODUCT_LABEL[product]}:\nevery head {flat} (of {dh})",
                        ha="center", va="center", transform=ax.transAxes)
                continue
            im = ax.imshow(grid, aspect="auto", cmap="magma", vmin=vals.min(), vmax=vals.max(),
                           interpolation="nearest")
            step = max(1, len(layers) // 16)
            ax.set_yticks(range(0, len(layers), step), [str(i) for i in layers[::step]])
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(f"{label} of {PRODUCT_LABEL[product]} (of {dh})", fontsize=10, y=1.0)
        if im is not None:
            cb = fig.colorbar(im, ax=list(pair), label=label, fraction=0.04, pad=0.02)
            cb.formatter.set_useOffset(False)
    tol = float(data["tol"])
    fig.suptitle(_title(data, f"rank measures per head (numerical rank at tau = {tol:g})"), fontsize=10)
    return fig


def sv_curves(data: dict) -> plt.Figure:
    """Normalised singular values σ_i/σ_1 of every head, one line collection per product,
    coloured by layer."""
    from matplotlib.collections import LineCollection

    layers = data["layers"]
    fig, axes = _panels(1, 2, figsize=(10, 4.3), sharey=True)
    norm = _layer_key(fig, list(axes), layers)
    for ax, product in zip(axes, ("qk", "ov"), strict=True):
        sv = data[f"sv_{product}"]  # (layers, heads, k)
        k = sv.shape[-1]
        s1 = sv[..., :1]
        ok = np.isfinite(sv).all(-1) & (s1[..., 0] > 0)
        rel = np.where(s1 > 0, sv / np.where(s1 > 0, s1, 1.0), np.nan)
        rel = np.where(rel > 0, rel, np.nan)  # a zero singular value: a gap on the log axis
        y = rel[ok]
        segs = np.stack([np.broadcast_to(np.arange(1, k + 1, dtype=float), y.shape), y], axis=-1)
        lc = LineCollection(segs, cmap=_LAYER_CMAP, norm=norm, linewidths=0.6, alpha=0.7)
        lc.set_array(np.broadcast_to(layers[:, None], ok.shape)[ok].astype(float))
        ax.add_collection(lc)
        ax.axhline(float(data["tol"]), color="red", lw=0.8, ls=":", label="rank threshold")
        if "random_sv" in data:  # mean σ_i/σ_1 of Gaussian factors of the same shapes (core.baseline)
            r = np.asarray(data["random_sv"], dtype=float)
            ax.plot(np.arange(1, len(r) + 1), r, color="black", lw=1.2, ls="--", label="random product")
        ax.set_xlim(0.5, k + 0.5)
        finite = y[np.isfinite(y)]
        if finite.size:
            ax.set_ylim(min(finite.min(), float(data["tol"])) * 0.5, 2.0)
        ax.set_yscale("log")
        ax.set_xlabel("index i")
        ax.set_title(PRODUCT_LABEL[product], fontsize=10, y=1.0)
    axes[0].set_ylabel(r"$\sigma_i / \sigma_1$")
    axes[1].legend(fontsize=7, loc="lower left")
    fig.suptitle(_title(data, "singular values of every head"), fontsize=10)
    return fig


SPECTRA_FIGURES = (("singular_values.png", sv_curves), ("rank_heatmap.png", rank_heatmaps),
                   ("fig4_norms.png", fig4_norms), ("fig4_rows.png", fig4_rows))


def draw_spectra(data: dict, out: str | os.PathLike) -> list[Path]:
    """The spectra figures of ``figure_data(result)`` into ``out``; the paths written (a
    figure with nothing that moves is left out)."""
    out = Path(out)
    written = []
    for name, make in SPECTRA_FIGURES:
        fig = make(data)
        if fig is not None:
            written.append(save_figure(fig, out / name, dpi=SPECTRA_DPI, tight=False))
    return written


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


def sweep_figure(summary, keys: list[str]) -> plt.Figure:
    """A sweep's summary: each metric (``METRIC_mean`` ± ``METRIC_std``, or the one seed's
    ``METRIC``) against the first swept field, one line per value of the others."""
    metrics = [c[:-5] if c.endswith("_mean") else c for c in summary.columns
               if c not in (*keys, "runs", "failed") and not c.endswith("_std")]
    n = max(1, min(len(metrics), 6))
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.2), squeeze=False)
    x = keys[0] if keys else None
    rest = keys[1:]
    groups = summary.groupby(rest, sort=False, dropna=False) if rest else [((), summary)]
    for ax, m in zip(axes[0], metrics[:n], strict=False):
        col = f"{m}_mean" if f"{m}_mean" in summary else m
        for key, g in groups:
            xs = g[x] if x else np.arange(len(g))
            err = g[f"{m}_std"] if f"{m}_std" in g else None
            ax.errorbar(xs, g[col], yerr=err, marker="o", ms=3, capsize=2,
                        label=", ".join(f"{k}={v}" for k, v in zip(rest, key if isinstance(key, tuple) else (key,),
                                                                    strict=False)) or None)
        ax.set_title(m, fontsize=9)
        ax.set_xlabel(x or "grid point")
        ax.grid(alpha=0.3)
    if rest:
        axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def train_figure(rows) -> plt.Figure:
    """A training run's rows: loss (and accuracy) and the mean effective rank of QK and OV
    against step."""
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.2), squeeze=False)
    ax = axes[0][0]
    for col in ("loss", "val_loss", "test_loss"):
        if col in rows:
            d = rows.dropna(subset=[col])
            ax.plot(d["step"], d[col], marker="o" if col != "loss" else None, ms=3, label=col)
    ax.set_xlabel("step")
    ax.set_title("loss", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    for p in ("qk", "ov"):
        col = f"{p}_effective_rank"
        if col in rows:
            d = rows.dropna(subset=[col])
            ax.plot(d["step"], d[col], marker="o", ms=3, label=p.upper())
    ax.set_xlabel("step")
    ax.set_title("mean effective rank", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
