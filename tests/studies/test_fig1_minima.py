"""fig1.local_minima: the nuclear-norm optimum and the Hessian against independent references, the
rule both ways on synthetic cases, and a small real descent."""

import numpy as np
import pytest

from headrank.studies.fig1 import claims as fig1_claims
from headrank.studies.fig1 import minima


@pytest.mark.parametrize("shape,rank,lam", [((5, 5), 5, 0.3), ((8, 5), 5, 0.5), ((4, 9), 2, 0.2), ((6, 6), 6, 2.5)])
def test_nuclear_optimum_is_the_minimiser(shape, rank, lam):
    """SVD soft-thresholding at lam/2 minimises |W - D|^2 + lam |W|_*: no random perturbation lowers
    the objective, and the subgradient condition 2(D - W*) / lam = U V^T + Z holds (|Z|_2 <= 1,
    U^T Z = 0, Z V = 0), which for this convex problem is sufficient."""
    D = minima.target(*shape, rank, seed=4)
    W = minima.nuclear_optimum(D, lam)
    best = minima.nuclear_objective(W, D, lam)
    rng = np.random.default_rng(0)
    for eps in (1e-2, 1e-4):
        for _ in range(50):
            assert minima.nuclear_objective(W + eps * rng.normal(size=D.shape), D, lam) > best
    G = 2 * (D - W) / lam  # must lie in the subdifferential of |.|_* at W
    u, s, vt = np.linalg.svd(W)
    r = int((s > 1e-12).sum())
    UV = u[:, :r] @ vt[:r]
    assert np.linalg.norm(G - UV, ord=2) <= 1 + 1e-9
    assert np.allclose(u[:, :r].T @ G @ vt[:r].T, np.eye(r), atol=1e-9)


def test_hessian_min_eig_against_finite_differences():
    rng = np.random.default_rng(3)
    D, A, B, lam = rng.normal(size=(4, 3)), rng.normal(size=(4, 2)), rng.normal(size=(3, 2)), 0.4
    m, k = A.shape

    def grad(x):
        a, b = x[: m * k].reshape(m, k), x[m * k:].reshape(-1, k)
        G = 2 * (a @ b.T - D)
        return np.concatenate([(G @ b + lam * a).ravel(), (G.T @ a + lam * b).ravel()])

    x = np.concatenate([A.ravel(), B.ravel()])
    h = 1e-6
    H = np.stack([(grad(x + h * e) - grad(x - h * e)) / (2 * h) for e in np.eye(x.size)])
    assert abs(minima.hessian_min_eig(A, B, D, lam) - np.linalg.eigvalsh((H + H.T) / 2)[0]) < 1e-6


def test_the_origin_is_a_saddle_not_a_minimum():
    """Zero factors are stationary; with lam/2 below the top singular value of D they are a saddle
    (negative curvature), so the rule does not judge them."""
    D = minima.target(5, 5, 5, seed=0)
    A, B = np.zeros((5, 5)), np.zeros((5, 5))
    c = minima._case(A, B, D, 0.5)
    assert c["grad_norm"] == 0.0 and c["hessian_min"] < -0.1
    assert not fig1_claims._is_minimum(c)


def _case(**kw):
    base = {"shape": [5, 5], "k": 5, "rank_target": 5, "seed": 0, "init_std": 0.1, "lam": 0.5, "finite": True,
            "rank_optimum": 3, "nuclear_min": 1.0, "grad_norm": 1e-13, "hessian_min": 1e-12, "dist": 1e-12,
            "dist_literal": 0.2, "optima_apart": 0.2, "objective_gap": 1e-14, "imbalance": 1e-13}
    return {**base, **kw}


def _judge(cases):
    return fig1_claims.local_minima({"minima": {"cases": cases, "eta": 0.05, "steps": 10}})


def test_local_minima_rule_both_ways():
    good = [_case(seed=s) for s in range(10)]
    assert _judge(good).verdict == "held"
    off = _judge(good[:9] + [_case(dist=1e-3)])
    assert off.verdict == "not held" and "off W*" in off.reason
    assert _judge(good[:9] + [_case(objective_gap=1e-4)]).verdict == "not held"
    # an end point that is not a local minimum is not judged, however far from W*
    saddle = _judge(good[:9] + [_case(hessian_min=-0.3, dist=0.5)])
    assert saddle.verdict == "held" and saddle.measured["stationary saddles"] == 1
    few = _judge(good[:8] + [_case(grad_norm=1e-4, dist=0.5), _case(finite=False, grad_norm=float("inf"))])
    assert few.verdict == "inconclusive" and "8 of 10" in few.reason
    assert _judge([]).verdict == "inconclusive"
