"""The latent KV cache (`load_compressed(..., latent_kv=True)`): its logits are the dense output's
(the real Hugging Face forward of the same-architecture checkpoint) to float64 round-off, a greedy
`generate` through it gives the dense model's tokens and logits, and its cache holds exactly the
kept dimensions compress.json reports; architectures it does not fit say why."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

from headrank.compress import compress, load_compressed
from headrank.compress.latent import STATUS, cache_bytes, cache_kwarg, latent_cache
from headrank.errors import HeadRankError

# the same autouse fixtures as the allocation tests (a private baseline cache, one torch thread)
from tests.compress.test_compress_allocate import _baseline_cache, _one_thread, tiny_llama  # noqa: F401

IDS = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38], [2, 71, 82, 81, 82, 84, 59, 4, 5, 23]])
BASE = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
            vocab_size=97, head_dim=8, tie_word_embeddings=True)
MODELS = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(attention_bias=True)),  # GQA, rotary, q/k/v/o biases
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),  # q/k/v biases, no output bias: v bias refitted
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {}),  # q/k norms: OV only
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=5)),  # a masked window, full cache
    # layer 1 a sliding layer whose cache keeps only the window
    "qwen2-sliding": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(use_sliding_window=True, sliding_window=5,
                                                                max_window_layers=1)),
}
SLOW = pytest.mark.slow


def _save(name: str, path) -> None:
    cfg_cls, cls, extra = MODELS[name]
    torch.manual_seed(0)
    m = cls(cfg_cls(**BASE, **extra))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    m.to(torch.float64).save_pretrained(path)


def _expected_numbers(res, layers=None) -> int:
    """Numbers the latent cache holds per token (in ``layers``, default all): per layer and kv
    head, the kept value dimensions (the OV k) and key dimensions (the QK k where QK is cut, else
    the head dim)."""
    c = res["config"]
    k = {(u["layer"], u["kv_head"], u["product"]): u["k"] for u in res["units"]}
    return sum(k.get((i, u, "ov"), c["head_dim"]) + k.get((i, u, "qk"), c["head_dim"])
               for i in (range(c["n_layers"]) if layers is None else layers) for u in range(c["n_kv_heads"]))


@pytest.mark.parametrize("name, kw", [
    ("llama", {"params": 0.5}),  # OV ranks per unit, QK by whole rotary bands: keys and values latent
    pytest.param("llama", {"rank": 3, "products": "ov"}, marks=SLOW),  # one rank: one attention call per layer
    pytest.param("qwen2", {"params": 0.4, "products": "ov"}, marks=SLOW),
    pytest.param("qwen3", {"params": 0.5}, marks=SLOW),
    pytest.param("mistral", {"params": 0.5}, marks=SLOW),
    pytest.param("qwen2-sliding", {"params": 0.5, "products": "ov"}, marks=SLOW),
])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_latent_cache_gives_the_dense_outputs_logits_and_tokens(name, kw, impl, tmp_path):
    _save(name, tmp_path / "src")
    fac = compress(str(tmp_path / "src"), tmp_path / "f", **kw)
    compress(str(tmp_path / "src"), tmp_path / "d", format="dense", **kw)
    ref = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "d", dtype=torch.float64, attn_implementation=impl).eval()
    got = load_compressed(tmp_path / "f", latent_kv=True, attn_implementation=impl)
    assert getattr(got, STATUS) is True and got.config._attn_implementation == f"headrank_latent_{impl}"
    with torch.no_grad():
        a, b = ref(input_ids=IDS).logits, got(input_ids=IDS).logits
    assert torch.allclose(b, a, rtol=0, atol=1e-12 * a.abs().max())
    kw_gen = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    cache, ref_cache = latent_cache(got), tf.DynamicCache(config=ref.config)
    r = ref.generate(IDS, **kw_gen, **{cache_kwarg(ref): ref_cache})
    g = got.generate(IDS, **kw_gen, **{cache_kwarg(got): cache})
    assert torch.equal(g.sequences, r.sequences)
    for x, y in zip(g.logits, r.logits, strict=True):
        assert torch.allclose(x, y, rtol=0, atol=1e-12 * y.abs().max())
    # per layer, the tokens the reference's cache holds: 10 prompt + 8 generated - 1, a sliding layer its window - 1
    held = [layer.keys.shape[-2] for layer in ref_cache.layers]
    assert held == {"mistral": [4, 4], "qwen2-sliding": [17, 4]}.get(name, [17, 17])
    assert cache_bytes(cache) == sum(_expected_numbers(fac, [i]) * n for i, n in enumerate(held)) * IDS.shape[0] * 8


def test_latent_cache_is_smaller_and_the_plain_cache_still_works(tmp_path):
    """The same model with transformers' own DynamicCache: the same tokens, the uncut cache size."""
    _save("llama", tmp_path / "src")
    fac = compress(str(tmp_path / "src"), tmp_path / "f", params=0.5)
    got = load_compressed(tmp_path / "f", latent_kv=True)
    dense = tf.DynamicCache(config=got.config)
    latent = latent_cache(got)
    a = got.generate(IDS[:1], max_new_tokens=5, do_sample=False, pad_token_id=0, **{cache_kwarg(got): dense})
    b = got.generate(IDS[:1], max_new_tokens=5, do_sample=False, pad_token_id=0, **{cache_kwarg(got): latent})
    assert torch.equal(a, b)
    c = fac["config"]
    assert cache_bytes(dense) == 2 * c["n_layers"] * c["n_kv_heads"] * c["head_dim"] * 14 * 8
    assert cache_bytes(latent) == _expected_numbers(fac) * 14 * 8 < cache_bytes(dense)


