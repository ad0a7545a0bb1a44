"""Figure 5: the geometry's closed forms, the optimisers against torch, the claims on synthetic data."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize

from headrank.studies.fig5 import adam, geometry
from headrank.studies.fig5.claims import pass_threshold
from headrank.studies.fig5.experiment import circle, fig5_runs
from headrank.studies.fig5.params import Fig5Params

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

    from headrank.report import runner

    runner.run("fig5", tmp_path, quick=True)
    before = json.loads((tmp_path / "claims.json").read_text())
    runner.run("fig5", tmp_path, replot=True)
    assert json.loads((tmp_path / "claims.json").read_text()) == before
    by = {c["name"]: c for c in before}
    assert by["fig5.adamw_fixed_point"]["verdict"] == "held" and by["fig5.direct_adam_l2_reaches_l2_optimum"]["held"]
    measured_from_data({n: c["measured"] for n, c in by.items()}, json.loads((tmp_path / "data.json").read_text()),
                       Fig5Params.quick())


def measured_from_data(measured, data, p):
    """The numbers a run's claims report, worked out here from its data.json: the L2 optimum in closed
    form, the L1 optimum by a 1-d scipy search on the axis, the end points picked from the runs."""
    c, r, lam = np.asarray(p.center), p.radius, p.lam_main * p.eps_main
    l2 = (np.linalg.norm(c) - r) / (1 + lam / 2) * c / np.linalg.norm(c)  # argmin dist^2(w, S) + lam/2 |w|^2
    np.testing.assert_allclose(data["l2_optimum_main"], l2, atol=1e-9)
    x = optimize.minimize_scalar(lambda x: (math.hypot(x - c[0], c[1]) - r) ** 2 + lam * abs(x), bounds=(0, c[0]),
                                 method="bounded", options={"xatol": 1e-12}).x
    np.testing.assert_allclose(data["l1_optimum_main"], [x, 0.0], atol=1e-6)
    main = {(row["kind"], row["opt"]): np.asarray(row["w_final"]) for row in data["runs"]
            if (row["eps"], row["lam_wd"], row["lr"]) == (p.eps_main, p.lam_main, p.schedules[0][0])}
    for kind, target in (("direct", l2), ("factorized", np.array([x, 0.0]))):
        for opt, other in (("adamw", "adam_l2"), ("adam_l2", "adamw")):
            m = measured[f"fig5.{kind}_{opt}_reaches_{'l2' if kind == 'direct' else 'l1'}_optimum"]
            assert m["end point"] == main[kind, opt].tolist()
            assert m["distance"] == pytest.approx(np.linalg.norm(main[kind, opt] - target), rel=1e-4, abs=1e-9)
            apart = np.linalg.norm(main[kind, opt] - main[kind, other])
            assert m["distance to the other optimiser's end point"] == pytest.approx(apart, rel=1e-12)
    sparse = measured["fig5.factorized_sparse"]
    assert sparse["factorized: max over optimisers of min_i |w_i|"] == max(
        np.abs(main["factorized", o]).min() for o in ("adamw", "adam_l2"))
    assert sparse["direct: min over optimisers of min_i |w_i|"] == min(
        np.abs(main["direct", o]).min() for o in ("adamw", "adam_l2"))
    adamw = [row for row in data["runs"] if row["opt"] == "adamw"]
    conv = [row["dist_fixed_point"] for row in adamw if row["tail_spread"] < 1e-4]
    assert measured["fig5.adamw_fixed_point"] == {"max distance": max(conv), "converged runs": len(conv),
                                                  "not converged": len(adamw) - len(conv)}


# --------------------------------------------------------------------------- claims on synthetic data

from headrank.studies.fig5 import claims as C  # noqa: E402

Q = Fig5Params(eps_sweep=(0.1, 0.01, 1e-3, 1e-4), wd_sweep=(0.1, 0.5, 1.0), schedules=((1e-2, 100, 10),))


def _row(kind, opt, eps, lam_wd, dist, spread=1e-7, fp_dist=1e-7):
    target = [0.8, 0.0] if kind == "factorized" else [0.66, 0.25]
    w = [target[0] + dist, target[1]]
    row = {"kind": kind, "opt": opt, "eps": eps, "lam_wd": lam_wd, "lr": 1e-2, "w_final": w, "target": target,
           "dist_target": dist, "tail_spread": spread}
    if opt == "adamw":
        row |= {"fixed_point": [w[0] + fp_dist, w[1]], "dist_fixed_point": fp_dist}
    return row


def _data(dist=lambda kind, opt, eps, lw: 1e-3, spread=lambda kind, eps, lw: 1e-7, fp=1e-7):
    rows = []
    for kind in ("direct", "factorized"):
        for eps, lw in ([(e, Q.lam_main) for e in Q.eps_sweep] + [(Q.eps_main, lw) for lw in Q.wd_sweep if lw != Q.lam_main]
                        + [(Q.disc[1], Q.disc[0])]):
            for opt in ("adamw", "adam_l2"):
                rows.append(_row(kind, opt, eps, lw, dist(kind, opt, eps, lw), spread(kind, eps, lw), fp))
    return {"runs": rows, "l2_optimum_main": [0.66, 0.25], "l1_optimum_main": [0.8, 0.0]}


def _at_disc(data, factor):
    """``data`` with the direct AdamW end point at ``disc`` moved onto the L2 optimum at factor x lam_wd*eps."""
    from headrank.studies.fig5.experiment import circle
    from headrank.studies.fig5.geometry import l2_regularised_optimum

    for r in data["runs"]:
        if (r["kind"], r["opt"], r["eps"], r["lam_wd"]) == ("direct", "adamw", Q.disc[1], Q.disc[0]):
            r["w_final"] = l2_regularised_optimum(circle(Q), factor * Q.disc[0] * Q.disc[1]).tolist()
    return data


def test_reaches_optimum_both_ways_and_reports_the_other_end_point():
    c = C.reaches_optimum(_data(), Q, "factorized", "adamw")
    assert c.verdict == "held" and c.measured["distance to the other optimiser's end point"] == 0.0  # same point
    assert c.measured["distance"] == 1e-3 and c.measured["end point"] == [0.8 + 1e-3, 0.0]
    far = _data(dist=lambda kind, opt, eps, lw: 0.05 if opt == "adamw" else 0.0)
    c = C.reaches_optimum(far, Q, "factorized", "adamw")
    assert c.verdict == "not held" and c.measured["distance to the other optimiser's end point"] == pytest.approx(0.05)


def test_the_conjecture_is_told_apart_from_half_and_twice_its_strength():
    held = C.reaches_optimum(_at_disc(_data(), 1.0), Q, "direct", "adamw")
    disc = held.measured["discrimination"]
    assert held.verdict == "held" and disc["distance"]["1x"] < 1e-12 and disc["closest_neighbour_apart"] > C.TOL
    for factor in (0.5, 2.0):  # an end point at a neighbour's optimum is not the conjecture's
        assert C.reaches_optimum(_at_disc(_data(), factor), Q, "direct", "adamw").verdict == "not held"


def test_factorized_sparse_both_ways():
    c = C.factorized_sparse(_data(), Q)  # factorized end points (0.801, 0), direct ones (0.661, 0.25)
    assert c.verdict == "held" and c.measured == {"factorized: max over optimisers of min_i |w_i|": 0.0,
                                                  "direct: min over optimisers of min_i |w_i|": 0.25}
    dense = _data()
    for r in dense["runs"]:
        if r["kind"] == "factorized":
            r["w_final"] = [0.7, 0.05]
    c = C.factorized_sparse(dense, Q)
    assert c.verdict == "not held" and c.measured["factorized: max over optimisers of min_i |w_i|"] == 0.05


def test_eps_sweep_judges_converged_runs_only():
    cycle = lambda kind, eps, lw: 5e-3 if eps == 1e-4 else 1e-7  # noqa: E731
    off = lambda kind, opt, eps, lw: 0.3 if eps == 1e-4 else 1e-3  # noqa: E731
    c = C.eps_sweep(_data(dist=off, spread=cycle), Q)
    assert c.verdict == "held"
    assert len(c.measured["not converged"]) == 2 and "tail spread 5.0e-03" in c.detail
    judged = c.measured["converged runs"]  # eps 0.1, 0.01, 0.001 per parametrisation; both optimisers 1e-3 off
    assert sorted(judged) == sorted(f"{k}, lr=0.01, eps={e:g}" for k in ("direct", "factorized") for e in (0.1, 0.01, 1e-3))
    assert all(v["distance"] == 1e-3 and v["AdamW vs Adam+L2"] == 0.0 for v in judged.values())


def test_eps_sweep_fails_on_a_converged_run_off_the_optimum():
    off = lambda kind, opt, eps, lw: 0.3 if eps == 1e-3 else 1e-3  # noqa: E731
    c = C.eps_sweep(_data(dist=off), Q)
    assert c.verdict == "not held" and "eps=0.001" in c.reason


def test_eps_sweep_is_inconclusive_with_too_few_converged_runs():
    cycle = lambda kind, eps, lw: 5e-3 if eps <= 1e-2 else 1e-7  # noqa: E731
    c = C.eps_sweep(_data(spread=cycle), Q)
    assert c.verdict == "inconclusive" and "fewer than" in c.reason


def test_wd_sweep_both_ways():
    assert C.wd_sweep(_data(), Q).verdict == "held"
    off = lambda kind, opt, eps, lw: 0.05 if lw == 0.5 else 1e-3  # noqa: E731
    c = C.wd_sweep(_data(dist=off), Q)
    assert c.verdict == "not held" and "first order in lam_wd*|theta|" in c.reason


def test_wd_sweep_is_inconclusive_with_too_few_converged_runs():
    # two of three lam_wd oscillate in the factorized runs: one converged run cannot stand for the sweep,
    # whether it is on the optimum or off it (the same minimum as the eps sweep)
    cycle = lambda kind, eps, lw: 5e-3 if kind == "factorized" and lw >= 0.5 else 1e-7  # noqa: E731
    for off in (1e-3, 0.05):
        c = C.wd_sweep(_data(dist=lambda kind, opt, eps, lw, off=off: off, spread=cycle), Q)
        assert c.verdict == "inconclusive" and "fewer than 3" in c.reason and "'factorized': 1" in c.reason
    assert "off the conjectured optimum" in c.reason  # the converged misses are still named
    assert C.wd_sweep(_data(spread=lambda kind, eps, lw: 5e-3 if lw == 0.5 else 1e-7), Q).verdict == "inconclusive"


def test_adamw_fixed_point_identity_both_ways():
    c = C.adamw_fixed_point(_data(), Q)
    assert c.verdict == "held" and c.kind == "identity"
    n_adamw = 2 * (len(Q.eps_sweep) + len(Q.wd_sweep) - 1 + 1)  # eps sweep, other lam_wd, the discrimination point
    assert c.measured == {"max distance": 1e-7, "converged runs": n_adamw, "not converged": 0}
    assert C.adamw_fixed_point(_data(fp=1e-3), Q).verdict == "not held"
    never = C.adamw_fixed_point(_data(spread=lambda kind, eps, lw: 1.0), Q)
    assert never.verdict == "not held"  # nothing converged: not verified


def test_optimizers_agree_both_ways():
    """Four judged pairs (direct / factorized at the main point and at disc): the end points' distance to each other."""
    c = C.optimizers_agree(_data(), Q)  # both optimisers 1e-3 off the optimum, on the same side: 0 apart
    assert c.verdict == "held" and len(c.measured["pairs"]) == 4 and c.quote == C.Q_SAME
    assert all(v["apart"] == 0.0 and v["converged"] for v in c.measured["pairs"].values())
    apart = lambda kind, opt, eps, lw: 0.05 if (kind, opt, eps) == ("factorized", "adamw", Q.disc[1]) else 1e-3  # noqa: E731
    c = C.optimizers_agree(_data(dist=apart), Q)
    assert c.verdict == "not held" and "factorized, disc" in c.reason
    assert max(v["apart"] for v in c.measured["pairs"].values()) == pytest.approx(0.049)
    # both optimisers far from the optimum but together: still the same point (this claim asks only that)
    assert C.optimizers_agree(_data(dist=lambda kind, opt, eps, lw: 0.3), Q).verdict == "held"
    unsettled = C.optimizers_agree(_data(spread=lambda kind, eps, lw: 5e-3 if eps == Q.eps_main else 1e-7), Q)
    assert unsettled.verdict == "inconclusive" and "did not converge" in unsettled.reason
    # sweep pairs are reported, never judged
    sweep = lambda kind, opt, eps, lw: 0.2 if (opt, eps) == ("adamw", 1e-4) else 1e-3  # noqa: E731
    c = C.optimizers_agree(_data(dist=sweep), Q)
    assert c.verdict == "held" and max(c.measured["converged sweep pairs (not judged)"].values()) == pytest.approx(0.199)


def test_claims_list_has_no_duplicate_same_point_claims():
    names = [c.name for c in C.claims(_data(), Q)]
    assert not any(n.endswith("same_point") for n in names) and len(names) == len(set(names)) == 9
    kinds = {c.name: (c.kind, c.supports) for c in C.claims(_data(), Q)}
    assert kinds["fig5.direct_adam_l2_reaches_l2_optimum"] == ("check", "")
    assert kinds["fig5.wd_sweep"] == ("finding", "fig5.direct_adamw_reaches_l2_optimum")
