"""A random baseline beside every rank: what a product of random factors of the same shapes gives.

"Effective rank 30.3 of 32" cannot be judged alone. For each head, the baseline is the mean
effective rank, stable rank and numerical rank at τ of ``A Bᵀ`` where ``A`` (rows_a × k) and ``B``
(rows_b × k) have independent standard Gaussian entries, scaled to the head's own Frobenius norms.
Every one of these measures is invariant to the scale of the product, so the norms drop out and the
baseline depends on the shapes alone: it is computed once per shape and cached.

How it is drawn (exact in distribution, not an approximation): with ``A = Q_A R_A`` (QR), the
singular values of ``A Bᵀ`` are those of the k × k core ``R_A R_Bᵀ``, and for a Gaussian factor with
rows ≥ k the triangle ``R`` has Bartlett's distribution: ``R_ii ~ χ_{rows−i+1}`` (i = 1..k), ``R_ij ~
N(0, 1)`` above the diagonal, all independent (the Cholesky factor of a Wishart matrix). So each draw
costs O(k³) whatever d is. A factor with fewer rows than k is drawn whole. The mean over
:data:`DRAWS` seeded draws is the baseline (its Monte Carlo standard error is reported beside it
in :func:`random_ranks`); the seed is derived from the shape, so a shape's baseline is the same in
every run, on every machine, in any order.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from headrank.core.metrics import DEFAULT_TOL, _effective_rank, _numerical_rank, _stable_rank

#: draws per shape (Monte Carlo of the means)
DRAWS = 256
SEED = 20240528
#: the baseline columns of heads.csv: name → (the measure it is the baseline of, definition)
BASELINE_COLUMNS: dict[str, tuple[str, str]] = {
    "effective_rank_random": ("effective_rank", "mean effective rank of A B^T for Gaussian A, B of the head's factor "
                                                "shapes (scale-free: the Frobenius norms drop out)"),
    "stable_rank_random": ("stable_rank", "mean stable rank of the same random product"),
    "rank_random": ("rank", "mean numerical rank #{sigma_i > tol * sigma_1} of the same random product"),
}


def _triangles(rng: np.random.Generator, rows: int, k: int, n: int) -> np.ndarray:
    """``n`` draws of the R factor of a Gaussian (rows × k) matrix, rows ≥ k (Bartlett)."""
    r = np.triu(rng.standard_normal((n, k, k)), 1)
    dof = rows - np.arange(k)  # χ with rows, rows−1, …, rows−k+1 degrees of freedom
    r[:, np.arange(k), np.arange(k)] = np.sqrt(rng.chisquare(dof, size=(n, k)))
    return r


def _cores(rng: np.random.Generator, rows: int, k: int, n: int) -> np.ndarray:
    """``n`` draws of a (m × k) matrix M with ``MᵀM`` distributed as ``GᵀG`` for Gaussian G (rows × k)."""
    if rows >= k:
        return _triangles(rng, rows, k, n)
    return rng.standard_normal((n, rows, k))  # fewer rows than k: the factor itself (rank ≤ rows)


def random_singular_values(rows_a: int, rows_b: int, k: int, draws: int = DRAWS) -> np.ndarray:
    """``(draws, min(k, rows_a, rows_b))`` singular values (descending) of ``A Bᵀ`` for independent
    Gaussian A (rows_a × k) and B (rows_b × k), seeded by the shape."""
    for name, v in (("rows_a", rows_a), ("rows_b", rows_b), ("k", k), ("draws", draws)):
        if not isinstance(v, int | np.integer) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    from headrank.util.threads import torch_threads

    rng = np.random.default_rng(np.random.SeedSequence([SEED, int(rows_a), int(rows_b), int(k)]))
    ca, cb = _cores(rng, int(rows_a), int(k), draws), _cores(rng, int(rows_b), int(k), draws)
    with torch_threads(1):  # many small SVDs: one BLAS thread (several thrash: 19 s instead of 0.7 s at k = 128)
        return np.linalg.svd(ca @ np.swapaxes(cb, 1, 2), compute_uv=False)


@lru_cache(maxsize=64)
def random_ranks(rows_a: int, rows_b: int, k: int, tol: float = DEFAULT_TOL, draws: int = DRAWS
                 ) -> dict[str, tuple[float, float]]:
    """The baseline of one shape: ``{column: (mean, Monte Carlo standard error)}`` for every
    column of :data:`BASELINE_COLUMNS`. Cached per (shape, tol, draws)."""
    sv = random_singular_values(rows_a, rows_b, k, draws)
    values = {"effective_rank": _effective_rank(sv), "stable_rank": _stable_rank(sv),
              "rank": _numerical_rank(sv, tol).astype(np.float64)}
    return {col: (float(values[m].mean()), float(values[m].std(ddof=1) / np.sqrt(draws)) if draws > 1 else 0.0)
            for col, (m, _) in BASELINE_COLUMNS.items()}


def factor_shapes(hw: Any) -> dict[str, tuple[int, int, int]]:
    """``{product: (rows_a, rows_b, k)}`` of one layer's per-head factors (an
    :class:`~headrank.io.layouts.HeadWeights`: ``wq``, ``wk``, ``wv`` (heads, k, rows), ``p``
    (heads, rows, k)): QK is ``W_Kᵀ W_Q``, OV is ``P W_V`` (REFERENCE §1)."""
    return {"qk": (int(hw.wk.shape[-1]), int(hw.wq.shape[-1]), int(hw.wq.shape[-2])),
            "ov": (int(hw.p.shape[-2]), int(hw.wv.shape[-1]), int(hw.p.shape[-1]))}


def baseline_row(hw: Any, product: str, tol: float) -> dict[str, float]:
    """The baseline columns of one layer's heads of ``product`` (one value each: the heads of a
    layer share their shapes)."""
    return {col: mean for col, (mean, _) in random_ranks(*factor_shapes(hw)[product], float(tol)).items()}


def baseline_conventions() -> dict[str, str]:
    """``{column: definition}`` of the baseline columns, and how they are drawn (meta.json's conventions)."""
    return {**{col: d for col, (_, d) in BASELINE_COLUMNS.items()},
            "random_baseline": f"mean over {DRAWS} draws, seeded by the shape (SeedSequence([{SEED}, rows_a, rows_b, k])),"
                               " each drawn exactly through Bartlett's decomposition of the Gaussian factors' R"}


def measured_against_baseline(t: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """A spectra result's ``repr`` under its headline: layers and heads, the convention, and per
    product the mean effective and stable rank against the random baseline's
    (this module) and gap / bound. ``t``: heads.csv's columns; ``meta``: meta.json's dict."""
    cfg = meta.get("config", {})
    conv = meta.get("conventions", {}).get("convention", "raw")
    out = [f"  {len(meta.get('layers', []))} layers x {cfg.get('n_heads', '?')} heads (head dim "
           f"{cfg.get('head_dim', '?')}), {conv} weights, tol {meta.get('tolerance', '?')}"]
    for p in ("qk", "ov"):
        rows = np.asarray(t["product"]) == p
        mean = {k: float(np.nanmean(np.asarray(t[k], dtype=float)[rows])) if k in t and rows.any() else float("nan")
                for k in ("effective_rank", "effective_rank_random", "stable_rank", "stable_rank_random", "gap_rel")}
        out.append(f"  {p}: effective rank {mean['effective_rank']:.2f} (random {mean['effective_rank_random']:.2f}),"
                   f" stable rank {mean['stable_rank']:.2f} (random {mean['stable_rank_random']:.2f}),"
                   f" gap/bound {mean['gap_rel']:.3f}")
    return [*out, f"  .table: {len(t['product'])} rows (layer, head, product); .summary(), .describe(), .plot(), "
                  "res[layer, head, 'qk']"]

