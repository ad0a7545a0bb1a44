"""Exact truncation of one layer's attention products, written back into the same tensors.

A head's product is ``X_h Sᵀ`` with a per-query-head factor ``X_h`` and a factor ``S`` its kv
head shares with the rest of its query group (docs/methods/products.md, docs/methods/compression.md):

- OV: ``X_h = P_h`` (d × dh), ``S = W_V,kvᵀ``; the product is ``P_h W_V``.
- QK: ``X_h = W_Q,hᵀ``, ``S = W_K,kvᵀ``; the product is ``W_Q,hᵀ W_K``, the transpose of
  ``W_Kᵀ W_Q,h`` (same singular values; score ``xᵀ W_Q,hᵀ W_K y``).

Under grouped-query attention one ``S`` serves ``g`` query heads, so a cut must pick one
subspace per kv head: the unit is the stack ``[X_1; …; X_g] Sᵀ`` (g·d × d), cut to its best
rank-k approximation (Eckart–Young) ``U_k Σ_k V_kᵀ`` and split evenly, ``X' = U_k Σ_k^½``,
``S' = V_k Σ_k^½`` (without GQA the unit is one head). The d × d product is never formed: the
factors' roots ``XᵀX = RxᵀRx``, ``SᵀS = RsᵀRs`` (``Product(X, S)``, :class:`headrank.core.product.Product`,
the spectra route) give the core ``Rx Rsᵀ = Uc Σ Vcᵀ``, and ``X' = X Rx⁻¹ Uc_k Σ_k^½`` (its
``.basis()``, :func:`cut_unit`: only the k kept columns are made; the others are zero); where a
root is not well-conditioned, ``Product.svd()`` (QRs of the factors) instead.

Activation-whitened cuts (SVD-LLM): with calibration inputs ``x`` of the layer's attention and
``E[x xᵀ] = L Lᵀ``, the cut minimises ``‖(M − M_k) L‖_F`` (OV: the output error over those
inputs) or ``‖Lᵀ (M − M_k) L‖_F`` (QK: both sides read the same inputs) instead of ``‖M − M_k‖_F``:
the factors meeting ``L`` are whitened (``Lᵀ S``, for QK also ``Lᵀ X_h``) before the SVD and
un-whitened (``L⁻ᵀ``) after.

Biases keep the function exact at full rank: a value bias reaches the output as ``P_h b_v``
(softmax rows sum to 1), so it moves into the output bias where there is one (exact at every
rank) and is otherwise refitted, ``b_v' = pinv(X') X b_v`` (its projection on the kept
subspace). A query bias adds the key-dependent score term ``b_qᵀ W_K y``: refitted as
``b_q' = pinv(S') S b_q``; a key bias adds only terms constant over keys (softmax ignores them)
and is refitted the same way, ``b_k' = pinv(X') X b_k``.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from headrank.core.product import UNITS_PER_TASK, Basis, Product
from headrank.io.layouts import SPLITS, Dims, HeadWeights

#: the order products are cut and reported in (a cut order, not the metric table's product list)
CUT_ORDER = ("ov", "qk")


def unit_factors(hw: HeadWeights, product: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X, S)``: the stacked per-head factors ``(Hkv, g·d, dh)`` and the shared ``(Hkv, d, dh)``."""
    Hkv, dh, d = hw.wk.shape
    X = hw.p if product == "ov" else hw.wq.mT
    S = hw.wv.mT if product == "ov" else hw.wk.mT
    return X.reshape(Hkv, -1, dh), S


def _whitened(X: torch.Tensor, S: torch.Tensor, product: str, L: torch.Tensor | None, upcast: bool = True):
    if L is None:  # factor_roots upcasts chunk by chunk itself: no float64 copy of the layer here
        return (X.to(torch.float64), S.to(torch.float64)) if upcast else (X, S)
    Lt = L.mT.to(torch.float64)
    S = Lt @ S.to(torch.float64)
    if product == "qk":
        Hkv, gd, dh = X.shape
        X = (Lt @ X.to(torch.float64).reshape(Hkv, -1, L.shape[0], dh)).reshape(Hkv, gd, dh)
    return X.to(torch.float64), S


