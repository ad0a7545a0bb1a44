"""The compress pipeline: :func:`compress`, :func:`cost_curve` and :func:`cut_in_place`."""


from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from headrank.compress import safety
from headrank.compress.allocate import annotate, reallocate
from headrank.compress.api import (
    Plan,
    cut_layers,
    make_plan,
    open_source,
    parse_products,
    source_dir,
)
from headrank.compress.evaluate import Scorer, TextSpec, calibration
from headrank.compress.factored import (
    FORMAT,
    MANIFEST,
    STEM,
    load_compressed,
)
from headrank.compress.latent import kv_measure
from headrank.compress.options import (
    baseline_key,
    cached_baseline,
    check_context,
    check_options,
    store_baseline,
    text_spec,
)
from headrank.compress.plan import Rule, choose
from headrank.compress.report import kv_block, summary
from headrank.compress.result import CompressResult
from headrank.compress.write import ShardWriter, copy_side_files, save_hf_side
from headrank.errors import HeadRankError
from headrank.io.writer import OutputSet
from headrank.models.opener import context_length, load
from headrank.util.args import checked
from headrank.util.constraints import layers_arg
from headrank.util.fileio import write_json
from headrank.util.threads import (
    check_precision,
    compute_setting,
    computing,
    resolve_device,
    torch_threads,
)


def _original(reader, live, what: str) -> tuple[Any, Any]:
    """The uncut model and its tokenizer, for ``what`` (the options that asked, in their words)."""
    if live is not None:
        tok = getattr(live, "_headrank_tokenizer", None)
        if tok is None:
            raise HeadRankError(f"{what}: needs a tokenizer; this GGUF file holds none")
        return live, tok
    src = source_dir(reader)
    if src is None:
        raise HeadRankError(f"{what}: needs a checkpoint directory transformers can load")
    return load(src, what=what)


def _asked(run: dict[str, Any], whiten: bool) -> str:
    """The options that need the uncut model loaded, in their words (the default whitened cut named as such)."""
    asked = (("`whiten`" if run["whiten"] else "the default whitened cut (`whiten`)") if whiten else None,
             "`evaluate`" if run["evaluate"] else None, "`allocate` loss" if run["opts"]["allocate"] == "loss" else None)
    return ", ".join(a for a in asked if a)


