"""Figure 4 of the paper on a pretrained checkpoint that ships offline (MiniLM-L6).

The paper's Figure 4 analyses LLaMA-2 7B: squared row norms of W_Q against W_K (and of W_V
against the columns of P) fall on the diagonal, and the Frobenius bound ½(‖A‖²+‖B‖²) almost
coincides with the nuclear norm ‖ABᵀ‖_* for every head. Here the same analysis runs on MiniLM
(``attnrank spectra minilm``); on any other checkpoint use ``attnrank spectra PATH --out DIR``,
which writes the same figures.

The baseline keeps every head's factor norms ‖A‖_F, ‖B‖_F and draws random directions
(seeded Gaussian).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch

from attnrank.studies.registry import CATALOGUE, Claim, FigureOut, Study, register_study

SOURCE = "Kobayashi et al. 2024, Fig. 4 (seed 000); REFERENCE.md §1"
COINCIDE = 0.99  # "the two norms almost perfectly coincide": median nuclear / bound at least this
PRODUCTS = {"qk": ("W_K^T W_Q", "k", "q", "W_Q vs W_K"), "ov": ("P W_V", "p", "v", "W_V vs columns of P")}
ST_BOUND = ("For every head of a model trained with weight decay, the Frobenius bound of {label} almost coincides "
            "with its nuclear norm (paper: LLaMA-2 7B; here: MiniLM-L6).")
ST_RANDOM = ("Training brought the {label} factors closer to balance than random directions with the same per-head "
             "factor norms.")
ST_ROWS = "Squared row norms of {rows} lie near the diagonal (the balance condition)."


@dataclass(frozen=True)
class Fig4Params:
    """The checkpoint analysed and the baseline's seed (one profile: the analysis takes seconds)."""

    model: str = "minilm"
    baseline_seed: int = 0
    coincide: float = COINCIDE

    @classmethod
    def quick(cls) -> Fig4Params:
        """Same as full."""
        return cls()

    @classmethod
    def full(cls) -> Fig4Params:
        """MiniLM-L6."""
        return cls()


