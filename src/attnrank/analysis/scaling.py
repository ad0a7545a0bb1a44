"""Scale invariance and weight decay (REFERENCE.md §5; source document 002).

Two parts.

**Measurement on any model** (:func:`scale_test`, :func:`pair_symmetries`, :func:`analyze_scaling`,
behind ``attnrank scale MODEL``). The function ``f`` is the model's output on fixed real inputs
(the final hidden states of a Hugging Face base model on English sentences, the logits of the
project's own model on its task's sequences), computed in float64. For each parameter tensor
(or a named group of tensors, scaled together) and each factor ``c`` in ``scales``:

- ``inv_dev  = max_c ‖f(cW) − f(W)‖ / ‖f(W)‖``                       (0 for scale-invariant W);
- ``k``: least-squares fit of ``log r_c = k log c`` with ``r_c = ⟨f(cW), f(W)⟩ / ‖f(W)‖²``;
- ``hom_dev  = max_c ‖f(cW) − cᵏ f(W)‖ / ‖cᵏ f(W)‖``                  (0 for W homogeneous of degree k).

Verdicts, in this order: ``zero`` (every entry is 0, so scaling is a no-op and says nothing),
``no effect`` (inv_dev ≤ tol and a random perturbation of W's own size also leaves f unchanged:
f does not depend on W on these inputs, e.g. BERT's key bias, which softmax cancels),
``invariant`` (inv_dev ≤ tol), ``homogeneous`` (hom_dev ≤ tol, degree k), else ``neither``.
A LayerNorm's ε makes invariance approximate: ``LN(cx)`` differs from ``LN(x)`` by about
``ε/(2 var(x))·|1/c² − 1|``, which matters once activations are small. Verdicts are therefore
measured with every normalisation ε set to 0 (they describe the architecture), and for the
invariant tensors ``inv_dev_eps`` gives the deviation of the real function, ε included.
Scale factors are not powers of two (multiplying by 2 and 1/2 is exact in floating point).

Per attention head, the pair symmetries (found through the layout table, :mod:`attnrank.io.layouts`,
so fused, interleaved, Conv1D and grouped-query layouts are handled the same way):

- QK: ``W_Q,h → c W_Q,h`` (and its bias), ``W_K,h → W_K,h / c`` (and its bias);
- OV: ``W_V,h → c W_V,h`` (and its bias), ``P_h → P_h / c`` (head h's columns of W_O).

Both leave the function unchanged; the one-sided change (only W_Q,h or only W_V,h) is measured
beside it as a control that does change it. With grouped-query attention a kv head is shared,
so the symmetry acts on a kv head and all its query heads together (one row per kv head).
Pair deviations are measured at the output of the layer's attention module (its inputs captured
from one forward pass of the whole model); one whole-model check scales every head of every
layer at once, with a different random c per head.

**The experiment** (:func:`train_runs`, reproduction ``scale``): a ReLU MLP with LayerNorm
on scikit-learn's digits in three variants (``N`` = LayerNorm, ``h₀ = x`` the standardised input):

- ``none`` (no residual):   ``h ← N(ReLU(W h))``,        logits = ``A h + b``
- ``post`` (post-norm):     ``h ← h + N(ReLU(W h))``,    logits = ``A h + b``
- ``pre``  (pre-norm):      ``h ← h + ReLU(W N(h))``,    logits = ``A N(h) + b``

Each W is scale-invariant in ``none`` and ``post`` and not in ``pre``. Decay λ is applied to the
block matrices W only (the head A, b and the LayerNorm gains are not decayed: decaying A would
change the logits' scale in every variant). All runs of a variant train together as one
batched computation on the same minibatches from the same initialisation, so λ is the only
difference. The input is added to the stream without a weight in front of it: a pre-norm net
whose stream starts at a decayed, bias-free embedding is jointly scale-invariant in all its
matrices (``h → ch`` through every block), which the tests show with a group.

Optimisers (batched re-implementations of ``torch.optim.SGD`` with momentum and coupled L2, and
``torch.optim.AdamW``, tested against them) track per step the norm, the effective learning rate
η/‖W‖², the angle W turns by, the gradient norm and cos(∇L, W). Every minibatch gets fresh
Gaussian input noise: without it the net interpolates the 1,300 training images, the gradient
noise dies out and the equilibrium that the predictions (angular update √(2ηλ/(1+β)), norm
‖W‖² = η E‖g‖²/(2λ(1−β)); AdamW ‖W‖ ∝ √(η/λ)) describe never forms (the reproduction reports
that case in a note).
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from attnrank.errors import AttnRankError
from attnrank.io.layouts import SPLITS, Dims, Layout, layout_for

# Not powers of two: multiplying by 2 and by 1/2 is exact in floating point, which would make a
# pair symmetry hold bit for bit and hide how closely it holds in ordinary arithmetic.
DEFAULT_SCALES: tuple[float, ...] = (0.3, 1.7, 4.1)
DEFAULT_TOL = 1e-6
VERDICTS = ("invariant", "homogeneous", "neither", "no effect", "zero")


# =========================================================================== per-tensor test


def parse_scales(text: str) -> tuple[float, ...]:
    """``"0.3,1.7,4.1"`` → (0.3, 1.7, 4.1), checked."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise AttnRankError(f"--scales must be comma-separated numbers, got {text!r}") from None
    return check_scales(vals)


