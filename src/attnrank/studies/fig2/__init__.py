"""Figure 2 of the paper, reproduced: a 2-layer transformer on associative recall, fully online,
AdamW with only the attention layers' decay λ varied (every other matrix keeps 0.1).

Four parts: :mod:`.params` (quick and full profiles), :mod:`.experiment` (the runs, the only
slow part), :mod:`.claims` (pure, from the stored data), :mod:`.figures`. Sizes are *our
choice* (the paper's are unknown): see :func:`.experiment.fig2_config`.
"""

from __future__ import annotations

from typing import Any

from attnrank.studies.fig2 import claims, experiment, figures
from attnrank.studies.fig2.params import Fig2Params
from attnrank.studies.registry import CATALOGUE, Study, register_study

SOURCE = "Kobayashi et al. 2024, Fig. 2 (seed 000); REFERENCE.md §3"


def notes(data: dict[str, Any], p: Fig2Params) -> list[str]:
    """Prose for the report."""
    return [
        "Sizes are our choice; the paper's are not available. Attention-only blocks: with MLPs (or init std "
        "0.02) the recall circuit did not form within 6,000 steps on this machine.",
        "Rank = numerical rank with relative threshold 1e-3; AdamW leaves small singular values at a noise "
        "floor rather than at exactly 0, so the effective rank is reported beside it.",
    ]


STUDY = register_study(Study(name="fig2", title=CATALOGUE["fig2"][1], source=SOURCE, params=Fig2Params,
                             run=experiment.run, claims=claims.claims, figures=figures.figures, notes=notes))
