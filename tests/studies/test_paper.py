"""The paper profile (issue 35): its parameters (λ = 0.1 at exposure ≥ 8 from the schedule the runs
follow, the 2 × 2 design, ≥ 5 paired seeds), the three judged sentences both ways on synthetic
runs in the profile's layout, and where it runs (device, autocast, Ray)."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from headrank.errors import HeadRankError
from headrank.studies import paper
from headrank.studies.decouple import DecoupleParams, decay_helps
from headrank.studies.fig3 import Fig3Params, literal_lowers
from headrank.studies.registry import get
from headrank.studies.table1 import Table1Params, attn_decay_hurts, decoupling_helps, hurts_literal
from headrank.training.config import lr_at, make_config
from headrank.training.distributed import autocast_dtype, resolve_device

# -- parameters --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lm", "vit"])
def test_literal_lambda_reaches_the_pretraining_exposure_on_the_schedule_it_trains_with(kind):
    r = paper.REGIME
    cfg = make_config(kind, **{**paper.base(kind), "attn_weight_decay": r.lam})
    # summed here from the loop's own schedule, not from steps_for_exposure's closed form
    lr_sum = sum(lr_at(cfg, t) for t in range(1, cfg.steps + 1))
    assert r.lam == 0.1 and r.target_exposure >= 8.0
    assert r.lam * lr_sum >= 8.0
    assert r.lam * (lr_sum - lr_at(cfg, cfg.steps)) < r.target_exposure  # the fewest steps that do
    assert cfg.lr == paper.kind_lr(r, kind) and cfg.schedule == "constant" and cfg.warmup == r.warmup


def test_steps_for_exposure_is_the_fewest_steps_for_other_regimes():
    for lr, warmup, target in [(1e-2, 100, 8.0), (3e-3, 0, 2.0), (5e-2, 300, 8.0)]:
        r = dataclasses.replace(paper.REGIME, lr=lr, warmup=warmup, target_exposure=target)
        n = paper.steps_for_exposure(r)
        sums = np.cumsum([lr * min(1.0, t / warmup) if warmup else lr for t in range(1, n + 1)])
        assert r.lam * sums[-1] >= target > r.lam * sums[-2]


def test_design_is_a_two_by_two_with_five_paired_seeds():
    g = paper.grid("lm")
    assert g == {"attn_weight_decay": [0.0, 0.1], "weight_decay": [0.0, 0.1]}
    assert paper.grid("vit")["attn_weight_decay"] == [0.0, 0.1]
    for params in (Fig3Params.paper(), Table1Params.paper(), DecoupleParams.paper()):
        assert params.profile == "paper" and len(params.seeds) >= 5 and len(set(params.seeds)) == len(params.seeds)
    t = Table1Params.paper()
    assert t.literal_lambda == 0.1 and t.steps == paper.steps_for_exposure()
    assert Fig3Params.paper().lm_steps == paper.steps_for_exposure() and DecoupleParams.paper().max_chars is None
    assert "max_chars" not in paper.base("lm")  # the whole corpus


def test_registry_offers_paper_only_where_a_study_has_it():
    for name in ("fig3", "table1", "decouple"):
        study = get(name).study
        assert "paper" in study.profiles() and study.make_params("paper").profile == "paper"
        assert study.make_params("quick").profile == "quick"
    with pytest.raises(HeadRankError, match="unknown profile 'paper'"):
        get("fig5").study.make_params("paper")


# -- the three sentences, both ways on synthetic runs -------------------------------------------------

def _ppl_runs(cells, seeds=range(5), noise=0.05):
    """A 2 × 2 runs table with these mean perplexities per (attn λ, other λ) cell, a seed effect shared
    by a seed's cells (pairing removes it) and small per-run noise; validation = test + noise."""
    rng = np.random.default_rng(1)
    rows = []
    for s in seeds:
        shift = rng.normal(0, 1)
        for (a, m), mean in cells.items():
            p = mean + shift + rng.normal(0, noise)
            rows.append({"attn_weight_decay": a, "weight_decay": m, "seed": s, "test_ppl": p,
                         "val_ppl": p + rng.normal(0, noise), "exposure_attn": 8.0025 * (a > 0),
                         "exposure_other": 8.0025 * (m > 0)})
    return pd.DataFrame(rows)


def _cells(c00, c10, c01, c11):
    """(attn, other): (0, 0), (0.1, 0), (0, 0.1), (0.1, 0.1)."""
    return {(0.0, 0.0): c00, (0.1, 0.0): c10, (0.0, 0.1): c01, (0.1, 0.1): c11}


