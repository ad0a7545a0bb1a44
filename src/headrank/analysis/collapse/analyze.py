"""Rank collapse of a real model on real text, layer by layer, for every surgical variant
(:func:`analyze`, behind ``headrank collapse MODEL``), and its files (:func:`save`).

Each variant is run on the pretrained weights and on the same architecture re-initialised by
its own initialiser (seeded). Per layer (0 = the embedding output, l = after layer l) every
measure is averaged over a batch of sequences (mean ± std). Sequences run one at a time,
unpadded; they come from :meth:`headrank.models.opener.Opened.sequences`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from headrank.analysis.collapse.measures import MEASURES, PRIMARY, token_measures
from headrank.analysis.collapse.paths import path_counts, path_products, path_restricted
from headrank.analysis.collapse.surgery import (
    INITS,
    SURGERY_VARIANTS,
    VARIANT_LABELS,
    VARIANT_SWITCHES,
    make_adapter,
    run_variant,
    surgery_modules,
)
from headrank.errors import HeadRankError
from headrank.models.opener import PROJECT_TYPE, Opened, open_model
from headrank.util.args import checked
from headrank.util.constraints import COLLAPSE
from headrank.util.result import ResultBase, plain, read_csv, read_json, records
from headrank.util.threads import check_threads, torch_threads


@dataclass
class CollapseResult(ResultBase):
    """Per-layer collapse measures of every (init, variant); see :func:`analyze`.

    ``table``: tidy, one row per (init, variant, layer, measure) with ``mean``, ``std``, ``n``;
    ``values["init/variant"]``: (seqs, layers+1, measures); ``paths``: the sampled
    attention-path products (pretrained, full; empty in a loaded result, whose
    :meth:`path_summary` is read from ``paths.csv``).
    """

    verb = "collapse"

    table: pd.DataFrame
    values: dict[str, np.ndarray]
    paths: pd.DataFrame
    meta: dict[str, Any]
    path_counts: list[int] = field(default_factory=list)
    saved_paths: pd.DataFrame | None = field(default=None, repr=False)  # paths.csv of a loaded result

    def save(self, out: str | os.PathLike, *, plots: bool = True) -> list[Path]:
        """``layers.csv``, ``summary.csv``, ``paths.csv``, ``collapse.npz``, ``meta.json`` and
        figures into ``out`` (:func:`save`)."""
        from headrank.io.writer import save_set

        return save_set(out, lambda stage: save(self, stage, plots=plots))  # one set, through the writer

    @classmethod
    def load(cls, out: str | os.PathLike) -> CollapseResult:
        """The result a :meth:`save` (or ``headrank collapse --out``) wrote into ``out``."""
        out = Path(out)
        meta = read_json(out / "meta.json")
        counts = [int(c) for c in meta.pop("path_counts", [])]
        with np.load(out / "collapse.npz") as z:
            values = {k.replace("__", "/"): z[k] for k in z.files if k != "measures"}
        return cls(table=read_csv(out / "layers.csv"), values=values, paths=pd.DataFrame(), meta=meta,
                   path_counts=counts, saved_paths=read_csv(out / "paths.csv"))

    def plot(self):
        """The primary measure per layer, each variant a line, pretrained and re-initialised."""
        from headrank.analysis import plots as P

        return P.collapse_layers(self.table, self.meta)

    def to_json(self) -> dict[str, Any]:
        """What ``headrank collapse --json`` prints: ``meta`` (without the sentences),
        ``summary`` and ``paths`` (the path summary)."""
        meta = {k: v for k, v in self.meta.items() if k != "texts"}
        return plain({"meta": meta, "summary": records(self.summary()), "paths": records(self.path_summary())})

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
        """Per path length: number of paths, mean and std of the product's residual, samples."""
        if self.saved_paths is not None:
            return self.saved_paths
        if self.paths.empty:
            return pd.DataFrame(columns=["length", "n_paths", "mean", "std", "samples"])
        g = self.paths.groupby("length")["residual"]
        out = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "samples": g.size()}).reset_index()
        out.insert(1, "n_paths", [self.path_counts[k] if k < len(self.path_counts) else None for k in out.length])
        return out


