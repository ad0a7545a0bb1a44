"""`analyze` on TransformerLens models: a TransformerLens 4 `TransformerBridge` (read through its
wrapped Hugging Face model) and any object with TransformerLens' stacked W_Q, W_K, W_V, W_O
(HookedTransformer-compatible). Checked against numpy's dense SVD of TransformerLens' own
per-head circuits (W_Q W_Kᵀ and W_V W_O), computed from the bridge's tensors."""

import types

import numpy as np
import pytest

from headrank import analyze
from headrank.errors import HeadRankError


@pytest.fixture(scope="module")
def bridge():
    tl = pytest.importorskip("transformer_lens.model_bridge",
                             reason="TransformerLens is in the bench extra: pip install 'headrank[bench]'")
    from headrank.io.checkpoint import local_path

    return tl.TransformerBridge.boot_transformers(str(local_path("minilm", None)), device="cpu")


def dense_reference(bridge, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    q, k, v, o = (getattr(bridge, n)[layer, head].detach().double().numpy() for n in ("W_Q", "W_K", "W_V", "W_O"))
    dh = q.shape[1]
    return np.linalg.svd(q @ k.T, compute_uv=False)[:dh], np.linalg.svd(v @ o, compute_uv=False)[:dh]


@pytest.mark.slow
def test_transformer_bridge_is_read_through_its_hugging_face_model(bridge):
    res = analyze(bridge, tol=1e-3)
    assert res.meta["model_type"] == "bert" and res.meta["config"]["n_layers"] == 6
    for layer, head in ((0, 0), (3, 7), (5, 11)):
        qk, ov = dense_reference(bridge, layer, head)
        np.testing.assert_allclose(res.sv["qk"][layer, head], qk, rtol=1e-9, atol=1e-12 * qk[0])
        np.testing.assert_allclose(res.sv["ov"][layer, head], ov, rtol=1e-9, atol=1e-12 * ov[0])
    # the same numbers as the checkpoint on disk
    disk = analyze("minilm", tol=1e-3)
    np.testing.assert_allclose(res.table["effective_rank"], disk.table["effective_rank"], rtol=1e-12)


def test_hooked_transformer_compatible_weights(bridge):
    ht = types.SimpleNamespace(**{n: getattr(bridge, n) for n in ("W_Q", "W_K", "W_V", "W_O")}, cfg=bridge.cfg)
    res = analyze(ht, tol=1e-3)
    assert res.meta["config"]["n_heads"] == 12 and res.meta["config"]["head_dim"] == 32
    for layer, head in ((1, 2), (4, 5)):
        qk, ov = dense_reference(bridge, layer, head)
        np.testing.assert_allclose(res.sv["qk"][layer, head], qk, rtol=1e-9, atol=1e-12 * qk[0])
        np.testing.assert_allclose(res.sv["ov"][layer, head], ov, rtol=1e-9, atol=1e-12 * ov[0])
    bad = types.SimpleNamespace(W_Q=bridge.W_Q, W_K=bridge.W_K, W_V=bridge.W_V, W_O=bridge.W_Q)
    with pytest.raises(HeadRankError, match="W_O \\(layers, heads, d_head, d_model\\)"):
        analyze(bad)
