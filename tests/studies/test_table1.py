"""table1: claim logic on synthetic perplexity grids (paired by seed), holds and fails both ways."""

import numpy as np
import pandas as pd
import pytest

from headrank.studies import table1
from headrank.studies.table1 import Table1Params, attn_decay_hurts, decoupling_helps

LR_SUM = 1.0


def _runs(f, seeds=(0, 1, 2, 3, 4), attn=(0.0, 1.0, 3.0), mlp=(0.0, 3.0), seed_shift=1.0, jitter=0.0, val=None):
    """Runs where test ppl = f(attn exposure, mlp exposure) + a per-seed offset (shared by every cell) + jitter;
    validation ppl = ``val`` (same signature; default f) + the same offset, 0.5 lower."""
    rng = np.random.default_rng(1)
    rows = []
    for a in attn:
        for m in mlp:
            for s in seeds:
                rows.append({"attn_weight_decay": a / LR_SUM, "weight_decay": m / LR_SUM, "seed": s,
                             "test_ppl": f(a, m) + seed_shift * s + jitter * rng.standard_normal(),
                             "val_ppl": (val or f)(a, m) + seed_shift * s - 0.5,
                             "exposure_attn": a, "exposure_other": m})
    return pd.DataFrame(rows)


def test_paired_differences_beat_a_large_seed_offset():
    # seeds differ by up to 4 ppl, cells by 0.2: unpaired spreads would hide it, paired ones do not
    c = attn_decay_hurts(_runs(lambda a, m: 10 + 0.2 * (a == 3.0)))
    assert c.verdict == "held" and c.exposure == {"needed": 3.0, "got_attn": 3.0}
    assert c.measured["per_mlp_lambda"]["mlp_lambda=0"]["diff"] == pytest.approx(0.2)


def test_attn_decay_hurts_fails_or_is_inconclusive():
    assert attn_decay_hurts(_runs(lambda a, m: 10 - 0.2 * (a == 3.0))).verdict == "not held"
    c = attn_decay_hurts(_runs(lambda a, m: 10 + 0.01 * (a == 3.0), jitter=0.5))
    assert c.verdict == "inconclusive" and "margin" in c.reason and c.tests[0]["margin"] == 0.1
    low = attn_decay_hurts(_runs(lambda a, m: 10 + a, attn=(0.0, 0.5)))
    assert low.verdict == "inconclusive" and "exposure" in low.reason


def test_decoupling_helps_only_where_decay_helps_and_judged_apart_from_hurts():
    # coupled decay 3 beats coupled 0 (10 - 2m + a: 7 < 10), and attention 0 + MLP 3 beats it (4): held
    c = decoupling_helps(_runs(lambda a, m: 10 - 2 * m + a))
    assert c.verdict == "held" and c.measured["best_coupled_lambda"] == 3.0
    assert c.measured["difference"]["diff"] == pytest.approx(3.0)
    # decay helps, but attention decay helps too (10 - 2m - a): the decoupled cell is worse, not held
    assert decoupling_helps(_runs(lambda a, m: 10 - 2 * m - a)).verdict == "not held"
    # decay never helps (10 + a + m): untested, whatever attn_decay_hurts says
    c = decoupling_helps(_runs(lambda a, m: 10 + a + m))
    assert c.verdict == "inconclusive" and "untested" in c.reason
    assert attn_decay_hurts(_runs(lambda a, m: 10 + a + m)).verdict == "held"


def test_decoupling_regime_and_lambda_star_are_chosen_on_validation_not_test():
    # test says coupled 3 helps (7 < 10) and decoupling wins, but validation says decay never helps: untested
    c = decoupling_helps(_runs(lambda a, m: 10 - 2 * m + a, val=lambda a, m: 10 + a + m))
    assert c.verdict == "inconclusive" and "validation" in c.reason
    assert c.measured["coupled_mean_test_ppl"]["3"] < c.measured["coupled_mean_test_ppl"]["0"]
    # validation picks coupled 1 (the lowest val ppl); the judgement is on test at lambda* = 1, where the
    # decoupled cell (attn 0, MLP 1) is worse on test: not held, although at test's own best (3) it would hold
    test = {(0, 0): 10, (1, 1): 9, (3, 3): 5, (0, 1): 9.5, (0, 3): 4}
    val = {(0, 0): 10, (1, 1): 8, (3, 3): 9, (0, 1): 9, (0, 3): 9}
    runs = _runs(lambda a, m: test.get((a, m), 12), attn=(0.0, 1.0, 3.0), mlp=(0.0, 1.0, 3.0),
                 val=lambda a, m: val.get((a, m), 12))
    c = decoupling_helps(runs)
    assert c.measured["best_coupled_lambda"] == 1.0 and c.measured["chosen_on"] == "val_ppl"
    assert c.measured["difference"]["diff"] == pytest.approx(-0.5) and c.verdict == "not held"
    assert "validation" in c.rule and "test" in c.rule
    # without a validation column nothing can choose lambda* apart from test: untested
    c = decoupling_helps(_runs(lambda a, m: 10 - 2 * m + a).drop(columns="val_ppl"))
    assert c.verdict == "inconclusive" and "validation" in c.reason


def test_literal_lambda_cells_are_judged_in_support():
    runs = pd.concat([_runs(lambda a, m: 10 + a), _runs(lambda a, m: 10 + 5 * a, attn=(0.0, 0.1), mlp=(0.1,))])
    c = table1.hurts_literal(runs, 0.1, 3e-3)
    assert c.verdict == "held" and c.supports == "table1.attn_decay_hurts"
    assert c.measured["difference"]["diff"] == pytest.approx(0.5) and c.exposure["eta_lambda_per_step"] == pytest.approx(3e-4)


def test_claims_and_figures_from_data():
    runs = _runs(lambda a, m: 10 + a)
    data = {"runs": runs.to_dict("list"), "table": table1.ppl_table(runs).to_dict("list"), "lr_sum": LR_SUM,
            "attn_lambdas": [0.0, 1.0, 3.0], "mlp_lambdas": [0.0, 3.0], "literal_lambda": 0.1}
    p = Table1Params.quick()
    assert [c.name for c in table1.claims(data, p)] == ["table1.attn_decay_hurts", "table1.attn_decay_hurts_lam01",
                                                         "table1.decoupling_helps"]
    assert len(table1.figures(data, p)) == 1 and len(table1.notes(data, p)) == 4


@pytest.mark.slow
def test_table1_end_to_end_tiny():
    from headrank.studies.registry import get

    assert get("table1").study is table1.STUDY
    p = Table1Params(attn_exposures=(0.0, 0.5), mlp_exposures=(0.0,), steps=20, seeds=(0, 1), workers=1)
    data = table1.run(p)
    assert len(data["runs"]["test_ppl"]) == 8 and all(np.isfinite(data["runs"]["test_ppl"]))  # grid + literal cells
    assert max(data["runs"]["exposure_attn"]) == pytest.approx(0.5, rel=1e-3)
    assert [c.name for c in table1.claims(data, p)] == ["table1.attn_decay_hurts", "table1.attn_decay_hurts_lam01",
                                                         "table1.decoupling_helps"]
