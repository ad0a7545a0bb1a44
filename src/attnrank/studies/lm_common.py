"""Shared by the fig3 and table1 studies (and fig4's own LMs): the CPU-scale LM and ViT
configurations (*our choice*; the paper's Pile LMs and ImageNet ViTs are far beyond this
scale), one sweep call through :func:`attnrank.training.sweep.run_sweep`, decay exposure and
the λ that gives a target exposure, paired (same-seed) comparisons with three-way verdicts,
the tie-aware trend test, ranks from exact spectra, and the AdamW noise floor.

With ``workers > 1`` the sweeps go to spawned processes: a calling script needs the usual
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

OTHER_WD = 0.1
PRODUCTS = ("qk", "ov")
LOW_TOL = 1e-3  # the tracker's numerical-rank threshold
FLOOR_FACTOR = 2.0  # τ above the noise floor: this many times the measured relative floor
#: decay exposure λ·Σlr of λ = 0.1 in LLaMA-2-7B pretraining (peak lr 3e-4, cosine, ~500k steps;
#: REFERENCE.md §3): the exposure "λ = 0.1" stands for in the paper's setting
PRETRAIN_EXPOSURE = 8.0
#: time constants a decay effect needs before it is judged (issue 16)
MIN_EXPOSURE = 3.0
#: how every paired spread is measured (the claims' tolerance text)
SPREAD = "spread: 2 standard errors of the mean same-seed difference (std over seeds, ddof 1, / sqrt(n))"


def lm_base(steps: int, max_chars: int = 200_000, eval_tokens: int = 16_384) -> dict[str, Any]:
    """Flat overrides of the LM runs: the default LM (4 pre-norm causal layers, width 64, 4 heads
    of 16, MLP 256, byte tokens, context 64, batch 32, AdamW lr 3e-3, β = (0.9, 0.95)), the first
    ``max_chars`` characters of each split of the stdlib corpus, ``eval_tokens`` scored per split."""
    return {"steps": steps, "max_chars": max_chars, "eval_tokens": eval_tokens, "track_every": steps,
            "log_every": max(steps // 10, 10), "checkpoint_every": steps}


def vit_base(steps: int) -> dict[str, Any]:
    """Flat overrides of the ViT runs: the default ViT (4 pre-norm layers, width 64, 4 heads of 16,
    MLP 256, patch 2 on 8×8 digits), AdamW lr 1e-3, batch 64."""
    return {"steps": steps, "track_every": steps, "log_every": max(steps // 10, 10), "checkpoint_every": steps}


def sweep(kind: str, base: dict[str, Any], grid: dict[str, list[Any]], seeds: list[int], root: Path,
          workers: int) -> Any:
    """Run a sweep (1 torch thread per run); raise if any run failed. Returns the SweepResult."""
    from attnrank.errors import AttnRankError
    from attnrank.training.sweep import SweepSpec, run_sweep

    res = run_sweep(SweepSpec(kind=kind, base=base, grid=grid, seeds=list(seeds)), root, workers=workers, threads=1)
    failed = res.runs[res.runs["status"] != "ok"]
    if len(failed):
        raise AttnRankError(f"{len(failed)} {kind} run(s) failed: {failed['error'].iloc[0]}")
    return res


def exposure(kind: str, overrides: dict[str, Any]) -> dict[str, float]:
    """Decay exposure λ·Σlr per group (``attn``, ``other``, ``lr_sum``) of one run's config."""
    from attnrank.training.config import decay_exposure, make_config

    return decay_exposure(make_config(kind, **overrides))


def lr_sum(kind: str, overrides: dict[str, Any]) -> float:
    """Σ_t lr_t of a run with these overrides (the λ that gives exposure E is E / lr_sum)."""
    return exposure(kind, overrides)["lr_sum"]


