"""Regenerate the README's gallery from a `reproduce all` output folder (run by `make gallery`).

Copies a few figures into docs/ and writes docs/claims_quick.md: the claims table, one row per
claim, measured and expected as the reproductions recorded them.
"""

import json
import shutil
import sys
from pathlib import Path

from attnrank.report import fmt_value

FIGURES = {"fig1/fig1.png": "gallery_fig1.png", "fig2/fig2.png": "gallery_fig2.png",
           "collapse/collapse_layers.png": "gallery_collapse.png", "fig4/fig4_norms.png": "fig4_norms.png"}


def one_line(v) -> str:
    return fmt_value(v, 3).replace("\n", "; ").replace("|", "/")


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
    (docs / "claims_quick.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
