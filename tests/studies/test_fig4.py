"""fig4: the descriptive analysis against exact spectra, the nulls, and the own-LM claim both ways."""

import numpy as np
import pytest
import torch
import transformers as tf

from headrank.analysis.scan import analyze
from headrank.studies import fig4
from headrank.studies.fig4 import (
    Fig4Params,
    decay_balances,
    describe,
    llama_coincide,
    llama_rows,
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


@pytest.mark.slow
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


def _run(lam, seed, e, ratio, init=0.95):
    prod = {"ratio_trained": [[ratio] * 4], "ratio_rotation": [[0.8] * 4], "ratio_pairing": [[0.9] * 4],
            "spread_trained": [[0.05] * 4], "spread_rotation": [[0.3] * 4], "spread_pairing": [[0.3] * 4]}
    return {"lam": lam, "seed": seed, "exposure": {"attn": e}, "products": {"qk": prod, "ov": prod},
            "initial_ratio": {"qk": init, "ov": init}}


def test_own_lm_check_compares_decay_with_none_relative_to_the_start():
    held = {"runs": [_run(0.0, s, 0.0, 0.95 + s / 1000) for s in (0, 1)]
            + [_run(10.0, s, 8.0, 0.995 + s / 1000) for s in (0, 1)]}
    c = decay_balances(held, Fig4Params())
    assert c.kind == "check" and c.verdict == "held" and c.exposure["got_attn"] == [0.0, 8.0]
    # final/initial per seed (initial 0.95): lambda 0 at 0.95, 0.951; lambda 10 at 0.995, 0.996: 0.045/0.95 higher
    assert c.measured["lambda_top"] == 10.0
    for p in ("qk", "ov"):
        m = c.measured[p]
        assert m["final_over_initial_at_0"] == pytest.approx(0.9505 / 0.95)
        assert m["final_over_initial_at_top"] == pytest.approx(0.9955 / 0.95)
        assert m["per_seed"] == pytest.approx([0.045 / 0.95] * 2) and m["spread"] == pytest.approx(0, abs=1e-12)
    flat = {"runs": [_run(0.0, s, 0.0, 0.98 + s / 1000) for s in (0, 1)]
            + [_run(10.0, s, 8.0, 0.96 + s / 1000) for s in (0, 1)]}
    assert decay_balances(flat, Fig4Params()).verdict == "not held"
    # normalised by the start: decay starting lower and rising more holds even at a lower final ratio
    rel = {"runs": [_run(0.0, s, 0.0, 0.98 + s / 1000, init=0.98) for s in (0, 1)]
           + [_run(10.0, s, 8.0, 0.97 + s / 1000, init=0.90) for s in (0, 1)]}
    assert decay_balances(rel, Fig4Params()).verdict == "held"
    low = {"runs": [_run(0.0, 0, 0.0, 0.95), _run(1.0, 0, 1.0, 0.999)]}
    c = decay_balances(low, Fig4Params())
    assert c.verdict == "inconclusive" and "exposure" in c.reason


def test_llama_sentences_are_not_testable_without_a_given_checkpoint():
    data = {"described": {"source": "minilm", "products": _run(0, 0, 0, 0.999)["products"]}, "runs": []}
    for fn in (llama_coincide, llama_rows):
        c = fn(data, Fig4Params())
        assert c.verdict == "inconclusive" and "not testable here" in c.reason and c.quote
        given = fn(data, Fig4Params(model="some/llama"))
        assert given.verdict == "held"
    unbalanced = {"described": {"source": "x", "products": _run(0, 0, 0, 0.85)["products"]}, "runs": []}
    assert llama_coincide(unbalanced, Fig4Params(model="x")).verdict == "not held"


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
    assert [c.name for c in fig4.claims(data, p)] == ["fig4.bound_coincides", "fig4.rows_equal",
                                                      "fig4.lm.decay_balances", "fig4.nulls_keep_bound"]
    assert 0.5 < data["runs"][0]["initial_ratio"]["qk"] < 1.0
    assert np.asarray(data["runs"][0]["products"]["qk"]["ratio_trained"]).shape == (4, 4)
    assert fig4.nulls_keep_bound(data).verdict == "held"
    assert len(fig4.figures(data, p)) == 2


def test_model_opens_a_gguf_file_through_the_one_opener(tmp_path):
    """`reproduce fig4 --model FILE.gguf` reads what `spectra` reads (no --config needed)."""
    from tests.io.test_gguf import ARCHS, build_hf, hf_to_gguf_tensors, write_gguf

    model = build_hf("llama", tmp_path / "hf")
    f = write_gguf(tmp_path / "m.gguf", ARCHS["llama"][2], model, hf_to_gguf_tensors("llama", model))
    got, ref = describe(f), describe(tmp_path / "hf")
    for p in ("qk", "ov"):
        np.testing.assert_allclose(got["products"][p]["ratio_trained"], ref["products"][p]["ratio_trained"],
                                   rtol=1e-9)
