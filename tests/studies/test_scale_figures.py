"""The scale figures draw the stored histories and summaries, read back from the artists."""

import numpy as np
import pytest

from headrank.studies.scale.figures import figures, scale_equilibrium, scale_training_curves
from headrank.studies.scale.params import ScaleParams
from headrank.studies.scale.summary import run_summary, summaries
from tests.figcheck import (
    assert_line,
    assert_points,
    data_lines,
    ref_lines,
    scatters,
)

VARIANTS = ("none", "post")


pytestmark = pytest.mark.usefixtures("quick_figures")  # tests/conftest.py


def _history(variant: str, optimizer: str = "sgd", lams=(0.0, 4e-3, 1.6e-2, 8e-3, 4e-3), seeds=(0, 0, 0, 1, 0),
             group=("grid", "grid", "grid", "grid", "product"), seed: int = 0) -> dict:
    """A batched history as the scale study stores it: (steps, runs, blocks) and (steps, runs) arrays."""
    rng = np.random.default_rng(seed)
    T, E, R, L = 12, 8, len(lams), 3
    step = np.arange(1, T + 1) * 20
    norm = 10.0 ** rng.uniform(-1, 1, (1, R, L)) * np.exp(-np.outer(step, lams))[:, :, None]
    h = {"step": step.tolist(), "norm": norm.tolist(), "eff_lr": (0.05 / norm**2).tolist(),
         "angle": rng.uniform(0.01, 0.02, (T, R, L)).tolist(), "loss": (10.0 ** -rng.uniform(0, 3, (T, R))).tolist(),
         "grad_sq": rng.uniform(1, 2, (T, R, L)).tolist(), "update_sq": rng.uniform(1, 2, (T, R, L)).tolist(),
         "cos_gw": rng.uniform(-0.1, 0.1, (T, R, L)).tolist(), "eval_step": np.arange(1, E + 1).tolist(),
         "lams": list(lams), "lrs": [0.05] * R, "seeds": list(seeds), "variant": variant, "optimizer": optimizer,
         "momentum": 0.9, "steps": int(step[-1]), "n_entries": [4096] * L}
    for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
        h[k] = rng.uniform(0.1, 1, (E, R)).tolist()
    if optimizer == "sgd":
        h["group"] = list(group)
    return h


def test_scale_training_curves_draw_the_first_seeds_grid_per_variant():
    runs = {v: _history(v, seed=i) for i, v in enumerate(VARIANTS)}
    fig = scale_training_curves(runs, VARIANTS, beta=0.9)
    axes = np.array(fig.axes).reshape(len(VARIANTS), 3)
    for i, v in enumerate(VARIANTS):
        r = {k: np.array(x) for k, x in runs[v].items()}
        cols = [0, 1, 2]  # grid runs of seed 0; the seed-1 run and the product run are not drawn
        for ax in axes[i]:
            assert len(data_lines(ax)) == len(cols) and ax.get_yscale() == "log"
        for n, j in enumerate(cols):
            assert_line(data_lines(axes[i, 0])[n], r["step"], r["norm"][:, j].mean(1))
            assert_line(data_lines(axes[i, 1])[n], r["step"], r["eff_lr"][:, j].mean(1))
            assert_line(data_lines(axes[i, 2])[n], r["step"], r["loss"][:, j])
        labels = [t.get_text() for t in axes[i, 0].get_legend().get_texts()]
        assert labels == ["λ = 0", "λ = 0.004", "λ = 0.016"]


def _row(lam, seed, angle_pred, angle, eq, tl, ta, group="grid"):
    return {"lam": lam, "seed": seed, "angle_pred": angle_pred, "angle": angle, "equilibrated": eq,
            "train_loss": tl, "test_acc": ta, "group": group}