def unit_basis(hw: HeadWeights, product: str, L: torch.Tensor | None = None) -> Basis:
    """:class:`~headrank.core.product.Basis` of every unit (whitened by ``L`` when given): the core
    SVD of ``Product(X, S)`` (:meth:`headrank.core.product.Product.basis`), in the compute setting
    in force (threads, device, precision: :func:`headrank.util.threads.computing`). The layer
    takes the QR route (``A``, ``B`` None) unless every unit's roots are well-conditioned."""
    X, S = _whitened(*unit_factors(hw, product), product, L, upcast=False)
    b = Product(X, S).basis()
    return b if b.ok is not None and bool(b.ok.all()) else Basis(b.sv)


@dataclass
class UnitCut:
    """One product of one layer after the cut: new factors and per-unit numbers. The factors
    may hold fewer than ``dh`` columns (the kept ones: the cut from a :class:`Basis`); the
    columns beyond are zero (:meth:`padded`)."""

    X: torch.Tensor  # (Hkv, g·d, w), w ≤ dh
    S: torch.Tensor  # (Hkv, d, w)
    k: torch.Tensor  # (Hkv,)
    sv: torch.Tensor  # (Hkv, p): the spectrum the cut was chosen on (whitened when whitening)
    err: torch.Tensor  # (Hkv,) ‖M − M_k‖_F of the unit's (unwhitened) product
    norm: torch.Tensor  # (Hkv,) ‖M‖_F

    def padded(self, dh: int) -> UnitCut:
        """The same cut with ``dh`` columns (zeros appended)."""
        pad = dh - self.X.shape[-1]
        if pad <= 0:
            return self
        return UnitCut(torch.nn.functional.pad(self.X, (0, pad)), torch.nn.functional.pad(self.S, (0, pad)),
                       self.k, self.sv, self.err, self.norm)


def _work_dtype(X: torch.Tensor, S: torch.Tensor, L: torch.Tensor | None, device: str | None) -> torch.dtype:
    """float32 for a 16-bit checkpoint cut on the CPU without whitening (written back in 16 bits:
    float32's rounding is far below the written one), else float64 (on a device always)."""
    half = (torch.bfloat16, torch.float16)
    if device is None and X.dtype in half and S.dtype in half and L is None:
        return torch.float32
    return torch.float64


def _times(F: torch.Tensor, M: torch.Tensor, wd: torch.dtype, threads: int, device: str | None) -> torch.Tensor:
    """``F @ M`` per unit in ``wd`` (``UNITS_PER_TASK`` units per task on ``threads`` threads;
    on ``device`` when given, the result back on the CPU)."""
    from headrank.util.threads import parallel_map

    M = M.to(wd)
    if device is not None:
        return (F.to(device=device, dtype=wd) @ M.to(device)).cpu()
    out = torch.empty(*F.shape[:-1], M.shape[-1], dtype=wd)
    spans = [slice(a, a + UNITS_PER_TASK) for a in range(0, F.shape[0], UNITS_PER_TASK)]
    parallel_map(lambda s: torch.matmul(F[s].to(wd), M[s], out=out[s]), spans, threads)
    return out


def _from_basis(X: torch.Tensor, S: torch.Tensor, k: torch.Tensor, L: torch.Tensor | None, b: Basis,
                threads: int = 1, device: str | None = None) -> UnitCut:
    """The cut from pass 1's :class:`Basis`, without a second pass over the factors' Gram
    matrices: ``X' = X (A_k Σ_k^½)``, ``S' = S (B_k Σ_k^½)`` (whitening and its inverse cancel:
    ``L⁻ᵀ Lᵀ S = S``), two GEMMs with dh × k matrices making the kept columns only (the others
    are zero). Whitened: ``err`` from the factors (float64), the cut returned padded."""
    sv = b.sv.cpu()
    keep = (torch.arange(sv.shape[-1]) < k[:, None]).to(torch.float64)
    root = sv.clamp_min(0).sqrt() * keep
    wd = _work_dtype(X, S, L, device)
    kmax = max(int(k.max()), 1)
    r = root.to(b.A.device)[:, None, :]
    Ma, Mb = (b.A * r)[..., :kmax], (b.B * r)[..., :kmax]
    Xn, Sn = _times(X, Ma, wd, threads, device), _times(S, Mb, wd, threads, device)
    if L is None:
        e = sv**2
        return UnitCut(Xn, Sn, k.clone(), sv, ((1 - keep) * e).sum(-1).sqrt(), e.sum(-1).sqrt())
    pad = X.shape[-1] - kmax
    Xn, Sn = torch.nn.functional.pad(Xn, (0, pad)), torch.nn.functional.pad(Sn, (0, pad))
    X64, S64 = X.to(torch.float64), S.to(torch.float64)
    return UnitCut(Xn, Sn, k.clone(), sv, diff_norm(X64, S64, Xn, Sn), diff_norm(X64, S64))


