"""The one set of verdict statistics every study uses (docs/methods/verdicts.md).

- A **spread** over n values (seeds, i.e. independent networks) is ``t_{0.975, n−1} · SE`` (SE =
  sample std (ddof 1) / √n): the half-width of a two-sided 95 % interval for the mean, so two
  seeds give 12.7 · SE, not 2 · SE. One value has no measured spread (NaN). "±" on every page is
  this half-width (:data:`PLUS_MINUS`).
- A **paired difference** ``a − b`` is taken seed by seed (runs of one seed share
  initialisation and data order) and gets the spread of the per-seed differences.
- A **three-way verdict against a margin** (:func:`judge`): every finding declares, before its
  run, the smallest effect that matters (its equivalence margin m ≥ 0, in the effect's units,
  a module constant of its study so the rule's hash holds it), and a difference oriented so that
  positive is the stated direction. With the interval [lo, hi] = diff ∓ spread:
  *held* when lo > m (the whole interval beyond the margin in the stated direction);
  *not held* when hi < m (the interval excludes every effect that matters in the stated
  direction: inside [−m, m], the equivalence of two one-sided tests (TOST), or beyond −m, the
  other way, or across −m: no effect that matters either way); *inconclusive* otherwise;
  *untested* when n < 2 or a NaN (no interval: listed apart, never counted).
  Each side is a one-sided test at 2.5 %; its p-value is recorded for the family-wise control.
- A **trend** over an ordered grid (λ): no step between neighbours rises beyond the margin
  (paired), and the end-to-end drop judged three-way against the margin.
- **combine**: several parts of one claim: not held if any part is, held if all are, else
  inconclusive. A statement's p for "held" is the largest of its parts' (intersection–union
  test), for "not held" the smallest times the number of parts (Bonferroni within).
- **Family-wise control** (:func:`holm`): Holm's step-down over the counted statements that
  carry tests, at :data:`FAMILY_ALPHA` one-sided; a statement whose verdict does not survive
  it is counted inconclusive. Statements decided by an exact computation (no sampling: an
  identity, a deterministic optimisation) carry no p and are outside the family.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

HELD, NOT_HELD, INCONCLUSIVE, UNTESTED = "held", "not held", "inconclusive", "untested"
LEVEL = 0.975  # two-sided 95 %, one-sided 2.5 % per side
FAMILY_ALPHA = 0.025  # Holm's family-wise level, one-sided, over the counted statements with tests
SPREAD_RULE = ("spread = t_{0.975, n-1} x standard error (sample std, ddof 1, / sqrt(n)) over the n seeds "
               "(paired by seed where runs share initialisation and data order)")
PLUS_MINUS = ("\"±\" is the half-width of the two-sided 95 % t interval of the mean over independent seeds, "
              "t_{0.975, n-1} x SE (SE = sample std / sqrt(n))")
MARGIN_RULE = ("held: the 95 % interval lies beyond the margin m in the stated direction (lo > m); not held: it "
               "excludes every effect >= m (hi < m: equivalent within +-m by TOST, or the other way); inconclusive: "
               "neither; untested: n < 2")


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


def _p_beyond(diff: float, spread: float, n: int, margin: float) -> float:
    """One-sided p of "the mean is at most ``margin``" (small when diff is well above it)."""
    if spread == 0:
        return 0.0 if diff > margin else 1.0
    from scipy.stats import t

    se = spread / t_quantile(n)
    return float(t.sf((diff - margin) / se, n - 1))


def judge(diff: float, spread: float, n: int, margin: float) -> dict[str, Any]:
    """The three-way verdict of a difference ``diff`` (positive = the stated direction) with its
    spread over ``n`` independent values against the declared ``margin`` (module docstring):
    verdict (held / not held / inconclusive / untested), the interval, the margin, n, and the
    one-sided p-values of each side (``p_held``: of "effect ≤ m"; ``p_not_held``: of "effect ≥
    m") for :func:`holm`."""
    rec: dict[str, Any] = {"diff": diff, "spread": spread, "n": int(n), "margin": float(margin),
                           "lo": diff - spread, "hi": diff + spread}
    if n < 2 or not (math.isfinite(diff) and math.isfinite(spread)):
        return {**rec, "verdict": UNTESTED, "outcome": "n < 2 or NaN: no interval", "p_held": None,
                "p_not_held": None}
    p = _p_beyond(diff, spread, n, margin)
    lo, hi = diff - spread, diff + spread
    if lo > margin:
        verdict, outcome = HELD, "beyond the margin in the stated direction"
    elif hi < margin:
        verdict = NOT_HELD
        outcome = ("equivalent to no effect within the margin (TOST)" if lo > -margin else
                   "beyond the margin the other way" if hi < -margin else "no effect that matters in either direction")
    else:
        verdict, outcome = INCONCLUSIVE, "the interval reaches across the margin"
    return {**rec, "verdict": verdict, "outcome": outcome, "p_held": p, "p_not_held": 1.0 - p if spread else
            (0.0 if diff < margin else 1.0)}


def equivalence(diff: float, spread: float, n: int, margin: float) -> dict[str, Any]:
    """The three-way verdict of a claim of *no* effect ("not changed", "not going to matter"):
    held when the interval lies inside ±``margin`` (TOST), not held when it lies beyond the margin
    either way, inconclusive otherwise, untested with n < 2 or a NaN. p-values for :func:`holm`:
    ``p_held`` the larger of the two one-sided p's of TOST, ``p_not_held`` twice the smaller p of
    "the effect is beyond the margin" on either side."""
    up, down = judge(diff, spread, n, margin), judge(-diff, spread, n, margin)
    rec = {**up, "kind": "equivalence"}
    if up["verdict"] == UNTESTED:
        return rec
    lo, hi = diff - spread, diff + spread
    verdict = HELD if -margin < lo and hi < margin else NOT_HELD if lo > margin or hi < -margin else INCONCLUSIVE
    return {**rec, "verdict": verdict, "outcome": {HELD: "inside the margin (TOST)", NOT_HELD: "beyond the margin",
                                                   INCONCLUSIVE: "the interval reaches across the margin"}[verdict],
            "p_held": max(up["p_not_held"], down["p_not_held"]),
            "p_not_held": min(1.0, 2 * min(up["p_held"], down["p_held"]))}


def judge_paired(d: Mapping[str, Any], margin: float) -> dict[str, Any]:
    """:func:`judge` of a :func:`paired` difference."""
    return judge(d["diff"], d["spread"], d["n_seeds"], margin)


def sign_verdict(diff: float, spread: float, *, margin: float, n: int | None = None) -> str:
    """The claim verdict of :func:`judge` (untested → inconclusive: a claim has three verdicts;
    the tally lists it apart through its recorded test). ``n`` defaults to "enough" when the
    spread is finite (it was measured over ≥ 2 values)."""
    v = judge(diff, spread, 2 if n is None else n, margin)["verdict"]
    return INCONCLUSIVE if v == UNTESTED else v


def side(mean: float, spread: float, threshold: float, below: bool) -> str:
    """held when the whole interval ``mean ± spread`` is on the claimed side of ``threshold``
    (``below``: ≤ it, else ≥ it), not held when wholly on the other side, else inconclusive
    (NaN included: an unmeasured value is never a verdict). The threshold is the claim's margin."""
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


def trend(values: Mapping[Any, Mapping[Any, float]], order: Sequence[Any] | None = None, *,
          margin: float) -> dict[str, Any]:
    """Tie-aware test that a per-run value falls along ``order`` (default: sorted keys):
    ``values[λ][seed]``, paired by seed, against the declared ``margin`` (the smallest drop
    that matters, in the value's units).

    not held: a step between neighbouring λ rises beyond the margin (held by :func:`judge`), or
    the end-to-end drop (first λ minus last λ, paired) is not held by :func:`judge`. held: no
    such rise and the end-to-end drop held. inconclusive otherwise (fewer than two λ, one seed or
    a NaN: its test says untested)."""
    lams = list(order) if order is not None else sorted(values)
    means = {f"{lam:g}" if isinstance(lam, float) else str(lam): mean_spread(values[lam].values())[0]
             for lam in lams}
    if len(lams) < 2:
        return {"means": means, "steps_up": [], "steps_spread": [], "end_to_end_drop": math.nan,
                "end_to_end_spread": math.nan, "verdict": INCONCLUSIVE, "reason": "fewer than two judged lambdas",
                "margin": margin, "test": None}
    steps = [{"from": lo, "to": hi, **paired(values[hi], values[lo])} for lo, hi in zip(lams, lams[1:], strict=False)]
    end = paired(values[lams[0]], values[lams[-1]])
    test = judge_paired(end, margin)
    rises = [s for s in steps if judge_paired(s, margin)["verdict"] == HELD]
    if rises:
        verdict, why = NOT_HELD, f"rises beyond the margin {margin:g} from lambda {rises[0]['from']} to {rises[0]['to']}"
    else:
        verdict = INCONCLUSIVE if test["verdict"] == UNTESTED else test["verdict"]
        why = {HELD: "", NOT_HELD: f"end-to-end drop excludes the margin {margin:g} ({test['outcome']})",
               INCONCLUSIVE: f"end-to-end drop's interval reaches across the margin {margin:g}"
               if test["verdict"] != UNTESTED else "one seed or a NaN: the spread is not measured"}[verdict]
    return {"means": means, "steps_up": [s["diff"] for s in steps], "steps_spread": [s["spread"] for s in steps],
            "end_to_end_drop": end["diff"], "end_to_end_spread": end["spread"],
            "end_to_end_per_seed": end["per_seed"], "n_seeds": end["n_seeds"], "verdict": verdict, "reason": why,
            "margin": margin, "test": test}


def by_seed(values: Sequence[float], seeds: Sequence[Any]) -> dict[Any, float]:
    """A list of per-seed values as ``{seed: value}`` (for :func:`paired` and :func:`trend`)."""
    return dict(zip(seeds, values, strict=True))


def statement_p(tests: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    """A statement's one-sided p-values from its parts' tests: "held" needs every part (largest
    p, intersection–union), "not held" any part (smallest p times the number of parts). None when
    a part has no p (untested)."""
    ps = [(t.get("p_held"), t.get("p_not_held")) for t in tests]
    if not ps or any(a is None or b is None for a, b in ps):
        return None
    return max(a for a, _ in ps), min(1.0, len(ps) * min(b for _, b in ps))


def holm(pvalues: Mapping[Any, float], alpha: float = FAMILY_ALPHA) -> set[Any]:
    """Holm's step-down: the keys of ``pvalues`` whose hypotheses are rejected with family-wise
    error ≤ ``alpha`` (sorted p_(i) compared with alpha / (m − i); stop at the first that fails)."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, out = len(order), set()
    for i, k in enumerate(order):
        if pvalues[k] > alpha / (m - i):
            break
        out.add(k)
    return out
