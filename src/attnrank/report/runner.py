"""Reproductions of the source documents' figures and claims, each checked with numbers.

A reproduction is a function registered under a short name (``fig1``, ``fig5``, …) that
returns a :class:`Result`: its raw data (JSON-serialisable series), its figures, its
parameters and its :class:`Claim` checks. :func:`run` executes one and writes, atomically,

- ``report.html``: claims table first, figures inline (base64 PNG), parameters, library
  versions, runtime; self-contained (no external assets);
- ``claims.json``: a list of claim objects (``name``, ``source``, ``statement``, ``measured``,
  ``expected``, ``held``, ``tolerance``, ``detail``);
- ``data.json``: the raw series behind the figures and claims;
- ``run.json``: name, parameters, versions, runtime and the claim verdicts;
- one ``<figure>.png`` per figure.

A claim that did not hold is a finding, not an error: :func:`run` returns normally and the
CLI exits 0 unless ``--strict``.

Adding a reproduction (later issues): write the function in your own module, decorate it
with ``@register("name", title=..., source=...)``, and add ``"name": ("module", "title")`` to
:data:`CATALOGUE` so ``attnrank reproduce --list`` can show it without importing the module
(and its training code). The function takes ``quick: bool`` (a smaller, faster variant,
used by tests) and returns a :class:`Result`.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnrank.errors import AttnRankError
from attnrank.studies.registry import QUOTES, Claim, Result, get, names, tally
from attnrank.util.env import versions
from attnrank.util.fileio import jsonable, prepare_out_dir, write_atomic, write_json, write_text


@dataclass
class RunSummary:
    name: str
    out: Path
    claims: list[Claim]
    files: list[Path]
    runtime_s: float

    @property
    def all_held(self) -> bool:
        return all(c.held for c in self.claims)

    @property
    def n_held(self) -> int:
        return sum(c.held for c in self.claims)


def _png_bytes(fig, dpi: int = 110) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


def _read_json(path: Path, what: str) -> Any:
    import json

    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise AttnRankError(f"--replot needs {path.name} of a finished run in {path.parent}; "
                            f"run `attnrank reproduce {what} --out {path.parent}` first") from None
    except (OSError, ValueError) as e:
        raise AttnRankError(f"cannot read {path}: {e}") from None


def _evaluate(name: str, out: Path, *, quick: bool, replot: bool,
              overrides: dict[str, Any] | None = None) -> tuple[Result, dict[str, Any]]:
    """Run (or, with ``replot``, reload) reproduction ``name``: its Result and run facts."""
    import json

    entry = get(name)
    study = entry.study
    if overrides and (study is None or replot):
        raise AttnRankError(f"reproduction {name!r} takes no parameters from the command line"
                            + (" with --replot" if replot else ""))
    if study is None:  # the older shape: one function does everything
        if replot:
            raise AttnRankError(f"reproduction {name!r} cannot be replotted (it has no separate claims/figures)")
        t0 = time.perf_counter()
        result = entry.fn(quick=quick)
        if not isinstance(result, Result):
            raise TypeError(f"reproduction {name!r} returned {type(result).__name__}, not Result")
        return result, {"quick": quick, "runtime_s": time.perf_counter() - t0}
    if replot:
        old = _read_json(out / "run.json", name)
        if old.get("name") != name:
            raise AttnRankError(f"{out / 'run.json'} belongs to reproduction {old.get('name')!r}, not {name!r}")
        data = _read_json(out / "data.json", name)
        params = study.params_from_json(old.get("params") or {})
        facts = {"quick": bool(old.get("quick")), "runtime_s": old.get("runtime_s"), "replotted": True}
    else:
        params = study.make_params("quick" if quick else "full")
        if overrides:
            params = study.with_overrides(params, overrides)
        t0 = time.perf_counter()
        raw = study.run(params)
        facts = {"quick": quick, "runtime_s": time.perf_counter() - t0}
        data = json.loads(json.dumps(jsonable(raw)))  # exactly what data.json holds, so a replot sees the same
    t1 = time.perf_counter()
    claims = study.claims(data, params)
    figures = study.figures(data, params)
    notes = study.notes(data, params) if study.notes else []
    facts["judge_s"] = time.perf_counter() - t1
    return Result(claims=claims, figures=figures, data=data, params=asdict(params), notes=notes), facts


def run(name: str, out: str | Path, *, quick: bool = False, replot: bool = False,
        overrides: dict[str, Any] | None = None) -> RunSummary:
    """Run reproduction ``name`` and write its report, claims, data and figures into ``out``.

    ``replot``: run nothing; re-judge the claims and redraw the figures from the ``data.json``
    and ``run.json`` a finished run left in ``out`` (data.json is not rewritten).
    ``overrides``: parameter fields to set on the profile's parameters (e.g. ``{"model": path}``).
    """
    from attnrank.report.html import render_report

    entry = get(name)
    out = Path(out)
    if not replot:
        out = prepare_out_dir(out)
    result, facts = _evaluate(name, out, quick=quick, replot=replot, overrides=overrides)
    runtime = facts["runtime_s"]

    files: list[Path] = []
    figures = []
    for f in result.figures:
        png = _png_bytes(f.figure)
        files.append(write_atomic(out / f"{f.name}.png", lambda p, b=png: p.write_bytes(b)))
        figures.append({"name": f.name, "caption": f.caption,
                        "png_base64": base64.b64encode(png).decode("ascii")})

    claims = [c.to_json() for c in result.claims]
    meta = {
        "name": name,
        "title": entry.title,
        "source": entry.source,
        "quick": facts["quick"],
        "runtime_s": runtime,
        "params": jsonable(result.params),
        "versions": versions(),
        "claims_held": sum(c["held"] for c in claims),
        "claims_total": len(claims),
        "tally": tally(claims),
        "quote": QUOTES.get(name, ("", ""))[0],
        "quote_source": QUOTES.get(name, ("", ""))[1],
        "notes": list(result.notes),
        "figures": [{"name": f["name"], "caption": f["caption"]} for f in figures],
    }
    if facts.get("replotted"):
        meta["replotted_s"] = facts["judge_s"]
    files.append(write_json(out / "claims.json", claims))
    if not replot:
        files.append(write_json(out / "data.json", jsonable(result.data)))
    files.append(write_json(out / "run.json", meta))
    html = render_report(meta=meta, claims=claims, figures=figures)
    files.insert(0, write_text(out / "report.html", html))
    return RunSummary(name=name, out=out, claims=result.claims, files=files, runtime_s=runtime)


# --------------------------------------------------------------------------- all of them


@dataclass
class AllEntry:
    """One reproduction inside ``run_all``: its run.json, claims and whether it was cached."""

    name: str
    meta: dict[str, Any]
    claims: list[dict[str, Any]]
    cached: bool
    error: str | None = None


def _cached(sub: Path, quick: bool) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A finished run of the same profile in ``sub`` (run.json written last by :func:`run`)."""
    import json

    try:
        meta = json.loads((sub / "run.json").read_text())
        claims = json.loads((sub / "claims.json").read_text())
    except (OSError, ValueError):
        return None
    figs_ok = all((sub / f"{f['name']}.png").exists() for f in meta.get("figures", []))
    if meta.get("quick") is not quick or "figures" not in meta or not figs_ok:
        return None
    return meta, claims


