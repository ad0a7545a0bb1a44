"""The training loop: attention-specific weight decay, a live rank tracker, resumable runs.

What a run is lives in :mod:`headrank.training.config`; its checkpoints in
:mod:`headrank.training.state`; devices and DDP in :mod:`headrank.training.distributed`; the
run-directory file names in :mod:`headrank.io.rundir`. This module runs the loop.

A **run directory** holds everything needed to redo or continue a run::

    RUN/config.json                  task, model and training settings, seed, versions
    RUN/metrics.jsonl                one JSON object per logged step, append-only, ``step`` field
    RUN/checkpoints/step-00000500/   config.json + model.safetensors (readable by
                                     ``headrank spectra``) + state.pt (optimizer, RNG,
                                     data stream, loop counters: plain tensors/primitives)
    RUN/summary.json                 written when the run finishes
    RUN/tb/                          TensorBoard events (``log``: by default when tensorboard
                                     is installed); RUN/wandb/, RUN/mlruns/ with ``log``

Rows of ``metrics.jsonl``: ``{"step", "loss", "acc", "lr"}`` every ``log_every`` steps (means
over the steps since the previous row) and ``"mean"`` / ``"heads"`` (see
:class:`RankTracker`) every ``track_every`` steps, merged into one object when both fall on
the same step; step 0 (the initialisation) has tracker fields only. The final step always
has both. Rows hold no wall-clock times, so a run is reproducible byte for byte.

**Resume.** Checkpoints are written into a temporary directory and renamed into place, so a
``step-*`` directory is always whole. Each records the byte length of ``metrics.jsonl`` at
that step (the file is flushed first). ``resume`` loads the newest checkpoint, truncates
``metrics.jsonl`` to that length (dropping rows after it, and any torn last line) and
continues with the same model, optimizer, RNG and data-stream state, so a run killed at any
moment (SIGKILL included) and resumed ends with exactly the ``metrics.jsonl`` of an
uninterrupted run on the same device (bit-exact on the CPU; GPU kernels may not be).
A run killed before its first checkpoint restarts from scratch. ``--resume`` needs no options:
:func:`resume_config` reads the stored settings from ``config.json`` (an option given must
match them, except ``steps``, which extends, and ``keep_checkpoints``).

A run that fails before its first step (a corpus that cannot be read, a model too large, a
logger that cannot start) leaves nothing behind that would block the corrected re-run: the
files it created (``config.json``, ``metrics.jsonl``, ``.lock``, a tokenizer …) are removed,
and the directory too when it created it.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn as nn

from headrank.analysis.tracker import RankTracker
from headrank.errors import HeadRankError, one_line
from headrank.io.rundir import (
    CHECKPOINTS,
    LOCK,
    METRICS,
    latest_checkpoint,
    locked_run,
    read_metrics,
)
from headrank.training.config import (
    Job,
    TrainConfig,
    comparable,
    decay_exposure,
    lr_at,
    run_config,
)
from headrank.training.distributed import Dist, autocast_dtype, join, resolve_device
from headrank.training.integrations import open_loggers, parse_log, require
from headrank.training.optim import param_groups
from headrank.training.state import load_checkpoint, save_checkpoint
from headrank.util.env import versions
from headrank.util.fileio import write_json
from headrank.util.legacy import upgrade
from headrank.util.result import ResultBase, check_dir, copy_dir, plain, read_json

Progress = Callable[[int, int, dict[str, Any] | None], None]


# -- run directory ------------------------------------------------------------------------------

def _prepare_run_dir(run: Path, cfg: TrainConfig, resume: bool) -> None:
    if run.exists() and not run.is_dir():
        raise HeadRankError(f"`out` {run} exists and is not a directory")
    cfg_path = run / "config.json"
    if cfg_path.exists():
        if not resume:
            raise HeadRankError(f"{run} already holds a run: pass `resume` to continue it, or choose another `out`")
        from headrank.io.validate import read_json as read_record

        old = upgrade(read_record(cfg_path, "run config"))  # a regular file under its cap: a FIFO is one line
        new = run_config(cfg)
        if comparable(old) != comparable(new):
            diff = sorted(k for k in set(comparable(old)) | set(comparable(new)) if old.get(k) != new.get(k))
            if diff == ["steps"] and isinstance(old.get("steps"), int) and cfg.steps > old["steps"]:
                _check_extension(cfg, old["steps"])
                write_json(cfg_path, {**old, "steps": cfg.steps})
                return
            raise HeadRankError(f"`resume` with settings that differ from {cfg_path} ({', '.join(diff)}); "
                                "use the same options or another `out`")
        return
    if run.is_dir() and any(p.name != LOCK for p in run.iterdir()):
        raise HeadRankError(f"`out` {run} is a non-empty directory that holds no run; choose another `out`")
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HeadRankError(f"cannot create `out` {run}: {e.strerror or e}") from None
    if not os.access(run, os.W_OK):
        raise HeadRankError(f"`out` {run} is not writable")


#: settings a resume may change: ``steps`` (extends the run) and how many checkpoints are kept
RESUME_MAY_CHANGE = ("steps", "keep_checkpoints")


def resume_config(run_dir: str | os.PathLike, kind: str, given: dict[str, Any]) -> TrainConfig | None:
    """The configuration of the run in ``run_dir`` as its ``config.json`` stored it, for ``--resume``
    without repeating the options; ``given``: the flat options (:func:`make_config` names) the user
    gave explicitly. Each must equal the stored value, except :data:`RESUME_MAY_CHANGE` (a larger
    ``steps`` extends the run, see :func:`train`); one line naming every difference otherwise.
    None when ``run_dir`` holds no ``config.json`` yet (a fresh run: build it from the options)."""
    from dataclasses import fields, replace

    from headrank.io.validate import read_json as read_record
    from headrank.training.config import CONFIG_CLASSES

    p = Path(run_dir) / "config.json"
    if not p.exists() and not p.is_symlink():
        return None
    stored = upgrade(read_record(p, "run config"))  # a regular file under its cap: a FIFO is one line
    if not isinstance(stored, dict) or stored.get("kind") != "headrank-run":
        raise HeadRankError(f"{p} is not the config.json of a headrank run")
    if stored.get("task_name") != kind:
        raise HeadRankError(f"{run_dir} holds a {stored.get('task_name')!r} run, not {kind!r}: "
                            f"resume it with headrank train {stored.get('task_name')}")
    try:
        cfg = CONFIG_CLASSES[kind].from_dict(stored)
    except (TypeError, ValueError, KeyError) as e:
        raise HeadRankError(f"{p} does not describe a run: {one_line(e, 200)}") from None
    diffs, change = [], {}
    for k, v in given.items():
        if v is None:
            continue
        if k in RESUME_MAY_CHANGE:
            change[k] = v
            continue
        where = [o for o in (cfg, cfg.task, cfg.model) if k in {f.name for f in fields(o)}]
        if not where:
            raise HeadRankError(f"unknown training option: {k}")
        have = getattr(where[0], k)
        if k == "corpus" and v is not None:
            v = str(Path(v).expanduser().resolve())
        if have != v:
            diffs.append(f"{k} {v} (stored: {have})")
    if diffs:
        raise HeadRankError(f"`resume` with settings that differ from {p}: {'; '.join(diffs)}; drop those options "
                            "(the stored settings are used) or choose another `out`")
    return replace(cfg, **change) if change else cfg


def train_task(task: str, out: str | os.PathLike, *, resume: bool = False, device: str = "auto",
               threads: int = 1, log: str | Sequence[str] | None = None, progress: Progress | None = None,
               **fields: Any) -> RunResult:
    """``headrank train TASK --out OUT``: train the project's transformer on ``task`` (``recall``,
    ``lm`` or ``vit``) with attention-specific weight decay (``docs/verbs/train.md``).

    Parameters
    ----------
    task
        ``"recall"``, ``"lm"`` or ``"vit"``.
    out
        The run directory (config.json, metrics.jsonl, checkpoints/, summary.json).
    resume
        Continue the run in ``out`` from its newest checkpoint with its stored settings (the
        ``fields`` given must match them; a larger ``steps`` extends the run when its schedule
        allows).
    device
        ``"auto"`` (CUDA when present), ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
    threads
        CPU threads of the computation (torch's; 1 to 4 per CPU), recorded in config.json.
    log
        Backends besides metrics.jsonl: ``tensorboard``, ``wandb``, ``mlflow`` or ``none``.
    **fields
        Config fields of the task (:func:`headrank.training.config.make_config`), e.g.
        ``steps``, ``attn_weight_decay``, ``weight_decay``, ``seed``, ``n_layers``, ``d_model``,
        ``n_heads``, ``lr``, ``batch_size``, ``keep_checkpoints`` (N or ``"all"``).

    Returns
    -------
    RunResult
    """
    from headrank.training.config import make_config
    from headrank.training.state import parse_keep

    if isinstance(fields.get("keep_checkpoints"), str):
        fields["keep_checkpoints"] = parse_keep(fields["keep_checkpoints"])
    cfg = resume_config(out, task, fields) if resume else None
    cfg = cfg if cfg is not None else make_config(task, **fields)
    return train(out, cfg, resume=resume, device=device, progress=progress, threads=threads, log=log)


def _check_extension(cfg: TrainConfig, old_steps: int) -> None:
    """A finished (or unfinished) run of ``old_steps`` may continue to ``cfg.steps`` only when its
    learning rate up to ``old_steps`` does not depend on the horizon: warmup then constant. A
    cosine schedule was declared for its horizon (it reaches 0 at the last step)."""
    if cfg.schedule != "constant":
        raise HeadRankError(f"cannot extend this run from {old_steps} to {cfg.steps} steps: its {cfg.schedule} "
                            f"learning-rate schedule was declared for {old_steps} steps (it decays to 0 there); "
                            "start a new run with the longer `steps`")


@dataclass
class RunResult(ResultBase):
    """What :func:`train` returns: the run, its final row values and newest checkpoint.

    ``table``: the rows of ``metrics.jsonl``, flat (``qk_effective_rank`` …, without the
    per-head lists); ``summary()``: the final row; ``meta``: run directory, steps, resume point,
    checkpoint and final values."""

    verb = "train"

    run_dir: Path
    steps: int
    resumed_from: int | None
    final: dict[str, Any]
    checkpoint: Path
    rank: int = 0

    @property
    def table(self) -> pd.DataFrame:
        return pd.DataFrame([_flat_row(r) for r in read_metrics(self.run_dir)])

    @property
    def meta(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "steps": self.steps, "resumed_from": self.resumed_from,
                "checkpoint": str(self.checkpoint), "final": self.final}

    def headline(self) -> str:
        return f"RunResult in {self.run_dir}: {self.steps} steps"

    def summary(self) -> pd.DataFrame:
        """The final values (loss, accuracy, evaluations, tracker means) as one row."""
        return pd.DataFrame([_flat_row(self.final)])

    def save(self, out: str | os.PathLike) -> list[Path]:
        """The run directory copied into ``out`` (nothing to do when ``out`` is the run)."""
        return copy_dir(self.run_dir, out)

    @classmethod
    def load(cls, out: str | os.PathLike) -> RunResult:
        """The finished run in ``out`` (its ``summary.json``)."""
        run = check_dir(out, "summary.json")
        s = read_json(run / "summary.json")
        return cls(run_dir=run, steps=int(s["steps"]), resumed_from=s.get("resumed_from"), final=s.get("final", {}),
                   checkpoint=latest_checkpoint(run))

    def plot(self):
        """Loss and the mean effective rank of QK and OV against step."""
        from headrank.analysis.plots import train_figure

        return train_figure(self.table)

    def to_json(self) -> dict[str, Any]:
        """What ``headrank train --json`` prints: ``run_dir``, ``resumed_from``, ``checkpoint``, ``final``."""
        return plain({"run_dir": str(self.run_dir), "resumed_from": self.resumed_from,
                      "checkpoint": str(self.checkpoint), "final": self.final})


def _flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without its per-head lists, the tracker means as ``qk_METRIC`` columns."""
    out = {k: v for k, v in row.items() if k not in ("mean", "heads")}
    for product, means in (row.get("mean") or {}).items():
        out.update({f"{product}_{k}": v for k, v in means.items()})
    return out



# -- the loop ------------------------------------------------------------------------------------

def train(
    run_dir: str | os.PathLike,
    cfg: TrainConfig,
    *,
    resume: bool = False,
    device: str = "auto",
    progress: Callable[[int, int, dict[str, Any] | None], None] | None = None,
    tensorboard: bool | None = None,
    threads: int | None = None,
    log: str | Sequence[str] | None = None,
    amp: str = "off",
) -> RunResult:
    """Train the run ``cfg`` describes and log to ``run_dir`` (see the module docstring): any task,
    recall, LM or ViT (:class:`~headrank.training.config.RecallTrainConfig`,
    :class:`~headrank.training.config.LMTrainConfig`, :class:`~headrank.training.config.ViTTrainConfig`);
    the loop takes its model, data, loss and evaluation from ``cfg.job``.

    ``progress(step, total, row)`` is called after every step (``row`` is the logged row or
    None). ``log``: backends that receive every row besides metrics.jsonl (``tensorboard``,
    ``wandb``, ``mlflow``, a comma-separated string or a sequence; ``"none"``: none; see
    :mod:`headrank.training.integrations`). ``amp``: ``off`` (float32, the default), ``auto``
    (bfloat16 autocast of the forward pass where CUDA supports it) or ``bf16``
    (:func:`headrank.training.distributed.autocast_dtype`). When ``log`` is None, ``tensorboard`` decides:
    None = TensorBoard when installed, True = required, False = off.
    ``threads``: torch intra-op threads for this run (default: torch's; recorded in config.json);
    small models on a busy machine are often faster with 1 (benchmarks/THREADS.md). Resume with
    the same value: the rounding of multi-threaded kernels may depend on it.

    ``resume`` with a larger ``cfg.steps`` than the run's extends it when the learning-rate
    schedule allows (warmup then constant; a cosine schedule decays to 0 at the horizon it was
    declared for, so such a run cannot be extended): the result equals a run declared for the
    longer horizon, provided the old last step fell on the ``log_every``/``track_every`` grid
    and had no evaluation (the old final row stays in metrics.jsonl otherwise).
    """
    backends = parse_log(log)
    for b in backends or ():
        require(b)
    if threads is not None:
        from headrank.util.threads import check_threads

        check_threads(threads)  # 1..4 per CPU: a million threads crash OpenBLAS (SIGSEGV)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(Path(run_dir), cfg, resume=resume, device=device, progress=progress,
                      loggers=(backends, tensorboard), amp=amp)
    finally:
        torch.set_num_threads(before)


