"""``headrank scale MODEL``: per-tensor scaling verdicts and per-head pair symmetries of a model
on fixed real inputs, and the files they are saved to (tensors.csv, pairs.csv, meta.json)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headrank.analysis.scaling.invariance import (
    DEFAULT_SCALES,
    INVARIANCE_TOL,
    check_scales,
    scale_test,
    verdict_counts,
)
from headrank.analysis.scaling.symmetries import pair_symmetries
from headrank.errors import HeadRankError
from headrank.io.layouts import Layout, layout_for
from headrank.util.args import checked
from headrank.util.constraints import SCALE
from headrank.util.result import ResultBase, plain, read_csv, read_json, records
from headrank.util.threads import torch_threads


@dataclass
class ScaleResult(ResultBase):
    """What :func:`analyze_scaling` measured: per-tensor table, per-head pair table, facts.

    ``table``: one row per tensor / group; ``pairs``: one row per (layer, kv head, product),
    empty without a layout.
    """

    verb = "scale"

    table: pd.DataFrame
    pairs: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> pd.DataFrame:
        """Verdict counts over the tensors (one row per verdict)."""
        return pd.DataFrame(list(self.counts().items()), columns=["verdict", "tensors"])

    def save(self, out: str | os.PathLike, *, plots: bool = True) -> list[Path]:
        """``tensors.csv``, ``pairs.csv``, ``meta.json`` and figures into ``out`` (:func:`save`)."""
        from headrank.io.writer import save_set

        return save_set(out, lambda stage: save(self, stage, plots=plots))  # one set, through the writer

    @classmethod
    def load(cls, out: str | os.PathLike) -> ScaleResult:
        """The result a :meth:`save` (or ``headrank scale --out``) wrote into ``out``."""
        out = Path(out)
        meta = read_json(out / "meta.json")
        meta.pop("pair_summary", None)
        return cls(table=read_csv(out / "tensors.csv"), pairs=read_csv(out / "pairs.csv"), meta=meta)

    def plot(self):
        """Each tensor's invariance and homogeneity deviations."""
        from headrank.analysis import plots as P

        return P.scale_tensor_deviations(self.table, self.meta)

    def to_json(self) -> dict[str, Any]:
        """What ``headrank scale --json`` prints: ``meta``, ``counts``, ``pair_summary`` and
        ``tensors`` (the table's rows)."""
        return plain({"meta": self.meta, "counts": self.counts(), "pair_summary": self.pair_summary(),
                      "tensors": records(self.table)})

    def counts(self) -> dict[str, int]:
        """Verdict counts over the tensors."""
        return verdict_counts(self.table)

    def pair_summary(self) -> dict[str, Any]:
        """Per product (qk, ov): heads, largest pair deviation, smallest and median control."""
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
        raise HeadRankError(f"`groups` must look like NAME=PATTERN[,PATTERN...], got {spec!r}")
    return name.strip(), patterns


def analyze_scaling(source: str | os.PathLike, *, scales: Iterable[float] = DEFAULT_SCALES,
                    tol: float = INVARIANCE_TOL, groups: dict[str, Sequence[str]] | None = None,
                    pairs: bool = True, seed: int = 0, exhaustive: bool = False, structural: bool = True,
                    threads: int | None = None,
                    progress: Callable[[str, int, int], None] | None = None) -> ScaleResult:
    """Per-tensor scaling verdicts and per-head pair symmetries of a model on real inputs.

    ``threads``: CPU threads of the computation (torch's, for the duration of the call, restored
    after; bounded by :data:`headrank.util.constraints.THREADS`); 1 is fastest for small
    models on a busy machine.
    """
    scales = check_scales(scales)
    SCALE.check(tol=tol, **({"threads": threads} if threads is not None else {}))  # one declaration of the bounds
    with torch_threads(threads):
        return _analyze_scaling(source, scales, tol, groups, pairs, seed, exhaustive, structural, progress)


