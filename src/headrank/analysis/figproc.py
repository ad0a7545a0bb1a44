"""The spectra figures' data, and a separate process that draws them (module ``figproc``).

``headrank spectra --out`` starts :class:`FigureProcess` before it imports torch: the child
imports matplotlib on the other core while the parent imports torch, waits, then draws from
:func:`figure_data` (plain numpy arrays, sent through its stdin as an ``.npz``: no pickle) while
the parent writes the tables. The parent waits for it before the output set is moved in, so a
finished command has every file. Should the child fail, the parent draws in-process instead.

This module imports neither torch nor matplotlib (the child imports
:mod:`headrank.analysis.plots` itself).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

# per-head columns the figures read, (layers, heads) grids per product
FIGURE_COLUMNS = ("nuclear", "frob_bound", "effective_rank", "k90", "rank", "finite")


def display_name(meta: dict[str, Any]) -> str:
    """A short name for titles: the Hub id as given, else the last part of the path (with its
    parent for a ``checkpoint-N`` / ``step-N`` directory), never an absolute path."""
    src = str(meta.get("source", ""))
    if meta.get("input") in ("hub", "shipped", "remote", "live", "state_dict") or not src:
        return src or str(meta.get("model_type", "model"))
    parts = Path(src).parts
    if len(parts) >= 2 and parts[-1].startswith(("checkpoint", "step")):
        return "/".join(parts[-2:])
    return parts[-1] if parts else src


def figure_data(result) -> dict[str, Any]:
    """Everything the spectra figures draw, as numpy arrays (``result``: a SpectraResult)."""
    import numpy as np

    t = result.table
    layers = np.asarray(result.meta["layers"])
    name = display_name(result.meta)
    if result.meta.get("attention") is not None:  # an encoder-decoder: its kinds' layers in turn, numbered 0..
        t, layers, name = t.assign(layer=unit_positions(t, result.meta)), np.arange(len(layers)), \
            f"{name} ({kinds_span(result.meta)})"
    data: dict[str, Any] = {
        "layers": layers,
        "name": name,
        "tol": float(result.meta["tolerance"]),
        "head_dim": int(result.meta["config"]["head_dim"]),
    }
    for product in ("qk", "ov"):
        data[f"sv_{product}"] = np.asarray(result.sv[product], dtype=np.float64)
        rows = t[t["product"] == product]
        for col in FIGURE_COLUMNS:
            if col in rows.columns:
                grid = rows.pivot(index="layer", columns="head", values=col).reindex(layers)
                data[f"{product}_{col}"] = grid.to_numpy(dtype=np.float64)
    for k, v in result.row_norms.items():
        data[f"rows_{k}"] = np.asarray(v, dtype=np.float64)[:, 0, :]  # head 0 of each layer
    return data


def unit_positions(table: Any, meta: dict[str, Any]) -> Any:
    """An encoder-decoder's rows: each row's position in ``meta["attention"]`` / ``meta["layers"]``
    (its kinds' layers in turn: encoder, decoder, cross), for figures with one axis of layers."""
    pos = {u: j for j, u in enumerate(zip(meta["attention"], meta["layers"], strict=True))}
    return [pos[(a, int(i))] for a, i in zip(table["attention"], table["layer"], strict=True)]


def kinds_span(meta: dict[str, Any]) -> str:
    """Where each kind of an encoder-decoder's attention lies on such an axis, e.g.
    ``encoder 0-5, decoder 6-11, cross 12-17``."""
    spans: dict[str, list[int]] = {}
    for j, a in enumerate(meta["attention"]):
        spans.setdefault(a, []).append(j)
    return ", ".join(f"{a} {v[0]}-{v[-1]}" if len(v) > 1 else f"{a} {v[0]}" for a, v in spans.items())


def _package_root() -> str:
    """The directory holding the ``headrank`` package this module was loaded from."""
    return str(Path(__file__).resolve().parents[2])


class FigureProcess:
    """A child process that imports matplotlib now and draws the spectra figures when asked."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
        env.setdefault("MPLBACKEND", "Agg")
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "headrank.analysis.figproc"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        except OSError:
            self.proc = None  # draw in-process
        # the parent failed or returned early: stop the child with it
        weakref.finalize(self, _stop, self.proc)

    def submit(self, data: dict[str, Any], out: str | os.PathLike) -> bool:
        """Send the figure data; False if the child is gone (the caller then draws itself)."""
        import numpy as np

        if self.proc is None:
            return False
        buf = io.BytesIO()
        np.savez(buf, **data)
        payload = buf.getvalue()
        head = json.dumps({"out": str(Path(out).resolve()), "bytes": len(payload)}).encode() + b"\n"
        try:
            self.proc.stdin.write(head + payload)
            self.proc.stdin.close()
        except OSError:
            self.close()
            return False
        return True

    def wait(self) -> list[Path] | None:
        """The figures the child wrote, or None if it failed (then nothing it wrote is kept)."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        with proc.stdout:
            out = proc.stdout.read()
        if proc.wait() != 0 or not out.strip():
            return None  # a failure in the child is drawn (and reported) here instead
        return [Path(p) for p in json.loads(out.decode().strip().splitlines()[-1])]

    def close(self) -> None:
        """Stop the child (nothing to draw, or the parent failed)."""
        _stop(self.proc)
        self.proc = None


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc is not None:
        for f in (proc.stdin, proc.stdout):
            if f is not None and not f.closed:
                f.close()


def _serve() -> int:
    import numpy as np

    from headrank.analysis import plots  # matplotlib: imported while the parent imports torch

    head = sys.stdin.buffer.readline()
    if not head:  # the parent went away or drew nothing
        return 0
    req = json.loads(head)
    raw = sys.stdin.buffer.read(int(req["bytes"]))
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    data["name"] = str(data["name"])
    written = plots.draw_spectra(data, req["out"])
    sys.stdout.write(json.dumps([str(p) for p in written]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
