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

Conventions (docs/methods/products.md): Frobenius bound ``½(‖A‖²_F + ‖B‖²_F) ≥ ‖ABᵀ‖_*`` with equality
iff ``AᵀA = BᵀB``; ``gap = bound − nuclear``; ``balance = ‖AᵀA − BᵀB‖_F``,
``balance_rel = balance / (‖AᵀA‖_F + ‖BᵀB‖_F)``; numerical rank ``#{σ_i > τ σ_1}``;
effective rank ``exp(H(p))``, ``p = σ/Σσ`` (Roy & Vetterli); stable rank ``Σσ²/σ_1²``; energy
ranks ``k90``/``k99``; ``gap_rel = gap / bound``. Every per-head measure is a row of the one
metric table, :mod:`headrank.core.metrics`, which also states the zero/NaN semantics.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

# the metric table and the rank measures live in headrank.core.metrics (re-exported here)
from headrank.core.metrics import DEFAULT_TOL as DEFAULT_TOL
from headrank.core.metrics import METRIC_COLUMNS as METRIC_COLUMNS
from headrank.core.metrics import energy_rank as energy_rank
from headrank.core.metrics import from_singular_values
from headrank.core.metrics import rank_measures as rank_measures

if TYPE_CHECKING:  # torch is imported where used: ``headrank --help`` reads DEFAULT_TOL without it
    import torch


