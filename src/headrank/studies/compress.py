"""Our own check (no document reports it): does attention trained with weight decay compress at a
lower perplexity cost?

The byte-level LM of fig3 (:func:`headrank.studies.lm_common.lm_base`) is trained at attention
decay exposures λ·Σlr = 0, 1, 3, 8 (every other matrix keeps λ = 0.1; seeds paired: the same
initialisation and data order at every exposure). Each final model is cut by ``headrank
compress``'s own code, in memory, to the same global parameter budgets (``--params B``: that
fraction of the QK and OV products' parameters of a factored deployment, allocated across heads
by energy share per parameter; the model has learned absolute positions, so both products are
cut), and its test perplexity is measured before and after, on the run's own held-out split.

Pre-registered rule (params, fixed before any run): the cost of a cut is ``ln(ppl_cut /
ppl_uncut)`` (nats per token). ``compress.decay_cheaper`` holds when, at every budget, the cost
at exposure 0 minus the cost at the largest exposure exceeds the paired seed spread; it is not
held when it is ≤ −spread at some budget. ``compress.decay_better_after_cut`` asks the
practitioner's question in absolute terms: at every budget, ln ppl_cut at exposure 0 minus at the
largest exposure beyond the spread.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headrank.studies.lm_common import (
    MIN_EXPOSURE,
    OTHER_WD,
    PRETRAIN_EXPOSURE,
    exposure,
    lambdas_for,
    lm_base,
    lr_sum,
    sweep,
)
from headrank.studies.registry import CATALOGUE, Claim, FigureOut, Study, g3, register_study
from headrank.studies.verdicts import (
    MARGIN_RULE,
    SPREAD_RULE,
    combine_reason,
    judge_paired,
    paired,
    sign_verdict,
)

#: the smallest difference in ln perplexity (nats per token) that matters, declared before the run
MARGIN_NATS = 0.01
SOURCE = "our check: compression cost against attention decay (headrank compress)"


@dataclass(frozen=True)
class CompressParams:
    """Exposures, paired seeds, LM steps, the parameter budgets every model is cut to, the
    products cut."""

    exposures: tuple[float, ...] = (0.0, 1.0, 3.0, PRETRAIN_EXPOSURE)
    seeds: tuple[int, ...] = (0, 1, 2)
    lm_steps: int = 1000
    budgets: tuple[float, ...] = (0.5, 0.25, 0.125)
    products: tuple[str, ...] = ("ov", "qk")
    other_weight_decay: float = OTHER_WD
    workers: int = 2
    profile: str = "full"

    @classmethod
    def quick(cls) -> CompressParams:
        """Exposures 0, 1, 3, 8; two seeds; 300 steps; budgets 0.5 and 0.25."""
        return cls(seeds=(0, 1), lm_steps=300, budgets=(0.5, 0.25), profile="quick")

    @classmethod
    def full(cls) -> CompressParams:
        """Three seeds; 1,000 steps; budgets 0.5, 0.25, 0.125."""
        return cls()


# -- experiment ------------------------------------------------------------------------------------

def measure_run(run_dir: Path, base: dict[str, Any], params: CompressParams) -> dict[str, Any]:
    """Test perplexity of one run's final model uncut and cut to every budget (weight-only)."""
    import torch

    from headrank.compress import Rule, cut_in_place, kept_fraction, make_plan
    from headrank.io.rundir import latest_checkpoint
    from headrank.io.sources import open_reader
    from headrank.models.data import evaluate_lm, lm_tokens
    from headrank.models.transformer import load_model
    from headrank.training.config import make_config

    cfg = make_config("lm", **base)
    tokens, _ = lm_tokens(cfg.task, run_dir)
    model = load_model(latest_checkpoint(run_dir)).eval()
    reader = open_reader(model)

    def ppl() -> float:
        return evaluate_lm(model, tokens["test"], cfg.task.seq_len, cfg.task.eval_tokens, torch.device("cpu"))["ppl"]

    out: dict[str, Any] = {"ppl_uncut": ppl(), "cut": {}}
    base_plan = make_plan(reader, Rule("params", 1.0), tuple(params.products))
    for b in params.budgets:
        plan = _replan(base_plan, b, reader.dims.head_dim)
        with cut_in_place(model, reader, plan):
            out["cut"][f"{b:g}"] = {"ppl": ppl(), "kept": kept_fraction(plan, reader.dims.head_dim),
                                    "mean_k": {p: float(plan.ranks[p].double().mean()) for p in plan.products}}
    return out


