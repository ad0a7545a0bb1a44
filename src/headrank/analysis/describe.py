"""A result at a glance, as WeightWatcher users expect: :func:`describe` (one wide row per layer)
and :func:`plot` (one figure). Both read only a result's table, singular values and meta; the
numbers are those of ``heads.csv`` (means over a layer's heads)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: leading per-layer columns of :func:`describe`, in this order where the table has them
LEAD = ("effective_rank", "k90", "k99", "stable_rank", "gap_rel", "balance_rel", "rank")


def describe(table: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    """One row per layer (an encoder-decoder: per ``attention`` kind and layer): ``layer``,
    ``source`` (what was analysed), ``model_type``, ``heads``,
    ``head_dim``, then ``qk_METRIC`` and ``ov_METRIC`` for every numeric metric of the table
    (mean over the layer's heads; what moves first: effective rank, k90, k99, stable rank,
    gap/bound, balance, numerical rank, then the norms)."""
    keys = ["attention", "layer"] if "attention" in table.columns else ["layer"]  # an encoder-decoder: per kind
    if table.empty or not {"layer", "product", "head", "head_dim"} <= set(table.columns):  # no rows: no layers
        return pd.DataFrame(columns=[*keys, "source", "model_type", "heads", "head_dim"])
    skip = {"attention", "layer", "head", "kv_head", "product", "head_dim", "finite"}
    metrics = [c for c in table.columns if c not in skip and pd.api.types.is_numeric_dtype(table[c])]
    metrics = [m for m in LEAD if m in metrics] + [m for m in metrics if m not in LEAD]
    if "attention" in keys:  # its kinds in the model's order (encoder, decoder, cross)
        table = table.assign(attention=pd.Categorical(table["attention"], list(dict.fromkeys(table["attention"]))))
    g = table.groupby([*keys, "product"], sort=True, observed=True)
    means = g[metrics].mean()
    wide = means.unstack("product")
    products = [p for p in ("qk", "ov") if p in table["product"].unique()]
    cols = {f"{p}_{m}": wide[(m, p)] for p in products for m in metrics}
    out = pd.DataFrame(cols)
    first = g.agg(heads=("head", "size"), head_dim=("head_dim", "first")).groupby(level=keys, observed=True).first()
    out.insert(0, "head_dim", first["head_dim"])
    out.insert(0, "heads", first["heads"])
    out.insert(0, "model_type", meta.get("model_type"))
    out.insert(0, "source", str(meta.get("source")))
    out = out.reset_index()
    if "attention" in keys:
        out["attention"] = out["attention"].astype(str)
    return out


def model_name(meta: dict[str, Any]) -> str:
    """A title's name for the model: a Hub id or a shipped name as it is, a path's last part."""
    src = str(meta.get("source", ""))
    hub = (meta.get("hub") or {}).get("repo_id") if isinstance(meta.get("hub"), dict) else None
    if hub:
        return str(hub)
    return Path(src).name or src if os.sep in src or src.startswith(".") else src


def plot(table: pd.DataFrame, sv: dict[str, np.ndarray], meta: dict[str, Any],
         path: str | os.PathLike | None = None):
    """Effective rank per layer (QK and OV: mean over heads, band from the lowest to the highest
    head; k90 dashed where the table has it) and every head's σᵢ/σ₁ for QK and OV, coloured by
    layer with a colour key. Returns the matplotlib Figure; with ``path``, also writes a PNG."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    span = ""
    if meta.get("attention") is not None:  # an encoder-decoder: its kinds' layers in turn on one axis
        from headrank.analysis.figproc import kinds_span, unit_positions

        table, span = table.assign(layer=unit_positions(table, meta)), f" ({kinds_span(meta)})"
    for p, color in (("qk", "tab:blue"), ("ov", "tab:orange")):
        t = table[table["product"] == p]
        if t.empty:
            continue
        g = t.groupby("layer")["effective_rank"]
        ax.plot(g.mean().index, g.mean().to_numpy(), marker="o", color=color, label=f"{p.upper()} effective rank")
        ax.fill_between(g.min().index, g.min().to_numpy(), g.max().to_numpy(), color=color, alpha=0.15)
        if "k90" in t:
            k = t.groupby("layer")["k90"].mean()
            ax.plot(k.index, k.to_numpy(), ls="--", color=color, label=f"{p.upper()} k90")
        if "effective_rank_random" in t:  # the random product of the same shapes (core.baseline)
            r = t.groupby("layer")["effective_rank_random"].mean()
            ax.plot(r.index, r.to_numpy(), ls=":", color=color, label=f"{p.upper()} random product")
    ax.set_xlabel("layer" + span)
    ax.set_ylabel("mean over heads (band: min to max)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    cmap = plt.get_cmap("viridis")
    for ax, p in zip(axes[1:], ("qk", "ov"), strict=True):
        s = np.asarray(sv.get(p, np.zeros((0, 0, 0))), dtype=np.float64)
        L = s.shape[0]
        for layer in range(L):
            for h in range(s.shape[1]):
                top = s[layer, h, 0] if s.shape[2] else 0.0
                if top > 0 and np.isfinite(top):
                    ax.semilogy(np.arange(1, s.shape[2] + 1), s[layer, h] / top, lw=0.6, alpha=0.6,
                                color=cmap(layer / max(L - 1, 1)))
        ax.set_title(f"{p.upper()}: sigma_i / sigma_1, every head", fontsize=10)
        ax.set_xlabel("i")
        ax.grid(alpha=0.3)
        if L:
            fig.colorbar(ScalarMappable(norm=Normalize(0, max(L - 1, 1)), cmap=cmap), ax=ax, label="layer")
    fig.suptitle(f"{model_name(meta)} ({meta.get('model_type')}): attention spectra", fontsize=11)
    fig.tight_layout()
    if path is not None:
        from headrank.util.fileio import write_atomic

        write_atomic(path, lambda q: fig.savefig(q, dpi=110, format="png"))
        plt.close(fig)
    return fig

