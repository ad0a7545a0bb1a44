"""Regenerate the gallery from a `reproduce all` output folder (`make gallery` for the quick
profile, `make gallery-full` for the full one; a `reproduce all --profile paper` folder writes
docs/claims_paper.md only).

Copies a few figures into docs/ (quick profile only), writes docs/claims_{quick,full}.md (the
summary table of the report, then every claim grouped as the tally counts them: the documents'
findings with their quotes and rules, supporting evidence, our checks, identities), replaces
docs/report.md's summary table of that profile (between its BEGIN/END markers) with the same
summary table the report opens with, and writes the coverage table into docs/METHODS.md
(between its markers).
"""

import json
import shutil
import sys
from pathlib import Path

from headrank.report.html import GROUP_TITLES, brief, claim_groups, measured_brief, reading
from headrank.studies import coverage
from headrank.studies.registry import citation_problems, tally
from headrank.util.fileio import write_text

FIGURES = {"fig1/fig1.png": "gallery_fig1.png", "fig2/fig2.png": "gallery_fig2.png",
           "fig2/fig2_horizon.png": "gallery_fig2_horizon.png",
           "fig3/fig3.png": "gallery_fig3.png", "collapse/collapse_layers.png": "gallery_collapse.png"}


def clean(text: str) -> str:
    return text.replace("\n", "; ").replace("|", "\\|")  # a pipe inside a Markdown table cell


def cell(v) -> str:
    return clean(brief(v))


def markers(profile: str) -> tuple[str, str]:
    return f"<!-- claims-{profile}:begin (make gallery) -->", f"<!-- claims-{profile}:end -->"


def _checks(t: dict) -> str:
    c = t["checks"]
    return f"{c['held']} of {sum(c.values())}" if sum(c.values()) else "—"


