"""Figure 4 of the paper: are a trained model's attention factors balanced?

Balance (``AᵀA = BᵀB``) puts each pair of squared row norms (W_Q against W_K, W_V against the
columns of P) on the diagonal and makes the Frobenius bound ½(‖A‖²+‖B‖²) equal the nuclear
norm ‖ABᵀ‖_* (paper Prop. 3.1; Fig. 4 on LLaMA-2 7B). Two parts:

- **Descriptive**, on a given checkpoint (``params.model``; default MiniLM-L6, which ships
  offline — ``headrank reproduce fig4 --model PATH`` analyses any other that ``spectra`` opens:
  directory, Hub id, GGUF, adapter, Trainer checkpoint): per head
  nuclear / bound and the row-norm spread, against two fair nulls that keep the real factors
  and destroy only their pairing (docs/methods/training.md): a rotation null (B → B·O, O Haar-random on
  the dh inner dimension) and a row-pairing shuffle (which row of W_Q goes with which row of
  W_K). MiniLM is not the paper's subject (distilled, contrastively fine-tuned, tiny decay
  exposure, undecayed biases), so the caption's LLaMA-2-7B sentences are *not testable here*
  (inconclusive) unless ``--model`` names a real pretrained checkpoint, which is then judged.
- **A check of ours**, on the project's own byte-level LMs trained here with known decay
  exposure: does decay at exposure ≥ 8 raise nuclear / bound, relative to each run's initial
  value, more than no decay (paired by seed)?
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headrank.studies.lm_common import (
    MIN_EXPOSURE,
    OTHER_WD,
    PRETRAIN_EXPOSURE,
    exposure,
    lambdas_for,
    lm_base,
    lr_sum,
    sweep,
)
from headrank.studies.registry import CATALOGUE, Claim, FigureOut, Study, g3, register_study, span
from headrank.studies.verdicts import (
    SPREAD_RULE,
    combine_reason,
    judge_paired,
    paired,
    sign_verdict,
)

SOURCE = "Kobayashi et al. 2024, Figure 4 (paper)"
SRC_CAPTION = "paper, Figure 4 caption (LLaMA-2-7B)"
QUOTE_COINCIDE = "The two norms almost perfectly coincide."
QUOTE_ROWS = (r"The condition $W_KW_K^\top = W_QW_Q^\top$ would require these norms to be equal, which in fact is "
              "mostly true.")
COINCIDE = 0.99  # "the two norms almost perfectly coincide": median nuclear / bound at least this
#: the smallest rise of nuclear/bound (relative to its initial value) that matters, declared before the run
MARGIN_BALANCE = 0.01
ROWS_EQUAL = 0.1  # "mostly true" equal row norms: median |log10(ratio)| at most this (26 %)
PRODUCTS = {"qk": ("W_K^T W_Q", "W_Q vs W_K"), "ov": ("P W_V", "W_V vs columns of P")}
NULLS = ("rotation", "pairing")
ST_LM = ("In a model trained with attention weight decay, the Frobenius bound of {label} almost coincides with its "
         "nuclear norm for every head once the decay has acted (exposure >= {e:g}), and not without decay "
         "(our byte-level LMs, trained here).")
ST_NULL = ("The rotation and row-pairing nulls keep each head's factor norms, so its Frobenius bound; the pairing "
           "null also keeps each factor's row norms.")


@dataclass(frozen=True)
class Fig4Params:
    """The checkpoint described (None: MiniLM-L6), the nulls' seed, the own LMs' runs, and the
    thresholds fixed before any run: "almost perfectly coincide" = median nuclear/bound ≥
    ``coincide``; "mostly equal" row norms = median |log10| row-norm ratio ≤ ``rows_equal``."""

    model: str | None = None
    null_seed: int = 0
    coincide: float = COINCIDE
    rows_equal: float = ROWS_EQUAL
    exposures: tuple[float, ...] = (0.0, MIN_EXPOSURE, PRETRAIN_EXPOSURE)
    seeds: tuple[int, ...] = (0, 1, 2)
    lm_steps: int = 1000
    workers: int = 2
    profile: str = "full"

    @classmethod
    def quick(cls) -> Fig4Params:
        """Exposures 0, 3 and 8, two seeds of 300 steps."""
        return cls(seeds=(0, 1), lm_steps=300, profile="quick")

    @classmethod
    def full(cls) -> Fig4Params:
        """Exposures 0, 3 and 8, three seeds of 1,000 steps."""
        return cls()


# -- experiment ------------------------------------------------------------------------------------

def _haar(n: int, k: int, g: Any) -> Any:
    """``n`` Haar-random k × k orthogonal matrices (QR of Gaussians, signs fixed)."""
    import torch

    q, r = torch.linalg.qr(torch.randn(n, k, k, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]


def _spread(a: Any, b: Any) -> np.ndarray:
    """Per head: median over rows of |log10(b / a)| (0 when every pair is on the diagonal)."""
    return np.median(np.abs(np.log10(np.asarray(b) / np.asarray(a))), axis=-1)


def _product_nulls(A: Any, B: Any, g: Any) -> dict[str, list]:
    """Per head of one layer and product: nuclear/bound and row spread, trained and under both nulls."""
    import torch

    from headrank.core.linalg import product_metrics

    A, B = A.double(), B.double()
    H, _, dh = B.shape
    Br = B @ _haar(H, dh, g)
    perm = torch.stack([torch.randperm(dh, generator=g) for _ in range(H)])
    Bp = torch.take_along_dim(B, perm[:, None, :], dim=-1)
    rows = lambda X: (X**2).sum(-2).numpy()  # noqa: E731  squared norms of the dh rows of W (columns of A, B)
    out: dict[str, list] = {}
    for name, Bx in (("trained", B), ("rotation", Br), ("pairing", Bp)):
        m = product_metrics(A, Bx)
        out[f"ratio_{name}"] = (m.nuclear / m.frob_bound).tolist()
        out[f"bound_{name}"] = m.frob_bound.tolist()
        out[f"spread_{name}"] = _spread(rows(A), rows(Bx)).tolist()
    out["rows_b_sorted_trained"] = np.sort(rows(B), -1).tolist()
    out["rows_b_sorted_pairing"] = np.sort(rows(Bp), -1).tolist()
    return out


def describe(source: str | Path, seed: int = 0) -> dict[str, Any]:
    """Descriptive balance of every head of a checkpoint: per product, per head (layers × heads)
    nuclear/bound, bound and row spread for the trained factors and both nulls; head 0's row
    norms of each layer for the figure."""
    import torch

    from headrank.io.sources import open_reader

    reader = open_reader(str(source))  # the one opener: directories, Hub ids, GGUF, adapters, Trainer checkpoints
    g = torch.Generator().manual_seed(seed)
    per: dict[str, dict[str, list]] = {p: {} for p in PRODUCTS}
    rows0: dict[str, list] = {"k": [], "q": [], "p": [], "v": []}
    for i in range(reader.dims.n_layers):
        hw = reader.read_layer(i)
        for p, (A, B) in (("qk", hw.qk_factors()), ("ov", hw.ov_factors())):
            for k, v in _product_nulls(A, B, g).items():
                per[p].setdefault(k, []).append(v)
            a_key, b_key = ("k", "q") if p == "qk" else ("p", "v")
            rows0[a_key].append((A.double()[0] ** 2).sum(0).tolist())
            rows0[b_key].append((B.double()[0] ** 2).sum(0).tolist())
    return {"source": str(source), "n_layers": reader.dims.n_layers, "products": per, "rows_head0": rows0}


def initial_ratio(run_dir: Path) -> dict[str, float]:
    """Per product: the median over every head of nuclear/bound at step 0 (the tracker's row of
    the initialisation in ``metrics.jsonl``)."""
    from headrank.io.rundir import read_metrics

    row = next(r for r in read_metrics(run_dir) if "heads" in r)
    out = {}
    for p in PRODUCTS:
        h = row["heads"][p]
        gap, bound = np.asarray(h["gap"], dtype=float), np.asarray(h["frob_bound"], dtype=float)
        out[p] = float(np.median(1.0 - gap / bound))
    return out


def train_lms(params: Fig4Params) -> dict[str, Any]:
    """Train the own LMs (attention λ per target exposure, every seed) and describe each final
    checkpoint, with each run's initial nuclear/bound."""
    from headrank.io.rundir import latest_checkpoint

    base = {**lm_base(params.lm_steps), "weight_decay": OTHER_WD}
    lams = lambdas_for(params.exposures, lr_sum("lm", base))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        res = sweep("lm", base, {"attn_weight_decay": lams}, list(params.seeds), Path(tmp), params.workers)
        for _, r in res.runs.iterrows():
            lam = float(r["attn_weight_decay"])
            runs.append({"lam": lam, "seed": int(r["seed"]), "test_ppl": float(r["test_ppl"]),
                         "exposure": exposure("lm", {**base, "attn_weight_decay": lam}),
                         "initial_ratio": initial_ratio(res.out / "runs" / r["name"]),
                         **describe(latest_checkpoint(res.out / "runs" / r["name"]), params.null_seed)})
    return {"lambdas": lams, "runs": runs, "overrides": base}


