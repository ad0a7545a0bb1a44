"""The factored checkpoint's tensors straight from the cut factors' kept columns.

:func:`.factored.factor_layer` takes a layer's zero-padded tensors and drops every row (q, k,
v) or column (o) that is exactly zero after the cut, weight and bias. Here the same tensors and
manifest entries come from the cut factors themselves, ``X'`` ``(Hkv, g·d, w)`` and ``S'``
``(Hkv, d, w)`` with ``w ≤ dh`` columns (those beyond are zero): a dimension is kept where its
column of the factor, cast to the stored dtype, or its bias holds a non-zero, the test
factor_layer makes on the padded tensor, so the result is the same bit for bit (tested), without
building the padded tensors, joining them and scanning them again.
"""

from __future__ import annotations

from typing import Any

import torch

from headrank.compress.factored import ranges
from headrank.io.layouts import Dims

# (role of the weight, product, rows or columns kept, factor: X per query head or S per kv head),
# in factor_layer's order (factored.json's entries keep it)
_ROLES = (("v", "ov", "rows", "S"), ("o", "ov", "cols", "X"), ("q", "qk", "rows", "X"), ("k", "qk", "rows", "S"))


def kept_tensors(names: dict[str, str], raw: dict[str, torch.Tensor], cuts: dict[str, Any],
                 biases: dict[str, torch.Tensor], dims: Dims) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """One layer (``separate`` split) of the factored checkpoint: the cut projections' kept
    rows or columns and their biases (every other bias in ``biases`` as given), by full name
    in the stored dtypes, and factored.json's entries. ``cuts``: product → the cut's factors."""
    out, entries = dict(biases), {}
    dh = dims.head_dim
    for role, product, mode, side in _ROLES:
        if product not in cuts:
            continue
        w = names[role]
        b = w[: -len(".weight")] + ".bias"
        f = getattr(cuts[product], side).to(raw[role].dtype)
        F = f.reshape(-1, dims.d, f.shape[-1])  # (heads of this role, d, w): column j of head n is its dim j
        live = F.abs().amax(1) != 0  # a non-zero in the column (NaN too), as factor_layer's (t != 0).any()
        if F.shape[-1] < dh:
            live = torch.nn.functional.pad(live, (0, dh - F.shape[-1]))
        bias = out.get(b) if mode == "rows" else None
        if bias is not None:
            live |= bias.reshape(live.shape) != 0
        if bool(live.all()):
            out[w] = F.mT.reshape(-1, dims.d) if mode == "rows" else F.permute(1, 0, 2).reshape(dims.d, -1)
            continue
        idx = live.reshape(-1).nonzero()[:, 0]
        head, dim = idx // dh, idx % dh
        if dim.numel() and int(dim.max()) >= F.shape[-1]:  # a dimension kept for its bias alone
            F = torch.nn.functional.pad(F, (0, dh - F.shape[-1]))
        out[w] = F.permute(0, 2, 1)[head, dim] if mode == "rows" else _columns(F, live, head, dim)
        if bias is not None:
            out[b] = bias.index_select(0, idx)
        entries[w[: -len(".weight")]] = {"keep": mode, "features": int(live.numel()), "index": ranges(idx),
                                         "role": role}  # the latent KV cache pairs v with o by it
    return out, entries


def _columns(F: torch.Tensor, live: torch.Tensor, head: torch.Tensor, dim: torch.Tensor) -> torch.Tensor:
    """The kept columns ``(d, Σ)`` of the heads' ``F`` ``(H, d, w)``: where each head keeps its
    first ``c_h`` dimensions (the usual case: the first k), one copy of the slices; else a gather."""
    c = live.sum(1)
    if bool((live == (torch.arange(live.shape[1]) < c[:, None])).all()) and int(c.max()) <= F.shape[-1]:
        return torch.cat([F[h, :, :n] for h, n in enumerate(c.tolist())], 1)
    return F.permute(1, 0, 2)[:, head, dim]