@checked(types=("out", "evaluate", "verbose"))  # the others by options.py, in the command line's words
def compress(source: Any, out: str | os.PathLike, *, keep: float | None = None, rank: int | None = None,
             params: float | None = None, products: str | Iterable[str] | None = None, whiten: bool | None = None,
             evaluate: bool = False, text: str | os.PathLike | None = None, n_eval: int | None = None,
             n_calib: int | None = None, seq_len: int | None = None, dataset: str | None = None,
             format: str | None = None, layers: str | Iterable[int] | None = None, threads: int = 1,
             allocate: str = "energy", config: Any = None, layout: Any = None, revision: str | None = None,
             progress: Callable[[int, int | None, str], None] | None = None, verbose: bool = False,
             device: str | None = "auto", precision: str = "auto", dtype: str = "auto",
             announce: Callable[[str], None] | None = None) -> CompressResult:
    """Write the compressed checkpoint and ``compress.json`` into ``out``; return compress.json
    as a :class:`~.result.CompressResult`.

    ``source``: anything :func:`headrank.io.sources.open_reader` opens. One of ``keep``,
    ``rank``, ``params`` (:class:`~.plan.Rule`). ``products``: ``"ov,qk"`` (default: both where
    QK can be cut). ``format``: ``factored`` (only the kept dimensions; :func:`load_compressed`;
    the default where q, k, v, o are separate projections) or ``dense`` (zero-padded, same
    architecture; the default for fused projections). ``whiten``: activation-whitened cut (SVD-LLM);
    None (the default): whitened for a causal LM that has a tokenizer, calibrated on the built-in
    corpus unless ``text``/``dataset`` (its cost is announced first), plain for an encoder.
    ``announce``: called with that announcement (default: the ``headrank`` logger).
    ``evaluate``: perplexity (causal LM) or embedding drift (encoder) before and after, the after
    measured on the written checkpoint. ``n_eval``/``n_calib``/``seq_len``/``text``/``dataset``:
    the text protocol (docs/compress.md). ``layers``: cut only these (``"0,2,5-7"``). ``progress``:
    called ``(done, total, phase)``. ``device``: ``auto`` (a CUDA GPU when torch sees one), ``cpu``
    or ``cuda[:N]``: where the roots, SVDs and cut GEMMs run (float64 on a GPU; docs/compress.md).
    ``precision``: ``auto`` or ``float64``, the Grams' route (docs/methods/precision.md).
    ``dtype``: the floating dtype of the weights written, ``bfloat16``, ``float16``, ``float32``
    or ``auto`` (each tensor as read; bfloat16 for a GGUF file's factored output); config.json's
    ``dtype`` says it. Arguments are checked by the table the CLI reads
    (:data:`headrank.util.constraints.COMPRESS`).
    """
    rule = Rule.of(keep=keep, rank=rank, params=params)
    opts = check_options(format=format, threads=threads, n_eval=n_eval, n_calib=n_calib, seq_len=seq_len,
                         text=text, dataset=dataset, allocate=allocate, products=products, rule=rule, dtype=dtype)
    layers = layers_arg(layers)  # its form now, before anything is opened; its range once the depth is known
    if whiten not in (None, True, False):
        raise HeadRankError(f"`whiten` must be True, False or None (the default: whitened for a causal LM); got "
                            f"{str(whiten)[:40]!r}")
    tell = progress or (lambda *a: None)
    given = [Path(source)] if isinstance(source, (str, os.PathLike)) and os.path.exists(source) else []
    precision = check_precision(precision)
    dest = OutputSet(out, sources=given, owns="compress.json")
    with torch_threads(opts["threads"]), computing(precision=precision), dest:  # --out checked once (before
        # the model is read) and locked
        tell(0, None, "loading")
        reader, live, gguf_note = open_source(source, config=config, layout=layout, revision=revision,
                                              verbose=verbose)
        dest.refuse_sources(_source_paths(reader, source))  # where a name ('minilm', a Hub id) led
        _check_source(reader, rule)
        run = dict(rule=rule, opts=opts, whiten=whiten, evaluate=evaluate, layers=layers, device=device, tell=tell,
                   announce=announce or safety.announce)
        return _pipeline(dest, reader, live, gguf_note, run)


def _pipeline(dest: OutputSet, reader, live, gguf_note: str | None, run: dict[str, Any]) -> CompressResult:
    """:func:`compress` once the source is open and ``--out`` held: calibrate, plan, cut, write,
    evaluate."""
    opts, tell, evaluate = run["opts"], run["tell"], run["evaluate"]
    prods, note = parse_products(opts["products"], reader)
    src = source_dir(reader)
    fmt = _Format(opts, reader.split, _model_type(reader, live), src is not None and (src / "modules.json").is_file())
    todo = _layers(run["layers"], reader.dims.n_layers)
    dev = resolve_device(run["device"])
    spec = text_spec(opts, reader, live)
    notes = [n for n in (_gguf_note(gguf_note, fmt(), opts["dtype"]) if live is not None else None, note) if n]
    whiten = safety.default_whiten(run["whiten"], reader, live, source_dir(reader), notes)
    orig = tok = None
    if whiten or evaluate or opts["allocate"] == "loss":
        orig, tok = _original(reader, live, _asked(run, whiten))
        spec = _fit_context(orig, spec, opts, notes)
    if whiten:
        run["announce"](safety.calibration_cost(orig, tok, spec))
    Ls = (calibration(orig, tok, reader.layout.modules, spec, reader.dims.n_layers,
                      lambda d, t: tell(d, t, "calibrating")) if whiten else None)
    plan = make_plan(reader, run["rule"], prods, Ls, lambda d, t: tell(d, t, "spectra"), todo, opts["threads"], dev,
                     stream=opts["allocate"] == "energy")
    plan, alloc = reallocate(plan, opts["allocate"], orig, tok, reader if live is not None else None, spec,
                             cut_in_place, lambda d, t: tell(d, t, "allocating"))
    with dest.stage() as stage:
        result = _write(reader, live, plan, stage, opts, fmt, notes, tell)
        annotate(result, alloc, plan)
        result["whitened"] = bool(whiten)
        kv = _evaluate(orig, tok, stage, spec, opts["format"], reader, result, tell) if evaluate else None
        kv_block(result, kv)
        safety.judge(result, run)
        write_json(stage / "compress.json", dict(result))
    return result


