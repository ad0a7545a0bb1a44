"""RankTracker for plain loops: measure(step) returns a metrics.jsonl row, scalars() flattens it
(per layer and overall, gap over bound per head), log_to() sends it to TensorBoard, MLflow-like
and W&B-like sinks and callables."""

import math

import numpy as np
import pytest
import torch

from headrank.analysis.tracker import RankTracker, log_to, scalars, tracker_table
from headrank.core.metrics import SUMMARY_METRICS
from headrank.errors import HeadRankError
from headrank.models.transformer import ModelConfig, Transformer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=12, max_seq_len=8, n_layers=2, d_model=16, n_heads=2, mlp=False))


def test_measure_with_a_step_is_a_row_and_without_it_the_old_fields(model):
    tr = RankTracker(model, every=5)
    row = tr.measure(7)
    assert row["step"] == 7 and set(row) == {"step", "mean", "heads"}
    assert {k: v for k, v in row.items() if k != "step"} == tr.measure()
    t = tracker_table([row])
    assert len(t) == 2 * 2 * 2 and set(t["step"]) == {7}


def test_scalars_are_means_over_heads_per_layer_and_overall(model):
    row = RankTracker(model).measure(0)
    v = scalars(row)
    h = row["heads"]["qk"]
    assert v["rank/qk/effective_rank"] == pytest.approx(np.mean(h["effective_rank"]))
    assert v["rank/layer_1/ov/rank"] == pytest.approx(np.mean(row["heads"]["ov"]["rank"][1]))
    gap_rel = np.asarray(h["gap"]) / np.asarray(h["frob_bound"])
    assert v["rank/qk/gap_rel"] == pytest.approx(gap_rel.mean())
    assert v["rank/layer_0/qk/gap_rel"] == pytest.approx(gap_rel[0].mean())
    assert v["rank/ov/balance_rel"] == pytest.approx(row["mean"]["ov"]["balance_rel"])
    assert len(v) == 2 * len(SUMMARY_METRICS) * (1 + 2)  # products x metrics x (overall + 2 layers)
    assert set(scalars(row, prefix="r", per_layer=False)) == {f"r/{p}/{k}" for p in ("qk", "ov") for k in
                                                              SUMMARY_METRICS}
    assert {"k90", "k99", "gap_rel", "effective_rank"} <= set(SUMMARY_METRICS)


def test_energy_ranks_match_the_dense_svd_of_each_head(model):
    """k90 / k99 of every head against numpy's SVD of the formed W_K,hᵀ W_Q,h and P_h W_V,h."""
    row = RankTracker(model).measure(0)
    dh = 8
    for i, block in enumerate(model.blocks):
        a = block.attn
        wq, wk, wv, wo = (x.weight.detach().double().numpy() for x in (a.q, a.k, a.v, a.o))
        for h in range(2):
            rows = slice(h * dh, (h + 1) * dh)
            for product, A, B in (("qk", wk[rows].T, wq[rows].T), ("ov", wo[:, rows], wv[rows].T)):
                s = np.linalg.svd(A @ B.T, compute_uv=False)
                share = np.cumsum(s**2) / (s**2).sum()
                for key, f in (("k90", 0.90), ("k99", 0.99)):
                    assert row["heads"][product][key][i][h] == int(np.argmax(share >= f * (1 - 1e-12)) + 1)
                bound = 0.5 * ((A**2).sum() + (B**2).sum())
                assert row["heads"][product]["gap_rel"][i][h] == pytest.approx(1 - s.sum() / bound, rel=1e-9)


def test_log_to_tensorboard_and_duck_typed_sinks(model, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    tr = RankTracker(model)
    rows = [tr.measure(0), tr.measure(3)]
    with SummaryWriter(str(tmp_path / "tb")) as w:
        for r in rows:
            log_to(w, r)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    ev = {e.step: e.value for e in acc.Scalars("rank/layer_0/qk/effective_rank")}
    assert ev == {0: pytest.approx(scalars(rows[0])["rank/layer_0/qk/effective_rank"]),
                  3: pytest.approx(scalars(rows[1])["rank/layer_0/qk/effective_rank"])}

    got = []

    class MlflowLike:
        def log_metrics(self, d, step):
            got.append(("mlflow", step, d))

    class WandbLike:
        def log(self, d, step):
            got.append(("wandb", step, d))

    bad = dict(rows[1], heads={p: dict(m, effective_rank=[[math.nan] * 2] * 2) for p, m in rows[1]["heads"].items()})
    log_to(MlflowLike(), bad)
    log_to(WandbLike(), rows[1])
    log_to(lambda d, step: got.append(("fn", step, d)), rows[0], per_layer=False)
    assert [(k, s) for k, s, _ in got] == [("mlflow", 3), ("wandb", 3), ("fn", 0)]
    assert "rank/qk/effective_rank" not in got[0][2]  # non-finite: left out for MLflow
    assert got[1][2] == scalars(rows[1]) and len(got[2][2]) == 2 * len(SUMMARY_METRICS)
    with pytest.raises(HeadRankError, match="cannot log"):
        log_to(object(), rows[0])
