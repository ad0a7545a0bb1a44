"""The spectra figures' data, and a separate process that draws them (module ``figproc``).

``headrank spectra --out`` starts :class:`FigureProcess` before it reads the checkpoint: the
child imports matplotlib on the other core while the parent computes, waits, then draws from
:func:`figure_data` (plain numpy arrays, sent through its stdin as an ``.npz``: no pickle) while
the parent writes the tables, half of the figures in a forked copy of itself. The parent waits for it before the output set is moved in, so a
finished command has every file. Should the child fail, the parent draws in-process instead.

This module imports neither torch nor matplotlib (the child imports
:mod:`headrank.analysis.plots` itself).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

from headrank.util.threads import count_as_own

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

    t = result._columns("table")  # numpy columns (no pandas for a fresh analysis)
    layers = np.asarray(result.meta["layers"])
    name = display_name(result.meta)
    if result.meta.get("attention") is not None:  # an encoder-decoder: its kinds' layers in turn, numbered 0..
        t, layers, name = {**t, "layer": np.asarray(unit_positions(t, result.meta))}, np.arange(len(layers)), \
            f"{name} ({kinds_span(result.meta)})"
    conv = result.meta.get("conventions", {})
    if conv.get("convention", "raw") != "raw":  # the weights' convention travels with the numbers (titles)
        name = f"{name}, {conv['convention']} convention"
    elif str(conv.get("weights", "")).startswith("norm folded"):
        name = f"{name}, norm folded"
    data: dict[str, Any] = {
        "layers": layers,
        "name": name,
        "tol": float(result.meta["tolerance"]),
        "head_dim": int(result.meta["config"]["head_dim"]),
    }
    for product in ("qk", "ov"):
        data[f"sv_{product}"] = np.asarray(result.sv[product], dtype=np.float64)
        rows = np.asarray(t["product"]) == product
        heads = np.unique(t["head"][rows])
        at = {int(la): i for i, la in enumerate(layers)}
        r = np.array([at.get(int(la), -1) for la in t["layer"][rows]], dtype=np.int64)
        c = np.searchsorted(heads, t["head"][rows])
        keep = r >= 0  # (layer, head) grids of the selected layers, NaN where a head has no row
        for col in FIGURE_COLUMNS:
            if col in t:
                grid = np.full((len(layers), len(heads)), np.nan)
                grid[r[keep], c[keep]] = np.asarray(t[col][rows], dtype=np.float64)[keep]
                data[f"{product}_{col}"] = grid
    for k, v in result.row_norms.items():
        data[f"rows_{k}"] = np.asarray(v, dtype=np.float64)[:, 0, :]  # head 0 of each layer
    cfg = result.meta.get("config", {})
    if result.meta.get("attention") is None and result.meta.get("layout", {}).get("split") != "mla" and cfg:
        from headrank.core.baseline import (
            random_singular_values,  # the random product of the same shapes
        )

        sv = random_singular_values(int(cfg["d_model"]), int(cfg["d_model"]), int(cfg["head_dim"]))
        data["random_sv"] = (sv / sv[:, :1]).mean(0)
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
        env["OPENBLAS_NUM_THREADS"] = env["OMP_NUM_THREADS"] = "1"  # no BLAS threads: it draws, and forks (_draw_in_two)
        try:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "headrank.analysis.figproc"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                start_new_session=hasattr(os, "killpg"))  # a group of its own: _stop ends its fork too
        except OSError:
            self.proc = None  # draw in-process
        if self.proc is not None:  # its matplotlib import is this run's work, not another process's load
            count_as_own(self.proc.pid)
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
        code = proc.wait()
        count_as_own(proc.pid, False)
        if code != 0 or not out.strip():
            return None  # a failure in the child is drawn (and reported) here instead
        return [Path(p) for p in json.loads(out.decode().strip().splitlines()[-1])]

    def close(self) -> None:
        """Stop the child (nothing to draw, or the parent failed)."""
        _stop(self.proc)
        self.proc = None


_EARLY: list[FigureProcess] = []  # started by the CLI before it parsed its options (headrank.cli.early)


def start_early() -> None:
    """Start a :class:`FigureProcess` for the command about to run (:func:`take_early`)."""
    _EARLY.append(FigureProcess())


def take_early() -> FigureProcess | None:
    """The figure process :func:`start_early` started, if any (then no longer held here)."""
    return _EARLY.pop() if _EARLY else None


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        count_as_own(proc.pid, False)
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and the fork drawing the other half
        except (AttributeError, OSError):
            proc.kill()
        proc.wait()
    if proc is not None:
        for f in (proc.stdin, proc.stdout):
            if f is not None and not f.closed:
                f.close()


def _serve() -> int:
    import numpy as np

    from headrank.analysis import plots  # matplotlib: imported while the parent computes

    head = sys.stdin.buffer.readline()
    if not head:  # the parent went away or drew nothing
        return 0
    req = json.loads(head)
    raw = sys.stdin.buffer.read(int(req["bytes"]))
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    data["name"] = str(data["name"])
    written = _draw_in_two(plots, data, Path(req["out"]))
    sys.stdout.write(json.dumps(written) + "\n")
    return 0


def _draw(plots, data: dict[str, Any], out: Path, figures, tokens: int | None = None) -> dict[str, str | None]:
    """``plots.draw_spectra`` for its figures: name → path of each one drawn (None: left out).
    With ``tokens`` (the read end of a pipe holding one byte per figure index, shared with a
    fork), only the figures whose byte this process reads: two processes share the figures as
    each becomes free (a one-byte read is atomic between them)."""
    order = range(len(figures)) if tokens is None else (b[0] for b in iter(lambda: os.read(tokens, 1), b""))
    done: dict[str, str | None] = {}
    for index in order:
        name, make = figures[index]
        fig = make(data)
        done[name] = None if fig is None else str(plots.save_figure(fig, out / name, dpi=plots.SPECTRA_DPI,
                                                                        tight=False))
    return done


def _draw_in_two(plots, data: dict[str, Any], out: Path) -> list[str]:
    """The spectra figures (``plots.draw_spectra``), shared with a forked copy of this process:
    drawing them is the tail of a ``headrank spectra --out`` run (0.5–0.9 s of CPU, once the
    tables exist), and matplotlib, already imported, comes with the fork at no cost. Each of
    the two takes the next figure not yet taken (a byte from a shared pipe), so neither waits
    on a split fixed in advance. This process has no threads (``OPENBLAS_NUM_THREADS=1``), so
    forking it is safe. The paths in ``plots.SPECTRA_FIGURES`` order; an error in either half
    fails the whole (the parent then draws in-process)."""
    figures = list(plots.SPECTRA_FIGURES)
    if not hasattr(os, "fork") or len(figures) < 2:
        done = _draw(plots, data, out, figures)
        return [p for n, _ in figures if (p := done.get(n))]
    tokens, fill = os.pipe()
    os.write(fill, bytes(range(len(figures))))  # the costliest first: SPECTRA_FIGURES' order
    os.close(fill)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked half (its outcome is checked by the parent)
        code = 1
        try:
            os.close(r)
            with os.fdopen(w, "w") as fh:
                fh.write(json.dumps(_draw(plots, data, out, figures, tokens)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    try:
        done = _draw(plots, data, out, figures, tokens)
    finally:
        os.close(tokens)
        with os.fdopen(r) as fh:
            other = fh.read()
        status = os.waitpid(pid, 0)[1]
    if status != 0:
        raise RuntimeError("the second figure process failed")
    done.update(json.loads(other))
    return [p for n, _ in figures if (p := done.get(n))]


if __name__ == "__main__":
    sys.exit(_serve())
