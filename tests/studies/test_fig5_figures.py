"""The Figure 5 figures draw the stored trajectories and sweep distances, read back from the artists."""

import itertools

import numpy as np
import pytest

from headrank.studies.fig5.claims import CONVERGED, TOL
from headrank.studies.fig5.figures import FLOOR, fig5_sweeps, fig5_trajectories, figures
from headrank.studies.fig5.params import Fig5Params
from tests.figcheck import (
    assert_line,
    assert_points,
    data_lines,
    ref_lines,
    scatters,
)

P = Fig5Params(eps_sweep=(0.1, 0.01, 1e-3), wd_sweep=(0.1, 0.5), schedules=((1e-2, 100, 10), (1e-3, 100, 10)))


pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _dist(eps, lam, lr, kind, which):
    """A distinct distance per run, spanning decades."""
    return eps * lam * (1 if kind == "direct" else 3) * (1 if lr == 1e-2 else 7) * (1 if which == "t" else 1e-4)


def _data() -> dict:
    runs = []
    for eps, lam, lr, kind, opt in itertools.product(P.eps_sweep, P.wd_sweep, (1e-2, 1e-3), ("direct", "factorized"),
                                                      ("adamw", "adam_l2")):
        runs.append({"eps": eps, "lam_wd": lam, "opt": opt, "lr": lr, "kind": kind,
                     "tail_spread": 1e-12 if eps != 1e-3 else 1.0, "dist_target": _dist(eps, lam, lr, kind, "t"),
                     "dist_fixed_point": _dist(eps, lam, lr, kind, "f")})
    runs.reverse()  # the figure orders by ε and λ_wd itself
    bad = next(r for r in runs if (r["eps"], r["lam_wd"], r["lr"], r["kind"], r["opt"]) ==
               (0.01, 0.1, 1e-2, "factorized", "adamw"))
    bad["dist_target"], bad["tail_spread"] = None, None  # a run that did not finish (JSON null)
    t = np.linspace(0, 1, 5)[:, None]
    traj = {f"{k}/{o}/eps={e:g}": (np.array([[0.2, 1.6]]) * (1 - t) + t * [0.6 + i, 0.2 + j]).tolist()
            for i, k in enumerate(("direct", "factorized")) for j, o in enumerate(("adamw", "adam_l2"))
            for e in (0.1, 0.01)}
    return {"S": {"center": [1.6, 0.6], "radius": 1.0}, "min_l2_point_on_S": [0.66, 0.25], "min_l1_point_on_S": [0.8, 0.0],
            "runs": runs, "trajectories": traj,
            "traj_optima": {f"eps={e:g}": {"l2": [0.66 - e, 0.25], "l1": [0.8 - e, 0.0]} for e in (0.1, 0.01)}}


def test_fig5_trajectories_draw_each_path_optimum_and_the_curve():
    data = _data()
    fig = fig5_trajectories(data, P.w0)
    for ax, kind in zip(fig.axes, ("direct", "factorized"), strict=True):
        lines = data_lines(ax)
        th = np.linspace(0, 2 * np.pi, 400)
        assert_line(lines[0], 1.6 + np.cos(th), 0.6 + np.sin(th))  # S
        mine = [(k, w) for k, w in data["trajectories"].items() if k.startswith(kind + "/")]
        assert len(lines) == 1 + len(mine)
        for line, (key, w) in zip(lines[1:], mine, strict=True):
            w = np.array(w)
            assert_line(line, w[:, 0], w[:, 1])
            assert line.get_linestyle() == ("-" if "/adamw/" in key else ":")
        pts = scatters(ax)
        which = "l2" if kind == "direct" else "l1"
        for c, e in zip(pts[:2], ("eps=0.1", "eps=0.01"), strict=True):
            assert_points(c, [data["traj_optima"][e][which][0]], [data["traj_optima"][e][which][1]])
        assert_points(pts[2], [0.66], [0.25])
        assert_points(pts[3], [0.8], [0.0])
        assert_points(pts[4], [P.w0[0]], [P.w0[1]])


def _sel(data, **kw):
    return sorted((r for r in data["runs"] if r["opt"] == "adamw" and all(r[k] == v for k, v in kw.items())),
                  key=lambda r: (r["eps"], r["lam_wd"]))


def test_fig5_sweeps_draw_distances_per_lr_and_kind_missing_runs_left_out():
    data = _data()
    fig = fig5_sweeps(data, P)
    eps_ax, wd_ax = fig.axes
    lines, pts = data_lines(eps_ax), scatters(eps_ax)
    combos = [(lr, kind) for lr in (1e-2, 1e-3) for kind in ("direct", "factorized")]  # lr descending
    assert len(lines) == len(combos) and len(pts) == 2 * len(combos)
    for n, (lr, kind) in enumerate(combos):
        sel = _sel(data, lr=lr, kind=kind, lam_wd=P.lam_main)
        e = [r["eps"] for r in sel]
        d = np.array([np.inf if r["dist_target"] is None else r["dist_target"] for r in sel])
        assert_line(lines[n], e, d)
        settled = np.array([r["tail_spread"] is not None and r["tail_spread"] < CONVERGED for r in sel])
        assert_points(pts[2 * n], np.array(e)[settled], d[settled])
        assert_points(pts[2 * n + 1], np.array(e)[~settled], d[~settled])  # hollow: not converged
    missing = lines[1].get_ydata()[1]  # factorized, lr 1e-2, ε = 0.01: null
    assert not np.isfinite(missing)  # not drawn (never at 0 or at the floor)
    assert ref_lines(eps_ax) == [TOL] and ref_lines(wd_ax) == [TOL]
    wd_lines = data_lines(wd_ax)
    assert len(wd_lines) == 4
    for n, kind in enumerate(("direct", "factorized")):
        sel = _sel(data, lr=P.schedules[0][0], kind=kind, eps=P.eps_main)
        lw = [r["lam_wd"] for r in sel]
        assert_line(wd_lines[2 * n], lw, [max(np.inf if r["dist_target"] is None else r["dist_target"], FLOOR)
                                          for r in sel])
        assert_line(wd_lines[2 * n + 1], lw, [r["dist_fixed_point"] for r in sel])
    for ax in fig.axes:
        assert ax.get_xscale() == ax.get_yscale() == "log"


def test_figures_give_both_figures():
    assert [f.name for f in figures(_data(), P)] == ["fig5", "fig5_sweeps"]
