"""The random baseline against a Monte Carlo of the test's own: full Gaussian factors drawn here
(another generator, another seed), scaled to given Frobenius norms, the d × d product formed and
its singular values taken by numpy's dense SVD; the rank measures written out here again."""

import numpy as np
import pytest

from headrank.core.baseline import BASELINE_COLUMNS, random_ranks


def _dense_monte_carlo(rows_a, rows_b, k, tol, n, norms=(3.0, 0.5)):
    rng = np.random.Generator(np.random.PCG64(12345))
    out = {"effective_rank_random": [], "stable_rank_random": [], "rank_random": []}
    for _ in range(n):
        a, b = rng.normal(size=(rows_a, k)), rng.normal(size=(rows_b, k))
        a *= norms[0] / np.linalg.norm(a)  # the head's Frobenius norms: they must not matter
        b *= norms[1] / np.linalg.norm(b)
        s = np.linalg.svd(a @ b.T, compute_uv=False)
        p = s / s.sum()
        p = p[p > 0]
        out["effective_rank_random"].append(np.exp(-(p * np.log(p)).sum()))
        out["stable_rank_random"].append((s ** 2).sum() / s[0] ** 2)
        out["rank_random"].append(float((s > tol * s[0]).sum()))
    return {c: (np.mean(v), np.std(v, ddof=1) / np.sqrt(n)) for c, v in out.items()}


@pytest.mark.parametrize("shape,tol", [((48, 48, 8), 1e-3),     # tall factors, as most heads
                                       ((12, 20, 8), 1e-3),     # MLA-like: different latent widths
                                       ((8, 8, 8), 0.05),       # square factors: ill-conditioned, τ bites
                                       ((5, 30, 8), 1e-3)])     # fewer rows than k: rank ≤ 5
def test_baseline_matches_an_independent_monte_carlo(shape, tol):
    ref = _dense_monte_carlo(*shape, tol, n=3000)
    got = random_ranks(*shape, tol)
    assert set(got) == set(BASELINE_COLUMNS)
    for col, (mean, se) in got.items():
        ref_mean, ref_se = ref[col]
        assert abs(mean - ref_mean) <= 5 * np.hypot(se, ref_se) + 1e-12, (col, mean, ref_mean, se, ref_se)
    if shape == (5, 30, 8):
        assert got["rank_random"][0] == 5.0
    if shape == (8, 8, 8):  # square Gaussian factors: the smallest σ falls below τ = 0.05 in some draws
        assert got["rank_random"][0] < 8


def test_baseline_is_seeded_and_cached():
    a = random_ranks(40, 40, 6, 1e-3)
    random_ranks.cache_clear()
    assert random_ranks(40, 40, 6, 1e-3) == a
    assert random_ranks(40, 40, 6, 1e-3) is random_ranks(40, 40, 6, 1e-3)
    with pytest.raises(ValueError, match="rows_a"):
        random_ranks(0, 4, 4)
