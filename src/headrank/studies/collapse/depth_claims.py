"""The depth claims of the collapse reproduction (pure, judged from the stored data alone):
the doubly exponential form, the stated bound, and the rate against the number of heads."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from headrank.analysis.collapse import INITS, fit_depth
from headrank.analysis.collapse.bound import bound_verdict, check_bound, summarize_thresholds
from headrank.studies.collapse.params import CollapseParams
from headrank.studies.registry import Claim, g3
from headrank.studies.verdicts import MARGIN_RULE, combine_reason, judge, mean_spread, paired, side

SRC_ART = "article on Dong, Cordonnier, Loukas 2021 (collapse)"  # as in .claims
SRC_DEXP = f"{SRC_ART}, Research Paper Focus; §3.1"
Q_DEXP = ("It reveals that SANs, particularly those lacking skip connections and multi-layer perceptrons (MLPs), lose "
          "their expressive power at a rate that doubles exponentially with the increase in network depth.")
ST_DEXP = ("In a pure self-attention network, log residual follows the document's doubly exponential form in depth "
           "(log r_L = a + b 3^L, the shape of its bound), better than a single exponential (a + b L).")
Q_HEADS = "The convergence pattern persists in multi-head SANs, though the rate is modulated by the number of heads:"
ST_HEADS = ("In a pure self-attention network the rate of collapse (the per-layer constant c of r_{l+1} = c r_l^3, "
            "the base of the stated bound) depends on the number of heads at a fixed width.")


Q_BOUND = ("Each path in a SAN is shown to converge to a rank-1 matrix with identical rows, a process that occurs "
           "doubly exponentially with network depth:")
BOUND_SOURCES = (
    "The article (its §3.1) prints the bound as an image and says only that 'γ and β are constants that depend on "
    "the attention mechanism and weights'. Its form, from the paper (arXiv 2103.03404, Theorems 2.2/2.3; full text "
    "stored at https://d6108366.hf-mirror.com/papers/2103.03404.md, of which only the opening could be read here) "
    "as restated by secondary notes (markup rendered): 'the key inequality proposed in the paper is as follows, where β denotes an "
    "upper bound on the weights: (‖W_QK‖_1 ‖W_V‖_∞ ≤ β) ‖res(Y(X))‖_{1,∞} ≤ (4βH/√d_qk)^((3^L−1)/2) "
    "‖res(X)‖_{1,∞}^(3^L)' (github.com/Gyvichi/Gyvichi.github.io, _posts/2024-08-15-Attn-Not-Need.md; it drops γ); "
    "'β ≥ ‖W_QK‖₁‖W_V‖₁,∞ and γ depends on the attention entries; the convergence condition 4γβ < √d_qk is not "
    "checked against any trained model's actual values' (a public research-notes repository found by exact-string "
    "search). No text we could read defines γ.")


def _bound_stacks(data: dict[str, Any], p: CollapseParams) -> dict[str, list[dict[str, Any]]]:
    """Per network stack, one entry per independent network (sweep seed, MiniLM init):
    log10 absolute residuals (inputs x depths), which entries are measured (the sweep's exact
    residuals: every finite one; MiniLM's float64 ones and an older run's: those above the float64
    floor), β per layer, H and d_qk."""
    lf = math.log10(p.floor)
    out: dict[str, list[dict[str, Any]]] = {}
    for std, c in data["depth_sweep"]["curves"].items():
        b = c.get("bound")
        if not b:
            continue
        a, rel = np.asarray(b["log10_abs_res"], float), np.asarray(b["log10_rel_res"], float)
        valid = np.isfinite(rel[:, 1:]) if b.get("exact") else rel[:, 1:] > lf
        n = a.shape[0] // len(b["beta_by_seed"])
        out[f"SAN init std {std}"] = [
            {"res": a[i * n:(i + 1) * n], "valid": valid[i * n:(i + 1) * n], "betas": betas,
             "heads": b["heads"], "d_qk": b["d_qk"]} for i, betas in enumerate(b["beta_by_seed"])]
    for init, v in data.get("bound", {}).get("minilm", {}).items():
        a = np.asarray(v["log10_res_pure"], float)
        rel = a - np.asarray(v["log10_norm_pure"], float)
        out[f"MiniLM {init} pure (LayerNorm kept)"] = [{"res": a, "valid": rel[:, 1:] > lf, "betas": v["beta_by_layer"],
                                                        "heads": v["heads"], "d_qk": v["d_qk"]}]
    return out


def _stack_thresholds(nets: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`summarize_thresholds` per network, reduced: the largest γ needed, the vacuity range."""
    rows = [summarize_thresholds(n["res"], n["betas"], n["heads"], n["d_qk"], n["valid"]) for n in nets]
    need = [r["log10_gamma_needed"] for r in rows if r["log10_gamma_needed"] is not None]
    by_depth = np.array([[np.nan if x is None else x for x in r["log10_gamma_needed_by_depth"]] for r in rows])
    return {"beta (max over layers, per network)": [r["beta"] for r in rows], "H": rows[0]["heads"],
            "d_qk": rows[0]["d_qk"], "median log10 |res(X)|": float(np.median([r["log10_res_input_median"]
                                                                                for r in rows])),
            "judged depths": sorted({L for r in rows for L in r["judged_depths"]}),
            "log10 gamma needed by depth": [None if np.isnan(col).all() else float(np.nanmax(col)) for col in by_depth.T],
            "log10 gamma needed": max(need) if need else None,
            "log10 gamma vacuous (some input)": min(r["log10_gamma_vacuous_some"] for r in rows),
            "log10 gamma vacuous (every input)": max(r["log10_gamma_vacuous_all"] for r in rows)}


