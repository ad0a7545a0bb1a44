"""Writing files: one line for a full disk or a refused write, temporaries of killed runs cleaned
(whole sets and --out: tests/io/test_writer.py)."""

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