def summary_table(summary: dict, claims: list[dict]) -> str:
    """The report's first table: one row per reproduction (documents' findings counted once;
    supporting evidence and our checks apart)."""
    lines = ["| reproduction | findings held | not held | inconclusive | untested | supporting re-tests | "
             "our checks held | identities verified | runtime |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in summary["reproductions"]:
        t = tally([c for c in claims if c["reproduction"] == r["name"]], {c["name"] for c in claims})
        f, i = t["findings"], t["identities"]
        ident = f"{i['verified']} of {i['verified'] + i['failed']}" if i["verified"] + i["failed"] else "—"
        err = f" (error: {r['error']})" if r.get("error") else ""
        lines.append(f"| {r['name']}{err} | {f['held']} | {f['not held']} | {f['inconclusive']} | "
                     f"{t.get('untested') or '—'} | {t['supporting'] or '—'} | {_checks(t)} | {ident} | "
                     f"{r['runtime_s'] or 0:.0f} s |")
    t = tally(claims)
    f, i = t["findings"], t["identities"]
    lines.append(f"| **all** | **{f['held']}** | **{f['not held']}** | **{f['inconclusive']}** | "
                 f"**{t.get('untested', 0)}** | **{t['supporting']}** | "
                 f"**{_checks(t)}** | **{i['verified']} of {i['verified'] + i['failed']}** | "
                 f"**{summary['total_runtime_s']:.0f} s** |")
    return "\n".join(lines)


#: docs/preregistration.json's record (set by main): whether a claim's rule changed after the
#: profile's stored run, for claims whose run recorded no rule hash
PREREG: dict = {}


def changed_after_run(c: dict) -> bool:
    """Whether the rule that judged ``c`` was changed after its run was made: from the claim
    (runs that recorded their rule's hash) or else from docs/preregistration.json."""
    if c.get("rule_changed_after_run") is not None:
        return bool(c["rule_changed_after_run"])
    return bool(PREREG.get(c.get("name"), False))


def _verdict(c: dict) -> str:
    mark = " †" if changed_after_run(c) else ""
    return _verdict_word(c) + mark


def _verdict_word(c: dict) -> str:
    verdict = c.get("verdict") or ("held" if c["held"] else "not held")
    if c.get("kind") == "identity":
        return "verified" if c["held"] else "**FAILED**"
    if c.get("untested"):
        return f"**untested** (tested by `{c['untested']}`)"
    return verdict if verdict == "held" else f"**{verdict}**"


def claims_table(claims: list[dict]) -> str:
    """Every claim, grouped as the tally counts them; findings with their quote and rule."""
    out = []
    for key, title in GROUP_TITLES.items():
        group = claim_groups(claims)[key]
        if not group:
            continue
        extra = " | supports" if key == "supporting" else ""
        rows = [f"### {title}", "", f"| reproduction | claim | verdict | measured | expected | exposure{extra} |",
                "| --- | --- | --- | --- | --- | ---" + (" | ---" if extra else "") + " |"]
        for c in group:
            exp = cell(c["exposure"]) if c.get("exposure") not in (None, {}) else ""
            sup = f" | `{c['supports']}`" if extra else ""
            rows.append(f"| {c['reproduction']} | `{c['name']}` | {_verdict(c)} | {clean(measured_brief(c))} | "
                        f"{cell(c['expected'])} | {exp}{sup} |")
        out.append("\n".join(rows))
    return "\n\n".join(out)


def quotes_and_rules(claims: list[dict]) -> str:
    """Per counted finding: the document's sentence, where it stands, the rule fixed before the
    run, the verdict and its reason."""
    lines = []
    for c in claim_groups(claims)["findings"]:
        why = f" — {c['reason']}" if c.get("reason") else ""
        sha = f" (sha256 {c['rule_sha256'][:12]})" if c.get("rule_sha256") else ""
        lines.append(f"- **`{c['name']}`** ({c.get('source', '')}): “{c.get('quote', '')}”  \n"
                     f"  rule{sha}: {c.get('rule', '')}  \n  verdict: {_verdict(c)}{clean(why)}")
    return "\n".join(lines)


def update_readme(readme: Path, profile: str, table: str) -> None:
    begin, end = markers(profile)
    text = readme.read_text()
    if begin not in text or end not in text:
        print(f"{readme}: no {profile} claims markers, README left as it is", file=sys.stderr)
        return
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    write_text(readme, f"{head}{begin}\n{table}\n{end}{tail}")


def update_between(path: Path, begin: str, end: str, body: str) -> None:
    """Replace the text between two marker lines of ``path`` (left as it is without them)."""
    text = path.read_text()
    if begin not in text or end not in text:
        print(f"{path}: no {begin} markers, left as it is", file=sys.stderr)
        return
    head, rest = text.split(begin, 1)
    write_text(path, f"{head}{begin}\n{body}\n{end}{rest.split(end, 1)[1]}")


def notes(src: Path, summary: dict) -> str:
    """Every reproduction's notes (its run.json), as a list per reproduction."""
    out = []
    for r in summary["reproductions"]:
        meta = json.loads((src / r["name"] / "run.json").read_text()) if (src / r["name"] / "run.json").exists() else {}
        out.append(f"### {r['name']}\n\n" + "\n".join(f"- {clean(n)}" for n in meta.get("notes", [])))
    return "\n\n".join(out)


def main(src: Path, docs: Path) -> None:
    summary = json.loads((src / "summary.json").read_text())
    claims = json.loads((src / "claims.json").read_text())
    profile = summary.get("profile") or ("quick" if summary["quick"] else "full")
    if profile == "quick":
        for rel, name in FIGURES.items():
            if (src / rel).exists():
                shutil.copyfile(src / rel, docs / name)
    record = json.loads((docs / "preregistration.json").read_text()) if (docs / "preregistration.json").exists() else {}
    PREREG.update({n: r["changed_after_stored_run"].get(profile, False) for n, r in record.get("claims", {}).items()})
    table = summary_table(summary, claims)
    problems = citation_problems(claims)
    text = (f"# Claims, {profile} profile\n\n{reading(claims)}\n\n{table}\n\n"
            + (f"Citation problems: {'; '.join(problems)}\n\n" if problems else "")
            + "† the rule that judged this claim was changed after its run was made (a departure from "
              "pre-registration: docs/METHODS.md §4, docs/preregistration.json).\n\n"
            + f"## The documents' findings: quote, rule, verdict\n\n{quotes_and_rules(claims)}\n\n"
            f"## Every claim\n\n{claims_table(claims)}\n")
    if profile not in ("quick", "full"):  # a study's own profile (paper): its claims page only, with its notes
        text += f"\n## How it ran: each reproduction's notes\n\n{notes(src, summary)}\n"
        write_text(docs / f"claims_{profile}.md", text)
        print(text)
        return
    write_text(docs / f"claims_{profile}.md", text)
    update_readme(docs / "report.md", profile, table)  # the claims tables live on the report page
    update_between(docs / "METHODS.md", "<!-- coverage:begin (docs/gallery.py) -->", "<!-- coverage:end -->",
                   coverage.markdown())
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
