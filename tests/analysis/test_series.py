"""Rank over training (`headrank track`): a run directory's checkpoints, a list of checkpoint
directories and Hub revisions in the local cache give the tracker's own numbers; resumable;
local pool and a local Ray started here agree; mixed architectures and missing revisions are
one line, exit 2."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from headrank.analysis.series import resolve_series, track
from headrank.analysis.tracker import tracker_table
from headrank.core.linalg import METRIC_COLUMNS
from headrank.errors import HeadRankError
from headrank.io.rundir import read_metrics
from tests.helpers import track_stopped_after_first

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    d = tmp_path_factory.mktemp("series") / "run"
    train(d, recall_config(steps=12, track_every=2, checkpoint_every=4, keep_checkpoints=10, lr=1e-2,
                           attn_weight_decay=0.5, **TINY), device="cpu", tensorboard=False, threads=1)
    return d


def same_as_tracker(table: pd.DataFrame, run, steps=(4, 8, 12)) -> None:
    """The rows of every checkpoint equal the live tracker's rows at that step (metrics.jsonl)."""
    live = tracker_table(read_metrics(run))
    key = ["step", "layer", "head", "product"]
    if "origin" in table:
        table = table[table["origin"] == "checkpoint"]
    m = table.merge(live, on=key, suffixes=("", "_live"))
    assert len(m) == len(table) > 0 and sorted(table["step"].unique()) == list(steps)
    assert (m["rank"] == m["rank_live"]).all()
    for c in METRIC_COLUMNS:
        np.testing.assert_allclose(m[c], m[f"{c}_live"], rtol=1e-12, atol=1e-15, err_msg=c)


@pytest.mark.slow
def test_run_directory_equals_the_tracker_and_resumes(run, tmp_path):
    out = tmp_path / "t"
    res = track(run, out, workers=2)
    same_as_tracker(res.table, run)
    assert res.computed and not res.skipped
    assert list(res.table.columns[:6]) == ["checkpoint", "step", "layer", "head", "kv_head", "product"]
    ck = res.table[res.table["origin"] == "checkpoint"]
    assert len(ck) == 3 * 2 * 2 * 2  # checkpoints x layers x heads x products
    # the steps without a checkpoint come from metrics.jsonl's tracker rows, in the same columns
    tr = res.table[res.table["origin"] == "metrics.jsonl"]
    assert sorted(tr["step"].unique()) == [0, 2, 6, 10] and len(tr) == 4 * 2 * 2 * 2
    assert tr[list(METRIC_COLUMNS)].notna().all().all() and (tr["head_dim"] == 8).all()
    s = res.summary()
    assert len(s) == 7 * 2 * 2 and {"rank", "effective_rank", "gap_rel", "balance_rel"} <= set(s.columns)
    assert (out / "over_training.png").stat().st_size > 10_000
    # resumable: a finished checkpoint is not redone, a missing one is
    first = (out / "table.csv").read_bytes()
    os.remove(out / "checkpoints" / "step-00000008.csv")
    mtime = (out / "checkpoints" / "step-00000004.csv").stat().st_mtime_ns
    res2 = track(run, out, workers=1, plots=False)
    assert res2.computed == ["step-00000008"] and res2.skipped == ["step-00000004", "step-00000012"]
    assert (out / "checkpoints" / "step-00000004.csv").stat().st_mtime_ns == mtime
    assert (out / "table.csv").read_bytes() == first
    with pytest.raises(HeadRankError, match="other settings"):
        track(run, out, tol=1e-2)


