"""Parameters of the 'scale' reproduction: every setting that shapes its result."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleParams:
    """The scale experiment: ReLU + LayerNorm MLPs on digits in three residual variants, SGD over
    a λ grid and an η·λ = const group, AdamW over an (η, λ) grid (variant none)."""

    steps: int = 4000
    # λ grid of the SGD runs: every λ > 0 reaches λ·η·steps ≥ 3 (1 − β), three time constants
    lams: tuple[float, ...] = (0.0, 2e-3, 4e-3, 8e-3, 1.6e-2)
    seeds: tuple[int, ...] = (0, 1, 2)
    lr: float = 0.05  # SGD learning rate of the block matrices W
    momentum: float = 0.9
    lr_other: float = 0.05  # head and LayerNorm parameters (SGD), never decayed
    batch: int = 128
    input_noise: float = 1.0  # std of fresh Gaussian noise on every minibatch's standardised pixels
    depth: int = 3
    # (η_W, λ) with η·λ = 4e-4: same init, same batches
    product: tuple[tuple[float, float], ...] = ((0.025, 1.6e-2), (0.05, 8e-3), (0.1, 4e-3))
    adamw_grid: tuple[tuple[float, float], ...] = ((0.01, 0.1), (0.01, 0.3), (0.01, 1.0), (0.01, 3.0),
                                                   (0.003, 0.3), (0.003, 1.0), (0.003, 3.0))
    adamw_lr_other: float = 0.003
    adamw_betas: tuple[float, float] = (0.9, 0.999)
    no_noise_control: bool = True  # also train the "none" grid without input noise (a note)
    shrink: float = 0.1  # the factor every W is scaled by in the shrink checks
    n_test: int = 497
    data_seed: int = 0
    windows: int = 100  # logging windows per run
    evals: int = 80  # full evaluations per run (the tail's 20 average out SGD's fluctuations)
    tail: float = 0.25  # fraction of the run the tail means are taken over
    verdict_inputs: int = 64  # test images the per-tensor scale test runs on
    # "not changed" (scale.optimal_loss_unchanged, scale.free_to_overfit): within this share of the
    # lambda = 0 test loss, an equivalence margin fixed with those rules before their runs
    no_change_margin: float = 0.1

    @classmethod
    def quick(cls) -> ScaleParams:
        """A few minutes' worth on 2 cores (tests, --quick); three seeds, the fewest any SGD
        comparison is judged on."""
        return cls(steps=2000, lams=(0.0, 4e-3, 1.6e-2), seeds=(0, 1, 2), evals=160,
                   adamw_grid=((0.01, 0.3), (0.01, 1.0), (0.01, 3.0)), no_noise_control=False)

    @classmethod
    def full(cls) -> ScaleParams:
        """The full profile."""
        return cls()
