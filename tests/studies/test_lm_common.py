"""Shared LM-study helpers: paired comparisons, the tie-aware trend test, ranks from spectra, the noise floor."""

import math

import numpy as np
import pytest

from attnrank.studies.lm_common import (
    combine,
    effective_rank,
    lambdas_for,
    lm_base,
    lr_sum,
    noise_floors,
    numerical_rank,
    paired,
    sign_verdict,
    trend,
)


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


def test_ranks_from_singular_values():
    sv = np.array([[4.0, 2.0, 1e-4, 0.0], [1.0, 1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(numerical_rank(sv, 1e-3), [2, 4])
    np.testing.assert_array_equal(numerical_rank(sv, 0.6), [1, 4])
    assert effective_rank(sv)[1] == pytest.approx(4.0)
    p = np.array([4, 2, 1e-4]) / (6 + 1e-4)
    assert effective_rank(sv)[0] == pytest.approx(np.exp(-(p * np.log(p)).sum()))


def test_lambdas_for_exposure_and_noise_floor_falls_with_decay():
    base = {**lm_base(60), "weight_decay": 0.1}
    s = lr_sum("lm", base)
    assert s == pytest.approx(3e-3 * (60 * 61 / 2) / 100)  # 60 steps, all in the 100-step warmup
    lams = lambdas_for((0.0, 8.0), s)
    assert lams[0] == 0.0 and lams[1] * s == pytest.approx(8.0, rel=1e-3)
    f = noise_floors("lm", base, lams)
    assert f[0] > f[1] > 0


def test_lambdas_round_up_so_the_exposure_is_reached():
    for s in (0.7515, 0.30015, 0.2505, 2.85, 0.0063):
        for e, lam in zip((1.0, 3.0, 8.0), lambdas_for((1.0, 3.0, 8.0), s), strict=True):
            assert e <= lam * s < e * 1.002
