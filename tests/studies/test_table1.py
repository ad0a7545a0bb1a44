"""table1: claim logic on synthetic perplexity grids (paired by seed), holds and fails both ways."""

import numpy as np
import pandas as pd
import pytest

from attnrank.studies import table1
from attnrank.studies.table1 import Table1Params, attn_decay_hurts, decoupling_helps

LR_SUM = 1.0


def _runs(f, seeds=(0, 1, 2, 3, 4), attn=(0.0, 1.0, 3.0), mlp=(0.0, 3.0), seed_shift=1.0, jitter=0.0):
    """Runs where ppl = f(attn exposure, mlp exposure) + a per-seed offset (shared by every cell) + jitter."""
    rng = np.random.default_rng(1)
    rows = []
    for a in attn:
        for m in mlp:
            for s in seeds:
                rows.append({"attn_weight_decay": a / LR_SUM, "weight_decay": m / LR_SUM, "seed": s,
                             "test_ppl": f(a, m) + seed_shift * s + jitter * rng.standard_normal(),
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
    assert c.verdict == "inconclusive" and "spread" in c.reason
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
    from attnrank.studies.registry import get

    assert get("table1").study is table1.STUDY
    p = Table1Params(attn_exposures=(0.0, 0.5), mlp_exposures=(0.0,), steps=20, seeds=(0, 1), workers=1)
    data = table1.run(p)
    assert len(data["runs"]["test_ppl"]) == 8 and all(np.isfinite(data["runs"]["test_ppl"]))  # grid + literal cells
    assert max(data["runs"]["exposure_attn"]) == pytest.approx(0.5, rel=1e-3)
    assert [c.name for c in table1.claims(data, p)] == ["table1.attn_decay_hurts", "table1.attn_decay_hurts_lam01",
                                                         "table1.decoupling_helps"]
