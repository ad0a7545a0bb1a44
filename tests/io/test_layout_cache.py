"""The layout cache (`layouts_checked.json`, written by `headrank architectures --check`) is read
as a planted file and updated under a lock (issue 46): concurrent updates lose nothing, a garbage
row or a FIFO is one line and exit 2 (not "unexpected AttributeError", not a hang)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from headrank.errors import HeadRankError
from headrank.io import generated

ROW = {"status": "refused", "reason": "test row"}


def _saver(path: str, worker: int, n: int) -> None:
    for k in range(n):
        generated.save_rows(generated.Path(path), {f"t{worker}_{k}": dict(ROW)}, "test")


def test_concurrent_updates_lose_nothing(tmp_path):
    p = tmp_path / "cache" / "layouts_checked.json"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_saver, args=(str(p), w, 25)) for w in range(4)]
    for q in procs:
        q.start()
    for q in procs:
        q.join(60)
        assert q.exitcode == 0
    types = json.loads(p.read_text())["types"]
    assert len(types) == 100 and set(types) == {f"t{w}_{k}" for w in range(4) for k in range(25)}
    assert [x.name for x in p.parent.iterdir()] == ["layouts_checked.json"]  # no temporary or lock file left


GARBAGE = {
    "a row that is a string": "garbage",
    "an unknown status": {"status": "maybe"},
    "a format spec in a module path": {"status": "verified", "split": "separate",
                                       "modules": {"q": "layers.{i:>2000000000}.q"},
                                       "dims": dict.fromkeys(("n_layers", "d", "n_heads", "n_kv_heads", "head_dim"),
                                                             "hidden_size")},
    "an attribute in a module path": {"status": "verified", "split": "separate",
                                      "modules": {"q": "layers.{i.__class__}.q"},
                                      "dims": dict.fromkeys(("n_layers", "d", "n_heads", "n_kv_heads", "head_dim"),
                                                            "hidden_size")},
    "dims that are code": {"status": "verified", "split": "separate", "modules": {"q": "layers.{i}.q"},
                           "dims": dict.fromkeys(("n_layers", "d", "n_heads", "n_kv_heads", "head_dim"),
                                                 "__import__('os')")},
    "parts not a list": {"status": "verified", "parts": 5},
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_a_garbage_row_is_one_line(tmp_path, monkeypatch, case):
    (tmp_path / "layouts_checked.json").write_text(json.dumps({"types": {"llama": GARBAGE[case]}}))
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path))
    with pytest.raises(HeadRankError, match="layouts_checked.json: row 'llama'"):
        generated.generated_rows()


def _cli(tmp_path, *args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HEADRANK_CACHE=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "headrank", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_architectures_with_a_garbage_row_exits_2_in_one_line(tmp_path):
    (tmp_path / "layouts_checked.json").write_text(json.dumps({"types": {"llama": "garbage"}}))
    r = _cli(tmp_path, "architectures")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not a layout row" in r.stderr and "unexpected" not in r.stderr


def test_a_fifo_as_the_cache_is_one_line_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "layouts_checked.json")
    r = _cli(tmp_path, "architectures")
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr
