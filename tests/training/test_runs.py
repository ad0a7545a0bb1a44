"""Runs that never lose or block work: a run that failed before its first step leaves nothing
behind, `--resume` reads the stored settings, `--keep-checkpoints N|all`, `train recall` takes the
model-size options of `train lm`."""

import json

import pytest

from headrank.errors import HeadRankError
from headrank.io.rundir import checkpoint_dirs
from headrank.training.config import lm_config, recall_config
from headrank.training.loop import resume_config, train
from headrank.training.state import parse_keep

TINY = dict(n_pairs=3, n_keys=6, n_values=6, d_model=16, n_heads=2, batch_size=8)


def run_cli(*args):
    """The CLI in this process (its error lines and exit codes are those of `headrank`)."""
    from typer.testing import CliRunner

    from headrank.cli import app

    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_failed_before_the_first_step_leaves_nothing_that_blocks(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00not utf-8\xff")
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"document {i}: the quick brown fox jumps over the lazy dog. " * 8})
                            + "\n" for i in range(60)))
    fresh, empty = tmp_path / "fresh", tmp_path / "empty"
    empty.mkdir()
    for out in (fresh, empty):
        with pytest.raises(HeadRankError, match="UTF-8"):
            train(out, lm_config(corpus=str(bad), steps=2), device="cpu", log="none")
    assert not fresh.exists()  # created by the failed run: removed
    assert empty.is_dir() and list(empty.iterdir()) == []  # the user's directory stays, emptied of the run
    res = train(empty, lm_config(corpus=str(good), steps=2, n_layers=1, d_model=16, n_heads=2), device="cpu",
                log="none")
    assert res.final["step"] == 2


def test_a_logger_that_cannot_start_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    from headrank.training import integrations

    def refuse(self, run, config):
        raise RuntimeError("No API key configured")

    monkeypatch.setattr(integrations._Wandb, "__init__", refuse)
    pytest.importorskip("wandb")
    with pytest.raises(HeadRankError, match=r"`log` wandb: the wandb logger could not start: RuntimeError"):
        train(tmp_path / "w", recall_config(steps=2, **TINY), device="cpu", log="wandb")
    assert not (tmp_path / "w").exists()


def test_resume_reads_the_stored_settings(tmp_path):
    out = tmp_path / "r"
    rc, _, err = run_cli("train", "recall", "--out", str(out), "--steps", "6", "--checkpoint-every", "3",
                         "--n-layers", "1", "--d-model", "32", "--n-heads", "2", "--log-every", "3",
                         "--attn-wd", "0.3", "--keep-checkpoints", "all", "--log", "none", "--device", "cpu", "-q")
    assert rc == 0, err
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model"]["n_layers"], cfg["model"]["d_model"], cfg["model"]["n_heads"], cfg["log_every"]) == (1, 32, 2, 3)
    # nothing repeated: the stored settings; a larger --steps extends, and every checkpoint is kept
    rc, out_, err = run_cli("train", "recall", "--out", str(out), "--resume", "--steps", "9", "--log", "none",
                            "--device", "cpu", "--json")
    assert rc == 0, err
    assert json.loads(out_)["resumed_from"] == 6
    assert [s for s, _ in checkpoint_dirs(out)] == [3, 6, 9]
    # an option that matches is accepted; one that differs is refused, naming each difference
    rc, _, err = run_cli("train", "recall", "--out", str(out), "--resume", "--attn-wd", "0.3", "--log", "none",
                         "--device", "cpu", "-q")
    assert rc == 0, err
    rc, _, err = run_cli("train", "recall", "--out", str(out), "--resume", "--d-model", "64", "--wd", "0.2",
                         "--log", "none", "--device", "cpu", "-q")
    line = one_line(err)
    assert rc == 2 and "d_model 64 (stored: 32)" in line and "weight_decay 0.2 (stored: 0.1)" in line
    rc, _, err = run_cli("train", "lm", "--out", str(out), "--resume", "--log", "none", "-q")
    assert rc == 2 and "holds a 'recall' run" in one_line(err)
    assert json.loads((out / "config.json").read_text())["steps"] == 9


def test_resume_config_library(tmp_path):
    assert resume_config(tmp_path / "none", "recall", {}) is None  # a fresh run: built from the options
    train(tmp_path / "r", recall_config(steps=2, keep_checkpoints=1, **TINY), device="cpu", tensorboard=False)
    cfg = resume_config(tmp_path / "r", "recall", {"keep_checkpoints": 0, "steps": 4, "n_heads": 2})
    assert (cfg.steps, cfg.keep_checkpoints, cfg.model.d_model) == (4, 0, 16)
    with pytest.raises(HeadRankError, match="n_pairs 4 \\(stored: 3\\)"):
        resume_config(tmp_path / "r", "recall", {"n_pairs": 4})
    assert lm_config().keep_checkpoints == 2


def test_keep_checkpoints_parsing():
    assert [parse_keep(x) for x in ("all", "ALL", "3", None, 5)] == [0, 0, 3, None, 5]
    for bad in ("0", "-1", "two", "1.5", ""):
        with pytest.raises(HeadRankError, match="positive number or 'all'"):
            parse_keep(bad)
