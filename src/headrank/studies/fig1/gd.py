"""The mathematics of Figure 1 and Proposition 3.1 (the experiment; no claims here).

Figure 1 — gradient descent (step η) on two n×n factors with loss
``‖ABᵀ − D‖²_F + (λ/2)(‖A‖²_F + ‖B‖²_F)``. With ``G = 2(ABᵀ − D)`` the gradients are
``∇_A = GB + λA`` and ``∇_B = GᵀA + λB``. The discrepancy ``Δ = AᵀA − BᵀB`` obeys, exactly,

    Δ' = (1 − ηλ)² Δ + η² (BᵀGᵀGB − AᵀGGᵀA)          (docs/METHODS.md)
       = (1 − 2ηλ) Δ + η² (∇_Aᵀ∇_A − ∇_Bᵀ∇_B)          (same thing, regrouped)

(both checked numerically in tests/studies/test_fig1.py). Near the minimiser the rate differs
by mode (docs/METHODS.md, :func:`mode_rates`): an active mode (``d_i > λ/2``) shrinks its
discrepancy by ``1 − 2ηλ`` per step, a mode thresholded to zero (``d_i < λ/2``) by
``(1 − ηλ)² − 4η²d_i²``. The minimiser soft-thresholds the singular values of D:
``s_i = max(d_i − λ/2, 0)``. At the threshold ``λ = 2 d_i`` the balanced scalar mode obeys
``s' = s(1 − 2ηs)²``, so ``1/s`` grows by ``4η`` per step: it vanishes only algebraically.

Proposition 3.1 — balanced factors (``AᵀA = BᵀB``) have ``‖ABᵀ‖_* = ½(‖A‖² + ‖B‖²)``. Balanced
pairs are built independently of the proposition as ``B = QA`` with Q orthogonal; the
rescaled pair ``(cA, B/c)`` has the same product and a gap of exactly ``½(c − 1/c)²‖A‖²``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headrank.core.linalg import product_metrics


def soft_threshold_sv(d, lam: float) -> np.ndarray:
    """Singular values of the minimiser of ‖M − diag(d)‖² + λ‖M‖_*: ``max(d_i − λ/2, 0)``, descending."""
    return np.sort(np.maximum(np.asarray(d, dtype=np.float64) - lam / 2.0, 0.0))[::-1]


def mode_rates(d, lam: float, eta: float) -> list[dict[str, Any]]:
    """Per-step contraction factor of each mode's discrepancy near the minimiser (docs/METHODS.md).

    For every ``d_i``: ``active`` (``d_i > λ/2``): ``1 − 2ηλ``; ``thresholded`` (``d_i < λ/2``):
    ``(1 − ηλ)² − 4η²d_i²``; ``threshold`` (``λ = 2 d_i`` to 1e-12): ``None`` (the mode's
    singular value vanishes algebraically there, so its discrepancy has no geometric rate).
    """
    out = []
    for di in np.asarray(d, dtype=np.float64):
        if abs(lam - 2 * di) < 1e-12:
            out.append({"d": float(di), "mode": "threshold", "factor": None})
        elif di > lam / 2:
            out.append({"d": float(di), "mode": "active", "factor": 1 - 2 * eta * lam})
        else:
            out.append({"d": float(di), "mode": "thresholded", "factor": (1 - eta * lam) ** 2 - 4 * eta**2 * di**2})
    return out


def predicted_slope(d, lam: float, eta: float) -> dict[str, Any]:
    """The late per-step slope of log‖AᵀA − BᵀB‖: log of the slowest mode's factor (:func:`mode_rates`).

    Returns ``slope``, the setting mode's ``d`` and ``mode`` (``active``/``thresholded``) and every
    mode's factor; ``slope`` is None when some ``d_i = λ/2`` exactly (no geometric rate, ``mode``
    ``threshold``) or when λ ≤ 0 (nothing contracts).
    """
    rates = mode_rates(d, lam, eta)
    base = {"modes": rates}
    if lam <= 0:
        return {**base, "slope": None, "mode": "none", "d": None}
    thr = [r for r in rates if r["mode"] == "threshold"]
    if thr:
        return {**base, "slope": None, "mode": "threshold", "d": thr[0]["d"]}
    slow = max(rates, key=lambda r: abs(r["factor"]))
    return {**base, "slope": math.log(abs(slow["factor"])), "mode": slow["mode"], "d": slow["d"]}


def fig1_gradients(A: np.ndarray, B: np.ndarray, D: np.ndarray, lam) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``G = 2(ABᵀ − D)``, ``∇_A = GB + λA``, ``∇_B = GᵀA + λB`` (batched over leading dims).

    ``lam`` is a scalar or an array broadcastable against A, e.g. shape (L, 1, 1).
    """
    G = 2.0 * (A @ np.swapaxes(B, -1, -2) - D)
    return G, G @ B + lam * A, np.swapaxes(G, -1, -2) @ A + lam * B


