"""fig2: each claim on small synthetic data (holds one way, fails or goes inconclusive the
other), the tie-aware trend test, and a short real run."""

import json

import numpy as np
import pytest

from headrank.studies.fig2 import claims as C
from headrank.studies.fig2.params import Fig2Params

P = Fig2Params(lambdas=(0.0, 1.0, 3.0), steps=100, seeds=(0, 1))
N = 5


def lin(a, b):
    return [a + (b - a) * i / (N - 1) for i in range(N)]


def series(eff, brel1, gap1, cross=N - 1):
    """``balance`` (the absolute imbalance) stays at 1 until tracked index ``cross``, then sits at
    ``brel1``: its time to e^-2 is step 25 * cross when brel1 <= e^-2."""
    return {"step": [25 * i for i in range(N)], "rank": [16.0] * N, "effective_rank": lin(14, eff),
            "balance": [1.0] * cross + [brel1] * (N - cross), "balance_rel": lin(0.2, brel1), "gap": lin(0.06, gap1),
            "gap_rel": lin(0.06, gap1), "nuclear": [1.0] * N, "frob_bound": [1.0] * N}


def make_data(eff, brel, gap, acc, exposure=(0.0, 6.0, 18.0), sigma_min=0.2):
    """Per λ (0, 1, 3) and seed (0, 1): final effective rank, balance_rel, gap_rel, accuracy;
    seed 1 is seed 0 plus a small offset."""
    lams = [0.0, 1.0, 3.0]
    data = {"lambdas": lams, "seeds": [0, 1], "ov": {}, "qk": {}, "training": {}, "sv": {"ov": {}, "qk": {}},
            "exposure": {}, "config": {"model": {"head_dim": 4}, "steps": 100, "lr": 3e-3, "warmup": 10}}
    for i, lam in enumerate(lams):
        k = f"{lam:g}"
        data["exposure"][k] = {"attn": exposure[i], "other": 0.1, "lr_sum": 1.0}
        for s, d in (("0", 0.0), ("1", 0.01)):
            sv = [[1.0, 0.5, 0.1 / (1 + i), sigma_min / (1 + 10 * i)]] * 2
            x = series(eff[i] + d, brel[i] + d / 10, gap[i], cross=(N - 1, 3, 1)[i])
            for prod in ("ov", "qk"):
                data[prod].setdefault(k, {})[s] = {"0": x, "1": x}
                data["sv"][prod].setdefault(k, {})[s] = [sv, sv]
            data["training"].setdefault(k, {})[s] = {"step": list(range(10)), "loss": [0.1] * 10, "acc": [acc[i]] * 10}
    return json.loads(json.dumps(data))


GOOD = make_data(eff=[14, 8, 3], brel=[0.15, 0.01, 0.002], gap=[0.05, 0.005, 0.001], acc=[1, 1, 0.95])
BAD = make_data(eff=[14, 14, 14.5], brel=[0.15, 0.15, 0.2], gap=[0.05, 0.04, 0.02], acc=[1, 0.5, 1])
LOW = make_data(eff=[14, 8, 3], brel=[0.15, 0.01, 0.002], gap=[0.05, 0.005, 0.001], acc=[1, 1, 1],
                exposure=(0.0, 0.5, 1.5))


@pytest.mark.parametrize("fn", [C.rank_falls, C.balance_time_constant, C.gap_vanishes, C.task_learned])
def test_each_claim_holds_on_good_data_and_fails_on_bad(fn):
    good, bad = fn(GOOD, P), fn(BAD, P)
    assert good.verdict == "held", good.reason
    assert bad.verdict == "not held" and (bad.reason or fn is C.task_learned)
    assert good.exposure["needed"] == 5.0 and good.exposure["got"]["3"] == 18.0


@pytest.mark.parametrize("fn", [C.rank_falls, C.balance_time_constant, C.gap_vanishes])
def test_below_the_exposure_a_trend_is_not_judged(fn):
    c = fn(LOW, P)
    assert c.verdict == "inconclusive" and c.reason
    assert c.exposure["judged"] in (["0"], [])


