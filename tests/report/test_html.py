"""report.html pieces: the compact "measured" cell (a claim's key, else a brief of what it measured)."""

from headrank.report.html import brief, measured_brief, render_report
from headrank.studies.registry import Claim, arrow, g3, series


def test_brief_numbers_small_dicts_and_ranges():
    assert brief(0.000123456) == "1.235e-04"
    assert brief({"a": 1.0, "b": 2.5}) == "a: 1; b: 2.5"
    assert brief({"none": "<= 0.1", "post": "<= 0.1", "pre": "> max"}) == "none: <= 0.1; post: <= 0.1; pre: > max"
    assert brief({"x": [1.0, 2.0, 3.0], "y": {"z": 0.5}, "w": 7.0}) == "0.5 … 7 (5 values)"


def test_key_helpers_format_for_reading():
    assert g3(14.571523976) == "14.6" and g3(None) == "—"
    assert series({"0": 14.57, "3": 1.879}) == "λ 0: 14.6, 3: 1.88"
    assert series({"0": 1.0}, name="") == "0: 1"
    assert arrow({"0": 7.1019, "1": 5.7008, "3": 1.5}) == "7.1 → 5.7 → 1.5"


def test_measured_cell_shows_the_key_and_keeps_everything_in_the_fold():
    measured = {"final_effective_rank": {"0": 14.57, "3": 1.88}, "per_seed": {"0": [14.6, 14.5], "3": [1.8, 1.9]}}
    with_key = Claim("s.c", "src", "falls", measured, "falls", held=True, key="effective rank, λ 0: 14.6, 3: 1.88").to_json()
    without = Claim("s.d", "src", "falls", measured, "falls", held=True).to_json()
    assert measured_brief(with_key) == "effective rank, λ 0: 14.6, 3: 1.88"
    assert measured_brief(without) == "1.8 … 14.6 (6 values)"
    html = render_report(meta={"name": "s", "title": "t", "source": "src", "runtime_s": 1.0, "quick": True,
                               "params": {}, "versions": {}}, claims=[with_key], figures=[])
    assert "<td class='n'>effective rank, λ 0: 14.6, 3: 1.88</td>" in html
    assert "(6 values)" not in html
    assert "14.57" in html  # the full measured value is still there, in the fold


def test_claims_are_grouped_as_the_tally_counts_them_with_quote_rule_and_coverage():
    from headrank.report.html import claim_groups, coverage_html, reading

    f = Claim("s.f", "paper, Figure 2 caption", "falls", 1.0, 1.0, held=True, quote="We observe that",
              rule="trend beyond t x SE").to_json()
    sup = Claim("s.g", "paper", "falls again", 1.0, 1.0, held=False, supports="s.f", quote="We observe that").to_json()
    chk = Claim("s.h", "our check", "task learned", 1.0, 1.0, held=True, kind="check").to_json()
    groups = claim_groups([f, sup, chk])
    assert [len(groups[k]) for k in ("findings", "supporting", "checks", "identities")] == [1, 1, 1, 0]
    text = reading([f, sup, chk])
    assert "Of the 1 statements" in text and "not held or inconclusive among them: s.g" in text
    html = render_report(meta={"name": "s", "title": "t", "source": "src", "runtime_s": 1.0, "quick": True,
                               "params": {}, "versions": {}}, claims=[f, sup, chk], figures=[])
    assert html.index("Findings (statements") < html.index("Supporting evidence") < html.index("Our checks")
    assert "<blockquote>We observe that<cite>paper, Figure 2 caption</cite></blockquote>" in html
    assert "Rule (fixed before the run):</b> trend beyond t x SE" in html
    cov = coverage_html({"fig2.qk_identical": {**f, "verdict": "held", "held": True}})
    assert "fig2.qk_identical <span class='badge held'>held</span>" in cov and "(not run)" in cov
