"""Run designs that can decide the open LM and recall sentences (docs/paper_regime.md, "Designs"),
fixed in docs/preregistration.json before they run:

- (a) ``decouple_best``: decoupling, best against best, where decay helps (the decouple study's
  LM on 20,000 characters per split, 600 steps): the coupled family (attention λ = other λ over
  :attr:`DesignsParams.a_coupled_exposures`) against the decoupled family (attention ×
  other exposures), the best of each chosen on mean *validation* perplexity, judged on *test*
  perplexity paired by seed against ``table1.MARGIN_PPL``;
- (b) ``online_rank``: an attention task that needs high-rank attention (associative recall with
  32 keys and 32 values through 16-dimensional heads) on fresh batches every step (fully online),
  attention λ ∈ {0, 0.1} at exposure ≥ 8, effective rank of layer 1's P W_V, three-way against
  ``fig2.MARGIN_RANK``;
- (c) ``exposure_invariance`` (our check of the regime's assumption): (lr, λ) pairs with one
  exposure, each against λ = 0 at its own lr; the rank drops of the first and last pair
  equivalent within the same margin.

≥ 8 paired seeds each; resumable (the runs live in ``runs_dir``: a re-run skips finished runs
and resumes the others from their last checkpoint); ``device``/``HEADRANK_RAY`` as the paper
profile (:func:`headrank.studies.paper.placement`), so the same call runs on a GPU or a Ray
cluster unchanged. The ``quick`` and ``full`` profiles run none of them (every statement they
decide is listed as untested there, with the command that runs it); the ``designs`` profile runs
them. The rank-truncation arm of table1 is designed in docs/paper_regime.md but not implemented
(cutting the project's own LM checkpoints needs a cut outside ``headrank compress``, which works
on Hugging Face checkpoints): its claim is untested by design.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from headrank.studies.registry import CATALOGUE, Claim, FigureOut, Study, g3, register_study
from headrank.studies.verdicts import MARGIN_RULE, PLUS_MINUS, equivalence, judge_paired, paired

PROFILE = "designs"
DESIGNS = ("decouple_best", "online_rank", "exposure_invariance")
RUN_COMMAND = "headrank reproduce designs --profile designs (about 4 h on 2 idle CPU cores; resumable)"
SOURCE = "Kobayashi et al. 2024, abstract (paper)"
Q_DECOUPLE = "observe advantages when decoupling weight decay in attention layers from the rest of the parameters"
Q_ONLINE = ("we verify empirically that the key-query and value-projection matrix products $W_K^TW_Q, PW_V$ within "
            "attention layers, when optimized with weight decay, as usually done in vision tasks and language "
            "modelling, indeed induce a significant reduction in the rank of $W_K^TW_Q$ and $PW_V$, even in fully "
            "online training")
Q_LOWRANK = "inducing low rank in attention matrix products can damage language model performance"


@dataclass(frozen=True)
class DesignsParams:
    """Every setting of the three designs, fixed before any of them ran (sizes included)."""

    to_run: tuple[str, ...] = ()
    seeds: tuple[int, ...] = tuple(range(8))
    a_max_chars: int = 20_000
    a_steps: int = 600
    a_coupled_exposures: tuple[float, ...] = (0.0, 1.0, 3.0, 8.0)
    a_attn_exposures: tuple[float, ...] = (0.0, 1.0, 3.0)
    a_other_exposures: tuple[float, ...] = (1.0, 3.0, 8.0)
    b_lambdas: tuple[float, ...] = (0.0, 0.1)
    b_lr: float = 1e-2
    b_steps: int = 8_200
    b_min_exposure: float = 8.0
    b_task: tuple[tuple[str, int], ...] = (("n_pairs", 8), ("n_keys", 32), ("n_values", 32))
    c_pairs: tuple[tuple[float, float], ...] = ((3e-2, 0.1), (1e-2, 0.3), (3e-3, 1.0))
    c_steps: int = 1_000
    runs_dir: str = "out/design_runs"
    workers: int = 2
    device: str = "auto"
    profile: str = "full"

    PROFILES: ClassVar[tuple[str, ...]] = ("quick", "full", PROFILE)

    @classmethod
    def quick(cls) -> DesignsParams:
        """Runs nothing: the designs' statements are listed as untested."""
        return cls(profile="quick")

    @classmethod
    def full(cls) -> DesignsParams:
        """Runs nothing: the designs' statements are listed as untested."""
        return cls()

    @classmethod
    def designs(cls) -> DesignsParams:
        """Every design, as fixed above."""
        return cls(to_run=DESIGNS, profile=PROFILE)


