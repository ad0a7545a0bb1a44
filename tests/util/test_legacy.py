"""Outputs written by attnrank, before the rename, still open.

``tests/fixtures/attnrank_outputs`` was written by the last attnrank commit (fc136ad): a recall run
with two checkpoints (config.json ``kind: attnrank-run``, ``model_type: attnrank``, state.pt), its
``attnrank track`` series, a two-run sweep and ``attnrank reproduce fig1 --quick`` (claims.json,
data.json, run.json; the figures left out). Each is opened by today's command line, in a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headrank.util.legacy import upgrade

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "attnrank_outputs"


def _headrank(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "headrank", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture()
def old(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "old")
    return tmp_path / "old"


def test_the_fixture_is_attnrank_s():
    cfg = json.loads((FIXTURE / "run" / "config.json").read_text())
    assert cfg["kind"] == "attnrank-run" and cfg["model"]["model_type"] == "attnrank"
    assert json.loads((FIXTURE / "track" / "series.json").read_text())["architecture"]["model_type"] == "attnrank"


def test_upgrade_renames_only_the_package_s_names():
    old = {"kind": "attnrank-run", "model": {"model_type": "attnrank", "d_model": 16}, "note": "attnrank"}
    assert upgrade(old) == {"kind": "headrank-run", "model": {"model_type": "headrank", "d_model": 16},
                            "note": "attnrank"}
    assert old["kind"] == "attnrank-run"  # a copy: the stored dict is not changed
    same = {"model_type": "llama", "kind": "recall"}
    assert upgrade(same) is same and upgrade([1]) == [1]


@pytest.mark.slow
def test_an_old_run_is_measured_resumed_and_tracked(old):
    sp = _headrank("spectra", "run", "--out", "spectra", "-q", cwd=old)
    assert sp.returncode == 0, sp.stderr
    assert (old / "spectra" / "heads.csv").read_text().count("\n") == 1 + 2 * 2  # header, 2 heads x qk/ov
    res = _headrank("train", "recall", "--out", "run", "--resume", "--steps", "30", "-q", cwd=old)
    assert res.returncode == 0, res.stderr
    assert json.loads((old / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 30
    tr = _headrank("track", "run", "--out", "track-new", "-q", cwd=old)
    assert tr.returncode == 0, tr.stderr
    labels = {line.split(",")[0] for line in (old / "track-new" / "table.csv").read_text().splitlines()[1:]}
    assert {"step-00000010", "step-00000020", "step-00000030"} <= labels
    # the old series' architecture is today's architecture of the same run
    new_arch = json.loads((old / "track-new" / "series.json").read_text())["architecture"]
    assert upgrade(json.loads((old / "track" / "series.json").read_text()))["architecture"] == new_arch


@pytest.mark.slow
def test_an_old_sweep_and_reproduction_open(old):
    metrics = {p: p.read_bytes() for p in (old / "sweep" / "runs").rglob("metrics.jsonl")}
    sw = _headrank("sweep", "recall", "--out", "sweep", "--grid", "attn_weight_decay=0,0.1", "--set", "steps=10",
                   "--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "batch_size=4",
                   "--seeds", "0", "-q", cwd=old)
    assert sw.returncode == 0, sw.stderr  # every run already done: nothing retrained, nothing failed
    assert all(json.loads(p.read_text())["status"] == "ok" for p in (old / "sweep" / "results").glob("*.json"))
    assert {p: p.read_bytes() for p in (old / "sweep" / "runs").rglob("metrics.jsonl")} == metrics
    rp = _headrank("reproduce", "fig1", "--replot", "--out", "repro", "-q", cwd=old)
    assert rp.returncode == 0, rp.stderr
    notes = " ".join(json.loads((old / "repro" / "run.json").read_text())["notes"])
    assert "fig1.local_minima): not measured" in notes and "seeds [0, 1, 2]" not in notes
    assert (old / "repro" / "fig1.png").is_file() and (old / "repro" / "report.html").is_file()


@pytest.mark.slow
def test_a_truncated_old_run_is_one_line(old):
    cfg = old / "run" / "config.json"
    cfg.write_text(cfg.read_text()[:100])
    before = {p: p.read_bytes() for p in (old / "run").rglob("*") if p.is_file()}
    res = _headrank("train", "recall", "--out", "run", "--resume", "--steps", "30", "-q", cwd=old)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "run/config.json" in res.stderr and "Traceback" not in res.stderr
    assert {p: p.read_bytes() for p in (old / "run").rglob("*") if p.is_file()} == before  # nothing lost


@pytest.mark.slow
def test_a_corrupt_old_checkpoint_is_one_line(old):
    st = old / "run" / "checkpoints" / "step-00000020" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:200])
    res = _headrank("spectra", "run", "--out", "sp", "-q", cwd=old)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (old / "sp").exists()


def test_a_collapse_run_of_headrank_0_1_replots(tmp_path):
    """``tests/fixtures/collapse_86fd8c9``: `reproduce collapse --quick` written by 86fd8c9, before
    the exact residuals (its depth curves hold only the float64 forward's ``geo_mean``). Today's
    replot re-judges and redraws it (it died on KeyError 'log10_rel_mean'); the claims that need
    the new data are inconclusive, each saying why."""
    shutil.copytree(FIXTURE.parent / "collapse_86fd8c9", tmp_path / "old collapse")
    r = _headrank("reproduce", "collapse", "--replot", "--out", "old collapse", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    claims = {c["name"]: c for c in json.loads((tmp_path / "old collapse" / "claims.json").read_text())}
    assert claims["collapse.heads_modulate"]["verdict"] == "inconclusive"
    assert "older run" in claims["collapse.heads_modulate"]["reason"]
    assert (tmp_path / "old collapse" / "depth_sweep.png").stat().st_size > 0
    notes = " ".join(json.loads((tmp_path / "old collapse" / "run.json").read_text())["notes"])
    assert "written by an older headrank" in notes and "measured to depth" not in notes  # no experiment it never did
