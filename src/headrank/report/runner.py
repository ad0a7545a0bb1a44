"""Reproductions of the source documents' figures and claims, each checked with numbers.

A reproduction is a :class:`~headrank.studies.registry.Study` registered under a short name
(``fig1``, ``fig5``, …): params → run → data → claims → figures. :func:`run` executes one (or,
with ``replot``, re-judges its stored data) and writes, atomically,

- ``report.html``: claims table first, figures inline (base64 PNG), parameters, library
  versions, runtime; self-contained (no external assets);
- ``claims.json``: a list of claim objects (``name``, ``kind``, ``verdict``, ``source``,
  ``quote``, ``rule``, ``supports``, ``statement``, ``measured``, ``expected``, ``reason``, …);
- ``data.json``: the raw series behind the figures and claims;
- ``run.json``: name, parameters, versions, experiment source hash, runtime, the tally and any
  citation problems;
- one ``<figure>.png`` per figure.

A claim that did not hold is a finding, not an error: :func:`run` returns normally and the
CLI exits 0 unless ``--strict``.

Adding a reproduction: write a :class:`headrank.studies.registry.Study` (frozen params with
``quick()``/``full()``, ``run``, ``claims``, ``figures``) in its own module, register it with
``register_study``, and add ``"name": ("module", "title")`` to :data:`CATALOGUE` so
``headrank reproduce --list`` can show it without importing the module (and its training code).
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from headrank.errors import HeadRankError, one_line
from headrank.io.writer import OutputSet, confined
from headrank.studies.prereg import git_commit, stamp
from headrank.studies.registry import QUOTES, Claim, Result, citation_problems, get, names, tally
from headrank.util.env import versions
from headrank.util.fileio import (
    jsonable,
    prepare_out_dir,
    write_atomic,
    write_json,
    write_text,
)
from headrank.util.legacy import OLD_NAME


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
    """A record of a finished run, read as every planted file is (a regular file, capped: a FIFO
    or a 500 MB file is one line, :func:`headrank.io.validate.read_json`)."""
    from headrank.io.validate import read_json

    if not path.exists() and not path.is_symlink():
        raise HeadRankError(f"`replot` needs {path.name} of a finished run in {path.parent}; "
                            f"run reproduction {what} into `out` {path.parent} first")
    return read_json(path, "run record")


#: the fields of a stored run.json a replot takes back, and the types each may have
_RUN_FIELDS = {"name": (str,), "runtime_s": (int, float, type(None)), "quick": (bool, type(None)),
               "profile": (str, type(None)), "params": (dict, type(None)), "figures": (list, type(None))}


def _run_meta(path: Path, what: str) -> dict[str, Any]:
    """A stored run.json, each field a replot takes back of its type (a planted ``runtime_s``
    of ``"<script>…"`` is refused in one line, not carried into the new report)."""
    meta = _read_json(path, what)
    if not isinstance(meta, dict):
        raise HeadRankError(f"{path}: not a run record (a JSON object)")
    for key, types in _RUN_FIELDS.items():
        if not isinstance(meta.get(key), types):
            raise HeadRankError(f"{path}: {key} must be {' or '.join(t.__name__ for t in types)}; "
                                f"got {type(meta.get(key)).__name__}")
    return meta


def _stored(path: Path) -> Any:
    """A record a finished run left, or None where there is none readable (then it runs again)."""
    try:
        return _read_json(path, path.parent.name)
    except HeadRankError:
        return None


def figure_png(sub: Path, f: Any) -> Path:
    """The PNG of a stored figure entry, confined to the run's directory ``sub`` (a planted name
    ``../../secret_fig`` is refused, not embedded)."""
    name = f.get("name") if isinstance(f, dict) else None
    return confined(sub, f"{name}.png" if isinstance(name, str) and name else None, f"{sub / 'run.json'}: figure")


def profile_of(meta: dict[str, Any]) -> str:
    """The profile a stored run.json / summary.json was made with (older ones record only ``quick``)."""
    return str(meta.get("profile") or ("quick" if meta.get("quick") else "full"))


def _evaluate(name: str, out: Path, *, quick: bool, replot: bool, overrides: dict[str, Any] | None = None,
              profile: str | None = None) -> tuple[Result, dict[str, Any]]:
    """Run (or, with ``replot``, reload) reproduction ``name``: its Result and run facts."""
    import json

    study = get(name).study
    if overrides and replot:
        raise HeadRankError(f"reproduction {name!r} takes no parameters from the command line with `replot`")
    if replot:
        old = _run_meta(out / "run.json", name)
        if old.get("name") != name:
            raise HeadRankError(f"{out / 'run.json'} belongs to reproduction {old.get('name')!r}, not {name!r}")
        data = _read_json(out / "data.json", name)
        params = study.params_from_json(old.get("params") or {})
        facts = {"quick": bool(old.get("quick")), "runtime_s": old.get("runtime_s"), "replotted": True,
                 "profile": old.get("profile") or ("quick" if old.get("quick") else "full")}
    else:
        profile = profile or ("quick" if quick else "full")
        params = study.make_params(profile)
        if overrides:
            params = study.with_overrides(params, overrides)
        t0, commit = time.perf_counter(), git_commit()  # the code that makes the data: taken before the run
        raw = study.run(params)
        facts = {"quick": profile == "quick", "profile": profile, "runtime_s": time.perf_counter() - t0,
                 "data_commit": commit}
        data = json.loads(json.dumps(jsonable(raw)))  # exactly what data.json holds, so a replot sees the same
    t1 = time.perf_counter()
    claims = study.claims(data, params)
    stamp(claims, params)
    figures = study.figures(data, params)
    notes = study.notes(data, params) if study.notes else []
    facts["judge_s"] = time.perf_counter() - t1
    return Result(claims=claims, figures=figures, data=data, params=asdict(params), notes=notes), facts


def _mark_rule_changes(claims: list[dict[str, Any]], old: list[dict[str, Any]] | None) -> None:
    """Record with each claim the hash of the rule that judged the stored run when it was made
    (``rule_sha256_at_run``: this run's on a fresh run, carried over on every re-judging) and
    ``rule_changed_after_run``: whether today's rule differs from it (None where that run
    recorded no hash: made before hashes were recorded, see docs/preregistration.json)."""
    before = {c.get("name"): c.get("rule_sha256_at_run") or c.get("rule_sha256") for c in old or []}
    for c in claims:
        at_run = c["rule_sha256"] if old is None else before.get(c["name"])
        c["rule_sha256_at_run"] = at_run or None
        c["rule_changed_after_run"] = None if not at_run else at_run != c["rule_sha256"]


def _encoded_figures(figs: Any) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """Each figure as PNG bytes (for its file) and base64 (for the report)."""
    figures, pngs = [], {}
    for f in figs:
        png = _png_bytes(f.figure)
        pngs[f"{f.name}.png"] = png
        figures.append({"name": f.name, "caption": f.caption,
                        "png_base64": base64.b64encode(png).decode("ascii")})
    return figures, pngs


def run(name: str, out: str | Path, *, quick: bool = False, replot: bool = False,
        overrides: dict[str, Any] | None = None, profile: str | None = None) -> RunSummary:
    """Run reproduction ``name`` and write its report, claims, data and figures into ``out``.

    ``profile``: one the study offers (``quick``, ``full``, ``paper`` where it has one;
    default ``quick`` when ``quick`` is set, else ``full``).

    ``replot``: run nothing; re-judge the claims and redraw the figures from the ``data.json``
    and ``run.json`` a finished run left in ``out`` (data.json is not rewritten).
    ``overrides``: parameter fields to set on the profile's parameters (e.g. ``{"model": path}``).
    ``profile``: one the study offers (``quick``, ``full``, or its own, e.g. ``paper``); None:
    ``quick`` when ``quick`` else ``full``.
    """
    get(name)  # an unknown name fails before --out is touched
    out = Path(out)
    with OutputSet(out) as dest:  # --out checked once and locked for the run
        return _run(name, dest, quick=quick, replot=replot, overrides=overrides, profile=profile)


def _run(name: str, dest: OutputSet, *, quick: bool, replot: bool, overrides: dict[str, Any] | None,
         profile: str | None) -> RunSummary:
    from headrank.report.html import render_report

    entry, out = get(name), dest.out
    old_meta = _read_json(out / "run.json", name) if replot else None
    result, facts = _evaluate(name, out, quick=quick, replot=replot, overrides=overrides, profile=profile)
    runtime = facts["runtime_s"]

    figures, pngs = _encoded_figures(result.figures)

    claims = [c.to_json() for c in result.claims]
    _mark_rule_changes(claims, _read_json(out / "claims.json", name) if replot else None)
    meta = {
        "name": name,
        "title": entry.title,
        "source": entry.source,
        "quick": facts["quick"],
        "profile": facts["profile"],
        "runtime_s": runtime,
        "params": jsonable(result.params),
        "versions": versions(),
        "claims_held": sum(c["held"] for c in claims),
        "claims_total": len(claims),
        "tally": tally(claims),
        "citation_problems": citation_problems(claims),
        "experiment_hash": (old_meta or {}).get("experiment_hash", "") if replot else experiment_hash(name),
        "data_commit": (old_meta or {}).get("data_commit", "") if replot else facts["data_commit"],
        "judged_commit": git_commit(),
        "quote": QUOTES.get(name, ("", ""))[0],
        "quote_source": QUOTES.get(name, ("", ""))[1],
        "notes": list(result.notes),
        "figures": [{"name": f["name"], "caption": f["caption"]} for f in figures],
    }
    if facts.get("replotted"):
        meta["replotted_s"] = facts["judge_s"]
    html = render_report(meta=meta, claims=claims, figures=figures)
    with dest.stage() as stage:  # report, claims, data, run.json and figures move in as one set
        files = [write_text(stage / "report.html", html)]
        files += [write_atomic(confined(stage, n, "figure name"), lambda p, b=png: p.write_bytes(b))
                  for n, png in pngs.items()]
        files.append(write_json(stage / "claims.json", claims))
        if not replot:
            files.append(write_json(stage / "data.json", jsonable(result.data)))
        else:  # the stored data move in with the set (the set replaces the folder: data.json would be lost)
            stored = (out / "data.json").read_bytes()
            files.append(write_atomic(stage / "data.json", lambda p, b=stored: p.write_bytes(b)))
        files.append(write_json(stage / "run.json", meta))
    files = dest.moved(files, stage)
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


#: the package directory (src/headrank)
PKG = Path(__file__).resolve().parents[1]
#: the layers below ``studies`` that make a study's data (training, models, readers, measures)
DATA_LAYERS = ("util", "core", "io", "models", "analysis", "training")


#: modules of ``studies`` that judge or draw stored data (re-run on every re-judging, never hashed)
JUDGING = ("claims", "figures", "registry", "verdicts", "coverage", "lm_plots")


def _study_imports(path: Path, pkg: Path) -> set[Path]:
    """The ``headrank.studies`` modules ``path`` imports (absolute or relative), as files."""
    import ast

    inside = path.is_relative_to(pkg)
    base = path.relative_to(pkg).with_suffix("").parts[:-1] if inside else ()
    out: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (inside or not node.level):
            mod = (node.module or "").split(".")
            parts = [*base[:len(base) - node.level + 1], *mod] if node.level else mod[1:]
            cands = [parts] + [[*parts, a.name] for a in node.names]
        elif isinstance(node, ast.Import):
            cands = [a.name.split(".")[1:] for a in node.names]
        else:
            continue
        for c in cands:
            f = pkg.joinpath(*c)
            for cand in (f.with_suffix(".py"), f / "__init__.py"):
                if c[:1] == ["studies"] and cand.is_file():
                    out.add(cand)
    return out


def experiment_sources(name: str) -> list[Path]:
    """The source files a study's data depends on: the modules of its ``run`` and of its params
    class with the ``studies`` modules they import (transitively; not the judging ones,
    :data:`JUDGING`), every module of :data:`DATA_LAYERS`, and the package's top-level modules."""
    import inspect

    study = get(name).study
    pkg = PKG
    todo = [Path(f) for f in (inspect.getsourcefile(study.run), inspect.getsourcefile(study.params)) if f]
    files: set[Path] = set()
    while todo:
        f = todo.pop()
        if f not in files and f.is_file():
            files.add(f)
            todo += [g for g in _study_imports(f, pkg) if g.stem not in JUDGING and g.name != "__init__.py"]
    files |= {f for layer in DATA_LAYERS for f in (pkg / layer).rglob("*.py")}
    files |= set(pkg.glob("*.py"))
    return sorted(files)


