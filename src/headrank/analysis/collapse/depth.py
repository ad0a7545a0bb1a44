"""Depth sweep: pure self-attention networks (the project's Transformer with skips, MLPs and
norms switched off) at random initialisation, residual against depth computed past the float64
floor (:mod:`.exact`), the same networks with other head counts, and fits of ``log r_L`` to an
exponential (``a + bL``) and a doubly exponential (``a + b κ^L``, the paper's bound has κ = 3)
form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from headrank.analysis.collapse.measures import residual
from headrank.errors import HeadRankError


def byte_batch(n_seqs: int, length: int, split: str = "test") -> torch.Tensor:
    """``n_seqs`` corpus sentences as UTF-8 byte ids (vocab 256), the first ``length`` bytes of
    each sentence that has at least that many."""
    from headrank.models import corpus

    out: list[list[int]] = []
    for s in corpus.sentences(split, None, min_words=6):
        b = list(s.encode("utf-8"))
        if len(b) >= length:
            out.append(b[:length])
            if len(out) == n_seqs:
                break
    if len(out) < n_seqs:
        raise HeadRankError(f"the corpus split {split!r} has only {len(out)} sentences of >= {length} bytes")
    return torch.tensor(out)


def pure_attention_config(n_layers: int, init_std: float, *, d_model: int = 64, n_heads: int = 4,
                          max_seq_len: int = 64, skip: bool = False, mlp: bool = False, norm: str = "none"):
    """The project's Transformer as a self-attention network: skips, MLP and norms as given
    (default: none of them), bidirectional attention, learned positions, byte vocabulary."""
    from headrank.models.transformer import ModelConfig

    return ModelConfig(vocab_size=256, max_seq_len=max_seq_len, n_layers=n_layers, d_model=d_model,
                       n_heads=n_heads, mlp=mlp, skip=skip, norm=norm, causal=False, init_std=init_std)


def fit_depth(depth: np.ndarray, log_r: np.ndarray, kappas: np.ndarray | None = None) -> dict[str, Any]:
    """Least-squares fits of ``log r`` against depth L:

    - exponential ``a + b L`` (r decays like e^{bL});
    - doubly exponential ``a + b κ^L`` with κ > 1 fitted (profile least squares over a grid
      of κ, then exact a, b), and with κ = 3 fixed (the exponent 3^L of the paper's bound).

    R² on ``log r``. Needs at least 4 points."""
    L = np.asarray(depth, dtype=float)
    y = np.asarray(log_r, dtype=float)
    if L.size < 4:
        return {"n_points": int(L.size), "fitted": False}
    tss = float(((y - y.mean()) ** 2).sum())

    def lin(feature):
        A = np.stack([np.ones_like(L), feature], 1)
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        rss = float(((y - A @ coef) ** 2).sum())
        return coef, rss

    ce, rss_e = lin(L)
    kappas = np.linspace(1.01, 10.0, 900) if kappas is None else kappas
    best = min(((k, *lin(k**L)) for k in kappas), key=lambda t: t[2])
    k_best, cd, rss_d = best
    c3, rss_3 = lin(3.0**L)

    def r2(rss):
        return 1.0 - rss / tss if tss > 0 else math.nan

    return {"n_points": int(L.size), "fitted": True, "depths": L.tolist(),
            "exp": {"a": float(ce[0]), "b": float(ce[1]), "r2": r2(rss_e)},
            "dexp": {"a": float(cd[0]), "b": float(cd[1]), "kappa": float(k_best), "r2": r2(rss_d)},
            "dexp3": {"a": float(c3[0]), "b": float(c3[1]), "kappa": 3.0, "r2": r2(rss_3)}}


FLOOR = 1e-12  # float64 residuals below this are rounding noise (they bottom out near 1e-16)


def depth_sweep(n_layers: int = 12, init_stds: Sequence[float] = (0.02, 0.2, 0.3, 0.5), seeds: Sequence[int] = (0, 1, 2),
                n_seqs: int = 16, length: int = 32, d_model: int = 64, n_heads: int = 4,
                floor: float = FLOOR) -> dict[str, Any]:
    """Pure self-attention (the project's Transformer: no skip, no MLP, no norm, bidirectional),
    randomly initialised (weights N(0, init_std²)), on real byte sequences: the relative residual
    ``res_composite`` after every depth 0..n_layers computed exactly, past the float64 floor
    (:func:`headrank.analysis.collapse.exact.san_residuals`). Per init scale: the mean over seeds
    × sequences of log10 of the relative residual per depth (NaN at a depth where some sequence's
    residual is not exact), its std, the same mean from the plain float64 forward pass (which
    stops at its floor, about 1e-16), and under ``bound`` what the stated bound needs: per
    sequence (seed-major) log10 of the absolute and relative residual (NaN where not exact), β
    per layer per seed, H and d_qk."""
    ids = byte_batch(n_seqs, length)
    out: dict[str, Any] = {"depths": list(range(n_layers + 1)), "init_stds": list(init_stds), "seeds": list(seeds),
                           "n_seqs": n_seqs, "length": length, "d_model": d_model, "n_heads": n_heads,
                           "floor": floor, "exact": True, "curves": {}}
    for std in init_stds:
        runs = [_sweep_seed(ids, seed, n_layers, std, d_model=d_model, n_heads=n_heads) for seed in seeds]
        rel = np.concatenate([r["log10_rel"] for r in runs])  # (seeds·seqs, L+1), NaN where not exact
        plain = np.concatenate([r["log10_rel_float64"] for r in runs])
        out["curves"][f"{std:g}"] = {
            "log10_rel_mean": rel.mean(0).tolist(), "log10_rel_std": rel.std(0).tolist(),
            "log10_rel_float64_mean": np.maximum(plain, -300.0).mean(0).tolist(),
            "exact_share": np.concatenate([r["exact"] for r in runs]).mean(0).tolist(),
            "bound": {"log10_abs_res": np.concatenate([r["log10_abs"] for r in runs]).tolist(),
                      "log10_rel_res": rel.tolist(), "exact": True,
                      "beta_by_seed": [r["betas"] for r in runs], "heads": n_heads, "d_qk": d_model // n_heads}}
    return out


def san_model(n_layers: int, std: float, seed: int, length: int, **cfg):
    """The sweep's network for one seed: the project's Transformer as a pure self-attention
    network (:func:`pure_attention_config`), float64, eval mode, initialised under ``seed``."""
    from headrank.models.transformer import Transformer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(pure_attention_config(n_layers, std, max_seq_len=max(64, length), **cfg))
    return model.double().eval()


def _sweep_seed(ids: torch.Tensor, seed: int, n_layers: int, std: float, **cfg) -> dict[str, Any]:
    """One seed of the sweep: :func:`~headrank.analysis.collapse.exact.san_residuals` per
    sequence and depth, and per layer β = max_h ‖W_QK,h‖_1‖W_h‖_{1,∞} (float64)."""
    from headrank.analysis.collapse.bound import attention_weights, layer_beta
    from headrank.analysis.collapse.exact import san_residuals

    model = san_model(n_layers, std, seed, ids.shape[1], **cfg)
    return {**san_residuals(model, ids), "betas": [layer_beta(*attention_weights(b.attn)) for b in model.blocks]}


def heads_sweep(heads: Sequence[int], init_stds: Sequence[float], seeds: Sequence[int], n_layers: int = 12,
                n_seqs: int = 16, length: int = 32, d_model: int = 64) -> dict[str, Any]:
    """The depth sweep's networks with each head count in ``heads`` at width ``d_model`` (d_qk =
    d / H): per init scale, head count and seed, log10 of the exact absolute and relative
    residual per sequence and depth (NaN where not exact) and β per layer."""
    ids = byte_batch(n_seqs, length)
    out: dict[str, Any] = {"heads": list(heads), "init_stds": list(init_stds), "seeds": list(seeds),
                           "depths": list(range(n_layers + 1)), "d_model": d_model, "n_seqs": n_seqs, "runs": {}}
    for std in init_stds:
        for H in heads:
            for seed in seeds:
                r = _sweep_seed(ids, seed, n_layers, std, d_model=d_model, n_heads=H)
                out["runs"][f"{std:g}/{H}/{seed}"] = {"log10_abs": r["log10_abs"].tolist(),
                                                      "log10_rel": r["log10_rel"].tolist(), "betas": r["betas"],
                                                      "d_qk": d_model // H}
    return out


def mlp_dose_response(scales: Sequence[float], init_stds: Sequence[float], n_layers: int, seeds: Sequence[int],
                      n_seqs: int = 16, length: int = 32, d_model: int = 64, n_heads: int = 4) -> dict[str, Any]:
    """Self-attention + MLP networks (no skip, no norm; the project's Transformer, float64,
    random init N(0, std²)) with every MLP's output projection multiplied by ``scale`` (which
    multiplies each MLP's Lipschitz constant by it): per init scale and MLP scale, the mean over
    seeds × sequences of log10 ``res_composite`` (relative) at every depth 0..n_layers. A seed's
    networks differ only in that factor (same initialisation, same sequences)."""
    from headrank.models.transformer import Transformer

    ids = byte_batch(n_seqs, length)
    out: dict[str, Any] = {"scales": list(scales), "init_stds": list(init_stds), "seeds": list(seeds),
                           "depths": list(range(n_layers + 1)), "log10_res": {}}
    for std in init_stds:
        cells = {}
        for scale in scales:
            logs = []
            for seed in seeds:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    model = Transformer(pure_attention_config(n_layers, std, max_seq_len=max(64, ids.shape[1]),
                                                              d_model=d_model, n_heads=n_heads, mlp=True))
                model = model.double().eval()
                with torch.no_grad():
                    for b in model.blocks:
                        b.mlp.proj.weight.mul_(scale)
                        if b.mlp.proj.bias is not None:
                            b.mlp.proj.bias.mul_(scale)
                    _, hidden = model(ids, return_hidden=True)
                r = residual(torch.stack(hidden, 1), "composite")  # (seqs, L+1)
                logs.append(np.log10(np.maximum(r, 1e-300)))
            cells[f"{scale:g}"] = np.concatenate(logs).mean(0).tolist()
        out["log10_res"][f"{std:g}"] = cells
    return out
