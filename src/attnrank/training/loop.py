"""Training with attention-specific weight decay, a live rank tracker, and resumable runs.

A **run directory** holds everything needed to redo or continue a run::

    RUN/config.json                  task, model and training settings, seed, versions
    RUN/metrics.jsonl                one JSON object per logged step, append-only, ``step`` field
    RUN/checkpoints/step-00000500/   config.json + model.safetensors (readable by
                                     ``attnrank spectra``) + state.pt (optimizer, RNG,
                                     data stream, loop counters: plain tensors/primitives)
    RUN/summary.json                 written when the run finishes
    RUN/tb/                          TensorBoard events, when tensorboard is installed

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
A run killed before its first checkpoint restarts from scratch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn

from attnrank.analysis.tracker import RankTracker
from attnrank.core.linalg import DEFAULT_TOL
from attnrank.errors import AttnRankError
from attnrank.io.rundir import (
    CHECKPOINTS,
    METRICS,
    STATE,
    STEP_DIR,
    checkpoint_dirs,
    latest_checkpoint,
    read_metrics,
)
from attnrank.models.data import ImageTaskConfig, LMTaskConfig
from attnrank.models.tasks import RecallConfig, RecallStream, recall_loss_and_accuracy
from attnrank.models.transformer import ModelConfig, Transformer, ViT, ViTConfig
from attnrank.training.optim import param_groups
from attnrank.util.env import versions
from attnrank.util.fileio import write_json


@dataclass
class TrainConfig:
    """One training run on associative recall (every field is recorded in config.json).

    ``model`` defaults to :func:`recall_model`: a 2-layer, width-64, 4-head (head width
    16) pre-norm causal transformer with learned positions and **no MLP**, weights drawn
    with std 0.1. Why (measured here, 2 CPU cores): with MLPs, or with std 0.02, the
    induction-style circuit recall needs did not form within 6,000 steps; attention-only
    with std 0.1 learns the task in a few hundred steps.
    Optimizer: AdamW, decoupled decay per :func:`attnrank.training.optim.param_groups` group
    (``attn_weight_decay`` on Q/K/V/O, ``weight_decay`` on every other matrix and on the
    embeddings, none on biases and norm gains); learning rate warmed up linearly over
    ``warmup`` steps, then constant.
    """

    task: RecallConfig = field(default_factory=RecallConfig)
    model: ModelConfig | None = None
    steps: int = 3000
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.1
    attn_weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    track_every: int = 100
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    tol: float = DEFAULT_TOL

    TASK_NAME: ClassVar[str] = "recall"

    def __post_init__(self) -> None:
        self._coerce()
        self.validate()

    def _coerce(self) -> None:
        if isinstance(self.task, dict):
            self.task = RecallConfig(**{k: v for k, v in self.task.items()
                                        if k in {f.name for f in fields(RecallConfig)}})
        if self.model is None:
            self.model = recall_model(self.task)
        elif isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)

    def job(self, run: Path | None, dev: torch.device) -> Job:
        """The task's data stream, model, loss and evaluation (the loop is task-agnostic).
        The model is drawn from the global RNG seeded with ``seed`` just before."""
        torch.manual_seed(self.seed)
        model = Transformer(self.model)
        return Job(model=model, stream=RecallStream(self.task, self.batch_size, self.seed),
                   loss_and_accuracy=recall_loss_and_accuracy, evaluate=None)

    def validate(self) -> None:
        def positive_int(name: str, allow_zero: bool = False) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
                raise AttnRankError(f"{name} must be an integer >= {0 if allow_zero else 1}, got {v!r}")

        for name in ("steps", "batch_size", "log_every", "track_every", "checkpoint_every", "keep_checkpoints"):
            positive_int(name)
        positive_int("warmup", allow_zero=True)
        positive_int("seed", allow_zero=True)

        def number(name: str, lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False):
            v = getattr(self, name)
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
            if not ok:
                raise AttnRankError(f"{name} must lie in {'(' if lo_open else '['}{lo:g}, {hi:g}"
                                    f"{')' if hi_open else ']'}, got {v!r}")

        number("lr", 0, 10, lo_open=True)
        number("weight_decay", 0, 1e3)
        number("attn_weight_decay", 0, 1e3)
        number("beta1", 0, 1, hi_open=True)
        number("beta2", 0, 1, hi_open=True)
        number("eps", 0, 1, lo_open=True)
        number("grad_clip", 0, math.inf)
        number("tol", 0, 1, lo_open=True, hi_open=True)
        if self.lr * max(self.weight_decay, self.attn_weight_decay) >= 1:
            raise AttnRankError(f"lr * weight decay = {self.lr * max(self.weight_decay, self.attn_weight_decay):g} "
                                ">= 1: AdamW's decoupled step would flip the weights' sign")
        self._validate_task()

    def _validate_task(self) -> None:
        if self.model.vocab_size < self.task.vocab_size:
            raise AttnRankError(f"model vocab_size {self.model.vocab_size} < task vocab {self.task.vocab_size}")
        if self.model.max_seq_len < self.task.seq_len:
            raise AttnRankError(f"model max_seq_len {self.model.max_seq_len} < sequence length {self.task.seq_len}")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["task"] = self.task.to_dict()
        d["model"] = self.model.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else must be a usable torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise AttnRankError(f"unknown device {device!r} (use auto, cpu, cuda, cuda:N, mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise AttnRankError(f"device {device!r} requested but CUDA is not available here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise AttnRankError(f"device {device!r}: only {torch.cuda.device_count()} CUDA devices")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise AttnRankError("device 'mps' requested but it is not available here")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise AttnRankError(f"unsupported device {device!r} (use auto, cpu, cuda, cuda:N, mps)")
    return dev


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate of update number ``step`` (1-based): linear warmup, then constant."""
    if cfg.warmup and step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    return cfg.lr


