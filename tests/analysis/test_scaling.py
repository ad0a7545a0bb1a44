"""Scale invariance (headrank.analysis.scaling): constructed networks whose invariances are known
by hand (and ones known to break them), the attention pair symmetries on real models of several
layouts (aliases included), and the `scale` command."""

import json
import math

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from headrank.analysis.scaling import (
    analyze_scaling,
    classify_outputs,
    norm_eps_zero,
    pair_symmetries,
    parse_group,
    parse_scales,
    scale_test,
)
from headrank.cli import app
from headrank.errors import HeadRankError


@pytest.fixture(scope="module", autouse=True)
def _float64_one_thread():
    # the constructed networks below are float64; small matrices: a second thread only adds
    # synchronisation, and on a shared 2-core machine oversubscription slows these tests several-fold
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)


def X(n=32, d=8, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def verdicts(model, x, **kw):
    t = scale_test(model, lambda: model(x), **kw)
    return t.set_index("name")


# ---------------------------------------------------------------- the classifier itself


def test_classify_outputs_known_functions():
    y0 = torch.randn(50, generator=torch.Generator().manual_seed(1))
    z = torch.randn(50, generator=torch.Generator().manual_seed(2))
    cs = (0.3, 1.7, 4.1)
    inv = classify_outputs(y0, {c: y0.clone() for c in cs})
    assert inv["verdict"] == "invariant" and inv["inv_dev"] == 0.0
    hom = classify_outputs(y0, {c: c**2 * y0 for c in cs})
    assert hom["verdict"] == "homogeneous" and abs(hom["k"] - 2) < 1e-12 and hom["hom_dev"] < 1e-14
    frac = classify_outputs(y0, {c: c**0.5 * y0 for c in cs})
    assert frac["verdict"] == "homogeneous" and abs(frac["k"] - 0.5) < 1e-12
    aff = classify_outputs(y0, {c: c * y0 + z for c in cs})  # affine in c: neither
    assert aff["verdict"] == "neither" and aff["inv_dev"] > 0.1 and aff["hom_dev"] > 0.1
    mixed = classify_outputs(y0, {0.3: 0.3 * y0, 1.7: 1.7**2 * y0, 4.1: 4.1 * y0})  # no single k
    assert mixed["verdict"] == "neither" and mixed["k_spread"] > 0.5
    bad = classify_outputs(y0, {c: torch.full_like(y0, float("nan")) for c in cs})
    assert bad["verdict"] == "neither" and math.isinf(bad["inv_dev"])
    with pytest.raises(HeadRankError):
        classify_outputs(torch.zeros(5), {2.0: torch.zeros(5)})


def test_parse_options():
    assert parse_scales("0.3, 1.7,4.1") == (0.3, 1.7, 4.1)
    for bad in ("1", "0,2", "-1", "a,b", "inf", ""):
        with pytest.raises(HeadRankError):
            parse_scales(bad)
    assert parse_group("emb=a.*,b") == ("emb", ["a.*", "b"])
    for bad in ("emb", "=a", "emb="):
        with pytest.raises(HeadRankError):
            parse_group(bad)


# ---------------------------------------------------------------- constructed networks


def test_linear_then_layernorm_is_invariant_in_the_linear_weight():
    torch.manual_seed(0)
    ln = nn.LayerNorm(16)
    with torch.no_grad():
        ln.bias.normal_()  # β ≠ 0: then γ alone is neither
    m = nn.Sequential(nn.Linear(8, 16, bias=False), ln)
    t = verdicts(m, X())
    assert t.loc["0.weight", "verdict"] == "invariant"
    assert t.loc["0.weight", "inv_dev"] < 1e-14
    assert t.loc["0.weight", "perturb_dev"] > 0.1  # it does matter: not merely unused
    assert t.loc["1.weight", "verdict"] == "neither"  # γ n + β with β ≠ 0: affine in γ
    assert t.loc["1.bias", "verdict"] == "neither"
    # with the real ε = 1e-5 the invariance is inexact, more so when W is small
    big = t.loc["0.weight", "inv_dev_eps"]
    assert 0 < big < 1e-3
    with torch.no_grad():
        m[0].weight.mul_(1e-2)
    small = verdicts(m, X()).loc["0.weight", "inv_dev_eps"]
    assert small > 100 * big


def test_layernorm_gain_without_shift_is_1_homogeneous_and_zero_shift_is_zero():
    m = nn.Sequential(nn.Linear(8, 16, bias=False), nn.LayerNorm(16))  # β = 0 at init
    t = verdicts(m, X())
    assert t.loc["1.weight", "verdict"] == "homogeneous" and abs(t.loc["1.weight", "k"] - 1) < 1e-10
    assert t.loc["1.bias", "verdict"] == "zero"


def test_relu_net_without_norm_is_1_homogeneous_in_each_layer_and_L_in_all():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 16, bias=False), nn.ReLU(),
                      nn.Linear(16, 4, bias=False))
    t = verdicts(m, X(), groups={"all": ["*.weight"]})
    for n in ("0.weight", "2.weight", "4.weight"):
        assert t.loc[n, "verdict"] == "homogeneous", t.loc[n]
        assert abs(t.loc[n, "k"] - 1) < 1e-10 and t.loc[n, "hom_dev"] < 1e-12
    assert t.loc["all", "verdict"] == "homogeneous" and abs(t.loc["all", "k"] - 3) < 1e-10


