"""The abstract's "any local minimum of ``L(ABᵀ) + λ(‖A‖² + ‖B‖²)`` coincides with a minimum of
``L(ABᵀ) + λ‖ABᵀ‖_*``", tested beyond Figure 1's diagonal 5×5 target (the experiment; the rule is
``fig1.local_minima`` in :mod:`.claims`).

The loss is Figure 1's, ``F(A, B) = ‖ABᵀ − D‖²_F + (λ/2)(‖A‖²_F + ‖B‖²_F)`` with ``A`` m×k and
``B`` n×k, on random targets ``D`` that are not diagonal, square and rectangular, of full and of
low rank, each scaled to spectral norm 1. Since ``min{½(‖A‖² + ‖B‖²) : ABᵀ = W} = ‖W‖_*``
(Proposition 3.1), the nuclear-norm problem that shares F's minima is
``N(W) = ‖W − D‖²_F + λ‖W‖_*``, strictly convex, whose one minimiser soft-thresholds the singular
values of D at **λ/2** (the data term has no ½): ``W* = U max(Σ − λ/2, 0) Vᵀ`` (docs/METHODS.md §5;
computed here by numpy's SVD, independently of the descent). The abstract writes the same λ in
front of ``‖A‖² + ‖B‖²`` and of ``‖ABᵀ‖_*``; read literally (F with λ/2 pairs with N with λ/2),
its optimum thresholds at λ/4: the distance to that optimum is recorded too, so the test can
tell the two readings apart.

Every (target, λ, initialisation) is one *case*: plain gradient descent (:func:`headrank.studies.
fig1.gd.gd_step`, batched over λ and the initialisations) for a fixed number of steps, then at
the end point: the gradient norm and the smallest eigenvalue of F's Hessian (torch autograd,
float64; whether the end point is a local minimum at all), the distance of ``ABᵀ`` to ``W*``,
``F(A, B) − N(W*)`` and the imbalance ``‖AᵀA − BᵀB‖_F``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headrank.studies.fig1.gd import fig1_gradients, gd_step


def nuclear_optimum(D: np.ndarray, lam: float) -> np.ndarray:
    """The minimiser of ``‖W − D‖²_F + lam‖W‖_*``: D's singular values soft-thresholded at lam/2."""
    u, s, vt = np.linalg.svd(np.asarray(D, dtype=np.float64), full_matrices=False)
    return (u * np.maximum(s - lam / 2.0, 0.0)) @ vt


def nuclear_objective(W: np.ndarray, D: np.ndarray, lam: float) -> float:
    """``‖W − D‖²_F + lam‖W‖_*``."""
    return float(((W - D) ** 2).sum() + lam * np.linalg.svd(W, compute_uv=False).sum())


def factor_objective(A: np.ndarray, B: np.ndarray, D: np.ndarray, lam: float) -> float:
    """``‖ABᵀ − D‖²_F + (lam/2)(‖A‖²_F + ‖B‖²_F)``."""
    return float(((A @ B.T - D) ** 2).sum() + lam / 2.0 * ((A**2).sum() + (B**2).sum()))


def target(m: int, n: int, rank: int, seed: int) -> np.ndarray:
    """A random m×n target of the given rank (a product of Gaussian factors; full rank when
    ``rank >= min(m, n)``), scaled to spectral norm 1: not diagonal in any basis we chose."""
    rng = np.random.default_rng([seed, m, n, rank])
    r = min(rank, m, n)
    D = rng.normal(size=(m, r)) @ rng.normal(size=(r, n)) if r < min(m, n) else rng.normal(size=(m, n))
    return D / np.linalg.norm(D, ord=2)