def decay_exposure(cfg: TrainConfig, steps: int | None = None) -> dict[str, float]:
    """Decay exposure ``λ·Σ_t lr_t`` of each decay group after ``steps`` updates (default: the
    whole run): decoupled decay shrinks a weight by ``∏(1 − lr_t λ) ≈ exp(−λ Σ lr_t)``, so this
    counts the time constants the decay had to act (REFERENCE.md §3). ``attn``: the attention
    projections (``attn_weight_decay``); ``other``: every other decayed matrix and the
    embeddings (``weight_decay``)."""
    n = cfg.steps if steps is None else steps
    lr_sum = math.fsum(lr_at(cfg, t) for t in range(1, n + 1))
    return {"attn": cfg.attn_weight_decay * lr_sum, "other": cfg.weight_decay * lr_sum, "lr_sum": lr_sum}


# -- run directory ------------------------------------------------------------------------------

def _run_config(cfg: TrainConfig) -> dict[str, Any]:
    return {"kind": "attnrank-run", "task_name": cfg.TASK_NAME, **cfg.to_dict()}


def _comparable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in ("versions", "device")}



def _prepare_run_dir(run: Path, cfg: TrainConfig, resume: bool) -> None:
    if run.exists() and not run.is_dir():
        raise AttnRankError(f"--out {run} exists and is not a directory")
    cfg_path = run / "config.json"
    if cfg_path.exists():
        if not resume:
            raise AttnRankError(f"{run} already holds a run: pass --resume to continue it, or choose another --out")
        try:
            old = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise AttnRankError(f"cannot read {cfg_path}: {e}") from None
        new = _run_config(cfg)
        if _comparable(old) != _comparable(new):
            diff = sorted(k for k in set(old) | set(new)
                          if k not in ("versions", "device") and old.get(k) != new.get(k))
            raise AttnRankError(f"--resume with settings that differ from {cfg_path} ({', '.join(diff)}); "
                                "use the same options or another --out")
        return
    if run.is_dir() and any(run.iterdir()):
        raise AttnRankError(f"--out {run} is a non-empty directory that holds no run; choose another --out")
    try:
        run.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AttnRankError(f"cannot create --out {run}: {e.strerror or e}") from None
    if not os.access(run, os.W_OK):
        raise AttnRankError(f"--out {run} is not writable")


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    resumed_from: int | None
    final: dict[str, Any]
    checkpoint: Path
    rank: int = 0


