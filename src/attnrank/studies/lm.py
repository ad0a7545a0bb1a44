"""Figure 3 and Table 1 of the paper, reproduced at CPU scale: a byte-level LM on the stdlib
corpus and a ViT on scikit-learn's digits, trained with AdamW where only the attention
projections' decay λ is varied (``attn_weight_decay``; every other matrix keeps
``weight_decay``), through :func:`attnrank.training.sweep.run_sweep`.

**fig3** — rank against attention λ (every other matrix 0.1):

- LM: per-head rank of ``W_Kᵀ W_Q`` and ``P W_V`` in a middle layer (index ``n_layers // 2``);
- ViT: mean rank over all heads and layers.

Both the numerical rank (``#{σ_i > 10⁻³ σ_1}``) and the effective rank (exp of the entropy of
the normalised singular values) are reported side by side: AdamW leaves small singular values
at a noise floor, so the numerical rank barely moves until λ is large. Claims, for LM and ViT:
``rank_falls_{effective,numerical}`` (Spearman ρ between λ and the seed-mean rank ≤ −0.9 for
both products) and ``lam01_lowers_{effective,numerical}`` (rank at λ = 0.1 below λ = 0 for
both products, by more than the seed spread when there are ≥ 2 seeds).

**table1** — test perplexity of the LM over attention λ × MLP λ (``weight_decay``: every
matrix outside attention, embeddings included), mean ± std over seeds. Claims:
``attn_decay_hurts`` (perplexity at the largest attention λ above attention λ = 0 at the same
MLP λ, by more than the spread) and ``decoupling_helps`` (at each coupled point, attention λ =
MLP λ, the best attention λ ≠ MLP λ of the grid beats it by more than the spread). Both are
reported with their measured differences whichever way they fall.

"Spread" of a difference between two grid points: ``sqrt(s_a² + s_b²)`` with ``s`` the
standard deviation over seeds (ddof 1) of each point; with one seed it is not measured and a
claim needs only the sign.

Sizes are *our choice* (the paper's Pile LMs and ImageNet ViTs are far beyond this scale): see
:func:`lm_base` and :func:`vit_base`. With ``workers > 1`` the runs go to spawned processes: a
calling script needs the usual ``if __name__ == "__main__":`` guard.

Profiles (measured on this machine, 2 CPU cores, 2 workers of 1 thread): ``fig3 --quick``
(λ ∈ {0, 0.1, 1, 3}, 1 seed, 300 LM + 300 ViT steps) 52 s while another job held one core;
full fig3 (λ ∈ {0, 0.1, 0.3, 1, 3}, 3 seeds, 1,000 + 1,000 steps) 10 min 4 s (23 min 34 s
on a day the same machine ran about half as fast).
``table1 --quick`` ({0, 0.1, 1} × {0, 0.1}, 2 seeds, 150 steps) 48 s; full table1 (same grid,
3 seeds, 1,000 steps) 7 min 36 s (16 min 29 s on the slow day).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from attnrank.studies.registry import CATALOGUE, Claim, FigureOut, Result, register

FIG3_TITLE = CATALOGUE["fig3"][1]
TABLE1_TITLE = CATALOGUE["table1"][1]
OTHER_WD = 0.1
RHO_MAX = -0.9
PRODUCTS = ("qk", "ov")
RANK_KINDS = {"effective": "effective_rank", "numerical": "rank"}
FULL_FIG3_LAMBDAS = [0.0, 0.1, 0.3, 1.0, 3.0]


# -- configurations (our choice) -------------------------------------------------------------------

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


def _sweep(kind: str, base: dict[str, Any], grid: dict[str, list[Any]], seeds: list[int], root: Path,
           workers: int):
    from attnrank.training.sweep import SweepSpec, run_sweep

    res = run_sweep(SweepSpec(kind=kind, base=base, grid=grid, seeds=seeds), root, workers=workers, threads=1)
    failed = res.runs[res.runs["status"] != "ok"]
    if len(failed):
        from attnrank.errors import AttnRankError

        raise AttnRankError(f"{len(failed)} {kind} run(s) failed: {failed['error'].iloc[0]}")
    return res


def _final_heads(run_dir: str | Path) -> dict[str, Any]:
    from attnrank.io.rundir import read_metrics

    rows = [r for r in read_metrics(run_dir) if "heads" in r]
    return rows[-1]["heads"]


# -- fig3 --------------------------------------------------------------------------------------------

def rank_rows(heads: dict[str, Any], lam: float, seed: int, layers: list[int] | None) -> list[dict[str, Any]]:
    """Per-head rows (lam, seed, product, layer, head, rank, effective_rank) of one run's final
    tracker measurement, restricted to ``layers`` (None: all)."""
    out = []
    for product in PRODUCTS:
        r = np.asarray(heads[product]["rank"], dtype=float)
        e = np.asarray(heads[product]["effective_rank"], dtype=float)
        for layer in range(r.shape[0]) if layers is None else layers:
            for h in range(r.shape[1]):
                out.append({"lam": float(lam), "seed": int(seed), "product": product, "layer": layer, "head": h,
                            "rank": float(r[layer, h]), "effective_rank": float(e[layer, h])})
    return out


def _spearman(x, y) -> float:
    from scipy.stats import spearmanr

    if len(set(y)) < 2 or len(set(x)) < 2:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def _spread(sa: float, sb: float) -> float:
    return float(math.sqrt(sa ** 2 + sb ** 2)) if math.isfinite(sa) and math.isfinite(sb) else float("nan")


def rank_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """Per (product, lam): mean and std over seeds of the per-run mean over the selected heads."""
    per_run = heads.groupby(["product", "lam", "seed"], as_index=False)[["rank", "effective_rank"]].mean()
    g = per_run.groupby(["product", "lam"])
    s = g[["rank", "effective_rank"]].agg(["mean", "std"])
    s.columns = [f"{a}_{b}" for a, b in s.columns]
    s["n_seeds"] = g.size()
    return s.reset_index()


def fig3_claims(heads: pd.DataFrame, model: str, where: str) -> list[Claim]:
    """The four fig3 claims of one model from per-head rows (see :func:`rank_rows`)."""
    summ = rank_summary(heads)
    lams = sorted(summ["lam"].unique())
    n_seeds = int(summ["n_seeds"].min())
    claims = []
    for kind, col in RANK_KINDS.items():
        rho, means = {}, {}
        for p in PRODUCTS:
            s = summ[summ["product"] == p].sort_values("lam")
            means[p] = dict(zip([f"{v:g}" for v in s["lam"]], s[f"{col}_mean"], strict=True))
            rho[p] = _spearman(list(s["lam"]), list(s[f"{col}_mean"]))
        held = all(math.isfinite(r) and r <= RHO_MAX for r in rho.values())
        claims.append(Claim(
            name=f"fig3.{model}.rank_falls_{kind}", source="paper Fig. 3; REFERENCE.md §3",
            statement=f"The {kind} rank of W_K^T W_Q and P W_V ({where}) decreases as the attention decay grows.",
            measured={"spearman_rho": rho, f"mean_{col}": means, "lambdas": lams, "n_seeds": n_seeds},
            expected=f"Spearman rho(lambda, seed-mean {kind} rank) <= {RHO_MAX:g} for both products",
            held=held, tolerance=f"rho <= {RHO_MAX:g}",
            detail=f"{kind} rank ({'exp of the entropy of normalised singular values' if kind == 'effective' else '#{sigma_i > 1e-3 sigma_1}'}), "
                   f"mean over {where}, then over seeds; NaN rho (all values tied) does not hold."))
    for kind, col in RANK_KINDS.items():
        measured: dict[str, Any] = {"n_seeds": n_seeds}
        ok = []
        if 0.0 not in lams or 0.1 not in lams:
            claims.append(Claim(name=f"fig3.{model}.lam01_lowers_{kind}", source="paper Fig. 3 (caption)",
                                statement="lambda = 0.1 lowers the rank compared with lambda = 0.",
                                measured=measured, expected="grid holds lambda 0 and 0.1", held=False,
                                detail="not measurable on this grid"))
            continue
        for p in PRODUCTS:
            s = summ[summ["product"] == p].set_index("lam")
            m0, m1 = float(s.loc[0.0, f"{col}_mean"]), float(s.loc[0.1, f"{col}_mean"])
            spread = _spread(float(s.loc[0.0, f"{col}_std"]), float(s.loc[0.1, f"{col}_std"])) if n_seeds >= 2 \
                else float("nan")
            diff = m0 - m1
            beyond = bool(diff > spread) if n_seeds >= 2 else None
            measured[p] = {"rank_at_0": m0, "rank_at_0.1": m1, "drop": diff, "relative_drop": diff / m0 if m0 else None,
                           "seed_spread": spread, "drop_exceeds_spread": beyond}
            ok.append(diff > 0 and (beyond is None or beyond))
        claims.append(Claim(
            name=f"fig3.{model}.lam01_lowers_{kind}", source="paper Fig. 3 (caption: 0.1 noticeably reduces the rank)",
            statement=f"Attention decay 0.1 already lowers the {kind} rank of both products ({where}) compared with no decay.",
            measured=measured,
            expected="rank(0) - rank(0.1) > 0 for both products" + (", and > seed spread" if n_seeds >= 2 else ""),
            held=all(ok), tolerance="spread = sqrt(std_0^2 + std_0.1^2) over seeds (ddof 1)" if n_seeds >= 2
            else "one seed: sign only, spread not measured",
            detail=f"mean over {where}, then over {n_seeds} seed(s)."))
    return claims


def run_fig3(lambdas: list[float], lm_steps: int, vit_steps: int, seeds: list[int], workers: int = 2,
             keep: str | Path | None = None) -> dict[str, Any]:
    """Train the LM and ViT sweeps; return per-head rows and run tables."""
    from attnrank.training.loop import make_config

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(keep) if keep is not None else Path(tmp)
        for model, kind, base in (("lm", "lm", lm_base(lm_steps)), ("vit", "vit", vit_base(vit_steps))):
            base = {**base, "weight_decay": OTHER_WD}
            res = _sweep(kind, base, {"attn_weight_decay": [float(v) for v in lambdas]}, seeds, root / model, workers)
            n_layers = make_config(kind, **base).model.n_layers
            layers = [n_layers // 2] if model == "lm" else None
            rows = []
            for _, r in res.runs.iterrows():
                rows += rank_rows(_final_heads(res.out / "runs" / r["name"]), r["attn_weight_decay"], r["seed"], layers)
            cols = [c for c in ("attn_weight_decay", "seed", "test_ppl", "test_acc", "loss") if c in res.runs]
            out[model] = {"heads": pd.DataFrame(rows), "runs": res.runs[cols].copy(), "n_layers": n_layers,
                          "layers": layers, "base": base}
    return out


def fig3_result(lambdas: list[float], lm_steps: int, vit_steps: int, seeds: list[int], workers: int = 2,
                profile: str = "") -> Result:
    import time

    t0 = time.perf_counter()
    runs = run_fig3(lambdas, lm_steps, vit_steps, seeds, workers)
    where = {"lm": f"the 4 heads of layer index {runs['lm']['layers'][0]} (of {runs['lm']['n_layers']})",
             "vit": f"all heads and all {runs['vit']['n_layers']} layers"}
    claims = fig3_claims(runs["lm"]["heads"], "lm", where["lm"]) + fig3_claims(runs["vit"]["heads"], "vit", where["vit"])
    data: dict[str, Any] = {"lambdas": list(lambdas), "seeds": list(seeds)}
    for m in ("lm", "vit"):
        data[m] = {"heads": runs[m]["heads"].to_dict("list"),
                   "summary": rank_summary(runs[m]["heads"]).to_dict("list"),
                   "runs": runs[m]["runs"].to_dict("list"), "layers": runs[m]["layers"]}
    from attnrank.studies.lm_plots import fig3_panels

    params = {"lambdas": list(lambdas), "seeds": list(seeds), "other_weight_decay": OTHER_WD,
              "lm_steps": lm_steps, "vit_steps": vit_steps, "workers": workers, "threads_per_run": 1,
              "lm_overrides": runs["lm"]["base"], "vit_overrides": runs["vit"]["base"],
              "lm_rank_layer": runs["lm"]["layers"][0], "rank_tolerance": 1e-3, "profile": profile}
    notes = [
        "Sizes are our choice (the paper's Pile LM and ImageNet ViT are far larger): LM = 4 pre-norm causal layers, "
        "width 64, 4 heads of 16, MLP 256, byte tokens, context 64, batch 32, lr 3e-3, first 200,000 characters of "
        "each stdlib-corpus split; ViT = 4 layers, width 64, 4 heads of 16, patch 2, sklearn digits, batch 64, lr 1e-3.",
        f"Our choice: LM rank layer = index {runs['lm']['layers'][0]} (the middle; the paper uses layer 5 of a deeper "
        "model); every non-attention matrix and the embeddings keep decay 0.1; biases and norm gains are not decayed.",
        "Numerical rank (relative threshold 1e-3) and effective rank are reported side by side: AdamW leaves small "
        "singular values at a noise floor, so the numerical rank of a 16x16 head moves only at large lambda.",
        f"Measured runtime of this run: {time.perf_counter() - t0:.0f} s ({profile} profile, {workers} workers, "
        "1 thread per run).",
    ]
    return Result(claims=claims, figures=[FigureOut("fig3", fig3_panels(data),
                                                    "Rank against attention decay λ: LM middle layer per head (dots) "
                                                    "and ViT mean over all heads and layers; solid effective, dashed "
                                                    "numerical rank.")],
                  data=data, params=params, notes=notes)


@register("fig3", title=FIG3_TITLE, source="Kobayashi et al. 2024, Fig. 3 (seed 000); REFERENCE.md §3")
def reproduce_fig3(quick: bool = False) -> Result:
    if quick:
        return fig3_result([0.0, 0.1, 1.0, 3.0], lm_steps=300, vit_steps=300, seeds=[0], profile="quick")
    return fig3_result(FULL_FIG3_LAMBDAS, lm_steps=1000, vit_steps=1000, seeds=[0, 1, 2], profile="full")



# -- table1 ------------------------------------------------------------------------------------------

def ppl_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (attn λ, MLP λ): mean, std (ddof 1) and count over seeds of the test perplexity."""
    g = runs.groupby(["attn_weight_decay", "weight_decay"])["test_ppl"]
    t = g.agg(["mean", "std", "count"]).reset_index()
    return t.rename(columns={"mean": "ppl_mean", "std": "ppl_std", "count": "n_seeds"})


