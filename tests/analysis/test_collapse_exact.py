"""Residuals past the float64 floor (headrank.analysis.collapse.exact) against mpmath running the
plain forward pass (q, k, v, softmax, output projection) at high precision."""

from __future__ import annotations

import warnings

import mpmath as mp
import numpy as np
import pytest
import torch

from headrank.analysis.collapse.depth import pure_attention_config
from headrank.analysis.collapse.exact import AGREE, san_residuals
from headrank.errors import HeadRankError
from headrank.models.transformer import Transformer


def _model(layers: int, std: float, heads: int, d: int = 8, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(pure_attention_config(layers, std, d_model=d, n_heads=heads)).double().eval()


def _ids(n: int = 6) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(1))


def _composite(M: list[list]) -> mp.mpf:
    n, d = len(M), len(M[0])
    l1 = max(mp.fsum(abs(M[i][c]) for i in range(n)) for c in range(d))
    linf = max(mp.fsum(abs(M[i][c]) for c in range(d)) for i in range(n))
    return mp.sqrt(l1 * linf)


def _linear(X: list[list], w: np.ndarray) -> list[list]:
    """X wᵀ for an ``nn.Linear`` weight w (out, in), every float64 weight exact in mpmath."""
    W = [[mp.mpf(float(v)) for v in row] for row in w]
    return [[mp.fsum(x[c] * W[o][c] for c in range(len(x))) for o in range(len(W))] for x in X]


def _mp_forward(model: Transformer, ids: torch.Tensor, dps: int) -> list[tuple[float, float]]:
    """Per depth 0..L: log10 of the absolute residual ‖X − 1x̄ᵀ‖_{1,∞} and of ‖X‖_{1,∞}, the forward
    pass written out (per head: softmax(q kᵀ / √dh) v, then the output projection)."""
    with mp.workdps(dps):
        with torch.no_grad():
            _, hidden = model(ids, return_hidden=True)
        X = [[mp.mpf(float(v)) for v in row] for row in hidden[0][0].numpy()]
        out = []
        for block in [None, *model.blocks]:
            if block is not None:
                a = block.attn
                w = {k: getattr(a, k).weight.detach().numpy() for k in "qkvo"}
                q, k, v = _linear(X, w["q"]), _linear(X, w["k"]), _linear(X, w["v"])
                n, dh = len(X), a.head_dim
                Y = [[mp.mpf(0)] * (a.n_heads * dh) for _ in range(n)]
                for h in range(a.n_heads):
                    cols = range(h * dh, (h + 1) * dh)
                    for i in range(n):
                        s = [mp.fsum(q[i][c] * k[j][c] for c in cols) / mp.sqrt(dh) for j in range(n)]
                        e = [mp.exp(t - max(s)) for t in s]
                        z = mp.fsum(e)
                        for c in cols:
                            Y[i][c] = mp.fsum(e[j] / z * v[j][c] for j in range(n))
                X = _linear(Y, w["o"])
            mean = [mp.fsum(row[c] for row in X) / len(X) for c in range(len(X[0]))]
            R = [[row[c] - mean[c] for c in range(len(row))] for row in X]
            out.append((float(mp.log10(_composite(R))), float(mp.log10(_composite(X)))))
        return out


@pytest.mark.parametrize("std, layers, heads", [(0.3, 7, 2), (0.5, 8, 4), (0.45, 8, 2), (1.0, 3, 1)])
def test_exact_residuals_equal_mpmath_past_the_float64_floor(std, layers, heads):
    m, ids = _model(layers, std, heads), _ids()
    r = san_residuals(m, ids)
    assert r["exact"].all()
    deepest = -min(r["log10_abs"].min(), r["log10_rel"].min())
    ref = _mp_forward(m, ids, int(60 + max(1.0, deepest)))
    for depth, (res, norm) in enumerate(ref):
        assert r["log10_abs"][0, depth] == pytest.approx(res, rel=1e-12, abs=1e-12), depth
        assert r["log10_norm"][0, depth] == pytest.approx(norm, rel=1e-12, abs=1e-12), depth
    if std < 1.0:  # float64 reaches its floor: exactly 0 or noise near 1e-16, the exact value far below
        rel = np.array([a - b for a, b in ref])
        below = rel < -20
        plain = r["log10_rel_float64"][0, below]
        assert below.sum() >= 2 and (np.isneginf(plain) | (plain > rel[below] + 4)).all()


