"""The one opener of real models with real inputs, for the analysis layer.

API::

    op = open_model(source, *, dtype=torch.float64, n_inputs=4, max_tokens=32, seed=0, what="this command")

``source`` is ``minilm`` (shipped), a Hugging Face model directory, a directory the project
saved (:func:`headrank.models.transformer.load_model`), or a training run directory (its
newest complete checkpoint), resolved by :func:`resolve`. The returned :class:`Opened` holds

- ``model`` in ``dtype``, eval mode (Hugging Face: ``AutoModel`` with eager attention, local
  files only, no remote code, ``use_cache`` off, transformers' warnings silenced while loading);
- ``config`` (config.json as a dict), ``path`` (the model directory), ``source`` (as given),
  ``kind`` (``"hf"`` or ``"headrank"``), ``model_type``, ``hf_config`` (transformers' config
  object, Hugging Face only);
- ``inputs``: a fixed batch of ``n_inputs`` real inputs, keyword arguments of the model
  (``input_ids`` + ``attention_mask``; ``pixel_values``; for the project's models ``idx``),
  and ``input_note``, a sentence saying what they are (``n_inputs=0``: none);
- ``forward()``: the model on ``inputs`` (Hugging Face text: the final hidden states at the
  valid token positions, (tokens, d); images: the first output tensor; the project's models:
  their logits);
- ``reinit(seed)``: the same architecture freshly initialised by its own initialiser, with
  ``torch.manual_seed(seed)`` in a forked RNG, in ``dtype``, eval mode;
- ``sequences(n, max_tokens=..., min_tokens=...)``: ``n`` unpadded real token sequences
  (:class:`Sequences`), for analyses that run one sequence at a time;
- ``vocab_size``, ``max_positions``, ``n_heads``.

Real inputs, one source of each:

- text: sentences of the standard-library corpus, test split, ≥ 10 words
  (:func:`headrank.models.corpus.sentences`; :func:`text_pool`), tokenised by the model's own
  ``tokenizer.json`` (in the model directory, else in its training run's directory), truncated
  to ``max_tokens``; without a tokenizer the UTF-8 bytes modulo the vocabulary (the project's
  byte-level LM);
- a project Transformer trained on associative recall (its run's config.json says so): that
  task's sequences (:func:`headrank.models.tasks.make_recall_batch`, seeded);
- images: scikit-learn digits (:func:`headrank.models.data.digits_arrays`, values in [0, 1])
  resized (nearest) to the model's image size and repeated over its channels.

The other ways transformers opens a model go through here too, under the same rules (local
files only, never the model's own code, transformers' warnings silenced, imported in the
caller's thread, any failure one :class:`~headrank.errors.HeadRankError` line naming ``what``
asked for the load: :func:`loading`):

- :func:`load`: a saved model with its task head where it is a causal LM (else the bare
  encoder) and its tokenizer (compress's ``evaluate``, ``whiten``, ``allocate`` loss);
- :func:`load_gguf`: a GGUF file, dequantized to float32 by transformers, and its tokenizer;
- :func:`hf_config` (transformers' config of a directory) and :func:`empty_model` (the model
  of a config.json on the meta device: :func:`headrank.compress.load_compressed`);
- :func:`is_causal` and :func:`context_length`, what a model, its config or its config.json say.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from headrank.errors import HeadRankError, one_line
from headrank.util.legacy import upgrade

PROJECT_TYPE = "headrank"
KINDS = ("hf", "headrank")
#: every transformers load: files on this machine only (a Hub id is resolved to a directory by
#: :mod:`headrank.io.checkpoint` first), never the model's own code
SAFE = {"local_files_only": True, "trust_remote_code": False}
CAUSAL = ("ForCausalLM", "LMHeadModel")  # the class-name endings of a causal LM
TEXT_SPLIT = "test"
TEXT_MIN_WORDS = 10


# --------------------------------------------------------------------------- sources


def resolve(source: str | os.PathLike, what: str = "this command") -> tuple[Path, dict[str, Any]]:
    """The model directory behind ``source`` (``minilm``, a model directory, a training run
    directory → its newest complete checkpoint) and its config.json."""
    from headrank.io.checkpoint import model_dir, read_config

    path = model_dir(source, what)
    return path, read_config(path)


def run_config(path: Path) -> dict[str, Any] | None:
    """The training run's config.json when ``path`` is a checkpoint ``RUN/checkpoints/step-*``."""
    cfg = path.parent.parent / "config.json"
    if path.parent.name != "checkpoints" or not cfg.exists():
        return None
    from headrank.io.validate import read_json

    out = upgrade(read_json(cfg, "run config"))  # a regular file only (a FIFO would block)
    return out if isinstance(out, dict) else None


