"""The `reproduce compress` check: its claims on hand-made data (held, not held, inconclusive),
and a tiny end-to-end run whose cut perplexities are re-measured independently."""

from __future__ import annotations

import math

import pytest

from headrank.studies import compress as study
from headrank.studies.registry import get


def _data(cost0: list[float], cost8: list[float], top_exposure: float = 8.0) -> dict:
    runs = []
    for lam, expo, costs in ((0.0, 0.0, cost0), (0.5, top_exposure, cost8)):
        for seed, c in enumerate(costs):
            runs.append({"lam": lam, "seed": seed, "exposure": expo, "ppl_uncut": 10.0,
                         "cut": {"0.5": {"ppl": 10.0 * math.exp(c), "kept": 0.5, "mean_k": {}}}})
    return {"lambdas": [0.0, 0.5], "exposures": [0.0, top_exposure], "budgets": [0.5], "runs": runs}


@pytest.mark.parametrize("cost0, cost8, top, verdict", [
    ([0.30, 0.32, 0.31], [0.10, 0.12, 0.11], 8.0, "held"),
    ([0.10, 0.12, 0.11], [0.30, 0.32, 0.31], 8.0, "not held"),
    ([0.10, 0.30, 0.20], [0.20, 0.10, 0.21], 8.0, "inconclusive"),
    ([0.30, 0.32, 0.31], [0.10, 0.12, 0.11], 1.0, "inconclusive"),  # too little decay exposure
])
def test_claims_both_ways(cost0, cost8, top, verdict):
    params = study.CompressParams.quick()
    c = {x.name: x for x in study.claims(_data(cost0, cost8, top), params)}
    assert c["compress.decay_cheaper"].verdict == verdict
    assert c["compress.decay_cheaper"].kind == "check" and c["compress.decay_cheaper"].rule
    assert c["compress.decay_better_after_cut"].verdict == verdict  # same uncut ppl: both agree
    # the numbers, worked out here: paired per seed, spread t_{0.975, n-1} * sd / sqrt(n)
    from scipy import stats

    d = [a - b for a, b in zip(cost0, cost8, strict=True)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    m = c["compress.decay_cheaper"].measured["0.5"]
    assert m["per_seed"] == pytest.approx(d, abs=1e-12) and m["diff"] == pytest.approx(mean, abs=1e-12)
    assert m["spread"] == pytest.approx(stats.t.ppf(0.975, len(d) - 1) * sd / math.sqrt(len(d)), rel=1e-9)
    assert m["at_exposure_0"] == pytest.approx(sum(cost0) / 3) and m["at_top_exposure"] == pytest.approx(sum(cost8) / 3)
    after = c["compress.decay_better_after_cut"].measured["0.5"]  # ln ppl_cut = ln 10 + cost
    assert after["at_exposure_0"] == pytest.approx(math.log(10) + sum(cost0) / 3)
    assert after["diff"] == pytest.approx(mean, abs=1e-12)
    assert c["compress.decay_cheaper"].exposure == {"needed": study.MIN_EXPOSURE, "got_attn": top}


def test_registered_and_figures_draw():
    entry = get("compress")
    assert entry.study is not None and entry.study.params is study.CompressParams
    figs = study.figures(_data([0.3, 0.32], [0.1, 0.12]), study.CompressParams.quick())
    assert figs and figs[0].name == "compress_cost"


@pytest.mark.slow
def test_tiny_run_end_to_end():
    params = study.CompressParams(exposures=(0.0, 0.3), seeds=(0,), lm_steps=30, budgets=(0.5,), workers=1,
                                  profile="quick")
    data = study.run(params)
    assert len(data["runs"]) == 2
    for r in data["runs"]:
        cut = r["cut"]["0.5"]
        assert 0.4 < cut["kept"] <= 0.5 and cut["ppl"] > 0 and r["ppl_uncut"] > 0
    assert [c.verdict for c in study.claims(data, params)] == ["inconclusive"] * 2  # one seed: no spread
