"""In-process runs of the ``headrank`` command for the fuzz suite, and the property they keep.

:func:`run_cli` calls :func:`headrank.cli.main` (the real entry point, usage errors included)
with its stdout and stderr captured and a wall-clock limit: a hang fails the test rather than
the suite. :func:`check_outcome` is the property: exit 0, or exit 2 with exactly one stderr line
(``error: ...``); never a traceback; and the output directory never holds a temporary or a
half-replaced set.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import struct
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

LIMIT_S = 30

# a tiny BERT-layout checkpoint: 2 layers, d = 8, 2 heads of 4
TINY_CONFIG = {"model_type": "bert", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2}
ROLES = {"q": "self.query", "k": "self.key", "v": "self.value", "o": "output.dense"}


def tiny_tensors(n_layers: int = 2, d: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"encoder.layer.{i}.attention.{n}.weight": torch.randn(d, d, generator=g)
            for i in range(n_layers) for n in ROLES.values()}


def write_tiny(d: Path, config: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    save_file(tiny_tensors(), d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(TINY_CONFIG if config is None else config))
    return d


def raw_safetensors(header: dict, data: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file from a header dict (any content) and data bytes; ``length`` overrides
    the stated header size."""
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


class Hang(BaseException):
    """Raised by the wall-clock limit (a BaseException, so nothing under test can swallow it)."""


def _alarm(signum, frame):
    raise Hang(f"no result within {LIMIT_S} s")


@contextlib.contextmanager
def time_limit(seconds: int = LIMIT_S):
    """Raise :class:`Hang` if the block runs longer than ``seconds`` (a read that blocks)."""
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)


def run_cli(*args: str) -> tuple[int, str, str]:
    """``headrank ARGS`` in this process: (exit status, stdout, stderr)."""
    from headrank import cli

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_handler = sys.argv, signal.signal(signal.SIGALRM, _alarm)
    sys.argv = ["headrank", *map(str, args)]
    code: int | str | None = 0
    signal.alarm(LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as e:
                code = e.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        sys.argv = old_argv
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.getvalue(), err.getvalue()


def snapshot(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` with its content (hidden ones included)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else {}


def check_outcome(code: int, err: str, out_dir: Path | None = None, before: dict[str, bytes] | None = None) -> None:
    """The property: exit 0, or exit 2 with exactly one stderr line; no traceback; no temporary
    left in ``out_dir``; on failure ``out_dir`` holds exactly what it held ``before``."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err[-3000:]
    assert code in (0, 2), (code, err[-3000:])
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    if out_dir is not None and out_dir.exists():
        hidden = [p.name for p in out_dir.iterdir() if p.name.startswith(".") and p.name != ".headrank-output.json"]
        assert not hidden, hidden
        if code != 0 and before is not None:
            assert snapshot(out_dir) == before
