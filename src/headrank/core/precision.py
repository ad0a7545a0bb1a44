"""The ``auto`` precision of a product's Grams, and each head's error bound (docs/methods/precision.md).

bfloat16 × bfloat16 products are exact in float32, so a Gram ``XᵀX`` formed from the stored
bfloat16 values with float32 accumulation rounds only in its sums. ``auto`` forms it in chunks of
CHUNK_ROWS rows of ``X`` (a float32 GEMM each) summed in float64 (:func:`gram_np`,
:func:`gram_torch`); everything after the Gram (Cholesky, QR, core SVD) stays float64.

The error model, per factor with chunked Gram ``Ĝ``, Cholesky ``R̂`` and ``D = diag(Ĝ)^½``: the
Gram's error is ``E = D F D`` with ``‖F‖₂ ≤ s = c·u·√L`` (``u = 2⁻²⁴``, ``L`` = CHUNK_ROWS;
``c`` = C_MODEL). Then (:func:`factor_error`) ``η = s·κ̂``, ``κ̂ = 1.1 ×`` a power-iteration
estimate of ``‖D R̂⁻¹‖₂²``, and ``‖E‖ ≤ s·max Ĝᵢᵢ``. Per product (:func:`sv_bounds`):
Ostrowski's relative bound ``ρ = √((1+η_A)(1+η_B)) − 1``; Weyl's absolute bound on ``σ²``,
``Δ = ‖E_A‖(‖Ĝ_B‖+‖E_B‖) + ‖E_B‖(‖Ĝ_A‖+‖E_A‖)``; ``bᵢ = min(ρσᵢ, Δ / (σᵢ + √max(σᵢ² − Δ, 0)))``.
A modelled bound, not a proof: ``c`` is the model's constant, checked against the kernel on this
machine by :func:`self_check` (once, cached): ``c = max(C_MODEL, 2 × measured)``, and the route is
refused (float64) when that exceeds C_MAX.

The contract per head (:func:`holds`): every ``|σᵢ − σ̂ᵢ| ≤ bᵢ ≤ 1e-5 σ_max``; the numerical rank and
every energy rank provably the same as float64's; ``gap / bound`` within 1e-4. A head whose bound
cannot guarantee it is recomputed in float64 (:meth:`headrank.core.product.Product.metrics`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

U32 = 2.0**-24  # float32's unit roundoff
CHUNK_ROWS = 256  # rows of X per float32 GEMM; the chunk Grams are summed in float64
C_MODEL = 1.0  # the least model constant c (REFERENCE §12 measured ≤ 0.51 on AMX: a 2× margin)
SELF_CHECK_MARGIN = 2.0  # c = max(C_MODEL, this × the constant the self-check measures here)
C_MAX = 4.0  # a kernel whose c would exceed this (one unchunked sgemm class) is refused: float64
CONTRACT_SV = 1e-5  # every singular value within this times σ_max of float64's
CONTRACT_GAP = 1e-4  # gap / bound within this of float64's
FALLBACK_SHARE = 1 / 3  # more than this share of a product's heads failing: the whole product in float64
POWER_STEPS = 20  # power iterations for ‖D R⁻¹‖₂² and ‖R‖₂²
POWER_SAFETY = 1.1  # power iteration estimates from below: scaled up by this


def gram_s() -> float:
    """The modelled relative error ``s = c·u·√L`` of an ``auto`` Gram, ``c`` from :func:`self_check`."""
    return self_check()["c"] * U32 * math.sqrt(CHUNK_ROWS)


def gram_np(X32: np.ndarray, rows: bool) -> np.ndarray:
    """Float64 Grams of float32 factors in chunks of CHUNK_ROWS rows, each chunk one float32
    GEMM (BLAS ``sgemm``/``ssyrk`` through numpy). ``X32``: ``(n, dh, d)`` holding ``Xᵀ`` when
    ``rows``, else ``(n, d, dh)``. Chunks are fixed, so the result does not depend on threads."""
    d = X32.shape[-1] if rows else X32.shape[-2]
    dh = X32.shape[-2] if rows else X32.shape[-1]
    G = np.zeros((X32.shape[0], dh, dh))
    for a in range(0, d, CHUNK_ROWS):
        c = X32[:, :, a:a + CHUNK_ROWS] if rows else X32[:, a:a + CHUNK_ROWS, :].transpose(0, 2, 1)
        G += np.matmul(c, c.transpose(0, 2, 1))
    return G


def gram_torch(X: Any) -> Any:
    """Float64 Grams ``XᵀX`` of ``X`` ``(n, d, dh)`` (bfloat16 or float32, any device) in chunks of
    CHUNK_ROWS rows, each a float32-accumulating GEMM: on CUDA with bfloat16 inputs the tensor
    cores (``torch.bmm(..., out_dtype=torch.float32)``), elsewhere a float32 GEMM of the exact
    float32 values. TF32 is never used (it would round the inputs)."""
    import torch

    cuda_bf16 = X.device.type == "cuda" and X.dtype == torch.bfloat16
    Xc = X if cuda_bf16 else X.to(torch.float32)
    G = torch.zeros(X.shape[0], X.shape[-1], X.shape[-1], dtype=torch.float64, device=X.device)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for a in range(0, X.shape[-2], CHUNK_ROWS):
            c = Xc[:, a:a + CHUNK_ROWS, :]
            G += _bmm_f32(c.mT, c, cuda_bf16).to(torch.float64)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return G


def _bmm_f32(a: Any, b: Any, bf16_out_dtype: bool) -> Any:
    """``a @ b`` accumulated in float32: bfloat16 inputs with a float32 result where torch has
    the kernel (CUDA), else the exact float32 values multiplied in float32."""
    import torch

    if bf16_out_dtype:
        try:
            return torch.bmm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):  # an older torch: no bmm.dtype
            pass
    return a.to(torch.float32) @ b.to(torch.float32)


def _power_sq(M: np.ndarray) -> np.ndarray:
    """``POWER_SAFETY ×`` a power-iteration estimate of ``‖M‖₂²`` per item of ``(n, k, k)``."""
    v = np.ones((M.shape[0], M.shape[-1], 1))
    lam = np.zeros(M.shape[0])
    with np.errstate(all="ignore"):
        for _ in range(POWER_STEPS):
            w = M.transpose(0, 2, 1) @ (M @ v)
            lam = np.sqrt((w * w).sum((-2, -1)))
            v = w / np.where(lam > 0, lam, 1.0)[:, None, None]
    return POWER_SAFETY * lam


def factor_error(R: np.ndarray, Rinv: np.ndarray | None, s: np.ndarray) -> dict[str, np.ndarray]:
    """Per head of a factor with root ``R`` ``(n, k, k)`` from an ``auto`` Gram of modelled error
    ``s`` ``(n,)`` (0: formed in float64): ``eta`` (the relative bound ``s·κ̂``), ``E`` (``‖E‖₂``)
    and ``G`` (``‖Ĝ‖₂``). ``Rinv``: ``R⁻¹`` where at hand (else solved here)."""
    R = np.asarray(R, dtype=np.float64).reshape(-1, *R.shape[-2:])
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    out = {k: np.zeros(R.shape[0]) for k in ("eta", "E", "G")}
    live = (s > 0) & np.isfinite(R).all((-2, -1))
    if not live.any():
        return out
    Rl = R[live]
    if Rinv is None:
        eye = np.broadcast_to(np.eye(Rl.shape[-1]), Rl.shape)
        with np.errstate(all="ignore"):
            Ri = np.linalg.solve(Rl, eye)
    else:
        Ri = np.asarray(Rinv, dtype=np.float64).reshape(-1, *R.shape[-2:])[live]
    diag = (Rl * Rl).sum(-2)  # diag(Ĝ) = column norms² of R
    kappa = _power_sq(np.sqrt(diag)[:, :, None] * Ri)  # ‖D R⁻¹‖₂²
    out["eta"][live] = s[live] * np.where(np.isfinite(kappa), kappa, np.inf)
    out["E"][live] = s[live] * diag.max(-1)
    out["G"][live] = _power_sq(Rl)
    return out


def sv_bounds(sv: np.ndarray, fa: dict[str, np.ndarray], fb: dict[str, np.ndarray]) -> np.ndarray:
    """``bᵢ`` ``(n, k)``: the bound on ``|σᵢ − σ̂ᵢ|`` of a product from its factors'
    :func:`factor_error` (Ostrowski relative, Weyl absolute; see the module's docstring)."""
    sv = np.asarray(sv, dtype=np.float64)
    with np.errstate(all="ignore"):
        rho = np.sqrt((1 + fa["eta"]) * (1 + fb["eta"])) - 1
        delta = fa["E"] * (fb["G"] + fb["E"]) + fb["E"] * (fa["G"] + fa["E"])
        weyl = delta[:, None] / (sv + np.sqrt(np.maximum(sv * sv - delta[:, None], 0)))
        b = np.minimum(rho[:, None] * sv, np.where(np.isfinite(weyl), weyl, np.inf))
    return np.where(delta[:, None] == 0, rho[:, None] * sv, b)


def _crosses(margin: np.ndarray, err: np.ndarray) -> np.ndarray:
    """Per head: some decision ``margin < 0`` could flip under a perturbation ``err``."""
    return (np.abs(margin) <= err).any(-1)


def holds(sv: np.ndarray, b: np.ndarray, tol: float, s: np.ndarray, frob_bound: np.ndarray,
          energy: tuple[float, ...] = (0.90, 0.99)) -> np.ndarray:
    """Per head: whether the bound ``b`` guarantees the contract (every σ within CONTRACT_SV·σ_max,
    the numerical rank at ``tol`` and the energy ranks at ``energy`` identical to float64's,
    gap/bound within CONTRACT_GAP). ``s``: the larger of the two factors' modelled Gram errors
    (the Frobenius bound's relative error)."""
    sv, b = np.asarray(sv, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(all="ignore"):
        s1, b1 = sv[:, :1], b[:, :1]
        ok = (b <= CONTRACT_SV * (s1 - b1)).all(-1)
        ok &= ~_crosses(sv - tol * s1, b + tol * b1)  # #{σᵢ > τσ₁}
        e = b * (2 * sv + b)  # |σᵢ² − σ̂ᵢ²|
        cum, ecum = np.cumsum(sv * sv, -1), np.cumsum(e, -1)
        total, etotal = cum[:, -1:], ecum[:, -1:]
        for f in energy:  # cum_j < f·total  ⇔  (1−f)·cum_j − f·(total − cum_j) < 0
            ok &= ~_crosses(((1 - f) * cum - f * (total - cum))[:, :-1],
                            ((1 - f) * ecum + f * (etotal - ecum))[:, :-1])
        fb = np.asarray(frob_bound, dtype=np.float64)
        gap_err = b.sum(-1) / fb + np.asarray(s) * sv.sum(-1) / fb
        ok &= np.where(fb > 0, gap_err <= CONTRACT_GAP, True)
    return ok


# -- the self-check: the kernel's constant measured on this machine ---------------------------------
_CHECKED: dict[str, Any] = {}


def self_check() -> dict[str, Any]:
    """The Gram kernel's error constant, measured once per machine and cached (in this process and
    in ``$HEADRANK_CACHE``/``~/.cache/headrank/precision_check.json``): ``c_measured`` = the largest
    ``‖D⁻¹(Ĝ − G)D⁻¹‖₂ / (u√L)`` over random and planted bfloat16 factors (d 1024 and 4096, MHA and
    column scales down to 1e-6), against their exact float64 Grams; ``c`` = max(C_MODEL,
    SELF_CHECK_MARGIN × c_measured), the constant the bounds use; ``ok``: ``c ≤ C_MAX`` (else
    ``auto`` computes in float64)."""
    if _CHECKED:
        return _CHECKED
    import json

    from headrank.util.env import cache_root

    key = _machine_key()
    path = cache_root() / "precision_check.json"
    try:
        cached = json.loads(path.read_text())
        if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("c"), float):
            _CHECKED.update(cached)
            return _CHECKED
    except (OSError, ValueError):
        pass
    c = _measure()
    used = max(C_MODEL, SELF_CHECK_MARGIN * c)
    _CHECKED.update(key=key, c_measured=c, c=used, ok=bool(used <= C_MAX), chunk_rows=CHUNK_ROWS)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(_CHECKED))
        tmp.replace(path)
    except OSError:  # a read-only home: measured again by the next process
        pass
    return _CHECKED