def _bound_judged(stacks: dict[str, list[dict[str, Any]]], log10_gamma: float) -> tuple[dict[str, Any], str, str]:
    """With γ given: :func:`check_bound` per network; held iff the inequality holds at every judged
    depth of every network ("held (vacuous at depths …)" where it is trivially true)."""
    parts, out = {}, {}
    for name, nets in stacks.items():
        checks = [check_bound(n["res"], max(n["betas"]), n["heads"], n["d_qk"], log10_gamma, n["valid"])
                  for n in nets]
        verdicts = [bound_verdict(c) for c in checks]
        parts[name] = "not held" if any(v == "not held" for v, _ in verdicts) else "held"
        out[name] = {"worst log10 margin by network": [min(c["log10_margin"], default=None) for c in checks],
                     "verdicts": [r for _, r in verdicts]}
    bad = [k for k, v in parts.items() if v == "not held"]
    verdict = "not held" if bad else "held"
    notes = "; ".join(f"{k}: {v['verdicts'][0]}" for k, v in out.items())
    return out, verdict, (f"violated for {', '.join(bad)}; " if bad else "") + notes


def stated_bound(data: dict[str, Any], p: CollapseParams) -> Claim:
    """The stated bound as an inequality on pure attention, β from the real weights; γ is not
    defined in any readable source, so unless ``p.bound_log10_gamma`` is set the claim reports
    the log10 γ above which the inequality holds at every depth, and above which it is vacuous."""
    stacks = _bound_stacks(data, p)
    rule = ("per network and depth L >= 1 whose residual is measured (the SANs: computed exactly past the float64 "
            "floor; MiniLM: above it), per input X: |res(X_L)|_{1,inf} <= "
            "(4 gamma beta H / sqrt(d_qk))^((3^L-1)/2) |res(X)|_{1,inf}^(3^L), log10; held iff it holds at every "
            "judged depth of every network ('held (vacuous at depths ...)' where the right side >= |res(X)|); "
            "inconclusive while gamma is undefined")
    measured = {k: _stack_thresholds(v) for k, v in stacks.items()}
    if not stacks:
        verdict, reason = "inconclusive", "no bound data (an older run)"
    elif p.bound_log10_gamma is not None:
        judged, verdict, reason = _bound_judged(stacks, p.bound_log10_gamma)
        measured = {k: {**measured[k], **judged[k]} for k in measured}
    else:
        verdict, reason = "inconclusive", _gamma_reason(measured)
    untested = ("" if p.bound_log10_gamma is not None or not stacks else
                "gamma is not defined in the document: headrank reproduce collapse with a declared bound_log10_gamma")
    return Claim(
        name="collapse.stated_bound", untested=untested, source=f"{SRC_ART}, §3.1-3.2", quote=Q_BOUND, rule=rule,
        statement="The residual of a pure self-attention network obeys the stated doubly exponential bound, with "
                  "beta computed from the real weights.",
        measured=measured, expected="|res(X_L)| <= the right-hand side at every depth", verdict=verdict,
        reason=reason, key=_bound_key(measured),
        tolerance="exact inequality in log10; the sweep's residuals are computed past the float64 floor (depths where "
                  "that computation is not exact are not judged); MiniLM's depths at the float64 floor are not judged",
        detail=BOUND_SOURCES + " We use the multi-head form (H in the base); beta = max over layers and heads of "
               "|W_Q,h W_K,h^T|_1 |W_V,h W_O,h|_{1,inf} (l1 = max column abs-sum, {1,inf} = sqrt(l1 linf), row-vector "
               "convention X W); res = X - 1 xbar^T with the mean row, absolute (an upper bound of the minimum over x "
               "on the left side; on the right it can make the bound looser). Networks: the depth sweep's SANs (no "
               "skip, MLP or norm: the theorem's setting), per seed; MiniLM's pure variant keeps LayerNorm, which the "
               "theorem does not cover. 'log10 gamma needed': the inequality holds at that depth for every input iff "
               "log10 gamma >= it; 'vacuous': the right side >= |res(X)| iff log10 gamma >= it (for every L).")


