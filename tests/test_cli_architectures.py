"""``headrank architectures``: the list of model types with their status, the counts, --check."""

import json
import os
import subprocess
import sys

import pytest

from headrank.analysis.discover import known_types
from headrank.analysis.discover_seq2seq import seq2seq_types


def run(*args, env=None):
    e = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200", **(env or {}))
    return subprocess.run([sys.executable, "-m", "headrank", *args], capture_output=True, text=True, env=e,
                          timeout=300)


def test_architectures_counts_every_type(tmp_path):
    r = run("architectures", "--json", env={"HEADRANK_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    c = data["counts"]
    assert c["types"] == len(known_types())  # every causal-LM and masked-LM type of this transformers
    assert c["measured"] + c["refused"] + c["unchecked"] == c["types"] and c["unchecked"] == 0
    assert c["measured"] >= 150  # the goal (transformers 5.24.0)
    by = {t["model_type"]: t for t in data["types"]}
    assert by["deepseek_v3"]["status"] == "verified" and by["llama"]["status"] == "table"
    assert by["mamba"]["status"] == "refused" and by["mamba"]["detail"]
    # sequence-to-sequence types, counted apart: every one listed, T5 and Whisper as three kinds of layer
    assert c["seq2seq_types"] == len(seq2seq_types()) and c["seq2seq_unchecked"] == 0
    assert c["seq2seq_measured"] + c["seq2seq_decoder_only"] + c["seq2seq_refused"] == c["seq2seq_types"]
    assert by["t5"]["kinds"] == by["whisper"]["kinds"] == "encoder, decoder, cross" and by["t5"]["task"] == "seq2seq"
    assert by["whisper"]["task"] == "causal-lm" and by["whisper"]["seq2seq"]  # its decoder is a causal LM too
    assert by["llama"]["kinds"] == "self" and not by["llama"]["seq2seq"]


def test_architectures_check_unknown_type_is_one_line(tmp_path):
    r = run("architectures", "--check", "no_such_model", env={"HEADRANK_CACHE": str(tmp_path)})
    assert r.returncode == 2 and "knows no causal-LM, masked-LM or sequence-to-sequence model type 'no_such_model'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, msg", [
    (["--check", "gpt2", "--status", "refused"], "--status lists types; --check verifies one"),
    (["--check", "gpt2", "--status", "bogus"], "--status must be table, verified, refused or unchecked"),
])
def test_architectures_check_with_a_status_is_one_line(tmp_path, args, msg):
    r = run("architectures", *args, env={"HEADRANK_CACHE": str(tmp_path)})
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_architectures_check_runs_and_caches(tmp_path):
    r = run("architectures", "--check", "olmo", "--json", env={"HEADRANK_CACHE": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["status"] == "verified" and row["max_logits_error"] < 1e-5
    cached = json.loads((tmp_path / "layouts_checked.json").read_text())
    assert cached["types"]["olmo"]["status"] == "verified"
    r = run("architectures", "--check", "t5", env={"HEADRANK_CACHE": str(tmp_path)})
    assert r.returncode == 0 and "t5: verified (encoder/decoder/cross attention" in r.stdout, r.stderr
    r = run("architectures", "--check", "mamba", env={"HEADRANK_CACHE": str(tmp_path)})
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]  # besides transformers' notices
    assert r.returncode == 2 and len(errors) == 1 and "mamba: refused" in errors[0]
