"""A deterministic real-text corpus from the running interpreter's standard-library source.

The text is the English prose inside Python's own ``.py`` files: docstrings (module, class,
function) and comment blocks. Nothing is downloaded; the corpus is whatever this interpreter
ships, so it is fixed for a given Python version (:func:`describe` records it).

- **Files**: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, sorted by their path
  relative to that root (POSIX form), skipping ``site-packages``, ``__pycache__`` and test
  directories (``test``, ``tests``, ``idle_test``): test files are mostly code, not prose.
- **Split**: by file, never by sentence, so no file contributes to two splits. A file's split
  is fixed by the SHA-256 of its relative path: the first 8 bytes as an integer, modulo 1000,
  below 800 → ``train``, below 900 → ``validation``, else ``test`` (80/10/10). Adding or
  removing a file never moves another file to a different split.
- **Blocks**: per file, in source order, the cleaned docstrings (``inspect.cleandoc``) and
  the comment blocks (consecutive ``#`` lines, markers stripped; shebangs, coding lines and
  tool pragmas dropped). Files that do not parse are skipped (none in CPython's own stdlib
  outside test data).
- **Lines**: the non-empty stripped lines of the blocks: raw material for language models.
- **Sentences**: prose paragraphs of the blocks (paragraphs with indented or doctest lines are
  code and dropped), whitespace-normalised, split after ``.``, ``!`` or ``?`` followed by a
  capital letter; kept when they start with a capital letter, end with ``.``/``!``/``?``, have
  ``min_words`` to ``max_words`` words and at least 70 % letters among their non-space
  characters.

API: :func:`files`, :func:`split_of`, :func:`blocks`, :func:`lines`, :func:`sentences`,
:func:`text`, :func:`describe`. Every function takes ``split`` (``"train"``,
``"validation"``, ``"test"`` or ``None`` for all files) and reads files lazily, in sorted
order, stopping as soon as ``n`` items are collected.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import os
import re
import sys
import sysconfig
import tokenize
from collections.abc import Iterator
from pathlib import Path

from headrank.errors import HeadRankError

SPLITS = ("train", "validation", "test")
SPLIT_BOUNDS = (800, 900)  # of 1000 hash buckets: [0, 800) train, [800, 900) validation, rest test
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
_PRAGMA = re.compile(r"(!|-\*-|noqa|type:|pragma|fmt:|pylint:|vim?:|coding[:=]|XXX\s*$)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def stdlib_root() -> Path:
    """The standard-library source directory of the running interpreter."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "os.py").exists():
        raise HeadRankError(f"the standard-library source is not installed at {root} (no os.py): "
                            "the text corpus needs the interpreter's .py files")
    return root


@functools.lru_cache(maxsize=4)
def _all_files(root: str) -> tuple[str, ...]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith(".")]
        rel = os.path.relpath(dirpath, root)
        for f in filenames:
            if f.endswith(".py"):
                out.append(Path(rel, f).as_posix() if rel != "." else f)
    return tuple(sorted(out))


def split_of(relpath: str) -> str:
    """The split of a file, from the SHA-256 of its relative POSIX path (80/10/10)."""
    bucket = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big") % 1000
    return "train" if bucket < SPLIT_BOUNDS[0] else "validation" if bucket < SPLIT_BOUNDS[1] else "test"


def _check_split(split: str | None) -> None:
    if split is not None and split not in SPLITS:
        raise HeadRankError(f"unknown split {split!r}; use one of {', '.join(SPLITS)} (or None for all)")


def files(split: str | None = None, root: str | os.PathLike | None = None) -> list[str]:
    """Sorted relative POSIX paths of the corpus files (of one split, or all)."""
    _check_split(split)
    root = str(root) if root is not None else str(stdlib_root())
    return [f for f in _all_files(root) if split is None or split_of(f) == split]