def run(params: Fig4Params) -> dict[str, Any]:
    """Describe the given checkpoint (``params.model``, default MiniLM-L6); train and describe the own LMs."""
    t0 = time.perf_counter()
    data: dict[str, Any] = {"described": describe(params.model or "minilm", params.null_seed), **train_lms(params)}
    data["runtime_s"] = time.perf_counter() - t0
    return data


# -- claims ----------------------------------------------------------------------------------------

def medians(d: dict[str, Any], product: str) -> dict[str, float]:
    """Median over all heads of nuclear/bound and of the row spread, trained and both nulls."""
    p = d["products"][product]
    return {f"{k}_{n}": float(np.median(np.asarray(p[f"{k}_{n}"], dtype=float)))
            for k in ("ratio", "spread") for n in ("trained", *NULLS)}


def _described(data: dict[str, Any], params: Fig4Params) -> tuple[bool, dict[str, Any]]:
    """Whether a user-given checkpoint was described, and its medians per product."""
    d = data["described"]
    return params.model is not None, {p: medians(d, p) for p in PRODUCTS}


UNTESTED_COMMAND = "headrank reproduce fig4 --model PATH (a pretrained checkpoint such as LLaMA-2-7B)"


def _untested(given: bool) -> str:
    """The command that tests a LLaMA-2-7B sentence, when no pretrained checkpoint was given."""
    return "" if given else UNTESTED_COMMAND


