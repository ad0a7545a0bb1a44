"""Data for the language-model and vision-transformer runs: text corpora, tokenisers, images.

**Text.** By default the running interpreter's standard-library corpus (:mod:`headrank.models.corpus`:
docstrings and comments, split 80/10/10 by file). ``corpus=PATH`` reads the user's text instead:
a file or a directory (searched recursively, sorted) of

- ``.txt``: one document per blank-line-separated paragraph block (UTF-8);
- ``.jsonl``: one JSON object per line with a string field ``text`` (the Pile's format);
- ``.jsonl.zst``: the same, Zstandard-compressed (streamed through ``zstandard``).

A user document's split is fixed by the same SHA-256 rule as the stdlib corpus
(:func:`headrank.models.corpus.split_of`) applied to ``"<relative path>#<document index>"``, so the
split does not depend on the order files are listed in, and adding a file moves no document.

**Tokens.** ``byte`` (default): UTF-8 bytes, vocabulary 256, no training, no unknown tokens.
``bpe``: a byte-level BPE trained with the ``tokenizers`` library on the training split only
(vocabulary at most ``bpe_vocab``); it is saved as ``tokenizer.json`` in the run directory and
re-read from there on resume. Perplexities are per token of the chosen tokeniser, so byte and
BPE perplexities are not comparable with each other.

**Images.** By default scikit-learn's digits (1,797 grey 8×8 images, 10 classes, shipped with
scikit-learn; split by ``split_of("digits/<index>")``). ``images=DIR`` reads an image-folder
layout: ``DIR/<class>/<image>`` (split by ``split_of`` of the relative path), or
``DIR/train/<class>/…`` with ``validation/`` (or ``val/``) and ``test/`` beside it. Images are
read with Pillow, converted to grey (``L``) when every image is grey and to ``RGB`` otherwise,
resized to ``image_size`` squared (bilinear), scaled to [0, 1] and centred (−0.5).

Streams (:class:`TokenStream`, :class:`ImageStream`; :class:`headrank.models.stream.SeededStream`)
draw from their own seeded ``torch.Generator``, never the global RNG, and their state is plain tensors and ints, so a
resumed run sees exactly the batches of an uninterrupted one. Every step draws the *global*
batch; a DDP rank keeps its own slice of it.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from headrank.errors import HeadRankError, one_line
from headrank.models import corpus as stdlib_corpus
from headrank.models.stream import SeededStream

TEXT_SUFFIXES = (".txt", ".jsonl", ".jsonl.zst")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".pgm", ".ppm")
TOKENIZERS = ("byte", "bpe")
TOKENIZER_FILE = "tokenizer.json"
MAX_BPE_VOCAB = 1 << 20  # released BPE vocabularies stay below 300k


# -- text readers --------------------------------------------------------------------------------

def _text_suffix(p: Path) -> str | None:
    name = p.name.lower()
    for s in (".jsonl.zst", ".jsonl", ".txt"):
        if name.endswith(s):
            return s
    return None


def _jsonl_documents(stream: io.TextIOBase, where: str) -> list[str]:
    docs = []
    for i, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise HeadRankError(f"{where}: line {i} is not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise HeadRankError(f"{where}: line {i} has no string field 'text'")
        docs.append(obj["text"])
    return docs


ZSTD_MAX_RATIO = 1000  # text compresses 3-10x; a file that inflates over 1000x is a decompression bomb
_CHUNK = 1 << 20


def corpus_limit() -> int:
    """Bytes of text a corpus may hold: its documents, the joined splits and the int64 token
    ids take about 16 bytes per byte of text, so at most this machine's memory / 16."""
    from headrank.io.validate import memory_bytes

    return memory_bytes() // 16


def _read_bounded(stream: Any, limit: int, too_big: str) -> bytes:
    """All bytes of ``stream``, refused with ``too_big`` as soon as they exceed ``limit``."""
    chunks, n = [], 0
    while chunk := stream.read(_CHUNK):
        n += len(chunk)
        if n > limit:
            raise HeadRankError(too_big)
        chunks.append(chunk)
    return b"".join(chunks)


