"""fig3: claim logic on synthetic spectra (holds and fails both ways), and one tiny end-to-end run."""

import numpy as np
import pytest

from headrank.studies import fig3
from headrank.studies.fig3 import (
    Fig3Params,
    literal_lowers,
    matched_exposure_lowers,
    rank_falls,
)
from headrank.studies.lm_common import floor_tol, per_run


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


def test_floor_tol_comes_from_the_control_not_from_the_decayed_runs():
    m = _model({0.0: 16, 8.0: 4})
    t = floor_tol(m)
    # tau = 2 x the simulated sigma_1 at the largest lambda (1e-3) over the median trained sigma_1 at lambda 0 (2)
    assert t["simulated_floor"]["ov"]["8"] == pytest.approx(1e-3 / 2.0) and t["tol"] == pytest.approx(1e-3)
    assert t["tail_floor"]["qk"]["8"] == pytest.approx(1e-4 / 2.0)  # recorded, not used
    deeper = _model({0.0: 16, 8.0: 4})
    for r in deeper["runs"]:
        if r["lam"] == 8.0:
            r["sv"] = {p: (np.asarray(v) * np.r_[np.ones(4), np.full(12, 1e-3)]).tolist() for p, v in r["sv"].items()}
    assert floor_tol(deeper)["tol"] == t["tol"]  # the judged runs' own tails do not move tau
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


def test_literal_lambda_is_judged_as_it_stands():
    m = _model({0.0: 16, 0.1: 12, 3.0: 8, 8.0: 4})
    m["literal_lambda"], m["lr_peak"] = 0.1, 3e-3
    c = literal_lowers(m, "lm", 300)
    assert c.verdict == "held" and c.exposure["got_attn"] == pytest.approx(0.1)
    assert c.exposure["eta_lambda_per_step"] == pytest.approx(3e-4)
    same = _model({0.0: 16, 0.1: 16, 3.0: 8, 8.0: 4})
    assert literal_lowers(same, "lm", 300).verdict == "not held"


def test_low_exposure_is_inconclusive():
    m = _model({0.0: 16, 0.1: 14, 0.3: 10})
    c = rank_falls(m, "lm", "effective")
    assert c.verdict == "inconclusive" and "exposure" in c.reason
    assert matched_exposure_lowers(m, "lm", 300).verdict == "inconclusive"


def test_claims_shape_and_replot_equivalence():
    data = {"lm": _model({0.0: 16, 3.0: 8, 8.0: 4}), "vit": _model({0.0: 16, 3.0: 8, 8.0: 4}, n_layers=4)}
    p = Fig3Params.quick()
    names = [c.name for c in fig3.claims(data, p)]
    assert names == ["fig3.rank_falls", "fig3.lam01_literal"] + [
        f"fig3.{m}.{n}" for m in ("lm", "vit") for n in ("rank_falls", "rank_falls_numerical", "lam01_literal",
                                                          "lam01_matched_lowers")]
    by = {c.name: c for c in fig3.claims(data, p)}
    # each caption sentence is counted once, over both models; the per-model claims support it
    for m in ("lm", "vit"):
        assert by[f"fig3.{m}.rank_falls"].supports == by[f"fig3.{m}.rank_falls_numerical"].supports == "fig3.rank_falls"
        assert by[f"fig3.{m}.lam01_literal"].supports == by[f"fig3.{m}.lam01_matched_lowers"].supports \
            == "fig3.lam01_literal"
    assert not by["fig3.rank_falls"].supports and not by["fig3.lam01_literal"].supports
    assert by["fig3.rank_falls"].verdict == "held"  # both models' trends hold
    assert by["fig3.lm.lam01_literal"].verdict == "inconclusive"  # no run at lambda 0.1 in this grid
    assert by["fig3.lam01_literal"].verdict == "inconclusive"
    assert len(fig3.figures(data, p)) == 1 and len(fig3.notes(data, p)) == 4


def test_a_caption_sentence_holds_only_in_every_model():
    lm, vit = _model({0.0: 16, 3.0: 8, 8.0: 4}), _model({0.0: 16, 3.0: 8, 8.0: 4}, n_layers=4)
    flat = _model({0.0: 8, 3.0: 8, 8.0: 8}, n_layers=4)  # no trend in the ViT
    rising = _model({0.0: 4, 3.0: 8, 8.0: 16}, n_layers=4)  # reversed in the ViT
    p = Fig3Params.quick()
    verdict = {name: {c.name: c.verdict for c in fig3.claims({"lm": lm, "vit": v}, p)}
               for name, v in (("both", vit), ("flat", flat), ("rising", rising))}
    assert verdict["both"]["fig3.rank_falls"] == "held"
    assert verdict["flat"]["fig3.vit.rank_falls"] != "held" and verdict["flat"]["fig3.rank_falls"] != "held"
    assert verdict["rising"]["fig3.vit.rank_falls"] == "not held" and verdict["rising"]["fig3.rank_falls"] == "not held"


