"""fig4 reproduction: its numbers come from the spectra table, and its claims can hold."""

from types import SimpleNamespace

import numpy as np
import torch
import transformers as tf

from attnrank.analysis.scan import analyze
from attnrank.studies import fig4
from attnrank.studies.fig4 import _random_baseline


def fig4_result(model):
    p = fig4.Fig4Params(model=model)
    return SimpleNamespace(claims=fig4.claims(fig4.run(p), p))


def _balanced_pair(d, dh, g):
    """A = U S^½ Oᵀ, B = V S^½ Oᵀ: AᵀA = BᵀB exactly."""
    U, _ = torch.linalg.qr(torch.randn(d, dh, generator=g))
    V, _ = torch.linalg.qr(torch.randn(d, dh, generator=g))
    O, _ = torch.linalg.qr(torch.randn(dh, dh, generator=g))
    s = torch.rand(dh, generator=g) + 0.5
    return U * s.sqrt() @ O.T, V * s.sqrt() @ O.T


def test_balanced_checkpoint_makes_every_claim_hold(tmp_path):
    cfg = tf.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                        vocab_size=50)
    model = tf.BertModel(cfg)
    g = torch.Generator().manual_seed(0)
    d, H, dh = 64, 4, 16
    with torch.no_grad():
        for layer in model.encoder.layer:
            att = layer.attention
            for h in range(H):
                rows = slice(h * dh, (h + 1) * dh)
                A, B = _balanced_pair(d, dh, g)  # QK: A = W_Kᵀ, B = W_Qᵀ
                att.self.key.weight[rows] = A.T
                att.self.query.weight[rows] = B.T
                A, B = _balanced_pair(d, dh, g)  # OV: A = P_h, B = W_Vᵀ
                att.output.dense.weight[:, rows] = A
                att.self.value.weight[rows] = B.T
    model.save_pretrained(tmp_path)
    res = fig4_result(str(tmp_path))
    verdicts = {c.name: c.held for c in res.claims}
    assert all(verdicts.values()), verdicts
    qk = next(c for c in res.claims if c.name == "fig4.bound_coincides_qk")
    assert abs(qk.measured["median_nuclear_over_bound"] - 1) < 1e-6


def test_minilm_numbers_come_from_the_table_and_baseline_keeps_norms():
    res = fig4_result("minilm")
    t = analyze("minilm").table
    ov = t[t["product"] == "ov"]
    c = next(c for c in res.claims if c.name == "fig4.bound_coincides_ov")
    assert c.measured["median_nuclear_over_bound"] == np.median(ov["nuclear"] / ov["frob_bound"])
    assert c.held == (c.measured["median_nuclear_over_bound"] >= 0.99)
    spec = analyze("minilm", layers="0")
    base = _random_baseline(spec)
    np.testing.assert_allclose(base["qk"]["row_a"].sum(-1), spec.row_norms["k"].sum(-1), rtol=1e-12)
    np.testing.assert_allclose(base["ov"]["row_b"].sum(-1), spec.row_norms["v"].sum(-1), rtol=1e-12)
