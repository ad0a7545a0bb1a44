"""Figures of the collapse reproduction, drawn from the stored data only."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from headrank.studies.collapse.depth_claims import depth_fits, heads_modulate  # noqa: E402
from headrank.studies.collapse.params import CollapseParams  # noqa: E402
from headrank.studies.registry import FigureOut  # noqa: E402


def collapse_depth_sweep(sweep: dict, fits: dict | None = None) -> plt.Figure:
    """Pure self-attention: −log10 of the relative residual against depth per init scale, on a
    log axis (a doubly exponential decay is a straight line of slope log10 3 per layer): the
    exact residual (solid), the float64 forward pass's (dotted; it stops near 16, its rounding
    floor), and the fit ``a + b·3^L`` over each judged curve's window (dashed)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.85, max(len(sweep["curves"]), 2)))
    depths = np.asarray(sweep["depths"], dtype=float)
    for color, (std, c) in zip(colors, sweep["curves"].items(), strict=False):
        if "log10_rel_mean" not in c:  # an older run: its float64 forward's geometric mean, no exact residual
            with np.errstate(divide="ignore"):
                plain = -np.log10(np.asarray(c["geo_mean"], dtype=float))
            ax.plot(depths, plain, marker="o", color=color, ls=":", lw=1, label=f"init std {std} (float64 only)")
            continue
        exact = -np.asarray([np.nan if v is None else v for v in c["log10_rel_mean"]], dtype=float)
        ax.plot(depths, exact, marker="o", color=color, label=f"init std {std}")
        plain = -np.asarray(c["log10_rel_float64_mean"], dtype=float)
        ax.plot(depths, plain, color=color, ls=":", lw=1)
        f = (fits or {}).get(f"SAN init std {std}", {})
        if "window" in f:
            L = np.linspace(f["window"][0], f["window"][1], 100)
            ax.plot(L, -(f["a (3^L)"] + f["b (3^L)"] * 3.0**L), color=color, ls="--", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("depth L (pure attention layers)")
    ax.set_ylabel("-log10 residual (composite, relative; mean over sequences)")
    ax.set_title("solid: exact; dotted: float64 forward (floor ~16); dashed: a + b 3^L over the judged window",
                 fontsize=8)
    ax.legend(fontsize=7)
    return fig


def collapse_heads(measured: dict) -> plt.Figure:
    """The collapse rate (mean over networks of ``log10 r_{l+1} − 3 log10 r_l``) against the
    number of heads, one line per init scale, and the stated bound's base ``log10(βH/√d_qk)``
    (dashed)."""
    fig, ax = plt.subplots(figsize=(6.2, 4.3))
    parts = {k: v for k, v in measured.items() if isinstance(v, dict) and "mean rate by H" in v}
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.85, max(len(parts), 2)))
    for color, (name, v) in zip(colors, parts.items(), strict=False):
        H = [int(h.split("=")[1]) for h in v["mean rate by H"]]
        ax.plot(H, [np.nan if x is None else x for x in v["mean rate by H"].values()], marker="o", color=color,
                label=name)
        base = v["bound's base log10(beta H / sqrt(d_qk)) by H"]
        ax.plot(H, list(base.values()), color=color, ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("heads H (width fixed, d_qk = d/H)")
    ax.set_ylabel("log10 r_(l+1) - 3 log10 r_l (cubic regime)")
    ax.set_title("solid: measured rate constant; dashed: the bound's base log10(beta H / sqrt(d_qk))", fontsize=8)
    ax.legend(fontsize=7)
    return fig


def collapse_path_restricted(lengths, curves: dict, floor: float = 1e-17) -> plt.Figure:
    """Residual of the project's model restricted to paths of length k, one line per setting."""
    fig, ax = plt.subplots(figsize=(6.2, 4.3))
    for name, y in curves.items():
        ax.plot(lengths, np.maximum(np.asarray(y, dtype=float), floor), marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xlabel("path length k")
    ax.set_ylabel("residual of the length-k part (composite, geometric mean)")
    ax.set_title("model output restricted to paths of length k (frozen attention)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def figures(data: dict[str, Any], p: CollapseParams) -> list[FigureOut]:
    """Layers by variant, depth sweep, path products, path-restricted model."""
    from headrank.analysis import plots

    meta = data["minilm_meta"]
    restricted = data["path_restricted"]
    n_lengths = len(next(iter(restricted.values()))["geo_mean"]) if restricted else 0
    paths = pd.DataFrame(data["paths"]) if data["paths"]["length"] else None
    return [
        FigureOut("collapse_layers", plots.collapse_layers(pd.DataFrame(data["layers"]), meta),
                  f"{p.model}: relative residual |X - 1x^T|/|X| (composite l1,inf norm, x = mean row) after each "
                  "layer, for the four surgical variants, pretrained and re-initialised; mean ± std over sentences. "
                  "The float64 rounding floor is about 1e-16."),
        FigureOut("depth_sweep", collapse_depth_sweep(data["depth_sweep"], depth_fits(data, p)),
                  "Pure self-attention (project Transformer, no skip/MLP/norm) at random init: -log10 of the relative "
                  "residual against depth per init scale, computed exactly past the float64 floor (solid), by the "
                  "float64 forward pass (dotted), and the fit a + b 3^L over each judged window (dashed)."),
        FigureOut("path_products", plots.collapse_path_products(pd.DataFrame(data["path_products"]), meta, paths),
                  f"Left: share of paths of each length in {p.model} (L = {meta.get('n_layers')}, H = "
                  f"{meta.get('n_heads')}). Right: residual of products of the pretrained model's attention "
                  "matrices along sampled head paths."),
        FigureOut("path_restricted", collapse_path_restricted(
            list(range(n_lengths)), {k: v["geo_mean"] for k, v in restricted.items()}),
                  f"Project Transformer ({p.restricted_layers} layers, skips, no MLP) restricted to paths of length "
                  "k, frozen attention."),
    ] + ([FigureOut("heads", collapse_heads(heads_modulate(data, p).measured),
                    "The depth sweep's networks with 1-8 heads at a fixed width: the per-layer constant of "
                    "r_(l+1) = c r_l^3 (log10, mean over networks) against H per init scale, and the stated bound's "
                    "base log10(beta H / sqrt(d_qk)) (dashed).")] if "heads_sweep" in data else [])
