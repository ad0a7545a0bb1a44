"""Rotary-aware QK: how a head's score form splits over the 2-D rotary frequency bands.

With rotary position embeddings the score of a query input ``x`` at position ``m`` and a key input
``y`` at position ``n`` is ``(R_m W_Q x)ᵀ (R_n W_K y) = xᵀ W_Qᵀ R(n − m) W_K y``: ``R`` is
block-diagonal with one 2-D rotation per frequency band and the identity on the ``dh − r``
non-rotary dimensions (partial rotary: GPT-NeoX/Pythia ``rotary_pct``, Phi ``partial_rotary_factor``,
GPT-J ``rotary_dim``; the rotary dimensions are the first ``r``). So the plain product
``W_Kᵀ W_Q`` is the score form at relative position 0 only, and its rank is not the rank used at
inference.

Band ``j`` (``j = 0 … r/2 − 1``, frequency ``θ_j``, rad/token) rotates the head dimensions
``(a_j, b_j) = (j, j + r/2)`` (``rotate_half``: Llama, Mistral, Qwen, Gemma, GPT-NeoX, Phi,
Falcon, StarCoder2, OLMo-2) or ``(2j, 2j + 1)`` (``rotate_every_two``: GPT-J, CodeGen). Writing the
two rows of a band as one complex row, ``u_j = W_Q[a_j] + i W_Q[b_j]`` and ``v_j = W_K[a_j] + i
W_K[b_j]`` (in ``C^d``), the score is exactly (tested against the real Hugging Face modules)::

    s(m, n) = Σ_j Re( e^{i θ_j (m − n)} (u_j · x) conj(v_j · y) )  +  xᵀ W_Q[p]ᵀ W_K[p] y

(``p`` the non-rotary dimensions). Band ``j``'s score form at offset ``Δ = m − n`` is the real
d × d matrix ``B_j(Δ) = Re(e^{iθ_jΔ} u_j v_jᴴ)`` (rank ≤ 2), the non-rotary form ``P = W_Q[p]ᵀ
W_K[p]`` does not depend on position.

**Energy of a band** (:func:`band_energies`): ``e_j = ½ ‖u_j‖² ‖v_j‖² = ½ (‖W_Q[a]‖² + ‖W_Q[b]‖²)
(‖W_K[a]‖² + ‖W_K[b]‖²)``, the mean of ``‖B_j(Δ)‖²_F`` over the band's rotation angle (exactly:
``‖B_j‖²_F = e_j + ½ Re(e^{2iθ_jΔ} (u_jᵀu_j) conj(v_jᵀv_j))`` oscillates about it). The
non-rotary part's energy is ``‖P‖²_F``. Averaged over independent uniform band phases, the energy
of the whole score form is exactly ``Σ_j e_j + ‖P‖²_F`` (the cross terms average out), so the
``share`` column splits a head's score energy over its bands and its non-rotary part.

What commutes with the rotation (:data:`COMMUTES`): dropping whole bands (both rows of a pair in
W_Q and W_K) and any cut of the non-rotary part (a rank-k cut of ``P`` is exact at every relative
position); a rank-k cut of the full ``W_Kᵀ W_Q`` is not (it mixes the rotated coordinates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from headrank.analysis.columns import Columns, concat, from_frame, group_agg, series_mean, to_frame
from headrank.core.linalg import DEFAULT_TOL, METRIC_COLUMNS, ProductMetrics
from headrank.core.metrics import _energy_rank, _sv

if TYPE_CHECKING:  # torch and pandas are imported where used: spectra's numpy route needs neither per layer
    import pandas as pd
    import torch

#: partial-rotary defaults of transformers' config classes when config.json leaves them out
#: (tests/analysis/test_rotary.py checks them against AutoConfig.for_model)
DEFAULT_PARTIAL = {"gpt_neox": 0.25, "phi": 0.5}
#: model types whose rotary rotates adjacent pairs (2j, 2j + 1) (transformers' rotate_every_two)
INTERLEAVED = ("gptj", "codegen")
COMMUTES = {
    "cut whole rotary bands (both rows of a pair in W_Q and W_K)": True,
    "rank-k cut of the non-rotary part W_K[p]^T W_Q[p]": True,
    "rank-k cut of the full W_K^T W_Q of a rotary head": False,
}
STYLES = {"half": "rotate_half: band j rotates head dims (j, j + r/2)",
          "interleaved": "rotate_every_two: band j rotates head dims (2j, 2j + 1)"}


@dataclass(frozen=True)
class RotarySpec:
    """Where the rotation acts in a head: the first ``rotary_dim`` of ``head_dim`` dimensions,
    paired by ``style`` (``half`` or ``interleaved``), band ``j`` turning by ``theta[j]`` rad/token."""

    head_dim: int
    rotary_dim: int
    style: str
    base: float
    rope_type: str
    theta: tuple[float, ...]
    frequencies: str  # where theta came from

    @property
    def n_bands(self) -> int:
        return self.rotary_dim // 2

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Head-dimension indices ``(a_j, b_j)`` of every band."""
        j, half = np.arange(self.n_bands), self.n_bands
        return (j, j + half) if self.style == "half" else (2 * j, 2 * j + 1)

    def pass_dims(self) -> np.ndarray:
        """The non-rotary head dimensions ``r … dh − 1``."""
        return np.arange(self.rotary_dim, self.head_dim)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} is {str(value)[:40]!r}, not a finite number")
    return float(value)


