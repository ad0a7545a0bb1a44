"""Paths through a self-attention network with skips (docs/methods/collapse.md).

With skips, a network of L layers of H heads is a sum over paths through at most one head per
layer; there are ``C(L,k)·H^k`` paths of length k (:func:`path_counts`). :func:`path_products`
multiplies the attention matrices along sampled head paths of a real forward pass;
:func:`path_restricted` evaluates the project's model restricted to the paths of each length,
with the attention matrices (and the norms' per-token scales) frozen at their values in the
full forward pass, where the sum over all lengths equals the model's output exactly.
"""

from __future__ import annotations

import math
from itertools import combinations, product
from typing import Any

import numpy as np
import pandas as pd
import torch

from headrank.analysis.collapse.measures import _as_array, residual
from headrank.errors import HeadRankError


def path_counts(n_layers: int, n_heads: int) -> list[int]:
    """Number of paths of each length k = 0..L through L layers of H heads with skips:
    ``C(L, k)·H^k`` (exact integers; they sum to ``(H+1)^L``)."""
    if n_layers < 0 or n_heads < 1:
        raise HeadRankError(f"need n_layers >= 0 and n_heads >= 1, got {n_layers}, {n_heads}")
    return [math.comb(n_layers, k) * n_heads**k for k in range(n_layers + 1)]


def enumerate_paths(n_layers: int, n_heads: int):
    """Every path, as a tuple with one entry per layer: ``None`` (skip) or a head index."""
    return product([None, *range(n_heads)], repeat=n_layers)


WELL_KNOWN = {  # name: (layers, heads per layer)
    "MiniLM-L6-H384": (6, 12),
    "BERT-base": (12, 12),
    "BERT-large": (24, 16),
    "GPT-2 small": (12, 12),
    "GPT-2 medium": (24, 16),
    "GPT-2 large": (36, 20),
    "GPT-2 XL": (48, 25),
    "LLaMA-2 7B": (32, 32),
    "LLaMA-2 13B": (40, 40),
    "LLaMA-2 70B": (80, 64),
}