def _sweep(kind: str, base: dict[str, Any], grid: dict[str, list[Any]], p: DesignsParams, name: str) -> Any:
    from headrank.studies.lm_common import sweep
    from headrank.training.distributed import resolve_device

    return sweep(kind, base, grid, list(p.seeds), Path(p.runs_dir) / name, p.workers,
                 device=str(resolve_device(p.device)), ray=os.environ.get("HEADRANK_RAY") or None)


def run_decouple_best(p: DesignsParams) -> dict[str, Any]:
    """(a): the coupled cells and the decoupled grid, one row per run with its perplexities."""
    from headrank.studies.lm_common import OTHER_WD, lambdas_for, lm_base, lr_sum

    base = {**lm_base(p.a_steps, max_chars=p.a_max_chars), "weight_decay": OTHER_WD}
    lrs = lr_sum("lm", base)
    coupled = lambdas_for(p.a_coupled_exposures, lrs)
    attn, other = lambdas_for(p.a_attn_exposures, lrs), lambdas_for(p.a_other_exposures, lrs)
    rows = []
    for fam, grid in (("coupled", None), ("decoupled", {"attn_weight_decay": attn, "weight_decay": other})):
        cells = [{"attn_weight_decay": [lam], "weight_decay": [lam]} for lam in coupled] if grid is None else [grid]
        for i, g in enumerate(cells):
            res = _sweep("lm", base, g, p, f"a_{fam}_{i}")
            rows += [{"family": fam, "attn": float(r["attn_weight_decay"]), "other": float(r["weight_decay"]),
                      "seed": int(r["seed"]), "val_ppl": float(r["val_ppl"]), "test_ppl": float(r["test_ppl"])}
                     for _, r in res.runs.iterrows()]
    return {"runs": rows, "lr_sum": lrs, "overrides": base}


def run_online_rank(p: DesignsParams) -> dict[str, Any]:
    """(b): recall on fresh batches, attention λ over ``b_lambdas``; layer 1's P W_V spectra."""
    from headrank.studies.fig2.experiment import fig2_overrides, train_grid
    from headrank.training.config import decay_exposure, recall_config

    base = fig2_overrides(p.b_steps, lr=p.b_lr, schedule="constant", **dict(p.b_task))
    runs = train_grid(base, list(p.b_lambdas), list(p.seeds), p.workers)
    out = {f"{lam:g}": {} for lam in p.b_lambdas}
    for (lam, seed), (_, sv) in runs.items():
        out[lam][seed] = sv["ov"][0]
    exp = {f"{lam:g}": decay_exposure(recall_config(attn_weight_decay=lam, **base))["attn"] for lam in p.b_lambdas}
    return {"sv_layer1_ov": out, "exposure": exp, "overrides": base}


def run_exposure_invariance(p: DesignsParams) -> dict[str, Any]:
    """(c): per (lr, λ) pair the LM at λ and at 0 with the same lr; middle-layer spectra."""
    from headrank.studies.lm_common import OTHER_WD, lm_base, spectra

    rows = []
    for lr, lam in p.c_pairs:
        base = {**lm_base(p.c_steps), "lr": lr, "weight_decay": OTHER_WD}
        res = _sweep("lm", base, {"attn_weight_decay": [0.0, lam]}, p, f"c_lr{lr:g}")
        for _, r in res.runs.iterrows():
            sv = spectra(res.out / "runs" / r["name"], [2])
            rows.append({"lr": lr, "lam": float(r["attn_weight_decay"]), "seed": int(r["seed"]), "sv": sv})
    return {"runs": rows}


def run(p: DesignsParams) -> dict[str, Any]:
    """The designs ``p.to_run`` asks for (none in quick and full)."""
    t0 = time.perf_counter()
    fns = {"decouple_best": run_decouple_best, "online_rank": run_online_rank,
           "exposure_invariance": run_exposure_invariance}
    data: dict[str, Any] = {d: fns[d](p) for d in p.to_run}
    return {**data, "ran": list(p.to_run), "runtime_s": time.perf_counter() - t0}