class quiet_transformers:
    """transformers' logging, progress bars and Python warnings off for the block, then restored."""

    def __enter__(self):
        try:
            import transformers
        except ImportError:
            raise HeadRankError("reading a Hugging Face model needs the transformers package") from None
        self.tf = transformers
        self.level = transformers.logging.get_verbosity()
        self.bars = transformers.utils.logging.is_progress_bar_enabled()
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        self.warn = warnings.catch_warnings()
        self.warn.__enter__()
        warnings.simplefilter("ignore")
        return transformers

    def __exit__(self, *exc):
        self.warn.__exit__(*exc)
        self.tf.logging.set_verbosity(self.level)
        if self.bars:
            self.tf.utils.logging.enable_progress_bar()
        return False


# --------------------------------------------------------------------------- transformers, the one way in


@contextmanager
def loading(path: str | os.PathLike, what: str, how: str = "") -> Iterator[Any]:
    """transformers (quiet, imported here, in the caller's thread) for one load of ``path``; any
    failure inside the block is one line: ``WHAT: cannot load PATH with transformers[HOW]: why``."""
    try:
        with quiet_transformers() as tf:
            yield tf
    except HeadRankError:
        raise
    except Exception as e:  # noqa: BLE001 - unknown model_type, missing or corrupt files, a garbled config, …
        raise HeadRankError(f"{what}: cannot load {path} with transformers{how}: {one_line(e, 300, typed=True)}"
                            ) from None


def is_causal(obj: Any) -> bool:
    """A causal LM: a model whose class, or a config (transformers' object or config.json's dict)
    whose ``architectures``, ends in ``ForCausalLM`` / ``LMHeadModel``."""
    if isinstance(obj, dict):
        names = obj.get("architectures")
    else:
        names = [type(obj).__name__] if hasattr(obj, "config") else getattr(obj, "architectures", None)
    return isinstance(names, list | tuple) and any(isinstance(a, str) and a.endswith(CAUSAL) for a in names)


def context_length(config: Any) -> int | None:
    """The longest sequence a model's positions allow (transformers' config; None: not stated)."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def hf_config(path: str | os.PathLike, what: str) -> Any:
    """transformers' config of the model directory ``path`` (the one AutoConfig read)."""
    with loading(path, what) as tf:
        return tf.AutoConfig.from_pretrained(path, **SAFE)


def _model_class(tf: Any, cfg: Any) -> Any:
    return tf.AutoModelForCausalLM if is_causal(cfg) else tf.AutoModel


def load(path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, what: str = "this command"):
    """``(model, tokenizer)`` saved in ``path``: a causal LM with its head (config.json's
    ``architectures``), else the bare encoder, in ``dtype``, eager attention, eval mode; a
    directory without a tokenizer is refused (transformers would make an empty one)."""
    with loading(path, what) as tf:
        cfg = hf_config(path, what)
        model = _model_class(tf, cfg).from_pretrained(path, config=cfg, dtype=dtype, attn_implementation="eager", **SAFE)
        tok = _tokenizer(tf, path, what)
    return model.eval(), tok


_TOKENIZER_FILES = ("tokenizer*", "vocab*", "merges*", "*.model", "*.tiktoken")


