"""The options of ``compress`` checked with the CLI's rules (an API caller may pass anything),
the text protocol they select, and the cached uncut baseline."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from headrank.compress.evaluate import (
    DEFAULT_N,
    DEFAULT_SEQ_LEN,
    EVAL_SPLIT,
    Scorer,
    TextSpec,
)
from headrank.compress.safety import causal_source
from headrank.errors import HeadRankError
from headrank.models.opener import context_length
from headrank.util.constraints import COMPRESS
from headrank.util.env import cache_root

FORMATS = COMPRESS["format"].choices
ALLOCATE = COMPRESS["allocate"].choices


def check_options(*, format: Any, threads: Any, n_eval: Any, n_calib: Any, seq_len: Any, text: Any,
                  dataset: Any, allocate: Any, products: Any, rule: Any = None, dtype: Any = "auto") -> dict[str, Any]:
    """The options as the CLI would accept them, or HeadRankError with one line (``rule``: the
    :class:`~.plan.Rule`, which ``allocate`` loss needs to be a budget). Bounds and choices:
    :data:`headrank.util.constraints.COMPRESS`, the one table the command line reads too."""
    opts = COMPRESS.check(format=format, allocate=allocate, dataset=dataset, dtype=dtype, n_eval=n_eval,
                          n_calib=n_calib, seq_len=seq_len, threads=threads)
    if allocate == "loss" and rule is not None and rule.kind != "params":
        raise HeadRankError(f"`allocate` loss spends a global budget: give `params` (with `{rule.kind}` every "
                            "unit's rank is set by that rule)")
    if dataset is not None and text is not None:
        raise HeadRankError("give `text` FILE or `dataset` NAME, not both")
    if text is not None and not isinstance(text, (str, os.PathLike)):
        raise HeadRankError(f"`text` must be a file path, got {type(text).__name__}")
    if products is not None and not isinstance(products, str):
        items = list(products) if isinstance(products, (list, tuple, set, frozenset)) else None
        if items is None or not all(isinstance(p, str) for p in items):
            raise HeadRankError(f"`products` must name ov and/or qk (comma-separated); got {str(products)[:40]!r}")
        products = ",".join(items)
    return {**opts, "text": None if text is None else str(text), "products": products}


def text_spec(opts: dict[str, Any], reader, live) -> TextSpec:
    """The :class:`TextSpec` of the options; unset sizes default to the README's cost curve."""
    n = opts["n_eval"] or DEFAULT_N["causal" if causal_source(reader, live) else "encoder"]
    if opts["text"] is not None and not Path(opts["text"]).is_file():
        raise HeadRankError(f"`text` {opts['text']}: " + ("a directory, not a text file" if Path(opts["text"]).is_dir()
                                                          else "no such file"))
    spec = TextSpec(n=n, seq_len=opts["seq_len"] or DEFAULT_SEQ_LEN, text_file=opts["text"],
                    n_calib=opts["n_calib"], dataset=opts["dataset"])
    if spec.text_file is not None:
        spec.texts(EVAL_SPLIT, 1)  # read and checked now (UTF-8, enough lines), not after the cut
    return spec


def check_context(model, spec: TextSpec, given: bool = True) -> TextSpec:
    """``spec`` if its windows fit the model's context; an unset ``seq_len`` (``given`` False)
    whose default is longer than the context is capped at the context; a given one is refused."""
    n_ctx = context_length(model.config)
    if n_ctx is None or spec.seq_len <= n_ctx:
        return spec
    if not given:
        return replace(spec, seq_len=n_ctx)
    raise HeadRankError(f"`seq_len` {spec.seq_len} exceeds the model's context of {n_ctx} tokens")


# -- the cached uncut baseline ---------------------------------------------------------------------
def _model_key(reader) -> str | None:
    """The source's identity: its weight files' resolved paths, sizes and modification times."""
    path = getattr(reader, "source_file", None) or getattr(reader.ckpt, "path", None)  # a GGUF: its file
    if path is None or (reader.origin.get("input") in ("live", "state_dict") and not hasattr(reader, "source_file")):
        return None
    p = Path(path)
    try:
        files = sorted(q for q in p.iterdir() if q.is_file()) if p.is_dir() else [p]
        from headrank.io.validate import file_identity

        # device and inode too: a file replaced by rename with its size and time kept is another model
        return json.dumps([[str(q.resolve()), *file_identity(q)] for q in files])
    except OSError:
        return None


def baseline_key(reader, scorer: Scorer) -> str | None:
    """The uncut model's score is keyed by the model's files and the scored token ids."""
    model = _model_key(reader)
    if model is None:
        return None
    return hashlib.sha256((model + scorer.key()).encode()).hexdigest()[:32]


def cached_baseline(key: str | None) -> float | None:
    if key is None:
        return None
    try:
        from headrank.io.validate import read_json

        v = read_json(cache_root() / "baselines" / f"{key}.json", "compress record")["value"]
    except (HeadRankError, KeyError, TypeError):  # missing, a FIFO, too large, corrupt: measured again
        return None
    return float(v) if isinstance(v, (int, float)) else None


def store_baseline(key: str | None, value: float) -> None:
    """Best effort: a cache that cannot be written only costs the next run the recomputation."""
    if key is None:
        return
    d = cache_root() / "baselines"
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"value": value}))
        os.replace(tmp, d / f"{key}.json")
    except OSError:
        pass
