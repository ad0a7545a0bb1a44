"""Language-model and ViT runs through the shared loop: evaluation, resume, tracker, bad input."""

import json
import math
import shutil

import numpy as np
import pytest

from headrank import analyze
from headrank.analysis.tracker import tracker_table
from headrank.errors import HeadRankError
from headrank.io.rundir import read_metrics
from headrank.training.config import lm_config, vit_config
from headrank.training.loop import train

from .test_loop import assert_tables_equal, run_cli

LM_TINY = dict(max_chars=20000, seq_len=16, batch_size=8, n_layers=2, d_model=16, n_heads=2, eval_tokens=512)


def test_lm_learns_bytes_and_reports_val_test_perplexity(tmp_path):
    cfg = lm_config(steps=60, track_every=30, checkpoint_every=60, eval_every=30, lr=1e-2, **LM_TINY)
    res = train(tmp_path / "lm", cfg, device="cpu", tensorboard=False, threads=1)
    rows = read_metrics(tmp_path / "lm")
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [30, 60] and "test_loss" in evals[-1] and "test_loss" not in evals[0]
    f = res.final
    assert f["val_ppl"] == pytest.approx(math.exp(f["val_loss"]))
    assert f["test_ppl"] == pytest.approx(math.exp(f["test_loss"]))
    # better than a uniform guess over 256 bytes (log 256 = 5.55 nats) after 60 steps
    assert f["val_loss"] < math.log(256) - 1.0
    summary = json.loads((tmp_path / "lm" / "summary.json").read_text())
    assert summary["data"]["tokenizer"] == "byte" and summary["world_size"] == 1
    conf = json.loads((tmp_path / "lm" / "config.json").read_text())
    assert conf["task_name"] == "lm" and conf["task"]["seq_len"] == 16 and conf["beta2"] == 0.95


def test_lm_bpe_resume_equals_uninterrupted(tmp_path):
    base = dict(steps=20, track_every=5, checkpoint_every=7, log_every=3, eval_every=10, tokenizer="bpe",
                bpe_vocab=300, **LM_TINY)
    train(tmp_path / "full", lm_config(**base), device="cpu", tensorboard=False, threads=1)
    train(tmp_path / "cut", lm_config(**base), device="cpu", tensorboard=False, threads=1)
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step-00000020")
    with open(tmp_path / "cut" / "metrics.jsonl", "ab") as fh:
        fh.write(b'{"step": 99, "torn')
    res = train(tmp_path / "cut", lm_config(**base), device="cpu", resume=True, tensorboard=False, threads=1)
    assert res.resumed_from == 14
    assert (tmp_path / "cut" / "metrics.jsonl").read_bytes() == (tmp_path / "full" / "metrics.jsonl").read_bytes()
    assert (tmp_path / "cut" / "tokenizer.json").read_bytes() == (tmp_path / "full" / "tokenizer.json").read_bytes()


def test_vit_on_digits_tracker_equals_spectra_and_accuracy_is_reported(tmp_path):
    cfg = vit_config(steps=100, track_every=50, checkpoint_every=50, keep_checkpoints=3, n_layers=2, d_model=32,
                     n_heads=2, lr=3e-3, warmup=10)
    res = train(tmp_path / "v", cfg, device="cpu", tensorboard=False, threads=1)
    table = tracker_table(read_metrics(tmp_path / "v"))
    for step in (50, 100):
        disk = analyze(tmp_path / "v" / "checkpoints" / f"step-{step:08d}").table
        assert_tables_equal(table[table["step"] == step].drop(columns="step"), disk)
    f = res.final
    assert 0 <= f["test_acc"] <= 1 and 0 <= f["val_acc"] <= 1
    assert f["val_acc"] > 0.3  # chance is 0.1
    assert np.isfinite(f["test_loss"])


def test_config_errors():
    with pytest.raises(HeadRankError, match="unknown training option"):
        lm_config(banana=1)
    with pytest.raises(HeadRankError, match="causal"):
        lm_config(max_chars=1000).__class__(model={**lm_config(max_chars=1000).model.to_dict(), "causal": False})
    with pytest.raises(HeadRankError, match="do not apply to a ViT"):
        vit_config(tie_embeddings=True)


@pytest.mark.slow
def test_cli_lm_vit_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "tiny.jsonl").write_text('{"text": "one document only"}\n')
    (tmp_path / "f.txt").write_text("x")
    cases = [
        ["lm", "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "a")],
        ["lm", "--corpus", str(tmp_path / "empty"), "--out", str(tmp_path / "b")],
        ["lm", "--corpus", str(tmp_path / "tiny.jsonl"), "--out", str(tmp_path / "c")],
        ["lm", "--seq-len", "1", "--out", str(tmp_path / "d")],
        ["lm", "--tokenizer", "words", "--out", str(tmp_path / "e")],
        ["lm", "--batch-size", "0", "--out", str(tmp_path / "f")],
        ["vit", "--images", str(tmp_path / "f.txt"), "--out", str(tmp_path / "g")],
        ["vit", "--images", str(tmp_path / "empty"), "--out", str(tmp_path / "h")],
        ["vit", "--patch-size", "3", "--out", str(tmp_path / "i")],
    ]
    for args in cases:
        rc, _, err = run_cli("train", *args, "--quiet", "--max-chars", "2000") if args[0] == "lm" and \
            "--corpus" not in args else run_cli("train", *args, "--quiet")
        assert rc == 2, (args, err)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, (args, err)