def hessian_min_eig(A: np.ndarray, B: np.ndarray, D: np.ndarray, lam: float) -> float:
    """The smallest eigenvalue of F's Hessian in (A, B) at this point (torch autograd, float64)."""
    m, k = A.shape
    Dt = torch.from_numpy(np.asarray(D, dtype=np.float64))

    def f(x: torch.Tensor) -> torch.Tensor:
        a, b = x[: m * k].reshape(m, k), x[m * k:].reshape(-1, k)
        return ((a @ b.T - Dt) ** 2).sum() + lam / 2.0 * ((a**2).sum() + (b**2).sum())

    x = torch.from_numpy(np.concatenate([A.ravel(), B.ravel()]).astype(np.float64))
    H = torch.autograd.functional.hessian(f, x, vectorize=True)
    return float(torch.linalg.eigvalsh(H)[0])


def descend(D: np.ndarray, k: int, lambdas, inits, *, eta: float, steps: int, seed: int) -> tuple[np.ndarray, ...]:
    """Gradient descent from every (λ, init std) pair at once: A (λ, init, m, k), B (λ, init, n, k).
    The init draws (i.i.d. normal, one draw per init std, shared by every λ) come from ``seed``."""
    m, n = D.shape
    rng = np.random.default_rng([seed, 7919])
    lam = np.asarray(lambdas, dtype=np.float64)[:, None, None, None]
    A0 = np.stack([rng.normal(size=(m, k)) * s for s in inits])
    B0 = np.stack([rng.normal(size=(n, k)) * s for s in inits])
    A = np.broadcast_to(A0, (lam.shape[0], *A0.shape)).copy()
    B = np.broadcast_to(B0, (lam.shape[0], *B0.shape)).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(steps):
            A, B = gd_step(A, B, D, lam, eta)
    return A, B


def _case(A: np.ndarray, B: np.ndarray, D: np.ndarray, lam: float) -> dict[str, Any]:
    """What is measured at one end point (see the module docstring)."""
    scale = float(np.linalg.norm(D))
    W = A @ B.T
    finite = bool(np.isfinite(W).all())
    opt = nuclear_optimum(D, lam)
    n_star = nuclear_objective(opt, D, lam)
    out: dict[str, Any] = {"lam": lam, "finite": finite, "rank_optimum": int((np.linalg.svd(opt, compute_uv=False)
                                                                             > 1e-12).sum()),
                           "nuclear_min": n_star}
    if not finite:
        return {**out, "grad_norm": float("inf"), "hessian_min": float("nan"), "dist": float("nan"),
                "dist_literal": float("nan"), "optima_apart": float("nan"), "objective_gap": float("nan"), "imbalance": float("nan")}
    _, gA, gB = fig1_gradients(A, B, D, lam)
    return {**out, "grad_norm": float(np.sqrt((gA**2).sum() + (gB**2).sum())),
            "hessian_min": hessian_min_eig(A, B, D, lam),
            "dist": float(np.linalg.norm(W - opt)) / scale,
            "dist_literal": float(np.linalg.norm(W - nuclear_optimum(D, lam / 2.0))) / scale,
            "optima_apart": float(np.linalg.norm(opt - nuclear_optimum(D, lam / 2.0))) / scale,
            "objective_gap": (factor_objective(A, B, D, lam) - n_star) / max(n_star, 1e-300),
            "imbalance": float(np.linalg.norm(A.T @ A - B.T @ B))}


def local_minima(targets, lambdas, inits, seeds, *, eta: float, steps: int) -> list[dict[str, Any]]:
    """Every case: per target ``(m, n, k, rank)`` and seed, descent from every (λ, init) pair."""
    cases = []
    for m, n, k, rank in targets:
        for seed in seeds:
            D = target(m, n, rank, seed)
            A, B = descend(D, k, lambdas, inits, eta=eta, steps=steps, seed=seed)
            for i, lam in enumerate(lambdas):
                for j, s in enumerate(inits):
                    cases.append({"shape": [m, n], "k": k, "rank_target": min(rank, m, n), "seed": seed,
                                  "init_std": s, **_case(A[i, j], B[i, j], D, float(lam))})
    return cases