def analyze(source: str | os.PathLike, *, n_seqs: int = 32, max_tokens: int = 64, min_tokens: int = 8,
            inits: Sequence[str] = INITS, variants: Sequence[str] = SURGERY_VARIANTS, seed: int = 0,
            dtype: torch.dtype = torch.float64, path_samples: int = 32, texts: Sequence[str] | None = None,
            threads: int | None = None, progress: Callable[[int, int], None] | None = None) -> CollapseResult:
    """Run ``n_seqs`` real sentences through ``source`` and its variants; measure every layer.

    Sequences are run one at a time (no padding). ``texts`` overrides the corpus sentences.
    Path products use the pretrained (or the first init's) unmodified forward pass.
    ``threads``: CPU threads of the computation (torch's intra-op threads for the call, restored
    after; 1 to 4 per CPU, :func:`headrank.util.threads.check_threads`); one thread is much
    faster for small models on a busy machine.
    """
    if threads is not None:
        check_threads(threads)
    with torch_threads(threads):
        return _analyze(source, n_seqs=n_seqs, max_tokens=max_tokens, min_tokens=min_tokens, inits=inits,
                        variants=variants, seed=seed, dtype=dtype, path_samples=path_samples, texts=texts,
                        progress=progress)


@checked
def collapse(model: str | os.PathLike, *, seqs: int = 32, max_tokens: int = 64, seed: int = 0, threads: int = 1,
             progress: Callable[[int, int], None] | None = None) -> CollapseResult:
    """``headrank collapse MODEL``: rank collapse by layer for pure attention, + MLP, + skip and
    the full model, pretrained and re-initialised (``docs/verbs/collapse.md``).

    Parameters
    ----------
    model
        ``"minilm"``, a Hugging Face BERT/GPT-2/LLaMA-style directory, or a project model / run.
    seqs
        Sentences in the batch (the stdlib corpus' test split); bounds: :data:`headrank.util.constraints.COLLAPSE`.
    max_tokens
        Tokens per sentence at most.
    seed
        Seed of the re-initialised model and of the path sampling.
    threads
        CPU threads of the computation (1 to 4 per CPU).

    Returns
    -------
    CollapseResult
    """
    COLLAPSE.check(seqs=seqs, max_tokens=max_tokens, threads=threads)  # the table the command line reads
    return analyze(model, n_seqs=seqs, max_tokens=max_tokens, seed=seed, threads=threads, progress=progress)


