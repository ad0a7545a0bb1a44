"""`spectra URL --allow-full` against a server on 127.0.0.1 that ignores `Range` and answers 200
with the whole body (issue 46): each file is downloaded whole when it is within `--max-bytes`
(default: twice the attention bytes its safetensors header lists), with results equal to the
local read; a file over it is one line, exit 2, naming `--max-bytes` and the value that reads
it, nothing written (docs/verbs/spectra.md, docs/remote-security.md). Run as users run it: the
CLI in a fresh interpreter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.io.hubserver import HubServer


def _llama(path, **over):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = {**dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=96, vocab_size=101), **over}
    tf.LlamaForCausalLM(tf.LlamaConfig(**cfg)).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("full")
    _llama(r / "usual")  # attention about a third of the file: over the default
    _llama(r / "attn heavy", intermediate_size=8, vocab_size=8)  # attention most of it: within the default
    return r


def _spectra(cwd, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    return subprocess.run([sys.executable, "-m", "headrank", "spectra", *args, "-q", "--no-plots"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)


def _same(a, b):
    x, y = np.load(a / "spectra.npz"), np.load(b / "spectra.npz")
    for k in ("qk", "ov"):
        np.testing.assert_array_equal(x[k], y[k])
    pd.testing.assert_frame_equal(pd.read_csv(a / "heads.csv").drop(columns="source"),
                                  pd.read_csv(b / "heads.csv").drop(columns="source"))


def _one_line_2(r):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    return lines[0]


def test_allow_full_reads_a_whole_file_within_max_bytes(root, tmp_path):
    local = _spectra(tmp_path, str(root / "usual"), "--out", "local")
    assert local.returncode == 0, local.stderr
    size = (root / "usual" / "model.safetensors").stat().st_size
    with HubServer(root=root) as s:
        s.fault = lambda path, start, end: "norange"  # 200 and the whole body, whatever the Range
        url = f"{s.url}/files/usual/"
        r = _spectra(tmp_path, url, "--allow-full", "--max-bytes", str(size), "--out", "remote")
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / "remote" / "meta.json").read_text())["remote"]["full_downloads"] == [
            "model.safetensors"]
        _same(tmp_path / "local", tmp_path / "remote")
        # one byte under the file's size: one line naming --max-bytes and the value that reads it
        r = _spectra(tmp_path, url, "--allow-full", "--max-bytes", str(size - 1), "--out", "under")
        line = _one_line_2(r)
        assert "more than --max-bytes" in line and f"give --max-bytes of at least {size:,}" in line, line
        assert not (tmp_path / "under").exists()
        # the default, twice the attention bytes its header lists, is less than this file
        r = _spectra(tmp_path, url, "--allow-full", "--out", "default")
        line = _one_line_2(r)
        assert re.search(r"more than twice the [\d,]+ bytes of attention tensors its header lists \(the default "
                         rf"--max-bytes\).*give --max-bytes of at least {size:,}", line), line
        assert not (tmp_path / "default").exists()


def test_allow_full_alone_reads_a_file_that_is_mostly_attention(root, tmp_path):
    local = _spectra(tmp_path, str(root / "attn heavy"), "--out", "local")
    assert local.returncode == 0, local.stderr
    with HubServer(root=root) as s:
        s.fault = lambda path, start, end: "norange"
        url = f"{s.url}/files/attn heavy/model.safetensors"  # a single file: its sibling config.json
        r = _spectra(tmp_path, url, "--out", "refused")
        assert "ignores HTTP range requests" in _one_line_2(r) and not (tmp_path / "refused").exists()
        r = _spectra(tmp_path, url, "--allow-full", "--out", "remote")
        assert r.returncode == 0, r.stderr
    _same(tmp_path / "local", tmp_path / "remote")
