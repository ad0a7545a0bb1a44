"""Parameter groups with an attention-specific weight decay, for any ``nn.Module``.

Every trainable parameter lands in exactly one named group:

============  ==========================================================  ====================
group         which parameters                                            weight decay
============  ==========================================================  ====================
``attn``      weight matrices of the attention projections Q, K, V, O     ``attn_weight_decay``
              (fused QKV included)
``embedding`` token / position embeddings, class tokens, and any weight   ``embedding_weight_decay``
              tied to an embedding (e.g. a tied LM head)                  (default: ``weight_decay``)
``decay``     every other matrix (MLP, LM head when untied, patch         ``weight_decay``
              projections, classifiers, …)
``no_decay``  tensors with fewer than 2 dimensions: biases (attention     0 (``decay_bias_and_norm``
              biases included) and norm gains/shifts                      gives them ``weight_decay``)
============  ==========================================================  ====================

Rules are applied in that order of precedence: ``no_decay`` (ndim < 2) first, then
``attn``, then ``embedding``, then ``decay``.

Attention projections are recognised by name, across architectures: a parameter whose module
path has a component containing ``attn`` or ``attention`` (``attn``, ``self_attn``,
``attention.self``, ``SelfAttention``, ``encoder_attn``, ``crossattention`` …) and whose own
module is one of the projection names in :data:`ATTN_PROJECTIONS` (``q``/``k``/``v``/``o``,
``q_proj``…, ``query``/``key``/``value``, BERT's ``attention.output.dense``, GPT-2's
``c_attn``/``attn.c_proj``, GPT-NeoX/BLOOM/Falcon ``query_key_value`` and ``dense``, Phi
``qkv_proj``, BART/OPT ``out_proj``, DistilBERT ``q_lin``…), plus the parameters of any
``nn.MultiheadAttention``. Pass ``attn_patterns`` (regular expressions matched against the full
parameter names) to replace the rule for a model it does not know. If ``attn_weight_decay``
differs from ``weight_decay`` and no attention parameter is found, :class:`HeadRankError` is
raised rather than silently training without the requested split.

Embeddings: parameters of ``nn.Embedding`` modules, and parameters whose leaf name is an
raw ``nn.Parameter`` named in :data:`EMBEDDING_PARAMS` (``cls_token``, ``pos_emb``,
``position_embeddings`` …); a patch projection is an ordinary matrix (``decay``). They keep the
ordinary decay unless ``embedding_weight_decay`` says otherwise (nanoGPT and the Hugging Face
``Trainer`` both decay them; the paper's Figure 2 decays "every other parameter" with 0.1).

Tied weights: a tensor shared by several modules is **one** parameter and gets **one** λ.
All its names are recorded (``aliases`` in :meth:`ParamGroups.records`); the group follows
the precedence above over all names, so an LM head tied to the token embedding is an
embedding (decayed with ``embedding_weight_decay``), never counted twice.

Frozen parameters (``requires_grad=False``) are left out and listed in the summary.

**Q/K against V/O.** ``qk_weight_decay`` and ``ov_weight_decay`` (each defaulting to
``attn_weight_decay``) split ``attn`` into ``attn_qk`` (the query and key projections, whose
product is ``W_Kᵀ W_Q``) and ``attn_ov`` (value and output, ``P W_V``) when they differ. The role
follows the layout table's roles (docs/supported-models.md): ``q``/``k`` against ``v``/``o``; for
multi-head latent attention the query path (``q_a_proj``, ``q_b_proj``) is QK and ``o_proj`` OV,
while ``kv_a_proj_with_mqa`` and ``kv_b_proj`` hold keys and values in one tensor. A tensor that
holds both sides (fused QKV such as GPT-2's ``c_attn``, MLA's ``kv_b_proj``) cannot take two
decays: that is one :class:`HeadRankError` naming ``attn_patterns``, which may then be a mapping
``{"qk": [regex, …], "ov": [regex, …]}`` placing the tensors by name.

**One optimizer for any training stack** (:func:`optimizer`): a ``torch.optim`` optimizer over
these groups that counts each group's decay exposure ``λ·Σlr`` as it steps (:func:`decay_exposure`;
the sum is kept in the group, so it is saved and resumed with the optimizer's state). It goes
to the Hugging Face ``Trainer`` and TRL's ``SFTTrainer`` as ``optimizers=(opt, None)`` (or
:func:`hf_optimizer_cls_and_kwargs` as ``optimizer_cls_and_kwargs=``), is returned by a
Lightning ``configure_optimizers``, is passed to ``accelerator.prepare``, or is stepped by hand
(docs/verbs/train.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from headrank.errors import HeadRankError

GROUPS = ("attn", "attn_qk", "attn_ov", "embedding", "decay", "no_decay")

#: module leaf names of attention projections (only inside an attention module path)
ATTN_PROJECTIONS = frozenset({
    "q", "k", "v", "o",
    "q_proj", "k_proj", "v_proj", "o_proj", "out_proj", "qkv_proj", "in_proj",
    "query", "key", "value", "qkv", "wqkv", "query_key_value",
    "wq", "wk", "wv", "wo",
    "c_attn", "c_proj", "q_attn",
    "dense", "output",
    "q_lin", "k_lin", "v_lin", "out_lin",
    "to_q", "to_k", "to_v", "to_out",
    "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",  # multi-head latent attention
})
#: which side of the head each projection feeds (the layout's roles q, k | v, o); the rest of
#: ATTN_PROJECTIONS hold both sides in one tensor (fused QKV, MLA's key-value latent)
QK_PROJECTIONS = frozenset({"q", "k", "q_proj", "k_proj", "query", "key", "wq", "wk", "q_attn", "q_lin", "k_lin",
                            "to_q", "to_k", "q_a_proj", "q_b_proj", "q_proj_weight", "k_proj_weight"})
OV_PROJECTIONS = frozenset({"v", "o", "v_proj", "o_proj", "out_proj", "value", "wv", "wo", "c_proj", "dense",
                            "output", "v_lin", "out_lin", "to_v", "to_out", "v_proj_weight"})
_ATTN_CONTAINER = re.compile(r"attn|attention", re.IGNORECASE)
#: names of raw ``nn.Parameter`` embeddings (not inside an ``nn.Embedding``)
EMBEDDING_PARAMS = frozenset({
    "cls_token", "class_token", "dist_token", "mask_token", "reg_token", "register_tokens",
    "pos_emb", "pos_embed", "pos_embedding", "position_embedding", "position_embeddings",
    "absolute_pos_embed",
})


def _module_path_parts(name: str) -> list[str]:
    return name.split(".")[:-1]


def _is_attention_name(name: str, modules: dict[str, nn.Module]) -> bool:
    parts = _module_path_parts(name)
    # everything inside an nn.MultiheadAttention: in_proj_weight, q_proj_weight, out_proj.weight …
    if any(isinstance(modules.get(".".join(parts[:j])), nn.MultiheadAttention) for j in range(len(parts) + 1)):
        return True
    if not parts:
        return False
    leaf = parts[-1].lower()
    if leaf not in ATTN_PROJECTIONS:
        # e.g. BERT attention.output.dense, Bloom self_attention.dense
        return False
    return any(_ATTN_CONTAINER.search(p) for p in parts[:-1])


def _is_embedding_name(name: str, modules: dict[str, nn.Module]) -> bool:
    parts = name.split(".")
    owner = modules.get(".".join(parts[:-1]))
    if isinstance(owner, nn.Embedding | nn.EmbeddingBag):
        return True
    return parts[-1].lower() in EMBEDDING_PARAMS


class ParamGroups(list):
    """A list of optimizer parameter-group dicts (``params``, ``weight_decay``, ``name``,
    ``param_names``), directly usable as ``torch.optim.AdamW(groups, lr=…)``, with an audit
    trail: :meth:`records` (one dict per parameter) and :meth:`summary` (printable)."""

    def __init__(self, groups: Iterable[dict[str, Any]], records: list[dict[str, Any]],
                 frozen: list[str]):
        super().__init__(groups)
        self._records = records
        self.frozen = frozen

    def records(self) -> list[dict[str, Any]]:
        """One dict per trainable parameter: name, group, weight_decay, shape, numel, aliases."""
        return [dict(r) for r in self._records]

    def by_name(self) -> dict[str, dict[str, Any]]:
        """Records keyed by every name (aliases of tied weights included)."""
        out = {}
        for r in self._records:
            for n in (r["name"], *r["aliases"]):
                out[n] = r
        return out

    def weight_decay_of(self, name: str) -> float:
        return self.by_name()[name]["weight_decay"]

    def summary(self, per_param: bool = True) -> str:
        lines = []
        for g in self:
            n = sum(p.numel() for p in g["params"])
            lines.append(f"{g['name']:<10} weight_decay={g['weight_decay']:<8g} "
                         f"{len(g['params']):>4} tensors {n:>12,} params")
            if per_param:
                recs = [r for r in self._records if r["group"] == g["name"]]
                for r in recs:
                    tied = f"  (tied: {', '.join(r['aliases'])})" if r["aliases"] else ""
                    lines.append(f"    {r['name']}  {tuple(r['shape'])}{tied}")
        if self.frozen:
            lines.append(f"frozen (not optimised): {len(self.frozen)} tensors")
        return "\n".join(lines)

    def __str__(self) -> str:  # print(groups) shows the audit, not a wall of tensors
        return self.summary(per_param=False)


def _group_decays(weight_decay: float, attn_weight_decay: float | None, embedding_weight_decay: float | None,
                  decay_bias_and_norm: bool, qk_weight_decay: float | None = None,
                  ov_weight_decay: float | None = None) -> dict[str, float]:
    """Each group's λ, the decays checked (finite, >= 0; None defaults to ``weight_decay``, and
    ``qk_weight_decay``/``ov_weight_decay`` to ``attn_weight_decay``)."""
    for label, v in (("weight_decay", weight_decay), ("attn_weight_decay", attn_weight_decay),
                     ("embedding_weight_decay", embedding_weight_decay), ("qk_weight_decay", qk_weight_decay),
                     ("ov_weight_decay", ov_weight_decay)):
        if (v is not None or label == "weight_decay") and not (
                isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 and v == v and v != float("inf")):
            raise HeadRankError(f"{label} must be a finite number >= 0, got {v!r}")
    attn = float(weight_decay if attn_weight_decay is None else attn_weight_decay)
    qk = float(attn if qk_weight_decay is None else qk_weight_decay)
    ov = float(attn if ov_weight_decay is None else ov_weight_decay)
    return {
        "attn": qk if qk == ov else attn,  # one group when both sides get the same λ
        "attn_qk": qk,
        "attn_ov": ov,
        "embedding": float(weight_decay if embedding_weight_decay is None else embedding_weight_decay),
        "decay": float(weight_decay),
        "no_decay": float(weight_decay) if decay_bias_and_norm else 0.0,
    }


def _side(name: str) -> str | None:
    """``attn_qk``, ``attn_ov`` or None (both sides in one tensor, or not known) for an attention
    parameter, from its own name (``nn.MultiheadAttention``'s ``q_proj_weight``) or its module's."""
    parts = name.lower().split(".")
    for leaf in (parts[-1], parts[-2] if len(parts) > 1 else ""):
        if leaf in QK_PROJECTIONS:
            return "attn_qk"
        if leaf in OV_PROJECTIONS:
            return "attn_ov"
    return None


def _patterns(attn_patterns: Sequence[str] | Mapping[str, Sequence[str]] | None
              ) -> tuple[list[re.Pattern[str]] | None, dict[str, list[re.Pattern[str]]]]:
    """``attn_patterns`` → (patterns of every attention tensor, patterns per side)."""
    if attn_patterns is None:
        return None, {}
    if isinstance(attn_patterns, Mapping):
        bad = sorted(set(attn_patterns) - {"qk", "ov"})
        if bad:
            raise HeadRankError(f"attn_patterns: unknown side {bad[0]!r}; a mapping takes the keys 'qk' and 'ov'")
        sides = {f"attn_{k}": [re.compile(p) for p in v] for k, v in attn_patterns.items()}
        return [r for v in sides.values() for r in v], sides
    if isinstance(attn_patterns, str):
        attn_patterns = [attn_patterns]
    return [re.compile(p) for p in attn_patterns], {}


def _group_of(p: nn.Parameter, names: list[str], modules: dict[str, nn.Module],
              patterns: list[re.Pattern[str]] | None) -> str:
    """The group of one parameter known by ``names`` (all its names when tied), by the rules'
    precedence: ``no_decay``, ``attn``, ``embedding``, ``decay``."""
    if p.ndim < 2:
        return "no_decay"
    if any((patterns and any(r.search(n) for r in patterns)) if patterns else _is_attention_name(n, modules)
           for n in names):
        return "attn"
    if any(_is_embedding_name(n, modules) for n in names):
        return "embedding"
    return "decay"


def _split_sides(model: nn.Module, attn: list[tuple[str, nn.Parameter]],
                 sides: dict[str, list[re.Pattern[str]]]) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """The attention tensors placed on the QK or the OV side; one tensor that holds both is an error."""
    out: dict[str, list[tuple[str, nn.Parameter]]] = {"attn_qk": [], "attn_ov": []}
    for name, p in attn:
        if sides:
            side = next((s for s, rs in sides.items() if any(r.search(name) for r in rs)), None)
        else:
            side = _side(name)
        if side is None:
            leaves = name.lower().split(".")[-2:]
            how = ("no pattern of attn_patterns['qk'] or ['ov'] matches it" if sides else
                   "it holds both sides in one tensor" if set(leaves) & (ATTN_PROJECTIONS | {"in_proj_weight"})
                   else "its side is not known from its name")
            raise HeadRankError(
                f"qk_weight_decay and ov_weight_decay differ, but {type(model).__name__} parameter {name!r} cannot "
                f"be placed on the QK or the OV side ({how}); pass attn_patterns={{'qk': [regex, …], "
                f"'ov': [regex, …]}} naming the tensors of each side, or give both the same decay")
        out[side].append((name, p))
    return out


def param_groups(
    model: nn.Module,
    weight_decay: float = 0.1,
    attn_weight_decay: float | None = None,
    *,
    qk_weight_decay: float | None = None,
    ov_weight_decay: float | None = None,
    embedding_weight_decay: float | None = None,
    decay_bias_and_norm: bool = False,
    attn_patterns: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    keep_empty: bool = False,
) -> ParamGroups:
    """Group ``model``'s trainable parameters by role (see the module docstring).

    ``attn_weight_decay`` / ``embedding_weight_decay`` default to ``weight_decay``;
    ``qk_weight_decay`` / ``ov_weight_decay`` to ``attn_weight_decay`` (when they differ, the
    attention group becomes ``attn_qk`` and ``attn_ov``).
    ``attn_patterns``: regular expressions (``re.search`` on full parameter names) that
    define the attention parameters instead of the built-in rule, or a mapping ``{"qk": […],
    "ov": […]}`` that also places them; matching tensors with ndim < 2 still go to
    ``no_decay``. Empty groups are dropped unless ``keep_empty``.
    """
    lam = _group_decays(weight_decay, attn_weight_decay, embedding_weight_decay, decay_bias_and_norm,
                        qk_weight_decay, ov_weight_decay)
    patterns, sides = _patterns(attn_patterns)
    modules = dict(model.named_modules(remove_duplicate=False))

    names_of: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
        params[id(p)] = p

    buckets: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in GROUPS}
    group_of, frozen = {}, []
    for pid, names in names_of.items():
        p = params[pid]
        if not p.requires_grad:
            frozen.extend(names)
            continue
        group_of[pid] = _group_of(p, names, modules, patterns)
        buckets[group_of[pid]].append((names[0], p))

    split = lam["attn_qk"] != lam["attn_ov"]
    if not buckets["attn"] and (lam["attn_qk"] != lam["decay"] or lam["attn_ov"] != lam["decay"]):
        raise HeadRankError(
            f"no attention projection recognised in {type(model).__name__}, so the attention decay would apply "
            f"to nothing; pass attn_patterns=[regex, …] naming them")
    if split:
        buckets.update(_split_sides(model, buckets.pop("attn"), sides), attn=[])
        group_of.update({id(p): g for g in ("attn_qk", "attn_ov") for _, p in buckets[g]})
    records = [{"name": names_of[pid][0], "aliases": names_of[pid][1:], "group": g, "weight_decay": lam[g],
                "shape": tuple(params[pid].shape), "numel": params[pid].numel()} for pid, g in group_of.items()]
    shown = [g for g in GROUPS if g not in (("attn",) if split else ("attn_qk", "attn_ov"))]
    groups = [
        {"params": [p for _, p in buckets[g]], "param_names": [n for n, _ in buckets[g]],
         "weight_decay": lam[g], "name": g}
        for g in shown if buckets[g] or keep_empty
    ]
    return ParamGroups(groups, records, frozen)


#: the key in each optimizer parameter group that sums the learning rates it has stepped with
LR_SUM = "headrank_lr_sum"


def _count_lr(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for g in opt.param_groups:
        g[LR_SUM] = g.get(LR_SUM, 0.0) + float(g["lr"])


def track_exposure(opt: Any) -> Any:
    """Count ``Σlr`` in every parameter group of ``opt`` from now on (a step pre-hook: a step
    skipped by a gradient scaler, or not taken under gradient accumulation, is not counted).
    Idempotent; ``opt`` may be wrapped (``accelerate``'s ``AcceleratedOptimizer``). Returns ``opt``."""
    inner = _unwrap(opt)
    if not getattr(inner, "_headrank_counts_lr", False):
        inner.register_step_pre_hook(_count_lr)
        inner._headrank_counts_lr = True
        for g in inner.param_groups:
            g.setdefault(LR_SUM, 0.0)
    return opt


def _unwrap(opt: Any) -> torch.optim.Optimizer:
    while getattr(opt, "optimizer", None) is not None:
        opt = opt.optimizer  # accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer
    if not isinstance(opt, torch.optim.Optimizer):
        raise HeadRankError(f"expected a torch.optim optimizer, got {type(opt).__name__}")
    return opt


def decay_exposure(opt: Any) -> dict[str, float]:
    """Each group's decay exposure ``λ·Σlr`` so far (docs/METHODS.md), keyed by the group's name
    (``group_N`` for an unnamed one); counted since :func:`track_exposure` (or :func:`optimizer`)."""
    inner = _unwrap(opt)
    return {str(g.get("name", f"group_{i}")): float(g["weight_decay"]) * float(g.get(LR_SUM, 0.0))
            for i, g in enumerate(inner.param_groups) if "weight_decay" in g}


def optimizer(
    model: nn.Module,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    attn_weight_decay: float | None = None,
    *,
    qk_weight_decay: float | None = None,
    ov_weight_decay: float | None = None,
    embedding_weight_decay: float | None = None,
    decay_bias_and_norm: bool = False,
    attn_patterns: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
    **optimizer_kwargs: Any,
) -> torch.optim.Optimizer:
    """The one optimizer factory: ``optimizer_cls`` (AdamW by default; betas, eps … in
    ``optimizer_kwargs``) over :func:`param_groups`, counting each group's decay exposure
    (:func:`decay_exposure`). Use it with any stack::

        opt = headrank.optimizer(model, lr=3e-4, weight_decay=0.1, qk_weight_decay=0.1, ov_weight_decay=0.0)
        Trainer(model=model, args=args, optimizers=(opt, None))   # Hugging Face; TRL's SFTTrainer the same
        def configure_optimizers(self): return headrank.optimizer(self, lr=3e-4, ...)   # Lightning
        model, opt = accelerator.prepare(model, opt)               # Accelerate
    """
    groups = param_groups(model, weight_decay, attn_weight_decay, qk_weight_decay=qk_weight_decay,
                          ov_weight_decay=ov_weight_decay, embedding_weight_decay=embedding_weight_decay,
                          decay_bias_and_norm=decay_bias_and_norm, attn_patterns=attn_patterns)
    opt = optimizer_cls(groups, lr=lr, **optimizer_kwargs)
    opt.headrank_groups = groups  # the audit (print it)
    return track_exposure(opt)


def hf_optimizer_cls_and_kwargs(model: nn.Module, **kwargs: Any) -> tuple[type, dict[str, Any]]:
    """For the Hugging Face ``Trainer``'s ``optimizer_cls_and_kwargs=`` argument: the optimizer
    class and its keyword arguments, with ``params`` the groups of :func:`param_groups` (the
    Trainer takes ``params`` from the kwargs over its own grouping). ``kwargs`` as for
    :func:`optimizer`; ``lr`` and ``weight_decay`` are required here, as the Trainer passes neither.
    Exposure is counted once :class:`~headrank.training.integrations.RankCallback` sees the optimizer."""
    for key in ("lr", "weight_decay"):
        if key not in kwargs:
            raise HeadRankError(f"hf_optimizer_cls_and_kwargs needs {key}= (the Trainer passes no {key} here)")
    cls = kwargs.pop("optimizer_cls", torch.optim.AdamW)
    group_keys = ("weight_decay", "attn_weight_decay", "qk_weight_decay", "ov_weight_decay", "embedding_weight_decay",
                  "decay_bias_and_norm", "attn_patterns")
    group_kwargs = {k: kwargs.pop(k) for k in group_keys if k in kwargs}
    return cls, {"params": param_groups(model, **group_kwargs), **kwargs}


def adamw(
    model: nn.Module,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    attn_weight_decay: float | None = None,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    **group_kwargs: Any,
) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over :func:`param_groups` (:func:`optimizer` with its defaults)."""
    return optimizer(model, lr, weight_decay, attn_weight_decay, betas=betas, eps=eps, **group_kwargs)


# -- Hugging Face Trainer integration ----------------------------------------------------------

_TRAINER_CLASS: type | None = None


def _make_trainer_class() -> type:
    from transformers import Trainer

    class AttnDecayTrainer(Trainer):
        """A Hugging Face ``Trainer`` whose optimizer gets :func:`param_groups`.

        Deprecated: a subclass cannot be combined with another (TRL's ``SFTTrainer``). Pass
        ``optimizers=(headrank.optimizer(model, lr=…, weight_decay=…, attn_weight_decay=…), None)``
        to any ``Trainer`` instead (docs/verbs/train.md). Still works::

            from headrank.training.optim import AttnDecayTrainer
            trainer = AttnDecayTrainer(model=model, args=args, train_dataset=ds, attn_weight_decay=0.0)

        ``args.weight_decay`` is the decay of every other matrix; ``attn_weight_decay`` that of
        the attention projections; ``embedding_weight_decay``, ``decay_bias_and_norm`` and
        ``attn_patterns`` go to :func:`param_groups`. The optimizer class and its other
        settings (lr, betas, eps) still come from ``args`` (``args.optim``). After
        ``create_optimizer()`` the groups are in ``trainer.attn_param_groups`` (print it).
        """

        def __init__(self, *args: Any, attn_weight_decay: float | None = None,
                     embedding_weight_decay: float | None = None, decay_bias_and_norm: bool = False,
                     attn_patterns: Sequence[str] | None = None, qk_weight_decay: float | None = None,
                     ov_weight_decay: float | None = None, **kwargs: Any):
            import warnings

            warnings.warn("AttnDecayTrainer is deprecated: pass optimizers=(headrank.optimizer(model, ...), None) "
                          "to the Trainer (docs/verbs/train.md)", DeprecationWarning, stacklevel=2)
            super().__init__(*args, **kwargs)
            self.attn_group_kwargs = {"attn_weight_decay": attn_weight_decay, "qk_weight_decay": qk_weight_decay,
                                      "ov_weight_decay": ov_weight_decay,
                                      "embedding_weight_decay": embedding_weight_decay,
                                      "decay_bias_and_norm": decay_bias_and_norm,
                                      "attn_patterns": attn_patterns}
            self.attn_param_groups: ParamGroups | None = None

        def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
            opt_model = self.model if model is None else model
            if self.optimizer is None:
                groups = param_groups(opt_model, self.args.weight_decay, **self.attn_group_kwargs)
                if self.optimizer_cls_and_kwargs is not None:
                    cls, kwargs = self.optimizer_cls_and_kwargs
                else:
                    cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
                kwargs = {k: v for k, v in kwargs.items() if k not in ("params", "model", "optimizer_dict")}
                self.attn_param_groups = groups
                self.optimizer = track_exposure(cls(groups, **kwargs))
            return self.optimizer

    return AttnDecayTrainer


def __getattr__(name: str) -> Any:  # lazy: importing headrank.training.optim does not import transformers
    global _TRAINER_CLASS
    if name == "AttnDecayTrainer":
        if _TRAINER_CLASS is None:
            _TRAINER_CLASS = _make_trainer_class()
        return _TRAINER_CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