def path_length_stats(n_layers: int, n_heads: int) -> dict[str, Any]:
    """Summary of the path-length distribution: total paths, mean, std, mode, share of short
    paths. Under the uniform count, a path's length is Binomial(L, H/(H+1))."""
    counts = path_counts(n_layers, n_heads)
    total = sum(counts)
    q = n_heads / (n_heads + 1)
    cum = 0
    half = None
    for k, c in enumerate(counts):
        cum += c
        if half is None and 2 * cum >= total:
            half = k
    short = sum(counts[: n_layers // 2 + 1])
    return {"layers": n_layers, "heads": n_heads, "log10_total_paths": n_layers * math.log10(n_heads + 1),
            "mean_length": n_layers * q, "std_length": math.sqrt(n_layers * q * (1 - q)),
            "mode_length": max(range(n_layers + 1), key=lambda k: counts[k]), "median_length": half,
            "share_length_le_half": short / total,
            "log10_paths_full_length": n_layers * math.log10(n_heads)}


def path_table(configs: dict[str, tuple[int, int]] | None = None) -> pd.DataFrame:
    """:func:`path_length_stats` for well-known configurations (or ``configs``)."""
    configs = WELL_KNOWN if configs is None else configs
    return pd.DataFrame([{"model": k, **path_length_stats(*v)} for k, v in configs.items()])


def path_products(probs: torch.Tensor | np.ndarray, n_samples: int = 64, seed: int = 0,
                  norm: str = "composite") -> pd.DataFrame:
    """Products of attention matrices along sampled head paths, one sequence.

    ``probs`` (L, H, n, n): layer l's row-stochastic attention matrices. For each length
    k = 1..L, ``n_samples`` paths: k distinct layers (uniformly) and one head per chosen layer
    (uniformly); the product ``P_{l_k,h_k} ⋯ P_{l_1,h_1}`` (later layers on the left, as
    ``X ← P X``) and its relative residual in ``norm`` (mean row). k = 0 is the identity.
    Where ``C(L,k)·H^k ≤ n_samples`` every path is taken once instead.
    """
    P = _as_array(probs)
    L, H, n, _ = P.shape
    rng = np.random.default_rng(seed)
    rows = [{"length": 0, "path": "identity", "residual": float(residual(np.eye(n), norm))}]
    for k in range(1, L + 1):
        total = math.comb(L, k) * H**k
        if total <= n_samples:
            paths = [(ls, hs) for ls in combinations(range(L), k) for hs in product(range(H), repeat=k)]
        else:
            paths = [(tuple(sorted(rng.choice(L, size=k, replace=False).tolist())),
                      tuple(rng.integers(0, H, size=k).tolist())) for _ in range(n_samples)]
        for ls, hs in paths:
            M = np.eye(n)
            for l, h in zip(ls, hs, strict=True):
                M = P[l, h] @ M
            rows.append({"length": k, "path": " ".join(f"{l}.{h}" for l, h in zip(ls, hs, strict=True)),
                         "residual": float(residual(M, norm))})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- paths in the project's model


def _frozen_norm(norm: torch.nn.Module, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``norm`` applied to ``z`` with the per-token scale it has on ``x`` (linear in z)."""
    if isinstance(norm, torch.nn.Identity):
        return z
    if not isinstance(norm, torch.nn.LayerNorm) or norm.bias is not None:
        raise HeadRankError("path decomposition needs LayerNorms without bias (or no norm)")
    var = x.var(-1, unbiased=False, keepdim=True)
    zc = z - z.mean(-1, keepdim=True)
    out = zc / torch.sqrt(var + norm.eps)
    return out * norm.weight if norm.weight is not None else out


def _frozen_attention(attn, z: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The attention module's own value and output projections with fixed probabilities."""
    B, T, _ = z.shape
    v = attn.v(z).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    v = v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    y = probs @ v
    return attn.o(y.transpose(1, 2).reshape(B, T, attn.n_heads * attn.head_dim))


def path_restricted(model, ids: torch.Tensor) -> dict[str, Any]:
    """The project's Transformer restricted to paths of each length k = 0..L.

    With the attention probabilities and the norms' per-token scales frozen at their values in
    the full forward pass, each block is linear in its input, so the final residual stream is
    exactly ``Σ_k Y_k`` with ``Y_k`` the sum over the ``C(L,k)·H^k`` paths through k heads
    (one per chosen layer). Needs skips, no MLP, no biases. Returns ``Y`` (L+1, B, T, d),
    the model's own final hidden state, and per k the residual ``res_composite`` (per
    sequence) and the Frobenius norm share.
    """
    cfg = model.config
    if not cfg.skip or cfg.mlp or cfg.bias:
        raise HeadRankError("path decomposition needs skip=True, mlp=False, bias=False")
    with torch.no_grad():
        _, hidden = model(ids, return_hidden=True)
        L = len(model.blocks)
        Y = [hidden[0]] + [torch.zeros_like(hidden[0]) for _ in range(L)]
        for block, x in zip(model.blocks, hidden[:-1], strict=True):
            if block.placement == "post":
                s = x + block.attn(x)  # the sum the post-norm normalises
                probs = block.attn.attention_probs(x)
                new = [Y[0]] + [Y[k] + _frozen_attention(block.attn, Y[k - 1], probs) for k in range(1, L + 1)]
                Y = [_frozen_norm(block.attn_norm, y, s) for y in new]
                continue
            xn = block.attn_norm(x)
            probs = block.attn.attention_probs(xn)
            Y = [Y[0]] + [Y[k] + _frozen_attention(block.attn, _frozen_norm(block.attn_norm, Y[k - 1], x), probs)
                          for k in range(1, L + 1)]
        Ys = torch.stack(Y)
    total = Ys.sum(0)
    err = float((total - hidden[-1]).norm() / hidden[-1].norm())
    fro = Ys.flatten(2).norm(dim=-1)  # (L+1, B)
    return {"Y": Ys, "output": hidden[-1], "sum_rel_error": err,
            "residual": residual(Ys, "composite"),  # (L+1, B)
            "norm_share": (fro / fro.sum(0, keepdim=True)).numpy()}
