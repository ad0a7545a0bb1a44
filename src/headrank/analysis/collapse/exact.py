"""Residuals of pure self-attention past the float64 floor (docs/methods/collapse.md).

A plain float64 forward pass forms ``X_L`` and then ``X_L − 1x̄ᵀ``: once the rows agree to 16
digits the difference is rounding noise (about 1e-16 of ‖X‖), so a network that collapses
doubly exponentially is measurable for two or three layers. :func:`san_residuals` carries the
residual itself through the layers instead, with full relative precision, and never forms it
as a difference of nearly equal numbers.

The derivation (row convention, one sequence, n tokens; head h of a layer maps ``X`` to
``A_h X V_h`` with ``A_h = softmax(X M_h Xᵀ)``, ``M_h = W_Q,hᵀ W_K,h / √d_qk`` and
``V_h = W_V,hᵀ W_O,hᵀ``, no biases): write ``X = 1xᵀ + R`` with x the mean row and
``R = C X`` (``C = I − 11ᵀ/n``, so ``1ᵀR = 0``).

1. Logits. ``X M_h Xᵀ = X M_h x 1ᵀ + X M_h Rᵀ``; the first term is constant along each row and
   leaves the softmax unchanged, so the logits are ``a_j + b_ij`` with ``a_j = xᵀM_h r_j``
   (the same for every row) and ``b_ij = r_iᵀ M_h r_j`` (second order in R).
2. Attention. With ``α = softmax(a)`` (one row), ``A_h = 1αᵀ + F`` where, exactly,
   ``F_ij = α_j (g_ij − Σ_k α_k g_ik) / (1 + Σ_k α_k g_ik)``, ``g = expm1(b)``. ``F`` is of
   the order of b and is computed from expm1 with full relative precision; ``1αᵀ`` is rank one
   with identical rows.
3. Residual. ``A_h 1 = 1`` and ``C 1 = 0`` give ``R' = C X' = Σ_h C A_h R V_h =
   Σ_h C F_h R V_h``: no difference of large terms is left (``1ᵀF`` vanishes to first order
   because ``1ᵀR = 0``, so ``C`` removes a small part). In the collapsed regime ``F = O(R²)``
   and ``R' = O(R³)``: the cube behind the stated bound's ``3^L``.
4. Mean row. ``x' = Σ_h V_hᵀ (x + Rᵀα + Rᵀ Fᵀ1 / n)`` (an O(1) quantity; float64 suffices).

R is kept as ``2^e R̂`` (``e`` an integer, ``max |R̂|`` in [1/2, 1)), and b and F as scaled
matrices with their own binary exponents, so nothing underflows: ``g / 2^s`` is
``expm1(2^s b̂) / 2^s`` where ``2^s b̂`` is representable and ``b̂ (1 + b/2 + b²/6)`` where it
is below 2^-40 (the series is then exact to float64). Where the logits are not small
(``max |b| > 1``: a network far from collapse) ``F = softmax(a + b) − 1αᵀ`` is formed directly,
which loses nothing there. Tested against mpmath at high precision running the plain forward
pass (tests/analysis/test_collapse_exact.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from headrank.analysis.collapse.measures import matrix_norm
from headrank.errors import HeadRankError

LOG10_2 = math.log10(2.0)
_TINY = 2.0**-40  # below it, expm1(b) = b (1 + b/2 + b²/6) to float64


def san_layers(model) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer of the project's Transformer ``(M, V)``, each (H, d, d) float64: logits
    ``X M_h Xᵀ`` and head outputs ``A_h X V_h``. HeadRankError unless the model is a pure
    self-attention network (no skip, MLP, norm or bias; bidirectional; one kv head per head)."""
    from headrank.analysis.collapse.bound import attention_weights

    cfg = model.config
    if cfg.skip or cfg.mlp or cfg.norm != "none" or cfg.bias or cfg.causal:
        raise HeadRankError("exact residuals need a pure self-attention network: skip=False, mlp=False, "
                            "norm='none', bias=False, causal=False")
    out = []
    for block in model.blocks:
        qk, w = attention_weights(block.attn)  # (H, d, d): x_i qk x_j^T = q_i . k_j, head output P X w
        out.append((qk / math.sqrt(block.attn.head_dim), w))
    return out


