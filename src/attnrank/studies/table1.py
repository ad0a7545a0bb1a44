"""Table 1 of the paper at CPU scale: test perplexity of the byte-level LM over attention decay ×
MLP decay (``weight_decay``: every matrix outside attention, embeddings included), over ≥ 5
seeds. Sizes: :func:`attnrank.studies.lm_common.lm_base`.

The grid is set in decay exposure ``λ·Σlr`` (REFERENCE.md §3): each λ is a target exposure
divided by the run's Σlr. Every cell runs the same seeds (same initialisation and data order),
so differences between cells are paired by seed; the spread of a mean difference is 2 standard
errors of the per-seed differences.

Claims: ``attn_decay_hurts`` (the largest attention λ gives a higher perplexity than attention
λ = 0: main effect over the grid's MLP λs, each MLP λ reported) and ``decoupling_helps`` (at the coupled λ with ≥ 3 time constants, the
best cell of that MLP column lies where attention decay is lower than MLP decay).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnrank.studies.lm_common import (
    MIN_EXPOSURE,
    SPREAD,
    combine,
    exposure,
    lambdas_for,
    lm_base,
    lr_sum,
    paired,
    sign_verdict,
    sweep,
)
from attnrank.studies.registry import CATALOGUE, Claim, FigureOut, Study, g3, register_study

SOURCE = "Kobayashi et al. 2024, Table 1 (seed 000); REFERENCE.md §3"
SRC_HURTS = "paper Table 1; REFERENCE.md §3 (low rank in attention can hurt LMs)"
SRC_DECOUPLE = "paper Table 1 (decoupling attention decay helps)"
ST_HURTS = ("Attention decay hurts test perplexity: attention decay exposure {e:g} gives a higher perplexity than "
            "no attention decay (main effect over the grid's MLP decays, paired by seed; each MLP decay reported).")
ST_DECOUPLE = ("Decoupling helps: at a coupled lambda with >= {e:g} time constants, the best cell of the attention x "
               "MLP grid lies where attention decay is lower than MLP decay.")


@dataclass(frozen=True)
class Table1Params:
    """What shapes table1: attention and MLP decay exposures (λ = E / Σlr), seeds, steps."""

    attn_exposures: tuple[float, ...] = (0.0, 1.0, 3.0)
    mlp_exposures: tuple[float, ...] = (0.0, 3.0)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 600
    workers: int = 2
    profile: str = "full"

    @classmethod
    def quick(cls) -> Table1Params:
        """Same grid and seeds, 250 steps."""
        return cls(steps=250, profile="quick")

    @classmethod
    def full(cls) -> Table1Params:
        """600 steps."""
        return cls()


def run(params: Table1Params) -> dict[str, Any]:
    """Train the grid; one row per run (λs, exposures, seed, perplexities, final loss)."""
    t0 = time.perf_counter()
    base = lm_base(params.steps)
    lrs = lr_sum("lm", base)
    attn, mlp = lambdas_for(params.attn_exposures, lrs), lambdas_for(params.mlp_exposures, lrs)
    with tempfile.TemporaryDirectory() as tmp:
        res = sweep("lm", base, {"attn_weight_decay": attn, "weight_decay": mlp}, list(params.seeds), Path(tmp),
                    params.workers)
    runs = res.runs[["attn_weight_decay", "weight_decay", "seed", "test_ppl", "val_ppl", "loss"]].copy()
    ex = [exposure("lm", {**base, "attn_weight_decay": a, "weight_decay": m})
          for a, m in zip(runs["attn_weight_decay"], runs["weight_decay"], strict=True)]
    runs["exposure_attn"] = [e["attn"] for e in ex]
    runs["exposure_other"] = [e["other"] for e in ex]
    return {"attn_lambdas": attn, "mlp_lambdas": mlp, "lr_sum": lrs, "seeds": list(params.seeds),
            "runs": runs.to_dict("list"), "table": ppl_table(runs).to_dict("list"), "overrides": base,
            "runtime_s": time.perf_counter() - t0}


# -- claims ----------------------------------------------------------------------------------------

def ppl_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (attn λ, MLP λ): mean, std (ddof 1) and count over seeds of the test perplexity."""
    g = runs.groupby(["attn_weight_decay", "weight_decay"])["test_ppl"]
    t = g.agg(["mean", "std", "count"]).reset_index()
    return t.rename(columns={"mean": "ppl_mean", "std": "ppl_std", "count": "n_seeds"})


