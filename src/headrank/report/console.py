"""The reproductions' verdicts for the terminal: rich tables beside :mod:`headrank.report.html`,
built from the same claim dicts and tally (the CLI only prints them)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from headrank.report.html import brief, measured_brief
from headrank.studies.registry import tally


def headline(t: dict[str, Any]) -> str:
    """'findings: 5 held, 1 not held, 2 inconclusive; identities: 7 of 7 verified' (+ our checks,
    tallied apart; supporting evidence is not counted again)."""
    f, i = t["findings"], t["identities"]
    c = t.get("checks") or {"held": 0, "not held": 0, "inconclusive": 0}
    checks = (f"; our checks: {c['held']} held, {c['not held']} not held, {c['inconclusive']} inconclusive"
              if sum(c.values()) else "")
    untested = f", {t['untested']} untested (not counted)" if t.get("untested") else ""
    return (f"findings: {f['held']} held, {f['not held']} not held, {f['inconclusive']} inconclusive{untested}; "
            f"identities: {i['verified']} of {i['verified'] + i['failed']} verified{checks}")


def verdict_badge(c: dict[str, Any]) -> Text:
    """A claim's verdict, coloured (an identity reads 'verified' or 'FAILED')."""
    if c.get("kind") == "identity":
        return Text("verified", style="green") if c["held"] else Text("FAILED", style="bold red")
    style = {"held": "green", "not held": "red", "inconclusive": "yellow"}[c["verdict"]]
    return Text(c["verdict"], style=style)


def claims_table(name: str, claims: list[dict[str, Any]], runtime_s: float) -> Table:
    """One reproduction's claims: kind, verdict, measured against expected, under its tally."""
    table = Table(title=f"{name}: {headline(tally(claims))} ({runtime_s:.1f} s)")
    for col in ("claim", "kind", "verdict"):
        table.add_column(col)
    table.add_column("measured", overflow="fold")
    table.add_column("expected", overflow="fold")
    for c in claims:
        table.add_row(Text(c["name"]), c["kind"], verdict_badge(c), Text(measured_brief(c)), Text(brief(c["expected"])))
    return table


def all_table(summary: dict[str, Any]) -> Table:
    """``reproduce all``'s summary.json: one row per reproduction under the combined tally."""
    table = Table(title=f"reproduce all ({summary.get('profile') or ('quick' if summary['quick'] else 'full')}): {headline(summary['tally'])}")
    for col in ("reproduction", "findings held / not held / inconclusive", "our checks held", "identities verified",
                "runtime", "note"):
        table.add_column(col)
    for r in summary["reproductions"]:
        f, i, c = r["tally"]["findings"], r["tally"]["identities"], r["tally"].get("checks", {})
        table.add_row(r["name"], f"{f['held']} / {f['not held']} / {f['inconclusive']}",
                      f"{c.get('held', 0)} of {sum(c.values())}", f"{i['verified']} of {i['verified'] + i['failed']}",
                      f"{r['runtime_s'] or 0:.1f} s", Text("cached" if r["cached"] else (r["error"] or "")))
    return table