def _replan(plan: Any, budget: float, head_dim: int) -> Any:
    from dataclasses import replace

    from headrank.compress import Rule
    from headrank.compress.plan import choose

    rule = Rule("params", budget)
    return replace(plan, rule=rule, ranks=choose(rule, plan.spectra, plan.cost, head_dim))


def run(params: CompressParams) -> dict[str, Any]:
    """Train the exposure sweep, cut every final model to every budget, measure perplexity."""
    t0 = time.perf_counter()
    base = {**lm_base(params.lm_steps), "weight_decay": params.other_weight_decay}
    lams = lambdas_for(params.exposures, lr_sum("lm", base))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        res = sweep("lm", base, {"attn_weight_decay": lams}, list(params.seeds), Path(tmp), params.workers)
        for _, r in res.runs.iterrows():
            lam = float(r["attn_weight_decay"])
            runs.append({"lam": lam, "seed": int(r["seed"]),
                         "exposure": exposure("lm", {**base, "attn_weight_decay": lam})["attn"],
                         **measure_run(res.out / "runs" / r["name"], base, params)})
    return {"lambdas": lams, "exposures": list(params.exposures), "budgets": list(params.budgets), "runs": runs,
            "overrides": base, "runtime_s": time.perf_counter() - t0}


# -- claims ----------------------------------------------------------------------------------------

def _per_seed(data: dict[str, Any], value) -> dict[float, dict[int, float]]:
    out: dict[float, dict[int, float]] = {}
    for r in data["runs"]:
        out.setdefault(float(r["lam"]), {})[int(r["seed"])] = value(r)
    return out


def cost(r: dict[str, Any], budget: str) -> float:
    """ln(ppl_cut / ppl_uncut): the cut's cost in nats per token."""
    return math.log(r["cut"][budget]["ppl"] / r["ppl_uncut"])


def _compare(data: dict[str, Any], value_at) -> tuple[dict[str, str], dict[str, Any], float, float]:
    """Per budget: paired (exposure-0 value − top-exposure value), its verdict."""
    lams = sorted({float(r["lam"]) for r in data["runs"]})
    lo, hi = lams[0], lams[-1]
    parts, measured = {}, {}
    for b in data["budgets"]:
        key = f"{b:g}"
        v = _per_seed(data, lambda r, k=key: value_at(r, k))
        d = paired(v[lo], v[hi])
        parts[key] = sign_verdict(d["diff"], d["spread"], margin=MARGIN_NATS)
        measured[key] = {"test": judge_paired(d, MARGIN_NATS), "at_exposure_0": float(np.mean(list(v[lo].values()))),
                         "at_top_exposure": float(np.mean(list(v[hi].values()))), **d, "verdict": parts[key],
                         "by_exposure": {f"{e:g}": float(np.mean(list(v[lam].values())))
                                         for e, lam in zip(data["exposures"], lams, strict=False)}}
    top = max(r["exposure"] for r in data["runs"] if float(r["lam"]) == hi)
    return parts, measured, hi, top


