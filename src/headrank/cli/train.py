"""``headrank train recall|lm|vit``: training with attention-specific weight decay."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headrank.cli.common import (
    app,
    err_console,
    option,
    out_console,
    user_errors,
)
from headrank.util.constraints import TRAIN

train_app = typer.Typer(no_args_is_help=True, help="Train the project's transformer with attention-specific weight decay.")
app.add_typer(train_app, name="train")


_OUT = Annotated[Path, typer.Option("--out", help="run directory (config.json, metrics.jsonl, checkpoints/, summary.json)")]
_ATTN_WD = Annotated[float, option(TRAIN, "attn_weight_decay", help="AdamW weight decay of the attention projections Q, K, V, O")]
_WD = Annotated[float, option(TRAIN, "weight_decay", help="AdamW weight decay of every other matrix and the embeddings (biases, norms: 0)")]
_SEED = Annotated[int, option(TRAIN, "seed", help="seed of the initialisation and the data stream")]
_DEVICE = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda, cuda:N")]
_RESUME = Annotated[bool, typer.Option("--resume", help="continue the run in --out from its newest checkpoint with the settings its config.json stored (options given must match them; a larger --steps extends the run, when its schedule allows); one writer per run: while another process writes the run, this stops with one line and exit 2")]
_THREADS = Annotated[int, option(TRAIN, "threads", help="torch threads per process, recorded in config.json (1: within 15% of 2 threads on a quiet 2-core machine, 2-15x faster when anything else runs: benchmarks/THREADS.md; resume with the same value)")]
_LOG = Annotated[str | None, typer.Option("--log", help="also log every row to tensorboard, wandb, mlflow (comma-separated) or none; metrics.jsonl is always written [default: tensorboard when installed]")]
_KEEP = Annotated[str | None, typer.Option("--keep-checkpoints", help="checkpoints kept: N (the newest N) or all [default: 2]; headrank track measures each one kept")]
_N_LAYERS = Annotated[int | None, typer.Option("--n-layers", help="transformer layers [default: 2 for recall, else 4]")]
_D_MODEL = Annotated[int | None, typer.Option("--d-model", help="model width [default: 64]")]
_N_HEADS = Annotated[int | None, typer.Option("--n-heads", help="attention heads [default: 4]")]
_LOG_EVERY = Annotated[int | None, option(TRAIN, "log_every", help="steps between loss rows [default: 10]")]
_TRACK_EVERY = Annotated[int | None, option(TRAIN, "track_every", help="steps between rank measurements [default: 100]")]
_CHECKPOINT_EVERY = Annotated[int | None, option(TRAIN, "checkpoint_every", help="steps between checkpoints [default: 500]")]
_EVAL_EVERY = Annotated[int, typer.Option("--eval-every", help="steps between validation evaluations (0: at the end only)")]
_STEPS = Annotated[int, option(TRAIN, "steps", help="optimizer steps")]
_JSON = Annotated[bool, typer.Option("--json", help="print the final summary as JSON on stdout")]
_QUIET = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar, no summary")]


#: CLI option names that differ from the config field they set
CLI_FIELDS = {"attn_wd": "attn_weight_decay", "wd": "weight_decay"}


def cli_config(kind: str, run_dir: Path, values: dict, given: set[str], *, resume: bool):
    """The config of ``headrank train KIND``: with ``--resume`` and a stored ``config.json``, the
    stored settings checked against the options ``given`` on the command line
    (:func:`headrank.training.loop.resume_config`); else one built from every option ``values``
    (CLI names: ``attn_wd``, ``wd``, ``keep_checkpoints`` as ``N`` or ``all``, the rest config
    fields)."""
    from headrank.training.config import make_config
    from headrank.training.loop import resume_config
    from headrank.training.state import parse_keep

    values = {**values, "keep_checkpoints": parse_keep(values.get("keep_checkpoints"))}
    fields_ = {CLI_FIELDS.get(k, k): v for k, v in values.items()}
    cfg = None
    if resume:
        cfg = resume_config(run_dir, kind, {CLI_FIELDS.get(k, k): v for k, v in values.items() if k in given})
    return cfg if cfg is not None else make_config(kind, **fields_)


def _given(ctx: typer.Context, values: dict) -> tuple[dict, set]:
    """``values`` and the names of those given on the command line (not defaults)."""
    return values, {k for k in values if (src := ctx.get_parameter_source(k)) is not None and src.name != "DEFAULT"}


@train_app.command("recall")
@user_errors
def train_recall(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="run directory (config.json, metrics.jsonl, checkpoints/)")],
    attn_wd: _ATTN_WD = 0.1,
    wd: _WD = 0.1,
    steps: Annotated[int, option(TRAIN, "steps", help="optimizer steps (one fresh batch each)")] = 3000,
    seed: _SEED = 0,
    device: _DEVICE = "auto",
    resume: _RESUME = False,
    n_layers: _N_LAYERS = None,
    d_model: _D_MODEL = None,
    n_heads: _N_HEADS = None,
    lr: Annotated[float | None, option(TRAIN, "lr", help="peak learning rate [default: 3e-3]")] = None,
    batch_size: Annotated[int | None, option(TRAIN, "batch_size", help="sequences per step [default: 64]")] = None,
    track_every: _TRACK_EVERY = None,
    log_every: _LOG_EVERY = None,
    checkpoint_every: _CHECKPOINT_EVERY = None,
    keep_checkpoints: _KEEP = None,
    threads: _THREADS = 1,
    log: _LOG = None,
    as_json: _JSON = False,
    quiet: _QUIET = False,
) -> None:
    """Associative recall (k1 v1 ... kn vn q -> v(q)), AdamW with its own decay on attention.

    `--resume --steps N` with a larger N extends a finished run (constant learning rate after the
    warmup; a cosine run cannot be extended)."""
    options = _given(ctx, dict(
        attn_wd=attn_wd, wd=wd, steps=steps, seed=seed, n_layers=n_layers, d_model=d_model, n_heads=n_heads, lr=lr,
        batch_size=batch_size, track_every=track_every, log_every=log_every, checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints))
    _run_training(options, out, "recall", resume=resume, device=device, threads=threads, as_json=as_json,
                  quiet=quiet, log=log)


def _run_training(options: tuple[dict, set], out: Path, label: str, *, resume: bool, device: str,
                  threads: int | None, as_json: bool, quiet: bool, log: str | None = None) -> None:
    """Train with a progress bar and print the final summary (rank 0 only under torchrun).
    ``options``: (the option values, the names given); ``--resume`` reads the stored settings."""
    import os

    from headrank.training.loop import train

    cfg = cli_config(label, out, *options, resume=resume)

    rank0 = os.environ.get("RANK", "0") in ("", "0")
    bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                   disable=quiet or as_json or not rank0)
    if rank0 and not (quiet or as_json) and not err_console.is_terminal:  # a log file: plain lines
        from headrank.util.progress import LineProgress

        bar = LineProgress(err_console)
    info: dict[str, str] = {"loss": "-", "acc": "-", "rank": "-"}

    def progress(step: int, total: int, row: dict | None) -> None:
        if row:
            if "loss" in row:
                info["loss"], info["acc"] = f"{row['loss']:.3f}", f"{row['acc']:.3f}"
            if "mean" in row:
                info["rank"] = f"{row['mean']['qk']['effective_rank']:.1f}/{row['mean']['ov']['effective_rank']:.1f}"
        bar.update(task, completed=step, total=total,
                   info=f"loss {info['loss']}  acc {info['acc']}  eff. rank qk/ov {info['rank']}")

    with bar:
        task = bar.add_task(label, total=cfg.steps, info="")
        result = train(out, cfg, resume=resume, device=device, progress=progress, threads=threads, log=log)
    if result.rank != 0:
        return
    f = result.final
    if as_json:
        sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    elif not quiet:
        m = f.get("mean", {})
        out_console.print(
            f"step {f.get('step')}: loss {f.get('loss', float('nan')):.4f}  acc {f.get('acc', float('nan')):.3f}  "
            f"mean effective rank qk {m.get('qk', {}).get('effective_rank', float('nan')):.2f}  "
            f"ov {m.get('ov', {}).get('effective_rank', float('nan')):.2f}  (head dim {cfg.model.head_dim})",
            highlight=False)
        evals = [f"{k} {f[k]:.4g}" for k in ("val_loss", "val_ppl", "val_acc", "test_loss", "test_ppl", "test_acc")
                 if k in f]
        if evals:
            out_console.print("  ".join(evals), highlight=False)
        out_console.print(f"run in {result.run_dir}; checkpoint {result.checkpoint} "
                          f"(headrank spectra {result.checkpoint})", highlight=False)


@train_app.command("lm")
@user_errors
def train_lm(
    ctx: typer.Context,
    out: _OUT,
    corpus: Annotated[str | None, typer.Option("--corpus", help="text: a .txt/.jsonl/.jsonl.zst file or a directory of them (default: the stdlib's docstrings and comments)")] = None,
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="byte (UTF-8 bytes, 256 tokens) or bpe (trained on the train split)")] = "byte",
    bpe_vocab: Annotated[int, typer.Option("--bpe-vocab", help="BPE vocabulary size")] = 1024,
    seq_len: Annotated[int, typer.Option("--seq-len", help="tokens per training window (context)")] = 64,
    max_chars: Annotated[int | None, typer.Option("--max-chars", help="characters read per split (default: all)")] = None,
    eval_tokens: Annotated[int, typer.Option("--eval-tokens", help="tokens scored per evaluation split at most")] = 65536,
    eval_every: _EVAL_EVERY = 0,
    attn_wd: _ATTN_WD = 0.1,
    wd: _WD = 0.1,
    steps: _STEPS = 2000,
    seed: _SEED = 0,
    n_layers: _N_LAYERS = None,
    d_model: _D_MODEL = None,
    n_heads: _N_HEADS = None,
    lr: Annotated[float | None, option(TRAIN, "lr", help="peak learning rate [default: 3e-3]")] = None,
    batch_size: Annotated[int | None, option(TRAIN, "batch_size", help="global batch (windows per step, split over DDP processes) [default: 32]")] = None,
    track_every: _TRACK_EVERY = None,
    log_every: _LOG_EVERY = None,
    checkpoint_every: _CHECKPOINT_EVERY = None,
    keep_checkpoints: _KEEP = None,
    device: _DEVICE = "auto",
    resume: _RESUME = False,
    threads: _THREADS = 1,
    log: _LOG = None,
    as_json: _JSON = False,
    quiet: _QUIET = False,
) -> None:
    """Autoregressive LM (validation/test loss and perplexity). Under `torchrun --nproc-per-node N -m headrank
    train lm ...` it trains with DDP (gloo on the CPU), each process taking 1/N of the global batch."""
    options = _given(ctx, dict(
        corpus=corpus, tokenizer=tokenizer, bpe_vocab=bpe_vocab, seq_len=seq_len, max_chars=max_chars,
        eval_tokens=eval_tokens, eval_every=eval_every, attn_wd=attn_wd, wd=wd, steps=steps, seed=seed,
        n_layers=n_layers, d_model=d_model, n_heads=n_heads, lr=lr, batch_size=batch_size, track_every=track_every,
        log_every=log_every, checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints))
    _run_training(options, out, "lm", resume=resume, device=device, threads=threads, as_json=as_json, quiet=quiet,
                  log=log)


@train_app.command("vit")
@user_errors
def train_vit(
    ctx: typer.Context,
    out: _OUT,
    images: Annotated[str | None, typer.Option("--images", help="image folder DIR/<class>/<image> (or DIR/train|validation|test/<class>/...); default: scikit-learn digits")] = None,
    image_size: Annotated[int | None, typer.Option("--image-size", help="resize images to this square size [default: 8 for digits, 32 for a folder]")] = None,
    patch_size: Annotated[int | None, typer.Option("--patch-size", help="patch size [default: 2 up to 16 pixels, else 4]")] = None,
    eval_every: _EVAL_EVERY = 0,
    attn_wd: _ATTN_WD = 0.1,
    wd: _WD = 0.1,
    steps: _STEPS = 2000,
    seed: _SEED = 0,
    n_layers: _N_LAYERS = None,
    d_model: _D_MODEL = None,
    n_heads: _N_HEADS = None,
    lr: Annotated[float | None, option(TRAIN, "lr", help="peak learning rate [default: 1e-3]")] = None,
    batch_size: Annotated[int | None, option(TRAIN, "batch_size", help="global batch [default: 64]")] = None,
    track_every: _TRACK_EVERY = None,
    checkpoint_every: _CHECKPOINT_EVERY = None,
    keep_checkpoints: _KEEP = None,
    device: _DEVICE = "auto",
    resume: _RESUME = False,
    threads: _THREADS = 1,
    log: _LOG = None,
    as_json: _JSON = False,
    quiet: _QUIET = False,
) -> None:
    """Vision transformer classifying images (validation/test loss and accuracy)."""
    options = _given(ctx, dict(
        images=images, image_size=image_size, patch_size=patch_size, eval_every=eval_every, attn_wd=attn_wd, wd=wd,
        steps=steps, seed=seed, n_layers=n_layers, d_model=d_model, n_heads=n_heads, lr=lr, batch_size=batch_size,
        track_every=track_every, checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints))
    _run_training(options, out, "vit", resume=resume, device=device, threads=threads, as_json=as_json, quiet=quiet,
                  log=log)
