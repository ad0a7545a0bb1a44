"""Prose for the scale report: what SGD reached against λ (the article leaves it open), and the
no-noise control (full profile)."""

from __future__ import annotations

from typing import Any

import numpy as np

from headrank.studies.registry import g3
from headrank.studies.scale.params import ScaleParams
from headrank.studies.scale.summary import run_summary, summaries


def reached(data: dict[str, Any], p: ScaleParams) -> str:
    """Final clean training loss and test accuracy against λ, per variant: descriptive only."""
    from headrank.studies.scale.claims import by_lam

    summ = summaries(data, p.tail)
    parts = []
    for v, rows in summ.items():
        tl, acc = by_lam(rows, "train_loss"), by_lam(rows, "test_acc")
        parts.append(f"{v}: " + ", ".join(f"lam={lam:g}: loss {g3(tl[lam])}, acc {g3(acc[lam])}" for lam in tl))
    return ("What SGD reached (not judged: the article claims only that the optimum does not move with lam and "
            "leaves open what gradient descent finds). Clean training loss and test accuracy, tail means over "
            "seeds: " + "; ".join(parts) + ". Larger lam raises the effective learning rate eta/|W|^2 of the "
            "invariant W, so SGD settles at a noisier point even where the optimum is unchanged.")


def notes(data: dict[str, Any], p: ScaleParams) -> list[str]:
    """What SGD reached against λ, and what the runs without input noise show (when trained)."""
    out = [reached(data, p)]
    clean = data.get("no_noise")
    if not clean:
        return out
    cs = run_summary(clean, p.tail)
    norm = np.asarray(clean["norm"], float)
    return out + ["Without input noise (variant none, same grid): clean training loss "
            + ", ".join(f"lam={r['lam']:g}: {g3(r['train_loss'])}" for r in cs)
            + "; angular update / prediction "
            + ", ".join(f"lam={r['lam']:g}: {g3(r['angle_ratio'])}" for r in cs if r["lam"] > 0)
            + "; smallest |W| during the run "
            + ", ".join(f"lam={lam:g}: {g3(float(norm[:, j].mean(1).min()))}" for j, lam in enumerate(clean["lams"]))
            + ". The net interpolates the training set and the gradient noise dies out, so the equilibrium "
              "the theory assumes does not form: decay shrinks W unopposed (where |W| gets small enough for "
              "the LayerNorm epsilon to matter, invariance fails and training can destabilise). That is why "
              "the main runs add input noise."]