def _rope_fields(config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """rope_parameters (transformers 5; per layer type for Gemma 3) merged over rope_scaling."""
    rp = config.get("rope_parameters")
    note = None
    if isinstance(rp, dict) and rp and all(isinstance(v, dict) for v in rp.values()):
        key = "full_attention" if "full_attention" in rp else next(iter(rp))
        rp, note = rp[key], f"rope parameters of the {key!r} layers (other layer types differ in theta only)"
    rs = config.get("rope_scaling")
    return {**(rs if isinstance(rs, dict) else {}), **(rp if isinstance(rp, dict) else {})}, note


def rotary_spec(config: dict[str, Any], head_dim: int) -> tuple[RotarySpec, list[str]]:
    """The rotary layout of a rotary model from its config (and notes for meta.json).

    Reads ``rope_parameters`` / ``rope_scaling`` / ``rope_theta`` / ``rotary_emb_base`` (base,
    default 10000), ``partial_rotary_factor`` / ``rotary_pct`` (fraction) or ``rotary_dim``
    (count), the defaults of :data:`DEFAULT_PARTIAL`. Raises ValueError when the config does not
    give an even rotary width in ``2 … head_dim``.
    """
    fields, note = _rope_fields(config)
    notes = [note] if note else []
    model_type = str(config.get("model_type", ""))
    arch = model_type.removeprefix("gguf:")
    base = _number(fields.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0))),
                   "rope_theta")
    if config.get("rotary_dim") is not None:
        r = int(_number(config["rotary_dim"], "rotary_dim"))
    else:
        factor = fields.get("partial_rotary_factor",
                            config.get("partial_rotary_factor", config.get("rotary_pct", DEFAULT_PARTIAL.get(arch, 1.0))))
        r = int(head_dim * _number(factor, "partial_rotary_factor"))
    if not (2 <= r <= head_dim and r % 2 == 0) or not base > 1:
        raise ValueError(f"rotary width {r} of head dim {head_dim} (base {base:g}) is not an even width in 2..{head_dim}")
    rope_type = str(fields.get("rope_type", fields.get("type", "default")))
    theta, how = _frequencies(config, model_type, r, base, rope_type)
    style = "interleaved" if arch in INTERLEAVED or _verified_style(arch) == "interleaved" else "half"
    return RotarySpec(head_dim, r, style, base, rope_type, tuple(float(t) for t in theta), how), notes


def _verified_style(model_type: str) -> str | None:
    """The rotary pairing a generated layout row verified for ``model_type`` (``half`` or ``interleaved``)."""
    from headrank.io.generated import generated_rows

    return generated_rows().get(model_type, {}).get("rotary_style")


def _frequencies(config: dict[str, Any], model_type: str, r: int, base: float, rope_type: str) -> tuple[np.ndarray, str]:
    default = base ** (-np.arange(0, r, 2, dtype=np.float64) / r)
    if rope_type == "default":
        return default, "theta_j = base^(-2j/r) (float64)"
    try:  # scaled rope (llama3, linear, yarn …): transformers' own frequencies, only when needed
        from transformers import AutoConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        cfg = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
        inv, _ = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
        inv = inv.double().numpy()
        if inv.shape == default.shape:
            return inv, f"transformers' {rope_type} rope frequencies"
    except Exception:  # noqa: BLE001 - any failure leaves the unscaled frequencies, said in meta
        pass
    return default, f"theta_j = base^(-2j/r) before the {rope_type!r} rope scaling (not applied)"


def energies_from_norms(nq: torch.Tensor, nk: torch.Tensor, spec: RotarySpec) -> torch.Tensor:
    """Each band's energy ``e_j`` ``(..., n_bands)`` from the squared row norms ``(..., dh)`` of a
    head's W_Q and W_K (``headrank spectra`` has them already: ``row_norms`` q and k); torch
    tensors or numpy arrays (numpy in, numpy out)."""
    a, b = spec.pairs()
    if type(nq).__module__.startswith("torch"):
        import torch

        a, b = torch.from_numpy(a), torch.from_numpy(b)
        nq, nk = nq.to(torch.float64), torch.as_tensor(nk).to(torch.float64)
    else:
        nq, nk = np.asarray(nq, dtype=np.float64), np.asarray(nk, dtype=np.float64)
    return 0.5 * (nq[..., a] + nq[..., b]) * (nk[..., a] + nk[..., b])


