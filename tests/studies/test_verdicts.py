"""The one verdict module: t-quantile spreads, paired differences, three-way verdicts against a
declared margin (held / not held by TOST / inconclusive / untested), the tie-aware trend, combine,
Holm; NaN is never a verdict. Checked against scipy's own t test and statsmodels-free Holm by
hand; the rules are tested both ways on planted data: an effect gives held, a null not held,
noise inconclusive."""

import math

import numpy as np
import pytest
from scipy import stats

from headrank.studies.verdicts import (
    at_least,
    at_most,
    combine,
    combine_reason,
    holm,
    judge,
    judge_paired,
    mean_spread,
    paired,
    side,
    sign_verdict,
    statement_p,
    t_quantile,
    trend,
)


def test_t_quantile_is_the_two_sided_95_percent_factor():
    assert t_quantile(2) == pytest.approx(12.706, abs=1e-3)  # not 2
    assert t_quantile(5) == pytest.approx(2.776, abs=1e-3)
    assert math.isnan(t_quantile(1))


def test_spread_matches_scipy_confidence_interval():
    x = np.array([1.0, 2.5, 2.0, 4.0])
    m, sp = mean_spread(x)
    lo, hi = stats.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert m - sp == pytest.approx(lo) and m + sp == pytest.approx(hi)
    assert math.isnan(mean_spread([1.0])[1]) and math.isnan(mean_spread([1.0, float("nan")])[0])


def test_paired_two_seeds_uses_t_not_two_standard_errors():
    d = paired({0: 3.0, 1: 5.0}, {0: 1.0, 1: 2.0})  # differences 2 and 3
    assert d["diff"] == pytest.approx(2.5) and d["spread"] == pytest.approx(12.706 * 0.5, rel=1e-3)
    assert sign_verdict(d["diff"], d["spread"], margin=0.0) == "inconclusive"  # 2 SE (1.0) would have said held


def test_paired_uses_same_seed_differences():
    a, b = {0: 10.0, 1: 12.0, 2: 14.0}, {0: 9.0, 1: 11.0, 2: 13.0}
    d = paired(a, b)
    # unpaired spread would be ~2.8; paired differences are all exactly 1
    assert d["diff"] == pytest.approx(1.0) and d["spread"] == pytest.approx(0.0) and d["n_seeds"] == 3
    assert math.isnan(paired({0: 1.0}, {0: 0.0})["spread"])


def test_sign_verdict_three_ways_against_the_margin():
    assert sign_verdict(1.0, 0.5, margin=0.1) == "held"  # interval [0.5, 1.5] beyond 0.1
    assert sign_verdict(0.5, 0.5, margin=0.1) == "inconclusive"  # [0, 1] reaches across 0.1
    assert sign_verdict(0.0, 0.05, margin=0.1) == "not held"  # [-0.05, 0.05] inside +-0.1: equivalent (TOST)
    assert sign_verdict(-1.0, 0.5, margin=0.1) == "not held"  # beyond the margin the other way
    assert sign_verdict(0.0, 0.0, margin=0.1) == "not held"  # absent effect, no spread
    assert sign_verdict(1.0, float("nan"), margin=0.1) == "inconclusive"
    assert combine(["held", "held"]) == "held" and combine(["held", "inconclusive"]) == "inconclusive"
    assert combine(["held", "not held", "inconclusive"]) == "not held" and combine([]) == "inconclusive"


def test_trend_holds_with_ties_at_the_ceiling():
    # the full LM's QK numerical rank 16, 16, 16, 9.7, 3.2: Spearman gives -0.894, the trend test holds
    v = {0.0: {0: 16, 1: 16}, 0.1: {0: 16, 1: 16}, 0.3: {0: 16, 1: 16}, 1.0: {0: 9.5, 1: 9.9}, 3.0: {0: 3.0, 1: 3.4}}
    t = trend(v, margin=0.5)
    assert t["verdict"] == "held" and t["end_to_end_drop"] == pytest.approx(12.8)


def test_trend_fails_on_a_rise_and_is_inconclusive_inside_the_spread():
    rise = {0.0: {0: 8, 1: 8.1}, 1.0: {0: 12, 1: 12.2}, 3.0: {0: 4, 1: 4.1}}
    assert trend(rise, margin=0.5)["verdict"] == "not held" and "rises" in trend(rise, margin=0.5)["reason"]
    flat = {0.0: {0: 16, 1: 16}, 3.0: {0: 16, 1: 16}}
    assert trend(flat, margin=0.5)["verdict"] == "not held"
    noisy = {0.0: {0: 10, 1: 12, 2: 9}, 3.0: {0: 11, 1: 9, 2: 9.5}}
    assert trend(noisy, margin=0.5)["verdict"] == "inconclusive"
    one = trend({0.0: {0: 10}, 3.0: {0: 5}}, margin=0.5)  # one seed: no interval
    assert one["verdict"] == "inconclusive" and one["test"]["verdict"] == "untested"