def cut_unit(X: torch.Tensor, S: torch.Tensor, k: torch.Tensor, product: str,
             L: torch.Tensor | None = None, basis: Basis | None = None, threads: int = 1,
             device: str | None = None) -> UnitCut:
    """Best rank-``k[u]`` approximation of every unit ``X_u S_uᵀ``, balanced: from pass 1's
    ``basis`` where it has the vectors (:func:`_from_basis`, the kept columns only), else (no
    basis, or not well-conditioned) by :meth:`headrank.core.product.Product.svd` on the CPU,
    zero-padded to dh columns."""
    if basis is not None and basis.A is not None:
        return _from_basis(X, S, k, L, basis, threads, device)
    Xw, Sw = _whitened(X, S, product, L)
    U, sv, V = Product(Xw, Sw).svd()
    dh = X.shape[-1]
    keep = (torch.arange(sv.shape[-1]) < k[:, None]).to(torch.float64)
    root = sv.clamp_min(0).sqrt() * keep
    Xn, Sn = U * root[:, None, :], V * root[:, None, :]
    if L is not None:
        Lt = L.mT.to(torch.float64)
        Sn = torch.linalg.solve_triangular(Lt, Sn, upper=True)
        if product == "qk":
            Hkv, gd, p = Xn.shape
            Xn = torch.linalg.solve_triangular(Lt, Xn.reshape(Hkv, -1, L.shape[0], p), upper=True).reshape(Hkv, gd, p)
    pad = dh - Xn.shape[-1]
    if pad > 0:
        Xn, Sn = torch.nn.functional.pad(Xn, (0, pad)), torch.nn.functional.pad(Sn, (0, pad))
    if L is None:  # Eckart-Young: the error is the tail of the spectrum
        e = sv**2
        return UnitCut(Xn, Sn, k.clone(), sv, ((1 - keep) * e).sum(-1).sqrt(), e.sum(-1).sqrt())
    X64, S64 = X.to(torch.float64), S.to(torch.float64)
    return UnitCut(Xn, Sn, k.clone(), sv, diff_norm(X64, S64, Xn, Sn), diff_norm(X64, S64))


def diff_norm(A: torch.Tensor, B: torch.Tensor, A2: torch.Tensor | None = None,
              B2: torch.Tensor | None = None) -> torch.Tensor:
    """``‖A Bᵀ − A2 B2ᵀ‖_F`` (or ``‖A Bᵀ‖_F``) from the dh × dh Gram matrices, batched."""
    if A2 is not None:
        A, B = torch.cat([A, -A2], -1), torch.cat([B, B2], -1)
    return ((A.mT @ A) * (B.mT @ B)).sum((-2, -1)).clamp_min(0).sqrt()


