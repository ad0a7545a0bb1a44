"""Settings of the Figure 5 reproduction (curve, start, lr, steps, ε and λ_wd grids: our choices)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fig5Params:
    """Everything that shapes the Figure 5 result; ``quick()`` and ``full()`` profiles.

    ``schedules``: (lr, steps, record_every) per learning rate; the first is the main one (the
    trajectories of the figure, the λ_wd sweep). ``traj_eps``: the ε whose trajectories are kept.
    ``disc``: (λ_wd, ε) where the conjecture is judged: λ_L2 = λ_wd·ε = 0.09 moves the L2 optimum
    of S visibly (0.5× and 2× it lie further from it than the tolerance), and λ_wd·|θ| stays small.
    At ``lam_main``·``eps_main`` = 1e-3 the optima at 0.5×, 1× and 2× lie within 2e-4 of each
    other, so no end point could tell them apart there.
    """

    center: tuple[float, float] = (1.6, 0.6)
    radius: float = 1.0
    w0: tuple[float, float] = (0.2, 1.6)
    factor_skew: tuple[float, float] = (1.5, 0.8)
    lam_main: float = 0.1
    eps_main: float = 0.01
    eps_sweep: tuple[float, ...] = (0.1, 0.03, 0.01, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5, 1e-6, 1e-8)
    wd_sweep: tuple[float, ...] = (0.1, 0.2, 0.5, 1.0)
    schedules: tuple[tuple[float, int, int], ...] = ((1e-2, 20000, 10), (1e-3, 100000, 50))
    betas: tuple[float, float] = (0.9, 0.999)
    traj_eps: tuple[float, ...] = (0.1, 0.01)
    disc: tuple[float, float] = (0.03, 3.0)

    @classmethod
    def quick(cls) -> Fig5Params:
        """Five ε, three λ_wd (a subset of the full sweep), one learning rate (seconds)."""
        return cls(eps_sweep=(0.1, 0.01, 1e-3, 1e-4, 1e-8), wd_sweep=(0.1, 0.5, 1.0), schedules=((1e-2, 20000, 10),))

    @classmethod
    def full(cls) -> Fig5Params:
        """Ten ε, four λ_wd, two learning rates."""
        return cls()
