"""The ``attnrank`` command: a thin typer app over the library. No logic lives here."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from attnrank.core.linalg import DEFAULT_TOL
from attnrank.errors import AttnRankError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="How weight decay and architecture shape the rank of attention layers.",
)
# markup off: paths, model types and messages come from the user and may hold square brackets;
# styled parts are rich Text objects, never markup strings.
out_console = Console(width=None if sys.stdout.isatty() else 120, markup=False)
err_console = Console(stderr=True, markup=False)


def styled(style: str, head: str, rest: str = "") -> Text:
    """``head`` in ``style`` followed by plain ``rest`` (no markup is parsed in either)."""
    return Text.assemble((head, style), rest)


def _print_version(value: bool) -> None:
    if value:
        from attnrank.util.env import __version__

        sys.stdout.write(f"attnrank {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    """How weight decay and architecture shape the rank of attention layers."""


def print_error(message: str) -> None:
    """``error: MESSAGE`` as one line on stderr (newlines in the message folded into spaces)."""
    err_console.print(styled("bold red", "error: ", " ".join(str(message).split())), highlight=False,
                      soft_wrap=True)


def user_errors(fn):
    """Turn an AttnRankError into one line on stderr and exit status 2.

    The library names paths in its errors; what it could not foresee from a user's input still
    becomes one line: an OSError (a file system refusing, named with its path), a MemoryError
    (sizes this machine cannot hold) or a RecursionError (an input nested too deeply).
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AttnRankError as e:
            print_error(str(e))
        except OSError as e:
            where = f" {e.filename}" if getattr(e, "filename", None) else ""
            print_error(f"{e.strerror or type(e).__name__}:{where}" if where else
                        (e.strerror or " ".join(str(e).split())[:200] or type(e).__name__))
        except MemoryError:
            print_error("out of memory: the input asks for more than this machine can hold")
        except RecursionError:
            print_error("an input is nested too deeply to read")
        raise typer.Exit(2)

    return wrapper


def _save_set(save, out: Path | None) -> list[Path]:
    """``save(directory)`` into a fresh staging directory inside ``out``, moved in only when
    every file is written (a failure leaves the previous set as it was); the final paths."""
    if out is None:
        return []
    from attnrank.util.fileio import moved, staged_output

    with staged_output(out) as stage:
        files = save(stage)
    return moved(files, stage, out)


def progress_bar(quiet: bool) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet or not err_console.is_terminal,
    )


