"""Layer surgery: a model and its variants built from the model's *own* modules, one layer at a
time.

=========  ====================================================
``pure``   attention only: skip connections and MLPs removed
``mlp``    attention + MLP, no skip connections
``skip``   attention + skip connections, no MLP
``full``   attention + MLP + skips: the unmodified model
=========  ====================================================

A layer's attention submodule is called with exactly the arguments the unmodified model
passed it (attention mask, positions, rotary tables, captured by a forward pre-hook), with only
the hidden states replaced, so ``full`` reproduces the model's hidden states (tested to float
tolerance). Removing a skip turns ``x + f(x)`` into ``f(x)``; removing the MLP removes its
whole sublayer, including a post-norm model's LayerNorm that belongs to it (BERT's
``output.LayerNorm``). The attention sublayer keeps its norm: BERT ``LN(f(x))``, pre-norm
models ``f(LN(x))``. LayerNorm acts on each token separately, so it maps a rank-one ``1xᵀ`` to
a rank-one matrix and cannot undo collapse.

Which submodules to call comes from the architecture table: the ``modules`` field of the
model_type's row in :mod:`headrank.io.layouts` (:func:`headrank.io.layouts.surgery_model_types`
lists them). The project's own :class:`headrank.models.transformer.Transformer` has its own
adapter.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from headrank.errors import HeadRankError
from headrank.io.layouts import Layout, Modules, layout_for, surgery_model_types
from headrank.models.opener import PROJECT_TYPE, Opened

SURGERY_VARIANTS = ("pure", "mlp", "skip", "full")
VARIANT_LABELS = {"pure": "attention only", "mlp": "attention + MLP", "skip": "attention + skip",
                  "full": "full (attention + MLP + skip)"}
VARIANT_SWITCHES = {"pure": (False, False), "mlp": (False, True), "skip": (True, False), "full": (True, True)}
INITS = ("pretrained", "random")


def collapse_model_types() -> list[str]:
    """model_types :func:`analyze` can run surgery on."""
    return sorted([*surgery_model_types(), PROJECT_TYPE])


def surgery_modules(config: dict[str, Any]) -> Modules | None:
    """The live-module paths for ``config``'s model_type (None for the project's own model);
    HeadRankError when surgery does not support it."""
    mt = config.get("model_type")
    if mt == PROJECT_TYPE:
        if config.get("architecture", "Transformer") != "Transformer":
            raise HeadRankError(f"collapse runs on the project's Transformer, not {config.get('architecture')!r}")
        return None
    try:
        lay: Layout | None = layout_for(config)
    except HeadRankError:
        lay = None
    if lay is None or lay.modules is None:
        raise HeadRankError(f"collapse does not support model_type {mt!r}; supported: "
                            f"{', '.join(collapse_model_types())}")
    return lay.modules


def _replay(call: tuple[tuple, dict], x: torch.Tensor) -> tuple[tuple, dict]:
    args, kwargs = call
    kwargs = dict(kwargs)
    if args:
        args = (x, *args[1:])
    else:
        kwargs["hidden_states"] = x
    if "past_key_values" in kwargs:
        kwargs["past_key_values"] = None
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return args, kwargs


class HFAdapter:
    """Runs a Hugging Face model and its surgical variants layer by layer."""

    def __init__(self, model, modules: Modules):
        self.model, self.modules = model, modules
        self.layers = list(model.get_submodule(modules.layers))
        self.n_layers = len(self.layers)
        self.final_norm = model.get_submodule(modules.final_norm) if modules.final_norm else None

    def reference(self, ids: torch.Tensor) -> dict[str, Any]:
        """Unmodified forward: embedding output, per-layer outputs, attention calls and
        probabilities, and the model's own ``hidden_states``."""
        cap: dict[str, Any] = {"calls": [None] * self.n_layers, "probs": [None] * self.n_layers,
                               "outputs": [None] * self.n_layers}
        hooks = []

        def layer0_pre(mod, args, kwargs):
            cap["emb"] = args[0] if args else kwargs["hidden_states"]

        hooks.append(self.layers[0].register_forward_pre_hook(layer0_pre, with_kwargs=True))
        for i, layer in enumerate(self.layers):
            attn = layer.get_submodule(self.modules.attn)

            def attn_pre(mod, args, kwargs, i=i):
                cap["calls"][i] = (args, kwargs)

            def attn_post(mod, args, out, i=i):
                cap["probs"][i] = out[1] if isinstance(out, tuple) and len(out) > 1 else None

            def layer_post(mod, args, out, i=i):
                cap["outputs"][i] = out[0] if isinstance(out, tuple) else out

            hooks += [attn.register_forward_pre_hook(attn_pre, with_kwargs=True),
                      attn.register_forward_hook(attn_post), layer.register_forward_hook(layer_post)]
        kwargs: dict[str, Any] = {"input_ids": ids, "output_hidden_states": True}
        if "use_cache" in inspect.signature(self.model.forward).parameters:
            kwargs["use_cache"] = False
        try:
            with torch.no_grad():
                out = self.model(**kwargs)
        finally:
            for h in hooks:
                h.remove()
        cap["hidden_states"] = out.hidden_states
        return cap

    def _attend(self, layer, i: int, x: torch.Tensor, cap) -> torch.Tensor:
        attn = layer.get_submodule(self.modules.attn)
        args, kwargs = _replay(cap["calls"][i], x)
        out = attn(*args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def layer(self, i: int, x: torch.Tensor, skip: bool, mlp: bool, cap) -> torch.Tensor:
        """Layer ``i`` on ``x`` with or without its skips and its MLP sublayer."""
        layer, m = self.layers[i], self.modules
        if m.placement == "post":  # BERT: LN(x + drop(dense(attn(x)))), LN(h + drop(dense(act(h))))
            so = layer.get_submodule(m.attn_out)
            a = so.dropout(so.dense(self._attend(layer, i, x, cap)))
            h = so.LayerNorm(a + x) if skip else so.LayerNorm(a)
            if not mlp:
                return h
            o = layer.get_submodule(m.mlp_out)
            f = o.dropout(o.dense(layer.get_submodule(m.mlp)(h)))
            return o.LayerNorm(f + h) if skip else o.LayerNorm(f)
        # pre-norm: x + attn(N1(x)), h + mlp(N2(h))
        a = self._attend(layer, i, layer.get_submodule(m.attn_norm)(x), cap)
        h = a + x if skip else a
        if not mlp:
            return h
        f = layer.get_submodule(m.mlp)(layer.get_submodule(m.mlp_norm)(h))
        return f + h if skip else f

    def has_mlp(self) -> bool:
        return True


class ProjectAdapter:
    """The same interface for the project's :class:`headrank.models.transformer.Transformer`."""

    def __init__(self, model):
        self.model = model
        self.layers = list(model.blocks)
        self.n_layers = len(self.layers)
        self.final_norm = model.final_norm

    def reference(self, ids: torch.Tensor) -> dict[str, Any]:
        """Unmodified forward: embedding output, per-layer outputs and attention probabilities."""
        with torch.no_grad():
            _, hidden = self.model(ids, return_hidden=True)
            probs = []
            for block, x in zip(self.layers, hidden[:-1], strict=True):
                xin = block.attn_norm(x) if block.placement != "post" else x
                probs.append(block.attn.attention_probs(xin))
        return {"emb": hidden[0], "outputs": hidden[1:], "probs": probs, "hidden_states": tuple(hidden)}

    def layer(self, i: int, x: torch.Tensor, skip: bool, mlp: bool, cap) -> torch.Tensor:
        """Block ``i`` on ``x`` with or without its skips and its MLP sublayer."""
        block = self.layers[i]

        def sub(x, f, norm):
            if block.placement == "post":
                return norm(x + f(x)) if skip else norm(f(x))
            y = f(norm(x))
            return x + y if skip else y

        x = sub(x, block.attn, block.attn_norm)
        if mlp:
            x = sub(x, block.mlp, block.mlp_norm)
        return x

    def has_mlp(self) -> bool:
        return all(b.mlp is not None for b in self.layers)


def make_adapter(opened: Opened, init: str, seed: int) -> HFAdapter | ProjectAdapter:
    """An adapter on the opened model (``pretrained``) or on its re-initialised twin (``random``:
    the architecture's own initialiser, ``torch.manual_seed(seed)`` in a forked RNG)."""
    if init not in INITS:
        raise HeadRankError(f"unknown init {init!r}; use {', '.join(INITS)}")
    modules = surgery_modules(opened.config)
    model = opened.model if init == "pretrained" else opened.reinit(seed)
    return ProjectAdapter(model) if modules is None else HFAdapter(model, modules)


def run_variant(adapter, cap: dict[str, Any], variant: str) -> list[torch.Tensor]:
    """Hidden states [embedding output, after layer 1, …, after layer L] of one variant."""
    if variant not in VARIANT_SWITCHES:
        raise HeadRankError(f"unknown variant {variant!r}; use one of {', '.join(SURGERY_VARIANTS)}")
    skip, mlp = VARIANT_SWITCHES[variant]
    x = cap["emb"]
    out = [x]
    with torch.no_grad():
        for i in range(adapter.n_layers):
            x = adapter.layer(i, x, skip, mlp, cap)
            out.append(x)
    return out