def _open_tensorboard(run: Path, enabled: bool | None, purge_step: int | None):
    if enabled is False:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        if enabled:
            raise AttnRankError("tensorboard logging needs the tensorboard package: pip install tensorboard") from None
        return None
    return SummaryWriter(log_dir=str(run / "tb"), purge_step=purge_step)


def _tb_log(writer, row: dict[str, Any]) -> None:
    if writer is None:
        return
    s = row["step"]
    for k in ("loss", "acc", "lr"):
        if k in row:
            writer.add_scalar(f"train/{k}", row[k], s)
    for product, m in row.get("mean", {}).items():
        for k in ("rank", "effective_rank", "balance_rel", "gap"):
            writer.add_scalar(f"{product}/{k}", m[k], s)


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
) -> RunResult:
    """Train on associative recall and log to ``run_dir`` (see the module docstring).

    ``progress(step, total, row)`` is called after every step (``row`` is the logged row or
    None). ``tensorboard``: None = when installed, True = required, False = off.
    ``threads``: torch intra-op threads for this run (default: torch's); small models on a
    busy machine are often faster with 1. Resume with the same value: the rounding of
    multi-threaded kernels may depend on it.
    """
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise AttnRankError(f"threads must be a positive integer, got {threads!r}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(Path(run_dir), cfg, resume=resume, device=device, progress=progress,
                      tensorboard=tensorboard)
    finally:
        torch.set_num_threads(before)


@dataclass
class Job:
    """What the loop needs from a task: a model, a stream of (x, y) global batches with
    ``next``/``state_dict``/``load_state_dict``, ``loss_and_accuracy(output, y)``, and
    ``evaluate(model, split, device) -> {metric: value}`` (None: no held-out data, e.g. the
    fully online recall task)."""

    model: nn.Module
    stream: Any
    loss_and_accuracy: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    evaluate: Callable[[nn.Module, str, torch.device], dict[str, float]] | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Dist:
    """This process's place in a torch.distributed job (world 1 = plain single process)."""

    rank: int = 0
    world: int = 1
    owned: bool = False  # we initialised the process group, so we destroy it

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def _distributed(dev: torch.device) -> _Dist:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): gloo on the CPU, nccl on CUDA."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return _Dist()
    if dist.is_initialized():
        return _Dist(dist.get_rank(), dist.get_world_size(), owned=False)
    if dev.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return _Dist(dist.get_rank(), dist.get_world_size(), owned=True)


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


def _train(run: Path, cfg: TrainConfig, *, resume: bool, device: str,
           progress: Callable[[int, int, dict[str, Any] | None], None] | None,
           tensorboard: bool | None) -> RunResult:
    dev = resolve_device(device)
    dist = _distributed(dev)
    try:
        return _train_dist(run, cfg, resume=resume, dev=dev, progress=progress, tensorboard=tensorboard,
                           dist=dist)
    finally:
        if dist.owned:
            torch.distributed.destroy_process_group()


