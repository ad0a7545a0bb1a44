"""The scale-invariance experiment's training (docs/methods/scale.md): many small ReLU + LayerNorm MLPs
on scikit-learn's digits, trained side by side with batched SGD / AdamW (one tensor per
parameter, a leading run axis), in three residual variants (``N`` = LayerNorm, ``h₀ = x`` the
standardised input):

- ``none`` (no residual):   ``h ← N(ReLU(W h))``,        logits = ``A h + b``
- ``post`` (post-norm):     ``h ← h + N(ReLU(W h))``,    logits = ``A h + b``
- ``pre``  (pre-norm):      ``h ← h + ReLU(W N(h))``,    logits = ``A N(h) + b``

Each W is scale-invariant in ``none`` and ``post`` and not in ``pre``. Decay λ is applied to the
block matrices W only (the head A, b and the LayerNorm gains are not decayed: decaying A would
change the logits' scale in every variant). All runs of a variant train together on the same
minibatches, each from its seed's initialisation, so within a seed λ (and η) is the only
difference. The input is added to the stream without a weight in front of it.

The optimisers (batched re-implementations of ``torch.optim.SGD`` with momentum and coupled L2,
and ``torch.optim.AdamW``, tested against them) track per step the norm, the effective learning
rate η/‖W‖², the angle W turns by, the gradient norm and cos(∇L, W).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from headrank.errors import HeadRankError

RESIDUAL_VARIANTS = ("none", "post", "pre")
VARIANT_FORMS = {
    "none": "h <- N(ReLU(W h)); logits = A h + b",
    "post": "h <- h + N(ReLU(W h)); logits = A h + b",
    "pre": "h <- h + ReLU(W N(h)); logits = A N(h) + b",
}


@dataclass
class Digits:
    """A train/test split of the digits: flattened images (N, 64) float32, labels (N,) int64."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def digits_data(n_test: int = 497, seed: int = 0) -> Digits:
    """scikit-learn digits (1797 8x8 images, 10 classes, from
    :func:`headrank.models.data.digits_arrays`): a seeded train/test split, pixels standardised
    with the training set's mean and standard deviation (constant pixels: 0)."""
    from headrank.models.data import digits_arrays

    images, y = digits_arrays()
    X = images.reshape(len(y), -1)
    perm = np.random.default_rng(seed).permutation(len(y))
    X, y = X[perm], y[perm]
    Xtr, Xte = X[n_test:], X[:n_test]
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0
    f = lambda a: torch.tensor((a - mu) / sd, dtype=torch.float32)  # noqa: E731
    return Digits(f(Xtr), torch.tensor(y[n_test:]), f(Xte), torch.tensor(y[:n_test]))