@dataclass(frozen=True)
class ProductMetrics:
    """Metrics of a batch of products ``A Bᵀ``: ``sv`` ``(..., k)`` descending, ``finite`` and
    one value per row of :data:`headrank.core.metrics.METRICS` (``m.rank``, ``m.k90`` …), each of
    the batch shape ``(...)``.

    Floating values are float64; the integer measures (``rank``, ``k90``, ``k99``) are int64,
    or float64 for a batch holding a non-finite head. Heads whose factors hold NaN/Inf have
    ``finite = False`` and NaN metrics.
    """

    sv: torch.Tensor
    values: dict[str, torch.Tensor]
    finite: torch.Tensor
    tol: float

    def __getattr__(self, name: str) -> torch.Tensor:
        values = self.__dict__.get("values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def columns(self) -> dict[str, torch.Tensor]:
        """The per-item metrics (METRIC_COLUMNS), each of the batch shape."""
        return {name: self.values[name] for name in METRIC_COLUMNS}

    def __getitem__(self, idx) -> ProductMetrics:
        return ProductMetrics(sv=self.sv[idx], values={k: v[idx] for k, v in self.values.items()},
                              finite=self.finite[idx], tol=self.tol)


def _check_factors(A: torch.Tensor, B: torch.Tensor) -> None:
    if A.ndim < 2 or B.ndim < 2:
        raise ValueError(f"factors need at least 2 dims (..., d, dh); got {tuple(A.shape)}, {tuple(B.shape)}")
    if A.shape != B.shape:
        raise ValueError(f"factors A and B must have the same shape; got {tuple(A.shape)} and {tuple(B.shape)}")


GRAM_MIN_RATIO = 1e-8  # heads with λ_min(XᵀX) below this times λ_max take the QR path


CHUNK_BYTES = 16 * 2**20  # heads are upcast to float64 this many bytes at a time, into reused buffers
_BUFFERS: list = []  # free float64 upcast buffers (numpy), one per worker in use
_BUF_LOCK = threading.Lock()
METRIC_CHUNK = 8  # heads per task in metrics_from_roots (fixed: results never depend on workers)


def _chunks(X: torch.Tensor, per: int) -> list[torch.Tensor]:
    flat = X.reshape(-1, *X.shape[-2:])
    return [flat[s:s + per] for s in range(0, flat.shape[0], per)]


def factor_roots(*Xs: torch.Tensor, workers: int = 1) -> list[torch.Tensor]:
    """:func:`factor_root` of each factor, the chunks of all of them shared by ``workers`` threads.

    Each chunk is reduced by one thread, so run it under ``torch_threads(1)`` (as
    :func:`headrank.analysis.scan.analyze` does): a core taken by another process then slows
    one worker, not a barrier every small factorisation waits at. Chunks are fixed by
    CHUNK_BYTES alone, so the result is bit-identical whatever ``workers`` and the load.
    """
    import torch

    from headrank.util.threads import parallel_map

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
    Well-conditioned heads: ``R`` is the Cholesky factor of the float64 Gram matrix (one
    symmetric rank-k update, BLAS ``dsyrk``, and a dh × dh factorisation). Heads not certified
    well-conditioned (:func:`_gram_certified`:
    ``λ_min(XᵀX) ≥ GRAM_MIN_RATIO · λ_max`` proven from ``R⁻¹``, else squaring the condition
    number could cost accuracy), or whose Gram matrix is not numerically positive definite:
    ``R`` from a float64 QR of X. Non-finite heads give NaN.

    Heads are upcast and reduced a few at a time, into reused float64 buffers of CHUNK_BYTES:
    one fresh 128 MiB float64 copy of a 4096-wide layer costs more in page faults than its
    Gram products cost in arithmetic. Each head's Gram is computed alone, so the result does
    not depend on how heads are chunked or shared among workers.
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


def _float64_rows(X: torch.Tensor):
    """``X`` ``(n, d, dh)`` upcast into a reused float64 buffer, laid out for BLAS ``syrk``.

    Returns ``(pool, buf, rows)``: the buffer to hand back (:func:`_release`), and in it a
    numpy view ``buf`` ``(n, dh, d)`` holding each ``X_hᵀ`` when ``X``'s
    columns are contiguous (a projection's head block, ``W_h`` rows), else ``(n, d, dh)``
    holding ``X_h`` (a column block of W_O); ``rows`` says which. Either way each head is one
    contiguous block and its Gram is ``B Bᵀ`` or ``Bᵀ B`` of a single operand, which numpy
    hands to BLAS ``dsyrk`` (half the multiply-adds of a GEMM). The copy is the upcast: a
    fresh float64 array per chunk cost more in page faults than the Gram's arithmetic.
    """
    import numpy as np
    import torch

    n, d, dh = X.shape
    rows = X.stride(-2) == 1 and X.stride(-1) != 1  # X_hᵀ is the contiguous one
    with _BUF_LOCK:
        pool = _BUFFERS.pop() if _BUFFERS else np.empty(0)
    if pool.size < n * d * dh:
        pool = np.empty(max(n * d * dh, CHUNK_BYTES // 8))
    buf = pool[: n * d * dh].reshape((n, dh, d) if rows else (n, d, dh))
    torch.from_numpy(buf).copy_(X.mT if rows else X)
    return pool, buf, rows


def _release(pool) -> None:
    with _BUF_LOCK:
        _BUFFERS.append(pool)


def _factor_root(X: torch.Tensor) -> torch.Tensor:
    import numpy as np
    import torch

    X = X.to(device="cpu")
    n, d, dh = X.shape
    if d < dh:
        X = X.to(dtype=torch.float64)
        R = torch.linalg.qr(torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0), mode="r").R
        finite = torch.isfinite(X).all(-1).all(-1)
        if not bool(finite.all()):
            R = torch.where(finite[..., None, None], R, torch.full_like(R, float("nan")))
        return R
    pool, buf, rows = _float64_rows(X)
    try:
        # X_hᵀX_h as one operand times its own transpose: numpy's matmul calls dsyrk for that
        G = torch.from_numpy(np.matmul(buf, buf.transpose(0, 2, 1)) if rows
                             else np.matmul(buf.transpose(0, 2, 1), buf))
        Xd = torch.from_numpy(buf)
        Xd = Xd.mT if rows else Xd  # (n, d, dh) float64 views, for the QR fallback
        finite = torch.isfinite(torch.diagonal(G, dim1=-2, dim2=-1)).all(-1)  # G_jj = Σ_i X_ij²: NaN/Inf land here
        if not bool(finite.all()):
            G = torch.where(finite[..., None, None], G, torch.eye(dh, dtype=G.dtype))
        L, info = torch.linalg.cholesky_ex(G)
        R = L.mT
        bad = ~_gram_certified(G, R) | (info != 0)
        bad &= finite
        if bool(bad.any()):
            R[bad] = torch.linalg.qr(Xd[bad], mode="r").R
    finally:
        _release(pool)
    if not bool(finite.all()):
        R = torch.where(finite[..., None, None], R, torch.full_like(R, float("nan")))
    return R


def singular_values(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Singular values of ``A Bᵀ`` (descending, float64), shape ``(..., min(d, dh))``."""
    _check_factors(A, B)
    return product_metrics(A, B).sv


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

    from headrank.util.threads import parallel_map

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
    sv, finite = out.pop("sv"), out.pop("finite")
    return ProductMetrics(sv=sv, values=out, finite=finite, tol=tol)


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
    bound = 0.5 * ((Ra**2).sum((-2, -1)) + (Rb**2).sum((-2, -1)))
    balance = torch.linalg.matrix_norm(ga - gb)
    scale = torch.linalg.matrix_norm(ga) + torch.linalg.matrix_norm(gb)
    out = {"sv": sv, **from_singular_values(sv, bound, balance, scale, tol)}
    if not bool(finite.all()):
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        for key, val in out.items():
            mask = ~finite
            if key == "sv":
                mask = mask[..., None]
            out[key] = torch.where(mask, nan, val.to(torch.float64))
    return {**out, "finite": finite}


def product_svd(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact thin SVD ``A Bᵀ = U diag(S) Vᵀ`` of a factored product, never forming ``A Bᵀ``.

    ``A`` is ``(..., m, r)``, ``B`` is ``(..., n, r)`` (the row counts may differ: a stack of a
    query group's factors against its shared kv factor). With ``A = Q_A R_A`` and
    ``B = Q_B R_B``, ``A Bᵀ = Q_A (R_A R_Bᵀ) Q_Bᵀ``; the SVD of the small core
    ``R_A R_Bᵀ = U_c S V_cᵀ`` gives ``U = Q_A U_c``, ``V = Q_B V_c``. ``R`` comes from
    :func:`factor_roots` (float64 Gram and Cholesky where certified well-conditioned); where both
    roots are well-conditioned (``‖R‖_F ‖R⁻¹‖_F ≤`` PRODUCT_SVD_COND) ``Q U_c = X (R⁻¹ U_c)``
    costs one GEMM, elsewhere (rank-deficient or ill-conditioned factors) a float64 Householder
    QR gives ``Q`` itself. O((m + n)·r²) per item. Returns float64 ``U (..., m, p)``, ``S (..., p)``
    descending, ``V (..., n, p)`` with ``p = min(m, n, r)``.
    """
    import torch

    if A.ndim < 2 or B.ndim < 2 or A.shape[:-2] != B.shape[:-2] or A.shape[-1] != B.shape[-1]:
        raise ValueError(f"factors must be (..., m, r) and (..., n, r); got {tuple(A.shape)}, {tuple(B.shape)}")
    A = A.detach().to(device="cpu", dtype=torch.float64)
    B = B.detach().to(device="cpu", dtype=torch.float64)
    batch, r = A.shape[:-2], A.shape[-1]
    p = min(A.shape[-2], B.shape[-2], r)
    A, B = A.reshape(-1, *A.shape[-2:]), B.reshape(-1, *B.shape[-2:])
    if min(A.shape[-2], B.shape[-2]) < r:  # a root would not be square: Householder throughout
        fast = torch.zeros(A.shape[0], dtype=torch.bool)
    else:
        Ra, Rb = factor_roots(A, B)
        eye = torch.eye(r, dtype=torch.float64)
        inv = [torch.linalg.solve_triangular(R, eye.expand_as(R), upper=True) for R in (Ra, Rb)]
        cond = [torch.linalg.matrix_norm(R) * torch.linalg.matrix_norm(Ri) for R, Ri in zip((Ra, Rb), inv, strict=True)]
        fast = (cond[0] <= PRODUCT_SVD_COND) & (cond[1] <= PRODUCT_SVD_COND)
    U = torch.empty(A.shape[0], A.shape[-2], p, dtype=torch.float64)
    V = torch.empty(B.shape[0], B.shape[-2], p, dtype=torch.float64)
    S = torch.empty(A.shape[0], p, dtype=torch.float64)
    if bool(fast.any()):
        Uc, s, Vch = torch.linalg.svd(Ra[fast] @ Rb[fast].mT)
        U[fast] = A[fast] @ (inv[0][fast] @ Uc)[..., :p]
        V[fast] = B[fast] @ (inv[1][fast] @ Vch.mT)[..., :p]
        S[fast] = s[..., :p]
    slow = ~fast
    if bool(slow.any()):
        Qa, Ra_ = torch.linalg.qr(A[slow])
        Qb, Rb_ = torch.linalg.qr(B[slow])
        Uc, s, Vch = torch.linalg.svd(Ra_ @ Rb_.mT, full_matrices=False)
        U[slow], S[slow], V[slow] = (Qa @ Uc)[..., :p], s[..., :p], (Qb @ Vch.mT)[..., :p]
    return U.reshape(*batch, *U.shape[-2:]), S.reshape(*batch, p), V.reshape(*batch, *V.shape[-2:])


#: product_svd's fast path: both roots with ‖R‖_F ‖R⁻¹‖_F at most this (orthogonality of
#: X R⁻¹ then holds to ~1e-16 · cond² ≤ 1e-10)
PRODUCT_SVD_COND = 1e3