def gd_step(A: np.ndarray, B: np.ndarray, D: np.ndarray, lam, eta: float) -> tuple[np.ndarray, np.ndarray]:
    """One gradient-descent step on ‖ABᵀ − D‖² + (λ/2)(‖A‖² + ‖B‖²)."""
    _, gA, gB = fig1_gradients(A, B, D, lam)
    return A - eta * gA, B - eta * gB


def discrepancy_next_reference(A, B, D, lam: float, eta: float) -> np.ndarray:
    """docs/METHODS.md: ``(1−ηλ)²Δ + η²(BᵀGᵀGB − AᵀGGᵀA)``, the predicted Δ after one step."""
    G, _, _ = fig1_gradients(A, B, D, lam)
    At, Bt, Gt = (np.swapaxes(x, -1, -2) for x in (A, B, G))
    delta = At @ A - Bt @ B
    return (1 - eta * lam) ** 2 * delta + eta**2 * (Bt @ Gt @ G @ B - At @ G @ Gt @ A)


def discrepancy_next_gradient_form(A, B, D, lam: float, eta: float) -> np.ndarray:
    """The same prediction regrouped: ``(1−2ηλ)Δ + η²(∇_Aᵀ∇_A − ∇_Bᵀ∇_B)``."""
    _, gA, gB = fig1_gradients(A, B, D, lam)
    At, Bt = np.swapaxes(A, -1, -2), np.swapaxes(B, -1, -2)
    delta = At @ A - Bt @ B
    return (1 - 2 * eta * lam) * delta + eta**2 * (np.swapaxes(gA, -1, -2) @ gA - np.swapaxes(gB, -1, -2) @ gB)


def recursion_error(A: np.ndarray, B: np.ndarray, D: np.ndarray, lam: float, eta: float) -> float:
    """Largest ``‖Δ_{t+1} − predicted‖_F / ‖A_{t+1}ᵀA_{t+1}‖_F`` along a trajectory A, B: (T+1, n, n)."""
    pred = discrepancy_next_reference(A[:-1], B[:-1], D, lam, eta)
    actual = np.swapaxes(A[1:], -1, -2) @ A[1:] - np.swapaxes(B[1:], -1, -2) @ B[1:]
    scale = np.linalg.norm(np.swapaxes(A[1:], -1, -2) @ A[1:], axis=(-2, -1))
    return float((np.linalg.norm(actual - pred, axis=(-2, -1)) / scale).max())


@dataclass
class GDRun:
    """Trajectories of gradient descent for several λ from one initialisation.

    ``A``, ``B``: (steps+1, len(lambdas), n, n), float64; index t is the iterate after t steps.
    """

    lambdas: np.ndarray
    d: np.ndarray
    eta: float
    steps: int
    A: np.ndarray
    B: np.ndarray


