"""How many singular directions each unit keeps: by energy, by a fixed rank, or by a global
parameter budget allocated from the measured spectra.

A unit is one kv head's cut (one query head without grouped-query attention; see
:mod:`.cut`). In a factored deployment a unit of rank k stores ``k·(g·d + d)`` numbers (the
g query heads' ``X'`` and the shared ``S'``) instead of ``dh·(g·d + d)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headrank.core.metrics import energy_rank
from headrank.errors import HeadRankError
from headrank.util.constraints import COMPRESS


@dataclass(frozen=True)
class Rule:
    """One of ``keep`` (energy share in (0, 1]), ``rank`` (≥ 1, ≤ head dim) or ``params``
    (fraction in (0, 1] of the cut products' parameters kept, allocated globally)."""

    kind: str
    value: float

    @classmethod
    def of(cls, keep: float | None = None, rank: int | None = None, params: float | None = None) -> Rule:
        given = [(k, v) for k, v in (("keep", keep), ("rank", rank), ("params", params)) if v is not None]
        if len(given) != 1:
            raise HeadRankError("give exactly one of `keep` FRACTION, `rank` K or `params` FRACTION"
                                + (f" (got {', '.join(k for k, _ in given)})" if given else ""))
        kind, value = given[0]
        COMPRESS[kind].check(value)  # the one declaration of its bounds (headrank.util.constraints)
        return cls(kind, float(value))

    def label(self) -> str:
        return f"rank {int(self.value)}" if self.kind == "rank" else f"{self.kind} {self.value:g}"


def choose(rule: Rule, spectra: dict[str, torch.Tensor], cost: dict[str, int], head_dim: int
           ) -> dict[str, torch.Tensor]:
    """Ranks per product, each ``(layers, units)`` long, from singular values ``(layers, units, p)``.

    ``cost[product]``: numbers stored per unit and per kept direction (``g·d + d``).
    ``params``: every unit keeps at least one direction; the rest of the budget goes greedily to
    the directions with the largest share of their unit's energy per parameter, ``σᵢ²/Σσ²/cost``
    (shares, not raw σ², so layers and products of different scale compare).
    """
    if rule.kind == "rank":
        k = int(rule.value)
        if k > head_dim:
            raise HeadRankError(f"`rank` {k} exceeds the head dimension {head_dim}")
        return {p: torch.full(sv.shape[:-1], k, dtype=torch.long) for p, sv in spectra.items()}
    if rule.kind == "keep":
        return {p: energy_rank(sv, rule.value).clamp_min(1) for p, sv in spectra.items()}
    return _budget(rule.value, spectra, cost, head_dim)


def _budget(fraction: float, spectra: dict[str, torch.Tensor], cost: dict[str, int], head_dim: int
            ) -> dict[str, torch.Tensor]:
    total = sum(sv.shape[0] * sv.shape[1] * head_dim * cost[p] for p, sv in spectra.items())
    budget = fraction * total
    ranks = {p: torch.ones(sv.shape[:-1], dtype=torch.long) for p, sv in spectra.items()}
    used = sum(r.numel() * cost[p] for p, r in ranks.items())
    if used > budget:
        raise HeadRankError(f"`params` {fraction:g} is below one direction per head "
                            f"({used / total:.3g} of the parameters)")
    vals, owners = [], []
    for pi, (p, sv) in enumerate(spectra.items()):
        e = sv.to(torch.float64) ** 2
        share = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        v = (share[..., 1:] / cost[p]).reshape(-1)
        vals.append(v)
        n_units = sv.shape[0] * sv.shape[1]
        unit = torch.arange(n_units).repeat_interleave(sv.shape[-1] - 1)
        owners.append(torch.stack([torch.full_like(unit, pi), unit], 1))
    vals, owners = torch.cat(vals), torch.cat(owners)
    order = torch.sort(vals, descending=True, stable=True).indices
    names = list(spectra)
    step = torch.tensor([cost[names[i]] for i in owners[order, 0].tolist()], dtype=torch.float64)
    take = int((torch.cumsum(step, 0) <= budget - used).sum())
    for pi, unit in owners[order[:take]].tolist():
        ranks[names[pi]].view(-1)[unit] += 1
    return ranks
