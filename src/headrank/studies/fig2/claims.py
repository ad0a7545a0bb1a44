"""The claims of Figure 2 (docs/METHODS.md), judged from the stored data alone.

Runs of one seed share initialisation and data order, so the comparisons over λ are paired.
A λ > 0 is judged only when its decay exposure λ·Σlr reaches ``Fig2Params.min_exposure``;
runs with less are reported, not judged; λ = 0 is the control. A trend over λ is judged by a
tie-aware test (:func:`trend`), not by a rank correlation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headrank.core import metrics as core
from headrank.studies.fig2.params import Fig2Params
from headrank.studies.registry import Claim, g3, series
from headrank.studies.verdicts import SPREAD_RULE, combine
from headrank.studies.verdicts import trend as vtrend

RANK_LAYER = "0"  # the paper's "layer 1"
GAP_TOL = 0.01
ACC_MIN = 0.9
TAU = 1e-3  # the tracker's numerical-rank threshold
FLOOR_MARGIN = 2.0  # the second threshold: this many times the measured noise floor
EARLY_RANK_SHARE = 0.5  # early_stages: the effective rank's target, this share of the way from r0 to 1

PNAME = {"ov": "P W_V", "qk": "W_K^T W_Q"}
PBAL = {"ov": "P^T P - W_V W_V^T", "qk": "W_K W_K^T - W_Q W_Q^T"}

RANK_SOURCE = "paper, Figure 2 caption (left)"
RANK_QUOTE = "We observe that rank reduction correlates strongly with weight decay strength."
RANK_STATEMENT = ("The rank of P W_V in layer 1 at the end of training decreases as the attention decay grows "
                  "(effective rank, at >= 5 time constants of decay exposure).")
BALANCE_SOURCE = "paper, Figure 2 caption (center)"
BALANCE_QUOTE = ("While for AdamW we no longer have the guarantee of an exponential decay, we see that the "
                 "discrepancy nonetheless vanishes quickly, with a time constant which perfectly correlates with the "
                 "decay strength.")
BALANCE_STATEMENT = ("The relative discrepancy ||P^T P - W_V W_V^T|| / (||P^T P|| + ||W_V W_V^T||) vanishes, at a "
                     "rate that grows with the attention decay.")
GAP_SOURCE = "paper, Figure 2 caption (right)"
GAP_QUOTE = (r"As the discrepancy between $P^\top P$ and $W_VW_V^\top$ decreases, the difference approaches $0$, "
             "and thus the bound becomes tight.")
GAP_STATEMENT = ("With attention decay the Frobenius bound 1/2(|P|^2+|W_V|^2) approaches the nuclear norm "
                 "|P W_V|_* (the gap goes to 0) once the decay has had >= 5 time constants.")
EARLY_QUOTE = "explain why such regularization on the matrix product affects early stages of training"
QK_QUOTE = r"Qualitative findings are identical when studying $W_K^\top W_Q$."
TASK_SOURCE = "our check (a rank drop means little if the task is not learned)"
TASK_STATEMENT = "The model learns associative recall at every attention decay of the grid."


def _keys(data: dict[str, Any]) -> list[str]:
    return [f"{lam:g}" for lam in data["lambdas"]]


def exposures(data: dict[str, Any]) -> dict[str, float]:
    """Per λ: the attention decay exposure λ·Σlr of its runs."""
    return {k: data["exposure"][k]["attn"] for k in _keys(data)}


def judged(data: dict[str, Any], p: Fig2Params) -> list[str]:
    """The λ keys a trend is judged on, by increasing λ: the control λ = 0 and every λ > 0 with
    exposure ≥ ``p.min_exposure``."""
    exp = exposures(data)
    return [k for k, lam in zip(_keys(data), data["lambdas"], strict=True)
            if lam == 0 or exp[k] >= p.min_exposure]


def exposure_record(data: dict[str, Any], p: Fig2Params) -> dict[str, Any]:
    """What a claim records as its exposure: needed, got per λ, and which λ were judged."""
    return {"needed": p.min_exposure, "got": exposures(data), "judged": judged(data, p)}


def per_seed(data: dict[str, Any], product: str, metric: str, at: int = -1) -> dict[str, list[float]]:
    """Per λ: ``metric`` (mean over layer-1 heads) at tracked index ``at``, one value per seed."""
    return {k: [data[product][k][s][RANK_LAYER][metric][at] for s in map(str, data["seeds"])]
            for k in _keys(data)}


def trend(values: dict[str, list[float]], order: list[str]) -> tuple[str, str, dict[str, Any]]:
    """:func:`headrank.studies.verdicts.trend` on per-λ lists of per-seed values (paired by seed,
    t-quantile spread). Returns (verdict, reason, numbers)."""
    t = vtrend({k: dict(enumerate(values[k])) for k in order}, order)
    return t["verdict"], t["reason"], {k: v for k, v in t.items() if k not in ("verdict", "reason")}


def noise_floor(data: dict[str, Any], product: str = "ov") -> float:
    """The AdamW noise floor, measured: the largest σ_min/σ_1 over the layer-1 heads of ``product``
    that the λ = 0 runs leave (their weakest direction is one the task never uses; without decay
    it sits there, not at 0). From the λ = 0 control, not from the runs it helps judge; NaN when
    the data hold no λ = 0 run (no control: no floor, rather than a decayed run standing in)."""
    if 0.0 not in data["lambdas"]:
        return float("nan")
    zero = _keys(data)[data["lambdas"].index(0.0)]
    ratios = [h[-1] / h[0] for s in map(str, data["seeds"])
              for h in data["sv"][product][zero][s][int(RANK_LAYER)] if h[0] and h[0] > 0]
    return float(max(ratios))


def mean_numerical_rank(data: dict[str, Any], tau: float, product: str = "ov") -> dict[str, float]:
    """Per λ: #{σ_i > τ σ_1} of layer-1 ``product`` (:func:`headrank.core.metrics.numerical_rank`),
    mean over heads and seeds; NaN for every λ when τ is not a number (no noise floor)."""
    if not np.isfinite(tau):
        return {k: float("nan") for k in _keys(data)}
    out = {}
    for k in _keys(data):
        heads = [np.asarray(h, float) for s in map(str, data["seeds"])
                 for h in data["sv"][product][k][s][int(RANK_LAYER)]]
        out[k] = float(np.mean([core.numerical_rank(h, tau).item() for h in heads]))
    return out


def _mean(d: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in d.items()}


def _name(base: str, product: str) -> str:
    return f"fig2.{base}" if product == "ov" else f"fig2.qk.{base}"


def rank_falls(data: dict[str, Any], p: Fig2Params, product: str = "ov") -> Claim:
    """Final effective rank of layer-1 ``product`` falls over the judged λ (paired trend,
    t-quantile spread); numerical ranks at τ = 1e-3 and at twice the noise floor of the λ = 0
    control are reported beside it."""
    order = judged(data, p)
    eff = per_seed(data, product, "effective_rank")
    verdict, reason, info = trend(eff, order)
    if 0.0 not in data["lambdas"]:
        verdict, reason = "inconclusive", "no lambda = 0 control (neither the trend's reference nor the noise floor)"
    floor = noise_floor(data, product)
    tau_floor = FLOOR_MARGIN * floor
    return Claim(
        name=_name("rank_falls", product), source=RANK_SOURCE, statement=RANK_STATEMENT.replace("P W_V", PNAME[product]),
        quote=RANK_QUOTE, rule=f"paired trend over the lambdas with exposure >= {p.min_exposure:g} (and lambda = 0): "
                              f"{SPREAD_RULE}; step {p.steps}",
        measured={"final_effective_rank": _mean(eff), "final_effective_rank_per_seed": eff, **info,
                  "judged_lambdas": order,
                  "numerical_rank_tau_1e-3": mean_numerical_rank(data, TAU, product),
                  "noise_floor_sigma_min_over_sigma_1_at_lambda_0": floor,
                  "tau_above_noise_floor": tau_floor,
                  "numerical_rank_tau_above_floor": mean_numerical_rank(data, tau_floor, product)},
        expected="effective rank non-increasing over the judged lambdas within the seed spread, and lower at the "
                 "largest than at lambda = 0 beyond it",
        verdict=verdict, reason=reason, tolerance=SPREAD_RULE,
        exposure=exposure_record(data, p),
        key=f"effective rank, {series(_mean(eff))}; end-to-end drop {g3(info.get('end_to_end_drop'))} "
            f"± {g3(info.get('end_to_end_spread'))}",
        detail=f"exp(entropy of sigma/sum sigma) of layer 1's {PNAME[product]} per head, mean over heads "
               f"(head dim {data['config']['model']['head_dim']}), step {p.steps}, seeds {list(p.seeds)} "
               f"(paired: a seed's runs share initialisation and data). Numerical ranks #{{sigma_i > tau sigma_1}} are "
               f"means over heads and seeds, reported, not judged; the noise floor is the largest sigma_min/sigma_1 "
               f"the lambda = 0 runs leave in a layer-1 head.")


def decay_rates(data: dict[str, Any], p: Fig2Params, product: str = "ov") -> dict[str, list[float]]:
    """Per λ, per seed: the decay rate k (per step) of the relative imbalance, the least-squares
    slope of −log(balance_rel) against the step over the tracked steps ≤ ``p.fit_until`` · steps
    (a window fixed in params before the run). Time constant = 1/k steps."""
    out: dict[str, list[float]] = {}
    for k in _keys(data):
        out[k] = []
        for s in map(str, data["seeds"]):
            x = data[product][k][s][RANK_LAYER]
            t = np.asarray(x["step"], float)
            b = np.asarray([np.nan if v is None else v for v in x["balance_rel"]], float)
            sel = (t <= p.fit_until * p.steps) & np.isfinite(b) & (b > 0)
            out[k].append(float(-np.polyfit(t[sel], np.log(b[sel]), 1)[0]) if sel.sum() >= 3 else float("nan"))
    return out


def balance_time_constant(data: dict[str, Any], p: Fig2Params, product: str = "ov") -> Claim:
    """The caption's "vanishes quickly, with a time constant which perfectly correlates with the
    decay strength", two parts: (1) the fitted decay rate of the relative imbalance rises with λ
    over the judged λ (paired trend on −rate); (2) it vanishes: final/initial ≤ ``p.vanish_ratio``
    at every judged λ > 0, every seed. The time constant is compared with 1/(λ·lr)."""
    order = judged(data, p)
    rates = decay_rates(data, p, product)
    v_rate, r_rate, info = trend({k: [-x for x in rates[k]] for k in order}, order)
    first, last = per_seed(data, product, "balance_rel", 0), per_seed(data, product, "balance_rel")
    ratio = {k: [b / a if a else float("nan") for a, b in zip(first[k], last[k], strict=True)] for k in first}
    pos = [k for k in order if float(k) > 0]
    bad = [k for k in pos if not all(np.isfinite(ratio[k])) or max(ratio[k]) > p.vanish_ratio]
    v_van = "inconclusive" if not pos else ("not held" if bad else "held")
    verdict = combine([v_rate, v_van])
    reasons = [r for r in (r_rate and f"rate: {r_rate}",
                           bad and f"final/initial above {p.vanish_ratio:g} at lambda = {', '.join(bad)}") if r]
    lam_lr = {k: float(k) * p.lr for k in _keys(data)}
    tau_ratio = {k: float(np.mean(rates[k])) / (2 * lam_lr[k]) if lam_lr[k] > 0 else None for k in _keys(data)}
    return Claim(
        name=_name("balance_time_constant", product), source=BALANCE_SOURCE,
        statement=BALANCE_STATEMENT.replace("P^T P - W_V W_V^T", PBAL[product]), quote=BALANCE_QUOTE,
        rule=f"(1) paired trend of the fitted rate over the judged lambdas ({SPREAD_RULE}); (2) final/initial "
             f"relative imbalance <= {p.vanish_ratio:g} at every judged lambda > 0 and seed; fit window steps <= "
             f"{p.fit_until:g} x {p.steps}",
        measured={"decay_rate_per_step": _mean(rates), "decay_rate_per_seed": rates,
                  "time_constant_steps": {k: (1 / v if v > 0 else None) for k, v in _mean(rates).items()},
                  "rate_over_2_lambda_lr": tau_ratio, "final_over_initial": _mean(ratio),
                  "final_over_initial_per_seed": ratio, "rate_trend": info, "judged_lambdas": order,
                  "parts": {"rate_rises_with_lambda": v_rate, "vanishes": v_van}},
        expected=f"fitted decay rate rising with lambda beyond the seed spread, and final/initial <= "
                 f"{p.vanish_ratio:g} at every judged lambda > 0",
        verdict=verdict, reason="; ".join(reasons), tolerance=SPREAD_RULE, exposure=exposure_record(data, p),
        key=f"rate/step {series(_mean(rates))}; final/initial {series({k: max(v) for k, v in ratio.items()})} "
            f"(worst seed)",
        detail=f"balance_rel = ||A^T A - B^T B||_F / (||A^T A||_F + ||B^T B||_F) of layer 1's {PNAME[product]}, mean "
               "over heads; rate = slope of -log(balance_rel) against step (least squares over the window). "
               "rate_over_2_lambda_lr compares with plain gradient descent on L2, where the absolute imbalance decays "
               "like exp(-2 lambda lr t); under AdamW there is no such guarantee (the caption says so).")


def gap_vanishes(data: dict[str, Any], p: Fig2Params, product: str = "ov") -> Claim:
    """(bound − nuclear)/bound ≤ 1 % at the end (horizon ``p.steps``: kept from an earlier session that
    cut it back from 6,000 steps after the longer run disagreed, so not pre-registered; the horizon
    study, fixed before its runs, carries the long run), every seed, for every judged λ > 0."""
    order = [k for k in judged(data, p) if float(k) > 0]
    gap = per_seed(data, product, "gap_rel")
    bad = [k for k in order if not all(np.isfinite(gap[k])) or max(gap[k]) > GAP_TOL]
    if not order:
        verdict, reason = "inconclusive", f"no lambda > 0 reaches exposure {p.min_exposure:g}"
    else:
        verdict = "not held" if bad else "held"
        reason = f"gap above {GAP_TOL:g} of the bound at lambda = {', '.join(bad)}" if bad else ""
    return Claim(
        name=_name("gap_vanishes", product), source=GAP_SOURCE, statement=GAP_STATEMENT, quote=GAP_QUOTE,
        rule=f"(bound - nuclear)/bound <= {GAP_TOL:g} at step {p.steps} (horizon kept from an earlier session that cut it back from 6,000 steps after a longer run disagreed: not pre-registered; see fig2.balance_lasts), every seed, every "
             f"lambda > 0 with exposure >= {p.min_exposure:g}",
        measured={"final_gap_over_bound": _mean(gap), "final_gap_over_bound_per_seed": gap,
                  "initial_gap_over_bound": _mean(per_seed(data, product, "gap_rel", 0)), "judged_lambdas": order},
        expected=f"(bound - nuclear)/bound <= {GAP_TOL:g} at the end, every seed, for every judged lambda > 0",
        verdict=verdict, reason=reason, tolerance=f"{GAP_TOL:g} of the bound", exposure=exposure_record(data, p),
        key=f"gap/bound, {series(_mean(gap))}; worst seed " + (", ".join(f"{k}: {g3(max(gap[k]))}" for k in order) or "—"),
        detail=f"layer 1's {PNAME[product]}, mean over heads; lambda = 0 and lambdas below the exposure are shown, "
               "not judged.")


def qk_identical(data: dict[str, Any], p: Fig2Params, ov_claims: list[Claim] | None = None) -> Claim:
    """"Qualitative findings are identical when studying W_KᵀW_Q": the three judgements made on
    P W_V (rank falls, imbalance time constant, gap vanishes), made again on layer 1's W_KᵀW_Q,
    give the same verdicts. ``ov_claims``: those three OV claims where the caller has built them
    already (in that order), else they are built here."""
    fns = (rank_falls, balance_time_constant, gap_vanishes)
    ov = (dict(zip([f.__name__ for f in fns], ov_claims, strict=True)) if ov_claims is not None
          else {f.__name__: f(data, p, "ov") for f in fns})
    qk = {f.__name__: f(data, p, "qk") for f in fns}
    same = {n: ov[n].verdict == qk[n].verdict for n in ov}
    undecided = [n for n in ov if "inconclusive" in (ov[n].verdict, qk[n].verdict)]
    verdict = "inconclusive" if undecided else ("held" if all(same.values()) else "not held")
    reason = (f"inconclusive on one product for: {', '.join(undecided)}" if undecided
              else "" if verdict == "held" else "differs for: " + ", ".join(n for n, v in same.items() if not v))
    return Claim(
        name="fig2.qk_identical", source=GAP_SOURCE, quote=QK_QUOTE,
        statement="The three Figure 2 judgements (rank falls, imbalance vanishes with a time constant following "
                  "lambda, gap vanishes) give the same verdicts on layer 1's W_K^T W_Q as on P W_V.",
        rule="the same three rules as on P W_V, applied to W_K^T W_Q; held when every verdict matches, inconclusive "
             "when either product's verdict is inconclusive",
        measured={n: {"ov": ov[n].verdict, "qk": qk[n].verdict, "qk_key": qk[n].key, "qk_measured": qk[n].measured}
                  for n in ov},
        expected="identical verdicts on both products", verdict=verdict, reason=reason,
        exposure=exposure_record(data, p),
        key="; ".join(f"{n}: OV {ov[n].verdict}, QK {qk[n].verdict}" for n in ov),
        detail="QK = W_K,h^T W_Q,h per head of layer 1 (factors W_K^T, W_Q^T).")


def cumulative_lr(data: dict[str, Any], steps: list[int]) -> list[float]:
    """Σ_{s ≤ t} lr_s at each of ``steps``, from the runs' recorded schedule."""
    from headrank.training.config import lr_sums, recall_config

    c = data["config"]
    cum = lr_sums(recall_config(steps=c["steps"], lr=c["lr"], warmup=c["warmup"], schedule=c.get("schedule", "constant")))
    return [float(cum[min(t, c["steps"])]) for t in steps]


