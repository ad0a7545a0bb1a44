"""``--convention transformerlens`` against TransformerLens 4 itself: a TransformerBridge booted on
the same tiny checkpoint, with its default weight processing (``enable_compatibility_mode``), and
its own per-head SVD (``FactoredMatrix.S`` of ``bridge.QK`` and ``bridge.OV``). GPT-2 (LayerNorm:
fold, centre, W_O centred) and Llama (RMSNorm, grouped-query), both with non-unit gains."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers as tf

from headrank.analysis.scan import analyze
from headrank.errors import HeadRankError


def _gpt2(path):
    torch.manual_seed(0)
    m = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=32,
                                         bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        for blk in m.transformer.h:
            blk.ln_1.weight.uniform_(0.3, 2.0)
            blk.ln_1.bias.normal_()
            blk.attn.c_attn.bias.normal_()
    m.save_pretrained(path)


def _llama(path):
    torch.manual_seed(1)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=96, vocab_size=101,
                                           bos_token_id=0, eos_token_id=0, pad_token_id=0))
    with torch.no_grad():
        for layer in m.model.layers:
            layer.input_layernorm.weight.uniform_(0.3, 2.0)
    m.save_pretrained(path)
    _tokenizer().save_pretrained(path)


def _tokenizer():  # offline: a word-level tokenizer built here (the Llama tokenizer would be fetched)
    from tokenizers import Tokenizer, models

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 101)}}
    return tf.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                      unk_token="<unk>", bos_token="<unk>", eos_token="<unk>", pad_token="<unk>")


def _tl_spectra(path) -> dict[str, np.ndarray]:
    tl = pytest.importorskip("transformer_lens")
    bridge = tl.TransformerBridge.boot_transformers(str(path), device="cpu", dtype=torch.float64)
    bridge.enable_compatibility_mode()  # TransformerLens' default processing (fold_ln, centring, value biases)
    with torch.no_grad():
        return {"qk": bridge.QK.S.double().numpy(), "ov": bridge.OV.S.double().numpy()}


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_transformerlens_convention_equals_transformerlens(tmp_path, make):
    make(tmp_path / "m")
    ref = _tl_spectra(tmp_path / "m")
    got = analyze(tmp_path / "m", convention="transformerlens")
    raw = analyze(tmp_path / "m")
    for p in ("qk", "ov"):
        r = ref[p]
        assert got.sv[p].shape == r.shape
        err = np.abs(got.sv[p] - r).max(-1) / r[..., 0]  # per head, relative to its σ₁
        assert err.max() < 1e-6, (p, err.max())
    # the convention matters on these models (raw weights give other singular values)
    assert np.abs(raw.sv["qk"] - ref["qk"]).max() / ref["qk"].max() > 1e-3
    assert got.meta["conventions"]["convention"] == "transformerlens"
    assert raw.meta["conventions"]["convention"] == "raw"


def test_gpt2_ov_differs_from_fold_norm_alone(tmp_path):
    """--fold-norm alone leaves W_O uncentred: its OV spectra are not TransformerLens' (the issue's 0.6 %)."""
    _gpt2(tmp_path / "m")
    tl_ = analyze(tmp_path / "m", convention="transformerlens").sv["ov"]
    fold = analyze(tmp_path / "m", fold_norm=True).sv["ov"]
    assert np.abs(tl_ - fold).max() / tl_.max() > 1e-4


def test_unknown_or_unsupported_convention_is_one_line(tmp_path):
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                               vocab_size=61)).save_pretrained(tmp_path / "b")
    with pytest.raises(HeadRankError, match="post-norm"):
        analyze(tmp_path / "b", convention="transformerlens")
    with pytest.raises(HeadRankError, match="unknown; use raw or transformerlens"):
        analyze(tmp_path / "b", convention="hooked")
    for conv, why in (("transformerlens", "post-norm"), ("nope", "unknown")):
        r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(tmp_path / "b"), "--convention", conv],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and why in r.stderr and "--convention" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_convention_in_meta_json(tmp_path):
    _llama(tmp_path / "m")
    out = tmp_path / "out dir"
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(tmp_path / "m"), "--convention",
                        "transformerlens", "--out", str(out), "--no-plots", "-q"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["conventions"]["convention"] == "transformerlens"
    assert "TransformerLens 4" in meta["conventions"]["weights"]


def test_convention_in_figure_titles(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from headrank.analysis import plots
    from headrank.analysis.figproc import figure_data

    _llama(tmp_path / "m")
    res = analyze(tmp_path / "m", convention="transformerlens")
    fig = plots.sv_curves(figure_data(res))
    assert "transformerlens convention" in fig._suptitle.get_text()
    assert "convention" not in plots.sv_curves(figure_data(analyze(tmp_path / "m")))._suptitle.get_text()


def test_track_reads_every_checkpoint_in_the_convention(tmp_path):
    import pandas as pd

    for i in (1, 2):
        _gpt2(tmp_path / f"step-{i}")
    r = subprocess.run([sys.executable, "-m", "headrank", "track", str(tmp_path / "step-1"), str(tmp_path / "step-2"),
                        "--out", str(tmp_path / "t"), "--convention", "transformerlens", "--workers", "1",
                        "--no-plots", "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(tmp_path / "t" / "table.csv")
    want = analyze(tmp_path / "step-1", convention="transformerlens").table
    got = table[table["checkpoint"] == table["checkpoint"].iloc[0]]
    np.testing.assert_allclose(np.sort(got["sv_max"].to_numpy()), np.sort(want["sv_max"].to_numpy()), rtol=1e-12)
    assert json.loads((tmp_path / "t" / "series.json").read_text())["convention"] == "transformerlens"
    again = subprocess.run([sys.executable, "-m", "headrank", "track", str(tmp_path / "step-1"),
                            str(tmp_path / "step-2"), "--out", str(tmp_path / "t"), "--workers", "1", "-q"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "transformerlens convention" in again.stderr and "--convention" in again.stderr