def _eval_row(job: Job, model: nn.Module, dev: torch.device, splits: tuple[str, ...]) -> dict[str, float]:
    if job.evaluate is None:
        return {}
    prefix = {"validation": "val", "test": "test"}
    out: dict[str, float] = {}
    was_training = model.training
    model.eval()
    try:
        for split in splits:
            for k, v in job.evaluate(model, split, dev).items():
                out[f"{prefix[split]}_{k}"] = v
    finally:
        model.train(was_training)
    return out


@dataclass
class _Session:
    """Everything one process of a run holds while it trains."""

    run: Path
    cfg: TrainConfig
    dev: torch.device
    dist: Dist
    job: Job
    model: nn.Module
    net: nn.Module
    opt: torch.optim.Optimizer
    tracker: RankTracker | None
    window: dict[str, Any]
    start: int = 0
    resumed_from: int | None = None
    stepped: bool = False
    cast: torch.dtype | None = None  # the forward pass's autocast dtype (None: float32)


def _train(run: Path, cfg: TrainConfig, *, resume: bool, device: str, progress: Progress | None,
           loggers: tuple[tuple[str, ...] | None, bool | None], amp: str = "off") -> RunResult:
    dev = resolve_device(device)
    cast = autocast_dtype(dev, amp)
    dist = join(dev)
    try:
        if cfg.batch_size % dist.world:
            raise HeadRankError(f"batch size {cfg.batch_size} is not divisible by the {dist.world} processes: "
                                "every process takes an equal slice of the global batch")
        if run.exists() and not run.is_dir():
            raise HeadRankError(f"`out` {run} exists and is not a directory")
        created = not run.exists()
        before = {p.name for p in run.iterdir()} if not created else set()
        s, held = None, False
        try:
            # one writer per run (rank 0 writes): a second train / --resume / sweep worker gets one line
            with locked_run(run) if dist.main else nullcontext():
                held = dist.main
                s = _open_session(run, cfg, resume=resume, dev=dev, dist=dist)
                s.cast = cast
                _run_steps(s, progress, loggers)
                return _finish(s)
        except BaseException:
            if held and run.is_dir() and "config.json" not in before and (s is None or not s.stepped):
                _remove_unstarted(run, before, created)  # nothing left that blocks the corrected re-run
            raise
        finally:
            if s is not None and dist.world > 1:
                # DDP's reducer holds the process group: free it first, or gloo's threads may be torn
                # down at interpreter exit (SIGABRT, "terminate called without an active exception")
                s = None
                gc.collect()
    finally:
        dist.close()