def _first_step(t: list[int], y: list[float], target: float) -> int | None:
    """First tracked step where ``y`` is at or below ``target`` (None: never)."""
    for step, v in zip(t, y, strict=True):
        if v is not None and v <= target:
            return int(step)
    return None


def _early_row(data: dict[str, Any], k: str, s: str) -> dict[str, Any]:
    """One run's early-stage facts: the steps (and exposures) where its relative imbalance reaches
    half its initial value and its effective rank reaches the fixed target (``EARLY_RANK_SHARE``
    of the way from its initial effective rank to 1)."""
    x = data["ov"][k][s][RANK_LAYER]
    t, b, r = x["step"], x["balance_rel"], x["effective_rank"]
    rank_target = r[0] - EARLY_RANK_SHARE * (r[0] - 1.0)
    sb, sr = _first_step(t, b, 0.5 * b[0]), _first_step(t, r, rank_target)
    cum = cumulative_lr(data, [v if v is not None else t[-1] for v in (sb, sr)])
    return {"seed": s, "balance_half_step": sb, "rank_target": rank_target, "rank_initial": r[0],
            "rank_final": r[-1], "rank_target_step": sr,
            "balance_half_exposure": float(k) * cum[0] if sb is not None else None,
            "rank_target_exposure": float(k) * cum[1] if sr is not None else None}


