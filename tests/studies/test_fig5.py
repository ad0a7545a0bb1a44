"""Figure 5: the geometry's closed forms, the optimisers against torch, the claims on synthetic data."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize

from attnrank.studies.fig5 import adam, geometry
from attnrank.studies.fig5.claims import pass_threshold
from attnrank.studies.fig5.experiment import circle, fig5_runs
from attnrank.studies.fig5.params import Fig5Params

# --------------------------------------------------------------------------- Figure 5: geometry


P = Fig5Params()
S = circle(P)


def test_min_points_on_circle_by_dense_sampling():
    th = np.linspace(0, 2 * np.pi, 2_000_001)
    pts = S.c + S.radius * np.stack([np.cos(th), np.sin(th)], axis=1)
    np.testing.assert_allclose(S.min_l2_point(), pts[np.argmin((pts**2).sum(1))], atol=1e-5)
    np.testing.assert_allclose(S.min_l1_point(), pts[np.argmin(np.abs(pts).sum(1))], atol=1e-5)
    np.testing.assert_allclose(S.min_l1_point(), [0.8, 0.0], atol=1e-12)  # sparse
    assert np.linalg.norm(S.min_l2_point() - S.min_l1_point()) > 0.1


@pytest.mark.parametrize("lam", [1e-3, 0.05, 0.5, 2.0])
def test_l2_optimum_closed_form_matches_scipy(lam):
    np.testing.assert_allclose(geometry.l2_regularised_optimum(S, lam), geometry.l2_regularised_optimum_numeric(S, lam),
                               atol=1e-7)


@pytest.mark.parametrize("lam", [1e-3, 0.05, 0.3])
def test_l1_optimum_is_the_axis_point_by_1d_closed_form(lam):
    w = geometry.l1_regularised_optimum(S, lam)
    assert w[1] == 0.0  # exactly sparse
    # along w2 = 0: minimise (sqrt((w1-c1)^2 + c2^2) - r)^2 + lam w1 by its derivative (brentq)
    c1, c2, r = S.c[0], S.c[1], S.radius

    def deriv(w1):
        rho = math.hypot(w1 - c1, c2)
        return 2 * (rho - r) * (w1 - c1) / rho + lam

    w1 = optimize.brentq(deriv, 0.5, 0.8 + 1e-9)
    assert w[0] == pytest.approx(w1, abs=1e-7)
    # and the sparse point satisfies the L1 subgradient condition |dL/dw2| <= lam
    assert abs(S.grad(np.array([w1, 0.0]))[1]) <= lam


# --------------------------------------------------------------------------- Figure 5: optimisers


@pytest.mark.parametrize("factorized", [False, True])
@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_batch_matches_torch_optim(factorized, decoupled):
    lr, eps, lam, steps = 0.01, 1e-3, 0.2, 300
    w0 = np.array(P.w0)
    x0 = np.concatenate([np.sqrt(w0) * 1.3, np.sqrt(w0) / 1.3]) if factorized else w0
    grad = adam.factorized_grad(S) if factorized else adam.direct_grad(S)
    kw = {"wd": lam} if decoupled else {"l2": lam}
    x_np, rec = adam.adam_batch(grad, x0[None, :], lr=lr, eps=eps, steps=steps, record_every=100, **kw)

    p = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)([p], lr=lr, eps=eps, weight_decay=lam)
    c = torch.tensor(S.center, dtype=torch.float64)
    for _ in range(steps):
        opt.zero_grad()
        w = p[:2] * p[2:] if factorized else p
        loss = (torch.linalg.vector_norm(w - c) - S.radius) ** 2
        loss.backward()
        opt.step()
    np.testing.assert_allclose(x_np[0], p.detach().numpy(), rtol=1e-11, atol=1e-13)
    assert rec.shape == (steps // 100 + 1, 1, x0.size)


def _run(factorized, opt, eps, lam_wd, lr=0.01, steps=20000):
    cfg = [{"eps": eps, "lam_wd": lam_wd, "opt": opt}]
    return fig5_runs(P, lr, steps, cfg, factorized, 100)["w_final"][0]


def test_direct_adam_l2_reaches_l2_optimum():
    w = _run(False, "adam_l2", 0.01, 0.1)
    np.testing.assert_allclose(w, geometry.l2_regularised_optimum(S, 0.1 * 0.01), atol=1e-6)


def test_factorized_adam_l2_reaches_sparse_l1_optimum():
    w = _run(True, "adam_l2", 0.01, 0.1)
    target = geometry.l1_regularised_optimum(S, 0.1 * 0.01)
    assert np.linalg.norm(w - target) < 1e-3
    assert abs(w[1]) < 1e-3 and target[1] == 0.0


def test_adamw_end_point_is_the_derived_fixed_point_not_exactly_the_conjecture():
    """AdamW's fixed point carries the factor 1/(1 − λ|w|); at λ_wd = 0.5 it is visibly off the conjecture."""
    lam_wd, eps = 0.5, 0.01
    w = _run(False, "adamw", eps, lam_wd)
    fp = geometry.adamw_fixed_point(S, lam_wd, eps, factorized=False)
    assert np.linalg.norm(w - fp) < 1e-4
    assert np.linalg.norm(w - geometry.l2_regularised_optimum(S, lam_wd * eps)) > 0.01
    # and the fixed point satisfies its defining equation
    g = S.grad(fp)
    np.testing.assert_allclose(g, -eps * lam_wd * fp / (1 - lam_wd * np.abs(fp)), atol=1e-8)


def test_pass_threshold():
    assert pass_threshold([(10, True), (1, True), (0.1, False), (0.01, False)]) == 1
    assert pass_threshold([(10, False), (1, True)]) == math.inf


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_run_and_replot_give_the_same_claims(tmp_path):
    import json

    from attnrank.report import runner

    runner.run("fig5", tmp_path, quick=True)
    before = json.loads((tmp_path / "claims.json").read_text())
    runner.run("fig5", tmp_path, replot=True)
    assert json.loads((tmp_path / "claims.json").read_text()) == before
    assert all(c["verdict"] in ("held", "not held", "inconclusive") for c in before)