def llama_coincide(data: dict[str, Any], params: Fig4Params) -> Claim:
    """``fig4.bound_coincides``: the caption's LLaMA-2-7B sentence. Not testable here unless
    ``--model`` names a real pretrained checkpoint; then, on it: median nuclear/bound ≥
    ``coincide`` for both products and above both nulls' medians."""
    given, m = _described(data, params)
    parts = {p: ("held" if m[p]["ratio_trained"] >= params.coincide
                 and m[p]["ratio_trained"] > max(m[p]["ratio_rotation"], m[p]["ratio_pairing"]) else "not held")
             for p in PRODUCTS}
    verdict, reason = combine_reason(parts) if given else (
        "inconclusive", "not testable here: the statement is about LLaMA-2-7B, which is not on this machine; "
                        f"{data['described']['source']} is described instead (pass --model PATH to judge a "
                        "real pretrained checkpoint)")
    return Claim(name="fig4.bound_coincides", source=SRC_CAPTION, quote=QUOTE_COINCIDE, untested=_untested(given),
                 statement="In a pretrained LLM the Frobenius bound and the nuclear norm of every head's products almost "
                           "coincide.",
                 rule=f"only on a user-given pretrained checkpoint (--model): median nuclear/bound >= "
                      f"{params.coincide:g} for QK and OV, above both nulls' medians",
                 measured={"described": data["described"]["source"], "medians": m, "parts": parts},
                 expected=f"median nuclear/bound >= {params.coincide:g}, above the nulls", verdict=verdict,
                 reason=reason, tolerance=params.coincide,
                 key="; ".join(f"{p.upper()} {g3(m[p]['ratio_trained'])} (nulls {g3(m[p]['ratio_rotation'])}, "
                               f"{g3(m[p]['ratio_pairing'])})" for p in PRODUCTS) + f" on {data['described']['source']}")


