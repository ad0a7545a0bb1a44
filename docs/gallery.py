"""Regenerate the README's gallery from a `reproduce all` output folder (run by `make gallery`).

Copies a few figures into docs/, writes docs/claims_quick.md (the claims table, one row per
claim, measured and expected as the reproductions recorded them) and replaces the README's
compact claims table (between the BEGIN/END markers) with this run's verdicts.
"""

import json
import shutil
import sys
from pathlib import Path

from attnrank.report.html import fmt_value
from attnrank.util.fileio import write_text

FIGURES = {"fig1/fig1.png": "gallery_fig1.png", "fig2/fig2.png": "gallery_fig2.png",
           "collapse/collapse_layers.png": "gallery_collapse.png", "fig4/fig4_norms.png": "fig4_norms.png"}


def one_line(v) -> str:
    return fmt_value(v, 3).replace("\n", "; ").replace("|", "/")


BEGIN, END = "<!-- claims:begin (make gallery) -->", "<!-- claims:end -->"


def readme_table(summary: dict, claims: list[dict]) -> str:
    """Per reproduction: held / total and runtime; then every claim with its source and verdict."""
    lines = ["| reproduction | claims held | runtime | did not hold |", "| --- | --- | --- | --- |"]
    for r in summary["reproductions"]:
        failed = [c["name"].split(".", 1)[1] for c in claims if c["reproduction"] == r["name"] and not c["held"]]
        state = f"error: {r['error']}" if r["error"] else ", ".join(f"`{f}`" for f in failed) or "—"
        lines.append(f"| {r['name']} | {r['claims_held']} / {r['claims_total']} | {r['runtime_s'] or 0:.0f} s | {state} |")
    lines += ["", "<details><summary>every claim, its source and verdict</summary>", "",
              "| claim | source | verdict |", "| --- | --- | --- |"]
    for c in claims:
        lines.append(f"| `{c['name']}` | {c['source'].replace('|', '/')} | {'held' if c['held'] else '**did not hold**'} |")
    lines += ["", "</details>"]
    return "\n".join(lines)


def update_readme(readme: Path, table: str) -> None:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"{readme}: no claims markers, README left as it is", file=sys.stderr)
        return
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    write_text(readme, f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main(src: Path, docs: Path) -> None:
    for rel, name in FIGURES.items():
        if (src / rel).exists():
            shutil.copyfile(src / rel, docs / name)
    summary = json.loads((src / "summary.json").read_text())
    claims = json.loads((src / "claims.json").read_text())
    rows = ["| reproduction | claim | verdict | measured | expected |", "| --- | --- | --- | --- | --- |"]
    for c in claims:
        rows.append(f"| {c['reproduction']} | `{c['name']}` | {'held' if c['held'] else '**did not hold**'} | "
                    f"{one_line(c['measured'])} | {one_line(c['expected'])} |")
    runtimes = ", ".join(f"{r['name']} {r['runtime_s']:.0f} s" for r in summary["reproductions"] if r["runtime_s"])
    text = (f"{summary['claims_held']} of {summary['claims_total']} claims held "
            f"(quick profile; total runtime {summary['total_runtime_s']:.0f} s: {runtimes}).\n\n" + "\n".join(rows) + "\n")
    write_text(docs / "claims_quick.md", text)
    update_readme(docs.parent / "README.md", readme_table(summary, claims))
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
