"""The collapse experiment: surgery on a pretrained model, the depth sweep, the path-restricted
project model and the path enumeration. Returns JSON-able data; the only slow part."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headrank.analysis.collapse import (
    MEASURES,
    PRIMARY,
    analyze,
    byte_batch,
    depth_sweep,
    enumerate_paths,
    fit_depth,
    heads_sweep,
    mlp_dose_response,
    path_restricted,
    path_table,
    pure_attention_config,
)
from headrank.analysis.collapse.bound import surgery_bound
from headrank.analysis.collapse.ensemble import pretrained_ensemble, project_ensemble
from headrank.analysis.collapse.surgery import INITS
from headrank.errors import HeadRankError
from headrank.studies.collapse.claims import geo_curve
from headrank.studies.collapse.params import CollapseParams
from headrank.util.threads import torch_threads

ENUMERATED = [(L, H) for L in range(0, 5) for H in range(1, 4)]  # brute-force path counts: L <= 4, H <= 3


def _fits_above_floor(curve: np.ndarray, floor: float) -> dict[str, Any]:
    above = curve > floor
    n_fit = int(np.argmin(above)) if not above.all() else above.size
    return {"n_fit": n_fit, "fit": fit_depth(np.arange(n_fit), np.log(curve[:n_fit]))}


def _surgery(p: CollapseParams) -> dict[str, Any]:
    res = analyze(p.model, n_seqs=p.n_seqs, max_tokens=p.max_tokens, seed=p.seed, path_samples=p.path_samples)
    j = MEASURES.index(PRIMARY)
    by_seq = {k: v[:, :, j].tolist() for k, v in res.values.items()}
    paths = res.paths
    return {"summary": res.summary().to_dict(orient="records"), "layers": res.table.to_dict(orient="records"),
            "primary_by_seq": by_seq,
            "pure_fits": {k.split("/")[0]: _fits_above_floor(geo_curve(v), p.floor)
                          for k, v in by_seq.items() if k.endswith("/pure")},
            "path_products": res.path_summary().to_dict(orient="records"),
            "paths": {"length": paths["length"].astype(int).tolist(), "residual": paths["residual"].tolist()},
            "minilm_meta": res.meta}


def _restricted(p: CollapseParams) -> dict[str, Any]:
    from scipy.stats import spearmanr

    from headrank.models.transformer import Transformer

    ids = byte_batch(p.sweep_seqs, p.sweep_length)
    out: dict[str, Any] = {}
    for norm in p.restricted_norms:
        for std in p.restricted_stds:
            logs, errs, shares = [], [], []
            for s in p.sweep_seeds:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(s)
                    m = Transformer(pure_attention_config(p.restricted_layers, std, d_model=p.sweep_d_model,
                                                          n_heads=p.sweep_heads, skip=True, norm=norm))
                r = path_restricted(m.double().eval(), ids)
                logs.append(np.log(np.maximum(r["residual"], 1e-300)))
                errs.append(r["sum_rel_error"])
                shares.append(np.asarray(r["norm_share"]))  # (L+1, B): |Y_k|_F / sum_k |Y_k|_F per sequence
            lg = np.concatenate(logs, 1).mean(1)
            out[f"norm={norm}, init std {std:g}"] = {
                "geo_mean": np.exp(lg).tolist(), "sum_rel_error": max(errs),
                "spearman_k_vs_log_residual": float(spearmanr(np.arange(1, lg.size), lg[1:]).statistic),
                "norm_share_by_k": np.concatenate(shares, 1).T.tolist()}  # per sequence and seed, by k
    return out


def _pool(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Ensemble measures of several networks as one list per measure (sequences of every network)."""
    out: dict[str, Any] = {k: [x for r in rows for x in r[k]] for k, v in rows[0].items() if isinstance(v, list)}
    return {**out, "n_members": rows[0]["n_members"], "sum_rel_error": max(r["sum_rel_error"] for r in rows)}


def _init_ensembles(p: CollapseParams) -> dict[str, Any]:
    """The ensemble measures of random networks with skips (no MLP, no norm) per init scale."""
    from headrank.models.transformer import Transformer

    ids = byte_batch(p.sweep_seqs, p.sweep_length)
    out = {}
    for std in p.short_init_stds:
        rows = []
        for s in p.sweep_seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(s)
                m = Transformer(pure_attention_config(p.restricted_layers, std, d_model=p.sweep_d_model,
                                                      n_heads=p.sweep_heads, skip=True))
            rows.append(project_ensemble(m, ids))
        out[f"{std:g}"] = _pool(rows)
    return out