def lambdas_for(exposures: tuple[float, ...] | list[float], lrsum: float) -> list[float]:
    """The λ of each target exposure, rounded *up* to 4 significant digits (so λ·Σlr ≥ the target)."""
    out = []
    for e in exposures:
        lam = e / lrsum
        if lam > 0:
            unit = 10.0 ** (math.floor(math.log10(lam)) - 3)
            lam = float(f"{math.ceil(lam / unit - 1e-9) * unit:.4g}")
            while lam * lrsum < e:
                lam = float(f"{lam + unit:.4g}")
        out.append(float(lam))
    return out


# -- paired comparisons over seeds -------------------------------------------------------------------

def paired(a: dict[int, float], b: dict[int, float]) -> dict[str, Any]:
    """``a − b`` paired by seed (runs that share initialisation and data order): the mean
    difference, its spread (2 standard errors: 2 · std of the per-seed differences (ddof 1) / √n;
    NaN with one seed), the std itself, and the number of seeds."""
    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    sd = float(d.std(ddof=1)) if len(d) >= 2 else float("nan")
    return {"diff": float(d.mean()) if len(d) else float("nan"), "spread": 2 * sd / math.sqrt(len(d)) if len(d) >= 2
            else float("nan"), "sd": sd, "n_seeds": len(seeds)}


def sign_verdict(diff: float, sp: float) -> str:
    """``held`` if ``diff`` > spread; ``not held`` if ``diff`` ≤ −spread (a zero difference with zero
    spread is an absent effect); else ``inconclusive`` (inside the spread, or spread unmeasured)."""
    if not (math.isfinite(diff) and math.isfinite(sp)):
        return "inconclusive"
    if diff > sp:
        return "held"
    if diff <= -sp:
        return "not held"
    return "inconclusive"


def trend(values: dict[float, dict[int, float]]) -> dict[str, Any]:
    """Tie-aware test that a per-run value falls with λ: ``values[λ][seed]``.

    Non-increasing within the seed spread (no step between neighbouring λ rises by more than
    the spread of its paired differences) and a strict drop end to end (first λ minus last λ,
    paired, above its spread). ``verdict``: held; not held (a step rises beyond its spread, or
    the end-to-end change is ≤ −spread); inconclusive (end-to-end drop inside the spread)."""
    lams = sorted(values)
    steps = [{"from": lo, "to": hi, **paired(values[hi], values[lo])} for lo, hi in zip(lams, lams[1:], strict=False)]
    end = paired(values[lams[0]], values[lams[-1]])
    rises = [s for s in steps if sign_verdict(s["diff"], s["spread"]) == "held"]
    if rises:
        verdict, why = "not held", f"rises beyond the seed spread from lambda {rises[0]['from']:g} to {rises[0]['to']:g}"
    else:
        verdict = sign_verdict(end["diff"], end["spread"])
        why = {"held": "", "not held": "no drop from the first to the last lambda beyond the seed spread",
               "inconclusive": "end-to-end drop inside the seed spread" if math.isfinite(end["spread"])
               else "one seed: the spread is not measured"}[verdict]
    means = {f"{lam:g}": float(np.mean(list(values[lam].values()))) for lam in lams}
    return {"means": means, "steps_up": [s["diff"] for s in steps], "steps_spread": [s["spread"] for s in steps],
            "end_to_end_drop": end["diff"], "end_to_end_spread": end["spread"], "verdict": verdict, "reason": why}


def combine(verdicts: list[str]) -> str:
    """Several parts of one claim: not held if any part is, held if all are, else inconclusive."""
    if "not held" in verdicts:
        return "not held"
    return "held" if verdicts and all(v == "held" for v in verdicts) else "inconclusive"


# -- ranks from exact spectra ------------------------------------------------------------------------

def numerical_rank(sv: Any, tol: float) -> np.ndarray:
    """``#{σ_i > tol·σ_1}`` over the last axis of singular values (descending)."""
    s = np.asarray(sv, dtype=float)
    return (s > tol * s[..., :1]).sum(-1).astype(float)


def effective_rank(sv: Any) -> np.ndarray:
    """``exp(H(p))``, ``p_i = σ_i / Σσ`` over the last axis."""
    s = np.asarray(sv, dtype=float)
    p = s / s.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
    return np.exp(h)