def test_side_and_thresholds_make_nan_inconclusive():
    assert side(0.001, 0.0005, 0.01, below=True) == "held"
    assert side(0.5, 0.1, 0.01, below=True) == "not held"
    assert side(0.011, 0.005, 0.01, below=True) == "inconclusive"
    assert side(float("nan"), 0.1, 0.01, below=True) == "inconclusive"
    assert at_most(0.5, 1.0) == "held" and at_most(2.0, 1.0) == "not held" and at_most(None, 1.0) == "inconclusive"
    assert at_least(float("nan"), 1.0) == "inconclusive" and at_least(2.0, 1.0) == "held"
    assert combine_reason({"a": "held", "b": "not held"}) == ("not held", "not held for: b")


# -- the three-way rule on planted data, both ways ---------------------------------------------------

MARGIN = 0.1


def _planted(effect: float, noise: float, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    a = {s: float(x) for s, x in enumerate(rng.normal(0, 1, n))}  # the seeds' shared part cancels
    b = {s: a[s] - effect - float(e) for s, e in enumerate(rng.normal(0, noise, n))}
    return judge_paired(paired(a, b), MARGIN)


def test_planted_effect_beyond_the_margin_is_held():
    j = _planted(effect=1.0, noise=0.1, n=8)
    assert j["verdict"] == "held" and j["lo"] > MARGIN and j["p_held"] < 0.025 and j["n"] == 8


def test_planted_null_is_not_held_by_equivalence():
    j = _planted(effect=0.0, noise=0.05, n=12)
    assert j["verdict"] == "not held" and -MARGIN < j["lo"] and j["hi"] < MARGIN and "TOST" in j["outcome"]
    assert j["p_not_held"] < 0.025


def test_planted_reversal_is_not_held_the_other_way():
    j = _planted(effect=-1.0, noise=0.1, n=8)
    assert j["verdict"] == "not held" and j["hi"] < -MARGIN and "other way" in j["outcome"]


def test_noise_is_inconclusive_and_one_seed_untested():
    j = _planted(effect=0.1, noise=1.0, n=3)
    assert j["verdict"] == "inconclusive" and j["lo"] < MARGIN < j["hi"]
    assert judge(1.0, float("nan"), 1, MARGIN)["verdict"] == "untested"


def test_p_values_agree_with_scipy_one_sided_t_test():
    rng = np.random.default_rng(3)
    d = rng.normal(0.4, 0.3, 6)
    j = judge(*mean_spread(d), 6, MARGIN)
    p = stats.ttest_1samp(d, MARGIN, alternative="greater").pvalue
    assert j["p_held"] == pytest.approx(p) and j["p_not_held"] == pytest.approx(1 - p)


def test_holm_step_down_by_hand():
    # m = 4 at alpha 0.05: 0.01 <= 0.0125 rejected, 0.02 <= 0.0167 fails: stop there
    assert holm({"a": 0.01, "b": 0.02, "c": 0.03, "d": 0.5}, alpha=0.05) == {"a"}
    assert holm({"a": 0.001, "b": 0.01, "c": 0.02}, alpha=0.05) == {"a", "b", "c"}
    assert holm({}, alpha=0.05) == set()


def test_statement_p_intersection_union():
    parts = [{"p_held": 0.01, "p_not_held": 0.99}, {"p_held": 0.2, "p_not_held": 0.8}]
    assert statement_p(parts) == (0.2, 1.0)
    assert statement_p([{"p_held": None, "p_not_held": None}]) is None


def test_equivalence_both_ways():
    from headrank.studies.verdicts import equivalence

    assert equivalence(0.0, 0.05, 10, MARGIN)["verdict"] == "held"  # inside +-0.1
    assert equivalence(0.5, 0.1, 10, MARGIN)["verdict"] == "not held"  # beyond it
    assert equivalence(-0.5, 0.1, 10, MARGIN)["verdict"] == "not held"  # beyond it the other way
    assert equivalence(0.05, 0.2, 10, MARGIN)["verdict"] == "inconclusive"
    assert equivalence(0.0, float("nan"), 1, MARGIN)["verdict"] == "untested"