def test_attn_decay_hurts_held_and_not_held_with_the_measured_main_effect():
    held = _ppl_runs(_cells(10, 11, 9.5, 10.5))
    c = attn_decay_hurts(held)
    assert c.verdict == "held"
    per_seed = held.pivot_table(index="seed", columns="attn_weight_decay", values="test_ppl", aggfunc="mean")
    assert c.measured["main_effect"]["diff"] == pytest.approx((per_seed[0.1] - per_seed[0.0]).mean())
    assert c.measured["main_effect"]["diff"] == pytest.approx(1.0, abs=0.1)
    assert hurts_literal(held, 0.1, 3e-2).verdict == "held"
    not_held = attn_decay_hurts(_ppl_runs(_cells(10, 9, 9.5, 8.5)))
    assert not_held.verdict == "not held" and not_held.measured["main_effect"]["diff"] < 0
    assert hurts_literal(_ppl_runs(_cells(10, 9, 9.5, 8.5)), 0.1, 3e-2).verdict == "not held"
    assert attn_decay_hurts(_ppl_runs(_cells(10, 10, 10, 10), noise=1.0)).verdict != "held"


def test_decoupling_held_not_held_and_untested():
    # decay helps (coupled 0.1 below coupled 0), the decoupled twin lower still
    c = decoupling_helps(_ppl_runs(_cells(10, 10.3, 8.5, 9.5)), name="decouple.decoupling_helps")
    assert c.verdict == "held" and c.measured["best_coupled_lambda"] == 0.1
    assert c.measured["difference"]["diff"] == pytest.approx(1.0, abs=0.1)
    assert decoupling_helps(_ppl_runs(_cells(10, 10.3, 10.5, 9.5))).verdict == "not held"
    no_regime = _ppl_runs(_cells(10, 10.3, 11, 12))  # coupled decay hurts: the sentence is untested here
    assert decoupling_helps(no_regime).verdict == "inconclusive" and "untested" in decoupling_helps(no_regime).reason
    assert decay_helps(_ppl_runs(_cells(10, 10.3, 8.5, 9.5))).verdict == "held"
    assert decay_helps(no_regime).verdict == "not held"


def _spectrum(eff_rank_like, dh=16):
    s = np.full(dh, 1e-4)
    s[:eff_rank_like] = 1.0
    return s.tolist()


def _fig3_lm(rank0, rank01, seeds=range(5)):
    runs = []
    for lam, k in ((0.0, rank0), (0.1, rank01)):
        for s in seeds:
            sv = [[_spectrum(k + (s % 2)) for _ in range(4)]]
            runs.append({"lam": lam, "seed": s, "exposure": {"attn": lam * 80.01, "other": 8.0}, "sv": {"qk": sv, "ov": sv}})
    return {"lambdas": [0.0, 0.1], "literal_lambda": 0.1, "lr_peak": 3e-2, "runs": runs, "layers": [1], "n_layers": 2}


def test_lam01_literal_held_and_not_held_at_the_pretraining_exposure():
    c = literal_lowers(_fig3_lm(12, 4), "lm", 2767)
    assert c.verdict == "held" and c.exposure["got_attn"] == pytest.approx(8.001)
    # effective rank of k equal singular values (and a 1e-4 floor) is about k: the drop is ~8
    assert c.measured["qk"]["drop"] == pytest.approx(8.0, abs=0.1)
    assert literal_lowers(_fig3_lm(4, 12), "lm", 2767).verdict == "not held"


# -- where it runs ----------------------------------------------------------------------------------

def test_autocast_only_on_cuda_with_bf16(monkeypatch):
    cpu = torch.device("cpu")
    assert autocast_dtype(cpu, "auto") is None and autocast_dtype(cpu, "off") is None
    with pytest.raises(HeadRankError, match="bf16"):
        autocast_dtype(cpu, "bf16")
    with pytest.raises(HeadRankError, match="amp must be"):
        autocast_dtype(cpu, "fp8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cuda = torch.device("cuda")
    assert autocast_dtype(cuda, "auto") is torch.bfloat16 and autocast_dtype(cuda, "bf16") is torch.bfloat16
    assert autocast_dtype(cuda, "off") is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_dtype(cuda, "auto") is None  # an older GPU trains in float32


def test_placement_follows_the_machine(monkeypatch):
    monkeypatch.delenv("HEADRANK_RAY", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert paper.placement() == {"device": "cpu", "resolved": "cpu", "autocast": "off", "ray": None}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setenv("HEADRANK_RAY", "auto")
    assert resolve_device("auto").type == "cuda"
    assert paper.placement() == {"device": "cuda", "resolved": "cuda", "autocast": "bfloat16", "ray": "auto"}


def test_data_use_is_read_from_the_runs(tmp_path):
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"data": {"tokens": {"train": 1_000_000}}}))
    res = type("Res", (), {"out": tmp_path, "runs": pd.DataFrame({"name": ["r0"]})})()
    u = paper.data_use("lm", res)
    b = paper.base("lm")
    assert u["seen"] == b["steps"] * b["batch_size"] * b["seq_len"] and u["passes"] == pytest.approx(u["seen"] / 1e6)
    (run / "summary.json").write_text(json.dumps({"data": {"n_per_split": {"train": 1000}}}))
    v = paper.base("vit")
    assert paper.data_use("vit", res)["passes"] == pytest.approx(v["steps"] * paper.REGIME.vit_batch / 1000)


