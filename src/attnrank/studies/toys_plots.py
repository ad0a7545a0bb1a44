"""Shared plotting helper of the studies: the λ colour ramp (the fig1/fig5 figures moved into
:mod:`attnrank.studies.fig1.figures` and :mod:`attnrank.studies.fig5.figures`)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _lam_colors(n: int) -> list:
    """``n`` colours along viridis (0 to 0.9), one per λ; at least two."""
    cmap = plt.get_cmap("viridis")
    return [cmap(x) for x in np.linspace(0.0, 0.9, max(n, 2))]