def llama_rows(data: dict[str, Any], params: Fig4Params) -> Claim:
    """``fig4.rows_equal``: the caption's row-norm sentence (LLaMA-2-7B), as :func:`llama_coincide`:
    on a user-given checkpoint, median |log10(row norm ratio)| ≤ ``rows_equal`` and below the
    pairing null's, for both products."""
    given, m = _described(data, params)
    parts = {p: ("held" if m[p]["spread_trained"] <= params.rows_equal
                 and m[p]["spread_trained"] < m[p]["spread_pairing"] else "not held") for p in PRODUCTS}
    verdict, reason = combine_reason(parts) if given else (
        "inconclusive", "not testable here: the statement is about LLaMA-2-7B; "
                        f"{data['described']['source']} is described instead (pass --model PATH)")
    return Claim(name="fig4.rows_equal", source=SRC_CAPTION, quote=QUOTE_ROWS, untested=_untested(given),
                 statement="In a pretrained LLM the squared row norms of W_Q and W_K (W_V and the columns of P) are "
                           "mostly equal, row by row.",
                 rule=f"only on a user-given checkpoint (--model): median |log10(row ratio)| <= {params.rows_equal:g} "
                      "and below the row-pairing null's, both products",
                 measured={"described": data["described"]["source"], "medians": m, "parts": parts},
                 expected=f"median |log10 row ratio| <= {params.rows_equal:g}, below the pairing null",
                 verdict=verdict, reason=reason, tolerance=params.rows_equal,
                 key="; ".join(f"{p.upper()} {g3(m[p]['spread_trained'])} (pairing null {g3(m[p]['spread_pairing'])})"
                               for p in PRODUCTS) + f" on {data['described']['source']}")


def decay_balances(data: dict[str, Any], params: Fig4Params) -> Claim:
    """``fig4.lm.decay_balances`` (a check of ours, the causal question behind the caption): on the
    own LMs, nuclear/bound relative to each run's initial value rises more at the λ with exposure ≥
    8 (λ = 0.1's in pretraining) than at λ = 0, paired by seed, beyond the spread, both products."""
    runs = data["runs"]
    have_init = all("initial_ratio" in r for r in runs)
    top = [r for r in runs if r["exposure"]["attn"] >= PRETRAIN_EXPOSURE]
    lam_top = min((r["lam"] for r in top), default=None)
    parts, measured = {}, {}
    for p in PRODUCTS:
        rel = {}
        for r in runs:
            if have_init:
                rel.setdefault(r["lam"], {})[r["seed"]] = medians(r, p)["ratio_trained"] / r["initial_ratio"][p]
        if lam_top is None or not have_init or 0.0 not in rel:
            parts[p] = "inconclusive"
            continue
        d = paired(rel[lam_top], rel[0.0])
        parts[p] = sign_verdict(d["diff"], d["spread"], margin=MARGIN_BALANCE)
        measured[p] = {"test": judge_paired(d, MARGIN_BALANCE), "final_over_initial_at_0": float(np.mean(list(rel[0.0].values()))),
                       "final_over_initial_at_top": float(np.mean(list(rel[lam_top].values()))), **d}
    verdict, reason = combine_reason(parts)
    if lam_top is None or not have_init:
        reason = f"needs runs at exposure >= {PRETRAIN_EXPOSURE:g} with their initial ratio"
    return Claim(name="fig4.lm.decay_balances", source="our check (the causal question behind Figure 4)",
                 kind="check", statement=f"In our LMs, attention decay at exposure >= {PRETRAIN_EXPOSURE:g} raises "
                 "nuclear/bound (relative to its initial value) more than no decay.",
                 rule=f"(final/initial median nuclear/bound at the lambda with exposure >= {PRETRAIN_EXPOSURE:g}) - "
                      f"(same at lambda 0) against the margin {MARGIN_BALANCE:g}, paired by seed ({SPREAD_RULE}; "
                      "three-way, docs/methods/verdicts.md), both products",
                 tests=[v["test"] for v in measured.values()], measured={"lambda_top": lam_top, **measured}, verdict=verdict, reason=reason,
                 expected="difference > seed spread, both products", tolerance=SPREAD_RULE,
                 exposure={"needed": PRETRAIN_EXPOSURE, "got_attn": sorted({r["exposure"]["attn"] for r in runs})},
                 key="; ".join(f"{p.upper()} final/initial {g3(v['final_over_initial_at_0'])} (lambda 0) vs "
                               f"{g3(v['final_over_initial_at_top'])} (lambda {lam_top:g}), diff {g3(v['diff'])} "
                               f"± {g3(v['spread'])}" for p, v in measured.items()) or "—",
                 detail="median over every head of all layers of nuclear/bound at the end over the same at step 0 "
                        "(the tracker's initialisation row).")


