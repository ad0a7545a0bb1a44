"""The collapse figures draw the stored curves and fits, read back from the artists."""

import numpy as np
import pytest

from headrank.studies.collapse.figures import (
    collapse_depth_sweep,
    collapse_heads,
    collapse_path_restricted,
    figures,
)
from headrank.studies.collapse.params import CollapseParams
from tests.figcheck import assert_line, data_lines, scatters

pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _sweep() -> dict:
    """depth_sweep as run stores it: exact means (a null where not exact) and the float64 means."""
    return {"depths": [0, 1, 2, 3, 4], "floor": 1e-12, "curves": {
        "0.2": {"log10_rel_mean": [-0.01, -0.9, -3.7, -12.0, -37.0],
                "log10_rel_float64_mean": [-0.01, -0.9, -3.7, -12.0, -15.9]},
        "0.5": {"log10_rel_mean": [-0.01, -0.05, None, -0.1, -0.3],
                "log10_rel_float64_mean": [-0.01, -0.05, -0.08, -0.1, -0.3]}}}


def test_depth_sweep_draws_exact_and_float64_curves_and_the_fit_over_the_window():
    sweep = _sweep()
    fits = {"SAN init std 0.2": {"window": [1, 4], "a (3^L)": 0.5, "b (3^L)": -0.5}, "SAN init std 0.5": {}}
    fig = collapse_depth_sweep(sweep, fits)
    ax = fig.axes[0]
    lines = data_lines(ax)
    assert len(lines) == 3 + 2  # 0.2: exact, float64, fit; 0.5: exact, float64 (no window)
    assert_line(lines[0], sweep["depths"], [0.01, 0.9, 3.7, 12.0, 37.0])
    assert_line(lines[1], sweep["depths"], [0.01, 0.9, 3.7, 12.0, 15.9])
    L = np.linspace(1, 4, 100)
    assert_line(lines[2], L, -(0.5 - 0.5 * 3.0**L))
    assert_line(lines[3], sweep["depths"], [0.01, 0.05, np.nan, 0.1, 0.3])  # null: a gap
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["init std 0.2", "init std 0.5"]


def test_heads_draws_the_rate_and_the_bounds_base_per_init_scale():
    measured = {"init std 0.2": {"mean rate by H": {"H=1": -1.0, "H=2": -1.2, "H=8": None},
                                 "bound's base log10(beta H / sqrt(d_qk)) by H": {"H=1": 0.1, "H=2": 0.4, "H=8": 1.2}},
                "judged": {}}
    ax = collapse_heads(measured).axes[0]
    rate, base = data_lines(ax)
    assert_line(rate, [1, 2, 8], [-1.0, -1.2, np.nan])
    assert_line(base, [1, 2, 8], [0.1, 0.4, 1.2])
    assert ax.get_xscale() == "log"


def test_path_restricted_draws_one_line_per_setting():
    curves = {"norm=none, init std 0.02": [0.97, 1.4e-5, 0.0], "norm=pre, init std 0.3": [0.97, 0.91, 0.78]}
    fig = collapse_path_restricted([0, 1, 2], curves)
    ax = fig.axes[0]
    for line, y in zip(data_lines(ax), curves.values(), strict=True):
        assert_line(line, [0, 1, 2], np.maximum(y, 1e-17))
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(curves)


def test_figures_draw_the_stored_tables():
    layers = [dict(init=i, variant=v, layer=k, measure="res_composite", mean=0.5 ** (k + 1), std=0.01, n=8)
              for i in ("pretrained", "random") for v in ("pure", "full") for k in range(3)]
    data = {"minilm_meta": {"source": "toy", "n_layers": 2, "n_heads": 3, "n_seqs": 8}, "layers": layers,
            "depth_sweep": _sweep(), "pure_fits": {i: {"n_fit": 2, "fit": {"fitted": False}} for i in ("pretrained", "random")},
            "path_products": [{"length": k, "n_paths": n, "mean": m, "std": 0.1, "samples": 4}
                              for k, n, m in ((0, 1, 1.9), (1, 6, 0.5), (2, 9, 0.1))],
            "paths": {"length": [0, 1, 2], "residual": [1.9, 0.5, 0.1]},
            "path_restricted": {"norm=none": {"geo_mean": [0.9, 0.1, 0.01]}}}
    out = figures(data, CollapseParams())
    assert [f.name for f in out] == ["collapse_layers", "depth_sweep", "path_products", "path_restricted"]
    first = data_lines(out[0].figure.axes[0])[0]
    assert_line(first, [0, 1, 2], [0.5, 0.25, 0.125])
    np.testing.assert_allclose([b.get_height() for b in out[2].figure.axes[0].patches], np.array([1, 6, 9]) / 16)
    assert len(scatters(out[2].figure.axes[1])) == 1  # the sampled paths
    assert_line(data_lines(out[3].figure.axes[0])[0], [0, 1, 2], [0.9, 0.1, 0.01])
    data["paths"] = {"length": [], "residual": []}
    out = figures(data, CollapseParams())
    assert not scatters(out[2].figure.axes[1])  # no samples: no dots
    from tests.studies.test_collapse import _heads

    data["heads_sweep"] = _heads()  # rates -1, -1.2, -1.5, -2 for H = 1, 2, 4, 8
    out = figures(data, CollapseParams())
    assert out[-1].name == "heads"
    assert_line(data_lines(out[-1].figure.axes[0])[0], [1, 2, 4, 8], [-1.0, -1.2, -1.5, -2.0])
