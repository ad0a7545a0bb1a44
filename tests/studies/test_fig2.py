"""fig2: each claim on small synthetic data (holds one way, fails the other), and a short real run."""

import json

import pytest

from attnrank.studies.fig2 import claims as C
from attnrank.studies.fig2.params import Fig2Params

P = Fig2Params(lambdas=(0.0, 0.1, 1.0), steps=100)


def series(rank, eff, bal0, bal1, gap0, gap1):
    n = 5
    lin = lambda a, b: [a + (b - a) * i / (n - 1) for i in range(n)]  # noqa: E731
    return {"step": [25 * i for i in range(n)], "rank": lin(16, rank), "effective_rank": lin(14, eff),
            "balance": lin(bal0, bal1), "balance_rel": lin(bal0 / 10, bal1 / 10), "gap": lin(gap0, gap1),
            "gap_rel": lin(gap0, gap1), "nuclear": [1.0] * n, "frob_bound": [1.0] * n}


def make_data(ranks, bal_end, gap_end, acc):
    lams = [0.0, 0.1, 1.0]
    data = {"lambdas": lams, "ov": {}, "qk": {}, "training": {}, "config": {"model": {"head_dim": 16}}}
    for lam, r, b, g, a in zip(lams, ranks, bal_end, gap_end, acc, strict=True):
        k = f"{lam:g}"
        s = series(r, r - 1, 1.0, b, 0.06, g)
        data["ov"][k] = {"0": s, "1": s}
        data["qk"][k] = {"0": s, "1": s}
        data["training"][k] = {"step": [10 * i for i in range(10)], "loss": [1.0] * 10, "acc": [a] * 10}
    return json.loads(json.dumps(data))


GOOD = make_data(ranks=[16, 12, 6], bal_end=[0.9, 0.5, 0.01], gap_end=[0.05, 0.005, 0.001], acc=[1, 1, 0.95])
BAD = make_data(ranks=[16, 16, 16], bal_end=[0.5, 0.5, 0.9], gap_end=[0.05, 0.04, 0.02], acc=[1, 0.5, 1])


@pytest.mark.parametrize("fn", [C.rank_falls, C.balance_decays_faster, C.gap_vanishes, C.task_learned])
def test_each_claim_holds_on_good_data_and_fails_on_bad(fn):
    assert fn(GOOD, P).verdict == "held"
    assert fn(BAD, P).verdict == "not held"


def test_claims_in_order():
    assert [c.name for c in C.claims(GOOD, P)] == ["fig2.rank_falls", "fig2.balance_decays_faster",
                                                    "fig2.gap_vanishes", "fig2.task_learned"]


def test_profiles_are_frozen_with_tuples():
    for p in (Fig2Params.quick(), Fig2Params.full()):
        assert isinstance(p.lambdas, tuple) and 0.0 in p.lambdas


@pytest.mark.slow
def test_real_runs_data_and_verdicts_follow_from_the_runs():
    from attnrank.studies.fig2.experiment import run
    from attnrank.studies.registry import get

    assert get("fig2").study.run.__module__ == "attnrank.studies.fig2.experiment"
    p = Fig2Params(lambdas=(0.0, 1.0), steps=60, workers=1)
    data = json.loads(json.dumps(run(p)))
    claims = {c.name: c for c in C.claims(data, p)}
    ov = data["ov"]
    for key in ("0", "1"):
        s = ov[key]["0"]
        assert s["step"][0] == 0 and s["step"][-1] == 60 and len(s["rank"]) == len(s["step"])
        assert data["qk"][key]["1"]["rank"]  # QK series and the second layer are there too
    ratio = {k: ov[k]["0"]["balance"][-1] / ov[k]["0"]["balance"][0] for k in ("0", "1")}
    assert claims["fig2.balance_decays_faster"].measured["final_over_initial"] == pytest.approx(ratio)
    # both runs start from the same initialisation (same seed): identical step-0 metrics
    assert ov["0"]["0"]["balance"][0] == ov["1"]["0"]["balance"][0]
    assert ratio["1"] < ratio["0"]  # after 60 steps decay 1.0 has already balanced more than none
