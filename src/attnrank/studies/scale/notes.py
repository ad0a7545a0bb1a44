"""Prose for the scale report: the no-noise control (full profile)."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnrank.studies.scale.params import ScaleParams
from attnrank.studies.scale.summary import run_summary


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def notes(data: dict[str, Any], p: ScaleParams) -> list[str]:
    """What the runs without input noise show (when the profile trained them)."""
    clean = data.get("no_noise")
    if not clean:
        return []
    cs = run_summary(clean, p.tail)
    norm = np.asarray(clean["norm"], float)
    return ["Without input noise (variant none, same grid): clean training loss "
            + ", ".join(f"lam={r['lam']:g}: {_fmt(r['train_loss'])}" for r in cs)
            + "; angular update / prediction "
            + ", ".join(f"lam={r['lam']:g}: {_fmt(r['angle_ratio'])}" for r in cs if r["lam"] > 0)
            + "; smallest |W| during the run "
            + ", ".join(f"lam={lam:g}: {_fmt(float(norm[:, j].mean(1).min()))}" for j, lam in enumerate(clean["lams"]))
            + ". The net interpolates the training set and the gradient noise dies out, so the equilibrium "
              "the theory assumes does not form: decay shrinks W unopposed (where |W| gets small enough for "
              "the LayerNorm epsilon to matter, invariance fails and training can destabilise). That is why "
              "the main runs add input noise."]
