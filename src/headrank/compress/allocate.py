"""``--allocate loss``: ranks from each unit's measured loss sensitivity (ASVD's rank search).

ASVD (Yuan et al. 2023, its ``sensitivity.py`` and ``binary_search.py``) measures, for every
compressible matrix and every parameter ratio in ``0.1, 0.2, …, 0.9``, the perplexity of the
calibration text with only that matrix truncated to that ratio; then it searches a perplexity
threshold: each matrix gets the smallest ratio whose measured perplexity is at or below the
threshold (none at or below: the matrix stays whole), and the threshold is the one whose
allocation meets the parameter budget. Here the matrix is a unit (a kv head with its query
group, one product; :mod:`.cut`), the ratio is a rank ``k = round(c · dh)`` for the same nine
``c``, the measurement is the calibration loss (mean next-token negative log-likelihood of a
causal LM, a monotone function of perplexity; the cosine drift of mean-pooled embeddings for an
encoder) of the real model with that unit cut exactly as it would be written, and the threshold
is the smallest measured loss whose allocation fits ``params`` (docs/methods/compression.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from headrank.compress.evaluate import (
    CALIB_SPLIT,
    drift,
    embeddings,
    mean_nll,
    split_text,
)
from headrank.errors import HeadRankError

#: ASVD's parameter-ratio candidates, here shares of the head dimension
CANDIDATES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def candidate_ranks(head_dim: int) -> list[int]:
    """``round(c · dh)`` for the candidates, at least 1, below ``dh``, without repeats."""
    return sorted({min(max(1, round(c * head_dim)), head_dim - 1) for c in CANDIDATES if head_dim > 1})


@dataclass
class Allocation:
    """What ``--allocate loss`` measured and chose."""

    ranks: dict[str, torch.Tensor]
    losses: dict[str, torch.Tensor]  # (layers, units, candidates)
    candidates: list[int]
    threshold: float
    baseline: float
    metric: str
    text: str

    def report(self) -> dict[str, Any]:
        return {"method": "loss", "metric": self.metric, "baseline": self.baseline, "threshold": self.threshold,
                "candidates": self.candidates, "calibration": self.text,
                "rule": "ASVD: each unit keeps the smallest candidate rank whose calibration loss, with only that "
                        "unit cut, is <= threshold (none: uncut); threshold: the smallest measured loss whose "
                        "allocation fits the budget"}

    def unit_losses(self, product: str, j: int, u: int) -> list[float]:
        return [float(x) for x in self.losses[product][j, u]]


class CalibrationLoss:
    """The loss of a model on the calibration text: mean next-token NLL (causal LM) or the cosine
    drift of mean-pooled calibration-sentence embeddings against the reference model's."""

    def __init__(self, model, tok, spec):
        self.causal, self.data, text, self.ref = split_text(model, tok, spec, CALIB_SPLIT)
        self.metric = "mean next-token NLL" if self.causal else "cosine drift"
        self.text = f"{text} (calibration split)"

    @torch.no_grad()
    def __call__(self, model) -> float:
        if self.causal:  # the cross-entropy in the model's dtype: 1/6 of the time the float64 upcast takes
            return mean_nll(model, self.data, upcast=False)
        return drift(self.ref, embeddings(model, self.data))


def _layer_list(model, modules):
    if modules is None:
        return None
    try:
        return model.base_model.get_submodule(modules.layers)
    except AttributeError:
        return None


class _Replay(torch.nn.Module):
    """Stands in for a layer before the one being cut: returns the recorded output of the layer
    just before it, call by call (the uncut model's, which a later cut does not change)."""

    def __init__(self, layer: torch.nn.Module, outputs: list[Any]):
        super().__init__()
        object.__setattr__(self, "_layer", layer)  # attributes the model's loop reads (not a submodule)
        self.outputs, self.n = outputs, 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.outputs[self.n % len(self.outputs)]
        self.n += 1
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_layer"), name)


def _recorded(layers, score: CalibrationLoss, model) -> tuple[list[list[Any]], float]:
    """Run the calibration once, recording every layer's output call by call; and its loss."""
    rec: list[list[Any]] = [[] for _ in range(len(layers))]
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: rec[i].append(o)) for i, layer in enumerate(layers)]
    try:
        base = score(model)
    finally:
        for h in hooks:
            h.remove()
    return rec, base


@contextmanager
def _skipping(layers, i: int, rec: list[list[Any]] | None) -> Iterator[None]:
    """Layers ``0 … i-1`` replaced by replays of layer ``i-1``'s recorded output."""
    if layers is None or rec is None or i == 0:
        yield
        return
    saved = [layers[j] for j in range(i)]
    try:
        for j in range(i):
            layers[j] = _Replay(saved[j], rec[i - 1])
        yield
    finally:
        for j in range(i):
            layers[j] = saved[j]


