"""Progress off a terminal: one line at a fixed interval even while nothing reports, from the
bar itself (util/progress.py), and a long command piped prints its first line within 10 s."""

import os
import subprocess
import sys
import threading
import time

from headrank.util.progress import EVERY_S, LineProgress


class _Console:
    def __init__(self):
        self.lines: list[tuple[float, str]] = []
        self.two = threading.Event()

    def print(self, s, highlight=False):
        self.lines.append((time.monotonic(), str(s)))
        if len(self.lines) >= 2:
            self.two.set()


def test_the_bar_beats_while_a_task_reports_nothing():
    con = _Console()
    with LineProgress(con, every_s=0.2) as bar:
        bar.add_task("loading", total=None)
        assert con.two.wait(60), "no second line within 60 s"  # an event, not a sleep
    assert all(line.startswith("loading 0") for _, line in con.lines)
    n = len(con.lines)
    time.sleep(0.5)
    assert len(con.lines) == n  # the beat stops with the block


def test_nothing_before_a_task_and_nothing_when_quick():
    con = _Console()
    with LineProgress(con, every_s=60):
        pass
    assert con.lines == [] and EVERY_S <= 10


def test_piped_compress_prints_a_progress_line_within_10_s(tmp_path):
    """`headrank compress … 2>&1 | cat` as a user runs it: stderr is a pipe; the first progress line
    must come within 10 s of the start (the command itself takes longer here, on a loaded machine)."""
    start = time.monotonic()
    p = subprocess.Popen(f'"{sys.executable}" -m headrank compress minilm --out "{tmp_path / "o k"}" --keep 0.99 '
                         "2>&1 | cat", shell=True, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    first = None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if first is None and line.rstrip().endswith(" s)") and "(" in line:
            first = time.monotonic() - start
    assert p.wait(timeout=600) == 0, "".join(lines)
    kv = next(line for line in lines if "KV cache" in line)  # MiniLM is an encoder: it has none to save
    assert "no KV cache (an encoder)" in kv and "bytes/token" not in kv, kv
    total = time.monotonic() - start
    if total > 10:  # a run over 10 s must have shown a progress line within the first 10 s
        assert first is not None and first <= 10, (first, total, lines)
    else:  # a quick run: it may print none, but never a late one
        assert first is None or first <= 10


def test_quiet_prints_no_progress(tmp_path):
    r = subprocess.run([sys.executable, "-m", "headrank", "compress", "minilm", "--out", str(tmp_path / "o"),
                        "--keep", "0.99", "--quiet"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", (r.stdout, r.stderr)
