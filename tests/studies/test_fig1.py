"""Figure 1 + Proposition 3.1: the GD maths against closed forms (identities), the claims on synthetic data."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize

from headrank.core.linalg import product_metrics
from headrank.studies.fig1 import gd

D1 = (0.2, 0.4, 0.6, 0.8, 1.0)

# --------------------------------------------------------------------------- Figure 1: GD recursion


@pytest.mark.parametrize("lam,eta,shape", [(0.0, 0.1, (5, 5)), (0.3, 0.1, (5, 5)), (1.0, 0.05, (6, 3)),
                                           (0.7, 0.2, (4, 4))])
def test_gd_discrepancy_recursion_reference_form_is_exact(lam, eta, shape):
    """REFERENCE.md §2's recursion ('derived here; verify numerically') holds step for step."""
    rng = np.random.default_rng(1)
    d, dh = shape
    D = rng.normal(size=(d, d)) * 0.5  # any loss L(ABᵀ) = ‖ABᵀ − D‖², not just a diagonal D
    A, B = rng.normal(size=(d, dh)), rng.normal(size=(d, dh))
    worst_ref = worst_grad = 0.0
    for _ in range(100):
        pred_ref = gd.discrepancy_next_reference(A, B, D, lam, eta)
        pred_grad = gd.discrepancy_next_gradient_form(A, B, D, lam, eta)
        A, B = gd.gd_step(A, B, D, lam, eta)
        actual = A.T @ A - B.T @ B
        scale = np.linalg.norm(A.T @ A) + np.linalg.norm(B.T @ B)
        worst_ref = max(worst_ref, np.linalg.norm(actual - pred_ref) / scale)
        worst_grad = max(worst_grad, np.linalg.norm(actual - pred_grad) / scale)
        if not np.isfinite(scale) or scale > 1e6:
            break
    assert worst_ref < 1e-13
    assert worst_grad < 1e-13


def test_dropping_the_eta_squared_term_is_measurably_wrong():
    """The η² term matters: (1−ηλ)²Δ alone misses the step by far more than rounding."""
    rng = np.random.default_rng(2)
    D = np.diag(D1)
    A, B = rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    lam, eta = 0.4, 0.1
    delta = A.T @ A - B.T @ B
    A2, B2 = gd.gd_step(A, B, D, lam, eta)
    actual = A2.T @ A2 - B2.T @ B2
    assert np.linalg.norm(actual - (1 - eta * lam) ** 2 * delta) > 1e-3 * np.linalg.norm(actual)


# --------------------------------------------------------------------------- Figure 1: closed forms


@pytest.fixture(scope="module")
def fig1_run():
    lambdas = np.array([0.0, 0.1, 0.3, 0.4, 0.7, 1.1])
    run = gd.run_fig1_gd(lambdas, d=D1, eta=0.1, steps=1000, init_scale=0.5, seed=3)
    return run, gd.run_metrics(run)


def test_soft_threshold_closed_form():
    np.testing.assert_allclose(gd.soft_threshold_sv([0.2, 1.0, 0.6], 0.5), [0.75, 0.35, 0.0])
    # the closed form is the prox of the nuclear norm: check one case against scipy on diagonal M
    d, lam = np.array([0.2, 0.4, 0.6, 0.8, 1.0]), 0.7
    r = optimize.minimize(lambda s: ((s - d) ** 2).sum() + lam * np.abs(s).sum(), np.ones(5), method="Powell",
                          options={"xtol": 1e-12, "ftol": 1e-15})
    np.testing.assert_allclose(np.sort(r.x)[::-1], gd.soft_threshold_sv(d, lam), atol=1e-6)


def test_gd_singular_values_reach_soft_threshold(fig1_run):
    run, met = fig1_run
    d = np.asarray(D1)
    for j, lam in enumerate(run.lambdas):
        cf = gd.soft_threshold_sv(d, lam)
        if np.isclose(lam, 2 * d).any():
            continue  # threshold case: algebraic, tested below
        np.testing.assert_allclose(met["sv"][-1, j], cf, atol=1e-4, err_msg=f"lam={lam}")
    # the factored metrics agree with a dense SVD of the product
    M = run.A[-1] @ np.swapaxes(run.B[-1], -1, -2)
    np.testing.assert_allclose(met["sv"][-1], np.linalg.svd(M, compute_uv=False), atol=1e-12)


