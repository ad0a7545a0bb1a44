"""`compress --eval` and the whitened cut: the reported cost is the one re-measured from the
written checkpoint by an independent route (sentence-transformers' encoder; transformers' own
LM loss); the whitened cut is numpy's best rank-k of ``M L`` mapped back by ``L⁻¹``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from headrank.cli import app
from headrank.compress import TextSpec, compress, cost_curve
from headrank.compress.cut import cut_unit
from headrank.models import corpus


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    """The uncut baselines these tests measure are cached here, not in the user's cache."""
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


def test_whitened_cut_is_the_dense_best_rank_k_of_the_whitened_product():
    g = torch.Generator().manual_seed(0)
    Hkv, gsz, d, dh, k = 2, 3, 20, 6, 3
    X = torch.randn(Hkv, gsz * d, dh, generator=g, dtype=torch.float64)
    S = torch.randn(Hkv, d, dh, generator=g, dtype=torch.float64)
    A = torch.randn(d, 3 * d, generator=g, dtype=torch.float64)
    L = torch.linalg.cholesky(A @ A.mT / (3 * d))
    for product in ("ov", "qk"):
        c = cut_unit(X, S, torch.full((Hkv,), k), product, L)
        Ln = L.numpy()
        for u in range(Hkv):
            M = (X[u] @ S[u].mT).numpy()
            if product == "ov":  # min ||(M - M_k) L||: best rank-k of M L, times L^-1
                W = M @ Ln
                U, s, Vt = np.linalg.svd(W)
                ref = (U[:, :k] * s[:k]) @ Vt[:k] @ np.linalg.inv(Ln)
            else:  # min ||blockdiag(L^T) (M - M_k) L||: each head's block whitened on both sides
                T = np.kron(np.eye(gsz), Ln.T)
                U, s, Vt = np.linalg.svd(T @ M @ Ln)
                ref = np.linalg.solve(T, (U[:, :k] * s[:k]) @ Vt[:k]) @ np.linalg.inv(Ln)
            got = (c.X[u] @ c.S[u].mT).numpy()
            assert np.abs(got - ref).max() <= 1e-9 * np.abs(ref).max()
            assert float(c.err[u]) == pytest.approx(np.linalg.norm(M - got), rel=1e-9)


@pytest.mark.slow
def test_minilm_drift_is_the_one_sentence_transformers_measures(minilm_dir, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    res = compress("minilm", tmp_path / "o", rank=16, evaluate=True, n_eval=16, format="dense")
    e = res["eval"]
    assert e["metric"] == "cosine_drift" and e["before"] == pytest.approx(0, abs=1e-12)
    texts = corpus.sentences("test", 16, min_words=6)
    a = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, convert_to_tensor=True).double()
    b = st.SentenceTransformer(str(tmp_path / "o"), device="cpu").encode(texts, convert_to_tensor=True).double()
    ref = float((1 - torch.nn.functional.cosine_similarity(a, b)).mean())
    assert e["after"] == pytest.approx(ref, rel=1e-3, abs=1e-6)
    assert 0 < e["after"] < 1


def _tiny_lm(path, n_positions: int = 64, n_layer: int = 2, n_head: int = 4):
    """A small GPT-2 with a word-level tokenizer of the corpus' own words (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for s in corpus.sentences("train", 400) for w in s.split()})[:500]
    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tf.PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(path)
    torch.manual_seed(0)
    m = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=n_layer, n_head=n_head, vocab_size=len(vocab),
                                           n_positions=n_positions))
    m.save_pretrained(path)


@pytest.mark.slow
def test_lm_perplexity_is_the_one_transformers_loss_gives(tmp_path):
    _tiny_lm(tmp_path / "lm")
    res = compress(str(tmp_path / "lm"), tmp_path / "o", rank=2, evaluate=True, n_eval=4, seq_len=32)
    e = res["eval"]
    assert e["metric"] == "perplexity" and e["before"] != e["after"]
    tok = tf.AutoTokenizer.from_pretrained(tmp_path / "o")
    m = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "o").eval()
    ids: list[int] = []
    for s in corpus.sentences("test", 160, min_words=6):
        ids += tok(s + "\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= 4 * 32:
            break
    w = torch.tensor(ids[:128]).reshape(4, 32)
    with torch.no_grad():
        losses = [float(m(input_ids=x[None], labels=x[None]).loss) for x in w]
    assert e["after"] == pytest.approx(math.exp(sum(losses) / 4), rel=1e-5)


@pytest.mark.slow
def test_cost_curve_whitening_and_budgets(tmp_path):
    _tiny_lm(tmp_path / "lm")
    rows = cost_curve(str(tmp_path / "lm"), [1.0, 0.5], spec=TextSpec(n=4, seq_len=32))
    by = {(r["method"], r["budget"]): r for r in rows}
    base = by[("none", 1.0)]["cost"]
    for m in ("weight", "whitened"):
        assert by[(m, 1.0)]["cost"] == pytest.approx(base, rel=1e-5)  # full budget: the same model
        assert by[(m, 0.5)]["kept"] <= 0.5


def test_whiten_option_writes_a_whitened_cut(tmp_path):
    """--whiten end to end: calibrated on the validation split; in weight space its error can only
    be larger than the Eckart-Young cut's (which is optimal there), per unit."""
    _tiny_lm(tmp_path / "lm")
    w = compress(str(tmp_path / "lm"), tmp_path / "w", rank=2, whiten=True, n_eval=4, seq_len=32)
    p = compress(str(tmp_path / "lm"), tmp_path / "p", rank=2, whiten=False)
    assert w["whitened"] and not p["whitened"]
    for a, b in zip(w["units"], p["units"], strict=True):
        assert (a["layer"], a["kv_head"], a["product"]) == (b["layer"], b["kv_head"], b["product"])
        assert a["frob_error"] >= b["frob_error"] * (1 - 1e-9)
    assert any(a["frob_error"] > b["frob_error"] * 1.01 for a, b in zip(w["units"], p["units"], strict=True))


