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


# --------------------------------------------------------------------------- toys (paper §3)


def _lam_colors(n: int):
    cmap = plt.get_cmap("viridis")
    return [cmap(x) for x in np.linspace(0.0, 0.9, max(n, 2))]


def fig1_panels(t, lambdas, gap, balance, balance_pred, sweep, sweep_sv, sweep_cf, sv_traj, lam_traj, cf_traj,
                t_eval: int) -> plt.Figure:
    """Paper Figure 1: gap, balance, singular values against λ at ``t_eval``, singular values over t.

    ``gap``, ``balance``, ``balance_pred`` (the predicted decay, NaN where not drawn):
    (T+1, len(lambdas)); ``sweep_sv``/``sweep_cf``: (len(sweep), n); ``sv_traj``: (T+1, n) for
    λ = ``lam_traj``; ``cf_traj``: its closed form.
    """
    floor = 1e-17  # plotting floor for log axes (gap/balance reach rounding level, can be <= 0)
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.3))
    colors = _lam_colors(len(lambdas))
    for j, lam in enumerate(lambdas):
        axes[0].plot(t, np.maximum(gap[:, j], floor), color=colors[j], label=f"λ = {lam:g}")
        axes[1].plot(t, np.maximum(balance[:, j], floor), color=colors[j], label=f"λ = {lam:g}")
        axes[1].plot(t, balance_pred[:, j], color="k", ls="--", lw=0.8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel(r"$\frac{1}{2}(\|A\|^2+\|B\|^2) - \|AB^\top\|_*$")
    axes[0].set_title("Frobenius bound minus nuclear norm")
    axes[1].set_yscale("log")
    axes[1].set_ylabel(r"$\|A^\top A - B^\top B\|_F$")
    axes[1].set_title(r"discrepancy; dashed: $(1-2\eta\lambda)^t$")
    for ax in axes[:2]:
        ax.set_xlabel("step t")
        ax.set_ylim(bottom=floor)
    axes[0].legend(fontsize=7)
    n = sweep_sv.shape[1]
    sv_colors = plt.get_cmap("plasma")(np.linspace(0.0, 0.85, n))
    for i in range(n):
        axes[2].plot(sweep, sweep_cf[:, i], color=sv_colors[i], lw=1)
        axes[2].scatter(sweep, sweep_sv[:, i], color=sv_colors[i], s=10, label=f"$s_{i + 1}$")
    axes[2].set_xlabel("λ")
    axes[2].set_ylabel("singular value")
    axes[2].set_title(f"singular values of $AB^\\top$ at t = {t_eval}; lines: max($d_i$ − λ/2, 0)")
    axes[2].legend(fontsize=7)
    for i in range(sv_traj.shape[1]):
        axes[3].plot(t, sv_traj[:, i], color=sv_colors[i], label=f"$s_{i + 1}$")
        axes[3].axhline(cf_traj[i], color=sv_colors[i], ls="--", lw=0.8)
    axes[3].set_xscale("symlog", linthresh=10)
    axes[3].set_xlim(0, t[-1])
    axes[3].set_xlabel("step t")
    axes[3].set_title(f"singular values over steps, λ = {lam_traj:g}")
    axes[3].legend(fontsize=7)
    fig.tight_layout()
    return fig


def prop31_scatter(nuc_bal, bound_bal, nuc_scaled, bound_scaled, nuc_indep, bound_indep) -> plt.Figure:
    """Proposition 3.1: Frobenius bound against nuclear norm for balanced and unbalanced pairs."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3))
    ax = axes[0]
    ax.scatter(nuc_bal, bound_bal, s=10, label="balanced  B = QA", color="tab:green")
    ax.scatter(nuc_scaled, bound_scaled, s=10, marker="^", label="rescaled (cA, B/c)", color="tab:orange")
    ax.scatter(nuc_indep, bound_indep, s=10, marker="s", label="independent A, B", color="tab:gray")
    allv = np.concatenate([nuc_bal, bound_bal, nuc_scaled, bound_scaled, nuc_indep, bound_indep])
    allv = allv[allv > 0]
    _diag(ax, allv.min(), allv.max())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"nuclear norm $\|AB^\top\|_*$")
    ax.set_ylabel(r"bound $\frac{1}{2}(\|A\|_F^2+\|B\|_F^2)$")
    ax.legend(fontsize=8)
    ax.set_title("bound = nuclear exactly when balanced")
    rel = np.abs(bound_bal - nuc_bal) / bound_bal
    axes[1].hist(np.log10(np.maximum(rel, 1e-18)), bins=30, color="tab:green")
    axes[1].set_xlabel(r"$\log_{10}$ |bound − nuclear| / bound, balanced pairs (exact 0 drawn at −18)")
    axes[1].set_ylabel("pairs")
    axes[1].set_title("balanced pairs: float64 rounding only")
    fig.tight_layout()
    return fig


def fig5_trajectories(center, radius, traj: dict, min_l2, min_l1, optima: dict, w0) -> plt.Figure:
    """Paper Figure 5: trajectories in the (w1, w2) plane, direct (left) and factorized (right).

    ``traj``: ``"{kind}/{opt}/eps={e}"`` → (steps, 2) trajectory; ``optima``: ``"eps=..."`` →
    (L2 optimum, L1 optimum).
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    th = np.linspace(0, 2 * np.pi, 400)
    eps_keys = sorted({k.split("/")[2] for k in traj}, key=lambda s: -float(s.split("=")[1]))
    colors = dict(zip(eps_keys, ["tab:purple", "tab:green", "tab:brown", "tab:cyan"], strict=False))
    for ax, kind in zip(axes, ("direct", "factorized"), strict=True):
        ax.plot(center[0] + radius * np.cos(th), center[1] + radius * np.sin(th), color="orange", lw=2, label="S")
        for key, w in traj.items():
            k, opt, e = key.split("/")
            if k != kind:
                continue
            ax.plot(w[:, 0], w[:, 1], color=colors[e], ls="-" if opt == "adamw" else ":", lw=1.6 if opt == "adamw" else 2.2,
                    label=f"{'AdamW' if opt == 'adamw' else 'Adam + L2'}, {e.replace('eps', 'ε')}")
        for e, (o2, o1) in optima.items():
            o = o2 if kind == "direct" else o1
            ax.scatter([o[0]], [o[1]], s=60, facecolors="none", edgecolors=colors.get(e, "k"), zorder=5)
        ax.scatter([min_l2[0]], [min_l2[1]], marker="x", s=90, color="red", zorder=6, label="L2-minimal point of S")
        ax.scatter([min_l1[0]], [min_l1[1]], marker="x", s=90, color="blue", zorder=6, label="L1-minimal point of S")
        ax.scatter([w0[0]], [w0[1]], marker="o", s=20, color="k", zorder=6, label="start")
        ax.axhline(0, color="0.7", lw=0.6)
        ax.axvline(0, color="0.7", lw=0.6)
        ax.set_xlim(-0.3, 2.0)
        ax.set_ylim(-0.3, 1.8)
        ax.set_aspect("equal")
        ax.set_xlabel("$w_1$")
        ax.set_ylabel("$w_2$")
        ax.set_title("direct: $w$ optimised" if kind == "direct" else "factorized: $w_i = a_i b_i$")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def fig5_sweeps(rows: list[dict], eps_sweep, wd_sweep, lam_main: float, eps_main: float, tol: float,
                converged: float) -> plt.Figure:
    """Distance of the AdamW end point to the conjectured optimum (λ_L2 = λ_wd·ε), against ε and λ_wd.

    Runs whose tail spread is ``>= converged`` are drawn hollow (not converged).
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    floor = 1e-12
    lrs = sorted({r["lr"] for r in rows}, reverse=True)
    styles = {"direct": "o", "factorized": "s"}
    lr_colors = dict(zip(lrs, ["tab:blue", "tab:red", "tab:green"], strict=False))
    ax = axes[0]
    for lr in lrs:
        for kind in ("direct", "factorized"):
            sel = [r for r in rows if r["opt"] == "adamw" and r["lr"] == lr and r["kind"] == kind
                   and r["lam_wd"] == lam_main]
            sel.sort(key=lambda r: r["eps"])
            e = np.array([r["eps"] for r in sel])
            dist = np.maximum([r["dist_target"] for r in sel], floor)
            settled = np.array([r["tail_spread"] < converged for r in sel])
            ax.plot(e, dist, color=lr_colors[lr], lw=0.8, ls="-" if kind == "direct" else "--")
            ax.scatter(e[settled], dist[settled], marker=styles[kind], color=lr_colors[lr],
                       label=f"{kind}, lr = {lr:g}")
            ax.scatter(e[~settled], dist[~settled], marker=styles[kind], facecolors="none", edgecolors=lr_colors[lr])
    ax.axhline(tol, color="0.3", ls=":", lw=1, label=f"tolerance {tol:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Adam ε")
    ax.set_ylabel("|AdamW end point − optimum(λ_wd·ε)|")
    ax.set_title(f"ε sweep, λ_wd = {lam_main:g}")
    ax.legend(fontsize=7)
    ax = axes[1]
    lr0 = lrs[0]
    for kind in ("direct", "factorized"):
        sel = [r for r in rows if r["opt"] == "adamw" and r["lr"] == lr0 and r["kind"] == kind and r["eps"] == eps_main]
        sel.sort(key=lambda r: r["lam_wd"])
        lw = [r["lam_wd"] for r in sel]
        ax.plot(lw, np.maximum([r["dist_target"] for r in sel], floor), marker=styles[kind],
                label=f"{kind}: to optimum(λ_wd·ε)")
        ax.plot(lw, np.maximum([r["dist_fixed_point"] for r in sel], floor), marker=styles[kind], ls="--",
                label=f"{kind}: to exact AdamW fixed point")
    ax.axhline(tol, color="0.3", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("λ_wd")
    ax.set_title(f"λ_wd sweep, ε = {eps_main:g}, lr = {lr0:g}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


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


def collapse_depth_sweep(sweep: dict, floor: float = 1e-17) -> plt.Figure:
    """Pure self-attention: geometric-mean residual against depth per init scale, with the
    exponential and doubly exponential fits over the depths used."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.85, max(len(sweep["curves"]), 2)))
    depths = np.asarray(sweep["depths"], dtype=float)
    for color, (std, c) in zip(colors, sweep["curves"].items(), strict=False):
        ax.plot(depths, np.maximum(c["geo_mean"], floor), marker="o", color=color, label=f"init std {std}")
        fit = c["fit"]
        if fit.get("fitted"):
            L = np.linspace(0, c["n_fit"] - 1, 100)
            d = fit["dexp"]
            ax.plot(L, np.exp(d["a"] + d["b"] * d["kappa"] ** L), color=color, ls="--", lw=1)
            e = fit["exp"]
            ax.plot(L, np.exp(e["a"] + e["b"] * L), color=color, ls=":", lw=1)
    ax.axhline(sweep.get("floor", 1e-12), color="0.5", lw=0.8, ls="-.", label="fit floor")
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    ax.set_xlabel("depth L (pure attention layers)")
    ax.set_ylabel("residual (composite, geometric mean)")
    ax.set_title("dashed: a + b κ^L (doubly exp.), dotted: a + b L (exp.), fits of log r", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def collapse_path_restricted(lengths, curves: dict, floor: float = 1e-17) -> plt.Figure:
    """Residual of the project's model restricted to paths of length k, one line per setting."""
    fig, ax = plt.subplots(figsize=(6.2, 4.3))
    for name, y in curves.items():
        ax.plot(lengths, np.maximum(y, floor), marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("path length k")
    ax.set_ylabel("residual of the length-k part (composite, geometric mean)")
    ax.set_title("model output restricted to paths of length k (frozen attention)", fontsize=9)
    ax.legend(fontsize=7)
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


def scale_training_curves(runs: dict, index: dict, variants, beta: float) -> plt.Figure:
    """Rows: variants; columns: |W| (mean over block matrices), η/|W|², minibatch loss, against
    step; one line per λ (first seed, the λ grid)."""
    fig, axes = plt.subplots(len(variants), 3, figsize=(15, 3.4 * len(variants)), squeeze=False)
    for i, v in enumerate(variants):
        r = runs[v]
        seed0 = r["seeds"][0]
        cols = [j for j, g in enumerate(index[v]) if g == "grid" and r["seeds"][j] == seed0]
        colors = _lam_colors(len(cols))
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
    axes[1].set_title("final training loss against λ", fontsize=10)
    axes[2].set_title("final test accuracy against λ", fontsize=10)
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
