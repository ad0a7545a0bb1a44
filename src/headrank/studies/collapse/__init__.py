"""Reproduction 'collapse': the second document's rank-collapse claims (Dong, Cordonnier, Loukas
2021; docs/METHODS.md).

params (:mod:`.params`) → experiment (:mod:`.experiment`: surgery on MiniLM, depth sweep,
path-restricted model, path enumeration) → data → claims (:mod:`.claims`) → figures
(:mod:`.figures`).
"""

from __future__ import annotations

from typing import Any

from headrank.studies.collapse.claims import claims
from headrank.studies.collapse.experiment import run
from headrank.studies.collapse.figures import figures
from headrank.studies.collapse.params import CollapseParams
from headrank.studies.registry import CATALOGUE, Study, register_study

SOURCE = "Dong, Cordonnier, Loukas 2021 (an article on it)"


def notes(data: dict[str, Any], params: CollapseParams) -> list[str]:
    """Prose for the report: how surgery treats norms, and which settings are our choices (for
    a run written before the exact residuals, the head-count sweep and the ensembles: that)."""
    older = "ensembles" not in data or "heads_sweep" not in data
    return _older_notes() if older else _notes(params)


def _older_notes() -> list[str]:
    return [
        "Surgery keeps each sublayer's own LayerNorm: BERT's attention sublayer becomes LN(attn(x)) without the skip; "
        "removing the MLP removes its sublayer with its LayerNorm.",
        "This run was written by an older headrank, before the exact residuals past the float64 floor, the head-count "
        "sweep, the MLP dose-response and the trained-network ensembles: its depth curves are the float64 forward's, "
        "and the claims that need the new data are inconclusive, each saying so. Rerun without --replot to measure "
        "them.",
    ]


def _notes(params: CollapseParams) -> list[str]:
    return [
        "Surgery keeps each sublayer's own LayerNorm: BERT's attention sublayer becomes LN(attn(x)) without the skip; "
        "removing the MLP removes its sublayer with its LayerNorm. LayerNorm acts per token and keeps a collapsed "
        "(identical-rows) matrix collapsed.",
        "Random init: the architecture's own initialiser (std 0.02) with torch seed 0; attention is then nearly "
        "uniform, so pure attention collapses within 2-3 layers to the float64 floor, too fast to fit a depth law.",
        "The depth sweep computes the residual of its pure self-attention networks exactly past the float64 floor "
        "(the residual carried through the layers in the log domain; headrank.analysis.collapse.exact, checked "
        "against mpmath), so curves that collapse within 2-3 layers are measured to depth "
        f"{params.sweep_depth}; its init scales (0.02-0.5) and head counts ({', '.join(map(str, params.heads_sweep))} "
        "at a fixed width) are our choice.",
        f"The ensemble measures decompose trained networks: the project's recall model trained {params.recall_steps} "
        f"steps per seed ({len(params.recall_seeds)} seed(s)) by headrank.training in a temporary directory, and "
        f"{params.model}'s attention + skip variant.",
        f"Runs use {params.threads} torch thread(s) (faster for these small models on a shared CPU).",
        "The stated bound's gamma is not defined in any text we could read (the article: 'constants that depend on "
        "the attention mechanism and weights'); beta is computed from the real weights and the bound claim reports "
        "the log10 gamma at which the inequality turns and at which it becomes vacuous.",
    ]


STUDY = register_study(Study(name="collapse", title=CATALOGUE["collapse"][1], source=SOURCE, params=CollapseParams,
                             run=run, claims=claims, figures=figures, notes=notes))

__all__ = ["STUDY", "CollapseParams", "claims", "figures", "notes", "run"]
