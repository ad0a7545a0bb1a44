"""Parameter groups: every parameter in exactly one group with the right λ, on the project's
models and on Hugging Face models of several architectures; the decay is really applied."""

import pytest
import torch
import torch.nn as nn
import transformers as tf

from headrank.errors import HeadRankError
from headrank.io.layouts import AttentionReader
from headrank.io.live import LiveCheckpoint
from headrank.models.transformer import ModelConfig, Transformer, ViT, ViTConfig
from headrank.training.optim import adamw, param_groups

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=61)
HF = {
    "bert": lambda: tf.BertModel(tf.BertConfig(**SMALL)),
    "bert_mlm_tied": lambda: tf.BertForMaskedLM(tf.BertConfig(**SMALL)),
    "distilbert": lambda: tf.DistilBertModel(tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                                                  vocab_size=61)),
    "gpt2_tied": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=61,
                                                          n_positions=32)),
    "gpt_neox": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**SMALL)),
    "llama_gqa": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL, num_key_value_heads=2)),
    "opt": lambda: tf.OPTForCausalLM(tf.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                  ffn_dim=48, vocab_size=61, word_embed_proj_dim=32)),
    "bloom": lambda: tf.BloomModel(tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, vocab_size=61)),
    "falcon": lambda: tf.FalconModel(tf.FalconConfig(**SMALL, new_decoder_architecture=True, num_kv_heads=2)),
    "phi": lambda: tf.PhiModel(tf.PhiConfig(**SMALL)),
    "phi3_fused": lambda: tf.Phi3Model(tf.Phi3Config(**SMALL, num_key_value_heads=2, pad_token_id=0)),
}
WD, ATTN_WD, EMB_WD = 0.1, 0.0, 0.05


def reference_roles(model: nn.Module, config: dict) -> dict[str, str]:
    """Expected group of every parameter, from independent sources: attention weights from the
    layout table (the one the analyser uses), embeddings from module types, no_decay by ndim."""
    reader = AttentionReader(LiveCheckpoint(model, config))
    attn = {n for i in range(reader.dims.n_layers) for n in reader.tensor_names(i).values()}
    modules = dict(model.named_modules(remove_duplicate=False))
    roles: dict[int, set[str]] = {}
    first: dict[int, tuple[str, nn.Parameter]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owner = modules[name.rsplit(".", 1)[0]] if "." in name else model
        role = ("attn" if name in attn else
                "embedding" if isinstance(owner, nn.Embedding) or name in ("cls_token", "pos_emb") else "decay")
        roles.setdefault(id(p), set()).add(role)
        first.setdefault(id(p), (name, p))
    out = {}
    for pid, (name, p) in first.items():  # precedence over tied aliases: ndim<2, attn, embedding, decay
        r = roles[pid]
        out[name] = ("no_decay" if p.ndim < 2 else "attn" if "attn" in r
                     else "embedding" if "embedding" in r else "decay")
    return out


def check_groups(model: nn.Module, config: dict) -> None:
    groups = param_groups(model, WD, ATTN_WD, embedding_weight_decay=EMB_WD)
    lam = {"attn": ATTN_WD, "embedding": EMB_WD, "decay": WD, "no_decay": 0.0}
    seen: dict[int, str] = {}
    for g in groups:
        assert g["weight_decay"] == lam[g["name"]]
        assert len(g["params"]) == len(g["param_names"])
        for p in g["params"]:
            assert id(p) not in seen, "a parameter is in two groups"
            seen[id(p)] = g["name"]
    unique = {id(p): p for p in model.parameters()}
    assert set(seen) == set(unique), "every parameter lands in exactly one group"
    got = {r["name"]: r["group"] for r in groups.records()}
    assert got == reference_roles(model, config)
    assert any(v == "attn" for v in got.values())
    # the summary names every parameter once
    text = groups.summary()
    for name in got:
        assert f"    {name}  " in text


@pytest.mark.parametrize("arch", sorted(HF))
def test_hf_models_every_parameter_in_exactly_one_right_group(arch):
    torch.manual_seed(0)
    model = HF[arch]()
    check_groups(model, model.config.to_dict())


def test_tied_weights_are_one_parameter_with_the_embedding_lambda():
    torch.manual_seed(0)
    gpt2 = HF["gpt2_tied"]()
    g = param_groups(gpt2, WD, ATTN_WD, embedding_weight_decay=EMB_WD)
    rec = g.by_name()
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight
    assert rec["lm_head.weight"] is rec["transformer.wte.weight"]
    assert rec["lm_head.weight"]["group"] == "embedding" and rec["lm_head.weight"]["weight_decay"] == EMB_WD
    assert "lm_head.weight" in rec["transformer.wte.weight"]["aliases"]
    assert "tied: lm_head.weight" in g.summary()
    # the untied LM head of LLaMA is an ordinary matrix
    llama = HF["llama_gqa"]()
    assert param_groups(llama, WD, ATTN_WD).weight_decay_of("lm_head.weight") == WD


@pytest.mark.parametrize("kw", [dict(), dict(tie_embeddings=True, bias=True), dict(n_kv_heads=2, mlp=False)])
def test_project_transformer_groups(kw):
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=20, max_seq_len=8, n_layers=2, d_model=16, n_heads=4, **kw))
    check_groups(m, m.config_dict())