class BatchedMLP(nn.Module):
    """R independent ReLU + LayerNorm MLPs of one variant, computed together (leading dim R).

    ``W.{l}`` (R, d, d): block matrices, the only decayed parameters; ``gain.{l}``, ``shift.{l}``
    (R, d): LayerNorm affine parameters; ``A`` (R, classes, d), ``b`` (R, classes): the head.
    Run r is initialised from ``seeds[r]`` (He-normal W, A ~ N(0, 1/d)).
    """

    _norm_eps_attrs = ("eps",)

    def __init__(self, variant: str, seeds: Sequence[int], d: int = 64, depth: int = 3, n_classes: int = 10,
                 eps: float = 1e-5):
        super().__init__()
        if variant not in RESIDUAL_VARIANTS:
            raise HeadRankError(f"variant must be one of {', '.join(RESIDUAL_VARIANTS)}; got {variant!r}")
        self.variant, self.eps, self.depth = variant, eps, depth
        R = len(seeds)
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
        f32 = torch.float32  # whatever the default dtype: the same initial weights everywhere
        self.W = nn.ParameterList(
            nn.Parameter(torch.stack([torch.randn(d, d, generator=g, dtype=f32) * math.sqrt(2.0 / d) for g in gens]))
            for _ in range(depth))
        n_norms = depth + (variant == "pre")
        self.gain = nn.ParameterList(nn.Parameter(torch.ones(R, d, dtype=f32)) for _ in range(n_norms))
        self.shift = nn.ParameterList(nn.Parameter(torch.zeros(R, d, dtype=f32)) for _ in range(n_norms))
        self.A = nn.Parameter(torch.stack([torch.randn(n_classes, d, generator=g, dtype=f32) / math.sqrt(d)
                                           for g in gens]))
        self.b = nn.Parameter(torch.zeros(R, n_classes, dtype=f32))

    def _ln(self, h: torch.Tensor, i: int) -> torch.Tensor:
        z = torch.nn.functional.layer_norm(h, h.shape[-1:], eps=self.eps)
        return z * self.gain[i][:, None, :] + self.shift[i][:, None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, d) shared by all runs, or (R, B, d) → logits (R, B, classes)."""
        R = self.A.shape[0]
        h = x.expand(R, *x.shape) if x.dim() == 2 else x
        relu = torch.nn.functional.relu
        for l, W in enumerate(self.W):
            if self.variant == "pre":
                h = h + relu(self._ln(h, l) @ W.mT)
            else:
                z = self._ln(relu(h @ W.mT), l)
                h = z if self.variant == "none" else h + z
        if self.variant == "pre":
            h = self._ln(h, self.depth)
        return h @ self.A.mT + self.b[:, None, :]

    def decayed(self) -> list[nn.Parameter]:
        """The block matrices W (the decayed parameters)."""
        return list(self.W)

    def others(self) -> list[nn.Parameter]:
        """Head and LayerNorm parameters (not decayed)."""
        return [*self.gain, *self.shift, self.A, self.b]


def _per_run(v: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (p.dim() - 1)))


class BatchedSGD:
    """torch.optim.SGD (momentum, coupled L2 ``weight_decay``, no dampening/Nesterov) with, per
    run (leading dimension of every parameter), a learning rate ``lr`` and decay ``lam`` for the
    ``decayed`` tensors and a learning rate ``lr_other`` (no decay) for the others."""

    def __init__(self, decayed: list[torch.Tensor], others: list[torch.Tensor], lr: torch.Tensor,
                 lam: torch.Tensor, momentum: float, lr_other: torch.Tensor | None = None):
        self.decayed, self.others, self.lr, self.lam, self.momentum = decayed, others, lr, lam, momentum
        self.lr_other = lr if lr_other is None else lr_other
        self.buf: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> dict[int, torch.Tensor]:
        """Apply one step; return the update direction (the momentum buffer) per decayed tensor."""
        out = {}
        for p in [*self.decayed, *self.others]:
            g = p.grad
            decayed = any(p is q for q in self.decayed)
            if decayed:
                g = g + _per_run(self.lam, p) * p
            key = id(p)
            if self.momentum:
                if key in self.buf:
                    self.buf[key].mul_(self.momentum).add_(g)
                else:
                    self.buf[key] = g.clone()
                g = self.buf[key]
            p.sub_(_per_run(self.lr if decayed else self.lr_other, p) * g)
            out[key] = g
        return out


class BatchedAdamW:
    """torch.optim.AdamW (decoupled decay ``w ← (1 − ηλ) w``, bias-corrected moments) with, per
    run, ``lr`` and ``lam`` for the ``decayed`` tensors and ``lr_other`` (no decay) for the others."""

    def __init__(self, decayed: list[torch.Tensor], others: list[torch.Tensor], lr: torch.Tensor,
                 lam: torch.Tensor, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 lr_other: torch.Tensor | None = None):
        self.decayed, self.others, self.lr, self.lam = decayed, others, lr, lam
        self.lr_other = lr if lr_other is None else lr_other
        self.betas, self.eps, self.t = betas, eps, 0
        self.m: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def step(self) -> dict[int, torch.Tensor]:
        """Apply one step; return the Adam direction m̂/(√v̂ + ε) per tensor (before η)."""
        self.t += 1
        b1, b2 = self.betas
        out = {}
        for p in [*self.decayed, *self.others]:
            key = id(p)
            decayed = any(p is q for q in self.decayed)
            if decayed:
                p.mul_(1 - _per_run(self.lr * self.lam, p))
            if key not in self.m:
                self.m[key], self.v[key] = torch.zeros_like(p), torch.zeros_like(p)
            m, v = self.m[key], self.v[key]
            m.lerp_(p.grad, 1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            u = (m / (1 - b1**self.t)) / ((v / (1 - b2**self.t)).sqrt() + self.eps)
            p.sub_(_per_run(self.lr if decayed else self.lr_other, p) * u)
            out[key] = u
        return out


def _sq(t: torch.Tensor) -> torch.Tensor:
    """Squared Frobenius norm per run: (R, ...) → (R,) float64."""
    return t.double().pow(2).flatten(1).sum(1)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Cross-entropy and accuracy per run on (x, y)."""
    logits = model(x)
    R, B, C = logits.shape
    loss = torch.nn.functional.cross_entropy(logits.reshape(R * B, C), y.repeat(R), reduction="none")
    return loss.view(R, B).mean(1).double().numpy(), (logits.argmax(-1) == y).double().mean(1).numpy()


