"""fig3: claim logic on synthetic spectra (holds and fails both ways), and one tiny end-to-end run."""

import numpy as np
import pytest

from attnrank.studies import fig3
from attnrank.studies.fig3 import (
    Fig3Params,
    matched_exposure_lowers,
    rank_falls,
)
from attnrank.studies.lm_common import floor_tol, per_run


def _sv(rank, dh=16, floor=1e-4):
    s = np.full(dh, floor)
    s[: int(rank)] = np.linspace(2.0, 1.0, int(rank))
    return s


def _model(rank_of_exposure, seeds=(0, 1), lr_sum=1.0, jitter=0.0, n_layers=4, heads=4):
    """A model's data where every head of a run has ``rank`` singular values near 1 and the rest at a floor."""
    rng = np.random.default_rng(0)
    runs = []
    lams = [e / lr_sum for e in rank_of_exposure]
    for e, r in rank_of_exposure.items():
        for s in seeds:
            rr = max(1, min(16, round(r + jitter * rng.standard_normal())))
            sv = [[_sv(rr).tolist() for _ in range(heads)]]
            runs.append({"lam": e / lr_sum, "seed": s, "exposure": {"attn": e, "other": 0.1 * lr_sum},
                         "sv": {"qk": sv, "ov": sv}})
    return {"lambdas": lams, "lr_sum": lr_sum, "runs": runs, "layers": [2], "n_layers": n_layers,
            "noise_floor_sigma1": {f"{lam:g}": 1e-3 for lam in lams}}


def test_floor_tol_is_twice_the_tail_floor_at_the_largest_lambda():
    m = _model({0.0: 16, 8.0: 4})
    t = floor_tol(m)
    assert t["tail_floor"]["qk"] == pytest.approx(1e-4 / 2.0) and t["tol"] == pytest.approx(1e-4)
    assert t["simulated_floor"]["ov"]["0"] == pytest.approx(1e-3 / 2.0)
    v = per_run(m, "qk", "numerical", t["tol"])
    assert v[0.0] == {0: 16.0, 1: 16.0} and v[8.0] == {0: 4.0, 1: 4.0}


def test_rank_falls_holds_on_a_falling_rank_with_ties():
    m = _model({0.0: 16, 1.0: 16, 3.0: 10, 8.0: 4})
    for measure in ("effective", "numerical"):
        c = rank_falls(m, "lm", measure)
        assert c.verdict == "held", c.reason
        assert c.exposure["got_attn"]["8"] == 8.0
    c = matched_exposure_lowers(m, "lm", 300)
    assert c.verdict == "held" and c.measured["qk"]["drop"] > 0 and c.exposure["got_attn"] == 8.0


def test_rank_falls_not_held_on_a_rising_or_flat_rank():
    m = _model({0.0: 4, 1.0: 8, 3.0: 12, 8.0: 16})
    assert rank_falls(m, "vit", "effective").verdict == "not held"
    assert matched_exposure_lowers(m, "vit", 300).verdict == "not held"
    flat = _model({0.0: 16, 3.0: 16, 8.0: 16})
    assert rank_falls(flat, "vit", "numerical").verdict == "not held"


def test_low_exposure_is_inconclusive():
    m = _model({0.0: 16, 0.1: 14, 0.3: 10})
    c = rank_falls(m, "lm", "effective")
    assert c.verdict == "inconclusive" and "exposure" in c.reason
    assert matched_exposure_lowers(m, "lm", 300).verdict == "inconclusive"


def test_claims_shape_and_replot_equivalence():
    data = {"lm": _model({0.0: 16, 3.0: 8, 8.0: 4}), "vit": _model({0.0: 16, 3.0: 8, 8.0: 4}, n_layers=4)}
    p = Fig3Params.quick()
    names = [c.name for c in fig3.claims(data, p)]
    assert names == [f"fig3.{m}.{n}" for m in ("lm", "vit") for n in ("rank_falls", "rank_falls_numerical",
                                                                       "lam01_matched_lowers")]
    assert len(fig3.figures(data, p)) == 1 and len(fig3.notes(data, p)) == 4


@pytest.mark.slow
def test_fig3_end_to_end_tiny():
    from attnrank.studies.registry import get

    assert get("fig3").study is fig3.STUDY
    p = Fig3Params(exposures=(0.0, 0.5), lm_steps=20, vit_steps=20, seeds=(0,), workers=1, profile="test")
    data = fig3.run(p)
    assert len(data["lm"]["runs"]) == 2 and np.asarray(data["lm"]["runs"][0]["sv"]["qk"]).shape == (1, 4, 16)
    assert np.asarray(data["vit"]["runs"][0]["sv"]["ov"]).shape == (4, 4, 16)
    assert data["lm"]["runs"][1]["exposure"]["attn"] == pytest.approx(0.5, rel=1e-3)
    cs = fig3.claims(data, p)
    assert len(cs) == 6 and all(c.exposure is not None for c in cs)
