"""The stated rank-collapse bound as an inequality, and MLP Lipschitz bounds (Dong, Cordonnier,
Loukas 2021, Theorems 2.2/2.3 and Corollary 3.2 as restated in secondary sources).

For a pure self-attention network (no skip, no MLP) of depth L with H heads per layer,
``‖res(SAN(X))‖_{1,∞} ≤ (4γβH/√d_qk)^{(3^L−1)/2} ‖res(X)‖_{1,∞}^{3^L}`` where
``‖M‖_{1,∞} = √(‖M‖_1‖M‖_∞)`` (composite), ``res(X) = X − 1xᵀ`` (absolute, not divided by ‖X‖),
and ``β`` bounds ``‖W_QK,h‖_1 ‖W_h‖_{1,∞}`` for every layer and head (``W_QK,h = W_Q,h W_K,hᵀ``,
``W_h = W_V,h W_O,h``, row-vector convention ``X W``). γ "depends on the attention entries"; its
definition is not in any text we could read, so every function here takes γ as an argument or
reports the γ at which the inequality turns (:func:`gamma_thresholds`). Everything is in log10:
``3^L`` overflows any float power of ``‖res(X)‖`` beyond a few layers.

Lipschitz bounds (:func:`mlp_lipschitz_bound`): per token, in ℓ2, ``Lip(W_2 σ(W_1 x)) ≤
‖W_2‖_2 · sup|σ'| · ‖W_1‖_2``; ``sup|σ'|`` is measured on a dense grid (:func:`activation_lipschitz`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from headrank.analysis.collapse.measures import matrix_norm
from headrank.errors import HeadRankError


def head_matrices(wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo: torch.Tensor, n_heads: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per head ``W_QK,h`` and ``W_h`` (each (H, d, d), float64) from torch ``Linear`` weights:
    ``wq, wk, wv`` (H·dh, d) and ``wo`` (d, H·dh). Scores are ``X W_QK,h Xᵀ`` (before 1/√dh)
    and the layer's output is ``Σ_h P_h X W_h`` (biases aside)."""
    d = wq.shape[1]
    if wq.shape[0] % n_heads or wk.shape != wq.shape or wv.shape != wq.shape or wo.shape != (d, wq.shape[0]):
        raise HeadRankError(f"attention weights do not split into {n_heads} heads: q {tuple(wq.shape)}, "
                            f"k {tuple(wk.shape)}, v {tuple(wv.shape)}, o {tuple(wo.shape)}")
    dh = wq.shape[0] // n_heads
    q, k, v = (w.detach().double().reshape(n_heads, dh, d) for w in (wq, wk, wv))
    p = wo.detach().double().reshape(d, n_heads, dh).permute(1, 0, 2)  # (H, d, dh)
    qk = q.mT @ k  # (H, d, d): x_i W_QK x_jᵀ = q_i · k_j
    w = v.mT @ p.mT  # (H, d, d): head h adds (P_h X wv_hᵀ) p_hᵀ = P_h X W_h to the output
    return qk.numpy(), w.numpy()