def test_the_float64_forward_agrees_where_it_is_above_its_floor():
    m, ids = _model(6, 0.3, 2, d=16), torch.randint(0, 256, (4, 10), generator=torch.Generator().manual_seed(2))
    r = san_residuals(m, ids)
    ok = r["log10_rel_float64"] > -8
    assert ok.sum() >= 8
    np.testing.assert_allclose(r["log10_rel"][ok], r["log10_rel_float64"][ok], rtol=1e-7, atol=1e-7)


def test_clustered_tokens_are_not_reported_as_exact():
    """Large weights, one head: the tokens fall into two clusters whose members agree to more digits
    than the clusters do, and the softmax saturates; below the representation's precision the two
    orderings disagree, and the depths from there on are NaN, not a wrong number (mpmath: the
    residual there is about 1e-58, the propagation's own value would be 1e-12)."""
    m, ids = _model(8, 0.6, 1), _ids()
    r = san_residuals(m, ids)
    exact = r["exact"][0]
    assert exact[:7].all() and not exact[7:].any() and np.isnan(r["log10_abs"][0, 7:]).all()
    ref = _mp_forward(m, ids, 120)
    assert ref[7][0] < -50 and r["log10_abs"][0, 6] == pytest.approx(ref[6][0], rel=1e-10)
    assert 0 < AGREE < 1e-6


def _saturating(scale: float) -> Transformer:
    """Two layers on four tokens whose every query puts its weight on the same key, the others at
    about e^(-0.4 scale): the rows agree to hundreds of digits after one layer."""
    m = _model(2, 0.1, 1, d=2)
    with torch.no_grad():
        m.tok_emb.weight.zero_()
        m.pos_emb.weight.zero_()
        m.tok_emb.weight[:4] = torch.tensor([[1.0, 0.3], [1.1, 1.0], [0.9, -0.2], [1.05, 0.1]], dtype=torch.float64)
        for b in m.blocks:
            b.attn.q.weight.copy_(torch.tensor([[scale, 0.0], [0.0, 0.0]]))
            b.attn.k.weight.copy_(torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
            b.attn.v.weight.copy_(torch.eye(2))
            b.attn.o.weight.copy_(torch.tensor([[1.0, 0.2], [-0.3, 1.0]]))
    return m


@pytest.mark.parametrize("scale", [250.0, 2500.0])
def test_a_saturated_softmax_keeps_the_mass_off_its_key(scale):
    m, ids = _saturating(scale), torch.tensor([[0, 1, 2, 3]])
    r = san_residuals(m, ids)
    assert r["exact"].all() and np.isneginf(r["log10_rel_float64"][0, 1:]).all()  # float64: exactly 0
    ref = _mp_forward(m, ids, int(60 - r["log10_abs"].min()))
    for depth, (res, _) in enumerate(ref):
        assert r["log10_abs"][0, depth] == pytest.approx(res, rel=1e-12, abs=1e-12), depth
    assert ref[2][0] < (-1000 if scale > 1000 else -100)


def test_only_pure_bidirectional_attention_is_accepted():
    for change in ({"skip": True}, {"mlp": True}, {"norm": "pre"}):
        cfg = pure_attention_config(2, 0.3, d_model=8, n_heads=2, **change)
        with pytest.raises(HeadRankError, match="pure self-attention"):
            san_residuals(Transformer(cfg), _ids())
    cfg = pure_attention_config(2, 0.3, d_model=8, n_heads=2)
    cfg.causal = True
    with pytest.raises(HeadRankError, match="causal=False"):
        san_residuals(Transformer(cfg), _ids())


def test_a_logit_gap_past_int64_exponents_is_not_exact_never_a_wrapped_exponent():
    """Logits 1e30 apart: e^(-1e30) = 2^(-1.4e30) has no int64 exponent, so F is NaN (not exact,
    left out of every fit) instead of a k wrapped by the cast; moderate gaps stay exact."""
    from headrank.analysis.collapse.exact import _large_logits

    logits = np.array([[[0.0, -1e30, -2e30], [0.0, -1e30, -1e30], [0.0, -2e30, -1e30]],
                       [[0.0, -50.0, -60.0], [0.0, -51.0, -60.0], [0.0, -50.0, -61.0]]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the cast's "invalid value" was one
        _, F, k = _large_logits(logits)
    assert np.isnan(F[0]).all() and k[0] == 0
    with mp.workdps(60):
        A = [[mp.exp(x) / mp.fsum(mp.exp(y) for y in row) for x in row] for row in logits[1].tolist()]
        exact = np.array([[float(a - b) for a, b in zip(r, A[0], strict=True)] for r in A])
    assert np.isfinite(F[1]).all()
    assert np.allclose(np.ldexp(F[1], int(k[1])), exact, rtol=1e-9, atol=0)