def test_training_refuses_bf16_on_the_cpu_before_writing(tmp_path):
    from headrank.training.loop import train

    cfg = make_config("recall", steps=2, n_layers=1, d_model=16, n_heads=2, batch_size=4)
    with pytest.raises(HeadRankError, match="bf16"):
        train(tmp_path / "run", cfg, device="cpu", amp="bf16")
    assert not (tmp_path / "run").exists()


# -- the ViT pilot: its criterion reads validation accuracy and cost, never a rank ---------------------

def _pilot(accs, cpu=60.0):
    return [{"lr": lr, "width": w, "batch": b, "steps": paper.steps_for_exposure(paper.vit_candidate(lr, w, b), "vit"),
             "cpu_s": cpu, "val_acc": a, "test_acc": 0.0, "loss": 1.0} for (lr, w, b), a in zip(paper.VIT_PILOT, accs,
                                                                                               strict=True)]


def test_vit_pilot_criterion():
    assert paper.VIT_PILOT[0] == (3e-2, 32, 16)  # the first run's configuration is a candidate
    # the largest lr that learns wins (fewest steps); ties go to the earlier candidate
    tie = paper.choose_vit(_pilot([0.5, 0.95, 0.97, 0.96, 0.99]))
    assert (tie["lr"], tie["width"], tie["batch"]) == (1e-2, 32, 16)
    only_slow = paper.choose_vit(_pilot([0.5, 0.85, 0.91, 0.8, 0.89]))
    assert (only_slow["lr"], only_slow["width"]) == (3e-3, 32)
    assert paper.choose_vit(_pilot([0.5, 0.85, 0.89, 0.8, 0.89])) is None  # none learns: no runs
    assert paper.choose_vit(_pilot([0.95] * 5, cpu=paper.VIT_RUNS_BUDGET_S)) is None  # none fits the budget
    assert all("rank" not in k for k in _pilot([0.9] * 5)[0])


def test_the_regime_runs_the_vit_the_pilot_chose():
    """The pilot's measured validation accuracies (docs/paper_regime.md) give lr 1e-2, width 32, batch
    16 by the criterion, and that is what the regime trains (in its own runs directory)."""
    accs = [0.601, 0.952, 0.989, 0.963, 0.968]  # lr 3e-2 / 1e-2 / 3e-3 (w32 b16), 1e-2 w32 b64, 1e-2 w64 b64
    cpu = [23.1, 53.2, 163.7, 94.7, 186.7]
    pilot = [{**p, "cpu_s": c} for p, c in zip(_pilot(accs), cpu, strict=True)]
    chosen = paper.choose_vit(pilot)
    r = paper.REGIME
    assert (chosen["lr"], chosen["width"], chosen["batch"]) == (paper.kind_lr(r, "vit"), *paper.kind_width(r, "vit")[:1],
                                                                 r.vit_batch)
    assert paper.runs_path("vit") != paper.runs_path("lm") and r.vit_dir != "vit"  # not the first run's directory
    assert paper.base("vit")["steps"] == chosen["steps"] == 8100


def test_vit_candidate_steps_follow_its_lr_and_keep_heads_of_16():
    c = paper.vit_candidate(1e-2, 64, 64)
    b = paper.base("vit", c)
    assert b["lr"] == 1e-2 and b["d_model"] == 64 and b["n_heads"] == 4 and b["batch_size"] == 64
    assert b["steps"] == paper.steps_for_exposure(c, "vit") and paper.literal_exposure("vit", c) >= 8.0
    assert paper.base("lm", c) == paper.base("lm")  # the LM is untouched
