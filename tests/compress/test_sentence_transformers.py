"""A compressed sentence-transformers model loads with `SentenceTransformer(OUT)` and encodes, in a
fresh interpreter as a user runs it: `headrank compress minilm --out X --keep 0.99` (written dense
by default, with a note), then sentence-transformers' own loader. Reference: the uncut shipped
MiniLM encoded by the same library. Expected: keep 0.99 (99 % of each head's energy) moves each
normalised embedding by little: cosine above 0.95, but not identical (the cut happened)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sentence_transformers")

SCRIPT = """
import json, sys
import numpy as np
from sentence_transformers import SentenceTransformer
from headrank.io.checkpoint import shipped_model_path

texts = ["The cat sat on the mat.", "Spectra of attention heads", "A quick brown fox jumps over the lazy dog"]
cut = SentenceTransformer("cut minilm", device="cpu").encode(texts)
ref = SentenceTransformer(str(shipped_model_path("minilm")), device="cpu").encode(texts)
cos = (cut * ref).sum(1) / np.linalg.norm(cut, axis=1) / np.linalg.norm(ref, axis=1)
print(json.dumps({"shape": list(cut.shape), "cos": cos.tolist()}))
"""


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HEADRANK_CACHE": str(cwd / "cache")}
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_a_compressed_minilm_loads_and_encodes_in_sentence_transformers(tmp_path):
    r = _run([sys.executable, "-m", "headrank", "compress", "minilm", "--out", "cut minilm", "--keep", "0.99"],
             tmp_path)
    assert "sentence-transformers" in r.stdout + r.stderr  # the note: why dense
    rec = json.loads((tmp_path / "cut minilm" / "compress.json").read_text())
    assert rec["checkpoint"]["format"] == "dense" and (tmp_path / "cut minilm" / "modules.json").is_file()
    out = json.loads(_run([sys.executable, "-c", SCRIPT], tmp_path).stdout.strip().splitlines()[-1])
    assert out["shape"] == [3, 384]
    assert all(0.95 < c < 1 - 1e-6 for c in out["cos"]), out["cos"]


def test_factored_on_a_sentence_transformers_model_says_who_loads_it(tmp_path):
    from headrank.compress import compress

    res = compress("minilm", tmp_path / "f", rank=16, products="ov", format="factored")
    assert (tmp_path / "f" / "factored.json").is_file()
    assert any("only with headrank.load_compressed" in n for n in res["notes"])
