"""The spectra figures: what they show, and the separate process that draws them."""

import numpy as np
import pytest
from PIL import Image

from headrank.analysis import plots
from headrank.analysis.figproc import FigureProcess, display_name, figure_data
from headrank.analysis.scan import analyze, save


@pytest.fixture(scope="module")
def two_layers():
    return analyze("minilm", layers="0-1")


def test_figure_data_is_the_table(two_layers):
    """Each (layers, heads) grid is the table's column, layer by layer; row norms are head 0's."""
    data = figure_data(two_layers)
    t = two_layers.table
    for product in ("qk", "ov"):
        for col in ("effective_rank", "nuclear", "rank"):
            want = t[(t["product"] == product) & (t["layer"] == 1)].sort_values("head")[col].to_numpy(float)
            np.testing.assert_array_equal(data[f"{product}_{col}"][1], want)
    np.testing.assert_array_equal(data["rows_q"], two_layers.row_norms["q"][:, 0, :])
    assert data["name"] == "minilm" and list(data["layers"]) == [0, 1]


def test_display_name_is_never_an_absolute_path():
    assert display_name({"input": "directory", "source": "/data/models/llama-7b"}) == "llama-7b"
    assert display_name({"input": "trainer", "source": "/x/runs/lm/checkpoint-500"}) == "lm/checkpoint-500"
    assert display_name({"input": "hub", "source": "EleutherAI/pythia-70m"}) == "EleutherAI/pythia-70m"


def _grid_data(L=3, H=4, dh=8, rank_flat=True, eff_flat=False):
    rng = np.random.default_rng(0)
    sv = np.sort(rng.uniform(0.1, 1, (L, H, dh)), -1)[..., ::-1]
    data = {"layers": np.arange(L), "name": "toy", "tol": 1e-3, "head_dim": dh, "sv_qk": sv, "sv_ov": sv}
    for p in ("qk", "ov"):
        data[f"{p}_nuclear"] = sv.sum(-1)
        data[f"{p}_frob_bound"] = sv.sum(-1) * 1.1
        data[f"{p}_finite"] = np.ones((L, H))
        data[f"{p}_effective_rank"] = np.full((L, H), 7.5) if eff_flat else rng.uniform(3, 8, (L, H))
        data[f"{p}_k90"] = np.full((L, H), 6.0)
        data[f"{p}_rank"] = np.full((L, H), float(dh)) if rank_flat else rng.integers(1, dh, (L, H)).astype(float)
    for r in "qkvp":
        data[f"rows_{r}"] = rng.uniform(0.5, 2, (L, dh))
    return data


def test_heatmap_leads_with_what_moves_and_drops_flat_panels():
    fig = plots.rank_heatmaps(_grid_data())
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 2 and all(t.startswith("effective rank") for t in titles)  # k90, rank: flat
    plots.plt.close(fig)
    fig = plots.rank_heatmaps(_grid_data(rank_flat=False))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert [t.split(" of ")[0] for t in titles] == ["effective rank"] * 2 + ["numerical rank"] * 2
    plots.plt.close(fig)
    assert plots.rank_heatmaps(_grid_data(eff_flat=True)) is None  # nothing moves: no figure


def test_one_panel_flat_is_text_not_a_solid_square():
    data = _grid_data(rank_flat=False)
    data["ov_rank"] = np.full((3, 4), 8.0)
    fig = plots.rank_heatmaps(data)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("every head 8 (of 8)" in t for t in texts)
    plots.plt.close(fig)


def test_multi_layer_figures_carry_a_layer_key(tmp_path):
    written = plots.draw_spectra(_grid_data(), tmp_path)
    assert [p.name for p in written] == ["singular_values.png", "rank_heatmap.png", "fig4_norms.png",
                                         "fig4_rows.png"]
    fig = plots.sv_curves(_grid_data())
    assert any(ax.get_ylabel() == "layer" for ax in fig.axes)  # the colour bar
    plots.plt.close(fig)


@pytest.mark.slow
def test_child_process_draws_what_the_parent_would(tmp_path, two_layers):
    """The CLI's figure process writes the same files, and the same pixels, as drawing in-process."""
    child, here = tmp_path / "child", tmp_path / "here"
    child.mkdir()
    proc = FigureProcess()
    assert proc.submit(figure_data(two_layers), child)
    got = proc.wait()  # None would mean the child failed
    assert got is not None and proc.proc is None
    save(two_layers, here)
    pngs = sorted(p.name for p in got)
    assert pngs == sorted(p.name for p in here.glob("*.png")) and len(pngs) == 4
    for name in pngs:
        assert np.array_equal(np.asarray(Image.open(child / name)), np.asarray(Image.open(here / name))), name


def test_a_failed_child_is_drawn_in_process(tmp_path, two_layers):
    proc = FigureProcess()
    proc.proc.kill()
    proc.proc.wait()
    got = save(two_layers, tmp_path, figures=proc)
    assert {"rank_heatmap.png", "singular_values.png"} <= {p.name for p in got}
    assert all(p.exists() for p in got)


def test_no_plots_stops_the_child(tmp_path, two_layers):
    proc = FigureProcess()
    child = proc.proc
    got = save(two_layers, tmp_path, plots=False, figures=proc)
    assert not [p for p in got if p.suffix == ".png"] and child.poll() is not None
