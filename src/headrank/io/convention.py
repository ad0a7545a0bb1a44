"""Weight conventions as data: which transformation of the stored weights the products describe.

Singular values of ``W_Kᵀ W_Q`` and ``P W_V`` depend on what was done to the weights before
they were read (REFERENCE §1, §6): TransformerLens' reviewers found its folding move GPT-2 L9H9's
top OV singular value from 23.3 to 8.4. So the convention travels with every number
(``meta.json``'s ``conventions.convention``, each result's ``.meta``). Two are known:

=================== ===========================================================================
``raw`` (default)   the weights as stored, as the paper reads them
``transformerlens`` what TransformerLens 4 holds by default (``fold_ln``, ``center_writing_weights``
                    and ``fold_value_biases``, the defaults of its weight processing): the gain of
                    the norm before attention multiplied into W_Q, W_K, W_V; for a LayerNorm model
                    those columns then centred along d_model, and each head's block of W_O centred
                    along d_model (the writing weights); value biases moved into the output bias,
                    which no product sees. An RMSNorm model gets the gain alone, as there.
=================== ===========================================================================

A model without a norm in front of attention (post-norm BERT, OLMo-2) has no TransformerLens
folding: ``transformerlens`` is then refused in one line, as TransformerLens itself skips it. So is
multi-head latent attention, for which TransformerLens defines no processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headrank.errors import HeadRankError


@dataclass(frozen=True)
class Convention:
    name: str
    #: multiply the pre-attention norm's gain into W_Q, W_K, W_V (and centre them for a LayerNorm)
    fold_norm: bool
    #: centre each head's block of W_O along d_model (LayerNorm models only)
    center_writing: bool
    #: value biases moved into the output bias (no product changes: recorded, not computed)
    fold_value_biases: bool
    description: str


CONVENTIONS = {
    "raw": Convention("raw", False, False, False, "the weights as stored"),
    "transformerlens": Convention(
        "transformerlens", True, True, True,
        "TransformerLens 4's default weight processing: norm gain folded into W_Q, W_K, W_V (centred along "
        "d_model for LayerNorm), W_O centred along d_model (LayerNorm), value biases folded into b_O"),
}


def convention(name: str | Convention | None) -> Convention:
    """The :class:`Convention` called ``name`` (None: ``raw``); an unknown name is one line."""
    if isinstance(name, Convention):
        return name
    if name is None:
        return CONVENTIONS["raw"]
    key = str(name).strip().lower().replace("-", "").replace("_", "")
    key = {"tl": "transformerlens"}.get(key, key)
    if key not in CONVENTIONS:
        raise HeadRankError(f"`convention` {name!r}: unknown; use {' or '.join(CONVENTIONS)}")
    return CONVENTIONS[key]


def refuse(conv: Convention, model_type: str, why: str) -> HeadRankError:
    """The one-line refusal of a convention a model cannot take."""
    return HeadRankError(f"`convention` {conv.name}: {model_type!r} cannot be read this way: {why}")


def weights_note(norm: Any, conv: Convention) -> str:
    """How the factors relate to the stored weights (meta.json's ``conventions.weights``), for the
    norm folded in (a ``NormSpec``: ``name``, ``kind``, ``offset``; None when none is)."""
    if norm is None:
        return "raw: no preceding norm gain folded in, W_O not centred"
    centred = " and centred along d_model (LayerNorm)" if norm.kind == "layernorm" else ""
    off = f" (1 + w: offset {norm.offset:g})" if norm.offset else ""
    folded = f"norm folded: W_Q, W_K, W_V multiplied by the gain of {norm.name}{off}{centred}"
    if conv.center_writing:
        wo = ("W_O centred along d_model (center_writing_weights)" if norm.kind == "layernorm"
              else "W_O untouched (RMSNorm: nothing to centre)")
        return f"{folded}; {wo}; value biases folded into b_O (no product changes): TransformerLens 4's defaults"
    return f"{folded}, as TransformerLens' fold_ln alone; norm biases (if any) and W_O untouched"


def apply(reader: Any, name: str | Convention | None) -> Any:
    """``reader`` (an :class:`~headrank.io.layouts.AttentionReader`, its encoder-decoder parts and an
    adapter's base reader with it) set to read in convention ``name``; one that the model cannot
    take is one line. Returns ``reader``."""
    conv = convention(name)
    for r in (reader, *reader.parts, getattr(reader, "base_reader", None)):
        if r is None or conv.name == "raw":
            continue
        if r.split == "mla":
            raise refuse(conv, r.layout.model_types[0], "TransformerLens defines no processing of multi-head "
                                                          "latent attention")
        if r.norm is None and r.layout.norm(r.ckpt.config) is None:
            raise refuse(conv, r.layout.model_types[0], "TransformerLens folds the norm in front of attention, "
                         "and this model has none there (post-norm, no norm, or none described in its layout)")
        if r.norm is None:
            r._set_norm(f"`convention` {conv.name}")
        r.convention = conv
    return reader


def center_columns(p: Any) -> Any:
    """Each head's block of W_O, ``p`` (heads, d_model, dh), centred along d_model (torch or numpy)."""
    return p - (p.mean(1, keepdim=True) if hasattr(p, "permute") else p.mean(1, keepdims=True))


def fold_columns(w: Any, g: Any, centre: bool) -> Any:
    """Per-head weights ``w`` (heads, dh, d_model; float64) with the norm gain ``g`` (d_model,)
    multiplied into their input columns and, for a LayerNorm (``centre``), centred along d_model:
    TransformerLens' ``fold_ln``. A torch gain with numpy weights, or the reverse: both as numpy."""
    if type(w) is not type(g):
        import numpy as np

        w, g = (x.numpy() if hasattr(x, "numpy") else np.asarray(x) for x in (w, g))
    w = w * g
    if not centre:
        return w
    return w - (w.mean(-1, keepdim=True) if hasattr(w, "permute") else w.mean(-1, keepdims=True))