@app.command()
@user_errors
def spectra(
    path: Annotated[str, typer.Argument(help="checkpoint directory (config.json + weights), a weights file, 'minilm' (shipped), a Hugging Face id in the local cache, a .gguf file, a LoRA adapter directory, a training run or Trainer directory")],
    out: Annotated[Path | None, typer.Option("--out", help="write heads.csv, summary.csv, spectra.npz, meta.json and PNG figures here")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="config.json for a single weights file")] = None,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub id: branch, tag or commit in the cache (default main)")] = None,
    download: Annotated[bool, typer.Option("--download", help="Hub id: fetch config and weights into the Hugging Face cache first (needs the network; not with HF_HUB_OFFLINE)")] = False,
    base: Annotated[str | None, typer.Option("--base", help="LoRA adapter: base model path or Hub id (default: the adapter's base_model_name_or_path)")] = None,
    delta: Annotated[bool, typer.Option("--delta", help="LoRA adapter: spectra of the change of the products (adapted minus base)")] = False,
    fold_norm: Annotated[bool, typer.Option("--fold-norm", help="fold the norm before attention into W_Q, W_K, W_V (TransformerLens' fold_ln)")] = False,
    fmt: Annotated[str, typer.Option("--format", help="stdout: table (summary per layer), csv (the per-head table) or json (= --json)")] = "table",
    tol: Annotated[float, typer.Option("--tol", help="relative threshold tau of the numerical rank #{s_i > tau s_1}")] = DEFAULT_TOL,
    layers: Annotated[str | None, typer.Option("--layers", help="layers to analyse, e.g. 0,3,5-7 (0-based)")] = None,
    layout: Annotated[Path | None, typer.Option("--layout", help="TOML file naming the attention tensors and sizes, for a model_type not in the table")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="draw figures into --out")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON on stdout")] = False,
    threads: Annotated[int | None, typer.Option("--threads", min=1, max=256, help="worker threads over heads (default: torch's thread count); results are identical for any value")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Exact per-head spectra of W_K^T W_Q and P W_V, with balance and nuclear-norm diagnostics."""
    from attnrank.analysis.scan import analyze, overall, save
    from attnrank.util.fileio import check_writable

    if fmt not in ("table", "csv", "json"):
        raise AttnRankError(f"--format must be table, csv or json; got {fmt!r}")
    as_json = as_json or fmt == "json"
    if out is not None:
        check_writable(out)  # before the analysis, not after it
    with progress_bar(quiet or as_json or fmt == "csv") as bar:
        task = bar.add_task("layers", total=None)
        result = analyze(path, config=config, tol=tol, layers=layers, layout=layout, threads=threads, revision=revision,
                         base=base, delta=delta, fold_norm=fold_norm, download=download,
                         progress=lambda done, total: bar.update(task, completed=done, total=total))
    for rec in result.meta["nonfinite_heads"]:
        err_console.print(styled("yellow", "warning: ", f"NaN/Inf weights in layer {rec['layer']} head {rec['head']} "
                                                       f"({rec['product']}): metrics set to NaN"), highlight=False)
    written = _save_set(lambda d: save(result, d, plots=plots), out)
    if fmt == "csv":
        result.table.to_csv(sys.stdout, index=False)
        return
    summary = result.summary()
    if as_json:
        payload = {"meta": result.meta, "overall": overall(result.table),
                   "layers": json.loads(summary.to_json(orient="records"))}
        if out is not None:
            payload["written"] = [str(p) for p in written]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    if quiet:
        return
    c = result.meta["config"]
    out_console.print(styled(
        "bold", str(result.meta["source"]), f"  model_type={result.meta['model_type']}  layers={c['n_layers']}  "
        f"d={c['d_model']}  heads={c['n_heads']} (kv {c['n_kv_heads']})  dh={c['head_dim']}  "
        f"dtype={','.join(result.meta['dtype_read'])}  tau={tol:g}"), highlight=False)
    table = Table(title="mean over heads per layer",
                  caption="r/dh = numerical rank / head dim; eff = effective rank; "
                          "gap = (bound - nuclear) / bound; bal = relative balance discrepancy")
    table.add_column("layer", justify="right")
    for p in ("qk", "ov"):
        for name in ("r/dh", "eff", "gap", "bal"):
            table.add_column(f"{p.upper()} {name}", justify="right")
    piv = summary.set_index(["layer", "product"])
    for layer in result.meta["layers"]:
        row = [str(layer)]
        for p in ("qk", "ov"):
            r = piv.loc[(layer, p)]
            row += [f"{r.rank_frac:.3f}", f"{r.effective_rank:.2f}", f"{r.gap_rel:.4f}", f"{r.balance_rel:.4f}"]
        table.add_row(*row)
    out_console.print(table)
    if written:
        out_console.print(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written),
                          highlight=False)


@app.command()
@user_errors
def reproduce(
    name: Annotated[str | None, typer.Argument(help="reproduction to run (see --list), e.g. fig1, fig5, or 'all'")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="write report.html, claims.json, data.json, run.json and PNGs here (default: out/NAME)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="list the known reproductions and exit")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 if any claim did not hold")] = False,
    quick: Annotated[bool, typer.Option("--quick", help="smaller, faster variant (fewer sweep points)")] = False,
    full: Annotated[bool, typer.Option("--full", help="the full variant (the default; explicit for 'all')")] = False,
    force: Annotated[bool, typer.Option("--force", help="with 'all': recompute parts already finished in --out")] = False,
    model: Annotated[str | None, typer.Option("--model", help="run the reproduction's analysis on this checkpoint instead of its default (where it has one, e.g. fig4)")] = None,
    replot: Annotated[bool, typer.Option("--replot", help="run nothing: re-judge the claims and redraw the figures from the data.json a finished run left in --out")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the claims as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print nothing on success")] = False,
) -> None:
    """Reproduce a figure or claim of the source documents; every claim is checked with numbers.

    Exit status 0 when it ran (claims that did not hold are findings), 1 with --strict when any
    claim did not hold, 2 on user errors.
    """
    from contextlib import nullcontext

    from attnrank.report import runner as rep
    from attnrank.studies import registry

    if list_:
        rows = registry.listing()
        if as_json:
            sys.stdout.write(json.dumps([{"name": n, "title": t} for n, t in rows], indent=2) + "\n")
        else:
            for n, t in rows:
                out_console.print(styled("bold", n, f"  {t}"), highlight=False, soft_wrap=True)
        return
    if name is None:
        raise AttnRankError("give a reproduction NAME, 'all', or --list")
    if quick and full:
        raise AttnRankError("--quick and --full exclude each other")
    if replot and (quick or full or force):
        raise AttnRankError("--replot keeps the stored run's profile: drop --quick/--full/--force")
    if name == "all" and model is not None:
        raise AttnRankError("--model applies to one reproduction (e.g. fig4), not to 'all'")
    from attnrank.util.fileio import check_writable

    if not replot:
        check_writable(out or Path("out") / name)  # before any training, not after it
    if name == "all":
        _reproduce_all(out or Path("out") / "all", quick=quick, force=force, strict=strict, as_json=as_json,
                       quiet=quiet, replot=replot)
        return
    registry.get(name)  # unknown names fail here, before any work
    out = out if out is not None else Path("out") / name
    show = not (quiet or as_json) and err_console.is_terminal
    with err_console.status(f"{'replotting' if replot else 'reproducing'} {name} ...") if show else nullcontext():
        summary = rep.run(name, out, quick=quick, replot=replot,
                          overrides={"model": model} if model is not None else None)
    if as_json:
        sys.stdout.write(json.dumps({"name": name, "out": str(out), "runtime_s": summary.runtime_s,
                                     "claims": [c.to_json() for c in summary.claims]}, indent=2) + "\n")
    elif not quiet:
        from attnrank.report.html import brief, measured_brief
        from attnrank.studies.registry import tally

        claims = [c.to_json() for c in summary.claims]
        table = Table(title=f"{name}: {headline(tally(claims))} ({summary.runtime_s:.1f} s)")
        table.add_column("claim")
        table.add_column("kind")
        table.add_column("verdict")
        table.add_column("measured", overflow="fold")
        table.add_column("expected", overflow="fold")
        for c in claims:
            table.add_row(Text(c["name"]), c["kind"], verdict_badge(c),
                          Text(measured_brief(c)), Text(brief(c["expected"])))
        out_console.print(table)
        out_console.print(f"wrote {out / 'report.html'} (+ claims.json, data.json, run.json, "
                          f"{sum(f.suffix == '.png' for f in summary.files)} PNG)", highlight=False)
    if strict and not summary.all_held:
        raise typer.Exit(1)


def _reproduce_all(out: Path, *, quick: bool, force: bool, strict: bool, as_json: bool, quiet: bool,
                   replot: bool = False) -> None:
    from attnrank.report import runner as rep

    def progress(name: str, state: str) -> None:
        if not (quiet or as_json):
            err_console.print(f"{name}: {state}", highlight=False)

    entries = rep.run_all(out, quick=quick, force=force, progress=progress, replot=replot)
    summary = json.loads((out / "summary.json").read_text())
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    elif not quiet:
        table = Table(title=f"reproduce all ({'quick' if summary['quick'] else 'full'}): {headline(summary['tally'])}")
        for col in ("reproduction", "findings held / not held / inconclusive", "identities verified", "runtime", "note"):
            table.add_column(col)
        for r in summary["reproductions"]:
            f, i = r["tally"]["findings"], r["tally"]["identities"]
            table.add_row(r["name"], f"{f['held']} / {f['not held']} / {f['inconclusive']}",
                          f"{i['verified']} of {i['verified'] + i['failed']}",
                          f"{r['runtime_s'] or 0:.1f} s", Text("cached" if r["cached"] else (r["error"] or "")))
        out_console.print(table)
        out_console.print(f"wrote {out / 'report.html'} (+ claims.json, summary.json, one folder per reproduction)",
                          highlight=False)
    if any(e.error for e in entries):
        raise typer.Exit(3)
    if strict and summary["claims_held"] < summary["claims_total"]:
        raise typer.Exit(1)


def headline(t: dict) -> str:
    """'findings: 5 held, 1 not held, 2 inconclusive; identities: 7 of 7 verified'."""
    f, i = t["findings"], t["identities"]
    return (f"findings: {f['held']} held, {f['not held']} not held, {f['inconclusive']} inconclusive; "
            f"identities: {i['verified']} of {i['verified'] + i['failed']} verified")


def verdict_badge(c: dict) -> Text:
    if c.get("kind") == "identity":
        return Text("verified", style="green") if c["held"] else Text("FAILED", style="bold red")
    style = {"held": "green", "not held": "red", "inconclusive": "yellow"}[c["verdict"]]
    return Text(c["verdict"], style=style)


train_app = typer.Typer(no_args_is_help=True, help="Train the project's transformer with attention-specific weight decay.")
app.add_typer(train_app, name="train")


_OUT = Annotated[Path, typer.Option("--out", help="run directory (config.json, metrics.jsonl, checkpoints/, summary.json)")]
_ATTN_WD = Annotated[float, typer.Option("--attn-wd", help="AdamW weight decay of the attention projections Q, K, V, O")]
_WD = Annotated[float, typer.Option("--wd", help="AdamW weight decay of every other matrix and the embeddings (biases, norms: 0)")]
_SEED = Annotated[int, typer.Option("--seed", help="seed of the initialisation and the data stream")]
_DEVICE = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda, cuda:N")]
_RESUME = Annotated[bool, typer.Option("--resume", help="continue the run in --out from its newest checkpoint (with a larger --steps: extend it, when its schedule allows); one writer per run: while another process writes the run, this stops with one line and exit 2")]
_THREADS = Annotated[int, typer.Option("--threads", help="torch threads per process, recorded in config.json (1: within 15% of 2 threads on a quiet 2-core machine, 2-15x faster when anything else runs: benchmarks/THREADS.md; resume with the same value)")]
_LOG = Annotated[str | None, typer.Option("--log", help="also log every row to tensorboard, wandb, mlflow (comma-separated) or none; metrics.jsonl is always written [default: tensorboard when installed]")]


@train_app.command("recall")
@user_errors
def train_recall(
    out: Annotated[Path, typer.Option("--out", help="run directory (config.json, metrics.jsonl, checkpoints/)")],
    attn_wd: Annotated[float, typer.Option("--attn-wd", help="AdamW weight decay of the attention projections Q, K, V, O")] = 0.1,
    wd: Annotated[float, typer.Option("--wd", help="AdamW weight decay of every other matrix and the embeddings (biases, norms: 0)")] = 0.1,
    steps: Annotated[int, typer.Option("--steps", help="optimizer steps (one fresh batch each)")] = 3000,
    seed: Annotated[int, typer.Option("--seed", help="seed of the initialisation and the data stream")] = 0,
    device: Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda, cuda:N")] = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="continue the run in --out from its newest checkpoint")] = False,
    lr: Annotated[float | None, typer.Option("--lr", help="peak learning rate [default: 3e-3]")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="sequences per step [default: 64]")] = None,
    track_every: Annotated[int | None, typer.Option("--track-every", help="steps between rank measurements [default: 100]")] = None,
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help="steps between checkpoints [default: 500]")] = None,
    threads: _THREADS = 1,
    log: _LOG = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the final summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar, no summary")] = False,
) -> None:
    """Associative recall (k1 v1 ... kn vn q -> v(q)), AdamW with its own decay on attention.

    `--resume --steps N` with a larger N extends a finished run (constant learning rate after the
    warmup; a cosine run cannot be extended)."""
    from attnrank.training.config import recall_config

    cfg = recall_config(attn_weight_decay=attn_wd, weight_decay=wd, steps=steps, seed=seed, lr=lr,
                        batch_size=batch_size, track_every=track_every, checkpoint_every=checkpoint_every)
    _run_training(cfg, out, "recall", resume=resume, device=device, threads=threads, as_json=as_json, quiet=quiet,
                  log=log)


def _run_training(cfg, out: Path, label: str, *, resume: bool, device: str, threads: int | None,
                  as_json: bool, quiet: bool, log: str | None = None) -> None:
    """Train with a progress bar and print the final summary (rank 0 only under torchrun)."""
    import os

    from attnrank.training.loop import train

    rank0 = os.environ.get("RANK", "0") in ("", "0")
    bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                   disable=quiet or as_json or not err_console.is_terminal or not rank0)
    info: dict[str, str] = {"loss": "-", "acc": "-", "rank": "-"}

    def progress(step: int, total: int, row: dict | None) -> None:
        if row:
            if "loss" in row:
                info["loss"], info["acc"] = f"{row['loss']:.3f}", f"{row['acc']:.3f}"
            if "mean" in row:
                info["rank"] = f"{row['mean']['qk']['rank']:.1f}/{row['mean']['ov']['rank']:.1f}"
        bar.update(task, completed=step, total=total,
                   info=f"loss {info['loss']}  acc {info['acc']}  rank qk/ov {info['rank']}")

    with bar:
        task = bar.add_task(label, total=cfg.steps, info="")
        result = train(out, cfg, resume=resume, device=device, progress=progress, threads=threads, log=log)
    if result.rank != 0:
        return
    f = result.final
    if as_json:
        sys.stdout.write(json.dumps({"run_dir": str(result.run_dir), "resumed_from": result.resumed_from,
                                     "checkpoint": str(result.checkpoint), "final": f}, indent=2) + "\n")
    elif not quiet:
        m = f.get("mean", {})
        out_console.print(
            f"step {f.get('step')}: loss {f.get('loss', float('nan')):.4f}  acc {f.get('acc', float('nan')):.3f}  "
            f"mean rank qk {m.get('qk', {}).get('rank', float('nan')):.2f}  ov {m.get('ov', {}).get('rank', float('nan')):.2f}"
            f"  (head dim {cfg.model.head_dim})", highlight=False)
        evals = [f"{k} {f[k]:.4g}" for k in ("val_loss", "val_ppl", "val_acc", "test_loss", "test_ppl", "test_acc")
                 if k in f]
        if evals:
            out_console.print("  ".join(evals), highlight=False)
        out_console.print(f"run in {result.run_dir}; checkpoint {result.checkpoint} "
                          f"(attnrank spectra {result.checkpoint})", highlight=False)


@train_app.command("lm")
@user_errors
def train_lm(
    out: _OUT,
    corpus: Annotated[str | None, typer.Option("--corpus", help="text: a .txt/.jsonl/.jsonl.zst file or a directory of them (default: the stdlib's docstrings and comments)")] = None,
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="byte (UTF-8 bytes, 256 tokens) or bpe (trained on the train split)")] = "byte",
    bpe_vocab: Annotated[int, typer.Option("--bpe-vocab", help="BPE vocabulary size")] = 1024,
    seq_len: Annotated[int, typer.Option("--seq-len", help="tokens per training window (context)")] = 64,
    max_chars: Annotated[int | None, typer.Option("--max-chars", help="characters read per split (default: all)")] = None,
    eval_tokens: Annotated[int, typer.Option("--eval-tokens", help="tokens scored per evaluation split at most")] = 65536,
    eval_every: Annotated[int, typer.Option("--eval-every", help="steps between validation evaluations (0: at the end only)")] = 0,
    attn_wd: _ATTN_WD = 0.1,
    wd: _WD = 0.1,
    steps: Annotated[int, typer.Option("--steps", help="optimizer steps")] = 2000,
    seed: _SEED = 0,
    n_layers: Annotated[int | None, typer.Option("--n-layers", help="transformer layers [default: 4]")] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", help="model width [default: 64]")] = None,
    n_heads: Annotated[int | None, typer.Option("--n-heads", help="attention heads [default: 4]")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="peak learning rate [default: 3e-3]")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="global batch (windows per step, split over DDP processes) [default: 32]")] = None,
    track_every: Annotated[int | None, typer.Option("--track-every", help="steps between rank measurements [default: 100]")] = None,
    log_every: Annotated[int | None, typer.Option("--log-every", help="steps between loss rows [default: 10]")] = None,
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help="steps between checkpoints [default: 500]")] = None,
    device: _DEVICE = "auto",
    resume: _RESUME = False,
    threads: _THREADS = 1,
    log: _LOG = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the final summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar, no summary")] = False,
) -> None:
    """Autoregressive LM (validation/test loss and perplexity). Under `torchrun --nproc-per-node N -m attnrank
    train lm ...` it trains with DDP (gloo on the CPU), each process taking 1/N of the global batch."""
    from attnrank.training.config import lm_config

    cfg = lm_config(corpus=corpus, tokenizer=tokenizer, bpe_vocab=bpe_vocab, seq_len=seq_len, max_chars=max_chars,
                    eval_tokens=eval_tokens, eval_every=eval_every, attn_weight_decay=attn_wd, weight_decay=wd,
                    steps=steps, seed=seed, n_layers=n_layers, d_model=d_model, n_heads=n_heads, lr=lr,
                    batch_size=batch_size, track_every=track_every, log_every=log_every,
                    checkpoint_every=checkpoint_every)
    _run_training(cfg, out, "lm", resume=resume, device=device, threads=threads, as_json=as_json, quiet=quiet,
                  log=log)


@train_app.command("vit")
@user_errors
def train_vit(
    out: _OUT,
    images: Annotated[str | None, typer.Option("--images", help="image folder DIR/<class>/<image> (or DIR/train|validation|test/<class>/...); default: scikit-learn digits")] = None,
    image_size: Annotated[int | None, typer.Option("--image-size", help="resize images to this square size [default: 8 for digits, 32 for a folder]")] = None,
    patch_size: Annotated[int | None, typer.Option("--patch-size", help="patch size [default: 2 up to 16 pixels, else 4]")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="steps between validation evaluations (0: at the end only)")] = 0,
    attn_wd: _ATTN_WD = 0.1,
    wd: _WD = 0.1,
    steps: Annotated[int, typer.Option("--steps", help="optimizer steps")] = 2000,
    seed: _SEED = 0,
    n_layers: Annotated[int | None, typer.Option("--n-layers", help="transformer layers [default: 4]")] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", help="model width [default: 64]")] = None,
    n_heads: Annotated[int | None, typer.Option("--n-heads", help="attention heads [default: 4]")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="peak learning rate [default: 1e-3]")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="global batch [default: 64]")] = None,
    track_every: Annotated[int | None, typer.Option("--track-every", help="steps between rank measurements [default: 100]")] = None,
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help="steps between checkpoints [default: 500]")] = None,
    device: _DEVICE = "auto",
    resume: _RESUME = False,
    threads: _THREADS = 1,
    log: _LOG = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the final summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar, no summary")] = False,
) -> None:
    """Vision transformer classifying images (validation/test loss and accuracy)."""
    from attnrank.training.config import vit_config

    cfg = vit_config(images=images, image_size=image_size, patch_size=patch_size, eval_every=eval_every,
                     attn_weight_decay=attn_wd, weight_decay=wd, steps=steps, seed=seed, n_layers=n_layers,
                     d_model=d_model, n_heads=n_heads, lr=lr, batch_size=batch_size, track_every=track_every,
                     checkpoint_every=checkpoint_every)
    _run_training(cfg, out, "vit", resume=resume, device=device, threads=threads, as_json=as_json, quiet=quiet,
                  log=log)


@app.command()
@user_errors
def collapse(
    model: Annotated[str, typer.Argument(help="'minilm', a Hugging Face BERT/GPT-2/LLaMA-style directory, or a project model / run directory")],
    out: Annotated[Path | None, typer.Option("--out", help="write layers.csv, summary.csv, paths.csv, collapse.npz, meta.json and PNG figures here")] = None,
    seqs: Annotated[int, typer.Option("--seqs", help="sentences in the batch (stdlib corpus, test split)")] = 32,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="tokens per sentence at most")] = 64,
    seed: Annotated[int, typer.Option("--seed", help="seed of the re-initialised model and of the path sampling")] = 0,
    threads: Annotated[int | None, typer.Option("--threads", help="torch/BLAS threads (1 is fastest for small models on a busy machine)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Rank collapse by layer: pure attention, + MLP, + skip, full; pretrained and re-initialised."""
    from attnrank.analysis.collapse import analyze, save
    from attnrank.util.fileio import check_writable

    if out is not None:
        check_writable(out)
    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task("sequences", total=None)
        result = analyze(model, n_seqs=seqs, max_tokens=max_tokens, seed=seed, threads=threads,
                         progress=lambda done, total: bar.update(task, completed=done, total=total))
    written = _save_set(lambda d: save(result, d), out)
    summary = result.summary()
    if as_json:
        meta = {k: v for k, v in result.meta.items() if k != "texts"}
        payload = {"meta": meta, "summary": json.loads(summary.to_json(orient="records")),
                   "paths": json.loads(result.path_summary().to_json(orient="records"))}
        if out is not None:
            payload["written"] = [str(p) for p in written]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    if quiet:
        return
    m = result.meta
    out_console.print(styled("bold", str(m["source"]), f"  model_type={m['model_type']}  layers={m['n_layers']}  "
                             f"heads={m['n_heads']}  sequences={m['n_seqs']}  dtype={m['dtype']}"), highlight=False)
    table = Table(title=f"{m['primary']} = |X - 1x^T| / |X|, mean ± std over sequences",
                  caption="composite l1,inf norm, x = mean row; first = embedding output, last = after the last layer")
    for col in ("init", "variant", "first", "last", "last / first"):
        table.add_column(col, justify="right" if col not in ("init", "variant") else "left")
    for r in summary.itertuples():
        table.add_row(r.init, r.variant, f"{r.first:.3g} ± {r.first_std:.2g}", f"{r.last:.3g} ± {r.last_std:.2g}",
                      f"{r.last_over_first:.3g}")
    out_console.print(table)
    if written:
        out_console.print(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written),
                          highlight=False)


