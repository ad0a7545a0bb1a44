"""``compress --dtype``: the weights written carry the dtype asked (dense and factored), as the
safetensors library reads them; sizes scale with it; every tensor is the float64 cut rounded to
that dtype, within the dtype's own rounding; transformers and load_compressed load it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import headrank
from headrank.compress import load_compressed, report_lines

DTYPES = ("bfloat16", "float16", "float32")
UNIT = {d: torch.finfo(getattr(torch, d)).eps / 2 for d in DTYPES}  # unit roundoff of round to nearest: 2^-8, 2^-11, 2^-24
CUT = {"rank": 16, "layers": "0,1", "products": "ov,qk"}


def _tensors(out: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the output's safetensors files, with its stored dtype (safetensors' own reader)."""
    got = {}
    for f in sorted(out.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            got |= {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
    return got


def _weight_bytes(out: Path) -> int:
    return sum(f.stat().st_size for f in out.glob("*.safetensors"))


@pytest.fixture(scope="module")
def written(tmp_path_factory, minilm_dir):
    """MiniLM in float64 on disk, cut once per (format, dtype): auto (the float64 reference) and each dtype."""
    from transformers import AutoModel

    root = tmp_path_factory.mktemp("dtype")
    src = root / "minilm64"
    AutoModel.from_pretrained(minilm_dir, dtype=torch.float32).to(torch.float64).save_pretrained(src)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_dir / f).is_file():
            shutil.copy(minilm_dir / f, src / f)
    res = {}
    for fmt in ("factored", "dense"):
        for dt in ("auto", *DTYPES):
            res[fmt, dt] = (root / f"{fmt}-{dt}", headrank.compress(src, root / f"{fmt}-{dt}", format=fmt, dtype=dt,
                                                                    **CUT))
    return res


@pytest.mark.slow  # the module's fixture: eight cuts of a float64 MiniLM (about 30 s)
@pytest.mark.parametrize("fmt", ["factored", "dense"])
def test_written_dtype_sizes_and_rounding(written, fmt):
    ref_dir, ref_res = written[fmt, "auto"]
    ref = _tensors(ref_dir)
    assert {str(t.dtype) for t in ref.values() if t.is_floating_point()} == {"torch.float64"}  # auto: as read
    assert ref_res["checkpoint"]["dtype"] == "auto"
    errs = {}
    for dt in DTYPES:
        out, res = written[fmt, dt]
        got = _tensors(out)
        assert set(got) == set(ref)
        floats = {k for k, t in ref.items() if t.is_floating_point()}
        assert {got[k].dtype for k in floats} == {getattr(torch, dt)}, dt
        assert all(got[k].dtype == ref[k].dtype for k in set(ref) - floats)  # integer buffers untouched
        # every tensor is the float64 cut rounded to the dtype: normwise error within its unit roundoff
        err = max(float((got[k].double() - ref[k]).norm() / ref[k].norm()) for k in floats if ref[k].norm() > 0)
        assert err <= UNIT[dt], (dt, err)
        errs[dt] = err
        c = res["checkpoint"]
        assert c["dtype"] == dt and [d for d in c["dtypes"] if d.startswith(("float", "bfloat"))] == [dt]
        assert c["bytes_written"] == _weight_bytes(out)
        assert json.loads((out / "config.json").read_text())["dtype"] == dt
        line = next(ln for ln in report_lines(res) if ln.startswith("checkpoint"))
        assert f"--dtype {dt}" in line and f"against the uncut model in {dt}" in line and "as on disk" in line
    assert errs["bfloat16"] > errs["float16"] > errs["float32"] > 0  # each was rounded, by its own precision
    b = {dt: _weight_bytes(written[fmt, dt][0]) for dt in ("auto", *DTYPES)}
    print(fmt, {d: f"{e:.2e}" for d, e in errs.items()}, b)
    assert 1.99 < b["float32"] / b["bfloat16"] <= 2.0 and b["float16"] == pytest.approx(b["bfloat16"], rel=1e-4)
    assert 1.99 < b["auto"] / b["float32"] <= 2.0  # the float64 source, as read
    u = {dt: written[fmt, dt][1]["checkpoint"]["bytes_uncut"] for dt in DTYPES}
    assert 1.99 < u["float32"] / u["bfloat16"] <= 2.0  # the uncut model in the output's dtype


@pytest.mark.slow
@pytest.mark.parametrize("dt", DTYPES)
def test_loaders_load_the_dtype_written(written, dt):
    from transformers import AutoModel

    m = load_compressed(written["factored", dt][0])
    assert {p.dtype for p in m.parameters()} == {getattr(torch, dt)}
    d = AutoModel.from_pretrained(written["dense", dt][0], dtype="auto")
    assert {p.dtype for p in d.parameters()} == {getattr(torch, dt)}


def test_cli_dtype_in_a_fresh_interpreter(tmp_path, minilm_dir):
    out = tmp_path / "out dir"
    r = subprocess.run([sys.executable, "-m", "headrank", "compress", str(minilm_dir), "--out", str(out), "--rank",
                        "16", "--layers", "0", "--dtype", "bfloat16", "--format", "factored"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "checkpoint (factored, bfloat16, int64, --dtype bfloat16)" in r.stdout
    rec = json.loads((out / "compress.json").read_text())
    assert rec["checkpoint"]["dtype"] == "bfloat16"
    assert {t.dtype for t in _tensors(out).values() if t.is_floating_point()} == {torch.bfloat16}


def test_a_quantized_source_is_written_in_its_declared_dtype_under_auto_and_in_the_dtype_asked(tmp_path):
    """An FP8 checkpoint is read dequantized, exactly, in float64; ``auto`` writes those tensors in
    the dtype the config declares for the model (bfloat16 here), not the float64 the codes were
    dequantized in (4x the bytes), and says so; ``--dtype float32`` writes float32. Each written
    tensor of an uncut layer is the float64 dequantization rounded once to the dtype written."""
    from ..io.quantlib import llama, quantized, write_fp8_blocks

    ref = write_fp8_blocks(llama(), tmp_path / "q")  # name -> codes x scales in float64 (numpy)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    declared = cfg.get("torch_dtype", cfg.get("dtype"))
    want = declared if declared in ("bfloat16", "float16", "float32") else "bfloat16"
    got = {}
    for dt in ("auto", "float32"):
        res = headrank.compress(tmp_path / "q", tmp_path / dt, rank=4, whiten=False, format="dense", dtype=dt,
                                layers="0")
        got[dt] = _tensors(tmp_path / dt), [n for n in res["notes"] if n.startswith("source quantized")]
    assert {t.dtype for k, t in got["auto"][0].items() if quantized(k)} == {getattr(torch, want)}
    assert f"in {want}, the dtype its config declares" in got["auto"][1][0]
    assert {t.dtype for t in got["float32"][0].values() if t.is_floating_point()} == {torch.float32}
    assert got["float32"][1][0].endswith("in float32 (--dtype)")
    # layer 1 is not cut: its quantized tensors are the float64 dequantization rounded once
    uncut = [k for k in ref if ".layers.1." in k and quantized(k)]
    assert uncut
    for k in uncut:
        assert torch.equal(got["auto"][0][k], torch.from_numpy(ref[k]).to(getattr(torch, want))), k
    assert _weight_bytes(tmp_path / "auto") < _weight_bytes(tmp_path / "float32")


def test_a_value_float16_cannot_hold_is_refused_not_written_as_inf(tmp_path):
    """A bfloat16 model with a weight of 1e6 (float16's largest is 65504): ``--dtype float16``
    would write it as inf. Refused in one line naming the tensor, exit 2, nothing written (the
    old code exited 0 with an infinite up_proj weight on disk); from Python a HeadRankError."""
    from ..io.quantlib import llama

    m = llama().to(torch.bfloat16)
    with torch.no_grad():
        m.model.layers[1].mlp.up_proj.weight[0, 0] = 1e6  # layer 1 is not cut: copied, cast
    m.save_pretrained(tmp_path / "big src")
    r = subprocess.run([sys.executable, "-m", "headrank", "compress", "big src", "--out", "o", "--rank", "4",
                        "--layers", "0", "--dtype", "float16"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "model.layers.1.mlp.up_proj.weight" in line and "overflows float16" in line, line
    assert "--dtype bfloat16 or float32" in line
    assert not (tmp_path / "o").exists()
    with pytest.raises(headrank.HeadRankError, match="overflows float16"):
        headrank.compress(tmp_path / "big src", tmp_path / "o", rank=4, layers="0", dtype="float16")
    assert not (tmp_path / "o").exists()
    headrank.compress(tmp_path / "big src", tmp_path / "o", rank=4, layers="0", dtype="bfloat16")  # bf16 holds it