def _remove_unstarted(run: Path, before: set[str], created: bool) -> None:
    """Remove what a run that never took a step wrote: the whole directory when this call created
    it, else every entry that was not there before (a lock is released by then)."""
    if created:
        shutil.rmtree(run, ignore_errors=True)
        return
    for p in run.iterdir():
        if p.name not in before:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _new_window() -> dict[str, Any]:
    return {"loss": torch.zeros((), dtype=torch.float64), "acc": torch.zeros((), dtype=torch.float64), "n": 0}


def _open_session(run: Path, cfg: TrainConfig, *, resume: bool, dev: torch.device, dist: Dist) -> _Session:
    """Prepare the run directory (rank 0), build job, model and optimizer, restore a checkpoint."""
    if dist.main:
        _prepare_run_dir(run, cfg, resume)
        if not (run / "config.json").exists():
            write_json(run / "config.json", {**run_config(cfg), "threads": torch.get_num_threads(),
                                             "versions": versions()})
        for stale in (run / CHECKPOINTS).glob(".tmp-*") if (run / CHECKPOINTS).is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        job = cfg.job(run, dev)  # a BPE tokeniser is trained and saved here, once
    dist.barrier()
    if not dist.main:
        job = cfg.job(run, dev)  # reads what rank 0 wrote
    model = job.model.to(dev)
    groups = param_groups(model, cfg.weight_decay, cfg.attn_weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    net: nn.Module = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    tracker = RankTracker(model, every=cfg.track_every, tol=cfg.tol) if dist.main else None
    s = _Session(run, cfg, dev, dist, job, model, net, opt, tracker, _new_window())
    ckpt = latest_checkpoint(run) if resume else None
    dist.barrier()
    metrics_path = run / METRICS
    if ckpt is not None:
        state = load_checkpoint(ckpt, model, opt, job.stream, dev)
        s.start = s.resumed_from = int(state["step"])
        s.window = {"loss": state["window_loss"], "acc": state["window_acc"], "n": int(state["window_n"])}
        offset = int(state["metrics_bytes"])
        if dist.main:
            size = metrics_path.stat().st_size if metrics_path.exists() else 0
            if size < offset:
                raise HeadRankError(f"{metrics_path} is shorter ({size} B) than checkpoint {ckpt.name} "
                                    f"recorded ({offset} B): the run directory was altered")
            with open(metrics_path, "r+b") as fh:
                fh.truncate(offset)
    elif dist.main:
        with open(metrics_path, "wb"):
            pass  # fresh start (or a resume before the first checkpoint): no rows yet
    return s


def _step(s: _Session, step: int) -> float:
    """One optimizer step on the next global batch; adds loss and accuracy to the window."""
    dist, dev = s.dist, s.dev
    x, y = s.job.stream.next()  # the global batch, the same on every rank
    if dist.world > 1:
        x, y = x.chunk(dist.world)[dist.rank], y.chunk(dist.world)[dist.rank]
    x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    lr = lr_at(s.cfg, step)
    for g in s.opt.param_groups:
        g["lr"] = lr
    with torch.autocast(dev.type, dtype=s.cast) if s.cast is not None else nullcontext():
        loss, acc = s.job.loss_and_accuracy(s.net(x), y)
    s.opt.zero_grad(set_to_none=True)
    loss.backward()  # DDP averages the gradients over ranks: the global-batch mean
    if s.cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.cfg.grad_clip)
    s.opt.step()
    stats = torch.stack([loss.detach(), acc.detach()]).to("cpu", torch.float64)
    if dist.world > 1:
        torch.distributed.all_reduce(stats)
        stats = stats / dist.world
    s.window["loss"] = s.window["loss"] + stats[0]
    s.window["acc"] = s.window["acc"] + stats[1]
    s.window["n"] += 1
    return lr


