"""Rank over training: the per-head spectra of every checkpoint of a series, one table row per
(checkpoint, step, layer, head, product), and a figure of rank / gap / balance against step.

A **series** (:func:`resolve_series`) is

- a training run directory of ``attnrank train`` (``RUN/checkpoints/step-N``; keep them with
  ``keep_checkpoints``), or a Hugging Face ``Trainer`` ``output_dir`` (``checkpoint-N``);
- a list of checkpoint directories (steps from ``trainer_state.json``, else from a trailing
  number in the name, else their order);
- a Hub id with ``revisions`` (``step1000,step2000`` …, each resolved in the local cache as
  ``attnrank spectra --revision`` does; the step is the revision's trailing number).

Every checkpoint is opened first (config only) and they must share one architecture (model type,
layers, heads, kv heads, head and model width); a revision that does not exist, or a mixed
series, is one :class:`AttnRankError` before any work. Checkpoints are then analysed in
parallel, each streaming its layers through :func:`attnrank.analysis.scan.analyze` with one
torch thread: on a local process pool (``workers``) or as Ray tasks (``ray``: an address,
``auto`` or ``local``; a Ray already initialised in this process is used as it is).

Layout of ``OUT`` (**resumable**: a checkpoint whose table is in ``OUT/checkpoints/`` is not
redone; the series and tolerance must match ``OUT/series.json``)::

    OUT/series.json            the resolved series (label, step, source, revision) and tol
    OUT/checkpoints/LABEL.csv  one checkpoint's rows (written atomically when it finishes)
    OUT/table.csv              every row: checkpoint, step, layer, head, product, metrics
    OUT/summary.csv            per (checkpoint, step, layer, product): means over heads
    OUT/over_training.png      effective rank, numerical rank, gap/bound, balance vs step
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from attnrank.core.linalg import DEFAULT_TOL
from attnrank.errors import AttnRankError
from attnrank.util.fileio import write_atomic, write_json
from attnrank.util.ray import ray_session

KEY = ("checkpoint", "step")


@dataclass(frozen=True)
class SeriesItem:
    """One checkpoint of a series: a label (file name), its training step, where it is."""

    label: str
    step: int
    source: str
    revision: str | None = None


def _trailing_int(text: str) -> int | None:
    m = re.search(r"(\d+)$", text)
    return int(m.group(1)) if m else None


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", label)


def _dir_step(p: Path, index: int) -> int:
    state = p / "trainer_state.json"
    if state.is_file():
        try:
            return int(json.loads(state.read_text())["global_step"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    n = _trailing_int(p.name)
    return n if n is not None else index


def resolve_series(series: str | os.PathLike | Sequence[str | os.PathLike],
                   revisions: str | Sequence[str] | None = None) -> list[SeriesItem]:
    """The checkpoints of ``series`` (see the module docstring), sorted by step."""
    if revisions is not None:
        revs = [r.strip() for r in (revisions.split(",") if isinstance(revisions, str) else revisions)]
        revs = [r for r in revs if r]
        if not isinstance(series, (str, os.PathLike)) or not revs:
            raise AttnRankError("--revisions takes one Hub id and a comma-separated list of revisions")
        if Path(series).exists():
            raise AttnRankError(f"--revisions applies to a Hugging Face Hub id, not to the local path {series}")
        items = [SeriesItem(_safe(r), s if (s := _trailing_int(r)) is not None else i, str(series), r)
                 for i, r in enumerate(revs)]
    elif isinstance(series, (str, os.PathLike)):
        items = _dir_series(Path(series))
    else:
        paths = [Path(p) for p in series]
        if len(paths) == 1:
            items = _dir_series(paths[0])
        else:
            missing = [str(p) for p in paths if not p.exists()]
            if missing:
                raise AttnRankError(f"no such checkpoint: {missing[0]}")
            items = [SeriesItem(_safe(p.name), _dir_step(p, i), str(p)) for i, p in enumerate(paths)]
    labels = [it.label for it in items]
    if len(set(labels)) != len(labels):  # same directory names (e.g. .../run_a/final, .../run_b/final)
        items = [SeriesItem(f"{i:04d}-{it.label}", it.step, it.source, it.revision) for i, it in enumerate(items)]
    return sorted(items, key=lambda it: (it.step, it.label))


def _dir_series(p: Path) -> list[SeriesItem]:
    from attnrank.io.rundir import checkpoint_dirs

    if not p.is_dir():
        raise AttnRankError(f"{p} is not a directory: give a run directory, a Trainer output_dir, several "
                            "checkpoint directories, or a Hub id with --revisions")
    run = checkpoint_dirs(p)
    if run:
        return [SeriesItem(d.name, step, str(d)) for step, d in run]
    trainer = sorted((int(d.name.split("-")[1]), d) for d in p.iterdir()
                     if d.is_dir() and re.fullmatch(r"checkpoint-\d+", d.name))
    if trainer:
        return [SeriesItem(d.name, step, str(d)) for step, d in trainer]
    raise AttnRankError(f"{p} holds no checkpoints (checkpoints/step-N or checkpoint-N): "
                        "a series needs several")


def _architecture(item: SeriesItem) -> dict[str, Any]:
    from attnrank.io.sources import open_reader

    r = open_reader(item.source, revision=item.revision)
    d = r.dims
    return {"model_type": r.ckpt.config.get("model_type") or r.layout.model_types[0], "n_layers": d.n_layers,
            "n_heads": d.n_heads, "n_kv_heads": d.n_kv_heads, "head_dim": d.head_dim, "d_model": d.d}


def check_architectures(items: list[SeriesItem]) -> dict[str, Any]:
    """Open every checkpoint (config only) and require one architecture; return it."""
    if not items:
        raise AttnRankError("the series holds no checkpoints")
    first = _architecture(items[0])
    for it in items[1:]:
        a = _architecture(it)
        if a != first:
            diff = ", ".join(f"{k} {first[k]} vs {a[k]}" for k in first if a[k] != first[k])
            raise AttnRankError(f"mixed architectures in the series: {items[0].label} and {it.label} differ "
                                f"({diff})")
    return first


def analyse_checkpoint(item: dict[str, Any], tol: float) -> pd.DataFrame:
    """The per-head table of one checkpoint (one torch thread), with ``checkpoint`` and ``step``."""
    from attnrank.analysis.scan import analyze
    from attnrank.util.threads import torch_threads

    with torch_threads(1):
        table = analyze(item["source"], revision=item["revision"], tol=tol, threads=1).table
    table.insert(0, "step", item["step"])
    table.insert(0, "checkpoint", item["label"])
    return table


@dataclass
class SeriesResult:
    """What :func:`track` returns: every row, the per-layer summary, the files written."""

    out: Path
    table: pd.DataFrame
    summary: pd.DataFrame
    architecture: dict[str, Any]
    computed: list[str]
    skipped: list[str]
    files: list[Path]


def track(series: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike, *,
          revisions: str | Sequence[str] | None = None, tol: float = DEFAULT_TOL, workers: int | None = None,
          ray: str | None = None, plots: bool = True,
          progress: Callable[[int, int], None] | None = None) -> SeriesResult:
    """Measure every checkpoint of ``series`` into ``out`` (see the module docstring)."""
    if not 0 < tol < 1:
        raise AttnRankError(f"tolerance must lie in (0, 1); got {tol}")
    if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
        raise AttnRankError(f"workers must be a positive integer, got {workers!r}")
    items = resolve_series(series, revisions)
    arch = check_architectures(items)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise AttnRankError(f"--out {out} exists and is not a directory")
    spec = {"kind": "attnrank-series", "tol": tol, "architecture": arch, "items": [asdict(i) for i in items]}
    _check_out(out, spec)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    write_json(out / "series.json", spec)
    done = {it.label for it in items if (out / "checkpoints" / f"{it.label}.csv").is_file()}
    todo = [asdict(it) for it in items if it.label not in done]
    count = len(done)
    if progress:
        progress(count, len(items))

    def collect(label: str, table: pd.DataFrame) -> None:
        nonlocal count
        write_atomic(out / "checkpoints" / f"{label}.csv", lambda p: table.to_csv(p, index=False))
        count += 1
        if progress:
            progress(count, len(items))

    if todo and ray is not None:
        _on_ray(todo, tol, ray, collect)
    elif todo:
        _on_pool(todo, tol, workers, collect)
    return _combine(out, items, arch, [t["label"] for t in todo], sorted(done), plots)


def _check_out(out: Path, spec: dict[str, Any]) -> None:
    p = out / "series.json"
    if p.is_file():
        try:
            old = json.loads(p.read_text())
        except (OSError, ValueError):
            old = {}
        if old.get("tol") != spec["tol"] or old.get("architecture") != spec["architecture"]:
            raise AttnRankError(f"{out} holds a series measured with other settings (tol {old.get('tol')}); "
                                "use the same --tol or another --out")
    elif out.is_dir() and any(out.iterdir()):
        raise AttnRankError(f"--out {out} is a non-empty directory that holds no series; choose another --out")


def _on_pool(todo: list[dict[str, Any]], tol: float, workers: int | None,
             collect: Callable[[str, pd.DataFrame], None]) -> None:
    n = workers or max(1, min(len(todo), os.cpu_count() or 1))
    if n == 1:
        for it in todo:
            collect(it["label"], analyse_checkpoint(it, tol))
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(analyse_checkpoint, it, tol): it for it in todo}
        for fut in as_completed(futures):
            collect(futures[fut]["label"], fut.result())


def _on_ray(todo: list[dict[str, Any]], tol: float, address: str,
            collect: Callable[[str, pd.DataFrame], None]) -> None:
    with ray_session(address) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(analyse_checkpoint)
        pending = {task.remote(it, tol): it for it in todo}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            it = pending.pop(ready[0])
            collect(it["label"], ray.get(ready[0]))


def summarize_series(table: pd.DataFrame) -> pd.DataFrame:
    """Per (checkpoint, step, layer, product): means over heads of numerical rank, effective
    rank, gap / bound (per head first) and relative balance."""
    t = table.assign(gap_rel=table["gap"] / table["frob_bound"].where(table["frob_bound"] > 0))
    g = t.groupby([*KEY, "layer", "product"], sort=False)
    out = g.agg(heads=("head", "size"), head_dim=("head_dim", "first"), rank=("rank", "mean"),
                effective_rank=("effective_rank", "mean"), gap_rel=("gap_rel", "mean"),
                balance_rel=("balance_rel", "mean"))
    return out.reset_index().sort_values(["step", "checkpoint", "layer", "product"], ignore_index=True)


def _combine(out: Path, items: list[SeriesItem], arch: dict[str, Any], computed: list[str],
             skipped: list[str], plots: bool) -> SeriesResult:
    frames = [pd.read_csv(out / "checkpoints" / f"{it.label}.csv") for it in items]
    table = pd.concat(frames, ignore_index=True)
    table["checkpoint"] = table["checkpoint"].astype(str)
    table = table.sort_values(["step", "checkpoint", "layer", "product", "head"], ignore_index=True)
    summary = summarize_series(table)
    files = [write_atomic(out / "table.csv", lambda p: table.to_csv(p, index=False)),
             write_atomic(out / "summary.csv", lambda p: summary.to_csv(p, index=False))]
    if plots:
        files.append(plot_series(summary, out / "over_training.png", title=_title(items, arch)))
    return SeriesResult(out=out, table=table, summary=summary, architecture=arch, computed=computed,
                        skipped=skipped, files=files)


def _title(items: list[SeriesItem], arch: dict[str, Any]) -> str:
    parent = Path(items[0].source).parent
    src = items[0].source if items[0].revision else str(parent.parent if parent.name == "checkpoints" else parent)
    return (f"{src}: {len(items)} checkpoints, {arch['model_type']} {arch['n_layers']} layers x "
            f"{arch['n_heads']} heads (dh {arch['head_dim']})")


PANELS = (("effective_rank", "effective rank"), ("rank", "numerical rank"), ("gap_rel", "gap / bound"),
          ("balance_rel", "balance (relative)"))


def plot_series(summary: pd.DataFrame, path: Path, title: str = "") -> Path:
    """Rows QK and OV, columns :data:`PANELS`; one thin line per layer (mean over its heads) and
    the mean over layers in black, against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted(summary["layer"].unique())
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(2, len(PANELS), figsize=(4 * len(PANELS), 6.4), squeeze=False, sharex=True)
    steps = summary["step"].to_numpy()
    wide = steps.max() > 100 * max(steps[steps > 0].min(), 1) if (steps > 0).any() else False
    for r, product in enumerate(("qk", "ov")):
        s = summary[summary["product"] == product]
        for c, (col, name) in enumerate(PANELS):
            ax = axes[r][c]
            for j, layer in enumerate(layers):
                d = s[s["layer"] == layer].sort_values("step")
                ax.plot(d["step"], d[col], color=cmap(j / max(len(layers) - 1, 1)), lw=1, alpha=0.8,
                        label=f"layer {layer}" if r == 0 and c == 0 else None)
            m = s.groupby("step")[col].mean()
            ax.plot(m.index, m.to_numpy(), color="black", lw=2, marker="o", ms=3,
                    label="mean" if r == 0 and c == 0 else None)
            ax.set_title(f"{product.upper()} {name}", fontsize=10)
            if wide:
                ax.set_xscale("symlog", linthresh=max(steps[steps > 0].min(), 1))
            if r == 1:
                ax.set_xlabel("step")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2 if len(layers) > 6 else 1)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    write_atomic(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    return path