@checked
def scale(model: str | os.PathLike, *, scales: str | Iterable[float] = DEFAULT_SCALES, tol: float = INVARIANCE_TOL,
          groups: dict[str, Sequence[str]] | Sequence[str] | None = None, pairs: bool = True,
          with_eps: bool = False, exhaustive: bool = False, threads: int = 1,
          progress: Callable[[str, int, int], None] | None = None) -> ScaleResult:
    """``headrank scale MODEL``: which tensors are scale-invariant, homogeneous or neither, and
    the per-head attention rescaling symmetries (``docs/verbs/scale.md``).

    Parameters
    ----------
    model
        ``"minilm"``, a Hugging Face model directory, a headrank model directory or run.
    scales
        Scale factors c (positive, not 1): a sequence or a comma-separated string.
    tol
        Relative deviation below which ``f(cW)`` counts as ``f(W)`` (or ``c^k f(W)``).
    groups
        Tensors also scaled together: ``{name: [fnmatch patterns]}`` or ``["NAME=PAT,PAT"]``.
    pairs
        Also measure the per-head W_Q/W_K and W_V/W_O rescaling symmetries.
    with_eps
        Judge the real function, normalisation epsilon kept (default: epsilon 0 for verdicts).
    exhaustive
        Try every c even once a tensor is clearly neither.
    threads
        CPU threads of the computation (1 to 4 per CPU).

    Returns
    -------
    ScaleResult
    """
    from headrank.analysis.scaling.invariance import parse_scales

    if isinstance(scales, str):
        scales = parse_scales(scales)
    if groups is not None and not isinstance(groups, dict):
        if isinstance(groups, str):
            groups = [groups]
        groups = dict(parse_group(g) for g in groups)
    return analyze_scaling(model, scales=scales, tol=tol, groups=groups, pairs=pairs, exhaustive=exhaustive,
                           structural=not with_eps, threads=threads, progress=progress)


def layout_or_note(config: dict[str, Any]) -> tuple[Layout | None, str]:
    """The layout row of ``config``'s model_type, or None and why the pair symmetries are skipped."""
    try:
        return layout_for(config), ""
    except HeadRankError as e:
        return None, f"pair symmetries skipped: {e}"


def _analyze_scaling(source, scales, tol, groups, pairs, seed, exhaustive, structural, progress) -> ScaleResult:
    from headrank.models.opener import open_model

    probe = open_model(source, dtype=torch.float64, seed=seed, what="scale")
    kind = "huggingface" if probe.kind == "hf" else probe.kind
    layout, note = layout_or_note(probe.config)
    table = scale_test(probe.model, probe.forward, groups=groups, scales=scales, tol=tol, seed=seed,
                       exhaustive=exhaustive, structural=structural, progress=(lambda d, t: progress("tensors", d, t)) if progress else None)
    pair_table = pd.DataFrame(columns=["layer", "kv_head", "heads", "product", "pair_dev", "one_sided_dev",
                                       "rerun_dev"])
    extra: dict[str, Any] = {}
    if pairs and layout is not None:
        pair_table, extra = pair_symmetries(probe.model, probe.forward, layout, probe.config, scales=scales,
                                            seed=seed,
                                            progress=(lambda d, t: progress("heads", d, t)) if progress else None)
    elif not pairs:
        note = "pair symmetries not requested"
    meta = {
        "source": probe.source, "kind": kind, "model_type": probe.config.get("model_type"),
        "inputs": probe.input_note, "dtype": "float64", "scales": list(scales), "tol": tol, "seed": seed,
        "exhaustive": exhaustive, "structural": bool(table.attrs.get("structural")),
        "torch_threads": torch.get_num_threads(),
        "norm_eps": table.attrs.get("norm_eps", []),
        "function": ("final hidden states at the valid token positions" if kind == "huggingface"
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
    from headrank.util.fileio import jsonable, prepare_out_dir, write_json, write_text

    out = prepare_out_dir(out)
    files = [write_text(out / "tensors.csv", result.table.to_csv(index=False)),
             write_text(out / "pairs.csv", result.pairs.to_csv(index=False)),
             write_json(out / "meta.json", jsonable({**result.meta, "pair_summary": result.pair_summary()}))]
    if plots:
        from headrank.analysis import plots as P

        files.append(P.save_figure(P.scale_tensor_deviations(result.table, result.meta), out / "scale_tensors.png"))
        if not result.pairs.empty:
            files.append(P.save_figure(P.scale_pair_deviations(result.pairs, result.meta), out / "scale_pairs.png"))
    return files
