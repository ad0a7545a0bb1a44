"""Ranks in the user's stack, with the real packages: a Hugging Face Trainer run with
RankCallback reporting to TensorBoard, W&B (offline) and MLflow (file store) at once, and
`headrank train --log wandb,mlflow`; the values read back equal the JSONL rows. Bad --log input."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from headrank.analysis.tracker import scalars
from headrank.errors import HeadRankError
from headrank.io.rundir import read_metrics
from headrank.training.config import recall_config
from headrank.training.integrations import RANKS_FILE, parse_log, row_scalars
from headrank.training.loop import train

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)


def wandb_rows(run_dir, key, wait_s=60.0):
    """The history rows of an offline W&B run that hold ``key``. W&B's service process writes the
    .wandb file after ``wandb.finish()`` returns; on a loaded machine that can lag, so the file is
    re-read (every 0.5 s, up to ``wait_s``) until rows with the key appear. An empty list after
    that fails the caller's comparison as before."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        rows = [h for h in wandb_history(run_dir) if key in h]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def wandb_history(run_dir):
    """History rows of an offline W&B run, read from its .wandb file (LevelDB log records of
    wandb's Record protobuf)."""
    from wandb.proto import wandb_internal_pb2 as pb

    files = [f for f in glob.glob(os.path.join(str(run_dir), "**", "run-*.wandb"), recursive=True)
             if "latest-run" not in f]
    assert len(files) == 1, files
    data = open(files[0], "rb").read()
    pos, block, buf, out = 7, 32768, b"", []  # 7: W&B header
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return out


def mlflow_history(uri, key):
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    return {m.step: m.value for m in c.get_metric_history(run.info.run_id, key)}, run


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "wandb").mkdir()