def noise_floors(kind: str, overrides: dict[str, Any], attn_lambdas: list[float], seed: int = 0) -> list[float]:
    """σ_1 of ``W_Kᵀ W_Q`` for a head pair that gets no gradient in expectation, per attention λ:
    AdamW (decoupled, as torch's: ``w ← w(1 − lr λ)``, then the bias-corrected Adam step) with the
    run's learning-rate schedule, β, ε and steps on a (dh × d) W_Q, W_K drawn like the model's
    (std ``init_std``), fed i.i.d. zero-mean Gaussian gradients every step. Adam normalises the
    noise to steps of about lr, so such weights random-walk to a floor that decay pulls down; a
    real head's unused directions share their coordinates with gradient signal, so their floor is
    at most this."""
    from attnrank.training.config import lr_at, make_config

    cfg = make_config(kind, **overrides)
    dh, d = cfg.model.d_model // cfg.model.n_heads, cfg.model.d_model
    rng = np.random.default_rng(seed)
    lam = np.asarray(attn_lambdas, dtype=float)[:, None, None, None]
    w = np.broadcast_to(rng.standard_normal((1, 2, dh, d)) * cfg.model.init_std, (lam.shape[0], 2, dh, d)).copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    b1, b2 = cfg.beta1, cfg.beta2
    for t in range(1, cfg.steps + 1):
        lr = lr_at(cfg, t)
        g = rng.standard_normal(w.shape) * 1e-2
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w *= 1 - lr * lam
        w -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + cfg.eps)
    return [float(np.linalg.norm(np.swapaxes(x[1], 0, 1) @ x[0], ord=2)) for x in w]


def floor_tol(m: dict[str, Any]) -> dict[str, Any]:
    """τ above the AdamW noise floor of one model's sweep, measured two ways and both recorded:

    - ``tail_floor`` (sets τ): in the runs at the largest λ, where decay has pulled every
      direction the loss does not need down to where Adam's noise holds it, the median over
      heads and seeds of the median σ_i/σ_1 over the lower half of the spectrum;
    - ``simulated_floor``: per product and λ, the σ_1 of a pair fed only zero-mean noise
      (:func:`noise_floors`) over the median trained σ_1 — an upper bound (a real head's unused
      directions share their coordinates with gradient signal, which shrinks Adam's step there).

    τ = FLOOR_FACTOR × the larger tail floor of the two products, capped at 0.5."""
    top = max(r["lam"] for r in m["runs"])
    tail: dict[str, float] = {}
    sim: dict[str, dict[str, float]] = {}
    for p in PRODUCTS:
        rel = [np.asarray(r["sv"][p], dtype=float) for r in m["runs"] if r["lam"] == top]
        rel = [x / x[..., :1] for x in rel]
        tail[p] = float(np.median(np.concatenate([np.median(x[..., x.shape[-1] // 2:], -1).ravel() for x in rel])))
        sim[p] = {}
        for lam, fl in m["noise_floor_sigma1"].items():
            s1 = [np.asarray(r["sv"][p], dtype=float)[..., 0].ravel() for r in m["runs"] if f"{r['lam']:g}" == lam]
            sim[p][lam] = float(fl / np.median(np.concatenate(s1)))
    return {"tail_floor": tail, "simulated_floor": sim, "tol": float(min(FLOOR_FACTOR * max(tail.values()), 0.5))}


def per_run(m: dict[str, Any], product: str, measure: str, tol: float = LOW_TOL) -> dict[float, dict[int, float]]:
    """values[λ][seed]: a rank measure averaged over the selected heads of each run."""
    out: dict[float, dict[int, float]] = {}
    for r in m["runs"]:
        sv = r["sv"][product]
        v = effective_rank(sv) if measure == "effective" else numerical_rank(sv, tol)
        out.setdefault(float(r["lam"]), {})[int(r["seed"])] = float(np.mean(v))
    return out