def d_qk_of(attn: torch.nn.Module) -> int:
    """Query/key width per head of a live attention module."""
    wq = attn.q.weight if hasattr(attn, "q") else attn.query.weight
    heads = getattr(attn, "n_heads", None) or getattr(attn, "num_attention_heads", None) \
        or attn.config.num_attention_heads
    return int(wq.shape[0] // heads)


def layer_beta(qk: np.ndarray, w: np.ndarray) -> float:
    """``max_h ‖W_QK,h‖_1 · ‖W_h‖_{1,∞}`` (ℓ1 = max column abs-sum; composite = √(ℓ1·ℓ∞))."""
    return float(np.max(matrix_norm(qk, "l1") * matrix_norm(w, "composite")))


def attention_weights(attn: torch.nn.Module, out_dense: torch.nn.Module | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`head_matrices` of a live attention module: the project's ``Attention`` (``q, k, v,
    o``) or a BERT-style self-attention (``query, key, value``) with its output ``dense``.
    d_qk is ``wq.shape[0] // H`` (:func:`d_qk_of`)."""
    if all(hasattr(attn, a) for a in ("q", "k", "v", "o")):
        if getattr(attn, "n_kv_heads", attn.n_heads) != attn.n_heads:
            raise HeadRankError("the bound check needs one key/value head per query head")
        return head_matrices(attn.q.weight, attn.k.weight, attn.v.weight, attn.o.weight, attn.n_heads)
    if all(hasattr(attn, a) for a in ("query", "key", "value")) and out_dense is not None:
        heads = getattr(attn, "num_attention_heads", None) or attn.config.num_attention_heads
        return head_matrices(attn.query.weight, attn.key.weight, attn.value.weight, out_dense.weight, heads)
    raise HeadRankError(f"no query/key/value/output weights found on {type(attn).__name__}")


def gamma_thresholds(log10_r0: np.ndarray, log10_rL: np.ndarray, beta: float, heads: int, d_qk: int
                     ) -> dict[str, np.ndarray]:
    """Where the inequality turns, per input (rows) and depth L = 1..(columns): the bound holds at
    depth L iff ``log10 γ ≥ needed[:, L−1]``; it is vacuous (right-hand side ≥ ‖res(X)‖) iff
    ``log10 γ ≥ vacuous`` (the same for every L ≥ 1: ``c·‖res(X)‖² ≥ 1`` with c = 4γβH/√d_qk).

    ``log10_r0`` (S,): log10 ‖res(X)‖_{1,∞}; ``log10_rL`` (S, L): log10 ‖res(X_L)‖_{1,∞}."""
    r0 = np.asarray(log10_r0, dtype=float)[:, None]
    rL = np.asarray(log10_rL, dtype=float)
    if beta <= 0 or heads < 1 or d_qk < 1:
        raise HeadRankError(f"need beta > 0, heads >= 1, d_qk >= 1; got {beta}, {heads}, {d_qk}")
    three = 3.0 ** np.arange(1, rL.shape[1] + 1)[None, :]
    log_c0 = math.log10(4 * beta * heads / math.sqrt(d_qk))  # log10 c at γ = 1
    needed = (rL - three * r0) * 2.0 / (three - 1.0) - log_c0
    return {"needed": needed, "vacuous": -2.0 * r0[:, 0] - log_c0}


def bound_rhs_log10(log10_r0: np.ndarray, depths: np.ndarray, beta: float, heads: int, d_qk: int,
                    log10_gamma: float) -> np.ndarray:
    """log10 of the right-hand side, per input (rows) and depth (columns)."""
    r0 = np.asarray(log10_r0, dtype=float)[:, None]
    three = 3.0 ** np.asarray(depths, dtype=float)[None, :]
    log_c = log10_gamma + math.log10(4 * beta * heads / math.sqrt(d_qk))
    return (three - 1.0) / 2.0 * log_c + three * r0


def check_bound(log10_res: np.ndarray, beta: float, heads: int, d_qk: int, log10_gamma: float,
                valid: np.ndarray | None = None) -> dict[str, Any]:
    """The inequality at every depth L ≥ 1 for a given γ: ``log10_res`` (S, L+1) holds log10
    ‖res(X_l)‖_{1,∞} per input, column 0 the input. Per depth with at least one ``valid`` (S, L)
    entry (above the float64 floor; default all): the worst (smallest) log10 margin RHS − LHS
    over valid inputs, whether it holds for all of them, and whether it is vacuous (RHS ≥
    ‖res(X)‖ for every input)."""
    a = np.asarray(log10_res, dtype=float)
    ok = np.ones((a.shape[0], a.shape[1] - 1), bool) if valid is None else np.asarray(valid, bool)
    depths = np.arange(1, a.shape[1])
    rhs = bound_rhs_log10(a[:, 0], depths, beta, heads, d_qk, log10_gamma)
    margin = np.where(ok, rhs - a[:, 1:], np.inf).min(0)
    vac = (rhs >= a[:, :1]).all(0)
    keep = ok.any(0)
    return {"depths": depths[keep].tolist(), "log10_margin": margin[keep].tolist(),
            "holds": (margin[keep] >= 0).tolist(), "vacuous": vac[keep].tolist()}


def bound_verdict(check: dict[str, Any]) -> tuple[str, str]:
    """Fixed rule: held iff the inequality holds at every depth, written "held (vacuous at depths
    …)" where the right-hand side is at least ‖res(X)‖; else not held, naming the depths."""
    bad = [L for L, ok in zip(check["depths"], check["holds"], strict=True) if not ok]
    if bad:
        return "not held", f"violated at depths {', '.join(map(str, bad))}"
    vac = [L for L, v in zip(check["depths"], check["vacuous"], strict=True) if v]
    return "held", f"held (vacuous at depths {', '.join(map(str, vac))})" if vac else "held"


def activation_lipschitz(act: Callable[[torch.Tensor], torch.Tensor], lo: float = -20.0, hi: float = 20.0,
                         n: int = 400_001) -> float:
    """``sup |σ'(x)|`` of an elementwise activation on a dense float64 grid (autograd); for a
    smooth σ such as GELU (≈ 1.1289 at x = √2) the grid error is far below the digits used."""
    x = torch.linspace(lo, hi, n, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(act(x).sum(), x)
    return float(g.abs().max())


def spectral_norm(w: torch.Tensor) -> float:
    """Largest singular value, float64."""
    return float(torch.linalg.matrix_norm(w.detach().double(), ord=2))


def mlp_lipschitz_bound(w_in: torch.Tensor, w_out: torch.Tensor, act_lip: float) -> float:
    """Upper bound of the per-token ℓ2 Lipschitz constant of ``x ↦ W_out σ(W_in x + b) + b'``."""
    return spectral_norm(w_out) * act_lip * spectral_norm(w_in)


def log10_abs_residual(X: torch.Tensor | np.ndarray) -> np.ndarray:
    """log10 ‖X − 1x̄ᵀ‖_{1,∞} (composite, mean row), batched over leading dimensions (−inf at 0)."""
    A = X.detach().double().numpy() if isinstance(X, torch.Tensor) else np.asarray(X, dtype=float)
    with np.errstate(divide="ignore"):
        return np.log10(matrix_norm(A - A.mean(-2, keepdims=True), "composite"))


def summarize_thresholds(log10_res: np.ndarray, betas: Sequence[float], heads: int, d_qk: int,
                         valid: np.ndarray | None = None) -> dict[str, Any]:
    """:func:`gamma_thresholds` for a stack whose layers have ``betas`` (β = their max), reduced
    over inputs: per depth the largest log10 γ needed (only over ``valid`` (S, L) entries: those
    above the float64 floor; None where no input is valid); the bound is vacuous for some input
    from ``log10_gamma_vacuous_some`` on and for every input from ``log10_gamma_vacuous_all`` on."""
    a = np.asarray(log10_res, dtype=float)
    ok = np.ones((a.shape[0], a.shape[1] - 1), bool) if valid is None else np.asarray(valid, bool)
    beta = float(max(betas))
    t = gamma_thresholds(a[:, 0], np.where(ok, a[:, 1:], 0.0), beta, heads, d_qk)
    need = np.where(ok, t["needed"], -np.inf).max(0)
    judged = [int(L) for L in np.flatnonzero(np.isfinite(need)) + 1]
    return {"beta": beta, "beta_by_layer": [float(b) for b in betas], "heads": heads, "d_qk": d_qk,
            "log10_res_input_median": float(np.median(a[:, 0])), "judged_depths": judged,
            "log10_gamma_needed_by_depth": [float(x) if np.isfinite(x) else None for x in need],
            "log10_gamma_needed": float(need[np.isfinite(need)].max()) if judged else None,
            "log10_gamma_vacuous_some": float(t["vacuous"].min()),
            "log10_gamma_vacuous_all": float(t["vacuous"].max()), "n_inputs": int(a.shape[0])}


def _layer_parts(adapter, i: int) -> tuple[tuple[np.ndarray, np.ndarray], int, tuple | None]:
    """(W_QK, W_h), d_qk of layer ``i`` and its MLP's (W_in, W_out, activation) or None."""
    layer = adapter.layers[i]
    mods = getattr(adapter, "modules", None)
    if mods is None:  # the project's Transformer
        mlp = layer.mlp
        parts = (mlp.fc.weight, mlp.proj.weight, torch.nn.functional.gelu) if mlp is not None else None
        return attention_weights(layer.attn), d_qk_of(layer.attn), parts
    if not (mods.attn_out and mods.mlp and mods.mlp_out):
        raise HeadRankError("the bound check reads BERT-style layers (attention output and MLP output modules)")
    sa = layer.get_submodule(mods.attn)
    inter = layer.get_submodule(mods.mlp)
    mlp = (inter.dense.weight, layer.get_submodule(mods.mlp_out).dense.weight, inter.intermediate_act_fn)
    return attention_weights(sa, layer.get_submodule(mods.attn_out).dense), d_qk_of(sa), mlp


def weights_summary(adapter) -> dict[str, Any]:
    """Per layer: β_l = max_h ‖W_QK,h‖_1‖W_h‖_{1,∞}, and the MLP's Lipschitz upper bound
    ‖W_out‖_2 · sup|σ'| · ‖W_in‖_2 (None without an MLP)."""
    betas, lips, act_lip = [], [], None
    for i in range(adapter.n_layers):
        (qk, w), d_qk, mlp = _layer_parts(adapter, i)
        betas.append(layer_beta(qk, w))
        if mlp is None:
            lips.append(None)
            continue
        act_lip = activation_lipschitz(mlp[2]) if act_lip is None else act_lip
        lips.append(mlp_lipschitz_bound(mlp[0], mlp[1], act_lip))
    return {"beta_by_layer": betas, "mlp_lipschitz_by_layer": lips, "activation_lipschitz": act_lip,
            "heads": int(qk.shape[0]), "d_qk": d_qk}


def surgery_bound(source, *, n_seqs: int, max_tokens: int, seed: int, inits: Sequence[str],
                  min_tokens: int = 8) -> dict[str, Any]:
    """For each init of ``source`` (the sentences :func:`~headrank.analysis.collapse.analyze`
    uses): :func:`weights_summary`, d_qk, and log10 ‖res‖_{1,∞} (absolute) of the pure-attention
    variant after every layer, per sentence, and log10 ‖X_l‖_{1,∞} (for the relative residual)."""
    from headrank.analysis.collapse.surgery import make_adapter, run_variant, surgery_modules
    from headrank.models.opener import open_model

    op = open_model(source, dtype=torch.float64, n_inputs=0, what="collapse", check=surgery_modules)
    seqs = op.sequences(n_seqs, max_tokens=max_tokens, min_tokens=min_tokens)
    out: dict[str, Any] = {}
    for init in inits:
        ad = make_adapter(op, init, seed)
        summ = weights_summary(ad)
        rows, norms = [], []
        for ids in seqs.ids:
            cap = ad.reference(torch.tensor([ids]))
            X = torch.stack([h[0] for h in run_variant(ad, cap, "pure")])  # (L+1, n, d)
            rows.append(log10_abs_residual(X).tolist())
            norms.append(np.log10(matrix_norm(X.numpy(), "composite")).tolist())
        out[init] = {**summ, "log10_res_pure": rows, "log10_norm_pure": norms}
    return out
