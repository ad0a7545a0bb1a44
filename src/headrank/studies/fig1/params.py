"""Settings of the Figure 1 + Proposition 3.1 reproduction (step size, init, λ grids: our choices)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fig1Params:
    """Everything that shapes the Figure 1 / Prop. 3.1 result; ``quick()`` and ``full()`` profiles.

    ``rate_seeds``: init seeds of the balance-rate fits; ``small_step``: if > 1, the rate fits are
    repeated with ``eta / small_step`` for ``small_step * steps`` steps (a discretisation check).

    ``minima_*``: the abstract's "any local minimum ... coincides" beyond the diagonal target
    (:mod:`.minima`, ``fig1.local_minima``): targets ``(m, n, k, rank)`` (D m×n of that rank,
    factors m×k and n×k), their seeds, the λ and init stds of the descents, the step and the
    number of steps. Fixed before the claim's first run; spectral norm of D is 1, so λ = 2.5
    thresholds every singular value (W* = 0).
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
    minima_targets: tuple[tuple[int, int, int, int], ...] = ((5, 5, 5, 5), (8, 5, 5, 5), (5, 8, 5, 5), (12, 4, 4, 4),
                                                             (8, 6, 6, 3), (5, 5, 7, 5))
    minima_lambdas: tuple[float, ...] = (0.1, 0.5, 1.0, 2.5)
    minima_inits: tuple[float, ...] = (0.01, 0.1, 0.3)
    minima_seeds: tuple[int, ...] = (0, 1, 2)
    minima_eta: float = 0.05
    minima_steps: int = 40_000

    @classmethod
    def quick(cls) -> Fig1Params:
        """A coarser λ sweep, two rate seeds, no small-step check, one seed per local-minima target."""
        return cls(sweep_step=0.1, rate_seeds=(0, 1), small_step=0, minima_seeds=(0,))

    @classmethod
    def full(cls) -> Fig1Params:
        """The figure's settings: 0.05 λ sweep, five seeds, the small-step check."""
        return cls()