def test_trend_is_tie_aware_and_paired():
    order = ["0", "1", "3"]
    m = C.MARGIN_RANK
    assert C.trend({"0": [16, 16], "1": [16, 16], "3": [9, 9.5]}, order, m)[0] == "held"  # ties then a drop
    assert C.trend({"0": [16, 16], "1": [16, 16], "3": [16, 16]}, order, m)[0] == "not held"  # no drop at all
    assert C.trend({"0": [10, 12], "1": [14, 16.1], "3": [8, 9]}, order, m)[0] == "not held"  # a rise beyond the margin
    assert C.trend({"0": [10, 14], "1": [10, 13], "3": [9, 13]}, order, m)[0] == "held"  # paired: 1 in each seed
    verdict, reason, _ = C.trend({"0": [10, 14], "1": [10, 13], "3": [9, 14]}, order, m)
    assert verdict == "inconclusive" and "margin" in reason  # drops 1 and 0: [-5.9, 6.9] reaches across 0.5
    assert C.trend({"0": [10]}, ["0"], m)[0] == "inconclusive"


def test_noise_floor_and_numerical_ranks_come_from_the_stored_singular_values():
    assert C.noise_floor(GOOD) == pytest.approx(0.2)
    ranks = C.mean_numerical_rank(GOOD, 2 * 0.2)
    assert ranks == {"0": 2.0, "1": 2.0, "3": 2.0}
    assert C.mean_numerical_rank(GOOD, 1e-3) == {"0": 4.0, "1": 4.0, "3": 4.0}
    m = C.rank_falls(GOOD, P).measured
    assert m["tau_above_noise_floor"] == pytest.approx(0.4) and m["numerical_rank_tau_1e-3"]["3"] == 4.0


def _without_control(data):
    """``data`` without its lambda = 0 runs (before: the smallest lambda stood in for the control)."""
    d = json.loads(json.dumps(data))
    d["lambdas"] = [lam for lam in d["lambdas"] if lam != 0]
    for part in (d["ov"], d["qk"], d["training"], d["sv"]["ov"], d["sv"]["qk"], d["exposure"]):
        part.pop("0")
    return d


def test_without_a_lambda_0_control_there_is_no_floor_and_no_rank_verdict():
    import math

    d = _without_control(GOOD)
    assert math.isnan(C.noise_floor(d)) and all(math.isnan(v) for v in C.mean_numerical_rank(d, math.nan).values())
    c = C.rank_falls(d, P)
    assert c.verdict == "inconclusive" and "no lambda = 0 control" in c.reason
    assert math.isnan(c.measured["noise_floor_sigma_min_over_sigma_1_at_lambda_0"])
    assert C.rank_falls(GOOD, P).verdict == "held"  # the same runs with their control are judged


def test_claims_in_order_and_profiles():
    assert [c.name for c in C.claims(GOOD, P)] == ["fig2.rank_falls", "fig2.balance_time_constant",
                                                    "fig2.gap_vanishes", "fig2.balance_relative",
                                                    "fig2.gap_absolute", "fig2.qk_identical", "fig2.early_stages",
                                                    "fig2.balance_lasts", "fig2.sgd_control", "fig2.task_learned"]
    assert C.task_learned(GOOD, P).kind == "check" and C.rank_falls(GOOD, P).quote
    for p in (Fig2Params.quick(), Fig2Params.full()):
        assert isinstance(p.lambdas, tuple) and isinstance(p.seeds, tuple) and 0.0 in p.lambdas
        assert p.schedule == "cosine" and len(p.seeds) >= 2