def _train_dist(run: Path, cfg: TrainConfig, *, resume: bool, dev: torch.device,
                progress: Callable[[int, int, dict[str, Any] | None], None] | None,
                tensorboard: bool | None, dist: _Dist) -> RunResult:
    if cfg.batch_size % dist.world:
        raise AttnRankError(f"batch size {cfg.batch_size} is not divisible by the {dist.world} processes: "
                            "every process takes an equal slice of the global batch")
    if dist.main:
        _prepare_run_dir(run, cfg, resume)
        conf = _run_config(cfg)
        if not (run / "config.json").exists():
            write_json(run / "config.json", {**conf, "versions": versions()})
        for stale in (run / CHECKPOINTS).glob(".tmp-*") if (run / CHECKPOINTS).is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)
        job = cfg.job(run, dev)  # a BPE tokeniser is trained and saved here, once
    dist.barrier()
    if not dist.main:
        job = cfg.job(run, dev)  # reads what rank 0 wrote
    model = job.model.to(dev)
    groups = param_groups(model, cfg.weight_decay, cfg.attn_weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    stream = job.stream
    net: nn.Module = model
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    tracker = RankTracker(model, every=cfg.track_every, tol=cfg.tol) if dist.main else None
    window = {"loss": torch.zeros((), dtype=torch.float64), "acc": torch.zeros((), dtype=torch.float64), "n": 0}
    eval_every = int(getattr(cfg, "eval_every", 0) or 0)

    metrics_path = run / METRICS
    start, resumed_from = 0, None
    ckpt = latest_checkpoint(run) if resume else None
    dist.barrier()
    if ckpt is not None:
        state = _load_checkpoint(ckpt, model, opt, stream, dev)
        start = resumed_from = int(state["step"])
        window = {"loss": state["window_loss"], "acc": state["window_acc"], "n": int(state["window_n"])}
        offset = int(state["metrics_bytes"])
        if dist.main:
            size = metrics_path.stat().st_size if metrics_path.exists() else 0
            if size < offset:
                raise AttnRankError(f"{metrics_path} is shorter ({size} B) than checkpoint {ckpt.name} "
                                    f"recorded ({offset} B): the run directory was altered")
            with open(metrics_path, "r+b") as fh:
                fh.truncate(offset)
    elif dist.main:
        with open(metrics_path, "wb"):
            pass  # fresh start (or a resume before the first checkpoint): no rows yet

    writer = _open_tensorboard(run, tensorboard, purge_step=start + 1 if resumed_from else None) if dist.main else None
    final: dict[str, Any] = {}
    fh = open(metrics_path, "ab") if dist.main else None
    try:
        def emit(row: dict[str, Any]) -> None:
            fh.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
            fh.flush()
            _tb_log(writer, row)

        if start == 0 and dist.main:
            row = {"step": 0, **tracker.measure()}
            emit(row)
            final.update(row)
            if progress:
                progress(0, cfg.steps, row)
        if start >= cfg.steps and progress and dist.main:
            progress(cfg.steps, cfg.steps, None)

        model.train()
        for step in range(start + 1, cfg.steps + 1):
            x, y = stream.next()  # the global batch, the same on every rank
            if dist.world > 1:
                x, y = x.chunk(dist.world)[dist.rank], y.chunk(dist.world)[dist.rank]
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            lr = lr_at(cfg, step)
            for g in opt.param_groups:
                g["lr"] = lr
            loss, acc = job.loss_and_accuracy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages the gradients over ranks: the global-batch mean
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            stats = torch.stack([loss.detach(), acc.detach()]).to("cpu", torch.float64)
            if dist.world > 1:
                torch.distributed.all_reduce(stats)
                stats = stats / dist.world
            window["loss"] = window["loss"] + stats[0]
            window["acc"] = window["acc"] + stats[1]
            window["n"] += 1
            if not dist.main:
                continue

            row: dict[str, Any] | None = None
            last = step == cfg.steps
            if step % cfg.log_every == 0 or last:
                n = window["n"]
                row = {"step": step, "loss": float(window["loss"]) / n, "acc": float(window["acc"]) / n, "lr": lr}
                window = {"loss": torch.zeros((), dtype=torch.float64),
                          "acc": torch.zeros((), dtype=torch.float64), "n": 0}
            if tracker.due(step) or last:
                row = {**(row or {"step": step}), **tracker.measure()}
            if job.evaluate is not None and (last or (eval_every and step % eval_every == 0)):
                row = {**(row or {"step": step}),
                       **_eval_row(job, model, dev, ("validation", "test") if last else ("validation",))}
            if row is not None:
                emit(row)
                final.update(row)
            if step % cfg.checkpoint_every == 0 or last:
                _save_checkpoint(run, step, model, opt, stream, window, fh, cfg.keep_checkpoints)
            if progress:
                progress(step, cfg.steps, row)
    finally:
        if fh is not None:
            fh.close()
        if writer is not None:
            writer.close()

    dist.barrier()
    if not dist.main:
        return RunResult(run_dir=run, steps=cfg.steps, resumed_from=resumed_from, final={},
                         checkpoint=latest_checkpoint(run), rank=dist.rank)
    rows = read_metrics(run)
    final = _final_summary(rows)
    write_json(run / "summary.json", {"steps": cfg.steps, "resumed_from": resumed_from, "final": final,
                                      "exposure": decay_exposure(cfg),
                                      "device": str(dev), "threads": torch.get_num_threads(),
                                      "world_size": dist.world, "data": job.info,
                                      "versions": versions()})
    return RunResult(run_dir=run, steps=cfg.steps, resumed_from=resumed_from, final=final,
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


def _save_checkpoint(run: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer,
                     stream: Any, window: dict[str, Any], metrics_fh, keep: int) -> Path:
    metrics_fh.flush()
    os.fsync(metrics_fh.fileno())
    root = run / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / STEP_DIR.format(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp)
    state = {
        "step": step,
        "metrics_bytes": metrics_fh.tell(),
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "stream": stream.state_dict(),
        "window_loss": window["loss"].clone(),
        "window_acc": window["acc"].clone(),
        "window_n": window["n"],
    }
    torch.save(state, tmp / STATE)
    for f in tmp.iterdir():
        with open(f, "rb") as h:
            os.fsync(h.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    for _, old in checkpoint_dirs(run)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _load_checkpoint(ckpt: Path, model: nn.Module, opt: torch.optim.Optimizer, stream: Any,
                     dev: torch.device) -> dict[str, Any]:
    from safetensors.torch import load_file

    try:
        weights = load_file(str(ckpt / "model.safetensors"), device=str(dev))
        state = torch.load(ckpt / STATE, map_location="cpu", weights_only=True)
    except Exception as e:
        raise AttnRankError(f"cannot read checkpoint {ckpt}: {' '.join(str(e).split())[:300]}") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if m not in model._tied_aliases()]
    if missing or unexpected:
        raise AttnRankError(f"checkpoint {ckpt} does not match the model (missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]})")
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    stream.load_state_dict(state["stream"])
    return state


RECALL_MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "mlp": False, "init_std": 0.1}


def recall_model(task: RecallConfig, **overrides: Any) -> ModelConfig:
    """The default recall model (:data:`RECALL_MODEL`, see :class:`TrainConfig`), sized to ``task``."""
    return ModelConfig(vocab_size=task.vocab_size, max_seq_len=task.seq_len, **{**RECALL_MODEL, **overrides})


def recall_config(**overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` for associative recall with the given overrides (validated):
    task fields ``n_pairs``, ``n_keys``, ``n_values``, ``n_queries``; model fields
    ``n_layers``, ``d_model``, ``n_heads``, ``head_dim``, ``mlp``, ``skip``, ``norm``,
    ``init_std`` …; and any
    :class:`TrainConfig` field."""
    task_keys = {f.name for f in fields(RecallConfig)}
    model_keys = {"n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "mlp", "skip", "norm",
                  "learned_positions", "bias", "d_mlp", "init_std"}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    task = RecallConfig(**{k: overrides.pop(k) for k in list(overrides) if k in task_keys})
    model_over = {k: overrides.pop(k) for k in list(overrides) if k in model_keys}
    model = recall_model(task, **model_over)
    unknown = set(overrides) - {f.name for f in fields(TrainConfig)}
    if unknown:
        raise AttnRankError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    return TrainConfig(task=task, model=model, **overrides)


# -- language model and ViT ----------------------------------------------------------------------

MODEL_KEYS = frozenset({"n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "mlp", "skip", "norm",
                        "learned_positions", "bias", "d_mlp", "init_std", "tie_embeddings"})
#: the default LM: 4 pre-norm causal layers, width 64, 4 heads of width 16, MLP 256, std 0.02
LM_MODEL = {"n_layers": 4, "d_model": 64, "n_heads": 4, "mlp": True, "init_std": 0.02}
#: the default ViT: 4 pre-norm layers, width 64, 4 heads of width 16, MLP 256, std 0.02
VIT_MODEL = {"n_layers": 4, "d_model": 64, "n_heads": 4, "mlp": True, "init_std": 0.02}


@dataclass
class LMTrainConfig(TrainConfig):
    """An autoregressive LM on a text corpus (:class:`attnrank.models.data.LMTaskConfig`), with the
    recall run's optimizer and decay groups; Adam β = (0.9, 0.95) as in the paper's LMs.
    ``eval_every``: steps between validation evaluations (0: only at the end, where the
    validation and test splits are both scored)."""

    TASK_NAME: ClassVar[str] = "lm"
    task: LMTaskConfig = field(default_factory=LMTaskConfig)
    steps: int = 2000
    batch_size: int = 32
    beta2: float = 0.95
    eval_every: int = 0

    def _coerce(self) -> None:
        if isinstance(self.task, dict):
            self.task = LMTaskConfig(**{k: v for k, v in self.task.items()
                                        if k in {f.name for f in fields(LMTaskConfig)}})
        if self.model is None:
            self.model = ModelConfig(vocab_size=self.task.vocab_size, max_seq_len=self.task.seq_len, **LM_MODEL)
        elif isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)

    def _validate_task(self) -> None:
        if not isinstance(self.eval_every, int) or isinstance(self.eval_every, bool) or self.eval_every < 0:
            raise AttnRankError(f"eval_every must be an integer >= 0, got {self.eval_every!r}")
        if not self.model.causal:
            raise AttnRankError("a language model needs causal attention (model causal=True)")
        if self.model.vocab_size < self.task.vocab_size:
            raise AttnRankError(f"model vocab_size {self.model.vocab_size} < tokenizer vocabulary {self.task.vocab_size}")
        if self.model.max_seq_len < self.task.seq_len:
            raise AttnRankError(f"model max_seq_len {self.model.max_seq_len} < seq_len {self.task.seq_len}")

    def job(self, run: Path | None, dev: torch.device) -> Job:
        from attnrank.models.data import TokenStream, evaluate_lm, lm_loss_and_accuracy, lm_tokens

        tokens, tok = lm_tokens(self.task, run)
        torch.manual_seed(self.seed)
        model = Transformer(self.model)
        t = self.task
        return Job(model=model, stream=TokenStream(tokens["train"], t.seq_len, self.batch_size, self.seed),
                   loss_and_accuracy=lm_loss_and_accuracy,
                   evaluate=lambda m, split, d: evaluate_lm(m, tokens[split], t.seq_len, t.eval_tokens, d),
                   info={"tokenizer": tok.kind, "tokenizer_vocab": tok.vocab_size,
                         "tokens": {s: int(v.numel()) for s, v in tokens.items()}})


@dataclass
class ViTTrainConfig(TrainConfig):
    """A ViT classifying images (:class:`attnrank.models.data.ImageTaskConfig`); the model is sized
    to the data (image size, channels, classes; patch 2 for 8×8 digits, else 4)."""

    TASK_NAME: ClassVar[str] = "vit"
    task: ImageTaskConfig = field(default_factory=ImageTaskConfig)
    model: ViTConfig | None = None
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    eval_every: int = 0

    def _coerce(self) -> None:
        if isinstance(self.task, dict):
            self.task = ImageTaskConfig(**{k: v for k, v in self.task.items()
                                           if k in {f.name for f in fields(ImageTaskConfig)}})
        if self.model is None:
            self.model = vit_model(self.task)
        elif isinstance(self.model, dict):
            self.model = ViTConfig.from_dict(self.model)

    def _validate_task(self) -> None:
        from attnrank.models.data import load_images

        if not isinstance(self.eval_every, int) or isinstance(self.eval_every, bool) or self.eval_every < 0:
            raise AttnRankError(f"eval_every must be an integer >= 0, got {self.eval_every!r}")
        d = load_images(self.task.images, self.task.image_size)
        m = self.model
        if (m.image_size, m.channels) != (d.image_size, d.channels) or m.n_classes < len(d.classes):
            raise AttnRankError(f"ViT (image {m.image_size}, channels {m.channels}, classes {m.n_classes}) does not "
                                f"fit the data (image {d.image_size}, channels {d.channels}, classes {len(d.classes)})")

    def job(self, run: Path | None, dev: torch.device) -> Job:
        from attnrank.models.data import (
            ImageStream,
            classification_loss_and_accuracy,
            evaluate_images,
            load_images,
        )

        d = load_images(self.task.images, self.task.image_size)
        torch.manual_seed(self.seed)
        model = ViT(self.model)
        return Job(model=model, stream=ImageStream(d.splits["train"], self.batch_size, self.seed),
                   loss_and_accuracy=classification_loss_and_accuracy,
                   evaluate=lambda mdl, split, dv: evaluate_images(mdl, d.splits[split], dv), info=d.describe())


def vit_model(task: ImageTaskConfig, **overrides: Any) -> ViTConfig:
    """The default ViT (:data:`VIT_MODEL`) sized to the images of ``task``."""
    from attnrank.models.data import load_images

    d = load_images(task.images, task.image_size)
    patch = overrides.pop("patch_size", None) or (2 if d.image_size <= 16 else 4)
    bad = set(overrides) - {f.name for f in fields(ViTConfig)}
    if bad:
        raise AttnRankError(f"option(s) {', '.join(sorted(bad))} do not apply to a ViT")
    return ViTConfig(image_size=d.image_size, channels=d.channels, n_classes=len(d.classes), patch_size=patch,
                     **{**VIT_MODEL, **overrides})


def _split_overrides(overrides: dict[str, Any], task_cls: type, model_keys: frozenset[str],
                     cfg_cls: type) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    overrides = {k: v for k, v in overrides.items() if v is not None}
    task_keys = {f.name for f in fields(task_cls)}
    task = {k: overrides.pop(k) for k in list(overrides) if k in task_keys}
    model = {k: overrides.pop(k) for k in list(overrides) if k in model_keys}
    unknown = set(overrides) - {f.name for f in fields(cfg_cls)} - {"model", "task"}
    if unknown:
        raise AttnRankError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    return task, model, overrides


def lm_config(**overrides: Any) -> LMTrainConfig:
    """An :class:`LMTrainConfig` from flat overrides: task fields (``corpus``, ``tokenizer``,
    ``bpe_vocab``, ``seq_len``, ``max_chars``, ``eval_tokens``), model fields (``n_layers``,
    ``d_model``, ``n_heads`` …) and any :class:`LMTrainConfig` field. None means default."""
    t, m, rest = _split_overrides(overrides, LMTaskConfig, MODEL_KEYS, LMTrainConfig)
    task = LMTaskConfig(**t)
    model = ModelConfig(vocab_size=task.vocab_size, max_seq_len=task.seq_len, **{**LM_MODEL, **m})
    return LMTrainConfig(task=task, model=model, **rest)


def vit_config(**overrides: Any) -> ViTTrainConfig:
    """A :class:`ViTTrainConfig` from flat overrides: task fields (``images``, ``image_size``),
    model fields (``n_layers``, ``d_model``, ``n_heads``, ``patch_size`` …) and any
    :class:`ViTTrainConfig` field. None means default."""
    t, m, rest = _split_overrides(overrides, ImageTaskConfig, MODEL_KEYS | {"patch_size"}, ViTTrainConfig)
    task = ImageTaskConfig(**t)
    return ViTTrainConfig(task=task, model=vit_model(task, **m), **rest)


#: sweep / CLI kinds → config builders taking flat overrides
CONFIG_BUILDERS: dict[str, Callable[..., TrainConfig]] = {"recall": recall_config, "lm": lm_config,
                                                          "vit": vit_config}


def make_config(kind: str, **overrides: Any) -> TrainConfig:
    """The training config of task ``kind`` (``recall``, ``lm``, ``vit``) with flat overrides."""
    if kind not in CONFIG_BUILDERS:
        raise AttnRankError(f"unknown task {kind!r}; use one of {', '.join(CONFIG_BUILDERS)}")
    return CONFIG_BUILDERS[kind](**overrides)
