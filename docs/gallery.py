"""Regenerate the README's gallery from a `reproduce all` output folder (`make gallery` for the quick
profile, `make gallery-full` for the full one).

Copies a few figures into docs/ (quick profile only), writes docs/claims_{quick,full}.md (the
summary table of the report, then every claim: kind, verdict, measured, expected, exposure)
and replaces the README's summary table of that profile (between its BEGIN/END markers) with
the same summary table the report opens with.
"""

import json
import shutil
import sys
from pathlib import Path

from attnrank.report.html import brief, measured_brief, reading
from attnrank.studies.registry import tally
from attnrank.util.fileio import write_text

FIGURES = {"fig1/fig1.png": "gallery_fig1.png", "fig2/fig2.png": "gallery_fig2.png",
           "fig3/fig3.png": "gallery_fig3.png", "collapse/collapse_layers.png": "gallery_collapse.png"}


def clean(text: str) -> str:
    return text.replace("\n", "; ").replace("|", "\\|")  # a pipe inside a Markdown table cell


def cell(v) -> str:
    return clean(brief(v))


def markers(profile: str) -> tuple[str, str]:
    return f"<!-- claims-{profile}:begin (make gallery) -->", f"<!-- claims-{profile}:end -->"


def summary_table(summary: dict, claims: list[dict]) -> str:
    """The report's first table: one row per reproduction."""
    lines = ["| reproduction | findings held | not held | inconclusive | identities verified | runtime |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in summary["reproductions"]:
        t = tally([c for c in claims if c["reproduction"] == r["name"]])
        f, i = t["findings"], t["identities"]
        ident = f"{i['verified']} of {i['verified'] + i['failed']}" if i["verified"] + i["failed"] else "—"
        err = f" (error: {r['error']})" if r.get("error") else ""
        lines.append(f"| {r['name']}{err} | {f['held']} | {f['not held']} | {f['inconclusive']} | {ident} | "
                     f"{r['runtime_s'] or 0:.0f} s |")
    t = tally(claims)
    f, i = t["findings"], t["identities"]
    lines.append(f"| **all** | **{f['held']}** | **{f['not held']}** | **{f['inconclusive']}** | "
                 f"**{i['verified']} of {i['verified'] + i['failed']}** | **{summary['total_runtime_s']:.0f} s** |")
    return "\n".join(lines)


def claims_table(claims: list[dict]) -> str:
    rows = ["| reproduction | claim | kind | verdict | measured | expected | exposure |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in claims:
        verdict = c.get("verdict") or ("held" if c["held"] else "not held")
        if c.get("kind") == "identity":
            verdict = "verified" if c["held"] else "**FAILED**"
        elif verdict != "held":
            verdict = f"**{verdict}**"
        exp = cell(c["exposure"]) if c.get("exposure") not in (None, {}) else ""
        rows.append(f"| {c['reproduction']} | `{c['name']}` | {c.get('kind', 'finding')} | {verdict} | "
                    f"{clean(measured_brief(c))} | {cell(c['expected'])} | {exp} |")
    return "\n".join(rows)


def update_readme(readme: Path, profile: str, table: str) -> None:
    begin, end = markers(profile)
    text = readme.read_text()
    if begin not in text or end not in text:
        print(f"{readme}: no {profile} claims markers, README left as it is", file=sys.stderr)
        return
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    write_text(readme, f"{head}{begin}\n{table}\n{end}{tail}")


def main(src: Path, docs: Path) -> None:
    summary = json.loads((src / "summary.json").read_text())
    claims = json.loads((src / "claims.json").read_text())
    profile = "quick" if summary["quick"] else "full"
    if profile == "quick":
        for rel, name in FIGURES.items():
            if (src / rel).exists():
                shutil.copyfile(src / rel, docs / name)
    table = summary_table(summary, claims)
    text = (f"# Claims, {profile} profile\n\n{reading(claims)}\n\n{table}\n\n## Every claim\n\n"
            f"{claims_table(claims)}\n")
    write_text(docs / f"claims_{profile}.md", text)
    update_readme(docs.parent / "README.md", profile, table)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