def _gamma_reason(measured: dict[str, Any]) -> str:
    need = [v["log10 gamma needed"] for v in measured.values() if v["log10 gamma needed"] is not None]
    vac = max(v["log10 gamma vacuous (every input)"] for v in measured.values())
    nontrivial = [k for k, v in measured.items() if v["log10 gamma needed"] is not None
                  and v["log10 gamma needed"] < v["log10 gamma vacuous (every input)"]]
    return (f"gamma is not defined in any source we could read. The inequality holds at every judged depth of every "
            f"network iff log10 gamma >= {g3(max(need)) if need else '—'}; from log10 gamma >= {g3(vac)} on it is "
            f"vacuous (right side >= |res(X)|) for every input of every network; between the two it holds "
            f"non-trivially for some input only in: {', '.join(nontrivial) or 'no network'}")


def _bound_key(measured: dict[str, Any]) -> str:
    return "; ".join(f"{k}: log10 γ needed {g3(v['log10 gamma needed'])}, vacuous from "
                     f"{g3(v['log10 gamma vacuous (every input)'])}" for k, v in measured.items()) or "—"




# --------------------------------------------------------------------------- the doubly exponential form


def _exact_prefix(rel: np.ndarray) -> int:
    """How many depths from 0 on have a measured residual for every sequence (rows)."""
    ok = np.isfinite(rel).all(0)
    return int(np.argmin(ok)) if not ok.all() else ok.size


def _window_start(nets: list[dict[str, Any]], last: int, min_points: int) -> int | None:
    """The first depth L0 from which the stated bound, restarted with X_{L0} as the input, is
    non-vacuous over the depths L0 < L < ``last`` of every network (``_stack_thresholds``: at the
    smallest γ under which it holds there for every input, it is below |res(X_{L0})| for some
    input), leaving at least ``min_points`` depths; None when no such depth exists."""
    for L0 in range(0, last - min_points + 1):
        sub = [{**n, "res": n["res"][:, L0:last], "valid": np.ones((n["res"].shape[0], last - L0 - 1), bool),
                "betas": n["betas"][L0:last - 1]} for n in nets]
        m = _stack_thresholds(sub)
        need = m["log10 gamma needed"]
        if need is not None and need < m["log10 gamma vacuous (every input)"]:
            return L0
    return None


