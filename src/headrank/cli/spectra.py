"""``headrank spectra``: measure a checkpoint's heads (``headrank compress`` acts on them: :mod:`headrank.cli.compress`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from headrank.cli.common import (
    _save_set,
    app,
    destination,
    err_console,
    option,
    out_console,
    progress_bar,
    styled,
    user_errors,
)
from headrank.core.linalg import DEFAULT_TOL
from headrank.errors import HeadRankError
from headrank.util.constraints import SPECTRA


@app.command()
@user_errors
def spectra(
    path: Annotated[str, typer.Argument(help="checkpoint directory (config.json + weights), a weights file, 'minilm' (shipped), a Hugging Face id in the local cache (on the Hub with --remote), an http(s):// URL of a checkpoint directory or file, a .gguf file, a LoRA adapter directory, a training run or Trainer directory")],
    out: Annotated[Path | None, typer.Option("--out", help="write heads.csv, summary.csv, spectra.npz, meta.json and PNG figures here")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="config.json for a single weights file")] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub id: branch, tag or commit in the cache (default main)")] = None,
    download: Annotated[bool, typer.Option("--download", help="Hub id: fetch config and weights into the Hugging Face cache first (needs the network; not with HF_HUB_OFFLINE)")] = False,
    remote: Annotated[bool, typer.Option("--remote", help="Hub id: read over HTTP range requests, only config, headers and the attention tensors (HF_ENDPOINT, HF_TOKEN); an http(s):// URL always is")] = False,
    allow_full: Annotated[bool, typer.Option("--allow-full", help="remote: accept a server that ignores range requests by downloading each whole file, when it is within --max-bytes (refused otherwise)")] = False,
    max_bytes: Annotated[int | None, option(SPECTRA, "max_bytes", "--allow-full: the most bytes one whole file may hold, checked against its Content-Length before anything is written (default: twice the attention bytes its safetensors header lists, 4 GiB when not known)")] = None,
    base: Annotated[str | None, typer.Option("--base", help="LoRA adapter: base model path or Hub id (default: the adapter's base_model_name_or_path)")] = None,
    delta: Annotated[bool, typer.Option("--delta", help="LoRA adapter: spectra of the change of the products (adapted minus base)")] = False,
    fold_norm: Annotated[bool, typer.Option("--fold-norm", help="fold the norm before attention into W_Q, W_K, W_V (TransformerLens' fold_ln alone; W_O as stored)")] = False,
    convention: Annotated[str, typer.Option("--convention", help="raw (the weights as stored) or transformerlens (as TransformerLens 4 holds them by default: norm folded, writing weights centred, value biases folded); recorded in meta.json")] = "raw",
    fmt: Annotated[str, option(SPECTRA, "format", "stdout: table (summary per layer), csv (the per-head table) or json (= --json)", shown=False)] = "table",
    tol: Annotated[float, option(SPECTRA, "tol", "relative threshold tau of the numerical rank #{s_i > tau s_1}")] = DEFAULT_TOL,
    layers: Annotated[str | None, typer.Option("--layers", help="layers to analyse, e.g. 0,3,5-7 (0-based)")] = None,
    layout: Annotated[Path | None, typer.Option("--layout", help="TOML file naming the attention tensors and sizes, for a model_type not in the table")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="draw figures into --out")] = True,
    rotary: Annotated[bool, typer.Option("--rotary/--no-rotary", help="rotary models: energy per rotary band and the non-rotary part's spectra (rotary.csv)")] = True,
    vectors: Annotated[bool, typer.Option("--vectors", help="also write each head's singular vectors (vectors.npz)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON on stdout")] = False,
    threads: Annotated[int | None, option(SPECTRA, "threads", "worker threads over heads (default: the idle cores: affinity and cgroup quota minus the load average, re-checked between layers); results are identical for any value")] = None,
    device: Annotated[str, option(SPECTRA, "device", "auto (a CUDA GPU when torch sees one, else the CPU), cpu (numpy float64 LAPACK, no torch for safetensors) or cuda[:N] (float64 Grams and factorisations on that GPU)", shown=False)] = "auto",
    precision: Annotated[str, option(SPECTRA, "precision", shown=False, help="auto (bfloat16 weights: Grams in float32 chunks summed in float64, every head's error bounded, float64 where the bound does not hold; docs/methods/precision.md) or float64 (every step in float64: the numbers of earlier versions, bit for bit)")] = "auto",
    energy: Annotated[str | None, typer.Option("--energy", help="energy levels, each a k column of heads.csv (the fewest singular values holding that share of sum s_i^2), e.g. 0.9,0.99,0.999 [default: k90, k99, k999]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Exact per-head spectra of W_K^T W_Q and P W_V, with balance and nuclear-norm diagnostics."""
    from headrank.analysis.figproc import FigureProcess, take_early  # neither torch nor matplotlib
    from headrank.util.memory import gc_paused

    early = take_early()  # started before the options were parsed (headrank.cli.early); stopped if unused
    SPECTRA.check(format=fmt, max_bytes=max_bytes)  # the options only the command line has
    as_json = as_json or fmt == "json"
    if max_bytes is not None and not allow_full:
        raise HeadRankError("--max-bytes applies with --allow-full (the most one whole file may hold)")
    with destination(out) as dest:  # --out checked once, before the analysis, and locked
        figures = (early or FigureProcess()) if out is not None and plots else None  # imports matplotlib meanwhile
        if early is not None and figures is not early:
            early.close()
        with gc_paused():  # torch's and pandas' import: no collections while ~1M objects are made
            from headrank.analysis.scan import analyze, save
        with progress_bar(quiet or as_json or fmt == "csv") as bar:
            task = bar.add_task("layers", total=None)
            result = analyze(path, config=config, tol=tol, layers=layers, layout=layout, threads=threads, revision=revision,
                             base=base, delta=delta, fold_norm=fold_norm, download=download, remote=remote,
                             allow_full=(max_bytes or True) if allow_full else False, rotary=rotary, vectors=vectors,
                             device=device, precision=precision, convention=convention, energy=energy,
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
        if dest is not None:
            dest.watch(result.inputs)  # a weights file changed before the commit: one line, nothing written
        for rec in result.meta["nonfinite_heads"]:
            err_console.print(styled("yellow", "warning: ", f"NaN/Inf weights in layer {rec['layer']} head {rec['head']} "
                                                           f"({rec['product']}): metrics set to NaN"), highlight=False)
        written = _save_set(lambda d: save(result, d, plots=plots, figures=figures), dest)
    _report(result, fmt=fmt, as_json=as_json, quiet=quiet, out=out, written=written)


def _report(result, *, fmt: str, as_json: bool, quiet: bool, out: Path | None, written: list[Path]) -> None:
    """What ``spectra`` prints: the remote transfer line, then the csv table, the JSON summary or
    the console table on stdout."""
    if "remote" in result.meta and not (quiet or as_json):
        from headrank.io.remote import transfer_line

        err_console.print(styled("bold", "remote: ", transfer_line(result.meta["remote"])), highlight=False)
    if fmt == "csv":
        result.table.assign(source=str(result.meta.get("source"))).to_csv(sys.stdout, index=False)  # as heads.csv
        return
    if as_json:
        payload = result.to_json()
        if out is not None:
            payload["written"] = [str(p) for p in written]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    if quiet:
        return
    _print_table(result, result.summary(), out if written else None)
    if written:
        out_console.print(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written),
                          highlight=False)