def early_stages(data: dict[str, Any], p: Fig2Params) -> Claim:
    """The abstract's "why such regularization on the matrix product affects early stages of
    training": at every judged λ > 0 and seed, within the first ``p.early_fraction`` of the steps
    (a fraction fixed in params), the relative imbalance falls to half its initial value and the
    effective rank falls ``EARLY_RANK_SHARE`` of the way from its initial value to 1 (the
    effective rank's minimum). Both targets are fixed by the run's step-0 state and a constant,
    not by where the run ends (a target relative to the run's own final rank made "early"
    self-fulfilling for a rank that plateaus). Steps and exposures recorded."""
    pos = [k for k in judged(data, p) if float(k) > 0]
    limit = p.early_fraction * p.steps
    measured = {k: [_early_row(data, k, s) for s in map(str, data["seeds"])] for k in pos}
    late = [f"{k}/seed {r['seed']}" for k, rows in measured.items() for r in rows
            if any(v is None or v > limit for v in (r["balance_half_step"], r["rank_target_step"]))]
    verdict = "inconclusive" if not pos else ("not held" if late else "held")
    worst = {k: max((p.steps + 1 if v is None else v for r in rows for v in (r["balance_half_step"],
                                                                           r["rank_target_step"])), default=None)
             for k, rows in measured.items()}
    return Claim(
        name="fig2.early_stages", source="paper, abstract", quote=EARLY_QUOTE,
        statement="With attention decay, the balance and the rank of layer 1's P W_V move early in training: within "
                  f"the first {p.early_fraction:.0%} of the steps the relative imbalance halves and the effective "
                  f"rank covers {EARLY_RANK_SHARE:.0%} of the way from its initial value to 1.",
        rule=f"at every lambda > 0 with exposure >= {p.min_exposure:g} and every seed, by step {limit:g} "
             f"(early_fraction {p.early_fraction:g} x {p.steps}): balance_rel <= 1/2 its step-0 value, and effective "
             f"rank <= r0 - {EARLY_RANK_SHARE:g} (r0 - 1), r0 its step-0 value (targets fixed by the initial state "
             "and constants, not by the run's end; this rank target was set in review after the stored runs existed, "
             "replacing 'half way to the run's own final rank')",
        measured=measured, expected=f"both steps <= {limit:g}", verdict=verdict,
        reason=("no lambda > 0 reaches the exposure" if not pos else
                f"a target reached later than step {limit:g} (or never) for: {', '.join(late)}" if late else ""),
        exposure=exposure_record(data, p),
        key="latest step reaching both targets " + ", ".join(
            f"lambda {k}: {'never' if v is not None and v > p.steps else v}" for k, v in worst.items())
            + f" (early: <= {limit:g} of {p.steps})",
        detail="Tracked every steps/40; exposure at a step = lambda x the summed learning rate up to it (warmup and "
               "cosine schedule included).")