def band_energies(wq: torch.Tensor, wk: torch.Tensor, spec: RotarySpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head: each band's energy ``e_j`` ``(..., n_bands)`` and the non-rotary part's ``‖P‖²_F``
    ``(...)``, for ``wq, wk`` of shape ``(..., dh, d)`` (a kv head repeated for its query heads)."""
    import torch

    wq, wk = wq.to(torch.float64), wk.to(torch.float64)
    bands = energies_from_norms((wq**2).sum(-1), (wk**2).sum(-1), spec)
    p = torch.from_numpy(spec.pass_dims())
    gq, gk = wq[..., p, :] @ wq[..., p, :].mT, wk[..., p, :] @ wk[..., p, :].mT
    return bands, (gq * gk).sum((-2, -1))  # ‖W_Q[p]ᵀ W_K[p]‖²_F = tr(G_Q G_K), G = W[p] W[p]ᵀ


def pass_metrics(hw: Any, spec: RotarySpec, tol: float = DEFAULT_TOL) -> ProductMetrics:
    """The metric table of each query head's non-rotary part ``W_K[p]ᵀ W_Q[p]`` (its energy is
    ``frob²``): ``hw.qk().restrict(p)`` (:meth:`headrank.core.product.Product.restrict`), whose
    roots come from the layer's cached ones (``W[p]ᵀ = Q R[:, p]``: a QR of the small ``R[:, p]``),
    so the weights are not read again; a kv head's root is formed once for its group."""
    p = spec.pass_dims()
    if type(hw.wq).__module__.startswith("torch"):
        import torch

        p = torch.from_numpy(p)
    return hw.qk().restrict(p).metrics(tol)


def band_scores(wq: torch.Tensor, wk: torch.Tensor, spec: RotarySpec, x: torch.Tensor, y: torch.Tensor,
                delta: torch.Tensor | float) -> torch.Tensor:
    """The score's parts for one head (``wq, wk``: ``(dh, d)``): query inputs ``x`` and key inputs
    ``y`` ``(..., d)`` at relative position ``delta = m − n`` (broadcast). Returns ``(..., n_bands + 1)``:
    band j's ``Re(e^{iθ_jΔ} (u_j·x) conj(v_j·y))``, then the non-rotary part; they sum to the score."""
    import torch

    a, b = (torch.from_numpy(i) for i in spec.pairs())
    qx, ky = x.to(torch.float64) @ wq.to(torch.float64).T, y.to(torch.float64) @ wk.to(torch.float64).T
    zq, zk = torch.complex(qx[..., a], qx[..., b]), torch.complex(ky[..., a], ky[..., b])
    theta = torch.tensor(spec.theta, dtype=torch.float64)
    phase = torch.polar(torch.ones_like(theta), torch.as_tensor(delta, dtype=torch.float64)[..., None] * theta)
    p = torch.from_numpy(spec.pass_dims())
    rest = (qx[..., p] * ky[..., p]).sum(-1, keepdim=True)
    return torch.cat([(phase * zq * zk.conj()).real, rest], -1)


