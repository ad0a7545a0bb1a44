"""The collapse reproduction: each claim on small synthetic data, both ways; the quick run and
its replot end to end (slow)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import math

import pytest

from headrank.studies.collapse.params import CollapseParams

K = importlib.import_module("headrank.studies.collapse.claims")  # the package exports a function of that name

P = CollapseParams.quick()


def _summary(pure=1e-16, mlp=1e-12, skip=0.7, full=0.85):
    rows = []
    for init in ("pretrained", "random"):
        for v, last in (("pure", pure), ("mlp", mlp), ("skip", skip), ("full", full)):
            rows.append({"init": init, "variant": v, "first": 1.0, "first_std": 0.1, "last": last,
                         "last_std": 0.1, "last_over_first": last})
    return rows


def _fit(r2_exp, r2_dexp, r2_3):
    return {"fitted": True, "n_points": 6, "exp": {"r2": r2_exp}, "dexp": {"r2": r2_dexp, "kappa": 2.5},
            "dexp3": {"r2": r2_3}}


def _curves(last: float, spread: float = 0.05, seqs: int = 3) -> list[list[float]]:
    """Per-sentence residual by layer: from 1 down to about ``last`` (varying by ± spread)."""
    return [[1.0, 0.9, 0.8, last * (1 + spread * (s - 1))] for s in range(seqs)]


def _by_seq(pure=1e-16, mlp=1e-12, skip=0.7, full=0.85, spread=0.05):
    out = {}
    for i in ("pretrained", "random"):
        for v, last in (("skip", skip), ("full", full)):
            out[f"{i}/{v}"] = _curves(last, spread)
        out[f"{i}/pure"] = [[1.0, 1e-1, 1e-3, 1e-7, 1e-15, 1e-16, pure]] * 3
        out[f"{i}/mlp"] = [[1.0, 2e-1, 1e-2, 1e-5, 1e-9, 1e-12, mlp]] * 3
    return out


def _sweep_bound(rows=((0.0, -1.0, -4.0, -13.0),) * 2, beta=0.25):
    """Two seeds x len(rows) sequences: log10 |res| (norm 1, so relative = absolute). With beta
    0.25, H = 1, d_qk = 16: log10 c = log10(0.25) at gamma = 1; rhs -0.602, -2.41 at depths 1, 2."""
    a = [list(r) for r in rows] * 2
    return {"log10_abs_res": a, "log10_rel_res": a, "beta_by_seed": [[beta] * 3] * 2, "heads": 1, "d_qk": 16}


def _minilm_bound(lips=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0), shift=0.0):
    """log10 |res| of the pure variant (norm 1): with beta 0.5, H 1, d_qk 16 (log10 c = -0.301 at
    gamma = 1) the bound holds at depths 1-3 (rhs -0.30, -1.20, -3.91); depths 4-6 are at the floor."""
    rows = [[0.0, -1.0, -3.0, -4.0, -15.0, -16.0, -16.0]] * 3
    return {"beta_by_layer": [0.5] * 6, "mlp_lipschitz_by_layer": [x + shift for x in lips],
            "activation_lipschitz": 1.1289, "heads": 1, "d_qk": 16, "log10_res_pure": rows,
            "log10_norm_pure": [[0.0] * 7] * 3}


def _data():
    """Synthetic data shaped like experiment.run's, where every claim holds (the stated bound
    with gamma = 1; without a gamma it is inconclusive)."""
    seqs = 3
    by_seq = _by_seq()
    curve = {"geo_mean": [1.0, 0.1, 1e-3], "n_fit": 6, "fit": _fit(0.8, 0.99, 0.97), "bound": _sweep_bound()}
    restricted = {"norm=none, init std 0.02": {"geo_mean": [1.0, 1e-5, 1e-11, 1e-16, 1e-16],
                                               "sum_rel_error": 1e-15, "spearman_k_vs_log_residual": -1.0,
                                               "norm_share_by_k": [[0.4, 0.3, 0.2, 0.07, 0.03],
                                                                   [0.5, 0.3, 0.1, 0.07, 0.03],
                                                                   [0.45, 0.3, 0.15, 0.07, 0.03]]},
                  "norm=pre, init std 0.02": {"geo_mean": [1.0, 0.9, 0.95, 0.9, 0.9],
                                              "sum_rel_error": 2e-15, "spearman_k_vs_log_residual": -0.2}}
    return {
        "summary": _summary(), "primary_by_seq": by_seq,
        "pure_fits": {"pretrained": {"n_fit": 6, "fit": _fit(0.7, 0.98, 0.96)},
                      "random": {"n_fit": 2, "fit": {"n_points": 2, "fitted": False}}},
        "depth_sweep": {"seeds": [0, 1], "n_seqs": 8, "curves": {"0.3": curve}},
        "path_products": [{"length": k, "n_paths": 1, "mean": m, "std": 0.0, "samples": 1}
                          for k, m in enumerate([1.9, 0.6, 0.2, 0.09])],
        "path_restricted": restricted,
        "path_enumeration": [{"layers": 2, "heads": 2, "counts": [1, 4, 4]},
                             {"layers": 3, "heads": 1, "counts": [1, 3, 3, 1]}],
        "minilm_meta": {"n_seqs": seqs},
        "bound": {"minilm": {"pretrained": _minilm_bound(), "random": _minilm_bound(shift=0.5)}},
        "mlp_dose": _dose(),
    }


def _dose(slope=1.0, floor_at=None):
    """log10 residual per init std and MLP scale at depths 0..6: rising with log2(scale) by
    ``slope`` per doubling at every depth (depth d: -1.5 d + slope log2 s); ``floor_at``: scales at
    or below it sit at -15 (below the float64 floor)."""
    scales = P.dose_scales
    cells = {f"{std:g}": {f"{sc:g}": [(-15.0 if floor_at is not None and sc <= floor_at else
                                       -1.5 * d + slope * math.log2(sc) * (d > 0)) for d in range(7)]
                          for sc in scales} for std in P.dose_init_stds}
    return {"scales": list(scales), "init_stds": list(P.dose_init_stds), "seeds": [0, 1], "depths": list(range(7)),
            "log10_res": cells}


P1 = dataclasses.replace(P, bound_log10_gamma=0.0)  # gamma = 1, for the bound's logic only


def _by_name(data, p=P):
    return {c.name: c for c in K.claims(json.loads(json.dumps(data)), p)}


def test_all_hold_on_collapsing_data():
    by = _by_name(_data(), P1)
    assert list(by) == ["collapse.pure_attention", "collapse.skip_prevents", "collapse.mlp_slows",
                        "collapse.mlp_does_not_prevent", "collapse.doubly_exponential", "collapse.stated_bound",
                        "collapse.mlp_lipschitz", "collapse.path_products", "collapse.path_restricted",
                        "collapse.short_paths", "collapse.path_sum_exact", "collapse.path_counts"]
    assert all(c.verdict == "held" for c in by.values()), {n: c.measured for n, c in by.items() if not c.held}
    assert [n for n, c in by.items() if c.kind == "identity"] == ["collapse.path_sum_exact", "collapse.path_counts"]


def test_measured_values_are_those_of_the_data():
    """Every claim's numbers, worked out here from the synthetic data (not read from the claims)."""
    import math

    from scipy import stats

    by = _by_name(_data())
    pure = by["collapse.pure_attention"].measured["random/pure"]
    assert pure["per-sentence last/first"] == pytest.approx(1e-16) and pure["spread"] == 0.0
    assert pure["last/first"] == pytest.approx(1e-16) and pure["first"] == 1.0
    skip = by["collapse.skip_prevents"].measured["pretrained/skip"]  # last 0.665, 0.7, 0.735 over first 1
    lasts = [0.7 * (1 + 0.05 * (s - 1)) for s in range(3)]
    se = math.sqrt(sum((x - 0.7) ** 2 for x in lasts) / 2) / math.sqrt(3)
    assert skip["per-sentence last/first"] == pytest.approx(0.7)
    assert skip["spread"] == pytest.approx(stats.t.ppf(0.975, 2) * se, rel=1e-12)
    mlp = by["collapse.mlp_slows"].measured["random"]  # layers 1-3 above the floor: mlp/pure = 2, 10, 100
    assert mlp["mean log10(mlp/pure)"] == pytest.approx((math.log10(2) + 1 + 2) / 3)
    assert mlp["layer 1"] == pytest.approx(math.log10(2)) and mlp["spread over sentences"] == pytest.approx(0, abs=1e-12)
    assert by["collapse.mlp_does_not_prevent"].measured["pretrained/mlp"]["per-sentence last/first"] == pytest.approx(1e-12)
    fits = by["collapse.doubly_exponential"].measured
    assert fits["SAN init std 0.3"] == {"points": 6, "R2 exp": 0.8, "R2 dexp": 0.99, "kappa": 2.5, "R2 dexp kappa=3": 0.97}
    assert fits["judged"] == ["MiniLM pretrained pure", "SAN init std 0.3"] and fits["not judged"] == {}
    assert fits["MiniLM random pure"] == {"points": 2, "fitted": False}
    assert by["collapse.path_products"].measured == {"k=0": 1.9, "k=1": 0.6, "k=2": 0.2, "k=3": 0.09}
    short = by["collapse.short_paths"].measured["norm=none, init std 0.02"]  # k <= 2 carry 0.9 in each row
    assert short["share of paths k <= L/2"] == pytest.approx(0.9) and short["spread"] == pytest.approx(0, abs=1e-12)
    assert by["collapse.path_sum_exact"].measured == 2e-15  # the larger of the two settings' errors
    counts = by["collapse.path_counts"].measured
    # path length of L=6, H=12: binomial(6, 12/13) (each layer: skip or one of 12 heads), mean 6 * 12/13
    assert counts["brute-force configs agreeing"] == 2 and counts["sums equal (H+1)^L for the table"] is True
    assert counts["mean path length MiniLM (L=6, H=12)"] == pytest.approx(6 * 12 / 13)


