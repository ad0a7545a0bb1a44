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
from typing import TYPE_CHECKING, Any

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

    sv: torch.Tensor  # or a numpy array: numpy roots give numpy metrics (metrics_from_roots)
    values: dict[str, torch.Tensor]
    finite: torch.Tensor
    tol: float
    #: per item, the modelled bound on max |σᵢ − σᵢ(float64)| / σ_max (numpy; 0 where computed in
    #: float64, NaN where not finite; headrank.core.precision), and where the ``auto`` route's
    #: bound did not hold the contract and float64 recomputed the item; None: not asked
    bound: Any = None
    fallback: Any = None

    def __getattr__(self, name: str) -> torch.Tensor:
        values = self.__dict__.get("values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def columns(self) -> dict[str, torch.Tensor]:
        """The per-item metrics (METRIC_COLUMNS), each of the batch shape."""
        return {name: self.values[name] for name in METRIC_COLUMNS}

    def __getitem__(self, idx) -> ProductMetrics:
        pick = lambda x: None if x is None else x[idx]  # noqa: E731
        return ProductMetrics(sv=self.sv[idx], values={k: v[idx] for k, v in self.values.items()},
                              finite=self.finite[idx], tol=self.tol, bound=pick(self.bound),
                              fallback=pick(self.fallback))


def _check_factors(A: torch.Tensor, B: torch.Tensor) -> None:
    if A.ndim < 2 or B.ndim < 2:
        raise ValueError(f"factors need at least 2 dims (..., d, dh); got {tuple(A.shape)}, {tuple(B.shape)}")
    if A.shape != B.shape:
        raise ValueError(f"factors A and B must have the same shape; got {tuple(A.shape)} and {tuple(B.shape)}")


GRAM_MIN_RATIO = 1e-8  # heads with λ_min(XᵀX) below this times λ_max take the QR path


CHUNK_BYTES = 16 * 2**20  # heads are upcast to float64 this many bytes at a time, into reused buffers
DEVICE_CHUNK_BYTES = 512 * 2**20  # the torch route (a GPU): fewer, larger batches (each head still alone)
_BUFFERS: list = []  # free float64 upcast buffers (numpy), one per worker in use
_BUF_LOCK = threading.Lock()
METRIC_CHUNK = 8  # heads per task in metrics_from_roots (fixed: results never depend on workers)


def _is_torch(x: object) -> bool:
    return type(x).__module__.startswith("torch")


def _chunks(X, per: int) -> list:
    flat = X.reshape(-1, *X.shape[-2:])
    return [flat[s:s + per] for s in range(0, flat.shape[0], per)]


def _cat(parts: list):
    if len(parts) == 1:
        return parts[0]
    if _is_torch(parts[0]):
        import torch

        return torch.cat(parts)
    import numpy as np

    return np.concatenate(parts)


def _is_bf16(X) -> bool:
    """``X`` holds bfloat16 values: a torch bfloat16 tensor or bfloat16 bits read by numpy."""
    if _is_torch(X):
        import torch

        return X.dtype == torch.bfloat16
    from headrank.util.bf16 import BF16Bits

    return isinstance(X, BF16Bits)


def auto_route(X) -> bool:
    """Whether factor ``X`` takes the ``auto`` Gram in the compute setting in force: precision
    ``auto``, bfloat16 values, at least as many rows as columns, and this machine's kernel passed
    its self-check (:func:`headrank.core.precision.self_check`); otherwise float64."""
    from headrank.util.threads import compute_setting

    if compute_setting().precision != "auto" or not _is_bf16(X) or X.shape[-2] < X.shape[-1]:
        return False
    from headrank.core.precision import self_check

    return bool(self_check()["ok"])


def factor_roots(*Xs, errors: bool = False) -> list:
    """:func:`factor_root` of each factor, the chunks of all of them shared by the compute
    setting's ``threads`` (:func:`headrank.util.threads.computing`).

    Factors are numpy arrays or torch tensors (any float dtype). The setting's ``device`` None:
    the numpy route (LAPACK through numpy, float64): numpy in, numpy out; torch in, torch (CPU)
    out. ``device`` a torch device (``"cpu"``, ``"cuda"``): the torch route, the Grams and the
    small factorisations in float64 on that device, roots back as CPU torch tensors. The
    setting's ``precision``: bfloat16 factors' Grams by the ``auto`` route (:func:`auto_route`).
    ``errors``: also return, per factor, each head's ``[s, η, ‖E‖, ‖Ĝ‖]`` (numpy, batch shape
    × 4: the modelled Gram error and :func:`headrank.core.precision.factor_error`; zeros where
    the root is float64's), as ``(roots, errors)``.

    Each chunk is reduced by one thread, so run it under ``torch_threads(1)`` (as
    :func:`headrank.analysis.scan.analyze` does): a core taken by another process then slows
    one worker, not a barrier every small factorisation waits at. Chunks are fixed by
    CHUNK_BYTES alone, so the result is bit-identical whatever ``threads`` and the load.
    """
    from headrank.util.threads import compute_setting, parallel_map

    setting = compute_setting()
    device = setting.device
    jobs, spans, torch_out = [], [], False
    chunk = CHUNK_BYTES if device is None else DEVICE_CHUNK_BYTES
    for X in Xs:
        torch_out |= _is_torch(X)
        auto = auto_route(X)
        X = X.detach() if _is_torch(X) else X
        if device is not None and not _is_torch(X):
            X = _numpy_to_torch(X, auto)
        d, dh = X.shape[-2:]
        parts = _chunks(X, max(1, chunk // max(1, 8 * d * dh))) or [X.reshape(-1, d, dh)]
        spans.append((len(jobs), len(jobs) + len(parts), X.shape[:-2]))
        jobs += [(x, auto) for x in parts]
    if device is None:
        done = parallel_map(lambda job: _factor_root(*job), jobs, setting.threads)
    else:
        done = parallel_map(lambda job: _factor_root_torch(job[0], device, job[1]), jobs, setting.threads)
    out, errs = [], []
    for a, b, batch in spans:
        R = _cat([r for r, _ in done[a:b]])
        if torch_out and not _is_torch(R):
            import torch

            R = torch.from_numpy(R)
        elif not torch_out and _is_torch(R):  # the device route, numpy in: numpy out
            R = R.numpy()
        out.append(R.reshape((*batch, *R.shape[-2:])))
        errs.append(_cat([e for _, e in done[a:b]]).reshape((*batch, 4)))
    return (out, errs) if errors else out


def _numpy_to_torch(X, bf16: bool):
    """A numpy factor as a torch tensor for the device route: bfloat16 bits as a bfloat16 tensor
    when ``bf16`` (the ``auto`` Gram reads them), else float32/float64 values."""
    import numpy as np
    import torch

    from headrank.util.bf16 import BF16Bits, to_float32

    if bf16:
        return torch.from_numpy(np.ascontiguousarray(np.asarray(X).view(np.int16))).view(torch.bfloat16)
    return torch.from_numpy(to_float32(X) if isinstance(X, BF16Bits) else X)


def factor_root(X):
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
    not depend on how heads are chunked or shared among threads. The device: see
    :func:`factor_roots`.
    """
    return factor_roots(X)[0]


def _certified(G, Ri, xp):
    """``GRAM_MIN_RATIO · λ_max(G) · ‖R⁻¹‖₂² ≤ 1`` from upper bounds (see :func:`_gram_certified`);
    ``Ri`` = ``|R⁻¹|``; ``xp`` is numpy or torch."""
    inv_sq = xp.minimum((Ri * Ri).sum((-2, -1)), Ri.sum(-2).amax(-1) * Ri.sum(-1).amax(-1)) \
        if xp.__name__ == "torch" else \
        xp.minimum((Ri * Ri).sum((-2, -1)), Ri.sum(-2).max(-1) * Ri.sum(-1).max(-1))
    trace = xp.diagonal(G, dim1=-2, dim2=-1).sum(-1) if xp.__name__ == "torch" else \
        xp.diagonal(G, axis1=-2, axis2=-1).sum(-1)
    col = G.abs().sum(-2).amax(-1) if xp.__name__ == "torch" else xp.abs(G).sum(-2).max(-1)
    return GRAM_MIN_RATIO * xp.minimum(trace, col) * inv_sq <= 1.0  # NaN/Inf (a singular R): not certified


def _gram_certified(G, R, inverse: bool = False):
    """True where ``λ_min(G) ≥ GRAM_MIN_RATIO · λ_max(G)`` is proven, for ``RᵀR = G`` (Cholesky).

    Upper bounds only: ``λ_max ≤ min(trace G, ‖G‖₁)`` and ``1/λ_min = ‖R⁻¹‖₂² ≤
    min(‖R⁻¹‖²_F, ‖R⁻¹‖₁‖R⁻¹‖_∞)``; ``R⁻¹`` is one triangular solve (dh³/3 multiply-adds,
    about 1/(3d) of the Gram's), where an eigendecomposition of G cost more than the Cholesky
    it guarded. Conservative: a head just inside the ratio may take the (exact) QR path too.
    Torch tensors or numpy arrays (numpy: ``R⁻¹`` by :func:`_triu_inv`). ``inverse`` (numpy):
    also return ``R⁻¹`` (None where a batch held an exactly singular R), for the error bound.
    """
    if _is_torch(G):
        import torch

        eye = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device).expand_as(R)
        Ri = torch.linalg.solve_triangular(R, eye, upper=True).abs_()
        return _certified(G, Ri, torch)
    import numpy as np

    with np.errstate(all="ignore"):
        try:
            Rinv = _triu_inv(R)
            Ri = np.abs(Rinv)
        except np.linalg.LinAlgError:  # an exactly singular R (a batch): head by head
            Rinv, Ri = None, np.stack([_inv_or_nan(r) for r in R.reshape(-1, *R.shape[-2:])]).reshape(R.shape)
        ok = _certified(G, Ri, np)
        return (ok, Rinv) if inverse else ok


TRIU_LEAF = 32  # _triu_inv: diagonal blocks this small are inverted by LAPACK's LU


def _triu_inv(R):
    """The inverses of a batch of upper-triangular ``R`` (numpy), by halves: with
    ``R = [[A, B], [0, C]]``, ``R⁻¹ = [[A⁻¹, -A⁻¹ B C⁻¹], [0, C⁻¹]]``, down to TRIU_LEAF-sized
    diagonal blocks inverted by LAPACK's LU (whose pivots on an upper-triangular block are its
    diagonal: back substitution). numpy exposes no ``trtri``; its LU inverse of the whole
    128 × 128 ``R`` cost four times this (benchmarks/PROFILE.md). Raises LinAlgError for an
    exactly singular diagonal block, as ``np.linalg.inv`` does."""
    import numpy as np

    n = R.shape[-1]
    if n <= TRIU_LEAF:
        return np.linalg.inv(R)
    h = n // 2
    Ai, Ci = _triu_inv(R[..., :h, :h]), _triu_inv(R[..., h:, h:])
    out = np.zeros_like(R)
    out[..., :h, :h] = Ai
    out[..., h:, h:] = Ci
    out[..., :h, h:] = -((Ai @ R[..., :h, h:]) @ Ci)
    return out


def _inv_or_nan(r):
    import numpy as np

    try:
        return np.abs(_triu_inv(r))
    except np.linalg.LinAlgError:
        return np.full_like(r, np.nan)


def _float64_rows(X, f32: bool = False):
    """``X`` ``(n, d, dh)`` upcast into a reused float64 buffer, laid out for BLAS ``syrk``.

    Returns ``(pool, buf, rows)``: the buffer to hand back (:func:`_release`), and in it a
    numpy view ``buf`` ``(n, dh, d)`` holding each ``X_hᵀ`` when ``X``'s
    columns are contiguous (a projection's head block, ``W_h`` rows), else ``(n, d, dh)``
    holding ``X_h`` (a column block of W_O); ``rows`` says which. Either way each head is one
    contiguous block and its Gram is ``B Bᵀ`` or ``Bᵀ B`` of a single operand, which numpy
    hands to BLAS ``dsyrk`` (half the multiply-adds of a GEMM). The copy is the upcast: a
    fresh float64 array per chunk cost more in page faults than the Gram's arithmetic.
    ``X``: a numpy array, or a torch tensor (copied by torch: bfloat16, any device). ``f32``:
    the exact float32 values instead (bfloat16 factors, the ``auto`` precision), in the pool's
    second buffer.
    """
    import numpy as np

    from headrank.util.bf16 import BF16Bits, to_float32

    n, d, dh = X.shape
    if _is_torch(X):
        unit = (X.stride(-2), X.stride(-1))
    else:
        unit = (X.strides[-2] // X.itemsize, X.strides[-1] // X.itemsize)
    rows = unit[0] == 1 and unit[1] != 1  # X_hᵀ is the contiguous one
    with _BUF_LOCK:
        pool = _BUFFERS.pop() if _BUFFERS else (np.empty(0), np.empty(0, dtype=np.uint32))
    if pool[0].size < n * d * dh:
        size = max(n * d * dh, CHUNK_BYTES // 8)
        pool = (np.empty(size), np.empty(size, dtype=np.uint32))
    shape = (n, dh, d) if rows else (n, d, dh)
    if f32:
        buf = pool[1][: n * d * dh].view(np.float32).reshape(shape)
        if _is_torch(X):
            import torch

            torch.from_numpy(buf).copy_(X.mT if rows else X)
        else:
            to_float32(X.transpose(0, 2, 1) if rows else X, out=buf)
        return pool, buf, rows
    buf = pool[0][: n * d * dh].reshape(shape)
    if _is_torch(X):
        import torch

        torch.from_numpy(buf).copy_(X.mT if rows else X)
    elif isinstance(X, BF16Bits):  # raw bfloat16 bits: shifted into float32 (exact), then upcast
        np.copyto(buf, to_float32(X.transpose(0, 2, 1) if rows else X, out=pool[1][: n * d * dh].reshape(shape)))
    else:
        np.copyto(buf, X.transpose(0, 2, 1) if rows else X)
    return pool, buf, rows


def _release(pool) -> None:
    with _BUF_LOCK:
        _BUFFERS.append(pool)


def _cholesky_np(G):
    """Upper Cholesky factors ``R`` (``RᵀR = G``) of a batch and which succeeded (NaN where not)."""
    import numpy as np

    try:
        return np.linalg.cholesky(G, upper=True), np.ones(G.shape[0], dtype=bool)
    except np.linalg.LinAlgError:  # some head is not numerically positive definite: one at a time
        R, ok = np.full_like(G, np.nan), np.zeros(G.shape[0], dtype=bool)
        for i in range(G.shape[0]):
            try:
                R[i], ok[i] = np.linalg.cholesky(G[i], upper=True), True
            except np.linalg.LinAlgError:
                pass
        return R, ok


def _qr_r_np(X):
    """The R of a float64 QR of each ``(d, dh)`` in ``X`` (non-finite entries zeroed first)."""
    import numpy as np

    return np.linalg.qr(np.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0), mode="r")


def _factor_root(X, auto: bool = False):
    """:func:`factor_root` of one chunk ``(n, d, dh)``, in numpy (float64 LAPACK through numpy),
    and each head's modelled Gram error ``s`` ``(n,)`` (0 where the root is float64's: every head
    unless ``auto``, and the heads that took the QR path). ``auto``: the Gram from the exact
    float32 values of bfloat16 factors (:func:`headrank.core.precision.gram_np`)."""
    import numpy as np

    n, d, dh = X.shape
    if d < dh:
        from headrank.util.bf16 import as_float

        Xd = np.asarray(X.to(dtype=__import__("torch").float64).cpu()) if _is_torch(X) else as_float(X)
        finite = np.isfinite(Xd).all((-2, -1))
        R = _qr_r_np(Xd)
        return (np.where(finite[:, None, None], R, np.nan) if not finite.all() else R), np.zeros((n, 4))
    pool, buf, rows = _float64_rows(X, f32=auto)
    try:
        if auto:
            from headrank.core.precision import gram_np, gram_s

            G, s = gram_np(buf, rows), gram_s()
        else:  # X_hᵀX_h as one operand times its own transpose: numpy's matmul calls dsyrk for that
            G, s = (np.matmul(buf, buf.transpose(0, 2, 1)) if rows else np.matmul(buf.transpose(0, 2, 1), buf)), 0.0
        finite = np.isfinite(np.diagonal(G, axis1=-2, axis2=-1)).all(-1)  # G_jj = Σ_i X_ij²: NaN/Inf land here
        if not finite.all():
            G = np.where(finite[:, None, None], G, np.eye(dh))
        R, ok = _cholesky_np(G)
        Rinv = None
        if ok.all():
            cert, Rinv = _gram_certified(G, R, inverse=True)
            bad = ~cert
        else:
            bad = ~ok
            bad[ok] = ~_gram_certified(G[ok], R[ok])
        bad &= finite
        if bad.any():
            R[bad] = _qr_r_np(_rows64(X, buf, rows, bad, auto))
    finally:
        _release(pool)
    if not finite.all():
        R = np.where(finite[:, None, None], R, np.nan)
    return R, _errors(R, Rinv, np.where(bad | ~finite, 0.0, s))


def _errors(R, Rinv, s):
    """Each head's ``[s, η, ‖E‖, ‖Ĝ‖]`` ``(n, 4)`` (:func:`headrank.core.precision.factor_error`),
    zeros where the root is float64's (``s`` = 0)."""
    import numpy as np

    out = np.zeros((len(s), 4))
    if (s > 0).any():
        from headrank.core.precision import factor_error

        e = factor_error(R, Rinv, s)
        out[:, 0], out[:, 1], out[:, 2], out[:, 3] = s, e["eta"], e["E"], e["G"]
    return out


def _rows64(X, buf, rows: bool, idx, auto: bool):
    """The float64 factors ``(k, d, dh)`` of the heads ``idx`` of a chunk, for the QR path: views
    of the float64 buffer, or (``auto``: the buffer holds float32) the exact float32 values upcast."""
    Xd = buf.transpose(0, 2, 1) if rows else buf
    return Xd[idx].astype("float64") if auto else Xd[idx]


def _factor_root_torch(X, device, auto: bool = False):
    """:func:`factor_root` of one chunk ``(n, d, dh)`` in torch, float64 on ``device``; a CPU
    tensor back, and each head's modelled Gram error (numpy; see :func:`_factor_root`). ``auto``:
    the Gram by :func:`headrank.core.precision.gram_torch` (tensor cores on CUDA)."""
    import numpy as np
    import torch

    s = 0.0
    if auto:
        from headrank.core.precision import gram_s, gram_torch

        Xa = X.to(device=device)
        G, s = gram_torch(Xa), gram_s()
    X = X.to(device=device, dtype=torch.float64)
    n, d, dh = X.shape
    bad = torch.zeros(n, dtype=torch.bool, device=X.device)
    if d < dh:
        R = torch.linalg.qr(torch.nan_to_num(X, nan=0.0, posinf=0.0, neginf=0.0), mode="r").R
        finite = torch.isfinite(X).all(-1).all(-1)
    else:
        G = G if auto else X.mT @ X
        finite = torch.isfinite(torch.diagonal(G, dim1=-2, dim2=-1)).all(-1)
        G = torch.where(finite[:, None, None], G, torch.eye(dh, dtype=G.dtype, device=G.device))
        L, info = torch.linalg.cholesky_ex(G)
        R = L.mT.contiguous()
        bad = (~_gram_certified(G, R) | (info != 0)) & finite
        if bool(bad.any()):
            R[bad] = torch.linalg.qr(torch.nan_to_num(X[bad], nan=0.0, posinf=0.0, neginf=0.0), mode="r").R
    R = torch.where(finite[:, None, None], R, torch.full_like(R, float("nan"))).cpu()
    return R, _errors(R.numpy(), None, np.where((bad | ~finite).cpu().numpy(), 0.0, s))


def singular_values(A, B):
    """Singular values of ``A Bᵀ`` (descending, float64), shape ``(..., min(d, dh))``."""
    return product_metrics(A, B).sv


def product_metrics(A, B, tol: float = DEFAULT_TOL) -> ProductMetrics:
    """All metrics of ``A Bᵀ`` for factors ``A, B`` of shape ``(..., d, dh)`` (any float dtype),
    in the compute setting in force (threads, device, precision:
    :func:`headrank.util.threads.computing`); what ``Product(A, B).metrics(tol)``
    (:class:`headrank.core.product.Product`) returns, for a product used once."""
    _check_factors(A, B)
    return metrics_from_roots(*factor_roots(A, B), tol)


def metrics_from_roots(Ra, Rb, tol: float = DEFAULT_TOL) -> ProductMetrics:
    """All metrics of ``A Bᵀ`` from roots ``Ra = factor_root(A)``, ``Rb = factor_root(B)``.

    Heads are taken METRIC_CHUNK at a time, on the compute setting's ``threads`` (same result
    for any number). numpy roots give numpy metrics, torch roots torch (CPU) metrics. The
    setting's ``device``: the core SVDs in torch on that device (:func:`factor_roots`).
    """
    if not tol > 0:
        raise ValueError(f"tolerance must be > 0, got {tol}")
    from headrank.util.threads import compute_setting, parallel_map

    setting = compute_setting()
    device = setting.device
    torch_out = _is_torch(Ra) or _is_torch(Rb)
    batch = Ra.shape[:-2]
    per = METRIC_CHUNK if device is None else 4096  # a device takes the whole layer at once
    pairs = list(zip(_chunks(Ra, per), _chunks(Rb, per), strict=True))
    if not pairs:
        pairs = [(Ra.reshape(-1, *Ra.shape[-2:]), Rb.reshape(-1, *Rb.shape[-2:]))]
    parts = parallel_map(lambda ab: _metrics(ab[0], ab[1], tol, device), pairs, setting.threads)
    out = {}
    for key in parts[0]:
        v = _cat([q[key] for q in parts])
        out[key] = v.reshape((*batch, *v.shape[1:]))
    if torch_out:
        import torch

        out = {k: torch.from_numpy(v) for k, v in out.items()}
    sv, finite = out.pop("sv"), out.pop("finite")
    return ProductMetrics(sv=sv, values=out, finite=finite, tol=tol)


def _metrics(Ra, Rb, tol: float, device=None) -> dict:
    """The metrics of a flat batch of heads ``(n, k, dh)`` (see :func:`metrics_from_roots`), numpy arrays."""
    import numpy as np

    if device is not None:
        sv, bound, balance, scale, finite = _core_torch(Ra, Rb, device)
    else:
        Ra = Ra.detach().to("cpu").numpy() if _is_torch(Ra) else Ra
        Rb = Rb.detach().to("cpu").numpy() if _is_torch(Rb) else Rb
        Ra, Rb = np.asarray(Ra, dtype=np.float64), np.asarray(Rb, dtype=np.float64)
        finite = np.isfinite(Ra).all((-2, -1)) & np.isfinite(Rb).all((-2, -1))
        if not finite.all():
            Ra = np.where(finite[:, None, None], Ra, 0.0)
            Rb = np.where(finite[:, None, None], Rb, 0.0)
        sv = np.linalg.svd(Ra @ Rb.mT, compute_uv=False)
        ga, gb = Ra.mT @ Ra, Rb.mT @ Rb  # AᵀA, BᵀB (dh × dh)
        bound = 0.5 * ((Ra * Ra).sum((-2, -1)) + (Rb * Rb).sum((-2, -1)))
        fro = lambda g: np.sqrt((g * g).sum((-2, -1)))  # noqa: E731
        balance, scale = fro(ga - gb), fro(ga) + fro(gb)
    out = {"sv": sv, **from_singular_values(sv, bound, balance, scale, tol)}
    if not finite.all():
        for key, val in out.items():
            mask = ~finite[:, None] if key == "sv" else ~finite
            out[key] = np.where(mask, np.nan, val.astype(np.float64))
    return {**out, "finite": finite}


def _core_torch(Ra, Rb, device):
    """The core SVD and the factor norms of a batch in torch float64 on ``device``, as numpy."""
    import torch

    to = lambda R: (torch.from_numpy(R) if not _is_torch(R) else R).to(device=device, dtype=torch.float64)  # noqa: E731
    Ra, Rb = to(Ra), to(Rb)
    finite = torch.isfinite(Ra).all(-1).all(-1) & torch.isfinite(Rb).all(-1).all(-1)
    keep = finite[:, None, None]
    Ra, Rb = torch.where(keep, Ra, torch.zeros_like(Ra)), torch.where(keep, Rb, torch.zeros_like(Rb))
    sv = torch.linalg.svdvals(Ra @ Rb.mT)
    ga, gb = Ra.mT @ Ra, Rb.mT @ Rb
    bound = 0.5 * ((Ra * Ra).sum((-2, -1)) + (Rb * Rb).sum((-2, -1)))
    fro = lambda g: torch.sqrt((g * g).sum((-2, -1)))  # noqa: E731
    res = (sv, bound, fro(ga - gb), fro(ga) + fro(gb), finite)
    return tuple(x.cpu().numpy() for x in res)


#: the fast path of :meth:`headrank.core.product.Product.svd` and ``.basis()``: both roots with
#: ‖R‖_F ‖R⁻¹‖_F at most this (orthogonality of X R⁻¹ then holds to ~1e-16 · cond² ≤ 1e-10)
PRODUCT_SVD_COND = 1e3