def cells(runs: pd.DataFrame) -> dict[tuple[float, float], dict[int, float]]:
    """(attn λ, MLP λ) → {seed: test perplexity}."""
    out: dict[tuple[float, float], dict[int, float]] = {}
    for a, m, s, p in zip(runs["attn_weight_decay"], runs["weight_decay"], runs["seed"], runs["test_ppl"], strict=True):
        out.setdefault((float(a), float(m)), {})[int(s)] = float(p)
    return out


def _exp(runs: pd.DataFrame, col: str, lam_col: str, lam: float) -> float:
    return float(runs.loc[runs[lam_col] == lam, col].max())


def attn_decay_hurts(runs: pd.DataFrame) -> Claim:
    """``table1.attn_decay_hurts``: the main effect of attention decay, ppl(largest attention λ) −
    ppl(attention 0) per seed averaged over the grid's MLP λs, above its paired spread; each MLP λ
    is reported with its own verdict. Needs exposure ≥ 3 at the largest attention λ."""
    c = cells(runs)
    a_max = max(a for a, _ in c)
    e_max = _exp(runs, "exposure_attn", "attn_weight_decay", a_max)
    mlps = [m for m in sorted({m for _, m in c}) if (0.0, m) in c and (a_max, m) in c and a_max > 0]
    per: dict[str, Any] = {}
    for m in mlps:
        d = paired(c[(a_max, m)], c[(0.0, m)])
        per[f"mlp_lambda={m:g}"] = {"ppl_attn0": float(np.mean(list(c[(0.0, m)].values()))),
                                    "ppl_attn_max": float(np.mean(list(c[(a_max, m)].values()))), **d,
                                    "verdict": sign_verdict(d["diff"], d["spread"])}
    seeds = set.intersection(*(set(c[(a, m)]) for m in mlps for a in (0.0, a_max))) if mlps else set()
    hi = {s: float(np.mean([c[(a_max, m)][s] for m in mlps])) for s in seeds}
    lo = {s: float(np.mean([c[(0.0, m)][s] for m in mlps])) for s in seeds}
    main = paired(hi, lo)
    verdict = sign_verdict(main["diff"], main["spread"])
    reason = {"held": "", "inconclusive": "the main effect is inside the seed spread",
              "not held": "attention decay did not raise perplexity beyond the spread"}[verdict]
    if e_max < MIN_EXPOSURE:
        verdict, reason = "inconclusive", f"largest attention exposure {e_max:.4g} < {MIN_EXPOSURE:g}"
    return Claim(name="table1.attn_decay_hurts", source=SRC_HURTS, statement=ST_HURTS.format(e=round(e_max, 2)),
                 measured={"attn_lambda_max": a_max, "main_effect": main, "per_mlp_lambda": per}, verdict=verdict,
                 reason=reason, tolerance=SPREAD,
                 expected="mean over MLP lambdas of ppl(attn max) - ppl(attn 0) > seed spread (paired by seed)",
                 detail="test perplexity (exp of mean test loss) on the held-out split; diff > 0 means decay hurt.",
                 exposure={"needed": MIN_EXPOSURE, "got_attn": e_max},
                 key=f"ppl {main['diff']:+.3g} at attention lambda {a_max:g} vs 0 (spread {g3(main['spread'])}, "
                     f"{main['n_seeds']} seeds)")


