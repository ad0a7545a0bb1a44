"""Every verb and option that loads a model, run as users run it: a subprocess whose interpreter
has imported nothing (pytest imports transformers before any test, which hides an import racing
the main thread's use of it: ``--eval`` once failed with "module 'transformers' has no attribute
'AutoConfig'" in every fresh interpreter and in none of the in-process tests).

Tiny random models with a word-level tokenizer, a few tokens each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers as tf

from tests.compress.test_compress_eval import _tiny_lm

HEADRANK = str(Path(sys.executable).with_name("headrank"))
LLAMA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
             head_dim=8, max_position_embeddings=64)
SMALL = ["--eval-n", "2", "--calib-n", "2", "--seq-len", "8"]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "COV_"))}
    env.update(HEADRANK_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(args: list[str], tmp_path: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    r = subprocess.run(args, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "no attribute" not in r.stderr, r.stderr[-2000:]
    return r


def _py(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-c", textwrap.dedent(code)], tmp_path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A Llama (separate q, k, v, o: the factored format, whose choice asks transformers) with a
    word-level tokenizer of the corpus' words."""
    path = tmp_path_factory.mktemp("fresh") / "tiny llama"  # a space in the path, as users have
    _tiny_lm(path)  # the tokenizer (and a GPT-2 we replace)
    for f in path.glob("model*.safetensors"):
        f.unlink()
    vocab = len(json.loads((path / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(0)
    tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA, vocab_size=vocab)).save_pretrained(path)
    return path


@pytest.mark.parametrize("opts", [["--rank", "4", "--eval"], ["--rank", "4", "--whiten"],
                                  ["--params", "0.5", "--allocate", "loss"]],
                         ids=["eval", "whiten", "allocate-loss"])
def test_cli_compress_options_that_load_the_model(llama, tmp_path, opts):
    _run([HEADRANK, "compress", str(llama), "--out", "out", *opts, *SMALL, "-q"], tmp_path)
    assert (tmp_path / "out" / "compress.json").is_file()


def test_cli_curve(llama, tmp_path):
    _run([HEADRANK, "compress", str(llama), "--out", "curve", "--curve", "1,0.5", *SMALL, "-q"], tmp_path)
    assert (tmp_path / "curve" / "compress_curve.json").is_file()


def test_python_compress_evaluate_then_load_compressed(llama, tmp_path):
    r = _py(f"""
        import headrank
        res = headrank.compress({str(llama)!r}, "out", rank=4, evaluate=True, n_eval=2, seq_len=8)
        print(res["eval"]["metric"])
        from headrank.compress import load_compressed
        m = load_compressed("out")
        print(type(m).__name__)
    """, tmp_path)
    assert r.stdout.split() == ["perplexity", "LlamaForCausalLM"]


def test_load_compressed_alone(llama, tmp_path):
    from headrank.compress import compress

    compress(str(llama), tmp_path / "out", rank=4)
    r = _py("""
        from headrank.compress import load_compressed
        import torch
        m = load_compressed("out")
        print(m(torch.tensor([[1, 2, 3]])).logits.shape[-1] > 0)
    """, tmp_path)
    assert r.stdout.split() == ["True"]


def test_python_compress_whiten(llama, tmp_path):
    r = _py(f"""
        import headrank
        res = headrank.compress({str(llama)!r}, "out", rank=4, whiten=True, n_calib=2, seq_len=8)
        print("whitened" in str(res["totals"]) or bool(res["units"]))
    """, tmp_path)
    assert r.stdout.split() == ["True"]


def test_train_then_track_cli_and_python(tmp_path):
    tiny = ["--d-model", "16", "--n-heads", "2", "--n-layers", "1",
            "--batch-size", "8", "--device", "cpu", "--log", "none"]
    _run([HEADRANK, "train", "recall", "--out", "run", "--steps", "2", "--checkpoint-every", "1",
          "--keep-checkpoints", "all", *tiny, "-q"], tmp_path)
    _run([HEADRANK, "track", "run", "--out", "series", "--workers", "1", "-q"], tmp_path)
    assert (tmp_path / "series" / "table.csv").is_file()
    r = _py("""
        import headrank
        res = headrank.track("run", "series2", workers=1)
        print(len(res.table) > 0)
    """, tmp_path)
    assert r.stdout.split() == ["True"]


@pytest.mark.slow
def test_the_issue_example_minilm_eval(tmp_path):
    """docs/compress.md's first example, which crashed in every fresh interpreter."""
    _run([HEADRANK, "compress", "minilm", "--out", "X", "--params", "0.5", "--products", "ov", "--eval",
          "--eval-n", "8", "-q"], tmp_path)
    assert json.loads((tmp_path / "X" / "compress.json").read_text())["eval"]["metric"] == "cosine_drift"
