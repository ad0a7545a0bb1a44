"""Ranks in the user's training stack: loggers for ``headrank train --log`` and
:class:`RankCallback` for a Hugging Face ``Trainer``.

**Run loggers** (:func:`open_loggers`): ``metrics.jsonl`` is always written by the loop; each
backend named in ``--log`` receives the same rows as it goes:

- ``tensorboard``: ``RUN/tb/`` event files, tags ``train/loss|acc|lr``, ``val_*``/``test_*``
  and ``{qk,ov}/{metric}`` for the metric table's summary rows (``effective_rank``, ``k90``,
  ``k99``, ``rank``, ``gap_rel``, ``balance_rel`` …; means over layers and heads), plus the
  per-layer scalars of :func:`headrank.analysis.tracker.scalars` under ``rank/``;
- ``wandb``: one W&B run (project ``$WANDB_PROJECT`` or ``headrank``, files under ``RUN/``, its
  id kept in ``RUN/loggers.json`` so a resumed run logs into the same W&B run;
  ``WANDB_MODE=offline`` works without an account);
- ``mlflow``: one MLflow run in ``$MLFLOW_TRACKING_URI``, or else the file store
  ``RUN/mlruns`` (MLflow 3 keeps that backend behind ``MLFLOW_ALLOW_FILE_STORE``, which is set
  for it); the config as params, the rows as metrics at their step.

A backend whose package is missing is one :class:`HeadRankError` naming the extra to install.

**Trainer** (:class:`RankCallback`): every ``every`` steps (and at steps 0 and the last) it
measures every head through :class:`headrank.analysis.tracker.RankTracker` and logs the
:func:`~headrank.analysis.tracker.scalars` (per-layer and overall QK/OV effective rank, numerical
rank, gap/bound, balance) and each optimizer group's decay exposure λ·Σlr
(``rank/exposure/{group}``, :func:`headrank.training.optim.decay_exposure`) to whatever
``report_to`` names; it also appends the tracker rows to
``output_dir/headrank_ranks.jsonl`` (readable by :func:`headrank.analysis.tracker.tracker_table`).
Passed the Hugging Face way, ``Trainer(..., callbacks=[RankCallback(every=50)])``, it finds the
model in the callback arguments and logs as each integration does (:class:`ReportTo`):
TensorBoard into the Trainer's log directory (``train/`` tags at the global step), the active
``wandb.run`` (``train/`` keys with ``train/global_step``), MLflow's active run (keys as they
are). Built with the trainer, ``RankCallback(trainer, every=50)``, it goes through
``trainer.log`` instead.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headrank.analysis.tracker import RankTracker, scalars
from headrank.core.linalg import DEFAULT_TOL
from headrank.core.metrics import SUMMARY_METRICS
from headrank.errors import HeadRankError, one_line
from headrank.training.optim import decay_exposure, track_exposure
from headrank.util.fileio import write_json

#: ``--log`` backends → (module to import, extra that installs it)
BACKENDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow")}
LOGGERS_FILE = "loggers.json"
RANKS_FILE = "headrank_ranks.jsonl"
_ROW_KEYS = ("loss", "acc", "lr")


def parse_log(spec: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``--log`` → backends: ``None`` stays None (the default: TensorBoard when installed),
    ``"none"`` → ``()``, ``"tensorboard,wandb"`` → ``("tensorboard", "wandb")``."""
    if spec is None:
        return None
    items = [x.strip().lower() for x in (spec.split(",") if isinstance(spec, str) else spec)]
    items = [x for x in items if x]
    if items == ["none"]:
        return ()
    bad = [x for x in items if x not in BACKENDS]
    if bad or not items:
        raise HeadRankError(f"`log` {','.join(items) or repr(spec)}: unknown backend "
                            f"{(bad or [''])[0]!r}; use any of {', '.join(BACKENDS)} (comma-separated) or none")
    return tuple(dict.fromkeys(items))


def require(backend: str) -> None:
    """Raise one line naming the extra when the package of ``backend`` is not installed."""
    import importlib.util

    module, extra = BACKENDS[backend]
    if importlib.util.find_spec(module) is None:
        raise HeadRankError(f"`log` {backend} needs the {module} package: pip install 'headrank[{extra}]'")


def row_scalars(row: dict[str, Any]) -> dict[str, float]:
    """Every scalar of a metrics.jsonl row: ``train/loss|acc|lr``, evaluations (``val_loss`` …)
    and the tracker's :func:`~headrank.analysis.tracker.scalars` (``rank/...``)."""
    out = {f"train/{k}": float(row[k]) for k in _ROW_KEYS if k in row}
    out.update({k: float(v) for k, v in row.items() if k.startswith(("val_", "test_"))})
    if "heads" in row:
        out.update(scalars(row))
    return out


def exposure_scalars(exposure: dict[str, float], prefix: str = "rank") -> dict[str, float]:
    """Each optimizer group's decay exposure λ·Σlr as ``{prefix}/exposure/{group}``, beside the ranks."""
    return {f"{prefix}/exposure/{g}": float(v) for g, v in exposure.items()}


