"""The claims of Figure 2 (REFERENCE.md §3), judged from the stored data alone."""

from __future__ import annotations

from typing import Any

import numpy as np

from attnrank.studies.fig2.params import Fig2Params
from attnrank.studies.registry import Claim

RANK_LAYER = "0"  # the paper's "layer 1"
GAP_TOL = 0.01
ACC_MIN = 0.9
RHO_MAX = -0.9

RANK_SOURCE = "paper Fig. 2 (left)"
RANK_STATEMENT = "The rank of P W_V in layer 1 at the end of training decreases as the attention decay grows."
BALANCE_SOURCE = "paper Fig. 2 (middle); §3 (imbalance decays like e^{-2 lambda t})"
BALANCE_STATEMENT = "The balance discrepancy ||P^T P - W_V W_V^T|| decays faster for larger attention decay."
GAP_SOURCE = "paper Fig. 2 (right); Prop. 3.1"
GAP_STATEMENT = ("With attention decay the Frobenius bound 1/2(|P|^2+|W_V|^2) approaches the nuclear norm "
                 "|P W_V|_* (the gap goes to 0).")
TASK_SOURCE = "issue 5 (a rank drop means little if the task is not learned)"
TASK_STATEMENT = "The model learns associative recall at every attention decay of the grid."


def _keys(data: dict[str, Any]) -> list[str]:
    return [f"{lam:g}" for lam in data["lambdas"]]


def final(data: dict[str, Any], key: str, product: str, metric: str) -> float:
    """Last tracked value of ``metric`` (layer 1 of the paper) for run ``key``."""
    return data[product][key][RANK_LAYER][metric][-1]


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's ρ (NaN when every y ties)."""
    from scipy.stats import spearmanr

    if len(set(y)) < 2:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def final_accuracy(data: dict[str, Any]) -> dict[str, float]:
    """Per λ: mean of the last 10 % of the logged accuracies."""
    out = {}
    for k in _keys(data):
        a = data["training"][k]["acc"]
        out[k] = float(np.mean(a[-max(1, len(a) // 10):]))
    return out


def rank_falls(data: dict[str, Any], p: Fig2Params) -> Claim:
    """Final numerical rank of layer-1 P W_V against λ: Spearman ρ ≤ −0.9."""
    keys, lams = _keys(data), data["lambdas"]
    rank = {k: final(data, k, "ov", "rank") for k in keys}
    eff = {k: final(data, k, "ov", "effective_rank") for k in keys}
    rho = spearman(lams, [rank[k] for k in keys])
    return Claim(
        name="fig2.rank_falls", source=RANK_SOURCE, statement=RANK_STATEMENT,
        measured={"spearman_rho": rho, "final_mean_rank": rank, "final_mean_effective_rank": eff,
                  "spearman_rho_effective_rank_not_judged": spearman(lams, [eff[k] for k in keys]),
                  "final_accuracy": final_accuracy(data),
                  "qk_final_mean_rank": {k: final(data, k, "qk", "rank") for k in keys}},
        expected="Spearman rho(lambda, final rank) <= -0.9", held=bool(rho <= RHO_MAX), tolerance="rho <= -0.9",
        detail=f"numerical rank #{{sigma_i > 1e-3 sigma_1}} of P_h W_V,h, mean over the 4 heads of layer 1 "
               f"(head dim {data['config']['model']['head_dim']}), at step {p.steps}; NaN rho when all ranks tie.")


def balance_decays_faster(data: dict[str, Any], p: Fig2Params) -> Claim:
    """Final/initial absolute discrepancy against λ: Spearman ρ ≤ −0.9."""
    keys = _keys(data)
    ratio, slope = {}, {}
    for k in keys:
        b = np.asarray(data["ov"][k][RANK_LAYER]["balance"])
        s = np.asarray(data["ov"][k][RANK_LAYER]["step"], dtype=float)
        ratio[k] = float(b[-1] / b[0])
        half = s >= s[-1] / 2
        slope[k] = float(np.polyfit(s[half], np.log(np.maximum(b[half], 1e-300)), 1)[0])
    rho = spearman(data["lambdas"], [ratio[k] for k in keys])
    return Claim(
        name="fig2.balance_decays_faster", source=BALANCE_SOURCE, statement=BALANCE_STATEMENT,
        measured={"spearman_rho": rho, "final_over_initial": ratio, "log_slope_second_half_per_step": slope},
        expected="Spearman rho(lambda, final/initial) <= -0.9", held=bool(rho <= RHO_MAX), tolerance="rho <= -0.9",
        detail="||P_h^T P_h - W_V,h W_V,h^T||_F, mean over the heads of layer 1; final/initial = step "
               f"{p.steps} over step 0; the slope is a least-squares fit of log(discrepancy) over the second half.")


def gap_vanishes(data: dict[str, Any], p: Fig2Params) -> Claim:
    """(bound − nuclear)/bound ≤ 1 % at the end for every λ > 0."""
    keys = _keys(data)
    gap_final = {k: final(data, k, "ov", "gap_rel") for k in keys}
    gap_init = {k: data["ov"][k][RANK_LAYER]["gap_rel"][0] for k in keys}
    positive = [k for k, lam in zip(keys, data["lambdas"], strict=True) if lam > 0]
    held = bool(positive) and all(gap_final[k] <= GAP_TOL for k in positive)
    return Claim(
        name="fig2.gap_vanishes", source=GAP_SOURCE, statement=GAP_STATEMENT,
        measured={"final_gap_over_bound": gap_final, "initial_gap_over_bound": gap_init,
                  "qk_final_gap_over_bound": {k: final(data, k, "qk", "gap_rel") for k in keys}},
        expected=f"(bound - nuclear)/bound <= {GAP_TOL:g} at the end for every lambda > 0", held=held,
        tolerance=f"{GAP_TOL:g} of the bound",
        detail="mean over the heads of layer 1; lambda = 0 is shown for comparison, not judged.")


def task_learned(data: dict[str, Any], p: Fig2Params) -> Claim:
    """Final accuracy ≥ 0.9 at every λ."""
    acc = final_accuracy(data)
    return Claim(
        name="fig2.task_learned", source=TASK_SOURCE, statement=TASK_STATEMENT,
        measured=acc, expected=f"final accuracy >= {ACC_MIN:g} for every lambda",
        held=all(a >= ACC_MIN for a in acc.values()), tolerance=f">= {ACC_MIN:g}",
        detail="accuracy on fresh batches (fully online: training batches are never repeated), mean of the "
               "last 10% of logged values; chance is 1/8 (guessing a value token), about 0.3 for guessing one of "
               "the values present in the sequence.")


def claims(data: dict[str, Any], p: Fig2Params) -> list[Claim]:
    """Every Figure 2 claim, in report order."""
    return [rank_falls(data, p), balance_decays_faster(data, p), gap_vanishes(data, p), task_learned(data, p)]
