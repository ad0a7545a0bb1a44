"""The collapse reproduction: each claim on small synthetic data, both ways; the quick run and
its replot end to end (slow)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import math

import numpy as np
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


def _minilm_bound(lips=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0), shift=0.0):
    """log10 |res| of the pure variant (norm 1): with beta 0.5, H 1, d_qk 16 (log10 c = -0.301 at
    gamma = 1) the bound holds at depths 1-3 (rhs -0.30, -1.20, -3.91); depths 4-6 are at the floor."""
    rows = [[0.0, -1.0, -3.0, -4.0, -15.0, -16.0, -16.0]] * 3
    return {"beta_by_layer": [0.5] * 6, "mlp_lipschitz_by_layer": [x + shift for x in lips],
            "activation_lipschitz": 1.1289, "heads": 1, "d_qk": 16, "log10_res_pure": rows,
            "log10_norm_pure": [[0.0] * 7] * 3}


def _cubic(rho0: float, kappa: float, depth: int = 5) -> list[float]:
    """log10 residuals of an exact cubic recursion r_(l+1) = 10^kappa r_l^3 from 10^rho0."""
    out = [rho0]
    for _ in range(depth):
        out.append(3 * out[-1] + kappa)
    return out


def _exact_curve(rows, beta=0.25):
    """A depth-sweep curve as run stores it: exact log10 residuals per sequence (norm 1, so relative =
    absolute; NaN where not exact), two seeds."""
    a = [list(r) for r in rows] * 2
    mean = [None if None in c else float(sum(c) / len(c)) for c in zip(*a, strict=True)]
    return {"log10_rel_mean": mean, "log10_rel_float64_mean": [-16.0 if m is None else max(m, -16.0) for m in mean],
            "bound": {"log10_abs_res": a, "log10_rel_res": a, "exact": True, "beta_by_seed": [[beta] * (len(a[0]) - 1)] * 2,
                      "heads": 1, "d_qk": 16}}


def _heads(kappas=None, noise=0.0, rho0=-0.5, seeds=(0, 1, 2, 3)):
    """heads_sweep as run stores it: per (H, seed) two sequences on an exact cubic recursion whose
    rate constant is kappas[H] + noise x a pattern in -2..2 that differs by H and seed."""
    kappas = kappas or {1: -1.0, 2: -1.2, 4: -1.5, 8: -2.0}
    runs = {}
    for H, k in kappas.items():
        for s in seeds:
            rows = [_cubic(rho0, k + noise * ((7 * s + H) % 5 - 2), 6)] * 2
            runs[f"0.2/{H}/{s}"] = {"log10_abs": rows, "log10_rel": rows, "betas": [0.5 * H] * 6, "d_qk": 64 // H}
    return {"heads": list(kappas), "init_stds": [0.2], "seeds": list(seeds), "depths": list(range(7)), "d_model": 64,
            "n_seqs": 2, "runs": runs}


def _ens(short=(0.8, 0.85, 0.9), dep=(0.1, 0.12, 0.08), L=2):
    """Ensemble measures of one network, per sequence."""
    return {"short_share": list(short), "dependence": list(dep), "mean_abs_r": [x * 1.1 for x in dep],
            "share_by_k": [[s / 2, s / 2] + [(1 - s) / (L - 1)] * (L - 1) for s in short], "n_members": 2**L,
            "sum_rel_error": 1e-15}


def _ensembles():
    return {"init": {f"{std:g}": _ens() for std in P.short_init_stds},
            "recall": {"n_layers": 2, "accuracy": [1.0], "config": {"layers": 2}, "measures": _ens()},
            "pretrained": {"model": "minilm", **_ens(L=6)}}


def _data():
    """Synthetic data shaped like experiment.run's, where every claim holds (the stated bound
    with gamma = 1; without a gamma it is inconclusive)."""
    seqs = 3
    by_seq = _by_seq()
    restricted = {"norm=none, init std 0.02": {"geo_mean": [1.0, 1e-5, 1e-11, 1e-16, 1e-16],
                                               "sum_rel_error": 1e-15, "spearman_k_vs_log_residual": -1.0},
                  "norm=pre, init std 0.02": {"geo_mean": [1.0, 0.9, 0.95, 0.9, 0.9],
                                              "sum_rel_error": 2e-15, "spearman_k_vs_log_residual": -0.2}}
    return {
        "summary": _summary(), "primary_by_seq": by_seq,
        "pure_fits": {"pretrained": {"n_fit": 6, "fit": _fit(0.7, 0.98, 0.96)},
                      "random": {"n_fit": 2, "fit": {"n_points": 2, "fitted": False}}},
        "depth_sweep": {"seeds": [0, 1], "n_seqs": 8, "depths": list(range(6)),
                        "curves": {"0.3": _exact_curve([_cubic(-0.5, -1.0), _cubic(-0.6, -1.1)])}},
        "heads_sweep": _heads(),
        "path_products": [{"length": k, "n_paths": 1, "mean": m, "std": 0.0, "samples": 1}
                          for k, m in enumerate([1.9, 0.6, 0.2, 0.09])],
        "path_restricted": restricted,
        "path_enumeration": [{"layers": 2, "heads": 2, "counts": [1, 4, 4]},
                             {"layers": 3, "heads": 1, "counts": [1, 3, 3, 1]}],
        "minilm_meta": {"n_seqs": seqs},
        "bound": {"minilm": {"pretrained": _minilm_bound(), "random": _minilm_bound(shift=0.5)}},
        "mlp_dose": _dose(),
        "ensembles": _ensembles(),
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
                        "collapse.mlp_does_not_prevent", "collapse.cubic_rate", "collapse.doubly_exponential",
                        "collapse.stated_bound", "collapse.heads_modulate", "collapse.mlp_lipschitz", "collapse.path_products",
                        "collapse.path_restricted", "collapse.short_paths", "collapse.short_paths_init",
                        "collapse.path_sum_exact", "collapse.path_counts"]
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
    fits = by["collapse.doubly_exponential"].measured  # an exact cubic: log r_L = a + b 3^L exactly
    san = fits["SAN init std 0.3"]
    assert san["window"] == [0, 5] and san["points"] == 6 and san["exact depths"] == 6
    assert san["R2 dexp kappa=3"] == pytest.approx(1.0, abs=1e-12) and san["R2 exp"] < 0.95
    L = np.arange(6.0)
    y = np.mean([_cubic(-0.5, -1.0), _cubic(-0.6, -1.1)], 0)
    A = np.stack([np.ones(6), 3.0**L], 1)
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    assert san["b (3^L)"] == pytest.approx(coef[1], rel=1e-9) and san["a (3^L)"] == pytest.approx(coef[0], rel=1e-9)
    rss = ((y - np.stack([np.ones(6), L], 1) @ np.linalg.lstsq(np.stack([np.ones(6), L], 1), y, rcond=None)[0]) ** 2)
    assert san["R2 exp"] == pytest.approx(1 - rss.sum() / ((y - y.mean()) ** 2).sum(), rel=1e-9)
    assert fits["judged"] == ["SAN init std 0.3"] and fits["MiniLM pretrained pure"]["verdict"] is None
    assert fits["MiniLM pretrained pure"]["R2 dexp kappa=3"] == 0.96 and fits["MiniLM random pure"]["points"] == 2
    heads = by["collapse.heads_modulate"].measured["init std 0.2"]  # rates -1 (H = 1) and -2 (H = 8), +-0.01
    assert heads["mean rate by H"]["H=1"] == pytest.approx(-1.0) and heads["mean rate by H"]["H=8"] == pytest.approx(-2.0)
    assert heads["rate H=8 - H=1"] == pytest.approx(-1.0) and heads["spread"] == pytest.approx(0.0, abs=1e-12)
    assert heads["bound's base log10(beta H / sqrt(d_qk)) by H"]["H=8"] == pytest.approx(math.log10(4 * 8 / math.sqrt(8)))
    assert by["collapse.path_products"].measured == {"k=0": 1.9, "k=1": 0.6, "k=2": 0.2, "k=3": 0.09}
    short = by["collapse.short_paths"].measured["recall model (2 layers, trained)"]
    se = np.std([0.8, 0.85, 0.9], ddof=1) / math.sqrt(3)
    assert short["share of paths k <= L/2"] == pytest.approx(0.85) and short["spread"] == pytest.approx(
        stats.t.ppf(0.975, 2) * se, rel=1e-12)
    assert short["dependence"] == pytest.approx(0.1) and short["members"] == 4
    assert by["collapse.short_paths_init"].measured["largest init std where the short paths carry the share"] == 0.3
    assert by["collapse.path_sum_exact"].measured == 2e-15  # the larger of the two settings' errors
    counts = by["collapse.path_counts"].measured
    # path length of L=6, H=12: binomial(6, 12/13) (each layer: skip or one of 12 heads), mean 6 * 12/13
    assert counts["brute-force configs agreeing"] == 2 and counts["sums equal (H+1)^L for the table"] is True
    assert counts["mean path length MiniLM (L=6, H=12)"] == pytest.approx(6 * 12 / 13)


def test_stated_bound_is_inconclusive_without_gamma_and_reports_where_it_turns():
    c = _by_name(_data())["collapse.stated_bound"]
    assert c.verdict == "inconclusive" and "not defined" in c.reason
    san = c.measured["SAN init std 0.3"]
    # an exact cubic r_(l+1) = 10^kappa r_l^3 needs log10 c >= kappa at every depth (c = 0.25 gamma); the larger
    # kappa of the two sequences is -1; every depth is exact (no float64 floor)
    assert san["judged depths"] == [1, 2, 3, 4, 5] and san["log10 gamma needed"] == pytest.approx(-1 - math.log10(0.25))
    assert san["log10 gamma vacuous (every input)"] == pytest.approx(1.2 - math.log10(0.25))
    assert c.measured["MiniLM pretrained pure (LayerNorm kept)"]["judged depths"] == [1, 2, 3]


def test_stated_bound_holds_with_gamma_one_and_fails_on_a_counterexample():
    d = _data()
    c = _by_name(d, P1)["collapse.stated_bound"]
    assert c.verdict == "held" and "vacuous" not in c.reason
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve([[-0.5, -2.5, -2.0, -14.0, -50.0, -158.0]] * 2)  # depth 2
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
    assert _by_name(d)["collapse.short_paths"].verdict == "held"  # share 0.85, dependence 0.1
    d["ensembles"]["pretrained"] = {"model": "minilm", **_ens(short=(0.1, 0.2, 0.15), L=6)}  # long paths dominate
    c = _by_name(d)["collapse.short_paths"]
    assert c.verdict == "not held" and "minilm pretrained, attention + skip" in c.reason
    d["ensembles"]["pretrained"] = {"model": "minilm", **_ens(dep=(0.5, 0.6, 0.55), L=6)}  # strongly correlated
    c = _by_name(d)["collapse.short_paths"]
    assert c.verdict == "not held" and c.measured["minilm pretrained, attention + skip"]["weakly dependent"] == "not held"
    d["ensembles"]["pretrained"] = {"model": "minilm", **_ens(dep=(0.1, 0.5, 0.3), L=6)}  # the spread straddles 0.3
    assert _by_name(d)["collapse.short_paths"].verdict == "inconclusive"
    d["ensembles"]["pretrained"] = {"model": "gpt2", "skipped": "not BERT-style"}  # judged on the recall model alone
    c = _by_name(d)["collapse.short_paths"]
    assert c.verdict == "held" and "not BERT-style" in c.reason and len(c.measured) == 1
    del d["ensembles"]
    c = _by_name(d)["collapse.short_paths"]
    assert c.verdict == "inconclusive" and "older run" in c.reason


def test_short_paths_init_supports_and_names_the_largest_scale_that_holds():
    d = _data()
    d["ensembles"]["init"]["0.2"] = _ens(short=(0.1, 0.12, 0.11))
    d["ensembles"]["init"]["0.3"] = _ens(short=(0.01, 0.02, 0.03))
    c = _by_name(d)["collapse.short_paths_init"]
    assert c.supports == "collapse.short_paths" and c.verdict == "not held"
    assert c.measured["largest init std where the short paths carry the share"] == 0.15
    assert "init std 0.2" in c.reason and "init std 0.3" in c.reason


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
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve([[-0.5 - 2 * L for L in range(6)]] * 2)  # log r linear in L
    c = _by_name(d)["collapse.doubly_exponential"]
    assert c.verdict == "not held" and "SAN init std 0.3" in c.reason
    assert c.measured["SAN init std 0.3"]["R2 exp"] == pytest.approx(1.0)
    d["pure_fits"]["pretrained"]["fit"] = _fit(0.5, 0.90, 0.89)  # MiniLM is reported, never judged
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve([_cubic(-0.5, -1.0)] * 2)
    assert _by_name(d)["collapse.doubly_exponential"].verdict == "held"


def test_doubly_exponential_restarts_the_bound_where_it_is_vacuous():
    # the residual first grows (the bound from X_0 is vacuous at depths 1, 2), then collapses cubically
    # from depth 2: the window is [2, 5], where a + b 3^L fits exactly
    rows = [[0.0, 1.0, 2.0, -2.0, -14.0, -50.0]] * 2
    d = _data()
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve(rows)
    c = _by_name(d)["collapse.doubly_exponential"]
    san = c.measured["SAN init std 0.3"]
    assert san["window"] == [2, 5] and san["points"] == 4
    assert c.verdict == "held" and san["R2 dexp kappa=3"] == pytest.approx(1.0, abs=1e-12)
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve([[0.0, 1.0, 2.0, 3.0, -14.0, -50.0]] * 2)  # window [3, 5]: 3 depths
    c = _by_name(d)["collapse.doubly_exponential"]
    assert c.verdict == "inconclusive" and "window" in c.measured["SAN init std 0.3"]["why"]


def test_doubly_exponential_uses_only_depths_every_sequence_has_exactly():
    d = _data()
    rows = [_cubic(-0.5, -1.0), _cubic(-0.6, -1.1)[:4] + [None, None]]  # not exact from depth 4 (NaN read as None)
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve(rows)
    san = _by_name(d)["collapse.doubly_exponential"].measured["SAN init std 0.3"]
    assert san["exact depths"] == 4 and san["window"] == [0, 3]
    rows[1][3] = None
    d["depth_sweep"]["curves"]["0.3"] = _exact_curve(rows)
    c = _by_name(d)["collapse.doubly_exponential"]
    assert c.verdict == "inconclusive" and c.measured["judged"] == []
    del d["depth_sweep"]["curves"]["0.3"]["bound"]  # an older run: no exact residuals, nothing judged
    assert "older run" in _by_name(d)["collapse.doubly_exponential"].measured["SAN init std 0.3"]["why"]


def test_heads_modulate_both_ways_and_not_judged():
    from scipy import stats

    d = _data()
    assert _by_name(d)["collapse.heads_modulate"].verdict == "held"
    d["heads_sweep"] = _heads({1: -1.0, 2: -1.0, 4: -1.02, 8: -1.03}, noise=0.01)  # 0.03 apart, spread 0.04
    c = _by_name(d)["collapse.heads_modulate"]
    part = c.measured["init std 0.2"]
    diffs = np.array([3 - 1, 0 - 3, 2 - 0, 4 - 2]) * 0.01 - 0.03  # per seed: the noise patterns of H = 8 and 1
    assert part["rate H=8 - H=1"] == pytest.approx(diffs.mean())
    assert part["spread"] == pytest.approx(stats.t.ppf(0.975, 3) * diffs.std(ddof=1) / 2)
    assert c.verdict == "not held" and abs(part["rate H=8 - H=1"]) + part["spread"] < 0.1
    d["heads_sweep"] = _heads({1: -1.0, 8: -1.05}, noise=0.2)  # inside the spread, which reaches past 0.1
    assert _by_name(d)["collapse.heads_modulate"].verdict == "inconclusive"
    d["heads_sweep"] = _heads({1: -1.0, 8: -1.15}, noise=0.01)  # 0.15 apart: |d| - spread >= 0.1
    assert _by_name(d)["collapse.heads_modulate"].verdict == "held"
    d["heads_sweep"] = _heads({1: -1.0, 8: -1.08})  # beyond a spread of 0, but below the margin: not held
    assert _by_name(d)["collapse.heads_modulate"].verdict == "not held"
    d["heads_sweep"] = _heads(rho0=1.0, kappas={1: -0.1, 8: -0.1})  # the residual never gets small: not judged
    c = _by_name(d)["collapse.heads_modulate"]
    assert c.verdict == "inconclusive" and c.measured["judged"] == {} and "cubic regime" in c.reason
    del d["heads_sweep"]
    assert "older run" in _by_name(d)["collapse.heads_modulate"].reason


def test_network_rate_reads_only_the_cubic_regime():
    from headrank.studies.collapse.depth_claims import network_rate

    rows = [[-1.0, -2.0, -7.0, -25.0]]  # relative residual <= 1e-4 only at depth 2: one step, -25 - 3 (-7)
    assert network_rate(rows, rows, 1e-4) == pytest.approx(-4.0)
    assert network_rate([[-1.0, -2.0]], [[-1.0, -2.0]], 1e-4) is None


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


def measured_from_data(measured, data, p=P):
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
    ens = data["ensembles"]
    rec = measured["collapse.short_paths"][f"recall model ({ens['recall']['n_layers']} layers, trained)"]
    assert rec["share of paths k <= L/2"] == pytest.approx(np.mean(ens["recall"]["measures"]["short_share"]), rel=1e-12)
    for std, m in ens["init"].items():  # the share from the per-k shares: k <= L/2 summed, here
        share = np.asarray(m["share_by_k"], dtype=float)
        got = measured["collapse.short_paths_init"][f"init std {std}"]["share of paths k <= L/2"]
        assert got == pytest.approx(share[:, : (share.shape[1] - 1) // 2 + 1].sum(1).mean(), rel=1e-12)
        assert m["sum_rel_error"] < 1e-12
    for name, v in measured["collapse.doubly_exponential"].items():  # R2 of a + b 3^L over the window, here
        if not isinstance(v, dict) or "window" not in v:
            continue
        rel = np.asarray(data["depth_sweep"]["curves"][name.split()[-1]]["bound"]["log10_rel_res"], dtype=float)
        L = np.arange(v["window"][0], v["window"][1] + 1.0)
        y = rel.mean(0)[L.astype(int)]
        A = np.stack([np.ones_like(L), 3.0**L], 1)
        rss = ((y - A @ np.linalg.lstsq(A, y, rcond=None)[0]) ** 2).sum()
        assert v["R2 dexp kappa=3"] == pytest.approx(1 - rss / ((y - y.mean()) ** 2).sum(), rel=1e-9, abs=1e-12)
    hs = data["heads_sweep"]
    for part, v in measured["collapse.heads_modulate"].items():  # the rate: log10 r_(l+1) - 3 log10 r_l, here
        if part == "judged" or v.get("verdict") is None:
            continue
        std = part.split()[-1]
        for H in hs["heads"]:
            rates = []
            for s in hs["seeds"]:
                a = np.asarray(hs["runs"][f"{std}/{H}/{s}"]["log10_abs"], dtype=float)
                rel = np.asarray(hs["runs"][f"{std}/{H}/{s}"]["log10_rel"], dtype=float)
                step = a[:, 1:] - 3 * a[:, :-1]
                ok = np.isfinite(step) & (rel[:, :-1] <= math.log10(p.heads_regime))
                rates.append(step[ok].mean())
            assert v["mean rate by H"][f"H={H}"] == pytest.approx(np.mean(rates), rel=1e-9)
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
        a, n = np.asarray(b["log10_abs_res"], dtype=float), len(b["log10_abs_res"]) // len(b["beta_by_seed"])
        ok = np.isfinite(np.asarray(b["log10_rel_res"], dtype=float)[:, 1])  # exact residuals: every finite one
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


def test_cubic_rate_is_judged_over_networks_both_ways():
    """The rate apart from the bound: kappa 3 on a cubic recursion (held), 1 on a single exponential
    (not held: kappa - 1 inside the margin), one network untested."""
    from headrank.studies.collapse.depth_claims import cubic_rate

    def data(rows, seeds=(0, 1)):
        d = _data()
        d["depth_sweep"] = {"seeds": list(seeds), "n_seqs": 2, "depths": list(range(6)),
                            "curves": {"0.3": _exact_curve(rows)}}
        if len(seeds) == 1:
            d["depth_sweep"]["curves"]["0.3"]["bound"]["log10_abs_res"] = [list(r) for r in rows]
            d["depth_sweep"]["curves"]["0.3"]["bound"]["log10_rel_res"] = [list(r) for r in rows]
        return d

    cubic = cubic_rate(data([_cubic(-2.5, -1.0), _cubic(-2.6, -1.1)]), P1)
    assert cubic.verdict == "held" and abs(cubic.tests[0]["diff"] - 2.0) < 1e-9 and cubic.tests[0]["n"] == 2
    expo = [[-2.0 - 2 * i for i in range(6)], [-2.1 - 2 * i for i in range(6)]]
    assert cubic_rate(data(expo), P1).verdict == "not held"
    assert cubic_rate(data(expo, seeds=(0,)), P1).tests[0]["verdict"] == "untested"
