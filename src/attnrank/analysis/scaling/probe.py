"""Opening a model with fixed real inputs for the scale analysis: a Hugging Face model (English
sentences through its tokenizer, or digits images), the project's own model (its task's
sequences or digits images), in float64, eval mode."""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from attnrank.analysis.scaling.symmetries import _first_tensor
from attnrank.errors import AttnRankError
from attnrank.io.layouts import Layout, layout_for


def stdlib_sentences(n: int = 4, min_words: int = 8, max_words: int = 24) -> list[str]:
    """Real English text that ships with Python: sentences of standard-library docstrings."""
    import ast
    import textwrap

    out: list[str] = []
    for mod in (json, textwrap, ast, fnmatch):
        doc = (mod.__doc__ or "").replace("\n", " ")
        for s in doc.split(". "):
            if len(s.split()) >= min_words:
                out.append(" ".join(s.split()[:max_words]) + ".")
    return out[:n]


def digits_images(n: int, size: int, channels: int) -> torch.Tensor:
    """scikit-learn digits (8x8, values 0..16) scaled to [0, 1], resized to ``size`` and repeated
    over ``channels``: (n, channels, size, size) float64."""
    from attnrank.models.data import digits_arrays

    images, _ = digits_arrays()
    x = torch.tensor(np.ascontiguousarray(images[:n]), dtype=torch.float64)[:, None]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="nearest")
    return x.repeat(1, channels, 1, 1)


@dataclass
class Probe:
    """A model in float64, eval mode, with the function ``forward()`` on fixed real inputs."""

    model: nn.Module
    forward: Callable[[], torch.Tensor]
    source: str
    kind: str  # "huggingface" | "attnrank"
    config: dict[str, Any]
    inputs: str
    layout: Layout | None
    layout_note: str = ""


def _layout_or_note(config: dict[str, Any]) -> tuple[Layout | None, str]:
    try:
        return layout_for(config), ""
    except AttnRankError as e:
        return None, f"pair symmetries skipped: {e}"


def open_probe(source: str | os.PathLike, *, n_inputs: int = 4, max_tokens: int = 32, seed: int = 0) -> Probe:
    """Open ``minilm``, a Hugging Face model directory, the project's model directory (or a
    training run directory: its newest checkpoint) with fixed real inputs."""
    from attnrank.io.checkpoint import model_dir, read_config

    path = model_dir(source, "scale")
    config = read_config(path)
    if config.get("model_type") == "attnrank":
        return _open_attnrank(path, config, str(source), n_inputs=n_inputs, seed=seed)
    return _open_hf(path, config, str(source), n_inputs=n_inputs, max_tokens=max_tokens, seed=seed)


def _open_hf(path: Path, config: dict[str, Any], source: str, *, n_inputs: int, max_tokens: int,
             seed: int) -> Probe:
    import warnings

    try:
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise AttnRankError("reading a Hugging Face model needs the transformers package") from None
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModel.from_pretrained(str(path), local_files_only=True, attn_implementation="eager")
    except Exception as e:  # unknown model_type, missing or corrupt weights, …
        raise AttnRankError(f"cannot load {path} with transformers: {' '.join(str(e).split())[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    model = model.double().eval()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        size = int(config.get("image_size", 224))
        ch = int(config.get("num_channels", 3))
        pixels = digits_images(n_inputs, size, ch)
        inputs = f"{n_inputs} scikit-learn digits images resized to {size}x{size}, {ch} channels"

        def forward() -> torch.Tensor:
            return _first_tensor(model(pixel_values=pixels))
    elif main == "input_ids":
        ids, mask, inputs = _text_inputs(path, config, n_inputs, max_tokens, seed)

        def forward() -> torch.Tensor:
            h = _first_tensor(model(input_ids=ids, attention_mask=mask))
            return h[mask.bool()]  # valid positions only, (tokens, d)
    else:
        raise AttnRankError(f"model input {main!r} is not supported (token ids or pixel values)")
    layout, note = _layout_or_note(config)
    return Probe(model, forward, source, "huggingface", config, inputs, layout, note)


def _text_inputs(path: Path, config: dict[str, Any], n: int, max_tokens: int, seed: int):
    tok_file = path / "tokenizer.json"
    vocab = int(config.get("vocab_size") or 0)
    if tok_file.exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_file))
        tok.enable_truncation(max_length=max_tokens)
        tok.enable_padding(pad_id=int(config.get("pad_token_id") or 0))
        texts = stdlib_sentences(n)
        enc = tok.encode_batch(texts)
        ids = torch.tensor([e.ids for e in enc])
        mask = torch.tensor([e.attention_mask for e in enc])
        if vocab and int(ids.max()) >= vocab:
            raise AttnRankError(f"tokenizer.json in {path} produces ids beyond vocab_size={vocab}")
        return ids, mask, f"{n} English sentences (standard-library docstrings), tokenizer.json, <= {max_tokens} tokens"
    if not vocab:
        raise AttnRankError(f"{path} has no tokenizer.json and its config gives no vocab_size")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, max_tokens), generator=gen)
    return ids, torch.ones_like(ids), (f"{n} x {max_tokens} uniformly random token ids (seed {seed}): "
                                       "no tokenizer.json, so not real text")


def _open_attnrank(path: Path, config: dict[str, Any], source: str, *, n_inputs: int, seed: int) -> Probe:
    from attnrank.models.transformer import load_model

    model = load_model(path).double().eval()
    if config.get("architecture") == "ViT":
        c = model.config
        images = digits_images(n_inputs, c.image_size, c.channels)
        inputs = f"{n_inputs} scikit-learn digits images resized to {c.image_size}x{c.image_size}"

        def forward() -> torch.Tensor:
            return model(images)
    else:
        idx, inputs = _recall_inputs(path, model.config, n_inputs, seed)

        def forward() -> torch.Tensor:
            return model(idx)
    layout, note = _layout_or_note(config)
    return Probe(model, forward, source, "attnrank", config, inputs, layout, note)


def _recall_inputs(path: Path, mcfg: Any, n: int, seed: int) -> tuple[torch.Tensor, str]:
    """Task sequences for a checkpoint of a training run (RUN/checkpoints/step-*/), else random ids."""
    run_cfg = path.parent.parent / "config.json"
    task = None
    if path.parent.name == "checkpoints" and run_cfg.exists():
        try:
            task = json.loads(run_cfg.read_text()).get("task")
        except (OSError, ValueError):
            task = None
    if isinstance(task, dict):
        from attnrank.models.tasks import RecallConfig, make_recall_batch

        try:
            rc = RecallConfig(**{k: task[k] for k in ("n_pairs", "n_keys", "n_values", "n_queries") if k in task})
        except (AttnRankError, TypeError):
            rc = None
        if rc is not None and rc.vocab_size <= mcfg.vocab_size and rc.seq_len <= mcfg.max_seq_len:
            x, _ = make_recall_batch(rc, n, torch.Generator().manual_seed(seed))
            return x, f"{n} associative-recall sequences of the run's task (seed {seed})"
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, mcfg.vocab_size, (n, mcfg.max_seq_len), generator=gen)
    return x, f"{n} x {mcfg.max_seq_len} uniformly random token ids (seed {seed}): no training run config found"