def _print_table(result, summary, out: Path | None = None) -> None:
    """The header line (source, sizes, dtypes, τ) and the per-layer means of the console metrics."""
    from headrank.analysis.rotary import rotary_line
    from headrank.core.metrics import CONSOLE_CAPTION, CONSOLE_METRICS

    c = result.meta["config"]
    parts = result.meta.get("parts")  # an encoder-decoder: layers per kind of attention
    n_layers = "/".join(f"{k} {v['config']['n_layers']}" for k, v in parts.items()) if parts else c["n_layers"]
    out_console.print(styled(
        "bold", str(result.meta["source"]), f"  model_type={result.meta['model_type']}  layers={n_layers}  "
        f"d={c['d_model']}  heads={c['n_heads']} (kv {c['n_kv_heads']})  dh={c['head_dim']}  "
        f"dtype={','.join(result.meta['dtype_read'])}  tau={result.meta['tolerance']:g}"), highlight=False)
    where = f"{out / 'meta.json'}" if out is not None else "docs/outputs.md (--out also writes them to meta.json)"
    table = Table(title="mean over heads per layer", caption=f"{CONSOLE_CAPTION}; definitions: {where}")
    table.add_column("layer", justify="right")
    for p in ("qk", "ov"):
        for _, head, _ in CONSOLE_METRICS:
            table.add_column(f"{p.upper()} {head}", justify="right")
    kinds = result.meta.get("attention")  # an encoder-decoder: (kind, layer) per row
    units = list(zip(kinds, result.meta["layers"], strict=True)) if kinds else [(layer,) for layer in result.meta["layers"]]
    piv = summary.set_index([*(["attention"] if kinds else []), "layer", "product"])
    for unit in units:
        row = [" ".join(map(str, unit))]
        for p in ("qk", "ov"):
            row += [format(piv.loc[(*unit, p)][k], f) for k, _, f in CONSOLE_METRICS]
        table.add_row(*row)
    out_console.print(table)
    if line := rotary_line(result.meta):
        out_console.print(line, highlight=False)
