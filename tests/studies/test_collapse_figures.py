"""The collapse figures draw the stored curves and fits, read back from the artists."""

import numpy as np
import pytest

from headrank.studies.collapse.figures import (
    collapse_depth_sweep,
    collapse_path_restricted,
    figures,
)
from headrank.studies.collapse.params import CollapseParams
from tests.figcheck import assert_line, data_lines, ref_lines, scatters

pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _sweep() -> dict:
    """depth_sweep as run stores it: one fitted and one unfitted init scale; an exact 0 and a null."""
    depths = [0, 1, 2, 3, 4]
    fitted = {"n_points": 4, "fitted": True, "exp": {"a": 1.0, "b": -8.0, "r2": 0.8},
              "dexp": {"a": 0.5, "b": -1.2, "kappa": 2.8, "r2": 0.99}}
    return {"depths": depths, "floor": 1e-12, "curves": {
        "0.2": {"geo_mean": [0.97, 0.14, 1.9e-4, 1e-12, 0.0], "n_fit": 4, "fit": fitted},
        "0.5": {"geo_mean": [0.97, 0.89, None, 0.83, 0.8], "n_fit": 5, "fit": {"n_points": 5, "fitted": False}}}}


def test_depth_sweep_draws_each_curve_and_its_two_fits():
    sweep = _sweep()
    fig = collapse_depth_sweep(sweep)
    ax = fig.axes[0]
    lines = data_lines(ax)
    assert len(lines) == 3 + 1  # fitted: data, doubly exponential, exponential; unfitted: data
    assert_line(lines[0], sweep["depths"], [0.97, 0.14, 1.9e-4, 1e-12, 1e-17])  # exact 0 at the floor
    L = np.linspace(0, 3, 100)
    assert_line(lines[1], L, np.exp(0.5 - 1.2 * 2.8**L))
    assert_line(lines[2], L, np.exp(1.0 - 8.0 * L))
    assert_line(lines[3], sweep["depths"], [0.97, 0.89, np.nan, 0.83, 0.8])  # null: a gap
    assert ref_lines(ax) == [1e-12]
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] == 1e-17
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == ["init std 0.2", "init std 0.5"]


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
            "depth_sweep": _sweep(),
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
