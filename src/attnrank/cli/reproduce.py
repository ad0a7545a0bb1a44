"""``attnrank reproduce``: run, resume or replot the documents' reproductions and print their verdicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from attnrank.cli.common import (
    app,
    err_console,
    out_console,
    styled,
    user_errors,
)
from attnrank.errors import AttnRankError


@app.command()
@user_errors
def reproduce(
    name: Annotated[str | None, typer.Argument(help="reproduction to run (see --list), e.g. fig1, fig5, or 'all'")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="write report.html, claims.json, data.json, run.json and PNGs here (default: out/NAME)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the known reproductions and exit")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 if any claim did not hold")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="smaller, faster variant (fewer sweep points)")] = False,
    full: Annotated[bool, typer.Option("--full", help="the full variant (the default; explicit for 'all')")] = False,
    force: Annotated[bool, typer.Option("--force", help="with 'all': recompute parts already finished in --out")] = False,
    model: Annotated[str | None, typer.Option("--model", help="run the reproduction's analysis on this checkpoint instead of its default (where it has one, e.g. fig4)")] = None,
    replot: Annotated[bool, typer.Option("--replot", help="run nothing: re-judge the claims and redraw the figures from the data.json a finished run left in --out")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the claims as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print nothing on success")] = False,
) -> None:
    """Reproduce a figure or claim of the source documents; every claim is checked with numbers.

    Exit status 0 when it ran (claims that did not hold are findings), 1 with --strict when any
    claim did not hold, 2 on user errors.
    """
    from contextlib import nullcontext

    from attnrank.report import runner as rep
    from attnrank.studies import registry

    if list_:
        _print_listing(registry.listing(), as_json)
        return
    if name is None:
        raise AttnRankError("give a reproduction NAME, 'all', or --list")
    if quick and full:
        raise AttnRankError("--quick and --full exclude each other")
    if replot and (quick or full or force):
        raise AttnRankError("--replot keeps the stored run's profile: drop --quick/--full/--force")
    if name == "all" and model is not None:
        raise AttnRankError("--model applies to one reproduction (e.g. fig4), not to 'all'")
    from attnrank.util.fileio import check_writable

    if not replot:
        check_writable(out or Path("out") / name)  # before any training, not after it
    if name == "all":
        _reproduce_all(out or Path("out") / "all", quick=quick, force=force, strict=strict, as_json=as_json,
                       quiet=quiet, replot=replot)
        return
    registry.get(name)  # unknown names fail here, before any work
    out = out if out is not None else Path("out") / name
    from attnrank.util.progress import Heartbeat  # where stderr is no terminal: a line every 30 s

    show, label = not (quiet or as_json), f"{'replotting' if replot else 'reproducing'} {name}"
    with (err_console.status(f"{label} ...") if show and err_console.is_terminal
          else Heartbeat(err_console, label) if show else nullcontext()):
        summary = rep.run(name, out, quick=quick, replot=replot,
                          overrides={"model": model} if model is not None else None)
    if as_json:
        sys.stdout.write(json.dumps({"name": name, "out": str(out), "runtime_s": summary.runtime_s,
                                     "claims": [c.to_json() for c in summary.claims]}, indent=2) + "\n")
    elif not quiet:
        _print_claims(name, out, summary)
    if strict and not summary.all_held:
        raise typer.Exit(1)


def _print_listing(rows: list[tuple[str, str]], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps([{"name": n, "title": t} for n, t in rows], indent=2) + "\n")
    else:
        for n, t in rows:
            out_console.print(styled("bold", n, f"  {t}"), highlight=False, soft_wrap=True)


def _print_claims(name: str, out: Path, summary) -> None:
    """One reproduction's claims as a console table: kind, verdict, measured against expected."""
    from attnrank.report.html import brief, measured_brief
    from attnrank.studies.registry import tally

    claims = [c.to_json() for c in summary.claims]
    table = Table(title=f"{name}: {headline(tally(claims))} ({summary.runtime_s:.1f} s)")
    table.add_column("claim")
    table.add_column("kind")
    table.add_column("verdict")
    table.add_column("measured", overflow="fold")
    table.add_column("expected", overflow="fold")
    for c in claims:
        table.add_row(Text(c["name"]), c["kind"], verdict_badge(c),
                      Text(measured_brief(c)), Text(brief(c["expected"])))
    out_console.print(table)
    out_console.print(f"wrote {out / 'report.html'} (+ claims.json, data.json, run.json, "
                      f"{sum(f.suffix == '.png' for f in summary.files)} PNG)", highlight=False)


def _reproduce_all(out: Path, *, quick: bool, force: bool, strict: bool, as_json: bool, quiet: bool,
                   replot: bool = False) -> None:
    from attnrank.report import runner as rep

    def progress(name: str, state: str) -> None:
        if not (quiet or as_json):
            err_console.print(f"{name}: {state}", highlight=False)

    entries = rep.run_all(out, quick=quick, force=force, progress=progress, replot=replot)
    summary = json.loads((out / "summary.json").read_text())
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    elif not quiet:
        table = Table(title=f"reproduce all ({'quick' if summary['quick'] else 'full'}): {headline(summary['tally'])}")
        for col in ("reproduction", "findings held / not held / inconclusive", "our checks held", "identities verified",
                    "runtime", "note"):
            table.add_column(col)
        for r in summary["reproductions"]:
            f, i, c = r["tally"]["findings"], r["tally"]["identities"], r["tally"].get("checks", {})
            table.add_row(r["name"], f"{f['held']} / {f['not held']} / {f['inconclusive']}",
                          f"{c.get('held', 0)} of {sum(c.values())}", f"{i['verified']} of {i['verified'] + i['failed']}",
                          f"{r['runtime_s'] or 0:.1f} s", Text("cached" if r["cached"] else (r["error"] or "")))
        out_console.print(table)
        out_console.print(f"wrote {out / 'report.html'} (+ claims.json, summary.json, one folder per reproduction)",
                          highlight=False)
    if any(e.error for e in entries):
        raise typer.Exit(3)
    if strict and summary["claims_held"] < summary["claims_total"]:
        raise typer.Exit(1)


def headline(t: dict) -> str:
    """'findings: 5 held, 1 not held, 2 inconclusive; identities: 7 of 7 verified' (+ our checks,
    tallied apart; supporting evidence is not counted again)."""
    f, i = t["findings"], t["identities"]
    c = t.get("checks") or {"held": 0, "not held": 0, "inconclusive": 0}
    checks = (f"; our checks: {c['held']} held, {c['not held']} not held, {c['inconclusive']} inconclusive"
              if sum(c.values()) else "")
    return (f"findings: {f['held']} held, {f['not held']} not held, {f['inconclusive']} inconclusive; "
            f"identities: {i['verified']} of {i['verified'] + i['failed']} verified{checks}")


def verdict_badge(c: dict) -> Text:
    if c.get("kind") == "identity":
        return Text("verified", style="green") if c["held"] else Text("FAILED", style="bold red")
    style = {"held": "green", "not held": "red", "inconclusive": "yellow"}[c["verdict"]]
    return Text(c["verdict"], style=style)