def test_biases_break_homogeneity_of_the_weight_alone_but_not_of_weight_and_bias():
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4, bias=False))
    with torch.no_grad():
        m[0].bias.normal_()
    t = verdicts(m, X(), groups={"layer0": ["0.weight", "0.bias"]})
    assert t.loc["0.weight", "verdict"] == "neither"
    assert t.loc["layer0", "verdict"] == "homogeneous" and abs(t.loc["layer0", "k"] - 1) < 1e-10


class Residual(nn.Module):
    """One block of the given form around f(u) = ReLU(W u) on width d."""

    def __init__(self, form: str, d: int = 8, embed: bool = False):
        super().__init__()
        self.form = form
        self.E = nn.Linear(d, d, bias=False) if embed else None
        self.W = nn.Linear(d, d, bias=False)
        self.norm = nn.LayerNorm(d)
        self.final = nn.LayerNorm(d)

    def forward(self, x):
        h = self.E(x) if self.E is not None else x
        f = lambda u: torch.relu(self.W(u))  # noqa: E731
        if self.form == "none":
            return self.norm(f(h))
        if self.form == "article_post":  # x + LN(f(x)): the article's post-norm
            return h + self.norm(f(h))
        if self.form == "transformer_post":  # LN(x + f(x)): post-LN transformers
            return self.norm(h + f(h))
        if self.form == "pre":  # x + f(LN(x)), final norm
            return self.final(h + f(self.norm(h)))
        raise ValueError(self.form)


@pytest.mark.parametrize("form, expected", [("none", "invariant"), ("article_post", "invariant"),
                                            ("transformer_post", "neither"), ("pre", "neither")])
def test_residual_forms(form, expected):
    torch.manual_seed(3)
    m = Residual(form)
    t = verdicts(m, X())
    assert t.loc["W.weight", "verdict"] == expected
    if expected == "neither":
        assert t.loc["W.weight", "inv_dev"] > 1e-3


def test_prenorm_from_a_bias_free_embedding_is_jointly_invariant():
    """The pre-norm break needs something unscaled in the stream: when the stream starts at a
    decayed bias-free embedding, scaling embedding and W together is invariant (h → ch)."""
    torch.manual_seed(4)
    m = Residual("pre", embed=True)
    t = verdicts(m, X(), groups={"E+W": ["E.weight", "W.weight"]})
    assert t.loc["E.weight", "verdict"] == "neither"
    assert t.loc["W.weight", "verdict"] == "neither"
    assert t.loc["E+W", "verdict"] == "invariant" and t.loc["E+W", "inv_dev"] < 1e-14


def test_unused_parameter_is_no_effect_not_invariant():
    torch.manual_seed(5)

    class WithSpare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(8, 4, bias=False)
            self.spare = nn.Linear(3, 3)  # never called

        def forward(self, x):
            return self.used(x)

    m = WithSpare()
    t = verdicts(m, X())
    assert t.loc["spare.weight", "verdict"] == "no effect"
    assert t.loc["used.weight", "verdict"] == "homogeneous"


def test_parameters_are_restored_exactly():
    torch.manual_seed(6)
    m = Residual("pre", embed=True)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    verdicts(m, X(), groups={"all": ["*"]})
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_norm_eps_zero_restores_and_finds_hf_style_norms():
    class MyRMSNorm(nn.Module):  # a Hugging Face style norm: variance_epsilon attribute
        def __init__(self):
            super().__init__()
            self.variance_epsilon = 1e-6

    m = nn.Sequential(nn.LayerNorm(4, eps=1e-5), MyRMSNorm())
    with norm_eps_zero(m) as found:
        assert m[0].eps == 0.0 and m[1].variance_epsilon == 0.0
        assert len(found) == 2
    assert m[0].eps == 1e-5 and m[1].variance_epsilon == 1e-6


# ---------------------------------------------------------------- attention pair symmetries


