"""fig3 / table1 reproductions: claim logic on synthetic tables, and one tiny end-to-end run."""

import math

import numpy as np
import pandas as pd
import pytest

from attnrank.studies.fig3 import model_claims as fig3_claims
from attnrank.studies.lm_common import rank_rows
from attnrank.studies.table1 import attn_decay_hurts, decoupling_helps


def table1_claims(runs):
    return [attn_decay_hurts(runs), decoupling_helps(runs)]


def _heads(rank_of_lam, seeds=(0,), noise=0.0, n_heads=4):
    """Per-head rows where both products' effective and numerical rank follow rank_of_lam."""
    rng = np.random.default_rng(0)
    rows = []
    for lam, r in rank_of_lam.items():
        for seed in seeds:
            heads = {p: {"rank": [[r + noise * rng.standard_normal() for _ in range(n_heads)]] * 3,
                         "effective_rank": [[r / 2 + noise * rng.standard_normal() for _ in range(n_heads)]] * 3}
                     for p in ("qk", "ov")}
            rows += rank_rows(heads, lam, seed, [1])
    return pd.DataFrame(rows)


def _by_name(claims):
    return {c.name.split(".", 2)[-1]: c for c in claims}


def test_rank_rows_selects_layers():
    heads = {p: {"rank": [[1, 2], [3, 4]], "effective_rank": [[5, 6], [7, 8]]} for p in ("qk", "ov")}
    rows = rank_rows(heads, 0.1, 2, [1])
    assert [(r["product"], r["layer"], r["head"], r["rank"], r["effective_rank"]) for r in rows] == [
        ("qk", 1, 0, 3, 7), ("qk", 1, 1, 4, 8), ("ov", 1, 0, 3, 7), ("ov", 1, 1, 4, 8)]
    assert len(rank_rows(heads, 0.1, 2, None)) == 8


def test_fig3_claims_decreasing_rank_holds():
    c = _by_name(fig3_claims(_heads({0.0: 16, 0.1: 14, 1.0: 8, 3.0: 4}, seeds=(0, 1), noise=0.01), "lm", "layer 1"))
    assert set(c) == {"rank_falls_effective", "rank_falls_numerical", "lam01_lowers_effective",
                      "lam01_lowers_numerical"}
    assert all(x.held for x in c.values())
    assert c["rank_falls_effective"].measured["spearman_rho"]["qk"] == pytest.approx(-1.0)
    m = c["lam01_lowers_numerical"].measured["qk"]
    assert m["drop"] == pytest.approx(2.0, abs=0.05) and m["drop_exceeds_spread"] is True


def test_fig3_claims_increasing_or_flat_rank_does_not_hold():
    c = _by_name(fig3_claims(_heads({0.0: 4, 0.1: 8, 1.0: 12, 3.0: 16}), "vit", "all"))
    assert not any(x.held for x in c.values())
    assert c["lam01_lowers_effective"].measured["qk"]["drop"] == pytest.approx(-2.0)
    assert c["lam01_lowers_effective"].measured["qk"]["seed_spread"] != c["lam01_lowers_effective"].measured["qk"][
        "seed_spread"]  # NaN: one seed, spread not measured
    flat = _by_name(fig3_claims(_heads({0.0: 16, 0.1: 16, 1.0: 16}), "lm", "x"))
    assert math.isnan(flat["rank_falls_numerical"].measured["spearman_rho"]["ov"])
    assert not flat["rank_falls_numerical"].held and not flat["lam01_lowers_numerical"].held


def test_fig3_drop_within_seed_spread_does_not_hold():
    c = _by_name(fig3_claims(_heads({0.0: 16, 0.1: 15.9, 1.0: 8}, seeds=(0, 1, 2), noise=1.0), "lm", "x"))
    m = c["lam01_lowers_numerical"].measured["qk"]
    assert m["drop_exceeds_spread"] is (m["drop"] > m["seed_spread"])
    assert c["lam01_lowers_numerical"].held == all(
        c["lam01_lowers_numerical"].measured[p]["drop_exceeds_spread"] for p in ("qk", "ov"))


def _ppl(f, seeds=(0, 1), jitter=0.01):
    rows = []
    for a in (0.0, 0.1, 1.0):
        for m in (0.0, 0.1):
            for s in seeds:
                rows.append({"attn_weight_decay": a, "weight_decay": m, "seed": s,
                             "test_ppl": f(a, m) + (jitter if s % 2 else -jitter)})
    return pd.DataFrame(rows)


def test_table1_attention_decay_hurts_and_decoupling_helps():
    # perplexity grows with attention decay: decay hurts; at the coupled (0.1, 0.1) point, attn 0 is better
    c = _by_name(table1_claims(_ppl(lambda a, m: 10 + a + 0.0 * m)))
    assert c["attn_decay_hurts"].held
    d = c["attn_decay_hurts"].measured["per_mlp_lambda"]["mlp_lambda=0"]
    assert d["diff"] == pytest.approx(1.0) and d["exceeds_spread"] is True
    # coupled (0, 0) is already the best at MLP 0, so decoupling cannot help there: not held
    assert not c["decoupling_helps"].held
    assert c["decoupling_helps"].measured["per_mlp_lambda"]["mlp_lambda=0.1"]["best_decoupled_attn_lambda"] == 0.0
    assert c["decoupling_helps"].measured["per_mlp_lambda"]["mlp_lambda=0.1"]["diff"] == pytest.approx(0.1)

    # a bowl centred off the diagonal in attn (best attn = 0.1 at MLP 0, best attn = 1 at MLP 0.1)
    best = {0.0: 0.1, 0.1: 1.0}
    c = _by_name(table1_claims(_ppl(lambda a, m: 10 + abs(a - best[m]))))
    assert c["decoupling_helps"].held
    assert not c["attn_decay_hurts"].held  # at MLP 0.1, attn 1 beats attn 0


def test_table1_differences_within_spread_do_not_hold():
    c = _by_name(table1_claims(_ppl(lambda a, m: 10 + 0.01 * a, jitter=0.5)))
    h = c["attn_decay_hurts"].measured["per_mlp_lambda"]["mlp_lambda=0"]
    assert h["diff"] > 0 and h["exceeds_spread"] is False and not c["attn_decay_hurts"].held


@pytest.mark.slow
def test_fig3_and_table1_end_to_end_tiny():
    from attnrank.studies import fig3, table1
    from attnrank.studies.registry import get

    assert get("fig3").study is fig3.STUDY and get("table1").study is table1.STUDY
    p = fig3.Fig3Params(lambdas=(0.0, 1.0), lm_steps=20, vit_steps=20, seeds=(0,), workers=1, profile="test")
    data = fig3.run(p)
    assert len(fig3.claims(data, p)) == 8 and len(fig3.figures(data, p)) == 1
    lm = pd.DataFrame(data["lm"]["heads"])
    assert set(lm["layer"]) == {2} and len(lm) == 2 * 2 * 4  # 2 lambdas x 2 products x 4 heads, middle layer
    assert len(pd.DataFrame(data["vit"]["heads"])) == 2 * 2 * 4 * 4  # all 4 layers
    p = table1.Table1Params(attn_lambdas=(0.0, 1.0), mlp_lambdas=(0.0,), steps=20, seeds=(0,), workers=1)
    data = table1.run(p)
    assert [c.name for c in table1.claims(data, p)] == ["table1.attn_decay_hurts", "table1.decoupling_helps"]
    assert len(data["runs"]["test_ppl"]) == 2 and all(np.isfinite(data["runs"]["test_ppl"]))
