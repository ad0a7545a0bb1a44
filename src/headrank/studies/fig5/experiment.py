"""The Figure 5 experiment: AdamW and Adam + L2 on the 2-D toy, direct and factorized, over ε and λ_wd."""

from __future__ import annotations

from typing import Any

import numpy as np

from headrank.studies.fig5.adam import adam_batch, direct_grad, factorized_grad, to_w
from headrank.studies.fig5.geometry import (
    Circle,
    adamw_fixed_point,
    l1_regularised_optimum,
    l2_regularised_optimum,
)
from headrank.studies.fig5.params import Fig5Params


def circle(p: Fig5Params) -> Circle:
    """The curve S of the parameters."""
    return Circle(center=tuple(p.center), radius=p.radius)


def configs(p: Fig5Params) -> list[dict[str, Any]]:
    """The ε sweep at ``lam_main``, the λ_wd sweep at ``eps_main`` and the point ``disc`` where the
    conjecture is judged, both optimisers each."""
    cfgs = [{"eps": e, "lam_wd": p.lam_main, "opt": opt} for e in p.eps_sweep for opt in ("adamw", "adam_l2")]
    cfgs += [{"eps": p.eps_main, "lam_wd": lw, "opt": opt} for lw in p.wd_sweep if lw != p.lam_main
             for opt in ("adamw", "adam_l2")]
    cfgs += [{"eps": p.disc[1], "lam_wd": p.disc[0], "opt": opt} for opt in ("adamw", "adam_l2")]
    return cfgs


def fig5_runs(p: Fig5Params, lr: float, steps: int, cfgs: list[dict], factorized: bool,
              record_every: int) -> dict[str, np.ndarray]:
    """Every configuration at one learning rate, batched: end points, recorded w, tail spread.

    Tail spread: the largest coordinate range of w over the last 10% of the recorded trajectory.
    """
    S, w0 = circle(p), np.asarray(p.w0, dtype=np.float64)
    if factorized:
        skew = np.asarray(p.factor_skew)
        x0, grad = np.concatenate([np.sqrt(w0) * skew, np.sqrt(w0) / skew]), factorized_grad(S)
    else:
        x0, grad = w0, direct_grad(S)
    eps = np.array([c["eps"] for c in cfgs])
    wd = np.array([c["lam_wd"] if c["opt"] == "adamw" else 0.0 for c in cfgs])
    l2 = np.array([c["lam_wd"] * c["eps"] if c["opt"] == "adam_l2" else 0.0 for c in cfgs])
    x, rec = adam_batch(grad, np.tile(x0, (len(cfgs), 1)), lr=lr, eps=eps, l2=l2, wd=wd, steps=steps,
                        record_every=record_every, betas=tuple(p.betas))
    w_rec = to_w(rec)
    tail = w_rec[-max(2, w_rec.shape[0] // 10):]
    return {"x_final": x, "w_final": to_w(x), "w_traj": w_rec, "tail_spread": np.ptp(tail, axis=0).max(axis=1)}


def _row(S: Circle, c: dict, lr: float, steps: int, kind: str, w: np.ndarray, spread: float) -> dict[str, Any]:
    factorized = kind == "factorized"
    lam_eff = c["lam_wd"] * c["eps"]
    target = l1_regularised_optimum(S, lam_eff) if factorized else l2_regularised_optimum(S, lam_eff)
    row = {**c, "lr": lr, "steps": steps, "kind": kind, "lam_equiv": lam_eff, "w_final": w,
           "tail_spread": float(spread), "target": target, "dist_target": float(np.linalg.norm(w - target))}
    if c["opt"] == "adamw":
        fp = adamw_fixed_point(S, c["lam_wd"], c["eps"], factorized=factorized)
        row["fixed_point"] = fp
        row["dist_fixed_point"] = float(np.linalg.norm(w - fp))
    return row


def run(p: Fig5Params) -> dict[str, Any]:
    """Run every configuration at every learning rate, direct and factorized; return the end points,
    their targets (conjectured optimum, exact AdamW fixed point), tail spreads and the figure's
    trajectories."""
    S, cfgs = circle(p), configs(p)
    rows: list[dict[str, Any]] = []
    traj: dict[str, Any] = {}
    lr0 = p.schedules[0][0]
    for lr, steps, rec_every in p.schedules:
        for kind in ("direct", "factorized"):
            r = fig5_runs(p, lr, steps, cfgs, kind == "factorized", rec_every)
            for i, c in enumerate(cfgs):
                rows.append(_row(S, c, lr, steps, kind, r["w_final"][i], r["tail_spread"][i]))
                if lr == lr0 and c["lam_wd"] == p.lam_main and c["eps"] in p.traj_eps:
                    traj[f"{kind}/{c['opt']}/eps={c['eps']:g}"] = r["w_traj"][:, i]
    lam_eq = p.lam_main * p.eps_main
    return {
        "S": {"center": S.center, "radius": S.radius},
        "min_l2_point_on_S": S.min_l2_point(), "min_l1_point_on_S": S.min_l1_point(),
        "l2_optimum_main": l2_regularised_optimum(S, lam_eq), "l1_optimum_main": l1_regularised_optimum(S, lam_eq),
        "runs": rows,
        "trajectories": traj,
        "traj_optima": {f"eps={e:g}": {"l2": l2_regularised_optimum(S, p.lam_main * e),
                                       "l1": l1_regularised_optimum(S, p.lam_main * e)} for e in p.traj_eps},
    }