def _row(s: _Session, step: int, lr: float) -> dict[str, Any] | None:
    """The metrics row of ``step`` (rank 0), or None when nothing is due."""
    cfg = s.cfg
    row: dict[str, Any] | None = None
    last = step == cfg.steps
    if step % cfg.log_every == 0 or last:
        n = s.window["n"]
        row = {"step": step, "loss": float(s.window["loss"]) / n, "acc": float(s.window["acc"]) / n, "lr": lr}
        s.window = _new_window()
    if s.tracker.due(step) or last:
        row = {**(row or {"step": step}), **s.tracker.measure()}
    eval_every = int(getattr(cfg, "eval_every", 0) or 0)
    if s.job.evaluate is not None and (last or (eval_every and step % eval_every == 0)):
        row = {**(row or {"step": step}),
               **_eval_row(s.job, s.model, s.dev, ("validation", "test") if last else ("validation",))}
    return row


def _run_steps(s: _Session, progress: Progress | None,
               loggers: tuple[tuple[str, ...] | None, bool | None]) -> None:
    cfg, dist = s.cfg, s.dist
    writer = (open_loggers(s.run, loggers[0], run_config(cfg), tensorboard=loggers[1],
                           purge_step=s.start + 1 if s.resumed_from else None) if dist.main else None)
    fh = open(s.run / METRICS, "ab") if dist.main else None
    try:
        def emit(row: dict[str, Any]) -> None:
            fh.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
            fh.flush()
            writer.log(row)

        if s.start == 0 and dist.main:
            row = {"step": 0, **s.tracker.measure()}
            emit(row)
            if progress:
                progress(0, cfg.steps, row)
        if s.start >= cfg.steps and progress and dist.main:
            progress(cfg.steps, cfg.steps, None)

        s.model.train()
        for step in range(s.start + 1, cfg.steps + 1):
            lr = _step(s, step)
            s.stepped = True
            if not dist.main:
                continue
            row = _row(s, step, lr)
            if row is not None:
                emit(row)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                save_checkpoint(s.run, step, s.model, s.opt, s.job.stream, s.window, fh, cfg.keep_checkpoints)
            if progress:
                progress(step, cfg.steps, row)
    finally:
        if fh is not None:
            fh.close()
        if writer is not None:
            writer.close()


