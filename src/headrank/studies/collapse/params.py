"""Settings of the rank-collapse reproduction (batch sizes, init scales, thresholds: our choices)."""

from __future__ import annotations

from dataclasses import dataclass

from headrank.analysis.collapse import FLOOR


@dataclass(frozen=True)
class CollapseParams:
    """Everything that shapes the collapse result; ``quick()`` and ``full()`` profiles.

    Surgery on ``model`` (``n_seqs`` corpus sentences of at most ``max_tokens`` tokens, float64,
    ``path_samples`` head paths per length and sentence); a depth sweep of pure self-attention
    networks (the project's Transformer, no skip / MLP / norm, ``sweep_depth`` layers, d =
    ``sweep_d_model``, ``sweep_heads`` heads, random init N(0, std²) for each of
    ``sweep_init_stds``, ``sweep_seeds`` × ``sweep_seqs`` byte sequences of ``sweep_length``);
    the project's model restricted to paths (``restricted_layers`` layers, skips, no MLP, norm
    placements ``restricted_norms``, init scales ``restricted_stds``, same seeds and sequences).
    ``ratio_collapse`` / ``ratio_prevent``: last/first residual thresholds for "collapsed" /
    "not collapsed"; ``short_share``: the share of the output norm that paths of length
    ≤ L/2 must carry for "ensembles of shallow networks"; ``floor``: residuals below it are
    float64 rounding noise. ``lipschitz_min_points`` / ``lipschitz_alpha``: the MLP-Lipschitz
    claim needs at least that many (layer, init) points above the floor (with fewer, a one-sided
    Spearman test at 0.05 needs a perfect ordering) and a one-sided p below alpha.
    ``dose_*``: the MLP dose-response that judges ``collapse.mlp_lipschitz`` (fixed with that rule,
    before its first run): attention + MLP networks (no skip, no norm) at init scales
    ``dose_init_stds`` with every MLP output projection multiplied by each of ``dose_scales``
    (the MLP's Lipschitz constant by the same factor), the residual read at ``dose_depths``; a
    (init, depth) cell is judged with ``lipschitz_min_points`` scales above the floor, by the
    one-sided Spearman test at ``lipschitz_alpha``.
    ``bound_log10_gamma``: log10 of the γ of the stated bound; None, because no text we could read
    defines it (the bound claim then reports the γ at which the inequality turns).
    ``dexp_r2``, ``dexp_min_points``: ``collapse.doubly_exponential`` holds on a curve when the
    fit ``a + b·3^L`` over at least that many depths of its window reaches that R² and beats
    ``a + b·L`` (the window: docs/METHODS.md §4, item 15).
    ``heads_*``: the head-count sweep that judges ``collapse.heads_modulate`` (fixed before its
    first run): the depth sweep's networks with ``heads_sweep`` heads at width ``sweep_d_model``
    (d_qk = d / H), init scales ``heads_init_stds``, networks ``heads_seeds``; a layer l enters a
    network's rate ``log10 r_{l+1} − 3 log10 r_l`` (absolute residuals) when X_l's relative
    residual is at most ``heads_regime`` (the cubic regime); "modulated" when the rates of the
    most and of the fewest heads differ by at least ``heads_margin`` decades beyond the seed
    spread, "not modulated" when by less than that with the spread.
    ``short_*``, ``weak_corr``, ``recall_*``: ``collapse.short_paths`` (docs/METHODS.md §4, item
    16): on trained networks (the recall model, ``recall_steps`` steps of the project's trainer
    per seed in ``recall_seeds``, ``recall_seqs`` task sequences; MiniLM's attention + skip
    variant), paths through at most L/2 heads carry at least ``short_share`` of the output norm
    and the ensemble members (the outputs through each subset of layers) have a norm-weighted
    mean |Pearson correlation| of at most ``weak_corr``; the random-init sweep over
    ``short_init_stds`` supports it.
    """

    model: str = "minilm"
    n_seqs: int = 32
    max_tokens: int = 64
    path_samples: int = 32
    seed: int = 0
    sweep_depth: int = 12
    sweep_init_stds: tuple[float, ...] = (0.02, 0.2, 0.3, 0.5)
    sweep_seeds: tuple[int, ...] = (0, 1, 2)
    sweep_seqs: int = 16
    sweep_length: int = 32
    sweep_d_model: int = 64
    sweep_heads: int = 4
    restricted_layers: int = 6
    restricted_norms: tuple[str, ...] = ("none", "pre")
    restricted_stds: tuple[float, ...] = (0.02, 0.3)
    ratio_collapse: float = 1e-2
    ratio_prevent: float = 0.5
    short_share: float = 0.5
    floor: float = FLOOR
    threads: int = 1
    lipschitz_min_points: int = 5
    lipschitz_alpha: float = 0.05
    bound_log10_gamma: float | None = None
    dose_scales: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    dose_init_stds: tuple[float, ...] = (0.1, 0.2, 0.3)
    dose_depths: tuple[int, ...] = (2, 3, 4, 6)
    dexp_r2: float = 0.95
    dexp_min_points: int = 4
    heads_sweep: tuple[int, ...] = (1, 2, 4, 8)
    heads_init_stds: tuple[float, ...] = (0.02, 0.2, 0.3, 0.5)
    heads_seeds: tuple[int, ...] = tuple(range(8))
    heads_regime: float = 1e-4
    heads_margin: float = 0.1
    short_init_stds: tuple[float, ...] = (0.05, 0.1, 0.125, 0.15, 0.2, 0.3)
    weak_corr: float = 0.3
    recall_steps: int = 400
    recall_seeds: tuple[int, ...] = (0, 1, 2)
    recall_seqs: int = 64

    @classmethod
    def quick(cls) -> CollapseParams:
        """8 sentences of 32 tokens, 8 paths per length, 2 sweep seeds x 8 sequences, 4 networks
        per head count, one trained recall model (under a minute)."""
        return cls(n_seqs=8, max_tokens=32, path_samples=8, sweep_seeds=(0, 1), sweep_seqs=8,
                   heads_seeds=(0, 1, 2, 3), recall_seeds=(0,), recall_seqs=32)

    @classmethod
    def full(cls) -> CollapseParams:
        """32 sentences of 64 tokens, 32 paths per length, 3 sweep seeds x 16 sequences, 8 networks
        per head count, three trained recall models."""
        return cls()
