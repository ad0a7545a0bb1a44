"""The figure of a rank series (``over_training.png``): one column per metric that moves, rows QK
and OV, one line per layer and their mean, against step (see :mod:`headrank.analysis.series`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from headrank.util.fileio import write_atomic

#: over_training.png's columns, what moves first: effective rank, k90 (where the table has it),
#: gap/bound, balance, and the numerical rank (which often sits at its maximum)
PANELS = (("effective_rank", "effective rank"), ("k90", "k90 (90% of the energy)"), ("gap_rel", "gap / bound"),
          ("balance_rel", "balance (relative)"), ("rank", "numerical rank"))


def moving_panels(summary: pd.DataFrame) -> list[tuple[str, str]]:
    """The :data:`PANELS` the summary has and that move: a metric whose every per-layer series is
    constant over the steps (in both products) would be a flat panel, and is left out."""
    keep = []
    for col, name in PANELS:
        if col not in summary:
            continue
        spread = summary.groupby([*_keys(summary), "product"])[col].agg(lambda v: v.max() - v.min() if v.notna().any() else 0)
        scale = max(float(summary[col].abs().max()), 1e-300)
        if (spread > 1e-9 * scale).any():
            keep.append((col, name))
    return keep or [PANELS[0]]


def _keys(summary: pd.DataFrame) -> list[str]:
    """The columns naming one attention layer (an encoder-decoder's: its kind, then the layer)."""
    return ["attention", "layer"] if "attention" in summary.columns else ["layer"]


def _units(summary: pd.DataFrame) -> list[tuple]:
    """Every attention layer of the summary, in the model's order (encoder, decoder, cross)."""
    order = {"encoder": 0, "decoder": 1, "cross": 2}
    units = {tuple(u) for u in summary[_keys(summary)].itertuples(index=False)}
    return sorted(units, key=lambda u: (order.get(u[0], 3), u[1]) if len(u) == 2 else u)


def plot_series(summary: pd.DataFrame, path: Path, title: str = "") -> Path:
    """:func:`series_figure` written as a PNG to ``path``."""
    import matplotlib.pyplot as plt

    fig = series_figure(summary, title)
    write_atomic(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    return path


def series_figure(summary: pd.DataFrame, title: str = ""):
    """Rows QK and OV, columns :func:`moving_panels`; one thin line per layer (mean over its
    heads, coloured by layer with a key) and the mean over layers in black, against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = moving_panels(summary)
    keys, layers = _keys(summary), _units(summary)
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels) + 1, 6.4), squeeze=False, sharex=True)
    steps = summary["step"].to_numpy()
    wide = steps.max() > 100 * max(steps[steps > 0].min(), 1) if (steps > 0).any() else False
    for r, product in enumerate(("qk", "ov")):
        s = summary[summary["product"] == product]
        for c, (col, name) in enumerate(panels):
            ax = axes[r][c]
            for j, unit in enumerate(layers):
                d = s[(s[keys] == pd.Series(unit, index=keys)).all(axis=1)].sort_values("step")
                ax.plot(d["step"], d[col], color=cmap(j / max(len(layers) - 1, 1)), lw=1, alpha=0.8,
                        label=("layer " if len(unit) == 1 else "") + " ".join(map(str, unit))
                        if r == 0 and c == 0 and len(layers) <= 8 else None)
            m = s.groupby("step")[col].mean()
            ax.plot(m.index, m.to_numpy(), color="black", lw=2, marker="o", ms=3,
                    label="mean" if r == 0 and c == 0 else None)
            ax.set_title(f"{product.upper()} {name}", fontsize=10)
            if wide:
                ax.set_xscale("symlog", linthresh=max(steps[steps > 0].min(), 1))
            if r == 1:
                ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2 if len(layers) > 4 else 1)
    if len(layers) > 8:  # a colour key instead of a legend line per layer
        from matplotlib.cm import ScalarMappable
        from matplotlib.colors import Normalize

        if len(keys) == 1:
            sm, label = ScalarMappable(norm=Normalize(min(layers)[0], max(layers)[0]), cmap=cmap), "layer"
        else:  # an encoder-decoder: its kinds' layers in turn
            spans: dict[str, list[int]] = {}
            for j, (kind, _) in enumerate(layers):
                spans.setdefault(kind, []).append(j)
            sm = ScalarMappable(norm=Normalize(0, len(layers) - 1), cmap=cmap)
            label = "layer (" + ", ".join(f"{k} {v[0]}-{v[-1]}" for k, v in spans.items()) + ")"
        fig.colorbar(sm, ax=axes, label=label, fraction=0.02, pad=0.01)
    if title:
        fig.suptitle(title, fontsize=10)
    if len(layers) <= 8:
        fig.tight_layout()
    return fig
