"""The one writer (:mod:`headrank.io.writer`): --out checked once, locked by its directory (no lock
file), staged and committed as a set, stale files dropped only by the writer's own record, no
path derived from data, no symlink written through."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from headrank.errors import HeadRankError
from headrank.io import writer
from headrank.io.writer import RECORD, OutputSet, confined, staged
from headrank.util import fileio


def _enospc(*_a, **_k):
    raise OSError(28, "No space left on device")


def _old_set(out):
    """An output set written before the writer's record existed (meta.json marks it as headrank's)."""
    out.mkdir()
    for name in ("a.csv", "b.json", "meta.json"):
        (out / name).write_text(f"old {name}\n")


def _write(out, names, tag="new"):
    with staged(out) as (dest, stage):
        files = [fileio.write_text(stage / n, f"{tag} {n}\n") for n in names]
    return dest.moved(files, stage)


def test_a_whole_set_replaces_the_previous_one_and_keeps_other_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.csv").write_text("old\n")
    (out / "meta.json").write_text("old\n")  # an output of an earlier version (no record yet)
    (out / "notes.txt").write_text("the user's own file\n")
    assert _write(out, ["heads.csv", "meta.json"]) == [out / "heads.csv", out / "meta.json"]
    assert (out / "heads.csv").read_text() == "new heads.csv\n" and (out / "notes.txt").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [RECORD]


def test_a_failed_set_leaves_the_previous_set(tmp_path):
    out = tmp_path / "out"
    _old_set(out)
    with pytest.raises(HeadRankError, match="no space left"):
        with staged(out) as (_, stage):
            fileio.write_text(stage / "a.csv", "new\n")
            fileio.write_atomic(stage / "b.json", _enospc)
    assert {p.name: p.read_text() for p in out.iterdir()} == {n: f"old {n}\n" for n in ("a.csv", "b.json", "meta.json")}


def test_a_directory_in_the_way_refuses_the_whole_set(tmp_path):
    out = tmp_path / "out"
    _old_set(out)
    (out / "b.json").unlink()
    (out / "b.json").mkdir()
    with pytest.raises(HeadRankError, match="a directory of that name is in the way"):
        _write(out, ["a.csv", "b.json", "meta.json"])
    assert (out / "a.csv").read_text() == "old a.csv\n" and (out / "b.json").is_dir()


def test_a_move_failing_half_way_restores_the_previous_set(tmp_path, monkeypatch):
    out = tmp_path / "out"
    _old_set(out)
    real = os.replace

    def flaky(src, dst):
        if str(dst) == str(out / "meta.json") and ".previous-" not in str(src):
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(writer.os, "replace", flaky)
    with pytest.raises(HeadRankError, match="no space left"):
        _write(out, ["a.csv", "b.json", "meta.json"])
    monkeypatch.setattr(writer.os, "replace", real)
    assert {p.name: p.read_text() for p in out.iterdir()} == {n: f"old {n}\n" for n in ("a.csv", "b.json", "meta.json")}


def test_out_refused_early_in_one_line(tmp_path, monkeypatch):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(HeadRankError, match="exists and is not a directory"):
        OutputSet(f).__enter__()
    with pytest.raises(HeadRankError, match="cannot create output directory"):
        OutputSet(f / "sub").__enter__()
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(HeadRankError, match=f"permission denied: cannot create output directory .* \\(in {tmp_path}\\)"):
        OutputSet(tmp_path / "a" / "b").__enter__()
    assert not (tmp_path / "a").exists()


def test_a_failed_run_leaves_no_out_it_created(tmp_path):
    with pytest.raises(RuntimeError):
        with OutputSet(tmp_path / "new"):
            raise RuntimeError("the analysis failed")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("label", ["../../ESCAPED", "/abs", "a/b", "..", ".", "", ".hidden", "x\0y", 7])
def test_names_from_data_are_one_plain_component(tmp_path, label):
    with pytest.raises(HeadRankError, match="not a plain file name"):
        confined(tmp_path, label, "checkpoint label")
    assert confined(tmp_path, "step-100.csv") == tmp_path / "step-100.csv"


def test_stale_files_only_by_the_writers_own_record(tmp_path):
    out = tmp_path / "out"
    _write(out, ["a.csv", "b.json"])
    (out / "c.txt").write_text("the user's\n")
    rec = json.loads((out / RECORD).read_text())
    rec["files"]["c.txt"] = [len("the user's\n"), "0" * 32]  # planted: the size right, the fingerprint not
    rec["files"]["../victim"] = [1, "0" * 32]
    (out / RECORD).write_text(json.dumps(rec))
    (out / "b.json").write_text("edited by the user\n")  # recorded, then changed: no longer ours
    _write(out, ["a.csv"])
    assert (out / "c.txt").exists() and (out / "b.json").read_text() == "edited by the user\n"
    _write(out, ["a.csv", "d.csv"])
    _write(out, ["a.csv"])
    assert not (out / "d.csv").exists()  # written by the writer, unchanged since: dropped


def test_a_symlinked_record_or_lock_is_never_followed(tmp_path):
    out = tmp_path / "out"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out.mkdir()
    (out / RECORD).symlink_to(victim)
    (out / ".lock").symlink_to(victim)
    _write(out, ["a.csv"])
    assert victim.read_text() == "precious\n" and not (out / RECORD).is_symlink()


def test_append_refuses_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "table.partial.csv").symlink_to(victim)
    with pytest.raises(HeadRankError, match="symlink"):
        writer.append_no_follow(tmp_path / "table.partial.csv", "rows\n")
    assert victim.read_text() == "precious\n"
    writer.append_no_follow(tmp_path / "new.csv", "a\n")
    writer.append_no_follow(tmp_path / "new.csv", "b\n")
    assert (tmp_path / "new.csv").read_text() == "a\nb\n"


_HOLD = ("import sys, time\nfrom headrank.io.writer import OutputSet\n"
         "with OutputSet(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")


def test_a_second_writer_is_refused_naming_the_first_and_no_lock_file_stays(tmp_path):
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(HeadRankError, match=f"being written by another process \\(pid {p.pid}\\)"):
            _write(out, ["a.csv"])
    finally:
        p.kill()
        p.wait()
    _write(out, ["a.csv"])  # the kernel dropped the killed holder's lock
    assert sorted(p.name for p in out.iterdir()) == [RECORD, "a.csv"]


def test_a_commit_killed_half_way_is_finished_by_the_next_run(tmp_path):
    """A SIGKILL cannot be held: the staging directory marked complete is moved in by the next run."""
    out = tmp_path / "out"
    _write(out, ["a.csv", "b.json", "c.png"], tag="old")
    dead = 4_000_000
    stage = out / f"{fileio.STAGING_PREFIX}{dead}-x"
    stage.mkdir()
    for n in ("b.json", "c.png"):  # a.csv had moved in already
        (stage / n).write_text(f"new {n}\n")
    (out / "a.csv").write_text("new a.csv\n")
    (stage / RECORD).write_text(json.dumps({"files": {}}))  # the record moves last: still in the stage
    (stage / writer.COMPLETE).touch()
    with OutputSet(out):
        pass
    assert {p.name: p.read_text() for p in out.iterdir() if not p.name.startswith(".")} == \
        {n: f"new {n}\n" for n in ("a.csv", "b.json", "c.png")}
    assert not stage.exists()