def _comment_blocks(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each run of consecutive comment lines."""
    blocks: list[tuple[int, list[str]]] = []
    last_line = -2
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT:
                continue
            body = tok.string.lstrip("#").strip()
            line = tok.start[0]
            if _PRAGMA.match(body):
                continue
            if line == last_line + 1 and blocks:
                blocks[-1][1].append(body)
            else:
                blocks.append((line, [body]))
            last_line = line
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []
    return [(line, "\n".join(b).strip()) for line, b in blocks if any(b)]


def _docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                line = node.body[0].lineno if node.body else 0
                out.append((line, doc))
    return out


MAX_SOURCE_BYTES = 16 << 20  # a .py file larger than this is data, not prose


@functools.lru_cache(maxsize=4096)
def _file_blocks(path: str) -> tuple[str, ...]:
    """The prose blocks of one source file; a file that is not a regular one (a FIFO would block,
    a symlink to /dev/zero would never end) or is larger than MAX_SOURCE_BYTES gives none."""
    from headrank.io.validate import is_regular_file

    if not is_regular_file(path):
        return ()
    try:
        if os.path.getsize(path) > MAX_SOURCE_BYTES:
            return ()
        source = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return ()
    found = _docstrings(tree) + _comment_blocks(source)
    found.sort(key=lambda t: t[0])
    return tuple(inspect.cleandoc(text) for _, text in found)


def _iter_blocks(split: str | None, root: str | os.PathLike | None) -> Iterator[tuple[str, str]]:
    root = Path(root) if root is not None else stdlib_root()
    for rel in files(split, root):
        for b in _file_blocks(str(root / rel)):
            yield rel, b


def blocks(split: str | None = "train", n: int | None = None,
           root: str | os.PathLike | None = None) -> list[str]:
    """Docstrings and comment blocks, in file order then source order (at most ``n``)."""
    out = []
    for _, b in _iter_blocks(split, root):
        if n is not None and len(out) >= n:
            break
        out.append(b)
    return out


def lines(split: str | None = "train", n: int | None = None,
          root: str | os.PathLike | None = None) -> list[str]:
    """Non-empty stripped lines of the blocks (at most ``n``)."""
    out: list[str] = []
    for _, b in _iter_blocks(split, root):
        for ln in b.splitlines():
            if n is not None and len(out) >= n:
                return out
            if ln.strip():
                out.append(ln.strip())
    return out


def text(split: str | None = "train", max_chars: int | None = None,
         root: str | os.PathLike | None = None) -> str:
    """The blocks joined by blank lines (cut at ``max_chars``)."""
    parts: list[str] = []
    size = 0
    for _, b in _iter_blocks(split, root):
        parts.append(b)
        size += len(b) + 2
        if max_chars is not None and size >= max_chars:
            break
    out = "\n\n".join(parts)
    return out[:max_chars] if max_chars is not None else out


def _is_prose_paragraph(par: str) -> bool:
    return not any(ln.startswith((" ", "\t", ">>>", "...")) or ln.rstrip().endswith("::")
                   for ln in par.splitlines())


def split_sentences(block: str, min_words: int = 6, max_words: int = 64) -> list[str]:
    """The prose sentences of one block (see the module docstring for the rules)."""
    out = []
    for par in re.split(r"\n\s*\n", block):
        if not _is_prose_paragraph(par):
            continue
        for s in _SENTENCE_END.split(" ".join(par.split())):
            words = s.split()
            if not (min_words <= len(words) <= max_words) or not s[0].isupper() or s[-1] not in ".!?":
                continue
            chars = s.replace(" ", "")
            if sum(c.isalpha() for c in chars) >= 0.7 * len(chars):
                out.append(s)
    return out


def sentences(split: str | None = "train", n: int | None = None, *, min_words: int = 6,
              max_words: int = 64, root: str | os.PathLike | None = None) -> list[str]:
    """Prose sentences of the corpus, in file order then source order (at most ``n``)."""
    if n is not None and n < 0:
        raise HeadRankError(f"n must be >= 0, got {n}")
    if min_words < 1 or max_words < min_words:
        raise HeadRankError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    out: list[str] = []
    for _, b in _iter_blocks(split, root):
        for s in split_sentences(b, min_words, max_words):
            if n is not None and len(out) >= n:
                return out
            out.append(s)
    return out


def describe(root: str | os.PathLike | None = None) -> dict:
    """What the corpus is made of: root, Python version, files per split, the rules."""
    root = Path(root) if root is not None else stdlib_root()
    allf = files(None, root)
    counts = {s: sum(split_of(f) == s for f in allf) for s in SPLITS}
    return {
        "source": "docstrings and comments of the Python standard library's .py files",
        "root": str(root),
        "python": sys.version.split()[0],
        "n_files": len(allf),
        "files_per_split": counts,
        "split_rule": "sha256(relative posix path)[:8] as big-endian int mod 1000: "
                      "<800 train, <900 validation, else test",
        "excluded_dirs": sorted(EXCLUDED_DIRS),
    }