def run_all(out: str | Path, *, quick: bool = False, force: bool = False, only: list[str] | None = None,
            progress: Callable[[str, str], None] | None = None, replot: bool = False) -> list[AllEntry]:
    """Run every reproduction into ``out/NAME/`` and write one combined report in ``out``.

    A reproduction already finished in ``out/NAME`` with the same profile is reused (re-running
    resumes rather than recomputes) unless ``force``. One that raises is recorded with its error
    and the others still run. Writes ``out/report.html`` (self-contained: claims of every
    reproduction first, then each one's figures, parameters and runtime, then the
    environment), ``out/claims.json`` and ``out/summary.json``.

    ``replot``: run nothing; re-judge and redraw every reproduction that has a stored run in
    ``out/NAME`` (see :func:`run`), keeping each one's recorded profile.
    """
    from attnrank.report.html import render_combined

    if replot and not Path(out).is_dir():
        raise AttnRankError(f"--replot needs a finished `reproduce all` in {out}; there is no such directory")
    out = prepare_out_dir(out)
    todo = only or names()
    for n in todo:
        get(n)  # unknown names fail before any work
    entries: list[AllEntry] = []
    for n in todo:
        sub = out / n
        if replot:
            if not (sub / "data.json").exists():
                if progress:
                    progress(n, "no stored run")
                continue
            run(n, sub, replot=True)
            meta = _read_json(sub / "run.json", n)
            entries.append(AllEntry(n, meta, _read_json(sub / "claims.json", n), cached=True))
            quick = bool(meta.get("quick"))
            if progress:
                progress(n, "replotted")
            continue
        hit = None if force else _cached(sub, quick)
        if hit is not None:
            entries.append(AllEntry(n, hit[0], hit[1], cached=True))
            if progress:
                progress(n, "cached")
            continue
        if progress:
            progress(n, "running")
        try:
            run(n, sub, quick=quick)
            meta, claims = _cached(sub, quick) or ({}, [])  # read back exactly what was written
        except AttnRankError:
            raise
        except Exception as e:  # noqa: BLE001 - one failing reproduction must not stop the others
            entries.append(AllEntry(n, {"name": n, "title": get(n).title, "source": get(n).source,
                                        "quick": quick}, [], cached=False,
                                    error=f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"))
            if progress:
                progress(n, "failed")
            continue
        entries.append(AllEntry(n, meta, claims, cached=False))
        if progress:
            progress(n, "done")

    figures: dict[str, list[dict[str, str]]] = {}
    for e in entries:
        figures[e.name] = [
            {**f, "png_base64": base64.b64encode((out / e.name / f"{f['name']}.png").read_bytes()).decode("ascii")}
            for f in e.meta.get("figures", [])
        ]
    all_claims = [{"reproduction": e.name, **c} for e in entries for c in e.claims]
    summary = {
        "quick": quick,
        "reproductions": [{"name": e.name, "runtime_s": e.meta.get("runtime_s"), "cached": e.cached,
                           "claims_held": sum(bool(c["held"]) for c in e.claims),
                           "claims_total": len(e.claims), "tally": tally(e.claims), "error": e.error}
                          for e in entries],
        "claims_held": sum(bool(c["held"]) for c in all_claims),
        "claims_total": len(all_claims),
        "tally": tally(all_claims),
        "total_runtime_s": sum(e.meta.get("runtime_s") or 0.0 for e in entries),
        "versions": versions(),
    }
    write_json(out / "claims.json", all_claims)
    write_json(out / "summary.json", summary)
    write_text(out / "report.html", render_combined(entries=entries, figures=figures, summary=summary))
    return entries