def test_paper_vit_profile_judges_the_vit_alone_and_never_holds_a_sentence_without_the_lm():
    """fig3's paper_vit profile: the ViT's own claims by the paper profile's rules; the caption's
    sentences (every model) inconclusive while the LM is absent, not held where the ViT fails."""
    from dataclasses import replace

    p = Fig3Params.paper_vit()
    assert p.models == ("vit",) and p.profile == "paper_vit"
    assert replace(p, models=Fig3Params.paper().models, profile="paper") == Fig3Params.paper()
    vit = _model({0.0: 16, 8.0: 4}, seeds=(0, 1, 2), n_layers=2)
    vit["literal_lambda"], vit["lr_peak"] = 8.0, 1e-2
    by = {c.name: c for c in fig3.claims({"vit": vit}, p)}
    assert not any(n.startswith("fig3.lm.") for n in by)
    assert by["fig3.vit.lam01_literal"].verdict == "held"
    assert by["fig3.lam01_literal"].verdict == "inconclusive" and "not in this run: LM" in by["fig3.lam01_literal"].reason
    rising = _model({0.0: 4, 8.0: 16}, seeds=(0, 1, 2), n_layers=2)
    rising["literal_lambda"] = 8.0
    by = {c.name: c for c in fig3.claims({"vit": rising}, p)}
    assert by["fig3.vit.lam01_literal"].verdict == "not held" and by["fig3.lam01_literal"].verdict == "not held"
    assert len(fig3.figures({"vit": vit}, p)) == 1


@pytest.mark.slow
def test_fig3_end_to_end_tiny():
    from headrank.studies.registry import get

    assert get("fig3").study is fig3.STUDY
    p = Fig3Params(exposures=(0.0, 0.5), lm_steps=20, vit_steps=20, seeds=(0,), workers=1, profile="test")
    data = fig3.run(p)
    runs = sorted(data["lm"]["runs"], key=lambda r: r["lam"])  # lambda 0, the literal 0.1, the grid's top
    assert [r["lam"] for r in runs][:2] == [0.0, 0.1] and len(runs) == 3
    assert np.asarray(runs[0]["sv"]["qk"]).shape == (1, 4, 16)
    assert np.asarray(data["vit"]["runs"][0]["sv"]["ov"]).shape == (4, 4, 16)
    assert runs[2]["exposure"]["attn"] == pytest.approx(0.5, rel=1e-3) and data["lm"]["lambdas"][0] == 0.0
    cs = fig3.claims(data, p)
    by = {c.name: c for c in cs}
    assert len(cs) == 10
    for model in ("lm", "vit"):  # exposure = lam * sum(lr): 0 at lam 0, the target 0.5 at the top, linear in lam
        got = by[f"fig3.{model}.rank_falls"].exposure["got_attn"]
        assert by[f"fig3.{model}.rank_falls_numerical"].exposure["got_attn"] == got
        lams = sorted(r["lam"] for r in data[model]["runs"] if r["seed"] == 0)
        assert list(got) == [f"{lam:g}" for lam in lams] and got["0"] == 0.0
        assert got[f"{lams[-1]:g}"] == pytest.approx(0.5, rel=1e-3)
        for lam in lams[1:]:
            assert got[f"{lam:g}"] == pytest.approx(0.5 * lam / lams[-1], rel=1e-3)  # recorded to 3-4 digits
        matched = by[f"fig3.{model}.lam01_matched_lowers"]  # nearest the pretraining exposure 8: the top
        assert matched.measured["lambda_matched"] == lams[-1] and matched.exposure["got_attn"] == got[f"{lams[-1]:g}"]
        assert by[f"fig3.{model}.lam01_literal"].exposure["got_attn"] == got.get("0.1")
    literal = {c.name: c for c in cs}["fig3.lm.lam01_literal"]
    assert literal.exposure["eta_lambda_per_step"] == pytest.approx(0.1 * 3e-3)


def test_two_lambda_levels_count_one_contrast_once():
    """The paper profile: with lambda 0 and the literal lambda only, the trend and the literal drop
    are one contrast: fig3.lam01_literal and its evidence support fig3.rank_falls, not counted again."""
    from headrank.studies import fig3
    from headrank.studies.registry import citation_problems, tally

    m = _model({0.0: 16, 0.1: 4})
    m["literal_lambda"] = 0.1
    cl = fig3.claims({"lm": m, "vit": m}, fig3.Fig3Params.quick())
    by = {c.name: c for c in cl}
    assert by["fig3.lam01_literal"].supports == "fig3.rank_falls"
    assert citation_problems([c.to_json() for c in cl]) == []
    assert sum(tally([c.to_json() for c in cl])["findings"].values()) == 1