def test_stated_bound_is_inconclusive_without_gamma_and_reports_where_it_turns():
    c = _by_name(_data())["collapse.stated_bound"]
    assert c.verdict == "inconclusive" and "not defined" in c.reason
    san = c.measured["SAN init std 0.3"]
    # depth 1: needs log10 c >= -1 (c = 0.25 gamma); depth 2: 4 log10 c >= -4; depth 3 is at the floor
    assert san["judged depths"] == [1, 2] and san["log10 gamma needed"] == pytest.approx(-1 - math.log10(0.25))
    assert san["log10 gamma vacuous (every input)"] == pytest.approx(-math.log10(0.25))
    assert c.measured["MiniLM pretrained pure (LayerNorm kept)"]["judged depths"] == [1, 2, 3]


def test_stated_bound_holds_with_gamma_one_and_fails_on_a_counterexample():
    d = _data()
    c = _by_name(d, P1)["collapse.stated_bound"]
    assert c.verdict == "held" and "vacuous" not in c.reason
    d["depth_sweep"]["curves"]["0.3"]["bound"] = _sweep_bound(rows=((0.0, -1.0, -2.0, -13.0),) * 2)  # -2 > -2.41
    c = _by_name(d, P1)["collapse.stated_bound"]
    assert c.verdict == "not held" and "SAN init std 0.3" in c.reason and "depths 2" in c.reason
    big = dataclasses.replace(P, bound_log10_gamma=3.0)  # c = 250 > 1: the bound is trivially true
    c = _by_name(d, big)["collapse.stated_bound"]
    assert c.verdict == "held" and "vacuous at depths 1, 2" in c.reason
    del d["bound"]
    del d["depth_sweep"]["curves"]["0.3"]["bound"]
    assert "older run" in _by_name(d)["collapse.stated_bound"].reason


