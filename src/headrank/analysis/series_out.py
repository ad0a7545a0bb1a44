"""What a series directory ``OUT`` of :func:`headrank.analysis.series.track` holds while a run
goes on, and how a new run is checked against it.

- ``OUT/started.json`` (:data:`PLAN`): written before the first checkpoint is measured: the
  request (the series as resolved paths or a Hub id, ``revisions``, ``remote``, ``tol``,
  ``metrics``), the architecture, and every checkpoint with its identity and (remote) the commit
  its architecture check read. ``resume`` continues the run it describes: the same checkpoints at
  the same commits, those already measured left alone.
- ``OUT/table.partial.csv`` (:data:`PARTIAL`): every checkpoint's rows appended as it finishes
  (besides its own ``checkpoints/LABEL.csv``), so a stopped run keeps a table of what it had;
  removed once ``table.csv`` and the rest of the set move in.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headrank.errors import HeadRankError
from headrank.util.fileio import write_error, write_json
from headrank.util.legacy import upgrade

PLAN = "started.json"
PARTIAL = "table.partial.csv"


def request(series: Any, revisions: str | Sequence[str] | None, remote: bool, tol: float,
            metrics: bool) -> dict[str, Any]:
    """What a ``track`` call asks for, in a form two calls can be compared by: local paths
    resolved (another working directory, or ``~``, names the same checkpoints), revisions as a
    list (``"all"`` as it is)."""
    paths = [series] if isinstance(series, (str, os.PathLike)) else list(series)

    def where(p: Any) -> str:
        q = Path(os.path.expanduser(str(p)))
        return str(q.resolve()) if q.exists() else str(p)

    revs: Any = revisions
    if isinstance(revisions, str) and revisions.strip() != "all":
        revs = [r.strip() for r in revisions.split(",") if r.strip()]
    elif revisions is not None and not isinstance(revisions, str):
        revs = [str(r).strip() for r in revisions if str(r).strip()]
    return {"series": [where(p) for p in paths], "revisions": revs, "remote": bool(remote), "tol": tol,
            "metrics": bool(metrics)}


def write_plan(out: Path, asked: dict[str, Any], spec: dict[str, Any]) -> None:
    """``OUT/started.json``: the request and the series about to be measured (``spec``)."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        write_json(out / PLAN, {"kind": "headrank-series-run", "request": asked, "architecture": spec["architecture"],
                                "tol": spec["tol"], "items": spec["items"]})
    except OSError as e:
        raise write_error(e, out / PLAN) from None


def read_plan(out: Path, asked: dict[str, Any]) -> dict[str, Any]:
    """The run ``resume`` continues: ``OUT/started.json``, made by the same request; one line
    when there is none or when the request differs (another series, revisions, tolerance ...)."""
    p = out / PLAN
    from headrank.io.validate import read_json

    if not p.exists() and not p.is_symlink():
        raise HeadRankError(f"`resume`: {out} holds no track run to continue (no {PLAN}); run without `resume`")
    try:
        plan = upgrade(read_json(p, "track record"))  # a FIFO or a 500 MB file: one line, not a hang
    except HeadRankError as e:
        raise HeadRankError(f"`resume`: {e}; run without `resume` and with `force` to measure anew") from None
    old = plan.get("request") if isinstance(plan, dict) else None
    if not isinstance(old, dict) or not isinstance(plan.get("items"), list):
        raise HeadRankError(f"`resume`: {p} is not a track run's record; run without `resume` and with `force`")
    differ = [k for k in asked if old.get(k) != asked[k]]
    if differ:
        k = differ[0]
        raise HeadRankError(f"`resume`: {out} was started with other settings (`{k}` {_show(old.get(k))} there, "
                            f"{_show(asked[k])} here); run the command that started it, or drop `resume`")
    return plan


