"""``headrank compress``: cut each head to the rank it uses, write the smaller checkpoint, say
what it costs; ``--curve`` draws the cost against the size instead."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from headrank.cli.common import app, err_console, option, progress_bar, styled, user_errors
from headrank.errors import HeadRankError
from headrank.util.constraints import COMPRESS
from headrank.util.progress import EVERY_S


def _beating(bar: Any) -> bool:
    """Whether ``bar`` (a LineProgress) prints at its fixed interval by itself: its beat thread runs."""
    thread = getattr(bar, "thread", None)
    return thread is not None and thread.is_alive()


class Phases:
    """The progress callback ``(done, total, phase)`` on one bar, and a beat: on a console that
    is not a terminal, a line at least every 15 s even while a phase reports nothing (loading a
    model, one long layer), from :class:`~headrank.util.progress.Heartbeat`."""

    def __init__(self, bar: Any, every_s: float = EVERY_S):
        from headrank.util.progress import Heartbeat

        self.bar, self.task, self.every_s = bar, bar.add_task("starting", total=None), every_s
        self.beat = (Heartbeat(bar.console, "compress", every_s, tick=self._line)
                     if hasattr(bar, "line") and not _beating(bar) else None)  # a LineProgress that does not beat by itself

    def __call__(self, done: int, total: int | None, phase: str) -> None:
        self.bar.update(self.task, completed=done, total=total, description=phase)

    def _line(self) -> str | None:
        now = self.bar.clock()
        if now - self.bar.last < self.every_s:
            return None
        self.bar.last = now
        return self.bar.line(self.bar.tasks[self.task], now)

    def __enter__(self) -> Phases:
        if self.beat is not None:
            self.beat.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.beat is not None:
            self.beat.__exit__(*exc)
        return False


@app.command()
@user_errors
def compress(
    path: Annotated[str, typer.Argument(help="anything `spectra` opens: checkpoint directory, weights file, 'minilm', cached Hub id, .gguf file, run directory")],
    out: Annotated[Path, typer.Option("--out", help="write the compressed checkpoint (safetensors, config, tokenizer) and compress.json here (with --curve: the curve)")],
    keep: Annotated[float | None, option(COMPRESS, "keep", "per unit (a head; a kv group under GQA): the fewest directions holding this share of the energy sum s^2")] = None,
    rank: Annotated[int | None, option(COMPRESS, "rank", "per unit (a head; a kv group under GQA, cut jointly): keep K directions (K <= head dim)")] = None,
    params: Annotated[float | None, option(COMPRESS, "params", "global budget: this fraction of the cut products' parameters, allocated across units from the spectra")] = None,
    products: Annotated[str | None, typer.Option("--products", help="ov, qk or ov,qk (default: both where QK can be cut; rotary: whole bands; QK-normed models: ov only)")] = None,
    fmt: Annotated[str | None, option(COMPRESS, "format", shown=False, help="factored: only the kept dimensions, load with headrank.load_compressed (default where q, k, v, o are separate); dense: zero-padded, same architecture (default for fused projections)")] = None,
    whiten: Annotated[bool | None, typer.Option("--whiten/--no-whiten", help="activation-whitened cut (SVD-LLM), calibrated on the corpus validation split (or --text's first half, or --dataset's train split) [default: whitened for a causal LM with a tokenizer (its cost printed first), plain for an encoder]")] = None,
    evaluate: Annotated[bool, typer.Option("--eval", help="perplexity (causal LM) or sentence-embedding cosine drift (encoder) before and after, on held-out text")] = False,
    eval_n: Annotated[int | None, option(COMPRESS, "n_eval", "evaluation windows (LM) or sentences (encoder) (default: 16 windows, 64 sentences: the README's cost curve)")] = None,
    calib_n: Annotated[int | None, option(COMPRESS, "n_calib", "--whiten calibration windows or sentences (default: as --eval-n)")] = None,
    seq_len: Annotated[int | None, option(COMPRESS, "seq_len", "tokens per window (default: 128, capped at the model's context; a longer one is refused)")] = None,
    text: Annotated[Path | None, typer.Option("--text", help="text file for --eval/--whiten (one text per line; second half scored, first half calibrates) instead of the stdlib corpus")] = None,
    dataset: Annotated[str | None, option(COMPRESS, "dataset", shown=False, help="wikitext2 or c4 for --eval/--whiten, through the datasets library (network, or its copy in the Hugging Face cache)")] = None,
    curve: Annotated[str | None, typer.Option("--curve", help="draw cost against size instead of writing a checkpoint: --params budgets, e.g. 1,0.75,0.5,0.25; weight-only against whitened (compress_curve.json/.png in --out)")] = None,
    layers: Annotated[str | None, typer.Option("--layers", help="cut only these layers, e.g. 0,3,5-7 (0-based); the rest are copied")] = None,
    allocate: Annotated[str, option(COMPRESS, "allocate", shown=False, help="how --params spends its budget: energy (the largest shares of each unit's energy) or loss (ASVD: each unit's measured calibration loss when cut alone, at 9 candidate ranks; slower)")] = "energy",
    threads: Annotated[int, option(COMPRESS, "threads", "torch threads (1 by default, kind to a shared machine)")] = 1,
    device: Annotated[str, option(COMPRESS, "device", shown=False, help="auto (a CUDA GPU when torch sees one, else the CPU), cpu or cuda[:N] (roots, SVDs and cut GEMMs in float64 on that GPU)")] = "auto",
    dtype: Annotated[str, option(COMPRESS, "dtype", "the floating dtype of the weights written (config.json's dtype says it): auto keeps each tensor as read (bfloat16 for a GGUF file's factored output); sizes are reported against the uncut model in this dtype")] = "auto",
    precision: Annotated[str, option(COMPRESS, "precision", shown=False, help="auto (bfloat16 weights: Grams in float32 chunks summed in float64, bound-checked, float64 where the bound does not hold) or float64; docs/methods/precision.md")] = "auto",
    config: Annotated[Path | None, typer.Option("--config", help="config.json for a single weights file")] = None,
    layout: Annotated[Path | None, typer.Option("--layout", help="TOML layout for a model_type not in the table")] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub id: branch, tag or commit in the cache")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print compress.json's totals as JSON (with --curve: compress_curve.json)")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="let transformers show its own progress bars")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print nothing on success")] = False,
) -> None:
    """Cut each head's OV (and QK) product to rank k and write the smaller checkpoint."""
    from headrank import compress as cut

    if curve is not None:
        opts = cut.options.check_options(format=fmt, threads=threads, n_eval=eval_n, n_calib=calib_n,
                                         seq_len=seq_len, text=text, dataset=dataset, allocate=allocate,
                                         products=products, dtype=dtype)
        _refuse_for_curve(opts, keep=keep, rank=rank, params=params, whiten=whiten, evaluate=evaluate)
        _curve(path, out, curve, opts, dict(layers=layers, threads=threads, device=device, config=config,
                                            layout=layout, revision=revision), quiet=quiet, as_json=as_json)
        return
    with progress_bar(quiet or as_json) as bar, Phases(bar) as phases:
        res = cut.compress(path, out, keep=keep, rank=rank, params=params, products=products, whiten=whiten,
                           evaluate=evaluate, text=text, n_eval=eval_n, n_calib=calib_n, seq_len=seq_len,
                           dataset=dataset, format=fmt, layers=layers, threads=threads, allocate=allocate,
                           config=config, layout=layout, revision=revision, progress=phases, verbose=verbose,
                           device=device, precision=precision, dtype=dtype, announce=lambda s: None if quiet or as_json else
                           err_console.print(styled("bold", "note: ", s), highlight=False))
    for n in [] if quiet else res["notes"]:  # --quiet: nothing on success (the notes stay in compress.json)
        err_console.print(styled("yellow", "note: ", n), highlight=False)
    for w in res.get("warnings", []):
        err_console.print(styled("yellow", "warning: ", w), highlight=False)
    if as_json:
        sys.stdout.write(json.dumps(res.to_json(), indent=2) + "\n")
    elif not quiet:
        sys.stdout.write("\n".join(cut.report_lines(res, out)) + "\n")