def _text_file(path, lines: int = 60) -> str:
    sents = corpus.sentences("train", lines, min_words=6)
    path.write_text("\n".join(sents) + "\n")
    return str(path)


def test_protocol_windows_progress_and_cached_baseline(tmp_path, monkeypatch):
    """--text with the SVD-LLM/Palu windows: the second half scored in consecutive windows from its
    start, the first half calibrating; every phase reports progress; the uncut score is cached."""
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "cache"))
    _tiny_lm(tmp_path / "lm")
    text = _text_file(tmp_path / "t.txt")
    seen: list[str] = []
    kw = dict(rank=2, whiten=True, evaluate=True, text=text, n_eval=3, n_calib=5, seq_len=16,
              progress=lambda d, t, phase: seen.append(phase))
    res = compress(str(tmp_path / "lm"), tmp_path / "o", **kw)
    assert {"loading", "calibrating", "spectra", "cutting", "writing", "evaluating uncut", "evaluating cut"} <= set(seen)
    e = res["eval"]
    assert not e["before_cached"] and "3 windows of 16 tokens" in e["text"]
    tok = tf.AutoTokenizer.from_pretrained(tmp_path / "lm")
    lines = [ln for ln in open(text).read().splitlines() if ln.strip()]
    ids = torch.tensor(tok("\n\n".join(lines[len(lines) // 2:]))["input_ids"][: 3 * 16]).reshape(3, 16)
    m = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "lm").eval()
    with torch.no_grad():
        losses = [float(m(input_ids=x[None], labels=x[None]).loss) for x in ids]
    assert e["before"] == pytest.approx(math.exp(sum(losses) / 3), rel=1e-5)
    again = compress(str(tmp_path / "lm"), tmp_path / "o", **kw)
    assert again["eval"]["before_cached"] and again["eval"]["before"] == e["before"]


@pytest.mark.slow
def test_the_papers_protocol_sizes_run_with_a_small_text(tmp_path):
    """--seq-len 2048 --eval-n 64 --calib-n 256 with --text: as many evaluation windows as the text
    holds, 256 calibration windows at random offsets. One layer of one head: the sizes are what is
    tested, and eager attention over 256 windows of 2048 tokens costs 8x more with 2 layers of 4."""
    _tiny_lm(tmp_path / "lm", n_positions=2048, n_layer=1, n_head=1)
    text = _text_file(tmp_path / "t.txt", lines=1200)
    r = CliRunner().invoke(app, ["compress", str(tmp_path / "lm"), "--out", str(tmp_path / "o"), "--rank", "2",
                                 "--whiten", "--eval", "--text", text, "--seq-len", "2048", "--eval-n", "64",
                                 "--calib-n", "256", "--json"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["eval"]
    assert "of 2048 tokens" in e["text"] and math.isfinite(e["after"])


@pytest.mark.parametrize("args, msg", [
    (["--seq-len", "65", "--eval"], "exceeds the model's context of 64 tokens"),
    (["--dataset", "wikitext2", "--eval", "--seq-len", "32"], "give the text with --text"),
    (["--text", "missing.txt", "--eval", "--seq-len", "32"], "no such file"),
])
def test_protocol_bad_input_is_one_line(tmp_path, monkeypatch, args, msg):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _tiny_lm(tmp_path / "lm")
    r = CliRunner().invoke(app, ["compress", str(tmp_path / "lm"), "--out", str(tmp_path / "o"), "--rank", "2", *args])
    assert r.exit_code == 2 and msg in r.output and r.output.count("\n") == 1, r.output
    assert not (tmp_path / "o").exists()


def test_curve_option_draws_and_matches_cost_curve(tmp_path):
    _tiny_lm(tmp_path / "lm")
    r = CliRunner().invoke(app, ["compress", str(tmp_path / "lm"), "--out", str(tmp_path / "c"), "--curve", "1,0.5",
                                 "--eval-n", "4", "--seq-len", "32", "-q"])
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "c" / "compress_curve.json").read_text())
    rows = next(iter(data.values()))["rows"]
    ref = cost_curve(str(tmp_path / "lm"), [1.0, 0.5], spec=TextSpec(n=4, seq_len=32))
    assert [(x["method"], x["budget"], x["cost"]) for x in rows] == [(x["method"], x["budget"], x["cost"]) for x in ref]
    assert (tmp_path / "c" / "compress_curve.png").stat().st_size > 0

