"""The scale experiment (the only slow part): train the batched MLPs, then measure on the trained
networks what the claims need (shrink checks, per-tensor verdicts). Returns JSON-able data."""

from __future__ import annotations

import copy
from contextlib import nullcontext
from typing import Any

import torch

from headrank.analysis.scaling import DEFAULT_SCALES, norm_eps_zero, scale_test, scaled
from headrank.studies.scale import article
from headrank.studies.scale.params import ScaleParams
from headrank.training.batched import (
    RESIDUAL_VARIANTS,
    VARIANT_FORMS,
    BatchedMLP,
    Digits,
    digits_data,
    evaluate,
    train_runs,
)
from headrank.util.threads import torch_threads

HISTORY_KEYS = ("step", "norm", "eff_lr", "angle", "loss", "grad_sq", "update_sq", "cos_gw", "eval_step",
                "train_loss", "train_acc", "test_loss", "test_acc", "lams", "lrs", "seeds", "variant",
                "optimizer", "momentum", "steps", "n_entries")


def history(r: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able part of a :func:`train_runs` result (everything but the model)."""
    return {k: r[k] for k in HISTORY_KEYS}


def run(p: ScaleParams) -> dict[str, Any]:
    """Train every run of ``p`` and measure the trained networks; one torch thread (64x64
    matrices: extra threads only add synchronisation, and contention)."""
    with torch_threads(1):
        torch.manual_seed(0)
        data = digits_data(p.n_test, seed=p.data_seed)
        runs, index = _sgd_runs(p, data)
        adamw = train_runs("none", optimizer="adamw", lams=[g[1] for g in p.adamw_grid],
                           lrs=[g[0] for g in p.adamw_grid], seeds=[p.seeds[0]] * len(p.adamw_grid),
                           lr_other=p.adamw_lr_other, data=data, steps=p.steps, batch=p.batch,
                           input_noise=p.input_noise, depth=p.depth, windows=p.windows, evals=p.evals,
                           data_seed=p.data_seed)
        clean = None
        if p.no_noise_control:  # the same "none" grid without input noise: the net interpolates
            clean = train_runs("none", lams=list(p.lams), lrs=[p.lr] * len(p.lams), seeds=[p.seeds[0]] * len(p.lams),
                               lr_other=p.lr_other, data=data, steps=p.steps, batch=p.batch, momentum=p.momentum,
                               input_noise=0.0, depth=p.depth, windows=p.windows, evals=p.evals,
                               data_seed=p.data_seed)
        shrink = {v: shrink_checks(runs[v]["model"], index[v].index("grid"), data, p.shrink) for v in RESIDUAL_VARIANTS}
        verdicts = {v: trained_verdicts(runs[v]["model"], data, p) for v in RESIDUAL_VARIANTS}
        homog = homogeneity(data, p)
        zero = [i * len(p.lams) + list(p.lams).index(0.0) for i in range(len(p.seeds))] if 0.0 in p.lams else []
        art = article.measure(runs["none"]["model"], zero, data, p.data_seed)
    return {
        "article": {**art, "seeds": list(p.seeds)},
        "homogeneity": homog,
        "setup": _setup(p, data),
        "runs": {v: {**history(runs[v]), "group": index[v]} for v in RESIDUAL_VARIANTS},
        "adamw": history(adamw),
        "no_noise": history(clean) if clean is not None else None,
        "shrink": shrink,
        "verdicts_trained": verdicts,
    }


def homogeneity(data: Digits, p: ScaleParams, scales: tuple[float, ...] = (0.5, 3.0)) -> dict[str, Any]:
    """Positive homogeneity of a ReLU network without LayerNorm (the article's first property):
    for a float64 ReLU MLP 64 → 64 → 64 → 10 on the test digits, scaling one layer's weight (and
    its bias) by a > 0 against a·f. Without biases every layer gives f(aW_i) = a f(W) to rounding;
    with biases in the later layers the identity breaks (recorded as the contrast)."""
    out: dict[str, Any] = {}
    x = data.x_test.double()
    for bias in (False, True):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p.data_seed)
            layers = [torch.nn.Linear(64, 64, bias=bias), torch.nn.Linear(64, 64, bias=bias),
                      torch.nn.Linear(64, 10, bias=bias)]
        net = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2]).double()
        with torch.no_grad():
            base = net(x)
            rel = {}
            for i in range(len(layers)):
                for a in scales:
                    m = copy.deepcopy(net)
                    target = m[2 * i]
                    target.weight.mul_(a)
                    if bias:
                        target.bias.mul_(a)
                    rel[f"layer {i}, a={a:g}"] = float((m(x) - a * base).norm() / (a * base).norm())
        out["with biases" if bias else "no biases"] = rel
    return out


def _sgd_runs(p: ScaleParams, data: Digits) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Per variant, the λ grid (lr) and the η·λ = const group, all seeds, trained together."""
    runs, index = {}, {}
    for v in RESIDUAL_VARIANTS:
        cfg = ([(lam, p.lr, s, "grid") for s in p.seeds for lam in p.lams]
               + [(lam, e, s, "product") for s in p.seeds for e, lam in p.product])
        runs[v] = train_runs(v, lams=[c[0] for c in cfg], lrs=[c[1] for c in cfg], seeds=[c[2] for c in cfg],
                             lr_other=p.lr_other, data=data, steps=p.steps, batch=p.batch, momentum=p.momentum,
                             input_noise=p.input_noise, depth=p.depth, windows=p.windows, evals=p.evals,
                             data_seed=p.data_seed)
        index[v] = [c[3] for c in cfg]
    return runs, index


def _setup(p: ScaleParams, data: Digits) -> dict[str, Any]:
    return {
        "task": f"scikit-learn digits, {data.x_train.shape[0]} train / {data.x_test.shape[0]} test, "
                "pixels standardised",
        "variants": VARIANT_FORMS, "width": int(data.x_train.shape[1]),
        "init": "W He-normal, A ~ N(0, 1/d), LayerNorm gain 1 shift 0; same init for every lam of a seed",
        "decay": "SGD: coupled L2 (torch.optim.SGD weight_decay) on W only; AdamW: decoupled, on W only",
        "input_noise": f"fresh N(0, {p.input_noise}^2) added to every minibatch's standardised pixels",
        "layernorm_eps": 1e-5, "torch_threads": 1,
    }


def single_run_loss(model: BatchedMLP, j: int, data: Digits, c: float, eps_zero: bool) -> tuple[float, float]:
    """Clean training loss of run j before and after scaling every W by c (float64)."""
    m = copy.deepcopy(model).double()
    x, y = data.x_train.double(), data.y_train
    ctx = norm_eps_zero(m) if eps_zero else nullcontext()
    with ctx, torch.no_grad():
        base = evaluate(m, x, y)[0][j]
        with scaled(m.decayed(), c):
            after = evaluate(m, x, y)[0][j]
    return float(base), float(after)


def shrink_checks(model: BatchedMLP, j0: int, data: Digits, c: float) -> dict[str, float]:
    """Relative change of the clean training loss when every W is scaled by ``c``: run ``j0``
    with LayerNorm epsilon 0 and as it is, and the largest change over all runs (epsilon kept)."""
    b0, a0 = single_run_loss(model, j0, data, c, eps_zero=True)
    b1, a1 = single_run_loss(model, j0, data, c, eps_zero=False)
    all_eps = []
    for j in range(model.A.shape[0]):
        b, a = single_run_loss(model, j, data, c, eps_zero=False)
        all_eps.append(abs(a - b) / b)
    return {"rel_change_eps0": abs(a0 - b0) / b0, "rel_change_eps": abs(a1 - b1) / b1,
            "loss": b1, "rel_change_eps_all_runs_max": max(all_eps), "c": c}


def trained_verdicts(model: BatchedMLP, data: Digits, p: ScaleParams) -> dict[str, Any]:
    """The per-tensor scale test on the trained networks (all runs of a variant at once)."""
    md = copy.deepcopy(model).double().eval()
    x = data.x_test[:p.verdict_inputs].double()
    t = scale_test(md, lambda: md(x), names=[f"W.{l}" for l in range(p.depth)])
    return {"verdicts": dict(zip(t["name"], t["verdict"], strict=True)),
            "inv_dev_max": float(t["inv_dev"].max()),
            "inv_dev_eps_max": float(t["inv_dev_eps"].max()) if t["inv_dev_eps"].notna().any() else None,
            "scales": list(DEFAULT_SCALES)}
