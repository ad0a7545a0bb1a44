"""`track` reading what a user or another process planted in `--out` or on a server (issue 46):
FIFOs in place of started.json and of a checkpoint's record do not hang, and 10,000 revisions
(on the command line or as the Hub's refs) are one line before one request per revision."""

from __future__ import annotations

import os
import shutil

import pytest

from headrank.analysis.series import track
from headrank.errors import HeadRankError
from tests.fuzz.harness import time_limit

from ..io.hubserver import HubServer
from .test_series import run  # noqa: F401 - the trained run fixture


@pytest.fixture
def alarm():
    with time_limit(60):
        yield


class Stop(Exception):
    pass


def _stopped(run, tmp_path):  # noqa: F811
    src = tmp_path / "src"
    shutil.copytree(run, src)

    def stop(done, total):
        if done == 1:
            raise Stop

    with pytest.raises(Stop):
        track(src, tmp_path / "t", workers=1, plots=False, progress=stop)
    return src, tmp_path / "t"


def test_a_fifo_as_started_json_is_one_line_on_resume(run, tmp_path, alarm):  # noqa: F811
    src, out = _stopped(run, tmp_path)
    (out / "started.json").unlink()
    os.mkfifo(out / "started.json")
    with pytest.raises(HeadRankError, match="not a regular file"):
        track(src, out, workers=1, plots=False, resume=True)


def test_a_fifo_as_a_checkpoints_record_is_measured_again_not_read(run, tmp_path, alarm):  # noqa: F811
    src, out = _stopped(run, tmp_path)
    rec = next((out / "checkpoints").glob("*.json"))
    rec.unlink()
    os.mkfifo(rec)
    res = track(src, out, workers=1, plots=False, resume=True)
    assert rec.stem in res.computed and not res.failed


def test_ten_thousand_revisions_on_the_command_line_are_one_line(tmp_path, alarm):
    revs = ",".join(f"step{i}" for i in range(10_000))
    with pytest.raises(HeadRankError, match="names 10,000 revisions, more than the 1,000"):
        track("org/model", tmp_path / "t", revisions=revs, remote=True)


def test_ten_thousand_step_refs_are_one_line_after_one_request(tmp_path, monkeypatch, alarm):
    import huggingface_hub.constants as hc

    from headrank.io import remote

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    (tmp_path / "m").mkdir()
    with HubServer(root=tmp_path) as s:
        for i in range(10_000):
            s.add("org/many", f"step{i}", tmp_path / "m")
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        with pytest.raises(HeadRankError, match="names 10,000 revisions"):
            track("org/many", tmp_path / "t", revisions="all", remote=True)
        assert len(s.log) <= 2  # the refs, nothing per revision


def test_a_checkpoint_replaced_by_rename_is_measured_again(run, tmp_path, alarm):  # noqa: F811
    """Same size, same modification time, another file (`cp -p` then `mv`): its table is not reused."""
    src = tmp_path / "src"
    shutil.copytree(run, src)
    out = tmp_path / "t"
    track(src, out, workers=1, plots=False)
    f = src / "checkpoints" / "step-00000004" / "model.safetensors"
    tmp = f.with_name("new.tmp")
    shutil.copy2(f, tmp)  # same bytes, size and times: only the inode differs
    os.replace(tmp, f)
    with pytest.raises(HeadRankError, match="was made from other checkpoints .* or changed since"):
        track(src, out, workers=1, plots=False)
    res = track(src, out, workers=1, plots=False, force=True)
    assert res.computed == ["step-00000004"] and res.skipped == ["step-00000008", "step-00000012"]


def test_a_checkpoint_changed_while_it_is_read_is_not_measured(run, tmp_path, monkeypatch, alarm):  # noqa: F811
    from headrank.analysis import scan, series

    src = tmp_path / "src"
    shutil.copytree(run, src)
    real = scan.analyze

    def analyze_then_rewrite(source, **kw):
        res = real(source, **kw)
        if str(source).endswith("step-00000008"):  # rewritten once the analysis has read it
            f = src / "checkpoints" / "step-00000008" / "model.safetensors"
            f.write_bytes(f.read_bytes())
        return res

    monkeypatch.setattr(scan, "analyze", analyze_then_rewrite)
    monkeypatch.setattr(series, "CHECKPOINT_TRIES", 1)
    res = track(src, tmp_path / "t", workers=1, plots=False)
    assert list(res.failed) == ["step-00000008"] and "changed while it was read" in res.failed["step-00000008"]
