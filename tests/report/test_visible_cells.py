"""The report stays readable however long the rules grow: no table cell shows more than 400
characters; statements, quotes, rules and long values go into folds beside their verdicts."""

from __future__ import annotations

from html.parser import HTMLParser

from headrank.report.html import MAX_VISIBLE, coverage_html, render_report
from headrank.studies.registry import Claim


class Cells(HTMLParser):
    """The visible text of every table cell: text inside a <details> counts only in its <summary>."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.depth = 0  # open <td> elements
        self.details = 0
        self.summary = 0

    def handle_starttag(self, tag, attrs):
        if tag == "td":
            self.depth += 1
            self.cells.append("")
        elif tag == "details":
            self.details += 1
        elif tag == "summary":
            self.summary += 1

    def handle_endtag(self, tag):
        if tag == "td":
            self.depth -= 1
        elif tag == "details":
            self.details -= 1
        elif tag == "summary":
            self.summary -= 1

    def handle_data(self, data):
        if self.depth and (not self.details or self.summary) and self.cells:
            self.cells[-1] += data


def visible_cells(html: str) -> list[str]:
    p = Cells()
    p.feed(html)
    return [" ".join(c.split()) for c in p.cells]


LONG = "every word of a long pre-registered rule " * 40  # 1,640 characters


def test_no_visible_cell_over_the_limit_and_everything_kept_in_folds():
    claims = [Claim(name="probe.long_everything", source="paper, Figure 2 caption", statement=LONG,
                    measured={f"lambda={i}": {"rank": i, "gap": 0.1 * i} for i in range(30)}, expected=LONG,
                    held=False, rule=LONG, detail=LONG, key=LONG, quote=LONG, reason=LONG).to_json(),
              Claim(name="probe.short", source="paper", statement="a short statement", measured=1.0, expected=1.0,
                    held=True, quote="A short quote.", key="1.0 vs 1.0").to_json()]
    meta = {"name": "probe", "title": "probe", "source": "tests", "quick": True, "runtime_s": 1.0,
            "params": {"rule": LONG}, "versions": {}, "notes": [LONG]}
    html = render_report(meta=meta, claims=claims, figures=[])
    cells = visible_cells(html)
    assert cells and max(len(c) for c in cells) <= MAX_VISIBLE, max(cells, key=len)[:200]
    assert html.count(LONG.strip()) >= 5  # statement, quote, rule, detail, key: whole, in folds
    assert "A short quote." in "".join(cells)  # a short quote stays beside its statement


def test_coverage_table_cells_are_short():
    cells = visible_cells(coverage_html({}))
    assert len(cells) > 20 and max(len(c) for c in cells) <= MAX_VISIBLE