class _TensorBoard:
    def __init__(self, run: Path, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run / "tb"), purge_step=purge_step)

    def log(self, row: dict[str, Any]) -> None:
        w, s = self.writer, row["step"]
        for k in _ROW_KEYS:
            if k in row:
                w.add_scalar(f"train/{k}", row[k], s)
        for k, v in row.items():
            if k.startswith(("val_", "test_")):
                w.add_scalar(k, v, s)
        for product, m in row.get("mean", {}).items():
            for k in SUMMARY_METRICS:  # the metric table's summary rows (older rows may lack some)
                if k in m:
                    w.add_scalar(f"{product}/{k}", m[k], s)
        if "heads" in row:
            for k, v in scalars(row).items():
                w.add_scalar(k, v, s)

    def close(self) -> None:
        self.writer.close()


def _ids(run: Path) -> dict[str, Any]:
    from headrank.io.validate import is_regular_file

    if not is_regular_file(run / LOGGERS_FILE):  # missing, or a FIFO that would block
        return {}
    try:
        return json.loads((run / LOGGERS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _remember(run: Path, key: str, value: str) -> None:
    write_json(run / LOGGERS_FILE, {**_ids(run), key: value})


class _Wandb:
    def __init__(self, run: Path, config: dict[str, Any]):
        import wandb

        run_id = _ids(run).get("wandb") or uuid.uuid4().hex[:12]
        _remember(run, "wandb", run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "headrank"), dir=str(run),
                              name=run.resolve().name, id=run_id, resume="allow", config=config,
                              reinit="create_new")

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(row_scalars(row), step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


def _flat_params(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:500]
    return out


class _Mlflow:
    def __init__(self, run: Path, config: dict[str, Any]):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind it
        self.client = MlflowClient(tracking_uri=uri)
        run_id = _ids(run).get("mlflow")
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "headrank")
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            run_id = self.client.create_run(exp_id, run_name=run.resolve().name).info.run_id
            _remember(run, "mlflow", run_id)
            from mlflow.entities import Param

            params = [Param(k, v) for k, v in _flat_params(config).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i:i + 100])
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, row: dict[str, Any]) -> None:
        import time

        from mlflow.entities import Metric

        ts, step = int(time.time() * 1000), int(row["step"])
        metrics = [Metric(k, v, ts, step) for k, v in row_scalars(row).items() if math.isfinite(v)]
        for i in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 500])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class RunLoggers:
    """The backends of one run: :meth:`log` sends a metrics row to each; :meth:`close` ends them."""

    def __init__(self, loggers: list[Any]):
        self.loggers = loggers

    def log(self, row: dict[str, Any]) -> None:
        for lg in self.loggers:
            lg.log(row)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def open_loggers(run: Path, backends: tuple[str, ...] | None, config: dict[str, Any], *,
                 purge_step: int | None = None, tensorboard: bool | None = None) -> RunLoggers:
    """The loggers of a run: ``backends`` from :func:`parse_log`; ``None`` keeps the older
    ``tensorboard`` switch (None: TensorBoard when installed, True: required, False: off)."""
    import importlib.util

    if backends is None:
        if tensorboard is False or (tensorboard is None and importlib.util.find_spec("tensorboard") is None):
            backends = ()
        else:
            backends = ("tensorboard",)
    for b in backends:
        require(b)
    out: list[Any] = []
    b = ""
    try:
        for b in backends:
            out.append(_TensorBoard(run, purge_step) if b == "tensorboard"
                       else _Wandb(run, config) if b == "wandb" else _Mlflow(run, config))
    except Exception as e:
        RunLoggers(out).close()
        if isinstance(e, HeadRankError):
            raise
        hint = " (W&B: run `wandb login`, or set WANDB_MODE=offline)" if b == "wandb" else ""
        raise HeadRankError(f"`log` {b}: the {b} logger could not start: {type(e).__name__}: "
                            f"{one_line(e, 300)}{hint}") from None
    return RunLoggers(out)


# -- Hugging Face Trainer --------------------------------------------------------------------------

