"""The one set of verdict statistics every study uses.

- A **spread** over n values (seeds or sentences) is ``t_{0.975, n−1} · SE`` (SE = sample std
  (ddof 1) / √n): a two-sided 95 % interval for the mean, so two seeds give 12.7 · SE, not 2 · SE.
  One value has no measured spread (NaN).
- A **paired difference** ``a − b`` is taken seed by seed (runs of one seed share
  initialisation and data order) and gets the spread of the per-seed differences.
- A **sign verdict**: held when the difference exceeds its spread, not held when it is at or
  below minus the spread, else inconclusive; a NaN anywhere is inconclusive, never held or not
  held.
- A **trend** over an ordered grid (λ): non-increasing within the spread at every step and a
  strict drop end to end (paired, beyond the spread).
- **combine**: several parts of one claim: not held if any part is, held if all are, else
  inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
LEVEL = 0.975  # two-sided 95 %
SPREAD_RULE = ("spread = t_{0.975, n-1} x standard error (sample std, ddof 1, / sqrt(n)) over the n seeds "
               "(paired by seed where runs share initialisation and data order)")


def t_quantile(n: int) -> float:
    """``t_{0.975, n−1}``, the factor on the standard error for n values (NaN for n < 2)."""
    if n < 2:
        return math.nan
    from scipy.stats import t

    return float(t.ppf(LEVEL, n - 1))


def mean_spread(values: Iterable[float]) -> tuple[float, float]:
    """Mean of ``values`` and its spread ``t_{0.975, n−1} · SE`` (NaN mean when empty or any
    value is NaN; NaN spread with fewer than two values)."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0 or not np.all(np.isfinite(v)):
        return math.nan, math.nan
    if v.size < 2:
        return float(v.mean()), math.nan
    return float(v.mean()), t_quantile(v.size) * float(v.std(ddof=1)) / math.sqrt(v.size)


def paired(a: Mapping[Any, float], b: Mapping[Any, float]) -> dict[str, Any]:
    """``a − b`` paired by seed (the seeds both have): mean difference, its spread
    (``t_{0.975, n−1}`` · std of the per-seed differences / √n; NaN with one seed), the std, the
    number of seeds and the per-seed differences."""
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    diff, spread = mean_spread(d)
    sd = float(d.std(ddof=1)) if len(d) >= 2 else math.nan
    return {"diff": diff, "spread": spread, "sd": sd, "n_seeds": len(seeds), "per_seed": d.tolist()}


def sign_verdict(diff: float, spread: float) -> str:
    """held if ``diff`` > ``spread``; not held if ``diff`` ≤ −``spread`` (a zero difference with
    zero spread is an absent effect); else inconclusive (inside the spread, or NaN)."""
    if not (math.isfinite(diff) and math.isfinite(spread)):
        return INCONCLUSIVE
    if diff > spread:
        return HELD
    if diff <= -spread:
        return NOT_HELD
    return INCONCLUSIVE


def side(mean: float, spread: float, threshold: float, below: bool) -> str:
    """held when the whole interval ``mean ± spread`` is on the claimed side of ``threshold``
    (``below``: ≤ it, else ≥ it), not held when wholly on the other side, else inconclusive
    (NaN included: an unmeasured value is never a verdict)."""
    if not (math.isfinite(mean) and math.isfinite(spread)):
        return INCONCLUSIVE
    lo, hi = mean - spread, mean + spread
    if (hi <= threshold) if below else (lo >= threshold):
        return HELD
    if (lo > threshold) if below else (hi < threshold):
        return NOT_HELD
    return INCONCLUSIVE


def at_most(value: float | None, limit: float) -> str:
    """A one-number threshold: held when ``value ≤ limit``, not held above, inconclusive for
    NaN/None."""
    if value is None or not math.isfinite(float(value)):
        return INCONCLUSIVE
    return HELD if float(value) <= limit else NOT_HELD


def at_least(value: float | None, limit: float) -> str:
    """held when ``value ≥ limit``, not held below, inconclusive for NaN/None."""
    if value is None or not math.isfinite(float(value)):
        return INCONCLUSIVE
    return HELD if float(value) >= limit else NOT_HELD


def combine(verdicts: Sequence[str] | Mapping[str, str]) -> str:
    """Several parts of one claim: not held if any part is, held if all are, else inconclusive
    (no parts: inconclusive)."""
    vals = list(verdicts.values()) if isinstance(verdicts, Mapping) else list(verdicts)
    if NOT_HELD in vals:
        return NOT_HELD
    return HELD if vals and all(v == HELD for v in vals) else INCONCLUSIVE


def combine_reason(verdicts: Mapping[str, str]) -> tuple[str, str]:
    """:func:`combine` of named parts and the reason naming the parts that decided it."""
    v = combine(verdicts)
    if v == HELD:
        return v, ""
    which = NOT_HELD if v == NOT_HELD else INCONCLUSIVE
    return v, f"{which} for: " + ", ".join(k for k, x in verdicts.items() if x == which)


def trend(values: Mapping[Any, Mapping[Any, float]], order: Sequence[Any] | None = None) -> dict[str, Any]:
    """Tie-aware test that a per-run value falls along ``order`` (default: sorted keys):
    ``values[λ][seed]``, paired by seed.

    held: no step between neighbouring λ rises beyond the spread of its paired differences, and
    the end-to-end drop (first λ minus last λ, paired) exceeds its spread. not held: a step
    rises beyond its spread, or the end-to-end change is ≤ −spread. inconclusive: the end-to-end
    drop is inside the spread, one seed (no spread), fewer than two λ, or a NaN."""
    lams = list(order) if order is not None else sorted(values)
    means = {f"{lam:g}" if isinstance(lam, float) else str(lam): mean_spread(values[lam].values())[0]
             for lam in lams}
    if len(lams) < 2:
        return {"means": means, "steps_up": [], "steps_spread": [], "end_to_end_drop": math.nan,
                "end_to_end_spread": math.nan, "verdict": INCONCLUSIVE, "reason": "fewer than two judged lambdas"}
    steps = [{"from": lo, "to": hi, **paired(values[hi], values[lo])} for lo, hi in zip(lams, lams[1:], strict=False)]
    end = paired(values[lams[0]], values[lams[-1]])
    rises = [s for s in steps if sign_verdict(s["diff"], s["spread"]) == HELD]
    if rises:
        verdict, why = NOT_HELD, f"rises beyond the seed spread from lambda {rises[0]['from']} to {rises[0]['to']}"
    else:
        verdict = sign_verdict(end["diff"], end["spread"])
        why = {HELD: "", NOT_HELD: "no drop from the first to the last lambda beyond the seed spread",
               INCONCLUSIVE: "end-to-end drop inside the seed spread" if math.isfinite(end["spread"])
               else "one seed or a NaN: the spread is not measured"}[verdict]
    return {"means": means, "steps_up": [s["diff"] for s in steps], "steps_spread": [s["spread"] for s in steps],
            "end_to_end_drop": end["diff"], "end_to_end_spread": end["spread"],
            "end_to_end_per_seed": end["per_seed"], "n_seeds": end["n_seeds"], "verdict": verdict, "reason": why}


def by_seed(values: Sequence[float], seeds: Sequence[Any]) -> dict[Any, float]:
    """A list of per-seed values as ``{seed: value}`` (for :func:`paired` and :func:`trend`)."""
    return dict(zip(seeds, values, strict=True))
