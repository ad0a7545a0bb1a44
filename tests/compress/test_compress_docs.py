"""docs/compress.md's examples run as printed, each in its own process, in a fresh directory: the
quick start (``headrank compress minilm ... --eval``, then ``load_compressed`` from another
interpreter) and the Python section. Not run here: the SmolLM2 measurement commands (1 to 50
minutes each; their numbers are in the page) and the latent-cache fragment (it continues a
SmolLM2 output)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "compress.md"
BIN = Path(sys.executable).parent


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
            "HEADRANK_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


def test_the_page_has_the_examples_this_test_runs():
    first = [ln[2:] for ln in _blocks("console")[0].splitlines() if ln.startswith("$ ")]
    assert first[0].startswith("headrank compress minilm") and "load_compressed" in first[1]
    assert any("res = compress(" in b for b in _blocks("python"))


@pytest.mark.slow
def test_the_quick_start_runs_as_printed(tmp_path):
    for cmd in (ln[2:] for ln in _blocks("console")[0].splitlines() if ln.startswith("$ ")):
        r = subprocess.run(cmd, shell=True, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stdout[-1500:], r.stderr[-1500:])
    assert (tmp_path / "minilm-ov50" / "compress.json").is_file()


@pytest.mark.slow
def test_the_python_section_runs_as_printed(tmp_path):
    (code,) = [b for b in _blocks("python") if "res = compress(" in b]
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "k.png").is_file() and (tmp_path / "out" / "compress.json").is_file()