# -- claims ------------------------------------------------------------------------------------------

#: in a combined report a design is evidence of the study claim judging the same sentence (counted
#: there, once); run alone (``--profile designs``) it is counted as the finding it is
SUPPORTS = {"designs.decouple_best": "decouple.decoupling_helps", "designs.truncation_arm": "table1.attn_decay_hurts"}


def _untested(name: str, quote: str, statement: str, rule: str, kind: str = "finding") -> Claim:
    return Claim(name=name, source=SOURCE, quote=quote, statement=statement, rule=rule, kind=kind,
                 supports=SUPPORTS.get(name, ""),
                 measured=None, expected="see rule", verdict="inconclusive", untested=RUN_COMMAND,
                 reason="designed and fixed in docs/preregistration.json; not run in this profile")


def _eff_rank(sv: list) -> float:
    from headrank.core import metrics as core

    return float(core.effective_rank(np.asarray(sv, float)).numpy().mean())


def decouple_best(data: dict[str, Any], p: DesignsParams) -> Claim:
    """(a): best coupled λ (on validation) minus best decoupled cell (on validation), on test
    perplexity, paired by seed, three-way against ``table1.MARGIN_PPL``."""
    from headrank.studies.table1 import MARGIN_PPL

    st = "Where decay helps, the best decoupled (attention, other) decay beats the best coupled decay on test perplexity."
    rule = (f"best of each family by mean val ppl; test ppl(best coupled) - test ppl(best decoupled) paired by seed, "
            f"against the margin {MARGIN_PPL:g} ({MARGIN_RULE})")
    d = data.get("decouple_best")
    if d is None:
        return _untested("designs.decouple_best", Q_DECOUPLE, st, rule)
    cells: dict[tuple[str, float, float], dict[int, dict[str, float]]] = {}
    for r in d["runs"]:
        cells.setdefault((r["family"], r["attn"], r["other"]), {})[r["seed"]] = r

    def best(fam: str) -> tuple[str, float, float]:
        return min((k for k in cells if k[0] == fam), key=lambda k: np.mean([v["val_ppl"] for v in cells[k].values()]))

    bc, bd = best("coupled"), best("decoupled")
    diff = paired({s: v["test_ppl"] for s, v in cells[bc].items()}, {s: v["test_ppl"] for s, v in cells[bd].items()})
    test = judge_paired(diff, MARGIN_PPL)
    verdict = "inconclusive" if test["verdict"] == "untested" else test["verdict"]
    return Claim(name="designs.decouple_best", source=SOURCE, quote=Q_DECOUPLE, statement=st, rule=rule, tests=[test],
                 supports=SUPPORTS["designs.decouple_best"],
                 measured={"best_coupled": bc[1:], "best_decoupled": bd[1:], "difference": diff},
                 expected=f"difference > {MARGIN_PPL:g} beyond the interval", verdict=verdict,
                 reason="" if verdict == "held" else test["outcome"], tolerance=PLUS_MINUS,
                 key=f"coupled {bc[1]:.3g} vs attn {bd[1]:.3g} / other {bd[2]:.3g}: {g3(diff['diff'])} ± "
                     f"{g3(diff['spread'])} ppl (n {diff['n_seeds']}, margin {MARGIN_PPL:g})")


def online_rank(data: dict[str, Any], p: DesignsParams) -> Claim:
    """(b): effective rank of layer 1's P W_V at λ = 0 minus at 0.1 (exposure ≥ 8), paired."""
    from headrank.studies.fig2.claims import MARGIN_RANK

    st = ("In fully online training of an attention task that needs high-rank attention, attention decay 0.1 at "
          "exposure 8 lowers the effective rank of layer 1's P W_V.")
    rule = f"eff rank(0) - eff rank(0.1) paired by seed against the margin {MARGIN_RANK:g} ({MARGIN_RULE}); exposure >= "\
           f"{p.b_min_exposure:g}"
    d = data.get("online_rank")
    if d is None:
        return _untested("designs.online_rank", Q_ONLINE, st, rule)
    lo, hi = (f"{x:g}" for x in (min(p.b_lambdas), max(p.b_lambdas)))
    er = {k: {int(s): _eff_rank(v) for s, v in d["sv_layer1_ov"][k].items()} for k in (lo, hi)}
    diff = paired(er[lo], er[hi])
    test = judge_paired(diff, MARGIN_RANK)
    verdict = "inconclusive" if test["verdict"] == "untested" else test["verdict"]
    reason = "" if verdict == "held" else test["outcome"]
    if d["exposure"][hi] < p.b_min_exposure:
        verdict, reason = "inconclusive", f"exposure {d['exposure'][hi]:.3g} < {p.b_min_exposure:g}"
    return Claim(name="designs.online_rank", source=SOURCE, quote=Q_ONLINE, statement=st, rule=rule, tests=[test],
                 measured={"effective_rank": er, "difference": diff, "exposure": d["exposure"]}, verdict=verdict,
                 reason=reason, expected=f"drop > {MARGIN_RANK:g}", tolerance=PLUS_MINUS, exposure=d["exposure"],
                 key=f"effective rank drop {g3(diff['diff'])} ± {g3(diff['spread'])} (n {diff['n_seeds']})")


