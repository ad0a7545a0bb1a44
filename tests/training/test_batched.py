"""The scale experiment's batched training (headrank.training.batched): the MLP variants'
invariances, the batched optimizers against torch.optim, the digits split, a short run."""

import numpy as np
import pytest
import torch

from headrank.analysis.scaling import scale_test
from headrank.training.batched import (
    RESIDUAL_VARIANTS,
    BatchedAdamW,
    BatchedMLP,
    BatchedSGD,
    digits_data,
    train_runs,
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_batched_mlp_variants_verdicts():
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for variant, expected in (("none", "invariant"), ("post", "invariant"), ("pre", "neither")):
        m = BatchedMLP(variant, seeds=[0, 1]).double()
        t = scale_test(m, lambda m=m: m(x), names=["W.0", "W.1", "W.2"])
        assert set(t["verdict"]) == {expected}, (variant, t["verdict"].tolist())
    assert RESIDUAL_VARIANTS == ("none", "post", "pre")


def _grad_fn(seed):
    gen = torch.Generator().manual_seed(seed)
    targets = [torch.randn(3, 5, 5, generator=gen, dtype=torch.float64),
               torch.randn(3, 4, generator=gen, dtype=torch.float64)]
    return lambda ps: sum(((p - t) ** 2 + torch.cos(3 * p)).sum() for p, t in zip(ps, targets, strict=True))


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_batched_optimizers_match_torch_optim(kind):
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64)
    o0 = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    lrs, lams, lr_other = [0.01, 0.03, 0.05], [0.0, 0.1, 0.5], [0.02, 0.02, 0.04]
    loss = _grad_fn(1)
    w, o = w0.clone().requires_grad_(), o0.clone().requires_grad_()
    lr_t, lam_t, lro_t = (torch.tensor(v, dtype=torch.float64) for v in (lrs, lams, lr_other))
    opt = (BatchedSGD([w], [o], lr_t, lam_t, momentum=0.9, lr_other=lro_t) if kind == "sgd"
           else BatchedAdamW([w], [o], lr_t, lam_t, lr_other=lro_t))
    refs = []
    for r in range(3):
        wr, orr = w0[r].clone().requires_grad_(), o0[r].clone().requires_grad_()
        groups = [{"params": [wr], "lr": lrs[r], "weight_decay": lams[r]},
                  {"params": [orr], "lr": lr_other[r], "weight_decay": 0.0}]
        ref = torch.optim.SGD(groups, momentum=0.9) if kind == "sgd" else torch.optim.AdamW(groups)
        refs.append((wr, orr, ref))
    for _ in range(25):
        w.grad = o.grad = None
        loss([w, o]).backward()
        opt.step()
        for r, (wr, orr, ref) in enumerate(refs):
            ref.zero_grad()
            full_w, full_o = w0.clone(), o0.clone()
            full_w[r], full_o[r] = wr, orr
            loss([full_w, full_o]).backward()
            ref.step()
    for r, (wr, orr, _) in enumerate(refs):
        torch.testing.assert_close(w[r].detach(), wr.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(o[r].detach(), orr.detach(), rtol=1e-12, atol=1e-12)


def test_digits_data_is_the_one_source_standardised():
    from headrank.models.data import digits_arrays

    d = digits_data()
    images, labels = digits_arrays()
    assert d.x_train.shape == (1300, 64) and d.x_test.shape == (497, 64) and d.x_train.dtype == torch.float32
    perm = np.random.default_rng(0).permutation(len(labels))
    assert torch.equal(d.y_test, torch.tensor(labels[perm][:497]))
    xtr = images.reshape(len(labels), -1)[perm][497:]
    sd = xtr.std(0)
    sd[sd == 0] = 1.0
    np.testing.assert_allclose(d.x_train.numpy(), (xtr - xtr.mean(0)) / sd, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(d.x_train.numpy().mean(0), 0.0, atol=1e-5)


def test_train_runs_short_history_shapes_and_invariance():
    d = digits_data()
    r = train_runs("none", lams=[0.0, 1e-2], lrs=[0.05, 0.05], seeds=[0, 0], data=d, steps=20, batch=16,
                   windows=4, evals=2, input_noise=1.0)
    assert r["norm"].shape == (4, 2, 3) and r["angle"].shape == (4, 2, 3) and r["loss"].shape == (4, 2)
    assert list(r["step"]) == [5, 10, 15, 20] and list(r["eval_step"]) == [0, 10, 20]
    assert np.abs(r["cos_gw"]).max() < 1e-4  # <grad, W> = 0 for scale-invariant W
    assert (r["norm"][-1, 1] < r["norm"][-1, 0]).all()  # decay shrinks W
    np.testing.assert_allclose(r["eff_lr"], 0.05 / r["norm"] ** 2, rtol=1e-6)  # lr held in float32
    with pytest.raises(ValueError):
        train_runs("none", lams=[0.0], lrs=[], seeds=[0], data=d)
