"""The stated bound and the MLP Lipschitz bounds (headrank.analysis.collapse.bound), against dense
float64 numpy, plain-float formulas and the modules' own forward passes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headrank.analysis.collapse import bound as B
from headrank.analysis.collapse.depth import pure_attention_config
from headrank.analysis.collapse.surgery import ProjectAdapter
from headrank.errors import HeadRankError
from headrank.models.transformer import Transformer


def _model(mlp: bool = False, layers: int = 2, heads: int = 2, std: float = 0.3) -> Transformer:
    torch.manual_seed(0)
    cfg = pure_attention_config(layers, std, d_model=8, n_heads=heads)
    cfg.mlp = mlp
    return Transformer(cfg).double().eval()


def test_head_matrices_reproduce_the_attention_modules_own_scores_and_output():
    attn = _model().blocks[0].attn
    X = torch.randn(1, 5, 8, dtype=torch.float64)
    qk, w = B.attention_weights(attn)
    with torch.no_grad():
        probs = attn.attention_probs(X)[0].numpy()  # (H, n, n), the module's own softmax
    x = X[0].numpy()
    for h in range(2):
        s = x @ qk[h] @ x.T / math.sqrt(attn.head_dim)
        p = np.exp(s - s.max(1, keepdims=True))
        np.testing.assert_allclose(p / p.sum(1, keepdims=True), probs[h], rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        out = attn(X)[0].numpy()
    np.testing.assert_allclose(sum(probs[h] @ x @ w[h] for h in range(2)), out, rtol=1e-10, atol=1e-12)
    assert B.d_qk_of(attn) == 4


def test_layer_beta_equals_dense_numpy_norms():
    rng = np.random.default_rng(1)
    qk, w = rng.normal(size=(3, 6, 6)), rng.normal(size=(3, 6, 6))
    want = max(np.abs(qk[h]).sum(0).max() * math.sqrt(np.abs(w[h]).sum(0).max() * np.abs(w[h]).sum(1).max())
               for h in range(3))
    assert B.layer_beta(qk, w) == pytest.approx(want, rel=1e-12)


def test_bad_weight_shapes_are_refused():
    with pytest.raises(HeadRankError, match="do not split"):
        B.head_matrices(torch.zeros(6, 4), torch.zeros(6, 4), torch.zeros(6, 4), torch.zeros(4, 6), 4)
    with pytest.raises(HeadRankError, match="beta > 0"):
        B.gamma_thresholds(np.zeros(1), np.zeros((1, 1)), 0.0, 1, 4)


def test_rhs_matches_plain_float_arithmetic_for_small_depths():
    beta, H, d, gamma, r0 = 0.3, 2, 16, 0.7, 0.8
    got = B.bound_rhs_log10(np.array([math.log10(r0)]), np.array([1, 2]), beta, H, d, math.log10(gamma))[0]
    c = 4 * gamma * beta * H / math.sqrt(d)
    want = [math.log10(c ** ((3**L - 1) / 2) * r0 ** (3**L)) for L in (1, 2)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def _res(*log10s):  # one input; log10 |res| at depths 0, 1, ...
    return np.array([list(log10s)], dtype=float)


def test_bound_holds_when_the_residual_is_below_it():
    # beta H / sqrt(d) = 0.125 -> log10 c = log10(0.5) at gamma = 1; |res(X)| = 1: rhs = -0.301, -1.20, -3.91
    chk = B.check_bound(_res(0.0, -0.5, -1.5, -4.0), 0.5, 1, 16, 0.0)
    assert chk["holds"] == [True, True, True] and chk["vacuous"] == [False, False, False]
    assert chk["log10_margin"][0] == pytest.approx(0.5 - math.log10(2))
    assert B.bound_verdict(chk) == ("held", "held")


def test_a_hand_made_counterexample_violates_it():
    chk = B.check_bound(_res(0.0, -0.5, -1.0, -4.0), 0.5, 1, 16, 0.0)  # depth 2: -1.0 > -1.20
    assert chk["holds"] == [True, False, True]
    verdict, reason = B.bound_verdict(chk)
    assert verdict == "not held" and reason == "violated at depths 2"


def test_a_large_gamma_makes_the_bound_vacuous_and_thresholds_say_where_it_turns():
    res = _res(0.0, -0.5, -1.5, -4.0)
    chk = B.check_bound(res, 0.5, 1, 16, 1.0)  # c = 5 > 1 with |res(X)| = 1: rhs >= 1 everywhere
    assert B.bound_verdict(chk) == ("held", "held (vacuous at depths 1, 2, 3)")
    t = B.gamma_thresholds(res[:, 0], res[:, 1:], 0.5, 1, 16)
    assert t["vacuous"][0] == pytest.approx(math.log10(2))  # c |res(X)|^2 = 1
    for L, need in enumerate(t["needed"][0], start=1):
        assert B.check_bound(res, 0.5, 1, 16, need + 1e-9)["holds"][L - 1]
        assert not B.check_bound(res, 0.5, 1, 16, need - 1e-6)["holds"][L - 1]


def test_floor_entries_are_not_judged():
    res = _res(0.0, -0.5, -20.0)
    chk = B.check_bound(res, 0.5, 1, 16, 0.0, valid=np.array([[True, False]]))
    assert chk["depths"] == [1]
    s = B.summarize_thresholds(res, [0.5, 0.2], 1, 16, valid=np.array([[True, False]]))
    assert s["judged_depths"] == [1] and s["log10_gamma_needed_by_depth"][1] is None and s["beta"] == 0.5


def test_gelu_lipschitz_constant_is_its_closed_form():
    x = math.sqrt(2)  # GELU'' = phi(x)(2 - x^2) = 0 there
    want = 0.5 * (1 + math.erf(x / math.sqrt(2))) + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    assert B.activation_lipschitz(F.gelu) == pytest.approx(want, abs=1e-9)
    assert B.activation_lipschitz(torch.relu) == pytest.approx(1.0)


def test_mlp_bound_uses_dense_spectral_norms_and_bounds_the_real_jacobian():
    mlp = _model(mlp=True).blocks[0].mlp
    w1, w2 = mlp.fc.weight.detach().numpy(), mlp.proj.weight.detach().numpy()
    assert B.spectral_norm(mlp.fc.weight) == pytest.approx(np.linalg.norm(w1, 2), rel=1e-12)
    lip = B.mlp_lipschitz_bound(mlp.fc.weight, mlp.proj.weight, B.activation_lipschitz(F.gelu))
    assert lip == pytest.approx(np.linalg.norm(w2, 2) * 1.1289 * np.linalg.norm(w1, 2), rel=1e-4)
    torch.manual_seed(3)
    for _ in range(20):
        J = torch.autograd.functional.jacobian(mlp, torch.randn(8, dtype=torch.float64) * 3)
        assert np.linalg.norm(J.numpy(), 2) <= lip


def test_weights_summary_of_the_project_model_per_layer():
    m = _model(mlp=True, layers=3)
    s = B.weights_summary(ProjectAdapter(m))
    assert s["heads"] == 2 and s["d_qk"] == 4 and len(s["beta_by_layer"]) == 3
    for b, blk in zip(s["beta_by_layer"], m.blocks, strict=True):
        assert b == pytest.approx(B.layer_beta(*B.attention_weights(blk.attn)))
    assert all(x > 0 for x in s["mlp_lipschitz_by_layer"])
    assert B.weights_summary(ProjectAdapter(_model()))["mlp_lipschitz_by_layer"] == [None, None]


def test_absolute_residual_is_the_composite_norm_of_the_centred_matrix():
    X = np.arange(12.0).reshape(3, 4) ** 1.5
    R = np.abs(X - X.mean(0))
    assert B.log10_abs_residual(X) == pytest.approx(math.log10(math.sqrt(R.sum(0).max() * R.sum(1).max())))


def test_bert_weights_reproduce_minilms_own_attention_with_biases_zeroed():
    from headrank.analysis.collapse.surgery import make_adapter
    from headrank.models.opener import open_model

    op = open_model("minilm", dtype=torch.float64, n_inputs=0)
    ad = make_adapter(op, "pretrained", 0)
    layer = ad.layers[0]
    sa, dense = layer.attention.self, layer.attention.output.dense
    with torch.no_grad():
        for lin in (sa.query, sa.key, sa.value, dense):
            lin.bias.zero_()
    got = {}

    def keep(mod, args, out):
        got["out"] = out[0].numpy()

    hook = dense.register_forward_hook(keep)
    try:
        cap = ad.reference(torch.tensor([op.sequences(1, max_tokens=12, min_tokens=8).ids[0]]))
    finally:
        hook.remove()
    qk, w = B.attention_weights(sa, dense)
    x, probs, dh = cap["emb"][0].numpy(), cap["probs"][0][0].numpy(), B.d_qk_of(sa)
    H = probs.shape[0]
    for h in range(H):
        s = x @ qk[h] @ x.T / math.sqrt(dh)
        p = np.exp(s - s.max(1, keepdims=True))
        np.testing.assert_allclose(p / p.sum(1, keepdims=True), probs[h], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sum(probs[h] @ x @ w[h] for h in range(H)), got["out"], rtol=1e-8, atol=1e-9)