def test_balance_decays_at_gd_rate(fig1_run):
    """Near stationarity ‖Δ‖ shrinks by (1 − 2ηλ) per step; checked where ηλ is small."""
    run, met = fig1_run
    for j, lam in enumerate(run.lambdas):
        if lam == 0:
            # no decay: the discrepancy only changes through the eta^2 term and stays O(1)
            assert met["balance"][-1, j] > 0.1 * met["balance"][0, j]
            continue
        if run.eta * lam > 0.07:
            continue  # the eta^2 term still matters there (next test)
        fit = gd.fit_log_slope(met["balance"][:, j], 1e-10, 1e-4)
        assert fit["slope"] == pytest.approx(math.log(1 - 2 * run.eta * lam), rel=0.01)


def test_balance_rate_excess_at_large_eta_lambda_is_a_discretisation_effect():
    """At ηλ = 0.11 the decay can be slower than 1 − 2ηλ; with a 5x smaller step it matches to 1%."""
    lam = np.array([1.1])
    big = gd.balance_fits(lam, d=D1, eta=0.1, steps=1000, init_scale=0.5, seeds=[3])[0][0]["slope"]
    small = gd.balance_fits(lam, d=D1, eta=0.02, steps=5000, init_scale=0.5, seeds=[3])[0][0]["slope"]
    dev_big = abs(big / math.log(1 - 0.2 * 1.1) - 1)
    dev_small = abs(small / math.log(1 - 0.04 * 1.1) - 1)
    assert dev_small < 0.01
    assert dev_small < dev_big


def test_gap_vanishes_for_positive_lambda_only(fig1_run):
    run, met = fig1_run
    gap = met["gap"]
    assert (gap >= -1e-12).all()  # bound >= nuclear up to rounding
    for j, lam in enumerate(run.lambdas):
        if lam > 0:
            assert abs(gap[-1, j]) < 1e-12
        else:
            assert gap[-1, j] > 0.1 * gap[0, j]


def test_threshold_singular_value_vanishes_algebraically(fig1_run):
    run, met = fig1_run
    j = int(np.where(run.lambdas == 0.4)[0][0])  # 2 * 0.2: the threshold for d = 0.2
    s = met["sv"][:, j, -1]
    t = np.arange(500, 1001)
    assert np.polyfit(t, 1 / s[t], 1)[0] == pytest.approx(4 * run.eta, rel=0.01)
    assert s[-1] > 1e-4  # so it is not at the 1e-4 closed form yet: excluded from that check on purpose


def test_fit_log_slope_exact_on_geometric_series():
    y = 3.0 * 0.9 ** np.arange(400)
    fit = gd.fit_log_slope(y, 1e-12, 1e-2)
    assert fit["slope"] == pytest.approx(math.log(0.9), rel=1e-10)
    assert math.isnan(gd.fit_log_slope(np.ones(50), 1e-9, 1e-3)["slope"])


# --------------------------------------------------------------------------- Proposition 3.1


def test_prop31_balanced_pairs_to_float64_precision():
    p = gd.prop31_pairs(per_shape=20, seed=5)
    rel = np.abs(p["bound_bal"] - p["nuclear_bal"]) / p["bound_bal"]
    assert rel.max() < 1e-13
    np.testing.assert_allclose(p["gap_scaled"], p["gap_scaled_closed"], rtol=1e-12, atol=1e-12 * p["bound_scaled"].max())
    assert (p["gap_scaled"] > 0).all() and (p["gap_indep"] > 0).all()