def _san_curve(std: str, c: dict[str, Any], nets: list[dict[str, Any]] | None, p: CollapseParams
               ) -> dict[str, Any]:
    """One exact sweep curve: its window (:func:`_window_start`), the fits there, the verdict."""
    rel = np.asarray(c["bound"]["log10_rel_res"], float)
    last = _exact_prefix(rel)
    row: dict[str, Any] = {"exact depths": last}
    L0 = _window_start(nets, last, p.dexp_min_points) if nets else None
    if L0 is None:
        return {**row, "verdict": None, "why": f"no window of >= {p.dexp_min_points} depths where the stated bound is "
                                               "non-vacuous"}
    depths = np.arange(L0, last)
    fit = fit_depth(depths, rel.mean(0)[L0:last])
    r2_3, r2_e = fit["dexp3"]["r2"], fit["exp"]["r2"]
    ok = r2_3 >= p.dexp_r2 and r2_3 > r2_e
    return {**row, "window": [int(L0), int(last - 1)], "points": int(depths.size), "R2 exp": r2_e,
            "R2 dexp kappa=3": r2_3, "a (3^L)": fit["dexp3"]["a"], "b (3^L)": fit["dexp3"]["b"],
            "kappa (free)": fit["dexp"]["kappa"],
            "R2 dexp (free kappa)": fit["dexp"]["r2"], "verdict": "held" if ok else "not held"}


def depth_fits(data: dict[str, Any], p: CollapseParams) -> dict[str, dict[str, Any]]:
    """Every curve: the sweep's SANs (exact residuals, judged) and MiniLM's pure variant
    (LayerNorm kept, float64: its fit over the depths above the floor, reported)."""
    stacks = _bound_stacks(data, p)
    out: dict[str, dict[str, Any]] = {}
    for std, c in data["depth_sweep"]["curves"].items():
        name = f"SAN init std {std}"
        if not (c.get("bound") or {}).get("exact"):
            out[name] = {"verdict": None, "why": "no exact residuals (an older run)"}
            continue
        out[name] = _san_curve(std, c, stacks.get(name), p)
    for i in INITS:
        f = data["pure_fits"][i]
        fit = f["fit"]
        row = {"points": f["n_fit"], "verdict": None, "why": "LayerNorm kept (outside the theorem's setting), float64 "
                                                             "only: reported"}
        if fit.get("fitted"):
            row.update({"R2 exp": fit["exp"]["r2"], "R2 dexp kappa=3": fit["dexp3"]["r2"]})
        out[f"MiniLM {i} pure"] = row
    return out


#: the rate claim: log r_{L+1} = kappa log r_L + c per network; doubly exponential means kappa > 1
#: (the stated form: 3). The smallest excess over 1 that matters, declared before the run judged by it
MARGIN_KAPPA = 0.5
#: the regime the rate is read in: relative residual at most this (far below the input's)
RATE_REGIME = 1e-2
ST_RATE = ("In a pure self-attention network the log residual of each layer is a multiple kappa > 1 of the previous "
           "layer's (log r_{L+1} = kappa log r_L + c): doubly exponential decay, the document's rate (its bound has "
           "kappa = 3); judged per network, over independent networks.")