def _tokenizer(tf: Any, path: str | os.PathLike, what: str) -> Any:
    """The tokenizer saved in ``path``; one line where it holds none: transformers makes an empty
    one (GPT-2) or fails with a remark on sentencepiece (Llama) where no tokenizer file is."""
    none = HeadRankError(f"{what}: {path} holds no tokenizer (no tokenizer.json, vocab or merges file)")
    try:
        tok = tf.AutoTokenizer.from_pretrained(path, **SAFE)
    except (ValueError, OSError):
        if any(next(Path(path).glob(g), None) for g in _TOKENIZER_FILES):
            raise  # a tokenizer file that does not load: transformers' reason is the line
        raise none from None
    if not getattr(tok, "vocab_size", 0):
        raise none
    return tok


def load_gguf(path: str | os.PathLike, *, what: str = "this command", verbose: bool = False):
    """``(model, tokenizer or None)`` of a GGUF file: transformers' causal LM (``gguf_file=``),
    its weights dequantized to float32 (and its config then says so: no quantization left), eval
    mode; None for a file without tokenizer metadata. transformers' GGUF reader draws a progress
    bar of its own (not its logging's): shown only when ``verbose``."""
    path = Path(path)
    with loading(path, what, " (gguf_file=)") as tf, _stderr_off(not verbose):
        model = tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **SAFE)
    try:
        with quiet_transformers() as tf, _stderr_off(not verbose):
            tok = tf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, **SAFE)
    except Exception:  # noqa: BLE001 - a GGUF without tokenizer metadata: weights only
        tok = None
    tok = tok if getattr(tok, "vocab_size", 0) else None
    qc = getattr(model.config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if str(method).lower().endswith("gguf"):  # transformers dequantized the weights: plain float32 now
        del model.config.quantization_config
    return model.eval(), tok


def empty_model(path: str | os.PathLike, *, dtype: torch.dtype | None, attn_implementation: str | None = None,
                what: str = "this command") -> nn.Module:
    """The model of ``path``'s config.json (its causal LM head where it has one) on the meta
    device: shapes only, nothing allocated or read but the config."""
    with loading(path, what) as tf:
        cfg = hf_config(path, what)
        kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
        with torch.device("meta"):
            return _model_class(tf, cfg).from_config(cfg, dtype=dtype, **kw)


@contextmanager
def _stderr_off(off: bool) -> Iterator[None]:
    if not off:
        yield
        return
    import io
    from contextlib import redirect_stderr

    with redirect_stderr(io.StringIO()):
        yield


# --------------------------------------------------------------------------- real inputs


def text_pool(n: int, min_words: int = TEXT_MIN_WORDS) -> list[str]:
    """The first ``n`` sentences (≥ ``min_words`` words) of the corpus test split: the one
    sentence source of the analyses."""
    from headrank.models import corpus

    return corpus.sentences(TEXT_SPLIT, n, min_words=min_words)


def tokenizer_file(path: Path) -> Path | None:
    """The model's ``tokenizer.json``: in its directory, else in its training run's directory."""
    for d in (path, path.parent.parent if path.parent.name == "checkpoints" else None):
        if d is not None and (d / "tokenizer.json").exists():
            return d / "tokenizer.json"
    return None


def tokenize(texts: list[str], path: Path, vocab_size: int, max_tokens: int) -> tuple[list[list[int]], str]:
    """Token ids per text (unpadded) with the model's own ``tokenizer.json``, truncated to
    ``max_tokens``; without one, UTF-8 bytes modulo the vocabulary size."""
    tj = tokenizer_file(Path(path))
    if tj is not None:
        from tokenizers import Tokenizer

        from headrank.io.validate import read_text

        text = read_text(tj, "tokenizer")  # a regular file only: a FIFO would block from_file forever
        try:
            tok = Tokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad input file
            raise HeadRankError(f"cannot read {tj}: {one_line(e, 200)}") from None
        tok.no_padding()
        tok.enable_truncation(max_length=max_tokens)
        ids = [enc.ids for enc in tok.encode_batch(list(texts))]
        if vocab_size and any(i >= vocab_size for s in ids for i in s):
            raise HeadRankError(f"{tj} produces ids beyond vocab_size={vocab_size}")
        return ids, f"tokenizer.json ({tj}), truncated to {max_tokens} tokens"
    if not vocab_size:
        raise HeadRankError(f"{path} has no tokenizer.json and its config gives no vocab_size")
    ids = [[b % vocab_size for b in t.encode("utf-8")][:max_tokens] for t in texts]
    return ids, f"no tokenizer.json: UTF-8 bytes modulo vocab_size={vocab_size}, first {max_tokens}"


def pad(ids: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, T) and attention mask (1 = token, 0 = padding)."""
    T = max(len(s) for s in ids)
    x = torch.tensor([s + [pad_id] * (T - len(s)) for s in ids])
    mask = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in ids])
    return x, mask


def digits_images(n: int, size: int, channels: int) -> torch.Tensor:
    """The first ``n`` scikit-learn digits (values in [0, 1]) resized (nearest) to ``size`` and
    repeated over ``channels``: (n, channels, size, size) float64."""
    from headrank.models.data import digits_arrays

    images, _ = digits_arrays()
    x = torch.tensor(images[:n], dtype=torch.float64)[:, None]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="nearest")
    return x.repeat(1, channels, 1, 1)


def recall_task(path: Path, vocab_size: int, max_seq_len: int):
    """The associative-recall task a project checkpoint was trained on (from its run's
    config.json), or None when it was not (or the task does not fit the model)."""
    from headrank.models.tasks import RecallConfig

    cfg = run_config(path)
    task = cfg.get("task") if cfg else None
    if not isinstance(task, dict) or cfg.get("task_name", "recall") != "recall":
        return None
    try:
        rc = RecallConfig(**{k: task[k] for k in ("n_pairs", "n_keys", "n_values", "n_queries") if k in task})
    except (HeadRankError, TypeError):
        return None
    return rc if rc.vocab_size <= vocab_size and rc.seq_len <= max_seq_len else None


def recall_inputs(rc, n: int, seed: int) -> torch.Tensor:
    """``n`` sequences of recall task ``rc`` (seeded), (n, seq_len) int64."""
    from headrank.models.tasks import make_recall_batch

    x, _ = make_recall_batch(rc, n, torch.Generator().manual_seed(seed))
    return x


@dataclass
class Sequences:
    """Unpadded token sequences for one-at-a-time analyses: ids, the texts they came from
    (None for task sequences) and a note saying how they were made."""

    ids: list[list[int]]
    texts: list[str] | None
    note: str


# --------------------------------------------------------------------------- the opened model


@dataclass
class Opened:
    """A model opened by :func:`open_model` (see the module docstring)."""

    model: nn.Module
    config: dict[str, Any]
    path: Path
    source: str
    kind: str
    dtype: torch.dtype
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    input_note: str = ""
    hf_config: Any = None
    seed: int = 0
    _forward: Callable[[], torch.Tensor] | None = None

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    @property
    def vocab_size(self) -> int:
        if self.kind == "headrank":
            return int(getattr(self.model.config, "vocab_size", 0) or 0)
        return int(getattr(self.hf_config, "vocab_size", 0) or 0)

    @property
    def max_positions(self) -> int | None:
        """Longest token sequence the model takes (None: unknown)."""
        if self.kind == "headrank":
            return getattr(self.model.config, "max_seq_len", None)
        c = self.hf_config
        mp = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)
        if self.model_type in ("roberta", "xlm-roberta") and mp:
            mp -= (getattr(c, "pad_token_id", 1) or 1) + 1  # positions start after the padding index
        return mp

    @property
    def n_heads(self) -> int:
        if self.kind == "headrank":
            return int(self.model.config.n_heads)
        c = self.hf_config
        return int(getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None))

    def forward(self) -> torch.Tensor:
        """The model's function on :attr:`inputs` (see the module docstring)."""
        if self._forward is None:
            raise HeadRankError("opened with n_inputs=0: no fixed inputs to run the model on")
        return self._forward()

    def reinit(self, seed: int) -> nn.Module:
        """The same architecture freshly initialised by its own initialiser (seeded, forked RNG)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if self.kind == "headrank":
                m = type(self.model)(self.model.config)
            else:
                with quiet_transformers() as tf:
                    m = tf.AutoModel.from_config(self.hf_config, attn_implementation="eager", dtype=self.dtype)
        return m.to(self.dtype).eval()

    def sequences(self, n: int, *, max_tokens: int, min_tokens: int = 1,
                  texts: list[str] | None = None) -> Sequences:
        """``n`` real token sequences, unpadded: the recall task's for a recall-trained project
        model, else sentences (``texts``, or the first of :func:`text_pool` with at least
        ``min_tokens`` tokens once truncated to ``max_tokens``; fewer when there are not enough)."""
        if self.max_positions:
            max_tokens = min(max_tokens, int(self.max_positions))
        if self.kind == "headrank" and texts is None:
            rc = recall_task(self.path, self.vocab_size, int(self.model.config.max_seq_len))
            if rc is not None:
                x = recall_inputs(rc, n, self.seed)
                return Sequences(x.tolist(), None,
                                 f"{n} associative-recall sequences of the run's task (seed {self.seed})")
        pool = text_pool(4 * n + 16) if texts is None else list(texts)
        ids, note = tokenize(pool, self.path, self.vocab_size, max_tokens)
        chosen = [(t, s) for t, s in zip(pool, ids, strict=True) if len(s) >= min(min_tokens, max_tokens)][:n]
        return Sequences([s for _, s in chosen], [t for t, _ in chosen], note)


def open_model(source: str | os.PathLike, *, dtype: torch.dtype = torch.float64, n_inputs: int = 4,
               max_tokens: int = 32, seed: int = 0, what: str = "this command",
               check: Callable[[dict[str, Any]], Any] | None = None) -> Opened:
    """Open ``source`` with ``n_inputs`` fixed real inputs (see the module docstring); ``check``
    is called with config.json before anything is loaded (it raises what the caller refuses)."""
    path, config = resolve(source, what)
    if check is not None:
        check(config)
    if config.get("model_type") == PROJECT_TYPE:
        op = _open_headrank(path, config, str(source), dtype)
    else:
        op = _open_hf(path, config, str(source), dtype, what)
    op.seed = seed
    if n_inputs > 0:
        _attach_inputs(op, n_inputs, max_tokens)
    return op


def check_model_fits(build: Callable[[], nn.Module], dtype: torch.dtype, where: Any) -> None:
    """Build the model on the meta device (shapes only: nothing is allocated) and refuse, before
    the real one is built, a model whose parameters and buffers in ``dtype``, twice (the model
    and the copy an analysis makes of it), cannot fit in this machine's memory."""
    from headrank.io.validate import check_fits

    with torch.device("meta"):
        m = build()
    n = sum(t.numel() for t in m.parameters()) + sum(t.numel() for t in m.buffers())
    size = torch.empty((), dtype=dtype).element_size()
    check_fits(2 * n * size, f"{where}: a model of {n:,} parameters in {str(dtype).removeprefix('torch.')} "
                             "(and one copy)")


def _open_headrank(path: Path, config: dict[str, Any], source: str, dtype: torch.dtype) -> Opened:
    from headrank.io.validate import check_config_sizes
    from headrank.models.transformer import Transformer, ViT, load_model

    cls = ViT if config.get("architecture") == "ViT" else Transformer
    # a lower bound, once: it only screens what cannot be built at all; check_model_fits counts exactly
    check_config_sizes(config, path / "config.json", dtype_bytes=torch.empty((), dtype=dtype).element_size())
    check_model_fits(lambda: cls.from_config_dict(config), dtype, path)
    model = load_model(path).to(dtype).eval()
    return Opened(model, config, path, source, "headrank", dtype)


def _open_hf(path: Path, config: dict[str, Any], source: str, dtype: torch.dtype, what: str) -> Opened:
    from headrank.io.checkpoint import LAYER_INDEX, check_layers_present
    from headrank.io.validate import check_config_sizes

    # sizes bounded and every declared layer present in the weights, before anything is built
    check_config_sizes(config, path / "config.json", dtype_bytes=torch.empty((), dtype=dtype).element_size())
    check_layers_present(path, config)
    with loading(path, what) as tf:
        cfg = hf_config(path, what)
        check_model_fits(lambda: tf.AutoModel.from_config(cfg, attn_implementation="eager"), dtype, path)
        model, info = tf.AutoModel.from_pretrained(path, config=cfg, attn_implementation="eager", dtype=dtype,
                                                   output_loading_info=True, **SAFE)
    random = [k for k in info.get("missing_keys", ()) if LAYER_INDEX.search(k)]  # a tensor of a layer
    if random:
        raise HeadRankError(f"{path}: the weights lack {len(random)} tensors of the layers config.json declares "
                            f"({random[0]}, ...): refusing to measure randomly initialised layers as the pretrained "
                            "model")
    model = model.to(dtype).eval()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return Opened(model, config, path, source, "hf", dtype, hf_config=cfg)


def first_tensor(out: Any) -> torch.Tensor:
    """The main tensor of a model output: ``last_hidden_state``, or the first entry."""
    while isinstance(out, list | tuple):
        out = out[0]
    if hasattr(out, "last_hidden_state"):
        out = out.last_hidden_state
    return out


def _attach_inputs(op: Opened, n: int, max_tokens: int) -> None:
    """Fill ``op.inputs``, ``op.input_note`` and its forward function."""
    model = op.model
    if op.kind == "headrank" and op.config.get("architecture") == "ViT":
        c = model.config
        op.inputs = {"x": digits_images(n, c.image_size, c.channels).to(op.dtype)}
        op.input_note = f"{n} scikit-learn digits images resized to {c.image_size}x{c.image_size}"
        op._forward = lambda: model(op.inputs["x"])
        return
    main = getattr(model, "main_input_name", "input_ids") if op.kind == "hf" else "idx"
    if main == "pixel_values":
        size, ch = int(op.config.get("image_size", 224)), int(op.config.get("num_channels", 3))
        op.inputs = {"pixel_values": digits_images(n, size, ch).to(op.dtype)}
        op.input_note = f"{n} scikit-learn digits images resized to {size}x{size}, {ch} channels"
        op._forward = lambda: first_tensor(model(**op.inputs))
        return
    if main not in ("input_ids", "idx"):
        raise HeadRankError(f"model input {main!r} is not supported (token ids or pixel values)")
    seqs = op.sequences(n, max_tokens=max_tokens)
    if not seqs.ids:
        raise HeadRankError(f"no input sequences for {op.path}")
    if op.kind == "headrank":  # one length for all (no padding: a bidirectional model would see it)
        T = min(len(s) for s in seqs.ids)
        op.inputs = {"idx": torch.tensor([s[:T] for s in seqs.ids])}
        op.input_note = (seqs.note if seqs.texts is None else
                         f"{len(seqs.ids)} English sentences of the stdlib corpus ({TEXT_SPLIT} split), "
                         f"{seqs.note}, cut to a common {T} tokens")
        op._forward = lambda: model(op.inputs["idx"])
        return
    ids, mask = pad(seqs.ids, int(op.config.get("pad_token_id") or 0))
    op.inputs = {"input_ids": ids, "attention_mask": mask}
    op.input_note = f"{len(seqs.ids)} English sentences of the stdlib corpus ({TEXT_SPLIT} split), {seqs.note}"

    def forward() -> torch.Tensor:
        h = first_tensor(model(**op.inputs))
        return h[mask.bool()]  # valid positions only, (tokens, d)

    op._forward = forward
