"""The fig3, table1 and fig4 figures draw the stored numbers: read back from the artists, every
point, line, error bar and image cell equals the data (ranks against a dense numpy reference)."""

import numpy as np
import pytest

from headrank.studies.lm_common import floor_tol
from headrank.studies.lm_plots import fig3_panels, fig4_ratios, fig4_rows_head0, table1_panels
from tests.figcheck import (
    assert_line,
    assert_points,
    data_lines,
    errorbar_parts,
    ref_lines,
    scatters,
    xy,
)

pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


# -- fig3 ------------------------------------------------------------------------------------------

def _eff(sv):
    p = sv / sv.sum(-1, keepdims=True)
    return np.exp(-(p * np.log(p)).sum(-1))


def _num(sv, tol):
    return (sv > tol * sv[..., :1]).sum(-1).astype(float)


def _model(layers, n_sel, seed):
    """A sweep of three λ × two seeds whose spectra fall faster with λ (a distinct value per run)."""
    rng = np.random.default_rng(seed)
    runs = []
    for j, lam in enumerate((0.0, 1.5, 4.0)):
        for s in (0, 1):
            decay = np.exp(-(1 + 3 * j) * np.arange(8) / 2.0)
            sv = {p: np.sort(rng.uniform(0.5, 1.5, (n_sel, 4, 8)) * decay, -1)[..., ::-1] for p in ("qk", "ov")}
            runs.append({"lam": lam, "seed": s, "exposure": {"attn": 0.75 * lam}, "sv": sv})
    return {"lambdas": [0.0, 1.5, 4.0], "layers": layers, "n_layers": 4, "runs": runs,
            "noise_floor_sigma1": {"0": 0.3, "1.5": 0.05, "4": 0.02}}


def test_fig3_panels_draw_each_runs_rank_and_the_seed_mean_and_std():
    data = {"lm": _model([2], 1, 0), "vit": _model(None, 3, 1)}
    fig = fig3_panels(data)
    panels = [(a, m, p) for a, (m, p) in zip(fig.axes, [("lm", "qk"), ("lm", "ov"), ("vit", "qk"), ("vit", "ov")],
                                               strict=True)]
    for ax, model, product in panels:
        m = data[model]
        tol = floor_tol(m)["tol"]
        assert 1e-3 < tol < 0.5
        pts = scatters(ax)
        assert len(pts) == 3 * 3 and len(ax.containers) == 3
        for i, (measure, t) in enumerate(((lambda sv, _: _eff(sv), None), (_num, 1e-3), (_num, tol))):
            mean_x, mean_y, sd = [], [], []
            for k, lam in enumerate((0.0, 1.5, 4.0)):
                per_seed = [float(np.mean(measure(np.asarray(r["sv"][product]), t))) for r in m["runs"] if r["lam"] == lam]
                assert_points(pts[3 * i + k], [0.75 * lam] * 2, per_seed)
                mean_x.append(0.75 * lam)
                mean_y.append(np.mean(per_seed))
                sd.append(np.std(per_seed, ddof=1))
            x, y, half = errorbar_parts(ax.containers[i])
            np.testing.assert_allclose(x, mean_x)
            np.testing.assert_allclose(y, mean_y)
            np.testing.assert_allclose(half, sd, atol=1e-12)
        assert ax.get_xscale() == "symlog" and ax.get_ylim()[0] == 0
        assert model.upper() in ax.get_title()
    assert "layer index 2" in fig.axes[0].get_title() and "mean over heads and layers" in fig.axes[2].get_title()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["effective rank", "numerical rank (τ 1e-3)"] and legend[2].startswith("numerical rank (τ ")


# -- table1 ----------------------------------------------------------------------------------------

def _table():
    """attention λ {0, 0.1, 2} × MLP λ {0, 0.1}: five of six cells, one with a single seed (no std)."""
    cells = [(0.0, 0.0, 14.5, 0.37), (0.0, 0.1, 14.6, 0.38), (0.1, 0.1, 14.59, 0.4), (2.0, 0.0, 16.2, None),
             (2.0, 0.1, 15.3, 0.25)]
    return {"table": {"attn_weight_decay": [c[0] for c in cells], "weight_decay": [c[1] for c in cells],
                      "ppl_mean": [c[2] for c in cells], "ppl_std": [c[3] for c in cells],
                      "n_seeds": [5, 5, 5, 1, 5]}}


