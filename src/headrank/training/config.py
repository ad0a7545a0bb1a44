"""Training configurations: what one run is (task, model, optimiser, schedule), as a dataclass
recorded whole in the run's ``config.json``.

:class:`TrainConfig` holds what every run has (optimizer, schedule, cadence); a run is one of its
subclasses, :class:`RecallTrainConfig` (associative recall), :class:`LMTrainConfig` (a causal LM
on a text corpus) and :class:`ViTTrainConfig` (a ViT on images), each knowing its task's :class:`Job`
(model, data stream, loss, evaluation); the flat-override builders :func:`recall_config`,
:func:`lm_config`, :func:`vit_config` (:data:`CONFIG_BUILDERS`, :func:`make_config`) are what the
CLI and sweeps call. :func:`lr_at` is the learning-rate schedule the loop follows and
:func:`decay_exposure` the decay exposure ``λ·Σlr`` it implies. :func:`run_config` is the
``config.json`` a run writes and :func:`comparable` the part of it that must match on resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn as nn

from headrank.core.linalg import DEFAULT_TOL
from headrank.errors import HeadRankError
from headrank.models.data import ImageTaskConfig, LMTaskConfig
from headrank.models.tasks import RecallConfig, RecallStream, recall_loss_and_accuracy
from headrank.models.transformer import ModelConfig, Transformer, ViT, ViTConfig
from headrank.util.constraints import MAX_SEED, TRAIN  # noqa: F401 - MAX_SEED: the bound, importable here as before
from headrank.util.legacy import upgrade


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
class TrainConfig:
    """What every training run has (every field is recorded in config.json): its task and model,
    the optimizer, the schedule and how often it logs, tracks and checkpoints. A base class: a
    run is a :class:`RecallTrainConfig`, :class:`LMTrainConfig` or :class:`ViTTrainConfig`, each
    with its ``TASK_NAME`` (config.json's ``task_name``), task, default model and :class:`Job`;
    the defaults below are those of a task that does not set its own.

    Optimizer: AdamW, decoupled decay per :func:`headrank.training.optim.param_groups` group
    (``attn_weight_decay`` on Q/K/V/O, ``weight_decay`` on every other matrix and on the
    embeddings, none on biases and norm gains); learning rate warmed up linearly over
    ``warmup`` steps, then constant (``schedule="constant"``, the default) or cosine-decayed to 0
    at the last step (``schedule="cosine"``); :func:`lr_at` is the schedule.
    """

    task: Any = None  # each subclass: its task's config
    model: Any = None  # None: the task's default model
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
    schedule: str = "constant"

    TASK_NAME: ClassVar[str] = ""  # each subclass: its task's name

    def __post_init__(self) -> None:
        if not self.TASK_NAME:
            raise TypeError("TrainConfig is the base of the training configs: build a RecallTrainConfig, "
                            "LMTrainConfig or ViTTrainConfig (or make_config(kind, ...))")
        self._coerce()
        self.validate()

    def _coerce(self) -> None:
        """Turn ``task`` and ``model`` given as dicts (a stored config.json) into their configs,
        and fill in the task's default model."""
        raise NotImplementedError

    def _validate_task(self) -> None:
        """Check the task and that the model fits it (one :class:`HeadRankError` line)."""
        raise NotImplementedError

    def job(self, run: Path | None, dev: torch.device) -> Job:
        """The task's data stream, model, loss and evaluation (the loop is task-agnostic).
        The model is drawn from the global RNG seeded with ``seed`` just before."""
        raise NotImplementedError

    def validate(self) -> None:
        k = self.keep_checkpoints  # N or 'all' (0 here: every checkpoint), headrank.training.state.parse_keep
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise HeadRankError(f"`keep_checkpoints` takes a positive number or 'all', got {k!r}")
        checked = TRAIN.check(**{p.name: getattr(self, p.name) for p in TRAIN if p.name != "threads"})  # the one table
        for name, value in checked.items():  # a numpy number as the plain int or float config.json records
            setattr(self, name, value)
        if self.lr * max(self.weight_decay, self.attn_weight_decay) >= 1:
            raise HeadRankError(f"lr * weight decay = {self.lr * max(self.weight_decay, self.attn_weight_decay):g} "
                                ">= 1: AdamW's decoupled step would flip the weights' sign")
        self._validate_task()
        self._check_memory()

    def _check_memory(self) -> None:
        """Refuse, before the model is built or anything is written, a model and batch that cannot
        fit in this machine's memory: the parameters (float32 weights, gradients and AdamW's two
        moments: 16 bytes each; :func:`parameter_count`) plus the activations kept for the backward
        pass (a lower bound per token of the residual stream, q/k/v, attention scores and
        probabilities, MLP and output logits per layer)."""
        from headrank.io.validate import check_fits

        m = self.model
        if hasattr(m, "max_seq_len"):
            tokens = int(m.max_seq_len)
        else:  # a ViT: its patches and the class token
            tokens = (int(m.image_size) // int(m.patch_size)) ** 2 + 1
        heads, d = int(m.n_heads), int(m.d_model)
        per_layer = 8 * d + 2 * heads * tokens + (2 * int(m.d_mlp or 0) if getattr(m, "mlp", True) else 0)
        per_token = int(m.n_layers) * per_layer + int(getattr(m, "vocab_size", 0) or getattr(m, "n_classes", 0))
        n_params = parameter_count(m)
        check_fits(16 * n_params, f"a model of {n_params:,} parameters (d_model {d}, {m.n_layers} layers; weights, "
                                  "gradients and AdamW moments in float32)")
        check_fits(16 * n_params + 4 * self.batch_size * tokens * per_token,
                   f"a model of {n_params:,} parameters with a batch of {self.batch_size} x {tokens} tokens "
                   f"(batch_size {self.batch_size})")

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["task"] = self.task.to_dict()
        d["model"] = self.model.to_dict()
        if d["schedule"] == "constant":
            del d["schedule"]  # the default is left out: config.json of a constant-lr run stays as before
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class RecallTrainConfig(TrainConfig):
    """One training run on associative recall (:class:`headrank.models.tasks.RecallConfig`,
    fully online: no held-out data), with :class:`TrainConfig`'s defaults.

    ``model`` defaults to :func:`recall_model`: a 2-layer, width-64, 4-head (head width
    16) pre-norm causal transformer with learned positions and **no MLP**, weights drawn
    with std 0.1. Why (measured here, 2 CPU cores): with MLPs, or with std 0.02, the
    induction-style circuit recall needs did not form within 6,000 steps; attention-only
    with std 0.1 learns the task in a few hundred steps.
    """

    TASK_NAME: ClassVar[str] = "recall"
    task: RecallConfig = field(default_factory=RecallConfig)
    model: ModelConfig | None = None

    def _coerce(self) -> None:
        if isinstance(self.task, dict):
            self.task = RecallConfig(**{k: v for k, v in self.task.items()
                                        if k in {f.name for f in fields(RecallConfig)}})
        if self.model is None:
            self.model = recall_model(self.task)
        elif isinstance(self.model, dict):
            self.model = ModelConfig.from_dict(self.model)

    def _validate_task(self) -> None:
        if self.model.vocab_size < self.task.vocab_size:
            raise HeadRankError(f"model vocab_size {self.model.vocab_size} < task vocab {self.task.vocab_size}")
        if self.model.max_seq_len < self.task.seq_len:
            raise HeadRankError(f"model max_seq_len {self.model.max_seq_len} < sequence length {self.task.seq_len}")

    def job(self, run: Path | None, dev: torch.device) -> Job:
        torch.manual_seed(self.seed)
        model = Transformer(self.model)
        return Job(model=model, stream=RecallStream(self.task, self.batch_size, self.seed),
                   loss_and_accuracy=recall_loss_and_accuracy, evaluate=None)


def parameter_count(m: Any) -> int:
    """Parameters of a :class:`ModelConfig` / :class:`ViTConfig` model, from its sizes alone
    (matrices only, a lower bound: biases and norm gains are left out)."""
    d, L = int(m.d_model), int(m.n_layers)
    dh, H, Hkv = int(m.head_dim or d // max(int(m.n_heads), 1)), int(m.n_heads), int(m.n_kv_heads or m.n_heads)
    attn = d * dh * (2 * H + 2 * Hkv)  # W_Q, W_O (H heads) and W_K, W_V (Hkv heads)
    mlp = 2 * d * int(m.d_mlp or 0) if getattr(m, "mlp", True) else 0
    if hasattr(m, "vocab_size"):
        emb = int(m.vocab_size) * d * (1 if getattr(m, "tie_embeddings", False) else 2)
        emb += int(m.max_seq_len) * d if getattr(m, "learned_positions", True) else 0
    else:  # a ViT: patch embedding, positions, class head
        emb = int(m.patch_size) ** 2 * int(m.channels) * d + ((int(m.image_size) // int(m.patch_size)) ** 2 + 1) * d
        emb += int(m.n_classes) * d
    return L * (attn + mlp) + emb


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate of update number ``step`` (1-based): linear warmup over ``warmup`` steps,
    then constant, or (``schedule="cosine"``) ``lr·½(1 + cos(π·(step − warmup)/(steps − warmup)))``,
    which reaches 0 at the last step."""
    if cfg.warmup and step <= cfg.warmup:
        return cfg.lr * step / cfg.warmup
    if cfg.schedule == "cosine" and cfg.steps > cfg.warmup:
        return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * (step - cfg.warmup) / (cfg.steps - cfg.warmup)))
    return cfg.lr


def lr_sums(cfg: TrainConfig) -> list[float]:
    """``Σ_{s ≤ t} lr_s`` for t = 0 … ``cfg.steps`` (:func:`lr_at`'s schedule, warmup included):
    entry t times λ is the decay exposure after t updates."""
    out = [0.0]
    for t in range(1, cfg.steps + 1):
        out.append(out[-1] + lr_at(cfg, t))
    return out


def decay_exposure(cfg: TrainConfig, steps: int | None = None) -> dict[str, float]:
    """Decay exposure ``λ·Σ_t lr_t`` of each decay group after ``steps`` updates (default: the
    whole run): decoupled decay shrinks a weight by ``∏(1 − lr_t λ) ≈ exp(−λ Σ lr_t)``, so this
    counts the time constants the decay had to act (docs/methods/training.md). ``attn``: the attention
    projections (``attn_weight_decay``); ``other``: every other decayed matrix and the
    embeddings (``weight_decay``)."""
    n = cfg.steps if steps is None else steps
    lr_sum = math.fsum(lr_at(cfg, t) for t in range(1, n + 1))
    return {"attn": cfg.attn_weight_decay * lr_sum, "other": cfg.weight_decay * lr_sum, "lr_sum": lr_sum}



def run_config(cfg: TrainConfig) -> dict[str, Any]:
    """The ``config.json`` of a run of ``cfg`` (without the versions the loop adds)."""
    return {"kind": "headrank-run", "task_name": cfg.TASK_NAME, **cfg.to_dict()}


def comparable(d: dict[str, Any]) -> dict[str, Any]:
    """The part of a run's ``config.json`` that must match for a resume (not versions, device,
    the threads it started with or how many checkpoints it keeps)."""
    d = upgrade(d)  # a run written by attnrank, before the rename, compares as today's
    return {k: v for k, v in d.items() if k not in ("versions", "device", "threads", "keep_checkpoints")}


#: learning-rate schedules after the warmup (see :func:`lr_at`; declared in headrank.util.constraints.TRAIN)
SCHEDULES = TRAIN["schedule"].choices
#: the model fields a flat override may set (recall, LM and ViT builders alike)
MODEL_KEYS = frozenset({"n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "mlp", "skip", "norm",
                        "learned_positions", "bias", "d_mlp", "init_std", "tie_embeddings"})
#: the default recall model (see :class:`RecallTrainConfig`)
RECALL_MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "mlp": False, "init_std": 0.1}


def recall_model(task: RecallConfig, **overrides: Any) -> ModelConfig:
    """The default recall model (:data:`RECALL_MODEL`, see :class:`RecallTrainConfig`), sized to ``task``."""
    return ModelConfig(vocab_size=task.vocab_size, max_seq_len=task.seq_len, **{**RECALL_MODEL, **overrides})


def recall_config(**overrides: Any) -> RecallTrainConfig:
    """A :class:`RecallTrainConfig` from flat overrides (validated): task fields ``n_pairs``,
    ``n_keys``, ``n_values``, ``n_queries``; model fields (:data:`MODEL_KEYS`: ``n_layers``,
    ``d_model``, ``n_heads``, ``head_dim``, ``mlp``, ``init_std`` …); and any
    :class:`RecallTrainConfig` field. None means default."""
    t, m, rest = _split_overrides(overrides, RecallConfig, MODEL_KEYS, RecallTrainConfig)
    task = RecallConfig(**t)
    return RecallTrainConfig(task=task, model=recall_model(task, **m), **rest)


# -- language model and ViT ----------------------------------------------------------------------

#: the default LM: 4 pre-norm causal layers, width 64, 4 heads of width 16, MLP 256, std 0.02
LM_MODEL = {"n_layers": 4, "d_model": 64, "n_heads": 4, "mlp": True, "init_std": 0.02}
#: the default ViT: 4 pre-norm layers, width 64, 4 heads of width 16, MLP 256, std 0.02
VIT_MODEL = {"n_layers": 4, "d_model": 64, "n_heads": 4, "mlp": True, "init_std": 0.02}


@dataclass
class LMTrainConfig(TrainConfig):
    """An autoregressive LM on a text corpus (:class:`headrank.models.data.LMTaskConfig`), with
    :class:`TrainConfig`'s optimizer and decay groups; Adam β = (0.9, 0.95) as in the paper's LMs.
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
            raise HeadRankError(f"eval_every must be an integer >= 0, got {self.eval_every!r}")
        if not self.model.causal:
            raise HeadRankError("a language model needs causal attention (model causal=True)")
        if self.model.vocab_size < self.task.vocab_size:
            raise HeadRankError(f"model vocab_size {self.model.vocab_size} < tokenizer vocabulary {self.task.vocab_size}")
        if self.model.max_seq_len < self.task.seq_len:
            raise HeadRankError(f"model max_seq_len {self.model.max_seq_len} < seq_len {self.task.seq_len}")

    def job(self, run: Path | None, dev: torch.device) -> Job:
        from headrank.models.data import TokenStream, evaluate_lm, lm_loss_and_accuracy, lm_tokens

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
    """A ViT classifying images (:class:`headrank.models.data.ImageTaskConfig`); the model is sized
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
        from headrank.models.data import load_images

        if not isinstance(self.eval_every, int) or isinstance(self.eval_every, bool) or self.eval_every < 0:
            raise HeadRankError(f"eval_every must be an integer >= 0, got {self.eval_every!r}")
        d = load_images(self.task.images, self.task.image_size)
        m = self.model
        if (m.image_size, m.channels) != (d.image_size, d.channels) or m.n_classes < len(d.classes):
            raise HeadRankError(f"ViT (image {m.image_size}, channels {m.channels}, classes {m.n_classes}) does not "
                                f"fit the data (image {d.image_size}, channels {d.channels}, classes {len(d.classes)})")

    def job(self, run: Path | None, dev: torch.device) -> Job:
        from headrank.models.data import (
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
    from headrank.models.data import load_images

    d = load_images(task.images, task.image_size)
    patch = overrides.pop("patch_size", None) or (2 if d.image_size <= 16 else 4)
    bad = set(overrides) - {f.name for f in fields(ViTConfig)}
    if bad:
        raise HeadRankError(f"option(s) {', '.join(sorted(bad))} do not apply to a ViT")
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
        raise HeadRankError(f"unknown training option(s): {', '.join(sorted(unknown))}")
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


#: sweep / CLI kinds → config classes (``from_dict`` of a stored config.json)
CONFIG_CLASSES: dict[str, type[TrainConfig]] = {"recall": RecallTrainConfig, "lm": LMTrainConfig,
                                                "vit": ViTTrainConfig}


def make_config(kind: str, **overrides: Any) -> TrainConfig:
    """The training config of task ``kind`` (``recall``, ``lm``, ``vit``) with flat overrides."""
    if kind not in CONFIG_BUILDERS:
        raise HeadRankError(f"unknown task {kind!r}; use one of {', '.join(CONFIG_BUILDERS)}")
    return CONFIG_BUILDERS[kind](**overrides)
