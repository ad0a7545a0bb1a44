"""QK cuts that commute with rotary position embeddings (docs/methods/compression.md).

With rotary embeddings the score is ``xᵀ W_Qᵀ R(m − n) W_K y``, ``R`` block-diagonal: one 2-D
rotation per frequency band, the identity on the non-rotary dimensions of partial-rotary models
(:mod:`headrank.analysis.rotary`). Two cuts are exact at every relative position:

- dropping a whole band: both rows of its pair in W_Q (every query head of the group) and W_K;
- any cut of the non-rotary part ``W_K[p]ᵀ W_Q[p]``: here its best rank-k approximation.

A unit (one kv head and its query group) ranks its items by energy: band ``j`` counts as two
directions of energy ``e_j / 2`` each (``e_j`` summed over the group's query heads, the mean of
the band's ``‖B_j(Δ)‖²_F`` over its rotation angle; :func:`headrank.analysis.rotary.band_energies`)
and the non-rotary part's singular directions as one each (``σᵢ²``). Keeping ``k`` directions
keeps the top ``k`` items; a band of which one direction is kept is kept whole. The kept energy is
that of this pseudo-spectrum (``Σ e_j + ‖P‖²_F``, the score form's energy averaged over
independent band phases).
"""

from __future__ import annotations

import torch

from headrank.analysis.rotary import RotarySpec, band_energies
from headrank.compress.cut import UnitCut, cut_unit, diff_norm, unit_factors
from headrank.io.layouts import HeadWeights


