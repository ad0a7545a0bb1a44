"""One product of two factors ``A Bᵀ``, batched over heads: :class:`Product`.

In the spirit of TransformerLens' ``FactoredMatrix``: the product is kept factored, ``A`` of shape
``(..., m, r)`` and ``B`` of shape ``(..., n, r)`` (a head's ``d × dh`` factors; ``m ≠ n`` for a
query group stacked against its kv head), and everything is read from the factors' roots
``AᵀA = R_AᵀR_A``, ``BᵀB = R_BᵀR_B`` (:func:`headrank.core.linalg.factor_roots`), formed once on first
use and cached:

- ``.metrics(tol)``: the metric table (:class:`~headrank.core.linalg.ProductMetrics`), from the
  core ``R_A R_Bᵀ``'s singular values (:func:`~headrank.core.linalg.metrics_from_roots`);
- ``.S``: the singular values (descending);
- ``.basis()``: the core's SVD ``R_A R_Bᵀ = U_c Σ V_cᵀ`` as ``R_A⁻¹ U_c`` and ``R_B⁻¹ V_c`` (the
  product's singular vectors are ``A R_A⁻¹ U_c``, ``B R_B⁻¹ V_c``), where the roots are
  well-conditioned;
- ``.svd()``: the thin SVD ``A Bᵀ = U diag(S) Vᵀ``;
- ``.restrict(cols)``: the product of the columns ``cols`` of both factors (a rotary band's
  complement), its roots from the cached ones without reading the factors again;
- ``[h]``: one head (or any index of the batch), its roots a slice of the cached ones.

Threads, device and precision come from the one compute setting
(:func:`headrank.util.threads.computing`), read when the roots are formed.
Conventions: docs/methods/products.md; precision: docs/methods/precision.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrank.core.linalg import (
    DEFAULT_TOL,
    PRODUCT_SVD_COND,
    ProductMetrics,
    _is_torch,
    _qr_r_np,
    factor_roots,
    metrics_from_roots,
)

if TYPE_CHECKING:
    import torch

#: units per task when the core SVDs of :meth:`Product.basis` are shared among threads (fixed,
#: so that results never depend on the thread count)
UNITS_PER_TASK = 4


@dataclass
class Basis:
    """The core SVD of every item of a product, from its roots: with ``R_A R_Bᵀ = U_c Σ V_cᵀ``, the
    singular values ``sv`` ``(n, p)`` and ``A = R_A⁻¹ U_c``, ``B = R_B⁻¹ V_c`` ``(n, r, r)`` (the
    singular vectors of ``A Bᵀ`` are the factors times these). ``ok`` ``(n,)``: where both roots
    are square and well-conditioned (:data:`~headrank.core.linalg.PRODUCT_SVD_COND`); ``A`` and
    ``B`` are meaningful there only, and None when no item is."""

    sv: torch.Tensor
    A: torch.Tensor | None = None
    B: torch.Tensor | None = None
    ok: torch.Tensor | None = None


class Product:
    """``A Bᵀ`` batched over the leading dimensions (see the module's docstring).

    ``Product(A, B)``: factors, numpy arrays or torch tensors of any float dtype (bfloat16 bits
    read by numpy too); ``roots``: the roots ``(R_A, R_B)`` when already formed (a kv head's root
    shared by its query group), so they are not formed again, with ``errors``, their per-item
    modelled Gram errors (:func:`headrank.core.linalg.factor_roots`; None: float64 roots).
    Either may be given alone: without factors, :meth:`svd` and the float64 fallback of
    :meth:`metrics` are not available."""

    def __init__(self, A: Any = None, B: Any = None, *, roots: tuple[Any, Any] | None = None,
                 errors: tuple[Any, Any] | None = None):
        if (A is None or B is None) and roots is None:
            raise ValueError("a Product needs its factors A, B or their roots")
        if A is not None and B is not None:
            if A.ndim < 2 or B.ndim < 2 or A.shape[:-2] != B.shape[:-2] or A.shape[-1] != B.shape[-1]:
                raise ValueError(f"factors must be (..., m, r) and (..., n, r); got {tuple(A.shape)}, "
                                 f"{tuple(B.shape)}")
        self.A, self.B = A, B
        self._roots, self._errors = roots, errors
        self._metrics: dict[float, ProductMetrics] = {}
        self._basis: Basis | None = None

    @property
    def roots(self) -> tuple[Any, Any]:
        """``(R_A, R_B)``, float64, formed on first use (in the compute setting then in force)."""
        if self._roots is None:
            roots, errors = factor_roots(self.A, self.B, errors=True)
            self._roots, self._errors = tuple(roots), tuple(errors)
        return self._roots

    @property
    def errors(self) -> tuple[Any, Any] | None:
        """Per item of each factor, ``[s, η, ‖E‖, ‖Ĝ‖]`` (numpy, batch shape × 4; s = 0 where
        float64; :func:`headrank.core.linalg.factor_roots`), or None where every root is float64's."""
        _ = self.roots
        if self._errors is None or not any(bool((e[..., 0] > 0).any()) for e in self._errors):
            return None
        return self._errors

    @property
    def batch(self) -> tuple[int, ...]:
        """The batch shape (heads, or kv units, …)."""
        return tuple((self.A if self.A is not None else self._roots[0]).shape[:-2])

    def metrics(self, tol: float = DEFAULT_TOL, energy: tuple[float, ...] = ()) -> ProductMetrics:
        """Every row of the metric table for every item (cached per ``tol`` and ``energy``), with
        ``bound`` and ``fallback`` (:class:`~headrank.core.linalg.ProductMetrics`).

        Roots from ``auto`` Grams: each item's modelled error bound is checked against the
        contract (:func:`headrank.core.precision.holds`: the singular values, the numerical rank
        at ``tol``, the energy ranks k90, k99 and at ``energy``, gap/bound); items it cannot
        guarantee are recomputed from the factors in float64, all of them at once when more
        than FALLBACK_SHARE of the items are."""
        key = (tol, tuple(energy))
        if key not in self._metrics:
            m = metrics_from_roots(*self.roots, tol)
            self._metrics[key] = m if self.errors is None else self._certified(m, tol, tuple(energy))
        return self._metrics[key]

    def _certified(self, m: ProductMetrics, tol: float, energy: tuple[float, ...]) -> ProductMetrics:
        """``m`` with each item's bound, the items the bound cannot guarantee recomputed in float64."""
        import numpy as np

        from headrank.core import precision as pr
        from headrank.util.threads import computing

        fa, fb_ = (_as_dict(e) for e in self.errors)
        sa, sb = fa["s"], fb_["s"]
        sv = np.asarray(m.sv, dtype=np.float64).reshape(-1, m.sv.shape[-1])
        b = pr.sv_bounds(sv, fa, fb_)
        fb = np.asarray(m.values["frob_bound"], dtype=np.float64).reshape(-1)
        finite = np.asarray(m.finite).reshape(-1)
        ok = pr.holds(sv, b, tol, np.maximum(sa, sb), fb, (0.90, 0.99, *energy)) | ~finite
        with np.errstate(all="ignore"):
            bound = np.where(finite, np.where(sv[:, 0] > 0, b.max(-1) / sv[:, 0], 0.0), np.nan)
        bad = ~ok
        if bad.any() and (self.A is None or self.B is None):
            raise ValueError("a Product from roots alone cannot fall back to float64: give its factors")
        if bad.sum() > pr.FALLBACK_SHARE * bad.size:
            bad[:] = True
        if bad.any():
            A, B = (x.reshape(-1, *x.shape[-2:]) for x in (self.A, self.B))
            idx = _index(A, bad)
            with computing(precision="float64"):
                m64 = Product(A[idx], B[idx]).metrics(tol)
            m = _spliced(m, m64, bad)
            bound[bad] = 0.0
        batch = tuple(m.finite.shape)
        return ProductMetrics(sv=m.sv, values=m.values, finite=m.finite, tol=m.tol, bound=bound.reshape(batch),
                              fallback=bad.reshape(batch))

    @property
    def S(self) -> Any:
        """The singular values ``(..., p)``, descending, float64 (:meth:`metrics`' ``sv``)."""
        return self.metrics().sv

    def __getitem__(self, idx: Any) -> Product:
        """The items ``idx`` of the batch (``p[h]``: head h), roots sliced from the cached ones."""
        Ra, Rb = self.roots
        A = None if self.A is None else self.A[idx]
        B = None if self.B is None else self.B[idx]
        errors = None if self._errors is None else tuple(e[idx] for e in self._errors)
        return Product(A, B, roots=(Ra[idx], Rb[idx]), errors=errors)

    def restrict(self, cols: Any) -> Product:
        """The product ``A[..., cols] B[..., cols]ᵀ`` (e.g. the non-rotary dimensions of a head):
        ``X[:, cols] = Q R[:, cols]``, so a QR of the small ``R[:, cols]`` is a root of the
        restricted factor, and the factors are not read again (NaN items stay NaN)."""
        Ra, Rb = self.roots
        A = None if self.A is None else self.A[..., cols]
        B = None if self.B is None else self.B[..., cols]
        # a restricted factor's Gram is the principal submatrix of its Gram: the same modelled error s,
        # its condition (η) from the restricted root
        sub = (_sub_root(Ra, cols), _sub_root(Rb, cols))
        errors = None if self._errors is None else tuple(
            _factor_error(R, e[..., 0]) for R, e in zip(sub, self._errors, strict=True))
        return Product(A, B, roots=sub, errors=errors)

    def basis(self) -> Basis:
        """:class:`Basis` of every item (flattened batch), UNITS_PER_TASK items per task on the
        compute setting's threads (the whole batch at once on a device)."""
        if self._basis is None:
            self._basis = _basis(*self.roots) if self.errors is None else self._certified_basis()
        return self._basis

    def _certified_basis(self) -> Basis:
        """:func:`_basis` of ``auto`` roots, the items whose singular values the bound cannot hold to
        CONTRACT_SV·σ_max (:func:`headrank.core.precision.sv_bounds`) recomputed in float64."""
        import torch

        from headrank.core import precision as pr
        from headrank.util.threads import computing

        b = _basis(*self.roots)
        sv = b.sv.numpy()
        err = pr.sv_bounds(sv, *(_as_dict(e) for e in self.errors))
        bad = ~(err <= pr.CONTRACT_SV * sv[:, :1]).all(-1)
        if not bad.any():
            return b
        if bad.sum() > pr.FALLBACK_SHARE * bad.size:
            bad[:] = True
        A, B = (x.reshape(-1, *x.shape[-2:]) for x in (self.A, self.B))
        idx = _index(A, bad)
        with computing(precision="float64"):
            b64 = Product(A[idx], B[idx]).basis()
        t = torch.from_numpy(bad)
        sv2 = b.sv.clone()
        sv2[t] = b64.sv
        ok = b.ok.clone()
        ok[t] = b64.ok
        if b.A is None or b64.A is None:
            return Basis(sv2, ok=ok & False) if not bool(ok.any()) else Basis(sv2, ok=ok)
        A2, B2 = b.A.clone(), b.B.clone()
        A2[t], B2[t] = b64.A, b64.B
        return Basis(sv2, A2, B2, ok)

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact thin SVD ``A Bᵀ = U diag(S) Vᵀ``, never forming ``A Bᵀ``: float64 ``U (..., m, p)``,
        ``S (..., p)`` descending, ``V (..., n, p)``, ``p = min(m, n, r)``.

        Where both roots are well-conditioned (:meth:`basis`' ``ok``), ``U = A (R_A⁻¹ U_c)`` costs
        one GEMM; elsewhere (rank-deficient or ill-conditioned factors, or fewer rows than
        columns) a float64 Householder QR of each factor gives its orthonormal part itself.
        O((m + n)·r²) per item."""
        import torch

        if self.A is None or self.B is None:
            raise ValueError("Product.svd needs the factors, not only their roots")
        A, B = (_float64(x).reshape(-1, *x.shape[-2:]) for x in (self.A, self.B))
        batch, r = self.batch, A.shape[-1]
        p = min(A.shape[-2], B.shape[-2], r)
        if min(A.shape[-2], B.shape[-2]) < r:  # a root would not be square: Householder throughout
            fast = torch.zeros(A.shape[0], dtype=torch.bool)
        else:
            b = self.basis()
            fast = b.ok
        if bool(fast.all()):  # every item on the fast route: one GEMM each, no masked copies of the factors
            U, V, S = A @ b.A[..., :p], B @ b.B[..., :p], b.sv[..., :p].clone()
            return U.reshape(*batch, *U.shape[-2:]), S.reshape(*batch, p), V.reshape(*batch, *V.shape[-2:])
        U = torch.empty(A.shape[0], A.shape[-2], p, dtype=torch.float64)
        V = torch.empty(B.shape[0], B.shape[-2], p, dtype=torch.float64)
        S = torch.empty(A.shape[0], p, dtype=torch.float64)
        if bool(fast.any()):
            U[fast] = A[fast] @ b.A[fast][..., :p]
            V[fast] = B[fast] @ b.B[fast][..., :p]
            S[fast] = b.sv[fast][..., :p]
        slow = ~fast
        if bool(slow.any()):
            Qa, Ra_ = torch.linalg.qr(A[slow])
            Qb, Rb_ = torch.linalg.qr(B[slow])
            Uc, s, Vch = torch.linalg.svd(Ra_ @ Rb_.mT, full_matrices=False)
            U[slow], S[slow], V[slow] = (Qa @ Uc)[..., :p], s[..., :p], (Qb @ Vch.mT)[..., :p]
        return U.reshape(*batch, *U.shape[-2:]), S.reshape(*batch, p), V.reshape(*batch, *V.shape[-2:])


def product_svd(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Product(A, B).svd()``: the exact thin SVD of ``A Bᵀ`` (:meth:`Product.svd`)."""
    return Product(A, B).svd()


def _float64(x: Any) -> torch.Tensor:
    """A factor as a CPU float64 torch tensor (numpy arrays and bfloat16 bits converted exactly)."""
    import torch

    from headrank.util.bf16 import as_float

    if _is_torch(x):
        return x.detach().to(device="cpu", dtype=torch.float64)
    return torch.from_numpy(as_float(x))


def _torch(R: Any) -> torch.Tensor:
    import torch

    return R if _is_torch(R) else torch.from_numpy(R)


def _basis_part(Rx: torch.Tensor, Rs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ok, sv, A, B)`` of a chunk of items: ok where both roots are well-conditioned."""
    import torch

    eye = torch.eye(Rx.shape[-1], dtype=torch.float64, device=Rx.device)
    inv = [torch.linalg.solve_triangular(R, eye.expand_as(R), upper=True) for R in (Rx, Rs)]
    cond = [torch.linalg.matrix_norm(R) * torch.linalg.matrix_norm(Ri) for R, Ri in zip((Rx, Rs), inv, strict=True)]
    ok = (cond[0] <= PRODUCT_SVD_COND) & (cond[1] <= PRODUCT_SVD_COND)
    if not bool(ok.any()):
        return ok, torch.linalg.svdvals(Rx @ Rs.mT), inv[0], inv[1]
    Uc, sv, Vch = torch.linalg.svd(Rx @ Rs.mT)
    if not bool(ok.all()):  # the singular values of the others from svdvals, as the QR route would
        sv = sv.clone()
        sv[~ok] = torch.linalg.svdvals(Rx[~ok] @ Rs[~ok].mT)
    return ok, sv, inv[0] @ Uc, inv[1] @ Vch.mT


def _basis(Ra: Any, Rb: Any) -> Basis:
    """:meth:`Product.basis` of roots ``(..., p, r)``."""
    import torch

    from headrank.util.threads import compute_setting, parallel_map

    setting = compute_setting()
    Rx, Rs = (_torch(R).reshape(-1, *R.shape[-2:]) for R in (Ra, Rb))
    if setting.device is not None:
        Rx, Rs = Rx.to(setting.device), Rs.to(setting.device)
    if Rx.shape[-2] != Rx.shape[-1] or Rs.shape[-2] != Rs.shape[-1]:
        return Basis(torch.linalg.svdvals(Rx @ Rs.mT), ok=torch.zeros(Rx.shape[0], dtype=torch.bool))
    per = UNITS_PER_TASK if setting.device is None else max(1, Rx.shape[0])  # a device: the whole batch at once
    spans = [slice(a, a + per) for a in range(0, Rx.shape[0], per)]
    parts = parallel_map(lambda s: _basis_part(Rx[s], Rs[s]), spans, setting.threads)
    ok, sv, A, B = (torch.cat([p[n] for p in parts]).cpu() for n in range(4))
    return Basis(sv, A, B, ok) if bool(ok.any()) else Basis(sv, ok=ok)


def _as_dict(e: Any) -> dict[str, Any]:
    """Errors ``[s, η, ‖E‖, ‖Ĝ‖]`` ``(..., 4)`` as flat named columns (what precision.sv_bounds reads)."""
    import numpy as np

    e = np.asarray(e, dtype=np.float64).reshape(-1, 4)
    return {"s": e[:, 0], "eta": e[:, 1], "E": e[:, 2], "G": e[:, 3]}


def _factor_error(R: Any, s: Any) -> Any:
    """Errors ``[s, η, ‖E‖, ‖Ĝ‖]`` (batch × 4) of roots ``(..., k, k)`` with modelled Gram errors
    ``s`` (:func:`headrank.core.precision.factor_error`; ``R⁻¹`` by
    :func:`headrank.core.linalg._triu_inv` for the items with an ``auto`` Gram)."""
    import numpy as np

    from headrank.core.linalg import _triu_inv
    from headrank.core.precision import factor_error

    batch = tuple(s.shape)
    R = np.asarray(R, dtype=np.float64).reshape(-1, *R.shape[-2:])
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    live = (s > 0) & np.isfinite(R).all((-2, -1))
    Rinv = np.full_like(R, np.nan)
    if live.any() and R.shape[-1] == R.shape[-2]:
        with np.errstate(all="ignore"):
            try:
                Rinv[live] = _triu_inv(R[live])
            except np.linalg.LinAlgError:  # an exactly singular root: its bound is infinite
                pass
    e = factor_error(R, Rinv, np.where(live, s, 0.0))
    return np.stack([np.where(live, s, 0.0), e["eta"], e["E"], e["G"]], -1).reshape((*batch, 4))


def _index(X: Any, mask: Any) -> Any:
    """A numpy mask as an index of ``X`` (a torch tensor takes a torch mask)."""
    if _is_torch(X):
        import torch

        return torch.from_numpy(mask)
    return mask


def _spliced(m: ProductMetrics, m64: ProductMetrics, bad: Any) -> ProductMetrics:
    """``m`` (flattened items) with the items ``bad`` replaced by ``m64``'s, in ``m``'s types."""
    import numpy as np

    def put(x: Any, y: Any) -> Any:
        flat = x.reshape(-1, *x.shape[m.finite.ndim:])
        if _is_torch(x):
            import torch

            flat = flat.clone()
            flat[torch.from_numpy(bad)] = torch.as_tensor(np.asarray(y)).to(flat.dtype)
        else:
            flat = flat.copy()
            flat[bad] = np.asarray(y).astype(flat.dtype)
        return flat.reshape(x.shape)

    return ProductMetrics(sv=put(m.sv, m64.sv), values={k: put(v, m64.values[k]) for k, v in m.values.items()},
                          finite=put(m.finite, m64.finite), tol=m.tol)


def _sub_root(R: Any, p: Any) -> Any:
    """A root of the columns ``p`` of ``X`` from a root ``R`` of ``X`` (NaN items stay NaN)."""
    if not _is_torch(R):
        import numpy as np

        sub = R[..., np.asarray(p)]
        finite = np.isfinite(sub).all((-2, -1))
        return np.where(finite[..., None, None], _qr_r_np(sub), np.nan)
    import torch

    sub = R[..., p]
    finite = torch.isfinite(sub).all(-1).all(-1)
    out = torch.linalg.qr(torch.nan_to_num(sub, nan=0.0, posinf=0.0, neginf=0.0), mode="r").R
    return torch.where(finite[..., None, None], out, torch.full_like(out, float("nan")))
