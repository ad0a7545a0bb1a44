"""Training configs: the learning-rate schedule, the decay exposure it implies, what config.json holds."""

import math

import pytest

from attnrank.errors import AttnRankError
from attnrank.training.config import (
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
    with pytest.raises(AttnRankError, match="schedule"):
        recall_config(schedule="linear")
    assert recall_config(tie_embeddings=True).model.tie_embeddings  # MODEL_KEYS, as for lm/vit
    with pytest.raises(AttnRankError, match="unknown training option"):
        make_config("recall", bogus=1)
