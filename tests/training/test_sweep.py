"""Sweeps: grid expansion, skip of finished runs, resume of unfinished ones, failures recorded
without stopping the others, aggregation (mean and std over seeds), CLI, Ray."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from headrank.errors import HeadRankError
from headrank.training.sweep import SweepSpec, load_spec, parse_assignment, run_name, run_sweep

from .test_loop import run_cli

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8, steps=12, track_every=6,
            checkpoint_every=6)


def test_spec_expansion_and_parsing(tmp_path):
    s = SweepSpec(kind="recall", base={"steps": 5}, grid={"attn_weight_decay": [0.0, 0.5], "lr": [1e-3]},
                  seeds=[0, 1])
    names = [n for n, _ in s.runs()]
    assert names == ["attn_weight_decay-0__lr-0.001__seed-0", "attn_weight_decay-0__lr-0.001__seed-1",
                     "attn_weight_decay-0.5__lr-0.001__seed-0", "attn_weight_decay-0.5__lr-0.001__seed-1"]
    assert run_name({"corpus": "/data/my text.jsonl", "seed": 0}) == "corpus-_data_my_text.jsonl__seed-0"
    assert s.runs()[3][1] == {"steps": 5, "attn_weight_decay": 0.5, "lr": 1e-3, "seed": 1}
    assert parse_assignment("attn-weight-decay=0,0.1,1", many=True) == ("attn_weight_decay", [0, 0.1, 1])
    assert parse_assignment("corpus=/x/y.jsonl", many=False) == ("corpus", "/x/y.jsonl")
    (tmp_path / "s.toml").write_text('kind = "lm"\nseeds = [0, 1]\n[base]\nsteps = 10\n[grid]\nweight_decay = [0, 0.1]\n')
    spec = load_spec(tmp_path / "s.toml")
    assert spec.kind == "lm" and spec.base == {"steps": 10} and spec.grid == {"weight_decay": [0, 0.1]}
    for bad in (dict(kind="nope"), dict(kind="lm", seeds=[0, 0]), dict(kind="lm", grid={"seed": [1]}),
                dict(kind="lm", grid={"lr": []}), dict(kind="lm", base={"lr": 1}, grid={"lr": [2]})):
        with pytest.raises(HeadRankError):
            SweepSpec(**bad)


@pytest.mark.slow
def test_pool_sweep_records_failures_skips_finished_and_aggregates(tmp_path):
    # lr * decay >= 1 is refused by the config: the attn_weight_decay=400 runs fail, the others go on
    spec = SweepSpec(kind="recall", base=dict(TINY, lr=3e-3), grid={"attn_weight_decay": [0.0, 1.0, 400.0]},
                     seeds=[0, 1])
    res = run_sweep(spec, tmp_path / "sw", workers=2)
    assert res.counts == {"runs": 6, "ok": 4, "failed": 2, "skipped": 0}
    runs = pd.read_csv(tmp_path / "sw" / "runs.csv")
    failed = runs[runs["status"] == "failed"]
    assert list(failed["attn_weight_decay"]) == [400.0, 400.0]
    assert failed["error"].str.contains("HeadRankError: lr \\* weight decay").all()
    rec = json.loads((tmp_path / "sw" / "results" / "attn_weight_decay-400__seed-1.json").read_text())
    assert rec["status"] == "failed" and "Traceback" in rec["traceback"]
    # aggregate: mean and (n-1) std of the two seeds, from the runs' own summary.json
    summ = pd.read_csv(tmp_path / "sw" / "summary.csv")
    for lam in (0.0, 1.0):
        vals = []
        for seed in (0, 1):
            s = json.loads((tmp_path / "sw" / "runs" / f"attn_weight_decay-{lam:g}__seed-{seed}" / "summary.json").read_text())
            vals.append(s["final"]["mean"]["ov"]["effective_rank"])
        row = summ[summ["attn_weight_decay"] == lam].iloc[0]
        assert row["runs"] == 2 and row["failed"] == 0
        assert row["ov_effective_rank_mean"] == pytest.approx(np.mean(vals))
        assert row["ov_effective_rank_std"] == pytest.approx(np.std(vals, ddof=1))
    bad_row = summ[summ["attn_weight_decay"] == 400.0].iloc[0]
    assert bad_row["failed"] == 2 and np.isnan(bad_row["loss_mean"])

    # second invocation: finished runs are skipped (files untouched); failures are tried again
    ok_run = tmp_path / "sw" / "runs" / "attn_weight_decay-1__seed-0"
    mtime = (ok_run / "metrics.jsonl").stat().st_mtime_ns
    # an unfinished run (no summary.json, newest checkpoint at step 6) is resumed, not restarted
    unfinished = tmp_path / "sw" / "runs" / "attn_weight_decay-0__seed-1"
    before = (unfinished / "metrics.jsonl").read_bytes()
    os.remove(unfinished / "summary.json")
    import shutil

    shutil.rmtree(unfinished / "checkpoints" / "step-00000012")
    res2 = run_sweep(spec, tmp_path / "sw", workers=1)
    assert res2.counts == {"runs": 6, "ok": 4, "failed": 2, "skipped": 3}
    assert (ok_run / "metrics.jsonl").stat().st_mtime_ns == mtime
    assert (unfinished / "metrics.jsonl").read_bytes() == before
    assert json.loads((tmp_path / "sw" / "results" / "attn_weight_decay-0__seed-1.json").read_text())["resumed_from"] == 6
    # changing a base setting is refused before any run is touched, naming the difference
    spec3 = SweepSpec(kind="recall", base=dict(TINY, lr=2e-3), grid={"attn_weight_decay": [0.0]}, seeds=[0])
    with pytest.raises(HeadRankError, match=r"other base settings \(lr 0.003 -> 0.002\)"):
        run_sweep(spec3, tmp_path / "sw", workers=1)
    assert (ok_run / "metrics.jsonl").stat().st_mtime_ns == mtime


@pytest.mark.slow
def test_cli_sweep_and_bad_input(tmp_path):
    rc, out, err = run_cli("sweep", "recall", "--out", str(tmp_path / "s"), "--grid", "attn_weight_decay=0,0.5",
                           "--set", "steps=6", "--set", "d_model=16", "--set", "n_heads=2", "--set", "batch_size=8",
                           "--set", "track_every=6", "--seeds", "3", "--workers", "1", "--json")
    assert rc == 0, err
    payload = json.loads(out)
    assert payload["counts"]["ok"] == 2 and len(payload["summary"]) == 2
    assert (tmp_path / "s" / "runs" / "attn_weight_decay-0.5__seed-3" / "summary.json").exists()
    for args in (["banana", "--out", str(tmp_path / "b")],
                 ["lm", "--out", str(tmp_path / "c"), "--grid", "attn_wd=0,1"],
                 ["lm", "--out", str(tmp_path / "d"), "--grid", "lr"],
                 ["lm", "--out", str(tmp_path / "e"), "--seeds", "0,0"],
                 ["lm", "--out", str(tmp_path / "f"), "--threads", "0"]):
        rc, _, err = run_cli("sweep", *args, "--quiet")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "error" in lines[0], (args, err)


@pytest.mark.slow
def test_ray_local_sweep(tmp_path):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'headrank[ray]' (make test-ray)")
    spec = SweepSpec(kind="recall", base=dict(TINY), grid={"attn_weight_decay": [0.0, 400.0]}, seeds=[0])
    res = run_sweep(spec, tmp_path / "r", ray="local")
    assert res.counts == {"runs": 2, "ok": 1, "failed": 1, "skipped": 0}
    # the same run on the local pool gives the same metrics (deterministic runs, whatever ran them)
    pool = run_sweep(SweepSpec(kind="recall", base=dict(TINY), grid={"attn_weight_decay": [0.0]}, seeds=[0]),
                     tmp_path / "p", workers=1)
    a = (tmp_path / "r" / "runs" / "attn_weight_decay-0__seed-0" / "metrics.jsonl").read_bytes()
    b = (tmp_path / "p" / "runs" / "attn_weight_decay-0__seed-0" / "metrics.jsonl").read_bytes()
    assert a == b and pool.counts["ok"] == 1


@pytest.mark.slow
def test_cli_sweep_with_every_default_one_seed(tmp_path):
    """`headrank sweep recall` with every default but the length: one seed, the local pool, the table.
    One seed has no std: summary.csv holds the run's values, and the table prints them."""
    rc, out, err = run_cli("sweep", "recall", "--out", str(tmp_path / "s"), "--grid", "attn_weight_decay=0,1",
                           "--set", "steps=4", "--set", "d_model=16", "--set", "n_heads=2", timeout=300)
    assert rc == 0, err
    assert "Traceback" not in err and "2 runs: 2 ok" in out
    summ = pd.read_csv(tmp_path / "s" / "summary.csv")
    assert not any(c.endswith(("_mean", "_std")) for c in summ.columns)
    runs = pd.read_csv(tmp_path / "s" / "runs.csv")
    for lam in (0, 1):
        assert summ.loc[summ["attn_weight_decay"] == lam, "loss"].item() == \
            pytest.approx(runs.loc[runs["attn_weight_decay"] == lam, "loss"].item())
    # the printed table shows the value of each run (no "±")
    assert "±" not in out and f"{summ['loss'].iloc[0]:.4g}" in out