def check_scales(scales: Iterable[float]) -> tuple[float, ...]:
    out = tuple(float(c) for c in scales)
    if not out:
        raise AttnRankError("give at least one scale factor c")
    for c in out:
        if not (math.isfinite(c) and c > 0 and c != 1.0):
            raise AttnRankError(f"scale factors must be positive, finite and != 1; got {c:g}")
    return out


def _flat(y: Any) -> torch.Tensor:
    if isinstance(y, torch.Tensor):
        return y.detach().reshape(-1).to(torch.float64)
    if isinstance(y, list | tuple):
        return torch.cat([_flat(t) for t in y])
    raise TypeError(f"forward returned {type(y).__name__}, not a tensor")


def classify_outputs(y0: torch.Tensor, ys: dict[float, torch.Tensor], tol: float = DEFAULT_TOL) -> dict[str, Any]:
    """Deviations of f(cW) from f(W) (invariance) and from cᵏ f(W) (homogeneity, k fitted).

    ``ys`` maps c → f(cW). Returns ``inv_dev``, ``hom_dev``, ``k``, ``k_spread`` (max − min of the
    per-c degrees log r_c / log c) and ``verdict`` (``invariant`` / ``homogeneous`` / ``neither``).
    """
    y0 = _flat(y0)
    n0 = float(torch.linalg.vector_norm(y0))
    if not math.isfinite(n0) or n0 == 0.0:
        raise AttnRankError("the model's output is zero or not finite on the probe inputs: nothing to compare")
    inv, logc, logr = [], [], []
    for c, y in ys.items():
        y = _flat(y)
        if not bool(torch.isfinite(y).all()):
            inv.append(math.inf)
            logc.append(math.log(c))
            logr.append(math.nan)
            continue
        inv.append(float(torch.linalg.vector_norm(y - y0)) / n0)
        r = float(y @ y0) / n0**2
        logc.append(math.log(c))
        logr.append(math.log(r) if r > 0 else math.nan)
    lc, lr = np.array(logc), np.array(logr)
    if np.isfinite(lr).all():
        k = float((lc * lr).sum() / (lc * lc).sum())
        per_c = lr / lc
        k_spread = float(per_c.max() - per_c.min())
        hom = []
        for c, y in ys.items():
            ref = c**k * y0
            hom.append(float(torch.linalg.vector_norm(_flat(y) - ref) / torch.linalg.vector_norm(ref)))
        hom_dev = max(hom)
    else:
        k, k_spread, hom_dev = math.nan, math.nan, math.inf
    inv_dev = max(inv)
    if inv_dev <= tol:
        verdict = "invariant"
    elif hom_dev <= tol:
        verdict = "homogeneous"
    else:
        verdict = "neither"
    return {"inv_dev": inv_dev, "hom_dev": hom_dev, "k": k, "k_spread": k_spread, "verdict": verdict}


@contextmanager
def scaled(params: Sequence[torch.Tensor], c: float):
    """Multiply ``params`` in place by ``c``; restore them exactly (from a copy) on exit."""
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.mul_(c)
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)


@contextmanager
def perturbed(params: Sequence[torch.Tensor], seed: int = 0):
    """Add seeded Gaussian noise of each tensor's own RMS size; restore exactly on exit."""
    saved = [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(seed)
    try:
        with torch.no_grad():
            for p in params:
                rms = float(p.detach().double().pow(2).mean().sqrt())
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
                p.add_(noise * (rms if rms > 0 else 1.0))
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)


_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


def _norm_modules(model: nn.Module) -> list[tuple[nn.Module, str, float]]:
    """(module, attribute, value) of every normalisation layer's epsilon: torch's norm layers,
    any module whose class name contains "Norm" (Hugging Face LayerNorm/RMSNorm variants), and
    modules that list their epsilon attributes in ``_norm_eps_attrs``."""
    out = []
    for m in model.modules():
        attrs: tuple[str, ...] = getattr(m, "_norm_eps_attrs", ())
        if not attrs and ("norm" in type(m).__name__.lower()):
            attrs = _EPS_ATTRS
        for a in attrs:
            v = getattr(m, a, None)
            if isinstance(v, float):
                out.append((m, a, v))
    return out


