"""Exact spectra and norms of factored products ``A Bᵀ``, batched, never forming ``A Bᵀ``.

A and B have shape ``(..., d, dh)``; the product ``A Bᵀ`` is ``d × d`` with rank ≤ dh.
Each factor is reduced to a small square root ``R`` of its Gram matrix (``XᵀX = RᵀR``), so

    A Bᵀ = Q_A (R_A R_Bᵀ) Q_Bᵀ   (Q_A, Q_B with orthonormal columns),

and the singular values of the product are those of the small core ``R_A R_Bᵀ``. The work is
O(d·dh²) per head, not O(d³). ``R`` comes from the float64 Gram matrix ``XᵀX`` and its
Cholesky factor (one GEMM and a small factorisation, fast); for a head whose factor is
ill-conditioned (``λ_min(XᵀX) < 1e-8 λ_max``, where squaring the condition number would cost
accuracy) it comes from a float64 QR of X instead, which keeps small singular values accurate. The Gram matrices
needed for the balance discrepancy are ``RᵀR``. A factor shared by several products (a kv head
in grouped-query attention) is reduced once: see :func:`factor_root` and
:func:`metrics_from_roots`.

Conventions (REFERENCE.md §1): Frobenius bound ``½(‖A‖²_F + ‖B‖²_F) ≥ ‖ABᵀ‖_*`` with equality
iff ``AᵀA = BᵀB``; ``gap = bound − nuclear``; ``balance = ‖AᵀA − BᵀB‖_F``,
``balance_rel = balance / (‖AᵀA‖_F + ‖BᵀB‖_F)``; numerical rank ``#{σ_i > τ σ_1}``;
effective rank ``exp(H(p))``, ``p = σ/Σσ`` (Roy & Vetterli); stable rank ``Σσ²/σ_1²``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used: ``attnrank --help`` reads DEFAULT_TOL without it
    import torch

DEFAULT_TOL = 1e-3
METRIC_COLUMNS = (
    "sv_max",
    "nuclear",
    "frob",
    "frob_bound",
    "gap",
    "balance",
    "balance_rel",
    "rank",
    "effective_rank",
    "stable_rank",
)


@dataclass(frozen=True)
class ProductMetrics:
    """Metrics of a batch of products ``A Bᵀ``; every field has the batch shape ``(...)``.

    ``sv`` has shape ``(..., k)``, descending. All floating fields are float64. Heads whose
    factors hold NaN/Inf have ``finite = False`` and NaN metrics.
    """

    sv: torch.Tensor
    sv_max: torch.Tensor
    nuclear: torch.Tensor
    frob: torch.Tensor
    frob_bound: torch.Tensor
    gap: torch.Tensor
    balance: torch.Tensor
    balance_rel: torch.Tensor
    rank: torch.Tensor
    effective_rank: torch.Tensor
    stable_rank: torch.Tensor
    finite: torch.Tensor
    tol: float

    def columns(self) -> dict[str, torch.Tensor]:
        """The per-item metrics (METRIC_COLUMNS), each of the batch shape."""
        return {name: getattr(self, name) for name in METRIC_COLUMNS}

    def __getitem__(self, idx) -> ProductMetrics:
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        return ProductMetrics(**{k: (v if k == "tol" else v[idx]) for k, v in vals.items()})


def _check_factors(A: torch.Tensor, B: torch.Tensor) -> None:
    if A.ndim < 2 or B.ndim < 2:
        raise ValueError(f"factors need at least 2 dims (..., d, dh); got {tuple(A.shape)}, {tuple(B.shape)}")
    if A.shape != B.shape:
        raise ValueError(f"factors A and B must have the same shape; got {tuple(A.shape)} and {tuple(B.shape)}")


GRAM_MIN_RATIO = 1e-8  # heads with λ_min(XᵀX) below this times λ_max take the QR path


CHUNK_BYTES = 16 * 2**20  # float64 copies of at most this size: glibc then reuses the memory
METRIC_CHUNK = 8  # heads per task in metrics_from_roots (fixed: results never depend on workers)


def _chunks(X: torch.Tensor, per: int) -> list[torch.Tensor]:
    flat = X.reshape(-1, *X.shape[-2:])
    return [flat[s:s + per] for s in range(0, flat.shape[0], per)]


def factor_roots(*Xs: torch.Tensor, workers: int = 1) -> list[torch.Tensor]:
    """:func:`factor_root` of each factor, the chunks of all of them shared by ``workers`` threads.

    Each chunk is reduced by one thread, so run it under ``torch_threads(1)`` (as
    :func:`attnrank.analysis.scan.analyze` does): a core taken by another process then slows
    one worker, not a barrier every small factorisation waits at. Chunks are fixed by
    CHUNK_BYTES alone, so the result is bit-identical whatever ``workers`` and the load.
    """
    import torch

    from attnrank.util.threads import parallel_map

    jobs, spans = [], []
    for X in Xs:
        X = X.detach()
        d, dh = X.shape[-2:]
        parts = _chunks(X, max(1, CHUNK_BYTES // max(1, 8 * d * dh))) or [X.reshape(-1, d, dh)]
        spans.append((len(jobs), len(jobs) + len(parts), X.shape[:-2]))
        jobs += parts
    done = parallel_map(_factor_root, jobs, workers)
    out = []
    for a, b, batch in spans:
        R = done[a] if b - a == 1 else torch.cat(done[a:b])
        out.append(R.reshape((*batch, *R.shape[-2:])))
    return out


def factor_root(X: torch.Tensor) -> torch.Tensor:
    """A float64 ``R`` with ``XᵀX = RᵀR`` for factors ``X`` of shape ``(..., d, dh)``.

    Shape ``(..., min(d, dh), dh)``. Any input dtype; upcast to float64 before arithmetic.
    Well-conditioned heads: ``R`` is the Cholesky factor of the float64 Gram matrix (one GEMM
    and a dh × dh factorisation). Heads not certified well-conditioned (:func:`_gram_certified`:
    ``λ_min(XᵀX) ≥ GRAM_MIN_RATIO · λ_max`` proven from ``R⁻¹``, else squaring the condition
    number could cost accuracy), or whose Gram matrix is not numerically positive definite:
    ``R`` from a float64 QR of X. Non-finite heads give NaN.

    Heads are upcast and reduced a few at a time (float64 copies of at most CHUNK_BYTES): one
    fresh 128 MiB float64 copy of a 4096-wide layer costs more in page faults than its Gram
    products cost in arithmetic.
    """
    return factor_roots(X)[0]


def _gram_certified(G: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """True where ``λ_min(G) ≥ GRAM_MIN_RATIO · λ_max(G)`` is proven, for ``RᵀR = G`` (Cholesky).

    Upper bounds only: ``λ_max ≤ min(trace G, ‖G‖₁)`` and ``1/λ_min = ‖R⁻¹‖₂² ≤
    min(‖R⁻¹‖²_F, ‖R⁻¹‖₁‖R⁻¹‖_∞)``; ``R⁻¹`` is one triangular solve (dh³/3 multiply-adds,
    about 1/(3d) of the Gram's), where an eigendecomposition of G cost more than the Cholesky
    it guarded. Conservative: a head just inside the ratio may take the (exact) QR path too.
    """
    import torch

    eye = torch.eye(R.shape[-1], dtype=R.dtype).expand_as(R)
    Ri = torch.linalg.solve_triangular(R, eye, upper=True).abs_()
    inv_sq = torch.minimum((Ri * Ri).sum((-2, -1)), Ri.sum(-2).amax(-1) * Ri.sum(-1).amax(-1))
    lam_max = torch.minimum(torch.diagonal(G, dim1=-2, dim2=-1).sum(-1), G.abs().sum(-2).amax(-1))
    return GRAM_MIN_RATIO * lam_max * inv_sq <= 1.0  # NaN/Inf (a singular R) is not certified


def _factor_root(X: torch.Tensor) -> torch.Tensor:
    import torch

    X = X.to(device="cpu", dtype=torch.float64)
    d, dh = X.shape[-2:]
    if d < dh:
        R = torch.linalg.qr(torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0), mode="r").R
        finite = torch.isfinite(X).all(-1).all(-1)
    else:
        G = X.mT @ X
        finite = torch.isfinite(torch.diagonal(G, dim1=-2, dim2=-1)).all(-1)  # G_jj = Σ_i X_ij²: NaN/Inf land here
        if not bool(finite.all()):
            G = torch.where(finite[..., None, None], G, torch.eye(dh, dtype=G.dtype))
        L, info = torch.linalg.cholesky_ex(G)
        R = L.mT
        bad = ~_gram_certified(G, R) | (info != 0)
        bad &= finite
        if bool(bad.any()):
            R[bad] = torch.linalg.qr(X[bad], mode="r").R
    if not bool(finite.all()):
        R = torch.where(finite[..., None, None], R, torch.full_like(R, float("nan")))
    return R


def singular_values(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Singular values of ``A Bᵀ`` (descending, float64), shape ``(..., min(d, dh))``."""
    _check_factors(A, B)
    return product_metrics(A, B).sv


def rank_measures(sv: torch.Tensor, tol: float = DEFAULT_TOL) -> dict[str, torch.Tensor]:
    """Numerical, effective and stable rank from descending singular values ``(..., k)``."""
    import torch

    if not tol > 0:
        raise ValueError(f"tolerance must be > 0, got {tol}")
    sv = sv.to(torch.float64)
    s1 = sv[..., 0]
    total = sv.sum(-1)
    rank = (sv > tol * s1.unsqueeze(-1)).sum(-1)
    rank = torch.where(s1 > 0, rank, torch.zeros_like(rank))
    p = sv / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    effective = torch.where(total > 0, torch.exp(-plogp.sum(-1)), torch.zeros_like(total))
    stable = torch.where(s1 > 0, (sv**2).sum(-1) / torch.where(s1 > 0, s1, torch.ones_like(s1)) ** 2,
                         torch.zeros_like(s1))
    return {"rank": rank, "effective_rank": effective, "stable_rank": stable}


def product_metrics(A: torch.Tensor, B: torch.Tensor, tol: float = DEFAULT_TOL, *, workers: int = 1) -> ProductMetrics:
    """All metrics of ``A Bᵀ`` for factors ``A, B`` of shape ``(..., d, dh)`` (any float dtype).

    Inputs are upcast to float64 before any arithmetic, so float16/bfloat16 weights are
    analysed exactly as stored. ``workers`` > 1 shares the heads among that many threads
    (see :func:`factor_roots`; same result).
    """
    _check_factors(A, B)
    Ra, Rb = factor_roots(A, B, workers=workers)
    return metrics_from_roots(Ra, Rb, tol, workers=workers)


def metrics_from_roots(Ra: torch.Tensor, Rb: torch.Tensor, tol: float = DEFAULT_TOL, *,
                       workers: int = 1) -> ProductMetrics:
    """All metrics of ``A Bᵀ`` from roots ``Ra = factor_root(A)``, ``Rb = factor_root(B)``.

    Heads are taken METRIC_CHUNK at a time, on ``workers`` threads (same result for any number).
    """
    import torch

    from attnrank.util.threads import parallel_map

    if not tol > 0:
        raise ValueError(f"tolerance must be > 0, got {tol}")
    batch = Ra.shape[:-2]
    pairs = list(zip(_chunks(Ra, METRIC_CHUNK), _chunks(Rb, METRIC_CHUNK), strict=True))
    if not pairs:
        pairs = [(Ra.reshape(-1, *Ra.shape[-2:]), Rb.reshape(-1, *Rb.shape[-2:]))]
    parts = parallel_map(lambda ab: _metrics(ab[0], ab[1], tol), pairs, workers)
    out = {}
    for key in parts[0]:
        v = parts[0][key] if len(parts) == 1 else torch.cat([q[key] for q in parts])
        out[key] = v.reshape((*batch, *v.shape[1:]))
    return ProductMetrics(**out, tol=tol)


def _metrics(Ra: torch.Tensor, Rb: torch.Tensor, tol: float) -> dict[str, torch.Tensor]:
    """The metrics of a flat batch of heads ``(n, k, dh)`` (see :func:`metrics_from_roots`)."""
    import torch

    finite = torch.isfinite(Ra).all(-1).all(-1) & torch.isfinite(Rb).all(-1).all(-1)
    if not bool(finite.all()):
        keep = finite[..., None, None]
        Ra = torch.where(keep, Ra, torch.zeros_like(Ra))
        Rb = torch.where(keep, Rb, torch.zeros_like(Rb))

    sv = torch.linalg.svdvals(Ra @ Rb.mT)
    ga, gb = Ra.mT @ Ra, Rb.mT @ Rb  # AᵀA, BᵀB (dh × dh)

    nuclear = sv.sum(-1)
    frob = torch.linalg.vector_norm(sv, dim=-1)
    bound = 0.5 * ((Ra**2).sum((-2, -1)) + (Rb**2).sum((-2, -1)))
    balance = torch.linalg.matrix_norm(ga - gb)
    scale = torch.linalg.matrix_norm(ga) + torch.linalg.matrix_norm(gb)
    balance_rel = torch.where(scale > 0, balance / torch.where(scale > 0, scale, torch.ones_like(scale)),
                              torch.zeros_like(scale))
    ranks = rank_measures(sv, tol)

    out = {
        "sv": sv,
        "sv_max": sv[..., 0],
        "nuclear": nuclear,
        "frob": frob,
        "frob_bound": bound,
        "gap": bound - nuclear,
        "balance": balance,
        "balance_rel": balance_rel,
        **ranks,
    }
    if not bool(finite.all()):
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        for key, val in out.items():
            mask = ~finite
            if key == "sv":
                mask = mask[..., None]
            out[key] = torch.where(mask, nan, val.to(torch.float64))
    return {**out, "finite": finite}
