"""`compress --allocate loss` (ASVD's rank search): every measured sensitivity is transformers'
own loss of the model with that one unit replaced by numpy's best rank-k product; the threshold
rule is checked against a brute-force search; the options follow the CLI's rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from headrank.cli import app
from headrank.compress import compress, cut_in_place
from headrank.compress.allocate import (
    CalibrationLoss,
    candidate_ranks,
    measure,
    threshold_ranks,
)
from headrank.compress.api import make_plan
from headrank.compress.evaluate import CALIB_SPLIT, TextSpec, token_windows
from headrank.compress.plan import Rule
from headrank.errors import HeadRankError
from headrank.io.sources import open_reader
from headrank.models import corpus

SPEC = TextSpec(n=3, seq_len=24)


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: a tiny model's forwards on a loaded shared machine (compress sets its own)."""
    from headrank.util.threads import torch_threads

    with torch_threads(1):
        yield


def tiny_llama(path, **cfg) -> None:
    """A small LLaMA (GQA, rotary) with a word-level tokenizer of the corpus' words (no download)."""
    n = _word_tokenizer(path)
    torch.manual_seed(0)
    c = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
             vocab_size=n, head_dim=8, max_position_embeddings=64)
    tf.LlamaForCausalLM(tf.LlamaConfig(**{**c, **cfg})).to(torch.float64).save_pretrained(path)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("lm")
    tiny_llama(path)
    return path


def _reference_loss(path, layer: int, unit: int, k: int, windows: torch.Tensor) -> float:
    """transformers' mean loss over the windows with unit ``unit`` of ``layer`` replaced by numpy's
    best rank-k approximation of its stacked OV products (the other units as they are)."""
    m = tf.LlamaForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    att = m.model.layers[layer].self_attn
    dh, g = att.head_dim, att.num_key_value_groups
    Wv = att.v_proj.weight.detach().numpy()  # (Hkv*dh, d)
    Wo = att.o_proj.weight.detach().numpy()  # (d, H*dh)
    rows = slice(unit * dh, (unit + 1) * dh)
    M = np.concatenate([Wo[:, h * dh:(h + 1) * dh] @ Wv[rows] for h in range(unit * g, (unit + 1) * g)])
    U, s, Vt = np.linalg.svd(M, full_matrices=False)
    with torch.no_grad():  # P_h' = U_k,h (padded), W_V' = S_k V_k^T (padded): the products are M_k's blocks
        v = np.zeros((dh, Wv.shape[1]))
        v[:k] = s[:k, None] * Vt[:k]
        att.v_proj.weight[rows] = torch.from_numpy(v)
        for j, h in enumerate(range(unit * g, (unit + 1) * g)):
            p = np.zeros((Wo.shape[0], dh))
            p[:, :k] = U[j * Wo.shape[0]:(j + 1) * Wo.shape[0], :k]
            att.o_proj.weight[:, h * dh:(h + 1) * dh] = torch.from_numpy(p)
        return _loss(m, windows)


def _loss(model, windows: torch.Tensor) -> float:
    """Mean next-token cross-entropy of transformers' float64 logits (its own ``labels`` loss
    upcasts to float32 only)."""
    with torch.no_grad():
        return sum(float(torch.nn.functional.cross_entropy(model(input_ids=w[None]).logits[0, :-1], w[1:]))
                   for w in windows) / len(windows)


@pytest.mark.slow
def test_measured_sensitivity_is_transformers_loss_with_that_unit_cut(lm_dir):
    model = tf.LlamaForCausalLM.from_pretrained(lm_dir, dtype=torch.float64).eval()
    tok = tf.AutoTokenizer.from_pretrained(lm_dir)
    reader = open_reader(model)
    plan = make_plan(reader, Rule("params", 0.5), ("ov",))
    score = CalibrationLoss(model, tok, SPEC)
    losses, base = measure(model, reader, plan, score, cut_in_place, reader.layout.modules)
    cands = candidate_ranks(8)
    assert cands == [1, 2, 3, 4, 5, 6, 7] and losses["ov"].shape == (3, 2, 7)
    windows = token_windows(tok, SPEC, CALIB_SPLIT)
    ref_base = _loss(model, windows)
    assert base == pytest.approx(ref_base, rel=1e-12)
    for layer, unit, c in [(0, 1, 2), (1, 0, 0), (2, 1, 5)]:  # layers 1, 2: the earlier layers are replayed
        ref = _reference_loss(lm_dir, layer, unit, cands[c], windows)
        assert float(losses["ov"][layer, unit, c]) == pytest.approx(ref, rel=1e-10)
    # the model is left as it was
    assert _loss(model, windows) == ref_base


