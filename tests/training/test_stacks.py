"""One optimizer factory in every training stack: the Hugging Face Trainer (``optimizers=`` and
``optimizer_cls_and_kwargs=``), TRL's SFTTrainer, Lightning, Accelerate and a plain loop, each
with QK and OV decays that differ. After a step the optimizer's groups must hold exactly the
layout's Q and K (resp. V and O) tensors with their decay, and the exposure must be λ·Σlr."""

import pytest
import torch
import transformers as tf

import headrank
from headrank.io.layouts import AttentionReader
from headrank.io.live import LiveCheckpoint

WD, QK_WD, OV_WD, LR = 0.1, 0.3, 0.02, 1e-3
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, vocab_size=61, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def tiny_llama() -> tf.LlamaForCausalLM:
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL))


def sides_from_layout(model) -> dict[str, str]:
    """The expected side of every attention weight, from the layout table (an independent source)."""
    reader = AttentionReader(LiveCheckpoint(model, model.config.to_dict()))
    side = {"q": "attn_qk", "k": "attn_qk", "v": "attn_ov", "o": "attn_ov"}
    return {n: side[r] for i in range(reader.dims.n_layers) for r, n in reader.tensor_names(i).items()}


def check_groups(opt, model, prefix: str = "", steps: int = 1, lr: float = LR) -> None:
    inner = opt
    while getattr(inner, "optimizer", None) is not None:  # accelerate's and Lightning's wrappers
        inner = inner.optimizer
    where = {id(p): (g["name"], g["weight_decay"]) for g in inner.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    expected = sides_from_layout(model)
    assert len(expected) == 8
    for name, side in expected.items():
        assert where[id(params[prefix + name])] == (side, QK_WD if side == "attn_qk" else OV_WD), name
    qk = [g for g in inner.param_groups if g["name"] == "attn_qk"][0]
    assert {id(p) for p in qk["params"]} == {id(params[prefix + n]) for n, s in expected.items() if s == "attn_qk"}
    assert where[id(params[prefix + "model.layers.0.mlp.up_proj.weight"])] == ("decay", WD)
    exp = headrank.decay_exposure(opt)
    assert exp["attn_qk"] == pytest.approx(QK_WD * lr * steps) and exp["attn_ov"] == pytest.approx(OV_WD * lr * steps)
    assert exp["no_decay"] == 0.0


def make_optimizer(model):
    return headrank.optimizer(model, lr=LR, weight_decay=WD, qk_weight_decay=QK_WD, ov_weight_decay=OV_WD)


def batches(n=4, seq=8):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 61, (n, seq), generator=g)
    return [{"input_ids": r, "labels": r} for r in ids]


def hf_args(tmp_path, **kw):
    return tf.TrainingArguments(output_dir=str(tmp_path), learning_rate=LR, max_steps=1, per_device_train_batch_size=2,
                                report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                                lr_scheduler_type="constant", **kw)


def test_plain_loop_and_decay_really_differs():
    model = tiny_llama()
    opt = make_optimizer(model)
    q, v = model.model.layers[0].self_attn.q_proj.weight, model.model.layers[0].self_attn.v_proj.weight
    q0, v0 = q.detach().clone(), v.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # a zero gradient: the step is the decay alone
    opt.step()
    assert torch.allclose(q, q0 * (1 - LR * QK_WD), rtol=0, atol=1e-7)
    assert torch.allclose(v, v0 * (1 - LR * OV_WD), rtol=0, atol=1e-7)
    check_groups(opt, model)


def test_hugging_face_trainer_through_optimizers(tmp_path):
    model = tiny_llama()
    opt = make_optimizer(model)
    trainer = tf.Trainer(model=model, args=hf_args(tmp_path), train_dataset=batches(), optimizers=(opt, None),
                         callbacks=[headrank.RankCallback(every=1)])
    trainer.train()
    check_groups(trainer.optimizer, model)
    cb = [c for c in trainer.callback_handler.callbacks if isinstance(c, headrank.RankCallback)][0]
    assert cb.rows[-1]["exposure"]["attn_qk"] == pytest.approx(QK_WD * LR)
    assert cb.rows[0]["exposure"]["attn_qk"] == 0.0
    logged = [h for h in trainer.state.log_history if "rank/exposure/attn_ov" in h]
    assert logged and logged[-1]["rank/exposure/attn_ov"] == pytest.approx(OV_WD * LR)
    assert "rank/qk/effective_rank" in logged[-1]


def test_hugging_face_trainer_through_optimizer_cls_and_kwargs(tmp_path):
    model = tiny_llama()
    cls_kwargs = headrank.hf_optimizer_cls_and_kwargs(model, lr=LR, weight_decay=WD, qk_weight_decay=QK_WD,
                                                      ov_weight_decay=OV_WD)
    trainer = tf.Trainer(model=model, args=hf_args(tmp_path), train_dataset=batches(),
                         optimizer_cls_and_kwargs=cls_kwargs, callbacks=[headrank.RankCallback(every=1)])
    trainer.train()
    check_groups(trainer.optimizer, model)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, **{f"w{i}": i for i in range(4, 61)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]",
                                      unk_token="[UNK]")


