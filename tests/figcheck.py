"""Reading a drawn matplotlib figure back: what each artist holds, as float arrays, so figure
tests can compare the drawn numbers with the data they were drawn from."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from numpy.testing import assert_allclose  # noqa: E402


def data_lines(ax) -> list:
    """The lines drawn in data coordinates (``plot``, ``semilogy``), in drawing order; reference
    lines (``axhline``, ``axvline``) are left out."""
    return [ln for ln in ax.lines if ln.get_transform() is ax.transData]


def ref_lines(ax, axis: str = "y") -> list[float]:
    """The positions of the horizontal (``axis="y"``) or vertical (``"x"``) reference lines."""
    out = []
    for ln in ax.lines:
        if ln.get_transform() is ax.transData:
            continue
        x, y = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
        if axis == "y" and y[0] == y[-1] and list(x) == [0.0, 1.0]:
            out.append(float(y[0]))
        elif axis == "x" and x[0] == x[-1] and list(y) == [0.0, 1.0]:
            out.append(float(x[0]))
    return out


def xy(line) -> tuple[np.ndarray, np.ndarray]:
    """A line's x and y as float arrays (None becomes NaN, as matplotlib draws it)."""
    return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)


def offsets(coll) -> np.ndarray:
    """A scatter's points, (n, 2) floats; masked (non-finite) coordinates become NaN."""
    return np.ma.filled(np.ma.asarray(coll.get_offsets(), dtype=float), np.nan)


def scatters(ax) -> list:
    """The point collections (``scatter``) of ``ax``, in drawing order."""
    from matplotlib.collections import PathCollection

    return [c for c in ax.collections if isinstance(c, PathCollection)]


def assert_line(line, x, y, **kw) -> None:
    """``line`` draws exactly (x, y), NaN where y is NaN (never 0)."""
    gx, gy = xy(line)
    assert_allclose(gx, np.asarray(x, float), **kw)
    assert_allclose(gy, np.asarray(y, float), equal_nan=True, **kw)


def assert_points(coll, x, y, **kw) -> None:
    """The scatter ``coll`` draws exactly the points (x, y); a point with a NaN coordinate is
    not drawn (matplotlib masks the whole point)."""
    got = offsets(coll)
    want = np.column_stack([np.asarray(x, float).ravel(), np.asarray(y, float).ravel()])
    want[~np.isfinite(want).all(1)] = np.nan
    assert got.shape == want.shape, (got.shape, want.shape)
    assert_allclose(got, want, equal_nan=True, **kw)


def errorbar_parts(container) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, half-width of the error bar) of an ``ErrorbarContainer`` with y error bars."""
    x, y = xy(container.lines[0])
    segs = container.lines[2][0].get_segments()
    half = np.array([(s[1][1] - s[0][1]) / 2 for s in segs], dtype=float)
    return x, y, half


def without_layout(monkeypatch) -> None:
    """Skip ``Figure.tight_layout`` (it measures every label by rendering it, most of a figure
    test's time); the artists and their data do not depend on it."""
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "tight_layout", lambda self, *a, **k: None)