def _recall_ensembles(p: CollapseParams) -> dict[str, Any]:
    """The project's recall model trained ``p.recall_steps`` steps per seed by the project's
    trainer (a temporary run directory), and its accuracy and ensemble measures on fresh task
    sequences."""
    import tempfile
    from pathlib import Path

    from headrank.models.tasks import make_recall_batch, recall_loss_and_accuracy
    from headrank.models.transformer import Transformer
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    rows, acc = [], []
    with tempfile.TemporaryDirectory(prefix="headrank-collapse-") as tmp:
        for s in p.recall_seeds:
            cfg = recall_config(steps=p.recall_steps, seed=s, track_every=p.recall_steps, log_every=p.recall_steps)
            res = train(Path(tmp) / f"seed-{s}", cfg, tensorboard=False, threads=p.threads, log="none")
            model = Transformer.from_pretrained(res.checkpoint).eval()
            x, y = make_recall_batch(cfg.task, p.recall_seqs, torch.Generator().manual_seed(1_000_003 + s))
            with torch.no_grad():
                acc.append(float(recall_loss_and_accuracy(model(x), y)[1]))
            rows.append(project_ensemble(model, x))
    m = cfg.model
    return {"n_layers": m.n_layers, "accuracy": acc, "measures": _pool(rows),
            "config": {"layers": m.n_layers, "d_model": m.d_model, "heads": m.n_heads, "mlp": m.mlp, "norm": m.norm,
                       "causal": m.causal, "init_std": m.init_std, "lr": cfg.lr, "batch": cfg.batch_size,
                       "attn_weight_decay": cfg.attn_weight_decay, "weight_decay": cfg.weight_decay}}


def _ensembles(p: CollapseParams) -> dict[str, Any]:
    """Ensemble measures: random init per scale, the trained recall model, the pretrained model's
    attention + skip variant (a model that is not BERT-style is recorded as skipped)."""
    out: dict[str, Any] = {"init": _init_ensembles(p), "recall": _recall_ensembles(p)}
    try:
        out["pretrained"] = {"model": str(p.model), **pretrained_ensemble(p.model, n_seqs=p.n_seqs,
                                                                          max_tokens=p.max_tokens, seed=p.seed)}
    except HeadRankError as e:
        out["pretrained"] = {"model": str(p.model), "skipped": str(e)}
    return out


def _enumeration() -> list[dict[str, Any]]:
    """Path counts by brute force: every path (skip or one head per layer) enumerated."""
    rows = []
    for L, H in ENUMERATED:
        counts = [0] * (L + 1)
        for path in enumerate_paths(L, H):
            counts[sum(h is not None for h in path)] += 1
        rows.append({"layers": L, "heads": H, "counts": counts})
    return rows


def run(p: CollapseParams) -> dict[str, Any]:
    """Surgery on ``p.model``, the depth sweep (exact residuals) and its head-count sweep, the
    path-restricted model, the bound's inputs (β, absolute residuals, MLP Lipschitz bounds), the
    MLP dose-response, the ensembles (random, trained recall model, pretrained), path enumeration."""
    with torch_threads(p.threads):
        data = _surgery(p)
        data["depth_sweep"] = depth_sweep(n_layers=p.sweep_depth, init_stds=p.sweep_init_stds, seeds=p.sweep_seeds,
                                          n_seqs=p.sweep_seqs, length=p.sweep_length, d_model=p.sweep_d_model,
                                          n_heads=p.sweep_heads, floor=p.floor)
        data["heads_sweep"] = heads_sweep(p.heads_sweep, p.heads_init_stds, p.heads_seeds, n_layers=p.sweep_depth,
                                          n_seqs=p.sweep_seqs, length=p.sweep_length, d_model=p.sweep_d_model)
        data["path_restricted"] = _restricted(p)
        data["bound"] = {"minilm": surgery_bound(p.model, n_seqs=p.n_seqs, max_tokens=p.max_tokens, seed=p.seed,
                                                 inits=INITS)}
        data["mlp_dose"] = mlp_dose_response(p.dose_scales, p.dose_init_stds, max(p.dose_depths), p.sweep_seeds,
                                             n_seqs=p.sweep_seqs, length=p.sweep_length, d_model=p.sweep_d_model,
                                             n_heads=p.sweep_heads)
        data["ensembles"] = _ensembles(p)
    data["path_enumeration"] = _enumeration()
    data["path_table"] = path_table().to_dict(orient="records")
    return data
