"""The claims of Figure 2 (REFERENCE.md §3), judged from the stored data alone.

Runs of one seed share initialisation and data order, so the comparisons over λ are paired.
A λ > 0 is judged only when its decay exposure λ·Σlr reaches ``Fig2Params.min_exposure``;
runs with less are reported, not judged; λ = 0 is the control. A trend over λ is judged by a
tie-aware test (:func:`trend`), not by a rank correlation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnrank.studies.fig2.params import Fig2Params
from attnrank.studies.registry import Claim, g3, series

RANK_LAYER = "0"  # the paper's "layer 1"
GAP_TOL = 0.01
ACC_MIN = 0.9
TAU = 1e-3  # the tracker's numerical-rank threshold
FLOOR_MARGIN = 2.0  # the second threshold: this many times the measured noise floor

RANK_SOURCE = "paper Fig. 2 (left)"
RANK_STATEMENT = ("The rank of P W_V in layer 1 at the end of training decreases as the attention decay grows "
                  "(effective rank, at >= 5 time constants of decay exposure).")
BALANCE_SOURCE = "paper Fig. 2 (middle); §3 (imbalance decays like e^{-2 lambda t})"
BALANCE_STATEMENT = ("The relative balance discrepancy ||P^T P - W_V W_V^T|| / (||P^T P|| + ||W_V W_V^T||) "
                     "decays faster for larger attention decay.")
GAP_SOURCE = "paper Fig. 2 (right); Prop. 3.1"
GAP_STATEMENT = ("With attention decay the Frobenius bound 1/2(|P|^2+|W_V|^2) approaches the nuclear norm "
                 "|P W_V|_* (the gap goes to 0) once the decay has had >= 5 time constants.")
TASK_SOURCE = "issue 5 (a rank drop means little if the task is not learned)"
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
    """Tie-aware test that ``values`` fall along ``order`` (per key, one value per seed, paired by
    seed). Spread = the largest range over seeds of any key. Held: every step non-increasing
    within the spread, and the end-to-end drop larger than the spread and present in every seed.
    Not held: no end-to-end drop (a tie or a rise), or a step up beyond the spread. Otherwise
    (a drop inside the spread) inconclusive. Returns (verdict, reason, numbers)."""
    if len(order) < 2:
        return "inconclusive", "fewer than two judged decay strengths", {}
    v = {k: np.asarray(values[k], dtype=float) for k in order}
    spread = max(float(np.ptp(x)) for x in v.values())
    end = v[order[-1]] - v[order[0]]  # paired by seed
    step_up = max(float(np.max(v[b] - v[a])) for a, b in zip(order, order[1:], strict=False))
    info = {"end_to_end_change_per_seed": end.tolist(), "largest_step_up": step_up, "seed_spread": spread}
    mean_end = float(end.mean())
    if mean_end >= 0:
        return "not held", f"no drop from lambda={order[0]} to lambda={order[-1]} (change {mean_end:+.3g})", info
    if step_up > spread:
        return "not held", f"rises by {step_up:.3g} between neighbouring lambdas, beyond the seed spread {spread:.3g}", info
    if -mean_end <= spread or np.any(end >= 0):
        return "inconclusive", f"drop {-mean_end:.3g} is inside the seed spread {spread:.3g}", info
    return "held", "", info


def noise_floor(data: dict[str, Any]) -> float:
    """The AdamW noise floor, measured: the largest σ_min/σ_1 over the layer-1 P W_V heads that
    the λ = 0 runs leave (their weakest direction is one the task never uses; without decay it
    sits there, not at 0)."""
    zero = _keys(data)[data["lambdas"].index(0.0)] if 0.0 in data["lambdas"] else _keys(data)[0]
    ratios = [h[-1] / h[0] for s in map(str, data["seeds"])
              for h in data["sv"]["ov"][zero][s][int(RANK_LAYER)] if h[0] and h[0] > 0]
    return float(max(ratios))


def numerical_rank(data: dict[str, Any], tau: float) -> dict[str, float]:
    """Per λ: #{σ_i > τ σ_1} of layer-1 P W_V, mean over heads and seeds."""
    out = {}
    for k in _keys(data):
        heads = [np.asarray(h, float) for s in map(str, data["seeds"]) for h in data["sv"]["ov"][k][s][int(RANK_LAYER)]]
        out[k] = float(np.mean([np.sum(h > tau * h[0]) for h in heads]))
    return out


def _mean(d: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in d.items()}


def rank_falls(data: dict[str, Any], p: Fig2Params) -> Claim:
    """Final effective rank of layer-1 P W_V falls over the judged λ (:func:`trend`); numerical
    ranks at τ = 1e-3 and at twice the measured noise floor are reported beside it."""
    order = judged(data, p)
    eff = per_seed(data, "ov", "effective_rank")
    verdict, reason, info = trend(eff, order)
    floor = noise_floor(data)
    tau_floor = FLOOR_MARGIN * floor
    return Claim(
        name="fig2.rank_falls", source=RANK_SOURCE, statement=RANK_STATEMENT,
        measured={"final_effective_rank": _mean(eff), "final_effective_rank_per_seed": eff, **info,
                  "judged_lambdas": order,
                  "numerical_rank_tau_1e-3": numerical_rank(data, TAU),
                  "noise_floor_sigma_min_over_sigma_1_at_lambda_0": floor,
                  "tau_above_noise_floor": tau_floor, "numerical_rank_tau_above_floor": numerical_rank(data, tau_floor),
                  "qk_final_effective_rank": _mean(per_seed(data, "qk", "effective_rank"))},
        expected="effective rank non-increasing over the judged lambdas within the seed spread, and lower at the "
                 "largest than at lambda = 0 beyond it in every seed",
        verdict=verdict, reason=reason, tolerance="seed spread (largest range over seeds)",
        exposure=exposure_record(data, p), key=f"effective rank, {series(_mean(eff))}; seed spread {g3(info.get('seed_spread'))}",
        detail=f"exp(entropy of sigma/sum sigma) of P_h W_V,h, mean over the heads of layer 1 "
               f"(head dim {data['config']['model']['head_dim']}), step {p.steps}, seeds {list(p.seeds)} "
               f"(paired: a seed's runs share initialisation and data). Numerical ranks #{{sigma_i > tau sigma_1}} are "
               f"means over heads and seeds, reported, not judged; the noise floor is the largest sigma_min/sigma_1 "
               f"the lambda = 0 runs leave in a layer-1 head.")