def test_mlp_lipschitz_is_a_dose_response_judged_both_ways():
    from scipy import stats

    c = _by_name(_data())["collapse.mlp_lipschitz"]
    cell = c.measured["cells"]["init std 0.2, depth 3"]  # -4.5 + log2(s): strictly rising in s
    assert cell["log10 residual"] == pytest.approx([-4.5 + math.log2(s) for s in P.dose_scales])
    want = stats.spearmanr(P.dose_scales, cell["log10 residual"], alternative="greater").pvalue
    assert cell["rho"] == pytest.approx(1.0) and cell["p_greater"] == pytest.approx(want)
    assert c.verdict == "held" and len(c.measured["judged"]) == len(P.dose_init_stds) * len(P.dose_depths)
    d = _data()
    d["mlp_dose"] = _dose(slope=-1.0)  # the residual falls as the MLPs grow: a significant reversal
    assert _by_name(d)["collapse.mlp_lipschitz"].verdict == "not held"
    d["mlp_dose"] = _dose(slope=0.0)  # no change at all: no verdict either way
    c = _by_name(d)["collapse.mlp_lipschitz"]
    assert c.verdict == "inconclusive" and "no (init, depth) cell" in c.reason
    d["mlp_dose"] = _dose(floor_at=1.0)  # three scales left above the floor (need 5): nothing judged
    c = _by_name(d)["collapse.mlp_lipschitz"]
    assert c.verdict == "inconclusive" and c.measured["judged"] == {}
    del d["mlp_dose"]
    assert "older run" in _by_name(d)["collapse.mlp_lipschitz"].reason
    pts = _by_name(_data())["collapse.mlp_lipschitz"].measured["minilm_layers"]["points"]  # reported, not judged
    assert [q["slowing (log10)"] for q in pts[:3]] == pytest.approx([math.log10(2), 2 - math.log10(20), 1])


