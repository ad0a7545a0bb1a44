"""fig2: each claim on small synthetic data (holds one way, fails or goes inconclusive the
other), the tie-aware trend test, and a short real run."""

import json

import pytest

from attnrank.studies.fig2 import claims as C
from attnrank.studies.fig2.params import Fig2Params

P = Fig2Params(lambdas=(0.0, 1.0, 3.0), steps=100, seeds=(0, 1))
N = 5


def lin(a, b):
    return [a + (b - a) * i / (N - 1) for i in range(N)]


def series(eff, brel1, gap1):
    return {"step": [25 * i for i in range(N)], "rank": [16.0] * N, "effective_rank": lin(14, eff),
            "balance": lin(1.0, brel1), "balance_rel": lin(0.2, brel1), "gap": lin(0.06, gap1),
            "gap_rel": lin(0.06, gap1), "nuclear": [1.0] * N, "frob_bound": [1.0] * N}


def make_data(eff, brel, gap, acc, exposure=(0.0, 6.0, 18.0), sigma_min=0.2):
    """Per λ (0, 1, 3) and seed (0, 1): final effective rank, balance_rel, gap_rel, accuracy;
    seed 1 is seed 0 plus a small offset."""
    lams = [0.0, 1.0, 3.0]
    data = {"lambdas": lams, "seeds": [0, 1], "ov": {}, "qk": {}, "training": {}, "sv": {"ov": {}, "qk": {}},
            "exposure": {}, "config": {"model": {"head_dim": 4}}}
    for i, lam in enumerate(lams):
        k = f"{lam:g}"
        data["exposure"][k] = {"attn": exposure[i], "other": 0.1, "lr_sum": 1.0}
        for s, d in (("0", 0.0), ("1", 0.01)):
            sv = [[1.0, 0.5, 0.1 / (1 + i), sigma_min / (1 + 10 * i)]] * 2
            x = series(eff[i] + d, brel[i] + d / 10, gap[i])
            for prod in ("ov", "qk"):
                data[prod].setdefault(k, {})[s] = {"0": x, "1": x}
                data["sv"][prod].setdefault(k, {})[s] = [sv, sv]
            data["training"].setdefault(k, {})[s] = {"step": list(range(10)), "loss": [0.1] * 10, "acc": [acc[i]] * 10}
    return json.loads(json.dumps(data))


GOOD = make_data(eff=[14, 8, 3], brel=[0.15, 0.05, 0.01], gap=[0.05, 0.005, 0.001], acc=[1, 1, 0.95])
BAD = make_data(eff=[14, 14, 14.5], brel=[0.15, 0.15, 0.2], gap=[0.05, 0.04, 0.02], acc=[1, 0.5, 1])
LOW = make_data(eff=[14, 8, 3], brel=[0.15, 0.05, 0.01], gap=[0.05, 0.005, 0.001], acc=[1, 1, 1],
                exposure=(0.0, 0.5, 1.5))


@pytest.mark.parametrize("fn", [C.rank_falls, C.balance_decays_faster, C.gap_vanishes, C.task_learned])
def test_each_claim_holds_on_good_data_and_fails_on_bad(fn):
    good, bad = fn(GOOD, P), fn(BAD, P)
    assert good.verdict == "held", good.reason
    assert bad.verdict == "not held" and (bad.reason or fn is C.task_learned)
    assert good.exposure["needed"] == 5.0 and good.exposure["got"]["3"] == 18.0


@pytest.mark.parametrize("fn", [C.rank_falls, C.balance_decays_faster, C.gap_vanishes])
def test_below_the_exposure_a_trend_is_not_judged(fn):
    c = fn(LOW, P)
    assert c.verdict == "inconclusive" and c.reason
    assert c.exposure["judged"] in (["0"], [])


def test_trend_is_tie_aware_and_paired():
    order = ["0", "1", "3"]
    assert C.trend({"0": [16, 16], "1": [16, 16], "3": [9, 9.5]}, order)[0] == "held"  # ties then a drop
    assert C.trend({"0": [16, 16], "1": [16, 16], "3": [16, 16]}, order)[0] == "not held"  # no drop at all
    assert C.trend({"0": [10, 12], "1": [14, 14], "3": [8, 9]}, order)[0] == "not held"  # a rise beyond the spread
    verdict, reason, _ = C.trend({"0": [10, 14], "1": [10, 13], "3": [9, 13]}, order)
    assert verdict == "inconclusive" and "spread" in reason  # drop of 1 inside a spread of 4
    assert C.trend({"0": [10]}, ["0"])[0] == "inconclusive"


def test_noise_floor_and_numerical_ranks_come_from_the_stored_singular_values():
    assert C.noise_floor(GOOD) == pytest.approx(0.2)
    ranks = C.numerical_rank(GOOD, 2 * 0.2)
    assert ranks == {"0": 2.0, "1": 2.0, "3": 2.0}
    assert C.numerical_rank(GOOD, 1e-3) == {"0": 4.0, "1": 4.0, "3": 4.0}
    m = C.rank_falls(GOOD, P).measured
    assert m["tau_above_noise_floor"] == pytest.approx(0.4) and m["numerical_rank_tau_1e-3"]["3"] == 4.0


def test_claims_in_order_and_profiles():
    assert [c.name for c in C.claims(GOOD, P)] == ["fig2.rank_falls", "fig2.balance_decays_faster",
                                                    "fig2.gap_vanishes", "fig2.task_learned"]
    for p in (Fig2Params.quick(), Fig2Params.full()):
        assert isinstance(p.lambdas, tuple) and isinstance(p.seeds, tuple) and 0.0 in p.lambdas
        assert p.schedule == "cosine" and len(p.seeds) >= 2


@pytest.mark.slow
def test_real_runs_are_paired_and_claims_follow_from_them():
    from attnrank.studies.fig2.experiment import run
    from attnrank.studies.registry import get

    assert get("fig2").study.run.__module__ == "attnrank.studies.fig2.experiment"
    p = Fig2Params(lambdas=(0.0, 1.0), steps=60, seeds=(0,), workers=1)
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


def test_late_spikes_reads_the_loss_after_it_first_fell_below_the_threshold():
    from attnrank.studies.fig2 import late_spikes

    data = {"training": {"0": {"0": {"loss": [2.0, 1e-2, 5e-4, 1e-4, 0.3, 1e-5]}, "1": {"loss": [2.0, 1e-4, 2e-4]}},
                         "1": {"0": {"loss": [2.0, 0.5, 0.1]}}}}
    out = late_spikes(data)
    assert out["0"] == pytest.approx(0.3)  # the spike after the loss fell below 1e-3 (worst seed)
    assert out["1"] == 0.0  # never fell below: nothing to report
