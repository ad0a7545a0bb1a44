"""Figures of the Figure 5 reproduction, drawn from the stored data only."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headrank.studies.fig5.claims import CONVERGED, TOL  # noqa: E402
from headrank.studies.fig5.params import Fig5Params  # noqa: E402
from headrank.studies.registry import FigureOut  # noqa: E402

FLOOR = 1e-12
MARKERS = {"direct": "o", "factorized": "s"}


def _trajectory_panel(ax, kind: str, data: dict[str, Any], w0) -> None:
    center, radius = data["S"]["center"], data["S"]["radius"]
    traj = data["trajectories"]
    th = np.linspace(0, 2 * np.pi, 400)
    eps_keys = sorted({k.split("/")[2] for k in traj}, key=lambda s: -float(s.split("=")[1]))
    colors = dict(zip(eps_keys, ["tab:purple", "tab:green", "tab:brown", "tab:cyan"], strict=False))
    ax.plot(center[0] + radius * np.cos(th), center[1] + radius * np.sin(th), color="orange", lw=2, label="S")
    for key, w in traj.items():
        k, opt, e = key.split("/")
        if k != kind:
            continue
        w = np.asarray(w, dtype=np.float64)
        ax.plot(w[:, 0], w[:, 1], color=colors[e], ls="-" if opt == "adamw" else ":", lw=1.6 if opt == "adamw" else 2.2,
                label=f"{'AdamW' if opt == 'adamw' else 'Adam + L2'}, {e.replace('eps', 'ε')}")
    for e, opt_pts in data["traj_optima"].items():
        o = opt_pts["l2"] if kind == "direct" else opt_pts["l1"]
        ax.scatter([o[0]], [o[1]], s=60, facecolors="none", edgecolors=colors.get(e, "k"), zorder=5)
    for pt, color, label in ((data["min_l2_point_on_S"], "red", "L2-minimal point of S"),
                             (data["min_l1_point_on_S"], "blue", "L1-minimal point of S")):
        ax.scatter([pt[0]], [pt[1]], marker="x", s=90, color=color, zorder=6, label=label)
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


def fig5_trajectories(data: dict[str, Any], w0) -> plt.Figure:
    """Paper Figure 5: trajectories in the (w1, w2) plane, direct (left) and factorized (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    for ax, kind in zip(axes, ("direct", "factorized"), strict=True):
        _trajectory_panel(ax, kind, data, w0)
    fig.tight_layout()
    return fig


def _floor(values) -> np.ndarray:
    return np.maximum(np.array([np.inf if v is None else v for v in values], dtype=np.float64), FLOOR)


def _eps_panel(ax, rows: list[dict], lam_main: float) -> None:
    lrs = sorted({r["lr"] for r in rows}, reverse=True)
    lr_colors = dict(zip(lrs, ["tab:blue", "tab:red", "tab:green"], strict=False))
    for lr in lrs:
        for kind in ("direct", "factorized"):
            sel = sorted((r for r in rows if r["opt"] == "adamw" and r["lr"] == lr and r["kind"] == kind
                          and r["lam_wd"] == lam_main), key=lambda r: r["eps"])
            e = np.array([r["eps"] for r in sel])
            dist = _floor([r["dist_target"] for r in sel])
            settled = np.array([r["tail_spread"] is not None and r["tail_spread"] < CONVERGED for r in sel])
            ax.plot(e, dist, color=lr_colors[lr], lw=0.8, ls="-" if kind == "direct" else "--")
            ax.scatter(e[settled], dist[settled], marker=MARKERS[kind], color=lr_colors[lr], label=f"{kind}, lr = {lr:g}")
            ax.scatter(e[~settled], dist[~settled], marker=MARKERS[kind], facecolors="none", edgecolors=lr_colors[lr])
    ax.axhline(TOL, color="0.3", ls=":", lw=1, label=f"tolerance {TOL:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Adam ε")
    ax.set_ylabel("|AdamW end point − optimum(λ_wd·ε)|")
    ax.set_title(f"ε sweep, λ_wd = {lam_main:g} (hollow: not converged)")
    ax.legend(fontsize=7)


def _wd_panel(ax, rows: list[dict], eps_main: float, lr0: float) -> None:
    for kind in ("direct", "factorized"):
        sel = sorted((r for r in rows if r["opt"] == "adamw" and r["lr"] == lr0 and r["kind"] == kind
                      and r["eps"] == eps_main), key=lambda r: r["lam_wd"])
        lw = [r["lam_wd"] for r in sel]
        ax.plot(lw, _floor([r["dist_target"] for r in sel]), marker=MARKERS[kind], label=f"{kind}: to optimum(λ_wd·ε)")
        ax.plot(lw, _floor([r["dist_fixed_point"] for r in sel]), marker=MARKERS[kind], ls="--",
                label=f"{kind}: to exact AdamW fixed point")
    ax.axhline(TOL, color="0.3", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("λ_wd")
    ax.set_title(f"λ_wd sweep, ε = {eps_main:g}, lr = {lr0:g}")
    ax.legend(fontsize=7)


def fig5_sweeps(data: dict[str, Any], p: Fig5Params) -> plt.Figure:
    """Distance of the AdamW end point to the conjectured optimum (λ_L2 = λ_wd·ε), against ε and λ_wd."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    _eps_panel(axes[0], data["runs"], p.lam_main)
    _wd_panel(axes[1], data["runs"], p.eps_main, p.schedules[0][0])
    fig.tight_layout()
    return fig


def figures(data: dict[str, Any], p: Fig5Params) -> list[FigureOut]:
    """The trajectories (paper Figure 5) and the ε / λ_wd sweeps."""
    return [
        FigureOut("fig5", fig5_trajectories(data, p.w0),
                  f"Trajectories of (w1, w2) (cf. paper Fig. 5), lam_wd = {p.lam_main}. Left: direct; right: w = a*b. "
                  "Solid: AdamW; dotted: Adam + L2 with lam_L2 = lam_wd*eps. Red x: L2-minimal point of S; blue x: "
                  "L1-minimal point; circles: regularised optima for each eps."),
        FigureOut("fig5_sweeps", fig5_sweeps(data, p),
                  "How well lam_L2 = lam_wd*eps describes the AdamW end point. Left: distance to the conjectured "
                  "optimum against eps (per learning rate; hollow markers: not converged). Right: against lam_wd at "
                  f"eps = {p.eps_main}, with the distance to the exact AdamW fixed point."),
    ]
