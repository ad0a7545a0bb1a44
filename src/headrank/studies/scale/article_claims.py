"""The claims of Dar's article that its own algebra decides (docs/methods/scale.md): the TL;DR as
an identity at LayerNorm epsilon 0, the epsilon > 0 breakdown of "arbitrarily small weight
matrix norms" as a finding, BatchNorm's scale invariance and input-scaling equivariance as
identities, and the effective learning rate SGD trains with against "it's not going to matter"
(our check, reported against the quote). Each a pure function of the stored data."""

from __future__ import annotations

import math
from typing import Any

from headrank.studies.registry import Claim, g3, series
from headrank.studies.verdicts import MARGIN_RULE, PLUS_MINUS, combine_reason, equivalence, paired

ARTICLE = "article 'Weight Decay is Useless Without Residual Connections'"
Q_TLDR = ("TL;DR: in this article, we show that in ReLU feedforward networks with LayerNorm that don’t have residual "
          "connections, the optimal loss value is not changed by weight decay regularization.")
Q_SMALL = ("for every network with such architecture, we can design an equivalent network (i.e. computing exactly the "
           "same function) with arbitrarily small weight matrix norms")
Q_BN = ("other forms of normalization, such as BatchNorm, satisfy the positive scale invariance property and so they "
        "are as susceptible as LayerNorm to the discussed problems.")
Q_INPUT = ("multiply your input by a positive scalar and, lo and behold, the output is scaled exactly by the same "
           "factor.")
Q_MATTER = "In other words, we can remove the weight decay term and it’s not going to matter."
EXACT = 1e-10  # float64 rounding through a few layers
#: the largest relative change of the training loss that "computing exactly the same function" allows
#: with the real LayerNorm (epsilon 1e-5), declared before the run: 0.1 %
MARGIN_SHRINK = 1e-3
#: the smallest change of the effective learning rate eta/|W|^2 that matters, as |ln ratio| (about 10 %)
MARGIN_LOG_ELR = 0.1
MIN_SEEDS = 3


def _worst(d: dict[str, list[float]]) -> float:
    return max((max(v) for v in d.values() if v), default=math.nan)


def tldr_identity(art: dict[str, Any]) -> Claim:
    """The TL;DR as the identity it is: at LayerNorm epsilon 0, scaling every W of the trained λ = 0
    networks (variant none) by c ∈ {0.1, 0.01, 1e-3} leaves the training loss unchanged (≤ 1e-10
    relative), so the penalty goes to 0 at no cost and the optimum with decay equals the one
    without (as an infimum: the article's "arbitrarily close to")."""
    worst = _worst(art["shrink"]["eps0"])
    return Claim(
        name="scale.tldr_identity", source=f"{ARTICLE}, TL;DR", quote=Q_TLDR, kind="identity",
        statement="At LayerNorm epsilon 0, every W of a ReLU + LayerNorm network without residuals can be scaled by "
                  "c -> 0 with the training loss unchanged, so weight decay does not change the optimal loss value.",
        rule=f"max over seeds and c in {art['shrink']['c']} of the relative change of the training loss <= {EXACT:g}",
        measured=art["shrink"]["eps0"], expected=f"<= {EXACT:g}", tolerance=EXACT,
        held=math.isfinite(worst) and worst <= EXACT, key=f"largest relative change {g3(worst)}",
        detail=f"trained lambda = 0 networks of variant none, seeds {art['seeds']}, float64, LayerNorm epsilon 0.")


def small_norms_eps(art: dict[str, Any]) -> Claim:
    """The ε > 0 breakdown, a finding: with the LayerNorm epsilon the networks train with (1e-5),
    "arbitrarily small weight matrix norms" with the same function: the training loss changes by
    ≤ :data:`MARGIN_SHRINK` (relative) at every c, every seed. Per c: held if every seed is within,
    not held if every seed is beyond, else inconclusive; fewer than :data:`MIN_SEEDS` networks:
    inconclusive."""
    eps = art["shrink"]["eps"]
    parts = {c: ("held" if max(v) <= MARGIN_SHRINK else "not held" if min(v) > MARGIN_SHRINK else "inconclusive")
             for c, v in eps.items()}
    verdict, reason = combine_reason(parts)
    n = len(art["seeds"])
    if n < MIN_SEEDS:
        verdict, reason = "inconclusive", f"{n} networks < {MIN_SEEDS}"
    return Claim(
        name="scale.small_norms_eps", source=f"{ARTICLE}, 'How to Disappear Completely'", quote=Q_SMALL,
        statement="With a real LayerNorm (epsilon 1e-5), every W of the trained network can be made arbitrarily small "
                  "with the training loss unchanged (within 0.1 %).",
        rule=f"per c in {art['shrink']['c']}: relative change of the training loss <= {MARGIN_SHRINK:g} in every seed "
             f"(held), > it in every seed (not held), else inconclusive; several c: not held if any is; >= {MIN_SEEDS} "
             "networks",
        measured={"relative_change_eps_1e-5": eps, "parts": parts, "n_networks": n}, verdict=verdict, reason=reason,
        expected=f"<= {MARGIN_SHRINK:g} at every c", tolerance=MARGIN_SHRINK,
        key="largest relative change by c: " + series({c: max(v) for c, v in eps.items()}, "c"),
        detail="epsilon/(c^2 var) grows as the weights shrink: LayerNorm(c z) = LayerNorm(z) only at epsilon 0, so the "
               "equivalent network with arbitrarily small norms exists only in the epsilon -> 0 idealisation.")


