"""The spectra, collapse and scaling figures draw their data: each point, line segment, image
cell and bar read back from the matplotlib artists equals the input (NaN stays a gap)."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from headrank.analysis import plots
from tests.figcheck import (
    assert_line,
    assert_points,
    data_lines,
    offsets,
    ref_lines,
    scatters,
    xy,
)

pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _spectra(L=3, H=4, dh=6, spread=True):
    """figure_data's shape: (layers, heads) grids, (layers, heads, dh) spectra, (layers, dh) row norms."""
    rng = np.random.default_rng(0)
    sv = np.sort(10.0 ** rng.uniform(-4, 0, (L, H, dh)), -1)[..., ::-1].copy()
    sv[1, 2, 3:] = 0.0  # a rank-3 head: zeros are gaps on the log axis
    sv[2, 1] = np.nan  # a head that could not be measured
    data = {"layers": np.arange(2, 2 + L), "name": "toy", "tol": 1e-3, "head_dim": dh, "sv_qk": sv, "sv_ov": sv[::-1]}
    for p in ("qk", "ov"):
        data[f"{p}_nuclear"] = rng.uniform(1, 5, (L, H))
        data[f"{p}_frob_bound"] = data[f"{p}_nuclear"] * rng.uniform(1, 1.5, (L, H))
        data[f"{p}_finite"] = np.ones((L, H))
        data[f"{p}_effective_rank"] = rng.uniform(2, 6, (L, H))
        data[f"{p}_rank"] = rng.integers(1, dh + 1, (L, H)).astype(float)
    data["qk_finite"][2, 1] = 0
    data["qk_effective_rank"][2, 1] = np.nan
    lo, hi = (1e-2, 10.0) if spread else (1.0, 2.0)
    for r in "qkvp":
        data[f"rows_{r}"] = rng.uniform(lo, hi, (L, dh))
    return data


@pytest.mark.parametrize("spread", [True, False])
def test_fig4_rows_draws_every_layers_row_norms_log_only_across_decades(spread):
    data = _spectra(spread=spread)
    fig = plots.fig4_rows(data)
    for ax, (x, y) in zip(fig.axes[:2], (("k", "q"), ("p", "v")), strict=True):
        (pts,) = scatters(ax)
        assert_points(pts, data[f"rows_{x}"], data[f"rows_{y}"])
        np.testing.assert_array_equal(pts.get_array(), np.repeat(data["layers"], 6))  # coloured by layer
        both = np.concatenate([data[f"rows_{x}"].ravel(), data[f"rows_{y}"].ravel()])
        assert_line(data_lines(ax)[0], [both.min(), both.max()], [both.min(), both.max()])
        assert ax.get_xscale() == ax.get_yscale() == ("log" if spread else "linear")


def test_fig4_norms_draws_finite_heads_only():
    data = _spectra()
    fig = plots.fig4_norms(data)
    for ax, p in zip(fig.axes[:2], ("qk", "ov"), strict=True):
        ok = data[f"{p}_finite"].astype(bool)
        (pts,) = scatters(ax)
        assert_points(pts, data[f"{p}_nuclear"][ok], data[f"{p}_frob_bound"][ok])
        np.testing.assert_array_equal(pts.get_array(), np.broadcast_to(data["layers"][:, None], ok.shape)[ok])
    assert len(offsets(scatters(fig.axes[0])[0])) == 11 and len(offsets(scatters(fig.axes[1])[0])) == 12


def test_rank_heatmaps_show_each_grid_with_unmeasured_heads_blank():
    data = _spectra()
    fig = plots.rank_heatmaps(data)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    keys = ["qk_effective_rank", "ov_effective_rank", "qk_rank", "ov_rank"]
    assert len(images) == len(keys)
    for im, key in zip(images, keys, strict=True):
        got = np.ma.filled(im.get_array().astype(float), np.nan)
        np.testing.assert_allclose(got, data[key], equal_nan=True)
    assert np.ma.is_masked(images[0].get_array()[2, 1])  # NaN: blank, not a colour for 0
    both = np.concatenate([data["qk_effective_rank"].ravel(), data["ov_effective_rank"].ravel()])
    assert images[0].get_clim() == (np.nanmin(both), np.nanmax(both))


def test_sv_curves_draw_each_measured_heads_normalised_spectrum():
    data = _spectra()
    fig = plots.sv_curves(data)
    for ax, p in zip(fig.axes[:2], ("qk", "ov"), strict=True):
        sv = data[f"sv_{p}"]
        lc = _line_collection(ax)
        segs = np.array([path.vertices for path in lc.get_paths()])
        heads = [(i, h) for i in range(3) for h in range(4) if np.isfinite(sv[i, h]).all()]
        assert segs.shape == (len(heads), 6, 2)
        for seg, (i, h) in zip(segs, heads, strict=True):
            rel = sv[i, h] / sv[i, h, 0]
            np.testing.assert_allclose(seg[:, 0], np.arange(1, 7))
            np.testing.assert_allclose(seg[:, 1], np.where(rel > 0, rel, np.nan), equal_nan=True)
        np.testing.assert_array_equal(lc.get_array(), [data["layers"][i] for i, _ in heads])
        assert ax.get_yscale() == "log" and ref_lines(ax) == [1e-3]
    zero_head = _line_collection(fig.axes[0]).get_paths()[1 * 4 + 2].vertices
    assert np.isnan(zero_head[3:, 1]).all()  # zero singular values: gaps, never drawn at 0


