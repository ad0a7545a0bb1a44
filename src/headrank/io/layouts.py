"""Declarative layout table: model_type → attention tensors → per-head factors.

Conventions (docs/methods/products.md), PyTorch ``nn.Linear`` layout ``weight = (out, in)``:

- ``W_Q,h, W_K,h, W_V,h ∈ R^{dh×d}`` are head h's rows of the projection weights;
- ``P_h ∈ R^{d×dh}`` is head h's column block of the output projection ``W_O`` (d × H·dh);
- QK product ``W_K,hᵀ W_Q,h`` = ``A Bᵀ`` with ``A = W_K,hᵀ``, ``B = W_Q,hᵀ``;
- OV product ``P_h W_V,h`` = ``A Bᵀ`` with ``A = P_h``, ``B = W_V,hᵀ``;
- grouped-query attention: query head h uses kv head ``h // (H // Hkv)``.

Each row of :data:`LAYOUTS` names, for a family of ``model_type``, the per-layer tensor names
(relative to a prefix found in the checkpoint, e.g. ``model.`` in a ``*ForCausalLM`` file), how
to read the sizes from the config, and how raw tensors split into heads (a key of
:data:`SPLITS`); where layer surgery on a live model is supported (``headrank collapse``), the
row's :class:`Modules` names the submodules of a layer (layer list, attention, norms, MLP).
Adding an architecture is adding a row (and its layout test); nothing else here knows about
models. A user's own layout comes from a small TOML file
(:func:`headrank.io.layout_toml.layout_from_toml`).

Where the splits come from (the fused cases hide bugs in peers' converters):

- ``separate``: q, k, v, o Linear weights, heads contiguous along ``out``.
- ``fused``: one ``qkv`` Linear, rows ``[q (H·dh) | k (Hkv·dh) | v (Hkv·dh)]`` (Phi-3; Falcon
  multi-query with Hkv = 1).
- ``conv1d_fused``: GPT-2 ``Conv1D`` weights are ``(in, out)``: ``c_attn`` is ``(d, 3d)`` with
  ``[q | k | v]`` along ``out``; ``c_proj`` is ``(H·dh, d)``.
- ``fused_per_head``: one ``qkv`` Linear whose rows are grouped per head, ``(H, 3, dh)``: q, k, v
  of head 0, then head 1, … (GPT-NeoX/Pythia, BLOOM, Falcon without new_decoder_architecture).
- ``fused_per_kv_group``: one ``qkv`` Linear grouped per kv head, ``(Hkv, H/Hkv + 2, dh)``: the
  group's query heads, then its k, then its v (Falcon new_decoder_architecture).

The last two were called ``interleaved`` and ``grouped``; layout files may still use those names
(:data:`SPLIT_ALIASES`, with a warning): "grouped" read as grouped-query attention, which is the
``separate`` split with ``n_kv_heads`` < ``n_heads``.

A row may name the norm that precedes attention (:class:`NormSpec`) so that its gain can be
folded into W_Q, W_K, W_V (``fold_norm``, TransformerLens' ``fold_ln``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from headrank.errors import HeadRankError
from headrank.io import convention as conv
from headrank.io.prefetch import LayerStream
from headrank.io.tensor_source import BaseCheckpoint
from headrank.io.validate import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_WIDTH,
    as_int,
    check_dtype,
    check_fits,
)

if TYPE_CHECKING:  # the weights are torch tensors or numpy arrays (Checkpoint(arrays="numpy")): both work here
    import torch

    from headrank.core.product import Product


@dataclass(frozen=True)
class Dims:
    n_layers: int
    d: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    #: multi-head latent attention (``mla`` split): (qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
    #: query input width: q_lora_rank or d, kv_lora_rank); head_dim is then qk_nope_head_dim
    mla: tuple[int, int, int, int, int] | None = None

    def __post_init__(self):
        for name, hi in (("n_layers", MAX_LAYERS), ("d", MAX_WIDTH), ("n_heads", MAX_HEADS),
                         ("n_kv_heads", MAX_HEADS), ("head_dim", MAX_HEAD_DIM)):
            as_int(getattr(self, name), name, "", lo=1, hi=hi)
        if self.n_heads % self.n_kv_heads:
            raise HeadRankError(f"{self.n_heads} query heads do not divide into {self.n_kv_heads} kv heads")


@dataclass(frozen=True)
class HeadWeights:
    """One layer's attention weights split per head (in the stored dtype), torch tensors or numpy
    arrays (a checkpoint read with ``arrays="numpy"``; bfloat16 then as its exact float32)."""

    wq: torch.Tensor  # (H, dh, d)
    wk: torch.Tensor  # (Hkv, dh, d)
    wv: torch.Tensor  # (Hkv, dh, d)
    p: torch.Tensor  # (H, d, dh): column blocks of W_O
    _roots: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _errors: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def roots(self) -> dict[str, Any]:
        """Roots of the factors W_Q,hᵀ (``q``), W_Kᵀ, W_Vᵀ (``k``, ``v``, per kv head), P_h (``p``),
        formed once in one pool and cached (:func:`headrank.core.linalg.factor_roots`)."""
        if not self._roots:
            from headrank.core.linalg import factor_roots

            roots, errors = factor_roots(self.wq.mT, self.wk.mT, self.wv.mT, self.p, errors=True)
            self._roots.update(zip("qkvp", roots, strict=True))
            self._errors.update(zip("qkvp", errors, strict=True))
        return self._roots

    def qk(self) -> Product:
        """The QK products W_K,hᵀ W_Q,h of every query head (a :class:`headrank.core.product.Product`)."""
        return self._product(self.qk_factors(), "k", "q")

    def ov(self) -> Product:
        """The OV products P_h W_V,h of every query head (a :class:`headrank.core.product.Product`)."""
        return self._product(self.ov_factors(), "p", "v")

    def _product(self, factors: tuple[Any, Any], a: str, b: str) -> Product:
        from headrank.core.product import Product

        r, e, kv = self.roots(), self._errors, lambda k, x: self.kv_for_query_heads(x) if k in "kv" else x
        return Product(*factors, roots=(kv(a, r[a]), kv(b, r[b])), errors=(kv(a, e[a]), kv(b, e[b])))

    @property
    def group(self) -> int:
        return self.wq.shape[0] // self.wk.shape[0]

    def kv_for_query_heads(self, w: torch.Tensor) -> torch.Tensor:
        """Repeat kv-head tensors so index h is the kv head used by query head h."""
        if self.group == 1:
            return w
        if hasattr(w, "repeat_interleave"):
            return w.repeat_interleave(self.group, dim=0)
        import numpy as np

        return np.repeat(w, self.group, axis=0)

    def qk_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B), each (H, d, dh), with ``A Bᵀ = W_K,hᵀ W_Q,h``."""
        return self.kv_for_query_heads(self.wk).mT, self.wq.mT

    def ov_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, B), each (H, d, dh), with ``A Bᵀ = P_h W_V,h``."""
        return self.p, self.kv_for_query_heads(self.wv).mT


def _float64(x: Any) -> Any:
    """``x`` upcast to float64, a torch tensor or a numpy array alike."""
    if hasattr(x, "to"):
        import torch

        return x.to(torch.float64)
    from headrank.util.bf16 import as_float

    return as_float(x)  # bfloat16 bits (a numpy read) converted exactly


def _as_numpy(x: Any) -> Any:
    import numpy as np

    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


class _Shape(Exception):
    def __init__(self, role: str, got: tuple[int, ...], want: tuple[int, ...]):
        self.role, self.got, self.want = role, got, want


def _expect(raw: dict[str, torch.Tensor], role: str, *shape: int) -> torch.Tensor:
    t = raw[role]
    if tuple(t.shape) != shape:
        raise _Shape(role, tuple(t.shape), shape)
    return t


def _heads_out(o: torch.Tensor, dims: Dims) -> torch.Tensor:
    """W_O (d, H·dh) → P (H, d, dh)."""
    w = o.reshape(dims.d, dims.n_heads, dims.head_dim)
    return w.permute(1, 0, 2) if hasattr(w, "permute") else w.transpose(1, 0, 2)


def _split_separate(raw, dims: Dims) -> HeadWeights:
    H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
    return HeadWeights(
        wq=_expect(raw, "q", H * dh, d).reshape(H, dh, d),
        wk=_expect(raw, "k", Hkv * dh, d).reshape(Hkv, dh, d),
        wv=_expect(raw, "v", Hkv * dh, d).reshape(Hkv, dh, d),
        p=_heads_out(_expect(raw, "o", d, H * dh), dims),
    )


def _fused_rows(qkv: torch.Tensor, o: torch.Tensor, dims: Dims) -> HeadWeights:
    H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
    q, k, v = qkv[:H * dh], qkv[H * dh:(H + Hkv) * dh], qkv[(H + Hkv) * dh:]
    return HeadWeights(q.reshape(H, dh, d), k.reshape(Hkv, dh, d), v.reshape(Hkv, dh, d), _heads_out(o, dims))


def _split_fused(raw, dims: Dims) -> HeadWeights:
    H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
    return _fused_rows(_expect(raw, "qkv", (H + 2 * Hkv) * dh, d), _expect(raw, "o", d, H * dh), dims)


def _split_conv1d_fused(raw, dims: Dims) -> HeadWeights:
    H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
    qkv = _expect(raw, "qkv", d, (H + 2 * Hkv) * dh).T  # Conv1D stores (in, out)
    o = _expect(raw, "o", H * dh, d).T
    return _fused_rows(qkv, o, dims)


def _split_fused_per_head(raw, dims: Dims) -> HeadWeights:
    H, dh, d = dims.n_heads, dims.head_dim, dims.d
    if dims.n_kv_heads != H:
        raise HeadRankError("a fused_per_head QKV layout needs n_kv_heads == n_heads")
    w = _expect(raw, "qkv", H * 3 * dh, d).reshape(H, 3, dh, d)
    return HeadWeights(w[:, 0], w[:, 1], w[:, 2], _heads_out(_expect(raw, "o", d, H * dh), dims))


def _split_fused_per_kv_group(raw, dims: Dims) -> HeadWeights:
    H, Hkv, dh, d = dims.n_heads, dims.n_kv_heads, dims.head_dim, dims.d
    g = H // Hkv
    w = _expect(raw, "qkv", Hkv * (g + 2) * dh, d).reshape(Hkv, g + 2, dh, d)
    return HeadWeights(w[:, :g].reshape(H, dh, d), w[:, g], w[:, g + 1],
                       _heads_out(_expect(raw, "o", d, H * dh), dims))


def _split_mla(raw, dims: Dims) -> HeadWeights:
    """Multi-head latent attention (DeepSeek-V2/V3), in latent space (docs/mla.md): W_Q,h = head h's
    non-rotary rows of ``q_b_proj`` (or ``q_proj``), W_K,h and W_V,h = head h's key and value rows
    of ``kv_b_proj``, P_h = head h's block of ``o_proj`` (d × v_head_dim)."""
    assert dims.mla is not None
    nope, rope, v, q_in, kv = dims.mla
    H, d = dims.n_heads, dims.d
    q = _expect(raw, "q", H * (nope + rope), q_in).reshape(H, nope + rope, q_in)
    kvb = _expect(raw, "kv_b", H * (nope + v), kv).reshape(H, nope + v, kv)
    o = _expect(raw, "o", d, H * v).reshape(d, H, v)
    o = o.permute(1, 0, 2) if hasattr(o, "permute") else o.transpose(1, 0, 2)  # torch or numpy (bf16 bits too)
    return HeadWeights(q[:, :nope], kvb[:, :nope], kvb[:, nope:], o)


