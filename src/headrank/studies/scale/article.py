"""Measurements for the statements of Dar's article the training runs cannot judge alone
(docs/methods/scale.md): the TL;DR as an identity at LayerNorm epsilon 0 and its breakdown with
the real epsilon, the BatchNorm scale-invariance identity, and input-scaling equivariance
(ReLU without normalisation) and invariance (with LayerNorm). All in float64 on the digits."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import torch

from headrank.analysis.scaling import norm_eps_zero, scaled
from headrank.training.batched import BatchedMLP, Digits, evaluate

#: the factors every W is scaled by in the TL;DR identity and its epsilon > 0 breakdown: "arbitrarily
#: small weight matrix norms" (penalty x c^2: 1e-2, 1e-4, 1e-6)
SHRINKS = (0.1, 0.01, 1e-3)
#: input (and weight) scales of the equivariance and BatchNorm identities
INPUT_SCALES = (0.5, 3.0, 0.01)


def shrink_sweep(model: BatchedMLP, runs: list[int], data: Digits) -> dict[str, Any]:
    """Per run index of ``runs`` (the λ = 0 run of each seed): the relative change of the clean
    training loss when every W is scaled by each c of :data:`SHRINKS`, with LayerNorm epsilon 0
    and with the epsilon the network was trained with (1e-5)."""
    m = copy.deepcopy(model).double()
    x, y = data.x_train.double(), data.y_train
    out: dict[str, Any] = {"c": list(SHRINKS), "eps0": {}, "eps": {}}
    for key, ctx in (("eps0", lambda: norm_eps_zero(m)), ("eps", nullcontext)):
        with ctx(), torch.no_grad():
            base = evaluate(m, x, y)[0]
            for c in SHRINKS:
                with scaled(m.decayed(), c):
                    after = evaluate(m, x, y)[0]
                out[key][f"{c:g}"] = [float(abs(after[j] - base[j]) / base[j]) for j in runs]
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def batch_norm(z: torch.Tensor, eps: float) -> torch.Tensor:
    """BatchNorm in training mode (batch statistics, biased variance, gain 1, shift 0), written
    out because torch refuses epsilon 0 in training: (z − mean) / sqrt(var + eps). Checked
    against ``torch.nn.BatchNorm1d`` at epsilon 1e-5 in the tests."""
    return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + eps)


def batchnorm_identity(x: torch.Tensor, seed: int) -> dict[str, float]:
    """BatchNorm in training mode (batch statistics), epsilon 0: BN(a W x) = BN(W x) for a > 0,
    so the W before it is scale-invariant as LayerNorm's is (the article's note). Relative
    output error per a, epsilon 0 and 1e-5, float64, a freshly initialised 64-64-10 network."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lin, head = torch.nn.Linear(64, 64, bias=False).double(), torch.nn.Linear(64, 10).double()
    out = {}
    with torch.no_grad():
        for eps in (0.0, 1e-5):
            base = head(torch.relu(batch_norm(lin(x), eps)))
            for a in INPUT_SCALES:
                out[f"eps={eps:g}, a={a:g}"] = _rel(head(torch.relu(batch_norm(a * lin(x), eps))), base)
    return out


def input_scaling(model: BatchedMLP, x: torch.Tensor, seed: int) -> dict[str, Any]:
    """"multiply your input by a positive scalar and … the output is scaled exactly by the same
    factor" (bias-free ReLU, no normalisation: f(a x) = a f(x)); with LayerNorm (the trained
    variant-none networks, epsilon 0): f(a x) = f(x). Largest relative error per a."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = [torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False),
                  torch.nn.Linear(64, 10, bias=False)]
    relu_net = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2]).double()
    ln = copy.deepcopy(model).double()
    out: dict[str, Any] = {"relu_equivariant": {}, "layernorm_invariant": {}}
    with torch.no_grad(), norm_eps_zero(ln):
        f0, g0 = relu_net(x), ln(x)
        for a in INPUT_SCALES:
            out["relu_equivariant"][f"{a:g}"] = _rel(relu_net(a * x), a * f0)
            out["layernorm_invariant"][f"{a:g}"] = _rel(ln(a * x), g0)
    return out


def measure(model: BatchedMLP, runs: list[int], data: Digits, seed: int) -> dict[str, Any]:
    """Everything above, for the stored data (``article`` in data.json)."""
    x = data.x_test.double()
    return {"shrink": shrink_sweep(model, runs, data), "batchnorm": batchnorm_identity(x, seed),
            "input": input_scaling(model, x, seed)}
