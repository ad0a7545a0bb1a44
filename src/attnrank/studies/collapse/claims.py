"""Claims of the collapse reproduction, each judged from the stored data alone (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnrank.analysis.collapse import INITS, WELL_KNOWN, path_counts, path_length_stats
from attnrank.studies.collapse.params import CollapseParams
from attnrank.studies.registry import Claim, arrow, g3

SRC_PURE = "seed 001 §3.1, §5.4 (BERT experiments); REFERENCE.md §4"
SRC_SKIP = "seed 001 §4.1 (skip connections); REFERENCE.md §4"
SRC_MLP = "seed 001 §4.2, §5.3 (MLPs); REFERENCE.md §4"
SRC_MLP_NOT = "seed 001 §4.2 (MLPs slow, not stop, the convergence)"
SRC_DEXP = "seed 001 §3.1 (bound with exponent 3^L); REFERENCE.md §4"
SRC_PRODUCTS = "seed 001 §2.2, §5.1-5.2 (paths, products of stochastic matrices); REFERENCE.md §4"
SRC_RESTRICTED = "seed 001 §2.2, §5.2 (expressivity falls with path length)"
SRC_SUM = "seed 001 §2.2 (SAN output = sum over paths)"
SRC_COUNTS = "seed 001 §4.1, |P_k| = C(L,k) H^k"

ST_PURE = ("Pure self-attention (skips and MLPs removed) collapses towards rank one: the last layer's "
           "relative residual is much smaller than the first's, pretrained and at random init.")
ST_SKIP = "With skip connections (attention + skip, and the full model) the residual does not collapse."
ST_MLP = "MLPs slow the collapse: attention + MLP keeps a larger residual than pure attention."
ST_MLP_NOT = "Without skips, MLPs do not prevent the collapse: attention + MLP still collapses."
ST_DEXP = ("In a pure self-attention network, log residual follows a doubly exponential form in depth "
           "(log r_L = a + b kappa^L), not a single exponential (a + b L).")
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
    """Mean and twice its standard error (sample std / √n; 0 for one value)."""
    v = np.asarray(values, dtype=float)
    se = float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0
    return float(np.mean(v)), 2.0 * se


def side(mean: float, two_se: float, threshold: float, below: bool) -> str:
    """``held`` when the whole interval mean ± 2 SE is on the claimed side of ``threshold``
    (``below``: ≤ it, else ≥ it), ``not held`` when it is wholly on the other side, else
    ``inconclusive`` (NaN: not held)."""
    if not math.isfinite(mean) or not math.isfinite(two_se):
        return "not held"
    lo, hi = mean - two_se, mean + two_se
    if (hi <= threshold) if below else (lo >= threshold):
        return "held"
    if (lo > threshold) if below else (hi < threshold):
        return "not held"
    return "inconclusive"


def combine(verdicts: dict[str, str]) -> tuple[str, str]:
    """One verdict from several parts (any not held → not held; all held → held), and the reason."""
    vals = set(verdicts.values())
    if "not held" in vals:
        return "not held", "not held for: " + ", ".join(k for k, v in verdicts.items() if v == "not held")
    if vals == {"held"}:
        return "held", ""
    return "inconclusive", ("the interval mean ± 2 SE over sentences straddles the threshold for: "
                            + ", ".join(k for k, v in verdicts.items() if v == "inconclusive"))


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
        measured[key] = {**ratios(data["summary"], init, variant), "per-sentence last/first": m, "2 SE": two_se}
        verdicts[key] = side(m, two_se, threshold, below)
    verdict, reason = combine(verdicts)
    return measured, verdict, reason


def ratio_key(measured: dict[str, Any]) -> str:
    """last/first per sentence, mean ± 2 SE, per part: a threshold claim's key."""
    return "last/first: " + "; ".join(f"{k} {g3(v['per-sentence last/first'])} ± {g3(v['2 SE'])}"
                                      for k, v in measured.items())


SPREAD = ("verdict per part on the per-sentence ratio last/first: held when mean ± 2 SE lies wholly on the "
          "claimed side of the threshold, not held when wholly on the other side, else inconclusive")


