"""Crash consistency of run directories under concurrency (issue 20).

Real processes: two `train --resume` of one run at once (the second gets one line and exit 2;
metrics.jsonl never holds a step twice, even after the writer is killed and the run resumed);
a sweep whose main process is SIGKILLed takes its workers with it; a re-run never shares a run
with a live writer (that run is recorded as failed, its files untouched) and then completes.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrank.io.rundir import latest_checkpoint, lock_holder

FAST = ["--checkpoint-every", "25", "--track-every", "25", "--threads", "1"]
_HOLD = ("import sys, time\nfrom headrank.io.rundir import locked_run\n"
         "with locked_run(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(300)\n")


def _cmd(*args):
    return [sys.executable, "-m", "headrank", *map(str, args)]


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")


def _wait(cond, what, limit=120.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit, f"timed out waiting for {what}"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _steps(run: Path) -> list[int]:
    return [json.loads(ln)["step"] for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _one_line(p, needle):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


@pytest.mark.slow
def test_two_resumes_of_one_run(tmp_path):
    run = tmp_path / "run"
    args = ["train", "recall", "--out", run, "--steps", "600", "--log", "none", "--quiet", *FAST]
    a = subprocess.Popen(_cmd(*args), env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: latest_checkpoint(run) is not None, "the first checkpoint")
        b = subprocess.run(_cmd(*args, "--resume"), env=_env(), capture_output=True, text=True, timeout=120)
        assert a.poll() is None, "the first writer ended before the test could race it; raise --steps"
        _one_line(b, f"run directory {run} is being written by another process (pid {a.pid})")
    finally:
        a.kill()  # a crash in the middle of the run
        a.wait()
    c = subprocess.run(_cmd(*args, "--resume"), env=_env(), capture_output=True, text=True, timeout=300)
    assert c.returncode == 0, c.stderr
    steps = _steps(run)
    assert steps == sorted(set(steps)) and steps[-1] == 600  # no step twice, none out of order
    assert json.loads((run / "summary.json").read_text())["steps"] == 600


@pytest.mark.slow
def test_a_killed_sweep_takes_its_workers_and_a_rerun_never_shares_a_run(tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "recall", "--out", out, "--seeds", "0,1", "--workers", "2", "--threads", "1", "--quiet",
            "--set", "steps=500", "--set", "checkpoint_every=25", "--set", "track_every=25"]
    main = subprocess.Popen(_cmd(*args), env=_env(), stderr=subprocess.PIPE, text=True)
    runs = out / "runs"
    stopped: dict[str, int] = {}

    def pause_each_run_at_its_first_checkpoint() -> bool:
        # a worker is stopped (SIGSTOP) as soon as its run has a checkpoint, so that under load one
        # run cannot finish before the other has started: the kill below always finds both running
        for r in runs.iterdir() if runs.is_dir() else ():
            if r.name not in stopped and latest_checkpoint(r) is not None:
                pid = lock_holder(r)
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                stopped[r.name] = pid
        return len(stopped) == 2

    try:
        _wait(pause_each_run_at_its_first_checkpoint, "a checkpoint in both runs", limit=300)
        workers = [stopped[r.name] for r in sorted(runs.iterdir())]
        assert all(_alive(w) for w in workers) and main.pid not in workers
        second = subprocess.run(_cmd(*args), env=_env(), capture_output=True, text=True, timeout=120)
        _one_line(second, f"run directory {out} is being written by another process (pid {main.pid})")
    finally:
        os.kill(main.pid, signal.SIGKILL)
        main.wait()
    _wait(lambda: not any(_alive(w) for w in workers), "the workers to die with the sweep", limit=20)

    first, other = sorted(runs.iterdir())
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(first)], env=_env(), stdout=subprocess.PIPE,
                              text=True)  # an orphan that still writes this run (no parent-death signal)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (first / "metrics.jsonl").read_bytes()
        p = subprocess.run(_cmd(*args, "--json"), env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 3 and "1 of 2 runs failed" in p.stderr, p.stderr  # a failed run: exit 3
        rec = json.loads((out / "results" / f"{first.name}.json").read_text())
        assert rec["status"] == "failed" and "being written by another process" in rec["error"]
        assert (first / "metrics.jsonl").read_bytes() == before  # not touched by the re-run
        assert json.loads((out / "results" / f"{other.name}.json").read_text())["status"] == "ok"
    finally:
        holder.kill()
        holder.wait()
    p = subprocess.run(_cmd(*args), env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for r in (first, other):
        steps = _steps(r)
        assert steps == sorted(set(steps)) and steps[-1] == 500, (r.name, steps)
    assert [json.loads((out / "results" / f"{r.name}.json").read_text())["status"] for r in (first, other)] == [
        "ok", "ok"]


@pytest.mark.slow
def test_bad_training_options_leave_nothing_behind(tmp_path):
    for opts, needle in ((["--seed", "100000000000000000000000"], "seed must lie in 0.."),
                         (["--batch-size", "1000000000000"], "of memory; this machine has"),
                         (["--seed", "1e23"], "Invalid value for '--seed'"),
                         (["--batch-size", "1e12"], "Invalid value for '--batch-size'")):
        p = subprocess.run(_cmd("train", "recall", "--out", tmp_path / "r", *opts), env=_env(),
                           capture_output=True, text=True, timeout=120)
        _one_line(p, needle)
        assert not (tmp_path / "r").exists(), opts