@pytest.mark.slow
def test_real_runs_are_paired_and_claims_follow_from_them():
    from headrank.studies.fig2.experiment import run
    from headrank.studies.registry import get

    assert get("fig2").study.run.__module__ == "headrank.studies.fig2.experiment"
    p = Fig2Params(lambdas=(0.0, 1.0), steps=60, seeds=(0,), workers=1, horizon_lambdas=(0.0, 1.0), horizon_seeds=(0,),
                   horizon_steps=40, sgd_lambdas=(1.0,), sgd_steps=20)
    data = json.loads(json.dumps(run(p)))
    ov = data["ov"]
    for key in ("0", "1"):
        s = ov[key]["0"]["0"]
        assert s["step"][0] == 0 and s["step"][-1] == 60 and len(s["effective_rank"]) == len(s["step"])
        assert data["qk"][key]["0"]["1"]["rank"]  # QK series and the second layer are there too
        assert len(data["sv"]["ov"][key]["0"][0]) == 4  # layer 1: four heads of final singular values
    assert data["exposure"]["0"]["attn"] == 0 and 0 < data["exposure"]["1"]["attn"] < 1
    # both runs start from the same initialisation (same seed): identical step-0 metrics
    assert ov["0"]["0"]["0"]["balance"][0] == ov["1"]["0"]["0"]["balance"][0]
    claims = {c.name: c for c in C.claims(data, p)}
    assert claims["fig2.rank_falls"].verdict == "inconclusive"  # 60 steps: far below 5 time constants
    assert claims["fig2.rank_falls"].exposure["judged"] == ["0"]
    assert data["horizon"]["ov"]["1"]["0"]["step"][-1] == 40 and data["horizon"]["label_noise"] == 0.1
    assert len(data["sgd_control"]["runs"]["1/0"]["imbalance"]) == 5  # steps 0, 5, ..., 20
    assert claims["fig2.balance_lasts"].verdict == "inconclusive"  # 40 steps: no exposure to judge


def test_time_constant_is_fitted_on_the_preregistered_window_and_compared_with_lambda_lr():
    rates = C.decay_rates(GOOD, P, metric="balance_rel")
    # balance_rel falls linearly from 0.2 to 0.01 over steps 0..100; the fit uses steps <= 50 only
    x = [0.2 + (0.01 - 0.2) * i / 4 for i in range(3)]
    import numpy as np

    slope = -np.polyfit([0, 25, 50], np.log(x), 1)[0]
    assert rates["1"][0] == pytest.approx(slope)
    c = C.balance_time_constant(GOOD, P, metric="balance_rel")
    assert c.measured["rate_over_2_lambda_lr"]["1"] == pytest.approx(np.mean(rates["1"]) / (2 * 1.0 * P.lr))
    # balance_rel falls linearly at lambda 1 and 3 alike: the same time to e^-2 (index 4), equivalent
    # within the one-interval margin, so the time part is not held while the fitted rates differ
    assert c.measured["parts"] == {"rate_rises_with_lambda": "not held", "vanishes": "held"}
    a = C.balance_time_constant(GOOD, P)
    assert a.measured["steps_to_e-2"] == {"0": [None, None], "1": [75, 75], "3": [25, 25]}
    assert a.measured["parts"]["rate_rises_with_lambda"] == "held" and a.tests and a.tests[0]["n"] == 2
    slow = make_data(eff=[14, 8, 3], brel=[0.15, 0.05, 0.04], gap=[0.05, 0.005, 0.001], acc=[1, 1, 1])
    assert C.balance_time_constant(slow, P, metric="balance_rel").verdict == "not held"  # 0.04 / 0.2 > 0.1


def test_qk_identical_compares_the_verdicts_of_both_products():
    c = C.qk_identical(GOOD, P)
    assert c.verdict == "held" and c.quote.startswith("Qualitative findings")
    mixed = json.loads(json.dumps(GOOD))
    mixed["qk"] = BAD["qk"]
    assert C.qk_identical(mixed, P).verdict == "not held"


def test_late_spikes_reads_the_loss_after_it_first_fell_below_the_threshold():
    from headrank.studies.fig2 import late_spikes

    data = {"training": {"0": {"0": {"loss": [2.0, 1e-2, 5e-4, 1e-4, 0.3, 1e-5]}, "1": {"loss": [2.0, 1e-4, 2e-4]}},
                         "1": {"0": {"loss": [2.0, 0.5, 0.1]}}}}
    out = late_spikes(data)
    assert out["0"] == pytest.approx(0.3)  # the spike after the loss fell below 1e-3 (worst seed)
    assert out["1"] == 0.0  # never fell below: nothing to report


