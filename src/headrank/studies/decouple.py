"""Table 1's decoupling question where decay may help: the byte-level LM of table1 on a corpus
small enough to overfit (the first 20,000 characters of each stdlib-corpus split instead of
200,000), looking for a regime where some weight decay lowers the held-out perplexity, so that
"decoupling helps" can be tested at all (in table1's regime no decay helps and that claim is
untested). Whether decay helps here is itself measured (``decouple.decay_helps``); where it does
not, the decoupling sentence stays untested here too.

Fixed before any run (the params below): the same model, optimiser, steps (250 quick, 600 full)
and 5 paired seeds as table1; decay exposures 0, 1, 3 (λ = E / Σlr); five cells: coupled
(attention λ = MLP λ) at each exposure, and decoupled (attention 0, MLP λ) at exposures 1 and 3.
"MLP λ" is table1's ``weight_decay``: every matrix outside attention. The regime and λ* are
chosen on validation perplexity and judged on test perplexity (:func:`table1.decoupling_helps`).

Claims: ``decouple.decay_helps`` (our check that the regime exists: the coupled λ* chosen on
validation against coupled 0, on test perplexity, paired by seed) and
``decouple.decoupling_helps`` (the paper's sentence: attention 0 + MLP λ* against coupled λ*).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from headrank.studies import paper
from headrank.studies.lm_common import SPREAD, exposure, lambdas_for, lm_base, lr_sum, sweep
from headrank.studies.registry import CATALOGUE, Claim, FigureOut, Study, g3, register_study
from headrank.studies.verdicts import MARGIN_RULE, judge_paired, paired, sign_verdict

SOURCE = "Kobayashi et al. 2024, abstract (Table 1); tested in a regime where decay may help"


@dataclass(frozen=True)
class DecoupleParams:
    """What shapes the study: corpus size (characters per split), decay exposures, seeds, steps."""

    max_chars: int | None = 20_000
    exposures: tuple[float, ...] = (0.0, 1.0, 3.0)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    steps: int = 600
    workers: int = 2
    profile: str = "full"

    PROFILES: ClassVar[tuple[str, ...]] = ("quick", "full", paper.PROFILE)

    @classmethod
    def paper(cls) -> DecoupleParams:
        """The paper's regime (:mod:`headrank.studies.paper`, docs/paper_regime.md) instead of a
        small corpus: the whole stdlib corpus (``max_chars`` None; 0.50 of one pass over its training
        split at the paper profile's steps, measured: the model underfits), the 2 × 2 of
        attention λ {0, 0.1} × MLP λ {0, 0.1} shared with table1 (coupled 0, coupled 0.1 and the
        decoupled twin attention 0 + MLP 0.1 are its cells), five paired seeds, λ = 0.1 at
        exposure ≥ 8. Rules fixed before the run, unchanged: the regime (coupled 0.1 beats coupled
        0 on mean validation perplexity) chosen on validation, the decoupling judged on test:
        ppl(coupled 0.1) − ppl(attn 0, MLP 0.1) against the margin ``table1.MARGIN_PPL``, paired
        by seed; no regime: untested (in half a pass decay does not help, so this gate was bound to
        fail: the decoupling is untested by design here, and design (a) of docs/paper_regime.md
        is the test)."""
        r = paper.REGIME
        return cls(max_chars=None, exposures=(0.0, r.target_exposure), seeds=r.seeds,
                   steps=paper.steps_for_exposure(r), workers=r.workers, profile=paper.PROFILE)

    @classmethod
    def quick(cls) -> DecoupleParams:
        """Same cells and seeds, 250 steps (table1's quick length)."""
        return cls(steps=250, profile="quick")

    @classmethod
    def full(cls) -> DecoupleParams:
        """600 steps (table1's full length)."""
        return cls()


def run(params: DecoupleParams) -> dict[str, Any]:
    """Train the five cells × seeds; one row per run (λs, exposures, seed, perplexities, loss)."""
    from headrank.studies.table1 import ppl_table

    t0 = time.perf_counter()
    if params.profile == paper.PROFILE:
        from headrank.studies.table1 import run_paper

        data = run_paper(paper.REGIME.lam, params.seeds, t0)
        return {**data, "lambdas": data["attn_lambdas"], "exposures": list(params.exposures)}
    base = lm_base(params.steps, max_chars=params.max_chars)
    lams = lambdas_for(params.exposures, lr_sum("lm", base))
    cols = ["attn_weight_decay", "weight_decay", "seed", "test_ppl", "val_ppl", "loss"]
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, lam in enumerate(lams):  # coupled: attention λ = MLP λ
            res = sweep("lm", base, {"attn_weight_decay": [lam], "weight_decay": [lam]}, list(params.seeds),
                        Path(tmp) / f"coupled{i}", params.workers)
            parts.append(res.runs[cols])
        dec = sweep("lm", base, {"attn_weight_decay": [0.0], "weight_decay": [x for x in lams if x > 0]},
                    list(params.seeds), Path(tmp) / "decoupled", params.workers)
        parts.append(dec.runs[cols])
    runs = pd.concat(parts, ignore_index=True)
    ex = [exposure("lm", {**base, "attn_weight_decay": a, "weight_decay": m})
          for a, m in zip(runs["attn_weight_decay"], runs["weight_decay"], strict=True)]
    runs["exposure_attn"] = [e["attn"] for e in ex]
    runs["exposure_other"] = [e["other"] for e in ex]
    return {"lambdas": lams, "exposures": list(params.exposures), "seeds": list(params.seeds),
            "runs": runs.to_dict("list"), "table": ppl_table(runs).to_dict("list"), "overrides": base,
            "runtime_s": time.perf_counter() - t0}


def decay_helps(runs: pd.DataFrame) -> Claim:
    """``decouple.decay_helps`` (a check of the regime): the coupled λ* > 0 with the lowest mean
    validation perplexity against coupled 0, on *test* perplexity (the split that did not choose
    it), paired by seed: held when λ* is lower beyond the spread."""
    from headrank.studies.table1 import MARGIN_PPL, cells

    test, val = cells(runs), cells(runs, "val_ppl")
    coupled = sorted(a for a, m in val if a == m and a > 0)
    rule = (f"lambda* = the coupled lambda > 0 with the lowest mean val ppl; test ppl(coupled 0) - test "
            f"ppl(coupled lambda*) against the margin {MARGIN_PPL:g} ({MARGIN_RULE}; {SPREAD}), paired by seed")
    if not coupled or (0.0, 0.0) not in test:
        return Claim(name="decouple.decay_helps", source=SOURCE, kind="check", rule=rule, verdict="inconclusive",
                     statement="Some coupled weight decay lowers the held-out perplexity here.", measured={},
                     reason="the grid lacks coupled 0 or a coupled lambda > 0", expected="diff > spread")
    best = min(coupled, key=lambda a: float(np.mean(list(val[(a, a)].values()))))
    d = paired(test[(0.0, 0.0)], test[(best, best)])
    verdict = sign_verdict(d["diff"], d["spread"], margin=MARGIN_PPL)
    return Claim(name="decouple.decay_helps", source=SOURCE, kind="check", rule=rule, verdict=verdict,
                 tests=[judge_paired(d, MARGIN_PPL)],
                 statement="Some coupled weight decay lowers the held-out perplexity here (the regime the "
                           "decoupling question needs).",
                 measured={"lambda_star": best, "difference": d,
                           "mean_test_ppl": {f"{a:g}": float(np.mean(list(test[(a, a)].values())))
                                             for a in [0.0, *coupled]}},
                 reason={"held": "", "inconclusive": "inside the seed spread",
                         "not held": "decay did not lower test perplexity"}[verdict],
                 expected="test ppl(coupled 0) - test ppl(coupled lambda*) > seed spread (paired)", tolerance=SPREAD,
                 key=f"coupled 0 vs {best:g}: test ppl {d['diff']:+.3g} (spread {g3(d['spread'])}, "
                     f"{d['n_seeds']} seeds)")


def claims(data: dict[str, Any], params: DecoupleParams) -> list[Claim]:
    """The regime check, then the paper's decoupling sentence judged in it."""
    from headrank.studies.table1 import decoupling_helps

    runs = pd.DataFrame(data["runs"])
    return [decay_helps(runs), decoupling_helps(runs, name="decouple.decoupling_helps", source=SOURCE)]


def figures(data: dict[str, Any], params: DecoupleParams) -> list[FigureOut]:
    """table1's perplexity grid for the five cells run (the others blank)."""
    from headrank.studies.lm_plots import table1_panels

    corpus = (f"on {params.max_chars:,} characters per split (it overfits)" if params.max_chars
              else "on the whole corpus (paper profile)")
    return [FigureOut("decouple", table1_panels(data),
                      f"Test perplexity of the LM {corpus}, coupled and decoupled decay (mean ± std over seeds; "
                      "blank: not run).")]


def notes(data: dict[str, Any], params: DecoupleParams) -> list[str]:
    """The corpus, the λs, runtime."""
    if params.profile == paper.PROFILE:
        from headrank.studies.table1 import paper_notes

        return paper_notes(data)
    return [f"table1's LM and optimiser on the first {params.max_chars:,} characters of each stdlib-corpus split, "
            f"{params.steps} steps, seeds {list(params.seeds)}; lambdas {data['lambdas']} for exposures "
            f"{data['exposures']}.",
            f"Measured runtime of the training: {data.get('runtime_s', float('nan')):.0f} s ({params.profile} "
            f"profile, {params.workers} workers, 1 thread per run)."]


STUDY = register_study(Study(name="decouple", title=CATALOGUE["decouple"][1], source=SOURCE, params=DecoupleParams,
                             run=run, claims=claims, figures=figures, notes=notes))