@pytest.mark.slow
def test_minilm_pairs_hold_and_controls_do_not(minilm_dir):
    from headrank.io.layouts import layout_for
    from headrank.models.opener import open_model

    probe = open_model("minilm")
    pairs, extra = pair_symmetries(probe.model, probe.forward, layout_for(probe.config), probe.config,
                                   scales=(0.3, 4.1))
    assert len(pairs) == 6 * 12 * 2
    assert pairs["rerun_dev"].max() == 0.0
    assert pairs["pair_dev"].max() < 1e-13
    assert pairs["one_sided_dev"].min() > 1e-5  # scaling one side changes the attention output
    assert extra["whole_model_qk"] < 1e-13 and extra["whole_model_ov"] < 1e-13
    assert extra["wrong_partner_qk_layer0"] > 1e-3  # the right rows were found, not any rows
    # a few tensors known by hand: BERT's key bias adds q·b_K, constant over keys → softmax cancels it;
    # the three embedding tables feed one LayerNorm → invariant together, not alone
    t = scale_test(probe.model, probe.forward,
                   names=["encoder.layer.0.attention.self.key.bias", "encoder.layer.0.attention.self.query.weight",
                          "embeddings.word_embeddings.weight"],
                   groups={"emb": ["embeddings.*_embeddings.weight"]}).set_index("name")
    assert t.loc["encoder.layer.0.attention.self.key.bias", "verdict"] == "no effect"
    assert t.loc["encoder.layer.0.attention.self.query.weight", "verdict"] == "neither"
    assert t.loc["embeddings.word_embeddings.weight", "verdict"] == "neither"
    assert t.loc["emb", "verdict"] == "invariant"


def _save_hf(tmp_path, name, config):
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    path = tmp_path / name
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig

    tmp = tmp_path_factory.mktemp("hf")
    return {
        "gpt2": _save_hf(tmp, "gpt2", GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32)),
        "neox": _save_hf(tmp, "neox", GPTNeoXConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                                    intermediate_size=64, vocab_size=64,
                                                    max_position_embeddings=32)),
        "llama_gqa": _save_hf(tmp, "llama", LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                                        num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                                        max_position_embeddings=32)),
    }


@pytest.mark.parametrize("name, kv_heads", [("gpt2", 4), ("neox", 4), ("llama_gqa", 2)])
def test_pair_symmetries_on_fused_interleaved_and_gqa_layouts(hf_dirs, name, kv_heads):
    res = analyze_scaling(hf_dirs[name], scales=(0.3, 4.1))
    p = res.pairs
    assert len(p) == 2 * kv_heads * 2
    assert p["pair_dev"].max() < 1e-12, p
    assert p["one_sided_dev"].min() > 1e-6
    assert res.meta["pairs"]["whole_model_qk"] < 1e-12 and res.meta["pairs"]["whole_model_ov"] < 1e-12
    assert res.meta["pairs"]["wrong_partner_qk_layer0"] > 1e-6
    assert "no tokenizer.json" in res.meta["inputs"]  # corpus sentences as UTF-8 bytes modulo the vocabulary


def test_live_vit_found_through_layout_aliases(tmp_path):
    """A transformers-5 ViT names its attention layers.{i}.attention.q_proj in memory: the layout
    row's alias, which AttentionReader resolves; the pair symmetries are found through it."""
    from transformers import ViTConfig

    from headrank.analysis.scaling import attention_sites
    from headrank.io.layouts import layout_for
    from headrank.models.opener import open_model

    path = _save_hf(tmp_path, "vit", ViTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                               intermediate_size=64, image_size=8, patch_size=4, num_channels=1))
    probe = open_model(path)
    sites, dims = attention_sites(probe.model, layout_for(probe.config), probe.config)
    names = {n for n, _ in probe.model.named_parameters()}
    assert len(sites) == dims.n_layers == 2
    for s in sites:
        assert set(s.weights.values()) <= names and s.biases  # resolved names, q/k/v biases found
        probe.model.get_submodule(s.module_name)  # the module path derived from them exists
    res = analyze_scaling(path, scales=(0.3, 4.1))
    assert len(res.pairs) == 2 * 4 * 2 and res.pairs["pair_dev"].max() < 1e-12
    assert res.pairs["one_sided_dev"].min() > 1e-6


# ---------------------------------------------------------------- the project's own model


def _headrank_dir(tmp_path, **cfg):
    from headrank.models.transformer import ModelConfig, Transformer

    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=16, max_seq_len=9, n_layers=2, d_model=32, n_heads=4, **cfg))
    with torch.no_grad():  # a little larger than the 0.02 init, so activations are not tiny
        for p in m.parameters():
            if p.dim() > 1:
                p.mul_(10)
    return m.save_pretrained(tmp_path / "m")