def test_short_paths_both_ways_and_without_data():
    d = _data()
    assert _by_name(d)["collapse.short_paths"].verdict == "held"  # k <= 2 carry 0.9 of the norm
    d["path_restricted"]["norm=none, init std 0.02"]["norm_share_by_k"] = [[0.05, 0.05, 0.1, 0.3, 0.5]] * 2 + \
        [[0.06, 0.05, 0.1, 0.3, 0.49]]
    assert _by_name(d)["collapse.short_paths"].verdict == "not held"
    del d["path_restricted"]["norm=none, init std 0.02"]["norm_share_by_k"]
    c = _by_name(d)["collapse.short_paths"]
    assert c.verdict == "inconclusive" and "older run" in c.reason


def test_pure_attention_and_mlp_collapse_fail_without_collapse():
    d = _data()
    d["summary"] = _summary(pure=0.5, mlp=0.05)
    d["primary_by_seq"] = _by_seq(pure=0.5, mlp=0.05)
    by = _by_name(d)
    assert by["collapse.pure_attention"].verdict == "not held"
    assert by["collapse.mlp_does_not_prevent"].verdict == "not held"


def test_skip_prevents_fails_when_skips_collapse():
    d = _data()
    d["primary_by_seq"] = _by_seq(skip=0.1)
    c = _by_name(d)["collapse.skip_prevents"]
    assert c.verdict == "not held" and "pretrained/skip" in c.reason


def test_skip_prevents_inconclusive_when_the_spread_straddles_the_threshold():
    d = _data()
    d["primary_by_seq"] = _by_seq(skip=0.52, spread=0.5)  # per sentence 0.26, 0.52, 0.78
    c = _by_name(d)["collapse.skip_prevents"]
    assert c.verdict == "inconclusive" and "inconclusive for" in c.reason
    assert c.measured["random/skip"]["spread"] > 0.02


def test_mlp_slows_fails_when_mlp_is_lower():
    d = _data()
    pure, mlp = d["primary_by_seq"]["random/pure"], d["primary_by_seq"]["random/mlp"]
    d["primary_by_seq"]["random/pure"], d["primary_by_seq"]["random/mlp"] = mlp, pure
    c = _by_name(d)["collapse.mlp_slows"]
    assert c.verdict == "not held" and c.measured["random"]["mean log10(mlp/pure)"] < 0


def test_mlp_slows_judges_only_layers_above_the_floor():
    d = _data()
    c = _by_name(d)["collapse.mlp_slows"]
    assert set(c.measured["pretrained"]) == {"mean log10(mlp/pure)", "spread over sentences", "layer 1", "layer 2",
                                             "layer 3"}


def test_mlp_slows_inconclusive_inside_the_spread_and_without_layers():
    d = _data()
    for i in ("pretrained", "random"):  # sentence 0: MLP higher, sentence 1: lower, sentence 2: equal
        pure = d["primary_by_seq"][f"{i}/pure"] = [[1.0, 1e-1, 1e-3] for _ in range(3)]
        d["primary_by_seq"][f"{i}/mlp"] = [[1.0, 2e-1, 2e-3], [1.0, 0.5e-1, 0.5e-3], pure[2]]
    c = _by_name(d)["collapse.mlp_slows"]
    assert c.verdict == "inconclusive"
    for i in ("pretrained", "random"):
        d["primary_by_seq"][f"{i}/pure"] = [[1.0, 1e-16, 1e-16]] * 3
    c = _by_name(d)["collapse.mlp_slows"]
    assert c.verdict == "inconclusive" and "no layer above the floor" in c.reason


def test_doubly_exponential_fails_when_the_exponential_fits_better():
    d = _data()
    d["depth_sweep"]["curves"]["0.3"]["fit"] = _fit(0.99, 0.99, 0.90)
    c = _by_name(d)["collapse.doubly_exponential"]
    assert c.verdict == "not held" and "SAN init std 0.3" in c.reason
    d = _data()
    d["pure_fits"]["pretrained"]["fit"] = _fit(0.5, 0.90, 0.89)  # R2 below 0.95
    assert _by_name(d)["collapse.doubly_exponential"].verdict == "not held"