def make_optimizer(model: BatchedMLP, optimizer: str, lams: Sequence[float], lrs: Sequence[float],
                   lr_other: float | Sequence[float] | None, momentum: float) -> BatchedSGD | BatchedAdamW:
    """The batched optimiser (``sgd`` or ``adamw``) over ``model``'s W (lr, lam per run) and its
    other parameters (``lr_other`` per run, default each run's lr; no decay)."""
    R = len(lams)
    lam_t = torch.tensor(lams, dtype=torch.float32)
    lr_t = torch.tensor(lrs, dtype=torch.float32)
    if lr_other is None:
        lro = lr_t
    else:
        lro = torch.tensor([lr_other] * R if np.isscalar(lr_other) else list(lr_other), dtype=torch.float32)
    if optimizer == "sgd":
        return BatchedSGD(model.decayed(), model.others(), lr_t, lam_t, momentum, lr_other=lro)
    if optimizer == "adamw":
        return BatchedAdamW(model.decayed(), model.others(), lr_t, lam_t, lr_other=lro)
    raise ValueError(optimizer)


class _Recorder:
    """Per-step measurements of the block matrices, averaged over logging windows, and the
    periodic full evaluations (see :func:`train_runs` for what each series is)."""

    STEP_KEYS = ("angle", "grad_sq", "cos_gw", "update_sq")

    def __init__(self, model: BatchedMLP, lr: torch.Tensor, data: Digits):
        self.model, self.Ws, self.lr, self.data = model, model.decayed(), lr, data
        R, L = model.A.shape[0], len(self.Ws)
        self.hist: dict[str, list] = {k: [] for k in ("step", "norm", "eff_lr", *self.STEP_KEYS, "loss")}
        self.ev: dict[str, list] = {k: [] for k in ("eval_step", "train_loss", "train_acc", "test_loss", "test_acc")}
        self.acc = {k: torch.zeros(R, L, dtype=torch.float64) for k in self.STEP_KEYS}
        self.acc_loss = torch.zeros(R, dtype=torch.float64)

    @torch.no_grad()
    def step(self, opt: BatchedSGD | BatchedAdamW, loss: torch.Tensor) -> None:
        """Apply ``opt.step()`` and measure it, on all block matrices at once: (L, R, d, d)."""
        Ws, acc = self.Ws, self.acc
        before = torch.stack([w.detach() for w in Ws])
        g = torch.stack([w.grad for w in Ws])
        nb = before.pow(2).sum((-2, -1)).sqrt()
        ng = g.pow(2).sum((-2, -1)).sqrt()
        acc["grad_sq"] += (ng.double() ** 2).T
        acc["cos_gw"] += ((g * before).sum((-2, -1)).double() / (ng.double() * nb.double() + 1e-300)).T
        upd = opt.step()
        after = torch.stack([w.detach() for w in Ws])
        na = after.pow(2).sum((-2, -1)).sqrt()
        chord = (after / na[..., None, None] - before / nb[..., None, None]).pow(2).sum((-2, -1)).sqrt()
        acc["angle"] += (2 * torch.asin((chord.double() / 2).clamp(max=1.0))).T
        acc["update_sq"] += torch.stack([upd[id(w)].pow(2).sum((-2, -1)) for w in Ws]).double().T
        self.acc_loss += loss.detach().double()

    def window(self, step: int, per: int) -> None:
        """Close a logging window of ``per`` steps ending at ``step``."""
        R = self.acc_loss.shape[0]
        norms = torch.stack([_sq(w.detach()).sqrt() for w in self.Ws], 1)
        self.hist["step"].append(step)
        self.hist["norm"].append(norms.numpy())
        self.hist["eff_lr"].append((self.lr.double().view(R, 1) / norms**2).numpy())
        for k in self.acc:
            self.hist[k].append((self.acc[k] / per).numpy())
            self.acc[k].zero_()
        self.hist["loss"].append((self.acc_loss / per).numpy())
        self.acc_loss.zero_()

    def evaluate(self, step: int) -> None:
        """Full train and test loss/accuracy per run."""
        d = self.data
        trl, tra = evaluate(self.model, d.x_train, d.y_train)
        tel, tea = evaluate(self.model, d.x_test, d.y_test)
        for k, v in zip(self.ev, (step, trl, tra, tel, tea), strict=True):
            self.ev[k].append(v)

    def series(self) -> dict[str, np.ndarray]:
        """Every recorded series as an array."""
        return {k: np.asarray(v) for k, v in {**self.hist, **self.ev}.items()}