def test_prop31_against_dense_svd():
    rng = np.random.default_rng(7)
    A = rng.normal(size=(12, 4))
    B = gd.random_orthogonal(12, rng) @ A
    np.testing.assert_allclose(B.T @ B, A.T @ A, atol=1e-12)
    nuclear = np.linalg.svd(A @ B.T, compute_uv=False).sum()
    bound = 0.5 * ((A**2).sum() + (B**2).sum())
    assert nuclear == pytest.approx(bound, rel=1e-14)
    m = product_metrics(torch.from_numpy(A), torch.from_numpy(B))
    assert float(m.nuclear) == pytest.approx(bound, rel=1e-13)


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_quick_run_and_replot_give_the_same_claims(tmp_path):
    import json

    from headrank.report import runner

    runner.run("fig1", tmp_path, quick=True)
    before = json.loads((tmp_path / "claims.json").read_text())
    runner.run("fig1", tmp_path, replot=True)
    assert json.loads((tmp_path / "claims.json").read_text()) == before
    assert {c["name"]: c["verdict"] for c in before} == dict.fromkeys(
        ["fig1.gap_decay", "fig1.balance_rate", "fig1.gd_recursion", "fig1.soft_threshold",
         "fig1.threshold_algebraic", "fig1.local_minima", "prop31.balanced_equality", "prop31.unbalanced_gap"],
        "held")
    measured_from_data({c["name"]: c["measured"] for c in before}, json.loads((tmp_path / "data.json").read_text()))