def _source_paths(reader, source: Any) -> list[Path]:
    """Every path the run reads from: ``--out`` may be none of them, nor inside one."""
    paths = [getattr(reader.ckpt, "path", None), *(getattr(reader.ckpt, "files", None) or [])]
    if isinstance(source, (str, os.PathLike)) and os.path.exists(source):
        paths.append(source)
    return [Path(p) for p in paths if isinstance(p, (str, os.PathLike)) and os.path.exists(p)]  # a live model: none


def _fit_context(model, spec: TextSpec, opts: dict[str, Any], notes: list[str]) -> TextSpec:
    """:func:`~.options.check_context`; a default ``seq_len`` capped at the context is noted."""
    fitted = check_context(model, spec, given=opts["seq_len"] is not None)
    if fitted.seq_len != spec.seq_len:
        notes.append(f"windows of {fitted.seq_len} tokens: the default {spec.seq_len} capped at the model's context")
    return fitted


def _check_source(reader, rule: Rule) -> None:
    """What no cut of ``reader`` can do: an adapter (merge it first), a rank above the head dim."""
    if reader.origin.get("input") == "adapter":
        raise HeadRankError("a LoRA adapter: merge it into its base first (peft's merge_and_unload, then "
                            "save_pretrained) and compress the merged checkpoint")
    if rule.kind == "rank" and rule.value > reader.dims.head_dim:
        raise HeadRankError(f"`rank` {int(rule.value)} exceeds the head dimension {reader.dims.head_dim}")


def _model_type(reader, live) -> str | None:
    if live is not None:
        return getattr(live.config, "model_type", None)
    t = (reader.ckpt.config or {}).get("model_type")
    return t if isinstance(t, str) else None


class _Format:
    """``format``, chosen by :func:`_choose_format` when made. Where the choice needs
    transformers (is the model_type one it builds?), transformers is imported here, in the
    caller's thread: never by a background thread (an import racing the main thread's use of
    the same library hands one of them a half-initialised module)."""

    def __init__(self, opts: dict[str, Any], split: str, model_type: str | None, sentence_transformers: bool = False):
        self.opts, self.split, self.model_type = opts, split, model_type
        known = False
        if split == "separate" and opts["format"] != "dense" and isinstance(model_type, str):
            from transformers import CONFIG_MAPPING

            known = model_type in CONFIG_MAPPING
        self.note: str | None = _choose_format(opts, split, model_type, known, sentence_transformers)

    def __call__(self) -> str:
        return self.opts["format"]


_ST_NOTE = ("a sentence-transformers model (modules.json): SentenceTransformer(OUT) loads a --format dense output; "
            "a factored one loads only with headrank.load_compressed")


def _choose_format(opts: dict[str, Any], split: str, model_type: str | None, known: bool,
                   sentence_transformers: bool = False) -> str | None:
    """Factored where q, k, v and o are separate projections of a model transformers builds
    (``known``; load_compressed needs both), except for a sentence-transformers model, whose
    loader reads ``model.safetensors`` (dense); a note when dense is chosen for the user."""
    if sentence_transformers and opts["format"] is None:
        opts["format"] = "dense"
        return f"written --format dense ({_ST_NOTE})"
    if sentence_transformers and opts["format"] == "factored":
        if not (split == "separate" and known):
            _choose_format(opts, split, model_type, known)  # refused there, in one line
        return f"written --format factored: {_ST_NOTE}"
    if split == "separate" and known:
        opts["format"] = opts["format"] or "factored"
        return None
    why = (f"this model's q, k, v projections are {split.replace('_', ' ')}" if split != "separate" else
           f"transformers does not build model_type {model_type!r}, which load_compressed needs")
    if opts["format"] == "factored":
        raise HeadRankError(f"`format` factored needs separate q, k, v and o projections of a transformers "
                            f"model; {why}: use `format` dense")
    if opts["format"] is None:
        opts["format"] = "dense"
        return f"written --format dense ({why}; the factored format needs separate projections of a transformers model)"
    return None


def _gguf_note(note: str | None, fmt: str, dtype: str = "auto") -> str | None:
    if note is None:
        return None
    return note.replace("(float32, dequantized by transformers)",
                        f"({dtype} by --dtype, dequantized by transformers)" if dtype != "auto" else
                        "(bfloat16, dequantized by transformers)" if fmt == "factored" else
                        "(float32, dequantized by transformers; --format factored writes bfloat16)")


