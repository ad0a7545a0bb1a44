"""Rank over training: the per-head spectra of every checkpoint of a series, one table row per
(checkpoint, step, layer, head, product), and a figure of rank / gap / balance against step.

A **series** (:func:`resolve_series`) is

- a training run directory of ``headrank train`` (``RUN/checkpoints/step-N``; keep them with
  ``keep_checkpoints``), or a Hugging Face ``Trainer`` ``output_dir`` (``checkpoint-N``);
- a list of checkpoint directories (steps from ``trainer_state.json``, else from a trailing
  number in the name, else their order);
- a Hub id with ``revisions`` (``step1000,step2000`` …, each resolved in the local cache as
  ``headrank spectra --revision`` does; the step is parsed from a name such as ``step1000``,
  ``checkpoint-500`` or ``1000``, else read from the snapshot's ``trainer_state.json``
  ``global_step``; a revision such as ``main`` or ``v1.0`` with neither is refused); with
  ``remote`` the revisions are read over HTTP ranges (:mod:`headrank.io.remote`), and
  ``revisions="all"`` takes every branch and tag of the Hub repo whose name holds a step.

For a run directory of ``headrank train`` the tracker rows of ``RUN/metrics.jsonl`` (every
``track_every`` steps, measured on the live model by the same code) fill the steps that have no
checkpoint, when the run's tolerance is the one asked for; the table's ``origin`` column says
which rows came from a checkpoint and which from ``metrics.jsonl``.

Every checkpoint is opened first (config only) and they must share one architecture (model type,
layers, heads, kv heads, head and model width); a revision that does not exist, or a mixed
series, is one :class:`HeadRankError` before any work. Checkpoints are then analysed in
parallel, each streaming its layers through :func:`headrank.analysis.scan.analyze` with one
torch thread: on a local process pool (``workers``) or as Ray tasks (``ray``: an address,
``auto`` or ``local``; a Ray already initialised in this process is used as it is).

Layout of ``OUT`` (**resumable**: a checkpoint whose table is in ``OUT/checkpoints/`` is not
redone; **never mixed**: every checkpoint is identified by its resolved path and the size and
modification time of its files, and an ``OUT`` made from other checkpoints (``track runB --out O``
after ``track runA --out O``, or the same run retrained) or with another tolerance is refused
unless ``force``, which measures it anew)::

    OUT/series.json            the resolved series (label, step, source, revision, identity) and tol
    OUT/started.json           what a run asked for and the series it measures, written before the
                               first checkpoint (``resume`` continues it: :mod:`.series_out`)
    OUT/checkpoints/LABEL.csv  one checkpoint's rows (written atomically when it finishes), with
    OUT/checkpoints/LABEL.json its identity and tolerance (a table is reused only when they match)
    OUT/table.partial.csv      the rows of each checkpoint appended as it finishes (a stopped run
                               keeps a table of what it had); removed when table.csv moves in
    OUT/table.csv              every row: checkpoint, step, layer, head, product, metrics
    OUT/summary.csv            per (checkpoint, step, layer, product): means over heads
    OUT/over_training.png      effective rank (and k90), gap/bound, balance, numerical rank vs step

``series.json``, ``table.csv``, ``summary.csv`` and ``over_training.png`` are written into a
staging directory and moved in together (:class:`headrank.io.writer.OutputSet`), so a
failed run (a full disk, a kill) leaves the previous set whole.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from headrank.analysis import series_out
from headrank.analysis.series_plots import plot_series, series_figure
from headrank.core.linalg import DEFAULT_TOL
from headrank.core.metrics import SUMMARY_METRICS
from headrank.errors import HeadRankError, one_line
from headrank.io.convention import convention as check_convention
from headrank.io.identity import FileChanged
from headrank.io.validate import BOUNDS, bounded
from headrank.io.validate import read_json as read_record
from headrank.io.writer import OutputSet, confined
from headrank.util.args import checked
from headrank.util.fileio import write_atomic, write_json
from headrank.util.legacy import upgrade
from headrank.util.ray import ray_session
from headrank.util.result import (
    ResultBase,
    check_dir,
    copy_dir,
    plain,
    read_csv,
    read_json,
    records,
)

KEY = ("checkpoint", "step")


@dataclass(frozen=True)
class SeriesItem:
    """One checkpoint of a series: a label (file name), its training step, where it is."""

    label: str
    step: int
    source: str
    revision: str | None = None
    remote: bool = False  # a Hub revision read over HTTP ranges (headrank.io.remote)
    commit: str | None = None  # remote: the commit the architecture check read, and the analysis reads
    convention: str = "raw"  # the weights' convention (headrank.io.convention)


def _trailing_int(text: str) -> int | None:
    m = re.search(r"(\d+)$", text)
    return int(m.group(1)) if m else None


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", label)


_STEP_NAME = re.compile(r"(?:^|.*[^A-Za-z])(?:step|checkpoint|ckpt|iter|iteration)[-_]?(\d+)$|^(\d+)$",
                        re.IGNORECASE)


def _trainer_step(p: Path) -> int | None:
    """``global_step`` of a Trainer checkpoint's ``trainer_state.json`` (None when absent)."""
    state = p / "trainer_state.json"
    if not state.is_file():
        return None
    try:
        step = read_record(state, "track record")["global_step"]
    except (KeyError, TypeError, HeadRankError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def revision_step(repo_id: str, revision: str) -> int:
    """The training step of a Hub revision: parsed from its name (``step1000``, ``checkpoint-500``,
    ``global_step20``, ``1000``), else the ``global_step`` of the cached snapshot's
    ``trainer_state.json``; one line when neither says (``main``, ``v1.0``: no step in the name)."""
    m = _STEP_NAME.match(revision)
    if m:
        return int(m.group(1) or m.group(2))
    from headrank.io.hub import cached_snapshot

    step = _trainer_step(cached_snapshot(repo_id, revision))
    if step is None:
        raise HeadRankError(f"cannot tell the training step of revision {revision!r} of {repo_id}: its name "
                            "holds none (like step1000) and its snapshot has no trainer_state.json; "
                            "give revisions named by step")
    return step


def _remote_step(repo_id: str, revision: str) -> int:
    """The training step in a remote revision's name (``step1000``, ``checkpoint-500``, ``1000``)."""
    m = _STEP_NAME.match(revision)
    if not m:
        raise HeadRankError(f"cannot tell the training step of revision {revision!r} of {repo_id}: its name "
                            "holds none (like step1000); give revisions named by step")
    return int(m.group(1) or m.group(2))


def _all_revisions(series: Any, remote: bool) -> list[str]:
    """``--revisions all``: the Hub's branches and tags whose names carry a step (``main`` does not)."""
    if not remote:
        raise HeadRankError("`revisions` all lists the Hub's refs: add `remote`")
    if not isinstance(series, (str, os.PathLike)):
        raise HeadRankError("`revisions` takes one Hub id")
    from headrank.io.remote import list_revisions

    refs = list_revisions(str(series))
    steps = [r for r in refs if _STEP_NAME.match(r)]
    if not steps:
        raise HeadRankError(f"{series} has no branch or tag named by a training step (like step1000); its refs: "
                            f"{', '.join(refs[:8]) or 'none'}")
    return steps


def _dir_step(p: Path, index: int) -> int:
    state = p / "trainer_state.json"
    if state.is_file():
        try:
            return bounded(read_record(state, "track record")["global_step"], "index", "global_step", str(state),
                           lo=0)
        except (KeyError, TypeError, HeadRankError):
            pass
    n = _trailing_int(p.name)
    return n if n is not None else index


def resolve_series(series: str | os.PathLike | Sequence[str | os.PathLike],
                   revisions: str | Sequence[str] | None = None, remote: bool = False) -> list[SeriesItem]:
    """The checkpoints of ``series`` (see the module docstring), sorted by step. ``remote``: the
    revisions are read over HTTP (``revisions="all"``: every ref of the Hub repo named by a step)."""
    if remote and revisions is None:
        raise HeadRankError("`remote` with track reads Hub revisions: give a Hub id and `revisions`")
    if isinstance(revisions, str) and revisions.strip() == "all":
        revisions = _all_revisions(series, remote)
    if revisions is not None:
        revs = [r.strip() for r in (revisions.split(",") if isinstance(revisions, str) else revisions)]
        revs = [r for r in revs if r]
        if len(revs) > BOUNDS["checkpoints"]:  # before one request per revision (10,000 refs: 20,000 requests)
            raise HeadRankError(f"`revisions` names {len(revs):,} revisions, more than the {BOUNDS['checkpoints']:,} "
                                "a series may hold; give fewer (every n-th step)")
        if not isinstance(series, (str, os.PathLike)) or not revs:
            raise HeadRankError("`revisions` takes one Hub id and a comma-separated list of revisions")
        if Path(series).exists():
            raise HeadRankError(f"`revisions` applies to a Hugging Face Hub id, not to the local path {series}")
        items = [SeriesItem(_safe(r), _remote_step(str(series), r) if remote else revision_step(str(series), r),
                            str(series), r, remote) for r in revs]
    elif isinstance(series, (str, os.PathLike)):
        items = _dir_series(Path(series))
    else:
        paths = [Path(p) for p in series]
        if len(paths) == 1:
            items = _dir_series(paths[0])
        else:
            missing = [str(p) for p in paths if not p.exists()]
            if missing:
                raise HeadRankError(f"no such checkpoint: {missing[0]}")
            items = [SeriesItem(_safe(p.name), _dir_step(p, i), str(p)) for i, p in enumerate(paths)]
    labels = [it.label for it in items]
    if len(set(labels)) != len(labels):  # same directory names (e.g. .../run_a/final, .../run_b/final)
        items = [replace(it, label=f"{i:04d}-{it.label}") for i, it in enumerate(items)]
    return sorted(items, key=lambda it: (it.step, it.label))


def _dir_series(p: Path) -> list[SeriesItem]:
    from headrank.io.rundir import checkpoint_dirs

    if not p.is_dir():
        raise HeadRankError(f"{p} is not a directory: give a run directory, a Trainer output_dir, several "
                            "checkpoint directories, or a Hub id with `revisions`")
    run = checkpoint_dirs(p)
    if run:
        return [SeriesItem(d.name, step, str(d)) for step, d in run]
    trainer = sorted((int(d.name.split("-")[1]), d) for d in p.iterdir()
                     if d.is_dir() and re.fullmatch(r"checkpoint-\d+", d.name))
    if trainer:
        return [SeriesItem(d.name, step, str(d)) for step, d in trainer]
    raise HeadRankError(f"{p} holds no checkpoints (checkpoints/step-N or checkpoint-N): "
                        "a series needs several")


def _identity(reader: Any) -> str:
    """What a checkpoint is, for telling two apart: the fingerprint of the local files its reader
    opened (:meth:`headrank.io.identity.Stamps.fingerprint`: resolved path, each file's device,
    inode, size and modification time, so a retrained run at the same path or a file replaced
    by rename is another checkpoint); a remote revision: its URL (the commit read pins it)."""
    ident = reader.ckpt.identity()
    return ident if ident is not None else hashlib.sha256(str(reader.origin.get("path")).encode()).hexdigest()[:20]


def vanished(item: SeriesItem | dict[str, Any]) -> bool:
    """A local checkpoint that no longer exists (a training run rotated it away meanwhile)."""
    it = item if isinstance(item, dict) else asdict(item)
    return not it.get("remote") and it.get("revision") is None and not os.path.lexists(it["source"])


def _architecture(item: SeriesItem) -> tuple[dict[str, Any], str, str | None] | None:
    """The architecture of one checkpoint, its identity and (remote) the commit read; None for a
    local checkpoint that vanished meanwhile."""
    from headrank.io.sources import open_reader

    try:
        r = open_reader(item.source, revision=item.commit or item.revision, remote=item.remote)
    except HeadRankError:
        if vanished(item):
            return None
        raise
    try:
        d = r.dims
        origin = getattr(r, "origin", None) or {}
        commit = (origin.get("hub") or {}).get("commit") if item.remote else None
        arch = {"model_type": r.ckpt.config.get("model_type") or r.layout.model_types[0], "n_layers": d.n_layers,
                "n_heads": d.n_heads, "n_kv_heads": d.n_kv_heads, "head_dim": d.head_dim, "d_model": d.d}
        return arch, _identity(r), commit
    finally:
        r.ckpt.close()


ARCH_THREADS = 8  # architecture checks at once (each a few small requests for a remote revision)


def check_architectures(items: list[SeriesItem], identities: dict[str, str] | None = None,
                        progress: Callable[[int, int], None] | None = None,
                        commits: dict[str, str] | None = None) -> dict[str, Any]:
    """Open every checkpoint (config and headers only, :data:`ARCH_THREADS` at a time) and require
    one architecture; return it. ``identities`` (a dict) receives each checkpoint's identity
    (resolved path, file sizes and times, a remote revision's commit) by label, ``commits`` the
    commit each remote revision was checked at (the analysis reads that very commit);
    ``progress(done, total)`` follows the checks."""
    if not items:
        raise HeadRankError("the series holds no checkpoints")
    from concurrent.futures import ThreadPoolExecutor

    found: dict[str, tuple[dict[str, Any], str, str | None] | None] = {}
    with ThreadPoolExecutor(min(ARCH_THREADS, len(items)), thread_name_prefix="headrank-arch") as pool:
        futures = [pool.submit(_architecture, it) for it in items]
        try:
            for it, fut in zip(items, futures, strict=True):  # in order: the first failure is the one named
                found[it.label] = fut.result()
                if progress:
                    progress(len(found), len(items))
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    there = [it for it in items if found[it.label] is not None]  # a rotated-away checkpoint is skipped
    if not there:
        raise HeadRankError(f"every checkpoint of the series vanished while it was read ({items[0].source}, ...)")
    first = found[there[0].label][0]
    for it in there[1:]:
        a = found[it.label][0]
        if a != first:
            diff = ", ".join(f"{k} {first[k]} vs {a[k]}" for k in first if a[k] != first[k])
            raise HeadRankError(f"mixed architectures in the series: {there[0].label} and {it.label} differ "
                                f"({diff})")
    for label, (_, ident, commit) in ((k, v) for k, v in found.items() if v is not None):
        if identities is not None:
            identities[label] = ident
        if commits is not None and commit:
            commits[label] = commit
    return first


def analyse_checkpoint(item: dict[str, Any], tol: float) -> pd.DataFrame:
    """The per-head table of one checkpoint (one torch thread), with ``checkpoint`` and ``step``."""
    from headrank.analysis.scan import analyze
    from headrank.util.threads import torch_threads

    pinned = item.get("commit")
    with torch_threads(1):
        res = analyze(item["source"], revision=pinned or item["revision"], tol=tol, threads=1,
                      remote=item.get("remote", False), rotary=False, convention=item.get("convention", "raw"))
    if pinned and (res.meta.get("hub") or {}).get("commit") not in (None, pinned):
        raise HeadRankError(f"{item['source']}@{item['revision']}: the server answered commit "
                            f"{res.meta['hub']['commit']} for commit {pinned}")
    res.inputs.check()  # again, just before its table is returned to be written (io.identity)
    # and the files the analysis opened are those the architecture check opened
    if item.get("identity") and not item.get("remote") and res.inputs.fingerprint() != item["identity"]:
        raise FileChanged(f"{item['source']} changed while it was read (truncated, rewritten or replaced since "
                          "its architecture was checked): not measured; run again once it is complete")
    table = res.table  # only the head table is kept
    if pinned:
        table.insert(0, "commit", pinned)
    table.insert(0, "step", item["step"])
    table.insert(0, "checkpoint", item["label"])
    return table


@dataclass
class SeriesResult(ResultBase):
    """What :func:`track` returns: every row (``table``), the per-layer means
    (``summary()``, ``summary.csv``), the files written; ``failed``: label → the error, after
    :data:`CHECKPOINT_TRIES` tries."""

    verb = "track"

    out: Path
    table: pd.DataFrame
    layer_means: pd.DataFrame
    architecture: dict[str, Any]
    computed: list[str]
    skipped: list[str]
    files: list[Path]
    failed: dict[str, str] = field(default_factory=dict)  # label -> the error, after CHECKPOINT_TRIES tries
    vanished: list[str] = field(default_factory=list)  # local checkpoints deleted while the series was read

    @property
    def meta(self) -> dict[str, Any]:
        """The series' facts: ``out``, ``architecture``, ``computed``, ``skipped``, ``failed``,
        ``vanished``, ``files``."""
        return {"out": str(self.out), "architecture": self.architecture, "computed": self.computed,
                "skipped": self.skipped, "failed": self.failed, "vanished": self.vanished,
                "files": [str(f) for f in self.files]}

    def headline(self) -> str:
        return f"SeriesResult in {self.out}: {self.table['checkpoint'].nunique()} checkpoints"

    def summary(self) -> pd.DataFrame:
        """Per (checkpoint, step, layer, product): means over heads (``summary.csv``)."""
        return self.layer_means

    def checkpoint_means(self) -> pd.DataFrame:
        """Per (checkpoint, step, product): means over layers and heads of every summary metric."""
        s = self.layer_means
        return (s.groupby(["checkpoint", "step", "product"], sort=False)[[k for k in SUMMARY_METRICS if k in s]]
                .mean().reset_index())

    def save(self, out: str | os.PathLike) -> list[Path]:
        """The series directory (``table.csv``, ``summary.csv``, ``series.json``, figure,
        ``checkpoints/``) copied into ``out`` (nothing to do when ``out`` is where it was measured)."""
        return copy_dir(self.out, out)

    @classmethod
    def load(cls, out: str | os.PathLike) -> SeriesResult:
        """The series a :func:`track` (or ``headrank track --out``) wrote into ``out``."""
        out = check_dir(out, "series.json")
        spec = upgrade(read_json(out / "series.json"))
        table = read_csv(out / "table.csv")
        table["checkpoint"] = table["checkpoint"].astype(str)
        layer_means = read_csv(out / "summary.csv")
        layer_means["checkpoint"] = layer_means["checkpoint"].astype(str)
        files = [out / n for n in ("table.csv", "summary.csv", "series.json", "over_training.png")
                 if (out / n).is_file()]
        return cls(out=out, table=table, layer_means=layer_means, architecture=spec.get("architecture", {}),
                   computed=list(spec.get("computed", [])), skipped=list(spec.get("skipped", [])), files=files,
                   failed=dict(spec.get("failed", {})), vanished=list(spec.get("vanished", [])))

    def plot(self):
        """Effective rank (and k90), gap/bound, balance and numerical rank against step."""
        return series_figure(self.layer_means)

    def to_json(self) -> dict[str, Any]:
        """What ``headrank track --json`` prints: the series' facts and ``checkpoints`` (per
        checkpoint and product, the means over layers and heads)."""
        return plain({**self.meta, "checkpoints": records(self.checkpoint_means())})


@checked
def track(series: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike, *,
          revisions: str | Sequence[str] | None = None, tol: float = DEFAULT_TOL, workers: int | None = None,
          ray: str | None = None, plots: bool = True, force: bool = False, metrics: bool = True,
          remote: bool = False, resume: bool = False, progress: Callable[[int, int], None] | None = None,
          checking: Callable[[int, int], None] | None = None, convention: str = "raw") -> SeriesResult:
    """``headrank track SERIES --out OUT``: measure every checkpoint of ``series`` into ``out`` (the module
    docstring, ``docs/verbs/track.md``). A checkpoint whose analysis fails is tried :data:`CHECKPOINT_TRIES`
    times, then recorded as failed (``result.failed``, ``series.json``'s ``failed``) while the others go on.

    Parameters
    ----------
    series
        A training run directory, a Trainer ``output_dir``, several checkpoint directories, or a
        Hub id with ``revisions``.
    out
        The series directory (resumable): table.csv, summary.csv, series.json, over_training.png.
    revisions
        Hub revisions (``"step1000,step2000"`` or a sequence); ``"all"`` with ``remote``: every
        ref named by a step.
    tol
        Relative threshold τ of the numerical rank.
    convention
        ``raw`` or ``transformerlens`` (:mod:`headrank.io.convention`; ``metrics`` rows are raw: ``raw`` only).
    workers
        Worker processes, one checkpoint each (1 to 4 per CPU; default: the CPUs).
    ray
        Analyse the checkpoints as Ray tasks: a cluster address, ``"auto"`` or ``"local"``.
    plots
        Draw over_training.png.
    force
        Measure into an ``out`` made from other checkpoints or another tolerance (its tables of
        checkpoints that are not these are redone).
    metrics
        For a run directory, also the tracker rows of ``metrics.jsonl`` at steps without a checkpoint.
    remote
        Hub revisions read over HTTP ranges, each at the commit its architecture check read (``commit`` in the
        table and ``series.json``): a branch that moves meanwhile cannot mix two models.
    resume
        Continue the run that stopped in ``out`` at the commits it checked, measuring only what it
        had not (another series or options, or a checkpoint changed since: one line).
    progress, checking
        ``f(done, total)`` callbacks: the checkpoints measured; the architecture checks before them.

    Returns
    -------
    SeriesResult
    """
    out, conv = _check_args(tol, workers, out, resume and force), check_convention(convention).name
    asked = {**series_out.request(series, revisions, remote, tol, metrics), **({"convention": conv} if conv != "raw" else {})}
    with OutputSet(out) as dest:  # --out checked once and locked for the run (one writer at a time)
        items, ids, arch, gone = (_resumed(out, asked, tol, checking) if resume else
                                  _checked(resolve_series(series, revisions, remote=remote), checking))
        items = [replace(it, convention=conv) for it in items]
        spec = {"kind": "headrank-series", "tol": tol, "convention": conv, "architecture": arch, "items": _items(items, ids)}
        series_out.check_out(out, spec, force, resume)
        series_out.write_plan(out, asked, spec)
        extra = _tracker_rows(series, revisions, items, arch, tol) if metrics and conv == "raw" else None
        done, todo, failed = _measure(items, ids, out / "checkpoints", tol, workers, ray, progress, gone)
        return _finish(dest, items, arch, [t["label"] for t in todo], sorted(done), failed, gone, plots, spec, extra)


def _items(items: list[SeriesItem], ids: dict[str, str]) -> list[dict[str, Any]]:
    return [{**asdict(i), "identity": ids[i.label]} for i in items]


def _checked(items: list[SeriesItem], checking: Callable[[int, int], None] | None
             ) -> tuple[list[SeriesItem], dict[str, str], dict[str, Any], list[str]]:
    """(the items there, each at the commit its architecture check read; their identities; the
    architecture; the labels of local checkpoints rotated away meanwhile)."""
    ids: dict[str, str] = {}
    commits: dict[str, str] = {}
    arch = check_architectures(items, ids, checking, commits)
    gone = [it.label for it in items if it.label not in ids]
    return [replace(it, commit=commits.get(it.label)) for it in items if it.label in ids], ids, arch, gone


def _resumed(out: Path, asked: dict[str, Any], tol: float, checking: Callable[[int, int], None] | None
             ) -> tuple[list[SeriesItem], dict[str, str], dict[str, Any], list[str]]:
    """The checkpoints of the run that stopped in ``out`` (``started.json``), made by the same
    request: (items at the commits checked then, identities, architecture, labels vanished). A
    remote revision already measured is not asked again; the others are checked anew, and must
    be what they were (:func:`headrank.analysis.series_out.changed`)."""
    plan = series_out.read_plan(out, asked)
    fields = set(SeriesItem.__dataclass_fields__)
    try:  # a hand-edited record: one line, as read_plan's
        items = [SeriesItem(**{k: v for k, v in it.items() if k in fields}) for it in plan["items"]]
        planned = {it["label"]: it.get("identity") for it in plan["items"]}
        if "architecture" not in plan:
            raise KeyError("architecture")
    except (TypeError, KeyError, AttributeError):
        raise HeadRankError(f"`resume`: {out / series_out.PLAN} is not a track run's record; run without `resume` "
                            "and with `force`") from None
    conv = asked.get("convention", "raw")
    finished = {it.label for it in items if _reusable(out / "checkpoints", it.label, planned[it.label], tol, conv)}
    ids: dict[str, str] = {}
    arch = plan["architecture"]
    check = [it for it in items if not (it.remote and it.label in finished)]  # a local one: changed since?
    if check:
        arch = check_architectures(check, ids, checking, {})
    series_out.changed(plan, arch, ids)
    ids.update({label: planned[label] for label in finished if label not in ids})  # kept, even if rotated away
    gone = [it.label for it in check if it.label not in ids]
    return [it for it in items if it.label in ids], ids, arch, gone


def _measure(items: Sequence[SeriesItem], ids: dict[str, str], ckdir: Path, tol: float, workers: int | None,
             ray: str | None, progress: Callable[[int, int], None] | None, gone: list[str]
             ) -> tuple[set[str], list[dict[str, Any]], dict[str, str]]:
    """Measure the checkpoints of ``items`` not already measured in ``ckdir``, writing each one's
    table as it finishes: (labels reused, items measured now, labels that failed -> error); the
    labels of checkpoints that vanished meanwhile are appended to ``gone``."""
    if ckdir.is_symlink():
        raise HeadRankError(f"{ckdir} is a symlink: refusing to write the checkpoints' tables through it")
    ckdir.mkdir(parents=True, exist_ok=True)
    conv = items[0].convention if items else "raw"
    done = {it.label for it in items if _reusable(ckdir, it.label, ids[it.label], tol, conv)}
    todo = [{**asdict(it), "identity": ids[it.label]} for it in items if it.label not in done]
    count = len(done)
    failed: dict[str, str] = {}
    if progress:
        progress(count, len(items))

    def collect(label: str, table: pd.DataFrame | str) -> None:
        nonlocal count
        if isinstance(table, str) and table == VANISHED:  # rotated away while the series was read: skipped
            gone.append(label)
            return
        if isinstance(table, str):  # failed after its tries: recorded, the others go on
            failed[label] = table
            return
        write_atomic(confined(ckdir, f"{label}.csv", "checkpoint label"), lambda p: table.to_csv(p, index=False))
        write_json(confined(ckdir, f"{label}.json", "checkpoint label"),
                   {"identity": ids[label], "tol": tol, "convention": conv})
        series_out.append_rows(ckdir.parent, table)  # a stopped run keeps a table of what it had
        count += 1
        if progress:
            progress(count, len(items))

    if todo and ray is not None:
        _on_ray(todo, tol, ray, collect)
    elif todo:
        _on_pool(todo, tol, workers, collect)
    return done, todo, failed


def _finish(dest: OutputSet, items: list[SeriesItem], arch: dict[str, Any], todo: list[str], done: list[str],
            failed: dict[str, str], gone: list[str], plots: bool, spec: dict[str, Any],
            extra: pd.DataFrame | None) -> SeriesResult:
    """The combined table, summary, series.json and figure of the checkpoints that neither failed
    nor vanished; the failed ones are recorded in series.json."""
    ok = [it for it in items if it.label not in failed and it.label not in gone]
    if not ok:
        if not failed:
            raise HeadRankError(f"every checkpoint of the series vanished while it was read ({', '.join(gone[:4])})")
        label, err = next(iter(failed.items()))
        raise HeadRankError(f"every checkpoint failed ({len(failed)}); {label}: {err}")
    if failed:
        spec = {**spec, "failed": failed}
    if gone:
        spec = {**spec, "vanished": gone, "items": [i for i in spec["items"] if i["label"] not in gone]}
    res = _combine(dest, ok, arch, [t for t in todo if t not in failed and t not in gone], done, plots, spec, extra)
    res.failed, res.vanished = failed, gone
    return res


def _check_args(tol: float, workers: int | None, out: str | os.PathLike, both: bool = False) -> Path:
    """``track``'s options, before anything is read: the tolerance, the worker count, ``--out``;
    ``both``: ``resume`` and ``force`` were given together."""
    if both:
        raise HeadRankError("`resume` continues a stopped run as it was started; `force` measures anew: give one")
    from headrank.util.constraints import TRACK

    TRACK.check(tol=tol, workers=workers)  # the one declaration of their bounds, which the command line reads
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise HeadRankError(f"`out` {out} exists and is not a directory")
    return out


CHECKPOINT_TRIES = 2  # a checkpoint's analysis is tried this often before it is recorded as failed
VANISHED = "\0vanished"  # what analyse_or_fail returns for a local checkpoint deleted meanwhile


def analyse_or_fail(item: dict[str, Any], tol: float) -> pd.DataFrame | str:
    """:func:`analyse_checkpoint`, tried :data:`CHECKPOINT_TRIES` times; the last error as one
    line (a string) instead of an exception, so one bad checkpoint does not stop a series."""
    for _ in range(CHECKPOINT_TRIES):
        try:
            return analyse_checkpoint(item, tol)
        except Exception as e:  # noqa: BLE001 - recorded with its type, never silent
            if vanished(item):
                return VANISHED
            from headrank.util.redact import redact_text

            err = redact_text(one_line(e, 400, typed=not isinstance(e, HeadRankError)))
            if isinstance(e, FileChanged):  # a second try would read another checkpoint than the one checked
                break
    return err


def _reusable(ckdir: Path, label: str, identity: str, tol: float, convention: str = "raw") -> bool:
    """Whether ``ckdir/LABEL.csv`` was measured from this very checkpoint with this tolerance and convention."""
    try:
        rec = read_record(confined(ckdir, f"{label}.json", "checkpoint label"), "track record")
    except HeadRankError:  # missing, a FIFO, too large, corrupt: measured again
        return False
    return (isinstance(rec, dict) and rec.get("identity") == identity and rec.get("tol") == tol
            and rec.get("convention", "raw") == convention
            and confined(ckdir, f"{label}.csv", "checkpoint label").is_file())


def _tracker_rows(series: Any, revisions: Any, items: list[SeriesItem], arch: dict[str, Any],
                  tol: float) -> pd.DataFrame | None:
    """The tracker rows of an ``headrank train`` run's metrics.jsonl at steps without a checkpoint,
    in the table's columns (None: not a run directory, or the run tracked another tolerance)."""
    from headrank.analysis.tracker import tracker_table
    from headrank.io.rundir import METRICS, read_metrics

    if revisions is not None:
        return None
    paths = [series] if isinstance(series, (str, os.PathLike)) else list(series)
    if len(paths) != 1 or not (Path(paths[0]) / METRICS).is_file():
        return None
    run = Path(paths[0])
    try:
        cfg = upgrade(read_record(run / "config.json", "run config"))
    except HeadRankError:
        return None
    if not isinstance(cfg, dict) or cfg.get("tol") != tol:
        return None
    try:
        table = tracker_table(read_metrics(run))
    except KeyError:  # rows written before a metric was added to the table: measure checkpoints only
        return None
    table = table[~table["step"].isin({it.step for it in items})]
    if table.empty:
        return None
    from headrank.core.linalg import METRIC_COLUMNS

    group = max(arch["n_heads"] // max(arch["n_kv_heads"] or arch["n_heads"], 1), 1)
    table = table.assign(checkpoint=[f"step-{int(s):08d}" for s in table["step"]], kv_head=table["head"] // group,
                         head_dim=arch["head_dim"],
                         finite=table[list(METRIC_COLUMNS)].notna().all(axis=1), origin="metrics.jsonl")
    return table


def _on_pool(todo: list[dict[str, Any]], tol: float, workers: int | None,
             collect: Callable[[str, pd.DataFrame], None]) -> None:
    n = workers or max(1, min(len(todo), os.cpu_count() or 1))
    if n == 1:
        for it in todo:
            collect(it["label"], analyse_or_fail(it, tol))
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    left = {it["label"]: it for it in todo}
    try:
        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(analyse_or_fail, it, tol): it for it in todo}
            for fut in as_completed(futures):
                label = futures[fut]["label"]
                collect(label, fut.result())
                del left[label]
    except BrokenProcessPool:
        # a worker died (killed, out of memory, a crash in native code): the pool is gone, and
        # every checkpoint it had not finished is run again alone, so only the culprit fails
        for label, it in list(left.items()):
            collect(label, _alone(it, tol))


def _alone(item: dict[str, Any], tol: float) -> pd.DataFrame | str:
    """:func:`analyse_or_fail` in a fresh process of its own; a process that dies is one line."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
            return pool.submit(analyse_or_fail, item, tol).result()
    except BrokenProcessPool:
        return "its worker process died while reading it (killed, out of memory, or a crash in native code)"


def _on_ray(todo: list[dict[str, Any]], tol: float, address: str,
            collect: Callable[[str, pd.DataFrame], None]) -> None:
    with ray_session(address) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(analyse_or_fail)
        pending = {task.remote(it, tol): it for it in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            it = pending.pop(ready[0])
            collect(it["label"], ray.get(ready[0]))


def summarize_series(table: pd.DataFrame) -> pd.DataFrame:
    """Per (checkpoint, step, layer, product): means over heads of every summary metric of the
    table (core.metrics.SUMMARY_METRICS: effective rank, k90, k99, numerical rank, gap / bound,
    relative balance …) that ``table`` holds (tables written before a metric existed lack it)."""
    unit = ["attention", "layer"] if "attention" in table.columns else ["layer"]  # an encoder-decoder: per kind
    g = table.groupby([*KEY, *unit, "product"], sort=False)
    out = g.agg(heads=("head", "size"), head_dim=("head_dim", "first"),
                **{k: (k, "mean") for k in SUMMARY_METRICS if k in table})
    return out.reset_index().sort_values(["step", "checkpoint", *unit, "product"], ignore_index=True, key=_kind_rank)


def _kind_rank(col: pd.Series) -> pd.Series:
    """Sort key: an encoder-decoder's kinds in the model's order (encoder, decoder, cross)."""
    return col.map({"encoder": 0, "decoder": 1, "cross": 2}) if col.name == "attention" else col


def _combine(dest: OutputSet, items: list[SeriesItem], arch: dict[str, Any], computed: list[str],
             skipped: list[str], plots: bool, spec: dict[str, Any] | None = None,
             extra: pd.DataFrame | None = None) -> SeriesResult:
    out = dest.out
    frames = [pd.read_csv(confined(out / "checkpoints", f"{it.label}.csv", "checkpoint label")).assign(
        origin="checkpoint") for it in items]
    if extra is not None:
        frames.append(extra.reindex(columns=frames[0].columns))
    table = pd.concat(frames, ignore_index=True)
    table["checkpoint"] = table["checkpoint"].astype(str)
    unit = ["attention", "layer"] if "attention" in table.columns else ["layer"]
    table = table.sort_values(["step", "checkpoint", *unit, "product", "head"], ignore_index=True, key=_kind_rank)
    summary = summarize_series(table)
    with dest.stage() as stage:  # the set moves in whole, or the previous set stays
        files = [write_atomic(stage / "table.csv", lambda p: table.to_csv(p, index=False)),
                 write_atomic(stage / "summary.csv", lambda p: summary.to_csv(p, index=False))]
        if spec is not None:
            files.append(write_json(stage / "series.json", {**spec, "computed": computed, "skipped": skipped}))
        if plots:
            more = 0 if extra is None else extra["step"].nunique()
            files.append(plot_series(summary, stage / "over_training.png", title=_title(items, arch, more)))
    (out / series_out.PARTIAL).unlink(missing_ok=True)  # the whole table is in: the partial one goes
    return SeriesResult(out=out, table=table, layer_means=summary, architecture=arch, computed=computed,
                        skipped=skipped, files=dest.moved(files, stage))


def model_name(source: str, revision: str | None = None) -> str:
    """A short name for a figure title: a Hub id as it is, a run or checkpoint by its directory name
    (``RUN/checkpoints/step-N`` → ``RUN``'s name), never a whole path."""
    if revision is not None:
        return source
    p = Path(source)
    if p.parent.name == "checkpoints":
        p = p.parent.parent
    elif re.fullmatch(r"checkpoint-\d+", p.name) or _STEP_NAME.match(p.name):
        p = p.parent
    return p.resolve().name or str(source)


def _title(items: list[SeriesItem], arch: dict[str, Any], tracker_steps: int = 0) -> str:
    names = list(dict.fromkeys(model_name(it.source, it.revision) for it in items))
    name = names[0] if len(names) == 1 else f"{names[0]} + {len(names) - 1} more"
    more = f" + {tracker_steps} step{'s' if tracker_steps != 1 else ''} from metrics.jsonl" if tracker_steps else ""
    return (f"{name}: {len(items)} checkpoints{more}, {arch['model_type']} {arch['n_layers']} layers x "
            f"{arch['n_heads']} heads (dh {arch['head_dim']})")
