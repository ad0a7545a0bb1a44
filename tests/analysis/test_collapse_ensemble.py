"""Networks with skips as ensembles (headrank.analysis.collapse.ensemble): the members against every
path written out, the members' sum against the models' own forward passes (the project's
Transformer; MiniLM's attention + skip variant as the Hugging Face modules compute it), and the
measures against numpy's Pearson correlation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headrank.analysis import collapse as C
from headrank.analysis.collapse import ensemble as E
from headrank.errors import HeadRankError
from headrank.models.opener import open_model
from headrank.models.transformer import Transformer


def _model(norm: str = "none", layers: int = 3, heads: int = 2, std: float = 0.3, seed: int = 1) -> Transformer:
    torch.manual_seed(seed)
    cfg = C.pure_attention_config(layers, std, d_model=16, n_heads=heads, skip=True, norm=norm)
    return Transformer(cfg).double().eval()


@pytest.mark.parametrize("norm", ["none", "pre", "post"])
def test_members_sum_to_the_models_output_and_group_into_path_lengths(norm):
    m, ids = _model(norm), C.byte_batch(3, 12)
    x0, maps, out = E.project_maps(m, ids)
    parts = E.members(x0, maps)
    assert len(parts) == 2**3 and sum(parts.values()).sub(out).norm() / out.norm() < 1e-13
    Y = C.path_restricted(m, ids)["Y"]  # the length-k parts, tested against explicit paths
    for k in range(4):
        torch.testing.assert_close(sum(v for (_, S), v in parts.items() if len(S) == k), Y[k], rtol=1e-10,
                                   atol=1e-12)


def test_each_member_is_the_sum_of_its_explicit_paths():
    """norm = none: every path (skip or one head per layer) written out, P_{l,h} Z W_v,h^T O_h^T, and
    summed by the set of layers whose heads it passes."""
    m, ids = _model(), C.byte_batch(2, 10)
    parts = E.members(*E.project_maps(m, ids)[:2])
    with torch.no_grad():
        _, hidden = m(ids, return_hidden=True)
        probs = [b.attn.attention_probs(x) for b, x in zip(m.blocks, hidden[:-1], strict=True)]
        dh = m.config.head_dim
        want: dict[tuple[int, ...], torch.Tensor] = {}
        for path in C.enumerate_paths(3, 2):
            Z = hidden[0]
            for layer, h in enumerate(path):
                if h is not None:
                    a = m.blocks[layer].attn
                    Wv, Wo = a.v.weight[h * dh:(h + 1) * dh], a.o.weight[:, h * dh:(h + 1) * dh]
                    Z = probs[layer][:, h] @ Z @ Wv.T @ Wo.T
            S = tuple(i for i, h in enumerate(path) if h is not None)
            want[S] = want.get(S, 0) + Z
    assert set(want) == {S for _, S in parts}
    for (_, S), v in parts.items():
        torch.testing.assert_close(v, want[S], rtol=1e-10, atol=1e-12)


def test_measures_equal_numpy_pearson_and_norm_shares():
    rng = np.random.default_rng(0)
    keys = [(-1, ()), (-1, (0,)), (-1, (1,)), (-1, (0, 1))]
    parts = {k: torch.from_numpy(rng.normal(size=(2, 4, 3)) * (i + 1) + (0.5 if i == 1 else 0.0))
             for i, k in enumerate(keys)}
    out = sum(parts.values())
    got = E.ensemble_measures(parts, 2, out)
    for b in range(2):
        flat = np.stack([parts[k][b].numpy().ravel() for k in keys])
        r = np.corrcoef(flat)
        sd = flat.std(1) * math.sqrt(flat.shape[1])  # norms of the centred outputs
        off = ~np.eye(4, dtype=bool)
        w = np.outer(sd, sd)[off]
        assert got["dependence"][b] == pytest.approx((np.abs(r[off]) * w).sum() / w.sum(), rel=1e-12)
        assert got["mean_abs_r"][b] == pytest.approx(np.abs(r[off]).mean(), rel=1e-12)
        fro = [np.linalg.norm(sum(parts[k][b].numpy() for k in keys if len(k[1]) == L)) for L in range(3)]
        assert got["share_by_k"][b] == pytest.approx(list(np.array(fro) / sum(fro)), rel=1e-12)
        assert got["short_share"][b] == pytest.approx((fro[0] + fro[1]) / sum(fro), rel=1e-12)
    assert got["sum_rel_error"] == 0.0 and got["n_members"] == 4
    same = {k: parts[keys[0]] * (i + 1) for i, k in enumerate(keys)}  # proportional members: dependence 1
    assert E.ensemble_measures(same, 2, sum(same.values()))["dependence"] == pytest.approx([1.0, 1.0])


def test_refuses_networks_it_cannot_decompose():
    with pytest.raises(HeadRankError, match="skip=True"):
        E.project_ensemble(Transformer(C.pure_attention_config(2, 0.3, d_model=16, n_heads=2)), C.byte_batch(1, 8))


@pytest.fixture(scope="module")
def minilm():
    return open_model("minilm", dtype=torch.float64, n_inputs=0, what="collapse")


@pytest.mark.parametrize("init", ["pretrained", pytest.param("random", marks=pytest.mark.slow)])
def test_bert_skip_variant_members_sum_to_its_forward(minilm, init):
    """MiniLM's attention + skip variant (post-norm, biases, LayerNorm shift): the members, with the
    constants every layer adds, sum to the variant's hidden state as run_variant computes it with the
    Hugging Face modules (itself tested against hook surgery on the unmodified forward)."""
    ad = C.make_adapter(minilm, init, 0)
    seqs = minilm.sequences(1, max_tokens=12, min_tokens=8)
    cap = ad.reference(torch.tensor([seqs.ids[0]]))
    x0, maps, _ = E.bert_skip_maps(ad, cap)
    parts = E.members(x0, maps)
    assert len(parts) == 2**6 + sum(2 ** (6 - 1 - layer) for layer in range(6))  # embedding + one per layer's constant
    ref = C.run_variant(ad, cap, "skip")[-1]
    assert (sum(parts.values()) - ref).norm() / ref.norm() < 1e-12
    m = E.bert_ensemble(ad, seqs.ids)
    assert m["sum_rel_error"] < 1e-12 and len(m["short_share"]) == 1 and 0 <= m["dependence"][0] <= 1