def _with_gaps(data, gaps, lr=0.1):
    """``data`` with layer-1 OV gap/bound curves per lambda key (seed 1 a little above seed 0) and a
    learning rate under which lambda = 1 reaches exposure 1 by step 25 (sum of lr over 100 steps ~ 9.5)."""
    d = json.loads(json.dumps(data))
    d["config"]["lr"] = lr
    for k, curve in gaps.items():
        for s, off in (("0", 1.0), ("1", 1.05)):
            d["ov"][k][s]["0"] = {**d["ov"][k][s]["0"], "gap_rel": [v * off for v in curve]}
    return d


def _exposure_at(data, lam, step):
    from headrank.training.config import lr_sums, recall_config

    c = data["config"]
    return lam * float(lr_sums(recall_config(steps=c["steps"], lr=c["lr"], warmup=c["warmup"], schedule="constant"))[step])


def test_early_stages_is_judged_at_a_fixed_exposure_both_ways():
    control = [0.06, 0.058, 0.056, 0.055, 0.054]
    early = _with_gaps(GOOD, {"0": control, "1": [0.06, 0.02, 0.01, 0.008, 0.005], "3": [0.06, 0.01, 0.004, 0.002, 0.001]})
    c = C.early_stages(early, P)
    row = c.measured["per_lambda_seed"]["1"][0]
    # the first tracked step (0, 25, 50, ...) at which lambda x sum(lr) >= 1, computed here from the schedule
    want = next(t for t in (0, 25, 50, 75, 100) if _exposure_at(early, 1.0, t) >= 1.0)
    assert row["step"] == want == 25 and row["exposure"] == pytest.approx(_exposure_at(early, 1.0, 25))
    assert row["gap_over_initial"] == pytest.approx(0.02 / 0.06) and row["control_gap"] == pytest.approx(0.058)
    assert c.verdict == "held", c.reason
    late = _with_gaps(GOOD, {"0": control, "1": [0.06, 0.05, 0.01, 0.008, 0.005], "3": [0.06, 0.01, 0.004, 0.002, 0.001]})
    c = C.early_stages(late, P)  # lambda 1 is still at 0.05/0.06 of its start at exposure 1: late
    assert c.verdict == "not held" and "1: gap share" in c.reason
    assert c.measured["parts"]["3: gap share"] == "held"


def test_early_stages_needs_the_control_and_the_exposure():
    slow = _with_gaps(GOOD, {"0": [0.06] * 5, "1": [0.06, 0.02, 0.01, 0.008, 0.005], "3": [0.06, 0.01, 0.004, 0.002, 0.001]},
                      lr=3e-3)  # sum(lr) ~ 0.28: exposure 1 is never reached at lambda 1
    c = C.early_stages(slow, P)
    assert c.verdict == "inconclusive" and c.measured["per_lambda_seed"]["1"][0]["step"] is None
    gaps = {"0": [0.06] * 5, "1": [0.06, 0.02, 0.01, 0.008, 0.005], "3": [0.06, 0.01, 0.004, 0.002, 0.001]}
    c = C.early_stages(_without_control(_with_gaps(GOOD, gaps)), P)
    assert c.verdict == "inconclusive"


def test_balance_is_judged_on_the_absolute_imbalance_the_relative_one_supports_it():
    claims = {c.name: c for c in C.claims(GOOD, P)}
    assert claims["fig2.balance_time_constant"].measured["metric"] == "balance"
    rel = claims["fig2.balance_relative"]
    assert rel.supports == "fig2.balance_time_constant" and rel.measured["metric"] == "balance_rel"
    # uniform shrinkage: the absolute imbalance falls to 1/20 and 1/25 of its start, the relative one to 1/4, 1/5
    shrink = make_data(eff=[14, 8, 3], brel=[0.15, 0.05, 0.04], gap=[0.05, 0.005, 0.001], acc=[1, 1, 1])
    a = C.balance_time_constant(shrink, P)
    r = C.balance_time_constant(shrink, P, metric="balance_rel")
    assert a.measured["final_over_initial_per_seed"]["3"][0] == pytest.approx(0.04 / 1.0)
    assert a.measured["parts"]["vanishes"] == "held" and r.measured["parts"]["vanishes"] == "not held"