SPLITS: dict[str, Callable[[dict[str, torch.Tensor], Dims], HeadWeights]] = {
    "separate": _split_separate,
    "fused": _split_fused,
    "conv1d_fused": _split_conv1d_fused,
    "fused_per_head": _split_fused_per_head,
    "fused_per_kv_group": _split_fused_per_kv_group,
    "mla": _split_mla,
}
SPLIT_ROLES = {"separate": ("q", "k", "v", "o"), "fused": ("qkv", "o"), "conv1d_fused": ("qkv", "o"),
               "fused_per_head": ("qkv", "o"), "fused_per_kv_group": ("qkv", "o"),
               "mla": ("q", "kv_b", "o")}
# old names still accepted in layout files (with a warning)
SPLIT_ALIASES = {"interleaved": "fused_per_head", "grouped": "fused_per_kv_group"}


# -- sizes from configs ----------------------------------------------------------------------
def _get(c: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if c.get(k) is not None:
            return c[k]
    if default is not None:
        return default
    raise KeyError(" or ".join(keys))


_LIMITS = {"layers": MAX_LAYERS, "width": MAX_WIDTH, "heads": MAX_HEADS, "head_dim": MAX_HEAD_DIM}


def _size(c: dict[str, Any], keys: tuple[str, ...], kind: str, default: Any = None) -> int:
    """The first present of ``keys`` as a checked size (an integer in range, not a bool)."""
    name = next((k for k in keys if c.get(k) is not None), keys[0])
    return as_int(_get(c, *keys, default=default), name, "", lo=1, hi=_LIMITS[kind])


def _dims(c: dict[str, Any], layers: tuple[str, ...], width: tuple[str, ...], heads: tuple[str, ...],
          kv: tuple[str, ...] = ()) -> Dims:
    d, H = _size(c, width, "width"), _size(c, heads, "heads")
    Hkv = _size(c, kv, "heads", default=H) if kv else H
    dh = _size(c, ("head_dim",), "head_dim") if c.get("head_dim") is not None else max(d // H, 1)
    return Dims(_size(c, layers, "layers"), d, H, Hkv, dh)


def _hf_dims(c):  # bert, roberta, vit, gpt_neox, opt, phi, llama family
    return _dims(c, ("num_hidden_layers",), ("hidden_size",), ("num_attention_heads",), ("num_key_value_heads",))


def _gpt2_dims(c):
    return _dims(c, ("n_layer",), ("n_embd",), ("n_head",))


def _distilbert_dims(c):
    return _dims(c, ("n_layers",), ("dim",), ("n_heads",))


def _bloom_dims(c):
    return _dims(c, ("n_layer", "num_hidden_layers"), ("hidden_size", "n_embed"), ("n_head", "num_attention_heads"))


def _falcon_dims(c):
    base = _dims(c, ("num_hidden_layers", "n_layer"), ("hidden_size",), ("num_attention_heads", "n_head"))
    if c.get("new_decoder_architecture"):
        kv = _size(c, ("num_kv_heads", "n_head_kv"), "heads", default=base.n_heads)
    elif c.get("multi_query", True):
        kv = 1
    else:
        kv = base.n_heads
    return Dims(base.n_layers, base.d, base.n_heads, kv, base.head_dim)


def _falcon_split(c):
    if c.get("new_decoder_architecture"):
        return "fused_per_kv_group"
    return "fused" if c.get("multi_query", True) else "fused_per_head"


def _headrank_dims(c):
    H = _size(c, ("n_heads",), "heads")
    return Dims(_size(c, ("n_layers",), "layers"), _size(c, ("d_model",), "width"), H,
                _size(c, ("n_kv_heads",), "heads") if c.get("n_kv_heads") else H,
                _size(c, ("head_dim",), "head_dim"))


# -- the table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Modules:
    """Dotted submodule paths of a live model (``AutoModel``, no task head) that layer surgery
    needs to run one layer from its own parts.

    ``layers``: the layer list; ``placement``: ``post`` (BERT-style ``LN(x + f(x))``, the norm
    inside each sublayer's output module) or ``pre`` (``x + f(N(x))``); ``attn``: the attention
    module inside a layer, called with the unmodified model's own arguments; ``final_norm``: the
    model's norm after the last layer (pre-norm), if any. Pre-norm: ``attn_norm``, ``mlp_norm``,
    ``mlp`` inside a layer. Post-norm: ``attn_out`` (dense, dropout, LayerNorm after attention),
    ``mlp`` (the expansion) and ``mlp_out`` (dense, dropout, LayerNorm after the MLP).
    """

    layers: str
    placement: str
    attn: str
    final_norm: str | None = None
    attn_norm: str = ""
    mlp_norm: str = ""
    mlp: str = ""
    attn_out: str = ""
    mlp_out: str = ""

    def __post_init__(self) -> None:
        if self.placement not in ("post", "pre"):
            raise ValueError(f"placement must be post or pre, got {self.placement!r}")

    def attention(self, i: int) -> str:
        """The dotted path of layer ``i``'s attention module from the model's root."""
        return f"{self.layers}.{i}.{self.attn}"


_BERT_MODULES = Modules("encoder.layer", "post", "attention.self", attn_out="attention.output",
                        mlp="intermediate", mlp_out="output")
_GPT2_MODULES = Modules("h", "pre", "attn", "ln_f", attn_norm="ln_1", mlp_norm="ln_2", mlp="mlp")
_LLAMA_MODULES = Modules("layers", "pre", "self_attn", "norm", attn_norm="input_layernorm",
                         mlp_norm="post_attention_layernorm", mlp="mlp")


@dataclass(frozen=True)
class NormSpec:
    """The norm in front of a layer's attention: its gain tensor (``{i}`` = layer), its kind
    (``layernorm`` or ``rmsnorm``) and an offset added to the stored gain (Gemma's RMSNorm
    multiplies by ``1 + w``). Other names for the same tensor may follow in ``alternatives``."""

    name: str
    kind: str = "rmsnorm"
    offset: float = 0.0
    alternatives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm kind must be layernorm or rmsnorm, got {self.kind!r}")


@dataclass(frozen=True)
class Layout:
    """How one family of model_type stores its attention.

    ``tensors`` maps roles (``q, k, v, o`` or ``qkv, o``) to names with ``{i}`` for the layer;
    ``split`` is a key of SPLITS, or a function of the config giving one.
    ``position`` (of the config) is ``absolute``, ``rotary``, ``alibi`` or ``none``.
    ``aliases`` are other name sets for the same roles (a library renamed its modules: a live
    transformers-5 ViT has ``layers.{i}.attention.q_proj`` where saved checkpoints keep
    ``encoder.layer.{i}.attention.attention.query``); the reader takes the first set present.
    ``modules``: the live model's submodule paths for layer surgery (None: not supported).
    ``norm``: the pre-attention norm whose gain ``fold_norm`` folds in (None: not known, e.g.
    post-norm models, where the norm follows the sublayer).
    """

    model_types: tuple[str, ...]
    tensors: dict[str, str]
    dims: Callable[[dict[str, Any]], Dims]
    split: str | Callable[[dict[str, Any]], str] = "separate"
    biases: tuple[str, ...] = ()
    position: Callable[[dict[str, Any]], str] = field(default=lambda c: "absolute")
    qk_norm: Callable[[dict[str, Any]], bool] = field(default=lambda c: False)
    aliases: tuple[dict[str, str], ...] = ()
    modules: Modules | None = None
    norm: Callable[[dict[str, Any]], NormSpec | None] = field(default=lambda c: None)
    present_layers: bool = False  # generated rows: only the layers whose tensors exist (hybrids)
    #: which attention this is: ``self`` (a decoder-only or encoder-only model), or in an
    #: encoder-decoder ``encoder``, ``decoder`` (self-attention) or ``cross`` (decoder queries, encoder keys)
    attention: str = "self"
    #: an encoder-decoder: one layout per kind of attention (this row is then the first of them)
    parts: tuple[Layout, ...] = ()

    def split_for(self, config: dict[str, Any]) -> str:
        return self.split(config) if callable(self.split) else self.split

    def names(self, i: int) -> dict[str, str]:
        return {role: t.format(i=i) for role, t in self.tensors.items()}

    def with_tensors(self, tensors: dict[str, str]) -> Layout:
        """This row with another of its name sets as the main one."""
        return replace(self, tensors=tensors, biases=_bias_names(tensors), aliases=())


def _bias_names(tensors: dict[str, str]) -> tuple[str, ...]:
    return tuple(t.replace(".weight", ".bias") for t in tensors.values())


def _row(model_types, split="separate", **kw) -> Layout:
    tensors = kw.pop("tensors")
    return Layout(model_types=model_types, tensors=tensors, split=split,
                  biases=_bias_names(tensors), **kw)


def _qkvo(prefix: str, q: str, k: str, v: str, o: str) -> dict[str, str]:
    return {r: prefix + n + ".weight" for r, n in (("q", q), ("k", k), ("v", v), ("o", o))}


_ROTARY = lambda c: "rotary"  # noqa: E731
_BERT_QKVO = _qkvo("encoder.layer.{i}.attention.", "self.query", "self.key", "self.value", "output.dense")


def _bert_position(c: dict[str, Any]) -> str:
    """BERT-family position encoding as its config names it (``absolute`` unless it says
    ``relative_key`` or ``relative_key_query``)."""
    return c.get("position_embedding_type", "absolute")


_LLAMA_QKVO = _qkvo("layers.{i}.self_attn.", "q_proj", "k_proj", "v_proj", "o_proj")
_INPUT_LN = "layers.{i}.input_layernorm.weight"


def _rms_input(c: dict[str, Any]) -> NormSpec:
    """Llama-family pre-attention RMSNorm (Gemma's multiplies by 1 + w)."""
    return NormSpec(_INPUT_LN, "rmsnorm", 1.0 if str(c.get("model_type", "")).startswith("gemma") else 0.0)


#: MLA's latent norms beside its up-projections: Hugging Face's names, then llama.cpp's (GGUF)
MLA_NORMS = (("q_b_proj.weight", "q_a_layernorm.weight"), ("kv_b_proj.weight", "kv_a_layernorm.weight"),
             ("attn_q_b.weight", "attn_q_a_norm.weight"), ("attn_kv_b.weight", "attn_kv_a_norm.weight"))


def latent_norm(name: str) -> str | None:
    """The gain of the latent norm in front of MLA up-projection ``name`` (None: no latent, e.g.
    ``q_proj`` without ``q_lora_rank``)."""
    for proj, norm in MLA_NORMS:
        if name.endswith(proj):
            return name[: -len(proj)] + norm
    return None


def _const(spec: NormSpec | None) -> Callable[[dict[str, Any]], NormSpec | None]:
    return lambda c: spec


LAYOUTS: tuple[Layout, ...] = (
    _row(("bert", "roberta", "xlm-roberta", "electra"),
         tensors=_BERT_QKVO, dims=_hf_dims, position=_bert_position, modules=_BERT_MODULES),
    _row(("camembert",), tensors=_BERT_QKVO, dims=_hf_dims, position=_bert_position),
    _row(("vit", "deit"),
         tensors=_qkvo("encoder.layer.{i}.attention.", "attention.query", "attention.key", "attention.value",
                       "output.dense"),
         aliases=(_qkvo("layers.{i}.attention.", "q_proj", "k_proj", "v_proj", "o_proj"),),
         dims=_hf_dims),
    _row(("distilbert",), tensors=_qkvo("transformer.layer.{i}.attention.", "q_lin", "k_lin", "v_lin", "out_lin"),
         dims=_distilbert_dims),
    _row(("gpt2",), split="conv1d_fused",
         tensors={"qkv": "h.{i}.attn.c_attn.weight", "o": "h.{i}.attn.c_proj.weight"}, dims=_gpt2_dims,
         modules=_GPT2_MODULES, norm=_const(NormSpec("h.{i}.ln_1.weight", "layernorm"))),
    _row(("gpt_neox",), split="fused_per_head",
         tensors={"qkv": "layers.{i}.attention.query_key_value.weight", "o": "layers.{i}.attention.dense.weight"},
         dims=_hf_dims, position=_ROTARY, norm=_const(NormSpec(_INPUT_LN, "layernorm"))),
    _row(("bloom",), split="fused_per_head",
         tensors={"qkv": "h.{i}.self_attention.query_key_value.weight", "o": "h.{i}.self_attention.dense.weight"},
         dims=_bloom_dims, position=lambda c: "alibi",
         norm=_const(NormSpec("h.{i}.input_layernorm.weight", "layernorm"))),
    _row(("falcon",), split=_falcon_split,
         tensors={"qkv": "h.{i}.self_attention.query_key_value.weight", "o": "h.{i}.self_attention.dense.weight"},
         dims=_falcon_dims, position=lambda c: "alibi" if c.get("alibi") else "rotary",
         norm=_const(NormSpec("h.{i}.input_layernorm.weight", "layernorm", alternatives=("h.{i}.ln_attn.weight",)))),
    _row(("llama", "mistral", "qwen2"), tensors=_LLAMA_QKVO, dims=_hf_dims, position=_ROTARY,
         modules=_LLAMA_MODULES, norm=_rms_input),
    # Same attention tensors; layer surgery not supported (MoE MLP, extra norms around sublayers).
    _row(("mixtral", "gemma", "gemma2"), tensors=_LLAMA_QKVO, dims=_hf_dims, position=_ROTARY,
         norm=_rms_input),
    # OLMo-2 normalises after the sublayers: no norm in front of attention to fold
    _row(("qwen3", "gemma3_text", "olmo2"), tensors=_LLAMA_QKVO, dims=_hf_dims, position=_ROTARY,
         qk_norm=lambda c: True, norm=lambda c: None if c.get("model_type") == "olmo2" else _rms_input(c)),
    _row(("starcoder2",), tensors=_LLAMA_QKVO, dims=_hf_dims, position=_ROTARY,
         norm=_const(NormSpec(_INPUT_LN, "layernorm"))),
    _row(("opt",), tensors=_qkvo("decoder.layers.{i}.self_attn.", "q_proj", "k_proj", "v_proj", "out_proj"),
         dims=_hf_dims, norm=lambda c: NormSpec("decoder.layers.{i}.self_attn_layer_norm.weight", "layernorm")
         if c.get("do_layer_norm_before", True) else None),
    _row(("phi",), tensors=_qkvo("layers.{i}.self_attn.", "q_proj", "k_proj", "v_proj", "dense"),
         dims=_hf_dims, position=_ROTARY, norm=_const(NormSpec(_INPUT_LN, "layernorm"))),
    _row(("phi3",), split="fused",
         tensors={"qkv": "layers.{i}.self_attn.qkv_proj.weight", "o": "layers.{i}.self_attn.o_proj.weight"},
         dims=_hf_dims, position=_ROTARY, norm=_const(NormSpec(_INPUT_LN, "rmsnorm"))),
    # The project's own model (headrank.models.transformer).
    _row(("headrank",), tensors=_qkvo("blocks.{i}.attn.", "q", "k", "v", "o"), dims=_headrank_dims,
         position=lambda c: "absolute" if c.get("learned_positions", True) else "none",
         norm=lambda c: NormSpec("blocks.{i}.attn_norm.weight", "layernorm") if c.get("norm") == "pre" else None),
)


def layout_model_types() -> list[str]:
    """model_types that have a row in the layout table (readable without a --layout file)."""
    return sorted(t for lay in LAYOUTS for t in lay.model_types)


def surgery_model_types() -> list[str]:
    """model_types whose row names the live modules that layer surgery needs."""
    return sorted(t for lay in LAYOUTS if lay.modules is not None for t in lay.model_types)


def layout_for(config: dict[str, Any]) -> Layout:
    mt = config.get("model_type")
    for lay in LAYOUTS:
        if mt in lay.model_types:
            return lay
    found = generated_layout(config)
    if found is not None:
        return found
    raise HeadRankError(
        f"unsupported model_type {mt!r}; supported: {', '.join(layout_model_types())} "
        "(or describe the layout in a TOML file and pass `layout` FILE)"
    )


def layout_from_row(row: dict[str, Any]) -> Any:
    """A :class:`Layout` for a verified row of the generated table (:mod:`headrank.io.generated`);
    an encoder-decoder's row (``parts``) gives the first part's layout with every part in ``parts``."""
    if row.get("parts"):
        parts = tuple(replace(layout_from_row({**part, "model_type": row["model_type"]}), attention=part["attention"])
                      for part in row["parts"])
        return replace(parts[0], parts=parts)
    mods = row["modules"]
    suffix = ".weight"
    tensors = {r: m + suffix for r, m in mods.items()}
    aliases = tuple({r: m + suffix for r, m in alt.items()} for alt in row.get("alternatives", ()))
    split = row["split"]

    def dims(c: dict[str, Any]) -> Dims:
        from headrank.io.generated import row_sizes

        return Dims(**row_sizes(row, c))

    norm = row.get("norm")
    spec = NormSpec(norm["name"], norm["kind"], float(norm.get("offset", 0.0))) if isinstance(norm, dict) else None
    if split == "mla":  # the latent norms (q_a_layernorm, kv_a_layernorm), folded by AttentionReader
        spec = NormSpec(latent_norm(tensors["kv_b"]) or tensors["kv_b"], "rmsnorm")
    position = str(row.get("position", "none"))

    def where(c: dict[str, Any]) -> str:  # a config that names its position encoding (ESM: absolute or rotary)
        from headrank.io.generated import row_config

        named = row_config(row, c).get("position_embedding_type") if position == "absolute" else None
        return named if isinstance(named, str) else position

    return Layout(model_types=(row["model_type"],), tensors=tensors, dims=dims, split=split,
                  biases=_bias_names(tensors), position=where,
                  qk_norm=lambda c: bool(row.get("qk_norm")), norm=lambda c: spec,
                  present_layers=bool(row.get("sparse", True)), aliases=aliases)


def generated_layout(config: dict[str, Any]) -> Any | None:
    """The generated layout for ``config``'s model type (None: no verified row), or HeadRankError
    with the recorded reason when the type was refused."""
    from headrank.io.generated import generated_rows

    mt = config.get("model_type")
    row = generated_rows().get(str(mt)) if isinstance(mt, str) else None
    if row is None:
        return None
    if row.get("status") != "verified":
        raise HeadRankError(f"model type {mt!r} is refused: {row.get('reason', 'layout not confirmed')} "
                            "(headrank architectures lists every type)")
    return layout_from_row(row)


class _NoTensors(HeadRankError):
    """No tensor of the layout's names is in the checkpoint."""


class AttentionReader:
    """Reads one layer at a time from a checkpoint and splits it into per-head weights.

    Only the attention tensors of the requested layer are read, so peak memory is about one
    layer's attention weights whatever the model size.

    ``fold_norm``: multiply W_Q, W_K, W_V by the gain of the norm in front of attention (its
    input columns), and for a LayerNorm also centre those columns, as TransformerLens'
    ``fold_ln`` does (a LayerNorm's output has zero mean, so both leave the function unchanged);
    the folded factors come back in float64. ``origin``: what the source was (for meta.json).
    """

    def __init__(self, ckpt: BaseCheckpoint, layout: Layout | None = None, *, fold_norm: bool = False,
                 origin: dict[str, Any] | None = None):
        self.ckpt = ckpt
        self.origin: dict[str, Any] = dict(origin or {})
        self.layout = layout or layout_for(ckpt.config)
        #: an encoder-decoder: one reader per kind of attention present in the checkpoint (this
        #: reader is then the first of them); empty for a model with one kind
        self.parts: tuple[AttentionReader, ...] = ()
        if self.layout.parts:
            self._open_parts(fold_norm)
            return
        try:
            self.dims = self.layout.dims(ckpt.config)
        except HeadRankError as e:
            raise HeadRankError(f"config {ckpt.config_path}: {e}") from None
        except (KeyError, TypeError, ValueError, ArithmeticError) as e:
            raise HeadRankError(f"config {ckpt.config_path} lacks or garbles a size field: {e}") from None
        self.split = self.layout.split_for(ckpt.config)
        if self.split not in SPLITS:
            raise HeadRankError(f"config {ckpt.config_path}: unknown attention split {self.split!r}")
        self._check_memory()
        self.prefix = self._find_prefix()
        self._check_last_layer()
        self.norm: NormSpec | None = None
        self.convention = conv.convention("raw")
        if fold_norm:
            self._set_norm("`fold_norm`")

    def _set_norm(self, what: str) -> None:
        self.norm = self.layout.norm(self.ckpt.config)
        if self.norm is None:
            raise HeadRankError(f"{what}: no norm precedes attention in {self.layout.model_types[0]!r} "
                                "(post-norm, no norm, or not described in its layout)")
        self.norm_name(0)  # fails now, before any work, when the tensor is missing

    def apply_convention(self, name: str | conv.Convention | None) -> AttentionReader:
        """Read in convention ``name`` from now on (:func:`headrank.io.convention.apply`)."""
        return conv.apply(self, name)

    def _open_parts(self, fold_norm: bool) -> None:
        """One reader per kind of attention whose tensors the checkpoint holds (an encoder-decoder's
        decoder alone, e.g. a ``*ForCausalLM`` file, has no encoder part); this reader becomes the
        first of them, so a caller that reads one kind reads that one."""
        readers, absent = [], []
        for part in self.layout.parts:
            try:
                readers.append(type(self)(self.ckpt, part, fold_norm=fold_norm, origin=self.origin))
            except _NoTensors as e:
                absent.append(str(e))
        if not readers:
            raise HeadRankError(absent[0])
        self.__dict__.update({k: v for k, v in vars(readers[0]).items() if k != "parts"})
        self.parts = tuple(readers)

    def _check_memory(self) -> None:
        """One layer's attention weights in float64 (stored, split and reduced copies) must fit."""
        d = self.dims
        elems = (2 * d.n_heads + 2 * d.n_kv_heads) * d.head_dim * d.d
        check_fits(3 * 8 * elems, f"one attention layer of {d.n_heads} heads x {d.head_dim} x {d.d} "
                                  f"(config {self.ckpt.config_path})")

    def _check_last_layer(self) -> None:
        """The config's layer count must match the checkpoint: its last layer must be there.
        A generated row of a hybrid reads the layers whose attention tensors are present."""
        if self.layout.present_layers:
            self.layer_ids = [i for i in range(self.dims.n_layers)
                              if all(n in self.ckpt for n in self.tensor_names(i).values())]
            if not self.layer_ids:
                raise HeadRankError(f"checkpoint {self.ckpt.path} has no attention layer of {self.dims.n_layers} "
                                    f"named like {next(iter(self.tensor_names(0).values()))}")
            return
        self.layer_ids = list(range(self.dims.n_layers))
        last = self.dims.n_layers - 1
        missing = [n for n in self.tensor_names(last).values() if n not in self.ckpt]
        if missing:
            raise HeadRankError(f"config {self.ckpt.config_path} gives {self.dims.n_layers} layers but the checkpoint "
                                f"has no tensor {missing[0]} (layer {last})")

    def _find_prefix(self) -> str:
        keys = list(self.ckpt.keys())
        firsts = []
        for tensors in (self.layout.tensors, *self.layout.aliases):
            first = next(iter(tensors.values())).format(i=0)
            if self.layout.present_layers:  # a hybrid's first attention layer need not be layer 0
                first = next((f for f in (next(iter(tensors.values())).format(i=i) for i in range(self.dims.n_layers))
                              if any(k.endswith(f) for k in keys)), first)
            firsts.append(first)
            prefixes = sorted({k[: -len(first)] for k in keys if k.endswith(first)}, key=len)
            prefixes = [p for p in prefixes if p == "" or p.endswith(".")]
            if prefixes:
                if tensors is not self.layout.tensors:
                    self.layout = self.layout.with_tensors(tensors)
                return prefixes[0]  # shortest: the base model's own weights
        raise _NoTensors(f"checkpoint has no tensor named like {' or '.join(map(repr, firsts))}: weights do not "
                         f"match the layout of {self.layout.model_types[0]!r}")

    @property
    def position(self) -> str:
        return self.layout.position(self.ckpt.config)

    @property
    def qk_norm(self) -> bool:
        return bool(self.layout.qk_norm(self.ckpt.config))

    def tensor_names(self, i: int) -> dict[str, str]:
        return {r: self.prefix + n for r, n in self.layout.names(i).items()}

    def read_raw(self, i: int) -> tuple[dict[str, str], dict[str, Any]]:
        """Layer ``i``'s attention tensors as stored, fetched at once and their dtypes checked:
        ``(role -> name, role -> tensor)``."""
        if not 0 <= i < self.dims.n_layers:
            raise HeadRankError(f"layer {i} out of range 0..{self.dims.n_layers - 1}")
        names = self.tensor_names(i)
        many = getattr(self.ckpt, "get_many", None)  # a remote checkpoint fetches a layer's tensors at once
        raw = many(names) if many is not None else {role: self.ckpt.get(name) for role, name in names.items()}
        for role, t in raw.items():
            check_dtype(names[role], t, self.ckpt.path)
        return names, raw

    def split_raw(self, names: dict[str, str], raw: dict[str, Any]) -> HeadWeights:
        """:meth:`read_raw`'s tensors split into per-head factors (not folded); a shape the config
        does not imply is one line naming the tensor."""
        try:
            return SPLITS[self.split](raw, self.dims)
        except _Shape as e:
            raise HeadRankError(f"tensor {names[e.role]} has shape {e.got} but the config implies {e.want}") from None

    def stream(self, layers: Iterable[int], read: Callable[[int], Any] | None = None) -> LayerStream:
        """``(i, read(i))`` for each of ``layers`` in order (``read``: :meth:`read_layer`), layer i+1
        read by one reader thread while the caller works on layer i (:mod:`headrank.io.prefetch`)."""
        return LayerStream(self, layers, read or self.read_layer)

    def read_layer(self, i: int) -> HeadWeights:
        hw = self.split_raw(*self.read_raw(i))
        hw = self._fold(hw, i) if self.norm is not None else hw
        if self.convention.center_writing and self.norm is not None and self.norm.kind == "layernorm":
            hw = HeadWeights(hw.wq, hw.wk, hw.wv, conv.center_columns(_float64(hw.p)))  # W_O centred (TransformerLens)
        return hw

    def norm_name(self, i: int) -> str:
        """The full name of layer ``i``'s pre-attention norm gain (``fold_norm``)."""
        assert self.norm is not None
        for t in (self.norm.name, *self.norm.alternatives):
            if self.prefix + t.format(i=i) in self.ckpt:
                return self.prefix + t.format(i=i)
        raise HeadRankError(f"`fold_norm`: the checkpoint has no norm gain {self.prefix + self.norm.name.format(i=i)!r}")

    def _fold_mla(self, hw: HeadWeights, i: int) -> HeadWeights:
        """MLA: the latent norms' gains, ``q_a_layernorm`` into W_Q (with a query latent) and
        ``kv_a_layernorm`` into W_K and W_V (docs/mla.md)."""
        names = self.tensor_names(i)
        gq, gkv = latent_norm(names["q"]), latent_norm(names["kv_b"])
        def f64(x: Any) -> Any:  # torch or numpy (bfloat16 bits converted exactly), as numpy float64
            return _as_numpy(_float64(x))

        wq = f64(hw.wq)
        if gq is not None and gq in self.ckpt:
            wq = wq * f64(self.ckpt.get(gq))
        if gkv is None or gkv not in self.ckpt:
            raise HeadRankError(f"`fold_norm`: the checkpoint has no latent norm gain beside {names['kv_b']!r}")
        g = f64(self.ckpt.get(gkv))
        return HeadWeights(wq, f64(hw.wk) * g, f64(hw.wv) * g, hw.p)

    def _fold(self, hw: HeadWeights, i: int) -> HeadWeights:
        assert self.norm is not None
        if self.split == "mla":
            return self._fold_mla(hw, i)
        name = self.norm_name(i)
        g = _float64(self.ckpt.get(name)) + self.norm.offset
        if tuple(g.shape) != (self.dims.d,):
            raise HeadRankError(f"norm gain {name} has shape {tuple(g.shape)}, expected ({self.dims.d},)")
        ws = [conv.fold_columns(_float64(w), g, self.norm.kind == "layernorm") for w in (hw.wq, hw.wk, hw.wv)]
        return HeadWeights(*ws, hw.p)

    @property
    def weights_note(self) -> str:
        """How the factors relate to the stored weights (meta.json's conventions.weights)."""
        return conv.weights_note(self.norm, self.convention)

    def dtypes(self) -> list[str]:
        return sorted({self.ckpt.dtype(n) for n in self.tensor_names(self.layer_ids[0]).values()})

    def biases_present(self) -> list[str]:
        """Bias tensors of layer 0's attention that exist in the checkpoint (relative names)."""
        i = self.layer_ids[0]
        return [b.format(i=i) for b in self.layout.biases if self.prefix + b.format(i=i) in self.ckpt]