def test_doubly_exponential_is_judged_only_where_the_stated_bound_is_not_vacuous():
    d = _data()
    d["depth_sweep"]["curves"]["0.3"]["fit"] = _fit(0.99, 0.99, 0.90)  # fails the 3^L rule ...
    # ... but there the bound is vacuous: log10 gamma needed at depth L minus log10 gamma vacuous is
    # 2 (r_L - r_0) / (3^L - 1) (log10 residuals), > 0 once a residual exceeds the input's (depth 1: 0.3 > 0)
    d["depth_sweep"]["curves"]["0.3"]["bound"] = _sweep_bound(rows=((0.0, 0.3, -4.0, -13.0),) * 2)
    c = _by_name(d)["collapse.doubly_exponential"]
    assert c.measured["not judged"] == {"SAN init std 0.3": "bound vacuous"}
    assert c.verdict == "held" and c.measured["judged"] == ["MiniLM pretrained pure"]
    del d["depth_sweep"]["curves"]["0.3"]["bound"]  # an older run: no bound, the curve is not judged either
    assert _by_name(d)["collapse.doubly_exponential"].measured["not judged"] == {"SAN init std 0.3": "no bound data"}


def test_doubly_exponential_inconclusive_when_nothing_can_be_fitted():
    d = _data()
    d["depth_sweep"]["curves"]["0.3"]["fit"] = {"n_points": 2, "fitted": False}
    d["pure_fits"]["pretrained"]["fit"] = {"n_points": 3, "fitted": False}
    c = _by_name(d)["collapse.doubly_exponential"]
    assert c.verdict == "inconclusive" and c.reason


def test_path_products_fails_when_not_decreasing():
    d = _data()
    d["path_products"][2]["mean"] = 0.7
    assert _by_name(d)["collapse.path_products"].verdict == "not held"


def test_path_restricted_judges_norm_free_rows_only():
    d = _data()
    d["path_restricted"]["norm=pre, init std 0.02"]["geo_mean"] = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert _by_name(d)["collapse.path_restricted"].verdict == "held"
    d["path_restricted"]["norm=none, init std 0.02"]["geo_mean"] = [1.0, 0.5, 0.6, 0.1, 0.01]
    assert _by_name(d)["collapse.path_restricted"].verdict == "not held"


def test_path_sum_and_counts_fail_on_a_bug():
    d = _data()
    d["path_restricted"]["norm=pre, init std 0.02"]["sum_rel_error"] = 1e-6
    d["path_enumeration"][0]["counts"] = [1, 4, 3]
    by = _by_name(d)
    assert by["collapse.path_sum_exact"].verdict == "not held" and by["collapse.path_sum_exact"].kind == "identity"
    assert by["collapse.path_counts"].verdict == "not held" and by["collapse.path_counts"].kind == "identity"
    d2 = copy.deepcopy(_data())
    d2["path_restricted"]["norm=none, init std 0.02"]["sum_rel_error"] = None  # NaN read back from JSON
    assert _by_name(d2)["collapse.path_sum_exact"].verdict == "not held"


def test_side_and_combine():
    assert K.side(0.1, 0.05, 0.5, below=True) == "held" and K.side(0.9, 0.05, 0.5, below=True) == "not held"
    assert K.side(0.5, 0.1, 0.5, below=False) == "inconclusive" and K.side(float("nan"), 0, 1, True) == "inconclusive"
    assert K.combine_reason({"a": "held", "b": "inconclusive"})[0] == "inconclusive"
    assert K.combine_reason({"a": "not held", "b": "inconclusive"}) == ("not held", "not held for: a")


def test_strictly_decreasing_to_floor():
    f = K.strictly_decreasing_to_floor
    assert f([1.0, 0.5, 1e-13, 1e-12], 1e-12) and f([3.0, 2.0, 1.0], 1e-12)
    assert not f([1.0, 1.0, 0.5], 1e-12) and not f([1.0, None, 0.5], 1e-12)


def test_params_profiles_are_frozen_tuples():
    q, full = CollapseParams.quick(), CollapseParams.full()
    assert q.n_seqs < full.n_seqs and isinstance(q.sweep_seeds, tuple)
    with pytest.raises(AttributeError):
        q.n_seqs = 3  # type: ignore[misc]


