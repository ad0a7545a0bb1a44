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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headrank.errors import HeadRankError, one_line
from headrank.models.opener import context_length, is_causal

EVAL_SPLIT, CALIB_SPLIT = "test", "validation"


#: what ``--eval-n``/``--calib-n``/``--seq-len`` default to: the README's cost curve (64 sentences
#: for an encoder, 16 windows of 128 tokens for a causal LM; calibration as many as evaluation)
DEFAULT_N = {"encoder": 64, "causal": 16}
DEFAULT_SEQ_LEN = 128
CALIB_SEED = 3  # SVD-LLM's calibration sampling seed


@dataclass(frozen=True)
class TextSpec:
    """Held-out text for scoring and calibration: ``n`` windows of ``seq_len`` tokens (LMs) or
    ``n`` sentences (encoders); ``n_calib`` calibration windows or sentences (default ``n``).

    Text: the stdlib corpus (test split scored, validation split calibrates), ``text_file``
    (second half of its lines scored, first half calibrates) or ``dataset`` (``wikitext2``: its
    test split scored, train split calibrates; ``c4``: validation shard 0 scored, train shard 0
    calibrates; through the ``datasets`` library). See docs/compress.md for the windows."""

    n: int = 32
    seq_len: int = 128
    text_file: str | None = None
    n_calib: int | None = None
    dataset: str | None = None

    @property
    def calib_n(self) -> int:
        return self.n if self.n_calib is None else self.n_calib

    @property
    def protocol(self) -> bool:
        """Whole-text windows (SVD-LLM / Palu / GPTQ) rather than the corpus's sentence windows."""
        return self.text_file is not None or self.dataset is not None

    def label(self) -> str:
        if self.dataset:
            return f"{self.dataset} ({'test' if self.dataset == 'wikitext2' else 'validation'} split)"
        if self.text_file:
            return f"{self.text_file} (second half)"
        return f"the stdlib corpus ({EVAL_SPLIT} split)"

    def texts(self, split: str, n: int) -> list[str]:
        from headrank.models import corpus

        if self.dataset is not None:
            lines = [t for t in dataset_texts(self.dataset, split) if t.strip()]
            return lines[:n] if n else lines
        if self.text_file is None:
            return corpus.sentences(split, n, min_words=6)
        from headrank.io.validate import read_text

        lines = [ln.strip() for ln in read_text(Path(self.text_file), "text file").splitlines() if ln.strip()]
        if len(lines) < 4:
            raise HeadRankError(f"`text` {self.text_file}: needs at least 4 non-empty lines")
        half = len(lines) // 2
        part = lines[half:] if split == EVAL_SPLIT else lines[:half]
        return part[:n] if n else part


def dataset_texts(name: str, split: str) -> list[str]:
    """The documents of ``--dataset NAME`` for ``split`` (EVAL_SPLIT or CALIB_SPLIT), through the
    ``datasets`` library (network, or a copy in the Hugging Face cache)."""
    from headrank.util.constraints import COMPRESS  # the names --dataset takes

    COMPRESS["dataset"].check(name)
    try:
        import datasets
    except ImportError:
        raise HeadRankError(f"`dataset` {name} needs the datasets package; or give the text with `text` FILE") from None
    try:
        with _quiet_datasets(datasets):
            if name == "wikitext2":
                ds = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test" if split == EVAL_SPLIT else "train")
                return list(ds["text"])
            shard = "validation.00000-of-00008" if split == EVAL_SPLIT else "train.00000-of-01024"
            ds = datasets.load_dataset("allenai/c4", data_files={"x": f"en/c4-{shard}.json.gz"}, split="x")
            return list(ds.select(range(min(len(ds), 1100 if split == EVAL_SPLIT else 5000)))["text"])
    except Exception as e:  # noqa: BLE001 - offline, not cached, a changed hub layout
        raise HeadRankError(f"`dataset` {name}: not available here (no network and no copy in the Hugging Face "
                            f"cache: {one_line(e, 120)}); give the text with `text` (a file)") from None


class _quiet_datasets:
    def __init__(self, ds):
        self.ds = ds

    def __enter__(self):
        self.bars = self.ds.utils.logging.is_progress_bar_enabled()
        self.ds.utils.logging.disable_progress_bar()
        self.level = self.ds.utils.logging.get_verbosity()
        self.ds.utils.logging.set_verbosity_error()

    def __exit__(self, *exc):
        if self.bars:
            self.ds.utils.logging.enable_progress_bar()
        self.ds.utils.logging.set_verbosity(self.level)
        return False