def invoke(*args):
    """The CLI in this process (workers=1 runs in this process too): exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from headrank.cli import app

    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_rerun_with_other_settings_is_refused_and_extend_is_explicit(tmp_path):
    """A sweep re-run never changes finished runs silently: another base setting (steps down or
    up, lr) is one line naming it, with every run untouched; --extend continues every run to the
    larger steps; added grid values and seeds are new runs, and sweep.json lists all runs."""
    out = tmp_path / "x"
    base = ["--set", "d_model=16", "--set", "n_heads=2", "--set", "batch_size=8", "--set", "track_every=2",
            "--set", "checkpoint_every=2", "--set", "n_pairs=3", "--set", "n_keys=6", "--set", "n_values=6"]
    rc, _, err = invoke("sweep", "recall", "--out", str(out), "--grid", "attn_weight_decay=0,0.5", "--set", "steps=4",
                         *base, "--workers", "1", "--quiet")
    assert rc == 0, err
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == ["attn_weight_decay-0.5__seed-0", "attn_weight_decay-0__seed-0"]
    snap = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    for steps, want in (("2", "cannot be shortened"), ("6", "pass --extend")):
        rc, _, err = invoke("sweep", "recall", "--out", str(out), "--grid", "attn_weight_decay=0,0.5",
                             "--set", f"steps={steps}", *base, "--workers", "1", "--quiet")
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and f"4 steps, not {steps}" in lines[0] and want in lines[0], err
    rc, _, err = invoke("sweep", "recall", "--out", str(out), "--grid", "attn_weight_decay=0,0.5", "--set", "steps=4",
                         *base, "--set", "lr=0.002", "--workers", "1", "--quiet")
    assert rc == 2 and "lr 0.003 -> 0.002" in err
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()} == snap
    assert json.loads((out / "sweep.json").read_text())["base"]["steps"] == 4
    # --extend: every run continues from its step-4 checkpoint; a new seed is a new run
    rc, o, err = invoke("sweep", "recall", "--out", str(out), "--grid", "attn_weight_decay=0.5", "--set", "steps=6",
                         *base, "--seeds", "1", "--extend", "--workers", "1", "--json")
    assert rc == 0, err
    assert json.loads(o)["counts"] == {"runs": 4, "ok": 4, "failed": 0, "skipped": 0}
    spec = json.loads((out / "sweep.json").read_text())
    assert spec["base"]["steps"] == 6 and spec["grid"] == {"attn_weight_decay": [0, 0.5]} and spec["seeds"] == [0, 1]
    for run in (out / "runs").iterdir():
        assert json.loads((run / "summary.json").read_text())["steps"] == 6
    rec = json.loads((out / "results" / "attn_weight_decay-0__seed-0.json").read_text())
    assert rec["resumed_from"] == 4


def test_a_sweep_with_failed_runs_exits_3_and_says_how_many(tmp_path):
    rc, _, err = invoke("sweep", "recall", "--out", str(tmp_path / "f"), "--grid", "attn_weight_decay=0,400",
                         "--set", "steps=2", "--set", "d_model=16", "--set", "n_heads=2", "--set", "batch_size=8",
                         "--workers", "1", "--quiet")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 3 and len(lines) == 1 and lines[0].startswith("error: 1 of 2 runs failed"), err


def test_runs_of_an_earlier_version_are_renamed_not_redone(tmp_path):
    spec = SweepSpec(kind="recall", base=dict(TINY, steps=2), grid={"attn_weight_decay": [0.5]}, seeds=[0])
    run_sweep(spec, tmp_path / "l", workers=1)
    new = tmp_path / "l" / "runs" / "attn_weight_decay-0.5__seed-0"
    os.rename(new, tmp_path / "l" / "runs" / "attn_weight_decay=0.5,seed=0")
    res = run_sweep(spec, tmp_path / "l", workers=1)
    assert res.counts["skipped"] == 1 and new.is_dir()
