"""The metric table against dense float64 references: every row, computed from the formed d × d
product with numpy's SVD (``DENSE``, one entry per row), and the zero / NaN / one-dimensional
semantics of the rank measures."""

import math

import numpy as np
import pytest
import torch

from headrank.core import metrics
from headrank.core.linalg import product_metrics
from headrank.core.metrics import (
    CONSOLE_METRICS,
    METRIC_COLUMNS,
    METRICS,
    SUMMARY_METRICS,
    effective_rank,
    energy_rank,
    numerical_rank,
    rank_measures,
    stable_rank,
)


def _energy_k(s: np.ndarray, fraction: float) -> int:
    total = float((s**2).sum())
    if total == 0:
        return 0
    acc = 0.0
    for k, v in enumerate(s, start=1):
        acc += float(v) ** 2
        if acc >= fraction * total * (1 - 1e-12):
            return k
    return len(s)


def _entropy_rank(s: np.ndarray) -> float:
    if s.sum() == 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return math.exp(-(p * np.log(p)).sum())


def _bound(A, B):
    return 0.5 * ((A**2).sum() + (B**2).sum())


def _ratio(a, b):
    return 0.0 if b == 0 else a / b


#: one dense reference per row of the table: f(M = A Bᵀ, s = svd(M), A, B, tol)
DENSE = {
    "sv_max": lambda M, s, A, B, tol: s[0],
    "nuclear": lambda M, s, A, B, tol: s.sum(),
    "frob": lambda M, s, A, B, tol: np.linalg.norm(M),
    "frob_bound": lambda M, s, A, B, tol: _bound(A, B),
    "gap": lambda M, s, A, B, tol: _bound(A, B) - s.sum(),
    "balance": lambda M, s, A, B, tol: np.linalg.norm(A.T @ A - B.T @ B),
    "balance_rel": lambda M, s, A, B, tol: _ratio(np.linalg.norm(A.T @ A - B.T @ B),
                                                  np.linalg.norm(A.T @ A) + np.linalg.norm(B.T @ B)),
    "rank": lambda M, s, A, B, tol: int((s > tol * s[0]).sum()) if s[0] > 0 else 0,
    "effective_rank": lambda M, s, A, B, tol: _entropy_rank(s),
    "stable_rank": lambda M, s, A, B, tol: (s**2).sum() / s[0] ** 2 if s[0] > 0 else 0.0,
    "k90": lambda M, s, A, B, tol: _energy_k(s, 0.90),
    "k99": lambda M, s, A, B, tol: _energy_k(s, 0.99),
    "k999": lambda M, s, A, B, tol: _energy_k(s, 0.999),
    "gap_rel": lambda M, s, A, B, tol: _ratio(_bound(A, B) - s.sum(), _bound(A, B)),
}
INTEGER = {m.name for m in METRICS if m.integer}


def dense_reference(A: np.ndarray, B: np.ndarray, tol: float) -> dict[str, float | np.ndarray]:
    """Every metric of one product, from the formed matrix A Bᵀ and numpy's SVD."""
    M = A @ B.T
    s = np.linalg.svd(M, compute_uv=False)[: A.shape[1]]
    return {"sv": s, **{k: f(M, s, A, B, tol) for k, f in DENSE.items()}}


def test_every_row_has_a_dense_reference_and_a_definition():
    assert set(DENSE) == set(METRIC_COLUMNS)
    assert len(set(METRIC_COLUMNS)) == len(METRIC_COLUMNS)
    for m in METRICS:
        assert m.definition and m.direction and m.unit in ("dims", "product", "ratio"), m.name
        assert set(m.products) <= {"qk", "ov"}
    assert {"k90", "k99", "gap_rel", "effective_rank"} <= set(SUMMARY_METRICS)
    # the console leads with what moves: effective rank, then k90 (issue 27)
    assert [name for name, _, _ in CONSOLE_METRICS][:2] == ["effective_rank", "k90"]
    assert metrics.conventions(0.01)["rank"].startswith("numerical rank #{sigma_i > 0.01 * sigma_1}")