def _line_collection(ax):
    from matplotlib.collections import LineCollection

    (lc,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    return lc


def test_save_figure_writes_a_png_and_closes_the_figure(tmp_path):
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1], [1, 2])
    path = plots.save_figure(fig, tmp_path / "f.png", dpi=20)
    assert Image.open(path).format == "PNG" and not plt.get_fignums()


def _layers_table():
    rows = []
    for init in ("pretrained", "random"):
        for variant, rate in (("pure", 1e-3), ("skip", 0.9)):
            for layer in (3, 0, 2, 1):  # unsorted, as a table may come
                m = rate ** layer if init == "pretrained" else 0.5
                rows.append(dict(init=init, variant=variant, layer=layer, measure="res_composite", mean=m, std=m / 4, n=8))
                rows.append(dict(init=init, variant=variant, layer=layer, measure="cosine", mean=7.0, std=0.0, n=8))
    t = pd.DataFrame(rows)
    t.loc[(t.init == "pretrained") & (t.variant == "pure") & (t.layer == 3) & (t.measure == "res_composite"), "mean"] = 0.0
    t.loc[(t.init == "random") & (t.variant == "skip") & (t.layer == 2), "mean"] = np.nan
    return t


def test_collapse_layers_draws_each_variants_mean_per_init():
    t = _layers_table()
    fig = plots.collapse_layers(t, {"source": "toy", "n_seqs": 8})
    assert len(fig.axes) == 2
    for ax, init in zip(fig.axes, ("pretrained", "random"), strict=True):
        lines = data_lines(ax)
        assert len(lines) == 2
        for line, variant in zip(lines, ("pure", "skip"), strict=True):
            s = t[(t.init == init) & (t.variant == variant) & (t.measure == "res_composite")].sort_values("layer")
            assert_line(line, s.layer, np.maximum(s["mean"], 1e-16))  # NaN kept: a gap; 0 at the floor
        assert ax.get_yscale() == "log" and ax.get_title() == f"{init} weights"
    assert xy(data_lines(fig.axes[0])[0])[1][-1] == 1e-16
    assert np.isnan(xy(data_lines(fig.axes[1])[1])[1][2])


def test_collapse_path_products_draws_path_shares_samples_and_means():
    summary = pd.DataFrame({"length": [0, 1, 2], "n_paths": [1, 12, 66], "mean": [1.9, 0.4, 0.0]})
    paths = pd.DataFrame({"length": [0, 1, 1, 2, 2], "residual": [1.9, 0.3, 0.5, 1e-3, 1e-5]})
    fig = plots.collapse_path_products(summary, {"n_layers": 2, "n_heads": 12}, paths)
    share, prod = fig.axes
    np.testing.assert_allclose([b.get_height() for b in share.patches], np.array([1, 12, 66]) / 79)
    np.testing.assert_allclose([b.get_x() + b.get_width() / 2 for b in share.patches], [0, 1, 2])
    (pts,) = scatters(prod)
    got = offsets(pts)
    np.testing.assert_allclose(got[:, 1], paths.residual)
    assert np.all(np.abs(got[:, 0] - paths.length) <= 0.15)
    geo, mean = data_lines(prod)
    assert_line(geo, [0, 1, 2], [1.9, np.sqrt(0.3 * 0.5), np.sqrt(1e-3 * 1e-5)])
    assert_line(mean, [0, 1, 2], [1.9, 0.4, 1e-17])  # an exact 0 at the floor
    assert prod.get_yscale() == "log"


def test_scale_tensor_deviations_place_each_tensor_on_its_row():
    t = pd.DataFrame({"name": ["a.weight", "b.weight", "c.weight"], "inv_dev": [1e-16, 0.3, 0.0],
                      "hom_dev": [0.5, np.nan, np.inf], "verdict": ["invariant", "neither", "homogeneous"],
                      "k": [np.nan, np.nan, 2.0]})
    fig = plots.scale_tensor_deviations(t, {"source": "toy", "tol": 1e-6, "scales": [0.5, 2]})
    ax = fig.axes[0]
    inv, hom = scatters(ax)
    rows = [2, 1, 0]  # the first tensor on top
    assert_points(inv, [1e-16, 0.3, 1e-17], rows)
    assert_points(hom, [0.5, np.nan, 1e3], rows)  # NaN: not drawn; inf: at 1e3
    assert ax.get_xscale() == "log" and ref_lines(ax, "x") == [1e-6]
    assert [tk.get_text() for tk in ax.get_yticklabels()] == ["a.weight  [invariant]", "b.weight  [neither]",
                                                               "c.weight  [homogeneous, k=2.00]"]
    colors = inv.get_facecolors()
    np.testing.assert_allclose(colors[2][:3], plt.matplotlib.colors.to_rgb("tab:blue"))


def test_scale_pair_deviations_draw_pair_and_control_per_layer():
    pairs = pd.DataFrame({"product": ["qk", "qk", "ov", "ov"], "layer": [0, 1, 0, 1],
                          "pair_dev": [1e-16, 0.0, 2e-16, 3e-16], "one_sided_dev": [0.2, 0.3, 0.4, np.nan]})
    fig = plots.scale_pair_deviations(pairs, {"source": "toy"})
    for ax, p in zip(fig.axes, ("qk", "ov"), strict=True):
        s = pairs[pairs["product"] == p]
        pair, one = scatters(ax)
        assert_points(pair, s.layer - 0.1, np.maximum(s.pair_dev, 1e-18))
        assert_points(one, s.layer + 0.1, s.one_sided_dev)
        assert ax.get_yscale() == "log"


def test_lam_colors_give_at_least_two_distinct_colours():
    assert len(plots.lam_colors(1)) == 2 and len(set(plots.lam_colors(4))) == 4
