"""`collapse` refuses a checkpoint whose weights do not hold the layers its config declares (issue
46: a config of 40 layers over weights of 2 exited 0, measuring 38 randomly initialised layers as
the pretrained model; 100,000 layers were refused only after 144 s and 4 GB)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

from headrank import collapse
from headrank.errors import HeadRankError

CFG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=300,
           max_position_embeddings=64)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("two") / "m"
    tf.LlamaForCausalLM(tf.LlamaConfig(**CFG)).save_pretrained(d)
    return d


def _with_layers(two, tmp_path, n):
    d = tmp_path / "m"
    shutil.copytree(two, d)
    c = json.loads((d / "config.json").read_text())
    c["num_hidden_layers"] = n
    (d / "config.json").write_text(json.dumps(c))
    return d


@pytest.mark.parametrize("n", [40, 100_000])
def test_a_config_declaring_more_layers_than_the_weights_hold_is_refused_at_once(two, tmp_path, n):
    d = _with_layers(two, tmp_path, n)
    r = subprocess.run([sys.executable, "-m", "headrank", "collapse", str(d), "--seqs", "2"], capture_output=True,
                       text=True, timeout=60, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"declares {n:,} layers" in r.stderr and "randomly initialised" in r.stderr


def test_a_million_layers_is_refused_by_the_bound(two, tmp_path):
    with pytest.raises(HeadRankError, match="num_hidden_layers must lie in"):
        collapse(str(_with_layers(two, tmp_path, 10**6)), seqs=2)


def test_a_layer_missing_one_tensor_is_refused_after_loading(two, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(two, d)
    sd = load_file(d / "model.safetensors")
    del sd["model.layers.1.self_attn.q_proj.weight"]
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(HeadRankError, match="the weights lack 1 tensors .*layers.1.self_attn.q_proj"):
        collapse(str(d), seqs=2, max_tokens=8)


def test_the_whole_checkpoint_still_opens(two):
    assert collapse(str(two), seqs=2, max_tokens=8) is not None
