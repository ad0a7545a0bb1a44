"""The one opener of real models with real inputs (headrank.models.opener)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headrank.errors import HeadRankError
from headrank.models import opener as O


@pytest.fixture(scope="module")
def minilm():
    return O.open_model("minilm", n_inputs=3, max_tokens=20)


def test_minilm_opens_in_float64_with_real_sentences(minilm):
    assert minilm.kind == "hf" and minilm.model_type == "bert" and minilm.path.name == "model"
    assert next(minilm.model.parameters()).dtype == torch.float64 and not minilm.model.training
    ids, mask = minilm.inputs["input_ids"], minilm.inputs["attention_mask"]
    assert ids.shape[0] == 3 and ids.shape[1] <= 20 and (ids[:, 0] == 101).all()  # BERT's [CLS]
    assert "stdlib corpus" in minilm.input_note and "tokenizer.json" in minilm.input_note
    assert (minilm.vocab_size, minilm.max_positions, minilm.n_heads) == (30522, 512, 12)
    out = minilm.forward()
    assert out.shape == (int(mask.sum()), 384)
    # padding is masked: each sentence alone gives the same hidden states at its tokens
    texts = O.text_pool(3)
    alone, _ = O.tokenize(texts, minilm.path, minilm.vocab_size, 20)
    with torch.no_grad():
        parts = [minilm.model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in alone]
    torch.testing.assert_close(out, torch.cat(parts), rtol=1e-10, atol=1e-10)


def test_text_comes_from_the_corpus_test_split():
    from headrank.models import corpus

    pool = O.text_pool(5)
    assert pool == corpus.sentences("test", 5, min_words=10)
    assert all(len(s.split()) >= 10 for s in pool)


def test_sequences_filter_short_and_truncate(minilm):
    s = minilm.sequences(4, max_tokens=12, min_tokens=12)
    assert len(s.ids) == 4 and all(len(i) == 12 for i in s.ids) and len(s.texts) == 4
    s2 = minilm.sequences(2, max_tokens=64, texts=["One.", "Two words here."])
    assert s2.texts == ["One.", "Two words here."] and len(s2.ids[0]) < len(s2.ids[1])


@pytest.mark.slow
def test_reinit_is_seeded_and_uses_the_architecture_initialiser(minilm):
    a, b, c = (minilm.reinit(s) for s in (5, 5, 6))
    w = "encoder.layer.0.attention.self.query.weight"
    sa, sb, sc = (m.state_dict()[w] for m in (a, b, c))
    assert torch.equal(sa, sb) and not torch.equal(sa, sc) and sa.dtype == torch.float64
    assert not torch.equal(sa, minilm.model.state_dict()[w])
    assert float(sa.std()) == pytest.approx(0.02, rel=0.05)  # BERT's initializer_range


def test_digits_images_are_the_one_digits_source():
    from headrank.models.data import digits_arrays

    x = O.digits_images(3, 16, 3)
    assert x.shape == (3, 3, 16, 16) and x.dtype == torch.float64
    img = digits_arrays()[0][:3]
    np.testing.assert_array_equal(x[:, 0, ::2, ::2].numpy(), img)  # nearest: each pixel doubled
    assert torch.equal(x[:, 0], x[:, 2])


def test_project_lm_gets_corpus_bytes(tmp_path):
    from headrank.models.transformer import ModelConfig, Transformer

    Transformer(ModelConfig(vocab_size=256, max_seq_len=32, n_layers=1, d_model=16, n_heads=2,
                            causal=False)).save_pretrained(tmp_path / "m")
    op = O.open_model(tmp_path / "m", n_inputs=3, max_tokens=24)
    assert op.kind == "headrank" and op.n_heads == 2 and op.max_positions == 32
    idx = op.inputs["idx"]
    assert idx.shape == (3, 24) and "UTF-8 bytes" in op.input_note  # no padding: one common length
    assert idx[0].tolist() == list(O.text_pool(1)[0].encode("utf-8"))[:24]
    assert op.forward().shape == (3, 24, 256)
    r = op.reinit(0)
    assert type(r).__name__ == "Transformer" and not torch.equal(r.tok_emb.weight, op.model.tok_emb.weight)


def test_project_vit_gets_digits(tmp_path):
    from headrank.models.transformer import ViT, ViTConfig

    ViT(ViTConfig(image_size=8, patch_size=4, channels=1, n_layers=1, d_model=16, n_heads=2)).save_pretrained(
        tmp_path / "v")
    op = O.open_model(tmp_path / "v", n_inputs=2)
    assert op.inputs["x"].shape == (2, 1, 8, 8) and "digits" in op.input_note
    assert op.forward().shape == (2, 10)


def test_recall_run_gets_its_task_sequences(tmp_path):
    from headrank.io.rundir import latest_checkpoint
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    cfg = recall_config(steps=2, n_layers=1, d_model=16, n_heads=2, n_pairs=2, n_keys=4, n_values=4,
                        batch_size=4, checkpoint_every=1, track_every=1, log_every=1)
    train(tmp_path / "run", cfg, device="cpu", tensorboard=False)
    op = O.open_model(tmp_path / "run", n_inputs=5, seed=3)
    assert op.path == latest_checkpoint(tmp_path / "run")
    assert op.inputs["idx"].shape == (5, 5) and "associative-recall" in op.input_note
    assert int(op.inputs["idx"].max()) < 8
    again = O.open_model(tmp_path / "run", n_inputs=5, seed=3)
    assert torch.equal(op.inputs["idx"], again.inputs["idx"])
    assert op.forward().shape[0] == 5


def test_no_inputs_and_user_errors(tmp_path):
    op = O.open_model("minilm", n_inputs=0)
    assert op.inputs == {}
    with pytest.raises(HeadRankError, match="n_inputs=0"):
        op.forward()
    with pytest.raises(HeadRankError, match="no such file"):
        O.open_model(tmp_path / "missing")
    bad = tmp_path / "t5"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(HeadRankError, match="cannot load"):
        O.open_model(bad)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(HeadRankError, match="without a complete checkpoint"):
        O.open_model(tmp_path / "run")