def measure(model, reader, plan, score: CalibrationLoss, apply, modules=None,
            progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, torch.Tensor], float]:
    """Per product, the calibration loss ``(layers, units, candidates)`` with only that unit cut
    to that rank (the other units of its layer re-formed at full rank, the identity up to float
    round-off), and the uncut loss. ``reader``: ``open_reader(model)``; ``plan``: pass 1's plan
    (spectra, roots, whitening); ``apply``: :func:`~headrank.compress.cut_in_place`.
    Layers before the cut one are replayed from one recorded pass where the model's layer list is
    known (``modules``), else the whole model runs."""
    dh = reader.dims.head_dim
    cands = candidate_ranks(dh)
    todo = plan.cut_layers(reader.dims.n_layers)
    n_units = {p: plan.spectra[p].shape[1] for p in plan.products}
    total = sum(len(todo) * n_units[p] * len(cands) for p in plan.products)
    out = {p: torch.full((len(todo), n_units[p], len(cands)), math.nan, dtype=torch.float64) for p in plan.products}
    layers = _layer_list(model, modules)
    model.eval()
    rec, base = _recorded(layers, score, model) if layers is not None else (None, score(model))
    done = 0
    for j, i in enumerate(todo):
        if rec is not None and list(todo) == sorted(todo):
            for gone in range(i - 1):  # the layers after this one need only later records
                rec[gone] = []
        with _skipping(layers, i, rec):
            for p in plan.products:
                for u in range(n_units[p]):
                    for c, k in enumerate(cands):
                        ranks = torch.full((1, n_units[p]), dh, dtype=torch.long)
                        ranks[0, u] = k
                        one = replace(plan, products=(p,), ranks={p: ranks}, layers=(i,),
                                      roots=None if plan.roots is None else {p: [plan.roots[p][j]]})
                        with apply(model, reader, one):
                            out[p][j, u, c] = score(model)
                        done += 1
                        if progress:
                            progress(done, total)
    return out, base


def threshold_ranks(losses: dict[str, torch.Tensor], cands: list[int], cost: dict[str, int], head_dim: int,
                    fraction: float) -> tuple[dict[str, torch.Tensor], float]:
    """ASVD's search: the smallest threshold ``τ`` among the measured losses such that, with
    every unit at its smallest candidate rank of loss ``≤ τ`` (none: ``head_dim``), the kept
    parameters fit ``fraction`` of the cut products'. Returns the ranks and ``τ``."""
    ks = torch.tensor(cands, dtype=torch.long)
    total = sum(v.shape[0] * v.shape[1] * head_dim * cost[p] for p, v in losses.items())
    budget = fraction * total

    def ranks_at(tau: float) -> dict[str, torch.Tensor]:
        out = {}
        for p, v in losses.items():
            ok = torch.nan_to_num(v, nan=math.inf) <= tau  # (layers, units, C); candidates ascending
            first = torch.where(ok.any(-1), ok.to(torch.int8).argmax(-1), -1)
            out[p] = torch.where(first >= 0, ks[first.clamp_min(0)], torch.full_like(first, head_dim))
        return out

    def kept(r: dict[str, torch.Tensor]) -> float:
        return float(sum(int(r[p].sum()) * cost[p] for p in r))

    taus = torch.unique(torch.cat([torch.nan_to_num(v, nan=math.inf).reshape(-1) for v in losses.values()]))
    taus = taus[torch.isfinite(taus)]
    if taus.numel() == 0 or kept(ranks_at(float(taus[-1]))) > budget:
        floor = kept(ranks_at(math.inf)) / total if total else 1.0
        raise HeadRankError(f"`params` {fraction:g} is below what `allocate` loss can reach (every unit at its "
                            f"smallest candidate rank {cands[0] if cands else head_dim}: {floor:.3g} of the parameters)")
    lo, hi = 0, taus.numel() - 1  # kept() does not grow with tau: the first index that fits
    while lo < hi:
        mid = (lo + hi) // 2
        if kept(ranks_at(float(taus[mid]))) <= budget:
            hi = mid
        else:
            lo = mid + 1
    tau = float(taus[lo])
    return ranks_at(tau), tau


def reallocate(plan, allocate: str, model, tok, live_reader, spec, apply,
               progress: Callable[[int, int], None] | None = None) -> tuple[Any, Allocation | None]:
    """``allocate`` loss: the plan with ranks chosen by measured loss (``model``: the live
    Hugging Face model; ``live_reader``: its reader, None to open one), and the allocation;
    ``energy``: the plan as it is."""
    if allocate != "loss":
        return plan, None
    from headrank.io.sources import open_reader

    reader = live_reader if live_reader is not None else open_reader(model)
    score = CalibrationLoss(model, tok, spec)
    losses, base = measure(model, reader, plan, score, apply, reader.layout.modules, progress)
    cands = candidate_ranks(reader.dims.head_dim)
    ranks, tau = threshold_ranks(losses, cands, plan.cost, reader.dims.head_dim, plan.rule.value)
    return replace(plan, ranks=ranks), Allocation(ranks, losses, cands, tau, base, score.metric, score.text)


def annotate(result: dict[str, Any], alloc: Allocation | None, plan) -> None:
    """compress.json: the allocation block, and each unit's measured losses (one per candidate)."""
    if alloc is None:
        return
    result["allocation"] = alloc.report()
    j_of = {i: j for j, i in enumerate(plan.layers)} if plan.layers is not None else None
    for row in result["units"]:
        j = row["layer"] if j_of is None else j_of[row["layer"]]
        row["calibration_loss"] = alloc.unit_losses(row["product"], j, row["kv_head"])
