"""The Figure 1 and Proposition 3.1 figures draw the stored series, read back from the artists."""

import numpy as np
import pytest

from headrank.studies.fig1.figures import (
    FLOOR,
    balance_prediction,
    fig1_panels,
    figures,
    prop31_scatter,
)
from headrank.studies.fig1.params import Fig1Params
from tests.figcheck import (
    assert_line,
    assert_points,
    data_lines,
    ref_lines,
    scatters,
)

T, RATE = 400, 0.05
LAMS = [0.0, 0.2, 0.4]


pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _data(seed: int = 0) -> dict:
    """Run output of fig1 (run's keys): λ = 0 keeps its imbalance, λ > 0 loses it at e^(−RATE t)."""
    t = np.arange(T + 1)
    bal = np.array([np.full(T + 1, 4.0) if lam == 0 else 4.0 * np.exp(-RATE * t) for lam in LAMS])
    gap = np.array([1.5 * np.exp(-lam * t / 10) for lam in LAMS])
    gap[1, 7], gap[1, 8], gap[2, 9] = 0.0, -1e-18, np.nan  # rounding level and a missing value
    sweep = np.linspace(0.0, 2.0, 5)
    d = np.array([0.2, 0.4, 0.6, 0.8, 1.0])
    cf = np.maximum(d[None, ::-1] - sweep[:, None] / 2, 0.0)
    rng = np.random.default_rng(0)
    fits = [[{"slope": -RATE, "predicted": {"slope": -RATE}} for _ in LAMS[1:]] for _ in range(2)]
    fits[0][1]["predicted"] = None  # no prediction for the largest λ of the main seed
    n = 6
    nb = 10.0 ** rng.uniform(0, 2, n)
    prop = {"nuclear_bal": nb, "bound_bal": nb * (1 + np.r_[0.0, 1e-16 * rng.uniform(1, 9, n - 1)]),
            "bound_scaled": nb * 3, "gap_scaled": nb * 1.2, "bound_indep": nb * 2, "gap_indep": nb * 0.5}
    return {"t": t.tolist(), "lambdas": LAMS, "d": d.tolist(), "eta": 0.1, "steps": T, "seed": seed,
            "gap": gap.tolist(), "balance": bal.tolist(), "lambda_sweep": sweep.tolist(),
            "sv_sweep_final": (cf + 1e-3).tolist(), "sv_sweep_closed_form": cf.tolist(), "sv_traj_lambda": 0.4,
            "sv_traj": np.outer(np.exp(-t / 100), [2.0, 1.2, 0.3, 0.07, 0.01]).tolist(),
            "rates": {"lambdas": LAMS[1:], "seeds": [0, 1], "window": [1e-10, 1e-4], "eta": 0.1, "fits": fits},
            "prop31": {k: v.tolist() for k, v in prop.items()}}


def test_balance_prediction_starts_in_the_fit_window_and_follows_the_predicted_rate():
    data = _data()
    pred = balance_prediction(data)
    bal = np.array(data["balance"])
    t0 = int(np.ceil(np.log(1e4) / RATE))  # first step with balance/balance_0 <= 1e-4
    assert np.isnan(pred[0]).all() and np.isnan(pred[2]).all()  # λ = 0; λ with no predicted slope
    assert np.isnan(pred[1, :t0]).all()
    np.testing.assert_allclose(pred[1, t0:], bal[1, t0:], rtol=1e-9)  # the right rate lies on the data
    assert np.isnan(balance_prediction(_data(seed=7))).all()  # a main seed without rate fits


def test_fig1_panels_draw_gap_balance_and_singular_values():
    data = _data()
    fig = fig1_panels(data)
    gap_ax, bal_ax, sweep_ax, traj_ax = fig.axes
    t, pred = np.array(data["t"]), balance_prediction(data)
    for j in range(len(LAMS)):
        assert_line(data_lines(gap_ax)[j], t, np.maximum(data["gap"][j], FLOOR))
        assert_line(data_lines(bal_ax)[2 * j], t, np.maximum(data["balance"][j], FLOOR))
        assert_line(data_lines(bal_ax)[2 * j + 1], t, pred[j])
    g1 = data_lines(gap_ax)[1].get_ydata()
    assert g1[7] == g1[8] == FLOOR and np.isnan(data_lines(gap_ax)[2].get_ydata()[9])  # NaN: not at 0 or the floor
    for ax in (gap_ax, bal_ax):
        assert ax.get_yscale() == "log" and ax.get_ylim()[0] == FLOOR
    sweep, n = np.array(data["lambda_sweep"]), 5
    pts = scatters(sweep_ax)
    assert len(pts) == len(data_lines(sweep_ax)) == n
    for i in range(n):
        assert_line(data_lines(sweep_ax)[i], sweep, np.array(data["sv_sweep_closed_form"])[:, i])
        assert_points(pts[i], sweep, np.array(data["sv_sweep_final"])[:, i])
        assert_line(data_lines(traj_ax)[i], t, np.array(data["sv_traj"])[:, i])
    np.testing.assert_allclose(ref_lines(traj_ax), [0.8, 0.6, 0.4, 0.2, 0.0])  # max(d_i − 0.4/2, 0), descending
    assert traj_ax.get_xscale() == "symlog" and traj_ax.get_xlim() == (0, T)


def test_prop31_scatter_draws_bound_against_nuclear_and_the_rounding_histogram():
    p = {k: np.array(v) for k, v in _data()["prop31"].items()}
    fig = prop31_scatter(_data()["prop31"])
    ax, hist = fig.axes
    bal, scaled, indep = scatters(ax)
    assert_points(bal, p["nuclear_bal"], p["bound_bal"])
    assert_points(scaled, p["bound_scaled"] - p["gap_scaled"], p["bound_scaled"])
    assert_points(indep, p["bound_indep"] - p["gap_indep"], p["bound_indep"])
    (diag,) = data_lines(ax)
    allv = np.concatenate([p["nuclear_bal"], p["bound_bal"], p["bound_scaled"] * (1 - 0.4), p["bound_scaled"],
                           p["bound_indep"] * 0.75, p["bound_indep"]])
    assert_line(diag, [allv.min(), allv.max()], [allv.min(), allv.max()])
    assert ax.get_xscale() == ax.get_yscale() == "log"
    heights = np.array([b.get_height() for b in hist.patches])
    assert heights.sum() == len(p["nuclear_bal"])
    rel = np.log10(np.maximum(np.abs(p["bound_bal"] - p["nuclear_bal"]) / p["bound_bal"], 1e-18))
    assert hist.patches[0].get_x() == pytest.approx(rel.min()) and rel.min() == -18.0  # the exact 0 at −18


def test_figures_names_and_caption_carry_the_run():
    out = figures(_data(), Fig1Params())
    assert [f.name for f in out] == ["fig1", "prop31"]
    assert f"t = {T}" in out[0].caption and "lam = 0.4" in out[0].caption