def test_project_model_post_norm_without_skip_known_verdicts(tmp_path):
    """x ← N(f(x)): f is linear in W_V, W_O and the MLP's output matrix, so each is invariant;
    W_Q, W_K (softmax temperature) and the MLP's input matrix (GELU) are not; the head is linear."""
    res = analyze_scaling(_headrank_dir(tmp_path, norm="post", skip=False), pairs=True)
    t = res.table.set_index("name")
    for i in range(2):
        for n in ("attn.v.weight", "attn.o.weight", "mlp.proj.weight"):
            assert t.loc[f"blocks.{i}.{n}", "verdict"] == "invariant", (i, n)
        for n in ("attn.q.weight", "attn.k.weight", "mlp.fc.weight"):
            assert t.loc[f"blocks.{i}.{n}", "verdict"] == "neither", (i, n)
    assert t.loc["head.weight", "verdict"] == "homogeneous" and abs(t.loc["head.weight", "k"] - 1) < 1e-9
    assert res.pairs["pair_dev"].max() < 1e-12


def test_project_model_pre_norm_residual_breaks_invariance_and_gqa_pairs(tmp_path):
    res = analyze_scaling(_headrank_dir(tmp_path, n_kv_heads=2))  # default: pre-norm with skips
    t = res.table.set_index("name")
    for i in range(2):
        for n in ("attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight", "mlp.proj.weight"):
            assert t.loc[f"blocks.{i}.{n}", "verdict"] == "neither", (i, n)
    assert t.loc["head.weight", "verdict"] == "homogeneous"
    assert t.loc["final_norm.weight", "verdict"] == "homogeneous"  # logits = head(γ ⊙ n), no bias
    assert len(res.pairs) == 2 * 2 * 2 and res.pairs["pair_dev"].max() < 1e-12
    assert res.meta["kind"] == "headrank"


def test_training_run_directory_uses_newest_checkpoint_and_task_inputs(tmp_path):
    from headrank.training.config import recall_config
    from headrank.training.loop import train

    cfg = recall_config(steps=2, n_layers=1, d_model=16, n_heads=2, n_pairs=2, n_keys=4, n_values=4,
                        batch_size=4, checkpoint_every=1, track_every=1, log_every=1)
    run = tmp_path / "run"
    train(run, cfg, device="cpu", tensorboard=False)
    res = analyze_scaling(run, pairs=True)
    assert "associative-recall" in res.meta["inputs"]
    assert res.pairs["pair_dev"].max() < 1e-12


# ---------------------------------------------------------------- CLI


@pytest.mark.slow
def test_cli_scale_json_and_out(tmp_path, hf_dirs):
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["scale", str(hf_dirs["gpt2"]), "--json", "--out", str(out),
                                 "--group", "emb=wte.weight,wpe.weight", "--scales", "0.3,4.1"])
    assert r.exit_code == 0, r.output
    payload = json.loads(r.stdout)
    assert sum(payload["counts"].values()) == len([t for t in payload["tensors"] if t["kind"] == "tensor"])
    names = {t["name"]: t for t in payload["tensors"]}
    # GPT-2 is pre-norm: the embeddings start the residual stream, which carries them unscaled past
    # every LayerNorm, so (unlike BERT's embeddings, which feed one LayerNorm) they are not invariant
    assert names["emb"]["verdict"] == "neither" and names["emb"]["members"] == 2
    assert payload["pair_summary"]["qk"]["pair_dev_max"] < 1e-12
    for f in ("tensors.csv", "pairs.csv", "meta.json", "scale_tensors.png", "scale_pairs.png"):
        assert (out / f).exists(), f
    r2 = CliRunner().invoke(app, ["scale", str(hf_dirs["gpt2"]), "--no-pairs", "--scales", "0.3"])
    assert r2.exit_code == 0 and "tensors:" in r2.stdout


@pytest.mark.parametrize("args, needle", [
    (["scale", "/nonexistent/dir"], "no such file"),
    (["scale", "minilm", "--scales", "1"], "scale factors"),
    (["scale", "minilm", "--group", "x"], "--group"),
    (["scale", "minilm", "--group", "x=nomatch*", "--no-pairs"], "no parameter matches"),
    (["scale", "minilm", "--tol", "0", "--no-pairs"], "--tol"),
    (["scale", "minilm", "--threads", "0"], "threads"),
])
def test_cli_scale_user_errors_exit_2(args, needle):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_cli_scale_unsupported_directory_exit_2(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    r = CliRunner().invoke(app, ["scale", str(tmp_path)])
    assert r.exit_code == 2 and "cannot load" in r.output
