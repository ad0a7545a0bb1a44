"""Dar's article: the TL;DR identity at epsilon 0, its epsilon > 0 breakdown (a finding judged
both ways), BatchNorm and input-scaling identities against float64 torch computed here, and the
effective learning rate against "it's not going to matter" (equivalence both ways)."""

import math

import torch

from headrank.studies.scale import article
from headrank.studies.scale import article_claims as A


def _art(eps_changes, eps0=1e-16, seeds=(0, 1, 2)):
    c = ["0.1", "0.01", "0.001"]
    return {"seeds": list(seeds), "shrink": {"c": [0.1, 0.01, 1e-3],
                                             "eps0": {k: [eps0] * len(seeds) for k in c},
                                             "eps": {k: [v] * len(seeds) for k, v in zip(c, eps_changes, strict=True)}},
            "batchnorm": {"eps=0, a=0.5": 1e-16, "eps=1e-05, a=0.5": 1e-4},
            "input": {"relu_equivariant": {"0.5": 1e-16}, "layernorm_invariant": {"0.5": 1e-15}}}


def test_tldr_identity_and_the_breakdown_both_ways():
    assert A.tldr_identity(_art([1e-4] * 3)).verdict == "held"
    assert A.tldr_identity(_art([1e-4] * 3, eps0=1e-3)).verdict == "not held"
    assert A.small_norms_eps(_art([1e-5, 1e-4, 5e-4])).verdict == "held"
    broke = A.small_norms_eps(_art([1.25e-3, 0.13, 1.0]))  # the measured breakdown
    assert broke.verdict == "not held" and broke.kind == "finding"
    assert A.small_norms_eps(_art([1e-5] * 3, seeds=(0,))).verdict == "inconclusive"  # one network


def test_effective_lr_equivalence_both_ways():
    def summ(ratio):
        rows = [{"group": "grid", "lam": lam, "seed": s, "eff_lr": 1.0 * (ratio if lam else 1.0) * (1 + 0.001 * s)}
                for lam in (0.0, 0.016) for s in range(3)]
        return {"none": rows}
    assert A.effective_lr_matters(summ(3.0), (0.0, 0.016)).verdict == "not held"  # decay triples it: it matters
    assert A.effective_lr_matters(summ(1.0), (0.0, 0.016)).verdict == "held"


def test_batchnorm_and_input_identities_measured():
    x = torch.randn(32, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    bn = article.batchnorm_identity(x, seed=0)
    assert max(v for k, v in bn.items() if k.startswith("eps=0,")) < 1e-10
    assert max(v for k, v in bn.items() if k.startswith("eps=1e-05")) > 1e-10  # epsilon breaks it at a = 0.01
    assert math.isfinite(bn["eps=0, a=0.01"])


def test_the_written_out_batch_norm_is_torchs():
    z = torch.randn(32, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = torch.nn.BatchNorm1d(64, eps=1e-5, affine=False).double().train()(z)
    assert torch.allclose(article.batch_norm(z, 1e-5), ref, rtol=0, atol=1e-12)