def _layers(layers: str | Iterable[int] | None, n_layers: int) -> tuple[int, ...] | None:
    if layers is None:
        return None
    from headrank.analysis.scan import parse_layers

    sel = layers_arg(layers)  # the one structural check spectra makes too; the range against the model's depth here
    return tuple(parse_layers(sel if isinstance(sel, str) else ",".join(map(str, sel)), n_layers))


def _tied(model) -> set[str]:
    """State-dict names sharing storage with an earlier one (tied embeddings)."""
    seen, tied = set(), set()
    for name, t in model.state_dict(keep_vars=True).items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            tied.add(name)
        seen.add(key)
    return tied


def _write(reader, live, plan: Plan, stage: Path, opts: dict[str, Any], fmt: _Format, notes: list[str],
           tell) -> CompressResult:
    """Cut, write the weight files, the side files and compress.json's contents."""
    writer, rows, manifest = ShardWriter(stage, dtype=_out_dtype(opts["dtype"], live, fmt(), reader)), [], {}
    fresh = _fresh_reads(reader)
    try:
        for lc in cut_layers(reader, plan, tell, opts["threads"], lambda: fmt() == "factored"):
            manifest.update(lc.entries)
            for name, t in lc.tensors.items():
                writer.add(name, t, dense_numel=_dense_numel(reader, name, t), owned=True)
            for name, t in lc.same.items():
                writer.add(name, t, owned=fresh)
            rows += lc.rows
        factored = fmt() == "factored"
        writer.stem = STEM if factored else "model"
        skip = _tied(live) if live is not None else set()
        names = [n for n in (live.state_dict() if live is not None else reader.ckpt.keys()) if n not in skip]
        for j, name in enumerate(names):
            if name not in writer.names:
                writer.add(name, reader.ckpt.get(name), owned=fresh)
            tell(j + 1, len(names), "writing")
        reader.ckpt.release()
        files = writer.finish()
    finally:
        writer.close()
    notes += [fmt.note] if fmt.note else []
    if factored:
        write_json(stage / MANIFEST, {"format": FORMAT, "version": 1, "modules": manifest})
        files.append(MANIFEST)
    side = (save_hf_side(live, stage, getattr(live, "_headrank_tokenizer", None)) if live is not None
            else copy_side_files(source_dir(reader), stage, notes))
    if "config.json" not in side and reader.ckpt.config:  # a single weights file, a state_dict
        write_json(stage / "config.json", reader.ckpt.config)
        side.append("config.json")
    _dequantized(reader, stage, notes, opts["dtype"])
    _config_dtype(stage, writer.dtypes)
    result = CompressResult(summary(reader, plan, rows, notes, files + [s for s in side if s not in files]))
    result["checkpoint"] = {**writer.report(opts["format"]), "dtype": opts["dtype"], **_input_bytes(reader)}
    result["compute"] = {**_compute(plan, opts["threads"]), "precision": compute_setting().precision}
    return result


def _out_dtype(name: str, live, fmt: str, reader) -> torch.dtype | None:
    """``dtype`` as the writer's cast: None (``auto``: each tensor as read), except a GGUF file's
    factored output, bfloat16 (never float32 by accident), and a quantized source's output: the
    dtype its config declares for the model (``torch_dtype``/``dtype``; bfloat16 where it names
    none), never the float64 its codes are dequantized in (4x the bytes of the model it stands for)."""
    if name != "auto":
        return getattr(torch, name)
    if getattr(reader.ckpt, "quantization", None) is not None:
        return getattr(torch, declared_dtype(reader.ckpt.config or {}))
    return torch.bfloat16 if live is not None and fmt == "factored" else None


def declared_dtype(config: dict[str, Any]) -> str:
    """The floating dtype a config declares for its model, bfloat16 where it declares none."""
    said = config.get("torch_dtype", config.get("dtype"))
    return said if said in ("bfloat16", "float16", "float32") else "bfloat16"