def balance_decays_faster(data: dict[str, Any], p: Fig2Params) -> Claim:
    """Final/initial relative discrepancy falls over the judged λ (:func:`trend`)."""
    order = judged(data, p)
    first, last = per_seed(data, "ov", "balance_rel", 0), per_seed(data, "ov", "balance_rel")
    ratio = {k: [b / a for a, b in zip(first[k], last[k], strict=True)] for k in first}
    verdict, reason, info = trend(ratio, order)
    return Claim(
        name="fig2.balance_decays_faster", source=BALANCE_SOURCE, statement=BALANCE_STATEMENT,
        measured={"final_over_initial": _mean(ratio), "final_over_initial_per_seed": ratio, **info,
                  "judged_lambdas": order, "final_balance_rel": _mean(last),
                  "qk_final_balance_rel": _mean(per_seed(data, "qk", "balance_rel"))},
        expected="final/initial non-increasing over the judged lambdas within the seed spread, and lower at the "
                 "largest than at lambda = 0 beyond it in every seed",
        verdict=verdict, reason=reason, tolerance="seed spread (largest range over seeds)",
        exposure=exposure_record(data, p), key=f"final/initial, {series(_mean(ratio))}; seed spread {g3(info.get('seed_spread'))}",
        detail="balance_rel = ||P_h^T P_h - W_V,h W_V,h^T||_F / (||P_h^T P_h||_F + ||W_V,h W_V,h^T||_F), mean over the "
               f"heads of layer 1; final = step {p.steps}, initial = step 0 (the same initialisation for every lambda "
               "of a seed). The absolute discrepancy would fall with any uniform shrinkage; the relative one does not.")


def gap_vanishes(data: dict[str, Any], p: Fig2Params) -> Claim:
    """(bound − nuclear)/bound ≤ 1 % at the end, every seed, for every judged λ > 0."""
    order = [k for k in judged(data, p) if float(k) > 0]
    gap = per_seed(data, "ov", "gap_rel")
    bad = [k for k in order if max(gap[k]) > GAP_TOL]
    if not order:
        verdict, reason = "inconclusive", f"no lambda > 0 reaches exposure {p.min_exposure:g}"
    else:
        verdict = "not held" if bad else "held"
        reason = f"gap above {GAP_TOL:g} of the bound at lambda = {', '.join(bad)}" if bad else ""
    return Claim(
        name="fig2.gap_vanishes", source=GAP_SOURCE, statement=GAP_STATEMENT,
        measured={"final_gap_over_bound": _mean(gap), "final_gap_over_bound_per_seed": gap,
                  "initial_gap_over_bound": _mean(per_seed(data, "ov", "gap_rel", 0)), "judged_lambdas": order,
                  "qk_final_gap_over_bound": _mean(per_seed(data, "qk", "gap_rel"))},
        expected=f"(bound - nuclear)/bound <= {GAP_TOL:g} at the end, every seed, for every judged lambda > 0",
        verdict=verdict, reason=reason, tolerance=f"{GAP_TOL:g} of the bound", exposure=exposure_record(data, p),
        key=f"gap/bound, {series(_mean(gap))}; worst seed " + (", ".join(f"{k}: {g3(max(gap[k]))}" for k in order) or "—"),
        detail="mean over the heads of layer 1; lambda = 0 and lambdas below the exposure are shown, not judged.")


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
    """Final accuracy ≥ 0.9 at every λ and seed."""
    acc = final_accuracy(data)
    return Claim(
        name="fig2.task_learned", source=TASK_SOURCE, statement=TASK_STATEMENT,
        measured={"final_accuracy": _mean(acc), "final_accuracy_per_seed": acc},
        expected=f"final accuracy >= {ACC_MIN:g} for every lambda and seed",
        held=all(a >= ACC_MIN for v in acc.values() for a in v), tolerance=f">= {ACC_MIN:g}",
        exposure=exposure_record(data, p), key=f"lowest final accuracy {g3(min(a for v in acc.values() for a in v))}",
        detail="accuracy on fresh batches (fully online: training batches are never repeated), mean of the "
               "last 10% of logged values; chance is 1/8 (guessing a value token), about 0.3 for guessing one of "
               "the values present in the sequence.")


def claims(data: dict[str, Any], p: Fig2Params) -> list[Claim]:
    """Every Figure 2 claim, in report order."""
    return [rank_falls(data, p), balance_decays_faster(data, p), gap_vanishes(data, p), task_learned(data, p)]