def measured_from_data(measured, data):
    """The numbers a run's claims report, worked out here from its data.json (closed forms written out)."""
    lambdas, d, eta = np.asarray(data["lambdas"]), np.sort(data["d"])[::-1], data["eta"]
    cf = np.maximum(d[None, :] - lambdas[:, None] / 2, 0.0)  # s_i = max(d_i - lam/2, 0)
    np.testing.assert_allclose(data["sv_closed_form"], cf, atol=1e-15)
    at_threshold = np.isclose(lambdas[:, None], 2 * d[None, :], rtol=0, atol=1e-12)  # lam = 2 d_i: algebraic
    err = np.abs(np.asarray(data["sv_final"]) - cf)
    assert at_threshold.sum() == 1 and err[at_threshold].max() > 1e-4  # the slow mode the next claim measures
    assert measured["fig1.soft_threshold"] == pytest.approx(err[~at_threshold].max(), rel=1e-12)
    k = int(np.argmax(at_threshold[list(lambdas).index(data["sv_traj_lambda"])]))
    inv = 1.0 / np.asarray(data["sv_traj"])[:, k]
    half = np.arange(data["steps"] // 2, data["steps"] + 1)
    slope = np.linalg.lstsq(np.stack([half, np.ones_like(half)], 1).astype(float), inv[half], rcond=None)[0][0]
    assert measured["fig1.threshold_algebraic"] == pytest.approx(slope, rel=1e-9)
    assert measured["fig1.threshold_algebraic"] == pytest.approx(4 * eta, rel=0.01)  # 1/s grows by 4 eta a step
    assert measured["fig1.gd_recursion"] == data["recursion_error"]
    p = {key: np.asarray(v, dtype=float) for key, v in data["prop31"].items()}
    bal = np.abs(p["bound_bal"] - p["nuclear_bal"]) / p["bound_bal"]
    assert measured["prop31.balanced_equality"] == pytest.approx(bal.max(), rel=1e-12)
    assert measured["prop31.unbalanced_gap"]["min gap/bound"] == pytest.approx(
        min((p["gap_scaled"] / p["bound_scaled"]).min(), (p["gap_indep"] / p["bound_indep"]).min()), rel=1e-12)
    cases = data["minima"]["cases"]  # every end point a local minimum, at W* to rounding
    judged = [c for c in cases if c["grad_norm"] <= 1e-9 and c["hessian_min"] >= -1e-8]
    assert measured["fig1.local_minima"]["judged (local minima)"] == len(judged) == len(cases) == 72
    assert measured["fig1.local_minima"]["largest |AB^T - W*|_F / |D|_F"] == max(c["dist"] for c in cases) < 1e-12
    gap = np.asarray(data["gap"])
    for lam, row in zip(data["lambdas"], gap, strict=True):
        assert measured["fig1.gap_decay"][f"lam={lam:g}"]["final/initial"] == pytest.approx(row[-1] / row[0], abs=1e-18)


# --------------------------------------------------------------------------- per-mode rates


def test_mode_rates_follow_reference_section_2():
    eta, lam = 0.1, 1.0
    rates = gd.mode_rates(D1, lam, eta)
    assert [r["mode"] for r in rates] == ["thresholded", "thresholded", "active", "active", "active"]
    assert rates[0]["factor"] == pytest.approx((1 - eta * lam) ** 2 - 4 * eta**2 * 0.2**2)
    assert rates[4]["factor"] == pytest.approx(1 - 2 * eta * lam)
    assert gd.mode_rates(D1, 0.4, eta)[0]["mode"] == "threshold"
    slow = gd.predicted_slope(D1, lam, eta)
    assert slow["mode"] == "thresholded" and slow["d"] == 0.2 and slow["slope"] == pytest.approx(math.log(0.8084))
    assert gd.predicted_slope(D1, 0.4, eta)["slope"] is None


def test_thresholded_row_discrepancy_contracts_at_its_own_factor():
    """The row of a thresholded mode: a_i^T a_i - b_i^T b_i shrinks by (1 - eta lam)^2 - 4 eta^2 d_i^2 per step."""
    lam, eta = 1.0, 0.1
    run = gd.run_fig1_gd([lam], d=D1, eta=eta, steps=200, init_scale=0.5, seed=0)
    a, b = run.A[:, 0, 1], run.B[:, 0, 1]  # row of d = 0.4
    c = np.linalg.norm(a[:, :, None] * a[:, None, :] - b[:, :, None] * b[:, None, :], axis=(1, 2))
    slope = np.polyfit(np.arange(120, 161), np.log(c[120:161]), 1)[0]
    assert slope == pytest.approx(math.log((1 - eta * lam) ** 2 - 4 * eta**2 * 0.4**2), rel=1e-3)


def test_per_mode_prediction_matches_the_measured_late_slope_where_one_rate_does_not():
    lams = np.array([0.6, 1.0])
    fits = gd.balance_fits(lams, d=D1, eta=0.1, steps=400, init_scale=0.5, seeds=[1, 4])
    single = max(abs(f[1]["slope"] / math.log(1 - 0.2) - 1) for f in fits)
    assert single > 0.01  # one rate for every mode misses lam = 1 by more than the tolerance
    for row in fits:
        for f in row:
            assert f["slope"] == pytest.approx(f["predicted"]["slope"], rel=3e-3)


# --------------------------------------------------------------------------- claims on synthetic data

from headrank.studies.fig1 import claims as C  # noqa: E402


def _rate_data(measured: float, lam: float = 0.25, predicted: float | None = None) -> dict:
    pred = math.log(1 - 0.2 * lam) if predicted is None else predicted
    fit = {"slope": measured, "t_first": 10, "t_last": 100, "points": 91,
           "predicted": {"slope": pred, "shares": {"active": 1.0}, "setting": "active"}}
    return {"d": list(D1), "eta": 0.1, "rates": {"lambdas": [lam], "seeds": [0], "window": [1e-10, 1e-4],
                                                 "eta": 0.1, "fits": [[fit]]}}


def test_balance_rate_holds_at_prediction_and_fails_off_it():
    good = C.balance_rate(_rate_data(math.log(0.95) * 1.002))
    assert good.verdict == "held" and good.kind == "finding"
    assert good.measured == {"lam=0.25": math.log(0.95) * 1.002}
    assert good.expected["lam=0.25"]["slope"] == pytest.approx(math.log(1 - 0.2 * 0.25))
    assert good.expected["lam=0.25"]["set by"] == "active"
    assert C.balance_rate(_rate_data(math.log(0.95) * 1.03)).verdict == "not held"
    assert C.balance_rate(_rate_data(None)).verdict == "not held"  # no fit: not a pass


def test_balance_rate_excludes_the_exact_threshold_with_its_reason():
    d = _rate_data(-0.08, lam=0.4)
    d["rates"]["fits"][0][0]["predicted"] = {"slope": None, "shares": {}, "setting": "threshold"}
    c = C.balance_rate(d)
    assert c.verdict == "not held" and c.measured == {}  # nothing judged is not a pass
    assert "Not judged: lam=0.4" in c.detail and "algebraically" in c.detail


def _gap_data(decay: float) -> dict:
    t = np.arange(1001)
    return {"lambdas": [0.0, 0.5], "steps": 1000, "gap": [np.full(t.size, 2.0).tolist(), (2.0 * decay**t).tolist()]}


def test_gap_decay_both_ways():
    c = C.gap_decay(_gap_data(0.95))
    assert c.verdict == "held"  # gap 2 * 0.95^t: ratio 0.95^1000, log-slope ln 0.95 per step; flat at lam = 0
    assert c.measured["lam=0.5"]["final/initial"] == pytest.approx(0.95**1000, rel=1e-9)
    assert c.measured["lam=0.5"]["log_slope_per_step"] == pytest.approx(math.log(0.95), rel=1e-9)
    assert c.measured["lam=0"]["final/initial"] == 1.0
    assert C.gap_decay(_gap_data(0.9999)).verdict == "not held"  # lam > 0 but the gap barely moves


def test_gd_recursion_identity_both_ways():
    assert C.gd_recursion({"recursion_error": 3e-16}).verdict == "held"
    assert C.gd_recursion({"recursion_error": 3e-16}).measured == 3e-16
    assert C.gd_recursion({"recursion_error": None}).measured == math.inf
    c = C.gd_recursion({"recursion_error": 1e-6})
    assert c.kind == "identity" and c.verdict == "not held"
    assert C.gd_recursion({"recursion_error": None}).verdict == "not held"


def _sv_data(noise: float) -> dict:
    lambdas, sweep = [0.0, 0.6], [0.0, 0.6, 1.0]
    cf = [gd.soft_threshold_sv(D1, lam).tolist() for lam in lambdas]
    sw = [gd.soft_threshold_sv(D1, lam).tolist() for lam in sweep]
    final = (np.asarray(cf) + noise).tolist()
    return {"lambdas": lambdas, "d": list(D1), "steps": 1000, "sv_closed_form": cf, "sv_final": final,
            "lambda_sweep": sweep, "sv_sweep_final": sw, "sv_sweep_closed_form": sw}


def test_soft_threshold_both_ways():
    for noise, verdict in ((1e-9, "held"), (1e-3, "not held")):  # every s_i off by noise: the largest error
        c = C.soft_threshold(_sv_data(noise))
        assert c.verdict == verdict and c.measured == pytest.approx(noise, rel=1e-6)


def _threshold_data(rate: float) -> dict:
    t = np.arange(1001)
    s = 1.0 / (5.0 + rate * t)
    traj = np.tile(np.array([0.8, 0.6, 0.4, 0.2, 0.0]), (t.size, 1))
    traj[:, 4] = s
    cf = gd.soft_threshold_sv(D1, 0.4).tolist()
    return {"sv_traj_lambda": 0.4, "eta": 0.1, "steps": 1000, "lambdas": [0.4], "d": list(D1),
            "sv_closed_form": [cf], "sv_traj": traj.tolist()}


def test_threshold_algebraic_both_ways():
    c = C.threshold_algebraic(_threshold_data(0.4))
    assert c.verdict == "held" and c.kind == "identity" and c.measured == pytest.approx(0.4)
    assert C.threshold_algebraic(_threshold_data(0.5)).verdict == "not held"


def _pairs(gap: float) -> dict:
    n = 4
    bound = np.full(n, 3.0)
    return {"bound_bal": bound.tolist(), "nuclear_bal": (bound - gap).tolist(), "c": [2.0] * n,
            "gap_scaled": [1.0] * n, "gap_scaled_closed": [1.0 + gap] * n, "bound_scaled": [4.0] * n,
            "gap_indep": [0.5] * n, "bound_indep": [4.0] * n}


def test_prop31_identities_both_ways():
    ok, bad = {"prop31": _pairs(0.0)}, {"prop31": _pairs(1e-6)}
    for fn in (C.prop31_balanced_equality, C.prop31_unbalanced_gap):
        assert fn(ok).verdict == "held" and fn(ok).kind == "identity"
        assert fn(bad).verdict == "not held"
    assert C.prop31_balanced_equality(bad).measured == pytest.approx(1e-6 / 3)  # |bound - nuclear| / bound
    assert C.prop31_unbalanced_gap(bad).measured == pytest.approx(  # min(1, 0.5) / 4; gap off by 1e-6 of 4
        {"min gap/bound": 0.125, "max |gap - closed form|/bound": 1e-6 / 4})
    zero_gap = _pairs(0.0)
    zero_gap["gap_indep"] = [0.0] * 4  # an "unbalanced" pair without a gap
    assert C.prop31_unbalanced_gap({"prop31": zero_gap}).verdict == "not held"