def batchnorm_identity(art: dict[str, Any]) -> Claim:
    """BatchNorm (training mode, epsilon 0) makes the W before it scale-invariant."""
    e0 = {k: v for k, v in art["batchnorm"].items() if k.startswith("eps=0,")}
    worst = max(e0.values())
    return Claim(
        name="scale.batchnorm_invariant", source=f"{ARTICLE}, note on BatchNorm", quote=Q_BN, kind="identity",
        statement="BatchNorm (batch statistics, epsilon 0) after a weight matrix W: scaling W by a > 0 leaves the "
                  "output unchanged.", rule=f"max relative output error over a <= {EXACT:g}",
        measured=art["batchnorm"], expected=f"<= {EXACT:g}", tolerance=EXACT, held=worst <= EXACT,
        key=f"largest relative error {g3(worst)} at epsilon 0 (epsilon 1e-5: "
            f"{g3(max(v for k, v in art['batchnorm'].items() if not k.startswith('eps=0,')))})",
        detail="float64 Linear(64, 64, no bias) -> BatchNorm1d (training mode) -> ReLU -> Linear(64, 10) on the test "
               "digits; a in 0.5, 3, 0.01.")


def input_equivariance(art: dict[str, Any]) -> Claim:
    """Bias-free ReLU: f(a x) = a f(x); with LayerNorm (variant none, epsilon 0): f(a x) = f(x)."""
    inp = art["input"]
    worst = max(max(inp["relu_equivariant"].values()), max(inp["layernorm_invariant"].values()))
    return Claim(
        name="scale.input_equivariance", source=f"{ARTICLE}, 'Positive Scaling of ReLU Networks'", quote=Q_INPUT,
        kind="identity", statement="A bias-free ReLU network maps a x to a f(x); with LayerNorm (no residual, epsilon "
                                   "0) it maps a x to f(x).",
        rule=f"max relative error over a <= {EXACT:g}, both networks", measured=inp, expected=f"<= {EXACT:g}",
        tolerance=EXACT, held=worst <= EXACT, key=f"largest relative error {g3(worst)}",
        detail="float64; a in 0.5, 3, 0.01; the LayerNorm networks are the trained variant-none runs.")


def effective_lr_matters(summ: dict[str, list[dict[str, Any]]], lams: tuple[float, ...]) -> Claim:
    """Our check against "we can remove the weight decay term and it's not going to matter": for
    the optimum it is an identity (:func:`tldr_identity`); for what SGD does it is not: the
    effective learning rate η/|W|² at the grid's largest λ against λ = 0, as ln ratio paired by
    seed, by the equivalence rule against :data:`MARGIN_LOG_ELR` (held: decay does not change
    it; not held: it changes it beyond the margin); fewer than :data:`MIN_SEEDS` seeds: inconclusive."""
    rows = [r for r in summ["none"] if r.get("group", "grid") == "grid"]
    top = max(lams)
    at = {lam: {r["seed"]: math.log(r["eff_lr"]) for r in rows if r["lam"] == lam} for lam in (0.0, top)}
    d = paired(at[top], at[0.0])
    test = {**equivalence(d["diff"], d["spread"], d["n_seeds"], MARGIN_LOG_ELR)}
    verdict = "inconclusive" if test["verdict"] == "untested" else test["verdict"]
    reason = "" if verdict == "held" else test["outcome"]
    if d["n_seeds"] < MIN_SEEDS:
        verdict, reason = "inconclusive", f"{d['n_seeds']} seeds < {MIN_SEEDS}"
    return Claim(
        name="scale.effective_lr_matters", source="our check, against the article's 'it's not going to matter'",
        quote=Q_MATTER, kind="check", tests=[test],
        statement="Removing weight decay does not change the effective learning rate eta/|W|^2 SGD trains the "
                  "LayerNorm network (no residual) with.",
        rule=f"ln(eta/|W|^2 at lambda {top:g}) - ln(at lambda 0), paired by seed, equivalence against the margin "
             f"{MARGIN_LOG_ELR:g} (held inside it by TOST, not held beyond it; {MARGIN_RULE}); >= {MIN_SEEDS} seeds",
        measured={"ln_ratio": d, "test": test}, verdict=verdict, reason=reason, expected=f"|ln ratio| < {MARGIN_LOG_ELR:g}",
        tolerance=PLUS_MINUS, key=f"ln ratio {g3(d['diff'])} ± {g3(d['spread'])} (n {d['n_seeds']}, ratio "
                                  f"{g3(math.exp(d['diff']) if math.isfinite(d['diff']) else None)})",
        detail="tail means of eta/|W|^2 over the block matrices (variant none, the lambda grid). The article speaks of "
               "the optimum and leaves open what gradient descent finds; this is what it finds here.")


def claims(data: dict[str, Any], summ: dict[str, list[dict[str, Any]]], lams: tuple[float, ...]) -> list[Claim]:
    """The article's claims above, when the run measured them (an older run did not: none)."""
    art = data.get("article")
    if not art:
        return []
    return [tldr_identity(art), small_norms_eps(art), batchnorm_identity(art), input_equivariance(art),
            effective_lr_matters(summ, lams)]