def experiment_hash(name: str) -> str:
    """SHA-256 of :func:`experiment_sources` (each file's path inside the package and its bytes):
    a stored run is reused only while none of them changed. Claims and figures are always
    re-judged from the stored data, so their code may change freely."""
    import hashlib

    pkg = PKG
    h = hashlib.sha256()
    for f in experiment_sources(name):
        rel = f.relative_to(pkg).as_posix() if f.is_relative_to(pkg) else f.name
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def staleness(name: str, sub: Path, quick: bool, profile: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """``(run.json, "")`` when the finished run in ``sub`` can be reused: same profile, the same
    params as this version's profile, the same package version and experiment source hash.
    Otherwise ``(None, why)``."""

    meta = _stored(sub / "run.json")
    if not isinstance(meta, dict) or _stored(sub / "claims.json") is None:
        return None, "no finished run"
    if not (sub / "data.json").exists():
        return None, "no data.json"
    profile = profile or ("quick" if quick else "full")
    if profile_of(meta) != profile:
        return None, "another profile"
    study = get(name).study
    if meta.get("params") != jsonable(asdict(study.make_params(profile))):
        return None, "params changed"
    stored = meta.get("versions", {})  # written by attnrank, before the rename: its version counts
    if stored.get("headrank", stored.get(OLD_NAME)) != versions().get("headrank"):
        return None, "package version changed"
    if meta.get("experiment_hash") != experiment_hash(name):
        return None, "experiment code changed"
    return meta, ""


def _cached(sub: Path, profile: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """What :func:`run` wrote in ``sub`` (run.json written last), if it is of this profile."""

    meta, claims = _stored(sub / "run.json"), _stored(sub / "claims.json")
    if not isinstance(meta, dict) or not isinstance(claims, list) or not isinstance(meta.get("figures", []), list):
        return None
    try:
        figs_ok = all(figure_png(sub, f).is_file() for f in meta.get("figures", []))
    except HeadRankError:
        return None
    if profile_of(meta) != profile or "figures" not in meta or not figs_ok:
        return None
    return meta, claims


def run_all(out: str | Path, *, quick: bool = False, force: bool = False, only: list[str] | None = None,
            progress: Callable[[str, str], None] | None = None, replot: bool = False,
            profile: str | None = None) -> list[AllEntry]:
    """Run every reproduction into ``out/NAME/`` and write one combined report in ``out``.

    A reproduction already finished in ``out/NAME`` is reused (re-running resumes rather than
    recomputes) unless ``force``, and only while it is not stale (:func:`staleness`: the same
    profile, params, package version and experiment source hash); a reused part's claims are
    re-judged and its figures redrawn from its data.json with this code. One that raises is recorded with its error
    and the others still run. Writes ``out/report.html`` (self-contained: claims of every
    reproduction first, then each one's figures, parameters and runtime, then the
    environment), ``out/claims.json`` and ``out/summary.json``.

    ``replot``: run nothing; re-judge and redraw every reproduction that has a stored run in
    ``out/NAME`` (see :func:`run`), keeping each one's recorded profile.

    ``profile``: as in :func:`run`; a profile other than quick and full runs only the
    reproductions that offer it (e.g. ``paper``: fig3, table1, decouple).
    """
    if replot and not Path(out).is_dir():
        raise HeadRankError(f"`replot` needs a finished `reproduce all` in {out}; there is no such directory")
    out = prepare_out_dir(out)
    profile = profile or ("quick" if quick else "full")
    todo = only or names()
    for n in todo:
        get(n)  # unknown names fail before any work
    if profile not in ("quick", "full") and not replot:
        todo = [n for n in todo if profile in get(n).study.profiles()]
        if not todo:
            raise HeadRankError(f"no reproduction offers the profile {profile!r}")
    entries: list[AllEntry] = []
    for n in todo:
        entry = _replot_part(n, out / n, progress) if replot else _run_part(n, out / n, profile, force, progress)
        if entry is not None:
            entries.append(entry)
            if replot:
                profile = profile_of(entry.meta)
    _write_combined(out, entries, profile)
    return entries


def _replot_part(n: str, sub: Path, progress: Callable[[str, str], None] | None) -> AllEntry | None:
    """Re-judge and redraw one stored part (None where it has no stored run)."""
    if not (sub / "data.json").exists():
        if progress:
            progress(n, "no stored run")
        return None
    try:
        run(n, sub, replot=True)
    except HeadRankError:
        raise
    except Exception as e:  # noqa: BLE001 - one part that cannot be replotted must not stop the others
        if progress:
            progress(n, "failed")
        meta = _read_json(sub / "run.json", n)
        return AllEntry(n, meta, _read_json(sub / "claims.json", n), cached=True, error=one_line(e, 500, typed=True))
    meta = _read_json(sub / "run.json", n)
    if progress:
        progress(n, "replotted")
    return AllEntry(n, meta, _read_json(sub / "claims.json", n), cached=True)


def _run_part(n: str, sub: Path, profile: str, force: bool,
              progress: Callable[[str, str], None] | None) -> AllEntry:
    """One part of ``run_all``: reused while not stale (claims re-judged), else run; an
    unexpected failure is recorded on the entry, not raised."""
    hit, why = (None, "forced") if force else staleness(n, sub, profile == "quick", profile)
    if hit is not None:  # reuse the data, re-judge the claims and redraw with this code
        run(n, sub, replot=True)
        meta, claims = _cached(sub, profile) or ({}, [])
        if progress:
            progress(n, "cached (claims re-judged)")
        return AllEntry(n, meta, claims, cached=True)
    if progress:
        progress(n, "running" + (f" ({why})" if why not in ("no finished run", "forced") else ""))
    try:
        run(n, sub, profile=profile)
        meta, claims = _cached(sub, profile) or ({}, [])  # read back exactly what was written
    except HeadRankError:
        raise
    except Exception as e:  # noqa: BLE001 - one failing reproduction must not stop the others
        if progress:
            progress(n, "failed")
        return AllEntry(n, {"name": n, "title": get(n).title, "source": get(n).source, "quick": profile == "quick",
                                   "profile": profile}, [],
                        cached=False, error=one_line(e, 500, typed=True))
    if progress:
        progress(n, "done")
    return AllEntry(n, meta, claims, cached=False)


FIGURE_CAP = 64 << 20  # a stored figure's PNG larger than this is not one of ours


def _write_combined(out: Path, entries: list[AllEntry], profile: str) -> None:
    """out/claims.json, out/summary.json and the self-contained out/report.html."""
    from headrank.io.validate import read_bytes
    from headrank.report.html import render_combined

    figures: dict[str, list[dict[str, str]]] = {}
    for e in entries:
        figures[e.name] = [
            {**f, "png_base64": base64.b64encode(read_bytes(figure_png(out / e.name, f), "figure", FIGURE_CAP)
                                                 ).decode("ascii")}
            for f in e.meta.get("figures", [])
        ]
    all_claims = [{"reproduction": e.name, **c} for e in entries for c in e.claims]
    reported = {c["name"] for c in all_claims}  # a row counts as the combined tally does
    summary = {
        "quick": profile == "quick",
        "profile": profile,
        "reproductions": [{"name": e.name, "runtime_s": e.meta.get("runtime_s"), "cached": e.cached,
                           "claims_held": sum(bool(c["held"]) for c in e.claims),
                           "claims_total": len(e.claims), "tally": tally(e.claims, reported), "error": e.error}
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
