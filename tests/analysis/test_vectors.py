"""``analyze(vectors=True)`` / ``spectra --vectors``: each head's singular vectors, checked against
numpy's dense float64 SVD of the formed product, built from the Hugging Face module's own weights."""

import numpy as np
import torch
import transformers as tf
from typer.testing import CliRunner

from headrank.analysis.scan import analyze
from headrank.cli import app

# grouped-query attention: 4 query heads over 2 kv heads
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)


def _model(path):
    torch.manual_seed(3)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL)).eval()
    m.save_pretrained(path, safe_serialization=True)
    return m


def _dense_products(m, layer):
    att = m.model.layers[layer].self_attn
    dh, H, Hkv = 8, 4, 2
    wq = att.q_proj.weight.detach().double().numpy().reshape(H, dh, -1)
    wk = att.k_proj.weight.detach().double().numpy().reshape(Hkv, dh, -1)
    wv = att.v_proj.weight.detach().double().numpy().reshape(Hkv, dh, -1)
    wo = att.o_proj.weight.detach().double().numpy()
    for h in range(H):
        g = h // (H // Hkv)
        yield h, wk[g].T @ wq[h], wo[:, h * dh:(h + 1) * dh] @ wv[g]


def test_vectors_reconstruct_each_product_and_match_dense_singular_values(tmp_path):
    m = _model(tmp_path / "m")
    r = analyze(tmp_path / "m", vectors=True)
    for layer in range(2):
        for h, qk, ov in _dense_products(m, layer):
            for prod, M in (("qk", qk), ("ov", ov)):
                u, s, v = (r.vectors[prod][k][layer, h].astype(np.float64) for k in ("u", "s", "v"))
                ref = np.linalg.svd(M, compute_uv=False)[: len(s)]
                np.testing.assert_allclose(s, ref, rtol=1e-5, atol=1e-7 * ref[0])
                np.testing.assert_allclose((u * s) @ v.T, M, atol=1e-5 * ref[0])
                np.testing.assert_allclose(u.T @ u, np.eye(len(s)), atol=1e-5)
                np.testing.assert_allclose(v.T @ v, np.eye(len(s)), atol=1e-5)


def test_spectra_vectors_writes_vectors_npz(tmp_path):
    _model(tmp_path / "m")
    res = CliRunner().invoke(app, ["spectra", str(tmp_path / "m"), "--out", str(tmp_path / "o"), "--vectors",
                                   "--no-plots", "--quiet"])
    assert res.exit_code == 0, res.output
    with np.load(tmp_path / "o" / "vectors.npz") as z:
        assert z["qk_u"].shape == (2, 4, 32, 8) and z["ov_s"].shape == (2, 4, 8)
        assert z["layers"].tolist() == [0, 1]
    r = analyze(tmp_path / "m")
    assert r.vectors is None  # off by default: nothing extra computed


def test_vectors_are_filled_in_place_and_empty_results_save(tmp_path, monkeypatch):
    """No final stacking copy of the vectors (np.stack is not called on them); a 0-row result saves
    its tables and describes as an empty frame."""
    import dataclasses

    from headrank.analysis import scan

    calls = []
    real = np.stack
    monkeypatch.setattr(scan.np, "stack", lambda arrs, *a, **k: calls.append(len(arrs)) or real(arrs, *a, **k))
    r = scan.analyze("minilm", layers="0,1", rotary=False, vectors=True)
    assert len(calls) == 2 + 4  # singular values (qk, ov) and row norms (q, k, v, p): never the vectors
    assert r.vectors["qk"]["u"].shape[:2] == (2, 12)
    empty = dataclasses.replace(r, table=r.table.iloc[:0], sv={k: v[:0] for k, v in r.sv.items()},
                                row_norms={k: v[:0] for k, v in r.row_norms.items()}, vectors=None)
    names = sorted(p.name for p in empty.save(tmp_path / "o"))
    assert names == ["heads.csv", "meta.json", "spectra.npz", "summary.csv"]
    assert empty.describe().empty