def lay_out_cache(cache, repo_id, src, commit, ref):
    root = cache / ("models--" + repo_id.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    shutil.copytree(src, root / "snapshots" / commit)


def test_checkpoint_list_and_hub_revisions(run, tmp_path, monkeypatch):
    ckpts = sorted((run / "checkpoints").iterdir())
    items = resolve_series([str(c) for c in ckpts])
    assert [it.step for it in items] == [4, 8, 12]
    cache = tmp_path / "hub"
    for i, c in enumerate(ckpts):
        lay_out_cache(cache, "org/tiny", c, f"{i:040x}", f"step{4 * (i + 1)}")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    res = track("org/tiny", tmp_path / "h", revisions="step12,step4,step8", workers=1, plots=False)
    assert set(res.table["origin"]) == {"checkpoint"}
    same_as_tracker(res.table, run)
    assert sorted(res.table["checkpoint"].unique()) == ["step12", "step4", "step8"]
    with pytest.raises(HeadRankError):
        track("org/tiny", tmp_path / "h2", revisions="step4,step999", workers=1)
    assert not (tmp_path / "h2").exists()  # refused before any work


@pytest.mark.slow
def test_bad_series_one_line_exit_2(run, tmp_path):
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    other = tmp_path / "other"
    train(other, recall_config(steps=2, checkpoint_every=2, **dict(TINY, d_model=32)), device="cpu",
          tensorboard=False)
    mixed = [str(sorted((run / "checkpoints").iterdir())[0]), str(sorted((other / "checkpoints").iterdir())[0])]
    with pytest.raises(HeadRankError, match="mixed architectures.*d_model 32 vs 16"):
        track(mixed, tmp_path / "m")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty"))
    for args in (["track", *mixed, "--out", str(tmp_path / "m2")],
                 ["track", "org/none", "--revisions", "step1,step2", "--out", str(tmp_path / "m3")],
                 ["track", str(tmp_path / "nothing"), "--out", str(tmp_path / "m4")],
                 ["track", str(run), "--out", str(tmp_path / "m5"), "--tol", "2"]):
        p = subprocess.run([sys.executable, "-m", "headrank", *args, "--quiet"], capture_output=True, text=True,
                           env=env, timeout=120)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and "error" in lines[0], (args, p.stderr)


@pytest.mark.slow
def test_cli_track_json(run, tmp_path):
    p = subprocess.run([sys.executable, "-m", "headrank", "track", str(run), "--out", str(tmp_path / "c"),
                        "--workers", "1", "--json"], capture_output=True, text=True,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=120)
    assert p.returncode == 0, p.stderr
    payload = json.loads(p.stdout)
    assert [c["step"] for c in payload["checkpoints"] if c["product"] == "qk"] == [0, 2, 4, 6, 8, 10, 12]
    assert payload["architecture"]["n_layers"] == 2 and (tmp_path / "c" / "over_training.png").exists()


@pytest.mark.slow
def test_ray_tasks_on_a_local_ray_equal_the_pool(run, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        res = track(run, tmp_path / "r", ray="auto", plots=False)
    finally:
        ray.shutdown()
    same_as_tracker(res.table, run)
    pool = track(run, tmp_path / "p", workers=1, plots=False)
    pd.testing.assert_frame_equal(res.table, pool.table)


def other_run(tmp_path, seed=1):
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    d = tmp_path / f"run{seed}"
    train(d, recall_config(steps=8, track_every=4, checkpoint_every=4, keep_checkpoints=10, lr=1e-2, seed=seed,
                           **TINY), device="cpu", tensorboard=False, threads=1)
    return d


def test_out_of_other_checkpoints_refused_unless_force(run, tmp_path):
    """`track runB --out O` after `track runA --out O`: the step labels match, the checkpoints do
    not; refused (O untouched) unless --force, which measures runB's checkpoints anew."""
    out = tmp_path / "o"
    track(run, out, workers=1, plots=False)
    before = {f: (out / f).read_bytes() for f in ("table.csv", "summary.csv", "series.json")}
    b = other_run(tmp_path)
    with pytest.raises(HeadRankError, match="other checkpoints.*`force`"):
        track(b, out, workers=1, plots=False)
    assert {f: (out / f).read_bytes() for f in before} == before
    res = track(b, out, workers=1, plots=False, force=True)
    assert res.computed == ["step-00000004", "step-00000008"]  # runA's tables of the same labels not reused
    live = tracker_table(read_metrics(b))
    m = res.table.merge(live, on=["step", "layer", "head", "product"], suffixes=("", "_b"))
    assert len(m) == len(res.table) and sorted(m["step"].unique()) == [0, 4, 8]
    np.testing.assert_allclose(m["effective_rank"], m["effective_rank_b"], rtol=1e-12)
    # the same run retrained in place is other checkpoints too (sizes / times of its files)
    os.utime(b / "checkpoints" / "step-00000004" / "model.safetensors", ns=(1, 1))
    with pytest.raises(HeadRankError, match="other checkpoints"):
        track(b, out, workers=1, plots=False)


def test_outputs_move_in_as_a_set(run, tmp_path):
    """A directory in the way of one output (here: over_training.png) refuses the set before any
    file moves: table.csv, summary.csv and series.json stay the previous run's."""
    out = tmp_path / "s"
    first = resolve_series(run)[:2]
    track([it.source for it in first], out, workers=1, plots=False)
    before = {f: (out / f).read_bytes() for f in ("table.csv", "summary.csv", "series.json")}
    (out / "over_training.png").mkdir()
    (out / "over_training.png" / "keep.txt").write_text("mine")
    with pytest.raises(HeadRankError, match="directory of that name is in the way"):
        track([it.source for it in resolve_series(run)], out, workers=1)
    assert {f: (out / f).read_bytes() for f in before} == before
    assert (out / "over_training.png" / "keep.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(".") and p.name != ".headrank-output.json"]  # no staging left behind


def test_revisions_without_a_step_are_refused_or_read(run, tmp_path, monkeypatch):
    """`--revisions main,v1.0` does not make both step 0: a step is parsed from a revision's name,
    else read from its snapshot's trainer_state.json, else refused with one line."""
    from headrank.analysis.series import revision_step

    ckpts = sorted((run / "checkpoints").iterdir())
    cache = tmp_path / "hub"
    lay_out_cache(cache, "org/tiny", ckpts[0], "a" * 40, "main")
    lay_out_cache(cache, "org/tiny", ckpts[1], "b" * 40, "v1.0")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert [revision_step("org/x", r) for r in ("step1000", "checkpoint-500", "global_step20", "70")] == \
        [1000, 500, 20, 70]
    with pytest.raises(HeadRankError, match="cannot tell the training step of revision 'main'"):
        track("org/tiny", tmp_path / "r", revisions="main,v1.0", workers=1, plots=False)
    assert not (tmp_path / "r").exists()
    for commit, step in (("a" * 40, 4), ("b" * 40, 8)):
        snap = cache / "models--org--tiny" / "snapshots" / commit
        (snap / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    res = track("org/tiny", tmp_path / "r", revisions="main,v1.0", workers=1, plots=False)
    assert sorted(res.table["step"].unique()) == [4, 8]
    same_as_tracker(res.table, run, steps=(4, 8))


def test_figure_drops_flat_panels_and_names_the_model(run, tmp_path):
    from headrank.analysis.series import _title
    from headrank.analysis.series_plots import moving_panels

    res = track(run, tmp_path / "f", workers=1, plots=False)
    s = res.summary()
    flat = s.assign(rank=16.0)
    assert [c for c, _ in moving_panels(flat)][:1] == ["effective_rank"]
    assert "rank" not in [c for c, _ in moving_panels(flat)]
    assert "rank" in [c for c, _ in moving_panels(s.assign(rank=s["step"]))]
    title = _title(resolve_series(run), res.architecture)
    assert title.startswith("run: ") and str(run.parent) not in title


def test_a_stopped_series_keeps_its_rows_and_resumes(run, tmp_path, monkeypatch):
    """A run stopped after its first checkpoint keeps that checkpoint's rows (table.partial.csv);
    a plain re-run is refused, ``resume`` continues it from another working directory (relative
    path) without redoing the finished one, and gives the table of an uninterrupted run; a
    finished checkpoint changed since is refused."""
    src = tmp_path / "my run"
    shutil.copytree(run, src)
    out = tmp_path / "t"

    track_stopped_after_first(src, out)
    assert set(pd.read_csv(out / "table.partial.csv")["checkpoint"]) == {"step-00000004"}
    assert not (out / "table.csv").exists()
    with pytest.raises(HeadRankError, match="stopped before it finished .* pass `resume`"):
        track(src, out, workers=1, plots=False)
    with pytest.raises(HeadRankError, match=r"other settings \(`metrics`"):
        track(src, out, workers=1, plots=False, metrics=False, resume=True)
    first = src / "checkpoints" / "step-00000004" / "model.safetensors"
    st = first.stat()
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten since it was measured
    with pytest.raises(HeadRankError, match="checkpoint step-00000004 .* changed since the run started"):
        track(src, out, workers=1, plots=False, resume=True)
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))
    plan = (out / "started.json").read_text()
    for items in ([{"label": 1}], [3], [{"label": "x", "source": "s", "kind": "run", "bogus": 1}]):
        (out / "started.json").write_text(json.dumps({**json.loads(plan), "items": items}))
        with pytest.raises(HeadRankError, match="is not a track run's record"):  # hand-edited: one line
            track(src, out, workers=1, plots=False, resume=True)
    (out / "started.json").write_text(plan)
    stamp = (out / "checkpoints" / "step-00000004.csv").stat().st_mtime_ns
    monkeypatch.chdir(tmp_path / "t")
    res = track(os.path.join("..", "my run"), ".", workers=1, plots=False, resume=True)
    assert res.computed == ["step-00000008", "step-00000012"] and res.skipped == ["step-00000004"]
    assert (out / "checkpoints" / "step-00000004.csv").stat().st_mtime_ns == stamp
    assert not (out / "table.partial.csv").exists()
    whole = track(src, tmp_path / "whole", workers=1, plots=False)
    pd.testing.assert_frame_equal(pd.read_csv(out / "table.csv"), pd.read_csv(whole.out / "table.csv"),
                                  check_exact=True)
    same_as_tracker(res.table, src)
