"""Grids of training runs over any config fields, on a local process pool or on Ray.

A sweep is a task ``kind`` (``lm``, ``vit``, ``recall``), ``base`` overrides shared by every
run, a ``grid`` ``{field: [values]}`` (its Cartesian product) and ``seeds``. Fields are the
flat override names of :func:`headrank.training.config.make_config` (e.g. ``attn_weight_decay``,
``weight_decay``, ``steps``, ``d_model``, ``seq_len``, ``corpus``).

Layout of ``OUT``::

    OUT/sweep.json                 the spec (every run's grid point and seed)
    OUT/runs/<name>/               one ordinary run directory per grid point and seed
    OUT/results/<name>.json        status (ok / failed + error and traceback) and final metrics
    OUT/runs.csv                   one row per run
    OUT/summary.csv                per grid point: runs, failures, mean and std over seeds
                                   (with one seed: the run's values, no mean/std columns)

**Resumable.** A run whose directory holds ``summary.json`` and the same settings is finished
and skipped; an unfinished one is resumed from its newest checkpoint; a failed one is tried
again. A failing run (any exception, or a worker that dies) is recorded with its error and
the others go on; :meth:`SweepResult.failure_line` says how many failed (the CLI exits 3).

**Never mixed.** A re-run into an ``OUT`` that holds a sweep may add grid values and seeds (new
runs; the stored ones are kept, so ``sweep.json`` always lists every run). A different task,
other swept fields or another base setting is refused with one line naming the difference,
before any run is touched; a larger ``steps`` is refused too unless ``extend`` (``--extend``),
which continues every run to the new length (constant learning rate after warmup only).
Run directories have shell-friendly names (:func:`run_name`: ``attn_weight_decay-0.1__seed-0``).

**Where runs go.** By default a ``concurrent.futures.ProcessPoolExecutor`` (spawned workers,
``threads`` torch threads each). With ``ray=ADDRESS`` (``auto`` for the cluster this machine
belongs to, ``local`` to start a private one) every run is a Ray task (``num_cpus=threads``)
scheduled by Ray; ``OUT`` must then be on a file system every node sees.

**One writer.** The sweep holds ``OUT/.lock`` and every run holds its own ``RUN/.lock``
(:func:`headrank.io.rundir.locked_run`): a second sweep on the same ``OUT`` stops with one line,
and a run still written by a live process (an earlier sweep's worker) is recorded as failed
rather than written twice. Local pool workers die with the sweep (Linux: ``PR_SET_PDEATHSIG``),
so killing the sweep leaves no worker writing on.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headrank.core.metrics import SUMMARY_METRICS
from headrank.errors import HeadRankError, one_line
from headrank.io.rundir import locked_run, run_locked
from headrank.io.writer import OutputSet
from headrank.util.fileio import write_json, write_text
from headrank.util.ray import ray_session
from headrank.util.result import ResultBase, check_dir, copy_dir, plain, read_csv, read_json
from headrank.util.result import records as frame_records

#: final metrics copied into runs.csv (and aggregated in summary.csv) when a run has them: the
#: losses, and per product the final tracker means of the metric table's summary rows
FINAL_METRICS = ("loss", "acc", "val_loss", "val_ppl", "val_acc", "test_loss", "test_ppl", "test_acc",
                 *(f"{p}_{k}" for p in ("qk", "ov") for k in SUMMARY_METRICS))


#: the share of one GPU a Ray task of a CUDA sweep asks for (runs this small share a GPU 4 to 1)
RAY_GPU_SHARE = 0.25


@dataclass
class SweepSpec:
    kind: str
    base: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])

    def __post_init__(self) -> None:
        from headrank.training.config import CONFIG_BUILDERS

        check_spec_types({"kind": self.kind, "base": self.base, "grid": self.grid, "seeds": self.seeds})
        if self.kind not in CONFIG_BUILDERS:
            raise HeadRankError(f"unknown sweep task {self.kind!r}; use one of {', '.join(CONFIG_BUILDERS)}")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise HeadRankError(f"seeds must be non-negative integers, got {self.seeds!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise HeadRankError(f"seeds repeat: {self.seeds}")
        for k, v in self.grid.items():
            if not isinstance(v, list) or not v:
                raise HeadRankError(f"grid field {k!r} needs a non-empty list of values, got {v!r}")
            if len({_fmt(x) for x in v}) != len(v):  # 0 and 0.0 would name the same run
                raise HeadRankError(f"grid field {k!r} repeats a value: {v}")
        if "seed" in self.grid or "seed" in self.base:
            raise HeadRankError("give seeds with `seeds` (a seeds list), not as a grid or base field")
        both = set(self.grid) & set(self.base)
        if both:
            raise HeadRankError(f"field(s) {', '.join(sorted(both))} are both fixed and swept")

    def runs(self) -> list[tuple[str, dict[str, Any]]]:
        """(name, overrides) of every run, grid order then seed."""
        keys = list(self.grid)
        out = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            point = dict(zip(keys, values, strict=True))
            for seed in self.seeds:
                out.append((run_name({**point, "seed": seed}), {**self.base, **point, "seed": seed}))
        return out


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def run_name(point: dict[str, Any]) -> str:
    """A run's directory name, shell-friendly (letters, digits, ``_ . -`` only, never a leading
    ``-``): ``FIELD-VALUE`` pairs joined by ``__``, e.g. ``attn_weight_decay-0.1__seed-0``."""
    return _safe("__".join(f"{k}-{_fmt(v)}" for k, v in point.items())).lstrip("-.") or "run"


def legacy_run_name(point: dict[str, Any]) -> str:
    """The name earlier versions gave a run (``attn_weight_decay=0.1,seed=0``): such directories
    are renamed to :func:`run_name` when a sweep meets them, so their work is kept."""
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(f"{k}={_fmt(v)}" for k, v in point.items()))


def parse_value(text: str) -> Any:
    """A CLI value: int, float, true/false, none, or the string itself."""
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(t)
        except ValueError:
            pass
    return t


def parse_assignment(text: str, many: bool) -> tuple[str, Any]:
    """``FIELD=V`` (``many``: ``FIELD=V1,V2,...``) → (field, value or list)."""
    if "=" not in text:
        raise HeadRankError(f"expected FIELD=VALUE{'[,VALUE...]' if many else ''}, got {text!r}")
    k, v = text.split("=", 1)
    k = k.strip().replace("-", "_")
    if not k:
        raise HeadRankError(f"missing field name in {text!r}")
    return (k, [parse_value(x) for x in v.split(",")]) if many else (k, parse_value(v))


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """A spec from a JSON or TOML file with keys ``kind``, ``base``, ``grid``, ``seeds``."""
    p = Path(path)
    from headrank.io.validate import read_bytes

    raw = read_bytes(p, "sweep spec")  # a regular file under its cap (a FIFO or a 200 MB TOML: one line)
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            d = tomllib.loads(raw.decode("utf-8"))
        else:
            d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise HeadRankError(f"sweep spec {p} does not parse: {one_line(e, 200)}") from None
    if not isinstance(d, dict) or "kind" not in d:
        raise HeadRankError(f"sweep spec {p} needs a 'kind' (lm, vit, recall)")
    unknown = set(d) - {"kind", "base", "grid", "seeds"}
    if unknown:
        raise HeadRankError(f"sweep spec {p}: unknown key(s) {', '.join(sorted(unknown))}")
    check_spec_types(d, f"sweep spec {p}: ")
    return SweepSpec(kind=d["kind"], base=dict(d.get("base", {})), grid=dict(d.get("grid", {})),
                     seeds=list(d.get("seeds", [0])))


def build_spec(spec: str, *, sets: list[str] | None = None, grid: list[str] | None = None,
               seeds: str | None = None) -> SweepSpec:
    """The sweep the CLI describes: ``spec`` a task (``lm``, ``vit``, ``recall``) or a JSON/TOML spec
    file; ``sets`` ``FIELD=V`` fixed for every run (over the spec's base); ``grid`` ``FIELD=V1,V2``
    swept (over the spec's grid; a swept field leaves the base); ``seeds`` ``0,1,2``."""
    from headrank.training.config import CONFIG_BUILDERS

    if spec in CONFIG_BUILDERS:
        s = SweepSpec(kind=spec)
    elif Path(spec).is_file():
        s = load_spec(spec)
    else:
        raise HeadRankError(f"{spec!r} is neither a task ({', '.join(CONFIG_BUILDERS)}) nor a spec file")
    base = {**s.base, **dict(parse_assignment(x, many=False) for x in sets or [])}
    g = {**s.grid, **dict(parse_assignment(x, many=True) for x in grid or [])}
    seed_list = s.seeds if seeds is None else [parse_value(x) for x in seeds.split(",")]
    return SweepSpec(kind=s.kind, base={k: v for k, v in base.items() if k not in g}, grid=g, seeds=seed_list)


_SCALAR = (bool, int, float, str, type(None))
_NOT_FIELDS = ("model", "task")  # built from the kind and its fields: set those instead


def check_spec_types(d: dict[str, Any], where: str = "") -> None:
    """The types of a sweep spec (a file's or the CLI's): ``kind`` a string, ``base`` a table of
    FIELD = value, ``grid`` a table of FIELD = [values], ``seeds`` a list; every value a scalar
    (number, bool, string or none: not a list or table); never a field named model or task."""
    kind = d.get("kind")
    if not isinstance(kind, str):
        raise HeadRankError(f"{where}kind must be a string (lm, vit, recall), got {str(kind)[:60]!r}")
    for key, shape in (("base", "a table of FIELD = value"), ("grid", "a table of FIELD = [values]")):
        if not isinstance(d.get(key, {}), dict):
            raise HeadRankError(f"{where}{key} must be {shape}, got {str(d[key])[:60]!r}")
    if not isinstance(d.get("seeds", []), list):
        raise HeadRankError(f"{where}seeds must be a list of integers (e.g. [0, 1, 2]), got {str(d['seeds'])[:60]!r}")
    base, grid = d.get("base", {}), d.get("grid", {})
    for k in (*base, *grid):
        if k in _NOT_FIELDS:
            raise HeadRankError(f"{where}{k!r} is not a field to set or sweep: the {k} is built from the kind and "
                                f"its own fields (e.g. d_model=..., n_layers=... for the model)")
    for k, v in base.items():
        if not isinstance(v, _SCALAR):
            raise HeadRankError(f"{where}base field {k!r} must be a number, bool or string, got {str(v)[:60]!r}")
    for k, vs in grid.items():
        for v in vs if isinstance(vs, list) else []:
            if not isinstance(v, _SCALAR):
                raise HeadRankError(f"{where}grid field {k!r} values must be numbers, bools or strings, "
                                    f"got {str(v)[:60]!r}")


# -- one run (executed in a worker process or a Ray task) ------------------------------------------

def _flat_final(final: dict[str, Any]) -> dict[str, Any]:
    out = {k: final[k] for k in FINAL_METRICS if k in final}
    for prod in ("qk", "ov"):
        m = final.get("mean", {}).get(prod, {})
        for k in SUMMARY_METRICS:
            if k in m:
                out[f"{prod}_{k}"] = m[k]
    return out


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train one run of a sweep; never raises (errors are returned in the record)."""
    from headrank.training.config import make_config
    from headrank.training.loop import train

    run = Path(job["run_dir"])
    rec = {"name": job["name"], "overrides": job["overrides"], "run_dir": str(run), "status": "failed",
           "error": None, "traceback": None, "final": {}}
    try:
        cfg = make_config(job["kind"], **job["overrides"])
        res = train(run, cfg, resume=(run / "config.json").exists(), device=job.get("device", "cpu"),
                    tensorboard=False, threads=job.get("threads"), amp=job.get("amp", "off"))
        rec.update(status="ok", final=_flat_final(res.final), resumed_from=res.resumed_from)
    except Exception as e:  # noqa: BLE001 - a failed run is recorded; the sweep goes on
        rec.update(error=one_line(e, 1000, typed=True),
                   traceback=traceback.format_exc()[-4000:])
    write_json(Path(job["results_dir"]) / f"{job['name']}.json", rec)
    return rec


def _finished(run: Path, kind: str, overrides: dict[str, Any]) -> dict[str, Any] | None:
    """The final metrics of a finished run with these settings, else None."""
    from headrank.training.config import comparable, make_config, run_config

    if not (run / "summary.json").is_file() or not (run / "config.json").is_file():
        return None
    try:
        from headrank.io.validate import read_json

        old = read_json(run / "config.json", "run config")
        summary = read_json(run / "summary.json", "run record")
        same = comparable(old) == comparable(json.loads(json.dumps(run_config(make_config(kind, **overrides)))))
    except (OSError, ValueError, HeadRankError):
        return None
    if not same or summary.get("steps") != old.get("steps"):
        return None
    return _flat_final(summary.get("final", {}))


# -- the sweep -------------------------------------------------------------------------------------

@dataclass
class SweepResult(ResultBase):
    """What :func:`run_sweep` returns: one row per run (``runs``, also ``table``; ``runs.csv``),
    per grid point the mean and std over seeds (``summary()``; ``summary.csv``), the run counts
    (``runs``, ``ok``, ``failed``, ``skipped``; ``counts.json``) and the spec."""

    verb = "sweep"

    out: Path
    runs: pd.DataFrame
    grid_summary: pd.DataFrame
    counts: dict[str, int]
    spec: SweepSpec | None = None

    @property
    def table(self) -> pd.DataFrame:
        """One row per run: grid values, seed, name, status, error, final metrics."""
        return self.runs

    @property
    def meta(self) -> dict[str, Any]:
        """``out``, ``counts`` and the spec (``kind``, ``base``, ``grid``, ``seeds``)."""
        return {"out": str(self.out), "counts": self.counts, "spec": asdict(self.spec) if self.spec else None}

    def headline(self) -> str:
        c = self.counts
        return f"SweepResult in {self.out}: {c['runs']} runs, {c['ok']} ok, {c['failed']} failed"

    def summary(self) -> pd.DataFrame:
        """Per grid point: runs, failed, and ``METRIC_mean`` / ``METRIC_std`` over the seeds (the
        run's own ``METRIC`` with one seed)."""
        return self.grid_summary

    def save(self, out: str | os.PathLike) -> list[Path]:
        """The sweep directory copied into ``out`` (nothing to do when ``out`` is where it ran)."""
        return copy_dir(self.out, out)

    @classmethod
    def load(cls, out: str | os.PathLike) -> SweepResult:
        """The sweep a :func:`run_sweep` (or ``headrank sweep --out``) wrote into ``out``."""
        out = check_dir(out, "runs.csv")
        d = read_json(out / "sweep.json")
        spec = SweepSpec(kind=d["kind"], base=dict(d["base"]), grid=dict(d["grid"]), seeds=list(d["seeds"]))
        runs = read_csv(out / "runs.csv")
        counts = read_json(out / "counts.json") if (out / "counts.json").is_file() else {
            "runs": len(runs), "ok": int((runs["status"] == "ok").sum()),
            "failed": int((runs["status"] != "ok").sum()), "skipped": 0}
        return cls(out=out, runs=runs, grid_summary=read_csv(out / "summary.csv"), counts=counts, spec=spec)

    def plot(self):
        """Each metric of the summary against the first swept field (one panel per metric)."""
        from headrank.analysis.plots import sweep_figure

        return sweep_figure(self.grid_summary, list(self.spec.grid) if self.spec else [])

    def to_json(self) -> dict[str, Any]:
        """What ``headrank sweep --json`` prints: ``out``, ``counts`` and ``summary`` (its rows)."""
        return plain({"out": str(self.out), "counts": self.counts, "summary": frame_records(self.grid_summary)})

    def failure_line(self) -> str | None:
        """One line when runs failed (how many, where their errors are), else None."""
        n = self.counts.get("failed", 0)
        if not n:
            return None
        return (f"{n} of {self.counts['runs']} runs failed; their errors are in {self.out / 'results'} "
                "(runs.csv: status, error); re-run the same command to try them again")


def _defaults(kind: str) -> dict[str, Any]:
    from dataclasses import MISSING, fields

    from headrank.training.config import CONFIG_CLASSES

    return {f.name: f.default for f in fields(CONFIG_CLASSES[kind]) if f.default is not MISSING}


def merge_rerun(out: Path, spec: SweepSpec, extend: bool = False) -> SweepSpec:
    """The spec a sweep into ``out`` runs: ``spec`` itself where ``out`` holds no sweep; else the
    union of the stored grid values and seeds with ``spec``'s (points are added, existing runs
    kept). Refused with one line naming the difference, before anything is touched, when the
    task, the swept fields or a base setting differ, except a larger ``steps`` with ``extend``."""
    p = out / "sweep.json"
    if not p.is_file():
        return spec
    try:
        from headrank.io.validate import read_json

        d = read_json(p, "run record")
        old = SweepSpec(kind=d["kind"], base=dict(d["base"]), grid=dict(d["grid"]), seeds=list(d["seeds"]))
    except (OSError, ValueError, KeyError, TypeError, HeadRankError):
        raise HeadRankError(f"{p} does not describe a sweep: choose another `out`") from None
    keep = "its runs are left as they are"
    if old.kind != spec.kind:
        raise HeadRankError(f"{out} holds a {old.kind} sweep, not {spec.kind}; {keep}: choose another `out`")
    if list(old.grid) != list(spec.grid):
        raise HeadRankError(f"{out} holds a sweep over {', '.join(old.grid) or 'no field'}, not "
                            f"{', '.join(spec.grid) or 'no field'}; {keep}: sweep the same fields or choose another `out`")
    dflt = _defaults(spec.kind)
    diffs = {k: (old.base.get(k, dflt.get(k)), spec.base.get(k, dflt.get(k))) for k in {**old.base, **spec.base}}
    diffs = {k: ab for k, ab in diffs.items() if ab[0] != ab[1]}
    steps = diffs.pop("steps", None)
    if diffs:
        what = "; ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(diffs.items()))
        raise HeadRankError(f"{out} holds a sweep with other base settings ({what}); {keep}: use the same "
                            "settings or choose another `out`")
    if steps is not None:
        a, b = steps
        if not (isinstance(a, int) and isinstance(b, int) and b > a):
            raise HeadRankError(f"{out} holds a sweep of {a} steps, not {b}; {keep}: a sweep cannot be shortened, "
                                "choose another `out`")
        if not extend:
            raise HeadRankError(f"{out} holds a sweep of {a} steps, not {b}; {keep}: pass `extend` to continue "
                                f"every run to {b} steps, or choose another `out`")
    grid = {k: old.grid[k] + [v for v in spec.grid[k] if _fmt(v) not in {_fmt(x) for x in old.grid[k]}]
            for k in old.grid}  # a value is its run name's: 0 and 0.0 are one point
    seeds = old.seeds + [x for x in spec.seeds if x not in old.seeds]
    return SweepSpec(kind=spec.kind, base=spec.base, grid=grid, seeds=seeds)


def _check_extendable(spec: SweepSpec) -> None:
    from headrank.training.config import make_config

    probe = {**spec.base, **{k: v[0] for k, v in spec.grid.items()}, "seed": spec.seeds[0]}
    cfg = make_config(spec.kind, **probe)
    if cfg.schedule != "constant":
        raise HeadRankError(f"`extend`: these runs use a {cfg.schedule} learning-rate schedule, declared for their "
                            "length (it decays to 0 there); they cannot be extended: choose another `out`")


def sweep_verb(spec: str | os.PathLike | SweepSpec, out: str | os.PathLike, *,
               grid: dict[str, Sequence[Any]] | Sequence[str] | None = None,
               set: dict[str, Any] | Sequence[str] | None = None,  # noqa: A002 - the CLI's --set
               seeds: Sequence[int] | str | None = None, workers: int | None = None, threads: int = 1,
               ray: str | None = None, device: str = "cpu", extend: bool = False,
               progress: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepResult:
    """``headrank sweep SPEC --out OUT`` (``headrank.sweep``): a grid of training runs, resumable,
    failures recorded, mean and std over seeds (``docs/verbs/sweep.md``).

    Parameters
    ----------
    spec
        A task (``"lm"``, ``"vit"``, ``"recall"``), a JSON/TOML spec file, or a :class:`SweepSpec`.
    out
        The sweep directory: runs/, results/, runs.csv, summary.csv.
    grid
        Swept config fields: ``{"attn_weight_decay": [0, 0.1, 1]}`` or ``["FIELD=V1,V2"]``.
    set
        Config fields fixed for every run: ``{"steps": 500}`` or ``["FIELD=V"]``.
    seeds
        Seeds (a sequence or ``"0,1,2"``); default 0, or the spec's.
    workers
        Worker processes, one run each (1 to 4 per CPU; default: CPUs / threads).
    threads
        CPU threads of each run (1 to 4 per CPU).
    ray
        Run on Ray: a cluster address, ``"auto"`` or ``"local"``.
    device
        Device of every run.
    extend
        With a larger ``steps`` than the sweep in ``out``: continue every run to it.

    Returns
    -------
    SweepResult
    """
    if isinstance(spec, SweepSpec):
        if grid or set or seeds is not None:
            raise HeadRankError("grid, set and seeds go into the SweepSpec itself when spec is one")
        s = spec
    else:
        seed_text = ",".join(str(x) for x in seeds) if isinstance(seeds, list | tuple) else seeds
        s = build_spec(os.fspath(spec), sets=None if isinstance(set, dict) else set,
                       grid=None if isinstance(grid, dict) else grid, seeds=seed_text)
        if isinstance(set, dict) or isinstance(grid, dict):  # Python values, no parsing
            g = {**s.grid, **({k: list(v) if isinstance(v, list | tuple) else [v] for k, v in grid.items()}
                              if isinstance(grid, dict) else {})}
            base = {**s.base, **(set if isinstance(set, dict) else {})}
            s = SweepSpec(kind=s.kind, base={k: v for k, v in base.items() if k not in g}, grid=g, seeds=s.seeds)
    return run_sweep(s, out, workers=workers, ray=ray, threads=threads, device=device, extend=extend,
                     progress=progress)


def run_sweep(spec: SweepSpec, out: str | os.PathLike, *, workers: int | None = None, ray: str | None = None,
              threads: int = 1, device: str = "cpu", extend: bool = False, amp: str = "off",
              progress: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepResult:
    """Run (or finish) every run of ``spec`` under ``out`` and aggregate (see the module docstring).
    Into an ``out`` that holds a sweep, see :func:`merge_rerun` (``extend``: a larger ``steps``
    continues every run)."""
    from headrank.util.constraints import SWEEP

    if ray is None:  # local runs: the table's bounds (1..4 per CPU)
        SWEEP.check(threads=threads, workers=workers)
    else:  # on Ray the cluster's CPUs bound a run's threads; the local workers are still this machine's
        SWEEP.check(workers=workers)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise HeadRankError(f"threads must be a positive integer, got {threads!r}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise HeadRankError(f"`out` {out} exists and is not a directory")
    _check_field_names(spec)
    created = not out.exists()
    try:
        with locked_run(out):  # one sweep per OUT at a time
            spec = merge_rerun(out, spec, extend)
            if extend:
                _check_extendable(spec)
            return _run_sweep(spec, out, spec.runs(), workers=workers, ray=ray, threads=threads, device=device,
                              progress=progress, amp=amp)
    except BaseException:
        runs_dir = out / "runs"
        if created and (not runs_dir.is_dir() or not any(runs_dir.iterdir())):
            shutil.rmtree(out, ignore_errors=True)  # refused before any run: nothing left behind
        raise


def _run_sweep(spec: SweepSpec, out: Path, runs: list[tuple[str, dict[str, Any]]], *, workers: int | None,
               ray: str | None, threads: int, device: str,
               progress: Callable[[dict[str, Any], int, int], None] | None, amp: str = "off") -> SweepResult:
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "results").mkdir(exist_ok=True)
    write_json(out / "sweep.json", asdict(spec))

    records: dict[str, dict[str, Any]] = {}
    jobs = []
    for name, ov in runs:
        run_dir = out / "runs" / name
        legacy = out / "runs" / legacy_run_name({**{k: ov[k] for k in spec.grid}, "seed": ov["seed"]})
        if not run_dir.exists() and legacy.is_dir() and not run_locked(legacy):
            os.rename(legacy, run_dir)  # a run named by an earlier version: keep its work
        done = _finished(run_dir, spec.kind, ov)
        if done is not None:
            records[name] = {"name": name, "overrides": ov, "run_dir": str(run_dir), "status": "ok",
                             "skipped": True, "error": None, "final": done}
        else:
            jobs.append({"name": name, "kind": spec.kind, "overrides": ov, "run_dir": str(run_dir),
                         "results_dir": str(out / "results"), "threads": threads, "device": device,
                         "amp": amp})
    total, finished = len(runs), len(records)
    if progress:
        for r in records.values():
            progress(r, finished, total)

    def collect(rec: dict[str, Any]) -> None:
        nonlocal finished
        records[rec["name"]] = rec
        finished += 1
        if progress:
            progress(rec, finished, total)

    if jobs and ray is not None:
        _run_on_ray(jobs, ray, threads, collect)
    elif jobs:
        n = workers or max(1, min(len(jobs), (os.cpu_count() or 1) // threads))
        if n == 1:
            for j in jobs:
                collect(run_one(j))
        else:
            import multiprocessing as mp

            with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"),
                                     initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
                futures = {pool.submit(run_one, j): j for j in jobs}
                for fut in as_completed(futures):
                    try:
                        collect(fut.result())
                    except Exception as e:  # noqa: BLE001 - a dead worker: record it, go on
                        collect(_crashed(futures[fut], e))
    return aggregate(spec, out, [records[name] for name, _ in runs])


def die_with_parent(parent: int) -> None:
    """In a pool worker: be killed when the process that started it dies (Linux
    ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so no orphan goes on writing a run; exit at once if
    the parent ``parent`` is already gone. Elsewhere a no-op (the run locks still keep a re-run
    from sharing a run with an orphan)."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _check_field_names(spec: SweepSpec) -> None:
    """A misspelt field fails the sweep at once (a bad *value* fails only the runs that have it)."""
    from headrank.training.config import make_config

    probe = {**spec.base, **{k: v[0] for k, v in spec.grid.items()}, "seed": spec.seeds[0]}
    try:
        make_config(spec.kind, **probe)
    except HeadRankError as e:
        if "unknown training option" in str(e) or "do not apply" in str(e):
            raise


def _crashed(job: dict[str, Any], e: BaseException) -> dict[str, Any]:
    rec = {"name": job["name"], "overrides": job["overrides"], "run_dir": job["run_dir"], "status": "failed",
           "error": f"worker died: {one_line(e, 1000, typed=True)}", "final": {}}
    write_json(Path(job["results_dir"]) / f"{job['name']}.json", rec)
    return rec


def _run_on_ray(jobs: list[dict[str, Any]], address: str, threads: int,
                collect: Callable[[dict[str, Any]], None]) -> None:
    with ray_session(address) as ray:
        # a run that may use CUDA asks Ray for a share of a GPU (Ray hides the GPUs from tasks that ask
        # for none); several small runs share one GPU
        gpu = RAY_GPU_SHARE if any(j.get("device", "cpu") != "cpu" for j in jobs) and \
            ray.cluster_resources().get("GPU", 0) > 0 else 0
        task = ray.remote(num_cpus=threads, num_gpus=gpu, max_retries=0)(run_one)
        pending = {task.remote(j): j for j in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(done[0])
            try:
                collect(ray.get(done[0]))
            except Exception as e:  # noqa: BLE001 - a task that died (worker crash, node lost)
                collect(_crashed(job, e))


def aggregate(spec: SweepSpec, out: Path, records: list[dict[str, Any]]) -> SweepResult:
    """Write runs.csv (one row per run) and summary.csv: per grid point, ``METRIC_mean`` and
    ``METRIC_std`` (ddof 1) over the seeds when the sweep has more than one seed, else the one
    run's ``METRIC`` itself."""
    rows = []
    for r in records:
        ov = r["overrides"]
        rows.append({**{k: ov.get(k) for k in spec.grid}, "seed": ov["seed"], "name": r["name"],
                     "status": r["status"], "error": r.get("error"), **r.get("final", {})})
    runs = pd.DataFrame(rows)
    for m in FINAL_METRICS:
        if m not in runs:
            runs[m] = np.nan
    keys = list(spec.grid)
    many = len(spec.seeds) > 1
    groups = runs.groupby(keys, sort=False, dropna=False) if keys else [((), runs)]
    summ = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        ok = g[g["status"] == "ok"]
        row = {**dict(zip(keys, key, strict=True)), "runs": len(g), "failed": int((g["status"] != "ok").sum())}
        for m in FINAL_METRICS:
            v = pd.to_numeric(ok[m], errors="coerce").dropna()
            if many:
                row[f"{m}_mean"] = float(v.mean()) if len(v) else math.nan
                row[f"{m}_std"] = float(v.std(ddof=1)) if len(v) > 1 else math.nan
            else:  # one seed: the run's own value, no mean and no std
                row[m] = float(v.iloc[0]) if len(v) else math.nan
        summ.append(row)
    summary = pd.DataFrame(summ)
    empty = [c for c in summary.columns if c.endswith(("_mean", "_std")) and summary[c].isna().all()]
    empty += [m for m in FINAL_METRICS if m in summary and summary[m].isna().all()]
    summary = summary.drop(columns=empty)
    runs = runs.drop(columns=[m for m in FINAL_METRICS if runs[m].isna().all()])
    counts = {"runs": len(records), "ok": int((runs["status"] == "ok").sum()),
              "failed": int((runs["status"] != "ok").sum()),
              "skipped": sum(bool(r.get("skipped")) for r in records)}
    with OutputSet(out, held=True) as dest, dest.stage() as stage:  # runs.csv, summary.csv, counts.json: one set
        write_text(stage / "runs.csv", runs.to_csv(index=False))
        write_text(stage / "summary.csv", summary.to_csv(index=False))
        write_json(stage / "counts.json", counts)
    return SweepResult(out=out, runs=runs, grid_summary=summary, counts=counts, spec=spec)
