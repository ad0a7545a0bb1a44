"""The Figure 1 + Proposition 3.1 experiment: gradient descent on 5×5 factors and random pairs."""

from __future__ import annotations

from typing import Any

import numpy as np

from headrank.studies.fig1.gd import (
    balance_fits,
    prop31_pairs,
    recursion_error,
    run_fig1_gd,
    run_metrics,
    soft_threshold_sv,
)
from headrank.studies.fig1.minima import local_minima
from headrank.studies.fig1.params import Fig1Params


def lambda_sweep(p: Fig1Params) -> np.ndarray:
    """The λ grid of the singular-value panel: 0, step, …, ``sweep_max``."""
    return np.round(np.arange(0.0, p.sweep_max + 1e-9, p.sweep_step), 10)


def _rates(p: Fig1Params, pos: np.ndarray) -> dict[str, Any]:
    """Fitted late slopes of ‖AᵀA − BᵀB‖_F for λ > 0, every rate seed (and the small-step repeat)."""
    lo, hi = p.rate_window
    out: dict[str, Any] = {"lambdas": pos, "seeds": list(p.rate_seeds), "window": [lo, hi], "eta": p.eta,
                           "fits": balance_fits(pos, d=p.d, eta=p.eta, steps=p.steps, init_scale=p.init_scale,
                                                seeds=p.rate_seeds, lo=lo, hi=hi)}
    if p.small_step > 1:
        eta2 = p.eta / p.small_step
        out["small_step"] = {"eta": eta2, "steps": p.small_step * p.steps,
                             "fits": balance_fits(pos, d=p.d, eta=eta2, steps=p.small_step * p.steps,
                                                  init_scale=p.init_scale, seeds=p.rate_seeds, lo=lo, hi=hi)}
    return out


def run(p: Fig1Params) -> dict[str, Any]:
    """Run gradient descent for every λ (all iterates), the λ sweep (end points), the rate seeds,
    the Prop. 3.1 pairs and the local-minima cases; return the series the claims and figures read."""
    lambdas = np.asarray(p.lambdas, dtype=np.float64)
    d = np.asarray(p.d, dtype=np.float64)
    gd = run_fig1_gd(lambdas, d=d, eta=p.eta, steps=p.steps, init_scale=p.init_scale, seed=p.seed)
    met = run_metrics(gd)
    sweep = lambda_sweep(p)
    sw = run_fig1_gd(sweep, d=d, eta=p.eta, steps=p.steps, init_scale=p.init_scale, seed=p.seed, keep="last")
    rec_err = max(recursion_error(gd.A[:, j], gd.B[:, j], np.diag(d), lam, p.eta) for j, lam in enumerate(lambdas))
    j = int(np.where(lambdas == p.lam_traj)[0][0])
    pairs = prop31_pairs(shapes=p.prop31_shapes, per_shape=p.prop31_per_shape, seed=p.prop31_seed,
                         low_rank=p.prop31_low_rank)
    return {
        "t": np.arange(p.steps + 1), "lambdas": lambdas, "d": d, "eta": p.eta, "steps": p.steps, "seed": p.seed,
        "gap": met["gap"].T, "balance": met["balance"].T, "nuclear": met["nuclear"].T,
        "frob_bound": met["frob_bound"].T,
        "sv_final": met["sv"][-1], "sv_closed_form": np.stack([soft_threshold_sv(d, lam) for lam in lambdas]),
        "lambda_sweep": sweep, "sv_sweep_final": run_metrics(sw)["sv"][-1],
        "sv_sweep_closed_form": np.stack([soft_threshold_sv(d, lam) for lam in sweep]),
        "sv_traj_lambda": p.lam_traj, "sv_traj": met["sv"][:, j],
        "recursion_error": rec_err,
        "rates": _rates(p, lambdas[lambdas > 0]),
        "prop31": pairs,
        "minima": {"cases": local_minima(p.minima_targets, p.minima_lambdas, p.minima_inits, p.minima_seeds,
                                         eta=p.minima_eta, steps=p.minima_steps),
                   "eta": p.minima_eta, "steps": p.minima_steps},
    }