def test_project_vit_groups():
    torch.manual_seed(0)
    v = ViT(ViTConfig(image_size=8, patch_size=4, n_layers=2, d_model=16, n_heads=2))
    check_groups(v, v.config_dict())
    rec = param_groups(v, WD, ATTN_WD).by_name()
    assert rec["cls_token"]["group"] == rec["pos_emb"]["group"] == "embedding"
    assert rec["patch_emb.weight"]["group"] == "decay"


def test_decay_is_really_applied_per_group():
    """With zero gradients AdamW only decays: p ← p·(1 − lr·λ_group), exactly."""
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=20, max_seq_len=8, n_layers=2, d_model=16, n_heads=4, bias=True))
    lr = 0.5
    opt = adamw(m, lr=lr, weight_decay=0.2, attn_weight_decay=0.6, embedding_weight_decay=0.4)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    expect = {"attn": 0.6, "embedding": 0.4, "decay": 0.2, "no_decay": 0.0}
    roles = {r["name"]: r["group"] for r in param_groups(m, 0.2, 0.6, embedding_weight_decay=0.4).records()}
    assert set(roles.values()) == set(expect)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.detach(), before[n] * (1 - lr * expect[roles[n]]), rtol=0, atol=1e-7)


def test_multihead_attention_and_custom_patterns():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(8, 2)
            self.mixer = nn.Linear(8, 8)
            self.ff = nn.Linear(8, 8)

    net = Net()
    rec = param_groups(net, 0.1, 0.0).by_name()
    assert rec["mha.in_proj_weight"]["group"] == rec["mha.out_proj.weight"]["group"] == "attn"
    assert rec["mha.in_proj_bias"]["group"] == "no_decay" and rec["ff.weight"]["group"] == "decay"
    rec = param_groups(net, 0.1, 0.0, attn_patterns=[r"^mixer\."]).by_name()
    assert rec["mixer.weight"]["group"] == "attn" and rec["mixer.bias"]["group"] == "no_decay"
    assert rec["mha.in_proj_weight"]["group"] == "decay"


def test_no_attention_found_is_an_error_not_a_silent_no_op():
    mlp = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(HeadRankError, match="no attention projection"):
        param_groups(mlp, 0.1, 0.0)
    g = param_groups(mlp, 0.1, 0.1)  # same λ everywhere: nothing to split, fine
    assert [x["name"] for x in g] == ["decay", "no_decay"]


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_lambdas_are_user_errors(bad):
    with pytest.raises(HeadRankError):
        param_groups(nn.Linear(2, 2), bad)


def test_frozen_parameters_are_left_out():
    m = Transformer(ModelConfig(vocab_size=20, max_seq_len=8, n_layers=1, d_model=16, n_heads=4))
    m.tok_emb.weight.requires_grad_(False)
    g = param_groups(m, 0.1, 0.0)
    assert g.frozen == ["tok_emb.weight"] and "tok_emb.weight" not in g.by_name()
    assert "frozen" in g.summary()


def test_hf_trainer_integration_in_two_lines(tmp_path):
    pytest.importorskip("accelerate")
    from headrank.training.optim import AttnDecayTrainer

    torch.manual_seed(0)
    model = HF["gpt2_tied"]()
    ids = torch.randint(0, 61, (4, 8))
    data = [{"input_ids": r, "labels": r} for r in ids]
    args = tf.TrainingArguments(output_dir=str(tmp_path), weight_decay=0.1, learning_rate=1e-3, max_steps=2,
                                per_device_train_batch_size=2, report_to=[], use_cpu=True, save_strategy="no",
                                logging_strategy="no")
    trainer = AttnDecayTrainer(model=model, args=args, train_dataset=data, attn_weight_decay=0.0)
    opt = trainer.create_optimizer()
    by_name = {g["name"]: g for g in opt.param_groups}
    assert by_name["attn"]["weight_decay"] == 0.0 and by_name["decay"]["weight_decay"] == 0.1
    assert by_name["embedding"]["weight_decay"] == 0.1 and by_name["no_decay"]["weight_decay"] == 0.0
    assert by_name["attn"]["lr"] == pytest.approx(1e-3)
    assert trainer.attn_param_groups.weight_decay_of("transformer.h.1.attn.c_attn.weight") == 0.0
    before = model.transformer.h[0].attn.c_attn.weight.detach().clone()
    trainer.train()
    assert not torch.equal(before, model.transformer.h[0].attn.c_attn.weight)
    assert getattr(trainer.optimizer, "optimizer", trainer.optimizer) is opt  # accelerate wraps it
