"""The terminal tables of the verdicts: the same claims and tally as claims.json, coloured."""

from headrank.report.console import all_table, claims_table, headline, verdict_badge
from headrank.studies.registry import tally

CLAIMS = [
    {"name": "s.a", "kind": "finding", "verdict": "held", "held": True, "measured": 1.5, "expected": "> 1"},
    {"name": "s.b", "kind": "finding", "verdict": "not held", "held": False, "measured": 0.2, "expected": "> 1"},
    {"name": "s.c", "kind": "finding", "verdict": "inconclusive", "held": False, "measured": 1.0, "expected": "> 1",
     "supports": "s.a"},
    {"name": "s.d", "kind": "check", "verdict": "inconclusive", "held": False, "measured": None, "expected": "x"},
    {"name": "s.e", "kind": "identity", "verdict": "held", "held": True, "measured": 0.0, "expected": 0.0},
]


def _cells(table, col):
    return [str(c) for c in table.columns[col]._cells]


def test_headline_counts_as_the_tally_does():
    assert headline(tally(CLAIMS)) == ("findings: 1 held, 1 not held, 0 inconclusive; identities: 1 of 1 verified; "
                                       "our checks: 0 held, 0 not held, 1 inconclusive")


def test_badges_and_the_claims_table():
    assert [(verdict_badge(c).plain, str(verdict_badge(c).style)) for c in CLAIMS] == [
        ("held", "green"), ("not held", "red"), ("inconclusive", "yellow"), ("inconclusive", "yellow"),
        ("verified", "green")]
    failed = {**CLAIMS[-1], "verdict": "not held", "held": False}
    assert verdict_badge(failed).plain == "FAILED"
    t = claims_table("s", CLAIMS, 2.0)
    assert t.title == f"s: {headline(tally(CLAIMS))} (2.0 s)"
    assert _cells(t, 0) == [c["name"] for c in CLAIMS] and _cells(t, 1) == [c["kind"] for c in CLAIMS]
    assert _cells(t, 2) == ["held", "not held", "inconclusive", "inconclusive", "verified"]


def test_the_all_table_reads_summary_json():
    summary = {"quick": True, "tally": tally(CLAIMS), "reproductions": [
        {"name": "s", "tally": tally(CLAIMS), "runtime_s": 3.0, "cached": True, "error": None},
        {"name": "t", "tally": tally([]), "runtime_s": None, "cached": False, "error": "RuntimeError: boom"}]}
    t = all_table(summary)
    assert t.title.startswith("reproduce all (quick): findings: 1 held")
    assert _cells(t, 0) == ["s", "t"] and _cells(t, 1) == ["1 / 1 / 0", "0 / 0 / 0"]
    assert _cells(t, 2) == ["0 of 1", "0 of 0"] and _cells(t, 3) == ["1 of 1", "0 of 0"]
    assert _cells(t, 4) == ["3.0 s", "0.0 s"] and _cells(t, 5) == ["cached", "RuntimeError: boom"]