class RotaryScan:
    """Collects, layer by layer, each head's band energies and the spectra of its non-rotary part
    (``W_K[p]ᵀ W_Q[p]`` through the linalg core, when rotary is partial) for ``rotary.csv``."""

    def __init__(self, spec: RotarySpec, notes: list[str], tol: float = DEFAULT_TOL):
        self.spec, self.notes, self.tol = spec, notes, tol
        self.frames: list[dict[str, Any]] = []  # columns per layer; DataFrames only in table()

    def add(self, layer: int, hw: Any, row_norms: dict[str, torch.Tensor]) -> None:
        """One layer: its :class:`~headrank.io.layouts.HeadWeights` (its roots cached, see
        :func:`pass_metrics`) and the squared row norms of W_Q and W_K per query head
        (``row_norms["q"]``, ``["k"]``, (H, dh))."""
        bands = energies_from_norms(row_norms["q"], row_norms["k"], self.spec)
        H, nb = bands.shape
        partial = self.spec.rotary_dim < self.spec.head_dim
        m = pass_metrics(hw, self.spec, self.tol) if partial else None
        bands = np.asarray(bands, dtype=np.float64)
        rest = np.asarray(m.frob, dtype=np.float64) ** 2 if m is not None else np.zeros(H, dtype=np.float64)
        total = bands.sum(-1) + rest
        total = np.where(total > 0, total, 1.0)
        a, b = self.spec.pairs()
        theta = np.asarray(self.spec.theta)
        self.frames.append({
            "layer": layer, "head": np.repeat(np.arange(H), nb), "kv_head": np.repeat(np.arange(H) // hw.group, nb),
            "part": "band", "band": np.tile(np.arange(nb), H), "dim_a": np.tile(a, H), "dim_b": np.tile(b, H),
            "theta": np.tile(theta, H), "wavelength": np.tile(2 * np.pi / theta, H),
            "energy": bands.reshape(-1), "share": (bands / total[:, None]).reshape(-1)})
        if m is not None:
            self.frames.append({
                "layer": layer, "head": np.arange(H), "kv_head": np.arange(H) // hw.group, "part": "pass",
                "band": -1, "dim_a": -1, "dim_b": -1, "theta": 0.0, "wavelength": np.inf,
                "energy": rest, "share": rest / total, **{k: np.asarray(v) for k, v in m.columns().items()}})

    def columns(self) -> Columns:
        """:meth:`table` as numpy columns (rotary.csv is written from these without pandas)."""
        t = concat(self.frames)
        return {k: t[k] for k in [*list(t)[:11], *[c for c in METRIC_COLUMNS if c in t]]}

    def table(self) -> pd.DataFrame:
        """One row per (layer, head, band) and, for partial rotary, one ``pass`` row per head."""
        return to_frame(self.columns())

    def meta(self, table: pd.DataFrame | Columns) -> dict[str, Any]:
        """meta.json's ``rotary_bands``: the layout read, the definitions, what commutes, and means."""
        s = self.spec
        cols = table if isinstance(table, dict) else from_frame(table)
        bands = {k: np.asarray(v)[np.asarray(cols["part"]) == "band"] for k, v in cols.items()}
        order = np.lexsort((bands["head"], bands["layer"]))  # stable: each head's bands in row order
        energy = bands["energy"][order].reshape(-1, s.n_bands) if order.size else np.zeros((0, s.n_bands))
        per_head = np.sort(energy, axis=-1)[:, ::-1]
        k90 = float(_energy_rank(_sv(np.sqrt(per_head)), 0.9).astype(np.float64).mean())
        share = group_agg(bands, ("layer", "head"), [("share", "share", "sum")])["share"]
        return {
            "head_dim": s.head_dim, "rotary_dim": s.rotary_dim, "bands": s.n_bands, "style": STYLES[s.style],
            "base": s.base, "rope_type": s.rope_type, "frequencies": s.frequencies,
            "non_rotary_dims": f"{s.rotary_dim}..{s.head_dim - 1}" if s.rotary_dim < s.head_dim else "none",
            "energy": "band j: 1/2 (|W_Q[a]|^2 + |W_Q[b]|^2)(|W_K[a]|^2 + |W_K[b]|^2), the mean over the band's "
                      "rotation angle of |Re(e^{i phi} u_j v_j^H)|_F^2; pass: |W_K[p]^T W_Q[p]|_F^2; share: of "
                      "their sum per head (= the mean of the score form's energy over independent band phases)",
            "score": "x W_Q^T R(n - m) W_K y = sum_j Re(e^{i theta_j (m - n)} (u_j . x) conj(v_j . y)) + "
                     "x W_Q[p]^T W_K[p] y, u_j = W_Q[a_j] + i W_Q[b_j], v_j = W_K[a_j] + i W_K[b_j]",
            "pass_metrics": "rotary.csv's pass rows: the metric table of W_K[p]^T W_Q[p] (exact at every position)",
            "commutes_with_rotation": COMMUTES,
            "mean_rotary_share": series_mean(share),
            "mean_bands_for_90pct_of_band_energy": k90,
            "notes": self.notes,
        }


def rotary_scan(config: dict[str, Any], position: str, head_dim: int, qk_norm: bool,
                tol: float = DEFAULT_TOL, enabled: bool = True) -> tuple[RotaryScan | None, str | None]:
    """A :class:`RotaryScan` for a rotary model, else ``None`` and why not (for meta.json)."""
    if position != "rotary":
        return None, None
    if not enabled:
        return None, "not measured (--no-rotary)"
    try:
        spec, notes = rotary_spec(config, head_dim)
    except ValueError as e:
        return None, f"rotary bands not reported: {e}"
    if qk_norm:
        notes.append("q and k are normalised per head before the rotation: band energies describe the weights only")
    return RotaryScan(spec, notes, tol), None


def rotary_line(meta: dict[str, Any]) -> str | None:
    """One console line on a spectra result's rotary bands (None for a model without them)."""
    rb = meta.get("conventions", {}).get("rotary_bands")
    if not isinstance(rb, dict):
        return None
    return (f"rotary: {rb['rotary_dim']} of {rb['head_dim']} dims in {rb['bands']} bands; mean share of QK energy in "
            f"the bands {rb['mean_rotary_share']:.3f}; bands for 90% of it {rb['mean_bands_for_90pct_of_band_energy']:.1f}")