def table1_claims(runs: pd.DataFrame) -> list[Claim]:
    """The two table1 claims from a runs table (columns attn_weight_decay, weight_decay, seed, test_ppl)."""
    t = ppl_table(runs)
    n_seeds = int(t["n_seeds"].min())
    idx = {(float(a), float(m)): (float(mu), float(sd)) for a, m, mu, sd in
           zip(t["attn_weight_decay"], t["weight_decay"], t["ppl_mean"], t["ppl_std"], strict=True)}
    attn = sorted({a for a, _ in idx})
    mlp = sorted({m for _, m in idx})

    def compare(hi: tuple[float, float], lo: tuple[float, float]) -> dict[str, Any]:
        """hi minus lo: difference of seed means, spread, whether it exceeds the spread."""
        (mh, sh), (ml, sl) = idx[hi], idx[lo]
        spread = _spread(sh, sl) if n_seeds >= 2 else float("nan")
        d = mh - ml
        return {"diff": d, "spread": spread, "exceeds_spread": bool(abs(d) > spread) if n_seeds >= 2 else None,
                "positive_beyond_spread": bool(d > 0 and (n_seeds < 2 or d > spread))}

    claims = []
    hurt: dict[str, Any] = {}
    a_max = attn[-1]
    for m in mlp:
        if (0.0, m) in idx and (a_max, m) in idx and a_max > 0:
            c = compare((a_max, m), (0.0, m))
            hurt[f"mlp_lambda={m:g}"] = {"ppl_attn0": idx[(0.0, m)][0], f"ppl_attn{a_max:g}": idx[(a_max, m)][0], **c}
    claims.append(_ppl_claim(
        "table1.attn_decay_hurts", "paper Table 1; REFERENCE.md §3 (low rank in attention can hurt LMs)",
        f"Attention decay hurts test perplexity: attention lambda {a_max:g} gives higher perplexity than 0 "
        "at the same MLP lambda.",
        hurt, n_seeds, "ppl(attn max) - ppl(attn 0) > 0", "at every MLP lambda",
        "test perplexity (exp of mean test loss) on the held-out split, mean over seeds; diff > 0 means decay hurt."))

    dec: dict[str, Any] = {}
    for m in mlp:
        if (m, m) not in idx:
            continue
        others = [(a, m) for a in attn if a != m and (a, m) in idx]
        if not others:
            continue
        best = min(others, key=lambda k: idx[k][0])
        c = compare((m, m), best)
        dec[f"mlp_lambda={m:g}"] = {"ppl_coupled": idx[(m, m)][0], "best_decoupled_attn_lambda": best[0],
                                    "ppl_best_decoupled": idx[best][0], **c}
    claims.append(_ppl_claim(
        "table1.decoupling_helps", "paper Table 1 (decoupling attention decay helps)",
        "Decoupling helps: at each coupled point (attention lambda = MLP lambda) some other attention "
        "lambda of the grid gives lower test perplexity.",
        dec, n_seeds, "ppl(coupled) - ppl(best decoupled) > 0", "at every coupled point of the grid",
        "diff > 0 means the best decoupled setting beat the coupled one; picking the best of several "
        "settings favours decoupling slightly (selection), which the spread test does not correct for."))
    return claims