def _claim(data: dict[str, Any], name: str, statement: str, value_at, what: str) -> Claim:
    parts, measured, hi, top = _compare(data, value_at)
    verdict, reason = combine_reason(parts)
    if top < MIN_EXPOSURE:
        verdict, reason = "inconclusive", f"largest exposure {top:.3g} < {MIN_EXPOSURE:g}"
    return Claim(
        name=name, source=SOURCE, kind="check", statement=statement,
        rule=f"at every budget: {what}(exposure 0) - {what}(largest exposure) against the margin {MARGIN_NATS:g} "
             f"nats, paired by seed ({MARGIN_RULE}; {SPREAD_RULE}); not held if not held at some budget; largest "
             f"exposure >= {MIN_EXPOSURE:g}", tests=[m["test"] for m in measured.values()],
        measured=measured, verdict=verdict, reason=reason, tolerance=SPREAD_RULE,
        expected=f"{what} lower at the largest exposure than at 0 by more than the seed spread, every budget",
        exposure={"needed": MIN_EXPOSURE, "got_attn": top},
        key="; ".join(f"budget {b}: {g3(m['at_exposure_0'])} (exposure 0) vs {g3(m['at_top_exposure'])} "
                      f"(exposure {top:.3g}), diff {g3(m['diff'])} ± {g3(m['spread'])}" for b, m in measured.items()),
        detail=f"{what} per run; weight-only cut by headrank compress's own code (--params budget, QK and OV), "
               "test split of the run's corpus.")


def claims(data: dict[str, Any], params: CompressParams) -> list[Claim]:
    return [
        _claim(data, "compress.decay_cheaper", "A model trained with attention decay loses less perplexity (relative to "
               "its own uncut perplexity) when its attention products are cut to the same parameter budget.",
               cost, "ln(ppl_cut / ppl_uncut)"),
        _claim(data, "compress.decay_better_after_cut", "Cut to the same parameter budget, the model trained with "
               "attention decay has the lower test perplexity.",
               lambda r, b: math.log(r["cut"][b]["ppl"]), "ln ppl_cut"),
    ]


# -- figures ---------------------------------------------------------------------------------------

def figures(data: dict[str, Any], params: CompressParams) -> list[FigureOut]:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    by_lam = sorted({float(r["lam"]) for r in data["runs"]})
    expo = {lam: max(r["exposure"] for r in data["runs"] if float(r["lam"]) == lam) for lam in by_lam}
    for b in data["budgets"]:
        key = f"{b:g}"
        for ax, f in ((axes[0], lambda r, k=key: cost(r, k)), (axes[1], lambda r, k=key: r["cut"][k]["ppl"])):
            xs = [expo[float(r["lam"])] for r in data["runs"]]
            line = ax.plot([expo[lam] for lam in by_lam],
                           [np.mean([f(r) for r in data["runs"] if float(r["lam"]) == lam]) for lam in by_lam],
                           "o-", label=f"budget {key}")[0]
            ax.scatter(xs, [f(r) for r in data["runs"]], s=10, color=line.get_color(), alpha=0.5)
    axes[1].plot([expo[lam] for lam in by_lam],
                 [np.mean([r["ppl_uncut"] for r in data["runs"] if float(r["lam"]) == lam]) for lam in by_lam],
                 "k:", label="uncut")
    axes[0].set_ylabel("cost ln(ppl_cut / ppl_uncut)")
    axes[1].set_ylabel("test perplexity after the cut")
    for ax in axes:
        ax.set_xlabel("attention decay exposure lambda * sum(lr)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return [FigureOut("compress_cost", fig, "Perplexity cost of cutting QK and OV to a parameter budget against the "
                      "attention decay exposure the LM was trained with (dots: seeds; lines: means).")]


def notes(data: dict[str, Any], params: CompressParams) -> list[str]:
    return [f"LM runs as fig3's ({params.lm_steps} steps, seeds {list(params.seeds)}), attention lambdas "
            f"{data['lambdas']} for exposures {data['exposures']}; budgets {data['budgets']} of the QK and OV products' "
            "parameters (factored), weight-only Eckart-Young cut, ranks allocated by energy share per parameter.",
            f"Measured runtime: {data.get('runtime_s', float('nan')):.0f} s ({params.profile} profile)."]


STUDY = register_study(Study(name="compress", title=CATALOGUE["compress"][1], source=SOURCE, params=CompressParams,
                             run=run, claims=claims, figures=figures, notes=notes))
