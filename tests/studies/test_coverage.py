"""The coverage table names real claims, and every counted finding of a study is in it.

Claims are produced from the synthetic data of each study's own claim tests (no training)."""

import importlib
import json

import pandas as pd

from headrank.studies import coverage, decouple, designs, fig3, fig4, table1
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
    out += designs.claims({}, designs.DesignsParams.quick())
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


def test_each_statement_is_a_coverage_row_counted_once():
    """A statement is a row of the coverage table: every counted finding is named by exactly one row,
    the tally counts rows (not claims, not quote strings), and no row's counted findings come from two
    reproductions (so the per-reproduction rows of a combined report still add up)."""
    from headrank.studies.registry import statements, tally

    claims = [c.to_json() for c in _all_claims()]
    names = {c["name"] for c in claims}
    counted = [c for c in claims if c["kind"] == "finding" and c.get("supports") not in names]
    rows = {coverage.row_of(c["name"]) for c in counted}
    assert None not in rows
    t = tally(claims)
    assert sum(t["findings"].values()) + t["untested"] == len(rows) < len(counted)  # two rows hold two claims each
    for st in statements(claims):
        studies = {n.split(".")[0] for n in st["claims"]}
        assert len(studies) == 1, st
    for i in range(len(coverage.COVERAGE)):  # no name in two rows
        for n in coverage.row_names(i):
            assert coverage.row_of(n) == i


def test_claims_judging_one_statement_combine_under_the_several_parts_rule():
    from headrank.studies.registry import statements, tally

    row = next(i for i in range(len(coverage.COVERAGE)) if len(coverage.row_names(i)) == 2
               and all(n.startswith("collapse.") for n in coverage.row_names(i)))
    a, b = coverage.row_names(row)
    held = [{"name": a, "kind": "finding", "verdict": "held"}, {"name": b, "kind": "finding", "verdict": "held"}]
    assert tally(held)["findings"] == {"held": 1, "not held": 0, "inconclusive": 0}
    mixed = [held[0], {**held[1], "verdict": "not held"}]
    assert tally(mixed)["findings"] == {"held": 0, "not held": 1, "inconclusive": 0}
    open_ = [held[0], {**held[1], "verdict": "inconclusive"}]
    assert [st["verdict"] for st in statements(open_)] == ["inconclusive"]
    alone = [{"name": "not.in.the.table", "kind": "finding", "verdict": "held"}, held[0]]
    assert tally(alone)["findings"]["held"] == 2  # a finding in no row is its own statement


def test_an_untested_statement_is_listed_apart_with_its_command():
    from headrank.studies import fig4
    from headrank.studies.registry import statements, tally

    claims = [c.to_json() for c in _all_claims() if c.name.startswith("fig4.")]
    untested = [st for st in statements(claims) if st["verdict"] == "untested"]
    assert sorted(n for st in untested for n in st["claims"]) == ["fig4.bound_coincides", "fig4.rows_equal"]
    assert untested[0]["untested"] == [fig4.UNTESTED_COMMAND]
    t = tally(claims)
    assert t["untested"] == 2 and sum(t["findings"].values()) == 0
    given = [{**c, "untested": "", "verdict": "held"} for c in claims]  # --model given: judged and counted
    assert tally(given)["untested"] == 0 and tally(given)["findings"]["held"] == 2


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
