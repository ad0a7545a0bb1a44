"""Claims of the Figure 1 + Proposition 3.1 reproduction, judged from the stored data alone."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnrank.studies.fig1.gd import fit_log_slope
from attnrank.studies.fig1.params import Fig1Params
from attnrank.studies.registry import Claim

SRC_GAP = "paper Fig. 1 (left); §3"
SRC_RATE = "paper Fig. 1 (center left); REFERENCE.md §2 (GD recursion derived there)"
SRC_RECURSION = "REFERENCE.md §2 (derived there: 'verify numerically rather than trust')"
SRC_SOFT = "paper Fig. 1 (center right); REFERENCE.md §2"
SRC_THRESHOLD = "derived here (GD on the balanced scalar mode at lam = 2 d_i)"
SRC_PROP31 = "paper Prop. 3.1"
SRC_PROP31_GAP = "paper Prop. 3.1 / REFERENCE.md §1"

ST_GAP = ("For lam > 0 the gap between the Frobenius bound (1/2)(|A|^2+|B|^2) and the nuclear norm "
          "|AB^T|_* decays exponentially to 0; for lam = 0 it does not.")
ST_RATE = ("|A^T A - B^T B| vanishes exponentially with a rate proportional to lam; per gradient-descent "
           "step the predicted factor near stationarity is (1 - 2 eta lam).")
ST_RECURSION = ("Under gradient descent, A^TA - B^TB <- (1 - eta lam)^2 (A^TA - B^TB) + eta^2 (B^T G^T G B - "
                "A^T G G^T A), G = grad L(AB^T), holds exactly.")
ST_SOFT = ("The singular values of AB^T at the end of training are s_i = max(d_i - lam/2, 0): "
           "they decay linearly with lam until they vanish.")
ST_BALANCED = "If A^TA = B^TB then |AB^T|_* = (1/2)(|A|_F^2 + |B|_F^2)."
ST_UNBALANCED = ("Unbalanced factorizations have a strict gap: bound - nuclear > 0; for (cA, B/c) of a balanced "
                 "pair it is exactly (1/2)(c - 1/c)^2 |A|_F^2.")

GAP_WINDOW = (1e-9, 1e-3)
GAP_FINAL = 1e-8  # an algebraic decay would leave ~1e-3 after 1000 steps
GAP_KEPT = 0.1
RATE_TOL = 0.01
RECURSION_TOL = 1e-12
SOFT_TOL = 1e-4
THRESHOLD_TOL = 0.01
PROP31_TOL = 1e-12


def _e(x: float) -> str:
    """``1e-8`` rather than ``1e-08`` (powers of ten in prose)."""
    return f"{x:.0e}".replace("e-0", "e-").replace("e+0", "e")


def lam_key(lam: float) -> str:
    """``lam=0.25``: the key of a λ in measured/expected dicts."""
    return f"lam={lam:g}"


def gap_decay(data: dict[str, Any]) -> Claim:
    """fig1.gap_decay: gap ratio ≤ 1e-8 and negative log-slope for λ > 0; ≥ 0.1 kept for λ = 0."""
    meas, ok = {}, True
    for lam, row in zip(data["lambdas"], data["gap"], strict=True):
        gap = np.asarray(row, dtype=np.float64)
        fit = fit_log_slope(np.maximum(gap, 0.0), *GAP_WINDOW)
        ratio = float(gap[-1] / gap[0])
        meas[lam_key(lam)] = {"final/initial": ratio, "log_slope_per_step": fit["slope"]}
        ok &= bool(ratio <= GAP_FINAL and fit["slope"] < 0) if lam > 0 else bool(ratio >= GAP_KEPT)
    return Claim(
        name="fig1.gap_decay", source=SRC_GAP, statement=ST_GAP, measured=meas,
        expected=f"lam > 0: final/initial <= {_e(GAP_FINAL)} and log-slope < 0; lam = 0: final/initial >= {GAP_KEPT:g}",
        tolerance=f"thresholds as stated ({_e(GAP_FINAL)}: an algebraic decay would leave ~1e-3 after 1000 steps)",
        held=ok,
        detail=f"gap at t = {data['steps']} over gap at t = 0; slope = least-squares fit of log(gap) over the steps "
               f"where gap/gap_0 is in [{_e(GAP_WINDOW[0])}, {_e(GAP_WINDOW[1])}] (NaN when the gap never enters that "
               "window). Gap is computed as bound - nuclear in float64, so it bottoms out at rounding level (~1e-16).",
    )


def _slopes(fits: list[list[dict[str, Any]]]) -> np.ndarray:
    return np.array([[math.nan if f["slope"] is None else f["slope"] for f in row] for row in fits], dtype=np.float64)


def balance_rate(data: dict[str, Any]) -> Claim:
    """fig1.balance_rate: fitted late slope of ‖AᵀA − BᵀB‖ against log(1 − 2ηλ), every seed, 1%."""
    r = data["rates"]
    eta, pos = r["eta"], np.asarray(r["lambdas"], dtype=np.float64)
    slopes = _slopes(r["fits"])
    preds = np.log(1 - 2 * eta * pos)
    dev = np.abs(slopes / preds - 1)  # (seeds, lambdas)
    worst = np.argmax(dev, axis=0)
    small = ""
    if "small_step" in r:
        s2 = r["small_step"]
        dev2 = np.abs(_slopes(s2["fits"]) / np.log(1 - 2 * s2["eta"] * pos) - 1)
        small = (f" With a 5x smaller step (eta = {s2['eta']:g}, {s2['steps']} steps, same seeds) the largest "
                 f"deviation is {dev2.max():.2g} (at lam = {pos[int(np.argmax(dev2.max(axis=0)))]:g}): the excess "
                 "shrinks with eta, as a discretisation effect should.")
    dev_meas = {lam_key(lam): float(dev[:, k].max()) for k, lam in enumerate(pos)}
    flow = {lam_key(lam): round(float(-2 * eta * lam), 6) for lam in pos}
    lo, hi = r["window"]
    return Claim(
        name="fig1.balance_rate", source=SRC_RATE, statement=ST_RATE,
        measured={lam_key(lam): float(slopes[worst[k], k]) for k, lam in enumerate(pos)},
        expected={lam_key(lam): float(preds[k]) for k, lam in enumerate(pos)},
        tolerance="1% relative, every seed", held=bool(dev.max() <= RATE_TOL),
        detail=f"Measured: least-squares slope of log|A^TA - B^TB|_F per step over the steps where it is between "
               f"{_e(lo)} and {_e(hi)} of its start, for init seeds {r['seeds']}; shown is the seed farthest from the "
               f"prediction. Largest relative deviation per lam: {', '.join(f'{k}: {v:.2g}' for k, v in dev_meas.items())}. "
               "Expected: log(1 - 2 eta lam), from the exact recursion "
               "D' = (1-2 eta lam) D + eta^2 (gA^T gA - gB^T gB) (REFERENCE.md's form regrouped). Its driving term is "
               "quadratic in the gradient, so the prediction is exact only once the loss has converged; where the "
               "loss converges more slowly than the balance (large eta*lam, singular values close to a threshold) "
               "the eta^2 term slows the decay." + small + f" Gradient-flow rate -2 eta lam for comparison: {flow}.",
    )


def gd_recursion(data: dict[str, Any]) -> Claim:
    """fig1.gd_recursion: the REFERENCE.md §2 recursion reproduces every GD step to 1e-12."""
    err = data["recursion_error"]
    err = math.inf if err is None else float(err)
    return Claim(
        name="fig1.gd_recursion", source=SRC_RECURSION, statement=ST_RECURSION,
        measured=err, expected=0.0, tolerance=RECURSION_TOL, held=err <= RECURSION_TOL,
        detail="max over all steps and lam of |Delta_{t+1} - predicted|_F / |A^T A|_F, float64.",
    )


def _threshold_mask(lambdas: np.ndarray, d: np.ndarray, cf: np.ndarray) -> np.ndarray:
    """True at the one singular value per λ = 2 d_i exactly (index = number of positive closed-form values)."""
    mask = np.zeros_like(cf, dtype=bool)
    for j, lam in enumerate(lambdas):
        if any(abs(lam - 2 * di) < 1e-12 for di in d):
            mask[j, int((cf[j] > 0).sum())] = True
    return mask


def soft_threshold(data: dict[str, Any]) -> Claim:
    """fig1.soft_threshold: end singular values equal max(d_i − λ/2, 0) to 1e-4 (threshold case apart)."""
    lambdas, d = np.asarray(data["lambdas"]), np.asarray(data["d"])
    cf, final = np.asarray(data["sv_closed_form"]), np.asarray(data["sv_final"])
    max_err = float(np.abs(final - cf)[~_threshold_mask(lambdas, d, cf)].max())
    sweep = np.asarray(data["lambda_sweep"])
    sw_err = np.abs(np.asarray(data["sv_sweep_final"]) - np.asarray(data["sv_sweep_closed_form"])).max(axis=1)
    worst = int(np.argmax(sw_err))
    bad = sweep[sw_err > SOFT_TOL]
    at_threshold = all(np.isclose(b, 2 * d).any() for b in bad)
    steps = data["steps"]
    return Claim(
        name="fig1.soft_threshold", source=SRC_SOFT, statement=ST_SOFT,
        measured=max_err, expected=0.0, tolerance=SOFT_TOL, held=max_err <= SOFT_TOL,
        detail=f"max |s_i - max(d_i - lam/2, 0)| at t = {steps} over lam in {lambdas.tolist()} and all i, except the "
               "threshold case lam = 2 d_i exactly (lam = 0.4, d = 0.2), where convergence is algebraic (next claim). "
               f"On the {sweep.size}-point lam sweep of the figure the largest error at t = {steps} is "
               f"{sw_err[worst]:.3g} at lam = {sweep[worst]:g}; errors above 1e-4 occur at "
               f"lam = {[float(x) for x in bad]} ("
               + ("each exactly a threshold 2 d_i" if at_threshold else "at or next to a threshold 2 d_i, where "
                  "convergence slows down") + "). The caption's 'until lam >= s_i' should read lam >= 2 d_i for this loss.",
    )


def threshold_algebraic(data: dict[str, Any]) -> Claim:
    """fig1.threshold_algebraic: at λ = 2 d_i, 1/s of the vanishing mode grows by 4η per step (1%)."""
    lam, eta, steps = data["sv_traj_lambda"], data["eta"], data["steps"]
    j = [float(x) for x in data["lambdas"]].index(lam)
    k = int((np.asarray(data["sv_closed_form"][j]) > 0).sum())
    s = np.asarray(data["sv_traj"], dtype=np.float64)[:, k]
    half = np.arange(steps // 2, steps + 1)
    inv_slope = float(np.polyfit(half, 1.0 / s[half], 1)[0])
    d_thr = [di for di in data["d"] if abs(lam - 2 * di) < 1e-12]
    return Claim(
        name="fig1.threshold_algebraic", source=SRC_THRESHOLD,
        statement=f"At the threshold lam = 2 d_i (lam = {lam:g}, d = {d_thr[0] if d_thr else float('nan'):g}) the "
                  "singular value vanishes only algebraically: 1/s grows by 4 eta per step.",
        measured=inv_slope, expected=4 * eta, tolerance="1% relative",
        held=abs(inv_slope - 4 * eta) <= THRESHOLD_TOL * 4 * eta,
        detail=f"slope of 1/s_{k + 1}(t) over t in [{steps // 2}, {steps}]; s_{k + 1}({steps}) = {s[-1]:.3g} "
               f"(so the 1e-4 criterion of the previous claim cannot be met here at t = {steps}).",
    )


def prop31_balanced_equality(data: dict[str, Any]) -> Claim:
    """prop31.balanced_equality: |bound − nuclear|/bound ≤ 1e-12 on every balanced pair."""
    p = data["prop31"]
    bound, nuc = np.asarray(p["bound_bal"], dtype=np.float64), np.asarray(p["nuclear_bal"], dtype=np.float64)
    rel = np.abs(bound - nuc) / bound
    worst = float(rel.max()) if np.isfinite(rel).all() else math.inf
    return Claim(
        name="prop31.balanced_equality", source=SRC_PROP31, statement=ST_BALANCED,
        measured=worst, expected=0.0, tolerance=PROP31_TOL, held=worst <= PROP31_TOL,
        detail=f"{rel.size} random balanced pairs B = QA (Q Haar orthogonal), shapes (d, dh) in "
               "(5,5), (16,4), (64,8), (8,6; rank 3), scales e^U(-2,2); max relative |bound - nuclear| / bound "
               "via linalg.product_metrics (float64).",
    )


def prop31_unbalanced_gap(data: dict[str, Any]) -> Claim:
    """prop31.unbalanced_gap: every unbalanced pair has gap > 0; rescaled pairs match ½(c − 1/c)²‖A‖²."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in data["prop31"].items()}
    gap_rel_err = np.abs(p["gap_scaled"] - p["gap_scaled_closed"]) / p["bound_scaled"]
    min_gap = float(min((p["gap_scaled"] / p["bound_scaled"]).min(), (p["gap_indep"] / p["bound_indep"]).min()))
    return Claim(
        name="prop31.unbalanced_gap", source=SRC_PROP31_GAP, statement=ST_UNBALANCED,
        measured={"min gap/bound": min_gap, "max |gap - closed form|/bound": float(gap_rel_err.max())},
        expected={"min gap/bound": "> 0", "max |gap - closed form|/bound": 0.0},
        tolerance="closed form to 1e-12 relative", held=bool(min_gap > 0 and gap_rel_err.max() <= PROP31_TOL),
        detail=f"{p['c'].size} rescaled pairs (c ~ U(1.05, 3)) and {p['c'].size} independent Gaussian pairs.",
    )


def claims(data: dict[str, Any], params: Fig1Params) -> list[Claim]:
    """Every Figure 1 and Proposition 3.1 claim, in report order."""
    return [gap_decay(data), balance_rate(data), gd_recursion(data), soft_threshold(data),
            threshold_algebraic(data), prop31_balanced_equality(data), prop31_unbalanced_gap(data)]
