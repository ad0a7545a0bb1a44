"""Parameters of the Figure 2 reproduction (what ran is recorded as ``asdict(params)``)."""

from __future__ import annotations

from dataclasses import dataclass

OTHER_WD = 0.1  # the paper: every parameter but attention keeps decay 0.1


@dataclass(frozen=True)
class Fig2Params:
    """One run per attention decay λ of ``lambdas`` on associative recall, all from seed ``seed``
    (shared initialisation and data order, so runs of different λ are paired); ``steps`` AdamW
    steps; decay ``other_weight_decay`` on every other matrix. ``workers``: runs side by side,
    one torch thread each (the numbers do not depend on it)."""

    lambdas: tuple[float, ...] = (0.0, 0.03, 0.1, 0.3, 1.0)
    steps: int = 6000
    seed: int = 0
    other_weight_decay: float = OTHER_WD
    workers: int = 2

    @classmethod
    def quick(cls) -> Fig2Params:
        """The ``--quick`` profile."""
        return cls(lambdas=(0.0, 0.1, 0.3, 1.0), steps=800)

    @classmethod
    def full(cls) -> Fig2Params:
        """The full profile."""
        return cls()