def tiny_gpt2_run(tmp_path):
    """A 2-layer GPT-2 (seeded), 16 random token windows and 4 Trainer steps that report to
    TensorBoard, W&B and MLflow, writing into ``tmp_path / "out"``."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2,
                                             bos_token_id=0, eos_token_id=0))
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 32, (16, 8), generator=g)]
    args = tf.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=4,
                                learning_rate=1e-2, logging_steps=100, save_strategy="no", use_cpu=True,
                                report_to=["tensorboard", "wandb", "mlflow"], disable_tqdm=True)
    return model, data, args


@pytest.mark.slow
def test_trainer_run_logs_ranks_to_tensorboard_wandb_and_mlflow(tmp_path, offline, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    import transformers as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from headrank import RankCallback

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    model, data, args = tiny_gpt2_run(tmp_path)
    trainer = tf.Trainer(model=model, args=args, train_dataset=data)
    cb = RankCallback(trainer, every=2)
    trainer.add_callback(cb)
    trainer.train()
    import wandb

    wandb.finish()  # the Trainer leaves its W&B run open; finishing it flushes the offline file

    rows = [json.loads(ln) for ln in (tmp_path / "out" / RANKS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4] and rows == cb.rows
    want = {r["step"]: scalars(r) for r in rows}
    assert want[0] != want[4]  # the weights moved
    key = "rank/layer_1/ov/effective_rank"
    # TensorBoard (the Trainer's own writer: its tags get "train/")
    acc = EventAccumulator(glob.glob(str(tmp_path / "tb" / "**" / "events.*"), recursive=True)[0])
    acc.Reload()
    for k in (key, "rank/qk/rank", "rank/qk/gap_rel", "rank/ov/balance_rel"):
        got = {e.step: e.value for e in acc.Scalars(f"train/{k}")}
        assert got == {s: pytest.approx(v[k], rel=1e-6) for s, v in want.items()}, k
    # W&B offline
    hist = wandb_rows(tmp_path / "wandb", f"train/{key}")
    assert {h["train/global_step"]: h[f"train/{key}"] for h in hist} == \
        {s: pytest.approx(v[key], rel=1e-12) for s, v in want.items()}
    # MLflow file store (the Trainer's MLflow callback logs the keys as they are, asynchronously)
    import mlflow

    mlflow.flush_async_logging()
    got, _ = mlflow_history(uri, key)
    assert got == {s: pytest.approx(v[key], rel=1e-12) for s, v in want.items()}
    # and the Trainer's own history
    assert [h["step"] for h in trainer.state.log_history if key in h] == [0, 2, 4]


@pytest.mark.slow
def test_callback_passed_the_hugging_face_way_logs_to_every_integration(tmp_path, offline, monkeypatch):
    """`Trainer(..., callbacks=[RankCallback(every=2)])`, built without the trainer: the model
    comes with the callback arguments, and the ranks reach TensorBoard (the Trainer's own log
    directory, read back with tensorboard's EventAccumulator), W&B offline and the MLflow file store."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    import transformers as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from headrank import RankCallback

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    model, data, args = tiny_gpt2_run(tmp_path)
    cb = RankCallback(every=2)
    tf.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    import mlflow
    import wandb

    wandb_run_dir = os.path.dirname(wandb.run.dir)  # wandb keeps its first WANDB_DIR for the process
    wandb.finish()
    mlflow.flush_async_logging()
    assert cb.reached == {"tensorboard", "wandb", "mlflow"}
    want = {r["step"]: scalars(r) for r in cb.rows}
    assert sorted(want) == [0, 2, 4] and want[0] != want[4]
    key = "rank/layer_1/ov/effective_rank"
    (logdir,) = {os.path.dirname(f) for f in glob.glob(str(tmp_path / "out" / "runs" / "**" / "events.*"),
                                                         recursive=True)}  # one run: the Trainer's directory
    acc = EventAccumulator(logdir)
    acc.Reload()
    for k in (key, "rank/qk/effective_rank", "rank/ov/gap_rel"):
        got = {e.step: e.value for e in acc.Scalars(f"train/{k}")}
        assert got == {s: pytest.approx(v[k], rel=1e-6) for s, v in want.items()}, k
    hist = wandb_rows(wandb_run_dir, f"train/{key}")
    assert {h["train/global_step"]: h[f"train/{key}"] for h in hist} == \
        {s: pytest.approx(v[key], rel=1e-12) for s, v in want.items()}
    got, _ = mlflow_history(uri, key)
    assert got == {s: pytest.approx(v[key], rel=1e-12) for s, v in want.items()}


def test_train_log_wandb_and_mlflow_receive_every_row(tmp_path, offline):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    run = tmp_path / "run"
    train(run, recall_config(steps=6, track_every=3, log_every=2, **TINY), device="cpu", log="wandb,mlflow",
          threads=1)
    rows = read_metrics(run)
    assert not (run / "tb").exists()  # --log names the backends: no TensorBoard unless asked
    hist = wandb_history(run / "wandb")
    assert [h["_step"] for h in hist] == [r["step"] for r in rows]
    for h, r in zip(hist, rows, strict=True):
        assert {k: h[k] for k in row_scalars(r)} == pytest.approx(row_scalars(r), rel=1e-12)
    loss, mrun = mlflow_history((run / "mlruns").resolve().as_uri(), "train/loss")
    assert loss == {r["step"]: pytest.approx(r["loss"], rel=1e-12) for r in rows if "loss" in r}
    rank, _ = mlflow_history((run / "mlruns").resolve().as_uri(), "rank/layer_0/qk/effective_rank")
    assert sorted(rank) == [0, 3, 6]
    assert mrun.data.params["attn_weight_decay"] == "0.1" and mrun.info.status == "FINISHED"
    ids = json.loads((run / "loggers.json").read_text())
    assert set(ids) == {"wandb", "mlflow"} and ids["mlflow"] == mrun.info.run_id


@pytest.mark.slow
def test_bad_log_input_one_line_exit_2(tmp_path, monkeypatch):
    assert parse_log(None) is None and parse_log("none") == () and parse_log("wandb, tensorboard") == \
        ("wandb", "tensorboard")
    for bad in ("neptune", "tensorboard,neptune", ",", "none,wandb"):
        with pytest.raises(HeadRankError, match="unknown backend"):
            parse_log(bad)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed: find_spec gives None
    with pytest.raises(HeadRankError, match=r"pip install 'headrank\[mlflow\]'"):
        train(tmp_path / "x", recall_config(steps=2, **TINY), device="cpu", log="mlflow")
    assert not (tmp_path / "x").exists()  # refused before any work
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    hide = "import sys; sys.modules['wandb'] = None; from headrank.cli import main; sys.argv = ['headrank'] + sys.argv[1:]; main()"
    for args, word in ((["--log", "neptune"], "neptune"), (["--log", "tensorboard,wandb"], "headrank[wandb]")):
        p = subprocess.run([sys.executable, "-c", hide, "train", "recall", "--out", str(tmp_path / "y"), "--steps", "2",
                            "--quiet", *args], capture_output=True, text=True, env=env, timeout=120)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and word in lines[0], p.stderr
