"""Safe by default (docs/compress.md, "Safe by default"): a causal LM is cut whitened unless told
otherwise, the calibration's cost is announced before it starts, ``--eval`` adds a generation
check beside perplexity, and a cut that costs too much says so with the numbers and the next
thing to try (recorded in compress.json's ``warnings``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from headrank.compress.evaluate import CALIB_SPLIT, TextSpec, token_windows
from headrank.models.opener import is_causal

PROMPTS = ("The capital of France is", "Water boils at a temperature of",
           "The first president of the United States was", "Once upon a time, there was a little")
NEW_TOKENS = 16
PERPLEXITY_MAX_RATIO = 1.5  # past this growth of perplexity: a warning
AGREEMENT_MIN = 0.5  # below this share of greedy tokens agreeing with the uncut model: a warning
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")

log = logging.getLogger("headrank")


def announce(line: str) -> None:
    """The default announcement of the Python API: the ``headrank`` logger (printed on stderr
    by Python's last-resort handler when nothing is configured)."""
    log.warning(line)


def causal_source(reader, live) -> bool:
    """A causal LM: the live model (a GGUF source) by its class, else the checkpoint's config.json."""
    return is_causal(live if live is not None else reader.ckpt.config or {})


def default_whiten(whiten: bool | None, reader, live, src: Path | None, notes: list[str]) -> bool:
    """``whiten`` as given; None: True for a causal LM that can be calibrated (a tokenizer and
    the module paths), else False, with a note saying why a causal LM was cut plain."""
    if whiten is not None:
        return bool(whiten)
    if not causal_source(reader, live):
        return False
    tok = (getattr(live, "_headrank_tokenizer", None) is not None if live is not None else
           src is not None and any((src / f).is_file() for f in _TOKENIZER_FILES))
    why = ("it has no tokenizer to calibrate with" if not tok else
           "its module paths are not known (layout table: bert, gpt2, llama family)" if reader.layout.modules is None
           else None)
    if why is None:
        return True
    notes.append(f"cut without whitening, though this is a causal LM: {why}; a plain cut can ruin a causal LM "
                 "(--eval measures it)")
    return False


def calibration_cost(model, tok, spec: TextSpec) -> str:
    """The whitened cut's calibration, estimated before it starts: its windows and tokens, the
    forward FLOPs (2 per parameter per token), and the seconds one window took here, times their
    number (that window is then done again by the calibration)."""
    n_params = sum(p.numel() for p in model.parameters())
    if is_causal(model):
        windows = token_windows(tok, spec, CALIB_SPLIT)
        n, tokens = len(windows), int(windows.numel())
        t0 = time.perf_counter()
        with torch.no_grad():
            model(input_ids=windows[:1])
        each = time.perf_counter() - t0
        what = f"{n} windows of {windows.shape[1]} tokens"
    else:
        n = spec.calib_n
        tokens, each, what = n * spec.seq_len, None, f"up to {n} sentences"
    flops = 2.0 * n_params * tokens
    took = f"; one window took {each:.2f} s here: about {each * n:.0f} s in all" if each is not None else ""
    return (f"calibrating the whitened cut (the default for a causal LM; --no-whiten skips it): {what} through "
            f"{n_params:,} parameters, {flops:.2g} FLOP{took}")


def _greedy(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` greedy tokens after ``ids`` (a plain loop of full forwards: any model with logits)."""
    out = ids
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=out).logits[:, -1]
            out = torch.cat([out, logits.argmax(-1, keepdim=True)], dim=1)
    return out[0, ids.shape[1]:]


def generation_check(orig, cut, tok, context: int | None = None, progress=None) -> dict[str, Any]:
    """Greedy continuations of :data:`PROMPTS` by the uncut and the cut model, and the share of
    positions where the cut model's token is the uncut model's. ``progress(done, total)``: after
    each prompt."""
    n = NEW_TOKENS
    rows, agree, total = [], 0, 0
    for i, prompt in enumerate(PROMPTS):
        if progress is not None:
            progress(i, len(PROMPTS))
        ids = tok(prompt, return_tensors="pt").input_ids
        if context is not None and ids.shape[1] + n > context:
            continue
        a, b = _greedy(orig, ids, n), _greedy(cut, ids, n)
        same = int((a == b).sum())
        agree, total = agree + same, total + n
        rows.append({"prompt": prompt, "uncut": tok.decode(a), "cut": tok.decode(b), "tokens_agreeing": same})
    return {"agreement": agree / total if total else None, "new_tokens": n, "prompts": rows,
            "note": f"greedy continuations of {len(rows)} fixed prompts, {n} tokens each; agreement: the share of "
                    "positions where the cut model's token is the uncut model's (float32, full forwards)"}


def judge(result: dict[str, Any], run: dict[str, Any]) -> None:
    """``result["warnings"]``: where the measured cost passes :data:`PERPLEXITY_MAX_RATIO` or the
    generation agreement falls below :data:`AGREEMENT_MIN`, one line with the numbers and the
    next thing to try."""
    e = result.get("eval") or {}
    if e.get("metric") != "perplexity":
        return
    bad = []
    before, after = e.get("before"), e.get("after")
    if isinstance(before, float) and isinstance(after, float) and before > 0 and after > PERPLEXITY_MAX_RATIO * before:
        bad.append(f"perplexity {before:.4g} -> {after:.4g} ({after / before:.3g}x, over {PERPLEXITY_MAX_RATIO}x)")
    agreement = (e.get("generation") or {}).get("agreement")
    if isinstance(agreement, float) and agreement < AGREEMENT_MIN:
        bad.append(f"greedy generation agrees with the uncut model on {agreement:.0%} of tokens (under "
                   f"{AGREEMENT_MIN:.0%})")
    if bad:
        result["warnings"] = [f"this cut costs too much: {'; '.join(bad)}; next: {_next(result, run)}"]


def _next(result: dict[str, Any], run: dict[str, Any]) -> str:
    if not result.get("whitened"):
        return "the whitened cut (drop --no-whiten; calibrated on the built-in corpus, or --text/--dataset)"
    # not --allocate loss: whitened, the energy allocation beat it on SmolLM2 (perplexity 51.46 against
    # 66.62 at --params 0.5 --products ov; docs/compress.md, "Energy or measured loss")
    tips = ["keep more (a larger --params or --keep)"]
    if "qk" in str(result.get("products", "")):
        tips.append("cut OV only (--products ov)")
    return ", or ".join(tips)