def measured_from_data(measured, data):
    """The numbers a run's claims report, worked out here from its data.json with numpy."""
    import math

    import numpy as np

    for name, variants in (("pure_attention", ["pure"]), ("skip_prevents", ["skip", "full"]),
                           ("mlp_does_not_prevent", ["mlp"])):
        for key in (f"{i}/{v}" for i in ("pretrained", "random") for v in variants):
            rows = np.asarray(data["primary_by_seq"][key], dtype=float)
            got = measured[f"collapse.{name}"][key]["per-sentence last/first"]
            assert got == pytest.approx(float(np.mean(rows[:, -1] / rows[:, 0])), rel=1e-12), (name, key)
    assert measured["collapse.path_products"] == {f"k={r['length']}": r["mean"] for r in data["path_products"]}
    restricted = data["path_restricted"]
    assert measured["collapse.path_sum_exact"] == max(v["sum_rel_error"] for v in restricted.values())
    for k, v in restricted.items():
        if k.startswith("norm=none"):
            share = np.asarray(v["norm_share_by_k"], dtype=float)
            want = share[:, : (share.shape[1] - 1) // 2 + 1].sum(1).mean()
            assert measured["collapse.short_paths"][k]["share of paths k <= L/2"] == pytest.approx(want, rel=1e-12)
    for r in data["path_enumeration"]:  # C(L, k) H^k paths of length k: counted here, not by the package
        assert r["counts"] == [math.comb(r["layers"], k) * r["heads"] ** k for k in range(r["layers"] + 1)]
    geo = {k: np.exp(np.log(np.maximum(np.asarray(v, float), 1e-300)).mean(0)) for k, v in data["primary_by_seq"].items()}
    lip = measured["collapse.mlp_lipschitz"]
    for cell in lip["cells"].values():  # the dose-response: rho from the recorded residuals, here
        if cell.get("rho") is not None:
            from scipy.stats import spearmanr

            assert cell["rho"] == pytest.approx(spearmanr(cell["scales"], cell["log10 residual"]).statistic)
    for q in lip["minilm_layers"]["points"]:
        i, L = q["init"], q["layer"]
        want = np.log10(geo[f"{i}/mlp"][L] / geo[f"{i}/mlp"][L - 1] * geo[f"{i}/pure"][L - 1] / geo[f"{i}/pure"][L])
        assert q["slowing (log10)"] == pytest.approx(want, rel=1e-9)
        assert q["lipschitz bound"] == data["bound"]["minilm"][i]["mlp_lipschitz_by_layer"][L - 1]
    for std, c in data["depth_sweep"]["curves"].items():  # depth 1: (r1 - 3 r0) - log10(4 beta H / sqrt(d_qk))
        b = c["bound"]
        a, n = np.asarray(b["log10_abs_res"]), len(b["log10_abs_res"]) // len(b["beta_by_seed"])
        ok = np.asarray(b["log10_rel_res"])[:, 1] > -12
        need = [(a[j, 1] - 3 * a[j, 0]) - math.log10(4 * max(b["beta_by_seed"][j // n]) * b["heads"] / b["d_qk"] ** 0.5)
                for j in range(a.shape[0]) if ok[j]]
        got = measured["collapse.stated_bound"][f"SAN init std {std}"]["log10 gamma needed by depth"][0]
        assert got == pytest.approx(max(need), rel=1e-9)
    counts = measured["collapse.path_counts"]
    assert counts["brute-force configs agreeing"] == len(data["path_enumeration"]) > 0
    assert counts["mean path length MiniLM (L=6, H=12)"] == pytest.approx(6 * 12 / 13)


@pytest.mark.slow
def test_quick_run_and_replot(tmp_path):
    from headrank.report import runner

    s = runner.run("collapse", tmp_path, quick=True)
    by = {c.name: c for c in s.claims}
    assert by["collapse.path_sum_exact"].held and by["collapse.path_counts"].held
    assert all(c.detail for c in s.claims)
    measured_from_data({c.name: c.measured for c in s.claims}, json.loads((tmp_path / "data.json").read_text()))
    assert (tmp_path / "collapse_layers.png").exists() and (tmp_path / "report.html").exists()
    before = (tmp_path / "claims.json").read_text()
    (tmp_path / "depth_sweep.png").unlink()
    runner.run("collapse", tmp_path, replot=True)
    assert (tmp_path / "claims.json").read_text() == before and (tmp_path / "depth_sweep.png").exists()