def token_windows(tok, spec: TextSpec, split: str) -> torch.Tensor:
    """``(n, seq_len)`` token ids of ``split``: the evaluation windows, or the calibration ones.

    The corpus: its sentences joined, cut into consecutive windows. ``--text`` / ``--dataset``
    (SVD-LLM, Palu, GPTQ): the documents joined with blank lines and tokenized once (the
    tokenizer's own special tokens: a BOS at the start of the text only); evaluation takes
    consecutive non-overlapping windows (stride = seq_len) from the start, calibration ``n_calib``
    windows at uniformly random offsets (seed 3)."""
    if spec.protocol:
        return _protocol_windows(tok, spec, split)
    ids: list[int] = []
    n_want = spec.n if split == EVAL_SPLIT else spec.calib_n
    need = n_want * spec.seq_len
    for t in spec.texts(split, 40 * n_want):
        ids += tok(t + "\n", add_special_tokens=False)["input_ids"]
        if len(ids) >= need:
            break
    n = min(len(ids) // spec.seq_len, n_want)
    if n < 1:
        raise HeadRankError(f"not enough {split} text for one window of {spec.seq_len} tokens")
    return torch.tensor(ids[: n * spec.seq_len]).reshape(n, spec.seq_len)


def _protocol_windows(tok, spec: TextSpec, split: str) -> torch.Tensor:
    texts = spec.texts(split, 0)
    joiner = " " if spec.dataset == "c4" else "\n\n"
    ids = torch.tensor(tok(joiner.join(texts))["input_ids"], dtype=torch.long)
    L = spec.seq_len
    what = "`text` file's " + ("second" if split == EVAL_SPLIT else "first") + " half" if spec.text_file else split
    if split == EVAL_SPLIT:
        n = min(len(ids) // L, spec.n)
        if n < 1:
            raise HeadRankError(f"{what} holds {len(ids)} tokens: not one window of `seq_len` {L}")
        return ids[: n * L].reshape(n, L)
    if len(ids) <= L:
        raise HeadRankError(f"calibration text ({what}) holds {len(ids)} tokens: not one window of `seq_len` {L}")
    g = torch.Generator().manual_seed(CALIB_SEED)
    starts = torch.randint(0, len(ids) - L + 1, (spec.calib_n,), generator=g)
    return torch.stack([ids[a: a + L] for a in starts.tolist()])


def sentence_batch(tok, spec: TextSpec, split: str) -> dict[str, torch.Tensor]:
    texts = spec.texts(split, spec.n if split == EVAL_SPLIT else spec.calib_n)
    return dict(tok(texts, padding=True, truncation=True, max_length=spec.seq_len, return_tensors="pt"))


@torch.no_grad()
def mean_nll(model, windows: torch.Tensor, progress: Callable[[int, int], None] | None = None,
             upcast: bool = True) -> float:
    """Mean next-token negative log-likelihood over the windows, one window per forward; the
    cross-entropy in float64 (``upcast=False``: in the logits' dtype, summed in float64)."""
    nll, count = 0.0, 0
    for j, w in enumerate(windows):
        logits = model(input_ids=w[None]).logits[0, :-1]
        logits = logits.to(torch.float64) if upcast else logits
        nll += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
        count += w.numel() - 1
        if progress:
            progress(j + 1, len(windows))
    return nll / count


def perplexity(model, windows: torch.Tensor, progress: Callable[[int, int], None] | None = None) -> float:
    """exp(:func:`mean_nll`) over the windows."""
    return math.exp(mean_nll(model, windows, progress))


@torch.no_grad()
def embeddings(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean-pooled last hidden states over the valid tokens (sentence-transformers' pooling)."""
    h = model(**batch).last_hidden_state.to(torch.float64)
    m = batch["attention_mask"][..., None].to(torch.float64)
    return (h * m).sum(1) / m.sum(1)


def drift(e0: torch.Tensor, e1: torch.Tensor) -> float:
    return float((1 - torch.nn.functional.cosine_similarity(e0, e1, dim=-1)).mean())


def split_text(model, tok, spec: TextSpec, split: str) -> tuple[bool, Any, str, torch.Tensor | None]:
    """What a model is scored on in ``split``: ``(causal, data, description, reference)``, the
    token windows of a causal LM, or the sentence batch of an encoder with ``model``'s mean-pooled
    embeddings of it as the reference (None for a causal LM)."""
    if is_causal(model):
        data = token_windows(tok, spec, split)
        return True, data, f"{data.shape[0]} windows of {data.shape[1]} tokens", None
    data = sentence_batch(tok, spec, split)
    return False, data, f"{data['input_ids'].shape[0]} sentences", embeddings(model, data)


class Scorer:
    """Scores models on one fixed held-out set: perplexity (LM) or embedding drift (encoder)
    against the reference model given first."""

    def __init__(self, model, tok, spec: TextSpec):
        n_ctx = context_length(model.config)
        if n_ctx is not None and spec.seq_len > n_ctx:
            raise HeadRankError(f"`seq_len` {spec.seq_len} exceeds the model's context of {n_ctx} tokens")
        self.causal, self.data, self.note, self.ref = split_text(model, tok, spec, EVAL_SPLIT)
        self.metric = "perplexity" if self.causal else "cosine_drift"
        self.note += f" of {spec.label()}"

    def key(self) -> str:
        """A digest of the scored data (token ids) and the metric: half of a baseline's cache key."""
        import hashlib

        h = hashlib.sha256(self.metric.encode())
        for t in ([self.data] if self.causal else [self.data[k] for k in sorted(self.data)]):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.to(torch.int64).numpy().tobytes())
        return h.hexdigest()

    def __call__(self, model, progress: Callable[[int, int], None] | None = None) -> float:
        if self.causal:
            return perplexity(model, self.data, progress)
        return drift(self.ref, embeddings(model, self.data))


@torch.no_grad()
def calibration(model, tok, modules, spec: TextSpec, n_layers: int,
                progress: Callable[[int, int], None] | None = None) -> dict[int, torch.Tensor]:
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
            windows = token_windows(tok, spec, CALIB_SPLIT)
            for j, w in enumerate(windows):
                model(input_ids=w[None])
                if progress:
                    progress(j + 1, len(windows))
        else:
            texts = spec.texts(CALIB_SPLIT, spec.calib_n)
            for j, t in enumerate(texts):
                model(**tok([t], truncation=True, max_length=spec.seq_len, return_tensors="pt"))
                if progress:
                    progress(j + 1, len(texts))
    finally:
        for h in handles:
            h.remove()
    out = {}
    for i, C in acc.items():
        C = C / max(count[0], 1)
        C = C + 1e-6 * torch.diagonal(C).mean() * torch.eye(C.shape[0], dtype=C.dtype)
        out[i] = torch.linalg.cholesky(C)
    return out
