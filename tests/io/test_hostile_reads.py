"""The one reader of planted files and the bounds table (issue 46): each file kind is opened as a
regular file under its byte cap (a FIFO does not hang, a 200 MB TOML or a 500 MB record is
refused before it is parsed), every size is bounded, and an error line is short and has no
doubled colon."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from headrank.errors import ERROR_LINE_LIMIT, HeadRankError
from headrank.io import validate
from headrank.util.fileio import read_regular
from tests.fuzz.harness import time_limit

from ..fuzz.harness import TINY_CONFIG, write_tiny


@pytest.fixture
def alarm():
    with time_limit(20):
        yield


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_the_reader_refuses_what_is_not_a_regular_file(tmp_path, alarm, kind):
    p = tmp_path / "rec.json"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "directory":
        p.mkdir()
    else:
        p.symlink_to("/dev/zero")
    with pytest.raises(HeadRankError, match="not a regular file|is a directory"):
        validate.read_json(p, "compress record")


def test_the_check_is_made_on_the_open_descriptor(tmp_path, alarm, monkeypatch):
    """A FIFO swapped in after the path was checked is still refused (fstat of what was opened)."""
    p = tmp_path / "rec.json"
    p.write_text("{}")
    real = os.open

    def swap(path, *a, **k):
        if str(path) == str(p):
            p.unlink()
            os.mkfifo(p)
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", swap)
    with pytest.raises(HeadRankError, match="a FIFO"):
        read_regular(p, "compress record", 1 << 20)


@pytest.mark.parametrize(("what", "size"), [("layout file", 200 << 20), ("factored manifest", 500 << 20),
                                            ("compress record", 500 << 20), ("run record", 500 << 20),
                                            ("layout cache", 500 << 20), ("track record", 500 << 20)])
def test_a_huge_file_is_refused_before_it_is_read(tmp_path, alarm, what, size):
    p = tmp_path / "f"
    with open(p, "wb") as fh:
        fh.truncate(size)  # sparse: no disk used, no byte read
    with pytest.raises(HeadRankError, match=f"more than a {what} may be"):
        validate.read_bytes(p, what)


def test_a_200_mb_toml_layout_is_one_line(tmp_path, alarm):
    from headrank.io.layout_toml import layout_from_toml

    p = tmp_path / "big.toml"
    with open(p, "wb") as fh:
        fh.write(b'name = "')
        fh.truncate(200 << 20)
    with pytest.raises(HeadRankError, match="more than a layout file may be"):
        layout_from_toml(p)


def test_compress_result_load_of_a_fifo_is_one_line(tmp_path, alarm):
    from headrank.compress import CompressResult

    os.mkfifo(tmp_path / "compress.json")
    with pytest.raises(HeadRankError, match="not a regular file"):
        CompressResult.load(tmp_path)


@pytest.mark.parametrize(("cfg", "match"), [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers must lie in 1..100000"),
    ({"vocab_size": 2**31}, "vocab_size must lie in"), ({"hidden_size": 2**31}, "hidden_size must lie in"),
    ({"num_attention_heads": 0}, "num_attention_heads must lie in"), ({"hidden_size": "64"}, "must be an integer"),
    ({"text_config": {"intermediate_size": 2**40}}, "text_config: intermediate_size must lie in"),
    ({"hidden_size": 1 << 22, "num_hidden_layers": 100_000}, "would need .* of memory"),
])
def test_config_sizes_are_bounded_before_anything_is_built(cfg, match):
    with pytest.raises(HeadRankError, match=match):
        validate.check_config_sizes(cfg, "config.json")


def test_no_doubled_colon_and_a_short_line_from_the_cli(tmp_path):
    src = write_tiny(tmp_path / "m", {**TINY_CONFIG, "num_attention_heads": 0})
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(src)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and ": :" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    long = tmp_path / ("x" * 200) / ("y" * 200)
    long.mkdir(parents=True)
    (long / "config.json").write_text(json.dumps({"model_type": "z" * 200_000}))
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(long)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert len(r.stderr.strip()) <= ERROR_LINE_LIMIT + len("error: "), len(r.stderr)
