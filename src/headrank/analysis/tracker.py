"""The live rank tracker: per-head spectra of a model in memory, through the same layout and
linear-algebra path as ``headrank spectra``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from headrank.analysis.scan import layer_metrics
from headrank.core.linalg import DEFAULT_TOL, METRIC_COLUMNS
from headrank.core.metrics import SUMMARY_METRICS
from headrank.errors import HeadRankError
from headrank.io.layouts import AttentionReader
from headrank.io.live import LiveCheckpoint
from headrank.util.constraints import TOL
from headrank.util.threads import torch_threads


class RankTracker:
    """Per-head metrics of both attention products of a live model, every ``every`` steps.

    Reads the weights through :class:`headrank.io.layouts.AttentionReader` (the layout row of
    the model's ``model_type``, over a :class:`LiveCheckpoint`) and computes them with
    :func:`headrank.analysis.scan.layer_metrics` (the linalg core), exactly as ``headrank spectra``
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
            raise HeadRankError(f"tracker interval must be a positive integer, got {every!r}")
        TOL.check(tol)  # the one declaration of its bounds (headrank.util.constraints)
        self.every, self.tol = every, tol
        self.reader = AttentionReader(LiveCheckpoint(model, config))
        if self.reader.parts:
            raise HeadRankError(f"the live tracker reads one kind of attention; {self.reader.layout.model_types[0]!r} "
                                "is an encoder-decoder: measure its checkpoints with spectra or track")
        self.n_layers = self.reader.dims.n_layers

    def due(self, step: int) -> bool:
        """Whether ``step`` is a measurement step (a multiple of ``every``)."""
        return step % self.every == 0

    @torch.no_grad()
    def measure(self, step: int | None = None) -> dict[str, Any]:
        """The tracker fields ``{"mean", "heads"}`` of the model as it is now; with ``step``, the
        whole row ``{"step", "mean", "heads"}`` (as in a run's metrics.jsonl, readable by
        :func:`tracker_table`; :func:`scalars` flattens it, :func:`log_to` sends it to a logger)."""
        if step is not None:
            return {"step": int(step), **self.measure()}
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
    product), columns as in ``headrank spectra`` (plus ``step``)."""
    frames = []
    for row in rows:
        heads = row.get("heads")
        if not heads:
            continue
        for product, metrics in heads.items():
            arr = {k: np.asarray(v) for k, v in metrics.items()}
            L, H = arr["rank"].shape
            nan = np.full(L * H, np.nan)  # a metric the row predates (an older run's metrics.jsonl)
            frames.append(pd.DataFrame({
                "step": row["step"],
                "layer": np.repeat(np.arange(L), H),
                "head": np.tile(np.arange(H), L),
                "product": product,
                **{k: arr[k].reshape(-1) if k in arr else nan for k in METRIC_COLUMNS},
            }))
    if not frames:
        return pd.DataFrame(columns=["step", "layer", "head", "product", *METRIC_COLUMNS])
    return pd.concat(frames, ignore_index=True)



#: the per-head metrics :func:`scalars` averages: the metric table's summary rows
SCALAR_METRICS = SUMMARY_METRICS


def _head_mean(values: list[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else math.nan


def scalars(row: dict[str, Any], prefix: str = "rank", per_layer: bool = True) -> dict[str, float]:
    """The scalars of a tracker row for a logger: ``{prefix}/{product}/{metric}`` (mean over every
    layer and head) and ``{prefix}/layer_{i}/{product}/{metric}`` (mean over the heads of layer
    ``i``), for every summary metric of the table (:data:`SCALAR_METRICS`: effective rank, k90,
    k99, numerical rank, ``gap_rel`` = (bound − nuclear) / bound, ``balance_rel`` …). Non-finite
    heads are left out of the means; a metric the row predates is left out."""
    out: dict[str, float] = {}
    for product, metrics in row.get("heads", {}).items():
        for k in SCALAR_METRICS:
            if k not in metrics:
                continue
            out[f"{prefix}/{product}/{k}"] = _head_mean([v for layer in metrics[k] for v in layer])
            if per_layer:
                for i, layer in enumerate(metrics[k]):
                    out[f"{prefix}/layer_{i}/{product}/{k}"] = _head_mean(layer)
    return out


def log_to(sink: Any, row: dict[str, Any], prefix: str = "rank", per_layer: bool = True) -> dict[str, float]:
    """Send the :func:`scalars` of a tracker row (``{"step", "mean", "heads"}``, as
    :meth:`RankTracker.measure` returns with a step) to ``sink`` at ``row["step"]``, and return them.

    ``sink``: a TensorBoard ``SummaryWriter`` (``add_scalar``), the ``mlflow`` module or anything
    with ``log_metrics(dict, step=)`` (non-finite values left out: MLflow refuses them), a W&B
    run or the ``wandb`` module (``log(dict, step=)``), or any callable ``f(values, step)``.
    """
    step = int(row["step"])
    values = scalars(row, prefix=prefix, per_layer=per_layer)
    if hasattr(sink, "add_scalar"):
        for k, v in values.items():
            sink.add_scalar(k, v, step)
    elif hasattr(sink, "log_metrics"):
        sink.log_metrics({k: v for k, v in values.items() if math.isfinite(v)}, step=step)
    elif hasattr(sink, "log"):
        sink.log(values, step=step)
    elif callable(sink):
        sink(values, step)
    else:
        raise HeadRankError(f"cannot log to a {type(sink).__name__}: pass a SummaryWriter, a W&B run, "
                            "mlflow, or a callable f(values, step)")
    return values