def test_scale_equilibrium_draws_angles_seed_means_and_the_adamw_norms():
    summ = {"none": [_row(0.0, 0, None, 0.5, False, 0.1, 0.9), _row(0.0, 1, None, 0.5, False, 0.3, 0.7),
                     _row(1e-3, 0, 0.01, 0.012, True, 0.2, 0.8), _row(1e-3, 1, 0.01, 0.011, False, 0.4, 0.6),
                     _row(1e-2, 0, 0.03, 0.031, True, 0.5, 0.5), _row(5e-3, 0, 0.02, 0.5, True, 9.0, 0.1, "product")],
            "post": [_row(1e-3, 0, 0.01, 0.009, True, 0.05, 0.95)]}
    adamw = [{"lr": 0.01, "lam": lam, "norm": 3.0 * np.sqrt(0.01 / lam) * f, "equilibrated": eq}
             for lam, f, eq in ((0.3, 1.0, True), (1.0, 1.1, True), (3.0, 0.9, False))]
    fig = scale_equilibrium(summ, adamw, VARIANTS, beta=0.9)
    ang, loss, acc, norm = fig.axes
    pts = [c for c in scatters(ang) if len(c.get_offsets())]
    decayed = [r for v in VARIANTS for r in summ[v] if r["lam"] > 0]
    assert len(pts) == len(decayed)
    for c, r in zip(pts, decayed, strict=True):
        assert_points(c, [r["angle_pred"]], [r["angle"]])
        assert (c.get_facecolors().size > 0 and c.get_facecolors()[0][3] > 0) == r["equilibrated"]  # hollow: not
    (diag,) = data_lines(ang)
    assert_line(diag, [0.009, 0.5], [0.009, 0.5])
    # grid rows only, mean over seeds; λ = 0 is a dotted reference line, never a point at x = 0
    assert_line(data_lines(loss)[0], [np.nan, 1e-3, 1e-2], [0.2, 0.3, 0.5])
    assert_line(data_lines(acc)[0], [np.nan, 1e-3, 1e-2], [0.8, 0.7, 0.5])
    assert_line(data_lines(loss)[1], [1e-3], [0.05])
    np.testing.assert_allclose(ref_lines(loss), [0.2])
    np.testing.assert_allclose(ref_lines(acc), [0.8])
    eq, not_eq = scatters(norm)
    x = np.array([0.01 / 0.3, 0.01 / 1.0, 0.01 / 3.0])
    y = np.array([r["norm"] for r in adamw])
    assert_points(eq, x[:2], y[:2])
    assert_points(not_eq, x[2:], y[2:])
    ref = data_lines(norm)[0]
    k = np.exp(np.mean(np.log(y) - 0.5 * np.log(x)))
    assert_line(ref, np.geomspace(x.min(), x.max(), 10), k * np.sqrt(np.geomspace(x.min(), x.max(), 10)))
    for ax in (ang, norm):
        assert ax.get_xscale() == ax.get_yscale() == "log"
    assert loss.get_yscale() == "log" and acc.get_xscale() == "log"


def test_figures_draw_the_summaries_of_the_stored_runs():
    p = ScaleParams()
    data = {"runs": {v: _history(v, seed=i) for i, v in enumerate(VARIANTS)},
            "adamw": _history("none", "adamw", lams=(0.3, 1.0), seeds=(0, 0), seed=5)}
    out = figures(data, p)
    assert [f.name for f in out] == ["scale_curves", "scale_equilibrium"]
    summ = summaries(data, p.tail)
    pts = [c for c in scatters(out[1].figure.axes[0]) if len(c.get_offsets())]
    want = [(r["angle_pred"], r["angle"]) for v in VARIANTS for r in summ[v] if r["lam"] > 0]
    np.testing.assert_allclose([c.get_offsets()[0] for c in pts], want)
    asum = run_summary(data["adamw"], p.tail)
    got = np.concatenate([c.get_offsets() for c in scatters(out[1].figure.axes[3])])
    np.testing.assert_allclose(np.sort(got[:, 1]), np.sort([r["norm"] for r in asum]))
