"""Settings of the Figure 1 + Proposition 3.1 reproduction (step size, init, λ grids: our choices)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fig1Params:
    """Everything that shapes the Figure 1 / Prop. 3.1 result; ``quick()`` and ``full()`` profiles.

    ``rate_seeds``: init seeds of the balance-rate fits; ``small_step``: if > 1, the rate fits are
    repeated with ``eta / small_step`` for ``small_step * steps`` steps (a discretisation check).
    """

    d: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8, 1.0)
    eta: float = 0.1
    steps: int = 1000
    init_scale: float = 0.5
    seed: int = 0
    lambdas: tuple[float, ...] = (0.0, 0.1, 0.25, 0.4, 0.6, 1.0)
    lam_traj: float = 0.4
    sweep_step: float = 0.05
    sweep_max: float = 2.2
    rate_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    rate_window: tuple[float, float] = (1e-10, 1e-4)
    small_step: int = 5
    prop31_shapes: tuple[tuple[int, int], ...] = ((5, 5), (16, 4), (64, 8), (8, 6))
    prop31_low_rank: tuple[int, int, int] = (8, 6, 3)
    prop31_per_shape: int = 50
    prop31_seed: int = 0

    @classmethod
    def quick(cls) -> Fig1Params:
        """A coarser λ sweep, two rate seeds, no small-step check (under a second)."""
        return cls(sweep_step=0.1, rate_seeds=(0, 1), small_step=0)

    @classmethod
    def full(cls) -> Fig1Params:
        """The figure's settings: 0.05 λ sweep, five seeds, the small-step check."""
        return cls()
