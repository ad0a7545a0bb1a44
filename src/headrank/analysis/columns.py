"""Tables as numpy columns (module ``columns``): written as CSV and averaged per group exactly as
pandas does, turned into a DataFrame only when asked.

``headrank spectra --out`` writes ``heads.csv``, ``summary.csv`` and ``rotary.csv`` through
this module without importing pandas: its import (with pyarrow) took 0.4–0.7 s of CPU, more
than a 7B layer's arithmetic (benchmarks/PROFILE.md). The bytes are pandas' own: floats as
numpy's shortest round-trip text (what ``DataFrame.to_csv`` writes), NaN as an empty field,
booleans as ``True``/``False``, quoting by the csv module as pandas sets it up; group means
and sums by pandas' compensated (Kahan) summation in row order. Tests hold both to pandas.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Columns = dict[str, np.ndarray]


def concat(frames: Sequence[dict[str, Any]], names: Sequence[str] | None = None) -> Columns:
    """Frames (dicts of equal-length columns; scalars broadcast) stacked into one set of columns,
    in ``names``' order (default: the order in which the frames name them; a column a frame lacks
    is NaN there), as ``pd.concat`` of their DataFrames would hold them."""
    if names is None:
        names = list(dict.fromkeys(k for f in frames for k in f))
    lengths = [max((np.ndim(v) and len(v)) for v in f.values()) for f in frames]
    out: Columns = {}
    for name in names:
        parts = [np.broadcast_to(np.asarray(f[name]) if name in f else np.float64("nan"), (n,))
                 for f, n in zip(frames, lengths, strict=True)]
        out[name] = np.concatenate(parts) if parts else np.empty(0)
    return out


def from_frame(frame: pd.DataFrame) -> Columns:
    """A DataFrame's columns as numpy arrays (text and nullable columns as object arrays, their
    missing values as None: an empty CSV field, as pandas writes them)."""
    out: Columns = {}
    for name in frame.columns:
        col = frame[name]
        if isinstance(col.dtype, np.dtype) and col.dtype != object:
            out[str(name)] = col.to_numpy()
        else:  # text, nullable integers, categories ...: their values, missing ones None
            out[str(name)] = col.to_numpy(dtype=object, na_value=None)
    return out


def to_frame(cols: Columns) -> pd.DataFrame:
    """The columns as a pandas DataFrame (pandas imported here, on first use)."""
    import pandas as pd

    return pd.DataFrame({k: v for k, v in cols.items()}, columns=list(cols))


def _cells(arr: np.ndarray) -> list:
    """One column's CSV fields as ``DataFrame.to_csv`` (quoting minimal, ``na_rep`` empty) makes them."""
    if arr.dtype == np.float64:  # Python's repr of a float64 is numpy's astype(str) text (7M values compared)
        cells = arr.tolist()  # ... and the csv module writes floats by repr: no string made here
        for i in np.flatnonzero(np.isnan(arr)).tolist():
            cells[i] = ""
        return cells
    if arr.dtype.kind == "f":
        text = arr.astype(str).astype(object)
        text[np.isnan(arr)] = ""
        return text.tolist()
    if arr.dtype.kind in "iub":
        return arr.tolist()
    return ["" if v is None else str(v) for v in arr.tolist()]


def write_csv(fh: IO[str], cols: Columns) -> None:
    """``cols`` as ``DataFrame.to_csv(fh, index=False)`` writes them, byte for byte."""
    w = csv.writer(fh, lineterminator="\n", delimiter=",", quotechar='"', quoting=csv.QUOTE_MINIMAL,
                   doublequote=True, escapechar=None)
    w.writerow(list(cols))
    if cols:
        w.writerows(zip(*(_cells(np.asarray(v)) for v in cols.values()), strict=True))


