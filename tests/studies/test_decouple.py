"""The decouple study's claims on synthetic runs tables (held, not held, untested), and its
registration beside table1 (the decoupling sentence counted once)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from headrank.studies import decouple, table1
from headrank.studies.registry import get

SEEDS = [0, 1, 2, 3, 4]
NOISE = np.array([0.01, -0.02, 0.015, -0.005, 0.0])  # per seed, shared by every cell (paired)


def runs(cells: dict[tuple[float, float], tuple[float, float]]) -> pd.DataFrame:
    """(attn λ, MLP λ) -> (val ppl, test ppl); each seed adds the same NOISE to both."""
    rows = [{"attn_weight_decay": a, "weight_decay": m, "seed": s, "val_ppl": v + NOISE[s], "test_ppl": t + NOISE[s],
             "loss": 1.0} for (a, m), (v, t) in cells.items() for s in SEEDS]
    return pd.DataFrame(rows)


def helping(decoupled_test: float) -> pd.DataFrame:
    # decay helps: coupled 1.0 lowest on val (and on test); decoupled twin at MLP 1.0 given
    return runs({(0.0, 0.0): (20.0, 21.0), (1.0, 1.0): (18.0, 19.0), (3.0, 3.0): (19.0, 20.0),
                 (0.0, 1.0): (17.5, decoupled_test), (0.0, 3.0): (18.5, 19.5)})


def test_decay_helps_check_picks_lambda_on_validation_and_judges_on_test():
    c = decouple.decay_helps(helping(18.0))
    assert c.kind == "check" and c.verdict == "held"
    assert c.measured["lambda_star"] == 1.0
    assert c.measured["difference"]["diff"] == pytest.approx(21.0 - 19.0)
    # a test split that disagrees with the validation choice: no help beyond the spread
    r = helping(18.0)
    sel = (r.attn_weight_decay == 1.0) & (r.weight_decay == 1.0)
    r.loc[sel, "test_ppl"] = 21.0 + NOISE + np.array([0.3, -0.3, 0.2, -0.2, 0.0])
    c = decouple.decay_helps(r)
    assert c.verdict == "inconclusive" and c.measured["lambda_star"] == 1.0


def test_decoupling_both_ways_in_the_regime():
    held = table1.decoupling_helps(helping(18.0), name="decouple.decoupling_helps")
    assert held.verdict == "held" and held.measured["best_coupled_lambda"] == 1.0
    assert held.measured["difference"]["diff"] == pytest.approx(19.0 - 18.0)
    assert held.measured["difference"]["n_seeds"] == 5
    # t-quantile spread of identical per-seed differences is 0
    assert held.measured["difference"]["spread"] == pytest.approx(0.0, abs=1e-9)
    worse = table1.decoupling_helps(helping(20.0), name="decouple.decoupling_helps")
    assert worse.verdict == "not held" and worse.measured["difference"]["diff"] == pytest.approx(-1.0)


def test_untested_where_no_decay_helps_and_the_spread_uses_t():
    r = runs({(0.0, 0.0): (18.0, 19.0), (1.0, 1.0): (19.0, 20.0), (0.0, 1.0): (18.5, 19.5)})
    c = table1.decoupling_helps(r, name="decouple.decoupling_helps")
    assert c.verdict == "inconclusive" and c.reason.startswith("untested")
    diffs = np.array([0.3, -0.1, 0.2, 0.0, 0.1])
    r = helping(18.0)
    sel = (r.attn_weight_decay == 0.0) & (r.weight_decay == 1.0)
    r.loc[sel, "test_ppl"] = r.loc[sel, "test_ppl"].to_numpy() + diffs
    d = table1.decoupling_helps(r).measured["difference"]
    sd = np.std(1.0 - diffs, ddof=1)
    assert d["spread"] == pytest.approx(stats.t.ppf(0.975, 4) * sd / np.sqrt(5), rel=1e-9)


def test_registered_beside_table1_and_counted_once():
    assert get("decouple").study.params.quick().max_chars == 20_000
    assert get("decouple").study.params.full().steps == get("table1").study.params.full().steps
    r = helping(18.0).assign(exposure_attn=lambda x: x.attn_weight_decay, exposure_other=lambda x: x.weight_decay)
    (dc,) = [c for c in table1.claims({"runs": r.to_dict("list")}, None) if c.name == "table1.decoupling_helps"]
    assert dc.supports == "decouple.decoupling_helps"  # counted in the decouple study only
    names = [c.name for c in decouple.claims({"runs": helping(18.0).to_dict("list")}, decouple.DecoupleParams.quick())]
    assert names == ["decouple.decay_helps", "decouple.decoupling_helps"]


def test_lambda_star_at_the_grid_edge_is_on_the_record():
    edge = table1.decoupling_helps(helping(18.0)).measured  # lambda* = 1 < 3: inside
    assert edge["lambda_star_at_grid_edge"] is False
    r = runs({(0.0, 0.0): (20.0, 21.0), (1.0, 1.0): (18.0, 19.0), (0.0, 1.0): (17.5, 18.0)})
    c = table1.decoupling_helps(r)
    assert c.measured["lambda_star_at_grid_edge"] is True and "not bracketed" in c.detail
