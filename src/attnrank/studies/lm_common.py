"""Shared by the fig3 and table1 studies (and fig4's own LMs): the CPU-scale LM and ViT
configurations (*our choice*; the paper's Pile LMs and ImageNet ViTs are far beyond this
scale), one sweep call through :func:`attnrank.training.sweep.run_sweep`, the final tracker
measurement of a run, and the seed-spread arithmetic the claims use.

With ``workers > 1`` the sweeps go to spawned processes: a calling script needs the usual
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

OTHER_WD = 0.1
PRODUCTS = ("qk", "ov")
RANK_KINDS = {"effective": "effective_rank", "numerical": "rank"}


def lm_base(steps: int, max_chars: int = 200_000, eval_tokens: int = 16_384) -> dict[str, Any]:
    """Flat overrides of the LM runs: the default LM (4 pre-norm causal layers, width 64, 4 heads
    of 16, MLP 256, byte tokens, context 64, batch 32, AdamW lr 3e-3, β = (0.9, 0.95)), the first
    ``max_chars`` characters of each split of the stdlib corpus, ``eval_tokens`` scored per split."""
    return {"steps": steps, "max_chars": max_chars, "eval_tokens": eval_tokens, "track_every": steps,
            "log_every": max(steps // 10, 10), "checkpoint_every": steps}


def vit_base(steps: int) -> dict[str, Any]:
    """Flat overrides of the ViT runs: the default ViT (4 pre-norm layers, width 64, 4 heads of 16,
    MLP 256, patch 2 on 8×8 digits), AdamW lr 1e-3, batch 64."""
    return {"steps": steps, "track_every": steps, "log_every": max(steps // 10, 10), "checkpoint_every": steps}


def sweep(kind: str, base: dict[str, Any], grid: dict[str, list[Any]], seeds: list[int], root: Path,
          workers: int) -> Any:
    """Run a sweep (1 torch thread per run); raise if any run failed. Returns the SweepResult."""
    from attnrank.errors import AttnRankError
    from attnrank.training.sweep import SweepSpec, run_sweep

    res = run_sweep(SweepSpec(kind=kind, base=base, grid=grid, seeds=list(seeds)), root, workers=workers, threads=1)
    failed = res.runs[res.runs["status"] != "ok"]
    if len(failed):
        raise AttnRankError(f"{len(failed)} {kind} run(s) failed: {failed['error'].iloc[0]}")
    return res


def exposure(kind: str, overrides: dict[str, Any]) -> dict[str, float]:
    """Decay exposure λ·Σlr per group (``attn``, ``other``, ``lr_sum``) of one run's config."""
    from attnrank.training.loop import decay_exposure, make_config

    return decay_exposure(make_config(kind, **overrides))


def final_heads(run_dir: str | Path) -> dict[str, Any]:
    """The per-head metrics of a run's last tracker row (metrics.jsonl)."""
    from attnrank.io.rundir import read_metrics

    rows = [r for r in read_metrics(run_dir) if "heads" in r]
    return rows[-1]["heads"]


def spread(sa: float | None, sb: float | None) -> float:
    """Seed spread of a difference of two means: ``sqrt(s_a² + s_b²)`` (NaN if either is unknown)."""
    if sa is None or sb is None or not (math.isfinite(sa) and math.isfinite(sb)):
        return float("nan")
    return float(math.sqrt(sa ** 2 + sb ** 2))


def rank_rows(heads: dict[str, Any], lam: float, seed: int, layers: list[int] | None) -> list[dict[str, Any]]:
    """Per-head rows (lam, seed, product, layer, head, rank, effective_rank) of one run's final
    tracker measurement, restricted to ``layers`` (None: all)."""
    out = []
    for product in PRODUCTS:
        r = np.asarray(heads[product]["rank"], dtype=float)
        e = np.asarray(heads[product]["effective_rank"], dtype=float)
        for layer in range(r.shape[0]) if layers is None else layers:
            for h in range(r.shape[1]):
                out.append({"lam": float(lam), "seed": int(seed), "product": product, "layer": layer, "head": h,
                            "rank": float(r[layer, h]), "effective_rank": float(e[layer, h])})
    return out


def rank_summary(heads: pd.DataFrame, cols: tuple[str, ...] = ("rank", "effective_rank")) -> pd.DataFrame:
    """Per (product, lam): mean and std over seeds of the per-run mean over the selected heads."""
    per_run = heads.groupby(["product", "lam", "seed"], as_index=False)[list(cols)].mean()
    g = per_run.groupby(["product", "lam"])
    s = g[list(cols)].agg(["mean", "std"])
    s.columns = [f"{a}_{b}" for a, b in s.columns]
    s["n_seeds"] = g.size()
    return s.reset_index()