def save_csv(path: Any, cols: Columns) -> None:
    """:func:`write_csv` into the file ``path`` (a staged path of :func:`~headrank.util.fileio.write_atomic`)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        write_csv(fh, cols)


def _groups(keys: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct key tuples, sorted (``groupby(sort=True)``), and each row's group number."""
    n = len(keys[0])
    codes, uniques = [], []
    for k in keys:
        u, inv = np.unique(k, return_inverse=True)
        uniques.append(u)
        codes.append(inv.reshape(-1))
    flat = np.zeros(n, dtype=np.int64)
    for c, u in zip(codes, uniques, strict=True):
        flat = flat * len(u) + c
    used, label = np.unique(flat, return_inverse=True)
    out = []
    for u in reversed(uniques):
        out.append(u[used % len(u)])
        used = used // len(u)
    return out[::-1], label.reshape(-1)


def _kahan(values: np.ndarray, label: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the sum of the non-NaN ``values`` by pandas' compensated summation, row order
    kept (``group_sum`` / ``group_mean``), and the count of non-NaN values."""
    order = np.argsort(label, kind="stable")
    starts = np.searchsorted(label[order], np.arange(n_groups))
    rank = np.empty(len(label), dtype=np.int64)
    rank[order] = np.arange(len(label)) - starts[label[order]]  # a row's place in its group
    total, comp, nobs = np.zeros(n_groups), np.zeros(n_groups), np.zeros(n_groups, dtype=np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        for r in range(int(rank.max(initial=-1)) + 1):
            rows = np.flatnonzero(rank == r)
            val, g = values[rows], label[rows]
            ok = ~np.isnan(val)
            val, g = val[ok], g[ok]
            nobs[g] += 1
            y = val - comp[g]
            t = total[g] + y
            c = (t - total[g]) - y
            comp[g] = np.where(np.isnan(c), 0.0, c)  # an infinite value: no NaN compensation (pandas GH#50367)
            total[g] = t
    return total, nobs


def group_agg(cols: Columns, keys: Sequence[str], aggs: Iterable[tuple[str, str, str]]) -> Columns:
    """``groupby(keys, sort=True).agg(**{out: (col, how)}).reset_index()`` for ``how`` in
    ``size``, ``mean``, ``sum``, as pandas computes them (float64 means and sums)."""
    key_vals, label = _groups([np.asarray(cols[k]) for k in keys])
    n = len(key_vals[0])
    out: Columns = dict(zip(keys, key_vals, strict=True))
    for name, col, how in aggs:
        if how == "size":
            out[name] = np.bincount(label, minlength=n).astype(np.int64)
            continue
        total, nobs = _kahan(np.asarray(cols[col], dtype=np.float64), label, n)
        if how == "sum":
            out[name] = total
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                out[name] = np.where(nobs > 0, total / np.maximum(nobs, 1), np.nan)
    return out


def series_mean(values: np.ndarray) -> float:
    """``Series.mean()`` of float64 values as pandas computes it without bottleneck (NaN skipped:
    numpy's sum of the rest over their count)."""
    v = np.asarray(values, dtype=np.float64)
    mask = np.isnan(v)
    count = v.size - int(mask.sum())
    if count == 0:
        return float("nan")
    return float(np.where(mask, 0.0, v).sum() / count) if mask.any() else float(v.sum() / count)


def energy_levels_of(spec: Any) -> tuple[float, ...] | None:
    """``spectra --energy`` (``"0.9,0.99,0.999"`` or numbers) as levels, checked before any reading."""
    if spec is None:
        return None
    from headrank.core.metrics import energy_levels
    from headrank.errors import HeadRankError

    try:
        return energy_levels(spec)
    except ValueError as e:
        raise HeadRankError(f"`energy`: {e}") from None


def energy_frames(frames: list[dict[str, Any]], sv: dict[str, list[np.ndarray]], levels: Any) -> dict[str, str]:
    """``spectra --energy``: each frame (one layer's rows of one product) gets the energy ranks of its
    singular values at the ``levels`` that the metric table lacks; returns {column: definition}."""
    if levels is None:
        return {}
    from headrank.core.metrics import METRIC_COLUMNS, energy_columns, energy_name

    per_product = {p: iter(v) for p, v in sv.items()}  # each product's layers, in the frames' order
    for f in frames:
        f.update(energy_columns(next(per_product[f["product"]]), levels))
    return {energy_name(v): f"energy rank: fewest sigma_i holding {v * 100:g}% of sum sigma^2" for v in levels
            if energy_name(v) not in METRIC_COLUMNS}