def _config_dtype(stage: Path, written: set[str]) -> None:
    """config.json's ``dtype`` (and ``torch_dtype`` where it has one): the floating dtype written,
    what transformers' ``dtype="auto"`` loads; left as it was when the weights hold several."""
    floats = [d for d in written if d.startswith(("float", "bfloat"))]
    if len(floats) != 1 or not (stage / "config.json").is_file():
        return
    from headrank.io.validate import read_json

    cfg = read_json(stage / "config.json", "config")
    said = {k: floats[0] for k in ("dtype", "torch_dtype") if k == "dtype" or k in cfg}
    if any(cfg.get(k) != v for k, v in said.items()):  # rewritten only where it would say otherwise
        write_json(stage / "config.json", {**cfg, **said})


def _dequantized(reader, stage: Path, notes: list[str], dtype: str = "auto") -> None:
    """A quantized source is read dequantized (io.schemes: code x scale, float64): the weights written are
    those values, not codes, so the config written loses its quantization_config, and a note says so."""
    quant = getattr(reader.ckpt, "quantization", None)
    if quant is None or not (stage / "config.json").is_file():
        return
    from headrank.io.validate import read_json

    cfg = read_json(stage / "config.json", "config")
    cfg.pop("quantization_config", None)
    cfg.pop("compression_config", None)
    write_json(stage / "config.json", cfg)
    notes.append(f"source quantized ({quant['method']}: {quant['scheme']}): read dequantized (code x scale, exact in "
                 "float64) and written dequantized, without its quantization_config, "
                 + (f"in {declared_dtype(cfg)}, the dtype its config declares (rounded from the exact "
                    "float64; --dtype float32 keeps more)" if dtype == "auto" else f"in {dtype} (--dtype)"))


def _input_bytes(reader) -> dict[str, Any]:
    """The input's weight files as they are on disk (a GGUF: its file, quantized), to compare the
    output with what the user had, beside the uncut model in the output's dtype."""
    files = [getattr(reader, "source_file", None)] if getattr(reader, "source_file", None) else \
        list(getattr(reader.ckpt, "files", None) or [])
    try:
        n = sum(Path(f).stat().st_size for f in files)
    except (OSError, TypeError):
        return {}
    return {"bytes_input": n, "input_files": len(files)} if files else {}


def _compute(plan: Plan, threads: int) -> dict[str, Any]:
    """compress.json's ``compute``: where the arithmetic ran, with how many threads."""
    on = plan.device or "cpu"
    return {"device": on, "threads": threads,
            "linalg": (f"torch float64 on {on} (Grams, Cholesky, QR, core SVDs, cut GEMMs)" if plan.device else
                       "CPU: roots by numpy float64 LAPACK (Grams by BLAS dsyrk, Cholesky, QR), core SVDs by torch "
                       "float64, cut GEMMs in float32 for a 16-bit checkpoint (float64 otherwise)"),
            "passes": 1 if plan.streamed else 2}


def _fresh_reads(reader) -> bool:
    """Every tensor the reader gives is a fresh buffer nobody else holds (a local safetensors
    checkpoint, read with ``pread``): the writer keeps it without a copy."""
    from headrank.io.checkpoint import Checkpoint

    ckpt = reader.ckpt
    return type(ckpt) is Checkpoint and bool(ckpt.files) and all(f.suffix == ".safetensors" for f in ckpt.files)


def _dense_numel(reader, name: str, t: torch.Tensor) -> int:
    """Elements of ``name`` in the uncut checkpoint (a factored tensor is smaller)."""
    try:
        return int(torch.Size(reader.ckpt.meta(name).shape).numel())
    except Exception:  # noqa: BLE001 - a source without shapes up front: the tensor as written
        return t.numel()


def _evaluate(orig, tok, stage: Path, spec: TextSpec, fmt: str, reader, result: dict[str, Any], tell
              ) -> dict[str, Any] | None:
    """``result["eval"]``: the cost measured on the written checkpoint; returns the KV cache's
    measurement (factored: :func:`~.latent.kv_measure`)."""
    write_json(stage / "compress.json", dict(result))  # the head layout load_compressed reads
    scorer = Scorer(orig, tok, spec)
    key = baseline_key(reader, scorer)
    before = cached_baseline(key)
    cached = before is not None
    if before is None:
        before = scorer(orig, lambda d, t: tell(d, t, "evaluating uncut"))
        store_baseline(key, before)
    factored = fmt == "factored"
    after_model = load_compressed(stage, dtype=torch.float32, latent_kv=True) if factored else load(stage, what="`evaluate`")[0]
    after = scorer(after_model, lambda d, t: tell(d, t, "evaluating cut"))
    how = "headrank.load_compressed, latent_kv=True" if factored else "transformers"
    result["eval"] = {"metric": scorer.metric, "before": before, "after": after, "before_cached": cached,
                      "text": scorer.note, "note": f"after: measured on the written checkpoint, loaded back with {how} "
                                                   "(float32)"}
    if scorer.metric == "perplexity":
        result["eval"]["generation"] = safety.generation_check(orig, after_model, tok, context_length(orig.config),
                                                               lambda d, t: tell(d, t, "generating (prompts)"))
    return kv_measure(after_model, scorer) if factored else None


