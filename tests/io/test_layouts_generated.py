"""Generated rows read from config dicts: sizes from per-layer lists, and encoder-decoder rows
whose parts are read where the checkpoint holds them."""

from __future__ import annotations

import pytest
import torch

from headrank.errors import HeadRankError
from headrank.io.generated import generated_rows, row_sizes
from headrank.io.layouts import AttentionReader, layout_from_row
from headrank.io.live import LiveCheckpoint

ROW = {"model_type": "nemotron_h", "dims": {"n_layers": "=len:layers_block_type", "d": "hidden_size",
                                            "n_heads": "num_attention_heads", "n_kv_heads": "=n_heads",
                                            "head_dim": "=d/n_heads"}}


@pytest.mark.parametrize("config, layers", [
    ({"layers_block_type": ["mamba", "attention", "mlp"]}, 3),  # as transformers 5 writes it
    ({"hybrid_override_pattern": "M-M-M*-M-"}, 9),  # as the released config.json files have it
])
def test_layer_count_from_a_per_layer_list(config, layers):
    sizes = row_sizes(ROW, {"model_type": "nemotron_h", "hidden_size": 64, "num_attention_heads": 4, **config})
    assert sizes["n_layers"] == layers and sizes["head_dim"] == 16


def test_layer_count_from_a_per_layer_list_missing():
    row = {**ROW, "model_type": "no_such_type"}  # no transformers default to fall back on
    with pytest.raises(HeadRankError, match="lacks 'layers_block_type'"):
        row_sizes(row, {"hidden_size": 64, "num_attention_heads": 4})


def _t5_state(layers: int, with_encoder: bool) -> dict[str, torch.Tensor]:
    """T5-named attention tensors: d 8, 2 heads of 4 (d_kv)."""
    g = torch.Generator().manual_seed(0)
    names = [f"decoder.block.{i}.layer.{j}.{m}.{r}.weight" for i in range(layers)
             for j, m in ((0, "SelfAttention"), (1, "EncDecAttention")) for r in "qkvo"]
    if with_encoder:
        names += [f"encoder.block.{i}.layer.0.SelfAttention.{r}.weight" for i in range(layers) for r in "qkvo"]
    return {n: torch.randn(8, 8, generator=g, dtype=torch.float64) for n in names}


def test_encoder_decoder_parts_present_in_the_checkpoint():
    row = generated_rows()["t5"]
    cfg = {"model_type": "t5", "d_model": 8, "num_heads": 2, "d_kv": 4, "num_layers": 2, "num_decoder_layers": 2}
    full = AttentionReader(LiveCheckpoint(_t5_state(2, True), cfg), layout_from_row(row))
    assert [p.layout.attention for p in full.parts] == ["encoder", "decoder", "cross"]
    assert full.layout.attention == "encoder" and full.dims.n_heads == 2  # this reader is the first part
    w = _t5_state(2, True)["decoder.block.1.layer.1.EncDecAttention.q.weight"]
    hw = full.parts[2].read_layer(1)
    assert torch.equal(hw.wq.reshape(8, 8), w)
    dec = AttentionReader(LiveCheckpoint(_t5_state(2, False), cfg), layout_from_row(row))
    assert [p.layout.attention for p in dec.parts] == ["decoder", "cross"]
    with pytest.raises(HeadRankError, match="no tensor named like"):
        AttentionReader(LiveCheckpoint({"other.weight": torch.zeros(2)}, cfg), layout_from_row(row))
