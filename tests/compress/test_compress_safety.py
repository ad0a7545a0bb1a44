"""Safe by default (issue 45): a causal LM with a tokenizer is cut whitened unless told otherwise,
its calibration announced (with a cost) before it starts; ``--eval`` adds greedy generation, whose
agreement is checked against transformers' own ``generate``; a costly cut warns with numbers and
the next thing to try."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from headrank.cli import app
from headrank.compress import compress
from headrank.compress.safety import AGREEMENT_MIN, NEW_TOKENS, PROMPTS, judge
from tests.compress.test_compress_eval import _tiny_lm

SMALL = dict(n_eval=2, n_calib=2, seq_len=8)


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    path = tmp_path_factory.mktemp("safe") / "lm"
    _tiny_lm(path)
    return path


def test_a_causal_lm_is_whitened_by_default_and_announced_first(lm, tmp_path):
    events = []
    res = compress(str(lm), tmp_path / "a", rank=4, **SMALL, announce=lambda s: events.append(("announce", s)),
                   progress=lambda d, t, phase: events.append(("phase", phase)))
    assert res["whitened"] is True
    said = [i for i, e in enumerate(events) if e[0] == "announce"]
    calib = [i for i, e in enumerate(events) if e == ("phase", "calibrating")]
    assert said and calib and said[0] < calib[0]
    line = events[said[0]][1]
    assert "2 windows of 8 tokens" in line and "FLOP" in line and "--no-whiten" in line
    plain = compress(str(lm), tmp_path / "b", rank=4, whiten=False, **SMALL, announce=events.append)
    assert plain["whitened"] is False
    a = json.loads((tmp_path / "a" / "compress.json").read_text())
    assert a["whitened"] is True and a["units"] != json.loads((tmp_path / "b" / "compress.json").read_text())["units"]


def test_an_encoder_is_cut_plain_by_default(tmp_path):
    torch.manual_seed(0)
    m = tf.BertModel(tf.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                                   vocab_size=64, max_position_embeddings=32))
    m.save_pretrained(tmp_path / "bert")
    res = compress(str(tmp_path / "bert"), tmp_path / "o", rank=4)
    assert res["whitened"] is False and not any("whitening" in n for n in res["notes"])


def test_the_cli_prints_the_estimate_and_no_whiten_skips_it(lm, tmp_path):
    args = ["compress", str(lm), "--rank", "4", "--eval-n", "2", "--calib-n", "2", "--seq-len", "8"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0 and "note: calibrating the whitened cut" in r.output.replace("\n", " "), r.output
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b"), "--no-whiten"])
    assert r.exit_code == 0 and "calibrating the whitened cut" not in r.output, r.output


def _generate(model, tok, prompt: str) -> torch.Tensor:
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         pad_token_id=tok.pad_token_id, eos_token_id=None)
    return out[0, ids.shape[1]:]


def test_the_generation_check_is_transformers_greedy_generate(lm, tmp_path):
    res = compress(str(lm), tmp_path / "o", rank=2, evaluate=True, format="dense", **SMALL)
    g = res["eval"]["generation"]
    tok = tf.AutoTokenizer.from_pretrained(lm)
    uncut = tf.AutoModelForCausalLM.from_pretrained(lm, dtype=torch.float32).eval()
    cut = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "o", dtype=torch.float32).eval()
    same = total = 0
    for row, prompt in zip(g["prompts"], PROMPTS, strict=True):
        a, b = _generate(uncut, tok, prompt), _generate(cut, tok, prompt)
        assert row["uncut"] == tok.decode(a) and row["cut"] == tok.decode(b)
        same, total = same + int((a == b).sum()), total + NEW_TOKENS
    assert g["agreement"] == pytest.approx(same / total)
    assert json.loads((tmp_path / "o" / "compress.json").read_text())["eval"]["generation"]["agreement"] == \
        g["agreement"]


def _result(before, after, agreement, whitened, products=("ov", "qk")):
    return {"eval": {"metric": "perplexity", "before": before, "after": after, "generation": {"agreement": agreement}},
            "whitened": whitened, "products": list(products)}


def _run(kind="params", allocate="energy"):
    from headrank.compress import Rule

    return {"rule": Rule(kind, 0.5), "opts": {"allocate": allocate}}


def test_a_costly_cut_warns_with_its_numbers_and_the_next_thing_to_try():
    r = _result(36.48, 11970.0, 0.1, whitened=False)
    judge(r, _run())
    (w,) = r["warnings"]
    assert "36.48 -> 1.197e+04" in w and "328x" in w and "10%" in w and "whitened cut" in w
    r = _result(36.48, 60.0, 0.9, whitened=True, products=("ov",))
    judge(r, _run())
    (w,) = r["warnings"]
    assert "36.48 -> 60 (1.64x" in w and "agrees" not in w and "--params" in w
    assert "--allocate loss" not in w  # whitened, measured worse than the energy allocation (docs/compress.md)
    assert "--products ov" not in w
    r = _result(36.48, 50.0, AGREEMENT_MIN, whitened=True)  # 1.37x, agreement at the line: no warning
    judge(r, _run())
    assert "warnings" not in r


def test_a_gguf_baseline_is_keyed_by_its_file(tmp_path):
    """A GGUF is evaluated through the live model transformers loads (no files of its own): the
    uncut baseline's cache key comes from the GGUF file, so a second run reuses it."""
    from headrank.compress.options import _model_key

    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")

    class Live:
        origin = {"input": "gguf"}
        ckpt = type("C", (), {"path": "<live:LlamaForCausalLM>"})()
        source_file = f

    key = _model_key(Live())
    assert key is not None and str(f.resolve()) in key and key == _model_key(Live())
    f.write_bytes(b"GGUF2")  # another file: another key
    assert _model_key(Live()) != key