def kept_fraction(plan: Plan, head_dim: int) -> float:
    """Kept share of the cut products' parameters in a factored deployment."""
    kept = sum(float(plan.ranks[p].sum()) * plan.cost[p] for p in plan.products)
    return kept / sum(plan.ranks[p].numel() * head_dim * plan.cost[p] for p in plan.products)


@contextmanager
def cut_in_place(model: torch.nn.Module, reader, plan: Plan) -> Iterator[None]:
    """Apply ``plan`` to a live model's own parameters (``reader`` = ``open_reader(model)``) for
    the block, then put the original values back."""
    params = dict(model.named_parameters())
    saved = {}
    try:
        for lc in cut_layers(reader, plan):
            for name, t in lc.tensors.items():
                saved[name] = params[name].detach().clone()
                params[name].data.copy_(t)
        yield
    finally:
        for name, t in saved.items():
            params[name].data.copy_(t)


def cost_curve(source: Any, budgets: Iterable[float], *, methods: Iterable[str] = ("weight", "whitened"),
               products: str | None = None, spec: TextSpec | dict[str, Any] | None = None,
               progress: Callable[[str], None] | None = None, layers: str | Iterable[int] | None = None,
               threads: int = 1, device: str | None = "auto", config: Any = None, layout: Any = None,
               revision: str | None = None) -> list[dict[str, Any]]:
    """Cost (perplexity or drift) against the kept fraction of the cut products' parameters, for
    weight-only and activation-whitened cuts at each ``params`` budget, applied in memory to the
    real Hugging Face model (the same cut code that :func:`compress` writes). ``spec``: a
    :class:`TextSpec`, or :func:`~.options.check_options`' dict (unset sizes: compress's defaults;
    an unset ``seq_len`` is capped at the model's context). ``layers``, ``threads``, ``device``,
    ``config``, ``layout``, ``revision``: as in :func:`compress`."""
    from headrank.io.sources import open_reader

    opts = check_options(format=None, threads=threads, n_eval=None, n_calib=None, seq_len=None, text=None,
                         dataset=None, allocate="energy", products=products)
    reader0, live, _ = open_source(source, config=config, layout=layout, revision=revision)
    todo = _layers(layers, reader0.dims.n_layers)
    dev = resolve_device(device)
    given = isinstance(spec, TextSpec) or (spec or {}).get("seq_len") is not None
    if not isinstance(spec, TextSpec):
        spec = text_spec(spec or opts, reader0, live)
    orig, tok = _original(reader0, live, "the cost curve (`curve`)")
    spec = check_context(orig, spec, given)
    orig = orig.to(torch.float32).eval()
    reader = open_reader(orig, layout=layout)
    prods, _ = parse_products(opts["products"], reader)
    with torch_threads(opts["threads"]):
        scorer = Scorer(orig, tok, spec)
        rows = [{"method": "none", "budget": 1.0, "kept": 1.0, "cost": scorer(orig), "metric": scorer.metric,
                 "spec": {"text": f"{spec.n} x {spec.seq_len}"}}]
        for method in methods:
            Ls = calibration(orig, tok, reader.layout.modules, spec, reader.dims.n_layers) if method == "whitened" else None
            base = make_plan(reader, Rule("params", 1.0), prods, Ls, layers=todo, threads=opts["threads"], device=dev)
            for b in budgets:
                rule = Rule("params", b)
                plan = replace(base, rule=rule, ranks=choose(rule, base.spectra, base.cost, reader.dims.head_dim))
                with cut_in_place(orig, reader, plan):
                    rows.append({"method": method, "budget": b, "kept": kept_fraction(plan, reader.dims.head_dim),
                                 "cost": scorer(orig), "metric": scorer.metric})
                if progress:
                    progress(f"{method} {b:g}: {rows[-1]['cost']:.4g}")
    return rows