class ReportTo:
    """The Trainer's ``report_to`` integrations reached without the trainer, as each of them logs:
    TensorBoard (a writer in the directory the Trainer's TensorBoard callback writes:
    ``$TENSORBOARD_LOGGING_DIR``, else its newest ``output_dir/runs/*``; tags ``train/KEY``),
    W&B (the active ``wandb.run``: ``train/KEY`` and ``train/global_step``) and MLflow (the active
    run: keys as they are, at the step). Integrations that are not named or not running are left
    out; others in ``report_to`` (comet, neptune …) are reached only with ``RankCallback(trainer)``."""

    def __init__(self, args: Any):
        rep = getattr(args, "report_to", None) or []
        self.names = {rep} if isinstance(rep, str) else set(rep)
        self.output_dir = Path(str(getattr(args, "output_dir", None) or "."))
        self.tb: Any = None

    def _tb_dir(self) -> Path:
        env = os.environ.get("TENSORBOARD_LOGGING_DIR")
        if env:
            return Path(env).expanduser()
        root = self.output_dir / "runs"
        runs = [d for d in root.glob("*") if d.is_dir()] if root.is_dir() else []
        return max(runs, key=lambda d: d.stat().st_mtime) if runs else root / "headrank"

    def log(self, values: dict[str, float], step: int) -> list[str]:
        """Send ``values`` at ``step`` to every running integration; the names reached."""
        import importlib.util
        import sys

        done = []
        if "tensorboard" in self.names and importlib.util.find_spec("tensorboard") is not None:
            if self.tb is None:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(self._tb_dir()))
            for k, v in values.items():
                self.tb.add_scalar(f"train/{k}", v, step)
            self.tb.flush()
            done.append("tensorboard")
        wandb = sys.modules.get("wandb")
        if "wandb" in self.names and wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.run.log({**{f"train/{k}": v for k, v in values.items()}, "train/global_step": step})
            done.append("wandb")
        mlflow = sys.modules.get("mlflow")
        if "mlflow" in self.names and mlflow is not None and mlflow.active_run() is not None:
            mlflow.log_metrics(values, step=step)
            done.append("mlflow")
        return done

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class _RankCallbackLogic:
    """What :class:`RankCallback` does, apart from its ``transformers.TrainerCallback`` base
    (defined here so that importing this module does not import transformers)."""

    def __init__(self, trainer: Any = None, every: int = 100, *, tol: float = DEFAULT_TOL,
                 prefix: str = "rank", per_layer: bool = True, jsonl: bool = True,
                 config: dict[str, Any] | None = None):
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise HeadRankError(f"every must be a positive integer, got {every!r}")
        self.trainer, self.every, self.tol, self.prefix = trainer, every, tol, prefix
        self.per_layer, self.jsonl, self.config = per_layer, jsonl, config
        self.tracker: RankTracker | None = None
        self.rows: list[dict[str, Any]] = []
        self._last: int | None = None
        self.report: ReportTo | None = None
        self.reached: set[str] = set()
        self.optimizer: Any = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None:
            raise HeadRankError("RankCallback: the Trainer passed no model to its callbacks")
        self.tracker = RankTracker(model, every=self.every, tol=self.tol, config=self.config)
        if optimizer is not None:  # its groups' decay exposure λ·Σlr, counted from here on
            self.optimizer = track_exposure(optimizer)
        if self.trainer is None and state.is_world_process_zero:
            self.report = ReportTo(args)
        if state.global_step == 0:
            self._measure(args, state)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        s = state.global_step
        if self.tracker is None and model is not None:  # added after on_train_begin had passed
            self.on_train_begin(args, state, control, model=model, optimizer=kwargs.get("optimizer"))
        if self.tracker is not None and (s % self.every == 0 or s == state.max_steps):
            self._measure(args, state)

    def on_train_end(self, args, state, control, **kwargs):
        if self.report is not None:
            self.report.close()

    def _measure(self, args, state) -> None:
        step = int(state.global_step)
        if step == self._last:
            return
        self._last = step
        row = self.tracker.measure(step)
        values = scalars(row, prefix=self.prefix, per_layer=self.per_layer)
        if self.optimizer is not None:
            row["exposure"] = decay_exposure(self.optimizer)
            values.update(exposure_scalars(row["exposure"], self.prefix))
        self.rows.append(row)
        values = {k: v for k, v in values.items() if math.isfinite(v)}
        if self.jsonl and state.is_world_process_zero:
            out = Path(args.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            with open(out / RANKS_FILE, "a") as fh:
                fh.write(json.dumps(row, separators=(",", ":")) + "\n")
        if self.trainer is not None:
            self.trainer.log(dict(values))
        else:
            if self.report is not None:
                self.reached.update(self.report.log(values, step))
            state.log_history.append({**values, "step": step})


def _make_rank_callback() -> type:
    TrainerCallback = _callback_base()

    class RankCallback(_RankCallbackLogic, TrainerCallback):
        """Measure every head every ``every`` optimizer steps and log the ranks to ``report_to``.

        Passed the Hugging Face way (the model comes with the callback's arguments)::

            args = TrainingArguments(..., report_to=["tensorboard", "wandb", "mlflow"])
            trainer = Trainer(model=model, args=args, callbacks=[RankCallback(every=50)], ...)

        the scalars go to TensorBoard, the active W&B run and MLflow's active run as those
        integrations log (:class:`ReportTo`), and into ``state.log_history``. With ``trainer``
        (``trainer.add_callback(RankCallback(trainer, every=50))``) they go through
        ``trainer.log``, so every integration, whatever it is, receives them.

        ``tol``: relative threshold of the numerical rank; ``prefix``: the scalars' namespace
        (``rank/qk/effective_rank``, ``rank/layer_0/ov/gap_rel`` …; the integrations add their
        own ``train/`` prefix); ``per_layer``: also the per-layer means; ``jsonl``: write the
        rows file (rank 0 only); ``config``: the model's config dict when it has no
        ``model.config`` (see :class:`RankTracker`).
        """

    return RankCallback


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> Any:  # lazy: importing this module does not import transformers
    if name == "RankCallback":
        if name not in _CLASSES:
            _CLASSES[name] = _make_rank_callback()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
