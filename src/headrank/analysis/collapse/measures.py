"""Measures of token representations ``X`` (n tokens × d), docs/methods/collapse.md.

- relative residual ``‖X − 1xᵀ‖ / ‖X‖`` in the ℓ1 norm (max column abs-sum), the ℓ∞ norm
  (max row abs-sum), the composite ``‖·‖_{1,∞} = √(‖·‖_1 ‖·‖_∞)`` and the Frobenius norm, with
  ``x`` either the mean row (``center="mean"``, the reference code's choice) or the best fit
  ``argmin_x ‖X − 1xᵀ‖`` in that norm (``center="best"``: the mean for Frobenius, the
  column-wise median for ℓ1, a linear program for ℓ∞; for the composite norm, which is not
  convex in x, the best of those three candidates: an upper bound on the exact minimum);
- mean pairwise cosine similarity of the tokens (i ≠ j), effective rank ``exp(H(σ/Σσ))`` and
  stable rank ``Σσ²/σ₁²`` of X (not centred), computed in :func:`token_measures` by the core's one
  definition of each (:func:`headrank.core.metrics.effective_rank`, ``stable_rank``) on X's
  singular values, with its zero/NaN semantics: 0 for a zero X.

The primary measure (plots, claims) is ``res_composite``: composite norm, mean row.
"""

from __future__ import annotations

import numpy as np
import torch

from headrank.core import metrics as core
from headrank.errors import HeadRankError

NORMS = ("l1", "linf", "composite", "fro")
CENTERS = ("mean", "best")
MEASURES = ("res_composite", "res_l1", "res_linf", "res_fro", "res_best_l1", "cosine",
            "effective_rank", "stable_rank")
PRIMARY = "res_composite"


def _as_array(X) -> np.ndarray:
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().double().numpy()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim < 2:
        raise HeadRankError(f"token representations must be (..., n, d), got shape {X.shape}")
    return X


def matrix_norm(M, norm: str = "composite") -> np.ndarray:
    """ℓ1 (max column abs-sum), ℓ∞ (max row abs-sum), composite √(ℓ1·ℓ∞) or Frobenius norm
    of ``M`` (..., n, d), batched over leading dimensions."""
    M = _as_array(M)
    A = np.abs(M)
    if norm == "l1":
        return A.sum(-2).max(-1)
    if norm == "linf":
        return A.sum(-1).max(-1)
    if norm == "composite":
        return np.sqrt(A.sum(-2).max(-1) * A.sum(-1).max(-1))
    if norm == "fro":
        return np.sqrt((M * M).sum((-2, -1)))
    raise HeadRankError(f"unknown norm {norm!r}; use one of {', '.join(NORMS)}")


def linf_best_row(X) -> np.ndarray:
    """``argmin_x max_i Σ_j |X_ij − x_j|`` by a linear program (HiGHS dual simplex).

    O(n·d) variables: meant for small matrices (a 32 × 384 matrix takes seconds).
    """
    import scipy.sparse as sp
    from scipy.optimize import linprog

    X = _as_array(X)
    if X.ndim != 2:
        raise HeadRankError("linf_best_row takes one (n, d) matrix")
    n, d = X.shape
    nd = n * d
    pick = sp.kron(sp.csr_matrix(np.ones((n, 1))), sp.identity(d))  # row (i, j) picks x_j
    eye, zcol = sp.identity(nd), sp.csr_matrix((nd, 1))
    rowsum = sp.kron(sp.identity(n), sp.csr_matrix(np.ones((1, d))))
    A = sp.vstack([sp.hstack([-pick, -eye, zcol]),      # X_ij − x_j ≤ u_ij
                   sp.hstack([pick, -eye, zcol]),       # x_j − X_ij ≤ u_ij
                   sp.hstack([sp.csr_matrix((n, d)), rowsum, -sp.csr_matrix(np.ones((n, 1)))])]).tocsr()
    b = np.concatenate([-X.ravel(), X.ravel(), np.zeros(n)])
    c = np.zeros(d + nd + 1)
    c[-1] = 1.0
    bounds = [(None, None)] * d + [(0, None)] * (nd + 1)
    res = linprog(c, A_ub=A, b_ub=b, bounds=bounds, method="highs-ds")
    if not res.success:  # pragma: no cover - a feasible bounded LP
        raise RuntimeError(f"linprog failed: {res.message}")
    return res.x[:d]


def best_row(X, norm: str = "fro") -> np.ndarray:
    """The row x minimising ``‖X − 1xᵀ‖`` in ``norm`` (composite: best of the mean, median and
    ℓ∞-optimal rows, an upper bound on the exact minimum). Shape (..., 1, d)."""
    X = _as_array(X)
    if norm == "fro":
        return X.mean(-2, keepdims=True)
    if norm == "l1":
        return np.median(X, axis=-2, keepdims=True)
    if norm not in ("linf", "composite"):
        raise HeadRankError(f"unknown norm {norm!r}; use one of {', '.join(NORMS)}")
    lead = X.shape[:-2]
    flat = X.reshape(-1, *X.shape[-2:])
    out = np.empty((flat.shape[0], 1, X.shape[-1]))
    for i, M in enumerate(flat):
        xl = linf_best_row(M)[None]
        if norm == "linf":
            out[i] = xl
            continue
        cands = [M.mean(0, keepdims=True), np.median(M, 0, keepdims=True), xl]
        out[i] = min(cands, key=lambda x: float(matrix_norm(M - x, "composite")))
    return out.reshape(*lead, 1, X.shape[-1])


def residual(X, norm: str = "composite", center: str = "mean") -> np.ndarray:
    """Relative residual ``‖X − 1xᵀ‖ / ‖X‖`` (NaN where X = 0), batched over leading dims."""
    X = _as_array(X)
    if center == "mean":
        x = X.mean(-2, keepdims=True)
    elif center == "best":
        x = best_row(X, norm)
    else:
        raise HeadRankError(f"unknown center {center!r}; use one of {', '.join(CENTERS)}")
    num, den = matrix_norm(X - x, norm), matrix_norm(X, norm)
    return np.divide(num, den, out=np.full(np.shape(num), np.nan), where=den > 0)


def cosine_similarity(X) -> np.ndarray:
    """Mean cosine similarity over pairs of distinct tokens (NaN for a zero row or n < 2)."""
    X = _as_array(X)
    n = X.shape[-2]
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        U = X / norms
    G = U @ np.swapaxes(U, -1, -2)
    if n < 2:
        return np.full(X.shape[:-2], np.nan)
    return (G.sum((-2, -1)) - np.trace(G, axis1=-2, axis2=-1)) / (n * (n - 1))


def _svals(X) -> np.ndarray:
    return np.linalg.svd(_as_array(X), compute_uv=False)


def token_measures(X) -> dict[str, np.ndarray]:
    """Every measure in :data:`MEASURES` for X (..., n, d)."""
    X = _as_array(X)
    out = {f"res_{n}": residual(X, n, "mean") for n in NORMS}
    out["res_best_l1"] = residual(X, "l1", "best")
    out["cosine"] = cosine_similarity(X)
    s = _svals(X)
    out["effective_rank"] = core.effective_rank(s).numpy()[()]
    out["stable_rank"] = core.stable_rank(s).numpy()[()]
    return {k: out[k] for k in MEASURES}
