"""Claims of the collapse reproduction, each judged from the stored data alone (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from headrank.analysis.collapse import INITS, WELL_KNOWN, path_counts, path_length_stats
from headrank.studies.collapse.depth_claims import (
    cubic_rate,
    doubly_exponential,
    heads_modulate,
    stated_bound,
)
from headrank.studies.collapse.params import CollapseParams
from headrank.studies.registry import Claim, arrow, g3
from headrank.studies.verdicts import combine_reason, mean_spread, side

SRC_ART = "article on Dong, Cordonnier, Loukas 2021 (collapse)"
SRC_PURE = f"{SRC_ART}, Research Paper Focus"
SRC_SKIP = f"{SRC_ART}, Research Paper Focus"
SRC_MLP = f"{SRC_ART}, Research Paper Focus"
SRC_MLP_NOT = f"{SRC_ART}, Research Paper Focus"
SRC_PRODUCTS = f"{SRC_ART}, §5.2"
SRC_RESTRICTED = f"{SRC_ART}, §5.2"
SRC_SUM = f"{SRC_ART}, §2.2"
SRC_COUNTS = f"{SRC_ART}, §4.1"
Q_PURE = ("This phenomenon is characterized by the output of these networks converging to a rank-one matrix, where all "
          "rows become identical.")
Q_SKIP = "Skip connections help prevent rank collapse"
Q_MLP = "MLPs slow down the convergence by increasing the Lipschitz constant"
Q_PATHS = ("The expressivity of paths in a SAN is shown to decrease with increasing path length, contradicting the "
           "intuitive assumption that more layers (and hence longer paths) would increase expressivity.")
Q_ENSEMBLE = "that deep SANs with skip connections act like ensembles of weakly-dependent shallow networks."
Q_SUM = ("The study introduces a path decomposition method, expressing the SAN output as a sum of paths, each "
         "representing a sequence of self-attention heads across layers.")
Q_COUNTS = ("This equation calculates the total number of distinct paths of a given length in a SAN when skip "
            "connections are included, illustrating the increase in path diversity due to skip connections.")
RULE_RATIO = "per-sentence last/first residual; mean ± t_{0.975,n-1} SE against the threshold fixed in params"

ST_PURE = ("Pure self-attention (skips and MLPs removed) collapses towards rank one: the last layer's "
           "relative residual is much smaller than the first's, pretrained and at random init.")
ST_SKIP = "With skip connections (attention + skip, and the full model) the residual does not collapse."
ST_MLP = "MLPs slow the collapse: attention + MLP keeps a larger residual than pure attention."
ST_MLP_NOT = "Without skips, MLPs do not prevent the collapse: attention + MLP still collapses."
ST_PRODUCTS = "Products of attention matrices along longer head paths are closer to rank one."
ST_RESTRICTED = "The project's model restricted to paths of length k: longer paths give outputs closer to rank one."
ST_SUM = "With frozen attention, a self-attention network with skips equals the sum of its path terms."
ST_COUNTS = "A network of L layers with H heads and skips has C(L,k) H^k paths of length k."

SUM_TOL = 1e-12


def geo_curve(per_seq: list[list[float]]) -> np.ndarray:
    """Geometric mean over sequences (rows) per layer (columns), zeros clipped at 1e-300."""
    a = np.asarray(per_seq, dtype=float)
    return np.exp(np.log(np.maximum(a, 1e-300)).mean(0))


def strictly_decreasing_to_floor(y: Sequence[float | None], floor: float) -> bool:
    """True when ``y`` falls strictly at every step until it first reaches ``floor``."""
    y = [math.inf if v is None else v for v in y]
    for a, b in zip(y, y[1:], strict=False):
        if a <= floor:
            return True
        if not b < a:
            return False
    return True


def ratios(summary: list[dict[str, Any]], init: str, variant: str) -> dict[str, float]:
    """First- and last-layer residual of one (init, variant) row of the summary, and their ratio."""
    r = next(s for s in summary if s["init"] == init and s["variant"] == variant)
    lof = r["last_over_first"]
    return {"first": r["first"], "last": r["last"], "last/first": math.nan if lof is None else lof}


def _meta(data: dict[str, Any]) -> dict[str, Any]:
    return data.get("minilm_meta", {})


def mean_2se(values: Sequence[float]) -> tuple[float, float]:
    """Mean over sentences and its spread ``t_{0.975, n−1}`` · SE (:func:`verdicts.mean_spread`;
    the name is kept for the data's column labels)."""
    return mean_spread(values)


def per_sentence_ratio(data: dict[str, Any], key: str) -> list[float]:
    """Per sentence: last-layer over first-layer residual of ``init/variant`` ``key``."""
    rows = data["primary_by_seq"][key]
    return [math.nan if (r[0] in (None, 0) or r[-1] is None) else r[-1] / r[0] for r in rows]


def threshold_claim(data: dict[str, Any], keys: Sequence[str], threshold: float, below: bool
                    ) -> tuple[dict[str, Any], str, str]:
    """Measured ratios (summary and per-sentence mean ± 2 SE) of ``keys``, the verdict and its reason."""
    measured, verdicts = {}, {}
    for key in keys:
        init, variant = key.split("/")
        m, two_se = mean_2se(per_sentence_ratio(data, key))
        measured[key] = {**ratios(data["summary"], init, variant), "per-sentence last/first": m, "spread": two_se}
        verdicts[key] = side(m, two_se, threshold, below)
    verdict, reason = combine_reason(verdicts)
    return measured, verdict, reason


def ratio_key(measured: dict[str, Any]) -> str:
    """last/first per sentence, mean ± 2 SE, per part: a threshold claim's key."""
    return "last/first: " + "; ".join(f"{k} {g3(v['per-sentence last/first'])} ± {g3(v['spread'])}"
                                      for k, v in measured.items())


SPREAD = ("verdict per part on the per-sentence ratio last/first: held when mean ± t_{0.975,n-1} SE lies wholly on "
          "the claimed side of the threshold, not held when wholly on the other side, else inconclusive (NaN: "
          "inconclusive)")


def pure_attention(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Pure attention: last/first ≤ ratio_collapse for both inits (per sentence, mean ± 2 SE)."""
    measured, verdict, reason = threshold_claim(data, [f"{i}/pure" for i in INITS], p.ratio_collapse, below=True)
    return Claim(
        name="collapse.pure_attention", source=SRC_PURE, statement=ST_PURE, quote=Q_PURE,
        rule=f"{RULE_RATIO}: <= {p.ratio_collapse:g} for pure attention, both inits",
        measured=measured, expected={f"{i}/pure": f"last/first <= {p.ratio_collapse:g}" for i in INITS},
        tolerance=f"'much smaller' taken as two orders of magnitude ({p.ratio_collapse:g}); {SPREAD}",
        verdict=verdict, reason=reason, key=ratio_key(measured),
        detail=f"MiniLM-L6, {_meta(data).get('n_seqs')} sentences, res_composite (x = mean row); first = embedding "
               "output, last = after layer 6; 'first', 'last', 'last/first' are the means over sentences. float64: "
               "values near 1e-16 are the rounding floor.")


def skip_prevents(data: dict[str, Any], p: CollapseParams) -> Claim:
    """With skips: last/first ≥ ratio_prevent for skip and full, both inits (mean ± 2 SE)."""
    keys = [f"{i}/{v}" for i in INITS for v in ("skip", "full")]
    measured, verdict, reason = threshold_claim(data, keys, p.ratio_prevent, below=False)
    return Claim(
        name="collapse.skip_prevents", source=SRC_SKIP, statement=ST_SKIP, quote=Q_SKIP,
        rule=f"{RULE_RATIO}: >= {p.ratio_prevent:g} for skip and full, both inits",
        measured=measured, expected=f"last/first >= {p.ratio_prevent:g} for every variant with skips and both inits",
        tolerance=f"'does not collapse' taken as keeping at least half ({p.ratio_prevent:g}) of the first layer's "
                  f"residual; {SPREAD}",
        verdict=verdict, reason=reason, key=ratio_key(measured),
        detail="Same batch and measure as collapse.pure_attention.")


def mlp_slows(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Paired per sentence: mean over the layers where pure attention is above the floor of
    log10(res with MLP / pure), judged by mean ± 2 SE over sentences against 0."""
    per_layer, verdicts = {}, {}
    for i in INITS:
        a = np.asarray(data["primary_by_seq"][f"{i}/mlp"], dtype=float)
        b = np.asarray(data["primary_by_seq"][f"{i}/pure"], dtype=float)
        gp = geo_curve(data["primary_by_seq"][f"{i}/pure"])
        layers = [layer for layer in range(1, a.shape[1]) if gp[layer] > p.floor]
        d = {f"layer {layer}": float(np.mean(np.log10(a[:, layer] / b[:, layer]))) for layer in layers}
        m, two_se = mean_2se(np.log10(a[:, layers] / b[:, layers]).mean(1)) if layers else (math.nan, math.nan)
        per_layer[i] = {"mean log10(mlp/pure)": float(np.mean(list(d.values()))) if d else math.nan,
                        "spread over sentences": two_se, **d}
        verdicts[i] = side(m, two_se, 0.0, below=False) if layers else "inconclusive"
        if verdicts[i] == "held" and m - two_se <= 0:  # a difference of exactly 0 is no slowing
            verdicts[i] = "inconclusive"
    verdict, reason = combine_reason(verdicts)
    empty = [i for i in INITS if len(per_layer[i]) == 2]
    if empty:
        reason = f"no layer above the floor to compare for: {', '.join(empty)}"
    return Claim(
        name="collapse.mlp_slows", source=SRC_MLP, statement=ST_MLP, quote=Q_MLP,
        rule="per sentence, mean over layers above the float64 floor of log10(res mlp / res pure) > 0 beyond "
             "t_{0.975,n-1} SE, both inits",
        measured=per_layer, expected="mean over layers of log10(residual with MLP / without) > 0, for both inits",
        tolerance="sign, beyond the spread: per sentence the mean over judged layers of log10(mlp/pure); held when "
                  "mean - spread > 0, not held when mean + spread < 0, else inconclusive (spread = t_{0.975,n-1} SE)",
        verdict=verdict, reason=reason,
        key="mean log10(mlp/pure): " + "; ".join(f"{i} {g3(v['mean log10(mlp/pure)'])} ± {g3(v['spread over sentences'])}"
                                                 for i, v in per_layer.items()),
        detail="Paired per sentence: log10 of res_composite with MLP over without, at every layer >= 1 where pure "
               f"attention is still above the float64 floor ({p.floor:g}) in the geometric mean over sentences. "
               "Per-layer values (means over sentences) show where the MLP helps and where it does not.")


def mlp_does_not_prevent(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Attention + MLP without skips: last/first ≤ ratio_collapse for both inits (mean ± 2 SE)."""
    measured, verdict, reason = threshold_claim(data, [f"{i}/mlp" for i in INITS], p.ratio_collapse, below=True)
    return Claim(
        name="collapse.mlp_does_not_prevent", source=SRC_MLP_NOT, statement=ST_MLP_NOT, quote=Q_MLP,
        supports="collapse.mlp_slows", rule=f"{RULE_RATIO}: <= {p.ratio_collapse:g} for attention + MLP, both inits",
        measured=measured, expected={f"{i}/mlp": f"last/first <= {p.ratio_collapse:g}" for i in INITS},
        tolerance=f"{p.ratio_collapse:g}; {SPREAD}", verdict=verdict, reason=reason, key=ratio_key(measured),
        detail="Same batch and measure as collapse.pure_attention.")


Q_LIPSCHITZ = "It acts as a control parameter for the convergence rate, with higher values slowing down rank collapse."


def _lipschitz_points(data: dict[str, Any], p: CollapseParams) -> list[dict[str, Any]]:
    """Per (init, layer l) where pure and MLP residuals are above the floor before and after l: the
    MLP's Lipschitz bound and how much less the residual shrinks in layer l with the MLP:
    log10(r_mlp(l)/r_mlp(l-1)) - log10(r_pure(l)/r_pure(l-1)) (geometric means over sentences)."""
    pts = []
    for i, v in data.get("bound", {}).get("minilm", {}).items():
        gp = geo_curve(data["primary_by_seq"][f"{i}/pure"])
        gm = geo_curve(data["primary_by_seq"][f"{i}/mlp"])
        for layer, lip in enumerate(v["mlp_lipschitz_by_layer"][: min(gp.size, gm.size) - 1], start=1):
            if lip is None or min(gp[layer - 1], gp[layer], gm[layer - 1], gm[layer]) <= p.floor:
                continue
            slow = math.log10(gm[layer] / gm[layer - 1]) - math.log10(gp[layer] / gp[layer - 1])
            pts.append({"init": i, "layer": layer, "lipschitz bound": lip, "slowing (log10)": slow,
                        "log10 r_mlp/r_pure": math.log10(gm[layer] / gp[layer])})
    return pts


def _dose_cells(data: dict[str, Any], p: CollapseParams) -> dict[str, dict[str, Any]]:
    """Per (init std, depth) of the MLP dose-response: the MLP output scales whose mean log10
    residual is above the floor, those residuals, Spearman ρ of residual on scale and its
    one-sided p values (> 0 and < 0), and the cell's verdict: held for ρ > 0 at p < alpha, not
    held for ρ < 0 at p < alpha, else inconclusive; not judged below ``lipschitz_min_points``."""
    from scipy.stats import spearmanr

    dose, lf = data["mlp_dose"], math.log10(p.floor)
    out = {}
    for std, cells in dose["log10_res"].items():
        for depth in p.dose_depths:
            pts = [(float(sc), v[depth]) for sc, v in cells.items() if v[depth] is not None and v[depth] > lf]
            row: dict[str, Any] = {"scales": [x for x, _ in pts], "log10 residual": [y for _, y in pts]}
            if len(pts) >= p.lipschitz_min_points and len({y for _, y in pts}) > 1:
                xs, ys = [x for x, _ in pts], [y for _, y in pts]
                up, down = spearmanr(xs, ys, alternative="greater"), spearmanr(xs, ys, alternative="less")
                row.update(rho=float(up.statistic), p_greater=float(up.pvalue), p_less=float(down.pvalue))
                row["verdict"] = ("held" if up.pvalue < p.lipschitz_alpha else
                                  "not held" if down.pvalue < p.lipschitz_alpha else "inconclusive")
            else:
                row["verdict"] = None  # too few scales above the floor: not judged
            out[f"init std {std}, depth {depth}"] = row
    return out


def mlp_lipschitz(data: dict[str, Any], p: CollapseParams) -> Claim:
    """"higher values [of the MLPs' Lipschitz constant] slowing down rank collapse", judged as a
    dose-response: attention + MLP networks whose MLP output projections are multiplied by each
    of ``p.dose_scales`` (the Lipschitz constant by the same factor), at several init scales and
    depths (:func:`_dose_cells`). Held iff every judged cell rises significantly (one-sided
    Spearman, p < alpha); not held iff a cell falls significantly; else inconclusive; no cell
    with ``lipschitz_min_points`` scales above the floor: inconclusive. The MiniLM per-layer
    correlation of the earlier rule is reported beside it (:func:`_lipschitz_points`)."""
    from headrank.studies.verdicts import combine_reason

    pts = _lipschitz_points(data, p)
    cells = _dose_cells(data, p) if "mlp_dose" in data else {}
    judged = {k: v["verdict"] for k, v in cells.items() if v["verdict"] is not None}
    if not judged:
        verdict, reason = "inconclusive", ("no dose-response data (an older run)" if not cells else
                                           f"no (init, depth) cell has {p.lipschitz_min_points} scales above the floor")
    else:
        verdict, reason = combine_reason(judged)
    return Claim(
        name="collapse.mlp_lipschitz", source=f"{SRC_ART}, §5.3", quote=Q_LIPSCHITZ,
        statement="Scaling up the MLPs' Lipschitz constant (their output projections) slows the collapse: the "
                  "residual at a given depth rises with the scale.",
        rule=f"MLP output scale x {', '.join(f'{x:g}' for x in p.dose_scales)} at init std "
             f"{', '.join(f'{x:g}' for x in p.dose_init_stds)}, residual at depths {list(p.dose_depths)}; per "
             f"(init, depth) cell with >= {p.lipschitz_min_points} scales above the float64 floor: Spearman rho of "
             f"log residual on scale, held iff rho > 0 at one-sided p < {p.lipschitz_alpha:g}, not held iff rho < 0 "
             f"at one-sided p < {p.lipschitz_alpha:g}, else inconclusive; several cells: not held if any is, held "
             "if all are, else inconclusive",
        measured={"cells": cells, "judged": judged, "minilm_layers": {"points": pts, "n": len(pts)}},
        expected="the residual rises with the MLP scale in every judged cell", verdict=verdict, reason=reason,
        key="; ".join(f"{k}: rho {g3(v.get('rho'))} (p {g3(v.get('p_greater'))}) {v['verdict']}"
                      for k, v in cells.items() if v["verdict"] is not None) or "no cell judged",
        detail="The project's Transformer with MLPs, no skip and no norm, random init N(0, std^2), float64; every "
               "block's MLP output projection (weight and bias) multiplied by the scale, nothing else changed (same "
               "seeds and byte sequences); mean log10 res_composite over seeds x sequences. A network with MLPs "
               "and no skip is the setting of the article's sentence. The earlier judgement over MiniLM's layers "
               "(MLP Lipschitz bound against each layer's slowing; 6 points, no control over the rest of the layer) "
               "is in measured['minilm_layers'], not judged.")


def path_products(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Mean residual of attention products strictly decreasing in path length."""
    ps = data["path_products"]
    means = [r["mean"] for r in ps]
    return Claim(
        name="collapse.path_products", source=SRC_PRODUCTS, statement=ST_PRODUCTS, quote=Q_PATHS,
        rule="mean residual of sampled head-path products strictly decreasing in path length until the float64 floor",
        measured={f"k={int(r['length'])}": r["mean"] for r in ps},
        expected="mean residual strictly decreasing in path length k = 0..L",
        tolerance="strict monotonicity of the means", held=strictly_decreasing_to_floor(means, p.floor),
        key=f"mean residual by path length k = 0…{len(means) - 1}: {arrow(means)}",
        detail=f"MiniLM pretrained, attention matrices of the unmodified forward pass on {_meta(data).get('n_seqs')} "
               f"sentences; per sentence and length, {p.path_samples} paths (k distinct layers, one uniform head "
               "each); product P_{l_k,h_k}...P_{l_1,h_1}; res_composite (mean row). k = 0 is the identity.")


def path_restricted(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Norm-free path-restricted model: residual strictly decreasing in k until the floor."""
    restricted = data["path_restricted"]
    verdict_keys = [k for k in restricted if k.startswith("norm=none")]
    return Claim(
        name="collapse.path_restricted", source=SRC_RESTRICTED, statement=ST_RESTRICTED, quote=Q_PATHS,
        supports="collapse.path_products", rule="geometric-mean residual strictly decreasing in k until the floor, "
                                                "norm-free network, both init scales",
        measured={k: {"residual by k": v["geo_mean"], "spearman": v["spearman_k_vs_log_residual"]}
                  for k, v in restricted.items()},
        expected="residual strictly decreasing in k (until the float64 floor) for the norm-free network (the "
                 "paper's SAN with skips), both init scales",
        tolerance="strict monotonicity of the geometric means",
        key="; ".join(f"{k}: {arrow(restricted[k]['geo_mean'][:4])} …" for k in verdict_keys) or "—",
        held=bool(verdict_keys) and all(strictly_decreasing_to_floor(restricted[k]["geo_mean"], p.floor)
                                        for k in verdict_keys),
        detail=f"Transformer, {p.restricted_layers} layers x {p.sweep_heads} heads, skip on, no MLP, bidirectional, "
               "random init; the attention matrices (and pre-norm per-token scales) frozen at the full forward "
               "pass, so the output is exactly the sum over k of the length-k parts. Pre-norm rows are reported but "
               "not judged: frozen per-token LayerNorm scales make a length-k part rank one with rows of different "
               "scale, which this identical-rows residual does not count as collapsed (its curve plateaus instead "
               "of falling).")


def _ensemble_part(m: dict[str, Any], p: CollapseParams) -> dict[str, Any]:
    """One network's ensemble measures (per sequence): the short paths' share of the output norm
    (>= ``p.short_share``) and the members' dependence (<= ``p.weak_corr``), each mean ± spread
    over sequences by the threshold rule; the part's verdict combines the two."""
    sh, sh_sp = mean_spread(m["short_share"])
    dep, dep_sp = mean_spread(m["dependence"])
    v_short, v_weak = side(sh, sh_sp, p.short_share, below=False), side(dep, dep_sp, p.weak_corr, below=True)
    verdict, _ = combine_reason({"short": v_short, "weak": v_weak})
    return {"share of paths k <= L/2": sh, "spread": sh_sp, "short": v_short, "dependence": dep,
            "dependence spread": dep_sp, "weakly dependent": v_weak,
            "mean |r| (unweighted)": mean_spread(m["mean_abs_r"])[0], "members": m["n_members"],
            "sequences": len(m["short_share"]), "mean share by k": np.mean(m["share_by_k"], 0).tolist(),
            "sum rel error": m["sum_rel_error"], "verdict": verdict}


ENSEMBLE_RULE = ("per sequence: the share of sum_k |Y_k|_F carried by the paths through k <= L/2 heads >= {short:g}, "
                 "and the ensemble members' (the outputs through each subset of layers) norm-weighted mean |Pearson r| "
                 "<= {weak:g}; each mean ± t_(0.975,n-1) SE over sequences against its threshold, the two combined, "
                 "networks combined by the several-parts rule")


def _parts_claim(parts: dict[str, dict[str, Any]]) -> tuple[str, str, str]:
    """Verdict, reason and key of claims made of :func:`_ensemble_part` parts."""
    verdict, reason = combine_reason({k: v["verdict"] for k, v in parts.items()})
    key = "; ".join(f"{k}: share {g3(v['share of paths k <= L/2'])} ± {g3(v['spread'])}, dependence "
                    f"{g3(v['dependence'])} ± {g3(v['dependence spread'])}" for k, v in parts.items())
    return verdict, reason, key


def short_paths(data: dict[str, Any], p: CollapseParams) -> Claim:
    """"Deep SANs with skip connections act like ensembles of weakly-dependent shallow networks",
    judged on trained networks (docs/METHODS.md §4, item 16): the project's recall model trained by
    the project's trainer, and MiniLM's attention + skip variant; each part by
    :func:`_ensemble_part`, the parts by the several-parts rule. The random-init sweep is
    ``collapse.short_paths_init`` (supporting)."""
    ens = data.get("ensembles") or {}
    parts = {}
    if "recall" in ens:
        parts[f"recall model ({ens['recall']['n_layers']} layers, trained)"] = _ensemble_part(ens["recall"]["measures"], p)
    pre = ens.get("pretrained") or {}
    if "short_share" in pre:
        parts[f"{pre['model']} pretrained, attention + skip"] = _ensemble_part(pre, p)
    verdict, reason, key = _parts_claim(parts) if parts else ("inconclusive", "no ensemble data (an older run)", "—")
    if pre.get("skipped"):
        reason = "; ".join(x for x in (reason, f"pretrained model not decomposed: {pre['skipped']}") if x)
    rec = ens.get("recall", {})
    return Claim(
        name="collapse.short_paths", source=f"{SRC_ART}, Research Paper Focus", quote=Q_ENSEMBLE,
        statement="A trained network with skips acts like an ensemble of weakly-dependent shallow networks: the paths "
                  "through at most L/2 heads carry most of the output, and the members' outputs are weakly correlated.",
        rule=ENSEMBLE_RULE.format(short=p.short_share, weak=p.weak_corr) + "; trained networks: the recall model and "
             "MiniLM's attention + skip variant",
        measured=parts, expected=f"share >= {p.short_share:g} and dependence <= {p.weak_corr:g} in every trained network",
        verdict=verdict, reason=reason, key=key,
        detail=f"Recall: the project's recall model ({rec.get('config', {})}) trained {p.recall_steps} steps by "
               f"headrank.training (seeds {list(p.recall_seeds)}; final accuracy {rec.get('accuracy')}), "
               f"{p.recall_seqs} fresh task sequences per seed. MiniLM: the pretrained model's attention + skip "
               f"variant (no MLP, each LayerNorm kept), {p.n_seqs} corpus sentences of <= {p.max_tokens} tokens. "
               "With the attention probabilities and the norms' per-token scales frozen at the forward pass, the "
               "output is exactly the sum of the members (headrank.analysis.collapse.ensemble; 'sum rel error' "
               "checks it against the model's own forward): one per subset of layers whose heads are traversed, "
               "and for MiniLM one per (layer adding a bias or LayerNorm shift, subset of later layers); a member's "
               "length is the number of layers whose heads it passes. 'dependence' = sum over pairs of distinct "
               "members of |<y_S, y_T>| / sum of |y_S||y_T| (y a member's output minus its mean): 0 for uncorrelated "
               "members, 1 when all are proportional; 0.3 is the conventional 'medium' correlation (Cohen). Rules "
               "of earlier runs judged the share alone at random init over init std 0.02 and 0.3.")


def short_paths_init(data: dict[str, Any], p: CollapseParams) -> Claim:
    """The same two criteria on randomly initialised networks with skips (no MLP, no norm) at each
    init scale of ``p.short_init_stds``; supports ``collapse.short_paths``."""
    ens = (data.get("ensembles") or {}).get("init") or {}
    parts = {f"init std {std}": _ensemble_part(m, p) for std, m in ens.items()}
    verdict, reason, key = _parts_claim(parts) if parts else ("inconclusive", "no ensemble data (an older run)", "—")
    holds = [float(k.split()[-1]) for k, v in parts.items() if v["short"] == "held"]
    return Claim(
        name="collapse.short_paths_init", source=f"{SRC_ART}, Research Paper Focus", quote=Q_ENSEMBLE,
        supports="collapse.short_paths",
        statement="At random initialisation, a network with skips acts like an ensemble of weakly-dependent shallow "
                  "networks at every init scale of the sweep.",
        rule=ENSEMBLE_RULE.format(short=p.short_share, weak=p.weak_corr) + f"; init std {list(p.short_init_stds)}",
        measured={**parts, "largest init std where the short paths carry the share": max(holds) if holds else None},
        expected=f"share >= {p.short_share:g} and dependence <= {p.weak_corr:g} at every init scale",
        verdict=verdict, reason=reason, key=key,
        detail=f"The project's Transformer, {p.restricted_layers} layers x {p.sweep_heads} heads, d = {p.sweep_d_model}, "
               f"skips, no MLP, no norm, bidirectional, random init N(0, std^2), seeds {list(p.sweep_seeds)} x "
               f"{p.sweep_seqs} byte sequences; decomposed as in collapse.short_paths. The share falls as the weights "
               "grow (a longer path multiplies more value-output matrices), so at random init the sentence depends on "
               "the init scale; trained networks judge it.")


def path_sum_exact(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Σ_k Y_k equals the model's output to float64 rounding."""
    errs = [v["sum_rel_error"] for v in data["path_restricted"].values()]
    err = max(math.inf if e is None else e for e in errs)
    return Claim(
        name="collapse.path_sum_exact", source=SRC_SUM, statement=ST_SUM, quote=Q_SUM,
        rule=f"relative error <= {SUM_TOL:g}",
        measured=err, expected=0.0, tolerance=SUM_TOL, held=err <= SUM_TOL, kind="identity",
        detail="max over settings and seeds of |sum_k Y_k - X_L|_F / |X_L|_F, float64, against the model's own "
               "forward.")


def path_counts_claim(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Brute-force path enumeration equals C(L,k) H^k; the sums equal (H+1)^L."""
    rows = data["path_enumeration"]
    brute_ok = bool(rows) and all(r["counts"] == path_counts(r["layers"], r["heads"]) for r in rows)
    sums_ok = all(sum(path_counts(Lw, Hw)) == (Hw + 1) ** Lw for Lw, Hw in WELL_KNOWN.values())
    return Claim(
        name="collapse.path_counts", source=SRC_COUNTS, statement=ST_COUNTS, quote=Q_COUNTS,
        rule="exact integer equality",
        measured={"brute-force configs agreeing": len(rows) if brute_ok else "mismatch",
                  "sums equal (H+1)^L for the table": sums_ok,
                  "mean path length MiniLM (L=6, H=12)": path_length_stats(6, 12)["mean_length"]},
        expected=f"enumeration = formula for L <= 4, H <= 3 ({len(rows)} configs)", tolerance="exact integers",
        held=brute_ok and sums_ok, kind="identity",
        key=(f"{len(rows)} of {len(rows)} enumerations agree" if brute_ok else "an enumeration disagrees")
            + ("; sums = (H+1)^L" if sums_ok else "; a sum differs from (H+1)^L"),
        detail="Every path enumerated (skip or one head per layer). The table of well-known configurations is in "
               "data.json.")


def claims(data: dict[str, Any], p: CollapseParams) -> list[Claim]:
    """Every collapse claim, in report order."""
    return [f(data, p) for f in (pure_attention, skip_prevents, mlp_slows, mlp_does_not_prevent, cubic_rate,
                                 doubly_exponential, stated_bound, heads_modulate, mlp_lipschitz, path_products, path_restricted,
                                 short_paths, short_paths_init, path_sum_exact, path_counts_claim)]
