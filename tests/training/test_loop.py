"""Training runs: the live tracker equals `headrank spectra` on the saved checkpoint, runs
killed with SIGKILL and resumed end with the uninterrupted run's metrics.jsonl, bad input."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

from headrank import analyze
from headrank.analysis.tracker import RankTracker, tracker_table
from headrank.core.linalg import METRIC_COLUMNS
from headrank.errors import HeadRankError
from headrank.io.live import LiveCheckpoint
from headrank.io.rundir import latest_checkpoint, read_metrics
from headrank.training.config import recall_config
from headrank.training.distributed import resolve_device
from headrank.training.loop import train

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)


def cli(*args, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.Popen([sys.executable, "-m", "headrank", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)


def run_cli(*args, timeout=120):
    p = cli(*args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def assert_tables_equal(live: pd.DataFrame, disk: pd.DataFrame) -> None:
    key = ["layer", "head", "product"]
    m = live.merge(disk, on=key, suffixes=("_live", "_disk"))
    assert len(m) == len(live) == len(disk) > 0
    assert (m["rank_live"] == m["rank_disk"]).all()
    for c in METRIC_COLUMNS:
        np.testing.assert_allclose(m[f"{c}_live"], m[f"{c}_disk"], rtol=1e-12, atol=1e-15, err_msg=c)


@pytest.mark.slow
def test_tracker_rows_equal_spectra_on_the_saved_checkpoints(tmp_path):
    cfg = recall_config(steps=30, track_every=10, checkpoint_every=10, keep_checkpoints=5, lr=3e-3,
                        attn_weight_decay=0.5, **TINY)
    res = train(tmp_path / "run", cfg, device="cpu", tensorboard=False)
    rows = read_metrics(tmp_path / "run")
    table = tracker_table(rows)
    assert sorted(table["step"].unique()) == [0, 10, 20, 30]
    for step in (10, 20, 30):
        ckpt = tmp_path / "run" / "checkpoints" / f"step-{step:08d}"
        disk = analyze(ckpt).table
        live = table[table["step"] == step].drop(columns="step")
        assert_tables_equal(live, disk)
    # the means in the rows are the means of the per-head values
    last = rows[-1]
    assert last["step"] == 30 and {"loss", "acc", "lr", "mean", "heads"} <= set(last)
    assert last["mean"]["ov"]["rank"] == pytest.approx(np.mean(last["heads"]["ov"]["rank"]))
    assert res.checkpoint == latest_checkpoint(tmp_path / "run")
    # and the weights did move: step 30 differs from step 10
    t10, t30 = table[table["step"] == 10], table[table["step"] == 30]
    assert not np.allclose(t10["nuclear"].to_numpy(), t30["nuclear"].to_numpy())


@pytest.mark.parametrize("arch", ["bert", "vit"])
def test_tracker_on_a_live_hugging_face_model_equals_spectra_from_disk(arch, tmp_path):
    # A live transformers-5 ViT names its projections layers.{i}.attention.q_proj, while
    # save_pretrained writes the legacy encoder.layer.{i}.attention.attention.query names:
    # both must reach the same per-head numbers.
    import transformers as tf

    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    if arch == "bert":
        model = tf.BertModel(tf.BertConfig(**small, vocab_size=50))
    else:
        model = tf.ViTModel(tf.ViTConfig(**small, image_size=16, patch_size=4))
    got = RankTracker(model, every=1).measure()
    model.save_pretrained(tmp_path, safe_serialization=True)
    disk = analyze(tmp_path).table
    live = tracker_table([{"step": 0, **got}]).drop(columns="step")
    assert_tables_equal(live, disk)
    assert LiveCheckpoint(model).config["model_type"] == arch


def test_metrics_rows_layout(tmp_path):
    cfg = recall_config(steps=25, track_every=20, checkpoint_every=100, log_every=10, **TINY)
    train(tmp_path / "r", cfg, device="cpu", tensorboard=False)
    rows = read_metrics(tmp_path / "r")
    assert [r["step"] for r in rows] == [0, 10, 20, 25]
    assert "loss" not in rows[0] and "heads" in rows[0]
    assert "heads" not in rows[1] and "loss" in rows[1]
    assert {"loss", "heads"} <= set(rows[2]) and {"loss", "heads"} <= set(rows[3])
    assert np.asarray(rows[0]["heads"]["qk"]["rank"]).shape == (2, 2)  # layers x heads
    cfg_json = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg_json["model"]["model_type"] == "headrank" and cfg_json["attn_weight_decay"] == 0.1
    assert cfg_json["task"]["format"].startswith("k1 v1")
    # the final checkpoint is the one kept, and the run can be "resumed" as a no-op
    assert latest_checkpoint(tmp_path / "r").name == "step-00000025"
    before = (tmp_path / "r" / "metrics.jsonl").read_bytes()
    res = train(tmp_path / "r", cfg, device="cpu", resume=True, tensorboard=False)
    assert res.resumed_from == 25 and (tmp_path / "r" / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
def test_in_process_resume_equals_uninterrupted(tmp_path):
    """Stop after a checkpoint (a shorter run), then resume to the full length."""
    base = dict(track_every=5, checkpoint_every=7, log_every=3, **TINY)
    train(tmp_path / "full", recall_config(steps=20, **base), device="cpu", tensorboard=False)
    # a run whose newest checkpoint is at step 14, with rows after it, as a kill would leave it
    train(tmp_path / "cut", recall_config(steps=20, **base), device="cpu", tensorboard=False)
    ck = tmp_path / "cut" / "checkpoints"
    import shutil

    shutil.rmtree(ck / "step-00000020")
    with open(tmp_path / "cut" / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"step": 99, "torn')
    res = train(tmp_path / "cut", recall_config(steps=20, **base), device="cpu", resume=True, tensorboard=False)
    assert res.resumed_from == 14
    assert (tmp_path / "cut" / "metrics.jsonl").read_bytes() == (tmp_path / "full" / "metrics.jsonl").read_bytes()


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_identical_metrics(tmp_path):
    common = ["--steps", "120", "--track-every", "20", "--checkpoint-every", "25", "--lr", "3e-3",
              "--attn-wd", "0.3", "--seed", "7", "--device", "cpu", "--quiet"]
    ref = tmp_path / "ref"
    rc, _, err = run_cli("train", "recall", *common, "--out", str(ref))
    assert rc == 0, err
    expected = (ref / "metrics.jsonl").read_bytes()

    run = tmp_path / "killed"
    rng = random.Random(1234)
    metrics = run / "metrics.jsonl"
    kills, resumed_from_checkpoint = 0, 0
    # kill after the file has k rows (+ a random extra delay), for growing k; k=0: during start-up
    for k in (0, 2, 5, 8, 10, 12):
        args = ["train", "recall", *common, "--out", str(run)] + (["--resume"] if kills else [])
        had_ckpt = latest_checkpoint(run) is not None if run.exists() else False
        p = cli(*args)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            n = metrics.read_bytes().count(b"\n") if metrics.exists() else 0
            if n >= k:
                break
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.08))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
            resumed_from_checkpoint += had_ckpt
        p.communicate(timeout=30)
        if p.returncode == 0:
            break
    rc, out, err = run_cli("train", "recall", *common, "--out", str(run), "--resume", "--json")
    assert rc == 0, err
    assert kills >= 3, "the run finished before it could be killed often enough"
    assert resumed_from_checkpoint >= 1
    assert metrics.read_bytes() == expected
    assert json.loads(out)["final"]["step"] == 120


@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    cases = [
        ["--steps", "0", "--out", str(tmp_path / "a")],
        ["--attn-wd", "-1", "--out", str(tmp_path / "b")],
        ["--lr", "0", "--out", str(tmp_path / "c")],
        ["--out", str(afile)],
        ["--device", "cuda:7" if not torch.cuda.is_available() else "tpu", "--out", str(tmp_path / "d")],
        ["--device", "banana", "--out", str(tmp_path / "e")],
        ["--threads", "0", "--out", str(tmp_path / "f")],
    ]
    for args in cases:
        rc, _, err = run_cli("train", "recall", "--quiet", *args)
        assert rc == 2, (args, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "error" in lines[0], (args, err)
        assert "Traceback" not in err


@pytest.mark.slow
def test_cli_refuses_to_overwrite_or_resume_with_other_settings(tmp_path):
    out = tmp_path / "run"
    rc, o, err = run_cli("train", "recall", "--steps", "3", "--out", str(out), "--json", "--track-every", "3",
                         "--device", "cpu")
    assert rc == 0, err
    payload = json.loads(o)
    assert payload["final"]["step"] == 3 and "qk" in payload["final"]["mean"]
    rc, _, err = run_cli("train", "recall", "--steps", "3", "--out", str(out), "--quiet")
    assert rc == 2 and "--resume" in err
    rc, _, err = run_cli("train", "recall", "--steps", "3", "--attn-wd", "0.5", "--out", str(out), "--resume",
                         "--quiet")
    assert rc == 2 and "attn_weight_decay" in err


def test_library_validation_and_devices():
    with pytest.raises(HeadRankError):
        recall_config(steps=10, lr=2.0, weight_decay=0.6)  # lr * wd >= 1
    with pytest.raises(HeadRankError):
        recall_config(bogus=1)
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"


def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")  # in the dev extra: runs in CI
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tmp_path / "tb", recall_config(steps=4, track_every=2, **TINY), device="cpu")
    rows = [json.loads(line) for line in (tmp_path / "tb" / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(tmp_path / "tb" / "tb"))
    acc.Reload()
    for tag, has, get in (("train/loss", "loss", lambda r: r["loss"]),
                          ("ov/effective_rank", "mean", lambda r: r["mean"]["ov"]["effective_rank"]),
                          ("qk/rank", "mean", lambda r: r["mean"]["qk"]["rank"])):
        want = {r["step"]: get(r) for r in rows if has in r}
        events = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(events) == sorted(want) and want, tag
        for step, value in want.items():
            assert events[step] == pytest.approx(value, rel=1e-6), (tag, step)
    assert sorted({e.step for e in acc.Scalars("qk/rank")}) == [0, 2, 4]
