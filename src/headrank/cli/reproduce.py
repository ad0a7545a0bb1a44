"""``headrank reproduce``: run, resume or replot the documents' reproductions and print their verdicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from headrank.cli.common import (
    app,
    err_console,
    out_console,
    styled,
    user_errors,
)
from headrank.errors import HeadRankError


@app.command()
@user_errors
def reproduce(
    name: Annotated[str | None, typer.Argument(help="reproduction to run (see --list), e.g. fig1, fig5, or 'all'")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="write report.html, claims.json, data.json, run.json and PNGs here (default: out/NAME)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the known reproductions and exit")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 if any claim did not hold")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="smaller, faster variant (fewer sweep points)")] = False,
    full: Annotated[bool, typer.Option("--full", help="the full variant (the default; explicit for 'all')")] = False,
    profile: Annotated[str | None, typer.Option("--profile", help="a profile the reproduction offers: quick, full, or its own (paper: fig3, table1, decouple in the paper's regime; paper_vit: fig3's ViT half; docs/paper_regime.md)")] = None,
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

    from headrank.report.result import reproduce as run_reproduce
    from headrank.studies import registry

    if list_:
        _print_listing(registry.listing(), as_json)
        return
    if name is None:
        raise HeadRankError("give a reproduction NAME, 'all', or --list")
    profile = _profile(quick, full, profile, replot, force)
    if name == "all" and model is not None:
        raise HeadRankError("--model applies to one reproduction (e.g. fig4), not to 'all'")
    if name == "all":
        _reproduce_all(out or Path("out") / "all", profile=profile, force=force, strict=strict, as_json=as_json,
                       quiet=quiet, replot=replot)
        return
    entry = registry.get(name)  # unknown names fail here, before any work
    if profile is not None:
        entry.study.make_params(profile)  # a profile the study does not offer: one line, before any work
    out = out if out is not None else Path("out") / name
    from headrank.util.progress import Heartbeat  # where stderr is no terminal: a line every 30 s

    show, label = not (quiet or as_json), f"{'replotting' if replot else 'reproducing'} {name}"
    with (err_console.status(f"{label} ...") if show and err_console.is_terminal
          else Heartbeat(err_console, label) if show else nullcontext()):
        result = run_reproduce(name, out, profile=profile, model=model, replot=replot)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    elif not quiet:
        _print_claims(name, out, result)
    if strict and not result.all_held:
        raise typer.Exit(1)


def _profile(quick: bool, full: bool, profile: str | None, replot: bool, force: bool) -> str:
    """The one profile that --quick, --full and --profile NAME ask for (full by default)."""
    asked = [p for p, on in (("quick", quick), ("full", full)) if on] + ([profile] if profile is not None else [])
    if len(set(asked)) > 1:
        raise HeadRankError(f"--quick, --full and --profile exclude each other; got {', '.join(asked)}")
    if replot and (asked or force):
        raise HeadRankError("--replot keeps the stored run's profile: drop --quick/--full/--profile/--force")
    return asked[0] if asked else "full"


def _print_listing(rows: list[tuple[str, str]], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps([{"name": n, "title": t} for n, t in rows], indent=2) + "\n")
    else:
        for n, t in rows:
            out_console.print(styled("bold", n, f"  {t}"), highlight=False, soft_wrap=True)


def _print_claims(name: str, out: Path, result) -> None:
    """One reproduction's claims as a console table (:func:`headrank.report.console.claims_table`)."""
    from headrank.report.console import claims_table

    out_console.print(claims_table(name, result.claims, result.meta.get("runtime_s")))
    out_console.print(f"wrote {out / 'report.html'} (+ claims.json, data.json, run.json, "
                      f"{len(result.meta.get('figures', []))} PNG)", highlight=False)


def _reproduce_all(out: Path, *, profile: str, force: bool, strict: bool, as_json: bool, quiet: bool,
                   replot: bool = False) -> None:
    from headrank.report import runner as rep
    from headrank.report.result import ReproduceResult

    def progress(name: str, state: str) -> None:
        if not (quiet or as_json):
            err_console.print(f"{name}: {state}", highlight=False)

    entries = rep.run_all(out, quick=profile == "quick", force=force, progress=progress, replot=replot,
                          profile=profile)
    summary = ReproduceResult.load(out).to_json()
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    elif not quiet:
        from headrank.report.console import all_table

        out_console.print(all_table(summary))
        out_console.print(f"wrote {out / 'report.html'} (+ claims.json, summary.json, one folder per reproduction)",
                          highlight=False)
    if any(e.error for e in entries):
        raise typer.Exit(3)
    if strict and summary["claims_held"] < summary["claims_total"]:
        raise typer.Exit(1)
