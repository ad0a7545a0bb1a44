"""Figure 5 of the paper: a 2-D toy, AdamW against Adam + L2 (λ_L2 = λ_wd·ε), on w directly (the
L2 optimum) and on factors w = a·b (the L1 optimum, sparse).

params (:mod:`.params`) → experiment (:mod:`.experiment`; maths in :mod:`.geometry` and
:mod:`.adam`) → data → claims (:mod:`.claims`) → figures (:mod:`.figures`).
"""

from __future__ import annotations

from typing import Any

from headrank.studies.fig5.claims import claims as judge
from headrank.studies.fig5.experiment import run
from headrank.studies.fig5.figures import figures as draw
from headrank.studies.fig5.params import Fig5Params
from headrank.studies.registry import CATALOGUE, Study, register_study

SOURCE = "Kobayashi et al. 2024, Fig. 5 (paper)"


def notes(data: dict[str, Any], params: Fig5Params) -> list[str]:
    """Prose for the report: what is our choice, and how Adam is computed."""
    return [
        "The curve S, the start points, lr, steps, eps and lam_wd are our choices; the paper does not give them. "
        "eps is far larger than the usual 1e-8: with eps = 1e-8 the conjectured lam_L2 = 1e-9 would need ~1e9 steps "
        "to act, and Adam does not settle (see fig5.eps_sweep).",
        "Adam/AdamW are re-implemented in numpy, batched over configurations; tests check them step for step "
        "against torch.optim in float64.",
    ]


STUDY = register_study(Study(name="fig5", title=CATALOGUE["fig5"][1], source=SOURCE, params=Fig5Params, run=run,
                             claims=judge, figures=draw, notes=notes))

__all__ = ["STUDY", "Fig5Params", "draw", "judge", "notes", "run"]
