"""The Figure 2 panels draw the stored series: each line read back from the figure equals the data."""

import numpy as np
import pytest

from headrank.studies.fig2.claims import GAP_TOL, RANK_LAYER
from headrank.studies.fig2.figures import fig2_panels, figures, horizon_panels
from headrank.studies.fig2.params import Fig2Params
from tests.figcheck import assert_line, data_lines, ref_lines

LAMS, SEEDS, STEPS = [0.0, 2.0], [3, 1], [0, 50, 100, 150]
LR, WARMUP, H_STEPS = 0.003, 100, 400


def _lr_sums() -> np.ndarray:
    """Σ_{s ≤ t} lr_s, t = 0 … H_STEPS: linear warmup over WARMUP steps, then constant."""
    s = np.arange(1, H_STEPS + 1)
    return np.r_[0.0, np.cumsum(LR * np.minimum(s, WARMUP) / WARMUP)]


pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _ov(j: int, s: int) -> dict:
    """One layer's tracked series, distinct per λ (j) and seed (s); spans decades."""
    t = np.arange(len(STEPS))
    return {"step": STEPS, "rank": [16.0 - j - s] * len(STEPS), "effective_rank": list(14.0 - t * (j + 1) - s / 10),
            "balance_rel": list(0.3 * 10.0 ** (-t * (j + 1)) * (1 + s)),
            "balance": list(2.5 * 10.0 ** (-t * (j + 2)) * (1 + s)),
            "gap_rel": list(0.06 * 10.0 ** (-t * j) * (1 + s))}


def _data(horizon: bool = True) -> dict:
    data = {"lambdas": LAMS, "seeds": SEEDS, "config": {"schedule": "cosine", "lr": LR, "warmup": WARMUP}, "ov": {},
            "training": {},
            "exposure": {}}
    for j, lam in enumerate(LAMS):
        key = f"{lam:g}"
        data["exposure"][key] = {"attn": 3.0 * lam, "other": 0.3, "lr_sum": 3.0}
        data["ov"][key] = {str(s): {RANK_LAYER: _ov(j, s), "1": _ov(j + 5, s)} for s in SEEDS}
        data["training"][key] = {str(s): {"step": STEPS[1:], "loss": [2.0 / (1 + j + s), 1.0, 1e-3 * (j + 1)]}
                                 for s in SEEDS}
    # a missing measurement (JSON null) and an exact zero
    data["ov"]["2"]["3"][RANK_LAYER]["gap_rel"][2] = None
    data["ov"]["2"]["3"][RANK_LAYER]["balance"][3] = 0.0
    if horizon:
        data["horizon"] = {"lambdas": [0.0, 3.0], "steps": H_STEPS, "label_noise": 0.1,
                           "exposure_end": {"0": 0.0, "3": 3.0 * _lr_sums()[-1]},
                           "ov": {key: {str(s): {"step": [0, 50, 200, 400], "gap_rel": [0.06, 0.03, 0.01 * (1 + s), None],
                                                 "balance_rel": [0.3, 0.25, 0.2 / (1 + i), 0.1 / (1 + s)]}
                                        for s in (0, 1)} for i, key in enumerate(("0", "3"))}}
        data["sgd_control"] = {"lr": 0.01, "lambdas": [1.0, 10.0], "runs": {
            "1/0": {"step": [0, 5, 10], "imbalance": [1.8, 1.63, 1.47]},
            "10/0": {"step": [0, 5, 10], "imbalance": [1.8, 0.63, 0.22]}}}
    return data