def _machine_key() -> str:
    """What the measured constant depends on: the BLAS numpy calls, its version, the CPU."""
    import platform

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # pragma: no cover - an older numpy
        blas = "?"
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    return f"numpy {np.__version__}; {blas}; {platform.machine()} {cpu}; L={CHUNK_ROWS}"


def _measure() -> float:
    """The largest measured constant over the self-check's factors (see :func:`self_check`)."""
    rng = np.random.default_rng(2024)
    worst = 0.0
    for n, d, dh, decades in ((4, 1024, 64, 0.0), (2, 4096, 128, 0.0), (4, 1024, 64, 6.0), (2, 2048, 64, 3.0)):
        X = rng.standard_normal((n, d, dh)) * np.logspace(0, -decades, dh)
        bits = (X.astype(np.float32).view(np.uint32) + 0x8000) & 0xFFFF0000  # round to bfloat16
        X32 = bits.view(np.float32)
        G = np.matmul(X32.astype(np.float64).transpose(0, 2, 1), X32.astype(np.float64))
        Gh = gram_np(X32, rows=False)
        Dinv = 1 / np.sqrt(np.diagonal(G, axis1=-2, axis2=-1))
        F = (Gh - G) * Dinv[:, :, None] * Dinv[:, None, :]
        worst = max(worst, float(np.abs(np.linalg.eigvalsh(F)).max()) / (U32 * math.sqrt(CHUNK_ROWS)))
    return worst


