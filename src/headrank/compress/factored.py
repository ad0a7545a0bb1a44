"""The factored checkpoint (``compress --format factored``) and :func:`load_compressed`.

A cut unit of rank k keeps, per head, k of the head's ``dh`` latent dimensions (the balanced
factors ``U_k Σ_k^½`` and ``V_k Σ_k^½`` of :mod:`.cut`; rotary QK: the kept bands' dimensions);
the others are exactly zero after the cut. The factored checkpoint stores only the dimensions
that are not, under the original tensor names:

- OV: ``v_proj.weight`` keeps the rows of the kept value dimensions (``Σ_u k_u × d``) and
  ``o_proj.weight`` the matching columns of every query head (``d × Σ_h k_u(h)``);
- QK: ``q_proj.weight`` and ``k_proj.weight`` keep the rows of the kept query and key
  dimensions (with their biases).

A row (column) is dropped only where it is exactly zero, weight and bias, so the stored function
is the cut one exactly. ``factored.json`` names each shrunk module, whether its rows (a projection
into the heads) or its columns (the output projection) were kept, and which ones (as
``[start, stop)`` runs). :func:`load_compressed` builds the Hugging Face model from
``config.json`` (no ``trust_remote_code``), replaces those projections by :class:`LatentLinear` /
:class:`LatentOutput` (a Linear over the kept dimensions, scattered into or gathered from the
heads' layout), and loads the tensors. Attention itself, its scaling ``1/√dh``, the rotation and
the KV cache are the library's own, so the function is the dense output's to round-off; the
cache still holds ``dh`` numbers per head (the dropped ones are zero): the KV saving of a latent
cache is reported, not realised (docs/compress.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from headrank.compress import factored_check as check
from headrank.compress.factored_check import FORMAT, MANIFEST, STEM
from headrank.errors import HeadRankError
from headrank.util.args import checked

__all__ = ["FORMAT", "MANIFEST", "STEM", "LatentLinear", "LatentOutput", "factor_layer", "load_compressed", "ranges"]
#: the weight files' stem (:data:`STEM`) is not ``model``, so that transformers' from_pretrained,
#: which would re-initialise every shrunk tensor with a warning, finds no weights and says so instead


def ranges(idx: torch.Tensor) -> list[list[int]]:
    """Sorted indices as ``[start, stop)`` runs (the manifest's compact form)."""
    out: list[list[int]] = []
    for i in idx.tolist():
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return out


def from_ranges(runs: list[list[int]]) -> torch.Tensor:
    parts = [torch.arange(int(a), int(b)) for a, b in runs]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


# (role of the weight, product it belongs to, rows or columns kept)
_ROLES = (("v", "ov", "rows"), ("o", "ov", "cols"), ("q", "qk", "rows"), ("k", "qk", "rows"))


def factor_layer(tensors: dict[str, torch.Tensor], names: dict[str, str], products: tuple[str, ...]
                 ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Drop the cut dimensions of one layer's tensors (``separate`` split: q, k, v, o Linear
    weights and their biases): the rows of q, k, v (weight and bias both zero) and the columns of
    o that are exactly zero after the cut, so the written function is the cut one exactly.
    Returns the tensors and the manifest's entries."""
    out, entries = dict(tensors), {}
    for role, product, mode in _ROLES:
        if product not in products:
            continue
        w = names[role]
        b = w[: -len(".weight")] + ".bias"
        t = tensors[w]
        live = (t != 0).any(0) if mode == "cols" else (t != 0).any(1)
        if mode == "rows" and b in tensors:
            live |= tensors[b] != 0
        if bool(live.all()):
            continue
        idx = live.nonzero()[:, 0]
        out[w] = t.index_select(1 if mode == "cols" else 0, idx).contiguous()
        if mode == "rows" and b in tensors:
            out[b] = tensors[b].index_select(0, idx).contiguous()
        entries[w[: -len(".weight")]] = {"keep": mode, "features": int(live.numel()), "index": ranges(idx),
                                         "role": role}
    return out, entries


class LatentLinear(torch.nn.Module):
    """A projection into the heads that computes only the kept dimensions (a Linear of
    ``len(index)`` outputs) and scatters them into ``out_features`` zeros."""

    def __init__(self, in_features: int, index: torch.Tensor, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(len(index), in_features))
        self.bias = torch.nn.Parameter(torch.empty(len(index))) if bias else None
        self.register_buffer("index", index, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, self.weight, self.bias)
        out = y.new_zeros(*y.shape[:-1], self.out_features)
        return out.index_copy_(-1, self.index, y)

    def dense_parameters(self) -> dict[str, torch.Tensor]:
        """The uncut-shape weight and bias (zero rows where the cut dropped them): what
        :class:`headrank.io.live.LiveCheckpoint` reads, the dense output's tensors exactly."""
        w = self.weight.detach()
        out = {"weight": w.new_zeros(self.out_features, self.in_features).index_copy_(0, self.index, w)}
        if self.bias is not None:
            out["bias"] = w.new_zeros(self.out_features).index_copy_(0, self.index, self.bias.detach())
        return out


class LatentOutput(torch.nn.Module):
    """The output projection reading only the kept dimensions of the heads' outputs (an input
    already holding only those, the latent attention's output, is read as it is)."""

    def __init__(self, index: torch.Tensor, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, len(index)))
        self.bias = torch.nn.Parameter(torch.empty(out_features)) if bias else None
        self.register_buffer("index", index, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.weight.shape[1]:
            x = x.index_select(-1, self.index)
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def dense_parameters(self) -> dict[str, torch.Tensor]:
        """The uncut-shape weight (zero columns where the cut dropped them), as :class:`LatentLinear`'s."""
        w = self.weight.detach()
        return {"weight": w.new_zeros(self.out_features, self.in_features).index_copy_(1, self.index, w)}


def _latent(old: torch.nn.Module, spec: dict[str, Any], where: Path) -> torch.nn.Module:
    if not isinstance(old, torch.nn.Linear):
        raise HeadRankError(f"{where / MANIFEST}: {type(old).__name__} is not a Linear layer")
    have = old.out_features if spec["keep"] == "rows" else old.in_features
    if spec["features"] != have:
        raise HeadRankError(f"{where / MANIFEST}: an entry of {spec['features']:,} features for a projection of "
                            f"{have:,} (config.json)")
    idx = from_ranges(spec["index"])
    has_bias = old.bias is not None
    if spec["keep"] == "rows":
        new = LatentLinear(old.in_features, idx, old.out_features, has_bias)
    else:
        new = LatentOutput(idx, old.in_features, old.out_features, has_bias)
    return new.to(device=old.weight.device, dtype=old.weight.dtype)


def _resolve(name: str, modules: dict[str, torch.nn.Module], prefix: str, where: Path) -> str:
    """A checkpoint tensor's module name in the model (Hugging Face's base-model prefix added or dropped)."""
    for cand in (name, name.removeprefix(prefix + "."), f"{prefix}.{name}"):
        if cand in modules:
            return cand
    raise HeadRankError(f"{where / MANIFEST}: the model (config.json) has no module {name[:80]!r}")


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the weight files, each header checked as safetensors checks it and each
    tensor read with ``pread`` from a file that must not change meanwhile (:mod:`headrank.io.stfile`)."""
    from headrank.io.stfile import SafetensorsFile

    sd: dict[str, torch.Tensor] = {}
    for f in check.weight_files(path):
        st = SafetensorsFile(f)
        try:
            sd.update({k: st.get_tensor(k) for k in st.keys()})
        finally:
            st.close()
    return sd


def _build(path: Path, dtype: torch.dtype | None, attn_implementation: str | None):
    """The model of config.json on the meta device (its sizes bounded first; no remote code)."""
    from headrank.models.opener import empty_model

    check.config(path, torch.empty((), dtype=dtype or torch.float32).element_size())
    return empty_model(path, dtype=dtype, attn_implementation=attn_implementation, what="load_compressed")


@checked
def load_compressed(path: str | Path, *, dtype: torch.dtype | None = None, attn_implementation: str | None = None,
                    latent_kv: bool = False):
    """The Hugging Face model of a factored ``compress`` output, with its cut projections
    replaced by :class:`LatentLinear` / :class:`LatentOutput` (``dtype``: default the stored one).

    The whole directory is checked before the model is built (:mod:`.factored_check`): a hostile
    or damaged output is one :class:`~headrank.errors.HeadRankError` line.

    ``latent_kv``: attention on the kept key and value dimensions only, and a KV cache that holds
    only those (:mod:`.latent`; ``generate`` with ``latent_cache(model)``); where the architecture
    does not allow it the model is the plain one and ``model.headrank_latent_kv`` says why."""
    path = check.arguments(path, dtype, attn_implementation, latent_kv)
    manifest = check.manifest(path)
    info = check.compress_info(path)
    sd = _state_dict(path)
    dtype = dtype or next((t.dtype for t in sd.values() if t.is_floating_point()), torch.float32)
    model = _build(path, dtype, attn_implementation)
    modules = dict(model.named_modules())
    prefix = getattr(model, "base_model_prefix", "")
    latent = {}
    for name, spec in manifest.items():
        full = _resolve(name, modules, prefix, path)
        check.in_attention(model, full, path)
        parent, _, child = full.rpartition(".")
        latent[full] = _latent(modules[full], spec, path)
        setattr(model.get_submodule(parent) if parent else model, child, latent[full])
    index = {k: from_ranges(spec["index"]) for k, spec in zip(latent, manifest.values(), strict=True)}
    check.shapes(model, sd, prefix, path)
    model.to_empty(device="cpu")
    model.init_weights()  # buffers (rotary frequencies, position ids) and whatever the file lacks
    for k, m in latent.items():
        m.index = index[k]
    _load(model, sd, prefix)
    del sd
    from headrank.util.memory import trim_heap

    trim_heap()  # the random initialisation's buffers go back to the system
    model.eval()
    if latent_kv:
        from headrank.compress.latent import STATUS, enable

        names = {k: {**spec, "kept": index[k]} for k, spec in zip(latent, manifest.values(), strict=True)}
        setattr(model, STATUS, enable(model, names, info))
    return model


def _load(model: torch.nn.Module, sd: dict[str, torch.Tensor], prefix: str) -> None:
    keys = set(model.state_dict())
    own = {}
    for k, t in sd.items():
        for cand in (k, k.removeprefix(prefix + "."), f"{prefix}.{k}"):
            if cand in keys:
                own[cand] = t
                break
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    own = {k: (t if t.dtype == dtypes[k] else t.to(dtypes[k])) for k, t in own.items()}
    missing, _ = model.load_state_dict(own, strict=False, assign=True)  # the file's tensors, not a copy
    tied = _tied_names(model)
    left = [k for k in missing if k not in tied]
    if left:
        raise HeadRankError(f"factored checkpoint lacks {len(left)} tensors the model needs ({left[0]}, ...)")
    model.tie_weights()


def _tied_names(model: torch.nn.Module) -> set[str]:
    """Parameter names sharing storage with an earlier parameter (tied embeddings)."""
    seen, tied = {}, set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    if getattr(model.config, "tie_word_embeddings", False) and hasattr(model, "get_output_embeddings"):
        out = model.get_output_embeddings()
        if out is not None:
            tied |= {n for n, p in model.named_parameters(remove_duplicate=False) if p is out.weight}
    return tied
