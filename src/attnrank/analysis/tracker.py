"""The live rank tracker: per-head spectra of a model in memory, through the same layout and
linear-algebra path as ``attnrank spectra``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from attnrank.analysis.scan import layer_metrics
from attnrank.core.linalg import DEFAULT_TOL, METRIC_COLUMNS
from attnrank.errors import AttnRankError
from attnrank.io.layouts import AttentionReader
from attnrank.io.live import LiveCheckpoint
from attnrank.util.threads import torch_threads


class RankTracker:
    """Per-head metrics of both attention products of a live model, every ``every`` steps.

    Reads the weights through :class:`attnrank.io.layouts.AttentionReader` (the layout row of
    the model's ``model_type``, over a :class:`LiveCheckpoint`) and computes them with
    :func:`attnrank.analysis.scan.layer_metrics` (the linalg core), exactly as ``attnrank spectra``
    does for a saved checkpoint of the same weights. Works for any model whose config the
    layout table knows (the project's, or a Hugging Face model: pass ``config`` or let it
    read ``model.config``).

    :meth:`measure` returns ``{"mean": {product: {metric: mean over layers and heads}},
    "heads": {product: {metric: [[value per head] per layer]}}}`` with products ``qk``
    (``W_K,hᵀ W_Q,h``) and ``ov`` (``P_h W_V,h``) and metrics ``METRIC_COLUMNS``.
    """

    def __init__(self, model: nn.Module, every: int = 100, tol: float = DEFAULT_TOL,
                 config: dict[str, Any] | None = None):
        if not isinstance(every, int) or every <= 0:
            raise AttnRankError(f"tracker interval must be a positive integer, got {every!r}")
        if not 0 < tol < 1:
            raise AttnRankError(f"tolerance must lie in (0, 1); got {tol}")
        self.every, self.tol = every, tol
        self.reader = AttentionReader(LiveCheckpoint(model, config))
        self.n_layers = self.reader.dims.n_layers

    def due(self, step: int) -> bool:
        return step % self.every == 0

    @torch.no_grad()
    def measure(self) -> dict[str, Any]:
        # One thread: the float64 LAPACK calls then round the same way in every process
        # whatever the machine's load, so a resumed run logs bit-identical rows.
        with torch_threads(1):
            per_layer = [layer_metrics(self.reader.read_layer(i), self.tol)[0] for i in range(self.n_layers)]
        out: dict[str, Any] = {"mean": {}, "heads": {}}
        for product in ("qk", "ov"):
            cols = {k: torch.stack([m[product].columns()[k] for m in per_layer]) for k in METRIC_COLUMNS}
            out["heads"][product] = {k: v.tolist() for k, v in cols.items()}
            out["mean"][product] = {k: float(v.to(torch.float64).mean()) for k, v in cols.items()}
        return out


def tracker_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Tidy table of the tracker rows of a metrics.jsonl: one row per (step, layer, head,
    product), columns as in ``attnrank spectra`` (plus ``step``)."""
    frames = []
    for row in rows:
        heads = row.get("heads")
        if not heads:
            continue
        for product, metrics in heads.items():
            arr = {k: np.asarray(v) for k, v in metrics.items()}
            L, H = arr["rank"].shape
            frames.append(pd.DataFrame({
                "step": row["step"],
                "layer": np.repeat(np.arange(L), H),
                "head": np.tile(np.arange(H), L),
                "product": product,
                **{k: arr[k].reshape(-1) for k in METRIC_COLUMNS},
            }))
    if not frames:
        return pd.DataFrame(columns=["step", "layer", "head", "product", *METRIC_COLUMNS])
    return pd.concat(frames, ignore_index=True)

