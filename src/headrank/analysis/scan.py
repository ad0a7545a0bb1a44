"""The streaming loop (module `scan`; its entry points are `headrank.analyze` and `headrank.spectra`): checkpoint → one row per (layer, head, product).

Only one layer's attention weights are in memory at a time. Everything numeric goes
through :mod:`headrank.core.linalg`; everything architectural through :mod:`headrank.io.layouts`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headrank.analysis.columns import (
    Columns,
    concat,
    energy_frames,
    energy_levels_of,
    from_frame,
    save_csv,
    to_frame,
)
from headrank.analysis.figproc import FigureProcess, figure_data
from headrank.analysis.rotary import rotary_scan
from headrank.analysis.summary import overall, summary_columns
from headrank.core import baseline as rb
from headrank.core.linalg import DEFAULT_TOL, METRIC_COLUMNS, ProductMetrics
from headrank.core.metrics import METRICS, PRODUCTS, conventions
from headrank.core.precision import PRECISION_COLUMNS, precision_columns, precision_meta
from headrank.errors import HeadRankError
from headrank.io.identity import Stamps
from headrank.io.layouts import AttentionReader, HeadWeights, Layout
from headrank.io.sources import open_reader
from headrank.io.tensor_source import BaseCheckpoint
from headrank.util.args import checked
from headrank.util.constraints import SPECTRA, layers_arg
from headrank.util.env import versions
from headrank.util.fileio import prepare_out_dir, write_atomic, write_json
from headrank.util.result import ResultBase, negative_index, plain, read_csv, read_json, records
from headrank.util.threads import (
    IdleCores,
    check_precision,
    computing,
    resolve_device,
    torch_threads,
)

if TYPE_CHECKING:  # imported where used: a safetensors checkpoint is read, reduced and saved without torch,
    import pandas as pd  # and without pandas (the tables are numpy columns until a DataFrame is asked for)

TABLE_COLUMNS = ("layer", "head", "kv_head", "product", *METRIC_COLUMNS, *rb.BASELINE_COLUMNS, "head_dim", "finite",
                 *PRECISION_COLUMNS)


@dataclass(frozen=True)
class HeadSpectrum:
    """One head's product, in the spirit of TransformerLens' ``FactoredMatrix``: the singular
    values ``S`` (descending, length dh), and with ``vectors=True`` the thin SVD
    ``A Bᵀ = U diag(S) Vᵀ`` (``U``, ``V`` of shape (d, dh); None otherwise)."""

    layer: int
    head: int
    product: str
    S: np.ndarray
    U: np.ndarray | None = None
    V: np.ndarray | None = None

    @property
    def Vh(self) -> np.ndarray | None:
        """``Vᵀ`` (numpy's and TransformerLens' convention)."""
        return None if self.V is None else self.V.T


@dataclass(init=False)
class SpectraResult(ResultBase):
    """Everything ``headrank spectra`` measures.

    ``table``: one row per (layer, head, product), columns TABLE_COLUMNS.
    ``sv[product]``: (layers, heads, k) singular values, descending.
    ``row_norms[name]``: (layers, heads, dh) squared row norms of W_Q, W_K, W_V and squared
    column norms of P, per query head (kv tensors repeated for grouped-query attention): the
    Figure 4 balance check (``AᵀA = BᵀB`` puts each pair on the diagonal).
    ``meta``: source, config summary, dtypes, tolerance and conventions.
    ``rotary``: for rotary models, each head's energy per rotary band and the metrics of its
    non-rotary part (:mod:`headrank.analysis.rotary`; ``rotary.csv``), else None.
    ``vectors`` (with ``vectors=True``): ``vectors[product]["u" | "s" | "v"]``, each head's exact
    thin SVD ``A Bᵀ = U diag(S) Vᵀ`` as float32, U and V of shape (layers, heads, d, dh), S of
    shape (layers, heads, dh) (``vectors.npz``; QK: U on the key side, V on the query side, so
    a score is ``xᵀ V S Uᵀ y`` for query x and key y; OV: U in the output space).

    ``res[layer, head, "qk"]`` is one head's :class:`HeadSpectrum` (``layer`` as numbered in the
    model, not its position in the selection).

    ``inputs`` (from :func:`analyze`): the local files read, each with its identity when it was
    opened (:class:`headrank.io.identity.Stamps`): checked again after the last read, and by the
    CLI before ``--out`` is committed (a file changed meanwhile: one line, nothing written);
    ``inputs.fingerprint()`` is what ``track`` compares before it reuses a table.

    ``table`` and ``rotary`` are built as pandas DataFrames on first use: an analysis holds them
    as numpy columns (:mod:`headrank.analysis.columns`), and ``save`` writes those without
    importing pandas.

    An encoder-decoder's table has an ``attention`` column (``encoder``, ``decoder``, ``cross``;
    ``meta["attention"]`` names each entry of ``meta["layers"]`` and of the arrays' first axis,
    NaN-padded where kinds differ in heads or head dim), and ``res[attention, layer, head, "qk"]``.
    """

    verb = "spectra"

    sv: dict[str, np.ndarray]
    row_norms: dict[str, np.ndarray]
    meta: dict[str, Any]
    vectors: dict[str, dict[str, np.ndarray]] | None = None

    def __init__(self, table: pd.DataFrame | Columns | None = None, sv: dict[str, np.ndarray] | None = None,
                 row_norms: dict[str, np.ndarray] | None = None, meta: dict[str, Any] | None = None,
                 rotary: pd.DataFrame | Columns | None = None,
                 vectors: dict[str, dict[str, np.ndarray]] | None = None) -> None:
        self._frames = {"table": table, "rotary": rotary}  # a DataFrame, or numpy columns until asked for one
        self.sv, self.row_norms, self.meta, self.vectors = sv or {}, row_norms or {}, meta or {}, vectors
        self.inputs: Stamps | None = None  # the local files read, with their identity at open (analyze)

    def _frame(self, key: str) -> pd.DataFrame | None:
        value = self._frames[key]
        if isinstance(value, dict):
            value = self._frames[key] = to_frame(value)
        return value

    def _columns(self, key: str) -> Columns | None:
        """``table`` / ``rotary`` as numpy columns (no pandas unless it already is a DataFrame)."""
        value = self._frames[key]
        return value if value is None or isinstance(value, dict) else from_frame(value)

    @property
    def table(self) -> pd.DataFrame:
        """One row per (layer, head, product), columns TABLE_COLUMNS."""
        return self._frame("table")

    @table.setter
    def table(self, value: pd.DataFrame) -> None:
        self._frames["table"] = value

    @property
    def rotary(self) -> pd.DataFrame | None:
        """rotary.csv's rows (rotary models), else None."""
        return self._frame("rotary")

    @rotary.setter
    def rotary(self, value: pd.DataFrame | None) -> None:
        self._frames["rotary"] = value

    def summary(self) -> pd.DataFrame:
        """Per layer and product: heads, mean rank / dh and the means of every summary metric
        (:func:`headrank.analysis.summary.summarize`; ``summary.csv``)."""
        return to_frame(summary_columns(self._columns("table")))

    def save(self, out: str | os.PathLike, *, plots: bool = True) -> list[Path]:
        """Write the result into directory ``out`` (see :func:`save`)."""
        from headrank.io.writer import save_set

        return save_set(out, lambda stage: save(self, stage, plots=plots))  # one set, through the writer

    @classmethod
    def load(cls, out: str | os.PathLike) -> SpectraResult:
        """The result a :meth:`save` (or ``headrank spectra --out``) wrote into ``out``."""
        out = Path(out)
        meta = read_json(out / "meta.json")
        table = read_csv(out / "heads.csv").drop(columns=["source"], errors="ignore")
        with np.load(out / "spectra.npz") as z:
            sv = {p: z[p] for p in PRODUCTS if p in z.files}
            norms = {k[len("row_norms_"):]: z[k] for k in z.files if k.startswith("row_norms_")}
        rotary = read_csv(out / "rotary.csv") if (out / "rotary.csv").is_file() else None
        vectors = None
        if (out / "vectors.npz").is_file():
            with np.load(out / "vectors.npz") as z:
                vectors = {p: {k: z[f"{p}_{k}"] for k in ("u", "s", "v") if f"{p}_{k}" in z.files}
                           for p in PRODUCTS}
        return cls(table=table, sv=sv, row_norms=norms, meta=meta, rotary=rotary, vectors=vectors)

    def to_json(self) -> dict[str, Any]:
        """What ``headrank spectra --json`` prints: ``meta``, ``overall`` (means over every head
        per product) and ``layers`` (the summary's rows)."""
        return plain({"meta": self.meta, "overall": overall(self.table), "layers": records(self.summary())})

    def __getitem__(self, key: tuple[Any, ...]) -> HeadSpectrum:
        """``res[layer, head, product]``: one head's singular values (and vectors, when the
        analysis kept them); an encoder-decoder's ``res[attention, layer, head, product]``
        (``attention``: encoder, decoder or cross)."""
        kinds = self.meta.get("attention")
        want = 4 if kinds is not None else 3
        if not (isinstance(key, tuple) and len(key) == want):
            raise HeadRankError("index a spectra result as res[layer, head, product], e.g. res[0, 3, 'qk']" if want == 3
                                else "index an encoder-decoder's result as res[attention, layer, head, product], "
                                     "e.g. res['encoder', 0, 3, 'qk']")
        kind, (layer, head, product) = (key[0] if want == 4 else None), key[-3:]
        product = product.lower() if isinstance(product, str) else product  # "QK" as TransformerLens writes it
        if product not in PRODUCTS:
            raise HeadRankError(f"product must be one of {', '.join(PRODUCTS)}; got {product!r}")
        cfg = self.meta["parts"].get(kind, {}).get("config", {}) if kinds is not None else self.meta.get("config", {})
        layer, head = negative_index(layer, cfg.get("n_layers"), "layer"), negative_index(head, cfg.get("n_heads"), "head")
        units = list(zip(kinds, self.meta["layers"], strict=True)) if kinds is not None else list(self.meta["layers"])
        unit = (kind, layer) if kinds is not None else layer
        if unit not in units:
            if kinds is not None and kind not in kinds:
                raise HeadRankError(f"attention {kind!r} was not analysed; analysed: {list(dict.fromkeys(kinds))}")
            have = [u[1] for u in units if u[0] == kind] if kinds is not None else units
            raise HeadRankError(f"layer {layer!r} was not analysed; analysed: {have}")
        i = units.index(unit)
        n = self.meta["parts"][kind]["config"]["n_heads"] if kinds is not None else self.sv[product].shape[1]
        if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < n:
            raise HeadRankError(f"head must be an integer in 0..{n - 1}; got {head!r}")
        vec = (self.vectors or {}).get(product)
        S = self.sv[product][i, head]
        k = int(np.count_nonzero(~np.isnan(S)))  # an encoder-decoder's kinds may be NaN-padded
        return HeadSpectrum(int(layer), int(head), product, S[:k],
                            None if vec is None else vec["u"][i, head][:, :k], None if vec is None else vec["v"][i, head][:, :k])

    def repr_lines(self) -> list[str]:  # repr: layers, heads, convention; ranks against the random baseline's
        return rb.measured_against_baseline(self._columns("table"), self.meta)

    def describe(self) -> pd.DataFrame:
        """One wide row per layer (WeightWatcher style): ``layer``, ``source``, ``model_type``,
        ``heads``, ``head_dim``, then ``qk_METRIC`` / ``ov_METRIC`` means over the layer's heads
        (effective rank first; see :func:`headrank.analysis.describe.describe`)."""
        from headrank.analysis.describe import describe

        return describe(self.table, self.meta)

    def plot(self, path: str | os.PathLike | None = None):
        """One figure: effective rank (and k90) per layer, and every head's σᵢ/σ₁ coloured by
        layer; returns the matplotlib Figure (with ``path``, also writes a PNG there)."""
        from headrank.analysis.describe import plot

        return plot(self.table, self.sv, self.meta, path)


