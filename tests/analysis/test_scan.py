"""The streaming analysis of a checkpoint, against independent dense references."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

import headrank
from headrank.analysis.scan import TABLE_COLUMNS, analyze, parse_layers
from headrank.core.metrics import METRIC_COLUMNS, SUMMARY_METRICS
from headrank.errors import HeadRankError

from ..core.test_metrics import dense_reference
from ..helpers import shard


@pytest.fixture(scope="module")
def minilm_result():
    return analyze("minilm")


def test_table_shape_and_columns(minilm_result):
    t = minilm_result.table
    assert list(t.columns) == list(TABLE_COLUMNS)
    assert len(t) == 6 * 12 * 2
    assert set(t["product"]) == {"qk", "ov"}
    assert t["layer"].min() == 0 and t["head"].max() == 11
    assert minilm_result.sv["qk"].shape == (6, 12, 32)
    assert (np.diff(minilm_result.sv["ov"], axis=-1) <= 0).all()


@pytest.mark.slow
def test_one_head_against_dense_svd(minilm_dir, minilm_result):
    """Layer 4, head 7: form W_Kᵀ W_Q and P W_V from the raw tensors, take numpy's SVD."""
    sd = load_file(minilm_dir / "model.safetensors")
    pre, h, dh = "encoder.layer.4.attention.", 7, 32
    rows = slice(h * dh, (h + 1) * dh)
    wq = sd[pre + "self.query.weight"].double().numpy()[rows]
    wk = sd[pre + "self.key.weight"].double().numpy()[rows]
    wv = sd[pre + "self.value.weight"].double().numpy()[rows]
    p = sd[pre + "output.dense.weight"].double().numpy()[:, rows]
    for product, A, B in (("qk", wk.T, wq.T), ("ov", p, wv.T)):
        s = np.linalg.svd(A @ B.T, compute_uv=False)[:dh]
        np.testing.assert_allclose(minilm_result.sv[product][4, h], s, rtol=1e-9)
        row = minilm_result.table.query(f"layer == 4 and head == {h} and product == '{product}'").iloc[0]
        assert row["nuclear"] == pytest.approx(s.sum(), rel=1e-10)
        ref = dense_reference(A, B, minilm_result.meta["tolerance"])  # every column of the metric table
        for k in METRIC_COLUMNS:
            if k in ("rank", "k90", "k99"):
                assert row[k] == ref[k], (product, k)
            else:
                assert row[k] == pytest.approx(ref[k], rel=1e-8, abs=1e-12 * ref["frob_bound"]), (product, k)
    summary = minilm_result.summary()
    assert set(SUMMARY_METRICS) <= set(summary.columns)
    qk4 = minilm_result.table.query("layer == 4 and product == 'qk'")
    assert summary.query("layer == 4 and product == 'qk'")["k90"].item() == pytest.approx(qk4["k90"].mean())
    # Figure 4 row norms: rows of W_Q, W_K, W_V and columns of P
    np.testing.assert_allclose(minilm_result.row_norms["q"][4, h], (wq**2).sum(1), rtol=1e-12)
    np.testing.assert_allclose(minilm_result.row_norms["p"][4, h], (p**2).sum(0), rtol=1e-12)


def test_public_api_and_layer_selection():
    t = headrank.spectra("minilm", layers=[1, 3], tol=1e-2).table
    assert sorted(t["layer"].unique()) == [1, 3]
    assert parse_layers("0,2-4", 6) == [0, 2, 3, 4]
    with pytest.raises(HeadRankError):
        parse_layers("7", 6)
    with pytest.raises(HeadRankError):
        parse_layers("a-b", 6)


def test_bf16_sharded_copy_matches_dense_of_rounded_weights(tmp_path, minilm_dir):
    d = shard(minilm_dir, tmp_path / "bf16", dtype=torch.bfloat16)
    r = analyze(d, layers="2", precision="float64")  # the float64 route: exact to 1e-9 (auto: tests/core/test_precision.py)
    sd = load_file(d / "model-00001-of-00003.safetensors") | load_file(d / "model-00002-of-00003.safetensors") \
        | load_file(d / "model-00003-of-00003.safetensors")
    pre = "encoder.layer.2.attention."
    wq = sd[pre + "self.query.weight"].double().numpy()[:32]
    wk = sd[pre + "self.key.weight"].double().numpy()[:32]
    s = np.linalg.svd(wk.T @ wq, compute_uv=False)[:32]
    np.testing.assert_allclose(r.sv["qk"][0, 0], s, rtol=1e-9)
    assert r.meta["dtype_read"] == ["bfloat16"]


