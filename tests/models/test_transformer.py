"""The project's transformer: layout seen by the analyser, switches, save/load, ViT."""

import math

import pytest
import torch

from headrank import analyze
from headrank.errors import HeadRankError
from headrank.models.transformer import (
    MLP,
    Block,
    ModelConfig,
    Transformer,
    ViT,
    ViTConfig,
    load_model,
)


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=11, max_seq_len=9, n_layers=2, d_model=16, n_heads=4, head_dim=4)
    return ModelConfig(**{**base, **kw})


def test_state_dict_names_and_config_match_the_layout_row(tmp_path):
    torch.manual_seed(0)
    m = Transformer(tiny(n_heads=4, n_kv_heads=2, head_dim=6))
    keys = set(m.state_dict())
    for i in range(2):
        for r in "qkvo":
            assert f"blocks.{i}.attn.{r}.weight" in keys
    assert m.blocks[0].attn.q.weight.shape == (24, 16)
    assert m.blocks[0].attn.k.weight.shape == (12, 16)
    assert m.blocks[0].attn.o.weight.shape == (16, 24)
    m.save_pretrained(tmp_path)
    res = analyze(tmp_path)
    assert res.meta["model_type"] == "headrank"
    assert res.meta["config"] == {**res.meta["config"], "n_layers": 2, "d_model": 16, "n_heads": 4,
                                  "n_kv_heads": 2, "head_dim": 6}
    # independent reference: dense SVD of W_K,hᵀ W_Q,h and P_h W_V,h of layer 1, head 3 (kv head 1)
    a = m.blocks[1].attn
    wq, wk = a.q.weight.detach().double().reshape(4, 6, 16)[3], a.k.weight.detach().double().reshape(2, 6, 16)[1]
    wv, p = a.v.weight.detach().double().reshape(2, 6, 16)[1], a.o.weight.detach().double().reshape(16, 4, 6)[:, 3, :]
    t = res.table.set_index(["layer", "head", "product"])
    for prod, mat in (("qk", wk.T @ wq), ("ov", p @ wv)):
        sv = torch.linalg.svdvals(mat)
        assert t.loc[(1, 3, prod), "nuclear"] == pytest.approx(float(sv.sum()), rel=1e-9)
        assert t.loc[(1, 3, prod), "sv_max"] == pytest.approx(float(sv[0]), rel=1e-9)


def test_attention_matches_an_explicit_softmax_reference():
    torch.manual_seed(1)
    for causal in (True, False):
        m = Transformer(tiny(causal=causal, n_kv_heads=2))
        att = m.blocks[0].attn
        x = torch.randn(3, 7, 16)
        B, T, _ = x.shape
        q = att.q(x).view(B, T, 4, 4).transpose(1, 2)
        k = att.k(x).view(B, T, 2, 4).transpose(1, 2).repeat_interleave(2, 1)
        v = att.v(x).view(B, T, 2, 4).transpose(1, 2).repeat_interleave(2, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(4)
        if causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        ref = att.o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, 16))
        torch.testing.assert_close(att(x), ref, rtol=1e-5, atol=1e-6)
        probs = att.attention_probs(x)
        torch.testing.assert_close(probs, s.softmax(-1))


def test_causal_model_does_not_see_the_future_and_bidirectional_does():
    torch.manual_seed(2)
    x = torch.randint(0, 11, (2, 9))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 11
    causal = Transformer(tiny(causal=True))
    assert torch.equal(causal(x)[:, :-1], causal(y)[:, :-1])
    bidi = Transformer(tiny(causal=False))
    assert not torch.allclose(bidi(x)[:, 0], bidi(y)[:, 0])


def test_switches_change_the_computation_as_documented():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 16)
    # no skip, pre-norm: the block is f(N(x)) composed; with skip: x + f(N(x))
    cfg = tiny(skip=False, mlp=False)
    b = Block(cfg)
    torch.testing.assert_close(b(x), b.attn(b.attn_norm(x)))
    cfg = tiny(skip=True, mlp=True)
    b = Block(cfg)
    h = x + b.attn(b.attn_norm(x))
    torch.testing.assert_close(b(x), h + b.mlp(b.mlp_norm(h)))
    # post-norm: N(x + f(x))
    b = Block(tiny(norm="post", mlp=False))
    torch.testing.assert_close(b(x), b.attn_norm(x + b.attn(x)))
    # no norm at all
    b = Block(tiny(norm="none", mlp=False))
    assert isinstance(b.attn_norm, torch.nn.Identity) and b.mlp is None
    torch.testing.assert_close(b(x), x + b.attn(x))
    assert isinstance(MLP(16, 32), torch.nn.Module)
    # no learned positions: a permutation-equivariant bidirectional model
    m = Transformer(tiny(learned_positions=False, causal=False))
    assert m.pos_emb is None
    idx = torch.randint(0, 11, (1, 6))
    perm = torch.randperm(6)
    torch.testing.assert_close(m(idx)[:, perm], m(idx[:, perm]), rtol=1e-5, atol=1e-6)


def test_hidden_states_and_tied_embeddings_round_trip(tmp_path):
    torch.manual_seed(4)
    m = Transformer(tiny(tie_embeddings=True, bias=True))
    assert m.head.weight is m.tok_emb.weight
    idx = torch.randint(0, 11, (2, 9))
    logits, hidden = m(idx, return_hidden=True)
    assert len(hidden) == 3 and hidden[0].shape == (2, 9, 16)
    m.save_pretrained(tmp_path)
    m2 = load_model(tmp_path)
    assert m2.head.weight is m2.tok_emb.weight
    torch.testing.assert_close(m2(idx), logits)


@pytest.mark.parametrize("bad", [dict(d_model=10, n_heads=4, head_dim=None), dict(n_heads=4, n_kv_heads=3),
                                 dict(norm="sandwich"), dict(n_layers=0)])
def test_bad_configs_raise_one_clear_error(bad):
    with pytest.raises(HeadRankError):
        tiny(**bad)


def test_too_long_input_is_a_user_error():
    m = Transformer(tiny())
    with pytest.raises(HeadRankError, match="max_seq_len"):
        m(torch.zeros(1, 10, dtype=torch.long))


def test_vit_shapes_layout_and_round_trip(tmp_path):
    torch.manual_seed(5)
    cfg = ViTConfig(image_size=8, patch_size=4, channels=3, n_classes=5, n_layers=2, d_model=16, n_heads=2)
    v = ViT(cfg)
    imgs = torch.randn(3, 3, 8, 8)
    out = v(imgs)
    assert out.shape == (3, 5)
    # patchify: patch (0, 1) of image 0 is the top-right 4x4 block, channels first
    patches = v.patchify(imgs)
    assert patches.shape == (3, 4, 48)
    torch.testing.assert_close(patches[0, 1], imgs[0, :, 0:4, 4:8].reshape(-1))
    v.save_pretrained(tmp_path)
    res = analyze(tmp_path)
    assert len(res.table) == 2 * 2 * 2
    v2 = load_model(tmp_path)
    assert isinstance(v2, ViT)
    torch.testing.assert_close(v2(imgs), out)
    with pytest.raises(HeadRankError):
        ViTConfig(image_size=10, patch_size=4)