def test_fig2_panels_draw_the_first_seed_of_layer_one_per_lambda():
    data = _data()
    fig = fig2_panels(data)
    rank, bal, gap, loss = fig.axes
    seed = str(SEEDS[0])
    for j, lam in enumerate(LAMS):
        ov, tc = data["ov"][f"{lam:g}"][seed][RANK_LAYER], data["training"][f"{lam:g}"][seed]
        assert_line(data_lines(rank)[2 * j], STEPS, ov["effective_rank"])
        assert_line(data_lines(rank)[2 * j + 1], STEPS, ov["rank"])
        want_bal = np.array(ov["balance"], float)  # the absolute imbalance, as the paper's centre panel
        want_gap = np.array([np.nan if v is None else v for v in ov["gap_rel"]], float)
        assert_line(data_lines(bal)[j], STEPS, np.maximum(want_bal, 1e-12))  # exact 0 at the 1e-12 floor
        assert_line(data_lines(gap)[j], STEPS, want_gap)  # null: a gap in the line, not 0
        assert_line(data_lines(loss)[j], tc["step"], tc["loss"])
    assert np.isnan(data_lines(gap)[1].get_ydata()[2])
    assert data_lines(bal)[1].get_ydata()[3] == 1e-12
    assert len(data_lines(rank)) == 2 * len(LAMS) and len(data_lines(loss)) == len(LAMS)
    assert bal.get_yscale() == "log" and gap.get_yscale() == "log" and loss.get_yscale() == "symlog"
    assert ref_lines(gap) == [GAP_TOL]
    labels = [t.get_text() for t in rank.get_legend().get_texts()]
    assert labels == ["λ = 0 (exposure 0.0)", "λ = 2 (exposure 6.0)"]
    assert all(ax.get_xlabel() == "step" for ax in fig.axes)
    assert "cosine" in fig._suptitle.get_text() and f"seed {SEEDS[0]}" in fig._suptitle.get_text()


def test_horizon_panels_draw_every_seed_against_exposure_and_the_sgd_theory_line():
    data = _data()
    h, c = data["horizon"], data["sgd_control"]
    fig = horizon_panels(data)
    gap, bal, sgd = fig.axes
    i = 0
    for lam in h["lambdas"]:
        for x in h["ov"][f"{lam:g}"].values():
            e = (lam if lam > 0 else 1.0) * _lr_sums()[x["step"]]  # λ·Σlr, warmup included (λ = 0: Σlr)
            g = np.array([np.nan if v is None else v for v in x["gap_rel"]], float)
            assert_line(data_lines(gap)[i], e, g)
            assert_line(data_lines(bal)[i], e, x["balance_rel"])
            i += 1
    assert i == len(data_lines(gap)) == len(data_lines(bal)) == 4
    np.testing.assert_allclose(data_lines(gap)[-1].get_xdata()[-1], h["exposure_end"]["3"])  # ends at the stored
    np.testing.assert_allclose(data_lines(gap)[-1].get_xdata()[1], 3.0 * LR * 50 * 51 / (2 * WARMUP))  # warmup: λ·lr·t(t+1)/2w
    for k, (key, r) in enumerate(c["runs"].items()):
        lam, t = float(key.split("/")[0]), np.array(r["step"], float)
        assert_line(data_lines(sgd)[2 * k], t, r["imbalance"])
        assert_line(data_lines(sgd)[2 * k + 1], t, r["imbalance"][0] * (1 - c["lr"] * lam) ** (2 * t))
    assert all(ax.get_yscale() == "log" for ax in fig.axes)
    assert ref_lines(gap) == [GAP_TOL]


def test_horizon_exposure_that_disagrees_with_the_schedule_is_not_guessed():
    data = _data()
    data["horizon"]["exposure_end"]["3"] *= 1.01  # not λ·Σlr of the stored schedule
    fig = horizon_panels(data)
    assert all(np.isnan(ln.get_xdata()).all() for ln in data_lines(fig.axes[0]))


def test_horizon_panels_without_the_horizon_study_draw_nothing():
    fig = horizon_panels(_data(horizon=False))
    assert all(not ax.lines and not ax.collections for ax in fig.axes)


def test_figures_adds_the_horizon_figure_only_when_it_ran():
    assert [f.name for f in figures(_data(), Fig2Params())] == ["fig2", "fig2_horizon"]
    out = figures(_data(horizon=False), Fig2Params())
    assert [f.name for f in out] == ["fig2"] and len(data_lines(out[0].figure.axes[0])) == 2 * len(LAMS)