def _horizon(ends, floors=None, exposure=(0.0, 30.0, 90.0)):
    lams, steps = [0.0, 1.0, 3.0], 100
    h = {"lambdas": lams, "seeds": [0, 1], "steps": steps, "label_noise": 0.1, "ov": {}, "loss": {},
         "exposure_end": {f"{lam:g}": e for lam, e in zip(lams, exposure, strict=True)}}
    for i, lam in enumerate(lams):
        floor = (floors or ends)[i]
        gap = [0.06, 0.03, floor, (floor + ends[i]) / 2, ends[i]]
        h["ov"][f"{lam:g}"] = {s: {"step": [0, 25, 50, 75, 100], "gap_rel": gap, "balance_rel": gap,
                                   "effective_rank": [14] * 5} for s in ("0", "1")}
    return {"horizon": h}


def test_balance_lasts_reports_a_transient_balance():
    from headrank.studies.fig2 import horizon as H

    assert H.balance_lasts(_horizon([0.05, 0.004, 0.003]), P).verdict == "held"
    c = H.balance_lasts(_horizon([0.05, 0.04, 0.05], floors=[0.05, 0.005, 0.004]), P)
    assert c.verdict == "not held" and "transient" in c.reason and c.supports == "fig2.gap_vanishes"
    assert c.measured["per_lambda_seed"]["3"]["0"]["rebound"] == pytest.approx(0.046)
    low = H.balance_lasts(_horizon([0.05, 0.004, 0.003], exposure=(0.0, 1.0, 3.0)), P)
    assert low.verdict == "inconclusive"
    lost = _horizon([0.05, 0.004, 0.003])  # a judged lambda whose gap was never measured (NaN rows)
    lost["horizon"]["ov"]["3"]["1"]["gap_rel"] = [None] * 5
    c = H.balance_lasts(lost, P)
    assert c.verdict == "inconclusive" and "not measured" in c.reason


def test_horizon_exposure_follows_the_runs_lr_schedule_not_a_straight_line():
    from headrank.studies.fig2 import horizon as H

    lr, warmup, steps = 0.3, 10, 100
    lr_sum = lr * (warmup + 1) / 2 + lr * (steps - warmup)  # 1.65 in the warmup, then 27
    d = _horizon([0.05, 0.004, 0.003], exposure=(0.0, lr_sum, 3 * lr_sum))
    d["config"] = {"lr": lr, "warmup": warmup, "steps": 2000, "schedule": "cosine"}  # the main runs' config
    c = H.balance_lasts(d, P)
    f = c.measured["per_lambda_seed"]["3"]["0"]  # floor at step 50: 3 x (1.65 + 40 x 0.3), not 50/100 x 85.95
    assert f["floor_step"] == 50 and f["floor_exposure"] == pytest.approx(3 * (lr * 5.5 + 40 * lr))
    assert f["floor_exposure"] != pytest.approx(50 / steps * 3 * lr_sum)
    assert c.measured["lr_schedule"]["warmup"] == 10 and c.measured["lr_schedule"]["exposure_end_relative_mismatch"] < 1e-12
    d["horizon"]["exposure_end"]["3"] *= 1.5  # a stored exposure the derived schedule cannot give: not guessed
    c = H.balance_lasts(d, P)
    assert np.isnan(c.measured["per_lambda_seed"]["3"]["0"]["floor_exposure"]) and "disagree" in c.detail


def test_sgd_control_against_the_gradient_flow_rate():
    import math

    from headrank.studies.fig2 import horizon as H

    def data(rate_factor):
        runs = {}
        for lam in (1.0, 3.0):
            r = 2 * math.log(1 - 0.01 * lam) * rate_factor
            runs[f"{lam:g}/0"] = {"step": list(range(0, 150, 5)), "imbalance": [math.exp(r * t) for t in range(0, 150, 5)],
                                  "loss_first": 2.1, "loss_last": 2.0}
        return {"sgd_control": {"lr": 0.01, "lambdas": [1.0, 3.0], "runs": runs}}

    c = H.sgd_decays_at_theory_rate(data(1.0), P)
    assert c.verdict == "held" and c.kind == "check"
    assert H.sgd_decays_at_theory_rate(data(0.8), P).verdict == "not held"
    assert H.sgd_decays_at_theory_rate({}, P).verdict == "inconclusive"
    assert "0.05 to 0.01" in c.rule and "not reported" in c.rule  # the changed eta is on the record