@app.command()
@user_errors
def scale(
    model: Annotated[str, typer.Argument(help="'minilm' (shipped), a Hugging Face model directory, an attnrank model directory or training run")],
    out: Annotated[Path | None, typer.Option("--out", help="write tensors.csv, pairs.csv, meta.json and PNG figures here")] = None,
    scales: Annotated[str, typer.Option("--scales", help="scale factors c, comma-separated (positive, not 1)")] = "0.3,1.7,4.1",
    tol: Annotated[float, typer.Option("--tol", help="relative deviation below which f(cW) counts as f(W) (or c^k f(W))")] = 1e-6,
    group: Annotated[list[str] | None, typer.Option("--group", help="NAME=PATTERN[,PATTERN...]: also scale the matching tensors together (fnmatch on parameter names); repeatable")] = None,
    pairs: Annotated[bool, typer.Option("--pairs/--no-pairs", help="per-head W_Q/W_K and W_V/W_O rescaling symmetries")] = True,
    with_eps: Annotated[bool, typer.Option("--with-eps", help="judge the real function, normalisation epsilon kept (default: epsilon set to 0 for the verdicts)")] = False,
    exhaustive: Annotated[bool, typer.Option("--exhaustive", help="try every c even once a tensor is clearly neither")] = False,
    threads: Annotated[int | None, typer.Option("--threads", help="torch threads (1 is fastest for small models on a busy machine)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print verdicts and deviations as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Which tensors are scale-invariant (weight decay cannot change the function), homogeneous
    or neither, measured on real inputs; and the per-head attention rescaling symmetries."""
    from attnrank.analysis.scaling import analyze_scaling, parse_group, parse_scales, save
    from attnrank.util.fileio import check_writable, jsonable

    if out is not None:
        check_writable(out)
    groups = dict(parse_group(g) for g in group or [])
    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task("tensors", total=None)
        result = analyze_scaling(model, scales=parse_scales(scales), tol=tol, groups=groups, pairs=pairs,
                                 exhaustive=exhaustive, structural=not with_eps, threads=threads,
                                 progress=lambda stage, d, t: bar.update(task, description=stage, completed=d, total=t))
    written = _save_set(lambda d: save(result, d), out)
    if as_json:
        payload = {"meta": result.meta, "counts": result.counts(), "pair_summary": result.pair_summary(),
                   "tensors": result.table.to_dict(orient="records")}
        if out is not None:
            payload["written"] = [str(p) for p in written]
        sys.stdout.write(json.dumps(jsonable(payload), indent=2) + "\n")
        return
    if quiet:
        return
    m = result.meta
    out_console.print(styled("bold", str(m["source"]), f"  model_type={m['model_type']}  inputs: {m['inputs']}  "
                             f"c in {m['scales']}  tol={tol:g}  eps {'kept' if with_eps else '0 for verdicts'}"),
                      highlight=False, soft_wrap=True)
    out_console.print("tensors: " + ", ".join(f"{v} {n}" for v, n in result.counts().items()), highlight=False)
    table = Table(title="tensors and groups that are not 'neither'",
                  caption="inv = max_c |f(cW)-f(W)|/|f(W)|; hom = max_c |f(cW)-c^k f(W)|/|c^k f(W)|; "
                          "inv(eps) = inv with normalisation epsilon kept")
    for col in ("name", "verdict", "k", "inv", "hom", "inv(eps)"):
        table.add_column(col, justify="left" if col in ("name", "verdict") else "right")
    t = result.table
    num = lambda x, f=".1e": "—" if x != x else format(x, f)  # noqa: E731 - NaN shows as a dash
    for r in t[(t["verdict"] != "neither") | (t["kind"] == "group")].itertuples():
        table.add_row(r.name, r.verdict, num(r.k, ".3f") if r.verdict == "homogeneous" else "—",
                      num(r.inv_dev), num(r.hom_dev), num(r.inv_dev_eps))
    out_console.print(table)
    ps = result.pair_summary()
    for prod, s in ps.items():
        out_console.print(f"{prod.upper()} pair symmetry over {s['heads']} (layer, kv head) pairs: max deviation "
                          f"{s['pair_dev_max']:.1e}; one side only (control): min {s['one_sided_dev_min']:.1e}, "
                          f"median {s['one_sided_dev_median']:.1e}", highlight=False)
    if ps:
        out_console.print(f"whole model, every head at once: QK {m['pairs']['whole_model_qk']:.1e}, "
                          f"OV {m['pairs']['whole_model_ov']:.1e}", highlight=False)
    elif m.get("pairs_note"):
        out_console.print(m["pairs_note"], highlight=False)
    if written:
        out_console.print(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written),
                          highlight=False)


@app.command()
@user_errors
def track(
    series: Annotated[list[str], typer.Argument(help="a training run directory (checkpoints/step-N), a Trainer output_dir (checkpoint-N), several checkpoint directories, or a Hub id with --revisions")],
    out: Annotated[Path, typer.Option("--out", help="write table.csv (one row per checkpoint, step, layer, head, product), summary.csv, over_training.png, checkpoints/*.csv here (resumable)")],
    revisions: Annotated[str | None, typer.Option("--revisions", help="Hub id: comma-separated revisions in the local cache, e.g. step1000,step2000 (step = the trailing number)")] = None,
    tol: Annotated[float, typer.Option("--tol", help="relative threshold tau of the numerical rank #{s_i > tau s_1}")] = DEFAULT_TOL,
    workers: Annotated[int | None, typer.Option("--workers", help="local worker processes, one checkpoint each [default: cores]")] = None,
    ray: Annotated[str | None, typer.Option("--ray", help="analyse the checkpoints as Ray tasks: a cluster ADDRESS, 'auto', or 'local' (start one here)")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="draw over_training.png")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the per-checkpoint means as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Rank over training: per-head QK/OV spectra of every checkpoint of a series, and a figure of
    rank, gap/bound and balance against step. Finished checkpoints are not redone."""
    from attnrank.analysis.series import track as run_track

    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task("checkpoints", total=None)
        res = run_track(series if len(series) > 1 else series[0], out, revisions=revisions, tol=tol,
                        workers=workers, ray=ray, plots=plots,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    s = res.summary
    means = (s.groupby(["checkpoint", "step", "product"], sort=False)[["rank", "effective_rank", "gap_rel", "balance_rel"]]
             .mean().reset_index())
    if as_json:
        sys.stdout.write(json.dumps({"out": str(out), "architecture": res.architecture, "computed": res.computed,
                                     "skipped": res.skipped, "files": [str(f) for f in res.files],
                                     "checkpoints": json.loads(means.to_json(orient="records"))}, indent=2) + "\n")
        return
    if quiet:
        return
    table = Table(title=f"{len(res.computed) + len(res.skipped)} checkpoints ({len(res.skipped)} already done)",
                  caption="means over layers and heads; gap = (bound - nuclear) / bound; bal = relative balance")
    for col in ("checkpoint", "step", *(f"{p.upper()} {k}" for p in ("qk", "ov") for k in ("rank", "eff", "gap", "bal"))):
        table.add_column(col, justify="left" if col == "checkpoint" else "right")
    piv = means.set_index(["checkpoint", "product"])
    for ck, step in means[["checkpoint", "step"]].drop_duplicates().itertuples(index=False):
        cells = []
        for p in ("qk", "ov"):
            r = piv.loc[(ck, p)]
            cells += [f"{r['rank']:.2f}", f"{r['effective_rank']:.2f}", f"{r['gap_rel']:.4f}", f"{r['balance_rel']:.4f}"]
        table.add_row(Text(str(ck)), str(step), *cells)
    out_console.print(table)
    out_console.print(f"wrote {len(res.files)} files to {out}: " + ", ".join(p.name for p in res.files), highlight=False)


@app.command()
@user_errors
def sweep(
    spec: Annotated[str, typer.Argument(help="a task (lm, vit, recall) or a JSON/TOML spec file with kind, base, grid, seeds")],
    out: Annotated[Path, typer.Option("--out", help="sweep directory: runs/<name>/, results/, runs.csv, summary.csv (one sweep per directory at a time; a run still written by another process is recorded as failed; local workers die with the sweep)")],
    grid: Annotated[list[str] | None, typer.Option("--grid", help="FIELD=V1,V2,...: sweep this config field (repeatable; e.g. attn_weight_decay=0,0.1,1)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="FIELD=V: fix a config field for every run (repeatable; e.g. steps=500)")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="comma-separated seeds [default: 0, or the spec's]")] = None,
    workers: Annotated[int | None, typer.Option("--workers", help="local worker processes [default: cores / threads]")] = None,
    threads: Annotated[int, typer.Option("--threads", help="torch threads per run")] = 1,
    ray: Annotated[str | None, typer.Option("--ray", help="run on Ray: a cluster ADDRESS, 'auto', or 'local' (start one here)")] = None,
    device: Annotated[str, typer.Option("--device", help="device of every run")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="print the summary table as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """A grid of training runs (e.g. attention decay x MLP decay x seeds): local pool or Ray; resumable;
    failures recorded; mean and std over seeds in summary.csv."""
    from attnrank.training.config import CONFIG_BUILDERS
    from attnrank.training.sweep import (
        SweepSpec,
        load_spec,
        parse_assignment,
        parse_value,
        run_sweep,
    )

    if spec in CONFIG_BUILDERS:
        s = SweepSpec(kind=spec)
    elif Path(spec).is_file():
        s = load_spec(spec)
    else:
        raise AttnRankError(f"{spec!r} is neither a task ({', '.join(CONFIG_BUILDERS)}) nor a spec file")
    base = {**s.base, **dict(parse_assignment(x, many=False) for x in set_ or [])}
    g = {**s.grid, **dict(parse_assignment(x, many=True) for x in grid or [])}
    seed_list = s.seeds
    if seeds is not None:
        seed_list = [parse_value(x) for x in seeds.split(",")]
    s = SweepSpec(kind=s.kind, base={k: v for k, v in base.items() if k not in g}, grid=g, seeds=seed_list)
    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task("runs", total=len(s.runs()))

        def progress(rec: dict, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if rec["status"] != "ok" and not (quiet or as_json):
                err_console.print(styled("yellow", f"run {rec['name']} failed: ", str(rec["error"])),
                                  highlight=False, soft_wrap=True)

        res = run_sweep(s, out, workers=workers, ray=ray, threads=threads, device=device, progress=progress)
    if as_json:
        sys.stdout.write(json.dumps({"out": str(out), "counts": res.counts,
                                     "summary": json.loads(res.summary.to_json(orient="records"))}, indent=2) + "\n")
        return
    if quiet:
        return
    c = res.counts
    many = len(s.seeds) > 1
    table = Table(title=f"{c['runs']} runs: {c['ok']} ok ({c['skipped']} already finished), {c['failed']} failed",
                  caption="mean ± std over seeds" if many else "one seed: the run's value")
    keys = list(s.grid)
    metrics = [m for m in ("test_ppl", "test_loss", "test_acc", "val_loss", "loss", "acc", "qk_rank", "ov_rank")
               if f"{m}_mean" in res.summary or m in res.summary]
    for col in (*keys, "runs", "failed", *metrics):
        table.add_column(col, justify="right")
    for r in res.summary.to_dict(orient="records"):
        table.add_row(*[str(r[k]) for k in keys], str(r["runs"]), str(r["failed"]),
                      *[_mean_std(r, m) for m in metrics])
    out_console.print(table)
    out_console.print(f"wrote {out / 'runs.csv'} and {out / 'summary.csv'}", highlight=False)


def _mean_std(r: dict, m: str) -> str:
    """``mean ± std`` of a summary row where it has both, the single value where it has one."""
    if f"{m}_mean" not in r:
        v = r.get(m)
        return "—" if v is None or v != v else f"{v:.4g}"
    mean, std = r[f"{m}_mean"], r.get(f"{m}_std")
    if mean != mean:
        return "—"
    return f"{mean:.4g}" if std is None or std != std else f"{mean:.4g} ± {std:.2g}"


def main() -> None:
    """The ``attnrank`` entry point: a usage error (bad option value, unknown option) is one line
    on stderr and exit status 2, like every other user error."""
    try:
        from typer._click import exceptions as ex  # typer >= 0.25 vendors click
    except ImportError:  # pragma: no cover - older typer on click
        from click import exceptions as ex

    try:
        code = app(standalone_mode=False)
    except ex.NoArgsIsHelpError:
        app()  # shows the help as typer does
        return
    except ex.UsageError as e:
        cmd = e.ctx.command_path if e.ctx is not None else "attnrank"
        print_error(f"{e.format_message()} (see '{cmd} --help')")
        sys.exit(2)
    except ex.ClickException as e:
        print_error(e.format_message())
        sys.exit(e.exit_code)
    except (ex.Abort, typer.Abort):
        print_error("aborted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