# -- what a table and meta.json record ------------------------------------------------------------
#: heads.csv's columns of the precision (docs/outputs.md): the bound and the route of each head
PRECISION_COLUMNS = ("sv_err_bound", "precision")


def precision_columns(m: Any) -> dict[str, np.ndarray]:
    """A :class:`~headrank.core.linalg.ProductMetrics`' precision columns: ``sv_err_bound`` (the
    modelled bound on max |σᵢ − σᵢ(float64)| / σ_max; 0 where computed in float64, NaN where not
    finite) and ``precision``: the route of the head's Grams, ``auto``, ``fallback`` (auto, whose
    bound did not hold the contract: recomputed in float64) or ``float64``."""
    n = np.asarray(m.finite).shape
    bound = np.zeros(n) if m.bound is None else np.asarray(m.bound, dtype=np.float64)
    bound = np.where(np.asarray(m.finite), bound, np.nan)
    fell = np.zeros(n, dtype=bool) if m.fallback is None else np.asarray(m.fallback, dtype=bool)
    return {"sv_err_bound": bound, "precision": np.where(fell, "fallback", np.where(bound > 0, "auto", "float64"))}


def precision_meta(requested: str, table: Any) -> dict[str, Any]:
    """meta.json's ``precision``: what was asked, how many heads each route computed, the largest
    bound, the model's constant and the contract (docs/methods/precision.md)."""
    route = np.asarray(table["precision"])
    bound = np.asarray(table["sv_err_bound"], dtype=np.float64)
    out: dict[str, Any] = {
        "requested": requested,
        "heads_auto": int((route == "auto").sum()),
        "heads_fallback": int((route == "fallback").sum()),
        "heads_float64": int((route == "float64").sum()),
        "largest_bound": float(np.nanmax(bound)) if np.isfinite(bound).any() else 0.0,
        "contract": {"sv": CONTRACT_SV, "gap_rel": CONTRACT_GAP,
                     "decisions": "rank, k90, k99 (and any energy level asked) identical to float64's"},
        "note": (f"auto: bfloat16 weights' Grams in float32 chunks of {CHUNK_ROWS} rows summed in float64, each "
                 "head's modelled bound checked against the contract and the heads it cannot guarantee recomputed "
                 "in float64 (precision 'fallback'; a modelled and self-checked bound, not a proof); float32/"
                 "float16 weights and precision float64: every step in float64"),
    }
    if _CHECKED:
        out["self_check"] = {k: _CHECKED[k] for k in ("c_measured", "c", "ok", "chunk_rows") if k in _CHECKED}
    return out