def _show(v: Any) -> str:
    s = ",".join(map(str, v)) if isinstance(v, list) else str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def changed(plan: dict[str, Any], arch: dict[str, Any], ids: dict[str, str]) -> None:
    """Refuse to continue a run whose checkpoints changed since it started: another architecture,
    or a checkpoint whose files (sizes, times) or commit are not those it started from."""
    if arch != plan.get("architecture"):
        raise HeadRankError(f"`resume`: the checkpoints are of another architecture than when the run started "
                            f"({arch} now, {plan.get('architecture')} then); run without `resume` and with `force`")
    for it in plan["items"]:
        if it.get("label") in ids and ids[it["label"]] != it.get("identity"):
            raise HeadRankError(f"`resume`: checkpoint {it['label']} ({it.get('source')}) changed since the run "
                                "started; run without `resume` and with `force` to measure it anew")


def append_rows(out: Path, table: pd.DataFrame) -> None:
    """One finished checkpoint's rows appended to ``OUT/table.partial.csv`` (its header first)."""
    from headrank.io.writer import append_no_follow

    p = out / PARTIAL
    try:
        new = not p.exists() or p.lstat().st_size == 0
    except OSError as e:
        raise write_error(e, p) from None
    append_no_follow(p, table.to_csv(index=False, header=new))  # a symlink there is refused, never followed


def check_out(out: Path, spec: dict[str, Any], force: bool = False, resume: bool = False) -> None:
    """Refuse an ``out`` that holds a series of other checkpoints, another architecture or another
    tolerance (unless ``force``), a run that stopped before it finished (unless ``resume`` or
    ``force``), and a non-empty directory that holds no series."""
    p = out / "series.json"
    if p.is_file():
        if not force:
            _same_series(out, p, spec)
    elif (out / PLAN).is_file():
        if not (force or resume):
            done = len(list((out / "checkpoints").glob("*.csv"))) if (out / "checkpoints").is_dir() else 0
            raise HeadRankError(f"{out} holds a track run that stopped before it finished ({done} checkpoints "
                                "measured): pass `resume` to continue it, or `force` to measure anew")
    elif out.is_dir() and any(out.iterdir()):
        raise HeadRankError(f"`out` {out} is a non-empty directory that holds no series; choose another `out`")


def _same_series(out: Path, p: Path, spec: dict[str, Any]) -> None:
    from headrank.io.validate import read_json

    try:
        old = read_json(p, "track record")
    except HeadRankError:
        old = {}
    old = upgrade(old) if isinstance(old, dict) else {}
    if old.get("tol") != spec["tol"]:
        raise HeadRankError(f"{out} holds a series measured with other settings (tol {old.get('tol')}); "
                            "use the same `tol`, `force` to measure anew, or another `out`")
    if old.get("convention", "raw") != spec.get("convention", "raw"):
        raise HeadRankError(f"{out} holds a series read in the {old.get('convention', 'raw')} convention; use the same "
                            "`convention`, `force` to measure anew, or another `out`")
    if old.get("architecture") != spec["architecture"]:
        raise HeadRankError(f"{out} holds a series of another architecture ({old.get('architecture')}); "
                            "use `force` to measure anew, or another `out`")
    olds = {it.get("label"): it for it in old.get("items", []) if isinstance(it, dict)}
    common = [it for it in spec["items"] if it["label"] in olds]
    for it in common:
        o = olds[it["label"]]
        if not _same_item(o, it):
            raise HeadRankError(f"{out} was made from other checkpoints ({it['label']}: {o.get('source')} there, "
                                f"{it['source']} here, or changed since); pass `force` to measure this series "
                                "into it anew, or choose another `out`")
    if olds and not common:
        src = next(iter(olds.values())).get("source")
        raise HeadRankError(f"{out} was made from other checkpoints ({src}, none of them in this series); "
                            "pass `force` to measure this series into it anew, or choose another `out`")


def _same_item(old: dict[str, Any], new: dict[str, Any]) -> bool:
    if old.get("identity") is not None:
        return old["identity"] == new["identity"]
    try:  # a series.json written before identities were recorded: compare where it came from
        return (Path(str(old.get("source"))).resolve() == Path(new["source"]).resolve()
                and old.get("revision") == new["revision"])
    except (OSError, RuntimeError):
        return False
