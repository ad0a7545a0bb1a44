"""Ranks and decay exposure in a Lightning run: :class:`RankLightningCallback`.

``Trainer(callbacks=[headrank.RankLightningCallback(every=50)])`` measures every head of the
``LightningModule`` (its attention read through the layout table, as
:class:`headrank.analysis.tracker.RankTracker` reads any live model) at step 0, every ``every``
optimizer steps and at the last, and sends the tracker's scalars and each optimizer group's decay
exposure ``λ·Σlr`` (``rank/exposure/{group}``) to every logger of the trainer. The module's
``configure_optimizers`` returns :func:`headrank.training.optim.optimizer` (docs/verbs/train.md);
an optimizer made otherwise has its exposure counted from the start of training.
Importing this module does not import Lightning; the class is built on first use.
"""

from __future__ import annotations

import math
from typing import Any

from headrank.analysis.tracker import RankTracker, scalars
from headrank.core.linalg import DEFAULT_TOL
from headrank.errors import HeadRankError
from headrank.training.integrations import exposure_scalars
from headrank.training.optim import decay_exposure, track_exposure


class _RankLightningLogic:
    def __init__(self, every: int = 100, *, tol: float = DEFAULT_TOL, prefix: str = "rank",
                 per_layer: bool = True, config: dict[str, Any] | None = None):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise HeadRankError(f"every must be a positive integer, got {every!r}")
        self.every, self.tol, self.prefix, self.per_layer, self.config = every, tol, prefix, per_layer, config
        self.tracker: RankTracker | None = None
        self.rows: list[dict[str, Any]] = []
        self._last: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        target = getattr(pl_module, "model", None) if self.config is None else None
        model = target if target is not None and hasattr(target, "config") else pl_module
        self.tracker = RankTracker(model, every=self.every, tol=self.tol, config=self.config)
        for opt in trainer.optimizers:
            track_exposure(opt)
        if trainer.global_step == 0:
            self._measure(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        s = trainer.global_step
        if self.tracker is not None and (s % self.every == 0 or s == trainer.max_steps):
            self._measure(trainer)

    def _measure(self, trainer: Any) -> None:
        step = int(trainer.global_step)
        if step == self._last:
            return
        self._last = step
        row = self.tracker.measure(step)
        values = scalars(row, prefix=self.prefix, per_layer=self.per_layer)
        row["exposure"] = {}
        for opt in trainer.optimizers:
            row["exposure"].update(decay_exposure(opt))
        values.update(exposure_scalars(row["exposure"], self.prefix))
        self.rows.append(row)
        values = {k: v for k, v in values.items() if math.isfinite(v)}
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=step)


_CLASSES: dict[str, type] = {}


def _make() -> type:
    from lightning.pytorch import Callback

    class RankLightningCallback(_RankLightningLogic, Callback):
        """Measure every head every ``every`` optimizer steps and log ranks and decay exposure to
        the trainer's loggers (``rank/qk/effective_rank``, ``rank/exposure/attn_qk`` …); the rows
        (with ``exposure``) stay in ``.rows``. ``tol``, ``prefix``, ``per_layer`` and ``config`` as
        for :class:`headrank.training.integrations.RankCallback`. The module measured is
        ``pl_module.model`` when that is a Hugging Face model, else the ``LightningModule``."""

    return RankLightningCallback


def __getattr__(name: str) -> Any:  # lazy: importing this module does not import lightning
    if name == "RankLightningCallback":
        if name not in _CLASSES:
            try:
                _CLASSES[name] = _make()
            except ImportError:
                raise HeadRankError("RankLightningCallback needs Lightning: pip install lightning") from None
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