def network_kappas(data: dict[str, Any]) -> dict[str, float]:
    """Per network (init std × seed of the depth sweep): the least-squares slope kappa of
    log10 r_{L+1} on log10 r_L (absolute residuals, mean over the network's sequences) over the
    exact depths whose relative residual is ≤ :data:`RATE_REGIME`; networks with < 3 such depths
    are left out. Rows of the stored residuals are seed-major (an equal share per seed)."""
    sw = data["depth_sweep"]
    out: dict[str, float] = {}
    for std, c in sw["curves"].items():
        b = c.get("bound") or {}
        if not b.get("exact"):
            continue
        a, rel = np.asarray(b["log10_abs_res"], float), np.asarray(b["log10_rel_res"], float)
        per = a.shape[0] // len(sw["seeds"])
        for i, seed in enumerate(sw["seeds"]):
            rows = slice(i * per, (i + 1) * per)
            la, lr = a[rows].mean(0), rel[rows].mean(0)
            x, y = la[:-1], la[1:]
            ok = np.isfinite(x) & np.isfinite(y) & (lr[:-1] <= math.log10(RATE_REGIME))
            if ok.sum() >= 3:
                out[f"std {std}, seed {seed}"] = float(np.polyfit(x[ok], y[ok], 1)[0])
    return out


def cubic_rate(data: dict[str, Any], p: CollapseParams) -> Claim:
    """The rate, apart from the bound (whose gamma the document never defines): per network of the
    depth sweep, kappa of log r_{L+1} = kappa log r_L + c (:func:`network_kappas`); kappa − 1 over
    the independent networks judged three-way against :data:`MARGIN_KAPPA` (held: doubly
    exponential beyond the margin; not held: kappa within 1 + margin, a single exponential or
    slower)."""
    kap = network_kappas(data)
    mean, spread = mean_spread(kap.values()) if kap else (math.nan, math.nan)
    test = judge(mean - 1.0, spread, len(kap), MARGIN_KAPPA)
    verdict = "inconclusive" if test["verdict"] == "untested" else test["verdict"]
    return Claim(
        name="collapse.cubic_rate", source=SRC_DEXP, statement=ST_RATE, quote=Q_DEXP, tests=[test],
        rule=f"kappa - 1 over the independent networks (init std x seed; per network the mean over its sequences, depths "
             f"with relative residual <= {RATE_REGIME:g}, >= 3 of them) against the margin {MARGIN_KAPPA:g} "
             f"({MARGIN_RULE})",
        measured={"kappa_per_network": kap, "test": test}, verdict=verdict,
        reason="" if verdict == "held" else test["outcome"], expected=f"kappa > 1 + {MARGIN_KAPPA:g} (the bound's: 3)",
        key=f"kappa {g3(mean)} ± {g3(spread)} over {len(kap)} networks (1 = exponential, 3 = the bound's)",
        detail="The residuals are computed exactly past the float64 floor (headrank.analysis.collapse.exact). "
               "Independent networks, not the sequences of one network, are the replicates.")


