"""The per-layer summary of a spectra table (``summary.csv``) and the overall means: numpy
columns, without pandas, the same numbers as pandas' grouped means."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from headrank.analysis.columns import Columns, from_frame, group_agg, to_frame
from headrank.core.baseline import BASELINE_COLUMNS
from headrank.core.metrics import SUMMARY_METRICS

if TYPE_CHECKING:
    import pandas as pd


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per layer (an encoder-decoder: per kind of attention and layer) and product: the number of
    heads, mean numerical rank / dh, and the mean over heads of every summary metric of the table
    (core.metrics.SUMMARY_METRICS: effective rank, k90, k99, gap / bound, relative balance …)."""
    return to_frame(summary_columns(from_frame(table)))


def summary_columns(table: Columns) -> Columns:
    """:func:`summarize` on numpy columns, without pandas (the same numbers: pandas' grouped
    means, :func:`headrank.analysis.columns.group_agg`). An encoder-decoder's kinds come in the
    model's order (encoder, decoder, cross), not the alphabet's."""
    t = {**table, "rank_frac": np.asarray(table["rank"]) / np.asarray(table["head_dim"])}
    keys = unit_columns(t)
    kinds = list(dict.fromkeys(np.asarray(t["attention"]).tolist())) if "attention" in keys else []
    if kinds:
        t["attention"] = np.asarray([kinds.index(k) for k in np.asarray(t["attention"]).tolist()], dtype=np.int64)
    out = group_agg(t, (*keys, "product"), [("heads", "head", "size"), ("rank_frac", "rank_frac", "mean"),
                                             *((k, k, "mean") for k in SUMMARY_METRICS),
                                             *((k, k, "mean") for k in BASELINE_COLUMNS if k in t)])
    if kinds:
        out["attention"] = np.asarray([kinds[i] for i in out["attention"].tolist()], dtype=object)
    return out


def unit_columns(table: Any) -> list[str]:
    """The columns that name one attention layer: ``layer``, and for an encoder-decoder first
    ``attention`` (encoder, decoder or cross). ``table``: numpy columns or a DataFrame."""
    return ["attention", "layer"] if "attention" in table else ["layer"]


def overall(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Means over all heads and layers, per product (for notes and --json)."""
    s = table.assign(rank_frac=table["rank"] / table["head_dim"])
    return {str(p): {k: float(g[k].mean()) for k in ("rank_frac", *SUMMARY_METRICS)}
            for p, g in s.groupby("product")}