def test_shape_contradicting_config(tmp_path, minilm_dir):
    shutil.copy(minilm_dir / "model.safetensors", tmp_path)
    cfg = json.loads((minilm_dir / "config.json").read_text())
    cfg["num_attention_heads"] = 5  # 384 / 5 is not an integer head width: shapes disagree
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HeadRankError, match="shape"):
        analyze(tmp_path)


def test_nan_weights_flagged_per_head(tmp_path, minilm_dir):
    sd = load_file(minilm_dir / "model.safetensors")
    sd["encoder.layer.1.attention.self.value.weight"][3 * 32 + 5, 7] = float("nan")
    save_file(sd, tmp_path / "model.safetensors")
    shutil.copy(minilm_dir / "config.json", tmp_path)
    r = analyze(tmp_path)
    bad = r.table[~r.table["finite"]]
    assert bad[["layer", "head", "product"]].values.tolist() == [[1, 3, "ov"]]
    assert r.meta["nonfinite_heads"] == [{"layer": 1, "head": 3, "product": "ov"}]
    good = r.table[r.table["finite"]]
    assert good["nuclear"].notna().all()


def test_results_identical_under_a_concurrent_cpu_bound_process():
    """Heads are split into fixed chunks, each reduced by one single-threaded worker: neither a
    busy core nor the number of workers changes a bit of the result."""
    import subprocess
    import sys

    idle = analyze("minilm", layers="0-2", threads=2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = [analyze("minilm", layers="0-2", threads=n) for n in (2, 1, 3)]
        assert busy.poll() is None  # the other process really ran throughout
    finally:
        busy.kill()
        busy.wait()
    for r in loaded:
        pd.testing.assert_frame_equal(r.table, idle.table, check_exact=True)
        for p in ("qk", "ov"):
            assert np.array_equal(r.sv[p], idle.sv[p])
        for k in ("q", "k", "v", "p"):
            assert np.array_equal(r.row_norms[k], idle.row_norms[k])
    assert torch.get_num_threads() >= 1 and idle.table["finite"].all()


def test_timing_says_where_the_stream_waited():
    """meta.json records the stream's time: reads (in the reader thread, pages faulted in there),
    compute, and how long each side waited on the other."""
    t = analyze("minilm", layers="0-2").meta["timing_s"]
    assert set(t) == {"wall", "read", "compute", "compute_waited_on_read", "read_waited_on_compute"}
    assert all(v >= 0 for v in t.values())
    assert t["compute"] + t["compute_waited_on_read"] <= t["wall"] + 1e-3
    assert t["read_waited_on_compute"] == pytest.approx(t["wall"] - t["read"], abs=1e-3)


def test_gqa_reduces_each_kv_head_once(monkeypatch):
    """Under grouped-query attention the K and V Grams belong to kv heads: 8 query heads on 2 kv
    heads reduce 8 + 2 + 2 + 8 factors, not 32; the spectra equal those of repeated factors."""
    import headrank.core.linalg as la
    from headrank.analysis.scan import layer_metrics
    from headrank.core.linalg import product_metrics
    from headrank.io.layouts import HeadWeights

    g = torch.Generator().manual_seed(3)
    H, Hkv, dh, d = 8, 2, 6, 40
    hw = HeadWeights(wq=torch.randn(H, dh, d, generator=g), wk=torch.randn(Hkv, dh, d, generator=g),
                     wv=torch.randn(Hkv, dh, d, generator=g), p=torch.randn(H, d, dh, generator=g))
    seen = []
    real = la._factor_root
    monkeypatch.setattr(la, "_factor_root", lambda X, auto=False: seen.append(X.shape[0]) or real(X, auto))
    metrics, _ = layer_metrics(hw)
    assert sum(seen) == H + Hkv + Hkv + H
    monkeypatch.setattr(la, "_factor_root", real)
    for name, (A, B) in (("qk", hw.qk_factors()), ("ov", hw.ov_factors())):
        torch.testing.assert_close(metrics[name].sv, product_metrics(A, B).sv, rtol=1e-12, atol=1e-12)
