"""FP8 checkpoints read exactly (headrank.io.schemes): block scales (``quant_method: fp8``,
DeepSeek-V3's format: ``weight_scale_inv`` per block, ragged edge blocks partial), one scale per
tensor, and fbgemm_fp8's per-row ``weight_scale``. Every spectrum is compared with a dense
float64 SVD of the codes × scales multiplied out block by block in the test
(tests/io/quantlib.py), and with the same weights written as a plain float64 checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from headrank.analysis.scan import analyze
from headrank.errors import HeadRankError
from headrank.io.checkpoint import Checkpoint
from tests.io import quantlib as ql

H, KV, D = 4, 2, 72
DH = D // H


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    model = ql.llama(hidden=D, heads=H, kv=KV)
    ref = ql.write_fp8_blocks(model, root / "fp8 blocks", block=(32, 32))  # 72 and 36 rows: ragged edges
    ql.write_dense(model, ref, root / "dense")
    return {"root": root, "model": model, "ref": ref}


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def test_fp8_blocks_ragged_equal_dense_float64_svd_and_dequantized_checkpoint(fp8):
    d = fp8["root"]
    got = analyze(d / "fp8 blocks")
    for layer in (0, 1):
        want = ql.head_spectra(fp8["ref"], layer, H, KV, DH)
        for p in ("qk", "ov"):
            assert rel(got.sv[p][layer], want[p]) < 1e-12
    dense = analyze(d / "dense")
    for p in ("qk", "ov"):
        assert rel(got.sv[p], dense.sv[p]) < 1e-12
    for col in ("sv_max", "nuclear", "frobenius_sq", "effective_rank", "stable_rank"):
        if col in dense.table:
            np.testing.assert_allclose(got.table[col], dense.table[col], rtol=1e-12, atol=0)
    q = got.meta["quantization"]
    assert q["method"] == "fp8" and q["dequantized"] is True and q["weight_block_size"] == [32, 32]
    assert got.meta["dtype_read"] == ["float8_e4m3fn"]


def test_the_codes_alone_differ_so_the_scales_were_applied(fp8):
    """Guard: the FP8 codes read as weights give other numbers (what happened before)."""
    raw = load_file(str(fp8["root"] / "fp8 blocks" / "model.safetensors"))
    codes = raw["model.layers.0.self_attn.q_proj.weight"].double().numpy()
    assert rel(codes, fp8["ref"]["model.layers.0.self_attn.q_proj.weight"]) > 1


def test_logical_view_hides_scales_and_reads_every_quantized_tensor_exactly(fp8):
    with Checkpoint(fp8["root"] / "fp8 blocks") as ck:
        assert not [k for k in ck.keys() if k.endswith("_scale_inv")]
        assert "model.layers.0.self_attn.q_proj.weight_scale_inv" not in ck
        for n, want in fp8["ref"].items():
            got = ck.get(n)
            np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), want)
        m = ck.meta("model.layers.1.mlp.down_proj.weight")
        assert m.dtype == "float8_e4m3fn" and m.shape == (D, 80)
        with pytest.raises(HeadRankError, match="quantization scale"):
            ck.get("model.layers.0.self_attn.q_proj.weight_scale_inv")


def test_numpy_reader_gives_the_same(fp8):
    with Checkpoint(fp8["root"] / "fp8 blocks", arrays="numpy") as ck:
        w = ck.get("model.layers.0.self_attn.k_proj.weight")
        assert isinstance(w, np.ndarray) and w.dtype == np.float64
        np.testing.assert_array_equal(w, fp8["ref"]["model.layers.0.self_attn.k_proj.weight"])


def test_one_scale_per_tensor_and_fbgemm_rows(tmp_path, fp8):
    model = fp8["model"]
    for kind, write in (("tensor", lambda p: ql.write_fp8_blocks(model, p, per_tensor=True)),
                        ("rows", lambda p: ql.write_fp8_rows(model, p))):
        ref = write(tmp_path / kind)
        got = analyze(tmp_path / kind)
        for layer in (0, 1):
            want = ql.head_spectra(ref, layer, H, KV, DH)
            for p in ("qk", "ov"):
                assert rel(got.sv[p][layer], want[p]) < 1e-12, kind
    assert got.meta["quantization"]["method"] == "fbgemm_fp8"


@pytest.mark.slow
def test_cli_fresh_interpreter_writes_meta(fp8, tmp_path):
    out = tmp_path / "out dir"
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(fp8["root"] / "fp8 blocks"), "--no-plots",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert meta["quantization"]["method"] == "fp8" and meta["quantization"]["dequantized"] is True


# -- bad input: one line, exit 2, nothing written -----------------------------------------------------
def _broken(src, dst, edit_tensors=None, edit_config=None):
    dst.mkdir()
    t = load_file(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    if edit_tensors:
        edit_tensors(t)
    if edit_config:
        edit_config(cfg)
    save_file(t, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


S = "model.layers.1.self_attn.k_proj.weight_scale_inv"
W = "model.layers.1.self_attn.k_proj.weight"


def _set(name, value):
    def edit(t):
        t[name] = value(t[name])
    return edit


@pytest.mark.parametrize("case,tensors,config,needle", [
    ("scale missing", lambda t: t.pop(S), None, "scale model.layers.1.self_attn.k_proj.weight_scale_inv is missing"),
    ("scale shape", _set(S, lambda s: s[:1].contiguous()), None, "the block size does not match the stored scales"),
    ("block size", None, lambda c: c["quantization_config"].update(weight_block_size=[16, 16]),
     "the block size does not match the stored scales"),
    ("scale NaN", _set(S, lambda s: s.clone().fill_(float("nan"))), None, "NaN or infinite"),
    ("scale inf", _set(S, lambda s: s.clone().fill_(float("inf"))), None, "NaN or infinite"),
    ("scale dtype", _set(S, lambda s: s.to(torch.int32)), None, "has dtype int32"),
    ("NaN code", _set(W, lambda w: w.view(torch.uint8).clone().fill_(0x7F).view(torch.float8_e4m3fn)), None,
     "NaN or infinite float8 codes"),
    ("says fp8 stores bf16", lambda t: [t.update({k: v.to(torch.bfloat16)}) for k, v in list(t.items())
                                        if v.dtype == torch.float8_e4m3fn] and
     [t.pop(k) for k in list(t) if k.endswith("_scale_inv")], None, "the config contradicts the tensors"),
    ("bf16 with a scale", _set(W, lambda w: w.to(torch.bfloat16)), None, "has an FP8 scale"),
    ("codes without config", None, lambda c: c.pop("quantization_config"), "quantization codes"),
    ("block size garbled", None, lambda c: c["quantization_config"].update(weight_block_size=[0, 128]),
     "weight_block_size must be two integers"),
    ("unknown method", None, lambda c: c["quantization_config"].update(quant_method="hqq"), "'hqq'"),
])
def test_bad_input_one_line(fp8, tmp_path, case, tensors, config, needle):
    d = _broken(fp8["root"] / "fp8 blocks", tmp_path / "bad", tensors, config)
    with pytest.raises(HeadRankError) as e:
        analyze(d)
    assert needle in str(e.value) and "\n" not in str(e.value), (case, str(e.value))


@pytest.mark.parametrize("case,tensors,needle", [
    ("scale missing", lambda t: t.pop(S), "is missing: a code is not a weight"),
    ("scale shape", _set(S, lambda s: s[:1].contiguous()), "the block size does not match the stored scales")])
def test_bad_input_exit_2_nothing_written(fp8, tmp_path, case, tensors, needle):
    """As a user runs it: a fresh interpreter, one error line, exit 2, no output left behind."""
    d = _broken(fp8["root"] / "fp8 blocks", tmp_path / "bad", tensors)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "headrank", "spectra", str(d), "--no-plots", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (case, r.stdout, r.stderr)
    errors = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("layers ")]  # progress lines aside
    assert len(errors) == 1 and errors[0].startswith("error: ") and needle in errors[0], (case, r.stderr)
    assert not out.exists() or not any(out.iterdir())


# -- the other verbs read the same dequantized weights -------------------------------------------------
@pytest.mark.slow
def test_compress_reads_dequantized_writes_dequantized_and_says_so(fp8, tmp_path):
    out = tmp_path / "cut"
    r = subprocess.run([sys.executable, "-m", "headrank", "compress", str(fp8["root"] / "fp8 blocks"), "--out",
                        str(out), "--keep", "0.99", "--format", "dense"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "read dequantized" in r.stdout + r.stderr
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    rec = json.loads((out / "compress.json").read_text())
    assert rec["source"]["quantization"]["method"] == "fp8"
    written = load_file(str(out / "model.safetensors"))
    # not cut: as read (float64), rounded once to the dtype the config declares (none here: bfloat16)
    for n in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.mlp.gate_proj.weight"):
        assert written[n].dtype == torch.bfloat16
        np.testing.assert_array_equal(written[n].double().numpy(),
                                      torch.from_numpy(fp8["ref"][n]).to(torch.bfloat16).double().numpy())
    analyze(out)  # a plain checkpoint now, read without a scheme


@pytest.mark.slow
def test_track_reads_each_checkpoint_dequantized(fp8, tmp_path):
    from headrank.analysis.series import track

    res = track([fp8["root"] / "fp8 blocks", fp8["root"] / "dense"], tmp_path / "series", workers=1, plots=False)
    t = res.table
    names = sorted(t["checkpoint"].unique())
    assert len(names) == 2 and not res.failed
    a, b = (t[t["checkpoint"] == n].sort_values(["layer", "head", "product"]) for n in names)
    assert len(a) == len(b) == 2 * H * 2
    for col in ("sv_max", "nuclear", "frob"):
        np.testing.assert_allclose(a[col].to_numpy(), b[col].to_numpy(), rtol=1e-12, atol=0)


def test_hub_cache_id_reads_dequantized(fp8, tmp_path, monkeypatch):
    from tests.io.test_sources import lay_out_cache

    cache = tmp_path / "hub"
    lay_out_cache(cache, "org/fp8-llama", fp8["root"] / "fp8 blocks", "c" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    res = analyze("org/fp8-llama")
    assert res.meta["input"] == "hub" and res.meta["quantization"]["method"] == "fp8"
    for p in ("qk", "ov"):
        np.testing.assert_array_equal(res.sv[p], analyze(fp8["root"] / "fp8 blocks").sv[p])


def test_header_claiming_a_huge_scale_tensor_is_bounded(fp8, tmp_path):
    """A header whose scale entry claims 10^12 elements: refused from the header, nothing allocated."""
    src = (fp8["root"] / "fp8 blocks" / "model.safetensors").read_bytes()
    n = int.from_bytes(src[:8], "little")
    header = json.loads(src[8:8 + n])
    header[S]["shape"] = [1_000_000, 1_000_000]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    d = tmp_path / "huge"
    d.mkdir()
    (d / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + src[8 + n:])
    (d / "config.json").write_text((fp8["root"] / "fp8 blocks" / "config.json").read_text())
    with pytest.raises(HeadRankError, match="spans .* bytes but its shape and dtype need"):
        analyze(d)