@contextmanager
def norm_eps_zero(model: nn.Module):
    """Set every normalisation epsilon of ``model`` to 0 (restored on exit).

    With ε = 0 a LayerNorm is exactly scale-invariant, so verdicts measured inside this context
    are about the architecture; ε only matters once activations are small (their variance near ε).
    """
    found = _norm_modules(model)
    try:
        for m, a, _ in found:
            setattr(m, a, 0.0)
        yield [f"{type(m).__name__}.{a}={v:g}" for m, a, v in found]
    finally:
        for m, a, v in found:
            setattr(m, a, v)


def resolve_groups(names: Sequence[str], groups: dict[str, Sequence[str]] | None) -> dict[str, list[str]]:
    """Group name → parameter names matching any of its fnmatch patterns (or exact names)."""
    out: dict[str, list[str]] = {}
    for g, patterns in (groups or {}).items():
        members = [n for n in names if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not members:
            raise AttnRankError(f"group {g!r}: no parameter matches {', '.join(patterns)}")
        out[g] = members
    return out


def scale_test(model: nn.Module, forward: Callable[[], Any], *, names: Sequence[str] | None = None,
               groups: dict[str, Sequence[str]] | None = None, scales: Iterable[float] = DEFAULT_SCALES,
               tol: float = DEFAULT_TOL, seed: int = 0, exhaustive: bool = False, structural: bool = True,
               progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """One row per parameter tensor (and per group): verdict and measured deviations.

    ``forward()`` must return the model's output on fixed inputs (a tensor or a tuple of them),
    deterministically (eval mode). Parameters are changed in place and restored exactly.
    Unless ``exhaustive``, a tensor stops being tested at the first c where f(cW) is neither
    f(W) nor parallel to it (``scales_tested`` says how many c were used; k then comes from those).

    ``structural`` (default): verdicts are measured with every normalisation ε set to 0
    (:func:`norm_eps_zero`), so they describe the architecture; for tensors found invariant,
    ``inv_dev_eps`` is then the deviation of the real function (ε restored). If the output is
    not finite with ε = 0 (a constant row normalised by 0), the real function is used instead
    and the attribute ``structural`` of the returned frame's ``attrs`` says so.
    """
    scales = check_scales(scales)
    if structural:
        with norm_eps_zero(model) as eps_list:
            with torch.no_grad():
                finite = bool(torch.isfinite(_flat(forward())).all())
            if finite:
                table = _scale_test(model, forward, names, groups, scales, tol, seed, exhaustive, progress)
        if finite:
            inv_eps = []
            with torch.no_grad():
                y0 = _flat(forward())
                params = dict(model.named_parameters())
                groups_r = resolve_groups(list(params), groups)
                for _, row in table.iterrows():
                    if row["verdict"] != "invariant":
                        inv_eps.append(math.nan)
                        continue
                    ps = [params[m] for m in (groups_r[row["name"]] if row["kind"] == "group" else [row["name"]])]
                    devs = []
                    for c in scales:
                        with scaled(ps, c):
                            devs.append(float(torch.linalg.vector_norm(_flat(forward()) - y0) / torch.linalg.vector_norm(y0)))
                    inv_eps.append(max(devs))
            table["inv_dev_eps"] = inv_eps
            table.attrs.update(structural=True, norm_eps=eps_list)
            return table
    table = _scale_test(model, forward, names, groups, scales, tol, seed, exhaustive, progress)
    table["inv_dev_eps"] = table["inv_dev"].where(table["verdict"] == "invariant")
    table.attrs.update(structural=False, norm_eps=[f"{type(m).__name__}.{a}={v:g}" for m, a, v in _norm_modules(model)])
    return table


def _scale_test(model, forward, names, groups, scales, tol, seed, exhaustive, progress) -> pd.DataFrame:
    if not tol > 0:
        raise AttnRankError(f"tolerance must be > 0, got {tol}")
    params = dict(model.named_parameters())
    names = list(params) if names is None else list(names)
    missing = [n for n in names if n not in params]
    if missing:
        raise AttnRankError(f"no parameter named {missing[0]!r}")
    items: list[tuple[str, str, list[str]]] = [(n, "tensor", [n]) for n in names]
    items += [(g, "group", m) for g, m in resolve_groups(list(params), groups).items()]
    with torch.no_grad():
        y0 = _flat(forward())
        if not bool(torch.isfinite(y0).all()):
            raise AttnRankError("the model's output is not finite on the probe inputs")
        rows = []
        for j, (label, kind, members) in enumerate(items):
            ps = [params[m] for m in members]
            numel = sum(p.numel() for p in ps)
            norm = math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in ps))
            row: dict[str, Any] = {"name": label, "kind": kind, "members": len(members),
                                   "shape": "x".join(map(str, ps[0].shape)) if kind == "tensor" else "",
                                   "numel": numel, "norm": norm}
            if norm == 0.0:
                row.update(verdict="zero", inv_dev=0.0, hom_dev=math.nan, k=math.nan, k_spread=math.nan,
                           perturb_dev=math.nan, scales_tested=0)
            else:
                ys = {}
                for c in scales:
                    with scaled(ps, c):
                        ys[c] = _flat(forward())
                    if not exhaustive and _clearly_neither(y0, ys[c], tol):
                        break  # f(cW) is neither f(W) nor proportional to it: no c can change that
                row.update(classify_outputs(y0, ys, tol))
                row["scales_tested"] = len(ys)
                row["perturb_dev"] = math.nan
                if row["verdict"] == "invariant":
                    with perturbed(ps, seed=seed + j):
                        yp = _flat(forward())
                    pd_ = float(torch.linalg.vector_norm(yp - y0) / torch.linalg.vector_norm(y0))
                    row["perturb_dev"] = pd_
                    if pd_ <= tol:
                        row["verdict"] = "no effect"
            rows.append(row)
            if progress:
                progress(j + 1, len(items))
    cols = ["name", "kind", "members", "shape", "numel", "norm", "verdict", "k", "inv_dev", "hom_dev",
            "k_spread", "perturb_dev", "scales_tested"]
    return pd.DataFrame(rows, columns=cols)