def doubly_exponential(data: dict[str, Any], p: CollapseParams) -> Claim:
    """The document's form, judged where the stated bound says something (docs/METHODS.md §4,
    item 15): per SAN curve of the depth sweep (exact residuals past the float64 floor), over the
    window of depths from the first depth L0 at which the bound, restarted there, is non-vacuous
    to the last exactly computed depth (at least ``p.dexp_min_points``), the fit ``log r_L = a +
    b·3^L`` reaches R² ≥ ``p.dexp_r2`` and beats ``a + b·L``. Several curves: the several-parts
    rule; none with a window: inconclusive. MiniLM's pure variant is reported, not judged."""
    fits = depth_fits(data, p)
    judged = {k: v["verdict"] for k, v in fits.items() if v["verdict"] is not None}
    if judged:
        verdict, reason = combine_reason(judged)
        if verdict == "not held":
            reason = f"the 3^L form does not fit (R2 < {p.dexp_r2:g} or below the exponential): " + reason.split(": ")[1]
    else:
        verdict, reason = "inconclusive", "no curve has a window where the stated bound is non-vacuous"
    lows = [v["R2 dexp kappa=3"] for k, v in fits.items() if k in judged]
    sw = data["depth_sweep"]
    return Claim(
        name="collapse.doubly_exponential", source=SRC_DEXP, statement=ST_DEXP, quote=Q_DEXP,
        supports="collapse.cubic_rate",
        measured={**fits, "judged": sorted(judged)},
        rule=f"per SAN curve (exact residuals past the float64 floor): window = from the first depth L0 at which the "
             f"stated bound restarted at X_L0 is non-vacuous (at the smallest gamma under which it holds at every later "
             f"exact depth, below |res(X_L0)| for some input) to the last exact depth, >= {p.dexp_min_points} depths; "
             f"held iff R2(a + b 3^L) >= {p.dexp_r2:g} and > R2(a + b L) (two parameters each, log r, mean over "
             "sequences); curves combined by the several-parts rule; MiniLM (LayerNorm kept) reported, not judged",
        expected=f"for every judged curve: R2(a + b 3^L) >= {p.dexp_r2:g}, above the two-parameter exponential's",
        tolerance="R2 on log r over the curve's window",
        verdict=verdict, reason=reason,
        key=(f"{len(judged)} of {len(fits)} curves judged; lowest R2 of the 3^L form {g3(min(lows))}" if lows
             else f"0 of {len(fits)} curves judged")
            + "; " + "; ".join(f"{k}: window {v['window']}" for k, v in fits.items() if "window" in v),
        detail="Depth sweep: the project's Transformer with no skip, no MLP, no norm, bidirectional, random init "
               f"N(0, std^2) for every weight, {len(sw['seeds'])} seeds x {sw['n_seqs']} byte sequences; residuals "
               "res_composite computed exactly past the float64 floor (headrank.analysis.collapse.exact: the residual "
               "carried through the layers in the log domain, checked against mpmath), log10 of the relative residual "
               "averaged over sequences. A depth counts only while every sequence's residual is exact there. The "
               "window: the theorem bounds the residual after any stack of layers by that stack's input, so where "
               "the bound from X_0 is vacuous (a residual above the input's, e.g. while large weights first grow "
               "the representation) it is restarted at the first depth from which it says something. A free kappa "
               "(profile least squares on [1.01, 10]) is reported. Rules of earlier runs: a free-kappa fit, then "
               "3^L above the float64 floor (823bce5), then only curves whose bound from X_0 is non-vacuous "
               "(a88d79b); this one (docs/METHODS.md §4, item 15) was fixed before its first run.")


# --------------------------------------------------------------------------- the number of heads


def network_rate(log10_abs: np.ndarray, log10_rel: np.ndarray, regime: float) -> float | None:
    """A network's collapse rate: the mean over sequences (rows) and layers l of
    ``log10 r_{l+1} − 3 log10 r_l`` (absolute residuals) where X_l's relative residual is at most
    ``regime`` (the cubic regime) and both residuals are measured; None without such a layer."""
    a, rel = np.asarray(log10_abs, float), np.asarray(log10_rel, float)
    step = a[:, 1:] - 3.0 * a[:, :-1]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(step) & (rel[:, :-1] <= math.log10(regime))
    return float(step[ok].mean()) if ok.any() else None


