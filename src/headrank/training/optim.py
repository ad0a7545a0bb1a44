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
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn as nn

from headrank.errors import HeadRankError

GROUPS = ("attn", "embedding", "decay", "no_decay")

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
})
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
                  decay_bias_and_norm: bool) -> dict[str, float]:
    """Each group's λ, the three decays checked (finite, >= 0; None defaults to ``weight_decay``)."""
    for label, v in (("weight_decay", weight_decay), ("attn_weight_decay", attn_weight_decay),
                     ("embedding_weight_decay", embedding_weight_decay)):
        if v is not None and not (isinstance(v, int | float) and v >= 0 and v == v and v != float("inf")):
            raise HeadRankError(f"{label} must be a finite number >= 0, got {v!r}")
    return {
        "attn": float(weight_decay if attn_weight_decay is None else attn_weight_decay),
        "embedding": float(weight_decay if embedding_weight_decay is None else embedding_weight_decay),
        "decay": float(weight_decay),
        "no_decay": float(weight_decay) if decay_bias_and_norm else 0.0,
    }


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


def param_groups(
    model: nn.Module,
    weight_decay: float = 0.1,
    attn_weight_decay: float | None = None,
    *,
    embedding_weight_decay: float | None = None,
    decay_bias_and_norm: bool = False,
    attn_patterns: Sequence[str] | None = None,
    keep_empty: bool = False,
) -> ParamGroups:
    """Group ``model``'s trainable parameters by role (see the module docstring).

    ``attn_weight_decay`` / ``embedding_weight_decay`` default to ``weight_decay``.
    ``attn_patterns``: regular expressions (``re.search`` on full parameter names) that
    define the attention parameters instead of the built-in rule; matching tensors with
    ndim < 2 still go to ``no_decay``. Empty groups are dropped unless ``keep_empty``.
    """
    lam = _group_decays(weight_decay, attn_weight_decay, embedding_weight_decay, decay_bias_and_norm)
    patterns = [re.compile(p) for p in attn_patterns] if attn_patterns else None
    modules = dict(model.named_modules(remove_duplicate=False))

    names_of: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
        params[id(p)] = p

    buckets: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in GROUPS}
    records, frozen = [], []
    for pid, names in names_of.items():
        p = params[pid]
        if not p.requires_grad:
            frozen.extend(names)
            continue
        group = _group_of(p, names, modules, patterns)
        buckets[group].append((names[0], p))
        records.append({"name": names[0], "aliases": names[1:], "group": group,
                        "weight_decay": lam[group], "shape": tuple(p.shape), "numel": p.numel()})

    if not buckets["attn"] and lam["attn"] != lam["decay"]:
        raise HeadRankError(
            f"no attention projection recognised in {type(model).__name__}, so attn_weight_decay="
            f"{lam['attn']:g} would apply to nothing; pass attn_patterns=[regex, …] naming them")
    groups = [
        {"params": [p for _, p in buckets[g]], "param_names": [n for n, _ in buckets[g]],
         "weight_decay": lam[g], "name": g}
        for g in GROUPS if buckets[g] or keep_empty
    ]
    return ParamGroups(groups, records, frozen)


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
    """``torch.optim.AdamW`` over :func:`param_groups` (decoupled decay per group)."""
    return torch.optim.AdamW(param_groups(model, weight_decay, attn_weight_decay, **group_kwargs),
                             lr=lr, betas=betas, eps=eps)


# -- Hugging Face Trainer integration ----------------------------------------------------------

_TRAINER_CLASS: type | None = None


def _make_trainer_class() -> type:
    from transformers import Trainer

    class AttnDecayTrainer(Trainer):
        """A Hugging Face ``Trainer`` whose optimizer gets :func:`param_groups`.

        Two lines::

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
                     attn_patterns: Sequence[str] | None = None, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.attn_group_kwargs = {"attn_weight_decay": attn_weight_decay,
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
                self.optimizer = cls(groups, **kwargs)
            return self.optimizer

    return AttnDecayTrainer


def __getattr__(name: str) -> Any:  # lazy: importing headrank.training.optim does not import transformers
    global _TRAINER_CLASS
    if name == "AttnDecayTrainer":
        if _TRAINER_CLASS is None:
            _TRAINER_CLASS = _make_trainer_class()
        return _TRAINER_CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