def _rows(layer: int, product: str, m: ProductMetrics, group: int, head_dim: int) -> dict[str, Any]:
    """One layer's rows of one product as columns (numpy); :func:`_table` makes the DataFrame."""
    n = m.sv.shape[0]
    cols: dict[str, Any] = {"layer": layer, "head": np.arange(n), "kv_head": np.arange(n) // group, "product": product}
    cols.update({k: np.asarray(v) for k, v in m.columns().items()})
    cols.update(head_dim=head_dim, finite=np.asarray(m.finite), **precision_columns(m))
    return cols


def layer_metrics(hw: HeadWeights, tol: float = DEFAULT_TOL, energy: tuple[float, ...] = ()
                  ) -> tuple[dict[str, ProductMetrics], dict[str, Any]]:
    """QK and OV metrics of every query head of one layer (``hw.qk()``, ``hw.ov()``:
    :class:`headrank.core.product.Product`), plus the Figure 4 row norms, in the compute setting
    in force (threads, device, precision: :func:`headrank.util.threads.computing`).

    Each distinct factor is reduced once (a kv head shared by a group of query heads too), and
    its root stays cached on ``hw`` for the rotary scan and the singular vectors. The squared row
    norms of W_Q, W_K, W_V and column norms of P are the diagonals of the factors' Gram matrices
    ``RᵀR`` (column sums of ``R²``), so they cost nothing extra.
    """
    metrics = {"qk": hw.qk().metrics(tol, energy), "ov": hw.ov().metrics(tol, energy)}  # energy: levels certified
    r = hw.roots()
    gram_diag = lambda r: (r * r).sum(-2)  # noqa: E731
    norms = {"q": gram_diag(r["q"]), "k": gram_diag(hw.kv_for_query_heads(r["k"])),
             "v": gram_diag(hw.kv_for_query_heads(r["v"])), "p": gram_diag(r["p"])}
    return metrics, norms


def _fault_in(hw: HeadWeights) -> None:
    """Read one byte of every page of the layer's tensors, here in the reader thread.

    safetensors returns views of its memory map: without this the disk (or page-cache) reads
    would happen inside the compute workers' upcast, and reading the next layer would overlap
    nothing. One byte per 4 KiB page costs almost no CPU; the kernel's read-ahead does the rest.
    """
    seen = set()
    for w in (hw.wq, hw.wk, hw.wv, hw.p):
        if not type(w).__module__.startswith("torch"):
            root = w
            while isinstance(root.base, np.ndarray):  # the view of the file's map (io.checkpoint._NumpyFile)
                root = root.base
            if id(root) not in seen and root.flags.c_contiguous and root.base is not None:  # mapped, not computed
                seen.add(id(root))
                root.reshape(-1).view(np.uint8)[::4096].sum()
            continue
        import torch

        storage = w.untyped_storage()
        if storage.data_ptr() in seen or w.device.type != "cpu":
            continue
        seen.add(storage.data_ptr())
        torch.empty(0, dtype=torch.uint8).set_(storage)[::4096].sum()


def _stream(reader: AttentionReader, sel: list[int], tol: float, threads: int | None,
            timing: dict[str, float] | None = None, used: list[int] | None = None, energy: tuple[float, ...] = ()):
    """Yield ``(i, hw, metrics, row_norms)`` per selected layer; layer i+1 is read meanwhile
    (:meth:`~headrank.io.layouts.AttentionReader.stream`: resident memory stays about two
    layers' stored weights). ``timing``, if given, is filled with seconds: ``wall`` (first read
    to last layer's metrics), ``read`` (inside the reader), ``compute`` (the metrics),
    ``compute_waited_on_read`` (the metrics idle until a layer was read) and
    ``read_waited_on_compute`` (the reader idle). ``threads`` None: the idle cores
    (:class:`~headrank.util.threads.IdleCores`), re-checked before each layer, set in the
    compute setting for the layer's work; ``used``, if given, receives each layer's count.
    """
    import time

    from headrank.io.stfile import BufferPool, reading_into

    t = {"read": 0.0, "compute": 0.0}
    pool = BufferPool()  # a layer's read buffers reused by the layer after next: no fresh pages per read

    def read(i: int) -> HeadWeights:
        t0 = time.perf_counter()
        try:
            with reading_into(pool):
                hw = reader.read_layer(i)
            _fault_in(hw)
            return hw
        finally:
            t["read"] += time.perf_counter() - t0

    cores = IdleCores(threads)
    start = time.perf_counter()
    with reader.stream(sel, read) as layers, torch_threads(1):
        for i, hw in layers:
            threads_now = cores.threads()  # the idle cores now (others' load since the last layer), unless set
            if used is not None:
                used.append(threads_now)
            t0 = time.perf_counter()
            with computing(threads=threads_now):
                metrics, row_norms = layer_metrics(hw, tol, energy)
            t["compute"] += time.perf_counter() - t0
            if timing is not None:
                wall = time.perf_counter() - start
                timing.update(t, compute_waited_on_read=layers.waited, wall=wall, read_waited_on_compute=wall - t["read"])
            yield i, hw, metrics, row_norms
            del hw, metrics, row_norms


def attention_layers(reader: AttentionReader, sel: list[int], everything: bool) -> list[int]:
    """``sel`` restricted to the layers that have softmax attention (a hybrid's generated layout
    reads only those; naming another layer is an error, one line)."""
    have = getattr(reader, "layer_ids", None)
    if have is None or len(have) == reader.dims.n_layers:
        return sel
    if everything:
        return list(have)
    missing = [i for i in sel if i not in set(have)]
    if missing:
        raise HeadRankError(f"layer {missing[0]} has no softmax attention; attention layers: "
                            f"{', '.join(map(str, have[:40]))}")
    return sel


def parse_layers(spec: str | None, n_layers: int) -> list[int]:
    """``None`` → all; ``"0,3,5-7"`` → those layers (0-based, inclusive ranges, in range, non-empty).

    Bounds are checked before any range is expanded, so ``0-1e20`` or ``3-1`` is one line.
    """
    if spec is None:
        return list(range(n_layers))
    if not isinstance(spec, str):
        raise HeadRankError(f"`layers` must be a string like 0,2,5-7; got {type(spec).__name__}")
    if not spec.strip():
        raise HeadRankError("`layers` is empty: give layers like 0,2,5-7 (or leave it out for all)")
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
            raise HeadRankError(f"`layers` must look like 0,2,5-7; got {spec!r}"[:300]) from None
        if b < a:
            raise HeadRankError(f"`layers` {spec!r}: the range {part} is empty (write low-high)"[:300])
        for i in (a, b):
            if not 0 <= i < n_layers:
                shown = str(i) if len(str(i)) <= 20 else str(i)[:17] + "..."
                raise HeadRankError(f"`layers` {spec[:60]!r}: layer {shown} out of range 0..{n_layers - 1}")
        out.update(range(a, b + 1))
    return sorted(out)


def _check_args(tol: Any, layers: Any, threads: Any, progress: Any) -> list[int] | str | None:
    """Types and ranges of analyze's arguments (an API caller may pass anything); the layer
    selection as a spec string or a list of ints."""
    SPECTRA.check(tol=tol, threads=threads)  # the one declaration of their bounds (headrank.util.constraints)
    if progress is not None and not callable(progress):
        raise HeadRankError(f"progress must be a callable (done, total); got {type(progress).__name__}")
    return layers_arg(layers)


def _settings(energy: Any, device: Any, precision: Any) -> tuple[Any, str | None, str]:
    """The energy levels (``--energy``), the device and the precision analyze computes with."""
    return energy_levels_of(energy), resolve_device(device), check_precision(precision)


def _compute_meta(device: str | None, threads: int | None, used: list[int]) -> dict[str, Any]:
    """meta.json's ``compute``: where the arithmetic ran and with how many worker threads."""
    return {
        "device": device or "cpu",
        "linalg": (f"torch float64 on {device} (Grams, Cholesky, QR, core SVDs)" if device else
                   "numpy float64 LAPACK on the CPU (Grams by BLAS dsyrk, Cholesky, QR, core SVDs)"),
        "threads": used,
        "threads_rule": ("pinned (--threads)" if threads is not None else
                         "idle cores: CPU affinity and cgroup quota minus the load average at the start, "
                         "then minus other processes' CPU use between layers"),
        "note": "results are bit-identical for any thread count on one device and route",
    }


# the switches by their annotation (a string such as "no" is truthy: vectors="no" computed vectors);
# each other value is checked below, in words of its own (tests/analysis/test_scan_args.py)
@checked(types=("delta", "fold_norm", "download", "remote", "allow_full", "rotary", "vectors"))
def analyze(
    source: str | os.PathLike | BaseCheckpoint | Any,
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
    remote: bool = False,
    allow_full: bool | int = False,
    rotary: bool = True,
    vectors: bool = False,
    device: str | None = "auto",
    precision: str = "auto",
    convention: str = "raw",
    energy: str | Sequence[float] | None = None,
) -> SpectraResult:
    """Exact per-head QK and OV spectra of every (or the selected) attention layer.

    ``source``, ``revision``, ``base``, ``delta``, ``fold_norm``, ``convention``, ``download``, ``remote``: open_reader.

    ``layout``: a TOML layout file (or a :class:`Layout`) for a model_type not in the table; the config then may
    be absent. ``progress(done, total)`` is called after each layer. ``threads``: worker threads, each single-threaded
    over its own heads (default: the idle cores, re-checked between layers; bounded by
    :data:`headrank.util.constraints.THREADS`; results are bit-identical for any count). ``device``:
    ``"auto"``, ``"cpu"`` (numpy LAPACK, no torch for safetensors) or ``"cuda[:N]"`` (torch
    float64 on that GPU); see docs/spectra-speed.md. ``precision``: ``"auto"`` or ``"float64"``
    (docs/methods/precision.md). ``rotary``: for rotary models, also the per-band energies and the spectra of the
    non-rotary part (``result.rotary``, :mod:`headrank.analysis.rotary`). ``vectors``: also each head's singular
    vectors (``result.vectors``; refused when they would not fit in a quarter of this machine's memory).
    """
    layers, (energy, dev, precision) = _check_args(tol, layers, threads, progress), _settings(energy, device, precision)
    reader = open_reader(source, config=config, layout=layout, revision=revision, base=base, delta=delta,
                         fold_norm=fold_norm, download=download, remote=remote, allow_full=allow_full,
                         arrays="numpy", convention=convention)
    dims, tol, spec = reader.dims, float(tol), layers if layers is None or isinstance(layers, str) else ",".join(map(str, layers))
    if reader.parts:  # an encoder-decoder: encoder, decoder and cross-attention layers
        return _read_whole(reader, _analyze_parts(reader, spec, tol, threads, vectors, progress, dev, precision, energy))
    sel = attention_layers(reader, parse_layers(spec, dims.n_layers), spec is None)
    vecs = _Vectors(dims, len(sel)) if vectors else None  # refused here when they would not fit
    rot, rot_why = rotary_scan(reader.ckpt.config, reader.position, dims.head_dim, reader.qk_norm, tol, rotary)
    with computing(device=dev, precision=precision):  # `used`: the thread counts the stream ran with
        frames, sv, norms, timing = _scan_layers(reader, sel, tol, threads, rot, vecs, progress, used := [], energy or ())
    extra = energy_frames(frames, sv, energy)  # --energy: k columns for levels the metric table lacks
    table = _table(frames, tuple(extra))  # numpy columns: pandas only for SpectraResult.table
    meta = {**_meta(reader, sel, tol, table), "compute": _compute_meta(dev, threads, used),
            "precision": precision_meta(precision, table), "timing_s": {k: round(v, 4) for k, v in timing.items()}}
    rotary = rot.columns() if rot is not None else None
    meta["conventions"].update(extra, rotary_bands=rot.meta(rotary) if rot is not None else rot_why)
    return _read_whole(reader, SpectraResult(table=table, sv={p: np.stack(v) for p, v in sv.items()},
                                             row_norms={k: np.stack(v) for k, v in norms.items()}, meta=meta,
                                             rotary=rotary, vectors=vecs.arrays() if vecs is not None else None))


def _read_whole(reader: AttentionReader, result: SpectraResult) -> SpectraResult:
    """``result``, once every local file read is still what it was when opened (after the last
    read: a file truncated, rewritten or replaced meanwhile is one line, :mod:`headrank.io.identity`);
    ``result.inputs`` for the check before an output is committed."""
    reader.ckpt.check_unchanged()
    result.inputs = reader.ckpt.stamps
    return result


def _scan_layers(reader: AttentionReader, sel: list[int], tol: float, threads: int | None, rot: Any,
                 vecs: _Vectors | None, progress: Callable[[int, int], None] | None, used: list[int] | None = None,
                 energy: tuple[float, ...] = ()):
    """Stream the selected layers: each one's table rows, singular values and row norms (and its
    rotary bands and singular vectors where asked), then the stream's timing."""
    frames: list[dict[str, Any]] = []
    sv: dict[str, list[np.ndarray]] = {p: [] for p in PRODUCTS}
    norms: dict[str, list[np.ndarray]] = {k: [] for k in ("q", "k", "v", "p")}
    timing: dict[str, float] = {}
    head_dim = reader.dims.head_dim
    with closing(_stream(reader, sel, tol, threads, timing, used, energy)) as stream:  # closed on an error too
        for done, (i, hw, metrics, row_norms) in enumerate(stream, 1):
            for product, m in metrics.items():
                frames.append({**_rows(i, product, m, hw.group, head_dim), **rb.baseline_row(hw, product, tol)})
                sv[product].append(np.asarray(m.sv))
            for k, v in row_norms.items():
                norms[k].append(np.asarray(v))
            if rot is not None:
                rot.add(i, hw, row_norms)
            if vecs is not None:
                vecs.add(hw)
            del hw, metrics, row_norms
            if progress:
                progress(done, len(sel))
    return frames, sv, norms, timing


#: what each value of the ``attention`` column means (an encoder-decoder's table; meta.json's conventions)
ATTENTION_KINDS = {
    "encoder": "encoder self-attention: queries and keys from the encoder's hidden states",
    "decoder": "decoder self-attention (causal): queries and keys from the decoder's hidden states",
    "cross": ("cross-attention: queries from the decoder (W_Q on the decoder side), keys and values from the "
              "encoder's output (W_K, W_V on the encoder side); QK = W_K,h^T W_Q,h reads a decoder state against "
              "an encoder state, OV = P_h W_V,h writes what it reads from the encoder into the decoder"),
}


def part_layers(reader: AttentionReader, spec: str | None) -> list[tuple[AttentionReader, list[int]]]:
    """An encoder-decoder's selection: ``spec`` (layer indices) read against every kind of
    attention, each kind keeping the selected layers it has."""
    sel = parse_layers(spec, max(p.dims.n_layers for p in reader.parts))
    out = [(p, [i for i in sel if i in set(p.layer_ids)]) for p in reader.parts]
    return [(p, s) for p, s in out if s]


def _padded(arrays: list[np.ndarray]) -> np.ndarray:
    """Per-layer arrays stacked, NaN-padded to the largest shape (kinds with other head counts)."""
    shape = tuple(max(a.shape[j] for a in arrays) for j in range(arrays[0].ndim))
    out = np.full((len(arrays), *shape), np.nan, dtype=np.result_type(*arrays, np.float32))
    for j, a in enumerate(arrays):
        out[(j, *map(slice, a.shape))] = a
    return out


def _analyze_parts(reader: AttentionReader, spec: str | None, tol: float, threads: int | None, vectors: bool,
                   progress: Callable[[int, int], None] | None, device: Any, precision: str,
                   energy: tuple[float, ...] | None) -> SpectraResult:
    """:func:`analyze` of an encoder-decoder: every kind's layers in turn (encoder, decoder,
    cross), one table with an ``attention`` column and the same columns, precision and energy levels
    as any other model's; arrays stacked over (kind, layer)."""
    sels = part_layers(reader, spec)
    total = sum(len(s) for _, s in sels)
    frames: list[dict[str, Any]] = []
    sv: dict[str, list[np.ndarray]] = {p: [] for p in PRODUCTS}
    norms: dict[str, list[np.ndarray]] = {k: [] for k in ("q", "k", "v", "p")}
    vecs: dict[str, dict[str, list[np.ndarray]]] = {p: {} for p in PRODUCTS}
    timing: dict[str, float] = {}
    used: list[int] = []
    for part, sel in sels:
        vec = _Vectors(part.dims, len(sel)) if vectors else None
        offset = len(sv["qk"])
        step = (lambda done, _t, o=offset: progress(o + done, total)) if progress else None
        with computing(device=device, precision=precision):
            f, s, n, t = _scan_layers(part, sel, tol, threads, None, vec, step, used, energy or ())
        frames += [{"attention": part.layout.attention, **x} for x in f]
        for k, v in (*s.items(), *n.items()):
            (sv if k in sv else norms)[k] += v
        timing = {k: timing.get(k, 0.0) + v for k, v in t.items()}
        for p, arrs in (vec.arrays() if vec is not None else {}).items():
            for k, a in arrs.items():
                vecs[p].setdefault(k, []).extend(a)
    extra = energy_frames(frames, sv, energy)  # --energy: k columns for levels the metric table lacks
    table = _table(frames, tuple(extra), lead=("attention",))
    meta = {**_meta(reader, [i for _, sel in sels for i in sel], tol, table),
            "attention": [p.layout.attention for p, sel in sels for _ in sel],
            "parts": {p.layout.attention: {"layers": sel, "layout": {"split": p.split, "prefix": p.prefix,
                                                                     "tensors": p.tensor_names(p.layer_ids[0])},
                                           "config": {"n_layers": p.dims.n_layers, "d_model": p.dims.d,
                                                      "n_heads": p.dims.n_heads, "n_kv_heads": p.dims.n_kv_heads,
                                                      "head_dim": p.dims.head_dim},
                                           "position_encoding": p.position, "qk_norm": p.qk_norm}
                      for p, sel in sels},
            "compute": _compute_meta(device, threads, used), "precision": precision_meta(precision, table), "timing_s": {k: round(v, 4) for k, v in timing.items()}}
    meta["conventions"].update(attention_kinds={p.layout.attention: ATTENTION_KINDS[p.layout.attention]
                                                for p, _ in sels}, rotary_bands=None,
                               position_encoding={p.layout.attention: p.position for p, _ in sels}, **extra)
    return SpectraResult(table=table, sv={p: _padded(v) for p, v in sv.items()},
                         row_norms={k: _padded(v) for k, v in norms.items()}, meta=meta,
                         vectors={p: {k: _padded(v) for k, v in d.items()} for p, d in vecs.items()} if vectors else None)


class _Vectors:
    """Each selected layer's exact per-head singular vectors (``hw.qk().svd()``, ``hw.ov().svd()``:
    the roots the metrics formed), float32."""

    #: what computing them costs beyond the arrays themselves: torch, imported for them alone (the
    #: spectra route is numpy), and its LAPACK workspaces (benchmarks/bench_vectors.py: +290 MiB)
    TORCH_BYTES = 320 * 2**20

    @classmethod
    def memory(cls, dims: Any, n_layers: int) -> tuple[int, int]:
        """(the vectors' bytes, the memory they need): the arrays, two layers' worth more for one
        layer's float64 factors and SVD while it is added, and :data:`TORCH_BYTES` (measured on a
        12-layer d = 2048 LLaMA, 768 MiB of vectors: the peak RSS grew by 1,055 MiB, this counts
        1,216 MiB; benchmarks/bench_vectors.py)."""
        layer = 2 * dims.n_heads * dims.head_dim * (2 * dims.d + 1) * 4
        return n_layers * layer, (n_layers + 2) * layer + cls.TORCH_BYTES

    def __init__(self, dims: Any, n_layers: int) -> None:
        from headrank.io.validate import memory_bytes

        _, need = self.memory(dims, n_layers)
        if need > memory_bytes() / 4:
            raise HeadRankError(f"singular vectors of {n_layers} layers need {need / 2**30:.1f} GiB, more than a "
                                "quarter of this machine's memory: select fewer `layers`")
        # each array allocated once, at the first layer, and filled layer by layer: no final stacking
        # copy beyond the guard above
        self.n_layers, self.done = n_layers, 0
        self.parts: dict[str, dict[str, np.ndarray]] = {p: {} for p in PRODUCTS}

    def add(self, hw: HeadWeights) -> None:
        for product in PRODUCTS:
            u, s, v = (hw.qk() if product == "qk" else hw.ov()).svd()
            for key, x in (("u", u), ("s", s), ("v", v)):
                arr = x.numpy()  # float64, rounded to float32 as it is copied in (no float32 copy of its own)
                into = self.parts[product].get(key)
                if into is None:
                    into = self.parts[product][key] = np.empty((self.n_layers, *arr.shape), dtype=np.float32)
                into[self.done] = arr
            del u, s, v, x, arr  # one product's float64 factors at a time
        self.done += 1

    def arrays(self) -> dict[str, dict[str, np.ndarray]]:
        return {p: {k: v[:self.done] for k, v in d.items()} for p, d in self.parts.items()}


def _table(frames: list[dict[str, Any]], counts: tuple[str, ...] = (), lead: tuple[str, ...] = ()) -> Columns:
    """The layers' rows in one table (numpy columns: ``lead`` (an encoder-decoder's ``attention``),
    TABLE_COLUMNS, then ``counts``, the --energy k columns); the metric table's counts (rank, k90, k99,
    k999) and ``counts`` as int64 unless a non-finite head made them NaN."""
    table = concat(frames, (*lead, *TABLE_COLUMNS, *counts))
    table["finite"] = table["finite"].astype(bool)
    for name in [m.name for m in METRICS if m.integer] + list(counts):
        col = table[name]
        table[name] = col.astype(np.float64 if col.dtype.kind == "f" and np.isnan(col).any() else np.int64)
    return table


def _meta(reader: AttentionReader, sel: list[int], tol: float, table: Columns) -> dict[str, Any]:
    """meta.json: the source, the config summary, dtypes, tolerance and conventions."""
    dims = reader.dims
    keys = [c for c in ("attention", "layer", "head", "product") if c in table]
    bad = [{k: str(table[k][i]) if k in ("attention", "product") else int(table[k][i]) for k in keys}
           for i in np.flatnonzero(~np.asarray(table["finite"], dtype=bool)).tolist()]
    cfg = reader.ckpt.config
    return {
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
        "compute_dtype": "float64 after the Grams (precision: the Grams' route)",
        "tolerance": tol,
        "conventions": {
            "convention": reader.convention.name,
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
            **conventions(tol), **rb.baseline_conventions(),
            "layer_head_index": "0-based",
        },
        "nonfinite_heads": bad,
        "versions": versions(),
    }


def spectra(source: str | os.PathLike | BaseCheckpoint | Any, **kwargs: Any) -> SpectraResult:
    """``headrank spectra SOURCE``: exact per-head spectra of W_Kᵀ W_Q and P W_V
    (``docs/verbs/spectra.md``); the same as :func:`analyze`.

    Parameters
    ----------
    source
        A checkpoint directory, a weights file, ``"minilm"``, a Hugging Face id, an http(s)
        URL, a ``.gguf`` file, a LoRA adapter, a training run, a live ``nn.Module`` or a
        TransformerLens model.
    **kwargs
        The options of :func:`analyze` (``layers``, ``tol``, ``threads``, ``vectors`` …).

    Returns
    -------
    SpectraResult
        ``.table`` one row per (layer, head, product); ``res[layer, head, "qk"]`` one head.
    """
    return analyze(source, **kwargs)


def save(result: SpectraResult, out: str | os.PathLike, *, plots: bool = True,
         figures: FigureProcess | None = None) -> list[Path]:
    """Write heads.csv, summary.csv, spectra.npz, meta.json (rotary.csv for rotary models, and figures) atomically.

    ``figures``: a :class:`~headrank.analysis.figproc.FigureProcess` started earlier (the CLI
    starts one before importing torch); it draws while the tables are written, and this waits
    for it. Without one (or if it fails) the figures are drawn here.
    """
    out = prepare_out_dir(out)
    table = result._columns("table")  # numpy columns: written without pandas
    data = figure_data(result) if plots and len(table["layer"]) else None  # no rows: tables only, no figures
    sent = figures is not None and data is not None and figures.submit(data, out)
    try:
        heads = {**table, "source": np.full(len(table["layer"]), str(result.meta.get("source")))}
        written = [
            write_atomic(out / "heads.csv", lambda p: save_csv(p, heads)),
            write_atomic(out / "summary.csv", lambda p: save_csv(p, summary_columns(table))),
            write_atomic(out / "spectra.npz", lambda p: _save_npz(p, result)),
            write_json(out / "meta.json", result.meta),
        ]
        rotary = result._columns("rotary")
        if rotary is not None:
            written.append(write_atomic(out / "rotary.csv", lambda p: save_csv(p, rotary)))
        if result.vectors is not None:
            written.append(write_atomic(out / "vectors.npz", lambda p: _save_vectors(p, result)))
    except BaseException:
        if figures is not None:
            figures.close()
        raise
    if data is not None:
        drawn = figures.wait() if sent else None
        if drawn is None:
            from headrank.analysis.plots import draw_spectra

            drawn = draw_spectra(data, out)
        written += drawn
    elif figures is not None:
        figures.close()
    return written


def _save_npz(p: Path, result: SpectraResult) -> None:
    arrays = {**result.sv, **{f"row_norms_{k}": v for k, v in result.row_norms.items()},
              "layers": np.asarray(result.meta["layers"])}
    if result.meta.get("attention") is not None:  # an encoder-decoder: each entry's kind (encoder, decoder, cross)
        arrays["attention"] = np.asarray(result.meta["attention"], dtype=str)
    with open(p, "wb") as fh:
        np.savez_compressed(fh, **arrays)


def _save_vectors(p: Path, result: SpectraResult) -> None:
    arrays = {f"{prod}_{k}": v for prod, d in (result.vectors or {}).items() for k, v in d.items()}
    with open(p, "wb") as fh:
        np.savez(fh, layers=np.asarray(result.meta["layers"]), **arrays)
