"""Figures of the toy reproductions (fig1, prop31, fig5)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from attnrank.analysis.plots import _diag  # noqa: E402

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