def pure_attention(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Pure attention: last/first ≤ ratio_collapse for both inits (per sentence, mean ± 2 SE)."""
    measured, verdict, reason = threshold_claim(data, [f"{i}/pure" for i in INITS], p.ratio_collapse, below=True)
    return Claim(
        name="collapse.pure_attention", source=SRC_PURE, statement=ST_PURE,
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
        name="collapse.skip_prevents", source=SRC_SKIP, statement=ST_SKIP,
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
                        "2 SE over sentences": two_se, **d}
        verdicts[i] = side(m, two_se, 0.0, below=False) if layers else "inconclusive"
        if verdicts[i] == "held" and m - two_se <= 0:  # a difference of exactly 0 is no slowing
            verdicts[i] = "inconclusive"
    verdict, reason = combine(verdicts)
    empty = [i for i in INITS if len(per_layer[i]) == 2]
    if empty:
        reason = f"no layer above the floor to compare for: {', '.join(empty)}"
    return Claim(
        name="collapse.mlp_slows", source=SRC_MLP, statement=ST_MLP,
        measured=per_layer, expected="mean over layers of log10(residual with MLP / without) > 0, for both inits",
        tolerance="sign, beyond the spread: per sentence the mean over judged layers of log10(mlp/pure); held when "
                  "mean - 2 SE > 0, not held when mean + 2 SE < 0, else inconclusive",
        verdict=verdict, reason=reason,
        key="mean log10(mlp/pure): " + "; ".join(f"{i} {g3(v['mean log10(mlp/pure)'])} ± {g3(v['2 SE over sentences'])}"
                                                 for i, v in per_layer.items()),
        detail="Paired per sentence: log10 of res_composite with MLP over without, at every layer >= 1 where pure "
               f"attention is still above the float64 floor ({p.floor:g}) in the geometric mean over sentences. "
               "Per-layer values (means over sentences) show where the MLP helps and where it does not.")


def mlp_does_not_prevent(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Attention + MLP without skips: last/first ≤ ratio_collapse for both inits (mean ± 2 SE)."""
    measured, verdict, reason = threshold_claim(data, [f"{i}/mlp" for i in INITS], p.ratio_collapse, below=True)
    return Claim(
        name="collapse.mlp_does_not_prevent", source=SRC_MLP_NOT, statement=ST_MLP_NOT,
        measured=measured, expected={f"{i}/mlp": f"last/first <= {p.ratio_collapse:g}" for i in INITS},
        tolerance=f"{p.ratio_collapse:g}; {SPREAD}", verdict=verdict, reason=reason, key=ratio_key(measured),
        detail="Same batch and measure as collapse.pure_attention.")


def _fit_row(fit: dict[str, Any], n_fit: int) -> dict[str, Any]:
    if not fit.get("fitted"):
        return {"points": n_fit, "fitted": False}
    return {"points": fit["n_points"], "R2 exp": fit["exp"]["r2"], "R2 dexp": fit["dexp"]["r2"],
            "kappa": fit["dexp"]["kappa"], "R2 dexp kappa=3": fit["dexp3"]["r2"]}


def depth_fits(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fitted forms of every curve: the depth sweep's init scales, then MiniLM's pure attention."""
    fits = {f"SAN init std {std}": _fit_row(c["fit"], c["n_fit"]) for std, c in data["depth_sweep"]["curves"].items()}
    for i in INITS:
        f = data["pure_fits"][i]
        fits[f"MiniLM {i} pure"] = _fit_row(f["fit"], f["n_fit"])
    return fits


def doubly_exponential(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Every fitted curve: R²(doubly exponential) ≥ 0.95 and κ = 3 form beats the exponential."""
    fits = depth_fits(data)
    fitted = {k: v for k, v in fits.items() if v.get("R2 dexp") is not None}
    bad = [k for k, v in fitted.items() if not (v["R2 dexp"] >= 0.95 and v["R2 dexp kappa=3"] > v["R2 exp"])]
    unfitted = [k for k, v in fits.items() if "R2 dexp" not in v]
    verdict = "inconclusive" if not fitted else ("not held" if bad else "held")
    reason = ("no curve has 4 depths above the float64 floor to fit" if not fitted
              else f"not doubly exponential by the criterion: {', '.join(bad)}" if bad else "")
    sw = data["depth_sweep"]
    return Claim(
        name="collapse.doubly_exponential", source=SRC_DEXP, statement=ST_DEXP, measured=fits,
        expected="for every curve with >= 4 depths above the floor: R2(a + b kappa^L) >= 0.95, and the "
                 "two-parameter kappa = 3 form fits better than the two-parameter exponential",
        tolerance="R2 on log r over the depths before the curve first reaches the float64 floor",
        verdict=verdict, reason=reason,
        key=(f"{len(fitted)} of {len(fits)} curves fitted; lowest R2 dexp {g3(min(v['R2 dexp'] for v in fitted.values()))}"
             if fitted else f"0 of {len(fits)} curves fitted"),
        detail="Depth sweep: the project's Transformer with no skip, no MLP, no norm, random init N(0, std^2) for "
               f"every weight, {len(sw['seeds'])} seeds x {sw['n_seqs']} byte sequences; geometric mean of "
               "res_composite per depth. kappa fitted by profile least squares on [1.01, 10]. Not fitted (fewer "
               f"than 4 depths above {p.floor:g}: they reach the rounding floor within 1-3 layers): "
               f"{', '.join(unfitted) or 'none'}. The paper's bound is an upper bound; a fit says only how the "
               "measured curve is shaped.")


def path_products(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Mean residual of attention products strictly decreasing in path length."""
    ps = data["path_products"]
    means = [r["mean"] for r in ps]
    return Claim(
        name="collapse.path_products", source=SRC_PRODUCTS, statement=ST_PRODUCTS,
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
        name="collapse.path_restricted", source=SRC_RESTRICTED, statement=ST_RESTRICTED,
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


def path_sum_exact(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Σ_k Y_k equals the model's output to float64 rounding."""
    errs = [v["sum_rel_error"] for v in data["path_restricted"].values()]
    err = max(math.inf if e is None else e for e in errs)
    return Claim(
        name="collapse.path_sum_exact", source=SRC_SUM, statement=ST_SUM,
        measured=err, expected=0.0, tolerance=SUM_TOL, held=err <= SUM_TOL, kind="identity",
        detail="max over settings and seeds of |sum_k Y_k - X_L|_F / |X_L|_F, float64, against the model's own "
               "forward.")


def path_counts_claim(data: dict[str, Any], p: CollapseParams) -> Claim:
    """Brute-force path enumeration equals C(L,k) H^k; the sums equal (H+1)^L."""
    rows = data["path_enumeration"]
    brute_ok = bool(rows) and all(r["counts"] == path_counts(r["layers"], r["heads"]) for r in rows)
    sums_ok = all(sum(path_counts(Lw, Hw)) == (Hw + 1) ** Lw for Lw, Hw in WELL_KNOWN.values())
    return Claim(
        name="collapse.path_counts", source=SRC_COUNTS, statement=ST_COUNTS,
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
    return [f(data, p) for f in (pure_attention, skip_prevents, mlp_slows, mlp_does_not_prevent, doubly_exponential,
                                 path_products, path_restricted, path_sum_exact, path_counts_claim)]
