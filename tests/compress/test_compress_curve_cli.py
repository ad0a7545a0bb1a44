"""``headrank compress --curve`` goes through compress's own checks: bad values get the same one
line, options the curve does not take are refused, the --out guard, --json; and a default
--seq-len is capped at a short model's context (curve and compress alike)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from headrank.cli import app

from .test_compress_eval import _tiny_lm


@pytest.fixture(autouse=True)
def _baseline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADRANK_CACHE", str(tmp_path / "headrank-cache"))


@pytest.fixture
def lm(tmp_path, monkeypatch):
    """The tiny GPT-2 (a 64-token context) in ``tmp_path``, which is the working directory: the
    tests type relative paths, as users do."""
    _tiny_lm(tmp_path / "lm")
    monkeypatch.chdir(tmp_path)
    return "lm"


def _run(*args: str):
    return CliRunner().invoke(app, ["compress", *args])


def _one_line_refusal(r) -> str:
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
    return r.output


BAD = [  # (--curve's extra arguments, compress's without --curve that meet the same check)
    (["--format", "bogus"], ["--rank", "2", "--format", "bogus"]),
    (["--allocate", "bogus"], ["--rank", "2", "--allocate", "bogus"]),
    (["--layers", "99"], ["--rank", "2", "--layers", "99"]),
    (["--dataset", "bogus"], ["--rank", "2", "--dataset", "bogus"]),
    (["--products", "xx"], ["--rank", "2", "--products", "xx"]),
    (["--seq-len", "65"], ["--rank", "2", "--eval", "--seq-len", "65"]),
    (["--rank", "0"], ["--rank", "0"]),
    (["--params", "1.5"], ["--params", "1.5"]),
]
if not torch.cuda.is_available():
    BAD.append((["--device", "cuda"], ["--rank", "2", "--device", "cuda"]))


@pytest.mark.parametrize("with_curve, without", BAD)
def test_bad_values_get_the_same_line_as_without_curve(lm, tmp_path, with_curve, without):
    a = _one_line_refusal(_run(lm, "--out", "c", "--curve", "1", "--eval-n", "2", *with_curve))
    b = _one_line_refusal(_run(lm, "--out", "o", *without))
    assert a == b
    assert not (tmp_path / "c").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, flag", [
    (["--rank", "2"], "--rank"), (["--keep", "0.9"], "--keep"), (["--params", "0.5"], "--params"),
    (["--format", "dense"], "--format"), (["--format", "factored"], "--format"), (["--eval"], "--eval"),
    (["--whiten"], "--whiten"), (["--allocate", "loss"], "--allocate loss"), (["--dtype", "bfloat16"], "--dtype"),
])
def test_options_the_curve_does_not_take_are_refused(lm, tmp_path, args, flag):
    out = _one_line_refusal(_run(lm, "--out", "c", "--curve", "1", "--eval-n", "2", *args))
    assert out.startswith(f"error: {flag} does not go with --curve")
    assert not (tmp_path / "c").exists()


def test_out_guard_as_compress(lm, tmp_path):
    """An --out holding other files, and the source checkpoint itself, are refused untouched; a
    previous curve is replaced."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    src_before = sorted(p.name for p in (tmp_path / "lm").iterdir())
    for out in ("other", "lm"):
        line = _one_line_refusal(_run(lm, "--out", out, "--curve", "1", "--eval-n", "2", "--seq-len", "16"))
        why = "holds no compress_curve.json" if out == "other" else "is the source directory"
        assert why in line and f"--out {out}" in line
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in (tmp_path / "lm").iterdir()) == src_before
    for _ in range(2):  # the second run replaces the first's set
        r = _run(lm, "--out", "my curve", "--curve", "1", "--eval-n", "2", "--seq-len", "16", "-q")
        assert r.exit_code == 0 and r.output == "", r.output
    assert sorted(p.name for p in (tmp_path / "my curve").iterdir()) == [".headrank-output.json", "compress_curve.json",
                                                                         "compress_curve.png"]


def test_json_layers_and_the_capped_default_seq_len(lm, tmp_path):
    """--json prints compress_curve.json. --layers, --threads and --device reach the cut: the
    weight-only row at 0.5 with --layers 1 is the perplexity that --eval measures (with
    transformers, on the written checkpoint) of compress --params 0.5 --layers 1; with no
    --seq-len both use windows of the model's 64-token context (the default, 128, is capped)."""
    r = _run(lm, "--out", "c", "--curve", "1,0.5", "--eval-n", "2", "--layers", "1", "--threads", "2",
             "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data == json.loads((tmp_path / "c" / "compress_curve.json").read_text())
    panel = data["lm"]
    assert panel["text"] == "2 x 64"
    row = next(x for x in panel["rows"] if (x["method"], x["budget"]) == ("weight", 0.5))
    w = _run(lm, "--out", "o", "--params", "0.5", "--layers", "1", "--format", "dense", "--eval", "--eval-n", "2",
             "--no-whiten")  # the weight-only row
    assert w.exit_code == 0, w.output
    res = json.loads((tmp_path / "o" / "compress.json").read_text())
    assert res["eval"]["text"].startswith("2 windows of 64 tokens")
    assert {u["layer"] for u in res["units"]} == {1}
    assert row["cost"] == pytest.approx(res["eval"]["after"], rel=1e-5)
    whole = _run(lm, "--out", "c2", "--curve", "0.5", "--eval-n", "2", "--json")
    assert whole.exit_code == 0, whole.output
    cut_all = next(x for x in json.loads(whole.stdout)["lm"]["rows"] if x["method"] == "weight")
    assert cut_all["cost"] != pytest.approx(row["cost"], rel=1e-6)  # --layers did change what was cut


def test_default_seq_len_fits_a_short_context(lm, tmp_path):
    """The review's case: --allocate loss on a 64-token model with no --seq-len runs on windows of
    64 tokens and says so; an explicit --seq-len above the context is still refused."""
    r = _run(lm, "--out", "o", "--params", "0.5", "--allocate", "loss", "--eval-n", "2")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "o" / "compress.json").read_text())
    assert "2 windows of 64 tokens" in json.dumps(res["allocation"])
    assert any("windows of 64 tokens: the default 128 capped" in n for n in res["notes"])
    line = _one_line_refusal(_run(lm, "--out", "o2", "--params", "0.5", "--allocate", "loss", "--seq-len", "65"))
    assert "--seq-len 65 exceeds the model's context of 64 tokens" in line
    assert not (tmp_path / "o2").exists()
