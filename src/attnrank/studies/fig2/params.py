"""Parameters of the Figure 2 reproduction (what ran is recorded as ``asdict(params)``)."""

from __future__ import annotations

from dataclasses import dataclass

OTHER_WD = 0.1  # the paper: every parameter but attention keeps decay 0.1


@dataclass(frozen=True)
class Fig2Params:
    """One run per attention decay λ of ``lambdas`` and seed of ``seeds`` on associative recall;
    runs of one seed share initialisation and data order, so runs of different λ are paired.
    ``steps`` AdamW steps at peak ``lr`` under ``schedule`` (cosine to 0 after the warmup: late
    Adam steps, which spike once the loss reaches 0, shrink with it); decay
    ``other_weight_decay`` on every other matrix. A λ is judged only when its decay exposure
    λ·Σlr reaches ``min_exposure`` time constants (λ = 0 is the control). ``workers``: runs side
    by side, one torch thread each (the numbers do not depend on it)."""

    lambdas: tuple[float, ...] = (0.0, 0.3, 1.0, 2.0, 3.0)
    steps: int = 2000
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    other_weight_decay: float = OTHER_WD
    lr: float = 3e-3
    schedule: str = "cosine"
    min_exposure: float = 5.0
    workers: int = 2

    @classmethod
    def quick(cls) -> Fig2Params:
        """The ``--quick`` profile: exposures λ·Σlr = 0, 3, 6, 9 (λ = 1 reported, not judged), two seeds."""
        return cls(lambdas=(0.0, 1.0, 2.0, 3.0), seeds=(0, 1))

    @classmethod
    def full(cls) -> Fig2Params:
        """The full profile: four paired seeds, λ = 0.3 (exposure 0.9) reported as well, the same 2,000
        steps. Not longer: at 6,000 steps the loss reached 0 by step ~1,500 while the cosine lr was
        still ~80 % of its peak, and Adam's spikes from step ~2,200 on undid the balance (measured:
        gap/bound back to 0.036-0.042 at every λ > 0, against 0.044 at λ = 0)."""
        return cls()