def _check_args(n_seqs: int, max_tokens: int, min_tokens: int, inits, variants) -> None:
    COLLAPSE["seqs"].check(n_seqs)
    if not 2 <= min_tokens <= max_tokens:
        raise HeadRankError(f"need 2 <= min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
    for i in inits:
        if i not in INITS:
            raise HeadRankError(f"unknown init {i!r}; use {', '.join(INITS)}")
    for v in variants:
        if v not in VARIANT_SWITCHES:
            raise HeadRankError(f"unknown variant {v!r}; use one of {', '.join(SURGERY_VARIANTS)}")


def _analyze(source, *, n_seqs, max_tokens, min_tokens, inits, variants, seed, dtype, path_samples, texts,
             progress) -> CollapseResult:
    _check_args(n_seqs, max_tokens, min_tokens, inits, variants)
    t0 = time.perf_counter()
    op = open_model(source, dtype=dtype, n_inputs=0, what="collapse", check=surgery_modules)  # surgery's types only
    seqs = op.sequences(n_seqs, max_tokens=max_tokens, min_tokens=min_tokens,
                        texts=None if texts is None else list(texts))
    if len(seqs.ids) < 2:
        raise HeadRankError(f"fewer than 2 texts have >= {min_tokens} tokens")
    adapters = {init: make_adapter(op, init, seed) for init in inits}
    skipped = []
    if not all(a.has_mlp() for a in adapters.values()):
        skipped = [v for v in variants if VARIANT_SWITCHES[v][1]]
        variants = [v for v in variants if not VARIANT_SWITCHES[v][1]]
    vals = {f"{i}/{v}": [] for i in inits for v in variants}
    path_frames = []
    path_init = "pretrained" if "pretrained" in inits else inits[0]
    total, done = len(seqs.ids) * len(inits), 0
    for s, ids in enumerate(seqs.ids):
        x_ids = torch.tensor([ids])
        for init in inits:
            ad = adapters[init]
            cap = ad.reference(x_ids)
            for v in variants:
                X = torch.stack([h[0] for h in run_variant(ad, cap, v)])  # (L+1, n, d)
                m = token_measures(X)
                vals[f"{init}/{v}"].append(np.stack([m[k] for k in MEASURES], -1))
            if init == path_init and path_samples > 0 and all(p is not None for p in cap["probs"]):
                pf = path_products(torch.stack([p[0] for p in cap["probs"]]), n_samples=path_samples, seed=seed + s)
                pf.insert(0, "seq", s)
                path_frames.append(pf)
            done += 1
            if progress is not None:
                progress(done, total)
    values = {k: np.stack(v) for k, v in vals.items()}
    ad0 = next(iter(adapters.values()))
    meta = _meta(source, op, ad0.n_layers, seqs, inits, variants, skipped, seed, dtype, path_init)
    meta["runtime_s"] = time.perf_counter() - t0
    if op.model_type == PROJECT_TYPE and path_samples > 0:
        meta["path_restricted"] = _project_paths(adapters.get("pretrained", ad0).model, seqs.ids)
    paths = pd.concat(path_frames, ignore_index=True) if path_frames else pd.DataFrame(
        columns=["seq", "length", "path", "residual"])
    return CollapseResult(table=_tidy(values), values=values, paths=paths, meta=meta,
                          path_counts=path_counts(ad0.n_layers, op.n_heads))


def _tidy(values: dict[str, np.ndarray]) -> pd.DataFrame:
    rows = []
    for key, arr in values.items():
        init, variant = key.split("/")
        for layer in range(arr.shape[1]):
            for j, meas in enumerate(MEASURES):
                col = arr[:, layer, j]
                rows.append({"init": init, "variant": variant, "layer": layer, "measure": meas,
                             "mean": float(np.mean(col)), "std": float(np.std(col, ddof=1)), "n": int(col.size)})
    return pd.DataFrame(rows)


def _meta(source, op: Opened, n_layers: int, seqs, inits, variants, skipped, seed: int, dtype, path_init: str
          ) -> dict[str, Any]:
    return {
        "source": str(source), "path": str(op.path), "model_type": op.model_type,
        "n_layers": n_layers, "n_heads": op.n_heads, "inits": list(inits), "variants": list(variants),
        "variants_unavailable": skipped, "variant_labels": {v: VARIANT_LABELS[v] for v in variants},
        "n_seqs": len(seqs.ids), "tokens_per_seq": [len(ids) for ids in seqs.ids],
        "texts": seqs.texts, "tokenization": seqs.note, "seed": seed, "dtype": str(dtype).replace("torch.", ""),
        "random_init": "the architecture's own initialiser (transformers from_config / headrank Transformer), "
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
    }


def _project_paths(model, seqs: list[list[int]]) -> dict[str, Any]:
    """:func:`path_restricted` on each sequence, where the project's model allows it."""
    cfg = model.config
    if not cfg.skip or cfg.mlp or cfg.bias:
        return {"available": False, "why": "path decomposition needs skip=True, mlp=False, bias=False"}
    logs, shares, err = [], [], 0.0
    for ids in seqs:
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
    from headrank.util.fileio import prepare_out_dir, write_atomic, write_json

    out = prepare_out_dir(out)
    written = [
        write_atomic(out / "layers.csv", lambda p: result.table.to_csv(p, index=False)),
        write_atomic(out / "summary.csv", lambda p: result.summary().to_csv(p, index=False)),
        write_atomic(out / "paths.csv", lambda p: result.path_summary().to_csv(p, index=False)),
        write_atomic(out / "collapse.npz", lambda p: _save_npz(p, result)),
        write_json(out / "meta.json", {**result.meta, "path_counts": [str(c) for c in result.path_counts]}),
    ]
    if plots:
        from headrank.analysis import plots as P

        written.append(P.save_figure(P.collapse_layers(result.table, result.meta), out / "collapse_layers.png"))
        if not result.paths.empty:
            written.append(P.save_figure(P.collapse_path_products(result.path_summary(), result.meta, result.paths),
                                         out / "path_products.png"))
    return written


def _save_npz(p: Path, result: CollapseResult) -> None:
    arrays = {k.replace("/", "__"): v for k, v in result.values.items()}
    with open(p, "wb") as fh:
        np.savez_compressed(fh, measures=np.array(MEASURES), **arrays)