# -- biases ----------------------------------------------------------------------------------
def _refit(new: torch.Tensor, old: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``pinv(new) (old b)`` per unit: the bias whose term ``new b'`` is closest to ``old b``."""
    target = old @ b[..., None]
    return (torch.linalg.pinv(new) @ target)[..., 0]


def cut_biases(hw: HeadWeights, biases: dict[str, torch.Tensor | None], cuts: dict[str, UnitCut]
               ) -> tuple[dict[str, torch.Tensor | None], list[str]]:
    """New per-head biases (``q``: (H, dh); ``k``, ``v``: (Hkv, dh); ``o``: (d,)) and notes."""
    out = {r: (b.to(torch.float64) if b is not None else None) for r, b in biases.items()}
    notes = []
    Hkv, dh, d = hw.wk.shape
    if "ov" in cuts and out.get("v") is not None:
        X, _ = unit_factors(hw, "ov")
        X = X.to(torch.float64)
        if out.get("o") is not None:
            out["o"] = out["o"] + (X @ out["v"][..., None]).reshape(Hkv, -1, d).sum((0, 1))
            out["v"] = torch.zeros_like(out["v"])
            notes.append("value bias moved into the output bias (exact: softmax rows sum to 1)")
        else:
            out["v"] = _refit(cuts["ov"].X.to(torch.float64), X, out["v"])
            notes.append("value bias refitted onto the kept subspace (no output bias: exact at full rank)")
    if "qk" in cuts:
        X, S = (t.to(torch.float64) for t in unit_factors(hw, "qk"))
        cX, cS = cuts["qk"].X.to(torch.float64), cuts["qk"].S.to(torch.float64)
        if out.get("q") is not None:
            bq = out["q"].reshape(Hkv, -1, dh)  # (Hkv, g, dh)
            out["q"] = (torch.linalg.pinv(cS)[:, None] @ (S[:, None] @ bq[..., None]))[..., 0].reshape(-1, dh)
            notes.append("query bias refitted: b_q' = pinv(W_K'^T) W_K^T b_q (exact at full rank)")
        if out.get("k") is not None:
            out["k"] = _refit(cX, X, out["k"])
            notes.append("key bias refitted (its terms are constant over keys: softmax ignores them)")
    return out, notes


# -- back into the stored tensors ------------------------------------------------------------
def join(split: str, shapes: dict[str, tuple[int, ...]], dims: Dims, hw: HeadWeights) -> dict[str, torch.Tensor]:
    """The raw tensors (role → tensor, float64) whose split by ``split`` is ``hw``.

    Splits are pure reshapes, permutes and transposes, so splitting tensors of element indices
    maps every raw element to its place in ``hw``; that map is inverted by one scatter. Works
    for every row of the layout table and any TOML layout.
    """
    if split == "separate":  # the common case, directly: rows of q, k, v; column blocks of o
        H, dh, d = hw.wq.shape
        out = {"q": hw.wq.reshape(-1, d), "k": hw.wk.reshape(-1, d), "v": hw.wv.reshape(-1, d),
               "o": hw.p.permute(1, 0, 2).reshape(d, H * dh)}
        if all(tuple(out[r].shape) == tuple(shapes[r]) for r in shapes) and set(out) == set(shapes):
            return out  # in hw's dtype (float64, or float32 from a float32/16 checkpoint's fast cut)
    idx, offsets, n = {}, {}, 0
    for role, shape in shapes.items():
        size = prod(shape)
        idx[role] = torch.arange(n, n + size).reshape(shape)
        offsets[role] = (n, size)
        n += size
    where = SPLITS[split](idx, dims)
    flat = torch.full((n,), float("nan"), dtype=torch.float64)
    for f in ("wq", "wk", "wv", "p"):
        flat[getattr(where, f).reshape(-1)] = getattr(hw, f).to(torch.float64).reshape(-1)
    return {role: flat[a:a + size].reshape(shapes[role]) for role, (a, size) in offsets.items()}


def bias_shapes(split: str, weight_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Shapes of the biases as one-input-column 'weights', so the same split separates them."""
    out = {}
    for role, (a, b) in weight_shapes.items():
        transposed = (split == "conv1d_fused") == (role != "o")  # Conv1D stores (in, out)
        out[role] = (1, b) if transposed else (a, 1)
    return out


def split_biases(split: str, weight_shapes: dict[str, tuple[int, ...]], dims: Dims,
                 raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | None]:
    """Per-head biases ``q (H, dh), k, v (Hkv, dh)`` from the raw bias vectors present (else None)."""
    shapes = bias_shapes(split, weight_shapes)
    one = Dims(dims.n_layers, 1, dims.n_heads, dims.n_kv_heads, dims.head_dim)
    full = {r: (raw[r].reshape(shapes[r]) if r in raw and r != "o" else torch.zeros(shapes[r], dtype=torch.float64))
            for r in shapes}
    hw = SPLITS[split]({r: t.to(torch.float64) for r, t in full.items()}, one)
    out = {"q": hw.wq[..., 0], "k": hw.wk[..., 0], "v": hw.wv[..., 0]}
    return {r: (t if (r in raw or "qkv" in raw) else None) for r, t in out.items()}


def join_biases(split: str, weight_shapes: dict[str, tuple[int, ...]], dims: Dims,
                b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Raw bias vectors (role → flat tensor) from per-head ``q, k, v`` biases (``o`` dummy)."""
    H, dh = dims.n_heads, dims.head_dim
    one = Dims(dims.n_layers, 1, H, dims.n_kv_heads, dh)
    hw = HeadWeights(b["q"][..., None], b["k"][..., None], b["v"][..., None], torch.zeros(H, 1, dh, dtype=torch.float64))
    raw = join(split, bias_shapes(split, weight_shapes), one, hw)
    return {r: t.reshape(-1) for r, t in raw.items() if r != "o"}