def test_an_encoder_and_an_old_manifest_say_why_not(tmp_path):
    torch.manual_seed(0)
    tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                               vocab_size=50, max_position_embeddings=16)).save_pretrained(tmp_path / "b")
    compress(str(tmp_path / "b"), tmp_path / "bf", rank=3)
    enc = load_compressed(tmp_path / "bf", latent_kv=True)
    assert getattr(enc, STATUS) == "not a causal LM: no KV cache to shrink"
    with pytest.raises(HeadRankError, match="no latent KV cache for this model: not a causal LM"):
        latent_cache(enc)
    _save("llama", tmp_path / "src")
    compress(str(tmp_path / "src"), tmp_path / "f", rank=3, products="ov")
    man = tmp_path / "f" / "factored.json"
    m = json.loads(man.read_text())
    for e in m["modules"].values():
        del e["role"]
    man.write_text(json.dumps(m))
    old = load_compressed(tmp_path / "f", latent_kv=True)
    assert "names no projection roles" in getattr(old, STATUS)
    assert old.config._attn_implementation in ("sdpa", "eager")  # left as it was
    with torch.no_grad():
        old(input_ids=IDS)


@pytest.mark.slow
def test_compress_eval_measures_the_kv_cache_of_a_generate(tmp_path):
    tiny_llama(tmp_path / "lm")
    res = compress(str(tmp_path / "lm"), tmp_path / "f", params=0.5, products="ov", evaluate=True, n_eval=2,
                   seq_len=24)
    kv = res["kv_cache"]
    assert kv["latent"] is True and res["totals"]["kv_cache_measured"] == "measured: see kv_cache"
    m = kv["measured"]
    assert m["same_tokens"] and m["dtype"] == "float32" and m["tokens_cached"] == 16 + 8 - 1
    assert m["bytes_per_token"] == _expected_numbers(res) * 4
    assert m["uncut_bytes_per_token"] == 2 * 3 * 2 * 8 * 4
    assert any("measured by a generate with the latent cache" in line for line in res.lines())
    dense = compress(str(tmp_path / "lm"), tmp_path / "d", params=0.5, products="ov", format="dense")
    assert dense["kv_cache"]["measured"] == "factored deployment, not measured"
    assert dense["totals"]["kv_cache_measured"] == "factored deployment, not measured"
    plain = compress(str(tmp_path / "lm"), tmp_path / "p", params=0.5, products="ov")
    assert "not tried here" in plain["kv_cache"]["latent"]


def test_an_attention_that_bypasses_the_interface_leaves_the_model_as_it_was(tmp_path, monkeypatch):
    """A module that does not call transformers' attention interface (simulated: LLaMA's lookup
    always answers its own eager function): the probe finds it, the model is put back and still
    gives the dense output's logits."""
    from transformers.models.llama import modeling_llama

    class Fixed:
        def get_interface(self, name, default):
            return modeling_llama.eager_attention_forward

    _save("llama", tmp_path / "src")
    compress(str(tmp_path / "src"), tmp_path / "f", params=0.5, products="ov")
    compress(str(tmp_path / "src"), tmp_path / "d", params=0.5, products="ov", format="dense")
    monkeypatch.setattr(modeling_llama, "ALL_ATTENTION_FUNCTIONS", Fixed())
    got = load_compressed(tmp_path / "f", latent_kv=True, attn_implementation="eager")
    assert isinstance(getattr(got, STATUS), str) and got.config._attn_implementation == "eager"
    assert not any(hasattr(m, "headrank_latent") for m in got.modules())
    ref = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "d", dtype=torch.float64, attn_implementation="eager")
    with torch.no_grad():
        a, b = ref(input_ids=IDS).logits, got(input_ids=IDS).logits
    assert torch.allclose(b, a, rtol=0, atol=1e-12 * a.abs().max())
