"""staged_output replaces a set as a whole: a directory in the way is refused before anything
moves, and a move that fails half-way puts the previous set back."""

import os

import pytest

from headrank.errors import HeadRankError
from headrank.util import fileio


def old_set(out):
    out.mkdir()
    for name in ("a.csv", "b.json", "c.png"):
        (out / name).write_text(f"old {name}\n")


def test_a_directory_in_the_way_refuses_the_whole_set(tmp_path):
    out = tmp_path / "out"
    old_set(out)
    (out / "b.json").unlink()
    (out / "b.json").mkdir()  # e.g. a directory named meta.json
    with pytest.raises(HeadRankError, match="a directory of that name is in the way"):
        with fileio.staged_output(out) as stage:
            for name in ("a.csv", "b.json", "c.png"):
                fileio.write_text(stage / name, f"new {name}\n")
    assert (out / "a.csv").read_text() == "old a.csv\n" and (out / "c.png").read_text() == "old c.png\n"
    assert (out / "b.json").is_dir() and sorted(p.name for p in out.iterdir()) == ["a.csv", "b.json", "c.png"]


def test_a_move_failing_half_way_restores_the_previous_set(tmp_path, monkeypatch):
    out = tmp_path / "out"
    old_set(out)
    real = os.replace

    def flaky(src, dst):  # the new c.png cannot move in (after a.csv and b.json did)
        if str(dst) == str(out / "c.png") and ".previous-" not in str(src):
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(fileio.os, "replace", flaky)
    with pytest.raises(HeadRankError, match="no space left"):
        with fileio.staged_output(out) as stage:
            for name in ("a.csv", "b.json", "c.png"):
                fileio.write_text(stage / name, f"new {name}\n")
    monkeypatch.setattr(fileio.os, "replace", real)
    assert {p.name: p.read_text() for p in out.iterdir()} == {n: f"old {n}\n" for n in ("a.csv", "b.json", "c.png")}