def _heads_part(runs: dict[str, Any], std: str, sw: dict[str, Any], p: CollapseParams) -> dict[str, Any]:
    """One init scale: every network's rate by head count, the bound's base, the verdict."""
    rates: dict[int, dict[int, float | None]] = {}
    base: dict[str, float] = {}
    for H in sw["heads"]:
        rates[H] = {s: network_rate(runs[f"{std}/{H}/{s}"]["log10_abs"], runs[f"{std}/{H}/{s}"]["log10_rel"],
                                    p.heads_regime) for s in sw["seeds"]}
        base[f"H={H}"] = float(np.mean([math.log10(max(runs[f"{std}/{H}/{s}"]["betas"]) * H
                                                   / math.sqrt(runs[f"{std}/{H}/{s}"]["d_qk"])) for s in sw["seeds"]]))
    row: dict[str, Any] = {"mean rate by H": {f"H={H}": mean_spread([v for v in r.values() if v is not None])[0]
                                              for H, r in rates.items()},
                           "bound's base log10(beta H / sqrt(d_qk)) by H": base}
    if any(v is None for r in rates.values() for v in r.values()):
        return {**row, "verdict": None, "why": "a network has no layer in the cubic regime"}
    lo, hi = min(sw["heads"]), max(sw["heads"])
    d = paired(rates[hi], rates[lo])
    return {**row, f"rate H={hi} - H={lo}": d["diff"], "spread": d["spread"], "networks": d["n_seeds"],
            "verdict": side(abs(d["diff"]), d["spread"], p.heads_margin, below=False)}


def heads_modulate(data: dict[str, Any], p: CollapseParams) -> Claim:
    """"the rate is modulated by the number of heads": per init scale, every network's rate
    (:func:`network_rate`) for each head count at a fixed width; the rates of the most and of the
    fewest heads, paired by seed, differ by |d| ± spread: held for that scale when |d| − spread ≥
    ``p.heads_margin`` decades, not held when |d| + spread < it, else inconclusive (the
    threshold rule); scales combined by the several-parts rule; a scale where some network has no
    layer in the cubic regime is not judged."""
    sw = data.get("heads_sweep")
    parts = {f"init std {std}": _heads_part(sw["runs"], f"{std:g}", sw, p) for std in sw["init_stds"]} if sw else {}
    judged = {k: v["verdict"] for k, v in parts.items() if v["verdict"] is not None}
    if judged:
        verdict, reason = combine_reason(judged)
    else:
        verdict, reason = "inconclusive", ("no head-count sweep (an older run)" if not sw else
                                           "no init scale where every network reaches the cubic regime")
    lo, hi = (min(sw["heads"]), max(sw["heads"])) if sw else (None, None)
    return Claim(
        name="collapse.heads_modulate", source=f"{SRC_ART}, §3.2", statement=ST_HEADS, quote=Q_HEADS,
        rule=f"per network: rate = mean over sequences and layers l with relative residual of X_l <= "
             f"{p.heads_regime:g} of log10 r_(l+1) - 3 log10 r_l (absolute, exact residuals); per init scale, H = "
             f"{lo} vs H = {hi} paired by seed, |difference| ± t_(0.975,n-1) SE against {p.heads_margin:g} decades: "
             "held iff wholly at or above it, not held iff wholly below, else inconclusive; init scales combined by "
             "the several-parts rule",
        measured={**parts, "judged": judged}, expected=f"the rate differs between H = {lo} and H = {hi} by >= {p.heads_margin:g} decades",
        verdict=verdict, reason=reason,
        key="; ".join(f"{k}: {g3(v.get(f'rate H={hi} - H={lo}'))} ± {g3(v.get('spread'))} ({v['verdict']})"
                      for k, v in parts.items() if v["verdict"] is not None) or "no init scale judged",
        detail=(f"The depth sweep's SANs with H = {', '.join(map(str, sw['heads']))} heads at width {sw['d_model']} "
                f"(d_qk = {sw['d_model']}/H), {len(sw['seeds'])} networks each, {sw['n_seqs']} byte sequences; residuals "
                "computed exactly past the float64 floor. The stated bound's recursion is r_(l+1) <= c r_l^3 with "
                "c = 4 gamma beta H / sqrt(d_qk): the measured per-layer constant is its empirical counterpart "
                "(where the residual is small, the cubic term dominates). The bound's base at gamma = 1/4, "
                "log10(beta H / sqrt(d_qk)), is reported per H beside it (beta = max over the network's layers); it "
                "is the bound's prediction of the direction, not judged. Fixed before the first run."
                if sw else "No head-count sweep in this run."))
