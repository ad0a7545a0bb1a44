"""What a cut costs, measured with the real Hugging Face forward on held-out real text.

- causal LMs (``*ForCausalLM`` / ``*LMHeadModel``): perplexity over windows of held-out text;
- encoders: the cosine drift ``1 − cos(e, e')`` of mean-pooled sentence embeddings against the
  uncut model's, averaged over held-out sentences.

Text: the standard-library corpus (:mod:`headrank.models.corpus`), held-out ``test`` split for
the cost, ``validation`` split for the whitening calibration; or the user's ``--text FILE``
(its first half calibrates, its second half is scored).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headrank.errors import HeadRankError, one_line

EVAL_SPLIT, CALIB_SPLIT = "test", "validation"


@dataclass(frozen=True)
class TextSpec:
    """Held-out text for scoring and calibration: ``n`` windows of ``seq_len`` tokens (LMs) or
    ``n`` sentences (encoders)."""

    n: int = 32
    seq_len: int = 128
    text_file: str | None = None

    def texts(self, split: str, n: int) -> list[str]:
        from headrank.models import corpus

        if self.text_file is None:
            return corpus.sentences(split, n, min_words=6)
        from headrank.io.validate import read_text

        lines = [ln.strip() for ln in read_text(Path(self.text_file), "text file").splitlines() if ln.strip()]
        if len(lines) < 4:
            raise HeadRankError(f"`text` {self.text_file}: needs at least 4 non-empty lines")
        half = len(lines) // 2
        part = lines[half:] if split == EVAL_SPLIT else lines[:half]
        return part[:n] if n else part


def is_causal(obj: Any) -> bool:
    """A causal LM: a model whose class, or a config whose ``architectures``, ends in
    ``ForCausalLM`` / ``LMHeadModel``."""
    names = [type(obj).__name__] if hasattr(obj, "config") else list(getattr(obj, "architectures", None) or [])
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in names)


def load(path: str | Path, *, dtype: torch.dtype = torch.float32):
    """The model (causal LM head or bare encoder) and tokenizer saved in ``path``."""
    from headrank.models.opener import quiet_transformers

    try:
        with quiet_transformers() as tf:
            cfg = tf.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
            cls = tf.AutoModelForCausalLM if is_causal(cfg) else tf.AutoModel
            model = cls.from_pretrained(path, config=cfg, dtype=dtype, local_files_only=True,
                                        trust_remote_code=False, attn_implementation="eager")
            tok = tf.AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - no tokenizer, unknown architecture, ...
        raise HeadRankError(f"`evaluate`: cannot load {path} with transformers: {one_line(e, 200)}") from None
    return model.eval(), tok


def token_windows(tok, spec: TextSpec, split: str) -> torch.Tensor:
    """``(n, seq_len)`` token ids: the split's sentences joined, cut into windows."""
    ids: list[int] = []
    need = spec.n * spec.seq_len
    texts = spec.texts(split, 0 if spec.text_file else 40 * spec.n)
    for t in texts:
        ids += tok(t + "\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            break
    n = len(ids) // spec.seq_len
    if n < 1:
        raise HeadRankError(f"not enough {split} text for one window of {spec.seq_len} tokens")
    return torch.tensor(ids[: n * spec.seq_len]).reshape(n, spec.seq_len)


def sentence_batch(tok, spec: TextSpec, split: str) -> dict[str, torch.Tensor]:
    texts = spec.texts(split, spec.n)
    return dict(tok(texts, padding=True, truncation=True, max_length=spec.seq_len, return_tensors="pt"))


@torch.no_grad()
def perplexity(model, windows: torch.Tensor) -> float:
    """exp(mean next-token negative log-likelihood) over the windows (float64 reduction)."""
    nll, count = 0.0, 0
    for w in windows:
        logits = model(input_ids=w[None]).logits[0, :-1].to(torch.float64)
        nll += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
        count += w.numel() - 1
    return math.exp(nll / count)


@torch.no_grad()
def embeddings(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean-pooled last hidden states over the valid tokens (sentence-transformers' pooling)."""
    h = model(**batch).last_hidden_state.to(torch.float64)
    m = batch["attention_mask"][..., None].to(torch.float64)
    return (h * m).sum(1) / m.sum(1)


def drift(e0: torch.Tensor, e1: torch.Tensor) -> float:
    return float((1 - torch.nn.functional.cosine_similarity(e0, e1, dim=-1)).mean())


class Scorer:
    """Scores models on one fixed held-out set: perplexity (LM) or embedding drift (encoder)
    against the reference model given first."""

    def __init__(self, model, tok, spec: TextSpec):
        self.causal = is_causal(model)
        self.metric = "perplexity" if self.causal else "cosine_drift"
        if self.causal:
            self.data = token_windows(tok, spec, EVAL_SPLIT)
            self.note = f"{self.data.shape[0]} windows of {self.data.shape[1]} tokens"
        else:
            self.data = sentence_batch(tok, spec, EVAL_SPLIT)
            self.note = f"{self.data['input_ids'].shape[0]} sentences"
            self.ref = embeddings(model, self.data)
        self.note += (f" of {spec.text_file} (second half)" if spec.text_file
                      else f" of the stdlib corpus ({EVAL_SPLIT} split)")

    def __call__(self, model) -> float:
        if self.causal:
            return perplexity(model, self.data)
        return drift(self.ref, embeddings(model, self.data))


@torch.no_grad()
def calibration(model, tok, modules, spec: TextSpec, n_layers: int) -> dict[int, torch.Tensor]:
    """Per layer, the lower Cholesky factor ``L`` of ``E[x xᵀ] + δI`` over the inputs ``x`` of the
    layer's attention on calibration text (a separate split), δ = 1e-6 · mean eigenvalue."""
    if modules is None:
        raise HeadRankError("activation-whitened cuts need the model's module paths (layout table: bert, "
                            "gpt2, llama family); use the weight-only cut")
    base = model.base_model
    acc: dict[int, torch.Tensor] = {}
    count = [0]

    def hook(i):
        def pre(mod, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            x = x.detach().to(torch.float64).reshape(-1, x.shape[-1])
            acc[i] = acc.get(i, 0) + x.mT @ x
            if i == 0:
                count[0] += x.shape[0]
        return pre

    handles = [base.get_submodule(modules.attention(i)).register_forward_pre_hook(hook(i), with_kwargs=True)
               for i in range(n_layers)]
    try:
        if is_causal(model):
            for w in token_windows(tok, spec, CALIB_SPLIT):
                model(input_ids=w[None])
        else:
            for t in spec.texts(CALIB_SPLIT, spec.n):
                model(**tok([t], truncation=True, max_length=spec.seq_len, return_tensors="pt"))
    finally:
        for h in handles:
            h.remove()
    out = {}
    for i, C in acc.items():
        C = C / max(count[0], 1)
        C = C + 1e-6 * torch.diagonal(C).mean() * torch.eye(C.shape[0], dtype=C.dtype)
        out[i] = torch.linalg.cholesky(C)
    return out
