"""Shared LM-study helpers: ranks from spectra, exposure, the noise floor (verdict statistics: test_verdicts.py)."""


import numpy as np
import pytest

from headrank.studies.lm_common import (
    floor_tol,
    lambdas_for,
    lm_base,
    lr_sum,
    noise_floors,
    per_run,
)


def _m(sv_by_lam, floor=1e-3):
    """A sweep whose every run (seeds 0, 1) has these singular values for both products (one layer, heads as rows)."""
    runs = [{"lam": lam, "seed": s, "sv": {"qk": [sv], "ov": [sv]}} for lam, sv in sv_by_lam.items() for s in (0, 1)]
    return {"runs": runs, "noise_floor_sigma1": {f"{lam:g}": floor for lam in sv_by_lam}}


def test_per_run_ranks_are_the_core_definitions_against_numpy():
    sv = [[4.0, 2.0, 1e-4, 0.0], [1.0, 1.0, 1.0, 1.0]]  # two heads
    m = _m({0.0: sv})
    p = np.array([4, 2, 1e-4]) / (6 + 1e-4)
    eff = np.mean([np.exp(-(p * np.log(p)).sum()), 4.0])
    assert per_run(m, "qk", "effective")[0.0] == {0: pytest.approx(eff, rel=1e-12), 1: pytest.approx(eff, rel=1e-12)}
    assert per_run(m, "ov", "numerical", 1e-3)[0.0][0] == np.mean([2, 4])
    assert per_run(m, "ov", "numerical", 0.6)[0.0][1] == np.mean([1, 4])
    bad = _m({0.0: [[np.nan, 1.0, 0.5, 0.1]]})  # a non-finite head: NaN, not the core's integer -1
    assert np.isnan(per_run(bad, "qk", "numerical", 0.1)[0.0][0]) and np.isnan(per_run(bad, "qk", "effective")[0.0][0])


def test_floor_tol_without_a_lambda_0_control_is_inconclusive_not_the_smallest_lambda():
    from headrank.studies.fig3 import rank_falls

    low, high = [[2.0, 1.0, 0.5, 0.1]], [[2.0, 0.1, 1e-3, 1e-4]]
    with_control = floor_tol(_m({0.0: low, 1.0: low, 8.0: high}))
    assert with_control["tol"] == pytest.approx(2 * 1e-3 / 2.0) and "missing" not in with_control
    t = floor_tol(_m({1.0: low, 8.0: high}))  # before: lambda = 1 stood in for the control
    assert np.isnan(t["tol"]) and "no lambda = 0 control" in t["missing"] and t["simulated_floor"] == {}
    assert np.isnan(per_run(_m({1.0: low}), "qk", "numerical", t["tol"])[1.0][0])
    m = {**_m({1.0: low, 3.0: low, 8.0: high}), "lambdas": [1.0, 3.0, 8.0], "layers": [0], "n_layers": 1}
    for r in m["runs"]:
        r["exposure"] = {"attn": r["lam"], "other": 0.1}
    c = rank_falls(m, "lm", "numerical")
    assert c.verdict == "inconclusive" and "no lambda = 0 control" in c.reason
    m0 = {**_m({0.0: low, 3.0: low, 8.0: high}), "lambdas": [0.0, 3.0, 8.0], "layers": [0], "n_layers": 1}
    for r in m0["runs"]:
        r["exposure"] = {"attn": r["lam"], "other": 0.1}
    assert rank_falls(m0, "lm", "numerical").verdict != "inconclusive"  # with the control it is judged


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
