"""`spectra` (and `track`) read a factored compress output directly: each head's singular values
equal those of the same cut written `--format dense` (the reference: a plain checkpoint, read as
any other) to float64 round-off, through the CLI in a fresh interpreter, through Python, and
through `headrank.spectra(load_compressed(OUT))`; a damaged manifest is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
import transformers as tf

import headrank
from headrank.compress import compress, load_compressed
from headrank.errors import HeadRankError

LLAMA = dict(hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=64,
             vocab_size=97, head_dim=8, attention_bias=True, tie_word_embeddings=True)
REL = 1e-10  # float64 round-off of one 8-dimensional head's SVD, relative to its largest singular value


@pytest.fixture(scope="module")
def cut(tmp_path_factory):
    """A float64 Llama with biases, cut to rank 3 (QK and OV) once factored (the CLI, in a fresh
    interpreter, relative paths with spaces) and once dense (Python)."""
    root = tmp_path_factory.mktemp("factored")
    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.normal_(0, 0.3)
    m.to(torch.float64).save_pretrained(root / "uncut model")
    _cli(root, "compress", "uncut model", "--out", "cut factored", "--rank", "3", "--format", "factored")
    compress(str(root / "uncut model"), root / "cut dense", rank=3, format="dense")
    assert (root / "cut factored" / "factored.json").is_file()
    assert not (root / "cut dense" / "factored.json").exists()
    return root


def _cli(cwd, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "headrank", *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _same_spectra(sv: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    for product in ("qk", "ov"):
        a, b = np.asarray(sv[product], np.float64), np.asarray(ref[product], np.float64)
        assert a.shape == b.shape
        top = b[..., :1]
        nonzero = b > 1e-12 * top
        cut_rank = 3 if product == "ov" else 4  # rotary QK keeps whole 2-d bands: rank 3 rounds up to 2 bands
        assert nonzero.sum(-1).min() >= 1 and (nonzero.sum(-1) <= cut_rank).all()  # the cut, of head_dim 8
        np.testing.assert_array_less(np.abs(a - b)[nonzero] / np.broadcast_to(top, b.shape)[nonzero], REL)
        assert (np.abs(a[~nonzero]) <= 1e-12 * np.broadcast_to(top, b.shape)[~nonzero]).all()


def test_cli_spectra_of_a_factored_output_equals_the_dense_cut(cut):
    _cli(cut, "spectra", "cut factored", "--out", "spectra f")
    _cli(cut, "spectra", "cut dense", "--out", "spectra d")
    f, d = np.load(cut / "spectra f" / "spectra.npz"), np.load(cut / "spectra d" / "spectra.npz")
    _same_spectra(dict(f), dict(d))
    hf, hd = pd.read_csv(cut / "spectra f" / "heads.csv"), pd.read_csv(cut / "spectra d" / "heads.csv")
    assert hf["rank"].tolist() == hd["rank"].tolist()
    assert hd["rank"].max() <= 4
    meta = json.loads((cut / "spectra f" / "meta.json").read_text())
    assert "factored" in json.dumps(meta)


def test_python_spectra_of_a_factored_output_and_of_load_compressed(cut):
    ref = headrank.spectra(str(cut / "cut dense"))
    for source in (str(cut / "cut factored"), load_compressed(cut / "cut factored")):
        res = headrank.spectra(source)
        _same_spectra(res.sv, ref.sv)
        assert res.table["rank"].tolist() == ref.table["rank"].tolist()


def test_track_reads_a_factored_output(cut, tmp_path):
    rows = headrank.track([str(cut / "cut dense"), str(cut / "cut factored")], tmp_path / "series", workers=1,
                          plots=False).table
    key = ["layer", "head", "product"]
    d, f = (rows[rows["checkpoint"] == c].sort_values(key).reset_index(drop=True) for c in ("cut_dense", "cut_factored"))
    assert len(d) == len(f) == 2 * 6 * 2
    assert f["rank"].tolist() == d["rank"].tolist()
    for col in ("sv_max", "nuclear", "frob"):
        np.testing.assert_allclose(f[col], d[col], rtol=REL, atol=0)


def test_a_damaged_manifest_is_one_line(cut, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(cut / "cut factored", bad)
    man = json.loads((bad / "factored.json").read_text())
    name = next(iter(man["modules"]))
    man["modules"][name]["index"] = [[0, 1]]  # fewer rows than the file holds
    (bad / "factored.json").write_text(json.dumps(man))
    with pytest.raises(HeadRankError, match="manifest keeps 1 of"):
        headrank.spectra(str(bad))
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", "bad"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "manifest keeps 1 of" in r.stderr
    (bad / "factored.json").write_text("{}")
    with pytest.raises(HeadRankError, match="not a headrank factored manifest"):
        headrank.spectra(str(bad))
