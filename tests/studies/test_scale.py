"""Reproduction 'scale': each claim function on small synthetic data, both ways; the quick
profile end to end, and its replot."""

import json

import pytest

from attnrank.studies.scale import claims as C
from attnrank.studies.scale.params import ScaleParams

P = ScaleParams.quick()


def _row(v, lam, **kw):
    base = {"variant": v, "optimizer": "sgd", "lam": lam, "lr": 0.05, "seed": 0, "group": "grid", "norm": 1.0,
            "eff_lr": 0.05, "cos_gw_max": 1e-7, "train_loss": 0.1, "test_acc": 0.9}
    return {**base, **kw}


def test_params_profiles_are_frozen_tuples():
    q, f = ScaleParams.quick(), ScaleParams.full()
    assert isinstance(q.lams, tuple) and isinstance(f.adamw_grid[0], tuple)
    assert q.steps < f.steps
    with pytest.raises(AttributeError):
        q.steps = 1


def test_shrink_claims_both_ways():
    good = {"rel_change_eps0": 1e-16, "rel_change_eps": 1e-4, "loss": 0.1, "rel_change_eps_all_runs_max": 1e-3}
    bad = {**good, "rel_change_eps0": 1e-3}
    assert C.shrink_free({"none": good}, "none", P).held
    assert not C.shrink_free({"none": bad}, "none", P).held
    assert C.shrink_costly_pre({"pre": {**good, "rel_change_eps0": 0.5}}, P).held
    assert not C.shrink_costly_pre({"pre": good}, P).held


def test_gradient_orthogonal_both_ways():
    summ = {"none": [_row("none", 0.0)], "post": [_row("post", 0.0)], "pre": [_row("pre", 0.0, cos_gw_max=0.03)]}
    assert C.gradient_orthogonal(summ).held
    summ["none"] = [_row("none", 0.0, cos_gw_max=1e-2)]
    assert not C.gradient_orthogonal(summ).held


def test_norm_and_effective_lr_both_ways():
    rows = [_row("none", lam, norm=n, eff_lr=0.05 / n**2) for lam, n in ((0.0, 10.0), (1e-3, 5.0), (1e-2, 2.0))]
    summ = {"none": rows, "pre": rows}
    assert C.norm_and_effective_lr(summ, "none").held
    rows[2]["norm"], rows[2]["eff_lr"] = 6.0, 0.05 / 36
    assert not C.norm_and_effective_lr(summ, "none").held


def _product_rows(v, losses):
    return [_row(v, lam, lr=e, group="product", train_loss=x) for (e, lam), x in zip(P.product, losses, strict=True)]


def test_lambda_only_through_product_both_ways():
    summ = {"none": _product_rows("none", (0.1, 0.1, 0.105)), "post": _product_rows("post", (0.1, 0.102, 0.1)),
            "pre": _product_rows("pre", (0.1, 0.2, 0.4))}
    assert C.lambda_only_through_product(summ, P).held
    summ["none"] = _product_rows("none", (0.1, 0.2, 0.3))
    assert not C.lambda_only_through_product(summ, P).held


def _adamw_rows(norms):
    out = []
    for (e, lam), n in zip(P.adamw_grid, norms, strict=True):
        out.append({"lr": e, "lam": lam, "norm": n, "equilibrated": True, "norm_ratio": 1.0, "angle_ratio": 1.0,
                    "angle_over_sqrt_2_eta_lam": 0.3})
    return out


def test_adamw_norm_scaling_both_ways():
    good = [(e / lam) ** 0.5 for e, lam in P.adamw_grid]
    assert C.adamw_norm_scaling(_adamw_rows(good)).held
    assert not C.adamw_norm_scaling(_adamw_rows([(e / lam) ** 0.25 for e, lam in P.adamw_grid])).held


def test_verdicts_trained_both_ways():
    def v(x):
        return {"verdicts": {"W.0": x, "W.1": x}, "inv_dev_max": 0.0, "inv_dev_eps_max": None, "scales": [0.3]}

    assert C.verdicts_trained({"none": v("invariant"), "post": v("invariant"), "pre": v("neither")}).held
    assert not C.verdicts_trained({"none": v("invariant"), "post": v("neither"), "pre": v("neither")}).held


@pytest.mark.slow
def test_reproduction_quick_and_replot(tmp_path):
    from attnrank.report import runner as rep

    s = rep.run("scale", tmp_path, quick=True)
    claims = {c.name: c for c in s.claims}
    # exact consequences of the architecture: these must hold whatever the training did
    for name in ("scale.shrink_free_none", "scale.shrink_free_post", "scale.shrink_costly_pre",
                 "scale.verdicts_trained"):
        assert claims[name].held, (name, claims[name].measured)
    for c in s.claims:  # every claim carries numbers
        assert c.measured is not None and c.expected is not None
    data = json.loads((tmp_path / "data.json").read_text())
    for v in ("none", "post", "pre"):
        runs = data["runs"][v]
        assert len(runs["norm"][0][0]) == P.depth and len(runs["step"]) == len(runs["norm"])
    assert (tmp_path / "scale_curves.png").exists() and (tmp_path / "scale_equilibrium.png").exists()
    before = (tmp_path / "claims.json").read_text()
    rep.run("scale", tmp_path, replot=True)
    assert (tmp_path / "claims.json").read_text() == before
