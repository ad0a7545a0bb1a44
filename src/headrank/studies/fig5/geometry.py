"""The geometry of Figure 5 (the experiment's closed forms and scipy optima; no claims here).

Two scalars ``w = (w1, w2)``, loss = squared distance to a curve S. Our choice of S (the
paper's is not given): the circle of centre (1.6, 0.6) and radius 1, which does not contain
the origin, so its L2-minimal point ``c(1 − r/‖c‖)`` lies on the line through the origin and
the centre, while its L1-minimal point is where it crosses the w1 axis, (0.8, 0): sparse.

At a fixed point of AdamW with constant gradient g, ``λ_wd θ_i = −g_i/(|g_i| + ε)``, i.e.
``g_i = −ε λ_wd θ_i / (1 − λ_wd|θ_i|)`` (derived here): the L2 penalty ``λ_L2 = λ_wd ε`` of the
paper's conjecture, up to the factor ``1/(1 − λ_wd|θ_i|)``. So the conjecture needs
``λ_wd|θ| ≪ 1``, and it needs the iterate to settle at all, which takes ε not much smaller
than the learning rate (below that Adam acts like sign descent and ends in a limit cycle).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize


@dataclass(frozen=True)
class Circle:
    """The curve S of Figure 5 (our choice): a circle not containing the origin."""

    center: tuple[float, float] = (1.6, 0.6)
    radius: float = 1.0

    @property
    def c(self) -> np.ndarray:
        return np.asarray(self.center, dtype=np.float64)

    def loss(self, w: np.ndarray) -> np.ndarray:
        """Squared distance of ``w`` (..., 2) to the circle."""
        return (np.linalg.norm(w - self.c, axis=-1) - self.radius) ** 2

    def grad(self, w: np.ndarray) -> np.ndarray:
        """∇_w of :meth:`loss`."""
        diff = w - self.c
        n = np.linalg.norm(diff, axis=-1, keepdims=True)
        return 2.0 * (n - self.radius) * diff / n

    def min_l2_point(self) -> np.ndarray:
        """Point of S nearest the origin: ``c(1 − r/‖c‖)``."""
        c = self.c
        return c * (1 - self.radius / np.linalg.norm(c))

    def min_l1_point(self) -> np.ndarray:
        """Point of S of least L1 norm: the best of the axis crossings and the 45° tangent points."""
        c, r = self.c, self.radius
        cands = []
        for i in (0, 1):
            j = 1 - i
            if abs(c[j]) <= r:
                for sgn in (-1, 1):
                    p = np.zeros(2)
                    p[i] = c[i] + sgn * math.sqrt(r**2 - c[j] ** 2)
                    cands.append(p)
        for s1 in (-1, 1):
            for s2 in (-1, 1):
                s = np.array([s1, s2], dtype=np.float64)
                p = c - r * s / math.sqrt(2)  # tangent of |w1|+|w2| = const in the quadrant sign(p) = s
                if np.all(np.sign(p) == s):
                    cands.append(p)
        return min(cands, key=lambda p: np.abs(p).sum())




def l2_regularised_optimum(S: Circle, lam: float) -> np.ndarray:
    """argmin of dist²(w, S) + (λ/2)‖w‖², closed form for a circle not containing the origin.

    For a given distance δ to the circle the smallest ‖w‖ is ``‖c‖ − r − δ`` on the segment from
    the origin to the centre, so the optimum is ``α c/‖c‖`` with ``α = (‖c‖ − r)/(1 + λ/2)``.
    """
    c = S.c
    nc = float(np.linalg.norm(c))
    if nc <= S.radius:
        raise ValueError("closed form needs the origin outside the circle")
    return (nc - S.radius) / (1 + lam / 2) * c / nc


def l2_regularised_optimum_numeric(S: Circle, lam: float) -> np.ndarray:
    """The same optimum by scipy (multi-start BFGS), an independent check of the closed form."""
    f = lambda w: float(S.loss(w) + 0.5 * lam * w @ w)  # noqa: E731
    g = lambda w: S.grad(w) + lam * w  # noqa: E731
    best = None
    for th in np.linspace(0, 2 * np.pi, 12, endpoint=False):
        x0 = S.c + S.radius * np.array([math.cos(th), math.sin(th)])
        r = optimize.minimize(f, x0, jac=g, method="BFGS", options={"gtol": 1e-12})
        if best is None or r.fun < best.fun:
            best = r
    return best.x


def _split_minimize(S: Circle, penalty, dpenalty, upper: float | None = None) -> np.ndarray:
    """argmin over w of dist²(w, S) + Σ φ(|w_i|), φ convex increasing with φ(0) = 0.

    Solved as min over p, q ≥ 0 of dist²(p − q, S) + Σ φ(p_i) + φ(q_i) (L-BFGS-B; exact zeros
    at the bounds); the split is exact because φ(|p − q|) ≤ φ(p) + φ(q). Starts: the L2- and
    L1-minimal points of S (the limits of small penalties), a point beside the latter, and the
    best point of a 0.01 grid around S; the lowest local minimum wins.
    """

    def f(z):
        w = z[:2] - z[2:]
        return float(S.loss(w) + penalty(z).sum())

    def g(z):
        gw = S.grad(z[:2] - z[2:])
        return np.concatenate([gw, -gw]) + dpenalty(z)

    hi = None if upper is None else upper * (1 - 1e-9)
    c, r = S.c, S.radius
    g1, g2 = np.meshgrid(np.arange(c[0] - r - 0.5, c[0] + r + 0.5, 0.01),
                         np.arange(c[1] - r - 0.5, c[1] + r + 0.5, 0.01))
    grid = np.stack([g1.ravel(), g2.ravel()], axis=1)
    if hi is not None:
        grid = grid[(np.abs(grid) < hi * 0.99).all(axis=1)]
    absg = np.abs(grid)
    with np.errstate(invalid="ignore", divide="ignore"):
        vals = S.loss(grid) + penalty(absg.ravel()).reshape(absg.shape).sum(axis=1)
    starts = [S.min_l2_point(), S.min_l1_point(), S.min_l1_point() + np.array([0.0, 0.05]),
              grid[np.nanargmin(vals)]]
    best = None
    for w0 in starts:
        z0 = np.concatenate([np.maximum(w0, 0), np.maximum(-w0, 0)])
        if hi is not None:
            z0 = np.minimum(z0, hi * 0.99)
        res = optimize.minimize(f, z0, jac=g, method="L-BFGS-B", bounds=[(0.0, hi)] * 4,
                                options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 20000, "maxcor": 20})
        if best is None or res.fun < best.fun:
            best = res
    return best.x[:2] - best.x[2:]


@functools.lru_cache(maxsize=512)
def _l1_opt(S: Circle, lam: float) -> tuple[float, float]:
    return tuple(_split_minimize(S, lambda z: lam * z, lambda z: np.full_like(z, lam)))


def l1_regularised_optimum(S: Circle, lam: float) -> np.ndarray:
    """argmin of dist²(w, S) + λ‖w‖₁ (scipy, split variables): what L2 on factors w = a·b becomes."""
    return np.array(_l1_opt(S, float(lam)))


@functools.lru_cache(maxsize=512)
def _adamw_fp(S: Circle, lam: float, eps: float, factorized: bool) -> tuple[float, float]:
    if factorized:
        def pen(z):
            s = np.sqrt(z)
            return eps * (-2 * s - (2 / lam) * np.log1p(-lam * s))

        def dpen(z):
            return eps * lam / (1 - lam * np.sqrt(z))

        upper = 1 / lam**2
    else:
        def pen(z):
            return eps * (-z - np.log1p(-lam * z) / lam)

        def dpen(z):
            return eps * lam * z / (1 - lam * z)

        upper = 1 / lam
    return tuple(_split_minimize(S, pen, dpen, upper=upper))


def adamw_fixed_point(S: Circle, lam_wd: float, eps: float, *, factorized: bool) -> np.ndarray:
    """The exact fixed point of deterministic AdamW (derived here), by scipy.

    Direct: ``∂L/∂w_i = −ε λ w_i/(1 − λ|w_i|)``, the stationarity of
    ``L + ε Σ[−|w_i| − log(1 − λ|w_i|)/λ]``. Factorized ``w = a·b`` (balanced at the fixed point):
    ``∂L/∂w_i = −ε λ sign(w_i)/(1 − λ√|w_i|)``, the stationarity of
    ``L + ε Σ[−2√|w_i| − (2/λ) log(1 − λ√|w_i|)]``. Both reduce to the conjecture's
    λ_L2 = λε (resp. L1 with λε) when λ|θ| → 0.
    """
    return np.array(_adamw_fp(S, float(lam_wd), float(eps), bool(factorized)))

