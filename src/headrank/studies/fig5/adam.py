"""Adam / AdamW in numpy, batched over configurations, step for step as ``torch.optim`` (tests
compare them to torch in float64), and the gradients of the Figure 5 toy (direct and ``w = a ⊙ b``)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from headrank.studies.fig5.geometry import Circle


def adam_batch(grad_fn, x0: np.ndarray, *, lr: float, eps, l2=0.0, wd=0.0, steps: int,
               betas: tuple[float, float] = (0.9, 0.999), record_every: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Adam / AdamW on a batch of independent problems, step for step as ``torch.optim``.

    ``x0``: (n, p). ``eps``, ``l2`` (Adam's coupled ``weight_decay``: adds ``l2·θ`` to the
    gradient) and ``wd`` (AdamW's decoupled decay: ``θ ← θ(1 − lr·wd)`` before the update) are
    scalars or (n,) arrays. Returns the final iterate and the iterates recorded every
    ``record_every`` steps (the start included): (n_records, n, p).
    """
    x = np.array(x0, dtype=np.float64)
    n = x.shape[0]
    col = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,))[:, None]  # noqa: E731
    eps, l2, wd = col(eps), col(l2), col(wd)
    b1, b2 = betas
    m = np.zeros_like(x)
    v = np.zeros_like(x)
    rec = [x.copy()]
    for t in range(1, steps + 1):
        g = grad_fn(x) + l2 * x
        x = x * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        x = x - (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)
        if t % record_every == 0:
            rec.append(x.copy())
    return x, np.stack(rec)


def direct_grad(S: Circle) -> Callable[[np.ndarray], np.ndarray]:
    """∇ of the squared distance to S with respect to w itself."""
    return S.grad


def factorized_grad(S: Circle) -> Callable[[np.ndarray], np.ndarray]:
    """θ = (a1, a2, b1, b2), w = a ⊙ b: ∇_a = ∇L(w) ⊙ b, ∇_b = ∇L(w) ⊙ a."""

    def g(x):
        a, b = x[:, :2], x[:, 2:]
        gw = S.grad(a * b)
        return np.concatenate([gw * b, gw * a], axis=1)

    return g


def to_w(x: np.ndarray) -> np.ndarray:
    """Parameters → (w1, w2): identity for direct (…, 2), a ⊙ b for factorized (…, 4)."""
    return x if x.shape[-1] == 2 else x[..., :2] * x[..., 2:]