def test_trl_sft_trainer(tmp_path):
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    model = tiny_llama()
    opt = make_optimizer(model)
    texts = [" ".join(f"w{4 + (i * 7 + j) % 57}" for j in range(10)) for i in range(4)]
    args = trl.SFTConfig(output_dir=str(tmp_path), learning_rate=LR, max_steps=1, per_device_train_batch_size=2,
                         report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                         lr_scheduler_type="constant", max_length=16)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": texts}),
                             processing_class=tiny_tokenizer(), optimizers=(opt, None))
    trainer.train()
    check_groups(trainer.optimizer, model)


def test_accelerate():
    from accelerate import Accelerator

    model = tiny_llama()
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, make_optimizer(model))
    for b in batches(2):
        loss = model(input_ids=b["input_ids"][None], labels=b["labels"][None]).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    check_groups(opt, acc.unwrap_model(model), steps=2)


def test_lightning_configure_optimizers_and_callback(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import CSVLogger

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = tiny_llama()

        def training_step(self, batch, i):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return make_optimizer(self)

    module = Module()
    cb = headrank.RankLightningCallback(every=1)
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=CSVLogger(str(tmp_path)), callbacks=[cb],
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(batches(), batch_size=2))
    check_groups(trainer.optimizers[0], module.model, steps=2)
    assert [r["step"] for r in cb.rows] == [0, 1, 2]
    assert cb.rows[-1]["exposure"]["attn_qk"] == pytest.approx(2 * QK_WD * LR)
    import csv

    rows = list(csv.DictReader(open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv")))
    assert any(r.get("rank/exposure/attn_ov") for r in rows) and any(r.get("rank/ov/effective_rank") for r in rows)


def test_fused_qkv_with_two_decays_names_attn_patterns():
    model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=61, n_positions=16))
    with pytest.raises(headrank.HeadRankError, match="attn_patterns") as e:
        make_optimizer(model)
    assert "\n" not in str(e.value) and "c_attn" in str(e.value)
    # placing the fused tensor by name is the way out
    g = headrank.param_groups(model, WD, qk_weight_decay=QK_WD, ov_weight_decay=OV_WD,
                              attn_patterns={"qk": [r"c_attn"], "ov": [r"attn\.c_proj"]})
    assert g.weight_decay_of("transformer.h.0.attn.c_attn.weight") == QK_WD
    assert g.weight_decay_of("transformer.h.0.attn.c_proj.weight") == OV_WD
    # the same decay on both sides needs no split
    assert headrank.param_groups(model, WD, qk_weight_decay=0.0, ov_weight_decay=0.0).weight_decay_of(
        "transformer.h.0.attn.c_attn.weight") == 0.0


def test_mla_query_path_is_qk_and_the_key_value_latent_is_refused():
    cfg = tf.DeepseekV3Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                              moe_intermediate_size=16, vocab_size=61, q_lora_rank=16, kv_lora_rank=16,
                              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4,
                              num_experts_per_tok=2, first_k_dense_replace=1, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2)
    model = tf.DeepseekV3ForCausalLM(cfg)
    rec = headrank.param_groups(model, WD, 0.0).by_name()  # all five MLA projections are attention
    attn = sorted(n for n, r in rec.items() if r["group"] == "attn")
    assert [n.split(".")[-2] for n in attn] == ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_a_proj", "q_b_proj"]
    with pytest.raises(headrank.HeadRankError, match="kv_a_proj_with_mqa.*attn_patterns"):
        headrank.param_groups(model, WD, qk_weight_decay=QK_WD, ov_weight_decay=OV_WD)


def test_bad_decays_are_one_line():
    model = tiny_llama()
    for bad in (-1, float("nan"), "0.1", True):
        with pytest.raises(headrank.HeadRankError, match="qk_weight_decay"):
            headrank.param_groups(model, WD, qk_weight_decay=bad)
    with pytest.raises(headrank.HeadRankError, match="'qv'"):
        headrank.param_groups(model, WD, qk_weight_decay=0.2, attn_patterns={"qv": ["x"]})


def test_attn_decay_trainer_still_works_and_warns(tmp_path):
    model = tiny_llama()
    with pytest.warns(DeprecationWarning, match="optimizers="):
        trainer = headrank.AttnDecayTrainer(model=model, args=hf_args(tmp_path, weight_decay=WD),
                                            train_dataset=batches(), qk_weight_decay=QK_WD, ov_weight_decay=OV_WD)
    trainer.train()
    check_groups(trainer.optimizer, model)