def _clearly_neither(y0: torch.Tensor, y: torch.Tensor, tol: float) -> bool:
    """f(cW) differs from f(W) and from every multiple a·f(W) by more than 2·tol (relative)."""
    if not bool(torch.isfinite(y).all()):
        return True
    n0, n = torch.linalg.vector_norm(y0), torch.linalg.vector_norm(y)
    if n == 0:
        return False
    r = (y @ y0) / n0**2
    return bool(torch.linalg.vector_norm(y - y0) / n0 > 2 * tol
                and torch.linalg.vector_norm(y - r * y0) / n > 2 * tol)


def verdict_counts(table: pd.DataFrame, kind: str = "tensor") -> dict[str, int]:
    t = table[table["kind"] == kind]
    return {v: int((t["verdict"] == v).sum()) for v in VERDICTS}


# =========================================================================== attention pair symmetries


@dataclass
class AttentionSite:
    """One layer's attention tensors in a live model, with head → entry index maps."""

    layer: int
    module_name: str
    weights: dict[str, str]  # role → parameter name
    biases: dict[str, str]  # role → parameter name of its bias (present ones only)
    index: Any  # HeadWeights of global float64 indices
    offsets: dict[str, tuple[int, int]]
    conv1d: bool


def _common_module(names: Iterable[str]) -> str:
    parts = [n.split(".")[:-2] for n in names]  # drop "<linear>.weight"
    common = []
    for segs in zip(*parts, strict=False):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


def attention_sites(model: nn.Module, layout: Layout, config: dict[str, Any]) -> tuple[list[AttentionSite], Dims]:
    """Find every layer's attention tensors of ``model`` through the layout table."""
    try:
        dims = layout.dims(config)
    except (KeyError, TypeError, ValueError) as e:
        raise AttnRankError(f"config lacks or garbles a size field: {e}") from None
    split = layout.split_for(config)
    params = dict(model.named_parameters())
    first = next(iter(layout.names(0).values()))
    prefixes = sorted({k[: -len(first)] for k in params if k.endswith(first)}, key=len)
    prefixes = [p for p in prefixes if p == "" or p.endswith(".")]
    if not prefixes:
        raise AttnRankError(f"model has no parameter named like {first!r} (layout {layout.model_types[0]!r})")
    prefix = prefixes[0]
    sites = []
    for i in range(dims.n_layers):
        weights = {r: prefix + n for r, n in layout.names(i).items()}
        absent = [n for n in weights.values() if n not in params]
        if absent:
            raise AttnRankError(f"model has no parameter {absent[0]!r}")
        raw, offsets, off = {}, {}, 0
        for role, name in weights.items():
            p = params[name]
            raw[role] = torch.arange(off, off + p.numel(), dtype=torch.float64).reshape(p.shape)
            offsets[role] = (off, off + p.numel())
            off += p.numel()
        try:
            index = SPLITS[split](raw, dims)
        except Exception as e:  # layouts._Shape: shapes contradict the config
            raise AttnRankError(f"layer {i}: attention tensors do not match the config "
                                f"({getattr(e, 'role', '')} {getattr(e, 'got', '')} vs {getattr(e, 'want', '')})") from None
        biases = {r: n.removesuffix(".weight") + ".bias" for r, n in weights.items() if r != "o"}
        biases = {r: n for r, n in biases.items() if n in params}
        sites.append(AttentionSite(i, _common_module(weights.values()), weights, biases, index, offsets,
                                   conv1d=split == "conv1d_fused"))
    return sites, dims