def test_table1_panels_draw_the_mean_grid_and_one_line_per_mlp_lambda():
    fig = table1_panels(_table())
    heat, lines = fig.axes[0], fig.axes[1]
    grid = np.ma.filled(heat.images[0].get_array().astype(float), np.nan)
    want = np.array([[14.5, 14.6], [np.nan, 14.59], [16.2, 15.3]])
    np.testing.assert_allclose(grid, want, equal_nan=True)  # the cell not run is blank, not 0
    texts = {(t.get_position()): t.get_text() for t in heat.texts}
    assert texts[(0, 0)] == "14.500\n± 0.370" and texts[(0, 2)] == "16.200"  # no std: the mean alone
    assert (0, 1) not in texts  # nothing written in the cell not run
    assert [t.get_text() for t in heat.get_xticklabels()] == ["0", "0.1"]
    assert [t.get_text() for t in heat.get_yticklabels()] == ["0", "0.1", "2"]
    assert len(lines.containers) == 2
    for j, (y, sd) in enumerate((([14.5, np.nan, 16.2], [0.37, 0.0, 0.0]), ([14.6, 14.59, 15.3], [0.38, 0.4, 0.25]))):
        x, gy = xy(lines.containers[j].lines[0])
        np.testing.assert_allclose(x, [0.0, 0.1, 2.0])
        np.testing.assert_allclose(gy, y, equal_nan=True)
        if j == 1:
            np.testing.assert_allclose(errorbar_parts(lines.containers[j])[2], sd)
    assert lines.get_xscale() == "symlog"
    assert [t.get_text() for t in lines.get_legend().get_texts()] == ["MLP λ = 0", "MLP λ = 0.1"]


# -- fig4 ------------------------------------------------------------------------------------------

def _described(n=3, dh=6, seed=0):
    rng = np.random.default_rng(seed)
    rows = {r: 10.0 ** rng.uniform(-2, 1, (n, dh)) for r in "kqpv"}
    prods = {p: {f"ratio_{k}": rng.uniform(0.5, 1.0, (n, 4)) for k in ("trained", "rotation", "pairing")}
             for p in ("qk", "ov")}
    return {"source": "toy", "n_layers": n, "rows_head0": {k: v.tolist() for k, v in rows.items()}, "products": prods}


def test_fig4_rows_head0_draws_each_layers_row_norms_on_log_axes():
    d = _described()
    fig = fig4_rows_head0(d)
    for ax, (x, y) in zip(fig.axes, (("k", "q"), ("p", "v")), strict=True):
        pts = scatters(ax)
        assert len(pts) == 3
        for j in range(3):
            assert_points(pts[j], d["rows_head0"][x][j], d["rows_head0"][y][j])
        both = np.concatenate([np.ravel(d["rows_head0"][x]), np.ravel(d["rows_head0"][y])])
        assert_line(data_lines(ax)[0], [both.min(), both.max()], [both.min(), both.max()])  # y = x
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["layer 0", "layer 1", "layer 2"]


def test_fig4_ratios_draw_every_head_per_group_with_its_median():
    data = {"described": _described(), "lambdas": [0.0, 3.0], "runs": []}
    for lam in (0.0, 3.0):
        for s in (0, 1):
            r = _described(seed=int(10 * lam + s + 1))
            data["runs"].append({"lam": lam, "seed": s, "exposure": {"attn": lam * 0.75}, "products": r["products"]})
    fig = fig4_ratios(data)
    groups = [[data["described"]]] + [[r for r in data["runs"] if r["lam"] == lam] for lam in (0.0, 3.0)]
    for ax, product in zip(fig.axes, ("qk", "ov"), strict=True):
        pts, meds = scatters(ax), data_lines(ax)
        assert len(pts) == len(meds) == 3 * 3
        for i, ds in enumerate(groups):
            for k, name in enumerate(("trained", "rotation", "pairing")):
                v = np.concatenate([np.ravel(d["products"][product][f"ratio_{name}"]) for d in ds])
                got = pts[3 * i + k].get_offsets()
                np.testing.assert_allclose(got[:, 1], v)
                assert np.all(np.abs(got[:, 0] - (i + (k - 1) * 0.25)) <= 0.06)  # jitter around its slot
                np.testing.assert_allclose(xy(meds[3 * i + k])[1], [np.median(v)] * 2)
        assert ref_lines(ax) == [0.99]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["described", "LM exposure 0", "LM exposure 2.2"]
