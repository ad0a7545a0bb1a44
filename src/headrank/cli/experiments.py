"""``headrank collapse``, ``scale``, ``track`` and ``sweep``: the analyses and runs beyond one checkpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from headrank.cli.common import (
    _save_set,
    app,
    destination,
    err_console,
    option,
    out_console,
    print_error,
    progress_bar,
    styled,
    user_errors,
)
from headrank.core.linalg import DEFAULT_TOL
from headrank.util.constraints import COLLAPSE, SCALE, SWEEP, TRACK


@app.command()
@user_errors
def collapse(
    model: Annotated[str, typer.Argument(help="'minilm', a Hugging Face BERT/GPT-2/LLaMA-style directory, or a project model / run directory")],
    out: Annotated[Path | None, typer.Option("--out", help="write layers.csv, summary.csv, paths.csv, collapse.npz, meta.json and PNG figures here")] = None,
    seqs: Annotated[int, option(COLLAPSE, "seqs", "sentences in the batch (stdlib corpus, test split)")] = 32,
    max_tokens: Annotated[int, option(COLLAPSE, "max_tokens", "tokens per sentence at most")] = 64,
    seed: Annotated[int, typer.Option("--seed", help="seed of the re-initialised model and of the path sampling")] = 0,
    threads: Annotated[int, option(COLLAPSE, "threads", "CPU threads of the computation (1, the default, is fastest for small models on a busy machine)")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Rank collapse by layer: pure attention, + MLP, + skip, full; pretrained and re-initialised."""
    from headrank.analysis.collapse import collapse as run_collapse
    from headrank.analysis.collapse import save
    with destination(out) as dest, progress_bar(quiet or as_json) as bar:
        task = bar.add_task("sequences", total=None)
        result = run_collapse(model, seqs=seqs, max_tokens=max_tokens, seed=seed, threads=threads,
                              progress=lambda done, total: bar.update(task, completed=done, total=total))
        written = _save_set(lambda d: save(result, d), dest)
    summary = result.summary()
    if as_json:
        payload = result.to_json()
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
    model: Annotated[str, typer.Argument(help="'minilm' (shipped), a Hugging Face model directory, a headrank model directory or training run")],
    out: Annotated[Path | None, typer.Option("--out", help="write tensors.csv, pairs.csv, meta.json and PNG figures here")] = None,
    scales: Annotated[str, typer.Option("--scales", help="scale factors c, comma-separated (positive, not 1)")] = "0.3,1.7,4.1",
    tol: Annotated[float, option(SCALE, "tol", "relative deviation below which f(cW) counts as f(W) (or c^k f(W))")] = 1e-6,
    group: Annotated[list[str] | None, typer.Option("--group", help="NAME=PATTERN[,PATTERN...]: also scale the matching tensors together (fnmatch on parameter names); repeatable")] = None,
    pairs: Annotated[bool, typer.Option("--pairs/--no-pairs", help="per-head W_Q/W_K and W_V/W_O rescaling symmetries")] = True,
    with_eps: Annotated[bool, typer.Option("--with-eps", help="judge the real function, normalisation epsilon kept (default: epsilon set to 0 for the verdicts)")] = False,
    exhaustive: Annotated[bool, typer.Option("--exhaustive", help="try every c even once a tensor is clearly neither")] = False,
    threads: Annotated[int, option(SCALE, "threads", "CPU threads of the computation (1, the default, is fastest for small models on a busy machine)")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print verdicts and deviations as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Which tensors are scale-invariant (weight decay cannot change the function), homogeneous
    or neither, measured on real inputs; and the per-head attention rescaling symmetries."""
    from headrank.analysis.scaling import save
    from headrank.analysis.scaling import scale as run_scale
    with destination(out) as dest, progress_bar(quiet or as_json) as bar:
        task = bar.add_task("tensors", total=None)
        result = run_scale(model, scales=scales, tol=tol, groups=group or None, pairs=pairs, with_eps=with_eps,
                           exhaustive=exhaustive, threads=threads,
                           progress=lambda stage, d, t: bar.update(task, description=stage, completed=d, total=t))
        written = _save_set(lambda d: save(result, d), dest)
    if as_json:
        payload = result.to_json()
        if out is not None:
            payload["written"] = [str(p) for p in written]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return
    if quiet:
        return
    _print_scale(result, tol, with_eps)
    if written:
        out_console.print(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written),
                          highlight=False)



def _print_scale(result, tol: float, with_eps: bool) -> None:
    """The scale verdicts per tensor and group, and the per-head pair symmetries."""
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

@app.command()
@user_errors
def track(
    series: Annotated[list[str], typer.Argument(help="a training run directory (checkpoints/step-N), a Trainer output_dir (checkpoint-N), several checkpoint directories, or a Hub id with --revisions")],
    out: Annotated[Path, typer.Option("--out", help="write table.csv (one row per checkpoint, step, layer, head, product), summary.csv, over_training.png, checkpoints/*.csv here (resumable)")],
    revisions: Annotated[str | None, typer.Option("--revisions", help="Hub id: comma-separated revisions in the local cache (or with --remote, on the Hub), e.g. step1000,step2000 (step parsed from the name); 'all' with --remote: every ref named by a step")] = None,
    remote: Annotated[bool, typer.Option("--remote", help="Hub id: read each revision over HTTP range requests (only config, headers and attention tensors), nothing downloaded")] = False,
    tol: Annotated[float, option(TRACK, "tol", "relative threshold tau of the numerical rank #{s_i > tau s_1}")] = DEFAULT_TOL,
    convention: Annotated[str, typer.Option("--convention", help="raw (the weights as stored) or transformerlens (as TransformerLens 4 holds them by default); recorded in series.json")] = "raw",
    workers: Annotated[int | None, option(TRACK, "workers", "worker processes, one checkpoint each (default: cores)")] = None,
    ray: Annotated[str | None, typer.Option("--ray", help="analyse the checkpoints as Ray tasks: a cluster ADDRESS, 'auto', or 'local' (start one here)")] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="draw over_training.png")] = True,
    force: Annotated[bool, typer.Option("--force", help="measure into an --out made from other checkpoints or another --tol (refused otherwise)")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="continue the run that stopped in --out: the same checkpoints at the same commits, those measured left alone (the same series and options, or one line)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the per-checkpoint means as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """Rank over training: per-head QK/OV spectra of every checkpoint of a series, and a figure of
    rank, gap/bound and balance against step. Finished checkpoints are not redone."""
    from headrank.analysis.series import track as run_track

    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task("checkpoints", total=None)
        res = run_track(series if len(series) > 1 else series[0], out, revisions=revisions, tol=tol, convention=convention,
                        workers=workers, ray=ray, plots=plots, force=force, remote=remote, resume=resume,
                        progress=lambda done, total: bar.update(task, completed=done, total=total,
                                                                description="checkpoints"),
                        checking=lambda done, total: bar.update(task, completed=done, total=total,
                                                                description="architecture checks"))
    for label, err in res.failed.items():
        err_console.print(styled("yellow", "failed: ", f"{label}: {err} (a re-run tries it again)"), highlight=False)
    from headrank.core.metrics import CONSOLE_CAPTION, CONSOLE_METRICS

    means = res.checkpoint_means()
    if as_json:
        sys.stdout.write(json.dumps(res.to_json(), indent=2) + "\n")
        raise typer.Exit(1 if res.failed else 0)
    if quiet:
        raise typer.Exit(1 if res.failed else 0)
    n_ck = len(res.computed) + len(res.skipped)
    extra = len(means[["checkpoint", "step"]].drop_duplicates()) - n_ck  # rows from the run's metrics.jsonl
    more = f" + {extra} step{'s' if extra != 1 else ''} from metrics.jsonl" if extra > 0 else ""
    table = Table(title=f"{n_ck} checkpoint{'s' if n_ck != 1 else ''} ({len(res.skipped)} already done){more}",
                  caption=CONSOLE_CAPTION.replace("mean over heads", "means over layers and heads")
                  + "; definitions: docs/outputs.md")
    for col in ("checkpoint", "step", *(f"{p.upper()} {h}" for p in ("qk", "ov") for _, h, _ in CONSOLE_METRICS)):
        table.add_column(col, justify="left" if col == "checkpoint" else "right")
    piv = means.set_index(["checkpoint", "product"])
    for ck, step in means[["checkpoint", "step"]].drop_duplicates().itertuples(index=False):
        cells = [format(piv.loc[(ck, p)].get(k, float("nan")), f) for p in ("qk", "ov") for k, _, f in CONSOLE_METRICS]
        table.add_row(Text(str(ck)), str(step), *cells)
    out_console.print(table)
    out_console.print(f"wrote {len(res.files)} files to {out}: " + ", ".join(p.name for p in res.files), highlight=False)
    if res.failed:
        raise typer.Exit(1)  # the others are written; a re-run tries the failed ones again


@app.command()
@user_errors
def sweep(
    spec: Annotated[str, typer.Argument(help="a task (lm, vit, recall) or a JSON/TOML spec file with kind, base, grid, seeds")],
    out: Annotated[Path, typer.Option("--out", help="sweep directory: runs/<name>/, results/, runs.csv, summary.csv (one sweep per directory at a time; a run still written by another process is recorded as failed; local workers die with the sweep)")],
    grid: Annotated[list[str] | None, typer.Option("--grid", help="FIELD=V1,V2,...: sweep this config field (repeatable; e.g. attn_weight_decay=0,0.1,1)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="FIELD=V: fix a config field for every run (repeatable; e.g. steps=500)")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="comma-separated seeds [default: 0, or the spec's]")] = None,
    workers: Annotated[int | None, option(SWEEP, "workers", "worker processes, one run each (default: cores / threads)")] = None,
    threads: Annotated[int, option(SWEEP, "threads", "CPU threads of each run")] = 1,
    ray: Annotated[str | None, typer.Option("--ray", help="run on Ray: a cluster ADDRESS, 'auto', or 'local' (start one here)")] = None,
    device: Annotated[str, typer.Option("--device", help="device of every run")] = "cpu",
    extend: Annotated[bool, typer.Option("--extend", help="with a larger --set steps=N than the sweep in --out: continue every run to N steps (refused without it)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary table as JSON on stdout")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress, no table")] = False,
) -> None:
    """A grid of training runs (e.g. attention decay x MLP decay x seeds): local pool or Ray; resumable;
    failures recorded; mean and std over seeds in summary.csv. Exit status 3 when any run failed.
    A re-run into --out may add grid values and seeds; other settings are refused."""
    from headrank.training.sweep import build_spec, sweep_verb

    s = build_spec(spec, sets=set_, grid=grid, seeds=seeds)
    with progress_bar(quiet or as_json) as bar:
        task = bar.add_task("runs", total=len(s.runs()))

        def progress(rec: dict, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            if rec["status"] != "ok" and not (quiet or as_json):
                err_console.print(styled("yellow", f"run {rec['name']} failed: ", str(rec["error"])),
                                  highlight=False, soft_wrap=True)

        res = sweep_verb(s, out, workers=workers, ray=ray, threads=threads, device=device, extend=extend,
                         progress=progress)
    s = res.spec or s
    if as_json:
        sys.stdout.write(json.dumps(res.to_json(), indent=2) + "\n")
    elif not quiet:
        _sweep_table(res, s, out)
    if res.failure_line():
        print_error(res.failure_line())
        raise typer.Exit(3)


def _sweep_table(res, s, out: Path) -> None:
    c = res.counts
    many = len(s.seeds) > 1
    table = Table(title=f"{c['runs']} runs: {c['ok']} ok ({c['skipped']} already finished), {c['failed']} failed",
                  caption="mean ± std over seeds" if many else "one seed: the run's value")
    keys = list(s.grid)
    from headrank.core.metrics import CONSOLE_METRICS

    ranks = [f"{p}_{k}" for p in ("qk", "ov") for k, _, _ in CONSOLE_METRICS[:2]]  # effective rank, k90
    metrics = [m for m in ("test_ppl", "test_loss", "test_acc", "val_loss", "loss", "acc", *ranks)
               if f"{m}_mean" in res.grid_summary or m in res.grid_summary]
    for col in (*keys, "runs", "failed", *metrics):
        table.add_column(col, justify="right")
    for r in res.summary().to_dict(orient="records"):
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