def decoupling_helps(runs: pd.DataFrame) -> Claim:
    """``table1.decoupling_helps``: in the MLP column(s) whose coupled λ has ≥ 3 time constants, the
    best cell has attention λ < MLP λ, beyond the paired spread against the best cell with
    attention λ ≥ MLP λ. The best cell of the whole grid is reported too."""
    c = cells(runs)
    mean = {k: float(np.mean(list(v.values()))) for k, v in c.items()}
    cols = [m for m in sorted({m for _, m in c}) if (m, m) in c
            and _exp(runs, "exposure_other", "weight_decay", m) >= MIN_EXPOSURE]
    measured: dict[str, Any] = {"grid_best_cell": list(min(mean, key=mean.get)), "cells_mean_ppl": {
        f"attn={a:g},mlp={m:g}": v for (a, m), v in sorted(mean.items())}}
    verdicts, key = [], []
    for m in cols:
        lower = [k for k in c if k[1] == m and k[0] < m]
        other = [k for k in c if k[1] == m and k[0] >= m]
        if not lower:
            continue
        bl, bo = min(lower, key=mean.get), min(other, key=mean.get)
        d = paired(c[bo], c[bl])
        verdicts.append(sign_verdict(d["diff"], d["spread"]))
        measured[f"mlp_lambda={m:g}"] = {"best_lower_attn": bl[0], "best_other_attn": bo[0], **d,
                                         "verdict": verdicts[-1]}
        key.append(f"MLP {m:g}: attn {bl[0]:g} better than attn {bo[0]:g} by {d['diff']:.3g} ppl "
                   f"(spread {g3(d['spread'])})")
    verdict = combine(verdicts)
    reason = "" if verdict == "held" else ("the two best cells are inside the seed spread" if verdict == "inconclusive"
                                           else "the best cell has attention decay >= MLP decay, beyond the spread")
    got = max((_exp(runs, "exposure_other", "weight_decay", m) for m in cols), default=0.0)
    if not verdicts:
        verdict, reason = "inconclusive", f"no coupled lambda with exposure >= {MIN_EXPOSURE:g} in the grid"
    return Claim(name="table1.decoupling_helps", source=SRC_DECOUPLE, statement=ST_DECOUPLE.format(e=MIN_EXPOSURE),
                 measured=measured, verdict=verdict, reason=reason,
                 expected="ppl(best cell with attn >= MLP) - ppl(best cell with attn < MLP) > seed spread (paired)",
                 tolerance=SPREAD,
                 detail="Picking the best of several cells favours the side with more cells slightly (selection); "
                        "the spread test does not correct for it.",
                 exposure={"needed_coupled": MIN_EXPOSURE, "got_coupled": got},
                 key="; ".join(key) or "—")


def claims(data: dict[str, Any], params: Table1Params) -> list[Claim]:
    """Both table1 claims from the runs table."""
    runs = pd.DataFrame(data["runs"])
    return [attn_decay_hurts(runs), decoupling_helps(runs)]


def figures(data: dict[str, Any], params: Table1Params) -> list[FigureOut]:
    """The perplexity grid and perplexity against attention λ."""
    from attnrank.studies.lm_plots import table1_panels

    return [FigureOut("table1", table1_panels(data), "Test perplexity over attention λ × MLP λ (mean ± std over seeds).")]


def notes(data: dict[str, Any], params: Table1Params) -> list[str]:
    """Sizes, what 'MLP λ' means here, the λ grid, runtime."""
    return [
        "Sizes are our choice (the paper's Pile LMs are far larger; it used 5 seeds): LM = 4 pre-norm causal layers, "
        "width 64, 4 heads of 16, MLP 256, byte tokens, context 64, batch 32, lr 3e-3, first 200,000 characters of "
        "each stdlib-corpus split, 16,384 test tokens scored.",
        "'MLP lambda' here is weight_decay: every matrix outside attention (MLP, embeddings, output head), not the "
        "MLP alone; biases and norm gains are not decayed.",
        f"Lambdas from exposures (sum lr = {data['lr_sum']:.4g} over {params.steps} steps): attention "
        f"{data['attn_lambdas']} (exposures {list(params.attn_exposures)}), MLP {data['mlp_lambdas']} (exposures "
        f"{list(params.mlp_exposures)}).",
        f"Measured runtime of the training: {data.get('runtime_s', float('nan')):.0f} s ({params.profile} profile, "
        f"{params.workers} workers, 1 thread per run).",
    ]


STUDY = register_study(Study(name="table1", title=CATALOGUE["table1"][1], source=SOURCE, params=Table1Params,
                             run=run, claims=claims, figures=figures, notes=notes))
