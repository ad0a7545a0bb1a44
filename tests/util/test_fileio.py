"""Writing outputs: one line for a full disk or a refused write, whole sets or the old set,
--out probed before the work, temporaries of killed runs cleaned."""

import errno
import os
import time

import pytest

from headrank.errors import HeadRankError
from headrank.util import fileio


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_no_space_is_one_line_naming_the_file(tmp_path):
    target = tmp_path / "heads.csv"
    with pytest.raises(HeadRankError) as e:
        fileio.write_atomic(target, _enospc)
    assert str(e.value) == f"no space left on the device: cannot write {target}"
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert list(tmp_path.iterdir()) == []  # the temporary is gone, nothing half-written


def test_permission_denied_while_writing_names_the_file(tmp_path):
    def deny(p):
        raise PermissionError(13, "Permission denied", str(p))

    with pytest.raises(HeadRankError, match="permission denied: cannot write .*meta.json"):
        fileio.write_atomic(tmp_path / "meta.json", deny)


def test_a_failed_set_leaves_the_previous_set(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.csv").write_text("old heads\n")
    (out / "meta.json").write_text("old meta\n")
    with pytest.raises(HeadRankError, match="no space left"):
        with fileio.staged_output(out) as stage:
            fileio.write_text(stage / "heads.csv", "new heads\n")
            fileio.write_atomic(stage / "meta.json", _enospc)
    assert sorted(p.name for p in out.iterdir()) == ["heads.csv", "meta.json"]
    assert (out / "heads.csv").read_text() == "old heads\n" and (out / "meta.json").read_text() == "old meta\n"


def test_a_whole_set_replaces_the_previous_one(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.csv").write_text("old\n")
    (out / "notes.txt").write_text("the user's own file\n")
    with fileio.staged_output(out) as stage:
        written = [fileio.write_text(stage / "heads.csv", "new\n"), fileio.write_text(stage / "meta.json", "{}\n")]
    assert fileio.moved(written, stage, out) == [out / "heads.csv", out / "meta.json"]
    assert (out / "heads.csv").read_text() == "new\n" and (out / "notes.txt").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_check_writable_refuses_early(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(HeadRankError, match="exists and is not a directory"):
        fileio.check_writable(f)
    with pytest.raises(HeadRankError, match="cannot create output directory"):
        fileio.check_writable(f / "sub")


def test_check_writable_names_a_directory_it_cannot_write(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "mkstemp", lambda **k: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied", k.get("dir"))))
    (tmp_path / "out").mkdir()
    with pytest.raises(HeadRankError) as e:
        fileio.check_writable(tmp_path / "out")
    assert str(e.value) == f"permission denied: cannot write into {tmp_path / 'out'}"


def test_check_writable_does_not_create_out(tmp_path, monkeypatch):
    assert fileio.check_writable(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # created only when the files are written
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    with pytest.raises(HeadRankError, match=f"permission denied: cannot create output directory .* \\(in {tmp_path}\\)"):
        fileio.check_writable(tmp_path / "a" / "b")


def _dead_pid() -> int:
    pid = 4_000_000  # above Linux's pid_max: never a live process
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    return pid


def test_temporaries_of_killed_runs_are_cleaned(tmp_path):
    dead, live = _dead_pid(), os.getpid()
    stale = [f".heads.csv.{dead}.abcd1234.tmp.csv", f".fig4_rows.png.{dead}.k2j3h4g5.tmp.png"]
    kept = [f".heads.csv.{live}.abcd1234.tmp.csv", ".hidden_user_file", "heads.csv"]
    for n in stale + kept:
        (tmp_path / n).write_text("x")
    (tmp_path / f"{fileio.STAGING_PREFIX}{dead}-x1y2").mkdir()
    (tmp_path / f"{fileio.STAGING_PREFIX}{dead}-x1y2" / "heads.csv").write_text("x")
    old = tmp_path / ".meta.json.q1w2e3r4.tmp.json"  # the old naming, without a PID
    old.write_text("x")
    young = tmp_path / ".meta.json.a1s2d3f4.tmp.json"
    young.write_text("x")
    hour_ago = time.time() - 7200
    os.utime(old, (hour_ago, hour_ago))
    removed = fileio.clean_stale(tmp_path)
    assert sorted(removed) == sorted([*stale, f"{fileio.STAGING_PREFIX}{dead}-x1y2", old.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, young.name])


def test_atomic_temporaries_carry_the_pid(tmp_path):
    with fileio.atomic_path(tmp_path / "a.png") as tmp:
        assert tmp.name.startswith(f".a.png.{os.getpid()}.") and tmp.name.endswith(".tmp.png")
        tmp.write_text("x")
    assert (tmp_path / "a.png").read_text() == "x"