def final_accuracy(data: dict[str, Any]) -> dict[str, list[float]]:
    """Per λ, per seed: mean of the last 10 % of the logged accuracies."""
    out = {}
    for k in _keys(data):
        out[k] = []
        for s in map(str, data["seeds"]):
            a = data["training"][k][s]["acc"]
            out[k].append(float(np.mean(a[-max(1, len(a) // 10):])))
    return out


def task_learned(data: dict[str, Any], p: Fig2Params) -> Claim:
    """A check of ours: final accuracy ≥ 0.9 at every λ and seed."""
    acc = final_accuracy(data)
    return Claim(
        name="fig2.task_learned", source=TASK_SOURCE, statement=TASK_STATEMENT, kind="check",
        rule=f"final accuracy >= {ACC_MIN:g} at every lambda and seed",
        measured={"final_accuracy": _mean(acc), "final_accuracy_per_seed": acc},
        expected=f"final accuracy >= {ACC_MIN:g} for every lambda and seed",
        held=all(a >= ACC_MIN for v in acc.values() for a in v), tolerance=f">= {ACC_MIN:g}",
        exposure=exposure_record(data, p), key=f"lowest final accuracy {g3(min(a for v in acc.values() for a in v))}",
        detail="accuracy on fresh batches (fully online: training batches are never repeated), mean of the "
               "last 10% of logged values; chance is 1/8 (guessing a value token), about 0.3 for guessing one of "
               "the values present in the sequence.")


def claims(data: dict[str, Any], p: Fig2Params) -> list[Claim]:
    """Every Figure 2 claim, in report order."""
    from headrank.studies.fig2 import horizon

    ov = [rank_falls(data, p), balance_time_constant(data, p), gap_vanishes(data, p)]
    return [*ov, qk_identical(data, p, ov), early_stages(data, p), *horizon.claims(data, p), task_learned(data, p)]
