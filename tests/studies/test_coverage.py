"""The coverage table names real claims, and every counted finding of a study is in it.

Claims are produced from the synthetic data of each study's own claim tests (no training)."""

import importlib
import json

import pandas as pd

from headrank.studies import coverage, decouple, fig3, fig4, table1
from headrank.studies.collapse.params import CollapseParams
from headrank.studies.fig2 import claims as fig2_claims
from headrank.studies.fig4 import Fig4Params
from headrank.studies.fig5 import claims as fig5_claims
from tests.studies import (
    test_collapse,
    test_decouple,
    test_fig2,
    test_fig3,
    test_fig4,
    test_fig5,
    test_table1,
)

collapse_claims = importlib.import_module("headrank.studies.collapse.claims")  # the package exports a function


def _all_claims():
    out = list(fig2_claims.claims(test_fig2.GOOD, test_fig2.P))
    out += collapse_claims.claims(json.loads(json.dumps(test_collapse._data())), CollapseParams.quick())
    m = test_fig3._model({0.0: 16, 0.1: 12, 3.0: 8, 8.0: 4})
    out += fig3.claims({"lm": m, "vit": m}, fig3.Fig3Params.quick())
    runs = pd.concat([test_table1._runs(lambda a, m: 10 + a),
                      test_table1._runs(lambda a, m: 10 + a, attn=(0.0, 0.1), mlp=(0.1,))])
    out += table1.claims({"runs": runs.to_dict("list"), "literal_lambda": 0.1, "lr_peak": 3e-3}, None)
    run = test_fig4._run(0.0, 0, 0.0, 0.99)
    d4 = {"described": {"source": "x", **run}, "runs": [run]}
    out += [f(d4, Fig4Params()) for f in (fig4.llama_coincide, fig4.llama_rows, fig4.decay_balances)]
    out += fig5_claims.claims(test_fig5._data(), test_fig5.Q)
    out += decouple.claims({"runs": test_decouple.helping(18.0).to_dict("list")}, decouple.DecoupleParams.quick())
    return out


def test_every_named_claim_exists_and_every_counted_finding_is_covered():
    claims = _all_claims()
    names = {c.name for c in claims}
    scale_and_fig1 = {n for n in coverage.claims_named() if n.split(".")[0] in ("scale", "fig1", "prop31")}
    assert coverage.claims_named() - scale_and_fig1 <= names, coverage.claims_named() - scale_and_fig1 - names
    counted = {c.name for c in claims if c.kind == "finding" and not c.supports}
    assert counted <= coverage.claims_named(), counted - coverage.claims_named()


def test_no_claim_has_a_citation_problem():
    from headrank.studies.registry import citation_problems

    by_study: dict[str, list] = {}
    for c in _all_claims():
        by_study.setdefault(c.name.split(".")[0], []).append(c.to_json())
    assert [p for claims in by_study.values() for p in citation_problems(claims)] == []


def test_every_row_says_what_tests_it_or_why_nothing_can():
    for doc, place, statement, tested_by, why in coverage.COVERAGE:
        assert doc and place and statement.endswith(".")
        assert tested_by or why, statement
    md = coverage.markdown()
    assert md.count("\n") == len(coverage.COVERAGE) + 1 and "`fig2.qk_identical`" in md


def test_each_quoted_sentence_is_counted_once():
    """No two counted findings quote the same sentence: a second test of one statement (another
    model, threshold or regime) is supporting evidence of the first."""
    from collections import Counter

    counted = Counter(" ".join(c.quote.split()) for c in _all_claims() if c.kind == "finding" and not c.supports)
    assert [q for q, n in counted.items() if n > 1] == []


def test_a_support_of_an_absent_reproduction_is_counted_itself():
    from headrank.studies.registry import tally

    alone = [{"name": "table1.decoupling_helps", "kind": "finding", "verdict": "inconclusive",
              "supports": "decouple.decoupling_helps"}]
    assert tally(alone)["findings"]["inconclusive"] == 1 and tally(alone)["supporting"] == 0
    both = alone + [{"name": "decouple.decoupling_helps", "kind": "finding", "verdict": "not held"}]
    t = tally(both)
    assert t["findings"] == {"held": 0, "not held": 1, "inconclusive": 0} and t["supporting"] == 1


def test_rows_of_a_combined_report_add_up_to_its_tally():
    from headrank.studies.registry import tally

    a = [{"name": "table1.decoupling_helps", "kind": "finding", "verdict": "inconclusive",
          "supports": "decouple.decoupling_helps"}]
    b = [{"name": "decouple.decoupling_helps", "kind": "finding", "verdict": "not held"}]
    names = {c["name"] for c in a + b}
    rows = [tally(a, names), tally(b, names)]
    total = tally(a + b)
    assert {k: sum(r["findings"][k] for r in rows) for k in total["findings"]} == total["findings"]
    assert sum(r["supporting"] for r in rows) == total["supporting"] == 1
