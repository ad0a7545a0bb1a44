"""`--resume --steps N` extends a finished run when the schedule allows: 600 steps extended to 900
equal an uninterrupted 900-step run (metrics.jsonl and final weights byte for byte); a cosine run
cannot be extended (one line saying why)."""

import json

import pytest

from headrank.errors import HeadRankError
from headrank.io.rundir import latest_checkpoint
from headrank.training.config import recall_config
from headrank.training.loop import train

from .test_loop import run_cli

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8, warmup=50,
            track_every=100, log_every=50, checkpoint_every=300)


@pytest.mark.slow
def test_600_extended_to_900_equals_an_uninterrupted_900_step_run(tmp_path):
    ref = train(tmp_path / "ref", recall_config(steps=900, **TINY), device="cpu", tensorboard=False, threads=1)
    first = train(tmp_path / "ext", recall_config(steps=600, **TINY), device="cpu", tensorboard=False, threads=1)
    assert first.final["step"] == 600
    res = train(tmp_path / "ext", recall_config(steps=900, **TINY), device="cpu", resume=True, tensorboard=False,
                threads=1)
    assert res.resumed_from == 600 and res.final["step"] == 900
    assert (tmp_path / "ext" / "metrics.jsonl").read_bytes() == (tmp_path / "ref" / "metrics.jsonl").read_bytes()
    a, b = latest_checkpoint(tmp_path / "ext"), latest_checkpoint(tmp_path / "ref")
    assert a.name == b.name == "step-00000900"
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    cfg_ext = json.loads((tmp_path / "ext" / "config.json").read_text())
    cfg_ref = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert cfg_ext == cfg_ref and cfg_ext["steps"] == 900 and cfg_ext["threads"] == 1
    assert ref.final == res.final
    # shortening is still refused
    with pytest.raises(HeadRankError, match="steps"):
        train(tmp_path / "ext", recall_config(steps=800, **TINY), device="cpu", resume=True, tensorboard=False)


@pytest.mark.slow
def test_a_cosine_run_cannot_be_extended_one_line(tmp_path):
    out = tmp_path / "cos"
    train(out, recall_config(steps=20, schedule="cosine", **dict(TINY, warmup=5)), device="cpu",
          tensorboard=False)
    with pytest.raises(HeadRankError, match="cosine learning-rate schedule was declared for 20 steps"):
        train(out, recall_config(steps=30, schedule="cosine", **dict(TINY, warmup=5)), device="cpu",
              resume=True, tensorboard=False)
    assert json.loads((out / "config.json").read_text())["steps"] == 20  # left as it was


@pytest.mark.slow
def test_cli_resume_with_more_steps_extends(tmp_path):
    out = tmp_path / "r"
    args = ["train", "recall", "--out", str(out), "--track-every", "5", "--checkpoint-every", "5", "--device", "cpu"]
    rc, _, err = run_cli(*args, "--steps", "5", "--quiet")
    assert rc == 0, err
    rc, o, err = run_cli(*args, "--steps", "10", "--resume", "--json")
    assert rc == 0, err
    payload = json.loads(o)
    assert payload["resumed_from"] == 5 and payload["final"]["step"] == 10