def train_runs(variant: str, *, lams: Sequence[float], lrs: Sequence[float], seeds: Sequence[int],
               data: Digits, lr_other: float | Sequence[float] | None = None, optimizer: str = "sgd",
               steps: int = 2000, batch: int = 128, momentum: float = 0.9,
               windows: int = 100, evals: int = 20, depth: int = 3, data_seed: int = 0,
               input_noise: float = 0.0) -> dict[str, Any]:
    """Train one run per (lam, lr, seed) triple of ``variant`` together on the same minibatches.

    ``lr``/``lam`` act on the block matrices W; the head and LayerNorm parameters train with
    ``lr_other`` (default: each run's lr) and no decay. ``input_noise``: standard deviation of
    fresh Gaussian noise added to every minibatch's (standardised) inputs.

    History (per logging window of ``steps // windows`` steps, means over the window; per run, and
    per decayed tensor where it says so):

    - ``norm`` (R, L): ‖W‖_F at the window's end; ``eff_lr`` = η/‖W‖² (R, L);
    - ``angle`` (R, L): mean angle between W before and after a step (radians);
    - ``grad_sq`` (R, L): mean ‖∇_W loss‖² (the loss gradient, without decay);
    - ``cos_gw`` (R, L): mean cos(∇_W loss, W) (0 for a scale-invariant W);
    - ``update_sq`` (R, L): mean ‖u‖² of the update direction (SGD: momentum buffer incl. decay;
      AdamW: m̂/(√v̂+ε));
    - ``loss`` (R,): mean minibatch loss; evaluations (``eval_step``): full train/test loss/accuracy.

    Also returned: the settings, ``n_entries`` per W and the trained ``model``.
    """
    if not (len(lams) == len(lrs) == len(seeds)) or not lams:
        raise ValueError("lams, lrs and seeds must have the same positive length")
    R = len(lams)
    model = BatchedMLP(variant, seeds, d=data.x_train.shape[1], depth=depth,
                       n_classes=int(data.y_train.max()) + 1)
    opt = make_optimizer(model, optimizer, lams, lrs, lr_other, momentum)
    rec = _Recorder(model, opt.lr, data)
    per = max(1, steps // windows)
    eval_every = max(1, steps // evals)
    gen = torch.Generator().manual_seed(data_seed)
    n = data.x_train.shape[0]
    rec.evaluate(0)
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (batch,), generator=gen)
        xb = data.x_train[idx]
        if input_noise:
            xb = xb + input_noise * torch.randn(xb.shape, generator=gen, dtype=xb.dtype)
        logits = model(xb)
        C = logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(R * batch, C), data.y_train[idx].repeat(R),
                                                 reduction="none").view(R, batch).mean(1)
        for p in model.parameters():
            p.grad = None
        loss.sum().backward()  # runs are independent: each run's gradient is its own loss's
        rec.step(opt, loss)
        if step % per == 0:
            rec.window(step, per)
        if step % eval_every == 0 or step == steps:
            rec.evaluate(step)
    out: dict[str, Any] = rec.series()
    out.update(variant=variant, optimizer=optimizer, lams=np.asarray(lams, float), lrs=np.asarray(lrs, float),
               lr_other=opt.lr_other.double().numpy(), seeds=np.asarray(seeds),
               momentum=momentum if optimizer == "sgd" else None, steps=steps, batch=batch,
               input_noise=input_noise, n_entries=np.array([w.shape[1] * w.shape[2] for w in rec.Ws]), model=model)
    return out