def _word_tokenizer(path) -> int:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for s in corpus.sentences("train", 400) for w in s.split()})[:300]
    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tf.PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(path)
    return len(vocab)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_replayed_layers_give_the_full_forwards_losses(name, tmp_path):
    """Encoders (drift, tuple layer outputs) and GPT-2 (fused projections, tuple outputs): the
    sensitivities with the earlier layers replayed equal those of whole forwards."""
    n = _word_tokenizer(tmp_path)
    torch.manual_seed(0)
    if name == "bert":
        model = tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=48, vocab_size=n, max_position_embeddings=64))
    else:
        model = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=n, n_positions=64))
    model = model.to(torch.float64).eval()
    tok = tf.AutoTokenizer.from_pretrained(tmp_path)
    reader = open_reader(model)
    products = ("ov", "qk") if name == "bert" else ("qk",)
    plan = make_plan(reader, Rule("params", 0.5), products)
    score = CalibrationLoss(model, tok, TextSpec(n=6, seq_len=24))
    assert score.metric == ("cosine drift" if name == "bert" else "mean next-token NLL")
    a, base_a = measure(model, reader, plan, score, cut_in_place, reader.layout.modules)
    b, base_b = measure(model, reader, plan, score, cut_in_place, None)
    assert base_a == base_b and (name == "gpt2" or base_a == pytest.approx(0, abs=1e-12))
    for p in products:
        assert torch.equal(a[p], b[p]) and bool(torch.isfinite(a[p]).all())


def _brute(losses, cands, cost, dh, fraction):
    """Every measured loss as threshold, smallest first; the first whose allocation fits."""
    total = sum(v.shape[0] * v.shape[1] * dh * cost[p] for p, v in losses.items())
    for tau in sorted({float(x) for v in losses.values() for x in v.reshape(-1)}):
        ranks = {}
        for p, v in losses.items():
            r = torch.full(v.shape[:2], dh, dtype=torch.long)
            for i in range(v.shape[0]):
                for u in range(v.shape[1]):
                    ok = [k for k, x in zip(cands, v[i, u].tolist(), strict=True) if x <= tau]
                    r[i, u] = min(ok) if ok else dh
            ranks[p] = r
        if sum(int(r.sum()) * cost[p] for p, r in ranks.items()) <= fraction * total:
            return ranks, tau
    return None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_threshold_rule_is_the_brute_force_search(seed):
    g = torch.Generator().manual_seed(seed)
    cands, dh = [1, 2, 3, 5, 6], 8
    # losses fall with the rank, with noise (not always monotone, as measurements are not)
    losses = {p: (torch.rand(4, 3, 1, generator=g, dtype=torch.float64) * torch.linspace(1, 0.1, 5, dtype=torch.float64)
                  + 0.02 * torch.rand(4, 3, 5, generator=g, dtype=torch.float64)) for p in ("ov", "qk")}
    cost = {"ov": 30, "qk": 50}
    for fraction in (0.3, 0.5, 0.8):
        ranks, tau = threshold_ranks(losses, cands, cost, dh, fraction)
        ref, ref_tau = _brute(losses, cands, cost, dh, fraction)
        assert tau == ref_tau and all(torch.equal(ranks[p], ref[p]) for p in losses)


def test_threshold_rule_refuses_a_budget_below_the_smallest_candidates():
    losses = {"ov": torch.tensor([[[3.0, 2.0], [3.0, 2.0]]], dtype=torch.float64)}
    with pytest.raises(HeadRankError, match="`params` 0.1 is below what `allocate` loss can reach"):
        threshold_ranks(losses, [2, 4], {"ov": 1}, 8, 0.1)


@pytest.mark.slow
def test_allocate_loss_end_to_end(lm_dir, tmp_path):
    res = compress(str(lm_dir), tmp_path / "o", params=0.5, products="ov", allocate="loss", n_eval=3, seq_len=24,
                   evaluate=True)
    a = res["allocation"]
    assert a["method"] == "loss" and a["candidates"] == [1, 2, 3, 4, 5, 6, 7] and "3 windows of 24" in a["calibration"]
    assert res["totals"]["kept_fraction_of_cut_products"] <= 0.5
    for u in res["units"]:  # each unit: the smallest candidate within the threshold, else uncut
        ok = [k for k, x in zip(a["candidates"], u["calibration_loss"], strict=True) if x <= a["threshold"]]
        assert u["k"] == (min(ok) if ok else 8)
    assert math.isfinite(res["eval"]["after"])
    assert any("allocated by measured loss" in line for line in res.lines())


@pytest.mark.parametrize("kw, msg", [
    ({"rank": 2, "allocate": "loss"}, "`allocate` loss spends a global budget: give `params`"),
    ({"params": 0.5, "allocate": "fisher"}, "`allocate` must be one of energy, loss"),
])
def test_allocate_arguments_follow_the_cli_rules(lm_dir, tmp_path, kw, msg):
    with pytest.raises(HeadRankError, match=msg) as e:
        compress(str(lm_dir), tmp_path / "o", **kw)
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()


def test_allocate_loss_without_a_budget_is_one_cli_line(lm_dir, tmp_path):
    r = CliRunner().invoke(app, ["compress", str(lm_dir), "--out", str(tmp_path / "o"), "--rank", "2",
                                 "--allocate", "loss"])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert "--allocate loss spends a global budget: give --params" in r.output
    assert not (tmp_path / "o").exists()
