"""One writer per run directory: the flock on the directory RUN itself, across processes and through a kill;
no lock file is made or left."""

import os
import signal
import subprocess
import sys
import time

import pytest

from headrank.errors import HeadRankError
from headrank.io.rundir import LOCK, locked_run, run_locked

_HOLD = ("import sys, time\nfrom headrank.io.rundir import locked_run\n"
         "with locked_run(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")


def _holder(run):
    p = subprocess.Popen([sys.executable, "-c", _HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_gets_one_line_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    p = _holder(run)
    try:
        assert run_locked(run)
        with pytest.raises(HeadRankError) as e:
            with locked_run(run):
                pass
        assert str(e.value).startswith(f"run directory {run} is being written by another process (pid {p.pid})")
    finally:
        p.kill()
        p.wait()


def test_a_killed_writer_leaves_no_stale_lock(tmp_path):
    run = tmp_path / "run"
    p = _holder(run)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (run / LOCK).exists() and not run_locked(run)
    t0 = time.monotonic()
    with locked_run(run):
        assert run_locked(run)
    assert time.monotonic() - t0 < 5 and not run_locked(run) and list(run.iterdir()) == []


def test_the_same_process_cannot_take_it_twice(tmp_path):
    with locked_run(tmp_path / "r"):
        with pytest.raises(HeadRankError, match="being written by another process"):
            with locked_run(tmp_path / "r"):
                pass
    with locked_run(tmp_path / "r"):  # released on exit
        pass
