"""The tiny configs discovery builds (benchmarks/DISCOVER.md): what they shrink, and that the
rows discovered from them read real configs' sizes."""

from __future__ import annotations

import pytest
import torch

from headrank.analysis.discover import (
    INPUT_IDS,
    TINY,
    VOCAB,
    _small_vocab,
    _text,
    one_thread,
    tiny_config,
)
from headrank.io.generated import generated_rows, row_sizes
from headrank.io.layouts import layout_for


def test_special_token_ids_past_the_tiny_vocabulary_move_below_it():
    have = {"vocab_size": 151552, "pad_token_id": 151329, "eos_token_id": 151329, "bos_token_id": 2,
            "image_token_id": 151343, "mask_token_id": 120, "flag_token_id": True}
    sets = _small_vocab(have)
    moved = {k: sets[k] for k in ("pad_token_id", "eos_token_id", "image_token_id")}
    assert moved["pad_token_id"] == moved["eos_token_id"] != moved["image_token_id"]  # one old id, one new id
    assert all(INPUT_IDS <= v < sets["vocab_size"] and v != 120 for v in moved.values())
    assert "bos_token_id" not in sets and "mask_token_id" not in sets and "flag_token_id" not in sets
    assert sets["vocab_size"] == VOCAB


@pytest.mark.parametrize("mt", ["glm4", "cohere2_moe", "qwen3_next"])
def test_tiny_configs_are_small(mt):
    t = _text(tiny_config(mt))
    assert t.vocab_size == VOCAB
    ids = [v for k, v in t.to_dict().items() if k.endswith("token_id") and isinstance(v, int)]
    assert all(i < VOCAB for i in ids)
    if mt == "qwen3_next":
        assert (t.linear_key_head_dim, t.linear_value_head_dim) == (TINY["linear_dim"],) * 2
        assert t.linear_num_value_heads == 2 * t.linear_num_key_heads == 2 * TINY["linear_heads"]


def test_head_dim_added_only_where_parameters_read_it():
    assert _text(tiny_config("qwen3_moe")).head_dim == TINY["head_dim"]  # getattr(config, "head_dim", d // H)
    assert "head_dim" not in _text(tiny_config("gpt_neox")).to_dict()  # its attention ignores it


@pytest.mark.parametrize("mt", ["qwen3_moe", "qwen2_moe", "olmoe", "glm4_moe"])  # generated rows, no table row
def test_generated_rows_read_a_configs_head_dim(mt):
    """Qwen3-30B-A3B's attention: 32 heads of 128 on a width of 2048 (not 2048 / 32); a config
    without head_dim still gives width / heads."""
    cfg = {"model_type": mt, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
           "num_hidden_layers": 48, "head_dim": 128}
    assert generated_rows()[mt]["dims"]["head_dim"] == "head_dim"
    assert layout_for(cfg).dims(cfg).head_dim == 128
    del cfg["head_dim"]
    assert layout_for(cfg).dims(cfg).head_dim == row_sizes(generated_rows()[mt], cfg)["head_dim"] == 64


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    assert one_thread(torch.get_num_threads)() == 1
    assert torch.get_num_threads() == before