def _file_bytes(p: Path, suffix: str) -> bytes:
    """The (decompressed) bytes of one regular corpus file, within :func:`corpus_limit` and, for
    Zstandard, within :data:`ZSTD_MAX_RATIO` times its compressed size."""
    from headrank.io.validate import regular_file

    regular_file(p, "corpus file")  # a FIFO or /dev/zero would block or never end
    limit = corpus_limit()
    mem = f"{p}: more than {limit >> 20} MiB of text, more than this machine can tokenise (memory / 16)"
    with open(p, "rb") as raw:
        if suffix != ".jsonl.zst":
            size = os.fstat(raw.fileno()).st_size
            if size > limit:
                raise HeadRankError(mem)
            return _read_bounded(raw, size, f"{p} changed while it was read (it grew past the {size} bytes its "
                                            "size said)")
        try:
            import zstandard
        except ImportError:  # pragma: no cover - a declared dependency
            raise HeadRankError("reading .jsonl.zst needs the zstandard package: pip install zstandard") from None
        size = os.fstat(raw.fileno()).st_size
        cap = ZSTD_MAX_RATIO * size + _CHUNK
        bomb = (f"{p}: its {size} compressed bytes decompress to more than {cap} bytes (over {ZSTD_MAX_RATIO}x; "
                "text compresses 3-10x): refused as a decompression bomb")
        try:
            return _read_bounded(zstandard.ZstdDecompressor().stream_reader(raw), min(cap, limit),
                                 bomb if cap < limit else mem)
        except zstandard.ZstdError as e:
            raise HeadRankError(f"{p}: corrupt Zstandard data ({e})") from None


def read_file_documents(path: str | os.PathLike) -> list[str]:
    """The documents of one ``.txt`` / ``.jsonl`` / ``.jsonl.zst`` file (see the module docstring).
    Only regular files are read, within :func:`corpus_limit` bytes (Zstandard: also within
    :data:`ZSTD_MAX_RATIO` times the compressed size)."""
    p = Path(path)
    suffix = _text_suffix(p)
    if suffix is None:
        raise HeadRankError(f"{p}: unsupported corpus file (use {', '.join(TEXT_SUFFIXES)})")
    try:
        text = _file_bytes(p, suffix).decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as open() reads
    except UnicodeDecodeError as e:
        raise HeadRankError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise HeadRankError(f"cannot read {p}: {e.strerror or e}") from None
    if suffix == ".txt":
        import re

        return [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]
    return _jsonl_documents(io.StringIO(text), str(p))


