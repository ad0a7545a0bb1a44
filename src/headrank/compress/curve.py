"""``headrank compress --curve``: cost against kept parameters, weight-only against
activation-whitened cuts, measured with :func:`headrank.compress.cost_curve` and drawn
(the README's figure is this, for MiniLM and SmolLM2: docs/compress_curve.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError

JSON, PNG = "compress_curve.json", "compress_curve.png"


def parse_budgets(spec: str | Any) -> list[float]:
    """``"1,0.75,0.5"`` → budgets, each in (0, 1]."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    try:
        out = [float(x) for x in items if str(x).strip()]
    except (TypeError, ValueError):
        raise HeadRankError(f"`curve` must be comma-separated fractions in (0, 1], e.g. 1,0.75,0.5,0.25; "
                            f"got {str(spec)[:60]!r}") from None
    if not out or not all(0 < b <= 1 for b in out):
        raise HeadRankError(f"`curve` must be comma-separated fractions in (0, 1], e.g. 1,0.75,0.5,0.25; "
                            f"got {str(spec)[:60]!r}")
    return out


def measure(label: str, source: Any, budgets: list[float], *, products: str | None, spec, progress=None,
            **kw: Any) -> dict[str, Any]:
    """One panel's data: every row of :func:`cost_curve` and how it was measured (``kw``:
    ``cost_curve``'s ``layers``, ``threads``, ``device``, ``config``, ``layout``, ``revision``)."""
    from headrank.compress import cost_curve

    t = time.perf_counter()
    rows = cost_curve(source, budgets, spec=spec, products=products, progress=progress, **kw)
    used = rows[0].get("spec") or {}
    for r in rows:
        r.pop("spec", None)
    return {label: {"source": str(source), "products": products or "default",
                    "text": used.get("text"), "rows": rows,
                    "seconds": time.perf_counter() - t}}


def draw(data: dict[str, Any], path: str | os.PathLike) -> Path:
    """The figure: one panel per model, cost against the kept fraction, both methods."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(5.2 * len(data), 3.8), squeeze=False)
    for ax, (label, d) in zip(axes[0], data.items(), strict=True):
        rows = d["rows"]
        base = rows[0]
        for method, style in (("weight", "o-"), ("whitened", "s--")):
            pts = sorted((r["kept"], r["cost"]) for r in rows if r["method"] == method)
            if pts:
                ax.plot(*zip(*pts, strict=True), style, label=f"{method}-only SVD" if method == "weight"
                        else "activation-whitened SVD (SVD-LLM)")
        ax.axhline(base["cost"], color="grey", lw=0.8, ls=":", label="uncut")
        ax.set_xlabel("kept fraction of the cut products' parameters (factored)")
        ax.set_ylabel(base["metric"].replace("_", " "))
        if base["metric"] == "perplexity":
            ax.set_yscale("log")
        ax.set_title(f"{label}: {str(d.get('products', 'ov')).upper().replace(',', ' + ')} cut", fontsize=10)
        ax.invert_xaxis()
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def save(data: dict[str, Any], dest: Any) -> list[Path]:
    """``compress_curve.json`` and ``compress_curve.png`` into ``dest`` (a
    :class:`~headrank.io.writer.OutputSet` held since ``--out`` was checked; one staged set)."""
    with dest.stage() as stage:
        (stage / JSON).write_text(json.dumps(data, indent=2) + "\n")
        files = [stage / JSON, draw(data, stage / PNG)]
    return dest.moved(files, stage)


def lines(data: dict[str, Any]) -> list[str]:
    out = []
    for label, d in data.items():
        for r in d["rows"]:
            out.append(f"{label}  {r['method']:>8} budget {r['budget']:<5g} kept {r['kept']:.4f}  "
                       f"{r['metric']} {r['cost']:.6g}")
    return out