def _range(rows: list[dict[str, Any]], *cols: str) -> str:
    """``lo–hi`` of ``cols`` (default the trained ratio) over rows, for a claim's key."""
    return span(x[c] for x in rows for c in (cols or ("ratio_trained",)))


def nulls_keep_bound(data: dict[str, Any]) -> Claim:
    """``fig4.nulls_keep_bound`` (identity): both nulls keep every head's bound; the pairing null
    keeps each factor's row norms (as a multiset)."""
    worst = 0.0
    for d in [data["described"], *data["runs"]]:
        for p in d["products"].values():
            b = np.asarray(p["bound_trained"], dtype=float)
            for n in NULLS:
                worst = max(worst, float(np.max(np.abs(np.asarray(p[f"bound_{n}"], dtype=float) - b) / b)))
            rt, rp = (np.asarray(p[k], dtype=float) for k in ("rows_b_sorted_trained", "rows_b_sorted_pairing"))
            worst = max(worst, float(np.max(np.abs(rp - rt) / rt)))
    return Claim(name="fig4.nulls_keep_bound", source="our null models (docs/METHODS.md)", statement=ST_NULL,
                 measured={"max_relative_difference": worst}, expected="<= 1e-10", held=worst <= 1e-10,
                 tolerance=1e-10, kind="identity", detail="Over every head of the described model and the own LMs.")


def claims(data: dict[str, Any], params: Fig4Params) -> list[Claim]:
    """The caption's two LLaMA-2-7B sentences (testable only on a given checkpoint), the own-LM
    causal check, and the nulls' identity."""
    return [llama_coincide(data, params), llama_rows(data, params), decay_balances(data, params),
            nulls_keep_bound(data)]


# -- figures and notes -----------------------------------------------------------------------------

def figures(data: dict[str, Any], params: Fig4Params) -> list[FigureOut]:
    """Described model: row norms (head 0 per layer) and nuclear/bound against the nulls; own LMs."""
    from headrank.studies.lm_plots import fig4_ratios, fig4_rows_head0

    d = data["described"]
    return [FigureOut("fig4_rows", fig4_rows_head0(d), f"{d['source']}: squared row norms, head 0 of each layer "
                      "(cf. paper Fig. 4 left)."),
            FigureOut("fig4_ratios", fig4_ratios(data), "Nuclear norm / Frobenius bound per head: described model and "
                      "our LMs at each decay exposure, against the rotation and row-pairing nulls (1 = balanced).")]


def notes(data: dict[str, Any], params: Fig4Params) -> list[str]:
    """What the described model is, and its numbers against the nulls."""
    d = data["described"]
    out = [f"Described checkpoint: {d['source']}. " + ("MiniLM-L6 stands in for LLaMA-2 7B, which cannot be "
           "downloaded here; it is distilled and contrastively fine-tuned with an unknown, small decay exposure and "
           "undecayed biases, so it is described, not judged." if params.model is None else
           "A user-given checkpoint: described, not judged."),
           "Raw weights: no LayerNorm gain folded in; biases excluded from the products. Nulls keep the real factors "
           "and destroy only their pairing: rotation B -> B O (O Haar on the dh inner dimension), row-pairing shuffle "
           "(a random permutation of B's rows per head)."]
    for p, (label, _) in PRODUCTS.items():
        m = medians(d, p)
        out.append(f"{label}: median nuclear/bound {m['ratio_trained']:.4f} (rotation null {m['ratio_rotation']:.4f}, "
                   f"pairing null {m['ratio_pairing']:.4f}); median row spread |log10| {m['spread_trained']:.4f} "
                   f"(rotation {m['spread_rotation']:.4f}, pairing {m['spread_pairing']:.4f}).")
    out.append(f"Own LMs: attention lambdas {data['lambdas']} for exposures {list(params.exposures)}, "
               f"{params.lm_steps} steps (peak lr 3e-3, so lr * lambda per step up to "
               f"{3e-3 * max(data['lambdas'] or [0.0]):.3g}; LLaMA-2: 3e-5), seeds {list(params.seeds)}; measured runtime "
               f"{data.get('runtime_s', float('nan')):.0f} s ({params.profile} profile).")
    return out


STUDY = register_study(Study(name="fig4", title=CATALOGUE["fig4"][1], source=SOURCE, params=Fig4Params, run=run,
                             claims=claims, figures=figures, notes=notes))
