"""The collapse reproduction: each claim on small synthetic data, both ways; the quick run and
its replot end to end (slow)."""

from __future__ import annotations

import copy
import importlib
import json

import pytest

from attnrank.studies.collapse.params import CollapseParams

K = importlib.import_module("attnrank.studies.collapse.claims")  # the package exports a function of that name

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


def _data():
    """Synthetic data shaped like experiment.run's, where every claim holds."""
    seqs = 3
    by_seq = _by_seq()
    curve = {"geo_mean": [1.0, 0.1, 1e-3], "n_fit": 6, "fit": _fit(0.8, 0.99, 0.97)}
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
    }


def _by_name(data):
    return {c.name: c for c in K.claims(json.loads(json.dumps(data)), P)}


def test_all_hold_on_collapsing_data():
    by = _by_name(_data())
    assert list(by) == ["collapse.pure_attention", "collapse.skip_prevents", "collapse.mlp_slows",
                        "collapse.mlp_does_not_prevent", "collapse.doubly_exponential", "collapse.path_products",
                        "collapse.path_restricted", "collapse.short_paths", "collapse.path_sum_exact",
                        "collapse.path_counts"]
    assert all(c.verdict == "held" for c in by.values()), {n: c.measured for n, c in by.items() if not c.held}
    assert [n for n, c in by.items() if c.kind == "identity"] == ["collapse.path_sum_exact", "collapse.path_counts"]


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
    assert K.combine({"a": "held", "b": "inconclusive"})[0] == "inconclusive"
    assert K.combine({"a": "not held", "b": "inconclusive"}) == ("not held", "not held for: a")


def test_strictly_decreasing_to_floor():
    f = K.strictly_decreasing_to_floor
    assert f([1.0, 0.5, 1e-13, 1e-12], 1e-12) and f([3.0, 2.0, 1.0], 1e-12)
    assert not f([1.0, 1.0, 0.5], 1e-12) and not f([1.0, None, 0.5], 1e-12)


def test_params_profiles_are_frozen_tuples():
    q, full = CollapseParams.quick(), CollapseParams.full()
    assert q.n_seqs < full.n_seqs and isinstance(q.sweep_seeds, tuple)
    with pytest.raises(AttributeError):
        q.n_seqs = 3  # type: ignore[misc]


@pytest.mark.slow
def test_quick_run_and_replot(tmp_path):
    from attnrank.report import runner

    s = runner.run("collapse", tmp_path, quick=True)
    by = {c.name: c for c in s.claims}
    assert by["collapse.path_sum_exact"].held and by["collapse.path_counts"].held
    assert all(c.measured is not None and c.detail for c in s.claims)
    assert (tmp_path / "collapse_layers.png").exists() and (tmp_path / "report.html").exists()
    before = (tmp_path / "claims.json").read_text()
    (tmp_path / "depth_sweep.png").unlink()
    runner.run("collapse", tmp_path, replot=True)
    assert (tmp_path / "claims.json").read_text() == before and (tmp_path / "depth_sweep.png").exists()