def exposure_invariance(data: dict[str, Any], p: DesignsParams) -> Claim:
    """(c): the middle layer's effective-rank drop (λ = 0 minus λ, same lr, both products
    averaged) at the first pair minus at the last, paired by seed, equivalent within the margin."""
    from headrank.studies.fig2.claims import MARGIN_RANK

    st = "Decay exposure alone sets the rank effect: (lr, lambda) pairs with one exposure give the same rank drop."
    rule = f"drop(first pair) - drop(last pair), paired by seed, equivalence within +-{MARGIN_RANK:g} ({MARGIN_RULE})"
    d = data.get("exposure_invariance")
    if d is None:
        return _untested("designs.exposure_invariance", "", st, rule, kind="check")
    er: dict[tuple[float, float], dict[int, float]] = {}
    for r in d["runs"]:
        er.setdefault((r["lr"], r["lam"]), {})[r["seed"]] = float(np.mean([_eff_rank(r["sv"][k]) for k in r["sv"]]))
    drops = {lr: paired(er[(lr, 0.0)], er[(lr, lam)]) for lr, lam in p.c_pairs}
    (lr0, _), (lr1, _) = p.c_pairs[0], p.c_pairs[-1]
    diff = paired(dict(enumerate(drops[lr0]["per_seed"])), dict(enumerate(drops[lr1]["per_seed"])))
    test = equivalence(diff["diff"], diff["spread"], diff["n_seeds"], MARGIN_RANK)
    verdict = "inconclusive" if test["verdict"] == "untested" else test["verdict"]
    return Claim(name="designs.exposure_invariance", source="our check: the regime's assumption (docs/paper_regime.md)",
                 kind="check", statement=st, rule=rule, tests=[test], verdict=verdict, reason=test["outcome"],
                 measured={"drop_by_lr": {f"{k:g}": v for k, v in drops.items()}, "difference": diff},
                 expected=f"|difference| < {MARGIN_RANK:g}", tolerance=PLUS_MINUS,
                 key=", ".join(f"lr {k:g}: drop {g3(v['diff'])} ± {g3(v['spread'])}" for k, v in drops.items()))


def truncation_arm(data: dict[str, Any], p: DesignsParams) -> Claim:
    """table1's rank-truncation arm: designed, not implemented (module docstring)."""
    c = _untested("designs.truncation_arm", Q_LOWRANK,
                  "Low rank alone hurts: the attention-decay-0 LM with its attention products cut to the decayed "
                  "model's per-head rank has a higher test perplexity than uncut.",
                  "ppl(cut) - ppl(uncut), paired by seed, against table1.MARGIN_PPL (docs/paper_regime.md)")
    c.untested = "not implemented: a rank cut of the project's own LM checkpoints (designed in docs/paper_regime.md)"
    return c


def claims(data: dict[str, Any], p: DesignsParams) -> list[Claim]:
    """The designs' claims; those not run in this profile are untested."""
    return [decouple_best(data, p), online_rank(data, p), exposure_invariance(data, p), truncation_arm(data, p)]


def figures(data: dict[str, Any], p: DesignsParams) -> list[FigureOut]:
    """No figures: the claims' numbers are the result."""
    return []


STUDY = register_study(Study(name="designs", title=CATALOGUE["designs"][1], source=SOURCE, params=DesignsParams,
                             run=run, claims=claims, figures=figures))
