"""The one error path's helpers: the unexpected-error line, the debug switch, a closed stdout."""

import os
import subprocess
import sys

from headrank.cli import errorpath as ep


def test_unexpected_names_type_message_and_debug():
    line = ep.unexpected(ValueError("bad\nthing " + "x" * 400))
    assert line.startswith("unexpected ValueError: bad thing xxx") and "\n" not in line
    assert "--debug" in line and "HEADRANK_DEBUG=1" in line and len(line) < 420
    assert ep.unexpected(KeyError()).startswith("unexpected KeyError (a bug")


def test_debug_from_env(monkeypatch):
    for v, want in (("1", True), ("yes", True), ("TRUE", True), ("0", False), ("", False)):
        monkeypatch.setenv("HEADRANK_DEBUG", v)
        assert ep.debug_from_env() is want
    monkeypatch.delenv("HEADRANK_DEBUG")
    assert ep.debug_from_env() is False


def test_stdout_broken_sees_a_closed_pipe_reader():
    code = ("import sys, time; from headrank.cli.errorpath import stdout_broken; "
            "a = stdout_broken(); time.sleep(0.5); sys.stderr.write(f'{a} {stdout_broken()}')")
    r, w = os.pipe()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=w, stderr=subprocess.PIPE, text=True)
    os.close(w)
    os.close(r)  # the reader goes away while the child sleeps
    _, err = p.communicate(timeout=60)
    assert err.split()[-1] == "True", err
    r2 = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r2.stderr.split() == ["False", "False"], r2.stderr
