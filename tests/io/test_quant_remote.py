"""Quantized checkpoints over HTTP ranges (headrank.io.remote + headrank.io.schemes), against the
Hub-like server on 127.0.0.1 (tests/io/hubserver.py): the FP8-block Llama gives the numbers of
its local reading and of a dense float64 SVD of codes × scales; a DeepSeek-V3-shaped FP8 MLA
checkpoint (routed experts stored per expert, skipped) split into one shard per module (> 64
shards, with an index) is read fetching only the attention tensors the analysis needs and
their scales, the headers of their shards (at most 2 requests each) and nothing of any other
shard."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from safetensors import safe_open

from headrank.analysis.scan import analyze
from headrank.io import remote
from tests.io import quantlib as ql
from tests.io.hubserver import HubServer

ATTN_READ = ("q_b_proj", "kv_b_proj", "o_proj", "q_proj", "k_proj", "v_proj")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("quant-remote")
    llama = ql.llama()
    ref = ql.write_fp8_blocks(llama, root / "llama", block=(32, 32))
    ds = ql.deepseek()
    ds_ref, wm = ql.write_deepseek_fp8(ds, root / "deepseek", block=(64, 64))
    return {"root": root, "llama_ref": ref, "ds_ref": ds_ref, "weight_map": wm}


@pytest.fixture
def srv(ckpts, monkeypatch):
    import huggingface_hub.constants as hc

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.0)
    with HubServer(root=ckpts["root"]) as s:
        s.add("org/fp8-llama", "main", ckpts["root"] / "llama")
        s.add("org/deepseek-fp8", "main", ckpts["root"] / "deepseek")
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def read_bytes(d, names):
    """Header bytes of the shards holding ``names`` and the bytes of those tensors."""
    tensors, headers = 0, 0
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            hit = [n for n in h.keys() if n in names]
        if hit:
            headers += 8 + int.from_bytes(f.read_bytes()[:8], "little")
            with safe_open(str(f), "pt") as h:
                tensors += sum(h.get_slice(n).get_shape() and _nbytes(h, n) for n in hit)
    return tensors, headers


def _nbytes(h, n):
    t = h.get_tensor(n)
    return t.numel() * t.element_size()


def test_fp8_llama_remote_equals_local_and_dense_float64(srv, ckpts):
    d = ckpts["root"] / "llama"
    local = analyze(d)
    srv.reset()
    got = analyze("org/fp8-llama", remote=True)
    for p in ("qk", "ov"):
        np.testing.assert_array_equal(got.sv[p], local.sv[p])
        for layer in (0, 1):
            assert rel(got.sv[p][layer], ql.head_spectra(ckpts["llama_ref"], layer, 4, 2, 18)[p]) < 1e-12
    assert got.meta["quantization"]["method"] == "fp8" and got.meta["input"] == "remote"
    names = {n for n in ckpts["llama_ref"] if ".self_attn." in n}
    names |= {n + "_scale_inv" for n in names}
    tensors, headers = read_bytes(d, names)
    json_bytes = sum(f.stat().st_size for f in d.glob("*.json"))
    assert srv.sent <= 1.05 * tensors + headers + json_bytes, (srv.sent, tensors, headers)


@pytest.mark.slow
def test_deepseek_v3_fp8_mla_many_shards_fetches_only_attention_and_scales(srv, ckpts):
    d = ckpts["root"] / "deepseek"
    shards = sorted(d.glob("*.safetensors"))
    assert len(shards) >= 64
    srv.reset()
    got = analyze("org/deepseek-fp8", remote=True)
    for layer in range(ql.MLA["LAYERS"]):
        want = ql.mla_spectra(ckpts["ds_ref"], layer)
        for p in ("qk", "ov"):
            for h in range(ql.MLA["H"]):
                k = len(want[p][h])
                assert rel(got.sv[p][layer, h, :k], want[p][h]) < 1e-12
    local = analyze(d)
    for p in ("qk", "ov"):
        np.testing.assert_array_equal(got.sv[p], local.sv[p])
    wm = ckpts["weight_map"]
    attn = {n for n in wm if ".self_attn." in n and n.rsplit(".", 2)[-2] in ATTN_READ}
    assert attn and all(n.endswith((".weight", "_scale_inv")) for n in attn)
    tensors, headers = read_bytes(d, attn)
    json_bytes = sum(f.stat().st_size for f in d.glob("*.json"))
    assert srv.sent <= 1.05 * tensors + headers + json_bytes, (srv.sent, tensors, headers, json_bytes)
    per_shard: dict[str, list[str]] = {}
    for _, path, rng in srv.log:
        m = re.search(r"/(model-\d+-of-\d+\.safetensors)$", path)
        if m and path.startswith("/cdn/"):
            per_shard.setdefault(m.group(1), []).append(rng or "")
    holding = {wm[n] for n in attn}
    assert set(per_shard) == holding  # no request at all for a shard without attention tensors read
    for shard, ranges in per_shard.items():
        with safe_open(str(d / shard), "pt") as h:
            n_tensors = len(list(h.keys()))
        assert len(ranges) <= 2 + n_tensors, (shard, ranges)  # two for the header, one per tensor
    q = got.meta["quantization"]
    assert q["method"] == "fp8" and q["weight_block_size"] == [64, 64]
    assert got.meta["remote"]["checkpoint_bytes"] == json.loads((d / "model.safetensors.index.json").read_text())[
        "metadata"]["total_size"]


def test_bad_scales_over_remote_are_one_line(srv, ckpts, tmp_path):
    from safetensors.torch import load_file, save_file

    from headrank.errors import HeadRankError

    src = ckpts["root"] / "llama"
    d = ckpts["root"] / "llama-no-scale"
    if not d.exists():
        d.mkdir()
        t = load_file(str(src / "model.safetensors"))
        t.pop("model.layers.1.self_attn.o_proj.weight_scale_inv")
        save_file(t, str(d / "model.safetensors"))
        (d / "config.json").write_text((src / "config.json").read_text())
    srv.add("org/no-scale", "main", d)
    with pytest.raises(HeadRankError, match="o_proj.weight_scale_inv is missing: a code is not a weight"):
        analyze("org/no-scale", remote=True)
