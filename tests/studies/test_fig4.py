"""fig4: the descriptive analysis against exact spectra, the nulls, and the own-LM claim both ways."""

import numpy as np
import pytest
import torch
import transformers as tf

from attnrank.analysis.scan import analyze
from attnrank.studies import fig4
from attnrank.studies.fig4 import (
    Fig4Params,
    balanced_at_exposure,
    describe,
    medians,
    nulls_keep_bound,
)


def _balanced_pair(d, dh, g):
    """A = U S^½ Oᵀ, B = V S^½ Oᵀ: AᵀA = BᵀB exactly."""
    U, _ = torch.linalg.qr(torch.randn(d, dh, generator=g))
    V, _ = torch.linalg.qr(torch.randn(d, dh, generator=g))
    O, _ = torch.linalg.qr(torch.randn(dh, dh, generator=g))
    s = torch.rand(dh, generator=g) + 0.5
    return U * s.sqrt() @ O.T, V * s.sqrt() @ O.T


@pytest.fixture(scope="module")
def balanced_ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("balanced")
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
    model.save_pretrained(path)
    return path


def test_balanced_checkpoint_sits_at_one_and_the_nulls_move_it(balanced_ckpt):
    d = describe(balanced_ckpt)
    for p in ("qk", "ov"):
        m = medians(d, p)
        assert m["ratio_trained"] == pytest.approx(1.0, abs=1e-9) and m["spread_trained"] < 1e-6
        assert m["ratio_rotation"] < 0.99 and m["ratio_pairing"] < 0.999  # the nulls destroy the pairing
    assert nulls_keep_bound({"described": d, "runs": []}).verdict == "held"


def test_describe_matches_the_spectra_scan():
    d = describe("minilm")
    t = analyze("minilm").table
    for p in ("qk", "ov"):
        s = t[t["product"] == p]
        np.testing.assert_allclose(np.ravel(d["products"][p]["ratio_trained"]), s["nuclear"] / s["frob_bound"],
                                   rtol=1e-10)


def test_nulls_keep_bound_catches_a_broken_null(balanced_ckpt):
    d = describe(balanced_ckpt)
    d["products"]["qk"]["bound_rotation"][0][0] *= 1.01
    c = nulls_keep_bound({"described": d, "runs": []})
    assert c.verdict == "not held" and c.kind == "identity"


def _run(lam, seed, e, ratio):
    prod = {"ratio_trained": [[ratio] * 4], "ratio_rotation": [[0.8] * 4], "ratio_pairing": [[0.9] * 4],
            "spread_trained": [[0.1] * 4], "spread_rotation": [[0.3] * 4], "spread_pairing": [[0.3] * 4]}
    return {"lam": lam, "seed": seed, "exposure": {"attn": e}, "products": {"qk": prod, "ov": prod}}


def test_own_lm_claim_holds_fails_and_needs_exposure():
    held = {"runs": [_run(0.0, s, 0.0, 0.95) for s in (0, 1)] + [_run(10.0, s, 8.0, 0.995) for s in (0, 1)]}
    c = balanced_at_exposure(held, "qk")
    assert c.verdict == "held" and c.exposure["got_attn"] == [0.0, 8.0]
    weak = {"runs": [_run(0.0, s, 0.0, 0.95) for s in (0, 1)] + [_run(10.0, s, 8.0, 0.98) for s in (0, 1)]}
    assert balanced_at_exposure(weak, "qk").verdict == "not held"
    already = {"runs": [_run(0.0, s, 0.0, 0.995) for s in (0, 1)] + [_run(10.0, s, 8.0, 0.999) for s in (0, 1)]}
    assert balanced_at_exposure(already, "ov").verdict == "not held"
    low = {"runs": [_run(0.0, 0, 0.0, 0.95), _run(1.0, 0, 1.0, 0.999)]}
    c = balanced_at_exposure(low, "qk")
    assert c.verdict == "inconclusive" and "exposure" in c.reason


def test_model_field_describes_a_given_checkpoint(balanced_ckpt, monkeypatch):
    monkeypatch.setattr(fig4, "train_lms", lambda p: {"lambdas": [], "runs": []})
    data = fig4.run(Fig4Params(model=str(balanced_ckpt)))
    assert data["described"]["source"] == str(balanced_ckpt)
    assert medians(data["described"], "qk")["ratio_trained"] == pytest.approx(1.0, abs=1e-9)
    assert Fig4Params().model is None and Fig4Params.quick().model is None


@pytest.mark.slow
def test_fig4_end_to_end_tiny():
    p = Fig4Params(exposures=(0.0, 0.5), seeds=(0,), lm_steps=20, workers=1, profile="test")
    data = fig4.run(p)
    assert [c.name for c in fig4.claims(data, p)] == ["fig4.lm.bound_coincides_qk", "fig4.lm.bound_coincides_ov",
                                                      "fig4.nulls_keep_bound"]
    assert np.asarray(data["runs"][0]["products"]["qk"]["ratio_trained"]).shape == (4, 4)
    assert fig4.nulls_keep_bound(data).verdict == "held"
    assert len(fig4.figures(data, p)) == 2
