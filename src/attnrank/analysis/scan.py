"""The streaming loop (module `scan`; its entry points are `attnrank.analyze` and `attnrank.spectra`): checkpoint → one row per (layer, head, product).

Only one layer's attention weights are in memory at a time. Everything numeric goes
through :mod:`attnrank.core.linalg`; everything architectural through :mod:`attnrank.io.layouts`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnrank.core.linalg import (
    DEFAULT_TOL,
    METRIC_COLUMNS,
    ProductMetrics,
    factor_roots,
    metrics_from_roots,
)
from attnrank.errors import AttnRankError
from attnrank.io.checkpoint import Checkpoint
from attnrank.io.layouts import AttentionReader, HeadWeights, Layout
from attnrank.io.sources import open_reader
from attnrank.util.env import versions
from attnrank.util.fileio import prepare_out_dir, write_atomic, write_json
from attnrank.util.threads import torch_threads

PRODUCTS = ("qk", "ov")
TABLE_COLUMNS = ("layer", "head", "kv_head", "product", *METRIC_COLUMNS, "head_dim", "finite")


@dataclass
class SpectraResult:
    """Everything ``attnrank spectra`` measures.

    ``table``: one row per (layer, head, product), columns TABLE_COLUMNS.
    ``sv[product]``: (layers, heads, k) singular values, descending.
    ``row_norms[name]``: (layers, heads, dh) squared row norms of W_Q, W_K, W_V and squared
    column norms of P, per query head (kv tensors repeated for grouped-query attention): the
    Figure 4 balance check (``AᵀA = BᵀB`` puts each pair on the diagonal).
    ``meta``: source, config summary, dtypes, tolerance and conventions.
    """

    table: pd.DataFrame
    sv: dict[str, np.ndarray]
    row_norms: dict[str, np.ndarray]
    meta: dict[str, Any]

    def summary(self) -> pd.DataFrame:
        return summarize(self.table)

    def save(self, out: str | os.PathLike, *, plots: bool = True) -> list[Path]:
        """Write the result into directory ``out`` (see :func:`save`)."""
        return save(self, out, plots=plots)


def _rows(layer: int, product: str, m: ProductMetrics, group: int, head_dim: int) -> pd.DataFrame:
    n = m.sv.shape[0]
    cols: dict[str, Any] = {
        "layer": layer,
        "head": np.arange(n),
        "kv_head": np.arange(n) // group,
        "product": product,
    }
    cols.update({k: v.numpy() for k, v in m.columns().items()})
    cols["head_dim"] = head_dim
    cols["finite"] = m.finite.numpy()
    return pd.DataFrame(cols, columns=list(TABLE_COLUMNS))


def layer_metrics(hw: HeadWeights, tol: float = DEFAULT_TOL, *,
                  workers: int = 1) -> tuple[dict[str, ProductMetrics], dict[str, torch.Tensor]]:
    """QK and OV metrics of every query head of one layer, plus the Figure 4 row norms.

    Each distinct factor is reduced once (a kv head shared by a group of query heads too).
    The squared row norms of W_Q, W_K, W_V and column norms of P are the diagonals of the
    factors' Gram matrices ``RᵀR`` (column sums of ``R²``), so they cost nothing extra.
    ``workers`` > 1 shares the heads among that many threads (run under ``torch_threads(1)``;
    the result is the same for any number).
    """
    rq, rk, rv, rp = factor_roots(hw.wq.mT, hw.wk.mT, hw.wv.mT, hw.p, workers=workers)
    rk, rv = hw.kv_for_query_heads(rk), hw.kv_for_query_heads(rv)
    metrics = {"qk": metrics_from_roots(rk, rq, tol, workers=workers),
               "ov": metrics_from_roots(rp, rv, tol, workers=workers)}
    gram_diag = lambda r: (r * r).sum(-2)  # noqa: E731
    norms = {"q": gram_diag(rq), "k": gram_diag(rk), "v": gram_diag(rv), "p": gram_diag(rp)}
    return metrics, norms


def _stream(reader: AttentionReader, sel: list[int], tol: float, threads: int | None):
    """Yield ``(i, hw, metrics, row_norms)`` per selected layer; layer i+1 is read meanwhile.

    The checkpoint is touched by one thread at a time (the reader thread; ``release`` only
    between reads), so resident memory stays about two layers' stored weights.
    """
    from concurrent.futures import ThreadPoolExecutor

    from attnrank.util.memory import trim_heap

    workers = max(1, threads if threads is not None else torch.get_num_threads())
    with ThreadPoolExecutor(1, thread_name_prefix="attnrank-read") as io, torch_threads(1):
        nxt = io.submit(reader.read_layer, sel[0]) if sel else None
        for k, i in enumerate(sel):
            hw = nxt.result()
            reader.ckpt.release()  # unmap what the read touched (tensors read are copies)
            trim_heap()  # the previous layer's temporaries, back to the OS (resident set stays flat)
            nxt = io.submit(reader.read_layer, sel[k + 1]) if k + 1 < len(sel) else None
            metrics, row_norms = layer_metrics(hw, tol, workers=workers)
            yield i, hw, metrics, row_norms


def parse_layers(spec: str | None, n_layers: int) -> list[int]:
    """``None`` → all; ``"0,3,5-7"`` → those layers (0-based, inclusive ranges, in range, non-empty).

    Bounds are checked before any range is expanded, so ``0-1e20`` or ``3-1`` is one line.
    """
    if spec is None:
        return list(range(n_layers))
    if not isinstance(spec, str):
        raise AttnRankError(f"--layers must be a string like 0,2,5-7; got {type(spec).__name__}")
    if not spec.strip():
        raise AttnRankError("--layers is empty: give layers like 0,2,5-7 (or leave it out for all)")
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            dash = part.find("-", 1)  # a leading minus is a (negative, out of range) number
            if dash > 0:
                a, b = int(part[:dash]), int(part[dash + 1:])
            else:
                a = b = int(part)
        except ValueError:
            raise AttnRankError(f"--layers must look like 0,2,5-7; got {spec!r}"[:300]) from None
        if b < a:
            raise AttnRankError(f"--layers {spec!r}: the range {part} is empty (write low-high)"[:300])
        for i in (a, b):
            if not 0 <= i < n_layers:
                shown = str(i) if len(str(i)) <= 20 else str(i)[:17] + "..."
                raise AttnRankError(f"--layers {spec[:60]!r}: layer {shown} out of range 0..{n_layers - 1}")
        out.update(range(a, b + 1))
    return sorted(out)


def _check_args(tol: Any, layers: Any, threads: Any, progress: Any) -> list[int] | str | None:
    """Types and ranges of analyze's arguments (an API caller may pass anything); the layer
    selection as a spec string or a list of ints."""
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating)):
        raise AttnRankError(f"tolerance must be a number in (0, 1); got {type(tol).__name__} {str(tol)[:40]!r}")
    if not tol > 0 or not tol < 1:
        raise AttnRankError(f"tolerance must lie in (0, 1); got {tol}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, (int, np.integer))
                                or not 1 <= threads <= 4096):
        raise AttnRankError(f"threads must be an integer from 1 to 4096; got {str(threads)[:40]!r}")
    if progress is not None and not callable(progress):
        raise AttnRankError(f"progress must be a callable (done, total); got {type(progress).__name__}")
    if layers is None or isinstance(layers, str):
        return layers
    if isinstance(layers, (bytes, dict)) or not isinstance(layers, Iterable):
        raise AttnRankError(f"layers must be a spec string like '0,2,5-7' or a list of layer indices; got "
                            f"{type(layers).__name__} {str(layers)[:40]!r}")
    sel = list(layers)
    if not sel:
        raise AttnRankError("layers is empty: select at least one layer (or pass None for all)")
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in sel):
        bad = next(i for i in sel if isinstance(i, bool) or not isinstance(i, (int, np.integer)))
        raise AttnRankError(f"layers must be integers; got {type(bad).__name__} {str(bad)[:40]!r}")
    return [int(i) for i in sel]


def analyze(
    source: str | os.PathLike | Checkpoint | Any,
    *,
    config: str | os.PathLike | None = None,
    tol: float = DEFAULT_TOL,
    layers: Iterable[int] | str | None = None,
    layout: str | os.PathLike | Layout | None = None,
    progress: Callable[[int, int], None] | None = None,
    threads: int | None = None,
    revision: str | None = None,
    base: str | os.PathLike | None = None,
    delta: bool = False,
    fold_norm: bool = False,
    download: bool = False,
) -> SpectraResult:
    """Exact per-head QK and OV spectra of every (or the selected) attention layer.

    ``source``, ``revision``, ``base``, ``delta``, ``fold_norm``, ``download``: see io.sources.open_reader.

    ``layout``: a TOML layout file (or a :class:`Layout`) for a model_type not in the table;
    the config then may be absent. ``progress(done, total)`` is called after each layer.
    ``threads``: worker threads (default: torch's current thread count). Each runs single-
    threaded torch over its own heads while a background thread reads the next layer, so a
    core taken by another process slows the scan in proportion, and results are bit-identical
    whatever the load.
    """
    layers = _check_args(tol, layers, threads, progress)
    reader = open_reader(source, config=config, layout=layout, revision=revision, base=base, delta=delta,
                         fold_norm=fold_norm, download=download)
    dims = reader.dims
    if layers is None or isinstance(layers, str):
        sel = parse_layers(layers, dims.n_layers)
    else:
        sel = parse_layers(",".join(str(i) for i in layers), dims.n_layers)
    tol = float(tol)

    frames: list[pd.DataFrame] = []
    sv: dict[str, list[np.ndarray]] = {p: [] for p in PRODUCTS}
    norms: dict[str, list[np.ndarray]] = {k: [] for k in ("q", "k", "v", "p")}
    for done, (i, hw, metrics, row_norms) in enumerate(_stream(reader, sel, tol, threads), 1):
        for product, m in metrics.items():
            frames.append(_rows(i, product, m, hw.group, dims.head_dim))
            sv[product].append(m.sv.numpy())
        for k, v in row_norms.items():
            norms[k].append(v.numpy())
        del hw, metrics
        if progress:
            progress(done, len(sel))

    table = pd.concat(frames, ignore_index=True)
    table["rank"] = table["rank"].astype("float64" if table["rank"].isna().any() else "int64")
    bad = table.loc[~table["finite"], ["layer", "head", "product"]]
    cfg = reader.ckpt.config
    meta = {
        **reader.origin,  # input kind, source, path, files (+ hub / gguf / adapter / live details)
        "model_type": cfg.get("model_type") or reader.layout.model_types[0],
        "layout": {"name": reader.layout.model_types[0], "split": reader.split, "prefix": reader.prefix, "tensors": reader.tensor_names(0)},
        "config": {
            "n_layers": dims.n_layers,
            "d_model": dims.d,
            "n_heads": dims.n_heads,
            "n_kv_heads": dims.n_kv_heads,
            "head_dim": dims.head_dim,
            "architectures": cfg.get("architectures"),
        },
        "layers": sel,
        "dtype_read": reader.dtypes(),
        "compute_dtype": "float64",
        "tolerance": tol,
        "conventions": {
            "weights": reader.weights_note,
            "qk_product": "W_K,h^T W_Q,h (d x d); attention score x W_Q^T W_K y^T has the same singular values",
            "ov_product": "P_h W_V,h (d x d), P_h = head h's column block of W_O",
            "biases": ("present in the checkpoint and ignored by the products"
                       if reader.biases_present() else "none in the checkpoint"),
            "biases_present": reader.biases_present(),
            "position_encoding": reader.position,
            "rotary": reader.position == "rotary",
            "rotary_note": ("rotary embeddings rotate q and k by position: the static QK product "
                            "ignores relative position") if reader.position == "rotary" else None,
            "qk_norm": reader.qk_norm,
            "qk_norm_note": ("q and k are normalised per head before the score: the static QK "
                             "product ignores that nonlinearity") if reader.qk_norm else None,
            "grouped_query": "query head h uses kv head h // (H // Hkv)",
            "rank": f"numerical rank #{{sigma_i > {tol:g} * sigma_1}}",
            "effective_rank": "exp(entropy of sigma / sum sigma) (Roy & Vetterli)",
            "stable_rank": "sum sigma^2 / sigma_1^2",
            "balance_rel": "||A^T A - B^T B||_F / (||A^T A||_F + ||B^T B||_F)",
            "layer_head_index": "0-based",
        },
        "nonfinite_heads": bad.to_dict("records"),
        "versions": versions(),
    }
    return SpectraResult(
        table=table,
        sv={p: np.stack(v) for p, v in sv.items()},
        row_norms={k: np.stack(v) for k, v in norms.items()},
        meta=meta,
    )


def spectra(source: str | os.PathLike, **kwargs: Any) -> pd.DataFrame:
    """Per-head metrics as a tidy DataFrame (one row per layer × head × product)."""
    return analyze(source, **kwargs).table


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    """Per layer and product: mean rank / dh, effective rank, gap / bound, relative balance."""
    t = table.assign(rank_frac=table["rank"] / table["head_dim"],
                     gap_rel=table["gap"] / table["frob_bound"].where(table["frob_bound"] > 0))
    g = t.groupby(["layer", "product"], sort=True)
    out = g.agg(
        heads=("head", "size"),
        rank_frac=("rank_frac", "mean"),
        rank=("rank", "mean"),
        effective_rank=("effective_rank", "mean"),
        stable_rank=("stable_rank", "mean"),
        gap_rel=("gap_rel", "mean"),
        balance_rel=("balance_rel", "mean"),
    )
    return out.reset_index()


def overall(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Means over all heads and layers, per product (for notes and --json)."""
    s = table.assign(rank_frac=table["rank"] / table["head_dim"],
                     gap_rel=table["gap"] / table["frob_bound"].where(table["frob_bound"] > 0))
    res = {}
    for p, g in s.groupby("product"):
        res[str(p)] = {k: float(g[k].mean()) for k in
                       ("rank", "rank_frac", "effective_rank", "stable_rank", "gap_rel", "balance_rel")}
    return res


def save(result: SpectraResult, out: str | os.PathLike, *, plots: bool = True) -> list[Path]:
    """Write heads.csv, summary.csv, spectra.npz, meta.json (and figures) atomically."""
    out = prepare_out_dir(out)
    written = [
        write_atomic(out / "heads.csv", lambda p: result.table.to_csv(p, index=False)),
        write_atomic(out / "summary.csv", lambda p: result.summary().to_csv(p, index=False)),
        write_atomic(out / "spectra.npz", lambda p: _save_npz(p, result)),
        write_json(out / "meta.json", result.meta),
    ]
    if plots:
        from attnrank.analysis.plots import spectra_figures

        written += spectra_figures(result, out)
    return written


def _save_npz(p: Path, result: SpectraResult) -> None:
    arrays = {**result.sv, **{f"row_norms_{k}": v for k, v in result.row_norms.items()},
              "layers": np.asarray(result.meta["layers"])}
    with open(p, "wb") as fh:
        np.savez_compressed(fh, **arrays)