def _spread_factors(n=6, d=40, dh=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    rate = torch.linspace(0.1, 4.0, n, dtype=torch.float64)[:, None, None]  # energy ranks spread over 1..dh
    decay = 10 ** (-rate * torch.arange(dh, dtype=torch.float64) / dh)
    A = torch.randn(n, d, dh, generator=g, dtype=torch.float64) * decay * 3
    B = torch.randn(n, d, dh, generator=g, dtype=torch.float64)
    return A, B


@pytest.mark.parametrize("tol", [1e-3, 0.05])
def test_every_row_matches_the_dense_product(tol):
    A, B = _spread_factors()
    A[0] = 0.0  # one zero head (zero semantics through the whole pipeline)
    B[0] = 0.0
    m = product_metrics(A, B, tol=tol)
    for i in range(A.shape[0]):
        ref = dense_reference(A[i].numpy(), B[i].numpy(), tol)
        scale = float(ref["frob_bound"]) or 1.0
        for k in METRIC_COLUMNS:
            got, want = float(getattr(m, k)[i]), float(ref[k])
            if k in INTEGER:
                assert got == want, (i, k, got, want)
            elif k == "gap":
                assert abs(got - want) <= 1e-9 * scale, (i, k, got, want)
            else:
                assert got == pytest.approx(want, rel=1e-6, abs=1e-9), (i, k, got, want)
    ks = {int(v) for v in m.k90[1:]}
    assert len(ks) > 1, "the test spectra should give several energy ranks"


def test_zero_nan_and_one_dimensional_semantics():
    sv = torch.tensor([[0.0, 0.0, 0.0], [float("nan"), 1.0, 0.5], [float("inf"), 1.0, 0.0], [3.0, 0.0, 0.0]])
    assert numerical_rank(sv).tolist() == [0, -1, -1, 1]
    assert energy_rank(sv, 0.9).tolist() == [0, -1, -1, 1]
    eff, st = effective_rank(sv), stable_rank(sv)
    assert eff[0] == 0 and st[0] == 0 and eff[3] == 1 and st[3] == 1
    assert eff[1:3].isnan().all() and st[1:3].isnan().all()
    # one item: a 1-D vector of singular values gives 0-d results; numpy input is accepted
    one = np.array([2.0, 2.0, 1e-9, 0.0])
    r = rank_measures(one, tol=1e-3)
    assert r["rank"].ndim == 0 and r["rank"].item() == 2
    assert r["effective_rank"].item() == pytest.approx(_entropy_rank(one), rel=1e-12)
    assert r["stable_rank"].item() == pytest.approx(2.0)
    assert energy_rank(one, 0.99).item() == _energy_k(one, 0.99) == 2
    # no singular value at all is the zero matrix
    empty = torch.zeros(3, 0)
    assert numerical_rank(empty).tolist() == [0, 0, 0] and effective_rank(empty).tolist() == [0.0] * 3
    with pytest.raises(ValueError):
        effective_rank(torch.tensor(1.0))


def test_nonfinite_head_is_nan_in_every_column():
    A, B = _spread_factors(n=3)
    A[1, 0, 0] = float("nan")
    m = product_metrics(A, B)
    for k in METRIC_COLUMNS:
        col = getattr(m, k)
        assert col.dtype == torch.float64 and col[1].isnan() and not col[[0, 2]].isnan().any(), k
    assert m.finite.tolist() == [True, False, True]


@pytest.mark.parametrize("seed", range(3))
def test_rank_measures_match_numpy_on_random_spectra(seed):
    rng = np.random.default_rng(seed)
    s = np.sort(rng.exponential(size=(5, 7)) ** 3, axis=-1)[:, ::-1].copy()
    s[2, 3:] = 0.0
    r = rank_measures(torch.from_numpy(s), tol=1e-2)
    for i in range(5):
        assert r["rank"][i].item() == int((s[i] > 1e-2 * s[i, 0]).sum())
        assert r["effective_rank"][i].item() == pytest.approx(_entropy_rank(s[i]), rel=1e-12)
        assert r["stable_rank"][i].item() == pytest.approx((s[i] ** 2).sum() / s[i, 0] ** 2, rel=1e-12)
        for f in (0.5, 0.9, 0.99, 1.0):
            assert energy_rank(s[i], f).item() == _energy_k(s[i], f)


def test_the_collapse_and_study_measures_are_the_core_ones():
    """The token-representation measures (collapse) and the studies' ranks call core.metrics directly
    (no adapter of their own): same values on random input (to the bit: the core sums as numpy
    does), and the core's zero semantics."""
    from headrank.analysis.collapse import measures as collapse
    from headrank.studies import lm_common

    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 10, 6))
    s = np.linalg.svd(X, compute_uv=False)
    p = s / s.sum(-1, keepdims=True)
    m = collapse.token_measures(X)
    np.testing.assert_array_equal(m["effective_rank"], np.exp(-(p * np.log(p)).sum(-1)))
    np.testing.assert_array_equal(m["stable_rank"], (s * s).sum(-1) / s[..., 0] ** 2)
    run = {"runs": [{"lam": 0.0, "seed": 0, "sv": {"qk": s.tolist()}}]}
    assert lm_common.per_run(run, "qk", "effective")[0.0][0] == float(np.mean(effective_rank(s).numpy()))
    assert lm_common.per_run(run, "qk", "numerical", 0.3)[0.0][0] == float(np.mean(numerical_rank(s, 0.3).numpy()))
    Z = collapse.token_measures(np.zeros((4, 3)))
    assert Z["effective_rank"] == 0 and Z["stable_rank"] == 0  # was NaN (0/0) before core
    zero = {"runs": [{"lam": 0.0, "seed": 0, "sv": {"qk": [[0.0, 0.0, 0.0]]}}]}
    assert lm_common.per_run(zero, "qk", "effective")[0.0][0] == 0  # was 1.0 (exp of an empty entropy)
    nan = {"runs": [{"lam": 0.0, "seed": 0, "sv": {"qk": [[np.nan, 1.0]]}}]}
    assert np.isnan(lm_common.per_run(nan, "qk", "numerical", 0.1)[0.0][0])  # was 0