def _random_baseline(result: Any, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Per head: Gaussian factors with the trained head's ‖A‖_F, ‖B‖_F; their metrics and row norms."""
    from attnrank.core.linalg import product_metrics

    cfg = result.meta["config"]
    d, dh = cfg["d_model"], cfg["head_dim"]
    rn = result.row_norms
    g = torch.Generator().manual_seed(seed)
    out = {}
    for product, (a_key, b_key) in (("qk", ("k", "q")), ("ov", ("p", "v"))):
        na = torch.from_numpy(rn[a_key].sum(-1)).sqrt()  # (L, H): ‖A‖_F per head
        nb = torch.from_numpy(rn[b_key].sum(-1)).sqrt()
        A = torch.randn(*na.shape, d, dh, generator=g, dtype=torch.float64)
        B = torch.randn(*nb.shape, d, dh, generator=g, dtype=torch.float64)
        A *= (na / torch.linalg.matrix_norm(A))[..., None, None]
        B *= (nb / torch.linalg.matrix_norm(B))[..., None, None]
        m = product_metrics(A, B)
        out[product] = {"ratio": (m.nuclear / m.frob_bound).numpy(), "row_a": (A**2).sum(-2).numpy(),
                        "row_b": (B**2).sum(-2).numpy()}
    return out


def run(params: Fig4Params) -> dict[str, Any]:
    """Spectra table, row norms and the random baseline of the checkpoint."""
    from attnrank.analysis.scan import analyze

    res = analyze(params.model)
    base = _random_baseline(res, params.baseline_seed)
    return {"heads": res.table[["layer", "head", "product", "nuclear", "frob_bound", "gap", "balance_rel", "finite"]]
            .to_dict("list"),
            "row_norms": {k: v.tolist() for k, v in res.row_norms.items()},
            "random": {p: {k: v.tolist() for k, v in b.items()} for p, b in base.items()},
            "meta": {k: res.meta[k] for k in ("source", "path", "config", "layers")}}


# -- claims ----------------------------------------------------------------------------------------

def row_spread(a: Any, b: Any) -> float:
    """Median over heads of the median |log10(row_b / row_a)|: 0 when every pair is on the diagonal."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.median(np.median(np.abs(np.log10(b / a)), axis=-1)))


def _ratio(data: dict[str, Any], product: str) -> np.ndarray:
    t = pd.DataFrame(data["heads"])
    s = t[t["product"] == product]
    return (s["nuclear"] / s["frob_bound"]).to_numpy(dtype=float)


def bound_coincides(data: dict[str, Any], product: str, threshold: float = COINCIDE) -> Claim:
    """``fig4.bound_coincides_P``: median nuclear / bound ≥ threshold."""
    ratio = _ratio(data, product)
    med = float(np.median(ratio))
    med_base = float(np.median(data["random"][product]["ratio"]))
    return Claim(name=f"fig4.bound_coincides_{product}", source=SOURCE,
                 statement=ST_BOUND.format(label=PRODUCTS[product][0]),
                 measured={"median_nuclear_over_bound": med, "min_nuclear_over_bound": float(ratio.min())},
                 expected=f"median >= {threshold}", held=med >= threshold, tolerance=threshold,
                 detail=f"{len(ratio)} heads. Random directions with the same factor norms give a median of "
                        f"{med_base:.4f}.")


def closer_than_random(data: dict[str, Any], product: str) -> Claim:
    """``fig4.closer_than_random_P``: trained median nuclear / bound above the random baseline's."""
    ratio = _ratio(data, product)
    base = np.asarray(data["random"][product]["ratio"], dtype=float).ravel()
    med, med_base = float(np.median(ratio)), float(np.median(base))
    return Claim(name=f"fig4.closer_than_random_{product}", source=SOURCE,
                 statement=ST_RANDOM.format(label=PRODUCTS[product][0]),
                 measured={"median_nuclear_over_bound": med, "random_baseline_median": med_base,
                           "fraction_of_heads_above_their_baseline": float(np.mean(ratio > base))},
                 expected="trained median > baseline median", held=med > med_base,
                 detail="Baseline: per head, Gaussian A and B rescaled to the trained ‖A‖_F and ‖B‖_F (seed 0).")


def rows_on_diagonal(data: dict[str, Any], product: str) -> Claim:
    """``fig4.rows_on_diagonal_P``: row-norm pairs closer to the diagonal than the random baseline's."""
    _, a_key, b_key, rows = PRODUCTS[product]
    sp = row_spread(data["row_norms"][a_key], data["row_norms"][b_key])
    sp_base = row_spread(data["random"][product]["row_a"], data["random"][product]["row_b"])
    return Claim(name=f"fig4.rows_on_diagonal_{product}", source=SOURCE, statement=ST_ROWS.format(rows=rows),
                 measured={"median_abs_log10_ratio": sp, "random_baseline": sp_base},
                 expected="closer to the diagonal than the random baseline", held=sp < sp_base,
                 detail="Per head, the median over its dh rows of |log10(‖row_b‖² / ‖row_a‖²)|; then the median over "
                        "heads. 0 means every point on the diagonal.")


def claims(data: dict[str, Any], params: Fig4Params) -> list[Claim]:
    """Per product: bound coincides, closer than random, rows on the diagonal."""
    return [c for p in PRODUCTS for c in (bound_coincides(data, p, params.coincide), closer_than_random(data, p),
                                          rows_on_diagonal(data, p))]


def _as_result(data: dict[str, Any]) -> SimpleNamespace:
    """What the analysis figures read (table, row_norms, meta), rebuilt from the data."""
    return SimpleNamespace(table=pd.DataFrame(data["heads"]), meta=data["meta"],
                           row_norms={k: np.asarray(v, dtype=float) for k, v in data["row_norms"].items()})


def figures(data: dict[str, Any], params: Fig4Params) -> list[FigureOut]:
    """Row norms of head 0 per layer; bound against nuclear norm for every head."""
    from attnrank.analysis.plots import fig4_norms, fig4_rows

    res = _as_result(data)
    return [FigureOut("fig4_rows", fig4_rows(res), "Squared row norms, head 0 of each layer (cf. paper Fig. 4 left)."),
            FigureOut("fig4_norms", fig4_norms(res), "Frobenius bound vs nuclear norm, every head (cf. Fig. 4 right).")]


def notes(data: dict[str, Any], params: Fig4Params) -> list[str]:
    """What the model is and is not."""
    return ["The paper's model (LLaMA-2 7B) cannot be downloaded here; MiniLM-L6 ships offline. Its training "
            "recipe (optimizer, weight decay) is not recorded in the checkpoint: the claims test the paper's "
            "observation on a different model, not a prediction about this one.",
            "Raw weights: no LayerNorm gain folded in; biases excluded from the products."]


STUDY = register_study(Study(name="fig4", title=CATALOGUE["fig4"][1], source=SOURCE, params=Fig4Params, run=run,
                             claims=claims, figures=figures, notes=notes))