def _edits(site: AttentionSite, params: dict[str, torch.Tensor], sel: torch.Tensor, factor: float,
           with_bias: bool) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """(parameter, flat indices, factor) for the weight entries in ``sel`` (global indices),
    plus the bias entries of their output rows when ``with_bias``."""
    sel = sel.reshape(-1).to(torch.int64)
    out = []
    for role, (lo, hi) in site.offsets.items():
        local = sel[(sel >= lo) & (sel < hi)] - lo
        if local.numel() == 0:
            continue
        p = params[site.weights[role]]
        out.append((p, local, factor))
        if with_bias and role in site.biases:
            cols = p.shape[1]
            rows = (local % cols) if site.conv1d else (local // cols)
            out.append((params[site.biases[role]], torch.unique(rows), factor))
    return out


@contextmanager
def _applied(edits: list[tuple[torch.Tensor, torch.Tensor, float]]):
    touched = {id(p): p for p, _, _ in edits}
    saved = {k: p.detach().clone() for k, p in touched.items()}
    try:
        with torch.no_grad():
            for p, idx, f in edits:
                if not p.is_contiguous():
                    raise AttnRankError("cannot edit a non-contiguous parameter in place")
                flat = p.view(-1)
                flat[idx] = flat[idx] * f
        yield
    finally:
        with torch.no_grad():
            for k, p in touched.items():
                p.copy_(saved[k])


def pair_edits(site: AttentionSite, params: dict[str, torch.Tensor], kv_head: int, product: str, c: float,
               one_sided: bool = False) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """The in-place edits of a pair symmetry (or its one-sided control) for one kv head."""
    hw = site.index
    g = hw.group
    qheads = slice(kv_head * g, (kv_head + 1) * g)
    if product == "qk":
        e = _edits(site, params, hw.wq[qheads], c, True)
        if not one_sided:
            e += _edits(site, params, hw.wk[kv_head], 1.0 / c, True)
    elif product == "ov":
        e = _edits(site, params, hw.wv[kv_head], c, True)
        if not one_sided:
            e += _edits(site, params, hw.p[qheads], 1.0 / c, False)
    else:
        raise ValueError(product)
    return e


def _first_tensor(out: Any) -> torch.Tensor:
    while isinstance(out, list | tuple):
        out = out[0]
    if hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = _flat(a), _flat(b)
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def pair_symmetries(model: nn.Module, forward: Callable[[], Any], layout: Layout, config: dict[str, Any], *,
                    scales: Iterable[float] = DEFAULT_SCALES, seed: int = 0,
                    progress: Callable[[int, int], None] | None = None) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per kv head and product: deviation of the attention module's output under the pair
    symmetry (``pair_dev``, max over c) and under the one-sided control (``one_sided_dev``).

    Also returns whole-model deviations (every head of every layer scaled at once, a random
    c per head in [1/4, 4]) for each product, and the maximum deviation with the pair applied
    to the wrong partner (kv head j's K with query head group j+1's Q) as a second control.
    """
    scales = check_scales(scales)
    sites, dims = attention_sites(model, layout, config)
    params = dict(model.named_parameters())
    captured: dict[int, tuple] = {}
    hooks = []
    for s in sites:
        mod = model.get_submodule(s.module_name)

        def hook(m, args, kwargs, out, i=s.layer):
            captured[i] = (args, kwargs, _first_tensor(out).detach().clone())

        hooks.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            y0 = _flat(forward())
    finally:
        for h in hooks:
            h.remove()
    rows = []
    total = len(sites) * dims.n_kv_heads
    done = 0
    g = dims.n_heads // dims.n_kv_heads
    with torch.no_grad():
        for s in sites:
            mod = model.get_submodule(s.module_name)
            args, kwargs, ref = captured[s.layer]

            def local() -> torch.Tensor:
                return _first_tensor(mod(*args, **kwargs))  # noqa: B023 - called within this iteration

            base_dev = _rel(local(), ref)  # re-running the module reproduces the captured output
            for j in range(dims.n_kv_heads):
                for product in ("qk", "ov"):
                    pair, one = [], []
                    for c in scales:
                        with _applied(pair_edits(s, params, j, product, c)):
                            pair.append(_rel(local(), ref))
                        with _applied(pair_edits(s, params, j, product, c, one_sided=True)):
                            one.append(_rel(local(), ref))
                    rows.append({"layer": s.layer, "kv_head": j, "heads": f"{j * g}-{(j + 1) * g - 1}" if g > 1 else str(j),
                                 "product": product, "pair_dev": max(pair), "one_sided_dev": min(one),
                                 "rerun_dev": base_dev})
                done += 1
                if progress:
                    progress(done, total)
        # whole model: every head at once, a random c per head
        gen = torch.Generator().manual_seed(seed)
        whole = {}
        for product in ("qk", "ov"):
            edits = []
            for s in sites:
                for j in range(dims.n_kv_heads):
                    c = float(torch.exp(torch.empty(1).uniform_(math.log(0.25), math.log(4.0), generator=gen)))
                    edits += pair_edits(s, params, j, product, c)
            with _applied(edits):
                whole[product] = _rel(forward(), y0)
        # wrong partner: Q of query-head group j+1 scaled by c, K of kv head j by 1/c
        wrong = math.nan
        if dims.n_kv_heads > 1:
            s = sites[0]
            mod = model.get_submodule(s.module_name)
            args, kwargs, ref = captured[s.layer]
            c = scales[-1]
            e = _edits(s, params, s.index.wq[g:2 * g], c, True) + _edits(s, params, s.index.wk[0], 1.0 / c, True)
            with _applied(e):
                wrong = _rel(_first_tensor(mod(*args, **kwargs)), ref)
    extra = {"whole_model_qk": whole["qk"], "whole_model_ov": whole["ov"], "wrong_partner_qk_layer0": wrong}
    cols = ["layer", "kv_head", "heads", "product", "pair_dev", "one_sided_dev", "rerun_dev"]
    return pd.DataFrame(rows, columns=cols), extra


# =========================================================================== opening a model


def stdlib_sentences(n: int = 4, min_words: int = 8, max_words: int = 24) -> list[str]:
    """Real English text that ships with Python: sentences of standard-library docstrings."""
    import ast
    import textwrap

    out: list[str] = []
    for mod in (json, textwrap, ast, fnmatch):
        doc = (mod.__doc__ or "").replace("\n", " ")
        for s in doc.split(". "):
            if len(s.split()) >= min_words:
                out.append(" ".join(s.split()[:max_words]) + ".")
    return out[:n]


def digits_images(n: int, size: int, channels: int) -> torch.Tensor:
    """scikit-learn digits (8x8, values 0..16) scaled to [0, 1], resized to ``size`` and repeated
    over ``channels``: (n, channels, size, size) float64."""
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images[:n] / 16.0, dtype=torch.float64)[:, None]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="nearest")
    return x.repeat(1, channels, 1, 1)


@dataclass
class Probe:
    """A model in float64, eval mode, with the function ``forward()`` on fixed real inputs."""

    model: nn.Module
    forward: Callable[[], torch.Tensor]
    source: str
    kind: str  # "huggingface" | "attnrank"
    config: dict[str, Any]
    inputs: str
    layout: Layout | None
    layout_note: str = ""


def _layout_or_note(config: dict[str, Any]) -> tuple[Layout | None, str]:
    try:
        return layout_for(config), ""
    except AttnRankError as e:
        return None, f"pair symmetries skipped: {e}"


def open_probe(source: str | os.PathLike, *, n_inputs: int = 4, max_tokens: int = 32, seed: int = 0) -> Probe:
    """Open ``minilm``, a Hugging Face model directory, the project's model directory (or a
    training run directory: its newest checkpoint) with fixed real inputs."""
    from attnrank.io.checkpoint import model_dir, read_config

    path = model_dir(source, "scale")
    config = read_config(path)
    if config.get("model_type") == "attnrank":
        return _open_attnrank(path, config, str(source), n_inputs=n_inputs, seed=seed)
    return _open_hf(path, config, str(source), n_inputs=n_inputs, max_tokens=max_tokens, seed=seed)


def _open_hf(path: Path, config: dict[str, Any], source: str, *, n_inputs: int, max_tokens: int,
             seed: int) -> Probe:
    import warnings

    try:
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise AttnRankError("reading a Hugging Face model needs the transformers package") from None
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModel.from_pretrained(str(path), local_files_only=True, attn_implementation="eager")
    except Exception as e:  # unknown model_type, missing or corrupt weights, …
        raise AttnRankError(f"cannot load {path} with transformers: {' '.join(str(e).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    model = model.double().eval()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = int(config.get("image_size", 224))
        ch = int(config.get("num_channels", 3))
        pixels = digits_images(n_inputs, size, ch)
        inputs = f"{n_inputs} scikit-learn digits images resized to {size}x{size}, {ch} channels"

        def forward() -> torch.Tensor:
            return _first_tensor(model(pixel_values=pixels))
    elif main == "input_ids":
        ids, mask, inputs = _text_inputs(path, config, n_inputs, max_tokens, seed)

        def forward() -> torch.Tensor:
            h = _first_tensor(model(input_ids=ids, attention_mask=mask))
            return h[mask.bool()]  # valid positions only, (tokens, d)
    else:
        raise AttnRankError(f"model input {main!r} is not supported (token ids or pixel values)")
    layout, note = _layout_or_note(config)
    return Probe(model, forward, source, "huggingface", config, inputs, layout, note)


def _text_inputs(path: Path, config: dict[str, Any], n: int, max_tokens: int, seed: int):
    tok_file = path / "tokenizer.json"
    vocab = int(config.get("vocab_size") or 0)
    if tok_file.exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_file))
        tok.enable_truncation(max_length=max_tokens)
        tok.enable_padding(pad_id=int(config.get("pad_token_id") or 0))
        texts = stdlib_sentences(n)
        enc = tok.encode_batch(texts)
        ids = torch.tensor([e.ids for e in enc])
        mask = torch.tensor([e.attention_mask for e in enc])
        if vocab and int(ids.max()) >= vocab:
            raise AttnRankError(f"tokenizer.json in {path} produces ids beyond vocab_size={vocab}")
        return ids, mask, f"{n} English sentences (standard-library docstrings), tokenizer.json, <= {max_tokens} tokens"
    if not vocab:
        raise AttnRankError(f"{path} has no tokenizer.json and its config gives no vocab_size")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, max_tokens), generator=gen)
    return ids, torch.ones_like(ids), (f"{n} x {max_tokens} uniformly random token ids (seed {seed}): "
                                       "no tokenizer.json, so not real text")


def _open_attnrank(path: Path, config: dict[str, Any], source: str, *, n_inputs: int, seed: int) -> Probe:
    from attnrank.models.transformer import load_model

    model = load_model(path).double().eval()
    if config.get("architecture") == "ViT":
        c = model.config
        images = digits_images(n_inputs, c.image_size, c.channels)
        inputs = f"{n_inputs} scikit-learn digits images resized to {c.image_size}x{c.image_size}"

        def forward() -> torch.Tensor:
            return model(images)
    else:
        idx, inputs = _recall_inputs(path, model.config, n_inputs, seed)

        def forward() -> torch.Tensor:
            return model(idx)
    layout, note = _layout_or_note(config)
    return Probe(model, forward, source, "attnrank", config, inputs, layout, note)


def _recall_inputs(path: Path, mcfg: Any, n: int, seed: int) -> tuple[torch.Tensor, str]:
    """Task sequences for a checkpoint of a training run (RUN/checkpoints/step-*/), else random ids."""
    run_cfg = path.parent.parent / "config.json"
    task = None
    if path.parent.name == "checkpoints" and run_cfg.exists():
        try:
            task = json.loads(run_cfg.read_text()).get("task")
        except (OSError, ValueError):
            task = None
    if isinstance(task, dict):
        from attnrank.models.tasks import RecallConfig, make_recall_batch

        try:
            rc = RecallConfig(**{k: task[k] for k in ("n_pairs", "n_keys", "n_values", "n_queries") if k in task})
        except (AttnRankError, TypeError):
            rc = None
        if rc is not None and rc.vocab_size <= mcfg.vocab_size and rc.seq_len <= mcfg.max_seq_len:
            x, _ = make_recall_batch(rc, n, torch.Generator().manual_seed(seed))
            return x, f"{n} associative-recall sequences of the run's task (seed {seed})"
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, mcfg.vocab_size, (n, mcfg.max_seq_len), generator=gen)
    return x, f"{n} x {mcfg.max_seq_len} uniformly random token ids (seed {seed}): no training run config found"


# =========================================================================== the analysis


@dataclass
class ScaleResult:
    table: pd.DataFrame  # one row per tensor / group
    pairs: pd.DataFrame  # one row per (layer, kv head, product); empty without a layout
    meta: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return verdict_counts(self.table)

    def pair_summary(self) -> dict[str, Any]:
        if self.pairs.empty:
            return {}
        out = {}
        for p, t in self.pairs.groupby("product"):
            out[str(p)] = {"heads": int(len(t)), "pair_dev_max": float(t["pair_dev"].max()),
                           "one_sided_dev_min": float(t["one_sided_dev"].min()),
                           "one_sided_dev_median": float(t["one_sided_dev"].median())}
        return out


def parse_group(spec: str) -> tuple[str, list[str]]:
    """``NAME=PATTERN[,PATTERN...]`` (fnmatch patterns over parameter names)."""
    name, sep, pats = spec.partition("=")
    patterns = [p.strip() for p in pats.split(",") if p.strip()]
    if not sep or not name.strip() or not patterns:
        raise AttnRankError(f"--group must look like NAME=PATTERN[,PATTERN...], got {spec!r}")
    return name.strip(), patterns


def analyze_scaling(source: str | os.PathLike, *, scales: Iterable[float] = DEFAULT_SCALES,
                    tol: float = DEFAULT_TOL, groups: dict[str, Sequence[str]] | None = None,
                    pairs: bool = True, seed: int = 0, exhaustive: bool = False, structural: bool = True,
                    threads: int | None = None,
                    progress: Callable[[str, int, int], None] | None = None) -> ScaleResult:
    """Per-tensor scaling verdicts and per-head pair symmetries of a model on real inputs.

    ``threads``: torch threads for the duration of the call (restored after); 1 is fastest for
    small models on a busy machine.
    """
    scales = check_scales(scales)
    if not (isinstance(tol, int | float) and tol > 0):
        raise AttnRankError(f"tolerance must be > 0, got {tol}")
    if threads is not None and threads < 1:
        raise AttnRankError(f"threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _analyze_scaling(source, scales, tol, groups, pairs, seed, exhaustive, structural, progress)
    finally:
        torch.set_num_threads(before)


def _analyze_scaling(source, scales, tol, groups, pairs, seed, exhaustive, structural, progress) -> ScaleResult:
    probe = open_probe(source, seed=seed)
    table = scale_test(probe.model, probe.forward, groups=groups, scales=scales, tol=tol, seed=seed,
                       exhaustive=exhaustive, structural=structural, progress=(lambda d, t: progress("tensors", d, t)) if progress else None)
    pair_table = pd.DataFrame(columns=["layer", "kv_head", "heads", "product", "pair_dev", "one_sided_dev",
                                       "rerun_dev"])
    extra: dict[str, Any] = {}
    note = probe.layout_note
    if pairs and probe.layout is not None:
        pair_table, extra = pair_symmetries(probe.model, probe.forward, probe.layout, probe.config, scales=scales,
                                            seed=seed,
                                            progress=(lambda d, t: progress("heads", d, t)) if progress else None)
    elif not pairs:
        note = "pair symmetries not requested"
    meta = {
        "source": probe.source, "kind": probe.kind, "model_type": probe.config.get("model_type"),
        "inputs": probe.inputs, "dtype": "float64", "scales": list(scales), "tol": tol, "seed": seed,
        "exhaustive": exhaustive, "structural": bool(table.attrs.get("structural")),
        "torch_threads": torch.get_num_threads(),
        "norm_eps": table.attrs.get("norm_eps", []),
        "function": ("final hidden states at the valid token positions" if probe.kind == "huggingface"
                     else "logits"),
        "groups": {g: list(p) for g, p in (groups or {}).items()},
        "counts": verdict_counts(table), "group_counts": verdict_counts(table, "group"),
        "pairs": extra, "pairs_note": note,
        "conventions": {
            "inv_dev": "max_c |f(cW) - f(W)| / |f(W)|",
            "hom_dev": "max_c |f(cW) - c^k f(W)| / |c^k f(W)|, k fitted by least squares of log<f(cW),f(W)>/|f(W)|^2 on log c",
            "perturb_dev": "|f(W + noise) - f(W)| / |f(W)|, noise of W's RMS size; measured for invariant tensors",
            "structural": "verdicts measured with every normalisation epsilon set to 0 (the architecture); "
                          "inv_dev_eps = inv_dev of the real function (epsilon restored) for invariant rows",
            "verdict": "zero | no effect | invariant (inv_dev <= tol) | homogeneous (hom_dev <= tol) | neither",
            "pair_dev": "max_c relative change of the attention module's output under W_Q->cW_Q, W_K->W_K/c "
                        "(qk) or W_V->cW_V, P->P/c (ov), biases of q,k,v scaled with their rows",
            "one_sided_dev": "min_c relative change with only W_Q (qk) or only W_V (ov) scaled: a control",
        },
    }
    return ScaleResult(table, pair_table, meta)


def save(result: ScaleResult, out: str | os.PathLike, plots: bool = True) -> list[Path]:
    """Write tensors.csv, pairs.csv, meta.json (and figures) into ``out``, atomically."""
    from attnrank.util.fileio import jsonable, prepare_out_dir, write_json, write_text

    out = prepare_out_dir(out)
    files = [write_text(out / "tensors.csv", result.table.to_csv(index=False)),
             write_text(out / "pairs.csv", result.pairs.to_csv(index=False)),
             write_json(out / "meta.json", jsonable({**result.meta, "pair_summary": result.pair_summary()}))]
    if plots:
        from attnrank.analysis import plots as P

        files.append(P.save_figure(P.scale_tensor_deviations(result.table, result.meta), out / "scale_tensors.png"))
        if not result.pairs.empty:
            files.append(P.save_figure(P.scale_pair_deviations(result.pairs, result.meta), out / "scale_pairs.png"))
    return files
