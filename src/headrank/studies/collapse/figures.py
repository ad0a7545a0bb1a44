"""Figures of the collapse reproduction, drawn from the stored data only."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from headrank.studies.collapse.params import CollapseParams  # noqa: E402
from headrank.studies.registry import FigureOut  # noqa: E402


def collapse_depth_sweep(sweep: dict, floor: float = 1e-17) -> plt.Figure:
    """Pure self-attention: geometric-mean residual against depth per init scale, with the
    exponential and doubly exponential fits over the depths used."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.85, max(len(sweep["curves"]), 2)))
    depths = np.asarray(sweep["depths"], dtype=float)
    for color, (std, c) in zip(colors, sweep["curves"].items(), strict=False):
        ax.plot(depths, np.maximum(np.asarray(c["geo_mean"], dtype=float), floor), marker="o", color=color,
                label=f"init std {std}")
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
        FigureOut("depth_sweep", collapse_depth_sweep(data["depth_sweep"]),
                  "Pure self-attention (project Transformer, no skip/MLP/norm) at random init: residual against "
                  "depth per init scale, with exponential (dotted) and doubly exponential (dashed) fits of log r."),
        FigureOut("path_products", plots.collapse_path_products(pd.DataFrame(data["path_products"]), meta, paths),
                  f"Left: share of paths of each length in {p.model} (L = {meta.get('n_layers')}, H = "
                  f"{meta.get('n_heads')}). Right: residual of products of the pretrained model's attention "
                  "matrices along sampled head paths."),
        FigureOut("path_restricted", collapse_path_restricted(
            list(range(n_lengths)), {k: v["geo_mean"] for k, v in restricted.items()}),
                  f"Project Transformer ({p.restricted_layers} layers, skips, no MLP) restricted to paths of length "
                  "k, frozen attention."),
    ]
