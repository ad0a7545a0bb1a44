"""Training configs: the learning-rate schedule, the decay exposure it implies, what config.json holds."""

import json
import math
from dataclasses import fields

import pytest

from headrank.errors import HeadRankError
from headrank.training.config import (
    CONFIG_CLASSES,
    LMTrainConfig,
    RecallTrainConfig,
    TrainConfig,
    ViTTrainConfig,
    comparable,
    decay_exposure,
    lr_at,
    make_config,
    recall_config,
    run_config,
)


def test_constant_schedule_is_the_default_and_stays_out_of_config_json():
    cfg = recall_config(steps=50, warmup=10)
    assert cfg.schedule == "constant" and "schedule" not in cfg.to_dict()
    assert [lr_at(cfg, t) for t in (5, 10, 11, 50)] == [cfg.lr / 2, cfg.lr, cfg.lr, cfg.lr]
    assert decay_exposure(cfg)["lr_sum"] == pytest.approx(cfg.lr * (5.5 + 40))


def test_cosine_schedule_decays_to_zero_and_the_exposure_follows_it():
    cfg = recall_config(steps=110, warmup=10, schedule="cosine", attn_weight_decay=2.0, weight_decay=0.1)
    assert cfg.to_dict()["schedule"] == "cosine"
    assert lr_at(cfg, 10) == cfg.lr and lr_at(cfg, 60) == pytest.approx(cfg.lr / 2) and lr_at(cfg, 110) == 0
    assert all(lr_at(cfg, t) >= lr_at(cfg, t + 1) for t in range(10, 110))
    lr_sum = math.fsum(lr_at(cfg, t) for t in range(1, 111))
    assert lr_sum == pytest.approx(cfg.lr * (5.5 + 49.5))  # warmup, then the cosine: sum of cos(pi k/100) = -1
    exp = decay_exposure(cfg)
    assert exp["attn"] == pytest.approx(2.0 * lr_sum) and exp["other"] == pytest.approx(0.1 * lr_sum)
    assert comparable(run_config(cfg)) != comparable(run_config(recall_config(steps=110, warmup=10,
                                                                               attn_weight_decay=2.0)))


def test_bad_schedule_and_one_list_of_model_keys():
    with pytest.raises(HeadRankError, match="schedule"):
        recall_config(schedule="linear")
    assert recall_config(tie_embeddings=True).model.tie_embeddings  # MODEL_KEYS, as for lm/vit
    with pytest.raises(HeadRankError, match="unknown training option"):
        make_config("recall", bogus=1)


#: a recall run's config.json as written before TrainConfig was split into a base and
#: RecallTrainConfig (recall_config(steps=50, n_pairs=3, schedule="cosine"), json.dumps order)
STORED_RECALL = (
    '{"kind": "headrank-run", "task_name": "recall", "task": {"n_pairs": 3, "n_keys": 8, "n_values": 8, '
    '"n_queries": 1, "vocab_size": 16, "seq_len": 7, "format": "k1 v1 ... kn vn q -> v(q); keys 0..n_keys-1, '
    'values n_keys..vocab_size-1; distinct keys per sequence, values with replacement; loss at the last position"}, '
    '"model": {"model_type": "headrank", "architecture": "Transformer", "vocab_size": 16, "max_seq_len": 7, '
    '"n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "d_mlp": 256, "mlp": false, '
    '"skip": true, "norm": "pre", "causal": true, "learned_positions": true, "bias": false, '
    '"tie_embeddings": false, "init_std": 0.1}, "steps": 50, "batch_size": 64, "lr": 0.003, "warmup": 100, '
    '"beta1": 0.9, "beta2": 0.99, "eps": 1e-08, "weight_decay": 0.1, "attn_weight_decay": 0.1, '
    '"grad_clip": 1.0, "seed": 0, "log_every": 10, "track_every": 100, "checkpoint_every": 500, '
    '"keep_checkpoints": 2, "tol": 0.001, "schedule": "cosine"}')


def test_a_recall_run_stored_before_the_rename_reads_back_and_writes_the_same_config_json():
    stored = json.loads(STORED_RECALL)
    cfg = CONFIG_CLASSES[stored["task_name"]].from_dict(stored)
    assert type(cfg) is RecallTrainConfig and cfg.task.n_pairs == 3 and cfg.schedule == "cosine"
    assert json.dumps(run_config(cfg)) == STORED_RECALL  # same keys, same order, same values
    assert json.dumps(run_config(recall_config(steps=50, n_pairs=3, schedule="cosine"))) == STORED_RECALL


def test_the_base_config_names_no_task_and_is_not_a_run():
    assert {k: c.TASK_NAME for k, c in CONFIG_CLASSES.items()} == {"recall": "recall", "lm": "lm", "vit": "vit"}
    assert all(issubclass(c, TrainConfig) and c is not TrainConfig for c in CONFIG_CLASSES.values())
    assert (CONFIG_CLASSES["lm"], CONFIG_CLASSES["vit"]) == (LMTrainConfig, ViTTrainConfig)
    with pytest.raises(TypeError, match="base of the training configs"):
        TrainConfig()
    assert "eval_every" not in {f.name for f in fields(RecallTrainConfig)}  # LM/ViT only


def test_lr_sums_count_the_warmup_and_end_at_the_runs_lr_sum():
    from headrank.training.config import decay_exposure, lr_sums, recall_config

    cfg = recall_config(steps=5, lr=0.3, warmup=3, schedule="constant")
    # by hand: warmup 0.1, 0.2, 0.3, then 0.3 per step
    assert lr_sums(cfg) == pytest.approx([0.0, 0.1, 0.3, 0.6, 0.9, 1.2], rel=1e-12)
    cos = recall_config(steps=40, lr=1e-2, warmup=4, schedule="cosine")
    assert lr_sums(cos)[-1] == pytest.approx(decay_exposure(cos)["lr_sum"], rel=1e-12)