def _ppl_claim(name: str, source: str, statement: str, per_mlp: dict[str, Any], n_seeds: int,
               inequality: str, where: str, detail: str) -> Claim:
    """A Table 1 claim: it holds when every comparison in ``per_mlp`` is positive beyond the seed spread."""
    spread = n_seeds >= 2
    return Claim(
        name=name, source=source, statement=statement,
        measured={"per_mlp_lambda": per_mlp, "n_seeds": n_seeds},
        expected=inequality + (", beyond the seed spread, " if spread else " ") + where,
        held=bool(per_mlp) and all(v["positive_beyond_spread"] for v in per_mlp.values()),
        tolerance="spread = sqrt(std_a^2 + std_b^2) over seeds (ddof 1)" if spread
        else "one seed: sign only, spread not measured",
        detail=detail)


def table1_result(attn_lambdas: list[float], mlp_lambdas: list[float], steps: int, seeds: list[int],
                  workers: int = 2, profile: str = "") -> Result:
    import time

    t0 = time.perf_counter()
    base = lm_base(steps)
    with tempfile.TemporaryDirectory() as tmp:
        res = _sweep("lm", base, {"attn_weight_decay": [float(v) for v in attn_lambdas],
                                  "weight_decay": [float(v) for v in mlp_lambdas]}, seeds, Path(tmp), workers)
    runs = res.runs[["attn_weight_decay", "weight_decay", "seed", "test_ppl", "val_ppl", "loss"]].copy()
    claims = table1_claims(runs)
    table = ppl_table(runs)
    data = {"attn_lambdas": list(attn_lambdas), "mlp_lambdas": list(mlp_lambdas), "seeds": list(seeds),
            "runs": runs.to_dict("list"), "table": table.to_dict("list")}
    from attnrank.studies.lm_plots import table1_panels

    params = {"attn_lambdas": list(attn_lambdas), "mlp_lambdas": list(mlp_lambdas), "seeds": list(seeds),
              "steps": steps, "lm_overrides": base, "workers": workers, "threads_per_run": 1, "profile": profile}
    notes = [
        "Sizes are our choice (the paper's Pile LMs are far larger; it used 5 seeds): LM = 4 pre-norm causal layers, "
        "width 64, 4 heads of 16, MLP 256, byte tokens, context 64, batch 32, lr 3e-3, first 200,000 characters of "
        "each stdlib-corpus split, 16,384 test tokens scored.",
        "'MLP lambda' here is weight_decay: every matrix outside attention (MLP, embeddings, output head), not the "
        "MLP alone; biases and norm gains are not decayed.",
        f"Measured runtime of this run: {time.perf_counter() - t0:.0f} s ({profile} profile, {workers} workers, "
        "1 thread per run).",
    ]
    return Result(claims=claims, figures=[FigureOut("table1", table1_panels(data),
                                                    "Test perplexity over attention λ × MLP λ (mean ± std over seeds).")],
                  data=data, params=params, notes=notes)


@register("table1", title=TABLE1_TITLE, source="Kobayashi et al. 2024, Table 1 (seed 000); REFERENCE.md §3")
def reproduce_table1(quick: bool = False) -> Result:
    if quick:
        return table1_result([0.0, 0.1, 1.0], [0.0, 0.1], steps=150, seeds=[0, 1], profile="quick")
    return table1_result([0.0, 0.1, 1.0], [0.0, 0.1], steps=1000, seeds=[0, 1, 2], profile="full")