def _normalise(R: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``2^e R`` as ``2^e' R'`` with max |R'| in [1/2, 1) per leading index (zero stays zero)."""
    _, k = np.frexp(np.abs(R).max(axis=(-2, -1)))
    return np.ldexp(R, -k[:, None, None]), e + k.astype(np.int64)


def _scaled_expm1(bh: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``expm1(2^s b̂) / 2^s`` elementwise, for per-sequence exponents ``s`` (B,) where
    ``max |2^s b̂| ≤ 1``."""
    b = np.ldexp(bh, np.clip(s, -2000, 2000)[:, None, None])
    tiny = np.abs(b) < _TINY
    series = bh * (1.0 + b / 2.0 + b * b / 6.0)
    with np.errstate(over="ignore", invalid="ignore"):
        direct = np.ldexp(np.expm1(b), np.clip(-s, -2000, 2000)[:, None, None])
    return np.where(tiny, series, direct)


def _head(x: np.ndarray, Rh: np.ndarray, e: np.ndarray, M: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One head's reference row ``ρ`` (B, n) and ``F = A − 1ρᵀ = 2^t F̂`` (F̂ (B, n, n), t (B,))
    for ``R = 2^e R̂``: small logits (max |b| ≤ 1) by :func:`_small_logits` (ρ = α), the others
    by :func:`_large_logits` (ρ = the first row of A)."""
    u = x @ M  # (B, d)
    a = np.ldexp(np.einsum("bnd,bd->bn", Rh, u), np.clip(e, -2000, 2000)[:, None])
    alpha = np.exp(a - a.max(1, keepdims=True))
    alpha /= alpha.sum(1, keepdims=True)
    bh = Rh @ M @ np.swapaxes(Rh, 1, 2)  # b = 2^(2e) b̂
    s = 2 * e
    with np.errstate(over="ignore"):
        big = np.abs(np.ldexp(np.abs(bh).max(axis=(1, 2)), np.clip(s, -2000, 2000))) > 1.0
    rho, Fh, t = alpha.copy(), np.empty_like(bh), s.copy()
    if (~big).any():
        Fh[~big] = _small_logits(alpha[~big], bh[~big], s[~big])
    if big.any():
        logits = a[big][:, None, :] + np.ldexp(bh[big], np.clip(s[big], -2000, 2000)[:, None, None])
        rho[big], Fh[big], t[big] = _large_logits(logits)
    return rho, Fh, t


def _small_logits(alpha: np.ndarray, bh: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``F / 2^s`` for logits ``b = 2^s b̂`` with ``max |b| ≤ 1`` (step 2, g = expm1(b)); the
    numerator ``g_ij − Σ_k α_k g_ik`` is formed as ``Σ_k α_k (g_ij − g_ik)``, which keeps its
    precision where α puts nearly all weight on one key."""
    g = _scaled_expm1(bh, s)
    num = np.einsum("bijk,bk->bij", g[:, :, :, None] - g[:, :, None, :], alpha)
    mean = np.einsum("bik,bk->bi", g, alpha)[:, :, None]
    return alpha[:, None, :] * num / (1.0 + np.ldexp(mean, np.clip(s, -2000, 2000)[:, None, None]))


def _large_logits(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ρ, F̂, k)`` with ρ the first row of ``A = softmax(logits)`` and ``F = A − 1ρᵀ = 2^k F̂``,
    entrywise to relative precision ~ε·|logits| also where the softmax saturates (every row's
    weight on one key j', the rows equal to many digits). With ``γ_ij = logit_ij − logit_ij'``,
    ``ε_i = Σ_{k≠j'} e^{γ_ik}`` and ``L_i = log(1 + ε_i)``: ``log A_ij = γ_ij − L_i`` and
    ``F_ij = A_0j expm1((γ_ij − γ_0j) − (L_i − L_0))``, the pivot column by
    ``(ε_0 − ε_i) / ((1 + ε_i)(1 + ε_0))``; where every off-key weight is below the key's
    (:func:`_saturated`) the off-key masses carry their own exponent, so a weight of e^{-1000}
    is not lost."""
    n = logits.shape[1]
    star = logits[:, 0, :].argmax(1)
    gam = logits - np.take_along_axis(logits, star[:, None, None], 2)  # γ_ij' = 0
    off = np.arange(n)[None, None, :] != star[:, None, None]
    top = np.maximum(gam.max(2), 0.0)
    L = top + np.log(np.exp(gam - top[:, :, None]).sum(2))  # log Σ_k e^γ_ik = log(1 + ε_i)
    logA0 = gam[:, 0, :] - L[:, :1]
    A0 = np.exp(logA0)
    m = np.where(off, gam, -np.inf).max(axis=(1, 2))
    sat = m < 0
    F, k = np.empty_like(logits), np.zeros(len(logits), dtype=np.int64)
    if (~sat).any():
        F[~sat] = _unsaturated(gam[~sat], L[~sat], logA0[~sat])
    if sat.any():
        F[sat], k[sat] = _saturated(gam[sat], off[sat], m[sat])
    return A0, F, k


def _unsaturated(gam: np.ndarray, L: np.ndarray, logA0: np.ndarray) -> np.ndarray:
    """``F`` of :func:`_large_logits` where some row weighs another key at least as much as j'."""
    dgam = gam - gam[:, :1, :]  # γ_ij − γ_0j
    D = dgam - (L - L[:, :1])[:, :, None]  # log A_ij − log A_0j
    A0 = np.exp(logA0)
    with np.errstate(over="ignore"):
        return np.where(D > 1.0, np.exp(np.minimum(logA0[:, None, :] + D, 0.0)) - A0[:, None, :],
                        A0[:, None, :] * np.expm1(np.minimum(D, 1.0)))


def _saturated(gam: np.ndarray, off: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(F̂, k)`` of :func:`_large_logits` where every off-key logit gap is below 0 (m < 0 the
    largest): the off-key weights scaled by e^{-m}, ``w_ik = e^{γ_ik − m}`` (≤ 1), ``ε_i = e^m Σ_k
    w_ik``; ``F = e^m F̃`` with ``F̃_ij = w_0j expm1(γ_ij − γ_0j − (L_i − L_0)) / (1 + ε_0)`` and,
    for the key, ``F̃_ij' = −Σ_k (w_ik − w_0k) / ((1 + ε_i)(1 + ε_0))``, the differences of the
    weights formed by expm1."""
    c = m[:, None, None]
    w = np.exp(np.where(off, gam - c, -np.inf))
    w0 = w[:, :1, :]
    dgam = gam - gam[:, :1, :]
    dw = np.where(off, np.where(dgam > 1.0, w - w0, w0 * np.expm1(np.minimum(dgam, 1.0))), 0.0)  # w_ik − w_0k
    em = np.exp(m)[:, None]
    eps = em * w.sum(2)  # (B, n), at most n
    dE = dw.sum(2)  # ε̃_i − ε̃_0
    dL = np.log1p(em * dE / (1.0 + eps[:, :1]))  # L_i − L_0
    D = dgam - dL[:, :, None]
    with np.errstate(over="ignore"):
        Ft = np.where(D > 1.0, np.exp(np.minimum(gam - c - dL[:, :, None], 0.0)) - w0,
                      w0 * np.expm1(np.minimum(D, 1.0))) / (1.0 + eps[:, :1, None])
    Ft = np.where(off, Ft, -dE[:, :, None] / ((1.0 + eps[:, :, None]) * (1.0 + eps[:, :1, None])))
    # F = 2^k (F̃ e^(m - k ln 2)); NaN logits, or a gap whose power of two int64 cannot hold (past
    # 2^(±2^62), a doubly exponential rate's ~40th layer): NaN F, not exact, never a wrapped k
    q = m / math.log(2.0)
    ok = np.isfinite(q) & (np.abs(q) < 2.0 ** 62)
    k = np.floor(np.where(ok, q, 0.0)).astype(np.int64)
    return Ft * np.where(ok, np.exp(m - k * math.log(2.0)), np.nan)[:, None, None], k


def san_step(x: np.ndarray, Rh: np.ndarray, e: np.ndarray, layer: tuple[np.ndarray, np.ndarray]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pure self-attention layer on ``X = 1xᵀ + 2^e R̂`` (batched: x (B, d), R̂ (B, n, d),
    e (B,)): the next ``(x, R̂, e)`` with ``R̂`` normalised (module docstring)."""
    Ms, Vs = layer
    n = Rh.shape[1]
    parts, exps = [], []
    x_new = np.zeros_like(x)
    for M, V in zip(Ms, Vs, strict=True):
        rho, Fh, t = _head(x, Rh, e, M)
        Y = Fh @ Rh @ V  # C F R V = 2^(t+e) C (F̂ R̂ V)
        parts.append(Y - Y.mean(1, keepdims=True))
        exps.append(t + e)
        corr = np.einsum("bn,bnd->bd", rho, Rh) + np.ldexp(np.einsum("bij,bjd->bd", Fh, Rh) / n,
                                                             np.clip(t, -2000, 2000)[:, None])
        x_new += (x + np.ldexp(corr, np.clip(e, -2000, 2000)[:, None])) @ V
    top = np.max(exps, axis=0)
    R = sum(np.ldexp(p, np.clip(k - top, -2000, 0)[:, None, None]) for p, k in zip(parts, exps, strict=True))
    Rn, en = _normalise(R, top)
    return x_new, Rn, en


def log10_norms(x: np.ndarray, Rh: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log10 ‖R‖_{1,∞} (absolute residual, composite norm) and log10 ‖X‖_{1,∞} of
    ``X = 1xᵀ + 2^e R̂`` (−inf for a zero residual)."""
    with np.errstate(divide="ignore"):
        res = e * LOG10_2 + np.log10(matrix_norm(Rh, "composite"))
    X = x[:, None, :] + np.ldexp(Rh, np.clip(e, -2000, 2000)[:, None, None])
    return res, np.log10(matrix_norm(X, "composite"))


def _propagate(X0: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """log10 ‖res‖_{1,∞} and log10 ‖X‖_{1,∞} per sequence and depth 0..L (B, L+1) from the
    embedding output ``X0`` (B, n, d) through ``layers`` (:func:`san_step`)."""
    x = X0.mean(1)
    Rh, e = _normalise(X0 - x[:, None, :], np.zeros(X0.shape[0], dtype=np.int64))
    res, norm = [], []
    for layer in [None, *layers]:
        if layer is not None:
            x, Rh, e = san_step(x, Rh, e, layer)
        r, nx = log10_norms(x, Rh, e)
        res.append(r)
        norm.append(nx)
    return np.stack(res, 1), np.stack(norm, 1)


#: two orderings agree on log10 ‖res‖ to this share of max(1, |log10 ‖res‖|), or the depth is not exact
AGREE = 1e-8


def san_residuals(model, ids: torch.Tensor) -> dict[str, Any]:
    """Residuals of a pure self-attention network (the project's Transformer, :func:`san_layers`)
    on token ids (B, T), past the float64 floor: per sequence and depth 0..L, log10 of the
    absolute residual ``‖X_l − 1x̄ᵀ‖_{1,∞}`` (composite norm, mean row), of ``‖X_l‖_{1,∞}`` and
    of the relative residual (their difference); also the float64 forward pass's own relative
    residual (log10), which stops at its rounding floor. The model is converted to float64 in
    place.

    Every value is computed twice, the second time with the tokens and the features in reverse
    order (the exact result is the same; every sum is rounded differently). A depth where the two
    disagree by more than :data:`AGREE` relative or whose residual is exactly 0 (an underflow:
    the true one is not), and every depth after it, is NaN (``exact`` False): the propagation is exact where the residual shrinks as a whole, but where tokens fall
    into clusters whose members agree to more digits than the clusters do (saturated attention
    at large weights) the within-cluster differences are below the precision of the
    representation, and this check finds it."""
    layers = san_layers(model)
    with torch.no_grad():
        _, hidden = model.double()(ids, return_hidden=True)
    X0 = hidden[0].numpy()
    res, norm = _propagate(X0, layers)
    flip = [(np.ascontiguousarray(M[:, ::-1, ::-1]), np.ascontiguousarray(V[:, ::-1, ::-1])) for M, V in layers]
    res2, _ = _propagate(np.ascontiguousarray(X0[:, ::-1, ::-1]), flip)
    with np.errstate(invalid="ignore"):
        agree = np.isfinite(res) & (np.abs(res - res2) <= AGREE * np.maximum(1.0, np.abs(res)))
    exact = np.cumprod(agree, axis=1).astype(bool)
    H = np.stack([h.numpy() for h in hidden], 1)
    plain = matrix_norm(H - H.mean(2, keepdims=True), "composite") / matrix_norm(H, "composite")
    res = np.where(exact, res, np.nan)
    with np.errstate(divide="ignore"):
        return {"log10_abs": res, "log10_norm": norm, "log10_rel": res - norm, "exact": exact,
                "log10_rel_float64": np.log10(plain)}
