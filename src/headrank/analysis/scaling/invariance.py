"""Per-tensor scale test: is the model's function invariant, homogeneous of some degree, or
neither under ``W → cW`` (docs/methods/scale.md)?

The function ``f`` is the model's output on fixed real inputs, computed in float64. For each
parameter tensor (or a named group of tensors, scaled together) and each factor ``c``:

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
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from headrank.errors import HeadRankError
from headrank.util.constraints import SCALE

# Not powers of two: multiplying by 2 and by 1/2 is exact in floating point, which would make a
# pair symmetry hold bit for bit and hide how closely it holds in ordinary arithmetic.
DEFAULT_SCALES: tuple[float, ...] = (0.3, 1.7, 4.1)
# Relative deviation below which f(cW) counts as f(W) (or c^k f(W)). Not the rank threshold
# headrank.core.linalg.DEFAULT_TOL (1e-3): a different quantity.
INVARIANCE_TOL = 1e-6
TENSOR_VERDICTS = ("invariant", "homogeneous", "neither", "no effect", "zero")


def parse_scales(text: str) -> tuple[float, ...]:
    """``"0.3,1.7,4.1"`` → (0.3, 1.7, 4.1), checked."""
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HeadRankError(f"`scales` must be comma-separated numbers, got {text!r}") from None
    return check_scales(vals)


def check_scales(scales: Iterable[float]) -> tuple[float, ...]:
    """The scale factors as a tuple of floats, each positive, finite and != 1."""
    out = tuple(float(c) for c in scales)
    if not out:
        raise HeadRankError("give at least one scale factor c")
    for c in out:
        if not (math.isfinite(c) and c > 0 and c != 1.0):
            raise HeadRankError(f"scale factors must be positive, finite and != 1; got {c:g}")
    return out


def _flat(y: Any) -> torch.Tensor:
    if isinstance(y, torch.Tensor):
        return y.detach().reshape(-1).to(torch.float64)
    if isinstance(y, list | tuple):
        return torch.cat([_flat(t) for t in y])
    raise TypeError(f"forward returned {type(y).__name__}, not a tensor")


def classify_outputs(y0: torch.Tensor, ys: dict[float, torch.Tensor], tol: float = INVARIANCE_TOL) -> dict[str, Any]:
    """Deviations of f(cW) from f(W) (invariance) and from cᵏ f(W) (homogeneity, k fitted).

    ``ys`` maps c → f(cW). Returns ``inv_dev``, ``hom_dev``, ``k``, ``k_spread`` (max − min of the
    per-c degrees log r_c / log c) and ``verdict`` (``invariant`` / ``homogeneous`` / ``neither``).
    """
    y0 = _flat(y0)
    n0 = float(torch.linalg.vector_norm(y0))
    if not math.isfinite(n0) or n0 == 0.0:
        raise HeadRankError("the model's output is zero or not finite on the probe inputs: nothing to compare")
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
def scaled(params: Sequence[torch.Tensor], c: float) -> Iterator[None]:
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
def perturbed(params: Sequence[torch.Tensor], seed: int = 0) -> Iterator[None]:
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
def norm_eps_zero(model: nn.Module) -> Iterator[list[str]]:
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
            raise HeadRankError(f"group {g!r}: no parameter matches {', '.join(patterns)}")
        out[g] = members
    return out


def scale_test(model: nn.Module, forward: Callable[[], Any], *, names: Sequence[str] | None = None,
               groups: dict[str, Sequence[str]] | None = None, scales: Iterable[float] = DEFAULT_SCALES,
               tol: float = INVARIANCE_TOL, seed: int = 0, exhaustive: bool = False, structural: bool = True,
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
            inv_eps = _inv_dev_eps(model, forward, table, groups, scales)
            table["inv_dev_eps"] = inv_eps
            table.attrs.update(structural=True, norm_eps=eps_list)
            return table
    table = _scale_test(model, forward, names, groups, scales, tol, seed, exhaustive, progress)
    table["inv_dev_eps"] = table["inv_dev"].where(table["verdict"] == "invariant")
    table.attrs.update(structural=False, norm_eps=[f"{type(m).__name__}.{a}={v:g}" for m, a, v in _norm_modules(model)])
    return table


def _inv_dev_eps(model: nn.Module, forward: Callable[[], Any], table: pd.DataFrame,
                 groups: dict[str, Sequence[str]] | None, scales: tuple[float, ...]) -> list[float]:
    """For the invariant rows: max_c relative change of the real function (epsilon as it is)."""
    out = []
    with torch.no_grad():
        y0 = _flat(forward())
        params = dict(model.named_parameters())
        groups_r = resolve_groups(list(params), groups)
        for _, row in table.iterrows():
            if row["verdict"] != "invariant":
                out.append(math.nan)
                continue
            ps = [params[m] for m in (groups_r[row["name"]] if row["kind"] == "group" else [row["name"]])]
            devs = []
            for c in scales:
                with scaled(ps, c):
                    devs.append(float(torch.linalg.vector_norm(_flat(forward()) - y0) / torch.linalg.vector_norm(y0)))
            out.append(max(devs))
    return out


def _scale_test(model, forward, names, groups, scales, tol, seed, exhaustive, progress) -> pd.DataFrame:
    SCALE["tol"].check(tol)
    params = dict(model.named_parameters())
    names = list(params) if names is None else list(names)
    missing = [n for n in names if n not in params]
    if missing:
        raise HeadRankError(f"no parameter named {missing[0]!r}")
    items: list[tuple[str, str, list[str]]] = [(n, "tensor", [n]) for n in names]
    items += [(g, "group", m) for g, m in resolve_groups(list(params), groups).items()]
    with torch.no_grad():
        y0 = _flat(forward())
        if not bool(torch.isfinite(y0).all()):
            raise HeadRankError("the model's output is not finite on the probe inputs")
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
    """How many rows of ``kind`` (tensor or group) got each verdict."""
    t = table[table["kind"] == kind]
    return {v: int((t["verdict"] == v).sum()) for v in TENSOR_VERDICTS}
