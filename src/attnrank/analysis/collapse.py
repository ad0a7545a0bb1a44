"""Rank collapse of token representations across depth (Dong, Cordonnier, Loukas, ICML 2021).

**Measures** of token representations ``X`` (n tokens × d), REFERENCE.md §4:

- relative residual ``‖X − 1xᵀ‖ / ‖X‖`` in the ℓ1 norm (max column abs-sum), the ℓ∞ norm
  (max row abs-sum), the composite ``‖·‖_{1,∞} = √(‖·‖_1 ‖·‖_∞)`` and the Frobenius norm, with
  ``x`` either the mean row (``center="mean"``, the reference code's choice) or the best fit
  ``argmin_x ‖X − 1xᵀ‖`` in that norm (``center="best"``: the mean for Frobenius, the
  column-wise median for ℓ1, a linear program for ℓ∞; for the composite norm, which is not
  convex in x, the best of those three candidates: an upper bound on the exact minimum);
- mean pairwise cosine similarity of the tokens (i ≠ j), effective rank ``exp(H(σ/Σσ))`` and
  stable rank ``Σσ²/σ₁²`` of X.

The primary measure (plots, claims) is ``res_composite``: composite norm, mean row.

**Surgery.** :func:`analyze` runs real text through a model and four variants built from the
model's *own* modules, one layer at a time:

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
a rank-one matrix and cannot undo collapse. Each variant is run on the pretrained weights and
on the same architecture re-initialised by its own initialiser (seeded). Per layer (0 = the
embedding output, l = after layer l) every measure is averaged over a batch of sequences
(mean ± std).

Supported: BERT-style (``bert``, ``roberta``, ``xlm-roberta``, ``electra``), GPT-2, LLaMA-style
(``llama``, ``mistral``, ``qwen2``) Hugging Face directories, the shipped ``minilm``, and the
project's own :class:`attnrank.models.transformer.Transformer` (a saved model directory, or a training run
directory, whose newest checkpoint is used).

**Depth sweep** (:func:`depth_sweep`): the project's Transformer with skips, MLPs and norms
switched off (a pure self-attention network) at random initialisation, residual against depth,
and fits of ``log r_L`` to an exponential (``a + bL``) and a doubly exponential
(``a + b κ^L``, the paper's bound has κ = 3) form.

**Paths** (:func:`path_counts`, :func:`path_products`, :func:`path_restricted`): with skips, a
network of L layers of H heads is a sum over paths through at most one head per layer; there
are ``C(L,k)·H^k`` paths of length k. :func:`path_products` multiplies the attention matrices
along sampled head paths of a real forward pass; :func:`path_restricted` evaluates the
project's model restricted to the paths of each length, with the attention matrices (and the
norms' per-token scales) frozen at their values in the full forward pass, where the sum over
all lengths equals the model's output exactly.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations, product
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnrank.errors import AttnRankError
from attnrank.util.threads import torch_threads

NORMS = ("l1", "linf", "composite", "fro")
CENTERS = ("mean", "best")
MEASURES = ("res_composite", "res_l1", "res_linf", "res_fro", "res_best_l1", "cosine",
            "effective_rank", "stable_rank")
PRIMARY = "res_composite"
VARIANTS = ("pure", "mlp", "skip", "full")
VARIANT_LABELS = {"pure": "attention only", "mlp": "attention + MLP", "skip": "attention + skip",
                  "full": "full (attention + MLP + skip)"}
VARIANT_SWITCHES = {"pure": (False, False), "mlp": (False, True), "skip": (True, False), "full": (True, True)}
INITS = ("pretrained", "random")

# --------------------------------------------------------------------------- measures


def _as_array(X) -> np.ndarray:
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().double().numpy()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim < 2:
        raise AttnRankError(f"token representations must be (..., n, d), got shape {X.shape}")
    return X


def matrix_norm(M, norm: str = "composite") -> np.ndarray:
    """ℓ1 (max column abs-sum), ℓ∞ (max row abs-sum), composite √(ℓ1·ℓ∞) or Frobenius norm
    of ``M`` (..., n, d), batched over leading dimensions."""
    M = _as_array(M)
    A = np.abs(M)
    if norm == "l1":
        return A.sum(-2).max(-1)
    if norm == "linf":
        return A.sum(-1).max(-1)
    if norm == "composite":
        return np.sqrt(A.sum(-2).max(-1) * A.sum(-1).max(-1))
    if norm == "fro":
        return np.sqrt((M * M).sum((-2, -1)))
    raise AttnRankError(f"unknown norm {norm!r}; use one of {', '.join(NORMS)}")


def linf_best_row(X) -> np.ndarray:
    """``argmin_x max_i Σ_j |X_ij − x_j|`` by a linear program (HiGHS dual simplex).

    O(n·d) variables: meant for small matrices (a 32 × 384 matrix takes seconds).
    """
    import scipy.sparse as sp
    from scipy.optimize import linprog

    X = _as_array(X)
    if X.ndim != 2:
        raise AttnRankError("linf_best_row takes one (n, d) matrix")
    n, d = X.shape
    nd = n * d
    pick = sp.kron(sp.csr_matrix(np.ones((n, 1))), sp.identity(d))  # row (i, j) picks x_j
    eye, zcol = sp.identity(nd), sp.csr_matrix((nd, 1))
    rowsum = sp.kron(sp.identity(n), sp.csr_matrix(np.ones((1, d))))
    A = sp.vstack([sp.hstack([-pick, -eye, zcol]),      # X_ij − x_j ≤ u_ij
                   sp.hstack([pick, -eye, zcol]),       # x_j − X_ij ≤ u_ij
                   sp.hstack([sp.csr_matrix((n, d)), rowsum, -sp.csr_matrix(np.ones((n, 1)))])]).tocsr()
    b = np.concatenate([-X.ravel(), X.ravel(), np.zeros(n)])
    c = np.zeros(d + nd + 1)
    c[-1] = 1.0
    bounds = [(None, None)] * d + [(0, None)] * (nd + 1)
    res = linprog(c, A_ub=A, b_ub=b, bounds=bounds, method="highs-ds")
    if not res.success:  # pragma: no cover - a feasible bounded LP
        raise RuntimeError(f"linprog failed: {res.message}")
    return res.x[:d]


def best_row(X, norm: str = "fro") -> np.ndarray:
    """The row x minimising ``‖X − 1xᵀ‖`` in ``norm`` (composite: best of the mean, median and
    ℓ∞-optimal rows, an upper bound on the exact minimum). Shape (..., 1, d)."""
    X = _as_array(X)
    if norm == "fro":
        return X.mean(-2, keepdims=True)
    if norm == "l1":
        return np.median(X, axis=-2, keepdims=True)
    if norm not in ("linf", "composite"):
        raise AttnRankError(f"unknown norm {norm!r}; use one of {', '.join(NORMS)}")
    lead = X.shape[:-2]
    flat = X.reshape(-1, *X.shape[-2:])
    out = np.empty((flat.shape[0], 1, X.shape[-1]))
    for i, M in enumerate(flat):
        xl = linf_best_row(M)[None]
        if norm == "linf":
            out[i] = xl
            continue
        cands = [M.mean(0, keepdims=True), np.median(M, 0, keepdims=True), xl]
        out[i] = min(cands, key=lambda x: float(matrix_norm(M - x, "composite")))
    return out.reshape(*lead, 1, X.shape[-1])


def residual(X, norm: str = "composite", center: str = "mean") -> np.ndarray:
    """Relative residual ``‖X − 1xᵀ‖ / ‖X‖`` (NaN where X = 0), batched over leading dims."""
    X = _as_array(X)
    if center == "mean":
        x = X.mean(-2, keepdims=True)
    elif center == "best":
        x = best_row(X, norm)
    else:
        raise AttnRankError(f"unknown center {center!r}; use one of {', '.join(CENTERS)}")
    num, den = matrix_norm(X - x, norm), matrix_norm(X, norm)
    return np.divide(num, den, out=np.full(np.shape(num), np.nan), where=den > 0)


def cosine_similarity(X) -> np.ndarray:
    """Mean cosine similarity over pairs of distinct tokens (NaN for a zero row or n < 2)."""
    X = _as_array(X)
    n = X.shape[-2]
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        U = X / norms
    G = U @ np.swapaxes(U, -1, -2)
    if n < 2:
        return np.full(X.shape[:-2], np.nan)
    return (G.sum((-2, -1)) - np.trace(G, axis1=-2, axis2=-1)) / (n * (n - 1))


def _svals(X) -> np.ndarray:
    return np.linalg.svd(_as_array(X), compute_uv=False)


def effective_rank(X) -> np.ndarray:
    """``exp(H(p))``, ``p = σ/Σσ`` (Roy & Vetterli), of X itself (not centred)."""
    s = _svals(X)
    p = s / s.sum(-1, keepdims=True)
    logp = np.log(np.where(p > 0, p, 1.0))
    return np.exp(-(p * logp).sum(-1))


def stable_rank(X) -> np.ndarray:
    """``Σσ² / σ₁² = ‖X‖_F² / ‖X‖_2²``."""
    s = _svals(X)
    return (s * s).sum(-1) / (s[..., 0] ** 2)


def token_measures(X) -> dict[str, np.ndarray]:
    """Every measure in :data:`MEASURES` for X (..., n, d)."""
    X = _as_array(X)
    out = {f"res_{n}": residual(X, n, "mean") for n in NORMS}
    out["res_best_l1"] = residual(X, "l1", "best")
    out["cosine"] = cosine_similarity(X)
    s = _svals(X)
    p = s / s.sum(-1, keepdims=True)
    out["effective_rank"] = np.exp(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1))
    out["stable_rank"] = (s * s).sum(-1) / s[..., 0] ** 2
    return {k: out[k] for k in MEASURES}


# --------------------------------------------------------------------------- paths


def path_counts(n_layers: int, n_heads: int) -> list[int]:
    """Number of paths of each length k = 0..L through L layers of H heads with skips:
    ``C(L, k)·H^k`` (exact integers; they sum to ``(H+1)^L``)."""
    if n_layers < 0 or n_heads < 1:
        raise AttnRankError(f"need n_layers >= 0 and n_heads >= 1, got {n_layers}, {n_heads}")
    return [math.comb(n_layers, k) * n_heads**k for k in range(n_layers + 1)]


def enumerate_paths(n_layers: int, n_heads: int):
    """Every path, as a tuple with one entry per layer: ``None`` (skip) or a head index."""
    return product([None, *range(n_heads)], repeat=n_layers)


WELL_KNOWN = {  # name: (layers, heads per layer)
    "MiniLM-L6-H384": (6, 12),
    "BERT-base": (12, 12),
    "BERT-large": (24, 16),
    "GPT-2 small": (12, 12),
    "GPT-2 medium": (24, 16),
    "GPT-2 large": (36, 20),
    "GPT-2 XL": (48, 25),
    "LLaMA-2 7B": (32, 32),
    "LLaMA-2 13B": (40, 40),
    "LLaMA-2 70B": (80, 64),
}


def path_length_stats(n_layers: int, n_heads: int) -> dict[str, Any]:
    """Summary of the path-length distribution: total paths, mean, std, mode, share of short
    paths. Under the uniform count, a path's length is Binomial(L, H/(H+1))."""
    counts = path_counts(n_layers, n_heads)
    total = sum(counts)
    q = n_heads / (n_heads + 1)
    cum = 0
    half = None
    for k, c in enumerate(counts):
        cum += c
        if half is None and 2 * cum >= total:
            half = k
    short = sum(counts[: n_layers // 2 + 1])
    return {"layers": n_layers, "heads": n_heads, "log10_total_paths": n_layers * math.log10(n_heads + 1),
            "mean_length": n_layers * q, "std_length": math.sqrt(n_layers * q * (1 - q)),
            "mode_length": max(range(n_layers + 1), key=lambda k: counts[k]), "median_length": half,
            "share_length_le_half": short / total,
            "log10_paths_full_length": n_layers * math.log10(n_heads)}


def path_table(configs: dict[str, tuple[int, int]] | None = None) -> pd.DataFrame:
    """:func:`path_length_stats` for well-known configurations (or ``configs``)."""
    configs = WELL_KNOWN if configs is None else configs
    return pd.DataFrame([{"model": k, **path_length_stats(*v)} for k, v in configs.items()])


def path_products(probs: torch.Tensor | np.ndarray, n_samples: int = 64, seed: int = 0,
                  norm: str = "composite") -> pd.DataFrame:
    """Products of attention matrices along sampled head paths, one sequence.

    ``probs`` (L, H, n, n): layer l's row-stochastic attention matrices. For each length
    k = 1..L, ``n_samples`` paths: k distinct layers (uniformly) and one head per chosen layer
    (uniformly); the product ``P_{l_k,h_k} ⋯ P_{l_1,h_1}`` (later layers on the left, as
    ``X ← P X``) and its relative residual in ``norm`` (mean row). k = 0 is the identity.
    Where ``C(L,k)·H^k ≤ n_samples`` every path is taken once instead.
    """
    P = _as_array(probs)
    L, H, n, _ = P.shape
    rng = np.random.default_rng(seed)
    rows = [{"length": 0, "path": "identity", "residual": float(residual(np.eye(n), norm))}]
    for k in range(1, L + 1):
        total = math.comb(L, k) * H**k
        if total <= n_samples:
            paths = [(ls, hs) for ls in combinations(range(L), k) for hs in product(range(H), repeat=k)]
        else:
            paths = [(tuple(sorted(rng.choice(L, size=k, replace=False).tolist())),
                      tuple(rng.integers(0, H, size=k).tolist())) for _ in range(n_samples)]
        for ls, hs in paths:
            M = np.eye(n)
            for l, h in zip(ls, hs, strict=True):
                M = P[l, h] @ M
            rows.append({"length": k, "path": " ".join(f"{l}.{h}" for l, h in zip(ls, hs, strict=True)),
                         "residual": float(residual(M, norm))})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class Family:
    """How to run one layer of a model family from its own submodules."""

    layers: str            # dotted attribute path of the layer list
    kind: str              # "post" (BERT-style) or "pre" (pre-norm decoder)
    attn: str              # the attention module called with the captured arguments
    final_norm: str | None = None
    pre_names: tuple[str, str, str] = ("", "", "")  # pre-norm: attention norm, MLP norm, MLP


_BERT = Family("encoder.layer", "post", "attention.self")
_LLAMA = Family("layers", "pre", "self_attn", "norm", ("input_layernorm", "post_attention_layernorm", "mlp"))
FAMILIES: dict[str, Family] = {
    "bert": _BERT, "roberta": _BERT, "xlm-roberta": _BERT, "electra": _BERT,
    "gpt2": Family("h", "pre", "attn", "ln_f", ("ln_1", "ln_2", "mlp")),
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA,
}
PROJECT_TYPE = "attnrank"


def _getattr_path(obj, path: str):
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


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


class _HFAdapter:
    """Runs a Hugging Face model and its surgical variants layer by layer."""

    def __init__(self, model, family: Family):
        self.model, self.family = model, family
        self.layers = list(_getattr_path(model, family.layers))
        self.n_layers = len(self.layers)
        self.final_norm = _getattr_path(model, family.final_norm) if family.final_norm else None

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
            attn = _getattr_path(layer, self.family.attn)

            def attn_pre(mod, args, kwargs, i=i):
                cap["calls"][i] = (args, kwargs)

            def attn_post(mod, args, out, i=i):
                cap["probs"][i] = out[1] if isinstance(out, tuple) and len(out) > 1 else None

            def layer_post(mod, args, out, i=i):
                cap["outputs"][i] = out[0] if isinstance(out, tuple) else out

            hooks += [attn.register_forward_pre_hook(attn_pre, with_kwargs=True),
                      attn.register_forward_hook(attn_post), layer.register_forward_hook(layer_post)]
        kwargs: dict[str, Any] = {"input_ids": ids, "output_hidden_states": True}
        import inspect

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
        attn = _getattr_path(layer, self.family.attn)
        args, kwargs = _replay(cap["calls"][i], x)
        out = attn(*args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def layer(self, i: int, x: torch.Tensor, skip: bool, mlp: bool, cap) -> torch.Tensor:
        layer = self.layers[i]
        if self.family.kind == "post":  # BERT: LN(x + drop(dense(attn(x)))), LN(h + drop(dense(act(h))))
            so = layer.attention.output
            a = so.dropout(so.dense(self._attend(layer, i, x, cap)))
            h = so.LayerNorm(a + x) if skip else so.LayerNorm(a)
            if not mlp:
                return h
            o = layer.output
            m = o.dropout(o.dense(layer.intermediate(h)))
            return o.LayerNorm(m + h) if skip else o.LayerNorm(m)
        n1, n2, ff = self.family.pre_names  # pre-norm: x + attn(N1(x)), h + mlp(N2(h))
        a = self._attend(layer, i, getattr(layer, n1)(x), cap)
        h = a + x if skip else a
        if not mlp:
            return h
        m = getattr(layer, ff)(getattr(layer, n2)(h))
        return m + h if skip else m

    def has_mlp(self) -> bool:
        return True


class _ProjectAdapter:
    """The same interface for the project's :class:`attnrank.models.transformer.Transformer`."""

    def __init__(self, model):
        self.model = model
        self.layers = list(model.blocks)
        self.n_layers = len(self.layers)
        self.final_norm = model.final_norm

    def reference(self, ids: torch.Tensor) -> dict[str, Any]:
        with torch.no_grad():
            _, hidden = self.model(ids, return_hidden=True)
            probs = []
            for block, x in zip(self.layers, hidden[:-1], strict=True):
                xin = block.attn_norm(x) if block.placement != "post" else x
                probs.append(block.attn.attention_probs(xin))
        return {"emb": hidden[0], "outputs": hidden[1:], "probs": probs, "hidden_states": tuple(hidden)}

    def layer(self, i: int, x: torch.Tensor, skip: bool, mlp: bool, cap) -> torch.Tensor:
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


def run_variant(adapter, cap: dict[str, Any], variant: str) -> list[torch.Tensor]:
    """Hidden states [embedding output, after layer 1, …, after layer L] of one variant."""
    if variant not in VARIANT_SWITCHES:
        raise AttnRankError(f"unknown variant {variant!r}; use one of {', '.join(VARIANTS)}")
    skip, mlp = VARIANT_SWITCHES[variant]
    x = cap["emb"]
    out = [x]
    with torch.no_grad():
        for i in range(adapter.n_layers):
            x = adapter.layer(i, x, skip, mlp, cap)
            out.append(x)
    return out


def resolve_source(source: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The model directory of ``source`` (``minilm``, a model dir, a training run dir) and
    its config.json."""
    from attnrank.io.checkpoint import model_dir, read_config

    path = model_dir(source, "collapse")
    return path, read_config(path)


@dataclass
class LoadedModel:
    path: Path
    model_type: str
    config: dict[str, Any]
    make: Callable[[str, int], Any]  # (init, seed) → adapter
    vocab_size: int
    max_positions: int | None
    n_heads: int


class _quiet_transformers:
    """transformers' warnings and progress bars off for the block, then restored."""

    def __enter__(self):
        import transformers

        self.tf = transformers
        self.level = transformers.logging.get_verbosity()
        self.bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        return transformers

    def __exit__(self, *exc):
        self.tf.logging.set_verbosity(self.level)
        if self.bars:
            self.tf.utils.logging.enable_progress_bar()
        return False


def load(source: str | os.PathLike, dtype: torch.dtype = torch.float64) -> LoadedModel:
    """Open a model for :func:`analyze`: a factory of adapters for each init."""
    path, cfg = resolve_source(source)
    mt = cfg.get("model_type")
    if mt == PROJECT_TYPE:
        from attnrank.models.transformer import Transformer, load_model

        if cfg.get("architecture", "Transformer") != "Transformer":
            raise AttnRankError(f"{path}: collapse runs on the project's Transformer, not {cfg.get('architecture')!r}")
        pretrained = load_model(path)

        def make_project(init: str, seed: int):
            if init == "pretrained":
                m = pretrained
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    m = Transformer(pretrained.config)
            return _ProjectAdapter(m.to(dtype).eval())

        c = pretrained.config
        return LoadedModel(path, mt, cfg, make_project, c.vocab_size, c.max_seq_len, c.n_heads)
    if mt not in FAMILIES:
        known = ", ".join(sorted([*FAMILIES, PROJECT_TYPE]))
        raise AttnRankError(f"collapse does not support model_type {mt!r}; supported: {known}")
    try:
        with _quiet_transformers() as tf:
            config = tf.AutoConfig.from_pretrained(path, local_files_only=True)
            pretrained = tf.AutoModel.from_pretrained(path, config=config, attn_implementation="eager",
                                                      dtype=dtype, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - corrupt/mismatched files surface as many exception types
        raise AttnRankError(f"cannot load {path} with transformers: {' '.join(str(e).split())[:300]}") from None
    pretrained.eval()
    family = FAMILIES[mt]

    def make_hf(init: str, seed: int):
        if init == "pretrained":
            m = pretrained
        else:
            with torch.random.fork_rng(devices=[]), _quiet_transformers() as tf:
                torch.manual_seed(seed)
                m = tf.AutoModel.from_config(config, attn_implementation="eager", dtype=dtype)
            m.eval()
        return _HFAdapter(m, family)

    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if mt in ("roberta", "xlm-roberta") and max_pos:
        max_pos -= (getattr(config, "pad_token_id", 1) or 1) + 1  # positions start after the padding index
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    return LoadedModel(path, mt, cfg, make_hf, int(config.vocab_size), max_pos, int(n_heads))


# --------------------------------------------------------------------------- text


def tokenize(texts: Sequence[str], model_dir: Path, vocab_size: int, max_tokens: int) -> tuple[list[list[int]], str]:
    """Token ids per text with the model's own ``tokenizer.json`` (truncated to
    ``max_tokens``); without one, UTF-8 bytes modulo the vocabulary size."""
    tj = Path(model_dir) / "tokenizer.json"
    if tj.exists():
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(tj))
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad input file
            raise AttnRankError(f"cannot read {tj}: {' '.join(str(e).split())[:200]}") from None
        tok.no_padding()
        tok.enable_truncation(max_length=max_tokens)
        ids = [enc.ids for enc in tok.encode_batch(list(texts))]
        return ids, f"tokenizer.json ({tj}), truncated to {max_tokens} tokens"
    ids = [[b % vocab_size for b in t.encode("utf-8")][:max_tokens] for t in texts]
    return ids, f"no tokenizer.json: UTF-8 bytes modulo vocab_size={vocab_size}, first {max_tokens}"


def text_batch(n: int, min_words: int = 10, split: str = "test") -> list[str]:
    """The first ``n`` sentences of the standard-library corpus split (default: test)."""
    from attnrank.models import corpus

    return corpus.sentences(split, n, min_words=min_words)


# --------------------------------------------------------------------------- analysis


@dataclass
class CollapseResult:
    """Per-layer collapse measures of every (init, variant); see :func:`analyze`."""

    table: pd.DataFrame                       # tidy: init, variant, layer, measure, mean, std, n
    values: dict[str, np.ndarray]             # "init/variant" → (seqs, layers+1, measures)
    paths: pd.DataFrame                       # sampled attention-path products (pretrained, full)
    meta: dict[str, Any]
    path_counts: list[int] = field(default_factory=list)

    def summary(self, measure: str = PRIMARY) -> pd.DataFrame:
        """One row per (init, variant): the measure at the first and last layer and their ratio."""
        t = self.table[self.table.measure == measure]
        last = int(t.layer.max())
        rows = []
        for (init, variant), g in t.groupby(["init", "variant"], sort=False):
            g = g.set_index("layer")
            first_v, last_v = float(g.loc[0, "mean"]), float(g.loc[last, "mean"])
            rows.append({"init": init, "variant": variant, "first": first_v, "first_std": float(g.loc[0, "std"]),
                         "last": last_v, "last_std": float(g.loc[last, "std"]),
                         "last_over_first": last_v / first_v if first_v else math.nan})
        return pd.DataFrame(rows)

    def path_summary(self) -> pd.DataFrame:
        if self.paths.empty:
            return pd.DataFrame(columns=["length", "n_paths", "mean", "std", "samples"])
        g = self.paths.groupby("length")["residual"]
        out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "samples": g.size()}).reset_index()
        out.insert(1, "n_paths", [self.path_counts[k] if k < len(self.path_counts) else None for k in out.length])
        return out


def analyze(source: str | os.PathLike, *, n_seqs: int = 32, max_tokens: int = 64, min_tokens: int = 8,
            inits: Sequence[str] = INITS, variants: Sequence[str] = VARIANTS, seed: int = 0,
            dtype: torch.dtype = torch.float64, path_samples: int = 32, texts: Sequence[str] | None = None,
            threads: int | None = None, progress: Callable[[int, int], None] | None = None) -> CollapseResult:
    """Run ``n_seqs`` real sentences through ``source`` and its variants; measure every layer.

    Sequences are run one at a time (no padding). ``texts`` overrides the corpus sentences.
    Path products use the pretrained (or the first init's) unmodified forward pass.
    ``threads`` sets torch's intra-op threads for the call (restored after); one thread is
    much faster for small models on a busy machine.
    """
    with torch_threads(threads):
        return _analyze(source, n_seqs=n_seqs, max_tokens=max_tokens, min_tokens=min_tokens, inits=inits,
                        variants=variants, seed=seed, dtype=dtype, path_samples=path_samples, texts=texts,
                        progress=progress)


def _analyze(source, *, n_seqs, max_tokens, min_tokens, inits, variants, seed, dtype, path_samples, texts,
             progress) -> CollapseResult:
    if n_seqs < 2:
        raise AttnRankError(f"n_seqs must be >= 2 (a mean and a spread over a batch), got {n_seqs}")
    if not 2 <= min_tokens <= max_tokens:
        raise AttnRankError(f"need 2 <= min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
    for i in inits:
        if i not in INITS:
            raise AttnRankError(f"unknown init {i!r}; use {', '.join(INITS)}")
    for v in variants:
        if v not in VARIANT_SWITCHES:
            raise AttnRankError(f"unknown variant {v!r}; use one of {', '.join(VARIANTS)}")
    t0 = time.perf_counter()
    lm = load(source, dtype)
    if lm.max_positions:
        max_tokens = min(max_tokens, int(lm.max_positions))
    if texts is None:
        pool = text_batch(4 * n_seqs + 16)
    else:
        pool = list(texts)
    ids_all, tok_desc = tokenize(pool, lm.path, lm.vocab_size, max_tokens)
    chosen = [(t, ids) for t, ids in zip(pool, ids_all, strict=True) if len(ids) >= min(min_tokens, max_tokens)]
    chosen = chosen[:n_seqs]
    if len(chosen) < 2:
        raise AttnRankError(f"fewer than 2 texts have >= {min_tokens} tokens")
    adapters = {init: lm.make(init, seed) for init in inits}
    skipped = []
    if not all(a.has_mlp() for a in adapters.values()):
        skipped = [v for v in variants if VARIANT_SWITCHES[v][1]]
        variants = [v for v in variants if not VARIANT_SWITCHES[v][1]]
    vals = {f"{i}/{v}": [] for i in inits for v in variants}
    path_frames = []
    path_init = "pretrained" if "pretrained" in inits else inits[0]
    total, done = len(chosen) * len(inits), 0
    for s, (_, ids) in enumerate(chosen):
        x_ids = torch.tensor([ids])
        for init in inits:
            ad = adapters[init]
            cap = ad.reference(x_ids)
            for v in variants:
                hs = run_variant(ad, cap, v)
                X = torch.stack([h[0] for h in hs])  # (L+1, n, d)
                m = token_measures(X)
                vals[f"{init}/{v}"].append(np.stack([m[k] for k in MEASURES], -1))
            if init == path_init and path_samples > 0 and all(p is not None for p in cap["probs"]):
                probs = torch.stack([p[0] for p in cap["probs"]])
                pf = path_products(probs, n_samples=path_samples, seed=seed + s)
                pf.insert(0, "seq", s)
                path_frames.append(pf)
            done += 1
            if progress is not None:
                progress(done, total)
    values = {k: np.stack(v) for k, v in vals.items()}
    rows = []
    for key, arr in values.items():
        init, variant = key.split("/")
        for layer in range(arr.shape[1]):
            for j, meas in enumerate(MEASURES):
                col = arr[:, layer, j]
                rows.append({"init": init, "variant": variant, "layer": layer, "measure": meas,
                             "mean": float(np.mean(col)), "std": float(np.std(col, ddof=1)), "n": int(col.size)})
    table = pd.DataFrame(rows)
    ad0 = next(iter(adapters.values()))
    counts = path_counts(ad0.n_layers, lm.n_heads)
    meta = {
        "source": str(source), "path": str(lm.path), "model_type": lm.model_type,
        "n_layers": ad0.n_layers, "n_heads": lm.n_heads, "inits": list(inits), "variants": list(variants),
        "variants_unavailable": skipped, "variant_labels": {v: VARIANT_LABELS[v] for v in variants},
        "n_seqs": len(chosen), "tokens_per_seq": [len(ids) for _, ids in chosen],
        "texts": [t for t, _ in chosen], "tokenization": tok_desc, "seed": seed, "dtype": str(dtype).replace("torch.", ""),
        "random_init": "the architecture's own initialiser (transformers from_config / attnrank Transformer), "
                       f"torch.manual_seed({seed}) in a forked RNG",
        "measures": list(MEASURES), "primary": PRIMARY,
        "conventions": {
            "layer": "0 = embedding output (input of layer 1), l = output of layer l (before any final norm)",
            "res_<norm>": "|X - 1 x^T| / |X| with x = mean row; l1 = max column abs-sum, linf = max row abs-sum, "
                          "composite = sqrt(l1 * linf), fro = Frobenius",
            "res_best_l1": "x = column-wise median (the exact l1 minimiser)",
            "cosine": "mean cosine similarity over pairs of distinct tokens",
            "effective_rank": "exp(H(s / sum s)) of X", "stable_rank": "sum s^2 / s_1^2 of X",
            "surgery": "skip removed: x + f(x) -> f(x); MLP removed: its whole sublayer (post-norm: with its "
                       "LayerNorm); attention sublayer keeps its norm; attention modules are called with the "
                       "unmodified model's own arguments (mask, positions, rotary tables)",
            "std": "sample std (ddof = 1) over sequences",
            "paths": "products of the unmodified model's attention matrices along sampled head paths "
                     f"({path_init} weights); residual = res_composite of the product",
        },
        "runtime_s": time.perf_counter() - t0,
    }
    if lm.model_type == PROJECT_TYPE and path_samples > 0:
        meta["path_restricted"] = _project_paths(adapters.get("pretrained", ad0).model, chosen)
    paths = pd.concat(path_frames, ignore_index=True) if path_frames else pd.DataFrame(
        columns=["seq", "length", "path", "residual"])
    return CollapseResult(table=table, values=values, paths=paths, meta=meta, path_counts=counts)


def _project_paths(model, chosen) -> dict[str, Any]:
    """:func:`path_restricted` on each sequence, where the project's model allows it."""
    cfg = model.config
    if not cfg.skip or cfg.mlp or cfg.bias:
        return {"available": False, "why": "path decomposition needs skip=True, mlp=False, bias=False"}
    logs, shares, err = [], [], 0.0
    for _, ids in chosen:
        out = path_restricted(model, torch.tensor([ids]))
        logs.append(np.log(np.maximum(out["residual"][:, 0], 1e-300)))
        shares.append(out["norm_share"][:, 0])
        err = max(err, out["sum_rel_error"])
    return {"available": True, "residual_by_length": np.exp(np.mean(logs, 0)).tolist(),
            "norm_share_by_length": np.mean(shares, 0).tolist(), "sum_rel_error": err,
            "note": "geometric mean over sequences of res_composite of the length-k part; attention frozen"}


def save(result: CollapseResult, out: str | os.PathLike, *, plots: bool = True) -> list[Path]:
    """Write ``layers.csv``, ``summary.csv``, ``paths.csv``, ``collapse.npz``, ``meta.json``
    and figures into ``out``, each atomically."""
    from attnrank.util.fileio import prepare_out_dir, write_atomic, write_json

    out = prepare_out_dir(out)
    written = [
        write_atomic(out / "layers.csv", lambda p: result.table.to_csv(p, index=False)),
        write_atomic(out / "summary.csv", lambda p: result.summary().to_csv(p, index=False)),
        write_atomic(out / "paths.csv", lambda p: result.path_summary().to_csv(p, index=False)),
        write_atomic(out / "collapse.npz", lambda p: _save_npz(p, result)),
        write_json(out / "meta.json", {**result.meta, "path_counts": [str(c) for c in result.path_counts]}),
    ]
    if plots:
        from attnrank.analysis import plots as P

        written.append(P.save_figure(P.collapse_layers(result.table, result.meta), out / "collapse_layers.png"))
        if not result.paths.empty:
            written.append(P.save_figure(P.collapse_path_products(result.path_summary(), result.meta, result.paths),
                                         out / "path_products.png"))
    return written


def _save_npz(p: Path, result: CollapseResult) -> None:
    arrays = {k.replace("/", "__"): v for k, v in result.values.items()}
    with open(p, "wb") as fh:
        np.savez_compressed(fh, measures=np.array(MEASURES), **arrays)


# --------------------------------------------------------------------------- depth sweep


def byte_batch(n_seqs: int, length: int, split: str = "test") -> torch.Tensor:
    """``n_seqs`` corpus sentences as UTF-8 byte ids (vocab 256), the first ``length`` bytes of
    each sentence that has at least that many."""
    from attnrank.models import corpus

    out: list[list[int]] = []
    for s in corpus.sentences(split, None, min_words=6):
        b = list(s.encode("utf-8"))
        if len(b) >= length:
            out.append(b[:length])
            if len(out) == n_seqs:
                break
    if len(out) < n_seqs:
        raise AttnRankError(f"the corpus split {split!r} has only {len(out)} sentences of >= {length} bytes")
    return torch.tensor(out)


def pure_attention_config(n_layers: int, init_std: float, *, d_model: int = 64, n_heads: int = 4,
                          max_seq_len: int = 64, skip: bool = False, mlp: bool = False, norm: str = "none"):
    """The project's Transformer as a self-attention network: skips, MLP and norms as given
    (default: none of them), bidirectional attention, learned positions, byte vocabulary."""
    from attnrank.models.transformer import ModelConfig

    return ModelConfig(vocab_size=256, max_seq_len=max_seq_len, n_layers=n_layers, d_model=d_model,
                       n_heads=n_heads, mlp=mlp, skip=skip, norm=norm, causal=False, init_std=init_std)


def fit_depth(depth: np.ndarray, log_r: np.ndarray, kappas: np.ndarray | None = None) -> dict[str, Any]:
    """Least-squares fits of ``log r`` against depth L:

    - exponential ``a + b L`` (r decays like e^{bL});
    - doubly exponential ``a + b κ^L`` with κ > 1 fitted (profile least squares over a grid
      of κ, then exact a, b), and with κ = 3 fixed (the exponent 3^L of the paper's bound).

    R² on ``log r``. Needs at least 4 points."""
    L = np.asarray(depth, dtype=float)
    y = np.asarray(log_r, dtype=float)
    if L.size < 4:
        return {"n_points": int(L.size), "fitted": False}
    tss = float(((y - y.mean()) ** 2).sum())

    def lin(feature):
        A = np.stack([np.ones_like(L), feature], 1)
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        rss = float(((y - A @ coef) ** 2).sum())
        return coef, rss

    ce, rss_e = lin(L)
    kappas = np.linspace(1.01, 10.0, 900) if kappas is None else kappas
    best = min(((k, *lin(k**L)) for k in kappas), key=lambda t: t[2])
    k_best, cd, rss_d = best
    c3, rss_3 = lin(3.0**L)

    def r2(rss):
        return 1.0 - rss / tss if tss > 0 else math.nan

    return {"n_points": int(L.size), "fitted": True, "depths": L.tolist(),
            "exp": {"a": float(ce[0]), "b": float(ce[1]), "r2": r2(rss_e)},
            "dexp": {"a": float(cd[0]), "b": float(cd[1]), "kappa": float(k_best), "r2": r2(rss_d)},
            "dexp3": {"a": float(c3[0]), "b": float(c3[1]), "kappa": 3.0, "r2": r2(rss_3)}}


FLOOR = 1e-12  # float64 residuals below this are rounding noise (they bottom out near 1e-16)


def depth_sweep(n_layers: int = 12, init_stds: Sequence[float] = (0.02, 0.2, 0.3, 0.5), seeds: Sequence[int] = (0, 1, 2),
                n_seqs: int = 16, length: int = 32, d_model: int = 64, n_heads: int = 4,
                floor: float = FLOOR, skip: bool = False, mlp: bool = False, norm: str = "none") -> dict[str, Any]:
    """Pure self-attention (the project's Transformer; by default no skip, no MLP, no norm),
    randomly initialised (weights N(0, init_std²)), float64: residual ``res_composite`` after
    every depth 0..n_layers for real byte sequences; per init scale, the geometric mean over
    seeds × sequences and :func:`fit_depth` over the depths before the curve first drops below
    ``floor``."""
    from attnrank.models.transformer import Transformer

    ids = byte_batch(n_seqs, length)
    out: dict[str, Any] = {"depths": list(range(n_layers + 1)), "init_stds": list(init_stds), "seeds": list(seeds),
                           "n_seqs": n_seqs, "length": length, "d_model": d_model, "n_heads": n_heads,
                           "floor": floor, "skip": skip, "mlp": mlp, "norm": norm, "curves": {}}
    for std in init_stds:
        logs = []
        for seed in seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = Transformer(pure_attention_config(n_layers, std, d_model=d_model, n_heads=n_heads,
                                                          max_seq_len=max(64, length), skip=skip, mlp=mlp,
                                                          norm=norm))
            model = model.double().eval()
            with torch.no_grad():
                _, hidden = model(ids, return_hidden=True)
            r = residual(torch.stack(hidden, 1), "composite")  # (seqs, L+1)
            logs.append(np.log(np.maximum(r, 1e-300)))
        logr = np.concatenate(logs)  # (seeds·seqs, L+1)
        geo = np.exp(logr.mean(0))
        above = geo > floor
        n_fit = int(np.argmin(above)) if not above.all() else above.size
        out["curves"][f"{std:g}"] = {"geo_mean": geo.tolist(), "log_mean": logr.mean(0).tolist(),
                                     "log_std": logr.std(0).tolist(), "n_fit": n_fit,
                                     "fit": fit_depth(np.arange(n_fit), logr.mean(0)[:n_fit])}
    return out


# --------------------------------------------------------------------------- paths in the project's model


def _frozen_norm(norm: torch.nn.Module, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``norm`` applied to ``z`` with the per-token scale it has on ``x`` (linear in z)."""
    if isinstance(norm, torch.nn.Identity):
        return z
    if not isinstance(norm, torch.nn.LayerNorm) or norm.bias is not None:
        raise AttnRankError("path decomposition needs LayerNorms without bias (or no norm)")
    var = x.var(-1, unbiased=False, keepdim=True)
    zc = z - z.mean(-1, keepdim=True)
    out = zc / torch.sqrt(var + norm.eps)
    return out * norm.weight if norm.weight is not None else out


def _frozen_attention(attn, z: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """The attention module's own value and output projections with fixed probabilities."""
    B, T, _ = z.shape
    v = attn.v(z).view(B, T, attn.n_kv_heads, attn.head_dim).transpose(1, 2)
    v = v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    y = probs @ v
    return attn.o(y.transpose(1, 2).reshape(B, T, attn.n_heads * attn.head_dim))


def path_restricted(model, ids: torch.Tensor) -> dict[str, Any]:
    """The project's Transformer restricted to paths of each length k = 0..L.

    With the attention probabilities and the norms' per-token scales frozen at their values in
    the full forward pass, each block is linear in its input, so the final residual stream is
    exactly ``Σ_k Y_k`` with ``Y_k`` the sum over the ``C(L,k)·H^k`` paths through k heads
    (one per chosen layer). Needs skips, no MLP, no biases. Returns ``Y`` (L+1, B, T, d),
    the model's own final hidden state, and per k the residual ``res_composite`` (per
    sequence) and the Frobenius norm share.
    """
    cfg = model.config
    if not cfg.skip or cfg.mlp or cfg.bias:
        raise AttnRankError("path decomposition needs skip=True, mlp=False, bias=False")
    with torch.no_grad():
        _, hidden = model(ids, return_hidden=True)
        L = len(model.blocks)
        Y = [hidden[0]] + [torch.zeros_like(hidden[0]) for _ in range(L)]
        for block, x in zip(model.blocks, hidden[:-1], strict=True):
            if block.placement == "post":
                s = x + block.attn(x)  # the sum the post-norm normalises
                probs = block.attn.attention_probs(x)
                new = [Y[0]] + [Y[k] + _frozen_attention(block.attn, Y[k - 1], probs) for k in range(1, L + 1)]
                Y = [_frozen_norm(block.attn_norm, y, s) for y in new]
                continue
            xn = block.attn_norm(x)
            probs = block.attn.attention_probs(xn)
            Y = [Y[0]] + [Y[k] + _frozen_attention(block.attn, _frozen_norm(block.attn_norm, Y[k - 1], x), probs)
                          for k in range(1, L + 1)]
        Ys = torch.stack(Y)
    total = Ys.sum(0)
    err = float((total - hidden[-1]).norm() / hidden[-1].norm())
    fro = Ys.flatten(2).norm(dim=-1)  # (L+1, B)
    return {"Y": Ys, "output": hidden[-1], "sum_rel_error": err,
            "residual": residual(Ys, "composite"),  # (L+1, B)
            "norm_share": (fro / fro.sum(0, keepdim=True)).numpy()}
