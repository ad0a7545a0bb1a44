"""Figure 1 + Proposition 3.1 of the paper: gradient descent on 5×5 factors (L2 on factors becomes
the nuclear norm on the product) and random balanced / unbalanced pairs.

params (:mod:`.params`) → experiment (:mod:`.experiment`, maths in :mod:`.gd`) → data → claims
(:mod:`.claims`) → figures (:mod:`.figures`).
"""

from __future__ import annotations

from typing import Any

from headrank.studies.fig1.claims import claims as judge
from headrank.studies.fig1.experiment import run
from headrank.studies.fig1.figures import figures as draw
from headrank.studies.fig1.params import Fig1Params
from headrank.studies.registry import CATALOGUE, Study, register_study

SOURCE = "Kobayashi et al. 2024, Fig. 1 and Prop. 3.1 (paper)"


def notes(data: dict[str, Any], params: Fig1Params) -> list[str]:
    """Prose for the report: what is our choice, and the caption's threshold case."""
    return [
        f"Step size eta = {params.eta:g}, {params.steps} steps and the initialisation (iid normal, std "
        f"{params.init_scale:g}, one draw shared by every lam) are our choices; the paper does not give them.",
        f"The caption's lam = {params.lam_traj:g} is exactly the threshold for d = {params.lam_traj / 2:g}, where the "
        "smallest singular value vanishes only like 1/(4 eta t); it is checked separately (fig1.threshold_algebraic).",
        (f"Local minima beyond the diagonal target (fig1.local_minima): targets (m, n, k, rank) "
         f"{[tuple(t) for t in params.minima_targets]} at spectral norm 1, seeds {list(params.minima_seeds)}, lam "
         f"{list(params.minima_lambdas)}, init std {list(params.minima_inits)}, step {params.minima_eta:g} for "
         f"{params.minima_steps} steps (our choices, fixed before the claim's first run)." if "minima" in data else
         "Local minima beyond the diagonal target (fig1.local_minima): not measured, this run was written before the "
         "claim existed; rerun without --replot to measure them."),
    ]


STUDY = register_study(Study(name="fig1", title=CATALOGUE["fig1"][1], source=SOURCE, params=Fig1Params, run=run,
                             claims=judge, figures=draw, notes=notes))

__all__ = ["STUDY", "Fig1Params", "draw", "judge", "notes", "run"]