_NOT_CURVE = {  # what --curve does instead of each option
    "keep": "--curve sets its own --params budgets",
    "rank": "--curve sets its own --params budgets",
    "params": "--curve sets its own --params budgets (give them to --curve)",
    "format": "--curve writes no checkpoint",
    "whiten": "--curve measures both weight-only and whitened cuts",
    "evaluate": "--curve always measures the cost",
    "allocate": "--curve spends each budget by energy",
    "dtype": "--curve writes no checkpoint",
}
_FLAG = {"keep": "--keep", "rank": "--rank", "params": "--params", "format": "--format", "whiten": "--whiten",
         "evaluate": "--eval", "allocate": "--allocate loss", "dtype": "--dtype"}


def _refuse_for_curve(opts: dict[str, Any], **given: Any) -> None:
    """The options --curve does not take: each value is checked as without --curve first (the
    same one line; ``opts``: the checked options), then a given one is refused with one line
    naming its flag."""
    from headrank.compress import Rule

    for name in ("keep", "rank", "params"):
        if given[name] is not None:
            Rule.of(**{name: given[name]})
    given.update(format=opts["format"], allocate=opts["allocate"] != "energy", dtype=opts["dtype"] != "auto")
    used = [n for n in _NOT_CURVE if given[n] not in (None, False)]
    if used:
        raise HeadRankError(f"{_FLAG[used[0]]} does not go with --curve: {_NOT_CURVE[used[0]]}")


def _curve(path: str, out: Path, budgets: str, opts: dict[str, Any], source: dict[str, Any], *, quiet: bool,
           as_json: bool) -> None:
    """--curve: measured with :func:`cost_curve` (``source``: its layers, threads, device,
    config, layout, revision), written as compress_curve.json/.png; --json prints that JSON."""
    from headrank.compress import curve
    from headrank.io.writer import OutputSet

    b = curve.parse_budgets(budgets)
    src = [Path(path)] if Path(path).exists() else []
    with OutputSet(out, sources=src, owns=curve.JSON) as dest:  # --out checked once and held to the end
        data, written = _measure_curve(path, curve, b, opts, source, dest, quiet or as_json)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif not quiet:
        sys.stdout.write("\n".join(curve.lines(data)) + "\n")
        sys.stdout.write(f"wrote {', '.join(str(p) for p in written)}\n")


def _measure_curve(path: str, curve: Any, b: list[float], opts: dict[str, Any], source: dict[str, Any], dest: Any,
                   quiet_run: bool) -> tuple[dict[str, Any], list[Path]]:
    from headrank.util.progress import Heartbeat

    start = time.monotonic()

    def tell(s: str) -> None:
        if not quiet_run:
            err_console.print(f"curve {s} ({time.monotonic() - start:.0f} s)", highlight=False)

    beat = Heartbeat(err_console, "curve", every_s=EVERY_S) if not quiet_run else None
    try:
        if beat is not None:
            beat.__enter__()
        data = curve.measure(str(path), path, b, products=opts["products"], spec=opts, progress=tell, **source)
    finally:
        if beat is not None:
            beat.__exit__(None, None, None)
    return data, curve.save(data, dest)
