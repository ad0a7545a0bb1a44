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
from headrank.studies.registry import citation_problems, statements, tally
from headrank.studies.verdicts import FAMILY_ALPHA, MARGIN_RULE, PLUS_MINUS
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


#: docs/preregistration.json's record (set by main): per claim, whether its rule was set after
#: data with the same seeds existed (the dagger) or changed after the run it judges
PREREG: dict = {}


def changed_after_run(c: dict) -> bool:
    """† for ``c``: its rule was set after same-seed data existed (docs/preregistration.json's
    ``dagger``), or changed after the run it judges (the claim's own record, or the file's)."""
    if c.get("rule_changed_after_run"):
        return True
    return bool(PREREG.get(c.get("name"), False))


def _interval(t: dict) -> str:
    if t.get("lo") is None or t.get("verdict") == "untested":
        return f"n {t.get('n')}: no interval"
    return (f"{t['diff']:.3g} ± {t['spread']:.3g} = [{t['lo']:.3g}, {t['hi']:.3g}], margin {t['margin']:.3g}, "
            f"n {t['n']}")


def statements_table(claims: list[dict]) -> str:
    """The counted statements, each once: its claims, verdict after Holm, and each test's
    interval, margin and n."""
    rows = ["| statement (coverage row) | claims | verdict | Holm | tests: mean ± half-width = [lo, hi], margin, n |",
            "| --- | --- | --- | --- | --- |"]
    for st in statements(claims):
        by = {c["name"]: c for c in claims}
        tests = "; ".join(_interval(t) for n in st["claims"] for t in (by[n].get("tests") or [])) or "—"
        row = coverage.COVERAGE[st["row"]] if st["row"] is not None else None
        label = f"{row[1]}: {row[2]}" if row else st["claims"][0]
        verdict = st["verdict"] + (" †" if any(changed_after_run(by[n]) for n in st["claims"]) else "")
        rows.append(f"| {clean(label)} | {', '.join(f'`{n}`' for n in st['claims'])} | {verdict} | "
                    f"{clean(st.get('holm', '') or '—')} | {clean(tests)} |")
    return "\n".join(rows)


RULES_LINE = (f"How a verdict is reached: each finding declares its margin before its run; {MARGIN_RULE}. "
              f"Holm's family-wise control at {FAMILY_ALPHA:g} (one-sided) runs over the counted statements that "
              "carry tests; a verdict that does not survive it is counted inconclusive. " + PLUS_MINUS + ".")


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
    PREREG.update({n: bool(r.get("dagger", {}).get(profile) or r["changed_after_stored_run"].get(profile))
                   for n, r in record.get("claims", {}).items()})
    table = summary_table(summary, claims)
    problems = citation_problems(claims)
    t = tally(claims)
    holm = (f"Holm: {t['holm_family']} statements in the family, {t['holm_demoted']} demoted to inconclusive.")
    text = (f"# Claims, {profile} profile\n\n{reading(claims)}\n\n{RULES_LINE}\n\n{table}\n\n{holm}\n\n"
            + (f"Citation problems: {'; '.join(problems)}\n\n" if problems else "")
            + "† the rule that judged this claim was set after data with the same seeds existed, or changed after "
              "its run was made (not a pre-registration in the strict sense: docs/METHODS.md §4, "
              "docs/preregistration.json's dagger).\n\n"
            + f"## The statements, each counted once\n\n{statements_table(claims)}\n\n"
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