def _finish(s: _Session) -> RunResult:
    """Wait for every rank; rank 0 writes summary.json from the rows on disk."""
    s.dist.barrier()
    run, cfg = s.run, s.cfg
    if not s.dist.main:
        return RunResult(run_dir=run, steps=cfg.steps, resumed_from=s.resumed_from, final={},
                         checkpoint=latest_checkpoint(run), rank=s.dist.rank)
    final = _final_summary(read_metrics(run))
    write_json(run / "summary.json", {"steps": cfg.steps, "resumed_from": s.resumed_from, "final": final,
                                      "exposure": decay_exposure(cfg),
                                      "device": str(s.dev), "threads": torch.get_num_threads(),
                                      "autocast": str(s.cast).removeprefix("torch.") if s.cast else "off",
                                      "world_size": s.dist.world, "data": s.job.info,
                                      "versions": versions()})
    return RunResult(run_dir=run, steps=cfg.steps, resumed_from=s.resumed_from, final=final,
                     checkpoint=latest_checkpoint(run))


EVAL_KEYS = tuple(f"{p}_{m}" for p in ("val", "test") for m in ("loss", "ppl", "acc"))


def _final_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Last loss/acc, last evaluation and last tracker means of a run's rows."""
    out: dict[str, Any] = {}
    for row in rows:
        for k in ("step", "loss", "acc", "lr", "mean", *EVAL_KEYS):
            if k in row:
                out[k] = row[k]
    return out
