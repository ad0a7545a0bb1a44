"""The one verdict module: t-quantile spreads, paired differences, sign verdicts, the tie-aware
trend, combine; NaN is never a verdict but inconclusive. Checked against scipy's own t test."""

import math

import numpy as np
import pytest
from scipy import stats

from headrank.studies.verdicts import (
    at_least,
    at_most,
    combine,
    combine_reason,
    mean_spread,
    paired,
    side,
    sign_verdict,
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
    assert sign_verdict(d["diff"], d["spread"]) == "inconclusive"  # 2 SE (1.0) would have said held


def test_paired_uses_same_seed_differences():
    a, b = {0: 10.0, 1: 12.0, 2: 14.0}, {0: 9.0, 1: 11.0, 2: 13.0}
    d = paired(a, b)
    # unpaired spread would be ~2.8; paired differences are all exactly 1
    assert d["diff"] == pytest.approx(1.0) and d["spread"] == pytest.approx(0.0) and d["n_seeds"] == 3
    assert math.isnan(paired({0: 1.0}, {0: 0.0})["spread"])


def test_sign_verdict_three_ways():
    assert sign_verdict(1.0, 0.5) == "held"
    assert sign_verdict(0.2, 0.5) == "inconclusive"
    assert sign_verdict(-1.0, 0.5) == "not held"
    assert sign_verdict(0.0, 0.0) == "not held"  # absent effect, no spread
    assert sign_verdict(1.0, float("nan")) == "inconclusive"
    assert combine(["held", "held"]) == "held" and combine(["held", "inconclusive"]) == "inconclusive"
    assert combine(["held", "not held", "inconclusive"]) == "not held" and combine([]) == "inconclusive"


def test_trend_holds_with_ties_at_the_ceiling():
    # the full LM's QK numerical rank 16, 16, 16, 9.7, 3.2: Spearman gives -0.894, the trend test holds
    v = {0.0: {0: 16, 1: 16}, 0.1: {0: 16, 1: 16}, 0.3: {0: 16, 1: 16}, 1.0: {0: 9.5, 1: 9.9}, 3.0: {0: 3.0, 1: 3.4}}
    t = trend(v)
    assert t["verdict"] == "held" and t["end_to_end_drop"] == pytest.approx(12.8)


def test_trend_fails_on_a_rise_and_is_inconclusive_inside_the_spread():
    rise = {0.0: {0: 8, 1: 8.1}, 1.0: {0: 12, 1: 12.2}, 3.0: {0: 4, 1: 4.1}}
    assert trend(rise)["verdict"] == "not held" and "rises" in trend(rise)["reason"]
    flat = {0.0: {0: 16, 1: 16}, 3.0: {0: 16, 1: 16}}
    assert trend(flat)["verdict"] == "not held"
    noisy = {0.0: {0: 10, 1: 12, 2: 9}, 3.0: {0: 11, 1: 9, 2: 9.5}}
    assert trend(noisy)["verdict"] == "inconclusive"
    assert trend({0.0: {0: 10}, 3.0: {0: 5}})["verdict"] == "inconclusive"  # one seed



def test_side_and_thresholds_make_nan_inconclusive():
    assert side(0.001, 0.0005, 0.01, below=True) == "held"
    assert side(0.5, 0.1, 0.01, below=True) == "not held"
    assert side(0.011, 0.005, 0.01, below=True) == "inconclusive"
    assert side(float("nan"), 0.1, 0.01, below=True) == "inconclusive"
    assert at_most(0.5, 1.0) == "held" and at_most(2.0, 1.0) == "not held" and at_most(None, 1.0) == "inconclusive"
    assert at_least(float("nan"), 1.0) == "inconclusive" and at_least(2.0, 1.0) == "held"
    assert combine_reason({"a": "held", "b": "not held"}) == ("not held", "not held for: b")
