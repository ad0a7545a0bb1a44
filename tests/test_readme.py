"""The README's commands, run as a newcomer types them: the two set-up commands are there, and
every command or Python snippet of the README that needs no network (those on the shipped
``minilm``) runs verbatim from a fresh working directory. ``make demo`` itself is run by .ci/run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BIN = Path(sys.executable).parent


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def offline_commands() -> list[str]:
    out = []
    for block in blocks("bash"):
        for line in block.splitlines():
            cmd = line.split(" #")[0].strip()
            if cmd.startswith("headrank ") and " minilm" in cmd and "--remote" not in cmd and "http" not in cmd:
                out.append(cmd)
    return out


def offline_snippets() -> list[str]:
    return [b for b in blocks("python") if "minilm" in b and "import headrank" in b]


def test_the_two_set_up_commands_are_shown():
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
    assert offline_commands(), "the README shows no command that runs offline on minilm"


@pytest.mark.slow
@pytest.mark.parametrize("cmd", offline_commands())
def test_each_offline_command_runs_verbatim(cmd, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run(shlex.split(cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{cmd}\n{r.stderr}"


@pytest.mark.slow
@pytest.mark.parametrize("snippet", offline_snippets())
def test_each_python_snippet_runs(snippet, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    r = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"{snippet}\n{r.stderr}"