def fig1_init(n: int, init_scale: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Our choice: i.i.d. normal entries of standard deviation ``init_scale``, one draw for every λ."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, n)) * init_scale, rng.normal(size=(n, n)) * init_scale


def run_fig1_gd(lambdas, *, d, eta: float = 0.1, steps: int = 1000, init_scale: float = 0.5,
                seed: int = 0, keep: str = "all") -> GDRun:
    """Gradient descent for every λ in ``lambdas`` (batched), same initialisation for all.

    ``keep="all"`` stores every iterate; ``keep="last"`` only the start and the end.
    """
    lambdas = np.asarray(lambdas, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    D = np.diag(d)
    n, L = d.size, lambdas.size
    A0, B0 = fig1_init(n, init_scale, seed)
    A = np.broadcast_to(A0, (L, n, n)).copy()
    B = np.broadcast_to(B0, (L, n, n)).copy()
    lam = lambdas[:, None, None]
    if keep == "all":
        As = np.empty((steps + 1, L, n, n))
        Bs = np.empty_like(As)
        As[0], Bs[0] = A, B
    for t in range(1, steps + 1):
        A, B = gd_step(A, B, D, lam, eta)
        if keep == "all":
            As[t], Bs[t] = A, B
    if keep != "all":
        As, Bs = np.stack([np.broadcast_to(A0, (L, n, n)), A]), np.stack([np.broadcast_to(B0, (L, n, n)), B])
    return GDRun(lambdas=lambdas, d=d, eta=eta, steps=steps, A=As, B=Bs)


def discrepancy_norms(run: GDRun) -> np.ndarray:
    """‖AᵀA − BᵀB‖_F of every iterate: (steps+1, len(lambdas))."""
    At, Bt = np.swapaxes(run.A, -1, -2), np.swapaxes(run.B, -1, -2)
    return np.linalg.norm(At @ run.A - Bt @ run.B, axis=(-2, -1))


def mode_prediction(A: np.ndarray, B: np.ndarray, d, lam: float, eta: float, t1: int, t2: int) -> dict[str, Any]:
    """The slope of log‖Δ‖ over steps [t1, t2] predicted from the per-mode rates (:func:`mode_rates`).

    ``A``, ``B``: (T+1, n, n) with D = diag(d), so row i of A and B belongs to mode d_i. Δ(t1)
    is split into each thresholded row's ``a_iᵀa_i − b_iᵀb_i`` and the rest (the active rows,
    contracting by 1 − 2ηλ); each part is carried forward at its own factor and the predicted
    ‖Δ(t)‖ is fitted over [t1, t2] like the measured one. Also returns each part's share of the
    predicted ‖Δ(t2)‖ (``shares``, keyed ``active`` and ``thresholded d=…``). ``slope`` is None
    at an exact threshold (no geometric rate for that mode).
    """
    rates = mode_rates(d, lam, eta)
    if any(r["mode"] == "threshold" for r in rates):
        return {"slope": None, "shares": {}, "setting": "threshold"}
    delta = A[t1].T @ A[t1] - B[t1].T @ B[t1]
    parts: dict[str, tuple[np.ndarray, float]] = {}
    for i, r in enumerate(rates):
        if r["mode"] == "thresholded":
            di = np.outer(A[t1, i], A[t1, i]) - np.outer(B[t1, i], B[t1, i])
            parts[f"thresholded d={r['d']:g}"] = (di, r["factor"])
            delta = delta - di
    parts["active"] = (delta, 1 - 2 * eta * lam)
    t = np.arange(t1, t2 + 1)
    pred = sum(m[None] * (f ** (t - t1))[:, None, None] for m, f in parts.values())
    norms = np.linalg.norm(pred, axis=(-2, -1))
    end = {k: float(np.linalg.norm(m) * abs(f) ** (t2 - t1)) for k, (m, f) in parts.items()}
    total = sum(end.values()) or 1.0
    shares = {k: v / total for k, v in end.items()}
    return {"slope": float(np.polyfit(t, np.log(norms), 1)[0]), "shares": shares,
            "setting": max(shares, key=shares.get)}


def balance_fits(lambdas, *, d, eta: float, steps: int, init_scale: float, seeds, lo: float = 1e-10,
                 hi: float = 1e-4) -> list[list[dict[str, Any]]]:
    """Per seed and λ: :func:`fit_log_slope` of ‖AᵀA − BᵀB‖_F (window ``[lo, hi]`` of its start),
    with the per-mode prediction over the same window (:func:`mode_prediction`) under ``predicted``."""
    out = []
    for seed in seeds:
        run = run_fig1_gd(lambdas, d=d, eta=eta, steps=steps, init_scale=init_scale, seed=seed)
        bal = discrepancy_norms(run)
        row = []
        for j, lam in enumerate(run.lambdas):
            fit = fit_log_slope(bal[:, j], lo, hi)
            if fit["t_first"] is not None and lam > 0:
                fit["predicted"] = mode_prediction(run.A[:, j], run.B[:, j], d, float(lam), eta,
                                                   fit["t_first"], fit["t_last"])
            row.append(fit)
        out.append(row)
    return out


def run_metrics(run: GDRun) -> dict[str, np.ndarray]:
    """Singular values, nuclear norm, Frobenius bound, gap and balance of every iterate (linalg core)."""
    m = product_metrics(torch.from_numpy(run.A), torch.from_numpy(run.B))
    return {k: getattr(m, k).numpy() for k in ("sv", "nuclear", "frob_bound", "gap", "balance")}


def fit_log_slope(y, lo: float, hi: float, min_points: int = 10) -> dict[str, Any]:
    """Least-squares slope of ``log y_t`` against t over the steps where ``lo ≤ y_t/y_0 ≤ hi``.

    Returns slope (per step), the first and last step used and the number of points; slope is
    NaN when fewer than ``min_points`` steps fall in the window.
    """
    y = np.asarray(y, dtype=np.float64)
    r = y / y[0]
    t = np.arange(y.size)
    mask = (r >= lo) & (r <= hi) & (y > 0)
    if mask.sum() < min_points:
        return {"slope": float("nan"), "t_first": None, "t_last": None, "points": int(mask.sum())}
    slope = np.polyfit(t[mask], np.log(y[mask]), 1)[0]
    return {"slope": float(slope), "t_first": int(t[mask][0]), "t_last": int(t[mask][-1]), "points": int(mask.sum())}


def random_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Haar-distributed orthogonal matrix (QR of a Gaussian with the sign fix)."""
    q, r = np.linalg.qr(rng.normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def prop31_pairs(*, shapes=((5, 5), (16, 4), (64, 8), (8, 6)), per_shape: int = 50,
                 seed: int = 0, low_rank: tuple[int, int, int] | None = (8, 6, 3)) -> dict[str, np.ndarray]:
    """Balanced pairs ``B = QA`` (Q orthogonal), their rescalings ``(cA, B/c)`` and independent pairs.

    The shape ``low_rank[:2]`` uses factors of rank ``low_rank[2]`` (rank-deficient case). Metrics
    come from :func:`headrank.core.linalg.product_metrics`; the rescaled pairs' gap is compared
    with the closed form ``½(c − 1/c)²‖A‖²_F``.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {k: [] for k in ("shape", "nuclear_bal", "bound_bal", "c", "gap_scaled",
                                            "gap_scaled_closed", "bound_scaled", "gap_indep", "bound_indep")}
    for d, dh in shapes:
        for _ in range(per_shape):
            scale = math.exp(rng.uniform(-2, 2))
            if low_rank is not None and (d, dh) == tuple(low_rank[:2]):
                A = rng.normal(size=(d, low_rank[2])) @ rng.normal(size=(low_rank[2], dh)) * scale
            else:
                A = rng.normal(size=(d, dh)) * scale
            B = random_orthogonal(d, rng) @ A
            c = rng.uniform(1.05, 3.0)
            A2, B2 = rng.normal(size=(d, dh)) * scale, rng.normal(size=(d, dh)) * scale
            m = product_metrics(torch.from_numpy(np.stack([A, c * A, A2])), torch.from_numpy(np.stack([B, B / c, B2])))
            out["shape"].append([d, dh])
            out["nuclear_bal"].append(float(m.nuclear[0]))
            out["bound_bal"].append(float(m.frob_bound[0]))
            out["c"].append(c)
            out["gap_scaled"].append(float(m.gap[1]))
            out["gap_scaled_closed"].append(0.5 * (c - 1 / c) ** 2 * float((A**2).sum()))
            out["bound_scaled"].append(float(m.frob_bound[1]))
            out["gap_indep"].append(float(m.gap[2]))
            out["bound_indep"].append(float(m.frob_bound[2]))
    return {k: np.asarray(v) for k, v in out.items()}