def groups(hw: HeadWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q by kv group ``(Hkv, g, dh, d)`` and W_K ``(Hkv, dh, d)``, float64 (made once per layer
    and passed to :func:`items`, :func:`cut` and :func:`biases`)."""
    Hkv, dh, d = hw.wk.shape
    return hw.wq.to(torch.float64).reshape(Hkv, -1, dh, d), hw.wk.to(torch.float64)


def _pass_factors(wq: torch.Tensor, wk: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-rotary part as a unit: X (Hkv, g·d, |p|), S (Hkv, d, |p|)."""
    Hkv, g, _, d = wq.shape
    X = wq[:, :, p, :].mT.reshape(Hkv, g * d, len(p))
    return X, wk[:, p, :].mT


def items(hw: HeadWeights, spec: RotarySpec, qk: tuple[torch.Tensor, torch.Tensor] | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per unit, the pseudo-spectrum ``(Hkv, n)`` (σ = √energy, descending) and the item tags
    (band ``j ≥ 0``; non-rotary direction ``i`` as ``-1 - i``). ``qk``: :func:`groups` of ``hw``."""
    wq, wk = qk if qk is not None else groups(hw)
    bands, _ = band_energies(wq, wk[:, None].expand_as(wq), spec)
    e = [bands.sum(1).repeat_interleave(2, -1) / 2]
    tags = [torch.arange(spec.n_bands).repeat_interleave(2)]
    p = torch.from_numpy(spec.pass_dims())
    if len(p):
        from headrank.core.product import Product

        e.append(Product(*_pass_factors(wq, wk, p)).basis().sv ** 2)
        tags.append(-1 - torch.arange(e[-1].shape[-1]))
    e_all = torch.cat(e, -1)
    tag = torch.cat(tags).expand_as(e_all)
    order = torch.sort(e_all, dim=-1, descending=True, stable=True).indices
    return e_all.gather(-1, order).clamp_min(0).sqrt(), tag.gather(-1, order)


def cut(hw: HeadWeights, spec: RotarySpec, k: torch.Tensor, found: tuple[torch.Tensor, torch.Tensor] | None = None,
        qk: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[UnitCut, torch.Tensor, UnitCut | None]:
    """The rotary-safe QK cut keeping ``k[u]`` directions of every unit: the whole-QK
    :class:`UnitCut` (k = dims kept), the kept-band mask ``(Hkv, n_bands)`` and the non-rotary
    part's own cut (None without one). ``found``: :func:`items` of this layer, when the ranks
    were chosen on it (not computed again); ``qk``: :func:`groups` of ``hw``. Without a
    non-rotary part the cut factors are the stored weights with the dropped rows zeroed, in
    the stored dtype (exactly the float64 ones rounded back)."""
    wq0, wk0 = qk if qk is not None else groups(hw)
    sv, tag = found if found is not None else items(hw, spec, (wq0, wk0))
    top = torch.arange(sv.shape[-1]) < k[:, None]
    keep = torch.zeros(sv.shape[0], spec.n_bands, dtype=torch.bool)
    for u in range(sv.shape[0]):
        j = tag[u][top[u] & (tag[u] >= 0)]
        keep[u, j] = True
    a, b = (torch.from_numpy(i) for i in spec.pairs())
    drop = torch.zeros(wk0.shape[:2], dtype=torch.bool)
    drop[:, a], drop[:, b] = ~keep, ~keep
    if hw.wq.is_contiguous() and hw.wk.is_contiguous():  # the float64 copies, laid out as unit_factors' would be
        X0, S0 = wq0.mT.reshape(wq0.shape[0], -1, wq0.shape[2]), wk0.mT
    else:
        X0, S0 = (t.to(torch.float64) for t in unit_factors(hw, "qk"))
    p = torch.from_numpy(spec.pass_dims())
    if not len(p):  # M − M_k = X0[:, D] S0[:, D]ᵀ over the dropped dimensions D: from the Grams ‖M‖ needs anyway
        both = (X0.mT @ X0) * (S0.mT @ S0)
        dd = drop.to(torch.float64)
        err = (both * dd[:, :, None] * dd[:, None, :]).sum((-2, -1)).clamp_min(0).sqrt()
        X1, S1 = _zeroed(hw, drop)
        return UnitCut(X1, S1, 2 * keep.sum(-1), sv, err, both.sum((-2, -1)).clamp_min(0).sqrt()), keep, None
    wq, wk = wq0 * ~drop[:, None, :, None], wk0 * ~drop[..., None]
    X, S = _pass_factors(wq, wk, p)
    part = cut_unit(X, S, (top & (tag < 0)).sum(-1), "qk")
    Hkv, g, _, d = wq.shape
    wq[:, :, p, :] = part.X.reshape(Hkv, g, d, len(p)).mT
    wk[:, p, :] = part.S.mT
    X1, S1 = wq.mT.reshape(X0.shape), wk.mT
    err, norm = diff_norm(X0, S0, X1, S1), diff_norm(X0, S0)
    return UnitCut(X1, S1, 2 * keep.sum(-1) + part.k, sv, err, norm), keep, part


def _zeroed(hw: HeadWeights, drop: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The QK factors ``X (Hkv, g·d, dh)``, ``S (Hkv, d, dh)`` with the ``drop`` dimensions
    ``(Hkv, dh)`` zeroed, in the stored dtype."""
    Hkv, dh, d = hw.wk.shape
    kept = ~drop
    wq = hw.wq * kept.repeat_interleave(hw.wq.shape[0] // Hkv, 0)[..., None]
    return wq.reshape(Hkv, -1, dh, d).mT.reshape(Hkv, -1, dh), (hw.wk * kept[..., None]).mT


def biases(hw: HeadWeights, spec: RotarySpec, keep: torch.Tensor, part: UnitCut | None,
           bq: torch.Tensor | None, bk: torch.Tensor | None, qk: tuple[torch.Tensor, torch.Tensor] | None = None
           ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Query and key biases after :func:`cut`: zero on the dropped bands' dimensions (the band's
    whole contribution goes, bias terms included), refitted on the non-rotary part as in
    :func:`headrank.compress.cut.cut_biases`."""
    Hkv, dh, _ = hw.wk.shape
    a, b = (torch.from_numpy(i) for i in spec.pairs())
    drop = torch.zeros(Hkv, dh, dtype=torch.bool)
    drop[:, a], drop[:, b] = ~keep, ~keep
    p = torch.from_numpy(spec.pass_dims())
    wq, wk = qk if qk is not None else groups(hw)
    out = []
    for bias, kv_side in ((bq, False), (bk, True)):
        if bias is None:
            out.append(None)
            continue
        x = bias.to(torch.float64).reshape(Hkv, -1, dh).clone()  # (Hkv, g or 1, dh)
        x = x * ~drop[:, None, :]
        if part is not None:
            X, S = _pass_factors(wq, wk, p)
            if kv_side:  # term X b_k, refitted on X'
                x[:, 0, p] = (torch.linalg.pinv(part.X) @ (X @ x[:, 0, p][..., None]))[..., 0]
            else:  # term S b_q,h, refitted on S'
                x[:, :, p] = (torch.linalg.pinv(part.S)[:, None] @ (S[:, None] @ x[:, :, p][..., None]))[..., 0]
        out.append(x.reshape(bias.shape))
    return out[0], out[1]