def corpus_files(path: str | os.PathLike) -> tuple[Path, list[str]]:
    """(root, sorted relative POSIX paths) of the corpus files under ``path`` (a file or a directory)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise HeadRankError(f"`corpus` {path}: no such file or directory")
    if not p.is_dir():
        from headrank.io.validate import regular_file

        regular_file(p, "corpus file")  # not a FIFO, a device or a symlink to one
        if _text_suffix(p) is None:
            raise HeadRankError(f"`corpus` {path}: unsupported file type (use {', '.join(TEXT_SUFFIXES)})")
        return p.parent, [p.name]
    rels = sorted(f.relative_to(p).as_posix() for f in p.rglob("*")
                  if f.is_file() and _text_suffix(f) is not None
                  and not any(part.startswith(".") for part in f.relative_to(p).parts))
    if not rels:
        raise HeadRankError(f"`corpus` {path}: no {', '.join(TEXT_SUFFIXES)} files in the directory")
    return p, rels


def read_corpus(path: str | os.PathLike, split: str | None = None) -> list[str]:
    """Documents of a user corpus (all, or one split), in file order then document order."""
    if split is not None and split not in stdlib_corpus.SPLITS:
        raise HeadRankError(f"unknown split {split!r}; use one of {', '.join(stdlib_corpus.SPLITS)}")
    root, rels = corpus_files(path)
    out = []
    for rel in rels:
        for i, doc in enumerate(read_file_documents(root / rel)):
            if split is None or stdlib_corpus.split_of(f"{rel}#{i}") == split:
                out.append(doc)
    return out


@functools.lru_cache(maxsize=8)
def text_splits(corpus: str | None = None, max_chars: int | None = None) -> dict[str, str]:
    """``{split: text}`` of the stdlib corpus (``corpus=None``) or of a user corpus (documents
    joined by blank lines), each cut at ``max_chars`` characters. Every split must be non-empty."""
    if max_chars is not None and max_chars < 1:
        raise HeadRankError(f"max_chars must be >= 1, got {max_chars}")
    if corpus is None:
        out = {s: stdlib_corpus.text(s, max_chars=max_chars) for s in stdlib_corpus.SPLITS}
        where = "the standard-library corpus"
    else:
        root, rels = corpus_files(corpus)
        parts: dict[str, list[str]] = {s: [] for s in stdlib_corpus.SPLITS}
        sizes = dict.fromkeys(stdlib_corpus.SPLITS, 0)
        for rel in rels:
            for i, doc in enumerate(read_file_documents(root / rel)):
                s = stdlib_corpus.split_of(f"{rel}#{i}")
                if max_chars is None or sizes[s] < max_chars:
                    parts[s].append(doc)
                    sizes[s] += len(doc) + 2
        out = {s: "\n\n".join(d for d in parts[s] if d) for s in stdlib_corpus.SPLITS}
        if max_chars is not None:
            out = {s: t[:max_chars] for s, t in out.items()}
        where = f"`corpus` {corpus}"
    empty = [s for s in stdlib_corpus.SPLITS if not out[s].strip()]
    if empty:
        raise HeadRankError(f"{where} has no text in the {' and '.join(empty)} split"
                            f"{'s' if len(empty) > 1 else ''} (documents are split 80/10/10 by a hash of "
                            "their path and index: give more documents)")
    return out


# -- tokenisers ----------------------------------------------------------------------------------

class ByteTokenizer:
    """UTF-8 bytes as tokens (vocabulary 256)."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """A byte-level BPE from the ``tokenizers`` library (trained here, saved as JSON)."""

    kind = "bpe"

    def __init__(self, tok):
        self.tok = tok

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        from tokenizers import Tokenizer

        from headrank.io.validate import read_text

        text = read_text(path, "tokenizer")  # a regular file only: a FIFO would block from_file forever
        try:
            return cls(Tokenizer.from_str(text))  # plain JSON; nothing is executed
        except Exception as e:  # noqa: BLE001 - any parse failure is a bad file
            raise HeadRankError(f"cannot read tokenizer {path}: {one_line(e, 200)}") from None

    def save(self, path: str | os.PathLike) -> None:
        from headrank.util.fileio import write_text

        write_text(Path(path), self.tok.to_str())

    def encode(self, text: str) -> np.ndarray:
        out = [np.asarray(e.ids, dtype=np.int64) for e in self.tok.encode_batch(text.split("\n\n"))]
        sep = np.asarray(self.tok.encode("\n\n").ids, dtype=np.int64)
        pieces = []
        for j, o in enumerate(out):
            if j:
                pieces.append(sep)
            pieces.append(o)
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


# -- language-model task -------------------------------------------------------------------------

@dataclass(frozen=True)
class LMTaskConfig:
    """Next-token prediction on a text corpus (see the module docstring).

    ``corpus``: None (stdlib) or a path (stored absolute); ``tokenizer``: ``byte`` or ``bpe``;
    ``bpe_vocab``: the BPE's vocabulary size (the model's embedding has this many rows);
    ``seq_len``: tokens per training window; ``max_chars``: characters read per split (None: all);
    ``eval_tokens``: at most this many tokens of a split are scored by an evaluation.
    """

    corpus: str | None = None
    tokenizer: str = "byte"
    bpe_vocab: int = 1024
    seq_len: int = 64
    max_chars: int | None = None
    eval_tokens: int = 65536

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise HeadRankError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, got {self.tokenizer!r}")
        for name, lo in (("bpe_vocab", 257), ("seq_len", 2), ("eval_tokens", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise HeadRankError(f"{name} must be an integer >= {lo}, got {v!r}")
        if self.bpe_vocab > MAX_BPE_VOCAB:  # the tokenizers library aborts the process (Rust panic) far above
            raise HeadRankError(f"bpe_vocab must be at most {MAX_BPE_VOCAB}, got {self.bpe_vocab}")
        if self.max_chars is not None and (not isinstance(self.max_chars, int) or self.max_chars < 1):
            raise HeadRankError(f"max_chars must be a positive integer, got {self.max_chars!r}")
        if self.corpus is not None:
            p = Path(self.corpus).expanduser()
            if not p.exists():
                raise HeadRankError(f"`corpus` {self.corpus}: no such file or directory")
            object.__setattr__(self, "corpus", str(p.resolve()))

    @property
    def vocab_size(self) -> int:
        return 256 if self.tokenizer == "byte" else self.bpe_vocab

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "vocab_size": self.vocab_size,
                "source": "stdlib docstrings and comments" if self.corpus is None else "user corpus"}


def lm_tokens(cfg: LMTaskConfig, run_dir: str | os.PathLike | None = None
              ) -> tuple[dict[str, torch.Tensor], ByteTokenizer | BPETokenizer]:
    """Token ids (int64) of every split, and the tokeniser. A BPE is trained on the training
    split and saved to ``run_dir/tokenizer.json``, or read from there when present."""
    texts = text_splits(cfg.corpus, cfg.max_chars)
    if cfg.tokenizer == "byte":
        tok: ByteTokenizer | BPETokenizer = ByteTokenizer()
    else:
        path = Path(run_dir) / TOKENIZER_FILE if run_dir is not None else None
        if path is not None and path.exists():
            tok = BPETokenizer.load(path)
        else:
            tok = BPETokenizer.train(texts["train"], cfg.bpe_vocab)
            if path is not None:
                tok.save(path)
        if tok.vocab_size > cfg.bpe_vocab:
            raise HeadRankError(f"tokenizer has {tok.vocab_size} tokens > bpe_vocab={cfg.bpe_vocab}")
    out = {}
    for s in stdlib_corpus.SPLITS:
        ids = torch.from_numpy(tok.encode(texts[s]))
        if ids.numel() < cfg.seq_len + 1:
            raise HeadRankError(f"the {s} split has {ids.numel()} tokens, fewer than seq_len + 1 = "
                                f"{cfg.seq_len + 1}: give more text or a shorter `seq_len`")
        out[s] = ids
    return out, tok


class TokenStream(SeededStream):
    """Random windows of ``seq_len + 1`` tokens from one token array: (x, y) = (w[:-1], w[1:])."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int):
        super().__init__(batch_size, seed)
        self.tokens, self.seq_len = tokens, seq_len
        self._offsets = torch.arange(seq_len + 1)

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` windows starting at uniform random offsets."""
        starts = torch.randint(0, self.tokens.numel() - self.seq_len, (self.batch_size,), generator=generator)
        w = self.tokens[starts[:, None] + self._offsets]
        return w[:, :-1], w[:, 1:]


def lm_loss_and_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean next-token cross-entropy and accuracy over every position. logits (B, T, V)."""
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    acc = (logits.argmax(-1) == targets).float().mean()
    return loss, acc


@torch.no_grad()
def evaluate_lm(model: torch.nn.Module, tokens: torch.Tensor, seq_len: int, max_tokens: int,
                device: torch.device, batch: int = 64) -> dict[str, float]:
    """Loss (nats per token), perplexity and accuracy on consecutive non-overlapping windows
    from the start of ``tokens`` (at most ``max_tokens`` predicted tokens)."""
    n = min((tokens.numel() - 1) // seq_len, max(1, max_tokens // seq_len))
    w = tokens[: n * seq_len + 1]
    x = w[:-1].view(n, seq_len)
    y = w[1:].view(n, seq_len)
    total = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.float64)
    for i in range(0, n, batch):
        logits = model(x[i:i + batch].to(device))
        yy = y[i:i + batch].to(device)
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yy.reshape(-1),
                                 reduction="sum").to("cpu", torch.float64)
        correct += (logits.argmax(-1) == yy).sum().to("cpu", torch.float64)
    count = n * seq_len
    loss = float(total) / count
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "acc": float(correct) / count, "tokens": count}


# -- images --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageTaskConfig:
    """Image classification: ``images`` None (scikit-learn digits, 8×8 grey) or an image folder
    (resized to ``image_size``; default 32)."""

    images: str | None = None
    image_size: int | None = None

    def __post_init__(self) -> None:
        if self.image_size is not None and (not isinstance(self.image_size, int) or self.image_size < 1):
            raise HeadRankError(f"image_size must be a positive integer, got {self.image_size!r}")
        if self.images is not None:
            p = Path(self.images).expanduser()
            if not p.is_dir():
                raise HeadRankError(f"`images` {self.images}: not a directory")
            object.__setattr__(self, "images", str(p.resolve()))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "source": "scikit-learn digits" if self.images is None else "image folder"}


@dataclass
class ImageData:
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]  # split -> (images (N, C, H, W) float32, labels)
    classes: list[str]
    channels: int
    image_size: int

    def describe(self) -> dict[str, Any]:
        return {"classes": self.classes, "channels": self.channels, "image_size": self.image_size,
                "n_per_split": {s: int(v[1].numel()) for s, v in self.splits.items()}}


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The one source of scikit-learn's digits (ships offline): images (1797, 8, 8) float64 with
    pixel values in [0, 1] (the raw 0..16 divided by 16) and labels (1797,) int64. Each user
    applies its own normalisation on top (the ViT task centres, the scale experiment
    standardises, the scale probe uses them as they are)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float64) / 16.0, d.target.astype(np.int64)


def _digits(image_size: int | None) -> ImageData:
    images, labels = digits_arrays()
    x = torch.from_numpy((images - 0.5).astype(np.float32))[:, None]  # (N, 1, 8, 8), centred
    if image_size is not None and image_size != 8:
        _check_images_fit(len(x), 1, image_size)
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    y = torch.from_numpy(labels)
    which = np.array([stdlib_corpus.split_of(f"digits/{i}") for i in range(len(y))])
    splits = {s: (x[torch.from_numpy(which == s)], y[torch.from_numpy(which == s)]) for s in stdlib_corpus.SPLITS}
    return ImageData(splits, [str(c) for c in range(10)], 1, image_size or 8)


def _image_files(root: Path) -> dict[str, list[tuple[str, str]]]:
    """split -> [(relative path, class)]"""
    split_dirs = {"train": root / "train", "validation": root / "validation", "test": root / "test"}
    if not split_dirs["validation"].is_dir() and (root / "val").is_dir():
        split_dirs["validation"] = root / "val"
    out: dict[str, list[tuple[str, str]]] = {s: [] for s in stdlib_corpus.SPLITS}

    def scan(d: Path) -> list[tuple[str, str]]:
        found = []
        for cls_dir in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for f in sorted(cls_dir.rglob("*")):
                if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES:
                    found.append((f.relative_to(root).as_posix(), cls_dir.name))
        return found

    if split_dirs["train"].is_dir():
        for s in stdlib_corpus.SPLITS:
            if not split_dirs[s].is_dir():
                raise HeadRankError(f"`images` {root}: has train/ but no {s}/ directory")
            out[s] = scan(split_dirs[s])
    else:
        for rel, cls in scan(root):
            out[stdlib_corpus.split_of(rel)].append((rel, cls))
    return out


def _image_folder(root: Path, image_size: int | None) -> ImageData:
    from PIL import Image

    size = image_size or 32
    files = _image_files(root)
    classes = sorted({c for s in stdlib_corpus.SPLITS for _, c in files[s]})
    if not classes:
        raise HeadRankError(f"`images` {root}: no images found (layout: DIR/<class>/<image>, "
                            f"extensions {', '.join(IMAGE_SUFFIXES)})")
    empty = [s for s in stdlib_corpus.SPLITS if not files[s]]
    if empty:
        raise HeadRankError(f"`images` {root}: no images in the {', '.join(empty)} split(s)")
    index = {c: i for i, c in enumerate(classes)}
    _check_images_fit(sum(len(v) for v in files.values()), 3, size)
    images = {}
    grey = True
    for s in stdlib_corpus.SPLITS:
        for rel, _ in files[s]:
            images[rel] = _open_image(root / rel)
            grey = grey and images[rel].mode in ("1", "L", "LA", "I", "I;16", "F")
    mode, channels = ("L", 1) if grey else ("RGB", 3)
    splits = {}
    for s in stdlib_corpus.SPLITS:
        arrs = []
        for rel, _ in files[s]:
            im = images[rel].convert(mode).resize((size, size), Image.Resampling.BILINEAR)
            a = np.asarray(im, dtype=np.float32) / 255.0 - 0.5
            arrs.append(a[None] if channels == 1 else a.transpose(2, 0, 1))
        x = torch.from_numpy(np.stack(arrs))
        y = torch.tensor([index[c] for _, c in files[s]], dtype=torch.int64)
        splits[s] = (x, y)
    return ImageData(splits, classes, channels, size)


def _check_images_fit(n: int, channels: int, size: int) -> None:
    """``n`` float32 images of ``size``² pixels must fit in memory before they are made."""
    from headrank.io.validate import check_fits

    check_fits(4 * n * channels * size * size, f"`image_size` {size}: {n} images of {size}x{size} pixels")


def _open_image(path: Path) -> Any:
    """One image decoded by Pillow; one line for an unreadable file or a decompression bomb (a
    small file declaring more pixels than Pillow's limit, e.g. a 69-byte PNG of 20000x20000)."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                im.load()
                return im.copy()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise HeadRankError(f"`images`: {path} declares more pixels than Pillow decodes safely "
                            f"({one_line(e, 120)}): refused as a decompression bomb") from None
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as e:
        raise HeadRankError(f"`images`: cannot read {path}: {one_line(e, 160)}") from None


@functools.lru_cache(maxsize=4)
def load_images(images: str | None = None, image_size: int | None = None) -> ImageData:
    """The image dataset of an :class:`ImageTaskConfig` (cached per process)."""
    if images is None:
        return _digits(image_size)
    root = Path(images).expanduser()
    if not root.is_dir():
        raise HeadRankError(f"`images` {images}: not a directory")
    return _image_folder(root, image_size)


class ImageStream(SeededStream):
    """Random minibatches (drawn with replacement) of a labelled image set."""

    def __init__(self, data: tuple[torch.Tensor, torch.Tensor], batch_size: int, seed: int):
        super().__init__(batch_size, seed)
        self.x, self.y = data

    def draw(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` labelled images drawn uniformly with replacement."""
        idx = torch.randint(0, self.y.numel(), (self.batch_size,), generator=generator)
        return self.x[idx], self.y[idx]


def classification_loss_and_accuracy(logits: torch.Tensor, targets: torch.Tensor
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    return F.cross_entropy(logits, targets), (logits.argmax(-1) == targets).float().mean()


@torch.no_grad()
def evaluate_images(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor], device: torch.device,
                    batch: int = 256) -> dict[str, float]:
    """Mean loss and accuracy over a whole split."""
    x, y = data
    total = torch.zeros((), dtype=torch.float64)
    correct = torch.zeros((), dtype=torch.float64)
    for i in range(0, y.numel(), batch):
        logits = model(x[i:i + batch].to(device))
        yy = y[i:i + batch].to(device)
        total += F.cross_entropy(logits, yy, reduction="sum").to("cpu", torch.float64)
        correct += (logits.argmax(-1) == yy).sum().to("cpu", torch.float64)
    n = y.numel()
    return {"loss": float(total) / n, "acc": float(correct) / n, "n": n}
