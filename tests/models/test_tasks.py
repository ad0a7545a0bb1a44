"""Associative recall: format, disjoint token ranges, seeding, resumable stream state."""

import pytest
import torch

from headrank.errors import HeadRankError
from headrank.models.tasks import (
    RecallConfig,
    RecallStream,
    make_recall_batch,
    query_positions,
    recall_loss_and_accuracy,
)


def _check_batch(cfg: RecallConfig, x: torch.Tensor, y: torch.Tensor) -> None:
    n, m = cfg.n_pairs, cfg.n_queries
    assert x.shape[1] == cfg.seq_len == 2 * n + 2 * m - 1
    keys, values = x[:, 0:2 * n:2], x[:, 1:2 * n:2]
    assert ((keys >= 0) & (keys < cfg.n_keys)).all()
    assert ((values >= cfg.n_keys) & (values < cfg.vocab_size)).all()
    y = y.reshape(len(x), -1)
    for b in range(len(x)):
        assert len(set(keys[b].tolist())) == n  # distinct keys
        table = dict(zip(keys[b].tolist(), values[b].tolist(), strict=True))
        for j, pos in enumerate(query_positions(cfg).tolist()):
            q = int(x[b, pos])
            assert q in table and table[q] == int(y[b, j])  # the target is the value bound to the query
            if pos + 1 < x.shape[1]:
                assert int(x[b, pos + 1]) == table[q]  # answers of earlier queries follow them


@pytest.mark.parametrize("cfg", [RecallConfig(), RecallConfig(n_pairs=4, n_keys=4, n_values=3),
                                 RecallConfig(n_pairs=3, n_keys=10, n_values=5, n_queries=4)])
def test_batches_follow_the_documented_format(cfg):
    x, y = make_recall_batch(cfg, 32, torch.Generator().manual_seed(0))
    assert x.dtype == y.dtype == torch.long
    _check_batch(cfg, x, y)
    if cfg.n_queries == 1:
        assert y.shape == (32,) and torch.equal(query_positions(cfg), torch.tensor([cfg.seq_len - 1]))


def test_queries_and_keys_cover_the_range_uniformly_enough():
    cfg = RecallConfig(n_pairs=4, n_keys=8, n_values=8)
    x, y = make_recall_batch(cfg, 4000, torch.Generator().manual_seed(1))
    counts = torch.bincount(x[:, -1], minlength=8).float()
    assert counts.min() > 0.8 * 4000 / 8  # each key is queried about equally often
    counts = torch.bincount(y - 8, minlength=8).float()
    assert counts.min() > 0.8 * 4000 / 8


def test_stream_is_seeded_and_resumes_exactly():
    cfg = RecallConfig()
    a = RecallStream(cfg, 8, seed=3)
    first = [a.next() for _ in range(3)]
    state = a.state_dict()
    rest = [a.next() for _ in range(2)]
    b = RecallStream(cfg, 8, seed=3)
    assert all(torch.equal(u[0], v[0]) for u, v in zip(first, [b.next() for _ in range(3)], strict=True))
    c = RecallStream(cfg, 8, seed=3)
    c.load_state_dict(state)
    assert c.batches == 3
    for (x1, y1), (x2, y2) in zip(rest, [c.next() for _ in range(2)], strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    d = RecallStream(cfg, 8, seed=4)
    assert not torch.equal(d.next()[0], first[0][0])
    with pytest.raises(HeadRankError):
        d.load_state_dict(state)
    # the state is plain tensors/ints: torch.load(weights_only=True) accepts it
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf, weights_only=True)["generator"], state["generator"])


def test_stream_does_not_touch_the_global_rng():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    RecallStream(RecallConfig(), 4, seed=0).next()
    assert torch.equal(before, torch.get_rng_state())


def test_loss_and_accuracy_read_the_query_positions():
    cfg = RecallConfig(n_pairs=3, n_keys=5, n_values=5, n_queries=2)
    x, y = make_recall_batch(cfg, 6, torch.Generator().manual_seed(2))
    logits = torch.zeros(6, cfg.seq_len, cfg.vocab_size)
    pos = query_positions(cfg)
    logits[torch.arange(6)[:, None], pos[None, :], y] = 20.0  # right at the queries
    loss, acc = recall_loss_and_accuracy(logits, y)
    assert acc == 1 and loss < 1e-6
    logits[:, pos[0], :] = 0.0  # wrong (uniform) at the first query only
    loss, acc = recall_loss_and_accuracy(logits, y)
    assert acc == 0.5  # argmax of a uniform row is token 0, a key: never the target
    assert loss == pytest.approx(0.5 * torch.log(torch.tensor(10.0)).item(), rel=1e-3)


@pytest.mark.parametrize("bad", [dict(n_pairs=0), dict(n_pairs=9, n_keys=8), dict(n_values=-1), dict(n_queries=0)])
def test_bad_sizes_are_user_errors(bad):
    with pytest.raises(HeadRankError):
        RecallConfig(**bad)


def test_label_noise_replaces_a_fraction_of_targets_and_leaves_a_noise_free_stream_unchanged():
    clean, noisy = RecallConfig(), RecallConfig(label_noise=0.3)
    x0, y0 = make_recall_batch(clean, 20000, torch.Generator().manual_seed(3))
    x1, y1 = make_recall_batch(noisy, 20000, torch.Generator().manual_seed(3))
    assert torch.equal(x0, x1)  # the inputs, true answers included, are the same draw
    changed = (y0 != y1).float().mean().item()
    assert changed == pytest.approx(0.3 * 7 / 8, abs=0.02)  # a flip picks the true value 1 time in 8
    assert ((y1 >= clean.n_keys) & (y1 < clean.vocab_size)).all()
    assert "label_noise" not in clean.to_dict() and noisy.to_dict()["label_noise"] == 0.3
    for bad in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(HeadRankError, match="label_noise"):
            RecallConfig(label_noise=bad)
