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
import importlib
import io
import math
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import AttnRankError
from .fileio import prepare_out_dir, write_atomic, write_json, write_text

# name → (module that registers it, one-line title). Imported lazily by get().
CATALOGUE: dict[str, tuple[str, str]] = {
    "fig1": ("attnrank.toys", "Figure 1 + Proposition 3.1: gradient descent on 5x5 factors; "
                              "L2 on factors becomes nuclear norm on the product"),
    "fig5": ("attnrank.toys", "Figure 5: 2-D toy, AdamW vs Adam+L2, direct (L2 optimum) and "
                              "factorized w = a*b (L1 optimum)"),
    "collapse": ("attnrank.collapse", "Rank collapse: pure attention loses rank doubly exponentially with depth; "
                                      "skips prevent it, MLPs slow it (MiniLM surgery, depth sweep, paths)"),
    "fig4": ("attnrank.repro_spectra", "Figure 4: balance of a pretrained model's attention factors (row norms, "
                                       "Frobenius bound vs nuclear norm), MiniLM-L6 in place of LLaMA-2 7B"),
    "fig2": ("attnrank.repro_train", "Figure 2: 2-layer transformer on associative recall; attention weight decay "
                                     "lowers the rank of P W_V, balances the factors, closes the nuclear-norm gap"),
    "fig3": ("attnrank.repro_lm", "Figure 3: rank of W_K^T W_Q and P W_V against attention weight decay; byte-level LM "
                                  "(middle layer, per head) and ViT on digits (all heads and layers)"),
    "table1": ("attnrank.repro_lm", "Table 1: LM test perplexity over attention decay x MLP decay (mean +- std over "
                                    "seeds); does attention decay hurt, does decoupling help"),
    "scale": ("attnrank.scaling", "Scale invariance and weight decay: ReLU+LayerNorm MLPs on digits (no residual, post-norm, pre-norm); effective learning rate, angular update, equilibrium norm"),
}


@dataclass
class Claim:
    """One checked claim. ``held`` is the verdict; ``measured``/``expected`` carry numbers.

    ``measured`` and ``expected`` may be numbers, strings, lists or dicts (JSON-serialisable);
    ``tolerance`` says how close counts as agreement; ``detail`` says how it was measured
    and anything a reader needs to judge it.
    """

    name: str
    source: str
    statement: str
    measured: Any
    expected: Any
    held: bool
    tolerance: Any = None
    detail: str = ""

    def __post_init__(self) -> None:
        self.held = bool(self.held)

    def to_json(self) -> dict[str, Any]:
        return jsonable(asdict(self))


@dataclass
class FigureOut:
    """A matplotlib figure with a file stem and a caption."""

    name: str
    figure: Any
    caption: str = ""


@dataclass
class Result:
    """What a reproduction returns."""

    claims: list[Claim]
    figures: list[FigureOut] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Entry:
    name: str
    title: str
    source: str
    fn: Callable[..., Result]


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


_REGISTRY: dict[str, Entry] = {}


def register(name: str, *, title: str, source: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Decorator: register ``fn(quick: bool = False) -> Result`` as reproduction ``name``."""

    def deco(fn: Callable[..., Result]) -> Callable[..., Result]:
        prev = _REGISTRY.get(name)
        if prev is not None and prev.fn.__module__ != fn.__module__:
            raise ValueError(f"reproduction {name!r} registered twice ({prev.fn.__module__}, {fn.__module__})")
        _REGISTRY[name] = Entry(name=name, title=title, source=source, fn=fn)
        return fn

    return deco


def names() -> list[str]:
    """Every known reproduction: the catalogue plus anything registered at run time."""
    return sorted(set(CATALOGUE) | set(_REGISTRY))


def listing() -> list[tuple[str, str]]:
    """(name, title) for every known reproduction, without importing their modules."""
    out = []
    for n in names():
        if n in _REGISTRY:
            out.append((n, _REGISTRY[n].title))
        else:
            out.append((n, CATALOGUE[n][1]))
    return out


def get(name: str) -> Entry:
    """The registered entry for ``name``, importing its module if needed."""
    if name not in _REGISTRY and name in CATALOGUE:
        importlib.import_module(CATALOGUE[name][0])
    if name not in _REGISTRY:
        known = ", ".join(names()) or "(none)"
        raise AttnRankError(f"unknown reproduction {name!r}; known: {known} (see `attnrank reproduce --list`)")
    return _REGISTRY[name]


# --------------------------------------------------------------------------- JSON


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy/torch scalars and arrays to Python, non-finite floats to None."""
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool | str) or obj is None:
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return jsonable(float(obj))
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):  # torch tensor
        return jsonable(obj.detach().cpu().numpy())
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# --------------------------------------------------------------------------- running


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the libraries that shape the numbers."""
    from . import __version__

    out = {"attnrank": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("numpy", "scipy", "torch", "matplotlib"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001 - a missing optional library is just not listed
            continue
    return out


def _png_bytes(fig, dpi: int = 110) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return buf.getvalue()


def run(name: str, out: str | Path, *, quick: bool = False) -> RunSummary:
    """Run reproduction ``name`` and write its report, claims, data and figures into ``out``."""
    from .report import render_report

    entry = get(name)
    out = prepare_out_dir(out)
    t0 = time.perf_counter()
    result = entry.fn(quick=quick)
    runtime = time.perf_counter() - t0
    if not isinstance(result, Result):
        raise TypeError(f"reproduction {name!r} returned {type(result).__name__}, not Result")

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
        "quick": quick,
        "runtime_s": runtime,
        "params": jsonable(result.params),
        "versions": versions(),
        "claims_held": sum(c["held"] for c in claims),
        "claims_total": len(claims),
        "notes": list(result.notes),
        "figures": [{"name": f["name"], "caption": f["caption"]} for f in figures],
    }
    files.append(write_json(out / "claims.json", claims))
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
            progress: Callable[[str, str], None] | None = None) -> list[AllEntry]:
    """Run every reproduction into ``out/NAME/`` and write one combined report in ``out``.

    A reproduction already finished in ``out/NAME`` with the same profile is reused (re-running
    resumes rather than recomputes) unless ``force``. One that raises is recorded with its error
    and the others still run. Writes ``out/report.html`` (self-contained: claims of every
    reproduction first, then each one's figures, parameters and runtime, then the
    environment), ``out/claims.json`` and ``out/summary.json``.
    """
    from .report import render_combined

    out = prepare_out_dir(out)
    todo = only or names()
    for n in todo:
        get(n)  # unknown names fail before any work
    entries: list[AllEntry] = []
    for n in todo:
        sub = out / n
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
                           "claims_total": len(e.claims), "error": e.error} for e in entries],
        "claims_held": sum(bool(c["held"]) for c in all_claims),
        "claims_total": len(all_claims),
        "total_runtime_s": sum(e.meta.get("runtime_s") or 0.0 for e in entries),
        "versions": versions(),
    }
    write_json(out / "claims.json", all_claims)
    write_json(out / "summary.json", summary)
    write_text(out / "report.html", render_combined(entries=entries, figures=figures, summary=summary))
    return entries
